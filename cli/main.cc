// optiflow: one command-line tool over the OptiFlow libraries.
// Exit status: 0 success (for verify/check: proven/passed), 1 the schedule is wrong, 2 bad usage or bad input.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/compiler/msccl_xml.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/reference_executor.h"

namespace {

using optiflow::core::BufferMode;
using optiflow::core::Schedule;

using optiflow::cli::kExitBadInput;
using optiflow::cli::kExitFailed;
using optiflow::cli::kExitOk;

std::optional<BufferMode> parseMode(const std::string& s) {
  if (s.empty()) return std::nullopt;
  if (s == "in-place" || s == "inplace") return BufferMode::InPlace;
  return BufferMode::OutOfPlace;
}

int writeOutput(const std::string& text, const std::string& path) {
  if (path.empty() || path == "-") {
    std::cout << text;
    if (!text.empty() && text.back() != '\n') std::cout << '\n';
    return kExitOk;
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) {
    fmt::print(stderr, "optiflow: cannot write {}\n", path);
    return kExitBadInput;
  }
  return kExitOk;
}

std::optional<Schedule> loadOrReport(const std::string& path) {
  auto loaded = optiflow::compiler::loadSchedule(path);
  if (!loaded) {
    fmt::print(stderr, "optiflow: {}\n", loaded.error().str());
    return std::nullopt;
  }
  return std::move(loaded).value();
}

nlohmann::json findingJson(const optiflow::compiler::Finding& f) {
  return {{"severity", f.severity == optiflow::compiler::Severity::Error ? "error" : "warning"},
          {"property", std::string(optiflow::compiler::toString(f.property))},
          {"mode", std::string(optiflow::core::toString(f.mode))},
          {"rank", f.rank},
          {"tb", f.tb},
          {"step", f.step},
          {"message", f.message}};
}

int cmdTopoPresets() {
  for (const auto& p : optiflow::core::presets()) fmt::print("{:<12} {}\n", p.name, p.description);
  fmt::print("\nAny preset takes a node count: <preset>x<N>, e.g. dgx-a100x4 (4 nodes).\n");
  return kExitOk;
}

int cmdTopoShow(const std::string& what, const optiflow::core::TopologyHints& hints, bool json) {
  auto topo = optiflow::cli::topologyArg(what, hints);
  if (!topo) return kExitBadInput;
  if (json) {
    std::cout << optiflow::core::topologyToJson(*topo).dump(2) << '\n';
  } else {
    std::cout << optiflow::core::describeTopology(*topo);
  }
  return kExitOk;
}

int cmdVerify(const std::string& path, bool json, const std::string& mode) {
  if (auto plan = optiflow::cli::mscclppPlanText(path)) return optiflow::cli::runVerifyMscclpp(path, *plan, json);
  auto s = loadOrReport(path);
  if (!s) return kExitBadInput;
  if (auto m = parseMode(mode)) {
    s->inPlace = *m == BufferMode::InPlace;
    s->outOfPlace = *m == BufferMode::OutOfPlace;
  }
  const auto report = optiflow::compiler::verify(*s);
  if (json) {
    nlohmann::json j;
    j["file"] = path;
    j["name"] = s->name;
    j["collective"] = std::string(optiflow::core::toString(s->collective));
    j["ranks"] = s->nRanks;
    j["proven"] = report.proven;
    j["steps"] = report.steps;
    j["transfers"] = report.transfers;
    j["modes"] = nlohmann::json::array();
    for (auto m : report.modesChecked) j["modes"].push_back(std::string(optiflow::core::toString(m)));
    j["errors"] = nlohmann::json::array();
    for (const auto& f : report.errors) j["errors"].push_back(findingJson(f));
    j["warnings"] = nlohmann::json::array();
    for (const auto& f : report.warnings) j["warnings"].push_back(findingJson(f));
    std::cout << j.dump(2) << '\n';
  } else {
    std::string modes;
    for (auto m : report.modesChecked)
      modes += fmt::format("{}{}", modes.empty() ? "" : ", ", optiflow::core::toString(m));
    for (const auto& f : report.errors) fmt::print("error: {}\n", f.str());
    for (const auto& f : report.warnings) fmt::print("warning: {}\n", f.str());
    fmt::print("{}: {} {} on {} ranks, {} steps, {} transfers ({}): {}\n", path, s->name,
               optiflow::core::toString(s->collective), s->nRanks, report.steps, report.transfers, modes,
               report.proven ? "PROVEN" : fmt::format("NOT PROVEN ({} errors)", report.errors.size()));
  }
  return report.proven ? kExitOk : kExitFailed;
}

int cmdCheck(const std::string& path, bool json, const std::string& mode, int elements, std::uint64_t seed) {
  if (auto plan = optiflow::cli::mscclppPlanText(path)) {
    return optiflow::cli::runCheckMscclpp(path, *plan, json, elements, seed);
  }
  auto s = loadOrReport(path);
  if (!s) return kExitBadInput;
  optiflow::sim::CheckOptions opts;
  opts.mode = parseMode(mode);
  opts.elementsPerChunk = elements;
  opts.seed = seed;
  const auto report = optiflow::sim::runReference(*s, opts);
  if (json) {
    nlohmann::json j;
    j["file"] = path;
    j["passed"] = report.passed;
    j["elapsed_us"] = report.elapsed.count();
    j["mismatch_count"] = report.mismatchCount;
    j["modes"] = nlohmann::json::array();
    for (auto m : report.modesRun) j["modes"].push_back(std::string(optiflow::core::toString(m)));
    j["errors"] = report.errors;
    j["mismatches"] = nlohmann::json::array();
    for (const auto& mm : report.mismatches) {
      j["mismatches"].push_back({{"mode", std::string(optiflow::core::toString(mm.mode))},
                                 {"rank", mm.rank},
                                 {"output_chunk", mm.outputIndex},
                                 {"element", mm.element},
                                 {"expected", mm.expected},
                                 {"actual", mm.actual}});
    }
    std::cout << j.dump(2) << '\n';
  } else {
    for (const auto& e : report.errors) fmt::print("error: {}\n", e);
    for (const auto& mm : report.mismatches) {
      fmt::print("mismatch ({}): rank {} output chunk {} element {}: expected {} got {}\n",
                 optiflow::core::toString(mm.mode), mm.rank, mm.outputIndex, mm.element, mm.expected, mm.actual);
    }
    fmt::print("{}: ran {} ranks with real float32 data in {:.1f} ms: {}\n", path, s->nRanks,
               static_cast<double>(report.elapsed.count()) / 1000.0,
               report.passed ? "PASSED"
                             : fmt::format("FAILED ({} errors, {} mismatched chunks)", report.errors.size(),
                                           report.mismatchCount));
  }
  return report.passed ? kExitOk : kExitFailed;
}

int cmdConvert(const std::string& path, const std::string& to, const std::string& dialect, const std::string& out) {
  auto s = loadOrReport(path);
  if (!s) return kExitBadInput;
  if (to == "json")
    return writeOutput(optiflow::compiler::formatSchedule(*s, optiflow::compiler::ScheduleFormat::Json), out);
  std::optional<optiflow::core::MscclDialect> d;
  if (dialect == "new") d = optiflow::core::MscclDialect::New;
  if (dialect == "old-rt") d = optiflow::core::MscclDialect::OldRuntime;
  if (dialect == "old") d = optiflow::core::MscclDialect::Old;
  return writeOutput(optiflow::compiler::exportMscclXml(*s, d), out);
}

int cmdFixture(const std::string& coll, int ranks, int channels, bool inPlace, const std::string& format,
               const std::string& out) {
  optiflow::core::fixtures::RingOptions o{.nRanks = ranks, .channels = channels, .inPlace = inPlace};
  Schedule s;
  if (coll == "allgather") {
    s = optiflow::core::fixtures::ringAllGather(o);
  } else if (coll == "reducescatter") {
    s = optiflow::core::fixtures::ringReduceScatter(o);
  } else {
    s = optiflow::core::fixtures::ringAllReduce(o);
  }
  const auto f =
      format == "json" ? optiflow::compiler::ScheduleFormat::Json : optiflow::compiler::ScheduleFormat::MscclXml;
  return writeOutput(optiflow::compiler::formatSchedule(s, f), out);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"optiflow: design, prove and time collective-communication schedules for GPU clusters"};
  app.set_version_flag("--version", std::string("optiflow ") + OPTIFLOW_VERSION);
  app.require_subcommand(1);
  int rc = kExitOk;

  auto* topo = app.add_subcommand("topo", "Cluster topologies: presets and files");
  topo->require_subcommand(1);
  topo->add_subcommand("presets", "List the built-in topology presets")->callback([&] { rc = cmdTopoPresets(); });
  auto* show = topo->add_subcommand("show", "Show a preset (e.g. dgx-a100x4) or a TOML topology file");
  std::string topoArg;
  bool topoJson = false;
  optiflow::core::TopologyHints showHints;
  show->add_option("topology", topoArg, "Preset name, TOML topology file or NCCL topology XML")->required();
  show->add_flag("--json", topoJson, "Print JSON");
  show->callback([&] { rc = (cmdTopoShow(topoArg, showHints, topoJson)); });

  std::string file;
  bool json = false;
  std::string mode;
  auto* verify =
      app.add_subcommand("verify", "Prove that a schedule (native JSON or MSCCL XML) computes its collective");
  verify->add_option("file", file, "Schedule file")->required();
  verify->add_flag("--json", json, "Print the report as JSON");
  verify->add_option("--mode", mode, "Check only one buffer mode")->check(CLI::IsMember({"in-place", "out-of-place"}));
  verify->callback([&] { rc = (cmdVerify(file, json, mode)); });

  int elements = 8;
  std::uint64_t seed = 1;
  auto* check = app.add_subcommand("check", "Run a schedule on the CPU with real data and compare with the collective");
  check->add_option("file", file, "Schedule file")->required();
  check->add_flag("--json", json, "Print the report as JSON");
  check->add_option("--mode", mode, "Run only one buffer mode")->check(CLI::IsMember({"in-place", "out-of-place"}));
  check->add_option("--elements", elements, "float32 elements per chunk")->check(CLI::Range(1, 1 << 20));
  check->add_option("--seed", seed, "Seed of the input data");
  check->callback([&] { rc = (cmdCheck(file, json, mode, elements, seed)); });

  std::string to = "json";
  std::string dialect;
  std::string out;
  auto* convert = app.add_subcommand("convert", "Convert a schedule between native JSON and MSCCL XML");
  convert->add_option("file", file, "Schedule file")->required();
  convert->add_option("--to", to, "Output format")->check(CLI::IsMember({"json", "msccl-xml", "mscclpp"}));
  int ranksPerNode = 0;
  convert->add_option("--ranks-per-node", ranksPerNode, "mscclpp: ranks per node (0: all on one node)")
      ->check(CLI::Range(0, 1 << 20));
  convert->add_option("--mode", mode, "mscclpp: buffer mode of the plan (default: in-place where supported)")
      ->check(CLI::IsMember({"in-place", "out-of-place"}));
  convert->add_option("--dialect", dialect, "MSCCL XML dialect (default: the schedule's own)")
      ->check(CLI::IsMember({"new", "old-rt", "old"}));
  convert->add_option("-o,--output", out, "Output file (default: standard output)");
  convert->callback([&] {
    rc = to == "mscclpp" ? optiflow::cli::runConvertToMscclpp(file, ranksPerNode, mode, out)
                         : cmdConvert(file, to, dialect, out);
  });

  auto* exportCmd = app.add_subcommand("export", "Export the winners of a synthesis run for an engine");
  exportCmd->require_subcommand(1);
  auto* exportMscclpp =
      exportCmd->add_subcommand("mscclpp", "MSCCL++ execution plans (proven) and a manifest of what each serves");
  std::string exportRun;
  std::string exportOut;
  exportMscclpp->add_option("run_dir", exportRun, "Run directory of optiflow synthesize")->required();
  exportMscclpp->add_option("-o,--output", exportOut, "Plan directory to write")->required();
  exportMscclpp->callback([&] { rc = optiflow::cli::runExportMscclpp(exportRun, exportOut); });

  std::string coll = "allgather";
  int ranks = 8;
  int channels = 1;
  bool inPlace = false;
  std::string format = "json";
  auto* fixture = app.add_subcommand("fixture", "Write a hand-built ring schedule (the tests' known-good inputs)");
  fixture->add_option("--coll", coll, "Collective")->check(CLI::IsMember({"allgather", "reducescatter", "allreduce"}));
  fixture->add_option("--ranks", ranks, "Number of ranks")->check(CLI::Range(1, 4096));
  fixture->add_option("--channels", channels, "Parallel rings")->check(CLI::Range(1, 32));
  fixture->add_flag("--in-place", inPlace, "Build the in-place variant");
  fixture->add_option("--format", format, "Output format")->check(CLI::IsMember({"json", "msccl-xml"}));
  fixture->add_option("-o,--output", out, "Output file (default: standard output)");
  fixture->callback([&] { rc = (cmdFixture(coll, ranks, channels, inPlace, format, out)); });

  // What an NCCL topology XML file (--topo) may lack: one set of options for every command that takes --topo.
  auto addTopologyHints = [](CLI::App* cmd, optiflow::core::TopologyHints& h, bool withNodes) {
    if (withNodes) {
      cmd->add_option("--nodes", h.nodes, "Node count of a topology file (NCCL's XML describes one node)")
          ->check(CLI::Range(1, optiflow::core::Topology::kMaxNodes));
    }
    cmd->add_option("--gpu", h.gpuType, "GPU model where an XML file names none (A100, H100, H200, ...)");
    cmd->add_option("--nic-gbps", h.nicGbps, "NIC speed in Gb/s where an XML file gives none (skeletons)")
        ->check(CLI::Range(0.001, 1e6));
  };
  addTopologyHints(show, showHints, true);
  static constexpr const char* kTopoHelp = "Preset (e.g. dgx-a100x4), TOML topology file, or NCCL topology XML";
  static constexpr const char* kCalibrationHelp =
      "Calibration of both models (optiflow calibrate; docs/calibration.md)";
  optiflow::cli::CalibrateArgs calArgs;
  auto* calibrate = app.add_subcommand(
      "calibrate", "Fit the simulator and NCCL's model to nccl-tests logs of the cluster and write CAL.toml");
  calibrate->add_option("logs", calArgs.logs, "nccl-tests logs (text, as printed or pasted, or -J JSON)")->required();
  calibrate
      ->add_option("--topo", calArgs.topologies,
                   "Preset, TOML or NCCL topology XML file of the cluster the logs ran on; once per node count of "
                   "the logs (a file of one node serves every count)")
      ->required()
      ->allow_extra_args(false);  // one value per --topo: what follows is a log
  addTopologyHints(calibrate, calArgs.topologyHints, true);
  calibrate->add_option("-o,--output", calArgs.output, "Calibration file to write (CAL.toml)");
  calibrate->add_option("--calibration", calArgs.calibration,
                        "Check this calibration against the logs instead of fitting one");
  calibrate->add_option("--coll", calArgs.collective, "Only the runs of this collective")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"}));
  calibrate->add_flag("--json", calArgs.json, "Print JSON");
  calibrate->callback([&] { rc = optiflow::cli::runCalibrate(calArgs); });

  optiflow::cli::PerfArgs perf;
  auto addPerfOptions = [&perf, &addTopologyHints](CLI::App* cmd, bool withCollective) {
    cmd->add_option("--topo", perf.topology, kTopoHelp)->required();
    addTopologyHints(cmd, perf.topologyHints, true);
    cmd->add_option("--calibration", perf.calibration, kCalibrationHelp);
    if (withCollective) {
      cmd->add_option("--coll", perf.collective, "Collective")
          ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"}));
    }
    cmd->add_option("--sizes", perf.sizes, "Sizes as nccl-tests counts them: 1KiB:1GiB[:factor] or a list");
    if (cmd->get_name() != "bound") {
      cmd->add_option("--launch", perf.launch, "Kernel launch the simulator charges")
          ->check(CLI::IsMember({"graph", "host"}));
    }
    cmd->add_flag("--json", perf.json, "Print JSON rows");
  };
  auto* simulate = app.add_subcommand("simulate", "Time a schedule on a topology with the event simulator");
  simulate->add_option("schedule", file, "Schedule file (native JSON or MSCCL XML)")->required();
  addPerfOptions(simulate, false);
  simulate->add_option("--protocol", perf.protocol, "Force a protocol")
      ->check(CLI::IsMember({"LL", "LL128", "Simple"}));
  simulate->callback([&] { rc = optiflow::cli::runSimulate(file, perf); });
  auto* bound = app.add_subcommand("bound", "Lower bound on the time of a collective on a topology");
  addPerfOptions(bound, true);
  bound->callback([&] { rc = optiflow::cli::runBound(perf); });
  auto* baseline = app.add_subcommand("baseline", "NCCL's own choice and predicted time (its cost model)");
  addPerfOptions(baseline, true);
  baseline->add_flag("--simulate", perf.simulateNccl, "Also time NCCL's algorithm as a schedule with the simulator");
  baseline->callback([&] { rc = optiflow::cli::runBaseline(perf); });

  optiflow::cli::CompileArgs comp;
  auto* compile = app.add_subcommand("compile", "Compile a program in the OptiFlow language into a verified schedule");
  compile->add_option("program", comp.program, "Program file (.ofl)")->required();
  compile->add_option("--topo", comp.topology, kTopoHelp)->required();
  addTopologyHints(compile, comp.topologyHints, true);
  compile->add_option("--calibration", comp.calibration, kCalibrationHelp);
  compile->add_option("--size", comp.size, "Message size to tune for (nccl-tests convention), e.g. 256MiB");
  compile->add_option("--format", comp.format, "Output format")->check(CLI::IsMember({"json", "msccl-xml"}));
  compile->add_option("-o,--output", comp.output, "Output file (default: standard output)");
  compile->add_option("--protocol", comp.protocol, "Force a protocol")->check(CLI::IsMember({"LL", "LL128", "Simple"}));
  compile->add_option("--channels", comp.channels, "Channels (0: chosen from the size)")->check(CLI::Range(0, 32));
  compile->add_option("--slices", comp.slices, "Schedule chunks per program chunk (0: as many as channels)")
      ->check(CLI::Range(0, 64));
  compile->add_option("--root", comp.root, "Root rank of broadcast and reduce")->check(CLI::Range(0, 1 << 20));
  compile->add_option("--limits", comp.limits, "Executor limits to respect")->check(CLI::IsMember({"msccl", "none"}));
  compile->callback([&] { rc = optiflow::cli::runCompile(comp); });

  optiflow::cli::CompareArgs cmp;
  auto* compare = app.add_subcommand(
      "compare", "Best of several programs per size against NCCL's choice and the lower bound (simulated)");
  compare->add_option("programs", cmp.programs, "Program files (.ofl); those for other collectives are skipped")
      ->required();
  compare->add_option("--topo", cmp.topology, kTopoHelp)->required();
  addTopologyHints(compare, cmp.topologyHints, true);
  compare->add_option("--calibration", cmp.calibration, kCalibrationHelp);
  compare->add_option("--coll", cmp.collective, "Collective")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"}));
  compare->add_option("--sizes", cmp.sizes, "Sizes as nccl-tests counts them: 1KiB:1GiB[:factor] or a list");
  compare->add_option("--launch", cmp.launch, "Kernel launch the simulator charges")
      ->check(CLI::IsMember({"graph", "host"}));
  compare->add_option("--root", cmp.root, "Root rank of broadcast and reduce")->check(CLI::Range(0, 1 << 20));
  compare->add_flag("--json", cmp.json, "Print JSON rows");
  compare->add_flag("-v,--verbose", cmp.verbose, "Say why a program did not compile at a size");
  compare->callback([&] { rc = optiflow::cli::runCompare(cmp); });

  optiflow::cli::SynthArgs syn;
  auto* synthesize = app.add_subcommand(
      "synthesize", "Discover schedules round by round (proposer -> compiler -> verifier -> simulator), best per size");
  synthesize->add_option("--topo", syn.topology, kTopoHelp)->required();
  addTopologyHints(synthesize, syn.topologyHints, true);
  synthesize->add_option("--calibration", syn.calibration, kCalibrationHelp);
  synthesize->add_option("--coll", syn.collective, "Collective")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"}));
  synthesize->add_option("--sizes", syn.sizes, "Sizes as nccl-tests counts them: 1KiB:1GiB[:factor] or a list")
      ->capture_default_str();
  synthesize->add_option("--proposer", syn.proposer, "Who writes the programs")
      ->check(CLI::IsMember({"builtin", "llm"}))
      ->capture_default_str();
  synthesize->add_option("--evaluator", syn.evaluator, "Who times the candidates")
      ->check(CLI::IsMember({"simulator", "hardware"}))
      ->capture_default_str();
  synthesize->add_option("--launcher", syn.launcher,
                         "--evaluator hardware: command that runs optiflow-bench on each round's batch, with {batch} "
                         "and {out}, e.g. \"srun -N2 optiflow-bench {batch} --json -o {out} --rendezvous-dir DIR\"");
  synthesize->add_option("--launcher-timeout", syn.launcherTimeoutS, "Seconds one launch may take before it is killed")
      ->check(CLI::Range(0.1, 604800.0))
      ->capture_default_str();
  synthesize->add_option("--llm-url", syn.llmUrl, "OpenAI-compatible base URL, e.g. http://localhost:8000/v1");
  synthesize->add_option("--llm-model", syn.llmModel, "Model name the server knows");
  synthesize->add_option("--llm-api-key-file", syn.llmApiKeyFile,
                         "File whose first line is the API key (default: $OPTIFLOW_LLM_API_KEY)");
  synthesize->add_option("--llm-timeout", syn.llmTimeoutS, "Seconds per request")->check(CLI::Range(1.0, 3600.0));
  synthesize->add_option("--rounds", syn.rounds, "At most this many rounds")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  synthesize->add_option("--candidates", syn.candidates, "Candidates asked for per round")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  synthesize
      ->add_option(
          "--time-budget", syn.timeBudgetS,
          "Stop the search after this many seconds, an evaluation under way included; each candidate gets an even "
          "share of what its round has left (0: none; NCCL's baselines always finish, and writing the winners' files "
          "follows)")
      ->check(CLI::Range(0.0, 1e7));
  synthesize->add_option("--seed", syn.seed, "Seed of the built-in proposer")->capture_default_str();
  synthesize->add_option("--out", syn.out, "Run directory (default: optiflow-runs/TOPO-COLL)");
  synthesize->add_flag("--resume", syn.resume, "Continue the run in --out from its history.jsonl");
  synthesize->add_flag("--force", syn.force, "Replace an earlier run in --out");
  synthesize->add_option("--launch", syn.launch, "Kernel launch the simulator charges")
      ->check(CLI::IsMember({"graph", "host"}));
  synthesize->add_option("--root", syn.root, "Root rank of broadcast and reduce")->check(CLI::Range(0, 1 << 20));
  synthesize->add_flag("--json", syn.json, "Print the result as JSON (per size: size_bytes, best_time_us, ...)");
  synthesize->add_flag("-q,--quiet", syn.quiet, "No progress lines");
  synthesize->callback([&] { rc = optiflow::cli::runSynthesize(syn); });

  optiflow::cli::ReportArgs rep;
  auto* report =
      app.add_subcommand("report", "Write an HTML report (busbw against size, the table) of a run directory");
  report->add_option("dir", rep.dir, "Run directory of optiflow synthesize")->required();
  report->add_option("-o,--output", rep.output, "Output file (default: DIR/report.html)");
  report->callback([&] { rc = optiflow::cli::runReport(rep); });

  optiflow::cli::CacheArgs cache;
  auto* cacheCmd =
      app.add_subcommand("cache", "The node's schedule cache the NCCL tuner plugin reads (/dev/shm/optiflow-NS)");
  cacheCmd->require_subcommand(1);
  auto addNamespace = [&cache](CLI::App* cmd) {
    cmd->add_option("--namespace", cache.ns, "Cache namespace (default: $OPTIFLOW_NAMESPACE, else \"default\")");
  };
  auto* cachePublish = cacheCmd->add_subcommand(
      "publish", "Prove a run directory's schedules and make its plan the current one for new communicators");
  cachePublish->add_option("plan_dir", cache.planDir, "Run directory of optiflow synthesize (holds plan.json)")
      ->required();
  addNamespace(cachePublish);
  cachePublish->add_option("--group", cache.group, "Group that may read the cache (mode 0660; default: owner only)");
  cachePublish->add_flag("--no-verify", cache.noVerify, "Do not prove the referenced schedule files");
  cachePublish->callback([&] { rc = optiflow::cli::runCachePublish(cache); });
  auto* cacheShow =
      cacheCmd->add_subcommand("show", "The cache: plans, pinned communicators, activity, decisions, network");
  addNamespace(cacheShow);
  cacheShow->add_flag("--json", cache.json, "Print one JSON object");
  cacheShow->callback([&] { rc = optiflow::cli::runCacheShow(cache); });
  auto* cacheVerify =
      cacheCmd->add_subcommand("verify", "Check the cache's slots and prove the current plan's schedule files");
  addNamespace(cacheVerify);
  cacheVerify->callback([&] { rc = optiflow::cli::runCacheVerify(cache); });
  auto* cacheClear = cacheCmd->add_subcommand("clear", "Make no plan current (new communicators get NCCL's choices)");
  addNamespace(cacheClear);
  cacheClear->add_flag("--remove", cache.remove, "Delete the cache segment instead");
  cacheClear->add_flag("--force", cache.force,
                       "With --remove: delete it even if communicators initialised with it in the last 10 minutes");
  cacheClear->callback([&] { rc = optiflow::cli::runCacheClear(cache); });
  auto* cacheMeasurements = cacheCmd->add_subcommand(
      "measurements", "GPU times the profiler plugin measured in running jobs, per communicator and configuration");
  addNamespace(cacheMeasurements);
  cacheMeasurements->add_flag("--json", cache.json, "Print one JSON object");
  cacheMeasurements->callback([&] { rc = optiflow::cli::runCacheMeasurements(cache); });
  auto* cacheRails =
      cacheCmd->add_subcommand("rails", "The net plugin's rail weights (share of striped messages per NIC)");
  addNamespace(cacheRails);
  auto* cacheRailsSet = cacheRails->add_subcommand(
      "set", "Replace the rail weights: NAME=WEIGHT per interface; interfaces not listed get weight 0 (unused)");
  cacheRailsSet->add_option("weights", cache.railWeights, "NAME=WEIGHT, e.g. eth0=3 eth1=1 (weights 0 to 1000000)")
      ->required();
  addNamespace(cacheRailsSet);
  cacheRailsSet->add_option("--group", cache.group,
                            "Group that may read a cache this creates (mode 0660; default: owner only)");
  // Subcommand callbacks run before their parent's: `rails set` must not also print the weights as `rails`.
  cacheRailsSet->callback([&] { rc = optiflow::cli::runCacheRailsSet(cache); });
  cacheRails->callback([&] {
    if (cacheRailsSet->count() == 0) rc = optiflow::cli::runCacheRails(cache);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitBadInput;
  } catch (const std::exception& e) {
    // Library code reports bad input through Result; this is the last line of defence for anything else.
    fmt::print(stderr, "optiflow: {}\n", e.what());
    return kExitBadInput;
  }
  return rc;
}
