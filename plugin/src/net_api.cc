#include "net_api.h"

#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "log.h"
#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"
#include "optiflow/plugin/abi/nccl_net.h"
#include "optiflow/plugin/params.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/reader.h"

extern char** environ;

namespace optiflow::plugin {

namespace {

using net::Result;

static_assert(static_cast<int>(Result::kOk) == ncclSuccess &&
              static_cast<int>(Result::kSystemError) == ncclSystemError &&
              static_cast<int>(Result::kInternalError) == ncclInternalError &&
              static_cast<int>(Result::kInvalidArgument) == ncclInvalidArgument &&
              static_cast<int>(Result::kInvalidUsage) == ncclInvalidUsage &&
              static_cast<int>(Result::kRemoteError) == ncclRemoteError);
static_assert(net::kHandleBytes == static_cast<std::size_t>(NCCL_NET_HANDLE_MAXSIZE));
static_assert(net::kMaxRequests == NCCL_NET_MAX_REQUESTS);
static_assert(net::kPtrHost == NCCL_PTR_HOST && net::kPtrCuda == NCCL_PTR_CUDA && net::kPtrDmaBuf == NCCL_PTR_DMABUF);

// Tags in the objects NCCL holds: a pointer of the wrong kind (a recv comm passed to isend, a closed comm, a dead
// request) is refused with a log line instead of being believed.
enum class Kind : std::uint32_t {
  kListen = 0x4f464c4e,  // "OFLN"
  kSend = 0x4f46534e,    // "OFSN"
  kRecv = 0x4f46524e,    // "OFRN"
  kContext = 0x4f46434e  // "OFCN"
};
inline constexpr std::uint32_t kRequestMagic = 0x4f465251;  // "OFRQ"
inline constexpr std::uint32_t kDead = 0xdeadbeef;

struct Box {
  explicit Box(Kind k) : kind(static_cast<std::uint32_t>(k)) {}
  std::uint32_t kind;
  int dev = 0;
};

struct RequestSlot {
  std::uint32_t magic = 0;
  Box* owner = nullptr;
  net::Request* request = nullptr;
};

// Requests are preallocated per comm: test() receives only the request, so it must find its comm, and the data
// path should not allocate.
class RequestPool {
 public:
  explicit RequestPool(std::size_t capacity) : slots_(capacity) {
    free_.reserve(capacity);
    for (RequestSlot& s : slots_) free_.push_back(&s);
  }
  RequestSlot* take() {
    if (free_.empty()) return nullptr;
    RequestSlot* s = free_.back();
    free_.pop_back();
    return s;
  }
  void give(RequestSlot* s) {
    s->magic = 0;
    s->request = nullptr;
    free_.push_back(s);
  }

 private:
  std::vector<RequestSlot> slots_;
  std::vector<RequestSlot*> free_;
};

struct ListenBox : Box {
  ListenBox() : Box(Kind::kListen) {}
  std::unique_ptr<net::ListenComm> comm;
};

struct SendBox : Box {
  SendBox() : Box(Kind::kSend), pool(static_cast<std::size_t>(net::kMaxRequests) * net::kMaxRecvs) {}
  std::unique_ptr<net::SendComm> comm;
  RequestPool pool;
};

struct RecvBox : Box {
  // Receives and flushes share the pool.
  RecvBox() : Box(Kind::kRecv), pool(2 * static_cast<std::size_t>(net::kMaxRequests)) {}
  std::unique_ptr<net::RecvComm> comm;
  RequestPool pool;
};

struct Context : Box {
  Context() : Box(Kind::kContext) {}
  std::uint64_t commId = 0;
};

struct PendingConnect {
  std::array<std::uint8_t, net::kHandleBytes> bytes{};
  int dev = 0;
  std::unique_ptr<net::Connector> connector;
};

struct State {
  std::mutex mutex;
  std::atomic<ncclDebugLogger_t> logger{nullptr};
  std::atomic<bool> abortOnError{false};
  int contexts = 0;             // v11+ contexts not yet finalized
  bool heldForProcess = false;  // a v9/v10 init succeeded
  int live = 0;                 // comms and pending connects not yet closed
  bool unknownReported = false;
  std::unique_ptr<schedcache::Reader> reader;
  std::unique_ptr<net::Telemetry> telemetry;
  std::unique_ptr<net::Transport> transport;
  // Keyed by the address of NCCL's handle buffer; the bytes are kept to notice a reused buffer. Nothing read from a
  // handle is ever used as a pointer.
  std::map<const void*, PendingConnect> connects;
  std::deque<std::string> strings;  // property strings handed to NCCL: never freed, never moved
};

// Leaked on purpose: NCCL's proxy threads may still call in while static destructors run at exit.
State& state() {
  static State* s = new State;
  return *s;
}

ncclDebugLogger_t logger() { return state().logger.load(std::memory_order_relaxed); }

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t result, const char* fmt, ...) noexcept {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  OPTIFLOW_NET_WARN(logger(), "%s", buf);
  if (state().abortOnError.load(std::memory_order_relaxed)) std::abort();
  return result;
}

// The transport already logged what went wrong (peer, what it found).
ncclResult_t check(Result r) noexcept {
  if (r != Result::kOk && state().abortOnError.load(std::memory_order_relaxed)) std::abort();
  return static_cast<ncclResult_t>(r);
}

void logFromTransport(int level, const std::string& message) {
  if (level <= 1) {
    OPTIFLOW_NET_WARN(logger(), "%s", message.c_str());
  } else {
    OPTIFLOW_NET_INFO(logger(), "%s", message.c_str());
  }
}

char* intern(State& s, const std::string& value) {
  for (std::string& v : s.strings) {
    if (v == value) return v.data();
  }
  s.strings.push_back(value);
  return s.strings.back().data();
}

// Call with the mutex held: the transport goes when nothing can reach it any more.
void releaseIfUnused(State& s) {
  if (s.contexts > 0 || s.heldForProcess || s.live > 0 || !s.transport) return;
  OPTIFLOW_NET_INFO(logger(), "last context finalized: %s transport closed", s.transport->name());
  s.transport.reset();
  s.telemetry.reset();
  s.reader.reset();
}

// Call with the mutex held.
ncclResult_t createTransport(State& s, int trafficClass) {
  Params params;
  std::string error;
  if (!readParams([](const char* name) -> const char* { return std::getenv(name); }, &params, &error)) {
    return fail(ncclInvalidUsage, "init: %s", error.c_str());
  }
  s.abortOnError.store(params.abortOnError, std::memory_order_relaxed);
  if (!s.unknownReported) {
    s.unknownReported = true;
    for (const std::string& name : unknownParams(environ)) {
      OPTIFLOW_NET_WARN(logger(), "unknown variable %s ignored (see docs/net.md for the list)", name.c_str());
    }
  }

  schedcache::Error attachError;
  s.reader = schedcache::Reader::attach(params.ns, &attachError);
  if (s.reader) {
    s.telemetry = std::make_unique<net::CacheTelemetry>(s.reader.get());
    OPTIFLOW_NET_INIT_INFO(logger(), "telemetry in schedule cache '%s'", params.ns.c_str());
  } else {
    s.telemetry = std::make_unique<net::LocalTelemetry>();
    OPTIFLOW_NET_INIT_INFO(logger(), "telemetry in process memory: schedule cache '%s' not attached (%s)",
                           params.ns.c_str(), attachError.message.c_str());
  }

  net::Options options;
  options.kind = params.netTransport == "tcp"  ? net::TransportKind::kTcp
                 : params.netTransport == "ib" ? net::TransportKind::kIb
                                               : net::TransportKind::kAuto;
  options.tcp.ifnames = params.netIfnames;
  options.tcp.streamsPerRail = params.netStreams;
  options.tcp.stripe = params.netStripe;
  options.tcp.minStripeBytes = params.netMinStripeBytes;
  if (trafficClass >= 0) options.ib.trafficClass = trafficClass;
  error.clear();
  s.transport = net::makeTransport(options, logFromTransport, s.telemetry.get(), &error);
  if (!s.transport) {
    s.telemetry.reset();
    s.reader.reset();
    return fail(ncclSystemError, "init: no transport (OPTIFLOW_NET_TRANSPORT=%s): %s", params.netTransport.c_str(),
                error.empty() ? "no reason given" : error.c_str());
  }
  std::string names;
  for (int d = 0; d < s.transport->deviceCount(); ++d) {
    names += (d == 0 ? "" : ",") + s.transport->device(d).name;
  }
  OPTIFLOW_NET_INIT_INFO(logger(), "%s transport, %d device(s) [%s], %d stream(s) per rail, striping %s",
                         s.transport->name(), s.transport->deviceCount(), names.c_str(), params.netStreams,
                         params.netStripe ? "on" : "off");
  return ncclSuccess;
}

// The transport for listen/connect; nullptr (logged, *error set) before init or for a device out of range.
net::Transport* transportFor(const char* what, int dev, ncclResult_t* error) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.transport) {
    *error = fail(ncclInvalidUsage, "%s(dev %d) before a successful init", what, dev);
    return nullptr;
  }
  if (dev < 0 || dev >= s.transport->deviceCount()) {
    *error = fail(ncclInvalidArgument, "%s: device %d does not exist (expected 0-%d)", what, dev,
                  s.transport->deviceCount() - 1);
    return nullptr;
  }
  return s.transport.get();
}

void addLive(int delta) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.live += delta;
  if (delta < 0) releaseIfUnused(s);
}

bool is(const void* p, Kind k) {
  return p != nullptr && static_cast<const Box*>(p)->kind == static_cast<std::uint32_t>(k);
}

const char* kindName(const void* p) {
  if (p == nullptr) return "NULL";
  switch (static_cast<const Box*>(p)->kind) {
    case static_cast<std::uint32_t>(Kind::kListen):
      return "a listen comm";
    case static_cast<std::uint32_t>(Kind::kSend):
      return "a send comm";
    case static_cast<std::uint32_t>(Kind::kRecv):
      return "a recv comm";
    case static_cast<std::uint32_t>(Kind::kContext):
      return "an init context";
    case kDead:
      return "a closed comm";
    default:
      return "not an OptiFlow object";
  }
}

}  // namespace

ncclResult_t netUnexpected(const char* where, const char* what) noexcept {
  return fail(ncclInternalError, "%s: %s", where, what);
}

ncclResult_t netInit(void** ctx, std::uint64_t commId, int trafficClass, ncclDebugLogger_t logFunction) noexcept {
  try {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (logFunction != nullptr) s.logger.store(logFunction, std::memory_order_relaxed);
    if (ctx != nullptr) *ctx = nullptr;
    if (ctx == nullptr && s.heldForProcess) return ncclSuccess;  // v9/v10: once per process
    if (!s.transport) {
      const ncclResult_t r = createTransport(s, trafficClass);
      if (r != ncclSuccess) return r;
    }
    if (ctx == nullptr) {
      s.heldForProcess = true;
      return ncclSuccess;
    }
    auto c = std::make_unique<Context>();
    c->commId = commId;
    ++s.contexts;
    *ctx = c.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(ncclInternalError, "init: %s", e.what());
  } catch (...) {
    return fail(ncclInternalError, "init: unknown exception");
  }
}

ncclResult_t netFinalize(void* ctx) noexcept {
  if (!is(ctx, Kind::kContext)) {
    return fail(ncclInvalidArgument, "finalize: context %p is %s", ctx, kindName(ctx));
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto* c = static_cast<Context*>(ctx);
  c->kind = kDead;
  delete c;
  --s.contexts;
  releaseIfUnused(s);
  return ncclSuccess;
}

ncclResult_t netDevices(int* ndev) noexcept {
  if (ndev == nullptr) return fail(ncclInvalidArgument, "devices: ndev is NULL");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.transport) {
    *ndev = 0;
    return fail(ncclInvalidUsage, "devices before a successful init");
  }
  *ndev = s.transport->deviceCount();
  return ncclSuccess;
}

ncclResult_t netGetProperties(int dev, NetDeviceInfo* out) noexcept {
  if (out == nullptr) return fail(ncclInvalidArgument, "getProperties(dev %d): props is NULL", dev);
  try {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.transport) return fail(ncclInvalidUsage, "getProperties(dev %d) before a successful init", dev);
    if (dev < 0 || dev >= s.transport->deviceCount()) {
      return fail(ncclInvalidArgument, "getProperties: device %d does not exist (expected 0-%d)", dev,
                  s.transport->deviceCount() - 1);
    }
    const net::DeviceProps& p = s.transport->device(dev);
    out->name = intern(s, p.name);
    out->pciPath = p.pciPath.empty() ? nullptr : intern(s, p.pciPath);
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->regIsGlobal = p.regIsGlobal ? 1 : 0;
    out->forceFlush = p.forceFlush ? 1 : 0;
    out->speedMbps = p.speedMbps;
    out->port = p.port;
    out->latencyUs = p.latencyUs;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    out->maxP2pBytes = p.maxP2pBytes;
    out->maxCollBytes = p.maxCollBytes;
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(ncclInternalError, "getProperties(dev %d): %s", dev, e.what());
  }
}

ncclResult_t netListen(int dev, void* handle, void** listenComm) noexcept {
  if (handle == nullptr || listenComm == nullptr) {
    return fail(ncclInvalidArgument, "listen(dev %d): handle %p, listenComm %p (expected both non-NULL)", dev, handle,
                static_cast<void*>(listenComm));
  }
  *listenComm = nullptr;
  try {
    ncclResult_t error = ncclSuccess;
    net::Transport* t = transportFor("listen", dev, &error);
    if (t == nullptr) return error;
    auto box = std::make_unique<ListenBox>();
    box->dev = dev;
    const Result r = t->listen(dev, handle, &box->comm);
    if (r != Result::kOk) return check(r);
    if (!box->comm) return fail(ncclInternalError, "listen(dev %d): transport returned no listen comm", dev);
    addLive(1);
    *listenComm = box.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(ncclInternalError, "listen(dev %d): %s", dev, e.what());
  }
}

ncclResult_t netConnect(int dev, void* handle, void** sendComm) noexcept {
  if (handle == nullptr || sendComm == nullptr) {
    return fail(ncclInvalidArgument, "connect(dev %d): handle %p, sendComm %p (expected both non-NULL)", dev, handle,
                static_cast<void*>(sendComm));
  }
  *sendComm = nullptr;
  try {
    ncclResult_t error = ncclSuccess;
    net::Transport* t = transportFor("connect", dev, &error);
    if (t == nullptr) return error;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.connects.find(handle);
    if (it != s.connects.end() &&
        (it->second.dev != dev || std::memcmp(it->second.bytes.data(), handle, net::kHandleBytes) != 0)) {
      // NCCL reused the buffer for another peer after abandoning a connect: start over.
      OPTIFLOW_NET_INFO(logger(),
                        "connect(dev %d): handle buffer %p holds a new handle; the unfinished connect for "
                        "its old contents is dropped",
                        dev, handle);
      s.connects.erase(it);
      --s.live;
      it = s.connects.end();
    }
    if (it == s.connects.end()) {
      PendingConnect pending;
      std::memcpy(pending.bytes.data(), handle, net::kHandleBytes);
      pending.dev = dev;
      const Result r = t->connect(dev, handle, &pending.connector);
      if (r != Result::kOk) return check(r);
      if (!pending.connector) return fail(ncclInternalError, "connect(dev %d): transport returned no connector", dev);
      it = s.connects.emplace(handle, std::move(pending)).first;
      ++s.live;
    }
    std::unique_ptr<net::SendComm> comm;
    const Result r = it->second.connector->step(&comm);
    if (r != Result::kOk || comm) {
      s.connects.erase(it);
      --s.live;
    }
    if (r != Result::kOk) {
      releaseIfUnused(s);
      return check(r);
    }
    if (!comm) return ncclSuccess;  // in progress: NCCL calls again with the same handle
    auto box = std::make_unique<SendBox>();
    box->dev = dev;
    box->comm = std::move(comm);
    ++s.live;
    *sendComm = box.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(ncclInternalError, "connect(dev %d): %s", dev, e.what());
  }
}

ncclResult_t netAccept(void* listenComm, void** recvComm) noexcept {
  if (recvComm == nullptr) return fail(ncclInvalidArgument, "accept: recvComm is NULL");
  *recvComm = nullptr;
  if (!is(listenComm, Kind::kListen)) {
    return fail(ncclInvalidArgument, "accept: listenComm %p is %s", listenComm, kindName(listenComm));
  }
  try {
    auto* l = static_cast<ListenBox*>(listenComm);
    std::unique_ptr<net::RecvComm> comm;
    const Result r = l->comm->accept(&comm);
    if (r != Result::kOk) return check(r);
    if (!comm) return ncclSuccess;
    auto box = std::make_unique<RecvBox>();
    box->dev = l->dev;
    box->comm = std::move(comm);
    addLive(1);
    *recvComm = box.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(ncclInternalError, "accept: %s", e.what());
  }
}

ncclResult_t netRegMr(void* comm, void* data, std::size_t size, int type, void** mhandle) noexcept {
  if (mhandle == nullptr) return fail(ncclInvalidArgument, "regMr: mhandle is NULL");
  *mhandle = nullptr;
  net::MemHandle* mh = nullptr;
  Result r;
  if (is(comm, Kind::kSend)) {
    r = static_cast<SendBox*>(comm)->comm->regMr(data, size, type, &mh);
  } else if (is(comm, Kind::kRecv)) {
    r = static_cast<RecvBox*>(comm)->comm->regMr(data, size, type, &mh);
  } else {
    return fail(ncclInvalidArgument, "regMr: comm %p is %s (expected a send or recv comm)", comm, kindName(comm));
  }
  *mhandle = mh;
  return check(r);
}

ncclResult_t netRegMrDmaBuf(void* comm, void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                            void** mhandle) noexcept {
  if (mhandle == nullptr) return fail(ncclInvalidArgument, "regMrDmaBuf: mhandle is NULL");
  *mhandle = nullptr;
  net::MemHandle* mh = nullptr;
  Result r;
  if (is(comm, Kind::kSend)) {
    r = static_cast<SendBox*>(comm)->comm->regMrDmaBuf(data, size, type, offset, fd, &mh);
  } else if (is(comm, Kind::kRecv)) {
    r = static_cast<RecvBox*>(comm)->comm->regMrDmaBuf(data, size, type, offset, fd, &mh);
  } else {
    return fail(ncclInvalidArgument, "regMrDmaBuf: comm %p is %s (expected a send or recv comm)", comm, kindName(comm));
  }
  *mhandle = mh;
  return check(r);
}

ncclResult_t netDeregMr(void* comm, void* mhandle) noexcept {
  auto* mh = static_cast<net::MemHandle*>(mhandle);
  if (is(comm, Kind::kSend)) return check(static_cast<SendBox*>(comm)->comm->deregMr(mh));
  if (is(comm, Kind::kRecv)) return check(static_cast<RecvBox*>(comm)->comm->deregMr(mh));
  return fail(ncclInvalidArgument, "deregMr: comm %p is %s (expected a send or recv comm)", comm, kindName(comm));
}

ncclResult_t netIsend(void* sendComm, void* data, std::size_t size, int tag, void* mhandle, void** request) noexcept {
  if (request == nullptr) return fail(ncclInvalidArgument, "isend: request is NULL");
  *request = nullptr;
  if (!is(sendComm, Kind::kSend)) {
    return fail(ncclInvalidArgument, "isend: sendComm %p is %s", sendComm, kindName(sendComm));
  }
  if (size > net::kMaxMessageBytes) {
    return fail(ncclInvalidArgument, "isend: %zu bytes > maxP2pBytes %zu", size, net::kMaxMessageBytes);
  }
  auto* box = static_cast<SendBox*>(sendComm);
  RequestSlot* slot = box->pool.take();
  if (slot == nullptr) return ncclSuccess;  // every slot in flight: NCCL retries
  net::Request* req = nullptr;
  const Result r = box->comm->isend(data, size, tag, static_cast<net::MemHandle*>(mhandle), &req);
  if (r != Result::kOk || req == nullptr) {
    box->pool.give(slot);
    return check(r);
  }
  slot->magic = kRequestMagic;
  slot->owner = box;
  slot->request = req;
  *request = slot;
  return ncclSuccess;
}

ncclResult_t netIrecv(void* recvComm, int n, void** data, const std::size_t* sizes, const int* tags, void** mhandles,
                      void** request) noexcept {
  if (request == nullptr) return fail(ncclInvalidArgument, "irecv: request is NULL");
  *request = nullptr;
  if (!is(recvComm, Kind::kRecv)) {
    return fail(ncclInvalidArgument, "irecv: recvComm %p is %s", recvComm, kindName(recvComm));
  }
  if (n < 1 || n > net::kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr) {
    return fail(ncclInvalidArgument, "irecv: n=%d (expected 1-%d) with data/sizes/tags %s", n, net::kMaxRecvs,
                data == nullptr || sizes == nullptr || tags == nullptr ? "missing" : "given");
  }
  auto* box = static_cast<RecvBox*>(recvComm);
  RequestSlot* slot = box->pool.take();
  if (slot == nullptr) return ncclSuccess;
  net::Request* req = nullptr;
  const Result r = box->comm->irecv(n, data, sizes, tags, reinterpret_cast<net::MemHandle**>(mhandles), &req);
  if (r != Result::kOk || req == nullptr) {
    box->pool.give(slot);
    return check(r);
  }
  slot->magic = kRequestMagic;
  slot->owner = box;
  slot->request = req;
  *request = slot;
  return ncclSuccess;
}

ncclResult_t netIflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles, void** request) noexcept {
  if (request == nullptr) return fail(ncclInvalidArgument, "iflush: request is NULL");
  *request = nullptr;
  if (!is(recvComm, Kind::kRecv)) {
    return fail(ncclInvalidArgument, "iflush: recvComm %p is %s", recvComm, kindName(recvComm));
  }
  auto* box = static_cast<RecvBox*>(recvComm);
  RequestSlot* slot = box->pool.take();
  if (slot == nullptr) return ncclSuccess;
  net::Request* req = nullptr;
  const Result r = box->comm->iflush(n, data, sizes, reinterpret_cast<net::MemHandle**>(mhandles), &req);
  if (r != Result::kOk || req == nullptr) {  // nothing to flush: NULL request, which NCCL treats as done
    box->pool.give(slot);
    return check(r);
  }
  slot->magic = kRequestMagic;
  slot->owner = box;
  slot->request = req;
  *request = slot;
  return ncclSuccess;
}

ncclResult_t netTest(void* request, int* done, int* sizes) noexcept {
  if (done == nullptr) return fail(ncclInvalidArgument, "test: done is NULL");
  *done = 0;
  auto* slot = static_cast<RequestSlot*>(request);
  if (slot == nullptr || slot->magic != kRequestMagic) {
    return fail(ncclInvalidArgument, "test: request %p is not a live request (completed requests are dead)", request);
  }
  Result r;
  if (is(slot->owner, Kind::kSend)) {
    auto* box = static_cast<SendBox*>(slot->owner);
    r = box->comm->test(slot->request, done, sizes);
    if (r == Result::kOk && *done != 0) box->pool.give(slot);
  } else if (is(slot->owner, Kind::kRecv)) {
    auto* box = static_cast<RecvBox*>(slot->owner);
    r = box->comm->test(slot->request, done, sizes);
    if (r == Result::kOk && *done != 0) box->pool.give(slot);
  } else {
    return fail(ncclInternalError, "test: request %p belongs to %s", request, kindName(slot->owner));
  }
  return check(r);
}

ncclResult_t netCloseSend(void* sendComm) noexcept {
  if (!is(sendComm, Kind::kSend)) {
    return fail(ncclInvalidArgument, "closeSend: %p is %s", sendComm, kindName(sendComm));
  }
  auto* box = static_cast<SendBox*>(sendComm);
  box->kind = kDead;
  delete box;
  addLive(-1);
  return ncclSuccess;
}

ncclResult_t netCloseRecv(void* recvComm) noexcept {
  if (!is(recvComm, Kind::kRecv)) {
    return fail(ncclInvalidArgument, "closeRecv: %p is %s", recvComm, kindName(recvComm));
  }
  auto* box = static_cast<RecvBox*>(recvComm);
  box->kind = kDead;
  delete box;
  addLive(-1);
  return ncclSuccess;
}

ncclResult_t netCloseListen(void* listenComm) noexcept {
  if (!is(listenComm, Kind::kListen)) {
    return fail(ncclInvalidArgument, "closeListen: %p is %s", listenComm, kindName(listenComm));
  }
  auto* box = static_cast<ListenBox*>(listenComm);
  box->kind = kDead;
  delete box;
  addLive(-1);
  return ncclSuccess;
}

ncclResult_t netGetDeviceMr(void* /*comm*/, void* /*mhandle*/, void** dptrMhandle) noexcept {
  if (dptrMhandle != nullptr) *dptrMhandle = nullptr;
  return ncclSuccess;
}

ncclResult_t netIrecvConsumed(void* /*recvComm*/, int /*n*/, void* /*request*/) noexcept { return ncclSuccess; }

ncclResult_t netSetNetAttr(void* ctx, std::uint32_t op, std::uint32_t algo, std::uint32_t proto) noexcept {
  OPTIFLOW_NET_TRACE(logger(), "setNetAttr(ctx %p): op 0x%x algo 0x%x proto 0x%x (hints not used)", ctx, op, algo,
                     proto);
  (void)ctx;
  (void)op;
  (void)algo;
  (void)proto;
  return ncclSuccess;
}

}  // namespace optiflow::plugin
