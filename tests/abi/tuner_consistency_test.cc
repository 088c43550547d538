// The consistency rule across processes (docs/consistency.md, ARCHITECTURE.md "Consistency across ranks"): every rank
// of a communicator must make the same decision for the same collective, or NCCL hangs. Real processes, a real
// segment: a forked writer publishes while forked "rank" processes, each dlopen'ing the tuner itself as NCCL would,
// init the same communicator at jittered times and report what NCCL would pick for a fixed sequence of calls.
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "abi_test_support.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/tuner/tuner.h"

namespace optiflow::abitest {
namespace {

using core::Algorithm;
using core::Collective;
using core::Protocol;
using Clock = std::chrono::steady_clock;

constexpr int kLocalRanks = 6;  // rank processes per communicator on this node
constexpr std::uint64_t kGiB = 1ull << 30;

struct Call {
  ncclFunc_t coll;
  std::size_t nBytes;
};
constexpr Call kCalls[] = {
    {ncclFuncAllReduce, 1024},     {ncclFuncAllReduce, 100000}, {ncclFuncAllReduce, 8u << 20},
    {ncclFuncAllGather, 65536},    {ncclFuncBroadcast, 4096},   {ncclFuncReduceScatter, 1u << 20},
    {ncclFuncAllReduce, kGiB + 1},
};
constexpr int kNumCalls = static_cast<int>(sizeof(kCalls) / sizeof(kCalls[0]));

// What NCCL ends up using for one call: the argmin of the table the tuner returned, and the channel count.
struct Outcome {
  std::int32_t algo = -1;
  std::int32_t proto = -1;
  std::int32_t nChannels = 0;
  bool operator==(const Outcome&) const = default;
};

constexpr int kMaxCalls = 64;  // the longest call sequence a rank reports

struct RankReport {
  std::int32_t initRc = -1;
  std::int32_t callsOk = 0;  // 1 when every getCollInfo returned ncclSuccess
  std::int32_t numCalls = 0;
  Outcome calls[kMaxCalls];
};

using Sequence = std::vector<Outcome>;

std::string toString(const Sequence& s) {
  std::string out;
  for (const Outcome& o : s) {
    out += "(" + std::to_string(o.algo) + "," + std::to_string(o.proto) + "," + std::to_string(o.nChannels) + ")";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Plans: A and B decide differently for every call of the sequence (on one node of 8 ranks and on 2 nodes of 16).

void addShape(schedcache::Plan* p, std::uint32_t nRanks, std::uint32_t nNodes, bool b, std::int32_t channelBias) {
  const std::int32_t c = channelBias;
  if (!b) {
    p->items.push_back(planItem(Collective::AllReduce, nRanks, nNodes, 0, 65535, Algorithm::Tree, Protocol::LL, 2 + c));
    p->items.push_back(
        planItem(Collective::AllReduce, nRanks, nNodes, 65536, kGiB, Algorithm::Ring, Protocol::LL128, 4 + c));
    p->items.push_back(
        planItem(Collective::AllGather, nRanks, nNodes, 0, kGiB, Algorithm::Ring, Protocol::Simple, 3 + c));
    p->items.push_back(planItem(Collective::Broadcast, nRanks, nNodes, 0, kGiB, Algorithm::Ring, Protocol::LL, 1 + c));
    p->items.push_back(
        planItem(Collective::ReduceScatter, nRanks, nNodes, 0, kGiB, Algorithm::Ring, Protocol::LL, 7 + c));
  } else {
    p->items.push_back(planItem(Collective::AllReduce, nRanks, nNodes, 0, 65535, Algorithm::Ring, Protocol::LL, 3 + c));
    p->items.push_back(
        planItem(Collective::AllReduce, nRanks, nNodes, 65536, kGiB, Algorithm::Nvls, Protocol::Simple, 8 + c));
    p->items.push_back(
        planItem(Collective::AllGather, nRanks, nNodes, 0, kGiB, Algorithm::Pat, Protocol::Simple, 5 + c));
    p->items.push_back(
        planItem(Collective::Broadcast, nRanks, nNodes, 0, kGiB, Algorithm::Ring, Protocol::LL128, 2 + c));
    p->items.push_back(
        planItem(Collective::ReduceScatter, nRanks, nNodes, 0, kGiB, Algorithm::Ring, Protocol::Simple, 6 + c));
  }
}

schedcache::Plan makePlan(bool b, std::int32_t channelBias = 0) {
  schedcache::Plan p;
  p.source = b ? "tests/abi plan B" : "tests/abi plan A";
  addShape(&p, 8, 1, b, channelBias);
  addShape(&p, 16, 2, b, channelBias);
  return p;
}

// The sequence a rank using `plan` (or no plan) must report, derived from the plan itself: the decision's entry
// when the plan has one (all of them are >= 0 in ncclLikeTable), NCCL's own pick (RING/SIMPLE) otherwise.
Sequence expectedSequence(const schedcache::Plan* plan, std::uint32_t nRanks, std::uint32_t nNodes) {
  Sequence s;
  const Choice native = ncclPick(ncclLikeTable<7>());
  for (const Call& call : kCalls) {
    Outcome o{native.algo, native.proto, 0};
    if (plan != nullptr) {
      for (const schedcache::PlanItem& it : plan->items) {
        // Every item of these plans decides both.
        if (core::ncclFuncIndex(it.coll) == static_cast<int>(call.coll) && it.nRanks == nRanks && it.nNodes == nNodes &&
            call.nBytes >= it.minBytes && call.nBytes <= it.maxBytes) {
          o = {core::ncclIndex(*it.algorithm), core::ncclIndex(*it.protocol), it.nChannels};
        }
      }
    }
    s.push_back(o);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Process plumbing

bool writeAll(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// Waits for a child until the deadline; SIGKILLs it after. The wait status, or nullopt when it had to be killed.
std::optional<int> reap(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (Clock::now() >= deadline) break;
    ::poll(nullptr, 0, 2);  // bounded wait for the child, not a synchronisation
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

struct RankSpec {
  std::uint64_t commId;
  std::uint32_t nRanks;
  std::uint32_t nNodes;
  int version;  // 5 or 6
  unsigned seed;
  const Call* calls = kCalls;  // the call sequence every rank runs (forked: the pointer stays valid)
  int numCalls = kNumCalls;
  int localRanks = kLocalRanks;  // rank processes of the communicator on this node
};

// A rank: waits at the barrier (EOF on barrierFd), sleeps 0-2000 µs, dlopens the tuner, inits the communicator and
// runs the call sequence with fresh NCCL-style tables. Never returns.
[[noreturn]] void rankMain(int barrierFd, int outFd, const RankSpec& spec) {
  pollfd pfd{barrierFd, POLLIN, 0};
  if (::poll(&pfd, 1, 30000) <= 0) ::_exit(3);
  char byte = 0;
  while (::read(barrierFd, &byte, 1) > 0) {
  }
  std::mt19937 rng(spec.seed);
  ::usleep(static_cast<useconds_t>(rng() % 2001));

  RankReport report;
  capturedLog().clear();
  Library lib = Library::open(OPTIFLOW_TUNER_PLUGIN);
  std::string log;
  if (!lib) {
    log = "dlopen: " + dlerrorText();
  } else {
    const auto* v5 = lib.table<ncclTuner_v5_t>("ncclTunerPlugin_v5");
    const auto* v6 = lib.table<ncclTuner_v6_t>("ncclTunerPlugin_v6");
    auto init = spec.version == 6 ? v6->init : v5->init;
    auto getCollInfo = spec.version == 6 ? v6->getCollInfo : v5->getCollInfo;
    auto finalize = spec.version == 6 ? v6->finalize : v5->finalize;
    ncclNvlDomainInfo_v5_t nvl{static_cast<int>(spec.nNodes), static_cast<int>(spec.nRanks / spec.nNodes),
                               static_cast<int>(spec.nRanks / spec.nNodes)};
    ncclTunerConstants_v5_t constants = sentinelConstants();
    void* ctx = nullptr;
    report.initRc = init(&ctx, spec.commId, spec.nRanks, spec.nNodes, captureLogger, &nvl, &constants);
    if (report.initRc == ncclSuccess) {
      report.callsOk = 1;
      report.numCalls = std::min(spec.numCalls, kMaxCalls);
      for (int i = 0; i < report.numCalls; ++i) {
        CostTable<7> table = ncclLikeTable<7>();
        int nCh = 0;
        if (getCollInfo(ctx, spec.calls[i].coll, spec.calls[i].nBytes, 1, table.nccl(), 7, NCCL_NUM_PROTOCOLS, 0,
                        &nCh) != ncclSuccess) {
          report.callsOk = 0;
        }
        const Choice c = ncclPick(table);
        report.calls[i] = {c.algo, c.proto, nCh};
      }
      finalize(ctx);
    }
    for (const LogLine& l : capturedLog()) log += "[" + std::to_string(l.level) + "] " + l.text + "\n";
  }
  if (log.size() > 4000) log.resize(4000);
  const auto len = static_cast<std::uint32_t>(log.size());
  const bool ok = writeAll(outFd, &report, sizeof(report)) && writeAll(outFd, &len, sizeof(len)) &&
                  writeAll(outFd, log.data(), log.size());
  ::_exit(ok ? 0 : 4);
}

struct RankResult {
  RankReport report;
  std::string log;
  std::optional<int> status;  // wait status; nullopt: killed at the deadline
  bool complete = false;      // the whole report arrived
};

// Forks kLocalRanks rank processes for one communicator, releases them together, collects their reports.
std::vector<RankResult> runCommunicator(const RankSpec& base, Clock::time_point deadline) {
  int barrier[2];
  if (::pipe2(barrier, O_CLOEXEC) != 0) return {};
  std::vector<pid_t> pids;
  std::vector<int> outs;
  for (int k = 0; k < base.localRanks; ++k) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) break;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(barrier[1]);
      ::close(out[0]);
      for (int fd : outs) ::close(fd);
      RankSpec spec = base;
      spec.seed = base.seed * 131u + static_cast<unsigned>(k) * 7919u + static_cast<unsigned>(::getpid());
      rankMain(barrier[0], out[1], spec);
    }
    ::close(out[1]);
    if (pid < 0) {
      ::close(out[0]);
      break;
    }
    pids.push_back(pid);
    outs.push_back(out[0]);
  }
  ::close(barrier[0]);
  ::close(barrier[1]);  // every rank sees EOF now: the start signal

  std::vector<std::string> data(outs.size());
  std::vector<bool> open(outs.size(), true);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < outs.size(); ++i) {
      if (open[i]) {
        fds.push_back({outs[i], POLLIN, 0});
        which.push_back(i);
      }
    }
    if (fds.empty()) break;
    const int n = ::poll(fds.data(), fds.size(), msLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // deadline: whatever has not reported is killed below
    for (std::size_t j = 0; j < fds.size(); ++j) {
      if (fds[j].revents == 0) continue;
      char buf[4096];
      const ssize_t r = ::read(fds[j].fd, buf, sizeof(buf));
      if (r > 0) {
        data[which[j]].append(buf, static_cast<std::size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        open[which[j]] = false;
      }
    }
  }
  std::vector<RankResult> results(pids.size());
  for (std::size_t i = 0; i < pids.size(); ++i) {
    ::close(outs[i]);
    results[i].status = reap(pids[i], open[i] ? Clock::now() : Clock::now() + std::chrono::seconds(10));
    const std::string& d = data[i];
    if (d.size() >= sizeof(RankReport) + sizeof(std::uint32_t)) {
      std::memcpy(&results[i].report, d.data(), sizeof(RankReport));
      std::uint32_t len = 0;
      std::memcpy(&len, d.data() + sizeof(RankReport), sizeof(len));
      if (d.size() == sizeof(RankReport) + sizeof(len) + len) {
        results[i].log = d.substr(sizeof(RankReport) + sizeof(len));
        results[i].complete = true;
      }
    }
  }
  return results;
}

// Checks that every rank inited, reported and agrees with rank 0. Rank 0's sequence, or nullopt after a failure.
std::optional<Sequence> agreedSequence(const std::vector<RankResult>& results, const std::string& what,
                                       int localRanks = kLocalRanks) {
  EXPECT_EQ(results.size(), static_cast<std::size_t>(localRanks)) << what << ": could not fork every rank";
  if (results.size() != static_cast<std::size_t>(localRanks)) return std::nullopt;
  std::optional<Sequence> first;
  bool ok = true;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const RankResult& r = results[i];
    const bool exited = r.status && WIFEXITED(*r.status) && WEXITSTATUS(*r.status) == 0;
    if (!exited || !r.complete || r.report.initRc != ncclSuccess || r.report.callsOk != 1) {
      ADD_FAILURE() << what << ": rank " << i << " failed (status " << (r.status ? std::to_string(*r.status) : "killed")
                    << ", complete " << r.complete << ", initRc " << r.report.initRc << ", callsOk " << r.report.callsOk
                    << "); its log:\n"
                    << r.log;
      ok = false;
      continue;
    }
    const Sequence s(r.report.calls, r.report.calls + std::clamp(r.report.numCalls, 0, kMaxCalls));
    if (!first) {
      first = s;
    } else if (s != *first) {
      ADD_FAILURE() << what << ": rank " << i << " decided differently from rank 0\n  rank 0: " << toString(*first)
                    << "\n  rank " << i << ": " << toString(s) << "\n  rank 0 log:\n"
                    << results[0].log << "  rank " << i << " log:\n"
                    << r.log;
      ok = false;
    }
  }
  return ok ? first : std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// The writer process: publishes its plans in a tight loop until told to stop.

struct WriterShared {
  std::atomic<int> stop;
  std::atomic<std::uint64_t> published;
  std::atomic<std::uint64_t> failures;
  char lastError[512];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void killSelf() { ::raise(SIGKILL); }

class ConsistencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<CleanEnvironment>();
    ns_ = uniqueNamespace();
    ::setenv("OPTIFLOW_NAMESPACE", ns_.c_str(), 1);
    void* mem = ::mmap(nullptr, sizeof(WriterShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    shared_ = new (mem) WriterShared{};
  }

  void TearDown() override {
    stopWriter();
    removeNamespace(ns_);
    if (shared_ != nullptr) ::munmap(shared_, sizeof(WriterShared));
    env_.reset();
  }

  // Forks a writer that publishes plans[0], plans[1], ... in a loop; returns once the first publish succeeded.
  void startWriter(std::vector<schedcache::Plan> plans) {
    int ready[2];
    ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    writer_ = ::fork();
    ASSERT_GE(writer_, 0);
    if (writer_ == 0) {
      ::close(ready[0]);
      schedcache::WriterOptions options;
      options.ns = ns_;
      options.build = "abi-consistency";
      schedcache::Error e;
      std::unique_ptr<schedcache::Writer> w = schedcache::Writer::open(options, &e);
      if (!w) {
        std::snprintf(shared_->lastError, sizeof(shared_->lastError), "open: %s", e.message.c_str());
        ::_exit(2);
      }
      bool signalled = false;
      while (shared_->stop.load() == 0) {
        for (const schedcache::Plan& p : plans) {
          if (w->publish(p, &e)) {
            shared_->published.fetch_add(1);
          } else {
            shared_->failures.fetch_add(1);
            std::snprintf(shared_->lastError, sizeof(shared_->lastError), "publish: %s", e.message.c_str());
          }
          if (!signalled && shared_->published.load() > 0) {
            signalled = writeAll(ready[1], "r", 1);
            ::close(ready[1]);
          }
        }
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    pollfd pfd{ready[0], POLLIN, 0};
    const int n = ::poll(&pfd, 1, 20000);
    char byte = 0;
    const bool ok = n == 1 && ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    ASSERT_TRUE(ok) << "the writer never published: " << shared_->lastError;
  }

  void stopWriter() {
    if (writer_ <= 0) return;
    shared_->stop.store(1);
    const std::optional<int> status = reap(writer_, Clock::now() + std::chrono::seconds(10));
    writer_ = -1;
    EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "the writer did not stop cleanly: " << shared_->lastError;
  }

  std::uint64_t commId(int n) const {
    return (static_cast<std::uint64_t>(::getpid()) << 32) ^ (0xc0ffee0000ull + static_cast<std::uint64_t>(n));
  }

  std::unique_ptr<CleanEnvironment> env_;
  std::string ns_;
  WriterShared* shared_ = nullptr;
  pid_t writer_ = -1;
};

// One node, unpinned: the first rank records the current plan for the communicator, the others adopt it, whatever the
// writer publishes between their inits.
TEST_F(ConsistencyTest, OneNodeRanksAgreeWhileWriterAlternates) {
  const schedcache::Plan a = makePlan(false);
  const schedcache::Plan b = makePlan(true);
  const Sequence seqA = expectedSequence(&a, 8, 1);
  const Sequence seqB = expectedSequence(&b, 8, 1);
  ASSERT_NE(seqA, seqB);
  startWriter({a, b});

  const auto start = Clock::now();
  const auto loopDeadline = start + std::chrono::seconds(25);
  int sawA = 0, sawB = 0, sawNone = 0, comms = 0;
  const Sequence seqNone = expectedSequence(nullptr, 8, 1);
  // At least 50 communicators; more (bounded) until both plans were seen, so the test can tell a frozen writer
  // from a working rule.
  for (; comms < 400 && (comms < 50 || sawA == 0 || sawB == 0) && Clock::now() < loopDeadline; ++comms) {
    const RankSpec spec{commId(comms), 8, 1, comms % 2 == 0 ? 5 : 6, static_cast<unsigned>(comms)};
    const std::vector<RankResult> results = runCommunicator(spec, Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "communicator " + std::to_string(comms));
    ASSERT_TRUE(s.has_value());
    if (*s == seqA) {
      ++sawA;
    } else if (*s == seqB) {
      ++sawB;
    } else if (*s == seqNone) {
      ++sawNone;  // the current plan was unreadable at the first rank's init: all ranks agreed on no plan
    } else {
      FAIL() << "communicator " << comms << " used neither A nor B: " << toString(*s) << "\n  A: " << toString(seqA)
             << "\n  B: " << toString(seqB) << "\n  rank 0 log:\n"
             << results[0].log;
    }
  }
  const std::uint64_t published = shared_->published.load();
  stopWriter();
  std::printf(
      "[          ] %d communicators x %d ranks: plan A %d, plan B %d, no plan %d; %llu publishes, %llu failed\n",
      comms, kLocalRanks, sawA, sawB, sawNone, static_cast<unsigned long long>(published),
      static_cast<unsigned long long>(shared_->failures.load()));
  EXPECT_GT(sawA, 0) << "no communicator used plan A: the race was not exercised";
  EXPECT_GT(sawB, 0) << "no communicator used plan B: the race was not exercised";
  EXPECT_EQ(shared_->failures.load(), 0u) << "the writer could not publish: " << shared_->lastError;
  EXPECT_LE(sawNone, comms / 2) << "most communicators found no readable plan";
}

// Two nodes, OPTIFLOW_PLAN pins A: every rank uses A while the writer keeps publishing other plans.
TEST_F(ConsistencyTest, PinnedPlanWinsOverPublishesOnTwoNodes) {
  const schedcache::Plan a = makePlan(false);
  std::string error;
  const std::optional<std::uint64_t> hashA = publishPlan(ns_, a, &error);
  ASSERT_TRUE(hashA) << error;
  ::setenv("OPTIFLOW_PLAN", schedcache::formatHash(*hashA).c_str(), 1);
  const Sequence seqA = expectedSequence(&a, 16, 2);

  // The first communicator pins A in the segment; from then on the writer must not evict A's slot.
  {
    const std::vector<RankResult> results =
        runCommunicator(RankSpec{commId(0), 16, 2, 5, 1}, Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "communicator 0");
    ASSERT_TRUE(s.has_value());
    ASSERT_EQ(*s, seqA) << "rank 0 log:\n" << results[0].log;
  }
  // Six distinct plans in rotation: every publish writes a new image into the oldest slot it may reuse, so only the
  // pin keeps A's slot from being overwritten.
  std::vector<schedcache::Plan> others;
  for (std::int32_t bias = 0; bias < 6; ++bias) others.push_back(makePlan(true, bias));
  startWriter(others);
  for (int c = 1; c <= 20; ++c) {
    const std::vector<RankResult> results =
        runCommunicator(RankSpec{commId(c), 16, 2, c % 2 == 0 ? 5 : 6, static_cast<unsigned>(c)},
                        Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "communicator " + std::to_string(c));
    ASSERT_TRUE(s.has_value());
    ASSERT_EQ(*s, seqA) << "communicator " << c << " did not use the pinned plan; rank 0 log:\n" << results[0].log;
  }
  // The writer really was publishing over the pinned plan meanwhile.
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (shared_->published.load() < 4 && Clock::now() < until) ::poll(nullptr, 0, 1);
  EXPECT_GE(shared_->published.load(), 4u);
  EXPECT_EQ(shared_->failures.load(), 0u) << "the writer could not publish: " << shared_->lastError;
}

// A writer SIGKILLed in the middle of writing B leaves A current and intact; ranks all get A; a new writer can
// publish afterwards (the kernel dropped the dead writer's lock).
TEST_F(ConsistencyTest, WriterKilledMidPublishLeavesPreviousPlan) {
  const schedcache::Plan a = makePlan(false);
  const schedcache::Plan b = makePlan(true);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    schedcache::WriterOptions options;
    options.ns = ns_;
    options.build = "abi-killed";
    schedcache::Error e;
    std::unique_ptr<schedcache::Writer> w = schedcache::Writer::open(options, &e);
    if (!w || !w->publish(a, &e)) ::_exit(2);
    w->setMidWriteHookForTest(&killSelf);
    w->publish(b, &e);
    ::_exit(3);  // the hook never ran
  }
  const std::optional<int> status = reap(child, Clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value()) << "the writer hung";
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
      << "the writer was not killed by its mid-write hook (status " << *status << ")";

  schedcache::Error e;
  std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns_, &e);
  ASSERT_NE(reader, nullptr) << e.message;
  schedcache::PlanInfo info;
  ASSERT_EQ(reader->current(&info), schedcache::Status::kOk);
  EXPECT_EQ(info.contentHash, schedcache::contentHash(a));

  {
    const std::vector<RankResult> results =
        runCommunicator(RankSpec{commId(0), 8, 1, 5, 1}, Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "after the killed writer");
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(*s, expectedSequence(&a, 8, 1)) << "rank 0 log:\n" << results[0].log;
  }

  std::string error;
  ASSERT_TRUE(publishPlan(ns_, b, &error).has_value()) << "a new writer cannot publish after the killed one: " << error;
  {
    const std::vector<RankResult> results =
        runCommunicator(RankSpec{commId(1), 8, 1, 6, 2}, Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "after the new publish");
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(*s, expectedSequence(&b, 8, 1)) << "rank 0 log:\n" << results[0].log;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Rank-consistent trials (docs/consistency.md, "Trials"): a plan entry names candidates, NCCL's own choice among them;
// every rank tries them on the same calls, because the choice depends only on the pinned plan's hash, the
// communicator id and the communicator's own count of calls of that collective and size range.

constexpr Call kTrialCalls[] = {
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllGather, 65536},    {ncclFuncAllReduce, 4u << 20},
    {ncclFuncAllReduce, 1024},     {ncclFuncAllReduce, 2u << 20}, {ncclFuncAllGather, 131072},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 8u << 20}, {ncclFuncAllGather, 65536},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllGather, 65536},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 3u << 20}, {ncclFuncAllGather, 65536},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllGather, 65536},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllGather, 65536},
    {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllReduce, 1u << 20}, {ncclFuncAllGather, 65536},
};
constexpr int kNumTrialCalls = static_cast<int>(sizeof(kTrialCalls) / sizeof(kTrialCalls[0]));
constexpr int kTrialRanks = 8;

schedcache::TrialCandidate candidate(std::optional<Algorithm> a, std::optional<Protocol> p, std::int32_t ch) {
  schedcache::TrialCandidate c;
  c.algorithm = a;
  c.protocol = p;
  c.nChannels = ch;
  return c;
}

// A and B decide differently and try different candidates.
schedcache::Plan makeTrialPlan(bool b) {
  schedcache::Plan p = makePlan(b);
  p.source = b ? "tests/abi trial plan B" : "tests/abi trial plan A";
  for (schedcache::PlanItem& it : p.items) {
    if (it.nRanks != 8) continue;
    if (it.coll == Collective::AllReduce && it.minBytes == 65536) {
      it.trials = {candidate(std::nullopt, std::nullopt, 0), candidate(Algorithm::Tree, Protocol::Simple, b ? 6 : 2),
                   candidate(Algorithm::Ring, Protocol::Simple, 8)};
      it.trialCalls = b ? 2 : 3;
    } else if (it.coll == Collective::AllGather) {
      it.trials = {candidate(Algorithm::Pat, Protocol::Simple, 0), candidate(std::nullopt, std::nullopt, 0)};
      it.trialCalls = b ? 1 : 2;
    }
  }
  return p;
}

// What a rank using `plan` (pinned as `hash`) on communicator commId reports for kTrialCalls, from the plan's items
// and the tuner's own choice function (the plugin is reached through dlopen; the pure function is linked here).
Sequence expectedTrialSequence(const schedcache::Plan& plan, std::uint64_t hash, std::uint64_t commId) {
  Sequence s;
  const Choice native = ncclPick(ncclLikeTable<7>());
  std::map<const schedcache::PlanItem*, std::uint64_t> calls;
  for (const Call& call : kTrialCalls) {
    Outcome o{native.algo, native.proto, 0};
    for (const schedcache::PlanItem& it : plan.items) {
      if (core::ncclFuncIndex(it.coll) != static_cast<int>(call.coll) || it.nRanks != 8 || it.nNodes != 1 ||
          call.nBytes < it.minBytes || call.nBytes > it.maxBytes) {
        continue;
      }
      o = {core::ncclIndex(*it.algorithm), core::ncclIndex(*it.protocol), it.nChannels};
      if (it.trials.empty()) break;
      const std::optional<std::uint32_t> c =
          tuner::trialCandidate(hash, commId, static_cast<std::uint32_t>(call.coll), it.minBytes, calls[&it]++,
                                static_cast<std::uint32_t>(it.trials.size()), it.trialCalls);
      if (c) {
        const schedcache::TrialCandidate& t = it.trials[*c];
        o = t.algorithm ? Outcome{core::ncclIndex(*t.algorithm), core::ncclIndex(*t.protocol), t.nChannels}
                        : Outcome{native.algo, native.proto, 0};
      }
    }
    s.push_back(o);
  }
  return s;
}

TEST(TrialChoice, PureFunctionCyclingEveryCandidate) {
  // The same inputs give the same answer; each candidate gets exactly callsEach calls; then the decision.
  for (std::uint64_t comm : {1ull, 0xdeadbeefull, 0x123456789abcdefull}) {
    std::vector<int> seen(5, 0);
    for (std::uint64_t call = 0; call < 5 * 3; ++call) {
      const auto c = tuner::trialCandidate(0xabcdef, comm, 4, 65536, call, 5, 3);
      ASSERT_TRUE(c.has_value());
      ASSERT_LT(*c, 5u);
      EXPECT_EQ(c, tuner::trialCandidate(0xabcdef, comm, 4, 65536, call, 5, 3));
      ++seen[*c];
      if (call % 3 != 0) {
        EXPECT_EQ(c, tuner::trialCandidate(0xabcdef, comm, 4, 65536, call - 1, 5, 3));
      }
    }
    EXPECT_EQ(seen, std::vector<int>(5, 3));
    EXPECT_FALSE(tuner::trialCandidate(0xabcdef, comm, 4, 65536, 15, 5, 3).has_value());
  }
  // The rotation depends on the communicator: across many communicators every candidate comes first sometimes.
  std::set<std::uint32_t> first;
  for (std::uint64_t comm = 1; comm < 64; ++comm) first.insert(*tuner::trialCandidate(7, comm, 2, 0, 0, 4, 1));
  EXPECT_EQ(first.size(), 4u);
}

// Eight ranks of one communicator, the same call sequence, while a writer alternates two plans with trials: every
// rank makes the same decision on every call, trials included, and the sequence is exactly the one the plan and the
// choice function give for the plan the communicator pinned.
TEST_F(ConsistencyTest, TrialsAreIdenticalOnEveryRankWhilePlansArePublished) {
  const schedcache::Plan a = makeTrialPlan(false);
  const schedcache::Plan b = makeTrialPlan(true);
  ASSERT_EQ(schedcache::validatePlan(a), "");
  ASSERT_EQ(schedcache::validatePlan(b), "");
  const std::uint64_t hashA = schedcache::contentHash(a);
  const std::uint64_t hashB = schedcache::contentHash(b);
  ASSERT_NE(hashA, hashB);
  startWriter({a, b});
  const auto loopDeadline = Clock::now() + std::chrono::seconds(40);
  int sawA = 0, sawB = 0, sawNone = 0, comms = 0;
  for (; comms < 120 && (comms < 12 || sawA == 0 || sawB == 0) && Clock::now() < loopDeadline; ++comms) {
    RankSpec spec{commId(1000 + comms), 8, 1, comms % 2 == 0 ? 5 : 6, static_cast<unsigned>(comms)};
    spec.calls = kTrialCalls;
    spec.numCalls = kNumTrialCalls;
    spec.localRanks = kTrialRanks;
    const std::vector<RankResult> results = runCommunicator(spec, Clock::now() + std::chrono::seconds(20));
    const std::optional<Sequence> s = agreedSequence(results, "communicator " + std::to_string(comms), kTrialRanks);
    ASSERT_TRUE(s.has_value());
    const Sequence seqA = expectedTrialSequence(a, hashA, spec.commId);
    const Sequence seqB = expectedTrialSequence(b, hashB, spec.commId);
    ASSERT_NE(seqA, seqB);
    if (*s == seqA) {
      ++sawA;
    } else if (*s == seqB) {
      ++sawB;
    } else {
      // No plan at all (the current plan unreadable at the first rank's init): NCCL's pick on every call.
      const Choice native = ncclPick(ncclLikeTable<7>());
      const Sequence none(kNumTrialCalls, Outcome{native.algo, native.proto, 0});
      if (*s == none) {
        ++sawNone;
        continue;
      }
      FAIL() << "communicator " << comms << " followed neither plan:\n  got " << toString(*s) << "\n  A   "
             << toString(seqA) << "\n  B   " << toString(seqB) << "\n  rank 0 log:\n"
             << results[0].log;
    }
  }
  stopWriter();
  std::printf("[          ] %d communicators x %d ranks with trials: plan A %d, plan B %d, no plan %d\n", comms,
              kTrialRanks, sawA, sawB, sawNone);
  EXPECT_GT(sawA, 0);
  EXPECT_GT(sawB, 0);
  EXPECT_LE(sawNone, comms / 2);
}

}  // namespace
}  // namespace optiflow::abitest
