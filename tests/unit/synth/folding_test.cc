// The simulator folds a node-symmetric schedule to node 0 (docs/simulator.md, "Symmetric schedules"): the result
// must be the full simulation's. Checked here over every gallery program and compile option the loop tries and over
// NCCL's own schedules, on rail-optimized clusters (oversubscribed too, so the shared rail uplinks bind), fat trees,
// PCIe and NVLink-mesh nodes, cyclic and xor symmetry; and an asymmetric schedule is never folded.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {
namespace {

struct Tally {
  int compared = 0;
  int cyclic = 0;
  int xorFolds = 0;
  int periodic = 0;  // folded with a period above 1
};

core::Topology loadTopo(const std::string& what) {
  auto t = what.ends_with(".toml")
               ? core::loadTopologyFile(
                     (std::filesystem::path(OPTIFLOW_SOURCE_DIR) / "examples" / "topologies" / what).string())
               : core::presetTopology(what);
  EXPECT_TRUE(t.ok()) << what << ": " << (t.ok() ? "" : t.error().str());
  return t.ok() ? *t : core::Topology{};
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)) + 1e-9; }

// Simulates `s` folded and in full and expects the same time, link bytes and bottleneck.
void compareFolded(const core::Schedule& s, const sim::Network& net, std::uint64_t size, const sim::SimParams& base,
                   const std::string& what, Tally& tally) {
  sim::SimParams full = base;
  full.foldSymmetricNodes = false;
  const sim::SimResult a = sim::simulate(s, net, size, base);
  const sim::SimResult b = sim::simulate(s, net, size, full);
  ASSERT_EQ(a.ok, b.ok) << what << ": " << a.error << " / " << b.error;
  if (!a.ok) return;
  EXPECT_EQ(b.symmetry.kind, sim::NodeSymmetry::Kind::None);
  EXPECT_EQ(a.symmetry, sim::nodeSymmetry(s, net)) << what;
  if (a.symmetry.kind == sim::NodeSymmetry::Kind::None) return;
  ++tally.compared;
  (a.symmetry.kind == sim::NodeSymmetry::Kind::Cyclic ? tally.cyclic : tally.xorFolds) += 1;
  if (a.symmetry.period > 1) ++tally.periodic;
  EXPECT_EQ(a.symmetry.fold * a.symmetry.period, net.topology().nodes) << what;
  EXPECT_TRUE(near(a.timeUs, b.timeUs)) << what << ": folded " << a.timeUs << " us, full " << b.timeUs << " us";
  EXPECT_EQ(a.iterations, b.iterations) << what;
  EXPECT_EQ(a.simulatedIterations, b.simulatedIterations) << what;
  EXPECT_EQ(a.steps * static_cast<std::uint64_t>(a.symmetry.fold), b.steps) << what;
  ASSERT_EQ(a.links.size(), b.links.size());
  for (std::size_t l = 0; l < a.links.size(); ++l) {
    EXPECT_TRUE(near(a.links[l].bytes, b.links[l].bytes)) << what << ": link " << net.link(static_cast<int>(l)).name
                                                          << " " << a.links[l].bytes << " / " << b.links[l].bytes;
  }
  ASSERT_GE(a.bottleneckLink, 0) << what;
  EXPECT_TRUE(near(a.links[a.bottleneckLink].utilisation, b.links[b.bottleneckLink].utilisation)) << what;
  EXPECT_TRUE(near(sim::lowerBoundUs(s, net, size, base), sim::lowerBoundUs(s, net, size, full))) << what;
}

void compareGallery(const core::Topology& topo, const std::vector<std::uint64_t>& sizes, Tally& tally) {
  auto net = sim::Network::build(topo);
  ASSERT_TRUE(net.ok()) << topo.name;
  for (const EmbeddedProgram& p : galleryPrograms()) {
    const Frontend f = parseAndExpand(p.text, p.file, topo, {});
    if (!f.ok()) continue;  // not every program applies to every cluster
    for (std::uint64_t size : sizes) {
      for (compiler::CompileOptions o : candidateOptions(*f.intent, size)) {
        auto c = compiler::compile(*f.intent, topo, o);
        if (!c) continue;
        compareFolded(c->schedule, *net, size, {},
                      fmt::format("{} on {} at {} {}/{}ch/{}sl", p.file, topo.name, core::formatSize(size),
                                  core::toString(*o.protocol), o.channels, o.slices),
                      tally);
      }
    }
  }
}

TEST(FoldedSimulation, GalleryProgramsGiveTheFullSimulationsResult) {
  Tally tally;
#if defined(__SANITIZE_ADDRESS__)
  // Under the sanitizers every simulation is ~20x slower: one cluster, one size.
  compareGallery(loadTopo("dgx-a100x4"), {1 << 20}, tally);
#else
  compareGallery(loadTopo("dgx-a100x4"), {4096, 1 << 20, 64 << 20}, tally);
  compareGallery(loadTopo("dgx-h100x3"), {64 << 10, 16 << 20}, tally);
  core::Topology over = loadTopo("dgx-a100x4");
  over.inter.oversubscription = 4;  // the rail leaves' shared uplinks bind
  compareGallery(over, {1 << 20, 64 << 20}, tally);
  compareGallery(loadTopo("abci-a100x4.toml"), {1 << 20, 64 << 20}, tally);  // fat tree, 4 NICs for 8 GPUs
  compareGallery(loadTopo("pcie-8gpu-x4.toml"), {1 << 20}, tally);
  compareGallery(loadTopo("dgx1-v100x2.toml"), {1 << 20}, tally);  // NVLink mesh
  EXPECT_GT(tally.xorFolds, 10);
#endif
  EXPECT_GT(tally.compared, 30);
  EXPECT_GT(tally.cyclic, 20);
  fmt::print("folded {} gallery schedules ({} cyclic, {} xor, {} with period 2 or more)\n", tally.compared,
             tally.cyclic, tally.xorFolds, tally.periodic);
}

TEST(FoldedSimulation, NcclSchedulesGiveTheFullSimulationsResult) {
  Tally tally;
  for (const char* preset : {"dgx-a100x4", "dgx-h100x3"}) {
    const core::Topology topo = loadTopo(preset);
    auto net = sim::Network::build(topo);
    ASSERT_TRUE(net.ok());
    const sim::NcclTuning tuning = sim::ncclTune(topo);
    for (core::Collective coll : {core::Collective::AllGather, core::Collective::ReduceScatter,
                                  core::Collective::AllReduce, core::Collective::Broadcast}) {
      for (std::uint64_t size : {std::uint64_t{8192}, std::uint64_t{4} << 20, std::uint64_t{256} << 20}) {
        sim::NcclPrediction p = sim::ncclPredict(tuning, coll, size);
        if (!p.ok()) continue;
        for (int a = 0; a < core::kNumAlgorithms; ++a) {
          for (int pr = 0; pr < core::kNumProtocols; ++pr) {
            if (p.time[static_cast<std::size_t>(a)][static_cast<std::size_t>(pr)] < 0) continue;
            for (int ch : {1, 4}) {
              sim::NcclPrediction q = p;
              q.algorithm = static_cast<core::Algorithm>(a);
              q.protocol = static_cast<core::Protocol>(pr);
              q.channels = ch;
              auto s = sim::ncclScheduleFor(topo, coll, q, {});
              if (!s) continue;
              compareFolded(
                  *s, *net, size, sim::ncclSimParams(q, {}),
                  fmt::format("NCCL {} {}/{}/{}ch on {} at {}", core::toString(coll), core::toString(q.algorithm),
                              core::toString(q.protocol), ch, preset, core::formatSize(size)),
                  tally);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(tally.compared, 20);
  EXPECT_GT(tally.periodic, 10);  // NCCL's rings alternate direction node by node: period 2
  fmt::print("folded {} NCCL schedules ({} cyclic, {} xor, {} with period 2 or more)\n", tally.compared, tally.cyclic,
             tally.xorFolds, tally.periodic);
}

TEST(FoldedSimulation, AnAsymmetricScheduleIsSimulatedInFull) {
  const core::Topology topo = loadTopo("dgx-a100x4");
  auto net = sim::Network::build(topo);
  ASSERT_TRUE(net.ok());
  const Frontend f = parseAndExpand(
      [] {
        for (const EmbeddedProgram& p : galleryPrograms()) {
          if (std::string(p.file) == "allgather_ring.ofl") return std::string(p.text);
        }
        return std::string();
      }(),
      "allgather_ring.ofl", topo, {});
  ASSERT_TRUE(f.ok()) << f.message;
  compiler::CompileOptions o;
  o.sizeBytes = 1 << 20;
  o.protocol = core::Protocol::Simple;
  o.channels = 2;
  auto c = compiler::compile(*f.intent, topo, o);
  ASSERT_TRUE(c.ok());
  core::Schedule s = c->schedule;
  ASSERT_EQ(sim::nodeSymmetry(s, *net), (sim::NodeSymmetry{sim::NodeSymmetry::Kind::Cyclic, 1, 4}));
  // The ranks of node 2 move twice as many chunks per step: no longer alike.
  for (int r = 16; r < 24; ++r) {
    for (core::ThreadBlock& tb : s.ranks[static_cast<std::size_t>(r)].threadBlocks) {
      for (core::Step& st : tb.steps) st.count *= 2;
    }
  }
  EXPECT_EQ(sim::nodeSymmetry(s, *net).kind, sim::NodeSymmetry::Kind::None);
  // A thread block's channel differs on one rank.
  core::Schedule t = c->schedule;
  t.ranks[9].threadBlocks[0].channel += 7;
  EXPECT_EQ(sim::nodeSymmetry(t, *net).kind, sim::NodeSymmetry::Kind::None);
  // The same schedule on one node has nothing to fold.
  const core::Topology one = loadTopo("dgx-a100");
  auto net1 = sim::Network::build(one);
  ASSERT_TRUE(net1.ok());
  core::Schedule small;
  small.nRanks = 8;
  EXPECT_EQ(sim::nodeSymmetry(small, *net1).kind, sim::NodeSymmetry::Kind::None);
}

}  // namespace
}  // namespace optiflow::synth
