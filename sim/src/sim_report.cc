// Reporting of simulation results: names and the JSON rows the CLI prints.
#include <algorithm>
#include <vector>

#include "optiflow/sim/simulator.h"

namespace optiflow::sim {

std::string_view toString(WaitKind k) {
  switch (k) {
    case WaitKind::Start:
      return "start";
    case WaitKind::BlockOrder:
      return "block-order";
    case WaitKind::Dependency:
      return "dependency";
    case WaitKind::DataHead:
      return "data-head";
    case WaitKind::DataTail:
      return "data-tail";
  }
  return "?";
}

nlohmann::json simResultToJson(const SimResult& r, const Network& network, std::size_t maxCriticalEntries) {
  using nlohmann::json;
  if (!r.ok) return json{{"size_bytes", r.sizeBytes}, {"error", r.error}};
  json j = {
      {"size_bytes", r.sizeBytes},
      {"time_us", r.timeUs},
      {"algbw_gbps", r.algbwGBps},
      {"busbw_gbps", r.busbwGBps},
      {"protocol", core::toString(r.protocol)},
      {"chunk_bytes", r.chunkBytes},
      {"iterations", r.iterations},
      {"simulated_iterations", r.simulatedIterations},
      {"extrapolated", r.extrapolated},
      {"symmetry", {{"kind", toString(r.symmetry.kind)}, {"period", r.symmetry.period}, {"fold", r.symmetry.fold}}}};
  if (r.bottleneckLink >= 0 && r.bottleneckLink < static_cast<int>(network.links().size())) {
    const auto& u = r.links[r.bottleneckLink];
    j["bottleneck"] = {{"link", network.link(r.bottleneckLink).name},
                       {"utilisation", u.utilisation},
                       {"busy_fraction", u.busyFraction},
                       {"bytes", u.bytes}};
  } else {
    j["bottleneck"] = nullptr;
  }
  json cp = json::array();
  const std::size_t n = r.criticalPath.size();
  for (std::size_t i = n > maxCriticalEntries ? n - maxCriticalEntries : 0; i < n; ++i) {
    const auto& c = r.criticalPath[i];
    cp.push_back({{"rank", c.rank},
                  {"tb", c.tb},
                  {"step", c.step},
                  {"iteration", c.iteration},
                  {"op", core::toString(c.op)},
                  {"peer", c.peer},
                  {"start_us", c.startUs},
                  {"end_us", c.endUs},
                  {"waited_on", toString(c.waitedOn)}});
  }
  // Every link that carried data, busiest first: where the time goes.
  json links = json::array();
  std::vector<int> used;
  for (int l = 0; l < static_cast<int>(r.links.size()) && l < static_cast<int>(network.links().size()); ++l) {
    if (r.links[l].bytes > 0) used.push_back(l);
  }
  std::stable_sort(used.begin(), used.end(),
                   [&](int a, int b) { return r.links[a].utilisation > r.links[b].utilisation; });
  for (int l : used) {
    const auto& u = r.links[l];
    links.push_back({{"link", network.link(l).name},
                     {"bytes", u.bytes},
                     {"busy_us", u.busyUs},
                     {"busy_fraction", u.busyFraction},
                     {"utilisation", u.utilisation}});
  }
  j["links"] = std::move(links);
  j["critical_path_length"] = n;
  j["critical_path"] = std::move(cp);
  return j;
}

}  // namespace optiflow::sim
