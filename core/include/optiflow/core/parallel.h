// fn(0) .. fn(n - 1) on a few threads: the synthesis loop's sizes, the run directory's files, the calibration's
// rows. Each index runs exactly once; which thread runs it is not fixed, so fn must only touch index-owned state.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace optiflow::core {

// threads <= 0: one per hardware thread. Indices are handed out in increasing order (callers that want the
// longest work first map i to it).
template <typename Fn>
void parallelFor(std::size_t n, int threads, const Fn& fn) {
  const unsigned wanted = threads > 0 ? static_cast<unsigned>(threads) : std::thread::hardware_concurrency();
  const std::size_t t = std::min<std::size_t>(n, std::max(1u, wanted));
  if (t <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (std::size_t k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

}  // namespace optiflow::core
