// Evaluators time a candidate's intent at one message size. The simulator is the default; HardwareEvaluator screens
// with the simulator and then measures each round's screened schedules on the user's GPUs through optiflow-bench
// (started by the user's launcher command), whose times replace the simulated ones.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {

// The bounds of one candidate's layouts, shared by the evaluations of its sizes: the loop makes one per candidate and
// passes it in every size's EvalHint. A layout does not depend on the size (its protocol, channels, slices and
// limits shape it; the size only weighs the steps), so each option is laid out once per candidate instead of once
// per size, and bounded at every size from its sim::BoundCurve. A refusal (the executor's limits, the compiler's
// memory guards) does not depend on the protocol either: it is kept for every protocol of its channels, slices and
// limits. Safe to use from several threads at once.
class LayoutBounds {
 public:
  struct Entry {
    sim::BoundCurve curve;
    std::string error;  // non-empty: the option does not compile (the same message at every size)
  };
  // Options that leave the protocol or the channels to the compiler are laid out by size: never kept.
  static bool keeps(const compiler::CompileOptions& o) { return o.protocol.has_value() && o.channels > 0; }
  std::optional<Entry> find(const compiler::CompileOptions& o) const;
  void insert(const compiler::CompileOptions& o, Entry e);  // the first entry for an option stays
  std::size_t size() const;                                 // options laid out
  std::size_t hits() const;                                 // options bounded from another evaluation's layout

  // Layouts under way hold the compiler's working state, about 200 bytes a hop (a transfer per slice): on 1024 ranks
  // a gigabyte or more each. So one layout of a shape (channels, slices, limits) is made at a time: a layout that
  // another evaluation is making with the same shape waits for it, then finds its refusal, if any. And past
  // kHopsAtOnce hops under way in all a layout waits for the others to end (one alone always starts).
  static constexpr std::size_t kHopsAtOnce = std::size_t{1} << 23;
  class Turn {
   public:
    Turn(Turn&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), shape_(o.shape_), hops_(o.hops_) {}
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    friend class LayoutBounds;
    using Shape = std::array<int, 6>;
    Turn(LayoutBounds* owner, std::optional<Shape> shape, std::size_t hops)
        : owner_(owner), shape_(shape), hops_(hops) {}
    LayoutBounds* owner_;
    std::optional<Shape> shape_;  // none: an option that is not kept
    std::size_t hops_;
  };
  // Waits for the turn of a layout of `hops` hops; none past the deadline.
  std::optional<Turn> turn(const compiler::CompileOptions& o, std::size_t hops,
                           std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

 private:
  using Key = std::array<int, 7>;
  static Key key(const compiler::CompileOptions& o);
  static Turn::Shape shape(const compiler::CompileOptions& o);
  mutable std::mutex mutex_;
  std::condition_variable turnOver_;
  std::map<Key, Entry> entries_;
  std::map<Turn::Shape, std::string> refusals_;
  std::set<Turn::Shape> laying_;
  std::size_t hopsLaying_ = 0;
  mutable std::size_t hits_ = 0;
};

// How much work an evaluation may skip. The loop passes the incumbent's options at this size first and a cutoff
// near the incumbent's time: a candidate that is far slower with them is not worth the full search.
struct EvalHint {
  std::optional<compiler::CompileOptions> first;  // tried first when it is among the candidate options
  // > 0: stop after the first option when it is slower than this, and never simulate an option whose lower bound
  // (sim::lowerBoundUs) is above it (Evaluation::screened).
  double pruneAboveUs = 0;
  // > 0 (with pruneAboveUs): the simulation that screens the first options may stop once past max(this,
  // pruneAboveUs); the screened evaluation then reports where it stopped (Evaluation::stopped). The loop sets it
  // where nothing reads a time above it.
  double stopAboveUs = 0;
  bool verify = true;  // prove the winner (the loop proves only winners that become the best at a size)
  std::shared_ptr<LayoutBounds> layouts;  // shared by one candidate's sizes; null: each size lays its options out
  // Laid-out options wait to be compiled in order of their bounds; past this many steps in all, only those first in
  // that order are held (at least one), and the others are laid out again should their turn come. Only memory and
  // work depend on it.
  std::size_t heldLayoutSteps = std::size_t{1} << 22;
  // Wall clock: past it no compile or simulation starts and one under way stops (Evaluation::outOfTime).
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// One schedule of a round to measure: a candidate's verified schedule at one size.
struct MeasureItem {
  std::string id;  // unique within the round, e.g. "r2c5-1MiB"
  core::Schedule schedule;
  std::uint64_t sizeBytes = 0;
};

// What a round's measurement gave.
struct RoundMeasurement {
  std::string error;                          // non-empty: nothing was measured (the simulator's times stand)
  std::vector<std::optional<double>> timeUs;  // per item, when error is empty; nullopt: that item failed
  std::vector<std::string> itemErrors;        // per item, why it has no time
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual std::string_view name() const = 0;
  // The fastest schedule of `intent` at `sizeBytes` over the compile options of candidateOptions(). Never throws.
  // Must be safe to call from several threads at once (the loop evaluates the sizes of a candidate in parallel).
  virtual Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) = 0;
  // Times NCCL's own algorithm (as a schedule) the same way, so that baselines and candidates are comparable;
  // 0 when the evaluator cannot run it. With params.stopAtUs > 0, a time at or above it only says "not sooner".
  virtual double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) = 0;
  // A time timeNccl can never beat for this schedule (0: unknown), so that configurations that cannot win are
  // not timed.
  virtual double boundNccl(const core::Schedule&, std::uint64_t, const sim::SimParams&) { return 0; }
  // Whether measureRound measures: the loop then hands it every round's screened schedules and takes its times.
  virtual bool measuresRounds() const { return false; }
  virtual RoundMeasurement measureRound(int /*round*/, const std::vector<MeasureItem>& /*items*/) {
    return {"this evaluator does not measure", {}, {}};
  }
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
  // Names the winner's bottleneck, drops what the loop does not keep, and proves it when the hint asks.
  void finish(Evaluation& best, const EvalHint& hint) const;

  const core::Topology& topology_;
  sim::SimParams params_;
  std::optional<sim::Network> network_;  // built once; empty when the topology is invalid (every evaluation fails)
  std::string networkError_;
};

// The fastest schedule of `intent` at `sizeBytes` over every candidate option, verified: a SimEvaluator's
// evaluation without hints, for one-off use (it builds the network each call).
Evaluation evaluateBest(const core::IntentProgram& intent, const core::Topology& topology, std::uint64_t sizeBytes,
                        const sim::SimParams& params = {});

// How the hardware evaluator starts optiflow-bench: the user's command line (an `srun ...`, `mpirun ...` or
// `torchrun ...`, or a local one) with {batch} (a directory of schedules and batch.json) and {out} (the JSON results
// file optiflow-bench must write: `optiflow-bench {batch} --json -o {out}`), run by /bin/sh.
struct LauncherConfig {
  std::string command;
  double timeoutS = 1800;         // a launch that takes longer is killed (its whole process group)
  std::filesystem::path workDir;  // each round's batch, results and launcher.log go to workDir/round-N
};

// The command's problems (no {batch} or no {out}), or empty.
std::string checkLauncherCommand(const std::string& command);

// Times candidates with the simulator (which screens them, exactly as SimEvaluator), and measures each round's
// screened schedules on hardware: one batch per round, one launch of the user's command. A failed, timed-out or
// garbage-writing launch is the round's error (RoundMeasurement::error) and the simulator's times stand.
class HardwareEvaluator : public Evaluator {
 public:
  HardwareEvaluator(const core::Topology& topology, sim::SimParams params, LauncherConfig launcher);
  std::string_view name() const override { return "hardware"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override;
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override;
  double boundNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override;
  bool measuresRounds() const override { return true; }
  RoundMeasurement measureRound(int round, const std::vector<MeasureItem>& items) override;

 private:
  SimEvaluator sim_;
  LauncherConfig launcher_;
};

}  // namespace optiflow::synth
