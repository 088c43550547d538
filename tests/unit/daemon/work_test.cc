// optiflowd's work (daemon/{activity,budget,work}.h): workloads and busy detection from the tuner's activity
// counters, the WorkGate's idle-gap and CPU-budget pauses, and WorkLoop passes into real schedule caches (synthesis,
// merge, publish, restart, leader/follower sharing, busy jobs pausing the work). A 4-GPU node, 1-2 sizes and one
// short round keep every pass well under a second of simulation.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/daemon/activity.h"
#include "optiflow/daemon/budget.h"
#include "optiflow/daemon/config.h"
#include "optiflow/daemon/metrics.h"
#include "optiflow/daemon/work.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::daemon {
namespace {

namespace fs = std::filesystem;
namespace sc = schedcache;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Activity and Workload count by NCCL's ncclFunc_t index.
constexpr std::uint32_t kAllGather = *core::ncclFuncIndex(core::Collective::AllGather);
constexpr std::uint32_t kAllReduce = *core::ncclFuncIndex(core::Collective::AllReduce);

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

sc::Activity emptyActivity() {
  sc::Activity a;
  std::memset(&a, 0, sizeof a);
  return a;
}

// ---- workloadsFrom / BusyDetector -------------------------------------------------------------------------------

TEST(Workloads, CollectivesAndSizesFromActivity) {
  sc::Activity a = emptyActivity();
  a.calls[kAllReduce][20] = 5;  // 1 MiB
  a.calls[kAllReduce][10] = 1;  // 1 KiB
  a.calls[kAllGather][3] = 7;   // 8 B: raised to kMinWorkloadBytes
  a.calls[kAllGather][5] = 2;   // 32 B: the same representative, once
  const std::vector<Workload> all = workloadsFrom(a);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].collective, kAllGather);
  EXPECT_EQ(all[0].sizes, (std::vector<std::uint64_t>{kMinWorkloadBytes}));
  EXPECT_EQ(all[0].calls, 9u);
  EXPECT_EQ(all[1].collective, kAllReduce);
  EXPECT_EQ(all[1].sizes, (std::vector<std::uint64_t>{1024, 1u << 20}));
  EXPECT_EQ(all[1].calls, 6u);

  const std::vector<Workload> frequent = workloadsFrom(a, 3);
  ASSERT_EQ(frequent.size(), 2u);
  EXPECT_EQ(frequent[0].sizes, (std::vector<std::uint64_t>{kMinWorkloadBytes}));
  EXPECT_EQ(frequent[1].sizes, (std::vector<std::uint64_t>{1u << 20}));
  EXPECT_TRUE(workloadsFrom(emptyActivity()).empty());
}

TEST(BusyDetector, RateThresholdAndIdleWindow) {
  BusyDetector d(/*busyCallsPerS=*/50, /*idleWindowS=*/2);
  sc::Activity a = emptyActivity();
  const Clock::time_point t0{};
  auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  EXPECT_FALSE(d.update(a, at(0)));  // the base
  EXPECT_FALSE(d.rated());
  a.calls[kAllReduce][20] += 100;
  EXPECT_TRUE(d.update(a, at(1)));  // 100 calls/s > 50
  EXPECT_DOUBLE_EQ(d.lastRate(), 100);
  EXPECT_TRUE(d.update(a, at(2)));  // no calls, but the last busy sample was 1 s ago (< 2 s window)
  EXPECT_DOUBLE_EQ(d.lastRate(), 0);
  EXPECT_FALSE(d.update(a, at(3.1)));  // 2.1 s after it
  a.calls[kAllGather][4] += 1000;
  EXPECT_FALSE(d.update(a, at(3.12)));  // 20 ms after the last sample: ignored, not a rate of 50000/s
  EXPECT_TRUE(d.update(a, at(4.1)));    // over the whole second: 1000 calls/s
  a = emptyActivity();                  // the segment was recreated: counters went back to 0
  EXPECT_TRUE(d.update(a, at(5)));      // rate 0, still within the window
  EXPECT_DOUBLE_EQ(d.lastRate(), 0);
  a.calls[kAllGather][4] = 40;  // 40 calls/s: below the threshold
  EXPECT_FALSE(d.update(a, at(7.5)));
}

// ---- WorkGate -----------------------------------------------------------------------------------------------------

// An activity source whose counters climb at 10000 calls/s until `busyS`, then stop.
WorkGate::ActivitySource burst(Clock::time_point start, double busyS) {
  return [start, busyS]() -> std::optional<sc::Activity> {
    sc::Activity a = emptyActivity();
    a.calls[kAllReduce][20] = static_cast<std::uint64_t>(std::min(since(start), busyS) * 10000);
    return a;
  };
}

TEST(WorkGate, BusyJobsPauseTheCheckpoint) {
  Metrics metrics;
  const Clock::time_point t0 = Clock::now();
  WorkGate gate(/*cpuCores=*/64, /*busyCallsPerS=*/100, /*idleWindowS=*/0.1, burst(t0, 0.5), &metrics);
  gate.start();
  std::atomic<bool> stop{false};
  const double entered = since(t0);  // a loaded machine may get here late; the jobs' clock runs from t0
  EXPECT_TRUE(gate.checkpoint(stop));
  const double blocked = since(t0);
  EXPECT_GE(blocked, 0.5);                          // busy until 0.5 s, then an idle window of 0.1 s
  EXPECT_LT(blocked, 10.0);                         // about 0.6 s; only a gate that never lets go reaches this
  EXPECT_GE(gate.pausedSeconds(), 0.45 - entered);  // the wait in the checkpoint is counted as a pause
  EXPECT_NEAR(metrics.get("optiflowd_work_paused_seconds_total"), gate.pausedSeconds(), 1e-9);
  EXPECT_EQ(metrics.get("optiflowd_jobs_busy"), 0);

  // Idle now: the next checkpoint passes at once, without a pause (each pause, even one slice, is counted).
  const double paused = gate.pausedSeconds();
  EXPECT_TRUE(gate.checkpoint(stop));
  EXPECT_EQ(gate.pausedSeconds(), paused);
}

TEST(WorkGate, NoCacheMeansNoJobsToWaitFor) {
  WorkGate gate(
      64, 100, 1, [] { return std::optional<sc::Activity>(); }, nullptr);
  std::atomic<bool> stop{false};
  EXPECT_TRUE(gate.checkpoint(stop));
  EXPECT_EQ(gate.pausedSeconds(), 0);  // it did not wait, not even the one poll for a rate
  EXPECT_FALSE(gate.busyNow());
}

TEST(WorkGate, StopEndsAPauseQuickly) {
  const Clock::time_point t0 = Clock::now();
  WorkGate gate(64, 100, 1, burst(t0, 1e9), nullptr);  // busy for ever
  std::atomic<bool> stop{true};
  EXPECT_FALSE(gate.checkpoint(stop));  // at once when already set
  stop = false;
  // The gate would pause for ever: returning at all shows the stop ended the pause. It looks every 10 ms; the
  // limit is one only a gate that misses the stop reaches.
  Clock::time_point stoppedAt;
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(300));
    stoppedAt = Clock::now();
    stop = true;
  });
  EXPECT_FALSE(gate.checkpoint(stop));
  const Clock::time_point returnedAt = Clock::now();
  stopper.join();
  EXPECT_GE(returnedAt, stoppedAt);
  EXPECT_LT(std::chrono::duration<double>(returnedAt - stoppedAt).count(), 5.0);
  EXPECT_GT(gate.pausedSeconds(), 0);
  EXPECT_TRUE(gate.busyNow());
}

TEST(WorkGate, CpuBudgetHoldsABusyLoopToItsShare) {
  Metrics metrics;
  WorkGate gate(/*cpuCores=*/0.2, 100, 1, [] { return std::optional<sc::Activity>(); }, &metrics);
  std::atomic<bool> stop{false};
  double cpu = 0;
  double wall = 0;
  double inGate = 0;  // wall time spent in checkpoint()
  std::thread worker([&] {
    gate.start();
    const double cpu0 = threadCpuSeconds();
    const Clock::time_point t0 = Clock::now();
    volatile std::uint64_t sink = 0;
    while (since(t0) < 1.5) {
      const double spinFrom = threadCpuSeconds();
      while (threadCpuSeconds() - spinFrom < 0.002) sink = sink + 1;  // 2 ms of work per step
      const Clock::time_point in = Clock::now();
      ASSERT_TRUE(gate.checkpoint(stop));
      inGate += since(in);
    }
    cpu = threadCpuSeconds() - cpu0;
    wall = since(t0);
  });
  worker.join();
  // 0.2 x 1.5 s, plus the burst credit (0.25 s x 0.2), plus one step past it. A loaded machine only lowers it.
  EXPECT_LE(cpu / wall, 0.3) << cpu << " CPU s in " << wall << " s";
  // How much of its share it gets depends on the machine as well: with CPU to spare (it ran at more than twice its
  // share whenever the gate let it), the gate must have let it use most of the share.
  const double runRate = cpu / std::max(wall - inGate, 1e-9);
  if (runRate > 0.4) {
    EXPECT_GE(cpu / wall, 0.1) << "the budget should let it use most of its share (" << runRate
                               << " CPU s/s outside the gate)";
  }
  // The time in the gate is its pauses (the rest of a checkpoint is a lock and a few clock reads).
  EXPECT_LE(gate.pausedSeconds(), inGate);
  EXPECT_GE(gate.pausedSeconds(), 0.8 * inGate - 0.05) << inGate << " s in the gate";
  if (runRate > 0.4) {
    EXPECT_GT(gate.pausedSeconds(), 0.3 * wall) << runRate << " CPU s/s outside the gate";
  }
  EXPECT_GE(metrics.get("optiflowd_cpu_seconds_total"), cpu * 0.9);
}

TEST(Budget, LowerThreadPriorityOnlyLowers) {
  std::thread t([] {
    EXPECT_TRUE(lowerThreadPriority(5));
    EXPECT_TRUE(lowerThreadPriority(3));  // already nicer: unchanged, not an error
  });
  t.join();
  EXPECT_GE(threadCpuSeconds(), 0.0);
  EXPECT_GE(processCpuSeconds(), threadCpuSeconds());
}

// ---- WorkLoop -----------------------------------------------------------------------------------------------------

const core::Topology& fourGpus() {
  static const core::Topology topo = [] {
    auto t = core::parseTopologyToml(R"(name = "four"
nodes = 1
gpus_per_node = 4
[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 300.0
latency_us = 0.7
)",
                                     "four.toml");
    if (!t) throw std::runtime_error(t.error().str());
    return std::move(t).value();
  }();
  return topo;
}

// A namespace and a state directory of this test process, removed at the end.
class Fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("dB-test-{}-{}", getpid(), counter_++);
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    for (const std::string& ns : namespaces_) sc::Writer::remove(ns, nullptr);
    fs::remove_all(root_);
  }

  std::unique_ptr<sc::Writer> openCache(const std::string& suffix) {
    const std::string ns = fmt::format("dB-test-{}-{}-{}", getpid(), counter_, suffix);
    namespaces_.push_back(ns);
    sc::WriterOptions options;
    options.ns = ns;
    sc::Error error;
    std::unique_ptr<sc::Writer> w = sc::Writer::open(options, &error);
    EXPECT_NE(w, nullptr) << error.message;
    return w;
  }

  Config config(const std::string& ns) const {
    Config c;
    c.ns = ns;
    c.collectives = {"allgather"};
    c.sizes = {4096, 1u << 20};
    c.rounds = 1;
    c.candidatesPerRound = 2;
    c.intervalS = 3600;
    c.seed = 7;
    return c;
  }

  static std::uint64_t currentHash(const std::string& ns) {
    sc::Error error;
    std::unique_ptr<sc::Reader> r = sc::Reader::attach(ns, &error);
    if (!r) return 0;
    sc::PlanInfo info;
    return r->current(&info) == sc::Status::kOk ? info.contentHash : 0;
  }

  fs::path root_;
  std::vector<std::string> namespaces_;
  static inline int counter_ = 0;
};

using WorkLoopTest = Fixture;

TEST_F(WorkLoopTest, PublishesThenStaysQuietThenFollowsTheJobs) {
  std::unique_ptr<sc::Writer> writer = openCache("a");
  ASSERT_NE(writer, nullptr);
  const std::string ns = namespaces_.back();
  Metrics metrics;
  WorkGate gate(64, 1e9, 0, {}, &metrics);
  WorkLoop loop(config(ns), fourGpus(), writer.get(), &metrics, &gate, root_ / "state");
  std::atomic<bool> stop{false};

  auto first = loop.runOnce(stop);
  ASSERT_TRUE(first) << first.error().str();
  EXPECT_EQ(first->workloads, 1);
  EXPECT_EQ(first->rounds, 1);
  EXPECT_TRUE(first->published);
  EXPECT_FALSE(first->interrupted);
  ASSERT_NE(first->planHash, 0u);
  EXPECT_EQ(currentHash(ns), first->planHash);
  EXPECT_EQ(first->planDir, root_ / "state" / ns / "plans" / sc::formatHash(first->planHash));
  EXPECT_TRUE(fs::exists(first->planDir / "plan.json"));
  EXPECT_EQ(metrics.get("optiflowd_plans_published_total"), 1);
  EXPECT_GE(metrics.get("optiflowd_synthesis_rounds_total"), 1);
  EXPECT_GE(metrics.get("optiflowd_synthesis_candidates_total"), 1);
  EXPECT_GT(metrics.get("optiflowd_best_speedup", R"(collective="allgather",size="4096")"), 0);

  // Nothing changed: no synthesis, no publish.
  auto second = loop.runOnce(stop);
  ASSERT_TRUE(second) << second.error().str();
  EXPECT_EQ(second->workloads, 0);
  EXPECT_FALSE(second->published);
  EXPECT_EQ(second->planHash, first->planHash);
  EXPECT_EQ(metrics.get("optiflowd_plans_published_total"), 1);

  // A job calls All-Reduce at 1 MiB: that becomes the workload, and the plan keeps All-Gather next to it.
  {
    sc::Error error;
    std::unique_ptr<sc::Reader> r = sc::Reader::attach(ns, &error);
    ASSERT_NE(r, nullptr) << error.message;
    for (int i = 0; i < 10; ++i) r->recordCall(kAllReduce, 1u << 20);
  }
  auto third = loop.runOnce(stop);
  ASSERT_TRUE(third) << third.error().str();
  EXPECT_EQ(third->workloads, 1);
  EXPECT_TRUE(third->published);
  EXPECT_NE(third->planHash, first->planHash);
  EXPECT_EQ(currentHash(ns), third->planHash);
  sc::Error error;
  std::unique_ptr<sc::Reader> r = sc::Reader::attach(ns, &error);
  ASSERT_NE(r, nullptr);
  sc::Plan plan;
  sc::PlanInfo info;
  std::string detail;
  ASSERT_EQ(r->loadPlan(0, &plan, &info, &detail), sc::Status::kOk) << detail;
  bool allgather = false;
  bool allreduce = false;
  for (const sc::PlanItem& item : plan.items) {
    allgather |= item.coll == core::Collective::AllGather;
    allreduce |= item.coll == core::Collective::AllReduce;
    EXPECT_EQ(item.nRanks, 4u);
    if (!item.jsonPath.empty()) {
      EXPECT_TRUE(fs::exists(item.jsonPath)) << item.jsonPath;
      EXPECT_EQ(fs::path(item.jsonPath).parent_path().parent_path(), third->planDir);  // the merged directory's own
    }
  }
  EXPECT_TRUE(allgather);
  EXPECT_TRUE(allreduce);
  EXPECT_EQ(metrics.get("optiflowd_plans_published_total"), 2);

  // A restarted daemon finds its runs and does not redo them.
  Metrics metrics2;
  WorkLoop restarted(config(ns), fourGpus(), writer.get(), &metrics2, &gate, root_ / "state");
  auto again = restarted.runOnce(stop);
  ASSERT_TRUE(again) << again.error().str();
  EXPECT_EQ(again->workloads, 0);
  EXPECT_FALSE(again->published);
  EXPECT_EQ(again->planHash, third->planHash);

  // A config change (SIGHUP) that changes the synthesis redoes the workload.
  Config more = config(ns);
  more.rounds = 2;
  restarted.setConfig(more);
  auto redone = restarted.runOnce(stop);
  ASSERT_TRUE(redone) << redone.error().str();
  EXPECT_EQ(redone->workloads, 1);
}

TEST_F(WorkLoopTest, StopInterruptsThePass) {
  std::unique_ptr<sc::Writer> writer = openCache("s");
  ASSERT_NE(writer, nullptr);
  WorkGate gate(64, 1e9, 0, {}, nullptr);
  WorkLoop loop(config(namespaces_.back()), fourGpus(), writer.get(), nullptr, &gate, root_ / "state");
  std::atomic<bool> stop{true};
  auto pass = loop.runOnce(stop);
  ASSERT_TRUE(pass) << pass.error().str();
  EXPECT_TRUE(pass->interrupted);
  EXPECT_FALSE(pass->published);
  EXPECT_EQ(currentHash(namespaces_.back()), 0u);
}

TEST_F(WorkLoopTest, FollowerPublishesTheLeadersPlan) {
  std::unique_ptr<sc::Writer> leaderCache = openCache("leader");
  ASSERT_NE(leaderCache, nullptr);
  const std::string leaderNs = namespaces_.back();
  std::unique_ptr<sc::Writer> followerCache = openCache("follower");
  ASSERT_NE(followerCache, nullptr);
  const std::string followerNs = namespaces_.back();
  const fs::path share = root_ / "share";
  std::atomic<bool> stop{false};

  Config lc = config(leaderNs);
  lc.role = Role::kLeader;
  lc.shareDir = share;
  WorkLoop leader(lc, fourGpus(), leaderCache.get(), nullptr, nullptr, root_ / "leader-state");
  auto led = leader.runOnce(stop);
  ASSERT_TRUE(led) << led.error().str();
  ASSERT_TRUE(led->published);
  std::ifstream current(share / "current");
  std::string hashText;
  std::string dirName;
  current >> hashText >> dirName;
  EXPECT_EQ(hashText, sc::formatHash(led->planHash));
  EXPECT_TRUE(fs::exists(share / dirName / "plan.json"));

  Metrics metrics;
  Config fc = config(followerNs);
  fc.role = Role::kFollower;
  fc.shareDir = share;
  WorkLoop follower(fc, fourGpus(), followerCache.get(), &metrics, nullptr, root_ / "follower-state");
  auto followed = follower.runOnce(stop);
  ASSERT_TRUE(followed) << followed.error().str();
  EXPECT_TRUE(followed->published);
  EXPECT_EQ(followed->workloads, 0);
  EXPECT_EQ(followed->planHash, led->planHash);
  EXPECT_EQ(currentHash(followerNs), led->planHash);
  auto quiet = follower.runOnce(stop);
  ASSERT_TRUE(quiet) << quiet.error().str();
  EXPECT_FALSE(quiet->published);
  EXPECT_EQ(metrics.get("optiflowd_plans_published_total"), 1);

  // A current file that names something else than a plan directory of the share is refused.
  {
    std::ofstream bad(share / "current", std::ios::trunc);
    bad << "0123456789abcdef ../elsewhere\n";
  }
  auto refused = follower.runOnce(stop);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("expected"), std::string::npos) << refused.error().str();
  EXPECT_EQ(metrics.get("optiflowd_errors_total", R"(kind="share")"), 1);
  // ... and so is a directory whose plan is not the one named.
  {
    std::ofstream lie(share / "current", std::ios::trunc);
    lie << "0123456789abcdef " << dirName << "\n";
  }
  auto mismatch = follower.runOnce(stop);
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().message.find("0123456789abcdef"), std::string::npos) << mismatch.error().str();
  EXPECT_EQ(currentHash(followerNs), led->planHash);  // the good plan stays current
}

// The issue's "busy periods pause the work": jobs hammer the cache's activity counters while a pass runs; the pass
// waits for them. The job goes on until the pass has paused for 0.8 s (however long the machine takes to get the
// pass there), with a deadline only a pass that never pauses reaches; the pass must end after the job.
TEST_F(WorkLoopTest, BusyJobsPauseThePass) {
  std::unique_ptr<sc::Writer> writer = openCache("busy");
  ASSERT_NE(writer, nullptr);
  const std::string ns = namespaces_.back();
  Metrics metrics;
  WorkGate gate(
      /*cpuCores=*/64, /*busyCallsPerS=*/1000, /*idleWindowS=*/0.2,
      [ns]() -> std::optional<sc::Activity> {
        sc::Error error;
        std::unique_ptr<sc::Reader> r = sc::Reader::attach(ns, &error);
        if (!r) return std::nullopt;
        return r->activity();
      },
      &metrics);
  gate.start();
  std::atomic<bool> jobStarted{false};
  Clock::time_point jobEnd;
  std::thread job([&] {
    sc::Error error;
    std::unique_ptr<sc::Reader> r = sc::Reader::attach(ns, &error);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
    while (r != nullptr && gate.pausedSeconds() < 0.8 && Clock::now() < deadline) {
      for (int i = 0; i < 100; ++i) r->recordCall(kAllGather, 4096);  // 100 calls a step: far above 1000 calls/s
      jobStarted = true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    jobEnd = Clock::now();
    jobStarted = true;
    ASSERT_NE(r, nullptr) << error.message;
  });
  while (!jobStarted) std::this_thread::sleep_for(milliseconds(1));  // the pass starts while the job is busy
  WorkLoop loop(config(ns), fourGpus(), writer.get(), &metrics, &gate, root_ / "state");
  std::atomic<bool> stop{false};
  auto pass = loop.runOnce(stop);
  const Clock::time_point passEnd = Clock::now();
  job.join();
  ASSERT_TRUE(pass) << pass.error().str();
  EXPECT_TRUE(pass->published);
  EXPECT_GE(passEnd, jobEnd) << "the pass ended while the job was busy";
  EXPECT_GE(gate.pausedSeconds(), 0.8);
  EXPECT_NEAR(metrics.get("optiflowd_work_paused_seconds_total"), gate.pausedSeconds(), 1e-9);
}

}  // namespace
}  // namespace optiflow::daemon
