// The MeasureRegion of the segment: the profiler's records (claimed by CAS, added to with relaxed atomics) and their
// process-side form with quantiles read from the sketch; the tuner's records of NCCL's own choices.
#include "optiflow/schedcache/measure.h"

#include <atomic>
#include <cmath>
#include <memory>

#include "optiflow/schedcache/reader.h"

namespace optiflow::schedcache {
namespace {

template <typename T>
std::atomic_ref<T> ref(T& v) {
  return std::atomic_ref<T>(v);
}

}  // namespace

double sketchMidpointNs(std::uint32_t bucket) {
  if (bucket >= kSketchBuckets) bucket = kSketchBuckets - 1;
  const std::uint32_t octave = bucket / kSketchSubBuckets;
  const std::uint32_t sub = bucket % kSketchSubBuckets;
  const double base = std::ldexp(1.0, static_cast<int>(kSketchMinLog2 + octave));
  const double width = base / kSketchSubBuckets;
  return base + width * (sub + 0.5);
}

double sketchQuantileNs(const std::uint32_t* sketch, double q) {
  std::uint64_t total = 0;
  for (std::uint32_t b = 0; b < kSketchBuckets; ++b) total += sketch[b];
  if (total == 0) return 0;
  if (q <= 0) q = 1e-12;
  if (q > 1) q = 1;
  const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::uint32_t b = 0; b < kSketchBuckets; ++b) {
    seen += sketch[b];
    if (seen >= rank && sketch[b] != 0) return sketchMidpointNs(b);
  }
  return sketchMidpointNs(kSketchBuckets - 1);
}

std::optional<Measurement> toMeasurement(const MeasureRecord& copy) {
  if (copy.key == 0 || copy.ready == 0 || copy.calls == 0) return std::nullopt;
  if (copy.coll > static_cast<std::uint8_t>(core::Collective::AllToAll)) return std::nullopt;
  Measurement m;
  m.commId = copy.commId;
  m.coll = static_cast<core::Collective>(copy.coll);
  m.sizeBytes = copy.sizeBytes;
  m.algorithm = core::algorithmFromNccl(copy.algorithm);
  m.protocol = core::protocolFromNccl(copy.protocol);
  m.channels = copy.channels;
  m.calls = copy.calls;
  m.minUs = static_cast<double>(copy.minNs) / 1000.0;
  m.meanUs = static_cast<double>(copy.sumNs) / static_cast<double>(copy.calls) / 1000.0;
  m.medianUs = sketchQuantileNs(copy.sketch, 0.5) / 1000.0;
  m.p90Us = sketchQuantileNs(copy.sketch, 0.9) / 1000.0;
  m.lastNs = copy.lastNs;
  return m;
}

namespace {

// Open addressing with linear probing from key % capacity, over at most maxProbes slots: the record whose key is
// `key`, claimed by CAS on a free one (then fill(record) writes its fields and sets ready); nullptr when none of
// those slots is free or ours. Records are never freed, so a slot's key, once seen, stays.
template <typename Record, typename Fill>
Record* findOrClaim(Record* table, std::uint32_t capacity, std::uint32_t maxProbes, std::uint64_t key,
                    Fill&& fill) noexcept {
  const std::size_t start = static_cast<std::size_t>(key % capacity);
  for (std::size_t probe = 0; probe < maxProbes; ++probe) {
    Record& rec = table[(start + probe) % capacity];
    std::uint64_t found = ref(rec.key).load(std::memory_order_acquire);
    if (found == 0) {
      if (ref(rec.key).compare_exchange_strong(found, key, std::memory_order_acq_rel)) {
        fill(rec);
        return &rec;
      }
      // Lost the race: `found` is the winner's key, maybe ours.
    }
    // A 64-bit hash of every field names the record; two keys sharing one would pool their calls.
    if (found == key) return &rec;
  }
  return nullptr;
}

}  // namespace

MeasureRecord* Reader::measureRecord(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes,
                                     std::int8_t algorithm, std::int8_t protocol, std::uint32_t channels) noexcept {
  const std::uint64_t key = measureKey(commId, coll, sizeBytes, algorithm, protocol, channels);
  return findOrClaim(segment_->measure.records, kMeasureRecords, kMeasureRecords, key, [&](MeasureRecord& rec) {
    ref(rec.commId).store(commId, std::memory_order_relaxed);
    ref(rec.sizeBytes).store(sizeBytes, std::memory_order_relaxed);
    ref(rec.coll).store(coll, std::memory_order_relaxed);
    ref(rec.algorithm).store(algorithm, std::memory_order_relaxed);
    ref(rec.protocol).store(protocol, std::memory_order_relaxed);
    ref(rec.channels).store(channels, std::memory_order_relaxed);
    ref(rec.ready).store(1, std::memory_order_release);
  });
}

void Reader::recordChoice(std::uint64_t commId, std::uint8_t coll, std::uint64_t sizeBytes, std::int8_t algorithm,
                          std::int8_t protocol) noexcept {
  const std::uint64_t key = choiceKey(commId, coll, sizeBytes);
  bool claimed = false;
  ChoiceRecord* rec = findOrClaim(segment_->measure.choices, kChoiceRecords, kChoiceProbes, key, [&](ChoiceRecord& r) {
    ref(r.commId).store(commId, std::memory_order_relaxed);
    ref(r.sizeBytes).store(sizeBytes, std::memory_order_relaxed);
    ref(r.coll).store(coll, std::memory_order_relaxed);
    ref(r.algorithm).store(algorithm, std::memory_order_relaxed);
    ref(r.protocol).store(protocol, std::memory_order_relaxed);
    ref(r.ready).store(1, std::memory_order_release);
    claimed = true;
  });
  if (rec == nullptr) {
    choicesDropped_.store(choicesDropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return;
  }
  if (!claimed) {
    // NCCL's choice for one size rarely changes; a store only when it does keeps the line clean for the others.
    if (ref(rec->algorithm).load(std::memory_order_relaxed) != algorithm) {
      ref(rec->algorithm).store(algorithm, std::memory_order_relaxed);
    }
    if (ref(rec->protocol).load(std::memory_order_relaxed) != protocol) {
      ref(rec->protocol).store(protocol, std::memory_order_relaxed);
    }
  }
  if (ref(rec->calls).load(std::memory_order_relaxed) < kChoiceCallsCounted) {
    ref(rec->calls).fetch_add(1, std::memory_order_relaxed);
  }
}

std::vector<NcclChoice> Reader::ncclChoices() const {
  std::vector<NcclChoice> out;
  for (std::uint32_t r = 0; r < kChoiceRecords; ++r) {
    ChoiceRecord& rec = segment_->measure.choices[r];
    if (ref(rec.key).load(std::memory_order_acquire) == 0) continue;
    if (ref(rec.ready).load(std::memory_order_acquire) == 0) continue;
    const std::uint8_t coll = ref(rec.coll).load(std::memory_order_relaxed);
    if (coll > static_cast<std::uint8_t>(core::Collective::AllToAll)) continue;
    NcclChoice c;
    c.commId = ref(rec.commId).load(std::memory_order_relaxed);
    c.coll = static_cast<core::Collective>(coll);
    c.sizeBytes = ref(rec.sizeBytes).load(std::memory_order_relaxed);
    c.algorithm = core::algorithmFromNccl(ref(rec.algorithm).load(std::memory_order_relaxed));
    c.protocol = core::protocolFromNccl(ref(rec.protocol).load(std::memory_order_relaxed));
    c.calls = ref(rec.calls).load(std::memory_order_relaxed);
    out.push_back(c);
  }
  return out;
}

void Reader::addMeasurement(MeasureRecord* record, std::uint64_t ns, std::int64_t stopNs) noexcept {
  if (record == nullptr) return;
  ref(record->calls).fetch_add(1, std::memory_order_relaxed);
  ref(record->sumNs).fetch_add(ns, std::memory_order_relaxed);
  ref(record->sketch[sketchBucket(ns)]).fetch_add(1, std::memory_order_relaxed);
  auto min = ref(record->minNs);
  std::uint64_t current = min.load(std::memory_order_relaxed);
  while ((current == 0 || ns < current) && !min.compare_exchange_weak(current, ns, std::memory_order_relaxed)) {
  }
  auto last = ref(record->lastNs);
  std::int64_t seen = last.load(std::memory_order_relaxed);
  while (stopNs > seen && !last.compare_exchange_weak(seen, stopNs, std::memory_order_relaxed)) {
  }
}

void Reader::addMeasureCounters(const MeasureCounters& delta) noexcept {
  MeasureCounters& c = segment_->measure.counters;
  if (delta.untimed != 0) ref(c.untimed).fetch_add(delta.untimed, std::memory_order_relaxed);
  if (delta.poolFull != 0) ref(c.poolFull).fetch_add(delta.poolFull, std::memory_order_relaxed);
  if (delta.tableFull != 0) ref(c.tableFull).fetch_add(delta.tableFull, std::memory_order_relaxed);
  if (delta.foreign != 0) ref(c.foreign).fetch_add(delta.foreign, std::memory_order_relaxed);
  if (delta.choiceFull != 0) ref(c.choiceFull).fetch_add(delta.choiceFull, std::memory_order_relaxed);
}

MeasureCounters Reader::measureCounters() const noexcept {
  MeasureCounters& c = segment_->measure.counters;
  MeasureCounters out{};
  out.untimed = ref(c.untimed).load(std::memory_order_relaxed);
  out.poolFull = ref(c.poolFull).load(std::memory_order_relaxed);
  out.tableFull = ref(c.tableFull).load(std::memory_order_relaxed);
  out.foreign = ref(c.foreign).load(std::memory_order_relaxed);
  out.choiceFull = ref(c.choiceFull).load(std::memory_order_relaxed);
  return out;
}

std::vector<Measurement> Reader::measurements() const {
  std::vector<Measurement> out;
  auto copy = std::make_unique<MeasureRecord>();
  for (std::uint32_t r = 0; r < kMeasureRecords; ++r) {
    MeasureRecord& rec = segment_->measure.records[r];
    copy->key = ref(rec.key).load(std::memory_order_acquire);
    if (copy->key == 0) continue;
    copy->ready = ref(rec.ready).load(std::memory_order_acquire);
    if (copy->ready == 0) continue;
    copy->commId = ref(rec.commId).load(std::memory_order_relaxed);
    copy->sizeBytes = ref(rec.sizeBytes).load(std::memory_order_relaxed);
    copy->coll = ref(rec.coll).load(std::memory_order_relaxed);
    copy->algorithm = ref(rec.algorithm).load(std::memory_order_relaxed);
    copy->protocol = ref(rec.protocol).load(std::memory_order_relaxed);
    copy->channels = ref(rec.channels).load(std::memory_order_relaxed);
    copy->calls = ref(rec.calls).load(std::memory_order_relaxed);
    copy->minNs = ref(rec.minNs).load(std::memory_order_relaxed);
    copy->sumNs = ref(rec.sumNs).load(std::memory_order_relaxed);
    copy->lastNs = ref(rec.lastNs).load(std::memory_order_relaxed);
    for (std::uint32_t b = 0; b < kSketchBuckets; ++b)
      copy->sketch[b] = ref(rec.sketch[b]).load(std::memory_order_relaxed);
    if (auto m = toMeasurement(*copy)) out.push_back(*m);
  }
  return out;
}

}  // namespace optiflow::schedcache
