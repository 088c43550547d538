// The TCP data path. A connection has S streams (sockets); every message is split over them by the sender (rail
// weights read per message) and described by the MessageHeader on stream 0, so the receiver reads each stream's parts
// straight into the user buffer in message order. Everything is non-blocking: isend/irecv/test move what the sockets
// take or hold right now and return.
#include "tcp_comm.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "optiflow/net/wire.h"

namespace optiflow::net::detail {

void warn(const LogFn& log, const std::string& message) {
  if (!log) return;
  try {
    log(1, "TCP: " + message);
  } catch (...) {  // a throwing log sink must not take the data path down
  }
}

namespace {

constexpr std::uint64_t kStripeAlign = 4096;
constexpr std::uint32_t kRailRetryMessages = 1024;
constexpr int kMaxIov = 64;
constexpr int kMaxSendRequests = kMaxRequests * kMaxRecvs;
constexpr int kMaxProgressPasses = 8;

std::uint64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Streams whose last call would have blocked are polled (timeout 0) before they are tried again, all in one call:
// spinning on EAGAIN takes the socket lock each time, which defers the kernel's own work on that socket (ACKs, window
// updates) to the spinning thread and costs most of the bandwidth (measured on loopback); poll() does not take it.
// Clears blocked[s] for every wanted stream that is ready (or has an error or EOF for the next call to report).
void pollBlocked(const std::vector<Fd>& fds, const bool* want, std::vector<char>& blocked, short events) {
  pollfd pfds[wire::kMaxStreams];
  std::size_t index[wire::kMaxStreams];
  nfds_t n = 0;
  for (std::size_t s = 0; s < fds.size() && s < static_cast<std::size_t>(wire::kMaxStreams); ++s) {
    if (!want[s] || blocked[s] == 0) continue;
    pfds[n] = pollfd{fds[s].get(), events, 0};
    index[n++] = s;
  }
  if (n == 0 || ::poll(pfds, n, 0) <= 0) return;  // EINTR: try again on the next call
  for (nfds_t i = 0; i < n; ++i) {
    if (pfds[i].revents != 0) blocked[index[i]] = 0;
  }
}

// A fixed-capacity FIFO: the data path never allocates.
template <typename T>
class Ring {
 public:
  explicit Ring(std::size_t capacity) : items_(capacity) {}
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == items_.size(); }
  std::size_t size() const { return count_; }
  T& at(std::size_t i) { return items_[(head_ + i) % items_.size()]; }
  T& front() { return items_[head_]; }
  void push(const T& item) {
    items_[(head_ + count_) % items_.size()] = item;
    ++count_;
  }
  void pop() {
    head_ = (head_ + 1) % items_.size();
    --count_;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0, count_ = 0;
};

class TcpMemHandle final : public MemHandle {
 public:
  TcpMemHandle(const void* owner, const std::uint8_t* base, std::size_t size, int type)
      : owner_(owner), base_(base), size_(size), type_(type) {}
  const void* owner_;
  const std::uint8_t* base_;
  std::size_t size_;
  int type_;
};

// State and error handling both directions share.
class CommCore {
 public:
  explicit CommCore(TcpConnection c) : conn_(std::move(c)) {
    if (conn_.telemetry != nullptr) {
      peerRec_ = conn_.telemetry->peer(conn_.peer);
      for (const std::string& nic : conn_.railNics) nicRecs_.push_back(conn_.telemetry->nic(nic));
    } else {
      peerRec_ = &scratch_;
      nicRecs_.assign(conn_.railNics.size(), &scratch_);
    }
  }
  CommCore(const CommCore&) = delete;
  CommCore& operator=(const CommCore&) = delete;

  // The first failure sticks; later calls return it without logging again.
  Result fail(Result result, const std::string& what) {
    if (failed_ != Result::kOk) return failed_;
    failed_ = result;
    warn(conn_.log, what);
    countAdd(&peerRec_->errors, 1);
    for (NetCounters* nic : uniqueNics()) countAdd(&nic->errors, 1);
    return failed_;
  }

  // A caller bug (null pointer, dead request): refused with a log line, the connection itself stays usable.
  Result misuse(const std::string& what) {
    warn(conn_.log, what);
    return Result::kInvalidArgument;
  }

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) {
    if (mh == nullptr) return misuse("regMr with a null handle pointer (peer " + conn_.peer + ")");
    *mh = nullptr;
    if (type != kPtrHost) {
      warn(conn_.log, "regMr: memory type " + std::to_string(type) + " is not host memory (" +
                          std::to_string(kPtrHost) + "): the TCP transport only sends from host memory");
      return Result::kInvalidArgument;
    }
    if (data == nullptr && size > 0) {
      warn(conn_.log, "regMr: null pointer with size " + std::to_string(size));
      return Result::kInvalidArgument;
    }
    *mh = new (std::nothrow) TcpMemHandle(this, static_cast<const std::uint8_t*>(data), size, type);
    return *mh == nullptr ? Result::kSystemError : Result::kOk;
  }

  Result deregMr(MemHandle* mh) {
    if (mh == nullptr) return Result::kOk;
    auto* h = static_cast<TcpMemHandle*>(mh);
    if (h->owner_ != this) {
      warn(conn_.log, "deregMr: memory handle was registered on another comm");
      return Result::kInvalidArgument;
    }
    delete h;
    return Result::kOk;
  }

  // data..data+size must lie inside the registration.
  bool inRegistration(const void* data, std::size_t size, MemHandle* mh, const char* what) {
    if (size == 0) return true;
    auto* h = static_cast<TcpMemHandle*>(mh);
    const auto* p = static_cast<const std::uint8_t*>(data);
    if (h == nullptr || h->owner_ != this) {
      warn(conn_.log, std::string(what) + ": memory handle is null or from another comm (peer " + conn_.peer + ")");
      return false;
    }
    if (p == nullptr || p < h->base_ || size > h->size_ || static_cast<std::size_t>(p - h->base_) > h->size_ - size) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "%s: buffer %p + %zu bytes lies outside its registration %p + %zu bytes", what,
                    data, size, static_cast<const void*>(h->base_), h->size_);
      warn(conn_.log, buf);
      return false;
    }
    return true;
  }

  // Busy time: measured only at the 0 <-> 1 transitions of requests in flight.
  void busyStart() {
    if (inflight_++ == 0) busySince_ = monotonicNs();
  }
  void busyEnd(bool send) {
    if (--inflight_ > 0) return;
    const std::uint64_t ns = monotonicNs() - busySince_;
    countAdd(send ? &peerRec_->sendBusyNs : &peerRec_->recvBusyNs, ns);
    for (NetCounters* nic : uniqueNics()) countAdd(send ? &nic->sendBusyNs : &nic->recvBusyNs, ns);
  }

  const std::vector<NetCounters*>& uniqueNics() {
    if (unique_.empty()) {
      for (NetCounters* n : nicRecs_) {
        if (std::find(unique_.begin(), unique_.end(), n) == unique_.end()) unique_.push_back(n);
      }
    }
    return unique_;
  }

  std::string streamName(std::size_t s) const {
    return "stream " + std::to_string(s) + " (" + conn_.railNics[static_cast<std::size_t>(conn_.railOfStream[s])] +
           ") of the connection with " + conn_.peer;
  }

  TcpConnection conn_;
  Result failed_ = Result::kOk;
  NetCounters scratch_{};
  NetCounters* peerRec_ = nullptr;
  std::vector<NetCounters*> nicRecs_;  // by rail
  std::vector<NetCounters*> unique_;
  int inflight_ = 0;
  std::uint64_t busySince_ = 0;
};

// ---- Send --------------------------------------------------------------------------------------------------------

class TcpSendComm;

class SendRequest final : public Request {
 public:
  const TcpSendComm* owner = nullptr;
  bool used = false;
  bool done = false;
  std::uint64_t size = 0;
  std::uint64_t pending = 0;  // header and payload bytes not yet handed to the kernel
  int partCount = 0;
  wire::Part parts[wire::kMaxStreams];
  std::uint8_t header[wire::kMaxMessageHeaderBytes];
  std::uint8_t chunks[wire::kMaxStreams][wire::kChunkHeaderBytes];
};

struct SendItem {
  SendRequest* req = nullptr;
  const std::uint8_t* head = nullptr;  // frame header bytes
  std::uint64_t headBytes = 0;
  const std::uint8_t* data = nullptr;  // the user's bytes, never copied
  std::uint64_t dataBytes = 0;
  std::uint64_t sent = 0;
};

class TcpSendComm final : public SendComm {
 public:
  explicit TcpSendComm(TcpConnection c) : core_(std::move(c)), pool_(kMaxSendRequests) {
    const std::size_t streams = core_.conn_.fds.size();
    queues_.reserve(streams);
    for (std::size_t s = 0; s < streams; ++s) queues_.emplace_back(kMaxSendRequests);
    blocked_.assign(streams, 0);
    for (SendRequest& r : pool_) {
      r.owner = this;
      free_.push_back(&r);
    }
    railIndex_.assign(core_.conn_.railNics.size(), -1);
    resolveRails();
  }

  void resolveRails() noexcept {
    unresolvedRails_ = false;
    for (std::size_t r = 0; r < railIndex_.size(); ++r) {
      if (railIndex_[r] < 0 && core_.conn_.telemetry != nullptr) {
        railIndex_[r] = core_.conn_.telemetry->railIndex(core_.conn_.railNics[r]);
      }
      unresolvedRails_ = unresolvedRails_ || (railIndex_[r] < 0 && core_.conn_.telemetry != nullptr);
    }
  }

  Result isend(const void* data, std::size_t size, int tag, MemHandle* mh, Request** request) noexcept override {
    if (request == nullptr) return core_.misuse("isend with a null request pointer");
    *request = nullptr;
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (size > kMaxMessageBytes) {
      warn(core_.conn_.log, "isend of " + std::to_string(size) + " bytes > maximum " +
                                std::to_string(kMaxMessageBytes) + " (peer " + core_.conn_.peer + ")");
      return Result::kInvalidArgument;
    }
    if (!core_.inRegistration(data, size, mh, "isend")) return Result::kInvalidArgument;
    if (free_.empty()) {
      progress();
      return core_.failed_;  // pool exhausted: *request stays null, the caller retries
    }
    SendRequest* req = free_.back();
    free_.pop_back();
    req->used = true;
    req->done = false;
    req->size = size;

    const int streams = static_cast<int>(queues_.size());
    // A rail without a weight record when the connection was made is looked up again every kRailRetryMessages
    // messages, so `optiflow cache rails set` also reaches connections that predate the rail's record.
    if (unresolvedRails_ && (seq_ % kRailRetryMessages) == 0) resolveRails();
    std::uint32_t weights[wire::kMaxStreams];
    for (int s = 0; s < streams; ++s) {
      const int idx = railIndex_[static_cast<std::size_t>(core_.conn_.railOfStream[static_cast<std::size_t>(s)])];
      weights[s] = idx < 0 ? 1 : core_.conn_.telemetry->railWeight(idx);
    }
    req->partCount = wire::split(size, weights, streams, core_.conn_.minStripeBytes, kStripeAlign, req->parts);

    wire::MessageHeader header;
    header.seq = seq_++;
    header.tag = tag;
    header.size = size;
    header.partCount = static_cast<std::uint16_t>(req->partCount);
    std::copy(req->parts, req->parts + req->partCount, header.parts);
    const std::size_t headerBytes = wire::encodeMessageHeader(header, req->header);

    const auto* bytes = static_cast<const std::uint8_t*>(data);
    SendItem first{req, req->header, headerBytes, nullptr, 0, 0};
    req->pending = headerBytes;
    std::uint64_t offset = 0;
    for (int i = 0; i < req->partCount; ++i) {
      const wire::Part& part = req->parts[i];
      if (part.stream == 0) {
        first.data = bytes;
        first.dataBytes = part.bytes;
      } else {
        wire::encodeChunkHeader(wire::ChunkHeader{header.seq, offset, part.bytes}, req->chunks[i]);
        queues_[part.stream].push(
            SendItem{req, req->chunks[i], wire::kChunkHeaderBytes, bytes + offset, part.bytes, 0});
        req->pending += wire::kChunkHeaderBytes;
      }
      req->pending += part.bytes;
      offset += part.bytes;
    }
    queues_[0].push(first);
    core_.busyStart();
    progress();
    *request = req;
    return core_.failed_;
  }

  Result test(Request* request, int* done, int* sizes) noexcept override {
    if (done != nullptr) *done = 0;
    auto* req = static_cast<SendRequest*>(request);
    if (req == nullptr || done == nullptr || req->owner != this || !req->used) {
      return core_.misuse("send test on a request that is not in flight on this comm (peer " + core_.conn_.peer + ")");
    }
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (!req->done) progress();
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (!req->done) return Result::kOk;
    *done = 1;
    if (sizes != nullptr) sizes[0] = static_cast<int>(req->size);
    req->used = false;
    free_.push_back(req);
    return Result::kOk;
  }

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept override {
    return core_.regMr(data, size, type, mh);
  }
  Result regMrDmaBuf(void*, std::size_t, int, std::uint64_t, int, MemHandle** mh) noexcept override {
    if (mh != nullptr) *mh = nullptr;
    warn(core_.conn_.log, "regMrDmaBuf: the TCP transport does not support DMA-BUF registration");
    return Result::kInvalidUsage;
  }
  Result deregMr(MemHandle* mh) noexcept override { return core_.deregMr(mh); }

 private:
  // Hands queued bytes to the kernel on every stream until each would block.
  void progress() {
    if (core_.failed_ != Result::kOk) return;
    bool waiting = false;
    bool moved = false;
    bool want[wire::kMaxStreams];
    for (std::size_t s = 0; s < queues_.size(); ++s) want[s] = !queues_[s].empty();
    pollBlocked(core_.conn_.fds, want, blocked_, POLLOUT);
    for (std::size_t s = 0; s < queues_.size(); ++s) {
      Ring<SendItem>& q = queues_[s];
      waiting = waiting || !q.empty();
      while (!q.empty() && blocked_[s] == 0) {
        iovec iov[kMaxIov];
        int n = 0;
        for (std::size_t i = 0; i < q.size() && n + 2 <= kMaxIov; ++i) {
          const SendItem& item = q.at(i);
          if (item.sent < item.headBytes) {
            iov[n++] = iovec{const_cast<std::uint8_t*>(item.head + item.sent), item.headBytes - item.sent};
            if (item.dataBytes > 0) iov[n++] = iovec{const_cast<std::uint8_t*>(item.data), item.dataBytes};
          } else {
            const std::uint64_t done = item.sent - item.headBytes;
            iov[n++] = iovec{const_cast<std::uint8_t*>(item.data + done), item.dataBytes - done};
          }
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<std::size_t>(n);
        const ssize_t rc = ::sendmsg(core_.conn_.fds[s].get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            blocked_[s] = 1;
            break;
          }
          core_.fail(Result::kRemoteError, "send on " + core_.streamName(s) + " failed: " + std::strerror(errno) +
                                               " (peer closed or reset the connection)");
          return;
        }
        moved = moved || rc > 0;
        advance(s, static_cast<std::uint64_t>(rc));
      }
    }
    // A stall is an episode (not a poll) in which a request waited and no byte moved.
    if (waiting && !moved && !stalled_) countAdd(&core_.peerRec_->stalls, 1);
    stalled_ = waiting && !moved;
  }

  void advance(std::size_t s, std::uint64_t bytes) {
    Ring<SendItem>& q = queues_[s];
    while (bytes > 0 && !q.empty()) {
      SendItem& item = q.front();
      const std::uint64_t take = std::min(bytes, item.headBytes + item.dataBytes - item.sent);
      item.sent += take;
      bytes -= take;
      SendRequest* req = item.req;
      req->pending -= take;
      if (item.sent == item.headBytes + item.dataBytes) {
        if (item.dataBytes > 0) {
          countSent(core_.nicRecs_[static_cast<std::size_t>(core_.conn_.railOfStream[s])], item.dataBytes);
        }
        q.pop();
      }
      if (req->pending == 0 && !req->done) {
        req->done = true;
        countSent(core_.peerRec_, req->size);
        core_.busyEnd(true);
      }
    }
  }

  CommCore core_;
  std::vector<SendRequest> pool_;
  std::vector<SendRequest*> free_;
  std::vector<Ring<SendItem>> queues_;  // by stream
  std::vector<int> railIndex_;          // Telemetry::railIndex per rail (-1: no record yet)
  bool unresolvedRails_ = false;        // some rail had no record: resolveRails() again now and then
  std::vector<char> blocked_;           // by stream: the last send would have blocked
  bool stalled_ = false;                // the last progress call moved nothing while a request waited
  std::uint32_t seq_ = 0;
};

// ---- Receive -----------------------------------------------------------------------------------------------------

class TcpRecvComm;

struct RecvBuffer {
  std::uint8_t* data = nullptr;
  std::uint64_t capacity = 0;
  int tag = 0;
  bool matched = false;
  std::uint64_t size = 0;       // of the matched message
  std::uint64_t remaining = 0;  // bytes of it not yet received
};

class RecvRequest final : public Request {
 public:
  const TcpRecvComm* owner = nullptr;
  bool used = false;
  int n = 0;
  int unmatched = 0;
  RecvBuffer buffers[kMaxRecvs];
};

struct RecvItem {
  RecvRequest* req = nullptr;
  int buffer = 0;
  std::uint8_t* dst = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t got = 0;
  bool chunked = false;  // a ChunkHeader precedes the bytes (streams != 0)
  std::uint32_t chunkGot = 0;
  std::uint32_t seq = 0;
  std::uint64_t offset = 0;
  std::uint8_t chunk[wire::kChunkHeaderBytes];
};

class TcpRecvComm final : public RecvComm {
 public:
  explicit TcpRecvComm(TcpConnection c) : core_(std::move(c)), pool_(kMaxRequests) {
    const std::size_t streams = core_.conn_.fds.size();
    queues_.reserve(streams);
    // Each message adds at most one item per stream, and at most kMaxRequests * kMaxRecvs messages are matched.
    for (std::size_t s = 0; s < streams; ++s) queues_.emplace_back(kMaxRequests * kMaxRecvs);
    blocked_.assign(streams, 0);
    for (RecvRequest& r : pool_) {
      r.owner = this;
      free_.push_back(&r);
    }
    posted_.reserve(kMaxRequests);
  }

  Result irecv(int n, void** data, const std::size_t* sizes, const int* tags, MemHandle** mhs,
               Request** request) noexcept override {
    if (request == nullptr) return core_.misuse("irecv with a null request pointer");
    *request = nullptr;
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr || mhs == nullptr) {
      warn(core_.conn_.log, "irecv: " + std::to_string(n) + " buffers (expected 1.." + std::to_string(kMaxRecvs) +
                                " with non-null arrays), peer " + core_.conn_.peer);
      return Result::kInvalidUsage;
    }
    for (int i = 0; i < n; ++i) {
      if (!core_.inRegistration(data[i], sizes[i], mhs[i], "irecv")) return Result::kInvalidArgument;
    }
    if (free_.empty()) {
      progress();
      return core_.failed_;
    }
    RecvRequest* req = free_.back();
    free_.pop_back();
    req->used = true;
    req->n = n;
    req->unmatched = n;
    for (int i = 0; i < n; ++i) {
      req->buffers[i] = RecvBuffer{static_cast<std::uint8_t*>(data[i]), sizes[i], tags[i], false, 0, 0};
    }
    posted_.push_back(req);
    unmatched_ += n;
    core_.busyStart();
    progress();
    *request = req;
    return core_.failed_;
  }

  Result iflush(int, void**, const int*, MemHandle**, Request** request) noexcept override {
    if (request != nullptr) *request = nullptr;
    return core_.failed_;
  }

  Result test(Request* request, int* done, int* sizes) noexcept override {
    if (done != nullptr) *done = 0;
    auto* req = static_cast<RecvRequest*>(request);
    if (req == nullptr || done == nullptr || req->owner != this || !req->used) {
      return core_.misuse(
          "receive test on a request that is not in flight on this comm "
          "(peer " +
          core_.conn_.peer + ")");
    }
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (!complete(*req)) progress();
    if (core_.failed_ != Result::kOk) return core_.failed_;
    if (!complete(*req)) return Result::kOk;
    *done = 1;
    for (int i = 0; i < req->n; ++i) {
      if (sizes != nullptr) sizes[i] = static_cast<int>(req->buffers[i].size);
    }
    req->used = false;
    posted_.erase(std::find(posted_.begin(), posted_.end(), req));
    free_.push_back(req);
    core_.busyEnd(false);
    return Result::kOk;
  }

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept override {
    return core_.regMr(data, size, type, mh);
  }
  Result regMrDmaBuf(void*, std::size_t, int, std::uint64_t, int, MemHandle** mh) noexcept override {
    if (mh != nullptr) *mh = nullptr;
    warn(core_.conn_.log, "regMrDmaBuf: the TCP transport does not support DMA-BUF registration");
    return Result::kInvalidUsage;
  }
  Result deregMr(MemHandle* mh) noexcept override { return core_.deregMr(mh); }

 private:
  static bool complete(const RecvRequest& req) {
    if (req.unmatched > 0) return false;
    for (int i = 0; i < req.n; ++i) {
      if (req.buffers[i].remaining > 0) return false;
    }
    return true;
  }

  enum class Io { kMoved, kWouldBlock, kFailed };

  // recvmsg with EOF and errors turned into the comm's failure.
  Io receive(std::size_t s, iovec* iov, int n, int flags, std::uint64_t* got, const char* what) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    for (;;) {
      const ssize_t rc = ::recvmsg(core_.conn_.fds[s].get(), &msg, flags | MSG_DONTWAIT);
      if (rc > 0) {
        *got = static_cast<std::uint64_t>(rc);
        return Io::kMoved;
      }
      if (rc == 0) {
        core_.fail(Result::kRemoteError,
                   "peer closed " + core_.streamName(s) + " while " + what + " (connection lost or peer died)");
        return Io::kFailed;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        blocked_[s] = 1;
        return Io::kWouldBlock;
      }
      core_.fail(Result::kRemoteError,
                 "recv on " + core_.streamName(s) + " failed while " + what + ": " + std::strerror(errno));
      return Io::kFailed;
    }
  }

  Io receive(std::size_t s, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t* got, const char* what) {
    iovec iov{dst, bytes};
    return receive(s, &iov, 1, 0, got, what);
  }

  void progress() {
    if (core_.failed_ != Result::kOk) return;
    bool movedAny = false;
    for (int pass = 0; pass < kMaxProgressPasses; ++pass) {
      bool moved = false;
      // Stream 0 is read for the next header only when its parts of earlier messages are in and a buffer waits.
      const bool wantHeader = queues_[0].empty() && unmatched_ > 0;
      bool want[wire::kMaxStreams];
      for (std::size_t s = 0; s < queues_.size(); ++s) want[s] = !queues_[s].empty();
      want[0] = want[0] || wantHeader;
      pollBlocked(core_.conn_.fds, want, blocked_, POLLIN);
      if (wantHeader && blocked_[0] == 0 && !readHeader(&moved)) return;
      for (std::size_t s = 0; s < queues_.size(); ++s) {
        if (blocked_[s] == 0 && !readParts(s, &moved)) return;
      }
      if (!moved) break;
      movedAny = true;
    }
    const bool stalled = !movedAny && !posted_.empty();
    if (stalled && !stalled_) countAdd(&core_.peerRec_->stalls, 1);
    stalled_ = stalled;
  }

  // The header is peeked whole (one call), then consumed together with the start of stream 0's part, which is read
  // straight into the user buffer: two calls per small message, and payload bytes are never staged.
  bool readHeader(bool* moved) {
    std::uint64_t got = 0;
    if (headerGot_ > 0) return readHeaderRest(moved);
    iovec peek{header_, sizeof(header_)};
    Io io = receive(0, &peek, 1, MSG_PEEK, &got, "waiting for a message header");
    if (io != Io::kMoved) return io != Io::kFailed;
    wire::MessageHeader h;
    std::size_t consumed = 0, needed = 0;
    std::string error;
    const wire::Decode d = wire::decodeMessageHeader(header_, got, static_cast<int>(queues_.size()), kMaxMessageBytes,
                                                     &h, &consumed, &needed, &error);
    if (d == wire::Decode::kCorrupt) {
      core_.fail(Result::kRemoteError, "corrupt frame on " + core_.streamName(0) + ": " + error);
      return false;
    }
    if (d == wire::Decode::kNeedMore) {
      // Part of a header: take it out of the socket (so that EOF or the rest is seen) and finish it incrementally.
      io = receive(0, header_, got, &got, "reading a message header");
      if (io == Io::kFailed) return false;
      headerGot_ = io == Io::kMoved ? got : 0;
      *moved = headerGot_ > 0;
      return true;
    }
    if (!match(h)) return false;
    iovec iov[2] = {{header_, consumed}, {}};
    RecvItem* first = h.partCount > 0 && h.parts[0].stream == 0 ? &queues_[0].front() : nullptr;
    if (first != nullptr) iov[1] = iovec{first->dst, first->bytes};
    io = receive(0, iov, first != nullptr ? 2 : 1, 0, &got, "reading a message header");
    if (io == Io::kFailed) return false;
    if (io != Io::kMoved || got < consumed) {  // the peeked bytes cannot vanish from the socket
      core_.fail(Result::kInternalError,
                 "stream 0 of the connection with " + core_.conn_.peer + " returned fewer header bytes than it showed");
      return false;
    }
    *moved = true;
    if (first != nullptr) first->got = got - consumed;
    return true;
  }

  // A header that arrived in pieces: read exactly what it still needs.
  bool readHeaderRest(bool* moved) {
    for (;;) {
      wire::MessageHeader h;
      std::size_t consumed = 0, needed = 0;
      std::string error;
      const wire::Decode d = wire::decodeMessageHeader(header_, headerGot_, static_cast<int>(queues_.size()),
                                                       kMaxMessageBytes, &h, &consumed, &needed, &error);
      if (d == wire::Decode::kCorrupt) {
        core_.fail(Result::kRemoteError, "corrupt frame on " + core_.streamName(0) + ": " + error);
        return false;
      }
      if (d == wire::Decode::kOk) {
        headerGot_ = 0;
        return match(h);
      }
      std::uint64_t got = 0;
      const Io io = receive(0, header_ + headerGot_, needed - headerGot_, &got, "reading a message header");
      if (io != Io::kMoved) return io != Io::kFailed;
      *moved = true;
      headerGot_ += got;
    }
  }

  bool match(const wire::MessageHeader& h) {
    if (h.seq != seq_) {
      core_.fail(Result::kRemoteError, "message sequence number " + std::to_string(h.seq) + " from " +
                                           core_.conn_.peer + ", expected " + std::to_string(seq_) +
                                           " (corrupt or reordered stream)");
      return false;
    }
    ++seq_;
    RecvRequest* req = nullptr;
    for (RecvRequest* r : posted_) {
      if (r->unmatched > 0) {
        req = r;
        break;
      }
    }
    int b = -1;
    for (int i = 0; req != nullptr && i < req->n && b < 0; ++i) {
      if (!req->buffers[i].matched && req->buffers[i].tag == h.tag) b = i;
    }
    if (b < 0) {
      std::string tags;  // for the error only: nothing is formatted on the per-message path
      for (int i = 0; req != nullptr && i < req->n; ++i) {
        if (req->buffers[i].matched) continue;
        if (!tags.empty()) tags += ',';
        // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict inside `"," + std::string`.
        tags += std::to_string(req->buffers[i].tag);
      }
      core_.fail(Result::kInvalidUsage, "message with tag " + std::to_string(h.tag) + " (" + std::to_string(h.size) +
                                            " bytes) from " + core_.conn_.peer +
                                            " matches no buffer of the oldest posted receive (unmatched tags " + tags +
                                            ")");
      return false;
    }
    RecvBuffer& buf = req->buffers[b];
    if (h.size > buf.capacity) {
      core_.fail(Result::kInvalidUsage, "message of " + std::to_string(h.size) + " bytes (tag " +
                                            std::to_string(h.tag) + ") from " + core_.conn_.peer +
                                            " is larger than the posted receive buffer of " +
                                            std::to_string(buf.capacity) + " bytes");
      return false;
    }
    buf.matched = true;
    buf.size = h.size;
    buf.remaining = h.size;
    --req->unmatched;
    --unmatched_;
    if (h.size == 0) countRecv(core_.peerRec_, 0);
    std::uint64_t offset = 0;
    for (int i = 0; i < h.partCount; ++i) {
      RecvItem item;
      item.req = req;
      item.buffer = b;
      item.dst = buf.data + offset;
      item.bytes = h.parts[i].bytes;
      item.chunked = h.parts[i].stream != 0;
      item.seq = h.seq;
      item.offset = offset;
      queues_[h.parts[i].stream].push(item);
      offset += h.parts[i].bytes;
    }
    return true;
  }

  bool readParts(std::size_t s, bool* moved) {
    Ring<RecvItem>& q = queues_[s];
    while (!q.empty()) {
      RecvItem& item = q.front();
      while (item.chunked && item.chunkGot < wire::kChunkHeaderBytes) {
        std::uint64_t got = 0;
        const Io io = receive(s, item.chunk + item.chunkGot, wire::kChunkHeaderBytes - item.chunkGot, &got,
                              "waiting for a chunk header");
        if (io == Io::kFailed) return false;
        if (io == Io::kWouldBlock) return true;
        *moved = true;
        item.chunkGot += static_cast<std::uint32_t>(got);
        wire::ChunkHeader c;
        std::string error;
        const wire::Decode d = wire::decodeChunkHeader(item.chunk, item.chunkGot, &c, &error);
        if (d == wire::Decode::kCorrupt) {
          core_.fail(Result::kRemoteError, "corrupt frame on " + core_.streamName(s) + ": " + error);
          return false;
        }
        if (d == wire::Decode::kOk && (c.seq != item.seq || c.offset != item.offset || c.bytes != item.bytes)) {
          core_.fail(Result::kRemoteError, "corrupt frame on " + core_.streamName(s) + ": chunk (seq " +
                                               std::to_string(c.seq) + ", offset " + std::to_string(c.offset) + ", " +
                                               std::to_string(c.bytes) + " bytes), expected (seq " +
                                               std::to_string(item.seq) + ", offset " + std::to_string(item.offset) +
                                               ", " + std::to_string(item.bytes) + " bytes)");
          return false;
        }
      }
      while (item.got < item.bytes) {
        std::uint64_t got = 0;
        const Io io = receive(s, item.dst + item.got, item.bytes - item.got, &got, "receiving message bytes");
        if (io == Io::kFailed) return false;
        if (io == Io::kWouldBlock) return true;
        *moved = true;
        item.got += got;
      }
      RecvBuffer& buf = item.req->buffers[item.buffer];
      buf.remaining -= item.bytes;
      countRecv(core_.nicRecs_[static_cast<std::size_t>(core_.conn_.railOfStream[s])], item.bytes);
      if (buf.remaining == 0) countRecv(core_.peerRec_, buf.size);
      q.pop();
    }
    return true;
  }

  CommCore core_;
  std::vector<RecvRequest> pool_;
  std::vector<RecvRequest*> free_;
  std::vector<RecvRequest*> posted_;  // in posting order
  std::vector<Ring<RecvItem>> queues_;
  std::vector<char> blocked_;  // by stream: the last recv would have blocked
  bool stalled_ = false;       // the last progress call moved nothing while a receive waited
  int unmatched_ = 0;          // unmatched buffers over all posted receives
  std::uint32_t seq_ = 0;
  std::uint8_t header_[wire::kMaxMessageHeaderBytes];
  std::size_t headerGot_ = 0;  // > 0: a header arrived in pieces and is being completed
};

}  // namespace

std::unique_ptr<SendComm> makeTcpSendComm(TcpConnection connection) {
  return std::make_unique<TcpSendComm>(std::move(connection));
}

std::unique_ptr<RecvComm> makeTcpRecvComm(TcpConnection connection) {
  return std::make_unique<TcpRecvComm>(std::move(connection));
}

}  // namespace optiflow::net::detail
