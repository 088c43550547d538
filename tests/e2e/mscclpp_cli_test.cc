// The MSCCL++ commands as a user runs them: `optiflow verify` and `check` on MSCCL++'s own plans and on broken
// ones (exit 0 proven, 1 not proven, 2 unreadable), `convert --to mscclpp`, and `synthesize` + `export mscclpp`.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using optiflow::testsupport::slurp;
using CliResult = optiflow::testsupport::CommandResult;

using nlohmann::json;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

fs::path plansDir() { return fs::path(OPTIFLOW_SOURCE_DIR "/../shared/reference/mscclpp-plans"); }

class MscclppCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("optiflow-mscclpp-e2e-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult run(const std::string& args) {
    return optiflow::testsupport::runCommand(fmt::format("{} {}", OPTIFLOW_CLI, args), dir_);
  }

  fs::path dir_;
};

TEST_F(MscclppCli, VerifiesAndChecksMscclppsOwnPlans) {
  if (!fs::is_directory(plansDir())) GTEST_SKIP() << "no MSCCL++ plans at " << plansDir();
  const std::set<std::string> notProven = {"execfiles-allreduce_pipeline.json", "executor-reduce_nvls.json",
                                           "executor-reduce_nvls_pipeline.json", "executor-reduce_tbg.json"};
  int files = 0;
  for (const auto& e : fs::directory_iterator(plansDir())) {
    if (e.path().extension() != ".json") continue;
    ++files;
    const std::string name = e.path().filename().string();
    SCOPED_TRACE(name);
    const auto v = run(fmt::format("verify --json {}", e.path().string()));
    const bool proven = notProven.count(name) == 0;
    EXPECT_EQ(v.rc, proven ? 0 : 1) << v.out << v.err;
    const auto j = json::parse(v.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << v.out;
    EXPECT_EQ(j["format"], "mscclpp");
    EXPECT_EQ(j["proven"], proven);
    if (!proven) {
      ASSERT_FALSE(j["errors"].empty());
      EXPECT_TRUE(j["errors"][0].contains("property"));
    }
    const auto c = run(fmt::format("check {}", e.path().string()));
    EXPECT_EQ(c.rc, 0) << c.out << c.err;
    EXPECT_TRUE(contains(c.out, "PASSED")) << c.out;
  }
  EXPECT_EQ(files, 11);
}

TEST_F(MscclppCli, BrokenPlanIsRejectedWithRankBlockOperationAndProperty) {
  if (!fs::is_directory(plansDir())) GTEST_SKIP() << "no MSCCL++ plans at " << plansDir();
  auto plan = json::parse(slurp(plansDir() / "executor-reduce.json"));
  auto& ops = plan["gpus"][1]["threadblocks"][0]["ops"];
  ASSERT_EQ(ops[4]["name"], "wait");
  ops.erase(4);  // rank 1 no longer waits for rank 0 before touching its buffers
  const fs::path broken = dir_ / "no-wait.json";
  std::ofstream(broken) << plan.dump(1);
  const auto v = run("verify " + broken.string());
  EXPECT_EQ(v.rc, 1) << v.out << v.err;
  EXPECT_TRUE(contains(v.out, "NOT PROVEN")) << v.out;
  EXPECT_TRUE(contains(v.out, "rank 1 tb 0 step 9 (in-place): [race] op 9 (put)")) << v.out;
  EXPECT_TRUE(contains(v.out, "[matching]")) << v.out;

  const fs::path bad = dir_ / "bad.json";
  std::ofstream(bad) << R"({"name": "x", "collective": "allreduce", "protocol": "Simple", "inplace": true,
"gpus": [{"id": 0, "input_chunks": "four"}]})";
  const auto b = run("verify " + bad.string());
  EXPECT_EQ(b.rc, 2);
  EXPECT_TRUE(contains(b.err, bad.string() + ":2:")) << b.err;
  EXPECT_TRUE(contains(b.err, "gpus[0].input_chunks")) << b.err;
}

TEST_F(MscclppCli, ConvertsASchedule) {
  const fs::path ring = dir_ / "ring.json";
  ASSERT_EQ(run(fmt::format("fixture --coll allreduce --ranks 4 --channels 2 --format json -o {}", ring.string())).rc,
            0);
  const fs::path plan = dir_ / "ring.mscclpp.json";
  const auto c = run(fmt::format("convert {} --to mscclpp --ranks-per-node 2 -o {}", ring.string(), plan.string()));
  ASSERT_EQ(c.rc, 0) << c.err;
  const auto j = json::parse(slurp(plan));
  EXPECT_EQ(j["collective"], "allreduce");
  EXPECT_EQ(j["gpus"].size(), 4U);
  EXPECT_TRUE(contains(slurp(plan), "\"port\""));
  EXPECT_EQ(run("verify " + plan.string()).rc, 0);
  EXPECT_EQ(run("check " + plan.string()).rc, 0);
  // Converting a plan again is refused; a missing file is bad input.
  EXPECT_EQ(run(fmt::format("convert {} --to mscclpp", plan.string())).rc, 2);
  EXPECT_EQ(run(fmt::format("convert {} --to mscclpp", (dir_ / "none.json").string())).rc, 2);
}

TEST_F(MscclppCli, SynthesizeWritesPlansAndExportMakesADirectory) {
  const fs::path runDir = dir_ / "run";
  const auto s = run(
      fmt::format("synthesize --topo dgx-a100 --coll allgather --sizes 4KiB,1MiB --quiet --out {}", runDir.string()));
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_TRUE(fs::exists(runDir / "schedules" / "allgather-4KiB.mscclpp.json"));
  EXPECT_EQ(run("verify " + (runDir / "schedules" / "allgather-1MiB.mscclpp.json").string()).rc, 0);
  // The run's report links each plan and shows its predicted time where it differs from the schedule's.
  ASSERT_EQ(run("report " + runDir.string()).rc, 0);
  const std::string html = slurp(runDir / "report.html");
  EXPECT_TRUE(contains(html, "<a href=\"schedules/allgather-4KiB.mscclpp.json\">mscclpp</a>")) << html.size();
  EXPECT_TRUE(contains(html, "(plan ")) << "no plan time in the report";

  const fs::path out = dir_ / "plans";
  const auto e = run(fmt::format("export mscclpp {} -o {}", runDir.string(), out.string()));
  ASSERT_EQ(e.rc, 0) << e.out << e.err;
  const auto manifest = json::parse(slurp(out / "manifest.json"));
  EXPECT_EQ(manifest["mscclpp_version"], "0.10.0");
  EXPECT_EQ(manifest["world_size"], 8);
  EXPECT_EQ(manifest["ranks_per_node"], 8);
  ASSERT_EQ(manifest["plans"].size(), 4U);  // two sizes x two buffer modes
  std::uint64_t lastMaxInPlace = 0;
  bool first = true;
  for (const auto& p : manifest["plans"]) {
    EXPECT_EQ(p["collective"], "allgather");
    const fs::path file = out / p["file"].get<std::string>();
    EXPECT_EQ(run("verify " + file.string()).rc, 0) << file;
    if (p["in_place"].get<bool>()) {
      if (!first) {
        EXPECT_GT(p["min_message_size"].get<std::uint64_t>(), lastMaxInPlace);
      }
      lastMaxInPlace = p["max_message_size"].get<std::uint64_t>();
      first = false;
    }
  }
  EXPECT_EQ(run(fmt::format("export mscclpp {} -o {}", (dir_ / "missing").string(), out.string())).rc, 2);
}

// Synthesized winners of each collective at one and two nodes: every plan written is proven and runs; a winner
// that cannot be a plan is skipped with the executor limit and rank named.
TEST_F(MscclppCli, SynthesizedWinnersOfEachCollectiveAtOneAndTwoNodes) {
  int plans = 0;
  for (const std::string topo : {"dgx-a100", "dgx-a100x2"}) {
    for (const std::string coll : {"allgather", "reducescatter", "allreduce"}) {
      SCOPED_TRACE(topo + " " + coll);
      const fs::path runDir = dir_ / (topo + "-" + coll);
      const auto s = run(fmt::format("synthesize --topo {} --coll {} --sizes 4KiB --rounds 1 --quiet --out {}", topo,
                                     coll, runDir.string()));
      ASSERT_EQ(s.rc, 0) << s.err;
      const fs::path out = dir_ / (topo + "-" + coll + "-plans");
      const auto e = run(fmt::format("export mscclpp {} -o {}", runDir.string(), out.string()));
      const auto manifest = json::parse(slurp(out / "manifest.json"));
      for (const auto& skipped : manifest["skipped"]) {
        const std::string reason = skipped["reason"];
        EXPECT_TRUE(contains(reason, "rank ") && contains(reason, "MAX_")) << reason;
      }
      EXPECT_EQ(e.rc, manifest["plans"].empty() ? 1 : 0) << e.out << e.err;
      for (const auto& p : manifest["plans"]) {
        const fs::path file = out / p["file"].get<std::string>();
        EXPECT_EQ(run("verify " + file.string()).rc, 0) << file;
        EXPECT_EQ(run("check --elements 2 " + file.string()).rc, 0) << file;
        EXPECT_TRUE(p["plan_predicted_us"].is_number());
        ++plans;
      }
    }
  }
  EXPECT_GE(plans, 8);
}

}  // namespace
