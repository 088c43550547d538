// optiflow-bench and `optiflow synthesize --evaluator hardware` as a user runs them, without a GPU: argument,
// environment and rendezvous errors (exit status 2, a message naming what was wrong), a CPU-backend run in
// nccl-tests' layout and as JSON, and the synthesis loop measuring each round through a local launcher, including
// launchers that fail, hang or write garbage (each a clear per-round note, the run going on with simulated times).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ports.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using optiflow::testsupport::slurp;
using Result = optiflow::testsupport::CommandResult;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class BenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("optiflow-bench-e2e-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `env` is prepended (VAR=value ...); the launcher variables of the test's own environment are cleared.
  Result sh(const std::string& program, const std::string& args, const std::string& env = "") {
    return optiflow::testsupport::runCommand(
        fmt::format("env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "
                    "-u SLURM_PROCID -u SLURM_NTASKS -u PMI_RANK -u PMI_SIZE {} {} {}",
                    env, program, args),
        dir_);
  }
  Result bench(const std::string& args, const std::string& env = "") { return sh(OPTIFLOW_BENCH, args, env); }
  Result cli(const std::string& args) { return sh(OPTIFLOW_CLI, args); }

  // A verified ring All-Gather for one DGX A100 node (8 ranks), compiled by the CLI.
  std::string ringSchedule() {
    const fs::path s = dir_ / "ring.json";
    const Result r =
        cli(fmt::format("compile {}/examples/programs/allgather_ring.ofl --topo dgx-a100 --size 64KiB -o {}",
                        OPTIFLOW_SOURCE_DIR, s.string()));
    EXPECT_EQ(r.rc, 0) << r.err;
    return s.string();
  }

  fs::path dir_;
};

TEST_F(BenchCli, ArgumentErrorsExitTwoWithWhatWasExpected) {
  const std::string s = ringSchedule();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "nothing to time"},
      {s + " --backend cpu --sizes lots", "--sizes"},
      {s + " --backend cpu --iters 0", "--iters"},
      {s + " --backend cpu --nccl", "--nccl needs --backend cuda"},
      {s + " --backend quantum", "--backend"},
      {s + " --rendezvous nohost", "expected host:port"},
      {s + " --rendezvous h:99999", "expected host:port"},
      {(dir_ / "missing.json").string() + " --backend cpu", "missing.json"},
  };
  for (const auto& [args, fragment] : cases) {
    const Result r = bench(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, fragment)) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
  const Result help = bench("--help");
  EXPECT_EQ(help.rc, 0);
  EXPECT_TRUE(contains(help.out, "--rendezvous-dir"));
}

TEST_F(BenchCli, LauncherEnvironmentErrors) {
  const std::string s = ringSchedule();
  const Result badRank = bench(s + " --backend cpu", "RANK=one WORLD_SIZE=2");
  EXPECT_EQ(badRank.rc, 2);
  EXPECT_TRUE(contains(badRank.err, "RANK='one'")) << badRank.err;
  const Result twoCpu = bench(s + " --backend cpu", "RANK=0 WORLD_SIZE=2");
  EXPECT_EQ(twoCpu.rc, 2);
  EXPECT_TRUE(contains(twoCpu.err, "start one")) << twoCpu.err;
}

#if OPTIFLOW_BENCH_CUDA
// Rank 1's side of the rendezvous needs no GPU: it fails before CUDA is touched.
TEST_F(BenchCli, RendezvousErrorsOfAnOtherRank) {
  const std::string s = ringSchedule();
  const std::uint16_t port = optiflow::testsupport::unusedPort();
  const Result noRankZero =
      bench(fmt::format("{} --rendezvous 127.0.0.1:{} --rendezvous-timeout 0.5", s, port), "RANK=1 WORLD_SIZE=2");
  EXPECT_EQ(noRankZero.rc, 2);
  EXPECT_TRUE(contains(noRankZero.err, fmt::format("no rank 0 answered at 127.0.0.1:{}", port))) << noRankZero.err;
  const Result none = bench(s, "RANK=1 WORLD_SIZE=2");
  EXPECT_EQ(none.rc, 2);
  EXPECT_TRUE(contains(none.err, "need --rendezvous host:port or --rendezvous-dir")) << none.err;
  const Result noDir = bench(s + " --rendezvous-dir " + (dir_ / "nope").string(), "RANK=1 WORLD_SIZE=2");
  EXPECT_EQ(noDir.rc, 2);
  EXPECT_TRUE(contains(noDir.err, "not a directory")) << noDir.err;
  fs::create_directories(dir_ / "rdv");
  const Result late = bench(s + " --rendezvous-timeout 0.3 --rendezvous-dir " + (dir_ / "rdv").string(),
                            "SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_JOB_ID=77");
  EXPECT_EQ(late.rc, 2);
  EXPECT_TRUE(contains(late.err, "optiflow-bench-77.id")) << late.err;
}
#else
TEST_F(BenchCli, WithoutCudaTheCudaBackendIsRefused) {
  const Result r = bench(ringSchedule());
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(contains(r.err, "built without CUDA and NCCL")) << r.err;
}
#endif

TEST_F(BenchCli, CpuBackendPrintsNcclTestsLayoutAndJson) {
  const std::string s = ringSchedule();
  const Result text = bench(s + " --backend cpu --sizes 4KiB:64KiB:4 --iters 2 --warmup 1 --check");
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "# Collective test starting: all_gather_perf_optiflow-ring.json")) << text.out;
  EXPECT_TRUE(contains(text.out, "#  Rank  7 Group  0")) << text.out;
  EXPECT_TRUE(contains(text.out, "# Out of bounds values : 0 OK")) << text.out;
  EXPECT_TRUE(contains(text.out, "       65536          2048     float    none      -1")) << text.out;
  const fs::path out = dir_ / "out.json";
  const Result j = bench(s + " --backend cpu --sizes 4KiB --iters 1 --warmup 0 --check --json -o " + out.string());
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_TRUE(j.out.empty());
  const json doc = json::parse(slurp(out));
  EXPECT_EQ(doc["format"], "optiflow-bench-results");
  ASSERT_EQ(doc["results"].size(), 1u);
  EXPECT_EQ(doc["results"][0]["ok"], true);
  EXPECT_EQ(doc["results"][0]["rows"][0]["out_of_place"]["wrong"], 0);
  EXPECT_GT(doc["results"][0]["rows"][0]["out_of_place"]["time_us"].get<double>(), 0);
}

// ---------------------------------------------------------------------------------------------------------------
// optiflow synthesize --evaluator hardware, with the CPU backend behind a local launcher.

constexpr const char* kRun = "synthesize --topo dgx-a100 --coll allgather --sizes 4KiB,64KiB --rounds 2 --candidates 3";

std::string benchLauncher() {
  return fmt::format("{} {{batch}} --backend cpu --iters 2 --warmup 1 --check --json -o {{out}}", OPTIFLOW_BENCH);
}

std::vector<json> history(const fs::path& run) {
  std::vector<json> out;
  std::ifstream in(run / "history.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

TEST_F(BenchCli, HardwareEvaluatorMeasuresEveryRound) {
  const fs::path run = dir_ / "run";
  const Result r = cli(
      fmt::format("{} --evaluator hardware --launcher \"{}\" --out {} --json -q", kRun, benchLauncher(), run.string()));
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["measurement_notes"].size(), 2u) << r.out;
  EXPECT_TRUE(contains(out["measurement_notes"][0].get<std::string>(), "round 0: measured")) << r.out;
  for (const json& row : out["rows"]) {
    EXPECT_EQ(row["measured"], true) << row.dump();
    EXPECT_GT(row["simulated_us"].get<double>(), 0);
  }
  int measured = 0;
  for (const json& rec : history(run)) {
    for (const json& sz : rec["sizes"]) {
      if (!sz.contains("measured")) continue;
      ++measured;
      EXPECT_GT(sz["simulated_us"].get<double>(), 0);
      EXPECT_GT(sz["time_us"].get<double>(), 0);
    }
  }
  EXPECT_GT(measured, 0);
  const json plan = json::parse(slurp(run / "plan.json"));
  EXPECT_EQ(plan["evaluator"], "hardware");
  EXPECT_EQ(plan["collectives"][0]["entries"][0]["best"]["measured"], true);
  // What the launcher was given and wrote stays for the user to look at.
  EXPECT_TRUE(fs::exists(run / "hardware" / "round-0" / "batch" / "batch.json"));
  EXPECT_TRUE(fs::exists(run / "hardware" / "round-0" / "results.json"));
}

void expectRoundsUnmeasured(const Result& r, const fs::path& run, const std::string& why) {
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["measurement_notes"].size(), 2u) << r.out;
  for (const json& note : out["measurement_notes"]) {
    EXPECT_TRUE(contains(note.get<std::string>(), "no measurement")) << note;
    EXPECT_TRUE(contains(note.get<std::string>(), why)) << note;
  }
  for (const json& row : out["rows"]) {
    EXPECT_EQ(row["measured"], false);
    EXPECT_GT(row["best_time_us"].get<double>(), 0);  // the simulator's times stand
  }
  int marked = 0;
  for (const json& rec : history(run)) {
    for (const json& sz : rec["sizes"]) {
      EXPECT_FALSE(sz.contains("measured"));
      if (sz.contains("measure_error")) {
        ++marked;
        EXPECT_TRUE(contains(sz["measure_error"].get<std::string>(), why)) << sz.dump();
      }
    }
  }
  EXPECT_GT(marked, 0);
}

TEST_F(BenchCli, FailingLauncherIsAPerRoundErrorAndTheRunGoesOn) {
  const fs::path run = dir_ / "run";
  const Result r =
      cli(fmt::format("{} --evaluator hardware --launcher \"echo no GPUs here >&2; exit 3 # {{batch}} {{out}}\" "
                      "--out {} --json -q",
                      kRun, run.string()));
  expectRoundsUnmeasured(r, run, "exited with status 3");
  EXPECT_TRUE(contains(slurp(run / "hardware" / "round-1" / "launcher.log"), "no GPUs here"));
}

TEST_F(BenchCli, HangingLauncherIsKilledAtItsTimeout) {
  const fs::path run = dir_ / "run";
  const Result r =
      cli(fmt::format("{} --evaluator hardware --launcher \"sleep 600 # {{batch}} {{out}}\" "
                      "--launcher-timeout 1 --out {} --json -q",
                      kRun, run.string()));
  expectRoundsUnmeasured(r, run, "did not finish within 1 s");
  EXPECT_LT(r.seconds, 300) << "a hang bound only: two rounds of a 1 s timeout";
}

TEST_F(BenchCli, GarbageWritingLauncherIsAPerRoundError) {
  const fs::path run = dir_ / "run";
  const Result r =
      cli(fmt::format("{} --evaluator hardware --launcher \"echo garbage > {{out}} # {{batch}}\" "
                      "--out {} --json -q",
                      kRun, run.string()));
  expectRoundsUnmeasured(r, run, "unreadable results");
}

TEST_F(BenchCli, LauncherWithoutPlaceholdersIsRefusedUpFront) {
  const fs::path run = dir_ / "run";
  const Result r =
      cli(fmt::format("{} --evaluator hardware --launcher \"optiflow-bench\" --out {}", kRun, run.string()));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "{batch}")) << r.err;
  EXPECT_FALSE(fs::exists(run / "history.jsonl"));
  const Result noEval = cli(fmt::format("{} --launcher \"x {{batch}} {{out}}\" --out {}", kRun, run.string()));
  EXPECT_EQ(noEval.rc, 2);
  EXPECT_TRUE(contains(noEval.err, "--launcher needs --evaluator hardware")) << noEval.err;
}

}  // namespace
