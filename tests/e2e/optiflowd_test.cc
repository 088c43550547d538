// optiflowd as an operator runs it: the built binary started with a config in a temp directory, on a namespace of
// its own ("e2e-d-<pid>-<n>", removed at the end whatever happens). It publishes a plan that the tuner plugin
// (dlopen'ed as NCCL does it) applies, serves /healthz and /metrics, reloads on SIGHUP, stops on SIGTERM within 2 s,
// refuses a second daemon on its namespace, survives a SIGKILL in the middle of a publish with the cache readable,
// follows the jobs' activity but pauses while they are busy, and stays small. Synthesis is kept tiny (one
// collective, one or two sizes, one round of two candidates) so each daemon's first pass takes a fraction of a second.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "abi_test_support.h"
#include "llm_test_support.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "optiflowd_test_support.h"

namespace optiflow::daemontest {
namespace {

namespace sc = optiflow::schedcache;

const std::string kDaemon = OPTIFLOWD_BINARY;
const std::string kCli = OPTIFLOW_CLI;
const std::string kTunerLib = OPTIFLOW_TUNER_PLUGIN;

constexpr double kFirstPlanS = 120;  // the issue: a first plan within two minutes
constexpr double kStartS = 30;       // until /healthz answers
constexpr double kStopS = 2;         // the issue: SIGTERM/SIGINT -> exit within 2 s (printed, not asserted)
// Under AddressSanitizer (make asan) a candidate evaluates several times slower and the shadow memory counts as
// resident: the deadlines are scaled and the footprint target is checked in the release build (make test) only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
constexpr double kSlowdown = kSanitized ? 3 : 1;
// The stop is a liveness property here: a daemon that does not exit by this deadline hangs. The 2 s target is the
// printed "SIGTERM -> exit in" figure; asserting it on a loaded CI machine would test the machine.
constexpr double kStopDeadlineS = 15 * kStopS * kSlowdown;
// For what happens within a second of a signal or a config write (a log line, a metric): only a hang waits this long.
constexpr double kReactS = 30 * kSlowdown;

struct ConfigOptions {
  std::string proposer = "builtin";
  std::vector<std::string> collectives = {"allgather"};
  std::vector<std::string> sizes = {"64KiB", "1MiB"};
  int rounds = 1;
  int candidates = 2;
  std::string logLevel = "info";
  bool logJson = false;
  double cpuCores = 1.0;
  double busyCallsPerS = 50;
  double idleWindowS = 2;
  std::string llmEndpoint;  // with proposer = "llm"
  std::string llmKeyEnv;
  int trialCalls = 10;  // [synthesis] trial_calls
};

std::string tomlList(const std::vector<std::string>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s + "]";
}

std::size_t lineCount(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

class Optiflowd : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    ++counter;
    ns_ = fmt::format("e2e-d-{}-{}", ::getpid(), counter);
    dir_ = fs::temp_directory_path() / fmt::format("optiflowd-e2e-{}-{}", ::getpid(), counter);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "state");
    removeNamespace(ns_);
  }

  void TearDown() override {
    for (std::unique_ptr<Child>& d : daemons_) {
      if (d->running()) {
        d->signal(SIGKILL);
        d->waitExit(kStopDeadlineS);
      }
      if (HasFailure()) std::cerr << "---- optiflowd pid " << d->pid() << " log:\n" << d->log() << "----\n";
    }
    daemons_.clear();
    removeNamespace(ns_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string configText(const ConfigOptions& o) const {
    std::string t = fmt::format(
        "# optiflowd e2e test\n"
        "version = 1\n"
        "\n"
        "[cache]\n"
        "namespace = \"{}\"\n"
        "\n"
        "[topology]\n"
        "preset = \"dgx-a100\"\n"
        "\n"
        "[synthesis]\n"
        "proposer = \"{}\"\n"
        "evaluator = \"simulator\"\n"
        "collectives = {}\n"
        "sizes = {}\n"
        "rounds = {}\n"
        "candidates_per_round = {}\n"
        "interval_s = 3600\n"
        "trial_calls = {}\n"
        "state_dir = \"{}\"\n"
        "seed = 1\n"
        "\n"
        "[budget]\n"
        "cpu_cores = {}\n"
        "nice = 10\n"
        "busy_calls_per_s = {}\n"
        "idle_window_s = {}\n"
        "\n"
        "[probe]\n"
        "enabled = false\n"
        "\n"
        "[metrics]\n"
        "address = \"127.0.0.1\"\n"
        "port = 0\n"
        "\n"
        "[log]\n"
        "level = \"{}\"\n"
        "json = {}\n",
        ns_, o.proposer, tomlList(o.collectives), tomlList(o.sizes), o.rounds, o.candidates, o.trialCalls,
        (dir_ / "state").string(), fmt::format("{:.2f}", o.cpuCores), fmt::format("{:.1f}", o.busyCallsPerS),
        fmt::format("{:.1f}", o.idleWindowS), o.logLevel, o.logJson);
    if (!o.llmEndpoint.empty()) {
      t += fmt::format("\n[llm]\nendpoint = \"{}\"\nmodel = \"test-model\"\napi_key_env = \"{}\"\ntimeout_s = 10\n",
                       o.llmEndpoint, o.llmKeyEnv);
    }
    return t;
  }

  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }
  fs::path writeConfig(const ConfigOptions& o, const std::string& name = "optiflowd.toml") const {
    return write(name, configText(o));
  }

  Child& startDaemon(const fs::path& config, const EnvList& env = {}) {
    daemons_.push_back(std::make_unique<Child>());
    Child& d = *daemons_.back();
    std::string error;
    const fs::path log = dir_ / fmt::format("optiflowd-{}.log", daemons_.size());
    EXPECT_TRUE(d.start({kDaemon, "--config", config.string()}, env, log, &error)) << error;
    return d;
  }

  // The port the daemon's HTTP server bound (the config asks for port 0): from its log line, or a file in the state
  // directory. 0 when it does not say within kStartS (or it exited).
  int metricsPort(Child& d) {
    static const std::regex kLine(R"((?:metrics|http|listening|serving)[^\n]*?127\.0\.0\.1:([0-9]{2,5}))",
                                  std::regex::icase);
    int port = 0;
    waitFor(
        [&] {
          std::smatch m;
          const std::string log = d.log();
          if (std::regex_search(log, m, kLine)) port = std::stoi(m[1]);
          for (const char* name : {"metrics.port", "metrics_port", "http.port", "port"}) {
            const std::string text = slurp(dir_ / "state" / name);
            if (port == 0 && !text.empty()) port = std::atoi(text.c_str());
          }
          return port > 0 || !d.running();
        },
        kStartS);
    return port;
  }

  // Waits for the daemon to answer /healthz 200; its metrics port, or 0.
  int waitHealthy(Child& d) {
    const int port = metricsPort(d);
    if (port == 0) {
      ADD_FAILURE() << "optiflowd (pid " << d.pid() << ") did not tell its metrics port within " << kStartS
                    << " s; log:\n"
                    << d.log();
      return 0;
    }
    HttpReply r;
    const bool ok = waitFor([&] { return (r = httpGet(port, "/healthz")).status == 200 || !d.running(); }, kStartS);
    EXPECT_TRUE(ok && r.status == 200) << "/healthz on port " << port << ": " << r.status << " " << r.error << " "
                                       << r.body;
    return port;
  }

  std::optional<sc::PlanInfo> currentPlan() const {
    sc::Error e;
    std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &e);
    if (!reader) return std::nullopt;
    sc::PlanInfo info;
    if (reader->current(&info) != sc::Status::kOk) return std::nullopt;
    return info;
  }

  // Waits for a current plan other than `notHash`; nullopt (and a failure naming the log) when none came.
  std::optional<sc::PlanInfo> waitForPlan(Child& d, std::uint64_t notHash = 0, double timeoutS = kFirstPlanS) {
    std::optional<sc::PlanInfo> info;
    const auto t0 = Clock::now();
    waitFor(
        [&] {
          info = currentPlan();
          return (info && info->contentHash != notHash) || !d.running();
        },
        timeoutS, 100);
    if (!info || info->contentHash == notHash) {
      ADD_FAILURE() << "no new plan current in " << ns_ << " after " << secondsSince(t0) << " s (daemon "
                    << (d.running() ? "running" : "exited") << ")";
      return std::nullopt;
    }
    std::cout << "[ info ] plan " << sc::formatHash(info->contentHash) << " current after " << secondsSince(t0)
              << " s\n";
    return info;
  }

  Scrape scrape(int port) {
    const HttpReply r = httpGet(port, "/metrics");
    EXPECT_EQ(r.status, 200) << r.error;
    Scrape s = parsePrometheus(r.body);
    EXPECT_EQ(s.error, "") << r.body;
    return s;
  }

  RunResult cli(const std::string& args) {
    std::vector<std::string> argv = {kCli};
    std::istringstream in(args);
    for (std::string a; in >> a;) argv.push_back(a);
    return runProgram(argv, {}, dir_ / "cli.log", 60);
  }

  std::string ns_;
  fs::path dir_;
  std::vector<std::unique_ptr<Child>> daemons_;
};

// The tuner plugin as NCCL drives it (abi_test_support.h): dlopen'ed, ncclTunerPlugin_v5, NCCL-laid-out cost tables,
// on namespace `ns`, with OPTIFLOW_SETTLE_S=0 (the daemon's segment is seconds old). Communicators are finalized and
// the environment restored on destruction.
class Tuner {
 public:
  explicit Tuner(const std::string& ns) : env_(std::make_unique<abitest::CleanEnvironment>()) {
    ::setenv("OPTIFLOW_NAMESPACE", ns.c_str(), 1);
    abitest::capturedLog().clear();
    lib_ = abitest::Library::open(kTunerLib);
    if (lib_) v5_ = lib_.table<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  }
  ~Tuner() {
    for (void* ctx : comms_) v5_->finalize(ctx);
    lib_.reset();
    env_.reset();
  }
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  bool ok() const { return v5_ != nullptr; }
  // A new communicator (tuner init); nullptr when init fails.
  void* init(std::uint64_t commId, std::uint32_t nRanks, std::uint32_t nNodes) {
    const int perNode = static_cast<int>(nRanks / nNodes);
    ncclNvlDomainInfo_v5_t nvl{static_cast<int>(nNodes), perNode, perNode};
    ncclTunerConstants_v5_t constants = abitest::sentinelConstants();
    void* ctx = nullptr;
    if (v5_->init(&ctx, commId, nRanks, nNodes, abitest::captureLogger, &nvl, &constants) != ncclSuccess) {
      return nullptr;
    }
    comms_.push_back(ctx);
    return ctx;
  }
  struct Call {
    ncclResult_t rc = ncclInternalError;
    abitest::CostTable<7> table;
    int nChannels = 0;
  };
  Call call(void* ctx, core::Collective coll, std::uint64_t nBytes) const {
    Call c;
    c.table = abitest::ncclLikeTable<7>();
    c.rc = v5_->getCollInfo(ctx, static_cast<ncclFunc_t>(*core::ncclFuncIndex(coll)), nBytes, 1, c.table.nccl(), 7,
                            NCCL_NUM_PROTOCOLS, 0, &c.nChannels);
    return c;
  }

 private:
  std::unique_ptr<abitest::CleanEnvironment> env_;
  abitest::Library lib_;
  const ncclTuner_v5_t* v5_ = nullptr;
  std::vector<void*> comms_;
};

// The first entry of `plan` (of collective `coll` when given) the tuner can apply to the tables below: an algorithm
// and a protocol, not CollNet (unavailable, -1, as on a node without SHARP).
const sc::PlanItem* applicableItem(const sc::Plan& plan, std::optional<core::Collective> coll = std::nullopt) {
  for (const sc::PlanItem& it : plan.items) {
    if (coll && it.coll != *coll) continue;
    if (!it.algorithm || !it.protocol || it.algorithm == core::Algorithm::CollNetDirect ||
        it.algorithm == core::Algorithm::CollNetChain) {
      continue;
    }
    return &it;
  }
  return nullptr;
}

// Empty when `call` shows the decision of `item` (an applicableItem) applied (its entry 0.0 and NCCL's pick, its
// channels); else why not.
std::string notApplied(const Tuner::Call& call, const sc::PlanItem& item) {
  const int algo = core::ncclIndex(*item.algorithm);
  const int proto = core::ncclIndex(*item.protocol);
  std::string why;
  if (call.rc != ncclSuccess) why += fmt::format("getCollInfo returned {}; ", static_cast<int>(call.rc));
  if (call.table.v[algo][proto] != 0.0f || !(abitest::ncclPick(call.table) == abitest::Choice{algo, proto})) {
    why += fmt::format("{}/{} not chosen; ", core::toString(*item.algorithm), core::toString(*item.protocol));
  }
  if (call.nChannels != item.nChannels) why += fmt::format("nChannels {} != {}; ", call.nChannels, item.nChannels);
  return why.empty() ? why : why + "log:\n" + abitest::logDump();
}

// A new communicator's first calls of an entry with trials try its candidates (docs/consistency.md); the decision
// applies after them.
void callThroughTrials(const Tuner& tuner, void* ctx, const sc::PlanItem& item) {
  for (std::size_t i = 0; i < item.trials.size() * item.trialCalls; ++i) tuner.call(ctx, item.coll, item.minBytes);
}

std::optional<sc::Plan> loadPlan(const std::string& ns, std::uint64_t hash) {
  sc::Error e;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns, &e);
  if (!reader) return std::nullopt;
  sc::Plan plan;
  sc::PlanInfo info;
  std::string detail;
  if (reader->loadPlan(hash, &plan, &info, &detail) != sc::Status::kOk) return std::nullopt;
  return plan;
}

// A communicator of the plan's shape applies the daemon's decision for one of its entries.
void expectTunerApplies(const std::string& ns, const sc::Plan& plan, std::uint64_t hash) {
  const sc::PlanItem* pick = applicableItem(plan);
  ASSERT_NE(pick, nullptr) << "the daemon's plan has no entry with an algorithm and protocol the tuner can apply";
  Tuner tuner(ns);
  ASSERT_TRUE(tuner.ok()) << abitest::dlerrorText();
  // A multi-node communicator uses a plan only when the job pins it (docs/consistency.md).
  if (pick->nNodes > 1) ::setenv("OPTIFLOW_PLAN", sc::formatHash(hash).c_str(), 1);
  void* ctx = tuner.init(0x0e2ed0000001ull, pick->nRanks, pick->nNodes);
  ASSERT_NE(ctx, nullptr) << abitest::logDump();
  callThroughTrials(tuner, ctx, *pick);
  EXPECT_EQ(notApplied(tuner.call(ctx, pick->coll, pick->minBytes), *pick), "")
      << core::toString(pick->coll) << " " << pick->minBytes << " B on " << pick->nRanks << " ranks";
  const std::vector<std::string> info = abitest::tunerLines(NCCL_LOG_INFO);
  EXPECT_TRUE(std::any_of(info.begin(), info.end(), [&](const std::string& l) {
    return contains(l, "using plan") && contains(l, sc::formatHash(hash));
  })) << abitest::logDump();
}

// 1. Config in a temp dir -> a plan within two minutes, /healthz, /metrics, and the tuner applies the plan.
TEST_F(Optiflowd, PublishesAPlanTheTunerAppliesAndServesHealthAndMetrics) {
  Child& d = startDaemon(writeConfig({}));
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  const std::optional<sc::PlanInfo> info = waitForPlan(d);
  ASSERT_TRUE(info);
  EXPECT_GT(info->entryCount, 0u);

  const HttpReply health = httpGet(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");

  const HttpReply metrics = httpGet(port, "/metrics");
  ASSERT_EQ(metrics.status, 200) << metrics.error;
  EXPECT_TRUE(contains(metrics.contentType, "text/plain")) << metrics.contentType;
  EXPECT_TRUE(contains(metrics.contentType, "version=0.0.4")) << metrics.contentType;
  const Scrape s = parsePrometheus(metrics.body);
  ASSERT_EQ(s.error, "") << metrics.body;
  EXPECT_EQ(s.value("optiflowd_up"), 1.0) << metrics.body;
  EXPECT_GE(s.value("optiflowd_plans_published_total").value_or(0), 1.0) << metrics.body;
  EXPECT_EQ(s.types.count("optiflowd_plans_published_total") ? s.types.at("optiflowd_plans_published_total") : "",
            "counter");
  EXPECT_GE(s.value("optiflowd_synthesis_rounds_total").value_or(0), 1.0) << metrics.body;
  // One best speedup per synthesized size, labelled with the collective.
  const auto speedups = s.family("optiflowd_best_speedup");
  EXPECT_FALSE(speedups.empty()) << metrics.body;
  for (const auto& [key, v] : speedups) {
    EXPECT_TRUE(contains(key, "collective=\"allgather\"")) << key;
    EXPECT_GT(v, 0.0) << key;
  }
  EXPECT_EQ(httpGet(port, "/no-such-page").status, 404);

  sc::Error e;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &e);
  ASSERT_TRUE(reader) << e.message;
  sc::Plan plan;
  sc::PlanInfo planInfo;
  std::string detail;
  ASSERT_EQ(reader->loadPlan(0, &plan, &planInfo, &detail), sc::Status::kOk) << detail;
  EXPECT_EQ(planInfo.contentHash, info->contentHash);
  EXPECT_EQ(sc::contentHash(plan), info->contentHash);
  expectTunerApplies(ns_, plan, info->contentHash);
  EXPECT_TRUE(d.running()) << d.log();
}

// 2. SIGHUP re-reads the config; a broken one is logged (file and line) and the daemon keeps serving.
TEST_F(Optiflowd, SighupReloadsAndABrokenConfigKeepsTheDaemonRunning) {
  ConfigOptions o;
  const fs::path config = writeConfig(o);
  Child& d = startDaemon(config);
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  const std::optional<sc::PlanInfo> first = waitForPlan(d);
  ASSERT_TRUE(first);
  const double reloads0 = scrape(port).value("optiflowd_config_reloads_total").value_or(0);

  // Another log level, budget and collective: the reload applies all three, and the work runs a pass for the new
  // collective at once.
  o.logLevel = "debug";
  o.cpuCores = 0.5;
  o.collectives = {"allgather", "reducescatter"};
  writeConfig(o);
  d.signal(SIGHUP);
  double reloads = reloads0;
  EXPECT_TRUE(waitFor(
      [&] { return (reloads = scrape(port).value("optiflowd_config_reloads_total").value_or(0)) >= reloads0 + 1; },
      kReactS))
      << "optiflowd_config_reloads_total stayed at " << reloads << " after SIGHUP; log:\n"
      << d.log();
  EXPECT_EQ(reloads, reloads0 + 1);
  const std::optional<sc::PlanInfo> second = waitForPlan(d, first->contentHash, 60);
  ASSERT_TRUE(second);
  const std::optional<sc::Plan> plan = loadPlan(ns_, second->contentHash);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(std::any_of(plan->items.begin(), plan->items.end(), [](const sc::PlanItem& it) {
    return it.coll == core::Collective::ReduceScatter;
  })) << "the plan after the reload has no reducescatter entry";

  // An unknown section on a known line (the key under it on the next).
  std::string broken = configText(o);
  const std::size_t tableLine = lineCount(broken) + 2;
  broken += "\n[budget2]\ncpu_corez = 1\n";
  const fs::path brokenFile = write("optiflowd.toml", broken);
  d.signal(SIGHUP);
  EXPECT_TRUE(waitFor([&] { return contains(d.log(), brokenFile.string() + ":"); }, kReactS))
      << "no log line naming " << brokenFile << " after SIGHUP with a broken config; log:\n"
      << d.log();
  const std::string log = d.log();
  EXPECT_TRUE(contains(log, fmt::format("{}:{}", brokenFile.string(), tableLine)) ||
              contains(log, fmt::format("{}:{}", brokenFile.string(), tableLine + 1)))
      << "the error names neither line " << tableLine << " nor " << tableLine + 1 << ":\n"
      << log;
  EXPECT_TRUE(contains(log, "budget2")) << log;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(d.running());
  EXPECT_EQ(httpGet(port, "/healthz").status, 200);
  const Scrape after = scrape(port);
  EXPECT_EQ(after.value("optiflowd_config_reloads_total").value_or(0), reloads0 + 1)
      << "a refused reload was counted as a reload";
  EXPECT_EQ(after.value("optiflowd_up"), 1.0);
  EXPECT_GE(after.value("optiflowd_errors_total{kind=\"config\"}").value_or(0), 1.0)
      << "the refused reload is not counted";

  // Fixed again: the next SIGHUP applies it.
  o.logLevel = "info";
  writeConfig(o);
  d.signal(SIGHUP);
  EXPECT_TRUE(waitFor([&] { return scrape(port).value("optiflowd_config_reloads_total").value_or(0) >= reloads0 + 2; },
                      kReactS))
      << d.log();
  EXPECT_TRUE(d.running());
}

// 3. SIGTERM: exit 0, promptly (the issue: within 2 s; see kStopDeadlineS); the cache stays valid and the plan
// current.
TEST_F(Optiflowd, SigtermStopsPromptlyAndLeavesTheCacheValid) {
  Child& d = startDaemon(writeConfig({}));
  ASSERT_GT(waitHealthy(d), 0);
  const std::optional<sc::PlanInfo> info = waitForPlan(d);
  ASSERT_TRUE(info);

  const auto t0 = Clock::now();
  d.signal(SIGTERM);
  const std::optional<int> code = d.waitExit(kStopDeadlineS);
  const double stopS = secondsSince(t0);
  std::cout << "[ info ] SIGTERM -> exit in " << stopS << " s (target " << kStopS << " s)\n";
  RecordProperty("sigterm_exit_ms", static_cast<int>(stopS * 1000));
  ASSERT_TRUE(code.has_value()) << "still running " << kStopDeadlineS << " s after SIGTERM";
  EXPECT_EQ(*code, 0) << d.log();

  const RunResult verify = cli("cache verify --namespace " + ns_);
  EXPECT_EQ(verify.rc, 0) << verify.output;
  const std::optional<sc::PlanInfo> still = currentPlan();
  ASSERT_TRUE(still);
  EXPECT_EQ(still->contentHash, info->contentHash);
}

// ... also in the middle of a synthesis pass (three collectives, many sizes, several rounds: far longer than the
// stop deadline, so a daemon that finished the pass before exiting fails).
TEST_F(Optiflowd, SigtermDuringSynthesisStopsPromptly) {
  ConfigOptions o;
  o.collectives = {"allreduce", "allgather", "reducescatter"};
  o.sizes = {"1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB", "256MiB"};
  o.rounds = 6;
  o.candidates = 8;
  Child& d = startDaemon(writeConfig(o));
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  // Into the first pass (its first workload alone takes tens of seconds here).
  EXPECT_TRUE(waitFor([&] { return contains(d.log(), "synthesizing"); }, kReactS)) << d.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(d.running()) << d.log();
  const bool midPass = !currentPlan().has_value();

  const auto t0 = Clock::now();
  d.signal(SIGINT);
  const std::optional<int> code = d.waitExit(kStopDeadlineS);
  const double stopS = secondsSince(t0);
  std::cout << "[ info ] SIGINT " << (midPass ? "mid-pass" : "after the first publish") << " -> exit in " << stopS
            << " s (target " << kStopS << " s)\n";
  RecordProperty("sigint_mid_pass_exit_ms", static_cast<int>(stopS * 1000));
  ASSERT_TRUE(code.has_value()) << "still running " << kStopDeadlineS << " s after SIGINT; log:\n" << d.log();
  EXPECT_EQ(*code, 0) << d.log();
  EXPECT_TRUE(midPass) << "the first workload was done within 0.5 s: this test no longer stops a pass";
  // Whatever was in flight, the segment is sound.
  if (fs::exists(sc::segmentPath(ns_))) {
    const RunResult verify = cli("cache verify --namespace " + ns_);
    EXPECT_EQ(verify.rc, 0) << verify.output;
  }
}

// 4. A second daemon on the namespace is refused with exit code 3, naming the first one's pid.
TEST_F(Optiflowd, SecondDaemonOnTheNamespaceIsRefused) {
  const fs::path config = writeConfig({});
  Child& first = startDaemon(config);
  ASSERT_GT(waitHealthy(first), 0);

  Child& second = startDaemon(config);
  const std::optional<int> code = second.waitExit(kReactS);
  ASSERT_TRUE(code.has_value()) << "the second daemon is still running; log:\n" << second.log();
  EXPECT_EQ(*code, 3) << second.log();
  const std::string log = second.log();
  EXPECT_TRUE(contains(log, std::to_string(first.pid()))) << "does not name pid " << first.pid() << ":\n" << log;
  EXPECT_TRUE(contains(log, ns_)) << log;
  EXPECT_TRUE(first.running());
}

// 5. --check-config: 0 and "ok" on a good file; 2 and file:line plus the key on a bad one; the cache is untouched.
TEST_F(Optiflowd, CheckConfigAcceptsGoodAndNamesFileLineKeyOfBad) {
  const fs::path good = writeConfig({});
  const RunResult ok = runProgram({kDaemon, "--config", good.string(), "--check-config"}, {}, dir_ / "check.log", 30);
  EXPECT_EQ(ok.rc, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, good.string())) << ok.output;
  EXPECT_TRUE(contains(ok.output, "ok")) << ok.output;

  struct Bad {
    std::string name, find, badLine, key;  // badLine replaces the line `find`, or follows it when it is the key's
  };
  const Bad cases[] = {
      {"unknown-key.toml", "seed = 1", "candidates_per_rund = 2", "candidates_per_rund"},
      {"wrong-type.toml", "rounds = 1", "rounds = \"many\"", "rounds"},
      {"out-of-range.toml", "cpu_cores = 1.00", "cpu_cores = 0", "cpu_cores"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    std::string text = configText({});
    const std::size_t at = text.find(c.find + "\n");
    ASSERT_NE(at, std::string::npos) << c.find;
    const bool insert = c.find.rfind(c.key, 0) != 0;
    text.replace(at, c.find.size() + 1, (insert ? c.find + "\n" : "") + c.badLine + "\n");
    const std::size_t lineNo = lineCount(text.substr(0, text.find(c.badLine + "\n"))) + 1;
    const fs::path bad = write(c.name, text);
    const RunResult r = runProgram({kDaemon, "--config", bad.string(), "--check-config"}, {}, dir_ / "check.log", 30);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_TRUE(contains(r.output, fmt::format("{}:{}", bad.string(), lineNo)))
        << "expected " << bad.string() << ":" << lineNo << " in:\n"
        << r.output;
    EXPECT_TRUE(contains(r.output, c.key)) << r.output;
  }
  EXPECT_FALSE(fs::exists(sc::segmentPath(ns_))) << "--check-config created the namespace's segment";
}

// 6. The language-model proposer against a local OpenAI-compatible endpoint: requests go out, a plan is published.
TEST_F(Optiflowd, LlmProposerAgainstALocalEndpointPublishesAPlan) {
  synth::llmtest::FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(
        synth::llmtest::completionJson("Two ideas.\n\n```ofl\nallgather ring_a\n  allgather all by ring\n```\n\n"
                                       "```ofl\nallgather direct_b\n  allgather all by direct\n```\n"),
        "application/json");
  });
  ConfigOptions o;
  o.proposer = "llm";
  o.llmEndpoint = server.baseUrl();
  o.llmKeyEnv = "E2E_OPTIFLOWD_LLM_KEY";
  const std::string secret = "e2e-secret-k3y";
  Child& d = startDaemon(writeConfig(o), {{"E2E_OPTIFLOWD_LLM_KEY", secret}});
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  ASSERT_TRUE(waitForPlan(d));
  const std::vector<synth::llmtest::SeenRequest> seen = server.seen();
  ASSERT_GE(seen.size(), 1u) << d.log();
  EXPECT_TRUE(contains(seen[0].target, "/v1/chat/completions")) << seen[0].target;
  EXPECT_EQ(seen[0].authorization, "Bearer " + secret);
  EXPECT_TRUE(contains(seen[0].body, "test-model")) << seen[0].body.substr(0, 400);
  EXPECT_TRUE(contains(seen[0].body, "allgather")) << seen[0].body.substr(0, 400);
  EXPECT_FALSE(contains(d.log(), secret)) << "the API key was logged";
  const Scrape s = scrape(port);
  EXPECT_GE(s.value("optiflowd_plans_published_total").value_or(0), 1.0);
  EXPECT_EQ(s.value("optiflowd_errors_total{kind=\"synthesis\"}").value_or(0), 0.0);
}

// 7. SIGKILL while a publish is half written: the cache stays readable with the previous plan current, and a new
// daemon takes over the namespace (the kernel dropped the lock) and publishes.
TEST_F(Optiflowd, KillDuringPublishLeavesTheCacheReadableAndTheNamespaceFree) {
  ConfigOptions o;
  Child& d1 = startDaemon(writeConfig(o));
  ASSERT_GT(waitHealthy(d1), 0);
  const std::optional<sc::PlanInfo> first = waitForPlan(d1);
  ASSERT_TRUE(first);
  d1.signal(SIGTERM);
  ASSERT_EQ(d1.waitExit(kStopDeadlineS), 0) << d1.log();

  // Another collective: the next plan differs, so the new daemon publishes (and stalls half-way through).
  o.collectives = {"allgather", "reducescatter"};
  const fs::path config = writeConfig(o);
  Child& d2 = startDaemon(config, {{"OPTIFLOW_TEST_PUBLISH_STALL_MS", "8000"}});
  bool inStall = false;
  std::vector<std::string> report;
  waitFor(
      [&] {
        sc::Error e;
        std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &e);
        if (!reader) return !d2.running();
        report.clear();
        reader->check(&report);
        inStall = std::any_of(report.begin(), report.end(), [](const std::string& l) { return contains(l, "odd"); });
        return inStall || !d2.running();
      },
      kFirstPlanS, 5);
  ASSERT_TRUE(inStall) << "never saw a slot being written; log:\n" << d2.log();
  d2.signal(SIGKILL);
  ASSERT_EQ(d2.waitExit(kStopDeadlineS), -SIGKILL);

  sc::Error e;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &e);
  ASSERT_TRUE(reader) << e.message;
  sc::PlanInfo current;
  ASSERT_EQ(reader->current(&current), sc::Status::kOk);
  EXPECT_EQ(current.contentHash, first->contentHash) << "the half-written plan became current";
  report.clear();
  EXPECT_TRUE(reader->check(&report)) << abitest::joinLines(report);
  const RunResult verify = cli("cache verify --namespace " + ns_);
  EXPECT_EQ(verify.rc, 0) << verify.output;

  // The namespace is free again and the abandoned slot is no obstacle to the next publish.
  Child& d3 = startDaemon(config);
  ASSERT_GT(waitHealthy(d3), 0);
  const std::optional<sc::PlanInfo> next = waitForPlan(d3, first->contentHash);
  ASSERT_TRUE(next);
  d3.signal(SIGTERM);
  EXPECT_EQ(d3.waitExit(kStopDeadlineS), 0);
  const RunResult verify2 = cli("cache verify --namespace " + ns_);
  EXPECT_EQ(verify2.rc, 0) << verify2.output;
}

// The loop the issue describes, end to end: a job's calls (recorded by the tuner in the cache) make the daemon
// synthesize that collective and size, but not while the job is busy; the new plan reaches new communicators only.
TEST_F(Optiflowd, JobActivityDrivesTheWorkBusyPeriodsPauseItAndOnlyNewCommunicatorsSwitch) {
  ConfigOptions o;
  o.sizes = {"64KiB"};
  o.idleWindowS = 0.5;
  Child& d = startDaemon(writeConfig(o));
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  const std::optional<sc::PlanInfo> first = waitForPlan(d);
  ASSERT_TRUE(first);

  Tuner tuner(ns_);
  ASSERT_TRUE(tuner.ok()) << abitest::dlerrorText();
  void* oldComm = tuner.init(0x0e2ed0000010ull, 8, 1);
  ASSERT_NE(oldComm, nullptr) << abitest::logDump();
  constexpr std::uint64_t kSize = 1u << 20;
  // A training job: allreduce of 1 MiB at ~1000 calls/s (busy: the config says 50/s).
  std::atomic<bool> jobRuns{true};
  std::atomic<long> calls{0};
  std::thread job([&] {
    while (jobRuns) {
      tuner.call(oldComm, core::Collective::AllReduce, kSize);
      ++calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  // The job has been at it for a while (300 calls: 0.3 s at its pace, longer on a loaded machine) before the work
  // looks. Then it stays busy until the work has paused for over a second, polled with a deadline only a daemon
  // that never pauses reaches.
  EXPECT_TRUE(waitFor([&] { return calls >= 300; }, kReactS, 5)) << "the job made " << calls << " calls";
  d.signal(SIGHUP);  // the work looks at the activity now instead of at its next poll (30 s)
  double busy = 0;
  const bool sawBusy =
      waitFor([&] { return (busy = scrape(port).value("optiflowd_jobs_busy").value_or(0)) == 1; }, kReactS);
  double pausedWhileBusy = 0;
  waitFor(
      [&] {
        pausedWhileBusy = scrape(port).value("optiflowd_work_paused_seconds_total").value_or(0);
        return pausedWhileBusy > 1.0;
      },
      kReactS);
  const std::optional<sc::PlanInfo> duringJob = currentPlan();
  jobRuns = false;
  job.join();
  const auto jobEnd = Clock::now();
  EXPECT_TRUE(sawBusy) << "optiflowd_jobs_busy never became 1 while the job made " << calls << " calls";
  ASSERT_TRUE(duringJob);
  EXPECT_EQ(duringJob->contentHash, first->contentHash)
      << "a plan was synthesized and published while the job was busy";
  EXPECT_GT(pausedWhileBusy, 1.0) << "optiflowd_work_paused_seconds_total";

  const std::optional<sc::PlanInfo> next = waitForPlan(d, first->contentHash, 60);
  ASSERT_TRUE(next);
  std::cout << "[ info ] the job made " << calls << " calls; new plan " << secondsSince(jobEnd)
            << " s after it went idle\n";
  const std::optional<sc::Plan> plan = loadPlan(ns_, next->contentHash);
  ASSERT_TRUE(plan);
  const sc::PlanItem* allreduce = nullptr;
  for (const sc::PlanItem& it : plan->items) {
    if (it.coll == core::Collective::AllReduce && it.nRanks == 8 && it.minBytes <= kSize && kSize <= it.maxBytes) {
      allreduce = &it;
    }
  }
  ASSERT_NE(allreduce, nullptr) << "the plan after the job has no allreduce entry for 1 MiB on 8 ranks";

  // The running communicator keeps the plan it started with (no allreduce decision: NCCL's choice stands)...
  const Tuner::Call old = tuner.call(oldComm, core::Collective::AllReduce, kSize);
  EXPECT_TRUE(old.table == abitest::ncclLikeTable<7>()) << "a running communicator switched plans";
  // ... a new one gets the new plan.
  if (allreduce->algorithm && allreduce->algorithm != core::Algorithm::CollNetDirect &&
      allreduce->algorithm != core::Algorithm::CollNetChain && allreduce->protocol) {
    void* newComm = tuner.init(0x0e2ed0000011ull, 8, 1);
    ASSERT_NE(newComm, nullptr) << abitest::logDump();
    callThroughTrials(tuner, newComm, *allreduce);
    EXPECT_EQ(notApplied(tuner.call(newComm, core::Collective::AllReduce, kSize), *allreduce), "");
  }
}

// The shipped example (daemon/etc/optiflowd.toml) as it is, with the OPTIFLOW_* overrides a test (or a second
// instance on a laptop) needs: namespace, metrics port, state directory.
TEST_F(Optiflowd, ExampleConfigRunsAsShippedWithEnvironmentOverrides) {
  const std::string example = std::string(OPTIFLOW_SOURCE_DIR) + "/daemon/etc/optiflowd.toml";
  const EnvList env = {
      {"OPTIFLOW_NAMESPACE", ns_}, {"OPTIFLOW_METRICS_PORT", "0"}, {"OPTIFLOW_STATE_DIR", (dir_ / "state").string()}};
  const RunResult check = runProgram({kDaemon, "--config", example, "--check-config"}, env, dir_ / "check.log", 30);
  EXPECT_EQ(check.rc, 0) << check.output;
  EXPECT_TRUE(contains(check.output, "ok")) << check.output;
  EnvList bad = env;
  bad[1].second = "port9464";
  const RunResult badCheck = runProgram({kDaemon, "--config", example, "--check-config"}, bad, dir_ / "check.log", 30);
  EXPECT_EQ(badCheck.rc, 2) << badCheck.output;
  EXPECT_TRUE(contains(badCheck.output, "OPTIFLOW_METRICS_PORT")) << badCheck.output;

  Child& d = startDaemon(example, env);
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  EXPECT_NE(port, 9464) << "OPTIFLOW_METRICS_PORT=0 was not applied";
  const std::optional<sc::PlanInfo> info = waitForPlan(d);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source.rfind((dir_ / "state").string(), 0), 0u)
      << "the plan was not published from OPTIFLOW_STATE_DIR: " << info->source;
  d.signal(SIGTERM);
  EXPECT_EQ(d.waitExit(kStopDeadlineS), 0) << d.log();
}

// [log] json = true: structured logs, one JSON object per line.
TEST_F(Optiflowd, JsonLogsAreOneObjectPerLine) {
  ConfigOptions o;
  o.logJson = true;
  Child& d = startDaemon(writeConfig(o));
  ASSERT_GT(waitHealthy(d), 0);
  ASSERT_TRUE(waitForPlan(d));
  d.signal(SIGTERM);
  ASSERT_EQ(d.waitExit(kStopDeadlineS), 0);
  std::istringstream lines(d.log());
  int n = 0;
  bool published = false;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "line " << n << " is not a JSON object: " << line;
    EXPECT_TRUE(j.contains("level") && j["level"].is_string()) << line;
    ASSERT_TRUE(j.contains("msg") && j["msg"].is_string()) << line;
    published = published || contains(j["msg"].get<std::string>(), "published plan");
  }
  EXPECT_GE(n, 2);
  EXPECT_TRUE(published) << d.log();
}

// `optiflow cache clear --remove --force` under a running daemon: it creates the segment again and publishes its plan
// there (at its next pass; SIGHUP starts one now instead of at the 30 s poll).
TEST_F(Optiflowd, RemovedCacheIsCreatedAgainWithThePlan) {
  Child& d = startDaemon(writeConfig({}));
  ASSERT_GT(waitHealthy(d), 0);
  const std::optional<sc::PlanInfo> first = waitForPlan(d);
  ASSERT_TRUE(first);
  const RunResult removed = cli("cache clear --remove --force --namespace " + ns_);
  ASSERT_EQ(removed.rc, 0) << removed.output;
  ASSERT_FALSE(fs::exists(sc::segmentPath(ns_)));
  d.signal(SIGHUP);
  std::optional<sc::PlanInfo> again;
  EXPECT_TRUE(waitFor([&] { return (again = currentPlan()).has_value(); }, 20)) << d.log();
  if (again) {
    EXPECT_EQ(again->contentHash, first->contentHash);
  }
  const RunResult verify = cli("cache verify --namespace " + ns_);
  EXPECT_EQ(verify.rc, 0) << verify.output;
  EXPECT_TRUE(d.running());
}

// 8. Footprint: idle resident memory after the first publish under 100 MiB.
TEST_F(Optiflowd, IdleResidentMemoryIsUnder100MiB) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer's shadow memory is resident: measured in the release build";
  Child& d = startDaemon(writeConfig({}));
  const int port = waitHealthy(d);
  ASSERT_GT(port, 0);
  ASSERT_TRUE(waitForPlan(d));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the pass is over; interval_s is an hour
  scrape(port);
  const long rssKiB = procStatusKiB(d.pid(), "VmRSS");
  const long hwmKiB = procStatusKiB(d.pid(), "VmHWM");
  std::cout << "[ info ] optiflowd idle VmRSS " << static_cast<double>(rssKiB) / 1024.0 << " MiB, VmHWM "
            << static_cast<double>(hwmKiB) / 1024.0 << " MiB\n";
  RecordProperty("idle_rss_kib", static_cast<int>(rssKiB));
  RecordProperty("peak_rss_kib", static_cast<int>(hwmKiB));
  ASSERT_GT(rssKiB, 0);
  EXPECT_LT(rssKiB, 100 * 1024);
}

// 9. The loop from the jobs back into the plan (docs/profiler.md). The first plan's entries carry trials and predicted
// times. A communicator runs them through the tuner plugin, which records NCCL's own choice from its cost table
// (Ring/Simple in the test's table); what the profiler plugin would measure goes into the segment; a SIGHUP makes the
// daemon look. The next plan: the entry whose decision measured faster than NCCL's own keeps it, marked measured and
// without trials; the entry whose decision measured slower has no decision (NCCL decides), so the loser is never
// published; the unmeasured entries stay predicted, with their trials.
TEST_F(Optiflowd, MeasuredEntriesOutrankPredictedOnesAndAMeasuredLoserIsNeverPublished) {
  ConfigOptions o;
  o.sizes = {"16KiB", "128KiB", "1MiB", "8MiB"};
  o.trialCalls = 3;
  Child& d = startDaemon(writeConfig(o));
  ASSERT_GT(waitHealthy(d), 0);
  const std::optional<sc::PlanInfo> first = waitForPlan(d);
  ASSERT_TRUE(first);
  const std::optional<sc::Plan> plan = loadPlan(ns_, first->contentHash);
  ASSERT_TRUE(plan);
  using core::Algorithm;
  std::vector<sc::PlanItem> decided;  // decisions the tuner can apply that are not NCCL's own in the test's table
  for (const sc::PlanItem& it : plan->items) {
    EXPECT_FALSE(it.measured) << "nothing was measured yet";
    if (!it.algorithm || !it.protocol) continue;
    EXPECT_EQ(it.trials.size(), 2u) << "NCCL's own choice and the decision, until both are measured";
    EXPECT_EQ(it.trialCalls, 3u);
    if (it.coll != core::Collective::AllGather || it.nRanks != 8 || it.nNodes != 1 ||
        it.algorithm == Algorithm::CollNetDirect || it.algorithm == Algorithm::CollNetChain ||
        (it.algorithm == Algorithm::Ring && it.protocol == core::Protocol::Simple)) {
      continue;
    }
    decided.push_back(it);
  }
  ASSERT_GE(decided.size(), 2u) << "the first plan has fewer than two decisions other than Ring/Simple";
  const sc::PlanItem winner = decided[0];
  const sc::PlanItem loser = decided[1];
  // The configured size each entry serves (its range may start at 0).
  const std::vector<std::uint64_t> sizes = {16ull << 10, 128ull << 10, 1ull << 20, 8ull << 20};  // o.sizes
  auto sizeOf = [&](const sc::PlanItem& it) {
    for (std::uint64_t b : sizes) {
      if (it.minBytes <= b && b <= it.maxBytes) return b;
    }
    return std::uint64_t{0};
  };
  const std::uint64_t winnerBytes = sizeOf(winner);
  const std::uint64_t loserBytes = sizeOf(loser);
  ASSERT_NE(winnerBytes, 0u);
  ASSERT_NE(loserBytes, 0u);

  // The job: one communicator, every configured size called through its trials and beyond (the activity then names
  // the configured sizes, so nothing is synthesized again).
  constexpr std::uint64_t kComm = 0x0e2ed0000020ull;
  {
    Tuner tuner(ns_);
    ASSERT_TRUE(tuner.ok()) << abitest::dlerrorText();
    void* ctx = tuner.init(kComm, 8, 1);
    ASSERT_NE(ctx, nullptr) << abitest::logDump();
    for (const std::uint64_t bytes : sizes) {
      for (int i = 0; i < 10; ++i) tuner.call(ctx, core::Collective::AllGather, bytes);
    }
  }
  sc::Error e;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns_, &e);
  ASSERT_TRUE(reader) << e.message;
  for (const std::uint64_t bytes : {winnerBytes, loserBytes}) {
    const std::vector<sc::NcclChoice> choices = reader->ncclChoices();
    EXPECT_TRUE(std::any_of(choices.begin(), choices.end(),
                            [&](const sc::NcclChoice& c) {
                              return c.commId == kComm && c.coll == core::Collective::AllGather &&
                                     c.sizeBytes == bytes && c.algorithm == Algorithm::Ring &&
                                     c.protocol == core::Protocol::Simple;
                            }))
        << "the tuner recorded no NCCL's own choice for " << bytes << " B";
  }

  // What the profiler plugin records (docs/profiler.md), 8 timed calls per configuration: NCCL's own choice on 16
  // channels, the decisions on their channels (or 8 where the plan leaves the count to NCCL).
  auto measure = [&](std::uint64_t size, Algorithm a, core::Protocol p, std::uint32_t channels, double us) {
    sc::MeasureRecord* r = reader->measureRecord(kComm, static_cast<std::uint8_t>(core::Collective::AllGather), size,
                                                 static_cast<std::int8_t>(core::ncclIndex(a)),
                                                 static_cast<std::int8_t>(core::ncclIndex(p)), channels);
    ASSERT_NE(r, nullptr);
    for (int i = 0; i < 8; ++i) sc::Reader::addMeasurement(r, static_cast<std::uint64_t>(us * 1000), sc::realtimeNs());
  };
  const double ownUs = 40;
  auto channelsOf = [](const sc::PlanItem& it) {
    return it.nChannels > 0 ? static_cast<std::uint32_t>(it.nChannels) : 8u;
  };
  for (const std::uint64_t bytes : {winnerBytes, loserBytes}) {
    measure(bytes, Algorithm::Ring, core::Protocol::Simple, 16, ownUs);
  }
  measure(winnerBytes, *winner.algorithm, *winner.protocol, channelsOf(winner), 0.7 * ownUs);
  measure(loserBytes, *loser.algorithm, *loser.protocol, channelsOf(loser), 1.5 * ownUs);

  d.signal(SIGHUP);  // the daemon looks now instead of at its next poll (30 s)
  // A poll that came between the rows above may have published a plan with one of them: wait for the plan that has
  // both entries measured.
  std::optional<sc::Plan> ranked;
  auto bothMeasured = [&](const sc::Plan& p) {
    int measured = 0;
    for (const sc::PlanItem& it : p.items) {
      const bool ours = it.minBytes <= winnerBytes ? winnerBytes <= it.maxBytes : false;
      const bool theirs = it.minBytes <= loserBytes ? loserBytes <= it.maxBytes : false;
      if ((ours || theirs) && it.measured) ++measured;
    }
    return measured == 2;
  };
  const bool done = waitFor(
      [&] {
        const std::optional<sc::PlanInfo> info = currentPlan();
        if (!info || info->contentHash == first->contentHash || !d.running()) return !d.running();
        ranked = loadPlan(ns_, info->contentHash);
        return ranked && bothMeasured(*ranked);
      },
      kReactS * 2, 100);
  ASSERT_TRUE(done && ranked && bothMeasured(*ranked)) << d.log();
  auto itemAt = [&](std::uint64_t bytes) -> const sc::PlanItem* {
    for (const sc::PlanItem& it : ranked->items) {
      if (it.coll == core::Collective::AllGather && it.nRanks == 8 && it.nNodes == 1 && it.minBytes <= bytes &&
          bytes <= it.maxBytes) {
        return &it;
      }
    }
    return nullptr;
  };
  const sc::PlanItem* w = itemAt(winnerBytes);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->algorithm, winner.algorithm);
  EXPECT_EQ(w->protocol, winner.protocol);
  EXPECT_EQ(w->nChannels, winner.nChannels);
  EXPECT_TRUE(w->measured);
  EXPECT_TRUE(w->trials.empty());
  EXPECT_NEAR(w->nativeUs, 0.7 * ownUs, 0.7 * ownUs * 0.04) << "the sketch's median is within 3.1%";
  EXPECT_NEAR(w->ncclUs, ownUs, ownUs * 0.04);

  const sc::PlanItem* l = itemAt(loserBytes);
  ASSERT_NE(l, nullptr);
  EXPECT_FALSE(l->algorithm) << "a configuration measured slower than NCCL's own choice was published";
  EXPECT_TRUE(l->measured);
  EXPECT_TRUE(l->trials.empty());
  EXPECT_NEAR(l->ncclUs, ownUs, ownUs * 0.04);
  for (const sc::PlanItem& it : ranked->items) {
    if (it.minBytes == w->minBytes || it.minBytes == l->minBytes) continue;
    EXPECT_FALSE(it.measured) << it.minBytes;
    if (it.algorithm) {
      EXPECT_EQ(it.trials.size(), 2u) << it.minBytes;
    }
  }

  // A new communicator gets the measured winner from its first call: its trials are over.
  {
    Tuner tuner(ns_);
    void* ctx = tuner.init(0x0e2ed0000021ull, 8, 1);
    ASSERT_NE(ctx, nullptr) << abitest::logDump();
    EXPECT_EQ(notApplied(tuner.call(ctx, core::Collective::AllGather, winnerBytes), *w), "");
    EXPECT_TRUE(tuner.call(ctx, core::Collective::AllGather, loserBytes).table == abitest::ncclLikeTable<7>());
  }

  // The operator's view: `optiflow cache show --json` says which times are measured, and the daemon's log has the
  // measured-vs-predicted table.
  const RunResult show = cli(fmt::format("cache show --namespace {} --json", ns_));
  EXPECT_EQ(show.rc, 0) << show.output;
  EXPECT_TRUE(contains(show.output, "\"time_source\":\"measured\"") ||
              contains(show.output, "\"time_source\": \"measured\""))
      << show.output;
  const std::string log = d.log();
  const std::size_t table = log.find("plan ranked by measured times");
  ASSERT_NE(table, std::string::npos) << log;
  const std::size_t end = log.find("work pass", table);
  std::cout << "[ info ] " << log.substr(table, end == std::string::npos ? std::string::npos : end - table) << "\n";
}

// Writes `version` into the namespace's segment header, as a build of another layout would have made it.
void setLayoutVersion(const std::string& ns, std::uint32_t version) {
  {
    sc::WriterOptions wo;
    wo.ns = ns;
    wo.build = "another build";
    sc::Error e;
    ASSERT_TRUE(sc::Writer::open(wo, &e)) << e.message;
  }
  const int fd = ::open(sc::segmentPath(ns).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &version, sizeof(version), offsetof(sc::SegmentHeader, layoutVersion)),
            static_cast<ssize_t>(sizeof(version)));
  ::close(fd);
  sc::Error refused;
  EXPECT_FALSE(sc::Reader::attach(ns, &refused));
  EXPECT_EQ(refused.status, sc::Status::kBadVersion);
}

// 10. An upgrade: the namespace holds a segment of an older layout version (an older build made it, and jobs that
// mapped it may still run). optiflowd replaces it with one of its own layout instead of refusing to start.
TEST_F(Optiflowd, ASegmentOfAnOlderLayoutIsReplaced) {
  setLayoutVersion(ns_, sc::kLayoutVersion - 1);
  Child& d = startDaemon(writeConfig({}));
  ASSERT_GT(waitHealthy(d), 0);
  ASSERT_TRUE(waitForPlan(d));
  sc::Error e;
  EXPECT_TRUE(sc::Reader::attach(ns_, &e)) << e.message;
  EXPECT_TRUE(contains(d.log(), "replacing it with a segment of this build's layout")) << d.log();
}

// A newer build's segment (a downgrade) is refused, not replaced: the daemon exits and says why.
TEST_F(Optiflowd, ASegmentOfANewerLayoutIsRefused) {
  setLayoutVersion(ns_, sc::kLayoutVersion + 1);
  Child& d = startDaemon(writeConfig({}));
  EXPECT_TRUE(waitFor([&] { return !d.running(); }, kStartS)) << d.log();
  EXPECT_TRUE(contains(d.log(), "layout version")) << d.log();
  sc::Error e;
  EXPECT_FALSE(sc::Reader::attach(ns_, &e));
  EXPECT_EQ(e.status, sc::Status::kBadVersion);
}

}  // namespace
}  // namespace optiflow::daemontest
