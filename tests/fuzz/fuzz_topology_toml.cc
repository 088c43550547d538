// libFuzzer target: parseTopologyToml must never crash or throw, and whatever it accepts must survive
// topologyToToml + parse unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "optiflow/core/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace optiflow::core;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<Topology> t = parseTopologyToml(text, "<fuzz>");
  if (!t.ok()) {
    (void)t.error().str();
    return 0;
  }
  std::string again = topologyToToml(*t);
  Result<Topology> back = parseTopologyToml(again, "<fuzz-roundtrip>");
  if (!back.ok() || !(*back == *t)) __builtin_trap();
  (void)topologyToJson(*t).dump();
  (void)describeTopology(*t);
  return 0;
}
