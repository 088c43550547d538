// Simulator cost: ring schedules from core::fixtures on DGX A100 clusters of 32 and 1024 GPUs, and NCCL's own
// 16-channel ring on 1024 H100s (the synthesis loop's baseline), each folded to the nodes that stand for all
// (docs/simulator.md "Symmetric schedules"; the second argument 1) and in full (0).
// Run: ./build/<preset>/bench/sim_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Targets (issue 3): 1024-GPU ring All-Gather < 2 s, 32 GPUs < 10 ms, peak memory < 1 GiB.
// The reference executor (was a wall-clock limit in reference_executor_test): a 64-rank, 4-channel ring All-Reduce
// (32,256 steps on 64 threads) well under 1 s.
#include <sys/resource.h>

#include <cstdint>
#include <string>

#include <benchmark/benchmark.h>

#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/reference_executor.h"
#include "optiflow/sim/simulator.h"

namespace {

using optiflow::core::Schedule;
namespace fixtures = optiflow::core::fixtures;
namespace sim = optiflow::sim;

double peakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

enum class Kind { AllGather, AllReduce, NcclAllGather };

void runRing(benchmark::State& state, const std::string& topo, Kind kind) {
  auto t = optiflow::core::presetTopology(topo);
  if (!t) {
    state.SkipWithError("unknown preset");
    return;
  }
  auto net = sim::Network::build(*t);
  if (!net) {
    state.SkipWithError("network");
    return;
  }
  const auto size = static_cast<std::uint64_t>(state.range(0));
  fixtures::RingOptions o;
  o.nRanks = t->nRanks();
  sim::SimParams params;
  Schedule s;
  if (kind == Kind::NcclAllGather) {
    sim::NcclPrediction p = sim::ncclPredict(sim::ncclTune(*t), optiflow::core::Collective::AllGather, size);
    p.algorithm = optiflow::core::Algorithm::Ring;
    p.protocol = optiflow::core::Protocol::LL128;
    p.channels = 16;
    auto made = sim::ncclScheduleFor(*t, optiflow::core::Collective::AllGather, p, {});
    if (!made) {
      state.SkipWithError("no NCCL schedule");
      return;
    }
    s = std::move(*made);
    params = sim::ncclSimParams(p, params);
  } else {
    s = kind == Kind::AllGather ? fixtures::ringAllGather(o) : fixtures::ringAllReduce(o);
  }
  params.foldSymmetricNodes = state.range(1) != 0;
  double simUs = 0;
  std::uint64_t events = 0;
  int fold = 1;
  for (auto _ : state) {
    auto r = sim::simulate(s, *net, size, params);
    if (!r.ok) {
      state.SkipWithError(r.error.c_str());
      return;
    }
    simUs = r.timeUs;
    events = r.events;
    fold = r.symmetry.fold;
    benchmark::DoNotOptimize(r.timeUs);
  }
  state.counters["steps"] = static_cast<double>(optiflow::core::totalSteps(s));
  state.counters["events"] = static_cast<double>(events);
  state.counters["fold"] = fold;
  state.counters["sim_time_us"] = simUs;
  state.counters["peak_rss_MiB"] = peakRssMiB();
}

void BM_RingAllGather_32(benchmark::State& s) { runRing(s, "dgx-a100x4", Kind::AllGather); }
void BM_RingAllGather_1024(benchmark::State& s) { runRing(s, "dgx-a100x128", Kind::AllGather); }
void BM_RingAllReduce_1024(benchmark::State& s) { runRing(s, "dgx-a100x128", Kind::AllReduce); }
void BM_NcclRingAllGather_1024(benchmark::State& s) { runRing(s, "dgx-h100x128", Kind::NcclAllGather); }

// Args: size, fold (1) or not (0).
BENCHMARK(BM_RingAllGather_32)
    ->Args({1 << 20, 1})
    ->Args({1 << 30, 1})
    ->Args({1 << 30, 0})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RingAllGather_1024)
    ->Args({1 << 20, 1})
    ->Args({1 << 30, 1})
    ->Args({1 << 30, 0})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK(BM_RingAllReduce_1024)->Args({1 << 30, 1})->Args({1 << 30, 0})->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_NcclRingAllGather_1024)
    ->Args({256 << 20, 1})
    ->Args({256 << 20, 0})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Args: ranks, channels. Wall time per run (the executor runs one thread per rank).
void BM_ReferenceRingAllReduce(benchmark::State& state) {
  fixtures::RingOptions o;
  o.nRanks = static_cast<int>(state.range(0));
  o.channels = static_cast<int>(state.range(1));
  const Schedule s = fixtures::ringAllReduce(o);
  double executorMs = 0;
  for (auto _ : state) {
    const sim::CheckReport r = sim::runReference(s);
    if (!r.passed) {
      state.SkipWithError("the reference run failed");
      return;
    }
    executorMs = static_cast<double>(r.elapsed.count()) / 1000.0;
    benchmark::DoNotOptimize(r.mismatchCount);
  }
  state.counters["steps"] = static_cast<double>(optiflow::core::totalSteps(s));
  state.counters["executor_ms"] = executorMs;  // the executor's own clock (threads and compare)
}

BENCHMARK(BM_ReferenceRingAllReduce)->Args({64, 4})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
