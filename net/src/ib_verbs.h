// The RDMA verbs transport's private pieces (optiflow::net::ib): the verbs function table, device discovery, and the
// handle / queue-pair-info codecs. Only compiled when rdma-core's headers were found (OPTIFLOW_HAVE_IBVERBS).
//
// libibverbs is not linked: loadVerbs() dlopens it and fills a VerbsApi, so the plugin .so loads on nodes without
// rdma-core. Every verbs call of the transport goes through the table, which is also the seam the unit tests use to
// drive discovery and the whole data path with fake devices (tests/unit/net/ib_test.cc).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optiflow/net/transport.h"

namespace optiflow::net::ib {

struct VerbsApi {
  ibv_device** (*getDeviceList)(int* count) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* device) = nullptr;
  __be64 (*getDeviceGuid)(ibv_device* device) = nullptr;
  ibv_context* (*openDevice)(ibv_device* device) = nullptr;
  int (*closeDevice)(ibv_context* context) = nullptr;
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // Full ibv_port_attr (the exported symbol fills only a compat prefix; the real entry uses the context's op).
  int (*queryPort)(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) = nullptr;
  ibv_pd* (*allocPd)(ibv_context* context) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, std::size_t length, int access) = nullptr;
  // Null when libibverbs predates it (rdma-core < 34): no DMA-BUF support then.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                         int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;
  // Static inline in <infiniband/verbs.h> (calls through the context's ops); the real table wraps them.
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) = nullptr;
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) = nullptr;
  int (*pollCq)(ibv_cq* cq, int entries, ibv_wc* wc) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;
};

inline constexpr const char* kVerbsLibrary = "libibverbs.so.1";

// dlopens `path` (RTLD_NOW | RTLD_LOCAL, never closed: providers do not survive dlclose) and resolves every entry.
// false with *error naming the library and the missing symbol. Each call opens the library again; the transport
// uses systemVerbs().
bool loadVerbs(const char* path, VerbsApi* api, std::string* error);
// libibverbs.so.1 loaded once per process; null with *error (the same message every time) when it cannot be.
const VerbsApi* systemVerbs(std::string* error);

// ---- Discovery
// -------------------------------------------------------------------------------------------------------
struct OpenDevice {
  std::string name;  // "mlx5_0"
  ibv_context* context = nullptr;
};

struct Port {
  int device = 0;  // index into Discovery::devices
  int port = 1;
  ibv_port_attr attr{};
  int gidIndex = 0;
  ibv_gid gid{};
  DeviceProps props;
};

struct Discovery {
  std::vector<OpenDevice> devices;  // opened; the owner closes them (closeDiscovery)
  std::vector<Port> ports;          // ACTIVE ports with an IB or Ethernet link layer
};

// Opens every device, keeps ACTIVE IB/RoCE ports that pass options.devices ("mlx5_0" or "mlx5_0:1"), closes devices
// without one. sysRoot is "/sys" (tests pass a directory of their own): PCI paths, GID types, nvidia-peermem.
// false with *error when the device list cannot be read, a filter names nothing, or no port is usable.
bool discover(const VerbsApi& api, const IbOptions& options, const std::string& sysRoot, Discovery* out,
              std::string* error);
void closeDiscovery(const VerbsApi& api, Discovery* discovery);

// Mbps of an active_speed (IB enum: 1 SDR .. 128 NDR) times active_width (1x, 4x, 8x, 12x, 2x); 0 if unknown.
int portSpeedMbps(std::uint8_t activeSpeed, std::uint8_t activeWidth);

// ---- Codecs (little-endian, CRC-32; never decoded by casting) -------------------------------------------------------
// Handle: the common prefix of wire.h (magic "OFNH" u32, wire version u16, kind u8 = kIb) then family u8, buildId
// u64, listenId u64, port u16 big-endian, reserved u16, addr[16], CRC-32 of everything before = 48 bytes.
struct IbHandle {
  std::uint64_t buildId = 0;
  std::uint64_t listenId = 0;
  std::uint8_t family = 0;  // AF_INET / AF_INET6 of the bootstrap socket
  std::uint16_t port = 0;   // host order
  std::uint8_t addr[16] = {};
};
inline constexpr std::size_t kIbHandleBytes = 48;
void encodeIbHandle(const IbHandle& handle, std::uint8_t* out);  // out[kHandleBytes], zero-filled
bool decodeIbHandle(const std::uint8_t* in, IbHandle* out, std::string* error);

// What each side of a connection tells the other over the bootstrap socket: magic "OFNQ" u32, version u16, role u8,
// link layer u8, buildId u64, listenId u64, qpn u32, psn u32, lid u16, mtu u8, reserved u8, gid[16], memAddr u64,
// memRkey u32, reserved u32, CRC-32 = 72 bytes. memAddr/memRkey: the sender's CTS FIFO (the receiver RDMA-writes
// clear-to-send entries there) or the receiver's size table (the sender RDMA-writes each message's size there).
enum class Role : std::uint8_t { kSender = 1, kReceiver = 2 };
struct QpInfo {
  Role role = Role::kSender;
  std::uint8_t linkLayer = 0;  // IBV_LINK_LAYER_*
  std::uint64_t buildId = 0;
  std::uint64_t listenId = 0;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;  // 24 bits
  std::uint16_t lid = 0;
  std::uint8_t mtu = 0;  // enum ibv_mtu
  std::uint8_t gid[16] = {};
  std::uint64_t memAddr = 0;
  std::uint32_t memRkey = 0;
};
inline constexpr std::size_t kQpInfoBytes = 72;
void encodeQpInfo(const QpInfo& info, std::uint8_t* out);
// false with *error (magic, version, build, role, field ranges, checksum) when the bytes are not a QP info of this
// build.
bool decodeQpInfo(const std::uint8_t* in, QpInfo* out, std::string* error);

// The transport with an explicit verbs table and sysfs root (makeIbTransport uses systemVerbs() and "/sys").
std::unique_ptr<Transport> makeIbTransportWith(const VerbsApi* api, const IbOptions& options, LogFn log,
                                               Telemetry* telemetry, const std::string& sysRoot, std::string* error);

}  // namespace optiflow::net::ib
