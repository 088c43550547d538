// The profiler plugin as NCCL 2.27-2.30 drives it: libnccl-profiler-optiflow.so (and the same tables in
// libnccl-net-optiflow.so) dlopen'ed, ncclProfiler_v4/_v5/_v6 looked up, and events sent in NCCL's real order
// (docs/profiler.md): the collective event is started and *stopped* on the enqueuing thread when the kernel is
// enqueued, and only later does the proxy thread report each channel (start with the GPU start stamp, the
// KernelChStop state with the stop stamp, stop), with several collectives in flight and their channels interleaved.
// What the plugin measured is read back from the segment with the schedule cache's reader.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "abi_test_support.h"
#include "optiflow/plugin/abi/nccl_profiler.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "run_command.h"
#include "temp_dir.h"

namespace optiflow::abitest {
namespace {

constexpr std::uint64_t kComm = 0x1234abcd5678ef01ULL;
constexpr int kExpectedMask = ncclProfileColl | ncclProfileKernelCh;

// NCCL's side of the profiler ABI, one interface over the three versions: it lays out each version's descriptor
// (v4's 8-bit type, v5/v6's 64-bit one) as NCCL does.
class ProfilerHost {
 public:
  ProfilerHost(const Library& lib, int version) : version_(version) {
    if (version == 4) v4_ = lib.table<ncclProfiler_v4_t>("ncclProfiler_v4");
    if (version == 5) v5_ = lib.table<ncclProfiler_v5_t>("ncclProfiler_v5");
    if (version == 6) v6_ = lib.table<ncclProfiler_v6_t>("ncclProfiler_v6");
  }
  bool loaded() const { return v4_ != nullptr || v5_ != nullptr || v6_ != nullptr; }
  const char* name() const { return v4_ ? v4_->name : v5_ ? v5_->name : v6_->name; }

  ncclResult_t init(void** ctx, std::uint64_t commId, int* mask, int nRanks, int rank = 0) const {
    if (v4_) return v4_->init(ctx, mask, "comm", commId, 1, nRanks, rank, captureLogger);
    if (v5_) return v5_->init(ctx, commId, mask, "comm", 1, nRanks, rank, captureLogger);
    return v6_->init(ctx, commId, mask, "comm", 1, nRanks, rank, captureLogger);
  }

  struct Coll {
    const char* func = "AllReduce";
    std::size_t count = 1024;
    const char* datatype = "ncclFloat32";
    const char* algo = "Ring";
    const char* proto = "Simple";
    std::uint8_t nChannels = 2;
  };

  void* startColl(void* ctx, const Coll& c, std::uint64_t seq = 0) const {
    return start(ctx, ncclProfileColl, nullptr, [&](auto& d) {
      d.coll.seqNumber = seq;
      d.coll.func = c.func;
      d.coll.count = c.count;
      d.coll.datatype = c.datatype;
      d.coll.nChannels = c.nChannels;
      d.coll.nWarps = 16;
      d.coll.algo = c.algo;
      d.coll.proto = c.proto;
    });
  }
  void* startKernelCh(void* ctx, void* parent, std::uint8_t channel, std::uint64_t startNs) const {
    return start(ctx, ncclProfileKernelCh, parent, [&](auto& d) {
      d.kernelCh.channelId = channel;
      d.kernelCh.pTimer = startNs;
    });
  }
  // Any event type with a zeroed union (types the plugin did not subscribe to).
  void* startOther(void* ctx, std::uint64_t type, void* parent) const {
    return start(ctx, type, parent, [](auto&) {});
  }
  ncclResult_t startRaw(void* ctx, void** handle, std::uint64_t type) const {
    return dispatch([&](auto* t, auto& d) {
      d.type = static_cast<decltype(d.type)>(type);
      return t->startEvent(ctx, handle, &d);
    });
  }
  ncclResult_t stop(void* handle) const { return stopFn()(handle); }
  ncclResult_t kernelChStop(void* handle, std::uint64_t stopNs) const {
    ncclProfilerEventStateArgs_v4_t a{};
    a.kernelCh.pTimer = stopNs;
    return record(handle, ncclProfilerKernelChStop, &a);
  }
  ncclResult_t record(void* handle, ncclProfilerEventState_v4_t state, ncclProfilerEventStateArgs_v4_t* args) const {
    if (v4_) return v4_->recordEventState(handle, state, args);
    if (v5_) return v5_->recordEventState(handle, state, args);
    return v6_->recordEventState(handle, state, args);
  }
  ncclResult_t finalize(void* ctx) const {
    if (v4_) return v4_->finalize(ctx);
    if (v5_) return v5_->finalize(ctx);
    return v6_->finalize(ctx);
  }

  // One channel as the proxy thread reports it: start, KernelChStop with the stop stamp, stop.
  void channel(void* ctx, void* parent, std::uint8_t ch, std::uint64_t startNs, std::uint64_t stopNs) const {
    void* h = startKernelCh(ctx, parent, ch, startNs);
    if (h == nullptr) return;  // NCCL sends nothing more for a null handle
    kernelChStop(h, stopNs);
    stop(h);
  }

 private:
  template <typename F>
  ncclResult_t dispatch(F&& f) const {
    if (v4_) {
      ncclProfilerEventDescr_v4_t d{};
      return f(v4_, d);
    }
    if (v5_) {
      ncclProfilerEventDescr_v5_t d{};
      return f(v5_, d);
    }
    ncclProfilerEventDescr_v6_t d{};
    return f(v6_, d);
  }
  template <typename Fill>
  void* start(void* ctx, std::uint64_t type, void* parent, Fill&& fill) const {
    void* handle = reinterpret_cast<void*>(0x1);  // NCCL's slot holds garbage until the plugin writes it
    const ncclResult_t r = dispatch([&](auto* t, auto& d) {
      d.type = static_cast<decltype(d.type)>(type);
      d.parentObj = parent;
      d.rank = 0;
      fill(d);
      return t->startEvent(ctx, &handle, &d);
    });
    EXPECT_EQ(r, ncclSuccess);
    return handle;
  }
  ncclResult_t (*stopFn() const)(void*) { return v4_ ? v4_->stopEvent : v5_ ? v5_->stopEvent : v6_->stopEvent; }

  int version_;
  const ncclProfiler_v4_t* v4_ = nullptr;
  const ncclProfiler_v5_t* v5_ = nullptr;
  const ncclProfiler_v6_t* v6_ = nullptr;
};

// A namespace with a fresh segment (what optiflowd or `optiflow cache publish` creates), removed afterwards.
class Segment {
 public:
  Segment() : ns_(uniqueNamespace()) {
    schedcache::WriterOptions options;
    options.ns = ns_;
    options.build = "profiler-abi-test";
    schedcache::Error e;
    writer_ = schedcache::Writer::open(options, &e);
    EXPECT_NE(writer_, nullptr) << e.message;
    ::setenv("OPTIFLOW_NAMESPACE", ns_.c_str(), 1);
    reader_ = schedcache::Reader::attach(ns_, &e);
    EXPECT_NE(reader_, nullptr) << e.message;
  }
  ~Segment() {
    reader_.reset();
    writer_.reset();
    removeNamespace(ns_);
  }
  const std::string& ns() const { return ns_; }
  std::vector<schedcache::Measurement> measurements() const { return reader_->measurements(); }
  schedcache::MeasureCounters counters() const { return reader_->measureCounters(); }
  // The row of one size (the tests give every collective its own size).
  std::optional<schedcache::Measurement> row(std::uint64_t sizeBytes) const {
    for (const auto& m : measurements()) {
      if (m.sizeBytes == sizeBytes) return m;
    }
    return std::nullopt;
  }

 private:
  std::string ns_;
  std::unique_ptr<schedcache::Writer> writer_;
  std::unique_ptr<schedcache::Reader> reader_;
};

// The proxy thread: runs what the enqueuing thread hands it, in order, after the collective events were stopped.
class ProxyThread {
 public:
  ProxyThread() : thread_([this] { run(); }) {}
  ~ProxyThread() { join(); }
  void post(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    cv_.notify_one();
  }
  void join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool done_ = false;
  std::thread thread_;
};

std::string versionName(const ::testing::TestParamInfo<int>& info) { return "v" + std::to_string(info.param); }

class ProfilerVersions : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    capturedLog().clear();
    lib_ = Library::open(OPTIFLOW_PROFILER_PLUGIN);
    ASSERT_TRUE(lib_) << dlerrorText();
    host_.emplace(lib_, GetParam());
    ASSERT_TRUE(host_->loaded()) << "ncclProfiler_v" << GetParam() << " not exported";
  }
  CleanEnvironment env_;
  Library lib_;
  std::optional<ProfilerHost> host_;
};

TEST_P(ProfilerVersions, InitSubscribesToCollectiveAndKernelChannelEventsOnly) {
  Segment seg;
  int mask = -1;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 8), ncclSuccess);
  EXPECT_EQ(mask, kExpectedMask);
  EXPECT_STREQ(host_->name(), "OptiFlow");
  // Every communicator's init writes NCCL's one process-wide mask: the same value each time.
  int mask2 = 0;
  void* ctx2 = nullptr;
  ASSERT_EQ(host_->init(&ctx2, kComm + 1, &mask2, 8), ncclSuccess);
  EXPECT_EQ(mask2, kExpectedMask);
  EXPECT_EQ(host_->finalize(ctx2), ncclSuccess);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);

  ::setenv("OPTIFLOW_PROFILER", "off", 1);
  mask = -1;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 8), ncclSuccess);
  EXPECT_EQ(mask, 0);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
}

// The trap: stopEvent(Coll) comes at enqueue, before any channel has run; the kernel events come later from
// another thread. The time is the span of the channels' GPU stamps.
TEST_P(ProfilerVersions, CollectiveStoppedBeforeItsChannelsIsTimedFromTheirGpuStamps) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 8), ncclSuccess);
  ProfilerHost::Coll c;
  c.func = "AllGather";
  c.count = 1000;  // per rank: 1000 x 2 B x 8 ranks = 16000 B, the nccl-tests size
  c.datatype = "ncclBfloat16";
  c.algo = "Ring";
  c.proto = "LL128";
  c.nChannels = 4;
  void* coll = host_->startColl(ctx, c);
  ASSERT_NE(coll, nullptr);
  ASSERT_EQ(host_->stop(coll), ncclSuccess);  // enqueued, not run
  EXPECT_TRUE(seg.measurements().empty()) << "recorded before its channels reported";
  {
    ProxyThread proxy;
    const std::uint64_t t0 = 1'765'000'000'000'000'000ULL;
    proxy.post([&] { host_->channel(ctx, coll, 0, t0 + 100, t0 + 20'100); });
    proxy.post([&] { host_->channel(ctx, coll, 1, t0 + 50, t0 + 19'000); });   // earliest start
    proxy.post([&] { host_->channel(ctx, coll, 2, t0 + 300, t0 + 25'050); });  // latest stop
    proxy.post([&] { host_->channel(ctx, coll, 3, t0 + 200, t0 + 21'000); });
  }
  const auto row = seg.row(16000);
  ASSERT_TRUE(row) << "no row for 16000 B";
  EXPECT_EQ(row->commId, kComm);
  EXPECT_EQ(row->coll, core::Collective::AllGather);
  EXPECT_EQ(row->algorithm, core::Algorithm::Ring);
  EXPECT_EQ(row->protocol, core::Protocol::LL128);
  EXPECT_EQ(row->channels, 4u);
  EXPECT_EQ(row->calls, 1u);
  EXPECT_DOUBLE_EQ(row->minUs, 25.0);  // (t0 + 25050) - (t0 + 50) ns
  EXPECT_NEAR(row->medianUs, 25.0, 25.0 * 0.032);
  EXPECT_EQ(row->lastNs, static_cast<std::int64_t>(1'765'000'000'000'000'000ULL + 25'050));
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
}

// A group: several collectives started and stopped, then the proxy reports their channels interleaved, in an order
// unrelated to the collectives'. Each collective gets exactly its own channels' span.
TEST_P(ProfilerVersions, CollectivesInFlightTogetherKeepTheirOwnChannels) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 2), ncclSuccess);
  constexpr int kColls = 6;
  constexpr int kChannels = 3;
  std::vector<void*> colls;
  for (int i = 0; i < kColls; ++i) {
    ProfilerHost::Coll c;
    c.func = "AllReduce";
    c.count = 256u << i;  // 1 KiB << i, one row each
    c.nChannels = kChannels;
    colls.push_back(host_->startColl(ctx, c, static_cast<std::uint64_t>(i)));
    ASSERT_NE(colls.back(), nullptr);
  }
  for (void* h : colls) host_->stop(h);
  struct Ch {
    int coll;
    std::uint8_t ch;
    void* handle = nullptr;
  };
  std::vector<Ch> order;
  for (int i = 0; i < kColls; ++i) {
    for (int ch = 0; ch < kChannels; ++ch) order.push_back({i, static_cast<std::uint8_t>(ch)});
  }
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  const std::uint64_t t0 = 1'000'000'000ULL;
  // Collective i spans 10 us x (i + 1): its channels start at t0 + i and stop at most at t0 + i + span.
  auto startOf = [&](const Ch& c) { return t0 + static_cast<std::uint64_t>(c.coll) * 1000 + c.ch; };
  auto stopOf = [&](const Ch& c) {
    return t0 + static_cast<std::uint64_t>(c.coll) * 1000 + static_cast<std::uint64_t>(c.coll + 1) * 10'000 -
           static_cast<std::uint64_t>(kChannels - 1 - c.ch) * 7;
  };
  {
    ProxyThread proxy;
    // Every channel started before any stops: they are all in flight at once.
    proxy.post([&] {
      for (Ch& c : order)
        c.handle = host_->startKernelCh(ctx, colls[static_cast<std::size_t>(c.coll)], c.ch, startOf(c));
      std::shuffle(order.begin(), order.end(), rng);
      for (Ch& c : order) {
        ASSERT_NE(c.handle, nullptr);
        host_->kernelChStop(c.handle, stopOf(c));
      }
      std::shuffle(order.begin(), order.end(), rng);
      for (Ch& c : order) host_->stop(c.handle);
    });
  }
  for (int i = 0; i < kColls; ++i) {
    const auto row = seg.row((256u << i) * 4u);
    ASSERT_TRUE(row) << "collective " << i;
    EXPECT_EQ(row->calls, 1u) << i;
    // span = last stop (channel kChannels-1) - first start (channel 0)
    const double spanUs = (static_cast<double>(i + 1) * 10'000.0) / 1000.0;
    EXPECT_DOUBLE_EQ(row->minUs, spanUs) << "collective " << i;
  }
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
}

// Calls of one configuration pool into one row: the minimum, the median and p90 come from the sketch.
TEST_P(ProfilerVersions, RepeatedCallsGiveMinimumMedianAndP90) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 4), ncclSuccess);
  ProfilerHost::Coll c;
  c.func = "ReduceScatter";
  c.count = 4096;
  c.datatype = "ncclFloat32";
  c.algo = "PAT";
  c.proto = "Simple";
  c.nChannels = 1;
  ProxyThread proxy;
  // 100 calls of 1..100 us, shuffled.
  std::vector<std::uint64_t> us(100);
  for (std::size_t i = 0; i < us.size(); ++i) us[i] = i + 1;
  std::mt19937 rng(3);
  std::shuffle(us.begin(), us.end(), rng);
  for (std::size_t i = 0; i < us.size(); ++i) {
    void* h = host_->startColl(ctx, c, i);
    ASSERT_NE(h, nullptr);
    host_->stop(h);
    const std::uint64_t start = 5'000'000'000ULL + i * 1'000'000ULL;
    const std::uint64_t stop = start + us[i] * 1000;
    proxy.post([=, this] { host_->channel(ctx, h, 0, start, stop); });
  }
  proxy.join();
  const auto row = seg.row(4096u * 4u * 4u);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->coll, core::Collective::ReduceScatter);
  EXPECT_EQ(row->algorithm, core::Algorithm::Pat);
  EXPECT_EQ(row->calls, 100u);
  EXPECT_DOUBLE_EQ(row->minUs, 1.0);
  EXPECT_NEAR(row->meanUs, 50.5, 1e-9);
  EXPECT_NEAR(row->medianUs, 50.0, 50.0 * 0.032);
  EXPECT_NEAR(row->p90Us, 90.0, 90.0 * 0.032);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
}

// A channel without a GPU stamp (0, or a stop before its start): the collective is not timed, only counted.
TEST_P(ProfilerVersions, CollectiveWithoutGpuStampsIsNotTimed) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 2), ncclSuccess);
  ProfilerHost::Coll c;
  c.nChannels = 2;
  void* a = host_->startColl(ctx, c);
  host_->stop(a);
  host_->channel(ctx, a, 0, 1000, 5000);
  host_->channel(ctx, a, 1, 0, 0);  // no stamps
  c.count = 2048;
  void* b = host_->startColl(ctx, c);
  host_->stop(b);
  host_->channel(ctx, b, 0, 9000, 5000);  // stop before start
  host_->channel(ctx, b, 1, 1000, 5000);
  EXPECT_TRUE(seg.measurements().empty());
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
  EXPECT_GE(seg.counters().untimed, 2u);
}

// Types the plugin never subscribed to (NCCL may send some anyway), null and foreign handles, a foreign context:
// no handle, no crash, nothing recorded, the foreign ones counted.
TEST_P(ProfilerVersions, UnknownTypesNullAndForeignHandlesAreIgnored) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 2), ncclSuccess);
  for (std::uint64_t type :
       {std::uint64_t{ncclProfileGroup}, std::uint64_t{ncclProfileP2p}, std::uint64_t{ncclProfileProxyOp},
        std::uint64_t{ncclProfileProxyStep}, std::uint64_t{ncclProfileProxyCtrl}, std::uint64_t{ncclProfileNetPlugin},
        std::uint64_t{ncclProfileCollApi}, std::uint64_t{0}, std::uint64_t{1} << 7 | 1, std::uint64_t{0xff}}) {
    EXPECT_EQ(host_->startOther(ctx, type, nullptr), nullptr) << "type " << type;
  }
  // Null handles, a null descriptor, a null handle slot.
  EXPECT_EQ(host_->stop(nullptr), ncclSuccess);
  EXPECT_EQ(host_->kernelChStop(nullptr, 5), ncclSuccess);
  EXPECT_EQ(host_->record(nullptr, ncclProfilerKernelChStop, nullptr), ncclSuccess);
  EXPECT_EQ(host_->startRaw(ctx, nullptr, ncclProfileColl), ncclSuccess);
  // Foreign handles: memory the plugin never gave out.
  std::uint64_t foreign[16] = {ncclProfileColl, ncclProfileKernelCh};
  EXPECT_EQ(host_->stop(&foreign[0]), ncclSuccess);
  EXPECT_EQ(host_->kernelChStop(&foreign[1], 5), ncclSuccess);
  EXPECT_EQ(host_->startKernelCh(ctx, &foreign[0], 0, 100), nullptr);
  // A collective of a foreign context (NCCL never does this; the plugin must not believe it either).
  ProfilerHost::Coll c;
  EXPECT_EQ(host_->startColl(&foreign[0], c), nullptr);
  EXPECT_EQ(host_->startColl(nullptr, c), nullptr);
  // A kernel handle used as a parent, a collective stopped twice, more channels than announced.
  c.nChannels = 1;
  void* coll = host_->startColl(ctx, c);
  ASSERT_NE(coll, nullptr);
  host_->stop(coll);
  EXPECT_EQ(host_->stop(coll), ncclSuccess);
  void* ch = host_->startKernelCh(ctx, coll, 0, 1000);
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(host_->startKernelCh(ctx, coll, 1, 1000), nullptr) << "a channel beyond the announced count";
  EXPECT_EQ(host_->startKernelCh(ctx, ch, 0, 1000), nullptr) << "a channel as a parent";
  host_->kernelChStop(ch, 3000);
  host_->stop(ch);
  EXPECT_EQ(host_->stop(ch), ncclSuccess) << "stopped twice";
  // Unknown collective names and datatypes: not timed.
  ProfilerHost::Coll odd;
  odd.func = "Gather";
  EXPECT_EQ(host_->startColl(ctx, odd), nullptr);
  odd.func = "AllReduce";
  odd.datatype = "ncclQuaternion";
  EXPECT_EQ(host_->startColl(ctx, odd), nullptr);
  odd.datatype = nullptr;
  EXPECT_EQ(host_->startColl(ctx, odd), nullptr);

  const auto rows = seg.measurements();
  ASSERT_EQ(rows.size(), 1u);  // only the well-formed collective
  EXPECT_EQ(rows[0].calls, 1u);
  EXPECT_DOUBLE_EQ(rows[0].minUs, 2.0);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
  EXPECT_EQ(host_->finalize(nullptr), ncclSuccess);
  EXPECT_EQ(host_->finalize(&foreign[0]), ncclSuccess);
  EXPECT_GE(seg.counters().foreign, 5u);
}

// Without a segment the plugin records nothing, says so once per process, and hands out no handles.
TEST_P(ProfilerVersions, WithoutASegmentRecordsNothingAndSaysSoOnce) {
  LibraryCopy copy(OPTIFLOW_PROFILER_PLUGIN);  // fresh statics: the "once" is per process and library
  ASSERT_FALSE(copy.path().empty());
  Library lib = Library::open(copy.path());
  ASSERT_TRUE(lib) << dlerrorText();
  ProfilerHost host(lib, GetParam());
  const std::string ns = uniqueNamespace();
  ::setenv("OPTIFLOW_NAMESPACE", ns.c_str(), 1);
  capturedLog().clear();
  std::vector<void*> ctxs(3);
  for (void*& ctx : ctxs) {
    int mask = 0;
    ASSERT_EQ(host.init(&ctx, kComm, &mask, 2), ncclSuccess);
    EXPECT_EQ(mask, kExpectedMask);
    ProfilerHost::Coll c;
    EXPECT_EQ(host.startColl(ctx, c), nullptr);
  }
  int said = 0;
  for (const LogLine& l : capturedLog()) {
    if (l.text.find("OptiFlow/Profiler:") == 0 && l.text.find("records nothing") != std::string::npos) ++said;
  }
  EXPECT_EQ(said, 1) << logDump();
  for (void* ctx : ctxs) EXPECT_EQ(host.finalize(ctx), ncclSuccess);
}

// More collectives in flight than the fixed pool holds: the excess is dropped and counted, never a crash; the pool
// is whole again after finalize.
TEST_P(ProfilerVersions, PoolOverflowIsCountedNotFatal) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 2), ncclSuccess);
  ProfilerHost::Coll c;
  c.nChannels = 1;
  int got = 0;
  for (int i = 0; i < 5000; ++i) {  // the pool holds 4096: channels never come, the records stay open
    void* h = host_->startColl(ctx, c, static_cast<std::uint64_t>(i));
    if (h != nullptr) ++got;
  }
  EXPECT_LT(got, 5000);
  EXPECT_GT(got, 0);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
  EXPECT_GT(seg.counters().poolFull, 0u);
  EXPECT_GE(seg.counters().untimed, static_cast<std::uint64_t>(got)) << "open records released at finalize";
  // A new communicator finds a free pool.
  ASSERT_EQ(host_->init(&ctx, kComm + 7, &mask, 2), ncclSuccess);
  void* h = host_->startColl(ctx, c);
  ASSERT_NE(h, nullptr);
  host_->stop(h);
  host_->channel(ctx, h, 0, 100, 1100);
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
  bool found = false;
  for (const auto& m : seg.measurements()) found = found || (m.commId == kComm + 7 && m.calls == 1);
  EXPECT_TRUE(found);
}

// Two threads as in NCCL, many rounds: the enqueuing thread starts and stops groups of collectives and hands their
// handles to the proxy thread, which reports every channel; every call is recorded exactly once.
TEST_P(ProfilerVersions, EnqueuingAndProxyThreadsUnderLoad) {
  Segment seg;
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host_->init(&ctx, kComm, &mask, 8), ncclSuccess);
  constexpr int kRounds = 300;
  constexpr int kGroup = 4;
  {
    ProxyThread proxy;
    for (int r = 0; r < kRounds; ++r) {
      std::vector<void*> group;
      for (int g = 0; g < kGroup; ++g) {
        ProfilerHost::Coll c;
        c.func = "AllReduce";
        c.count = 1024u << g;
        c.nChannels = static_cast<std::uint8_t>(g + 1);
        group.push_back(host_->startColl(ctx, c, static_cast<std::uint64_t>(r * kGroup + g)));
      }
      // Even rounds: NCCL's order (collectives stopped, then channels). Odd rounds: the channels race the stops, so
      // either thread may drop the last hold.
      if (r % 2 == 0) {
        for (void* h : group) host_->stop(h);
      }
      proxy.post([=, this] {
        for (int g = kGroup - 1; g >= 0; --g) {
          for (int ch = 0; ch <= g; ++ch) {
            const std::uint64_t start =
                1'000'000ULL * static_cast<std::uint64_t>(r + 1) + static_cast<std::uint64_t>(ch);
            host_->channel(ctx, group[static_cast<std::size_t>(g)], static_cast<std::uint8_t>(ch), start,
                           start + 1000u * static_cast<std::uint64_t>(g + 1));
          }
        }
      });
      if (r % 2 == 1) {
        for (void* h : group) host_->stop(h);
      }
    }
  }
  std::uint64_t calls = 0;
  for (const auto& m : seg.measurements()) calls += m.calls;
  EXPECT_EQ(calls, static_cast<std::uint64_t>(kRounds * kGroup));
  EXPECT_EQ(host_->finalize(ctx), ncclSuccess);
  EXPECT_EQ(seg.counters().poolFull, 0u);
}

INSTANTIATE_TEST_SUITE_P(Versions, ProfilerVersions, ::testing::Values(4, 5, 6), versionName);

// Only the profiler tables leave the library; the net library carries the same tables (NCCL looks there when no
// profiler library is found), and they time into the same segment.
TEST(ProfilerExports, OnlyTheProfilerTablesAreExported) {
  testsupport::TempDir dir;
  const testsupport::CommandResult r =
      testsupport::runCommand(std::string("nm -D --defined-only ") + OPTIFLOW_PROFILER_PLUGIN, dir.path());
  ASSERT_EQ(r.rc, 0) << r.all();
  std::set<std::string> names;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string value, type, name;
    if (!(fields >> value >> type >> name) || type == "A") continue;
    names.insert(name.substr(0, name.find('@')));
  }
  EXPECT_EQ(names, (std::set<std::string>{"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6"})) << r.out;
}

TEST(ProfilerExports, NetLibraryCarriesTheProfiler) {
  CleanEnvironment env;
  Segment seg;
  Library lib = Library::open(OPTIFLOW_NET_PLUGIN);
  ASSERT_TRUE(lib) << dlerrorText();
  ProfilerHost host(lib, 5);
  ASSERT_TRUE(host.loaded());
  int mask = 0;
  void* ctx = nullptr;
  ASSERT_EQ(host.init(&ctx, kComm, &mask, 2), ncclSuccess);
  EXPECT_EQ(mask, kExpectedMask);
  ProfilerHost::Coll c;
  c.nChannels = 1;
  void* h = host.startColl(ctx, c);
  ASSERT_NE(h, nullptr);
  host.stop(h);
  host.channel(ctx, h, 0, 2000, 9000);
  EXPECT_EQ(host.finalize(ctx), ncclSuccess);
  ASSERT_EQ(seg.measurements().size(), 1u);
  EXPECT_DOUBLE_EQ(seg.measurements()[0].minUs, 7.0);
}

}  // namespace
}  // namespace optiflow::abitest
