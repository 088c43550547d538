// The reader of nccl-tests logs (all_reduce_perf and its siblings): every generation of the text layout and the -J
// JSON file, also as users paste them (mpirun or srun prefixes on every line, NCCL INFO lines in between, a log cut
// off in the middle). One reader for the calibration command, its tests and its fuzz target.
//
// What the format is (facts from NVIDIA/nccl-tests src/common.cu, written in our words; docs/calibration.md has the
// full list): header lines starting with '#' (the version line since late 2025, "Collective test starting" since
// mid 2025, the nThread line with "graph: N", one "#  Rank" line per rank printed by the root, the two table
// header lines), then one row per size: size, count, type, redop, root (since 2022-08), then per buffer mode
// (out-of-place, in-place) time, algbw, busbw and #wrong (an "error" float before 2022-08), with extra columns
// under -I and -S. The table header names the columns, so the reader maps rows through it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/vocabulary.h"

namespace optiflow::calib {

// One size of a run. Times are microseconds per iteration as printed (host wall clock, or CPU time under -C 1;
// under -G N nccl-tests has already divided by the replay count).
struct LogRow {
  int line = 0;  // 1-based line in the file (0 for JSON)
  std::uint64_t sizeBytes = 0;
  std::uint64_t count = 0;
  std::string type;   // float, half, bfloat16, int8, ...
  std::string redop;  // sum, prod, max, min, avg, none
  int root = -1;      // -1: no root (or the log has no root column)
  std::optional<double> outOfPlaceUs;
  std::optional<double> inPlaceUs;
  // #wrong per mode: 0 = validated fine, > 0 wrong elements, -1 = not validated (N/A) or not printed.
  std::int64_t outOfPlaceWrong = -1;
  std::int64_t inPlaceWrong = -1;

  // The time a calibration uses: out-of-place (nccl-tests' first group), else in-place.
  double timeUs() const { return outOfPlaceUs ? *outOfPlaceUs : inPlaceUs.value_or(0.0); }
  bool wrong() const { return outOfPlaceWrong > 0 || inPlaceWrong > 0; }
};

// One test run: a header and its table. A file may hold several (a script that runs several collectives).
struct LogRun {
  int line = 0;         // where the run starts
  std::string program;  // all_reduce_perf, ...; empty when the log does not name it (before mid 2025)
  // The collective: from the program name, else from the columns (redop, root, count x type size against size);
  // nullopt when neither tells (sendrecv_perf, hypercube_perf, gather/scatter) or the rows are ambiguous.
  std::optional<core::Collective> collective;
  std::string collectiveFrom;  // "program", "columns" or "" (unknown)
  int ranks = 0;               // distinct "#  Rank" lines (JSON: devices)
  int nodes = 0;               // distinct host names of those lines
  std::vector<std::string> hosts;
  std::string gpuName;  // the device name of rank 0's line ("NVIDIA H100 80GB HBM3")
  int graph = 0;        // -G replay count; > 0: the times are CUDA-graph launches
  int iters = 0;
  int warmupIters = 0;
  bool cpuTime = false;            // -C 1: the time column is CPU time
  int ncclVersion = 0;             // major*10000 + minor*100 + patch, 0 when the log does not say
  std::string testsVersion;        // "2.17.1" from the version line, else empty
  std::vector<LogRow> rows;        // complete rows, in file order
  int incompleteRows = 0;          // rows cut off (a killed job) or unreadable, left out
  std::vector<std::string> notes;  // what was left out and why, "file:line: ..." each
};

struct NcclTestsLog {
  std::string file;
  bool json = false;  // read from a -J file
  std::vector<LogRun> runs;
};

// Never throws and never crashes on any input. An error names the file and the line when there is nothing to use
// (no row in any run, not an nccl-tests log); problems with single rows become notes of their run.
core::Result<NcclTestsLog> parseNcclTestsLog(std::string_view text, std::string_view file);
core::Result<NcclTestsLog> readNcclTestsLog(const std::filesystem::path& file);

// all_reduce_perf -> AllReduce, ...; nullopt for programs without a collective of ours (sendrecv_perf, ...).
std::optional<core::Collective> collectiveFromProgram(std::string_view program);
// Bytes per element of an nccl-tests type name (int8 1, half 2, float 4, double 8, ...); 0 when unknown.
int typeBytes(std::string_view type);

}  // namespace optiflow::calib
