#include "optiflow/synth/loop.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "optiflow/compiler/verifier.h"
#include "optiflow/core/parallel.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/units.h"
#include "optiflow/dsl/parser.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/sim/nccl_schedules.h"

namespace optiflow::synth {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string configOf(const compiler::CompileOptions& o, const Evaluation& e) {
  if (e.compiled) {
    return fmt::format("{}/{}ch/{}sl", core::toString(e.compiled->protocol), e.compiled->channels, e.compiled->slices);
  }
  return fmt::format("{}/{}ch/{}sl", o.protocol ? core::toString(*o.protocol) : "auto", o.channels, o.slices);
}

NativeChoice nativeOf(const sim::NcclPrediction& p, double timeUs) {
  return {std::string(core::toString(p.algorithm)), std::string(core::toString(p.protocol)), p.channels, timeUs};
}

// The search for the best NCCL-native configuration skips schedules larger than this: on a thousand GPUs one ring
// per channel is millions of steps, and a few such simulations would take longer than the whole synthesis.
constexpr std::uint64_t kMaxSweepSteps = 2'000'000;

// NCCL's own choice, and the fastest NCCL-native configuration (algorithm x protocol x channel count) timed by the
// evaluator: what the tuner plugin would set. Only configurations NCCL's model allows (time >= 0) are tried.
void baselines(const core::Topology& topo, const SynthConfig& cfg, Evaluator& ev, const sim::NcclTuning& tuning,
               SizeBest& sb) {
  const sim::NcclPrediction pred = sim::ncclPredict(tuning, cfg.collective, sb.sizeBytes);
  if (!pred.ok()) {
    sb.nccl.algorithm = "n/a";
    return;
  }
  sim::NcclScheduleOptions base;
  base.root = cfg.root;
  int skipped = 0;
  // 0 when there is no schedule, or when its lower bound shows it cannot beat `beat` (> 0).
  auto timeOf = [&](const sim::NcclPrediction& p, double beat) -> double {
    auto s = sim::ncclScheduleFor(topo, cfg.collective, p, base);
    if (!s) return 0;
    sim::SimParams params = sim::ncclSimParams(p, cfg.params);
    if (beat > 0 && ev.boundNccl(*s, sb.sizeBytes, params) >= beat) return 0;
    if (beat > 0 && core::totalSteps(*s) > kMaxSweepSteps) {
      ++skipped;
      return 0;
    }
    // Only whether it beats `beat` matters: the simulation may stop once it cannot.
    params.stopAtUs = beat;
    return ev.timeNccl(*s, sb.sizeBytes, params);
  };
  sb.nccl = nativeOf(pred, timeOf(pred, 0));
  sim::ModelCalibration noLaunch = cfg.ncclModel;
  noLaunch.launchGraphUs = 0.0;
  const double modelUs = sim::calibratedNcclTimeUs(pred, noLaunch, sim::LaunchMode::Graph);
  sb.ncclModelUs = modelUs > 0 ? modelUs + cfg.params.launchUs : 0;
  sb.bestNative = sb.nccl;
  const int maxChannels = std::max({tuning.commChannels, pred.channels, 1});
  for (int a = 0; a < core::kNumAlgorithms; ++a) {
    for (int pr = 0; pr < core::kNumProtocols; ++pr) {
      if (pred.time[static_cast<std::size_t>(a)][static_cast<std::size_t>(pr)] < 0) continue;
      for (int ch = 1; ch <= maxChannels; ch *= 2) {
        sim::NcclPrediction p = pred;
        p.algorithm = static_cast<core::Algorithm>(a);
        p.protocol = static_cast<core::Protocol>(pr);
        p.channels = ch;
        if (p.algorithm == pred.algorithm && p.protocol == pred.protocol && p.channels == pred.channels) continue;
        const double t = timeOf(p, sb.bestNative.timeUs);
        if (t > 0 && (sb.bestNative.timeUs <= 0 || t < sb.bestNative.timeUs)) sb.bestNative = nativeOf(p, t);
      }
    }
  }
  if (skipped > 0) {
    spdlog::info("NCCL-native search at {}: {} configuration(s) above {} steps not simulated (NCCL's own choice is)",
                 core::formatSize(sb.sizeBytes), skipped, kMaxSweepSteps);
  }
}

class Loop {
 public:
  Loop(const core::Topology& topo, const SynthConfig& cfg, Proposer& proposer, Evaluator& ev,
       const std::function<void(const ProgressEvent&)>& progress, const std::function<bool()>& keepGoing)
      : topo_(topo), cfg_(cfg), proposer_(proposer), ev_(ev), progress_(progress), keepGoing_(keepGoing) {}

  SynthResult run() {
    start_ = Clock::now();
    if (cfg_.timeBudgetS > 0) {
      deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.timeBudgetS));
    }
    const sim::BoundModel bounds(topo_);
    const auto& eff = cfg_.params.linkEfficiency;
    const sim::BoundModel effBounds(sim::effectiveTopology(topo_, eff[0], eff[1], eff[2]));
    const sim::NcclTuning tuning = sim::ncclTune(topo_);
    res_.sizes.resize(cfg_.sizes.size());
    for (std::size_t s = 0; s < cfg_.sizes.size(); ++s) {
      SizeBest& sb = res_.sizes[s];
      sb.sizeBytes = cfg_.sizes[s];
      sb.boundUs = bounds.bound(cfg_.collective, sb.sizeBytes).timeUs;
      sb.effectiveBoundUs = effBounds.bound(cfg_.collective, sb.sizeBytes).timeUs;
    }
    // Baselines per size in parallel, largest first (they take longest): independent of the thread count.
    parallelOverSizes(allSizes(), [&](std::size_t s) {
      try {
        baselines(topo_, cfg_, ev_, tuning, res_.sizes[s]);
      } catch (const std::exception& e) {  // out of memory on a huge cluster: the table says n/a, the run goes on
        spdlog::error("NCCL baseline at {}: {}", core::formatSize(res_.sizes[s].sizeBytes), e.what());
        res_.sizes[s].nccl = NativeChoice{};
        res_.sizes[s].nccl.algorithm = "n/a";
        res_.sizes[s].bestNative = res_.sizes[s].nccl;
      }
    });
    emit({ProgressEvent::Kind::Baselines});
    if (stopRequested()) return finish();
    resume();

    int stale = 0;
    int round = 0;
    for (const CandidateRecord& r : res_.history) round = std::max(round, r.round + 1);
    res_.stopReason = "round budget";
    for (int done = 0; done < cfg_.rounds; ++done, ++round) {
      if (outOfTime()) {
        res_.stopReason = "time budget";
        break;
      }
      ProposalContext ctx{topo_,        cfg_.collective, cfg_.sizes, round, cfg_.candidatesPerRound,
                          res_.history, bestIndices()};
      std::vector<Candidate> cands = proposer_.propose(ctx);
      if (cands.empty()) {
        res_.stopReason = "the proposer has nothing new";
        break;
      }
      emit({ProgressEvent::Kind::RoundStart, round, 0, static_cast<int>(cands.size())});
      bool improved = false;
      bool timeUp = false;
      // A measuring evaluator: the round's records are announced (and written to the history) once measured.
      const bool measuring = ev_.measuresRounds();
      std::vector<std::pair<int, std::size_t>> pending;  // (candidate index in the round, history index)
      auto announce = [&] {
        for (const auto& [k, h] : pending) {
          emit({ProgressEvent::Kind::Candidate, round, k, static_cast<int>(cands.size()), &res_.history[h]});
        }
        pending.clear();
      };
      for (std::size_t k = 0; k < cands.size(); ++k) {
        if (outOfTime()) {
          timeUp = true;
          break;
        }
        improved |= evaluateCandidate(round, static_cast<int>(k), cands[k], cands.size() - k);
        // A candidate cut short may still be evaluated at more sizes (finishCutShort): it and the ones after it
        // are announced at the round's end, in order.
        if (measuring || !cutShort_.empty()) {
          pending.emplace_back(static_cast<int>(k), res_.history.size() - 1);
        } else {
          emit({ProgressEvent::Kind::Candidate, round, static_cast<int>(k), static_cast<int>(cands.size()),
                &res_.history.back()});
        }
        if (stopRequested()) {
          unmeasured(round, "the run stopped before the round was measured");
          announce();
          return finish();
        }
      }
      if (!cutShort_.empty()) improved |= finishCutShort();
      if (measuring) improved |= measureRound(round);
      announce();
      ++res_.roundsRun;
      emit({ProgressEvent::Kind::RoundEnd, round, static_cast<int>(cands.size()), static_cast<int>(cands.size())});
      if (timeUp) {
        res_.stopReason = "time budget";
        break;
      }
      stale = improved ? 0 : stale + 1;
      if (cfg_.patience > 0 && stale >= cfg_.patience) {
        res_.stopReason = "converged";
        break;
      }
    }
    return finish();
  }

 private:
  bool stopRequested() {
    if (!keepGoing_ || keepGoing_()) return false;
    res_.stopped = true;
    res_.stopReason = "stopped";
    return true;
  }

  SynthResult finish() {
    res_.elapsedS = secondsSince(start_);
    return std::move(res_);
  }

  void emit(ProgressEvent e) {
    if (!progress_) return;
    e.result = &res_;
    progress_(e);
  }

  // Runs fn(s) for the sizes `sizes` (indices into cfg_.sizes, ascending) on cfg_.threads (default
  // hardware_concurrency) threads, largest size first.
  void parallelOverSizes(const std::vector<std::size_t>& sizes, const std::function<void(std::size_t)>& fn) const {
    const std::size_t n = sizes.size();
    core::parallelFor(n, cfg_.threads, [&](std::size_t i) { fn(sizes[n - 1 - i]); });
  }

  std::vector<std::size_t> allSizes() const {
    std::vector<std::size_t> all(cfg_.sizes.size());
    for (std::size_t s = 0; s < all.size(); ++s) all[s] = s;
    return all;
  }

  bool outOfTime() const { return deadline_ && Clock::now() >= *deadline_; }

  std::vector<int> bestIndices() const {
    std::vector<int> out;
    for (const SizeBest& sb : res_.sizes) out.push_back(sb.best);
    return out;
  }

  static std::string canonical(dsl::Program p) {
    p.name.clear();
    dsl::clearSourceLocs(p);
    return dsl::printProgram(p);
  }

  // An earlier run's candidates join the history as they were; the ones that led a size are evaluated again
  // there (deterministically the same time) so that this run has their schedules.
  void resume() {
    if (cfg_.resume.empty()) return;
    std::set<std::size_t> leaders;
    for (std::size_t s = 0; s < cfg_.sizes.size(); ++s) {
      int best = -1;
      for (std::size_t i = 0; i < cfg_.resume.size(); ++i) {
        const CandidateRecord& r = cfg_.resume[i];
        if (r.stage != "ok" || s >= r.sizes.size() || !r.sizes[s].ok || r.sizes[s].sizeBytes != cfg_.sizes[s]) {
          continue;
        }
        if (best < 0 || r.sizes[s].timeUs < cfg_.resume[static_cast<std::size_t>(best)].sizes[s].timeUs) {
          best = static_cast<int>(i);
        }
      }
      if (best >= 0) leaders.insert(static_cast<std::size_t>(best));
    }
    for (const CandidateRecord& r : cfg_.resume) {
      res_.history.push_back(r);
      if (r.stage == "ok" && !r.text.empty()) {
        auto parsed = dsl::parseProgram(r.text, r.id);
        if (parsed.ok()) seen_.insert(canonical(*parsed.program));
      }
    }
    for (std::size_t i : leaders) {
      const CandidateRecord& r = cfg_.resume[i];
      const Frontend f = parseAndExpand(r.text, r.id, topo_, expandOptions());
      if (!f.ok()) continue;
      for (std::size_t s = 0; s < cfg_.sizes.size(); ++s) {
        Evaluation e = ev_.evaluate(*f.intent, cfg_.sizes[s], EvalHint{});
        SizeResult sr;
        const compiler::CompileOptions opts = e.options;
        offer(static_cast<int>(i), s, e, sr);
        if (res_.sizes[s].best == static_cast<int>(i)) incumbentOptions_[s] = opts;
      }
    }
  }

  dsl::ExpandOptions expandOptions() const {
    dsl::ExpandOptions o;
    o.root = cfg_.root;
    return o;
  }

  // Whether `e` is faster than the best at size s and would be taken once proven (offer). A measured best ranks
  // above any predicted time: only a measurement (measureRound) replaces it.
  bool beatsBest(std::size_t s, const Evaluation& e) const {
    const SizeBest& sb = res_.sizes[s];
    return e.ok && !e.boundOnly && e.timeUs >= sb.boundUs * (1 - 1e-9) && !sb.measured &&
           (sb.best < 0 || e.timeUs < sb.bestUs * (1 - 1e-9));
  }

  // Takes `e` as the best at size s when it is faster than the incumbent and proven; fills `sr`'s verdict.
  // Returns whether the best improved by more than minGain.
  bool offer(int index, std::size_t s, Evaluation& e, SizeResult& sr) {
    SizeBest& sb = res_.sizes[s];
    if (!e.ok || e.boundOnly) return false;
    if (e.timeUs < sb.boundUs * (1 - 1e-9)) {
      spdlog::error("BUG: candidate {} at {} is predicted at {:.2f} us, below the lower bound {:.2f} us", index,
                    core::formatSize(sb.sizeBytes), e.timeUs, sb.boundUs);
      sr.ok = false;
      sr.error =
          fmt::format("internal error: predicted {:.2f} us, below the lower bound {:.2f} us", e.timeUs, sb.boundUs);
      return false;
    }
    if (!beatsBest(s, e)) return false;
    prove(e);
    if (!e.ok) {
      spdlog::error("candidate {} at {}: {}", index, core::formatSize(sb.sizeBytes), e.error);
      sr.ok = false;
      sr.error = e.error;
      return false;
    }
    const bool gain = sb.best < 0 || e.timeUs < sb.bestUs * (1 - cfg_.minGain);
    sb.schedule = shared(index, std::move(e.compiled->schedule));
    sb.best = index;
    sb.bestUs = e.timeUs;
    sb.config = configOf(e.options, e);
    return gain;
  }

  // The schedule to hold as candidate `index`'s best: another size's copy when that size holds the same schedule.
  std::shared_ptr<const core::Schedule> shared(int index, core::Schedule&& schedule) const {
    for (const SizeBest& other : res_.sizes) {
      if (other.best == index && other.schedule && *other.schedule == schedule) return other.schedule;
    }
    return std::make_shared<const core::Schedule>(std::move(schedule));
  }

  // `left`: the round's candidates not yet evaluated, this one included (its share of the time budget).
  bool evaluateCandidate(int round, int k, const Candidate& cand, std::size_t left) {
    CandidateRecord rec;
    rec.id = fmt::format("r{}c{}", round, k);
    rec.round = round;
    rec.origin = cand.origin;
    rec.text = cand.text;
    const Frontend f = parseAndExpand(cand.text, rec.id + ".ofl", topo_, expandOptions());
    if (f.program) rec.name = f.program->name;
    if (!f.ok()) {
      rec.stage = std::string(toString(f.failedAt));
      rec.errors = f.message;
      res_.history.push_back(std::move(rec));
      return false;
    }
    if (f.intent->collective != cfg_.collective) {
      rec.stage = "expand";
      rec.errors = fmt::format("{}.ofl:1:1: this is a {} program; the run synthesizes {}", rec.id,
                               core::toString(f.intent->collective), core::toString(cfg_.collective));
      res_.history.push_back(std::move(rec));
      return false;
    }
    if (!seen_.insert(canonical(*f.program)).second) {
      rec.stage = "duplicate";
      rec.errors = "the same program (up to its name) was evaluated earlier in this run";
      res_.history.push_back(std::move(rec));
      return false;
    }
    rec.stage = "ok";
    const int index = static_cast<int>(res_.history.size());
    rec.sizes.resize(cfg_.sizes.size());
    const auto intent = std::make_shared<const core::IntentProgram>(std::move(*f.intent));
    const auto layouts = std::make_shared<LayoutBounds>();
    Evaluated done = evaluateSizes(index, *intent, layouts, allSizes(), left, rec);
    res_.history.push_back(std::move(rec));
    if (!done.unfinished.empty() && left > 1) cutShort_.push_back({index, intent, layouts, std::move(done.unfinished)});
    return done.improved;
  }

  struct Evaluated {
    bool improved = false;                // a best improved by more than minGain
    std::vector<std::size_t> unfinished;  // the sizes its share of the time budget did not cover
  };

  // Evaluates the candidate `index` (its record `rec`) at the sizes `sizes` (ascending), and offers the results.
  // `left`: the candidates not yet evaluated, this one included (its share of the time budget).
  Evaluated evaluateSizes(int index, const core::IntentProgram& intent, const std::shared_ptr<LayoutBounds>& layouts,
                          const std::vector<std::size_t>& sizes, std::size_t left, CandidateRecord& rec) {
    std::vector<Evaluation> evals(cfg_.sizes.size());
    std::vector<EvalHint> hints(cfg_.sizes.size());
    // Under a time budget a candidate gets an even share of what is left to the round's candidates not yet
    // evaluated, so that one that is slow to evaluate (a schedule that does not fold on 1024 GPUs) cannot use up
    // the budget of the others. A size it leaves unfinished is recorded as not evaluated; a candidate that finishes
    // early leaves its time to the ones after it.
    std::optional<Clock::time_point> share;
    double shareS = 0;
    if (deadline_) {
      const Clock::time_point now = Clock::now();
      share = now + (*deadline_ - now) / static_cast<long>(std::max<std::size_t>(left, 1));
      shareS = std::chrono::duration<double>(*share - now).count();
    }
    for (std::size_t s : sizes) {
      const SizeBest& sb = res_.sizes[s];
      hints[s].verify = false;
      hints[s].layouts = layouts;
      hints[s].deadline = share;
      if (sb.best >= 0) {
        hints[s].first = incumbentOptions_[s];
        // The screens compare simulated times: a measured best's own simulated time.
        hints[s].pruneAboveUs = (sb.measured ? sb.simulatedUs : sb.bestUs) * kScreenMargin;
        hints[s].stopAboveUs = slowestTimeRead(s);
      }
    }
    // The sizes of one candidate in parallel: each depends only on the state before the candidate, so the result
    // does not depend on the thread count. Largest sizes first (they take longest).
    // A result that beats the best is proven here too (offer takes it only proven): whether it does depends only on
    // the state before the candidate as well.
    parallelOverSizes(sizes, [&](std::size_t s) {
      evals[s] = ev_.evaluate(intent, cfg_.sizes[s], hints[s]);
      if (beatsBest(s, evals[s])) {
        prove(evals[s], hints[s].deadline);
      } else if (evals[s].compiled && !ev_.measuresRounds()) {
        // Nothing reads a schedule that is neither taken nor measured: freed now, not after the candidate's last size.
        evals[s].compiled->schedule = core::Schedule{};
      }
    });

    Evaluated out;
    for (std::size_t s : sizes) {
      Evaluation& e = evals[s];
      SizeResult& sr = rec.sizes[s];
      sr = SizeResult{};
      const SizeBest& sb = res_.sizes[s];
      sr.sizeBytes = cfg_.sizes[s];
      sr.boundUs = sb.boundUs;
      sr.ncclUs = sb.nccl.timeUs;
      sr.ok = e.ok;
      sr.error = e.error;
      if (e.outOfTime) out.unfinished.push_back(s);
      if (e.outOfTime && left > 1) {
        sr.error = fmt::format("not evaluated: its share of the time budget ran out ({:.1f} s, 1/{} of what was left)",
                               shareS, left);
      }
      if (e.ok) {
        sr.timeUs = e.timeUs;
        sr.config = configOf(e.options, e) + (e.boundOnly  ? " (screened: time_us is its lower bound)"
                                              : e.stopped  ? " (screened: simulated up to time_us, a lower bound)"
                                              : e.screened ? " (screened)"
                                                           : "");
        sr.bottleneck = e.bottleneck;
      }
      const compiler::CompileOptions opts = e.options;
      // What the round measures: every schedule that passed the screens (a full search, not cut short).
      if (ev_.measuresRounds() && e.ok && !e.boundOnly && !e.screened && e.compiled) {
        roundItems_.push_back({index, s, configOf(e.options, e), e.compiled->schedule});
      }
      if (offer(index, s, e, sr)) out.improved = true;
      if (res_.sizes[s].best == index) incumbentOptions_[s] = opts;
    }
    return out;
  }

  // After a round's candidates, what is left of the time budget goes to the sizes their shares did not cover, in
  // even shares again: first the candidates that lead at some size (the most sizes first), then those that finished
  // some size, then the rest, each group in round order. Returns whether a best improved.
  bool finishCutShort() {
    std::vector<CutShort> list = std::exchange(cutShort_, {});
    auto rank = [&](const CutShort& c) {
      int leads = 0;
      for (const SizeBest& sb : res_.sizes) leads += sb.best == c.index;
      const std::size_t finished = cfg_.sizes.size() - c.sizes.size();
      return std::pair{leads, finished};
    };
    std::stable_sort(list.begin(), list.end(), [&](const CutShort& a, const CutShort& b) { return rank(a) > rank(b); });
    bool improved = false;
    for (std::size_t i = 0; i < list.size() && !outOfTime(); ++i) {
      const CutShort& c = list[i];
      CandidateRecord& rec = res_.history[static_cast<std::size_t>(c.index)];
      improved |= evaluateSizes(c.index, *c.intent, c.layouts, c.sizes, list.size() - i, rec).improved;
    }
    return improved;
  }

  // The slowest of the times at size s the proposer reads (the fastest k), or 0 (it reads every one, fewer than k
  // are known, or measurements may reorder them): a candidate screened there may stop its simulation past it.
  double slowestTimeRead(std::size_t s) const {
    // Measured times replace simulated ones after the round, which may reorder them.
    if (ev_.measuresRounds()) return 0;
    const std::size_t k = proposer_.timesReadPerSize();
    std::vector<double> times;
    for (const CandidateRecord& r : res_.history) {
      if (r.stage == "ok" && s < r.sizes.size() && r.sizes[s].ok) times.push_back(r.sizes[s].timeUs);
    }
    if (k == 0 || times.size() < k) return 0;
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(k - 1), times.end());
    return times[k - 1];
  }

  // A round without a measurement: every schedule it would have measured keeps its simulated time, marked so.
  void unmeasured(int round, const std::string& why) {
    for (const RoundItem& it : roundItems_) {
      res_.history[static_cast<std::size_t>(it.record)].sizes[it.size].measureError = why;
    }
    if (!roundItems_.empty()) {
      res_.measurementNotes.push_back(
          fmt::format("round {}: no measurement ({}); the simulator's times stand", round, why));
    }
    roundItems_.clear();
  }

  // Measures the round's screened schedules (the evaluator launches them as one batch) and takes the measured
  // times: a measured best ranks above every predicted one. Returns whether a size's best improved by minGain.
  bool measureRound(int round) {
    std::vector<RoundItem> items = std::move(roundItems_);
    roundItems_.clear();
    if (items.empty()) {
      res_.measurementNotes.push_back(
          fmt::format("round {}: nothing to measure (no schedule passed the screens)", round));
      return false;
    }
    std::vector<MeasureItem> batch;
    std::vector<std::size_t> batched;  // index into items
    for (std::size_t i = 0; i < items.size(); ++i) {
      RoundItem& it = items[i];
      SizeResult& sr = res_.history[static_cast<std::size_t>(it.record)].sizes[it.size];
      // Nothing unproven runs on hardware (a wrong schedule can hang a real communicator).
      const compiler::VerifyReport proof = compiler::verify(it.schedule);
      if (!proof.proven) {
        sr.measureError = "not measured: the verifier did not prove the schedule: " +
                          (proof.errors.empty() ? std::string("?") : proof.errors[0].str());
        continue;
      }
      batch.push_back({fmt::format("{}-{}", res_.history[static_cast<std::size_t>(it.record)].id,
                                   core::formatSize(cfg_.sizes[it.size])),
                       it.schedule, cfg_.sizes[it.size]});
      batched.push_back(i);
    }
    if (batch.empty()) {
      res_.measurementNotes.push_back(fmt::format("round {}: nothing to measure (no schedule was proven)", round));
      return false;
    }
    const RoundMeasurement m = ev_.measureRound(round, batch);
    if (!m.error.empty() || m.timeUs.size() != batch.size()) {
      const std::string why = m.error.empty() ? std::string("the evaluator returned no times") : m.error;
      spdlog::error("round {}: no measurement: {}", round, why);
      roundItems_ = std::move(items);
      unmeasured(round, why);
      return false;
    }
    ++res_.roundsMeasured;
    bool improved = false;
    int measured = 0;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      RoundItem& it = items[batched[b]];
      SizeResult& sr = res_.history[static_cast<std::size_t>(it.record)].sizes[it.size];
      if (!m.timeUs[b]) {
        sr.measureError = b < m.itemErrors.size() && !m.itemErrors[b].empty() ? m.itemErrors[b] : "not measured";
        continue;
      }
      ++measured;
      sr.simulatedUs = sr.timeUs;
      sr.timeUs = *m.timeUs[b];
      sr.measured = true;
      SizeBest& sb = res_.sizes[it.size];
      if (sb.measured && sr.timeUs >= sb.bestUs * (1 - 1e-9)) continue;
      improved |= !sb.measured || sr.timeUs < sb.bestUs * (1 - cfg_.minGain);
      sb.schedule = shared(it.record, std::move(it.schedule));
      sb.best = it.record;
      sb.bestUs = sr.timeUs;
      sb.simulatedUs = sr.simulatedUs;
      sb.measured = true;
      sb.config = it.config;
    }
    res_.measurementNotes.push_back(
        fmt::format("round {}: measured {} of {} schedules on hardware", round, measured, batch.size()));
    return improved;
  }

  struct RoundItem {
    int record = 0;        // index into res_.history
    std::size_t size = 0;  // index into cfg_.sizes
    std::string config;
    core::Schedule schedule;
  };
  std::vector<RoundItem> roundItems_;

  // A candidate whose incumbent options are this much slower than the best is not searched further at that size.
  static constexpr double kScreenMargin = 1.10;

  const core::Topology& topo_;
  const SynthConfig& cfg_;
  Proposer& proposer_;
  Evaluator& ev_;
  const std::function<void(const ProgressEvent&)>& progress_;
  const std::function<bool()>& keepGoing_;
  Clock::time_point start_;
  std::optional<Clock::time_point> deadline_;  // the time budget's end, if any
  SynthResult res_;
  std::set<std::string> seen_;
  std::map<std::size_t, compiler::CompileOptions> incumbentOptions_;
  // This round's candidates whose share of the time budget did not cover every size (finishCutShort).
  struct CutShort {
    int index = 0;  // into res_.history
    std::shared_ptr<const core::IntentProgram> intent;
    std::shared_ptr<LayoutBounds> layouts;
    std::vector<std::size_t> sizes;  // ascending
  };
  std::vector<CutShort> cutShort_;
};

}  // namespace

SynthResult runSynthesis(const core::Topology& topology, const SynthConfig& config, Proposer& proposer,
                         Evaluator& evaluator, const std::function<void(const ProgressEvent&)>& progress,
                         const std::function<bool()>& keepGoing) {
  Loop loop(topology, config, proposer, evaluator, progress, keepGoing);
  return loop.run();
}

}  // namespace optiflow::synth
