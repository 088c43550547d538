// Sizes and bandwidths as people type and read them (nccl-tests conventions: sizes are the whole buffer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"

namespace optiflow::core {

// "4096", "64K", "64KiB", "1M", "1MiB", "1G", "1GiB", "2TiB" (binary multiples, as nccl-tests prints them;
// "KB"/"MB"/"GB" are accepted as binary too). Zero is allowed. Errors say what was expected.
Result<std::uint64_t> parseSize(std::string_view text);

// "1KiB:1GiB" (every power-of-two factor from min to max, like nccl-tests -b -e -f 2), "1KiB:1GiB:4" (factor
// 4), a single size, or a comma-separated list of any of these. Result is sorted and without duplicates; at most
// 4096 sizes.
Result<std::vector<std::uint64_t>> parseSizeList(std::string_view text);

// 1024 -> "1KiB", 1536 -> "1.5KiB", 1000 -> "1000B".
std::string formatSize(std::uint64_t bytes);

// Bytes per microsecond to GB/s (1 GB = 1e9 bytes, as nccl-tests uses).
inline double gbps(double bytes, double microseconds) { return microseconds > 0 ? bytes / microseconds / 1e3 : 0; }

}  // namespace optiflow::core
