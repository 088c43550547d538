// `optiflow cache publish|show|verify|clear` as a user runs them, on a real run directory of `optiflow synthesize`
// (one DGX A100 node, six sizes) and a real segment under /dev/shm. Every test uses its own namespace
// ("e2e-<pid>-<n>") and removes it, whatever happens.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using optiflow::testsupport::slurp;
using CliResult = optiflow::testsupport::CommandResult;

namespace core = optiflow::core;
namespace sc = optiflow::schedcache;
using nlohmann::json;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

fs::path segmentFile(const std::string& ns) { return fs::path("/dev/shm") / ("optiflow-" + ns); }

class CacheCli : public ::testing::Test {
 protected:
  // One synthesized run for the whole suite: the tests copy it before changing anything in it.
  static void SetUpTestSuite() {
    shared_ = fs::temp_directory_path() / fmt::format("optiflow-cache-e2e-{}", ::getpid());
    fs::remove_all(shared_);
    fs::create_directories(shared_);
    const std::string cmd = fmt::format(
        "{} synthesize --topo dgx-a100 --coll allgather --sizes 1KiB:1MiB:4 --rounds 1 --candidates 2 -q --out {} "
        ">{} 2>&1",
        OPTIFLOW_CLI, (shared_ / "run").string(), (shared_ / "synthesize.log").string());
    const int status = std::system(cmd.c_str());
    synthesized_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(shared_, ec);
  }

  void SetUp() override {
    ASSERT_TRUE(synthesized_) << slurp(shared_ / "synthesize.log");
    static int counter = 0;
    ns_ = fmt::format("e2e-{}-{}", ::getpid(), counter++);
    dir_ = shared_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run_ = dir_ / "run";
    fs::copy(shared_ / "run", run_, fs::copy_options::recursive);
    removeNamespace();
  }
  void TearDown() override {
    removeNamespace();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void removeNamespace() {
    run(fmt::format("cache clear --remove --namespace {}", ns_));
    std::error_code ec;
    fs::remove(segmentFile(ns_), ec);
    fs::remove(fs::path(segmentFile(ns_).string() + ".lock"), ec);
  }

  CliResult run(const std::string& args, const std::string& env = "") {
    return optiflow::testsupport::runCommand(fmt::format("{} {} {}", env, OPTIFLOW_CLI, args), dir_);
  }
  CliResult cache(const std::string& args) { return run(fmt::format("cache {} --namespace {}", args, ns_)); }

  json showJson() {
    const CliResult r = cache("show --json");
    EXPECT_EQ(r.rc, 0) << r.all();
    return json::parse(r.out);
  }

  json plan() const { return json::parse(slurp(run_ / "plan.json")); }

  // "published plan H (N entries, slot S, generation G) from DIR into SEGMENT": H, N, S, G.
  struct Published {
    std::string hash;
    std::size_t entries = 0;
    std::uint32_t slot = 0;
    std::uint64_t generation = 0;
  };
  Published published(const CliResult& r) {
    static const std::regex re(R"(published plan ([0-9a-f]{16}) \((\d+) entries, slot (\d+), generation (\d+)\))");
    std::smatch m;
    Published p;
    EXPECT_TRUE(std::regex_search(r.out, m, re)) << r.all();
    if (m.empty()) return p;
    p.hash = m[1];
    p.entries = std::stoul(m[2]);
    p.slot = static_cast<std::uint32_t>(std::stoul(m[3]));
    p.generation = std::stoull(m[4]);
    return p;
  }

  // A schedule the verifier does not prove: rank 0's first thread block loses its last step.
  void breakSchedule(const fs::path& file) {
    json s = json::parse(slurp(file));
    json& steps = s["ranks"][0]["threadblocks"][0]["steps"];
    steps.erase(steps.size() - 1);
    std::ofstream(file, std::ios::binary) << s.dump(1);
  }

  fs::path scheduleOf(std::size_t entry, const char* key) const {
    return run_ / plan().at("collectives")[0].at("entries")[entry].at("best").at(key).get<std::string>();
  }

  static inline fs::path shared_;
  static inline bool synthesized_ = false;
  std::string ns_;
  fs::path dir_;
  fs::path run_;
};

TEST_F(CacheCli, PublishShowVerifyClearAndRemove) {
  const CliResult pub = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  const Published p = published(pub);
  EXPECT_EQ(p.entries, 6u);
  EXPECT_TRUE(contains(pub.out, fmt::format("from {} into {}", run_.string(), segmentFile(ns_).string()))) << pub.out;
  struct stat st {};
  ASSERT_EQ(::stat(segmentFile(ns_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "without --group only the owner reads the cache";

  // The table.
  const CliResult show = cache("show");
  ASSERT_EQ(show.rc, 0) << show.all();
  for (const std::string& s :
       {p.hash, std::string("allgather on 8 ranks, 1 node"), run_.string().substr(0, sc::kSourceBytes - 1),
        segmentFile(ns_).string(), std::string("native decision"), std::string("bound_us")}) {
    EXPECT_TRUE(contains(show.out, s)) << s << "\n" << show.out;
  }

  // The same as JSON, against plan.json.
  const json j = showJson();
  EXPECT_EQ(j.at("namespace"), ns_);
  EXPECT_EQ(j.at("segment"), segmentFile(ns_).string());
  EXPECT_EQ(j.at("build").get<std::string>().rfind("0.", 0), 0u) << j.at("build");
  ASSERT_TRUE(j.at("current").is_object()) << j.dump(2);
  EXPECT_EQ(j.at("current").at("hash"), p.hash);
  EXPECT_EQ(j.at("current").at("slot"), p.slot);
  EXPECT_EQ(j.at("current").at("entries"), 6);
  // The segment keeps the first 63 bytes of the source (layout.h, kSourceBytes).
  const std::string source = j.at("current").at("source").get<std::string>();
  EXPECT_EQ(source, run_.string().substr(0, sc::kSourceBytes - 1));
  EXPECT_EQ(j.at("generation"), p.generation);
  ASSERT_GE(j.at("plans").size(), 1u);
  int currents = 0;
  for (const json& pl : j.at("plans")) currents += pl.at("current").get<bool>() ? 1 : 0;
  EXPECT_EQ(currents, 1);
  EXPECT_TRUE(j.at("pins").is_array());
  EXPECT_TRUE(j.at("activity").is_array());
  EXPECT_TRUE(j.at("problems").empty()) << j.at("problems");
  const json& entries = j.at("entries");
  const json planEntries = plan().at("collectives")[0].at("entries");
  ASSERT_EQ(entries.size(), planEntries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    const json& pe = planEntries[i];
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(e.at("collective"), "allgather");
    EXPECT_EQ(e.at("ranks"), 8);
    EXPECT_EQ(e.at("nodes"), 1);
    EXPECT_EQ(e.at("min_bytes"), pe.at("min_bytes"));
    EXPECT_EQ(e.at("max_bytes"), pe.at("max_bytes"));
    const json& native = pe.at("native");
    if (native.at("time_us").get<double>() > 0 && !e.at("algorithm").is_null()) {
      EXPECT_EQ(lower(e.at("algorithm").get<std::string>()), lower(native.at("algorithm").get<std::string>()));
      EXPECT_EQ(e.at("channels"), native.at("channels"));
      EXPECT_NEAR(e.at("native_us").get<double>(), native.at("time_us").get<double>(),
                  1e-5 * native.at("time_us").get<double>());
    }
    ASSERT_TRUE(pe.at("best").is_object());
    EXPECT_EQ(e.at("schedule_json"), (run_ / pe.at("best").at("schedule_json").get<std::string>()).string());
    EXPECT_EQ(e.at("schedule_xml"), (run_ / pe.at("best").at("schedule_xml").get<std::string>()).string());
    EXPECT_TRUE(e.at("schedule_id").is_string());
    EXPECT_NEAR(e.at("best_us").get<double>(), pe.at("best").at("time_us").get<double>(),
                1e-5 * pe.at("best").at("time_us").get<double>());
  }

  const CliResult verify = cache("verify");
  EXPECT_EQ(verify.rc, 0) << verify.all();
  EXPECT_TRUE(contains(verify.out, "OK")) << verify.out;
  EXPECT_TRUE(contains(verify.out, "12 schedule files checked")) << verify.out;

  const CliResult again = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(again.rc, 0) << again.all();
  EXPECT_TRUE(contains(again.out, fmt::format("plan {} is already current", p.hash))) << again.out;

  const CliResult clear = cache("clear");
  ASSERT_EQ(clear.rc, 0) << clear.all();
  const CliResult cleared = cache("show");
  ASSERT_EQ(cleared.rc, 0) << cleared.all();
  EXPECT_TRUE(contains(cleared.out, "no plan is current")) << cleared.out;
  const json cj = showJson();
  EXPECT_TRUE(cj.at("current").is_null()) << cj.dump(2);
  EXPECT_TRUE(cj.at("entries").empty());
  EXPECT_GT(cj.at("generation").get<std::uint64_t>(), p.generation);
  EXPECT_EQ(cache("verify").rc, 0);

  // Publishing after a clear makes the plan current again.
  const CliResult republish = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(republish.rc, 0) << republish.all();
  EXPECT_EQ(published(republish).hash, p.hash);

  const CliResult remove = cache("clear --remove");
  ASSERT_EQ(remove.rc, 0) << remove.all();
  EXPECT_FALSE(fs::exists(segmentFile(ns_)));
  const CliResult gone = cache("show");
  EXPECT_EQ(gone.rc, 1);
  EXPECT_TRUE(
      contains(gone.err, fmt::format("no schedule cache for namespace {} ({})", ns_, segmentFile(ns_).string())))
      << gone.err;
  EXPECT_TRUE(contains(gone.err, "optiflow cache publish PLAN_DIR")) << gone.err;
}

TEST_F(CacheCli, ShowListsPinsAndActivity) {
  const CliResult pub = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  const std::string hash = published(pub).hash;
  // What a tuner plugin does in a training job: pin its communicator to the plan, count calls.
  {
    sc::Error error;
    std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &error);
    ASSERT_NE(reader, nullptr) << error.message;
    sc::Status status = sc::Status::kOk;
    const std::uint64_t planHash = *sc::parseHash(hash);
    EXPECT_EQ(reader->pinComm(0xabcULL, planHash, 8, 1, &status), planHash) << sc::toString(status);
    // recordCall takes NCCL's ncclFunc_t index, as the tuner passes it.
    const auto func = [](core::Collective c) { return static_cast<std::uint32_t>(*core::ncclFuncIndex(c)); };
    for (int i = 0; i < 3; ++i) reader->recordCall(func(core::Collective::AllGather), 1 << 20);
    reader->recordCall(func(core::Collective::AllReduce), 4096);
  }
  const json j = showJson();
  ASSERT_EQ(j.at("pins").size(), 1u) << j.at("pins");
  const json& pin = j.at("pins")[0];
  EXPECT_EQ(pin.at("comm_id"), "0000000000000abc");
  EXPECT_EQ(pin.at("plan"), hash);
  EXPECT_EQ(pin.at("ranks"), 8);
  EXPECT_EQ(pin.at("nodes"), 1);
  EXPECT_GE(pin.at("age_s").get<double>(), 0);
  EXPECT_LT(pin.at("age_s").get<double>(), 600);
  ASSERT_EQ(j.at("activity").size(), 2u) << j.at("activity");
  EXPECT_EQ(j.at("activity")[0], json({{"collective", "allgather"}, {"bucket", 20}, {"size", "2^20"}, {"calls", 3}}));
  EXPECT_EQ(j.at("activity")[1], json({{"collective", "allreduce"}, {"bucket", 12}, {"size", "2^12"}, {"calls", 1}}));
  const CliResult show = cache("show");
  ASSERT_EQ(show.rc, 0) << show.all();
  for (const char* s : {"0000000000000abc", "2^20", "2^12"}) EXPECT_TRUE(contains(show.out, s)) << s << show.out;

  // A communicator initialised a moment ago: its other ranks may still be initialising, so removing the cache
  // under them is refused unless forced.
  const CliResult refused = cache("clear --remove");
  EXPECT_EQ(refused.rc, 1) << refused.all();
  EXPECT_TRUE(contains(refused.err, "1 communicator initialised")) << refused.err;
  EXPECT_TRUE(fs::exists(segmentFile(ns_)));
  const CliResult forced = cache("clear --remove --force");
  EXPECT_EQ(forced.rc, 0) << forced.all();
  EXPECT_FALSE(fs::exists(segmentFile(ns_)));
}

// What the profiler plugin writes (the Reader calls it makes on a completed collective), read back as a user does.
TEST_F(CacheCli, MeasurementsListsWhatTheProfilerRecorded) {
  const CliResult absent = cache("measurements");
  EXPECT_EQ(absent.rc, 1) << absent.all();
  EXPECT_TRUE(contains(absent.err, "no schedule cache")) << absent.err;
  const CliResult pub = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  const CliResult empty = cache("measurements --json");
  ASSERT_EQ(empty.rc, 0) << empty.all();
  EXPECT_TRUE(json::parse(empty.out).at("rows").empty());
  {
    sc::Error error;
    std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &error);
    ASSERT_NE(reader, nullptr) << error.message;
    sc::MeasureRecord* ring = reader->measureRecord(0xabcULL, static_cast<std::uint8_t>(core::Collective::AllGather),
                                                    1 << 20, 1, 2, 8);  // Ring, Simple, 8 channels
    ASSERT_NE(ring, nullptr);
    for (std::uint64_t us = 10; us <= 100; us += 10) sc::Reader::addMeasurement(ring, us * 1000, 5'000'000'000LL);
    sc::MeasureRecord* tree = reader->measureRecord(0xabcULL, static_cast<std::uint8_t>(core::Collective::AllReduce),
                                                    4096, 0, 0, 2);  // Tree, LL, 2 channels
    ASSERT_NE(tree, nullptr);
    sc::Reader::addMeasurement(tree, 7'000, 6'000'000'000LL);
    // What the tuner read from NCCL's cost tables: Ring/Simple was NCCL's own choice for the allgather, Ring/LL
    // (measured by nobody) for the allreduce; a third choice has no measured row.
    reader->recordChoice(0xabcULL, static_cast<std::uint8_t>(core::Collective::AllGather), 1 << 20, 1, 2);
    reader->recordChoice(0xabcULL, static_cast<std::uint8_t>(core::Collective::AllReduce), 4096, 1, 0);
    reader->recordChoice(0xabcULL, static_cast<std::uint8_t>(core::Collective::AllReduce), 8192, 0, 0);
    sc::MeasureCounters counters{};
    counters.untimed = 3;
    reader->addMeasureCounters(counters);
  }
  const CliResult r = cache("measurements --json");
  ASSERT_EQ(r.rc, 0) << r.all();
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("counters").at("untimed"), 3);
  ASSERT_EQ(j.at("rows").size(), 2u) << j.dump(1);
  const json& ag = j.at("rows")[0];  // sorted by communicator, then collective: allgather before allreduce
  EXPECT_EQ(ag.at("communicator"), "0000000000000abc");
  EXPECT_EQ(ag.at("collective"), "allgather");
  EXPECT_EQ(ag.at("size_bytes"), 1 << 20);
  EXPECT_EQ(ag.at("algorithm"), "Ring");
  EXPECT_EQ(ag.at("protocol"), "Simple");
  EXPECT_EQ(ag.at("channels"), 8);
  EXPECT_EQ(ag.at("calls"), 10);
  EXPECT_EQ(ag.at("nccl_choice"), true);
  EXPECT_DOUBLE_EQ(ag.at("min_us").get<double>(), 10.0);
  EXPECT_NEAR(ag.at("median_us").get<double>(), 50.0, 50.0 * 0.032);
  EXPECT_NEAR(ag.at("p90_us").get<double>(), 90.0, 90.0 * 0.032);
  const json& ar = j.at("rows")[1];
  EXPECT_EQ(ar.at("collective"), "allreduce");
  EXPECT_EQ(ar.at("algorithm"), "Tree");
  EXPECT_EQ(ar.at("protocol"), "LL");
  EXPECT_DOUBLE_EQ(ar.at("min_us").get<double>(), 7.0);
  EXPECT_EQ(ar.at("nccl_choice"), false);  // NCCL picked Ring/LL for that size, Tree/LL was measured
  EXPECT_EQ(j.at("counters").at("choice_full"), 0);
  const CliResult text = cache("measurements");
  ASSERT_EQ(text.rc, 0) << text.all();
  for (const char* s : {"0000000000000abc", "allgather", "Ring", "Simple", "3 collectives without GPU stamps"}) {
    EXPECT_TRUE(contains(text.out, s)) << s << text.out;
  }
  // The marker column: on the allgather's row, not on the allreduce's.
  std::istringstream lines(text.out);
  int marked = 0;
  for (std::string line; std::getline(lines, line);) {
    if (contains(line, "allgather")) {
      EXPECT_EQ(line.back(), '*') << line;
    }
    if (contains(line, "allreduce")) {
      EXPECT_NE(line.back(), '*') << line;
    }
    marked += !line.empty() && line.back() == '*' ? 1 : 0;
  }
  EXPECT_EQ(marked, 1) << text.out;
  EXPECT_TRUE(contains(text.out, "NCCL's own choice")) << text.out;
}

TEST_F(CacheCli, VerifyNamesACorruptedSlot) {
  const CliResult pub = cache(fmt::format("publish {}", run_.string()));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  const Published p = published(pub);
  ASSERT_LT(p.slot, sc::kPlanSlots);
  // One byte of the first entry of the current slot: the slot's checksum no longer matches.
  const std::size_t offset = offsetof(sc::Segment, slots) + p.slot * sizeof(sc::PlanSlot) +
                             offsetof(sc::PlanSlot, entries) + offsetof(sc::PlanEntry, nativeUs);
  const int fd = ::open(segmentFile(ns_).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);

  const CliResult verify = cache("verify");
  EXPECT_EQ(verify.rc, 1) << verify.all();
  EXPECT_TRUE(contains(verify.all(), fmt::format("slot {}", p.slot))) << verify.all();
  EXPECT_TRUE(contains(verify.all(), "problem")) << verify.all();
  // `show` says so too and does not use the torn plan.
  const CliResult show = cache("show --json");
  EXPECT_EQ(show.rc, 1) << show.all();
  const json j = json::parse(show.out);
  EXPECT_TRUE(j.at("entries").empty()) << j.dump(2);
  EXPECT_FALSE(j.at("problems").empty()) << j.dump(2);
}

TEST_F(CacheCli, APlanWithABrokenScheduleIsRefusedAndNothingIsPublished) {
  const fs::path bad = scheduleOf(2, "schedule_json");
  breakSchedule(bad);
  const CliResult refused = cache(fmt::format("publish {}", run_.string()));
  EXPECT_EQ(refused.rc, 1) << refused.all();
  EXPECT_TRUE(contains(refused.err, bad.string())) << refused.err;
  EXPECT_TRUE(contains(refused.err, "collectives[0].entries[2].best.schedule_json")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "verifier")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "nothing was published")) << refused.err;
  EXPECT_FALSE(fs::exists(segmentFile(ns_))) << "a refused plan created the segment";

  // Over a good plan: the good one stays current.
  const fs::path good = dir_ / "good";
  fs::copy(shared_ / "run", good, fs::copy_options::recursive);
  const CliResult pub = cache(fmt::format("publish {}", good.string()));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  const std::string hash = published(pub).hash;
  EXPECT_EQ(cache(fmt::format("publish {}", run_.string())).rc, 1);
  EXPECT_EQ(showJson().at("current").at("hash"), hash);

  // --no-verify publishes it; `cache verify` then finds the schedule.
  const CliResult unverified = cache(fmt::format("publish {} --no-verify", run_.string()));
  ASSERT_EQ(unverified.rc, 0) << unverified.all();
  EXPECT_NE(published(unverified).hash, hash) << "the broken file's content is part of the plan";
  const CliResult verify = cache("verify");
  EXPECT_EQ(verify.rc, 1) << verify.all();
  EXPECT_TRUE(contains(verify.out, bad.string())) << verify.out;
  EXPECT_TRUE(contains(verify.out, "verifier")) << verify.out;
}

TEST_F(CacheCli, VerifyFindsAScheduleChangedOrRemovedAfterPublishing) {
  ASSERT_EQ(cache(fmt::format("publish {}", run_.string())).rc, 0);
  // Still proven, but not the file that was published.
  const fs::path js = scheduleOf(0, "schedule_json");
  std::ofstream(js, std::ios::binary | std::ios::app) << "\n";
  const CliResult changed = cache("verify");
  EXPECT_EQ(changed.rc, 1) << changed.all();
  EXPECT_TRUE(contains(changed.out, js.string())) << changed.out;
  EXPECT_TRUE(contains(changed.out, "changed since")) << changed.out;

  const fs::path xml = scheduleOf(1, "schedule_xml");
  fs::remove(xml);
  const CliResult missing = cache("verify");
  EXPECT_EQ(missing.rc, 1) << missing.all();
  EXPECT_TRUE(contains(missing.out, xml.string() + ": ")) << missing.out;
  EXPECT_TRUE(contains(missing.out, "no such file")) << missing.out;
  EXPECT_TRUE(contains(missing.out, "2 problems")) << missing.out;
}

TEST_F(CacheCli, TheNamespaceComesFromTheEnvironment) {
  const CliResult pub = run(fmt::format("cache publish {}", run_.string()), fmt::format("OPTIFLOW_NAMESPACE={}", ns_));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  EXPECT_TRUE(fs::exists(segmentFile(ns_)));
  EXPECT_TRUE(contains(pub.out, segmentFile(ns_).string())) << pub.out;
  // --namespace wins over the environment.
  const CliResult other =
      run(fmt::format("cache show --namespace {}-other", ns_), fmt::format("OPTIFLOW_NAMESPACE={}", ns_));
  EXPECT_EQ(other.rc, 1);
  EXPECT_TRUE(contains(other.err, ns_ + "-other")) << other.err;
  EXPECT_FALSE(fs::exists(segmentFile(ns_ + "-other")));
}

TEST_F(CacheCli, GroupMakesTheCacheReadableByTheGroup) {
  const group* g = ::getgrgid(::getegid());
  if (g == nullptr) GTEST_SKIP() << "the effective group has no name";
  const CliResult pub = cache(fmt::format("publish {} --group {}", run_.string(), g->gr_name));
  ASSERT_EQ(pub.rc, 0) << pub.all();
  struct stat st {};
  ASSERT_EQ(::stat(segmentFile(ns_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, g->gr_gid);
}

TEST_F(CacheCli, BadInputIsRefusedWithTwoAndAMessage) {
  const CliResult badNs = run(fmt::format("cache show --namespace bad/ns"));
  EXPECT_EQ(badNs.rc, 2) << badNs.all();
  EXPECT_TRUE(contains(badNs.err, "bad/ns")) << badNs.err;
  const CliResult badEnv = run("cache show", "OPTIFLOW_NAMESPACE='has space'");
  EXPECT_EQ(badEnv.rc, 2) << badEnv.all();
  EXPECT_TRUE(contains(badEnv.err, "OPTIFLOW_NAMESPACE")) << badEnv.err;
  const CliResult longNs = run(fmt::format("cache publish {} --namespace {}", run_.string(), std::string(65, 'a')));
  EXPECT_EQ(longNs.rc, 2) << longNs.all();

  const CliResult badGroup = cache(fmt::format("publish {} --group no-such-group-optiflow", run_.string()));
  EXPECT_EQ(badGroup.rc, 2) << badGroup.all();
  EXPECT_TRUE(contains(badGroup.err, "no-such-group-optiflow")) << badGroup.err;

  fs::create_directories(dir_ / "empty");
  const CliResult noPlan = cache(fmt::format("publish {}", (dir_ / "empty").string()));
  EXPECT_EQ(noPlan.rc, 2) << noPlan.all();
  EXPECT_TRUE(contains(noPlan.err, (dir_ / "empty" / "plan.json").string())) << noPlan.err;

  std::ofstream(run_ / "plan.json", std::ios::binary) << R"({"format": "optiflow-plan", "version": 7})";
  const CliResult badVersion = cache(fmt::format("publish {}", run_.string()));
  EXPECT_EQ(badVersion.rc, 2) << badVersion.all();
  EXPECT_TRUE(contains(badVersion.err, "plan.json:1:") && contains(badVersion.err, ": version: expected 1"))
      << badVersion.err;

  EXPECT_EQ(cache("publish").rc, 2) << "PLAN_DIR is required";
  EXPECT_EQ(run("cache").rc, 2);
  EXPECT_FALSE(fs::exists(segmentFile(ns_))) << "bad input created the segment";
}

TEST_F(CacheCli, AnAbsentCacheIsReportedAndNotCreated) {
  const CliResult show = cache("show");
  EXPECT_EQ(show.rc, 1);
  EXPECT_TRUE(contains(show.err, fmt::format("no schedule cache for namespace {} ({}): publish a plan with "
                                             "`optiflow cache publish PLAN_DIR`",
                                             ns_, segmentFile(ns_).string())))
      << show.err;
  const CliResult verify = cache("verify");
  EXPECT_EQ(verify.rc, 1) << verify.all();
  EXPECT_TRUE(contains(verify.out, "no schedule cache")) << verify.out;
  const CliResult clear = cache("clear");
  EXPECT_EQ(clear.rc, 0) << clear.all();
  EXPECT_TRUE(contains(clear.out, "nothing to clear")) << clear.out;
  const CliResult remove = cache("clear --remove");
  EXPECT_EQ(remove.rc, 0) << remove.all();
  EXPECT_FALSE(fs::exists(segmentFile(ns_)));
}

TEST_F(CacheCli, AGarbageSegmentIsRefusedUntilRemoved) {
  {
    std::ofstream garbage(segmentFile(ns_), std::ios::binary);
    garbage << std::string(5000, 'x');
  }
  fs::permissions(segmentFile(ns_), fs::perms::owner_read | fs::perms::owner_write);
  const std::string hint = fmt::format("optiflow cache clear --remove --namespace {}", ns_);
  const CliResult show = cache("show");
  EXPECT_EQ(show.rc, 1);
  EXPECT_TRUE(contains(show.err, hint)) << show.err;
  const CliResult verify = cache("verify");
  EXPECT_EQ(verify.rc, 1);
  EXPECT_TRUE(contains(verify.out, "problem: ")) << verify.out;
  const CliResult publish = cache(fmt::format("publish {}", run_.string()));
  EXPECT_EQ(publish.rc, 1) << publish.all();
  EXPECT_TRUE(contains(publish.err, hint)) << publish.err;
  EXPECT_EQ(fs::file_size(segmentFile(ns_)), 5000u) << "the segment was overwritten";
  ASSERT_EQ(cache("clear --remove").rc, 0);
  EXPECT_FALSE(fs::exists(segmentFile(ns_)));
  EXPECT_EQ(cache(fmt::format("publish {}", run_.string())).rc, 0);
}

// A segment an older build made (layout version 1: no records of NCCL's choices) is refused by every command, with
// the way out, until `clear --remove` deletes it; the next publish creates a version-2 segment.
TEST_F(CacheCli, AnOlderLayoutVersionIsRefusedUntilRemoved) {
  ASSERT_EQ(cache(fmt::format("publish {}", run_.string())).rc, 0);
  {
    const int fd = ::open(segmentFile(ns_).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const std::uint32_t version = 1;
    ASSERT_EQ(::pwrite(fd, &version, sizeof(version), offsetof(sc::SegmentHeader, layoutVersion)),
              static_cast<ssize_t>(sizeof(version)));
    ::close(fd);
  }
  const std::string hint = fmt::format("optiflow cache clear --remove --namespace {}", ns_);
  const CliResult measurements = cache("measurements");
  EXPECT_EQ(measurements.rc, 1) << measurements.all();
  EXPECT_TRUE(contains(measurements.err, "layout version 1, this build expects 2")) << measurements.err;
  EXPECT_TRUE(contains(measurements.err, hint)) << measurements.err;
  const CliResult publish = cache(fmt::format("publish {}", run_.string()));
  EXPECT_EQ(publish.rc, 1) << publish.all();
  EXPECT_TRUE(contains(publish.err, hint)) << publish.err;
  ASSERT_EQ(cache("clear --remove").rc, 0);
  EXPECT_FALSE(fs::exists(segmentFile(ns_)));
  ASSERT_EQ(cache(fmt::format("publish {}", run_.string())).rc, 0);
  EXPECT_EQ(fs::file_size(segmentFile(ns_)), sizeof(sc::Segment));
  EXPECT_EQ(cache("measurements --json").rc, 0);
}

}  // namespace
