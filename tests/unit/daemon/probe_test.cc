// optiflowd's probes on loopback: a responder and probePeer in one process, garbage and silence on the control port,
// the stop flag, how results refine the topology, and the GPU probe on a machine without a GPU.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "optiflow/daemon/probe.h"
#include "probe_wire.h"  // daemon/src: the control frames

namespace optiflow::daemon {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// How long something that should happen promptly may take before the test calls it a hang, in seconds: generous, so
// a loaded CI machine or a sanitizer build does not fail it, yet a hang still fails.
constexpr int kLivenessMs = 30000;
constexpr double kLivenessS = kLivenessMs / 1000.0;
// A probe timeout far longer than kLivenessS: a probe that returns within kLivenessS did not wait for it.
constexpr double kLongTimeoutS = 120;

core::Topology preset(const char* name) {
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << t.error().str();
  return t.value();
}

// A TCP socket on 127.0.0.1 that listens (the kernel completes handshakes) but never answers: a hung responder.
struct SilentListener {
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { ::close(fd); }
  int fd = -1;
  int port = 0;
};

// A raw client of the control port.
int connectRaw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Reads until the peer closes or `bytes` arrived; -1 on timeout.
long readUntilClosed(int fd, std::vector<std::uint8_t>* out, int timeoutMs) {
  const auto start = Clock::now();
  std::uint8_t buf[512];
  while (secondsSince(start) * 1000 < timeoutMs) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return static_cast<long>(out->size());
    out->insert(out->end(), buf, buf + r);
  }
  return -1;
}

std::string loopbackPeer(int port) { return "127.0.0.1:" + std::to_string(port); }

TEST(DaemonProbe, MeasuresBandwidthAndLatencyOverLoopback) {
  auto responder = ProbeResponder::start("127.0.0.1:0");
  ASSERT_TRUE(responder.ok()) << responder.error().str();
  ASSERT_GT((*responder)->port(), 0);
  const core::Topology topology = preset("dgx-h100x2");
  std::atomic<bool> stop{false};
  const std::string peer = loopbackPeer((*responder)->port());
  auto r = probePeer(peer, 4u << 20, topology, kLivenessS, stop);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->peer, peer);
  EXPECT_GT(r->bandwidthGBps, 0);
  EXPECT_LT(r->bandwidthGBps, 1000);  // 32 MiB through sockets: not faster than memory
  EXPECT_GT(r->latencyUs, 0);
  EXPECT_LT(r->latencyUs, 1e6);  // a sanity bound (microseconds, not a unit off), generous for a loaded machine
  EXPECT_DOUBLE_EQ(r->predictedGBps, topology.nics[0].bandwidthGBps);
  EXPECT_DOUBLE_EQ(r->predictedLatencyUs, topology.nics[0].latencyUs);
  EXPECT_GT(r->predictedGBps, 0);
  EXPECT_DOUBLE_EQ(probeGapRatio(*r), r->bandwidthGBps / r->predictedGBps);
  std::printf("loopback: %.2f GB/s, %.1f us one way (predicted %.1f GB/s, %.1f us)\n", r->bandwidthGBps, r->latencyUs,
              r->predictedGBps, r->predictedLatencyUs);
  // The responder counts the session once it finished echoing (just after the prober got its last pong).
  const auto start = Clock::now();
  while ((*responder)->stats().served < 1 && secondsSince(start) < kLivenessS) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*responder)->stats().served, 1u);
  EXPECT_EQ((*responder)->stats().refused, 0u);

  Metrics metrics;
  recordNetProbe(metrics, *r);
  const std::string labels = "peer=\"" + peer + "\"";
  EXPECT_DOUBLE_EQ(metrics.get("optiflowd_probe_bandwidth_gbps", labels), r->bandwidthGBps);
  EXPECT_DOUBLE_EQ(metrics.get("optiflowd_probe_latency_us", labels), r->latencyUs);
  EXPECT_DOUBLE_EQ(metrics.get("optiflowd_probe_gap_ratio", labels), probeGapRatio(*r));
}

TEST(DaemonProbe, SingleNodeWithoutNicsPredictsZero) {
  auto responder = ProbeResponder::start("127.0.0.1:0");
  ASSERT_TRUE(responder.ok()) << responder.error().str();
  core::Topology topology = preset("dgx-a100");
  topology.nics.clear();
  std::atomic<bool> stop{false};
  auto r = probePeer(loopbackPeer((*responder)->port()), 64 << 10, topology, kLivenessS, stop);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->predictedGBps, 0);
  EXPECT_EQ(r->predictedLatencyUs, 0);
  EXPECT_EQ(probeGapRatio(*r), 0);
  EXPECT_GT(r->bandwidthGBps, 0);
}

TEST(DaemonProbe, Ipv6Loopback) {
  auto responder = ProbeResponder::start("[::1]:0");
  if (!responder.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << responder.error().str();
  std::atomic<bool> stop{false};
  const std::string peer = "[::1]:" + std::to_string((*responder)->port());
  auto r = probePeer(peer, 256 << 10, preset("dgx-a100x2"), kLivenessS, stop);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_GT(r->bandwidthGBps, 0);
  EXPECT_GT(r->latencyUs, 0);
}

TEST(DaemonProbe, PeerNotListeningIsAnErrorNamingIt) {
  int port = 0;
  {
    SilentListener closed;  // bound then closed: nothing listens on this port afterwards
    port = closed.port;
  }
  std::atomic<bool> stop{false};
  const std::string peer = loopbackPeer(port);
  const auto start = Clock::now();
  auto r = probePeer(peer, 1 << 20, preset("dgx-a100"), kLongTimeoutS, stop);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(secondsSince(start), kLivenessS) << "a refused connect fails at once, without waiting for the timeout";
  EXPECT_NE(r.error().str().find(peer), std::string::npos) << r.error().str();
  EXPECT_NE(r.error().str().find("refused"), std::string::npos) << r.error().str();
}

TEST(DaemonProbe, SilentPeerTimesOut) {
  SilentListener silent;
  std::atomic<bool> stop{false};
  const auto start = Clock::now();
  auto r = probePeer(loopbackPeer(silent.port), 1 << 20, preset("dgx-a100"), 0.5, stop);
  ASSERT_FALSE(r.ok());
  const double took = secondsSince(start);
  EXPECT_GE(took, 0.5);  // the deadline starts inside probePeer, after start: never early
  EXPECT_LT(took, kLivenessS);
  EXPECT_NE(r.error().str().find("timed out after 0.5 s"), std::string::npos) << r.error().str();
  EXPECT_NE(r.error().str().find(loopbackPeer(silent.port)), std::string::npos) << r.error().str();
}

TEST(DaemonProbe, StopFlagAbortsQuickly) {
  SilentListener silent;
  std::atomic<bool> stop{false};
  Clock::time_point stoppedAt;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the probe is waiting on the silent peer by then
    stoppedAt = Clock::now();
    stop.store(true);
  });
  auto r = probePeer(loopbackPeer(silent.port), 1 << 20, preset("dgx-a100"), kLongTimeoutS, stop);
  const Clock::time_point returnedAt = Clock::now();
  stopper.join();
  ASSERT_FALSE(r.ok());
  // Seen within a 50 ms slice; the limit is generous for a loaded machine, and far below the probe's own timeout, so
  // a probe that ignored the stop fails.
  EXPECT_LT(std::chrono::duration<double>(returnedAt - stoppedAt).count(), kLivenessS);
  EXPECT_NE(r.error().str().find("stopped"), std::string::npos) << r.error().str();
}

TEST(DaemonProbe, BadArgumentsAndAddresses) {
  std::atomic<bool> stop{false};
  const core::Topology t = preset("dgx-a100");
  auto zero = probePeer("127.0.0.1:1", 0, t, 1, stop);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().str().find("expected 1.."), std::string::npos) << zero.error().str();
  auto noPort = probePeer("localhost", 1024, t, 1, stop);
  ASSERT_FALSE(noPort.ok());
  EXPECT_NE(noPort.error().str().find("not host:port"), std::string::npos) << noPort.error().str();
  auto badListen = ProbeResponder::start("127.0.0.1:99999");
  ASSERT_FALSE(badListen.ok());
  EXPECT_NE(badListen.error().str().find("127.0.0.1:99999"), std::string::npos) << badListen.error().str();
}

TEST(DaemonProbe, GarbageOnControlPortIsLoggedAndServingContinues) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("probe-test", sink));
  auto responder = ProbeResponder::start("127.0.0.1:0");
  ASSERT_TRUE(responder.ok()) << responder.error().str();
  const int port = (*responder)->port();

  // 1. Bytes that are not a probe frame: closed without an answer.
  const int garbage = connectRaw(port);
  std::vector<std::uint8_t> junk(64, 0xab);
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  std::vector<std::uint8_t> answer;
  EXPECT_EQ(readUntilClosed(garbage, &answer, kLivenessMs), 0);
  ::close(garbage);

  // 2. A frame of ours asking for too much: refused with the reason.
  const int greedy = connectRaw(port);
  std::array<std::uint8_t, probewire::kRequestBytes> request{};
  probewire::encodeRequest(probewire::Request{probewire::kMaxProbeBytes + 1, 8, 8}, request.data());
  ASSERT_EQ(::send(greedy, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  answer.clear();
  ASSERT_EQ(readUntilClosed(greedy, &answer, kLivenessMs), static_cast<long>(probewire::kHandleFrameBytes));
  ::close(greedy);
  probewire::HandleFrame frame;
  std::string error;
  ASSERT_TRUE(probewire::decodeHandleFrame(answer.data(), &frame, &error)) << error;
  EXPECT_EQ(frame.status, probewire::Status::kRefused);
  EXPECT_NE(frame.reason.find("-byte messages"), std::string::npos) << frame.reason;

  // 3. A client that hangs up after half a request.
  const int quitter = connectRaw(port);
  ASSERT_EQ(::send(quitter, request.data(), 10, MSG_NOSIGNAL), 10);
  ::close(quitter);

  // Still serving.
  std::atomic<bool> stop{false};
  auto r = probePeer(loopbackPeer(port), 1 << 20, preset("dgx-a100x2"), kLivenessS, stop);
  EXPECT_TRUE(r.ok()) << r.error().str();
  const auto start = Clock::now();
  while (((*responder)->stats().refused < 3 || (*responder)->stats().served < 1) && secondsSince(start) < kLivenessS) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*responder)->stats().refused, 3u);
  EXPECT_EQ((*responder)->stats().served, 1u);
  responder.value().reset();  // stop the responder before looking at its log
  spdlog::set_default_logger(previous);
  std::string log;
  for (const std::string& line : sink->last_formatted()) log += line;
  EXPECT_NE(log.find("not an OptiFlow probe frame"), std::string::npos) << log;
  EXPECT_NE(log.find("127.0.0.1:"), std::string::npos) << log;  // names the client
  EXPECT_NE(log.find("connection closed after 10 of the 28 bytes"), std::string::npos) << log;
}

TEST(DaemonProbe, ProberGetsTheRefusalReason) {
  // A responder of this build refuses nothing probePeer sends; check the prober's side with a fake responder that
  // answers every request with a refusal.
  SilentListener fake;
  std::thread server([&] {
    const int c = ::accept(fake.fd, nullptr, nullptr);
    std::array<std::uint8_t, probewire::kRequestBytes> in{};
    ASSERT_EQ(::recv(c, in.data(), in.size(), MSG_WAITALL), static_cast<ssize_t>(in.size()));
    probewire::Request request;
    std::string error;
    EXPECT_TRUE(probewire::decodeRequest(in.data(), &request, &error)) << error;
    EXPECT_EQ(request.bytes, 4096u);
    EXPECT_EQ(request.count, kProbeMessages);
    EXPECT_EQ(request.pings, kProbePings);
    probewire::HandleFrame refusal;
    refusal.status = probewire::Status::kRefused;
    refusal.reason = "busy training";
    std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
    probewire::encodeHandleFrame(refusal, out.data());
    ::send(c, out.data(), out.size(), MSG_NOSIGNAL);
    ::close(c);
  });
  std::atomic<bool> stop{false};
  auto r = probePeer(loopbackPeer(fake.port), 4096, preset("dgx-a100"), kLivenessS, stop);
  server.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("refused the probe: busy training"), std::string::npos) << r.error().str();
}

TEST(DaemonProbe, WireFramesRoundTripAndRejectCorruption) {
  std::array<std::uint8_t, probewire::kRequestBytes> raw{};
  probewire::encodeRequest(probewire::Request{1 << 20, 8, 32}, raw.data());
  probewire::Request back;
  std::string error;
  ASSERT_TRUE(probewire::decodeRequest(raw.data(), &back, &error)) << error;
  EXPECT_EQ(back.bytes, 1u << 20);
  EXPECT_EQ(back.count, 8u);
  EXPECT_EQ(back.pings, 32u);
  raw[9] ^= 1;
  EXPECT_FALSE(probewire::decodeRequest(raw.data(), &back, &error));
  EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  raw[9] ^= 1;
  raw[4] = 7;  // version
  EXPECT_FALSE(probewire::decodeRequest(raw.data(), &back, &error));
  EXPECT_NE(error.find("version 7"), std::string::npos) << error;
  probewire::encodeRequest(probewire::Request{1, probewire::kMaxCount + 1, 1}, raw.data());
  EXPECT_FALSE(probewire::decodeRequest(raw.data(), &back, &error));
  EXPECT_NE(error.find("messages"), std::string::npos) << error;

  probewire::HandleFrame frame;
  for (std::size_t i = 0; i < net::kHandleBytes; ++i) frame.handle[i] = static_cast<std::uint8_t>(i * 7);
  std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
  probewire::encodeHandleFrame(frame, out.data());
  probewire::HandleFrame decoded;
  ASSERT_TRUE(probewire::decodeHandleFrame(out.data(), &decoded, &error)) << error;
  EXPECT_EQ(decoded.status, probewire::Status::kOk);
  EXPECT_EQ(std::memcmp(decoded.handle, frame.handle, net::kHandleBytes), 0);
  out[0] = 'X';
  EXPECT_FALSE(probewire::decodeHandleFrame(out.data(), &decoded, &error));
  EXPECT_NE(error.find("magic"), std::string::npos) << error;
}

TEST(DaemonProbe, ApplyNetProbesTakesMediansClampsAndStaysValid) {
  const core::Topology base = preset("dgx-h100x2");
  ASSERT_GE(base.nics.size(), 2u);
  EXPECT_EQ(applyNetProbes(base, {}), base);  // nothing measured: unchanged

  std::vector<NetProbeResult> results(3);
  results[0].bandwidthGBps = 10, results[0].latencyUs = 5;
  results[1].bandwidthGBps = 30, results[1].latencyUs = 1;
  results[2].bandwidthGBps = 20, results[2].latencyUs = 3;
  core::Topology measured = applyNetProbes(base, results);
  for (const core::Nic& nic : measured.nics) {
    EXPECT_DOUBLE_EQ(nic.bandwidthGBps, 20);
    EXPECT_DOUBLE_EQ(nic.latencyUs, 3);
  }
  EXPECT_TRUE(measured.validate().empty());
  EXPECT_EQ(measured.nodes, base.nodes);
  EXPECT_EQ(measured.intra, base.intra);

  // Even count: the mean of the middle two.
  results.pop_back();
  measured = applyNetProbes(base, results);
  EXPECT_DOUBLE_EQ(measured.nics[0].bandwidthGBps, 20);
  EXPECT_DOUBLE_EQ(measured.nics[0].latencyUs, 3);

  // Out of the model's range: clamped so validate() still accepts it.
  std::vector<NetProbeResult> extreme(1);
  extreme[0].bandwidthGBps = 1e-9;
  extreme[0].latencyUs = 1e12;
  measured = applyNetProbes(base, extreme);
  EXPECT_DOUBLE_EQ(measured.nics[0].bandwidthGBps, core::Topology::kMinBandwidthGBps);
  EXPECT_DOUBLE_EQ(measured.nics[0].latencyUs, core::Topology::kMaxLatencyUs);
  EXPECT_TRUE(measured.validate().empty());
  extreme[0].bandwidthGBps = 1e12;
  extreme[0].latencyUs = 0;  // not measured: latency stays
  measured = applyNetProbes(base, extreme);
  EXPECT_DOUBLE_EQ(measured.nics[0].bandwidthGBps, core::Topology::kMaxBandwidthGBps);
  EXPECT_DOUBLE_EQ(measured.nics[0].latencyUs, base.nics[0].latencyUs);
  EXPECT_TRUE(measured.validate().empty());
}

TEST(DaemonProbe, GpuProbeReportsWhyItMeasuredNothing) {
  const GpuProbeResult r = probeGpuLinks();
  if (r.available) {
    // A machine with a GPU: the pinned copy was measured.
    EXPECT_GT(r.hostBandwidthGBps, 0) << r.detail;
    std::printf("GPU probe here: %s\n", r.detail.c_str());
    return;
  }
  EXPECT_FALSE(r.detail.empty());
  EXPECT_EQ(r.hostBandwidthGBps, 0);
  EXPECT_EQ(r.peerBandwidthGBps, 0);
  // Twice: the runtime is loaded once and the second answer is the same.
  EXPECT_EQ(probeGpuLinks().detail, r.detail);
  std::printf("GPU probe here: %s\n", r.detail.c_str());
}

}  // namespace
}  // namespace optiflow::daemon
