// Compile speed of the language pipeline (parse + expand + compile), issue 4's targets: a hierarchical All-Gather
// for 32 GPUs under 10 ms, for 1024 GPUs under 1 s. Verification is timed separately (the compiler runs it on
// every output; the synthesizer verifies only the winners).
// The verifier alone on large rings (was a wall-clock limit in verifier_test): a 64-rank, 4-channel ring All-Reduce
// under 1 s, a 512-rank ring All-Gather under 5 s. And the LLM reply parser on a hostile reply (was a wall-clock
// limit in reply_parser_test): linear in the reply's length (the fit says N or N lg N with a small RMS; never N^2).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/pipeline.h"
#include "optiflow/synth/reply_parser.h"

namespace {

using namespace optiflow;

constexpr const char* kHierarchical = R"(allgather hierarchical_rail
  for g in gpus: allgather rail(g) by ring
  for n in nodes: allgather node(n) by direct
)";

const char* presetFor(int gpus) { return gpus == 32 ? "dgx-a100x4" : gpus == 256 ? "dgx-h100x32" : "dgx-h100x128"; }

// Layout: only the first half of a compile (compiler::compileLayout: routing, fusion, placement, the layout's
// schedule), which the synthesis loop pays for every option; the rest (ordering, emitting) only for options that
// may win.
enum class Work { Layout, Compile, CompileAndVerify };

void compileOnce(benchmark::State& state, Work work) {
  const core::Topology t = core::presetTopology(presetFor(static_cast<int>(state.range(0)))).value();
  compiler::CompileOptions o;
  o.sizeBytes = 1 << 30;
  o.verify = work == Work::CompileAndVerify;
  o.limits = compiler::ExecutorLimits::none();
  std::size_t blocks = 0;
  std::size_t hops = 0;
  for (auto _ : state) {
    auto f = synth::parseAndExpand(kHierarchical, "<bench>", t);
    if (!f.ok()) {
      state.SkipWithError(f.message.c_str());
      return;
    }
    auto layout = compiler::compileLayout(*f.intent, t, o);
    if (!layout.ok()) {
      state.SkipWithError(layout.error().message.c_str());
      return;
    }
    blocks = layout->schedule.ranks.front().threadBlocks.size();
    if (work == Work::Layout) {
      benchmark::DoNotOptimize(layout->schedule.ranks.data());
      continue;
    }
    auto r = compiler::compile(std::move(layout).value());
    if (!r.ok()) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    hops = r->hops;
    benchmark::DoNotOptimize(r->schedule.ranks.data());
  }
  state.counters["blocks_rank0"] = static_cast<double>(blocks);
  if (work != Work::Layout) state.counters["transfers"] = static_cast<double>(hops);
}

void BM_LayoutHierarchicalAllGather(benchmark::State& state) { compileOnce(state, Work::Layout); }
void BM_CompileHierarchicalAllGather(benchmark::State& state) { compileOnce(state, Work::Compile); }
void BM_CompileAndVerifyHierarchicalAllGather(benchmark::State& state) { compileOnce(state, Work::CompileAndVerify); }

BENCHMARK(BM_CompileHierarchicalAllGather)->Arg(32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LayoutHierarchicalAllGather)->Arg(32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileAndVerifyHierarchicalAllGather)->Arg(32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

void verifyRing(benchmark::State& state, const core::Schedule& s) {
  std::size_t steps = 0;
  for (auto _ : state) {
    const compiler::VerifyReport r = compiler::verify(s);
    if (!r.proven) {
      state.SkipWithError("the ring was not proven");
      return;
    }
    steps = r.steps;
    benchmark::DoNotOptimize(r.transfers);
  }
  state.counters["steps"] = static_cast<double>(steps);
}

core::fixtures::RingOptions ringOptions(int ranks, int channels) {
  core::fixtures::RingOptions o;
  o.nRanks = ranks;
  o.channels = channels;
  return o;
}

// Args: ranks, channels.
void BM_VerifyRingAllReduce(benchmark::State& state) {
  verifyRing(state, core::fixtures::ringAllReduce(
                        ringOptions(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)))));
}
void BM_VerifyRingAllGather(benchmark::State& state) {
  verifyRing(state, core::fixtures::ringAllGather(
                        ringOptions(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)))));
}

BENCHMARK(BM_VerifyRingAllReduce)->Args({64, 4})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_VerifyRingAllGather)->Args({512, 1})->Unit(benchmark::kMillisecond);

// A reply of `range(0)` fence openers with header-like lines, then as many bytes of one long line.
void BM_ExtractPrograms(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::string reply;
  for (std::size_t i = 0; i < n; ++i) reply += "```\nallgather x\n";
  reply += std::string(n * 16, 'a');
  std::size_t programs = 0;
  for (auto _ : state) {
    const std::vector<std::string> p = synth::extractPrograms(reply);
    programs = p.size();
    benchmark::DoNotOptimize(p.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(reply.size()));
  state.SetComplexityN(static_cast<benchmark::IterationCount>(reply.size()));
  state.counters["programs"] = static_cast<double>(programs);
}

BENCHMARK(BM_ExtractPrograms)->RangeMultiplier(4)->Range(1 << 12, 1 << 18)->Unit(benchmark::kMillisecond)->Complexity();

}  // namespace
