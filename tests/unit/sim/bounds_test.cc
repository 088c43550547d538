// Lower bounds: the worked numbers of section (c.4) of formats-bounds-prior-art.md, and the properties every bound
// must have (positive, finite, monotone, consistent between its terms and its enumerations).
#include "optiflow/sim/bounds.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/units.h"

namespace optiflow::sim {
namespace {

using core::Collective;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

const Collective kCollectives[] = {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce,
                                   Collective::AllToAll,  Collective::Broadcast,     Collective::Reduce};

core::Topology preset(const std::string& name) {
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << name;
  return t.value();
}

// The SyCCL-testbed variant of c.4: 4 x 200 Gb/s NICs per node, each shared by two GPUs.
core::Topology fourNicA100(int nodes) {
  core::Topology t = preset(fmt::format("dgx-a100x{}", nodes));
  t.nics.clear();
  for (int i = 0; i < 4; ++i) t.nics.push_back(core::Nic{fmt::format("mlx5_{}", i), 25.0, 1.0, {2 * i, 2 * i + 1}});
  EXPECT_TRUE(t.validate().empty());
  return t;
}

// Ideal ring All-Gather: busbw = the NIC-bound per-GPU rate (200 GB/s over 8 rails; 100 with 4 NICs).
double ringAlgbw(double ringBusbw, int n) { return ringBusbw * n / (n - 1); }

TEST(BoundsWorkedNumbers, A100EightRailsAllGather) {
  struct Row {
    int nodes;
    double algbw, busbw, gain;
    BoundKind kind;
  };
  // c.4: optimal AG algbw / busbw and the gain over an ideal ring (busbw 200); the table's 1.63 is 1.625.
  const Row rows[] = {{2, 346.7, 325.0, 1.625, BoundKind::PerGpu},
                      {4, 266.7, 258.3, 1.29, BoundKind::PerNode},
                      {8, 228.6, 225.0, 1.13, BoundKind::PerNode},
                      {16, 213.3, 211.7, 1.06, BoundKind::PerNode}};
  for (const Row& r : rows) {
    core::Topology t = preset(fmt::format("dgx-a100x{}", r.nodes));
    const int n = t.nRanks();
    Bound b = lowerBound(t, Collective::AllGather, kGiB);
    SCOPED_TRACE(fmt::format("{} GPUs: {}", n, b.description));
    EXPECT_NEAR(b.algbwGBps, r.algbw, 0.05);
    EXPECT_NEAR(b.busbwGBps, r.busbw, 0.05);
    EXPECT_NEAR(b.algbwGBps / ringAlgbw(200, n), r.gain, 0.005);
    EXPECT_EQ(b.binding, r.kind);
  }
  // Exactly: 16 GPUs (15/16 M) / (300 + 25); otherwise (N-g)/N M / 200, i.e. gain (N-1)/(N-g).
  EXPECT_DOUBLE_EQ(lowerBound(preset("dgx-a100x2"), Collective::AllGather, kGiB).algbwGBps, 325.0 * 16 / 15);
  for (int nodes : {4, 8, 16}) {
    const double n = 8.0 * nodes;
    Bound b = lowerBound(preset(fmt::format("dgx-a100x{}", nodes)), Collective::AllGather, kGiB);
    EXPECT_DOUBLE_EQ(b.algbwGBps, 200.0 * n / (n - 8));
    EXPECT_NEAR(b.algbwGBps / ringAlgbw(200, static_cast<int>(n)), (n - 1) / (n - 8), 1e-12);
  }
}

TEST(BoundsWorkedNumbers, A100FourNicsAllGather) {
  Bound b32 = lowerBound(fourNicA100(4), Collective::AllGather, kGiB);
  EXPECT_NEAR(b32.algbwGBps, 133.3, 0.05) << b32.description;
  EXPECT_EQ(b32.binding, BoundKind::PerNode);
  // 16 GPUs: the node cut binds too, gain 15/8 over the ideal ring at busbw 100.
  Bound b16 = lowerBound(fourNicA100(2), Collective::AllGather, kGiB);
  EXPECT_EQ(b16.binding, BoundKind::PerNode) << b16.description;
  EXPECT_NEAR(b16.algbwGBps / ringAlgbw(100, 16), 15.0 / 8, 1e-9);
  // 32/64/128: the same node-cut ratios (N-1)/(N-g) as with 8 NICs.
  for (int nodes : {4, 8, 16}) {
    const int n = 8 * nodes;
    Bound b = lowerBound(fourNicA100(nodes), Collective::AllGather, kGiB);
    EXPECT_NEAR(b.algbwGBps / ringAlgbw(100, n), (n - 1.0) / (n - 8), 1e-9);
  }
}

TEST(BoundsWorkedNumbers, DocsTableDgxA100x4AllGather) {
  // docs/bounds.md prints this table; keep both in step.
  auto rows = lowerBounds(preset("dgx-a100x4"), Collective::AllGather, {kMiB, 64 * kMiB, kGiB});
  ASSERT_EQ(rows.size(), 3U);
  for (const Bound& b : rows) {
    fmt::print("| {} | {:.3f} | {:.3f} | {:.3f} | {:.1f} | {:.1f} | {} |\n", core::formatSize(b.sizeBytes), b.latencyUs,
               b.bandwidthUs, b.timeUs, b.algbwGBps, b.busbwGBps, toString(b.binding));
  }
  EXPECT_NEAR(rows[0].timeUs, 3.932, 0.001);  // 1 MiB: 24/32 x 1048576 B / 200 GB/s
  EXPECT_NEAR(rows[1].timeUs, 251.658, 0.001);
  EXPECT_NEAR(rows[2].timeUs, 4026.532, 0.001);
  for (const Bound& b : rows) EXPECT_NEAR(b.algbwGBps, 800.0 / 3, 1e-9);
  Bound small = lowerBound(preset("dgx-a100x4"), Collective::AllGather, 1 * kKiB);
  EXPECT_EQ(small.binding, BoundKind::Latency);
  EXPECT_DOUBLE_EQ(small.timeUs, 1.2);  // NIC 1.0 us + one rail switch hop 0.2 us
}

TEST(Bounds, SingleNodeIsBoundByNvSwitch) {
  struct Case {
    const char* name;
    double nvswitch;
  };
  for (const Case& c : {Case{"dgx-a100", 300}, Case{"dgx-h100", 450}, Case{"hgx-h200", 450}}) {
    core::Topology t = preset(c.name);
    for (Collective coll : {Collective::AllGather, Collective::ReduceScatter, Collective::AllToAll}) {
      Bound b = lowerBound(t, coll, kGiB);
      EXPECT_EQ(b.binding, BoundKind::PerGpu) << c.name;
      EXPECT_NEAR(b.busbwGBps, c.nvswitch, 1e-9) << c.name << " " << core::toString(coll);
    }
    for (Collective coll : {Collective::Broadcast, Collective::Reduce}) {
      EXPECT_NEAR(lowerBound(t, coll, kGiB).algbwGBps, c.nvswitch, 1e-9) << c.name;
    }
  }
  // All-Reduce without switch reduction: busbw <= B (2(N-1)/N M / B); with NVLS (Hopper's default): algbw <= B.
  EXPECT_NEAR(lowerBound(preset("dgx-a100"), Collective::AllReduce, kGiB).busbwGBps, 300, 1e-9);
  BoundOptions none;
  none.switchReduction = SwitchReduction::None;
  EXPECT_NEAR(lowerBound(preset("dgx-h100"), Collective::AllReduce, kGiB, none).busbwGBps, 450, 1e-9);
  EXPECT_NEAR(lowerBound(preset("dgx-h100"), Collective::AllReduce, kGiB).algbwGBps, 450, 1e-9);
  EXPECT_EQ(BoundModel(preset("dgx-h100")).switchReduction(), SwitchReduction::IntraNode);
  EXPECT_EQ(BoundModel(preset("dgx-a100")).switchReduction(), SwitchReduction::None);
}

TEST(Bounds, EveryCollectiveOnEveryPresetIsPositiveFiniteAndMonotone) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 1; s <= 4 * kGiB; s *= 4) sizes.push_back(s);
  for (const auto& p : core::presets()) {
    for (int nodes : {1, 2, 3, 4, 16}) {
      core::Topology t = preset(fmt::format("{}x{}", p.name, nodes));
      BoundModel model(t);
      for (Collective coll : kCollectives) {
        SCOPED_TRACE(fmt::format("{} {}", t.name, core::toString(coll)));
        double prev = 0;
        for (std::uint64_t s : sizes) {
          Bound b = model.bound(coll, s);
          ASSERT_TRUE(std::isfinite(b.timeUs) && b.timeUs > 0) << s;
          EXPECT_GT(b.latencyUs, 0);
          EXPECT_GT(b.bandwidthUs, 0);
          EXPECT_DOUBLE_EQ(b.timeUs, std::max(b.latencyUs, b.bandwidthUs));
          EXPECT_GE(b.timeUs, prev);
          EXPECT_NEAR(b.algbwGBps, core::gbps(static_cast<double>(s), b.timeUs), 1e-9 * b.algbwGBps);
          EXPECT_NEAR(b.busbwGBps, b.algbwGBps * core::busBandwidthFactor(coll, t.nRanks()), 1e-9 * b.busbwGBps);
          EXPECT_FALSE(b.description.empty());
          prev = b.timeUs;
          // Bandwidth terms are linear in the size.
          EXPECT_NEAR(model.bound(coll, 2 * s).bandwidthUs, 2 * b.bandwidthUs, 1e-9 * b.bandwidthUs);
        }
      }
    }
  }
}

TEST(Bounds, TermsAreConsistent) {
  for (const auto& p : core::presets()) {
    for (int nodes : {1, 2, 4, 8}) {
      core::Topology t = preset(fmt::format("{}x{}", p.name, nodes));
      for (auto reduction : {SwitchReduction::None, SwitchReduction::IntraNode, SwitchReduction::Everywhere}) {
        BoundOptions o;
        o.switchReduction = reduction;
        BoundModel model(t, o);
        for (Collective coll : kCollectives) {
          SCOPED_TRACE(fmt::format("{} {} {}", t.name, core::toString(coll), toString(reduction)));
          Bound b = model.bound(coll, kGiB);
          EXPECT_GE(b.bandwidthUs, b.perGpuUs);
          EXPECT_GE(b.bandwidthUs, b.perNodeUs);
          EXPECT_GE(b.bandwidthUs, b.cutUs);
          EXPECT_GE(b.bandwidthUs, b.partitionUs);
          EXPECT_GT(b.perGpuUs, 0);
          if (nodes > 1) {
            EXPECT_GT(b.perNodeUs, 0);
          }
          if (coll != Collective::AllReduce) {
            // The general enumeration contains the per-GPU and per-node sets, so it is at least as tight.
            EXPECT_GE(b.cutUs, b.perGpuUs * (1 - 1e-12));
            EXPECT_GE(b.cutUs, b.perNodeUs * (1 - 1e-12));
          }
        }
        // All-Reduce needs at least what All-Gather's bandwidth term needs, at the same size.
        EXPECT_GE(model.bound(Collective::AllReduce, kGiB).bandwidthUs,
                  model.bound(Collective::AllGather, kGiB).bandwidthUs);
        EXPECT_GE(model.bound(Collective::AllReduce, kGiB).bandwidthUs,
                  model.bound(Collective::ReduceScatter, kGiB).bandwidthUs);
      }
    }
  }
}

TEST(Bounds, AllReduceIsTwiceAllGatherWithoutSwitchReduction) {
  // Homogeneous GPUs and nodes: the partition bounds are exactly RS + AG = 2 x the AG cut.
  for (const char* name : {"dgx-a100", "dgx-a100x2", "dgx-a100x4", "dgx-h100x8"}) {
    BoundOptions o;
    o.switchReduction = SwitchReduction::None;
    BoundModel m(preset(name), o);
    EXPECT_NEAR(m.bound(Collective::AllReduce, kGiB).bandwidthUs, 2 * m.bound(Collective::AllGather, kGiB).bandwidthUs,
                1e-9)
        << name;
  }
}

TEST(Bounds, StructuredEnumerationAgreesWithExhaustive) {
  // Small topologies fit the exhaustive enumeration; forcing the structured one (node subsets + node unions) must
  // not find anything the exhaustive one misses, and here (symmetric nodes) it finds the same bound.
  const std::string toml = R"(
nodes = NODES
gpus_per_node = 2
[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 100.0
latency_us = 0.5
[[nics]]
name = "nic0"
bandwidth_gbytes_per_s = 10.0
latency_us = 1.0
gpus = [0, 1]
[[nics]]
name = "nic1"
bandwidth_gbytes_per_s = 30.0
latency_us = 1.0
gpus = [1]
[inter]
kind = "KIND"
oversubscription = OVER
switch_latency_us = 0.2
)";
  for (const char* nodes : {"2", "3"}) {
    for (const char* kind : {"rail-optimized", "fat-tree"}) {
      for (const char* over : {"1.0", "2.0"}) {
        std::string text = toml;
        text.replace(text.find("NODES"), 5, nodes);
        text.replace(text.find("KIND"), 4, kind);
        text.replace(text.find("OVER"), 4, over);
        auto t = core::parseTopologyToml(text, "small.toml");
        ASSERT_TRUE(t.ok()) << t.error().str();
        for (int root : {0, 1, 3}) {
          BoundOptions exhaustive;
          exhaustive.root = root;
          BoundModel full(*t, exhaustive);
          ASSERT_NE(full.enumeration().find("exhaustive"), std::string::npos) << full.enumeration();
          BoundOptions structured = exhaustive;
          structured.maxExhaustiveVertices = 7;
          BoundModel part(*t, structured);
          ASSERT_EQ(part.enumeration().find("exhaustive"), std::string::npos) << part.enumeration();
          for (Collective coll : kCollectives) {
            SCOPED_TRACE(fmt::format("{} nodes, {}, oversubscription {}, root {}, {}", nodes, kind, over, root,
                                     core::toString(coll)));
            Bound a = full.bound(coll, kGiB);
            Bound b = part.bound(coll, kGiB);
            EXPECT_GE(a.cutUs, b.cutUs * (1 - 1e-12));
            EXPECT_NEAR(a.bandwidthUs, b.bandwidthUs, 1e-9 * a.bandwidthUs) << a.description << " / " << b.description;
          }
        }
      }
    }
  }
}

TEST(Bounds, OversubscribedFatTreeCutsAtTheLeafUplink) {
  core::Topology t = preset("dgx-a100x4");
  t.inter.kind = core::InterFabricKind::FatTree;
  t.inter.oversubscription = 2.0;
  Bound b = lowerBound(t, Collective::AllGather, kGiB);
  // A node's injection is 200 / 2 = 100 GB/s: algbw 100 x 32 / 24.
  EXPECT_NEAR(b.algbwGBps, 100.0 * 32 / 24, 1e-9) << b.description;
  EXPECT_EQ(b.binding, BoundKind::PerNode);
}

TEST(Bounds, Latency) {
  // One node: the NVSwitch hop; several: NIC plus one rail switch hop. No protocol overheads.
  EXPECT_DOUBLE_EQ(lowerBound(preset("dgx-a100"), Collective::AllGather, 1).latencyUs, 0.6);
  EXPECT_DOUBLE_EQ(lowerBound(preset("dgx-a100x4"), Collective::AllReduce, 1).latencyUs, 1.2);
  Bound b = lowerBound(preset("dgx-a100x4"), Collective::AllGather, 1);
  EXPECT_DOUBLE_EQ(b.singlePortLatencyUs, 4 * 0.6 + 1.2);  // ceil(log2 32) = 5 rounds, one between nodes
  BoundOptions single;
  single.singlePortLatency = true;
  EXPECT_DOUBLE_EQ(lowerBound(preset("dgx-a100x4"), Collective::AllGather, 1, single).latencyUs, 3.6);
  EXPECT_DOUBLE_EQ(lowerBound(preset("dgx-a100"), Collective::AllGather, 1, single).latencyUs, 3 * 0.6);
}

TEST(Bounds, RootsEmptyAndCustom) {
  core::Topology t = preset("dgx-a100x4");
  BoundOptions o;
  o.root = 13;
  EXPECT_DOUBLE_EQ(lowerBound(t, Collective::Broadcast, kGiB, o).timeUs,
                   lowerBound(t, Collective::Broadcast, kGiB).timeUs);
  EXPECT_DOUBLE_EQ(lowerBound(t, Collective::Reduce, kGiB, o).timeUs, lowerBound(t, Collective::Reduce, kGiB).timeUs);
  o.root = 32;
  EXPECT_NE(validateBoundOptions(t, o), "");
  EXPECT_THROW(lowerBound(t, Collective::Broadcast, kGiB, o), std::invalid_argument);
  Bound empty = lowerBound(t, Collective::AllGather, 0);
  EXPECT_EQ(empty.timeUs, 0);
  EXPECT_EQ(empty.binding, BoundKind::None);
  EXPECT_EQ(lowerBound(t, Collective::Custom, kGiB).binding, BoundKind::None);
  core::Topology one = preset("dgx-a100");
  one.gpusPerNode = 1;
  one.nics.clear();
  one.inter = core::InterFabric{};
  ASSERT_TRUE(one.validate().empty());
  EXPECT_EQ(lowerBound(one, Collective::AllReduce, kGiB).timeUs, 0);
  nlohmann::json j = boundToJson(lowerBound(t, Collective::AllGather, kGiB));
  for (const char* key : {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "latency_us", "bandwidth_us"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(Bounds, LargeTopologiesAreCheap) {
  // 1024 GPUs: one node's 2^17 subsets, 4 x 126 node unions.
  BoundModel m(preset("dgx-h100x128"));
  EXPECT_GT(m.bound(Collective::AllGather, kGiB).algbwGBps, 400);
  BoundModel huge(preset("dgx-a100x4096"));
  EXPECT_NEAR(huge.bound(Collective::AllGather, kGiB).algbwGBps, 200.0 * 32768 / (32768 - 8), 1e-9);
}

TEST(EffectiveTopology, ScalesEveryBandwidthByItsHopClass) {
  const core::Topology t = core::presetTopology("dgx-a100x4").value();
  const core::Topology e = effectiveTopology(t, 0.8, 1.0, 0.96);
  EXPECT_DOUBLE_EQ(e.intra.gpuBandwidthGBps, t.intra.gpuBandwidthGBps * 0.8);
  ASSERT_EQ(e.nics.size(), t.nics.size());
  for (std::size_t i = 0; i < t.nics.size(); ++i)
    EXPECT_DOUBLE_EQ(e.nics[i].bandwidthGBps, t.nics[i].bandwidthGBps * 0.96);
  EXPECT_TRUE(e.validate().empty());
  // All-Gather across nodes is bound by the NICs: the effective bound is the raw one over the NIC efficiency.
  const double raw = BoundModel(t).bound(core::Collective::AllGather, 1u << 30).timeUs;
  const double eff = BoundModel(e).bound(core::Collective::AllGather, 1u << 30).timeUs;
  EXPECT_NEAR(eff, raw / 0.96, raw * 1e-9);
}

}  // namespace
}  // namespace optiflow::sim
