// The socket toolkit (socket.h): one implementation of the fd guard, the stream options and the connect / accept /
// send / receive steps that the TCP transport, the RDMA bootstrap and optiflowd's probes share.
#include "optiflow/net/socket.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace optiflow::net {
namespace {

std::string errnoText(const char* call, int err) { return std::string(call) + ": " + std::strerror(err); }

SocketStatus failed(SocketStatus::Code code, std::string message) noexcept {
  return SocketStatus::failure(code, std::move(message));
}

}  // namespace

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool setStreamOptions(int fd) noexcept {
  const int one = 1;
  bool ok = ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0;
  ok = ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepIdleS, sizeof(kKeepIdleS)) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepIntervalS, sizeof(kKeepIntervalS)) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepCount, sizeof(kKeepCount)) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &kUserTimeoutMs, sizeof(kUserTimeoutMs)) == 0 && ok;
  return ok;
}

std::string endpointText(const sockaddr* addr) noexcept {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return std::string("[").append(host).append("]:") + std::to_string(ntohs(in6->sin6_port));
  }
  return host;
}

// ---- Non-blocking steps ---------------------------------------------------------------------------------------------

Io sendSome(int fd, const void* data, std::size_t length, std::size_t* offset) noexcept {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  while (*offset < length) {
    const ssize_t n = ::send(fd, bytes + *offset, length - *offset, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *offset += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Io::kPending;
    } else {
      return n == 0 ? Io::kClosed : Io::kError;
    }
  }
  return Io::kDone;
}

Io recvSome(int fd, void* data, std::size_t length, std::size_t* offset) noexcept {
  auto* bytes = static_cast<std::uint8_t*>(data);
  while (*offset < length) {
    const ssize_t n = ::recv(fd, bytes + *offset, length - *offset, MSG_DONTWAIT);
    if (n > 0) {
      *offset += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return Io::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Io::kPending;
    } else {
      return Io::kError;
    }
  }
  return Io::kDone;
}

Fd openStream(int family) noexcept {
  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.valid()) {
    const int err = errno;
    setStreamOptions(fd.get());
    errno = err;
  }
  return fd;
}

Io beginConnect(int fd, const sockaddr* addr, socklen_t length) noexcept {
  if (::connect(fd, addr, length) == 0) return Io::kDone;
  // EINTR: a non-blocking connect goes on in the background, like EINPROGRESS.
  return errno == EINPROGRESS || errno == EINTR ? Io::kPending : Io::kError;
}

Io connectDone(int fd, int* error) noexcept {
  pollfd pfd{fd, POLLOUT, 0};
  const int rc = ::poll(&pfd, 1, 0);
  if (rc == 0) return Io::kPending;
  int err = 0;
  socklen_t errLength = sizeof(err);
  if (rc < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errLength) != 0) err = errno;
  if (err == EINTR) return Io::kPending;
  *error = err;
  return err == 0 ? Io::kDone : Io::kError;
}

Io acceptStream(int listener, Fd* out, sockaddr_storage* peer) noexcept {
  for (;;) {
    *peer = {};
    socklen_t length = sizeof(*peer);
    const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      out->reset(fd);
      setStreamOptions(fd);
      return Io::kDone;
    }
    // ECONNABORTED: that one gave up while it waited; the next may not have.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? Io::kPending : Io::kError;
  }
}

// ---- Blocking steps with a deadline ---------------------------------------------------------------------------------

Deadline::Deadline(double seconds, const std::atomic<bool>* stop) noexcept
    : seconds_(seconds),
      end_(std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds))),
      stop_(stop) {}

SocketStatus Deadline::check(const char* waitingFor) const noexcept {
  if (stop_ != nullptr && stop_->load(std::memory_order_relaxed)) {
    return failed(SocketStatus::Code::kStopped, std::string("stopped while waiting for ") + waitingFor);
  }
  if (std::chrono::steady_clock::now() >= end_) {
    char text[64];
    std::snprintf(text, sizeof(text), "timed out after %.1f s waiting for ", seconds_);
    return failed(SocketStatus::Code::kTimedOut, text + std::string(waitingFor));
  }
  return {};
}

int Deadline::pollMs() const noexcept {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(end_ - std::chrono::steady_clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, kSliceMs));
}

SocketStatus sendAll(int fd, const void* data, std::size_t length, const Deadline& deadline,
                     const char* what) noexcept {
  std::size_t done = 0;
  for (;;) {
    const Io io = sendSome(fd, data, length, &done);
    if (io == Io::kDone) return {};
    if (io != Io::kPending) return failed(SocketStatus::Code::kError, "sending " + errnoText(what, errno));
    if (SocketStatus s = deadline.check(what); !s) return s;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, deadline.pollMs());
  }
}

SocketStatus recvAll(int fd, void* data, std::size_t length, const Deadline& deadline, const char* what) noexcept {
  std::size_t done = 0;
  for (;;) {
    const Io io = recvSome(fd, data, length, &done);
    if (io == Io::kDone) return {};
    if (io == Io::kClosed) {
      return failed(SocketStatus::Code::kClosed, "connection closed after " + std::to_string(done) + " of the " +
                                                     std::to_string(length) + " bytes of " + what);
    }
    if (io == Io::kError) return failed(SocketStatus::Code::kError, "receiving " + errnoText(what, errno));
    if (SocketStatus s = deadline.check(what); !s) return s;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, deadline.pollMs());
  }
}

SocketStatus connectWithin(const sockaddr* addr, socklen_t length, const Deadline& deadline, const char* what,
                           Fd* out) noexcept {
  Fd fd = openStream(addr->sa_family);
  if (!fd.valid()) return failed(SocketStatus::Code::kError, errnoText("socket", errno));
  Io io = beginConnect(fd.get(), addr, length);
  int err = errno;
  while (io == Io::kPending) {
    if (SocketStatus s = deadline.check(what); !s) return s;
    pollfd pfd{fd.get(), POLLOUT, 0};
    if (::poll(&pfd, 1, deadline.pollMs()) <= 0) continue;
    io = connectDone(fd.get(), &err);
  }
  if (io != Io::kDone) return failed(SocketStatus::Code::kError, errnoText("connect", err));
  *out = std::move(fd);
  return {};
}

SocketStatus listenOn(const sockaddr* addr, socklen_t length, int backlog, Fd* out, sockaddr_storage* bound) noexcept {
  Fd fd(::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return failed(SocketStatus::Code::kError, errnoText("socket", errno));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), addr, length) != 0) return failed(SocketStatus::Code::kError, errnoText("bind", errno));
  if (::listen(fd.get(), backlog) != 0) return failed(SocketStatus::Code::kError, errnoText("listen", errno));
  *bound = {};
  socklen_t boundLength = sizeof(*bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(bound), &boundLength) != 0) {
    return failed(SocketStatus::Code::kError, errnoText("getsockname", errno));
  }
  *out = std::move(fd);
  return {};
}

}  // namespace optiflow::net
