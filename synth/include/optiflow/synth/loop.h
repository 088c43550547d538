// The synthesis loop: rounds of propose -> parse -> expand -> compile per size -> verify -> evaluate -> keep the
// best per size, until the round budget, the time budget or convergence. Deterministic for a deterministic
// proposer and evaluator (no wall-clock input except the time budget).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/calibration.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/evaluator.h"
#include "optiflow/synth/proposer.h"

namespace optiflow::synth {

struct SynthConfig {
  core::Collective collective = core::Collective::AllGather;
  std::vector<std::uint64_t> sizes;
  int rounds = 8;  // at most this many rounds
  double timeBudgetS =
      0;  // wall clock for the run, shared out among a round's candidates (docs/synthesis.md); 0 = none
  int candidatesPerRound = 8;       // asked of the proposer each round
  int patience = 3;                 // converged after this many rounds without a gain of `minGain` at any size
  double minGain = 0.005;           // relative
  int root = 0;                     // Broadcast/Reduce
  sim::SimParams params;            // the simulator's constants (launch model) for baselines and candidates
  sim::ModelCalibration ncclModel;  // NCCL's own model's calibration (identity: uncalibrated); its launch is params'
  std::vector<CandidateRecord> resume;  // an earlier run's history: its programs are not proposed again
  int threads = 0;  // threads evaluating sizes in parallel; 0 = hardware_concurrency (optiflowd caps it at its budget)
};

// NCCL's native choice at one size: what it picks by itself, or the best configuration the simulator found.
struct NativeChoice {
  std::string algorithm;  // "Ring", "Tree", ...
  std::string protocol;   // "LL", "LL128", "Simple"
  int channels = 0;
  double timeUs = 0;             // simulated; 0 when the algorithm has no schedule here
  std::uint64_t chunkBytes = 0;  // NCCL 2.30's chunk size; 0: NCCL decides
  // optiflowd measured timeUs in running jobs (the profiler plugin); simulatedUs is then the simulator's time. A
  // measured time outranks a simulated one.
  bool measured = false;
  double simulatedUs = 0;
};

struct SizeBest {
  std::uint64_t sizeBytes = 0;
  double boundUs = 0;
  double effectiveBoundUs = 0;  // the bound at the simulator's link efficiencies (sim::effectiveTopology)
  NativeChoice nccl;            // NCCL's own choice (its cost model), timed by the simulator
  NativeChoice bestNative;      // the fastest NCCL-native configuration the simulator found (what the tuner sets)
  // NCCL's own cost model's time of its choice (calibrated by SynthConfig::ncclModel, the simulator's launch added):
  // the second estimate of NCCL, shown beside the simulated one; 0 when the model has no choice.
  double ncclModelUs = 0;
  int best = -1;  // index into SynthResult::history; -1 when no candidate worked at this size
  double bestUs = 0;
  std::string config;  // the winner's compile options, e.g. "LL128/2ch/2sl"
  // The winner's verified schedule; sizes whose winner compiled to the same schedule share one copy (on 1024 GPUs
  // recursive doubling's LL schedule wins six sizes).
  std::shared_ptr<const core::Schedule> schedule;
  // The hardware evaluator: bestUs was measured (a measured time ranks above any predicted one); simulatedUs is the
  // simulator's time of the same schedule, which the screens compare candidates with.
  bool measured = false;
  double simulatedUs = 0;
};

struct SynthResult {
  std::vector<SizeBest> sizes;
  std::vector<CandidateRecord> history;  // this run's candidates (resumed ones first, as read)
  int roundsRun = 0;
  double elapsedS = 0;
  std::string stopReason;  // "round budget", "time budget", "converged", "the proposer has nothing new", "stopped"
  bool stopped = false;    // the caller's keepGoing said stop: the result is incomplete
  // The hardware evaluator: one line per round, "round 2: measured 7 schedules" or "round 2: no measurement (the
  // launcher exited with status 1 ...); the simulator's times stand".
  std::vector<std::string> measurementNotes;
  int roundsMeasured = 0;
};

struct ProgressEvent {
  enum class Kind { Baselines, RoundStart, Candidate, RoundEnd } kind = Kind::Candidate;
  int round = 0;
  int index = 0;                            // candidate index within the round
  int count = 0;                            // candidates in the round
  const CandidateRecord* record = nullptr;  // Kind::Candidate
  const SynthResult* result = nullptr;      // the state so far
};

// `keepGoing` is asked after the baselines and after each candidate (it may block, as optiflowd's CPU gate does);
// false ends the run there with stopped set.
SynthResult runSynthesis(const core::Topology& topology, const SynthConfig& config, Proposer& proposer,
                         Evaluator& evaluator, const std::function<void(const ProgressEvent&)>& progress = {},
                         const std::function<bool()>& keepGoing = {});

}  // namespace optiflow::synth
