// The evaluator compiles an option only when the bound of its layout (compiler::compileLayout, bounded with one
// exact iteration and no folding) says its turn may come. That is sound only if the layout fails exactly when
// compile() fails, has compile()'s blocks and steps, and its bound is never above the compiled schedule's. Checked
// on every option of every program a seeded synthesis run evaluates (gallery programs and their mutations), at
// latency- and bandwidth-bound sizes.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/builtin_proposer.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {
namespace {

// The blocks of every rank with their peers, channel and number of steps: what the layout must share with
// compile()'s schedule.
std::string shape(const core::Schedule& s) {
  std::string out = fmt::format("{} ranks {} channels {} chunks\n", s.nRanks, s.nChannels, s.chunksPerLoop);
  for (const core::RankProgram& r : s.ranks) {
    for (const core::ThreadBlock& tb : r.threadBlocks) {
      out += fmt::format("{}:{} {}>{} ch{} {}\n", r.rank, tb.id, tb.recvPeer, tb.sendPeer, tb.channel, tb.steps.size());
    }
  }
  return out;
}

// A SimEvaluator that checks, before each evaluation, every option's layout against its compiled schedule.
class CheckingEvaluator : public SimEvaluator {
 public:
  CheckingEvaluator(const core::Topology& topology, sim::SimParams params)
      : SimEvaluator(topology, params), topology_(topology), net_(sim::Network::build(topology).value()) {}

  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override {
    sim::SimParams layoutParams = params();
    layoutParams.maxExactIterations = 1;
    layoutParams.foldSymmetricNodes = false;
    for (const compiler::CompileOptions& o : candidateOptions(intent, sizeBytes)) {
      const std::string what = fmt::format("{} at {} {}/{}ch/{}sl", intent.name, core::formatSize(sizeBytes),
                                           core::toString(*o.protocol), o.channels, o.slices);
      auto c = compiler::compile(intent, topology_, o);
      auto l = compiler::compileLayout(intent, topology_, o);
      const std::lock_guard<std::mutex> lock(mu_);
      ++options_;
      if (!c || !l) {
        EXPECT_EQ(c.ok(), l.ok()) << what << ": " << (c ? l.error().message : c.error().message);
        if (!c && !l) {
          EXPECT_EQ(c.error().message, l.error().message) << what;
        }
        if (!c) ++failures_;
        continue;
      }
      EXPECT_EQ(shape(c->schedule), shape(l->schedule)) << what;
      const double compiledFloor = sim::lowerBoundUs(c->schedule, net_, sizeBytes, params());
      const double layoutFloor = sim::lowerBoundUs(l->schedule, net_, sizeBytes, layoutParams);
      EXPECT_GT(layoutFloor, 0) << what;
      EXPECT_LE(layoutFloor * (1 - 1e-9), compiledFloor) << what;
      if (layoutFloor > 0) worst_ = std::min(worst_, compiledFloor / layoutFloor);
    }
    return SimEvaluator::evaluate(intent, sizeBytes, hint);
  }

  int options() const { return options_; }
  int failures() const { return failures_; }
  double worst() const { return worst_; }

 private:
  const core::Topology& topology_;
  sim::Network net_;
  std::mutex mu_;
  int options_ = 0;
  int failures_ = 0;
  double worst_ = 1e300;
};

void checkRun(const std::string& preset, core::Collective coll, std::vector<std::uint64_t> sizes, int rounds,
              int minOptions) {
  auto topo = core::presetTopology(preset);
  ASSERT_TRUE(topo.ok()) << preset;
  SynthConfig cfg;
  cfg.collective = coll;
  cfg.sizes = std::move(sizes);
  cfg.rounds = rounds;
  cfg.threads = 2;
  BuiltinProposer proposer(1);
  CheckingEvaluator evaluator(*topo, cfg.params);
  const SynthResult res = runSynthesis(*topo, cfg, proposer, evaluator);
  EXPECT_GE(evaluator.options(), minOptions) << preset;
  ::testing::Test::RecordProperty(preset + "-options", evaluator.options());
  ::testing::Test::RecordProperty(preset + "-compile-failures", evaluator.failures());
  ::testing::Test::RecordProperty(preset + "-least-compiled-over-layout-bound",
                                  fmt::format("{:.3f}", evaluator.worst()));
}

TEST(LayoutBound, MatchesCompileAndNeverExceedsTheCompiledBound) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  checkRun("dgx-a100x2", core::Collective::AllGather, {4096, 16 << 20}, 3, 100);
#else
  checkRun("dgx-a100x2", core::Collective::AllGather, {4096, 256 << 10, 4 << 20, 64 << 20, 1 << 30}, 8, 1000);
  checkRun("dgx-a100x4", core::Collective::AllGather, {64 << 10, 16 << 20, 256 << 20}, 4, 400);
  checkRun("dgx-h100x2", core::Collective::ReduceScatter, {64 << 10, 1 << 20, 16 << 20, 256 << 20}, 8, 500);
  checkRun("dgx-h100x2", core::Collective::AllReduce, {64 << 10, 1 << 20, 16 << 20, 256 << 20}, 8, 500);
#endif
}

}  // namespace
}  // namespace optiflow::synth
