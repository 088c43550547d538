// One synthesis run, as `optiflow synthesize` and optiflowd start it: the proposer and the evaluator built from a
// spec, an earlier history resumed, every candidate appended to the run directory's history.jsonl as it is
// evaluated, and plan.json with the winners' programs and schedules written at the end. The callers keep only what
// is theirs: the CLI its arguments and table, optiflowd its schedule, metrics and CPU gate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/llm_client.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::synth {

struct SynthesisSpec {
  SynthConfig config;                   // config.resume is filled from `resumeFrom`
  std::string proposer = "builtin";     // builtin | llm
  std::uint64_t seed = 1;               // the builtin proposer's (the llm proposer falls back to it)
  LlmConfig llm;                        // proposer == "llm": baseUrl and model must be set
  std::string evaluator = "simulator";  // simulator | hardware
  LauncherConfig launcher;              // evaluator == "hardware": the command (workDir is runDir/hardware)
  std::filesystem::path runDir;         // created if needed; its history.jsonl is appended to
  // A history.jsonl to continue (its programs are not proposed again). When it is not the run directory's own, its
  // records are copied into the new history first, so the run directory stands alone.
  std::optional<std::filesystem::path> resumeFrom;
};

struct SynthesisHooks {
  std::function<void(const ProgressEvent&)> progress;
  std::function<bool()> keepGoing;  // asked after the baselines and after each candidate; false stops the run
};

struct SynthesisOutcome {
  SynthResult result;
  RunInfo info;
  bool stopped = false;                   // keepGoing said stop: nothing but history.jsonl was written
  bool historyComplete = true;            // false: an append failed and the history misses records (the run went on)
  std::optional<core::Diagnostic> error;  // the run failed, or its plan could not be written
};

// A run whose spec has been checked and whose history is open: preparing touches the run directory only when the
// whole spec is good (a wrong proposer, evaluator, LLM setting or an unreadable or mismatched history loses nothing).
// Errors name the file or the setting; nothing here throws.
class Synthesis {
 public:
  static core::Result<Synthesis> prepare(const core::Topology& topology, SynthesisSpec spec);
  SynthesisOutcome run(const SynthesisHooks& hooks = {});

  Synthesis(Synthesis&&) noexcept;
  Synthesis& operator=(Synthesis&&) noexcept;
  ~Synthesis();

 private:
  struct State;
  explicit Synthesis(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace optiflow::synth
