// The net plugin's part of the schedule cache (NetRegion): NIC/peer records claimed by name and shared by every
// reader of the segment, rail weights written under the writer lock and read under railSeq.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "raw_segment.h"

namespace optiflow::schedcache {
namespace {

using Weights = std::vector<std::pair<std::string, std::uint32_t>>;

using testsupport::RawSegment;

std::uint64_t load(const std::uint64_t& v) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(v)).load(std::memory_order_relaxed);
}
void add(std::uint64_t* v, std::uint64_t n) {
  std::atomic_ref<std::uint64_t>(*v).fetch_add(n, std::memory_order_relaxed);
}
void storeSeq(Segment* s, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(s->net.railSeq).store(v, std::memory_order_release);
}

class SchedCacheNetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ns_ = ("tn-" + std::to_string(::getpid()) + "-" + name).substr(0, 64);
    Writer::remove(ns_, nullptr);
    WriterOptions o;
    o.ns = ns_;
    o.build = "test-build";
    Error e;
    writer_ = Writer::open(o, &e);
    ASSERT_NE(writer_, nullptr) << e.message;
    reader_ = Reader::attach(ns_, &e);
    ASSERT_NE(reader_, nullptr) << e.message;
  }
  void TearDown() override {
    reader_.reset();
    writer_.reset();
    Error e;
    EXPECT_TRUE(Writer::remove(ns_, &e)) << e.message;
  }
  std::unique_ptr<Reader> attach() {
    Error e;
    auto r = Reader::attach(ns_, &e);
    EXPECT_NE(r, nullptr) << e.message;
    return r;
  }
  bool set(const Weights& w, Error* e = nullptr) {
    Error local;
    Error& err = e != nullptr ? *e : local;
    const bool ok = writer_->setRailWeights(w, &err);
    if (e == nullptr) {
      EXPECT_TRUE(ok) << err.message;
    }
    return ok;
  }
  std::map<std::string, std::uint32_t> railMap() {
    std::map<std::string, std::uint32_t> out;
    for (const NetRailWeight& r : reader_->railWeights()) out[r.name] = r.weight;
    return out;
  }

  std::string ns_;
  std::unique_ptr<Writer> writer_;
  std::unique_ptr<Reader> reader_;
};

// ---- NIC and peer records ------------------------------------------------------------------------------------------

TEST_F(SchedCacheNetTest, ClaimThenFindSharesTheRecordAcrossReaders) {
  NetCounters* a = reader_->netNic("eth0");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reader_->netNic("eth0"), a);
  NetCounters* b = reader_->netNic("eth1");
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  // A peer of the same name is another table.
  NetCounters* p = reader_->netPeer("eth0");
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p, a);

  // A second mapping (another process's view) finds the same record by key.
  auto other = attach();
  ASSERT_NE(other, nullptr);
  NetCounters* a2 = other->netNic("eth0");
  ASSERT_NE(a2, nullptr);
  add(&a->bytesSent, 1000);
  add(&a2->bytesSent, 24);
  add(&a2->stalls, 3);
  EXPECT_EQ(load(a->bytesSent), 1024u);
  EXPECT_EQ(load(a->stalls), 3u);

  const std::vector<NetStatsRecord> nics = other->netNics();
  ASSERT_EQ(nics.size(), 2u);
  std::map<std::string, NetStatsRecord> byName;
  for (const NetStatsRecord& r : nics) byName[r.name] = r;
  ASSERT_EQ(byName.count("eth0"), 1u);
  ASSERT_EQ(byName.count("eth1"), 1u);
  EXPECT_EQ(byName["eth0"].key, netNameKey("eth0", 4));
  EXPECT_EQ(byName["eth0"].counters.bytesSent, 1024u);
  EXPECT_EQ(byName["eth0"].counters.stalls, 3u);
  EXPECT_EQ(byName["eth1"].counters.bytesSent, 0u);
  const std::int64_t now = realtimeNs();
  EXPECT_GT(byName["eth0"].lastNs, now - 60'000'000'000LL);
  EXPECT_LE(byName["eth0"].lastNs, now);
  ASSERT_EQ(other->netPeers().size(), 1u);
  EXPECT_STREQ(other->netPeers()[0].name, "eth0");
}

TEST_F(SchedCacheNetTest, RecordSitsWhereTheLayoutSays) {
  // Other processes (and other builds) find a name by probing from key % capacity: the first claim lands there.
  const std::string peer = "10.1.2.3";
  NetCounters* c = reader_->netPeer(peer);
  ASSERT_NE(c, nullptr);
  RawSegment raw(segmentPath(ns_));
  ASSERT_TRUE(raw.ok());
  const std::uint64_t key = netNameKey(peer.data(), peer.size());
  const NetStatsRecord& rec = raw->net.peers[key % kNetPeers];
  EXPECT_EQ(rec.key, key);
  EXPECT_STREQ(rec.name, peer.c_str());
  add(&c->errors, 7);
  EXPECT_EQ(load(rec.counters.errors), 7u);
}

TEST_F(SchedCacheNetTest, EmptyAndTooLongNamesAreRefused) {
  EXPECT_EQ(reader_->netNic(""), nullptr);
  EXPECT_EQ(reader_->netPeer(""), nullptr);
  const std::string longest(kNetNameBytes - 1, 'x');
  const std::string tooLong(kNetNameBytes, 'x');
  EXPECT_NE(reader_->netPeer(longest), nullptr);
  EXPECT_EQ(reader_->netPeer(tooLong), nullptr);
  ASSERT_EQ(reader_->netPeers().size(), 1u);
  EXPECT_EQ(std::string(reader_->netPeers()[0].name), longest);
  // An IPv6 peer text fits.
  EXPECT_NE(reader_->netPeer("fe80::1234:5678:9abc:def0%eth0"), nullptr);
}

TEST_F(SchedCacheNetTest, FullTablesReturnNullAndKeepTheirRecords) {
  std::set<NetCounters*> seen;
  for (std::uint32_t i = 0; i < kNetRails; ++i) {
    NetCounters* c = reader_->netNic("nic" + std::to_string(i));
    ASSERT_NE(c, nullptr) << i;
    EXPECT_TRUE(seen.insert(c).second) << "record handed out twice: nic" << i;
  }
  EXPECT_EQ(reader_->netNic("one-too-many"), nullptr);
  EXPECT_EQ(reader_->netNic("nic3"), reader_->netNic("nic3"));
  EXPECT_TRUE(seen.count(reader_->netNic("nic15")) == 1);
  EXPECT_EQ(reader_->netNics().size(), kNetRails);

  for (std::uint32_t i = 0; i < kNetPeers; ++i) ASSERT_NE(reader_->netPeer("p" + std::to_string(i)), nullptr) << i;
  EXPECT_EQ(reader_->netPeer("p-extra"), nullptr);
  EXPECT_NE(reader_->netPeer("p255"), nullptr);
  EXPECT_EQ(reader_->netPeers().size(), kNetPeers);
}

TEST_F(SchedCacheNetTest, ConcurrentClaimsFromThreadsMeetAtOneRecordPerName) {
  constexpr int kThreads = 6;
  constexpr int kNames = 40;
  constexpr int kRounds = 50;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto r = Reader::attach(ns_, nullptr);  // one mapping per thread, like one per process
      if (r == nullptr) return;
      while (!go.load()) std::this_thread::yield();
      for (int round = 0; round < kRounds; ++round) {
        for (int n = 0; n < kNames; ++n) {
          const int name = (n * 7 + t * 13) % kNames;  // every thread in its own order
          NetCounters* c = r->netPeer("peer-" + std::to_string(name));
          if (c == nullptr) continue;
          add(&c->bytesSent, static_cast<std::uint64_t>(name + 1));
          add(&c->msgsSent, 1);
        }
      }
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  const std::vector<NetStatsRecord> peers = reader_->netPeers();
  ASSERT_EQ(peers.size(), static_cast<std::size_t>(kNames));
  std::set<std::string> names;
  for (const NetStatsRecord& r : peers) {
    ASSERT_TRUE(names.insert(r.name).second) << "two records for " << r.name;
    const int name = std::stoi(std::string(r.name).substr(5));
    EXPECT_EQ(r.counters.msgsSent, static_cast<std::uint64_t>(kThreads * kRounds)) << r.name;
    EXPECT_EQ(r.counters.bytesSent, static_cast<std::uint64_t>(kThreads * kRounds * (name + 1))) << r.name;
  }
}

// ---- rail weights --------------------------------------------------------------------------------------------------

TEST_F(SchedCacheNetTest, NoWeightsMeansNoRecordAndWeightOne) {
  EXPECT_TRUE(reader_->railWeights().empty());
  EXPECT_EQ(reader_->railIndex("eth0"), -1);
  EXPECT_EQ(reader_->railIndex(""), -1);
  EXPECT_EQ(reader_->railWeight(-1), 1u);
  EXPECT_EQ(reader_->railWeight(static_cast<int>(kNetRails)), 1u);
  EXPECT_EQ(reader_->railWeight(1000), 1u);
}

TEST_F(SchedCacheNetTest, SetResetAndIndicesPersist) {
  set({{"eth0", 3}, {"eth1", 1}});
  EXPECT_EQ(railMap(), (std::map<std::string, std::uint32_t>{{"eth0", 3}, {"eth1", 1}}));
  const int eth0 = reader_->railIndex("eth0");
  const int eth1 = reader_->railIndex("eth1");
  EXPECT_EQ(eth0, 0);
  EXPECT_EQ(eth1, 1);
  EXPECT_EQ(reader_->railIndex("eth2"), -1);
  EXPECT_EQ(reader_->railIndex("eth"), -1);  // a prefix is not a match
  EXPECT_EQ(reader_->railWeight(eth0), 3u);
  EXPECT_EQ(reader_->railWeight(eth1), 1u);

  // eth0 not listed: weight 0 but the same record, so a plugin holding its index reads the new weight.
  set({{"eth2", 2}, {"eth1", 5}});
  EXPECT_EQ(reader_->railIndex("eth0"), eth0);
  EXPECT_EQ(reader_->railIndex("eth1"), eth1);
  EXPECT_EQ(reader_->railIndex("eth2"), 2);
  EXPECT_EQ(reader_->railWeight(eth0), 0u);
  EXPECT_EQ(reader_->railWeight(eth1), 5u);
  EXPECT_EQ(reader_->railWeight(2), 2u);
  EXPECT_EQ(railMap(), (std::map<std::string, std::uint32_t>{{"eth0", 0}, {"eth1", 5}, {"eth2", 2}}));

  // Persisted in the segment: a new reader and a new writer see them.
  auto other = attach();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->railIndex("eth2"), 2);
  EXPECT_EQ(other->railWeight(2), 2u);
  WriterOptions o;
  o.ns = ns_;
  auto w2 = Writer::open(o, nullptr);
  ASSERT_NE(w2, nullptr);
  Error e;
  ASSERT_TRUE(w2->setRailWeights({{"eth0", 1000000}}, &e)) << e.message;
  EXPECT_EQ(other->railWeight(eth0), 1000000u);
  EXPECT_EQ(other->railWeight(eth1), 0u);
  EXPECT_EQ(reader_->railWeights().size(), 3u);

  RawSegment raw(segmentPath(ns_));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->net.railCount, 3u);
  EXPECT_EQ(raw->net.railSeq % 2, 0u);
  EXPECT_EQ(raw->net.railSeq, 6u);  // three updates, two steps each
}

TEST_F(SchedCacheNetTest, BadEntriesAreRefusedNamingThemAndChangeNothing) {
  set({{"eth0", 4}});
  struct Case {
    Weights weights;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {{{"eth1", 1}, {"", 2}}, "rail weight 2"},
      {{{"eth 1", 1}}, "'eth 1'"},
      {{{"eth1/x", 1}}, "'eth1/x'"},
      {{{"a234567890123456", 1}}, "'a234567890123456'"},  // 16 bytes: IFNAMSIZ is 16 with the NUL
      {{{"eth1", 1}, {"eth1", 2}}, "given twice"},
      {{{"eth1", 1000001}}, "1000001"},
  };
  for (const Case& c : cases) {
    Error e;
    EXPECT_FALSE(set(c.weights, &e));
    EXPECT_EQ(e.status, Status::kInvalidPlan) << e.message;
    EXPECT_NE(e.message.find(c.mentions), std::string::npos) << e.message;
  }
  EXPECT_EQ(railMap(), (std::map<std::string, std::uint32_t>{{"eth0", 4}}));
  set({{"a23456789012345", 1}, {"mlx5_0:1", 2}, {"bond0.100-x", 3}});  // 15 bytes and the other allowed characters
  EXPECT_EQ(reader_->railIndex("mlx5_0:1"), 2);
}

TEST_F(SchedCacheNetTest, FullRailTableIsBusyAndNamesTheInterface) {
  Weights all;
  for (std::uint32_t i = 0; i < kNetRails; ++i) all.emplace_back("eth" + std::to_string(i), i);
  set(all);
  Error e;
  EXPECT_FALSE(set({{"eth3", 1}, {"ib0", 1}}, &e));
  EXPECT_EQ(e.status, Status::kBusy);
  EXPECT_NE(e.message.find("'ib0'"), std::string::npos) << e.message;
  EXPECT_EQ(reader_->railWeight(reader_->railIndex("eth3")), 3u);  // nothing changed
  set({{"eth15", 9}});                                             // existing names still work
  EXPECT_EQ(reader_->railWeight(15), 9u);
  EXPECT_EQ(reader_->railWeight(3), 0u);
}

TEST_F(SchedCacheNetTest, OddSequenceIsBoundedAndAWriterThatDiedIsRecovered) {
  set({{"eth0", 2}});
  RawSegment raw(segmentPath(ns_));
  ASSERT_TRUE(raw.ok());
  storeSeq(raw.operator->(), raw->net.railSeq + 1);  // a writer died mid-update
  // The reader gives up after its budget (10 ms) instead of spinning: a limit 500 times that only fails on a hang.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(reader_->railIndex("eth0"), -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(reader_->railWeight(-1), 1u);  // what the plugin then uses
  // The next writer takes over from the odd counter.
  set({{"eth0", 5}});
  EXPECT_EQ(raw->net.railSeq % 2, 0u);
  EXPECT_EQ(reader_->railIndex("eth0"), 0);
  EXPECT_EQ(reader_->railWeight(0), 5u);
}

// The reader's budget for an odd railSeq (kRailReadBudget in schedcache/src/reader.cc).
constexpr auto kReaderBudget = std::chrono::milliseconds(10);

TEST_F(SchedCacheNetTest, ReaderRetriesWhileAWriterIsMidUpdate) {
  RawSegment raw(segmentPath(ns_));
  ASSERT_TRUE(raw.ok());
  Segment* s = raw.operator->();
  // Play a writer: odd, then the name appears byte by byte, then even. The reader started during the odd phase
  // must come back with the finished record, not -1 and not a torn read. -1 is its answer when the odd phase
  // outlasted its budget, which a descheduled test thread can make happen on a loaded machine: such a round is
  // played again. Anything else is wrong at once.
  int finished = 0;
  for (std::uint64_t round = 0; round < 20 && finished == 0; ++round) {
    SCOPED_TRACE(round);
    storeSeq(s, 2 * round + 1);
    std::atomic_ref<std::uint32_t>(s->net.railCount).store(0);
    for (char& c : s->net.rails[0].name) std::atomic_ref<char>(c).store('\0');
    std::atomic_ref<std::uint32_t>(s->net.rails[0].weight).store(0);
    std::atomic<bool> started{false};
    int index = -2;
    const auto oddFrom = std::chrono::steady_clock::now();  // before the reader's budget can start
    std::thread readerThread([&] {
      started = true;
      index = reader_->railIndex("eth7");
    });
    while (!started.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 5; ++i) std::atomic_ref<char>(s->net.rails[0].name[i]).store("eth7"[i]);
    std::atomic_ref<std::uint32_t>(s->net.rails[0].weight).store(4);
    std::atomic_ref<std::uint32_t>(s->net.railCount).store(1);
    storeSeq(s, 2 * round + 2);
    const auto odd = std::chrono::steady_clock::now() - oddFrom;
    readerThread.join();
    if (index == 0) {
      ++finished;
      EXPECT_EQ(reader_->railWeight(0), 4u);
    } else if (index == -1) {
      ASSERT_GE(odd, kReaderBudget) << "the reader gave up while the writer was mid-update for less than its budget";
    } else {
      ADD_FAILURE() << "railIndex answered " << index;
      break;
    }
  }
  EXPECT_EQ(finished, 1) << "in 20 rounds the writer never finished within the reader's budget";
}

TEST_F(SchedCacheNetTest, ConcurrentReadersNeverSeeATornName) {
  // "rail" arrives last; 15 names it is a prefix of arrive first, each written while readers look for "rail".
  // A reader that compared a half-written "railX" would answer that record's index.
  constexpr int kReaders = 2;
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0};
  std::atomic<long> reads{0};
  std::atomic<int> reading{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&] {
      auto r = Reader::attach(ns_, nullptr);
      if (r == nullptr) return;
      bool first = true;
      while (!done.load()) {
        const int i = r->railIndex("rail");
        if (i != -1 && i != static_cast<int>(kNetRails) - 1) ++wrong;
        ++reads;
        if (std::exchange(first, false)) ++reading;
      }
    });
  }
  // The writes start once every reader reads (thread start and attach take a while under a sanitizer), and the
  // readers stop only after they read the last one a few times: polled, with a deadline only a hang reaches.
  auto waitUntil = [](const auto& holds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!holds() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return holds();
  };
  EXPECT_TRUE(waitUntil([&] { return reading.load() == kReaders; })) << "the readers never started";
  Weights w;
  for (std::uint32_t i = 0; i + 1 < kNetRails; ++i) {
    w.emplace_back("rail" + std::string(1, static_cast<char>('A' + i)), 1);
    set(w);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  w.emplace_back("rail", 7);
  set(w);
  const long readsAtTheEnd = reads.load();
  EXPECT_TRUE(waitUntil([&] { return reads.load() >= readsAtTheEnd + 10 * kReaders; }));
  done = true;
  for (auto& th : readers) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(reader_->railIndex("rail"), static_cast<int>(kNetRails) - 1);
  EXPECT_EQ(reader_->railWeight(reader_->railIndex("rail")), 7u);
}

}  // namespace
}  // namespace optiflow::schedcache
