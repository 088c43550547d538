// Schedule IR -> MSCCL++ plan: every export re-imports from its JSON and is proven, and runs with real bytes (the
// round trip is the oracle). Ring fixtures of each collective at 1 and 2 nodes, both buffer modes, Simple and LL.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/mscclpp_export.h"
#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/bounds.h"

namespace {

namespace mpp = optiflow::compiler::mscclpp;
namespace fx = optiflow::core::fixtures;
using optiflow::core::BufferMode;
using optiflow::core::Collective;
using optiflow::core::Protocol;
using optiflow::core::Schedule;

std::string errors(const optiflow::compiler::VerifyReport& r) {
  std::string out;
  for (const auto& f : r.errors) out += f.str() + "\n";
  return out;
}

// Export, write, read back, prove and run: what every exported plan must pass.
mpp::Plan roundTrip(const Schedule& s, const mpp::ExportOptions& o, int* splits = nullptr) {
  auto exported = mpp::exportPlan(s, o);
  EXPECT_TRUE(exported.ok()) << (exported.ok() ? "" : exported.error().str());
  if (!exported.ok()) return {};
  if (splits) *splits = exported->splitBlocks;
  const std::string text = mpp::writeMscclppPlan(exported->plan);
  EXPECT_TRUE(mpp::looksLikeMscclppPlan(text));
  auto back = mpp::parseMscclppPlan(text, "exported.json");
  EXPECT_TRUE(back.ok()) << (back.ok() ? "" : back.error().str());
  if (!back.ok()) return {};
  EXPECT_TRUE(*back == exported->plan);
  const auto proof = mpp::verifyPlan(*back);
  EXPECT_TRUE(proof.proven) << errors(proof);
  EXPECT_TRUE(mpp::checkPlanLimits(*back).empty());
  const auto run = mpp::runPlan(*back);
  EXPECT_TRUE(run.passed) << fmt::format("{}", fmt::join(run.firstMismatches, "\n"));
  return *back;
}

mpp::ExportOptions perNode(int ranks) {
  mpp::ExportOptions o;
  o.ranksPerNode = ranks;
  return o;
}

Schedule ring(Collective c, int ranks, int channels, bool inPlace, Protocol p) {
  fx::RingOptions o{.nRanks = ranks, .channels = channels, .inPlace = inPlace, .protocol = p};
  switch (c) {
    case Collective::AllGather:
      return fx::ringAllGather(o);
    case Collective::ReduceScatter:
      return fx::ringReduceScatter(o);
    default:
      return fx::ringAllReduce(o);
  }
}

int count(const mpp::Plan& p, mpp::ChannelType t) {
  int n = 0;
  for (const auto& g : p.gpus)
    for (const auto& c : g.channels) n += c.type == t ? 1 : 0;
  return n;
}

int countOps(const mpp::Plan& p, mpp::OpType t) {
  int n = 0;
  for (const auto& g : p.gpus)
    for (const auto& tb : g.threadBlocks)
      for (const auto& op : tb.ops) n += op.type == t ? 1 : 0;
  return n;
}

TEST(MscclppExport, RingFixturesRoundTripAtOneAndTwoNodes) {
  for (auto c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
    for (bool inPlace : {false, true}) {
      for (int channels : {1, 2}) {
        for (int ranksPerNode : {0, 2}) {
          SCOPED_TRACE(fmt::format("{} inPlace={} channels={} perNode={}", optiflow::core::toString(c), inPlace,
                                   channels, ranksPerNode));
          const auto plan = roundTrip(ring(c, 4, channels, inPlace, Protocol::Simple), perNode(ranksPerNode));
          EXPECT_EQ(plan.inPlace, inPlace);
          EXPECT_EQ(plan.protocol, Protocol::Simple);
          if (ranksPerNode == 2) {
            EXPECT_GT(count(plan, mpp::ChannelType::Port), 0);
            EXPECT_GT(countOps(plan, mpp::OpType::PutWithSignalAndFlush), 0);
          } else {
            EXPECT_EQ(count(plan, mpp::ChannelType::Port), 0);
          }
          if (c != Collective::AllGather && ranksPerNode == 0) {
            EXPECT_GT(countOps(plan, mpp::OpType::ReduceSend), 0);  // fused reduce + put
          }
        }
      }
    }
  }
}

TEST(MscclppExport, LlSchedulesUsePackets) {
  for (auto c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
    SCOPED_TRACE(optiflow::core::toString(c));
    const auto plan = roundTrip(ring(c, 4, 1, false, Protocol::LL), {});
    if (c == Collective::AllGather) {
      EXPECT_EQ(plan.protocol, Protocol::LL);
      EXPECT_GT(countOps(plan, mpp::OpType::PutPackets), 0);
      EXPECT_GT(countOps(plan, mpp::OpType::UnpackPackets), 0);
      EXPECT_EQ(countOps(plan, mpp::OpType::Signal), 0);
    }
  }
  // Between nodes the LL schedule falls back to Simple operations, and says so.
  auto twoNodes = mpp::exportPlan(ring(Collective::AllGather, 4, 1, false, Protocol::LL), perNode(2));
  ASSERT_TRUE(twoNodes.ok());
  EXPECT_EQ(twoNodes->plan.protocol, Protocol::Simple);
  ASSERT_FALSE(twoNodes->notes.empty());
  EXPECT_NE(twoNodes->notes.front().find("port channels"), std::string::npos);
}

TEST(MscclppExport, LongBlocksAreSplitUnderTheOperationLimit) {
  int splits = 0;
  const auto plan = roundTrip(ring(Collective::AllReduce, 16, 1, false, Protocol::Simple), {}, &splits);
  EXPECT_GT(splits, 0);
  EXPECT_GT(countOps(plan, mpp::OpType::SemAcquire), 0);
  for (const auto& g : plan.gpus)
    for (const auto& tb : g.threadBlocks) EXPECT_LE(tb.ops.size(), 64U);
}

TEST(MscclppExport, RefusesWhatAPlanCannotSay) {
  auto bcast = fx::emptySchedule(Collective::Broadcast, 4, 4, false);
  auto r = mpp::exportPlan(bcast, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("carries no root"), std::string::npos) << r.error().message;

  auto inPlaceOnly = ring(Collective::AllGather, 4, 1, true, Protocol::Simple);
  mpp::ExportOptions outOfPlace;
  outOfPlace.mode = BufferMode::OutOfPlace;
  auto m = mpp::exportPlan(inPlaceOnly, outOfPlace);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("out-of-place"), std::string::npos) << m.error().message;

  auto broken = ring(Collective::AllGather, 4, 1, false, Protocol::Simple);
  broken.ranks[1].threadBlocks[0].steps.pop_back();
  auto b = mpp::exportPlan(broken, {});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("not proven"), std::string::npos) << b.error().message;
  // A caller that says the schedule is proven skips that proof, not the plan's: a wrong promise exports nothing.
  mpp::ExportOptions trusted;
  trusted.scheduleProven = true;
  auto t = mpp::exportPlan(broken, trusted);
  ASSERT_FALSE(t.ok());
  auto good = mpp::exportPlan(ring(Collective::AllGather, 4, 1, false, Protocol::Simple), trusted);
  EXPECT_TRUE(good.ok()) << good.error().message;

  auto odd = mpp::exportPlan(ring(Collective::AllGather, 4, 1, false, Protocol::Simple), perNode(3));
  ASSERT_FALSE(odd.ok());
}

TEST(MscclppExport, SizeRangeAndNameCarryOver) {
  auto s = ring(Collective::AllReduce, 4, 1, false, Protocol::Simple);
  s.minBytes = 1024;
  s.maxBytes = 0;
  mpp::ExportOptions named;
  named.name = "ar4";
  const auto plan = roundTrip(s, named);
  EXPECT_EQ(plan.name, "ar4");
  EXPECT_EQ(plan.minMessageSize, 1024U);
  EXPECT_EQ(plan.maxMessageSize, UINT64_MAX);
  EXPECT_EQ(plan.collectiveName, "allreduce");
}

}  // namespace

namespace {

// Predicted times of plans: deterministic model outputs (no clock), never below the lower bound, growing with the
// size, and slower across nodes than inside one.
TEST(MscclppTiming, PlansAreTimedAboveTheBound) {
  auto one = optiflow::core::loadTopology("dgx-a100");
  auto two = optiflow::core::loadTopology("dgx-a100x2");
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(two.ok());
  for (auto c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
    SCOPED_TRACE(optiflow::core::toString(c));
    auto inNode = mpp::exportPlan(ring(c, 8, 2, false, Protocol::Simple), {});
    ASSERT_TRUE(inNode.ok()) << inNode.error().str();
    auto twoNodes = mpp::exportPlan(ring(c, 16, 2, false, Protocol::Simple), perNode(8));
    ASSERT_TRUE(twoNodes.ok()) << twoNodes.error().str();
    const optiflow::sim::BoundModel bound1(*one);
    double last = 0;
    for (std::uint64_t size : {std::uint64_t{4} << 10, std::uint64_t{1} << 20, std::uint64_t{256} << 20}) {
      const auto t = mpp::timePlan(inNode->plan, *one, size);
      ASSERT_TRUE(t.ok) << t.error;
      EXPECT_GE(t.timeUs, bound1.bound(c, size).timeUs);
      EXPECT_GT(t.timeUs, last);
      last = t.timeUs;
    }
    const auto far = mpp::timePlan(twoNodes->plan, *two, std::uint64_t{256} << 20);
    ASSERT_TRUE(far.ok) << far.error;
    EXPECT_GT(far.timeUs, last);
    EXPECT_GE(far.timeUs, optiflow::sim::BoundModel(*two).bound(c, std::uint64_t{256} << 20).timeUs);
    const auto wrong = mpp::timePlan(inNode->plan, *two, 1024);
    EXPECT_FALSE(wrong.ok);
    EXPECT_NE(wrong.error.find("16 GPUs"), std::string::npos) << wrong.error;
  }
}

// LL plans pay no signal latency but twice the bytes: faster than Simple when small, slower when large.
TEST(MscclppTiming, PacketsTradeLatencyForBandwidth) {
  auto topo = optiflow::core::loadTopology("dgx-a100");
  ASSERT_TRUE(topo.ok());
  auto ll = mpp::exportPlan(ring(Collective::AllGather, 8, 1, false, Protocol::LL), {});
  auto simple = mpp::exportPlan(ring(Collective::AllGather, 8, 1, false, Protocol::Simple), {});
  ASSERT_TRUE(ll.ok() && simple.ok());
  ASSERT_EQ(ll->plan.protocol, Protocol::LL);
  EXPECT_LT(mpp::timePlan(ll->plan, *topo, 4096).timeUs, mpp::timePlan(simple->plan, *topo, 4096).timeUs);
  EXPECT_GT(mpp::timePlan(ll->plan, *topo, std::uint64_t{1} << 30).timeUs,
            mpp::timePlan(simple->plan, *topo, std::uint64_t{1} << 30).timeUs);
}

}  // namespace
