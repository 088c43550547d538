// Node symmetry of a schedule on its cluster (docs/simulator.md, "Symmetric schedules"): which renumberings of the
// nodes map every rank's program onto another rank's, so that simulate() can run the nodes standing for all.
#include <cstddef>
#include <string_view>

#include "optiflow/sim/simulator.h"

namespace optiflow::sim {

namespace {

// Whether rank b's program is rank a's with every peer renumbered by mapRank: the same blocks in the same order (ids,
// channels, peers), the same steps (ops, counts, dependencies). Buffers and offsets do not enter the timing.
template <class MapRank>
bool sameShape(const core::RankProgram& a, const core::RankProgram& b, int n, const MapRank& mapRank) {
  if (a.threadBlocks.size() != b.threadBlocks.size()) return false;
  auto peer = [&](int p) { return p == -1 ? -1 : mapRank(p); };
  for (std::size_t i = 0; i < a.threadBlocks.size(); ++i) {
    const core::ThreadBlock& x = a.threadBlocks[i];
    const core::ThreadBlock& y = b.threadBlocks[i];
    if (x.id != y.id || x.channel != y.channel || x.steps.size() != y.steps.size()) return false;
    for (int p : {x.sendPeer, x.recvPeer}) {
      if (p != -1 && (p < 0 || p >= n)) return false;
    }
    if (peer(x.sendPeer) != y.sendPeer || peer(x.recvPeer) != y.recvPeer) return false;
    for (std::size_t k = 0; k < x.steps.size(); ++k) {
      const core::Step& u = x.steps[k];
      const core::Step& v = y.steps[k];
      if (u.op != v.op || u.count != v.count || u.deps != v.deps) return false;
    }
  }
  return true;
}

}  // namespace

std::string_view toString(NodeSymmetry::Kind k) {
  switch (k) {
    case NodeSymmetry::Kind::None:
      return "none";
    case NodeSymmetry::Kind::Cyclic:
      return "cyclic";
    case NodeSymmetry::Kind::Xor:
      return "xor";
  }
  return "?";
}

NodeSymmetry nodeSymmetry(const core::Schedule& schedule, const Network& network) {
  const core::Topology& t = network.topology();
  const int n = t.nRanks();
  const int nodes = t.nodes;
  if (nodes < 2 || schedule.nRanks != n || static_cast<int>(schedule.ranks.size()) != n) return {};
  auto invariant = [&](auto nodeMap) {
    auto mapRank = [&](int r) { return t.rankOf(nodeMap(t.nodeOf(r)), t.localOf(r)); };
    for (int r = 0; r < n; ++r) {
      if (!sameShape(schedule.ranks[r], schedule.ranks[mapRank(r)], n, mapRank)) return false;
    }
    return true;
  };
  const bool powerOfTwo = (nodes & (nodes - 1)) == 0;
  for (int period = 1; period <= nodes / 2; ++period) {
    if (nodes % period != 0) continue;
    // A shift by `period` generates the shifts by its multiples; the bits from `period` up generate the xors.
    if (invariant([&](int m) { return (m + period) % nodes; })) {
      return {NodeSymmetry::Kind::Cyclic, period, nodes / period};
    }
    if (!powerOfTwo || (period & (period - 1)) != 0 || nodes <= 2) continue;
    bool all = true;
    for (int bit = period; all && bit < nodes; bit <<= 1) all = invariant([bit](int m) { return m ^ bit; });
    if (all) return {NodeSymmetry::Kind::Xor, period, nodes / period};
  }
  return {};
}

}  // namespace optiflow::sim
