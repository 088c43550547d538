// RDMA endpoints: one side of a connection's CQ, RC queue pair (INIT -> RTR -> RTS) and registered control memory.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "ib_comm.h"
#include "optiflow/net/wire.h"

namespace optiflow::net::ib {
namespace {

constexpr int kSendQueueDepth = 2 * kSendSlots + 8;  // data write + size write per isend
constexpr int kCqDepth = 1024;

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

}  // namespace

std::uint64_t randomU64() {
  static std::mutex mutex;
  static std::mt19937_64 engine{
      std::random_device{}() ^ static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::lock_guard lock(mutex);
  return engine();
}

Endpoint::~Endpoint() {
  const VerbsApi& api = *device_->api;
  if (flushQp_ != nullptr) api.destroyQp(flushQp_);
  if (qp_ != nullptr) api.destroyQp(qp_);
  if (cq_ != nullptr) api.destroyCq(cq_);
  if (memMr_ != nullptr) api.deregMr(memMr_);
  std::free(mem_);
}

bool Endpoint::create(std::string* error) {
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

QpInfo Endpoint::localInfo(std::uint64_t listenId) const {
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

bool Endpoint::connect(const QpInfo& remote, std::string* error) {
  const bool remoteEthernet = remote.linkLayer == IBV_LINK_LAYER_ETHERNET;
  if (remoteEthernet != device_->ethernet()) {
    return fail(error, strf("link layer mismatch: %s is %s, the peer's port is %s", device_->port.props.name.c_str(),
                            device_->ethernet() ? "Ethernet (RoCE)" : "InfiniBand",
                            remoteEthernet ? "Ethernet (RoCE)" : "InfiniBand"));
  }
  return toRts(device_, qp_, remote, psn_, error);
}

bool Endpoint::postRecv(std::string* error) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, 0);
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  ibv_recv_wr* bad = nullptr;
  const int rc = device_->api->postRecv(qp_, &wr, &bad);
  if (rc != 0) return fail(error, strf("ibv_post_recv failed: %s", std::strerror(rc)));
  return true;
}

ibv_qp* Endpoint::createQp(int recvWrs, std::string* error) {
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

}  // namespace optiflow::net::ib
