// The RDMA verbs transport ("OptiFlow-IB"): devices (one PD each, the DMA-BUF probe), listen / accept / connect, and
// the bootstrap handshake over a TCP socket of the socket toolkit that brings a connection's queue pairs up: the
// sender sends its QP info, the receiver brings its QP up and answers with its own, the sender goes RTS and sends
// "ready". The comms of the data path are ib_comm.cc (docs/net-rdma.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>

#include "ib_comm.h"
#include "interfaces.h"
#include "optiflow/net/wire.h"

namespace optiflow::net::ib {
namespace {

constexpr int kConnectTimeoutMs = 30000;
constexpr std::uint8_t kReadyByte = 0x5a;

std::int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Why a bootstrap step (sendSome / recvSome of socket.h) failed, right after it did (errno is still its own): a reset
// or broken pipe is the peer going away as much as an orderly close.
std::string ioText(Io io) {
  return io == Io::kClosed || errno == ECONNRESET || errno == EPIPE
             ? "the peer closed the connection"
             : std::string("socket error: ") + std::strerror(errno);
}

// ---- connection setup -----------------------------------------------------------------------------------------------

std::string peerText(const sockaddr_storage& addr) {
  return detail::addressText(reinterpret_cast<const sockaddr*>(&addr));
}

// Receiver side of one incoming connection: read the sender's QP info, bring up our QP, answer, wait for "ready"
// (the sender's QP is then RTR, so our clear-to-send writes find it).
class Pending {
 public:
  Pending(Device* device, Fd socket, std::string peer, std::uint64_t listenId)
      : device_(device), socket_(std::move(socket)), peer_(std::move(peer)), listenId_(listenId) {}

  // kOk with *recv set when done, kOk with *recv null while in progress, an error when this connection failed.
  Result step(std::unique_ptr<RecvComm>* recv) {
    if (state_ == State::kRecvInfo) {
      const Io io = recvSome(socket_.get(), in_, kQpInfoBytes, &offset_);
      if (io == Io::kPending) return Result::kOk;
      if (io != Io::kDone) return error(Result::kRemoteError, "before sending its queue-pair info: " + ioText(io));
      std::string why;
      if (!decodeQpInfo(in_, &remote_, &why)) return error(Result::kRemoteError, "refused its queue-pair info: " + why);
      if (remote_.role != Role::kSender || remote_.listenId != listenId_) {
        return error(
            Result::kRemoteError,
            strf("refused its queue-pair info: %s for listener 0x%llx (this one is 0x%llx)",
                 remote_.role != Role::kSender ? "not a sender's" : "a sender's",
                 static_cast<unsigned long long>(remote_.listenId), static_cast<unsigned long long>(listenId_)));
      }
      endpoint_ = std::make_unique<Endpoint>(device_, Role::kReceiver);
      if (!endpoint_->create(&why) || !endpoint_->connect(remote_, &why)) {
        return error(Result::kSystemError, "setting up the receive queue pair: " + why);
      }
      encodeQpInfo(endpoint_->localInfo(listenId_), out_);
      offset_ = 0;
      state_ = State::kSendInfo;
    }
    if (state_ == State::kSendInfo) {
      const Io io = sendSome(socket_.get(), out_, kQpInfoBytes, &offset_);
      if (io == Io::kPending) return Result::kOk;
      if (io != Io::kDone) return error(Result::kRemoteError, "sending our queue-pair info: " + ioText(io));
      offset_ = 0;
      state_ = State::kRecvReady;
    }
    std::uint8_t ready = 0;
    const Io io = recvSome(socket_.get(), &ready, 1, &offset_);
    if (io == Io::kPending) return Result::kOk;
    if (io != Io::kDone) return error(Result::kRemoteError, "before it was ready: " + ioText(io));
    if (ready != kReadyByte) return error(Result::kRemoteError, strf("sent 0x%02x instead of its ready byte", ready));
    std::unique_ptr<RecvComm> comm = makeIbRecvComm(std::move(endpoint_), std::move(socket_), peer_, remote_);
    if (comm == nullptr) return Result::kSystemError;
    *recv = std::move(comm);
    return Result::kOk;
  }

 private:
  enum class State { kRecvInfo, kSendInfo, kRecvReady };
  Result error(Result result, const std::string& what) {
    device_->warn("accept on " + device_->port.props.name + ": connection from " + peer_ + " " + what);
    return result;
  }

  Device* device_;
  Fd socket_;
  std::string peer_;
  std::uint64_t listenId_;
  State state_ = State::kRecvInfo;
  std::size_t offset_ = 0;
  std::uint8_t in_[kQpInfoBytes] = {};
  std::uint8_t out_[kQpInfoBytes] = {};
  QpInfo remote_;
  std::unique_ptr<Endpoint> endpoint_;
};

class IbListenComm final : public ListenComm {
 public:
  IbListenComm(Device* device, Fd socket, std::uint64_t listenId)
      : device_(device), socket_(std::move(socket)), listenId_(listenId) {}

  Result accept(std::unique_ptr<RecvComm>* recv) noexcept override {
    if (recv == nullptr) return Result::kInvalidArgument;
    recv->reset();
    for (;;) {
      sockaddr_storage addr{};
      Fd fd;
      const Io io = acceptStream(socket_.get(), &fd, &addr);
      if (io == Io::kPending) break;
      if (io != Io::kDone) {
        device_->warn(strf("accept on %s: %s", device_->port.props.name.c_str(), std::strerror(errno)));
        return Result::kSystemError;
      }
      auto pending =
          std::unique_ptr<Pending>(new (std::nothrow) Pending(device_, std::move(fd), peerText(addr), listenId_));
      if (pending == nullptr) return Result::kSystemError;
      pending_.push_back(std::move(pending));
    }
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      const Result r = (*it)->step(recv);
      if (r != Result::kOk || *recv != nullptr) {
        pending_.erase(it);
        return r;
      }
    }
    return Result::kOk;
  }

 private:
  Device* device_;
  Fd socket_;
  std::uint64_t listenId_;
  std::vector<std::unique_ptr<Pending>> pending_;
};

// Sender side: TCP connect, create our QP, send our info, read the receiver's, RTR/RTS, send "ready".
class IbConnector final : public Connector {
 public:
  IbConnector(Device* device, const IbHandle& handle) : device_(device), handle_(handle) {
    std::memset(&addr_, 0, sizeof(addr_));
    if (handle.family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr_);
      in->sin_family = AF_INET;
      in->sin_port = htons(handle.port);
      std::memcpy(&in->sin_addr, handle.addr, 4);
      addrLen_ = sizeof(sockaddr_in);
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr_);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(handle.port);
      std::memcpy(&in6->sin6_addr, handle.addr, 16);
      addrLen_ = sizeof(sockaddr_in6);
    }
    peer_ = peerText(addr_);
  }

  Result step(std::unique_ptr<SendComm>* send) noexcept override {
    if (send == nullptr) return Result::kInvalidArgument;
    send->reset();
    if (failed_ != Result::kOk) return failed_;
    if (state_ == State::kStart) {
      deadlineMs_ = nowMs() + kConnectTimeoutMs;
      // The stream options (socket.h) include keepalive and TCP_USER_TIMEOUT: a peer host that dies after the
      // handshake is noticed by Link::idle through this socket.
      socket_ = openStream(addr_.ss_family);
      if (!socket_.valid()) return error(Result::kSystemError, std::string("socket: ") + std::strerror(errno));
      if (beginConnect(socket_.get(), reinterpret_cast<const sockaddr*>(&addr_), addrLen_) == Io::kError) {
        return error(Result::kRemoteError, std::string("connect: ") + std::strerror(errno));
      }
      state_ = State::kConnecting;
    }
    if (state_ == State::kConnecting) {
      // Only the TCP connect has a deadline: afterwards the peer is there, and a dead one closes the socket.
      int soError = 0;
      const Io io = connectDone(socket_.get(), &soError);
      if (io == Io::kPending) {
        if (nowMs() > deadlineMs_) {
          return error(Result::kRemoteError, strf("no TCP connection after %d s", kConnectTimeoutMs / 1000));
        }
        return Result::kOk;
      }
      if (io == Io::kError) return error(Result::kRemoteError, std::string("connect: ") + std::strerror(soError));
      endpoint_ = std::make_unique<Endpoint>(device_, Role::kSender);
      std::string why;
      if (!endpoint_->create(&why)) return error(Result::kSystemError, "setting up the send queue pair: " + why);
      encodeQpInfo(endpoint_->localInfo(handle_.listenId), out_);
      offset_ = 0;
      state_ = State::kSendInfo;
    }
    if (state_ == State::kSendInfo) {
      const Io io = sendSome(socket_.get(), out_, kQpInfoBytes, &offset_);
      if (io == Io::kPending) return Result::kOk;
      if (io != Io::kDone) return error(Result::kRemoteError, "sending our queue-pair info: " + ioText(io));
      offset_ = 0;
      state_ = State::kRecvInfo;
    }
    if (state_ == State::kRecvInfo) {
      const Io io = recvSome(socket_.get(), in_, kQpInfoBytes, &offset_);
      if (io == Io::kPending) return Result::kOk;
      if (io != Io::kDone)
        return error(Result::kRemoteError, "before answering with its queue-pair info: " + ioText(io));
      std::string why;
      if (!decodeQpInfo(in_, &remote_, &why)) return error(Result::kRemoteError, "refused its queue-pair info: " + why);
      if (remote_.role != Role::kReceiver || remote_.listenId != handle_.listenId) {
        return error(Result::kRemoteError, "refused its queue-pair info: not the receiver of this handle's listener");
      }
      if (!endpoint_->connect(remote_, &why)) return error(Result::kSystemError, why);
      ready_ = kReadyByte;
      offset_ = 0;
      state_ = State::kSendReady;
    }
    const Io io = sendSome(socket_.get(), &ready_, 1, &offset_);
    if (io == Io::kPending) return Result::kOk;
    if (io != Io::kDone) return error(Result::kRemoteError, "sending ready: " + ioText(io));
    std::unique_ptr<SendComm> comm = makeIbSendComm(std::move(endpoint_), std::move(socket_), peer_, remote_);
    if (comm == nullptr) return Result::kSystemError;
    *send = std::move(comm);
    failed_ = Result::kInvalidUsage;  // the connector is spent
    return Result::kOk;
  }

 private:
  enum class State { kStart, kConnecting, kSendInfo, kRecvInfo, kSendReady };
  Result error(Result result, const std::string& what) {
    device_->warn(strf("connect from %s to %s port %u: %s", device_->port.props.name.c_str(), peer_.c_str(),
                       static_cast<unsigned>(handle_.port), what.c_str()));
    failed_ = result;
    endpoint_.reset();
    socket_.reset();
    return result;
  }

  Device* device_;
  IbHandle handle_;
  sockaddr_storage addr_{};
  socklen_t addrLen_ = 0;
  std::string peer_;
  Fd socket_;
  State state_ = State::kStart;
  std::int64_t deadlineMs_ = 0;
  Result failed_ = Result::kOk;
  std::unique_ptr<Endpoint> endpoint_;
  std::size_t offset_ = 0;
  std::uint8_t out_[kQpInfoBytes] = {};
  std::uint8_t in_[kQpInfoBytes] = {};
  std::uint8_t ready_ = 0;
  QpInfo remote_;
};

// ---- transport ------------------------------------------------------------------------------------------------------

class IbTransport final : public Transport {
 public:
  IbTransport(const VerbsApi* api, Discovery discovery, Telemetry* telemetry)
      : api_(api), discovery_(std::move(discovery)), telemetry_(telemetry) {}
  ~IbTransport() override {
    for (auto& device : devices_) device->cache.clear(*api_);
    devices_.clear();
    for (ibv_pd* pd : pds_) {
      if (pd != nullptr) api_->deallocPd(pd);
    }
    closeDiscovery(*api_, &discovery_);
  }

  // One PD per device (shared by its ports: registrations are global), DMA-BUF probe, bootstrap address.
  bool init(const IbOptions& options, const LogFn& log, std::string* error) {
    if (telemetry_ == nullptr) telemetry_ = &localTelemetry_;
    std::vector<detail::Interface> interfaces = detail::listInterfaces({}, error);
    if (interfaces.empty()) return false;
    std::vector<ibv_pd*> pds(discovery_.devices.size(), nullptr);
    for (const Port& port : discovery_.ports) {
      const auto d = static_cast<std::size_t>(port.device);
      if (pds[d] == nullptr) {
        errno = 0;
        pds[d] = api_->allocPd(discovery_.devices[d].context);
        if (pds[d] == nullptr) {
          if (error != nullptr) *error = discovery_.devices[d].name + ": ibv_alloc_pd failed: " + std::strerror(errno);
          for (ibv_pd* pd : pds) {
            if (pd != nullptr) api_->deallocPd(pd);
          }
          return false;
        }
      }
      auto device = std::make_unique<Device>();
      device->api = api_;
      device->context = discovery_.devices[d].context;
      device->port = port;
      device->options = options;
      device->log = log;
      device->telemetry = telemetry_;
      device->nic = telemetry_->nic(port.props.name);
      device->bootstrap = interfaces.front().addr;
      device->bootstrapLen = interfaces.front().addrLen;
      devices_.push_back(std::move(device));
    }
    for (auto& device : devices_) device->pd = pds[static_cast<std::size_t>(device->port.device)];
    pds_ = std::move(pds);
    for (auto& device : devices_) {
      if (api_->regDmabufMr != nullptr && dmaBufWorks(device->pd)) device->port.props.ptrSupport |= kPtrDmaBuf;
    }
    return true;
  }

  const char* name() const noexcept override { return "OptiFlow-IB"; }
  int deviceCount() const noexcept override { return static_cast<int>(devices_.size()); }
  const DeviceProps& device(int dev) const noexcept override {
    static const DeviceProps kNone;
    return dev >= 0 && dev < deviceCount() ? devices_[static_cast<std::size_t>(dev)]->port.props : kNone;
  }

  Result listen(int dev, void* handle, std::unique_ptr<ListenComm>* listen) noexcept override {
    if (handle == nullptr || listen == nullptr || dev < 0 || dev >= deviceCount()) {
      if (log_) log_(1, strf("IB: listen: bad arguments (device %d of %d)", dev, deviceCount()));
      return Result::kInvalidArgument;
    }
    Device* device = devices_[static_cast<std::size_t>(dev)].get();
    Fd socket;
    sockaddr_storage addr{};
    const SocketStatus s =
        listenOn(reinterpret_cast<const sockaddr*>(&device->bootstrap), device->bootstrapLen, 64, &socket, &addr);
    if (!s) {
      device->warn(strf("listen on %s: bootstrap socket on %s: %s", device->port.props.name.c_str(),
                        peerText(device->bootstrap).c_str(), s.message().c_str()));
      return Result::kSystemError;
    }
    IbHandle h;
    h.buildId = wire::buildId();
    h.listenId = randomU64();
    h.family = static_cast<std::uint8_t>(addr.ss_family);
    if (addr.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
      h.port = ntohs(in->sin_port);
      std::memcpy(h.addr, &in->sin_addr, 4);
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
      h.port = ntohs(in6->sin6_port);
      std::memcpy(h.addr, &in6->sin6_addr, 16);
    }
    encodeIbHandle(h, static_cast<std::uint8_t*>(handle));
    auto comm = std::unique_ptr<IbListenComm>(new (std::nothrow) IbListenComm(device, std::move(socket), h.listenId));
    if (comm == nullptr) return Result::kSystemError;
    *listen = std::move(comm);
    return Result::kOk;
  }

  Result connect(int dev, const void* handle, std::unique_ptr<Connector>* connector) noexcept override {
    if (handle == nullptr || connector == nullptr || dev < 0 || dev >= deviceCount()) {
      if (log_) log_(1, strf("IB: connect: bad arguments (device %d of %d)", dev, deviceCount()));
      return Result::kInvalidArgument;
    }
    Device* device = devices_[static_cast<std::size_t>(dev)].get();
    IbHandle h;
    std::string why;
    if (!decodeIbHandle(static_cast<const std::uint8_t*>(handle), &h, &why)) {
      device->warn("connect on " + device->port.props.name + ": " + why);
      return Result::kInvalidArgument;
    }
    auto c = std::unique_ptr<IbConnector>(new (std::nothrow) IbConnector(device, h));
    if (c == nullptr) return Result::kSystemError;
    *connector = std::move(c);
    return Result::kOk;
  }

  void setLog(LogFn log) { log_ = std::move(log); }

 private:
  // ibv_reg_dmabuf_mr exists in the library, but the kernel may lack it: a call with fd -1 fails with EBADF when
  // it is there, EOPNOTSUPP / EPROTONOSUPPORT when not.
  bool dmaBufWorks(ibv_pd* pd) const {
    errno = 0;
    ibv_mr* mr = api_->regDmabufMr(pd, 0, 0, 0, -1, 0);
    if (mr != nullptr) {
      api_->deregMr(mr);
      return true;
    }
    return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
  }

  const VerbsApi* api_;
  Discovery discovery_;
  Telemetry* telemetry_;
  LocalTelemetry localTelemetry_;
  std::vector<ibv_pd*> pds_;
  std::vector<std::unique_ptr<Device>> devices_;
  LogFn log_;
};

}  // namespace

std::unique_ptr<Transport> makeIbTransportWith(const VerbsApi* api, const IbOptions& options, LogFn log,
                                               Telemetry* telemetry, const std::string& sysRoot, std::string* error) {
  try {
    Discovery discovery;
    if (!discover(*api, options, sysRoot, &discovery, error)) return nullptr;
    auto transport = std::make_unique<IbTransport>(api, std::move(discovery), telemetry);
    if (!transport->init(options, log, error)) return nullptr;
    transport->setLog(std::move(log));
    return transport;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("RDMA transport: ") + e.what();
    return nullptr;
  }
}

}  // namespace optiflow::net::ib

namespace optiflow::net {

std::unique_ptr<Transport> makeIbTransport(const IbOptions& options, LogFn log, Telemetry* telemetry,
                                           std::string* error) {
  const ib::VerbsApi* api = ib::systemVerbs(error);
  if (api == nullptr) return nullptr;
  return ib::makeIbTransportWith(api, options, std::move(log), telemetry, "/sys", error);
}

}  // namespace optiflow::net
