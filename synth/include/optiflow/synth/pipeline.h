// From program text to a verified schedule and its simulated time: the pipeline every user of the language runs
// (the `compile` and `compare` commands, the synthesizer, the tests). Errors come back formatted for a person or a
// language model: file:line:column, the message, the source line and a caret.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/error.h"
#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/ast.h"
#include "optiflow/dsl/expand.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::synth {

enum class Stage : std::uint8_t { Parse, Expand, Compile };
std::string_view toString(Stage s);

struct Frontend {
  std::optional<dsl::Program> program;
  std::optional<core::IntentProgram> intent;
  Stage failedAt = Stage::Parse;
  std::vector<core::Diagnostic> errors;  // empty when intent is set
  std::string message;                   // every error formatted with its source line and caret
  bool ok() const { return intent.has_value(); }
};

// Parse and expand `text` (named `fileName` in diagnostics) for `topology`.
Frontend parseAndExpand(std::string_view text, std::string_view fileName, const core::Topology& topology,
                        const dsl::ExpandOptions& options = {});

// The compile options tried for one size when searching for the best schedule: every protocol that makes sense at
// that size and a few channel counts (docs/compiler.md, "Protocol, channels and slices per size").
std::vector<compiler::CompileOptions> candidateOptions(const core::IntentProgram& intent, std::uint64_t sizeBytes);

struct Evaluation {
  bool ok = false;
  std::string error;
  double timeUs = 0;
  compiler::CompileOptions options;  // the winning options
  std::optional<compiler::CompileResult> compiled;
  sim::SimResult sim;
  std::string bottleneck;  // the busiest link and its utilisation, e.g. "node0/mlx5_0->rail0 (97%)"
  bool screened = false;   // only the first options were tried: they were already too slow (EvalHint)
  bool boundOnly = false;  // screened before simulating: timeUs is sim::lowerBoundUs of the best option, not a time
  bool stopped = false;    // screened, its simulation stopped past the cutoff: timeUs is a lower bound, not a time
  bool outOfTime = false;  // EvalHint::deadline passed before it finished: no result (error says so)
  bool proven = false;     // the winner went through the verifier and passed
};

// Proves `e`'s schedule with the verifier (once); an unproven schedule turns `e` into a failure naming the
// verifier's first error, as a compiler bug. Past `deadline` the proof gives up, and `e` is out of time.
void prove(Evaluation& e, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

}  // namespace optiflow::synth
