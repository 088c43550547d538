// Evaluators time a candidate's intent at one message size. The simulator is the default; a real measurement on
// hardware plugs in behind the same interface (HardwareEvaluator is that seam: today it reports that no hardware
// runner is built in).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {

// How much work an evaluation may skip. The loop passes the incumbent's options at this size first and a cutoff
// near the incumbent's time: a candidate that is far slower with them is not worth the full search.
struct EvalHint {
  std::optional<compiler::CompileOptions> first;  // tried first when it is among the candidate options
  // > 0: stop after the first option when it is slower than this, and never simulate an option whose lower bound
  // (sim::lowerBoundUs) is above it (Evaluation::screened).
  double pruneAboveUs = 0;
  bool verify = true;  // prove the winner (the loop proves only winners that become the best at a size)
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual std::string_view name() const = 0;
  // The fastest schedule of `intent` at `sizeBytes` over the compile options of candidateOptions(). Never throws.
  // Must be safe to call from several threads at once (the loop evaluates the sizes of a candidate in parallel).
  virtual Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) = 0;
  // Times NCCL's own algorithm (as a schedule) the same way, so that baselines and candidates are comparable;
  // 0 when the evaluator cannot run it.
  virtual double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) = 0;
  // A time timeNccl can never beat for this schedule (0: unknown), so that configurations that cannot win are
  // not timed.
  virtual double boundNccl(const core::Schedule&, std::uint64_t, const sim::SimParams&) { return 0; }
};

class SimEvaluator : public Evaluator {
 public:
  SimEvaluator(const core::Topology& topology, sim::SimParams params);
  std::string_view name() const override { return "simulator"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override;
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override;
  double boundNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override;
  const sim::SimParams& params() const { return params_; }

 private:
  const core::Topology& topology_;
  sim::SimParams params_;
  std::optional<sim::Network> network_;  // built once; empty when the topology is invalid (every evaluation fails)
  std::string networkError_;
};

// The fastest schedule of `intent` at `sizeBytes` over every candidate option, verified: a SimEvaluator's
// evaluation without hints, for one-off use (it builds the network each call).
Evaluation evaluateBest(const core::IntentProgram& intent, const core::Topology& topology, std::uint64_t sizeBytes,
                        const sim::SimParams& params = {});

// Where a measurement on real GPUs goes (an MSCCL-enabled NCCL or MSCCL++ running the exported schedule): not
// built in yet, so every evaluation fails with a message saying so.
class HardwareEvaluator : public Evaluator {
 public:
  std::string_view name() const override { return "hardware"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override;
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override;
};

}  // namespace optiflow::synth
