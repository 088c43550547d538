#include "optiflow/compiler/verifier.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/msccl_xml.h"
#include "optiflow/core/fixtures.h"

namespace {

using optiflow::compiler::Finding;
using optiflow::compiler::Property;
using optiflow::compiler::Severity;
using optiflow::compiler::verify;
using optiflow::compiler::VerifyReport;
using optiflow::core::BufferKind;
using optiflow::core::BufferMode;
using optiflow::core::Collective;
using optiflow::core::Schedule;
using optiflow::core::Step;
using optiflow::core::StepOp;
using optiflow::core::StepRef;
using optiflow::core::ThreadBlock;
namespace fx = optiflow::core::fixtures;

constexpr auto I = BufferKind::Input;
constexpr auto O = BufferKind::Output;
constexpr auto S = BufferKind::Scratch;
constexpr int kAny = -2;

std::string dump(const VerifyReport& r) {
  std::string out = fmt::format("proven={} steps={} transfers={}\n", r.proven, r.steps, r.transfers);
  for (const auto& f : r.errors) out += "  error: " + f.str() + "\n";
  for (const auto& f : r.warnings) out += "  warning: " + f.str() + "\n";
  return out;
}

// The first error with property p, or nullptr.
const Finding* findError(const VerifyReport& r, Property p) {
  for (const auto& f : r.errors) {
    if (f.property == p) return &f;
  }
  return nullptr;
}

// Asserts the report's FIRST error has property p at (rank, tb, step) (kAny matches anything).
void expectFirstError(const VerifyReport& r, Property p, int rank, int tb, int step) {
  ASSERT_FALSE(r.proven) << dump(r);
  ASSERT_FALSE(r.errors.empty()) << dump(r);
  const Finding& f = r.errors.front();
  EXPECT_EQ(f.property, p) << dump(r);
  if (rank != kAny) {
    EXPECT_EQ(f.rank, rank) << dump(r);
  }
  if (tb != kAny) {
    EXPECT_EQ(f.tb, tb) << dump(r);
  }
  if (step != kAny) {
    EXPECT_EQ(f.step, step) << dump(r);
  }
}

// Asserts some error has property p at (rank, tb, step).
void expectSomeError(const VerifyReport& r, Property p, int rank, int tb, int step) {
  ASSERT_FALSE(r.proven) << dump(r);
  for (const auto& f : r.errors) {
    if (f.property == p && (rank == kAny || f.rank == rank) && (tb == kAny || f.tb == tb) &&
        (step == kAny || f.step == step)) {
      return;
    }
  }
  ADD_FAILURE() << "no [" << optiflow::compiler::toString(p) << "] error at rank " << rank << " tb " << tb << " step "
                << step << "\n"
                << dump(r);
}

fx::RingOptions ring(int n, int ch = 1, bool inPlace = false) {
  fx::RingOptions o;
  o.nRanks = n;
  o.channels = ch;
  o.inPlace = inPlace;
  return o;
}

// ---- the fixtures are proven -------------------------------------------------------------------------------------

TEST(Verifier, RingFixturesAreProven) {
  for (const int n : {1, 2, 3, 4, 7, 8, 16, 64}) {
    for (int ch = 1; ch <= 4; ++ch) {
      for (const bool inPlace : {false, true}) {
        const auto o = ring(n, ch, inPlace);
        for (const Schedule& s : {fx::ringAllGather(o), fx::ringReduceScatter(o), fx::ringAllReduce(o)}) {
          const VerifyReport r = verify(s);
          EXPECT_TRUE(r.proven) << s.name << "\n" << dump(r);
          EXPECT_TRUE(r.warnings.empty()) << s.name << "\n" << dump(r);
          ASSERT_EQ(r.modesChecked.size(), 1u);
          EXPECT_EQ(r.modesChecked.front(), inPlace ? BufferMode::InPlace : BufferMode::OutOfPlace);
          EXPECT_EQ(r.steps, optiflow::core::totalSteps(s));
        }
      }
    }
  }
}

TEST(Verifier, RingCountsTransfers) {
  const VerifyReport r = verify(fx::ringAllReduce(ring(4, 2)));
  ASSERT_TRUE(r.proven) << dump(r);
  EXPECT_EQ(r.transfers, 4u * 2u * 2u * 3u);  // ranks x channels x (2 phases x (n-1) hops)
}

TEST(Verifier, RingClaimingBothModesIsCheckedInBoth) {
  // The out-of-place ring All-Reduce never writes its input, so it is also correct in place.
  Schedule s = fx::ringAllReduce(ring(4, 2));
  s.inPlace = true;
  const VerifyReport r = verify(s);
  EXPECT_TRUE(r.proven) << dump(r);
  EXPECT_EQ(r.modesChecked.size(), 2u);
  // The out-of-place All-Gather copies input -> its own output slice: in place that is a copy onto itself, fine.
  Schedule ag = fx::ringAllGather(ring(4));
  ag.inPlace = true;
  EXPECT_TRUE(verify(ag).proven) << dump(verify(ag));
}

TEST(Verifier, FindingStringNamesLocationModeAndProperty) {
  Finding f;
  f.property = Property::Race;
  f.mode = BufferMode::InPlace;
  f.rank = 3;
  f.tb = 1;
  f.step = 4;
  f.message = "boom";
  EXPECT_EQ(f.str(), "rank 3 tb 1 step 4 (in-place): [race] boom");
  f.tb = -1;
  f.step = -1;
  EXPECT_EQ(f.str(), "rank 3 (in-place): [race] boom");
  f.rank = -1;
  EXPECT_EQ(f.str(), "(in-place): [race] boom");
}

// ---- mutations of the rings --------------------------------------------------------------------------------------

TEST(VerifierMutation, DroppedCopyLeavesChunkMissing) {
  Schedule s = fx::ringAllGather(ring(4));
  auto& steps = s.ranks[1].threadBlocks[0].steps;
  ASSERT_EQ(steps[0].op, StepOp::Copy);
  steps.erase(steps.begin());
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Postcondition, 1, -1, -1);  // never written
  EXPECT_EQ(r.errors.size(), 1u) << dump(r);
  EXPECT_NE(r.errors.front().message.find("missing (rank 1, chunk 0)"), std::string::npos) << dump(r);
}

TEST(VerifierMutation, ChangedReceiveOffsetLandsDataWrong) {
  Schedule s = fx::ringAllGather(ring(4));
  // Rank 2's final recv gets rank 3's chunk; write it over chunk 0 instead of chunk 3.
  auto& last = s.ranks[2].threadBlocks[0].steps.back();
  ASSERT_EQ(last.op, StepOp::Recv);
  last.dstOff = 0;
  const VerifyReport r = verify(s);
  ASSERT_FALSE(r.proven);
  // Chunk 0 now holds rank 3's data (extra/missing) and chunk 3 was never written.
  expectSomeError(r, Property::Postcondition, 2, 0, static_cast<int>(s.ranks[2].threadBlocks[0].steps.size()) - 1);
  expectSomeError(r, Property::Postcondition, 2, -1, -1);
}

TEST(VerifierMutation, SwappedReceiveOffsets) {
  Schedule s = fx::ringAllGather(ring(5));
  auto& steps = s.ranks[3].threadBlocks[0].steps;  // copy, send, rcs x3, recv
  ASSERT_EQ(steps[2].op, StepOp::RecvCopySend);
  ASSERT_EQ(steps[3].op, StepOp::RecvCopySend);
  std::swap(steps[2].dstOff, steps[3].dstOff);
  std::swap(steps[2].srcOff, steps[3].srcOff);
  const VerifyReport r = verify(s);
  // rcs forwards what it received, so only rank 3's own output is wrong: two postcondition errors.
  ASSERT_EQ(r.errors.size(), 2u) << dump(r);
  expectSomeError(r, Property::Postcondition, 3, 0, 2);
  expectSomeError(r, Property::Postcondition, 3, 0, 3);
}

TEST(VerifierMutation, SwappedReceiveOrderWithDifferentCounts) {
  // Rank 0 sends 2 chunks then 1; rank 1 receives 1 then 2.
  Schedule s = fx::emptySchedule(Collective::Broadcast, 2, 3, false);
  s.ranks[0].threadBlocks.push_back(
      fx::makeBlock(0, 1, -1, 0,
                    {fx::makeStep(StepOp::Copy, I, 0, O, 0, 3), fx::makeStep(StepOp::Send, I, 0, O, 0, 2),
                     fx::makeStep(StepOp::Send, I, 2, O, 2, 1)}));
  s.ranks[1].threadBlocks.push_back(fx::makeBlock(
      0, -1, 0, 0, {fx::makeStep(StepOp::Recv, I, 2, O, 2, 1), fx::makeStep(StepOp::Recv, I, 0, O, 0, 2)}));
  ASSERT_TRUE(verify([&] {
                Schedule ok = s;
                std::swap(ok.ranks[1].threadBlocks[0].steps[0], ok.ranks[1].threadBlocks[0].steps[1]);
                return ok;
              }())
                  .proven);
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Matching, 1, 0, 0);
}

TEST(VerifierMutation, DuplicatedReduction) {
  Schedule s = fx::ringAllReduce(ring(4));
  auto& steps = s.ranks[2].threadBlocks[0].steps;  // send, rrs, rrs, rrcs(own=2), rcs, rcs, recv
  ASSERT_EQ(steps[3].op, StepOp::RecvReduceCopySend);
  // Reduce the rank's own input into the already complete sum once more.
  steps.insert(steps.begin() + 4, fx::makeStep(StepOp::Reduce, I, 2, O, 2));
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::ReducedTwice, 2, 0, 4);
  expectSomeError(r, Property::Postcondition, 2, 0, 4);
}

TEST(VerifierMutation, ReduceScatterReducingOwnChunkTwice) {
  Schedule s = fx::ringReduceScatter(ring(4));
  auto& steps = s.ranks[1].threadBlocks[0].steps;  // send, rrs, rrs, rrc
  ASSERT_EQ(steps[2].op, StepOp::RecvReduceSend);
  // The second rrs combines the received partial sum with a chunk index it already contains (rank 0's input 3
  // arrives with rank 0's contribution; reducing rank 1's input 3 is right, reducing again in place is not).
  steps.insert(steps.begin() + 1, fx::makeStep(StepOp::Reduce, I, 3, I, 3));  // input[3] = input[3] + input[3]
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::ReducedTwice, 1, 0, 1);
}

TEST(VerifierMutation, DependencyCycle) {
  Schedule s = fx::ringAllReduce(ring(4, 2));
  auto& tb0 = s.ranks[0].threadBlocks[0].steps;
  auto& tb1 = s.ranks[0].threadBlocks[1].steps;
  tb0[1].deps.push_back({1, 2});
  tb1[1].deps.push_back({0, 2});
  optiflow::core::recomputeHasDep(s);
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Deadlock, 0, kAny, kAny);
  EXPECT_EQ(r.errors.size(), 1u) << dump(r);
  const std::string& msg = r.errors.front().message;
  EXPECT_NE(msg.find("rank 0 tb 0 step 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 tb 1 step 2"), std::string::npos) << msg;
}

TEST(VerifierMutation, CycleThroughTransfers) {
  // Two ranks that each receive before they send: waits across ranks only.
  Schedule s = fx::emptySchedule(Collective::AllGather, 2, 2, true);
  for (int r = 0; r < 2; ++r) {
    s.ranks[r].outputChunks = 2;
    s.ranks[r].threadBlocks.push_back(fx::makeBlock(
        0, 1 - r, 1 - r, 0, {fx::makeStep(StepOp::Recv, O, 1 - r, O, 1 - r), fx::makeStep(StepOp::Send, O, r, O, r)}));
  }
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Deadlock, 0, 0, 0);
  // Fixed by sending first.
  for (auto& rp : s.ranks) std::swap(rp.threadBlocks[0].steps[0], rp.threadBlocks[0].steps[1]);
  EXPECT_TRUE(verify(s).proven) << dump(verify(s));
}

TEST(VerifierMutation, DependencyOnLaterStepOfSameBlock) {
  Schedule s = fx::ringAllGather(ring(3));
  s.ranks[1].threadBlocks[0].steps[1].deps.push_back({0, 2});
  optiflow::core::recomputeHasDep(s);
  expectFirstError(verify(s), Property::Deadlock, 1, 0, kAny);
}

TEST(VerifierMutation, SendRecvCountMismatch) {
  Schedule s = fx::ringAllGather(ring(4, 1, true));
  auto& last = s.ranks[2].threadBlocks[0].steps.back();
  ASSERT_EQ(last.op, StepOp::Recv);
  last.dstOff = 0;
  last.count = 2;  // in range, but the matching send moves one chunk
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Matching, 2, 0, static_cast<int>(s.ranks[2].threadBlocks[0].steps.size()) - 1);
}

TEST(VerifierMutation, ExtraUnmatchedSend) {
  Schedule s = fx::ringAllGather(ring(4));
  auto& steps = s.ranks[0].threadBlocks[0].steps;
  steps.push_back(fx::makeStep(StepOp::Send, I, 0, O, 0));
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Matching, 0, 0, static_cast<int>(steps.size()) - 1);
}

TEST(VerifierMutation, ExtraUnmatchedReceive) {
  Schedule s = fx::ringAllGather(ring(4));
  auto& steps = s.ranks[3].threadBlocks[0].steps;
  steps.push_back(fx::makeStep(StepOp::Recv, I, 0, O, 0));
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Matching, 3, 0, static_cast<int>(steps.size()) - 1);
}

TEST(VerifierMutation, SendWithoutReceivingBlock) {
  Schedule s = fx::ringAllGather(ring(4));
  s.ranks[1].threadBlocks[0].recvPeer = 3;  // rank 0 now sends to rank 1, but rank 1 listens to rank 3
  const VerifyReport r = verify(s);
  expectSomeError(r, Property::Matching, 0, 0, 1);
}

TEST(VerifierMutation, UnorderedWritesRace) {
  Schedule s = fx::ringAllGather(ring(4));
  // A second block on rank 1 copies its input over output[3], which tb 0's last recv (chunk of rank 2) writes.
  const int last = static_cast<int>(s.ranks[1].threadBlocks[0].steps.size()) - 1;
  ASSERT_EQ(s.ranks[1].threadBlocks[0].steps.back().dstOff, 2);
  s.ranks[1].threadBlocks.push_back(fx::makeBlock(1, -1, -1, 0, {fx::makeStep(StepOp::Copy, I, 0, O, 2)}));
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Race, 1, kAny, kAny);
  const Finding& f = r.errors.front();
  EXPECT_TRUE((f.tb == 1 && f.step == 0) || (f.tb == 0 && f.step == last)) << dump(r);
  // Ordering the copy after the recv removes the race (the output is still wrong: postcondition only).
  s.ranks[1].threadBlocks[1].steps[0].deps.push_back({0, last});
  optiflow::core::recomputeHasDep(s);
  const VerifyReport r2 = verify(s);
  EXPECT_EQ(findError(r2, Property::Race), nullptr) << dump(r2);
  expectFirstError(r2, Property::Postcondition, 1, 1, 0);
}

TEST(VerifierMutation, ReadWriteRaceAcrossBlocks) {
  // A new block copies input[0] of an in-place All-Reduce away while tb 0's rrcs stores the sum into it.
  Schedule s = fx::ringAllReduce(ring(2, 2, true));
  ASSERT_EQ(s.ranks[0].threadBlocks[0].steps[1].op, StepOp::RecvReduceCopySend);
  ASSERT_EQ(s.ranks[0].threadBlocks[0].steps[1].dstOff, 0);
  s.ranks[0].threadBlocks.push_back(fx::makeBlock(2, -1, -1, 0, {fx::makeStep(StepOp::Copy, I, 0, S, 0)}));
  s.ranks[0].scratchChunks = 1;
  expectFirstError(verify(s), Property::Race, 0, kAny, kAny);
}

// Rank 0 tb 1 reads output[1] only after a round trip through rank 1 that starts after tb 0 wrote it.
Schedule orderedThroughARoundTrip() {
  Schedule s = fx::emptySchedule(Collective::Broadcast, 2, 2, false);
  s.ranks[0].threadBlocks.push_back(fx::makeBlock(
      0, 1, -1, 0, {fx::makeStep(StepOp::Copy, I, 0, O, 0, 2), fx::makeStep(StepOp::Send, O, 0, O, 0, 2)}));
  s.ranks[0].threadBlocks.push_back(
      fx::makeBlock(1, -1, 1, 0, {fx::makeStep(StepOp::Recv, O, 0, S, 0, 1), fx::makeStep(StepOp::Copy, S, 0, O, 0)}));
  s.ranks[0].scratchChunks = 1;
  s.ranks[1].threadBlocks.push_back(fx::makeBlock(
      0, 0, 0, 0, {fx::makeStep(StepOp::Recv, O, 0, O, 0, 2), fx::makeStep(StepOp::Send, O, 0, S, 0, 1)}));
  return s;
}

TEST(VerifierMutation, RaceOrderedTransitivelyAcrossRanksIsNoRace) {
  const Schedule s = orderedThroughARoundTrip();
  const VerifyReport r = verify(s);
  EXPECT_TRUE(r.proven) << dump(r);
  // Without the round trip (tb 1 copies before it receives) the copy races with tb 0's copy.
  Schedule bad = s;
  std::swap(bad.ranks[0].threadBlocks[1].steps[0], bad.ranks[0].threadBlocks[1].steps[1]);
  bad.ranks[0].threadBlocks[1].steps[0] = fx::makeStep(StepOp::Copy, I, 0, O, 0);
  expectFirstError(verify(bad), Property::Race, 0, kAny, kAny);
}

TEST(VerifierMutation, RacesAreFoundWhateverTheClockBudget) {
  // The race passes keep their clocks for groups of ranks that fit the budget (one rank alone over it goes to the
  // full passes): a race is found, and a transitively ordered pair is not one, whatever the grouping.
  Schedule race = fx::ringAllGather(ring(4));
  race.ranks[1].threadBlocks.push_back(fx::makeBlock(1, -1, -1, 0, {fx::makeStep(StepOp::Copy, I, 0, O, 2)}));
  const Schedule ordered = orderedThroughARoundTrip();
  const Schedule clean = fx::ringAllGather(ring(8));
  for (const std::int64_t budget :
       {std::int64_t{1} << 24, std::int64_t{5}, std::int64_t{4}, std::int64_t{1}, std::int64_t{0}}) {
    optiflow::compiler::VerifyOptions o;
    o.clockBudget = budget;
    expectFirstError(verify(race, o), Property::Race, 1, kAny, kAny);
    EXPECT_TRUE(verify(ordered, o).proven) << budget << ": " << dump(verify(ordered, o));
    EXPECT_TRUE(verify(clean, o).proven) << budget << ": " << dump(verify(clean, o));
  }
}

TEST(Verifier, GivesUpPastItsDeadline) {
  // 2 x 255 x 256 steps: the clock is looked at every 65536 steps, several times here.
  const Schedule s = fx::ringAllGather(ring(256));
  optiflow::compiler::VerifyOptions o;
  o.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  const VerifyReport late = verify(s, o);
  EXPECT_TRUE(late.timedOut);
  EXPECT_FALSE(late.proven);
  EXPECT_TRUE(late.errors.empty()) << dump(late);
  o.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  const VerifyReport inTime = verify(s, o);
  EXPECT_FALSE(inTime.timedOut);
  EXPECT_TRUE(inTime.proven) << dump(inTime);
}

TEST(VerifierMutation, OutOfRangeOffset) {
  Schedule s = fx::ringAllReduce(ring(4));
  s.ranks[3].threadBlocks[0].steps[1].srcOff = 100;
  expectFirstError(verify(s), Property::Reference, 3, 0, 1);
  // In place, All-Gather's input is a slice of the output: an input offset beyond the slice is out of range.
  Schedule ag = fx::ringAllGather(ring(4, 1, true));
  ag.ranks[2].threadBlocks[0].steps[0].srcBuf = I;
  ag.ranks[2].threadBlocks[0].steps[0].srcOff = 1;
  expectFirstError(verify(ag), Property::Reference, 2, 0, 0);
  ag.ranks[2].threadBlocks[0].steps[0].srcOff = 0;
  EXPECT_TRUE(verify(ag).proven) << dump(verify(ag));
}

TEST(VerifierMutation, AbsurdCountsAndOffsetsDoNotCrash) {
  for (const int bad : {INT_MAX, INT_MIN, -1, 0}) {
    Schedule s = fx::ringAllReduce(ring(3));
    s.ranks[1].threadBlocks[0].steps[1].count = bad;
    EXPECT_FALSE(verify(s).proven) << bad;
    Schedule t = fx::ringAllReduce(ring(3));
    t.ranks[1].threadBlocks[0].steps[1].srcOff = bad == 0 ? INT_MAX - 1 : bad;
    expectFirstError(verify(t), Property::Reference, 1, 0, 1);
  }
  Schedule s = fx::ringAllReduce(ring(3));
  s.ranks[1].threadBlocks[0].steps[1].count = INT_MAX;
  s.ranks[1].threadBlocks[0].steps[1].srcOff = INT_MAX;
  EXPECT_FALSE(verify(s).proven);
}

TEST(VerifierMutation, MissingHasDep) {
  Schedule s = fx::ringAllReduce(ring(4, 2));
  s.ranks[0].threadBlocks[1].steps[0].deps.push_back({0, 1});
  // hasDep deliberately not recomputed.
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::HasDep, 0, 0, 1);
  EXPECT_EQ(r.errors.size(), 1u) << dump(r);
  optiflow::core::recomputeHasDep(s);
  EXPECT_TRUE(verify(s).proven) << dump(verify(s));
}

TEST(VerifierMutation, UninitializedRead) {
  Schedule s = fx::ringAllGather(ring(4));
  auto& send = s.ranks[1].threadBlocks[0].steps[1];
  ASSERT_EQ(send.op, StepOp::Send);
  send.srcBuf = O;
  send.srcOff = 3;  // output[3] is written only later
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Uninitialized, 1, 0, 1);
  expectSomeError(r, Property::Postcondition, kAny, kAny, kAny);
}

TEST(VerifierMutation, UninitializedScratchInReduce) {
  Schedule s = fx::ringAllReduce(ring(3));
  s.ranks[0].scratchChunks = 1;
  s.ranks[0].threadBlocks[0].steps.push_back(fx::makeStep(StepOp::Reduce, S, 0, O, 0));
  expectFirstError(verify(s), Property::Uninitialized, 0, 0,
                   static_cast<int>(s.ranks[0].threadBlocks[0].steps.size()) - 1);
}

TEST(VerifierMutation, BadPeers) {
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks[2].threadBlocks[0].sendPeer = 4;
    expectFirstError(verify(s), Property::Reference, 2, 0, -1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks[2].threadBlocks[0].recvPeer = 2;
    expectFirstError(verify(s), Property::Reference, 2, 0, -1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks[2].threadBlocks[0].sendPeer = -1;  // its send step now has nowhere to go
    expectFirstError(verify(s), Property::Connection, 2, 0, 1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks[2].threadBlocks[0].channel = 5;
    expectFirstError(verify(s), Property::Reference, 2, 0, -1);
  }
}

TEST(VerifierMutation, SharedConnection) {
  Schedule s = fx::ringAllGather(ring(4));
  s.ranks[0].threadBlocks.push_back(fx::makeBlock(7, 1, -1, 0, {}));
  expectFirstError(verify(s), Property::Connection, 0, 7, -1);
  Schedule t = fx::ringAllGather(ring(4));
  t.ranks[0].threadBlocks.push_back(fx::makeBlock(7, -1, 3, 0, {}));
  expectFirstError(verify(t), Property::Connection, 0, 7, -1);
  // Same peer on another channel is fine.
  Schedule u = fx::ringAllGather(ring(4));
  u.nChannels = 2;
  u.ranks[0].threadBlocks.push_back(fx::makeBlock(7, 1, 3, 1, {}));
  EXPECT_TRUE(verify(u).proven) << dump(verify(u));
}

TEST(VerifierMutation, BadDependencies) {
  {
    Schedule s = fx::ringAllGather(ring(3, 2));
    s.ranks[1].threadBlocks[0].steps[2].deps.push_back({9, 0});
    expectFirstError(verify(s), Property::Reference, 1, 0, 2);
  }
  {
    Schedule s = fx::ringAllGather(ring(3, 2));
    s.ranks[1].threadBlocks[0].steps[2].deps.push_back({1, 99});
    expectFirstError(verify(s), Property::Reference, 1, 0, 2);
  }
  {
    Schedule s = fx::ringAllGather(ring(3, 2));
    s.ranks[1].threadBlocks[0].steps[2].deps.push_back({0, 2});
    s.ranks[1].threadBlocks[0].steps[2].hasDep = true;
    expectFirstError(verify(s), Property::Reference, 1, 0, 2);
  }
  {
    Schedule s = fx::ringAllGather(ring(3, 2));
    s.ranks[1].threadBlocks.push_back(s.ranks[1].threadBlocks[0]);  // duplicate id 0
    expectFirstError(verify(s), Property::Reference, 1, 0, -1);
  }
}

TEST(VerifierMutation, BadShape) {
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks.pop_back();
    expectFirstError(verify(s), Property::Shape, -1, -1, -1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.chunksPerLoop = 6;  // not a multiple of 4
    expectFirstError(verify(s), Property::Shape, -1, -1, -1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4));
    s.ranks[2].outputChunks = 3;  // needs 4
    expectFirstError(verify(s), Property::Shape, 2, -1, -1);
  }
  {
    Schedule s = fx::ringAllGather(ring(4, 1, true));
    s.ranks[2].inputChunks = 0;  // aliased: 0 is allowed
    EXPECT_TRUE(verify(s).proven);
  }
  {
    Schedule s;  // nothing at all
    EXPECT_FALSE(verify(s).proven);
  }
}

TEST(VerifierMutation, ErrorCapIsHonoured) {
  Schedule s = fx::ringAllGather(ring(16));
  for (auto& rp : s.ranks) rp.threadBlocks[0].steps.erase(rp.threadBlocks[0].steps.begin());  // drop all copies
  optiflow::compiler::VerifyOptions o;
  o.maxErrors = 5;
  const VerifyReport r = verify(s, o);
  EXPECT_FALSE(r.proven);
  EXPECT_EQ(r.errors.size(), 5u);
  EXPECT_EQ(r.suppressedErrors, 11u);
}

// ---- hand-built schedules ----------------------------------------------------------------------------------------

// Root 0 sends its whole buffer directly to every other rank.
Schedule directBroadcast(int n, int c) {
  Schedule s = fx::emptySchedule(Collective::Broadcast, n, c, false);
  s.root = 0;
  for (int r = 0; r < n; ++r) {
    s.ranks[r].inputChunks = c;
    s.ranks[r].outputChunks = c;
  }
  s.nChannels = 1;
  s.ranks[0].threadBlocks.push_back(fx::makeBlock(0, -1, -1, 0, {fx::makeStep(StepOp::Copy, I, 0, O, 0, c)}));
  for (int p = 1; p < n; ++p) {
    s.ranks[0].threadBlocks.push_back(fx::makeBlock(p, p, -1, 0, {fx::makeStep(StepOp::Send, I, 0, O, 0, c)}));
    s.ranks[p].threadBlocks.push_back(fx::makeBlock(0, -1, 0, 0, {fx::makeStep(StepOp::Recv, I, 0, O, 0, c)}));
  }
  return s;
}

// Every rank sends to the root, which folds the contributions in one after another.
Schedule directReduce(int n) {
  Schedule s = fx::emptySchedule(Collective::Reduce, n, 1, false);
  s.root = 1;
  for (int r = 0; r < n; ++r) {
    s.ranks[r].inputChunks = 1;
    s.ranks[r].outputChunks = 1;
  }
  auto& root = s.ranks[1].threadBlocks;
  int prev = -1;
  for (int p = 0; p < n; ++p) {
    if (p == 1) continue;
    s.ranks[p].threadBlocks.push_back(fx::makeBlock(0, 1, -1, 0, {fx::makeStep(StepOp::Send, I, 0, O, 0)}));
    Step st = fx::makeStep(StepOp::RecvReduceCopy, prev < 0 ? I : O, 0, O, 0);
    if (prev >= 0) st.deps.push_back({prev, 0});
    root.push_back(fx::makeBlock(p, -1, p, 0, {st}));
    prev = p;
  }
  optiflow::core::recomputeHasDep(s);
  return s;
}

// Each pair exchanges one chunk directly; a local block copies the rank's own chunk.
Schedule directAllToAll(int n) {
  Schedule s = fx::emptySchedule(Collective::AllToAll, n, n, false);
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = n;
    rp.outputChunks = n;
    rp.threadBlocks.push_back(fx::makeBlock(0, -1, -1, 0, {fx::makeStep(StepOp::Copy, I, r, O, r)}));
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      rp.threadBlocks.push_back(
          fx::makeBlock(static_cast<int>(rp.threadBlocks.size()), p, p, 0,
                        {fx::makeStep(StepOp::Send, I, p, O, r), fx::makeStep(StepOp::Recv, I, r, O, p)}));
    }
  }
  return s;
}

TEST(VerifierHand, BroadcastProvenAndBroken) {
  EXPECT_TRUE(verify(directBroadcast(4, 3)).proven) << dump(verify(directBroadcast(4, 3)));
  // Broken: rank 2 forwards its own (undefined) input instead of receiving.
  Schedule s = directBroadcast(4, 3);
  s.ranks[0].threadBlocks[0].steps.clear();  // the root forgets its own output
  expectFirstError(verify(s), Property::Postcondition, 0, -1, -1);
  Schedule t = directBroadcast(3, 1);
  t.ranks[1].threadBlocks.push_back(fx::makeBlock(1, 2, -1, 0, {fx::makeStep(StepOp::Send, I, 0, O, 0)}));
  t.ranks[2].threadBlocks[0].recvPeer = -1;
  t.ranks[2].threadBlocks[0].steps.clear();
  t.ranks[2].threadBlocks.push_back(fx::makeBlock(1, -1, 1, 0, {fx::makeStep(StepOp::Recv, I, 0, O, 0)}));
  t.ranks[0].threadBlocks.pop_back();  // root no longer sends to rank 2
  expectFirstError(verify(t), Property::Uninitialized, 1, 1, 0);
}

TEST(VerifierHand, ReduceProvenAndBroken) {
  for (const int n : {2, 3, 5}) EXPECT_TRUE(verify(directReduce(n)).proven) << n << dump(verify(directReduce(n)));
  Schedule s = directReduce(4);
  auto& root = s.ranks[1].threadBlocks;  // tbs 0, 2, 3: tb 2 folds into output after tb 0, tb 3 after tb 2
  ASSERT_EQ(root[2].id, 3);
  root[2].steps[0].deps.clear();  // tb 3 no longer waits for tb 2
  optiflow::core::recomputeHasDep(s);
  expectFirstError(verify(s), Property::Race, 1, kAny, 0);
  Schedule t = directReduce(4);
  t.ranks[1].threadBlocks[1].steps[0].srcBuf = I;  // tb 2 restarts from the input: loses rank 0's contribution
  expectFirstError(verify(t), Property::Postcondition, 1, 3, 0);
  EXPECT_NE(verify(t).errors.front().message.find("missing (rank 0, chunk 0)"), std::string::npos) << dump(verify(t));
}

TEST(VerifierHand, AllToAllProvenAndBroken) {
  for (const int n : {2, 3, 8}) EXPECT_TRUE(verify(directAllToAll(n)).proven) << n;
  Schedule s = directAllToAll(3);
  s.ranks[2].threadBlocks[1].steps[0].srcOff = 2;  // rank 2 sends its own block to rank 0 instead of block 0
  const VerifyReport r = verify(s);
  expectFirstError(r, Property::Postcondition, 0, kAny, kAny);
  EXPECT_NE(r.errors.front().message.find("extra (rank 2, chunk 2)"), std::string::npos) << dump(r);
}

TEST(VerifierHand, OneShotAllReduceWarnsAboutReductionOrder) {
  // Every rank sends its chunk to both others and reduces (own + first peer) + second peer itself.
  const int n = 3;
  Schedule s = fx::emptySchedule(Collective::AllReduce, n, 1, false);
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = 1;
    rp.outputChunks = 1;
    rp.scratchChunks = 2;
    std::vector<Step> fold = {fx::makeStep(StepOp::Copy, I, 0, O, 0)};
    for (int k = 0; k < n - 1; ++k) {
      const int p = (r + 1 + k) % n;
      rp.threadBlocks.push_back(
          fx::makeBlock(k, p, p, k, {fx::makeStep(StepOp::Send, I, 0, S, 0), fx::makeStep(StepOp::Recv, I, 0, S, k)}));
      Step re = fx::makeStep(StepOp::Reduce, S, k, O, 0);
      re.deps.push_back({k, 1});
      fold.push_back(re);
    }
    rp.threadBlocks.push_back(fx::makeBlock(n - 1, -1, -1, 0, fold));
  }
  s.nChannels = n;
  // Pairing needs the same channel in both directions: rank r's k-th peer p = r+1+k sees r as its (n-2-k)-th.
  for (int r = 0; r < n; ++r) {
    for (auto& tb : s.ranks[r].threadBlocks) {
      if (tb.sendPeer >= 0) tb.channel = std::min(r, tb.sendPeer) + std::max(r, tb.sendPeer) - 1;
    }
  }
  optiflow::core::recomputeHasDep(s);
  const VerifyReport r = verify(s);
  EXPECT_TRUE(r.proven) << dump(r);
  ASSERT_FALSE(r.warnings.empty()) << dump(r);
  EXPECT_EQ(r.warnings.front().property, Property::ReductionOrder);
  EXPECT_EQ(r.warnings.front().severity, Severity::Warning);
  optiflow::compiler::VerifyOptions quiet;
  quiet.checkReductionOrder = false;
  EXPECT_TRUE(verify(s, quiet).warnings.empty());
}

// ---- robustness --------------------------------------------------------------------------------------------------

TEST(VerifierRobustness, RandomMutationsNeverCrash) {
  std::mt19937 rng(12345);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int extremes[] = {INT_MIN, -2, -1, 0, 1, 2, 3, 7, 100, INT_MAX};
  auto value = [&] { return pick(0, 3) == 0 ? extremes[pick(0, 9)] : pick(-1, 8); };
  std::size_t rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const auto o = ring(pick(1, 5), pick(1, 3), pick(0, 1) == 1);
    Schedule s = pick(0, 2) == 0 ? fx::ringAllGather(o) : pick(0, 1) ? fx::ringReduceScatter(o) : fx::ringAllReduce(o);
    s.inPlace = s.inPlace || pick(0, 3) == 0;
    for (int m = pick(1, 3); m > 0; --m) {
      auto& rp = s.ranks[pick(0, s.nRanks - 1)];
      if (rp.threadBlocks.empty()) continue;
      auto& tb = rp.threadBlocks[pick(0, static_cast<int>(rp.threadBlocks.size()) - 1)];
      switch (pick(0, 11)) {
        case 0:
          tb.sendPeer = value();
          break;
        case 1:
          tb.recvPeer = value();
          break;
        case 2:
          tb.channel = value();
          break;
        case 3:
          tb.id = value();
          break;
        case 4:
          rp.inputChunks = value();
          break;
        case 5:
          rp.scratchChunks = value();
          break;
        case 6:
          rp.localCopies.push_back({value(), value()});
          break;
        default: {
          if (tb.steps.empty()) break;
          Step& st = tb.steps[pick(0, static_cast<int>(tb.steps.size()) - 1)];
          switch (pick(0, 7)) {
            case 0:
              st.srcOff = value();
              break;
            case 1:
              st.dstOff = value();
              break;
            case 2:
              st.count = value();
              break;
            case 3:
              st.op = static_cast<StepOp>(pick(0, 8));
              break;
            case 4:
              st.deps.push_back({value(), value()});
              break;
            case 5:
              st.hasDep = !st.hasDep;
              break;
            case 6:
              st.srcBuf = static_cast<BufferKind>(pick(0, 2));
              break;
            default:
              tb.steps.erase(tb.steps.begin() + pick(0, static_cast<int>(tb.steps.size()) - 1));
              break;
          }
        }
      }
    }
    const VerifyReport r = verify(s);
    rejected += r.proven ? 0 : 1;
    for (const auto& e : r.errors) EXPECT_FALSE(e.message.empty());
  }
  EXPECT_GT(rejected, 1000u);
}

// ---- large rings -------------------------------------------------------------------------------------------------

// The verdicts on large rings. How fast the verifier is belongs to bench/compile_bench.cc (BM_VerifyRingAllReduce,
// BM_VerifyRingAllGather): a wall-clock limit here would test the machine the suite runs on.
TEST(VerifierLargeRings, AreProven) {
  {
    const Schedule s = fx::ringAllReduce(ring(64, 4));
    const VerifyReport r = verify(s);
    EXPECT_TRUE(r.proven) << dump(r);
    EXPECT_EQ(r.steps, optiflow::core::totalSteps(s));
  }
  {
    const Schedule s = fx::ringAllGather(ring(512, 1));
    const VerifyReport r = verify(s);
    EXPECT_TRUE(r.proven) << dump(r);
    EXPECT_EQ(r.steps, optiflow::core::totalSteps(s));
  }
}

// ---- real MSCCL files --------------------------------------------------------------------------------------------

struct SampleVerdict {
  const char* file;
  bool proven;
  std::size_t transfers;
  bool reductionOrderWarning;
  // For rejected files: every error, as (property, rank, tb id).
  std::vector<std::tuple<Property, int, int>> errors;
};

// The verdicts were checked by hand against the XML (see the comments).
const std::vector<SampleVerdict>& sampleVerdicts() {
  static const std::vector<SampleVerdict> v = {
      {"a2a-32gpu-ll128-2node-hier.xml", true, 992, false, {}},
      {"a2a-8gpu-ll-mi300.xml", true, 56, false, {}},
      {"ag-16gpu-ll-allpairs-mi250.xml", true, 240, false, {}},
      {"ag-32gpu-simple-2node-teccl.xml", true, 1910, false, {}},
      {"ag-8gpu-ll128-ndv4.xml", true, 224, false, {}},
      {"ar-4gpu-simple-hier-scratch-ncv4.xml", true, 144, false, {}},
      // Correct, but every rank folds the 8 contributions in its own order: results can differ bitwise.
      {"ar-8gpu-ll-1shot-outofplace-mi300.xml", true, 112, true, {}},
      {"ar-8gpu-ll-allpairs-scratch-ndv4.xml", true, 224, false, {}},
      {"ar-8gpu-ll128-ring-ndv4.xml", true, 896, false, {}},
      {"ar-8gpu-simple-ndv5.xml", true, 224, false, {}},
      {"old-ar-8gpu-ll128-ring.xml", true, 224, false, {}},
      // Rank 6's tb 4 (send 2, chan 0) and tb 5 (send 2, recv 2, chan 0) share the 6->2 connection on channel 0, and
      // rank 2's tb 5 (recv 6, chan 0) and tb 8 (send 6, recv 6, chan 0) share its receiving end; likewise 7->3
      // (rank 7 tbs 4/5, rank 3 tbs 6/8). Two blocks driving one NCCL connection corrupt its step counters.
      {"old-ar-8gpu-simple-ndv2.xml",
       false,
       0,
       false,
       {{Property::Connection, 2, 8},
        {Property::Connection, 3, 8},
        {Property::Connection, 6, 5},
        {Property::Connection, 7, 5}}},
      {"old-custom-24gpu-alltonext.xml", true, 130, false, {}},
      {"old-rt-ar-8gpu-ll-scratch.xml", true, 112, false, {}},
  };
  return v;
}

TEST(VerifierSamples, VerdictsArePinned) {
  const std::filesystem::path dir = OPTIFLOW_SAMPLES_DIR;
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no samples at " << dir;
  for (const auto& want : sampleVerdicts()) {
    SCOPED_TRACE(want.file);
    std::ifstream in(dir / want.file, std::ios::binary);
    ASSERT_TRUE(in) << "missing sample";
    std::stringstream text;
    text << in.rdbuf();
    const auto s = optiflow::compiler::importMscclXml(text.str(), want.file);
    ASSERT_TRUE(s.ok()) << "import failed";
    const VerifyReport r = verify(*s);
    EXPECT_EQ(r.proven, want.proven) << dump(r);
    EXPECT_EQ(r.steps, optiflow::core::totalSteps(*s));
    EXPECT_EQ(r.transfers, want.transfers) << dump(r);
    bool orderWarning = false;
    for (const auto& w : r.warnings) orderWarning |= w.property == Property::ReductionOrder;
    EXPECT_EQ(orderWarning, want.reductionOrderWarning) << dump(r);
    std::vector<std::tuple<Property, int, int>> got;
    for (const auto& e : r.errors) got.emplace_back(e.property, e.rank, e.tb);
    EXPECT_EQ(got, want.errors) << dump(r);
  }
}

TEST(VerifierSamples, EverySampleIsPinned) {
  const std::filesystem::path dir = OPTIFLOW_SAMPLES_DIR;
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no samples at " << dir;
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".xml") continue;
    ++files;
    const auto name = e.path().filename().string();
    EXPECT_TRUE(std::any_of(sampleVerdicts().begin(), sampleVerdicts().end(), [&](const SampleVerdict& v) {
      return name == v.file;
    })) << name;
  }
  EXPECT_EQ(files, sampleVerdicts().size());
}

// A sample's verdict in the mode it does not claim, to show the modes are really checked separately.
TEST(VerifierSamples, UnclaimedModeFails) {
  const std::filesystem::path dir = OPTIFLOW_SAMPLES_DIR;
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no samples at " << dir;
  std::ifstream in(dir / "a2a-8gpu-ll-mi300.xml", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  auto s = optiflow::compiler::importMscclXml(text.str(), "a2a-8gpu-ll-mi300.xml");
  ASSERT_TRUE(s.ok());
  s->inPlace = true;  // in place the receives overwrite input blocks other blocks are still sending
  const VerifyReport r = verify(*s);
  EXPECT_FALSE(r.proven);
  ASSERT_EQ(r.modesChecked.size(), 2u);
  ASSERT_NE(findError(r, Property::Race), nullptr) << dump(r);
  EXPECT_EQ(findError(r, Property::Race)->mode, BufferMode::InPlace);
  for (const auto& e : r.errors) EXPECT_EQ(e.mode, BufferMode::InPlace) << e.str();
}

}  // namespace
