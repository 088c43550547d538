#include "optiflow/sim/calibration.h"

#include <algorithm>

#include "optiflow/core/units.h"

namespace optiflow::sim {

namespace {

constexpr int kNvLinkClass = 0;
constexpr int kPciClass = 1;
constexpr int kNetClass = 2;

}  // namespace

std::string_view toString(LaunchMode m) { return m == LaunchMode::Graph ? "graph" : "host"; }

double maxProtocolBandwidthScale(int protocol) {
  return 1.0 / SimParams{}.protocolEfficiency[static_cast<std::size_t>(protocol)];
}

bool ModelCalibration::identity() const { return *this == ModelCalibration{}; }

double launchUs(const ModelCalibration& c, LaunchMode mode) {
  if (mode == LaunchMode::Graph) return c.launchGraphUs.value_or(kLaunchUsCudaGraph);
  return c.launchHostUs.value_or(kLaunchUsHost);
}

SimParams calibratedSimParams(const ModelCalibration& c, LaunchMode mode, SimParams base) {
  base.launchUs = launchUs(c, mode);
  for (int p = 0; p < 3; ++p) {
    const double s = c.latencyScale[static_cast<std::size_t>(p)];
    base.baseLatencyUs[static_cast<std::size_t>(p)] *= s;
    for (int k = 0; k < 3; ++k) {
      const double f = k == kNetClass ? s * c.netHopLatencyScale : s;
      base.hopLatencyUs[static_cast<std::size_t>(k)][static_cast<std::size_t>(p)] *= f;
      base.stepSyncUs[static_cast<std::size_t>(k)][static_cast<std::size_t>(p)] *= f;
    }
  }
  auto scaled = [](double efficiency, double s) { return std::min(1.0, efficiency * s); };
  for (std::size_t p = 0; p < 3; ++p)
    base.protocolEfficiency[p] = scaled(base.protocolEfficiency[p], c.bandwidthScale[p]);
  base.linkEfficiency[kNvLinkClass] = scaled(base.linkEfficiency[kNvLinkClass], c.nvlinkBandwidthScale);
  base.linkEfficiency[kPciClass] = scaled(base.linkEfficiency[kPciClass], c.nvlinkBandwidthScale);
  base.linkEfficiency[kNetClass] = scaled(base.linkEfficiency[kNetClass], c.netBandwidthScale);
  return base;
}

double calibratedNcclTimeUs(const NcclPrediction& p, const ModelCalibration& c, LaunchMode mode) {
  if (!p.ok()) return -1;
  const auto a = static_cast<std::size_t>(p.algorithm);
  const auto q = static_cast<std::size_t>(p.protocol);
  const double lat = p.latency[a][q];
  const double bw = p.bandwidth[a][q];
  if (lat < 0 || bw <= 0) return -1;
  const double net = std::max(0.0, p.netLatency[a][q]);
  const double s = c.latencyScale[static_cast<std::size_t>(protocolIndex(p.protocol))];
  const double latency = (lat - net) * s + net * s * c.netHopLatencyScale;
  // NCCL's bandwidth on several nodes is the network's (bwInter, or bwIntra equal to it on two nodes).
  const double bwScale = (p.tuning.nNodes > 1 ? c.netBandwidthScale : c.nvlinkBandwidthScale) *
                         std::min(c.bandwidthScale[static_cast<std::size_t>(protocolIndex(p.protocol))],
                                  maxProtocolBandwidthScale(protocolIndex(p.protocol)));
  return launchUs(c, mode) + latency + static_cast<double>(p.sizeBytes) / (1000.0 * bw * bwScale);
}

}  // namespace optiflow::sim
