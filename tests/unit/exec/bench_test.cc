// optiflow-bench's driver without a GPU: its arguments, batch directories, the run over schedules x sizes x modes
// on the CPU backend, its JSON, and its text output read back by the nccl-tests log reader of `optiflow calibrate`.
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/calib/nccl_tests_log.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/schedule_json.h"
#include "optiflow/exec/bench.h"
#include "temp_dir.h"

namespace optiflow::exec {
namespace {

namespace fx = core::fixtures;

core::Result<ParsedArgs> parse(std::vector<std::string> args, bool cuda = true) {
  args.insert(args.begin(), "optiflow-bench");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parseBenchArgs(static_cast<int>(argv.size()), argv.data(), cuda);
}

TEST(BenchArgs, DefaultsAndOptions) {
  auto p = parse({"a.json", "--sizes", "1KiB:4KiB", "--iters", "7", "--warmup", "0", "--check", "-G", "4", "--nccl"});
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->options.backend, "cuda");
  EXPECT_EQ(p->options.sizes, (std::vector<std::uint64_t>{1024, 2048, 4096}));
  EXPECT_EQ(p->options.iters, 7);
  EXPECT_EQ(p->options.warmup, 0);
  EXPECT_EQ(p->options.graph, 4);
  EXPECT_TRUE(p->options.check);
  EXPECT_TRUE(p->options.nccl);
  auto d = parse({"a.json"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->options.sizes.front(), 1024u);
  EXPECT_EQ(d->options.sizes.back(), 1u << 30);
  auto h = parse({"--help"});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->help);
  EXPECT_NE(h->helpText.find("--rendezvous"), std::string::npos);
}

TEST(BenchArgs, ErrorsSayWhatWasExpected) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "nothing to time"},
      {{"a.json", "--sizes", "big"}, "--sizes"},
      {{"a.json", "--sizes", "0"}, "a size of 0"},
      {{"a.json", "--iters", "0"}, "--iters"},
      {{"a.json", "--backend", "gpu"}, "--backend"},
      {{"a.json", "--backend", "cpu", "--nccl"}, "--nccl needs --backend cuda"},
      {{"a.json", "--backend", "cpu", "-G", "2"}, "-G needs --backend cuda"},
      {{"a.json", "--rendezvous", "h:1", "--rendezvous-dir", "/tmp"}, "give one of them"},
      {{"a.json", "--bogus"}, "--bogus"},
  };
  for (const auto& [args, fragment] : cases) {
    auto p = parse(args);
    ASSERT_FALSE(p.ok()) << fragment;
    EXPECT_NE(p.error().message.find(fragment), std::string::npos) << p.error().message;
  }
  auto noCuda = parse({"a.json"}, false);
  ASSERT_FALSE(noCuda.ok());
  EXPECT_NE(noCuda.error().message.find("built without CUDA and NCCL"), std::string::npos);
  EXPECT_TRUE(parse({"a.json", "--backend", "cpu"}, false).ok());
}

TEST(BenchItems, FilesAndBatchDirectories) {
  testsupport::TempDir dir("bench");
  const core::Schedule ring = fx::ringAllGather({.nRanks = 4, .channels = 1});
  dir.write("ring.json", core::scheduleToJson(ring));
  std::filesystem::create_directory(dir.path() / "batch");
  std::vector<BenchItem> items = {{"r0c1", "", ring, {1024, 4096}}, {"r0c2", "", ring, {}}};
  dir.write("batch/a.json", core::scheduleToJson(ring));
  dir.write("batch/b.json", core::scheduleToJson(ring));
  dir.write("batch/batch.json", batchManifestJson(items, {"a.json", "b.json"}));
  auto loaded = loadBenchItems({dir.file("ring.json"), dir.file("batch")});
  ASSERT_TRUE(loaded.ok()) << loaded.error().str();
  ASSERT_EQ(loaded->size(), 3u);
  EXPECT_EQ((*loaded)[0].id, "ring.json");
  EXPECT_EQ((*loaded)[1].id, "r0c1");
  EXPECT_EQ((*loaded)[1].sizes, (std::vector<std::uint64_t>{1024, 4096}));
  EXPECT_TRUE((*loaded)[2].sizes.empty());
  EXPECT_EQ((*loaded)[1].schedule, ring);

  // Errors name the file.
  std::filesystem::create_directory(dir.path() / "bad");
  dir.write("bad/batch.json",
            R"({"format": "optiflow-bench-batch", "items": [{"id": "x", "schedule": "../ring.json"}]})");
  auto escape = loadBenchItems({dir.file("bad")});
  ASSERT_FALSE(escape.ok());
  EXPECT_NE(escape.error().str().find("batch.json"), std::string::npos);
  dir.write("bad/batch.json", "not json");
  EXPECT_FALSE(loadBenchItems({dir.file("bad")}).ok());
  EXPECT_FALSE(loadBenchItems({dir.file("missing.json")}).ok());
}

BenchOptions cpuOptions(std::vector<std::uint64_t> sizes) {
  BenchOptions o;
  o.backend = "cpu";
  o.sizes = std::move(sizes);
  o.iters = 2;
  o.warmup = 1;
  o.check = true;
  o.timeoutS = 60;
  return o;
}

TEST(BenchRun, CpuBackendTimesAndChecksEveryModeAndSize) {
  const core::Schedule both = [] {
    core::Schedule s = fx::ringAllReduce({.nRanks = 4, .channels = 2});
    return s;
  }();
  const std::vector<BenchItem> items = {{"ar", "", both, {}},
                                        {"ag-inplace", "", fx::ringAllGather({.nRanks = 3, .inPlace = true}), {}}};
  auto backend = makeCpuBenchBackend();
  std::vector<ItemResult> results;
  ASSERT_TRUE(runBench(cpuOptions({4096, 65536}), items, *backend, results));
  ASSERT_EQ(results.size(), 2u);
  for (const ItemResult& r : results) {
    EXPECT_TRUE(r.ok) << r.error;
    ASSERT_EQ(r.rows.size(), 2u);
    EXPECT_FALSE(r.lowering.empty());
  }
  const SizeRow& ar = results[0].rows[1];
  EXPECT_EQ(ar.sizeBytes, 65536u);
  EXPECT_EQ(ar.count, 16384u);
  EXPECT_TRUE(ar.outOfPlace.ran);
  EXPECT_GT(ar.outOfPlace.timeUs, 0);
  EXPECT_EQ(ar.outOfPlace.wrong, 0);
  const SizeRow& ag = results[1].rows[0];
  EXPECT_FALSE(ag.outOfPlace.ran);  // the schedule claims in-place only
  EXPECT_TRUE(ag.inPlace.ran);
  EXPECT_EQ(ag.inPlace.wrong, 0);
  EXPECT_EQ(ag.sizeBytes % 12, 0u);  // 3 ranks x 4 bytes: rounded as nccl-tests rounds
}

TEST(BenchRun, ABrokenScheduleFailsItsItemAndTheRunGoesOn) {
  core::Schedule broken = fx::ringAllGather({.nRanks = 4, .channels = 1});
  broken.ranks[2].threadBlocks[0].steps.pop_back();  // a receive missing: its send is never received
  const std::vector<BenchItem> items = {{"broken", "", broken, {}},
                                        {"ok", "", fx::ringAllGather({.nRanks = 4, .channels = 1}), {}}};
  auto backend = makeCpuBenchBackend();
  std::vector<ItemResult> results;
  EXPECT_FALSE(runBench(cpuOptions({4096}), items, *backend, results));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_NE(results[0].error.find("never receives"), std::string::npos) << results[0].error;
  EXPECT_TRUE(results[1].ok);
}

TEST(BenchOutput, CalibrateReadsTheTextLikeNcclTests) {
  const std::vector<BenchItem> items = {{"ring ag", "", fx::ringAllGather({.nRanks = 4, .channels = 1}), {}},
                                        {"ar", "", fx::ringAllReduce({.nRanks = 4, .channels = 1}), {}},
                                        {"ip", "", fx::ringReduceScatter({.nRanks = 4, .inPlace = true}), {}}};
  auto backend = makeCpuBenchBackend();
  const BenchOptions o = cpuOptions({1024, 8192, 65536});
  std::vector<ItemResult> results;
  ASSERT_TRUE(runBench(o, items, *backend, results));
  std::ostringstream text;
  writeText(text, o, results, *backend);
  auto log = calib::parseNcclTestsLog(text.str(), "bench.log");
  ASSERT_TRUE(log.ok()) << log.error().str() << "\n" << text.str();
  ASSERT_EQ(log->runs.size(), 3u) << text.str();
  const calib::LogRun& ag = log->runs[0];
  EXPECT_EQ(ag.program, "all_gather_perf_optiflow-ring_ag");
  EXPECT_EQ(ag.collective, core::Collective::AllGather);
  EXPECT_EQ(ag.ranks, 4);
  EXPECT_EQ(ag.nodes, 1);
  EXPECT_EQ(ag.iters, 2);
  ASSERT_EQ(ag.rows.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ag.rows[i].sizeBytes, results[0].rows[i].sizeBytes);
    ASSERT_TRUE(ag.rows[i].outOfPlaceUs.has_value());
    EXPECT_NEAR(*ag.rows[i].outOfPlaceUs, results[0].rows[i].outOfPlace.timeUs,
                0.01 + 1e-3 * results[0].rows[i].outOfPlace.timeUs);
    EXPECT_EQ(ag.rows[i].outOfPlaceWrong, 0);
  }
  EXPECT_EQ(log->runs[1].collective, core::Collective::AllReduce);
  // A schedule without an out-of-place form: N/A there, the in-place time read.
  const calib::LogRun& rs = log->runs[2];
  EXPECT_EQ(rs.collective, core::Collective::ReduceScatter);
  ASSERT_EQ(rs.rows.size(), 3u) << text.str();
  EXPECT_FALSE(rs.rows[0].outOfPlaceUs.has_value());
  EXPECT_TRUE(rs.rows[0].inPlaceUs.has_value());
}

TEST(BenchOutput, JsonRoundTripsAndGarbageIsRefused) {
  const std::vector<BenchItem> items = {{"ag", "", fx::ringAllGather({.nRanks = 4, .channels = 1}), {2048}}};
  auto backend = makeCpuBenchBackend();
  const BenchOptions o = cpuOptions({1024});
  std::vector<ItemResult> results;
  ASSERT_TRUE(runBench(o, items, *backend, results));
  auto back = parseResultsJson(resultsJson(o, results, "cpu"), "out.json");
  ASSERT_TRUE(back.ok()) << back.error().str();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].id, "ag");
  ASSERT_EQ((*back)[0].rows.size(), 1u);
  EXPECT_EQ((*back)[0].rows[0].sizeBytes, 2048u);  // the item's own size, not the run's
  EXPECT_DOUBLE_EQ((*back)[0].rows[0].outOfPlace.timeUs, results[0].rows[0].outOfPlace.timeUs);
  for (const char* bad : {"", "garbage", "{}", R"({"format": "optiflow-bench-results", "results": 3})",
                          R"({"format": "optiflow-bench-results", "results": [{"id": "x", "rows": [{"size": 8,
                              "out_of_place": {"time_us": -1}}]}]})"}) {
    auto r = parseResultsJson(bad, "out.json");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().file, "out.json");
    }
  }
}

}  // namespace
}  // namespace optiflow::exec
