// Network probes: the responder every daemon runs, the prober (probePeer), and how the results refine the topology.
// The control connection is a plain TCP socket carrying the frames of probe_wire.h; the measured bytes travel through
// the net plugin's own TCP transport (optiflow::net), so a probe sees what NCCL's proxy would see. docs/probing.md.
#include "optiflow/daemon/probe.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "optiflow/net/transport.h"
#include "probe_wire.h"

namespace optiflow::daemon {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kAcceptPollMs = 100;
constexpr int kSliceMs = 50;  // the longest a wait goes without looking at the stop flag
// A responder session ends by then whatever the prober does: a slow or silent client cannot hold a slot for long.
constexpr double kSessionTimeoutS = 60;
constexpr std::size_t kMaxSessions = 4;
constexpr int kListenBacklog = 16;

std::string errnoText(int err) { return std::strerror(err); }

class Deadline {
 public:
  Deadline(double seconds, const std::atomic<bool>& stop)
      : seconds_(seconds),
        end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))),
        stop_(&stop) {}

  // "" while there is time left, else why not.
  std::string check(const char* waitingFor) const {
    if (stop_->load(std::memory_order_relaxed)) return fmt::format("stopped while waiting for {}", waitingFor);
    if (Clock::now() >= end_) return fmt::format("timed out after {:.1f} s waiting for {}", seconds_, waitingFor);
    return "";
  }
  int pollMs() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, kSliceMs));
  }

 private:
  double seconds_;
  Clock::time_point end_;
  const std::atomic<bool>* stop_;
};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string endpointText(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    port = ntohs(a.sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
    port = ntohs(a.sin6_port);
  }
  return fmt::format("[{}]:{}", host, port);
}

// "host:port" or "[v6]:port"; an empty host means every address (listen only).
bool splitHostPort(const std::string& text, std::string* host, std::string* port, std::string* error) {
  std::string h, p;
  if (!text.empty() && text[0] == '[') {
    const std::size_t close = text.find(']');
    if (close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':') {
      h = text.substr(1, close - 1);
      p = text.substr(close + 2);
    }
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') == colon) {
      h = text.substr(0, colon);
      p = text.substr(colon + 1);
    }
  }
  const bool portOk =
      !p.empty() && p.size() <= 5 && p.find_first_not_of("0123456789") == std::string::npos && std::stoul(p) <= 65535;
  if (!portOk) {
    *error = fmt::format("\"{}\" is not host:port (a port in 0..65535; \"[addr]:port\" for IPv6)", text);
    return false;
  }
  *host = h;
  *port = p;
  return true;
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfo resolve(const std::string& host, const std::string& port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* out = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &out);
  if (rc != 0) {
    *error = fmt::format("cannot resolve \"{}\": {}", host, ::gai_strerror(rc));
    return nullptr;
  }
  return AddrInfo(out);
}

std::string sendAll(int fd, const void* data, std::size_t n, const Deadline& deadline, const char* what) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (w > 0) {
      done += static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return fmt::format("sending {}: {}", what, errnoText(errno));
    }
    if (std::string e = deadline.check(what); !e.empty()) return e;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, deadline.pollMs());
  }
  return "";
}

std::string recvAll(int fd, void* data, std::size_t n, const Deadline& deadline, const char* what) {
  auto* p = static_cast<std::uint8_t*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return fmt::format("connection closed after {} of the {} bytes of {}", done, n, what);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fmt::format("receiving {}: {}", what, errnoText(errno));
    if (std::string e = deadline.check(what); !e.empty()) return e;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, deadline.pollMs());
  }
  return "";
}

std::string connectTo(const std::string& peer, const Deadline& deadline, Fd* out) {
  std::string host, port, error;
  if (!splitHostPort(peer, &host, &port, &error)) return error;
  if (host.empty()) return fmt::format("\"{}\" names no host", peer);
  AddrInfo list = resolve(host, port, false, &error);
  if (!list) return error;
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      error = fmt::format("socket: {}", errnoText(errno));
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = fmt::format("connect: {}", errnoText(errno));
        continue;
      }
      int soError = 0;
      while (true) {
        if (std::string e = deadline.check("the control connection"); !e.empty()) return e;
        pollfd pfd{fd.get(), POLLOUT, 0};
        if (::poll(&pfd, 1, deadline.pollMs()) <= 0) continue;
        socklen_t len = sizeof(soError);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soError, &len);
        break;
      }
      if (soError != 0) {
        error = fmt::format("connect: {}", errnoText(soError));
        continue;
      }
    }
    setNoDelay(fd.get());
    *out = std::move(fd);
    return "";
  }
  return error.empty() ? "no address to connect to" : error;
}

// The interface whose address the control socket uses locally, so the measured bytes take the same path; "" if none
// matches (then the transport's default interfaces are used).
std::string interfaceOwning(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return "";
  if (local.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(local);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      sockaddr_in a4{};
      a4.sin_family = AF_INET;
      std::memcpy(&a4.sin_addr, a6.sin6_addr.s6_addr + 12, 4);
      local = {};
      std::memcpy(&local, &a4, sizeof(a4));
    }
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string name;
  for (const ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local.ss_family) continue;
    if (local.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (a->sin_addr.s_addr == reinterpret_cast<const sockaddr_in&>(local).sin_addr.s_addr) name = i->ifa_name;
    } else if (local.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (std::memcmp(&a->sin6_addr, &reinterpret_cast<const sockaddr_in6&>(local).sin6_addr, 16) == 0) {
        name = i->ifa_name;
      }
    }
  }
  ::freeifaddrs(list);
  return name;
}

net::LogFn netLog(std::string who) {
  return [who = std::move(who)](int level, const std::string& message) {
    if (level <= 1) {
      spdlog::warn("{}: net: {}", who, message);
    } else {
      spdlog::debug("{}: net: {}", who, message);
    }
  };
}

std::shared_ptr<net::Transport> makeTransportOn(const std::string& ifname, const std::string& who, std::string* error) {
  net::TcpOptions options;
  if (!ifname.empty()) options.ifnames = {ifname};
  std::string first;
  std::shared_ptr<net::Transport> t = net::makeTcpTransport(options, netLog(who), nullptr, &first);
  if (!t && !ifname.empty()) {
    options.ifnames.clear();
    std::string second;
    t = net::makeTcpTransport(options, netLog(who), nullptr, &second);
    if (!t) first += "; default interfaces: " + second;
  }
  if (!t) {
    *error = fmt::format("no TCP transport on interface {}: {}", ifname.empty() ? "(unknown)" : ifname, first);
  }
  return t;
}

std::string resultText(net::Result r) {
  switch (r) {
    case net::Result::kOk:
      return "ok";
    case net::Result::kSystemError:
      return "system error";
    case net::Result::kInternalError:
      return "internal error";
    case net::Result::kInvalidArgument:
      return "invalid argument";
    case net::Result::kInvalidUsage:
      return "invalid usage";
    case net::Result::kRemoteError:
      return "remote error (the peer died or sent a corrupt frame)";
  }
  return "error " + std::to_string(static_cast<int>(r));
}

void pause() { std::this_thread::sleep_for(std::chrono::microseconds(100)); }

std::string connectSend(net::Transport& transport, const std::uint8_t* handle, const Deadline& deadline,
                        std::unique_ptr<net::SendComm>* send) {
  std::unique_ptr<net::Connector> connector;
  const net::Result r = transport.connect(0, handle, &connector);
  if (r != net::Result::kOk || !connector) return "net connect: " + resultText(r);
  while (true) {
    const net::Result s = connector->step(send);
    if (s != net::Result::kOk) return "net connect: " + resultText(s);
    if (*send) return "";
    if (std::string e = deadline.check("the net connection"); !e.empty()) return e;
    pause();
  }
}

std::string acceptRecv(net::ListenComm& listen, const Deadline& deadline, std::unique_ptr<net::RecvComm>* recv) {
  while (true) {
    const net::Result r = listen.accept(recv);
    if (r != net::Result::kOk) return "net accept: " + resultText(r);
    if (*recv) return "";
    if (std::string e = deadline.check("the net connection to be accepted"); !e.empty()) return e;
    pause();
  }
}

// A memory registration released before its comm goes away (declare it after the comm).
template <typename Comm>
class Registration {
 public:
  Registration(Comm* comm, void* data, std::size_t bytes, std::string* error) : comm_(comm) {
    const net::Result r = comm_->regMr(data, bytes, net::kPtrHost, &mh_);
    if (r != net::Result::kOk) {
      *error = "net regMr: " + resultText(r);
      mh_ = nullptr;
    }
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() {
    if (mh_ != nullptr) comm_->deregMr(mh_);
  }
  net::MemHandle* get() const { return mh_; }

 private:
  Comm* comm_;
  net::MemHandle* mh_ = nullptr;
};

template <typename Comm>
std::string waitDone(Comm& comm, net::Request* request, const Deadline& deadline, const char* what,
                     int* sizes = nullptr) {
  while (true) {
    int done = 0;
    const net::Result r = comm.test(request, &done, sizes);
    if (r != net::Result::kOk) return fmt::format("{}: {}", what, resultText(r));
    if (done != 0) return "";
    if (std::string e = deadline.check(what); !e.empty()) return e;
    // Lets the other end run when both share a core (a loopback probe, a busy node): pure spinning measured RTTs of
    // a scheduler slice instead of the network's.
    std::this_thread::yield();
  }
}

std::string postSend(net::SendComm& send, const void* data, std::size_t bytes, net::MemHandle* mh,
                     const Deadline& deadline, net::Request** request) {
  while (true) {
    const net::Result r = send.isend(data, bytes, 0, mh, request);
    if (r != net::Result::kOk) return "net isend: " + resultText(r);
    if (*request != nullptr) return "";
    if (std::string e = deadline.check("a free send slot"); !e.empty()) return e;
    pause();
  }
}

std::string postRecv(net::RecvComm& recv, void* data, std::size_t bytes, net::MemHandle* mh, const Deadline& deadline,
                     net::Request** request) {
  const int tag = 0;
  while (true) {
    const net::Result r = recv.irecv(1, &data, &bytes, &tag, &mh, request);
    if (r != net::Result::kOk) return "net irecv: " + resultText(r);
    if (*request != nullptr) return "";
    if (std::string e = deadline.check("a free receive slot"); !e.empty()) return e;
    pause();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- Responder -----------------------------------------------------------------------------------------------------

class ResponderImpl final : public ProbeResponder {
 public:
  ResponderImpl(Fd listener, int port, std::string listen)
      : listener_(std::move(listener)), port_(port), listen_(std::move(listen)) {}

  ~ResponderImpl() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  void startThread() {
    thread_ = std::thread([this] { acceptLoop(); });
  }

  int port() const override { return port_; }
  Stats stats() const override { return Stats{served_.load(), refused_.load()}; }

 private:
  struct Session {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  void reap(bool all) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (all || it->done->load()) {
        it->thread.join();
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void acceptLoop() {
    while (!stop_.load()) {
      reap(false);
      pollfd pfd{listener_.get(), POLLIN, 0};
      if (::poll(&pfd, 1, kAcceptPollMs) <= 0) continue;
      sockaddr_storage from{};
      socklen_t len = sizeof(from);
      Fd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd.get() < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
          spdlog::warn("probe responder {}: accept: {}", listen_, errnoText(errno));
          std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptPollMs));  // EMFILE: let sessions end
        }
        continue;
      }
      const std::string peer = endpointText(from);
      if (sessions_.size() >= kMaxSessions) {
        spdlog::warn("probe responder {}: refusing {}: {} probes are already running", listen_, peer, kMaxSessions);
        refused_.fetch_add(1);
        continue;
      }
      setNoDelay(fd.get());
      auto done = std::make_shared<std::atomic<bool>>(false);
      try {
        auto shared = std::make_shared<Fd>(std::move(fd));
        std::thread t([this, shared, peer, done] {
          serve(shared->get(), peer);
          shared->reset();
          done->store(true);
        });
        sessions_.push_back(Session{std::move(t), done});
      } catch (const std::exception& e) {
        spdlog::warn("probe responder {}: cannot serve {}: {}", listen_, peer, e.what());
        refused_.fetch_add(1);
      }
    }
    reap(true);
  }

  void serve(int fd, const std::string& peer) noexcept {
    try {
      const std::string error = session(fd, peer);
      if (error.empty()) {
        served_.fetch_add(1);
        return;
      }
      spdlog::warn("probe responder {}: probe from {} failed: {}", listen_, peer, error);
    } catch (const std::exception& e) {
      spdlog::warn("probe responder {}: probe from {} failed: {}", listen_, peer, e.what());
    } catch (...) {
      spdlog::warn("probe responder {}: probe from {} failed: unknown exception", listen_, peer);
    }
    refused_.fetch_add(1);
  }

  // One transport per local interface, made once: listing interfaces and their speeds is not free.
  std::shared_ptr<net::Transport> transportFor(int fd, std::string* error) {
    const std::string ifname = interfaceOwning(fd);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = transports_.find(ifname);
    if (it != transports_.end()) return it->second;
    std::shared_ptr<net::Transport> t = makeTransportOn(ifname, "probe responder " + listen_, error);
    if (t) transports_.emplace(ifname, t);
    return t;
  }

  std::string session(int fd, const std::string& peer) {
    const Deadline deadline(kSessionTimeoutS, stop_);
    std::array<std::uint8_t, probewire::kRequestBytes> raw{};
    if (std::string e = recvAll(fd, raw.data(), raw.size(), deadline, "the request"); !e.empty()) return e;
    probewire::Request request;
    std::string error;
    if (!probewire::decodeRequest(raw.data(), &request, &error)) {
      // A frame of ours with a value out of range gets the reason back; anything else is not worth an answer.
      if (probewire::detail::get32(raw.data()) == probewire::kRequestMagic) {
        probewire::HandleFrame refusal;
        refusal.status = probewire::Status::kRefused;
        refusal.reason = error;
        std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
        probewire::encodeHandleFrame(refusal, out.data());
        sendAll(fd, out.data(), out.size(), deadline, "the refusal");
      }
      return error;
    }
    std::shared_ptr<net::Transport> transport = transportFor(fd, &error);
    if (!transport) return error;

    // Bandwidth: receive `count` messages of `bytes`, then acknowledge on the control connection.
    std::vector<std::uint8_t> buffer(request.bytes);
    probewire::HandleFrame frame;
    std::unique_ptr<net::ListenComm> listen;
    const net::Result lr = transport->listen(0, frame.handle, &listen);
    if (lr != net::Result::kOk || !listen) return "net listen: " + resultText(lr);
    std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
    probewire::encodeHandleFrame(frame, out.data());
    if (std::string e = sendAll(fd, out.data(), out.size(), deadline, "the handle"); !e.empty()) return e;
    std::unique_ptr<net::RecvComm> recv;
    if (std::string e = acceptRecv(*listen, deadline, &recv); !e.empty()) return e;
    Registration<net::RecvComm> recvReg(recv.get(), buffer.data(), buffer.size(), &error);
    if (recvReg.get() == nullptr) return error;
    std::string failure;
    {
      std::vector<net::Request*> requests(request.count, nullptr);
      for (net::Request*& r : requests) {
        failure = postRecv(*recv, buffer.data(), buffer.size(), recvReg.get(), deadline, &r);
        if (!failure.empty()) break;
      }
      for (net::Request* r : requests) {
        if (!failure.empty() || r == nullptr) break;
        int size = 0;
        failure = waitDone(*recv, r, deadline, "a probe message", &size);
        if (failure.empty() && static_cast<std::uint64_t>(size) != request.bytes) {
          failure = fmt::format("a probe message of {} bytes, expected {}", size, request.bytes);
        }
      }
    }
    const std::uint8_t ack = failure.empty() ? probewire::kAck : probewire::kNak;
    if (std::string e = sendAll(fd, &ack, 1, deadline, "the acknowledgement"); !e.empty() && failure.empty()) {
      failure = e;
    }
    if (!failure.empty()) return failure;

    // Latency: connect back to the prober and echo its pings.
    std::array<std::uint8_t, probewire::kHandleFrameBytes> in{};
    if (std::string e = recvAll(fd, in.data(), in.size(), deadline, "the prober's handle"); !e.empty()) return e;
    if (!probewire::decodeHandleFrame(in.data(), &frame, &error)) return error;
    if (frame.status != probewire::Status::kOk) return "the prober sent a refusal instead of its handle";
    std::unique_ptr<net::SendComm> send;
    if (std::string e = connectSend(*transport, frame.handle, deadline, &send); !e.empty()) return e;
    std::array<std::uint8_t, probewire::kPingBytes> pong{};
    Registration<net::SendComm> sendReg(send.get(), pong.data(), pong.size(), &error);
    if (sendReg.get() == nullptr) return error;
    for (std::uint32_t i = 0; i <= request.pings; ++i) {
      net::Request* r = nullptr;
      if (std::string e = postRecv(*recv, buffer.data(), probewire::kPingBytes, recvReg.get(), deadline, &r);
          !e.empty()) {
        return e;
      }
      if (std::string e = waitDone(*recv, r, deadline, "a ping"); !e.empty()) return e;
      std::memcpy(pong.data(), buffer.data(), pong.size());
      if (std::string e = postSend(*send, pong.data(), pong.size(), sendReg.get(), deadline, &r); !e.empty()) return e;
      if (std::string e = waitDone(*send, r, deadline, "a pong"); !e.empty()) return e;
    }
    spdlog::debug("probe responder {}: served {} ({} x {} bytes, {} pings)", listen_, peer, request.count,
                  request.bytes, request.pings);
    return "";
  }

  Fd listener_;
  int port_;
  std::string listen_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> served_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
  std::vector<Session> sessions_;  // accept thread only
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<net::Transport>> transports_;
};

// ---- Prober --------------------------------------------------------------------------------------------------------

std::string probeInto(NetProbeResult* result, std::uint64_t bytes, const Deadline& deadline) {
  Fd control;
  if (std::string e = connectTo(result->peer, deadline, &control); !e.empty()) return e;
  const int fd = control.get();
  std::array<std::uint8_t, probewire::kRequestBytes> request{};
  probewire::encodeRequest(probewire::Request{bytes, kProbeMessages, kProbePings}, request.data());
  if (std::string e = sendAll(fd, request.data(), request.size(), deadline, "the request"); !e.empty()) return e;
  std::array<std::uint8_t, probewire::kHandleFrameBytes> in{};
  if (std::string e = recvAll(fd, in.data(), in.size(), deadline, "the responder's handle"); !e.empty()) return e;
  probewire::HandleFrame frame;
  std::string error;
  if (!probewire::decodeHandleFrame(in.data(), &frame, &error)) return error;
  if (frame.status != probewire::Status::kOk) return "the responder refused the probe: " + frame.reason;
  std::shared_ptr<net::Transport> transport = makeTransportOn(interfaceOwning(fd), "probe of " + result->peer, &error);
  if (!transport) return error;

  // Bandwidth: from the first isend to the responder's acknowledgement of the last receive.
  std::vector<std::uint8_t> buffer(bytes);
  std::unique_ptr<net::SendComm> send;
  if (std::string e = connectSend(*transport, frame.handle, deadline, &send); !e.empty()) return e;
  Registration<net::SendComm> sendReg(send.get(), buffer.data(), buffer.size(), &error);
  if (sendReg.get() == nullptr) return error;
  const Clock::time_point start = Clock::now();
  std::vector<net::Request*> requests(kProbeMessages, nullptr);
  for (net::Request*& r : requests) {
    if (std::string e = postSend(*send, buffer.data(), buffer.size(), sendReg.get(), deadline, &r); !e.empty()) {
      return e;
    }
  }
  for (net::Request* r : requests) {
    if (std::string e = waitDone(*send, r, deadline, "a probe message to be sent"); !e.empty()) return e;
  }
  std::uint8_t ack = 0;
  if (std::string e = recvAll(fd, &ack, 1, deadline, "the acknowledgement"); !e.empty()) return e;
  const double elapsed = seconds(Clock::now() - start);
  if (ack != probewire::kAck) return "the responder failed to receive the probe messages (its log says why)";
  result->bandwidthGBps =
      static_cast<double>(bytes) * kProbeMessages / std::max(elapsed, 1e-9) / 1e9;  // GB/s = 1e9 bytes/s

  // Latency: the responder connects back and echoes 8-byte pings; the first round trip only warms up.
  probewire::HandleFrame mine;
  std::unique_ptr<net::ListenComm> listen;
  const net::Result lr = transport->listen(0, mine.handle, &listen);
  if (lr != net::Result::kOk || !listen) return "net listen: " + resultText(lr);
  std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
  probewire::encodeHandleFrame(mine, out.data());
  if (std::string e = sendAll(fd, out.data(), out.size(), deadline, "our handle"); !e.empty()) return e;
  std::array<std::uint8_t, probewire::kPingBytes> pong{};
  std::unique_ptr<net::RecvComm> recv;
  if (std::string e = acceptRecv(*listen, deadline, &recv); !e.empty()) return e;
  Registration<net::RecvComm> recvReg(recv.get(), pong.data(), pong.size(), &error);
  if (recvReg.get() == nullptr) return error;
  std::vector<double> rtts;
  for (std::uint32_t i = 0; i <= kProbePings; ++i) {
    std::memcpy(buffer.data(), &i, sizeof(i));
    net::Request* rr = nullptr;
    net::Request* sr = nullptr;
    if (std::string e = postRecv(*recv, pong.data(), pong.size(), recvReg.get(), deadline, &rr); !e.empty()) return e;
    const Clock::time_point t0 = Clock::now();
    if (std::string e = postSend(*send, buffer.data(), probewire::kPingBytes, sendReg.get(), deadline, &sr);
        !e.empty()) {
      return e;
    }
    if (std::string e = waitDone(*send, sr, deadline, "a ping to be sent"); !e.empty()) return e;
    if (std::string e = waitDone(*recv, rr, deadline, "a pong"); !e.empty()) return e;
    const double rtt = seconds(Clock::now() - t0);
    std::uint32_t echoed = 0;
    std::memcpy(&echoed, pong.data(), sizeof(echoed));
    if (echoed != i) return fmt::format("pong {} echoed ping {}", i, echoed);
    if (i > 0) rtts.push_back(rtt);
  }
  result->latencyUs = median(rtts) / 2 * 1e6;
  return "";
}

std::string escapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

core::Result<std::unique_ptr<ProbeResponder>> ProbeResponder::start(const std::string& listen) {
  auto fail = [&](const std::string& what) {
    return core::Diagnostic{"", 0, 0, fmt::format("probe responder on \"{}\": {}", listen, what)};
  };
  try {
    std::string host, port, error;
    if (!splitHostPort(listen, &host, &port, &error)) return fail(error);
    AddrInfo list = resolve(host, port, true, &error);
    if (!list) return fail(error);
    Fd fd;
    for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (s.get() < 0) {
        error = fmt::format("socket: {}", errnoText(errno));
        continue;
      }
      int one = 1;
      ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        error = fmt::format("bind: {}", errnoText(errno));
        continue;
      }
      if (::listen(s.get(), kListenBacklog) != 0) {
        error = fmt::format("listen: {}", errnoText(errno));
        continue;
      }
      fd = std::move(s);
      break;
    }
    if (fd.get() < 0) return fail(error.empty() ? "no address to listen on" : error);
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      return fail(fmt::format("getsockname: {}", errnoText(errno)));
    }
    const int boundPort = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port)
                                                      : ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);
    const std::string where = endpointText(bound);
    auto responder = std::make_unique<ResponderImpl>(std::move(fd), boundPort, where);
    responder->startThread();
    spdlog::info("probe responder listening on {}", where);
    return std::unique_ptr<ProbeResponder>(std::move(responder));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

core::Result<NetProbeResult> probePeer(const std::string& peer, std::uint64_t bytes, const core::Topology& predicted,
                                       double timeoutS, const std::atomic<bool>& stop) {
  auto fail = [&](const std::string& what) {
    return core::Diagnostic{"", 0, 0, fmt::format("probe of {}: {}", peer, what)};
  };
  try {
    if (bytes < 1 || bytes > probewire::kMaxProbeBytes) {
      return fail(fmt::format("{}-byte messages: expected 1..{}", bytes, probewire::kMaxProbeBytes));
    }
    if (!(timeoutS > 0) || !std::isfinite(timeoutS)) return fail(fmt::format("timeout {} s: expected > 0", timeoutS));
    NetProbeResult result;
    result.peer = peer;
    if (!predicted.nics.empty()) {
      result.predictedGBps = predicted.nics[0].bandwidthGBps;
      result.predictedLatencyUs = predicted.nics[0].latencyUs;
    }
    const Deadline deadline(timeoutS, stop);
    if (std::string e = probeInto(&result, bytes, deadline); !e.empty()) return fail(e);
    return result;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown exception");
  }
}

core::Topology applyNetProbes(const core::Topology& topology, const std::vector<NetProbeResult>& results) {
  std::vector<double> bandwidths, latencies;
  for (const NetProbeResult& r : results) {
    if (std::isfinite(r.bandwidthGBps) && r.bandwidthGBps > 0) bandwidths.push_back(r.bandwidthGBps);
    if (std::isfinite(r.latencyUs) && r.latencyUs > 0) latencies.push_back(r.latencyUs);
  }
  core::Topology out = topology;
  for (core::Nic& nic : out.nics) {
    if (!bandwidths.empty()) {
      nic.bandwidthGBps =
          std::clamp(median(bandwidths), core::Topology::kMinBandwidthGBps, core::Topology::kMaxBandwidthGBps);
    }
    if (!latencies.empty()) nic.latencyUs = std::clamp(median(latencies), 0.0, core::Topology::kMaxLatencyUs);
  }
  return out;
}

double probeGapRatio(const NetProbeResult& result) {
  return result.predictedGBps > 0 ? result.bandwidthGBps / result.predictedGBps : 0;
}

void recordNetProbe(Metrics& metrics, const NetProbeResult& result) {
  const std::string labels = fmt::format("peer=\"{}\"", escapeLabel(result.peer));
  metrics.set("optiflowd_probe_bandwidth_gbps", result.bandwidthGBps, labels);
  metrics.set("optiflowd_probe_latency_us", result.latencyUs, labels);
  metrics.set("optiflowd_probe_gap_ratio", probeGapRatio(result), labels);
}

}  // namespace optiflow::daemon
