// libFuzzer target: parseNcclTopoXml (NCCL's topology dumps and cloud skeletons) must never crash or throw, with or
// without the command line's hints; whatever it accepts must be a valid topology that survives TOML unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace optiflow::core;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  TopologyHints none;
  TopologyHints all;
  all.nodes = 2;
  all.nicGbps = 200;
  for (const TopologyHints* h : {&none, &all}) {
    std::vector<std::string> notes;
    Result<Topology> t = parseNcclTopoXml(text, "<fuzz>", *h, &notes);
    if (!t.ok()) {
      (void)t.error().str();
      continue;
    }
    if (!t->validate().empty()) __builtin_trap();
    Result<Topology> back = parseTopologyToml(topologyToToml(*t), "<fuzz-roundtrip>");
    if (!back.ok() || !(*back == *t)) __builtin_trap();
    (void)describeTopology(*t);
  }
  return 0;
}
