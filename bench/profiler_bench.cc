// The profiler's cost per NCCL event, through the real ABI: dlopen libnccl-profiler-optiflow.so as NCCL does, init
// a v5 communicator against a real segment, then drive whole collectives in NCCL's order (start and stop the
// collective, then per channel: start, KernelChStop, stop) and report the time per event. The bar: no
// allocation, lock or system call per event; this measures what is left.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "optiflow/plugin/abi/nccl_profiler.h"
#include "optiflow/schedcache/writer.h"

namespace {

namespace sc = optiflow::schedcache;

void quietLogger(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

struct Fixture {
  std::string ns;
  std::unique_ptr<sc::Writer> writer;
  void* lib = nullptr;
  const ncclProfiler_v5_t* prof = nullptr;
  void* ctx = nullptr;

  explicit Fixture(bool segment) : ns("bench-prof-" + std::to_string(getpid()) + (segment ? "-seg" : "-none")) {
    if (segment) {
      sc::WriterOptions o;
      o.ns = ns;
      o.build = "profiler_bench";
      sc::Error e;
      writer = sc::Writer::open(o, &e);
      if (!writer) std::fprintf(stderr, "profiler_bench: %s\n", e.message.c_str());
    }
    ::setenv("OPTIFLOW_NAMESPACE", ns.c_str(), 1);
    lib = dlopen(OPTIFLOW_PROFILER_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) prof = static_cast<const ncclProfiler_v5_t*>(dlsym(lib, "ncclProfiler_v5"));
    int mask = 0;
    if (prof != nullptr) prof->init(&ctx, 0x5eed, &mask, "bench", 1, 8, 0, quietLogger);
  }
  ~Fixture() {
    if (prof != nullptr) prof->finalize(ctx);
    if (lib != nullptr) dlclose(lib);
    sc::Error e;
    if (writer) sc::Writer::remove(ns, &e);
  }
};

// One collective of `channels` channels = 2 + 3 x channels events.
void runCollectives(benchmark::State& state, bool segment) {
  Fixture f(segment);
  if (f.prof == nullptr || f.ctx == nullptr) {
    state.SkipWithError("profiler plugin not loaded");
    return;
  }
  const auto channels = static_cast<std::uint8_t>(state.range(0));
  // 16 sizes: 16 rows in the segment, as a job with a few sizes.
  static const char* const kFunc = "AllReduce";
  std::uint64_t t = 1'000'000'000ULL;
  std::uint64_t i = 0;
  for (auto _ : state) {
    ncclProfilerEventDescr_v5_t d{};
    d.type = ncclProfileColl;
    d.coll.func = kFunc;
    d.coll.count = 1024u << (i % 16);
    d.coll.datatype = "ncclFloat32";
    d.coll.algo = "Ring";
    d.coll.proto = "Simple";
    d.coll.nChannels = channels;
    void* coll = nullptr;
    f.prof->startEvent(f.ctx, &coll, &d);
    f.prof->stopEvent(coll);
    for (std::uint8_t ch = 0; ch < channels; ++ch) {
      ncclProfilerEventDescr_v5_t k{};
      k.type = ncclProfileKernelCh;
      k.parentObj = coll;
      k.kernelCh.channelId = ch;
      k.kernelCh.pTimer = t + ch;
      void* h = nullptr;
      f.prof->startEvent(f.ctx, &h, &k);
      ncclProfilerEventStateArgs_v5_t a{};
      a.kernelCh.pTimer = t + 10'000 + (i % 97) * 100 + ch;
      f.prof->recordEventState(h, ncclProfilerKernelChStop, &a);
      f.prof->stopEvent(h);
    }
    t += 100'000;
    ++i;
  }
  const auto events = static_cast<double>(2 + 3 * channels);
  state.counters["events_per_collective"] = events;
  state.counters["ns_per_event"] = benchmark::Counter(static_cast<double>(state.iterations()) * events,
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_ProfilerCollective(benchmark::State& state) { runCollectives(state, true); }
void BM_ProfilerCollectiveNoSegment(benchmark::State& state) { runCollectives(state, false); }

}  // namespace

BENCHMARK(BM_ProfilerCollective)->Arg(1)->Arg(8)->Arg(32);
BENCHMARK(BM_ProfilerCollectiveNoSegment)->Arg(8);
