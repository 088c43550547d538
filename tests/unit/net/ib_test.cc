// The RDMA transport: what happens without a device (this machine), the verbs loader, the handle and QP-info codecs,
// and -- through a fake verbs table that performs RDMA writes/reads as memcpy between registered buffers of this
// process -- discovery and the whole connection and data path. The fake runs everything synchronously in one
// thread, so it checks the protocol (CTS FIFO, sizes, immediates, rkeys, bounds, failures), not timing or a NIC.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"

#if defined(OPTIFLOW_HAVE_IBVERBS)
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>

#include "../../net/src/ib_verbs.h"
#include "optiflow/net/wire.h"
#endif

namespace optiflow::net {
namespace {

bool hostHasRdmaDevice() {
  std::error_code ec;
  return std::filesystem::exists("/sys/class/infiniband", ec) &&
         !std::filesystem::is_empty("/sys/class/infiniband", ec);
}

TEST(NetIb, MakeIbTransportWithoutDeviceNamesTheCause) {
  if (hostHasRdmaDevice()) GTEST_SKIP() << "this host has an RDMA device";
  std::string error;
  std::vector<std::string> logs;
  auto transport = makeIbTransport(
      {}, [&](int, const std::string& m) { logs.push_back(m); }, nullptr, &error);
  EXPECT_EQ(transport, nullptr);
#if defined(OPTIFLOW_HAVE_IBVERBS)
  // Without the kernel module the list is NULL (ENOSYS) or empty; without the library, dlopen fails.
  const bool named = error.find("ibv_get_device_list") != std::string::npos ||
                     error.find("no RDMA device") != std::string::npos ||
                     error.find("no active RDMA port") != std::string::npos ||
                     error.find("cannot load libibverbs") != std::string::npos;
  EXPECT_TRUE(named) << error;
#else
  EXPECT_EQ(error, "built without rdma-core (libibverbs-dev)");
#endif
}

TEST(NetIb, MakeTransportFallsBackToTcpAndKIbFails) {
  if (hostHasRdmaDevice()) GTEST_SKIP() << "this host has an RDMA device";
  std::string ibError;
  EXPECT_EQ(makeIbTransport({}, nullptr, nullptr, &ibError), nullptr);

  LocalTelemetry telemetry;
  Options options;
  options.kind = TransportKind::kAuto;
  std::string error;
  auto transport = makeTransport(options, nullptr, &telemetry, &error);
  ASSERT_NE(transport, nullptr) << error;
  EXPECT_STREQ(transport->name(), "OptiFlow");

  options.kind = TransportKind::kIb;
  error.clear();
  EXPECT_EQ(makeTransport(options, nullptr, &telemetry, &error), nullptr);
  EXPECT_NE(error.find(ibError), std::string::npos) << "kIb error '" << error << "' lacks '" << ibError << "'";
}

#if defined(OPTIFLOW_HAVE_IBVERBS)
using ib::VerbsApi;

TEST(NetIbVerbs, LoaderFailsCleanlyOnMissingLibrary) {
  VerbsApi api;
  std::string error;
  EXPECT_FALSE(ib::loadVerbs("/nonexistent/libibverbs.so.1", &api, &error));
  EXPECT_NE(error.find("cannot load /nonexistent/libibverbs.so.1"), std::string::npos) << error;
  EXPECT_EQ(api.getDeviceList, nullptr);
  // A library that exists but is not libibverbs: a named missing symbol, not a crash.
  error.clear();
  EXPECT_FALSE(ib::loadVerbs("libc.so.6", &api, &error));
  EXPECT_NE(error.find("lacks ibv_get_device_list"), std::string::npos) << error;
}

TEST(NetIbVerbs, RealLibraryResolvesEverySymbol) {
  VerbsApi api;
  std::string error;
  ASSERT_TRUE(ib::loadVerbs(ib::kVerbsLibrary, &api, &error)) << error;
  EXPECT_NE(api.queryPort, nullptr);
  EXPECT_NE(api.postSend, nullptr);
  EXPECT_NE(api.pollCq, nullptr);
  EXPECT_NE(api.regDmabufMr, nullptr);  // rdma-core 44 has it
  if (hostHasRdmaDevice()) return;
  ib::Discovery discovery;
  EXPECT_FALSE(ib::discover(api, {}, "/sys", &discovery, &error));
  EXPECT_TRUE(error.find("ibv_get_device_list") != std::string::npos ||
              error.find("no RDMA device") != std::string::npos)
      << error;
  EXPECT_TRUE(discovery.ports.empty());
}

TEST(NetIbVerbs, PortSpeed) {
  EXPECT_EQ(ib::portSpeedMbps(32, 2), 100000);   // EDR 4x
  EXPECT_EQ(ib::portSpeedMbps(64, 2), 200000);   // HDR 4x
  EXPECT_EQ(ib::portSpeedMbps(128, 2), 400000);  // NDR 4x
  EXPECT_EQ(ib::portSpeedMbps(1, 1), 2500);
  EXPECT_EQ(ib::portSpeedMbps(3, 2), 0);
}

// ---- codecs
// ----------------------------------------------------------------------------------------------------------

ib::IbHandle sampleHandle() {
  ib::IbHandle h;
  h.buildId = wire::buildId();
  h.listenId = 0x1122334455667788ULL;
  h.family = AF_INET;
  h.port = 40123;
  h.addr[0] = 10;
  h.addr[3] = 7;
  return h;
}

TEST(NetIbCodec, HandleRoundTrip) {
  std::uint8_t bytes[kHandleBytes];
  std::memset(bytes, 0xee, sizeof(bytes));
  ib::encodeIbHandle(sampleHandle(), bytes);
  for (std::size_t i = ib::kIbHandleBytes; i < kHandleBytes; ++i) ASSERT_EQ(bytes[i], 0) << i;
  EXPECT_EQ(bytes[6], static_cast<std::uint8_t>(wire::TransportKind::kIb));  // common prefix: kind at byte 6
  ib::IbHandle out;
  std::string error;
  ASSERT_TRUE(ib::decodeIbHandle(bytes, &out, &error)) << error;
  EXPECT_EQ(out.listenId, 0x1122334455667788ULL);
  EXPECT_EQ(out.port, 40123);
  EXPECT_EQ(out.family, AF_INET);
  EXPECT_EQ(out.addr[0], 10);
  EXPECT_EQ(out.addr[3], 7);
}

TEST(NetIbCodec, HandleCorruptionIsRefused) {
  std::uint8_t good[kHandleBytes];
  ib::encodeIbHandle(sampleHandle(), good);
  ib::IbHandle out;
  std::string error;
  // Every flipped bit of the 48 meaningful bytes is caught (magic, version, kind or checksum).
  for (std::size_t i = 0; i < ib::kIbHandleBytes; ++i) {
    std::uint8_t bytes[kHandleBytes];
    std::memcpy(bytes, good, sizeof(bytes));
    bytes[i] ^= 0x10;
    EXPECT_FALSE(ib::decodeIbHandle(bytes, &out, &error)) << "byte " << i;
  }
  std::uint8_t bytes[kHandleBytes];
  std::memcpy(bytes, good, sizeof(bytes));
  bytes[0] ^= 1;
  EXPECT_FALSE(ib::decodeIbHandle(bytes, &out, &error));
  EXPECT_NE(error.find("not an OptiFlow net handle"), std::string::npos) << error;
  std::memcpy(bytes, good, sizeof(bytes));
  bytes[30] ^= 1;
  EXPECT_FALSE(ib::decodeIbHandle(bytes, &out, &error));
  EXPECT_NE(error.find("bad checksum"), std::string::npos) << error;

  ib::IbHandle other = sampleHandle();
  other.buildId ^= 1;
  ib::encodeIbHandle(other, bytes);
  EXPECT_FALSE(ib::decodeIbHandle(bytes, &out, &error));
  EXPECT_NE(error.find("another build"), std::string::npos) << error;

  wire::TcpHandle tcp;
  tcp.buildId = wire::buildId();
  tcp.railCount = 1;
  tcp.rails[0].family = AF_INET;
  tcp.rails[0].port = 1234;
  ASSERT_TRUE(wire::encodeTcpHandle(tcp, bytes));
  EXPECT_FALSE(ib::decodeIbHandle(bytes, &out, &error));
  EXPECT_NE(error.find("not IB"), std::string::npos) << error;
}

ib::QpInfo sampleInfo() {
  ib::QpInfo info;
  info.role = ib::Role::kReceiver;
  info.linkLayer = IBV_LINK_LAYER_ETHERNET;
  info.buildId = wire::buildId();
  info.listenId = 42;
  info.qpn = 0xabcde;
  info.psn = 0x123456;
  info.lid = 17;
  info.mtu = IBV_MTU_4096;
  for (int i = 0; i < 16; ++i) info.gid[i] = static_cast<std::uint8_t>(i * 3);
  info.memAddr = 0x7f0000001000ULL;
  info.memRkey = 0xdeadbeef;
  return info;
}

TEST(NetIbCodec, QpInfoRoundTripAndCorruption) {
  std::uint8_t bytes[ib::kQpInfoBytes];
  ib::encodeQpInfo(sampleInfo(), bytes);
  ib::QpInfo out;
  std::string error;
  ASSERT_TRUE(ib::decodeQpInfo(bytes, &out, &error)) << error;
  EXPECT_EQ(out.role, ib::Role::kReceiver);
  EXPECT_EQ(out.linkLayer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(out.listenId, 42u);
  EXPECT_EQ(out.qpn, 0xabcdeu);
  EXPECT_EQ(out.psn, 0x123456u);
  EXPECT_EQ(out.lid, 17);
  EXPECT_EQ(out.mtu, IBV_MTU_4096);
  EXPECT_EQ(out.gid[15], 45);
  EXPECT_EQ(out.memAddr, 0x7f0000001000ULL);
  EXPECT_EQ(out.memRkey, 0xdeadbeefu);

  for (std::size_t i = 0; i < ib::kQpInfoBytes; ++i) {
    std::uint8_t bad[ib::kQpInfoBytes];
    std::memcpy(bad, bytes, sizeof(bad));
    bad[i] ^= 0x01;
    EXPECT_FALSE(ib::decodeQpInfo(bad, &out, &error)) << "byte " << i;
  }
  const auto refused = [&](ib::QpInfo info, const char* expected) {
    std::uint8_t b[ib::kQpInfoBytes];
    ib::encodeQpInfo(info, b);
    std::string why;
    EXPECT_FALSE(ib::decodeQpInfo(b, &out, &why));
    EXPECT_NE(why.find(expected), std::string::npos) << why;
  };
  ib::QpInfo info = sampleInfo();
  info.buildId ^= 4;
  refused(info, "another build");
  info = sampleInfo();
  info.mtu = 9;
  refused(info, "MTU code 9");
  info = sampleInfo();
  info.qpn = 0x1000000;
  refused(info, "24 bits");
  info = sampleInfo();
  info.role = static_cast<ib::Role>(7);
  refused(info, "role 7");
  info = sampleInfo();
  info.memAddr = 0;
  refused(info, "null control-memory");
}

// ---- fake verbs
// ------------------------------------------------------------------------------------------------------

namespace fake {

struct Cq {
  ibv_cq cq{};
  std::deque<ibv_wc> wcs;
};
struct Qp {
  ibv_qp qp{};
  Cq* sendCq = nullptr;
  Cq* recvCq = nullptr;
  std::uint32_t remote = 0;
  ibv_qp_state state = IBV_QPS_RESET;
  std::deque<std::uint64_t> recvs;
};
struct Mr {
  ibv_mr mr{};
  int access = 0;
};
struct DeviceSpec {
  std::string name;
  std::uint64_t guid = 0;
  std::vector<ibv_port_attr> ports;
};

struct World {
  std::vector<DeviceSpec> specs;
  std::vector<std::unique_ptr<ibv_device>> devices;
  std::map<ibv_context*, std::unique_ptr<ibv_context>> contexts;
  std::map<std::uint32_t, Qp*> qps;
  std::map<std::uint32_t, Mr*> mrs;  // by key (lkey == rkey)
  std::uint32_t nextQpn = 0x100;
  std::uint32_t nextKey = 1;
  int opened = 0, closed = 0, pds = 0, failNextWrite = 0, errnoOnList = 0;
  bool returnNullList = false;
  std::size_t liveMrs() const { return mrs.size(); }
};
World* world = nullptr;

ibv_port_attr port(ibv_port_state state, std::uint8_t linkLayer) {
  ibv_port_attr a{};
  a.state = state;
  a.active_mtu = IBV_MTU_4096;
  a.max_mtu = IBV_MTU_4096;
  a.gid_tbl_len = 4;
  a.lid = 5;
  a.active_speed = 32;  // EDR
  a.active_width = 2;   // 4x
  a.link_layer = linkLayer;
  return a;
}

int deviceIndex(ibv_device* d) {
  for (std::size_t i = 0; i < world->devices.size(); ++i) {
    if (world->devices[i].get() == d) return static_cast<int>(i);
  }
  return -1;
}
int contextIndex(ibv_context* c) { return deviceIndex(c->device); }

Mr* findMr(std::uint32_t key, std::uint64_t addr, std::uint64_t length, int access) {
  auto it = world->mrs.find(key);
  if (it == world->mrs.end()) return nullptr;
  Mr* mr = it->second;
  const auto begin = reinterpret_cast<std::uint64_t>(mr->mr.addr);
  if (addr < begin || addr + length > begin + mr->mr.length) return nullptr;
  if ((mr->access & access) != access) return nullptr;
  return mr;
}

void complete(Cq* cq, std::uint64_t wrId, ibv_wc_status status, ibv_wc_opcode opcode) {
  ibv_wc wc{};
  wc.wr_id = wrId;
  wc.status = status;
  wc.opcode = opcode;
  cq->wcs.push_back(wc);
}

int postSend(ibv_qp* q, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* qp = world->qps.at(q->qp_num);
  if (qp->state != IBV_QPS_RTS) {
    *bad = wr;
    return EINVAL;
  }
  for (; wr != nullptr; wr = wr->next) {
    Qp* peer = world->qps.count(qp->remote) != 0 ? world->qps[qp->remote] : nullptr;
    const std::uint64_t length = wr->num_sge == 1 ? wr->sg_list[0].length : 0;
    const std::uint64_t local = wr->num_sge == 1 ? wr->sg_list[0].addr : 0;
    const bool localOk = length == 0 || findMr(wr->sg_list[0].lkey, local, length,
                                               wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0);
    ibv_wc_status status = IBV_WC_SUCCESS;
    if (world->failNextWrite > 0) {
      --world->failNextWrite;
      status = IBV_WC_RETRY_EXC_ERR;
    } else if (peer == nullptr || !localOk) {
      status = IBV_WC_LOC_PROT_ERR;
    } else if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      if (length > 0) {
        if (findMr(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, length, IBV_ACCESS_REMOTE_WRITE) == nullptr) {
          status = IBV_WC_REM_ACCESS_ERR;
        } else {
          std::memcpy(reinterpret_cast<void*>(wr->wr.rdma.remote_addr), reinterpret_cast<void*>(local), length);
        }
      }
      if (status == IBV_WC_SUCCESS && wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (peer->recvs.empty()) {
          status = IBV_WC_RNR_RETRY_EXC_ERR;
        } else {
          ibv_wc wc{};
          wc.wr_id = peer->recvs.front();
          peer->recvs.pop_front();
          wc.status = IBV_WC_SUCCESS;
          wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
          wc.wc_flags = IBV_WC_WITH_IMM;
          wc.imm_data = wr->imm_data;
          wc.byte_len = static_cast<std::uint32_t>(length);
          peer->recvCq->wcs.push_back(wc);
        }
      }
    } else if (wr->opcode == IBV_WR_RDMA_READ) {
      if (findMr(wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, length, IBV_ACCESS_REMOTE_READ) == nullptr) {
        status = IBV_WC_REM_ACCESS_ERR;
      } else {
        std::memcpy(reinterpret_cast<void*>(local), reinterpret_cast<void*>(wr->wr.rdma.remote_addr), length);
      }
    } else {
      status = IBV_WC_GENERAL_ERR;
    }
    if (status != IBV_WC_SUCCESS) {
      complete(qp->sendCq, wr->wr_id, status, IBV_WC_RDMA_WRITE);
      qp->state = IBV_QPS_ERR;
      return 0;
    }
    if ((wr->send_flags & IBV_SEND_SIGNALED) != 0) {
      complete(qp->sendCq, wr->wr_id, IBV_WC_SUCCESS,
               wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE);
    }
  }
  return 0;
}

VerbsApi api() {
  VerbsApi a;
  a.getDeviceList = [](int* count) -> ibv_device** {
    if (world->returnNullList) {
      errno = world->errnoOnList;
      return nullptr;
    }
    auto** list = new ibv_device*[world->devices.size() + 1];
    for (std::size_t i = 0; i < world->devices.size(); ++i) list[i] = world->devices[i].get();
    list[world->devices.size()] = nullptr;
    *count = static_cast<int>(world->devices.size());
    return list;
  };
  a.freeDeviceList = [](ibv_device** list) { delete[] list; };
  a.getDeviceName = [](ibv_device* d) { return world->specs[static_cast<std::size_t>(deviceIndex(d))].name.c_str(); };
  a.getDeviceGuid = [](ibv_device* d) -> __be64 {
    return htobe64(world->specs[static_cast<std::size_t>(deviceIndex(d))].guid);
  };
  a.openDevice = [](ibv_device* d) -> ibv_context* {
    auto context = std::make_unique<ibv_context>();
    context->device = d;
    ibv_context* raw = context.get();
    world->contexts[raw] = std::move(context);
    ++world->opened;
    return raw;
  };
  a.closeDevice = [](ibv_context* c) {
    world->contexts.erase(c);
    ++world->closed;
    return 0;
  };
  a.queryDevice = [](ibv_context* c, ibv_device_attr* attr) {
    *attr = {};
    attr->phys_port_cnt =
        static_cast<std::uint8_t>(world->specs[static_cast<std::size_t>(contextIndex(c))].ports.size());
    return 0;
  };
  a.queryPort = [](ibv_context* c, std::uint8_t p, ibv_port_attr* attr) {
    *attr = world->specs[static_cast<std::size_t>(contextIndex(c))].ports.at(p - 1u);
    return 0;
  };
  a.queryGid = [](ibv_context*, std::uint8_t, int index, ibv_gid* gid) {
    std::memset(gid, 0, sizeof(*gid));
    gid->raw[15] = static_cast<std::uint8_t>(index + 1);
    return 0;
  };
  a.allocPd = [](ibv_context* c) -> ibv_pd* {
    auto* pd = new ibv_pd{};
    pd->context = c;
    ++world->pds;
    return pd;
  };
  a.deallocPd = [](ibv_pd* pd) {
    delete pd;
    --world->pds;
    return 0;
  };
  a.regMr = [](ibv_pd* pd, void* addr, std::size_t length, int access) -> ibv_mr* {
    auto* mr = new Mr;
    mr->mr.pd = pd;
    mr->mr.addr = addr;
    mr->mr.length = length;
    mr->mr.lkey = mr->mr.rkey = world->nextKey++;
    mr->access = access | IBV_ACCESS_LOCAL_WRITE;
    world->mrs[mr->mr.lkey] = mr;
    return &mr->mr;
  };
  a.deregMr = [](ibv_mr* mr) {
    auto it = world->mrs.find(mr->lkey);
    if (it == world->mrs.end()) return EINVAL;
    delete it->second;
    world->mrs.erase(it);
    return 0;
  };
  a.createCq = [](ibv_context*, int, void*, ibv_comp_channel*, int) -> ibv_cq* { return &(new Cq)->cq; };
  a.destroyCq = [](ibv_cq* cq) {
    delete reinterpret_cast<Cq*>(cq);
    return 0;
  };
  a.createQp = [](ibv_pd*, ibv_qp_init_attr* init) -> ibv_qp* {
    auto* qp = new Qp;
    qp->qp.qp_num = world->nextQpn++;
    qp->sendCq = reinterpret_cast<Cq*>(init->send_cq);
    qp->recvCq = reinterpret_cast<Cq*>(init->recv_cq);
    world->qps[qp->qp.qp_num] = qp;
    return &qp->qp;
  };
  a.modifyQp = [](ibv_qp* q, ibv_qp_attr* attr, int mask) {
    Qp* qp = world->qps.at(q->qp_num);
    if ((mask & IBV_QP_DEST_QPN) != 0) qp->remote = attr->dest_qp_num;
    qp->state = attr->qp_state;
    return 0;
  };
  a.destroyQp = [](ibv_qp* q) {
    auto it = world->qps.find(q->qp_num);
    delete it->second;
    world->qps.erase(it);
    return 0;
  };
  a.postSend = postSend;
  a.postRecv = [](ibv_qp* q, ibv_recv_wr* wr, ibv_recv_wr**) {
    for (; wr != nullptr; wr = wr->next) world->qps.at(q->qp_num)->recvs.push_back(wr->wr_id);
    return 0;
  };
  a.pollCq = [](ibv_cq* c, int entries, ibv_wc* wc) {
    Cq* cq = reinterpret_cast<Cq*>(c);
    int n = 0;
    while (n < entries && !cq->wcs.empty()) {
      wc[n++] = cq->wcs.front();
      cq->wcs.pop_front();
    }
    return n;
  };
  a.wcStatusStr = [](ibv_wc_status) { return "fake status"; };
  return a;
}

}  // namespace fake

class FakeVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::world = &world_;
    api_ = fake::api();
    char dir[] = "/tmp/optiflow-ib-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    root_ = dir;
    std::filesystem::create_directories(root_ + "/devices/pci0000:00/0000:00:03.0");
    std::filesystem::create_directories(root_ + "/class/infiniband/fake0");
    std::filesystem::create_symlink(root_ + "/devices/pci0000:00/0000:00:03.0",
                                    root_ + "/class/infiniband/fake0/device");
  }
  void TearDown() override {
    std::filesystem::remove_all(root_);
    fake::world = nullptr;
  }
  void addDevice(const std::string& name, std::uint64_t guid, std::vector<ibv_port_attr> ports) {
    world_.specs.push_back({name, guid, std::move(ports)});
    world_.devices.push_back(std::make_unique<ibv_device>());
  }
  void enableGpuDirect() { std::filesystem::create_directories(root_ + "/module/nvidia_peermem"); }

  fake::World world_;
  VerbsApi api_;
  std::string root_;
};

TEST_F(FakeVerbs, DiscoveryKeepsOnlyActivePorts) {
  addDevice(
      "fake0", 0x0102030405060708ULL,
      {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND), fake::port(IBV_PORT_DOWN, IBV_LINK_LAYER_INFINIBAND)});
  addDevice("fake1", 0x99, {fake::port(IBV_PORT_DOWN, IBV_LINK_LAYER_ETHERNET)});
  ib::Discovery d;
  std::string error;
  ASSERT_TRUE(ib::discover(api_, {}, root_, &d, &error)) << error;
  ASSERT_EQ(d.ports.size(), 1u);
  const DeviceProps& p = d.ports[0].props;
  EXPECT_EQ(p.name, "fake0:1");
  EXPECT_EQ(p.port, 1);
  EXPECT_EQ(p.guid, 0x0102030405060708ULL);
  EXPECT_EQ(p.pciPath, std::filesystem::canonical(root_ + "/devices/pci0000:00/0000:00:03.0").string());
  EXPECT_EQ(p.speedMbps, 100000);
  EXPECT_EQ(p.ptrSupport, kPtrHost);  // no nvidia-peermem under this root
  EXPECT_TRUE(p.regIsGlobal);
  EXPECT_EQ(p.maxRecvs, kMaxRecvs);
  ASSERT_EQ(d.devices.size(), 1u);
  EXPECT_EQ(world_.opened, 2);
  EXPECT_EQ(world_.closed, 1);  // fake1 has no usable port: closed right away
  ib::closeDiscovery(api_, &d);
  EXPECT_EQ(world_.closed, 2);

  enableGpuDirect();
  ASSERT_TRUE(ib::discover(api_, {}, root_, &d, &error)) << error;
  EXPECT_EQ(d.ports[0].props.ptrSupport, kPtrHost | kPtrCuda);
  ib::closeDiscovery(api_, &d);
}

TEST_F(FakeVerbs, DiscoveryErrorsNameTheCause) {
  ib::Discovery d;
  std::string error;
  world_.returnNullList = true;
  world_.errnoOnList = ENOSYS;
  EXPECT_FALSE(ib::discover(api_, {}, root_, &d, &error));
  EXPECT_NE(error.find("ibv_get_device_list: Function not implemented (ENOSYS): no RDMA kernel support"),
            std::string::npos)
      << error;
  world_.returnNullList = false;
  EXPECT_FALSE(ib::discover(api_, {}, root_, &d, &error));
  EXPECT_NE(error.find("no RDMA device"), std::string::npos) << error;

  addDevice("fake0", 1, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND), fake::port(IBV_PORT_DOWN, 1)});
  IbOptions options;
  options.devices = {"fake0:2"};
  EXPECT_FALSE(ib::discover(api_, options, root_, &d, &error));
  EXPECT_NE(error.find("'fake0:2' not found or has no usable port (fake0:2 is not ACTIVE"), std::string::npos) << error;
  options.devices = {"mlx5_9"};
  EXPECT_FALSE(ib::discover(api_, options, root_, &d, &error));
  EXPECT_NE(error.find("'mlx5_9' not found"), std::string::npos) << error;
  options.devices = {"fake0:x"};
  EXPECT_FALSE(ib::discover(api_, options, root_, &d, &error));
  EXPECT_NE(error.find("expected a device name or device:port"), std::string::npos) << error;
  options.devices = {"fake0:1"};
  ASSERT_TRUE(ib::discover(api_, options, root_, &d, &error)) << error;
  EXPECT_EQ(d.ports.size(), 1u);
  ib::closeDiscovery(api_, &d);
  EXPECT_EQ(world_.opened, world_.closed);
}

TEST_F(FakeVerbs, RoceGidPrefersIpv4RoceV2) {
  addDevice("fake0", 1, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET)});
  const std::string types = root_ + "/class/infiniband/fake0/ports/1/gid_attrs/types/";
  std::filesystem::create_directories(types);
  std::ofstream(types + "0") << "IB/RoCE v1\n";
  std::ofstream(types + "1") << "RoCE v2\n";
  // The fake's GIDs are ::1, ::2, ... : none IPv4-mapped, so the first RoCE v2 one wins.
  ib::Discovery d;
  std::string error;
  ASSERT_TRUE(ib::discover(api_, {}, root_, &d, &error)) << error;
  EXPECT_EQ(d.ports[0].gidIndex, 1);
  EXPECT_EQ(d.ports[0].gid.raw[15], 2);
  ib::closeDiscovery(api_, &d);
  IbOptions options;
  options.gidIndex = 9;
  EXPECT_FALSE(ib::discover(api_, options, root_, &d, &error));
  EXPECT_NE(error.find("GID index 9 does not exist"), std::string::npos) << error;
}

// A connected pair on the fake device, with telemetry and captured log lines.
struct Pair {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

class FakeTransport : public FakeVerbs {
 protected:
  // How long something that should happen promptly may take before the test calls it a hang: generous, so a loaded
  // CI machine or a sanitizer build does not fail it, yet a hang still fails.
  static constexpr auto kLiveness = std::chrono::seconds(30);

  std::unique_ptr<Transport> make() {
    std::string error;
    auto t = ib::makeIbTransportWith(
        &api_, {}, [this](int, const std::string& m) { logs_.push_back(m); }, &telemetry_, root_, &error);
    EXPECT_NE(t, nullptr) << error;
    return t;
  }
  bool connectPair(Pair* pair) {
    std::uint8_t handle[kHandleBytes];
    if (pair->transport->listen(0, handle, &pair->listen) != Result::kOk) return false;
    std::unique_ptr<Connector> connector;
    if (pair->transport->connect(0, handle, &connector) != Result::kOk) return false;
    const auto deadline = std::chrono::steady_clock::now() + kLiveness;
    while ((pair->send == nullptr || pair->recv == nullptr) && std::chrono::steady_clock::now() < deadline) {
      if (pair->send == nullptr && connector->step(&pair->send) != Result::kOk) return false;
      if (pair->recv == nullptr && pair->listen->accept(&pair->recv) != Result::kOk) return false;
    }
    return pair->send != nullptr && pair->recv != nullptr;
  }
  // Polls until done or an error; returns the last result, or kInternalError when it still runs after kLiveness.
  template <typename Comm>
  Result wait(Comm* comm, Request* request, int* sizes) {
    int done = 0;
    for (const auto start = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - start < kLiveness;) {
      const Result r = comm->test(request, &done, sizes);
      if (r != Result::kOk || done == 1) return r;
    }
    return Result::kInternalError;
  }

  LocalTelemetry telemetry_;
  std::vector<std::string> logs_;
};

TEST_F(FakeTransport, SendsAndReceivesThroughCtsFifo) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  EXPECT_STREQ(pair.transport->name(), "OptiFlow-IB");
  ASSERT_EQ(pair.transport->deviceCount(), 1);
  ASSERT_TRUE(connectPair(&pair));

  std::vector<char> src(1 << 20), dst(1 << 20, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  MemHandle* smh = nullptr;
  MemHandle* rmh = nullptr;
  ASSERT_EQ(pair.send->regMr(src.data(), src.size(), kPtrHost, &smh), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(dst.data(), dst.size(), kPtrHost, &rmh), Result::kOk);

  // Before any receive is posted the sender has no clear-to-send: null request.
  Request* sreq = nullptr;
  ASSERT_EQ(pair.send->isend(src.data(), 1000, 5, smh, &sreq), Result::kOk);
  EXPECT_EQ(sreq, nullptr);

  // Several rounds (more than kMaxRequests, so FIFO slots wrap), sizes 0..large.
  std::uint64_t total = 0;
  for (int round = 0; round < 3 * kMaxRequests; ++round) {
    const std::size_t size = round == 0 ? 0 : static_cast<std::size_t>((round * 4099) % (1 << 20));
    void* data = dst.data();
    const std::size_t cap = dst.size();
    int tag = 5;
    Request* rreq = nullptr;
    ASSERT_EQ(pair.recv->irecv(1, &data, &cap, &tag, &rmh, &rreq), Result::kOk);
    ASSERT_NE(rreq, nullptr);
    ASSERT_EQ(pair.send->isend(src.data() + round, size, 5, smh, &sreq), Result::kOk);
    ASSERT_NE(sreq, nullptr) << round;
    int sizes[1] = {-1};
    ASSERT_EQ(wait(pair.send.get(), sreq, sizes), Result::kOk);
    EXPECT_EQ(sizes[0], static_cast<int>(size));
    sizes[0] = -1;
    ASSERT_EQ(wait(pair.recv.get(), rreq, sizes), Result::kOk);
    ASSERT_EQ(sizes[0], static_cast<int>(size)) << round;
    ASSERT_EQ(std::memcmp(dst.data(), src.data() + round, size), 0) << round;
    total += size;
  }
  const NetCounters nic = telemetry_.snapshotNic("fake0:1");
  EXPECT_EQ(nic.bytesSent, total);
  EXPECT_EQ(nic.bytesRecv, total);
  EXPECT_EQ(nic.msgsSent, static_cast<std::uint64_t>(3 * kMaxRequests));
  EXPECT_EQ(pair.send->deregMr(smh), Result::kOk);
  EXPECT_EQ(pair.recv->deregMr(rmh), Result::kOk);
  EXPECT_TRUE(logs_.empty()) << logs_.front();
}

TEST_F(FakeTransport, GroupedReceiveMatchesByTagWithinOldestReceive) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  ASSERT_TRUE(connectPair(&pair));
  std::vector<char> src(4096, 'x'), dst(3 * 4096, 0);
  MemHandle* smh = nullptr;
  MemHandle* rmh = nullptr;
  ASSERT_EQ(pair.send->regMr(src.data(), src.size(), kPtrHost, &smh), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(dst.data(), dst.size(), kPtrHost, &rmh), Result::kOk);
  void* data[3] = {dst.data(), dst.data() + 4096, dst.data() + 8192};
  const std::size_t caps[3] = {4096, 4096, 4096};
  const int tags[3] = {10, 11, 12};
  MemHandle* mhs[3] = {rmh, rmh, rmh};
  Request* first = nullptr;
  Request* second = nullptr;
  ASSERT_EQ(pair.recv->irecv(3, data, caps, tags, mhs, &first), Result::kOk);
  const int tag20 = 20;
  void* data2 = dst.data();
  ASSERT_EQ(pair.recv->irecv(1, &data2, caps, &tag20, mhs, &second), Result::kOk);

  Request* reqs[3] = {};
  src[0] = 'c';
  ASSERT_EQ(pair.send->isend(src.data(), 300, 12, smh, &reqs[2]), Result::kOk);  // out of order: fine
  ASSERT_NE(reqs[2], nullptr);
  Request* early = nullptr;
  ASSERT_EQ(pair.send->isend(src.data(), 10, 20, smh, &early), Result::kOk);  // belongs to the second receive
  EXPECT_EQ(early, nullptr);
  src[0] = 'a';
  ASSERT_EQ(pair.send->isend(src.data(), 100, 10, smh, &reqs[0]), Result::kOk);
  int done = 0;
  ASSERT_EQ(pair.recv->test(first, &done, nullptr), Result::kOk);
  EXPECT_EQ(done, 0);  // 2 of 3 arrived
  src[0] = 'b';
  ASSERT_EQ(pair.send->isend(src.data(), 200, 11, smh, &reqs[1]), Result::kOk);
  for (Request* r : reqs) ASSERT_EQ(wait(pair.send.get(), r, nullptr), Result::kOk);
  int sizes[3] = {};
  ASSERT_EQ(wait(pair.recv.get(), first, sizes), Result::kOk);
  EXPECT_EQ(sizes[0], 100);
  EXPECT_EQ(sizes[1], 200);
  EXPECT_EQ(sizes[2], 300);
  EXPECT_EQ(dst[0], 'a');
  EXPECT_EQ(dst[4096], 'b');
  EXPECT_EQ(dst[8192], 'c');
  ASSERT_EQ(pair.send->isend(src.data(), 10, 20, smh, &early), Result::kOk);
  ASSERT_NE(early, nullptr);
  ASSERT_EQ(wait(pair.recv.get(), second, sizes), Result::kOk);
  EXPECT_EQ(sizes[0], 10);
  pair.send->deregMr(smh);
  pair.recv->deregMr(rmh);
}

TEST_F(FakeTransport, RegistrationsAreSharedAndChecked) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  ASSERT_TRUE(connectPair(&pair));
  const std::size_t base = world_.liveMrs();
  std::vector<char> buf(64 << 10);
  MemHandle* a = nullptr;
  MemHandle* b = nullptr;
  ASSERT_EQ(pair.send->regMr(buf.data(), buf.size(), kPtrHost, &a), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(buf.data() + 100, 1000, kPtrHost, &b), Result::kOk);  // inside a: reused
  EXPECT_EQ(world_.liveMrs(), base + 1);
  EXPECT_EQ(pair.send->deregMr(a), Result::kOk);
  EXPECT_EQ(world_.liveMrs(), base + 1);
  EXPECT_EQ(pair.recv->deregMr(b), Result::kOk);
  EXPECT_EQ(world_.liveMrs(), base);
  MemHandle* c = nullptr;
  EXPECT_EQ(pair.send->regMr(buf.data(), buf.size(), kPtrCuda, &c), Result::kInvalidUsage);  // no GPUDirect here
  EXPECT_EQ(pair.send->regMrDmaBuf(buf.data(), buf.size(), kPtrCuda, 0, 3, &c), Result::kInvalidUsage);
  ASSERT_EQ(pair.send->regMr(buf.data(), 4096, kPtrHost, &c), Result::kOk);
  Request* req = nullptr;
  // Outside its registration (which is rounded to whole pages, so go a few pages further).
  EXPECT_EQ(pair.send->isend(buf.data() + 3 * 4096, 200, 1, c, &req), Result::kInvalidArgument);
  EXPECT_EQ(req, nullptr);
  EXPECT_EQ(pair.send->deregMr(c), Result::kOk);
  EXPECT_FALSE(logs_.empty());
}

TEST_F(FakeTransport, OversizedMessageIsAnError) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  ASSERT_TRUE(connectPair(&pair));
  std::vector<char> buf(8192);
  MemHandle* smh = nullptr;
  MemHandle* rmh = nullptr;
  ASSERT_EQ(pair.send->regMr(buf.data(), buf.size(), kPtrHost, &smh), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(buf.data(), buf.size(), kPtrHost, &rmh), Result::kOk);
  void* data = buf.data();
  const std::size_t cap = 100;
  const int tag = 1;
  Request* rreq = nullptr;
  ASSERT_EQ(pair.recv->irecv(1, &data, &cap, &tag, &rmh, &rreq), Result::kOk);
  Request* sreq = nullptr;
  EXPECT_EQ(pair.send->isend(buf.data(), 101, 1, smh, &sreq), Result::kInvalidUsage);
  EXPECT_EQ(sreq, nullptr);
  ASSERT_FALSE(logs_.empty());
  EXPECT_NE(logs_.back().find("larger than the receive buffer of 100 bytes"), std::string::npos) << logs_.back();
  // The failure sticks.
  EXPECT_EQ(pair.send->isend(buf.data(), 10, 1, smh, &sreq), Result::kInvalidUsage);
  pair.send->deregMr(smh);
  pair.recv->deregMr(rmh);
}

TEST_F(FakeTransport, CompletionErrorAndDeadPeerAreRemoteErrors) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  ASSERT_TRUE(connectPair(&pair));
  std::vector<char> buf(8192);
  MemHandle* smh = nullptr;
  MemHandle* rmh = nullptr;
  ASSERT_EQ(pair.send->regMr(buf.data(), buf.size(), kPtrHost, &smh), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(buf.data(), buf.size(), kPtrHost, &rmh), Result::kOk);
  void* data = buf.data();
  const std::size_t cap = 4096;
  const int tag = 1;
  Request* rreq = nullptr;
  ASSERT_EQ(pair.recv->irecv(1, &data, &cap, &tag, &rmh, &rreq), Result::kOk);
  world_.failNextWrite = 1;
  Request* sreq = nullptr;
  ASSERT_EQ(pair.send->isend(buf.data(), 10, 1, smh, &sreq), Result::kOk);
  ASSERT_NE(sreq, nullptr);
  EXPECT_EQ(wait(pair.send.get(), sreq, nullptr), Result::kRemoteError);
  ASSERT_FALSE(logs_.empty());
  EXPECT_NE(logs_.back().find("completion error 'fake status'"), std::string::npos) << logs_.back();

  // The sender goes away: the receive that will never complete fails instead of hanging.
  pair.send->deregMr(smh);
  pair.send.reset();
  EXPECT_EQ(wait(pair.recv.get(), rreq, nullptr), Result::kRemoteError);
  EXPECT_NE(logs_.back().find("closed the connection"), std::string::npos) << logs_.back();
  pair.recv->deregMr(rmh);
}

TEST_F(FakeTransport, CorruptOrForeignQpInfoIsRefused) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  auto transport = make();
  ASSERT_NE(transport, nullptr);
  std::uint8_t handle[kHandleBytes];
  std::unique_ptr<ListenComm> listen;
  ASSERT_EQ(transport->listen(0, handle, &listen), Result::kOk);
  ib::IbHandle h;
  std::string error;
  ASSERT_TRUE(ib::decodeIbHandle(handle, &h, &error)) << error;
  ASSERT_EQ(h.family, AF_INET);

  // A raw TCP client sends 72 bytes of garbage.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(h.port);
  std::memcpy(&addr.sin_addr, h.addr, 4);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::uint8_t garbage[ib::kQpInfoBytes];
  std::memset(garbage, 0x41, sizeof(garbage));
  ASSERT_EQ(::send(fd, garbage, sizeof(garbage), 0), static_cast<ssize_t>(sizeof(garbage)));
  std::unique_ptr<RecvComm> recv;
  Result r = Result::kOk;
  for (const auto start = std::chrono::steady_clock::now();
       r == Result::kOk && std::chrono::steady_clock::now() - start < kLiveness;) {
    r = listen->accept(&recv);
    if (r == Result::kOk) ::usleep(1000);
  }
  EXPECT_EQ(r, Result::kRemoteError);
  EXPECT_EQ(recv, nullptr);
  ASSERT_FALSE(logs_.empty());
  EXPECT_NE(logs_.back().find("QP info magic 0x41414141"), std::string::npos) << logs_.back();
  ::close(fd);

  // A handle that is not ours: connect refuses it without touching the network.
  std::uint8_t bad[kHandleBytes];
  std::memcpy(bad, handle, sizeof(bad));
  bad[40] ^= 1;
  std::unique_ptr<Connector> connector;
  EXPECT_EQ(transport->connect(0, bad, &connector), Result::kInvalidArgument);
  EXPECT_EQ(connector, nullptr);
  EXPECT_NE(logs_.back().find("bad checksum"), std::string::npos) << logs_.back();
}

TEST_F(FakeTransport, ConnectToClosedListenerFails) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  auto transport = make();
  ASSERT_NE(transport, nullptr);
  std::uint8_t handle[kHandleBytes];
  std::unique_ptr<ListenComm> listen;
  ASSERT_EQ(transport->listen(0, handle, &listen), Result::kOk);
  listen.reset();  // nobody listens on that port any more
  std::unique_ptr<Connector> connector;
  ASSERT_EQ(transport->connect(0, handle, &connector), Result::kOk);
  std::unique_ptr<SendComm> send;
  Result r = Result::kOk;
  for (const auto start = std::chrono::steady_clock::now();
       r == Result::kOk && std::chrono::steady_clock::now() - start < kLiveness;) {
    r = connector->step(&send);
    if (r == Result::kOk) ::usleep(1000);
  }
  EXPECT_EQ(r, Result::kRemoteError);
  EXPECT_EQ(send, nullptr);
  EXPECT_NE(logs_.back().find("Connection refused"), std::string::npos) << logs_.back();
  EXPECT_EQ(connector->step(&send), Result::kRemoteError);  // stays failed
  EXPECT_TRUE(world_.qps.empty());
}

TEST_F(FakeTransport, FlushReadsCudaBuffersOnlyWithGpuDirect) {
  enableGpuDirect();
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  Pair pair;
  pair.transport = make();
  ASSERT_NE(pair.transport, nullptr);
  EXPECT_EQ(pair.transport->device(0).ptrSupport & kPtrCuda, kPtrCuda);
  ASSERT_TRUE(connectPair(&pair));
  std::vector<char> buf(8192, 'z');
  MemHandle* host = nullptr;
  MemHandle* gpu = nullptr;  // host memory posing as CUDA memory: the fake NIC cannot tell
  ASSERT_EQ(pair.recv->regMr(buf.data(), 4096, kPtrHost, &host), Result::kOk);
  ASSERT_EQ(pair.recv->regMr(buf.data() + 4096, 4096, kPtrCuda, &gpu), Result::kOk);
  void* data = buf.data();
  int size = 100;
  Request* req = reinterpret_cast<Request*>(0x1);
  ASSERT_EQ(pair.recv->iflush(1, &data, &size, &host, &req), Result::kOk);
  EXPECT_EQ(req, nullptr);  // host memory: nothing to flush
  data = buf.data() + 4096;
  ASSERT_EQ(pair.recv->iflush(1, &data, &size, &gpu, &req), Result::kOk);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(wait(pair.recv.get(), req, nullptr), Result::kOk);
  pair.recv->deregMr(host);
  pair.recv->deregMr(gpu);
}

TEST_F(FakeTransport, ResourcesAreReleased) {
  addDevice("fake0", 7, {fake::port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)});
  {
    Pair pair;
    pair.transport = make();
    ASSERT_NE(pair.transport, nullptr);
    ASSERT_TRUE(connectPair(&pair));
    EXPECT_EQ(world_.qps.size(), 2u);
    pair.send.reset();
    pair.recv.reset();
    pair.listen.reset();
    EXPECT_TRUE(world_.qps.empty());
    EXPECT_TRUE(world_.mrs.empty());
  }
  EXPECT_EQ(world_.pds, 0);
  EXPECT_EQ(world_.opened, world_.closed);
}
#endif  // OPTIFLOW_HAVE_IBVERBS

}  // namespace
}  // namespace optiflow::net
