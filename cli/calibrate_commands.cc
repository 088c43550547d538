// `optiflow calibrate`, and --calibration CAL.toml of every command that takes --topo.
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/calib/calibration_file.h"
#include "optiflow/calib/fit.h"
#include "optiflow/calib/nccl_tests_log.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/bounds.h"

namespace optiflow::cli {

namespace {

constexpr std::uint64_t kLargeBytes = calib::kBandwidthBoundBytes;

std::string keyValues(const calib::ModelFit& f) {
  const auto& p = f.params;
  std::string s;
  auto add = [&](std::string_view key, double v) {
    const bool fitted = std::find(f.fitted.begin(), f.fitted.end(), key) != f.fitted.end();
    if (fitted) s += fmt::format("{}{}={:.3g}", s.empty() ? "" : " ", key, v);
  };
  if (p.launchGraphUs) add("launch_graph_us", *p.launchGraphUs);
  if (p.launchHostUs) add("launch_host_us", *p.launchHostUs);
  add("latency_scale.Simple", p.latencyScale[0]);
  add("latency_scale.LL", p.latencyScale[1]);
  add("latency_scale.LL128", p.latencyScale[2]);
  add("bandwidth_scale.Simple", p.bandwidthScale[0]);
  add("bandwidth_scale.LL", p.bandwidthScale[1]);
  add("bandwidth_scale.LL128", p.bandwidthScale[2]);
  add("net_hop_latency_scale", p.netHopLatencyScale);
  add("nvlink_bandwidth_scale", p.nvlinkBandwidthScale);
  add("net_bandwidth_scale", p.netBandwidthScale);
  return s.empty() ? "(nothing fitted)" : s;
}

std::string cell(double us) { return us < 0 ? "-" : fmt::format("{:.2f}", us); }

nlohmann::json fitJson(const calib::ModelFit& f, const calib::ErrorSummary& before, const calib::ErrorSummary& after,
                       const calib::ErrorSummary& largeBefore, const calib::ErrorSummary& large) {
  nlohmann::json params;
  const auto& p = f.params;
  if (p.launchGraphUs) params["launch_graph_us"] = *p.launchGraphUs;
  if (p.launchHostUs) params["launch_host_us"] = *p.launchHostUs;
  params["latency_scale"] = {{"Simple", p.latencyScale[0]}, {"LL", p.latencyScale[1]}, {"LL128", p.latencyScale[2]}};
  params["bandwidth_scale"] = {
      {"Simple", p.bandwidthScale[0]}, {"LL", p.bandwidthScale[1]}, {"LL128", p.bandwidthScale[2]}};
  params["net_hop_latency_scale"] = p.netHopLatencyScale;
  params["nvlink_bandwidth_scale"] = p.nvlinkBandwidthScale;
  params["net_bandwidth_scale"] = p.netBandwidthScale;
  return {{"params", params},
          {"fitted", f.fitted},
          {"rows", after.rows},
          {"median_error_pct_before", before.medianPct},
          {"median_error_pct", after.medianPct},
          {"max_error_pct", after.maxPct},
          {"large_rows", large.rows},
          {"large_median_error_pct_before", largeBefore.medianPct},
          {"large_median_error_pct", large.medianPct}};
}

}  // namespace

std::optional<std::optional<calib::Calibration>> calibrationArg(const std::string& path, const core::Topology& topo) {
  if (path.empty()) return std::optional<calib::Calibration>{};
  auto c = calib::loadCalibrationFor(path, topo);
  if (!c) {
    fmt::print(stderr, "optiflow: --calibration: {}\n", c.error().str());
    return std::nullopt;
  }
  return std::optional<calib::Calibration>{std::move(c).value()};
}

std::optional<core::Topology> topologyArg(const std::string& spec, const core::TopologyHints& hints) {
  std::vector<std::string> notes;
  auto t = core::loadTopology(spec, hints, &notes);
  for (const auto& n : notes) fmt::print(stderr, "optiflow: note: {}\n", n);
  if (!t) {
    fmt::print(stderr, "optiflow: {}\n", t.error().str());
    return std::nullopt;
  }
  return std::move(t).value();
}

sim::SimParams simParamsFor(const std::optional<calib::Calibration>& cal, const std::string& launch) {
  const sim::LaunchMode mode = launch == "host" ? sim::LaunchMode::Host : sim::LaunchMode::Graph;
  return sim::calibratedSimParams(cal ? cal->simulator.params : sim::ModelCalibration{}, mode);
}

int runCalibrate(const CalibrateArgs& a) {
  std::vector<calib::NcclTestsLog> logs;
  for (const std::string& file : a.logs) {
    auto log = calib::readNcclTestsLog(file);
    if (!log) {
      fmt::print(stderr, "optiflow: {}\n", log.error().str());
      return kExitBadInput;
    }
    logs.push_back(std::move(log).value());
  }
  std::vector<core::Topology> topos;
  for (const std::string& name : a.topologies) {
    auto t = topologyArg(name, a.topologyHints);
    if (!t) return kExitBadInput;
    topos.push_back(std::move(*t));
  }
  if (topos.empty()) {
    fmt::print(stderr, "optiflow: calibrate needs --topo\n");
    return kExitBadInput;
  }
  // One file of one node (NCCL's topology XML describes one) and no --nodes: it stands for each node count the logs
  // ran on, so one --topo serves logs of 1, 2 and 16 nodes.
  if (topos.size() == 1 && topos.front().nodes == 1 && a.topologyHints.nodes == 0 &&
      !core::presetTopology(a.topologies.front()).ok()) {
    std::vector<int> counts;
    for (const auto& log : logs) {
      for (const auto& run : log.runs) {
        if (run.ranks > 0 && run.ranks % topos.front().gpusPerNode == 0) {
          counts.push_back(run.ranks / topos.front().gpusPerNode);
        }
      }
    }
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    if (!counts.empty() && !(counts.size() == 1 && counts.front() == 1)) {
      topos.clear();
      for (int n : counts) {
        core::TopologyHints h = a.topologyHints;
        h.nodes = n;
        auto t = core::loadTopology(a.topologies.front(), h);
        if (!t) {
          fmt::print(stderr, "optiflow: {}\n", t.error().str());
          return kExitBadInput;
        }
        if (n > 1) t->name = fmt::format("{}x{}", t->name, n);
        topos.push_back(std::move(t).value());
      }
    }
  }
  std::string names;
  int ranks = 0;
  for (const auto& t : topos) {
    names += (names.empty() ? "" : ", ") + t.name;
    ranks = std::max(ranks, t.nRanks());
  }
  calib::FitOptions options;
  if (!a.collective.empty()) {
    auto c = core::parseCollective(a.collective);
    if (!c || *c == core::Collective::Custom) {
      fmt::print(stderr, "optiflow: --coll: unknown collective '{}'\n", a.collective);
      return kExitBadInput;
    }
    options.collective = *c;
  }
  if (!a.calibration.empty() && !a.output.empty()) {
    fmt::print(stderr,
               "optiflow: --calibration checks an existing calibration against the logs; it writes none (-o)\n");
    return kExitBadInput;
  }
  std::optional<calib::Calibration> given;
  if (!a.calibration.empty()) {
    for (const auto& t : topos) {
      auto c = calibrationArg(a.calibration, t);
      if (!c) return kExitBadInput;
      given = std::move(*c);
    }
  }
  auto obs = calib::observationsFrom(logs, topos, options);
  if (!obs) {
    fmt::print(stderr, "optiflow: {}\n", obs.error().str());
    return kExitBadInput;
  }
  calib::Calibration cal;
  if (given) {
    cal = *given;
    cal.residuals = calib::predict(*obs, cal.simulator.params, cal.ncclModel.params);
  } else {
    cal = calib::fitCalibration(*obs, options);
    cal.writtenBy = fmt::format("optiflow {} calibrate", OPTIFLOW_VERSION);
  }
  const auto simBefore = calib::summarize(cal.residuals, calib::Model::SimulatorBefore);
  const auto simAfter = calib::summarize(cal.residuals, calib::Model::Simulator);
  const auto modelBefore = calib::summarize(cal.residuals, calib::Model::NcclModelBefore);
  const auto modelAfter = calib::summarize(cal.residuals, calib::Model::NcclModel);
  std::vector<sim::BoundModel> bounds;
  for (const auto& t : topos) bounds.emplace_back(t);
  // Row i of the residuals is observation i, measured on its own topology.
  auto boundOf = [&](std::size_t i) {
    const auto& o = obs->rows[i];
    return bounds[static_cast<std::size_t>(o.topology)].bound(o.collective, o.sizeBytes).timeUs;
  };
  auto topologyOf = [&](std::size_t i) -> const std::string& {
    return topos[static_cast<std::size_t>(obs->rows[i].topology)].name;
  };
  int disagree = 0;
  for (const auto& r : cal.residuals) {
    if (r.simulatorUs > 0 && r.ncclModelUs > 0 && modelsDisagree(r.simulatorUs, r.ncclModelUs)) {
      ++disagree;
    }
  }
  int incomplete = 0;
  for (const auto& s : obs->sources) incomplete += s.incompleteRows;

  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t i = 0; i < cal.residuals.size(); ++i) {
      const auto& r = cal.residuals[i];
      rows.push_back({{"file", r.file},
                      {"topology", topologyOf(i)},
                      {"line", r.line},
                      {"collective", r.collective},
                      {"size_bytes", r.sizeBytes},
                      {"choice", r.choice},
                      {"measured_us", r.measuredUs},
                      {"simulator_before_us", r.simulatorBeforeUs},
                      {"simulator_us", r.simulatorUs},
                      {"nccl_model_before_us", r.ncclModelBeforeUs},
                      {"nccl_model_us", r.ncclModelUs},
                      {"bound_us", boundOf(i)}});
    }
    nlohmann::json sources = nlohmann::json::array();
    for (const auto& s : obs->sources) {
      sources.push_back({{"file", s.file},
                         {"collective", s.collective},
                         {"ranks", s.ranks},
                         {"nodes", s.nodes},
                         {"rows", s.rows},
                         {"incomplete_rows", s.incompleteRows},
                         {"launch", s.launch},
                         {"nccl_version", s.ncclVersion}});
    }
    const nlohmann::json out = {
        {"topology", names},
        {"ranks", ranks},
        {"calibration", given ? a.calibration : a.output},
        {"fitted", !given},
        {"sources", sources},
        {"notes", obs->notes},
        {"simulator", fitJson(cal.simulator, simBefore, simAfter,
                              calib::summarize(cal.residuals, calib::Model::SimulatorBefore, kLargeBytes),
                              calib::summarize(cal.residuals, calib::Model::Simulator, kLargeBytes))},
        {"nccl_model", fitJson(cal.ncclModel, modelBefore, modelAfter,
                               calib::summarize(cal.residuals, calib::Model::NcclModelBefore, kLargeBytes),
                               calib::summarize(cal.residuals, calib::Model::NcclModel, kLargeBytes))},
        {"large_bytes", kLargeBytes},
        {"believe", cal.believe},
        {"disagreements", disagree},
        {"rows", rows}};
    std::cout << out.dump(2) << '\n';
  } else {
    fmt::print("{} both models of NCCL's own choice on {} ({} GPUs) against {} row(s) of {} log(s){}\n",
               given ? "Checked the calibration " + a.calibration + " of" : "Calibrated", names, ranks,
               obs->rows.size(), logs.size(),
               incomplete ? fmt::format("; {} row(s) cut off or unreadable, left out", incomplete) : "");
    const bool several = topos.size() > 1;
    fmt::print("{}{:>10} {:>13} {:>15} {:>11} {:>11} {:>11} {:>11} {:>11} {:>10}\n",
               several ? fmt::format("{:>14} ", "topology") : "", "size", "collective", "choice", "measured_us",
               "sim_before", "sim_after", "model_befor", "model_after", "bound_us");
    for (std::size_t i = 0; i < cal.residuals.size(); ++i) {
      const auto& r = cal.residuals[i];
      fmt::print("{}{:>10} {:>13} {:>15} {:>11.2f} {:>11} {:>11} {:>11} {:>11} {:>10}\n",
                 several ? fmt::format("{:>14} ", topologyOf(i)) : "", core::formatSize(r.sizeBytes), r.collective,
                 r.choice, r.measuredUs, cell(r.simulatorBeforeUs), cell(r.simulatorUs), cell(r.ncclModelBeforeUs),
                 cell(r.ncclModelUs), cell(boundOf(i)));
    }
    auto line = [&](std::string_view name, calib::Model before, calib::Model after) {
      const auto b = calib::summarize(cal.residuals, before);
      const auto s = calib::summarize(cal.residuals, after);
      if (s.rows == 0) return fmt::format("{:<11} no row it can time\n", name);
      std::string large;
      const auto bl = calib::summarize(cal.residuals, before, kLargeBytes);
      const auto sl = calib::summarize(cal.residuals, after, kLargeBytes);
      if (sl.rows > 0) {
        large = fmt::format("; from {}: {:.1f}% -> {:.1f}% over {}", core::formatSize(kLargeBytes), bl.medianPct,
                            sl.medianPct, sl.rows);
      }
      return fmt::format("{:<11} median error {:.1f}% -> {:.1f}% (max {:.1f}%) over {} rows{}\n", name, b.medianPct,
                         s.medianPct, s.maxPct, s.rows, large);
    };
    fmt::print("\n{}", line("simulator:", calib::Model::SimulatorBefore, calib::Model::Simulator));
    if (!given) fmt::print("            fitted {}\n", keyValues(cal.simulator));
    fmt::print("{}", line("NCCL model:", calib::Model::NcclModelBefore, calib::Model::NcclModel));
    if (!given) fmt::print("            fitted {}\n", keyValues(cal.ncclModel));
    if (simAfter.rows < modelAfter.rows) {
      fmt::print("The simulator cannot time {} row(s): NCCL's choice there (NVLS, PAT, CollNet) has no schedule.\n",
                 modelAfter.rows - simAfter.rows);
    }
    fmt::print(
        "The two models disagree by more than {:.0f}% at {} of {} size(s); reports believe the {} (lower "
        "median error on these rows, overall and from {}).\n",
        100 * kModelDisagreement, disagree, cal.residuals.size(),
        cal.believe == "simulator" ? "simulator" : "NCCL model", core::formatSize(kLargeBytes));
    for (const auto& n : obs->notes) fmt::print("note: {}\n", n);
  }
  if (!a.output.empty()) {
    std::ofstream f(a.output, std::ios::binary | std::ios::trunc);
    f << calib::formatCalibration(cal);
    f.close();
    if (!f) {
      fmt::print(stderr, "optiflow: cannot write {}\n", a.output);
      return kExitFailed;
    }
    if (!a.json) fmt::print("wrote {}\n", a.output);
  }
  return kExitOk;
}

}  // namespace optiflow::cli
