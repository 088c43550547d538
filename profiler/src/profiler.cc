#include "optiflow/profiler/profiler.h"

#include <strings.h>

#include <cstring>
#include <iterator>
#include <limits>
#include <new>

namespace optiflow::profiler {
namespace {

// A collective record's state, one 64-bit word changed only by CAS, so that the two threads that hold a collective
// (the enqueuing thread until stopEvent(Coll), the proxy thread per channel) agree on who releases it last:
//   bits  0-15  channels announced but not started yet (pending)
//   bits 16-31  channels started, not stopped yet (active)
//   bit  32     the collective event is open (stopEvent(Coll) not seen yet)
//   bit  33     in use
//   bit  34     completing: the last holder is recording it; nobody else may touch it
//   bits 35-63  generation, +1 per use (for the reclaim check)
constexpr std::uint64_t kPendingMask = 0xffff;
constexpr std::uint64_t kActiveOne = std::uint64_t{1} << 16;
constexpr std::uint64_t kActiveMask = std::uint64_t{0xffff} << 16;
constexpr std::uint64_t kOpen = std::uint64_t{1} << 32;
constexpr std::uint64_t kBusy = std::uint64_t{1} << 33;
constexpr std::uint64_t kCompleting = std::uint64_t{1} << 34;
constexpr int kGenShift = 35;
constexpr std::uint64_t kGenMask = ~((std::uint64_t{1} << kGenShift) - 1);
constexpr int kProbes = 16;  // slots an allocation tries before it counts the pool as full

std::uint64_t pending(std::uint64_t s) { return s & kPendingMask; }
std::uint64_t active(std::uint64_t s) { return (s & kActiveMask) >> 16; }
std::uint64_t nextGeneration(std::uint64_t s) { return (s & kGenMask) + (std::uint64_t{1} << kGenShift); }
bool done(std::uint64_t s) { return pending(s) == 0 && active(s) == 0 && (s & kOpen) == 0; }

bool startsWith(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

struct alignas(64) Recorder::CollRecord {
  std::atomic<std::uint64_t> state{0};
  std::atomic<Comm*> comm{nullptr};
  std::atomic<std::uint64_t> allocSeq{0};
  std::atomic<std::uint64_t> minStart{0};
  std::atomic<std::uint64_t> maxStop{0};
  std::atomic<bool> bad{false};
  CollEvent event;
};

struct alignas(32) Recorder::ChannelRecord {
  std::atomic<std::uint32_t> busy{0};
  std::uint32_t coll = 0;  // index into colls_
  std::uint64_t startNs = 0;
  std::uint64_t stopNs = 0;
};

Comm::Comm(std::uint64_t commId, std::unique_ptr<schedcache::Reader> reader) noexcept
    : commId_(commId), reader_(std::move(reader)) {}

Comm::~Comm() = default;

schedcache::MeasureRecord* Comm::record(const CollEvent& e) noexcept {
  if (reader_ == nullptr) return nullptr;
  const auto coll = static_cast<std::uint8_t>(e.coll);
  const std::uint64_t key = schedcache::measureKey(commId_, coll, e.sizeBytes, e.algorithm, e.protocol, e.channels);
  std::atomic<schedcache::MeasureRecord*>& slot = cache_[key % kCacheEntries];
  schedcache::MeasureRecord* cached = slot.load(std::memory_order_acquire);
  if (cached != nullptr && std::atomic_ref<std::uint64_t>(cached->key).load(std::memory_order_relaxed) == key) {
    return cached;
  }
  schedcache::MeasureRecord* found =
      reader_->measureRecord(commId_, coll, e.sizeBytes, e.algorithm, e.protocol, e.channels);
  if (found != nullptr) slot.store(found, std::memory_order_release);
  return found;
}

Recorder::Recorder(std::size_t collRecords, std::size_t channelRecords)
    : collCount_(collRecords == 0 ? 1 : collRecords),
      channelCount_(channelRecords == 0 ? 1 : channelRecords),
      colls_(new CollRecord[collCount_]),
      channels_(new ChannelRecord[channelCount_]) {}

Recorder::~Recorder() = default;

Recorder::CollRecord* Recorder::collOf(const void* handle) const noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(handle);
  const auto base = reinterpret_cast<std::uintptr_t>(colls_.get());
  if (p < base || p >= base + collCount_ * sizeof(CollRecord) || (p - base) % sizeof(CollRecord) != 0) return nullptr;
  return &colls_[(p - base) / sizeof(CollRecord)];
}

Recorder::ChannelRecord* Recorder::channelOf(const void* handle) const noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(handle);
  const auto base = reinterpret_cast<std::uintptr_t>(channels_.get());
  if (p < base || p >= base + channelCount_ * sizeof(ChannelRecord) || (p - base) % sizeof(ChannelRecord) != 0) {
    return nullptr;
  }
  return &channels_[(p - base) / sizeof(ChannelRecord)];
}

HandleKind Recorder::kindOf(const void* handle) const noexcept {
  if (handle == nullptr) return HandleKind::kNone;
  if (collOf(handle) != nullptr) return HandleKind::kColl;
  if (channelOf(handle) != nullptr) return HandleKind::kKernelCh;
  return HandleKind::kForeign;
}

void* Recorder::startColl(Comm* comm, const CollEvent& event) noexcept {
  if (comm == nullptr || !comm->recording()) return nullptr;
  if (event.channels == 0 || event.channels > kPendingMask) {
    untimed_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  for (int probe = 0; probe < kProbes; ++probe) {
    const std::uint64_t seq = collCursor_.fetch_add(1, std::memory_order_relaxed);
    CollRecord& r = colls_[seq % collCount_];
    std::uint64_t s = r.state.load(std::memory_order_acquire);
    bool reclaim = false;
    if ((s & kBusy) != 0) {
      // A collective whose channels never all reported, a whole lap of the pool ago: NCCL will not report them now.
      // Never one with a channel in progress or one being recorded.
      const bool stale = (s & (kOpen | kCompleting)) == 0 && active(s) == 0 &&
                         seq - r.allocSeq.load(std::memory_order_relaxed) >= collCount_;
      if (!stale) continue;
      reclaim = true;
    }
    const std::uint64_t claimed = nextGeneration(s) | kBusy | kOpen | event.channels;
    if (!r.state.compare_exchange_strong(s, claimed, std::memory_order_acq_rel)) continue;
    if (reclaim) untimed_.fetch_add(1, std::memory_order_relaxed);
    r.comm.store(comm, std::memory_order_relaxed);
    r.allocSeq.store(seq, std::memory_order_relaxed);
    r.minStart.store(std::numeric_limits<std::uint64_t>::max(), std::memory_order_relaxed);
    r.maxStop.store(0, std::memory_order_relaxed);
    r.bad.store(false, std::memory_order_relaxed);
    r.event = event;
    return &r;
  }
  poolFull_.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void* Recorder::startKernelCh(void* parent, std::uint64_t startNs) noexcept {
  if (parent == nullptr) return nullptr;  // a collective we chose not to time
  CollRecord* r = collOf(parent);
  if (r == nullptr) {
    foreign_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  std::uint64_t s = r->state.load(std::memory_order_acquire);
  do {
    if ((s & kBusy) == 0 || (s & kCompleting) != 0 || pending(s) == 0) {
      foreign_.fetch_add(1, std::memory_order_relaxed);  // more channels than announced, or a finished collective
      return nullptr;
    }
  } while (!r->state.compare_exchange_weak(s, s - 1 + kActiveOne, std::memory_order_acq_rel));
  if (startNs == 0) {
    r->bad.store(true, std::memory_order_relaxed);
  } else {
    std::uint64_t seen = r->minStart.load(std::memory_order_relaxed);
    while (startNs < seen && !r->minStart.compare_exchange_weak(seen, startNs, std::memory_order_relaxed)) {
    }
  }
  for (int probe = 0; probe < kProbes; ++probe) {
    const std::uint64_t seq = channelCursor_.fetch_add(1, std::memory_order_relaxed);
    ChannelRecord& c = channels_[seq % channelCount_];
    std::uint32_t expected = 0;
    if (!c.busy.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
    c.coll = static_cast<std::uint32_t>(r - colls_.get());
    c.startNs = startNs;
    c.stopNs = 0;
    return &c;
  }
  // No channel record: NCCL will not report this channel's stop to us, so the collective cannot be timed.
  poolFull_.fetch_add(1, std::memory_order_relaxed);
  r->bad.store(true, std::memory_order_relaxed);
  release(*r, 0, true);
  return nullptr;
}

void Recorder::kernelChStop(void* handle, std::uint64_t stopNs) noexcept {
  ChannelRecord* c = channelOf(handle);
  if (c == nullptr) {
    if (handle != nullptr) foreign_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (c->busy.load(std::memory_order_relaxed) == 0) {
    foreign_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c->stopNs = stopNs;
}

void Recorder::stopEvent(void* handle) noexcept {
  if (handle == nullptr) return;
  if (CollRecord* r = collOf(handle)) {
    const std::uint64_t s = r->state.load(std::memory_order_acquire);
    if ((s & kBusy) == 0 || (s & kOpen) == 0) {
      foreign_.fetch_add(1, std::memory_order_relaxed);  // stopped twice, or never started
      return;
    }
    release(*r, kOpen, false);
    return;
  }
  if (ChannelRecord* c = channelOf(handle)) {
    if (c->busy.load(std::memory_order_relaxed) == 0) {
      foreign_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    CollRecord& r = colls_[c->coll];
    const std::uint64_t start = c->startNs;
    const std::uint64_t stop = c->stopNs;
    c->busy.store(0, std::memory_order_release);
    if (start == 0 || stop == 0 || stop < start) {
      r.bad.store(true, std::memory_order_relaxed);  // no GPU stamps for this channel
    } else {
      std::uint64_t seen = r.maxStop.load(std::memory_order_relaxed);
      while (stop > seen && !r.maxStop.compare_exchange_weak(seen, stop, std::memory_order_relaxed)) {
      }
    }
    release(r, 0, true);
    return;
  }
  foreign_.fetch_add(1, std::memory_order_relaxed);
}

// Drops one hold (the open collective event, or one active channel); the holder that leaves nothing pending,
// active or open records the collective.
bool Recorder::release(CollRecord& r, std::uint64_t clearBits, bool channelDone) noexcept {
  std::uint64_t s = r.state.load(std::memory_order_acquire);
  std::uint64_t next = 0;
  do {
    // A hold that is not there: a stop for a collective already released (finalized with its communicator).
    if ((s & kBusy) == 0 || (s & kCompleting) != 0 || (channelDone && active(s) == 0) || (s & clearBits) != clearBits) {
      foreign_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    next = s & ~clearBits;
    if (channelDone) next -= kActiveOne;
    if (done(next)) next |= kCompleting;
  } while (!r.state.compare_exchange_weak(s, next, std::memory_order_acq_rel));
  if ((next & kCompleting) == 0) return false;
  complete(r);
  r.state.store(next & kGenMask, std::memory_order_release);
  return true;
}

void Recorder::complete(CollRecord& r) noexcept {
  const std::uint64_t start = r.minStart.load(std::memory_order_relaxed);
  const std::uint64_t stop = r.maxStop.load(std::memory_order_relaxed);
  Comm* comm = r.comm.load(std::memory_order_relaxed);
  if (r.bad.load(std::memory_order_relaxed) || start == std::numeric_limits<std::uint64_t>::max() || stop <= start ||
      comm == nullptr) {
    untimed_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  schedcache::MeasureRecord* rec = comm->record(r.event);
  if (rec == nullptr) {
    tableFull_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  schedcache::Reader::addMeasurement(rec, stop - start, static_cast<std::int64_t>(stop));
  timed_.fetch_add(1, std::memory_order_relaxed);
}

void Recorder::finalizeComm(Comm* comm) noexcept {
  if (comm == nullptr) return;
  for (std::size_t i = 0; i < collCount_; ++i) {
    CollRecord& r = colls_[i];
    std::uint64_t s = r.state.load(std::memory_order_acquire);
    if ((s & kBusy) == 0 || (s & kCompleting) != 0 || r.comm.load(std::memory_order_relaxed) != comm) continue;
    if (r.state.compare_exchange_strong(s, s & kGenMask, std::memory_order_acq_rel)) {
      untimed_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (comm->reader() == nullptr) return;
  auto take = [](const std::atomic<std::uint64_t>& total, std::atomic<std::uint64_t>& flushed) {
    const std::uint64_t now = total.load(std::memory_order_relaxed);
    const std::uint64_t before = flushed.exchange(now, std::memory_order_relaxed);
    return now > before ? now - before : 0;
  };
  schedcache::MeasureCounters delta{};
  delta.untimed = take(untimed_, flushedUntimed_);
  delta.poolFull = take(poolFull_, flushedPoolFull_);
  delta.tableFull = take(tableFull_, flushedTableFull_);
  delta.foreign = take(foreign_, flushedForeign_);
  comm->reader()->addMeasureCounters(delta);
}

Recorder::Counters Recorder::counters() const noexcept {
  Counters c;
  c.timed = timed_.load(std::memory_order_relaxed);
  c.untimed = untimed_.load(std::memory_order_relaxed);
  c.poolFull = poolFull_.load(std::memory_order_relaxed);
  c.tableFull = tableFull_.load(std::memory_order_relaxed);
  c.foreign = foreign_.load(std::memory_order_relaxed);
  return c;
}

std::size_t Recorder::collRecordsInUse() const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < collCount_; ++i) {
    if ((colls_[i].state.load(std::memory_order_relaxed) & kBusy) != 0) ++n;
  }
  return n;
}

bool collectiveFromNcclName(const char* func, core::Collective* out) noexcept {
  if (func == nullptr) return false;
  struct Name {
    const char* text;
    core::Collective coll;
  };
  static constexpr Name kNames[] = {
      {"AllReduce", core::Collective::AllReduce},
      {"AllGather", core::Collective::AllGather},
      {"ReduceScatter", core::Collective::ReduceScatter},
      {"Broadcast", core::Collective::Broadcast},
      {"Reduce", core::Collective::Reduce},
      {"AlltoAll", core::Collective::AllToAll},
  };
  for (const Name& n : kNames) {
    if (std::strcmp(func, n.text) == 0) {
      *out = n.coll;
      return true;
    }
  }
  return false;
}

std::int8_t algorithmFromNcclName(const char* algo) noexcept {
  if (algo == nullptr) return -1;
  // NCCL's ncclAlgoStr names, in NCCL_ALGO_* order.
  static constexpr const char* kNames[] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
  for (std::size_t i = 0; i < std::size(kNames); ++i) {
    if (strcasecmp(algo, kNames[i]) == 0) return static_cast<std::int8_t>(i);
  }
  return -1;
}

std::int8_t protocolFromNcclName(const char* proto) noexcept {
  if (proto == nullptr) return -1;
  static constexpr const char* kNames[] = {"LL", "LL128", "Simple"};
  for (std::size_t i = 0; i < std::size(kNames); ++i) {
    if (strcasecmp(proto, kNames[i]) == 0) return static_cast<std::int8_t>(i);
  }
  return -1;
}

std::uint32_t datatypeBytes(const char* datatype) noexcept {
  if (datatype == nullptr || !startsWith(datatype, "nccl")) return 0;
  const char* t = datatype + 4;
  if (startsWith(t, "Float8") || startsWith(t, "Fp8")) return 1;  // ncclFloat8e4m3, ncclFloat8e5m2
  if (std::strcmp(t, "Char") == 0) return 1;
  if (std::strcmp(t, "Half") == 0 || std::strcmp(t, "Bfloat16") == 0) return 2;
  if (std::strcmp(t, "Float") == 0 || std::strcmp(t, "Int") == 0) return 4;
  if (std::strcmp(t, "Double") == 0) return 8;
  // ncclInt8, ncclUint8, ncclInt32, ncclFloat16, ncclFloat64, ...: the trailing bit count.
  const std::size_t len = std::strlen(t);
  std::size_t digits = 0;
  while (digits < len && t[len - 1 - digits] >= '0' && t[len - 1 - digits] <= '9') ++digits;
  if (digits == 0 || digits > 2) return 0;
  unsigned bits = 0;
  for (std::size_t i = len - digits; i < len; ++i) bits = bits * 10 + static_cast<unsigned>(t[i] - '0');
  switch (bits) {
    case 8:
      return 1;
    case 16:
      return 2;
    case 32:
      return 4;
    case 64:
      return 8;
    default:
      return 0;
  }
}

std::uint64_t ncclTestsBytes(core::Collective coll, std::uint64_t count, std::uint32_t typeBytes,
                             std::uint32_t nRanks) noexcept {
  const std::uint64_t bytes = count * typeBytes;
  switch (coll) {
    case core::Collective::AllGather:
    case core::Collective::ReduceScatter:
    case core::Collective::AllToAll:
      return bytes * nRanks;
    default:
      return bytes;
  }
}

}  // namespace optiflow::profiler
