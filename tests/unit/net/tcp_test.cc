// The TCP transport on loopback, both ends driven alternately from one thread (as non-blocking calls allow).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "interfaces.h"  // net/src: detail::listInterfaces
#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"
#include "optiflow/net/wire.h"
#include "tcp_comm.h"  // net/src: detail::makeTcpTransportOn

namespace optiflow::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(20);
// How long a poll for something that should happen promptly may take before the test calls it a hang: generous, so a
// loaded CI machine or a sanitizer build does not fail it, yet a hang still fails.
constexpr auto kLiveness = std::chrono::seconds(30);

bool anyContains(const std::vector<std::string>& logs, const std::string& what) {
  for (const std::string& l : logs) {
    if (l.find(what) != std::string::npos) return true;
  }
  return false;
}

std::string joined(const std::vector<std::string>& logs) {
  std::string out;
  for (const std::string& l : logs) out += l + "\n";
  return out;
}

std::vector<detail::Interface> loopback(int devices) {
  std::string error;
  auto list = detail::listInterfaces({"lo"}, &error);
  EXPECT_EQ(list.size(), 1u) << error;
  std::vector<detail::Interface> out;
  for (int d = 0; d < devices && !list.empty(); ++d) {
    detail::Interface i = list[0];
    if (devices > 1) i.name = i.props.name = "lo-" + std::string(1, static_cast<char>('a' + d));
    out.push_back(i);
  }
  return out;
}

struct Env {
  explicit Env(TcpOptions options = {}, int devices = 1, bool withTelemetry = true) {
    transport = detail::makeTcpTransportOn(
        loopback(devices), options, [this](int, const std::string& m) { logs.push_back(m); },
        withTelemetry ? &telemetry : nullptr);
  }
  LocalTelemetry telemetry;
  std::vector<std::string> logs;
  std::unique_ptr<Transport> transport;
};

struct Pair {
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  std::unique_ptr<ListenComm> listen;
};

Pair connectPair(Env& env, int dev = 0) {
  Pair p;
  std::array<std::uint8_t, kHandleBytes> handle{};
  EXPECT_EQ(env.transport->listen(dev, handle.data(), &p.listen), Result::kOk);
  std::unique_ptr<Connector> connector;
  EXPECT_EQ(env.transport->connect(dev, handle.data(), &connector), Result::kOk);
  if (!p.listen || !connector) return p;
  const auto start = Clock::now();
  while ((!p.send || !p.recv) && Clock::now() - start < kDeadline) {
    if (!p.send) {
      EXPECT_EQ(connector->step(&p.send), Result::kOk);
    }
    if (!p.recv) {
      EXPECT_EQ(p.listen->accept(&p.recv), Result::kOk);
    }
  }
  EXPECT_TRUE(p.send && p.recv) << joined(env.logs);
  return p;
}

struct Registered {
  Registered(SendComm* s, RecvComm* r, std::size_t bytes) : data(bytes), send(s), recv(r) {
    if (s != nullptr) {
      EXPECT_EQ(s->regMr(data.data(), data.size(), kPtrHost, &mh), Result::kOk);
    }
    if (r != nullptr) {
      EXPECT_EQ(r->regMr(data.data(), data.size(), kPtrHost, &mh), Result::kOk);
    }
  }
  ~Registered() {
    if (send != nullptr) send->deregMr(mh);
    if (recv != nullptr) recv->deregMr(mh);
  }
  std::vector<std::uint8_t> data;
  MemHandle* mh = nullptr;
  SendComm* send;
  RecvComm* recv;
};

void fillPattern(std::vector<std::uint8_t>& v, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(x >> 24);
  }
}

// Polls both requests until both are done or one fails; returns the first non-kOk result.
Result drive(SendComm* s, Request* sreq, RecvComm* r, Request* rreq, int* recvSizes, int* sentSize = nullptr) {
  int sdone = sreq == nullptr ? 1 : 0, rdone = rreq == nullptr ? 1 : 0;
  const auto start = Clock::now();
  while ((!sdone || !rdone) && Clock::now() - start < kDeadline) {
    if (!sdone) {
      int size = -1;
      const Result res = s->test(sreq, &sdone, &size);
      if (res != Result::kOk) return res;
      if (sdone && sentSize != nullptr) *sentSize = size;
    }
    if (!rdone) {
      const Result res = r->test(rreq, &rdone, recvSizes);
      if (res != Result::kOk) return res;
    }
  }
  EXPECT_TRUE(sdone && rdone) << "timed out";
  return Result::kOk;
}

TEST(NetTcp, TransportDescribesLoopbackDevice) {
  std::string error;
  auto t = makeTcpTransport(TcpOptions{{"lo"}}, nullptr, nullptr, &error);
  ASSERT_NE(t, nullptr) << error;
  EXPECT_STREQ(t->name(), "OptiFlow");
  ASSERT_EQ(t->deviceCount(), 1);
  const DeviceProps& p = t->device(0);
  EXPECT_EQ(p.name, "lo");
  EXPECT_EQ(p.pciPath, "");  // virtual
  EXPECT_EQ(p.ptrSupport, kPtrHost);
  EXPECT_TRUE(p.regIsGlobal);
  EXPECT_EQ(p.maxRecvs, kMaxRecvs);
  EXPECT_GT(p.speedMbps, 0);
  EXPECT_EQ(makeTcpTransport(TcpOptions{{"no-such-if0"}}, nullptr, nullptr, &error), nullptr);
  EXPECT_NE(error.find("no-such-if0"), std::string::npos) << error;
  // kTcp never tries verbs.
  Options o;
  o.kind = TransportKind::kTcp;
  o.tcp.ifnames = {"lo"};
  auto chosen = makeTransport(o, nullptr, nullptr, &error);
  ASSERT_NE(chosen, nullptr) << error;
  EXPECT_STREQ(chosen->name(), "OptiFlow");
}

TEST(NetTcp, Ipv6Loopback) {
  detail::Interface lo6 = loopback(1).at(0);
  lo6.name = lo6.props.name = "lo6";
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_loopback;
  std::memset(&lo6.addr, 0, sizeof(lo6.addr));
  std::memcpy(&lo6.addr, &a6, sizeof(a6));
  lo6.addrLen = sizeof(a6);
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool haveV6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a6), sizeof(a6)) == 0;
  if (probe >= 0) ::close(probe);
  if (!haveV6) GTEST_SKIP() << "no IPv6 loopback here";
  Env env;
  TcpOptions o;
  o.streamsPerRail = 2;
  o.minStripeBytes = 0;
  env.transport = detail::makeTcpTransportOn(
      {lo6}, o, [&env](int, const std::string& m) { env.logs.push_back(m); }, &env.telemetry);
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  Registered src(p.send.get(), nullptr, 100000), dst(nullptr, p.recv.get(), 100000);
  fillPattern(src.data, 6);
  Request *sreq = nullptr, *rreq = nullptr;
  void* buf = dst.data.data();
  const std::size_t cap = dst.data.size();
  const int tag = 0;
  ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data(), src.data.size(), 0, src.mh, &sreq), Result::kOk);
  ASSERT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, nullptr), Result::kOk) << joined(env.logs);
  EXPECT_EQ(src.data, dst.data);
  EXPECT_EQ(env.telemetry.snapshotPeer("::1").bytesRecv, 100000u);
}

class NetTcpSizes : public ::testing::TestWithParam<int> {};

TEST_P(NetTcpSizes, EveryByteArrives) {
  TcpOptions o;
  o.streamsPerRail = GetParam();
  o.minStripeBytes = 64 << 10;
  Env env(o);
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  const std::size_t kMax = 64u << 20;
  Registered src(p.send.get(), nullptr, kMax), dst(nullptr, p.recv.get(), kMax + 64);
  std::uint32_t seed = 1;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{4095}, std::size_t{65536},
                           std::size_t{(1u << 20) + 7}, kMax}) {
    std::vector<std::uint8_t> expect(size);
    fillPattern(expect, seed++);
    if (size > 0) std::memcpy(src.data.data(), expect.data(), size);
    std::fill(dst.data.begin(), dst.data.end(), 0xee);
    Request *sreq = nullptr, *rreq = nullptr;
    void* buf = dst.data.data();
    const std::size_t cap = dst.data.size();
    const int tag = 5;
    ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreq), Result::kOk);
    ASSERT_EQ(p.send->isend(src.data.data(), size, 5, src.mh, &sreq), Result::kOk);
    ASSERT_NE(sreq, nullptr);
    ASSERT_NE(rreq, nullptr);
    int got = -1, sent = -1;
    ASSERT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, &got, &sent), Result::kOk) << joined(env.logs);
    EXPECT_EQ(got, static_cast<int>(size));
    EXPECT_EQ(sent, static_cast<int>(size));
    if (size > 0) {
      EXPECT_EQ(0, std::memcmp(dst.data.data(), expect.data(), size)) << "size " << size;
    }
    EXPECT_EQ(dst.data[size], 0xee) << "wrote past the message";
  }
  const NetCounters peer = env.telemetry.snapshotPeer("127.0.0.1");
  EXPECT_EQ(peer.msgsSent, 7u);
  EXPECT_EQ(peer.msgsRecv, 7u);
  EXPECT_EQ(peer.bytesSent, peer.bytesRecv);
  EXPECT_EQ(peer.bytesSent, 0u + 1 + 8 + 4095 + 65536 + (1u << 20) + 7 + kMax);
  EXPECT_GT(peer.sendBusyNs, 0u);
  EXPECT_GT(peer.recvBusyNs, 0u);
  EXPECT_EQ(peer.errors, 0u);
  const NetCounters nic = env.telemetry.snapshotNic("lo");
  EXPECT_EQ(nic.bytesSent, peer.bytesSent);
  EXPECT_EQ(nic.bytesRecv, peer.bytesRecv);
  EXPECT_TRUE(env.logs.empty()) << joined(env.logs);
}

INSTANTIATE_TEST_SUITE_P(Streams, NetTcpSizes, ::testing::Values(1, 4));

TEST(NetTcp, ThirtyTwoRequestsInFlightArriveInOrder) {
  TcpOptions o;
  o.streamsPerRail = 2;
  o.minStripeBytes = 4096;
  Env env(o);
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  constexpr int kN = kMaxRequests;
  constexpr std::size_t kSlot = 256 << 10;
  Registered src(p.send.get(), nullptr, kN * kSlot), dst(nullptr, p.recv.get(), kN * kSlot);
  fillPattern(src.data, 77);
  std::vector<Request*> sreqs(kN), rreqs(kN);
  for (int i = 0; i < kN; ++i) {
    void* buf = dst.data.data() + i * kSlot;
    const std::size_t cap = kSlot;
    const int tag = 1;
    ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreqs[i]), Result::kOk);
    ASSERT_NE(rreqs[i], nullptr);
  }
  // The receive pool is full now.
  {
    void* buf = dst.data.data();
    const std::size_t cap = 1;
    const int tag = 1;
    Request* extra = reinterpret_cast<Request*>(0x1);
    EXPECT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &extra), Result::kOk);
    EXPECT_EQ(extra, nullptr);
  }
  for (int i = 0; i < kN; ++i) {
    const std::size_t size = (i * 7919u) % kSlot + 1;
    ASSERT_EQ(p.send->isend(src.data.data() + i * kSlot, size, 1, src.mh, &sreqs[i]), Result::kOk);
    ASSERT_NE(sreqs[i], nullptr);
  }
  std::vector<int> sdone(kN), rdone(kN), sizes(kN);
  const auto start = Clock::now();
  int remaining = 2 * kN;
  while (remaining > 0 && Clock::now() - start < kDeadline) {
    for (int i = 0; i < kN; ++i) {
      if (!sdone[i]) {
        ASSERT_EQ(p.send->test(sreqs[i], &sdone[i], nullptr), Result::kOk);
        remaining -= sdone[i];
      }
      if (!rdone[i]) {
        ASSERT_EQ(p.recv->test(rreqs[i], &rdone[i], &sizes[i]), Result::kOk);
        remaining -= rdone[i];
      }
    }
  }
  ASSERT_EQ(remaining, 0) << joined(env.logs);
  for (int i = 0; i < kN; ++i) {
    const std::size_t size = (i * 7919u) % kSlot + 1;
    EXPECT_EQ(sizes[i], static_cast<int>(size));
    EXPECT_EQ(0, std::memcmp(dst.data.data() + i * kSlot, src.data.data() + i * kSlot, size)) << i;
  }
}

TEST(NetTcp, SendPoolExhaustionReturnsNullRequest) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  Registered src(p.send.get(), nullptr, 8);
  std::vector<Request*> reqs;
  for (int i = 0; i < kMaxRequests * kMaxRecvs; ++i) {
    Request* r = nullptr;
    ASSERT_EQ(p.send->isend(src.data.data(), 8, 0, src.mh, &r), Result::kOk);
    ASSERT_NE(r, nullptr) << i;
    reqs.push_back(r);
  }
  Request* r = reinterpret_cast<Request*>(0x1);
  EXPECT_EQ(p.send->isend(src.data.data(), 8, 0, src.mh, &r), Result::kOk);
  EXPECT_EQ(r, nullptr);
  // Completing one frees a slot.
  int done = 0;
  const auto start = Clock::now();
  while (!done && Clock::now() - start < kDeadline) ASSERT_EQ(p.send->test(reqs[0], &done, nullptr), Result::kOk);
  ASSERT_EQ(done, 1);
  EXPECT_EQ(p.send->isend(src.data.data(), 8, 0, src.mh, &r), Result::kOk);
  EXPECT_NE(r, nullptr);
}

TEST(NetTcp, GroupedReceiveMatchesTagsInAnyOrder) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  Registered src(p.send.get(), nullptr, 3000), dst(nullptr, p.recv.get(), 3000);
  fillPattern(src.data, 3);
  void* bufs[3] = {dst.data.data(), dst.data.data() + 1000, dst.data.data() + 2000};
  const std::size_t caps[3] = {1000, 1000, 1000};
  const int tags[3] = {7, 8, 9};
  MemHandle* mhs[3] = {dst.mh, dst.mh, dst.mh};
  Request* rreq = nullptr;
  ASSERT_EQ(p.recv->irecv(3, bufs, caps, tags, mhs, &rreq), Result::kOk);
  // Sent in the order 9, 7, 8 with sizes 300, 100, 0.
  Request* sreqs[3];
  ASSERT_EQ(p.send->isend(src.data.data(), 300, 9, src.mh, &sreqs[0]), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data() + 1000, 100, 7, src.mh, &sreqs[1]), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data() + 2000, 0, 8, src.mh, &sreqs[2]), Result::kOk);
  int sizes[3] = {-1, -1, -1};
  for (Request* s : sreqs) ASSERT_EQ(drive(p.send.get(), s, nullptr, nullptr, nullptr), Result::kOk);
  ASSERT_EQ(drive(nullptr, nullptr, p.recv.get(), rreq, sizes), Result::kOk) << joined(env.logs);
  EXPECT_EQ(sizes[0], 100);
  EXPECT_EQ(sizes[1], 0);
  EXPECT_EQ(sizes[2], 300);
  EXPECT_EQ(0, std::memcmp(dst.data.data(), src.data.data() + 1000, 100));
  EXPECT_EQ(0, std::memcmp(dst.data.data() + 2000, src.data.data(), 300));
}

TEST(NetTcp, UnknownTagIsInvalidUsage) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  Registered src(p.send.get(), nullptr, 64), dst(nullptr, p.recv.get(), 64);
  Request *sreq = nullptr, *rreq = nullptr;
  void* buf = dst.data.data();
  const std::size_t cap = 64;
  const int tag = 1;
  ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data(), 16, 2, src.mh, &sreq), Result::kOk);
  EXPECT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, nullptr), Result::kInvalidUsage);
  EXPECT_TRUE(anyContains(env.logs, "tag 2")) << joined(env.logs);
  // Sticky: later calls fail the same way.
  int done = 0;
  EXPECT_EQ(p.recv->test(rreq, &done, nullptr), Result::kInvalidUsage);
}

TEST(NetTcp, ReceiveSmallerThanMessageIsInvalidUsage) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  Registered src(p.send.get(), nullptr, 4096), dst(nullptr, p.recv.get(), 4096);
  Request *sreq = nullptr, *rreq = nullptr;
  void* buf = dst.data.data();
  const std::size_t cap = 100;
  const int tag = 0;
  ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data(), 4096, 0, src.mh, &sreq), Result::kOk);
  EXPECT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, nullptr), Result::kInvalidUsage);
  ASSERT_EQ(env.logs.size(), 1u) << joined(env.logs);
  EXPECT_NE(env.logs[0].find("4096 bytes"), std::string::npos) << env.logs[0];
  EXPECT_NE(env.logs[0].find("100 bytes"), std::string::npos) << env.logs[0];
  EXPECT_EQ(env.telemetry.snapshotPeer("127.0.0.1").errors, 1u);
}

TEST(NetTcp, StripedRailsFollowChangingWeights) {
  TcpOptions o;
  o.stripe = true;
  o.streamsPerRail = 2;
  o.minStripeBytes = 64 << 10;
  Env env(o, 2);
  env.telemetry.setWeight("lo-a", 3);
  env.telemetry.setWeight("lo-b", 1);
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  const std::size_t kSize = 8u << 20;
  Registered src(p.send.get(), nullptr, kSize), dst(nullptr, p.recv.get(), kSize);
  auto roundTrip = [&](std::uint32_t seed) {
    fillPattern(src.data, seed);
    std::fill(dst.data.begin(), dst.data.end(), 0);
    Request *sreq = nullptr, *rreq = nullptr;
    void* buf = dst.data.data();
    const int tag = 0;
    ASSERT_EQ(p.recv->irecv(1, &buf, &kSize, &tag, &dst.mh, &rreq), Result::kOk);
    ASSERT_EQ(p.send->isend(src.data.data(), kSize, 0, src.mh, &sreq), Result::kOk);
    int got = 0;
    ASSERT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, &got), Result::kOk) << joined(env.logs);
    EXPECT_EQ(got, static_cast<int>(kSize));
    EXPECT_EQ(src.data, dst.data);
  };
  roundTrip(1);
  NetCounters a = env.telemetry.snapshotNic("lo-a"), b = env.telemetry.snapshotNic("lo-b");
  EXPECT_EQ(a.bytesSent, 6u << 20);
  EXPECT_EQ(b.bytesSent, 2u << 20);
  EXPECT_EQ(a.msgsSent, 2u);  // one part per stream
  EXPECT_EQ(a.bytesRecv, 6u << 20);
  EXPECT_EQ(b.bytesRecv, 2u << 20);

  // Weights are read per message: rail a switched off.
  env.telemetry.setWeight("lo-a", 0);
  roundTrip(2);
  a = env.telemetry.snapshotNic("lo-a");
  b = env.telemetry.snapshotNic("lo-b");
  EXPECT_EQ(a.bytesSent, 6u << 20);
  EXPECT_EQ(b.bytesSent, (2u << 20) + kSize);

  // Below minStripeBytes: stream 0 only.
  env.telemetry.setWeight("lo-a", 1);
  fillPattern(src.data, 3);
  Request *sreq = nullptr, *rreq = nullptr;
  void* buf = dst.data.data();
  const int tag = 0;
  ASSERT_EQ(p.recv->irecv(1, &buf, &kSize, &tag, &dst.mh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data(), 1000, 0, src.mh, &sreq), Result::kOk);
  ASSERT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, nullptr), Result::kOk);
  EXPECT_EQ(env.telemetry.snapshotNic("lo-a").bytesSent, (6u << 20) + 1000);
  EXPECT_EQ(0, std::memcmp(dst.data.data(), src.data.data(), 1000));
}

TEST(NetTcp, PeerClosingMidMessageIsRemoteError) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  const std::size_t kSize = 32u << 20;  // more than the socket buffers hold
  Registered src(p.send.get(), nullptr, kSize), dst(nullptr, p.recv.get(), kSize);
  Request *sreq = nullptr, *rreq = nullptr;
  void* buf = dst.data.data();
  const int tag = 0;
  ASSERT_EQ(p.recv->irecv(1, &buf, &kSize, &tag, &dst.mh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(src.data.data(), kSize, 0, src.mh, &sreq), Result::kOk);
  int done = 0;
  ASSERT_EQ(p.recv->test(rreq, &done, nullptr), Result::kOk);
  ASSERT_EQ(done, 0);
  EXPECT_EQ(p.send->deregMr(src.mh), Result::kOk);
  src.send = nullptr;
  p.send.reset();
  Result r = Result::kOk;
  const auto start = Clock::now();
  while (r == Result::kOk && !done && Clock::now() - start < kDeadline) r = p.recv->test(rreq, &done, nullptr);
  EXPECT_EQ(r, Result::kRemoteError);
  EXPECT_EQ(done, 0);
  ASSERT_EQ(env.logs.size(), 1u) << joined(env.logs);
  EXPECT_NE(env.logs[0].find("127.0.0.1"), std::string::npos) << env.logs[0];
  EXPECT_NE(env.logs[0].find("closed"), std::string::npos) << env.logs[0];
  // Later calls fail the same way without logging again.
  Request* again = nullptr;
  EXPECT_EQ(p.recv->irecv(1, &buf, &kSize, &tag, &dst.mh, &again), Result::kRemoteError);
  EXPECT_EQ(env.logs.size(), 1u);
  EXPECT_EQ(env.telemetry.snapshotPeer("127.0.0.1").errors, 1u);
}

TEST(NetTcp, ReceivePostedAfterPeerClosedFailsOnTest) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  p.send.reset();
  Registered dst(nullptr, p.recv.get(), 64);
  Request* rreq = nullptr;
  void* buf = dst.data.data();
  const std::size_t cap = 64;
  const int tag = 0;
  Result r = p.recv->irecv(1, &buf, &cap, &tag, &dst.mh, &rreq);
  int done = 0;
  const auto start = Clock::now();
  while (r == Result::kOk && Clock::now() - start < kDeadline) r = p.recv->test(rreq, &done, nullptr);
  EXPECT_EQ(r, Result::kRemoteError);
  EXPECT_EQ(done, 0);
}

TEST(NetTcp, SenderSeesResetWhenReceiverIsGone) {
  Env env;
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  p.recv.reset();
  const std::size_t kSize = 16u << 20;
  Registered src(p.send.get(), nullptr, kSize);
  Request* sreq = nullptr;
  Result r = p.send->isend(src.data.data(), kSize, 0, src.mh, &sreq);
  int done = 0;
  const auto start = Clock::now();
  while (r == Result::kOk && !done && Clock::now() - start < kDeadline) r = p.send->test(sreq, &done, nullptr);
  EXPECT_EQ(r, Result::kRemoteError);  // no SIGPIPE: the test process is still alive
}

// A raw socket that speaks a valid hello to a listener, then whatever the test writes.
class RawPeer {
 public:
  RawPeer(const std::uint8_t* handleBytes, std::uint64_t listenIdOverride = 0) {
    wire::TcpHandle h;
    std::string error;
    EXPECT_TRUE(wire::decodeTcpHandle(handleBytes, &h, &error)) << error;
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(h.rails[0].port);
    std::memcpy(&addr.sin_addr, h.rails[0].addr, 4);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    wire::Hello hello{wire::buildId(), listenIdOverride != 0 ? listenIdOverride : h.listenId, 99, 0, 1};
    std::uint8_t bytes[wire::kHelloBytes];
    wire::encodeHello(hello, bytes);
    write(bytes, sizeof(bytes));
  }
  ~RawPeer() { close(); }
  void write(const void* data, std::size_t n) {
    EXPECT_EQ(::send(fd_, data, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::unique_ptr<RecvComm> acceptOne(ListenComm* listen) {
  std::unique_ptr<RecvComm> recv;
  const auto start = Clock::now();
  while (!recv && Clock::now() - start < kLiveness) EXPECT_EQ(listen->accept(&recv), Result::kOk);
  return recv;
}

// Posts one receive and polls it until it finishes or fails.
Result receiveOnce(RecvComm* recv, std::size_t cap = 1024) {
  static std::vector<std::uint8_t> buffer(1 << 20);
  MemHandle* mh = nullptr;
  EXPECT_EQ(recv->regMr(buffer.data(), buffer.size(), kPtrHost, &mh), Result::kOk);
  void* buf = buffer.data();
  const int tag = 0;
  Request* req = nullptr;
  Result r = recv->irecv(1, &buf, &cap, &tag, &mh, &req);
  int done = 0;
  const auto start = Clock::now();
  while (r == Result::kOk && !done && Clock::now() - start < kDeadline) r = recv->test(req, &done, nullptr);
  recv->deregMr(mh);
  return r;
}

TEST(NetTcp, CorruptFramesAreRemoteErrors) {
  Env env;
  std::array<std::uint8_t, kHandleBytes> handle{};
  std::unique_ptr<ListenComm> listen;
  ASSERT_EQ(env.transport->listen(0, handle.data(), &listen), Result::kOk);

  {  // garbage instead of a message header
    RawPeer raw(handle.data());
    auto recv = acceptOne(listen.get());
    ASSERT_NE(recv, nullptr) << joined(env.logs);
    raw.write("this is not a frame at all, just text.", 38);
    EXPECT_EQ(receiveOnce(recv.get()), Result::kRemoteError);
    EXPECT_TRUE(anyContains(env.logs, "corrupt frame")) << joined(env.logs);
  }
  env.logs.clear();
  {  // a valid header with the wrong sequence number
    RawPeer raw(handle.data());
    auto recv = acceptOne(listen.get());
    ASSERT_NE(recv, nullptr);
    wire::MessageHeader h;
    h.seq = 5;
    h.size = 4;
    h.partCount = 1;
    h.parts[0] = {0, 4};
    std::uint8_t bytes[wire::kMaxMessageHeaderBytes];
    raw.write(bytes, wire::encodeMessageHeader(h, bytes));
    raw.write("abcd", 4);
    EXPECT_EQ(receiveOnce(recv.get()), Result::kRemoteError);
    EXPECT_TRUE(anyContains(env.logs, "sequence number 5")) << joined(env.logs);
  }
  env.logs.clear();
  {  // a header promising more bytes than arrive before the peer closes
    RawPeer raw(handle.data());
    auto recv = acceptOne(listen.get());
    ASSERT_NE(recv, nullptr);
    wire::MessageHeader h;
    h.size = 1000;
    h.partCount = 1;
    h.parts[0] = {0, 1000};
    std::uint8_t bytes[wire::kMaxMessageHeaderBytes];
    raw.write(bytes, wire::encodeMessageHeader(h, bytes));
    raw.write("abcd", 4);
    raw.close();
    EXPECT_EQ(receiveOnce(recv.get(), 1000), Result::kRemoteError);
    EXPECT_TRUE(anyContains(env.logs, "closed")) << joined(env.logs);
  }
}

TEST(NetTcp, HeaderArrivingInPiecesIsCompletedOrFailsOnClose) {
  Env env;
  std::array<std::uint8_t, kHandleBytes> handle{};
  std::unique_ptr<ListenComm> listen;
  ASSERT_EQ(env.transport->listen(0, handle.data(), &listen), Result::kOk);
  wire::MessageHeader h;
  h.size = 6;
  h.partCount = 1;
  h.parts[0] = {0, 6};
  std::uint8_t bytes[wire::kMaxMessageHeaderBytes];
  const std::size_t n = wire::encodeMessageHeader(h, bytes);
  for (bool complete : {true, false}) {
    RawPeer raw(handle.data());
    auto recv = acceptOne(listen.get());
    ASSERT_NE(recv, nullptr);
    std::vector<std::uint8_t> dst(64, 0);
    MemHandle* mh = nullptr;
    ASSERT_EQ(recv->regMr(dst.data(), dst.size(), kPtrHost, &mh), Result::kOk);
    void* buf = dst.data();
    const std::size_t cap = dst.size();
    const int tag = 0;
    Request* req = nullptr;
    ASSERT_EQ(recv->irecv(1, &buf, &cap, &tag, &mh, &req), Result::kOk);
    raw.write(bytes, 10);
    int done = 0;
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(recv->test(req, &done, nullptr), Result::kOk);
      usleep(100);
    }
    EXPECT_EQ(done, 0);
    if (complete) {
      raw.write(bytes + 10, n - 10);
      raw.write("abcdef", 6);
    } else {
      raw.close();
    }
    Result r = Result::kOk;
    int size = -1;
    const auto start = Clock::now();
    while (r == Result::kOk && !done && Clock::now() - start < kDeadline) r = recv->test(req, &done, &size);
    if (complete) {
      EXPECT_EQ(r, Result::kOk) << joined(env.logs);
      EXPECT_EQ(size, 6);
      EXPECT_EQ(0, std::memcmp(dst.data(), "abcdef", 6));
    } else {
      EXPECT_EQ(r, Result::kRemoteError);
      EXPECT_TRUE(anyContains(env.logs, "closed")) << joined(env.logs);
    }
    recv->deregMr(mh);
  }
}

TEST(NetTcp, ForeignHandlesAndHellosAreRefused) {
  Env env;
  std::array<std::uint8_t, kHandleBytes> handle{};
  std::unique_ptr<ListenComm> listen;
  ASSERT_EQ(env.transport->listen(0, handle.data(), &listen), Result::kOk);

  // A handle from another build.
  wire::TcpHandle h;
  std::string error;
  ASSERT_TRUE(wire::decodeTcpHandle(handle.data(), &h, &error));
  h.buildId ^= 0xff;
  std::array<std::uint8_t, kHandleBytes> foreign{};
  ASSERT_TRUE(wire::encodeTcpHandle(h, foreign.data()));
  std::unique_ptr<Connector> connector;
  EXPECT_EQ(env.transport->connect(0, foreign.data(), &connector), Result::kInvalidArgument);
  EXPECT_EQ(connector, nullptr);
  EXPECT_TRUE(anyContains(env.logs, "handle from another build")) << joined(env.logs);
  std::array<std::uint8_t, kHandleBytes> zeros{};
  EXPECT_EQ(env.transport->connect(0, zeros.data(), &connector), Result::kInvalidArgument);

  // A hello for another listener, and a stream that sends garbage: both closed with a log line.
  env.logs.clear();
  RawPeer wrongListener(handle.data(), 12345);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(h.rails[0].port);
  std::memcpy(&addr.sin_addr, h.rails[0].addr, 4);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::array<char, wire::kHelloBytes> junk{};
  junk.fill('x');
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  std::unique_ptr<RecvComm> recv;
  const auto start = Clock::now();
  while (env.logs.size() < 2 && Clock::now() - start < kLiveness) {
    ASSERT_EQ(listen->accept(&recv), Result::kOk);
    ASSERT_EQ(recv, nullptr);
  }
  ::close(fd);
  EXPECT_TRUE(anyContains(env.logs, "another listener")) << joined(env.logs);
  EXPECT_TRUE(anyContains(env.logs, "not an OptiFlow stream hello")) << joined(env.logs);

  // The listener still accepts a real connection.
  std::unique_ptr<Connector> good;
  ASSERT_EQ(env.transport->connect(0, handle.data(), &good), Result::kOk);
  std::unique_ptr<SendComm> send;
  const auto start2 = Clock::now();
  while ((!send || !recv) && Clock::now() - start2 < kDeadline) {
    if (!send) {
      ASSERT_EQ(good->step(&send), Result::kOk);
    }
    if (!recv) {
      ASSERT_EQ(listen->accept(&recv), Result::kOk);
    }
  }
  EXPECT_TRUE(send && recv);
}

TEST(NetTcp, ConnectToClosedPortTimesOut) {
  TcpOptions o;
  o.connectTimeoutMs = 300;
  Env env(o);
  std::array<std::uint8_t, kHandleBytes> handle{};
  {
    std::unique_ptr<ListenComm> listen;
    ASSERT_EQ(env.transport->listen(0, handle.data(), &listen), Result::kOk);
  }  // closed: connects are refused
  std::unique_ptr<Connector> connector;
  const auto start = Clock::now();  // before connect(): the connector's deadline starts there
  ASSERT_EQ(env.transport->connect(0, handle.data(), &connector), Result::kOk);
  std::unique_ptr<SendComm> send;
  Result r = Result::kOk;
  auto took = Clock::duration::zero();
  while (r == Result::kOk && Clock::now() - start < kLiveness) {
    r = connector->step(&send);
    took = Clock::now() - start;
    if (r == Result::kOk) usleep(1000);
  }
  EXPECT_EQ(r, Result::kRemoteError);
  EXPECT_EQ(send, nullptr);
  // The configured timeout fired: not before its 300 ms (refused connects are retried until then), and not so late
  // that the timeout was ignored. The upper bound is generous: a loaded or sanitized run is slow.
  EXPECT_GE(took, std::chrono::milliseconds(o.connectTimeoutMs));
  EXPECT_LT(took, kLiveness);
  EXPECT_TRUE(anyContains(env.logs, "timed out after 300 ms")) << joined(env.logs);
}

TEST(NetTcp, RegistrationRules) {
  Env env({}, 1, /*withTelemetry=*/false);
  Pair p = connectPair(env);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<std::uint8_t> data(4096);
  MemHandle* mh = nullptr;
  EXPECT_EQ(p.send->regMr(data.data(), data.size(), kPtrCuda, &mh), Result::kInvalidArgument);
  EXPECT_EQ(mh, nullptr);
  EXPECT_EQ(p.send->regMrDmaBuf(data.data(), data.size(), kPtrCuda, 0, 3, &mh), Result::kInvalidUsage);
  ASSERT_EQ(p.send->regMr(data.data() + 1024, 1024, kPtrHost, &mh), Result::kOk);
  Request* req = reinterpret_cast<Request*>(0x1);
  EXPECT_EQ(p.send->isend(data.data(), 16, 0, mh, &req), Result::kInvalidArgument);  // before the registration
  EXPECT_EQ(req, nullptr);
  EXPECT_EQ(p.send->isend(data.data() + 2000, 100, 0, mh, &req), Result::kInvalidArgument);  // runs past its end
  EXPECT_EQ(p.send->isend(data.data() + 1024, 16, 0, nullptr, &req), Result::kInvalidArgument);
  EXPECT_TRUE(anyContains(env.logs, "outside its registration")) << joined(env.logs);

  MemHandle* rmh = nullptr;
  ASSERT_EQ(p.recv->regMr(data.data(), 1024, kPtrHost, &rmh), Result::kOk);
  void* buf = data.data() + 1000;
  const std::size_t cap = 100;
  const int tag = 0;
  EXPECT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &rmh, &req), Result::kInvalidArgument);
  EXPECT_EQ(p.recv->irecv(0, &buf, &cap, &tag, &rmh, &req), Result::kInvalidUsage);
  EXPECT_EQ(p.recv->irecv(kMaxRecvs + 1, &buf, &cap, &tag, &rmh, &req), Result::kInvalidUsage);
  EXPECT_EQ(p.recv->deregMr(mh), Result::kInvalidArgument);  // belongs to the send comm
  Request* flush = reinterpret_cast<Request*>(0x1);
  int size = 0;
  EXPECT_EQ(p.recv->iflush(1, &buf, &size, &rmh, &flush), Result::kOk);
  EXPECT_EQ(flush, nullptr);

  // Registration errors do not fail the connection: a valid message still goes through (without telemetry).
  Request *sreq = nullptr, *rreq = nullptr;
  buf = data.data();
  ASSERT_EQ(p.recv->irecv(1, &buf, &cap, &tag, &rmh, &rreq), Result::kOk);
  ASSERT_EQ(p.send->isend(data.data() + 1024, 16, 0, mh, &sreq), Result::kOk);
  int got = 0;
  EXPECT_EQ(drive(p.send.get(), sreq, p.recv.get(), rreq, &got), Result::kOk);
  EXPECT_EQ(got, 16);
  // A dead request is refused, the connection stays usable.
  int done = 0;
  EXPECT_EQ(p.send->test(sreq, &done, nullptr), Result::kInvalidArgument);
  EXPECT_EQ(p.recv->test(rreq, &done, nullptr), Result::kInvalidArgument);
  EXPECT_EQ(p.send->isend(data.data() + 1024, 16, 0, mh, &sreq), Result::kOk);
  EXPECT_NE(sreq, nullptr);
  EXPECT_EQ(p.send->deregMr(mh), Result::kOk);
  EXPECT_EQ(p.recv->deregMr(rmh), Result::kOk);
}

}  // namespace
}  // namespace optiflow::net
