// sim::lowerBoundUs is what the synthesis loop uses to skip simulations: it must never exceed the simulated time,
// or the loop would throw away schedules that win. Checked over every gallery program, protocol and channel count
// the loop tries, at sizes from latency-bound to bandwidth-bound.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {
namespace {

struct Tally {
  int checked = 0;
  double worstRatio = 1;  // the least bound / time seen (how loose it gets)
};

void checkPreset(const std::string& preset, const std::vector<std::uint64_t>& sizes, Tally& tally) {
  auto topo = core::presetTopology(preset);
  ASSERT_TRUE(topo.ok()) << preset;
  auto net = sim::Network::build(*topo);
  ASSERT_TRUE(net.ok()) << preset;
  for (const EmbeddedProgram& p : galleryPrograms()) {
    const Frontend f = parseAndExpand(p.text, p.file, *topo, {});
    if (!f.ok()) continue;  // not every program applies to every cluster
    for (std::uint64_t size : sizes) {
      for (compiler::CompileOptions o : candidateOptions(*f.intent, size)) {
        auto c = compiler::compile(*f.intent, *topo, o);
        if (!c) continue;
        const sim::SimParams params;
        const sim::SimResult r = sim::simulate(c->schedule, *net, size, params);
        ASSERT_TRUE(r.ok) << p.file << " " << r.error;
        const double lb = sim::lowerBoundUs(c->schedule, *net, size, params);
        const std::string what = fmt::format("{} on {} at {} {}/{}ch", p.file, preset, core::formatSize(size),
                                             core::toString(*o.protocol), o.channels);
        EXPECT_GT(lb, 0) << what;
        EXPECT_LE(lb, r.timeUs * (1 + 1e-9)) << what << ": bound " << lb << " us, simulated " << r.timeUs << " us";
        ++tally.checked;
        tally.worstRatio = std::min(tally.worstRatio, lb / r.timeUs);
      }
    }
  }
}

TEST(LowerBound, NeverExceedsTheSimulatedTime) {
  Tally tally;
#if defined(__SANITIZE_ADDRESS__)
  // Under the sanitizers every simulation is ~20x slower: one cluster, a latency- and a bandwidth-bound size.
  checkPreset("dgx-h100x2", {1024, 8 << 20}, tally);
  EXPECT_GT(tally.checked, 100);
#else
  checkPreset("dgx-h100x2", {1024, 256 * 1024, 8 << 20, 256 << 20}, tally);
  checkPreset("dgx-a100x4", {4096, 64 << 20}, tally);
  EXPECT_GT(tally.checked, 300);
#endif
  RecordProperty("checked", tally.checked);
}

TEST(LowerBound, IsTightForABandwidthBoundRing) {
  // At 1 GiB a ring's time is its busiest link's bytes: the bound must be close, or it prunes nothing.
  auto topo = core::presetTopology("dgx-a100x4");
  ASSERT_TRUE(topo.ok());
  auto net = sim::Network::build(*topo);
  ASSERT_TRUE(net.ok());
  for (const EmbeddedProgram& p : galleryPrograms()) {
    if (std::string(p.file) != "allgather_ring.ofl") continue;
    const Frontend f = parseAndExpand(p.text, p.file, *topo, {});
    ASSERT_TRUE(f.ok()) << f.message;
    compiler::CompileOptions o;
    o.sizeBytes = 1ull << 30;
    o.protocol = core::Protocol::Simple;
    o.channels = 2;
    o.slices = 2;
    auto c = compiler::compile(*f.intent, *topo, o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    const double lb = sim::lowerBoundUs(c->schedule, *net, o.sizeBytes);
    const sim::SimResult r = sim::simulate(c->schedule, *net, o.sizeBytes);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_GT(lb, 0.6 * r.timeUs) << "bound " << lb << " us, simulated " << r.timeUs << " us";
    EXPECT_LE(lb, r.timeUs);
    return;
  }
  FAIL() << "allgather_ring.ofl is not in the gallery";
}

TEST(LowerBound, IsZeroForAMalformedSchedule) {
  auto topo = core::presetTopology("dgx-a100x4");
  ASSERT_TRUE(topo.ok());
  auto net = sim::Network::build(*topo);
  ASSERT_TRUE(net.ok());
  core::Schedule s;
  s.nRanks = 3;  // the network has 32
  EXPECT_EQ(sim::lowerBoundUs(s, *net, 1 << 20), 0);
  const sim::BoundCurve curve = sim::boundCurve(s, *net);
  EXPECT_FALSE(curve.ok());
  EXPECT_EQ(curve.at(1 << 20), 0);
}

}  // namespace
}  // namespace optiflow::synth
