// Proposers write candidate programs in the OptiFlow language; the loop (loop.h) evaluates them and hands back
// what it learned as feedback, round after round. A proposer never sees schedules, only program text and results.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/topology.h"

namespace optiflow::synth {

// One proposed program.
struct Candidate {
  std::string text;    // the program, in the OptiFlow language
  std::string origin;  // where it came from: "gallery:ring", "mutate:r1c4:strategy", "llm", "llm-repair:r2c1"
};

// A candidate's result at one message size.
struct SizeResult {
  std::uint64_t sizeBytes = 0;
  bool ok = false;
  std::string error;  // why it did not compile or simulate (verbatim), when !ok
  double timeUs = 0;
  double boundUs = 0;      // the lower bound at this size (docs/bounds.md)
  double ncclUs = 0;       // NCCL's own choice timed by the same simulator; 0 when it has no schedule
  std::string config;      // protocol/channels/slices of the winning compile options, e.g. "LL128/2ch/2sl"
  std::string bottleneck;  // the busiest link and its utilisation, e.g. "node0.gpu3->nic3 (97%)"; empty if none
  // The hardware evaluator: timeUs is then the measured time and simulatedUs the simulator's; or, where the
  // round's measurement failed for this schedule, measureError says why and timeUs stays the simulator's.
  bool measured = false;
  double simulatedUs = 0;
  std::string measureError;
};

// Everything the loop learned about one candidate: the feedback proposers read.
struct CandidateRecord {
  std::string id;  // "r<round>c<index>", unique within a run
  int round = 0;
  std::string origin;
  std::string name;  // the program's name; empty when it did not parse
  std::string text;
  std::string stage;              // "ok", or the stage that rejected it: "parse", "expand", "duplicate"
  std::string errors;             // the rejection's messages verbatim (file:line:col, text, caret), when stage != "ok"
  std::vector<SizeResult> sizes;  // per size of the run, when stage == "ok"
};

struct ProposalContext {
  const core::Topology& topology;
  core::Collective collective = core::Collective::AllGather;
  std::vector<std::uint64_t> sizes;
  int round = 0;                                // 0-based
  int maxCandidates = 8;                        // propose at most this many this round
  const std::vector<CandidateRecord>& history;  // every earlier candidate of the run, in order
  std::vector<int> bestPerSize;                 // per size: index into history of the best so far, -1 if none
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Never throws for bad feedback or a failing backend: returns fewer (or no) candidates and logs why.
  virtual std::vector<Candidate> propose(const ProposalContext& context) = 0;
  // How many of the fastest times at each size propose() reads. A candidate screened at a size whose time is above
  // those may be recorded with a lower bound instead (its simulation stopped early), which changes nothing it reads.
  // The default: every time is read.
  virtual std::size_t timesReadPerSize() const { return std::numeric_limits<std::size_t>::max(); }
};

}  // namespace optiflow::synth
