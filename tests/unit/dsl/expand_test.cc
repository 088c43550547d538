// Expansion of OptiFlow programs into the intent IR: every program is checked by an independent symbolic executor
// of the IR (rounds with snapshot reads, no contribution counted twice, the collective's postcondition), and the
// bad programs by the exact position and a key phrase of their first diagnostic.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/expand.h"
#include "optiflow/dsl/parser.h"

namespace optiflow::dsl {
namespace {

using core::Collective;
using core::IntentProgram;
using core::Transfer;
using core::TransferKind;

core::Topology preset(const std::string& name) {
  core::Result<core::Topology> t = core::presetTopology(name);
  if (!t.ok()) {
    ADD_FAILURE() << t.error().str();
    return {};
  }
  return t.value();
}

// `nodes` nodes of `gpus` GPUs, one NIC per GPU: shapes no preset has (6 GPUs per node, 4 ranks in all).
core::Topology smallTopology(int nodes, int gpus) {
  core::Topology t;
  t.name = fmt::format("small{}x{}", nodes, gpus);
  t.nodes = nodes;
  t.gpusPerNode = gpus;
  for (int g = 0; g < gpus; ++g) t.nics.push_back(core::Nic{fmt::format("nic{}", g), 25, 2, {g}});
  return t;
}

bool isPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// ---- an independent executor of the intent IR ----
// A value is the bit mask of the ranks whose contributions it holds (the topologies here have at most 64 ranks).
// Returns "" when every transfer sends something, no Reduce adds a contribution twice, and the end state is the
// collective's postcondition; otherwise what went wrong first.
std::string simulate(const IntentProgram& p) {
  if (std::string bad = core::validateIntent(p); !bad.empty()) return "invalid intent: " + bad;
  const int n = p.nRanks;
  if (n > 64) return "the test executor handles at most 64 ranks";
  const int parts = p.parts;
  const int chunks = p.nChunks();
  std::vector<std::uint64_t> state(static_cast<std::size_t>(n) * chunks, 0);
  auto at = [&](int r, int c) -> std::uint64_t& { return state[static_cast<std::size_t>(r) * chunks + c]; };
  auto bit = [](int r) { return std::uint64_t{1} << r; };
  const std::uint64_t full = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  switch (p.collective) {
    case Collective::AllGather:
      for (int c = 0; c < chunks; ++c) at(c / parts, c) = bit(c / parts);
      break;
    case Collective::ReduceScatter:
    case Collective::AllReduce:
    case Collective::Reduce:
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < chunks; ++c) at(r, c) = bit(r);
      }
      break;
    case Collective::Broadcast:
      for (int c = 0; c < chunks; ++c) at(p.root, c) = bit(p.root);
      break;
    case Collective::AllToAll:
      for (int c = 0; c < chunks; ++c) at(c / parts / n, c) = bit(c / parts / n);
      break;
    default:
      return "unsupported collective";
  }
  for (std::size_t b = 0; b < p.transfers.size();) {
    std::size_t e = b;
    while (e < p.transfers.size() && p.transfers[e].round == p.transfers[b].round) ++e;
    std::vector<std::uint64_t> sent;  // every transfer of the round reads the state from before the round
    for (std::size_t i = b; i < e; ++i) sent.push_back(at(p.transfers[i].src, p.transfers[i].chunk));
    for (std::size_t i = b; i < e; ++i) {
      const Transfer& t = p.transfers[i];
      const std::uint64_t v = sent[i - b];
      std::uint64_t& d = at(t.dst, t.chunk);
      if (v == 0) return fmt::format("transfer {}: rank {} sends chunk {} it does not hold", i, t.src, t.chunk);
      if (t.kind == TransferKind::Copy) {
        d = v;
      } else {
        if (d == 0) return fmt::format("transfer {}: reduce into rank {} which holds nothing", i, t.dst);
        if ((d & v) != 0) return fmt::format("transfer {}: chunk {} counted twice at rank {}", i, t.chunk, t.dst);
        d |= v;
      }
    }
    b = e;
  }
  auto lacks = [&](int r, int c, std::uint64_t want) {
    return at(r, c) == want
               ? std::string()
               : fmt::format("at the end rank {} holds {:#x} of chunk {}, not {:#x}", r, at(r, c), c, want);
  };
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < chunks; ++c) {
      const int block = c / parts;
      std::string bad;
      switch (p.collective) {
        case Collective::AllGather:
          bad = lacks(r, c, bit(block));
          break;
        case Collective::ReduceScatter:
          if (block == r) bad = lacks(r, c, full);
          break;
        case Collective::AllReduce:
          bad = lacks(r, c, full);
          break;
        case Collective::Broadcast:
          bad = lacks(r, c, bit(p.root));
          break;
        case Collective::Reduce:
          if (r == p.root) bad = lacks(r, c, full);
          break;
        case Collective::AllToAll:
          if (block % n == r) bad = lacks(r, c, bit(block / n));
          break;
        default:
          break;
      }
      if (!bad.empty()) return bad;
    }
  }
  return "";
}

std::string errorsOf(const ExpandResult& r) {
  std::string out;
  for (const core::Diagnostic& d : r.errors) out += d.str() + "\n";
  return out;
}

ExpandResult expandText(const std::string& text, const core::Topology& topo, const ExpandOptions& options = {}) {
  ParseResult parsed = parseProgram(text, "t.ofl");
  if (!parsed.ok()) {
    ADD_FAILURE() << "does not parse: " << parsed.errors.front().str() << "\n" << text;
    return {};
  }
  return expand(*parsed.program, topo, "t.ofl", options);
}

// Expands, expects no error, runs the executor on the result.
IntentProgram expectOk(const std::string& text, const core::Topology& topo, const ExpandOptions& options = {}) {
  const ExpandResult r = expandText(text, topo, options);
  EXPECT_TRUE(r.ok()) << errorsOf(r) << text << "on " << topo.name;
  if (!r.ok()) return {};
  EXPECT_EQ(simulate(*r.intent), "") << text << "on " << topo.name;
  return *r.intent;
}

// Expects the first diagnostic at line:column containing `phrase`.
void expectError(const std::string& text, const core::Topology& topo, int line, int column, const std::string& phrase,
                 const ExpandOptions& options = {}) {
  const ExpandResult r = expandText(text, topo, options);
  ASSERT_FALSE(r.ok()) << text;
  ASSERT_FALSE(r.errors.empty());
  const core::Diagnostic& d = r.errors.front();
  EXPECT_EQ(d.file, "t.ofl");
  EXPECT_EQ(d.line, line) << d.str();
  EXPECT_EQ(d.column, column) << d.str();
  EXPECT_NE(d.message.find(phrase), std::string::npos) << d.str();
}

std::size_t count(const IntentProgram& p, TransferKind kind) {
  std::size_t n = 0;
  for (const Transfer& t : p.transfers) n += t.kind == kind ? 1 : 0;
  return n;
}

std::size_t npairs(int n) { return static_cast<std::size_t>(n) * (n - 1); }

// ---- the same programs on several clusters ----

class OnPresets : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    topo_ = preset(GetParam());
    n_ = topo_.nRanks();
  }
  core::Topology topo_;
  int n_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Clusters, OnPresets,
                         ::testing::Values("dgx-a100", "dgx-a100x2", "dgx-a100x4", "dgx-h100x3", "hgx-h200x2"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string s = param.param;
                           for (char& c : s) c = (c == '-') ? '_' : c;
                           return s;
                         });

TEST_P(OnPresets, AllgatherOverAllByEveryStrategy) {
  struct Case {
    std::string strategy;
    int rounds;
  };
  const std::vector<Case> cases = {{"ring", n_ - 1},
                                   {"direct", 1},
                                   {"recursive_doubling", ceilLog2(n_)},
                                   {"bruck", ceilLog2(n_)},
                                   {"pat", ceilLog2(n_)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.strategy);
    const std::string text = "allgather a\n  allgather all by " + c.strategy + "\n";
    if (c.strategy == "recursive_doubling" && !isPow2(n_)) {
      expectError(text, topo_, 2, 3, "power-of-two size; all has");
      continue;
    }
    const IntentProgram p = expectOk(text, topo_);
    EXPECT_EQ(p.transfers.size(), npairs(n_));
    EXPECT_EQ(p.rounds(), c.rounds);
    EXPECT_EQ(count(p, TransferKind::Reduce), 0u);
    EXPECT_EQ(p.name, "a");
    EXPECT_EQ(p.nBlocks, n_);
    EXPECT_EQ(p.parts, 1);
  }
}

TEST_P(OnPresets, SplitRingsCarryEveryPartInTheSameRounds) {
  const IntentProgram p = expectOk("allgather a\n  split 3\n  allgather all by ring\n", topo_);
  EXPECT_EQ(p.transfers.size(), npairs(n_) * 3);
  EXPECT_EQ(p.rounds(), n_ - 1);
  EXPECT_EQ(p.parts, 3);
  EXPECT_EQ(p.nChunks(), n_ * 3);
}

TEST_P(OnPresets, HierarchicalAllgatherEitherWay) {
  const IntentProgram railFirst = expectOk(R"(allgather rail_then_node
  for g in gpus: allgather rail(g) by ring
  for n in nodes: allgather node(n) by direct
)",
                                           topo_);
  EXPECT_EQ(railFirst.transfers.size(), npairs(n_));
  const IntentProgram nodeFirst = expectOk(R"(allgather node_then_rail
  for n in nodes: allgather node(n) by ring
  for g in gpus: allgather rail(g) by direct
)",
                                           topo_);
  EXPECT_EQ(nodeFirst.transfers.size(), npairs(n_));
  // Every rail ring crosses the network only between the GPUs of one rail.
  for (const Transfer& t : railFirst.transfers) {
    if (t.line == 2) {
      EXPECT_EQ(topo_.localOf(t.src), topo_.localOf(t.dst));
    }
    if (t.line == 3) {
      EXPECT_EQ(topo_.nodeOf(t.src), topo_.nodeOf(t.dst));
    }
  }
}

TEST_P(OnPresets, ReducescatterByEveryStrategy) {
  for (const std::string s : {"ring", "direct", "recursive_halving", "pat"}) {
    SCOPED_TRACE(s);
    const std::string text = "reducescatter r\n  reducescatter all by " + s + "\n";
    if (s == "recursive_halving" && !isPow2(n_)) {
      expectError(text, topo_, 2, 3, "use ring or pat");
      continue;
    }
    const IntentProgram p = expectOk(text, topo_);
    if (s == "ring") {
      EXPECT_EQ(p.rounds(), n_ - 1);
    }
    if (s == "direct") {
      EXPECT_EQ(p.rounds(), 1);
    }
    if (s == "recursive_halving") {
      EXPECT_EQ(p.rounds(), ceilLog2(n_));
    }
    if (s != "pat") {
      EXPECT_EQ(p.transfers.size(), npairs(n_));
    }
    EXPECT_GE(p.transfers.size(), npairs(n_));
  }
}

TEST_P(OnPresets, HierarchicalReducescatterEitherWay) {
  expectOk(R"(reducescatter node_then_rail
  for n in nodes: reducescatter node(n) by ring
  for g in gpus: reducescatter rail(g) by ring
)",
           topo_);
  expectOk(R"(reducescatter rail_then_node
  for g in gpus: reducescatter rail(g) by pat
  for n in nodes: reducescatter node(n) by direct
)",
           topo_);
}

TEST_P(OnPresets, AllreduceByEveryStrategy) {
  struct Case {
    std::string strategy;
    int rounds;
    std::size_t transfers;
  };
  const int lg = ceilLog2(n_);
  const std::vector<Case> cases = {
      {"ring", 2 * (n_ - 1), 2 * npairs(n_)},
      {"direct", 2, 2 * npairs(n_)},
      {"recursive_doubling", lg, static_cast<std::size_t>(n_) * n_ * lg},
      {"recursive_halving", 2 * lg, 2 * npairs(n_)},
      {"tree", 2 * lg, 2 * npairs(n_)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.strategy);
    const std::string text = "allreduce r\n  allreduce all by " + c.strategy + "\n";
    if ((c.strategy == "recursive_doubling" || c.strategy == "recursive_halving") && !isPow2(n_)) {
      expectError(text, topo_, 2, 3, "use ring or tree");
      continue;
    }
    const IntentProgram p = expectOk(text, topo_);
    EXPECT_EQ(p.rounds(), c.rounds);
    EXPECT_EQ(p.transfers.size(), c.transfers);
  }
}

TEST_P(OnPresets, HierarchicalAllreduce) {
  const IntentProgram p = expectOk(R"(allreduce hier
  for n in nodes: reducescatter node(n) by ring
  for g in gpus: allreduce rail(g) by ring
  for n in nodes: allgather node(n) by ring
)",
                                   topo_);
  // No transfer of the rail phase leaves its rail, none of the node phases leaves its node.
  for (const Transfer& t : p.transfers) {
    if (t.line == 3) {
      EXPECT_EQ(topo_.localOf(t.src), topo_.localOf(t.dst));
    } else {
      EXPECT_EQ(topo_.nodeOf(t.src), topo_.nodeOf(t.dst));
    }
  }
}

TEST_P(OnPresets, BroadcastAndReduceByEveryStrategy) {
  ExpandOptions opt;
  opt.root = n_ / 2 + 1;
  const int lg = ceilLog2(n_);
  for (const auto& [s, rounds] :
       std::vector<std::pair<std::string, int>>{{"tree", lg}, {"chain", n_ - 1}, {"direct", 1}}) {
    SCOPED_TRACE(s);
    const IntentProgram b = expectOk("broadcast b\n  broadcast all from root by " + s + "\n", topo_, opt);
    EXPECT_EQ(b.transfers.size(), static_cast<std::size_t>(n_ - 1));
    EXPECT_EQ(b.rounds(), rounds);
    EXPECT_EQ(b.root, opt.root);
    EXPECT_EQ(b.nBlocks, 1);
    const IntentProgram r = expectOk("reduce r\n  reduce all to root by " + s + "\n", topo_, opt);
    EXPECT_EQ(r.transfers.size(), static_cast<std::size_t>(n_ - 1));
    EXPECT_EQ(r.rounds(), rounds);
  }
}

TEST_P(OnPresets, HierarchicalBroadcastAndReduce) {
  ExpandOptions opt;
  opt.root = n_ - 3;
  const IntentProgram b = expectOk(R"(broadcast hier
  split 4
  broadcast rail(localof(root)) from root by chain
  for n in nodes: broadcast node(n) from rank(n, localof(root)) by tree
)",
                                   topo_, opt);
  EXPECT_EQ(b.transfers.size(), static_cast<std::size_t>(n_ - 1) * 4);
  const IntentProgram r = expectOk(R"(reduce hier
  for n in nodes: reduce node(n) to rank(n, localof(root)) by tree
  reduce rail(localof(root)) to root by chain
)",
                                   topo_, opt);
  EXPECT_EQ(r.transfers.size(), static_cast<std::size_t>(n_ - 1));
}

TEST_P(OnPresets, AlltoallDirectRingAndRelayed) {
  const IntentProgram d = expectOk("alltoall a\n  alltoall all by direct\n", topo_);
  EXPECT_EQ(d.transfers.size(), npairs(n_));
  EXPECT_EQ(d.rounds(), 1);
  EXPECT_EQ(d.nBlocks, n_ * n_);
  const IntentProgram r = expectOk("alltoall a\n  split 2\n  alltoall all by ring\n", topo_);
  EXPECT_EQ(r.transfers.size(), npairs(n_) * 2);
  EXPECT_EQ(r.rounds(), n_ - 1);
  // PXN: a block for another node crosses the network on the receiver's rail, relayed by the sender's node-mate.
  const IntentProgram pxn = expectOk(R"(alltoall pxn
  for i in ranks:
    for j in ranks:
      if nodeof(i) == nodeof(j) or localof(i) == localof(j):
        if i != j: send block(i, j) from i to j
      else:
        send block(i, j) from i to j via rank(nodeof(i), localof(j))
)",
                                     topo_);
  EXPECT_EQ(pxn.transfers.size(), npairs(n_));
  EXPECT_EQ(pxn.rounds(), 1);  // independent sends share a round
  for (const Transfer& t : pxn.transfers) {
    const bool relayed = topo_.nodeOf(t.src) != topo_.nodeOf(t.dst) && topo_.localOf(t.src) != topo_.localOf(t.dst);
    EXPECT_EQ(t.via, relayed ? topo_.rankOf(topo_.nodeOf(t.src), topo_.localOf(t.dst)) : -1);
    EXPECT_EQ(t.chunk, t.src * n_ + t.dst);
  }
}

TEST_P(OnPresets, TwoRingsOnTwoParts) {
  const IntentProgram p = expectOk(R"(allgather two_rings
  split 2
  allgather all by ring part 0
  allgather {ranks - 1 - i for i in ranks} by ring parts 1..2
)",
                                   topo_);
  EXPECT_EQ(p.transfers.size(), 2 * npairs(n_));
  EXPECT_EQ(p.rounds(), 2 * (n_ - 1));
  for (const Transfer& t : p.transfers) {
    EXPECT_EQ(t.chunk % 2, t.line == 3 ? 0 : 1);
    EXPECT_EQ(t.dst, t.line == 3 ? (t.src + 1) % n_ : (t.src + n_ - 1) % n_);
  }
}

TEST_P(OnPresets, RingsBuiltByHandFromSends) {
  const IntentProgram ag = expectOk(R"(allgather hand_ring
  for t in ranks - 1:
    for r in ranks:
      send block((r - t) % ranks) from r to (r + 1) % ranks
)",
                                    topo_);
  EXPECT_EQ(ag.transfers.size(), npairs(n_));
  EXPECT_EQ(ag.rounds(), n_ - 1);  // each step reads what the previous one wrote, nothing else waits
  const IntentProgram rs = expectOk(R"(reducescatter hand_ring
  for t in ranks - 1:
    for r in ranks:
      send block((r - t - 1) % ranks) from r to (r + 1) % ranks
)",
                                    topo_);
  EXPECT_EQ(rs.transfers.size(), npairs(n_));
  EXPECT_EQ(rs.rounds(), n_ - 1);
  EXPECT_EQ(count(rs, TransferKind::Reduce), npairs(n_));
}

// ---- exact transfers on a small cluster ----

TEST(Expand, RingAllgatherHopsForwardOneRoundPerHop) {
  const IntentProgram p = expectOk("allgather a\n  allgather all by ring\n", smallTopology(1, 4));
  ASSERT_EQ(p.transfers.size(), 12u);
  const std::vector<Transfer> first = {p.transfers.begin(), p.transfers.begin() + 4};
  EXPECT_EQ(first, (std::vector<Transfer>{{0, 0, 1, TransferKind::Copy, -1, 0, 2},
                                          {1, 1, 2, TransferKind::Copy, -1, 0, 2},
                                          {2, 2, 3, TransferKind::Copy, -1, 0, 2},
                                          {3, 3, 0, TransferKind::Copy, -1, 0, 2}}));
  EXPECT_EQ(p.transfers[4], (Transfer{0, 1, 2, TransferKind::Copy, -1, 1, 2}));
  EXPECT_EQ(p.transfers[11], (Transfer{3, 1, 2, TransferKind::Copy, -1, 2, 2}));
}

TEST(Expand, RingReducescatterEndsEachChunkAtItsOwner) {
  const IntentProgram p = expectOk("reducescatter a\n  reducescatter all by ring\n", smallTopology(1, 4));
  ASSERT_EQ(p.transfers.size(), 12u);
  EXPECT_EQ(p.transfers[0], (Transfer{0, 1, 2, TransferKind::Reduce, -1, 0, 2}));
  EXPECT_EQ(p.transfers[3], (Transfer{3, 0, 1, TransferKind::Reduce, -1, 0, 2}));
  EXPECT_EQ(p.transfers[8], (Transfer{0, 3, 0, TransferKind::Reduce, -1, 2, 2}));
}

TEST(Expand, RecursiveDoublingAllreduceExchangesWithinOneRound) {
  const IntentProgram p = expectOk("allreduce a\n  allreduce {0, 1} by recursive_doubling\n", smallTopology(1, 2));
  ASSERT_EQ(p.transfers.size(), 4u);
  EXPECT_EQ(p.transfers[0], (Transfer{0, 0, 1, TransferKind::Reduce, -1, 0, 2}));
  EXPECT_EQ(p.transfers[1], (Transfer{1, 0, 1, TransferKind::Reduce, -1, 0, 2}));
  EXPECT_EQ(p.transfers[2], (Transfer{0, 1, 0, TransferKind::Reduce, -1, 0, 2}));
  EXPECT_EQ(p.rounds(), 1);
  // Once both hold the sum, a second allreduce would add every contribution again.
  expectError("allreduce a\n  allreduce {0, 1} by recursive_doubling\n  allreduce all by ring\n", smallTopology(1, 2),
              3, 3, "both hold rank 0's contribution to block 0");
}

TEST(Expand, CopiesOfWhatTheReceiverHoldsAreSkipped) {
  const core::Topology t = smallTopology(1, 4);
  const IntentProgram p = expectOk(R"(allgather a
  broadcast all from 2 by chain
  allgather all by ring
  allgather all by direct
  allgather {3} by ring
)",
                                   t);
  EXPECT_EQ(p.transfers.size(), 12u);  // 3 for block 2, 9 for the rest, nothing more
  for (const Transfer& t2 : p.transfers) EXPECT_NE(t2.line, 4);
}

TEST(Expand, IndependentSendsShareARoundDependentOnesDoNot) {
  const IntentProgram p = expectOk(R"(allgather a
  send block(0) from 0 to 1
  send block(2) from 2 to 3
  send block(0) from 1 to 2
  send block(3) from 3 to 0
  allgather all by direct
)",
                                   smallTopology(1, 4));
  ASSERT_GE(p.transfers.size(), 4u);
  EXPECT_EQ(p.transfers[0].round, 0);
  EXPECT_EQ(p.transfers[1].round, 0);
  EXPECT_EQ(p.transfers[2].round, 1);  // reads what the first send wrote
  EXPECT_EQ(p.transfers[3].round, 1);
  EXPECT_EQ(p.transfers[4].round, 2);  // a group operation starts its own round
}

TEST(Expand, ReduceSendsDropTheSenderAndCopiesKeepIt) {
  const IntentProgram p = expectOk(R"(reduce a
  send block(0) from 1 to 0
  send block(0) from 2 to 3
  send block(0) from 3 to 0
  reduce all to 0 by direct
)",
                                   smallTopology(1, 4));
  // 1 -> 0 adds; 2 -> 3 adds (2 drops); 3 -> 0 adds; nothing is left to reduce.
  ASSERT_EQ(p.transfers.size(), 3u);
  EXPECT_EQ(count(p, TransferKind::Reduce), 3u);
}

TEST(Expand, ReduceScatterTargetsTheOwnersNodeMateOrRailMate) {
  // reducescatter node(n) leaves block b on GPU localof(b) of every node, so the rail finishes it.
  const IntentProgram p = expectOk(R"(reducescatter two_level
  for n in nodes: reducescatter node(n) by direct
  for g in gpus: reducescatter rail(g) by direct
)",
                                   smallTopology(2, 2));
  for (const Transfer& t : p.transfers) {
    if (t.line == 2) {
      EXPECT_EQ(t.dst % 2, t.chunk % 2);  // GPU localof(b) of the node
    }
  }
}

TEST(Expand, ChainsRelayThroughMembersThatHoldNothing) {
  const IntentProgram p = expectOk(R"(reduce a
  reduce {1, 2} to 1 by direct
  reduce {0, 1, 2, 3} to 0 by chain
)",
                                   smallTopology(1, 4));
  // 2 -> 1 adds; then 1 -> 2 is a copy (2 gave its value away), 2 -> 3 and 3 -> 0 add.
  ASSERT_EQ(p.transfers.size(), 4u);
  EXPECT_EQ(p.transfers[1], (Transfer{0, 1, 2, TransferKind::Copy, -1, 1, 3}));
  EXPECT_EQ(p.transfers[3], (Transfer{0, 3, 0, TransferKind::Reduce, -1, 3, 3}));
}

TEST(Expand, ComprehensionGroupsFollowTheirOrder) {
  // A ring over GPU 0 of every node, in reverse node order, then every node shares.
  const core::Topology t = preset("dgx-a100x4");
  const IntentProgram p = expectOk(R"(allgather a
  for g in gpus: allgather {rank(nodes - 1 - n, g) for n in nodes} by ring
  for n in nodes: allgather node(n) by direct
)",
                                   t);
  for (const Transfer& x : p.transfers) {
    if (x.line == 2) {
      EXPECT_EQ(t.nodeOf(x.dst), (t.nodeOf(x.src) + t.nodes - 1) % t.nodes);
    }
  }
}

TEST(Expand, LargerClustersExpandToTheExpectedCounts) {
  const core::Topology t = preset("dgx-h100x16");
  const ExpandResult r = expandText(R"(allgather h
  for g in gpus: allgather rail(g) by ring
  for n in nodes: allgather node(n) by direct
)",
                                    t);
  ASSERT_TRUE(r.ok()) << errorsOf(r);
  EXPECT_EQ(r.intent->transfers.size(), npairs(128));
  EXPECT_EQ(r.intent->rounds(), 8 * 15 + 16);
  const ExpandResult a = expandText("alltoall a\n  alltoall all by ring\n", t);
  ASSERT_TRUE(a.ok()) << errorsOf(a);
  EXPECT_EQ(a.intent->transfers.size(), npairs(128));
}

TEST(Expand, ArithmeticFollowsFloorSemanticsAndShortCircuits) {
  // Negative operands: -7 / 2 = -4, -7 % 2 = 1, 7 % -2 = -1; `and` skips its right side.
  const IntentProgram p = expectOk(R"(allgather a
  let q = -7 / 2
  let m = -7 % 2
  let k = 7 % -2
  let z = 0
  if q == -4 and m == 1 and k == -1 and (z == 0 or 1 / z == 0) and not (z != 0 and 1 / z > 0):
    if pow(2, 10) == 1024 and log2(1023) == 9 and min(3, -1) == -1 and max(3, -1) == 3:
      if rank(1, 1) == 3 and nodeof(3) == 1 and localof(3) == 1 and rails == 2 and parts == 1 and root == 0:
        allgather all by ring
)",
                                   smallTopology(2, 2));
  EXPECT_EQ(p.transfers.size(), 12u);
}

TEST(Expand, LetScopesEndWithTheirBlock) {
  expectOk(R"(allgather a
  for i in 2:
    let x = i
  for i in 2:
    let x = i + 1
  let x = 0
  allgather all by direct
)",
           smallTopology(1, 2));
}

// ---- random programs: whatever expands must pass the executor ----

TEST(ExpandProperty, RandomProgramsFailWithADiagnosticOrPassTheExecutor) {
  std::mt19937 rng(20240611);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const std::vector<core::Topology> topos = {smallTopology(2, 4), smallTopology(3, 2), smallTopology(1, 6),
                                             smallTopology(4, 1), preset("dgx-a100x2")};
  const std::vector<std::string> collectives = {"allgather", "reducescatter", "allreduce",
                                                "broadcast", "reduce",        "alltoall"};
  const std::vector<std::vector<std::string>> strategies = {
      {"ring", "direct", "recursive_doubling", "bruck", "pat"},
      {"ring", "direct", "recursive_halving", "pat"},
      {"ring", "direct", "recursive_doubling", "recursive_halving", "tree"},
      {"tree", "chain", "direct"},
      {"tree", "chain", "direct"},
      {"direct", "ring"}};
  // The operations that make sense on each collective's data (indices into `collectives`).
  const std::vector<std::vector<int>> allowed = {{0, 3}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4},
                                                 {0, 3}, {0, 1, 2, 3, 4}, {5}};
  const std::vector<std::string> finish = {"allgather all by ring",        "reducescatter all by direct",
                                           "allreduce all by direct",      "broadcast all from root by tree",
                                           "reduce all to root by direct", "alltoall all by direct"};
  int passed = 0;
  const int programs = 800;
  for (int iter = 0; iter < programs; ++iter) {
    const core::Topology& topo = topos[iter % topos.size()];
    const int n = topo.nRanks();
    const int c = pick(6);
    const int parts = 1 + pick(3);
    std::string text = collectives[c] + " random\n";
    if (parts > 1) text += fmt::format("  split {}\n", parts);
    for (int k = pick(4); k >= 0; --k) {
      if (pick(6) == 0) {  // a send between two random ranks
        const int a = pick(n);
        const int b = (a + 1 + pick(n - 1)) % n;
        const std::string block =
            c == 5 ? fmt::format("{}, {}", pick(n), pick(n)) : fmt::format("{}", c == 3 || c == 4 ? 0 : pick(n));
        text += fmt::format("  send block({}) from {} to {}\n", block, a, b);
        continue;
      }
      const int op = allowed[c][pick(static_cast<int>(allowed[c].size()))];
      std::vector<int> members;
      std::string group;
      switch (pick(4)) {
        case 0:
          group = "all";
          members.resize(n);
          std::iota(members.begin(), members.end(), 0);
          break;
        case 1: {
          const int node = pick(topo.nodes);
          group = fmt::format("node({})", node);
          for (int g = 0; g < topo.gpusPerNode; ++g) members.push_back(topo.rankOf(node, g));
          break;
        }
        case 2: {
          const int g = pick(topo.gpusPerNode);
          group = fmt::format("rail({})", g);
          for (int nd = 0; nd < topo.nodes; ++nd) members.push_back(topo.rankOf(nd, g));
          break;
        }
        default: {
          members.resize(n);
          std::iota(members.begin(), members.end(), 0);
          std::shuffle(members.begin(), members.end(), rng);
          members.resize(1 + pick(n));
          group = "{";
          for (std::size_t i = 0; i < members.size(); ++i) group += fmt::format("{}{}", i ? ", " : "", members[i]);
          group += "}";
        }
      }
      const std::vector<std::string>& st = strategies[op];
      std::string line = fmt::format("  {} {}", collectives[op], group);
      if (op == 3) line += fmt::format(" from {}", members[pick(static_cast<int>(members.size()))]);
      if (op == 4) line += fmt::format(" to {}", members[pick(static_cast<int>(members.size()))]);
      line += " by " + st[pick(static_cast<int>(st.size()))];
      if (parts > 1 && pick(2) == 0) {
        const int lo = pick(parts);
        line +=
            pick(2) == 0 ? fmt::format(" part {}", lo) : fmt::format(" parts {}..{}", lo, lo + 1 + pick(parts - lo));
      }
      text += line + "\n";
    }
    text += "  " + finish[c] + "\n";
    ExpandOptions opt;
    opt.root = pick(n);
    const ExpandResult r = expandText(text, topo, opt);
    if (r.ok()) {
      ++passed;
      EXPECT_EQ(simulate(*r.intent), "") << text << "on " << topo.name << " root " << opt.root;
    } else {
      for (const core::Diagnostic& d : r.errors) {
        EXPECT_EQ(d.file, "t.ofl");
        EXPECT_GE(d.line, 1) << d.str();
        EXPECT_GE(d.column, 1) << d.str();
        EXPECT_EQ(d.message.find("internal error"), std::string::npos) << d.str() << "\n" << text;
      }
    }
  }
  EXPECT_GT(passed, programs / 4);
}

// ---- errors ----

TEST(ExpandErrors, UnknownNameSuggestsTheCloseOne) {
  expectError("allgather a\n  for g in gpu: allgather rail(g) by ring\n", preset("dgx-a100x2"), 2, 12,
              "unknown name 'gpu' (did you mean 'gpus'?)");
  expectError("allgather a\n  allgather node(rnak(0, 1)) by ring\n", preset("dgx-a100x2"), 2, 18,
              "unknown function 'rnak' (did you mean 'rank'?)");
  expectError("allgather a\n  let x = rank\n", preset("dgx-a100"), 2, 11, "'rank' is a function");
}

TEST(ExpandErrors, DivisionByZero) {
  expectError("allgather a\n  let x = nodes / (gpus - gpus)\n", preset("dgx-a100"), 2, 11,
              "division by zero in 'nodes / (gpus - gpus)'");
  expectError("allgather a\n  let x = 3 % 0\n", preset("dgx-a100"), 2, 11, "division by zero");
}

TEST(ExpandErrors, OverflowAndBadArguments) {
  expectError("allgather a\n  let x = pow(2, 63)\n", preset("dgx-a100"), 2, 11, "overflows 64-bit integers");
  expectError("allgather a\n  let x = pow(2, -1)\n", preset("dgx-a100"), 2, 18, "must not be negative");
  expectError("allgather a\n  let x = log2(0)\n", preset("dgx-a100"), 2, 16, "at least 1");
  expectError("allgather a\n  let x = 9223372036854775807 + 1\n", preset("dgx-a100"), 2, 11, "overflows");
  expectError("allgather a\n  let x = min(1)\n", preset("dgx-a100"), 2, 11, "min takes 2 arguments");
}

TEST(ExpandErrors, RankOutOfRange) {
  expectError("allgather a\n  send block(0) from rank(nodes, 0) to 1\n", preset("dgx-a100x2"), 2, 27,
              "rank(nodes, 0) = rank(2, 0): node 2 is out of range: the cluster has 2 nodes (0..1)");
  expectError("allgather a\n  send block(0) from 0 to ranks\n", preset("dgx-a100x2"), 2, 27,
              "destination rank ranks = 16 is out of range");
  expectError("allgather a\n  let x = nodeof(-1)\n", preset("dgx-a100x2"), 2, 18, "rank -1 is out of range");
  expectError("allgather a\n  allgather {0, 1, 16} by ring\n", preset("dgx-a100x2"), 2, 20, "rank 16 is out of range");
  expectError("allgather a\n  allgather node(2) by ring\n", preset("dgx-a100x2"), 2, 18, "node 2 is out of range");
  expectError("allgather a\n  allgather rail(gpus) by ring\n", preset("dgx-a100x2"), 2, 18, "rail 8 is out of range");
}

TEST(ExpandErrors, DuplicateAndEmptyGroups) {
  expectError("allgather a\n  allgather {0, 1, 1} by ring\n", preset("dgx-a100"), 2, 20, "rank 1 appears twice in");
  expectError("allgather a\n  allgather {i % 4 for i in 8} by ring\n", preset("dgx-a100"), 2, 14,
              "rank 0 appears twice in {i % 4 for i in 8} (for i = 4)");
  expectError("allgather a\n  allgather {i for i in 3..3} by ring\n", preset("dgx-a100"), 2, 13, "is empty");
}

TEST(ExpandErrors, PowerOfTwoStrategiesOnSixMembers) {
  expectError("allgather a\n  for n in nodes: allgather node(n) by recursive_doubling\n", smallTopology(2, 6), 2, 19,
              "allgather by recursive_doubling needs a group of a power-of-two size; node(0) has 6 members (use bruck "
              "or pat)");
  expectError("reducescatter a\n  reducescatter {0, 1, 2, 3, 4, 5} by recursive_halving\n", preset("dgx-a100"), 2, 3,
              "{0, 1, 2, 3, 4, 5} has 6 members (use ring or pat)");
}

TEST(ExpandErrors, WrongOperationOrStrategyForTheCollective) {
  expectError("allgather a\n  reducescatter all by ring\n", preset("dgx-a100"), 2, 3,
              "allgather data has no partial sums to reduce; use allgather/broadcast/send");
  expectError("broadcast a\n  allreduce all by ring\n", preset("dgx-a100"), 2, 3, "broadcast data has no partial sums");
  expectError("allreduce a\n  alltoall all by direct\n", preset("dgx-a100"), 2, 3, "alltoall moves block(i, j)");
  expectError("alltoall a\n  allgather all by direct\n", preset("dgx-a100"), 2, 3, "use alltoall/send");
  expectError("allgather a\n  allgather all by tree\n", preset("dgx-a100"), 2, 3,
              "allgather does not support strategy 'tree'; use ring, direct, recursive_doubling, bruck or pat");
  expectError("broadcast a\n  broadcast node(1) from 0 by tree\n", preset("dgx-a100x2"), 2, 26,
              "rank 0 is not a member of node(1)");
}

TEST(ExpandErrors, CountedTwice) {
  expectError("allreduce a\n  allreduce node(0) by ring\n  allreduce {0, 1} by direct\n", preset("dgx-a100x2"), 3, 3,
              "rank 0 and rank 1 both hold rank 0's contribution to block 0: adding them up would count it twice");
  expectError("allreduce a\n  allreduce {0, 1} by direct\n  send block(0) from 0 to 1\n", preset("dgx-a100"), 3, 3,
              "rank 1 already holds rank 0's contribution to block 0: adding it again would count it twice");
}

TEST(ExpandErrors, OverwritingAPartialSum) {
  expectError("allreduce a\n  broadcast node(0) from 0 by direct\n", preset("dgx-a100"), 2, 3,
              "would overwrite rank 1's partial sum of block 0; reduce it");
  expectError("reducescatter a\n  allgather node(0) by ring\n", preset("dgx-a100"), 2, 3,
              "rank 0 and rank 1 hold different partial values of block 0");
}

TEST(ExpandErrors, SendingWhatTheSenderLacks) {
  expectError("allgather a\n  send block(5) from 0 to 1\n", preset("dgx-a100"), 2, 3,
              "rank 0 holds nothing of block 5 (rank 5's data) at this point");
  expectError("reduce a\n  send block(0) from 1 to 2\n  send block(0) from 1 to 3\n", preset("dgx-a100"), 3, 3,
              "rank 1 holds nothing of the data at this point");
  expectError("broadcast a\n  broadcast node(1) from 8 by tree\n", preset("dgx-a100x2"), 2, 3,
              "rank 8 holds nothing of the data at this point");
}

TEST(ExpandErrors, MissingPieceAtTheEnd) {
  expectError("allgather a\n  allgather node(0) by ring\n", preset("dgx-a100x2"), 1, 1,
              "at the end rank 0 lacks block 8 (rank 8's data): no statement delivers it");
  expectError("reducescatter a\n  reducescatter node(0) by ring\n", preset("dgx-a100x2"), 1, 1,
              "at the end rank 0 holds an incomplete sum of block 0: the contributions of ranks 8, 9, 10, 11 and 4 "
              "more are missing");
  expectError("alltoall a\n  split 2\n", smallTopology(1, 2), 1, 1,
              "at the end rank 0 lacks part 0 of block 2 (rank 1 "
              "-> rank 0)");
}

TEST(ExpandErrors, SplitRules) {
  expectError("allgather a\n  split 2\n  split 2\n", preset("dgx-a100"), 3, 3,
              "split may appear only once; the data was already split at line 2");
  expectError("allgather a\n  allgather node(0) by ring\n  split 2\n", preset("dgx-a100"), 3, 3,
              "split must come before any group operation or send; the first one is at line 2");
  expectError("allgather a\n  split 65\n", preset("dgx-a100"), 2, 9, "in 1..64");
  expectError("allgather a\n  for i in 2: split 2\n", preset("dgx-a100"), 2, 15, "split may appear only once");
}

TEST(ExpandErrors, PartSelection) {
  expectError("allgather a\n  split 2\n  allgather all by ring part 2\n", preset("dgx-a100"), 3, 30,
              "part 2 is out of range: the data has 2 parts (0..1)");
  expectError("allgather a\n  allgather all by ring part 1\n", preset("dgx-a100"), 2, 30, "split cuts it into more");
  expectError("allgather a\n  split 4\n  allgather all by ring parts 2..2\n", preset("dgx-a100"), 3, 31,
              "selects no part");
}

TEST(ExpandErrors, TooManyTransfersOrIterations) {
  ExpandOptions opt;
  opt.maxTransfers = 100;
  expectError("allgather a\n  allgather all by direct\n", preset("dgx-a100x4"), 2, 3,
              "allgather all by direct: the program needs more than 100 transfers", opt);
  ExpandOptions few;
  few.maxIterations = 1000;
  expectError("allgather a\n  for i in 100:\n    for j in 100:\n      let x = i * j\n", preset("dgx-a100"), 3, 5,
              "'for j in 100' would run 100 more iterations; the program may run at most 1000", few);
}

TEST(ExpandErrors, Rebinding) {
  expectError("allgather a\n  let x = 1\n  let x = 2\n", preset("dgx-a100"), 3, 3,
              "'x' is already bound (line 2); names cannot be rebound");
  expectError("allgather a\n  let nodes = 3\n", preset("dgx-a100"), 2, 3, "'nodes' is a built-in name");
  expectError("allgather a\n  for g in gpus:\n    for g in 2: let y = g\n", preset("dgx-a100"), 3, 5,
              "'g' is already bound");
}

TEST(ExpandErrors, Relays) {
  expectError("alltoall a\n  send block(0, 1) from 0 to 1 via 2, 3\n", preset("dgx-a100"), 2, 39,
              "only one relay per send is compiled today");
  expectError("alltoall a\n  send block(0, 1) from 0 to 1 via 1\n", preset("dgx-a100"), 2, 36,
              "the relay must be a third rank, not the destination");
  expectError("alltoall a\n  send block(1) from 0 to 1\n", preset("dgx-a100"), 2, 3, "block(i, j)");
  expectError("allgather a\n  send block(8) from 0 to 1\n", preset("dgx-a100"), 2, 14, "block 8 is out of range");
}

TEST(ExpandErrors, OneErrorPerStatementAndIndependentOnesAllReported) {
  const ExpandResult r = expandText(R"(allgather a
  for i in 4:
    let y = i / 0
  let z = unknown
  let w = z + 1
  allgather all by ring
)",
                                    preset("dgx-a100"));
  ASSERT_EQ(r.errors.size(), 2u) << errorsOf(r);  // w is not reported: z already was
  EXPECT_EQ(r.errors[0].line, 3);
  EXPECT_EQ(r.errors[1].line, 4);
  ExpandOptions one;
  one.maxErrors = 1;
  EXPECT_EQ(expandText("allgather a\n  let x = 1 / 0\n  let y = 1 / 0\n", preset("dgx-a100"), one).errors.size(), 1u);
}

TEST(ExpandErrors, BadOptionsAndTopologies) {
  ExpandOptions opt;
  opt.root = 8;
  expectError("broadcast a\n  broadcast all from root by tree\n", preset("dgx-a100"), 1, 1, "root 8 is out of range",
              opt);
  core::Topology empty = smallTopology(1, 1);
  empty.gpusPerNode = 0;
  expectError("allgather a\n", empty, 1, 1, "expected 1..");
}

// ---- hand-built trees the parser never makes: reported, never a crash ----

Expr num(std::int64_t v) {
  Expr e;
  e.kind = ExprKind::Int;
  e.value = v;
  e.loc = {2, 9};
  return e;
}

TEST(ExpandRobustness, MalformedTreesAreReported) {
  const core::Topology t = preset("dgx-a100");
  Program p;
  p.collective = Collective::AllGather;
  p.name = "x";
  p.loc = {1, 1};
  Stmt let;
  let.kind = StmtKind::Let;
  let.name = "x";
  let.loc = {2, 3};
  Expr bad;
  bad.kind = ExprKind::Binary;
  bad.text = "+";
  bad.loc = {2, 9};
  bad.args.push_back(num(1));  // one operand only
  let.value = bad;
  p.body.push_back(let);
  ExpandResult r = expand(p, t, "h.ofl");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("malformed expression"), std::string::npos);

  // Deep nesting: refused with a message instead of exhausting the stack.
  Expr deep = num(1);
  for (int i = 0; i < 5000; ++i) {
    Expr u;
    u.kind = ExprKind::Unary;
    u.text = "-";
    u.loc = {2, 9};
    u.args.push_back(std::move(deep));
    deep = std::move(u);
  }
  p.body[0].value = std::move(deep);
  r = expand(p, t, "h.ofl");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("nested"), std::string::npos);

  // A custom collective, an operation that is no collective, a statement kind out of range.
  Program q = p;
  q.body.clear();
  q.collective = Collective::Custom;
  EXPECT_FALSE(expand(q, t, "h.ofl").ok());
  q.collective = Collective::AllGather;
  Stmt op;
  op.kind = StmtKind::GroupOp;
  op.op = Collective::Custom;
  op.loc = {2, 3};
  q.body.push_back(op);
  Stmt weird;
  weird.kind = static_cast<StmtKind>(77);
  weird.loc = {3, 3};
  q.body.push_back(weird);
  r = expand(q, t, "h.ofl");
  ASSERT_EQ(r.errors.size(), 2u) << errorsOf(r);

  // A list group with no members, a node group with no index, a send with no block.
  q.body.clear();
  op.op = Collective::AllGather;
  op.group.kind = GroupKind::List;
  q.body.push_back(op);
  op.group.kind = GroupKind::Node;
  op.loc = {3, 3};
  q.body.push_back(op);
  Stmt send;
  send.kind = StmtKind::Send;
  send.loc = {4, 3};
  q.body.push_back(send);
  r = expand(q, t, "h.ofl");
  EXPECT_EQ(r.errors.size(), 3u) << errorsOf(r);
}

}  // namespace
}  // namespace optiflow::dsl
