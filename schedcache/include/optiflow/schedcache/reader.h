// Process-local view of a namespace's segment for the plugins (and `optiflow cache show|verify`). Attaching and
// loading may make system calls and allocate; the tuner does both in init only. After init, CommPlan::find,
// Reader::recordCall and Reader::recordChoice are the only calls on NCCL's per-collective path: no allocation, no
// locks, no system calls.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/measure.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::schedcache {

// What the tuner needs of one entry, copied out of the segment at init.
struct Decision {
  std::uint64_t minBytes = 0;
  std::uint64_t maxBytes = 0;
  std::uint64_t chunkBytes = 0;
  std::int8_t algorithm = -1;
  std::int8_t protocol = -1;
  std::int32_t nChannels = 0;
  std::uint8_t trialCount = 0;  // candidates at CommPlan::trials[trialFirst..]; 0: no trials
  std::uint16_t trialFirst = 0;
  std::uint16_t trialCalls = 0;  // calls per candidate
  std::uint16_t trialIndex = 0;  // this decision's number among those with trials (the tuner's call counters)
};

// The decisions of one plan for one communicator shape (nRanks, nNodes), private to the communicator: once
// copied, nothing a writer does later can change or tear them.
struct CommPlan {
  std::uint64_t planHash = 0;                                       // 0: no plan
  std::array<std::vector<Decision>, kNumCollectives> byCollective;  // sorted by minBytes, disjoint
  std::vector<TrialEntry> trials;                                   // the candidates of decisions with trials
  std::uint16_t trialDecisions = 0;                                 // decisions with trials

  // nullptr when the plan has no decision for (coll, nBytes). noexcept, allocation-free: binary search.
  const Decision* find(std::uint32_t coll, std::uint64_t nBytes) const noexcept;
  std::size_t entryCount() const noexcept;
  std::size_t memoryBytes() const noexcept;  // heap bytes held (capacity), for the footprint benchmark
};

struct PlanInfo {
  std::uint32_t slot = kNoSlot;
  std::uint64_t contentHash = 0;
  std::uint64_t generation = 0;
  std::int64_t publishedNs = 0;
  std::uint32_t entryCount = 0;
  std::string source;
  bool current = false;
};

class Reader {
 public:
  // Opens /dev/shm/optiflow-<ns> and checks, in this order: the name, owner (the effective user; another user's
  // segment only when it is group read-write (0660) for a group this process is in), permissions (never
  // world-writable), size, magic, layout version, capacities, header checksum.
  // nullptr with *error filled when any check fails. Never throws.
  static std::unique_ptr<Reader> attach(std::string_view ns, Error* error) noexcept;
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  std::string_view ns() const noexcept { return ns_; }
  std::uint64_t generation() const noexcept;
  std::int64_t createdNs() const noexcept;  // CLOCK_REALTIME when the segment was created
  std::string build() const;                // OPTIFLOW_VERSION of the process that created it

  // The current plan's info; status kNoPlan when nothing is current, kTorn/kBadChecksum when its slot is unreadable.
  Status current(PlanInfo* info) const noexcept;
  // Every slot holding a complete plan whose checksum matches (for `show`), current one flagged.
  std::vector<PlanInfo> plans() const;
  // Slot-by-slot check for `verify`: one line per slot with what was found; false when any written slot is bad.
  bool check(std::vector<std::string>* report) const;

  // Copies the decisions of plan `hash` (0: the current plan) for (nRanks, nNodes) into *out, under the slot's
  // sequence counter and checksum (retries a few times while a writer reuses the slot). kOk with an empty CommPlan
  // (planHash set) when the plan has no entries for that shape.
  Status loadComm(std::uint64_t hash, std::uint32_t nRanks, std::uint32_t nNodes, CommPlan* out,
                  std::string* detail) const noexcept;
  // The whole plan (items with paths), for `show --json` and `verify`.
  Status loadPlan(std::uint64_t hash, Plan* out, PlanInfo* info, std::string* detail) const;

  // The consistency rule for ranks of one node (docs/consistency.md): returns the plan hash communicator commId
  // uses. The first rank records `proposed` (a plan hash, or kPinNoPlan); later ranks get what it recorded. Waits at
  // most ~1 s for a rank that is between claiming the pin and storing the hash. kPinPending on failure (*status says
  // why: kPinTableFull, kTorn for the wait timing out).
  std::uint64_t pinComm(std::uint64_t commId, std::uint64_t proposed, std::uint32_t nRanks, std::uint32_t nNodes,
                        Status* status) noexcept;
  std::vector<CommPin> pins() const;

  // Hot path: one relaxed atomic increment in the segment (the daemon's view of what jobs call).
  void recordCall(std::uint32_t coll, std::uint64_t nBytes) noexcept;
  Activity activity() const noexcept;

  // Net plugin telemetry (NetRegion). The counters of NIC / peer `name`, claimed on first use by any process of the
  // node; nullptr when the name is empty or longer than kNetNameBytes-1, or the table is full. The plugin resolves a
  // name once per connection and then does relaxed atomic adds on the returned record: no lookup on the data path.
  NetCounters* netNic(std::string_view name) noexcept;
  NetCounters* netPeer(std::string_view name) noexcept;
  std::vector<NetStatsRecord> netNics() const;  // claimed records, copied with relaxed loads
  std::vector<NetStatsRecord> netPeers() const;

  // Rail weights for striping. railIndex: the record of interface `ifname`, -1 when none (resolve once per
  // connection); railWeight: relaxed load of its weight (every message). railWeights: the named records.
  int railIndex(std::string_view ifname) const noexcept;
  std::uint32_t railWeight(int index) const noexcept;
  std::vector<NetRailWeight> railWeights() const;

  // Profiler plugin measurements (MeasureRegion). The record of one configuration, claimed on first use by any
  // process of the node (open addressing on measureKey, CAS on the key); nullptr when the table is full. Hot path of
  // the profiler: no allocation, lock or system call.
  MeasureRecord* measureRecord(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes, std::int8_t algorithm,
                               std::int8_t protocol, std::uint32_t channels) noexcept;
  // One timed call into a record: relaxed atomic adds (calls, sum, sketch bucket), an atomic minimum, the last stop.
  static void addMeasurement(MeasureRecord* record, std::uint64_t ns, std::int64_t stopNs) noexcept;
  void addMeasureCounters(const MeasureCounters& delta) noexcept;
  // Every ready record with calls, in table order; and the node's counters.
  std::vector<Measurement> measurements() const;
  MeasureCounters measureCounters() const noexcept;

  // Hot path of the tuner: NCCL's own choice for this call, claimed/updated with relaxed atomics; no allocation, lock
  // or syscall. coll is core::Collective (MeasureRecord's encoding). The record is looked for within kChoiceProbes
  // slots of its hash; a call that finds none is counted in this Reader and added to MeasureCounters::choiceFull when
  // it is destroyed (communicator finalize), so a full table costs no shared write per call.
  void recordChoice(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes, std::int8_t algorithm,
                    std::int8_t protocol) noexcept;
  std::vector<NcclChoice> ncclChoices() const;  // every ready record, in table order

 private:
  struct Mapping;
  Reader(std::string ns, std::unique_ptr<Mapping> mapping);
  std::string ns_;
  std::unique_ptr<Mapping> mapping_;
  Segment* segment_ = nullptr;
  // recordChoice calls that found no record. NCCL calls a communicator's tuner from one thread at a time; relaxed
  // loads and stores keep a misbehaving caller from a data race without a locked instruction per call.
  std::atomic<std::uint64_t> choicesDropped_{0};
};

}  // namespace optiflow::schedcache
