// The loop from running jobs back into the plan (docs/profiler.md): optiflowd ranks the decisions of the next plan by
// what the profiler plugin measured, where there is a measurement, and by the simulator's prediction elsewhere.
//
// Per plan entry (collective, ranks, nodes, size range), at the measured size in the range closest to the entry's:
// - NCCL's own choice is the measured configuration whose algorithm and protocol NCCL's cost table named for that
//   communicator and size (the tuner records it, schedcache::NcclChoice) and whose channel count the plan did not set.
// - Once NCCL's own choice is measured, the published decision is the fastest measured configuration that is not
//   slower than it, or no decision (NCCL decides) when none is faster: a configuration measured slower than NCCL's
//   own choice is never published. The entry's predicted decision stays only while it is unmeasured and nothing
//   measured beats NCCL's own.
// - Before that, the predicted decision stays (marked measured once it is) and the entry gets trials: NCCL's own
//   choice and the decision take turns on a communicator's first calls, so both get measured.
// Each entry then says whether its time is measured (nccl/native "measured": true, "simulated_us") or predicted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/daemon/measured.h"
#include "optiflow/schedcache/measure.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::daemon {

struct RankOptions {
  int trialCalls = 10;  // Config::trialCalls: calls per trial candidate; 0: no trials
  // A configuration counts as measured from this many timed calls: its median then stands against the first call,
  // which pays for NCCL's lazy connection setup.
  std::uint64_t minCalls = 5;
};

// One plan entry after ranking: a row of the measured-vs-predicted table.
struct RankedEntry {
  core::Collective coll = core::Collective::AllReduce;
  int ranks = 0;
  int nodes = 0;
  std::uint64_t sizeBytes = 0;       // the entry's size
  std::uint64_t measuredBytes = 0;   // the measured size that ranked it; 0: nothing measured in its range
  std::string before;                // the synthesized decision ("Ring/LL/2ch"; "NCCL's own" for none)
  double predictedUs = 0;            // the simulator's time of it
  std::optional<double> beforeUs;    // its measured time
  std::string ncclConfig;            // NCCL's own choice as measured ("Ring/LL128/16ch")
  std::optional<double> ncclUs;      // and its measured time
  std::string after;                 // the decision published
  std::optional<double> afterUs;     // its measured time; nullopt: it stands on the prediction
  std::vector<std::string> refused;  // configurations measured slower than NCCL's own ("Tree/LL/4ch 52.1 us")
  bool trials = false;               // the published entry has trials
};

// Ranks `plan` (a merged plan of synthesized runs, times predicted) in place, as the file comment says, and returns
// one row per entry. Rows of unknown algorithm or protocol, or of another shape, are not used. Never throws.
std::vector<RankedEntry> rankByMeasurements(synth::PlanFile& plan, const std::vector<MeasuredRow>& rows,
                                            const std::vector<schedcache::NcclChoice>& choices,
                                            const RankOptions& options);

// The measured-vs-predicted table of the rows that have a measurement (empty when none has).
std::string formatRanking(const std::vector<RankedEntry>& entries);

}  // namespace optiflow::daemon
