// Honesty check: no schedule the project produces may be predicted faster than the lower bound on any preset.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim {
namespace {

namespace fx = core::fixtures;

const std::vector<std::string> kPresets = {"dgx-a100",   "dgx-h100",   "hgx-h200",  "dgx-a100x2",
                                           "dgx-h100x2", "dgx-a100x4", "hgx-h200x3"};
const std::vector<std::uint64_t> kSizes = {1024, 1u << 20, 64u << 20, 1u << 30, 4ull << 30};

void expectAtOrAboveBound(const core::Schedule& s, const Network& net, const BoundModel& bounds,
                          const std::string& what, int* checked, const std::vector<std::uint64_t>& sizes = kSizes) {
  for (core::Protocol proto : {core::Protocol::LL, core::Protocol::LL128, core::Protocol::Simple}) {
    SimParams params;
    params.protocol = proto;
    for (std::uint64_t size : sizes) {
      const SimResult r = simulate(s, net, size, params);
      ASSERT_TRUE(r.ok) << what << ": " << r.error;
      const Bound b = bounds.bound(s.collective, size);
      EXPECT_GE(r.timeUs, b.timeUs) << what << " " << core::toString(proto) << " at " << size << " bytes: simulated "
                                    << r.timeUs << " us < bound " << b.timeUs << " us (" << b.description << ")";
      ++*checked;
    }
  }
}

TEST(SimulatorVersusBound, FixtureRingsAreNeverFasterThanTheBoundOnAnyPreset) {
  int checked = 0;
  for (const auto& preset : kPresets) {
    auto topo = core::presetTopology(preset);
    ASSERT_TRUE(topo.ok()) << preset;
    auto net = Network::build(*topo);
    ASSERT_TRUE(net.ok()) << preset;
    const BoundModel bounds(*topo);
    const int n = topo->nRanks();
    for (int channels : {1, 4}) {
      for (bool inPlace : {false, true}) {
        const fx::RingOptions o{.nRanks = n, .channels = channels, .inPlace = inPlace};
        for (const core::Schedule& s : {fx::ringAllGather(o), fx::ringReduceScatter(o), fx::ringAllReduce(o)}) {
          expectAtOrAboveBound(s, *net, bounds, fmt::format("{} {}", preset, s.name), &checked);
        }
      }
    }
  }
  EXPECT_EQ(checked, 7 * 2 * 2 * 3 * 3 * 5);
}

TEST(SimulatorVersusBound, NcclSchedulesAreNeverFasterThanTheBoundOnAnyPreset) {
  int checked = 0;
  for (const auto& preset : kPresets) {
    auto topo = core::presetTopology(preset);
    ASSERT_TRUE(topo.ok()) << preset;
    auto net = Network::build(*topo);
    ASSERT_TRUE(net.ok());
    const BoundModel bounds(*topo);
    // The channel counts NCCL's model picks on these presets (up to 32) are where pipelines take longest to settle.
    // 16 channels only where the tree exists (two nodes and more): the sanitizer build runs this test too.
    for (int channels : {4, 16}) {
      if (channels == 16 && topo->nodes != 2) continue;
      const NcclScheduleOptions o{.channels = channels};
      const std::string tag = fmt::format("{} {}ch nccl ", preset, channels);
      // Fewer sizes than for the rings: these schedules are large (the sanitizer build runs this too).
      // (UnsettledPipelinesAreSimulatedUntilSteady covers the 16-channel tree at 1 GiB.)
      const std::vector<std::uint64_t> sizes = channels == 4 ? std::vector<std::uint64_t>{1024, 1u << 20, 1u << 30}
                                                             : std::vector<std::uint64_t>{1024, 1u << 20, 64u << 20};
      expectAtOrAboveBound(ncclRingAllGather(*topo, o), *net, bounds, tag + "ring allgather", &checked, sizes);
      expectAtOrAboveBound(ncclRingReduceScatter(*topo, o), *net, bounds, tag + "ring reducescatter", &checked, sizes);
      expectAtOrAboveBound(ncclRingAllReduce(*topo, o), *net, bounds, tag + "ring allreduce", &checked, sizes);
      expectAtOrAboveBound(ncclRingReduce(*topo, o), *net, bounds, tag + "ring reduce", &checked, sizes);
      if (topo->nodes > 1) {
        expectAtOrAboveBound(ncclTreeAllReduce(*topo, o), *net, bounds, tag + "tree allreduce", &checked, sizes);
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// A pipeline that has not settled after a few iterations must not be extrapolated from them (it once simulated a
// 16-channel tree at half its lower bound).
TEST(SimulatorVersusBound, UnsettledPipelinesAreSimulatedUntilSteady) {
  auto topo = core::presetTopology("dgx-h100x2");
  ASSERT_TRUE(topo.ok());
  auto net = Network::build(*topo);
  ASSERT_TRUE(net.ok());
  const core::Schedule tree = ncclTreeAllReduce(*topo, NcclScheduleOptions{.channels = 16});
  SimParams params;
  params.protocol = core::Protocol::LL128;
  const SimResult adaptive = simulate(tree, *net, 1ull << 30, params);
  ASSERT_TRUE(adaptive.ok) << adaptive.error;
  EXPECT_GT(adaptive.simulatedIterations, params.maxExactIterations);
  params.maxExactIterations = kMaxAdaptiveIterations;
  const SimResult exact = simulate(tree, *net, 1ull << 30, params);
  ASSERT_TRUE(exact.ok);
  EXPECT_NEAR(adaptive.timeUs, exact.timeUs, 0.05 * exact.timeUs);
  EXPECT_GE(adaptive.timeUs, lowerBound(*topo, core::Collective::AllReduce, 1ull << 30).timeUs);
}

}  // namespace
}  // namespace optiflow::sim
