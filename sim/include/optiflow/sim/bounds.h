// Lower bounds on the completion time of a collective on a topology: no schedule, however clever, can finish
// faster on the modelled machine. Every report prints them next to a predicted time; a prediction below its bound
// is a bug in the prediction (or in the bound). The formulas, their public sources (nccl-tests' doc/PERFORMANCE.md
// for sizes and busbw, the alpha-beta model, the cut bounds of ForestColl and TACCL/TE-CCL) and what is enumerated
// are in docs/bounds.md.
//
// Sizes follow nccl-tests (the whole buffer): All-Gather output, Reduce-Scatter input, All-Reduce / Broadcast /
// Reduce buffer, All-to-All per-rank buffer. Bandwidths are the topology's raw (wire) figures: the simulator
// applies efficiencies below 1 on top, so simulated times stay at or above these bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"

namespace optiflow::sim {

// Whether switches may combine data (NVLS in an NVSwitch, SHARP in the network). Only the All-Reduce partition
// bounds depend on it (the cut bounds hold either way); allowing more gives a weaker, still valid, bound.
enum class SwitchReduction : std::uint8_t {
  Auto,        // IntraNode for NVSwitch nodes of NVLS-capable GPUs (Hopper, Blackwell), else None
  None,        // no in-network reduction anywhere
  IntraNode,   // the intra-node switches may reduce (NVLS); the inter-node fabric may not
  Everywhere,  // any switch may reduce (NVLS and SHARP)
};

struct BoundOptions {
  int root = 0;  // Broadcast / Reduce
  SwitchReduction switchReduction = SwitchReduction::Auto;
  // Use ceil(log2 N) message latencies (the single-port alpha-beta bound) as the latency bound. Off by default:
  // NVSwitch GPUs and the simulator are multi-port, where one step can reach every peer, so it is not a valid
  // bound there. The value is always reported in Bound::singlePortLatencyUs.
  bool singlePortLatency = false;
  // Topologies whose cut graph has at most this many vertices are enumerated exhaustively (2^V sets).
  int maxExhaustiveVertices = 20;
};

// Which term of the bound is the largest (the binding constraint).
enum class BoundKind : std::uint8_t {
  None,           // nothing to move (0 bytes, one rank, custom collective)
  Latency,        // the latency bound
  PerGpu,         // one GPU's ingress or egress
  PerNode,        // one node's ingress or egress through its NICs
  VertexCut,      // another vertex set of the cut graph (ForestColl's general form)
  GpuPartition,   // All-Reduce: 2(N-1) transfers per element over the sum of GPU bandwidths
  NodePartition,  // All-Reduce: 2(n-1) inter-node transfers per element over the sum of node bandwidths
};
std::string_view toString(BoundKind k);
std::string_view toString(SwitchReduction r);

struct Bound {
  std::uint64_t sizeBytes = 0;
  double latencyUs = 0;    // latency bound (independent of size)
  double bandwidthUs = 0;  // bandwidth bound: the max of the terms below
  double timeUs = 0;       // max(latencyUs, bandwidthUs): no schedule finishes earlier
  double algbwGBps = 0;    // sizeBytes / timeUs: no schedule achieves more
  double busbwGBps = 0;    // algbw x nccl-tests bus factor
  BoundKind binding = BoundKind::None;
  std::string description;  // the binding constraint in words, with its numbers

  // The bandwidth terms separately (0 where they do not apply).
  double perGpuUs = 0;             // the sets "one GPU (with the NICs only it uses)" and their complements
  double perNodeUs = 0;            // the sets "one node" and their complements (multi-node only)
  double cutUs = 0;                // every enumerated vertex set, including the per-GPU and per-node ones
  double partitionUs = 0;          // All-Reduce partition (gossip) bounds, where switch reduction allows them
  double singlePortLatencyUs = 0;  // informational unless BoundOptions::singlePortLatency
};

// The size-independent part of the bounds for one topology (the cut enumeration and the latencies), built once and
// evaluated for any collective and size. Cost of construction: see docs/bounds.md ("What is enumerated").
class BoundModel {
 public:
  // Preconditions: t.validate() is empty; options.root in [0, t.nRanks()) (see validateBoundOptions).
  explicit BoundModel(const core::Topology& t, const BoundOptions& options = {});
  ~BoundModel();
  BoundModel(BoundModel&&) noexcept;
  BoundModel& operator=(BoundModel&&) noexcept;

  Bound bound(core::Collective c, std::uint64_t sizeBytes) const;
  // What was enumerated and how many sets, e.g. "exhaustive: 2^9 = 512 sets of 9 vertices".
  std::string enumeration() const;
  // Whether switches may reduce, after resolving Auto.
  SwitchReduction switchReduction() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Error text for options that do not fit the topology (root out of range, ...); empty when fine.
std::string validateBoundOptions(const core::Topology& t, const BoundOptions& options);

// Preconditions as BoundModel. Custom collectives get an empty bound (BoundKind::None, time 0).
Bound lowerBound(const core::Topology& t, core::Collective c, std::uint64_t sizeBytes,
                 const BoundOptions& options = {});
// One bound per size, in the given order; the enumeration is done once.
std::vector<Bound> lowerBounds(const core::Topology& t, core::Collective c, const std::vector<std::uint64_t>& sizes,
                               const BoundOptions& options = {});

// A row with the fields simulate/baseline use (size_bytes, time_us, algbw_gbps, busbw_gbps) plus latency_us,
// bandwidth_us, binding and description.
nlohmann::json boundToJson(const Bound& b);

// The topology as the simulator can use it: every bandwidth multiplied by the payload fraction of its hop class
// (NVLink/NVSwitch, PCIe and host links, NIC and fabric), e.g. SimParams::linkEfficiency. Its bound is what a
// perfect schedule could reach in the simulator; the bound of the raw topology stays the one every report prints.
core::Topology effectiveTopology(const core::Topology& t, double nvlinkEfficiency, double pciEfficiency,
                                 double netEfficiency);

}  // namespace optiflow::sim
