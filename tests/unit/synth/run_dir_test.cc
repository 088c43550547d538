// The run directory (synth/run_dir.h): candidate records to and from JSON, history.jsonl (read back with file:line
// errors, appended line by line, one rule for a torn last line), plan.json with its programs and schedules, read
// back by the one reader, and the merge of several runs' plans.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/text_file.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/parser.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/run_dir.h"

#include "temp_dir.h"

namespace optiflow::synth {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::uint64_t kMaxBytes = std::numeric_limits<std::uint64_t>::max();

json recordToJson(const CandidateRecord& r) { return json::parse(formatRecord(r)); }
core::Result<CandidateRecord> recordFromJson(const json& j) { return parseRecord(j.dump()); }
json planToJson(const core::Topology& t, const SynthConfig& c, const SynthResult& r, const RunInfo& i) {
  return json::parse(formatPlan(makePlan(t, c, r, i)));
}

using optiflow::testsupport::TempDir;

std::string slurp(const fs::path& p) { return core::readWholeFile(p).value_or(""); }

std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

CandidateRecord sampleRecord() {
  CandidateRecord r;
  r.id = "r3c7";
  r.round = 3;
  r.origin = "mutate:r1c2:stage 1: ring -> direct";
  r.name = "ring_v12";
  r.text = "# \"quoted\" and µs\nallgather ring_v12\n  split 2\n  allgather all by direct\n";
  r.stage = "ok";
  r.errors = "";
  SizeResult a;
  a.sizeBytes = 4096;
  a.ok = true;
  a.timeUs = 12.375;
  a.boundUs = 3.5;
  a.ncclUs = 20.25;
  a.config = "LL/1ch/1sl";
  a.bottleneck = "node0.gpu3->nvswitch (97% busy)";
  SizeResult b;
  b.sizeBytes = 1ull << 40;
  b.ok = false;
  b.error = "simulator: out of memory\nsecond line";
  b.boundUs = 1e6;
  b.ncclUs = 0;
  r.sizes = {a, b};
  return r;
}

void expectSameRecord(const CandidateRecord& x, const CandidateRecord& y) {
  EXPECT_EQ(x.id, y.id);
  EXPECT_EQ(x.round, y.round);
  EXPECT_EQ(x.origin, y.origin);
  EXPECT_EQ(x.name, y.name);
  EXPECT_EQ(x.text, y.text);
  EXPECT_EQ(x.stage, y.stage);
  EXPECT_EQ(x.errors, y.errors);
  ASSERT_EQ(x.sizes.size(), y.sizes.size());
  for (std::size_t s = 0; s < x.sizes.size(); ++s) {
    EXPECT_EQ(x.sizes[s].sizeBytes, y.sizes[s].sizeBytes);
    EXPECT_EQ(x.sizes[s].ok, y.sizes[s].ok);
    EXPECT_EQ(x.sizes[s].error, y.sizes[s].error);
    EXPECT_DOUBLE_EQ(x.sizes[s].timeUs, y.sizes[s].timeUs);
    EXPECT_DOUBLE_EQ(x.sizes[s].boundUs, y.sizes[s].boundUs);
    EXPECT_DOUBLE_EQ(x.sizes[s].ncclUs, y.sizes[s].ncclUs);
    EXPECT_EQ(x.sizes[s].config, y.sizes[s].config);
    EXPECT_EQ(x.sizes[s].bottleneck, y.sizes[s].bottleneck);
  }
}

TEST(RunDir, RecordsRoundTripThroughJson) {
  const CandidateRecord r = sampleRecord();
  const json j = recordToJson(r);
  for (const char* key : {"id", "round", "origin", "name", "text", "stage", "errors", "sizes"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  ASSERT_EQ(j.at("sizes").size(), 2u);
  for (const char* key : {"size_bytes", "ok", "error", "time_us", "bound_us", "nccl_us", "config", "bottleneck"}) {
    EXPECT_TRUE(j.at("sizes")[0].contains(key)) << key;
  }
  EXPECT_EQ(j.at("sizes")[1].at("size_bytes").get<std::uint64_t>(), 1ull << 40);
  auto back = recordFromJson(j);
  ASSERT_TRUE(back.ok()) << back.error().str();
  expectSameRecord(*back, r);
  // Through text too, as history.jsonl holds it (one line).
  const std::string line = j.dump();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto again = recordFromJson(json::parse(line));
  ASSERT_TRUE(again.ok()) << again.error().str();
  expectSameRecord(*again, r);
  // A rejected candidate: no sizes.
  CandidateRecord rejected;
  rejected.id = "r0c0";
  rejected.origin = "llm";
  rejected.text = "allgather x\n  allgather all by rign\n";
  rejected.stage = "parse";
  rejected.errors = "r0c0.ofl:2:20: expected a strategy\n  allgather all by rign\n                   ^";
  auto rj = recordFromJson(recordToJson(rejected));
  ASSERT_TRUE(rj.ok()) << rj.error().str();
  expectSameRecord(*rj, rejected);
}

TEST(RunDir, RecordFromJsonNamesTheBadField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j.erase("id"); }, "id: missing"},
      {[](json& j) { j["round"] = "one"; }, "round: expected an integer"},
      {[](json& j) { j["text"] = 5; }, "text: expected a string"},
      {[](json& j) { j.erase("errors"); }, "errors: missing"},
      {[](json& j) { j["sizes"] = "none"; }, "sizes: expected an array"},
      {[](json& j) { j.erase("sizes"); }, "sizes: missing"},
      {[](json& j) { j["sizes"][0] = 3; }, "sizes[0]: expected an object"},
      {[](json& j) { j["sizes"][0]["time_us"] = "fast"; }, "sizes[0].time_us: expected a non-negative number"},
      {[](json& j) { j["sizes"][1]["ok"] = 1; }, "sizes[1].ok: expected true or false"},
      {[](json& j) { j["sizes"][1]["config"] = nullptr; }, "sizes[1].config: expected a string"},
      {[](json& j) { j["sizes"][1].erase("bottleneck"); }, "sizes[1].bottleneck: missing"},
  };
  for (const Case& c : cases) {
    json j = recordToJson(sampleRecord());
    c.edit(j);
    auto r = recordFromJson(j);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.error().message.rfind(c.message, 0), 0u) << r.error().message;
  }
  for (const json& notAnObject : {json::array({1, 2}), json("r0c0"), json(nullptr)}) {
    auto r = recordFromJson(notAnObject);
    ASSERT_FALSE(r.ok()) << notAnObject.dump();
    EXPECT_NE(r.error().message.find("object"), std::string::npos) << r.error().message;
  }
}

TEST(RunDir, RecordFromJsonRejectsNumbersOfTheWrongKind) {
  // A negative or fractional byte count, a fractional round and true for a time are of the wrong type; a lenient
  // reader would turn -1 into 2^64-1 bytes and true into 1 us.
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["sizes"][0]["size_bytes"] = -1; }, "sizes[0].size_bytes"},
      {[](json& j) { j["sizes"][0]["size_bytes"] = 4096.5; }, "sizes[0].size_bytes"},
      {[](json& j) { j["round"] = 1.5; }, "round"},
      {[](json& j) { j["sizes"][0]["time_us"] = true; }, "sizes[0].time_us"},
  };
  for (const Case& c : cases) {
    json j = recordToJson(sampleRecord());
    c.edit(j);
    auto r = recordFromJson(j);
    EXPECT_FALSE(r.ok()) << j.dump() << "\n was accepted; expected an error naming " << c.field;
    if (!r.ok()) {
      EXPECT_EQ(r.error().message.rfind(c.field + ":", 0), 0u) << r.error().message;
    }
  }
}

TEST(RunDir, ReadHistoryNamesFileAndLineOfABadLine) {
  TempDir dir;
  const std::string good = recordToJson(sampleRecord()).dump();
  {
    const fs::path f = dir.write("history.jsonl", good + "\n\n" + good + "\n{\"id\": \"r0c1\", \n");
    auto h = readHistory(f);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().file, f.string());
    EXPECT_EQ(h.error().line, 4);
    EXPECT_NE(h.error().str().find("history.jsonl:4"), std::string::npos) << h.error().str();
    EXPECT_NE(h.error().message.find("JSON"), std::string::npos) << h.error().message;
  }
  {
    json missing = recordToJson(sampleRecord());
    missing.erase("id");
    const fs::path f = dir.write("missing.jsonl", good + "\n" + missing.dump() + "\n");
    auto h = readHistory(f);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().line, 2);
    EXPECT_NE(h.error().str().find("missing.jsonl:2"), std::string::npos) << h.error().str();
    EXPECT_NE(h.error().message.find("id: missing"), std::string::npos) << h.error().message;
  }
  {
    json wrong = recordToJson(sampleRecord());
    wrong["sizes"][0]["time_us"] = "slow";
    const fs::path f = dir.write("wrong.jsonl", wrong.dump() + "\n");
    auto h = readHistory(f);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.error().str().find("wrong.jsonl:1"), std::string::npos) << h.error().str();
    EXPECT_NE(h.error().message.find("sizes[0].time_us: expected a non-negative number"), std::string::npos)
        << h.error().message;
  }
  {
    const fs::path f = dir.write("array.jsonl", good + "\n[1, 2]\n");
    auto h = readHistory(f);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().line, 2);
  }
}

TEST(RunDir, ReadHistoryOfAMissingFileIsEmptyAndBlankLinesAreSkipped) {
  TempDir dir;
  auto none = readHistory(dir.path() / "no-such-history.jsonl");
  ASSERT_TRUE(none.ok()) << none.error().str();
  EXPECT_TRUE(none->records.empty());
  CandidateRecord second = sampleRecord();
  second.id = "r3c8";
  const fs::path f = dir.write(
      "h.jsonl", "\n" + recordToJson(sampleRecord()).dump() + "\n  \r\n" + recordToJson(second).dump() + "\n\n");
  auto h = readHistory(f);
  ASSERT_TRUE(h.ok()) << h.error().str();
  ASSERT_EQ(h->records.size(), 2u);
  expectSameRecord(h->records[0], sampleRecord());
  expectSameRecord(h->records[1], second);
}

TEST(RunDir, HistoryWriterAppendsOneLinePerRecord) {
  TempDir dir;
  const fs::path f = dir.path() / "run" / "nested" / "history.jsonl";  // the directories do not exist yet
  CandidateRecord a = sampleRecord();
  CandidateRecord b = sampleRecord();
  b.id = "r3c8";
  b.stage = "expand";
  b.errors = "r3c8.ofl:2:3: allgather by recursive_doubling needs a group of a power-of-two size";
  b.sizes.clear();
  {
    auto w = HistoryWriter::open(f);
    ASSERT_TRUE(w.ok()) << w.error().str();
    EXPECT_TRUE(w->append(a));
    // Flushed at once: a reader sees the line before the writer goes away.
    EXPECT_EQ(lines(f).size(), 1u);
    EXPECT_TRUE(w->append(b));
  }
  {
    auto w = HistoryWriter::open(f);  // appends, never truncates
    ASSERT_TRUE(w.ok()) << w.error().str();
    CandidateRecord c = a;
    c.id = "r4c0";
    EXPECT_TRUE(w->append(c));
  }
  const std::vector<std::string> text = lines(f);
  ASSERT_EQ(text.size(), 3u);
  for (const std::string& line : text) EXPECT_TRUE(json::parse(line).is_object());
  auto h = readHistory(f);
  ASSERT_TRUE(h.ok()) << h.error().str();
  ASSERT_EQ(h->records.size(), 3u);
  expectSameRecord(h->records[0], a);
  expectSameRecord(h->records[1], b);
  EXPECT_EQ(h->records[2].id, "r4c0");

  // A directory where the file should be: an error naming it, not an exception.
  fs::create_directories(dir.path() / "adir");
  auto bad = HistoryWriter::open(dir.path() / "adir");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("adir"), std::string::npos) << bad.error().str();
}

// One small real run shared by the plan tests: ring and direct All-Gather on one DGX A100 at 4KiB and 1MiB.
struct SmallRun {
  core::Topology topology;
  SynthConfig config;
  SynthResult result;
};

class FixedProposer : public Proposer {
 public:
  std::string_view name() const override { return "fixed"; }
  std::vector<Candidate> propose(const ProposalContext& ctx) override {
    if (ctx.round > 0) return {};
    std::vector<Candidate> out;
    for (const EmbeddedProgram& g : galleryPrograms()) {
      if (g.file == "allgather_ring.ofl" || g.file == "allgather_direct.ofl") {
        out.push_back({std::string(g.text), fmt::format("gallery:{}", g.file)});
      }
    }
    return out;
  }
};

const SmallRun& smallRun() {
  static const SmallRun run = [] {
    SmallRun r;
    auto t = core::presetTopology("dgx-a100");
    if (!t) throw std::runtime_error(t.error().str());
    r.topology = std::move(t).value();
    r.config.collective = core::Collective::AllGather;
    r.config.sizes = {4096, 1u << 20};
    r.config.rounds = 2;
    FixedProposer proposer;
    SimEvaluator evaluator(r.topology, r.config.params);
    r.result = runSynthesis(r.topology, r.config, proposer, evaluator);
    return r;
  }();
  return run;
}

TEST(RunDir, RunDirectoryHoldsThePlanProgramsAndSchedules) {
  const SmallRun& run = smallRun();
  ASSERT_EQ(run.result.history.size(), 2u);
  for (const SizeBest& sb : run.result.sizes) ASSERT_GE(sb.best, 0);
  TempDir dir;
  const fs::path out = dir.path() / "run";  // created by writeRunDirectory
  const RunInfo info{"builtin", "simulator", 42};
  auto wrote = writeRunDirectory(out, run.topology, run.config, run.result, info);
  ASSERT_TRUE(wrote.ok()) << wrote.error().str();
  for (const fs::directory_entry& e : fs::directory_iterator(out)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left over: " << e.path();
  }
  const json plan = json::parse(slurp(out / "plan.json"));

  EXPECT_EQ(plan.at("format"), "optiflow-plan");
  EXPECT_EQ(plan.at("version"), 1);
  EXPECT_TRUE(std::regex_match(plan.at("optiflow_version").get<std::string>(), std::regex(R"(\d+\.\d+\.\d+.*)")))
      << plan.at("optiflow_version");
  EXPECT_EQ(plan.at("topology"), "dgx-a100");
  EXPECT_EQ(plan.at("ranks"), 8);
  EXPECT_EQ(plan.at("nodes"), 1);
  EXPECT_EQ(plan.at("gpus_per_node"), 8);
  EXPECT_EQ(plan.at("proposer"), "builtin");
  EXPECT_EQ(plan.at("evaluator"), "simulator");
  EXPECT_EQ(plan.at("seed"), 42);
  EXPECT_EQ(plan.at("rounds"), run.result.roundsRun);
  EXPECT_EQ(plan.at("candidates"), 2);
  EXPECT_DOUBLE_EQ(plan.at("elapsed_s").get<double>(), run.result.elapsedS);
  EXPECT_EQ(plan.at("stop_reason"), run.result.stopReason);
  ASSERT_EQ(plan.at("collectives").size(), 1u);
  const json& coll = plan.at("collectives")[0];
  EXPECT_EQ(coll.at("collective"), "allgather");
  EXPECT_EQ(coll.at("ranks"), 8);
  EXPECT_EQ(coll.at("nodes"), 1);
  const json& entries = coll.at("entries");
  ASSERT_EQ(entries.size(), run.config.sizes.size());

  std::uint64_t expectedMin = 0;
  for (std::size_t s = 0; s < entries.size(); ++s) {
    const json& e = entries[s];
    const SizeBest& sb = run.result.sizes[s];
    SCOPED_TRACE(fmt::format("entry {}", s));
    EXPECT_EQ(e.at("size_bytes").get<std::uint64_t>(), run.config.sizes[s]);
    // The ranges tile [0, 2^64-1] in size order, each holding its own size.
    const auto minBytes = e.at("min_bytes").get<std::uint64_t>();
    const auto maxBytes = e.at("max_bytes").get<std::uint64_t>();
    EXPECT_EQ(minBytes, expectedMin);
    EXPECT_LE(minBytes, run.config.sizes[s]);
    EXPECT_GE(maxBytes, run.config.sizes[s]);
    if (s + 1 < entries.size()) {
      EXPECT_EQ(maxBytes, run.config.sizes[s + 1] - 1);
    } else {
      EXPECT_EQ(maxBytes, kMaxBytes);
    }
    expectedMin = maxBytes + 1;
    EXPECT_DOUBLE_EQ(e.at("bound_us").get<double>(), sb.boundUs);
    EXPECT_DOUBLE_EQ(e.at("effective_bound_us").get<double>(), sb.effectiveBoundUs);
    for (const char* native : {"nccl", "native"}) {
      const json& n = e.at(native);
      EXPECT_FALSE(n.at("algorithm").get<std::string>().empty()) << native;
      EXPECT_FALSE(n.at("protocol").get<std::string>().empty()) << native;
      EXPECT_GE(n.at("channels").get<int>(), 1) << native;
      EXPECT_GT(n.at("time_us").get<double>(), 0) << native;
    }
    EXPECT_DOUBLE_EQ(e.at("nccl").at("time_us").get<double>(), sb.nccl.timeUs);
    EXPECT_DOUBLE_EQ(e.at("native").at("time_us").get<double>(), sb.bestNative.timeUs);

    const json& best = e.at("best");
    ASSERT_TRUE(best.is_object());
    const CandidateRecord& rec = run.result.history.at(static_cast<std::size_t>(sb.best));
    EXPECT_EQ(best.at("candidate"), rec.id);
    EXPECT_EQ(best.at("program"), rec.name);
    EXPECT_EQ(best.at("config"), sb.config);
    EXPECT_DOUBLE_EQ(best.at("time_us").get<double>(), sb.bestUs);
    EXPECT_GE(best.at("time_us").get<double>(), e.at("bound_us").get<double>());
    EXPECT_GE(best.at("channels").get<int>(), 1);
    EXPECT_EQ(best.at("protocol").get<std::string>(), std::string(core::toString(sb.schedule->protocol)));
    EXPECT_EQ(best.at("config").get<std::string>().rfind(best.at("protocol").get<std::string>() + "/", 0), 0u)
        << best.at("config");
    const std::string stem = fmt::format("allgather-{}", s == 0 ? "4KiB" : "1MiB");
    EXPECT_EQ(best.at("program_file"), fmt::format("programs/{}.ofl", rec.id));
    EXPECT_EQ(best.at("schedule_json"), fmt::format("schedules/{}.json", stem));
    EXPECT_EQ(best.at("schedule_xml"), fmt::format("schedules/{}.xml", stem));

    // The program file is the candidate's text and parses to the named program.
    const fs::path programFile = out / best.at("program_file").get<std::string>();
    ASSERT_TRUE(fs::exists(programFile)) << programFile;
    const std::string text = slurp(programFile);
    EXPECT_EQ(text, rec.text);
    auto parsed = dsl::parseProgram(text, programFile.string());
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed.program->name, best.at("program").get<std::string>());
    EXPECT_EQ(parsed.program->collective, core::Collective::AllGather);

    // Both schedule files load back and are proven, and they are the winner's schedule.
    for (const char* key : {"schedule_json", "schedule_xml"}) {
      const fs::path file = out / best.at(key).get<std::string>();
      auto loaded = compiler::loadSchedule(file.string());
      ASSERT_TRUE(loaded.ok()) << file << ": " << loaded.error().str();
      EXPECT_EQ(loaded->collective, core::Collective::AllGather) << key;
      EXPECT_EQ(loaded->nRanks, 8) << key;
      EXPECT_EQ(loaded->protocol, sb.schedule->protocol) << key;
      EXPECT_EQ(loaded->nChannels, sb.schedule->nChannels) << key;
      const compiler::VerifyReport report = compiler::verify(*loaded);
      EXPECT_TRUE(report.proven) << key << ": " << (report.errors.empty() ? "" : report.errors.front().str());
    }
  }
}

TEST(RunDir, SizesWithoutABestHaveANullBestAndNoFiles) {
  const SmallRun& run = smallRun();
  SynthResult partial = run.result;
  partial.sizes[1].best = -1;
  partial.sizes[1].bestUs = 0;
  partial.sizes[1].config.clear();
  partial.sizes[1].schedule.reset();
  TempDir dir;
  auto wrote = writeRunDirectory(dir.path(), run.topology, run.config, partial, {"builtin", "simulator", 1});
  ASSERT_TRUE(wrote.ok()) << wrote.error().str();
  const json plan = json::parse(slurp(dir.path() / "plan.json"));
  const json& entries = plan.at("collectives")[0].at("entries");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_TRUE(entries[0].at("best").is_object());
  EXPECT_TRUE(entries[1].at("best").is_null());
  EXPECT_TRUE(fs::exists(dir.path() / "schedules" / "allgather-4KiB.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "schedules" / "allgather-4KiB.xml"));
  EXPECT_FALSE(fs::exists(dir.path() / "schedules" / "allgather-1MiB.json"));
  EXPECT_FALSE(fs::exists(dir.path() / "schedules" / "allgather-1MiB.xml"));
  // The ranges still cover everything.
  EXPECT_EQ(entries[0].at("min_bytes").get<std::uint64_t>(), 0u);
  EXPECT_EQ(entries[1].at("max_bytes").get<std::uint64_t>(), kMaxBytes);
}

TEST(RunDir, RangesTileAllSizesForAnyNumberOfSizes) {
  auto topo = core::presetTopology("dgx-a100");
  ASSERT_TRUE(topo.ok());
  for (const std::vector<std::uint64_t>& sizes :
       {std::vector<std::uint64_t>{1}, std::vector<std::uint64_t>{1024, 2048, 1u << 20},
        std::vector<std::uint64_t>{0, 4096}}) {
    SynthConfig cfg;
    cfg.sizes = sizes;
    SynthResult res;
    for (std::uint64_t s : sizes) {
      SizeBest sb;
      sb.sizeBytes = s;
      res.sizes.push_back(sb);
    }
    const json plan = planToJson(*topo, cfg, res, {"builtin", "simulator", 1});
    const json& entries = plan.at("collectives")[0].at("entries");
    ASSERT_EQ(entries.size(), sizes.size());
    std::uint64_t next = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      EXPECT_EQ(entries[i].at("min_bytes").get<std::uint64_t>(), next) << i;
      const auto maxBytes = entries[i].at("max_bytes").get<std::uint64_t>();
      EXPECT_GE(maxBytes, sizes[i]);
      EXPECT_TRUE(entries[i].at("best").is_null());
      next = maxBytes + 1;  // wraps to 0 after the last
    }
    EXPECT_EQ(entries.back().at("max_bytes").get<std::uint64_t>(), kMaxBytes);
    EXPECT_EQ(plan.at("candidates"), 0);
  }
}

TEST(RunDir, WriteRunDirectoryOverAFileIsAnError) {
  const SmallRun& run = smallRun();
  TempDir dir;
  const fs::path file = dir.write("not-a-dir", "x");
  auto wrote = writeRunDirectory(file, run.topology, run.config, run.result, {"builtin", "simulator", 1});
  ASSERT_FALSE(wrote.ok());
  EXPECT_NE(wrote.error().str().find("not-a-dir"), std::string::npos) << wrote.error().str();
}

TEST(RunDir, RewritingARunDirectoryReplacesThePlan) {
  const SmallRun& run = smallRun();
  TempDir dir;
  ASSERT_TRUE(writeRunDirectory(dir.path(), run.topology, run.config, run.result, {"builtin", "simulator", 1}).ok());
  SynthResult later = run.result;
  later.roundsRun = 7;
  later.stopReason = "converged";
  ASSERT_TRUE(writeRunDirectory(dir.path(), run.topology, run.config, later, {"llm", "simulator", 9}).ok());
  const json plan = json::parse(slurp(dir.path() / "plan.json"));
  EXPECT_EQ(plan.at("rounds"), 7);
  EXPECT_EQ(plan.at("stop_reason"), "converged");
  EXPECT_EQ(plan.at("proposer"), "llm");
  EXPECT_EQ(plan.at("seed"), 9);
}

TEST(RunDir, ATornLastLineIsLeftOutAndCutOffBeforeTheNextAppend) {
  TempDir dir;
  const std::string good = formatRecord(sampleRecord());
  const fs::path f = dir.write("history.jsonl", good + "\n" + good.substr(0, good.size() / 2));
  auto h = readHistory(f);
  ASSERT_TRUE(h.ok()) << h.error().str();
  EXPECT_EQ(h->records.size(), 1u);
  EXPECT_TRUE(h->tornTail);
  // The same text with its newline is a bad line in the middle of the history: an error naming it.
  dir.write("history.jsonl", good + "\n" + good.substr(0, good.size() / 2) + "\n" + good + "\n");
  auto bad = readHistory(f);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().line, 2);
  // Appending after a torn line: the torn part is cut off, the next record has a line of its own.
  dir.write("history.jsonl", good + "\n" + good.substr(0, 10));
  {
    auto w = HistoryWriter::open(f);
    ASSERT_TRUE(w.ok()) << w.error().str();
    EXPECT_TRUE(w->append(sampleRecord()));
  }
  auto after = readHistory(f);
  ASSERT_TRUE(after.ok()) << after.error().str();
  EXPECT_EQ(after->records.size(), 2u);
  EXPECT_FALSE(after->tornTail);
  // A last line that is whole but for its newline is kept.
  dir.write("history.jsonl", good);
  {
    auto w = HistoryWriter::open(f);
    ASSERT_TRUE(w.ok()) << w.error().str();
    EXPECT_TRUE(w->append(sampleRecord()));
  }
  auto kept = readHistory(f);
  ASSERT_TRUE(kept.ok()) << kept.error().str();
  EXPECT_EQ(kept->records.size(), 2u);
}

TEST(RunDir, ThePlanReadsBackAsItWasWritten) {
  const SmallRun& run = smallRun();
  TempDir dir;
  ASSERT_TRUE(writeRunDirectory(dir.path(), run.topology, run.config, run.result, {"builtin", "simulator", 3}).ok());
  auto back = readPlan(dir.path() / "plan.json");
  ASSERT_TRUE(back.ok()) << back.error().str();
  const PlanFile want = makePlan(run.topology, run.config, run.result, {"builtin", "simulator", 3});
  EXPECT_EQ(formatPlan(*back), formatPlan(want));
  EXPECT_EQ(back->topology, "dgx-a100");
  EXPECT_EQ(back->seed, std::optional<std::uint64_t>(3));
  ASSERT_EQ(back->collectives.size(), 1u);
  ASSERT_EQ(back->collectives[0].entries.size(), 2u);
  const PlanEntry& e = back->collectives[0].entries[1];
  EXPECT_EQ(e.maxBytes, kMaxBytes);
  ASSERT_TRUE(e.best.has_value());
  EXPECT_EQ(e.best->scheduleJson, "schedules/allgather-1MiB.json");
  ASSERT_TRUE(e.native.has_value());
  EXPECT_DOUBLE_EQ(e.native->timeUs, run.result.sizes[1].bestNative.timeUs);
}

TEST(RunDir, ABadPlanNamesTheFileLineAndField) {
  const SmallRun& run = smallRun();
  const std::string text = formatPlan(makePlan(run.topology, run.config, run.result, {"builtin", "simulator", 1}));
  std::string bad = text;
  const std::size_t at = bad.find("\"bound_us\"");
  ASSERT_NE(at, std::string::npos);
  bad.replace(at, std::string_view("\"bound_us\": ").size(), "\"bound_us\": \"x\", \"was_bound_us\": ");
  auto r = parsePlan(bad, "p.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "p.json");
  EXPECT_EQ(r.error().message.rfind("collectives[0].entries[0].bound_us: expected a non-negative number", 0), 0u)
      << r.error().message;
  EXPECT_EQ(r.error().line,
            static_cast<int>(std::count(bad.begin(), bad.begin() + static_cast<std::ptrdiff_t>(at), '\n')) + 1);
  auto missing = readPlan(fs::path("/nonexistent-optiflow-dir/plan.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no such file"), std::string::npos) << missing.error().message;
}

TEST(RunDir, MergedPlansKeepEveryCollectiveAndListTheirRuns) {
  const SmallRun& run = smallRun();
  PlanFile a = makePlan(run.topology, run.config, run.result, {"builtin", "simulator", 1});
  PlanFile b = a;
  b.collectives[0].collective = core::Collective::AllReduce;
  const PlanFile merged = mergePlans({a, b}, {"/runs/a", "/runs/b"});
  ASSERT_EQ(merged.collectives.size(), 2u);
  EXPECT_EQ(merged.collectives[0].collective, core::Collective::AllGather);
  EXPECT_EQ(merged.collectives[1].collective, core::Collective::AllReduce);
  EXPECT_EQ(merged.runs, (std::vector<std::string>{"/runs/a", "/runs/b"}));
  EXPECT_EQ(merged.topology, a.topology);
  EXPECT_FALSE(merged.rounds.has_value()) << "a merged plan has no single run's settings";
  // And it reads back through the one reader.
  auto back = parsePlan(formatPlan(merged), "merged.json");
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->runs, merged.runs);
  EXPECT_EQ(formatPlan(*back), formatPlan(merged));
}

}  // namespace
}  // namespace optiflow::synth
