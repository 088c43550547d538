#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "optiflow/compiler/verifier.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/reference_executor.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim {
namespace {

using core::Collective;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

core::Topology preset(const std::string& name) {
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << name;
  return t.value();
}

// ---- graph search results: the sheet's table "What that gives on the target machines" (1.2) ----

TEST(NcclModel, GraphSearchMatchesSheetTable) {
  struct Row {
    std::string topo;
    int searchCh, ch;
    double bw;
    int commCh;
  };
  const std::vector<Row> rows = {
      {"dgx-a100", 6, 12, 20, 24},                                 // 6 ch @ 40 -> dup -> 12 x 20, comm 24
      {"dgx-h100", 6, 12, 30, 24},                                 // 6 ch @ 60 -> dup -> 12 x 30, comm 24
      {"hgx-h200", 6, 12, 30, 24},                                 // same NVLink4 fabric
      {"dgx-a100x2", 8, 8, 24, 16},                                // one per NIC @ PCIe Gen4 24, no dup
      {"dgx-a100x4", 8, 8, 24, 16}, {"dgx-h100x4", 8, 8, 48, 16},  // PCIe Gen5 48, no dup (SM90, < 50, > 4 ch)
  };
  for (const auto& r : rows) {
    const NcclTuning tu = ncclTune(preset(r.topo));
    SCOPED_TRACE(r.topo);
    EXPECT_TRUE(tu.notes.empty());
    EXPECT_EQ(tu.ring.searchChannels, r.searchCh);
    EXPECT_EQ(tu.ring.nChannels, r.ch);
    EXPECT_DOUBLE_EQ(tu.ring.bwIntra, r.bw);
    EXPECT_DOUBLE_EQ(tu.ring.bwInter, r.bw);
    EXPECT_EQ(tu.commChannels, r.commCh);
  }
  // H100 NVLS graph: 8 heads x bwIntra 40 ((7 + 2) x 40 = 360 <= 370.8), bwInter raised to 60, 16 NVLS CTAs.
  const NcclTuning h = ncclTune(preset("dgx-h100"));
  EXPECT_TRUE(h.nvls.present);
  EXPECT_EQ(h.nvls.nChannels, 8);
  EXPECT_DOUBLE_EQ(h.nvls.bwIntra, 40);
  EXPECT_DOUBLE_EQ(h.nvls.bwInter, 60);
  EXPECT_EQ(h.nvlsChannels, 16);
  EXPECT_NEAR(h.totalBw, 370.8, 1e-9);
  EXPECT_FALSE(ncclTune(preset("dgx-a100")).nvls.present);  // no NVLS before Hopper
  // CPU defaults (calibration.md 3): A100 systems AMD, H100/H200 Intel.
  EXPECT_EQ(ncclTune(preset("dgx-a100x2")).cpu, NcclCpu::Amd);
  EXPECT_EQ(ncclTune(preset("dgx-h100x2")).cpu, NcclCpu::Intel);
  EXPECT_EQ(ncclTune(preset("hgx-h200")).arch, NcclArch::Hopper);
}

// Model busBw of Ring/Simple at a size where latency vanishes: 240 / 360 / 192 / 384 (1.2 table).
TEST(NcclModel, RingSimpleModelBusBwMatchesSheet) {
  NcclModelOptions ringSimple;
  ringSimple.algorithms = ncclAlgoBit(core::Algorithm::Ring);
  ringSimple.protocols = ncclProtoBit(core::Protocol::Simple);
  const std::vector<std::pair<std::string, double>> rows = {
      {"dgx-a100", 240}, {"dgx-h100", 360}, {"dgx-a100x2", 192}, {"dgx-a100x4", 192}, {"dgx-h100x4", 384}};
  for (const auto& [topo, bus] : rows) {
    const NcclPrediction p = ncclPredict(preset(topo), Collective::AllReduce, 1ull << 50, ringSimple);
    ASSERT_TRUE(p.ok()) << p.error;
    EXPECT_NEAR(p.busbwGBps, bus, bus * 1e-4) << topo;
  }
  // NVLS on one H100 node: 8 x min(40 x 0.85 x 7/8 x 2, 60) = 476 AllReduce busBw; 208.25 AllGather algbw.
  NcclModelOptions nvls;
  nvls.algorithms = ncclAlgoBit(core::Algorithm::Nvls);
  const auto ar = ncclPredict(preset("dgx-h100"), Collective::AllReduce, 1ull << 50, nvls);
  EXPECT_NEAR(ar.busbwGBps, 476, 0.05);
  const auto ag = ncclPredict(preset("dgx-h100"), Collective::AllGather, 1ull << 50, nvls);
  EXPECT_NEAR(ag.algbwGBps, 208.25, 0.05);
}

// ---- 1.11: what the model predicts on the target systems ----
// Each cell: time (us) for 1 KiB and 1 MiB, else busbw (GB/s), with NCCL's choice where the sheet names it.
struct Cell {
  std::uint64_t size;
  double value;  // us (isTime) or busbw
  bool isTime;
  std::string algo;  // "" when the sheet does not name it
  std::string proto;
};

void checkColumn(const std::string& topo, Collective c, const std::vector<Cell>& cells,
                 const NcclModelOptions& options = {}) {
  const NcclTuning tu = ncclTune(preset(topo), options);
  for (const auto& cell : cells) {
    const NcclPrediction p = ncclPredict(tu, c, cell.size, options);
    SCOPED_TRACE(fmt::format("{} {} {}", topo, core::toString(c), core::formatSize(cell.size)));
    ASSERT_TRUE(p.ok()) << p.error;
    if (cell.isTime) {
      EXPECT_NEAR(p.timeUs, cell.value, 0.051);  // the sheet rounds to 0.1 us
    } else {
      EXPECT_NEAR(p.busbwGBps, cell.value, 0.51);  // and to 1 GB/s
    }
    if (!cell.algo.empty()) {
      EXPECT_EQ(toString(p.algorithm), cell.algo);
    }
    if (!cell.proto.empty()) {
      EXPECT_EQ(toString(p.protocol), cell.proto);
    }
  }
}

TEST(NcclModel, A100OneNodeColumns) {
  checkColumn("dgx-a100", Collective::AllReduce,
              {{kKiB, 15.0, true, "Ring", "LL"},
               {kMiB, 35.9, true, "Ring", "LL"},
               {16 * kMiB, 169, false, "Ring", "LL128"},
               {64 * kMiB, 215, false, "Ring", "Simple"},
               {256 * kMiB, 233, false, "Ring", "Simple"},
               {kGiB, 238, false, "Ring", "Simple"},
               {8 * kGiB, 240, false, "Ring", "Simple"}});
  checkColumn("dgx-a100", Collective::AllGather,
              {{kKiB, 10.8, true, "Ring", "LL"},
               {kMiB, 21.3, true, "Ring", "LL"},
               {16 * kMiB, 157, false, "Ring", "Simple"},
               {64 * kMiB, 212, false, "Ring", "Simple"},
               {256 * kMiB, 232, false, "", ""},
               {kGiB, 238, false, "", ""},
               {8 * kGiB, 240, false, "", ""}});
  // "AG and RS give identical numbers in the model".
  for (std::uint64_t s : {kKiB, kMiB, 64 * kMiB}) {
    const auto ag = ncclPredict(preset("dgx-a100"), Collective::AllGather, s);
    const auto rs = ncclPredict(preset("dgx-a100"), Collective::ReduceScatter, s);
    EXPECT_DOUBLE_EQ(ag.timeUs, rs.timeUs);
  }
}

TEST(NcclModel, A100TwoNodeColumns) {
  checkColumn("dgx-a100x2", Collective::AllReduce,
              {{kKiB, 25.3, true, "Tree", "LL"},
               {kMiB, 70.3, true, "Tree", "LL128"},
               {16 * kMiB, 115, false, "Ring", "LL128"},
               {64 * kMiB, 146, false, "Ring", "LL128"},
               {256 * kMiB, 173, false, "Ring", "Simple"},
               {kGiB, 187, false, "Ring", "Simple"},
               {8 * kGiB, 191, false, "Ring", "Simple"}});
  checkColumn("dgx-a100x2", Collective::AllGather,
              {{kKiB, 37.3, true, "Ring", "LL"},
               {kMiB, 52.1, true, "Ring", "LL128"},
               {16 * kMiB, 109, false, "Ring", "LL128"},
               {64 * kMiB, 145, false, "", ""},
               {256 * kMiB, 178, false, "", ""},
               {kGiB, 188, false, "", ""},
               {8 * kGiB, 192, false, "", ""}});
  // 1 MiB busbw in parentheses: AR 28, AG 19.
  EXPECT_NEAR(ncclPredict(preset("dgx-a100x2"), Collective::AllReduce, kMiB).busbwGBps, 28, 0.5);
  EXPECT_NEAR(ncclPredict(preset("dgx-a100x2"), Collective::AllGather, kMiB).busbwGBps, 19, 0.5);
}

TEST(NcclModel, H100OneNodeColumns) {
  checkColumn("dgx-h100", Collective::AllReduce,
              {{kKiB, 15.0, true, "Ring", "LL"},
               {kMiB, 28.0, true, "Ring", "LL"},
               {16 * kMiB, 339, false, "NVLS", "Simple"},
               {64 * kMiB, 432, false, "NVLS", "Simple"},
               {256 * kMiB, 464, false, "NVLS", "Simple"},
               {kGiB, 473, false, "NVLS", "Simple"},
               {8 * kGiB, 476, false, "NVLS", "Simple"}});
  checkColumn("dgx-h100", Collective::AllGather,
              {{kKiB, 10.8, true, "Ring", "LL"},
               {kMiB, 17.3, true, "Ring", "LL"},
               {16 * kMiB, 205, false, "Ring", "LL128"},
               {64 * kMiB, 301, false, "Ring", "Simple"},
               {256 * kMiB, 343, false, "", ""},
               {kGiB, 356, false, "", ""},
               {8 * kGiB, 359, false, "", ""}});
  EXPECT_NEAR(ncclPredict(preset("dgx-h100"), Collective::AllReduce, kMiB).busbwGBps, 66, 0.5);
  EXPECT_NEAR(ncclPredict(preset("dgx-h100"), Collective::AllGather, kMiB).busbwGBps, 53, 0.5);
  // Ring/LL -> NVLS crossover at about 1.1 MiB (15 + S/80.6 = 25 + S/272).
  EXPECT_EQ(ncclPredict(preset("dgx-h100"), Collective::AllReduce, 1100 * kKiB).algorithm, core::Algorithm::Ring);
  EXPECT_EQ(ncclPredict(preset("dgx-h100"), Collective::AllReduce, 1200 * kKiB).algorithm, core::Algorithm::Nvls);
  // H200 is the same fabric.
  EXPECT_EQ(ncclPredict(preset("hgx-h200"), Collective::AllReduce, 64 * kMiB).algorithm, core::Algorithm::Nvls);
}

// The sheet derived its H100 4 x 8 AllReduce column without NVLSTree: the same column with NVLSTree disallowed.
TEST(NcclModel, H100FourNodeColumns) {
  NcclModelOptions sheet;
  sheet.enableNvlsTree = false;
  checkColumn("dgx-h100x4", Collective::AllReduce,
              {{kKiB, 35.3, true, "Tree", "LL"},
               {kMiB, 80.6, true, "Tree", "LL128"},
               {16 * kMiB, 144, false, "Tree", "LL128"},
               {64 * kMiB, 221, false, "Ring", "LL128"},
               {256 * kMiB, 297, false, "Ring", "Simple"},
               {kGiB, 358, false, "Ring", "Simple"},
               {8 * kGiB, 381, false, "Ring", "Simple"}},
              sheet);
  checkColumn("dgx-h100x4", Collective::AllGather,
              {{kKiB, 42.7, true, "Ring", "LL"},
               {kMiB, 82.7, true, "Ring", "LL128"},
               {16 * kMiB, 121, false, "Ring", "LL128"},
               {64 * kMiB, 216, false, "", ""},
               {256 * kMiB, 316, false, "", ""},
               {kGiB, 364, false, "", ""},
               {8 * kGiB, 381, false, "", ""}});
  EXPECT_NEAR(ncclPredict(preset("dgx-h100x4"), Collective::AllReduce, kMiB, sheet).busbwGBps, 25, 0.5);
  EXPECT_NEAR(ncclPredict(preset("dgx-h100x4"), Collective::AllGather, kMiB).busbwGBps, 12, 0.5);
}

// calibration.md 2.2-A, the "model" column (A100 one node AllReduce busbw with NCCL's choice).
TEST(NcclModel, CalibrationA100SweepModelColumn) {
  struct Row {
    std::uint64_t size;
    double busbw;
    const char* proto;
  };
  const std::vector<Row> rows = {{kKiB, 0.12, "LL"},          {8 * kKiB, 0.95, "LL"},      {64 * kKiB, 7.0, "LL"},
                                 {256 * kKiB, 22.7, "LL"},    {kMiB, 51.1, "LL"},          {2 * kMiB, 64.6, "LL"},
                                 {4 * kMiB, 99.4, "LL128"},   {8 * kMiB, 137, "LL128"},    {16 * kMiB, 169, "LL128"},
                                 {32 * kMiB, 195, "Simple"},  {64 * kMiB, 215, "Simple"},  {128 * kMiB, 227, "Simple"},
                                 {256 * kMiB, 233, "Simple"}, {512 * kMiB, 237, "Simple"}, {kGiB, 238, "Simple"},
                                 {2 * kGiB, 239, "Simple"},   {4 * kGiB, 240, "Simple"},   {8 * kGiB, 240, "Simple"}};
  const NcclTuning tu = ncclTune(preset("dgx-a100"));
  for (const auto& r : rows) {
    const auto p = ncclPredict(tu, Collective::AllReduce, r.size);
    SCOPED_TRACE(core::formatSize(r.size));
    // The column keeps 2-3 significant digits: compare within half a unit of the last one (at least 0.5 %).
    const double tol = std::max(r.busbw * 0.005, r.busbw < 1 ? 0.005 : (r.busbw < 100 ? 0.05 : 0.5));
    EXPECT_NEAR(p.busbwGBps, r.busbw, tol);
    EXPECT_EQ(p.algorithm, core::Algorithm::Ring);
    EXPECT_EQ(toString(p.protocol), r.proto);
  }
  EXPECT_NEAR(ncclPredict(tu, Collective::AllReduce, kKiB).timeUs, 15.0, 0.05);
}

// 1.10 PAT example: 1 GPU per node, 16 nodes: PAT 68.8 us vs Ring/LL 81.6 us; 64 nodes 211 vs 322.
TEST(NcclModel, PatOneGpuPerNode) {
  for (auto [nodes, pat, ringLL] : {std::tuple{16, 68.8, 81.6}, std::tuple{64, 211.2, 321.6}}) {
    core::Topology t = preset(fmt::format("dgx-h100x{}", nodes));
    t.gpusPerNode = 1;
    t.nics.resize(1);
    ASSERT_TRUE(t.validate().empty());
    const auto p = ncclPredict(t, Collective::AllGather, 0);
    ASSERT_TRUE(p.ok());
    EXPECT_NEAR(p.time[static_cast<int>(core::Algorithm::Pat)][static_cast<int>(core::Protocol::Simple)], pat, 0.05);
    EXPECT_NEAR(p.time[static_cast<int>(core::Algorithm::Ring)][static_cast<int>(core::Protocol::LL)], ringLL, 0.05);
    EXPECT_EQ(p.algorithm, core::Algorithm::Pat);
    NcclModelOptions old;
    old.ncclVersion = 22206;  // before PAT
    EXPECT_LT(ncclPredict(t, Collective::AllGather, 0, old).time[static_cast<int>(core::Algorithm::Pat)][2], 0);
  }
}

// NVLSTree on several H100 nodes (NCCL's default without SHARP; AllReduce only).
TEST(NcclModel, NvlsTreeOnSeveralHopperNodes) {
  const int nvlsTree = static_cast<int>(core::Algorithm::NvlsTree);
  const core::Topology x4 = preset("dgx-h100x4");
  const auto p = ncclPredict(x4, Collective::AllReduce, 256 * kMiB);
  EXPECT_EQ(p.algorithm, core::Algorithm::NvlsTree);
  // 8 heads x min(40 x 0.85 x 7/8 x 2, 48, 45.5) = 364 busBw; latency 25 + 2 x 2 x 20.9 = 108.6 us.
  EXPECT_NEAR(p.latency[nvlsTree][2], 108.6, 1e-9);
  EXPECT_NEAR(p.bandwidth[nvlsTree][2], 364.0 * 32 / 62, 1e-9);
  EXPECT_EQ(ncclPredict(x4, Collective::AllReduce, 4 * kMiB).algorithm, core::Algorithm::Tree);
  // At 8 GiB the ring's 381 beats NVLSTree's 364 on four nodes.
  EXPECT_EQ(ncclPredict(x4, Collective::AllReduce, 8 * kGiB).algorithm, core::Algorithm::Ring);
  // Two nodes: the tree's inter-node bandwidth counts twice, and the two-node cap is 57.7 per head:
  // 8 x min(59.5, 96, 57.7) = 461.6 busBw, NVLSTree from the mid sizes to the largest.
  const core::Topology x2 = preset("dgx-h100x2");
  for (std::uint64_t size : {64 * kMiB, 256 * kMiB, kGiB, 8 * kGiB}) {
    const auto q = ncclPredict(x2, Collective::AllReduce, size);
    EXPECT_EQ(q.algorithm, core::Algorithm::NvlsTree) << core::formatSize(size);
  }
  EXPECT_NEAR(ncclPredict(x2, Collective::AllReduce, 8 * kGiB).busbwGBps, 461.6, 1.0);
  // NVLSTree serves AllReduce only; AllGather / ReduceScatter across nodes stay on the ring (NVLS needs SHARP there).
  EXPECT_LT(ncclPredict(x2, Collective::AllGather, kGiB).time[nvlsTree][2], 0);
  EXPECT_EQ(ncclPredict(x2, Collective::AllGather, kGiB).algorithm, core::Algorithm::Ring);
  // One head per GPU with a NIC: four NICs give four heads, and half the bandwidth.
  core::Topology four = x2;
  four.nics.resize(4);
  for (std::size_t i = 0; i < 4; ++i) four.nics[i].gpus = {static_cast<int>(2 * i), static_cast<int>(2 * i + 1)};
  ASSERT_TRUE(four.validate().empty());
  EXPECT_EQ(ncclTune(four).nvls.nChannels, 4);
  // Disallowed (NCCL_ALGO without it), the entry is unusable; one node never has it.
  NcclModelOptions off;
  off.enableNvlsTree = false;
  EXPECT_LT(ncclPredict(x4, Collective::AllReduce, 256 * kMiB, off).time[nvlsTree][2], 0);
  EXPECT_LT(ncclPredict(preset("dgx-h100"), Collective::AllReduce, 256 * kMiB).time[nvlsTree][2], 0);
  // A100 has no NVLS at all.
  EXPECT_LT(ncclPredict(preset("dgx-a100x2"), Collective::AllReduce, 256 * kMiB).time[nvlsTree][2], 0);
}

TEST(NcclModel, CostTableMarksUnusableEntries) {
  const auto p = ncclPredict(preset("dgx-a100"), Collective::AllGather, kMiB);
  // AllGather: no Tree; A100: no NVLS; no CollNet without SHARP; no PAT with 8 GPUs per node.
  for (int proto = 0; proto < core::kNumProtocols; ++proto) {
    for (core::Algorithm a : {core::Algorithm::Tree, core::Algorithm::Nvls, core::Algorithm::NvlsTree,
                              core::Algorithm::CollNetDirect, core::Algorithm::CollNetChain, core::Algorithm::Pat}) {
      EXPECT_EQ(p.time[static_cast<int>(a)][proto], -1.0) << toString(a);
    }
    EXPECT_GT(p.time[static_cast<int>(core::Algorithm::Ring)][proto], 0);
  }
  // The choice is the minimum of the table.
  double best = 1e300;
  for (const auto& row : p.time) {
    for (double t : row) {
      if (t >= 0) best = std::min(best, t);
    }
  }
  EXPECT_DOUBLE_EQ(best, p.timeUs);
  // Broadcast is Ring only; AllToAll is not in NCCL's model.
  EXPECT_EQ(ncclPredict(preset("dgx-h100x2"), Collective::Broadcast, kMiB).algorithm, core::Algorithm::Ring);
  EXPECT_FALSE(ncclPredict(preset("dgx-a100"), Collective::AllToAll, kMiB).ok());
}

TEST(NcclModel, RuntimeChannelsShrinkForSmallMessages) {
  const NcclTuning tu = ncclTune(preset("dgx-a100"));
  // Ring/LL with 512 threads drops a channel while bytes < nc x 512 x 8 x nRanks (32 KiB per channel on 8 ranks).
  const auto small = ncclPredict(tu, Collective::AllReduce, kKiB);
  EXPECT_EQ(small.channels, 1);
  const auto mid = ncclPredict(tu, Collective::AllReduce, 256 * kKiB);
  EXPECT_EQ(mid.algorithm, core::Algorithm::Ring);
  EXPECT_EQ(mid.protocol, core::Protocol::LL);
  EXPECT_EQ(mid.channels, 8);  // 256 KiB / 32 KiB
  const auto big = ncclPredict(tu, Collective::AllReduce, kGiB);
  EXPECT_EQ(big.channels, 24);
  EXPECT_EQ(big.threads, 512 + 32);                                                      // Ring/Simple: +1 warp
  EXPECT_EQ(ncclPredict(preset("dgx-h100"), Collective::AllReduce, kGiB).channels, 16);  // NVLS CTAs
}

TEST(NcclModel, CpuVendorChangesMultiNodeLatency) {
  NcclModelOptions intel;
  intel.cpu = NcclCpu::Intel;
  const auto amd = ncclPredict(preset("dgx-a100x2"), Collective::AllGather, kKiB);
  const auto itl = ncclPredict(preset("dgx-a100x2"), Collective::AllGather, kKiB, intel);
  // Ring/LL: 14 intra steps at max(0.6, overhead): 2.0 (AMD) vs 1.0 (Intel) -> 14 us apart.
  const int ring = static_cast<int>(core::Algorithm::Ring);
  EXPECT_NEAR(amd.latency[ring][0] - itl.latency[ring][0], 14.0, 1e-9);
  // The llMaxBw row follows the CPU on several nodes: AMD 22.5, Intel 39.0 at N2.
  EXPECT_NEAR(amd.bandwidth[ring][0], 22.5 * 16 / 15, 1e-9);
  EXPECT_NEAR(itl.bandwidth[ring][0], 39.0 * 16 / 15, 1e-9);
}

TEST(NcclModel, JsonRowFields) {
  const auto j = ncclPredictionToJson(ncclPredict(preset("dgx-a100"), Collective::AllReduce, kMiB), true);
  for (const char* k : {"size_bytes", "algorithm", "protocol", "channels", "time_us", "algbw_gbps", "busbw_gbps"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["algorithm"], "Ring");
  EXPECT_EQ(j["table"]["Tree"]["LL"].get<double>() > 0, true);
  EXPECT_EQ(j["table"]["NVLS"]["Simple"].get<double>(), -1.0);
}

// ---- schedules ----

std::string verifyText(const compiler::VerifyReport& v) {
  std::string out;
  for (const auto& f : v.errors) out += f.str() + "\n";
  return out;
}

std::string checkText(const CheckReport& r) {
  std::string out = fmt::format("passed={} mismatches={}\n", r.passed, r.mismatchCount);
  for (const auto& e : r.errors) out += e + "\n";
  return out;
}

void expectProvenAndCorrect(const core::Schedule& s) {
  SCOPED_TRACE(s.name);
  const auto v = compiler::verify(s);
  EXPECT_TRUE(v.proven) << verifyText(v);
  EXPECT_TRUE(v.warnings.empty()) << v.warnings.size() << " warnings, first: " << v.warnings.front().str();
  CheckOptions co;
  co.elementsPerChunk = 2;
  const auto r = runReference(s, co);
  EXPECT_TRUE(r.passed) << checkText(r);
}

TEST(NcclSchedules, RingOrdersAreRailAligned) {
  for (const char* name : {"dgx-a100", "dgx-a100x2", "dgx-h100x4", "dgx-a100x3"}) {
    const core::Topology t = preset(name);
    const int ppn = t.gpusPerNode;
    const auto orders = ncclRingOrders(t, 8);
    ASSERT_EQ(orders.size(), 8u);
    for (std::size_t c = 0; c < orders.size(); ++c) {
      const auto& o = orders[c];
      std::vector<int> sorted = o;
      std::sort(sorted.begin(), sorted.end());
      for (int r = 0; r < t.nRanks(); ++r) ASSERT_EQ(sorted[static_cast<std::size_t>(r)], r);
      // Every node's GPUs are contiguous in the ring and it is entered at local c.
      EXPECT_EQ(t.localOf(o[0]), static_cast<int>(c) % ppn);
      int crossRail = 0;
      for (std::size_t i = 0; i < o.size(); ++i) {
        const int a = o[i];
        const int b = o[(i + 1) % o.size()];
        if (t.nodeOf(a) != t.nodeOf(b)) {
          if (t.localOf(a) != t.localOf(b)) ++crossRail;
          if (i + 1 < o.size()) {
            EXPECT_EQ(t.nodeOf(b), t.nodeOf(a) + 1);
          }
        }
      }
      // Even node counts stay on one rail at every node boundary; an odd count closes the ring across rails once.
      EXPECT_EQ(crossRail, t.nodes % 2 == 1 && t.nodes > 1 ? 1 : 0) << name;
    }
  }
}

TEST(NcclSchedules, DoubleBinaryTreeShape) {
  for (int nodes : {1, 2, 3, 4, 5, 6, 8, 16, 33}) {
    for (int tree : {0, 1}) {
      const auto parent = ncclTreeParents(nodes, tree);
      int roots = 0;
      std::vector<int> kids(static_cast<std::size_t>(nodes), 0);
      for (int v = 0; v < nodes; ++v) {
        const int p = parent[static_cast<std::size_t>(v)];
        if (p < 0) {
          ++roots;
          continue;
        }
        ++kids[static_cast<std::size_t>(p)];
        // The parent chain reaches the root within log2 steps-ish (no cycle).
        int x = v;
        int hops = 0;
        while (x >= 0 && hops <= nodes) {
          x = parent[static_cast<std::size_t>(x)];
          ++hops;
        }
        EXPECT_LE(hops, nodes);
      }
      EXPECT_EQ(roots, 1);
      for (int k : kids) EXPECT_LE(k, 2);
    }
    if (nodes % 2 == 0) {
      // Double binary tree: no node is interior in both trees.
      const auto a = ncclTreeParents(nodes, 0);
      const auto b = ncclTreeParents(nodes, 1);
      std::vector<int> interiorA(static_cast<std::size_t>(nodes), 0), interiorB(static_cast<std::size_t>(nodes), 0);
      for (int v = 0; v < nodes; ++v) {
        if (a[static_cast<std::size_t>(v)] >= 0)
          interiorA[static_cast<std::size_t>(a[static_cast<std::size_t>(v)])] = 1;
        if (b[static_cast<std::size_t>(v)] >= 0)
          interiorB[static_cast<std::size_t>(b[static_cast<std::size_t>(v)])] = 1;
      }
      for (int v = 0; v < nodes; ++v) {
        EXPECT_FALSE(interiorA[static_cast<std::size_t>(v)] && interiorB[static_cast<std::size_t>(v)])
            << nodes << " nodes, node " << v;
      }
    }
  }
}

TEST(NcclSchedules, RingsProvenAndCorrect) {
  for (const char* name : {"dgx-a100", "dgx-a100x2", "dgx-h100x4", "dgx-a100x3"}) {
    const core::Topology t = preset(name);
    for (int channels : {1, 3}) {
      for (bool inPlace : {false, true}) {
        NcclScheduleOptions o;
        o.channels = channels;
        o.inPlace = inPlace;
        o.pipelineChunks = 2;
        o.root = t.nRanks() - 3;
        expectProvenAndCorrect(ncclRingAllGather(t, o));
        expectProvenAndCorrect(ncclRingReduceScatter(t, o));
        expectProvenAndCorrect(ncclRingAllReduce(t, o));
        expectProvenAndCorrect(ncclRingBroadcast(t, o));
        expectProvenAndCorrect(ncclRingReduce(t, o));
      }
    }
  }
}

TEST(NcclSchedules, TreeAllReduceProvenAndCorrect) {
  for (const char* name : {"dgx-a100", "dgx-a100x2", "dgx-h100x3", "dgx-a100x4"}) {
    const core::Topology t = preset(name);
    for (int channels : {1, 4}) {
      for (bool inPlace : {false, true}) {
        NcclScheduleOptions o;
        o.channels = channels;
        o.inPlace = inPlace;
        o.pipelineChunks = 3;
        expectProvenAndCorrect(ncclTreeAllReduce(t, o));
      }
    }
  }
  // 1 GPU per node (pure double binary tree) and a single rank.
  core::Topology t = preset("dgx-h100x6");
  t.gpusPerNode = 1;
  t.nics.resize(1);
  NcclScheduleOptions o;
  o.channels = 2;
  expectProvenAndCorrect(ncclTreeAllReduce(t, o));
  t.nodes = 1;
  t.inter.kind = core::InterFabricKind::None;
  expectProvenAndCorrect(ncclTreeAllReduce(t, o));
}

TEST(NcclSchedules, ScheduleForFollowsTheModel) {
  struct Case {
    const char* topo;
    Collective c;
    std::uint64_t size;
    core::Algorithm algo;
  };
  for (const Case& k : {Case{"dgx-a100", Collective::AllReduce, 64 * kMiB, core::Algorithm::Ring},
                        Case{"dgx-a100x2", Collective::AllReduce, kMiB, core::Algorithm::Tree},
                        Case{"dgx-a100x2", Collective::AllGather, kGiB, core::Algorithm::Ring},
                        Case{"dgx-h100x4", Collective::AllReduce, 4 * kMiB, core::Algorithm::Tree},
                        Case{"dgx-h100x4", Collective::ReduceScatter, 64 * kMiB, core::Algorithm::Ring},
                        Case{"dgx-a100x2", Collective::Broadcast, 64 * kMiB, core::Algorithm::Ring}}) {
    const core::Topology t = preset(k.topo);
    const auto p = ncclPredict(t, k.c, k.size);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p.algorithm, k.algo) << k.topo;
    NcclScheduleOptions base;
    base.pipelineChunks = 2;
    auto s = ncclScheduleFor(t, k.c, p, base);
    ASSERT_TRUE(s.ok()) << s.error().str();
    EXPECT_EQ(s->nChannels, p.channels);
    EXPECT_EQ(s->protocol, p.protocol);
    EXPECT_EQ(s->collective, k.c);
    const auto v = compiler::verify(*s);
    EXPECT_TRUE(v.proven) << verifyText(v);
  }
  // NVLS (one H100 node, large AllReduce) is not expressible.
  const auto nvls = ncclPredict(preset("dgx-h100"), Collective::AllReduce, kGiB);
  EXPECT_EQ(nvls.algorithm, core::Algorithm::Nvls);
  EXPECT_FALSE(ncclScheduleFor(preset("dgx-h100"), Collective::AllReduce, nvls).ok());
}

// ---- the two NCCL estimates: the model (ncclPredict) against NCCL's schedules timed by the simulator ----

struct Comparison {
  std::string topo;
  Collective coll;
  std::uint64_t size;
  std::string what;  // algorithm/protocol compared
  int channels = 0;
  double modelUs = 0;
  double simUs = 0;
  double ratio = 0;  // sim / model
};

// Where the two estimates may differ by more than 15 % (docs/nccl-model.md, "Remaining gaps"): a row outside 15 %
// must fall in one of these classes, and even then within a factor of 2.
const char* gapReason(const std::string& what, int nodes, std::uint64_t size) {
  if (what == "Ring/LL" && nodes == 1 && size <= kMiB) {
    return "L: the model adds nSteps x hop latency; the simulator overlaps hop latency with the previous step";
  }
  if (what == "Ring/Simple" && (size <= 64 * kMiB || (nodes >= 4 && size <= 256 * kMiB))) {
    return "S: per-step sync fitted to calibration data set A, measured 19-21 % slower than the model at 64-128 MiB";
  }
  if ((what == "Ring/LL128" || what == "Tree/LL128") && nodes > 1 && size <= 16 * kMiB) {
    return "T: LL128 per-step sync on multi-node rings; no tree correction factor in the simulator";
  }
  return nullptr;
}

// NCCL's choice timed by the simulator with ncclSimParams (the SimParams defaults, NCCL's host overhead and
// LL/LL128 caps, CUDA-graph launch) against NCCL's own model, on every preset family at 1 and 2/4 nodes.
std::vector<Comparison> compareModelAndSimulator() {
  std::vector<Comparison> rows;
  for (const char* topo : {"dgx-a100", "dgx-a100x2", "dgx-a100x4", "dgx-h100", "dgx-h100x2", "dgx-h100x4", "hgx-h200",
                           "hgx-h200x2", "hgx-h200x4"}) {
    const core::Topology t = preset(topo);
    auto net = Network::build(t);
    EXPECT_TRUE(net.ok());
    const NcclTuning tu = ncclTune(t);
    for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter}) {
      for (std::uint64_t size : {kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, kGiB}) {
        NcclPrediction p = ncclPredict(tu, c, size);
        if (p.algorithm != core::Algorithm::Ring && p.algorithm != core::Algorithm::Tree) {
          // Not expressible (NVLS on one node, NVLSTree on several): compare NCCL's Ring instead, or its Ring/Tree
          // choice where NVLSTree displaced it.
          NcclModelOptions ring;
          ring.algorithms = ncclAlgoBit(core::Algorithm::Ring);
          if (p.algorithm == core::Algorithm::NvlsTree) ring.algorithms |= ncclAlgoBit(core::Algorithm::Tree);
          p = ncclPredict(tu, c, size, ring);
        }
        NcclScheduleOptions base;
        base.pipelineChunks = 8;
        base.inPlace = true;
        auto s = ncclScheduleFor(t, c, p, base);
        EXPECT_TRUE(s.ok());
        if (!s.ok()) continue;
        const SimResult r = simulate(*s, net.value(), size, ncclSimParams(p));
        EXPECT_TRUE(r.ok) << r.error;
        Comparison row{
            topo,       c,        size,     fmt::format("{}/{}", toString(p.algorithm), toString(p.protocol)),
            p.channels, p.timeUs, r.timeUs, r.timeUs / p.timeUs};
        rows.push_back(row);
      }
    }
  }
  return rows;
}

// The table of docs/nccl-model.md: --gtest_filter='NcclSimulator.*'. Asserts agreement within 15 % at every
// size >= 1 MiB except the documented gaps.
TEST(NcclSimulator, ModelAndSimulatedSchedulesAgree) {
  const auto rows = compareModelAndSimulator();
  std::string out =
      "| topology | collective | size | NCCL algo/proto | channels | model (us) | simulated (us) | sim/model |\n"
      "|---|---|---|---|---|---|---|---|\n";
  int within = 0;
  int excluded = 0;
  for (const auto& r : rows) {
    const bool ok = std::abs(r.ratio - 1) <= 0.15;
    const int nodes = preset(r.topo).nodes;
    const char* gap = ok ? nullptr : gapReason(r.what, nodes, r.size);
    out += fmt::format("| {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.3f}{} |\n", r.topo, core::toString(r.coll),
                       core::formatSize(r.size), r.what, r.channels, r.modelUs, r.simUs, r.ratio,
                       ok ? "" : (gap ? fmt::format(" gap {}", gap[0]) : std::string(" **")));
    within += ok ? 1 : 0;
    excluded += gap ? 1 : 0;
    if (gap) {
      EXPECT_GT(r.ratio, 0.5) << r.topo << " " << core::toString(r.coll) << " " << core::formatSize(r.size);
      EXPECT_LT(r.ratio, 2.0) << r.topo << " " << core::toString(r.coll) << " " << core::formatSize(r.size);
    } else {
      EXPECT_TRUE(ok) << r.topo << " " << core::toString(r.coll) << " " << core::formatSize(r.size) << ": sim/model "
                      << r.ratio;
    }
  }
  fmt::print("{}\nwithin 15%: {} of {}; outside, in a documented gap class: {}\n", out, within, rows.size(), excluded);
}

// The docs table (docs/nccl-model.md): run with --gtest_filter=NcclModel.PrintPresetTable.
TEST(NcclModel, PrintPresetTable) {
  std::string out =
      "| topology | collective | size | algorithm | protocol | channels | time (us) | algbw (GB/s) | busbw (GB/s) |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const char* topo : {"dgx-a100", "dgx-a100x2", "dgx-h100", "dgx-h100x4"}) {
    const NcclTuning tu = ncclTune(preset(topo));
    for (Collective c : {Collective::AllReduce, Collective::AllGather}) {
      for (std::uint64_t s : {kKiB, kMiB, 64 * kMiB, kGiB}) {
        const auto p = ncclPredict(tu, c, s);
        ASSERT_TRUE(p.ok());
        out += fmt::format("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.2f} | {:.2f} |\n", topo, core::toString(c),
                           core::formatSize(s), toString(p.algorithm), toString(p.protocol), p.channels, p.timeUs,
                           p.algbwGBps, p.busbwGBps);
      }
    }
  }
  fmt::print("{}", out);
}

}  // namespace
}  // namespace optiflow::sim
