// What the node's training jobs are doing, from the tuner's activity counters in the schedule cache (calls per
// collective and log2 size): which workloads to synthesize for, and whether the jobs are busy right now (heavy work
// waits for an idle gap: docs/config.md [budget]).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "optiflow/schedcache/layout.h"

namespace optiflow::daemon {

struct Workload {
  std::uint32_t collective = 0;      // NCCL's ncclFunc_t index, as Activity counts (core::collectiveFromNcclFunc)
  std::vector<std::uint64_t> sizes;  // representative sizes (2^bucket) the jobs used, ascending
  std::uint64_t calls = 0;           // total calls seen
};

// Synthesis below this size says nothing useful (every schedule is launch-bound), and a few bytes cannot be split
// over the ranks: the buckets of smaller calls are represented by this size.
inline constexpr std::uint64_t kMinWorkloadBytes = 1024;

// Collectives with calls, each with the size buckets that saw calls (at least minCalls of them), ascending by
// collective value. Representative sizes are 2^bucket, raised to kMinWorkloadBytes, without duplicates.
std::vector<Workload> workloadsFrom(const schedcache::Activity& activity, std::uint64_t minCalls = 1);

class BusyDetector {
 public:
  BusyDetector(double busyCallsPerS, double idleWindowS) : busyCallsPerS_(busyCallsPerS), idleWindowS_(idleWindowS) {}
  // Feed a snapshot taken at `now`; returns true while the jobs are busy: the call rate since the previous snapshot
  // exceeds busyCallsPerS, or it did less than idleWindowS ago. The first snapshot only sets the base (not busy); a
  // snapshot less than kMinSampleS after the previous one is ignored (a rate over a few ms is noise); counters that
  // went backwards (the segment was recreated) count as no calls.
  static constexpr double kMinSampleS = 0.05;
  bool update(const schedcache::Activity& activity, std::chrono::steady_clock::time_point now);
  bool busy() const { return busy_; }
  bool rated() const { return rated_; }  // a rate has been measured (two snapshots far enough apart)
  double lastRate() const { return lastRate_; }

 private:
  double busyCallsPerS_;
  double idleWindowS_;
  std::optional<std::uint64_t> lastTotal_;
  std::chrono::steady_clock::time_point lastAt_{};
  std::optional<std::chrono::steady_clock::time_point> lastBusyAt_;
  bool busy_ = false;
  bool rated_ = false;
  double lastRate_ = 0;
};

}  // namespace optiflow::daemon
