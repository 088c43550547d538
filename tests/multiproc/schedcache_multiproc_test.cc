// The schedule cache across real processes (fork, a real /dev/shm segment): a writer killed in the middle of a
// publish, readers loading while a writer keeps replacing plans, and ranks of one communicator pinning at once.
// Children report through exit codes and pipes; only the parent uses gtest assertions.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::schedcache {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();

// `ranges` contiguous ranges per collective for (8 ranks, 1 node) and (16, 2); `variant` changes every decision.
Plan makePlan(int variant, int ranges) {
  Plan plan;
  plan.source = "/plans/v" + std::to_string(variant);
  const std::uint32_t shapes[][2] = {{8, 1}, {16, 2}};
  for (std::uint32_t c = 0; c < kNumCollectives; ++c) {
    for (const auto& shape : shapes) {
      for (int i = 0; i < ranges; ++i) {
        PlanItem it;
        it.coll = *core::collectiveFromNcclFunc(static_cast<int>(c));
        it.nRanks = shape[0];
        it.nNodes = shape[1];
        it.minBytes = static_cast<std::uint64_t>(i) * 1000;
        it.maxBytes = i + 1 == ranges ? kMax64 : it.minBytes + 999;
        it.algorithm = core::algorithmFromNccl((i + variant) % core::kNumAlgorithms);
        it.protocol = core::protocolFromNccl((i * 7 + variant) % core::kNumProtocols);
        it.nChannels = (i + variant) % 32;
        it.chunkBytes = static_cast<std::uint64_t>(variant) << 12;
        it.jsonPath = plan.source + "/s" + std::to_string(i % 50) + ".json";
        plan.items.push_back(it);
      }
    }
  }
  return plan;
}

using Expected = std::array<std::vector<Decision>, kNumCollectives>;

Expected expectedFor(const Plan& plan, std::uint32_t nRanks, std::uint32_t nNodes) {
  Expected out;
  for (const PlanItem& it : plan.items) {
    if (it.nRanks != nRanks || it.nNodes != nNodes) continue;
    Decision d;
    d.minBytes = it.minBytes;
    d.maxBytes = it.maxBytes;
    d.chunkBytes = it.chunkBytes;
    d.algorithm = static_cast<std::int8_t>(core::ncclIndex(*it.algorithm));  // makePlan decides every item
    d.protocol = static_cast<std::int8_t>(core::ncclIndex(*it.protocol));
    d.nChannels = it.nChannels;
    out[static_cast<std::size_t>(*core::ncclFuncIndex(it.coll))].push_back(d);
  }
  for (auto& v : out) {
    std::sort(v.begin(), v.end(), [](const Decision& a, const Decision& b) { return a.minBytes < b.minBytes; });
  }
  return out;
}

bool matches(const CommPlan& got, const Expected& want) {
  for (std::size_t c = 0; c < kNumCollectives; ++c) {
    const auto& a = got.byCollective[c];
    const auto& b = want[c];
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i].minBytes != b[i].minBytes || a[i].maxBytes != b[i].maxBytes || a[i].chunkBytes != b[i].chunkBytes ||
          a[i].algorithm != b[i].algorithm || a[i].protocol != b[i].protocol || a[i].nChannels != b[i].nChannels) {
        return false;
      }
    }
  }
  return true;
}

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (::pipe(fd) != 0) fd[0] = fd[1] = -1;
  }
  ~Pipe() {
    closeRead();
    closeWrite();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void closeRead() {
    if (fd[0] >= 0) ::close(fd[0]);
    fd[0] = -1;
  }
  void closeWrite() {
    if (fd[1] >= 0) ::close(fd[1]);
    fd[1] = -1;
  }
  // Blocks until every holder of the write end closed it: the start signal of a barrier.
  void waitClosed() {
    char c;
    while (::read(fd[0], &c, 1) > 0) {
    }
  }
  // True once every holder of the write end closed it (never blocks).
  bool closed() {
    pollfd p{fd[0], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP) != 0;
  }
  template <typename T>
  bool put(const T& v) {
    return ::write(fd[1], &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
  }
  template <typename T>
  bool get(T* v) {
    return ::read(fd[0], v, sizeof(*v)) == static_cast<ssize_t>(sizeof(*v));
  }
};

int waitChild(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

class SchedCacheMultiprocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = ("t-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name())
              .substr(0, 64);
    Writer::remove(ns_, nullptr);
  }
  void TearDown() override { Writer::remove(ns_, nullptr); }

  std::unique_ptr<Writer> openWriter() {
    WriterOptions o;
    o.ns = ns_;
    o.lockTimeoutMs = 2000;
    Error e;
    auto w = Writer::open(o, &e);
    EXPECT_NE(w, nullptr) << e.message;
    return w;
  }

  std::string ns_;
};

void killSelf() { ::raise(SIGKILL); }

TEST_F(SchedCacheMultiprocTest, WriterKilledMidPublishLeavesPreviousPlan) {
  const Plan a = makePlan(1, 40);
  const Plan b = makePlan(2, 1600);  // 16000 entries: the kill lands in the middle of a long write
  const Plan c = makePlan(3, 40);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    WriterOptions o;
    o.ns = ns_;
    auto w = Writer::open(o, nullptr);
    if (w == nullptr || !w->publish(a, nullptr)) ::_exit(2);
    w->setMidWriteHookForTest(&killSelf);
    w->publish(b, nullptr);
    ::_exit(3);  // not reached
  }
  const int status = waitChild(child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child status " << status;
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  Error e;
  auto r = Reader::attach(ns_, &e);
  ASSERT_NE(r, nullptr) << e.message;
  PlanInfo info;
  ASSERT_EQ(r->current(&info), Status::kOk);
  EXPECT_EQ(info.contentHash, contentHash(a));
  CommPlan cp;
  std::string detail;
  ASSERT_EQ(r->loadComm(0, 8, 1, &cp, &detail), Status::kOk) << detail;
  EXPECT_TRUE(matches(cp, expectedFor(a, 8, 1)));
  EXPECT_EQ(r->loadComm(contentHash(b), 8, 1, &cp, &detail), Status::kNotFound);

  std::vector<std::string> report;
  EXPECT_TRUE(r->check(&report));  // the current plan is intact; the abandoned slot is only reported
  const auto odd = std::count_if(report.begin(), report.end(), [](const std::string& line) {
    return line.find("abandoned by a writer that died (seq odd)") != std::string::npos;
  });
  EXPECT_EQ(odd, 1) << ::testing::PrintToString(report);

  // The kernel dropped the dead writer's lock: a new writer publishes.
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const auto pc = w->publish(c, &e);
  ASSERT_TRUE(pc.has_value()) << e.message;
  ASSERT_EQ(r->loadComm(0, 8, 1, &cp, &detail), Status::kOk) << detail;
  EXPECT_EQ(cp.planHash, contentHash(c));
  EXPECT_TRUE(matches(cp, expectedFor(c, 8, 1)));
  EXPECT_EQ(r->loadComm(contentHash(a), 8, 1, &cp, &detail), Status::kOk) << detail;
  report.clear();
  EXPECT_TRUE(r->check(&report)) << ::testing::PrintToString(report);
}

TEST_F(SchedCacheMultiprocTest, WriterKilledAtRandomTimes) {
  std::vector<Plan> plans;
  for (int v = 0; v < 6; ++v) plans.push_back(makePlan(v, 300 + 100 * v));
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    Pipe started;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      started.closeRead();
      WriterOptions o;
      o.ns = ns_;
      o.lockTimeoutMs = 10000;
      auto w = Writer::open(o, nullptr);
      if (w == nullptr || !w->publish(plans[0], nullptr)) ::_exit(2);
      started.put('s');
      for (std::size_t i = 1;; ++i) w->publish(plans[i % plans.size()], nullptr);
    }
    started.closeWrite();
    char c;
    ASSERT_TRUE(started.get(&c));
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 7 * round));
    ::kill(child, SIGKILL);
    const int status = waitChild(child);
    ASSERT_TRUE(WIFSIGNALED(status));

    Error e;
    auto r = Reader::attach(ns_, &e);
    ASSERT_NE(r, nullptr) << e.message;
    PlanInfo info;
    ASSERT_EQ(r->current(&info), Status::kOk);
    CommPlan cp;
    std::string detail;
    ASSERT_EQ(r->loadComm(0, 16, 2, &cp, &detail), Status::kOk) << detail;
    const auto plan =
        std::find_if(plans.begin(), plans.end(), [&](const Plan& p) { return contentHash(p) == cp.planHash; });
    ASSERT_NE(plan, plans.end());
    EXPECT_TRUE(matches(cp, expectedFor(*plan, 16, 2)));
    std::vector<std::string> report;
    EXPECT_TRUE(r->check(&report)) << ::testing::PrintToString(report);
  }
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  Error e;
  EXPECT_TRUE(w->publish(makePlan(9, 10), &e).has_value()) << e.message;
}

TEST_F(SchedCacheMultiprocTest, ReadersNeverSeeTornPlans) {
  constexpr int kVariants = 8;
  constexpr int kReaders = 3;
  std::vector<Plan> plans;
  std::map<std::uint64_t, Expected> expected;
  std::vector<std::uint64_t> hashes;
  for (int v = 0; v < kVariants; ++v) {
    plans.push_back(makePlan(v, 100 + 25 * v));
    hashes.push_back(contentHash(plans.back()));
    expected[hashes.back()] = expectedFor(plans.back(), 8, 1);
  }
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kVariants));
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  Error e;
  ASSERT_TRUE(w->publish(plans[0], &e).has_value()) << e.message;

  Pipe barrier;
  Pipe ready;  // one byte per reader in its loop: the publishing starts then (a reader may start late when loaded)
  Pipe stop;
  Pipe results;
  std::vector<pid_t> readers;
  for (int i = 0; i < kReaders; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      barrier.closeWrite();
      ready.closeRead();
      stop.closeWrite();
      auto r = Reader::attach(ns_, nullptr);
      if (r == nullptr) ::_exit(2);
      barrier.waitClosed();
      ready.put('r');
      ready.closeWrite();
      std::uint64_t ok = 0;
      std::uint64_t retried = 0;
      for (std::uint64_t n = 0; !stop.closed(); ++n) {
        CommPlan cp;
        // The current plan, or by hash the plan whose slot the writer overwrites next (published three plans
        // ago; generation g is plans[(g - 1) % kVariants]): the reads most exposed to a concurrent write.
        const std::uint64_t g = r->generation();
        const std::uint64_t want =
            n % 2 == 0 || g < 4 ? 0 : hashes[(g - 4 + static_cast<std::uint64_t>(i % 2)) % kVariants];
        const Status st = r->loadComm(want, 8, 1, &cp, nullptr);
        if (st == Status::kOk) {
          auto it = expected.find(cp.planHash);
          if (it == expected.end() || (want != 0 && cp.planHash != want)) ::_exit(3);
          if (!matches(cp, it->second)) ::_exit(4);  // torn: never acceptable
          ++ok;
        } else if (st == Status::kTorn || (want != 0 && st == Status::kNotFound)) {
          ++retried;
        } else {
          ::_exit(10 + static_cast<int>(st));
        }
      }
      // One write per child: writes of up to PIPE_BUF bytes do not interleave.
      const std::uint64_t counts[2] = {ok, retried};
      results.put(counts);
      ::_exit(0);
    }
    readers.push_back(pid);
  }
  barrier.closeWrite();
  ready.closeWrite();
  results.closeWrite();
  stop.closeRead();
  // Every reader is in its loop (or died: its end of `ready` closed, and its exit status says why).
  for (int i = 0; i < kReaders; ++i) {
    char c = 0;
    if (!ready.get(&c)) break;
  }
  // About a second, and enough plans replaced whatever the build type and load.
  int published = 0;
  const auto start = Clock::now();
  for (std::size_t k = 1; Clock::now() - start < std::chrono::seconds(1) || published < 20; ++k) {
    if (w->publish(plans[k % kVariants], &e)) ++published;
    if (Clock::now() - start > std::chrono::seconds(30)) {
      ADD_FAILURE() << "publishing is far too slow: " << published << " plans in 30 s";
      break;
    }
  }
  stop.closeWrite();
  std::uint64_t totalOk = 0;
  std::uint64_t totalRetried = 0;
  for (int i = 0; i < kReaders; ++i) {
    std::uint64_t counts[2] = {0, 0};
    ASSERT_TRUE(results.get(&counts));
    EXPECT_GT(counts[0], 0u);
    totalOk += counts[0];
    totalRetried += counts[1];
  }
  for (pid_t pid : readers) {
    const int status = waitChild(pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader exit status " << status;
  }
  RecordProperty("published", published);
  RecordProperty("loads", static_cast<int>(totalOk));
  RecordProperty("retried", static_cast<int>(totalRetried));
}

// A start line in memory shared with the children: released ranks leave within nanoseconds of each other, which a
// pipe (one wake-up after another) does not give.
struct StartLine {
  std::atomic<int> ready{0};
  std::atomic<int> go{0};
};

TEST_F(SchedCacheMultiprocTest, RanksPinningAtOnceAgree) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 100;
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  Error e;
  ASSERT_TRUE(w->publish(makePlan(0, 20), &e).has_value()) << e.message;
  void* shared = ::mmap(nullptr, sizeof(StartLine), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* line = new (shared) StartLine;
  int disagreements = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    const std::uint64_t commId = 0xabc000 + static_cast<std::uint64_t>(round);
    line->ready.store(0);
    line->go.store(0);
    Pipe results;
    std::vector<pid_t> ranks;
    for (int i = 0; i < kRanks; ++i) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        auto r = Reader::attach(ns_, nullptr);
        if (r == nullptr) ::_exit(2);
        // Rank 0 proposes the plan current when it looks, the others plans of their own: whichever rank gets there
        // first, every rank must return its proposal.
        PlanInfo info;
        const std::uint64_t proposed = i == 0 && r->current(&info) == Status::kOk
                                           ? info.contentHash
                                           : 0x100 + static_cast<std::uint64_t>(round * kRanks + i);
        line->ready.fetch_add(1);
        for (int spins = 0; line->go.load(std::memory_order_acquire) == 0; ++spins) {
          if (spins % 1024 == 0) std::this_thread::yield();  // two cores: let the others reach the line
        }
        Status st = Status::kSystem;
        const std::uint64_t got = r->pinComm(commId, proposed, kRanks, 1, &st);
        // One write per child: writes of up to PIPE_BUF bytes do not interleave.
        const std::uint64_t result[3] = {got, proposed, static_cast<std::uint64_t>(st)};
        results.put(result);
        ::_exit(0);
      }
      ranks.push_back(pid);
    }
    results.closeWrite();
    while (line->ready.load() < kRanks) std::this_thread::yield();
    line->go.store(1, std::memory_order_release);
    // Publishing meanwhile changes what "current" means (kBusy once pins hold every other slot: fine).
    w->publish(makePlan(round + 1, 20), nullptr);
    std::vector<std::uint64_t> got;
    std::vector<std::uint64_t> proposals;
    for (int i = 0; i < kRanks; ++i) {
      std::uint64_t result[3] = {0, 0, 0};
      ASSERT_TRUE(results.get(&result));
      EXPECT_EQ(result[2], static_cast<std::uint64_t>(Status::kOk));
      got.push_back(result[0]);
      proposals.push_back(result[1]);
    }
    for (pid_t pid : ranks) {
      const int status = waitChild(pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    const bool agree = std::all_of(got.begin(), got.end(), [&](std::uint64_t h) { return h == got[0]; });
    EXPECT_TRUE(agree) << ::testing::PrintToString(got);
    disagreements += agree ? 0 : 1;
    EXPECT_NE(std::find(proposals.begin(), proposals.end(), got[0]), proposals.end());
  }
  ::munmap(shared, sizeof(StartLine));
  EXPECT_EQ(disagreements, 0);
  auto r = Reader::attach(ns_, &e);
  ASSERT_NE(r, nullptr) << e.message;
  EXPECT_EQ(r->pins().size(), static_cast<std::size_t>(kRounds));
}

}  // namespace
}  // namespace optiflow::schedcache
