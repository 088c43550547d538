// Telemetry for the net transports: LocalTelemetry (process memory, weights set by tests) and CacheTelemetry (the
// node's schedule cache, falling back to process memory when a table is full).
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/net/telemetry.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::net {
namespace {

namespace sc = optiflow::schedcache;

TEST(LocalTelemetry, RecordsAreStablePerNameAndCount) {
  LocalTelemetry t;
  NetCounters* a = t.nic("eth0");
  NetCounters* b = t.nic("eth1");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  for (int i = 0; i < 100; ++i) t.nic("x" + std::to_string(i));  // records never move when others are added
  EXPECT_EQ(t.nic("eth0"), a);
  NetCounters* p = t.peer("eth0");
  EXPECT_NE(p, a);  // peers are their own table

  countSent(a, 4096);
  countSent(a, 1);
  countRecv(a, 100);
  countAdd(&a->stalls, 2);
  const NetCounters s = t.snapshotNic("eth0");
  EXPECT_EQ(s.bytesSent, 4097u);
  EXPECT_EQ(s.msgsSent, 2u);
  EXPECT_EQ(s.sizeLog2[12], 1u);
  EXPECT_EQ(s.sizeLog2[0], 1u);
  EXPECT_EQ(s.bytesRecv, 100u);
  EXPECT_EQ(s.msgsRecv, 1u);
  EXPECT_EQ(s.stalls, 2u);
  EXPECT_EQ(t.snapshotNic("eth1").bytesSent, 0u);
  EXPECT_EQ(t.snapshotPeer("eth0").bytesSent, 0u);
}

TEST(LocalTelemetry, WeightsDefaultToOneIndexedByFirstUse) {
  LocalTelemetry t;
  EXPECT_EQ(t.railIndex("eth1"), 0);
  EXPECT_EQ(t.railIndex("eth0"), 1);
  EXPECT_EQ(t.railIndex("eth1"), 0);
  EXPECT_EQ(t.railWeight(0), 1u);
  EXPECT_EQ(t.railWeight(1), 1u);
  t.setWeight("eth0", 3);
  EXPECT_EQ(t.railWeight(1), 3u);  // an index resolved earlier reads the new weight
  t.setWeight("ib0", 0);           // setWeight before any railIndex takes the next index
  EXPECT_EQ(t.railIndex("ib0"), 2);
  EXPECT_EQ(t.railWeight(2), 0u);
  EXPECT_EQ(t.railWeight(-1), 1u);
  EXPECT_EQ(t.railWeight(99), 1u);
}

TEST(LocalTelemetry, ConcurrentLookupsAndAddsAreExact) {
  LocalTelemetry t;
  constexpr int kThreads = 4;
  constexpr int kIters = 2000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&t, i] {
      for (int k = 0; k < kIters; ++k) {
        countSent(t.peer("p" + std::to_string(k % 8)), 10);
        countRecv(t.nic(i % 2 == 0 ? "even" : "odd"), 1);
        t.railIndex("r" + std::to_string(k % 3));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(t.snapshotPeer("p" + std::to_string(k)).msgsSent, static_cast<std::uint64_t>(kThreads * kIters / 8));
    EXPECT_EQ(t.snapshotPeer("p" + std::to_string(k)).bytesSent,
              static_cast<std::uint64_t>(kThreads * kIters / 8 * 10));
  }
  EXPECT_EQ(t.snapshotNic("even").bytesRecv, static_cast<std::uint64_t>(kThreads / 2 * kIters));
  std::set<int> indices;
  for (int k = 0; k < 3; ++k) indices.insert(t.railIndex("r" + std::to_string(k)));
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2}));
}

class CacheTelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = ("tt-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name())
              .substr(0, 64);
    sc::Writer::remove(ns_, nullptr);
    sc::WriterOptions o;
    o.ns = ns_;
    sc::Error e;
    writer_ = sc::Writer::open(o, &e);
    ASSERT_NE(writer_, nullptr) << e.message;
    reader_ = sc::Reader::attach(ns_, &e);
    ASSERT_NE(reader_, nullptr) << e.message;
  }
  void TearDown() override {
    reader_.reset();
    writer_.reset();
    sc::Writer::remove(ns_, nullptr);
  }
  std::string ns_;
  std::unique_ptr<sc::Writer> writer_;
  std::unique_ptr<sc::Reader> reader_;
};

TEST_F(CacheTelemetryTest, CountsLandInTheSegment) {
  CacheTelemetry t(reader_.get());
  NetCounters* nic = t.nic("eth0");
  NetCounters* peer = t.peer("10.0.0.2");
  ASSERT_NE(nic, nullptr);
  ASSERT_NE(peer, nullptr);
  countSent(nic, 1 << 20);
  countSent(peer, 1 << 20);
  countRecv(peer, 5);
  // Another process's view of the segment.
  sc::Error e;
  auto other = sc::Reader::attach(ns_, &e);
  ASSERT_NE(other, nullptr) << e.message;
  const auto nics = other->netNics();
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_STREQ(nics[0].name, "eth0");
  EXPECT_EQ(nics[0].counters.bytesSent, 1u << 20);
  EXPECT_EQ(nics[0].counters.sizeLog2[20], 1u);
  const auto peers = other->netPeers();
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].counters.msgsSent, 1u);
  EXPECT_EQ(peers[0].counters.bytesRecv, 5u);
}

TEST_F(CacheTelemetryTest, FullTableFallsBackToProcessMemory) {
  CacheTelemetry t(reader_.get());
  for (std::uint32_t i = 0; i < sc::kNetRails; ++i) {
    EXPECT_EQ(t.nic("n" + std::to_string(i)), reader_->netNic("n" + std::to_string(i)));
  }
  NetCounters* extra = t.nic("extra");
  ASSERT_NE(extra, nullptr);
  EXPECT_EQ(t.nic("extra"), extra);  // the same local record each time
  countSent(extra, 10);
  EXPECT_EQ(reader_->netNics().size(), sc::kNetRails);
  for (const auto& r : reader_->netNics()) EXPECT_EQ(r.counters.bytesSent, 0u) << r.name;
  // A name the cache refuses (too long) is counted locally too.
  EXPECT_NE(t.peer(std::string(sc::kNetNameBytes, 'p')), nullptr);
  EXPECT_NE(t.peer(""), nullptr);
}

TEST_F(CacheTelemetryTest, WeightsComeFromTheCache) {
  CacheTelemetry t(reader_.get());
  EXPECT_EQ(t.railIndex("eth0"), -1);
  EXPECT_EQ(t.railWeight(-1), 1u);
  sc::Error e;
  ASSERT_TRUE(writer_->setRailWeights({{"eth1", 2}, {"eth0", 6}}, &e)) << e.message;
  const int eth0 = t.railIndex("eth0");
  EXPECT_EQ(eth0, 1);
  EXPECT_EQ(t.railWeight(eth0), 6u);
  ASSERT_TRUE(writer_->setRailWeights({{"eth0", 1}}, &e)) << e.message;
  EXPECT_EQ(t.railWeight(eth0), 1u);  // read on every message: a change applies without reconnecting
  EXPECT_EQ(t.railWeight(t.railIndex("eth1")), 0u);
}

TEST(CacheTelemetryWithoutReader, IsLocal) {
  CacheTelemetry t(nullptr);
  NetCounters* c = t.nic("eth0");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(t.nic("eth0"), c);
  EXPECT_EQ(t.railIndex("eth0"), -1);
  EXPECT_EQ(t.railWeight(-1), 1u);
}

}  // namespace
}  // namespace optiflow::net
