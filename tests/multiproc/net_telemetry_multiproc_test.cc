// Net telemetry across real processes (fork, a real /dev/shm segment): processes that start together claim the same
// and different peer names and add counts concurrently; every name gets one record and every total is exact.
// Children report through exit codes; only the parent uses gtest assertions.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/net/telemetry.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::net {
namespace {

namespace sc = optiflow::schedcache;

constexpr int kProcs = 6;
constexpr int kShared = 10;  // peer names every process uses
constexpr int kOwn = 5;      // peer names of one process only
constexpr int kRounds = 20000;

std::string sharedName(int i) { return "10.0.0." + std::to_string(i); }
std::string ownName(int proc, int i) { return "10.1." + std::to_string(proc) + "." + std::to_string(i); }
std::uint64_t sharedBytes(int i) { return static_cast<std::uint64_t>(i) * 100 + 1; }

// Exit codes: 0 ok, 2 attach failed, 3 a record was refused (CacheTelemetry fell back to local memory).
int child(const std::string& ns, int proc, int startFd) {
  char c;
  while (::read(startFd, &c, 1) > 0) {
  }  // every process starts when the parent closes the pipe
  auto reader = sc::Reader::attach(ns, nullptr);
  if (reader == nullptr) return 2;
  CacheTelemetry telemetry(reader.get());
  for (int round = 0; round < kRounds; ++round) {
    // Resolving in every round (not once) makes the claims race as hard as possible.
    for (int i = 0; i < kShared; ++i) {
      const int k = (i + proc * 3) % kShared;
      NetCounters* c1 = telemetry.peer(sharedName(k));
      if (c1 != reader->netPeer(sharedName(k))) return 3;
      countSent(c1, sharedBytes(k));
      countRecv(c1, 1);
    }
    for (int i = 0; i < kOwn; ++i) {
      NetCounters* c2 = telemetry.peer(ownName(proc, i));
      countSent(c2, static_cast<std::uint64_t>(proc + 1));
    }
    NetCounters* nic = telemetry.nic("eth0");
    countAdd(&nic->stalls, 1);
    countAdd(&nic->sendBusyNs, 3);
  }
  return 0;
}

TEST(NetTelemetryMultiproc, ConcurrentClaimsAndAddsAreExact) {
  const std::string ns = "tm-" + std::to_string(::getpid());
  sc::Writer::remove(ns, nullptr);
  sc::WriterOptions o;
  o.ns = ns;
  sc::Error e;
  auto writer = sc::Writer::open(o, &e);
  ASSERT_NE(writer, nullptr) << e.message;

  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(start[1]);
      ::_exit(child(ns, p, start[0]));
    }
    pids.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);
  for (std::size_t p = 0; p < pids.size(); ++p) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[p], &status, 0), pids[p]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "process " << p << " status " << status;
  }

  auto reader = sc::Reader::attach(ns, &e);
  ASSERT_NE(reader, nullptr) << e.message;
  std::map<std::string, sc::NetCounters> peers;
  for (const sc::NetStatsRecord& r : reader->netPeers()) {
    EXPECT_TRUE(peers.emplace(r.name, r.counters).second) << "two records for " << r.name;
    EXPECT_EQ(r.key, sc::netNameKey(r.name, std::string(r.name).size())) << r.name;
  }
  EXPECT_EQ(peers.size(), static_cast<std::size_t>(kShared + kProcs * kOwn));
  for (int i = 0; i < kShared; ++i) {
    ASSERT_EQ(peers.count(sharedName(i)), 1u) << sharedName(i);
    const sc::NetCounters& c = peers[sharedName(i)];
    EXPECT_EQ(c.msgsSent, static_cast<std::uint64_t>(kProcs * kRounds)) << sharedName(i);
    EXPECT_EQ(c.bytesSent, static_cast<std::uint64_t>(kProcs * kRounds) * sharedBytes(i)) << sharedName(i);
    EXPECT_EQ(c.msgsRecv, static_cast<std::uint64_t>(kProcs * kRounds)) << sharedName(i);
    EXPECT_EQ(c.bytesRecv, static_cast<std::uint64_t>(kProcs * kRounds)) << sharedName(i);
    EXPECT_EQ(c.sizeLog2[sc::sizeBucket(sharedBytes(i))], static_cast<std::uint64_t>(kProcs * kRounds));
  }
  for (int p = 0; p < kProcs; ++p) {
    for (int i = 0; i < kOwn; ++i) {
      ASSERT_EQ(peers.count(ownName(p, i)), 1u) << ownName(p, i);
      const sc::NetCounters& c = peers[ownName(p, i)];
      EXPECT_EQ(c.msgsSent, static_cast<std::uint64_t>(kRounds)) << ownName(p, i);
      EXPECT_EQ(c.bytesSent, static_cast<std::uint64_t>(kRounds) * static_cast<std::uint64_t>(p + 1));
    }
  }
  const auto nics = reader->netNics();
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_STREQ(nics[0].name, "eth0");
  EXPECT_EQ(nics[0].counters.stalls, static_cast<std::uint64_t>(kProcs * kRounds));
  EXPECT_EQ(nics[0].counters.sendBusyNs, static_cast<std::uint64_t>(kProcs * kRounds * 3));

  reader.reset();
  writer.reset();
  EXPECT_TRUE(sc::Writer::remove(ns, &e)) << e.message;
}

}  // namespace
}  // namespace optiflow::net
