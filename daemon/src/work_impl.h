// The work loop's state, shared by its three rooms: work_choice.cc (which workloads are due), work_store.cc (runs/
// and plans/ on disk, the share directory) and work.cc (the pass: synthesis of each workload, publishing).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/daemon/activity.h"
#include "optiflow/daemon/ranking.h"
#include "optiflow/daemon/work.h"
#include "optiflow/schedcache/reader.h"

namespace optiflow::daemon {

namespace detail {

// Workloads are keyed by NCCL's ncclFunc_t index, as the tuner's activity counters are: its name, and the index of a
// name (nullopt for one NCCL's tuner does not decide).
inline std::string collName(std::uint32_t c) {
  const std::optional<core::Collective> coll = core::collectiveFromNcclFunc(static_cast<int>(c));
  return std::string(core::toString(coll.value_or(core::Collective::Custom)));
}
inline std::optional<std::uint32_t> collIndex(std::string_view name) {
  const std::optional<core::Collective> coll = core::parseCollective(name);
  const std::optional<int> func = coll ? core::ncclFuncIndex(*coll) : std::nullopt;
  if (!func) return std::nullopt;
  return static_cast<std::uint32_t>(*func);
}

inline std::int64_t nowNs() { return schedcache::realtimeNs(); }

inline core::Diagnostic diag(const std::filesystem::path& file, std::string message) {
  return core::Diagnostic{file.string(), 0, 0, std::move(message)};
}

// Workload choice (work_choice.cc).
std::vector<std::uint64_t> defaultSizes();
std::string fingerprint(const Config& c, const core::Topology& t);

}  // namespace detail

struct WorkLoop::Impl {
  struct CollState {
    std::filesystem::path runDir;  // the latest complete run of this collective
    std::vector<std::uint64_t> sizes;
    std::string fingerprint;
    std::int64_t finishedNs = 0;
    std::size_t historyRecords = 0;
  };

  Impl(Config c, core::Topology t, schedcache::Writer* w, Metrics* m, WorkGate* g, std::filesystem::path state)
      : config(std::move(c)),
        topology(std::move(t)),
        writer(w),
        metrics(m),
        gate(g),
        ns(config.ns),
        workDir(std::move(state) / config.ns) {}

  std::mutex mutex;  // config and topology (setConfig/setTopology come from other threads)
  Config config;
  core::Topology topology;

  schedcache::Writer* writer;
  Metrics* metrics;
  WorkGate* gate;
  const std::string ns;
  const std::filesystem::path workDir;  // <state dir>/<namespace>: runs/ and plans/

  // Only the work thread touches these.
  std::map<std::uint32_t, CollState> colls;  // by ncclFunc_t index (core::ncclFuncIndex)
  bool restored = false;
  std::uint64_t lastPublished = 0;
  std::uint64_t lastShared = 0;
  std::uint64_t lastFollowed = 0;
  unsigned tmpCounter = 0;
  std::string lastMergeSignature;  // the decisions of the last merged plan (work_store.cc)
  std::map<std::uint32_t, bool> exhaustedLogged;

  std::filesystem::path runsDir() const { return workDir / "runs"; }
  std::filesystem::path plansDir() const { return workDir / "plans"; }

  void error(const std::string& kind) const {
    if (metrics != nullptr) metrics->add("optiflowd_errors_total", 1, promLabels({{"kind", kind}}));
  }
  void add(const std::string& name, double v, const std::string& labels = "") const {
    if (metrics != nullptr) metrics->add(name, v, labels);
  }

  bool checkpoint(const std::atomic<bool>& stop) const {
    return gate != nullptr ? gate->checkpoint(stop) : !stop.load();
  }

  // Workload choice (work_choice.cc).
  std::optional<schedcache::Activity> activity() const;
  std::vector<Workload> workloads(const Config& cfg) const;
  const char* due(std::uint32_t c, const std::vector<std::uint64_t>& sizes, const std::string& fp, double intervalS);

  // The plan store (work_store.cc).
  void restore(const std::string& fp);
  std::filesystem::path newRunDir(std::uint32_t c);
  core::Result<bool> writeRunRecord(const std::string& name, const CollState& st, const std::string& stopReason);
  void gcRuns(std::uint32_t c);
  void gcPlans(std::uint64_t protect);
  // Merges the latest runs into plans/<hash>, ranked by what the node's jobs measured (ranking.h). With
  // onlyIfChanged, an empty path when the ranked decisions are the last merge's (nothing copied or verified).
  core::Result<std::filesystem::path> mergeRuns(const RankOptions& rank, bool onlyIfChanged);
  core::Result<std::filesystem::path> finalizePlanDir(const std::filesystem::path& tmp, std::uint64_t expected = 0);
  core::Result<bool> share(const std::filesystem::path& shareDir, const std::filesystem::path& planDir,
                           std::uint64_t hash);
  core::Result<PassResult> follow(const Config& cfg);

  // The pass (work.cc).
  std::uint64_t currentHash() const;
  core::Result<std::optional<int>> synthesize(const Workload& w, const Config& cfg, const core::Topology& topo,
                                              const std::string& fp, const std::atomic<bool>& stop);
  core::Result<bool> publish(const std::filesystem::path& dir, PassResult& out);
};

}  // namespace optiflow::daemon
