// The net wire format: round trips, and every corruption class refused with a message.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <array>
#include <cstring>
#include <numeric>
#include <vector>

#include "optiflow/net/wire.h"

namespace optiflow::net::wire {
namespace {

TcpHandle sampleHandle() {
  TcpHandle h;
  h.buildId = buildId();
  h.listenId = 0x1122334455667788ULL;
  h.railCount = 2;
  h.rails[0].family = AF_INET;
  h.rails[0].streams = 2;
  h.rails[0].port = 40000;
  h.rails[0].addr[0] = 10;
  h.rails[0].addr[3] = 7;
  h.rails[1].family = AF_INET6;
  h.rails[1].streams = 3;
  h.rails[1].port = 1;
  h.rails[1].addr[15] = 1;
  return h;
}

TEST(NetWire, BuildIdIsStableAndNonZero) {
  EXPECT_NE(buildId(), 0u);
  EXPECT_EQ(buildId(), buildId());
}

TEST(NetWire, HandleRoundTrip) {
  std::array<std::uint8_t, kHandleBytes> bytes{};
  const TcpHandle h = sampleHandle();
  ASSERT_TRUE(encodeTcpHandle(h, bytes.data()));
  // Port in network order at rail offset 2.
  EXPECT_EQ(bytes[24 + 2], 40000 >> 8);
  EXPECT_EQ(bytes[24 + 3], 40000 & 0xff);
  TcpHandle out;
  std::string error;
  ASSERT_TRUE(decodeTcpHandle(bytes.data(), &out, &error)) << error;
  EXPECT_EQ(out.listenId, h.listenId);
  ASSERT_EQ(out.railCount, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out.rails[r].family, h.rails[r].family);
    EXPECT_EQ(out.rails[r].streams, h.rails[r].streams);
    EXPECT_EQ(out.rails[r].port, h.rails[r].port);
    EXPECT_EQ(0, std::memcmp(out.rails[r].addr, h.rails[r].addr, 16));
  }
}

TEST(NetWire, HandleEncodeRefusesBadRailCount) {
  std::array<std::uint8_t, kHandleBytes> bytes{};
  TcpHandle h = sampleHandle();
  h.railCount = kMaxRails + 1;
  EXPECT_FALSE(encodeTcpHandle(h, bytes.data()));
  h.railCount = 0;
  EXPECT_FALSE(encodeTcpHandle(h, bytes.data()));
}

// Re-encodes `h` and expects decode to fail with `what` in the message.
void expectHandleRefused(const TcpHandle& h, const char* what) {
  std::array<std::uint8_t, kHandleBytes> bytes{};
  ASSERT_TRUE(encodeTcpHandle(h, bytes.data()));
  TcpHandle out;
  std::string error;
  EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error));
  EXPECT_NE(error.find(what), std::string::npos) << error;
}

TEST(NetWire, HandleCorruptionsAreRefused) {
  std::array<std::uint8_t, kHandleBytes> good{};
  ASSERT_TRUE(encodeTcpHandle(sampleHandle(), good.data()));
  TcpHandle out;
  std::string error;

  auto bytes = good;
  bytes[0] ^= 1;
  EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error));
  EXPECT_NE(error.find("not an OptiFlow net handle"), std::string::npos) << error;

  bytes = good;
  bytes[4] = 9;  // wire version
  EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error));
  EXPECT_NE(error.find("another build"), std::string::npos) << error;

  bytes = good;
  bytes[6] = 2;  // IB kind
  EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error));
  EXPECT_NE(error.find("not TCP"), std::string::npos) << error;

  bytes = good;
  bytes[7] = 9;
  EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error));
  EXPECT_NE(error.find("rail count 9"), std::string::npos) << error;

  // Every single bit flip in the covered bytes is caught.
  for (std::size_t i = 8; i < 24 + 2 * 20 + 4; ++i) {
    bytes = good;
    bytes[i] ^= 0x10;
    EXPECT_FALSE(decodeTcpHandle(bytes.data(), &out, &error)) << "byte " << i;
  }

  TcpHandle h = sampleHandle();
  h.buildId ^= 1;
  expectHandleRefused(h, "another build");
  h = sampleHandle();
  h.rails[1].family = 99;
  expectHandleRefused(h, "family 99");
  h = sampleHandle();
  h.rails[0].streams = 0;
  expectHandleRefused(h, "0 streams");
  h = sampleHandle();
  h.rails[0].port = 0;
  expectHandleRefused(h, "port 0");
  h = sampleHandle();
  h.rails[0].streams = 14;  // 14 + 3 > kMaxStreams
  expectHandleRefused(h, "17 streams");
}

TEST(NetWire, HelloRoundTripAndCorruptions) {
  Hello h{buildId(), 42, 77, 3, 5};
  std::uint8_t bytes[kHelloBytes];
  encodeHello(h, bytes);
  Hello out;
  std::string error;
  ASSERT_TRUE(decodeHello(bytes, &out, &error)) << error;
  EXPECT_EQ(out.listenId, 42u);
  EXPECT_EQ(out.connId, 77u);
  EXPECT_EQ(out.streamIndex, 3);
  EXPECT_EQ(out.streamCount, 5);

  for (std::size_t i = 0; i < kHelloBytes; ++i) {
    std::uint8_t bad[kHelloBytes];
    std::memcpy(bad, bytes, kHelloBytes);
    bad[i] ^= 0x01;
    EXPECT_FALSE(decodeHello(bad, &out, &error)) << "byte " << i;
  }
  auto refused = [&](Hello x, const char* what) {
    std::uint8_t b[kHelloBytes];
    encodeHello(x, b);
    std::string e;
    EXPECT_FALSE(decodeHello(b, &out, &e));
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  refused(Hello{buildId() + 1, 42, 77, 0, 1}, "another build");
  refused(Hello{buildId(), 42, 77, 0, 0}, "stream count 0");
  refused(Hello{buildId(), 42, 77, 0, kMaxStreams + 1}, "stream count 17");
  refused(Hello{buildId(), 42, 77, 4, 4}, "stream index 4");
}

MessageHeader header3() {
  MessageHeader h;
  h.seq = 9;
  h.tag = -3;
  h.size = 100;
  h.partCount = 3;
  h.parts[0] = {0, 50};
  h.parts[1] = {2, 30};
  h.parts[2] = {3, 20};
  return h;
}

TEST(NetWire, MessageHeaderRoundTripIncrementally) {
  std::uint8_t bytes[kMaxMessageHeaderBytes];
  const std::size_t n = encodeMessageHeader(header3(), bytes);
  ASSERT_EQ(n, messageHeaderBytes(3));
  MessageHeader out;
  std::size_t consumed = 0, needed = 0;
  std::string error;
  // Fed byte by byte, as a socket may deliver it: kNeedMore until the last byte, never reading past `length`.
  for (std::size_t len = 0; len < n; ++len) {
    std::vector<std::uint8_t> prefix(bytes, bytes + len);
    ASSERT_EQ(decodeMessageHeader(prefix.data(), len, 4, 1000, &out, &consumed, &needed, &error), Decode::kNeedMore)
        << len << " " << error;
    EXPECT_GT(needed, len);
    EXPECT_LE(needed, n);
  }
  ASSERT_EQ(decodeMessageHeader(bytes, n, 4, 1000, &out, &consumed, &needed, &error), Decode::kOk) << error;
  EXPECT_EQ(consumed, n);
  EXPECT_EQ(out.seq, 9u);
  EXPECT_EQ(out.tag, -3);
  EXPECT_EQ(out.size, 100u);
  ASSERT_EQ(out.partCount, 3);
  EXPECT_EQ(out.parts[1].stream, 2);
  EXPECT_EQ(out.parts[1].bytes, 30u);

  MessageHeader empty;
  empty.seq = 1;
  const std::size_t m = encodeMessageHeader(empty, bytes);
  EXPECT_EQ(m, messageHeaderBytes(0));
  EXPECT_EQ(decodeMessageHeader(bytes, m, 1, 0, &out, &consumed, &needed, &error), Decode::kOk) << error;
  EXPECT_EQ(out.size, 0u);
}

// Encodes h (valid CRC) and expects kCorrupt naming `what`.
void expectHeaderCorrupt(const MessageHeader& h, int streams, std::uint64_t maxBytes, const char* what) {
  std::uint8_t bytes[kMaxMessageHeaderBytes];
  const std::size_t n = encodeMessageHeader(h, bytes);
  MessageHeader out;
  std::size_t consumed = 0, needed = 0;
  std::string error;
  EXPECT_EQ(decodeMessageHeader(bytes, n, streams, maxBytes, &out, &consumed, &needed, &error), Decode::kCorrupt);
  EXPECT_NE(error.find(what), std::string::npos) << error;
}

TEST(NetWire, MessageHeaderCorruptions) {
  expectHeaderCorrupt(header3(), 3, 1000, "stream 3 >= stream count 3");
  expectHeaderCorrupt(header3(), 2, 1000, "part count 3 > stream count 2");
  expectHeaderCorrupt(header3(), 4, 99, "size 100 > limit 99");
  MessageHeader h = header3();
  h.parts[2].stream = 2;
  expectHeaderCorrupt(h, 4, 1000, "not increasing");
  h = header3();
  h.parts[1].bytes = 0;
  expectHeaderCorrupt(h, 4, 1000, "of 0 bytes");
  h = header3();
  h.parts[2].bytes = 19;
  expectHeaderCorrupt(h, 4, 1000, "sum to 99");
  h = header3();
  h.parts[0].bytes = ~0ULL;  // would overflow a naive sum
  expectHeaderCorrupt(h, 4, 1000, "does not fit");
  h = header3();
  h.partCount = 0;
  expectHeaderCorrupt(h, 4, 1000, "has 0 parts");

  std::uint8_t bytes[kMaxMessageHeaderBytes];
  const std::size_t n = encodeMessageHeader(header3(), bytes);
  MessageHeader out;
  std::size_t consumed = 0, needed = 0;
  std::string error;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t bad[kMaxMessageHeaderBytes];
    std::memcpy(bad, bytes, n);
    bad[i] ^= 0x04;
    // A flipped part count may ask for more bytes; fed exactly n bytes it is either kNeedMore or refused.
    const Decode d = decodeMessageHeader(bad, n, 4, 1000, &out, &consumed, &needed, &error);
    EXPECT_NE(d, Decode::kOk) << "byte " << i;
  }
  std::memcpy(bytes, "GARB", 4);
  EXPECT_EQ(decodeMessageHeader(bytes, 4, 4, 1000, &out, &consumed, &needed, &error), Decode::kCorrupt);
  EXPECT_NE(error.find("magic"), std::string::npos);
}

TEST(NetWire, ChunkHeaderRoundTripAndCorruptions) {
  std::uint8_t bytes[kChunkHeaderBytes];
  encodeChunkHeader(ChunkHeader{5, 4096, 8192}, bytes);
  ChunkHeader out;
  std::string error;
  EXPECT_EQ(decodeChunkHeader(bytes, kChunkHeaderBytes - 1, &out, &error), Decode::kNeedMore);
  ASSERT_EQ(decodeChunkHeader(bytes, kChunkHeaderBytes, &out, &error), Decode::kOk) << error;
  EXPECT_EQ(out.seq, 5u);
  EXPECT_EQ(out.offset, 4096u);
  EXPECT_EQ(out.bytes, 8192u);
  for (std::size_t i = 0; i < kChunkHeaderBytes; ++i) {
    std::uint8_t bad[kChunkHeaderBytes];
    std::memcpy(bad, bytes, sizeof(bad));
    bad[i] ^= 0x80;
    EXPECT_EQ(decodeChunkHeader(bad, kChunkHeaderBytes, &out, &error), Decode::kCorrupt) << "byte " << i;
  }
}

std::uint64_t total(const Part* parts, int n) {
  std::uint64_t sum = 0;
  for (int i = 0; i < n; ++i) sum += parts[i].bytes;
  return sum;
}

TEST(NetWire, SplitFollowsWeightsAndAlignment) {
  Part parts[kMaxStreams];
  const std::uint32_t equal[4] = {0, 0, 0, 0};
  EXPECT_EQ(split(0, equal, 4, 0, 4096, parts), 0);

  // Below minStripeBytes: stream 0 only.
  ASSERT_EQ(split(1000, equal, 4, 4096, 4096, parts), 1);
  EXPECT_EQ(parts[0].stream, 0);
  EXPECT_EQ(parts[0].bytes, 1000u);

  // All-zero weights: equal shares, aligned, last takes the rest.
  const std::uint64_t size = (4u << 20) + 123;
  ASSERT_EQ(split(size, equal, 4, 0, 4096, parts), 4);
  EXPECT_EQ(total(parts, 4), size);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].stream, i);
    EXPECT_EQ(parts[i].bytes % 4096, 0u);
    EXPECT_EQ(parts[i].bytes, 1u << 20);
  }

  // 3:1 weights over two rails of two streams each.
  const std::uint32_t weights[4] = {3, 3, 1, 1};
  ASSERT_EQ(split(8u << 20, weights, 4, 0, 4096, parts), 4);
  EXPECT_EQ(parts[0].bytes + parts[1].bytes, 6u << 20);
  EXPECT_EQ(parts[2].bytes + parts[3].bytes, 2u << 20);

  // A zero-weight rail gets nothing; stream indices still increase.
  const std::uint32_t onlyLast[4] = {0, 0, 1, 1};
  ASSERT_EQ(split(1u << 20, onlyLast, 4, 0, 4096, parts), 2);
  EXPECT_EQ(parts[0].stream, 2);
  EXPECT_EQ(parts[1].stream, 3);
  EXPECT_EQ(total(parts, 2), 1u << 20);

  // Shares that round to zero go to later streams: never an empty part.
  ASSERT_EQ(split(5000, equal, 4, 0, 4096, parts), 1);
  EXPECT_EQ(parts[0].stream, 3);
  EXPECT_EQ(parts[0].bytes, 5000u);

  // Deterministic, and always decodable.
  const std::uint32_t odd[5] = {7, 0, 1000, 3, 1};
  for (std::uint64_t s : {1ULL, 4095ULL, 4096ULL, 65537ULL, 999999ULL, 1ULL << 30}) {
    Part a[kMaxStreams], b[kMaxStreams];
    const int n = split(s, odd, 5, 0, 4096, a);
    ASSERT_EQ(n, split(s, odd, 5, 0, 4096, b));
    ASSERT_GE(n, 1);
    EXPECT_EQ(total(a, n), s);
    MessageHeader h;
    h.size = s;
    h.partCount = static_cast<std::uint16_t>(n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(a[i].stream, b[i].stream);
      EXPECT_EQ(a[i].bytes, b[i].bytes);
      EXPECT_GT(a[i].bytes, 0u);
      if (i + 1 < n) {
        EXPECT_EQ(a[i].bytes % 4096, 0u);
      }
      h.parts[i] = a[i];
    }
    std::uint8_t bytes[kMaxMessageHeaderBytes];
    const std::size_t len = encodeMessageHeader(h, bytes);
    MessageHeader out;
    std::string error;
    EXPECT_EQ(decodeMessageHeader(bytes, len, 5, 1ULL << 30, &out, nullptr, nullptr, &error), Decode::kOk) << error;
  }
}

}  // namespace
}  // namespace optiflow::net::wire
