// Network probes: the responder every daemon runs, the prober (probePeer), and how the results refine the topology.
// The control connection is a plain TCP socket carrying the frames of probe_wire.h, opened and driven through the
// net socket toolkit (optiflow/net/socket.h: the same stream options as the data streams, deadlines that honour the
// stop flag); the measured bytes travel through the net plugin's own TCP transport (optiflow::net), so a probe sees
// what NCCL's proxy would see. docs/probing.md.
//
// Errors: socket-level steps return the toolkit's net::SocketStatus, everything above them core::Result<T> with the
// message in its Diagnostic; probePeer and ProbeResponder::start put who and where in front.
#include "optiflow/daemon/probe.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

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

#include "optiflow/net/socket.h"
#include "optiflow/net/transport.h"
#include "probe_wire.h"

namespace optiflow::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using net::Deadline;
using net::Fd;
using net::SocketStatus;
constexpr int kAcceptPollMs = 100;
// A responder session ends by then whatever the prober does: a slow or silent client cannot hold a slot for long.
constexpr double kSessionTimeoutS = 60;
constexpr std::size_t kMaxSessions = 4;
constexpr int kListenBacklog = 16;

std::string errnoText(int err) { return std::strerror(err); }

core::Diagnostic failure(std::string message) { return core::Diagnostic{"", 0, 0, std::move(message)}; }
core::Diagnostic failure(const SocketStatus& status) { return failure(status.message()); }

std::string endpointText(const sockaddr_storage& addr) {
  return net::endpointText(reinterpret_cast<const sockaddr*>(&addr));
}

struct HostPort {
  std::string host;  // empty: every address (listen only)
  std::string port;
};

// "host:port" or "[v6]:port"; an empty host means every address (listen only).
core::Result<HostPort> splitHostPort(const std::string& text) {
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
    return failure(fmt::format("\"{}\" is not host:port (a port in 0..65535; \"[addr]:port\" for IPv6)", text));
  }
  return HostPort{h, p};
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

core::Result<AddrInfo> resolve(const HostPort& where, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* out = nullptr;
  const int rc = ::getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), where.port.c_str(), &hints, &out);
  if (rc != 0) return failure(fmt::format("cannot resolve \"{}\": {}", where.host, ::gai_strerror(rc)));
  return AddrInfo(out);
}

// The control connection: each address of peer in turn until one connects; the deadline running out ends the search.
core::Result<Fd> connectTo(const std::string& peer, const Deadline& deadline) {
  core::Result<HostPort> where = splitHostPort(peer);
  if (!where) return where.error();
  if (where->host.empty()) return failure(fmt::format("\"{}\" names no host", peer));
  core::Result<AddrInfo> list = resolve(*where, false);
  if (!list) return list.error();
  std::string error;
  for (const addrinfo* ai = list->get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd;
    const SocketStatus s = net::connectWithin(ai->ai_addr, ai->ai_addrlen, deadline, "the control connection", &fd);
    if (s.ok()) return fd;
    if (s.expired()) return failure(s);
    error = s.message();
  }
  return failure(error.empty() ? "no address to connect to" : error);
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

core::Result<std::shared_ptr<net::Transport>> makeTransportOn(const std::string& ifname, const std::string& who) {
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
  if (!t)
    return failure(fmt::format("no TCP transport on interface {}: {}", ifname.empty() ? "(unknown)" : ifname, first));
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

core::Result<std::unique_ptr<net::SendComm>> connectSend(net::Transport& transport, const std::uint8_t* handle,
                                                         const Deadline& deadline) {
  std::unique_ptr<net::Connector> connector;
  const net::Result r = transport.connect(0, handle, &connector);
  if (r != net::Result::kOk || !connector) return failure("net connect: " + resultText(r));
  std::unique_ptr<net::SendComm> send;
  while (true) {
    const net::Result s = connector->step(&send);
    if (s != net::Result::kOk) return failure("net connect: " + resultText(s));
    if (send) return send;
    if (SocketStatus e = deadline.check("the net connection"); !e) return failure(e);
    pause();
  }
}

core::Result<std::unique_ptr<net::RecvComm>> acceptRecv(net::ListenComm& listen, const Deadline& deadline) {
  std::unique_ptr<net::RecvComm> recv;
  while (true) {
    const net::Result r = listen.accept(&recv);
    if (r != net::Result::kOk) return failure("net accept: " + resultText(r));
    if (recv) return recv;
    if (SocketStatus e = deadline.check("the net connection to be accepted"); !e) return failure(e);
    pause();
  }
}

// A memory registration released before its comm goes away (declare it after the comm).
template <typename Comm>
class Registration {
 public:
  static core::Result<Registration> make(Comm* comm, void* data, std::size_t bytes) {
    net::MemHandle* mh = nullptr;
    const net::Result r = comm->regMr(data, bytes, net::kPtrHost, &mh);
    if (r != net::Result::kOk) return failure("net regMr: " + resultText(r));
    return Registration(comm, mh);
  }
  Registration(Registration&& other) noexcept : comm_(other.comm_), mh_(std::exchange(other.mh_, nullptr)) {}
  Registration& operator=(Registration&&) = delete;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() {
    if (mh_ != nullptr) comm_->deregMr(mh_);
  }
  net::MemHandle* get() const { return mh_; }

 private:
  Registration(Comm* comm, net::MemHandle* mh) : comm_(comm), mh_(mh) {}
  Comm* comm_;
  net::MemHandle* mh_ = nullptr;
};

// The size test() reports once the request is done.
template <typename Comm>
core::Result<int> waitDone(Comm& comm, net::Request* request, const Deadline& deadline, const char* what) {
  while (true) {
    int done = 0;
    int size = 0;
    const net::Result r = comm.test(request, &done, &size);
    if (r != net::Result::kOk) return failure(fmt::format("{}: {}", what, resultText(r)));
    if (done != 0) return size;
    if (SocketStatus e = deadline.check(what); !e) return failure(e);
    // Lets the other end run when both share a core (a loopback probe, a busy node): pure spinning measured RTTs of
    // a scheduler slice instead of the network's.
    std::this_thread::yield();
  }
}

core::Result<net::Request*> postSend(net::SendComm& send, const void* data, std::size_t bytes, net::MemHandle* mh,
                                     const Deadline& deadline) {
  while (true) {
    net::Request* request = nullptr;
    const net::Result r = send.isend(data, bytes, 0, mh, &request);
    if (r != net::Result::kOk) return failure("net isend: " + resultText(r));
    if (request != nullptr) return request;
    if (SocketStatus e = deadline.check("a free send slot"); !e) return failure(e);
    pause();
  }
}

core::Result<net::Request*> postRecv(net::RecvComm& recv, void* data, std::size_t bytes, net::MemHandle* mh,
                                     const Deadline& deadline) {
  const int tag = 0;
  while (true) {
    net::Request* request = nullptr;
    const net::Result r = recv.irecv(1, &data, &bytes, &tag, &mh, &request);
    if (r != net::Result::kOk) return failure("net irecv: " + resultText(r));
    if (request != nullptr) return request;
    if (SocketStatus e = deadline.check("a free receive slot"); !e) return failure(e);
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
      Fd fd;
      const net::Io io = net::acceptStream(listener_.get(), &fd, &from);  // with the stream options
      if (io != net::Io::kDone) {
        if (io == net::Io::kError) {
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
      const core::Result<probewire::Request> served = session(fd);
      if (served) {
        served_.fetch_add(1);
        spdlog::debug("probe responder {}: served {} ({} x {} bytes, {} pings)", listen_, peer, served->count,
                      served->bytes, served->pings);
        return;
      }
      spdlog::warn("probe responder {}: probe from {} failed: {}", listen_, peer, served.error().message);
    } catch (const std::exception& e) {
      spdlog::warn("probe responder {}: probe from {} failed: {}", listen_, peer, e.what());
    } catch (...) {
      spdlog::warn("probe responder {}: probe from {} failed: unknown exception", listen_, peer);
    }
    refused_.fetch_add(1);
  }

  // One transport per local interface, made once: listing interfaces and their speeds is not free.
  core::Result<std::shared_ptr<net::Transport>> transportFor(int fd) {
    const std::string ifname = interfaceOwning(fd);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = transports_.find(ifname);
    if (it != transports_.end()) return it->second;
    core::Result<std::shared_ptr<net::Transport>> t = makeTransportOn(ifname, "probe responder " + listen_);
    if (t) transports_.emplace(ifname, *t);
    return t;
  }

  // The request it served.
  core::Result<probewire::Request> session(int fd) {
    const Deadline deadline(kSessionTimeoutS, &stop_);
    std::array<std::uint8_t, probewire::kRequestBytes> raw{};
    if (SocketStatus e = net::recvAll(fd, raw.data(), raw.size(), deadline, "the request"); !e) return failure(e);
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
        (void)net::sendAll(fd, out.data(), out.size(), deadline, "the refusal");  // best effort: we fail anyway
      }
      return failure(error);
    }
    core::Result<std::shared_ptr<net::Transport>> transport = transportFor(fd);
    if (!transport) return transport.error();

    // Bandwidth: receive `count` messages of `bytes`, then acknowledge on the control connection.
    std::vector<std::uint8_t> buffer(request.bytes);
    probewire::HandleFrame frame;
    std::unique_ptr<net::ListenComm> listen;
    const net::Result lr = (*transport)->listen(0, frame.handle, &listen);
    if (lr != net::Result::kOk || !listen) return failure("net listen: " + resultText(lr));
    std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
    probewire::encodeHandleFrame(frame, out.data());
    if (SocketStatus e = net::sendAll(fd, out.data(), out.size(), deadline, "the handle"); !e) return failure(e);
    core::Result<std::unique_ptr<net::RecvComm>> recv = acceptRecv(*listen, deadline);
    if (!recv) return recv.error();
    auto recvReg = Registration<net::RecvComm>::make(recv->get(), buffer.data(), buffer.size());
    if (!recvReg) return recvReg.error();
    std::string failed;  // the bandwidth phase's failure: the prober still gets its kNak
    {
      std::vector<net::Request*> requests;
      requests.reserve(request.count);
      for (std::uint32_t i = 0; i < request.count; ++i) {
        core::Result<net::Request*> r = postRecv(**recv, buffer.data(), buffer.size(), recvReg->get(), deadline);
        if (!r) {
          failed = r.error().message;
          break;
        }
        requests.push_back(*r);
      }
      for (net::Request* r : requests) {
        if (!failed.empty()) break;
        core::Result<int> size = waitDone(**recv, r, deadline, "a probe message");
        if (!size) {
          failed = size.error().message;
        } else if (static_cast<std::uint64_t>(*size) != request.bytes) {
          failed = fmt::format("a probe message of {} bytes, expected {}", *size, request.bytes);
        }
      }
    }
    const std::uint8_t ack = failed.empty() ? probewire::kAck : probewire::kNak;
    if (SocketStatus e = net::sendAll(fd, &ack, 1, deadline, "the acknowledgement"); !e && failed.empty()) {
      failed = e.message();
    }
    if (!failed.empty()) return failure(failed);

    // Latency: connect back to the prober and echo its pings.
    std::array<std::uint8_t, probewire::kHandleFrameBytes> in{};
    if (SocketStatus e = net::recvAll(fd, in.data(), in.size(), deadline, "the prober's handle"); !e) {
      return failure(e);
    }
    if (!probewire::decodeHandleFrame(in.data(), &frame, &error)) return failure(error);
    if (frame.status != probewire::Status::kOk) return failure("the prober sent a refusal instead of its handle");
    core::Result<std::unique_ptr<net::SendComm>> send = connectSend(**transport, frame.handle, deadline);
    if (!send) return send.error();
    std::array<std::uint8_t, probewire::kPingBytes> pong{};
    auto sendReg = Registration<net::SendComm>::make(send->get(), pong.data(), pong.size());
    if (!sendReg) return sendReg.error();
    for (std::uint32_t i = 0; i <= request.pings; ++i) {
      core::Result<net::Request*> ping =
          postRecv(**recv, buffer.data(), probewire::kPingBytes, recvReg->get(), deadline);
      if (!ping) return ping.error();
      if (core::Result<int> r = waitDone(**recv, *ping, deadline, "a ping"); !r) return r.error();
      std::memcpy(pong.data(), buffer.data(), pong.size());
      core::Result<net::Request*> sent = postSend(**send, pong.data(), pong.size(), sendReg->get(), deadline);
      if (!sent) return sent.error();
      if (core::Result<int> r = waitDone(**send, *sent, deadline, "a pong"); !r) return r.error();
    }
    return request;
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

// result with its bandwidth and latency measured.
core::Result<NetProbeResult> probeInto(NetProbeResult result, std::uint64_t bytes, const Deadline& deadline) {
  core::Result<Fd> control = connectTo(result.peer, deadline);
  if (!control) return control.error();
  const int fd = control->get();
  std::array<std::uint8_t, probewire::kRequestBytes> request{};
  probewire::encodeRequest(probewire::Request{bytes, kProbeMessages, kProbePings}, request.data());
  if (SocketStatus e = net::sendAll(fd, request.data(), request.size(), deadline, "the request"); !e) {
    return failure(e);
  }
  std::array<std::uint8_t, probewire::kHandleFrameBytes> in{};
  if (SocketStatus e = net::recvAll(fd, in.data(), in.size(), deadline, "the responder's handle"); !e) {
    return failure(e);
  }
  probewire::HandleFrame frame;
  std::string error;
  if (!probewire::decodeHandleFrame(in.data(), &frame, &error)) return failure(error);
  if (frame.status != probewire::Status::kOk) return failure("the responder refused the probe: " + frame.reason);
  core::Result<std::shared_ptr<net::Transport>> transport =
      makeTransportOn(interfaceOwning(fd), "probe of " + result.peer);
  if (!transport) return transport.error();

  // Bandwidth: from the first isend to the responder's acknowledgement of the last receive.
  std::vector<std::uint8_t> buffer(bytes);
  core::Result<std::unique_ptr<net::SendComm>> send = connectSend(**transport, frame.handle, deadline);
  if (!send) return send.error();
  auto sendReg = Registration<net::SendComm>::make(send->get(), buffer.data(), buffer.size());
  if (!sendReg) return sendReg.error();
  const Clock::time_point start = Clock::now();
  std::vector<net::Request*> requests;
  requests.reserve(kProbeMessages);
  for (std::uint32_t i = 0; i < kProbeMessages; ++i) {
    core::Result<net::Request*> r = postSend(**send, buffer.data(), buffer.size(), sendReg->get(), deadline);
    if (!r) return r.error();
    requests.push_back(*r);
  }
  for (net::Request* r : requests) {
    if (core::Result<int> sent = waitDone(**send, r, deadline, "a probe message to be sent"); !sent) {
      return sent.error();
    }
  }
  std::uint8_t ack = 0;
  if (SocketStatus e = net::recvAll(fd, &ack, 1, deadline, "the acknowledgement"); !e) return failure(e);
  const double elapsed = seconds(Clock::now() - start);
  if (ack != probewire::kAck) return failure("the responder failed to receive the probe messages (its log says why)");
  result.bandwidthGBps =
      static_cast<double>(bytes) * kProbeMessages / std::max(elapsed, 1e-9) / 1e9;  // GB/s = 1e9 bytes/s

  // Latency: the responder connects back and echoes 8-byte pings; the first round trip only warms up.
  probewire::HandleFrame mine;
  std::unique_ptr<net::ListenComm> listen;
  const net::Result lr = (*transport)->listen(0, mine.handle, &listen);
  if (lr != net::Result::kOk || !listen) return failure("net listen: " + resultText(lr));
  std::array<std::uint8_t, probewire::kHandleFrameBytes> out{};
  probewire::encodeHandleFrame(mine, out.data());
  if (SocketStatus e = net::sendAll(fd, out.data(), out.size(), deadline, "our handle"); !e) return failure(e);
  std::array<std::uint8_t, probewire::kPingBytes> pong{};
  core::Result<std::unique_ptr<net::RecvComm>> recv = acceptRecv(*listen, deadline);
  if (!recv) return recv.error();
  auto recvReg = Registration<net::RecvComm>::make(recv->get(), pong.data(), pong.size());
  if (!recvReg) return recvReg.error();
  std::vector<double> rtts;
  for (std::uint32_t i = 0; i <= kProbePings; ++i) {
    std::memcpy(buffer.data(), &i, sizeof(i));
    core::Result<net::Request*> rr = postRecv(**recv, pong.data(), pong.size(), recvReg->get(), deadline);
    if (!rr) return rr.error();
    const Clock::time_point t0 = Clock::now();
    core::Result<net::Request*> sr = postSend(**send, buffer.data(), probewire::kPingBytes, sendReg->get(), deadline);
    if (!sr) return sr.error();
    if (core::Result<int> r = waitDone(**send, *sr, deadline, "a ping to be sent"); !r) return r.error();
    if (core::Result<int> r = waitDone(**recv, *rr, deadline, "a pong"); !r) return r.error();
    const double rtt = seconds(Clock::now() - t0);
    std::uint32_t echoed = 0;
    std::memcpy(&echoed, pong.data(), sizeof(echoed));
    if (echoed != i) return failure(fmt::format("pong {} echoed ping {}", i, echoed));
    if (i > 0) rtts.push_back(rtt);
  }
  result.latencyUs = median(rtts) / 2 * 1e6;
  return result;
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
    core::Result<HostPort> hostPort = splitHostPort(listen);
    if (!hostPort) return fail(hostPort.error().message);
    core::Result<AddrInfo> list = resolve(*hostPort, true);
    if (!list) return fail(list.error().message);
    Fd fd;
    sockaddr_storage bound{};
    std::string error;
    for (const addrinfo* ai = list->get(); ai != nullptr && !fd.valid(); ai = ai->ai_next) {
      if (SocketStatus s = net::listenOn(ai->ai_addr, ai->ai_addrlen, kListenBacklog, &fd, &bound); !s) {
        error = s.message();
      }
    }
    if (!fd.valid()) return fail(error.empty() ? "no address to listen on" : error);
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
    const Deadline deadline(timeoutS, &stop);
    core::Result<NetProbeResult> measured = probeInto(std::move(result), bytes, deadline);
    if (!measured) return fail(measured.error().message);
    return measured;
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
