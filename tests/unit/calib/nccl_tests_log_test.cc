#include "optiflow/calib/nccl_tests_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "temp_dir.h"

namespace {

using namespace optiflow;
using calib::LogRow;
using calib::LogRun;
using calib::NcclTestsLog;
using core::Collective;

namespace fs = std::filesystem;

fs::path logsDir() { return fs::path(OPTIFLOW_SOURCE_DIR "/../shared/reference/nccl-tests-logs"); }

std::string readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

core::Result<NcclTestsLog> parse(std::string_view text) { return calib::parseNcclTestsLog(text, "t.log"); }

// "#  Rank %2d Group %2d Pid %6d on %10s device %2d [dddd:bb:dd] <name>" for `ranks` ranks, `perNode` per host
// ("node-0", "node-1", ...), as the root prints them since 2025-02.
std::string rankLines(int ranks, int perNode, const std::string& gpu = "NVIDIA H100 80GB HBM3") {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    char buf[256];
    const std::string host = "node-" + std::to_string(r / perNode);
    std::snprintf(buf, sizeof buf, "#  Rank %2d Group  0 Pid %6d on %10s device %2d [0000:%02x:00] %s\n", r, 40000 + r,
                  host.c_str(), r % perNode, 0x18 + 16 * (r % perNode), gpu.c_str());
    out += buf;
  }
  return out;
}

// The head of a run as nccl-tests 2.19 prints it, up to the table header (whose two lines are `table`).
std::string currentHead(const std::string& program, int ranks, int perNode, int graph = 0,
                        const std::string& table = "") {
  std::string out = "# nccl-tests version 2.19.6 nccl-headers=22902 nccl-library=22902\n";
  out += "# Collective test starting: " + program + "\n";
  out +=
      "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 1 iters: 50 agg iters: 1 "
      "validation: 1 graph: " +
      std::to_string(graph) + " unalign: 0\n";
  out += "#\n# Using devices\n" + rankLines(ranks, perNode) + "#\n";
  out += table.empty() ? "#       size         count      type   redop    root     time   algbw   busbw  #wrong     "
                         "time   algbw   busbw  #wrong \n"
                         "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             "
                         "(us)  (GB/s)  (GB/s)         \n"
                       : table;
  return out;
}

// One row of the current table: size count type redop root, then time algbw busbw #wrong for each buffer mode (the
// reader takes no bandwidth, so those are placeholders).
std::string row(std::uint64_t size, std::uint64_t count, const char* type, const char* redop, int root,
                const char* outUs, const char* inUs, const char* outWrong = "0", const char* inWrong = "0") {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%12llu  %12llu  %8s  %6s  %6d  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
                static_cast<unsigned long long>(size), static_cast<unsigned long long>(count), type, redop, root, outUs,
                "0.10", "0.10", outWrong, inUs, "0.10", "0.10", inWrong);
  return buf;
}

const char* const kFooter =
    "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.1 \n#\n# Collective test concluded: x\n";

// ---------------------------------------------------------------------------------------------------------------
// The real logs in ../shared/reference/nccl-tests-logs, with the numbers as they stand in the files.

struct RealLog {
  int ranks;
  int nodes;
  std::string gpu;
  int rows;
  int firstLine;
  std::uint64_t firstSize;
  double firstOutUs;
  double firstInUs;
  int lastLine;
  std::uint64_t lastSize;
  double lastOutUs;
  double lastInUs;
  int ncclVersion;
  std::string testsVersion;
};

const std::map<std::string, RealLog>& realLogs() {
  static const std::map<std::string, RealLog> m = {
      {"abci-a100x1-allreduce.log",
       {8, 1, "NVIDIA A100-SXM4-40GB", 24, 17, 4, 17.18, 17.04, 40, 33554432, 360.60, 357.50, 0, ""}},
      {"abci-a100x2-allreduce.log",
       {16, 2, "NVIDIA A100-SXM4-40GB", 24, 25, 4, 33.50, 32.56, 48, 33554432, 1887.30, 1885.60, 0, ""}},
      {"abci-a100x4-allreduce.log",
       {32, 4, "NVIDIA A100-SXM4-40GB", 24, 51, 4, 42.34, 42.15, 74, 33554432, 2075.40, 2074.60, 0, ""}},
      {"abci-a100x16-allreduce.log",
       {128, 16, "NVIDIA A100-SXM4-40GB", 24, 137, 4, 67.85, 61.84, 160, 33554432, 2500.70, 2520.80, 0, ""}},
      {"p4de-a100x2-allreduce.log",
       {16, 2, "NVIDIA A100-SXM4-80GB", 29, 31, 8, 164.30, 163.30, 59, 2147483648, 51406.0, 51406.0, 0, ""}},
      {"dgx-h100x1-allreduce.log",
       {8, 1, "NVIDIA H100 80GB HBM3", 32, 18, 8, 13.67, 13.03, 49, 17179869184, 62648.0, 62636.0, 22602, "2.17.1"}},
  };
  return m;
}

TEST(NcclTestsLogReal, EveryReferenceLogReadsWithItsNumbers) {
  if (!fs::is_directory(logsDir()))
    GTEST_SKIP() << "no reference logs at " << logsDir() << " (a clone lacks ../shared)";
  std::set<std::string> seen;
  for (const auto& entry : fs::directory_iterator(logsDir())) {
    if (entry.path().extension() != ".log") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const auto it = realLogs().find(name);
    ASSERT_NE(it, realLogs().end()) << "a new reference log: add its numbers to realLogs()";
    const RealLog& exp = it->second;
    seen.insert(name);

    auto r = calib::readNcclTestsLog(entry.path());
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->file, entry.path().string());
    EXPECT_FALSE(r->json);
    ASSERT_EQ(r->runs.size(), 1u);
    const LogRun& run = r->runs[0];
    EXPECT_EQ(run.line, 1);
    EXPECT_EQ(run.program, "all_reduce_perf");
    EXPECT_EQ(run.collective, Collective::AllReduce);
    EXPECT_EQ(run.collectiveFrom, "program");
    EXPECT_EQ(run.ranks, exp.ranks);
    EXPECT_EQ(run.nodes, exp.nodes);
    ASSERT_EQ(run.hosts.size(), static_cast<std::size_t>(exp.nodes));
    EXPECT_EQ(run.hosts.front(), "gpu-node-000");
    EXPECT_EQ(run.gpuName, exp.gpu);
    EXPECT_EQ(run.graph, 0);
    EXPECT_EQ(run.iters, 20);
    EXPECT_EQ(run.warmupIters, 5);
    EXPECT_FALSE(run.cpuTime);
    EXPECT_EQ(run.ncclVersion, exp.ncclVersion);
    EXPECT_EQ(run.testsVersion, exp.testsVersion);
    EXPECT_EQ(run.incompleteRows, 0);
    EXPECT_TRUE(run.notes.empty());
    ASSERT_EQ(run.rows.size(), static_cast<std::size_t>(exp.rows));

    const LogRow& first = run.rows.front();
    EXPECT_EQ(first.line, exp.firstLine);
    EXPECT_EQ(first.sizeBytes, exp.firstSize);
    EXPECT_EQ(first.outOfPlaceUs, exp.firstOutUs);
    EXPECT_EQ(first.inPlaceUs, exp.firstInUs);
    EXPECT_EQ(first.timeUs(), exp.firstOutUs);
    const LogRow& last = run.rows.back();
    EXPECT_EQ(last.line, exp.lastLine);
    EXPECT_EQ(last.sizeBytes, exp.lastSize);
    EXPECT_EQ(last.outOfPlaceUs, exp.lastOutUs);
    EXPECT_EQ(last.inPlaceUs, exp.lastInUs);

    // Every row: a float sum of count x 4 bytes, sizes doubling, validated without a wrong element.
    for (std::size_t i = 0; i < run.rows.size(); ++i) {
      const LogRow& row = run.rows[i];
      SCOPED_TRACE(row.line);
      EXPECT_EQ(row.type, "float");
      EXPECT_EQ(row.redop, "sum");
      EXPECT_EQ(row.root, -1);
      EXPECT_EQ(row.count * 4, row.sizeBytes);
      EXPECT_EQ(row.outOfPlaceWrong, 0);
      EXPECT_EQ(row.inPlaceWrong, 0);
      EXPECT_FALSE(row.wrong());
      if (i > 0) {
        EXPECT_EQ(row.sizeBytes, 2 * run.rows[i - 1].sizeBytes);
        EXPECT_GT(row.line, run.rows[i - 1].line);
      }
    }
  }
  EXPECT_EQ(seen.size(), realLogs().size()) << "a reference log named in realLogs() is missing";
}

// The mpirun prefixes and the NCCL INFO lines of the pasted logs must not change what is read: the same log with them
// stripped gives the same runs (line numbers aside where INFO lines went away).
TEST(NcclTestsLogReal, PrefixesAndInfoLinesChangeNothing) {
  if (!fs::is_directory(logsDir()))
    GTEST_SKIP() << "no reference logs at " << logsDir() << " (a clone lacks ../shared)";
  for (const char* name : {"abci-a100x2-allreduce.log", "abci-a100x4-allreduce.log", "p4de-a100x2-allreduce.log"}) {
    SCOPED_TRACE(name);
    const std::string text = readFile(logsDir() / name);
    ASSERT_FALSE(text.empty());
    std::string plain;
    int prefixes = 0;
    int infos = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.find(" NCCL INFO ") != std::string::npos) {
        ++infos;
        continue;
      }
      if (line.starts_with("[1,")) {
        line.erase(0, line.find(':') + 1);
        ++prefixes;
      }
      plain += line + "\n";
    }
    EXPECT_GT(prefixes + infos, 0) << "the log has neither: the test proves nothing";

    auto withThem = calib::parseNcclTestsLog(text, name);
    auto without = calib::parseNcclTestsLog(plain, name);
    ASSERT_TRUE(withThem.ok()) << withThem.error().str();
    ASSERT_TRUE(without.ok()) << without.error().str();
    ASSERT_EQ(withThem->runs.size(), 1u);
    ASSERT_EQ(without->runs.size(), 1u);
    const LogRun& a = withThem->runs[0];
    const LogRun& b = without->runs[0];
    EXPECT_EQ(a.ranks, b.ranks);
    EXPECT_EQ(a.hosts, b.hosts);
    EXPECT_EQ(a.gpuName, b.gpuName);
    EXPECT_EQ(a.program, b.program);
    EXPECT_EQ(a.incompleteRows, 0);
    ASSERT_EQ(a.rows.size(), b.rows.size());
    for (std::size_t i = 0; i < a.rows.size(); ++i) {
      EXPECT_EQ(a.rows[i].sizeBytes, b.rows[i].sizeBytes);
      EXPECT_EQ(a.rows[i].count, b.rows[i].count);
      EXPECT_EQ(a.rows[i].outOfPlaceUs, b.rows[i].outOfPlaceUs);
      EXPECT_EQ(a.rows[i].inPlaceUs, b.rows[i].inPlaceUs);
      if (infos == 0) {
        EXPECT_EQ(a.rows[i].line, b.rows[i].line);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Synthetic logs of every generation.

// nccl-tests 2.19 (late 2025): the version line, "unalign" in the nThread line, PCI ids as dddd:bb:dd.
TEST(NcclTestsLog, CurrentLayoutWithVersionLine) {
  const std::string text = currentHead("all_reduce_perf", 4, 2) + row(1024, 256, "float", "sum", -1, "21.50", "21.10") +
                           row(2048, 512, "float", "sum", -1, "22.75", "22.40") +
                           row(4096, 1024, "float", "sum", -1, "1.2e+07", "1234567") + kFooter;
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->file, "t.log");
  ASSERT_EQ(r->runs.size(), 1u);
  const LogRun& run = r->runs[0];
  EXPECT_EQ(run.line, 1);
  EXPECT_EQ(run.testsVersion, "2.19.6");
  EXPECT_EQ(run.ncclVersion, 22902);
  EXPECT_EQ(run.program, "all_reduce_perf");
  EXPECT_EQ(run.collective, Collective::AllReduce);
  EXPECT_EQ(run.ranks, 4);
  EXPECT_EQ(run.nodes, 2);
  EXPECT_EQ(run.hosts, (std::vector<std::string>{"node-0", "node-1"}));
  EXPECT_EQ(run.gpuName, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(run.iters, 50);
  EXPECT_EQ(run.warmupIters, 1);
  EXPECT_EQ(run.graph, 0);
  ASSERT_EQ(run.rows.size(), 3u);
  // 3 head lines, "#", "# Using devices", 4 ranks, "#", 2 table header lines: the rows start at line 13.
  EXPECT_EQ(run.rows[0].line, 13);
  EXPECT_EQ(run.rows[2].line, 15);
  EXPECT_EQ(run.rows[1].sizeBytes, 2048u);
  EXPECT_EQ(run.rows[1].count, 512u);
  EXPECT_EQ(run.rows[1].root, -1);
  EXPECT_EQ(run.rows[1].outOfPlaceUs, 22.75);
  EXPECT_EQ(run.rows[1].inPlaceUs, 22.40);
  // Times too wide for %7.2f print with fewer decimals or in exponent form.
  EXPECT_EQ(run.rows[2].outOfPlaceUs, 1.2e7);
  EXPECT_EQ(run.rows[2].inPlaceUs, 1234567.0);
}

// Before 2022-08: no root column, an "error" float (largest deviation) instead of #wrong, "#   Rank" lines without
// Group and with [0x%02x] bus ids, no "agg iters" or "graph" in the nThread line.
TEST(NcclTestsLog, OldLayoutWithoutRootAndWithErrorColumn) {
  const std::string text =
      R"(# nThread 1 nGpus 4 minBytes 8 maxBytes 32 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 
#
# Using devices
#   Rank  0 Pid  12001 on      dgx1v device  0 [0x06] Tesla V100-SXM2-32GB
#   Rank  1 Pid  12001 on      dgx1v device  1 [0x07] Tesla V100-SXM2-32GB
#   Rank  2 Pid  12001 on      dgx1v device  2 [0x0a] Tesla V100-SXM2-32GB
#   Rank  3 Pid  12001 on      dgx1v device  3 [0x0b] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place          
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2   float     sum    27.31    0.00    0.00  0e+00    26.85    0.00    0.00  0e+00
          16             4   float     sum    26.90    0.00    0.00  2e-07    26.77    0.00    0.00  2e-07
          32             8   float     sum    27.02    0.00    0.00  4e+00    26.91    0.00    0.00  0e+00
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 0.00 
#
)";
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->runs.size(), 1u);
  const LogRun& run = r->runs[0];
  EXPECT_EQ(run.program, "");
  EXPECT_EQ(run.collective, Collective::AllReduce);
  EXPECT_EQ(run.collectiveFrom, "columns");
  EXPECT_EQ(run.ranks, 4);
  EXPECT_EQ(run.nodes, 1);
  EXPECT_EQ(run.gpuName, "Tesla V100-SXM2-32GB");
  EXPECT_EQ(run.iters, 20);
  EXPECT_EQ(run.graph, 0);
  EXPECT_EQ(run.ncclVersion, 0);
  EXPECT_EQ(run.testsVersion, "");
  ASSERT_EQ(run.rows.size(), 3u);
  EXPECT_EQ(run.rows[0].line, 12);
  EXPECT_EQ(run.rows[0].root, -1);
  EXPECT_EQ(run.rows[0].redop, "sum");
  EXPECT_EQ(run.rows[0].outOfPlaceUs, 27.31);
  EXPECT_EQ(run.rows[0].inPlaceUs, 26.85);
  EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
  // 2e-07 is float rounding, not a wrong result; 4e+00 is.
  EXPECT_EQ(run.rows[1].outOfPlaceWrong, 0);
  EXPECT_FALSE(run.rows[1].wrong());
  EXPECT_EQ(run.rows[2].outOfPlaceWrong, 1);
  EXPECT_EQ(run.rows[2].inPlaceWrong, 0);
  EXPECT_TRUE(run.rows[2].wrong());
}

// A pasted table body without any header line: nccl-tests' column order is assumed, with or without root.
TEST(NcclTestsLog, RowsWithoutHeaderLines) {
  {
    auto r = parse(row(8, 2, "float", "sum", -1, "13.67", "13.03") +
                   row(16, 4, "float", "sum", -1, "13.00", "13.07", "3", "N/A"));
    ASSERT_TRUE(r.ok()) << r.error().str();
    ASSERT_EQ(r->runs.size(), 1u);
    const LogRun& run = r->runs[0];
    EXPECT_EQ(run.ranks, 0);
    EXPECT_EQ(run.collective, Collective::AllReduce);
    ASSERT_EQ(run.rows.size(), 2u);
    EXPECT_EQ(run.rows[0].line, 1);
    EXPECT_EQ(run.rows[0].root, -1);
    EXPECT_EQ(run.rows[0].outOfPlaceUs, 13.67);
    EXPECT_EQ(run.rows[1].inPlaceUs, 13.07);
    EXPECT_EQ(run.rows[1].outOfPlaceWrong, 3);
    EXPECT_EQ(run.rows[1].inPlaceWrong, -1);
  }
  {
    // The old layout: no root, and a float error that is only rounding noise.
    auto r = parse(
        "           8             2     float     sum    27.31    0.00    0.00  2e-07    26.85    0.00    0.00  "
        "0e+00\n");
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRow& row = r->runs.at(0).rows.at(0);
    EXPECT_EQ(row.root, -1);
    EXPECT_EQ(row.outOfPlaceUs, 27.31);
    EXPECT_EQ(row.inPlaceUs, 26.85);
    EXPECT_EQ(row.outOfPlaceWrong, 0);
    EXPECT_FALSE(row.wrong());
  }
}

// -C 1 renames both time columns "cputime".
TEST(NcclTestsLog, CpuTimeColumns) {
  const std::string table =
      "#       size         count      type   redop    root  cputime   algbw   busbw  #wrong  cputime   algbw   "
      "busbw  #wrong \n"
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
      "(GB/s)         \n";
  const std::string text =
      currentHead("all_reduce_perf", 2, 2, 0, table) + row(1024, 256, "float", "sum", -1, "9.25", "9.50");
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  EXPECT_TRUE(run.cpuTime);
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].outOfPlaceUs, 9.25);
  EXPECT_EQ(run.rows[0].inPlaceUs, 9.50);
  EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
}

// -I 1 adds i_min i_max i_p99 i_cv% to each group and -S 1 a timestamp ("%Y-%m-%d %H:%M:%S", two tokens) after the
// in-place group: the header names the columns, so the times and #wrong still come from the right ones.
TEST(NcclTestsLog, PerIterationAndTimestampColumns) {
  const std::string table =
      "#                                                   out-of-place (+ per-iteration)                          "
      "      in-place (+ per-iteration)\n"
      "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    "
      "i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp\n"
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     "
      "(us)      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)   %Y-%m-%d %H:%M:%S\n";
  std::string text = currentHead("all_gather_perf", 4, 4, 0, table);
  text.insert(text.find("#\n# Using"), "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows \n");
  text +=
      "        4096           256     float    none      -1    30.50    0.13    0.10       0    29.10    31.90    "
      "31.80     2.15    30.25    0.14    0.10       2    29.00    31.70    31.60     2.05  2025-11-03 10:00:01\n";
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  EXPECT_EQ(run.collective, Collective::AllGather);
  ASSERT_EQ(run.rows.size(), 1u);
  const LogRow& row = run.rows[0];
  EXPECT_EQ(row.outOfPlaceUs, 30.50);
  EXPECT_EQ(row.inPlaceUs, 30.25);
  EXPECT_EQ(row.outOfPlaceWrong, 0);
  EXPECT_EQ(row.inPlaceWrong, 2);
  EXPECT_TRUE(row.wrong());
  EXPECT_EQ(run.incompleteRows, 0);
}

// -G N: times are CUDA-graph launches, already divided by N.
TEST(NcclTestsLog, GraphReplayCount) {
  for (int graph : {1, 10}) {
    auto r = parse(currentHead("all_reduce_perf", 2, 2, graph) + row(1024, 256, "float", "sum", -1, "8.10", "8.00"));
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->runs.at(0).graph, graph);
    EXPECT_EQ(r->runs.at(0).rows.at(0).outOfPlaceUs, 8.10);
  }
}

// -c 0 prints N/A in #wrong: not validated, which is not wrong.
TEST(NcclTestsLog, NotValidatedRows) {
  auto r =
      parse(currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "10.40", "10.20", "N/A", "N/A"));
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRow& row = r->runs.at(0).rows.at(0);
  EXPECT_EQ(row.outOfPlaceWrong, -1);
  EXPECT_EQ(row.inPlaceWrong, -1);
  EXPECT_FALSE(row.wrong());
  EXPECT_EQ(row.outOfPlaceUs, 10.40);
  EXPECT_EQ(row.inPlaceUs, 10.20);
}

// #wrong > 0 in either mode flags the row; %6g prints a large count in exponent form.
TEST(NcclTestsLog, WrongRowsAreFlagged) {
  auto r = parse(currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "10.40", "10.20") +
                 row(2048, 512, "float", "sum", -1, "11.40", "11.20", "17", "0") +
                 row(4194304, 1048576, "float", "sum", -1, "90.00", "89.00", "0", "1.04858e+06"));
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  ASSERT_EQ(run.rows.size(), 3u);
  EXPECT_FALSE(run.rows[0].wrong());
  EXPECT_EQ(run.rows[1].outOfPlaceWrong, 17);
  EXPECT_EQ(run.rows[1].inPlaceWrong, 0);
  EXPECT_TRUE(run.rows[1].wrong());
  EXPECT_EQ(run.rows[2].outOfPlaceWrong, 0);
  EXPECT_EQ(run.rows[2].inPlaceWrong, 1048580);
  EXPECT_TRUE(run.rows[2].wrong());
  // Wrong rows stay in the run (the calibration leaves them out with a note) and keep their times.
  EXPECT_EQ(run.rows[2].outOfPlaceUs, 90.00);
}

// A killed job: the complete rows are good data, the cut row is counted and named.
TEST(NcclTestsLog, LogCutOffInTheMiddleOfARow) {
  const std::string head = currentHead("all_reduce_perf", 4, 2);
  const std::string rows =
      row(1024, 256, "float", "sum", -1, "21.50", "21.10") + row(2048, 512, "float", "sum", -1, "22.75", "22.40");
  struct Cut {
    std::string tail;
    int columns;
  };
  for (const Cut& cut : {Cut{"        4096          1024     float     sum      -1    24.00    0.1", 7},
                         Cut{"        4096          1024     float     sum      -1", 5},
                         Cut{"        4096          1024     float     sum      -1    24.00    0.17    0.26       0    "
                             "23.9",
                             10}}) {
    SCOPED_TRACE(cut.tail);
    auto r = parse(head + rows + cut.tail);
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    ASSERT_EQ(run.rows.size(), 2u);
    EXPECT_EQ(run.rows[1].outOfPlaceUs, 22.75);
    EXPECT_EQ(run.incompleteRows, 1);
    ASSERT_EQ(run.notes.size(), 1u);
    // The rows stand at lines 13 and 14, the cut one at 15.
    EXPECT_EQ(run.notes[0], "t.log:15: row cut off (" + std::to_string(cut.columns) + " of 13 columns), left out");
  }
}

TEST(NcclTestsLog, LogCutOffBeforeItsFirstCompleteRowIsAnError) {
  auto r = parse(currentHead("all_reduce_perf", 4, 2) + "        1024           256     float     sum      -1    21.5");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "t.log");
  EXPECT_EQ(r.error().line, 1);  // where the run starts
  EXPECT_NE(r.error().message.find("no complete result row (1 cut off)"), std::string::npos) << r.error().message;
}

// mpirun's "[1,r]<stdout>:" and "[r] ", srun --label's "r: " on every line; the root prints every rank's line.
TEST(NcclTestsLog, LauncherPrefixes) {
  for (const std::string prefix : {"[1,0]<stdout>:", "[0] ", "0: ", " 12: "}) {
    SCOPED_TRACE(prefix);
    std::string text;
    std::istringstream in(currentHead("reduce_scatter_perf", 8, 4) +
                          row(8192, 256, "float", "sum", -1, "30.10", "29.90") +
                          row(16384, 512, "float", "sum", -1, "31.20", "31.00") + kFooter);
    for (std::string line; std::getline(in, line);) text += prefix + line + "\n";
    auto r = parse(text);
    ASSERT_TRUE(r.ok()) << r.error().str();
    ASSERT_EQ(r->runs.size(), 1u);
    const LogRun& run = r->runs[0];
    EXPECT_EQ(run.program, "reduce_scatter_perf");
    EXPECT_EQ(run.collective, Collective::ReduceScatter);
    EXPECT_EQ(run.ranks, 8);
    EXPECT_EQ(run.nodes, 2);
    EXPECT_EQ(run.testsVersion, "2.19.6");
    EXPECT_EQ(run.gpuName, "NVIDIA H100 80GB HBM3");
    ASSERT_EQ(run.rows.size(), 2u);
    EXPECT_EQ(run.rows[0].line, 17);
    EXPECT_EQ(run.rows[0].sizeBytes, 8192u);
    EXPECT_EQ(run.rows[0].count, 256u);
    EXPECT_EQ(run.rows[1].outOfPlaceUs, 31.20);
    EXPECT_EQ(run.rows[1].inPlaceUs, 31.00);
  }
}

// NCCL_DEBUG=INFO output between the header lines and the rows, a WARN line, the NCCL version from an INFO line.
TEST(NcclTestsLog, NcclInfoAndWarnLinesInBetween) {
  const std::string text = R"(# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41000 on     node-0 device  0 [0000:18:00] NVIDIA A100-SXM4-80GB
node-0:41000:41000 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
node-0:41000:41000 [0] NCCL INFO NCCL version 2.18.5+cuda12.2
#  Rank  1 Group  0 Pid  41001 on     node-1 device  0 [0000:18:00] NVIDIA A100-SXM4-80GB
node-1:41001:41050 [0] NCCL INFO 1024 256 float sum -1 coll channels, 0 nvls channels, 2 p2p channels
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong 
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         
node-0:41000:41060 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
        1024           256     float     sum      -1    40.10    0.03    0.03       0    39.90    0.03    0.03       0
node-1:41001:41070 [0] NCCL WARN NET/IB : Got async event : port error
        2048           512     float     sum      -1    41.20    0.05    0.05       0    41.00    0.05    0.05       0
# Out of bounds values : 0 OK
)";
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->runs.size(), 1u);
  const LogRun& run = r->runs[0];
  EXPECT_EQ(run.ncclVersion, 21805);
  EXPECT_EQ(run.ranks, 2);
  EXPECT_EQ(run.nodes, 2);
  EXPECT_EQ(run.incompleteRows, 0);
  ASSERT_EQ(run.rows.size(), 2u);
  EXPECT_EQ(run.rows[0].line, 14);
  EXPECT_EQ(run.rows[1].line, 16);
  EXPECT_EQ(run.rows[1].outOfPlaceUs, 41.20);
}

// An INFO line before any header gives the NCCL version of the run that follows; the version line's
// nccl-library code wins over an INFO line.
TEST(NcclTestsLog, NcclVersionSources) {
  {
    auto r = parse("node-0:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + currentHead("all_reduce_perf", 2, 2) +
                   row(1024, 256, "float", "sum", -1, "10.00", "10.00"));
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->runs.at(0).ncclVersion, 22902);
  }
  {
    std::string text = currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "10.00", "10.00");
    text.erase(0, text.find('\n') + 1);  // no version line
    auto r = parse("node-0:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + text);
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->runs.at(0).ncclVersion, 22105);
    EXPECT_EQ(r->runs.at(0).testsVersion, "");
  }
  {
    // NCCL_VERSION_CODE before 2.9 is major*1000 + minor*100 + patch.
    std::string text = currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "10.00", "10.00");
    text.replace(0, text.find('\n'), "# nccl-tests version 2.10.0 nccl-headers=2804 nccl-library=2804");
    auto r = parse(text);
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->runs.at(0).ncclVersion, 20804);
    EXPECT_EQ(r->runs.at(0).testsVersion, "2.10.0");
  }
}

// A script that runs several tests into one file: one run each, with its own header and ranks.
TEST(NcclTestsLog, SeveralRunsInOneFile) {
  const std::string ar = currentHead("all_reduce_perf", 8, 8) + row(1024, 256, "float", "sum", -1, "12.00", "11.90") +
                         row(2048, 512, "float", "sum", -1, "12.50", "12.40") + kFooter;
  const std::string ag =
      currentHead("all_gather_perf", 8, 8) + row(8192, 256, "float", "none", -1, "14.00", "13.80") + kFooter;
  const std::string bc = currentHead("broadcast_perf", 4, 4) + row(1024, 256, "float", "none", 0, "11.00", "10.90") +
                         row(2048, 512, "float", "none", 0, "11.50", "11.40") +
                         row(4096, 1024, "float", "none", 0, "12.00", "11.90") + kFooter;
  auto r = parse(ar + ag + bc);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->runs.size(), 3u);
  const int arLines = static_cast<int>(std::count(ar.begin(), ar.end(), '\n'));
  const int agLines = static_cast<int>(std::count(ag.begin(), ag.end(), '\n'));
  EXPECT_EQ(r->runs[0].line, 1);
  EXPECT_EQ(r->runs[1].line, arLines + 1);
  EXPECT_EQ(r->runs[2].line, arLines + agLines + 1);
  EXPECT_EQ(r->runs[0].program, "all_reduce_perf");
  EXPECT_EQ(r->runs[1].program, "all_gather_perf");
  EXPECT_EQ(r->runs[2].program, "broadcast_perf");
  EXPECT_EQ(r->runs[0].collective, Collective::AllReduce);
  EXPECT_EQ(r->runs[1].collective, Collective::AllGather);
  EXPECT_EQ(r->runs[2].collective, Collective::Broadcast);
  EXPECT_EQ(r->runs[0].ranks, 8);
  EXPECT_EQ(r->runs[1].ranks, 8);
  EXPECT_EQ(r->runs[2].ranks, 4);
  EXPECT_EQ(r->runs[0].rows.size(), 2u);
  EXPECT_EQ(r->runs[1].rows.size(), 1u);
  ASSERT_EQ(r->runs[2].rows.size(), 3u);
  EXPECT_EQ(r->runs[1].rows[0].outOfPlaceUs, 14.00);
  EXPECT_EQ(r->runs[2].rows[2].outOfPlaceUs, 12.00);
  for (const LogRow& row : r->runs[2].rows) EXPECT_EQ(row.root, 0);
  for (const LogRun& run : r->runs) EXPECT_EQ(run.ncclVersion, 22902);
}

// Old logs without "Collective test starting": a new nThread line after rows starts the next run.
TEST(NcclTestsLog, SeveralOldRunsSplitAtTheirHeaders) {
  const std::string run =
      R"(# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 
#
# Using devices
#   Rank  0 Pid  12001 on      dgx1v device  0 [0x06] Tesla V100-SXM2-32GB
#   Rank  1 Pid  12001 on      dgx1v device  1 [0x07] Tesla V100-SXM2-32GB
#
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2   float     sum    27.31    0.00    0.00  0e+00    26.85    0.00    0.00  0e+00
# Out of bounds values : 0 OK
)";
  auto r = parse(run + run);
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->runs.size(), 2u);
  EXPECT_EQ(r->runs[0].line, 1);
  EXPECT_EQ(r->runs[1].line, 11);
  for (const LogRun& x : r->runs) {
    EXPECT_EQ(x.ranks, 2);
    ASSERT_EQ(x.rows.size(), 1u);
    EXPECT_EQ(x.rows[0].outOfPlaceUs, 27.31);
  }
  EXPECT_EQ(r->runs[1].rows[0].line, 19);
}

// Without a program line the collective comes from the columns: redop, root, and count x type against size (count
// is per rank for all_gather and reduce_scatter, so size = count x type x ranks there).
TEST(NcclTestsLog, CollectiveFromColumns) {
  struct Case {
    std::string name;
    std::string rows;
    std::optional<Collective> expected;
  };
  const std::vector<Case> cases = {
      {"allreduce", row(1024, 256, "float", "sum", -1, "10.00", "10.00"), Collective::AllReduce},
      {"allgather", row(8192, 256, "float", "none", -1, "10.00", "10.00"), Collective::AllGather},
      {"reducescatter", row(8192, 512, "half", "sum", -1, "10.00", "10.00"), Collective::ReduceScatter},
      {"broadcast", row(1024, 256, "float", "none", 2, "10.00", "10.00"), Collective::Broadcast},
      {"reduce", row(1024, 128, "double", "max", 0, "10.00", "10.00"), Collective::Reduce},
      // gather_perf: a root and a gathered size; no collective of ours.
      {"gather", row(8192, 256, "float", "none", 0, "10.00", "10.00"), std::nullopt},
      // Rows that disagree (an all-reduce size, then a reduce-scatter one) say nothing.
      {"ambiguous",
       row(1024, 256, "float", "sum", -1, "10.00", "10.00") + row(8192, 256, "float", "sum", -1, "10.00", "10.00"),
       std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string text = currentHead("x", 8, 8) + c.rows;
    text.erase(text.find("# Collective test starting"),
               text.find("# nThread") - text.find("# Collective test starting"));
    auto r = parse(text);
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    EXPECT_EQ(run.program, "");
    EXPECT_EQ(run.ranks, 8);
    EXPECT_EQ(run.collective, c.expected);
    EXPECT_EQ(run.collectiveFrom, c.expected ? "columns" : "");
  }
}

// A named program settles the collective, also when it is none of ours: sendrecv_perf prints rows that read like
// all_reduce_perf's, gather_perf rows like a rooted copy.
TEST(NcclTestsLog, NamedProgramWithoutCollectiveOfOursStaysUnknown) {
  for (const char* program : {"sendrecv_perf", "gather_perf", "hypercube_perf"}) {
    SCOPED_TRACE(program);
    auto r = parse(currentHead(program, 8, 8) + row(1024, 256, "float", "sum", -1, "10.00", "10.00"));
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->runs.at(0).program, program);
    EXPECT_EQ(r->runs.at(0).collective, std::nullopt);
    EXPECT_EQ(r->runs.at(0).collectiveFrom, "");
    EXPECT_EQ(r->runs.at(0).rows.size(), 1u);
  }
}

// Before 2022-09 the copy collectives printed no redop: all_gather_perf's table had no redop column (nor root),
// broadcast_perf's "size count type root", alltoall_perf's header named a redop its rows left blank (as did every
// copy collective's in the month after root arrived).
TEST(NcclTestsLog, OldCopyCollectivesWithoutRedop) {
  const std::string ranks = "#\n# Using devices\n" + rankLines(8, 8, "Tesla V100-SXM2-32GB") + "#\n";
  {
    auto r = parse(ranks +
                   "#       size         count      type     time   algbw   busbw  error     time   algbw   busbw  "
                   "error\n"
                   "        1024            32     float    30.12    0.03    0.03  0e+00    29.80    0.03    0.03  "
                   "0e+00\n"
                   "        2048            64     float    31.40    0.07    0.06  0e+00    31.00    0.07    0.06  "
                   "2e+00\n");
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    EXPECT_EQ(run.collective, Collective::AllGather);
    ASSERT_EQ(run.rows.size(), 2u);
    EXPECT_EQ(run.rows[0].redop, "");
    EXPECT_EQ(run.rows[0].root, -1);
    EXPECT_EQ(run.rows[0].count, 32u);
    EXPECT_EQ(run.rows[0].outOfPlaceUs, 30.12);
    EXPECT_EQ(run.rows[0].inPlaceUs, 29.80);
    EXPECT_EQ(run.rows[1].inPlaceWrong, 1);
  }
  {
    auto r = parse(ranks +
                   "#       size         count      type    root     time   algbw   busbw  error     time   algbw   "
                   "busbw  error\n"
                   "        1024           256     float       3    25.10    0.04    0.04  0e+00    24.90    0.04    "
                   "0.04  0e+00\n");
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    EXPECT_EQ(run.collective, Collective::Broadcast);
    ASSERT_EQ(run.rows.size(), 1u);
    EXPECT_EQ(run.rows[0].root, 3);
    EXPECT_EQ(run.rows[0].outOfPlaceUs, 25.10);
    EXPECT_EQ(run.rows[0].inPlaceUs, 24.90);
    EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
  }
  {
    auto r = parse(ranks +
                   "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   "
                   "busbw  error\n"
                   "        8192           256     float             40.00    0.20    0.18  0e+00    39.50    0.21    "
                   "0.18  0e+00\n");
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    ASSERT_EQ(run.rows.size(), 1u);
    EXPECT_EQ(run.rows[0].outOfPlaceUs, 40.00);
    EXPECT_EQ(run.rows[0].inPlaceUs, 39.50);
    EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
    // alltoall_perf's columns are all_gather_perf's: only a program name tells them apart.
    EXPECT_EQ(run.collective, Collective::AllGather);
  }
  {
    auto r = parse(ranks +
                   "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   "
                   "algbw   busbw  #wrong\n"
                   "        8192           256     float              -1    14.00    0.59    0.51       0    13.80    "
                   "0.59    0.52       0\n");
    ASSERT_TRUE(r.ok()) << r.error().str();
    const LogRun& run = r->runs.at(0);
    ASSERT_EQ(run.rows.size(), 1u);
    EXPECT_EQ(run.rows[0].root, -1);
    EXPECT_EQ(run.rows[0].outOfPlaceUs, 14.00);
    EXPECT_EQ(run.rows[0].inPlaceUs, 13.80);
    EXPECT_EQ(run.collective, Collective::AllGather);
  }
}

// Windows line endings (a log pasted from a browser).
TEST(NcclTestsLog, CrlfLineEndings) {
  std::string text;
  std::istringstream in(currentHead("all_reduce_perf", 2, 1) + row(1024, 256, "float", "sum", -1, "10.00", "9.90"));
  for (std::string line; std::getline(in, line);) text += line + "\r\n";
  auto r = parse(text);
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  EXPECT_EQ(run.gpuName, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(run.program, "all_reduce_perf");
  EXPECT_EQ(run.hosts, (std::vector<std::string>{"node-0", "node-1"}));
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
  EXPECT_EQ(run.rows[0].inPlaceWrong, 0);
  EXPECT_EQ(run.rows[0].inPlaceUs, 9.90);
}

// Rows with values no nccl-tests prints are left out with a note, never read as numbers.
TEST(NcclTestsLog, UnreadableRowsAreLeftOut) {
  auto r = parse(currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "inf", "nan") +
                 row(2048, 512, "float", "sum", -1, "-5.00", "0.00") +
                 row(4096, 1024, "float", "sum", -1, "12.00", "11.00") +
                 "99999999999999999999999  256  float  sum  -1  10.00  0.10  0.10  0  10.00  0.10  0.10  0\n" +
                 std::string(5000, '7') + " 256 float sum -1 10.00 0.10 0.10 0 10.00 0.10 0.10 0\n" +
                 "node-0:1:1 [0] NCCL INFO NCCL version 999999.1.1\n");
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].sizeBytes, 4096u);
  EXPECT_EQ(run.incompleteRows, 2);
  ASSERT_EQ(run.notes.size(), 2u);
  // The huge size is no number nccl-tests prints (so no row at all), the 5000-character line no line it writes.
  EXPECT_EQ(run.notes[0], "t.log:11: row has no readable time, left out");
  EXPECT_EQ(run.notes[1], "t.log:12: row has no readable time, left out");
  EXPECT_EQ(run.ncclVersion, 22902);
}

// ---------------------------------------------------------------------------------------------------------------
// -J JSON, as nccl-tests 2.19 writes it (one line; booleans as strings, root as the text of its column).

std::string jsonDevice(int rank, const std::string& host) {
  return R"({"rank":)" + std::to_string(rank) + R"(,"group":0,"pid":)" + std::to_string(7000 + rank) +
         R"(,"hostname":")" + host + R"(","device":0,"device_hex":"0000:18:00","device_info":"NVIDIA H100 80GB HBM3"})";
}

std::string jsonDoc(const std::string& program, int ngpus, const std::string& devices, const std::string& results) {
  std::string args = program.empty() ? "" : R"("args":[")" + program + R"(","-b","1K","-e","4K","-J","out.json"],)";
  return R"({"version":1,"start_time":"2025-11-03 10:00:00",)" + args + R"("env":["PATH=/usr/bin"],)" +
         R"("nccl_version":22902,"config":{"nthreads":1,"ngpus":)" + std::to_string(ngpus) +
         R"(,"minimum_bytes":1024,"maximum_bytes":4096,"step_factor":2,"warmup_iters":5,"iterations":20,)" +
         R"("aggregated_iterations":1,"validation":1,"graph":0,"blocking_collectives":"false",)" +
         R"("per_iter_timing":"false","per_iter_skip":0,"parallel_init":"false","devices":[)" + devices +
         R"(]},"results":[)" + results +
         R"(],"out_of_bounds":{"count":0,"okay":"true"},"average_bus_bandwidth":{"bandwidth":0.100000,)" +
         R"("okay":"unchecked"},"errors":[],"end_time":"2025-11-03 10:00:02"})" + "\n";
}

std::string jsonResult(std::uint64_t size, std::uint64_t count, const std::string& redop, const std::string& root,
                       const std::string& outOfPlace, const std::string& inPlace) {
  return R"({"size":)" + std::to_string(size) + R"(,"count":)" + std::to_string(count) +
         R"(,"type":"float","redop":")" + redop + R"(","root":")" + root + R"(","out_of_place":)" + outOfPlace +
         R"(,"in_place":)" + inPlace + R"(,"actual_iterations":20,"experiment_name":""})";
}

std::string jsonMode(const std::string& time, const std::string& nwrong, const std::string& key = "time") {
  return R"({")" + key + R"(":)" + time + R"(,"alg_bw":0.100000,"bus_bw":0.175000,"nwrong":)" + nwrong + "}";
}

TEST(NcclTestsLog, JsonOutput) {
  const std::string text = jsonDoc(
      "./build/all_reduce_perf", 8, jsonDevice(0, "dgx-01"),
      jsonResult(1024, 256, "sum", "    -1", jsonMode("17.140000", "0.000000"), jsonMode("16.920000", "0.000000")) +
          "," +
          jsonResult(2048, 512, "sum", "    -1", jsonMode("18.250000", "3.000000"), jsonMode("18.000000", "null")) +
          "," + jsonResult(4096, 1024, "sum", "    -1", "null", jsonMode("19.500000", "0.000000")) + "," +
          jsonResult(8192, 2048, "sum", "    -1", jsonMode(R"("nan")", "0.000000"), jsonMode(R"("nan")", "0.0")));
  auto r = calib::parseNcclTestsLog(text, "ar.json");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_TRUE(r->json);
  EXPECT_EQ(r->file, "ar.json");
  ASSERT_EQ(r->runs.size(), 1u);
  const LogRun& run = r->runs[0];
  EXPECT_EQ(run.program, "all_reduce_perf");
  EXPECT_EQ(run.collective, Collective::AllReduce);
  EXPECT_EQ(run.collectiveFrom, "program");
  // One device entry per process; this one drove -g 8.
  EXPECT_EQ(run.ranks, 8);
  EXPECT_EQ(run.nodes, 1);
  EXPECT_EQ(run.hosts, (std::vector<std::string>{"dgx-01"}));
  EXPECT_EQ(run.gpuName, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(run.ncclVersion, 22902);
  EXPECT_EQ(run.iters, 20);
  EXPECT_EQ(run.warmupIters, 5);
  EXPECT_EQ(run.graph, 0);
  EXPECT_FALSE(run.cpuTime);
  ASSERT_EQ(run.rows.size(), 3u);
  EXPECT_EQ(run.rows[0].line, 0);
  EXPECT_EQ(run.rows[0].sizeBytes, 1024u);
  EXPECT_EQ(run.rows[0].count, 256u);
  EXPECT_EQ(run.rows[0].type, "float");
  EXPECT_EQ(run.rows[0].redop, "sum");
  EXPECT_EQ(run.rows[0].root, -1);
  EXPECT_EQ(run.rows[0].outOfPlaceUs, 17.14);
  EXPECT_EQ(run.rows[0].inPlaceUs, 16.92);
  EXPECT_EQ(run.rows[0].outOfPlaceWrong, 0);
  EXPECT_EQ(run.rows[1].outOfPlaceWrong, 3);
  EXPECT_EQ(run.rows[1].inPlaceWrong, -1);  // null: not validated
  EXPECT_TRUE(run.rows[1].wrong());
  // A trace replay writes a null out_of_place: the in-place time is the time.
  EXPECT_EQ(run.rows[2].outOfPlaceUs, std::nullopt);
  EXPECT_EQ(run.rows[2].timeUs(), 19.5);
  EXPECT_EQ(run.incompleteRows, 1);
  ASSERT_EQ(run.notes.size(), 1u);
  EXPECT_EQ(run.notes[0], "ar.json: results[3] has no time, left out");
}

// Under MPI the root lists one device per process; -C 1 writes cpu_time; broadcast's root comes as "     0".
TEST(NcclTestsLog, JsonFromMpiWithCpuTimeAndRoot) {
  const std::string devices = jsonDevice(0, "node-a") + "," + jsonDevice(4, "node-b");
  const std::string text =
      jsonDoc("/opt/nccl-tests/build/broadcast_perf", 4, devices,
              jsonResult(1024, 256, "none", "     0", jsonMode("11.000000", "0.000000", "cpu_time"),
                         jsonMode("10.500000", "0.000000", "cpu_time")));
  auto r = calib::parseNcclTestsLog(text, "bc.json");
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  EXPECT_EQ(run.program, "broadcast_perf");
  EXPECT_EQ(run.collective, Collective::Broadcast);
  EXPECT_EQ(run.ranks, 8);
  EXPECT_EQ(run.nodes, 2);
  EXPECT_EQ(run.hosts, (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_TRUE(run.cpuTime);
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].root, 0);
  EXPECT_EQ(run.rows[0].outOfPlaceUs, 11.0);
  EXPECT_EQ(run.rows[0].inPlaceUs, 10.5);
}

TEST(NcclTestsLog, JsonWithoutCommandLineInfersTheCollective) {
  const std::string text =
      jsonDoc("", 8, jsonDevice(0, "dgx-01"),
              jsonResult(8192, 256, "none", "    -1", jsonMode("14.000000", "0.000000"), jsonMode("13.8", "0")));
  auto r = calib::parseNcclTestsLog(text, "ag.json");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->runs.at(0).program, "");
  EXPECT_EQ(r->runs.at(0).collective, Collective::AllGather);
  EXPECT_EQ(r->runs.at(0).collectiveFrom, "columns");
}

// Numbers past an int's range are clamped, never converted as they are (undefined behaviour).
TEST(NcclTestsLog, JsonHugeNumbersAreClamped) {
  auto r = calib::parseNcclTestsLog(
      R"({"config":{"graph":1e300,"iterations":1e300,"ngpus":1e300,"devices":[{"rank":1e300,"hostname":"h"}]},)"
      R"("nccl_version":1e300,"results":[{"size":8,"count":2,"type":"float","redop":"sum","root":1e300,)"
      R"("out_of_place":{"time":5.0,"nwrong":1e300}}]})",
      "big.json");
  ASSERT_TRUE(r.ok()) << r.error().str();
  const LogRun& run = r->runs.at(0);
  EXPECT_EQ(run.graph, 2147483647);
  EXPECT_EQ(run.iters, 2147483647);
  EXPECT_EQ(run.ncclVersion, 0);
  // The one device's rank is out of range, so it is left out with its host.
  EXPECT_EQ(run.ranks, 0);
  EXPECT_EQ(run.nodes, 0);
  ASSERT_EQ(run.rows.size(), 1u);
  EXPECT_EQ(run.rows[0].root, 1 << 24);
  EXPECT_EQ(run.rows[0].outOfPlaceWrong, 1000000000000000000);
  EXPECT_EQ(run.rows[0].outOfPlaceUs, 5.0);
}

TEST(NcclTestsLog, JsonErrors) {
  struct Case {
    std::string text;
    int line;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"{\"results\": [", 1, "not JSON"},
      {"{\"config\": {}}", 0, "without a \"results\" array"},
      {"{\"results\": {}}", 0, "without a \"results\" array"},
      {"{\"results\": []}", 0, "without a usable result"},
      {"{\"results\": [{\"size\": 8}, {\"in_place\": {\"time\": 1.0}}]}", 0, "without a usable result"},
      {"  {" + std::string(40, '[') + std::string(40, ']') + "}", 1, "nested deeper than 16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto r = calib::parseNcclTestsLog(c.text, "x.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, "x.json");
    EXPECT_EQ(r.error().line, c.line);
    EXPECT_NE(r.error().message.find(c.says), std::string::npos) << r.error().message;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Inputs that are not logs: a diagnostic naming the file, never a crash.

TEST(NcclTestsLog, NotALogIsADiagnostic) {
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage.push_back(static_cast<char>((i * 131 + 7) % 256));
  const std::vector<std::string> inputs = {
      "",
      "\n\n   \n",
      garbage,
      std::string("\0\0\0\x7f"
                  "ELF\x02\x01",
                  10),
      "# OptiFlow\n\nA collective-communication compiler for NCCL.\n\n| size | time |\n|---|---|\n| 8 | 1.0 |\n",
      "size,count,type,time\n1024,256,float,10.0\n",
      // A header and no row (the job died before the first size).
      currentHead("all_reduce_perf", 2, 2) + kFooter,
  };
  for (const std::string& in : inputs) {
    SCOPED_TRACE(in.substr(0, 40));
    auto r = parse(in);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, "t.log");
    EXPECT_EQ(r.error().line, 0);
    EXPECT_NE(r.error().message.find("not an nccl-tests log"), std::string::npos) << r.error().message;
  }
}

TEST(NcclTestsLog, ReadingFiles) {
  testsupport::TempDir dir("nccl-tests-log");
  {
    auto r = calib::readNcclTestsLog(dir.path());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, dir.path().string());
    EXPECT_NE(r.error().message.find("is a directory"), std::string::npos) << r.error().message;
  }
  {
    const fs::path missing = dir.path() / "missing.log";
    auto r = calib::readNcclTestsLog(missing);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, missing.string());
    EXPECT_NE(r.error().message.find("cannot read"), std::string::npos) << r.error().message;
  }
  {
    const fs::path empty = dir.write("empty.log", "");
    auto r = calib::readNcclTestsLog(empty);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, empty.string());
  }
  {
    const fs::path log = dir.write(
        "ar.log", currentHead("all_reduce_perf", 2, 2) + row(1024, 256, "float", "sum", -1, "10.00", "10.00"));
    auto r = calib::readNcclTestsLog(log);
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->file, log.string());
    EXPECT_EQ(r->runs.at(0).rows.at(0).line, 11);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers.

TEST(NcclTestsLog, CollectiveFromProgram) {
  EXPECT_EQ(calib::collectiveFromProgram("all_reduce_perf"), Collective::AllReduce);
  EXPECT_EQ(calib::collectiveFromProgram("./build/all_gather_perf"), Collective::AllGather);
  EXPECT_EQ(calib::collectiveFromProgram("/usr/bin/reduce_scatter_perf"), Collective::ReduceScatter);
  EXPECT_EQ(calib::collectiveFromProgram("broadcast_perf"), Collective::Broadcast);
  EXPECT_EQ(calib::collectiveFromProgram("reduce_perf"), Collective::Reduce);
  EXPECT_EQ(calib::collectiveFromProgram("alltoall_perf"), Collective::AllToAll);
  EXPECT_EQ(calib::collectiveFromProgram("all_reduce_perf_mpi"), Collective::AllReduce);
  EXPECT_EQ(calib::collectiveFromProgram("sendrecv_perf"), std::nullopt);
  EXPECT_EQ(calib::collectiveFromProgram("gather_perf"), std::nullopt);
  EXPECT_EQ(calib::collectiveFromProgram("alltoallv_perf"), std::nullopt);
  EXPECT_EQ(calib::collectiveFromProgram("all_reduce_perfx"), std::nullopt);
  EXPECT_EQ(calib::collectiveFromProgram(""), std::nullopt);
}

TEST(NcclTestsLog, TypeBytes) {
  EXPECT_EQ(calib::typeBytes("int8"), 1);
  EXPECT_EQ(calib::typeBytes("uint8"), 1);
  EXPECT_EQ(calib::typeBytes("fp8_e4m3"), 1);
  EXPECT_EQ(calib::typeBytes("half"), 2);
  EXPECT_EQ(calib::typeBytes("bfloat16"), 2);
  EXPECT_EQ(calib::typeBytes("float"), 4);
  EXPECT_EQ(calib::typeBytes("int32"), 4);
  EXPECT_EQ(calib::typeBytes("double"), 8);
  EXPECT_EQ(calib::typeBytes("uint64"), 8);
  EXPECT_EQ(calib::typeBytes("Float"), 0);
  EXPECT_EQ(calib::typeBytes("complex"), 0);
  EXPECT_EQ(calib::typeBytes(""), 0);
}

TEST(NcclTestsLog, RowTimePrefersOutOfPlace) {
  LogRow row;
  EXPECT_EQ(row.timeUs(), 0.0);
  row.inPlaceUs = 5.5;
  EXPECT_EQ(row.timeUs(), 5.5);
  row.outOfPlaceUs = 6.25;
  EXPECT_EQ(row.timeUs(), 6.25);
  EXPECT_FALSE(row.wrong());
  row.inPlaceWrong = 1;
  EXPECT_TRUE(row.wrong());
}

}  // namespace
