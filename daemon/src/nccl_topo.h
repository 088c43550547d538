// NCCL's own view of a node (the XML it writes to NCCL_TOPO_DUMP_FILE) as an OptiFlow Topology.
#pragma once

#include <filesystem>
#include <string_view>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"

namespace optiflow::daemon {

// GPUs from <gpu> elements (the SM version gives the GPU type and the per-link NVLink bandwidth), the intra-node
// fabric from their <nvlink> children (NVSwitch when they target a switch, a mesh when they target GPUs, PCIe
// otherwise), NICs from <net> elements (speed in Mb/s) each serving the GPUs closest to it in the PCI tree. `nodes`
// identical nodes. Errors name the file and what was missing.
core::Result<core::Topology> parseNcclTopoXml(std::string_view xml, std::string_view fileName, int nodes);
core::Result<core::Topology> readNcclTopoDump(const std::filesystem::path& file, int nodes);

}  // namespace optiflow::daemon
