// LimitBounds (scheduler_internal.h): lower bounds on the executor's limits from the intent alone, before a build.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "scheduler_internal.h"

namespace optiflow::compiler::detail {

LimitBounds::LimitBounds(const IntentProgram& in, int slices) : n_(in.nRanks), parts_(in.parts), slices_(slices) {
  // The hops (a relayed transfer has two) per (rank, direction): the peer and the program chunk.
  begin_.assign(2 * static_cast<std::size_t>(n_) + 1, 0);
  auto forHops = [&](auto&& fn) {
    for (const core::Transfer& t : in.transfers) {
      fn(t.src, t.via >= 0 ? t.via : t.dst, t.chunk);
      if (t.via >= 0) fn(t.via, t.dst, t.chunk);
    }
  };
  forHops([&](int a, int b, int) {
    ++begin_[2 * static_cast<std::size_t>(a) + 1];
    ++begin_[2 * static_cast<std::size_t>(b) + 2];
  });
  for (std::size_t k = 1; k < begin_.size(); ++k) begin_[k] += begin_[k - 1];
  legs_.resize(begin_.back());
  std::vector<std::size_t> at(begin_.begin(), begin_.end() - 1);
  forHops([&](int a, int b, int chunk) {
    legs_[at[2 * static_cast<std::size_t>(a)]++] = {b, chunk};
    legs_[at[2 * static_cast<std::size_t>(b) + 1]++] = {a, chunk};
  });
}

LimitBounds::Blocks LimitBounds::blocks(int channels) {
  Blocks out;
  std::vector<int> perChannel(static_cast<std::size_t>(channels));
  counts_.assign(static_cast<std::size_t>(n_) * static_cast<std::size_t>(channels), 0);
  for (std::size_t k = 0; k + 1 < begin_.size(); ++k) {
    std::fill(perChannel.begin(), perChannel.end(), 0);
    int distinct = 0;
    for (const Leg& l : bucket(k)) {
      for (int j = 0; j < slices_; ++j) {
        const int c = channelOf(l.chunk, j, slices_, channels, parts_);
        if (std::exchange(count(l.peer, c, channels), 1) == 0) {
          ++perChannel[static_cast<std::size_t>(c)];
          ++distinct;
        }
      }
    }
    clear(k, channels);
    out.perRank = std::max(out.perRank, distinct);
    out.perChannel = std::max(out.perChannel, *std::max_element(perChannel.begin(), perChannel.end()));
  }
  return out;
}

int LimitBounds::steps(int channels) {
  counts_.assign(static_cast<std::size_t>(n_) * static_cast<std::size_t>(channels), 0);
  int most = 0;
  for (std::size_t k = 0; k + 1 < begin_.size(); ++k) {
    for (const Leg& l : bucket(k)) {
      for (int j = 0; j < slices_; ++j) {
        most = std::max(most, ++count(l.peer, channelOf(l.chunk, j, slices_, channels, parts_), channels));
      }
    }
    clear(k, channels);
  }
  return most;
}

void LimitBounds::clear(std::size_t k, int channels) {
  for (const Leg& l : bucket(k)) std::fill_n(&count(l.peer, 0, channels), channels, 0);
}

}  // namespace optiflow::compiler::detail
