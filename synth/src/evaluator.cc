#include "optiflow/synth/evaluator.h"

#include <algorithm>
#include <new>

#include <fmt/format.h>

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
    if (hint.first) {
      auto it = std::find_if(options.begin(), options.end(),
                             [&](const compiler::CompileOptions& o) { return sameOptions(o, *hint.first); });
      if (it != options.end()) std::rotate(options.begin(), it, it + 1);
    }
    std::string firstError;
    for (std::size_t i = 0; i < options.size(); ++i) {
      auto compiled = compiler::compile(intent, topology_, options[i]);
      if (!compiled) {
        if (firstError.empty()) firstError = compiled.error().message;
        continue;
      }
      sim::SimResult r = sim::simulate(compiled->schedule, *network_, sizeBytes, params_);
      if (!r.ok) {
        if (firstError.empty()) firstError = "simulator: " + r.error;
        continue;
      }
      if (!best.ok || r.timeUs < best.timeUs) {
        best.ok = true;
        best.timeUs = r.timeUs;
        best.options = options[i];
        best.compiled = std::move(compiled).value();
        best.sim = std::move(r);
      }
      if (i == 0 && hint.first && hint.pruneAboveUs > 0 && best.ok && best.timeUs > hint.pruneAboveUs) {
        best.screened = true;
        break;
      }
    }
    if (!best.ok) {
      best.error = firstError.empty() ? "no compile options apply" : firstError;
      return best;
    }
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
  } catch (const std::bad_alloc&) {
    best = Evaluation{};
    best.error = "out of memory";
  }
  return best;
}

double SimEvaluator::timeNccl(const core::Schedule& schedule, std::uint64_t sizeBytes, const sim::SimParams& params) {
  if (!network_) return 0;
  const sim::SimResult r = sim::simulate(schedule, *network_, sizeBytes, params);
  return r.ok ? r.timeUs : 0;
}

Evaluation HardwareEvaluator::evaluate(const core::IntentProgram&, std::uint64_t, const EvalHint&) {
  Evaluation e;
  e.error =
      "no hardware runner is built in: measuring a schedule needs an executor for it (MSCCL-enabled NCCL or "
      "MSCCL++) on GPUs; use the simulator";
  return e;
}

double HardwareEvaluator::timeNccl(const core::Schedule&, std::uint64_t, const sim::SimParams&) { return 0; }

}  // namespace optiflow::synth
