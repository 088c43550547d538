// Compile speed of the language pipeline (parse + expand + compile), issue 4's targets: a hierarchical All-Gather
// for 32 GPUs under 10 ms, for 1024 GPUs under 1 s. Verification is timed separately (the compiler runs it on
// every output; the synthesizer verifies only the winners).
#include <benchmark/benchmark.h>

#include "optiflow/core/topology.h"
#include "optiflow/synth/pipeline.h"

namespace {

using namespace optiflow;

constexpr const char* kHierarchical = R"(allgather hierarchical_rail
  for g in gpus: allgather rail(g) by ring
  for n in nodes: allgather node(n) by direct
)";

const char* presetFor(int gpus) { return gpus == 32 ? "dgx-a100x4" : gpus == 256 ? "dgx-h100x32" : "dgx-h100x128"; }

void compileOnce(benchmark::State& state, bool verify) {
  const core::Topology t = core::presetTopology(presetFor(static_cast<int>(state.range(0)))).value();
  compiler::CompileOptions o;
  o.sizeBytes = 1 << 30;
  o.verify = verify;
  o.limits = compiler::ExecutorLimits::none();
  std::size_t hops = 0;
  for (auto _ : state) {
    auto f = synth::parseAndExpand(kHierarchical, "<bench>", t);
    if (!f.ok()) {
      state.SkipWithError(f.message.c_str());
      return;
    }
    auto r = compiler::compile(*f.intent, t, o);
    if (!r.ok()) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    hops = r->hops;
    benchmark::DoNotOptimize(r->schedule.ranks.data());
  }
  state.counters["transfers"] = static_cast<double>(hops);
}

void BM_CompileHierarchicalAllGather(benchmark::State& state) { compileOnce(state, false); }
void BM_CompileAndVerifyHierarchicalAllGather(benchmark::State& state) { compileOnce(state, true); }

BENCHMARK(BM_CompileHierarchicalAllGather)->Arg(32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileAndVerifyHierarchicalAllGather)->Arg(32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
