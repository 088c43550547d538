#include "optiflow/daemon/budget.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <thread>
#include <utility>

namespace optiflow::daemon {

namespace {

double clockSeconds(clockid_t id) {
  timespec ts{};
  if (clock_gettime(id, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double secondsBetween(WorkGate::Clock::time_point a, WorkGate::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr auto kStopCheck = std::chrono::milliseconds(10);

}  // namespace

bool lowerThreadPriority(int nice) {
  // Linux keeps the nice value per thread: PRIO_PROCESS with a tid changes only that thread.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return false;
  if (current >= nice) return true;
  return setpriority(PRIO_PROCESS, tid, nice) == 0;
}

double threadCpuSeconds() { return clockSeconds(CLOCK_THREAD_CPUTIME_ID); }
double processCpuSeconds() { return clockSeconds(CLOCK_PROCESS_CPUTIME_ID); }

WorkGate::WorkGate(double cpuCores, double busyCallsPerS, double idleWindowS, ActivitySource activity, Metrics* metrics,
                   CpuClock cpuClock)
    : cpuCores_(std::max(cpuCores, 1e-3)),
      busy_(busyCallsPerS, idleWindowS),
      activity_(std::move(activity)),
      metrics_(metrics),
      cpuClock_(cpuClock != nullptr ? cpuClock : &processCpuSeconds) {
  if (metrics_ != nullptr) {
    metrics_->describe("optiflowd_jobs_busy", "gauge", "1 while the node's jobs are busy and heavy work waits");
    metrics_->describe("optiflowd_work_paused_seconds_total", "counter",
                       "Seconds the work waited for an idle gap or for its CPU budget");
    metrics_->describe("optiflowd_cpu_seconds_total", "counter", "CPU seconds used by the daemon");
    metrics_->set("optiflowd_jobs_busy", 0);
    metrics_->add("optiflowd_work_paused_seconds_total", 0);
    metrics_->add("optiflowd_cpu_seconds_total", 0);
  }
}

void WorkGate::start() {
  std::lock_guard lock(mutex_);
  startLocked();
}

void WorkGate::startLocked() {
  started_ = true;
  lastWall_ = Clock::now();
  lastCpu_ = cpuClock_();
  reportedCpu_ = lastCpu_;
  credit_ = cpuCores_ * kBurstS + 0.01;
  sampleBusyLocked(lastWall_);
}

bool WorkGate::busyNow() {
  std::lock_guard lock(mutex_);
  return sampleBusyLocked(Clock::now());
}

double WorkGate::pausedSeconds() const {
  std::lock_guard lock(mutex_);
  return pausedS_;
}

bool WorkGate::sampleBusyLocked(Clock::time_point now) {
  if (sampled_ && secondsBetween(lastSampleAt_, now) < kPollS) return hasCache_ && busy_.busy();
  sampled_ = true;
  lastSampleAt_ = now;
  const std::optional<schedcache::Activity> activity = activity_ ? activity_() : std::nullopt;
  hasCache_ = activity.has_value();
  const bool busy = hasCache_ && busy_.update(*activity, now);  // no cache: no jobs to wait for
  if (metrics_ != nullptr) metrics_->set("optiflowd_jobs_busy", busy ? 1 : 0);
  return busy;
}

double WorkGate::budgetWaitLocked(Clock::time_point now) {
  const double cpu = cpuClock_();
  credit_ += cpuCores_ * secondsBetween(lastWall_, now) - (cpu - lastCpu_);
  credit_ = std::min(credit_, cpuCores_ * kBurstS + 0.01);
  lastWall_ = now;
  lastCpu_ = cpu;
  if (metrics_ != nullptr && cpu > reportedCpu_) metrics_->add("optiflowd_cpu_seconds_total", cpu - reportedCpu_);
  reportedCpu_ = std::max(reportedCpu_, cpu);
  return credit_ >= 0 ? 0 : -credit_ / cpuCores_;
}

bool WorkGate::checkpoint(const std::atomic<bool>& stop) {
  if (stop.load()) return false;
  for (;;) {
    double wait = 0;
    {
      std::lock_guard lock(mutex_);
      if (!started_) startLocked();
      const Clock::time_point now = Clock::now();
      const bool busy = sampleBusyLocked(now);
      const double budgetWait = budgetWaitLocked(now);
      // Until two samples give a rate, the jobs may be busy: the first checkpoint waits one poll to find out.
      const bool known = busy_.rated() || !activity_;
      wait = busy || (!known && hasCache_) ? kPollS : budgetWait;
    }
    if (wait <= 0) return true;
    // Sleep in short slices so that a stop request is seen within ~10 ms; the pause is counted as it goes, so
    // /metrics shows a long pause while it lasts.
    const Clock::time_point from = Clock::now();
    const Clock::time_point until =
        from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(wait, kPollS)));
    while (!stop.load() && Clock::now() < until) std::this_thread::sleep_for(kStopCheck);
    const double slept = secondsBetween(from, Clock::now());
    {
      std::lock_guard lock(mutex_);
      pausedS_ += slept;
    }
    if (metrics_ != nullptr) metrics_->add("optiflowd_work_paused_seconds_total", slept);
    if (stop.load()) return false;
  }
}

}  // namespace optiflow::daemon
