// The daemon's work: decide what to synthesize (the collectives and sizes the node's jobs use, from the activity
// counters; the configured defaults before any job ran), run the synthesis loop for each (configured proposer and
// evaluator, through the WorkGate), write a run directory per workload under the state directory, merge the winners
// into one plan and publish it into the schedule cache when it differs from the current one. New communicators pick
// it up; running ones keep theirs (docs/consistency.md). A leader also copies the merged plan to the share
// directory; a follower publishes the newest plan it finds there instead of synthesizing.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/daemon/budget.h"
#include "optiflow/daemon/config.h"
#include "optiflow/daemon/metrics.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::daemon {

struct PassResult {
  int workloads = 0;              // synthesized this pass
  int rounds = 0;                 // synthesis rounds run
  bool published = false;         // a new plan became current
  std::uint64_t planHash = 0;     // the current plan after the pass (0: none)
  std::filesystem::path planDir;  // the merged plan's directory (when published)
  bool interrupted = false;       // stop was requested mid-pass
};

class WorkLoop {
 public:
  // writer: the namespace's cache, owned by the daemon; topology: what the simulator models (probes refine it).
  WorkLoop(Config config, core::Topology topology, schedcache::Writer* writer, Metrics* metrics, WorkGate* gate,
           std::filesystem::path stateDir);
  ~WorkLoop();

  // One pass (see the file comment). Errors (a proposer that fails, a plan that does not publish) are counted in
  // optiflowd_errors_total{kind} and returned; the daemon logs them and tries again next interval.
  core::Result<PassResult> runOnce(const std::atomic<bool>& stop);

  void setTopology(core::Topology topology);  // after probes; the next pass uses it
  void setConfig(Config config);              // SIGHUP

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace optiflow::daemon
