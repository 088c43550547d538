// A plan as a process holds it (the CLI and daemon build one, the reader can copy one out of the segment), its
// content hash, and the checks a plan must pass before it is published.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::schedcache {

// A configuration a plan entry tries on a communicator's first calls of its size range (docs/consistency.md).
struct TrialCandidate {
  std::optional<core::Algorithm> algorithm;  // nullopt: NCCL's own choice (the tuner leaves NCCL's table alone)
  std::optional<core::Protocol> protocol;    // nullopt: any (only with an algorithm)
  std::int32_t nChannels = 0;                // 0: NCCL decides
  std::uint64_t chunkBytes = 0;              // NCCL 2.30 getChunkSize; 0: NCCL decides
  bool operator==(const TrialCandidate&) const = default;
};

// In the segment a PlanItem is a PlanEntry of NCCL's indices; the writer and the reader convert, in one place
// (src/entry.h, through core's ncclFuncIndex/ncclIndex and back).
struct PlanItem {
  core::Collective coll = core::Collective::AllReduce;  // one NCCL's tuner decides (core::ncclFuncIndex)
  std::uint32_t nRanks = 0;
  std::uint32_t nNodes = 0;
  std::uint64_t minBytes = 0;
  std::uint64_t maxBytes = 0;                // inclusive
  std::optional<core::Algorithm> algorithm;  // nullopt: no decision, NCCL decides
  std::optional<core::Protocol> protocol;    // nullopt: any (only with an algorithm)
  std::int32_t nChannels = 0;                // 0: NCCL decides
  std::uint64_t chunkBytes = 0;              // 0: NCCL decides
  float nativeUs = 0;
  float bestUs = 0;
  float boundUs = 0;
  float ncclUs = 0;
  // nativeUs (ncclUs where there is no decision) was measured in running jobs by the profiler plugin, not simulated.
  // Not part of the content hash: the same decisions are the same plan, measured or not.
  bool measured = false;
  std::uint64_t scheduleId = 0;  // content hash of the synthesized schedule file; 0: none
  std::string jsonPath;          // absolute paths of the exported schedule; empty: none
  std::string xmlPath;
  // Trials: each candidate gets trialCalls calls, in turn, on a communicator's first calls of this range; then the
  // decision above applies. NCCL's own choice (algorithm nullopt) must be one of them. Empty: no trials.
  std::vector<TrialCandidate> trials;
  std::uint32_t trialCalls = 0;
};

struct Plan {
  std::string source;  // shown by `optiflow cache show`; truncated to kSourceBytes - 1 in the segment
  std::vector<PlanItem> items;
};

// CRC-64 (XZ) over the decisions only: collective, ranks, nodes, size range, algorithm, protocol, channels, chunk,
// schedule id and the trials (candidates in order, calls each), in a canonical order. Times, paths and the source are
// left out, so the same decisions published from different directories on different nodes have the same hash (what
// OPTIFLOW_PLAN pins). Never 0 or 1.
std::uint64_t contentHash(const Plan& plan);

// 16 lower-case hex digits, and back (exactly 16 hex digits, either case; anything else is nullopt).
std::string formatHash(std::uint64_t hash);
std::optional<std::uint64_t> parseHash(std::string_view text);

// Empty when the plan can be published; otherwise what is wrong, naming the item (index, collective, size range):
// too many items or too many path bytes for a slot, a collective NCCL's tuner does not decide (alltoall, custom, a
// value out of range), an algorithm/protocol out of range, a protocol without an algorithm, negative channels,
// minBytes > maxBytes, zero ranks or nodes, overlapping ranges of one (collective, ranks, nodes); trials without
// NCCL's own choice among them, with more than kMaxTrialsPerEntry candidates, a candidate twice, without calls or with
// more than kMaxTrialCalls, more than kMaxTrials candidates in the plan, or an invalid candidate.
std::string validatePlan(const Plan& plan);

}  // namespace optiflow::schedcache
