// Keeping the daemon's heavy work out of the training jobs' way: it runs at a low priority, within a CPU budget, and
// only in idle gaps. The work calls WorkGate::checkpoint between steps (each synthesis candidate, each probe); the
// gate blocks while the jobs are busy (BusyDetector over the cache's activity counters) or while the work's CPU time
// is ahead of its budget, and says when the daemon is stopping.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>

#include "optiflow/daemon/activity.h"
#include "optiflow/daemon/metrics.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::daemon {

// Lowers the calling thread's priority (setpriority on its tid; threads it starts afterwards inherit it): the work
// threads call it first. Never raises it: a thread already nicer than `nice` keeps its value.
bool lowerThreadPriority(int nice);
// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), seconds.
double threadCpuSeconds();
// CPU time of the whole process (CLOCK_PROCESS_CPUTIME_ID), seconds: what the budget counts, because the synthesis
// loop evaluates sizes on threads of its own, and every thread of the daemon is its work.
double processCpuSeconds();

class WorkGate {
 public:
  using ActivitySource = std::function<std::optional<schedcache::Activity>()>;  // nullopt: no cache yet (idle)
  using Clock = std::chrono::steady_clock;
  using CpuClock = double (*)();  // seconds of CPU time (processCpuSeconds by default)

  // The CPU budget is a token bucket: credit grows by cpuCores per wall second, up to kBurstS x cpuCores (+10 ms),
  // and the work's CPU time is taken from it; the gate waits while the credit is negative. Over any interval T the
  // work uses at most cpuCores x T + that burst, however many threads it runs.
  static constexpr double kBurstS = 0.25;
  static constexpr double kPollS = 0.1;  // activity is sampled at most this often; waits wake at least this often

  WorkGate(double cpuCores, double busyCallsPerS, double idleWindowS, ActivitySource activity, Metrics* metrics,
           CpuClock cpuClock = &processCpuSeconds);

  // Returns false at once when stop is set; otherwise waits (polling every ~100 ms, waking within 10 ms of stop)
  // until the jobs are idle and the work's CPU time is within its budget, then true. Pauses are counted in
  // optiflowd_work_paused_seconds_total and optiflowd_jobs_busy; CPU time in optiflowd_cpu_seconds_total.
  // Thread-safe: the work and probe threads share one gate.
  bool checkpoint(const std::atomic<bool>& stop);
  void start();    // the budget is measured from here with a full burst credit (the work thread calls it)
  bool busyNow();  // samples the activity (at most every kPollS; otherwise the last answer)
  double pausedSeconds() const;

 private:
  void startLocked();
  bool sampleBusyLocked(Clock::time_point now);
  double budgetWaitLocked(Clock::time_point now);  // seconds until the credit is back to 0 (0: within budget)

  mutable std::mutex mutex_;
  double cpuCores_;
  BusyDetector busy_;
  ActivitySource activity_;
  Metrics* metrics_;
  CpuClock cpuClock_;
  bool started_ = false;
  Clock::time_point lastSampleAt_{};
  bool sampled_ = false;
  bool hasCache_ = false;  // the last sample found a cache (without one there are no jobs to wait for)
  Clock::time_point lastWall_{};
  double lastCpu_ = 0;
  double credit_ = 0;       // CPU seconds the work may still use now
  double reportedCpu_ = 0;  // processCpu at the last optiflowd_cpu_seconds_total update
  double pausedS_ = 0;
};

}  // namespace optiflow::daemon
