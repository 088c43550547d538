// The TCP transport: devices are interfaces; listen/connect/accept set up a connection's streams without ever
// blocking (non-blocking sockets, state machines driven by repeated calls), then hand them to tcp_comm.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>

#include "interfaces.h"
#include "optiflow/net/socket.h"
#include "optiflow/net/wire.h"
#include "tcp_comm.h"

namespace optiflow::net {
namespace detail {
namespace {

constexpr int kListenBacklog = 256;
constexpr int kMaxPendingStreams = 1024;  // accepted sockets still sending their hello
constexpr int kFirstBackoffMs = 5;
constexpr int kMaxBackoffMs = 500;

std::int64_t monotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

std::uint64_t randomId() {
  std::uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(v)) && v != 0) return v;
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ static_cast<std::uint64_t>(monotonicMs()));
  do v = rng();
  while (v == 0);
  return v;
}

std::string errnoText(int err) { return std::strerror(err); }

// Every stream gets the toolkit's stream options (socket.h: no Nagle delay, keepalive, TCP_USER_TIMEOUT), so a
// peer whose host died without a FIN or RST fails the socket instead of leaving test() waiting forever.

bool sameAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                     &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, 16) == 0;
}

// ---- Accept ------------------------------------------------------------------------------------------------------

class TcpListenComm final : public ListenComm {
 public:
  struct Rail {
    Fd fd;
    std::string nic;
    int firstStream = 0;  // stream indices [firstStream, firstStream + streams) arrive on this rail
    int streams = 0;
  };

  TcpListenComm(std::vector<Rail> rails, std::uint64_t listenId, int streamCount, LogFn log, Telemetry* telemetry,
                std::uint64_t minStripeBytes)
      : rails_(std::move(rails)),
        listenId_(listenId),
        streamCount_(streamCount),
        log_(std::move(log)),
        telemetry_(telemetry),
        minStripeBytes_(minStripeBytes) {}

  Result accept(std::unique_ptr<RecvComm>* recv) noexcept override {
    if (recv == nullptr) return Result::kInvalidArgument;
    recv->reset();
    try {
      const Result r = acceptPending();
      if (r != Result::kOk) return r;
      readHellos();
      for (auto it = groups_.begin(); it != groups_.end(); ++it) {
        if (it->second.arrived < streamCount_) continue;
        TcpConnection c;
        c.fds = std::move(it->second.fds);
        c.peer = it->second.peer;
        for (const Rail& rail : rails_) {
          c.railNics.push_back(rail.nic);
          for (int k = 0; k < rail.streams; ++k) c.railOfStream.push_back(static_cast<int>(c.railNics.size()) - 1);
        }
        c.log = log_;
        c.telemetry = telemetry_;
        c.minStripeBytes = minStripeBytes_;
        groups_.erase(it);
        *recv = makeTcpRecvComm(std::move(c));
        return Result::kOk;
      }
      return Result::kOk;
    } catch (const std::exception& e) {
      warn(log_, std::string("accept failed: ") + e.what());
      return Result::kSystemError;
    }
  }

 private:
  struct Pending {
    Fd fd;
    int rail = 0;
    std::string peer;  // IP text
    std::string endpoint;
    std::uint8_t hello[wire::kHelloBytes] = {};
    std::size_t got = 0;
  };
  struct Group {
    std::vector<Fd> fds;
    int arrived = 0;
    std::string peer;
  };

  Result acceptPending() {
    for (std::size_t r = 0; r < rails_.size(); ++r) {
      for (;;) {
        sockaddr_storage addr{};
        Fd fd;
        const Io io = acceptStream(rails_[r].fd.get(), &fd, &addr);
        if (io == Io::kPending) break;
        if (io != Io::kDone) {
          warn(log_, "accept on " + rails_[r].nic + " failed: " + errnoText(errno));
          return Result::kSystemError;
        }
        if (static_cast<int>(pending_.size()) >= kMaxPendingStreams) {
          warn(log_, "refused a stream from " + endpointText(reinterpret_cast<sockaddr*>(&addr)) + ": " +
                         std::to_string(kMaxPendingStreams) + " streams already wait for their hello");
          continue;
        }
        Pending p;
        p.fd = std::move(fd);
        p.rail = static_cast<int>(r);
        p.peer = addressText(reinterpret_cast<sockaddr*>(&addr));
        p.endpoint = endpointText(reinterpret_cast<sockaddr*>(&addr));
        pending_.push_back(std::move(p));
      }
    }
    return Result::kOk;
  }

  void refuse(Pending& p, const std::string& why) {
    warn(log_,
         "refused a stream from " + p.endpoint + " on " + rails_[static_cast<std::size_t>(p.rail)].nic + ": " + why);
    p.fd.reset();
  }

  void readHellos() {
    for (Pending& p : pending_) {
      if (!p.fd.valid()) continue;
      const Io io = recvSome(p.fd.get(), p.hello, wire::kHelloBytes, &p.got);
      if (io == Io::kPending) continue;
      if (io != Io::kDone) {
        refuse(p, io == Io::kClosed ? "closed before its hello (" + std::to_string(p.got) + " of " +
                                          std::to_string(wire::kHelloBytes) + " bytes)"
                                    : "recv failed: " + errnoText(errno));
        continue;
      }
      wire::Hello h;
      std::string error;
      if (!wire::decodeHello(p.hello, &h, &error)) {
        refuse(p, error);
        continue;
      }
      if (h.listenId != listenId_) {
        refuse(p, "its hello is for another listener (listen id " + std::to_string(h.listenId) + ", this one " +
                      std::to_string(listenId_) + ")");
        continue;
      }
      if (h.streamCount != streamCount_) {
        refuse(p, "its hello says " + std::to_string(h.streamCount) + " streams, this listener expects " +
                      std::to_string(streamCount_));
        continue;
      }
      const Rail& rail = rails_[static_cast<std::size_t>(p.rail)];
      if (h.streamIndex < rail.firstStream || h.streamIndex >= rail.firstStream + rail.streams) {
        refuse(p, "stream " + std::to_string(h.streamIndex) + " arrived on rail " + std::to_string(p.rail) +
                      ", which carries streams " + std::to_string(rail.firstStream) + ".." +
                      std::to_string(rail.firstStream + rail.streams - 1));
        continue;
      }
      Group& g = groups_[h.connId];
      if (g.fds.empty()) {
        g.fds.resize(static_cast<std::size_t>(streamCount_));
        g.peer = p.peer;
      }
      if (g.fds[h.streamIndex].valid()) {
        refuse(p, "connection " + std::to_string(h.connId) + " already has stream " + std::to_string(h.streamIndex));
        continue;
      }
      g.fds[h.streamIndex] = std::move(p.fd);
      ++g.arrived;
    }
    std::erase_if(pending_, [](const Pending& p) { return !p.fd.valid(); });
  }

  std::vector<Rail> rails_;
  std::uint64_t listenId_;
  int streamCount_;
  LogFn log_;
  Telemetry* telemetry_;
  std::uint64_t minStripeBytes_;
  std::vector<Pending> pending_;
  std::map<std::uint64_t, Group> groups_;  // by connId
};

// ---- Connect -----------------------------------------------------------------------------------------------------

class TcpConnector final : public Connector {
 public:
  TcpConnector(const wire::TcpHandle& handle, const std::vector<Interface>* interfaces, int dev,
               const TcpOptions& options, LogFn log, Telemetry* telemetry)
      : handle_(handle),
        interfaces_(interfaces),
        dev_(dev),
        options_(options),
        log_(std::move(log)),
        telemetry_(telemetry),
        deadlineMs_(monotonicMs() + options.connectTimeoutMs),
        connId_(randomId()) {
    int index = 0;
    for (int r = 0; r < handle.railCount; ++r) {
      for (int k = 0; k < handle.rails[r].streams; ++k) {
        Stream s;
        s.rail = r;
        wire::Hello hello;
        hello.buildId = wire::buildId();
        hello.listenId = handle.listenId;
        hello.connId = connId_;
        hello.streamIndex = static_cast<std::uint16_t>(index++);
        hello.streamCount = 0;  // set below
        s.hello = hello;
        streams_.push_back(std::move(s));
      }
    }
    for (Stream& s : streams_) {
      s.hello.streamCount = static_cast<std::uint16_t>(streams_.size());
      wire::encodeHello(s.hello, s.helloBytes);
    }
  }

  Result step(std::unique_ptr<SendComm>* send) noexcept override {
    if (send == nullptr) return Result::kInvalidArgument;
    send->reset();
    if (failed_ != Result::kOk) return failed_;
    try {
      const std::int64_t now = monotonicMs();
      bool allDone = true;
      for (std::size_t i = 0; i < streams_.size(); ++i) {
        if (!advance(streams_[i], now)) return failed_;
        allDone = allDone && streams_[i].state == State::kDone;
      }
      if (allDone) {
        *send = makeTcpSendComm(connection());
        return Result::kOk;
      }
      if (now > deadlineMs_) {
        return fail(Result::kRemoteError, "connect to " + railText(0) + " timed out after " +
                                              std::to_string(options_.connectTimeoutMs) + " ms");
      }
      return Result::kOk;
    } catch (const std::exception& e) {
      return fail(Result::kSystemError, std::string("connect failed: ") + e.what());
    }
  }

 private:
  enum class State { kStart, kConnecting, kHello, kDone };
  struct Stream {
    int rail = 0;
    Fd fd;
    State state = State::kStart;
    std::int64_t retryAtMs = 0;
    int backoffMs = kFirstBackoffMs;
    wire::Hello hello;
    std::uint8_t helloBytes[wire::kHelloBytes] = {};
    std::size_t helloSent = 0;
  };

  Result fail(Result r, const std::string& why) {
    failed_ = r;
    warn(log_, why);
    if (telemetry_ != nullptr) countAdd(&telemetry_->peer(peerText())->errors, 1);
    return r;
  }

  sockaddr_storage railAddress(int r, socklen_t* len) const {
    const wire::RailAddress& a = handle_.rails[r];
    sockaddr_storage ss{};
    if (a.family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&ss);
      in->sin_family = AF_INET;
      in->sin_port = htons(a.port);
      std::memcpy(&in->sin_addr, a.addr, 4);
      *len = sizeof(sockaddr_in);
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(a.port);
      std::memcpy(&in6->sin6_addr, a.addr, 16);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) {
        // A link-local address only means something with the outgoing interface's scope.
        const Interface& local = (*interfaces_)[static_cast<std::size_t>(dev_)];
        if (local.addr.ss_family == AF_INET6) {
          in6->sin6_scope_id = reinterpret_cast<const sockaddr_in6&>(local.addr).sin6_scope_id;
        }
      }
      *len = sizeof(sockaddr_in6);
    }
    return ss;
  }

  std::string railText(int r) const {
    socklen_t len = 0;
    const sockaddr_storage ss = railAddress(r, &len);
    return endpointText(reinterpret_cast<const sockaddr*>(&ss));
  }

  std::string peerText() const {
    socklen_t len = 0;
    const sockaddr_storage ss = railAddress(0, &len);
    return addressText(reinterpret_cast<const sockaddr*>(&ss));
  }

  void retryLater(Stream& s, std::int64_t now) {
    s.fd.reset();
    s.state = State::kStart;
    s.retryAtMs = now + s.backoffMs;
    s.backoffMs = std::min(s.backoffMs * 2, kMaxBackoffMs);
  }

  // false when the connection failed (failed_ set and logged).
  bool advance(Stream& s, std::int64_t now) {
    if (s.state == State::kStart) {
      if (now < s.retryAtMs) return true;
      socklen_t len = 0;
      const sockaddr_storage addr = railAddress(s.rail, &len);
      s.fd = openStream(addr.ss_family);
      if (!s.fd.valid()) {
        fail(Result::kSystemError, "socket() for a stream to " + railText(s.rail) + " failed: " + errnoText(errno));
        return false;
      }
      const Io io = beginConnect(s.fd.get(), reinterpret_cast<const sockaddr*>(&addr), len);
      if (io == Io::kDone) {
        s.state = State::kHello;
      } else if (io == Io::kPending) {
        s.state = State::kConnecting;
      } else if (errno == ECONNREFUSED) {
        retryLater(s, now);
        return true;
      } else {
        fail(Result::kRemoteError, "connect to " + railText(s.rail) + " failed: " + errnoText(errno));
        return false;
      }
    }
    if (s.state == State::kConnecting) {
      int err = 0;
      const Io io = connectDone(s.fd.get(), &err);
      if (io == Io::kPending) return true;
      if (err == ECONNREFUSED) {
        retryLater(s, now);
        return true;
      }
      if (io != Io::kDone) {
        fail(Result::kRemoteError, "connect to " + railText(s.rail) + " failed: " + errnoText(err));
        return false;
      }
      s.state = State::kHello;
    }
    if (s.state == State::kHello) {
      const Io io = sendSome(s.fd.get(), s.helloBytes, wire::kHelloBytes, &s.helloSent);
      if (io == Io::kPending) return true;
      if (io != Io::kDone) {
        fail(Result::kRemoteError, "sending the hello to " + railText(s.rail) + " failed: " + errnoText(errno));
        return false;
      }
      s.state = State::kDone;
    }
    return true;
  }

  // Rail r's local NIC: the interface whose address the socket is bound to; among several with that address the one
  // at the same position as the rail (dev + r), so two devices on one address stay distinct rails.
  std::string localNic(int r, int fd) const {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const std::size_t count = interfaces_->size();
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const std::size_t preferred = (static_cast<std::size_t>(dev_) + static_cast<std::size_t>(r)) % count;
      if (sameAddress((*interfaces_)[preferred].addr, local)) return (*interfaces_)[preferred].name;
      for (const Interface& i : *interfaces_) {
        if (sameAddress(i.addr, local)) return i.name;
      }
    }
    return (*interfaces_)[static_cast<std::size_t>(dev_)].name;
  }

  TcpConnection connection() {
    TcpConnection c;
    int lastRail = -1;
    for (Stream& s : streams_) {
      if (s.rail != lastRail) {
        c.railNics.push_back(localNic(s.rail, s.fd.get()));
        lastRail = s.rail;
      }
      c.fds.push_back(std::move(s.fd));
      c.railOfStream.push_back(s.rail);
    }
    c.peer = peerText();
    c.log = log_;
    c.telemetry = telemetry_;
    c.minStripeBytes = options_.minStripeBytes;
    return c;
  }

  wire::TcpHandle handle_;
  const std::vector<Interface>* interfaces_;
  int dev_;
  TcpOptions options_;
  LogFn log_;
  Telemetry* telemetry_;
  std::int64_t deadlineMs_;
  std::uint64_t connId_;
  std::vector<Stream> streams_;
  Result failed_ = Result::kOk;
};

// ---- Transport ---------------------------------------------------------------------------------------------------

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::vector<Interface> interfaces, const TcpOptions& options, LogFn log, Telemetry* telemetry)
      : interfaces_(std::move(interfaces)), options_(options), log_(std::move(log)), telemetry_(telemetry) {
    options_.streamsPerRail = std::clamp(options_.streamsPerRail, 1, wire::kMaxStreams);
  }

  const char* name() const noexcept override { return "OptiFlow"; }
  int deviceCount() const noexcept override { return static_cast<int>(interfaces_.size()); }
  const DeviceProps& device(int dev) const noexcept override {
    static const DeviceProps kNone{};
    return validDev(dev) ? interfaces_[static_cast<std::size_t>(dev)].props : kNone;
  }

  Result listen(int dev, void* handle, std::unique_ptr<ListenComm>* listen) noexcept override {
    if (listen == nullptr || handle == nullptr || !validDev(dev)) {
      warn(log_, "listen: device " + std::to_string(dev) + " not in 0.." + std::to_string(deviceCount() - 1) +
                     " or null handle/comm");
      return Result::kInvalidArgument;
    }
    listen->reset();
    try {
      std::vector<int> devs{dev};
      if (options_.stripe) {
        for (int d = 0; d < deviceCount() && static_cast<int>(devs.size()) < wire::kMaxRails; ++d) {
          if (d != dev) devs.push_back(d);
        }
      }
      const int perRail = std::min(options_.streamsPerRail, wire::kMaxStreams / static_cast<int>(devs.size()));
      wire::TcpHandle h;
      h.buildId = wire::buildId();
      h.listenId = randomId();
      h.railCount = static_cast<std::uint8_t>(devs.size());
      std::vector<TcpListenComm::Rail> rails;
      for (std::size_t r = 0; r < devs.size(); ++r) {
        const Interface& iface = interfaces_[static_cast<std::size_t>(devs[r])];
        Fd fd;
        sockaddr_storage addr{};
        const SocketStatus s =
            listenOn(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen, kListenBacklog, &fd, &addr);
        if (!s) {
          warn(log_, "listen on " + iface.name + " (" + iface.addrText + ") failed: " + s.message());
          return Result::kSystemError;
        }
        rails.push_back({std::move(fd), iface.name, static_cast<int>(r) * perRail, perRail});
        wire::RailAddress& ra = h.rails[r];
        ra.family = static_cast<std::uint8_t>(addr.ss_family);
        ra.streams = static_cast<std::uint8_t>(perRail);
        if (addr.ss_family == AF_INET) {
          const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
          ra.port = ntohs(in.sin_port);
          std::memcpy(ra.addr, &in.sin_addr, 4);
        } else {
          const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
          ra.port = ntohs(in6.sin6_port);
          std::memcpy(ra.addr, &in6.sin6_addr, 16);
        }
      }
      if (!wire::encodeTcpHandle(h, static_cast<std::uint8_t*>(handle))) {
        warn(log_, "listen: could not encode a handle with " + std::to_string(devs.size()) + " rails");
        return Result::kInternalError;
      }
      *listen = std::make_unique<TcpListenComm>(std::move(rails), h.listenId, perRail * static_cast<int>(devs.size()),
                                                log_, telemetry_, options_.minStripeBytes);
      return Result::kOk;
    } catch (const std::exception& e) {
      warn(log_, std::string("listen failed: ") + e.what());
      return Result::kSystemError;
    }
  }

  Result connect(int dev, const void* handle, std::unique_ptr<Connector>* connector) noexcept override {
    if (connector == nullptr || handle == nullptr || !validDev(dev)) {
      warn(log_, "connect: device " + std::to_string(dev) + " not in 0.." + std::to_string(deviceCount() - 1) +
                     " or null handle/connector");
      return Result::kInvalidArgument;
    }
    connector->reset();
    wire::TcpHandle h;
    std::string error;
    if (!wire::decodeTcpHandle(static_cast<const std::uint8_t*>(handle), &h, &error)) {
      warn(log_, "connect: refusing the peer's handle: " + error);
      return Result::kInvalidArgument;
    }
    try {
      *connector = std::make_unique<TcpConnector>(h, &interfaces_, dev, options_, log_, telemetry_);
      return Result::kOk;
    } catch (const std::exception& e) {
      warn(log_, std::string("connect failed: ") + e.what());
      return Result::kSystemError;
    }
  }

 private:
  bool validDev(int dev) const { return dev >= 0 && dev < deviceCount(); }

  std::vector<Interface> interfaces_;
  TcpOptions options_;
  LogFn log_;
  Telemetry* telemetry_;
};

}  // namespace

std::unique_ptr<Transport> makeTcpTransportOn(std::vector<Interface> interfaces, const TcpOptions& options, LogFn log,
                                              Telemetry* telemetry) {
  if (interfaces.empty()) return nullptr;
  return std::make_unique<TcpTransport>(std::move(interfaces), options, std::move(log), telemetry);
}

}  // namespace detail

std::unique_ptr<Transport> makeTcpTransport(const TcpOptions& options, LogFn log, Telemetry* telemetry,
                                            std::string* error) {
  std::string why;
  std::vector<detail::Interface> interfaces;
  try {
    interfaces = detail::listInterfaces(options.ifnames, &why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (interfaces.empty()) {
    if (error != nullptr) *error = "TCP transport: " + why;
    return nullptr;
  }
  return detail::makeTcpTransportOn(std::move(interfaces), options, std::move(log), telemetry);
}

}  // namespace optiflow::net
