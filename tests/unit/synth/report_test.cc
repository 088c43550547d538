#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <unistd.h>

#include "optiflow/synth/report.h"

#include "temp_dir.h"

namespace optiflow::synth {
namespace {

namespace fs = std::filesystem;

// 8-rank AllReduce (busbw factor 2*7/8 = 1.75). Sizes 1KiB, 64KiB, 1MiB, 1GiB; at 64KiB NCCL has no schedule
// (time 0) and no candidate worked (best null); at 1GiB NCCL is null.
constexpr std::string_view kPlan = R"({"format": "optiflow-plan", "version": 1, "optiflow_version": "0.1.0",
 "topology": "dgx-a100x1", "ranks": 8, "nodes": 1, "gpus_per_node": 8,
 "proposer": "builtin", "evaluator": "simulator", "seed": 1, "rounds": 2, "candidates": 5,
 "elapsed_s": 12.5, "stop_reason": "converged",
 "collectives": [{
  "collective": "allreduce", "ranks": 8, "nodes": 1,
  "entries": [
   {"size_bytes": 1024, "min_bytes": 0, "max_bytes": 32767,
    "bound_us": 2, "effective_bound_us": 2.5,
    "nccl": {"algorithm": "Ring", "protocol": "LL", "channels": 1, "time_us": 20},
    "native": {"algorithm": "Ring", "protocol": "LL", "channels": 2, "time_us": 18},
    "best": {"candidate": "r1c0", "program": "a<b&c>", "config": "LL/1ch/1sl", "protocol": "LL",
             "channels": 1, "time_us": 10, "program_file": "programs/r1c0.ofl",
             "schedule_json": "schedules/allreduce-1KiB.json", "schedule_xml": "schedules/allreduce-1KiB.xml"}},
   {"size_bytes": 65536, "min_bytes": 32768, "max_bytes": 524287,
    "bound_us": 5, "effective_bound_us": 6,
    "nccl": {"algorithm": "Tree", "protocol": "LL", "channels": 1, "time_us": 0},
    "native": {"algorithm": "Ring", "protocol": "LL128", "channels": 2, "time_us": 30},
    "best": null},
   {"size_bytes": 1048576, "min_bytes": 524288, "max_bytes": 536870911,
    "bound_us": 50, "effective_bound_us": 60,
    "nccl": {"algorithm": "Ring", "protocol": "Simple", "channels": 4, "time_us": 200},
    "native": {"algorithm": "Ring", "protocol": "LL128", "channels": 8, "time_us": 150},
    "best": {"candidate": "r0c0", "program": "ring2", "config": "LL128/2ch/2sl", "protocol": "LL128",
             "channels": 2, "time_us": 104.8576, "program_file": "programs/r0c0.ofl",
             "schedule_json": "schedules/allreduce-1MiB.json", "schedule_xml": "schedules/allreduce-1MiB.xml"}},
   {"size_bytes": 1073741824, "min_bytes": 536870912, "max_bytes": 18446744073709551615,
    "bound_us": 10000, "effective_bound_us": 12000,
    "nccl": null,
    "native": {"algorithm": "Ring", "protocol": "Simple", "channels": 16, "time_us": 20000},
    "best": {"candidate": "r0c0", "program": "ring2", "config": "Simple/16ch/4sl", "protocol": "Simple",
             "channels": 16, "time_us": 15000, "program_file": "programs/r0c0.ofl",
             "schedule_json": "schedules/allreduce-1GiB.json", "schedule_xml": "schedules/allreduce-1GiB.xml"}}
  ]}]}
)";

constexpr std::string_view kHistory =
    R"({"id": "r0c0", "round": 0, "origin": "gallery:ring", "name": "ring2", "text": "...", "stage": "ok", "errors": "", "sizes": [{"size_bytes": 1024, "ok": true, "error": "", "time_us": 16, "bound_us": 2, "nccl_us": 20, "config": "LL/1ch/1sl", "bottleneck": ""}, {"size_bytes": 1048576, "ok": true, "error": "", "time_us": 300, "bound_us": 50, "nccl_us": 200, "config": "LL128/2ch/2sl", "bottleneck": ""}]}
{"id": "r0c1", "round": 0, "origin": "llm", "name": "", "text": "garbage", "stage": "parse", "errors": "x.ofl:1:1: expected <program>", "sizes": []}
{"id": "r1c0", "round": 1, "origin": "mutate:r0c0:strategy", "name": "a<b&c>", "text": "...", "stage": "ok", "errors": "", "sizes": [{"size_bytes": 1024, "ok": true, "error": "", "time_us": 10, "bound_us": 2, "nccl_us": 20, "config": "LL/1ch/1sl", "bottleneck": ""}, {"size_bytes": 1048576, "ok": false, "error": "deadlock", "time_us": 0, "bound_us": 50, "nccl_us": 200, "config": "", "bottleneck": ""}]}
{"id": "r1c1", "round": 1, "origin": "llm", "name": "ring2", "text": "...", "stage": "duplicate", "errors": "same as r0c0", "sizes": []}
{"id": "r1c2", "round": 1, "origin": "llm", "name": "x", "text": "...", "stage": "expand", "errors": "bad", "sizes": []}
)";

using optiflow::testsupport::TempDir;

std::size_t count(std::string_view haystack, std::string_view needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string_view::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// 1-based line of the first occurrence of `needle` in `text`.
int lineOf(std::string_view text, std::string_view needle) {
  const auto pos = text.find(needle);
  return static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n')) + 1;
}

std::string replaced(std::string_view text, std::string_view from, std::string_view to) {
  std::string s(text);
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

std::string render(const TempDir& dir) {
  auto r = renderReport(dir.path());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().str());
  return r.ok() ? r.value() : "";
}

// The legend entry's text, which begins with the series name.
std::string legendOf(std::string_view series) { return "y=\"38\">" + std::string(series) + " ("; }

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

TEST(Report, PageIsSelfContainedHtml) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  dir.write("history.jsonl", kHistory);
  const std::string page = render(dir);
  EXPECT_TRUE(page.starts_with("<!DOCTYPE html>\n"));
  EXPECT_TRUE(endsWith(page, "</html>\n"));
  EXPECT_EQ(count(page, "<svg "), 2u);
  EXPECT_EQ(count(page, "</svg>"), 2u);
  EXPECT_EQ(count(page, "<table"), count(page, "</table>"));
  EXPECT_EQ(count(page, "<section"), count(page, "</section>"));
  EXPECT_EQ(count(page, "<script"), 0u);
  EXPECT_EQ(count(page, "http://"), 2u);  // the SVG namespaces, nothing fetched
  EXPECT_EQ(count(page, "https://"), 0u);
  EXPECT_NE(page.find("<h1>OptiFlow report: dgx-a100x1</h1>"), std::string::npos);
  for (const std::string_view meta : {"8 ranks on 1 node (8 GPUs per node)", "proposer builtin", "evaluator simulator",
                                      "rounds 2", "candidates 5", "elapsed 12.5 s", "stopped converged"}) {
    EXPECT_NE(page.find(meta), std::string::npos) << meta;
  }
}

TEST(Report, PlotsFourSeriesAndSkipsMissingValues) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  const std::string page = render(dir);
  for (const std::string_view s : {"nccl", "native", "optiflow", "bound"}) {
    EXPECT_EQ(count(page, legendOf(s)), s == "bound" ? 1u : 2u) << s;
  }
  // nccl: 64KiB has time 0 and 1GiB is null; optiflow: 64KiB has no best.
  EXPECT_EQ(count(page, "data-plot=\"busbw\" data-series=\"nccl\""), 2u);
  EXPECT_EQ(count(page, "data-plot=\"busbw\" data-series=\"native\""), 4u);
  EXPECT_EQ(count(page, "data-plot=\"busbw\" data-series=\"optiflow\""), 3u);
  EXPECT_EQ(count(page, "data-plot=\"busbw\" data-series=\"bound\""), 4u);
  EXPECT_EQ(count(page, "<circle "), 13u + 9u);
  EXPECT_EQ(count(page, "data-series=\"optiflow\" data-size=\"65536\""), 0u);
  EXPECT_EQ(count(page, "data-series=\"nccl\" data-size=\"65536\""), 0u);
  EXPECT_EQ(count(page, "data-value=\"0\""), 0u);
  // 1MiB in 104.8576 us is 10 GB/s algbw; AllReduce on 8 ranks: busbw = 10 * 2 * 7/8 = 17.5.
  EXPECT_NE(page.find("data-plot=\"busbw\" data-series=\"optiflow\" data-size=\"1048576\" data-value=\"17.5\""),
            std::string::npos);
  // The bound: 1KiB in 2 us = 0.512 GB/s algbw, 0.896 busbw.
  EXPECT_NE(page.find("data-series=\"bound\" data-size=\"1024\" data-value=\"0.896\""), std::string::npos);
  // Time over the bound: NCCL at 1KiB is 20 / 2.
  EXPECT_NE(page.find("data-plot=\"ratio\" data-series=\"nccl\" data-size=\"1024\" data-value=\"10\""),
            std::string::npos);
  EXPECT_EQ(count(page, "data-plot=\"ratio\" data-series=\"optiflow\""), 3u);
  EXPECT_NE(page.find("data-reference=\"1\""), std::string::npos);
  // Binary size labels on the log2 axis, 1KiB to 1GiB.
  for (const std::string_view label : {">1KiB</text>", ">4KiB</text>", ">1MiB</text>", ">1GiB</text>"}) {
    EXPECT_EQ(count(page, label), 2u) << label;
  }
}

TEST(Report, TableEscapesAndLinks) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  const std::string page = render(dir);
  EXPECT_NE(page.find("<a href=\"programs/r1c0.ofl\">a&lt;b&amp;c&gt;</a>"), std::string::npos);
  EXPECT_EQ(page.find("a<b&c>"), std::string::npos);
  EXPECT_NE(page.find("<a href=\"schedules/allreduce-1KiB.json\">json</a>"), std::string::npos);
  EXPECT_NE(page.find("<a href=\"schedules/allreduce-1GiB.xml\">xml</a>"), std::string::npos);
  EXPECT_EQ(count(page, "<tr data-size="), 4u);
  EXPECT_NE(page.find("no candidate worked"), std::string::npos);
  // 200 / 104.8576 = 1.907x vs NCCL at 1MiB; 20 / 10 = 2x at 1KiB.
  EXPECT_NE(page.find("<td class=\"win\">1.907&#215;</td>"), std::string::npos);
  EXPECT_NE(page.find("<td class=\"win\">2&#215;</td>"), std::string::npos);
  EXPECT_NE(page.find("Ring/Simple/4ch"), std::string::npos);
  EXPECT_NE(page.find("Faster than NCCL's choice at 2 of 2 sizes"), std::string::npos);
}

TEST(Report, HrefsOutsideTheRunDirectoryAreNotLinked) {
  TempDir dir;
  std::string plan = replaced(kPlan, "programs/r1c0.ofl", "javascript:alert(1)");
  plan = replaced(plan, "schedules/allreduce-1KiB.json", "/etc/passwd");
  plan = replaced(plan, "schedules/allreduce-1KiB.xml", "schedules/a b#c.xml");
  plan = replaced(plan, "programs/r0c0.ofl", "../../secret.ofl");
  dir.write("plan.json", plan);
  const std::string page = render(dir);
  EXPECT_EQ(page.find("javascript:"), std::string::npos);
  EXPECT_EQ(page.find("/etc/passwd"), std::string::npos);
  EXPECT_NE(page.find("<a href=\"schedules/a%20b%23c.xml\">xml</a>"), std::string::npos);
  EXPECT_EQ(page.find("href=\"../"), std::string::npos);
  EXPECT_NE(page.find("<a href=\"programs/r0c0.ofl\">ring2</a>"), std::string::npos);  // the 1GiB entry's
}

TEST(Report, HistoryShowsStagesAndBestPerRound) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  dir.write("history.jsonl", kHistory);
  const std::string page = render(dir);
  ASSERT_NE(page.find("<section id=\"history\">"), std::string::npos);
  EXPECT_NE(page.find("5 candidates in 2 rounds"), std::string::npos);
  EXPECT_NE(page.find("<tr data-round=\"0\"><th>0</th><td>2</td><td data-stage=\"ok\">1</td>"
                      "<td data-stage=\"parse\">1</td><td data-stage=\"expand\">0</td>"
                      "<td data-stage=\"duplicate\">0</td></tr>"),
            std::string::npos);
  EXPECT_NE(page.find("<tr data-round=\"all\"><th>all</th><td>5</td><td data-stage=\"ok\">2</td>"
                      "<td data-stage=\"parse\">1</td><td data-stage=\"expand\">1</td>"
                      "<td data-stage=\"duplicate\">1</td></tr>"),
            std::string::npos);
  // 1KiB: 16/2 = 8x after round 0, 10/2 = 5x after round 1. 1MiB: 300/50 = 6x, and round 1 failed there.
  const auto row1k = page.find("<tr data-size=\"1024\"><td class=\"l\">1KiB</td>");
  ASSERT_NE(row1k, std::string::npos);
  const std::string_view r1k = std::string_view(page).substr(row1k, page.find("</tr>", row1k) - row1k);
  EXPECT_NE(r1k.find("<td data-round=\"0\" class=\"gain\""), std::string_view::npos);
  EXPECT_NE(r1k.find(">8&#215;</td>"), std::string_view::npos);
  EXPECT_NE(r1k.find("<td data-round=\"1\" class=\"gain\""), std::string_view::npos);
  EXPECT_NE(r1k.find(">5&#215;</td>"), std::string_view::npos);
  const auto row1m = page.find("<tr data-size=\"1048576\"><td class=\"l\">1MiB</td>");
  ASSERT_NE(row1m, std::string::npos);
  const std::string_view r1m = std::string_view(page).substr(row1m, page.find("</tr>", row1m) - row1m);
  EXPECT_EQ(count(r1m, ">6&#215;</td>"), 2u);
  EXPECT_EQ(count(r1m, "class=\"gain\""), 1u);
}

TEST(Report, NoHistoryNoSection) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  const std::string page = render(dir);
  EXPECT_EQ(page.find("id=\"history\""), std::string::npos);
}

TEST(Report, IncompleteLastHistoryLineIsSkipped) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  std::string history(kHistory);
  history += R"({"id": "r2c0", "round": 2, "sta)";  // killed mid-write: no newline
  dir.write("history.jsonl", history);
  const std::string page = render(dir);
  EXPECT_NE(page.find("incomplete"), std::string::npos);
  EXPECT_NE(page.find("5 candidates in 2 rounds"), std::string::npos);
}

TEST(Report, OutputIsDeterministic) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  dir.write("history.jsonl", kHistory);
  EXPECT_EQ(render(dir), render(dir));
}

TEST(ReportErrors, MissingDirectory) {
  TempDir dir;
  auto r = renderReport(dir.path() / "nope");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no such directory"), std::string::npos) << r.error().str();
}

TEST(ReportErrors, MissingPlan) {
  TempDir dir;
  dir.write("history.jsonl", kHistory);
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(endsWith(r.error().file, "plan.json")) << r.error().str();
  EXPECT_NE(r.error().message.find("no such file"), std::string::npos) << r.error().str();
}

TEST(ReportErrors, BadJsonGivesTheLine) {
  TempDir dir;
  dir.write("plan.json", "{\n  \"topology\": \"x\",\n  \"ranks\": 8,,\n  \"nodes\": 1\n}\n");
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(endsWith(r.error().file, "plan.json"));
  EXPECT_EQ(r.error().line, 3) << r.error().str();
  EXPECT_EQ(r.error().column, 14) << r.error().str();
  EXPECT_NE(r.error().message.find("expected JSON"), std::string::npos) << r.error().str();
}

TEST(ReportErrors, MissingFieldNamesItsPath) {
  TempDir dir;
  dir.write("plan.json", replaced(kPlan, R"("bound_us": 50, )", ""));
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "collectives[0].entries[2].bound_us: missing") << r.error().str();
  // Points at the entry that lacks it.
  EXPECT_EQ(r.error().line, lineOf(kPlan, R"({"size_bytes": 1048576)")) << r.error().str();
}

TEST(ReportErrors, WrongTypeNamesItsPathAndLine) {
  TempDir dir;
  const std::string plan = replaced(kPlan, R"("time_us": 104.8576)", R"("time_us": "fast")");
  dir.write("plan.json", plan);
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().message.starts_with("collectives[0].entries[2].best.time_us: expected a non-negative number"))
      << r.error().str();
  EXPECT_EQ(r.error().line, lineOf(plan, "\"fast\"")) << r.error().str();
  EXPECT_GT(r.error().column, 1);
}

TEST(ReportErrors, ZeroRanksIsAnError) {
  TempDir dir;
  dir.write("plan.json", replaced(kPlan, R"("ranks": 8, "nodes": 1, "gpus_per_node")",
                                  R"("ranks": 0, "nodes": 1, "gpus_per_node")"));
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "ranks: expected at least 1, got 0") << r.error().str();
  EXPECT_EQ(r.error().line, 2);
}

TEST(Report, EntriesAreDrawnInSizeOrder) {
  TempDir dir;
  // Swap the sizes of the first and third entries.
  std::string plan = replaced(kPlan, R"({"size_bytes": 1024,)", R"({"size_bytes": SWAP,)");
  plan = replaced(plan, R"({"size_bytes": 1048576,)", R"({"size_bytes": 1024,)");
  plan = replaced(plan, R"({"size_bytes": SWAP,)", R"({"size_bytes": 1048576,)");
  dir.write("plan.json", plan);
  const std::string page = render(dir);
  EXPECT_LT(page.find("<tr data-size=\"1024\">"), page.find("<tr data-size=\"65536\">"));
  EXPECT_LT(page.find("<tr data-size=\"65536\">"), page.find("<tr data-size=\"1048576\">"));
}

TEST(ReportErrors, UnknownCollective) {
  TempDir dir;
  dir.write("plan.json", replaced(kPlan, R"("collective": "allreduce")", R"("collective": "allgossip")"));
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("collectives[0].collective: expected allgather, reducescatter"), std::string::npos)
      << r.error().str();
}

TEST(ReportErrors, BadHistoryLineNamesFileAndLine) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  std::string history(kHistory);
  history.insert(history.find("{\"id\": \"r1c0\""), "{\"id\": oops}\n");  // becomes line 3
  dir.write("history.jsonl", history);
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(endsWith(r.error().file, "history.jsonl"));
  EXPECT_EQ(r.error().line, 3);
  EXPECT_NE(r.error().str().find("history.jsonl:3:"), std::string::npos) << r.error().str();
}

TEST(ReportErrors, HistoryRecordMissingFieldNamesLineAndField) {
  TempDir dir;
  dir.write("plan.json", kPlan);
  dir.write("history.jsonl", replaced(kHistory, R"("stage": "parse", )", ""));
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().line, 2) << r.error().str();
  EXPECT_EQ(r.error().message, "stage: missing");
}

TEST(ReportErrors, DeepNestingIsRefused) {
  TempDir dir;
  dir.write("plan.json", std::string(100000, '[') + std::string(100000, ']'));
  auto r = renderReport(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("nested"), std::string::npos);
}

TEST(ReportErrors, TruncatedPlansAreErrorsNotCrashes) {
  TempDir dir;
  const std::string_view plan = kPlan.substr(0, kPlan.rfind('}'));  // every proper prefix is invalid JSON
  for (std::size_t n = 0; n < plan.size(); n += (n < 64 ? 1 : 7)) {
    dir.write("plan.json", plan.substr(0, n));
    auto r = renderReport(dir.path());
    EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes";
    if (!r.ok()) {
      EXPECT_GE(r.error().line, n == 0 ? 0 : 1) << n;
    }
  }
}

TEST(ReportErrors, MangledFieldsAreErrorsNotCrashes) {
  TempDir dir;
  // Each value of the plan in turn replaced by something of another type.
  const std::string text(kPlan);
  int errors = 0;
  for (std::size_t pos = text.find(": "); pos != std::string::npos; pos = text.find(": ", pos + 1)) {
    std::string mangled = text;
    mangled.insert(pos + 2, "[true],\"x\":");
    dir.write("plan.json", mangled);
    auto r = renderReport(dir.path());
    if (!r.ok()) ++errors;
  }
  EXPECT_GT(errors, 40);
}

}  // namespace
}  // namespace optiflow::synth
