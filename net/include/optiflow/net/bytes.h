// Little-endian field packing and the CRC-32 every OptiFlow frame ends with (net wire format, RDMA handles and QP
// info, optiflowd's probe control frames): one definition, so every frame is packed and checked the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include <boost/crc.hpp>

namespace optiflow::net::bytes {

inline void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline void put32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void put64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
inline std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint32_t crc32(const std::uint8_t* data, std::size_t length) {
  boost::crc_32_type crc;
  crc.process_bytes(data, length);
  return crc.checksum();
}

}  // namespace optiflow::net::bytes
