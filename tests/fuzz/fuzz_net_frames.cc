// libFuzzer target: the net plugin's wire decoders (handle, stream hello, message and chunk headers) and split().
// None may crash, read past the bytes it was given (ASan: every input is copied into a buffer of exactly its size),
// or accept something that breaks the promises the TCP receiver relies on.
//
// Input: byte 0 = mode (low 3 bits: 0 handle, 1 hello, 2 message header, 3 chunk header, 4 split) and flags
// (bit 3: recompute the CRC so the input reaches the checks behind it; bit 4: write this build's buildId), byte 1 =
// stream count for message headers (1..16) / stream count for split, then the frame bytes.
#include <boost/crc.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "optiflow/net/wire.h"

namespace {

namespace wire = optiflow::net::wire;

void put32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void fixCrc(std::uint8_t* p, std::size_t covered) {
  boost::crc_32_type crc;
  crc.process_bytes(p, covered);
  put32(p + covered, crc.checksum());
}
void check(bool ok) {
  if (!ok) __builtin_trap();
}

void fuzzHandle(const std::uint8_t* data, std::size_t size, bool fix, bool build) {
  std::vector<std::uint8_t> in(optiflow::net::kHandleBytes, 0);
  std::memcpy(in.data(), data, std::min(size, in.size()));
  if (build) put64(in.data() + 8, wire::buildId());
  const std::size_t rails = std::min<std::size_t>(in[7], wire::kMaxRails);
  if (fix) fixCrc(in.data(), 24 + 20 * rails);
  wire::TcpHandle h;
  std::string error;
  if (!wire::decodeTcpHandle(in.data(), &h, &error)) {
    check(!error.empty());
    return;
  }
  int streams = 0;
  check(h.railCount >= 1 && h.railCount <= wire::kMaxRails);
  for (int r = 0; r < h.railCount; ++r) {
    check(h.rails[r].streams >= 1 && h.rails[r].port != 0);
    streams += h.rails[r].streams;
  }
  check(streams <= wire::kMaxStreams);
  std::vector<std::uint8_t> again(optiflow::net::kHandleBytes);
  check(wire::encodeTcpHandle(h, again.data()));
  wire::TcpHandle back;
  check(wire::decodeTcpHandle(again.data(), &back, &error));
  check(back.listenId == h.listenId && back.railCount == h.railCount);
}

void fuzzHello(const std::uint8_t* data, std::size_t size, bool fix, bool build) {
  std::vector<std::uint8_t> in(wire::kHelloBytes, 0);
  std::memcpy(in.data(), data, std::min(size, in.size()));
  if (build) put64(in.data() + 12, wire::buildId());
  if (fix) fixCrc(in.data(), wire::kHelloBytes - 4);
  wire::Hello h;
  std::string error;
  if (!wire::decodeHello(in.data(), &h, &error)) {
    check(!error.empty());
    return;
  }
  check(h.streamCount >= 1 && h.streamCount <= wire::kMaxStreams && h.streamIndex < h.streamCount);
  std::uint8_t again[wire::kHelloBytes];
  wire::encodeHello(h, again);
  wire::Hello back;
  check(wire::decodeHello(again, &back, &error) && back.connId == h.connId && back.listenId == h.listenId);
}

void fuzzMessage(const std::uint8_t* data, std::size_t size, int streams, bool fix) {
  std::vector<std::uint8_t> in(data, data + size);  // exactly `size` bytes: ASan sees any over-read
  if (fix && size >= wire::kMessageFixedBytes) {
    const std::uint16_t parts = static_cast<std::uint16_t>(in[12] | (in[13] << 8));
    const std::size_t total = wire::messageHeaderBytes(parts);
    if (parts <= wire::kMaxStreams && total <= size) fixCrc(in.data(), total - 4);
  }
  const std::uint64_t maxBytes = std::uint64_t{1} << 30;
  wire::MessageHeader h;
  std::size_t consumed = 0, needed = 0;
  std::string error;
  const wire::Decode d =
      wire::decodeMessageHeader(in.data(), in.size(), streams, maxBytes, &h, &consumed, &needed, &error);
  if (d == wire::Decode::kCorrupt) {
    check(!error.empty());
    return;
  }
  if (d == wire::Decode::kNeedMore) {
    check(needed > in.size() && needed <= wire::kMaxMessageHeaderBytes);
    return;
  }
  check(consumed == wire::messageHeaderBytes(h.partCount) && consumed <= in.size());
  check(h.size <= maxBytes && h.partCount <= streams && (h.size == 0) == (h.partCount == 0));
  std::uint64_t sum = 0;
  for (int i = 0; i < h.partCount; ++i) {
    check(h.parts[i].stream < streams && h.parts[i].bytes > 0);
    check(i == 0 || h.parts[i].stream > h.parts[i - 1].stream);
    sum += h.parts[i].bytes;
  }
  check(sum == h.size);
  std::vector<std::uint8_t> again(wire::kMaxMessageHeaderBytes);
  const std::size_t n = wire::encodeMessageHeader(h, again.data());
  check(n == consumed);
  wire::MessageHeader back;
  check(wire::decodeMessageHeader(again.data(), n, streams, maxBytes, &back, nullptr, nullptr, &error) ==
        wire::Decode::kOk);
  check(back.seq == h.seq && back.tag == h.tag && back.size == h.size && back.partCount == h.partCount);
}

void fuzzChunk(const std::uint8_t* data, std::size_t size, bool fix) {
  std::vector<std::uint8_t> in(data, data + size);
  if (fix && size >= wire::kChunkHeaderBytes) fixCrc(in.data(), wire::kChunkHeaderBytes - 4);
  wire::ChunkHeader c;
  std::string error;
  const wire::Decode d = wire::decodeChunkHeader(in.data(), in.size(), &c, &error);
  if (d == wire::Decode::kCorrupt) check(!error.empty());
  if (d == wire::Decode::kNeedMore) check(in.size() < wire::kChunkHeaderBytes);
}

void fuzzSplit(const std::uint8_t* data, std::size_t size, int streams) {
  if (size < 10) return;
  std::uint64_t bytes = 0;
  std::memcpy(&bytes, data, 8);
  bytes &= (std::uint64_t{1} << 40) - 1;
  const std::uint64_t align = std::uint64_t{1} << (data[8] % 16);
  const std::uint64_t minStripe = std::uint64_t{data[9]} << 12;
  std::uint32_t weights[wire::kMaxStreams] = {};
  for (int s = 0; s < streams && 10 + s < static_cast<int>(size); ++s) weights[s] = data[10 + s] % 4;
  wire::Part parts[wire::kMaxStreams];
  const int n = wire::split(bytes, weights, streams, minStripe, align, parts);
  check(n >= 0 && n <= streams && (n == 0) == (bytes == 0));
  std::uint64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    check(parts[i].bytes > 0 && parts[i].stream < streams);
    check(i == 0 || parts[i].stream > parts[i - 1].stream);
    check(i + 1 == n || parts[i].bytes % align == 0);
    sum += parts[i].bytes;
  }
  check(sum == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const int mode = data[0] & 7;
  const bool fix = (data[0] & 8) != 0;
  const bool build = (data[0] & 16) != 0;
  const int streams = data[1] % wire::kMaxStreams + 1;
  data += 2;
  size -= 2;
  switch (mode) {
    case 0:
      fuzzHandle(data, size, fix, build);
      break;
    case 1:
      fuzzHello(data, size, fix, build);
      break;
    case 2:
      fuzzMessage(data, size, streams, fix);
      break;
    case 3:
      fuzzChunk(data, size, fix);
      break;
    default:
      fuzzSplit(data, size, streams);
      break;
  }
  return 0;
}
