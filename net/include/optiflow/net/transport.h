// The transport interface the net plugin's ABI layer drives (plugin/src/net_*.cc). One Transport per kind of network
// (TCP sockets, RDMA verbs); the plugin picks one at init (OPTIFLOW_NET_TRANSPORT, RDMA when devices exist, else
// TCP). Semantics follow what NCCL's proxy expects of a net plugin (NCCL 2.24-2.30, src/include/plugin/net/net_v*.h
// and the proxy's use of them in src/transport/net.cc):
// - listen writes at most kHandleBytes into the handle and never blocks; connect and accept never block and return
//   kOk with a null comm while the connection is in progress (the caller calls again).
// - isend/irecv return kOk with a null request when they cannot post now (kMaxRequests in flight); the caller retries.
// - A request is polled with test until done; then it is dead. Receives are grouped (n <= kMaxRecvs buffers, one
//   request): a message is matched to the oldest posted receive that still has an unmatched buffer, by tag.
// - Every call is noexcept and reports failures as a Result plus one log line naming the peer and what was found;
//   a failed connection stays failed (every later call on it returns the same error), it never hangs or crashes.
// Threads: one comm is used by one thread at a time (NCCL's proxy thread); different comms may be used concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace optiflow::net {

inline constexpr std::size_t kHandleBytes = 128;                       // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxRequests = 32;                                // per comm (NCCL_NET_MAX_REQUESTS)
inline constexpr int kMaxRecvs = 8;                                    // buffers per grouped receive
inline constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;  // maxP2pBytes: NCCL splits larger transfers

// Values equal NCCL's ncclResult_t (the plugin static_asserts that).
enum class Result : int {
  kOk = 0,
  kSystemError = 2,      // an OS call failed (socket, mmap, verbs)
  kInternalError = 3,    // a bug on our side
  kInvalidArgument = 4,  // bad handle, bad pointer, buffer outside its registration
  kInvalidUsage = 5,     // message larger than the posted receive, unknown tag, too many buffers
  kRemoteError = 6,      // the peer died, reset the connection, or sent a corrupt frame
};

// NCCL_PTR_* bits.
inline constexpr int kPtrHost = 0x1;
inline constexpr int kPtrCuda = 0x2;
inline constexpr int kPtrDmaBuf = 0x4;

struct DeviceProps {
  std::string name;     // interface ("eth0") or verbs device ("mlx5_0")
  std::string pciPath;  // /sys/devices/... of the NIC; empty for virtual interfaces (veth, lo)
  std::uint64_t guid = 0;
  int ptrSupport = kPtrHost;
  bool regIsGlobal = false;
  bool forceFlush = false;
  int speedMbps = 10000;
  int port = 0;
  float latencyUs = 0;  // 0: NCCL's default
  int maxComms = 65536;
  int maxRecvs = kMaxRecvs;
  std::size_t maxP2pBytes = kMaxMessageBytes;
  std::size_t maxCollBytes = kMaxMessageBytes;
};

// Log sink: the plugin routes this into NCCL's logger. level: 1 warn, 2 info (NCCL's ncclDebugLogLevel values).
using LogFn = std::function<void(int level, const std::string& message)>;

class MemHandle {
 public:
  virtual ~MemHandle() = default;
};

class Request {
 public:
  virtual ~Request() = default;
};

class SendComm {
 public:
  virtual ~SendComm() = default;
  // data must lie inside the registration `mh` (regMr on this comm). size <= kMaxMessageBytes.
  virtual Result isend(const void* data, std::size_t size, int tag, MemHandle* mh, Request** request) noexcept = 0;
  virtual Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept = 0;
  virtual Result regMrDmaBuf(void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                             MemHandle** mh) noexcept = 0;
  virtual Result deregMr(MemHandle* mh) noexcept = 0;
  // done: 1 when complete; sizes (may be null): sizes[0] = bytes sent.
  virtual Result test(Request* request, int* done, int* sizes) noexcept = 0;
};

class RecvComm {
 public:
  virtual ~RecvComm() = default;
  virtual Result irecv(int n, void** data, const std::size_t* sizes, const int* tags, MemHandle** mhs,
                       Request** request) noexcept = 0;
  // *request = nullptr when nothing needs flushing (host memory; TCP always).
  virtual Result iflush(int n, void** data, const int* sizes, MemHandle** mhs, Request** request) noexcept = 0;
  virtual Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept = 0;
  virtual Result regMrDmaBuf(void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                             MemHandle** mh) noexcept = 0;
  virtual Result deregMr(MemHandle* mh) noexcept = 0;
  // done: 1 when complete; sizes (may be null): bytes received into each of the request's n buffers.
  virtual Result test(Request* request, int* done, int* sizes) noexcept = 0;
};

class ListenComm {
 public:
  virtual ~ListenComm() = default;
  // *recv stays null while no complete connection is waiting.
  virtual Result accept(std::unique_ptr<RecvComm>* recv) noexcept = 0;
};

// A connection being established: connect() returns one on the first call; the plugin keeps it and calls step()
// until *send is non-null. (NCCL's connect is re-entered with the same handle; the ABI layer keeps the state.)
class Connector {
 public:
  virtual ~Connector() = default;
  virtual Result step(std::unique_ptr<SendComm>* send) noexcept = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const noexcept = 0;  // NCCL selects by it (NCCL_NET); "OptiFlow" / "OptiFlow-IB"
  virtual int deviceCount() const noexcept = 0;
  virtual const DeviceProps& device(int dev) const noexcept = 0;
  // handle: kHandleBytes bytes owned by the caller.
  virtual Result listen(int dev, void* handle, std::unique_ptr<ListenComm>* listen) noexcept = 0;
  virtual Result connect(int dev, const void* handle, std::unique_ptr<Connector>* connector) noexcept = 0;
};

class Telemetry;

struct TcpOptions {
  std::vector<std::string> ifnames;          // empty: every up interface with an address except lo, else lo
  int streamsPerRail = 1;                    // sockets per rail of a connection, 1..wire::kMaxStreams
  bool stripe = false;                       // every connection uses every device as a rail (rail striping)
  std::uint64_t minStripeBytes = 256 << 10;  // smaller messages travel on stream 0 only
  int connectTimeoutMs = 30000;              // a connect that has not completed by then fails
};

struct IbOptions {
  std::vector<std::string> devices;  // empty: every verbs device with an active port
  int gidIndex = -1;                 // -1: pick a RoCE v2 IPv4 GID, else 0
  int trafficClass = 0;
};

// Which transport a plugin uses; kTcp and kIb are also the kind byte of a connection handle (wire.h).
enum class TransportKind : std::uint8_t { kAuto = 0, kTcp = 1, kIb = 2 };

struct Options {
  TransportKind kind = TransportKind::kAuto;
  TcpOptions tcp;
  IbOptions ib;
};

// kAuto: the RDMA transport when it was built and finds an active device, else TCP (the reason is logged at INFO).
// kIb without a usable device is an error (nullptr, *error says why); kTcp never tries verbs. `telemetry` outlives the
// transport.
std::unique_ptr<Transport> makeTransport(const Options& options, LogFn log, Telemetry* telemetry, std::string* error);

// The pieces makeTransport chooses between (also used directly by tests and benchmarks).
std::unique_ptr<Transport> makeTcpTransport(const TcpOptions& options, LogFn log, Telemetry* telemetry,
                                            std::string* error);
// nullptr with *error when verbs is not built in, ibv_get_device_list fails (ENOSYS without the kernel module) or
// returns no device with an active port.
std::unique_ptr<Transport> makeIbTransport(const IbOptions& options, LogFn log, Telemetry* telemetry,
                                           std::string* error);

}  // namespace optiflow::net
