// The shared-memory layout of the per-node schedule cache: the only header the daemon/CLI (writers) and the NCCL
// plugins (readers) share. Everything here lives in the segment, so every type is fixed-size, pointer-free and
// trivially copyable; fields that several processes touch concurrently are plain integers accessed through
// std::atomic_ref (std::atomic itself is not trivially copyable).
//
// Segment (one per namespace, /dev/shm/optiflow-<namespace>):
//   SegmentHeader   magic, layout version, sizes, generation, the current plan slot
//   CommPin[]       "communicator X uses plan H": the first rank of a communicator on this node records it, the
//                   other ranks adopt it (docs/consistency.md)
//   Activity        calls per collective and log2 size, counted by the tuner for the daemon (relaxed atomics)
//   NetRegion       rail weights for the net plugin's striping (written by the daemon/CLI) and its telemetry per NIC
//                   and per peer (relaxed atomic adds from the plugins, read by the daemon)
//   PlanSlot[]      published plans; a slot is written under its own sequence counter (odd while written) and
//                   becomes current only after its checksum is stored, so a reader never uses a torn plan and a
//                   writer killed mid-write leaves the previous current plan untouched (docs/schedcache.md)
//   MeasureRegion   GPU times of collectives, measured by the profiler plugin in every job on the node, per
//                   communicator, collective, size, algorithm, protocol and channel count (docs/profiler.md), and
//                   NCCL's own (algorithm, protocol) per communicator, collective and size, as the tuner read it
//                   from NCCL's cost table
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace optiflow::schedcache {

inline constexpr std::uint64_t kMagic = 0x31574c464954504fULL;  // "OPTIFLW1" read as little-endian bytes
// 2: the MeasureRegion (profiler measurements, NCCL's own choices) changed the segment's size and layout. A segment
// of another version is refused with kBadVersion (readers and writers alike); `optiflow cache clear --remove`
// deletes it, and optiflowd or the next `optiflow cache publish` creates the new one.
inline constexpr std::uint32_t kLayoutVersion = 2;
inline constexpr std::uint32_t kPlanSlots = 4;
inline constexpr std::uint32_t kMaxEntries = 16384;      // per plan
inline constexpr std::uint32_t kStringBytes = 1u << 20;  // per plan: schedule file paths, NUL-terminated
inline constexpr std::uint32_t kCommPins = 1024;
inline constexpr std::uint32_t kNumCollectives = 5;  // NCCL's ncclFunc_t values 0..4 (the ones a tuner sees)
inline constexpr std::uint32_t kSizeBuckets = 64;    // floor(log2(nBytes)), 0 for 0 and 1
inline constexpr std::uint32_t kNoSlot = 0xffffffffu;
inline constexpr std::uint32_t kNoString = 0xffffffffu;
inline constexpr std::size_t kSourceBytes = 240;
inline constexpr std::size_t kBuildBytes = 32;

// Plan hashes 0 and 1 are reserved in CommPin::planHash (0: being recorded, 1: this communicator uses no plan);
// contentHash() never returns them.
inline constexpr std::uint64_t kPinPending = 0;
inline constexpr std::uint64_t kPinNoPlan = 1;

// One decision: for calls of `coll` with nBytes in [minBytes, maxBytes] on a communicator of nRanks ranks over
// nNodes nodes. Entries of one (coll, nRanks, nNodes) never overlap; the writer checks that.
struct PlanEntry {
  std::uint64_t minBytes;
  std::uint64_t maxBytes;    // inclusive
  std::uint64_t chunkBytes;  // NCCL 2.30 getChunkSize; 0: NCCL decides
  std::uint64_t scheduleId;  // content hash of the synthesized schedule this size's winner came from; 0: none
  std::uint32_t nRanks;
  std::uint32_t nNodes;
  float nativeUs;          // simulated time of the NCCL-native decision below
  float bestUs;            // simulated time of the synthesized schedule (0: none)
  float boundUs;           // lower bound at this size
  float ncclUs;            // simulated time of NCCL's own choice, for `optiflow cache show`
  std::uint32_t jsonPath;  // offsets into PlanSlot::strings, kNoString when absent
  std::uint32_t xmlPath;
  // NCCL's own indices, so the tuner applies a decision without translation (the plugin static_asserts them against
  // NCCL's): ncclFunc_t (core::ncclFuncIndex), NCCL_ALGO_* and NCCL_PROTO_* (core::ncclIndex).
  std::uint8_t coll;
  std::int8_t algorithm;   // -1: no decision (the tuner leaves NCCL's choice alone)
  std::int8_t protocol;    // -1: any
  std::uint8_t flags;      // kEntryMeasured; other bits 0
  std::int32_t nChannels;  // 0: NCCL decides
  // Rank-consistent trials (docs/consistency.md): trialCount candidates at PlanSlot::trials[trialFirst..], tried
  // trialCalls calls each on a communicator's first calls of this size range; 0: no trials.
  std::uint32_t trialFirst;
  std::uint8_t trialCount;
  std::uint8_t trialReserved;  // 0
  std::uint16_t trialCalls;
};
// PlanEntry::flags: nativeUs (ncclUs where there is no decision) was measured in running jobs, not simulated.
inline constexpr std::uint8_t kEntryMeasured = 1;
static_assert(std::is_trivially_copyable_v<PlanEntry> && std::is_standard_layout_v<PlanEntry>);
static_assert(sizeof(PlanEntry) == 80);
static_assert(offsetof(PlanEntry, nRanks) == 32 && offsetof(PlanEntry, nativeUs) == 40);
static_assert(offsetof(PlanEntry, jsonPath) == 56 && offsetof(PlanEntry, coll) == 64);
static_assert(offsetof(PlanEntry, nChannels) == 68 && offsetof(PlanEntry, trialFirst) == 72);
static_assert(offsetof(PlanEntry, trialCount) == 76 && offsetof(PlanEntry, trialCalls) == 78);

// One NCCL-native configuration a plan entry tries (NCCL's indices); algorithm -1 is NCCL's own choice (the tuner
// leaves the cost table alone for that call).
inline constexpr std::uint32_t kMaxTrials = 4096;       // per plan
inline constexpr std::uint32_t kMaxTrialsPerEntry = 8;  // candidates of one entry, NCCL's own included
inline constexpr std::uint32_t kMaxTrialCalls = 1000;   // calls per candidate
struct TrialEntry {
  std::int8_t algorithm;  // -1: NCCL's own choice
  std::int8_t protocol;   // -1: any (only with an algorithm)
  std::uint16_t reserved;
  std::int32_t nChannels;    // 0: NCCL decides
  std::uint64_t chunkBytes;  // NCCL 2.30 getChunkSize; 0: NCCL decides
};
static_assert(std::is_trivially_copyable_v<TrialEntry> && sizeof(TrialEntry) == 16);

struct PlanSlotHeader {
  std::uint64_t seq;  // atomic_ref; odd while the slot is being written
  std::uint64_t contentHash;
  std::uint64_t generation;  // SegmentHeader::generation this plan was published as
  std::int64_t publishedNs;  // CLOCK_REALTIME
  std::uint32_t entryCount;
  std::uint32_t stringBytes;  // used bytes of strings
  // CRC-32 over the bytes from contentHash up to (not including) checksum, then trialCount, source[], then
  // entries[0..entryCount), then strings[0..stringBytes), then trials[0..trialCount).
  std::uint32_t checksum;
  std::uint32_t trialCount;   // used records of PlanSlot::trials
  char source[kSourceBytes];  // where the plan came from (plan directory), NUL-terminated, for `show`
};
static_assert(std::is_trivially_copyable_v<PlanSlotHeader> && sizeof(PlanSlotHeader) == 288);
static_assert(offsetof(PlanSlotHeader, checksum) == 40 && offsetof(PlanSlotHeader, source) == 48);

struct PlanSlot {
  PlanSlotHeader header;
  PlanEntry entries[kMaxEntries];
  char strings[kStringBytes];
  TrialEntry trials[kMaxTrials];
};
static_assert(std::is_trivially_copyable_v<PlanSlot>);
static_assert(sizeof(PlanSlot) == 288 + 80 * kMaxEntries + kStringBytes + 16 * kMaxTrials);

struct CommPin {
  std::uint64_t commId;    // atomic_ref; 0: free
  std::uint64_t planHash;  // atomic_ref; kPinPending until the recording rank stores the plan hash
  std::int64_t stampNs;    // CLOCK_REALTIME when recorded; pins older than kPinAdoptWindowS may be reused
  std::uint32_t nRanks;
  std::uint32_t nNodes;
};
static_assert(std::is_trivially_copyable_v<CommPin> && sizeof(CommPin) == 32);

// The window within which every rank of a communicator on one node finishes tuner init (NCCL initialises the tuner
// at the end of a collective comm init, so ranks are seconds apart). A slot whose plan a pin younger than this
// names is not overwritten; an older pin may be reused.
inline constexpr std::int64_t kPinAdoptWindowS = 600;
// A pin recorded at stampNs still protects its plan (and its communicator may still be initialising) at nowNs.
inline bool pinIsYoung(std::int64_t stampNs, std::int64_t nowNs) {
  return nowNs - stampNs <= kPinAdoptWindowS * 1'000'000'000LL;
}

struct Activity {
  std::uint64_t calls[kNumCollectives][kSizeBuckets];  // atomic_ref, relaxed increments from getCollInfo
};
static_assert(std::is_trivially_copyable_v<Activity> && sizeof(Activity) == 8 * 5 * 64);

// ---- Net plugin: rail weights and telemetry -------------------------------------------------------------------
inline constexpr std::uint32_t kNetRails = 16;    // NICs a node can weight and report
inline constexpr std::uint32_t kNetPeers = 256;   // remote addresses a node reports
inline constexpr std::size_t kNetNameBytes = 48;  // "eth0", or a peer "10.1.2.3" / IPv6 text, NUL-terminated

// Counters for one NIC or one peer. Every field is accessed through atomic_ref with relaxed adds by the plugins of
// every process on the node; readers (daemon, `optiflow cache show`) take a snapshot and difference two of them.
struct NetCounters {
  std::uint64_t bytesSent;
  std::uint64_t bytesRecv;
  std::uint64_t msgsSent;
  std::uint64_t msgsRecv;
  std::uint64_t sendBusyNs;  // time with at least one send in flight: achieved send throughput = bytesSent / this
  std::uint64_t recvBusyNs;
  std::uint64_t stalls;  // episodes in which a request waited and progress moved no byte (full socket, slow peer)
  std::uint64_t errors;  // connections failed (peer died, corrupt frame, ...)
  std::uint64_t sizeLog2[kSizeBuckets];  // messages sent, by sizeBucket(bytes)
};
static_assert(std::is_trivially_copyable_v<NetCounters> && sizeof(NetCounters) == 8 * 8 + 8 * 64);

// One NIC's or peer's counters. `key` (atomic_ref) is 0 while free; a plugin claims a free record with a CAS to
// netNameKey(name), then writes name. Two processes claiming the same name find each other's record by key.
struct NetStatsRecord {
  std::uint64_t key;
  std::int64_t lastNs;  // atomic_ref; CLOCK_REALTIME of the last update (coarse, set at connection events)
  char name[kNetNameBytes];
  NetCounters counters;
};
static_assert(std::is_trivially_copyable_v<NetStatsRecord> && sizeof(NetStatsRecord) == 64 + sizeof(NetCounters));

// A rail's striping weight: the share of a striped message the sender puts on that NIC, relative to the other rails
// of the connection. 0 means "do not use this rail" unless every rail is 0 (then equal shares). The sender reads the
// weight for every message; the receiver never needs it (each message's frame says how it was split).
struct NetRailWeight {
  char name[16];         // interface name (IFNAMSIZ), NUL-terminated; "" for an unused record
  std::uint32_t weight;  // atomic_ref
  std::uint32_t reserved;
};
static_assert(std::is_trivially_copyable_v<NetRailWeight> && sizeof(NetRailWeight) == 24);

struct NetRegion {
  std::uint64_t railSeq;    // atomic_ref; sequence counter over rails[].name (odd while the set of names changes)
  std::uint32_t railCount;  // records in use
  std::uint32_t reserved;
  NetRailWeight rails[kNetRails];
  NetStatsRecord nics[kNetRails];
  NetStatsRecord peers[kNetPeers];
};
static_assert(std::is_trivially_copyable_v<NetRegion> && sizeof(NetRegion) % 8 == 0);

// Never 0 (0 marks a free record): FNV-1a over the name, with 0 mapped to 1.
inline std::uint64_t netNameKey(const char* name, std::size_t length) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < length; ++i) h = (h ^ static_cast<unsigned char>(name[i])) * 0x100000001b3ULL;
  return h == 0 ? 1 : h;
}

// ---- Profiler plugin: measured collectives ---------------------------------------------------------------------
inline constexpr std::uint32_t kMeasureRecords = 2048;  // distinct (communicator, collective, size, config) per node
// The quantile sketch: a log-linear histogram of GPU times in ns. Octave k (times in [2^(kSketchMinLog2+k),
// 2^(kSketchMinLog2+k+1))) is split into kSketchSubBuckets equal buckets, so a quantile read back as its bucket's
// midpoint is within 1/(2*kSketchSubBuckets) = 3.1% of a recorded time. Times below 2^kSketchMinLog2 ns (128 ns)
// fall into bucket 0, times at or above 2^(kSketchMinLog2+kSketchOctaves) ns (about 137 s) into the last one.
inline constexpr std::uint32_t kSketchMinLog2 = 7;
inline constexpr std::uint32_t kSketchOctaves = 30;
inline constexpr std::uint32_t kSketchSubBuckets = 16;
inline constexpr std::uint32_t kSketchBuckets = kSketchOctaves * kSketchSubBuckets;

// One measured configuration. `key` (atomic_ref) is 0 while free; a plugin claims a free record with a CAS to
// measureKey(...) of the fields below, then writes them and sets `ready` (release). Every process of the node that
// measures the same configuration adds into the same record (relaxed atomics), so the ranks of one communicator on a
// node pool their samples. Records are never freed (`optiflow cache clear --remove` starts over).
struct MeasureRecord {
  std::uint64_t key;
  std::uint64_t commId;     // the communicator id NCCL gives the tuner and the profiler alike
  std::uint64_t sizeBytes;  // nccl-tests size: the whole buffer
  std::uint8_t coll;        // core::Collective
  std::int8_t algorithm;    // NCCL_ALGO_* index
  std::int8_t protocol;     // NCCL_PROTO_* index
  std::uint8_t ready;       // atomic_ref: 1 once commId..channels are written
  std::uint32_t channels;
  std::uint64_t calls;  // atomic_ref: timed calls
  std::uint64_t minNs;  // atomic_ref: 0 until the first call
  std::uint64_t sumNs;  // atomic_ref
  std::int64_t lastNs;  // atomic_ref: GPU globaltimer (ns, the driver keeps it near CLOCK_REALTIME) of the last stop
  std::uint32_t sketch[kSketchBuckets];  // atomic_ref: calls per bucket (sketchBucket)
};
static_assert(std::is_trivially_copyable_v<MeasureRecord> && sizeof(MeasureRecord) == 64 + 4 * kSketchBuckets);
static_assert(offsetof(MeasureRecord, calls) == 32 && offsetof(MeasureRecord, sketch) == 64);

// Counters of what the profilers (and, for choiceFull, the tuners) of the node could not record, each added at
// communicator finalize.
struct MeasureCounters {
  std::uint64_t untimed;     // collectives without GPU stamps for every channel (not timed, as Inspector does)
  std::uint64_t poolFull;    // events dropped because a profiler's fixed pool was full
  std::uint64_t tableFull;   // timed collectives dropped because no MeasureRecord was free
  std::uint64_t foreign;     // events naming a handle or parent the profiler never gave out
  std::uint64_t choiceFull;  // tuner calls whose NCCL choice was not recorded: no ChoiceRecord free
};
static_assert(std::is_trivially_copyable_v<MeasureCounters> && sizeof(MeasureCounters) == 40);

inline constexpr std::uint32_t kChoiceRecords = 2048;  // distinct (communicator, collective, size) per node
// A record is looked for at most this many slots from its hash: the tuner's hot path must stay short when the
// table is (nearly) full, at the price of a few records dropped early (counted in MeasureCounters::choiceFull).
inline constexpr std::uint32_t kChoiceProbes = 8;

// NCCL's own choice for one (communicator, collective, size), as the tuner read it from NCCL's cost table before
// changing it. key (atomic_ref) 0 while free; claimed by CAS to choiceKey(...), then fields written, ready set
// (release). algorithm and protocol are stored one after the other: should NCCL's choice change between calls, a reader
// may briefly pair one call's algorithm with another's protocol (the daemon reads them long after the calls).
// A choice's count stops here: every rank of a communicator updates the same record on every call, and a count that
// no longer changes leaves that cache line clean.
inline constexpr std::uint64_t kChoiceCallsCounted = 1024;
struct ChoiceRecord {
  std::uint64_t key;
  std::uint64_t commId;
  std::uint64_t sizeBytes;  // the tuner's nBytes (the same whole-buffer size the profiler records)
  std::uint8_t coll;        // core::Collective (same encoding as MeasureRecord::coll)
  std::int8_t algorithm;    // atomic_ref: NCCL_ALGO_* index of the last call's argmin
  std::int8_t protocol;     // atomic_ref
  std::uint8_t ready;       // atomic_ref
  std::uint32_t reserved;
  std::uint64_t calls;  // atomic_ref: calls seen, up to kChoiceCallsCounted
};
static_assert(std::is_trivially_copyable_v<ChoiceRecord> && sizeof(ChoiceRecord) == 40);
static_assert(offsetof(ChoiceRecord, sizeBytes) == 16 && offsetof(ChoiceRecord, coll) == 24);
static_assert(offsetof(ChoiceRecord, algorithm) == 25 && offsetof(ChoiceRecord, protocol) == 26);
static_assert(offsetof(ChoiceRecord, ready) == 27 && offsetof(ChoiceRecord, calls) == 32);

struct MeasureRegion {
  MeasureCounters counters;  // atomic_ref on each field
  MeasureRecord records[kMeasureRecords];
  ChoiceRecord choices[kChoiceRecords];
};
static_assert(std::is_trivially_copyable_v<MeasureRegion> && sizeof(MeasureRegion) % 8 == 0);
static_assert(offsetof(MeasureRegion, choices) == 40 + sizeof(MeasureRecord) * kMeasureRecords);

inline std::uint64_t measureKey(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes, std::int8_t algorithm,
                                std::int8_t protocol, std::uint32_t channels) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mixIn = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
  };
  mixIn(commId);
  mixIn(sizeBytes);
  mixIn((std::uint64_t{coll} << 24) | (std::uint64_t{static_cast<std::uint8_t>(algorithm)} << 16) |
        (std::uint64_t{static_cast<std::uint8_t>(protocol)} << 8));
  mixIn(channels);
  return h == 0 ? 1 : h;
}

// splitmix64's finaliser: the hashes of the per-call paths (choiceKey here, the tuner's trial rotation).
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Never 0 (0 marks a free record). A multiply-xorshift mix rather than measureKey's byte-wise FNV: this runs on every
// tuner call.
inline std::uint64_t choiceKey(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes) {
  const std::uint64_t h = mix64(commId ^ mix64(sizeBytes ^ (std::uint64_t{coll} << 56) ^ 0x9e3779b97f4a7c15ULL));
  return h == 0 ? 1 : h;
}

inline std::uint32_t sketchBucket(std::uint64_t ns) {
  if (ns < (std::uint64_t{1} << kSketchMinLog2)) return 0;
  const std::uint32_t log2 = static_cast<std::uint32_t>(63 - __builtin_clzll(ns));
  if (log2 >= kSketchMinLog2 + kSketchOctaves) return kSketchBuckets - 1;
  const std::uint32_t sub = static_cast<std::uint32_t>((ns >> (log2 - 4)) & (kSketchSubBuckets - 1));
  return (log2 - kSketchMinLog2) * kSketchSubBuckets + sub;
}
static_assert(kSketchSubBuckets == 16 && kSketchMinLog2 >= 4);  // sketchBucket takes 4 bits below the leading one

struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t layoutVersion;
  std::uint32_t headerBytes;   // sizeof(SegmentHeader)
  std::uint64_t segmentBytes;  // sizeof(Segment)
  std::uint32_t slotCount;
  std::uint32_t entryCapacity;
  std::uint32_t stringCapacity;
  std::uint32_t pinCapacity;
  char writerBuild[kBuildBytes];  // OPTIFLOW_VERSION of the process that created the segment
  std::uint32_t headerChecksum;   // CRC-32 over magic..writerBuild (never change after creation)
  std::uint32_t currentSlot;      // atomic_ref; kNoSlot: nothing published (or cleared)
  std::uint64_t generation;       // atomic_ref; +1 per publish or clear
  // CLOCK_REALTIME when the segment was created. Communicators use no plan from a segment younger than the settle
  // time: a rank that initialised before the segment existed used none, and its peers must agree
  // (docs/consistency.md).
  std::int64_t createdNs;
  std::uint8_t pad[160];
};
static_assert(std::is_trivially_copyable_v<SegmentHeader> && sizeof(SegmentHeader) == 256);
static_assert(offsetof(SegmentHeader, headerChecksum) == 72 && offsetof(SegmentHeader, generation) == 80);
static_assert(offsetof(SegmentHeader, createdNs) == 88);

struct Segment {
  SegmentHeader header;
  CommPin pins[kCommPins];
  Activity activity;
  NetRegion net;
  PlanSlot slots[kPlanSlots];
  MeasureRegion measure;
};
static_assert(std::is_trivially_copyable_v<Segment>);
static_assert(offsetof(Segment, pins) == 256 && offsetof(Segment, activity) == 256 + 32 * kCommPins);
static_assert(offsetof(Segment, net) % 8 == 0 && offsetof(Segment, slots) % 8 == 0);

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free &&
              std::atomic_ref<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<std::uint64_t>::required_alignment <= alignof(std::uint64_t));

inline std::uint32_t sizeBucket(std::uint64_t nBytes) {
  return nBytes <= 1 ? 0u : static_cast<std::uint32_t>(63 - __builtin_clzll(nBytes));
}

}  // namespace optiflow::schedcache
