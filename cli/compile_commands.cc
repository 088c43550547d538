// `optiflow compile` (program -> verified schedule) and `optiflow compare` (programs against NCCL and the bound).
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::cli {

namespace {

std::optional<std::string> readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fmt::print(stderr, "optiflow: cannot read {}\n", path);
    return std::nullopt;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int runCompile(const CompileArgs& a) {
  auto text = readText(a.program);
  if (!text) return kExitBadInput;
  auto topo = topologyArg(a.topology, a.topologyHints);
  if (!topo) return kExitBadInput;
  // A compiled schedule does not depend on a calibration (only its times do); the file is still checked.
  if (!calibrationArg(a.calibration, *topo)) return kExitBadInput;
  compiler::CompileOptions o;
  if (!a.size.empty()) {
    auto size = core::parseSize(a.size);
    if (!size) {
      fmt::print(stderr, "optiflow: --size: {}\n", size.error().str());
      return kExitBadInput;
    }
    o.sizeBytes = *size;
  }
  if (!a.protocol.empty()) o.protocol = core::parseProtocol(a.protocol);
  o.channels = a.channels;
  o.slices = a.slices;
  if (a.limits == "none") o.limits = compiler::ExecutorLimits::none();
  dsl::ExpandOptions eo;
  eo.root = a.root;
  const synth::Frontend f = synth::parseAndExpand(*text, a.program, *topo, eo);
  if (!f.ok()) {
    fmt::print(stderr, "{}\n", f.message);
    return kExitBadInput;
  }
  auto res = compiler::compile(*f.intent, *topo, o);
  if (!res) {
    fmt::print(stderr, "optiflow: {}: {}\n", a.program, res.error().message);
    return kExitFailed;
  }
  const auto format = a.format == "msccl-xml" ? compiler::ScheduleFormat::MscclXml : compiler::ScheduleFormat::Json;
  const std::string out = compiler::formatSchedule(res->schedule, format);
  if (a.output.empty()) {
    std::cout << out;
  } else {
    std::ofstream file(a.output, std::ios::binary);
    file << out;
    if (!file) {
      fmt::print(stderr, "optiflow: cannot write {}\n", a.output);
      return kExitBadInput;
    }
  }
  fmt::print(stderr, "{}: {} on {} ({} ranks){}: {}; verified: {}\n", a.program, res->schedule.name, topo->name,
             topo->nRanks(), o.sizeBytes ? fmt::format(" for {}", core::formatSize(o.sizeBytes)) : std::string(),
             res->summary, res->report.proven ? "proven for in-place and out-of-place buffers" : "NOT proven");
  return kExitOk;
}

int runCompare(const CompareArgs& a) {
  auto topo = topologyArg(a.topology, a.topologyHints);
  if (!topo) return kExitBadInput;
  auto sizes = core::parseSizeList(a.sizes);
  if (!sizes) {
    fmt::print(stderr, "optiflow: --sizes: {}\n", sizes.error().str());
    return kExitBadInput;
  }
  const auto coll = core::parseCollective(a.collective);
  if (!coll || *coll == core::Collective::Custom) {
    fmt::print(stderr, "optiflow: unknown collective '{}'\n", a.collective);
    return kExitBadInput;
  }
  struct Candidate {
    std::string file;
    std::string name;
    core::IntentProgram intent;
  };
  std::vector<Candidate> cands;
  dsl::ExpandOptions eo;
  eo.root = a.root;
  for (const std::string& p : a.programs) {
    auto text = readText(p);
    if (!text) return kExitBadInput;
    const synth::Frontend f = synth::parseAndExpand(*text, p, *topo, eo);
    if (!f.ok()) {
      // A program for another collective is simply not a candidate. One that does not fit this cluster (e.g.
      // recursive doubling on 24 GPUs) is skipped with its reason; one that does not parse is the user's to fix.
      if (f.program && f.program->collective != *coll) continue;
      if (f.failedAt == synth::Stage::Parse) {
        fmt::print(stderr, "{}\n", f.message);
        return kExitBadInput;
      }
      fmt::print(stderr, "optiflow: skipping {}: {}\n", p, f.errors.empty() ? "?" : f.errors.front().str());
      continue;
    }
    if (f.intent->collective != *coll) continue;
    cands.push_back({p, f.intent->name, *f.intent});
  }
  if (cands.empty()) {
    fmt::print(stderr, "optiflow: none of the programs is a {} program\n", a.collective);
    return kExitBadInput;
  }
  auto cal = calibrationArg(a.calibration, *topo);
  if (!cal) return kExitBadInput;
  const sim::SimParams params = simParamsFor(*cal, a.launch);
  const sim::BoundModel bounds(*topo);
  // What a perfect schedule could reach in the simulator: the same cuts at the simulator's link efficiencies.
  const sim::BoundModel effBounds(
      sim::effectiveTopology(*topo, params.linkEfficiency[0], params.linkEfficiency[1], params.linkEfficiency[2]));
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print(
        "{} on {} ({} GPUs): the best of {} program{} per size against NCCL's choice, both timed by the "
        "simulator\n",
        a.collective, topo->name, topo->nRanks(), cands.size(), cands.size() == 1 ? "" : "s");
    fmt::print("{:>8} {:>20} {:>10} {:>28} {:>12} {:>10} {:>10} {:>9} {:>9} {:>9}\n", "size", "nccl", "nccl_us", "best",
               "config", "best_us", "bound_us", "speedup", "x_bound", "x_eff");
  }
  int failures = 0;
  for (std::uint64_t size : *sizes) {
    const sim::NcclPrediction pred = sim::ncclPredict(*topo, *coll, size);
    double ncclUs = 0;
    std::string ncclName =
        fmt::format("{}/{}/{}ch", core::toString(pred.algorithm), core::toString(pred.protocol), pred.channels);
    auto ns = sim::ncclScheduleFor(*topo, *coll, pred);
    if (ns) {
      const sim::SimResult r = sim::simulate(*ns, *topo, size, sim::ncclSimParams(pred, params));
      if (r.ok) ncclUs = r.timeUs;
    }
    const double bound = bounds.bound(*coll, size).timeUs;
    const double effBound = effBounds.bound(*coll, size).timeUs;
    const Candidate* best = nullptr;
    synth::Evaluation bestEval;
    for (const Candidate& c : cands) {
      synth::Evaluation e = synth::evaluateBest(c.intent, *topo, size, params);
      if (!e.ok) {
        if (a.verbose) fmt::print(stderr, "{} at {}: {}\n", c.file, core::formatSize(size), e.error);
        continue;
      }
      if (best == nullptr || e.timeUs < bestEval.timeUs) {
        best = &c;
        bestEval = std::move(e);
      }
    }
    if (best == nullptr) {
      ++failures;
      fmt::print(stderr, "optiflow: no program compiled for {}\n", core::formatSize(size));
      continue;
    }
    const std::string config =
        fmt::format("{}/{}ch", core::toString(bestEval.compiled->protocol), bestEval.compiled->channels);
    const double speedup = ncclUs > 0 ? ncclUs / bestEval.timeUs : 0;  // 0: NCCL's algorithm has no schedule here
    if (a.json) {
      rows.push_back({{"size_bytes", size},
                      {"nccl", ncclName},
                      {"nccl_time_us", ncclUs > 0 ? nlohmann::json(ncclUs) : nlohmann::json(nullptr)},
                      {"best_program", best->name},
                      {"best_file", best->file},
                      {"config", config},
                      {"best_time_us", bestEval.timeUs},
                      {"bound_us", bound},
                      {"speedup_vs_nccl", speedup > 0 ? nlohmann::json(speedup) : nlohmann::json(nullptr)},
                      {"ratio_to_bound", bestEval.timeUs / bound},
                      {"effective_bound_us", effBound},
                      {"ratio_to_effective_bound", bestEval.timeUs / effBound}});
    } else {
      fmt::print("{:>8} {:>20} {:>10} {:>28} {:>12} {:>10.2f} {:>10.2f} {:>9} {:>8.3f}x {:>8.3f}x\n",
                 core::formatSize(size), ncclName, ncclUs > 0 ? fmt::format("{:.2f}", ncclUs) : "n/a", best->name,
                 config, bestEval.timeUs, bound, speedup > 0 ? fmt::format("{:.2f}x", speedup) : "n/a",
                 bestEval.timeUs / bound, bestEval.timeUs / effBound);
    }
    if (bestEval.timeUs < bound * (1 - 1e-9)) {
      fmt::print(stderr, "optiflow: BUG: {} at {} is predicted below the lower bound\n", best->name,
                 core::formatSize(size));
      ++failures;
    }
  }
  if (a.json) {
    nlohmann::json j = {{"topology", topo->name}, {"collective", a.collective}, {"ranks", topo->nRanks()}};
    j["rows"] = rows;
    std::cout << j.dump(2) << '\n';
  }
  return failures == 0 ? kExitOk : kExitFailed;
}

}  // namespace optiflow::cli
