// The tuner's decisions, in plain C++ (no NCCL types): which plan a communicator uses (the consistency rule of
// docs/consistency.md) and how a plan's decision is applied to NCCL's cost table. The plugin layer (plugin/) turns
// NCCL's arguments into these calls and back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "optiflow/schedcache/reader.h"

namespace optiflow::tuner {

// What the plugin read once from the environment at init (plugin/include/optiflow/plugin/params.h).
struct Settings {
  bool enabled = true;                  // OPTIFLOW_TUNER=off: never use a plan
  std::string ns = "default";           // OPTIFLOW_NAMESPACE
  std::optional<std::uint64_t> pinned;  // OPTIFLOW_PLAN
  bool missingUsesDefaults = false;     // OPTIFLOW_PLAN_MISSING=defaults
  std::string ncclOverride;             // "NCCL_ALGO=..." / "NCCL_PROTO=..." when the user set them
  std::string host;                     // this node's name, for messages
  int settleS = 60;                     // OPTIFLOW_SETTLE_S
};

// What NCCL tells tuner init about the communicator. v2-v4 (NCCL 2.21-2.27) give no communicator id.
struct CommShape {
  std::optional<std::uint64_t> commId;
  std::uint32_t nRanks = 0;
  std::uint32_t nNodes = 0;
};

enum class LogLevel { kWarn, kInfo };
// The plugin forwards these to NCCL's logger (subsystem TUNING). Called in init only.
class Log {
 public:
  virtual ~Log() = default;
  virtual void write(LogLevel level, const std::string& message) = 0;
};

class CommTuner;

struct InitResult {
  std::unique_ptr<CommTuner> tuner;  // never null when ok
  bool ok = true;                    // false: init must fail (a pinned plan is missing); message says why
  std::string message;
};

// Decides the plan of one communicator:
//   disabled, or NCCL_ALGO/NCCL_PROTO set           -> no plan
//   OPTIFLOW_PLAN=H                                  -> H; if this node lacks H: fail (or no plan with
//                                                       OPTIFLOW_PLAN_MISSING=defaults, logged as a warning)
//   unpinned, more than one node                     -> no plan (nodes read different segments)
//   unpinned, one node, no communicator id (v2-v4)   -> no plan (ranks cannot agree through the segment)
//   unpinned, one node, communicator id              -> the pin of this communicator in the segment: the first
//                                                       rank records the current plan (no plan while the segment
//                                                       is younger than settleS: a peer may have initialised
//                                                       before it existed), the others adopt it; a recorded plan
//                                                       this rank cannot load fails init
// Problems with the segment itself (absent, garbage, other version, wrong owner) mean no plan, logged once per
// process and reason.
InitResult initComm(const Settings& settings, const CommShape& shape, Log& log);

// Rank-consistent trials (docs/consistency.md): which candidate call number `call` (0-based: the communicator's own
// count of calls of this decision's collective and size range) of a decision with `candidates` candidates of
// `callsEach` calls each uses; nullopt once the trials are over (the decision itself applies). A pure function of
// what every rank of the communicator shares: the plan's content hash, the communicator id, the decision (collective
// and range start) and the count. The order of candidates is rotated by a hash of the first three, so that
// communicators of one job do not all try the same candidate at the same time of the run.
std::optional<std::uint32_t> trialCandidate(std::uint64_t planHash, std::uint64_t commId, std::uint32_t coll,
                                            std::uint64_t minBytes, std::uint64_t call, std::uint32_t candidates,
                                            std::uint32_t callsEach) noexcept;

// NCCL's own pick from a cost table of numAlgo x numProto entries ([algo][proto], contiguous): the index of the
// smallest entry >= 0, the first on ties; -1 when none can run (every entry negative or NaN).
int ncclArgmin(const float* table, int numAlgo, int numProto) noexcept;

class CommTuner {
 public:
  CommTuner() = default;
  CommTuner(schedcache::CommPlan plan, std::unique_ptr<schedcache::Reader> reader, std::uint64_t commId = 0);

  bool hasPlan() const noexcept { return plan_.planHash != 0; }
  std::uint64_t planHash() const noexcept { return plan_.planHash; }

  // Hot path (NCCL >= 2.22): table is NCCL's contiguous float[numAlgo][numProto] of µs, -1 = unavailable. Sets the
  // plan's entry to 0.0 (and any other 0.0 entry to a tiny positive cost, so the tie rule cannot pick it) and
  // *nChannels when the plan has a channel count. Leaves everything untouched (returns false) without a decision,
  // or when the decision's entry is -1 or outside numAlgo x numProto: an entry NCCL disabled is never enabled.
  // A decision with trials counts the call and, while its trials last, applies the candidate trialCandidate names
  // instead (NCCL's own choice: the table is left alone). With a segment and a communicator id, NCCL's own choice
  // (ncclArgmin of the table as NCCL handed it over) is recorded first, plan or not (Reader::recordChoice).
  bool applyCostTable(std::uint32_t coll, std::uint64_t nBytes, float* table, int numAlgo, int numProto,
                      int* nChannels) const noexcept;
  // Hot path (v2, NCCL 2.21): no table; writes algorithm/protocol only when the algorithm is one NCCL 2.21 can run
  // for that collective given collNet/NVLS support.
  bool applyDirect(std::uint32_t coll, std::uint64_t nBytes, bool collNetSupport, bool nvlsSupport, int* algorithm,
                   int* protocol, int* nChannels) const noexcept;
  // v6 getChunkSize: the plan's chunk size when NCCL's final (algo, proto) is the plan's decision for this call (or,
  // during trials, the candidate of the last getCollInfo of this decision).
  bool chunkSize(std::uint32_t coll, std::uint64_t nBytes, int algorithm, int protocol,
                 std::size_t* chunkBytes) const noexcept;

  std::size_t memoryBytes() const noexcept;  // private bytes of this communicator (the footprint benchmark)

 private:
  // What a call of decision d applies: the decision itself, or the trial candidate of call number `call`.
  struct Applied {
    std::int8_t algorithm = -1;
    std::int8_t protocol = -1;
    std::int32_t nChannels = 0;
    std::uint64_t chunkBytes = 0;
  };
  Applied applied(std::uint32_t coll, const schedcache::Decision& d, std::uint64_t call) const noexcept;
  void recordNcclChoice(std::uint32_t coll, std::uint64_t nBytes, const float* table, int numAlgo,
                        int numProto) const noexcept;

  schedcache::CommPlan plan_;
  std::unique_ptr<schedcache::Reader> reader_;  // activity counters, NCCL's choices; null without a segment
  std::uint64_t commId_ = 0;
  // Calls so far per decision with trials (Decision::trialIndex). NCCL calls a communicator's tuner from one thread
  // at a time; relaxed atomics keep a misbehaving caller from a data race.
  std::unique_ptr<std::atomic<std::uint64_t>[]> trialCalls_;
};

}  // namespace optiflow::tuner
