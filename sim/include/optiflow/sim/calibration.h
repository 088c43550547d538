// What a calibration changes in the two models of collective times, relative to their defaults: the simulator
// (SimParams) and NCCL's own cost model (nccl_model.h). Both share one set of parameters with one meaning, fitted
// separately for each model by `optiflow calibrate` from nccl-tests logs (docs/calibration.md); the file format is
// calib/calibration_file.h's.
//
// A calibration changes times, never NCCL's choice: NCCL picks its algorithm, protocol and channels from its own
// uncalibrated constants, so the NCCL model still predicts the choice from them and only the time of that choice is
// calibrated.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim {

// How kernels are launched in what is timed: CUDA-graph replay (nccl-tests -G N) or a host launch per call.
enum class LaunchMode : std::uint8_t { Graph, Host };
std::string_view toString(LaunchMode m);  // "graph", "host"

// Limits of every factor (the fit's box): a factor outside them is an error in the file, not a calibration.
inline constexpr double kMinCalibrationScale = 0.02;
inline constexpr double kMaxCalibrationScale = 50.0;
inline constexpr double kMaxCalibrationLaunchUs = 10000.0;
// The largest bandwidth factor of a protocol (protocolIndex order): what takes its efficiency to 1.
double maxProtocolBandwidthScale(int protocol);

struct ModelCalibration {
  // Kernel launch per collective for each launch mode; nullopt: the mode's default (kLaunchUsCudaGraph/Host).
  std::optional<double> launchGraphUs;
  std::optional<double> launchHostUs;
  // Factor on every latency of a protocol (index protocolIndex: Simple, LL, LL128): the base latency, the per-hop
  // latency and, in the simulator, the per-step synchronisation.
  std::array<double, 3> latencyScale = {1.0, 1.0, 1.0};
  // Factor on the bandwidth each protocol gets out of a link (index protocolIndex): the simulator's protocol
  // efficiency and NCCL's per-protocol caps, the NCCL model's bandwidth of that protocol. At most what makes the
  // protocol carry the raw link bandwidth (Simple 1, LL 2, LL128 128/120), so the lower bound stays a bound.
  std::array<double, 3> bandwidthScale = {1.0, 1.0, 1.0};
  // Extra factor on the latency of hops that cross the network.
  double netHopLatencyScale = 1.0;
  // Factor on the effective bandwidth inside a node (NVLink, NVSwitch, PCIe) and through the NICs. The simulator's
  // link efficiency never exceeds 1 (a link carries at most its raw bandwidth), so the lower bound stays a bound.
  double nvlinkBandwidthScale = 1.0;
  double netBandwidthScale = 1.0;

  bool identity() const;
  friend bool operator==(const ModelCalibration&, const ModelCalibration&) = default;
};

// The launch overhead the calibration gives for `mode`.
double launchUs(const ModelCalibration& c, LaunchMode mode);

// `base` (normally the defaults) with the calibration applied, the launch set for `mode`.
SimParams calibratedSimParams(const ModelCalibration& c, LaunchMode mode, SimParams base = {});

// NCCL's model's time of the choice `p` with the calibration applied, the launch of `mode` included. The
// uncalibrated value (identity calibration) is p.timeUs + the mode's default launch. -1 when p has no choice.
double calibratedNcclTimeUs(const NcclPrediction& p, const ModelCalibration& c, LaunchMode mode);

}  // namespace optiflow::sim
