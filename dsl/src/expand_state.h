// The expander's model of the data: what every rank holds of every chunk. A value is a set of contributing ranks,
// interned (hash-consed) so the state stores one 32-bit id per (rank, chunk) and equal values compare by id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace optiflow::dsl::detail {

// [lo, hi) of ranks.
struct Interval {
  int lo = 0;
  int hi = 0;
};

// Sets of ranks as sorted, disjoint, non-adjacent interval lists. Id 0 is the empty set, id r + 1 the singleton
// {r}; every other set gets the next id the first time it is built.
class ValueTable {
 public:
  static constexpr std::uint32_t kEmpty = 0;
  // The state keeps a flag in bit 31 of an id.
  static constexpr std::size_t kMaxValues = (std::size_t{1} << 31) - 1;

  explicit ValueTable(int nRanks);

  std::uint32_t singleton(int rank) const { return static_cast<std::uint32_t>(rank) + 1; }
  std::uint32_t full() const { return full_; }
  std::span<const Interval> intervals(std::uint32_t id) const {
    return {ivs_.data() + start_[id], ivs_.data() + start_[id + 1]};
  }
  std::size_t size() const { return start_.size() - 1; }

  // a + b when they share no rank; otherwise nullopt, and *overlap is the smallest shared rank.
  std::optional<std::uint32_t> unite(std::uint32_t a, std::uint32_t b, int* overlap);
  // Up to `limit` ranks of [0, nRanks) missing from `id`, ascending, and how many are missing in all.
  std::vector<int> missing(std::uint32_t id, std::size_t limit, std::int64_t* count) const;

 private:
  std::uint32_t intern(std::span<const Interval> ivs);
  static std::uint32_t hash(std::span<const Interval> ivs);
  void grow();

  int nRanks_;
  std::vector<Interval> ivs_;
  std::vector<std::size_t> start_;  // value id k spans ivs_[start_[k], start_[k + 1])
  // Open addressing over the sets that are neither empty nor singletons: (hash << 32) | id, 0 = free. The stored
  // hash spares reading the intervals of every set a probe passes.
  std::vector<std::uint64_t> slots_;
  std::size_t used_ = 0;
  std::vector<Interval> scratch_;
  std::uint32_t full_ = 0;
};

// Value ids per (rank, chunk). Dense (one word per pair) when that fits comfortably, else one hash map per rank
// (alltoall on many ranks has ranks^3 pairs but only ranks^2 non-empty ones). Either way each rank keeps the
// list of chunks it holds, so group operations visit what members hold instead of every chunk.
class StateStore {
 public:
  static constexpr std::size_t kDenseLimit = std::size_t{1} << 26;

  void init(int nRanks, int nChunks);
  bool dense() const { return dense_; }

  std::uint32_t get(int rank, int chunk) const {
    if (dense_) return vals_[index(rank, chunk)] & kValueMask;
    return maps_[rank].get(chunk);
  }
  void set(int rank, int chunk, std::uint32_t value);

  // f(chunk, value) for every chunk `rank` holds (value non-empty). f must not change the state.
  template <typename F>
  void forEachHeld(int rank, F&& f) {
    if (dense_) {
      std::vector<int>& list = held_[rank];
      std::size_t w = 0;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const int c = list[i];
        std::uint32_t& slot = vals_[index(rank, c)];
        const std::uint32_t v = slot & kValueMask;
        if (v == 0) {  // dropped since it was listed: forget it here, set() lists it again if it comes back
          slot = 0;
          continue;
        }
        list[w++] = c;
        f(c, v);
      }
      list.resize(w);
      return;
    }
    for (const FlatMap::Slot& slot : maps_[rank].slots) {
      if (slot.key >= 0 && slot.value != 0) f(slot.key, slot.value);
    }
  }

 private:
  static constexpr std::uint32_t kListed = 0x80000000u;
  static constexpr std::uint32_t kValueMask = 0x7fffffffu;

  // chunk -> value with linear probing; entries are never removed (a dropped value is stored as 0).
  struct FlatMap {
    struct Slot {
      int key = -1;  // -1 = free
      std::uint32_t value = 0;
    };
    std::vector<Slot> slots;  // key and value side by side: one cache miss per lookup
    std::size_t used = 0;
    std::uint32_t get(int chunk) const;
    void put(int chunk, std::uint32_t value);
    void clear(int chunk);  // stores 0 where the chunk has an entry
  };

  std::size_t index(int rank, int chunk) const {
    return static_cast<std::size_t>(rank) * static_cast<std::size_t>(nChunks_) + static_cast<std::size_t>(chunk);
  }

  bool dense_ = true;
  int nChunks_ = 0;
  std::vector<std::uint32_t> vals_;     // dense: value | kListed when the chunk is in held_[rank]
  std::vector<std::vector<int>> held_;  // dense
  std::vector<FlatMap> maps_;           // sparse
};

}  // namespace optiflow::dsl::detail
