// The pass: WorkLoop::runOnce synthesizes each due workload into a run, merges the runs and publishes the plan into
// the schedule cache (a follower publishes the leader's instead).
#include "optiflow/daemon/work.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "optiflow/core/units.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/sim/calibration.h"
#include "optiflow/synth/cache_plan.h"
#include "optiflow/synth/llm_client.h"
#include "optiflow/synth/loop.h"
#include "optiflow/synth/service.h"
#include "work_impl.h"

namespace optiflow::daemon {

namespace {

namespace fs = std::filesystem;

using detail::collName;
using detail::diag;
using detail::fingerprint;
using detail::nowNs;

}  // namespace

std::uint64_t WorkLoop::Impl::currentHash() const {
  schedcache::Error err;
  std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns, &err);
  schedcache::PlanInfo info;
  if (!reader || reader->current(&info) != schedcache::Status::kOk) return 0;
  return info.contentHash;
}

// One workload's synthesis into a new run directory: its rounds, or nullopt when stop was requested (nothing of
// an interrupted run is kept).
core::Result<std::optional<int>> WorkLoop::Impl::synthesize(const Workload& w, const Config& cfg,
                                                            const core::Topology& topo, const std::string& fp,
                                                            const std::atomic<bool>& stop) {
  const std::string name = collName(w.collective);
  const std::optional<core::Collective> coll = core::collectiveFromNcclFunc(static_cast<int>(w.collective));
  if (!coll) return diag("<work>", fmt::format("collective {} has no synthesis", name));
  synth::SynthesisSpec spec;
  synth::SynthConfig& sc = spec.config;
  sc.collective = *coll;
  sc.sizes = w.sizes;
  sc.rounds = cfg.rounds;
  sc.candidatesPerRound = cfg.candidatesPerRound;
  // NCCL-tests graph launches are what the tuner's plans are compared at, as without a calibration.
  if (cfg.calibration) {
    sc.params = sim::calibratedSimParams(cfg.calibration->simulator.params, sim::LaunchMode::Graph);
    sc.ncclModel = cfg.calibration->ncclModel.params;
  }
  // No more evaluation threads than the CPU budget has cores: the budget then holds at every instant, not only on
  // average (the gate's token bucket still accounts for the whole process).
  sc.threads = std::max(1, static_cast<int>(std::ceil(cfg.cpuCores)));
  spec.proposer = cfg.proposer;
  spec.seed = cfg.seed;
  spec.evaluator = cfg.evaluator;
  if (cfg.proposer == "llm") {
    spec.llm = cfg.llm.client;
    const char* key = cfg.llm.apiKeyEnv.empty() ? nullptr : std::getenv(cfg.llm.apiKeyEnv.c_str());
    spec.llm.apiKey = key != nullptr ? key : "";
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
  auto recorded = writeRunRecord(name, st, res.stopReason);
  if (!recorded) return recorded.error();

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

// Verifies every schedule of the plan in `dir` and makes it current (a no-op when it already is).
core::Result<bool> WorkLoop::Impl::publish(const fs::path& dir, PassResult& out) {
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
  gcPlans(pr->hash);
  return true;
}

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
    metrics->describe("optiflowd_plan_entries", "gauge",
                      "Entries of the last merged plan by time_source: measured in running jobs or predicted");
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

  const std::vector<Workload> workloads = m.workloads(cfg);

  std::optional<core::Diagnostic> firstError;
  auto fail = [&](const char* kind, const core::Diagnostic& d) {
    m.error(kind);
    spdlog::error("work: {}", d.str());
    if (!firstError) firstError = d;
  };
  // Merges the latest runs and publishes them. Called after each workload: the first plan appears after the first
  // workload, and a stop or a failure later in the pass loses nothing that finished.
  RankOptions rank;
  rank.trialCalls = cfg.trialCalls;
  auto mergeAndPublish = [&](bool onlyIfChanged) {
    auto dir = m.mergeRuns(rank, onlyIfChanged);
    if (!dir) return fail("publish", dir.error());
    if (dir->empty()) return;
    auto published = m.publish(*dir, out);
    if (!published) {
      m.lastMergeSignature.clear();  // the next pass tries again
      fail("publish", published.error());
    }
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
    mergeAndPublish(false);
    pending = false;
  }
  if (pending && !out.interrupted) {
    mergeAndPublish(false);
  } else if (out.workloads == 0 && !out.interrupted && !m.colls.empty() && m.lastPublished != 0) {
    // No synthesis this pass: the jobs' measurements may still change what the plan decides.
    mergeAndPublish(true);
  }
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
