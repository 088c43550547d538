// The RDMA transport's two frames: the connection handle NCCL passes between ranks and the queue-pair info both
// sides exchange over the bootstrap socket (layouts in ib_verbs.h). Little-endian, CRC-32, never decoded by casting.
#include <sys/socket.h>

#include <cstring>

#include "ib_comm.h"
#include "optiflow/net/bytes.h"
#include "optiflow/net/wire.h"

namespace optiflow::net::ib {
namespace {

constexpr std::uint32_t kQpInfoMagic = 0x514e464f;  // "OFNQ"

}  // namespace

void encodeIbHandle(const IbHandle& handle, std::uint8_t* out) {
  std::memset(out, 0, kHandleBytes);
  bytes::put32(out, wire::kHandleMagic);
  bytes::put16(out + 4, wire::kWireVersion);
  out[6] = static_cast<std::uint8_t>(wire::TransportKind::kIb);
  out[7] = handle.family;
  bytes::put64(out + 8, handle.buildId);
  bytes::put64(out + 16, handle.listenId);
  out[24] = static_cast<std::uint8_t>(handle.port >> 8);  // network order
  out[25] = static_cast<std::uint8_t>(handle.port);
  std::memcpy(out + 28, handle.addr, 16);
  bytes::put32(out + 44, bytes::crc32(out, 44));
}

bool decodeIbHandle(const std::uint8_t* in, IbHandle* out, std::string* error) {
  const std::uint32_t magic = bytes::get32(in);
  if (magic != wire::kHandleMagic) return fail(error, strf("handle magic 0x%x is not an OptiFlow net handle", magic));
  const std::uint16_t version = bytes::get16(in + 4);
  if (version != wire::kWireVersion) {
    return fail(error, strf("handle from another build (wire version %u, expected %u)", version, wire::kWireVersion));
  }
  if (in[6] != static_cast<std::uint8_t>(wire::TransportKind::kIb)) {
    return fail(error, strf("handle is for transport kind %u, not IB (2)", in[6]));
  }
  if (bytes::get32(in + 44) != bytes::crc32(in, 44)) return fail(error, "IB handle has a bad checksum");
  IbHandle h;
  h.family = in[7];
  h.buildId = bytes::get64(in + 8);
  h.listenId = bytes::get64(in + 16);
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
  bytes::put32(out, kQpInfoMagic);
  bytes::put16(out + 4, wire::kWireVersion);
  out[6] = static_cast<std::uint8_t>(info.role);
  out[7] = info.linkLayer;
  bytes::put64(out + 8, info.buildId);
  bytes::put64(out + 16, info.listenId);
  bytes::put32(out + 24, info.qpn);
  bytes::put32(out + 28, info.psn);
  bytes::put16(out + 32, info.lid);
  out[34] = info.mtu;
  std::memcpy(out + 36, info.gid, 16);
  bytes::put64(out + 52, info.memAddr);
  bytes::put32(out + 60, info.memRkey);
  bytes::put32(out + 68, bytes::crc32(out, 68));
}

bool decodeQpInfo(const std::uint8_t* in, QpInfo* out, std::string* error) {
  const std::uint32_t magic = bytes::get32(in);
  if (magic != kQpInfoMagic)
    return fail(error, strf("QP info magic 0x%x is not OptiFlow's (0x%x)", magic, kQpInfoMagic));
  if (bytes::get32(in + 68) != bytes::crc32(in, 68)) return fail(error, "QP info has a bad checksum");
  const std::uint16_t version = bytes::get16(in + 4);
  if (version != wire::kWireVersion) {
    return fail(error, strf("QP info from another build (wire version %u, expected %u)", version, wire::kWireVersion));
  }
  QpInfo info;
  info.buildId = bytes::get64(in + 8);
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
  info.listenId = bytes::get64(in + 16);
  info.qpn = bytes::get32(in + 24);
  info.psn = bytes::get32(in + 28);
  info.lid = bytes::get16(in + 32);
  info.mtu = in[34];
  std::memcpy(info.gid, in + 36, 16);
  info.memAddr = bytes::get64(in + 52);
  info.memRkey = bytes::get32(in + 60);
  if (info.qpn > 0xffffff || info.psn > 0xffffff) {
    return fail(error, strf("QP info: qpn 0x%x or psn 0x%x exceeds 24 bits", info.qpn, info.psn));
  }
  if (info.mtu < IBV_MTU_256 || info.mtu > IBV_MTU_4096) return fail(error, strf("QP info: MTU code %u", info.mtu));
  if (info.memAddr == 0) return fail(error, "QP info: null control-memory address");
  *out = info;
  return true;
}

}  // namespace optiflow::net::ib
