#include "optiflow/synth/service.h"

#include <exception>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "optiflow/synth/builtin_proposer.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/llm_proposer.h"

namespace optiflow::synth {

namespace fs = std::filesystem;

struct Synthesis::State {
  State(const core::Topology& t, SynthesisSpec s, HistoryWriter w)
      : topology(t), spec(std::move(s)), builtin(spec.seed), writer(std::move(w)) {}

  core::Topology topology;
  SynthesisSpec spec;
  BuiltinProposer builtin;
  std::unique_ptr<LlmProposer> llm;
  Proposer* proposer = &builtin;
  std::unique_ptr<Evaluator> evaluator;
  HistoryWriter writer;
  bool historyComplete = true;
};

Synthesis::Synthesis(std::unique_ptr<State> state) : state_(std::move(state)) {}
Synthesis::Synthesis(Synthesis&&) noexcept = default;
Synthesis& Synthesis::operator=(Synthesis&&) noexcept = default;
Synthesis::~Synthesis() = default;

core::Result<Synthesis> Synthesis::prepare(const core::Topology& topology, SynthesisSpec spec) {
  if (spec.proposer == "llm") {
    if (spec.llm.baseUrl.empty() || spec.llm.model.empty()) {
      return core::Diagnostic{"<synthesis>", 0, 0,
                              "proposer llm needs an endpoint URL (e.g. http://localhost:8000/v1) and a model"};
    }
  } else if (spec.proposer != "builtin") {
    return core::Diagnostic{"<synthesis>", 0, 0,
                            fmt::format("proposer \"{}\": expected builtin or llm", spec.proposer)};
  }
  if (spec.evaluator != "simulator" && spec.evaluator != "hardware") {
    return core::Diagnostic{"<synthesis>", 0, 0,
                            fmt::format("evaluator \"{}\": expected simulator or hardware", spec.evaluator)};
  }
  if (spec.evaluator == "hardware") {
    if (std::string bad = checkLauncherCommand(spec.launcher.command); !bad.empty()) {
      return core::Diagnostic{"<synthesis>", 0, 0, "evaluator hardware: " + bad};
    }
    if (!(spec.launcher.timeoutS > 0)) {
      return core::Diagnostic{"<synthesis>", 0, 0, "evaluator hardware: the launcher timeout must be positive"};
    }
  }
  if (spec.resumeFrom) {
    auto hist = readHistory(*spec.resumeFrom);
    if (!hist) return hist.error();
    if (hist->tornTail) {
      spdlog::warn("{}: its last line is incomplete (a run stopped while writing it); resuming without it",
                   spec.resumeFrom->string());
    }
    for (const CandidateRecord& r : hist->records) {
      if (r.stage == "ok" && r.sizes.size() != spec.config.sizes.size()) {
        return core::Diagnostic{spec.resumeFrom->string(), 0, 0,
                                fmt::format("candidate {} was evaluated at {} sizes, this run has {}: resume with the "
                                            "same sizes (--sizes)",
                                            r.id, r.sizes.size(), spec.config.sizes.size())};
      }
    }
    spec.config.resume = std::move(hist->records);
  }

  // The spec is good: from here on the run directory is written.
  const fs::path historyFile = spec.runDir / "history.jsonl";
  std::error_code ec;
  fs::create_directories(spec.runDir, ec);
  if (ec) return core::Diagnostic{spec.runDir.string(), 0, 0, "cannot create the run directory: " + ec.message()};
  const bool sameHistory =
      spec.resumeFrom && fs::weakly_canonical(*spec.resumeFrom, ec) == fs::weakly_canonical(historyFile, ec);
  auto writer = HistoryWriter::open(historyFile);
  if (!writer) return writer.error();

  auto state = std::make_unique<State>(topology, std::move(spec), std::move(writer).value());
  State& s = *state;
  if (s.spec.proposer == "llm") {
    s.llm = std::make_unique<LlmProposer>(LlmClient(s.spec.llm), s.builtin);
    s.proposer = s.llm.get();
  }
  if (s.spec.evaluator == "simulator") {
    s.evaluator = std::make_unique<SimEvaluator>(s.topology, s.spec.config.params);
  } else {
    LauncherConfig launcher = s.spec.launcher;
    launcher.workDir = s.spec.runDir / "hardware";
    s.evaluator = std::make_unique<HardwareEvaluator>(s.topology, s.spec.config.params, std::move(launcher));
  }
  // A run continued from another directory's history starts with a copy of it: the run directory stands alone.
  if (s.spec.resumeFrom && !sameHistory) {
    for (const CandidateRecord& r : s.spec.config.resume) s.historyComplete &= s.writer.append(r);
  }
  return Synthesis(std::move(state));
}

namespace {

// A synthesis compiles and simulates thousands of schedules of up to hundreds of MiB each, one after another. glibc
// returns the memory of each to the kernel when it is freed (large blocks are mmapped, the heap's top is trimmed),
// and the next schedule faults every page in again: a third of the run's time on 256 GPUs. During a run freed blocks
// below kReusedBelow stay in the process for reuse; afterwards they go back (optiflowd lives on between runs). Larger
// blocks (the compiler's working arrays on 1024 ranks, hundreds of MiB each) go back when freed: kept, they held
// gigabytes that the next candidate's smaller blocks could not use (docs/synthesis.md, "1024 GPUs in 4.5 GiB").
class HeapReuse {
  static constexpr int kReusedBelow = 64 << 20;  // glibc's M_MMAP_THRESHOLD

 public:
  HeapReuse() {
#if defined(__GLIBC__)
    if (mallopt(M_MMAP_THRESHOLD, kReusedBelow) == 0)
      mallopt(M_MMAP_THRESHOLD, 32 << 20);  // older glibc: 32 MiB at most
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_TOP_PAD, 64 << 20);
#endif
  }
  ~HeapReuse() {
#if defined(__GLIBC__)
    // glibc's starting values (its mmap threshold no longer adapts once it has been set).
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
    mallopt(M_TOP_PAD, 128 << 10);
    malloc_trim(0);
#endif
  }
  HeapReuse(const HeapReuse&) = delete;
  HeapReuse& operator=(const HeapReuse&) = delete;
};

}  // namespace

SynthesisOutcome Synthesis::run(const SynthesisHooks& hooks) {
  const HeapReuse heapReuse;
  State& s = *state_;
  SynthesisOutcome out;
  out.info = RunInfo{std::string(s.proposer->name()), std::string(s.evaluator->name()), s.spec.seed};
  const fs::path historyFile = s.spec.runDir / "history.jsonl";
  try {
    out.result = runSynthesis(
        s.topology, s.spec.config, *s.proposer, *s.evaluator,
        [&](const ProgressEvent& e) {
          if (e.kind == ProgressEvent::Kind::Candidate && s.historyComplete && !s.writer.append(*e.record)) {
            s.historyComplete = false;
            spdlog::error("cannot append to {}; the run goes on without a history", historyFile.string());
          }
          if (hooks.progress) hooks.progress(e);
        },
        hooks.keepGoing);
  } catch (const std::exception& e) {
    out.error =
        core::Diagnostic{s.spec.runDir.string(), 0, 0,
                         fmt::format("synthesis of {} failed: {}", core::toString(s.spec.config.collective), e.what())};
    return out;
  }
  out.historyComplete = s.historyComplete;
  out.stopped = out.result.stopped;
  if (out.stopped) return out;
  auto wrote = writeRunDirectory(s.spec.runDir, s.topology, s.spec.config, out.result, out.info);
  if (!wrote) out.error = wrote.error();
  return out;
}

}  // namespace optiflow::synth
