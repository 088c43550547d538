// Calibration: every measured point of ../shared/reference/calibration.md against the simulator's prediction of
// what NCCL does (NCCL's own choice of algorithm, protocol and channels from ncclPredict, its schedule from
// ncclScheduleFor, timed by simulate() with the SimParams defaults). Targets (issue 3): within 15 % for sizes
// >= 64 MiB and within 35 % below, on every point. The table in docs/calibration.md is printed by
//   ./build/default/tests/unit/sim/sim_calibration_test --gtest_filter=Calibration.Table
// Error % = (predicted time - measured time) / measured time; a busbw point's measured time is
// size / (busbw / nccl-tests factor), so +10 % means the prediction is 10 % slower (busbw 9 % lower).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim {
namespace {

using core::Collective;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

// A published data set: its NCCL version (which selects PAT availability in the model) and its launch mode.
// Launch mode is a property of how the data set was measured (nccl-tests -G 1 or not), never a per-point knob.
struct Dataset {
  std::string id;
  std::string source;
  int ncclVersion = 0;
  bool cudaGraph = false;  // nccl-tests -G 1
};

const Dataset kAzureSweep{"A", "Azure ND A100 v4 sweep, NCCL 2.18.5 (host launch: no -G 1)", 21805, false};
const Dataset kMscclpp{"B", "mscclpp NDmv4 points, NCCL 2.17.1, -G 1 (CUDA graph)", 21701, true};
const Dataset kMaintainer{"C", "maintainer numbers (nccl-tests#149), default nccl-tests (host launch)", 23007, false};

// calibration.md 2.2-B "2 nodes x 1 GPU (1 HDR NIC each)": two NDv4 nodes, one A100 and its HDR NIC each.
core::Topology twoNodesOneGpu() {
  core::Topology t = core::presetTopology("dgx-a100x2").value();
  t.name = "a100-2x1gpu";
  t.gpusPerNode = 1;
  t.nics.resize(1);
  t.nics[0].gpus = {0};
  return t;
}

core::Topology topologyOf(const std::string& config) {
  if (config == "a100-2x1gpu") return twoNodesOneGpu();
  return core::presetTopology(config).value();
}

struct Point {
  const Dataset* dataset;
  std::string config;  // preset name or a topology built above
  Collective coll;
  std::uint64_t size;
  double busbw = -1;  // measured GB/s (nccl-tests busbw), or -1
  double us = -1;     // measured time, or -1
};

std::vector<Point> points() {
  std::vector<Point> p;
  // A. Single-node A100 AllReduce sweep (busbw; in place).
  const std::vector<std::pair<std::uint64_t, double>> sweep = {
      {kKiB, 0.04},        {8 * kKiB, 0.33},     {64 * kKiB, 2.70},    {256 * kKiB, 10.11},  {kMiB, 36.22},
      {2 * kMiB, 53.54},   {4 * kMiB, 71.43},    {8 * kMiB, 89.99},    {16 * kMiB, 109.22},  {32 * kMiB, 132.77},
      {64 * kMiB, 166.63}, {128 * kMiB, 174.18}, {256 * kMiB, 213.87}, {512 * kMiB, 221.58}, {kGiB, 228.10},
      {2 * kGiB, 230.22},  {4 * kGiB, 230.48},   {8 * kGiB, 231.58},
  };
  for (auto [s, b] : sweep) p.push_back({&kAzureSweep, "dgx-a100", Collective::AllReduce, s, b, -1});
  // B. Point measurements.
  for (const char* cfg : {"dgx-a100", "a100-2x1gpu", "dgx-a100x2"}) {
    const std::string c = cfg;
    const double agUs = c == "dgx-a100" ? 12.53 : c == "a100-2x1gpu" ? 16.08 : 33.74;
    const double arUs = c == "dgx-a100" ? 16.96 : c == "a100-2x1gpu" ? 21.27 : 35.85;
    const double agBw = c == "dgx-a100" ? 253.59 : c == "a100-2x1gpu" ? 15.84 : 177.05;
    const double arBw = c == "dgx-a100" ? 231.45 : c == "a100-2x1gpu" ? 18.65 : 183.82;
    p.push_back({&kMscclpp, c, Collective::AllGather, kKiB, -1, agUs});
    p.push_back({&kMscclpp, c, Collective::AllReduce, kKiB, -1, arUs});
    p.push_back({&kMscclpp, c, Collective::AllGather, kGiB, agBw, -1});
    p.push_back({&kMscclpp, c, Collective::AllReduce, kGiB, arBw, -1});
  }
  p.push_back({&kMscclpp, "dgx-a100x2", Collective::AllGather, 4 * kGiB, 186.01, -1});
  p.push_back({&kMscclpp, "dgx-a100x2", Collective::AllReduce, 4 * kGiB, 188.18, -1});
  // C. Maintainer numbers that give a size: single-node A100 AllReduce "~230 GB/s ... run to 8G".
  p.push_back({&kMaintainer, "dgx-a100", Collective::AllReduce, 8 * kGiB, 230.0, -1});
  return p;
}

// Points that cannot be met honestly, with the reason (docs/calibration.md "Exclusions"). Still printed; asserted
// only to stay within 35 %.
const char* exclusionReason(const Point& pt) {
  if (pt.config == "a100-2x1gpu" && pt.coll == Collective::AllGather && pt.size == kGiB) {
    return "per-NIC rate 15.8 GB/s contradicts the same HDR NIC at 22.1-23.5 GB/s in the 2 x 8 points (data set B), "
           "Azure's >= 185 Gb/s GDR health check, and the 2 x 1 AllReduce on the same NIC (18.65)";
  }
  return nullptr;
}

struct Row {
  Point pt;
  std::string choice;  // NCCL's algorithm/protocol/channels
  bool analytic = false;
  double predUs = 0;
  double predBusbw = 0;
  double measUs = 0;
  double errPct = 0;
  double limitPct = 0;
};

Row evaluate(const Point& pt) {
  Row row;
  row.pt = pt;
  const core::Topology t = topologyOf(pt.config);
  NcclModelOptions mo;
  mo.ncclVersion = pt.dataset->ncclVersion;
  const NcclTuning tu = ncclTune(t, mo);
  const NcclPrediction p = ncclPredict(tu, pt.coll, pt.size, mo);
  EXPECT_TRUE(p.ok()) << p.error;
  row.choice = fmt::format("{}/{}/{}", toString(p.algorithm), toString(p.protocol), p.channels);
  const SimParams params = ncclSimParams(p, pt.dataset->cudaGraph ? kLaunchUsCudaGraph : kLaunchUsHost);
  NcclScheduleOptions base;
  base.inPlace = true;  // every data set is nccl-tests in place (or reports in-place busbw)
  auto s = ncclScheduleFor(t, pt.coll, p, base);
  const double factor = core::busBandwidthFactor(pt.coll, t.nRanks());
  if (s.ok()) {
    auto net = Network::build(t);
    EXPECT_TRUE(net.ok());
    const SimResult r = simulate(*s, *net, pt.size, params);
    EXPECT_TRUE(r.ok) << r.error;
    row.predUs = r.timeUs;
  } else {
    row.analytic = true;  // NVLS, PAT, CollNet: NCCL's own model plus the launch
    row.predUs = p.timeUs + params.launchUs;
  }
  row.predBusbw = core::gbps(static_cast<double>(pt.size), row.predUs) * factor;
  row.measUs = pt.us > 0 ? pt.us : static_cast<double>(pt.size) / (pt.busbw / factor * 1e3);
  row.errPct = (row.predUs / row.measUs - 1) * 100;
  row.limitPct = pt.size >= 64 * kMiB ? 15 : 35;
  return row;
}

TEST(Calibration, Table) {
  std::string out =
      "| data set | config | collective | size | measured busbw (GB/s) | measured (us) | NCCL choice | "
      "predicted busbw (GB/s) | predicted (us) | error % | target |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n";
  int within = 0;
  std::string exclusions;
  const auto pts = points();
  double worstBig = 0, worstSmall = 0;
  for (const Point& pt : pts) {
    const Row r = evaluate(pt);
    const bool ok = std::abs(r.errPct) <= r.limitPct;
    const char* excluded = exclusionReason(pt);
    within += ok ? 1 : 0;
    double& worst = pt.size >= 64 * kMiB ? worstBig : worstSmall;
    if (!excluded) worst = std::max(worst, std::abs(r.errPct));
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {}{} | {:.2f} | {:.1f} | {:+.1f}{} | {:.0f} % |\n",
                       pt.dataset->id, pt.config, core::toString(pt.coll), core::formatSize(pt.size),
                       pt.busbw > 0 ? fmt::format("{:.2f}", pt.busbw) : "-",
                       pt.us > 0 ? fmt::format("{:.2f}", pt.us) : "-", r.choice, r.analytic ? " (analytic)" : "",
                       r.predBusbw, r.predUs, r.errPct, ok ? "" : (excluded ? " (excluded)" : " **"), r.limitPct);
    if (excluded) {
      exclusions +=
          fmt::format("- {} {} {}: {}\n", pt.config, core::toString(pt.coll), core::formatSize(pt.size), excluded);
      EXPECT_LE(std::abs(r.errPct), 35.0) << pt.config;
    } else {
      EXPECT_LE(std::abs(r.errPct), r.limitPct)
          << pt.config << " " << core::toString(pt.coll) << " " << core::formatSize(pt.size);
    }
  }
  fmt::print(
      "{}\nwithin target: {} of {}; worst |error| (not excluded) {:.1f} % below 64 MiB, {:.1f} % at >= 64 MiB\n"
      "excluded:\n{}",
      out, within, pts.size(), worstSmall, worstBig, exclusions);
}

}  // namespace
}  // namespace optiflow::sim
