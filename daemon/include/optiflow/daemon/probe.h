// Measuring what this node can measure and feeding it back into the topology the simulator uses:
// - network: throughput and latency to peer nodes through the net plugin's TCP transport (optiflow::net), against a
//   ProbeResponder that every daemon runs ([probe] listen); a plain TCP control connection carries the 128-byte net
//   handles both ways;
// - GPU links: only where CUDA was found at build time (gpu_probe_cuda.cc), else reported as unavailable.
// Each result carries the simulator's prediction for the same transfer, so the gap is recorded (metrics, state dir).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/daemon/metrics.h"

namespace optiflow::daemon {

struct NetProbeResult {
  std::string peer;          // host:port
  double bandwidthGBps = 0;  // measured, one direction, probeBytes messages
  double latencyUs = 0;      // measured one-way (half the 8-byte round trip)
  double predictedGBps = 0;  // what the topology said before (NIC bandwidth)
  double predictedLatencyUs = 0;
};

class ProbeResponder {
 public:
  // Listens on host:port ("[::1]:7000" for IPv6; port 0: ephemeral). Serves probes on its own thread, a few sessions
  // at a time (each on a thread of its own, bounded by a session timeout), until destroyed; the destructor returns
  // within about 100 ms plus the time a session needs to notice the stop.
  static core::Result<std::unique_ptr<ProbeResponder>> start(const std::string& listen);
  virtual ~ProbeResponder() = default;
  virtual int port() const = 0;

  struct Stats {
    std::uint64_t served = 0;   // sessions that completed both measurements
    std::uint64_t refused = 0;  // garbage, bad requests, failed or timed-out sessions (each logged)
  };
  virtual Stats stats() const = 0;
};

// Measures bandwidth (kProbeMessages messages of `bytes`, 1..256 MiB) and latency (kProbePings 8-byte round trips) to
// a responder at `peer` (host:port). Bounded by timeoutS and by `stop` (checked at least every 50 ms); never throws.
// predictedGBps / predictedLatencyUs come from `predicted`'s first NIC (0 without NICs).
inline constexpr std::uint32_t kProbeMessages = 8;
inline constexpr std::uint64_t kMaxProbeBytes = std::uint64_t{256} << 20;  // a responder allocates this much per probe
inline constexpr std::uint32_t kProbePings = 32;
core::Result<NetProbeResult> probePeer(const std::string& peer, std::uint64_t bytes, const core::Topology& predicted,
                                       double timeoutS, const std::atomic<bool>& stop);

// The topology with the measured inter-node parameters: every NIC's bandwidthGBps / latencyUs set from the median of
// the results (unchanged when there are none). Stays valid (Topology::validate).
core::Topology applyNetProbes(const core::Topology& topology, const std::vector<NetProbeResult>& results);

// measured / predicted bandwidth: how far the simulator's NIC model was off (0 when nothing was predicted).
double probeGapRatio(const NetProbeResult& result);
// Sets optiflowd_probe_bandwidth_gbps, optiflowd_probe_latency_us and optiflowd_probe_gap_ratio for {peer}.
void recordNetProbe(Metrics& metrics, const NetProbeResult& result);

struct GpuProbeResult {
  bool available = false;
  std::string detail;            // why not ("built without CUDA", "no GPU", ...) or what was measured
  double peerBandwidthGBps = 0;  // device-to-device copy between GPU 0 and 1 (0 when one GPU)
  double hostBandwidthGBps = 0;  // pinned host to device
};
GpuProbeResult probeGpuLinks();

}  // namespace optiflow::daemon
