// The synthesis loop (synth/loop.h): rounds of propose -> parse -> expand -> compile -> verify -> simulate, the best
// per size, the stop reasons, bad candidates, progress events and resuming. Small clusters and sizes only: the
// simulator is the expensive part.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/verifier.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/ast.h"
#include "optiflow/dsl/parser.h"
#include "optiflow/synth/builtin_proposer.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/loop.h"

namespace optiflow::synth {
namespace {

using Kind = ProgressEvent::Kind;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * 1024;

core::Topology loadPreset(std::string_view name) {
  auto t = core::presetTopology(name);
  if (!t) throw std::runtime_error(t.error().str());
  return std::move(t).value();
}

const core::Topology& dgxA100() {
  static const core::Topology topo = loadPreset("dgx-a100");
  return topo;
}

// One node of 6 GPUs on an NVSwitch: not a power of two, so recursive doubling does not apply.
const core::Topology& sixGpus() {
  static const core::Topology topo = [] {
    auto t = core::parseTopologyToml(R"(name = "six"
nodes = 1
gpus_per_node = 6
[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 300.0
latency_us = 0.7
)",
                                     "six.toml");
    if (!t) throw std::runtime_error(t.error().str());
    return std::move(t).value();
  }();
  return topo;
}

std::string galleryText(std::string_view file) {
  for (const EmbeddedProgram& g : galleryPrograms()) {
    if (g.file == file) return std::string(g.text);
  }
  ADD_FAILURE() << "no gallery program " << file;
  return {};
}

Candidate gallery(std::string_view file) { return {galleryText(file), fmt::format("gallery:{}", file)}; }
Candidate program(std::string text, std::string origin = "test") { return {std::move(text), std::move(origin)}; }

std::string canonical(std::string_view text) {
  auto parsed = dsl::parseProgram(text, "t.ofl");
  if (!parsed.ok()) return std::string(text);
  dsl::Program p = std::move(*parsed.program);
  p.name.clear();
  dsl::clearSourceLocs(p);
  return dsl::printProgram(p);
}

SynthConfig smallConfig(int rounds, int candidates) {
  SynthConfig c;
  c.collective = core::Collective::AllGather;
  c.sizes = {4 * kKiB, 1 * kMiB};
  c.rounds = rounds;
  c.candidatesPerRound = candidates;
  return c;
}

// What a proposer saw of one round.
struct SeenContext {
  int round = 0;
  int maxCandidates = 0;
  std::size_t historySize = 0;
  std::vector<int> bestPerSize;
};

// Hands out fixed batches, one per call, then nothing; remembers the contexts it was given.
class ScriptedProposer : public Proposer {
 public:
  explicit ScriptedProposer(std::vector<std::vector<Candidate>> batches) : batches_(std::move(batches)) {}
  std::string_view name() const override { return "scripted"; }
  std::vector<Candidate> propose(const ProposalContext& ctx) override {
    seen.push_back({ctx.round, ctx.maxCandidates, ctx.history.size(), ctx.bestPerSize});
    if (calls_ >= batches_.size()) return {};
    return batches_[calls_++];
  }
  std::vector<SeenContext> seen;

 private:
  std::vector<std::vector<Candidate>> batches_;
  std::size_t calls_ = 0;
};

// Wraps another proposer and checks the feedback it is given: every best points to an evaluated record.
class CheckingProposer : public Proposer {
 public:
  explicit CheckingProposer(Proposer& inner) : inner_(inner) {}
  std::string_view name() const override { return inner_.name(); }
  std::vector<Candidate> propose(const ProposalContext& ctx) override {
    seen.push_back({ctx.round, ctx.maxCandidates, ctx.history.size(), ctx.bestPerSize});
    EXPECT_EQ(ctx.bestPerSize.size(), ctx.sizes.size());
    for (std::size_t s = 0; s < ctx.bestPerSize.size(); ++s) {
      const int b = ctx.bestPerSize[s];
      if (b < 0) continue;
      EXPECT_LT(static_cast<std::size_t>(b), ctx.history.size());
      if (static_cast<std::size_t>(b) >= ctx.history.size()) continue;
      const CandidateRecord& r = ctx.history[static_cast<std::size_t>(b)];
      EXPECT_EQ(r.stage, "ok") << r.id;
      EXPECT_TRUE(s < r.sizes.size() && r.sizes[s].ok) << r.id << " at size " << s;
    }
    return inner_.propose(ctx);
  }
  std::vector<SeenContext> seen;

 private:
  Proposer& inner_;
};

// Counts evaluations (the loop calls evaluate from several threads); can be made slow, or blind to NCCL.
class CountingEvaluator : public Evaluator {
 public:
  CountingEvaluator(const core::Topology& topo, std::chrono::milliseconds delay = {}, bool timeNcclToo = true)
      : sim_(topo, {}), delay_(delay), timeNcclToo_(timeNcclToo) {}
  std::string_view name() const override { return "counting"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override {
    ++evaluations;
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    return sim_.evaluate(intent, sizeBytes, hint);
  }
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override {
    return timeNcclToo_ ? sim_.timeNccl(schedule, sizeBytes, params) : 0;
  }
  std::atomic<int> evaluations{0};

 private:
  SimEvaluator sim_;
  std::chrono::milliseconds delay_;
  bool timeNcclToo_;
};

const CandidateRecord* findByOrigin(const SynthResult& r, std::string_view origin) {
  for (const CandidateRecord& c : r.history) {
    if (c.origin == origin) return &c;
  }
  return nullptr;
}

// The checks every finished run must pass at every size where some candidate worked.
void expectConsistentBests(const core::Topology& topo, const SynthConfig& cfg, const SynthResult& res) {
  ASSERT_EQ(res.sizes.size(), cfg.sizes.size());
  for (std::size_t s = 0; s < res.sizes.size(); ++s) {
    const SizeBest& sb = res.sizes[s];
    SCOPED_TRACE(fmt::format("size {}", sb.sizeBytes));
    EXPECT_EQ(sb.sizeBytes, cfg.sizes[s]);
    EXPECT_GT(sb.boundUs, 0);
    EXPECT_GE(sb.effectiveBoundUs, sb.boundUs * (1 - 1e-9));
    ASSERT_GE(sb.best, 0);
    ASSERT_LT(static_cast<std::size_t>(sb.best), res.history.size());
    const CandidateRecord& r = res.history[static_cast<std::size_t>(sb.best)];
    EXPECT_EQ(r.stage, "ok");
    ASSERT_EQ(r.sizes.size(), cfg.sizes.size());
    EXPECT_TRUE(r.sizes[s].ok) << r.sizes[s].error;
    EXPECT_DOUBLE_EQ(r.sizes[s].timeUs, sb.bestUs);
    EXPECT_GE(sb.bestUs, sb.boundUs * (1 - 1e-9));
    EXPECT_FALSE(sb.config.empty());
    // The best is the fastest candidate that worked at this size.
    for (const CandidateRecord& c : res.history) {
      if (c.stage != "ok") continue;
      ASSERT_EQ(c.sizes.size(), cfg.sizes.size()) << c.id;
      if (!c.sizes[s].ok) continue;
      EXPECT_GE(c.sizes[s].timeUs, sb.bestUs * (1 - 1e-12)) << c.id;
      EXPECT_GE(c.sizes[s].timeUs, sb.boundUs * (1 - 1e-9)) << c.id;
      EXPECT_EQ(c.sizes[s].sizeBytes, sb.sizeBytes);
      EXPECT_DOUBLE_EQ(c.sizes[s].boundUs, sb.boundUs);
    }
    ASSERT_NE(sb.schedule, nullptr);
    EXPECT_EQ(sb.schedule->collective, cfg.collective);
    EXPECT_EQ(sb.schedule->nRanks, topo.nRanks());
    const compiler::VerifyReport report = compiler::verify(*sb.schedule);
    EXPECT_TRUE(report.proven) << (report.errors.empty() ? "" : report.errors.front().str());
  }
}

TEST(SynthLoop, FindsAProvenBestAtEverySizeNoSlowerThanRingOrNccl) {
  const SynthConfig cfg = smallConfig(2, 5);
  BuiltinProposer builtin(1);
  CheckingProposer proposer(builtin);
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.roundsRun, 2);
  EXPECT_EQ(res.stopReason, "round budget");
  EXPECT_GE(res.elapsedS, 0);
  ASSERT_EQ(res.history.size(), 10u);
  for (std::size_t i = 0; i < res.history.size(); ++i) {
    EXPECT_EQ(res.history[i].id, fmt::format("r{}c{}", i / 5, i % 5));
    EXPECT_EQ(res.history[i].round, static_cast<int>(i / 5));
  }
  expectConsistentBests(dgxA100(), cfg, res);
  // The proposer was asked for candidatesPerRound each round, with the whole history so far.
  ASSERT_EQ(proposer.seen.size(), 2u);
  EXPECT_EQ(proposer.seen[0].round, 0);
  EXPECT_EQ(proposer.seen[1].round, 1);
  EXPECT_EQ(proposer.seen[0].maxCandidates, 5);
  EXPECT_EQ(proposer.seen[0].historySize, 0u);
  EXPECT_EQ(proposer.seen[1].historySize, 5u);
  EXPECT_EQ(proposer.seen[0].bestPerSize, std::vector<int>(2, -1));
  for (int b : proposer.seen[1].bestPerSize) EXPECT_GE(b, 0);

  // Round 0 tried NCCL's ring among the gallery; the best is no slower than it, nor than NCCL's own choice (on
  // one NVSwitch node the direct program beats NCCL's ring at small sizes).
  const CandidateRecord* ring = findByOrigin(res, "gallery:allgather_ring.ofl");
  for (std::size_t s = 0; s < res.sizes.size(); ++s) {
    const SizeBest& sb = res.sizes[s];
    EXPECT_GT(sb.nccl.timeUs, 0);
    EXPECT_FALSE(sb.nccl.algorithm.empty());
    EXPECT_GT(sb.bestNative.timeUs, 0);
    EXPECT_LE(sb.bestNative.timeUs, sb.nccl.timeUs);
    EXPECT_LE(sb.bestUs, sb.nccl.timeUs) << sb.sizeBytes;
    if (ring != nullptr && ring->stage == "ok" && ring->sizes[s].ok) {
      EXPECT_LE(sb.bestUs, ring->sizes[s].timeUs);
    }
  }
  // Every candidate of the run records its verdict: evaluated ones per size, rejected ones with their errors.
  for (const CandidateRecord& r : res.history) {
    EXPECT_FALSE(r.origin.empty());
    EXPECT_FALSE(r.text.empty());
    if (r.stage == "ok") {
      EXPECT_FALSE(r.name.empty());
      EXPECT_TRUE(r.errors.empty());
    } else {
      EXPECT_TRUE(r.sizes.empty()) << r.id;
      EXPECT_FALSE(r.errors.empty()) << r.id;
    }
  }
}

TEST(SynthLoop, IsDeterministicForASeed) {
  const SynthConfig cfg = smallConfig(2, 4);
  auto once = [&] {
    BuiltinProposer proposer(5);
    SimEvaluator evaluator(dgxA100(), cfg.params);
    return runSynthesis(dgxA100(), cfg, proposer, evaluator);
  };
  const SynthResult a = once();
  const SynthResult b = once();
  ASSERT_EQ(a.history.size(), b.history.size());
  for (std::size_t i = 0; i < a.history.size(); ++i) {
    const CandidateRecord& x = a.history[i];
    const CandidateRecord& y = b.history[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.origin, y.origin);
    EXPECT_EQ(x.text, y.text);
    EXPECT_EQ(x.stage, y.stage);
    EXPECT_EQ(x.errors, y.errors);
    ASSERT_EQ(x.sizes.size(), y.sizes.size());
    for (std::size_t s = 0; s < x.sizes.size(); ++s) {
      EXPECT_EQ(x.sizes[s].ok, y.sizes[s].ok);
      EXPECT_DOUBLE_EQ(x.sizes[s].timeUs, y.sizes[s].timeUs) << x.id;
      EXPECT_EQ(x.sizes[s].config, y.sizes[s].config) << x.id;
    }
  }
  ASSERT_EQ(a.sizes.size(), b.sizes.size());
  for (std::size_t s = 0; s < a.sizes.size(); ++s) {
    EXPECT_EQ(a.sizes[s].best, b.sizes[s].best);
    EXPECT_DOUBLE_EQ(a.sizes[s].bestUs, b.sizes[s].bestUs);
    EXPECT_EQ(a.sizes[s].config, b.sizes[s].config);
    EXPECT_DOUBLE_EQ(a.sizes[s].nccl.timeUs, b.sizes[s].nccl.timeUs);
  }
  EXPECT_EQ(a.stopReason, b.stopReason);
  EXPECT_EQ(a.roundsRun, b.roundsRun);
}

// The built-in proposer, reading every time (so every screening simulation runs to its end).
class EveryTimeRead : public Proposer {
 public:
  explicit EveryTimeRead(std::uint64_t seed) : inner_(seed) {}
  std::string_view name() const override { return inner_.name(); }
  std::vector<Candidate> propose(const ProposalContext& c) override { return inner_.propose(c); }

 private:
  BuiltinProposer inner_;
};

// The built-in proposer reads the fastest few times at each size; a candidate screened above those stops its
// simulation early and records where it stopped, a lower bound. Against the same run with every time read, the
// candidates, the search and the bests are the same, and the only times that differ are stopped ones, each at most
// the full simulation's.
TEST(SynthLoop, ScreensStopOnlyAboveTheTimesTheProposerReads) {
  const core::Topology topo = loadPreset("dgx-a100x2");
  SynthConfig cfg;
  cfg.collective = core::Collective::AllReduce;
  cfg.sizes = {64 * kKiB, 4 * kMiB, 64 * kMiB};
  cfg.rounds = 3;
  cfg.threads = 2;
  BuiltinProposer stopping(3);
  SimEvaluator e1(topo, cfg.params);
  const SynthResult a = runSynthesis(topo, cfg, stopping, e1);
  EveryTimeRead reading(3);
  SimEvaluator e2(topo, cfg.params);
  const SynthResult b = runSynthesis(topo, cfg, reading, e2);
  ASSERT_EQ(a.history.size(), b.history.size());
  int stopped = 0;
  int same = 0;
  for (std::size_t i = 0; i < a.history.size(); ++i) {
    const CandidateRecord& x = a.history[i];
    const CandidateRecord& y = b.history[i];
    ASSERT_EQ(x.text, y.text) << x.id;
    ASSERT_EQ(x.stage, y.stage) << x.id;
    ASSERT_EQ(x.sizes.size(), y.sizes.size());
    for (std::size_t s = 0; s < x.sizes.size(); ++s) {
      const SizeResult& got = x.sizes[s];
      const SizeResult& full = y.sizes[s];
      ASSERT_EQ(got.ok, full.ok) << x.id;
      if (got.timeUs == full.timeUs && got.config == full.config) {
        ++same;
        continue;
      }
      ++stopped;
      const std::string what = fmt::format("{} at {}: {} ({}) against {} ({})", x.id, got.sizeBytes, got.timeUs,
                                           got.config, full.timeUs, full.config);
      EXPECT_NE(got.config.find("(screened: simulated up to time_us, a lower bound)"), std::string::npos) << what;
      EXPECT_NE(full.config.find("(screened)"), std::string::npos) << what;
      EXPECT_EQ(got.config.substr(0, got.config.find(' ')), full.config.substr(0, full.config.find(' '))) << what;
      EXPECT_LE(got.timeUs, full.timeUs) << what;
      // Past the screen's cutoff, 1.10x the best of its time.
      EXPECT_GT(got.timeUs, a.sizes[s].bestUs * 1.10) << what;
    }
  }
  ASSERT_EQ(a.sizes.size(), b.sizes.size());
  for (std::size_t s = 0; s < a.sizes.size(); ++s) {
    EXPECT_EQ(a.sizes[s].best, b.sizes[s].best);
    EXPECT_EQ(a.sizes[s].bestUs, b.sizes[s].bestUs);
    EXPECT_EQ(a.sizes[s].config, b.sizes[s].config);
  }
  EXPECT_GT(stopped, 10);
  EXPECT_GT(same, 10);
  ::testing::Test::RecordProperty("stopped", stopped);
  ::testing::Test::RecordProperty("same", same);
}

TEST(SynthLoop, StopsAtTheRoundBudget) {
  SynthConfig cfg = smallConfig(1, 8);
  ScriptedProposer proposer({{gallery("allgather_ring.ofl")}, {gallery("allgather_direct.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.stopReason, "round budget");
  EXPECT_EQ(res.roundsRun, 1);
  ASSERT_EQ(res.history.size(), 1u);
  EXPECT_EQ(proposer.seen.size(), 1u);
  EXPECT_EQ(proposer.seen[0].maxCandidates, 8);
  expectConsistentBests(dgxA100(), cfg, res);
}

// Sizes a candidate wins with the same schedule hold one copy of it (on 1024 GPUs recursive doubling's LL schedule
// wins six sizes); different schedules stay apart.
TEST(SynthLoop, SizesWonWithTheSameScheduleShareOneCopy) {
  SynthConfig cfg = smallConfig(1, 8);
  cfg.sizes = {1 * kKiB, 2 * kKiB, 4 * kKiB, 1 * kMiB, 64 * kMiB};
  ScriptedProposer proposer({{gallery("allgather_ring.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  expectConsistentBests(dgxA100(), cfg, res);
  std::set<const core::Schedule*> copies;
  int equalPairs = 0;
  int differentPairs = 0;
  for (std::size_t a = 0; a < res.sizes.size(); ++a) {
    copies.insert(res.sizes[a].schedule.get());
    for (std::size_t b = a + 1; b < res.sizes.size(); ++b) {
      const bool equal = *res.sizes[a].schedule == *res.sizes[b].schedule;
      (equal ? equalPairs : differentPairs) += 1;
      EXPECT_EQ(equal, res.sizes[a].schedule == res.sizes[b].schedule) << a << " " << b;
    }
  }
  // The run must exercise both: LL at the small sizes (one schedule), other options at the large ones.
  EXPECT_GT(equalPairs, 0);
  EXPECT_GT(differentPairs, 0);
  EXPECT_LT(copies.size(), res.sizes.size());
}

TEST(SynthLoop, ConvergesWhenARoundBringsNoGain) {
  SynthConfig cfg = smallConfig(5, 8);
  cfg.patience = 1;
  ScriptedProposer proposer({{gallery("allgather_ring.ofl")},
                             {program("allgather ring_renamed\n  allgather all by ring\n")},
                             {gallery("allgather_direct.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.stopReason, "converged");
  EXPECT_EQ(res.roundsRun, 2);
  ASSERT_EQ(res.history.size(), 2u);
  EXPECT_EQ(res.history[0].stage, "ok");
  EXPECT_EQ(res.history[1].stage, "duplicate");
  EXPECT_EQ(res.history[1].name, "ring_renamed");
  EXPECT_FALSE(res.history[1].errors.empty());
  EXPECT_TRUE(res.history[1].sizes.empty());
  EXPECT_EQ(proposer.seen.size(), 2u);
  for (const SizeBest& sb : res.sizes) EXPECT_EQ(sb.best, 0);
}

TEST(SynthLoop, AGainResetsThePatience) {
  // patience 2: round 1 is stale, round 2 gains (direct beats ring at 4KiB on NVSwitch), rounds 3 and 4 are
  // stale again: converged after 5 rounds.
  SynthConfig cfg = smallConfig(10, 8);
  cfg.patience = 2;
  ScriptedProposer proposer({{gallery("allgather_ring.ofl")},
                             {program("allgather ring_a\n  allgather all by ring\n")},
                             {gallery("allgather_direct.ofl")},
                             {program("allgather ring_b\n  allgather all by ring\n")},
                             {program("allgather direct_b\n  allgather all by direct\n")},
                             {gallery("allgather_bruck.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  ASSERT_EQ(res.history.size(), 5u);
  ASSERT_EQ(res.history[2].stage, "ok");
  ASSERT_TRUE(res.history[2].sizes[0].ok);
  ASSERT_LT(res.history[2].sizes[0].timeUs, res.history[0].sizes[0].timeUs * (1 - cfg.minGain))
      << "direct no longer beats ring at 4KiB on dgx-a100: pick another gaining program for this test";
  EXPECT_EQ(res.stopReason, "converged");
  EXPECT_EQ(res.roundsRun, 5);
  EXPECT_EQ(res.sizes[0].best, 2);
}

TEST(SynthLoop, StopsWhenTheProposerHasNothingNew) {
  const SynthConfig cfg = smallConfig(4, 8);
  ScriptedProposer proposer({});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  std::vector<Kind> events;
  const SynthResult res =
      runSynthesis(dgxA100(), cfg, proposer, evaluator, [&](const ProgressEvent& e) { events.push_back(e.kind); });
  EXPECT_EQ(res.stopReason, "the proposer has nothing new");
  EXPECT_EQ(res.roundsRun, 0);
  EXPECT_TRUE(res.history.empty());
  EXPECT_EQ(proposer.seen.size(), 1u);
  EXPECT_EQ(events, std::vector<Kind>{Kind::Baselines});
  // The baselines are there even without a candidate.
  ASSERT_EQ(res.sizes.size(), 2u);
  for (const SizeBest& sb : res.sizes) {
    EXPECT_GT(sb.boundUs, 0);
    EXPECT_GT(sb.nccl.timeUs, sb.boundUs);
    EXPECT_EQ(sb.best, -1);
    EXPECT_EQ(sb.schedule, nullptr);
  }
}

TEST(SynthLoop, StopsAtATinyTimeBudgetBeforeProposing) {
  SynthConfig cfg = smallConfig(4, 8);
  cfg.timeBudgetS = 1e-9;
  ScriptedProposer proposer({{gallery("allgather_ring.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.stopReason, "time budget");
  EXPECT_EQ(res.roundsRun, 0);
  EXPECT_TRUE(res.history.empty());
  EXPECT_TRUE(proposer.seen.empty());
  for (const SizeBest& sb : res.sizes) EXPECT_EQ(sb.best, -1);
}

TEST(SynthLoop, StopsStartingCandidatesWhenTheTimeBudgetRunsOutMidRound) {
  // Every evaluation takes at least 300 ms and the budget is 500 ms: at most two of the five candidates start.
  SynthConfig cfg = smallConfig(4, 8);
  cfg.timeBudgetS = 0.5;
  ScriptedProposer proposer(
      {{gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl"), gallery("allgather_bruck.ofl"),
        gallery("allgather_recursive_doubling.ofl"), gallery("allgather_ring_bidir.ofl")}});
  CountingEvaluator evaluator(dgxA100(), std::chrono::milliseconds(300), /*timeNcclToo=*/false);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.stopReason, "time budget");
  EXPECT_LE(res.history.size(), 2u);
  EXPECT_EQ(res.roundsRun, res.history.empty() ? 0 : 1);
  EXPECT_LE(proposer.seen.size(), 1u);
}

// Waits past the deadline it is given before evaluating: at the largest size (as a candidate that takes longer than
// the budget on a large cluster would), or at every size of the programs with one name (a candidate slow to
// evaluate among fast ones).
// Overruns the deadline of every evaluation of `slowSize` or of `slowProgram` (with `once`, only the first one of
// each size), and notes each evaluation's deadline.
class OverrunningEvaluator : public Evaluator {
 public:
  OverrunningEvaluator(const core::Topology& topo, std::uint64_t slowSize, std::string slowProgram = {},
                       bool once = false)
      : sim_(topo, {}), slowSize_(slowSize), slowProgram_(std::move(slowProgram)), once_(once) {}
  std::string_view name() const override { return "overrunning"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override {
    bool slow = (sizeBytes == slowSize_ || intent.name == slowProgram_) && hint.deadline;
    if (slow) {
      const std::lock_guard lock(mutex_);
      shares_[intent.name].push_back(
          {std::chrono::duration<double>(*hint.deadline - std::chrono::steady_clock::now()).count(), *hint.deadline});
      if (once_) slow = overrun_.insert(sizeBytes).second;
    }
    if (slow) std::this_thread::sleep_until(*hint.deadline + std::chrono::milliseconds(20));
    return sim_.evaluate(intent, sizeBytes, hint);
  }
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override {
    return sim_.timeNccl(schedule, sizeBytes, params);
  }
  struct Share {
    double leftS = 0;                                // seconds to the deadline when the evaluation started
    std::chrono::steady_clock::time_point deadline;  // the evaluation's
  };
  // Per program, in the order its evaluations started.
  std::map<std::string, std::vector<Share>> shares() const {
    const std::lock_guard lock(mutex_);
    return shares_;
  }

 private:
  SimEvaluator sim_;
  std::uint64_t slowSize_;
  std::string slowProgram_;
  bool once_;
  mutable std::mutex mutex_;
  std::set<std::uint64_t> overrun_;
  std::map<std::string, std::vector<Share>> shares_;
};

// The time budget bounds the run, not only when candidates start: an evaluation under way when it runs out stops,
// its size is recorded as not evaluated (no best from it), and no other candidate starts. Of two candidates the
// first had half the budget (then its share ran out), the second the rest (then the budget ran out).
TEST(SynthLoop, AnEvaluationUnderWayStopsWhenTheTimeBudgetRunsOut) {
  SynthConfig cfg = smallConfig(4, 8);
  cfg.timeBudgetS = 3.0;  // the baselines of one DGX take milliseconds, also under the sanitizers
  ScriptedProposer proposer({{gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")}});
  OverrunningEvaluator evaluator(dgxA100(), cfg.sizes.back());
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  EXPECT_EQ(res.stopReason, "time budget");
  ASSERT_EQ(res.history.size(), 2u);
  const SizeResult& first = res.history[0].sizes.back();
  EXPECT_FALSE(first.ok);
  EXPECT_THAT(first.error, ::testing::StartsWith("not evaluated: its share of the time budget ran out ("));
  EXPECT_THAT(first.error, ::testing::EndsWith(" s, 1/2 of what was left)"));
  const SizeResult& last = res.history[1].sizes.back();
  EXPECT_FALSE(last.ok);
  EXPECT_EQ(last.error, "not evaluated: the time budget ran out");
  EXPECT_EQ(res.sizes.back().best, -1);
  EXPECT_EQ(res.sizes.back().schedule, nullptr);
}

// A candidate that is slow to evaluate gets its share of the budget and no more: the ones after it are evaluated
// in full within the rest, and it gets what they leave at the round's end. Without the shares the slow first
// candidate would use the whole budget.
TEST(SynthLoop, ASlowCandidateLeavesTheOthersTheirShareOfTheTimeBudget) {
  SynthConfig cfg = smallConfig(1, 8);
  cfg.timeBudgetS = 6.0;  // 2 s for the slow one; ring and direct on one DGX take well under a second each
  ScriptedProposer proposer(
      {{gallery("allgather_bruck.ofl"), gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")}});
  OverrunningEvaluator evaluator(dgxA100(), 0, "bruck");
  const auto started = std::chrono::steady_clock::now();
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  ASSERT_EQ(res.history.size(), 3u);
  EXPECT_EQ(res.history[0].name, "bruck");
  for (const SizeResult& sr : res.history[0].sizes) {
    EXPECT_FALSE(sr.ok);
    EXPECT_EQ(sr.error, "not evaluated: the time budget ran out");  // its second turn, the last of the round
  }
  for (std::size_t c = 1; c < 3; ++c) {
    for (const SizeResult& sr : res.history[c].sizes) EXPECT_TRUE(sr.ok) << res.history[c].name << ": " << sr.error;
  }
  for (const SizeBest& sb : res.sizes) EXPECT_GE(sb.best, 1);
  // Its first turn had a third of the budget, at most; its second what ring and direct left: the rest, up to the
  // budget's end (which is after `started` + 6 s, however long the others took).
  const auto shares = evaluator.shares().at("bruck");
  ASSERT_EQ(shares.size(), 2 * cfg.sizes.size());
  for (std::size_t i = 0; i < cfg.sizes.size(); ++i) EXPECT_LE(shares[i].leftS, 2.0);
  for (std::size_t i = cfg.sizes.size(); i < shares.size(); ++i) {
    EXPECT_GE(shares[i].deadline, started + std::chrono::seconds(6));
  }
}

// The sizes a candidate's share did not cover are evaluated once the round's other candidates are, with the
// budget they left. Its record is announced (and written to the history) once, complete, in round order.
TEST(SynthLoop, ACandidateCutShortIsEvaluatedAgainWithWhatTheRoundLeaves) {
  SynthConfig cfg = smallConfig(4, 8);
  cfg.timeBudgetS = 9.0;  // 3 s for bruck's first turn, every size of which overruns it
  ScriptedProposer proposer(
      {{gallery("allgather_bruck.ofl"), gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")}});
  OverrunningEvaluator evaluator(dgxA100(), 0, "bruck", true);
  std::vector<std::pair<int, bool>> announced;  // (index, every size evaluated)
  const auto progress = [&](const ProgressEvent& e) {
    if (e.kind != ProgressEvent::Kind::Candidate) return;
    const bool complete =
        std::all_of(e.record->sizes.begin(), e.record->sizes.end(), [](const SizeResult& sr) { return sr.ok; });
    announced.emplace_back(e.index, complete);
  };
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator, progress);
  ASSERT_EQ(res.history.size(), 3u);
  for (const CandidateRecord& r : res.history) {
    for (const SizeResult& sr : r.sizes) EXPECT_TRUE(sr.ok) << r.name << ": " << sr.error;
  }
  EXPECT_EQ(evaluator.shares().at("bruck").size(), 2 * cfg.sizes.size());
  EXPECT_EQ(announced, (std::vector<std::pair<int, bool>>{{0, true}, {1, true}, {2, true}}));
  // The same bests as without a budget: bruck's sizes were evaluated against the same incumbents' times.
  SynthConfig unbounded = smallConfig(4, 8);
  ScriptedProposer again(
      {{gallery("allgather_bruck.ofl"), gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")}});
  SimEvaluator sim(dgxA100(), unbounded.params);
  const SynthResult ref = runSynthesis(dgxA100(), unbounded, again, sim);
  for (std::size_t s = 0; s < res.sizes.size(); ++s) EXPECT_DOUBLE_EQ(res.sizes[s].bestUs, ref.sizes[s].bestUs);
}

TEST(SynthLoop, RecordsBadCandidatesWithTheirErrorsAndGoesOn) {
  SynthConfig cfg = smallConfig(1, 8);
  ScriptedProposer proposer({{
      program("allgather broken\n  allgather all by rign\n"),            // r0c0: syntax
      gallery("reducescatter_ring.ofl"),                                 // r0c1: another collective
      program("allgather rd\n  allgather all by recursive_doubling\n"),  // r0c2: 6 ranks, not a power of two
      gallery("allgather_ring.ofl"),                                     // r0c3: fine
      program("allgather ring_again\n\n  allgather all by ring\n"),      // r0c4: r0c3 renamed
      gallery("allgather_direct.ofl"),                                   // r0c5: fine
  }});
  SimEvaluator evaluator(sixGpus(), cfg.params);
  const SynthResult res = runSynthesis(sixGpus(), cfg, proposer, evaluator);
  ASSERT_EQ(res.history.size(), 6u);
  const std::vector<std::string> stages = {"parse", "expand", "expand", "ok", "duplicate", "ok"};
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const CandidateRecord& r = res.history[i];
    EXPECT_EQ(r.stage, stages[i]) << r.id << ": " << r.errors;
    if (r.stage != "ok") {
      EXPECT_TRUE(r.sizes.empty()) << r.id;
      EXPECT_FALSE(r.errors.empty()) << r.id;
    }
  }
  const std::regex located(R"(r0c\d\.ofl:\d+:\d+: )");
  // Syntax: file:line:column, the message, the source line and a caret; no name, since it did not parse.
  const CandidateRecord& syntax = res.history[0];
  EXPECT_TRUE(std::regex_search(syntax.errors, std::regex(R"(r0c0\.ofl:2:\d+: )"))) << syntax.errors;
  EXPECT_NE(syntax.errors.find("rign"), std::string::npos) << syntax.errors;
  EXPECT_NE(syntax.errors.find('^'), std::string::npos) << syntax.errors;
  EXPECT_TRUE(syntax.name.empty());
  // Another collective: named, located, and saying what the run wants.
  const CandidateRecord& other = res.history[1];
  EXPECT_TRUE(std::regex_search(other.errors, located)) << other.errors;
  EXPECT_NE(other.errors.find("r0c1.ofl:1:1"), std::string::npos) << other.errors;
  EXPECT_NE(other.errors.find("reducescatter"), std::string::npos) << other.errors;
  EXPECT_NE(other.errors.find("allgather"), std::string::npos) << other.errors;
  EXPECT_EQ(other.name, "ring");
  // Expansion: the group is 6 ranks.
  const CandidateRecord& rd = res.history[2];
  EXPECT_TRUE(std::regex_search(rd.errors, std::regex(R"(r0c2\.ofl:2:\d+: )"))) << rd.errors;
  EXPECT_NE(rd.errors.find("power-of-two"), std::string::npos) << rd.errors;
  EXPECT_NE(rd.errors.find("6 members"), std::string::npos) << rd.errors;
  EXPECT_EQ(rd.name, "rd");
  EXPECT_EQ(res.history[4].name, "ring_again");
  // The loop went on: the good programs were evaluated and one of them leads every size.
  for (std::size_t s = 0; s < res.sizes.size(); ++s) {
    EXPECT_TRUE(res.sizes[s].best == 3 || res.sizes[s].best == 5) << res.sizes[s].best;
  }
  expectConsistentBests(sixGpus(), cfg, res);
}

TEST(SynthLoop, ReportsProgressInOrder) {
  SynthConfig cfg = smallConfig(3, 8);
  cfg.patience = 0;  // never converged
  ScriptedProposer proposer({{gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")},
                             {program("allgather ring_again\n  allgather all by ring\n")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  struct Seen {
    Kind kind;
    int round;
    int index;
    int count;
    std::string id;
    std::size_t historySize;
  };
  std::vector<Seen> events;
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator, [&](const ProgressEvent& e) {
    ASSERT_NE(e.result, nullptr);
    if (e.kind == Kind::Baselines) {
      EXPECT_EQ(e.result->sizes.size(), 2u);
      for (const SizeBest& sb : e.result->sizes) EXPECT_GT(sb.boundUs, 0);
    }
    if (e.kind == Kind::Candidate) {
      ASSERT_NE(e.record, nullptr);
      EXPECT_EQ(e.record, &e.result->history.back());
    }
    events.push_back({e.kind, e.round, e.index, e.count, e.record ? e.record->id : "", e.result->history.size()});
  });
  EXPECT_EQ(res.stopReason, "the proposer has nothing new");
  EXPECT_EQ(res.roundsRun, 2);
  const std::vector<Seen> expected = {
      {Kind::Baselines, 0, 0, 0, "", 0},     {Kind::RoundStart, 0, 0, 2, "", 0}, {Kind::Candidate, 0, 0, 2, "r0c0", 1},
      {Kind::Candidate, 0, 1, 2, "r0c1", 2}, {Kind::RoundEnd, 0, 2, 2, "", 2},   {Kind::RoundStart, 1, 0, 1, "", 2},
      {Kind::Candidate, 1, 0, 1, "r1c0", 3}, {Kind::RoundEnd, 1, 1, 1, "", 3},
  };
  ASSERT_EQ(events.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(fmt::format("event {}", i));
    EXPECT_EQ(events[i].kind, expected[i].kind);
    EXPECT_EQ(events[i].round, expected[i].round);
    EXPECT_EQ(events[i].count, expected[i].count);
    EXPECT_EQ(events[i].id, expected[i].id);
    EXPECT_EQ(events[i].historySize, expected[i].historySize);
    if (events[i].kind == Kind::Candidate) {
      EXPECT_EQ(events[i].index, expected[i].index);
    }
  }
}

TEST(SynthLoop, ResumeDoesNotEvaluateTheEarlierProgramsAgainAndKeepsTheBests) {
  // Run 1: one round of the built-in proposer. Run 2: one more round, resumed from run 1's history.
  SynthConfig first = smallConfig(1, 4);
  BuiltinProposer p1(1);
  SimEvaluator e1(dgxA100(), first.params);
  const SynthResult r1 = runSynthesis(dgxA100(), first, p1, e1);
  ASSERT_EQ(r1.history.size(), 4u);
  expectConsistentBests(dgxA100(), first, r1);

  SynthConfig second = smallConfig(1, 4);
  second.resume = r1.history;
  BuiltinProposer p2(1);
  CountingEvaluator e2(dgxA100());
  const SynthResult r2 = runSynthesis(dgxA100(), second, p2, e2);
  ASSERT_GT(r2.history.size(), r1.history.size());
  for (std::size_t i = 0; i < r1.history.size(); ++i) {
    EXPECT_EQ(r2.history[i].id, r1.history[i].id);
    EXPECT_EQ(r2.history[i].text, r1.history[i].text);
    EXPECT_EQ(r2.history[i].stage, r1.history[i].stage);
  }
  std::set<std::string> earlier;
  for (const CandidateRecord& r : r1.history) earlier.insert(canonical(r.text));
  int newOk = 0;
  for (std::size_t i = r1.history.size(); i < r2.history.size(); ++i) {
    const CandidateRecord& r = r2.history[i];
    EXPECT_EQ(r.round, 1) << r.id;
    EXPECT_EQ(r.id.rfind("r1c", 0), 0u) << r.id;
    EXPECT_EQ(earlier.count(canonical(r.text)), 0u) << r.id << " repeats an earlier program";
    newOk += r.stage == "ok" ? 1 : 0;
  }
  EXPECT_EQ(r2.roundsRun, 1);
  // Evaluations: the earlier leaders once per size (for their schedules), then only the new candidates.
  std::set<int> leaders;
  for (const SizeBest& sb : r1.sizes) leaders.insert(sb.best);
  const int n = static_cast<int>(second.sizes.size());
  EXPECT_EQ(e2.evaluations.load(), static_cast<int>(leaders.size()) * n + newOk * n);
  // The bests are kept (the same times where an earlier candidate still leads) and have schedules.
  for (std::size_t s = 0; s < r2.sizes.size(); ++s) {
    EXPECT_LE(r2.sizes[s].bestUs, r1.sizes[s].bestUs * (1 + 1e-12));
    if (r2.sizes[s].best >= 0 && static_cast<std::size_t>(r2.sizes[s].best) < r1.history.size()) {
      EXPECT_EQ(r2.sizes[s].best, r1.sizes[s].best);
      EXPECT_DOUBLE_EQ(r2.sizes[s].bestUs, r1.sizes[s].bestUs);
    }
  }
  expectConsistentBests(dgxA100(), second, r2);

  // Resuming is continuing: the same as one uninterrupted run of two rounds.
  SynthConfig both = smallConfig(2, 4);
  BuiltinProposer p3(1);
  SimEvaluator e3(dgxA100(), both.params);
  const SynthResult r3 = runSynthesis(dgxA100(), both, p3, e3);
  ASSERT_EQ(r3.history.size(), r2.history.size());
  for (std::size_t i = 0; i < r3.history.size(); ++i) {
    EXPECT_EQ(r3.history[i].text, r2.history[i].text) << i;
    EXPECT_EQ(r3.history[i].stage, r2.history[i].stage) << i;
    for (std::size_t s = 0; s < r3.history[i].sizes.size() && s < r2.history[i].sizes.size(); ++s) {
      EXPECT_DOUBLE_EQ(r3.history[i].sizes[s].timeUs, r2.history[i].sizes[s].timeUs) << i;
    }
  }
  for (std::size_t s = 0; s < r3.sizes.size(); ++s) {
    EXPECT_EQ(r3.sizes[s].best, r2.sizes[s].best);
    EXPECT_DOUBLE_EQ(r3.sizes[s].bestUs, r2.sizes[s].bestUs);
  }
}

TEST(SynthLoop, ResumedProgramsAreDuplicatesWhenProposedAgain) {
  SynthConfig first = smallConfig(1, 8);
  ScriptedProposer p1({{gallery("allgather_ring.ofl"), gallery("allgather_direct.ofl")}});
  SimEvaluator e1(dgxA100(), first.params);
  const SynthResult r1 = runSynthesis(dgxA100(), first, p1, e1);
  ASSERT_EQ(r1.history.size(), 2u);

  SynthConfig second = smallConfig(1, 8);
  second.resume = r1.history;
  ScriptedProposer p2(
      {{program("allgather ring_once_more\n  allgather all by ring\n"), gallery("allgather_bruck.ofl")}});
  CountingEvaluator e2(dgxA100());
  const SynthResult r2 = runSynthesis(dgxA100(), second, p2, e2);
  ASSERT_EQ(r2.history.size(), 4u);
  EXPECT_EQ(r2.history[2].id, "r1c0");
  EXPECT_EQ(r2.history[2].stage, "duplicate");
  EXPECT_EQ(r2.history[3].id, "r1c1");
  EXPECT_EQ(r2.history[3].stage, "ok");
  // The proposer saw the resumed history and the bests it holds.
  ASSERT_EQ(p2.seen.size(), 1u);
  EXPECT_EQ(p2.seen[0].round, 1);
  EXPECT_EQ(p2.seen[0].historySize, 2u);
  for (std::size_t s = 0; s < r1.sizes.size(); ++s) EXPECT_EQ(p2.seen[0].bestPerSize[s], r1.sizes[s].best);
  std::set<int> leaders;
  for (const SizeBest& sb : r1.sizes) leaders.insert(sb.best);
  const int n = static_cast<int>(second.sizes.size());
  EXPECT_EQ(e2.evaluations.load(), static_cast<int>(leaders.size()) * n + n);  // bruck only, besides the leaders
  expectConsistentBests(dgxA100(), second, r2);
}

// An evaluator that measures like the hardware one, without hardware: the simulator screens, and each round's
// "measurement" is a function of the schedule (or a failure), so the test knows every measured time.
class FakeMeasuringEvaluator : public Evaluator {
 public:
  FakeMeasuringEvaluator(const core::Topology& topo,
                         std::function<RoundMeasurement(const std::vector<MeasureItem>&)> fn)
      : sim_(topo, {}), fn_(std::move(fn)) {}
  std::string_view name() const override { return "fake-hardware"; }
  Evaluation evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) override {
    return sim_.evaluate(intent, sizeBytes, hint);
  }
  double timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) override {
    return sim_.timeNccl(schedule, sizeBytes, params);
  }
  bool measuresRounds() const override { return true; }
  RoundMeasurement measureRound(int round, const std::vector<MeasureItem>& items) override {
    rounds.push_back(round);
    batches.push_back(items.size());
    return fn_(items);
  }
  std::vector<int> rounds;
  std::vector<std::size_t> batches;

 private:
  SimEvaluator sim_;
  std::function<RoundMeasurement(const std::vector<MeasureItem>&)> fn_;
};

// A measured time that reverses the simulator's order: more steps, faster (so the winner must change).
double fakeMeasured(const MeasureItem& it) { return 1e6 / static_cast<double>(core::totalSteps(it.schedule) + 1); }

TEST(SynthLoop, MeasuredTimesReplaceSimulatedOnesAndRankAboveThem) {
  const SynthConfig cfg = smallConfig(2, 4);
  BuiltinProposer proposer(1);
  FakeMeasuringEvaluator ev(dgxA100(), [](const std::vector<MeasureItem>& items) {
    RoundMeasurement m;
    for (const MeasureItem& it : items) {
      m.timeUs.push_back(fakeMeasured(it));
      m.itemErrors.emplace_back();
    }
    return m;
  });
  std::vector<std::string> announced;
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, ev, [&](const ProgressEvent& e) {
    if (e.kind == ProgressEvent::Kind::Candidate) {
      // Announced once measured: an ok record is already marked one way or the other.
      announced.push_back(e.record->id);
      for (const SizeResult& sr : e.record->sizes) {
        if (e.record->stage == "ok" && sr.ok && sr.config.find("screened") == std::string::npos) {
          EXPECT_TRUE(sr.measured || !sr.measureError.empty()) << e.record->id;
        }
      }
    }
  });
  EXPECT_EQ(ev.rounds, (std::vector<int>{0, 1}));
  EXPECT_EQ(res.roundsMeasured, 2);
  ASSERT_EQ(res.measurementNotes.size(), 2u);
  EXPECT_NE(res.measurementNotes[0].find("round 0: measured"), std::string::npos) << res.measurementNotes[0];
  EXPECT_EQ(announced.size(), res.history.size());
  int measured = 0;
  for (std::size_t s = 0; s < cfg.sizes.size(); ++s) {
    const SizeBest& sb = res.sizes[s];
    ASSERT_GE(sb.best, 0);
    EXPECT_TRUE(sb.measured);
    const SizeResult& won = res.history[static_cast<std::size_t>(sb.best)].sizes[s];
    EXPECT_TRUE(won.measured);
    EXPECT_DOUBLE_EQ(won.timeUs, sb.bestUs);
    EXPECT_DOUBLE_EQ(won.simulatedUs, sb.simulatedUs);
    ASSERT_NE(sb.schedule, nullptr);
    EXPECT_DOUBLE_EQ(sb.bestUs, 1e6 / static_cast<double>(core::totalSteps(*sb.schedule) + 1));
    EXPECT_TRUE(compiler::verify(*sb.schedule).proven);
    for (const CandidateRecord& c : res.history) {
      if (c.stage != "ok" || !c.sizes[s].measured) continue;
      ++measured;
      EXPECT_GT(c.sizes[s].simulatedUs, 0);
      EXPECT_GE(c.sizes[s].timeUs, sb.bestUs * (1 - 1e-12)) << c.id;  // the best is the fastest measured
    }
  }
  EXPECT_GT(measured, 2);
}

TEST(SynthLoop, AFailedMeasurementKeepsTheSimulatorsTimesMarkedSo) {
  const SynthConfig cfg = smallConfig(2, 3);
  BuiltinProposer proposer(1);
  int calls = 0;
  FakeMeasuringEvaluator ev(dgxA100(), [&](const std::vector<MeasureItem>& items) {
    RoundMeasurement m;
    if (calls++ == 0) {
      m.error = "the launcher exited with status 3";
      return m;
    }
    // Round 1: every item but the first measured.
    for (std::size_t i = 0; i < items.size(); ++i) {
      m.timeUs.push_back(i == 0 ? std::optional<double>() : std::optional<double>(fakeMeasured(items[i])));
      m.itemErrors.push_back(i == 0 ? "optiflow-bench: hang" : "");
    }
    return m;
  });
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, ev);
  EXPECT_EQ(res.roundsRun, 2);
  EXPECT_EQ(res.roundsMeasured, 1);
  ASSERT_EQ(res.measurementNotes.size(), 2u);
  EXPECT_NE(res.measurementNotes[0].find("no measurement (the launcher exited with status 3)"), std::string::npos)
      << res.measurementNotes[0];
  bool sawRoundError = false;
  bool sawItemError = false;
  for (const CandidateRecord& c : res.history) {
    for (const SizeResult& sr : c.sizes) {
      if (c.round == 0 && sr.ok) {
        EXPECT_FALSE(sr.measured);
        sawRoundError |= sr.measureError == "the launcher exited with status 3";
      }
      sawItemError |= sr.measureError == "optiflow-bench: hang";
    }
  }
  EXPECT_TRUE(sawRoundError);
  EXPECT_TRUE(sawItemError);
  for (const SizeBest& sb : res.sizes) EXPECT_GE(sb.best, 0);
}

TEST(SynthLoop, BroadcastKeepsTheRoot) {
  SynthConfig cfg = smallConfig(1, 8);
  cfg.collective = core::Collective::Broadcast;
  cfg.root = 3;
  ScriptedProposer proposer({{gallery("broadcast_tree.ofl"), gallery("broadcast_chain.ofl")}});
  SimEvaluator evaluator(dgxA100(), cfg.params);
  const SynthResult res = runSynthesis(dgxA100(), cfg, proposer, evaluator);
  expectConsistentBests(dgxA100(), cfg, res);
  for (const SizeBest& sb : res.sizes) {
    ASSERT_NE(sb.schedule, nullptr);
    EXPECT_EQ(sb.schedule->root, 3);
  }
}

}  // namespace
}  // namespace optiflow::synth
