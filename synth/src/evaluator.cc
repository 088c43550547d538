#include "optiflow/synth/evaluator.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "optiflow/core/schedule.h"
#include "optiflow/synth/launcher.h"

namespace optiflow::synth {

namespace {

bool sameOptions(const compiler::CompileOptions& a, const compiler::CompileOptions& b) {
  return a.protocol == b.protocol && a.channels == b.channels && a.slices == b.slices;
}

struct OutOfTime {};  // EvalHint::deadline passed: the evaluation ends without a result

}  // namespace

LayoutBounds::Key LayoutBounds::key(const compiler::CompileOptions& o) {
  const compiler::ExecutorLimits& l = o.limits;
  return {static_cast<int>(o.protocol.value_or(core::Protocol::Simple)),
          o.channels,
          o.slices,
          l.maxChannels,
          l.maxBlocksPerChannel,
          l.maxBlocksPerRank,
          l.maxStepsPerBlock};
}

LayoutBounds::Turn::Shape LayoutBounds::shape(const compiler::CompileOptions& o) {
  const Key k = key(o);
  return {k[1], k[2], k[3], k[4], k[5], k[6]};
}

std::optional<LayoutBounds::Entry> LayoutBounds::find(const compiler::CompileOptions& o) const {
  if (!keeps(o)) return std::nullopt;
  const std::lock_guard lock(mutex_);
  if (const auto it = entries_.find(key(o)); it != entries_.end()) {
    ++hits_;
    return it->second;
  }
  if (const auto it = refusals_.find(shape(o)); it != refusals_.end()) {
    ++hits_;
    return Entry{sim::BoundCurve{}, it->second};
  }
  return std::nullopt;
}

void LayoutBounds::insert(const compiler::CompileOptions& o, Entry e) {
  if (!keeps(o)) return;
  const std::lock_guard lock(mutex_);
  if (!e.error.empty()) refusals_.emplace(shape(o), e.error);
  entries_.emplace(key(o), std::move(e));
}

std::optional<LayoutBounds::Turn> LayoutBounds::turn(const compiler::CompileOptions& o, std::size_t hops,
                                                     std::optional<std::chrono::steady_clock::time_point> deadline) {
  const bool kept = keeps(o);
  const Turn::Shape s = kept ? shape(o) : Turn::Shape{};
  std::unique_lock lock(mutex_);
  const auto ready = [&] {
    return (!kept || laying_.count(s) == 0) && (hopsLaying_ == 0 || hopsLaying_ + hops <= kHopsAtOnce);
  };
  if (deadline) {
    if (!turnOver_.wait_until(lock, *deadline, ready)) return std::nullopt;
  } else {
    turnOver_.wait(lock, ready);
  }
  if (kept) laying_.insert(s);
  hopsLaying_ += hops;
  return Turn(this, kept ? std::optional<Turn::Shape>(s) : std::nullopt, hops);
}

LayoutBounds::Turn::~Turn() {
  if (!owner_) return;
  {
    const std::lock_guard lock(owner_->mutex_);
    if (shape_) owner_->laying_.erase(*shape_);
    owner_->hopsLaying_ -= hops_;
  }
  owner_->turnOver_.notify_all();
}

std::size_t LayoutBounds::size() const {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

std::size_t LayoutBounds::hits() const {
  const std::lock_guard lock(mutex_);
  return hits_;
}

SimEvaluator::SimEvaluator(const core::Topology& topology, sim::SimParams params)
    : topology_(topology), params_(std::move(params)) {
  auto net = sim::Network::build(topology);
  if (net) {
    network_ = std::move(net).value();
  } else {
    networkError_ = net.error().str();
  }
}

Evaluation SimEvaluator::evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes, const EvalHint& hint) {
  Evaluation best;
  if (!network_) {
    best.error = networkError_;
    return best;
  }
  try {
    auto checkTime = [&] {
      if (hint.deadline && std::chrono::steady_clock::now() > *hint.deadline) throw OutOfTime{};
    };
    sim::SimParams timed = params_;
    timed.deadline = hint.deadline;
    auto simulate = [&](const core::Schedule& s, const sim::SimParams& p) {
      checkTime();
      sim::SimResult r = sim::simulate(s, *network_, sizeBytes, p);
      if (r.timedOut) throw OutOfTime{};
      return r;
    };
    std::vector<compiler::CompileOptions> options = candidateOptions(intent, sizeBytes);
    bool rotated = false;  // the incumbent's options are options[0]
    if (hint.first) {
      auto it = std::find_if(options.begin(), options.end(),
                             [&](const compiler::CompileOptions& o) { return sameOptions(o, *hint.first); });
      if (it != options.end()) {
        std::rotate(options.begin(), it, it + 1);
        rotated = true;
      }
    }
    // Options are simulated in order of their lower bounds (sim::lowerBoundUs), the incumbent's options first. An
    // option whose bound is not below the best time found so far cannot win, and one whose bound is above the cutoff
    // cannot come near the incumbent: neither is simulated.
    struct Option {
      std::size_t index;
      compiler::CompileResult compiled;
      double floorUs;
    };
    std::vector<std::string> compileErrors(options.size());
    auto bounded = [&](std::size_t i, core::Result<compiler::CompileResult>&& c) -> std::optional<Option> {
      if (!c) {
        compileErrors[i] = c.error().message;
        return std::nullopt;
      }
      const double floorUs = sim::lowerBoundUs(c->schedule, *network_, sizeBytes, params_);
      return Option{i, std::move(c).value(), floorUs};
    };
    // Options are laid out (compiler::compileLayout: half the work of compiling) before they are compiled, and
    // compiled only when their turn may come. A layout's bound is not above the compiled schedule's (the same links
    // carry the same bytes; a block's steps are the same whatever their order; one exact iteration instead of
    // several), so options are compiled in order of their layouts' bounds, each once no option compiled so far can
    // come before it. The outcome is what compiling every option and walking them all in order of their bounds
    // gives; only the work differs. kSlack absorbs the rounding of the two sums: a layout's bound is trusted to
    // within it.
    constexpr double kSlack = 1 - 1e-9;
    sim::SimParams layoutParams = params_;
    layoutParams.maxExactIterations = 1;
    layoutParams.foldSymmetricNodes = false;
    struct Pending {
      std::size_t index;
      double floorUs;  // the layout's
      std::optional<compiler::Layout> layout;
      std::size_t steps = 0;  // the layout's (what holding it costs)
    };
    std::vector<Pending> pending;
    // Lays option i out and bounds it; false (its error noted) when it does not compile. Another size of the
    // candidate may have laid it out already: its bound curve serves every size, and no layout is made.
    auto layOut = [&](std::size_t i, Pending& out) {
      out = Pending{i, 0, std::nullopt, 0};
      auto known = [&] {
        if (!hint.layouts) return false;
        auto entry = hint.layouts->find(options[i]);
        if (!entry) return false;
        compileErrors[i] = std::move(entry->error);
        if (compileErrors[i].empty()) out.floorUs = entry->curve.at(sizeBytes);
        return true;
      };
      if (known()) return compileErrors[i].empty();
      const int slices = std::max(options[i].slices > 0 ? options[i].slices : options[i].channels, 1);
      std::optional<LayoutBounds::Turn> turn =
          hint.layouts ? hint.layouts->turn(options[i], intent.transfers.size() * static_cast<std::size_t>(slices),
                                            hint.deadline)
                       : std::nullopt;
      if (hint.layouts) {
        if (!turn) throw OutOfTime{};
        if (known()) return compileErrors[i].empty();
      }
      checkTime();
      auto layout = compiler::compileLayout(intent, topology_, options[i]);
      if (!layout) {
        compileErrors[i] = layout.error().message;
        // Running out of memory says nothing about the option: another size may lay it out.
        if (hint.layouts && compileErrors[i] != compiler::kOutOfMemory) {
          hint.layouts->insert(options[i], {sim::BoundCurve{}, compileErrors[i]});
        }
        return false;
      }
      turn.reset();  // another protocol's layout of this shape is laid out (and bounded) on its own
      sim::BoundCurve curve = sim::boundCurve(layout->schedule, *network_, layoutParams);
      out.floorUs = curve.at(sizeBytes);
      if (hint.layouts && curve.ok()) hint.layouts->insert(options[i], {std::move(curve), {}});  // not ok: no memory
      out.steps = core::totalSteps(layout->schedule);
      layout->schedule = core::Schedule{};  // only the bound was wanted
      out.layout = std::move(layout).value();
      return true;
    };
    // An option above the cutoff is compiled only when nothing else was simulated: it is laid out again then,
    // rather than its layout held all along.
    auto aboveCutoff = [&](const Pending& p) {
      return hint.pruneAboveUs > 0 && p.floorUs * kSlack > hint.pruneAboveUs;
    };
    // The incumbent's options are compiled and simulated alone first: most candidates are screened by them (slower
    // than the cutoff), and then no other option is looked at. Where their layout's bound is above the cutoff
    // already they cannot be simulated, and wait with the others instead.
    std::optional<Option> incumbent;
    std::optional<sim::SimResult> incumbentSim;
    if (rotated) {
      Pending p;
      if (layOut(0, p)) {
        if (aboveCutoff(p)) {
          pending.push_back({0, p.floorUs, std::nullopt});
        } else {
          checkTime();
          incumbent = bounded(
              0, p.layout ? compiler::compile(std::move(*p.layout)) : compiler::compile(intent, topology_, options[0]));
        }
      }
      if (incumbent && hint.pruneAboveUs > 0 && incumbent->floorUs <= hint.pruneAboveUs) {
        sim::SimParams screen = timed;
        if (hint.stopAboveUs > 0) screen.stopAtUs = std::max(hint.stopAboveUs, hint.pruneAboveUs);
        incumbentSim = simulate(incumbent->compiled.schedule, screen);
        if (incumbentSim->ok && incumbentSim->timeUs > hint.pruneAboveUs) {
          best.ok = true;
          best.screened = true;
          best.stopped = incumbentSim->cutOff;
          best.timeUs = incumbentSim->timeUs;
          best.options = options[0];
          best.compiled = std::move(incumbent->compiled);
          best.sim = std::move(*incumbentSim);
          finish(best, hint);
          return best;
        }
      }
    }
    // The order of the walk: by bound, then by position (the incumbent's options are position 0).
    const auto before = [](const auto& a, const auto& b) {
      return a.floorUs < b.floorUs || (a.floorUs == b.floorUs && a.index < b.index);
    };
    // Held layouts cost memory (on 1024 ranks hundreds of MB each, and most are never compiled): past
    // hint.heldLayoutSteps only those that come first in the walk are held.
    for (std::size_t i = rotated ? 1 : 0; i < options.size(); ++i) {
      Pending p;
      if (!layOut(i, p)) continue;
      if (aboveCutoff(p)) p.layout.reset();
      pending.push_back(std::move(p));
      std::size_t held = 0;
      for (const Pending& q : pending) held += q.layout ? q.steps : 0;
      while (held > hint.heldLayoutSteps) {
        Pending* last = nullptr;
        int count = 0;
        for (Pending& q : pending) {
          if (!q.layout) continue;
          ++count;
          if (!last || before(*last, q)) last = &q;
        }
        if (count <= 1) break;
        held -= last->steps;
        last->layout.reset();
      }
    }
    std::stable_sort(pending.begin(), pending.end(),
                     [](const Pending& a, const Pending& b) { return a.floorUs < b.floorUs; });
    std::vector<Option> ready;  // compiled, not yet walked; a heap on `before`, least first
    const auto heapOrder = [&](const Option& a, const Option& b) { return before(b, a); };
    std::size_t next = 0;  // pending[next ..] are not compiled
    auto compileNext = [&] {
      checkTime();
      Pending& p = pending[next];
      auto o = bounded(p.index, p.layout ? compiler::compile(std::move(*p.layout))
                                         : compiler::compile(intent, topology_, options[p.index]));
      p.layout.reset();
      if (o) {
        ready.push_back(std::move(*o));
        std::push_heap(ready.begin(), ready.end(), heapOrder);
      }
      ++next;
    };
    struct Bound {
      std::size_t index;
      double floorUs;
    };
    std::optional<Bound> lowest;  // the least bound of the options screened by it
    auto screen = [&](const Option& o) {
      if (!lowest || before(o, *lowest)) lowest = Bound{o.index, o.floorUs};
    };
    std::string simError;
    auto walk = [&](Option&& o, bool first) {
      if (hint.pruneAboveUs > 0 && o.floorUs > hint.pruneAboveUs) {
        screen(o);
        return;
      }
      sim::SimResult r;
      if (first && incumbentSim) {
        r = std::move(*incumbentSim);
      } else {
        // Only an option faster than the best so far matters: its simulation stops once it is not.
        sim::SimParams p = timed;
        if (best.ok) p.stopAtUs = best.timeUs;
        r = simulate(o.compiled.schedule, p);
      }
      if (!r.ok) {
        if (simError.empty()) simError = "simulator: " + r.error;
        return;
      }
      if (r.cutOff) return;
      if (!best.ok || r.timeUs < best.timeUs) {
        best.ok = true;
        best.timeUs = r.timeUs;
        best.options = options[o.index];
        best.compiled = std::move(o.compiled);
        best.sim = std::move(r);
      }
    };
    if (incumbent) {
      walk(std::move(*incumbent), true);
      incumbent.reset();
      if (best.ok && hint.pruneAboveUs > 0 && best.timeUs > hint.pruneAboveUs) best.screened = true;
    }
    while (!best.screened) {
      // Options that cannot win are never compiled, nor those whose bound alone is above the cutoff (the least of
      // their bounds is wanted only when nothing is simulated, below).
      while (next < pending.size()) {
        const double f = pending[next].floorUs * kSlack;
        if (best.ok && f >= best.timeUs) {
          for (; next < pending.size(); ++next) pending[next].layout.reset();
          break;
        }
        if (hint.pruneAboveUs > 0 && f > hint.pruneAboveUs) break;
        if (!ready.empty() && f > ready.front().floorUs) break;
        compileNext();
      }
      if (ready.empty()) break;
      std::pop_heap(ready.begin(), ready.end(), heapOrder);
      Option o = std::move(ready.back());
      ready.pop_back();
      if (best.ok && o.floorUs >= best.timeUs) break;  // so are all the rest
      walk(std::move(o), false);
    }
    if (best.ok) {
      // What is left can no longer matter; its memory is wanted for proving the winner.
      std::vector<Pending>().swap(pending);
      std::vector<Option>().swap(ready);
    } else {
      // Nothing was simulated. The options set aside for the cutoff are compiled while one may have the least bound.
      while (next < pending.size() && (!lowest || pending[next].floorUs * kSlack <= lowest->floorUs)) {
        compileNext();
        while (!ready.empty()) {
          std::pop_heap(ready.begin(), ready.end(), heapOrder);
          screen(ready.back());
          ready.pop_back();
        }
      }
    }
    std::string firstError;
    for (const std::string& e : compileErrors) {
      if (!e.empty()) {
        firstError = e;
        break;
      }
    }
    if (firstError.empty()) firstError = simError;
    if (!best.ok && lowest) {
      // Nothing was simulated: every option's bound alone was too slow. Report the least bound, marked as such.
      best.ok = true;
      best.screened = true;
      best.boundOnly = true;
      best.timeUs = lowest->floorUs;
      best.options = options[lowest->index];
      return best;
    }
    if (!best.ok) {
      best.error = firstError.empty() ? "no compile options apply" : firstError;
      return best;
    }
    finish(best, hint);
  } catch (const std::bad_alloc&) {
    best = Evaluation{};
    best.error = "out of memory";
  } catch (const OutOfTime&) {
    best = Evaluation{};
    best.outOfTime = true;
    best.error = "not evaluated: the time budget ran out";
  }
  return best;
}

void SimEvaluator::finish(Evaluation& best, const EvalHint& hint) const {
  const int b = best.sim.bottleneckLink;
  if (b >= 0 && static_cast<std::size_t>(b) < best.sim.links.size()) {
    best.bottleneck = fmt::format("{} ({:.0f}% busy)", network_->link(b).name,
                                  100.0 * best.sim.links[static_cast<std::size_t>(b)].utilisation);
  }
  // The simulator keeps per-link usage and the critical path; the loop needs neither once the bottleneck is named.
  best.sim.links.clear();
  best.sim.links.shrink_to_fit();
  best.sim.criticalPath.clear();
  best.sim.criticalPath.shrink_to_fit();
  if (hint.verify) prove(best);
}

double SimEvaluator::timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) {
  if (!network_) return 0;
  const sim::SimResult r = sim::simulate(schedule, *network_, sizeBytes, params);
  return r.ok ? r.timeUs : 0;
}

double SimEvaluator::boundNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) {
  return network_ ? sim::lowerBoundUs(schedule, *network_, sizeBytes, params) : 0;
}

Evaluation evaluateBest(const core::IntentProgram& intent, const core::Topology& topology, std::uint64_t sizeBytes,
                        const sim::SimParams& params) {
  return SimEvaluator(topology, params).evaluate(intent, sizeBytes, EvalHint{});
}

std::string checkLauncherCommand(const std::string& command) {
  if (command.find_first_not_of(" \t") == std::string::npos) return "the launcher command is empty";
  if (command.find("{batch}") == std::string::npos || command.find("{out}") == std::string::npos) {
    return fmt::format(
        "the launcher command \"{}\" must contain {{batch}} (the directory of schedules) and {{out}} "
        "(the results file), e.g. \"srun -N2 --ntasks-per-node=8 optiflow-bench {{batch}} --json -o "
        "{{out}} --rendezvous-dir $HOME/.rdv\"",
        command);
  }
  return {};
}

HardwareEvaluator::HardwareEvaluator(const core::Topology& topology, sim::SimParams params, LauncherConfig launcher)
    : sim_(topology, std::move(params)), launcher_(std::move(launcher)) {}

Evaluation HardwareEvaluator::evaluate(const core::IntentProgram& intent, std::uint64_t sizeBytes,
                                       const EvalHint& hint) {
  return sim_.evaluate(intent, sizeBytes, hint);
}

double HardwareEvaluator::timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes,
                                   const sim::SimParams& params) {
  return sim_.timeNccl(schedule, sizeBytes, params);
}

double HardwareEvaluator::boundNccl(const core::Schedule& schedule, std::uint64_t sizeBytes,
                                    const sim::SimParams& params) {
  return sim_.boundNccl(schedule, sizeBytes, params);
}

RoundMeasurement HardwareEvaluator::measureRound(int round, const std::vector<MeasureItem>& items) {
  return measureWithLauncher(launcher_, round, items);
}

}  // namespace optiflow::synth
