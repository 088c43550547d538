// The per-node schedule cache (schedcache/): plan hashing and validation, publishing and loading through a real
// /dev/shm segment, the attach checks against foreign or damaged segments, communicator pins and activity counters.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/crc.hpp>
#include <boost/interprocess/sync/file_lock.hpp>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "raw_segment.h"

namespace optiflow::schedcache {
namespace {

using core::Algorithm;
using core::Collective;
using core::Protocol;

constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();

// NCCL's indices, as the segment stores them and CommPlan::find takes them.
std::uint32_t func(Collective c) { return static_cast<std::uint32_t>(*core::ncclFuncIndex(c)); }
std::int8_t stored(std::optional<Algorithm> a) { return static_cast<std::int8_t>(a ? core::ncclIndex(*a) : -1); }
std::int8_t stored(std::optional<Protocol> p) { return static_cast<std::int8_t>(p ? core::ncclIndex(*p) : -1); }

PlanItem item(Collective coll, std::uint32_t nRanks, std::uint32_t nNodes, std::uint64_t minBytes,
              std::uint64_t maxBytes, std::optional<Algorithm> algorithm, std::optional<Protocol> protocol,
              std::int32_t nChannels = 0) {
  PlanItem it;
  it.coll = coll;
  it.nRanks = nRanks;
  it.nNodes = nNodes;
  it.minBytes = minBytes;
  it.maxBytes = maxBytes;
  it.algorithm = algorithm;
  it.protocol = protocol;
  it.nChannels = nChannels;
  return it;
}

// Contiguous ranges for two shapes and every collective; `variant` changes the decisions (and so the hash).
Plan makePlan(int variant, int rangesPerShape = 8) {
  Plan plan;
  plan.source = "/plans/v" + std::to_string(variant);
  const std::uint32_t shapes[][2] = {{8, 1}, {16, 2}};
  for (std::uint32_t c = 0; c < kNumCollectives; ++c) {
    for (const auto& shape : shapes) {
      std::uint64_t lo = 0;
      for (int i = 0; i < rangesPerShape; ++i) {
        const std::uint64_t hi = i + 1 == rangesPerShape ? kMax64 : (std::uint64_t{1024} << i) - 1;
        PlanItem it = item(*core::collectiveFromNcclFunc(static_cast<int>(c)), shape[0], shape[1], lo, hi,
                           core::algorithmFromNccl((i + variant) % core::kNumAlgorithms),
                           core::protocolFromNccl((i + variant) % core::kNumProtocols), (variant + i) % 5);
        it.chunkBytes = static_cast<std::uint64_t>(variant) * 4096;
        it.nativeUs = static_cast<float>(i) + 0.5f;
        it.scheduleId = i % 3 == 0 ? 0 : 0x1000u + static_cast<std::uint64_t>(i);
        if (i % 2 == 1) {
          it.jsonPath = plan.source + "/sched-" + std::to_string(i) + ".json";
          it.xmlPath = plan.source + "/sched-" + std::to_string(i) + ".xml";
        }
        plan.items.push_back(it);
        lo = hi + 1;
      }
    }
  }
  return plan;
}

std::vector<Decision> expectedDecisions(const Plan& plan, std::uint32_t coll, std::uint32_t nRanks,
                                        std::uint32_t nNodes) {
  std::vector<Decision> out;
  for (const PlanItem& it : plan.items) {
    if (func(it.coll) != coll || it.nRanks != nRanks || it.nNodes != nNodes) continue;
    Decision d;
    d.minBytes = it.minBytes;
    d.maxBytes = it.maxBytes;
    d.chunkBytes = it.chunkBytes;
    d.algorithm = stored(it.algorithm);
    d.protocol = stored(it.protocol);
    d.nChannels = it.nChannels;
    out.push_back(d);
  }
  std::sort(out.begin(), out.end(), [](const Decision& a, const Decision& b) { return a.minBytes < b.minBytes; });
  return out;
}

bool sameDecisions(const std::vector<Decision>& a, const std::vector<Decision>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const Decision& x, const Decision& y) {
           return x.minBytes == y.minBytes && x.maxBytes == y.maxBytes && x.chunkBytes == y.chunkBytes &&
                  x.algorithm == y.algorithm && x.protocol == y.protocol && x.nChannels == y.nChannels;
         });
}

// The slot checksum as layout.h documents it, computed independently of the library.
std::uint32_t documentedSlotChecksum(const PlanSlot& slot) {
  boost::crc_32_type crc;
  const auto* h = reinterpret_cast<const char*>(&slot.header);
  crc.process_bytes(h + offsetof(PlanSlotHeader, contentHash),
                    offsetof(PlanSlotHeader, checksum) - offsetof(PlanSlotHeader, contentHash));
  crc.process_bytes(&slot.header.trialCount, sizeof(slot.header.trialCount));
  crc.process_bytes(slot.header.source, sizeof(slot.header.source));
  crc.process_bytes(slot.entries, slot.header.entryCount * sizeof(PlanEntry));
  crc.process_bytes(slot.strings, slot.header.stringBytes);
  crc.process_bytes(slot.trials, slot.header.trialCount * sizeof(TrialEntry));
  return crc.checksum();
}

using testsupport::RawSegment;

class SchedCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ns_ = ("t-" + std::to_string(::getpid()) + "-" + name).substr(0, 64);
    Writer::remove(ns_, nullptr);
  }
  void TearDown() override {
    Error e;
    EXPECT_TRUE(Writer::remove(ns_, &e)) << e.message;
  }

  std::unique_ptr<Writer> openWriter(WriterOptions options = {}) {
    options.ns = ns_;
    options.build = "test-build";
    Error e;
    auto w = Writer::open(options, &e);
    EXPECT_NE(w, nullptr) << toString(e.status) << ": " << e.message;
    return w;
  }
  std::unique_ptr<Reader> attach() {
    Error e;
    auto r = Reader::attach(ns_, &e);
    EXPECT_NE(r, nullptr) << toString(e.status) << ": " << e.message;
    return r;
  }
  Status attachStatus(std::string* message = nullptr) {
    Error e;
    auto r = Reader::attach(ns_, &e);
    EXPECT_EQ(r == nullptr, e.status != Status::kOk);
    if (message != nullptr) *message = e.message;
    return e.status;
  }
  PublishResult publish(Writer& w, const Plan& plan) {
    Error e;
    auto r = w.publish(plan, &e);
    EXPECT_TRUE(r.has_value()) << toString(e.status) << ": " << e.message;
    return r.value_or(PublishResult{});
  }
  std::string path() const { return segmentPath(ns_); }

  std::string ns_;
};

// --- plan hashing, names and validation --------------------------------------------------------------------------

TEST(PlanHash, MatchesCrc64XzOfTheDocumentedFields) {
  Plan plan;
  plan.items.push_back(item(Collective::AllReduce, 8, 1, 0, 1023, Algorithm::Ring, Protocol::Simple, 4));
  PlanItem second = item(Collective::AllReduce, 8, 1, 1024, 1 << 20, Algorithm::Tree, Protocol::LL128);
  second.chunkBytes = 524288;
  second.scheduleId = 0xabcdef;
  plan.items.push_back(second);
  // Computed independently (Python) over the little-endian fields of both items.
  EXPECT_EQ(formatHash(contentHash(plan)), "f70d3772920a62c1");
}

TEST(PlanHash, IgnoresPathsTimesSourceAndOrder) {
  const Plan a = makePlan(1);
  Plan b = a;
  b.source = "/elsewhere";
  for (PlanItem& it : b.items) {
    it.jsonPath = it.jsonPath.empty() ? "/x.json" : "";
    it.xmlPath = "/other/" + it.xmlPath;
    it.nativeUs += 3;
    it.bestUs = 7;
    it.boundUs = 1;
    it.ncclUs = 2;
  }
  std::reverse(b.items.begin(), b.items.end());
  std::shuffle(b.items.begin(), b.items.end(), std::mt19937(42));
  EXPECT_EQ(contentHash(a), contentHash(b));
  EXPECT_EQ(contentHash(a), contentHash(makePlan(1)));  // stable across calls

  for (int field = 0; field < 6; ++field) {
    Plan c = a;
    PlanItem& it = c.items[3];
    switch (field) {
      case 0:
        it.algorithm = it.algorithm == Algorithm::Ring ? Algorithm::Tree : Algorithm::Ring;
        break;
      case 1:
        it.protocol = it.protocol == Protocol::LL ? Protocol::Simple : Protocol::LL;
        break;
      case 2:
        it.nChannels += 1;
        break;
      case 3:
        it.chunkBytes += 1;
        break;
      case 4:
        it.scheduleId += 1;
        break;
      case 5:
        it.maxBytes -= 1;
        break;
    }
    EXPECT_NE(contentHash(a), contentHash(c)) << "field " << field;
  }
}

TEST(PlanHash, NeverReserved) {
  EXPECT_GT(contentHash(Plan{}), kPinNoPlan);
  EXPECT_GT(contentHash(makePlan(0)), kPinNoPlan);
}

TEST(PlanHash, FormatAndParse) {
  EXPECT_EQ(formatHash(0x1a2b), "0000000000001a2b");
  EXPECT_EQ(formatHash(kMax64), "ffffffffffffffff");
  EXPECT_EQ(parseHash("0000000000001a2b"), 0x1a2bu);
  EXPECT_EQ(parseHash("DEADBEEFdeadbeef"), 0xdeadbeefdeadbeefULL);
  const std::uint64_t h = contentHash(makePlan(2));
  EXPECT_EQ(parseHash(formatHash(h)), h);
  for (const char* bad : {"", "1a2b", "0000000000001a2", "00000000000001a2b", "0x00000000001a2b", "000000000000001g",
                          " 000000000001a2b", "000000000001a2b "}) {
    EXPECT_FALSE(parseHash(bad).has_value()) << "'" << bad << "'";
  }
}

// The cache's names are the vocabulary's: what plan.json, `optiflow cache show` and the logs have always written.
TEST(PlanNames, AreTheCacheSpellingsInNcclOrder) {
  const char* collectives[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
  for (std::uint32_t c = 0; c < kNumCollectives; ++c) {
    const std::optional<Collective> coll = core::collectiveFromNcclFunc(static_cast<int>(c));
    ASSERT_TRUE(coll.has_value()) << c;
    EXPECT_EQ(core::toString(*coll), collectives[c]);
    EXPECT_EQ(core::parseCollective(collectives[c]), coll);
  }
  EXPECT_FALSE(core::collectiveFromNcclFunc(static_cast<int>(kNumCollectives)).has_value());
  const char* algorithms[] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
  ASSERT_EQ(core::kNumAlgorithms, 7);
  for (int a = 0; a < core::kNumAlgorithms; ++a) {
    const std::optional<Algorithm> alg = core::algorithmFromNccl(a);
    ASSERT_TRUE(alg.has_value()) << a;
    EXPECT_EQ(core::toString(*alg), algorithms[a]);
    EXPECT_EQ(core::parseAlgorithm(algorithms[a]), alg);
  }
  const char* protocols[] = {"LL", "LL128", "Simple"};
  ASSERT_EQ(core::kNumProtocols, 3);
  for (int p = 0; p < core::kNumProtocols; ++p) {
    const std::optional<Protocol> proto = core::protocolFromNccl(p);
    ASSERT_TRUE(proto.has_value()) << p;
    EXPECT_EQ(core::toString(*proto), protocols[p]);
    EXPECT_EQ(core::parseProtocol(protocols[p]), proto);
  }
  EXPECT_EQ(core::parseCollective("AllReduce"), Collective::AllReduce);
  EXPECT_EQ(core::parseAlgorithm("nvlstree"), Algorithm::NvlsTree);
  EXPECT_EQ(core::parseProtocol("simple"), Protocol::Simple);
  EXPECT_FALSE(core::parseAlgorithm("").has_value());
  EXPECT_FALSE(core::parseProtocol("LL64").has_value());
}

TEST(PlanValidate, AcceptsGoodPlans) {
  EXPECT_EQ(validatePlan(Plan{}), "");
  EXPECT_EQ(validatePlan(makePlan(3)), "");
  Plan p;
  // Adjacent ranges, and the same range for other shapes and collectives, do not overlap.
  p.items.push_back(item(Collective::AllReduce, 8, 1, 0, 99, Algorithm::Ring, Protocol::LL));
  p.items.push_back(item(Collective::AllReduce, 8, 1, 100, 199, std::nullopt, std::nullopt));
  p.items.push_back(item(Collective::AllReduce, 8, 2, 0, 99, Algorithm::Tree, std::nullopt));
  p.items.push_back(item(Collective::AllGather, 8, 1, 0, 99, Algorithm::Ring, Protocol::Simple));
  EXPECT_EQ(validatePlan(p), "");
}

TEST(PlanValidate, NamesTheItem) {
  auto one = [](PlanItem it) {
    Plan p;
    p.items.push_back(item(Collective::AllReduce, 8, 1, 0, 99, Algorithm::Ring, Protocol::LL));
    p.items.push_back(it);
    return validatePlan(p);
  };
  const PlanItem good = item(Collective::AllReduce, 32, 4, 1048576, 2097151, Algorithm::Ring, Protocol::LL);
  const std::string name = "item 1 (allreduce, 32 ranks, 4 nodes, 1048576-2097151 bytes)";

  PlanItem it = good;
  it.minBytes = 3000000;
  EXPECT_EQ(one(it).rfind("item 1 (allreduce, 32 ranks, 4 nodes, 3000000-2097151 bytes): minBytes", 0), 0u) << one(it);
  it = good;
  it.algorithm = std::nullopt;
  EXPECT_EQ(one(it).rfind(name + ": protocol LL without an algorithm", 0), 0u) << one(it);
  it.protocol = std::nullopt;
  it.nChannels = 4;
  EXPECT_EQ(one(it).rfind(name + ": a channel count or chunk size without an algorithm", 0), 0u) << one(it);
  it = good;
  it.nChannels = -1;
  EXPECT_EQ(one(it).rfind(name + ": negative channel", 0), 0u) << one(it);
  it = good;
  it.nRanks = 0;
  EXPECT_NE(one(it).find("zero ranks"), std::string::npos) << one(it);
  it = good;
  it.nNodes = 0;
  EXPECT_NE(one(it).find("zero nodes"), std::string::npos) << one(it);
  it = good;
  it.coll = static_cast<Collective>(9);
  EXPECT_EQ(one(it).rfind("item 1 (collective 9, 32 ranks", 0), 0u) << one(it);
  EXPECT_NE(one(it).find("not a collective NCCL's tuner decides"), std::string::npos) << one(it);
  it.coll = Collective::AllToAll;  // a collective, but NCCL's tuner has no say in it
  EXPECT_EQ(one(it).rfind("item 1 (alltoall, 32 ranks, 4 nodes, 1048576-2097151 bytes): not a collective NCCL's tuner "
                          "decides",
                          0),
            0u)
      << one(it);
  it = good;
  it.algorithm = static_cast<Algorithm>(7);
  EXPECT_EQ(one(it).rfind(name + ": algorithm 7 out of range", 0), 0u) << one(it);
  it.algorithm = static_cast<Algorithm>(255);  // -1 as the segment's int8: must not read as "no decision"
  EXPECT_EQ(one(it).rfind(name + ": algorithm 255 out of range", 0), 0u) << one(it);
  it = good;
  it.protocol = static_cast<Protocol>(3);
  EXPECT_EQ(one(it).rfind(name + ": protocol 3 out of range", 0), 0u) << one(it);

  Plan overlap;
  overlap.items.push_back(item(Collective::AllReduce, 32, 4, 0, 1048575, Algorithm::Ring, Protocol::LL));
  overlap.items.push_back(item(Collective::AllReduce, 32, 4, 2097152, kMax64, Algorithm::Ring, Protocol::LL));
  overlap.items.push_back(good);
  overlap.items.push_back(item(Collective::AllReduce, 32, 4, 1048576, 1048576, Algorithm::Tree, Protocol::LL));
  EXPECT_EQ(validatePlan(overlap),
            "item 3 (allreduce, 32 ranks, 4 nodes, 1048576-1048576 bytes): overlaps item 2 (allreduce, 32 ranks, 4 "
            "nodes, 1048576-2097151 bytes)");
}

TEST(PlanValidate, SlotCapacity) {
  Plan big;
  for (std::uint64_t i = 0; i <= kMaxEntries; ++i) {
    big.items.push_back(item(Collective::AllReduce, 8, 1, i, i, Algorithm::Ring, Protocol::LL));
  }
  EXPECT_NE(validatePlan(big).find("16385 items"), std::string::npos) << validatePlan(big);
  big.items.pop_back();
  EXPECT_EQ(validatePlan(big), "");

  Plan paths;
  for (int i = 0; i < 3; ++i) {
    PlanItem it = item(Collective::AllReduce, 8, 1, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i),
                       Algorithm::Ring, Protocol::LL);
    it.jsonPath = std::string(400000, static_cast<char>('a' + i));
    paths.items.push_back(it);
  }
  EXPECT_NE(validatePlan(paths).find("1200003 bytes"), std::string::npos) << validatePlan(paths);
  // The same path stored once.
  for (PlanItem& it : paths.items) it.jsonPath = std::string(400000, 'a');
  EXPECT_EQ(validatePlan(paths), "");
  paths.items[1].xmlPath = std::string("/a\0b", 4);
  EXPECT_NE(validatePlan(paths).find("NUL"), std::string::npos);
}

TEST(Names, Namespace) {
  EXPECT_TRUE(validNamespace("default"));
  EXPECT_TRUE(validNamespace("job-1.a_B"));
  EXPECT_TRUE(validNamespace(std::string(64, 'x')));
  EXPECT_FALSE(validNamespace(""));
  EXPECT_FALSE(validNamespace(std::string(65, 'x')));
  EXPECT_FALSE(validNamespace("a/b"));
  EXPECT_FALSE(validNamespace("a b"));
  EXPECT_EQ(segmentName("x"), "optiflow-x");
  EXPECT_EQ(segmentPath("x"), "/dev/shm/optiflow-x");
  EXPECT_EQ(lockPath("x"), "/dev/shm/optiflow-x.lock");
  Error e;
  EXPECT_EQ(Reader::attach("../etc", &e), nullptr);
  EXPECT_EQ(e.status, Status::kBadNamespace);
  WriterOptions o;
  o.ns = "a/b";
  EXPECT_EQ(Writer::open(o, &e), nullptr);
  EXPECT_EQ(e.status, Status::kBadNamespace);
  EXPECT_EQ(toString(Status::kBadChecksum), "bad checksum");
}

// --- publish and load ----------------------------------------------------------------------------------------------

TEST_F(SchedCacheTest, PublishAttachLoadRoundTrip) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const Plan plan = makePlan(1);
  const PublishResult pub = publish(*w, plan);
  EXPECT_EQ(pub.hash, contentHash(plan));
  EXPECT_EQ(pub.generation, 1u);
  EXPECT_FALSE(pub.unchanged);

  auto r = attach();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ns(), ns_);
  EXPECT_EQ(r->generation(), 1u);
  PlanInfo info;
  ASSERT_EQ(r->current(&info), Status::kOk);
  EXPECT_EQ(info.contentHash, pub.hash);
  EXPECT_EQ(info.slot, pub.slot);
  EXPECT_EQ(info.entryCount, plan.items.size());
  EXPECT_EQ(info.source, "/plans/v1");
  EXPECT_TRUE(info.current);
  EXPECT_GT(info.publishedNs, 0);

  for (std::uint32_t shape : {0u, 1u}) {
    const std::uint32_t nRanks = shape == 0 ? 8 : 16;
    const std::uint32_t nNodes = shape == 0 ? 1 : 2;
    CommPlan cp;
    std::string detail;
    ASSERT_EQ(r->loadComm(0, nRanks, nNodes, &cp, &detail), Status::kOk) << detail;
    EXPECT_EQ(cp.planHash, pub.hash);
    EXPECT_EQ(cp.entryCount(), plan.items.size() / 2);
    EXPECT_GE(cp.memoryBytes(), cp.entryCount() * sizeof(Decision));
    for (std::uint32_t c = 0; c < kNumCollectives; ++c) {
      EXPECT_TRUE(sameDecisions(cp.byCollective[c], expectedDecisions(plan, c, nRanks, nNodes))) << c;
    }
  }
  CommPlan byHash;
  ASSERT_EQ(r->loadComm(pub.hash, 8, 1, &byHash, nullptr), Status::kOk);
  EXPECT_EQ(byHash.entryCount(), plan.items.size() / 2);

  // A shape the plan does not cover: an empty plan that still names the hash.
  CommPlan none;
  ASSERT_EQ(r->loadComm(0, 4, 1, &none, nullptr), Status::kOk);
  EXPECT_EQ(none.planHash, pub.hash);
  EXPECT_EQ(none.entryCount(), 0u);
  EXPECT_EQ(none.find(4, 100), nullptr);

  Plan back;
  PlanInfo backInfo;
  ASSERT_EQ(r->loadPlan(0, &back, &backInfo, nullptr), Status::kOk);
  EXPECT_EQ(back.source, plan.source);
  EXPECT_EQ(contentHash(back), pub.hash);
  ASSERT_EQ(back.items.size(), plan.items.size());
  std::size_t withPaths = 0;
  for (const PlanItem& it : back.items) {
    auto match = std::find_if(plan.items.begin(), plan.items.end(), [&](const PlanItem& o) {
      return o.coll == it.coll && o.nRanks == it.nRanks && o.nNodes == it.nNodes && o.minBytes == it.minBytes;
    });
    ASSERT_NE(match, plan.items.end());
    EXPECT_EQ(it.jsonPath, match->jsonPath);
    EXPECT_EQ(it.xmlPath, match->xmlPath);
    EXPECT_EQ(it.nativeUs, match->nativeUs);
    EXPECT_EQ(it.scheduleId, match->scheduleId);
    withPaths += it.jsonPath.empty() ? 0 : 1;
  }
  EXPECT_GT(withPaths, 0u);

  std::string detail;
  EXPECT_EQ(r->loadComm(0x1234567890abcdefULL, 8, 1, &byHash, &detail), Status::kNotFound);
  EXPECT_NE(detail.find("1234567890abcdef"), std::string::npos) << detail;

  std::vector<std::string> report;
  EXPECT_TRUE(r->check(&report));
  ASSERT_EQ(report.size(), kPlanSlots);
  EXPECT_EQ(report[pub.slot], "slot " + std::to_string(pub.slot) + ": plan " + formatHash(pub.hash) +
                                  ", generation 1, " + std::to_string(plan.items.size()) +
                                  " entries, checksum ok (current)");
  EXPECT_EQ(report[(pub.slot + 1) % kPlanSlots], "slot " + std::to_string((pub.slot + 1) % kPlanSlots) + ": empty");
}

// A rank adopting its communicator's plan by hash while the writer republishes that same plan (which rewrites the
// slot's header in place, leaving the slot odd for that moment) must wait for the writer, not report the plan
// missing: that failed the communicator's init (ConsistencyTest found it under load).
TEST_F(SchedCacheTest, LoadByHashWaitsForASlotBeingRewritten) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const PublishResult pub = publish(*w, makePlan(1));
  auto r = attach();
  ASSERT_NE(r, nullptr);
  RawSegment raw(path());
  ASSERT_TRUE(raw.ok());
  std::atomic_ref<std::uint64_t> seq(raw->slots[pub.slot].header.seq);
  const std::uint64_t even = seq.load();
  ASSERT_EQ(even % 2, 0u);
  seq.store(even + 1);  // the writer is in the middle of the slot
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    seq.store(even + 2);  // and done: the same plan, a new sequence
  });
  CommPlan cp;
  std::string detail;
  EXPECT_EQ(r->loadComm(pub.hash, 8, 1, &cp, &detail), Status::kOk) << detail;
  EXPECT_EQ(cp.planHash, pub.hash);
  writer.join();
  // A slot that stays odd (its writer died mid-write) still ends in an answer, after the bounded wait.
  seq.store(even + 3);
  EXPECT_EQ(r->loadComm(pub.hash, 8, 1, &cp, &detail), Status::kNotFound);
  EXPECT_NE(detail.find("stayed mid-write"), std::string::npos) << detail;
}
TEST_F(SchedCacheTest, FindAtRangeEdges) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  Plan plan;
  plan.items.push_back(item(Collective::AllReduce, 8, 1, 0, 1023, Algorithm::Ring, Protocol::LL, 2));
  plan.items.push_back(item(Collective::AllReduce, 8, 1, 1024, 65535, Algorithm::Tree, Protocol::LL128, 4));
  // A gap from 65536 to 1 MiB - 1.
  plan.items.push_back(item(Collective::AllReduce, 8, 1, 1 << 20, kMax64, Algorithm::Ring, Protocol::Simple, 8));
  plan.items.push_back(item(Collective::Broadcast, 8, 1, 4096, 8191, Algorithm::Ring, Protocol::Simple));
  publish(*w, plan);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  CommPlan cp;
  ASSERT_EQ(r->loadComm(0, 8, 1, &cp, nullptr), Status::kOk);
  const std::uint32_t ar = func(Collective::AllReduce);
  const std::uint32_t bc = func(Collective::Broadcast);
  auto channels = [&](std::uint32_t coll, std::uint64_t n) {
    const Decision* d = cp.find(coll, n);
    return d == nullptr ? -1 : d->nChannels;
  };
  EXPECT_EQ(channels(ar, 0), 2);
  EXPECT_EQ(channels(ar, 1023), 2);
  EXPECT_EQ(channels(ar, 1024), 4);
  EXPECT_EQ(channels(ar, 65535), 4);
  EXPECT_EQ(channels(ar, 65536), -1);
  EXPECT_EQ(channels(ar, (1 << 20) - 1), -1);
  EXPECT_EQ(channels(ar, 1 << 20), 8);
  EXPECT_EQ(channels(ar, kMax64), 8);
  EXPECT_EQ(channels(bc, 4095), -1);
  EXPECT_EQ(channels(bc, 4096), 0);
  EXPECT_EQ(channels(bc, 8191), 0);
  EXPECT_EQ(channels(bc, 8192), -1);
  EXPECT_EQ(channels(func(Collective::Reduce), 100), -1);
  EXPECT_EQ(cp.find(kNumCollectives, 100), nullptr);
  EXPECT_EQ(cp.find(0xffffffffu, 100), nullptr);
  EXPECT_EQ(cp.find(ar, 2000)->algorithm, stored(Algorithm::Tree));
  EXPECT_EQ(cp.find(ar, 2000)->protocol, stored(Protocol::LL128));
}

TEST_F(SchedCacheTest, SamePlanTwiceIsUnchanged) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const PublishResult first = publish(*w, makePlan(1));
  Plan again = makePlan(1);
  again.source = "/copied/elsewhere";  // the same decisions from another directory
  const PublishResult second = publish(*w, again);
  EXPECT_TRUE(second.unchanged);
  EXPECT_EQ(second.hash, first.hash);
  EXPECT_EQ(second.slot, first.slot);
  EXPECT_EQ(second.generation, first.generation);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->generation(), 1u);
}

TEST_F(SchedCacheTest, NewPlanBecomesCurrentOldStaysLoadable) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const Plan a = makePlan(1);
  const Plan b = makePlan(2);
  const PublishResult pa = publish(*w, a);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  const PublishResult pb = publish(*w, b);
  EXPECT_NE(pa.slot, pb.slot);
  EXPECT_EQ(pb.generation, 2u);
  EXPECT_EQ(r->generation(), 2u);

  CommPlan cur;
  ASSERT_EQ(r->loadComm(0, 8, 1, &cur, nullptr), Status::kOk);
  EXPECT_EQ(cur.planHash, pb.hash);
  CommPlan old;
  ASSERT_EQ(r->loadComm(pa.hash, 8, 1, &old, nullptr), Status::kOk);
  EXPECT_EQ(old.planHash, pa.hash);
  EXPECT_TRUE(sameDecisions(old.byCollective[4], expectedDecisions(a, 4, 8, 1)));

  std::vector<PlanInfo> plans = r->plans();
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(std::count_if(plans.begin(), plans.end(), [](const PlanInfo& i) { return i.current; }), 1);

  // Publishing A again makes its slot current without rewriting the decisions.
  const PublishResult again = publish(*w, a);
  EXPECT_FALSE(again.unchanged);
  EXPECT_EQ(again.slot, pa.slot);
  EXPECT_EQ(again.generation, 3u);
  PlanInfo info;
  ASSERT_EQ(r->current(&info), Status::kOk);
  EXPECT_EQ(info.contentHash, pa.hash);
  EXPECT_EQ(info.generation, 3u);
}

TEST_F(SchedCacheTest, ClearLeavesNoPlan) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  CommPlan cp;
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, nullptr), Status::kNoPlan);  // nothing published yet
  const PublishResult pa = publish(*w, makePlan(1));
  Error e;
  ASSERT_TRUE(w->clear(&e)) << e.message;
  EXPECT_EQ(r->generation(), 2u);
  std::string detail;
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, &detail), Status::kNoPlan);
  EXPECT_NE(detail.find(path()), std::string::npos) << detail;
  EXPECT_EQ(r->current(nullptr), Status::kNoPlan);
  // The content stays: a pinned communicator can still load it by hash.
  EXPECT_EQ(r->loadComm(pa.hash, 8, 1, &cp, nullptr), Status::kOk);
  publish(*w, makePlan(2));
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, nullptr), Status::kOk);
}

TEST_F(SchedCacheTest, InvalidPlanIsRefused) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  Plan bad = makePlan(1);
  bad.items[2].minBytes = bad.items[1].minBytes;
  Error e;
  EXPECT_FALSE(w->publish(bad, &e).has_value());
  EXPECT_EQ(e.status, Status::kInvalidPlan);
  EXPECT_NE(e.message.find("overlaps"), std::string::npos) << e.message;
  auto r = attach();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->current(nullptr), Status::kNoPlan);
}

TEST_F(SchedCacheTest, SecondWriterAttachesToTheSegment) {
  auto w1 = openWriter();
  ASSERT_NE(w1, nullptr);
  const PublishResult pa = publish(*w1, makePlan(1));
  auto w2 = openWriter();
  ASSERT_NE(w2, nullptr);
  const PublishResult pb = publish(*w2, makePlan(2));
  EXPECT_EQ(pb.generation, pa.generation + 1);
  w2.reset();
  EXPECT_EQ(publish(*w1, makePlan(3)).generation, 3u);
}

TEST_F(SchedCacheTest, LockHeldElsewhereIsBusy) {
  WriterOptions o;
  o.lockTimeoutMs = 100;
  auto w = openWriter(o);
  ASSERT_NE(w, nullptr);
  int ready[2];
  int done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    boost::interprocess::file_lock lock(lockPath(ns_).c_str());
    lock.lock();
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    if (::read(done[0], &c, 1) < 0) ::_exit(1);
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  Error e;
  EXPECT_FALSE(w->publish(makePlan(1), &e).has_value());
  EXPECT_EQ(e.status, Status::kBusy);
  EXPECT_NE(e.message.find(lockPath(ns_)), std::string::npos) << e.message;
  EXPECT_FALSE(w->clear(&e));
  EXPECT_EQ(e.status, Status::kBusy);
  ASSERT_EQ(::write(done[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  EXPECT_TRUE(w->publish(makePlan(1), &e).has_value()) << e.message;
}

// --- attach checks -------------------------------------------------------------------------------------------------

TEST_F(SchedCacheTest, CreatedWithMode0600) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), sizeof(Segment));
  ASSERT_EQ(::stat(lockPath(ns_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // No temporary name is left behind.
  EXPECT_NE(::access((path() + ".tmp-" + std::to_string(::getpid())).c_str(), F_OK), 0);
  RawSegment raw(path());
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->header.magic, kMagic);
  EXPECT_STREQ(raw->header.writerBuild, "test-build");
  EXPECT_EQ(raw->header.currentSlot, kNoSlot);
}

TEST_F(SchedCacheTest, GroupOptionGives0660) {
  WriterOptions o;
  o.group = ::getegid();
  auto w = openWriter(o);
  ASSERT_NE(w, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, ::getegid());
  EXPECT_NE(attach(), nullptr);
}

TEST_F(SchedCacheTest, WorldWritableRefused) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  publish(*w, makePlan(1));
  ASSERT_EQ(::chmod(path().c_str(), 0666), 0);
  std::string message;
  EXPECT_EQ(attachStatus(&message), Status::kBadPermissions);
  EXPECT_NE(message.find("0666"), std::string::npos) << message;
  EXPECT_NE(message.find(path()), std::string::npos) << message;
  WriterOptions o;
  o.ns = ns_;
  Error e;
  EXPECT_EQ(Writer::open(o, &e), nullptr);
  EXPECT_EQ(e.status, Status::kBadPermissions);
  // Refused, not repaired.
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0666u);
}

TEST_F(SchedCacheTest, OtherOwnerRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the segment to another uid";
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(::chown(path().c_str(), 65534, static_cast<gid_t>(-1)), 0);
  std::string message;
  EXPECT_EQ(attachStatus(&message), Status::kNotOwner);
  EXPECT_NE(message.find("65534"), std::string::npos) << message;
  EXPECT_NE(message.find("uid 0"), std::string::npos) << message;
  WriterOptions o;
  o.ns = ns_;
  Error e;
  EXPECT_EQ(Writer::open(o, &e), nullptr);
  EXPECT_EQ(e.status, Status::kNotOwner);
}

TEST_F(SchedCacheTest, AnotherUsersSegmentSharedWithOurGroupIsAccepted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the segment to another uid";
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  // What `cache publish --group G` by another member of G leaves: 0660, owner another uid, group G.
  ASSERT_EQ(::chown(path().c_str(), 65534, ::getegid()), 0);
  ASSERT_EQ(::chmod(path().c_str(), 0660), 0);
  std::string message;
  EXPECT_EQ(attachStatus(&message), Status::kOk) << message;
  // The same segment for a group this process is not in.
  ASSERT_EQ(::chown(path().c_str(), 65534, 65533), 0);
  EXPECT_EQ(attachStatus(&message), Status::kNotOwner) << message;
  // Ours by group, but not group-writable: not shared.
  ASSERT_EQ(::chown(path().c_str(), 65534, ::getegid()), 0);
  ASSERT_EQ(::chmod(path().c_str(), 0640), 0);
  EXPECT_EQ(attachStatus(&message), Status::kNotOwner) << message;
}

TEST_F(SchedCacheTest, AbsentSegment) {
  std::string message;
  EXPECT_EQ(attachStatus(&message), Status::kAbsent);
  EXPECT_NE(message.find(path()), std::string::npos) << message;
  Error e;
  EXPECT_TRUE(Writer::remove(ns_, &e)) << e.message;  // absent is not an error
}

TEST_F(SchedCacheTest, GarbageSegmentsAreRefused) {
  // Random bytes of the right size.
  {
    const int fd = ::open(path().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> junk(sizeof(Segment));
    std::mt19937 rng(7);
    for (char& c : junk) c = static_cast<char>(rng());
    ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    ::close(fd);
    EXPECT_EQ(attachStatus(), Status::kBadMagic);
    WriterOptions o;
    o.ns = ns_;
    Error e;
    EXPECT_EQ(Writer::open(o, &e), nullptr);
    EXPECT_EQ(e.status, Status::kBadMagic);
    ::unlink(path().c_str());
  }
  // Damage to a real segment, one field at a time.
  struct Case {
    const char* what;
    void (*damage)(Segment&);
    Status expected;
  };
  const Case cases[] = {
      {"magic", [](Segment& s) { s.header.magic ^= 1; }, Status::kBadMagic},
      {"version", [](Segment& s) { s.header.layoutVersion = kLayoutVersion + 1; }, Status::kBadVersion},
      // A segment an older build made (before the MeasureRegion grew NCCL's choices) is refused, not misread.
      {"version 1", [](Segment& s) { s.header.layoutVersion = 1; }, Status::kBadVersion},
      {"slot count", [](Segment& s) { s.header.slotCount = 2; }, Status::kBadSize},
      {"entry capacity", [](Segment& s) { s.header.entryCapacity = 99; }, Status::kBadSize},
      {"segment bytes", [](Segment& s) { s.header.segmentBytes += 8; }, Status::kBadSize},
      {"build", [](Segment& s) { s.header.writerBuild[3] ^= 0x20; }, Status::kBadHeader},
      {"header checksum", [](Segment& s) { s.header.headerChecksum ^= 0x100; }, Status::kBadHeader},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Writer::remove(ns_, nullptr);
    auto w = openWriter();
    ASSERT_NE(w, nullptr);
    publish(*w, makePlan(1));
    {
      RawSegment raw(path());
      ASSERT_TRUE(raw.ok());
      c.damage(*raw.operator->());
    }
    std::string message;
    EXPECT_EQ(attachStatus(&message), c.expected) << message;
    EXPECT_NE(message.find(path()), std::string::npos) << message;
    if (c.expected == Status::kBadVersion) {
      static_assert(kLayoutVersion == 2);
      const std::string found = std::string(c.what) == "version 1" ? "1" : "3";
      EXPECT_NE(message.find("layout version " + found + ", this build expects 2"), std::string::npos) << message;
      // Nor does a writer reuse it: it would publish into records laid out another way.
      w.reset();
      WriterOptions o;
      o.ns = ns_;
      Error e;
      EXPECT_EQ(Writer::open(o, &e), nullptr);
      EXPECT_EQ(e.status, Status::kBadVersion) << e.message;
    }
  }
  // Truncated and extended.
  for (off_t size :
       {off_t{0}, off_t{100}, static_cast<off_t>(sizeof(Segment) - 1), static_cast<off_t>(sizeof(Segment) + 4096)}) {
    SCOPED_TRACE(size);
    Writer::remove(ns_, nullptr);
    ASSERT_NE(openWriter(), nullptr);
    ASSERT_EQ(::truncate(path().c_str(), size), 0);
    EXPECT_EQ(attachStatus(), Status::kBadSize);
  }
}

TEST_F(SchedCacheTest, SymlinkIsRefused) {
  ASSERT_EQ(::symlink("/dev/null", path().c_str()), 0);
  EXPECT_NE(attachStatus(), Status::kOk);
  WriterOptions o;
  o.ns = ns_;
  Error e;
  EXPECT_EQ(Writer::open(o, &e), nullptr);
}

// --- damaged slots ---------------------------------------------------------------------------------------------------

TEST_F(SchedCacheTest, FlippedSlotByteIsBadChecksum) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const PublishResult pa = publish(*w, makePlan(1));
  auto r = attach();
  ASSERT_NE(r, nullptr);
  {
    RawSegment raw(path());
    ASSERT_TRUE(raw.ok());
    raw->slots[pa.slot].entries[5].maxBytes ^= 0x10;
  }
  CommPlan cp;
  std::string detail;
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, &detail), Status::kBadChecksum);
  EXPECT_NE(detail.find("checksum"), std::string::npos) << detail;
  EXPECT_EQ(r->loadComm(pa.hash, 16, 2, &cp, &detail), Status::kBadChecksum);
  EXPECT_EQ(r->current(nullptr), Status::kBadChecksum);
  EXPECT_TRUE(r->plans().empty());
  std::vector<std::string> report;
  EXPECT_FALSE(r->check(&report));
  EXPECT_NE(report[pa.slot].find("checksum mismatch"), std::string::npos) << report[pa.slot];

  // The writer does not treat the damaged slot as already current: it writes the plan again elsewhere.
  const PublishResult again = publish(*w, makePlan(1));
  EXPECT_FALSE(again.unchanged);
  EXPECT_NE(again.slot, pa.slot);
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, &detail), Status::kOk) << detail;
}

TEST_F(SchedCacheTest, BadContentWithValidChecksumIsCaught) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const PublishResult pa = publish(*w, makePlan(1));
  auto r = attach();
  ASSERT_NE(r, nullptr);
  RawSegment raw(path());
  ASSERT_TRUE(raw.ok());
  PlanSlot& slot = raw->slots[pa.slot];
  auto damage = [&](auto mutate, bool recompute = true) {
    std::vector<char> backup(sizeof(PlanSlot));
    std::memcpy(backup.data(), &slot, sizeof(PlanSlot));
    mutate(slot);
    // So that only the content checks can catch it.
    if (recompute) slot.header.checksum = documentedSlotChecksum(slot);
    Plan plan;
    CommPlan cp;
    std::string detail;
    const Status full = r->loadPlan(0, &plan, nullptr, &detail);
    const Status comm = r->loadComm(0, 8, 1, &cp, nullptr);
    std::vector<std::string> report;
    const bool checked = r->check(&report);
    std::memcpy(&slot, backup.data(), sizeof(PlanSlot));
    EXPECT_EQ(r->loadPlan(0, &plan, nullptr, nullptr), Status::kOk);  // restored
    return std::make_tuple(full, comm, checked, detail);
  };

  // The documented checksum is the one the library computes.
  EXPECT_EQ(documentedSlotChecksum(slot), slot.header.checksum);

  auto [full, comm, checked, detail] = damage([](PlanSlot& s) { s.entries[1].jsonPath = s.header.stringBytes + 10; });
  EXPECT_EQ(full, Status::kBadChecksum);
  EXPECT_NE(detail.find("path offset"), std::string::npos) << detail;
  EXPECT_NE(comm, Status::kOk);
  EXPECT_FALSE(checked);

  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) { s.entries[3].xmlPath = 0xfffffff0u; });
  EXPECT_EQ(full, Status::kBadChecksum);

  // A path without its NUL at the end of the used strings.
  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) {
    s.strings[s.header.stringBytes - 1] = 'x';
    s.entries[1].jsonPath = s.header.stringBytes - 1;
  });
  EXPECT_EQ(full, Status::kBadChecksum);

  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) { s.header.entryCount = kMaxEntries + 1; });
  EXPECT_EQ(full, Status::kBadChecksum);
  EXPECT_NE(detail.find("capacity"), std::string::npos) << detail;

  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) { s.header.stringBytes = 0xffffffffu; }, false);
  EXPECT_EQ(full, Status::kBadChecksum);

  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) { s.entries[0].coll = 200; });
  EXPECT_EQ(comm, Status::kBadChecksum);

  std::tie(full, comm, checked, detail) = damage([](PlanSlot& s) { std::swap(s.entries[0], s.entries[1]); });
  EXPECT_EQ(comm, Status::kBadChecksum);
  EXPECT_NE(detail.find("order"), std::string::npos) << detail;

  // A current slot index out of range.
  raw->header.currentSlot = 7;
  CommPlan cp;
  EXPECT_EQ(r->loadComm(0, 8, 1, &cp, nullptr), Status::kBadHeader);
  EXPECT_FALSE(r->check(nullptr));
  raw->header.currentSlot = pa.slot;
}

TEST_F(SchedCacheTest, AbandonedSlotIsReported) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  const PublishResult pa = publish(*w, makePlan(1));
  const std::uint32_t other = (pa.slot + 1) % kPlanSlots;
  {
    RawSegment raw(path());
    ASSERT_TRUE(raw.ok());
    raw->slots[other].header.seq = 5;  // a writer died while writing
  }
  auto r = attach();
  ASSERT_NE(r, nullptr);
  std::vector<std::string> report;
  EXPECT_TRUE(r->check(&report));  // the current plan is fine
  EXPECT_EQ(report[other],
            "slot " + std::to_string(other) + ": being written or abandoned by a writer that died (seq odd)");
  // The writer reuses the abandoned slot first.
  EXPECT_EQ(publish(*w, makePlan(2)).slot, other);
  report.clear();
  EXPECT_TRUE(r->check(&report));
  EXPECT_NE(report[other].find("checksum ok (current)"), std::string::npos) << report[other];
}

// --- pins and activity -----------------------------------------------------------------------------------------------

TEST_F(SchedCacheTest, PinFirstRecordsOthersAdopt) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r1 = attach();
  auto r2 = attach();
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  Status st = Status::kSystem;
  EXPECT_EQ(r1->pinComm(0xc0ffee, 0x1111, 8, 1, &st), 0x1111u);
  EXPECT_EQ(st, Status::kOk);
  st = Status::kSystem;
  EXPECT_EQ(r2->pinComm(0xc0ffee, 0x2222, 8, 1, &st), 0x1111u);
  EXPECT_EQ(st, Status::kOk);
  EXPECT_EQ(r1->pinComm(0xc0ffee, 0x3333, 8, 1, &st), 0x1111u);
  EXPECT_EQ(r2->pinComm(0xbeef, 0x2222, 16, 2, &st), 0x2222u);
  EXPECT_EQ(r1->pinComm(0xbeef, 0x4444, 16, 2, &st), 0x2222u);
  EXPECT_EQ(r1->pinComm(0, kPinNoPlan, 8, 1, &st), kPinNoPlan);  // commId 0 is a valid id too
  EXPECT_EQ(r2->pinComm(0, 0x5555, 8, 1, &st), kPinNoPlan);
  EXPECT_EQ(st, Status::kOk);

  const std::vector<CommPin> pins = r1->pins();
  ASSERT_EQ(pins.size(), 3u);
  auto pin = std::find_if(pins.begin(), pins.end(), [](const CommPin& p) { return p.commId == 0xbeef; });
  ASSERT_NE(pin, pins.end());
  EXPECT_EQ(pin->planHash, 0x2222u);
  EXPECT_EQ(pin->nRanks, 16u);
  EXPECT_EQ(pin->nNodes, 2u);
  EXPECT_GT(pin->stampNs, 0);
}

TEST_F(SchedCacheTest, StalePinsAreReused) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  Status st;
  EXPECT_EQ(r->pinComm(42, 0x1111, 8, 1, &st), 0x1111u);
  {
    RawSegment raw(path());
    ASSERT_TRUE(raw.ok());
    for (CommPin& p : raw->pins) {
      if (p.commId == 42) p.stampNs -= (kPinAdoptWindowS + 1) * 1000000000LL;
    }
  }
  // The same id after the window is a new communicator: it records its own plan in the same entry.
  EXPECT_EQ(r->pinComm(42, 0x2222, 8, 1, &st), 0x2222u);
  EXPECT_EQ(r->pins().size(), 1u);
  EXPECT_EQ(r->pinComm(42, 0x3333, 8, 1, &st), 0x2222u);
}

TEST_F(SchedCacheTest, ClaimsOfDeadRanksAreSkipped) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  RawSegment raw(path());
  ASSERT_TRUE(raw.ok());
  // Every entry claimed by a rank that died before recording its hash, but one.
  for (std::uint32_t i = 0; i < kCommPins; ++i) raw->pins[i] = CommPin{1000 + i, kPinPending, 0, 8, 1};
  raw->pins[kCommPins / 2] = CommPin{};
  Status st = Status::kSystem;
  EXPECT_EQ(r->pinComm(7, 0x1234, 8, 1, &st), 0x1234u);
  EXPECT_EQ(st, Status::kOk);
  EXPECT_EQ(r->pinComm(7, 0x5678, 8, 1, &st), 0x1234u);
  EXPECT_EQ(st, Status::kOk);
  // Our own communicator's entry left pending: the wait is bounded.
  EXPECT_EQ(r->pinComm(1000 + 3, 0x5678, 8, 1, &st), kPinPending);
  EXPECT_EQ(st, Status::kTorn);
}

TEST_F(SchedCacheTest, PinTableFull) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  Status st = Status::kOk;
  for (std::uint64_t id = 1; id <= kCommPins; ++id) {
    ASSERT_EQ(r->pinComm(id, 0x1000 + id, 8, 1, &st), 0x1000 + id);
  }
  EXPECT_EQ(r->pinComm(kCommPins + 1, 0x77, 8, 1, &st), kPinPending);
  EXPECT_EQ(st, Status::kPinTableFull);
  EXPECT_EQ(r->pinComm(17, 0x77, 8, 1, &st), 0x1000u + 17);  // existing ones are still found
}

TEST_F(SchedCacheTest, PinsProtectSlotsFromReuse) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r = attach();
  ASSERT_NE(r, nullptr);
  const PublishResult pa = publish(*w, makePlan(1));
  Status st;
  ASSERT_EQ(r->pinComm(1, pa.hash, 8, 1, &st), pa.hash);
  std::vector<PublishResult> later;
  for (int v = 2; v <= 5; ++v) later.push_back(publish(*w, makePlan(v)));
  for (const PublishResult& p : later) EXPECT_NE(p.slot, pa.slot);
  CommPlan cp;
  std::string detail;
  ASSERT_EQ(r->loadComm(pa.hash, 8, 1, &cp, &detail), Status::kOk) << detail;
  EXPECT_EQ(cp.planHash, pa.hash);

  // Pin every other plan still in a slot: no slot is left to write.
  const std::uint64_t current = later.back().hash;
  std::vector<std::uint64_t> held;
  for (const PlanInfo& info : r->plans()) {
    if (info.contentHash == current || info.contentHash == pa.hash) continue;
    held.push_back(info.contentHash);
    ASSERT_EQ(r->pinComm(100 + held.size(), info.contentHash, 8, 1, &st), info.contentHash);
  }
  ASSERT_EQ(held.size(), 2u);
  Error e;
  EXPECT_FALSE(w->publish(makePlan(9), &e).has_value());
  EXPECT_EQ(e.status, Status::kBusy);
  EXPECT_NE(e.message.find("pinned"), std::string::npos) << e.message;
  // A plan already in a pinned slot can still become current.
  const auto back = w->publish(makePlan(1), &e);
  ASSERT_TRUE(back.has_value()) << e.message;
  EXPECT_EQ(back->slot, pa.slot);
  CommPlan again;
  EXPECT_EQ(r->loadComm(0, 8, 1, &again, nullptr), Status::kOk);
  EXPECT_EQ(again.planHash, pa.hash);
}

TEST_F(SchedCacheTest, RecordCallCounts) {
  auto w = openWriter();
  ASSERT_NE(w, nullptr);
  auto r1 = attach();
  auto r2 = attach();
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  for (int i = 0; i < 3; ++i) r1->recordCall(4, 1 << 20);
  r2->recordCall(4, (1 << 21) - 1);
  r2->recordCall(0, 0);
  r2->recordCall(0, 1);
  r2->recordCall(2, kMax64);
  r1->recordCall(kNumCollectives, 100);  // ignored
  r1->recordCall(0xffffffffu, 100);
  const Activity a = r2->activity();
  EXPECT_EQ(a.calls[4][20], 4u);
  EXPECT_EQ(a.calls[0][0], 2u);
  EXPECT_EQ(a.calls[2][63], 1u);
  std::uint64_t total = 0;
  for (const auto& row : a.calls) {
    for (std::uint64_t n : row) total += n;
  }
  EXPECT_EQ(total, 7u);
  EXPECT_EQ(sizeBucket(0), 0u);
  EXPECT_EQ(sizeBucket(1), 0u);
  EXPECT_EQ(sizeBucket(2), 1u);
  EXPECT_EQ(sizeBucket(1023), 9u);
  EXPECT_EQ(sizeBucket(1024), 10u);
}

}  // namespace
}  // namespace optiflow::schedcache
