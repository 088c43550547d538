// The tuner's per-collective cost, through the real ABI: dlopen libnccl-tuner-optiflow.so as NCCL does, init a
// communicator against a published plan of 10,000 entries (all for this communicator's shape, the worst case for
// the lookup), then time getCollInfo with NCCL-style cost tables. Targets (issue 6): median < 100 ns per call, and
// a communicator's private memory (heap bytes allocated by init, counter private_bytes) < 1 MiB.
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "optiflow/core/vocabulary.h"
#include "optiflow/plugin/abi/nccl_tuner.h"
#include "optiflow/schedcache/writer.h"

namespace {

namespace core = optiflow::core;
namespace sc = optiflow::schedcache;

constexpr int kEntries = 10000;
constexpr std::uint32_t kRanks = 8;

sc::Plan bigPlan() {
  sc::Plan plan;
  plan.source = "tuner_bench";
  const int perColl = kEntries / static_cast<int>(sc::kNumCollectives);
  for (std::uint32_t c = 0; c < sc::kNumCollectives; ++c) {
    for (int i = 0; i < perColl; ++i) {
      sc::PlanItem it;
      it.coll = *core::collectiveFromNcclFunc(static_cast<int>(c));
      it.nRanks = kRanks;
      it.nNodes = 1;
      it.minBytes = static_cast<std::uint64_t>(i) * 4096;
      it.maxBytes = i + 1 == perColl ? ~0ULL : static_cast<std::uint64_t>(i + 1) * 4096 - 1;
      it.algorithm = i % 2 == 0 ? core::Algorithm::Ring : core::Algorithm::Tree;
      it.protocol = core::protocolFromNccl(i % 3);
      it.nChannels = 1 + i % 16;
      it.nativeUs = 10;
      plan.items.push_back(it);
    }
  }
  return plan;
}

struct Fixture {
  std::string ns;
  void* lib = nullptr;
  const ncclTuner_v5_t* tuner = nullptr;
  void* ctx = nullptr;
  std::size_t privateBytes = 0;
  bool published = false;
  std::vector<std::size_t> sizes;

  // distinctSizes: the sizes the calls cycle through (with all five collectives). 4,096 random sizes make 20,480
  // (collective, size) pairs, far more than the segment's 2,048 records of NCCL's choices: most calls then probe a
  // full table (the worst case); a job's usual few dozen sizes find their record at once.
  Fixture(bool publish, const char* name, std::size_t distinctSizes)
      : ns("bench-" + std::to_string(getpid()) + "-" + name) {
    if (publish) {
      sc::Error e;
      sc::WriterOptions o;
      o.ns = ns;
      auto w = sc::Writer::open(o, &e);
      if (!w || !w->publish(bigPlan(), &e)) {
        std::fprintf(stderr, "tuner_bench: cannot publish: %s\n", e.message.c_str());
        std::exit(1);
      }
      published = true;
    }
    setenv("OPTIFLOW_NAMESPACE", ns.c_str(), 1);
    setenv("OPTIFLOW_SETTLE_S", "0", 1);  // the segment is milliseconds old; see docs/consistency.md
    lib = dlopen(OPTIFLOW_TUNER_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::fprintf(stderr, "tuner_bench: %s\n", dlerror());
      std::exit(1);
    }
    tuner = static_cast<const ncclTuner_v5_t*>(dlsym(lib, "ncclTunerPlugin_v5"));
    ncclNvlDomainInfo_v5_t nvl{1, 8, 8};
    ncclTunerConstants_v5_t constants{};
    const std::size_t before = mallinfo2().uordblks;
    if (tuner->init(&ctx, 0x5eed, kRanks, 1, nullptr, &nvl, &constants) != ncclSuccess) std::exit(1);
    privateBytes = mallinfo2().uordblks - before;
    std::mt19937_64 rng(1);
    for (std::size_t i = 0; i < distinctSizes; ++i) sizes.push_back(rng() % (std::size_t{1} << 30));
  }
  ~Fixture() {
    tuner->finalize(ctx);
    dlclose(lib);
    sc::Error e;
    sc::Writer::remove(ns, &e);
  }
};

void run(benchmark::State& state, Fixture& f) {
  float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  std::size_t i = 0;
  int applied = 0;
  for (auto _ : state) {
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) table[a][p] = a < 2 ? 10.0f + static_cast<float>(p) : -1.0f;
    }
    int nChannels = 0;
    f.tuner->getCollInfo(f.ctx, static_cast<ncclFunc_t>(i % 5), f.sizes[i % f.sizes.size()], 1,
                         reinterpret_cast<float**>(table), NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &nChannels);
    applied += nChannels > 0 ? 1 : 0;
    benchmark::DoNotOptimize(table);
    ++i;
  }
  if (f.published && applied == 0) state.SkipWithError("the plan was never applied: the benchmark measures nothing");
  state.counters["private_bytes"] = static_cast<double>(f.privateBytes);
  state.counters["applied_fraction"] = static_cast<double>(applied) / static_cast<double>(i == 0 ? 1 : i);
}

void BM_GetCollInfo_Plan10k(benchmark::State& state) {
  static Fixture f(true, "plan", 4096);
  run(state, f);
}
BENCHMARK(BM_GetCollInfo_Plan10k);

// The same plan, 64 sizes: every (collective, size) keeps its record of NCCL's choice, as in a job with a few dozen
// sizes per communicator.
void BM_GetCollInfo_Plan10k_64Sizes(benchmark::State& state) {
  static Fixture f(true, "plan64", 64);
  run(state, f);
}
BENCHMARK(BM_GetCollInfo_Plan10k_64Sizes);

// The same call without a segment: what NCCL pays for loading the plugin when no plan exists.
void BM_GetCollInfo_NoSegment(benchmark::State& state) {
  static Fixture f(false, "none", 4096);
  run(state, f);
}
BENCHMARK(BM_GetCollInfo_NoSegment);

}  // namespace
