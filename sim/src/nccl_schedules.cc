#include "optiflow/sim/nccl_schedules.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/fixtures.h"

namespace optiflow::sim {

namespace {

using core::BufferKind;
using core::Collective;
using core::Schedule;
using core::StepOp;
using core::StepRef;
namespace fx = core::fixtures;

constexpr auto kIn = BufferKind::Input;
constexpr auto kOut = BufferKind::Output;

int mod(int a, int n) { return ((a % n) + n) % n; }

// position of every rank in each order
std::vector<std::vector<int>> positions(const std::vector<std::vector<int>>& orders) {
  std::vector<std::vector<int>> pos(orders.size());
  for (std::size_t c = 0; c < orders.size(); ++c) {
    pos[c].assign(orders[c].size(), 0);
    for (std::size_t i = 0; i < orders[c].size(); ++i) pos[c][orders[c][i]] = static_cast<int>(i);
  }
  return pos;
}

int channelsOf(const NcclScheduleOptions& o) { return std::max(1, o.channels); }

Schedule ringSkeleton(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o, Collective c,
                      int chunksPerLoop, std::string_view name) {
  const int n = orders.empty() ? 0 : static_cast<int>(orders[0].size());
  const int ch = channelsOf(o);
  Schedule s = fx::emptySchedule(c, n, chunksPerLoop, o.inPlace);
  s.name = fmt::format("nccl_ring_{}_{}r_{}ch{}", name, n, ch, o.inPlace ? "_inplace" : "");
  s.protocol = o.protocol;
  s.nChannels = ch;
  return s;
}

// Ring neighbours of `r` on channel c.
struct Ring {
  const std::vector<int>* order;
  int n;
  int i;  // position of the rank
  int at(int offset) const { return (*order)[static_cast<std::size_t>(mod(i + offset, n))]; }
};

}  // namespace

std::vector<std::vector<int>> ncclRingOrders(const core::Topology& t, int count) {
  const int ppn = std::max(1, t.gpusPerNode);
  const int nodes = std::max(1, t.nodes);
  std::vector<std::vector<int>> orders;
  for (int c = 0; c < std::max(1, count); ++c) {
    std::vector<int> local(static_cast<std::size_t>(ppn));
    for (int j = 0; j < ppn; ++j) local[static_cast<std::size_t>(j)] = mod(c + j, ppn);
    std::vector<int> order;
    order.reserve(static_cast<std::size_t>(ppn * nodes));
    for (int node = 0; node < nodes; ++node) {
      // Even nodes forward (enter at local c, leave at c - 1), odd nodes backward (enter at c - 1, leave at c):
      // each node boundary joins the same local GPU, i.e. the same rail.
      for (int j = 0; j < ppn; ++j) {
        const int l = node % 2 == 0 ? local[static_cast<std::size_t>(j)] : local[static_cast<std::size_t>(ppn - 1 - j)];
        order.push_back(t.rankOf(node, l));
      }
    }
    orders.push_back(std::move(order));
  }
  return orders;
}

namespace {

// NCCL's rings are the fixtures' rings visiting the ranks in NCCL's order.
Schedule orderedRing(Schedule (*make)(const fx::RingOptions&, const fx::RingOrders&), const fx::RingOrders& orders,
                     const NcclScheduleOptions& o, std::string_view name) {
  const int n = orders.empty() ? 0 : static_cast<int>(orders[0].size());
  const int ch = channelsOf(o);
  Schedule s = make(fx::RingOptions{.nRanks = n, .channels = ch, .inPlace = o.inPlace, .protocol = o.protocol}, orders);
  s.name = fmt::format("nccl_ring_{}_{}r_{}ch{}", name, n, ch, o.inPlace ? "_inplace" : "");
  return s;
}

}  // namespace

Schedule orderedRingAllGather(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o) {
  return orderedRing(fx::ringAllGather, orders, o, "allgather");
}

Schedule orderedRingReduceScatter(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o) {
  return orderedRing(fx::ringReduceScatter, orders, o, "reducescatter");
}

Schedule orderedRingAllReduce(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o) {
  return orderedRing(fx::ringAllReduce, orders, o, "allreduce");
}

Schedule orderedRingBroadcast(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o) {
  const int n = orders.empty() ? 0 : static_cast<int>(orders[0].size());
  const int ch = channelsOf(o);
  const int k = std::max(1, o.pipelineChunks);
  Schedule s = ringSkeleton(orders, o, Collective::Broadcast, ch * k, "broadcast");
  s.root = o.root;
  const auto pos = positions(orders);
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = ch * k;
    rp.outputChunks = o.inPlace ? 0 : ch * k;
    for (int c = 0; c < ch; ++c) {
      const std::size_t oc = static_cast<std::size_t>(c) % orders.size();
      const Ring ring{&orders[oc], n, pos[oc][r]};
      const int j = mod(pos[oc][r] - pos[oc][o.root], n);  // distance from the root along the chain
      const bool isRoot = j == 0;
      const bool isLast = j == n - 1;
      auto tb = fx::makeBlock(c, (n > 1 && !isLast) ? ring.at(1) : -1, (n > 1 && !isRoot) ? ring.at(-1) : -1, c);
      const int base = c * k;
      if (isRoot && !o.inPlace) tb.steps.push_back(fx::makeStep(StepOp::Copy, kIn, base, kOut, base, k));
      if (n > 1) {
        for (int q = 0; q < k; ++q) {
          const int idx = base + q;
          if (isRoot) {
            tb.steps.push_back(fx::makeStep(StepOp::Send, kIn, idx, kOut, idx));
          } else if (isLast) {
            tb.steps.push_back(fx::makeStep(StepOp::Recv, kOut, idx, kOut, idx));
          } else {
            tb.steps.push_back(fx::makeStep(StepOp::RecvCopySend, kOut, idx, kOut, idx));
          }
        }
      }
      if (!tb.steps.empty()) rp.threadBlocks.push_back(std::move(tb));
    }
  }
  return s;
}

Schedule orderedRingReduce(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o) {
  const int n = orders.empty() ? 0 : static_cast<int>(orders[0].size());
  const int ch = channelsOf(o);
  const int k = std::max(1, o.pipelineChunks);
  Schedule s = ringSkeleton(orders, o, Collective::Reduce, ch * k, "reduce");
  s.root = o.root;
  const auto pos = positions(orders);
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = ch * k;
    rp.outputChunks = o.inPlace ? 0 : ch * k;
    for (int c = 0; c < ch; ++c) {
      const std::size_t oc = static_cast<std::size_t>(c) % orders.size();
      const Ring ring{&orders[oc], n, pos[oc][r]};
      // The chain starts right after the root and ends at it.
      const int j = mod(pos[oc][r] - pos[oc][o.root], n);
      const bool isRoot = j == 0;
      const bool isFirst = j == 1 || (n == 1);
      auto tb = fx::makeBlock(c, (n > 1 && !isRoot) ? ring.at(1) : -1, (n > 1 && !isFirst) ? ring.at(-1) : -1, c);
      const int base = c * k;
      for (int q = 0; q < k; ++q) {
        const int idx = base + q;
        if (n == 1) {
          if (!o.inPlace) tb.steps.push_back(fx::makeStep(StepOp::Copy, kIn, base, kOut, base, k));
          break;
        }
        if (isRoot) {
          tb.steps.push_back(fx::makeStep(StepOp::RecvReduceCopy, kIn, idx, kOut, idx));
        } else if (isFirst) {
          tb.steps.push_back(fx::makeStep(StepOp::Send, kIn, idx, kIn, idx));
        } else {
          tb.steps.push_back(fx::makeStep(StepOp::RecvReduceSend, kIn, idx, kIn, idx));
        }
      }
      if (!tb.steps.empty()) rp.threadBlocks.push_back(std::move(tb));
    }
  }
  return s;
}

namespace {

std::vector<std::vector<int>> topoOrders(const core::Topology& t) {
  const NcclTuning tu = ncclTune(t);
  return ncclRingOrders(t, std::max(1, tu.ring.nChannels));
}

}  // namespace

Schedule ncclRingAllGather(const core::Topology& t, const NcclScheduleOptions& o) {
  return orderedRingAllGather(topoOrders(t), o);
}
Schedule ncclRingReduceScatter(const core::Topology& t, const NcclScheduleOptions& o) {
  return orderedRingReduceScatter(topoOrders(t), o);
}
Schedule ncclRingAllReduce(const core::Topology& t, const NcclScheduleOptions& o) {
  return orderedRingAllReduce(topoOrders(t), o);
}
Schedule ncclRingBroadcast(const core::Topology& t, const NcclScheduleOptions& o) {
  return orderedRingBroadcast(topoOrders(t), o);
}
Schedule ncclRingReduce(const core::Topology& t, const NcclScheduleOptions& o) {
  return orderedRingReduce(topoOrders(t), o);
}

std::vector<int> ncclTreeParents(int nNodes, int tree) {
  std::vector<int> parent(static_cast<std::size_t>(std::max(0, nNodes)), -1);
  if (nNodes <= 1) return parent;
  // In-order binary tree on x = v + 1 in 1..N: x with lowest set bit b hangs under x + b or x - b, whichever has
  // lowest bit 2b; parents beyond N are skipped upwards. The root is the highest power of two <= N.
  auto parent0 = [nNodes](int v) {
    int x = v + 1;
    int root = 1;
    while (root * 2 <= nNodes) root *= 2;
    if (x == root) return -1;
    while (true) {
      const int b = x & -x;
      const int p = (x | (2 * b)) & ~b;
      if (p <= nNodes) return p - 1;
      x = p;
    }
  };
  for (int v = 0; v < nNodes; ++v) {
    if (tree == 0) {
      parent[static_cast<std::size_t>(v)] = parent0(v);
    } else if (nNodes % 2 == 0) {
      // mirror: v plays the role of N-1-v
      const int p = parent0(nNodes - 1 - v);
      parent[static_cast<std::size_t>(v)] = p < 0 ? -1 : nNodes - 1 - p;
    } else {
      // shift: v plays the role of v-1
      const int p = parent0(mod(v - 1, nNodes));
      parent[static_cast<std::size_t>(v)] = p < 0 ? -1 : mod(p + 1, nNodes);
    }
  }
  return parent;
}

Schedule ncclTreeAllReduce(const core::Topology& t, const NcclScheduleOptions& o) {
  const int ppn = std::max(1, t.gpusPerNode);
  const int nodes = std::max(1, t.nodes);
  const int n = ppn * nodes;
  const int ch = channelsOf(o);
  const int k = std::max(1, o.pipelineChunks);
  Schedule s = fx::emptySchedule(Collective::AllReduce, n, ch * k, o.inPlace);
  s.name = fmt::format("nccl_tree_allreduce_{}r_{}ch_{}k{}", n, ch, k, o.inPlace ? "_inplace" : "");
  s.protocol = o.protocol;
  s.nChannels = ch;
  const std::vector<int> trees[2] = {ncclTreeParents(nodes, 0), ncclTreeParents(nodes, 1)};
  for (int r = 0; r < n; ++r) {
    s.ranks[r].inputChunks = ch * k;
    s.ranks[r].outputChunks = o.inPlace ? 0 : ch * k;
  }
  for (int c = 0; c < ch; ++c) {
    const std::vector<int>& nodeParent = trees[c % 2];
    // Rails rotate over channel pairs: the pair's head is the first GPU of the next NIC, so every NIC carries trees,
    // as NCCL's tree search takes each NIC in turn (with a NIC per GPU, GPU c/2; without NICs, the GPUs in turn).
    const int head = t.nics.empty() || t.nics[0].gpus.empty()
                         ? mod(c / 2, ppn)
                         : t.nics[static_cast<std::size_t>(mod(c / 2, static_cast<int>(t.nics.size())))].gpus.front();
    // Chain position j of local GPU l: head first.
    auto localAt = [&](int j) { return mod(head + j, ppn); };
    std::vector<int> parent(static_cast<std::size_t>(n), -1);
    std::vector<std::vector<int>> children(static_cast<std::size_t>(n));
    for (int node = 0; node < nodes; ++node) {
      for (int j = 0; j < ppn; ++j) {
        const int r = t.rankOf(node, localAt(j));
        int p = -1;
        if (j > 0) {
          p = t.rankOf(node, localAt(j - 1));
        } else if (nodeParent[static_cast<std::size_t>(node)] >= 0) {
          p = t.rankOf(nodeParent[static_cast<std::size_t>(node)], head);
        }
        parent[static_cast<std::size_t>(r)] = p;
        if (p >= 0) children[static_cast<std::size_t>(p)].push_back(r);
      }
    }
    for (int r = 0; r < n; ++r) {
      auto& rp = s.ranks[r];
      const int base = c * k;
      int nextId = static_cast<int>(rp.threadBlocks.size());
      const auto& kids = children[static_cast<std::size_t>(r)];
      const int p = parent[static_cast<std::size_t>(r)];
      if (kids.empty() && p < 0) {  // a single rank
        if (!o.inPlace) {
          rp.threadBlocks.push_back(
              fx::makeBlock(nextId, -1, -1, c, {fx::makeStep(StepOp::Copy, kIn, base, kOut, base, k)}));
        }
        continue;
      }
      // Up: one receiving block per child, folding into the output in child order.
      std::vector<int> upIds;
      for (std::size_t i = 0; i < kids.size(); ++i) {
        auto tb = fx::makeBlock(nextId++, -1, kids[i], c);
        for (int q = 0; q < k; ++q) {
          auto st = fx::makeStep(StepOp::RecvReduceCopy, i == 0 ? kIn : kOut, base + q, kOut, base + q);
          if (i > 0) st.deps.push_back(StepRef{upIds.back(), q});
          tb.steps.push_back(std::move(st));
        }
        upIds.push_back(tb.id);
        rp.threadBlocks.push_back(std::move(tb));
      }
      // The final value of chunk q on this rank: the last fold (root) or the value from the parent.
      int downFromId = -1;
      if (p >= 0) {
        auto up = fx::makeBlock(nextId++, p, -1, c);
        for (int q = 0; q < k; ++q) {
          auto st = fx::makeStep(StepOp::Send, kids.empty() ? kIn : kOut, base + q, kOut, base + q);
          if (!kids.empty()) st.deps.push_back(StepRef{upIds.back(), q});
          up.steps.push_back(std::move(st));
        }
        rp.threadBlocks.push_back(std::move(up));
        auto down = fx::makeBlock(nextId++, -1, p, c);
        for (int q = 0; q < k; ++q) down.steps.push_back(fx::makeStep(StepOp::Recv, kOut, base + q, kOut, base + q));
        downFromId = down.id;
        rp.threadBlocks.push_back(std::move(down));
      } else {
        downFromId = upIds.back();
      }
      for (int kid : kids) {
        auto tb = fx::makeBlock(nextId++, kid, -1, c);
        for (int q = 0; q < k; ++q) {
          auto st = fx::makeStep(StepOp::Send, kOut, base + q, kOut, base + q);
          st.deps.push_back(StepRef{downFromId, q});
          tb.steps.push_back(std::move(st));
        }
        rp.threadBlocks.push_back(std::move(tb));
      }
    }
  }
  core::recomputeHasDep(s);
  return s;
}

core::Result<Schedule> ncclScheduleFor(const core::Topology& t, Collective c, const NcclPrediction& p,
                                       const NcclScheduleOptions& base) {
  if (!p.ok()) return core::Diagnostic{"<nccl>", 0, 0, p.error};
  NcclScheduleOptions o = base;
  o.channels = std::max(1, p.channels);
  o.protocol = p.protocol;
  if (t.nRanks() != p.nRanks) {
    return core::Diagnostic{"<nccl>", 0, 0,
                            fmt::format("prediction is for {} ranks, topology has {}", p.nRanks, t.nRanks())};
  }
  if (p.algorithm == core::Algorithm::Ring) {
    switch (c) {
      case Collective::AllGather:
        return ncclRingAllGather(t, o);
      case Collective::ReduceScatter:
        return ncclRingReduceScatter(t, o);
      case Collective::AllReduce:
        return ncclRingAllReduce(t, o);
      case Collective::Broadcast:
        return ncclRingBroadcast(t, o);
      case Collective::Reduce:
        return ncclRingReduce(t, o);
      default:
        break;
    }
  }
  if (p.algorithm == core::Algorithm::Tree && c == Collective::AllReduce) return ncclTreeAllReduce(t, o);
  return core::Diagnostic{"<nccl>", 0, 0,
                          fmt::format("NCCL's {} {} is not expressible as schedule IR here (only Ring and Tree are; "
                                      "NVLS reduces inside the switch, PAT and CollNet are not generated)",
                                      toString(p.algorithm), core::toString(c))};
}

SimParams ncclSimParams(const NcclPrediction& p, double launchUs) {
  SimParams s;
  s.launchUs = launchUs;
  return ncclSimParams(p, s);
}

SimParams ncclSimParams(const NcclPrediction& p, const SimParams& base) {
  SimParams s = base;
  s.protocol.reset();
  s.netOverheadUs = p.tuning.cpu == NcclCpu::Amd ? 2.0 : 1.0;
  if (p.ok() && p.algorithm == core::Algorithm::Ring && p.channels > 0) {
    const double factor = core::busBandwidthFactor(p.collective, p.nRanks);
    const int ring = static_cast<int>(core::Algorithm::Ring);
    const std::size_t cls = p.tuning.nNodes > 1 ? 2 : 0;
    const double ratio = base.linkEfficiency[cls] / SimParams{}.linkEfficiency[cls];
    for (core::Protocol q : {core::Protocol::LL, core::Protocol::LL128}) {
      const double bw = p.bandwidth[ring][static_cast<int>(q)];
      // A calibrated protocol efficiency moves NCCL's cap of that protocol with it.
      const auto k = static_cast<std::size_t>(protocolIndex(q));
      const double protocolRatio = base.protocolEfficiency[k] / SimParams{}.protocolEfficiency[k];
      if (bw > 0) s.flowCapGBps[k] = bw * factor / p.channels * ratio * protocolRatio;
    }
  }
  return s;
}

}  // namespace optiflow::sim
