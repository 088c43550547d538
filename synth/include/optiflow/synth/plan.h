// The run directory `optiflow synthesize --out DIR` writes, and what reads it back (resume, report, the cache):
//
//   DIR/plan.json             the plan (below)
//   DIR/history.jsonl         one JSON object per candidate, appended as each is evaluated (CandidateRecord:
//                             id, round, origin, name, text, stage, errors, sizes[{size_bytes, ok, error, time_us,
//                             bound_us, nccl_us, config, bottleneck}])
//   DIR/programs/ID.ofl       the program of every winning candidate
//   DIR/schedules/COLL-SIZE.json, .xml   each size's winning schedule, native JSON and MSCCL XML
//
// plan.json:
//   {"format": "optiflow-plan", "version": 1, "optiflow_version": "0.1.0",
//    "topology": "dgx-a100x4", "ranks": 32, "nodes": 4, "gpus_per_node": 8,
//    "proposer": "builtin", "evaluator": "simulator", "seed": 1, "rounds": 4, "candidates": 40,
//    "elapsed_s": 12.5, "stop_reason": "converged",
//    "collectives": [{
//      "collective": "allgather", "ranks": 32, "nodes": 4,
//      "entries": [{                         // one per size of the run, ascending
//        "size_bytes": 1024, "min_bytes": 0, "max_bytes": 4095,   // the size range it serves (last: 2^64-1)
//        "bound_us": 1.2, "effective_bound_us": 1.2,
//        "nccl": {"algorithm": "Ring", "protocol": "LL", "channels": 1, "time_us": 43.6},
//        "native": {"algorithm": "Ring", "protocol": "LL", "channels": 2, "time_us": 40.1},
//        "best": {"candidate": "r0c3", "program": "direct", "config": "LL/1ch/1sl", "protocol": "LL",
//                 "channels": 1, "time_us": 12.36, "program_file": "programs/r0c3.ofl",
//                 "schedule_json": "schedules/allgather-1KiB.json", "schedule_xml": "schedules/allgather-1KiB.xml"}
//                 // null when no candidate worked at this size
//      }]}]}
// Times are microseconds; speedups and ratios are derived (nccl.time_us / best.time_us, best.time_us / bound_us).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/proposer.h"

namespace optiflow::synth {

struct RunInfo {
  std::string proposer;
  std::string evaluator;
  std::uint64_t seed = 0;
};

nlohmann::json recordToJson(const CandidateRecord& r);
// Errors name the field that is missing or of the wrong type.
core::Result<CandidateRecord> recordFromJson(const nlohmann::json& j);

nlohmann::json planToJson(const core::Topology& topology, const SynthConfig& config, const SynthResult& result,
                          const RunInfo& info);

// Writes plan.json, programs/ and schedules/ (history.jsonl is HistoryWriter's). Creates DIR if needed.
core::Result<bool> writeRunDirectory(const std::filesystem::path& dir, const core::Topology& topology,
                                     const SynthConfig& config, const SynthResult& result, const RunInfo& info);

// history.jsonl of an earlier run, for resuming; a bad line is an error naming file:line and what was expected.
// A missing file is an empty history.
core::Result<std::vector<CandidateRecord>> readHistory(const std::filesystem::path& file);

// Appends one line per record and flushes it, so a run that is killed keeps everything evaluated so far.
class HistoryWriter {
 public:
  static core::Result<HistoryWriter> open(const std::filesystem::path& file);  // appends
  bool append(const CandidateRecord& record);

 private:
  explicit HistoryWriter(std::filesystem::path file);
  std::filesystem::path file_;
};

}  // namespace optiflow::synth
