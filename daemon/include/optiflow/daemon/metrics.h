// The daemon's counters and gauges, rendered in the Prometheus text format (version 0.0.4) for /metrics. Thread-safe:
// the work loop, the prober and the HTTP thread update and read them concurrently.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace optiflow::daemon {

class Metrics {
 public:
  // name: [a-zA-Z_:][a-zA-Z0-9_:]*, labels already rendered (`collective="allgather",size="1048576"`, or "").
  void add(const std::string& name, double value, const std::string& labels = "");
  void set(const std::string& name, double value, const std::string& labels = "");
  double get(const std::string& name, const std::string& labels = "") const;
  // HELP and TYPE ("counter" | "gauge") of a family; families without one are rendered as untyped.
  void describe(const std::string& name, const std::string& type, const std::string& help);
  std::string renderPrometheus() const;

 private:
  struct Family {
    std::string type, help;
    std::map<std::string, double> values;  // by labels
  };
  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

// Renders labels for add/set/get: `key="value"` pairs in the order given, values escaped (\\, \", newline) as the
// text format requires, e.g. promLabels({{"peer", "10.0.0.2:7000"}}).
std::string promLabels(std::initializer_list<std::pair<std::string_view, std::string_view>> labels);

// Families the daemon exports (docs/config.md lists them):
//   optiflowd_plans_published_total, optiflowd_synthesis_rounds_total, optiflowd_synthesis_candidates_total,
//   optiflowd_best_speedup{collective,size} (NCCL's simulated time / ours), optiflowd_probe_bandwidth_gbps{peer},
//   optiflowd_probe_latency_us{peer}, optiflowd_probe_gap_ratio{peer} (measured / predicted), optiflowd_errors_total{
//   kind}, optiflowd_jobs_busy (0/1), optiflowd_work_paused_seconds_total, optiflowd_cpu_seconds_total,
//   optiflowd_config_reloads_total, optiflowd_up.

}  // namespace optiflow::daemon
