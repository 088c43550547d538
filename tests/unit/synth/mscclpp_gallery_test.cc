// Every gallery program, compiled for one node (dgx-a100, 8 ranks) and two nodes (dgx-a100x2, 16 ranks) at a small
// and a large size, exports to an MSCCL++ plan that re-imports from its JSON, is proven and runs with real bytes.
// Broadcast and Reduce are refused by name: a plan carries no root.
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/mscclpp_export.h"
#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {
namespace {

namespace mpp = compiler::mscclpp;

TEST(MscclppGallery, EveryProgramExportsProvenAtOneAndTwoNodes) {
  int exported = 0;
  int refused = 0;
  for (const std::string preset : {"dgx-a100", "dgx-a100x2"}) {
    auto topo = core::loadTopology(preset);
    ASSERT_TRUE(topo.ok());
    for (const auto& program : galleryPrograms()) {
      const Frontend fe = parseAndExpand(program.text, program.file, *topo);
      if (!fe.ok()) continue;  // gallery_test covers the programs that do not apply to a preset
      for (std::uint64_t size : {std::uint64_t{64} << 10, std::uint64_t{64} << 20}) {
        SCOPED_TRACE(fmt::format("{} on {} at {} bytes", program.file, preset, size));
        compiler::CompileOptions co;
        co.sizeBytes = size;
        const auto compiled = compiler::compile(*fe.intent, *topo, co);
        ASSERT_TRUE(compiled.ok()) << compiled.error().str();
        mpp::ExportOptions eo;
        eo.ranksPerNode = topo->gpusPerNode;
        const auto plan = mpp::exportPlan(compiled->schedule, eo);
        const auto c = compiled->schedule.collective;
        if (c == core::Collective::Broadcast || c == core::Collective::Reduce) {
          ASSERT_FALSE(plan.ok());
          EXPECT_NE(plan.error().message.find("carries no root"), std::string::npos) << plan.error().message;
          ++refused;
          continue;
        }
        ASSERT_TRUE(plan.ok()) << plan.error().str();
        auto back = mpp::parseMscclppPlan(mpp::writeMscclppPlan(plan->plan), "exported.json");
        ASSERT_TRUE(back.ok()) << back.error().str();
        const auto proof = mpp::verifyPlan(*back);
        EXPECT_TRUE(proof.proven) << (proof.errors.empty() ? "" : proof.errors.front().str());
        EXPECT_TRUE(mpp::checkPlanLimits(*back).empty());
        mpp::PlanRunOptions ro;
        ro.orders = 1;
        ro.elementsPerChunk = 2;
        EXPECT_TRUE(mpp::runPlan(*back, ro).passed);
        ++exported;
      }
    }
  }
  EXPECT_GE(exported, 20);
  EXPECT_GE(refused, 2);
}

// A plan too large for the plan verifier is not exported, and the export says why without calling it its own fault:
// the demo's 64 MiB winner on 32 GPUs (8 parts, direct on the rails, then direct in the node; LL128, one channel).
TEST(MscclppGallery, APlanTooLargeToProveIsNotExported) {
  auto topo = core::loadTopology("dgx-a100x4");
  ASSERT_TRUE(topo.ok());
  const std::string text =
      "allgather split_rails_then_nodes\n  split 8\n  for g in gpus:\n    allgather rail(g) by direct\n"
      "  for n in nodes:\n    allgather node(n) by direct\n";
  const Frontend fe = parseAndExpand(text, "split.ofl", *topo);
  ASSERT_TRUE(fe.ok()) << fe.message;
  compiler::CompileOptions co;
  co.sizeBytes = std::uint64_t{64} << 20;
  co.protocol = core::Protocol::LL128;
  co.channels = 1;
  co.slices = 1;
  const auto compiled = compiler::compile(*fe.intent, *topo, co);
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  mpp::ExportOptions eo;
  eo.ranksPerNode = topo->gpusPerNode;
  const auto plan = mpp::exportPlan(compiled->schedule, eo);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("too large for the plan verifier"), std::string::npos) << plan.error().message;
  EXPECT_EQ(plan.error().message.find("internal error"), std::string::npos) << plan.error().message;
}

}  // namespace
}  // namespace optiflow::synth
