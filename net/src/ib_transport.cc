// The RDMA verbs transport ("OptiFlow-IB"): one RC queue pair per connection, set up over a TCP bootstrap socket,
// with receiver-driven flow control (docs/net-rdma.md):
// - irecv RDMA-writes one clear-to-send entry per buffer {addr, rkey, size, tag, seq} into the sender's CTS FIFO;
// - isend waits (null request) until the oldest FIFO slot is complete and holds its tag, then RDMA-writes the bytes
//   straight into the receive buffer, followed by an RDMA write-with-immediate of the size into the receiver's size
//   table (imm = the receive's sequence number), which is what completes the receive on the other side.
// Every verbs call goes through a VerbsApi table (ib_verbs.h) so that the tests can run all of this on fake devices.
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <type_traits>

#include "ib_verbs.h"
#include "interfaces.h"
#include "optiflow/net/bytes.h"
#include "optiflow/net/socket.h"
#include "optiflow/net/telemetry.h"
#include "optiflow/net/wire.h"

namespace optiflow::net::ib {
namespace {

constexpr int kSendSlots = kMaxRequests * kMaxRecvs;  // isends in flight per send comm
constexpr int kRecvWrs = kMaxRequests * kMaxRecvs;    // pre-posted receive WRs: one per possible message
constexpr int kSendQueueDepth = 2 * kSendSlots + 8;   // data write + size write per isend
constexpr int kCqDepth = 1024;
constexpr int kConnectTimeoutMs = 30000;
constexpr int kPeerCheckInterval = 128;  // empty polls between looks at the bootstrap socket
constexpr std::uint8_t kReadyByte = 0x5a;
constexpr std::uint32_t kQpInfoMagic = 0x514e464f;  // "OFNQ"
constexpr std::uintptr_t kPageBytes = 4096;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

enum WrKind : std::uint64_t { kWrData = 1, kWrCts = 2, kWrRecv = 3, kWrFlush = 4 };
std::uint64_t wrId(WrKind kind, std::uint64_t index) { return (static_cast<std::uint64_t>(kind) << 56) | index; }
WrKind wrKind(std::uint64_t id) { return static_cast<WrKind>(id >> 56); }
std::uint64_t wrIndex(std::uint64_t id) { return id & ((std::uint64_t{1} << 56) - 1); }

// A clear-to-send entry as it lies in the sender's FIFO. Both ends are the same build (checked at connect), so this is
// a shared record like a shared-memory one; seq is last because the NIC places a write in address order.
struct CtsEntry {
  std::uint64_t addr;
  std::uint32_t rkey;
  std::uint32_t count;  // buffers of this receive: entries 0..count-1 of the slot
  std::uint64_t size;
  std::int32_t tag;
  std::uint32_t seq;  // the receive's sequence number (1, 2, ...): the entry is posted when it shows the expected one
};
static_assert(sizeof(CtsEntry) == 32 && std::is_trivially_copyable_v<CtsEntry>);

struct SenderMem {
  CtsEntry fifo[kMaxRequests][kMaxRecvs];  // remote-written by the receiver
  std::uint32_t sizeOut[kSendSlots];       // source of each isend's size write
};
struct ReceiverMem {
  CtsEntry ctsOut[kMaxRequests][kMaxRecvs];      // source of the CTS writes
  std::uint32_t sizes[kMaxRequests][kMaxRecvs];  // remote-written by the sender
  std::uint8_t flushTarget[64];                  // where the flush read lands
};

// ---- small helpers
// ---------------------------------------------------------------------------------------------------

[[gnu::format(printf, 1, 2)]] std::string strf(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

using bytes::crc32;
using bytes::get16;
using bytes::get32;
using bytes::get64;
using bytes::put16;
using bytes::put32;
using bytes::put64;
bool fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

std::uint64_t randomU64() {
  static std::mutex mutex;
  static std::mt19937_64 engine{
      std::random_device{}() ^ static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::lock_guard lock(mutex);
  return engine();
}

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

// ---- devices, registrations
// ------------------------------------------------------------------------------------------

// Registrations are shared per device (one PD per device, so an MR is valid on every comm: regIsGlobal), counted, and
// reused when a later registration lies inside an earlier one.
class RegCache {
 public:
  ibv_mr* acquire(const VerbsApi& api, ibv_pd* pd, std::uintptr_t begin, std::uintptr_t end, int type) {
    std::lock_guard lock(mutex_);
    for (Entry& e : entries_) {
      if (e.type == type && e.begin <= begin && end <= e.end) {
        ++e.refs;
        return e.mr;
      }
    }
    ibv_mr* mr = api.regMr(pd, reinterpret_cast<void*>(begin), end - begin, kAccess);
    if (mr != nullptr) entries_.push_back({begin, end, type, mr, 1});
    return mr;
  }
  // true when mr was one of ours.
  bool release(const VerbsApi& api, ibv_mr* mr) {
    std::lock_guard lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->mr != mr) continue;
      if (--it->refs == 0) {
        api.deregMr(mr);
        entries_.erase(it);
      }
      return true;
    }
    return false;
  }
  // Registrations NCCL never released (the PD cannot be freed while they exist).
  void clear(const VerbsApi& api) {
    std::lock_guard lock(mutex_);
    for (Entry& e : entries_) api.deregMr(e.mr);
    entries_.clear();
  }

 private:
  struct Entry {
    std::uintptr_t begin, end;
    int type;
    ibv_mr* mr;
    int refs;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

struct Device {
  const VerbsApi* api = nullptr;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  Port port;
  IbOptions options;
  LogFn log;
  Telemetry* telemetry = nullptr;
  NetCounters* nic = nullptr;
  sockaddr_storage bootstrap{};  // where listen binds (port 0)
  socklen_t bootstrapLen = 0;
  RegCache cache;

  void warn(const std::string& message) const {
    if (log) log(1, "IB: " + message);
  }
  bool ethernet() const { return port.attr.link_layer == IBV_LINK_LAYER_ETHERNET; }
};

class IbMemHandle final : public MemHandle {
 public:
  ibv_mr* mr = nullptr;
  int type = kPtrHost;
  bool cached = true;  // false: a DMA-BUF registration, deregistered directly
  std::uintptr_t begin = 0, end = 0;
};

Result regMrOn(Device* device, void* data, std::size_t size, int type, MemHandle** mh) noexcept {
  if (mh == nullptr || data == nullptr) {
    device->warn(strf("regMr on %s: null %s", device->port.props.name.c_str(), mh == nullptr ? "mhandle" : "data"));
    return Result::kInvalidArgument;
  }
  if (type != kPtrHost && type != kPtrCuda) {
    device->warn(
        strf("regMr on %s: pointer type %d is neither host (1) nor CUDA (2)", device->port.props.name.c_str(), type));
    return Result::kInvalidArgument;
  }
  if (type == kPtrCuda && (device->port.props.ptrSupport & kPtrCuda) == 0) {
    device->warn(strf("regMr on %s: CUDA memory %p but GPUDirect RDMA is unavailable (nvidia-peermem not loaded)",
                      device->port.props.name.c_str(), data));
    return Result::kInvalidUsage;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = address & ~(kPageBytes - 1);
  const std::uintptr_t end = (address + std::max<std::size_t>(size, 1) + kPageBytes - 1) & ~(kPageBytes - 1);
  errno = 0;
  ibv_mr* mr = device->cache.acquire(*device->api, device->pd, begin, end, type);
  if (mr == nullptr) {
    device->warn(strf("ibv_reg_mr on %s failed for %zu bytes at %p (%s memory): %s", device->port.props.name.c_str(),
                      size, data, type == kPtrCuda ? "CUDA" : "host", std::strerror(errno)));
    return Result::kSystemError;
  }
  auto* handle = new (std::nothrow) IbMemHandle;
  if (handle == nullptr) {
    device->cache.release(*device->api, mr);
    return Result::kSystemError;
  }
  handle->mr = mr;
  handle->type = type;
  handle->begin = begin;
  handle->end = end;
  *mh = handle;
  return Result::kOk;
}

Result regDmaBufOn(Device* device, void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                   MemHandle** mh) noexcept {
  if (mh == nullptr) return Result::kInvalidArgument;
  if (device->api->regDmabufMr == nullptr || (device->port.props.ptrSupport & kPtrDmaBuf) == 0) {
    device->warn(strf("regMrDmaBuf on %s: DMA-BUF registration is not supported here (ibv_reg_dmabuf_mr %s)",
                      device->port.props.name.c_str(),
                      device->api->regDmabufMr == nullptr ? "missing in libibverbs" : "refused by the kernel"));
    return Result::kInvalidUsage;
  }
  errno = 0;
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  ibv_mr* mr = device->api->regDmabufMr(device->pd, offset, size, address, fd, kAccess);
  if (mr == nullptr) {
    device->warn(strf("ibv_reg_dmabuf_mr on %s failed for %zu bytes at %p (fd %d, offset %llu): %s",
                      device->port.props.name.c_str(), size, data, fd, static_cast<unsigned long long>(offset),
                      std::strerror(errno)));
    return Result::kSystemError;
  }
  auto* handle = new (std::nothrow) IbMemHandle;
  if (handle == nullptr) {
    device->api->deregMr(mr);
    return Result::kSystemError;
  }
  handle->mr = mr;
  handle->type = type == kPtrHost ? kPtrHost : kPtrCuda;
  handle->cached = false;
  handle->begin = address;
  handle->end = address + size;
  *mh = handle;
  return Result::kOk;
}

Result deregOn(Device* device, MemHandle* mh) noexcept {
  auto* handle = dynamic_cast<IbMemHandle*>(mh);
  if (handle == nullptr) {
    device->warn(strf("deregMr on %s: %p is not a memory handle of this transport", device->port.props.name.c_str(),
                      static_cast<void*>(mh)));
    return Result::kInvalidArgument;
  }
  if (handle->cached) {
    device->cache.release(*device->api, handle->mr);
  } else {
    device->api->deregMr(handle->mr);
  }
  delete handle;
  return Result::kOk;
}

// The registration of [data, data + size), or null (with a log line) when mh is not ours or does not cover it.
IbMemHandle* checkedHandle(Device* device, const char* what, const void* data, std::size_t size, MemHandle* mh) {
  auto* handle = dynamic_cast<IbMemHandle*>(mh);
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  if (handle == nullptr || begin < handle->begin || begin + size > handle->end || begin + size < begin) {
    device->warn(strf("%s on %s: buffer %p + %zu bytes is not inside its registration (%s)", what,
                      device->port.props.name.c_str(), data, size, handle == nullptr ? "no handle" : "out of range"));
    return nullptr;
  }
  return handle;
}

// ---- queue pairs
// -----------------------------------------------------------------------------------------------------

bool toInit(Device* device, ibv_qp* qp, std::string* error) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = static_cast<std::uint8_t>(device->port.port);
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const int rc = device->api->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return fail(error, strf("ibv_modify_qp(INIT) failed: %s", std::strerror(rc)));
  return true;
}

bool toRts(Device* device, ibv_qp* qp, const QpInfo& remote, std::uint32_t localPsn, std::string* error) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(device->port.attr.active_mtu, remote.mtu));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = static_cast<std::uint8_t>(device->port.port);
  attr.ah_attr.sl = 0;
  if (device->ethernet()) {
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
    attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(device->port.gidIndex);
    attr.ah_attr.grh.hop_limit = 255;
    attr.ah_attr.grh.traffic_class = static_cast<std::uint8_t>(device->options.trafficClass);
  } else {
    attr.ah_attr.is_global = 0;
    attr.ah_attr.dlid = remote.lid;
  }
  int rc = device->api->modifyQp(qp, &attr,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0)
    return fail(error, strf("ibv_modify_qp(RTR, remote qpn 0x%x) failed: %s", remote.qpn, std::strerror(rc)));
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.sq_psn = localPsn;
  attr.max_rd_atomic = 1;
  rc = device->api->modifyQp(
      qp, &attr,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return fail(error, strf("ibv_modify_qp(RTS) failed: %s", std::strerror(rc)));
  return true;
}

// One side of a connection: CQ, RC QP, the registered control memory (sender: CTS FIFO; receiver: CTS sources, size
// table, flush target) and, on a receiver of a GPUDirect device, a loopback QP for flush reads.
class Endpoint {
 public:
  Endpoint(Device* device, Role role) : device_(device), role_(role) {}
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() {
    const VerbsApi& api = *device_->api;
    if (flushQp_ != nullptr) api.destroyQp(flushQp_);
    if (qp_ != nullptr) api.destroyQp(qp_);
    if (cq_ != nullptr) api.destroyCq(cq_);
    if (memMr_ != nullptr) api.deregMr(memMr_);
    std::free(mem_);
  }

  bool create(std::string* error) {
    const VerbsApi& api = *device_->api;
    memBytes_ = role_ == Role::kSender ? sizeof(SenderMem) : sizeof(ReceiverMem);
    memBytes_ = (memBytes_ + kPageBytes - 1) & ~(kPageBytes - 1);
    mem_ = std::aligned_alloc(kPageBytes, memBytes_);
    if (mem_ == nullptr) return fail(error, "out of memory for the connection's control buffers");
    std::memset(mem_, 0, memBytes_);
    errno = 0;
    memMr_ = api.regMr(device_->pd, mem_, memBytes_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (memMr_ == nullptr)
      return fail(error, strf("ibv_reg_mr(control, %zu bytes) failed: %s", memBytes_, std::strerror(errno)));
    errno = 0;
    cq_ = api.createCq(device_->context, kCqDepth, nullptr, nullptr, 0);
    if (cq_ == nullptr) return fail(error, strf("ibv_create_cq(%d) failed: %s", kCqDepth, std::strerror(errno)));
    qp_ = createQp(role_ == Role::kReceiver ? kRecvWrs : 1, error);
    if (qp_ == nullptr || !toInit(device_, qp_, error)) return false;
    psn_ = static_cast<std::uint32_t>(randomU64() & 0xffffff);
    if (role_ == Role::kReceiver) {
      for (int i = 0; i < kRecvWrs; ++i) {
        if (!postRecv(error)) return false;
      }
      if ((device_->port.props.ptrSupport & kPtrCuda) != 0) {
        flushQp_ = createQp(1, error);
        if (flushQp_ == nullptr || !toInit(device_, flushQp_, error)) return false;
        QpInfo self = localInfo(0);
        self.qpn = flushQp_->qp_num;
        if (!toRts(device_, flushQp_, self, self.psn, error)) return false;
      }
    }
    return true;
  }

  QpInfo localInfo(std::uint64_t listenId) const {
    QpInfo info;
    info.role = role_;
    info.linkLayer = device_->port.attr.link_layer;
    info.buildId = wire::buildId();
    info.listenId = listenId;
    info.qpn = qp_->qp_num;
    info.psn = psn_;
    info.lid = device_->port.attr.lid;
    info.mtu = static_cast<std::uint8_t>(device_->port.attr.active_mtu);
    std::memcpy(info.gid, device_->port.gid.raw, 16);
    info.memAddr = role_ == Role::kSender ? reinterpret_cast<std::uintptr_t>(sender()->fifo)
                                          : reinterpret_cast<std::uintptr_t>(receiver()->sizes);
    info.memRkey = memMr_->rkey;
    return info;
  }

  bool connect(const QpInfo& remote, std::string* error) {
    const bool remoteEthernet = remote.linkLayer == IBV_LINK_LAYER_ETHERNET;
    if (remoteEthernet != device_->ethernet()) {
      return fail(error, strf("link layer mismatch: %s is %s, the peer's port is %s", device_->port.props.name.c_str(),
                              device_->ethernet() ? "Ethernet (RoCE)" : "InfiniBand",
                              remoteEthernet ? "Ethernet (RoCE)" : "InfiniBand"));
    }
    return toRts(device_, qp_, remote, psn_, error);
  }

  bool postRecv(std::string* error) {
    ibv_recv_wr wr{};
    wr.wr_id = wrId(kWrRecv, 0);
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    const int rc = device_->api->postRecv(qp_, &wr, &bad);
    if (rc != 0) return fail(error, strf("ibv_post_recv failed: %s", std::strerror(rc)));
    return true;
  }

  Device* device() const { return device_; }
  ibv_cq* cq() const { return cq_; }
  ibv_qp* qp() const { return qp_; }
  ibv_qp* flushQp() const { return flushQp_; }
  std::uint32_t lkey() const { return memMr_->lkey; }
  SenderMem* sender() const { return static_cast<SenderMem*>(mem_); }
  ReceiverMem* receiver() const { return static_cast<ReceiverMem*>(mem_); }

 private:
  ibv_qp* createQp(int recvWrs, std::string* error) {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = kSendQueueDepth;
    init.cap.max_recv_wr = static_cast<std::uint32_t>(recvWrs);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    errno = 0;
    ibv_qp* qp = device_->api->createQp(device_->pd, &init);
    if (qp == nullptr) fail(error, strf("ibv_create_qp(RC) failed: %s", std::strerror(errno)));
    return qp;
  }

  Device* device_;
  Role role_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_qp* flushQp_ = nullptr;
  void* mem_ = nullptr;
  std::size_t memBytes_ = 0;
  ibv_mr* memMr_ = nullptr;
  std::uint32_t psn_ = 0;
};

// State shared by both comm kinds: the endpoint, the bootstrap socket (watched for a dead peer), the failure latch.
class Link {
 public:
  Link(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer)
      : endpoint_(std::move(endpoint)), socket_(std::move(socket)), peer_(std::move(peer)) {
    Device* device = endpoint_->device();
    peerCounters_ = device->telemetry->peer(peer_);
  }

  // Latches the first failure and logs it once; every later call returns the same result.
  Result fail(Result result, const std::string& message) {
    if (failed_ == Result::kOk) {
      failed_ = result;
      endpoint_->device()->warn(message);
    }
    return failed_;
  }
  Result failed() const { return failed_; }

  // A request is pending and nothing completed: look at the bootstrap socket now and then, since a dead peer never
  // sends the completion we wait for.
  Result idle(const char* side) {
    if (++emptyPolls_ < kPeerCheckInterval) return Result::kOk;
    emptyPolls_ = 0;
    std::uint8_t byte = 0;
    const ssize_t n = ::recv(socket_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return fail(Result::kRemoteError, strf("%s: peer %s closed the connection", side, peer_.c_str()));
    if (n > 0) {
      return fail(Result::kRemoteError,
                  strf("%s: peer %s sent unexpected bytes on the bootstrap socket", side, peer_.c_str()));
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return fail(Result::kRemoteError,
                  strf("%s: connection to peer %s failed: %s", side, peer_.c_str(), std::strerror(errno)));
    }
    return Result::kOk;
  }
  void busy() { emptyPolls_ = 0; }

  Result completionError(const ibv_wc& wc, const char* side) {
    const char* status = endpoint_->device()->api->wcStatusStr(wc.status);
    return fail(Result::kRemoteError,
                strf("%s: completion error '%s' (status %d, vendor error 0x%x, %s) with peer %s on %s", side,
                     status != nullptr ? status : "?", static_cast<int>(wc.status), wc.vendor_err,
                     wrKind(wc.wr_id) == kWrData    ? "data write"
                     : wrKind(wc.wr_id) == kWrCts   ? "clear-to-send write"
                     : wrKind(wc.wr_id) == kWrFlush ? "flush read"
                                                    : "receive",
                     peer_.c_str(), endpoint_->device()->port.props.name.c_str()));
  }

  Endpoint* endpoint() const { return endpoint_.get(); }
  Device* device() const { return endpoint_->device(); }
  const std::string& peer() const { return peer_; }
  NetCounters* peerCounters() const { return peerCounters_; }

 private:
  std::unique_ptr<Endpoint> endpoint_;
  Fd socket_;
  std::string peer_;
  NetCounters* peerCounters_ = nullptr;
  Result failed_ = Result::kOk;
  int emptyPolls_ = 0;
};

// ---- send comm
// -------------------------------------------------------------------------------------------------------

class IbSendComm final : public SendComm {
 public:
  IbSendComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer, const QpInfo& remote)
      : link_(std::move(endpoint), std::move(socket), std::move(peer)),
        sizesAddr_(remote.memAddr),
        sizesRkey_(remote.memRkey) {
    for (int i = 0; i < kSendSlots; ++i) reqs_[static_cast<std::size_t>(i)].index = i;
  }

  Result isend(const void* data, std::size_t size, int tag, MemHandle* mh, Request** request) noexcept override {
    if (request == nullptr) return Result::kInvalidArgument;
    *request = nullptr;
    if (link_.failed() != Result::kOk) return link_.failed();
    if (size > kMaxMessageBytes) {
      return link_.fail(Result::kInvalidUsage,
                        strf("isend to %s: %zu bytes > %zu", link_.peer().c_str(), size, kMaxMessageBytes));
    }
    IbMemHandle* handle = nullptr;
    if (size > 0) {
      handle = checkedHandle(link_.device(), "isend", data, size, mh);
      if (handle == nullptr) return Result::kInvalidArgument;
    }
    // The oldest FIFO slot must be complete (every entry shows its sequence number) and hold a buffer for this tag.
    const auto slot = static_cast<std::size_t>(consumed_ % kMaxRequests);
    const auto expected = static_cast<std::uint32_t>(consumed_ + 1);
    CtsEntry* entries = link_.endpoint()->sender()->fifo[slot];
    if (std::atomic_ref<std::uint32_t>(entries[0].seq).load(std::memory_order_acquire) != expected) {
      return Result::kOk;
    }
    const std::uint32_t count = entries[0].count;
    if (count < 1 || count > static_cast<std::uint32_t>(kMaxRecvs)) {
      return link_.fail(Result::kRemoteError, strf("isend to %s: corrupt clear-to-send entry (%u buffers, at most %d)",
                                                   link_.peer().c_str(), count, kMaxRecvs));
    }
    for (std::uint32_t r = 1; r < count; ++r) {
      if (std::atomic_ref<std::uint32_t>(entries[r].seq).load(std::memory_order_acquire) != expected) {
        return Result::kOk;
      }
    }
    std::uint32_t match = count;
    for (std::uint32_t r = 0; r < count; ++r) {
      if (!used_[r] && entries[r].tag == tag) {
        match = r;
        break;
      }
    }
    if (match == count) return Result::kOk;  // the oldest receive does not (yet) want this tag
    const CtsEntry entry = entries[match];
    if (size > entry.size) {
      return link_.fail(Result::kInvalidUsage,
                        strf("isend to %s: message of %zu bytes (tag %d) is larger than the receive buffer of %llu "
                             "bytes the peer posted",
                             link_.peer().c_str(), size, tag, static_cast<unsigned long long>(entry.size)));
    }
    SendReq* req = nullptr;
    for (SendReq& r : reqs_) {
      if (!r.used) {
        req = &r;
        break;
      }
    }
    if (req == nullptr) return Result::kOk;

    Endpoint* ep = link_.endpoint();
    ep->sender()->sizeOut[req->index] = static_cast<std::uint32_t>(size);
    ibv_sge dataSge{};
    ibv_sge sizeSge{};
    ibv_send_wr wrs[2]{};
    ibv_send_wr* first = &wrs[1];
    if (size > 0) {
      dataSge.addr = reinterpret_cast<std::uintptr_t>(data);
      dataSge.length = static_cast<std::uint32_t>(size);
      dataSge.lkey = handle->mr->lkey;
      wrs[0].wr_id = wrId(kWrData, static_cast<std::uint64_t>(req->index));
      wrs[0].sg_list = &dataSge;
      wrs[0].num_sge = 1;
      wrs[0].opcode = IBV_WR_RDMA_WRITE;
      wrs[0].wr.rdma.remote_addr = entry.addr;
      wrs[0].wr.rdma.rkey = entry.rkey;
      wrs[0].next = &wrs[1];
      first = &wrs[0];
    }
    sizeSge.addr = reinterpret_cast<std::uintptr_t>(&ep->sender()->sizeOut[req->index]);
    sizeSge.length = sizeof(std::uint32_t);
    sizeSge.lkey = ep->lkey();
    wrs[1].wr_id = wrId(kWrData, static_cast<std::uint64_t>(req->index));
    wrs[1].sg_list = &sizeSge;
    wrs[1].num_sge = 1;
    wrs[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wrs[1].send_flags = IBV_SEND_SIGNALED;
    wrs[1].imm_data = htobe32(expected);
    wrs[1].wr.rdma.remote_addr = sizesAddr_ + (slot * kMaxRecvs + match) * sizeof(std::uint32_t);
    wrs[1].wr.rdma.rkey = sizesRkey_;
    ibv_send_wr* bad = nullptr;
    const int rc = link_.device()->api->postSend(ep->qp(), first, &bad);
    if (rc != 0) {
      return link_.fail(Result::kSystemError,
                        strf("isend to %s: ibv_post_send failed: %s", link_.peer().c_str(), std::strerror(rc)));
    }
    req->used = true;
    req->done = false;
    req->size = size;
    used_[match] = true;
    if (++usedCount_ == count) {
      used_.fill(false);
      usedCount_ = 0;
      ++consumed_;
    }
    *request = req;
    return Result::kOk;
  }

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept override {
    return regMrOn(link_.device(), data, size, type, mh);
  }
  Result regMrDmaBuf(void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                     MemHandle** mh) noexcept override {
    return regDmaBufOn(link_.device(), data, size, type, offset, fd, mh);
  }
  Result deregMr(MemHandle* mh) noexcept override { return deregOn(link_.device(), mh); }

  Result test(Request* request, int* done, int* sizes) noexcept override {
    if (done == nullptr) return Result::kInvalidArgument;
    *done = 0;
    auto* req = dynamic_cast<SendReq*>(request);
    if (req == nullptr || req < reqs_.data() || req >= reqs_.data() + reqs_.size() || !req->used) {
      link_.device()->warn(strf("test on a send comm to %s: %p is not a pending request of it", link_.peer().c_str(),
                                static_cast<void*>(request)));
      return Result::kInvalidArgument;
    }
    if (!req->done) {
      const Result r = progress();
      if (r != Result::kOk) return r;
    }
    if (!req->done) return link_.idle("isend");
    *done = 1;
    if (sizes != nullptr) sizes[0] = static_cast<int>(req->size);
    req->used = false;
    return Result::kOk;
  }

 private:
  struct SendReq final : Request {
    int index = 0;
    bool used = false;
    bool done = false;
    std::size_t size = 0;
  };

  Result progress() {
    if (link_.failed() != Result::kOk) return link_.failed();
    ibv_wc wcs[16];
    const int n = link_.device()->api->pollCq(link_.endpoint()->cq(), 16, wcs);
    if (n < 0) {
      return link_.fail(Result::kSystemError, strf("ibv_poll_cq (send to %s) failed: %d", link_.peer().c_str(), n));
    }
    if (n > 0) link_.busy();
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) return link_.completionError(wc, "isend");
      const std::uint64_t index = wrIndex(wc.wr_id);
      if (wrKind(wc.wr_id) != kWrData || index >= static_cast<std::uint64_t>(kSendSlots)) {
        return link_.fail(Result::kInternalError,
                          strf("send comm to %s: unexpected completion wr_id 0x%llx", link_.peer().c_str(),
                               static_cast<unsigned long long>(wc.wr_id)));
      }
      SendReq& req = reqs_[index];
      req.done = true;
      countSent(link_.peerCounters(), req.size);
      countSent(link_.device()->nic, req.size);
    }
    return Result::kOk;
  }

  Link link_;
  std::uint64_t sizesAddr_;
  std::uint32_t sizesRkey_;
  std::array<SendReq, kSendSlots> reqs_;
  std::uint64_t consumed_ = 0;  // FIFO slots fully sent
  std::array<bool, kMaxRecvs> used_{};
  std::uint32_t usedCount_ = 0;
};

// ---- receive comm
// ----------------------------------------------------------------------------------------------------

class IbRecvComm final : public RecvComm {
 public:
  IbRecvComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer, const QpInfo& remote)
      : link_(std::move(endpoint), std::move(socket), std::move(peer)),
        fifoAddr_(remote.memAddr),
        fifoRkey_(remote.memRkey) {}

  Result irecv(int n, void** data, const std::size_t* sizes, const int* tags, MemHandle** mhs,
               Request** request) noexcept override {
    if (request == nullptr) return Result::kInvalidArgument;
    *request = nullptr;
    if (link_.failed() != Result::kOk) return link_.failed();
    if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr || mhs == nullptr) {
      link_.device()->warn(
          strf("irecv from %s: %d buffers (1..%d) or null arrays", link_.peer().c_str(), n, kMaxRecvs));
      return Result::kInvalidUsage;
    }
    const auto slot = static_cast<std::size_t>(posted_ % kMaxRequests);
    RecvReq& req = reqs_[slot];
    if (req.used) return Result::kOk;  // kMaxRequests receives in flight
    const auto seq = static_cast<std::uint32_t>(posted_ + 1);
    Endpoint* ep = link_.endpoint();
    CtsEntry* out = ep->receiver()->ctsOut[slot];
    for (int i = 0; i < n; ++i) {
      IbMemHandle* handle = nullptr;
      if (sizes[i] > 0) {
        handle = checkedHandle(link_.device(), "irecv", data[i], sizes[i], mhs[i]);
        if (handle == nullptr) return Result::kInvalidArgument;
      }
      out[i].addr = reinterpret_cast<std::uintptr_t>(data[i]);
      out[i].rkey = handle != nullptr ? handle->mr->rkey : 0;
      out[i].count = static_cast<std::uint32_t>(n);
      out[i].size = sizes[i];
      out[i].tag = tags[i];
      out[i].seq = seq;
      req.posted[static_cast<std::size_t>(i)] = sizes[i];
    }
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uintptr_t>(out);
    sge.length = static_cast<std::uint32_t>(sizeof(CtsEntry) * static_cast<std::size_t>(n));
    sge.lkey = ep->lkey();
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrCts, slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = fifoAddr_ + slot * kMaxRecvs * sizeof(CtsEntry);
    wr.wr.rdma.rkey = fifoRkey_;
    ibv_send_wr* bad = nullptr;
    const int rc = link_.device()->api->postSend(ep->qp(), &wr, &bad);
    if (rc != 0) {
      return link_.fail(Result::kSystemError, strf("irecv from %s: ibv_post_send(clear-to-send) failed: %s",
                                                   link_.peer().c_str(), std::strerror(rc)));
    }
    req.used = true;
    req.n = n;
    req.arrived = 0;
    req.seq = seq;
    ++posted_;
    *request = &req;
    return Result::kOk;
  }

  Result iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) noexcept override {
    if (request == nullptr) return Result::kInvalidArgument;
    *request = nullptr;
    if (link_.failed() != Result::kOk) return link_.failed();
    Endpoint* ep = link_.endpoint();
    if (ep->flushQp() == nullptr || n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || mhs == nullptr) {
      return Result::kOk;  // no GPUDirect: nothing was written to GPU memory by the NIC
    }
    int target = -1;
    for (int i = 0; i < n; ++i) {
      auto* handle = dynamic_cast<IbMemHandle*>(mhs[i]);
      if (handle != nullptr && handle->type == kPtrCuda && sizes[i] > 0) target = i;
    }
    if (target < 0) return Result::kOk;
    FlushReq* req = nullptr;
    for (FlushReq& f : flushes_) {
      if (!f.used) {
        req = &f;
        break;
      }
    }
    if (req == nullptr) return Result::kOk;
    auto* handle = static_cast<IbMemHandle*>(mhs[target]);
    // A 1-byte RDMA read of the received buffer through the NIC: it completes only after the NIC's earlier writes
    // to GPU memory are visible (PCIe ordering), which is what GPUDirect RDMA needs before the kernel reads them.
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uintptr_t>(ep->receiver()->flushTarget);
    sge.length = 1;
    sge.lkey = ep->lkey();
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrFlush, static_cast<std::uint64_t>(req - flushes_.data()));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(data[target]);
    wr.wr.rdma.rkey = handle->mr->rkey;
    ibv_send_wr* bad = nullptr;
    const int rc = link_.device()->api->postSend(ep->flushQp(), &wr, &bad);
    if (rc != 0) {
      return link_.fail(Result::kSystemError, strf("iflush (from %s): ibv_post_send(read) failed: %s",
                                                   link_.peer().c_str(), std::strerror(rc)));
    }
    req->used = true;
    req->done = false;
    *request = req;
    return Result::kOk;
  }

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept override {
    return regMrOn(link_.device(), data, size, type, mh);
  }
  Result regMrDmaBuf(void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                     MemHandle** mh) noexcept override {
    return regDmaBufOn(link_.device(), data, size, type, offset, fd, mh);
  }
  Result deregMr(MemHandle* mh) noexcept override { return deregOn(link_.device(), mh); }

  Result test(Request* request, int* done, int* sizes) noexcept override {
    if (done == nullptr) return Result::kInvalidArgument;
    *done = 0;
    if (auto* flush = dynamic_cast<FlushReq*>(request);
        flush != nullptr && flush >= flushes_.data() && flush < flushes_.data() + flushes_.size() && flush->used) {
      if (!flush->done) {
        const Result r = progress();
        if (r != Result::kOk) return r;
      }
      if (!flush->done) return link_.idle("iflush");
      flush->used = false;
      *done = 1;
      return Result::kOk;
    }
    auto* req = dynamic_cast<RecvReq*>(request);
    if (req == nullptr || req < reqs_.data() || req >= reqs_.data() + reqs_.size() || !req->used) {
      link_.device()->warn(strf("test on a receive comm from %s: %p is not a pending request of it",
                                link_.peer().c_str(), static_cast<void*>(request)));
      return Result::kInvalidArgument;
    }
    if (req->arrived < req->n) {
      const Result r = progress();
      if (r != Result::kOk) return r;
    }
    if (req->arrived < req->n) return link_.idle("irecv");
    const auto slot = static_cast<std::size_t>(req - reqs_.data());
    const std::uint32_t* written = link_.endpoint()->receiver()->sizes[slot];
    for (int i = 0; i < req->n; ++i) {
      const std::uint32_t bytes = std::atomic_ref<const std::uint32_t>(written[i]).load(std::memory_order_acquire);
      if (bytes > req->posted[static_cast<std::size_t>(i)]) {
        return link_.fail(Result::kRemoteError,
                          strf("irecv from %s: peer reports %u bytes in buffer %d of %llu bytes", link_.peer().c_str(),
                               bytes, i, static_cast<unsigned long long>(req->posted[static_cast<std::size_t>(i)])));
      }
      if (sizes != nullptr) sizes[i] = static_cast<int>(bytes);
      countRecv(link_.peerCounters(), bytes);
      countRecv(link_.device()->nic, bytes);
    }
    req->used = false;
    *done = 1;
    return Result::kOk;
  }

 private:
  struct RecvReq final : Request {
    bool used = false;
    int n = 0;
    int arrived = 0;
    std::uint32_t seq = 0;
    std::array<std::size_t, kMaxRecvs> posted{};
  };
  struct FlushReq final : Request {
    bool used = false;
    bool done = false;
  };

  Result progress() {
    if (link_.failed() != Result::kOk) return link_.failed();
    ibv_wc wcs[16];
    const int n = link_.device()->api->pollCq(link_.endpoint()->cq(), 16, wcs);
    if (n < 0) {
      return link_.fail(Result::kSystemError,
                        strf("ibv_poll_cq (receive from %s) failed: %d", link_.peer().c_str(), n));
    }
    if (n > 0) link_.busy();
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) return link_.completionError(wc, "irecv");
      switch (wrKind(wc.wr_id)) {
        case kWrCts:
          break;
        case kWrFlush: {
          const std::uint64_t index = wrIndex(wc.wr_id);
          if (index < flushes_.size()) flushes_[index].done = true;
          break;
        }
        case kWrRecv: {
          const std::uint32_t seq = be32toh(wc.imm_data);
          RecvReq& req = reqs_[static_cast<std::size_t>((seq - 1) % kMaxRequests)];
          if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0 || !req.used || req.seq != seq || req.arrived >= req.n) {
            return link_.fail(Result::kRemoteError,
                              strf("irecv from %s: a message for receive #%u arrived, which is not pending",
                                   link_.peer().c_str(), seq));
          }
          ++req.arrived;
          std::string error;
          if (!link_.endpoint()->postRecv(&error)) {
            return link_.fail(Result::kSystemError, "irecv from " + link_.peer() + ": " + error);
          }
          break;
        }
        default:
          return link_.fail(Result::kInternalError,
                            strf("receive comm from %s: unexpected completion wr_id 0x%llx", link_.peer().c_str(),
                                 static_cast<unsigned long long>(wc.wr_id)));
      }
    }
    return Result::kOk;
  }

  Link link_;
  std::uint64_t fifoAddr_;
  std::uint32_t fifoRkey_;
  std::array<RecvReq, kMaxRequests> reqs_;  // slot = (seq - 1) % kMaxRequests
  std::array<FlushReq, kMaxRequests> flushes_;
  std::uint64_t posted_ = 0;
};

// ---- connection setup
// ------------------------------------------------------------------------------------------------

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
    auto comm = std::unique_ptr<IbRecvComm>(new (std::nothrow)
                                                IbRecvComm(std::move(endpoint_), std::move(socket_), peer_, remote_));
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
    auto comm = std::unique_ptr<IbSendComm>(new (std::nothrow)
                                                IbSendComm(std::move(endpoint_), std::move(socket_), peer_, remote_));
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

// ---- transport
// -------------------------------------------------------------------------------------------------------

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

// ---- codecs
// ----------------------------------------------------------------------------------------------------------

void encodeIbHandle(const IbHandle& handle, std::uint8_t* out) {
  std::memset(out, 0, kHandleBytes);
  put32(out, wire::kHandleMagic);
  put16(out + 4, wire::kWireVersion);
  out[6] = static_cast<std::uint8_t>(wire::TransportKind::kIb);
  out[7] = handle.family;
  put64(out + 8, handle.buildId);
  put64(out + 16, handle.listenId);
  out[24] = static_cast<std::uint8_t>(handle.port >> 8);  // network order
  out[25] = static_cast<std::uint8_t>(handle.port);
  std::memcpy(out + 28, handle.addr, 16);
  put32(out + 44, crc32(out, 44));
}

bool decodeIbHandle(const std::uint8_t* in, IbHandle* out, std::string* error) {
  const std::uint32_t magic = get32(in);
  if (magic != wire::kHandleMagic) return fail(error, strf("handle magic 0x%x is not an OptiFlow net handle", magic));
  const std::uint16_t version = get16(in + 4);
  if (version != wire::kWireVersion) {
    return fail(error, strf("handle from another build (wire version %u, expected %u)", version, wire::kWireVersion));
  }
  if (in[6] != static_cast<std::uint8_t>(wire::TransportKind::kIb)) {
    return fail(error, strf("handle is for transport kind %u, not IB (2)", in[6]));
  }
  if (get32(in + 44) != crc32(in, 44)) return fail(error, "IB handle has a bad checksum");
  IbHandle h;
  h.family = in[7];
  h.buildId = get64(in + 8);
  h.listenId = get64(in + 16);
  h.port = static_cast<std::uint16_t>((in[24] << 8) | in[25]);
  std::memcpy(h.addr, in + 28, 16);
  if (h.buildId != wire::buildId()) {
    return fail(error,
                strf("handle from another build (build id 0x%llx, this build 0x%llx)",
                     static_cast<unsigned long long>(h.buildId), static_cast<unsigned long long>(wire::buildId())));
  }
  if (h.family != AF_INET && h.family != AF_INET6) return fail(error, strf("IB handle address family %u", h.family));
  if (h.port == 0) return fail(error, "IB handle has port 0");
  *out = h;
  return true;
}

void encodeQpInfo(const QpInfo& info, std::uint8_t* out) {
  std::memset(out, 0, kQpInfoBytes);
  put32(out, kQpInfoMagic);
  put16(out + 4, wire::kWireVersion);
  out[6] = static_cast<std::uint8_t>(info.role);
  out[7] = info.linkLayer;
  put64(out + 8, info.buildId);
  put64(out + 16, info.listenId);
  put32(out + 24, info.qpn);
  put32(out + 28, info.psn);
  put16(out + 32, info.lid);
  out[34] = info.mtu;
  std::memcpy(out + 36, info.gid, 16);
  put64(out + 52, info.memAddr);
  put32(out + 60, info.memRkey);
  put32(out + 68, crc32(out, 68));
}

bool decodeQpInfo(const std::uint8_t* in, QpInfo* out, std::string* error) {
  const std::uint32_t magic = get32(in);
  if (magic != kQpInfoMagic)
    return fail(error, strf("QP info magic 0x%x is not OptiFlow's (0x%x)", magic, kQpInfoMagic));
  if (get32(in + 68) != crc32(in, 68)) return fail(error, "QP info has a bad checksum");
  const std::uint16_t version = get16(in + 4);
  if (version != wire::kWireVersion) {
    return fail(error, strf("QP info from another build (wire version %u, expected %u)", version, wire::kWireVersion));
  }
  QpInfo info;
  info.buildId = get64(in + 8);
  if (info.buildId != wire::buildId()) {
    return fail(error,
                strf("QP info from another build (build id 0x%llx, this build 0x%llx)",
                     static_cast<unsigned long long>(info.buildId), static_cast<unsigned long long>(wire::buildId())));
  }
  if (in[6] != static_cast<std::uint8_t>(Role::kSender) && in[6] != static_cast<std::uint8_t>(Role::kReceiver)) {
    return fail(error, strf("QP info role %u (expected 1 sender or 2 receiver)", in[6]));
  }
  info.role = static_cast<Role>(in[6]);
  info.linkLayer = in[7];
  info.listenId = get64(in + 16);
  info.qpn = get32(in + 24);
  info.psn = get32(in + 28);
  info.lid = get16(in + 32);
  info.mtu = in[34];
  std::memcpy(info.gid, in + 36, 16);
  info.memAddr = get64(in + 52);
  info.memRkey = get32(in + 60);
  if (info.qpn > 0xffffff || info.psn > 0xffffff) {
    return fail(error, strf("QP info: qpn 0x%x or psn 0x%x exceeds 24 bits", info.qpn, info.psn));
  }
  if (info.mtu < IBV_MTU_256 || info.mtu > IBV_MTU_4096) return fail(error, strf("QP info: MTU code %u", info.mtu));
  if (info.memAddr == 0) return fail(error, "QP info: null control-memory address");
  *out = info;
  return true;
}

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
