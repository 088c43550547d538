// `optiflow synthesize` and `optiflow report` as a user runs them: exit codes, the JSON and the table, the run
// directory (plan.json, history.jsonl, programs, schedules), resuming and replacing a run, and the language-model
// proposer falling back to the built-in one when nothing answers. One DGX A100 node and two small sizes: each run
// takes a second or two.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using optiflow::testsupport::slurp;
using CliResult = optiflow::testsupport::CommandResult;

using nlohmann::json;

std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The small run every test starts from.
constexpr const char* kSmall = "--topo dgx-a100 --coll allgather --sizes 4KiB,1MiB";

class SynthCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("optiflow-synth-e2e-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run_ = dir_ / "run";
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult run(const std::string& args) {
    return optiflow::testsupport::runCommand(fmt::format("{} {}", OPTIFLOW_CLI, args), dir_);
  }

  // `optiflow synthesize` on the small cluster into run_.
  CliResult synthesize(const std::string& extra) {
    return run(fmt::format("synthesize {} --out {} {}", kSmall, run_.string(), extra));
  }

  json plan() const { return json::parse(slurp(run_ / "plan.json")); }

  fs::path dir_;
  fs::path run_;
};

TEST_F(SynthCli, EveryExportedScheduleVerifiesAndChecks) {
  // The run's schedules are what a user hands to MSCCL: each must pass the verifier and run right on the CPU,
  // in both formats, independently of the process that wrote them.
  const CliResult r = synthesize("--rounds 2 -q");
  ASSERT_EQ(r.rc, 0) << r.err;
  int files = 0;
  const json p = plan();
  for (const json& entry : p.at("collectives").at(0).at("entries")) {
    ASSERT_FALSE(entry.at("best").is_null()) << entry.dump();
    for (const char* key : {"schedule_json", "schedule_xml"}) {
      const fs::path f = run_ / entry.at("best").at(key).get<std::string>();
      ASSERT_TRUE(fs::exists(f)) << f;
      const CliResult v = run(fmt::format("verify {}", f.string()));
      EXPECT_EQ(v.rc, 0) << f << "\n" << v.out << v.err;
      const CliResult c = run(fmt::format("check {} --elements 64", f.string()));
      EXPECT_EQ(c.rc, 0) << f << "\n" << c.out << c.err;
      ++files;
    }
  }
  EXPECT_EQ(files, 4);
}

TEST_F(SynthCli, SynthesizePrintsOneJsonRowPerSize) {
  const CliResult r = synthesize("--rounds 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);  // stdout is the JSON alone; progress goes to stderr
  EXPECT_EQ(j.at("topology"), "dgx-a100");
  EXPECT_EQ(j.at("collective"), "allgather");
  EXPECT_EQ(j.at("ranks"), 8);
  EXPECT_EQ(j.at("rounds"), 2);
  EXPECT_FALSE(j.at("stop_reason").get<std::string>().empty());
  const json& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 2u);
  const std::vector<std::uint64_t> sizes = {4096, 1048576};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    SCOPED_TRACE(row.dump());
    for (const char* key : {"size_bytes", "best_time_us", "nccl_time_us", "bound_us", "speedup_vs_nccl", "program"}) {
      ASSERT_TRUE(row.contains(key)) << key;
      EXPECT_FALSE(row.at(key).is_null()) << key;
    }
    EXPECT_EQ(row.at("size_bytes").get<std::uint64_t>(), sizes[i]);
    const double best = row.at("best_time_us").get<double>();
    const double bound = row.at("bound_us").get<double>();
    const double nccl = row.at("nccl_time_us").get<double>();
    EXPECT_GT(bound, 0);
    EXPECT_GE(best, bound * (1 - 1e-9));
    EXPECT_GT(nccl, 0);
    EXPECT_NEAR(row.at("speedup_vs_nccl").get<double>(), nccl / best, 1e-9 * nccl / best);
    // The second estimate of NCCL: its own cost model, beside the simulated one.
    const double model = row.at("nccl_model_time_us").get<double>();
    EXPECT_GT(model, 0);
    EXPECT_NEAR(row.at("speedup_vs_nccl_model").get<double>(), model / best, 1e-9 * model / best);
    EXPECT_FALSE(row.at("program").get<std::string>().empty());
  }
  // Progress lines on stderr, one per round.
  EXPECT_TRUE(contains(r.err, "round 1:")) << r.err;
  EXPECT_TRUE(contains(r.err, "round 2:")) << r.err;
  // The run directory.
  ASSERT_TRUE(fs::exists(run_ / "plan.json"));
  const std::vector<std::string> history = lines(run_ / "history.jsonl");
  EXPECT_EQ(history.size(), j.at("candidates").get<std::size_t>());
  for (const std::string& line : history) EXPECT_TRUE(json::parse(line).contains("stage")) << line;
  EXPECT_EQ(plan().at("candidates").get<std::size_t>(), history.size());
  for (const char* f : {"allgather-4KiB.json", "allgather-4KiB.xml", "allgather-1MiB.json", "allgather-1MiB.xml"}) {
    EXPECT_TRUE(fs::exists(run_ / "schedules" / f)) << f;
  }
  for (const json& row : rows) {
    EXPECT_TRUE(fs::exists(run_ / "programs" / (row.at("candidate").get<std::string>() + ".ofl")));
  }
}

TEST_F(SynthCli, TableModePrintsAHeaderAndEverySize) {
  const CliResult r = synthesize("--rounds 1 --candidates 4 -q");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* column : {"size", "nccl_us", "model_us", "best_us", "speedup", "bound_us", "x_bound"}) {
    EXPECT_TRUE(contains(r.out, column)) << column << "\n" << r.out;
  }
  EXPECT_TRUE(contains(r.out, "4KiB")) << r.out;
  EXPECT_TRUE(contains(r.out, "1MiB")) << r.out;
  EXPECT_TRUE(contains(r.out, run_.string())) << r.out;
  EXPECT_FALSE(contains(r.err, "round 1:")) << "--quiet prints no progress:\n" << r.err;
}

TEST_F(SynthCli, SizesAreSortedAndDeduplicated) {
  const CliResult r = run(fmt::format(
      "synthesize --topo dgx-a100 --sizes 1MiB,4KiB,4KiB --rounds 1 --candidates 2 -q --json --out {}", run_.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  const json rows = json::parse(r.out).at("rows");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("size_bytes"), 4096);
  EXPECT_EQ(rows[1].at("size_bytes"), 1048576);
  const json p = plan();
  const json& entries = p.at("collectives")[0].at("entries");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].at("min_bytes"), 0);
  EXPECT_EQ(entries[0].at("max_bytes"), 1048575);
  EXPECT_EQ(entries[1].at("min_bytes"), 1048576);
}

TEST_F(SynthCli, ASecondRunIntoTheSameDirectoryNeedsResumeOrForce) {
  ASSERT_EQ(synthesize("--rounds 1 --candidates 2 -q").rc, 0);
  const std::string history = slurp(run_ / "history.jsonl");
  const std::string planText = slurp(run_ / "plan.json");
  const CliResult r = synthesize("--rounds 1 --candidates 2 -q");
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--resume")) << r.err;
  EXPECT_TRUE(contains(r.err, "--force")) << r.err;
  EXPECT_TRUE(contains(r.err, run_.string())) << r.err;
  // Nothing was touched.
  EXPECT_EQ(slurp(run_ / "history.jsonl"), history);
  EXPECT_EQ(slurp(run_ / "plan.json"), planText);
}

TEST_F(SynthCli, ResumeContinuesTheRun) {
  ASSERT_EQ(synthesize("--rounds 1 --candidates 4 -q").rc, 0);
  const std::vector<std::string> before = lines(run_ / "history.jsonl");
  ASSERT_EQ(before.size(), 4u);
  const json plan1 = plan();

  const CliResult r = synthesize("--rounds 1 --candidates 4 -q --json --resume");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<std::string> after = lines(run_ / "history.jsonl");
  ASSERT_GT(after.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << "line " << i + 1;
  std::set<std::string> earlierTexts;
  for (const std::string& line : before) earlierTexts.insert(json::parse(line).at("text").get<std::string>());
  for (std::size_t i = before.size(); i < after.size(); ++i) {
    const json rec = json::parse(after[i]);
    EXPECT_EQ(rec.at("round"), 1) << after[i];
    EXPECT_EQ(rec.at("id").get<std::string>().rfind("r1c", 0), 0u) << after[i];
    EXPECT_EQ(earlierTexts.count(rec.at("text").get<std::string>()), 0u) << "proposed again: " << after[i];
  }
  // plan.json is rewritten for the whole run: every candidate, old and new; the bests no worse than before.
  const json plan2 = plan();
  EXPECT_EQ(plan2.at("candidates").get<std::size_t>(), after.size());
  EXPECT_EQ(json::parse(r.out).at("candidates").get<std::size_t>(), after.size());
  const json& e1 = plan1.at("collectives")[0].at("entries");
  const json& e2 = plan2.at("collectives")[0].at("entries");
  ASSERT_EQ(e1.size(), e2.size());
  for (std::size_t s = 0; s < e1.size(); ++s) {
    ASSERT_TRUE(e2[s].at("best").is_object());
    EXPECT_LE(e2[s].at("best").at("time_us").get<double>(), e1[s].at("best").at("time_us").get<double>() * (1 + 1e-12));
  }
}

TEST_F(SynthCli, ResumeNeedsTheSameSizesAndAReadableHistory) {
  ASSERT_EQ(synthesize("--rounds 1 --candidates 2 -q").rc, 0);
  const CliResult other =
      run(fmt::format("synthesize --topo dgx-a100 --sizes 4KiB --rounds 1 -q --resume --out {}", run_.string()));
  EXPECT_EQ(other.rc, 2);
  EXPECT_TRUE(contains(other.err, "--sizes")) << other.err;

  std::ofstream(run_ / "history.jsonl", std::ios::app) << "{\"id\": \"r9c9\"\n";
  const std::size_t badLine = lines(run_ / "history.jsonl").size();
  const CliResult bad = synthesize("--rounds 1 -q --resume");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(contains(bad.err, fmt::format("history.jsonl:{}", badLine))) << bad.err;
}

TEST_F(SynthCli, ResumeInAFreshDirectoryStartsARun) {
  const CliResult r = synthesize("--rounds 1 --candidates 2 -q --resume");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(run_ / "history.jsonl").size(), 2u);
  EXPECT_TRUE(fs::exists(run_ / "plan.json"));
}

TEST_F(SynthCli, ForceReplacesTheRun) {
  ASSERT_EQ(synthesize("--rounds 1 --candidates 3 -q").rc, 0);
  ASSERT_EQ(run(fmt::format("report {}", run_.string())).rc, 0);
  ASSERT_TRUE(fs::exists(run_ / "report.html"));
  const CliResult r = synthesize("--rounds 1 --candidates 2 -q --force");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<std::string> history = lines(run_ / "history.jsonl");
  ASSERT_EQ(history.size(), 2u);  // the new run's only
  for (const std::string& line : history) EXPECT_EQ(json::parse(line).at("round"), 0);
  EXPECT_EQ(plan().at("candidates"), 2);
  EXPECT_FALSE(fs::exists(run_ / "report.html")) << "a report of the replaced run is left behind";
}

TEST_F(SynthCli, ReportWritesAnHtmlPageWithCharts) {
  ASSERT_EQ(synthesize("--rounds 1 --candidates 3 -q").rc, 0);
  const CliResult r = run(fmt::format("report {}", run_.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, (run_ / "report.html").string())) << r.out;
  const std::string html = slurp(run_ / "report.html");
  EXPECT_TRUE(contains(html, "<svg")) << html.substr(0, 500);
  EXPECT_TRUE(contains(html, "dgx-a100"));
  const fs::path elsewhere = dir_ / "elsewhere.html";
  const CliResult o = run(fmt::format("report {} -o {}", run_.string(), elsewhere.string()));
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(contains(slurp(elsewhere), "<svg"));
}

TEST_F(SynthCli, ReportOfADirectoryWithoutAPlanFails) {
  fs::create_directories(dir_ / "empty");
  const CliResult r = run(fmt::format("report {}", (dir_ / "empty").string()));
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(contains(r.err, "plan.json")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "empty" / "report.html"));
  const CliResult missing = run(fmt::format("report {}", (dir_ / "no-such-dir").string()));
  EXPECT_EQ(missing.rc, 2);
  EXPECT_TRUE(contains(missing.err, "no-such-dir")) << missing.err;
}

TEST_F(SynthCli, BadArgumentsExitWithTwoAndAClearMessage) {
  struct Case {
    std::string args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"--topo dgx-a100 --sizes 4KiB,banana", {"--sizes", "banana"}},
      {"--topo dgx-a100 --sizes 1MiB:4KiB", {"--sizes"}},
      {"--topo dgx-a100 --coll allfoo", {"--coll", "allfoo"}},
      {"--topo no-such-preset", {"no-such-preset"}},
      {"--topo dgx-a100 --root 8", {"--root"}},
      {"--topo dgx-a100 --proposer llm", {"--llm-url"}},
      {"--topo dgx-a100 --proposer llm --llm-model m", {"--llm-url"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const fs::path out = dir_ / "bad-args";
    const CliResult r = run(fmt::format("synthesize {} --out {}", c.args, out.string()));
    EXPECT_EQ(r.rc, 2) << r.out << r.err;
    for (const std::string& s : c.says) EXPECT_TRUE(contains(r.err, s)) << s << "\n" << r.err;
    fs::remove_all(out);
  }
}

// A rejected command line must not leave a run behind: the next, correct, command into the same directory should
// start a run, not refuse with "holds an earlier run" (an empty history.jsonl written before the --proposer llm
// arguments were checked).
TEST_F(SynthCli, ARejectedCommandLeavesNoRunBehind) {
  const CliResult bad = synthesize("--proposer llm --rounds 1 -q");
  ASSERT_EQ(bad.rc, 2) << bad.err;
  EXPECT_FALSE(fs::exists(run_ / "history.jsonl")) << "the rejected command created " << (run_ / "history.jsonl");
  const CliResult good = synthesize("--rounds 1 --candidates 2 -q");
  EXPECT_EQ(good.rc, 0) << good.err;
}

TEST_F(SynthCli, LlmProposerFallsBackToTheBuiltinOneWhenNothingListens) {
  // Port 1 on localhost: the connection is refused at once. Each round the client retries with backoff
  // (1 + 2 + 4 s) before the proposer falls back, so one round takes about 7 s.
  const CliResult r = synthesize(
      "--rounds 1 --candidates 3 -q --json --proposer llm --llm-url http://127.0.0.1:1/v1 "
      "--llm-model test-model --llm-timeout 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  // About 7 s; the limit (about 17x) is one only a client that keeps retrying, or waits for a reply, reaches.
  EXPECT_LT(r.seconds, 120) << "the fallback took " << r.seconds << " s";
  const json j = json::parse(r.out);
  ASSERT_EQ(j.at("rows").size(), 2u);
  for (const json& row : j.at("rows")) EXPECT_FALSE(row.at("best_time_us").is_null()) << row.dump();
  EXPECT_TRUE(contains(r.err, "builtin")) << r.err;
  const std::vector<std::string> history = lines(run_ / "history.jsonl");
  ASSERT_EQ(history.size(), 3u);
  for (const std::string& line : history) {
    EXPECT_EQ(json::parse(line).at("origin").get<std::string>().rfind("gallery:", 0), 0u) << line;
  }
  EXPECT_EQ(plan().at("proposer"), "llm");
}

}  // namespace
