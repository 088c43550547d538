#include "optiflow/synth/evaluator.h"

#include <algorithm>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "optiflow/synth/launcher.h"

namespace optiflow::synth {

namespace {

bool sameOptions(const compiler::CompileOptions& a, const compiler::CompileOptions& b) {
  return a.protocol == b.protocol && a.channels == b.channels && a.slices == b.slices;
}

}  // namespace

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
    // Every option is compiled and its lower bound taken (one pass over its steps); options are simulated in order
    // of their bounds, the incumbent's options first. An option whose bound is not below the best time found so far
    // cannot win, and one whose bound is above the cutoff cannot come near the incumbent: neither is simulated.
    struct Option {
      std::size_t index;
      compiler::CompileResult compiled;
      double floorUs;
    };
    std::vector<Option> compiled;
    std::vector<std::string> compileErrors(options.size());
    auto compileOption = [&](std::size_t i) {
      auto c = compiler::compile(intent, topology_, options[i]);
      if (!c) {
        compileErrors[i] = c.error().message;
        return;
      }
      const double floorUs = sim::lowerBoundUs(c->schedule, *network_, sizeBytes, params_);
      compiled.push_back({i, std::move(c).value(), floorUs});
    };
    // The incumbent's options are compiled and simulated alone first: most candidates are screened by them (slower
    // than the cutoff), and then no other option is looked at. The outcome is what compiling every option up front
    // and walking them in the order below gives; only the work differs.
    std::optional<sim::SimResult> incumbentSim;
    if (rotated) {
      compileOption(0);
      if (!compiled.empty() && hint.pruneAboveUs > 0 && compiled.front().floorUs <= hint.pruneAboveUs) {
        incumbentSim = sim::simulate(compiled.front().compiled.schedule, *network_, sizeBytes, params_);
        if (incumbentSim->ok && incumbentSim->timeUs > hint.pruneAboveUs) {
          best.ok = true;
          best.screened = true;
          best.timeUs = incumbentSim->timeUs;
          best.options = options[0];
          best.compiled = std::move(compiled.front().compiled);
          best.sim = std::move(*incumbentSim);
          finish(best, hint);
          return best;
        }
      }
    }
    for (std::size_t i = rotated ? 1 : 0; i < options.size(); ++i) compileOption(i);
    std::string firstError;
    for (const std::string& e : compileErrors) {
      if (!e.empty()) {
        firstError = e;
        break;
      }
    }
    const bool incumbentFirst = rotated && !compiled.empty() && compiled.front().index == 0;
    std::stable_sort(compiled.begin() + (incumbentFirst ? 1 : 0), compiled.end(),
                     [](const Option& a, const Option& b) { return a.floorUs < b.floorUs; });
    const Option* lowest = nullptr;  // the option with the least bound among those screened by it
    for (std::size_t k = 0; k < compiled.size(); ++k) {
      Option& o = compiled[k];
      if (best.ok && o.floorUs >= best.timeUs) continue;
      if (hint.pruneAboveUs > 0 && o.floorUs > hint.pruneAboveUs) {
        if (!lowest || o.floorUs < lowest->floorUs) lowest = &o;
        continue;
      }
      sim::SimResult r = k == 0 && incumbentFirst && incumbentSim
                             ? std::move(*incumbentSim)
                             : sim::simulate(o.compiled.schedule, *network_, sizeBytes, params_);
      if (!r.ok) {
        if (firstError.empty()) firstError = "simulator: " + r.error;
        continue;
      }
      if (!best.ok || r.timeUs < best.timeUs) {
        best.ok = true;
        best.timeUs = r.timeUs;
        best.options = options[o.index];
        best.compiled = std::move(o.compiled);
        best.sim = std::move(r);
      }
      if (k == 0 && incumbentFirst && hint.pruneAboveUs > 0 && best.timeUs > hint.pruneAboveUs) {
        best.screened = true;
        break;
      }
    }
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
