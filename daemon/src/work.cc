#include "optiflow/daemon/work.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "fs_util.h"
#include "optiflow/core/units.h"
#include "optiflow/daemon/activity.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/synth/cache_plan.h"
#include "optiflow/synth/llm_client.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/run_dir.h"
#include "optiflow/synth/service.h"

namespace optiflow::daemon {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kKeepRunsPerCollective = 3;
constexpr int kKeepPlans = 4;  // as many as the segment has slots: every plan it holds keeps its files
constexpr std::size_t kMaxResumeRecords = 2000;  // a workload this explored is re-synthesized only when it changes
constexpr const char* kDaemonFile = "daemon.json";
constexpr const char* kShareCurrent = "current";

std::string collName(std::uint32_t c) {
  return std::string(schedcache::toString(static_cast<schedcache::Collective>(c)));
}

std::vector<std::uint64_t> defaultSizes() {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 1ull << 10; s <= 1ull << 30; s <<= 2) sizes.push_back(s);
  return sizes;
}

std::int64_t nowNs() { return schedcache::realtimeNs(); }

// What a run depends on besides its sizes: a run made under another fingerprint is not resumed or restored. The
// topology enters by its shape only: probes refine bandwidths and latencies all the time, and a small change must not
// restart every synthesis (the next interval's run uses the refined topology).
std::string fingerprint(const Config& c, const core::Topology& t) {
  return fmt::format("{}|{}x{}|{}|{}|r{}|c{}|s{}|{}|{}", t.name, t.nodes, t.gpusPerNode, c.proposer, c.evaluator,
                     c.rounds, c.candidatesPerRound, c.seed, c.proposer == "llm" ? c.llm.endpoint : "",
                     c.proposer == "llm" ? c.llm.model : "");
}

core::Diagnostic diag(const fs::path& file, std::string message) {
  return core::Diagnostic{file.string(), 0, 0, std::move(message)};
}

std::optional<json> readJson(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

using detail::writeFileAtomic;

std::string utcStamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}Z", buf, ms);
}

// Directories named by a plan hash (16 hex digits), newest first, beyond `keep` are removed, except `protect`.
void gcHashDirs(const fs::path& dir, int keep, std::uint64_t protect) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || !schedcache::parseHash(name)) continue;
    dirs.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = static_cast<std::size_t>(keep); i < dirs.size(); ++i) {
    if (schedcache::parseHash(dirs[i].second.filename().string()) == protect) continue;
    fs::remove_all(dirs[i].second, ec);
  }
}

// Copies a directory tree to `to` (which must not exist) under a temporary name, then renames it into place. When
// `to` appears meanwhile (another node's daemon or an earlier pass wrote the same plan), that one is kept.
bool copyDirAtomic(const fs::path& from, const fs::path& to, std::string* error) {
  std::error_code ec;
  if (fs::exists(to / "plan.json", ec)) return true;
  const fs::path tmp = to.parent_path() / fmt::format(".tmp-{}-{}", to.filename().string(), getpid());
  fs::remove_all(tmp, ec);
  fs::copy(from, tmp, fs::copy_options::recursive, ec);
  if (ec) {
    *error = fmt::format("cannot copy {} to {}: {}", from.string(), tmp.string(), ec.message());
    fs::remove_all(tmp, ec);
    return false;
  }
  fs::remove_all(to, ec);  // a partial directory without plan.json (a crash between copy and rename never leaves one)
  fs::rename(tmp, to, ec);
  if (ec) {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    if (fs::exists(to / "plan.json", ignore)) return true;
    *error = fmt::format("cannot rename {} to {}: {}", tmp.string(), to.string(), ec.message());
    return false;
  }
  return true;
}

}  // namespace

struct WorkLoop::Impl {
  struct CollState {
    fs::path runDir;  // the latest complete run of this collective
    std::vector<std::uint64_t> sizes;
    std::string fingerprint;
    std::int64_t finishedNs = 0;
    std::size_t historyRecords = 0;
  };

  Impl(Config c, core::Topology t, schedcache::Writer* w, Metrics* m, WorkGate* g, fs::path state)
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
  const fs::path workDir;  // <state dir>/<namespace>: runs/ and plans/

  // Only the work thread touches these.
  std::map<std::uint32_t, CollState> colls;  // by schedcache::Collective value
  bool restored = false;
  std::uint64_t lastPublished = 0;
  std::uint64_t lastShared = 0;
  std::uint64_t lastFollowed = 0;
  unsigned tmpCounter = 0;
  std::map<std::uint32_t, bool> exhaustedLogged;

  fs::path runsDir() const { return workDir / "runs"; }
  fs::path plansDir() const { return workDir / "plans"; }

  void error(const std::string& kind) const {
    if (metrics != nullptr) metrics->add("optiflowd_errors_total", 1, promLabels({{"kind", kind}}));
  }
  void add(const std::string& name, double v, const std::string& labels = "") const {
    if (metrics != nullptr) metrics->add(name, v, labels);
  }

  bool checkpoint(const std::atomic<bool>& stop) const {
    return gate != nullptr ? gate->checkpoint(stop) : !stop.load();
  }

  std::optional<schedcache::Activity> activity() const {
    schedcache::Error err;
    std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns, &err);
    if (!reader) return std::nullopt;
    return reader->activity();
  }

  std::uint64_t currentHash() const {
    schedcache::Error err;
    std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns, &err);
    schedcache::PlanInfo info;
    if (!reader || reader->current(&info) != schedcache::Status::kOk) return 0;
    return info.contentHash;
  }

  // After a restart, the newest complete run per collective made under the same fingerprint counts as done (and
  // as the base of the next interval's run): a restart does not redo hours of synthesis.
  void restore(const std::string& fp) {
    restored = true;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(plansDir(), ec)) {
      if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path(), ec);  // a crash's leftovers
    }
    for (const fs::directory_entry& e : fs::directory_iterator(runsDir(), ec)) {
      const std::optional<json> meta = readJson(e.path() / kDaemonFile);
      if (!meta || !fs::exists(e.path() / "plan.json", ec)) continue;
      try {
        const auto coll = schedcache::parseCollective(meta->at("collective").get<std::string>());
        if (!coll || meta->at("fingerprint").get<std::string>() != fp) continue;
        CollState st;
        st.runDir = e.path();
        st.sizes = meta->at("sizes").get<std::vector<std::uint64_t>>();
        st.fingerprint = fp;
        st.finishedNs = meta->at("finished_ns").get<std::int64_t>();
        st.historyRecords = meta->value("history_records", std::size_t{0});
        const auto c = static_cast<std::uint32_t>(*coll);
        auto it = colls.find(c);
        if (it == colls.end() || it->second.finishedNs < st.finishedNs) colls[c] = std::move(st);
      } catch (const json::exception&) {
        continue;  // not a run this daemon wrote
      }
    }
    for (const auto& [c, st] : colls) {
      spdlog::info("work: restored the {} run {} ({} sizes)", collName(c), st.runDir.string(), st.sizes.size());
    }
  }

  // Why the workload needs a synthesis now, or nullptr when it does not.
  const char* due(std::uint32_t c, const std::vector<std::uint64_t>& sizes, const std::string& fp, double intervalS) {
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

  fs::path newRunDir(std::uint32_t c) {
    fs::path dir = runsDir() / fmt::format("{}-{}", collName(c), utcStamp());
    std::error_code ec;
    for (int n = 1; fs::exists(dir, ec); ++n) dir = runsDir() / fmt::format("{}-{}-{}", collName(c), utcStamp(), n);
    return dir;
  }

  // One workload's synthesis into a new run directory: its rounds, or nullopt when stop was requested (nothing of
  // an interrupted run is kept).
  core::Result<std::optional<int>> synthesize(const Workload& w, const Config& cfg, const core::Topology& topo,
                                              const std::string& fp, const std::atomic<bool>& stop) {
    const std::string name = collName(w.collective);
    const std::optional<core::Collective> coll = core::parseCollective(name);
    if (!coll) return diag("<work>", fmt::format("collective {} has no synthesis", name));
    synth::SynthesisSpec spec;
    synth::SynthConfig& sc = spec.config;
    sc.collective = *coll;
    sc.sizes = w.sizes;
    sc.rounds = cfg.rounds;
    sc.candidatesPerRound = cfg.candidatesPerRound;
    // No more evaluation threads than the CPU budget has cores: the budget then holds at every instant, not only on
    // average (the gate's token bucket still accounts for the whole process).
    sc.threads = std::max(1, static_cast<int>(std::ceil(cfg.cpuCores)));
    spec.proposer = cfg.proposer;
    spec.seed = cfg.seed;
    spec.evaluator = cfg.evaluator;
    if (cfg.proposer == "llm") {
      spec.llm.baseUrl = cfg.llm.endpoint;
      spec.llm.model = cfg.llm.model;
      const char* key = cfg.llm.apiKeyEnv.empty() ? nullptr : std::getenv(cfg.llm.apiKeyEnv.c_str());
      spec.llm.apiKey = key != nullptr ? key : "";
      spec.llm.timeoutS = cfg.llm.timeoutS;
      spec.llm.maxAttempts = 2;  // a dead endpoint must not hold a pass for minutes: the builtin proposer stands in
    }
    // The same workload under the same config continues its earlier search instead of repeating it.
    auto prev = colls.find(w.collective);
    if (prev != colls.end() && prev->second.sizes == w.sizes && prev->second.fingerprint == fp) {
      spec.resumeFrom = prev->second.runDir / "history.jsonl";
    }
    const fs::path dir = newRunDir(w.collective);
    spec.runDir = dir;

    auto prepared = synth::Synthesis::prepare(topo, spec);
    if (!prepared && spec.resumeFrom && prepared.error().file == spec.resumeFrom->string()) {
      spdlog::warn("work: not resuming {}: {}", name, prepared.error().str());
      spec.resumeFrom.reset();
      prepared = synth::Synthesis::prepare(topo, spec);
    }
    if (!prepared) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      const core::Diagnostic& d = prepared.error();
      // The config's own mistakes name the config file.
      return d.file == "<synthesis>" ? diag(cfg.file, "[synthesis] " + d.message) : d;
    }
    spdlog::info("work: synthesizing {} at {} sizes ({} .. {}), {} proposer, {} rounds of {}{}", name, w.sizes.size(),
                 core::formatSize(w.sizes.front()), core::formatSize(w.sizes.back()), cfg.proposer, sc.rounds,
                 sc.candidatesPerRound, spec.resumeFrom ? ", resuming the previous run" : "");
    synth::SynthesisHooks hooks;
    hooks.progress = [&](const synth::ProgressEvent& e) {
      using Kind = synth::ProgressEvent::Kind;
      if (e.kind == Kind::Candidate) {
        add("optiflowd_synthesis_candidates_total", 1);
      } else if (e.kind == Kind::RoundEnd) {
        add("optiflowd_synthesis_rounds_total", 1);
      }
    };
    hooks.keepGoing = [&] { return checkpoint(stop); };
    const synth::SynthesisOutcome ran = prepared->run(hooks);
    if (ran.stopped || ran.error) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (ran.stopped) return std::optional<int>();
      return *ran.error;
    }
    const synth::SynthResult& res = ran.result;
    CollState st;
    st.runDir = dir;
    st.sizes = w.sizes;
    st.fingerprint = fp;
    st.finishedNs = nowNs();
    st.historyRecords = res.history.size();
    const json meta = {{"collective", name},
                       {"sizes", st.sizes},
                       {"fingerprint", fp},
                       {"finished_ns", st.finishedNs},
                       {"history_records", st.historyRecords},
                       {"stop_reason", res.stopReason}};
    if (!writeFileAtomic(dir / kDaemonFile, meta.dump(2) + "\n")) {
      return diag(dir / kDaemonFile, "cannot write the run's daemon record");
    }

    int led = 0;
    for (const synth::SizeBest& sb : res.sizes) {
      if (sb.best < 0 || sb.bestUs <= 0) continue;
      ++led;
      if (metrics != nullptr && sb.nccl.timeUs > 0) {
        metrics->set("optiflowd_best_speedup", sb.nccl.timeUs / sb.bestUs,
                     promLabels({{"collective", name}, {"size", std::to_string(sb.sizeBytes)}}));
      }
    }
    spdlog::info("work: {} done in {:.1f} s, {} rounds ({}), best found at {}/{} sizes: {}", name, res.elapsedS,
                 res.roundsRun, res.stopReason, led, res.sizes.size(), dir.string());
    colls[w.collective] = std::move(st);
    gcRuns(w.collective);
    return std::optional<int>(res.roundsRun);
  }

  void gcRuns(std::uint32_t c) {
    const std::string prefix = collName(c) + "-";
    std::vector<fs::path> runs;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(runsDir(), ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(prefix, 0) == 0 && n.size() > prefix.size() && n[prefix.size()] >= '0' && n[prefix.size()] <= '9') {
        runs.push_back(e.path());
      }
    }
    std::sort(runs.begin(), runs.end(), std::greater<>());  // names are UTC stamps: newest first
    for (std::size_t i = kKeepRunsPerCollective; i < runs.size(); ++i) {
      if (runs[i] != colls[c].runDir) fs::remove_all(runs[i], ec);
    }
  }

  // The latest run of every collective, merged into one plan directory named by its content hash:
  // plans/<hash>/plan.json with the runs' "collectives" concatenated, and their schedules and winning programs.
  core::Result<fs::path> mergeRuns() {
    const fs::path tmp = plansDir() / fmt::format(".tmp-{}-{}", getpid(), tmpCounter++);
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp / "schedules", ec);
    fs::create_directories(tmp / "programs", ec);
    if (ec) return diag(tmp, fmt::format("cannot create the plan directory: {}", ec.message()));

    std::vector<synth::PlanFile> plans;
    std::vector<std::string> runs;
    for (const auto& [c, st] : colls) {
      auto plan = synth::readPlan(st.runDir / "plan.json");
      if (!plan) {
        fs::remove_all(tmp, ec);
        return plan.error();
      }
      // The files each best names move into the merged directory; candidate ids repeat across runs, so the
      // collective's name keeps the programs apart.
      for (synth::PlanCollective& coll : plan->collectives) {
        for (synth::PlanEntry& entry : coll.entries) {
          if (!entry.best) continue;
          for (std::string* rel : {&entry.best->scheduleJson, &entry.best->scheduleXml}) {
            const fs::path from = st.runDir / *rel;
            const fs::path to = fs::path("schedules") / fs::path(*rel).filename();
            fs::copy_file(from, tmp / to, fs::copy_options::overwrite_existing, ec);
            if (ec) {
              const std::string msg = ec.message();
              fs::remove_all(tmp, ec);
              return diag(from, fmt::format("cannot copy into the merged plan: {}", msg));
            }
            *rel = to.string();
          }
          if (!entry.best->programFile.empty()) {
            const fs::path rel = entry.best->programFile;
            const fs::path renamed = fs::path("programs") / fmt::format("{}-{}", collName(c), rel.filename().string());
            std::error_code pec;  // a program is shown, not served: a missing one does not stop the merge
            fs::copy_file(st.runDir / rel, tmp / renamed, fs::copy_options::overwrite_existing, pec);
            entry.best->programFile = renamed.string();
          }
        }
      }
      plans.push_back(std::move(plan).value());
      runs.push_back(st.runDir.string());
    }
    auto wrote = synth::writePlan(tmp / "plan.json", synth::mergePlans(plans, runs));
    if (!wrote) {
      fs::remove_all(tmp, ec);
      return wrote.error();
    }
    return finalizePlanDir(tmp);
  }

  // Moves a complete plan directory to plans/<hash> (or drops it when that plan is already there).
  core::Result<fs::path> finalizePlanDir(const fs::path& tmp, std::uint64_t expected = 0) {
    std::error_code ec;
    auto plan = synth::loadPlanForCache(tmp, /*verify=*/false);
    if (!plan) {
      fs::remove_all(tmp, ec);
      return plan.error();
    }
    const std::uint64_t hash = schedcache::contentHash(*plan);
    if (expected != 0 && hash != expected) {
      fs::remove_all(tmp, ec);
      return diag(tmp, fmt::format("holds plan {}, expected {}", schedcache::formatHash(hash),
                                   schedcache::formatHash(expected)));
    }
    const fs::path dest = plansDir() / schedcache::formatHash(hash);
    if (fs::exists(dest / "plan.json", ec)) {
      fs::remove_all(tmp, ec);
      return dest;
    }
    fs::remove_all(dest, ec);
    fs::rename(tmp, dest, ec);
    if (ec) {
      const std::string msg = ec.message();
      fs::remove_all(tmp, ec);
      return diag(dest, fmt::format("cannot move the plan directory into place: {}", msg));
    }
    return dest;
  }

  // Verifies every schedule of the plan in `dir` and makes it current (a no-op when it already is).
  core::Result<bool> publish(const fs::path& dir, PassResult& out) {
    auto plan = synth::loadPlanForCache(dir, /*verify=*/true);
    if (!plan) return plan.error();
    schedcache::Error err;
    const std::optional<schedcache::PublishResult> pr = writer->publish(*plan, &err);
    if (!pr) return diag(dir, fmt::format("not published: {}", err.message));
    lastPublished = pr->hash;
    out.planHash = pr->hash;
    out.planDir = dir;
    if (!pr->unchanged) {
      out.published = true;
      add("optiflowd_plans_published_total", 1);
      spdlog::info("work: published plan {} ({} entries, generation {}) from {}; new communicators use it",
                   schedcache::formatHash(pr->hash), plan->items.size(), pr->generation, dir.string());
    }
    gcHashDirs(plansDir(), kKeepPlans, pr->hash);
    return true;
  }

  // Leader: the plan goes to <share>/<hash>/, then <share>/current names it (replaced by a rename, so followers
  // read the old name or the new one, and the directory it names is complete before it is named).
  core::Result<bool> share(const fs::path& shareDir, const fs::path& planDir, std::uint64_t hash) {
    std::error_code ec;
    fs::create_directories(shareDir, ec);
    if (ec) return diag(shareDir, fmt::format("cannot create the share directory: {}", ec.message()));
    const std::string name = schedcache::formatHash(hash);
    std::string error;
    if (!copyDirAtomic(planDir, shareDir / name, &error)) return diag(shareDir, error);
    if (!writeFileAtomic(shareDir / kShareCurrent, fmt::format("{} {}\n", name, name))) {
      return diag(shareDir / kShareCurrent, "cannot write");
    }
    lastShared = hash;
    gcHashDirs(shareDir, kKeepPlans, hash);
    spdlog::info("work: shared plan {} in {}", name, shareDir.string());
    return true;
  }

  // Follower: publishes the plan <share>/current names, once, after checking it is what the name says.
  core::Result<PassResult> follow(const Config& cfg) {
    PassResult out;
    out.planHash = lastFollowed;
    if (cfg.shareDir.empty()) {
      error("share");
      return diag(cfg.file, "[share] role = \"follower\" needs share_dir");
    }
    const fs::path currentFile = cfg.shareDir / kShareCurrent;
    std::ifstream in(currentFile);
    if (!in) {
      spdlog::debug("work: {} does not exist yet: the leader has not shared a plan", currentFile.string());
      out.planHash = currentHash();
      return out;
    }
    std::string hashText;
    std::string dirName;
    in >> hashText >> dirName;
    const std::optional<std::uint64_t> hash = schedcache::parseHash(hashText);
    // Only a plain directory name: the file must not send the daemon elsewhere on the filesystem.
    if (!hash || dirName.empty() || dirName.find('/') != std::string::npos || dirName.front() == '.') {
      error("share");
      return diag(currentFile, fmt::format("expected \"<plan hash: 16 hex digits> <directory name>\", got \"{} {}\"",
                                           hashText, dirName));
    }
    if (*hash == lastFollowed) return out;
    const fs::path tmp = plansDir() / fmt::format(".tmp-{}-{}", getpid(), tmpCounter++);
    std::error_code ec;
    fs::create_directories(plansDir(), ec);
    fs::remove_all(tmp, ec);
    fs::copy(cfg.shareDir / dirName, tmp, fs::copy_options::recursive, ec);
    if (ec) {
      error("share");
      const std::string msg = ec.message();
      fs::remove_all(tmp, ec);
      return diag(cfg.shareDir / dirName, fmt::format("cannot copy the shared plan: {}", msg));
    }
    auto dir = finalizePlanDir(tmp, *hash);
    if (!dir) {
      error("share");
      return diag(cfg.shareDir / dirName, fmt::format("named by {}: {}", currentFile.string(), dir.error().str()));
    }
    auto published = publish(*dir, out);
    if (!published) {
      error("publish");
      return published.error();
    }
    lastFollowed = *hash;
    return out;
  }
};

WorkLoop::WorkLoop(Config config, core::Topology topology, schedcache::Writer* writer, Metrics* metrics, WorkGate* gate,
                   std::filesystem::path stateDir)
    : impl_(
          std::make_unique<Impl>(std::move(config), std::move(topology), writer, metrics, gate, std::move(stateDir))) {
  if (metrics != nullptr) {
    metrics->describe("optiflowd_plans_published_total", "counter", "Plans made current in the schedule cache");
    metrics->describe("optiflowd_synthesis_rounds_total", "counter", "Synthesis rounds run");
    metrics->describe("optiflowd_synthesis_candidates_total", "counter", "Synthesis candidates evaluated");
    metrics->describe("optiflowd_best_speedup", "gauge",
                      "NCCL's own choice's simulated time over the best synthesized schedule's, per size");
    metrics->describe("optiflowd_errors_total", "counter", "Errors by kind");
    metrics->add("optiflowd_plans_published_total", 0);
    metrics->add("optiflowd_synthesis_rounds_total", 0);
    metrics->add("optiflowd_synthesis_candidates_total", 0);
  }
}

WorkLoop::~WorkLoop() = default;

void WorkLoop::setTopology(core::Topology topology) {
  std::lock_guard lock(impl_->mutex);
  impl_->topology = std::move(topology);
}

void WorkLoop::setConfig(Config config) {
  std::lock_guard lock(impl_->mutex);
  impl_->config = std::move(config);
}

core::Result<PassResult> WorkLoop::runOnce(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  Config cfg;
  std::optional<core::Topology> topo;
  {
    std::lock_guard lock(m.mutex);
    cfg = m.config;
    topo = m.topology;
  }
  if (m.writer == nullptr) return diag("<work>", "no schedule cache writer");
  if (cfg.role == Role::kFollower) return m.follow(cfg);

  PassResult out;
  const std::string fp = fingerprint(cfg, *topo);
  std::error_code ec;
  fs::create_directories(m.runsDir(), ec);
  fs::create_directories(m.plansDir(), ec);
  if (ec) {
    m.error("synthesis");
    return diag(m.workDir, fmt::format("cannot create the state directory: {}", ec.message()));
  }
  if (!m.restored) m.restore(fp);

  // What the node's jobs call, else what the config says to prepare for.
  std::vector<Workload> workloads;
  if (const std::optional<schedcache::Activity> act = m.activity()) workloads = workloadsFrom(*act);
  if (workloads.empty()) {
    const std::vector<std::uint64_t> sizes = cfg.sizes.empty() ? defaultSizes() : cfg.sizes;
    for (const std::string& name : cfg.collectives) {
      const std::optional<schedcache::Collective> c = schedcache::parseCollective(name);
      if (!c) continue;  // loadConfig rejects these
      workloads.push_back(Workload{static_cast<std::uint32_t>(*c), sizes, 0});
    }
  }

  std::optional<core::Diagnostic> firstError;
  auto fail = [&](const char* kind, const core::Diagnostic& d) {
    m.error(kind);
    spdlog::error("work: {}", d.str());
    if (!firstError) firstError = d;
  };
  // Merges the latest runs and publishes them. Called after each workload: the first plan appears after the first
  // workload, and a stop or a failure later in the pass loses nothing that finished.
  auto mergeAndPublish = [&] {
    auto dir = m.mergeRuns();
    if (!dir) return fail("publish", dir.error());
    auto published = m.publish(*dir, out);
    if (!published) fail("publish", published.error());
  };
  bool pending = m.lastPublished == 0 && !m.colls.empty();  // restored runs this process has not published yet
  for (const Workload& w : workloads) {
    const char* why = m.due(w.collective, w.sizes, fp, cfg.intervalS);
    if (why == nullptr) continue;
    std::optional<int> rounds;
    if (m.checkpoint(stop)) {
      spdlog::info("work: {} is due: {}", collName(w.collective), why);
      auto ran = m.synthesize(w, cfg, *topo, fp, stop);
      if (!ran) {
        fail("synthesis", ran.error());
        continue;
      }
      rounds = *ran;
    }
    if (!rounds) {
      out.interrupted = true;
      spdlog::info("work: stopping: the pass ends before {} is done", collName(w.collective));
      break;
    }
    ++out.workloads;
    out.rounds += *rounds;
    mergeAndPublish();
    pending = false;
  }
  if (pending && !out.interrupted) mergeAndPublish();
  if (cfg.role == Role::kLeader && !cfg.shareDir.empty() && m.lastPublished != 0 && m.lastPublished != m.lastShared) {
    const fs::path dir = m.plansDir() / schedcache::formatHash(m.lastPublished);
    auto shared = m.share(cfg.shareDir, dir, m.lastPublished);
    if (!shared) {
      m.error("share");
      spdlog::error("work: {}", shared.error().str());
      if (!firstError) firstError = shared.error();
    }
  }
  if (out.planHash == 0) out.planHash = m.currentHash();
  if (firstError) return *firstError;
  return out;
}

}  // namespace optiflow::daemon
