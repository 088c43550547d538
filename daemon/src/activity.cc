#include "optiflow/daemon/activity.h"

#include <algorithm>

namespace optiflow::daemon {

std::vector<Workload> workloadsFrom(const schedcache::Activity& activity, std::uint64_t minCalls) {
  std::vector<Workload> out;
  for (std::uint32_t c = 0; c < schedcache::kNumCollectives; ++c) {
    Workload w;
    w.collective = c;
    for (std::uint32_t b = 0; b < schedcache::kSizeBuckets; ++b) {
      const std::uint64_t n = activity.calls[c][b];
      w.calls += n;
      if (n == 0 || n < minCalls) continue;
      const std::uint64_t size = std::max<std::uint64_t>(std::uint64_t{1} << b, kMinWorkloadBytes);
      if (w.sizes.empty() || w.sizes.back() != size) w.sizes.push_back(size);  // buckets ascend, so sizes do
    }
    if (!w.sizes.empty()) out.push_back(std::move(w));
  }
  return out;
}

bool BusyDetector::update(const schedcache::Activity& activity, std::chrono::steady_clock::time_point now) {
  std::uint64_t total = 0;
  for (const auto& perColl : activity.calls) {
    for (std::uint64_t n : perColl) total += n;
  }
  if (!lastTotal_) {
    lastTotal_ = total;
    lastAt_ = now;
    return busy_;
  }
  const double dt = std::chrono::duration<double>(now - lastAt_).count();
  if (dt < kMinSampleS) return busy_;
  lastRate_ = total >= *lastTotal_ ? static_cast<double>(total - *lastTotal_) / dt : 0.0;
  lastTotal_ = total;
  lastAt_ = now;
  rated_ = true;
  const bool hot = lastRate_ > busyCallsPerS_;
  if (hot) lastBusyAt_ = now;
  busy_ = hot || (lastBusyAt_ && std::chrono::duration<double>(now - *lastBusyAt_).count() < idleWindowS_);
  return busy_;
}

}  // namespace optiflow::daemon
