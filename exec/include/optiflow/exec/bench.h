// optiflow-bench's driver, in plain C++: the command line, the schedules (files, or a batch directory written by
// `optiflow synthesize --evaluator hardware`), the loop over schedules x sizes x buffer modes, and the output in
// nccl-tests' text layout (so `optiflow calibrate` reads it like any nccl-tests log) or as JSON. The backend (CPU
// threads here, CUDA + NCCL in exec/bench/cuda_backend.cc) only runs lowered levels and times them.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"
#include "optiflow/exec/levels.h"

namespace optiflow::exec {

struct BenchOptions {
  std::vector<std::string> schedules;  // schedule files (native JSON or MSCCL XML) or batch directories
  std::vector<std::uint64_t> sizes;    // from --sizes (default 1KiB:1GiB)
  int iters = 20;
  int warmup = 5;
  int graph = 0;  // -G: iterations captured in one CUDA graph and replayed (CUDA backend); 0 = plain launches
  bool check = false;
  bool nccl = false;  // also time NCCL's own collective at the same sizes (CUDA backend)
  bool json = false;
  std::string output;   // write here instead of stdout
  std::string backend;  // "cuda" or "cpu"
  std::string rendezvous;
  std::string rendezvousDir;
  std::string rendezvousKey;  // keeps runs apart in --rendezvous-dir (default: the launcher's job id)
  double rendezvousTimeoutS = 120;
  double timeoutS = 300;  // a run of one schedule at one size that takes longer has hung
};

// Parses optiflow-bench's arguments (argv[0] is the program). `help` is set (and nothing else checked) for -h.
// Errors name the option and what was expected.
struct ParsedArgs {
  BenchOptions options;
  bool help = false;
  std::string helpText;
};
core::Result<ParsedArgs> parseBenchArgs(int argc, const char* const* argv, bool cudaBuilt);

// One schedule to time, at the run's sizes or at its own.
struct BenchItem {
  std::string id;    // the batch's id, else the file name
  std::string file;  // where it came from
  core::Schedule schedule;
  std::vector<std::uint64_t> sizes;  // empty: the run's sizes
};

// A batch directory: batch.json {"format": "optiflow-bench-batch", "version": 1, "items": [{"id": ..., "schedule":
// "<file in the directory>", "sizes": [bytes, ...]}]}.
inline constexpr std::string_view kBatchManifest = "batch.json";
inline constexpr std::string_view kBatchFormat = "optiflow-bench-batch";
core::Result<std::vector<BenchItem>> loadBenchItems(const std::vector<std::string>& paths);
std::string batchManifestJson(const std::vector<BenchItem>& items, const std::vector<std::string>& files);

// One buffer mode at one size.
struct ModeResult {
  bool ran = false;  // false: the schedule does not support the mode (printed N/A)
  double timeUs = 0;
  std::int64_t wrong = -1;  // -1: not checked
};

struct SizeRow {
  std::uint64_t sizeBytes = 0;  // after nccl-tests' rounding
  std::uint64_t count = 0;      // float elements, as nccl-tests counts them for the collective
  ModeResult outOfPlace;
  ModeResult inPlace;
};

struct ItemResult {
  std::string id;
  std::string name;
  core::Collective collective = core::Collective::AllGather;
  int nRanks = 0;
  bool nccl = false;  // NCCL's own collective, not a schedule
  bool ok = true;
  std::string error;
  std::string lowering;  // summary() of the out-of-place lowering
  std::vector<SizeRow> rows;
};

// What a backend does for the driver. One object per process; rank 0 prints.
class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  // The ranks the backend runs for a schedule of nRanks: an error when it cannot (a CUDA run of another size).
  virtual core::Result<bool> accepts(int nRanks) const = 0;
  // "#  Rank  0 Group  0 Pid   1234 on      host device  0 [0000:01:00] NVIDIA H100" for every rank of the run.
  virtual std::vector<std::string> rankLines(int nRanks) = 0;
  // Times the lowered schedule with `elements` floats per chunk (and checks it when options.check).
  virtual core::Result<ModeResult> run(const core::Schedule& schedule, const Lowered& lowered, std::uint64_t elements,
                                       const BenchOptions& options) = 0;
  // NCCL's own collective over `bytes` (nccl-tests' size); an error where the backend has no NCCL.
  virtual core::Result<ModeResult> runNccl(core::Collective c, std::uint64_t bytes, bool inPlace,
                                           const BenchOptions& options) = 0;
};

// The CPU backend of optiflow-bench (cpu_backend.h): every rank a thread of this process.
std::unique_ptr<BenchBackend> makeCpuBenchBackend();

// The whole run: every item at every size in every mode it supports, then NCCL's collectives when asked. Errors
// of one item are in its result (the run goes on); the return value is false when any item failed.
bool runBench(const BenchOptions& options, const std::vector<BenchItem>& items, BenchBackend& backend,
              std::vector<ItemResult>& results);

// nccl-tests' text layout: per item a header (the nThread line, "# Using devices" and one "#  Rank" line per rank),
// the two table header lines, one row per size, and the footer. The program name is
// "<nccl-tests program>_optiflow-<id>" (all_gather_perf_optiflow-ring8), so readers that know nccl-tests' program
// names recognise the collective.
void writeText(std::ostream& out, const BenchOptions& options, const std::vector<ItemResult>& results,
               BenchBackend& backend);
// {"format": "optiflow-bench-results", "version": 1, "backend": ..., "results": [{"id", "name", "collective",
// "ranks", "nccl", "ok", "error", "rows": [{"size", "count", "out_of_place": {"time_us", "alg_bw", "bus_bw",
// "wrong"} | null, "in_place": ...}]}]}
std::string resultsJson(const BenchOptions& options, const std::vector<ItemResult>& results, std::string_view backend);
inline constexpr std::string_view kResultsFormat = "optiflow-bench-results";
// Reads resultsJson's output (what `synthesize --evaluator hardware` gets back). Never throws.
core::Result<std::vector<ItemResult>> parseResultsJson(std::string_view text, std::string_view file);

// nccl-tests' program name for a collective ("all_gather_perf"); "custom_perf" for the others.
std::string_view ncclTestsProgram(core::Collective c);

}  // namespace optiflow::exec
