// The cluster a schedule runs on: `nodes` identical nodes of `gpusPerNode` GPUs, an intra-node fabric (NVSwitch,
// NVLink mesh or PCIe switches), the NICs of a node and the GPUs each serves (rails), and the inter-node fabric.
// Every component later in the pipeline (language, compiler, simulator, tuner) reads the machine only through
// this model, so it carries a bandwidth and a latency on every link it describes.
//
// Units everywhere: bandwidth in GB/s (1e9 bytes per second) per direction, latency in microseconds.
// Ranks are numbered node-major: rank = node * gpusPerNode + localGpu.
// The TOML format is documented in docs/topology.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/error.h"

namespace optiflow::core {

enum class IntraFabricKind : std::uint8_t { NvSwitch, NvLinkMesh, Pcie };
enum class InterFabricKind : std::uint8_t { None, RailOptimized, FatTree };

// TOML/JSON spellings: "nvswitch", "nvlink-mesh", "pcie"; "none", "rail-optimized", "fat-tree".
std::string_view toString(IntraFabricKind k);
std::string_view toString(InterFabricKind k);

// A direct NVLink connection between two local GPUs (all the NVLinks between the pair, summed).
struct NvLinkPair {
  int a = 0;
  int b = 0;
  double bandwidthGBps = 0;
  double latencyUs = 0;
  friend bool operator==(const NvLinkPair&, const NvLinkPair&) = default;
};

// A PCIe switch and the GPUs below it; the uplink leads to the CPU root complex.
struct PcieSwitch {
  std::vector<int> gpus;
  double uplinkGBps = 0;
  friend bool operator==(const PcieSwitch&, const PcieSwitch&) = default;
};

// One struct for the three kinds so consumers can switch on `kind` without a variant; the fields a kind does
// not use stay at their defaults (topologyToToml/parse keep them there, so operator== stays meaningful).
struct IntraFabric {
  IntraFabricKind kind = IntraFabricKind::NvSwitch;
  // NvSwitch: each GPU's bandwidth into the switch. Pcie: each GPU's link to its PCIe switch. NvLinkMesh: unused.
  double gpuBandwidthGBps = 0;
  // GPU to GPU one hop (NvSwitch; Pcie under one switch). NvLinkMesh: the default for links that give none.
  double latencyUs = 0;
  std::vector<NvLinkPair> links;     // NvLinkMesh
  std::vector<PcieSwitch> switches;  // Pcie
  double hostBandwidthGBps = 0;      // Pcie: path between switches through the CPU(s); 0 = none given
  double hostLatencyUs = 0;          // Pcie: extra latency of crossing the CPU(s)
  friend bool operator==(const IntraFabric&, const IntraFabric&) = default;
};

struct Nic {
  std::string name;
  double bandwidthGBps = 0;  // per direction
  double latencyUs = 0;      // one-way NIC to NIC, switches excluded
  std::vector<int> gpus;     // local GPUs it serves; the first NIC listing a GPU is that GPU's rail
  friend bool operator==(const Nic&, const Nic&) = default;
};

struct InterFabric {
  InterFabricKind kind = InterFabricKind::None;  // None only for single-node topologies
  double oversubscription = 1.0;                 // >= 1; divides a node's injection bandwidth
  double switchLatencyUs = 0;                    // per switch hop
  friend bool operator==(const InterFabric&, const InterFabric&) = default;
};

// A problem validate() found: the TOML key path it concerns (e.g. "nics[2].gpus[0]") and what is wrong.
struct TopologyIssue {
  std::string path;
  std::string message;
  std::string str() const;  // "path: message"
};

struct Topology {
  // 32k GPUs on the 8-GPU presets: the bounds and the NCCL model stay well under a second there.
  static constexpr int kMaxNodes = 4096;
  static constexpr int kMaxGpusPerNode = 1024;
  static constexpr int kMaxRanks = 1 << 20;
  static constexpr double kMaxBandwidthGBps = 1e6;
  // 1 MB/s: anything slower is a typo, and would make times overflow what reports can print.
  static constexpr double kMinBandwidthGBps = 1e-3;
  static constexpr double kMaxLatencyUs = 1e6;
  static constexpr double kMaxOversubscription = 1024;

  std::string name;
  int nodes = 1;
  int gpusPerNode = 1;
  std::string gpuType;
  IntraFabric intra;
  std::vector<Nic> nics;  // of one node (all nodes are identical)
  InterFabric inter;

  int nRanks() const { return nodes * gpusPerNode; }
  // Preconditions: rank in [0, nRanks()), node in [0, nodes), local in [0, gpusPerNode).
  int nodeOf(int rank) const { return rank / gpusPerNode; }
  int localOf(int rank) const { return rank % gpusPerNode; }
  int rankOf(int node, int local) const { return node * gpusPerNode + local; }

  // Indices into `nics` of the NICs serving local GPU `local`, in order; the first is its rail (-1 when none).
  std::vector<int> nicsOf(int local) const;
  int railOf(int local) const;

  // Bandwidth one local GPU can push to another without relaying through a third GPU: the NVSwitch per-GPU
  // bandwidth, the NVLink pair's bandwidth (0 when the pair has no link), or the bottleneck of the PCIe path
  // (through the CPU when the GPUs sit under different switches). 0 for a == b or an index out of range.
  double intraBandwidth(int a, int b) const;
  // Latency of that path; 0 where intraBandwidth is 0.
  double intraLatencyUs(int a, int b) const;

  // What one node can inject into the network: the sum of its NICs divided by the oversubscription.
  double nodeEgressBandwidth() const;
  // One message from NIC `srcNic` on one node to NIC `dstNic` on another: the slower NIC's latency plus the
  // switch hops (1 within a rail of a rail-optimized fabric, 3 = leaf-spine-leaf otherwise).
  double interLatencyUs(int srcNic, int dstNic) const;

  // Every problem, in a stable order (top-level keys, intra, nics, inter); empty when the topology is usable.
  std::vector<TopologyIssue> validate() const;

  friend bool operator==(const Topology&, const Topology&) = default;
};

// ---- TOML ----
// `fileName` only labels diagnostics (and gives the default `name`: its stem). The result is validated.
Result<Topology> parseTopologyToml(std::string_view text, std::string_view fileName);
Result<Topology> loadTopologyFile(const std::string& path);
// Canonical TOML; parseTopologyToml(topologyToToml(t), ...) == t for every valid t.
std::string topologyToToml(const Topology& t);

// ---- presets ----
struct PresetInfo {
  std::string name;
  std::string description;
  std::string gpuType;
  int gpusPerNode = 0;
  int nics = 0;  // per node
  double nicBandwidthGBps = 0;
};

// The built-in node types; `<name>x<N>` gives N such nodes (e.g. dgx-a100x4 = 32 GPUs), N in [1, 4096].
std::vector<PresetInfo> presets();
Result<Topology> presetTopology(std::string_view name);
// ---- NCCL topology XML ----
// What a topology source may lack and the command line (--nodes, --gpu, --nic-gbps) or a config supplies. NCCL's
// XML describes one node; the skeletons cloud images ship for NCCL_TOPO_FILE have no GPU model and no NIC speed.
struct TopologyHints {
  int nodes = 0;        // how many nodes (0: the source's own count; an XML file is one node)
  std::string gpuType;  // XML: the GPU model (V100, A100, A800, H100, H200, H800, B200); empty: from the file
  double nicGbps = 0;   // XML: each NIC's speed in Gb/s where the file gives none; 0: from the file
};
// NCCL_TOPO_DUMP_FILE dumps and NCCL_TOPO_FILE skeletons (docs/topology.md, "NCCL topology XML"): GPUs from <gpu>
// elements, else from NVIDIA <pci> elements (the device id gives the model); the intra-node fabric from <nvlink>
// (NVSwitch, mesh, else PCIe; an 8-GPU SXM board without <nvlink> is an NVSwitch board); NICs from <net>, else from
// network-class <pci> elements, each serving the GPUs nearest to it in the PCI tree. `notes` (when given) receives
// what was assumed. Errors name the file, the element and the flag that would supply what is missing.
Result<Topology> parseNcclTopoXml(std::string_view xml, std::string_view fileName, const TopologyHints& hints,
                                  std::vector<std::string>* notes = nullptr);
Result<Topology> loadNcclTopoXml(const std::string& path, const TopologyHints& hints,
                                 std::vector<std::string>* notes = nullptr);

// The one topology loader of every command: a preset name first, else a file, NCCL XML or our TOML told apart by
// content; hints.nodes then sets the node count of a file (a preset says it in its name: dgx-a100x4). The diagnostic
// names every possibility when none works.
Result<Topology> loadTopology(std::string_view presetOrPath, const TopologyHints& hints = {},
                              std::vector<std::string>* notes = nullptr);

// ---- output ----
nlohmann::json topologyToJson(const Topology& t);
std::string describeTopology(const Topology& t);

}  // namespace optiflow::core
