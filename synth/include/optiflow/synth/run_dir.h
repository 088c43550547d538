// The run directory: the one owner of its formats. `optiflow synthesize --out DIR` and optiflowd write it; resume,
// `optiflow report`, the schedule cache's loader (cache_plan.h) and optiflowd's merge read it through this header
// only. Typed records, one reader and one writer per file, one merge.
//
//   DIR/plan.json             the plan (PlanFile, below)
//   DIR/history.jsonl         one JSON object per line, a CandidateRecord each, appended and flushed as each candidate
//                             is evaluated: {id, round, origin, name, text, stage, errors, sizes[{size_bytes, ok,
//                             error, time_us, bound_us, nccl_us, config, bottleneck}]}; with the hardware
//                             evaluator also "measured": true and "simulated_us" (time_us is then measured), or
//                             "measure_error" (why the simulated time_us was not replaced); written once measured
//   DIR/programs/ID.ofl       the program of every winning candidate
//   DIR/schedules/COLL-SIZE.json, .xml   each size's winning schedule, native JSON and MSCCL XML
//   DIR/hardware/round-N/                the hardware evaluator's batch, results.json and launcher.log per round
//   DIR/schedules/COLL-SIZE.mscclpp.json  its MSCCL++ execution plan (where the collective has one)
//
// plan.json:
//   {"format": "optiflow-plan", "version": 1, "optiflow_version": "0.1.0",
//    "topology": "dgx-a100x4", "ranks": 32, "nodes": 4, "gpus_per_node": 8,
//    "proposer": "builtin", "evaluator": "simulator", "seed": 1, "rounds": 4, "candidates": 40, "evaluated": 31,
//    "elapsed_s": 12.5, "stop_reason": "converged",
//    "runs": ["/var/lib/optiflow/ns/runs/allgather-..."],     // a merged plan only: the runs it was made of
//    "collectives": [{
//      "collective": "allgather", "ranks": 32, "nodes": 4,
//      "entries": [{                         // one per size of the run, ascending
//        "size_bytes": 1024, "min_bytes": 0, "max_bytes": 4095,   // the size range it serves (last: 2^64-1)
//        "bound_us": 1.2, "effective_bound_us": 1.2,
//        "nccl": {"algorithm": "Ring", "protocol": "LL", "channels": 1, "time_us": 43.6},
//        "native": {"algorithm": "Ring", "protocol": "LL", "channels": 2, "time_us": 40.1},  // + "chunk_bytes"
//        "best": {"candidate": "r0c3", "program": "direct", "origin": "gallery:direct", "config": "LL/1ch/1sl",
//                 "protocol": "LL", "channels": 1, "time_us": 12.36, "bottleneck": "",
//                 "program_file": "programs/r0c3.ofl",
//                 "schedule_json": "schedules/allgather-1KiB.json", "schedule_xml": "schedules/allgather-1KiB.xml"}
//                 // + "measured": true, "simulated_us" where the hardware evaluator measured time_us
//                 // null when no candidate worked at this size
//        "trials": {"calls": 10, "candidates": [{"algorithm": null},     // optional: NCCL-native configurations the
//                   {"algorithm": "Ring", "protocol": "LL", "channels": 2}]}  // tuner tries first (NCCL's own: null)
//      }]}]}
// nccl and native carry "measured": true and "simulated_us" where optiflowd measured time_us in running jobs (the
// profiler plugin; docs/profiler.md); native is then null where NCCL's own choice measured fastest.
// Times are microseconds; speedups and ratios are derived (nccl.time_us / best.time_us, best.time_us / bound_us).
//
// Required when read: format, version, topology, ranks, nodes, collectives; per collective: collective, ranks,
// nodes, entries; per entry: size_bytes, min_bytes, max_bytes, bound_us; nccl, native and best may be null or
// absent, and when present carry their fields (chunk_bytes, and best's candidate, origin, config, protocol,
// channels, bottleneck and program_file are optional). The run's settings (proposer ... stop_reason) are optional:
// a merged plan has no single run's. Every error names the file, the line and column, the field's path and what was
// expected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/proposer.h"

namespace optiflow::synth {

inline constexpr int kPlanVersion = 1;

// Who made a run, as plan.json records it.
struct RunInfo {
  std::string proposer;
  std::string evaluator;
  std::uint64_t seed = 0;
};

struct PlanBest {
  std::string candidate;
  std::string program;
  std::string origin;
  std::string config;  // "LL/1ch/1sl"
  std::string protocol;
  int channels = 0;
  double timeUs = 0;
  std::string bottleneck;
  std::string programFile;   // relative to the run directory
  std::string scheduleJson;  // relative to the run directory
  std::string scheduleXml;   // relative to the run directory
  bool measured = false;     // timeUs was measured on hardware (optiflow-bench); simulatedUs is the simulator's
  double simulatedUs = 0;
};

// A configuration the tuner tries on a communicator's first calls of the entry's range (docs/consistency.md).
struct PlanTrial {
  std::string algorithm;  // "": NCCL's own choice (null in plan.json)
  std::string protocol;   // "": any
  int channels = 0;       // 0: NCCL decides
  std::uint64_t chunkBytes = 0;
  bool operator==(const PlanTrial&) const = default;
};

struct PlanEntry {
  std::uint64_t sizeBytes = 0;
  std::uint64_t minBytes = 0;  // the range of call sizes this entry serves
  std::uint64_t maxBytes = 0;
  double boundUs = 0;
  double effectiveBoundUs = 0;  // 0: not recorded
  std::optional<NativeChoice> nccl;
  std::optional<NativeChoice> native;
  std::optional<PlanBest> best;
  std::vector<PlanTrial> trials;  // empty: no trials
  int trialCalls = 0;             // calls each candidate gets
};

struct PlanCollective {
  core::Collective collective = core::Collective::AllGather;
  int ranks = 0;
  int nodes = 0;
  std::vector<PlanEntry> entries;  // ascending size_bytes after reading
};

struct PlanFile {
  std::string optiflowVersion;
  std::string topology;
  int ranks = 0;
  int nodes = 0;
  int gpusPerNode = 0;  // 0: not recorded
  std::string proposer;
  std::string evaluator;
  std::optional<std::uint64_t> seed;
  std::optional<int> rounds;
  std::optional<int> candidates;
  std::optional<int> evaluated;
  std::optional<double> elapsedS;
  std::optional<std::string> stopReason;
  std::vector<std::string> runs;  // a merged plan: the run directories it was made of
  std::vector<PlanCollective> collectives;
};

// The plan of a finished (or stopped) run: entry s serves [its size, the next size).
PlanFile makePlan(const core::Topology& topology, const SynthConfig& config, const SynthResult& result,
                  const RunInfo& info);

// plan.json's text (the writer) and its reader. `file` names the text in diagnostics.
std::string formatPlan(const PlanFile& plan);
core::Result<PlanFile> parsePlan(std::string_view text, const std::string& file);
// A missing or unreadable file is an error naming it and what was expected there.
core::Result<PlanFile> readPlan(const std::filesystem::path& file);
// Through a temporary file and a rename: a reader never sees a half-written plan.
core::Result<bool> writePlan(const std::filesystem::path& file, const PlanFile& plan);

// Several runs' plans as one: the first plan's header, every plan's collectives in order, `runs` listing each
// plan's run directory. File names inside the entries are kept as they are (the caller copies the files).
PlanFile mergePlans(const std::vector<PlanFile>& plans, const std::vector<std::string>& runDirs);

// Writes plan.json, programs/ and schedules/ of a run (history.jsonl is HistoryWriter's). Creates DIR if needed;
// plan.json comes last.
core::Result<bool> writeRunDirectory(const std::filesystem::path& dir, const core::Topology& topology,
                                     const SynthConfig& config, const SynthResult& result, const RunInfo& info);

// One history.jsonl line (no newline) and its reader.
std::string formatRecord(const CandidateRecord& record);
core::Result<CandidateRecord> parseRecord(std::string_view line, const std::string& file = "", int lineNo = 1);

struct History {
  std::vector<CandidateRecord> records;
  // The last line had no newline and did not parse: a write the run did not finish (it appends and flushes line by
  // line). It is left out; every other bad line is an error.
  bool tornTail = false;
};

// history.jsonl of a run; a missing file is an empty history. Blank lines are skipped.
core::Result<History> readHistory(const std::filesystem::path& file);

// Appends one line per record and flushes it, so a run that is killed keeps everything evaluated so far. Opening a
// file whose last line is torn cuts that line off first, so the next record starts on a line of its own.
class HistoryWriter {
 public:
  static core::Result<HistoryWriter> open(const std::filesystem::path& file);
  bool append(const CandidateRecord& record);

 private:
  explicit HistoryWriter(std::filesystem::path file);
  std::filesystem::path file_;
};

// "allgather-1MiB": the stem of a size's schedule files.
std::string scheduleStem(core::Collective collective, std::uint64_t sizeBytes);

}  // namespace optiflow::synth
