// Wire codec: explicit little-endian packing (big-endian only for ports, as sockaddr wants them), CRC-32 on every
// frame, and decoders that check every field before the caller may believe it.
#include "optiflow/net/wire.h"

#include <sys/socket.h>

#include <cstdio>
#include <cstring>

#include "optiflow/net/bytes.h"

#ifndef OPTIFLOW_VERSION
#define OPTIFLOW_VERSION "unknown"
#endif

namespace optiflow::net::wire {
namespace {

// Hello: magic u32 "OFNS", version u16, streamIndex u16, streamCount u16, reserved u16, buildId u64, listenId u64,
// connId u64, CRC-32 u32 = 40 bytes.
__extension__ typedef unsigned __int128 Wide;  // size x weight needs 96 bits

constexpr std::uint32_t kHelloMagic = 0x534e464f;    // "OFNS"
constexpr std::uint32_t kMessageMagic = 0x4d4e464f;  // "OFNM"
constexpr std::uint32_t kChunkMagic = 0x434e464f;    // "OFNC"
constexpr std::size_t kHandleFixedBytes = 24;
constexpr std::size_t kRailBytes = 20;
static_assert(kHandleFixedBytes + kRailBytes * kMaxRails + 4 <= kHandleBytes);

using bytes::crc32;
using bytes::get16;
using bytes::get32;
using bytes::get64;
using bytes::put16;
using bytes::put32;
using bytes::put64;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

bool fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

Decode corrupt(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return Decode::kCorrupt;
}

}  // namespace

std::uint64_t buildId() {
  static const std::uint64_t id = [] {
    std::string text = "optiflow-net/" + std::to_string(kWireVersion) + "/" + OPTIFLOW_VERSION;
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    return h;
  }();
  return id;
}

// ---- Handle
// ----------------------------------------------------------------------------------------------------------

bool encodeTcpHandle(const TcpHandle& handle, std::uint8_t* out) {
  if (handle.railCount < 1 || handle.railCount > kMaxRails) return false;
  std::memset(out, 0, kHandleBytes);
  put32(out, kHandleMagic);
  put16(out + 4, kWireVersion);
  out[6] = static_cast<std::uint8_t>(TransportKind::kTcp);
  out[7] = handle.railCount;
  put64(out + 8, handle.buildId);
  put64(out + 16, handle.listenId);
  std::uint8_t* p = out + kHandleFixedBytes;
  for (int r = 0; r < handle.railCount; ++r, p += kRailBytes) {
    const RailAddress& rail = handle.rails[r];
    p[0] = rail.family;
    p[1] = rail.streams;
    p[2] = static_cast<std::uint8_t>(rail.port >> 8);  // network order
    p[3] = static_cast<std::uint8_t>(rail.port);
    std::memcpy(p + 4, rail.addr, 16);
  }
  put32(p, crc32(out, static_cast<std::size_t>(p - out)));
  return true;
}

bool decodeTcpHandle(const std::uint8_t* in, TcpHandle* out, std::string* error) {
  const std::uint32_t magic = get32(in);
  if (magic != kHandleMagic) return fail(error, "handle magic " + hex(magic) + " is not an OptiFlow net handle");
  const std::uint16_t version = get16(in + 4);
  if (version != kWireVersion) {
    return fail(error, "handle from another build (wire version " + std::to_string(version) + ", expected " +
                           std::to_string(kWireVersion) + ")");
  }
  if (in[6] != static_cast<std::uint8_t>(TransportKind::kTcp)) {
    return fail(error, "handle is for transport kind " + std::to_string(in[6]) + ", not TCP (1)");
  }
  const int railCount = in[7];
  if (railCount < 1 || railCount > kMaxRails) {
    return fail(error, "rail count " + std::to_string(railCount) + " not in 1.." + std::to_string(kMaxRails));
  }
  const std::size_t crcAt = kHandleFixedBytes + kRailBytes * static_cast<std::size_t>(railCount);
  const std::uint32_t stored = get32(in + crcAt);
  const std::uint32_t computed = crc32(in, crcAt);
  if (stored != computed) return fail(error, "handle bad checksum " + hex(stored) + ", computed " + hex(computed));
  TcpHandle h;
  h.buildId = get64(in + 8);
  if (h.buildId != buildId()) {
    return fail(error, "handle from another build (build id " + hex(h.buildId) + ", this build " + hex(buildId()) +
                           "): use the same plugin version on every node");
  }
  h.listenId = get64(in + 16);
  h.railCount = static_cast<std::uint8_t>(railCount);
  int totalStreams = 0;
  const std::uint8_t* p = in + kHandleFixedBytes;
  for (int r = 0; r < railCount; ++r, p += kRailBytes) {
    RailAddress& rail = h.rails[r];
    rail.family = p[0];
    rail.streams = p[1];
    rail.port = static_cast<std::uint16_t>((p[2] << 8) | p[3]);
    std::memcpy(rail.addr, p + 4, 16);
    if (rail.family != AF_INET && rail.family != AF_INET6) {
      return fail(error, "rail " + std::to_string(r) + " address family " + std::to_string(rail.family) +
                             " is neither AF_INET nor AF_INET6");
    }
    if (rail.streams < 1) return fail(error, "rail " + std::to_string(r) + " has 0 streams");
    if (rail.port == 0) return fail(error, "rail " + std::to_string(r) + " has port 0");
    totalStreams += rail.streams;
  }
  if (totalStreams > kMaxStreams) {
    return fail(error,
                "handle asks for " + std::to_string(totalStreams) + " streams, at most " + std::to_string(kMaxStreams));
  }
  *out = h;
  return true;
}

// ---- Hello
// -----------------------------------------------------------------------------------------------------------

void encodeHello(const Hello& hello, std::uint8_t* out) {
  put32(out, kHelloMagic);
  put16(out + 4, kWireVersion);
  put16(out + 6, hello.streamIndex);
  put16(out + 8, hello.streamCount);
  put16(out + 10, 0);
  put64(out + 12, hello.buildId);
  put64(out + 20, hello.listenId);
  put64(out + 28, hello.connId);
  put32(out + 36, crc32(out, 36));
}

bool decodeHello(const std::uint8_t* in, Hello* out, std::string* error) {
  const std::uint32_t magic = get32(in);
  if (magic != kHelloMagic) return fail(error, "hello magic " + hex(magic) + " is not an OptiFlow stream hello");
  const std::uint16_t version = get16(in + 4);
  if (version != kWireVersion) {
    return fail(error, "hello from another build (wire version " + std::to_string(version) + ", expected " +
                           std::to_string(kWireVersion) + ")");
  }
  const std::uint32_t stored = get32(in + 36);
  const std::uint32_t computed = crc32(in, 36);
  if (stored != computed) return fail(error, "hello bad checksum " + hex(stored) + ", computed " + hex(computed));
  Hello h;
  h.streamIndex = get16(in + 6);
  h.streamCount = get16(in + 8);
  h.buildId = get64(in + 12);
  h.listenId = get64(in + 20);
  h.connId = get64(in + 28);
  if (h.buildId != buildId()) {
    return fail(error, "hello from another build (build id " + hex(h.buildId) + ", this build " + hex(buildId()) + ")");
  }
  if (h.streamCount < 1 || h.streamCount > kMaxStreams) {
    return fail(error,
                "hello stream count " + std::to_string(h.streamCount) + " not in 1.." + std::to_string(kMaxStreams));
  }
  if (h.streamIndex >= h.streamCount) {
    return fail(error, "hello stream index " + std::to_string(h.streamIndex) + " >= stream count " +
                           std::to_string(h.streamCount));
  }
  *out = h;
  return true;
}

// ---- Frames
// ----------------------------------------------------------------------------------------------------------
// MessageHeader: magic u32, seq u32, tag i32, partCount u16, reserved u16, size u64, then per part (stream u16,
// reserved u16, bytes u64), then CRC-32 of everything before it.
// ChunkHeader: magic u32, seq u32, offset u64, bytes u64, CRC-32.

std::size_t encodeMessageHeader(const MessageHeader& header, std::uint8_t* out) {
  put32(out, kMessageMagic);
  put32(out + 4, header.seq);
  put32(out + 8, static_cast<std::uint32_t>(header.tag));
  put16(out + 12, header.partCount);
  put16(out + 14, 0);
  put64(out + 16, header.size);
  std::uint8_t* p = out + kMessageFixedBytes;
  for (int i = 0; i < header.partCount; ++i, p += kPartBytes) {
    put16(p, header.parts[i].stream);
    put16(p + 2, 0);
    put64(p + 4, header.parts[i].bytes);
  }
  const auto length = static_cast<std::size_t>(p - out);
  put32(p, crc32(out, length));
  return length + 4;
}

void encodeChunkHeader(const ChunkHeader& chunk, std::uint8_t* out) {
  put32(out, kChunkMagic);
  put32(out + 4, chunk.seq);
  put64(out + 8, chunk.offset);
  put64(out + 16, chunk.bytes);
  put32(out + 24, crc32(out, 24));
}

Decode decodeMessageHeader(const std::uint8_t* in, std::size_t length, int streamCount, std::uint64_t maxBytes,
                           MessageHeader* out, std::size_t* consumed, std::size_t* needed, std::string* error) {
  if (length >= 4 && get32(in) != kMessageMagic) {
    return corrupt(error, "message header magic " + hex(get32(in)) + ", expected " + hex(kMessageMagic));
  }
  if (length < kMessageFixedBytes) {
    if (needed != nullptr) *needed = kMessageFixedBytes;
    return Decode::kNeedMore;
  }
  const std::uint16_t partCount = get16(in + 12);
  if (streamCount < 1 || streamCount > kMaxStreams || partCount > streamCount) {
    return corrupt(
        error, "message part count " + std::to_string(partCount) + " > stream count " + std::to_string(streamCount));
  }
  const std::size_t total = messageHeaderBytes(partCount);
  if (length < total) {
    if (needed != nullptr) *needed = total;
    return Decode::kNeedMore;
  }
  const std::uint32_t stored = get32(in + total - 4);
  const std::uint32_t computed = crc32(in, total - 4);
  if (stored != computed) {
    return corrupt(error, "message header bad checksum " + hex(stored) + ", computed " + hex(computed));
  }
  MessageHeader h;
  h.seq = get32(in + 4);
  h.tag = static_cast<std::int32_t>(get32(in + 8));
  h.partCount = partCount;
  h.size = get64(in + 16);
  if (h.size > maxBytes) {
    return corrupt(error, "message size " + std::to_string(h.size) + " > limit " + std::to_string(maxBytes));
  }
  if ((h.size == 0) != (partCount == 0)) {
    return corrupt(error,
                   "message of " + std::to_string(h.size) + " bytes has " + std::to_string(partCount) + " parts");
  }
  std::uint64_t sum = 0;
  const std::uint8_t* p = in + kMessageFixedBytes;
  for (int i = 0; i < partCount; ++i, p += kPartBytes) {
    Part& part = h.parts[i];
    part.stream = get16(p);
    part.bytes = get64(p + 4);
    if (part.stream >= streamCount) {
      return corrupt(error, "message part " + std::to_string(i) + " on stream " + std::to_string(part.stream) +
                                " >= stream count " + std::to_string(streamCount));
    }
    if (i > 0 && part.stream <= h.parts[i - 1].stream) {
      return corrupt(error, "message part streams not increasing (" + std::to_string(h.parts[i - 1].stream) + " then " +
                                std::to_string(part.stream) + ")");
    }
    if (part.bytes == 0 || part.bytes > h.size - sum) {
      return corrupt(error, "message part " + std::to_string(i) + " of " + std::to_string(part.bytes) +
                                " bytes does not fit the message size " + std::to_string(h.size));
    }
    sum += part.bytes;
  }
  if (sum != h.size) {
    return corrupt(error,
                   "message parts sum to " + std::to_string(sum) + " bytes, header says " + std::to_string(h.size));
  }
  *out = h;
  if (consumed != nullptr) *consumed = total;
  return Decode::kOk;
}

Decode decodeChunkHeader(const std::uint8_t* in, std::size_t length, ChunkHeader* out, std::string* error) {
  if (length >= 4 && get32(in) != kChunkMagic) {
    return corrupt(error, "chunk header magic " + hex(get32(in)) + ", expected " + hex(kChunkMagic));
  }
  if (length < kChunkHeaderBytes) return Decode::kNeedMore;
  const std::uint32_t stored = get32(in + 24);
  const std::uint32_t computed = crc32(in, 24);
  if (stored != computed) {
    return corrupt(error, "chunk header bad checksum " + hex(stored) + ", computed " + hex(computed));
  }
  out->seq = get32(in + 4);
  out->offset = get64(in + 8);
  out->bytes = get64(in + 16);
  return Decode::kOk;
}

// ---- Striping
// --------------------------------------------------------------------------------------------------------

int split(std::uint64_t size, const std::uint32_t* weights, int streamCount, std::uint64_t minStripeBytes,
          std::uint64_t align, Part* parts) {
  if (size == 0) return 0;
  if (streamCount <= 1 || size < minStripeBytes) {
    parts[0] = Part{0, size};
    return 1;
  }
  if (streamCount > kMaxStreams) streamCount = kMaxStreams;
  if (align == 0) align = 1;
  Wide total = 0;
  for (int s = 0; s < streamCount; ++s) total += weights[s];
  const bool equal = total == 0;
  if (equal) total = static_cast<unsigned>(streamCount);
  int last = streamCount - 1;
  while (!equal && weights[last] == 0) --last;
  int count = 0;
  std::uint64_t used = 0;
  for (int s = 0; s <= last; ++s) {
    const std::uint32_t w = equal ? 1 : weights[s];
    if (w == 0) continue;
    std::uint64_t bytes;
    if (s == last) {
      bytes = size - used;
    } else {
      bytes = static_cast<std::uint64_t>(static_cast<Wide>(size) * w / total);
      bytes -= bytes % align;
      if (bytes == 0) continue;  // too small a share: the later streams take it
    }
    parts[count++] = Part{static_cast<std::uint16_t>(s), bytes};
    used += bytes;
  }
  return count;
}

}  // namespace optiflow::net::wire
