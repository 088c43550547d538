// NCCL's algorithms as schedule IR, so that the simulator times NCCL and our schedules with the same engine.
//
// Rings (nccl-cost-model.md 1.9): every channel is a ring with its own rank order; on several nodes the order is
// rail-aligned: the ring walks all GPUs of a node and crosses to the next node on one rail (the exit GPU of one
// node and the entry GPU of the next have the same local index, so the hop stays on that rail's NIC pair). Entry
// and exit rotate with the channel. Nodes alternate direction (forward, backward, ...), which keeps every
// cross-node hop on one rail when the node count is even; with an odd count the hop that closes the ring joins
// two rails (documented in docs/nccl-model.md).
//
// Tree (1.5 "Tree AllReduce", 1.4): NCCL's double binary tree across nodes, the node's GPUs as a chain below the
// node's head GPU; even channels use the first tree, odd channels the second (mirror for an even node count, shift
// for an odd one), heads rotate over the rails. Reduce up the tree, then broadcast down, pipelined in chunks, with
// separate blocks for the up and the down direction so the two phases overlap as in NCCL.
#pragma once

#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim {

struct NcclScheduleOptions {
  int channels = 1;  // parallel rings / trees (NCCL's runtime channel count)
  bool inPlace = false;
  core::Protocol protocol = core::Protocol::Simple;
  int pipelineChunks = 4;  // chunks per channel for chains and trees (Broadcast, Reduce, Tree AllReduce)
  int root = 0;            // Broadcast and Reduce
};

// NCCL-like ring orders, `count` of them (channel c of a schedule uses order c % count): see the file comment.
std::vector<std::vector<int>> ncclRingOrders(const core::Topology& topo, int count);

// Rings over explicit rank orders (each a permutation of 0..n-1); channel c uses orders[c % orders.size()].
// The chunk layout is that of core::fixtures (rank-major: chunk r * channels + c is rank r's piece on channel c).
core::Schedule orderedRingAllGather(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o);
core::Schedule orderedRingReduceScatter(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o);
core::Schedule orderedRingAllReduce(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o);
// Chains along the ring from the root (Broadcast) or ending at the root (Reduce), `pipelineChunks` per channel.
core::Schedule orderedRingBroadcast(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o);
core::Schedule orderedRingReduce(const std::vector<std::vector<int>>& orders, const NcclScheduleOptions& o);

// The same on NCCL's ring orders for `topo` (as many distinct orders as NCCL's ring graph has channels).
core::Schedule ncclRingAllGather(const core::Topology& topo, const NcclScheduleOptions& o);
core::Schedule ncclRingReduceScatter(const core::Topology& topo, const NcclScheduleOptions& o);
core::Schedule ncclRingAllReduce(const core::Topology& topo, const NcclScheduleOptions& o);
core::Schedule ncclRingBroadcast(const core::Topology& topo, const NcclScheduleOptions& o);
core::Schedule ncclRingReduce(const core::Topology& topo, const NcclScheduleOptions& o);

// Node-level binary trees of the double binary tree over `nNodes` nodes: parent of each node (-1 for the root).
// tree 0 is an in-order binary tree; tree 1 mirrors it (even count) or shifts it by one (odd count).
std::vector<int> ncclTreeParents(int nNodes, int tree);

core::Schedule ncclTreeAllReduce(const core::Topology& topo, const NcclScheduleOptions& o);

// The schedule matching the model's choice: Ring (all five collectives) or Tree (AllReduce), with the
// prediction's runtime channel count and protocol. `base` supplies inPlace, pipelineChunks and root. NVLS, PAT
// and CollNet are not expressible in the IR (in-switch reduction / log-distance peers not modelled here) and
// give an error.
core::Result<core::Schedule> ncclScheduleFor(const core::Topology& topo, core::Collective collective,
                                             const NcclPrediction& prediction, const NcclScheduleOptions& base = {});

// The SimParams for timing the schedule ncclScheduleFor builds for `prediction`: the defaults plus what depends on
// the host, the GPU and NCCL's choice as NCCL's own model sees them (docs/calibration.md):
// - the network post overhead per step: Intel 1 us, AMD 2 us (nccl-cost-model.md 1.3 NCCL_NET_OVERHEAD);
// - for Ring LL and LL128, NCCL's protocol bandwidth limits (1.4: Ring LL min(llMaxBw, 0.5 busBw), Ring LL128
//   min(0.92 busBw, nCh x perChMaxRingLL128Bw)) as a per-flow data-rate cap: the model's Ring bus bandwidth for
//   the protocol divided by the runtime channels (every channel has one flow per rank on the rank's port);
// - the launch mode of the measurement being reproduced (kLaunchUsCudaGraph or kLaunchUsHost).
SimParams ncclSimParams(const NcclPrediction& prediction, double launchUs = kLaunchUsCudaGraph);
// The same on top of `base` (a calibrated SimParams, calibration.h): its launch, latencies and link efficiencies are
// kept, a forced protocol is dropped (NCCL runs its own), and the protocol caps scale with the link efficiency of the
// class that carries them (the network on several nodes, NVLink on one).
SimParams ncclSimParams(const NcclPrediction& prediction, const SimParams& base);

}  // namespace optiflow::sim
