// rankByMeasurements: measured times outrank predicted ones, NCCL's own choice is found through the tuner's record,
// and a configuration measured slower than NCCL's own choice is never the published decision.
#include "optiflow/daemon/ranking.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace optiflow::daemon {
namespace {

using core::Algorithm;
using core::Collective;
using core::Protocol;

constexpr std::uint64_t kComm = 0x1234;
constexpr std::uint64_t kSize = 1 << 20;

synth::NativeChoice native(const char* algo, const char* proto, int channels, double us) {
  synth::NativeChoice n;
  n.algorithm = algo;
  n.protocol = proto;
  n.channels = channels;
  n.timeUs = us;
  return n;
}

// One collective, one entry at 1 MiB serving [512 KiB, 2 MiB), decision Ring/LL128/4ch predicted at 30 us.
synth::PlanFile onePlan() {
  synth::PlanFile p;
  synth::PlanCollective c;
  c.collective = Collective::AllGather;
  c.ranks = 8;
  c.nodes = 1;
  synth::PlanEntry e;
  e.sizeBytes = kSize;
  e.minBytes = kSize / 2;
  e.maxBytes = 2 * kSize - 1;
  e.boundUs = 20;
  e.nccl = native("Ring", "Simple", 8, 45);
  e.native = native("Ring", "LL128", 4, 30);
  c.entries.push_back(e);
  p.collectives.push_back(c);
  return p;
}

MeasuredRow row(Algorithm a, Protocol p, std::uint32_t channels, double medianUs, std::uint64_t calls = 10,
                std::uint64_t size = kSize, std::uint32_t nRanks = 8) {
  MeasuredRow r;
  r.m.commId = kComm;
  r.m.coll = Collective::AllGather;
  r.m.sizeBytes = size;
  r.m.algorithm = a;
  r.m.protocol = p;
  r.m.channels = channels;
  r.m.calls = calls;
  r.m.medianUs = medianUs;
  r.nRanks = nRanks;
  r.nNodes = 1;
  return r;
}

schedcache::NcclChoice ownChoice(Algorithm a, Protocol p, std::uint64_t size = kSize) {
  schedcache::NcclChoice c;
  c.commId = kComm;
  c.coll = Collective::AllGather;
  c.sizeBytes = size;
  c.algorithm = a;
  c.protocol = p;
  c.calls = 20;
  return c;
}

TEST(Ranking, NothingMeasuredKeepsThePredictionAndAddsTrials) {
  synth::PlanFile plan = onePlan();
  const auto ranked = rankByMeasurements(plan, {}, {}, RankOptions{});
  ASSERT_EQ(ranked.size(), 1u);
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_FALSE(e.native->measured);
  EXPECT_EQ(e.native->timeUs, 30);
  ASSERT_EQ(e.trials.size(), 2u);
  EXPECT_TRUE(e.trials[0].algorithm.empty());  // NCCL's own choice first
  EXPECT_EQ(e.trials[1].algorithm, "Ring");
  EXPECT_EQ(e.trials[1].protocol, "LL128");
  EXPECT_EQ(e.trials[1].channels, 4);
  EXPECT_EQ(e.trialCalls, 10);
  EXPECT_TRUE(ranked[0].trials);
  EXPECT_FALSE(ranked[0].afterUs);
  EXPECT_EQ(formatRanking(ranked), "");  // nothing measured: no table
}

TEST(Ranking, TrialsOffWithZeroCalls) {
  synth::PlanFile plan = onePlan();
  RankOptions o;
  o.trialCalls = 0;
  rankByMeasurements(plan, {}, {}, o);
  EXPECT_TRUE(plan.collectives[0].entries[0].trials.empty());
}

TEST(Ranking, MeasuredFasterThanNcclsOwnIsPublishedAsMeasured) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::LL128, 4, 28),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_TRUE(e.native->measured);
  EXPECT_DOUBLE_EQ(e.native->timeUs, 28);
  EXPECT_DOUBLE_EQ(e.native->simulatedUs, 30);
  EXPECT_EQ(e.native->channels, 4);
  ASSERT_TRUE(e.nccl);
  EXPECT_TRUE(e.nccl->measured);
  EXPECT_DOUBLE_EQ(e.nccl->timeUs, 40);
  EXPECT_EQ(e.nccl->channels, 16);  // what NCCL ran, not the simulator's guess
  EXPECT_DOUBLE_EQ(e.nccl->simulatedUs, 45);
  EXPECT_TRUE(e.trials.empty());  // both measured: the trials are over
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_EQ(ranked[0].ncclConfig, "Ring/Simple/16ch");
  EXPECT_TRUE(ranked[0].refused.empty());
  EXPECT_NE(formatRanking(ranked).find("Ring/LL128/4ch"), std::string::npos);
}

TEST(Ranking, MeasuredLoserIsNeverPublished) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::LL128, 4, 55),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  EXPECT_FALSE(e.native);  // NCCL decides
  ASSERT_TRUE(e.nccl);
  EXPECT_TRUE(e.nccl->measured);
  EXPECT_TRUE(e.trials.empty());
  EXPECT_EQ(ranked[0].after, "NCCL's own");
  ASSERT_EQ(ranked[0].refused.size(), 1u);
  EXPECT_NE(ranked[0].refused[0].find("Ring/LL128/4ch"), std::string::npos);
}

TEST(Ranking, AnotherMeasuredConfigurationOutranksAnUnmeasuredPrediction) {
  synth::PlanFile plan = onePlan();
  // The decision was never measured; a Tree/LL configuration (from an earlier plan's trials) was, below NCCL's own.
  const std::vector<MeasuredRow> rows = {row(Algorithm::Tree, Protocol::LL, 2, 33),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_EQ(e.native->algorithm, "Tree");
  EXPECT_EQ(e.native->protocol, "LL");
  EXPECT_EQ(e.native->channels, 2);
  EXPECT_TRUE(e.native->measured);
  EXPECT_DOUBLE_EQ(e.native->simulatedUs, 0);  // the simulator never timed this one for the plan
}

TEST(Ranking, UnmeasuredDecisionKeepsItsTrialsWhileNothingBeatsNcclsOwn) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_FALSE(e.native->measured);
  EXPECT_EQ(e.native->algorithm, "Ring");
  EXPECT_EQ(e.trials.size(), 2u);
  EXPECT_TRUE(e.nccl->measured);
  EXPECT_FALSE(ranked[0].afterUs);
}

TEST(Ranking, WithoutNcclsOwnTheDecisionStandsMeasured) {
  synth::PlanFile plan = onePlan();
  // No choice record (an older tuner): nothing tells which row is NCCL's own, so nothing is refused.
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::LL128, 4, 60),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  rankByMeasurements(plan, rows, {}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_TRUE(e.native->measured);
  EXPECT_DOUBLE_EQ(e.native->timeUs, 60);
  EXPECT_EQ(e.trials.size(), 2u);  // NCCL's own still to be measured
}

TEST(Ranking, TooFewCallsAreNotAMeasurement) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::LL128, 4, 99, 2),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40, 2)};
  rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_FALSE(e.native->measured);
  EXPECT_FALSE(e.nccl->measured);
}

TEST(Ranking, ChannelsThePlanSetAreNotNcclsOwn) {
  synth::PlanFile plan = onePlan();
  plan.collectives[0].entries[0].native = native("Ring", "Simple", 4, 30);  // NCCL's algorithm, fewer channels
  std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::Simple, 4, 35),
                                   row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  rows[0].forced = true;  // the plan the communicator used set 4 channels (joinMeasurements)
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  EXPECT_EQ(ranked[0].ncclConfig, "Ring/Simple/16ch");
  EXPECT_DOUBLE_EQ(*ranked[0].ncclUs, 40);
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  ASSERT_TRUE(e.native);
  EXPECT_EQ(e.native->channels, 4);
  EXPECT_DOUBLE_EQ(e.native->timeUs, 35);
}

TEST(Ranking, OtherShapesAndSizesOutsideTheRangeAreIgnored) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::LL128, 4, 1, 10, kSize, 16),
                                         row(Algorithm::Ring, Protocol::LL128, 4, 1, 10, 4 * kSize),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 40, 10, kSize, 16)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  EXPECT_EQ(ranked[0].measuredBytes, 0u);
  EXPECT_FALSE(plan.collectives[0].entries[0].native->measured);
}

TEST(Ranking, TheMeasuredSizeClosestToTheEntryRanksIt) {
  synth::PlanFile plan = onePlan();
  // At 1.5 MiB the decision loses; at 0.9 MiB (closer to 1 MiB in octaves) it wins: the closer size decides.
  const std::uint64_t near = kSize * 9 / 10;
  const std::uint64_t far = kSize * 3 / 2;
  const std::vector<MeasuredRow> rows = {
      row(Algorithm::Ring, Protocol::LL128, 4, 25, 10, near), row(Algorithm::Ring, Protocol::Simple, 16, 40, 10, near),
      row(Algorithm::Ring, Protocol::LL128, 4, 90, 10, far), row(Algorithm::Ring, Protocol::Simple, 16, 40, 10, far)};
  const auto ranked = rankByMeasurements(
      plan, rows,
      {ownChoice(Algorithm::Ring, Protocol::Simple, near), ownChoice(Algorithm::Ring, Protocol::Simple, far)},
      RankOptions{});
  EXPECT_EQ(ranked[0].measuredBytes, near);
  ASSERT_TRUE(plan.collectives[0].entries[0].native);
  EXPECT_DOUBLE_EQ(plan.collectives[0].entries[0].native->timeUs, 25);
}

TEST(Ranking, ADecisionLeavingChannelsToNcclIsJudgedOnAllItsRows) {
  synth::PlanFile plan = onePlan();
  plan.collectives[0].entries[0].native = native("Tree", "LL", 0, 30);
  // Few fast calls at 2 channels, many slow ones at 4: together the decision is slower than NCCL's own.
  const std::vector<MeasuredRow> rows = {row(Algorithm::Tree, Protocol::LL, 2, 10, 5),
                                         row(Algorithm::Tree, Protocol::LL, 4, 100, 100),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 50)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  EXPECT_FALSE(plan.collectives[0].entries[0].native) << "a decision measured slower than NCCL's own was published";
  ASSERT_EQ(ranked[0].refused.size(), 1u);
  EXPECT_NE(ranked[0].refused[0].find("Tree/LL"), std::string::npos);
}

TEST(Ranking, NcclsOwnOverSeveralChannelCountsDoesNotBeatItself) {
  synth::PlanFile plan = onePlan();
  const std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::Simple, 8, 38),
                                         row(Algorithm::Ring, Protocol::Simple, 16, 42)};
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  EXPECT_TRUE(ranked[0].refused.empty());
  ASSERT_TRUE(e.native);
  EXPECT_EQ(e.native->protocol, "LL128");  // the unmeasured decision keeps its trials
  EXPECT_FALSE(e.native->measured);
  EXPECT_EQ(e.trials.size(), 2u);
  EXPECT_DOUBLE_EQ(*ranked[0].ncclUs, 40);
}

TEST(Ranking, ADecisionThatIsNcclsOwnConfigurationEndsItsTrials) {
  synth::PlanFile plan = onePlan();
  plan.collectives[0].entries[0].native = native("Ring", "Simple", 16, 30);
  // NCCL's own choice is Ring/Simple on 16 channels too: every row is in the record the plan's 16 channels forced.
  std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::Simple, 16, 40)};
  rows[0].forced = true;
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  const synth::PlanEntry& e = plan.collectives[0].entries[0];
  EXPECT_TRUE(e.trials.empty());
  EXPECT_FALSE(e.native);  // the same configuration as NCCL's own: NCCL decides
  EXPECT_TRUE(e.nccl->measured);
  EXPECT_TRUE(ranked[0].refused.empty());
}

TEST(Ranking, OnlyCommunicatorsWhoseOwnChoiceItIsCountAsNcclsOwn) {
  synth::PlanFile plan = onePlan();
  // Communicator 2's NCCL chose Tree/LL; its Ring/Simple rows are not NCCL's own choice.
  std::vector<MeasuredRow> rows = {row(Algorithm::Ring, Protocol::Simple, 16, 40),
                                   row(Algorithm::Ring, Protocol::Simple, 16, 400)};
  rows[1].m.commId = 2;
  const auto ranked = rankByMeasurements(plan, rows, {ownChoice(Algorithm::Ring, Protocol::Simple)}, RankOptions{});
  EXPECT_DOUBLE_EQ(*ranked[0].ncclUs, 40);
}

}  // namespace
}  // namespace optiflow::daemon
