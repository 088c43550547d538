// The RDMA verbs transport's data path ("OptiFlow-IB"): one RC queue pair per connection, set up over a TCP bootstrap
// socket (ib_transport.cc), with receiver-driven flow control (docs/net-rdma.md):
// - irecv RDMA-writes one clear-to-send entry per buffer {addr, rkey, size, tag, seq} into the sender's CTS FIFO;
// - isend waits (null request) until the oldest FIFO slot is complete and holds its tag, then RDMA-writes the bytes
//   straight into the receive buffer, followed by an RDMA write-with-immediate of the size into the receiver's size
//   table (imm = the receive's sequence number), which is what completes the receive on the other side.
// Every verbs call goes through a VerbsApi table (ib_verbs.h) so that the tests can run all of this on fake devices.
#include <endian.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "ib_comm.h"

namespace optiflow::net::ib {
namespace {

constexpr int kPeerCheckInterval = 128;  // empty polls between looks at the bootstrap socket

// The first request of a fixed pool that is not in use, or null when all are.
template <typename Req, std::size_t N>
Req* firstFree(std::array<Req, N>& pool) {
  for (Req& r : pool) {
    if (!r.used) return &r;
  }
  return nullptr;
}

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

// What both comm kinds have alike: the link, and registrations, which belong to the device (one PD per device:
// regIsGlobal) rather than to the comm.
template <typename Base>
class IbComm : public Base {
 public:
  IbComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer)
      : link_(std::move(endpoint), std::move(socket), std::move(peer)) {}

  Result regMr(void* data, std::size_t size, int type, MemHandle** mh) noexcept override {
    return regMrOn(link_.device(), data, size, type, mh);
  }
  Result regMrDmaBuf(void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                     MemHandle** mh) noexcept override {
    return regDmaBufOn(link_.device(), data, size, type, offset, fd, mh);
  }
  Result deregMr(MemHandle* mh) noexcept override { return deregOn(link_.device(), mh); }

 protected:
  Link link_;
};

// ---- send comm ------------------------------------------------------------------------------------------------------

class IbSendComm final : public IbComm<SendComm> {
 public:
  IbSendComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer, const QpInfo& remote)
      : IbComm(std::move(endpoint), std::move(socket), std::move(peer)),
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
    SendReq* req = firstFree(reqs_);
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

  std::uint64_t sizesAddr_;
  std::uint32_t sizesRkey_;
  std::array<SendReq, kSendSlots> reqs_;
  std::uint64_t consumed_ = 0;  // FIFO slots fully sent
  std::array<bool, kMaxRecvs> used_{};
  std::uint32_t usedCount_ = 0;
};

// ---- receive comm ---------------------------------------------------------------------------------------------------

class IbRecvComm final : public IbComm<RecvComm> {
 public:
  IbRecvComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer, const QpInfo& remote)
      : IbComm(std::move(endpoint), std::move(socket), std::move(peer)),
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
    FlushReq* req = firstFree(flushes_);
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

  std::uint64_t fifoAddr_;
  std::uint32_t fifoRkey_;
  std::array<RecvReq, kMaxRequests> reqs_;  // slot = (seq - 1) % kMaxRequests
  std::array<FlushReq, kMaxRequests> flushes_;
  std::uint64_t posted_ = 0;
};

}  // namespace

std::unique_ptr<SendComm> makeIbSendComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer,
                                         const QpInfo& remote) {
  return std::unique_ptr<SendComm>(new (std::nothrow)
                                       IbSendComm(std::move(endpoint), std::move(socket), std::move(peer), remote));
}

std::unique_ptr<RecvComm> makeIbRecvComm(std::unique_ptr<Endpoint> endpoint, Fd socket, std::string peer,
                                         const QpInfo& remote) {
  return std::unique_ptr<RecvComm>(new (std::nothrow)
                                       IbRecvComm(std::move(endpoint), std::move(socket), std::move(peer), remote));
}

}  // namespace optiflow::net::ib
