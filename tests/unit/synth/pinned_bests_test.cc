// Seeded synthesis runs on small clusters, their bests pinned: which program wins each size, with which options, and
// its simulated time. A speed change (in the simulator, the compiler or the loop) must leave this table as it is; a
// change to the model itself changes it on purpose, and then the new table goes in with the commit that says why
// (the failure prints the table the code produces now, in the form below).
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/synth/builtin_proposer.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/loop.h"

namespace optiflow::synth {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;

// One line per size: size, best program, options, best time, NCCL's choice's time (both to 0.01 us).
std::string bestsTable(std::string_view preset, core::Collective coll, std::vector<std::uint64_t> sizes) {
  auto topo = core::presetTopology(preset);
  if (!topo) return "preset: " + topo.error().str();
  SynthConfig cfg;
  cfg.collective = coll;
  cfg.sizes = std::move(sizes);
  cfg.threads = 2;  // the result does not depend on it (SynthLoop.IsDeterministicForASeed)
  BuiltinProposer proposer(1);
  SimEvaluator evaluator(*topo, cfg.params);
  const SynthResult res = runSynthesis(*topo, cfg, proposer, evaluator);
  std::string out;
  for (const SizeBest& sb : res.sizes) {
    const std::string name = sb.best >= 0 ? res.history[static_cast<std::size_t>(sb.best)].name : "-";
    out += fmt::format("{} {} {} {:.2f} {:.2f}\n", core::formatSize(sb.sizeBytes), name, sb.config, sb.bestUs,
                       sb.nccl.timeUs);
  }
  return out;
}

TEST(PinnedBests, AllGatherOnOneDgxA100) {
  EXPECT_EQ(bestsTable("dgx-a100", core::Collective::AllGather, {4 * kKiB, 256 * kKiB, 4 * kMiB, 64 * kMiB}),
            "4KiB direct LL/1ch/1sl 9.23 12.81\n"
            "256KiB direct LL/1ch/1sl 11.11 13.18\n"
            "4MiB direct LL128/2ch/2sl 35.21 41.54\n"
            "64MiB direct Simple/4ch/4sl 267.47 351.22\n");
}

TEST(PinnedBests, AllGatherOnTwoDgxA100) {
  EXPECT_EQ(bestsTable("dgx-a100x2", core::Collective::AllGather, {4 * kKiB, 256 * kKiB, 4 * kMiB, 64 * kMiB}),
            "4KiB direct LL/1ch/1sl 12.47 25.82\n"
            "256KiB hierarchical_rail_v31 LL/2ch/1sl 14.32 68.70\n"
            "4MiB hierarchical_rail_v19 LL/2ch/2sl 39.78 69.35\n"
            "64MiB hierarchical_rail_v10 LL128/2ch/2sl 287.69 502.34\n");
}

TEST(PinnedBests, ReduceScatterAndAllReduceOnTwoDgxH100) {
  EXPECT_EQ(bestsTable("dgx-h100x2", core::Collective::ReduceScatter, {64 * kKiB, 1 * kMiB, 16 * kMiB}),
            "64KiB hierarchical_node_rail_v25 LL/2ch/1sl 13.08 23.97\n"
            "1MiB hierarchical_node_rail_v25 LL/2ch/1sl 15.71 66.70\n"
            "16MiB hierarchical_node_rail_direct_v15 LL128/2ch/2sl 72.40 89.57\n");
  // At 16 MiB NCCL's own choice on two H100 nodes is NVLSTree, which no schedule can express: NCCL's time is 0
  // there (n/a in the table), the bests are as before.
  EXPECT_EQ(bestsTable("dgx-h100x2", core::Collective::AllReduce, {64 * kKiB, 1 * kMiB, 16 * kMiB}),
            "64KiB hierarchical_tree_v56 LL/1ch/1sl 13.92 24.84\n"
            "1MiB hierarchical_tree_v56 LL/1ch/1sl 20.14 89.69\n"
            "16MiB hierarchical_tree_v41 LL128/2ch/2sl 113.89 0.00\n");
}

}  // namespace
}  // namespace optiflow::synth
