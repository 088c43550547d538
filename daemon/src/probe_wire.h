// The probe control protocol (private to probe.cc and its test): the frames a prober and a ProbeResponder exchange
// over the plain TCP control connection. Little-endian, fixed layout, encoded and decoded field by field, CRC-32 on
// every frame, so a foreign or corrupt byte stream is refused with a message instead of being believed.
//
//   prober -> responder  Request  {magic "OFPR", version, reserved, bytes, count, pings, crc}           28 bytes
//   responder -> prober  Handle   {magic "OFPH", version, status, 128-byte net handle | reason, crc}   140 bytes
//   prober <- responder  1 byte: kAck after the responder received all `count` messages (kNak: it failed)
//   prober -> responder  Handle   (the prober's own listen handle, for the latency connection back)
// Then `pings` + 1 ping-pongs of 8 bytes over the two net connections (the first is a warm-up), and both close.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "optiflow/daemon/probe.h"
#include "optiflow/net/bytes.h"
#include "optiflow/net/transport.h"

namespace optiflow::daemon::probewire {

inline constexpr std::uint32_t kRequestMagic = 0x5250464f;  // "OFPR"
inline constexpr std::uint32_t kHandleMagic = 0x4850464f;   // "OFPH"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kRequestBytes = 28;
inline constexpr std::size_t kHandleFrameBytes = 12 + net::kHandleBytes;
inline constexpr std::uint8_t kAck = 0x06;
inline constexpr std::uint8_t kNak = 0x15;

// What a responder accepts: bounded so that a request cannot make it allocate or spin without limit.
using daemon::kMaxProbeBytes;
inline constexpr std::uint32_t kMaxCount = static_cast<std::uint32_t>(net::kMaxRequests);
inline constexpr std::uint32_t kMaxPings = 1000;
inline constexpr std::uint64_t kPingBytes = 8;

enum class Status : std::uint16_t { kOk = 0, kRefused = 1 };

struct Request {
  std::uint64_t bytes = 0;
  std::uint32_t count = 0;
  std::uint32_t pings = 0;
};

struct HandleFrame {
  Status status = Status::kOk;
  std::uint8_t handle[net::kHandleBytes] = {};  // kOk
  std::string reason;                           // kRefused (at most kHandleBytes - 1 characters travel)
};

namespace detail {
using net::bytes::crc32;
using net::bytes::get16;
using net::bytes::get32;
using net::bytes::get64;
using net::bytes::put16;
using net::bytes::put32;
using net::bytes::put64;
inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}
// Magic, version and CRC, common to both frames; the caller checks the fields after.
inline bool checkFrame(const std::uint8_t* in, std::size_t length, std::uint32_t magic, const char* what,
                       std::string* error) {
  const std::uint32_t got = get32(in);
  if (got != magic) {
    *error =
        std::string(what) + " magic " + hex32(got) + " is not an OptiFlow probe frame (expected " + hex32(magic) + ")";
    return false;
  }
  const std::uint16_t version = get16(in + 4);
  if (version != kVersion) {
    *error = std::string(what) + " of probe protocol version " + std::to_string(version) + ", this build speaks " +
             std::to_string(kVersion);
    return false;
  }
  if (get32(in + length - 4) != crc32(in, length - 4)) {
    *error = std::string(what) + " has a bad checksum";
    return false;
  }
  return true;
}
}  // namespace detail

// out: kRequestBytes.
inline void encodeRequest(const Request& r, std::uint8_t* out) {
  std::memset(out, 0, kRequestBytes);
  detail::put32(out, kRequestMagic);
  detail::put16(out + 4, kVersion);
  detail::put64(out + 8, r.bytes);
  detail::put32(out + 16, r.count);
  detail::put32(out + 20, r.pings);
  detail::put32(out + 24, detail::crc32(out, 24));
}

// false with *error naming what was wrong (magic, version, checksum, a value out of range).
inline bool decodeRequest(const std::uint8_t* in, Request* out, std::string* error) {
  if (!detail::checkFrame(in, kRequestBytes, kRequestMagic, "request", error)) return false;
  Request r;
  r.bytes = detail::get64(in + 8);
  r.count = detail::get32(in + 16);
  r.pings = detail::get32(in + 20);
  if (r.bytes < 1 || r.bytes > kMaxProbeBytes) {
    *error = "request for " + std::to_string(r.bytes) + "-byte messages: expected 1.." + std::to_string(kMaxProbeBytes);
    return false;
  }
  if (r.count < 1 || r.count > kMaxCount) {
    *error = "request for " + std::to_string(r.count) + " messages: expected 1.." + std::to_string(kMaxCount);
    return false;
  }
  if (r.pings < 1 || r.pings > kMaxPings) {
    *error = "request for " + std::to_string(r.pings) + " pings: expected 1.." + std::to_string(kMaxPings);
    return false;
  }
  *out = r;
  return true;
}

// out: kHandleFrameBytes.
inline void encodeHandleFrame(const HandleFrame& f, std::uint8_t* out) {
  std::memset(out, 0, kHandleFrameBytes);
  detail::put32(out, kHandleMagic);
  detail::put16(out + 4, kVersion);
  detail::put16(out + 6, static_cast<std::uint16_t>(f.status));
  if (f.status == Status::kOk) {
    std::memcpy(out + 8, f.handle, net::kHandleBytes);
  } else {
    std::memcpy(out + 8, f.reason.data(), std::min(f.reason.size(), net::kHandleBytes - 1));
  }
  detail::put32(out + 8 + net::kHandleBytes, detail::crc32(out, 8 + net::kHandleBytes));
}

inline bool decodeHandleFrame(const std::uint8_t* in, HandleFrame* out, std::string* error) {
  if (!detail::checkFrame(in, kHandleFrameBytes, kHandleMagic, "handle frame", error)) return false;
  const std::uint16_t status = detail::get16(in + 6);
  if (status > static_cast<std::uint16_t>(Status::kRefused)) {
    *error = "handle frame with unknown status " + std::to_string(status);
    return false;
  }
  out->status = static_cast<Status>(status);
  std::memcpy(out->handle, in + 8, net::kHandleBytes);
  out->reason.clear();
  if (out->status == Status::kRefused) {
    const char* text = reinterpret_cast<const char*>(in + 8);
    out->reason.assign(text, strnlen(text, net::kHandleBytes - 1));
  }
  return true;
}

}  // namespace optiflow::daemon::probewire
