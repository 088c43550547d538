#include "optiflow/daemon/measured.h"

#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace optiflow::daemon {
namespace {

std::string algoText(const schedcache::Measurement& m) {
  return m.algorithm ? std::string(core::toString(*m.algorithm)) : std::string("unknown");
}
std::string protoText(const schedcache::Measurement& m) {
  return m.protocol ? std::string(core::toString(*m.protocol)) : std::string("unknown");
}

}  // namespace

std::vector<MeasuredRow> joinMeasurements(const schedcache::Reader& reader) {
  std::vector<MeasuredRow> out;
  const std::vector<schedcache::Measurement> measured = reader.measurements();
  if (measured.empty()) return out;
  std::map<std::uint64_t, schedcache::CommPin> pins;
  for (const schedcache::CommPin& p : reader.pins()) {
    if (p.commId != 0) pins[p.commId] = p;
  }
  std::map<std::uint64_t, std::optional<schedcache::Plan>> plans;  // by hash, loaded once
  for (const schedcache::Measurement& m : measured) {
    MeasuredRow row;
    row.m = m;
    const auto pin = pins.find(m.commId);
    if (pin != pins.end()) {
      row.nRanks = pin->second.nRanks;
      row.nNodes = pin->second.nNodes;
      const std::uint64_t hash = pin->second.planHash;
      if (hash != schedcache::kPinPending && hash != schedcache::kPinNoPlan) {
        auto [it, inserted] = plans.try_emplace(hash);
        if (inserted) {
          schedcache::Plan plan;
          std::string detail;
          if (reader.loadPlan(hash, &plan, nullptr, &detail) == schedcache::Status::kOk) it->second = std::move(plan);
        }
        if (it->second) {
          for (const schedcache::PlanItem& item : it->second->items) {
            if (item.coll != m.coll || item.nRanks != row.nRanks || item.nNodes != row.nNodes ||
                m.sizeBytes < item.minBytes || m.sizeBytes > item.maxBytes) {
              continue;
            }
            if (item.algorithm && item.algorithm == m.algorithm && item.protocol == m.protocol &&
                (item.nChannels == 0 || static_cast<std::uint32_t>(item.nChannels) == m.channels) &&
                item.nativeUs > 0) {
              row.predictedUs = item.nativeUs;
            }
            auto sets = [&](const std::optional<core::Algorithm>& a, const std::optional<core::Protocol>& p,
                            std::int32_t channels) {
              return a && a == m.algorithm && p == m.protocol && channels > 0 &&
                     static_cast<std::uint32_t>(channels) == m.channels;
            };
            row.forced = row.forced || sets(item.algorithm, item.protocol, item.nChannels);
            for (const schedcache::TrialCandidate& t : item.trials) {
              row.forced = row.forced || sets(t.algorithm, t.protocol, t.nChannels);
            }
          }
        }
      }
    }
    out.push_back(std::move(row));
  }
  return out;
}

double busBandwidthFactor(core::Collective coll, std::uint32_t nRanks) {
  if (nRanks <= 1) return 1.0;
  const double n = nRanks;
  switch (coll) {
    case core::Collective::AllReduce:
      return 2.0 * (n - 1) / n;
    case core::Collective::AllGather:
    case core::Collective::ReduceScatter:
    case core::Collective::AllToAll:
      return (n - 1) / n;
    default:
      return 1.0;
  }
}

std::string messageSizeBucket(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1000.0 && unit < 4) {
    v /= 1000.0;
    ++unit;
  }
  const auto lo = static_cast<std::uint64_t>(std::floor(v));
  return fmt::format("{}-{}{}", lo, lo + 1, kUnits[unit]);
}

void describeMeasurementMetrics(Metrics& m) {
  m.describe("optiflowd_measured_time_us", "gauge",
             "Median GPU time of a collective configuration measured by the profiler plugin (calls-weighted over "
             "communicators)");
  m.describe("optiflowd_prediction_error_ratio", "gauge",
             "Measured median / the simulator's prediction for the plan entry the configuration came from");
  m.describe("nccl_collective_exec_time_microseconds", "gauge",
             "Median GPU time of a collective per communicator (NVIDIA Inspector's name)");
  m.describe("nccl_bus_bandwidth_gbs", "gauge",
             "Bus bandwidth of a collective per communicator, GB/s (Inspector's name)");
  m.describe("optiflowd_measurements_dropped_total", "counter",
             "Collectives or calls the node's profiler and tuner plugins could not record, by reason");
}

void exportMeasureCounters(Metrics& metrics, const schedcache::MeasureCounters& c) {
  const std::pair<const char*, std::uint64_t> reasons[] = {{"untimed", c.untimed},
                                                           {"pool_full", c.poolFull},
                                                           {"table_full", c.tableFull},
                                                           {"foreign", c.foreign},
                                                           {"choice_full", c.choiceFull}};
  for (const auto& [reason, count] : reasons) {
    metrics.set("optiflowd_measurements_dropped_total", static_cast<double>(count), promLabels({{"reason", reason}}));
  }
}

void exportMeasurements(Metrics& metrics, const std::vector<MeasuredRow>& rows) {
  struct Sum {
    double weightedUs = 0;
    double calls = 0;
    double weightedPredicted = 0;
    double predictedCalls = 0;
  };
  using Key = std::tuple<std::string, std::uint64_t, std::string, std::string, std::uint32_t>;
  std::map<Key, Sum> byConfig;
  for (const MeasuredRow& r : rows) {
    const schedcache::Measurement& m = r.m;
    const auto calls = static_cast<double>(m.calls);
    Sum& s = byConfig[{std::string(core::toString(m.coll)), m.sizeBytes, algoText(m), protoText(m), m.channels}];
    s.weightedUs += m.medianUs * calls;
    s.calls += calls;
    if (r.predictedUs) {
      s.weightedPredicted += *r.predictedUs * calls;
      s.predictedCalls += calls;
    }
    const std::string comm = schedcache::formatHash(m.commId);
    const std::string nNodes = r.nNodes == 0 ? std::string("unknown") : std::to_string(r.nNodes);
    const std::string nRanks = r.nRanks == 0 ? std::string("unknown") : std::to_string(r.nRanks);
    const std::string algoProto = algoText(m) + "_" + protoText(m);
    const std::string size = messageSizeBucket(m.sizeBytes);
    const std::string labels = promLabels({{"comm_name", comm},
                                           {"n_nodes", nNodes},
                                           {"nranks", nRanks},
                                           {"collective", core::toString(m.coll)},
                                           {"message_size", size},
                                           {"algo_proto", algoProto}});
    metrics.set("nccl_collective_exec_time_microseconds", m.medianUs, labels);
    if (m.medianUs > 0) {
      const double gbs = static_cast<double>(m.sizeBytes) / (m.medianUs * 1e-6) / 1e9 *
                         busBandwidthFactor(m.coll, r.nRanks == 0 ? 1 : r.nRanks);
      metrics.set("nccl_bus_bandwidth_gbs", gbs, labels);
    }
  }
  for (const auto& [key, s] : byConfig) {
    const auto& [coll, size, algo, proto, channels] = key;
    const std::string sizeText = std::to_string(size);
    const std::string channelText = std::to_string(channels);
    const std::string labels = promLabels({{"collective", coll},
                                           {"size", sizeText},
                                           {"algorithm", algo},
                                           {"protocol", proto},
                                           {"channels", channelText}});
    const double measured = s.weightedUs / s.calls;
    metrics.set("optiflowd_measured_time_us", measured, labels);
    if (s.predictedCalls > 0) {
      metrics.set("optiflowd_prediction_error_ratio", measured / (s.weightedPredicted / s.predictedCalls), labels);
    }
  }
}

}  // namespace optiflow::daemon
