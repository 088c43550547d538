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
//   PlanSlot[]      published plans; a slot is written under its own sequence counter (odd while written) and
//                   becomes current only after its checksum is stored, so a reader never uses a torn plan and a
//                   writer killed mid-write leaves the previous current plan untouched (docs/schedcache.md)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace optiflow::schedcache {

inline constexpr std::uint64_t kMagic = 0x31574c464954504fULL;  // "OPTIFLW1" read as little-endian bytes
inline constexpr std::uint32_t kLayoutVersion = 1;              // still unreleased: changes before 0.2 keep 1
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

// Values equal NCCL's ncclFunc_t / algorithm / protocol indices (the plugin static_asserts that), so a decision
// is applied without translation. Kept as integers here: this layer never sees NCCL's types.
enum class Collective : std::uint8_t {
  kBroadcast = 0,
  kReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllReduce = 4
};
enum class Algorithm : std::int8_t {
  kNone = -1,
  kTree = 0,
  kRing = 1,
  kCollNetDirect = 2,
  kCollNetChain = 3,
  kNvls = 4,
  kNvlsTree = 5,
  kPat = 6
};
enum class Protocol : std::int8_t { kNone = -1, kLL = 0, kLL128 = 1, kSimple = 2 };
inline constexpr int kNumAlgorithms = 7;
inline constexpr int kNumProtocols = 3;

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
  std::uint8_t coll;       // Collective
  std::int8_t algorithm;   // Algorithm; kNone: no decision (the tuner leaves NCCL's choice alone)
  std::int8_t protocol;    // Protocol
  std::uint8_t flags;      // reserved, 0
  std::int32_t nChannels;  // 0: NCCL decides
  std::uint64_t reserved;
};
static_assert(std::is_trivially_copyable_v<PlanEntry> && std::is_standard_layout_v<PlanEntry>);
static_assert(sizeof(PlanEntry) == 80);
static_assert(offsetof(PlanEntry, nRanks) == 32 && offsetof(PlanEntry, nativeUs) == 40);
static_assert(offsetof(PlanEntry, jsonPath) == 56 && offsetof(PlanEntry, coll) == 64);
static_assert(offsetof(PlanEntry, nChannels) == 68 && offsetof(PlanEntry, reserved) == 72);

struct PlanSlotHeader {
  std::uint64_t seq;  // atomic_ref; odd while the slot is being written
  std::uint64_t contentHash;
  std::uint64_t generation;  // SegmentHeader::generation this plan was published as
  std::int64_t publishedNs;  // CLOCK_REALTIME
  std::uint32_t entryCount;
  std::uint32_t stringBytes;  // used bytes of strings
  // CRC-32 over the bytes from contentHash up to (not including) checksum, then source[], then
  // entries[0..entryCount), then strings[0..stringBytes).
  std::uint32_t checksum;
  std::uint32_t flags;        // reserved, 0
  char source[kSourceBytes];  // where the plan came from (plan directory), NUL-terminated, for `show`
};
static_assert(std::is_trivially_copyable_v<PlanSlotHeader> && sizeof(PlanSlotHeader) == 288);
static_assert(offsetof(PlanSlotHeader, checksum) == 40 && offsetof(PlanSlotHeader, source) == 48);

struct PlanSlot {
  PlanSlotHeader header;
  PlanEntry entries[kMaxEntries];
  char strings[kStringBytes];
};
static_assert(std::is_trivially_copyable_v<PlanSlot>);
static_assert(sizeof(PlanSlot) == 288 + 80 * kMaxEntries + kStringBytes);

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
  PlanSlot slots[kPlanSlots];
};
static_assert(std::is_trivially_copyable_v<Segment>);
static_assert(offsetof(Segment, pins) == 256 && offsetof(Segment, activity) == 256 + 32 * kCommPins);
static_assert(offsetof(Segment, slots) % 8 == 0);

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free &&
              std::atomic_ref<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<std::uint64_t>::required_alignment <= alignof(std::uint64_t));

inline std::uint32_t sizeBucket(std::uint64_t nBytes) {
  return nBytes <= 1 ? 0u : static_cast<std::uint32_t>(63 - __builtin_clzll(nBytes));
}

}  // namespace optiflow::schedcache
