// The tuner's decision layer without NCCL: applying a plan's decision to a cost table, the v2 direct choice, chunk
// sizes, the plan-selection rules of initComm, NCCL's own choice recorded in the segment, and the OPTIFLOW_*
// registry.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/vocabulary.h"
#include "optiflow/plugin/params.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "optiflow/tuner/tuner.h"

namespace {

namespace core = optiflow::core;
namespace sc = optiflow::schedcache;
using optiflow::tuner::CommTuner;

constexpr int kAlgos = 7;
constexpr int kProtos = 3;
constexpr std::uint32_t kAllReduce = 4;
constexpr std::uint32_t kAllGather = 2;

sc::CommPlan onePlan(std::int8_t algo, std::int8_t proto, std::int32_t channels, std::uint64_t chunk = 0) {
  sc::CommPlan p;
  p.planHash = 0x1234;
  p.byCollective[kAllReduce].push_back({0, 1023, chunk, algo, proto, channels});
  p.byCollective[kAllReduce].push_back({1024, ~0ULL, 0, 1, 2, 0});
  return p;
}

struct Table {
  float t[kAlgos][kProtos];
  Table() {
    for (int a = 0; a < kAlgos; ++a) {
      for (int p = 0; p < kProtos; ++p) t[a][p] = 5.0f + static_cast<float>(a * kProtos + p);
    }
  }
  float* data() { return &t[0][0]; }
};

TEST(CommTuner, ForcesThePlansEntryAndChannels) {
  CommTuner tuner(onePlan(0, 1, 4), nullptr);  // Tree / LL128 / 4 channels up to 1 KiB
  Table t;
  int nChannels = 0;
  EXPECT_TRUE(tuner.applyCostTable(kAllReduce, 512, t.data(), kAlgos, kProtos, &nChannels));
  EXPECT_EQ(t.t[0][1], 0.0f);
  EXPECT_EQ(nChannels, 4);
  Table fresh;
  for (int a = 0; a < kAlgos; ++a) {
    for (int p = 0; p < kProtos; ++p) {
      if (a != 0 || p != 1) {
        EXPECT_EQ(t.t[a][p], fresh.t[a][p]);
      }
    }
  }
}

TEST(CommTuner, NeverEnablesAnEntryNcclDisabled) {
  CommTuner tuner(onePlan(0, 1, 4), nullptr);
  Table t;
  t.t[0][1] = -1.0f;
  int nChannels = 0;
  EXPECT_FALSE(tuner.applyCostTable(kAllReduce, 512, t.data(), kAlgos, kProtos, &nChannels));
  EXPECT_EQ(t.t[0][1], -1.0f);
  EXPECT_EQ(nChannels, 0);
}

TEST(CommTuner, AnEarlierZeroCannotWinTheTie) {
  // nRanks == 1: NCCL sets RING/SIMPLE to 0.0 and everything else to -1; a plan choosing Tree/Simple that NCCL
  // left available must still win over an earlier 0.0.
  CommTuner tuner(onePlan(1, 2, 0), nullptr);  // Ring / Simple
  Table t;
  t.t[0][0] = 0.0f;  // Tree/LL at 0.0 comes first in algo-major order
  int nChannels = 0;
  EXPECT_TRUE(tuner.applyCostTable(kAllReduce, 100, t.data(), kAlgos, kProtos, &nChannels));
  EXPECT_EQ(t.t[1][2], 0.0f);
  EXPECT_GT(t.t[0][0], 0.0f);
  EXPECT_EQ(nChannels, 0);  // the plan leaves channels to NCCL
}

TEST(CommTuner, OutsideTheTableOrWithoutADecisionNothingChanges) {
  CommTuner tuner(onePlan(6, 2, 2), nullptr);  // PAT, absent from NCCL 2.22's six-algorithm table
  Table t;
  Table fresh;
  int nChannels = 0;
  EXPECT_FALSE(tuner.applyCostTable(kAllReduce, 100, t.data(), 6, kProtos, &nChannels));
  EXPECT_FALSE(tuner.applyCostTable(kAllGather, 100, t.data(), kAlgos, kProtos, &nChannels));  // no entries
  EXPECT_FALSE(tuner.applyCostTable(9, 100, t.data(), kAlgos, kProtos, &nChannels));           // not a collective
  EXPECT_FALSE(tuner.applyCostTable(kAllReduce, 100, nullptr, kAlgos, kProtos, &nChannels));
  EXPECT_EQ(0, std::memcmp(t.t, fresh.t, sizeof(t.t)));
  EXPECT_EQ(nChannels, 0);
  CommTuner none;
  EXPECT_FALSE(none.applyCostTable(kAllReduce, 100, t.data(), kAlgos, kProtos, &nChannels));
}

TEST(CommTuner, DirectChoiceOnlyWhereNccl221CanRunIt) {
  int algo = -1, proto = -1, nChannels = 0;
  CommTuner ring(onePlan(1, 0, 2), nullptr);
  EXPECT_TRUE(ring.applyDirect(kAllReduce, 10, false, false, &algo, &proto, &nChannels));
  EXPECT_EQ(algo, 1);
  EXPECT_EQ(proto, 0);
  EXPECT_EQ(nChannels, 2);
  algo = proto = -1;
  CommTuner pat(onePlan(6, 2, 2), nullptr);
  EXPECT_FALSE(pat.applyDirect(kAllReduce, 10, true, true, &algo, &proto, &nChannels));
  EXPECT_EQ(algo, -1);
  CommTuner nvls(onePlan(4, 2, 0), nullptr);
  EXPECT_FALSE(nvls.applyDirect(kAllReduce, 10, false, false, &algo, &proto, &nChannels));
  EXPECT_TRUE(nvls.applyDirect(kAllReduce, 10, false, true, &algo, &proto, &nChannels));
  EXPECT_EQ(algo, 4);
}

TEST(CommTuner, ChunkSizeOnlyForThePlansOwnChoice) {
  CommTuner tuner(onePlan(1, 2, 0, 131072), nullptr);
  std::size_t chunk = 7;
  EXPECT_TRUE(tuner.chunkSize(kAllReduce, 100, 1, 2, &chunk));
  EXPECT_EQ(chunk, 131072u);
  chunk = 7;
  EXPECT_FALSE(tuner.chunkSize(kAllReduce, 100, 0, 2, &chunk));   // NCCL ended up elsewhere
  EXPECT_FALSE(tuner.chunkSize(kAllReduce, 4096, 1, 2, &chunk));  // entry without a chunk size
  EXPECT_EQ(chunk, 7u);
}

// ---- initComm against a real segment -------------------------------------------------------------------------

class CaptureLog final : public optiflow::tuner::Log {
 public:
  void write(optiflow::tuner::LogLevel level, const std::string& message) override {
    lines.push_back(std::string(level == optiflow::tuner::LogLevel::kWarn ? "WARN " : "INFO ") + message);
  }
  std::string all() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
  std::vector<std::string> lines;
};

sc::Plan planFor(std::uint32_t ranks, std::uint32_t nodes, core::Algorithm algo) {
  sc::Plan p;
  p.source = "tuner_test";
  sc::PlanItem it;
  it.coll = core::Collective::AllReduce;
  it.nRanks = ranks;
  it.nNodes = nodes;
  it.minBytes = 0;
  it.maxBytes = ~0ULL;
  it.algorithm = algo;
  it.protocol = core::Protocol::Simple;
  it.nChannels = 8;
  p.items.push_back(it);
  return p;
}

class InitComm : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = "tuner-" + std::to_string(getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ns_.resize(std::min<std::size_t>(ns_.size(), 64));
    settings_.ns = ns_;
    settings_.host = "testhost";
    settings_.settleS = 0;  // segments are seconds old here; the settle rule has its own test
  }
  void TearDown() override {
    sc::Error e;
    sc::Writer::remove(ns_, &e);
  }
  std::uint64_t publish(const sc::Plan& p) {
    sc::Error e;
    sc::WriterOptions o;
    o.ns = ns_;
    auto w = sc::Writer::open(o, &e);
    EXPECT_TRUE(w) << e.message;
    auto r = w ? w->publish(p, &e) : std::nullopt;
    EXPECT_TRUE(r) << e.message;
    return r ? r->hash : 0;
  }
  std::string ns_;
  optiflow::tuner::Settings settings_;
  CaptureLog log_;
};

TEST_F(InitComm, NoSegmentMeansNoPlan) {
  auto r = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(r.ok);
  EXPECT_FALSE(r.tuner->hasPlan());
}

TEST_F(InitComm, OneNodeRanksAdoptTheFirstRanksPlan) {
  const std::uint64_t a = publish(planFor(8, 1, core::Algorithm::Ring));
  auto first = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(first.ok);
  EXPECT_EQ(first.tuner->planHash(), a);
  const std::uint64_t b = publish(planFor(8, 1, core::Algorithm::Tree));  // lands between two ranks' inits
  ASSERT_NE(a, b);
  auto second = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(second.ok);
  EXPECT_EQ(second.tuner->planHash(), a) << log_.all();
  auto other = optiflow::tuner::initComm(settings_, {0x43, 8, 1}, log_);  // a new communicator gets the new plan
  EXPECT_EQ(other.tuner->planHash(), b);
}

TEST_F(InitComm, MultiNodeOrNoCommIdWithoutPinMeansNoPlan) {
  publish(planFor(16, 2, core::Algorithm::Ring));
  auto multi = optiflow::tuner::initComm(settings_, {0x42, 16, 2}, log_);
  ASSERT_TRUE(multi.ok);
  EXPECT_FALSE(multi.tuner->hasPlan());
  auto old = optiflow::tuner::initComm(settings_, {std::nullopt, 16, 1}, log_);
  ASSERT_TRUE(old.ok);
  EXPECT_FALSE(old.tuner->hasPlan());
  EXPECT_NE(log_.all().find("OPTIFLOW_PLAN"), std::string::npos) << log_.all();
}

TEST_F(InitComm, APinnedPlanIsUsedOnEveryShapeAndItsAbsenceFailsInit) {
  const std::uint64_t a = publish(planFor(16, 2, core::Algorithm::Ring));
  settings_.pinned = a;
  auto ok = optiflow::tuner::initComm(settings_, {std::nullopt, 16, 2}, log_);
  ASSERT_TRUE(ok.ok);
  EXPECT_EQ(ok.tuner->planHash(), a);
  settings_.pinned = 0x0123456789abcdefULL;
  auto missing = optiflow::tuner::initComm(settings_, {0x42, 16, 2}, log_);
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.message.find("0123456789abcdef"), std::string::npos) << missing.message;
  EXPECT_NE(missing.message.find("testhost"), std::string::npos) << missing.message;
  settings_.missingUsesDefaults = true;
  auto defaults = optiflow::tuner::initComm(settings_, {0x42, 16, 2}, log_);
  ASSERT_TRUE(defaults.ok);
  EXPECT_FALSE(defaults.tuner->hasPlan());
  EXPECT_NE(log_.all().find("WARN OPTIFLOW_PLAN=0123456789abcdef"), std::string::npos) << log_.all();
}

TEST_F(InitComm, YoungSegmentGivesNoPlan) {
  // Rank 0 initialises before any segment exists: no plan. The daemon then creates the segment and publishes; rank 1
  // of the same communicator must not pick the new plan up.
  settings_.settleS = 60;
  auto first = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(first.ok);
  EXPECT_FALSE(first.tuner->hasPlan());
  publish(planFor(8, 1, core::Algorithm::Ring));
  auto second = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(second.ok);
  EXPECT_FALSE(second.tuner->hasPlan()) << log_.all();
  // ... and the communicator's pin says "no plan", so later ranks agree even once the segment has settled.
  settings_.settleS = 0;
  auto third = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  EXPECT_FALSE(third.tuner->hasPlan()) << log_.all();
  auto fresh = optiflow::tuner::initComm(settings_, {0x43, 8, 1}, log_);  // a new communicator after settling
  EXPECT_TRUE(fresh.tuner->hasPlan()) << log_.all();
}

TEST_F(InitComm, UserOverridesAndOffSwitchStepAside) {
  publish(planFor(8, 1, core::Algorithm::Ring));
  settings_.ncclOverride = "NCCL_ALGO=Tree";
  EXPECT_FALSE(optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_).tuner->hasPlan());
  settings_.ncclOverride.clear();
  settings_.enabled = false;
  EXPECT_FALSE(optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_).tuner->hasPlan());
}

// ---- NCCL's own choice ------------------------------------------------------------------------------------------

TEST(NcclArgmin, SmallestNonNegativeFirstOnTiesNeverNegativeOrNaN) {
  using optiflow::tuner::ncclArgmin;
  Table t;
  EXPECT_EQ(ncclArgmin(t.data(), kAlgos, kProtos), 0);  // 5.0 at Tree/LL
  t.t[0][0] = std::nanf("");
  t.t[0][1] = -1.0f;
  t.t[1][2] = 2.0f;  // Ring/Simple
  t.t[4][0] = 2.0f;  // NVLS/LL: the same cost later in [algo][proto] order loses the tie
  t.t[6][1] = -0.5f;
  EXPECT_EQ(ncclArgmin(t.data(), kAlgos, kProtos), 1 * kProtos + 2);
  t.t[3][1] = 0.0f;  // zero is a cost NCCL can pick
  EXPECT_EQ(ncclArgmin(t.data(), kAlgos, kProtos), 3 * kProtos + 1);
  for (int a = 0; a < kAlgos; ++a) {
    for (int p = 0; p < kProtos; ++p) t.t[a][p] = a % 2 == 0 ? -1.0f : std::nanf("");
  }
  EXPECT_EQ(ncclArgmin(t.data(), kAlgos, kProtos), -1);
  EXPECT_EQ(ncclArgmin(t.data(), 0, kProtos), -1);
}

class TunerNcclChoice : public InitComm {
 protected:
  std::vector<sc::NcclChoice> choices() {
    sc::Error e;
    auto r = sc::Reader::attach(ns_, &e);
    EXPECT_NE(r, nullptr) << e.message;
    return r ? r->ncclChoices() : std::vector<sc::NcclChoice>{};
  }
};

// The argmin of the table as NCCL handed it over is recorded, in the profiler's collective encoding, and the table
// the tuner hands back is exactly the one a tuner that records nothing hands back.
TEST_F(TunerNcclChoice, RecordsTheUntouchedTablesArgminAndChangesNothingElse) {
  publish(planFor(8, 1, core::Algorithm::Ring));  // Ring/Simple, 8 channels: not NCCL's choice below
  auto r = optiflow::tuner::initComm(settings_, {0x42, 8, 1}, log_);
  ASSERT_TRUE(r.ok && r.tuner->hasPlan()) << log_.all();
  Table t;
  t.t[0][0] = std::nanf("");
  t.t[0][1] = 3.0f;   // Tree/LL128: NCCL's pick
  t.t[2][0] = 3.0f;   // a tie later in order
  t.t[1][0] = -1.0f;  // cannot run
  t.t[5][2] = -2.0f;
  Table plain = t;
  int nChannels = 0;
  ASSERT_TRUE(r.tuner->applyCostTable(kAllReduce, 1 << 20, t.data(), kAlgos, kProtos, &nChannels));
  EXPECT_EQ(nChannels, 8);
  EXPECT_EQ(t.t[1][2], 0.0f);  // the plan's Ring/Simple

  // The same plan in a tuner without a segment: the same table back.
  sc::CommPlan plan;
  {
    sc::Error e;
    auto reader = sc::Reader::attach(ns_, &e);
    ASSERT_NE(reader, nullptr) << e.message;
    std::string detail;
    ASSERT_EQ(reader->loadComm(r.tuner->planHash(), 8, 1, &plan, &detail), sc::Status::kOk) << detail;
  }
  CommTuner bare(plan, nullptr);
  int bareChannels = 0;
  ASSERT_TRUE(bare.applyCostTable(kAllReduce, 1 << 20, plain.data(), kAlgos, kProtos, &bareChannels));
  EXPECT_EQ(bareChannels, nChannels);
  EXPECT_EQ(std::memcmp(t.data(), plain.data(), sizeof(t.t)), 0) << "the recording changed the table handed back";

  std::vector<sc::NcclChoice> c = choices();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].commId, 0x42u);
  EXPECT_EQ(c[0].coll, core::Collective::AllReduce);  // ncclFunc 4, stored as core::Collective like MeasureRecord
  EXPECT_EQ(c[0].sizeBytes, 1u << 20);
  EXPECT_EQ(c[0].algorithm, core::Algorithm::Tree);
  EXPECT_EQ(c[0].protocol, core::Protocol::LL128);
  EXPECT_EQ(c[0].calls, 1u);

  // Later calls of that size count into the same record; NCCL's choice is read before the plan's 0.0 every time.
  for (int i = 0; i < 3; ++i) {
    Table fresh;
    fresh.t[4][2] = 1.0f;  // NVLS/Simple
    r.tuner->applyCostTable(kAllReduce, 1 << 20, fresh.data(), kAlgos, kProtos, &nChannels);
  }
  c = choices();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].algorithm, core::Algorithm::Nvls);
  EXPECT_EQ(c[0].protocol, core::Protocol::Simple);
  EXPECT_EQ(c[0].calls, 4u);
}

TEST_F(TunerNcclChoice, RecordedWithoutAPlanButNotWithoutACommunicatorIdOrARunnableEntry) {
  publish(planFor(8, 1, core::Algorithm::Ring));
  // No decision for this shape (16 ranks): NCCL decides, and what it decides is still recorded.
  auto r = optiflow::tuner::initComm(settings_, {0x42, 16, 1}, log_);
  ASSERT_TRUE(r.ok);
  Table t;
  Table before = t;
  int nChannels = 0;
  EXPECT_FALSE(r.tuner->applyCostTable(kAllGather, 4096, t.data(), kAlgos, kProtos, &nChannels));
  EXPECT_EQ(std::memcmp(t.data(), before.data(), sizeof(t.t)), 0);
  std::vector<sc::NcclChoice> c = choices();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].coll, core::Collective::AllGather);
  EXPECT_EQ(c[0].algorithm, core::Algorithm::Tree);
  EXPECT_EQ(c[0].protocol, core::Protocol::LL);

  // Nothing NCCL can run: nothing to record.
  for (auto& row : t.t) {
    for (float& v : row) v = -1.0f;
  }
  r.tuner->applyCostTable(kAllReduce, 8192, t.data(), kAlgos, kProtos, &nChannels);
  // Not a collective a tuner decides.
  Table u;
  r.tuner->applyCostTable(9, 8192, u.data(), kAlgos, kProtos, &nChannels);
  // A multi-node communicator without a pinned plan records too; one without an id cannot be joined, so does not.
  auto multi = optiflow::tuner::initComm(settings_, {0x43, 16, 2}, log_);
  ASSERT_TRUE(multi.ok);
  Table m;
  multi.tuner->applyCostTable(kAllReduce, 8192, m.data(), kAlgos, kProtos, &nChannels);
  auto anonymous = optiflow::tuner::initComm(settings_, {std::nullopt, 16, 1}, log_);
  ASSERT_TRUE(anonymous.ok);
  Table n;
  anonymous.tuner->applyCostTable(kAllReduce, 16384, n.data(), kAlgos, kProtos, &nChannels);
  c = choices();
  ASSERT_EQ(c.size(), 2u);
  for (const sc::NcclChoice& x : c) {
    EXPECT_TRUE((x.commId == 0x42 && x.sizeBytes == 4096) || (x.commId == 0x43 && x.sizeBytes == 8192))
        << x.commId << " " << x.sizeBytes;
  }
}

// ---- the OPTIFLOW_* registry ------------------------------------------------------------------------------------

std::map<std::string, std::string>* fakeEnv() {
  static std::map<std::string, std::string> env;
  return &env;
}
const char* fakeGetEnv(const char* name) {
  auto it = fakeEnv()->find(name);
  return it == fakeEnv()->end() ? nullptr : it->second.c_str();
}

TEST(Params, DefaultsAndStrictParsing) {
  using optiflow::plugin::Params;
  fakeEnv()->clear();
  Params p;
  std::string error;
  ASSERT_TRUE(optiflow::plugin::readParams(fakeGetEnv, &p, &error));
  EXPECT_TRUE(p.tunerEnabled);
  EXPECT_EQ(p.ns, "default");
  EXPECT_FALSE(p.plan);
  EXPECT_FALSE(p.planMissingDefaults);

  *fakeEnv() = {{"OPTIFLOW_PLAN", "00000000DEADBEEF"},
                {"OPTIFLOW_PLAN_MISSING", "defaults"},
                {"OPTIFLOW_NAMESPACE", "job-7"},
                {"OPTIFLOW_TUNER", "off"}};
  ASSERT_TRUE(optiflow::plugin::readParams(fakeGetEnv, &p, &error)) << error;
  EXPECT_EQ(p.plan, 0xdeadbeefULL);
  EXPECT_TRUE(p.planMissingDefaults);
  EXPECT_EQ(p.ns, "job-7");
  EXPECT_FALSE(p.tunerEnabled);

  const std::vector<std::pair<std::string, std::string>> bad = {{"OPTIFLOW_PLAN", "xyz"},
                                                                {"OPTIFLOW_PLAN", "0123456789abcdef0"},
                                                                {"OPTIFLOW_PLAN_MISSING", "ignore"},
                                                                {"OPTIFLOW_NAMESPACE", "../etc"},
                                                                {"OPTIFLOW_TUNER", "yes"},
                                                                {"OPTIFLOW_SETTLE_S", "-5"},
                                                                {"OPTIFLOW_SETTLE_S", "86401"},
                                                                {"OPTIFLOW_ABORT_ON_ERROR", "-1"}};
  for (const auto& [name, value] : bad) {
    *fakeEnv() = {{name, value}};
    error.clear();
    EXPECT_FALSE(optiflow::plugin::readParams(fakeGetEnv, &p, &error)) << name << "=" << value;
    EXPECT_NE(error.find(name + "='" + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("expected"), std::string::npos) << error;
  }
}

TEST(Params, UnknownVariablesAreReported) {
  // optiflowd's and the CLI's variables (core::env::kDaemonParams) are known too: a job environment may set them.
  std::string a = "OPTIFLOW_PLNA=1", b = "OPTIFLOW_PLAN=0000000000000002", c = "PATH=/bin",
              d = "OPTIFLOW_LLM_API_KEY=sk-1", e = "OPTIFLOW_METRICS_PORT=0";
  char* envp[] = {a.data(), b.data(), c.data(), d.data(), e.data(), nullptr};
  EXPECT_EQ(optiflow::plugin::unknownParams(envp), std::vector<std::string>{"OPTIFLOW_PLNA"});
}

// docs/schedcache.md shows describeParams() verbatim: tests/unit/core/env_registry_test.cc checks it.

}  // namespace
