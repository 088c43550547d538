// MSCCL++ execution plans: the reader and writer, the proof and the real-bytes run, on MSCCL++'s own plans
// (../shared/reference/mscclpp-plans), on broken variants of them and on small plans written here.
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/core/text_file.h"

namespace {

namespace fs = std::filesystem;
namespace mpp = optiflow::compiler::mscclpp;
using optiflow::compiler::Finding;
using optiflow::compiler::Property;
using optiflow::compiler::VerifyReport;

fs::path plansDir() { return fs::path(OPTIFLOW_SOURCE_DIR "/../shared/reference/mscclpp-plans"); }

std::vector<fs::path> referencePlans() {
  std::vector<fs::path> out;
  if (!fs::is_directory(plansDir())) return out;
  for (const auto& e : fs::directory_iterator(plansDir()))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

mpp::Plan load(const std::string& name) {
  const auto text = optiflow::core::readWholeFile(plansDir() / name);
  EXPECT_TRUE(text.has_value()) << name;
  auto plan = mpp::parseMscclppPlan(text.value_or(""), name);
  EXPECT_TRUE(plan.ok()) << (plan.ok() ? "" : plan.error().str());
  return plan.ok() ? plan.value() : mpp::Plan{};
}

std::string dump(const VerifyReport& r) {
  std::string out;
  for (const auto& f : r.errors) out += "  error: " + f.str() + "\n";
  for (const auto& f : r.warnings) out += "  warning: " + f.str() + "\n";
  return out;
}

bool has(const VerifyReport& r, Property p, int rank, int tb, int op, const std::string& text = "") {
  return std::any_of(r.errors.begin(), r.errors.end(), [&](const Finding& f) {
    return f.property == p && (rank < 0 || f.rank == rank) && (tb < 0 || f.tb == tb) && (op < 0 || f.step == op) &&
           f.message.find(text) != std::string::npos;
  });
}

#define SKIP_WITHOUT_PLANS() \
  if (referencePlans().empty()) GTEST_SKIP() << "no MSCCL++ plans at " << plansDir() << " (a clone lacks ../shared)"

TEST(MscclppPlan, EveryReferencePlanImportsAndTheWriterRoundTrips) {
  SKIP_WITHOUT_PLANS();
  EXPECT_EQ(referencePlans().size(), 11U);
  for (const auto& path : referencePlans()) {
    SCOPED_TRACE(path.string());
    const auto text = optiflow::core::readWholeFile(path);
    ASSERT_TRUE(text);
    EXPECT_TRUE(mpp::looksLikeMscclppPlan(*text));
    auto plan = mpp::parseMscclppPlan(*text, path.string());
    ASSERT_TRUE(plan.ok()) << plan.error().str();
    auto again = mpp::parseMscclppPlan(mpp::writeMscclppPlan(*plan), "written");
    ASSERT_TRUE(again.ok()) << again.error().str();
    mpp::Plan expected = *plan;
    expected.schemaNotes.clear();  // the writer always spells v0.10's schema
    for (auto& g : expected.gpus)
      for (auto& c : g.channels) c.legacyBuffKey = false;
    EXPECT_TRUE(*again == expected);
    EXPECT_TRUE(mpp::checkPlanLimits(*plan).empty());
  }
}

// The verdict on each of MSCCL++'s own plans, and why.
TEST(MscclppPlan, VerdictsOnMscclppsOwnPlans) {
  SKIP_WITHOUT_PLANS();
  struct Verdict {
    bool proven;
    Property first;  // the property every error is about (when not proven)
    std::string text;
  };
  const std::map<std::string, Verdict> expected{
      {"execfiles-allreduce.json", {true, Property::Shape, ""}},
      {"execfiles-allreduce_packet.json", {true, Property::Shape, ""}},
      // Written with "buff" for the switch channel's buffer: v0.10 reads "buffer_type". Everything else proves.
      {"execfiles-allreduce_pipeline.json", {false, Property::Shape, "\"buff\""}},
      {"executor-reduce.json", {true, Property::Shape, ""}},
      // glres stores into the peer's buffer, and only rlxsignal/rlxwait follow before the peer finishes.
      {"executor-reduce_nvls.json", {false, Property::Race, "rlxsignal"}},
      {"executor-reduce_nvls_pipeline.json", {false, Property::Race, "rlxsignal"}},
      {"executor-reduce_pack.json", {true, Property::Shape, ""}},
      {"executor-reduce_pack_tbg.json", {true, Property::Shape, ""}},
      // Thread-block groups cut a 2-chunk copy and a 1-chunk rres differently: rank 0's second block writes half
      // of rank 1's chunk 0 after syncing only with rank 1's second block, while rank 1's first block copies it.
      {"executor-reduce_tbg.json", {false, Property::Race, "rank 1 tb 0 op 0 (copy)"}},
      {"executor-transfer_pack.json", {true, Property::Shape, ""}},
      {"executor-transfer_pack_tbg.json", {true, Property::Shape, ""}},
  };
  for (const auto& path : referencePlans()) {
    const std::string name = path.filename().string();
    SCOPED_TRACE(name);
    const auto it = expected.find(name);
    ASSERT_NE(it, expected.end());
    const auto plan = load(name);
    const auto report = mpp::verifyPlan(plan);
    EXPECT_EQ(report.proven, it->second.proven) << dump(report);
    if (!it->second.proven) {
      ASSERT_FALSE(report.errors.empty());
      for (const auto& f : report.errors) EXPECT_EQ(f.property, it->second.first) << f.str();
      EXPECT_TRUE(std::any_of(report.errors.begin(), report.errors.end(), [&](const Finding& f) {
        return f.message.find(it->second.text) != std::string::npos;
      })) << dump(report);
    }
    // The data flow of every one of them is right: real bytes in random completion orders.
    const auto run = mpp::runPlan(plan);
    EXPECT_TRUE(run.passed) << fmt::format("{}", fmt::join(run.firstMismatches, "\n"));
    EXPECT_EQ(run.ordersRun, 4);
  }
}

// The switch-channel plan with "buff" proves once the field is spelled as v0.10 reads it.
TEST(MscclppPlan, PipelinedNvlsPlanProvesInV010Spelling) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("execfiles-allreduce_pipeline.json");
  plan.schemaNotes.clear();
  const auto report = mpp::verifyPlan(plan);
  EXPECT_TRUE(report.proven) << dump(report);
  EXPECT_GT(report.transfers, 0U);
}

TEST(MscclppPlan, RemovedWaitIsCaught) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("executor-reduce.json");
  auto& ops = plan.gpus[1].threadBlocks[0].ops;
  ASSERT_EQ(ops[4].type, mpp::OpType::Wait);
  ops[4] = mpp::Op{};  // a nop where the wait was
  const auto report = mpp::verifyPlan(plan);
  EXPECT_FALSE(report.proven);
  // Rank 1's one wait now pairs with rank 0's first signal, the second has nobody waiting for it, and rank 1
  // touches rank 0's buffers unordered.
  EXPECT_TRUE(has(report, Property::Matching, 0, 0, 11, "signal #2 to rank 1")) << dump(report);
  EXPECT_TRUE(has(report, Property::Race, 0, 0, 0, "rank 1 tb 0 op 10 (put) writes it")) << dump(report);
  EXPECT_TRUE(has(report, Property::Race, 1, 0, 10, "op 10 (put)")) << dump(report);
  EXPECT_TRUE(has(report, Property::Race, 1, 0, 6, "before rank 0 is known to have started")) << dump(report);
}

TEST(MscclppPlan, PutOneChunkOffIsCaught) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("executor-reduce.json");
  auto& put = plan.gpus[1].threadBlocks[0].ops[10];
  ASSERT_EQ(put.type, mpp::OpType::Put);
  put.dst[0].index -= 1;  // writes rank 0's input chunks 1..2 instead of 2..3
  const auto report = mpp::verifyPlan(plan);
  EXPECT_FALSE(report.proven);
  EXPECT_TRUE(has(report, Property::Race, 0, 0, 9, "reads rank 0 input chunk 1 while rank 1 tb 0 op 10 (put) writes"))
      << dump(report);
  EXPECT_TRUE(has(report, Property::Postcondition, 0, -1, -1, "output chunk 3")) << dump(report);
  EXPECT_FALSE(mpp::runPlan(plan).passed);

  put.dst[0].index += 2;  // chunks 3..4 of a 4-chunk buffer
  const auto beyond = mpp::verifyPlan(plan);
  EXPECT_TRUE(has(beyond, Property::Reference, 1, 0, 10, "chunks [3, 5) of rank 0's input buffer")) << dump(beyond);
}

TEST(MscclppPlan, PacketWithoutWriterDeadlocks) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("execfiles-allreduce_packet.json");
  auto& ppkt = plan.gpus[0].threadBlocks[0].ops[0];
  ASSERT_EQ(ppkt.type, mpp::OpType::PutPackets);
  ppkt.dst[0].index += 2;  // rank 1 waits for packets in scratch 0..1 that now land in 2..3
  const auto report = mpp::verifyPlan(plan);
  EXPECT_FALSE(report.proven);
  EXPECT_TRUE(has(report, Property::Deadlock, 1, 0, 1, "waits for packets in rank 1 scratch chunk 0")) << dump(report);
  EXPECT_TRUE(has(report, Property::Race, -1, -1, -1, "writes packets to rank 1 scratch chunk 2")) << dump(report);
}

// A 2-rank All-Gather over port channels, written here: signal/wait to start, put, signal/wait to finish.
std::string portAllGather(const std::string& finish) {
  std::string gpus;
  for (int r = 0; r < 2; ++r) {
    gpus += fmt::format(R"({}{{"id": {}, "input_chunks": 1, "output_chunks": 2, "scratch_chunks": 0,
      "threadblocks": [{{"id": 0, "ops": [
        {{"name": "signal", "channel_type": "port", "channel_ids": [0]}},
        {{"name": "wait", "channel_type": "port", "channel_ids": [0]}},
        {{"name": "put", "channel_type": "port", "channel_ids": [0],
          "src_buff": [{{"type": "i", "index": 0, "size": 1}}], "dst_buff": [{{"buffer_id": 0, "index": {}, "size": 1}}]}},
        {}
        {{"name": "copy", "src_buff": [{{"type": "i", "index": 0, "size": 1}}], "dst_buff": [{{"type": "o", "index": {}, "size": 1}}]}}],
        "channels": [{{"channel_type": "port", "channel_ids": [0]}}],
        "remote_buffer_refs": [{{"access_channel_type": "port", "remote_buffer_ids": [0]}}]}}],
      "channels": [{{"channel_type": "port", "connected_to": [{}]}}],
      "remote_buffers": [{{"rank": {}, "type": "o", "access_channel_types": ["port"]}}],
      "semaphores": []}})",
                        r ? "," : "", r, r, finish, r, 1 - r, 1 - r);
  }
  return R"({"name": "ag", "collective": "allgather", "protocol": "Simple", "inplace": false, "gpus": [)" + gpus + "]}";
}

VerifyReport verifyText(const std::string& text) {
  auto plan = mpp::parseMscclppPlan(text, "plan.json");
  EXPECT_TRUE(plan.ok()) << (plan.ok() ? "" : plan.error().str());
  return plan.ok() ? mpp::verifyPlan(*plan) : VerifyReport{};
}

TEST(MscclppPlan, PortPutCompletesAtTheNextSignal) {
  const auto proven = verifyText(portAllGather(R"({"name": "signal", "channel_type": "port", "channel_ids": [0]},
        {"name": "wait", "channel_type": "port", "channel_ids": [0]},)"));
  EXPECT_TRUE(proven.proven) << dump(proven);

  // Without the final signal and wait the put is never known to land before the peer finishes.
  const auto unfinished = verifyText(portAllGather(""));
  EXPECT_FALSE(unfinished.proven);
  EXPECT_TRUE(has(unfinished, Property::Race, 0, 0, 2, "port put that no signal or flush completes"))
      << dump(unfinished);

  // A flush completes the put locally only; the peer still learns nothing.
  const auto flushed = verifyText(portAllGather(R"({"name": "flush", "channel_type": "port", "channel_ids": [0],
        "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}]},)"));
  EXPECT_FALSE(flushed.proven);
  EXPECT_TRUE(has(flushed, Property::Race, 0, 0, 2, "before rank 1 finishes")) << dump(flushed);

  // A wait whose signal is missing on the other side.
  const auto hang = verifyText(portAllGather(R"({"name": "wait", "channel_type": "port", "channel_ids": [0]},)"));
  EXPECT_TRUE(has(hang, Property::Deadlock, 0, 0, 3, "wait #2")) << dump(hang);
}

TEST(MscclppPlan, OperationsOfABlockNeedANopToBeOrdered) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("executor-reduce.json");
  auto& ops = plan.gpus[1].threadBlocks[0].ops;
  ASSERT_EQ(ops[1].type, mpp::OpType::Nop);
  ops.erase(ops.begin() + 1);  // copy and signal without a __syncthreads between them
  const auto report = mpp::verifyPlan(plan);
  EXPECT_FALSE(report.proven);
  EXPECT_TRUE(has(report, Property::Race, -1, -1, -1, "rank 1 tb 0 op 0 (copy)")) << dump(report);
}

TEST(MscclppPlan, ReaderNamesTheFieldAndLine) {
  auto bad = mpp::parseMscclppPlan(R"({"name": "x", "collective": "allreduce", "protocol": "Simple",
"inplace": true, "gpus": [{"id": 0, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
"channels": [], "threadblocks": [{"id": 0, "ops": [{"name": "teleport"}]}]}]})",
                                   "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().file, "p.json");
  EXPECT_EQ(bad.error().line, 3);
  EXPECT_NE(bad.error().message.find("gpus[0].threadblocks[0].ops[0].name"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("teleport"), std::string::npos);

  auto wrongId = mpp::parseMscclppPlan(
      R"({"name": "x", "collective": "allreduce", "protocol": "LL", "inplace": true, "gpus": [{"id": 1}]})", "p.json");
  ASSERT_FALSE(wrongId.ok());
  EXPECT_NE(wrongId.error().message.find("expected id 0"), std::string::npos) << wrongId.error().message;

  EXPECT_FALSE(mpp::parseMscclppPlan("{\"name\": ", "p.json").ok());
  EXPECT_FALSE(mpp::looksLikeMscclppPlan(R"({"format": "optiflow-schedule", "ranks": []})"));
  EXPECT_FALSE(mpp::looksLikeMscclppPlan("<algo/>"));
  EXPECT_FALSE(mpp::looksLikeMscclppPlan(""));
}

TEST(MscclppPlan, LimitsNameTheLimitRankAndBlock) {
  SKIP_WITHOUT_PLANS();
  auto plan = load("executor-reduce.json");
  auto& ops = plan.gpus[1].threadBlocks[0].ops;
  while (ops.size() < 65) ops.push_back(mpp::Op{});
  ops.front().channelIds = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  const auto limits = mpp::checkPlanLimits(plan);
  ASSERT_EQ(limits.size(), 2U);
  EXPECT_NE(limits[0].find("rank 1 tb 0: 65 operations"), std::string::npos) << limits[0];
  EXPECT_NE(limits[0].find("MAX_OPERATION"), std::string::npos);
  EXPECT_NE(limits[1].find("9 channels"), std::string::npos) << limits[1];
  EXPECT_FALSE(mpp::verifyPlan(plan).proven);
}

}  // namespace
