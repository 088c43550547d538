#include "optiflow/schedcache/reader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "entry.h"
#include "segment.h"

namespace optiflow::schedcache {
namespace {

// NCCL versions without a communicator id pass 0, which marks a free pin: give it an id of its own.
constexpr std::uint64_t kZeroCommId = 0x9e3779b97f4a7c15ULL;
constexpr auto kPinWait = std::chrono::seconds(1);
// A claim takes a few stores; one that has not moved for this long belongs to a rank that died.
constexpr auto kDeadClaim = std::chrono::milliseconds(100);

template <typename T>
std::atomic_ref<T> ref(T& v) {
  return std::atomic_ref<T>(v);
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool pinIsStale(std::int64_t stampNs, std::int64_t nowNs) { return !pinIsYoung(stampNs, nowNs); }

void setDetail(std::string* detail, std::string text) {
  if (detail != nullptr) *detail = std::move(text);
}

PlanInfo infoOf(const PlanSlotHeader& h, std::uint32_t slot, std::uint32_t current) {
  PlanInfo info;
  info.slot = slot;
  info.contentHash = h.contentHash;
  info.generation = h.generation;
  info.publishedNs = h.publishedNs;
  info.entryCount = h.entryCount;
  info.source = detail::sourceText(h);
  info.current = slot == current;
  return info;
}

std::string slotName(const std::string& ns, std::uint32_t slot) {
  return segmentPath(ns) + " slot " + std::to_string(slot);
}

}  // namespace

struct Reader::Mapping {
  detail::MappedSegment segment;
};

const Decision* CommPlan::find(std::uint32_t coll, std::uint64_t nBytes) const noexcept {
  if (coll >= kNumCollectives) return nullptr;
  const auto& v = byCollective[coll];
  auto it =
      std::upper_bound(v.begin(), v.end(), nBytes, [](std::uint64_t n, const Decision& d) { return n < d.minBytes; });
  if (it == v.begin()) return nullptr;
  --it;
  return nBytes <= it->maxBytes ? &*it : nullptr;
}

std::size_t CommPlan::entryCount() const noexcept {
  std::size_t n = 0;
  for (const auto& v : byCollective) n += v.size();
  return n;
}

std::size_t CommPlan::memoryBytes() const noexcept {
  std::size_t n = 0;
  for (const auto& v : byCollective) n += v.capacity() * sizeof(Decision);
  return n + trials.capacity() * sizeof(TrialEntry);
}

Reader::Reader(std::string ns, std::unique_ptr<Mapping> mapping)
    : ns_(std::move(ns)), mapping_(std::move(mapping)), segment_(mapping_->segment.segment()) {}

Reader::~Reader() {
  const std::uint64_t dropped = choicesDropped_.load(std::memory_order_relaxed);
  if (dropped != 0 && segment_ != nullptr) {
    std::atomic_ref<std::uint64_t>(segment_->measure.counters.choiceFull).fetch_add(dropped, std::memory_order_relaxed);
  }
}

std::unique_ptr<Reader> Reader::attach(std::string_view ns, Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  try {
    auto mapping = std::make_unique<Mapping>();
    err = detail::openSegment(ns, &mapping->segment);
    if (err.status != Status::kOk) return nullptr;
    return std::unique_ptr<Reader>(new Reader(std::string(ns), std::move(mapping)));
  } catch (const std::exception& e) {
    err = detail::makeError(Status::kSystem, segmentPath(ns) + ": " + e.what());
  } catch (...) {
    err = detail::makeError(Status::kSystem, segmentPath(ns) + ": unknown exception");
  }
  return nullptr;
}

std::uint64_t Reader::generation() const noexcept {
  return ref(segment_->header.generation).load(std::memory_order_acquire);
}

std::int64_t Reader::createdNs() const noexcept { return segment_->header.createdNs; }

std::string Reader::build() const {
  const char* b = segment_->header.writerBuild;
  return std::string(b, strnlen(b, kBuildBytes));
}

Status Reader::current(PlanInfo* info) const noexcept {
  const std::uint32_t cur = ref(segment_->header.currentSlot).load(std::memory_order_acquire);
  if (cur == kNoSlot) return Status::kNoPlan;
  if (cur >= kPlanSlots) return Status::kBadHeader;
  try {
    detail::SlotCopy copy;
    std::string why;
    switch (detail::readSlot(segment_->slots[cur], &copy, &why, detail::kReadAttempts)) {
      case detail::SlotState::kComplete:
        if (info != nullptr) *info = infoOf(copy.header, cur, cur);
        return Status::kOk;
      case detail::SlotState::kEmpty:
      case detail::SlotState::kCorrupt:
        return Status::kBadChecksum;
      case detail::SlotState::kOdd:
      case detail::SlotState::kChanging:
        return Status::kTorn;
    }
  } catch (...) {
    return Status::kSystem;
  }
  return Status::kTorn;
}

std::vector<PlanInfo> Reader::plans() const {
  std::vector<PlanInfo> out;
  const std::uint32_t cur = ref(segment_->header.currentSlot).load(std::memory_order_acquire);
  detail::SlotCopy copy;
  std::string why;
  for (std::uint32_t s = 0; s < kPlanSlots; ++s) {
    if (detail::readSlot(segment_->slots[s], &copy, &why, detail::kReadAttempts) == detail::SlotState::kComplete) {
      out.push_back(infoOf(copy.header, s, cur));
    }
  }
  return out;
}

bool Reader::check(std::vector<std::string>* report) const {
  bool ok = true;
  const std::uint32_t cur = ref(segment_->header.currentSlot).load(std::memory_order_acquire);
  auto add = [&](std::string line) {
    if (report != nullptr) report->push_back(std::move(line));
  };
  if (cur != kNoSlot && cur >= kPlanSlots) {
    add("current slot " + std::to_string(cur) + " is out of range (" + std::to_string(kPlanSlots) + " slots)");
    ok = false;
  }
  detail::SlotCopy copy;
  for (std::uint32_t s = 0; s < kPlanSlots; ++s) {
    std::string why;
    const std::string prefix = "slot " + std::to_string(s) + ": ";
    const bool isCurrent = s == cur;
    const std::string suffix = isCurrent ? " (current)" : "";
    switch (detail::readSlot(segment_->slots[s], &copy, &why, detail::kReadAttempts)) {
      case detail::SlotState::kComplete: {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "plan %s, generation %llu, %u entries, checksum ok",
                      detail::slotHashText(copy.header).c_str(),
                      static_cast<unsigned long long>(copy.header.generation), copy.header.entryCount);
        add(prefix + buf + suffix);
        break;
      }
      case detail::SlotState::kEmpty:
        add(prefix + "empty" + suffix);
        if (isCurrent) ok = false;
        break;
      case detail::SlotState::kOdd:
        add(prefix + "being written or abandoned by a writer that died (seq odd)" + suffix);
        if (isCurrent) ok = false;
        break;
      case detail::SlotState::kChanging:
        add(prefix + "kept changing while read (a writer is reusing it)" + suffix);
        if (isCurrent) ok = false;
        break;
      case detail::SlotState::kCorrupt:
        add(prefix + (why.rfind("checksum", 0) == 0 ? "checksum mismatch: " : "invalid content: ") + why + suffix);
        ok = false;
        break;
    }
  }
  return ok;
}

namespace {

constexpr int kChangingWaits = 200;

// Finds the slot holding plan `hash` (0: the current one) and copies it. kOk, or the status to return.
Status findAndRead(const Segment& segment, const std::string& ns, std::uint64_t hash, detail::SlotCopy* copy,
                   std::uint32_t* slotOut, std::string* detail) {
  Status last = Status::kTorn;
  std::string lastDetail;
  int waits = 0;  // for a slot being written that may hold `hash`
  for (int attempt = 0; attempt < detail::kReadAttempts; ++attempt) {
    std::uint32_t slot = kNoSlot;
    if (hash == 0) {
      slot = std::atomic_ref<std::uint32_t>(const_cast<std::uint32_t&>(segment.header.currentSlot))
                 .load(std::memory_order_acquire);
      if (slot == kNoSlot) {
        setDetail(detail, segmentPath(ns) + ": no plan is current (nothing published, or cleared)");
        return Status::kNoPlan;
      }
      if (slot >= kPlanSlots) {
        setDetail(detail, segmentPath(ns) + ": current slot " + std::to_string(slot) + " is out of range");
        return Status::kBadHeader;
      }
    } else {
      bool changing = false;
      for (std::uint32_t s = 0; s < kPlanSlots && slot == kNoSlot; ++s) {
        PlanSlotHeader h{};
        const auto state = detail::peekSlot(segment.slots[s], &h, 2);
        if (state == detail::SlotState::kComplete && h.contentHash == hash) slot = s;
        // A slot that is odd throughout may be the one holding `hash`: a republish of the same plan rewrites its
        // header in place.
        if (state == detail::SlotState::kChanging || state == detail::SlotState::kOdd) changing = true;
      }
      if (slot == kNoSlot) {
        // A write takes microseconds, but its writer can be descheduled in the middle: wait up to about 0.2 s (the
        // tuner's init, not a hot path) rather than fail a communicator over it.
        if (changing && waits++ < kChangingWaits) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          --attempt;
          continue;
        }
        setDetail(detail, segmentPath(ns) + ": no slot holds plan " + formatHash(hash) +
                              (changing ? " (a slot stayed mid-write for 0.2 s: its writer is stuck or died)" : ""));
        return Status::kNotFound;
      }
    }
    std::string why;
    switch (detail::readSlot(segment.slots[slot], copy, &why, 2)) {
      case detail::SlotState::kComplete:
        if (hash != 0 && copy->header.contentHash != hash) continue;  // reused between the scan and the read
        *slotOut = slot;
        return Status::kOk;
      case detail::SlotState::kCorrupt:
        setDetail(detail, slotName(ns, slot) + ": " + why);
        return Status::kBadChecksum;
      case detail::SlotState::kEmpty:
        // Only a garbage currentSlot names an empty slot.
        last = Status::kBadChecksum;
        lastDetail = slotName(ns, slot) + " is current but empty";
        break;
      case detail::SlotState::kOdd:
      case detail::SlotState::kChanging:
        last = Status::kTorn;
        lastDetail = slotName(ns, slot) + " kept changing while read (a writer reused it)";
        break;
    }
  }
  setDetail(detail, lastDetail.empty() ? segmentPath(ns) + ": slots kept changing while read" : lastDetail);
  return last;
}

}  // namespace

Status Reader::loadComm(std::uint64_t hash, std::uint32_t nRanks, std::uint32_t nNodes, CommPlan* out,
                        std::string* detail) const noexcept {
  try {
    detail::SlotCopy copy;
    std::uint32_t slot = kNoSlot;
    const Status st = findAndRead(*segment_, ns_, hash, &copy, &slot, detail);
    if (st != Status::kOk) return st;
    CommPlan plan;
    plan.planHash = copy.header.contentHash;
    // Entries are sorted by (coll, nRanks, nNodes, minBytes) and disjoint (checked by readSlot).
    for (const PlanEntry& e : copy.entries) {
      if (e.nRanks != nRanks || e.nNodes != nNodes) continue;
      Decision d;
      d.minBytes = e.minBytes;
      d.maxBytes = e.maxBytes;
      d.chunkBytes = e.chunkBytes;
      d.algorithm = e.algorithm;
      d.protocol = e.protocol;
      d.nChannels = e.nChannels;
      if (e.trialCount > 0) {  // readSlot checked trialFirst + trialCount against the slot's candidates
        d.trialFirst = static_cast<std::uint16_t>(plan.trials.size());
        d.trialCount = e.trialCount;
        d.trialCalls = e.trialCalls;
        d.trialIndex = plan.trialDecisions++;
        plan.trials.insert(plan.trials.end(), copy.trials.begin() + e.trialFirst,
                           copy.trials.begin() + e.trialFirst + e.trialCount);
      }
      plan.byCollective[e.coll].push_back(d);
    }
    for (auto& v : plan.byCollective) v.shrink_to_fit();
    plan.trials.shrink_to_fit();
    if (out != nullptr) *out = std::move(plan);
    return Status::kOk;
  } catch (const std::bad_alloc&) {
    setDetail(detail, segmentPath(ns_) + ": out of memory copying a plan");
  } catch (...) {
    setDetail(detail, segmentPath(ns_) + ": unexpected exception copying a plan");
  }
  return Status::kSystem;
}

Status Reader::loadPlan(std::uint64_t hash, Plan* out, PlanInfo* info, std::string* detail) const {
  detail::SlotCopy copy;
  std::uint32_t slot = kNoSlot;
  const Status st = findAndRead(*segment_, ns_, hash, &copy, &slot, detail);
  if (st != Status::kOk) return st;
  auto str = [&](std::uint32_t offset) {
    // readSlot checked that the offset is in range and NUL-terminated.
    return offset == kNoString ? std::string() : std::string(copy.strings.data() + offset);
  };
  if (out != nullptr) {
    Plan plan;
    plan.source = detail::sourceText(copy.header);
    plan.items.reserve(copy.entries.size());
    for (const PlanEntry& e : copy.entries) {
      PlanItem it = detail::fromEntry(e);
      it.jsonPath = str(e.jsonPath);
      it.xmlPath = str(e.xmlPath);
      if (e.trialCount > 0) {
        it.trialCalls = e.trialCalls;
        for (std::uint32_t t = 0; t < e.trialCount; ++t) {
          it.trials.push_back(detail::fromTrialEntry(copy.trials[e.trialFirst + t]));
        }
      }
      plan.items.push_back(std::move(it));
    }
    *out = std::move(plan);
  }
  if (info != nullptr) {
    *info = infoOf(copy.header, slot, ref(segment_->header.currentSlot).load(std::memory_order_acquire));
  }
  return Status::kOk;
}

std::uint64_t Reader::pinComm(std::uint64_t commId, std::uint64_t proposed, std::uint32_t nRanks, std::uint32_t nNodes,
                              Status* status) noexcept {
  auto result = [&](Status s, std::uint64_t hash) {
    if (status != nullptr) *status = s;
    return hash;
  };
  if (commId == 0) commId = kZeroCommId;
  if (proposed == kPinPending) proposed = kPinNoPlan;
  const auto callStart = std::chrono::steady_clock::now();
  const auto deadline = callStart + kPinWait;
  const std::size_t start = mix(commId) % kCommPins;
  CommPin* pins = segment_->pins;

  // Scan the probe chain up to its first free entry: an entry of ours is adopted; otherwise the first free or stale
  // entry is claimed. Every rank scans the same chain and claims by CAS, so the ranks of one communicator meet at
  // one entry.
  for (;;) {
    const auto steadyNow = std::chrono::steady_clock::now();
    if (steadyNow > deadline) return result(Status::kTorn, kPinPending);
    const std::int64_t now = detail::realtimeNs();
    CommPin* candidate = nullptr;
    std::uint64_t candidateId = 0;
    std::uint64_t candidateHash = 0;
    std::int64_t candidateStamp = 0;
    bool rescan = false;
    CommPin* mine = nullptr;
    for (std::size_t probe = 0; probe < kCommPins && !rescan && mine == nullptr; ++probe) {
      CommPin& pin = pins[(start + probe) % kCommPins];
      const std::uint64_t id = ref(pin.commId).load(std::memory_order_acquire);
      if (id == 0) {
        if (candidate == nullptr) candidate = &pin;
        break;
      }
      const std::uint64_t hash = ref(pin.planHash).load(std::memory_order_acquire);
      const std::int64_t stamp = ref(pin.stampNs).load(std::memory_order_acquire);
      // A claimer stores commId before the stamp: the three values belong together only if the id held still.
      if (ref(pin.commId).load(std::memory_order_acquire) != id) {
        rescan = true;
        break;
      }
      const bool stale = pinIsStale(stamp, now);
      if (id == commId && (hash == kPinPending || !stale)) {
        mine = &pin;
      } else if (hash == kPinPending) {
        // With a fresh stamp the claim is another communicator's and its id is final. With an old one it may be a
        // stale entry being reclaimed, possibly for us: wait for it, unless we have waited so long that its claimer
        // must have died between two stores.
        if (!stale || steadyNow - callStart > kDeadClaim) continue;
        rescan = true;
      } else if (stale && candidate == nullptr) {
        candidate = &pin;
        candidateId = id;
        candidateHash = hash;
        candidateStamp = stamp;
      }
    }
    if (mine != nullptr) {
      std::uint64_t hash;
      while ((hash = ref(mine->planHash).load(std::memory_order_acquire)) == kPinPending) {
        if (std::chrono::steady_clock::now() > deadline) return result(Status::kTorn, kPinPending);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      // The entry may have been reclaimed for another communicator while we waited.
      if (ref(mine->commId).load(std::memory_order_acquire) == commId) return result(Status::kOk, hash);
      continue;
    }
    if (rescan) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      continue;
    }
    if (candidate == nullptr) return result(Status::kPinTableFull, kPinPending);

    if (candidateId == 0) {
      // A free entry's planHash is already kPinPending: owning commId is enough.
      std::uint64_t expected = 0;
      if (!ref(candidate->commId).compare_exchange_strong(expected, commId, std::memory_order_acq_rel)) continue;
    } else {
      // A stale entry is taken by turning its hash pending first, so nobody adopts the old hash under our id.
      std::uint64_t expected = candidateHash;
      if (!ref(candidate->planHash).compare_exchange_strong(expected, kPinPending, std::memory_order_acq_rel)) {
        continue;
      }
      // Another rank may have reclaimed it and stored the same hash again (ABA): its new stamp tells.
      if (ref(candidate->stampNs).load(std::memory_order_acquire) != candidateStamp ||
          ref(candidate->commId).load(std::memory_order_acquire) != candidateId) {
        ref(candidate->planHash).store(candidateHash, std::memory_order_release);
        continue;
      }
      ref(candidate->commId).store(commId, std::memory_order_release);
    }
    ref(candidate->nRanks).store(nRanks, std::memory_order_relaxed);
    ref(candidate->nNodes).store(nNodes, std::memory_order_relaxed);
    ref(candidate->stampNs).store(detail::realtimeNs(), std::memory_order_release);
    ref(candidate->planHash).store(proposed, std::memory_order_release);
    return result(Status::kOk, proposed);
  }
}

std::vector<CommPin> Reader::pins() const {
  std::vector<CommPin> out;
  for (CommPin& pin : segment_->pins) {
    CommPin p{};
    p.commId = ref(pin.commId).load(std::memory_order_acquire);
    if (p.commId == 0) continue;
    p.planHash = ref(pin.planHash).load(std::memory_order_acquire);
    p.stampNs = ref(pin.stampNs).load(std::memory_order_relaxed);
    p.nRanks = ref(pin.nRanks).load(std::memory_order_relaxed);
    p.nNodes = ref(pin.nNodes).load(std::memory_order_relaxed);
    out.push_back(p);
  }
  return out;
}

void Reader::recordCall(std::uint32_t coll, std::uint64_t nBytes) noexcept {
  if (coll >= kNumCollectives) return;
  ref(segment_->activity.calls[coll][sizeBucket(nBytes)]).fetch_add(1, std::memory_order_relaxed);
}

Activity Reader::activity() const noexcept {
  Activity out{};
  for (std::uint32_t c = 0; c < kNumCollectives; ++c) {
    for (std::uint32_t b = 0; b < kSizeBuckets; ++b) {
      out.calls[c][b] = ref(segment_->activity.calls[c][b]).load(std::memory_order_relaxed);
    }
  }
  return out;
}

namespace {

// Names in the segment are written and read byte by byte through atomic_ref: another process may be writing them.
void loadName(const char* src, std::size_t bytes, char* dst) noexcept {
  for (std::size_t i = 0; i < bytes; ++i) {
    dst[i] = std::atomic_ref<char>(const_cast<char&>(src[i])).load(std::memory_order_relaxed);
  }
  dst[bytes - 1] = '\0';
}

bool nameEquals(const char* src, std::size_t bytes, std::string_view name) noexcept {
  if (name.size() >= bytes) return false;
  for (std::size_t i = 0; i <= name.size(); ++i) {
    const char c = std::atomic_ref<char>(const_cast<char&>(src[i])).load(std::memory_order_relaxed);
    if (c != (i < name.size() ? name[i] : '\0')) return false;
  }
  return true;
}

// Open addressing from key % capacity. A free record is claimed by CAS on its key, then named; a record whose key
// matches was claimed by this or another process for the same name and is shared.
NetCounters* claimRecord(NetStatsRecord* table, std::size_t capacity, std::string_view name) noexcept {
  if (name.empty() || name.size() >= kNetNameBytes) return nullptr;
  const std::uint64_t key = netNameKey(name.data(), name.size());
  const std::size_t start = static_cast<std::size_t>(key % capacity);
  for (std::size_t probe = 0; probe < capacity; ++probe) {
    NetStatsRecord& rec = table[(start + probe) % capacity];
    std::uint64_t found = ref(rec.key).load(std::memory_order_acquire);
    if (found == 0) {
      if (ref(rec.key).compare_exchange_strong(found, key, std::memory_order_acq_rel)) {
        for (std::size_t i = 0; i < name.size(); ++i) ref(rec.name[i]).store(name[i], std::memory_order_relaxed);
        ref(rec.name[name.size()]).store('\0', std::memory_order_relaxed);
        ref(rec.lastNs).store(realtimeNs(), std::memory_order_release);
        return &rec.counters;
      }
      // Lost the race: `found` is the winner's key, maybe ours.
    }
    if (found == key) {
      ref(rec.lastNs).store(realtimeNs(), std::memory_order_relaxed);
      return &rec.counters;
    }
  }
  return nullptr;
}

std::vector<NetStatsRecord> snapshotRecords(const NetStatsRecord* table, std::size_t capacity) {
  std::vector<NetStatsRecord> out;
  for (std::size_t r = 0; r < capacity; ++r) {
    auto& rec = const_cast<NetStatsRecord&>(table[r]);
    const std::uint64_t key = ref(rec.key).load(std::memory_order_acquire);
    if (key == 0) continue;
    NetStatsRecord copy{};
    copy.key = key;
    copy.lastNs = ref(rec.lastNs).load(std::memory_order_acquire);
    loadName(rec.name, kNetNameBytes, copy.name);
    auto* src = reinterpret_cast<std::uint64_t*>(&rec.counters);
    auto* dst = reinterpret_cast<std::uint64_t*>(&copy.counters);
    for (std::size_t i = 0; i < sizeof(NetCounters) / sizeof(std::uint64_t); ++i) {
      dst[i] = ref(src[i]).load(std::memory_order_relaxed);
    }
    out.push_back(copy);
  }
  return out;
}

// railIndex runs once per connection; a writer keeps railSeq odd for a few stores. One that died mid-update leaves
// it odd until the next `optiflow cache rails set`: give up after this long (the rail then counts as weight 1).
constexpr auto kRailReadBudget = std::chrono::milliseconds(10);

// Runs read() under NetRegion::railSeq until it saw a stable even counter; false when the budget ran out.
template <typename Read>
bool readRails(NetRegion& net, Read&& read) {
  auto seq = ref(net.railSeq);
  const auto deadline = std::chrono::steady_clock::now() + kRailReadBudget;
  for (int attempt = 0;; ++attempt) {
    const std::uint64_t before = seq.load(std::memory_order_acquire);
    if (before % 2 == 0) {
      read(std::min<std::uint32_t>(ref(net.railCount).load(std::memory_order_relaxed), kNetRails));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq.load(std::memory_order_relaxed) == before) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (attempt < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace

NetCounters* Reader::netNic(std::string_view name) noexcept { return claimRecord(segment_->net.nics, kNetRails, name); }

NetCounters* Reader::netPeer(std::string_view name) noexcept {
  return claimRecord(segment_->net.peers, kNetPeers, name);
}

std::vector<NetStatsRecord> Reader::netNics() const { return snapshotRecords(segment_->net.nics, kNetRails); }

std::vector<NetStatsRecord> Reader::netPeers() const { return snapshotRecords(segment_->net.peers, kNetPeers); }

int Reader::railIndex(std::string_view ifname) const noexcept {
  if (ifname.empty()) return -1;
  NetRegion& net = segment_->net;
  int index = -1;
  const bool stable = readRails(net, [&](std::uint32_t count) {
    index = -1;
    for (std::uint32_t i = 0; i < count && index < 0; ++i) {
      if (nameEquals(net.rails[i].name, sizeof(net.rails[i].name), ifname)) index = static_cast<int>(i);
    }
  });
  return stable ? index : -1;
}

std::uint32_t Reader::railWeight(int index) const noexcept {
  if (index < 0 || static_cast<std::uint32_t>(index) >= kNetRails) return 1;
  return ref(segment_->net.rails[index].weight).load(std::memory_order_relaxed);
}

std::vector<NetRailWeight> Reader::railWeights() const {
  NetRegion& net = segment_->net;
  std::vector<NetRailWeight> out;
  out.reserve(kNetRails);
  // Best effort when a writer died mid-update: the last copy, which may show a half-written name.
  readRails(net, [&](std::uint32_t count) {
    out.clear();
    for (std::uint32_t i = 0; i < count; ++i) {
      NetRailWeight w{};
      loadName(net.rails[i].name, sizeof(w.name), w.name);
      w.weight = ref(net.rails[i].weight).load(std::memory_order_relaxed);
      out.push_back(w);
    }
  });
  return out;
}

}  // namespace optiflow::schedcache
