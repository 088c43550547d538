#include "optiflow/schedcache/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <vector>

#include <boost/crc.hpp>

#include "entry.h"

namespace optiflow::schedcache {
namespace {

using Crc64Xz = boost::crc_optimal<64, 0x42F0E1EBA9EA3693ULL, ~0ULL, ~0ULL, true, true>;

// layout.h's kNumCollectives counts the ncclFunc_t values the vocabulary maps.
static_assert(core::collectiveFromNcclFunc(static_cast<int>(kNumCollectives) - 1) &&
              !core::collectiveFromNcclFunc(static_cast<int>(kNumCollectives)));

// The hashed fields of one item, in hash order.
struct HashFields {
  std::uint8_t coll;
  std::uint32_t nRanks;
  std::uint32_t nNodes;
  std::uint64_t minBytes;
  std::uint64_t maxBytes;
  std::int8_t algorithm;
  std::int8_t protocol;
  std::int32_t nChannels;
  std::uint64_t chunkBytes;
  std::uint64_t scheduleId;
  std::uint32_t trialCalls;
  std::vector<TrialEntry> trials;

  auto key() const {
    return std::tie(coll, nRanks, nNodes, minBytes, maxBytes, algorithm, protocol, nChannels, chunkBytes, scheduleId,
                    trialCalls);
  }
};

// Little-endian regardless of the host, so the hash is a property of the decisions alone.
template <typename T>
void putLe(std::vector<unsigned char>& out, T value) {
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(U); ++i) {
    out.push_back(static_cast<unsigned char>(u & 0xffu));
    if constexpr (sizeof(U) > 1) u = static_cast<U>(u >> 8);
  }
}

std::string describe(const PlanItem& it, std::size_t index) {
  char buf[200];
  // A value static_cast past the last enumerator (Custom) has no name.
  const auto c = static_cast<unsigned>(it.coll);
  std::string coll = c <= static_cast<unsigned>(core::Collective::Custom) ? std::string(core::toString(it.coll))
                                                                          : "collective " + std::to_string(c);
  std::snprintf(buf, sizeof(buf), "item %zu (%s, %u ranks, %u nodes, %llu-%llu bytes)", index, coll.c_str(), it.nRanks,
                it.nNodes, static_cast<unsigned long long>(it.minBytes), static_cast<unsigned long long>(it.maxBytes));
  return buf;
}

}  // namespace

namespace detail {

TrialEntry toTrialEntry(const TrialCandidate& c) {
  TrialEntry t{};
  t.algorithm = static_cast<std::int8_t>(c.algorithm ? core::ncclIndex(*c.algorithm) : -1);
  t.protocol = static_cast<std::int8_t>(c.protocol ? core::ncclIndex(*c.protocol) : -1);
  t.nChannels = c.nChannels;
  t.chunkBytes = c.chunkBytes;
  return t;
}

TrialCandidate fromTrialEntry(const TrialEntry& t) {
  TrialCandidate c;
  c.algorithm = core::algorithmFromNccl(t.algorithm);
  c.protocol = core::protocolFromNccl(t.protocol);
  c.nChannels = t.nChannels;
  c.chunkBytes = t.chunkBytes;
  return c;
}

PlanEntry toEntry(const PlanItem& item) {
  PlanEntry e{};
  e.minBytes = item.minBytes;
  e.maxBytes = item.maxBytes;
  e.chunkBytes = item.chunkBytes;
  e.scheduleId = item.scheduleId;
  e.nRanks = item.nRanks;
  e.nNodes = item.nNodes;
  e.nativeUs = item.nativeUs;
  e.bestUs = item.bestUs;
  e.boundUs = item.boundUs;
  e.ncclUs = item.ncclUs;
  e.jsonPath = kNoString;
  e.xmlPath = kNoString;
  e.coll = static_cast<std::uint8_t>(core::ncclFuncIndex(item.coll).value_or(0xff));
  e.algorithm = static_cast<std::int8_t>(item.algorithm ? core::ncclIndex(*item.algorithm) : -1);
  e.protocol = static_cast<std::int8_t>(item.protocol ? core::ncclIndex(*item.protocol) : -1);
  e.nChannels = item.nChannels;
  e.flags = item.measured ? kEntryMeasured : 0;
  return e;
}

PlanItem fromEntry(const PlanEntry& e) {
  PlanItem it;
  // checkSlotContent let only ncclFunc_t indices through; Custom (never decided) would not match a call anyway.
  it.coll = core::collectiveFromNcclFunc(e.coll).value_or(core::Collective::Custom);
  it.nRanks = e.nRanks;
  it.nNodes = e.nNodes;
  it.minBytes = e.minBytes;
  it.maxBytes = e.maxBytes;
  it.algorithm = core::algorithmFromNccl(e.algorithm);
  it.protocol = core::protocolFromNccl(e.protocol);
  it.nChannels = e.nChannels;
  it.chunkBytes = e.chunkBytes;
  it.nativeUs = e.nativeUs;
  it.bestUs = e.bestUs;
  it.boundUs = e.boundUs;
  it.ncclUs = e.ncclUs;
  it.measured = (e.flags & kEntryMeasured) != 0;
  it.scheduleId = e.scheduleId;
  return it;
}

}  // namespace detail

std::uint64_t contentHash(const Plan& plan) {
  std::vector<HashFields> fields;
  fields.reserve(plan.items.size());
  for (const PlanItem& it : plan.items) {
    // The hash is over the indices the segment stores (NCCL's), not over the vocabulary's enumerator values.
    const PlanEntry e = detail::toEntry(it);
    HashFields f{e.coll,
                 e.nRanks,
                 e.nNodes,
                 e.minBytes,
                 e.maxBytes,
                 e.algorithm,
                 e.protocol,
                 e.nChannels,
                 e.chunkBytes,
                 e.scheduleId,
                 it.trials.empty() ? 0u : it.trialCalls,
                 {}};
    for (const TrialCandidate& c : it.trials) f.trials.push_back(detail::toTrialEntry(c));
    fields.push_back(std::move(f));
  }
  // Sorting on every hashed field makes the order of items irrelevant, even for duplicates.
  auto trialKey = [](const TrialEntry& t) { return std::tie(t.algorithm, t.protocol, t.nChannels, t.chunkBytes); };
  std::sort(fields.begin(), fields.end(), [&](const HashFields& a, const HashFields& b) {
    if (a.key() != b.key()) return a.key() < b.key();
    return std::lexicographical_compare(
        a.trials.begin(), a.trials.end(), b.trials.begin(), b.trials.end(),
        [&](const TrialEntry& x, const TrialEntry& y) { return trialKey(x) < trialKey(y); });
  });
  constexpr std::size_t kRecordBytes = 1 + 4 + 4 + 8 + 8 + 1 + 1 + 4 + 8 + 8;
  std::vector<unsigned char> bytes;
  bytes.reserve(fields.size() * kRecordBytes);
  for (const HashFields& f : fields) {
    putLe(bytes, f.coll);
    putLe(bytes, f.nRanks);
    putLe(bytes, f.nNodes);
    putLe(bytes, f.minBytes);
    putLe(bytes, f.maxBytes);
    putLe(bytes, f.algorithm);
    putLe(bytes, f.protocol);
    putLe(bytes, f.nChannels);
    putLe(bytes, f.chunkBytes);
    putLe(bytes, f.scheduleId);
    // A plan without trials hashes as it did before trials existed.
    if (f.trials.empty()) continue;
    putLe(bytes, static_cast<std::uint8_t>(0x54));  // 'T': trials follow
    putLe(bytes, f.trialCalls);
    putLe(bytes, static_cast<std::uint32_t>(f.trials.size()));
    for (const TrialEntry& t : f.trials) {
      putLe(bytes, t.algorithm);
      putLe(bytes, t.protocol);
      putLe(bytes, t.nChannels);
      putLe(bytes, t.chunkBytes);
    }
  }
  Crc64Xz crc;
  crc.process_bytes(bytes.data(), bytes.size());
  std::uint64_t h = crc.checksum();
  // 0 and 1 are reserved in CommPin::planHash.
  if (h == kPinPending || h == kPinNoPlan) h += 2;
  return h;
}

std::string formatHash(std::uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::optional<std::uint64_t> parseHash(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<unsigned>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
    v = (v << 4) | d;
  }
  return v;
}

std::string validatePlan(const Plan& plan) {
  const auto& items = plan.items;
  if (items.size() > kMaxEntries) {
    return std::to_string(items.size()) + " items; a plan slot holds at most " + std::to_string(kMaxEntries);
  }
  std::unordered_set<std::string_view> paths;
  std::size_t pathBytes = 0;
  std::size_t trialCount = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const PlanItem& it = items[i];
    // The underlying integers: a value static_cast past the last enumerator must not reach the segment.
    const int a = it.algorithm ? static_cast<int>(*it.algorithm) : -1;
    const int p = it.protocol ? static_cast<int>(*it.protocol) : -1;
    if (!core::ncclFuncIndex(it.coll)) {
      return describe(it, i) +
             ": not a collective NCCL's tuner decides (broadcast, reduce, allgather, reducescatter, allreduce)";
    }
    if (a >= core::kNumAlgorithms) return describe(it, i) + ": algorithm " + std::to_string(a) + " out of range";
    if (p >= core::kNumProtocols) return describe(it, i) + ": protocol " + std::to_string(p) + " out of range";
    if (!it.algorithm && it.protocol) {
      return describe(it, i) + ": protocol " + std::string(core::toString(*it.protocol)) + " without an algorithm";
    }
    if (!it.algorithm && (it.nChannels != 0 || it.chunkBytes != 0)) {
      return describe(it, i) + ": a channel count or chunk size without an algorithm";
    }
    if (it.nChannels < 0) return describe(it, i) + ": negative channel count " + std::to_string(it.nChannels);
    if (it.minBytes > it.maxBytes) return describe(it, i) + ": minBytes is greater than maxBytes";
    if (it.nRanks == 0) return describe(it, i) + ": zero ranks";
    if (it.nNodes == 0) return describe(it, i) + ": zero nodes";
    if (!it.trials.empty()) {
      if (it.trials.size() > kMaxTrialsPerEntry) {
        return describe(it, i) + ": " + std::to_string(it.trials.size()) + " trial candidates; at most " +
               std::to_string(kMaxTrialsPerEntry);
      }
      if (it.trialCalls == 0 || it.trialCalls > kMaxTrialCalls) {
        return describe(it, i) + ": " + std::to_string(it.trialCalls) + " calls per trial candidate; expected 1 to " +
               std::to_string(kMaxTrialCalls);
      }
      trialCount += it.trials.size();
      bool ncclOwn = false;
      for (std::size_t c = 0; c < it.trials.size(); ++c) {
        const TrialCandidate& t = it.trials[c];
        const int ta = t.algorithm ? static_cast<int>(*t.algorithm) : -1;
        const int tp = t.protocol ? static_cast<int>(*t.protocol) : -1;
        const std::string which = describe(it, i) + ": trial candidate " + std::to_string(c);
        if (ta >= core::kNumAlgorithms || tp >= core::kNumProtocols) return which + ": out of range";
        if (!t.algorithm && (t.protocol || t.nChannels != 0 || t.chunkBytes != 0)) {
          return which + ": NCCL's own choice with a protocol, channel count or chunk size";
        }
        if (t.nChannels < 0) return which + ": negative channel count";
        if (!t.algorithm) ncclOwn = true;
        for (std::size_t d = 0; d < c; ++d) {
          if (it.trials[d] == t) return which + ": the same as candidate " + std::to_string(d);
        }
      }
      if (!ncclOwn) return describe(it, i) + ": trials without NCCL's own choice among the candidates";
    }
    for (const std::string* path : {&it.jsonPath, &it.xmlPath}) {
      if (path->empty()) continue;
      if (path->find('\0') != std::string::npos) return describe(it, i) + ": path contains a NUL byte";
      // The writer stores each distinct path once.
      if (paths.insert(*path).second) pathBytes += path->size() + 1;
    }
  }
  if (trialCount > kMaxTrials) {
    return std::to_string(trialCount) + " trial candidates; a plan slot holds at most " + std::to_string(kMaxTrials);
  }
  if (pathBytes > kStringBytes) {
    return "schedule paths take " + std::to_string(pathBytes) + " bytes; a plan slot holds at most " +
           std::to_string(kStringBytes);
  }
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const PlanItem& x = items[a];
    const PlanItem& y = items[b];
    return std::tie(x.coll, x.nRanks, x.nNodes, x.minBytes, a) < std::tie(y.coll, y.nRanks, y.nNodes, y.minBytes, b);
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const PlanItem& prev = items[order[k - 1]];
    const PlanItem& cur = items[order[k]];
    if (prev.coll == cur.coll && prev.nRanks == cur.nRanks && prev.nNodes == cur.nNodes &&
        cur.minBytes <= prev.maxBytes) {
      // Name the later item first, as a reader of the plan file sees them.
      std::size_t a = order[k], b = order[k - 1];
      if (a < b) std::swap(a, b);
      return describe(items[a], a) + ": overlaps " + describe(items[b], b);
    }
  }
  return {};
}

}  // namespace optiflow::schedcache
