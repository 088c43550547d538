// NCCL's own choices in the MeasureRegion (ChoiceRecord): claimed once per (communicator, collective, size) by any
// reader of the segment, updated by every later call, read back by ncclChoices.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "raw_segment.h"

namespace optiflow::schedcache {
namespace {

constexpr auto kAllReduce = static_cast<std::uint8_t>(core::Collective::AllReduce);
constexpr auto kAllGather = static_cast<std::uint8_t>(core::Collective::AllGather);

using testsupport::RawSegment;

class SchedCacheChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ns_ = ("tc-" + std::to_string(::getpid()) + "-" + name).substr(0, 64);
    Writer::remove(ns_, nullptr);
    WriterOptions o;
    o.ns = ns_;
    o.build = "test-build";
    Error e;
    writer_ = Writer::open(o, &e);
    ASSERT_NE(writer_, nullptr) << e.message;
    reader_ = attach();
    ASSERT_NE(reader_, nullptr);
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
  std::size_t claimed() {
    RawSegment raw(segmentPath(ns_));
    EXPECT_TRUE(raw.ok());
    if (!raw.ok()) return 0;
    std::size_t n = 0;
    for (const ChoiceRecord& c : raw->measure.choices) n += c.key != 0 ? 1 : 0;
    return n;
  }

  std::string ns_;
  std::unique_ptr<Writer> writer_;
  std::unique_ptr<Reader> reader_;
};

TEST(ChoiceKey, NeverZeroAndNamesEveryField) {
  std::set<std::uint64_t> keys;
  for (std::uint64_t comm : {0ULL, 1ULL, 0xabcULL}) {
    for (std::uint8_t coll = 0; coll < 6; ++coll) {
      for (std::uint64_t size : {0ULL, 1ULL, 4096ULL, 1ULL << 30}) {
        const std::uint64_t k = choiceKey(comm, coll, size);
        EXPECT_NE(k, 0u);
        keys.insert(k);
      }
    }
  }
  EXPECT_EQ(keys.size(), 3u * 6u * 4u);
}

TEST_F(SchedCacheChoiceTest, ClaimsOnceThenUpdates) {
  EXPECT_TRUE(reader_->ncclChoices().empty());
  for (int i = 0; i < 3; ++i) reader_->recordChoice(0xabc, kAllReduce, 1 << 20, 1, 2);  // Ring, Simple
  EXPECT_EQ(claimed(), 1u);
  std::vector<NcclChoice> choices = reader_->ncclChoices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].commId, 0xabcu);
  EXPECT_EQ(choices[0].coll, core::Collective::AllReduce);
  EXPECT_EQ(choices[0].sizeBytes, 1u << 20);
  EXPECT_EQ(choices[0].algorithm, core::Algorithm::Ring);
  EXPECT_EQ(choices[0].protocol, core::Protocol::Simple);
  EXPECT_EQ(choices[0].calls, 3u);

  // NCCL changed its mind for this size: the last call's choice is the record's, in the same record.
  reader_->recordChoice(0xabc, kAllReduce, 1 << 20, 0, 0);  // Tree, LL
  EXPECT_EQ(claimed(), 1u);
  choices = reader_->ncclChoices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].algorithm, core::Algorithm::Tree);
  EXPECT_EQ(choices[0].protocol, core::Protocol::LL);
  EXPECT_EQ(choices[0].calls, 4u);
  EXPECT_EQ(reader_->measureCounters().choiceFull, 0u);
}

TEST_F(SchedCacheChoiceTest, RoundTripsEveryFieldAndSharesRecordsAcrossReaders) {
  reader_->recordChoice(0xabc, kAllReduce, 4096, 0, 0);
  reader_->recordChoice(0xabc, kAllGather, 4096, 1, 1);  // another collective
  reader_->recordChoice(0xabc, kAllReduce, 8192, 4, 2);  // another size: NVLS, Simple
  reader_->recordChoice(0xdef, kAllReduce, 4096, 6, 1);  // another communicator: PAT, LL128
  reader_->recordChoice(0x123, kAllReduce, 64, 9, 7);    // indices this build does not know
  // A second process of the node (here: a second reader) adds into the same record.
  attach()->recordChoice(0xabc, kAllReduce, 4096, 0, 0);
  EXPECT_EQ(claimed(), 5u);

  std::map<std::tuple<std::uint64_t, core::Collective, std::uint64_t>, NcclChoice> byKey;
  for (const NcclChoice& c : reader_->ncclChoices()) byKey[{c.commId, c.coll, c.sizeBytes}] = c;
  ASSERT_EQ(byKey.size(), 5u);
  const NcclChoice& a = byKey.at({0xabc, core::Collective::AllReduce, 4096});
  EXPECT_EQ(a.algorithm, core::Algorithm::Tree);
  EXPECT_EQ(a.protocol, core::Protocol::LL);
  EXPECT_EQ(a.calls, 2u);
  const NcclChoice& g = byKey.at({0xabc, core::Collective::AllGather, 4096});
  EXPECT_EQ(g.algorithm, core::Algorithm::Ring);
  EXPECT_EQ(g.protocol, core::Protocol::LL128);
  EXPECT_EQ(byKey.at({0xabc, core::Collective::AllReduce, 8192}).algorithm, core::Algorithm::Nvls);
  const NcclChoice& d = byKey.at({0xdef, core::Collective::AllReduce, 4096});
  EXPECT_EQ(d.algorithm, core::Algorithm::Pat);
  EXPECT_EQ(d.protocol, core::Protocol::LL128);
  const NcclChoice& u = byKey.at({0x123, core::Collective::AllReduce, 64});
  EXPECT_FALSE(u.algorithm.has_value());
  EXPECT_FALSE(u.protocol.has_value());
  EXPECT_EQ(u.calls, 1u);

  // A record whose collective is out of range (a damaged segment) is skipped, not misread.
  {
    RawSegment raw(segmentPath(ns_));
    ASSERT_TRUE(raw.ok());
    for (ChoiceRecord& c : raw->measure.choices) {
      if (c.key != 0 && c.commId == 0x123) c.coll = 200;
    }
  }
  EXPECT_EQ(reader_->ncclChoices().size(), 4u);
}

TEST_F(SchedCacheChoiceTest, FullTableDropsAndCountsWithoutCrashing) {
  constexpr std::uint64_t kDistinct = 2 * kChoiceRecords;
  std::unique_ptr<Reader> tuner = attach();  // a communicator's reader
  for (std::uint64_t i = 0; i < kDistinct; ++i) tuner->recordChoice(0x77, kAllReduce, 64 * (i + 1), 1, 2);
  const std::size_t records = claimed();
  EXPECT_LE(records, kChoiceRecords);
  // Probing stops after kChoiceProbes slots, so the table fills to most of its capacity, not necessarily all.
  EXPECT_GT(records, kChoiceRecords * 3 / 4);
  const std::vector<NcclChoice> choices = reader_->ncclChoices();
  EXPECT_EQ(choices.size(), records);
  // Sizes already recorded still update.
  tuner->recordChoice(0x77, kAllReduce, choices[0].sizeBytes, 0, 0);
  // The drops reach the segment's counter when the communicator's reader goes (finalize), not call by call.
  EXPECT_EQ(reader_->measureCounters().choiceFull, 0u);
  tuner.reset();
  std::uint64_t recorded = 0;
  for (const NcclChoice& c : reader_->ncclChoices()) recorded += c.calls;
  EXPECT_EQ(recorded + reader_->measureCounters().choiceFull, kDistinct + 1);
  EXPECT_EQ(reader_->measureCounters().choiceFull, kDistinct - records);
}

// Threads of several readers (as the ranks of a node's processes) record the same keys at once: one record per key,
// no call lost.
TEST_F(SchedCacheChoiceTest, ConcurrentClaimsMakeOneRecordPerKey) {
  constexpr int kThreads = 8;
  constexpr std::uint64_t kKeys = 200;
  constexpr int kRounds = 50;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int t = 0; t < kThreads; ++t) readers.push_back(attach());
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int r = 0; r < kRounds; ++r) {
        for (std::uint64_t k = 0; k < kKeys; ++k) {
          // Every thread walks the keys from another start, half of them backwards, so claims of one key race.
          const std::uint64_t step = t % 2 == 0 ? k : kKeys - 1 - k;
          const std::uint64_t key = (step + 37 * static_cast<std::uint64_t>(t)) % kKeys;
          readers[static_cast<std::size_t>(t)]->recordChoice(0x5eed + key % 3, kAllReduce, 1024 * (key + 1), 1, 2);
        }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(claimed(), kKeys);
  const std::vector<NcclChoice> choices = reader_->ncclChoices();
  ASSERT_EQ(choices.size(), kKeys);
  std::set<std::tuple<std::uint64_t, std::uint64_t>> seen;
  for (const NcclChoice& c : choices) {
    EXPECT_TRUE(seen.insert({c.commId, c.sizeBytes}).second) << "two records for one key";
    EXPECT_EQ(c.calls, static_cast<std::uint64_t>(kThreads * kRounds));
    EXPECT_EQ(c.algorithm, core::Algorithm::Ring);
    EXPECT_EQ(c.protocol, core::Protocol::Simple);
  }
  EXPECT_EQ(reader_->measureCounters().choiceFull, 0u);
}

TEST_F(SchedCacheChoiceTest, TheCountStopsSoTheHotPathStopsWriting) {
  for (std::uint64_t i = 0; i < kChoiceCallsCounted + 100; ++i) reader_->recordChoice(7, kAllGather, 4096, 1, 2);
  const std::vector<NcclChoice> choices = reader_->ncclChoices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].calls, kChoiceCallsCounted);
  EXPECT_EQ(choices[0].algorithm, core::Algorithm::Ring);
}

}  // namespace
}  // namespace optiflow::schedcache
