// The socket toolkit (optiflow/net/socket.h) on loopback: connect with a deadline, a refused connect, a receive
// that times out or is stopped, a stream closed mid-frame, and the stream options read back from the kernel.
#include "optiflow/net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

namespace optiflow::net {
namespace {

using Clock = std::chrono::steady_clock;

// How long something that should happen promptly may take before the test calls it a hang: generous, so a loaded CI
// machine or a sanitizer build does not fail it, yet a hang still fails.
constexpr auto kLiveness = std::chrono::seconds(30);
constexpr double kLivenessS = std::chrono::duration<double>(kLiveness).count();
// A deadline far longer than kLiveness: a wait that ends within kLiveness did not run into it.
constexpr double kLongDeadlineS = 120;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

const sockaddr* asAddr(const sockaddr_in& a) { return reinterpret_cast<const sockaddr*>(&a); }

std::uint16_t portOf(const sockaddr_storage& a) { return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port); }

// A listener on 127.0.0.1 (an ephemeral port).
struct Listener {
  Listener() {
    const sockaddr_in any = loopback(0);
    const SocketStatus s = listenOn(asAddr(any), sizeof(any), 4, &fd, &bound);
    EXPECT_TRUE(s.ok()) << s.message();
    port = portOf(bound);
  }
  // Waits (up to kLiveness) for the next connection.
  Fd accept() const {
    Fd out;
    sockaddr_storage peer{};
    for (const auto start = Clock::now(); Clock::now() - start < kLiveness;) {
      const Io io = acceptStream(fd.get(), &out, &peer);
      if (io == Io::kDone) return out;
      EXPECT_EQ(io, Io::kPending) << std::strerror(errno);
      pollfd pfd{fd.get(), POLLIN, 0};
      ::poll(&pfd, 1, 10);
    }
    ADD_FAILURE() << "no connection arrived";
    return out;
  }
  Fd fd;
  sockaddr_storage bound{};
  std::uint16_t port = 0;
};

struct Pair {
  Fd client, server;
};

Pair connectedPair(const Listener& listener) {
  Pair p;
  const sockaddr_in to = loopback(listener.port);
  const SocketStatus s = connectWithin(asAddr(to), sizeof(to), Deadline(kLivenessS), "the test connection", &p.client);
  EXPECT_TRUE(s.ok()) << s.message();
  p.server = listener.accept();
  return p;
}

int intOption(int fd, int level, int name) {
  int value = -1;
  socklen_t length = sizeof(value);
  EXPECT_EQ(::getsockopt(fd, level, name, &value, &length), 0) << std::strerror(errno);
  return value;
}

void expectStreamOptions(int fd) {
  EXPECT_EQ(intOption(fd, IPPROTO_TCP, TCP_NODELAY), 1);
  EXPECT_EQ(intOption(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(intOption(fd, IPPROTO_TCP, TCP_KEEPIDLE), kKeepIdleS);
  EXPECT_EQ(intOption(fd, IPPROTO_TCP, TCP_KEEPINTVL), kKeepIntervalS);
  EXPECT_EQ(intOption(fd, IPPROTO_TCP, TCP_KEEPCNT), kKeepCount);
  EXPECT_EQ(intOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), static_cast<int>(kUserTimeoutMs));
}

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(SocketToolkit, ConnectWithDeadlineSucceedsAndSetsStreamOptions) {
  Listener listener;
  Pair p = connectedPair(listener);
  ASSERT_TRUE(p.client.valid());
  ASSERT_TRUE(p.server.valid());
  EXPECT_EQ(kKeepIdleS, 15);
  EXPECT_EQ(kKeepIntervalS, 5);
  EXPECT_EQ(kKeepCount, 3);
  EXPECT_EQ(kUserTimeoutMs, 60000u);
  expectStreamOptions(p.client.get());  // connectWithin
  expectStreamOptions(p.server.get());  // acceptStream
  EXPECT_NE(::fcntl(p.client.get(), F_GETFL) & O_NONBLOCK, 0);

  const std::uint8_t out[5] = {1, 2, 3, 4, 5};
  std::uint8_t in[5] = {};
  SocketStatus s = sendAll(p.client.get(), out, sizeof(out), Deadline(kLivenessS), "five bytes");
  ASSERT_TRUE(s.ok()) << s.message();
  s = recvAll(p.server.get(), in, sizeof(in), Deadline(kLivenessS), "five bytes");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::memcmp(in, out, sizeof(in)), 0);
}

TEST(SocketToolkit, OpenStreamSetsStreamOptions) {
  Fd fd = openStream(AF_INET);
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  expectStreamOptions(fd.get());
}

TEST(SocketToolkit, ConnectToAClosedPortFailsWithAMessage) {
  std::uint16_t port = 0;
  {
    Listener gone;
    port = gone.port;
  }  // closed: nothing listens there any more
  const sockaddr_in to = loopback(port);
  Fd fd;
  const SocketStatus s = connectWithin(asAddr(to), sizeof(to), Deadline(kLivenessS), "the test connection", &fd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), SocketStatus::Code::kError);
  EXPECT_FALSE(s.expired());
  EXPECT_EQ(s.message(), "connect: " + std::string(std::strerror(ECONNREFUSED)));
  EXPECT_FALSE(fd.valid());
}

TEST(SocketToolkit, ReceiveAllTimesOutWithAMessage) {
  Listener listener;
  Pair p = connectedPair(listener);
  std::uint8_t in[8] = {};
  const auto start = Clock::now();
  const SocketStatus s = recvAll(p.server.get(), in, sizeof(in), Deadline(0.2), "the reply");
  const double took = secondsSince(start);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), SocketStatus::Code::kTimedOut);
  EXPECT_TRUE(s.expired());
  EXPECT_EQ(s.message(), "timed out after 0.2 s waiting for the reply");
  EXPECT_GE(took, 0.2);  // the deadline was made after start: never early
  EXPECT_LT(took, kLivenessS);
}

TEST(SocketToolkit, ReceiveAllHonoursTheStopFlag) {
  Listener listener;
  Pair p = connectedPair(listener);
  std::atomic<bool> stop{true};
  std::uint8_t in[8] = {};
  const auto start = Clock::now();
  const SocketStatus s = recvAll(p.server.get(), in, sizeof(in), Deadline(kLongDeadlineS, &stop), "the reply");
  ASSERT_FALSE(s.ok());
  // Generous for a loaded machine, far below the deadline: a wait that ignored the stop fails.
  EXPECT_LT(secondsSince(start), kLivenessS);
  EXPECT_EQ(s.code(), SocketStatus::Code::kStopped);
  EXPECT_EQ(s.message(), "stopped while waiting for the reply");
}

TEST(SocketToolkit, ReceiveAllReportsAStreamClosedMidFrame) {
  Listener listener;
  Pair p = connectedPair(listener);
  const std::uint8_t three[3] = {7, 8, 9};
  ASSERT_TRUE(sendAll(p.client.get(), three, sizeof(three), Deadline(kLivenessS), "three bytes").ok());
  p.client.reset();
  std::uint8_t in[8] = {};
  const SocketStatus s = recvAll(p.server.get(), in, sizeof(in), Deadline(kLivenessS), "the frame");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), SocketStatus::Code::kClosed);
  EXPECT_EQ(s.message(), "connection closed after 3 of the 8 bytes of the frame");
}

TEST(SocketToolkit, NonBlockingStepsReportPendingAndClosed) {
  Listener listener;
  Pair p = connectedPair(listener);
  std::uint8_t in[4] = {};
  std::size_t got = 0;
  EXPECT_EQ(recvSome(p.server.get(), in, sizeof(in), &got), Io::kPending);
  EXPECT_EQ(got, 0u);
  const std::uint8_t out[4] = {1, 2, 3, 4};
  std::size_t sent = 0;
  EXPECT_EQ(sendSome(p.client.get(), out, sizeof(out), &sent), Io::kDone);
  EXPECT_EQ(sent, sizeof(out));
  for (const auto start = Clock::now(); got < sizeof(in) && Clock::now() - start < kLiveness;) {
    if (recvSome(p.server.get(), in, sizeof(in), &got) == Io::kPending) {
      pollfd pfd{p.server.get(), POLLIN, 0};
      ::poll(&pfd, 1, 10);
    }
  }
  EXPECT_EQ(got, sizeof(in));
  p.client.reset();
  got = 0;
  Io io = Io::kPending;
  for (const auto start = Clock::now(); io == Io::kPending && Clock::now() - start < kLiveness;) {
    io = recvSome(p.server.get(), in, sizeof(in), &got);
    if (io == Io::kPending) {
      pollfd pfd{p.server.get(), POLLIN, 0};
      ::poll(&pfd, 1, 10);
    }
  }
  EXPECT_EQ(io, Io::kClosed);
}

TEST(SocketToolkit, FdIsAMoveOnlyOwner) {
  int raw[2] = {-1, -1};
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, raw), 0);
  Fd a(raw[0]);
  Fd b(raw[1]);
  Fd moved(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  EXPECT_EQ(moved.get(), raw[0]);
  moved = std::move(b);  // closes raw[0]
  EXPECT_FALSE(isOpen(raw[0]));
  EXPECT_TRUE(isOpen(raw[1]));
  const int released = moved.release();
  EXPECT_EQ(released, raw[1]);
  EXPECT_FALSE(moved.valid());
  moved.reset(released);
  moved.reset();
  EXPECT_FALSE(isOpen(raw[1]));
}

TEST(SocketToolkit, EndpointText) {
  const sockaddr_in v4 = loopback(8080);
  EXPECT_EQ(endpointText(asAddr(v4)), "127.0.0.1:8080");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(443);
  v6.sin6_addr = in6addr_loopback;
  EXPECT_EQ(endpointText(reinterpret_cast<const sockaddr*>(&v6)), "[::1]:443");
}

}  // namespace
}  // namespace optiflow::net
