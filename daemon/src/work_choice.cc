// Workload choice: which collectives and sizes the pass synthesizes (the jobs' activity, else the config), and which
// of them are due.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "work_impl.h"

namespace optiflow::daemon {

namespace {

constexpr std::size_t kMaxResumeRecords = 2000;  // a workload this explored is re-synthesized only when it changes

using detail::collName;
using detail::nowNs;

}  // namespace

namespace detail {

std::vector<std::uint64_t> defaultSizes() {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 1ull << 10; s <= 1ull << 30; s <<= 2) sizes.push_back(s);
  return sizes;
}

// What a run depends on besides its sizes: a run made under another fingerprint is not resumed or restored. The
// topology enters by its shape only: probes refine bandwidths and latencies all the time, and a small change must not
// restart every synthesis (the next interval's run uses the refined topology).
std::string fingerprint(const Config& c, const core::Topology& t) {
  // A calibration changes every time the search compares, so it is part of what a run depends on.
  const std::string cal =
      c.calibration ? fmt::format("|cal{:016x}", std::hash<std::string>{}(calib::formatCalibration(*c.calibration)))
                    : "";
  return fmt::format("{}|{}x{}|{}|{}|r{}|c{}|s{}|{}|{}{}", t.name, t.nodes, t.gpusPerNode, c.proposer, c.evaluator,
                     c.rounds, c.candidatesPerRound, c.seed, c.proposer == "llm" ? c.llm.client.baseUrl : "",
                     c.proposer == "llm" ? c.llm.client.model : "", cal);
}

}  // namespace detail

std::optional<schedcache::Activity> WorkLoop::Impl::activity() const {
  schedcache::Error err;
  std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns, &err);
  if (!reader) return std::nullopt;
  return reader->activity();
}

// What the node's jobs call, else what the config says to prepare for.
std::vector<Workload> WorkLoop::Impl::workloads(const Config& cfg) const {
  std::vector<Workload> workloads;
  if (const std::optional<schedcache::Activity> act = activity()) workloads = workloadsFrom(*act);
  if (workloads.empty()) {
    const std::vector<std::uint64_t> sizes = cfg.sizes.empty() ? detail::defaultSizes() : cfg.sizes;
    for (const std::string& name : cfg.collectives) {
      const std::optional<std::uint32_t> c = detail::collIndex(name);
      if (!c) continue;  // loadConfig rejects these
      workloads.push_back(Workload{*c, sizes, 0});
    }
  }
  return workloads;
}

// Why the workload needs a synthesis now, or nullptr when it does not.
const char* WorkLoop::Impl::due(std::uint32_t c, const std::vector<std::uint64_t>& sizes, const std::string& fp,
                                double intervalS) {
  auto it = colls.find(c);
  if (it == colls.end()) return "no run yet";
  if (it->second.sizes != sizes) return "its sizes changed";
  if (it->second.fingerprint != fp) return "the config or the topology's shape changed";
  if (static_cast<double>(nowNs() - it->second.finishedNs) * 1e-9 < intervalS) return nullptr;
  if (it->second.historyRecords >= kMaxResumeRecords) {
    if (!exhaustedLogged[c]) {
      spdlog::info("work: {} has {} candidates explored; re-synthesized only when its sizes or the config change",
                   collName(c), it->second.historyRecords);
      exhaustedLogged[c] = true;
    }
    return nullptr;
  }
  return "its interval passed";
}

}  // namespace optiflow::daemon
