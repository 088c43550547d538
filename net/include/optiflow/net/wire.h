// The net plugin's wire format: the 128-byte connection handle NCCL carries from the listening rank to the connecting
// rank, the hello each stream sends when it connects, and the per-message frames. Everything is little-endian, fixed
// layout, encoded and decoded by the functions below (never by casting a received buffer), and every frame carries a
// CRC-32 so that a corrupt or foreign byte stream is refused with a message instead of being believed.
//
// A message on a connection of S streams (rails x streams per rail):
//   stream 0: MessageHeader (tag, size, sequence number, how the bytes are split over the streams), then the bytes
//             of the part assigned to stream 0, if any
//   stream s: ChunkHeader (sequence number, offset, length), then those bytes, for each part on stream s != 0
// The sender chooses the split per message (rail weights may change at any time); the receiver needs no agreement:
// the header says where every byte goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "optiflow/net/transport.h"

namespace optiflow::net::wire {

inline constexpr std::uint16_t kWireVersion = 1;
inline constexpr int kMaxRails = 4;     // addresses in a handle
inline constexpr int kMaxStreams = 16;  // streams of one connection, over all rails

// A handle says which transport made it in its kind byte: TransportKind::kTcp or kIb (transport.h), never kAuto.
using optiflow::net::TransportKind;

// This build's identity: a connection from a handle or hello with another buildId is refused (the frame layout may
// differ). Derived from the wire version and OPTIFLOW_VERSION.
std::uint64_t buildId();

// ---- Handle (kHandleBytes = 128) ---------------------------------------------------------------------------------
struct RailAddress {
  std::uint8_t family = 0;     // AF_INET or AF_INET6
  std::uint8_t streams = 1;    // streams the connector opens to this address
  std::uint16_t port = 0;      // host order here; network order on the wire
  std::uint8_t addr[16] = {};  // IPv4 in the first 4 bytes
};

struct TcpHandle {
  std::uint64_t buildId = 0;
  std::uint64_t listenId = 0;  // random per listen comm: a hello for another listener is refused
  std::uint8_t railCount = 0;
  RailAddress rails[kMaxRails];
};

// Common prefix of every handle: magic "OFNH", wire version, transport kind. The rest is per transport.
// Layout: magic u32, version u16, kind u8, railCount u8, buildId u64, listenId u64, rails (family u8, streams u8,
// port u16 big-endian, addr[16]) x railCount, CRC-32 of everything before it.
inline constexpr std::uint32_t kHandleMagic = 0x484e464f;  // "OFNH"

// Encodes into out[kHandleBytes] (zero-filled first). false if it does not fit (too many rails).
bool encodeTcpHandle(const TcpHandle& handle, std::uint8_t* out);
// false with *error ("handle magic 0x.. is not an OptiFlow net handle", "handle from another build (..)", "bad
// checksum", "rail count 9 > 4", ...) when the bytes are not a valid TCP handle of this build.
bool decodeTcpHandle(const std::uint8_t* in, TcpHandle* out, std::string* error);

// ---- Stream hello (connector -> listener, first bytes on each stream) ---------------------------------------------
struct Hello {
  std::uint64_t buildId = 0;
  std::uint64_t listenId = 0;
  std::uint64_t connId = 0;  // random per connection: the listener groups a connection's streams by it
  std::uint16_t streamIndex = 0;
  std::uint16_t streamCount = 0;
};
inline constexpr std::size_t kHelloBytes = 40;
void encodeHello(const Hello& hello, std::uint8_t* out);
bool decodeHello(const std::uint8_t* in, Hello* out, std::string* error);

// ---- Frames --------------------------------------------------------------------------------------------------------
struct Part {
  std::uint16_t stream = 0;
  std::uint64_t bytes = 0;  // parts are laid out in stream order: part k starts where part k-1 ends
};

struct MessageHeader {
  std::uint32_t seq = 0;  // per connection, +1 per message
  std::int32_t tag = 0;
  std::uint64_t size = 0;
  std::uint16_t partCount = 0;  // 0 for an empty message
  Part parts[kMaxStreams];
};
inline constexpr std::size_t kMessageFixedBytes = 24;
inline constexpr std::size_t kPartBytes = 12;
inline constexpr std::size_t kMaxMessageHeaderBytes = kMessageFixedBytes + kPartBytes * kMaxStreams + 4;
inline std::size_t messageHeaderBytes(std::uint16_t partCount) {
  return kMessageFixedBytes + kPartBytes * partCount + 4;
}

struct ChunkHeader {
  std::uint32_t seq = 0;
  std::uint64_t offset = 0;  // within the message
  std::uint64_t bytes = 0;
};
inline constexpr std::size_t kChunkHeaderBytes = 28;

// Returns bytes written into out (at least messageHeaderBytes(partCount) bytes of room).
std::size_t encodeMessageHeader(const MessageHeader& header, std::uint8_t* out);
void encodeChunkHeader(const ChunkHeader& chunk, std::uint8_t* out);

enum class Decode { kNeedMore, kOk, kCorrupt };
// Incremental decoding of bytes read from a socket: kNeedMore (with *needed = total bytes the frame needs) until the
// whole frame is there; kCorrupt with *error saying what was wrong (magic, checksum, part count > streamCount,
// stream index out of range or not increasing, parts not summing to size, size > maxBytes); kOk with *consumed.
Decode decodeMessageHeader(const std::uint8_t* in, std::size_t length, int streamCount, std::uint64_t maxBytes,
                           MessageHeader* out, std::size_t* consumed, std::size_t* needed, std::string* error);
Decode decodeChunkHeader(const std::uint8_t* in, std::size_t length, ChunkHeader* out, std::string* error);

// ---- Striping ------------------------------------------------------------------------------------------------------
// Splits `size` bytes over streams 0..streamCount-1. weights[s] is stream s's relative share (streams of one rail
// share that rail's weight); all-zero weights mean equal shares; a message below minStripeBytes goes to stream 0
// only. Parts are multiples of `align` bytes except the last, never empty, in increasing stream order. Returns the
// part count (0 for size 0).
int split(std::uint64_t size, const std::uint32_t* weights, int streamCount, std::uint64_t minStripeBytes,
          std::uint64_t align, Part* parts);

}  // namespace optiflow::net::wire
