// The event-driven simulator: times a schedule IR on a Network at one message size. Every transfer moves over
// the physical path its peers imply; concurrent transfers share links max-min fairly (progressive filling,
// recomputed only for the flows whose share can change when a transfer starts or ends); the costs real executors
// pay are modelled with the constants of SimParams, each documented in docs/simulator.md with its source.
//
// Time model in one paragraph (docs/simulator.md has the details): the collective starts after a kernel launch
// and the protocol's base latency. Each thread block runs its steps in order, MSCCL-style, once per loop
// iteration (a chunk larger than the protocol's per-iteration chunk is split into iterations that pipeline through
// the same connections). A step starts when its block's previous step is done, its dependencies are done and, for
// a receive, the head of the matching send's data has arrived (the hop latency plus one slice after the send
// started: cut-through at slice granularity). A send step ends when its bytes have left (at the fair-share rates
// of the links on its path, inflated by the protocol's line overhead); a receive ends when the tail has arrived;
// a receive-and-forward ends when both its own flow has drained and its input has fully arrived plus one slice.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/network.h"

namespace optiflow::sim {

// Kernel launch overhead per collective (SimParams::launchUs). From calibration.md §2.2: A100 1-node 1 KiB
// All-Gather/All-Reduce measured 12.53/16.96 us with CUDA-graph launch (-G 1, table B) against NCCL's own
// latency model 10.8/15.0 us (§1.11) -> about 2 us left for the launch; the same sweep without graphs (table A)
// floors at 43-45 us, about 28 us above the model -> the host-launch figure. Both derived, not measured directly.
inline constexpr double kLaunchUsCudaGraph = 2.0;
inline constexpr double kLaunchUsHost = 28.0;
// The most loop iterations simulate() will simulate exactly while waiting for a steady state.
inline constexpr int kMaxAdaptiveIterations = 16;

// Index of a protocol in the per-protocol arrays below: Simple 0, LL 1, LL128 2. The arrays keep the order their
// calibration was written in; core::Protocol enumerates in NCCL's order (LL, LL128, Simple).
constexpr int protocolIndex(core::Protocol p) {
  switch (p) {
    case core::Protocol::Simple:
      return 0;
    case core::Protocol::LL:
      return 1;
    case core::Protocol::LL128:
      return 2;
  }
  return 0;
}

// Every cost constant of the simulator, in one place; the calibration tunes these defaults globally.
// Per-protocol arrays are indexed by protocolIndex (Simple, LL, LL128); per-hop-class arrays by HopClass
// (NvLink, Pci, Net).
struct SimParams {
  // Kernel launch, added once per collective. kLaunchUsCudaGraph or kLaunchUsHost (nccl-tests -G 1 or not).
  double launchUs = kLaunchUsCudaGraph;
  // Base latency per collective and protocol: NCCL's Ring row (nccl-cost-model.md §1.3): LL 6.6, LL128 14,
  // Simple 8.4 us.
  std::array<double, 3> baseLatencyUs = {8.4, 6.6, 14.0};
  // Per-step (per-hop) latency by hop class and protocol: NCCL's Ring hwLat (§1.3). A step's data head arrives
  // max(this, the path's topology latency) after the step starts: NCCL's figures are end to end and include the
  // wire of the reference machines, so the topology's latency only counts where it is larger.
  std::array<std::array<double, 3>, 3> hopLatencyUs = {{
      {3.4, 0.6, 1.9},   // NVLink: Simple, LL, LL128
      {5.7, 1.0, 2.5},   // PCI
      {14.0, 2.7, 4.0},  // NET
  }};
  // Per-step synchronisation, by hop class and protocol: every communicating step (send, receive, and the
  // receive-and-forward ops), in every loop iteration, waits this long after its prerequisites are met before it
  // moves data; it is serial within a thread block, so a block of k steps pays k x this per iteration. It stands
  // for what a real executor pays per step beyond the wire (the credit/flag handshake with the peer, the memory
  // fence of Simple, the proxy's post and completion for NET). The class of a step is the worst of its outgoing
  // and incoming paths. Fitted on calibration.md 2.2 (docs/calibration.md): NVLink Simple on data set A (A100
  // one node, 32 MiB - 8 GiB), LL128 on data set A (4 - 16 MiB), NET Simple on data set B (2 nodes x 1 and x 8
  // GPUs, 1 - 4 GiB). LL pays none (flags travel in every line; the 1 KiB - 2 MiB points leave no room for it).
  // PCI has no measurement and takes the NVLink values.
  std::array<std::array<double, 3>, 3> stepSyncUs = {{
      {9.0, 0.0, 1.0},  // NVLink: Simple, LL, LL128
      {9.0, 0.0, 1.0},  // PCI (no data: the NVLink values)
      {9.0, 0.0, 1.0},  // NET (the NVLink values: see docs/calibration.md)
  }};
  // Proxy/network overhead per step on paths that cross a NIC: NCCL_NET_OVERHEAD (§1.3), 1 us on Intel and
  // "other" hosts, 2 us on AMD; times netOverheadSimpleFactor (3) for Simple.
  double netOverheadUs = 1.0;
  double netOverheadSimpleFactor = 3.0;
  // Data bytes per wire byte (§1.3): LL carries 8 of 16 bytes, LL128 120 of 128, Simple ~all.
  std::array<double, 3> protocolEfficiency = {1.0, 0.5, 120.0 / 128.0};
  // Payload fraction of each hop class's raw (topology) bandwidth (§1.2): NVLink 20 of 25 GB/s per link (SM80;
  // SM90 is 20.6/25 = 0.824); PCIe 1.0 (topologies give PCIe in NCCL's units already); NET 24/25 = 48/50 = 0.96
  // (NCCL's GPU<->NIC PCIe path: Gen4 x16 = 24 vs HDR 25; Gen5 = 48 vs NDR 50).
  std::array<double, 3> linkEfficiency = {0.8, 1.0, 0.96};
  // MSCCL's per-iteration chunk, in data bytes: calcBytePerStep x (Simple ? MSCCL_CHUNKSTEPS = NCCL_STEPS/2 = 4
  // : 1) (msccl_kernel.h). With the buffers of §1.3: Simple 512 KiB x 4 = 2 MiB; LL 64 KiB step / 2 = 32 KiB;
  // LL128 600 KiB step x 120/128 = 562.5 KiB.
  std::array<double, 3> iterationChunkBytes = {2.0 * 1048576, 32.0 * 1024, 562.5 * 1024};
  // Cut-through granularity: a forwarding step can start once one slice has arrived. Simple: MSCCL_SLICESTEPS =
  // NCCL_STEPS/4 = 2 steps = 1 MiB; LL and LL128 flag every line, so 0 (pure latency).
  std::array<double, 3> sliceBytes = {1.0 * 1048576, 0.0, 0.0};
  // Per-transfer (per thread block connection) data-rate cap in GB/s, 0 = none. NCCL caps LL128 at 20 (Ampere)
  // or 36.7 (Hopper) GB/s per channel and LL at llMaxBws in total (§1.3); off by default, for the calibration.
  std::array<double, 3> flowCapGBps = {0.0, 0.0, 0.0};
  // Local copy/reduce steps (cpy, re) move count x chunk bytes at this rate. Assumption (no source in the
  // reference files): half of A100 HBM2e's ~2 TB/s, since a copy reads and writes.
  double localCopyGBps = 1000.0;
  // Simulate at most this many loop iterations exactly, extrapolate the rest from the last iteration's
  // increment (docs/simulator.md). >= 1.
  int maxExactIterations = 4;  // the first try; simulate() adds more while the pipeline is not yet steady
  // Refuse schedules whose steps x exactly simulated iterations exceed this (memory guard, ~40 bytes each).
  std::uint64_t maxStepInstances = 16u << 20;
  // Use this protocol instead of the schedule's.
  std::optional<core::Protocol> protocol;
  // Keep at most this many entries of the critical path (the ones nearest the end).
  std::size_t maxCriticalPath = 100000;
  // Simulate one node for all of them where the schedule is node-symmetric (nodeSymmetry): the same result,
  // docs/simulator.md "Symmetric schedules"; off, every rank is simulated.
  bool foldSymmetricNodes = true;
  // > 0: stop once a step ends after this time, for a caller that only needs to know whether the schedule finishes
  // by then (the result is then SimResult::cutOff). Where simulate() would extrapolate from iterations that are not
  // yet steady it runs on: only a time it would return can be cut.
  double stopAtUs = 0;
  // Wall clock: past it the run gives up (SimResult::timedOut), for a caller with a time budget. Checked every few
  // thousand events, so a run overshoots it by milliseconds.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// How a schedule looks alike from many nodes of its cluster: renumbering the nodes by every shift by a multiple of
// `period` (Cyclic), or every xor with a multiple of it (Xor, power-of-two node counts), gives every rank the program
// of the rank it is renumbered to, with peers renumbered alike. The nodes are all alike too, so every node's ranks run
// the steps of the node in 0 .. period-1 they are renumbered to, at the same times: simulating those nodes is exact
// (NCCL's rings, which alternate direction from node to node, have period 2; most programs period 1).
struct NodeSymmetry {
  enum class Kind : std::uint8_t { None, Cyclic, Xor };
  Kind kind = Kind::None;
  int period = 0;  // the nodes 0 .. period-1 stand for all
  int fold = 1;    // nodes / period: how many nodes each simulated node stands for
  friend bool operator==(const NodeSymmetry&, const NodeSymmetry&) = default;
};
std::string_view toString(NodeSymmetry::Kind k);
// The symmetry simulate() folds, with the least period (kind None on one node, for a malformed schedule, or where no
// period below the node count fits). Compares what the timing reads of every rank program (blocks, peers, channels,
// ops, counts, dependencies): a pass over the steps per period tried (and per bit, for Xor).
NodeSymmetry nodeSymmetry(const core::Schedule& schedule, const Network& network);

struct LinkUsage {
  double bytes = 0;         // wire bytes carried (protocol overhead included), all iterations
  double busyUs = 0;        // time with at least one transfer on the link (exactly simulated part)
  double busyFraction = 0;  // busyUs / the exactly simulated data-movement time
  double utilisation = 0;   // bytes / (effective bandwidth x data-movement time); 1 = saturated throughout
};

// Why a step on the critical path started (or ended) when it did.
enum class WaitKind : std::uint8_t {
  Start,       // nothing: the collective's start
  BlockOrder,  // the previous step of its thread block
  Dependency,  // a dependency (another block of the same rank)
  DataHead,    // the head of the incoming data
  DataTail,    // it ended when the tail of its incoming data arrived
};
std::string_view toString(WaitKind k);

struct CriticalStep {
  int rank = 0;
  int tb = 0;  // thread block id
  int step = 0;
  int iteration = 0;
  core::StepOp op = core::StepOp::Nop;
  int peer = -1;  // the rank it sent to (sending ops) or received from (receives); -1 for local ops
  double startUs = 0;
  double endUs = 0;
  WaitKind waitedOn = WaitKind::Start;  // what determined startUs (or endUs for DataTail)
};

struct SimResult {
  bool ok = false;
  std::string error;  // set when !ok
  std::uint64_t sizeBytes = 0;
  core::Protocol protocol = core::Protocol::Simple;
  double timeUs = 0;             // launch + base latency + data movement
  double algbwGBps = 0;          // sizeBytes / timeUs (nccl-tests)
  double busbwGBps = 0;          // algbw x core::busBandwidthFactor
  double chunkBytes = 0;         // sizeBytes / chunksPerLoop
  std::uint64_t iterations = 1;  // loop iterations the size needs
  int simulatedIterations = 1;   // of which simulated exactly
  bool extrapolated = false;     // iterations > simulatedIterations
  // The last exactly simulated iterations took the same time (within 1%), so extrapolating from them is sound.
  // simulate() doubles the exact iterations (up to kMaxAdaptiveIterations) until this holds.
  bool steady = true;
  double startUs = 0;                      // when data movement starts (launch + base latency)
  std::vector<LinkUsage> links;            // by Network link id
  int bottleneckLink = -1;                 // highest utilisation (then most bytes, then lowest id); -1 if none used
  std::vector<CriticalStep> criticalPath;  // first to last; the last entry is the last step to finish
  std::uint64_t steps = 0;                 // step instances simulated
  std::uint64_t events = 0;                // events processed
  // Stopped past SimParams::stopAtUs: timeUs is when it stopped, above stopAtUs and never above the full simulation's
  // time; links, bottleneck and critical path are empty.
  bool cutOff = false;
  bool timedOut = false;  // gave up at SimParams::deadline: ok is false
  NodeSymmetry symmetry;  // folded (kind != None): only the ranks of nodes 0 .. period-1 were simulated (steps, events,
                          // the critical path)
};

// Never throws for a bad schedule and never crashes: problems (rank count different from the network's, bad
// peers, unmatched sends and receives, deadlock, ...) come back as ok = false with a message.
SimResult simulate(const core::Schedule& schedule, const Network& network, std::uint64_t sizeBytes,
                   const SimParams& params = {});
SimResult simulate(const core::Schedule& schedule, const core::Topology& topology, std::uint64_t sizeBytes,
                   const SimParams& params = {});

// A lower bound on simulate()'s time for the same inputs, without running events: the larger of the busiest link's
// bytes at its effective capacity and, per thread block, its steps back to back at their own fastest (per-step
// synchronisation plus each transfer alone at its path's capacity) over the iterations simulate() always runs
// exactly. Costs one pass over the steps; a search uses it to skip options that cannot win. 0 when the schedule is
// malformed (simulate() says why).
double lowerBoundUs(const core::Schedule& schedule, const Network& network, std::uint64_t sizeBytes,
                    const SimParams& params = {});

// lowerBoundUs of one schedule at any size. Both of the bound's sums are linear in the bytes a step moves (per
// block: its synchronisation plus time per byte; per link: bytes per chunk byte over its capacity), so the steps are
// read once and each size then costs a pass over the few blocks that can be the slowest. lowerBoundUs is this
// curve at one size; a search bounds an option at every size from one layout (synth::LayoutBounds).
class BoundCurve {
 public:
  BoundCurve() = default;
  bool ok() const { return ok_; }  // false: a malformed schedule (at() is 0, as lowerBoundUs)
  double at(std::uint64_t sizeBytes) const;

 private:
  friend BoundCurve boundCurve(const core::Schedule&, const Network&, const SimParams&);
  struct Chain {
    double syncUs;     // the block's steps' synchronisation, per iteration
    double usPerByte;  // its transfers alone at their path's capacity, per byte of an iteration's chunk
  };
  bool ok_ = false;
  double t0Us_ = 0;
  int chunksPerLoop_ = 1;
  double iterationChunkBytes_ = 1;
  int maxExactIterations_ = 1;
  std::uint64_t maxStepInstances_ = 0;
  int steps_ = 0;
  double linkUsPerByte_ = 0;   // the busiest link: us per byte of an iteration's chunk, per iteration
  std::vector<Chain> chains_;  // the blocks that are the slowest at some size: syncUs falling, usPerByte rising
};
BoundCurve boundCurve(const core::Schedule& schedule, const Network& network, const SimParams& params = {});

// {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "protocol", "iterations", "extrapolated",
//  "bottleneck": {"link", "utilisation", "bytes"}, "critical_path": [...] (last maxEntries steps)} or {"error"}.
nlohmann::json simResultToJson(const SimResult& r, const Network& network, std::size_t maxCriticalEntries = 20);

}  // namespace optiflow::sim
