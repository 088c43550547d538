// optiflowd's lifecycle: the namespace lock, the cache writer, /healthz and /metrics, the probe responder, the work
// thread (probes and synthesis through the WorkGate), SIGHUP reloads and a clean stop within 2 s.
#include "optiflow/daemon/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fs_util.h"
#include "http_server.h"
#include "optiflow/core/env.h"
#include "optiflow/daemon/budget.h"
#include "optiflow/daemon/measured.h"
#include "optiflow/daemon/probe.h"
#include "optiflow/daemon/work.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

#ifndef OPTIFLOW_VERSION
#define OPTIFLOW_VERSION "unknown"
#endif

namespace optiflow::daemon {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;
constexpr int kExitLocked = 3;

// The namespace's segment was made by an older build (a lower layout version): an upgrade left it behind. A newer
// build's segment is never replaced (a downgrade refuses it, as every reader does).
bool olderLayout(const std::string& ns) {
  const int fd = ::open(schedcache::segmentPath(ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::uint32_t version = 0;
  const ssize_t n = ::pread(fd, &version, sizeof(version), offsetof(schedcache::SegmentHeader, layoutVersion));
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof(version)) && version < schedcache::kLayoutVersion;
}

constexpr double kPollS = 30;          // the work thread looks for new workloads at least this often
constexpr double kFollowerPollS = 5;   // a follower looks for a newly shared plan this often
constexpr double kProbeTimeoutS = 20;  // per peer
constexpr double kGpuProbeTimeoutS = 120;
constexpr double kSlowStopS = 2;

// OPTIFLOW_TEST_PUBLISH_STALL_MS: the writer sleeps this long in the middle of every publish (tests kill it there).
int gStallMs = 0;
void stallHook() { std::this_thread::sleep_for(std::chrono::milliseconds(gStallMs)); }

// The namespace lock's descriptor, closed in forked children so that one that outlives the daemon never holds it.
int gLockFd = -1;

std::string daemonLockPath(const std::string& ns) { return fmt::format("/dev/shm/optiflow-{}.daemon.lock", ns); }

std::string errnoText(int e) { return std::strerror(e); }

std::string hostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos && host.front() != '[' ? fmt::format("[{}]:{}", host, port)
                                                                    : fmt::format("{}:{}", host, port);
}

double residentBytes() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  if (!(in >> pages >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

using detail::writeFileAtomic;

// The exclusive lock a daemon holds on its namespace for its whole life (flock: the kernel drops it when it dies).
class NamespaceLock {
 public:
  static core::Result<std::unique_ptr<NamespaceLock>> take(const std::string& ns, int* exitCode) {
    const std::string path = daemonLockPath(ns);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      *exitCode = kExitRuntime;
      return core::Diagnostic{path, 0, 0,
                              fmt::format("cannot open the daemon lock: {} (does another user's optiflowd serve "
                                          "namespace {}?)",
                                          errnoText(errno), ns)};
    }
    auto lock = std::unique_ptr<NamespaceLock>(new NamespaceLock(fd));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {
        char buf[32] = {};
        const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
        const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
        *exitCode = kExitLocked;
        return core::Diagnostic{"", 0, 0,
                                fmt::format("another optiflowd (pid {}) serves namespace {} (lock {})",
                                            pid > 0 ? std::to_string(pid) : std::string("unknown"), ns, path)};
      }
      *exitCode = kExitRuntime;
      return core::Diagnostic{path, 0, 0, fmt::format("cannot lock: {}", errnoText(e))};
    }
    gLockFd = fd;
    lock->held_ = true;
    const std::string pid = fmt::format("{}\n", ::getpid());
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      spdlog::warn("{}: cannot write the pid: {}", path, errnoText(errno));
    }
    return lock;
  }
  ~NamespaceLock() {
    if (gLockFd == fd_) gLockFd = -1;
    // Only the holder clears the pid (a refused daemon must not erase its rival's); a stale pid is harmless.
    if (held_ && ::ftruncate(fd_, 0) != 0) spdlog::debug("cannot clear the pid in the daemon lock");
    ::close(fd_);
  }
  NamespaceLock(const NamespaceLock&) = delete;
  NamespaceLock& operator=(const NamespaceLock&) = delete;

 private:
  explicit NamespaceLock(int fd) : fd_(fd) {}
  int fd_;
  bool held_ = false;
};

// CUDA keeps hundreds of MiB of host memory after its first use, so the GPU probe runs in a child process: the
// daemon's own footprint never includes it, and a probe that hangs in the driver is killed, not waited for.
GpuProbeResult probeGpuIsolated(const std::atomic<bool>& stop) {
  GpuProbeResult out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.detail = fmt::format("cannot create a pipe: {}", errnoText(errno));
    return out;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    out.detail = fmt::format("cannot fork the probe: {}", errnoText(errno));
    return out;
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (gLockFd >= 0) ::close(gLockFd);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a probe stuck in the driver dies with the daemon
    const GpuProbeResult r = probeGpuLinks();
    char buf[1024];
    const int n = std::snprintf(buf, sizeof buf, "%d\n%.17g\n%.17g\n%s", r.available ? 1 : 0, r.peerBandwidthGBps,
                                r.hostBandwidthGBps, r.detail.c_str());
    std::size_t len = n < 0 ? 0 : std::min(static_cast<std::size_t>(n), sizeof buf - 1);
    const char* p = buf;
    while (len > 0) {
      const ssize_t w = ::write(fds[1], p, len);
      if (w <= 0) break;
      p += w;
      len -= static_cast<std::size_t>(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::duration<double>(kGpuProbeTimeoutS);
  bool done = false;
  while (!done && !stop && Clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, 50);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      done = true;
    }
  }
  ::close(fds[0]);
  if (!done) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!done) {
    out.detail = stop ? "interrupted by the stop" : fmt::format("no answer within {} s (killed)", kGpuProbeTimeoutS);
    return out;
  }
  int available = 0;
  char detail[1024] = {};
  if (std::sscanf(text.c_str(), "%d\n%lg\n%lg\n%1023[^\n]", &available, &out.peerBandwidthGBps, &out.hostBandwidthGBps,
                  detail) < 3) {
    out.detail = fmt::format("the probe process ended without a result (status {})", status);
    return out;
  }
  out.available = available != 0;
  out.detail = detail;
  return out;
}

bool sameBudget(const Config& a, const Config& b) {
  return a.cpuCores == b.cpuCores && a.busyCallsPerS == b.busyCallsPerS && a.idleWindowS == b.idleWindowS;
}
bool sameTopologySource(const Config& a, const Config& b) {
  return a.preset == b.preset && a.topologyFile == b.topologyFile && a.ncclTopoDump == b.ncclTopoDump &&
         a.nodes == b.nodes && a.calibrationFile == b.calibrationFile;
}

class DaemonImpl final : public Daemon {
 public:
  DaemonImpl(Config config, GetEnv getEnv, fs::path stateDir, std::unique_ptr<NamespaceLock> lock,
             schedcache::WriterOptions writerOptions, std::unique_ptr<schedcache::Writer> writer,
             core::Topology topology)
      : config_(std::move(config)),
        getEnv_(getEnv),
        stateDir_(std::move(stateDir)),
        lock_(std::move(lock)),
        writerOptions_(std::move(writerOptions)),
        writer_(std::move(writer)),
        baseTopology_(std::move(topology)) {
    describeMetrics();
  }

  ~DaemonImpl() override {
    requestStop();
    if (work_.joinable()) work_.join();
    if (http_) http_->stop();
  }

  core::Result<bool> startServices() {
    HttpServer::Handlers h;
    h.unhealthy = [this] { return unhealthy(); };
    h.metrics = [this] {
      metrics_.set("optiflowd_resident_memory_bytes", residentBytes());
      exportMeasured();
      return metrics_.renderPrometheus();
    };
    auto http = HttpServer::start(config_.metricsAddress, config_.metricsPort, std::move(h));
    if (!http) return http.error();
    http_ = std::move(http).value();
    const fs::path nsDir = stateDir_ / config_.ns;
    std::error_code ec;
    fs::create_directories(nsDir, ec);
    if (ec || !writeFileAtomic(nsDir / "metrics.port", fmt::format("{}\n", http_->port()))) {
      spdlog::warn("cannot write {}: {}", (nsDir / "metrics.port").string(), ec ? ec.message() : "write failed");
    }
    spdlog::info("metrics on http://{}/metrics, health on /healthz", hostPort(config_.metricsAddress, http_->port()));
    if (config_.probeEnabled && !config_.probeListen.empty()) {
      auto responder = ProbeResponder::start(config_.probeListen);
      if (!responder) return responder.error();
      responder_ = std::move(responder).value();
    }
    return true;
  }

  int run() override {
    work_ = std::thread([this] { workThread(); });
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_.load(); });
    }
    const auto t0 = Clock::now();
    // The HTTP server (up to ~1 s for a keep-alive client) stops while the work thread reaches its checkpoint, so
    // the two waits overlap instead of adding up.
    std::thread httpStopper([this] {
      if (http_) http_->stop();
    });
    if (work_.joinable()) work_.join();
    responder_.reset();
    httpStopper.join();
    metrics_.set("optiflowd_up", 0);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > kSlowStopS) spdlog::warn("stopping took {:.2f} s (the work did not reach a checkpoint sooner)", s);
    spdlog::info("stopped in {:.2f} s; the schedule cache {} stays as it is", s,
                 schedcache::segmentPath(writerOptions_.ns));
    return exitCode_;
  }

  void requestStop() override {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
  }

  void requestReload() override {
    Config current;
    {
      std::lock_guard lock(mutex_);
      current = config_;
    }
    auto next = loadConfig(current.file, getEnv_);
    if (!next) {
      metrics_.add("optiflowd_errors_total", 1, promLabels({{"kind", "config"}}));
      spdlog::error("reload: {}; keeping the running config", next.error().str());
      return;
    }
    Config c = std::move(next).value();
    auto keep = [&](bool same, std::string_view what, auto& field, const auto& old) {
      if (same) return;
      spdlog::warn("reload: {} changed; that takes a restart (keeping the running value)", what);
      field = old;
    };
    keep(c.ns == current.ns, "[cache] namespace", c.ns, current.ns);
    keep(c.group == current.group, "[cache] group", c.group, current.group);
    keep(c.metricsAddress == current.metricsAddress, "[metrics] address", c.metricsAddress, current.metricsAddress);
    keep(c.metricsPort == current.metricsPort, "[metrics] port", c.metricsPort, current.metricsPort);
    keep(c.probeListen == current.probeListen, "[probe] listen", c.probeListen, current.probeListen);
    keep(c.logJson == current.logJson, "[log] json", c.logJson, current.logJson);
    keep(c.stateDir == current.stateDir, "[synthesis] state_dir", c.stateDir, current.stateDir);
    std::optional<core::Topology> topology;
    if (!sameTopologySource(c, current)) {
      auto t = loadConfiguredTopology(c);
      if (!t) {
        metrics_.add("optiflowd_errors_total", 1, promLabels({{"kind", "config"}}));
        spdlog::error("reload: {}; keeping the running config", t.error().str());
        return;
      }
      topology = std::move(t).value();
    }
    spdlog::set_level(spdlog::level::from_str(c.logLevel));
    {
      std::lock_guard lock(mutex_);
      config_ = c;
      pendingConfig_ = true;
      if (topology) pendingTopology_ = std::move(topology);
    }
    metrics_.add("optiflowd_config_reloads_total", 1);
    spdlog::info(
        "reload: {} read; log level {}, proposer {}, interval {} s, budget {} cores{}; the work uses it from "
        "its next pass",
        c.file.string(), c.logLevel, c.proposer, c.intervalS, c.cpuCores,
        topology ? fmt::format(", topology {}", topology->name) : std::string());
    cv_.notify_all();
  }

  Metrics& metrics() override { return metrics_; }
  int metricsPort() const override { return http_ ? http_->port() : 0; }

 private:
  // What the profiler plugins measured, joined with the plans the communicators used (docs/profiler.md). On the HTTP
  // thread, per scrape, with a reader of its own (the work thread has another).
  void exportMeasured() {
    std::lock_guard<std::mutex> lock(measuredMutex_);
    if (!measuredReader_) {
      schedcache::Error err;
      measuredReader_ = schedcache::Reader::attach(writerOptions_.ns, &err);
      if (!measuredReader_) return;
    }
    try {
      exportMeasurements(metrics_, joinMeasurements(*measuredReader_));
      exportMeasureCounters(metrics_, measuredReader_->measureCounters());
    } catch (const std::exception& e) {
      spdlog::warn("measurements: {}", e.what());
    }
  }

  void describeMetrics() {
    Metrics& m = metrics_;
    describeMeasurementMetrics(m);
    m.describe("optiflowd_up", "gauge", "1 while optiflowd runs");
    m.describe("optiflowd_config_reloads_total", "counter", "Successful config reloads (SIGHUP)");
    m.describe("optiflowd_plans_published_total", "counter", "Plans made current in the schedule cache");
    m.describe("optiflowd_synthesis_rounds_total", "counter", "Synthesis rounds run");
    m.describe("optiflowd_synthesis_candidates_total", "counter", "Synthesis candidates evaluated");
    m.describe("optiflowd_best_speedup", "gauge",
               "NCCL's own choice's simulated time over the best synthesized schedule's, per collective and size");
    m.describe("optiflowd_probe_bandwidth_gbps", "gauge", "Measured network bandwidth to a peer, GB/s, one direction");
    m.describe("optiflowd_probe_latency_us", "gauge", "Measured one-way network latency to a peer, microseconds");
    m.describe("optiflowd_probe_gap_ratio", "gauge", "Measured over predicted bandwidth to a peer");
    m.describe("optiflowd_errors_total", "counter", "Errors by kind");
    m.describe("optiflowd_jobs_busy", "gauge", "1 while the node's jobs are busy and heavy work waits");
    m.describe("optiflowd_work_paused_seconds_total", "counter",
               "Seconds the work waited for an idle gap or for its CPU budget");
    m.describe("optiflowd_cpu_seconds_total", "counter", "CPU seconds used by the daemon");
    m.describe("optiflowd_resident_memory_bytes", "gauge", "Resident memory of optiflowd (VmRSS)");
    m.set("optiflowd_up", 1);
    m.add("optiflowd_config_reloads_total", 0);
    m.add("optiflowd_plans_published_total", 0);
    m.add("optiflowd_synthesis_rounds_total", 0);
    m.add("optiflowd_synthesis_candidates_total", 0);
  }

  std::string unhealthy() {
    struct stat st {};
    const std::string seg = schedcache::segmentPath(writerOptions_.ns);
    if (::stat(seg.c_str(), &st) != 0) {
      return fmt::format("the schedule cache {} does not exist (removed?); optiflowd recreates it at its next pass",
                         seg);
    }
    std::lock_guard lock(mutex_);
    return problem_;
  }

  void setProblem(std::string p) {
    std::lock_guard lock(mutex_);
    problem_ = std::move(p);
  }

  // Builds (or rebuilds after a budget change or a lost segment) the gate and the work loop: only the work thread.
  void buildWork(const Config& c, const core::Topology& t) {
    work_loop_.reset();
    gate_ = std::make_unique<WorkGate>(
        c.cpuCores, c.busyCallsPerS, c.idleWindowS,
        [this]() -> std::optional<schedcache::Activity> {
          if (!reader_) {
            schedcache::Error err;
            reader_ = schedcache::Reader::attach(writerOptions_.ns, &err);
            if (!reader_) return std::nullopt;
          }
          return reader_->activity();
        },
        &metrics_);
    work_loop_ = std::make_unique<WorkLoop>(c, t, writer_.get(), &metrics_, gate_.get(), stateDir_);
  }

  // A segment removed under the daemon (`optiflow cache clear --remove --force`) is recreated, so the node's jobs
  // see plans again; the writer and reader of the old one are dropped.
  bool ensureSegment(const Config& c, const core::Topology& t) {
    struct stat st {};
    if (::stat(schedcache::segmentPath(c.ns).c_str(), &st) == 0) return true;
    spdlog::warn("the schedule cache {} was removed; creating it again", schedcache::segmentPath(c.ns));
    schedcache::Error err;
    auto w = schedcache::Writer::open(writerOptions_, &err);
    if (!w) {
      metrics_.add("optiflowd_errors_total", 1, promLabels({{"kind", "cache"}}));
      setProblem(fmt::format("cannot create the schedule cache again: {}", err.message));
      spdlog::error("cannot create the schedule cache again: {}", err.message);
      return false;
    }
    work_loop_.reset();
    reader_.reset();
    {
      std::lock_guard<std::mutex> lock(measuredMutex_);
      measuredReader_.reset();
    }
    writer_ = std::move(w);
    buildWork(c, t);
    return true;
  }

  void runProbes(const Config& c, core::Topology& probed) {
    std::vector<NetProbeResult> results;
    for (const std::string& peer : c.probePeers) {
      if (!gate_->checkpoint(stop_)) return;
      auto r = probePeer(peer, c.probeBytes, baseTopology_, kProbeTimeoutS, stop_);
      if (!r) {
        if (stop_) return;
        metrics_.add("optiflowd_errors_total", 1, promLabels({{"kind", "probe"}}));
        spdlog::warn("probe {}: {}", peer, r.error().str());
        continue;
      }
      recordNetProbe(metrics_, *r);
      spdlog::info(
          "probe {}: {:.2f} GB/s, {:.1f} us one-way; the topology said {:.2f} GB/s, {:.1f} us (measured / "
          "predicted bandwidth {:.2f})",
          peer, r->bandwidthGBps, r->latencyUs, r->predictedGBps, r->predictedLatencyUs, probeGapRatio(*r));
      nlohmann::json line = {{"time_ns", schedcache::realtimeNs()}, {"peer", r->peer},
                             {"bandwidth_gbps", r->bandwidthGBps},  {"latency_us", r->latencyUs},
                             {"predicted_gbps", r->predictedGBps},  {"predicted_latency_us", r->predictedLatencyUs},
                             {"gap_ratio", probeGapRatio(*r)}};
      std::ofstream(stateDir_ / c.ns / "probes.jsonl", std::ios::app) << line.dump() << '\n';
      results.push_back(std::move(r).value());
    }
    if (results.empty()) return;
    probed = applyNetProbes(baseTopology_, results);
    work_loop_->setTopology(probed);
  }

  void workThread() {
    Config c;
    {
      std::lock_guard lock(mutex_);
      c = config_;
    }
    if (!lowerThreadPriority(c.nice)) spdlog::warn("cannot lower the work thread's priority to nice {}", c.nice);
    core::Topology topology = baseTopology_;
    buildWork(c, topology);
    const GpuProbeResult gpu = probeGpuIsolated(stop_);
    spdlog::info("GPU probe: {}{}", gpu.available ? "" : "not available: ", gpu.detail);
    auto nextProbe = Clock::now();
    while (!stop_) {
      {
        std::lock_guard lock(mutex_);
        if (pendingConfig_) {
          pendingConfig_ = false;
          const bool rebuild = !sameBudget(c, config_) || pendingTopology_.has_value();
          const bool probesChanged = c.probePeers != config_.probePeers || c.probeBytes != config_.probeBytes;
          c = config_;
          if (pendingTopology_) {
            baseTopology_ = std::move(*pendingTopology_);
            pendingTopology_.reset();
            topology = baseTopology_;
          }
          if (probesChanged) nextProbe = Clock::now();
          if (rebuild) {
            buildWork(c, topology);
          } else {
            work_loop_->setConfig(c);
          }
        }
      }
      if (!ensureSegment(c, topology)) {
        waitFor(c, kPollS);
        continue;
      }
      gate_->start();
      if (c.probeEnabled && !c.probePeers.empty() && Clock::now() >= nextProbe) {
        runProbes(c, topology);
        nextProbe =
            Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.probeIntervalS));
      }
      if (stop_) break;
      const double publishErrors = metrics_.get("optiflowd_errors_total", promLabels({{"kind", "publish"}}));
      auto pass = work_loop_->runOnce(stop_);
      if (!pass) {
        spdlog::error("work pass: {}", pass.error().str());
        if (metrics_.get("optiflowd_errors_total", promLabels({{"kind", "publish"}})) > publishErrors) {
          setProblem(fmt::format("publishing into the schedule cache failed: {}", pass.error().str()));
        }
      } else {
        setProblem("");
        if (pass->workloads > 0 || pass->published) {
          spdlog::info("work pass: {} workloads, {} rounds{}; current plan {}", pass->workloads, pass->rounds,
                       pass->published ? fmt::format(", published plan {} from {}",
                                                     schedcache::formatHash(pass->planHash), pass->planDir.string())
                                       : std::string(),
                       pass->planHash ? schedcache::formatHash(pass->planHash) : std::string("none"));
        }
      }
      // The synthesis loop's peak (large sizes, many candidates) is freed but kept by malloc; give it back so the
      // idle footprint stays small between passes.
      ::malloc_trim(0);
      double waitS = std::min(c.intervalS, c.role == Role::kFollower ? kFollowerPollS : kPollS);
      if (c.probeEnabled && !c.probePeers.empty()) {
        waitS = std::min(waitS, std::max(0.0, std::chrono::duration<double>(nextProbe - Clock::now()).count()));
      }
      waitFor(c, waitS);
    }
    work_loop_.reset();
    gate_.reset();
  }

  // Sleeps until waitS passed, a stop, or a reload.
  void waitFor(const Config&, double waitS) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, std::chrono::duration<double>(waitS), [&] { return stop_.load() || pendingConfig_; });
  }

  std::mutex mutex_;  // config_, pending*, problem_; cv_ waits on it
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  Config config_;
  bool pendingConfig_ = false;
  std::optional<core::Topology> pendingTopology_;
  std::string problem_;

  GetEnv getEnv_;
  fs::path stateDir_;
  std::unique_ptr<NamespaceLock> lock_;
  schedcache::WriterOptions writerOptions_;
  std::unique_ptr<schedcache::Writer> writer_;
  core::Topology baseTopology_;  // from the config; probes refine a copy
  Metrics metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<ProbeResponder> responder_;

  // The work thread's.
  std::unique_ptr<schedcache::Reader> reader_;
  std::mutex measuredMutex_;
  std::unique_ptr<schedcache::Reader> measuredReader_;
  std::unique_ptr<WorkGate> gate_;
  std::unique_ptr<WorkLoop> work_loop_;
  std::thread work_;
  int exitCode_ = kExitOk;
};

}  // namespace

core::Result<std::unique_ptr<Daemon>> Daemon::create(Config config, GetEnv getEnv, int* exitCode) {
  int scratch = 0;
  int& code = exitCode ? *exitCode : scratch;
  code = kExitRuntime;
  auto stateDir = resolveStateDir(config, getEnv);
  if (!stateDir) return stateDir.error();
  auto lock = NamespaceLock::take(config.ns, &code);
  if (!lock) return lock.error();

  schedcache::WriterOptions wo;
  wo.ns = config.ns;
  wo.build = OPTIFLOW_VERSION;
  if (!config.group.empty()) {
    const group* g = ::getgrnam(config.group.c_str());
    if (!g) {
      code = kExitConfig;
      return core::Diagnostic{config.file.string(), 0, 0,
                              fmt::format("[cache] group = \"{}\": no such group on this machine", config.group)};
    }
    wo.group = g->gr_gid;
  }
  if (getEnv != nullptr) {
    const core::env::Value stall =
        core::env::read(core::env::find(core::env::kDaemonParams, "OPTIFLOW_TEST_PUBLISH_STALL_MS"), getEnv);
    if (!stall.error.empty()) {
      code = kExitConfig;
      return core::Diagnostic{"", 0, 0, stall.error};
    }
    if (stall.text) gStallMs = static_cast<int>(core::env::asInteger(*stall.text));
  }
  schedcache::Error err;
  std::unique_ptr<schedcache::Writer> writer = schedcache::Writer::open(wo, &err);
  if (!writer && err.status == schedcache::Status::kBadVersion && olderLayout(config.ns)) {
    // An older build's segment, left in /dev/shm by an upgrade. This daemon holds the namespace, so no other writer
    // uses it; processes that mapped it keep their mapping (and the plan they pinned), new ones attach to the new one.
    spdlog::warn("{}; replacing it with a segment of this build's layout", err.message);
    schedcache::Error removeError;
    if (schedcache::Writer::remove(config.ns, &removeError)) {
      writer = schedcache::Writer::open(wo, &err);
    } else {
      err = removeError;
    }
  }
  if (!writer) {
    return core::Diagnostic{schedcache::segmentPath(config.ns), 0, 0,
                            fmt::format("cannot open the schedule cache: {}", err.message)};
  }
  if (gStallMs > 0) {
    writer->setMidWriteHookForTest(&stallHook);
    spdlog::warn("test hook active: OPTIFLOW_TEST_PUBLISH_STALL_MS={}: every publish stalls {} ms mid-write", gStallMs,
                 gStallMs);
  }
  auto topology = loadConfiguredTopology(config);
  if (!topology) {
    code = kExitConfig;
    return topology.error();
  }
  spdlog::info(
      "optiflowd {}: namespace {}, state dir {}, topology {} ({} GPUs on {} nodes), {} proposer, {} "
      "evaluator, budget {} cores at nice {}",
      OPTIFLOW_VERSION, config.ns, stateDir->string(), topology->name, topology->nRanks(), topology->nodes,
      config.proposer, config.evaluator, config.cpuCores, config.nice);
  auto d = std::make_unique<DaemonImpl>(config, getEnv, *stateDir, std::move(lock).value(), wo, std::move(writer),
                                        std::move(topology).value());
  if (auto started = d->startServices(); !started) {
    code = kExitRuntime;
    return started.error();
  }
  code = kExitOk;
  return std::unique_ptr<Daemon>(std::move(d));
}

// ---- main ----

namespace {

// The message as a JSON string body (quotes, backslashes and control characters escaped).
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"':
          dest.append(std::string_view("\\\""));
          break;
        case '\\':
          dest.append(std::string_view("\\\\"));
          break;
        case '\n':
          dest.append(std::string_view("\\n"));
          break;
        case '\t':
          dest.append(std::string_view("\\t"));
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const std::string u = fmt::format("\\u{:04x}", static_cast<unsigned>(c));
            dest.append(std::string_view(u));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

void setupLogging(const Config& config) {
  auto logger = std::make_shared<spdlog::logger>("optiflowd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (config.logJson) {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","pid":%P,"thread":%t,"msg":"%*"})");
    logger->set_formatter(std::move(f));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z optiflowd[%P] %l: %v");
  }
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(config.logLevel));
  spdlog::flush_on(spdlog::level::trace);
}

}  // namespace

int daemonMain(int argc, char** argv) {
  CLI::App app{"optiflowd: keeps this node's OptiFlow schedule cache fresh (docs/config.md)", "optiflowd"};
  std::string configPath;
  bool check = false;
  bool version = false;
  app.add_option("--config", configPath, "TOML config file (example: /etc/optiflow/optiflowd.toml)");
  app.add_flag("--check-config", check, "Validate the config (and its topology), print FILE: ok, and exit");
  app.add_flag("--version", version, "Print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitConfig;
  }
  if (version) {
    std::printf("optiflowd %s\n", OPTIFLOW_VERSION);
    return kExitOk;
  }
  if (configPath.empty()) {
    std::fprintf(stderr, "optiflowd: --config FILE is required (see --help)\n");
    return kExitConfig;
  }
  auto config = loadConfig(configPath, &processEnv);
  if (!config) {
    std::fprintf(stderr, "optiflowd: %s\n", config.error().str().c_str());
    return kExitConfig;
  }
  if (check) {
    auto topology = loadConfiguredTopology(*config);
    if (!topology) {
      std::fprintf(stderr, "optiflowd: %s\n", topology.error().str().c_str());
      return kExitConfig;
    }
    std::printf("%s: ok\n", configPath.c_str());
    return kExitOk;
  }
  setupLogging(*config);

  // Before any thread exists, so that every thread inherits the mask and only sigwait below sees these.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  int code = kExitRuntime;
  auto daemon = Daemon::create(std::move(config).value(), &processEnv, &code);
  if (!daemon) {
    spdlog::error("{}", daemon.error().str());
    return code;
  }
  Daemon& d = **daemon;
  std::atomic<bool> done{false};
  std::thread signalThread([&] {
    const timespec tick{0, 100'000'000};
    while (!done) {
      const int sig = ::sigtimedwait(&signals, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        spdlog::info("{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        d.requestStop();
      } else if (sig == SIGHUP) {
        spdlog::info("SIGHUP: reloading {}", configPath);
        d.requestReload();
      }
    }
  });
  const int rc = d.run();
  done = true;
  signalThread.join();
  daemon.value().reset();
  spdlog::default_logger()->flush();
  return rc;
}

}  // namespace optiflow::daemon
