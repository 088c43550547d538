#include "optiflow/sim/simulator.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"

namespace optiflow::sim {
namespace {

using core::BufferKind;
using core::Protocol;
using core::Schedule;
using core::StepOp;
using core::fixtures::makeBlock;
using core::fixtures::makeStep;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

core::Topology preset(const std::string& name) {
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << name;
  return t.ok() ? t.value() : core::Topology{};
}

Network network(const core::Topology& t) {
  auto n = Network::build(t);
  EXPECT_TRUE(n.ok()) << (n.ok() ? "" : n.error().str());
  return std::move(n).value();
}

std::vector<std::string> pathNames(const Network& net, int a, int b) {
  std::vector<std::string> out;
  for (int l : net.path(a, b)) out.push_back(net.link(l).name);
  return out;
}

// Four GPUs in a square NVLink mesh 0-1-2-3-0 (no diagonals), 50 GB/s each, 1 us.
core::Topology squareMesh() {
  core::Topology t;
  t.name = "square";
  t.nodes = 1;
  t.gpusPerNode = 4;
  t.gpuType = "V100";
  t.intra.kind = core::IntraFabricKind::NvLinkMesh;
  t.intra.latencyUs = 1.0;
  for (auto [a, b] : std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {0, 3}}) {
    t.intra.links.push_back({a, b, 50.0, 1.0});
  }
  return t;
}

// Four GPUs under two PCIe switches (0,1 | 2,3): GPU links 24 GB/s, uplinks 24, host path 10 GB/s; no latency.
core::Topology pcie4(double lat = 0.0) {
  core::Topology t;
  t.name = "pcie4";
  t.nodes = 1;
  t.gpusPerNode = 4;
  t.gpuType = "L40S";
  t.intra.kind = core::IntraFabricKind::Pcie;
  t.intra.gpuBandwidthGBps = 24.0;
  t.intra.latencyUs = lat;
  t.intra.hostBandwidthGBps = 10.0;
  t.intra.hostLatencyUs = lat;
  t.intra.switches = {{{0, 1}, 24.0}, {{2, 3}, 24.0}};
  return t;
}

// Parameters with every fixed cost off and one loop iteration, for bandwidth-only arithmetic.
SimParams bandwidthOnly() {
  SimParams p;
  p.launchUs = 0;
  p.baseLatencyUs = {0, 0, 0};
  for (auto& row : p.hopLatencyUs) row = {0, 0, 0};
  p.netOverheadUs = 0;
  for (auto& row : p.stepSyncUs) row = {0, 0, 0};
  p.iterationChunkBytes = {1e18, 1e18, 1e18};
  p.sliceBytes = {0, 0, 0};
  return p;
}

// The defaults without the per-step synchronisation (for tests of the transfer and latency mechanics; the sync
// has its own test, Simulator.StepSyncIsPaidPerStepAndIteration).
SimParams noStepSync() {
  SimParams p;
  for (auto& row : p.stepSyncUs) row = {0, 0, 0};
  return p;
}

// nRanks ranks, chunksPerLoop chunks; the caller adds blocks.
Schedule hand(int nRanks, int chunksPerLoop, Protocol proto = Protocol::Simple) {
  Schedule s = core::fixtures::emptySchedule(core::Collective::AllGather, nRanks, chunksPerLoop, false);
  s.protocol = proto;
  return s;
}

void addSend(Schedule& s, int from, int to, int count = 1, int channel = 0, int tbId = -1) {
  auto& tbs = s.ranks[from].threadBlocks;
  tbs.push_back(makeBlock(tbId >= 0 ? tbId : static_cast<int>(tbs.size()), to, -1, channel,
                          {makeStep(StepOp::Send, BufferKind::Input, 0, BufferKind::Output, 0, count)}));
}
void addRecv(Schedule& s, int at, int from, int count = 1, int channel = 0, int tbId = -1) {
  auto& tbs = s.ranks[at].threadBlocks;
  tbs.push_back(makeBlock(tbId >= 0 ? tbId : static_cast<int>(tbs.size()), -1, from, channel,
                          {makeStep(StepOp::Recv, BufferKind::Output, 0, BufferKind::Output, 0, count)}));
}

double us(double bytes, double gbPerS) { return bytes / (gbPerS * 1e3); }

// ---------------------------------------------------------------------------------------------------------------
// Network

TEST(Network, NvSwitchPresetShape) {
  auto net = network(preset("dgx-a100x2"));
  EXPECT_EQ(net.nRanks(), 16);
  EXPECT_EQ(pathNames(net, 0, 1), (std::vector<std::string>{"node0/gpu0->nvswitch", "node0/nvswitch->gpu1"}));
  // Same rail: through the rail's leaf only.
  EXPECT_EQ(pathNames(net, 2, 10), (std::vector<std::string>{"node0/gpu2->mlx5_2", "node0/mlx5_2->rail2",
                                                             "rail2->node1/mlx5_2", "node1/mlx5_2->gpu2"}));
  // Across rails: leaf, spine, leaf.
  EXPECT_EQ(pathNames(net, 7, 8),
            (std::vector<std::string>{"node0/gpu7->mlx5_7", "node0/mlx5_7->rail7", "rail7->spine", "spine->rail0",
                                      "rail0->node1/mlx5_0", "node1/mlx5_0->gpu0"}));
  const auto& t = net.topology();
  EXPECT_DOUBLE_EQ(net.pathLatencyUs(0, 1), t.intraLatencyUs(0, 1));
  EXPECT_DOUBLE_EQ(net.pathLatencyUs(2, 10), t.interLatencyUs(2, 2));
  EXPECT_DOUBLE_EQ(net.pathLatencyUs(7, 8), t.interLatencyUs(7, 0));
  EXPECT_DOUBLE_EQ(net.pathBandwidthGBps(0, 1), 300.0);
  EXPECT_DOUBLE_EQ(net.pathBandwidthGBps(7, 8), 25.0);
  EXPECT_TRUE(net.path(3, 3).empty());
  EXPECT_TRUE(net.path(-1, 3).empty());
  EXPECT_TRUE(net.path(0, 16).empty());
  EXPECT_EQ(net.rankOfVertex(net.gpuVertex(13)), 13);
  EXPECT_EQ(net.vertex(net.gpuVertex(13)).name, "node1/gpu5");
  EXPECT_EQ(net.vertex(net.spineVertex()).kind, VertexKind::SpineSwitch);
  EXPECT_EQ(net.vertex(net.nicVertex(1, 3)).name, "node1/mlx5_3");
}

TEST(Network, AdjacencyIsConsistent) {
  for (const char* name : {"dgx-a100x4", "dgx-h100", "hgx-h200x2"}) {
    auto net = network(preset(name));
    std::size_t outs = 0, ins = 0;
    for (const auto& v : net.vertices()) {
      for (int l : net.outLinks(v.id)) {
        EXPECT_EQ(net.link(l).src, v.id);
        ++outs;
      }
      for (int l : net.inLinks(v.id)) {
        EXPECT_EQ(net.link(l).dst, v.id);
        ++ins;
      }
    }
    EXPECT_EQ(outs, net.links().size());
    EXPECT_EQ(ins, net.links().size());
    for (std::size_t i = 0; i < net.links().size(); ++i) EXPECT_EQ(net.links()[i].id, static_cast<int>(i));
    // Every path is connected, starts at the source GPU and ends at the destination GPU.
    for (int a = 0; a < net.nRanks(); a += 3) {
      for (int b = 0; b < net.nRanks(); b += 5) {
        if (a == b) continue;
        Path p = net.path(a, b);
        ASSERT_FALSE(p.empty());
        EXPECT_EQ(net.link(p[0]).src, net.gpuVertex(a));
        EXPECT_EQ(net.link(p[p.size() - 1]).dst, net.gpuVertex(b));
        for (std::size_t i = 1; i < p.size(); ++i) EXPECT_EQ(net.link(p[i - 1]).dst, net.link(p[i]).src);
      }
    }
  }
}

TEST(Network, RailUplinksCarryOversubscribedBandwidth) {
  auto t = preset("dgx-a100x4");
  t.inter.oversubscription = 2.0;
  auto net = network(t);
  for (const auto& l : net.links()) {
    if (l.kind == LinkKind::FabricCore) {
      EXPECT_DOUBLE_EQ(l.bandwidthGBps, 4 * 25.0 / 2.0) << l.name;
    }
  }
  t.inter.kind = core::InterFabricKind::FatTree;
  auto ft = network(t);
  EXPECT_EQ(pathNames(ft, 2, 10).size(), 6u);  // leaf, spine, leaf even on the same rail
  EXPECT_DOUBLE_EQ(ft.pathLatencyUs(2, 10), t.interLatencyUs(2, 2));
  for (const auto& l : ft.links()) {
    if (l.kind == LinkKind::FabricCore) {
      EXPECT_DOUBLE_EQ(l.bandwidthGBps, t.nodeEgressBandwidth()) << l.name;
    }
  }
}

TEST(Network, MeshRelaysThroughCommonNeighbour) {
  auto net = network(squareMesh());
  EXPECT_EQ(pathNames(net, 0, 1), (std::vector<std::string>{"node0/gpu0->gpu1"}));
  EXPECT_EQ(pathNames(net, 0, 2), (std::vector<std::string>{"node0/gpu0->gpu1", "node0/gpu1->gpu2"}));
  EXPECT_EQ(pathNames(net, 3, 1), (std::vector<std::string>{"node0/gpu3->gpu0", "node0/gpu0->gpu1"}));
  EXPECT_DOUBLE_EQ(net.pathLatencyUs(0, 2), 2.0);
}

TEST(Network, PcieCrossesTheHostBetweenSwitches) {
  auto net = network(pcie4(1.0));
  EXPECT_EQ(pathNames(net, 0, 1), (std::vector<std::string>{"node0/gpu0->pcie0", "node0/pcie0->gpu1"}));
  EXPECT_EQ(pathNames(net, 1, 3),
            (std::vector<std::string>{"node0/gpu1->pcie0", "node0/pcie0->cpu0", "node0/cpu0->cpu1", "node0/cpu1->pcie1",
                                      "node0/pcie1->gpu3"}));
  EXPECT_DOUBLE_EQ(net.pathBandwidthGBps(1, 3), 10.0);
  EXPECT_DOUBLE_EQ(net.pathLatencyUs(1, 3), net.topology().intraLatencyUs(1, 3));
}

TEST(Network, RejectsInvalidTopology) {
  core::Topology t = preset("dgx-a100");
  t.intra.gpuBandwidthGBps = -1;
  auto n = Network::build(t);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("gpu_bandwidth"), std::string::npos) << n.error().message;
}

// ---------------------------------------------------------------------------------------------------------------
// Analytic single transfers

TEST(Simulator, OneSendOverOneNvSwitchHop) {
  const auto topo = preset("dgx-a100");
  const SimParams p = noStepSync();
  for (Protocol proto : {Protocol::Simple, Protocol::LL, Protocol::LL128}) {
    Schedule s = hand(8, 1, proto);
    addSend(s, 0, 1);
    addRecv(s, 1, 0);
    const double size = 64.0 * kMiB;
    auto r = simulate(s, topo, 64 * kMiB, p);
    ASSERT_TRUE(r.ok) << r.error;
    const int pi = protocolIndex(proto);
    const double bw = 300.0 * p.linkEfficiency[0] * p.protocolEfficiency[pi];
    const double expect = p.launchUs + p.baseLatencyUs[pi] + std::max(0.6, p.hopLatencyUs[0][pi]) + us(size, bw);
    EXPECT_NEAR(r.timeUs, expect, expect * 1e-9) << core::toString(proto);
    EXPECT_GT(r.iterations, 1u);  // 64 MiB is many loop iterations in every protocol; they stream back to back
    ASSERT_GE(r.bottleneckLink, 0);
    auto net = network(topo);
    EXPECT_EQ(net.link(r.bottleneckLink).name, "node0/gpu0->nvswitch");
    EXPECT_NEAR(r.links[r.bottleneckLink].bytes, size / p.protocolEfficiency[pi], 1.0);
  }
}

// A send and its receive, LL128 (no slice: the head arrives one hop after the send starts): every loop iteration's
// send pays the sync before it moves data and its receive pays it in parallel (it starts a hop after the send),
// so the time grows by exactly iterations x stepSyncUs over the sync-free formula.
TEST(Simulator, StepSyncIsPaidPerStepAndIteration) {
  const auto topo = preset("dgx-a100");
  SimParams p = noStepSync();
  Schedule s = hand(8, 1, Protocol::LL128);
  addSend(s, 0, 1);
  addRecv(s, 1, 0);
  auto r0 = simulate(s, topo, 64 * kMiB, p);
  ASSERT_TRUE(r0.ok) << r0.error;
  p.stepSyncUs[0][protocolIndex(Protocol::LL128)] = 2.5;
  auto r = simulate(s, topo, 64 * kMiB, p);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.iterations, 117u);  // ceil(64 MiB / 562.5 KiB)
  EXPECT_NEAR(r.timeUs, r0.timeUs + 117 * 2.5, 1e-6);
  // PCI and NET rows do not apply to an NVSwitch path.
  p.stepSyncUs[1] = {100, 100, 100};
  p.stepSyncUs[2] = {100, 100, 100};
  auto r2 = simulate(s, topo, 64 * kMiB, p);
  EXPECT_NEAR(r2.timeUs, r.timeUs, 1e-6);
}

// The bound takes, per thread block, its synchronisation plus its bytes at its path's capacity, and the slowest
// block can change with the size: here rank 0's block of ten small sends (ten synchronisations) at small sizes, rank
// 2's one send of twice the data at large ones. lowerBoundUs keeps only the blocks that are the slowest at some size
// (sim::boundCurve), so both must be kept.
TEST(LowerBound, TheSlowestBlockChangesWithTheSize) {
  const auto topo = preset("dgx-a100");
  SimParams p;
  p.maxExactIterations = 1;
  const int ll128 = protocolIndex(Protocol::LL128);
  p.stepSyncUs[0][ll128] = 1.0;  // NVLink
  Schedule s = hand(8, 20, Protocol::LL128);
  std::vector<core::Step> small;
  std::vector<core::Step> smallRecv;
  for (int i = 0; i < 10; ++i) {
    small.push_back(makeStep(StepOp::Send, BufferKind::Input, i, BufferKind::Output, i, 1));
    smallRecv.push_back(makeStep(StepOp::Recv, BufferKind::Output, i, BufferKind::Output, i, 1));
  }
  s.ranks[0].threadBlocks.push_back(makeBlock(0, 1, -1, 0, small));
  s.ranks[1].threadBlocks.push_back(makeBlock(0, -1, 0, 0, smallRecv));
  addSend(s, 2, 3, 20);
  addRecv(s, 3, 2, 20);
  const double t0 = p.launchUs + p.baseLatencyUs[ll128];
  const double rate = 300.0 * p.linkEfficiency[0] * 1e3;  // bytes per us on the NVSwitch path
  const double eff = p.protocolEfficiency[ll128];
  for (std::uint64_t size : {64 * kKiB, 8 * kMiB}) {  // one iteration of 20 chunks each (LL128: 562.5 KiB a chunk)
    const double chunk = static_cast<double>(size) / 20;
    const double tenSmall = 10 * 1.0 + 10 * chunk / eff / rate;
    const double oneLarge = 1.0 + 20 * chunk / eff / rate;
    EXPECT_NEAR(lowerBoundUs(s, network(topo), size, p), t0 + std::max(tenSmall, oneLarge), 1e-9) << size;
  }
  EXPECT_GT(10 * 1.0 + 10 * (64.0 * kKiB / 20) / eff / rate, 1.0 + 20 * (64.0 * kKiB / 20) / eff / rate);
  EXPECT_LT(10 * 1.0 + 10 * (8.0 * kMiB / 20) / eff / rate, 1.0 + 20 * (8.0 * kMiB / 20) / eff / rate);
}

TEST(Simulator, SmallSendIsLatencyBound) {
  Schedule s = hand(8, 1, Protocol::LL);
  addSend(s, 0, 1);
  addRecv(s, 1, 0);
  SimParams p;
  auto r = simulate(s, preset("dgx-a100"), 8, p);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_NEAR(r.timeUs, p.launchUs + 6.6 + 0.6 + us(16, 240), 1e-9);
}

TEST(Simulator, TwoFlowsShareANicEqually) {
  // Two thread blocks of rank 0 send S each to rank 8 (node 1, same rail) on channels 0 and 1: both cross NIC 0.
  Schedule s = hand(16, 2);
  addSend(s, 0, 8, 1, 0);
  addSend(s, 0, 8, 1, 1);
  addRecv(s, 8, 0, 1, 0);
  addRecv(s, 8, 0, 1, 1);
  const SimParams p = bandwidthOnly();
  const double size = 256.0 * kMiB;  // 128 MiB per flow
  auto r = simulate(s, preset("dgx-a100x2"), 256 * kMiB, p);
  ASSERT_TRUE(r.ok) << r.error;
  const double nic = 25.0 * p.linkEfficiency[2];
  const double lat = network(preset("dgx-a100x2")).pathLatencyUs(0, 8);
  EXPECT_NEAR(r.timeUs, us(size, nic) + lat, 1e-6);  // each at nic/2 for the whole time
  // One flow alone takes half as long.
  Schedule one = hand(16, 2);
  addSend(one, 0, 8, 1, 0);
  addRecv(one, 8, 0, 1, 0);
  auto r1 = simulate(one, preset("dgx-a100x2"), 256 * kMiB, p);
  ASSERT_TRUE(r1.ok) << r1.error;
  EXPECT_NEAR(r1.timeUs, us(size / 2, nic) + lat, 1e-6);
  auto net = network(preset("dgx-a100x2"));
  EXPECT_NEAR(r.links[r.bottleneckLink].utilisation, 1.0, 1e-3);  // the span also holds the path latency
}

TEST(Simulator, MaxMinFairnessWithDifferentBottlenecks) {
  // Rank 0 sends S to rank 2 (across the 10 GB/s host path) and 2S to rank 1 (same switch, 24 GB/s); both leave
  // through gpu0's 24 GB/s link. Max-min: 0->2 gets 10 (its own bottleneck), 0->1 the remaining 14; after 0->2
  // finishes at S/10, 0->1 has 0.6 S left and runs at 24.
  Schedule s = hand(4, 3);
  addSend(s, 0, 2, 1);
  addSend(s, 0, 1, 2);
  addRecv(s, 2, 0, 1);
  addRecv(s, 1, 0, 2);
  const double size = 300.0 * kMiB;
  auto r = simulate(s, pcie4(), 300 * kMiB, bandwidthOnly());
  ASSERT_TRUE(r.ok) << r.error;
  const double S = size / 3;
  EXPECT_NEAR(r.timeUs, us(S, 10) + us(0.6 * S, 24), 1e-6);
  // The 0->2 transfer alone would take S/10 and the 0->1 alone 2S/24: sharing costs only the overlap.
  auto net = network(pcie4());
  EXPECT_EQ(net.link(r.bottleneckLink).name, "node0/gpu0->pcie0");
}

TEST(Simulator, FlowsStartingTogetherShareFromTheirFirstSlice) {
  // Rank 0 sends S to rank 1 on channel 0 and S to rank 1 on channel 1 from two thread blocks at the same instant;
  // both cross gpu0's link and pcie0's link to gpu1 (pcie4: 24 GB/s) at 12 GB/s from the start. Rank 1 forwards
  // channel 0's data to rank 3 across the 10 GB/s host path once the first slice has arrived: at slice / 12 GB/s,
  // whichever of rank 0's blocks is listed first. The forward is the slowest transfer, so the collective ends at
  // slice / 12 + S / 10, and the schedule with rank 0's blocks swapped takes exactly as long.
  auto build = [](bool forwardedFirst) {
    Schedule s = hand(4, 2);
    auto& tbs = s.ranks[0].threadBlocks;
    for (int k = 0; k < 2; ++k) {
      const int channel = (k == 0) == forwardedFirst ? 0 : 1;
      tbs.push_back(
          makeBlock(k, 1, -1, channel, {makeStep(StepOp::Send, BufferKind::Input, 0, BufferKind::Output, channel)}));
    }
    s.ranks[1].threadBlocks.push_back(
        makeBlock(0, 3, 0, 0, {makeStep(StepOp::RecvCopySend, BufferKind::Output, 0, BufferKind::Output, 0)}));
    s.ranks[1].threadBlocks.push_back(
        makeBlock(1, -1, 0, 1, {makeStep(StepOp::Recv, BufferKind::Output, 1, BufferKind::Output, 1)}));
    addRecv(s, 3, 1);
    return s;
  };
  SimParams p = bandwidthOnly();
  p.sliceBytes = {4.0 * kMiB, 4.0 * kMiB, 4.0 * kMiB};
  auto a = simulate(build(true), pcie4(), 64 * kMiB, p);
  auto b = simulate(build(false), pcie4(), 64 * kMiB, p);
  ASSERT_TRUE(a.ok) << a.error;
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_EQ(a.timeUs, b.timeUs);
  EXPECT_NEAR(a.timeUs, us(4.0 * kMiB, 12) + us(32.0 * kMiB, 10), 1e-6);
}

// ---------------------------------------------------------------------------------------------------------------
// Rings

SimResult ringAg(const std::string& topo, std::uint64_t size, Protocol proto = Protocol::Simple, int channels = 1,
                 bool inPlace = false, const SimParams& p = {}) {
  auto t = preset(topo);
  core::fixtures::RingOptions o;
  o.nRanks = t.nRanks();
  o.channels = channels;
  o.protocol = proto;
  o.inPlace = inPlace;
  return simulate(core::fixtures::ringAllGather(o), t, size, p);
}

TEST(Simulator, RingAllGatherOnOneNodeApproachesLinkBandwidth) {
  // 1 GiB on 8 GPUs: each rank's 128 MiB block is 64 loop iterations of 2 MiB on one channel. Every iteration
  // pays one hop latency as a bubble (its last receive waits for the tail before the next iteration's send), so
  // one channel stays within 10 % of (n-1)/n S / bw (out of place, each iteration also copies its own 2 MiB); 8
  // channels split the block, cutting the bubbles to < 3 %.
  // Without the per-step sync: with one channel, 9 us per 2 MiB step would halve the rate (8.7 us of data).
  const SimParams p = noStepSync();
  const double bw = 300.0 * p.linkEfficiency[0];
  const double ideal = 7.0 / 8.0 * us(static_cast<double>(kGiB), bw);
  for (bool inPlace : {true, false}) {
    for (int channels : {1, 8}) {
      auto r = ringAg("dgx-a100", kGiB, Protocol::Simple, channels, inPlace, p);
      ASSERT_TRUE(r.ok) << r.error;
      const double slack = channels == 1 ? 1.10 : 1.03;
      EXPECT_GT(r.timeUs, ideal);
      EXPECT_LT(r.timeUs, ideal * slack) << "in place " << inPlace << ", " << channels << " channels: " << r.timeUs
                                         << " us vs " << ideal;
      EXPECT_GT(r.busbwGBps, bw / slack);
      EXPECT_LT(r.busbwGBps, bw);
    }
  }
}

TEST(Simulator, MultiNodeRingIsLimitedByTheNic) {
  const SimParams p = noStepSync();  // the NIC limit itself, without per-step costs
  const double nic = 25.0 * p.linkEfficiency[2];
  auto r = ringAg("dgx-a100x2", kGiB, Protocol::Simple, 1, true, p);
  ASSERT_TRUE(r.ok) << r.error;
  const double ideal = 15.0 / 16.0 * us(static_cast<double>(kGiB), nic);
  EXPECT_GT(r.timeUs, ideal);
  EXPECT_LT(r.timeUs, ideal * 1.03);
  // The NICs on the ring's two node crossings run saturated (and so does the spine -> rail0 uplink, which with
  // two nodes has exactly the capacity of the two flows it carries); NVSwitch ports idle 90 % of the time.
  auto net = network(preset("dgx-a100x2"));
  EXPECT_EQ(hopClassOf(net.link(r.bottleneckLink).kind), HopClass::Net) << net.link(r.bottleneckLink).name;
  EXPECT_GT(r.links[r.bottleneckLink].utilisation, 0.97);
  for (int l : net.path(7, 8)) EXPECT_GT(r.links[l].utilisation, 0.97) << net.link(l).name;
  EXPECT_LT(r.links[net.path(0, 1)[0]].utilisation, 0.15);
}

TEST(Simulator, TimeIsMonotoneInSize) {
  for (Protocol proto : {Protocol::Simple, Protocol::LL, Protocol::LL128}) {
    double prev = 0;
    for (std::uint64_t size = 1 * kKiB; size <= kGiB; size *= 4) {
      auto r = ringAg("dgx-a100x2", size, proto);
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_GE(r.timeUs, prev) << core::toString(proto) << " at " << size;
      prev = r.timeUs;
    }
  }
}

TEST(Simulator, RingTimeGrowsWithRankCount) {
  for (std::uint64_t size : {kKiB, kMiB, 256 * kMiB}) {
    double prev = 0;
    for (const char* t : {"dgx-a100", "dgx-a100x2", "dgx-a100x4", "dgx-a100x8"}) {
      auto r = ringAg(t, size);
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_GT(r.timeUs, prev) << t << " at " << size;
      prev = r.timeUs;
    }
  }
}

TEST(Simulator, ProtocolsTradeLatencyForBandwidth) {
  auto ll = ringAg("dgx-a100", kKiB, Protocol::LL);
  auto simple = ringAg("dgx-a100", kKiB, Protocol::Simple);
  ASSERT_TRUE(ll.ok && simple.ok);
  EXPECT_LT(ll.timeUs, simple.timeUs);
  // At 1 GiB on NCCL's 24 channels (per-step sync on: 9 us per Simple step, 1 per LL128 step).
  auto llBig = ringAg("dgx-a100", kGiB, Protocol::LL, 24);
  auto ll128Big = ringAg("dgx-a100", kGiB, Protocol::LL128, 24);
  auto simpleBig = ringAg("dgx-a100", kGiB, Protocol::Simple, 24);
  ASSERT_TRUE(llBig.ok && ll128Big.ok && simpleBig.ok);
  EXPECT_LT(simpleBig.timeUs, ll128Big.timeUs);
  EXPECT_LT(ll128Big.timeUs, llBig.timeUs);
  // The override in SimParams gives the same as changing the schedule.
  SimParams p;
  p.protocol = Protocol::LL;
  auto over = ringAg("dgx-a100", kGiB, Protocol::Simple, 24, false, p);
  ASSERT_TRUE(over.ok);
  EXPECT_EQ(over.timeUs, llBig.timeUs);
}

TEST(Simulator, CriticalPathEndsAtTheLastStep) {
  for (std::uint64_t size : {kKiB, 512 * kKiB}) {
    auto r = ringAg("dgx-a100x2", size, Protocol::Simple, 2);
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_FALSE(r.extrapolated);
    ASSERT_FALSE(r.criticalPath.empty());
    EXPECT_DOUBLE_EQ(r.criticalPath.back().endUs, r.timeUs);
    EXPECT_EQ(r.criticalPath.front().waitedOn, WaitKind::Start);
    EXPECT_DOUBLE_EQ(r.criticalPath.front().startUs, r.startUs);
    for (std::size_t i = 1; i < r.criticalPath.size(); ++i) {
      EXPECT_LE(r.criticalPath[i - 1].startUs, r.criticalPath[i].startUs + 1e-9);
    }
    // A ring All-Gather's critical path crosses n-1 = 15 hops.
    int hops = 0;
    for (const auto& c : r.criticalPath) hops += (c.waitedOn == WaitKind::DataHead || c.waitedOn == WaitKind::DataTail);
    EXPECT_GE(hops, 15);
  }
}

TEST(Simulator, ExtrapolationMatchesExactSimulation) {
  // 32 iterations simulated exactly vs 4 exactly and the rest extrapolated.
  SimParams exact;
  exact.maxExactIterations = 1000;
  SimParams fast;
  for (const char* t : {"dgx-a100", "dgx-a100x2"}) {
    auto a = ringAg(t, 256 * kMiB * (std::string(t) == "dgx-a100" ? 1 : 2), Protocol::Simple, 1, false, exact);
    auto b = ringAg(t, 256 * kMiB * (std::string(t) == "dgx-a100" ? 1 : 2), Protocol::Simple, 1, false, fast);
    ASSERT_TRUE(a.ok && b.ok);
    EXPECT_FALSE(a.extrapolated);
    EXPECT_TRUE(b.extrapolated);
    EXPECT_NEAR(b.timeUs, a.timeUs, a.timeUs * 0.01) << t;
  }
}

// A caller that only asks whether a schedule finishes by some time (SimParams::stopAtUs) gets either the full
// result, bit for bit, or a cut-off one whose time is past the stop and not past the full time. A time that may be
// replaced by a longer exact simulation (extrapolated from iterations that are not yet steady) is never cut.
TEST(Simulator, StopAtUsCutsOnlyPastItAndNeverChangesAFinishedTime) {
  int cut = 0;
  int whole = 0;
  int rerun = 0;
  for (const char* t : {"dgx-a100x2", "dgx-h100x4"}) {
    const auto topo = preset(t);
    const auto net = network(topo);
    core::fixtures::RingOptions o;
    o.nRanks = topo.nRanks();
    o.channels = 2;
    NcclScheduleOptions tree;
    tree.channels = 2;
    // NCCL's trees take longer than rings to reach a steady pipeline: simulate() runs them again with more exact
    // iterations.
    for (const auto& s : {core::fixtures::ringAllGather(o), core::fixtures::ringReduceScatter(o),
                          core::fixtures::ringAllReduce(o), ncclTreeAllReduce(topo, tree)}) {
      for (std::uint64_t size : {kKiB, 3 * kMiB + 5, 64 * kMiB, kGiB}) {
        for (bool fold : {true, false}) {
          SimParams p;
          p.foldSymmetricNodes = fold;
          const SimResult full = simulate(s, net, size, p);
          ASSERT_TRUE(full.ok) << full.error;
          ASSERT_FALSE(full.cutOff);
          rerun += full.simulatedIterations > p.maxExactIterations ? 1 : 0;
          for (double f : {0.0, 0.3, 0.7, 0.999, 1.0, 1.5}) {
            const std::string what = fmt::format("{} {} at {}, fold {}, stop {} x", t, s.name, size, fold, f);
            p.stopAtUs = f * full.timeUs;
            const SimResult r = simulate(s, net, size, p);
            ASSERT_TRUE(r.ok) << what << ": " << r.error;
            if (r.cutOff) {
              ++cut;
              EXPECT_GT(r.timeUs, p.stopAtUs) << what;
              EXPECT_LE(r.timeUs, full.timeUs) << what;
              EXPECT_TRUE(r.links.empty() && r.criticalPath.empty()) << what;
              EXPECT_EQ(r.bottleneckLink, -1) << what;
            } else {
              ++whole;
              EXPECT_EQ(r.timeUs, full.timeUs) << what;
              EXPECT_EQ(r.bottleneckLink, full.bottleneckLink) << what;
            }
            if (f == 0.0 || f >= 1.0) {
              EXPECT_FALSE(r.cutOff) << what;
            }
            // Nothing extrapolated: the run is the one simulate() returns, and it stops soon after the stop.
            if (!full.extrapolated && f == 0.3) {
              EXPECT_TRUE(r.cutOff) << what;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cut, 40);
  EXPECT_GT(whole, 100);
  EXPECT_GT(rerun, 2);
}

// A caller with a time budget (the synthesizer's --time-budget) gives the simulator a wall-clock deadline: past it
// the run gives up with an error that says so; a deadline that does not pass changes nothing.
TEST(Simulator, GivesUpAtItsDeadline) {
  const auto topo = preset("dgx-a100x2");
  const auto net = network(topo);
  core::fixtures::RingOptions o;
  o.nRanks = topo.nRanks();
  o.channels = 4;
  const Schedule s = core::fixtures::ringAllReduce(o);
  const SimResult full = simulate(s, net, 256 * kMiB);
  ASSERT_TRUE(full.ok) << full.error;
  SimParams p;
  p.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  const SimResult late = simulate(s, net, 256 * kMiB, p);
  EXPECT_FALSE(late.ok);
  EXPECT_TRUE(late.timedOut);
  EXPECT_NE(late.error.find("time budget"), std::string::npos) << late.error;
  p.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  const SimResult inTime = simulate(s, net, 256 * kMiB, p);
  ASSERT_TRUE(inTime.ok) << inTime.error;
  EXPECT_FALSE(inTime.timedOut);
  EXPECT_EQ(inTime.timeUs, full.timeUs);
}

TEST(Simulator, AllReduceAndReduceScatterRings) {
  auto t = preset("dgx-a100");
  core::fixtures::RingOptions o;
  o.nRanks = 8;
  auto ar = simulate(core::fixtures::ringAllReduce(o), t, kGiB);
  auto rs = simulate(core::fixtures::ringReduceScatter(o), t, kGiB);
  auto ag = simulate(core::fixtures::ringAllGather(o), t, kGiB);
  ASSERT_TRUE(ar.ok && rs.ok && ag.ok) << ar.error << rs.error << ag.error;
  // All-Reduce moves twice the data of the others over the same ring.
  EXPECT_NEAR(ar.timeUs / rs.timeUs, 2.0, 0.1);
  EXPECT_NEAR(ar.busbwGBps, rs.busbwGBps, rs.busbwGBps * 0.05);
  EXPECT_NEAR(ag.busbwGBps, rs.busbwGBps, rs.busbwGBps * 0.05);
}

// ---------------------------------------------------------------------------------------------------------------
// Errors and robustness

TEST(Simulator, RankCountMismatchIsAnError) {
  core::fixtures::RingOptions o;
  o.nRanks = 4;
  auto r = simulate(core::fixtures::ringAllGather(o), preset("dgx-a100"), kMiB);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("4 ranks"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("8"), std::string::npos) << r.error;
}

TEST(Simulator, BadReferencesAreErrorsNotCrashes) {
  const auto topo = preset("dgx-a100");
  auto base = [] {
    Schedule s = hand(8, 1);
    addSend(s, 0, 1);
    addRecv(s, 1, 0);
    return s;
  };
  struct Case {
    const char* what;
    void (*mutate)(Schedule&);
    const char* expect;
  };
  const Case cases[] = {
      {"peer out of range", [](Schedule& s) { s.ranks[0].threadBlocks[0].sendPeer = 99; }, "send peer 99"},
      {"peer is self", [](Schedule& s) { s.ranks[0].threadBlocks[0].sendPeer = 0; }, "send peer 0"},
      {"dep on missing tb",
       [](Schedule& s) {
         s.ranks[0].threadBlocks[0].steps[0].deps.push_back({7, 0});
       },
       "thread block 7"},
      {"dep on missing step",
       [](Schedule& s) {
         s.ranks[0].threadBlocks[0].steps[0].deps.push_back({0, 5});
       },
       "step 5"},
      {"unmatched send", [](Schedule& s) { s.ranks[1].threadBlocks.clear(); }, "1 sends but 0 receives"},
      {"count mismatch", [](Schedule& s) { s.ranks[1].threadBlocks[0].steps[0].count = 2; }, "chunks"},
      {"zero count", [](Schedule& s) { s.ranks[0].threadBlocks[0].steps[0].count = 0; }, "count"},
      {"no send peer", [](Schedule& s) { s.ranks[0].threadBlocks[0].sendPeer = -1; }, "no send peer"},
      {"bad chunksPerLoop", [](Schedule& s) { s.chunksPerLoop = 0; }, "chunksPerLoop"},
      {"missing rank programs", [](Schedule& s) { s.ranks.pop_back(); }, "rank programs"},
      {"self dependency",
       [](Schedule& s) {
         s.ranks[0].threadBlocks[0].steps[0].deps.push_back({0, 0});
       },
       "deadlock"},
      {"negative channel", [](Schedule& s) { s.ranks[0].threadBlocks[0].channel = -3; }, "channel"},
  };
  for (const auto& c : cases) {
    Schedule s = base();
    c.mutate(s);
    auto r = simulate(s, topo, kMiB);
    EXPECT_FALSE(r.ok) << c.what;
    EXPECT_NE(r.error.find(c.expect), std::string::npos) << c.what << ": " << r.error;
  }
  // A receive-before-send cycle between two ranks deadlocks.
  Schedule cyc = hand(8, 1);
  for (int r : {0, 1}) {
    cyc.ranks[r].threadBlocks.push_back(
        makeBlock(0, 1 - r, 1 - r, 0,
                  {makeStep(StepOp::Recv, BufferKind::Output, 0, BufferKind::Output, 0),
                   makeStep(StepOp::Send, BufferKind::Input, 0, BufferKind::Output, 0)}));
  }
  auto r = simulate(cyc, topo, kMiB);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  // An invalid topology through the convenience overload.
  core::Topology bad = topo;
  bad.nodes = 0;
  EXPECT_FALSE(simulate(base(), bad, kMiB).ok);
}

TEST(Simulator, EveryPresetAndFixtureSimulates) {
  for (const auto& info : core::presets()) {
    for (const std::string suffix : {"", "x2"}) {
      const auto t = preset(info.name + suffix);
      const auto net = network(t);
      core::fixtures::RingOptions o;
      o.nRanks = t.nRanks();
      o.channels = 2;
      for (const auto& s :
           {core::fixtures::ringAllGather(o), core::fixtures::ringReduceScatter(o), core::fixtures::ringAllReduce(o)}) {
        for (std::uint64_t size : {std::uint64_t{0}, kKiB, 3 * kMiB + 5, 64 * kMiB}) {
          auto r = simulate(s, net, size);
          ASSERT_TRUE(r.ok) << info.name << suffix << " " << s.name << ": " << r.error;
          EXPECT_GT(r.timeUs, 0);
          EXPECT_TRUE(std::isfinite(r.timeUs));
        }
      }
    }
  }
  // Mesh and PCIe fabrics too (relays and host crossings).
  for (const auto& t : {squareMesh(), pcie4(1.0)}) {
    core::fixtures::RingOptions o;
    o.nRanks = 4;
    auto r = simulate(core::fixtures::ringAllReduce(o), t, 16 * kMiB);
    ASSERT_TRUE(r.ok) << t.name << ": " << r.error;
  }
}

TEST(Simulator, RandomlyBrokenSchedulesNeverCrash) {
  std::mt19937 rng(12345);
  const auto net = network(preset("dgx-a100x2"));
  core::fixtures::RingOptions o;
  o.nRanks = 16;
  o.channels = 2;
  const Schedule base = core::fixtures::ringAllReduce(o);
  int failures = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Schedule s = base;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      auto& rp = s.ranks[rng() % 16];
      auto& tb = rp.threadBlocks[rng() % rp.threadBlocks.size()];
      auto& st = tb.steps[rng() % tb.steps.size()];
      switch (rng() % 8) {
        case 0:
          tb.sendPeer = static_cast<int>(rng() % 20) - 2;
          break;
        case 1:
          tb.recvPeer = static_cast<int>(rng() % 20) - 2;
          break;
        case 2:
          st.count = static_cast<int>(rng() % 4) - 1;
          break;
        case 3:
          st.deps.push_back({static_cast<int>(rng() % 4) - 1, static_cast<int>(rng() % 40) - 2});
          break;
        case 4:
          st.op = static_cast<StepOp>(rng() % 9);
          break;
        case 5:
          tb.channel = static_cast<int>(rng() % 4) - 1;
          break;
        case 6:
          tb.steps.pop_back();
          break;
        default:
          tb.id = static_cast<int>(rng() % 3);
          break;
      }
    }
    auto r = simulate(s, net, 1 + rng() % (64 * kMiB));
    if (!r.ok) {
      ++failures;
      EXPECT_FALSE(r.error.empty());
    } else {
      EXPECT_TRUE(std::isfinite(r.timeUs));
    }
  }
  EXPECT_GT(failures, 100);  // most edits break the schedule, and each says why
}

TEST(Simulator, EmptyAndZeroSizedSchedulesWork) {
  Schedule s = hand(8, 1);
  auto r = simulate(s, preset("dgx-a100"), kMiB);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.timeUs, r.startUs);
  EXPECT_EQ(r.bottleneckLink, -1);
  auto z = ringAg("dgx-a100x2", 0);
  ASSERT_TRUE(z.ok) << z.error;
  EXPECT_GT(z.timeUs, z.startUs);  // latency only
  EXPECT_EQ(z.algbwGBps, 0);
}

TEST(Simulator, IsDeterministic) {
  for (int rep = 0; rep < 2; ++rep) {
    auto a = ringAg("dgx-a100x4", 48 * kMiB + 7, Protocol::LL128, 3);
    auto b = ringAg("dgx-a100x4", 48 * kMiB + 7, Protocol::LL128, 3);
    ASSERT_TRUE(a.ok && b.ok);
    EXPECT_EQ(std::memcmp(&a.timeUs, &b.timeUs, sizeof(double)), 0);
    EXPECT_EQ(a.events, b.events);
    ASSERT_EQ(a.links.size(), b.links.size());
    for (std::size_t i = 0; i < a.links.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a.links[i], &b.links[i], sizeof(LinkUsage)), 0) << i;
    }
    ASSERT_EQ(a.criticalPath.size(), b.criticalPath.size());
    for (std::size_t i = 0; i < a.criticalPath.size(); ++i) {
      EXPECT_EQ(a.criticalPath[i].endUs, b.criticalPath[i].endUs);
      EXPECT_EQ(a.criticalPath[i].rank, b.criticalPath[i].rank);
    }
  }
}

TEST(Simulator, JsonRowHasTheSharedFields) {
  auto t = preset("dgx-a100");
  auto net = network(t);
  core::fixtures::RingOptions o;
  auto r = simulate(core::fixtures::ringAllGather(o), net, kMiB);
  ASSERT_TRUE(r.ok);
  auto j = simResultToJson(r, net);
  for (const char* k : {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "bottleneck", "critical_path"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["size_bytes"].get<std::uint64_t>(), kMiB);
}

}  // namespace
}  // namespace optiflow::sim
