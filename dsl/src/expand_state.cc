#include "expand_state.h"

#include <algorithm>

namespace optiflow::dsl::detail {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

ValueTable::ValueTable(int nRanks) : nRanks_(nRanks) {
  // Ids 1..n are the singletons, stored in rank order so singleton(r) needs no lookup.
  ivs_.reserve(static_cast<std::size_t>(nRanks) + 16);
  start_.reserve(static_cast<std::size_t>(nRanks) + 16);
  start_.push_back(0);
  start_.push_back(0);
  for (int r = 0; r < nRanks; ++r) {
    ivs_.push_back({r, r + 1});
    start_.push_back(ivs_.size());
  }
  slots_.assign(1024, 0);
  const Interval all{0, nRanks};
  full_ = nRanks > 0 ? intern(std::span<const Interval>(&all, 1)) : kEmpty;
}

std::uint32_t ValueTable::hash(std::span<const Interval> ivs) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ ivs.size();
  for (const Interval& iv : ivs) {
    h = mix(h ^ ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(iv.lo)) << 32) |
                 static_cast<std::uint32_t>(iv.hi)));
  }
  return static_cast<std::uint32_t>(h);
}

void ValueTable::grow() {
  std::vector<std::uint64_t> old = std::move(slots_);
  slots_.assign(old.size() * 2, 0);
  const std::size_t mask = slots_.size() - 1;
  for (std::uint64_t slot : old) {
    if (slot == 0) continue;
    std::size_t i = (slot >> 32) & mask;
    while (slots_[i] != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

std::uint32_t ValueTable::intern(std::span<const Interval> ivs) {
  if (ivs.empty()) return kEmpty;
  if (ivs.size() == 1 && ivs[0].hi == ivs[0].lo + 1) return singleton(ivs[0].lo);
  if ((used_ + 1) * 2 > slots_.size()) grow();
  const std::size_t mask = slots_.size() - 1;
  const std::uint32_t h = hash(ivs);
  std::size_t i = h & mask;
  while (slots_[i] != 0) {
    if ((slots_[i] >> 32) == h) {
      const auto id = static_cast<std::uint32_t>(slots_[i]);
      const std::span<const Interval> have = intervals(id);
      if (have.size() == ivs.size() &&
          std::equal(have.begin(), have.end(), ivs.begin(),
                     [](const Interval& a, const Interval& b) { return a.lo == b.lo && a.hi == b.hi; })) {
        return id;
      }
    }
    i = (i + 1) & mask;
  }
  const auto id = static_cast<std::uint32_t>(start_.size() - 1);
  ivs_.insert(ivs_.end(), ivs.begin(), ivs.end());
  start_.push_back(ivs_.size());
  slots_[i] = (static_cast<std::uint64_t>(h) << 32) | id;
  ++used_;
  return id;
}

std::optional<std::uint32_t> ValueTable::unite(std::uint32_t a, std::uint32_t b, int* overlap) {
  if (a == kEmpty) return b;
  if (b == kEmpty) return a;
  const std::span<const Interval> x = intervals(a);
  const std::span<const Interval> y = intervals(b);
  scratch_.clear();
  std::size_t i = 0;
  std::size_t j = 0;
  auto push = [&](const Interval& iv) {
    if (!scratch_.empty() && scratch_.back().hi == iv.lo) {
      scratch_.back().hi = iv.hi;  // adjacent: keep the list canonical
    } else {
      scratch_.push_back(iv);
    }
  };
  while (i < x.size() || j < y.size()) {
    const bool takeX = j == y.size() || (i < x.size() && x[i].lo < y[j].lo);
    const Interval iv = takeX ? x[i++] : y[j++];
    if (!scratch_.empty() && iv.lo < scratch_.back().hi) {
      if (overlap != nullptr) *overlap = iv.lo;
      return std::nullopt;
    }
    push(iv);
  }
  return intern(scratch_);
}

std::vector<int> ValueTable::missing(std::uint32_t id, std::size_t limit, std::int64_t* count) const {
  std::vector<int> out;
  std::int64_t n = 0;
  int next = 0;
  auto gap = [&](int lo, int hi) {
    n += hi - lo;
    for (int r = lo; r < hi && out.size() < limit; ++r) out.push_back(r);
  };
  for (const Interval& iv : intervals(id)) {
    gap(next, iv.lo);
    next = iv.hi;
  }
  gap(next, nRanks_);
  if (count != nullptr) *count = n;
  return out;
}

std::uint32_t StateStore::FlatMap::get(int chunk) const {
  if (slots.empty()) return 0;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = mix(static_cast<std::uint64_t>(chunk)) & mask; slots[i].key >= 0; i = (i + 1) & mask) {
    if (slots[i].key == chunk) return slots[i].value;
  }
  return 0;
}

void StateStore::FlatMap::put(int chunk, std::uint32_t value) {
  if ((used + 1) * 10 > slots.size() * 7) {
    std::vector<Slot> old = std::move(slots);
    slots.assign(std::max<std::size_t>(16, old.size() * 2), Slot{});
    const std::size_t mask = slots.size() - 1;
    for (const Slot& s : old) {
      if (s.key < 0) continue;
      std::size_t i = mix(static_cast<std::uint64_t>(s.key)) & mask;
      while (slots[i].key >= 0) i = (i + 1) & mask;
      slots[i] = s;
    }
  }
  const std::size_t mask = slots.size() - 1;
  std::size_t i = mix(static_cast<std::uint64_t>(chunk)) & mask;
  for (; slots[i].key >= 0; i = (i + 1) & mask) {
    if (slots[i].key == chunk) {
      slots[i].value = value;
      return;
    }
  }
  slots[i] = Slot{chunk, value};
  ++used;
}

void StateStore::FlatMap::clear(int chunk) {
  if (slots.empty()) return;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = mix(static_cast<std::uint64_t>(chunk)) & mask; slots[i].key >= 0; i = (i + 1) & mask) {
    if (slots[i].key == chunk) {
      slots[i].value = 0;
      return;
    }
  }
}

void StateStore::init(int nRanks, int nChunks) {
  nChunks_ = nChunks;
  dense_ = static_cast<std::size_t>(nRanks) * static_cast<std::size_t>(nChunks) <= kDenseLimit;
  if (dense_) {
    vals_.assign(static_cast<std::size_t>(nRanks) * static_cast<std::size_t>(nChunks), 0);
    held_.assign(static_cast<std::size_t>(nRanks), {});
  } else {
    maps_.assign(static_cast<std::size_t>(nRanks), {});
  }
}

void StateStore::set(int rank, int chunk, std::uint32_t value) {
  if (!dense_) {
    if (value == 0) {
      maps_[rank].clear(chunk);
    } else {
      maps_[rank].put(chunk, value);
    }
    return;
  }
  std::uint32_t& slot = vals_[index(rank, chunk)];
  if (value != 0 && (slot & kListed) == 0) {
    held_[rank].push_back(chunk);
    slot = value | kListed;
    return;
  }
  slot = (slot & kListed) | value;
}

}  // namespace optiflow::dsl::detail
