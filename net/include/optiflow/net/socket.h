// The one socket toolkit under every TCP stream OptiFlow opens: the TCP transport's data streams, the RDMA
// transport's bootstrap socket and optiflowd's probe control connections. One fd guard, one set of stream options,
// one way to connect, accept, send and receive.
//
// Runtime-side error style (docs/net.md): everything is noexcept. The non-blocking steps return an Io and leave errno
// as the call set it; the blocking ones (with a Deadline) return a SocketStatus: ok, or the kind of failure and one
// message, to which the caller adds who and where before it logs it once.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace optiflow::net {

// Owns one file descriptor (move-only); closes it when reset or destroyed.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept;
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Every stream socket: no Nagle delay, and a peer whose host died or was cut off (no FIN or RST ever arrives) is
// detected by the kernel instead of leaving a wait hanging forever: keepalive probes after kKeepIdleS idle
// (kKeepCount x kKeepIntervalS), and unacknowledged data older than kUserTimeoutMs fails the socket.
inline constexpr int kKeepIdleS = 15;
inline constexpr int kKeepIntervalS = 5;
inline constexpr int kKeepCount = 3;
inline constexpr unsigned kUserTimeoutMs = 60000;
// Best effort, like the kernel defaults it replaces: false (errno set) when one option could not be set.
bool setStreamOptions(int fd) noexcept;

// "host:port", "[v6]:port"; "?" for a family other than IPv4/IPv6.
std::string endpointText(const sockaddr* addr) noexcept;

// ---- Non-blocking steps (driven by repeated calls of a state machine) -----------------------------------------------

enum class Io {
  kDone,     // all of it
  kPending,  // the socket would block: call again later
  kClosed,   // the peer closed the stream (orderly EOF)
  kError,    // errno says why
};

// Moves what the socket takes (or holds) right now of data[*offset, length), advancing *offset. Never blocks, never
// raises SIGPIPE.
Io sendSome(int fd, const void* data, std::size_t length, std::size_t* offset) noexcept;
Io recvSome(int fd, void* data, std::size_t length, std::size_t* offset) noexcept;

// A non-blocking, close-on-exec stream socket of `family` with the stream options set; invalid (errno set) when
// socket() failed.
Fd openStream(int family) noexcept;
// connect() on a socket of openStream: kDone (connected at once), kPending (finish with connectDone), kError (errno).
Io beginConnect(int fd, const sockaddr* addr, socklen_t length) noexcept;
// Whether a pending connect finished, without waiting: kPending, kDone, or kError with *error the errno
// (ECONNREFUSED, ETIMEDOUT, ...).
Io connectDone(int fd, int* error) noexcept;
// The next connection waiting on a listening socket, non-blocking, close-on-exec, with the stream options:
// kDone (*out, *peer set), kPending (none waits), kError (errno).
Io acceptStream(int listener, Fd* out, sockaddr_storage* peer) noexcept;

// ---- Blocking steps with a deadline ---------------------------------------------------------------------------------

class SocketStatus {
 public:
  enum class Code : std::uint8_t { kOk, kTimedOut, kStopped, kClosed, kError };

  SocketStatus() = default;  // ok
  static SocketStatus failure(Code code, std::string message) noexcept {
    return SocketStatus(code, std::move(message));
  }

  bool ok() const noexcept { return code_ == Code::kOk; }
  explicit operator bool() const noexcept { return ok(); }
  Code code() const noexcept { return code_; }
  // The deadline passed or the stop flag was raised: the wait itself ran out, not the socket.
  bool expired() const noexcept { return code_ == Code::kTimedOut || code_ == Code::kStopped; }
  const std::string& message() const noexcept { return message_; }

 private:
  SocketStatus(Code code, std::string message) noexcept : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// How long a blocking step may wait, and an optional stop flag it honours within kSliceMs.
class Deadline {
 public:
  static constexpr int kSliceMs = 50;  // the longest one wait goes without looking at the stop flag

  explicit Deadline(double seconds, const std::atomic<bool>* stop = nullptr) noexcept;

  // Ok while there is time left and no stop was asked for; else kStopped "stopped while waiting for <what>" or
  // kTimedOut "timed out after <seconds> s waiting for <what>".
  SocketStatus check(const char* waitingFor) const noexcept;
  // Milliseconds one poll() may wait: what is left, at most kSliceMs.
  int pollMs() const noexcept;

 private:
  double seconds_;
  std::chrono::steady_clock::time_point end_;
  const std::atomic<bool>* stop_;
};

// All of data on fd (a non-blocking socket), waiting for room within the deadline. Failures: "sending <what>: <errno>"
// or the deadline's message.
SocketStatus sendAll(int fd, const void* data, std::size_t length, const Deadline& deadline, const char* what) noexcept;
// All length bytes from fd (non-blocking), waiting within the deadline. Failures: "connection closed after <n> of
// the <length> bytes of <what>" (kClosed), "receiving <what>: <errno>" or the deadline's message.
SocketStatus recvAll(int fd, void* data, std::size_t length, const Deadline& deadline, const char* what) noexcept;
// A connected stream (openStream + beginConnect + connectDone) to addr within the deadline, in *out. Failures:
// "socket: <errno>", "connect: <errno>" (kError) or the deadline's message for <what>.
SocketStatus connectWithin(const sockaddr* addr, socklen_t length, const Deadline& deadline, const char* what,
                           Fd* out) noexcept;
// A listening, non-blocking socket bound to addr (SO_REUSEADDR), in *out, and the address it got (the port when
// addr's was 0) in *bound. Failures: "socket: <errno>", "bind: <errno>", "listen: <errno>", "getsockname: <errno>".
SocketStatus listenOn(const sockaddr* addr, socklen_t length, int backlog, Fd* out, sockaddr_storage* bound) noexcept;

}  // namespace optiflow::net
