// The evaluator compiles an option only when the bound of its layout (compiler::compileLayout, bounded with one
// exact iteration and no folding) says its turn may come. That is sound only if a layout that succeeds also
// compiles, has compile()'s blocks and steps, and its bound is never above the compiled schedule's. Checked
// on every option of every program a seeded synthesis run evaluates (gallery programs and their mutations), at
// latency- and bandwidth-bound sizes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/builtin_proposer.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/gallery.h"
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
        // compile() lays out first, so a layout's error is compile()'s; finishing a layout must not fail.
        EXPECT_EQ(c.ok(), l.ok()) << what << ": " << (c ? l.error().message : c.error().message);
        if (!c) ++failures_;
        continue;
      }
      EXPECT_EQ(shape(c->schedule), shape(l->schedule)) << what;
      // The evaluator bounds an option at every size of a candidate from one layout (LayoutBounds): a layout must
      // not depend on the size it is made for.
      compiler::CompileOptions other = o;
      other.sizeBytes = o.sizeBytes * 37 + 5;
      auto lo = compiler::compileLayout(intent, topology_, other);
      EXPECT_TRUE(lo.ok() && lo->schedule == l->schedule) << what << " against the layout at " << other.sizeBytes;
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
  const std::string run = fmt::format("{}-{}", preset, core::toString(coll));
  ::testing::Test::RecordProperty(run + "-options", evaluator.options());
  ::testing::Test::RecordProperty(run + "-compile-failures", evaluator.failures());
  ::testing::Test::RecordProperty(run + "-least-compiled-over-layout-bound", fmt::format("{:.3f}", evaluator.worst()));
}

TEST(LayoutBound, MatchesCompileAndNeverExceedsTheCompiledBound) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  checkRun("dgx-a100x2", core::Collective::AllGather, {4096, 16 << 20}, 3, 100);
#else
  checkRun("dgx-a100x2", core::Collective::AllGather, {4096, 256 << 10, 64 << 20}, 6, 400);
  checkRun("dgx-a100x4", core::Collective::AllGather, {64 << 10, 16 << 20}, 3, 150);
  checkRun("dgx-h100x2", core::Collective::ReduceScatter, {64 << 10, 16 << 20, 256 << 20}, 6, 300);
  checkRun("dgx-h100x2", core::Collective::AllReduce, {64 << 10, 16 << 20, 256 << 20}, 6, 300);
#endif
}

// The evaluation the loop had before options were laid out first: every option compiled and bounded, then walked
// in order of the bounds (the incumbent's options first). The evaluator must give what this gives.
Evaluation referenceEvaluate(const core::IntentProgram& intent, const core::Topology& topo, const sim::Network& net,
                             const sim::SimParams& params, std::uint64_t size, const EvalHint& hint) {
  Evaluation best;
  std::vector<compiler::CompileOptions> options = candidateOptions(intent, size);
  bool rotated = false;
  if (hint.first) {
    for (std::size_t i = 0; i < options.size(); ++i) {
      const compiler::CompileOptions& o = options[i];
      if (o.protocol == hint.first->protocol && o.channels == hint.first->channels && o.slices == hint.first->slices) {
        std::rotate(options.begin(), options.begin() + static_cast<std::ptrdiff_t>(i),
                    options.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        rotated = true;
        break;
      }
    }
  }
  struct Option {
    std::size_t index;
    compiler::CompileResult compiled;
    double floorUs;
  };
  std::vector<Option> compiled;
  std::string firstError;
  for (std::size_t i = 0; i < options.size(); ++i) {
    auto c = compiler::compile(intent, topo, options[i]);
    if (!c) {
      if (firstError.empty()) firstError = c.error().message;
      continue;
    }
    const double floorUs = sim::lowerBoundUs(c->schedule, net, size, params);
    compiled.push_back({i, std::move(c).value(), floorUs});
  }
  const bool incumbentFirst = rotated && !compiled.empty() && compiled.front().index == 0;
  std::stable_sort(compiled.begin() + (incumbentFirst ? 1 : 0), compiled.end(),
                   [](const Option& a, const Option& b) { return a.floorUs < b.floorUs; });
  const Option* lowest = nullptr;
  for (std::size_t k = 0; k < compiled.size(); ++k) {
    Option& o = compiled[k];
    if (best.ok && o.floorUs >= best.timeUs) continue;
    if (hint.pruneAboveUs > 0 && o.floorUs > hint.pruneAboveUs) {
      if (!lowest || o.floorUs < lowest->floorUs) lowest = &o;
      continue;
    }
    const sim::SimResult r = sim::simulate(o.compiled.schedule, net, size, params);
    if (!r.ok) {
      if (firstError.empty()) firstError = "simulator: " + r.error;
      continue;
    }
    if (!best.ok || r.timeUs < best.timeUs) {
      best.ok = true;
      best.timeUs = r.timeUs;
      best.options = options[o.index];
      best.compiled = std::move(o.compiled);
    }
    if (k == 0 && incumbentFirst && hint.pruneAboveUs > 0 && best.timeUs > hint.pruneAboveUs) {
      best.screened = true;
      break;
    }
  }
  if (!best.ok && lowest) {
    best.ok = best.screened = best.boundOnly = true;
    best.timeUs = lowest->floorUs;
    best.options = options[lowest->index];
  } else if (!best.ok) {
    best.error = firstError.empty() ? "no compile options apply" : firstError;
  }
  return best;
}

std::string describe(const Evaluation& e) {
  if (!e.ok) return "error: " + e.error;
  return fmt::format("{:.6f} us {}/{}ch/{}sl{}{}", e.timeUs, core::toString(*e.options.protocol), e.options.channels,
                     e.options.slices, e.screened ? " screened" : "", e.boundOnly ? " bound only" : "");
}

TEST(LayoutBound, EvaluationsAreTheOnesOfCompilingEveryOption) {
  auto topo = core::presetTopology("dgx-a100x2");
  ASSERT_TRUE(topo.ok());
  const sim::Network net = sim::Network::build(*topo).value();
  const sim::SimParams params;
  SimEvaluator evaluator(*topo, params);
  int compared = 0;
  int boundOnly = 0;
  int screened = 0;
  std::size_t sharedLayouts = 0;
  int program = 0;
  for (const EmbeddedProgram& p : galleryPrograms()) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    if (program++ % 4 != 0) continue;  // every simulation is ~20x slower: a quarter of the gallery
#endif
    const Frontend f = parseAndExpand(p.text, p.file, *topo, {});
    if (!f.ok()) continue;
    const auto layouts = std::make_shared<LayoutBounds>();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const std::vector<std::uint64_t> sizes = {1 << 20};
    const std::vector<double> cuts = {0.3, 1.5};
#else
    const std::vector<std::uint64_t> sizes = {4096, 64 << 20};
    const std::vector<double> cuts = {0.3, 1.0, 1.5};
#endif
    for (std::uint64_t size : sizes) {
      const std::string what = fmt::format("{} at {}", p.file, core::formatSize(size));
      const Evaluation free = referenceEvaluate(*f.intent, *topo, net, params, size, {});
      // Hints as the loop gives them: the incumbent's options first, cutoffs from far below to far above.
      std::vector<EvalHint> hints = {EvalHint{}};
      if (free.ok) {
        for (const compiler::CompileOptions& o : candidateOptions(*f.intent, size)) {
          for (double cut : cuts) {
            EvalHint h;
            h.first = o;
            h.pruneAboveUs = cut * free.timeUs;
            h.verify = false;
            hints.push_back(h);
          }
        }
      }
      for (const EvalHint& h : hints) {
        const Evaluation want = referenceEvaluate(*f.intent, *topo, net, params, size, h);
        // Alternately with and without the layouts' bounds shared across the program's sizes and hints (the loop
        // shares them across a candidate's sizes), and holding every layout or one: either way the evaluation is
        // the reference's.
        EvalHint shared = h;
        if (compared % 2 == 0) shared.layouts = layouts;
        if (compared % 3 == 0) shared.heldLayoutSteps = 0;
        const Evaluation got = evaluator.evaluate(*f.intent, size, shared);
        const std::string hinted =
            h.first ? fmt::format("{} first {}/{}ch/{}sl, cut {:.3f} us", what, core::toString(*h.first->protocol),
                                  h.first->channels, h.first->slices, h.pruneAboveUs)
                    : what;
        ASSERT_EQ(describe(got), describe(want)) << hinted;
        if (want.compiled && got.compiled) {
          EXPECT_TRUE(got.compiled->schedule == want.compiled->schedule) << hinted;
        }
        EXPECT_EQ(got.compiled.has_value(), want.compiled.has_value()) << hinted;
        ++compared;
        boundOnly += want.boundOnly ? 1 : 0;
        screened += want.screened ? 1 : 0;
      }
    }
    sharedLayouts += layouts->hits();
  }
  // Every path of the walk was taken: simulated winners, screening by the incumbent, bounds alone.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_GT(compared, 20);
#else
  (void)program;
  EXPECT_GT(compared, 400);
#endif
  EXPECT_GT(boundOnly, 2);
  EXPECT_GT(screened, 2);
  EXPECT_GT(sharedLayouts, 20u);  // options bounded from another evaluation's layout
  ::testing::Test::RecordProperty("compared", compared);
  ::testing::Test::RecordProperty("shared-layouts", static_cast<int>(sharedLayouts));
}

// An evaluation past its deadline starts nothing and says why; one whose deadline does not pass is the same as
// without one.
TEST(LayoutBound, AnEvaluationPastItsDeadlineEndsWithoutAResult) {
  auto topo = core::presetTopology("dgx-a100x2");
  ASSERT_TRUE(topo.ok());
  SimEvaluator evaluator(*topo, sim::SimParams{});
  for (const EmbeddedProgram& p : galleryPrograms()) {
    if (p.file != "allgather_hier_rail.ofl") continue;
    const Frontend f = parseAndExpand(p.text, p.file, *topo, {});
    ASSERT_TRUE(f.ok());
    EvalHint h;
    h.verify = false;
    const Evaluation free = evaluator.evaluate(*f.intent, 16 << 20, h);
    ASSERT_TRUE(free.ok) << free.error;
    h.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    const Evaluation late = evaluator.evaluate(*f.intent, 16 << 20, h);
    EXPECT_FALSE(late.ok);
    EXPECT_TRUE(late.outOfTime);
    EXPECT_EQ(late.error, "not evaluated: the time budget ran out");
    EXPECT_FALSE(late.compiled.has_value());
    h.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    const Evaluation inTime = evaluator.evaluate(*f.intent, 16 << 20, h);
    EXPECT_EQ(describe(inTime), describe(free));
    return;
  }
  FAIL() << "allgather_hier_rail.ofl is not in the gallery";
}

// An option that failed to lay out at one size of a candidate fails at every size (a layout does not depend on the
// size), so the other sizes take the failure from the shared LayoutBounds instead of compiling the option again:
// with every option recorded as failed, nothing is compiled and the evaluation reports the recorded error.
TEST(LayoutBound, AFailureSeenAtOneSizeIsNotCompiledAgain) {
  auto topo = core::presetTopology("dgx-a100x2");
  ASSERT_TRUE(topo.ok());
  const Frontend f = parseAndExpand(galleryPrograms().front().text, galleryPrograms().front().file, *topo, {});
  ASSERT_TRUE(f.ok()) << f.message;
  SimEvaluator evaluator(*topo, sim::SimParams{});
  const std::uint64_t size = 1 << 20;
  ASSERT_TRUE(evaluator.evaluate(*f.intent, size, EvalHint{}).ok);
  const auto layouts = std::make_shared<LayoutBounds>();
  const std::vector<compiler::CompileOptions> options = candidateOptions(*f.intent, size);
  ASSERT_FALSE(options.empty());
  for (const compiler::CompileOptions& o : options) layouts->insert(o, {sim::BoundCurve{}, "recorded failure"});
  for (bool incumbentFirst : {false, true}) {
    EvalHint h;
    h.layouts = layouts;
    if (incumbentFirst) h.first = options.back();
    const Evaluation e = evaluator.evaluate(*f.intent, size, h);
    EXPECT_FALSE(e.ok) << incumbentFirst;
    EXPECT_EQ(e.error, "recorded failure") << incumbentFirst;
  }
  EXPECT_EQ(layouts->hits(), 2 * options.size());
}

compiler::CompileOptions fixedOptions(core::Protocol protocol, int channels, int slices) {
  compiler::CompileOptions o;
  o.protocol = protocol;
  o.channels = channels;
  o.slices = slices;
  return o;
}

// Options that leave the protocol or the channels to the compiler are laid out by size, and a compile that ran out
// of memory says nothing about its option: neither is shared with the other sizes.
TEST(LayoutBound, SizeDependentOptionsAreNotShared) {
  LayoutBounds layouts;
  const compiler::CompileOptions fixed = fixedOptions(core::Protocol::Simple, 2, 2);
  compiler::CompileOptions noProtocol = fixed;
  noProtocol.protocol.reset();
  compiler::CompileOptions noChannels = fixed;
  noChannels.channels = 0;
  for (const compiler::CompileOptions& o : {fixed, noProtocol, noChannels}) layouts.insert(o, {sim::BoundCurve{}, "x"});
  EXPECT_TRUE(layouts.find(fixed).has_value());
  EXPECT_FALSE(layouts.find(noProtocol).has_value());
  EXPECT_FALSE(layouts.find(noChannels).has_value());
  EXPECT_EQ(layouts.size(), 1u);
  compiler::CompileOptions otherSize = fixed;
  otherSize.sizeBytes = 12345;
  EXPECT_TRUE(layouts.find(otherSize).has_value());
}

// A refusal does not depend on the protocol (LimitBounds.RefusalsDoNotDependOnProtocolOrSize): it is found for every
// protocol of its channels, slices and limits; a layout that compiled is not, nor a refusal under other limits.
TEST(LayoutBound, ARefusalServesEveryProtocolOfItsShape) {
  LayoutBounds layouts;
  const compiler::CompileOptions refused = fixedOptions(core::Protocol::LL, 2, 2);
  layouts.insert(refused, {sim::BoundCurve{}, "too many steps"});
  compiler::CompileOptions simple = refused;
  simple.protocol = core::Protocol::Simple;
  simple.sizeBytes = 1 << 30;
  const auto found = layouts.find(simple);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->error, "too many steps");
  compiler::CompileOptions otherLimits = simple;
  otherLimits.limits.maxStepsPerBlock = 4096;
  EXPECT_FALSE(layouts.find(otherLimits).has_value());
  compiler::CompileOptions otherSlices = simple;
  otherSlices.slices = 4;
  EXPECT_FALSE(layouts.find(otherSlices).has_value());

  layouts.insert(fixedOptions(core::Protocol::LL, 1, 1), {sim::BoundCurve{}, {}});
  EXPECT_FALSE(layouts.find(fixedOptions(core::Protocol::LL128, 1, 1)).has_value());
}

// A layout of a shape waits for one of the same shape under way, and then finds its refusal instead of laying the
// option out again.
TEST(LayoutBound, ALayoutWaitsForOneOfItsShapeUnderWay) {
  LayoutBounds layouts;
  const compiler::CompileOptions ll = fixedOptions(core::Protocol::LL, 1, 1);
  const compiler::CompileOptions simple = fixedOptions(core::Protocol::Simple, 1, 1);
  std::optional<LayoutBounds::Turn> first = layouts.turn(ll, 1);
  ASSERT_TRUE(first.has_value());
  std::optional<LayoutBounds::Entry> seen;
  std::thread other([&] {
    const auto second = layouts.turn(simple, 1);
    seen = layouts.find(simple);
  });
  // Give the other thread time to reach its turn (without the wait it would look before the refusal is in).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  layouts.insert(ll, {sim::BoundCurve{}, "refused"});
  first.reset();
  other.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->error, "refused");
  // Other shapes, and options that are not kept, do not wait while the hops under way stay within kHopsAtOnce; a
  // layout past it waits (here until its deadline) unless it is alone.
  std::optional<LayoutBounds::Turn> held = layouts.turn(ll, LayoutBounds::kHopsAtOnce / 2);
  ASSERT_TRUE(held.has_value());
  const compiler::CompileOptions twoChannels = fixedOptions(core::Protocol::Simple, 2, 1);
  EXPECT_TRUE(layouts.turn(twoChannels, LayoutBounds::kHopsAtOnce / 2).has_value());
  compiler::CompileOptions bySize = ll;
  bySize.protocol.reset();
  EXPECT_TRUE(layouts.turn(bySize, 1).has_value());
  const auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  EXPECT_FALSE(layouts.turn(twoChannels, LayoutBounds::kHopsAtOnce, soon).has_value());
  EXPECT_FALSE(layouts.turn(simple, 1, soon).has_value());  // the same shape as `held`
  held.reset();
  EXPECT_TRUE(layouts.turn(twoChannels, 4 * LayoutBounds::kHopsAtOnce, soon).has_value());  // alone
}

}  // namespace
}  // namespace optiflow::synth
