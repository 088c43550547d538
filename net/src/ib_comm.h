// The RDMA transport's pieces its files share (private to optiflow::net::ib): the control-memory layout, the device
// a comm runs on, memory registrations (ib_memory.cc), endpoints (CQ + QP + control memory, ib_endpoint.cc) and the
// comms of the data path (ib_comm.cc). Devices and connection set-up are ib_transport.cc, the handle and QP-info
// codecs ib_wire.cc. The protocol is described at the top of ib_comm.cc and in docs/net-rdma.md.
#pragma once

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ib_verbs.h"
#include "optiflow/net/socket.h"
#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"

namespace optiflow::net::ib {

inline constexpr int kSendSlots = kMaxRequests * kMaxRecvs;  // isends in flight per send comm
inline constexpr int kRecvWrs = kMaxRequests * kMaxRecvs;    // pre-posted receive WRs: one per possible message
inline constexpr std::uintptr_t kPageBytes = 4096;

// What a work request is, in the top byte of its wr_id; the rest is an index (send slot, FIFO slot, flush).
enum WrKind : std::uint64_t { kWrData = 1, kWrCts = 2, kWrRecv = 3, kWrFlush = 4 };
inline std::uint64_t wrId(WrKind kind, std::uint64_t index) { return (static_cast<std::uint64_t>(kind) << 56) | index; }
inline WrKind wrKind(std::uint64_t id) { return static_cast<WrKind>(id >> 56); }
inline std::uint64_t wrIndex(std::uint64_t id) { return id & ((std::uint64_t{1} << 56) - 1); }

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

// ---- small helpers --------------------------------------------------------------------------------------------------

[[gnu::format(printf, 1, 2)]] inline std::string strf(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

inline bool fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

// A random 64-bit value (listen ids, PSNs), from one engine per process.
std::uint64_t randomU64();

// ---- devices, registrations -----------------------------------------------------------------------------------------

// Registrations are shared per device (one PD per device, so an MR is valid on every comm: regIsGlobal), counted, and
// reused when a later registration lies inside an earlier one.
class RegCache {
 public:
  ibv_mr* acquire(const VerbsApi& api, ibv_pd* pd, std::uintptr_t begin, std::uintptr_t end, int type);
  // true when mr was one of ours.
  bool release(const VerbsApi& api, ibv_mr* mr);
  // Registrations NCCL never released (the PD cannot be freed while they exist).
  void clear(const VerbsApi& api);

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

// regMr / regMrDmaBuf / deregMr of both comm kinds on their device (ib_memory.cc).
Result regMrOn(Device* device, void* data, std::size_t size, int type, MemHandle** mh) noexcept;
Result regDmaBufOn(Device* device, void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                   MemHandle** mh) noexcept;
Result deregOn(Device* device, MemHandle* mh) noexcept;
// The registration of [data, data + size), or null (with a log line) when mh is not ours or does not cover it.
IbMemHandle* checkedHandle(Device* device, const char* what, const void* data, std::size_t size, MemHandle* mh);

// ---- endpoints ------------------------------------------------------------------------------------------------------

// One side of a connection: CQ, RC QP, the registered control memory (sender: CTS FIFO; receiver: CTS sources, size
// table, flush target) and, on a receiver of a GPUDirect device, a loopback QP for flush reads.
class Endpoint {
 public:
  Endpoint(Device* device, Role role) : device_(device), role_(role) {}
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint();

  // CQ, QP (INIT), control memory; a receiver also posts its receive WRs and brings up the flush QP.
  bool create(std::string* error);
  // What the peer needs to reach this side (sent over the bootstrap socket).
  QpInfo localInfo(std::uint64_t listenId) const;
  // RTR then RTS towards the peer's QP.
  bool connect(const QpInfo& remote, std::string* error);
  // One more zero-length receive WR (a write-with-immediate consumes one).
  bool postRecv(std::string* error);

  Device* device() const { return device_; }
  ibv_cq* cq() const { return cq_; }
  ibv_qp* qp() const { return qp_; }
  ibv_qp* flushQp() const { return flushQp_; }
  std::uint32_t lkey() const { return memMr_->lkey; }
  SenderMem* sender() const { return static_cast<SenderMem*>(mem_); }
  ReceiverMem* receiver() const { return static_cast<ReceiverMem*>(mem_); }

 private:
  ibv_qp* createQp(int recvWrs, std::string* error);

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

// ---- comms (ib_comm.cc) ---------------------------------------------------------------------------------------------

// The comms of one connection once both QPs are RTS; they own the endpoint and the bootstrap socket (watched for a
// dead peer). Null when out of memory.
std::unique_ptr<SendComm> makeIbSendComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer,
                                         const QpInfo& remote);
std::unique_ptr<RecvComm> makeIbRecvComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer,
                                         const QpInfo& remote);

}  // namespace optiflow::net::ib
