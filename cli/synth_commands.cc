// `optiflow synthesize` (the main job: rounds of proposals, compiled, verified and simulated, the best per size
// against NCCL and the bound) and `optiflow report` (an HTML page of a run directory).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/report.h"
#include "optiflow/synth/run_dir.h"
#include "optiflow/synth/service.h"

namespace optiflow::cli {

namespace {

namespace fs = std::filesystem;

// Log lines (retries, fallbacks, bugs) go to stderr so that stdout stays the table or the JSON.
void logToStderr() {
  static bool done = false;
  if (done) return;
  done = true;
  auto logger = spdlog::stderr_color_mt("optiflow");
  logger->set_pattern("optiflow: %l: %v");
  spdlog::set_default_logger(logger);
}

std::string ratio(double num, double den) { return num > 0 && den > 0 ? fmt::format("{:.2f}x", num / den) : "n/a"; }

std::string nativeName(const synth::NativeChoice& n) {
  if (n.channels <= 0) return n.algorithm.empty() ? "n/a" : n.algorithm;
  return fmt::format("{}/{}/{}ch", n.algorithm, n.protocol, n.channels);
}

// One line per round (and, on a terminal, a line rewritten per candidate).
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}

  void operator()(const synth::ProgressEvent& e) {
    if (quiet_) return;
    const synth::SynthResult& r = *e.result;
    switch (e.kind) {
      case synth::ProgressEvent::Kind::Baselines:
        fmt::print(stderr, "baselines: NCCL's choice and the best NCCL-native configuration at {} sizes\n",
                   r.sizes.size());
        break;
      case synth::ProgressEvent::Kind::RoundStart:
        ok_ = rejected_ = 0;
        break;
      case synth::ProgressEvent::Kind::Candidate:
        (e.record->stage == "ok" ? ok_ : rejected_)++;
        if (tty_) {
          fmt::print(stderr, "\r\033[Kround {} [{}/{}] {} ({})", e.round + 1, e.index + 1, e.count,
                     e.record->name.empty() ? e.record->id : e.record->name, e.record->stage);
        }
        break;
      case synth::ProgressEvent::Kind::RoundEnd: {
        double worst = 0;
        int led = 0;
        for (const synth::SizeBest& sb : r.sizes) {
          if (sb.best < 0) continue;
          ++led;
          worst = std::max(worst, sb.bestUs / sb.boundUs);
        }
        fmt::print(stderr,
                   "{}round {}: {} candidates, {} evaluated, {} rejected; best at {}/{} sizes, worst {:.3f}x "
                   "the bound\n",
                   tty_ ? "\r\033[K" : "", e.round + 1, e.count, ok_, rejected_, led, r.sizes.size(), worst);
        break;
      }
    }
  }

 private:
  bool quiet_;
  bool tty_;
  int ok_ = 0;
  int rejected_ = 0;
};

void printTable(const core::Topology& topo, const synth::SynthConfig& cfg, const synth::SynthResult& res,
                const std::string& proposer, const fs::path& dir) {
  int evaluated = 0;
  for (const synth::CandidateRecord& c : res.history) evaluated += c.stage == "ok" ? 1 : 0;
  fmt::print(
      "{} on {} ({} GPUs, {} nodes): {} proposer, {} round{}, {} candidates ({} evaluated), {:.1f} s, "
      "stopped: {}\n",
      core::toString(cfg.collective), topo.name, topo.nRanks(), topo.nodes, proposer, res.roundsRun,
      res.roundsRun == 1 ? "" : "s", res.history.size(), evaluated, res.elapsedS, res.stopReason);
  for (const std::string& note : res.measurementNotes) fmt::print("{}\n", note);
  fmt::print(
      "{}; nccl = NCCL's own choice, native = the fastest NCCL algorithm/protocol/channels, model_us = NCCL's own "
      "cost model's time of its choice\n",
      res.roundsMeasured > 0 ? "best_us measured on hardware where marked *, the rest simulated" : "times simulated");
  fmt::print("{:>8} {:>18} {:>9} {:>9} {:>18} {:>9} {:>28} {:>14} {:>9} {:>8} {:>9} {:>8}\n", "size", "nccl", "nccl_us",
             "model_us", "native", "native_us", "best", "config", "best_us", "speedup", "bound_us", "x_bound");
  int disagree = 0;
  int modelOnly = 0;
  double lo = 0;
  double hi = 0;
  for (const synth::SizeBest& sb : res.sizes) {
    std::string name = "(none)";
    if (sb.best >= 0) name = res.history[static_cast<std::size_t>(sb.best)].name;
    if (name.size() > 28) name = name.substr(0, 27) + "~";
    if (sb.ncclModelUs > 0 && sb.best >= 0) {
      const double s = sb.ncclModelUs / sb.bestUs;
      lo = lo == 0 ? s : std::min(lo, s);
      hi = std::max(hi, s);
      if (sb.nccl.timeUs <= 0) {
        ++modelOnly;
      } else if (modelsDisagree(sb.ncclModelUs, sb.nccl.timeUs)) {
        ++disagree;
      }
    }
    fmt::print("{:>8} {:>18} {:>9} {:>9} {:>18} {:>9} {:>28} {:>14} {:>9} {:>8} {:>9.2f} {:>8}\n",
               core::formatSize(sb.sizeBytes), nativeName(sb.nccl),
               sb.nccl.timeUs > 0 ? fmt::format("{:.2f}", sb.nccl.timeUs) : "n/a",
               sb.ncclModelUs > 0 ? fmt::format("{:.2f}", sb.ncclModelUs) : "n/a", nativeName(sb.bestNative),
               sb.bestNative.timeUs > 0 ? fmt::format("{:.2f}", sb.bestNative.timeUs) : "n/a", name,
               sb.best >= 0 ? sb.config : "-",
               sb.best >= 0 ? fmt::format("{:.2f}{}", sb.bestUs, sb.measured ? "*" : "") : "n/a",
               ratio(sb.nccl.timeUs, sb.bestUs), sb.boundUs, ratio(sb.bestUs, sb.boundUs));
  }
  // Two estimates of NCCL: the speedup column is against the simulated NCCL (the model that timed the schedules too);
  // where NCCL's own model disagrees, the table says so and gives the speedups against it as well.
  if (disagree > 0 || modelOnly > 0) {
    fmt::print(
        "NCCL's cost model and the simulated NCCL differ by more than {:.0f}% at {} size(s){}; speedup is against the "
        "simulated NCCL, timed by the same simulator as the schedules (docs/nccl-model.md); against NCCL's own model "
        "the best is {:.2f}x - {:.2f}x.\n",
        100 * kModelDisagreement, disagree,
        modelOnly > 0 ? fmt::format(", and at {} NCCL's choice cannot be simulated (model only)", modelOnly) : "", lo,
        hi);
  }
  fmt::print("plan, schedules and history in {}\n", dir.string());
}

nlohmann::json resultJson(const core::Topology& topo, const synth::SynthConfig& cfg, const synth::SynthResult& res,
                          const fs::path& dir) {
  nlohmann::json rows = nlohmann::json::array();
  for (const synth::SizeBest& sb : res.sizes) {
    const synth::CandidateRecord* rec = sb.best >= 0 ? &res.history[static_cast<std::size_t>(sb.best)] : nullptr;
    auto orNull = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    rows.push_back({{"size_bytes", sb.sizeBytes},
                    {"best_time_us", rec ? nlohmann::json(sb.bestUs) : nlohmann::json(nullptr)},
                    {"nccl_time_us", orNull(sb.nccl.timeUs)},
                    {"nccl", nativeName(sb.nccl)},
                    {"nccl_model_time_us", orNull(sb.ncclModelUs)},
                    {"speedup_vs_nccl_model",
                     rec && sb.ncclModelUs > 0 ? nlohmann::json(sb.ncclModelUs / sb.bestUs) : nlohmann::json(nullptr)},
                    {"native_time_us", orNull(sb.bestNative.timeUs)},
                    {"native", nativeName(sb.bestNative)},
                    {"bound_us", sb.boundUs},
                    {"effective_bound_us", sb.effectiveBoundUs},
                    {"speedup_vs_nccl",
                     rec && sb.nccl.timeUs > 0 ? nlohmann::json(sb.nccl.timeUs / sb.bestUs) : nlohmann::json(nullptr)},
                    {"ratio_to_bound", rec ? nlohmann::json(sb.bestUs / sb.boundUs) : nlohmann::json(nullptr)},
                    {"program", rec ? nlohmann::json(rec->name) : nlohmann::json(nullptr)},
                    {"program_text", rec ? nlohmann::json(rec->text) : nlohmann::json(nullptr)},
                    {"candidate", rec ? nlohmann::json(rec->id) : nlohmann::json(nullptr)},
                    {"config", rec ? nlohmann::json(sb.config) : nlohmann::json(nullptr)},
                    {"measured", sb.measured},
                    {"simulated_us", sb.measured ? nlohmann::json(sb.simulatedUs) : nlohmann::json(nullptr)}});
  }
  return {{"topology", topo.name},
          {"collective", core::toString(cfg.collective)},
          {"ranks", topo.nRanks()},
          {"nodes", topo.nodes},
          {"rounds", res.roundsRun},
          {"candidates", res.history.size()},
          {"elapsed_s", res.elapsedS},
          {"stop_reason", res.stopReason},
          {"out", dir.string()},
          {"rows", std::move(rows)},
          {"measurement_notes", res.measurementNotes}};
}

}  // namespace

int runSynthesize(const SynthArgs& a) {
  logToStderr();
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
  if (a.root < 0 || a.root >= topo->nRanks()) {
    fmt::print(stderr, "optiflow: --root {} is not a rank of {} ({} ranks)\n", a.root, topo->name, topo->nRanks());
    return kExitBadInput;
  }
  const fs::path dir =
      a.out.empty() ? fs::path("optiflow-runs") / fmt::format("{}-{}", topo->name, a.collective) : fs::path(a.out);
  const fs::path historyFile = dir / "history.jsonl";
  synth::SynthConfig cfg;
  cfg.collective = *coll;
  cfg.sizes = *sizes;
  cfg.rounds = a.rounds;
  cfg.candidatesPerRound = a.candidates;
  cfg.timeBudgetS = a.timeBudgetS;
  cfg.root = a.root;
  auto cal = calibrationArg(a.calibration, *topo);
  if (!cal) return kExitBadInput;
  cfg.params = simParamsFor(*cal, a.launch);
  if (*cal) cfg.ncclModel = (*cal)->ncclModel.params;

  // Every argument is checked before the run directory is touched, so a wrong flag loses nothing.
  synth::SynthesisSpec spec;
  spec.proposer = a.proposer;
  spec.seed = a.seed;
  spec.runDir = dir;
  spec.evaluator = a.evaluator;
  if (a.evaluator == "hardware") {
    spec.launcher.command = a.launcher;
    spec.launcher.timeoutS = a.launcherTimeoutS;
    if (std::string bad = synth::checkLauncherCommand(a.launcher); !bad.empty()) {
      fmt::print(stderr, "optiflow: --launcher: {}\n", bad);
      return kExitBadInput;
    }
  } else if (!a.launcher.empty()) {
    fmt::print(stderr, "optiflow: --launcher needs --evaluator hardware\n");
    return kExitBadInput;
  }
  if (a.proposer == "llm") {
    if (a.llmUrl.empty() || a.llmModel.empty()) {
      fmt::print(stderr,
                 "optiflow: --proposer llm needs --llm-url (e.g. http://localhost:8000/v1) and "
                 "--llm-model\n");
      return kExitBadInput;
    }
    auto key = synth::resolveApiKey(a.llmApiKeyFile.empty() ? std::nullopt : std::optional(a.llmApiKeyFile));
    if (!key) {
      fmt::print(stderr, "optiflow: {}\n", key.error().str());
      return kExitBadInput;
    }
    spec.llm.baseUrl = a.llmUrl;
    spec.llm.model = a.llmModel;
    spec.llm.apiKey = std::move(key).value();
    spec.llm.timeoutS = a.llmTimeoutS;
  }

  std::error_code ec;
  const bool earlier = fs::exists(historyFile, ec) || fs::exists(dir / "plan.json", ec);
  if (a.resume) {
    spec.resumeFrom = historyFile;
  } else if (earlier) {
    if (!a.force) {
      fmt::print(stderr,
                 "optiflow: {} holds an earlier run: pass --resume to continue it, --force to replace it, or "
                 "--out for another directory\n",
                 dir.string());
      return kExitBadInput;
    }
    for (const char* f : {"history.jsonl", "plan.json", "report.html"}) fs::remove(dir / f, ec);
    fs::remove_all(dir / "programs", ec);
    fs::remove_all(dir / "schedules", ec);
  }
  spec.config = cfg;

  auto synthesis = synth::Synthesis::prepare(*topo, std::move(spec));
  if (!synthesis) {
    fmt::print(stderr, "optiflow: {}\n", synthesis.error().str());
    return kExitBadInput;
  }
  ProgressPrinter printer(a.quiet);
  synth::SynthesisHooks hooks;
  hooks.progress = [&](const synth::ProgressEvent& e) { printer(e); };
  const synth::SynthesisOutcome ran = synthesis->run(hooks);
  if (ran.error) {
    fmt::print(stderr, "optiflow: {}\n", ran.error->str());
    return kExitFailed;
  }
  const synth::SynthResult& res = ran.result;
  const synth::RunInfo& info = ran.info;
  if (a.json) {
    std::cout << resultJson(*topo, cfg, res, dir).dump(2) << '\n';
  } else {
    printTable(*topo, cfg, res, info.proposer, dir);
  }
  for (const synth::SizeBest& sb : res.sizes) {
    if (sb.best < 0) return kExitFailed;  // no candidate worked at some size: the plan has a hole
  }
  return kExitOk;
}

int runReport(const ReportArgs& a) {
  auto html = synth::renderReport(a.dir);
  if (!html) {
    fmt::print(stderr, "optiflow: {}\n", html.error().str());
    return kExitBadInput;
  }
  const fs::path out = a.output.empty() ? fs::path(a.dir) / "report.html" : fs::path(a.output);
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file << *html;
  file.flush();
  if (!file) {
    fmt::print(stderr, "optiflow: cannot write {}\n", out.string());
    return kExitFailed;
  }
  fmt::print("wrote {}\n", out.string());
  return kExitOk;
}

}  // namespace optiflow::cli
