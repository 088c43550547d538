// What the profiler plugins measured in running jobs (the segment's MeasureRegion, docs/profiler.md), joined with the
// plan entries each communicator used (through its pin), and exported as Prometheus gauges: OptiFlow's own families
// and NVIDIA Inspector's names, so that dashboards built for Inspector show OptiFlow's measurements too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/daemon/metrics.h"
#include "optiflow/schedcache/reader.h"

namespace optiflow::daemon {

struct MeasuredRow {
  schedcache::Measurement m;
  std::uint32_t nRanks = 0;  // from the communicator's pin; 0: unknown (no pin on this node)
  std::uint32_t nNodes = 0;
  // The simulator's time for this configuration in the plan the communicator used: the entry's nativeUs when the
  // measured configuration is the entry's decision (channels 0 in the plan match any); nullopt otherwise.
  std::optional<double> predictedUs;
  // The plan the communicator used set this row's channel count for its (algorithm, protocol) at this size (the
  // decision or a trial candidate): NCCL did not choose it.
  bool forced = false;
};

// Joins measurements with pins and the plans they name (loaded from the segment; a plan that cannot be read gives
// no prediction). Never throws past a failed plan read.
std::vector<MeasuredRow> joinMeasurements(const schedcache::Reader& reader);

// nccl-tests' bus bandwidth factor: 2(n-1)/n for AllReduce, (n-1)/n for AllGather, ReduceScatter and AlltoAll,
// 1 for Broadcast and Reduce.
double busBandwidthFactor(core::Collective coll, std::uint32_t nRanks);
// Inspector's message_size label: the size as a one-unit bucket of decimal units ("1-2MB", "512-513B").
std::string messageSizeBucket(std::uint64_t bytes);

// Sets, for every row:
//   optiflowd_measured_time_us{collective,size,algorithm,protocol,channels}   median, calls-weighted over
//                                                                             communicators
//   optiflowd_prediction_error_ratio{same labels}                             measured median / predicted, where a
//                                                                             prediction exists
//   nccl_collective_exec_time_microseconds{comm_name,n_nodes,nranks,collective,message_size,algo_proto}  median
//   nccl_bus_bandwidth_gbs{same labels}                                       size / median x busBandwidthFactor
// (comm_name is the communicator id in 16 hex digits: the profiler sees no communicator names across processes.)
void exportMeasurements(Metrics& metrics, const std::vector<MeasuredRow>& rows);
// optiflowd_measurements_dropped_total{reason}: what the node's profilers and tuners could not record
// (MeasureCounters: untimed, pool_full, table_full, foreign, choice_full), so a full table shows on a dashboard.
void exportMeasureCounters(Metrics& metrics, const schedcache::MeasureCounters& counters);
void describeMeasurementMetrics(Metrics& metrics);

}  // namespace optiflow::daemon
