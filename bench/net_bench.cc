// The TCP transport against a plain blocking socket loop on loopback, in one run:
//   (a) raw: one blocking socket, sender thread send()s N x 4 MiB, receiver thread recv()s them; (a') the same with
//       non-blocking calls retried at once (how any polled transport runs: the gap between (a) and (a') is the
//       price of polling on this machine, large when the cores are oversubscribed)
//   (b) ours: the same bytes through makeTcpTransport (isend/test and irecv/test loops in two threads), 1 and 2
//       streams per rail, as a ratio to (a)
//   (c) 8-byte message rate, raw (one send and one recv per message) vs ours (up to 32 requests in flight)
// Every configuration runs --reps times (default 5), interleaved, and the table shows medians.
// Usage: net_bench [--reps N] [--mib N] [--msgs N] [--if NAME]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"

namespace {

namespace net = optiflow::net;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBig = 4u << 20;
constexpr int kBigInFlight = 4;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "net_bench: %s\n", what.c_str());
  std::exit(1);
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- raw sockets -------------------------------------------------------------------------------------------------

std::pair<int, int> rawPair() {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    die("raw listen failed");
  }
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&addr), len) != 0) die("raw connect failed");
  const int a = ::accept(l, nullptr, nullptr);
  ::close(l);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {c, a};
}

// spin: non-blocking send/recv retried at once, as a polled transport runs (NCCL's proxy thread polls test()).
double rawBandwidth(int messages, bool spin) {
  auto [s, r] = rawPair();
  const int flags = spin ? MSG_DONTWAIT : 0;
  std::vector<std::uint8_t> src(kBig, 1), dst(kBig);
  const auto start = Clock::now();
  std::thread sender([&, fd = s] {
    for (int m = 0; m < messages; ++m) {
      std::size_t off = 0;
      while (off < kBig) {
        const ssize_t n = ::send(fd, src.data() + off, kBig - off, MSG_NOSIGNAL | flags);
        if (n < 0 && errno == EAGAIN) continue;
        if (n <= 0) die("raw send failed");
        off += static_cast<std::size_t>(n);
      }
    }
  });
  for (int m = 0; m < messages; ++m) {
    std::size_t off = 0;
    while (off < kBig) {
      const ssize_t n = ::recv(r, dst.data() + off, kBig - off, spin ? MSG_DONTWAIT : MSG_WAITALL);
      if (n < 0 && errno == EAGAIN) continue;
      if (n <= 0) die("raw recv failed");
      off += static_cast<std::size_t>(n);
    }
  }
  const double t = seconds(Clock::now() - start);
  sender.join();
  ::close(s);
  ::close(r);
  return static_cast<double>(kBig) * messages / t / 1e9;
}

double rawRate(int messages) {
  auto [s, r] = rawPair();
  const auto start = Clock::now();
  std::thread sender([&, fd = s] {
    std::uint64_t v = 0;
    for (int m = 0; m < messages; ++m, ++v) {
      if (::send(fd, &v, 8, MSG_NOSIGNAL) != 8) die("raw send failed");
    }
  });
  std::uint64_t v = 0;
  for (int m = 0; m < messages; ++m) {
    if (::recv(r, &v, 8, MSG_WAITALL) != 8) die("raw recv failed");
  }
  const double t = seconds(Clock::now() - start);
  sender.join();
  ::close(s);
  ::close(r);
  return messages / t;
}

// ---- ours --------------------------------------------------------------------------------------------------------

struct Ours {
  std::unique_ptr<net::Transport> transport;
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
  std::unique_ptr<net::ListenComm> listen;
  std::vector<std::uint8_t> src, dst;
  net::MemHandle* smh = nullptr;
  net::MemHandle* rmh = nullptr;

  Ours(const std::string& ifname, int streamsPerRail, net::Telemetry* telemetry) {
    net::TcpOptions o;
    o.ifnames = {ifname};
    o.streamsPerRail = streamsPerRail;
    std::string error;
    transport = net::makeTcpTransport(
        o, [](int, const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); }, telemetry, &error);
    if (!transport) die(error);
    std::array<std::uint8_t, net::kHandleBytes> handle{};
    std::unique_ptr<net::Connector> connector;
    if (transport->listen(0, handle.data(), &listen) != net::Result::kOk ||
        transport->connect(0, handle.data(), &connector) != net::Result::kOk) {
      die("listen/connect failed");
    }
    while (!send || !recv) {
      if (!send && connector->step(&send) != net::Result::kOk) die("connect failed");
      if (!recv && listen->accept(&recv) != net::Result::kOk) die("accept failed");
    }
    src.assign(kBig * kBigInFlight, 1);
    dst.assign(kBig * kBigInFlight, 0);
    if (send->regMr(src.data(), src.size(), net::kPtrHost, &smh) != net::Result::kOk ||
        recv->regMr(dst.data(), dst.size(), net::kPtrHost, &rmh) != net::Result::kOk) {
      die("regMr failed");
    }
  }
  ~Ours() {
    send->deregMr(smh);
    recv->deregMr(rmh);
  }

  // `messages` of `size` bytes, up to `window` in flight on each side; returns seconds.
  double run(int messages, std::size_t size, int window) {
    const auto start = Clock::now();
    std::thread sender([&] {
      std::vector<net::Request*> inflight;
      int posted = 0;
      while (posted < messages || !inflight.empty()) {
        if (posted < messages && static_cast<int>(inflight.size()) < window) {
          net::Request* r = nullptr;
          const std::size_t slot = size >= kBig ? static_cast<std::size_t>(posted % kBigInFlight) * kBig : 0;
          if (send->isend(src.data() + slot, size, 0, smh, &r) != net::Result::kOk) die("isend failed");
          if (r != nullptr) {
            inflight.push_back(r);
            ++posted;
            continue;
          }
        }
        int done = 0;
        if (send->test(inflight.front(), &done, nullptr) != net::Result::kOk) die("send test failed");
        if (done) inflight.erase(inflight.begin());
      }
    });
    std::vector<net::Request*> inflight;
    int posted = 0;
    const int tag = 0;
    while (posted < messages || !inflight.empty()) {
      if (posted < messages && static_cast<int>(inflight.size()) < window) {
        net::Request* r = nullptr;
        const std::size_t slot = size >= kBig ? static_cast<std::size_t>(posted % kBigInFlight) * kBig : 0;
        void* buf = dst.data() + slot;
        if (recv->irecv(1, &buf, &size, &tag, &rmh, &r) != net::Result::kOk) die("irecv failed");
        if (r != nullptr) {
          inflight.push_back(r);
          ++posted;
          continue;
        }
      }
      int done = 0, got = 0;
      if (recv->test(inflight.front(), &done, &got) != net::Result::kOk) die("recv test failed");
      if (done) inflight.erase(inflight.begin());
    }
    const double t = seconds(Clock::now() - start);
    sender.join();
    return t;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, mib = 256, msgs = 200000;
  std::string ifname = "lo";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--mib")
      mib = std::atoi(argv[i + 1]);
    else if (a == "--msgs")
      msgs = std::atoi(argv[i + 1]);
    else if (a == "--if")
      ifname = argv[i + 1];
    else
      die("unknown option " + a);
  }
  const int bigMessages = std::max(1, static_cast<int>((static_cast<std::size_t>(mib) << 20) / kBig));
  net::LocalTelemetry telemetry;  // counts like the plugin does (the plugin's cache records cost the same adds)
  Ours one(ifname, 1, &telemetry), two(ifname, 2, &telemetry);

  std::map<std::string, std::vector<double>> results;
  for (int rep = 0; rep < reps; ++rep) {
    results["raw GB/s"].push_back(rawBandwidth(bigMessages, false));
    results["spin GB/s"].push_back(rawBandwidth(bigMessages, true));
    results["ours 1 GB/s"].push_back(static_cast<double>(kBig) * bigMessages /
                                     one.run(bigMessages, kBig, kBigInFlight) / 1e9);
    results["ours 2 GB/s"].push_back(static_cast<double>(kBig) * bigMessages /
                                     two.run(bigMessages, kBig, kBigInFlight) / 1e9);
    results["raw msg/s"].push_back(rawRate(msgs));
    results["ours msg/s"].push_back(msgs / one.run(msgs, 8, net::kMaxRequests));
  }
  const double spin = median(results["spin GB/s"]);
  const double raw = median(results["raw GB/s"]), ours1 = median(results["ours 1 GB/s"]),
               ours2 = median(results["ours 2 GB/s"]), rawRateM = median(results["raw msg/s"]),
               oursRate = median(results["ours msg/s"]);
  std::printf("net_bench on %s: %d x 4 MiB per run, %d x 8 B, median of %d interleaved runs\n", ifname.c_str(),
              bigMessages, msgs, reps);
  std::printf("%-34s %12s %10s\n", "configuration", "value", "vs raw");
  std::printf("%-34s %9.2f GB/s %9.1f%%\n", "(a) raw blocking socket, 4 MiB", raw, 100.0);
  std::printf("%-34s %9.2f GB/s %9.1f%%\n", "(a') raw non-blocking polled, 4 MiB", spin, 100.0 * spin / raw);
  std::printf("%-34s %9.2f GB/s %9.1f%%\n", "(b) ours, 1 stream/rail, 4 MiB", ours1, 100.0 * ours1 / raw);
  std::printf("%-34s %9.2f GB/s %9.1f%%\n", "(b) ours, 2 streams/rail, 4 MiB", ours2, 100.0 * ours2 / raw);
  std::printf("%-34s %9.0f msg/s %8.1f%%\n", "(c) raw blocking socket, 8 B", rawRateM, 100.0);
  std::printf("%-34s %9.0f msg/s %8.1f%%\n", "(c) ours, 32 in flight, 8 B", oursRate, 100.0 * oursRate / rawRateM);
  return 0;
}
