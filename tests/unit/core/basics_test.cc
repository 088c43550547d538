#include <gtest/gtest.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/error.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/units.h"

namespace optiflow::core {
namespace {

TEST(Collective, ParsesMscclAndOurSpellings) {
  EXPECT_EQ(parseCollective("reduce_scatter"), Collective::ReduceScatter);
  EXPECT_EQ(parseCollective("reducescatter"), Collective::ReduceScatter);
  EXPECT_EQ(parseCollective("AllGather"), Collective::AllGather);
  EXPECT_EQ(parseCollective("all-to-all"), Collective::AllToAll);
  EXPECT_FALSE(parseCollective("gather-ish").has_value());
  EXPECT_EQ(parseProtocol("LL128"), Protocol::LL128);
  EXPECT_FALSE(parseProtocol("LL64").has_value());
}

TEST(Collective, AllGatherInPlaceInputIsTheRanksSliceOfTheOutput) {
  Schedule s = fixtures::ringAllGather({.nRanks = 4, .channels = 2, .inPlace = true});
  EXPECT_EQ(validateShape(s), "");
  const Slot slot = resolveSlot(s, 3, BufferMode::InPlace, BufferKind::Input, 1);
  EXPECT_EQ(slot.buf, BufferKind::Output);
  EXPECT_EQ(slot.index, 7);
  EXPECT_EQ(resolveSlot(s, 3, BufferMode::OutOfPlace, BufferKind::Input, 1).buf, BufferKind::Input);
  EXPECT_EQ(physicalSizes(s, 0, BufferMode::InPlace).input, 0);
  EXPECT_EQ(physicalSizes(s, 0, BufferMode::InPlace).output, 8);
}

TEST(Collective, ReduceScatterPostconditionSumsTheRanksBlockFromEveryRank) {
  Schedule s = fixtures::ringReduceScatter({.nRanks = 4, .channels = 2});
  const Expected e = expectedOutput(s, 2, 1);
  ASSERT_TRUE(e.constrained);
  ASSERT_EQ(e.terms.size(), 4u);
  for (int src = 0; src < 4; ++src) EXPECT_EQ(e.terms[src], (Contribution{src, 2 * 2 + 1}));
}

TEST(Collective, AllToAllSendsBlockJToRankJ) {
  Schedule s;
  s.collective = Collective::AllToAll;
  s.nRanks = 4;
  s.chunksPerLoop = 8;
  s.ranks.resize(4);
  for (int r = 0; r < 4; ++r) s.ranks[r].rank = r;
  // Rank 1's output block 3 is rank 3's input block 1.
  const Expected e = expectedOutput(s, 1, 3 * 2 + 1);
  ASSERT_EQ(e.terms.size(), 1u);
  EXPECT_EQ(e.terms[0], (Contribution{3, 1 * 2 + 1}));
}

TEST(Collective, ShapeErrorsSayWhatIsWrong) {
  Schedule s = fixtures::ringAllGather({.nRanks = 4});
  s.chunksPerLoop = 6;
  EXPECT_NE(validateShape(s).find("not a multiple"), std::string::npos);
  s = fixtures::ringAllGather({.nRanks = 4});
  s.collective = Collective::Custom;
  s.customKind = "mystery";
  EXPECT_NE(validateShape(s).find("mystery"), std::string::npos);
  s.collective = Collective::Reduce;
  s.root = 9;
  EXPECT_NE(validateShape(s).find("root 9"), std::string::npos);
}

TEST(Collective, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::AllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Broadcast, 8), 1.0);
}

TEST(Fixtures, RingsHaveOneBlockPerChannelAndTheExpectedStepCounts) {
  for (int n : {1, 2, 3, 8}) {
    const Schedule ag = fixtures::ringAllGather({.nRanks = n, .channels = 3});
    const Schedule rs = fixtures::ringReduceScatter({.nRanks = n, .channels = 3});
    const Schedule ar = fixtures::ringAllReduce({.nRanks = n, .channels = 3});
    for (const Schedule* s : {&ag, &rs, &ar}) {
      EXPECT_EQ(validateShape(*s), "") << s->name;
      ASSERT_EQ(s->ranks.size(), static_cast<std::size_t>(n));
      EXPECT_EQ(s->ranks[0].threadBlocks.size(), 3u);
    }
    // Out-of-place ring AG: a local copy, then n-1 sends and n-1 receives folded into n steps.
    EXPECT_EQ(ag.ranks[0].threadBlocks[0].steps.size(), n == 1 ? 1u : static_cast<std::size_t>(n + 1));
    EXPECT_EQ(rs.ranks[0].threadBlocks[0].steps.size(), static_cast<std::size_t>(n == 1 ? 1 : n));
    EXPECT_EQ(ar.ranks[0].threadBlocks[0].steps.size(), static_cast<std::size_t>(n == 1 ? 1 : 2 * n - 1));
  }
}

TEST(Schedule, RecomputeHasDepMarksExactlyTheStepsWaitedOn) {
  Schedule s = fixtures::ringAllGather({.nRanks = 2, .channels = 2});
  s.ranks[0].threadBlocks[1].steps[1].deps.push_back({0, 1});
  recomputeHasDep(s);
  EXPECT_TRUE(s.ranks[0].threadBlocks[0].steps[1].hasDep);
  EXPECT_FALSE(s.ranks[0].threadBlocks[0].steps[0].hasDep);
  EXPECT_FALSE(s.ranks[1].threadBlocks[0].steps[1].hasDep);
}

TEST(Diagnostic, FormatsTheKnownParts) {
  EXPECT_EQ((Diagnostic{"a.toml", 3, 7, "expected an integer"}).str(), "a.toml:3:7: expected an integer");
  EXPECT_EQ((Diagnostic{"a.toml", 3, 0, "x"}).str(), "a.toml:3: x");
  EXPECT_EQ((Diagnostic{"", 0, 0, "x"}).str(), "x");
}

}  // namespace
}  // namespace optiflow::core

namespace optiflow::core {
namespace {

TEST(Units, ParsesSizesTheWayNcclTestsPrintsThem) {
  EXPECT_EQ(*parseSize("4096"), 4096u);
  EXPECT_EQ(*parseSize("64K"), 65536u);
  EXPECT_EQ(*parseSize("1MiB"), 1u << 20);
  EXPECT_EQ(*parseSize("1.5KiB"), 1536u);
  EXPECT_EQ(*parseSize(" 2GB "), 2ull << 30);
  EXPECT_FALSE(parseSize("1.3B").ok());
  EXPECT_FALSE(parseSize("12 parsecs").ok());
  EXPECT_FALSE(parseSize("-1").ok());
  EXPECT_NE(parseSize("1ZiB").error().message.find("unknown unit"), std::string::npos);
}

TEST(Units, SizeListsExpandRangesByFactor) {
  auto r = parseSizeList("1KiB:1MiB");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 11u);
  EXPECT_EQ(r->front(), 1024u);
  EXPECT_EQ(r->back(), 1u << 20);
  auto f = parseSizeList("1KiB:1MiB:4,8,8");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, (std::vector<std::uint64_t>{8, 1024, 4096, 16384, 65536, 262144, 1048576}));
  EXPECT_FALSE(parseSizeList("1MiB:1KiB").ok());
  EXPECT_FALSE(parseSizeList("1KiB:1MiB:1").ok());
  EXPECT_FALSE(parseSizeList("").ok());
}

TEST(Units, FormatsSizes) {
  EXPECT_EQ(formatSize(1000), "1000B");
  EXPECT_EQ(formatSize(1024), "1KiB");
  EXPECT_EQ(formatSize(1536), "1.5KiB");
  EXPECT_EQ(formatSize(1ull << 30), "1GiB");
  EXPECT_DOUBLE_EQ(gbps(1e6, 10), 100.0);
}

}  // namespace
}  // namespace optiflow::core
