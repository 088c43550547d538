// A run directory's plan.json as the schedule cache takes it (synth/cache_plan.h): the decisions and schedule files
// of every entry, the schedule ids, and the errors for every way plan.json or a schedule it names can be wrong
// (each naming the file and the field, never an exception). The run directory is built here: ring All-Gather from
// the gallery compiled for one DGX A100 at 4KiB and 1MiB.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/synth/cache_plan.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/pipeline.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::synth {
namespace {

namespace fs = std::filesystem;
namespace sc = optiflow::schedcache;
using nlohmann::json;

constexpr std::uint64_t kMaxBytes = std::numeric_limits<std::uint64_t>::max();

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeFile(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The gallery's ring All-Gather compiled for one DGX A100 at `size`.
core::Schedule ringAllGather(std::uint64_t size) {
  auto topo = core::presetTopology("dgx-a100");
  if (!topo) throw std::runtime_error(topo.error().str());
  for (const EmbeddedProgram& g : galleryPrograms()) {
    if (g.file != "allgather_ring.ofl") continue;
    const Frontend f = parseAndExpand(g.text, g.file, *topo);
    if (!f.ok()) throw std::runtime_error(f.message);
    compiler::CompileOptions o;
    o.sizeBytes = size;
    auto r = compiler::compile(*f.intent, *topo, o);
    if (!r) throw std::runtime_error(r.error().str());
    return std::move(r).value().schedule;
  }
  throw std::runtime_error("allgather_ring.ofl is not in the gallery");
}

// The schedule texts, compiled once for the whole test program.
struct Schedules {
  std::string json4k, xml4k, json1m, xml1m;
};
const Schedules& schedules() {
  static const Schedules s = [] {
    const core::Schedule a = ringAllGather(4096);
    const core::Schedule b = ringAllGather(1 << 20);
    return Schedules{compiler::formatSchedule(a, compiler::ScheduleFormat::Json),
                     compiler::formatSchedule(a, compiler::ScheduleFormat::MscclXml),
                     compiler::formatSchedule(b, compiler::ScheduleFormat::Json),
                     compiler::formatSchedule(b, compiler::ScheduleFormat::MscclXml)};
  }();
  return s;
}

// A plan as `optiflow synthesize` writes it (synth/plan.h), plus an All-Reduce collective without schedules:
//   allgather/8/1: [0, 1MiB) Ring/LL/2ch + 4KiB schedules, [1MiB, 64MiB) Ring/Simple/8ch chunk 128KiB + 1MiB
//   schedules, [64MiB, inf) nothing timed ("n/a"), best null; allreduce/8/1: [0, inf) Tree/LL128/4ch, best null.
json samplePlan() {
  auto native = [](const char* alg, const char* proto, int ch, double t) {
    return json{{"algorithm", alg}, {"protocol", proto}, {"channels", ch}, {"time_us", t}};
  };
  auto best = [](const char* stem, double t) {
    return json{{"candidate", "r0c0"},
                {"program", "ring"},
                {"config", "LL/1ch/1sl"},
                {"protocol", "LL"},
                {"channels", 1},
                {"time_us", t},
                {"program_file", "programs/r0c0.ofl"},
                {"schedule_json", fmt::format("schedules/{}.json", stem)},
                {"schedule_xml", fmt::format("schedules/{}.xml", stem)}};
  };
  json e0 = {{"size_bytes", 4096},
             {"min_bytes", 0},
             {"max_bytes", (1 << 20) - 1},
             {"bound_us", 1.5},
             {"effective_bound_us", 1.75},
             {"nccl", native("Ring", "LL", 1, 10.5)},
             {"native", native("Ring", "LL", 2, 9.5)},
             {"best", best("allgather-4KiB", 4.25)}};
  json n1 = native("Ring", "Simple", 8, 120.0);
  n1["chunk_bytes"] = 131072;
  json e1 = {{"size_bytes", 1 << 20},       {"min_bytes", 1 << 20},
             {"max_bytes", (64 << 20) - 1}, {"bound_us", 50.0},
             {"effective_bound_us", 55.0},  {"nccl", native("Ring", "LL128", 4, 130.0)},
             {"native", std::move(n1)},     {"best", best("allgather-1MiB", 100.0)}};
  json e2 = {{"size_bytes", 64 << 20},         {"min_bytes", 64 << 20},
             {"max_bytes", kMaxBytes},         {"bound_us", 3000.0},
             {"effective_bound_us", 3100.0},   {"nccl", native("n/a", "", 0, 0)},
             {"native", native("", "", 0, 0)}, {"best", nullptr}};
  json r0 = {{"size_bytes", 4096},
             {"min_bytes", 0},
             {"max_bytes", kMaxBytes},
             {"bound_us", 2.0},
             {"effective_bound_us", 2.0},
             {"nccl", native("Ring", "LL", 2, 20.0)},
             {"native", native("Tree", "LL128", 4, 15.0)},
             {"best", nullptr}};
  return {{"format", "optiflow-plan"},
          {"version", 1},
          {"optiflow_version", "0.1.0"},
          {"topology", "dgx-a100"},
          {"ranks", 8},
          {"nodes", 1},
          {"gpus_per_node", 8},
          {"proposer", "builtin"},
          {"evaluator", "simulator"},
          {"seed", 1},
          {"rounds", 1},
          {"candidates", 2},
          {"elapsed_s", 1.0},
          {"stop_reason", "rounds"},
          {"collectives",
           {{{"collective", "allgather"}, {"ranks", 8}, {"nodes", 1}, {"entries", {e0, e1, e2}}},
            {{"collective", "allreduce"}, {"ranks", 8}, {"nodes", 1}, {"entries", {r0}}}}}};
}

class CachePlan : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("optiflow-cache-plan-{}-{}", ::getpid(),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    run_ = root_ / "run";
    fs::create_directories(run_ / "schedules");
    const Schedules& s = schedules();
    writeFile(run_ / "schedules" / "allgather-4KiB.json", s.json4k);
    writeFile(run_ / "schedules" / "allgather-4KiB.xml", s.xml4k);
    writeFile(run_ / "schedules" / "allgather-1MiB.json", s.json1m);
    writeFile(run_ / "schedules" / "allgather-1MiB.xml", s.xml1m);
    writePlan(samplePlan());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void writePlan(const json& plan) const { writeFile(planFile(), plan.dump(2)); }
  fs::path planFile() const { return run_ / "plan.json"; }

  fs::path root_;
  fs::path run_;
};

TEST_F(CachePlan, ScheduleFileIdIsCrc64XzAndNeverZero) {
  EXPECT_EQ(scheduleFileId("123456789"), 0x995DC9BBDF1939FAULL);  // the CRC-64/XZ check value
  EXPECT_NE(scheduleFileId(""), 0u);
  EXPECT_NE(scheduleFileId("a"), scheduleFileId("b"));
}

TEST_F(CachePlan, EveryEntryBecomesAnItem) {
  auto plan = loadPlanForCache(run_, true);
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  EXPECT_EQ(plan->source, run_.string());
  ASSERT_EQ(plan->items.size(), 4u);
  const sc::PlanItem& a = plan->items[0];
  EXPECT_EQ(a.coll, core::Collective::AllGather);
  EXPECT_EQ(a.nRanks, 8u);
  EXPECT_EQ(a.nNodes, 1u);
  EXPECT_EQ(a.minBytes, 0u);
  EXPECT_EQ(a.maxBytes, (1u << 20) - 1);
  EXPECT_EQ(a.algorithm, core::Algorithm::Ring);
  EXPECT_EQ(a.protocol, core::Protocol::LL);
  EXPECT_EQ(a.nChannels, 2);
  EXPECT_EQ(a.chunkBytes, 0u);  // absent: NCCL decides
  EXPECT_FLOAT_EQ(a.nativeUs, 9.5f);
  EXPECT_FLOAT_EQ(a.ncclUs, 10.5f);
  EXPECT_FLOAT_EQ(a.bestUs, 4.25f);
  EXPECT_FLOAT_EQ(a.boundUs, 1.5f);
  EXPECT_EQ(a.jsonPath, (run_ / "schedules" / "allgather-4KiB.json").string());
  EXPECT_EQ(a.xmlPath, (run_ / "schedules" / "allgather-4KiB.xml").string());
  EXPECT_EQ(a.scheduleId, scheduleFileId(schedules().json4k));
  EXPECT_NE(a.scheduleId, 0u);

  const sc::PlanItem& b = plan->items[1];
  EXPECT_EQ(b.minBytes, 1u << 20);
  EXPECT_EQ(b.algorithm, core::Algorithm::Ring);
  EXPECT_EQ(b.protocol, core::Protocol::Simple);
  EXPECT_EQ(b.nChannels, 8);
  EXPECT_EQ(b.chunkBytes, 131072u);
  EXPECT_EQ(b.scheduleId, scheduleFileId(schedules().json1m));
  EXPECT_NE(b.scheduleId, a.scheduleId);

  // Nothing timed and no synthesized schedule: an entry without a decision.
  const sc::PlanItem& c = plan->items[2];
  EXPECT_EQ(c.maxBytes, kMaxBytes);
  EXPECT_FALSE(c.algorithm.has_value());
  EXPECT_FALSE(c.protocol.has_value());
  EXPECT_EQ(c.nChannels, 0);
  EXPECT_EQ(c.scheduleId, 0u);
  EXPECT_TRUE(c.jsonPath.empty());
  EXPECT_TRUE(c.xmlPath.empty());
  EXPECT_FLOAT_EQ(c.bestUs, 0.f);
  EXPECT_FLOAT_EQ(c.boundUs, 3000.f);

  const sc::PlanItem& d = plan->items[3];
  EXPECT_EQ(d.coll, core::Collective::AllReduce);
  EXPECT_EQ(d.algorithm, core::Algorithm::Tree);
  EXPECT_EQ(d.protocol, core::Protocol::LL128);
  EXPECT_EQ(d.nChannels, 4);
  EXPECT_TRUE(sc::validatePlan(*plan).empty()) << sc::validatePlan(*plan);
}

TEST_F(CachePlan, TheSourceIsAbsoluteAndNormalised) {
  // A trailing slash and a detour through ".." name the same directory; the hash of the decisions is the same.
  auto direct = loadPlanForCache(run_, false);
  ASSERT_TRUE(direct.ok()) << direct.error().str();
  auto detour = loadPlanForCache(fs::path(run_.string() + "/") / ".." / "run" / "", false);
  ASSERT_TRUE(detour.ok()) << detour.error().str();
  EXPECT_EQ(detour->source, run_.string());
  EXPECT_EQ(detour->items[0].jsonPath, direct->items[0].jsonPath);
  EXPECT_EQ(sc::contentHash(*detour), sc::contentHash(*direct));
  EXPECT_EQ(planFileFor(fs::path(run_.string() + "/")), planFile());
}

TEST_F(CachePlan, NamesThatTheCacheDoesNotKnowAreNoDecision) {
  struct Case {
    std::function<void(json&)> edit;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[](json& e) { e["native"]["algorithm"] = "Bogus"; }, "unknown algorithm"},
      {[](json& e) { e["native"]["algorithm"] = "n/a"; }, "n/a"},
      {[](json& e) { e["native"]["protocol"] = "Fancy"; }, "unknown protocol"},
      {[](json& e) { e["native"]["time_us"] = 0; }, "time 0"},
      {[](json& e) { e["native"] = nullptr; }, "native null"},
      {[](json& e) { e.erase("native"); }, "native missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json plan = samplePlan();
    c.edit(plan["collectives"][0]["entries"][0]);
    writePlan(plan);
    auto loaded = loadPlanForCache(run_, true);
    ASSERT_TRUE(loaded.ok()) << loaded.error().str();
    const sc::PlanItem& it = loaded->items[0];
    EXPECT_FALSE(it.algorithm.has_value());
    EXPECT_FALSE(it.protocol.has_value());
    EXPECT_EQ(it.nChannels, 0);
    EXPECT_EQ(it.chunkBytes, 0u);
    // The synthesized schedule stays: `cache show` and `verify` still list it.
    EXPECT_EQ(it.scheduleId, scheduleFileId(schedules().json4k));
  }
}

TEST_F(CachePlan, AMalformedPlanIsAnErrorNamingTheFileAndTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string says;  // the message starts with this
  };
  auto entry = [](json& p, int e) -> json& { return p["collectives"][0]["entries"][e]; };
  const std::vector<Case> cases = {
      {[](json& p) { p["format"] = "optiflow-run"; }, "format: expected \"optiflow-plan\""},
      {[](json& p) { p.erase("format"); }, "format: missing"},
      {[](json& p) { p["format"] = 1; }, "format: expected a string"},
      {[](json& p) { p["version"] = 2; }, "version: expected 1"},
      {[](json& p) { p["version"] = "1"; }, "version: expected 1"},
      {[](json& p) { p.erase("version"); }, "version: expected 1 (the plan version this build reads), missing"},
      {[](json& p) { p.erase("collectives"); }, "collectives: missing"},
      {[](json& p) { p["collectives"] = json::object(); }, "collectives: expected an array"},
      {[](json& p) { p["collectives"][1] = 5; }, "collectives[1]: expected an object"},
      {[](json& p) { p["collectives"][0].erase("collective"); }, "collectives[0].collective: missing"},
      {[](json& p) { p["collectives"][0]["collective"] = "alltoall"; }, "collectives[0].collective: expected"},
      {[](json& p) { p["collectives"][1]["collective"] = 4; }, "collectives[1].collective: expected a string"},
      {[](json& p) { p["collectives"][0]["ranks"] = "8"; }, "collectives[0].ranks: expected an integer"},
      {[](json& p) { p["collectives"][0]["ranks"] = 8.5; }, "collectives[0].ranks: expected an integer"},
      {[](json& p) { p["collectives"][0]["ranks"] = 0; }, "collectives[0].ranks: expected at least 1"},
      {[](json& p) { p["collectives"][0]["ranks"] = 1ull << 33; }, "collectives[0].ranks: expected an integer"},
      {[](json& p) { p["collectives"][0]["nodes"] = -1; }, "collectives[0].nodes: expected an integer"},
      {[](json& p) { p["collectives"][0]["nodes"] = 9; }, "collectives[0].nodes: expected 1 to 8"},
      {[](json& p) { p["collectives"][0].erase("entries"); }, "collectives[0].entries: missing"},
      {[&](json& p) { entry(p, 1) = "4KiB"; }, "collectives[0].entries[1]: expected an object"},
      {[&](json& p) { entry(p, 0).erase("min_bytes"); }, "collectives[0].entries[0].min_bytes: missing"},
      {[&](json& p) { entry(p, 1)["min_bytes"] = -1; }, "collectives[0].entries[1].min_bytes: expected an integer"},
      {[&](json& p) { entry(p, 1)["max_bytes"] = 4096.5; }, "collectives[0].entries[1].max_bytes: expected an integer"},
      {[&](json& p) { entry(p, 1)["max_bytes"] = 4096; }, "collectives[0].entries[1].max_bytes: expected at least"},
      {[&](json& p) { entry(p, 2)["bound_us"] = "fast"; },
       "collectives[0].entries[2].bound_us: expected a non-negative number"},
      {[&](json& p) { entry(p, 2)["bound_us"] = -3; }, "collectives[0].entries[2].bound_us: expected a non-negative"},
      {[&](json& p) { entry(p, 0).erase("bound_us"); }, "collectives[0].entries[0].bound_us: missing"},
      {[&](json& p) { entry(p, 0)["nccl"] = "Ring"; }, "collectives[0].entries[0].nccl: expected an object or null"},
      {[&](json& p) { entry(p, 0)["nccl"]["time_us"] = nullptr; },
       "collectives[0].entries[0].nccl.time_us: expected a non-negative number"},
      {[&](json& p) { entry(p, 0)["native"] = 3; }, "collectives[0].entries[0].native: expected an object or null"},
      {[&](json& p) { entry(p, 0)["native"]["algorithm"] = 1; },
       "collectives[0].entries[0].native.algorithm: expected a string"},
      {[&](json& p) { entry(p, 0)["native"].erase("protocol"); }, "collectives[0].entries[0].native.protocol: missing"},
      {[&](json& p) { entry(p, 0)["native"]["channels"] = -1; },
       "collectives[0].entries[0].native.channels: expected an integer"},
      {[&](json& p) { entry(p, 0)["native"]["channels"] = 1ull << 31; },
       "collectives[0].entries[0].native.channels: expected an integer"},
      {[&](json& p) { entry(p, 0)["native"].erase("time_us"); }, "collectives[0].entries[0].native.time_us: missing"},
      {[&](json& p) { entry(p, 0)["native"]["time_us"] = true; },
       "collectives[0].entries[0].native.time_us: expected a non-negative number"},
      {[&](json& p) { entry(p, 0)["native"]["chunk_bytes"] = "big"; },
       "collectives[0].entries[0].native.chunk_bytes: expected an integer"},
      {[&](json& p) { entry(p, 0)["best"] = json::array(); }, "collectives[0].entries[0].best: expected an object"},
      {[&](json& p) { entry(p, 0)["best"]["schedule_json"] = 7; },
       "collectives[0].entries[0].best.schedule_json: expected a string"},
      {[&](json& p) { entry(p, 0)["best"]["schedule_xml"] = ""; },
       "collectives[0].entries[0].best.schedule_xml: expected a file name"},
      {[&](json& p) { entry(p, 1)["best"].erase("time_us"); }, "collectives[0].entries[1].best.time_us: missing"},
      // Overlapping ranges of one collective: the cache's own validation, still naming plan.json.
      {[&](json& p) { entry(p, 1)["min_bytes"] = 0; }, "cannot be cached: "},
      {[&](json& p) { entry(p, 0)["trials"] = 3; }, "collectives[0].entries[0].trials: expected an object or null"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"candidates", json::array()}};
       },
       "collectives[0].entries[0].trials.calls: missing"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 5}, {"candidates", {{{"algorithm", "Warp"}}}}};
       },
       "collectives[0].entries[0].trials.candidates[0]: expected an NCCL algorithm name"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 5}, {"candidates", {{{"algorithm", "Ring"}, {"protocol", "Fast"}}}}};
       },
       "collectives[0].entries[0].trials.candidates[0]: expected LL, LL128 or Simple"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", -1}, {"candidates", json::array()}};
       },
       "collectives[0].entries[0].trials.calls: expected an integer"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 0}, {"candidates", json::array()}};
       },
       "collectives[0].entries[0].trials.calls: expected an integer in [1, 1000]"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 1001}, {"candidates", json::array()}};
       },
       "collectives[0].entries[0].trials.calls: expected an integer in [1, 1000]"},
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 5}, {"candidates", {{{"algorithm", nullptr}, {"channels", 4}}}}};
       },
       "collectives[0].entries[0].trials.candidates[0].channels: NCCL's own choice (algorithm null) takes no"},
      // Trials without NCCL's own choice: the cache's own validation.
      {[&](json& p) {
         entry(p, 0)["trials"] = {{"calls", 5}, {"candidates", {{{"algorithm", "Ring"}, {"protocol", "LL"}}}}};
       },
       "cannot be cached: "},
      {[&](json& p) { entry(p, 0)["native"]["measured"] = "yes"; },
       "collectives[0].entries[0].native.measured: expected"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    json plan = samplePlan();
    c.edit(plan);
    writePlan(plan);
    for (bool verify : {false, true}) {
      auto loaded = loadPlanForCache(run_, verify);
      ASSERT_FALSE(loaded.ok()) << plan.dump();
      EXPECT_EQ(loaded.error().file, planFile().string());
      EXPECT_EQ(loaded.error().message.rfind(c.says, 0), 0u) << loaded.error().message;
      EXPECT_TRUE(contains(loaded.error().str(), "plan.json")) << loaded.error().str();
    }
  }
}

TEST_F(CachePlan, TrialsAndMeasuredTimesReachTheCache) {
  json plan = samplePlan();
  json& e0 = plan["collectives"][0]["entries"][0];
  e0["trials"] = {
      {"calls", 12},
      {"candidates", {{{"algorithm", nullptr}}, {{"algorithm", "Ring"}, {"protocol", "LL"}, {"channels", 2}}}}};
  e0["native"]["measured"] = true;
  e0["native"]["simulated_us"] = 9.5;
  json& e1 = plan["collectives"][0]["entries"][1];
  e1["native"] = nullptr;  // NCCL's own choice measured fastest: no decision, its measured time applies
  e1["nccl"]["measured"] = true;
  writePlan(plan);
  auto loaded = loadPlanForCache(run_, false);
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  const sc::PlanItem& it0 = loaded->items[0];
  ASSERT_EQ(it0.trials.size(), 2u);
  EXPECT_FALSE(it0.trials[0].algorithm);
  EXPECT_EQ(it0.trials[1].algorithm, core::Algorithm::Ring);
  EXPECT_EQ(it0.trials[1].protocol, core::Protocol::LL);
  EXPECT_EQ(it0.trials[1].nChannels, 2);
  EXPECT_EQ(it0.trialCalls, 12u);
  EXPECT_TRUE(it0.measured);
  const sc::PlanItem& it1 = loaded->items[1];
  EXPECT_FALSE(it1.algorithm);
  EXPECT_TRUE(it1.measured);
  EXPECT_FALSE(loaded->items[2].measured);
  EXPECT_TRUE(loaded->items[2].trials.empty());

  // The run directory's reader and writer keep both.
  auto parsed = synth::readPlan(planFile());
  ASSERT_TRUE(parsed.ok()) << parsed.error().str();
  const std::string again = synth::formatPlan(*parsed);
  auto reparsed = synth::parsePlan(again, "again");
  ASSERT_TRUE(reparsed.ok()) << reparsed.error().str();
  const synth::PlanEntry& r0 = reparsed->collectives[0].entries[0];
  ASSERT_EQ(r0.trials.size(), 2u);
  EXPECT_EQ(r0.trials[0], synth::PlanTrial{});
  EXPECT_EQ(r0.trials[1].algorithm, "Ring");
  EXPECT_EQ(r0.trialCalls, 12);
  EXPECT_TRUE(r0.native->measured);
  EXPECT_DOUBLE_EQ(r0.native->simulatedUs, 9.5);
  EXPECT_TRUE(reparsed->collectives[0].entries[1].nccl->measured);
  EXPECT_EQ(synth::formatPlan(*reparsed), again);
}

TEST_F(CachePlan, TextThatIsNotAPlanIsAnErrorWithItsPosition) {
  struct Case {
    std::string text;
    std::string says;
    int line;
  };
  const std::vector<Case> cases = {
      {"{\"format\": \"optiflow-plan\",\n \"version\": 1,\n \"collectives\": [}\n", "expected JSON", 3},
      {"", "expected JSON", 1},
      {"[1, 2]", "expected a JSON object", 1},
      {"\"optiflow-plan\"", "expected a JSON object", 1},
      {"null", "expected a JSON object", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    writeFile(planFile(), c.text);
    auto loaded = loadPlanForCache(run_, true);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.error().file, planFile().string());
    EXPECT_EQ(loaded.error().line, c.line) << loaded.error().str();
    EXPECT_TRUE(contains(loaded.error().message, c.says)) << loaded.error().message;
  }
}

TEST_F(CachePlan, AMissingPlanOrDirectoryIsAnError) {
  fs::remove(planFile());
  auto noPlan = loadPlanForCache(run_, false);
  ASSERT_FALSE(noPlan.ok());
  EXPECT_EQ(noPlan.error().file, planFile().string());
  EXPECT_TRUE(contains(noPlan.error().message, "no such file")) << noPlan.error().message;

  auto noDir = loadPlanForCache(root_ / "no-such-run", false);
  ASSERT_FALSE(noDir.ok());
  EXPECT_EQ(noDir.error().file, (root_ / "no-such-run" / "plan.json").string());
  EXPECT_TRUE(contains(noDir.error().message, "not a directory")) << noDir.error().message;
}

// A schedule the verifier does not prove: the compiled 4KiB ring with rank 0's first thread block missing its last
// step (a send or receive left without its partner).
std::string brokenSchedule() {
  json s = json::parse(schedules().json4k);
  json& steps = s["ranks"][0]["threadblocks"][0]["steps"];
  steps.erase(steps.size() - 1);
  return s.dump(1);
}

TEST_F(CachePlan, AScheduleThatFailsTheVerifierIsRefusedWhenVerifying) {
  const fs::path bad = run_ / "schedules" / "allgather-1MiB.json";
  writeFile(bad, brokenSchedule());
  ASSERT_TRUE(compiler::loadSchedule(bad.string()).ok()) << "the broken schedule must still parse";
  auto loaded = loadPlanForCache(run_, true);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().file, bad.string());
  const std::string& m = loaded.error().message;
  EXPECT_TRUE(contains(m, "collectives[0].entries[1].best.schedule_json")) << m;
  EXPECT_TRUE(contains(m, "verifier")) << m;
  EXPECT_TRUE(contains(m, "first: ")) << m;
  EXPECT_TRUE(contains(m, "(1 error)") || contains(m, " errors)")) << m;
  EXPECT_TRUE(contains(loaded.error().str(), bad.string())) << loaded.error().str();
  // A mistake in plan.json is reported first, wherever it is: it is bad input, the schedule is a wrong schedule.
  json plan = samplePlan();
  plan["collectives"][1]["entries"][0]["bound_us"] = "slow";
  writePlan(plan);
  auto both = loadPlanForCache(run_, true);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().file, planFile().string());
  EXPECT_EQ(both.error().message.rfind("collectives[1].entries[0].bound_us:", 0), 0u) << both.error().message;
  writePlan(samplePlan());
  // Without verification the plan loads, and the schedule id is the broken file's.
  auto unverified = loadPlanForCache(run_, false);
  ASSERT_TRUE(unverified.ok()) << unverified.error().str();
  EXPECT_EQ(unverified->items[1].scheduleId, scheduleFileId(slurp(bad)));
}

TEST_F(CachePlan, AnXmlScheduleIsVerifiedToo) {
  const fs::path bad = run_ / "schedules" / "allgather-4KiB.xml";
  writeFile(bad, "<algo name=\"broken\" nchannels=\"1\"");
  auto loaded = loadPlanForCache(run_, true);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().file, bad.string());
  EXPECT_TRUE(contains(loaded.error().message, "collectives[0].entries[0].best.schedule_xml")) << loaded.error().str();
  EXPECT_TRUE(contains(loaded.error().message, "expected a schedule")) << loaded.error().str();
  EXPECT_TRUE(loadPlanForCache(run_, false).ok());
}

TEST_F(CachePlan, AScheduleOfAnotherCollectiveOrSizeIsRefused) {
  // A proven schedule, but a reduce-scatter on 4 ranks where the entry is an All-Gather on 8.
  const fs::path other = run_ / "schedules" / "allgather-4KiB.json";
  ASSERT_FALSE(compiler::saveSchedule(core::fixtures::ringReduceScatter({.nRanks = 4}), other.string()).has_value());
  auto loaded = loadPlanForCache(run_, true);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().file, other.string());
  EXPECT_TRUE(contains(loaded.error().message, "expected allgather on 8 ranks")) << loaded.error().message;
  EXPECT_TRUE(contains(loaded.error().message, "reducescatter on 4 ranks")) << loaded.error().message;
}

TEST_F(CachePlan, AMissingScheduleFileIsAnError) {
  const fs::path xml = run_ / "schedules" / "allgather-1MiB.xml";
  fs::remove(xml);
  auto loaded = loadPlanForCache(run_, true);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().file, xml.string());
  EXPECT_TRUE(contains(loaded.error().message, "collectives[0].entries[1].best.schedule_xml")) << loaded.error().str();
  EXPECT_TRUE(contains(loaded.error().message, "no such file")) << loaded.error().str();
  EXPECT_TRUE(loadPlanForCache(run_, false).ok()) << "without verification only the JSON schedule is read";

  // The JSON file's bytes are the schedule id: needed even without verification.
  const fs::path js = run_ / "schedules" / "allgather-4KiB.json";
  fs::remove(js);
  for (bool verify : {false, true}) {
    auto again = loadPlanForCache(run_, verify);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().file, js.string());
    EXPECT_TRUE(contains(again.error().message, "collectives[0].entries[0].best.schedule_json")) << again.error().str();
  }
}

TEST_F(CachePlan, NoValueAnywhereInThePlanMakesItThrow) {
  // Every value of the plan replaced by every JSON type in turn: an error or a plan, never an exception.
  const json plan = samplePlan();
  const json flat = plan.flatten();
  std::set<std::string> pointers;
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    std::string p = it.key();
    // Every ancestor too, so whole objects and arrays are replaced as well.
    while (!p.empty()) {
      pointers.insert(p);
      p = p.substr(0, p.rfind('/'));
    }
  }
  const std::vector<json> junk = {nullptr,         true, -1, 0, 1.5, 1e300, "", "Ring", json::array(), json::object(),
                                  json::array({1})};
  int loads = 0;
  for (const std::string& p : pointers) {
    for (const json& value : junk) {
      json edited = plan;
      edited[json::json_pointer(p)] = value;
      writePlan(edited);
      EXPECT_NO_THROW({
        auto loaded = loadPlanForCache(run_, false);
        if (!loaded.ok()) {
          EXPECT_EQ(loaded.error().file.empty(), false) << p;
          EXPECT_FALSE(loaded.error().message.empty()) << p;
        }
      }) << p
         << " = " << value.dump();
      ++loads;
    }
  }
  EXPECT_GT(loads, 500);
}

}  // namespace
}  // namespace optiflow::synth
