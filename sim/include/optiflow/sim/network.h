// The physical network a schedule runs on, derived from a core::Topology: vertices (GPUs, switches, CPUs, NICs,
// fabric switches) joined by DIRECTED links (a full-duplex connection is two links, one per direction), each with
// the topology's raw (wire) bandwidth and a latency. The simulator moves every transfer over path(src, dst); the
// lower bounds cut the same graph. Efficiencies (NCCL's 20 of 25 GB/s per NVLink, protocol overheads) are NOT
// applied here: they belong to the simulator's SimParams, so bounds and simulator see the same raw numbers.
//
// Built per topology kind (docs/simulator.md has pictures):
//   NVSwitch:     gpu -> nvswitch -> gpu, one switch vertex per node (full bisection, as on DGX/HGX).
//   NVLink mesh:  gpu -> gpu where the pair has a link; otherwise relayed through a common neighbour GPU (or the
//                 shortest relay chain, the widest among equally short ones).
//   PCIe:         gpu -> pcie switch -> gpu under one switch; across switches gpu -> switch -> cpuN -> cpuM ->
//                 switch -> gpu, where cpuN is the root complex of switch N and cpuN -> cpuM the host path.
//   Inter-node:   gpu -> its rail NIC (Topology::railOf) -> fabric -> the destination GPU's rail NIC -> gpu.
//     rail-optimized: one leaf switch per rail ("rail<i>"), every node's NIC i on it; a spine joins the rails
//                     (leaf <-> spine uplinks carry nodes x NIC bandwidth / oversubscription).
//     fat tree:       one leaf per node ("leaf<n>") above its NICs, a spine above the leaves; the leaf <-> spine
//                     uplink carries the node's NIC bandwidth / oversubscription (Topology::nodeEgressBandwidth).
//
// Latencies are placed so that a path's sum equals the topology's figures: intraLatencyUs(a, b) within a node,
// the NIC latency plus one switch hop per switch crossed (Topology::interLatencyUs) between nodes.
//
// Memory is O(ranks + links); path() is computed in O(path length) from per-rank tables (intra-node relay paths
// of an NVLink mesh are precomputed per pair of local GPUs, O(gpusPerNode^2)).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"

namespace optiflow::sim {

enum class VertexKind : std::uint8_t {
  Gpu,
  NvSwitch,     // one per node, stands for all the node's NVSwitch chips
  PcieSwitch,   // one per IntraFabric::switches entry, per node
  Cpu,          // the root complex a PCIe switch hangs off (one per PCIe switch, per node)
  Nic,          // one per Topology::nics entry, per node
  LeafSwitch,   // rail-optimized: one per rail (shared by all nodes); fat tree: one per node
  SpineSwitch,  // one per fabric
};

enum class LinkKind : std::uint8_t {
  NvLink,      // GPU <-> GPU direct NVLink (mesh)
  NvSwitch,    // GPU <-> NVSwitch port
  Pcie,        // GPU <-> PCIe switch, PCIe switch <-> CPU root complex
  Host,        // CPU root complex <-> CPU root complex (QPI/UPI/Infinity Fabric): the topology's host path
  GpuNic,      // GPU <-> its NIC (the PCIe path is not in the topology; carries the NIC's bandwidth)
  NicFabric,   // NIC <-> leaf switch: the NIC's wire
  FabricCore,  // leaf <-> spine uplinks (oversubscription applies here)
};

// The latency class NCCL's tables use for a hop (nccl-cost-model.md §1.3): NVLINK, PCI or NET.
enum class HopClass : std::uint8_t { NvLink, Pci, Net };

std::string_view toString(VertexKind k);
std::string_view toString(LinkKind k);
std::string_view toString(HopClass c);
HopClass hopClassOf(LinkKind k);

struct Vertex {
  int id = 0;
  VertexKind kind = VertexKind::Gpu;
  std::string name;  // "node0/gpu3", "node0/nvswitch", "node1/mlx5_2", "rail2", "leaf5", "spine"
  int node = -1;     // -1 for fabric switches shared by all nodes (rail leaves, spine)
  int index = 0;     // local GPU, PCIe switch, CPU or NIC index within the node; rail or node for leaves
};

struct Link {
  int id = 0;
  int src = 0;  // vertex ids
  int dst = 0;
  LinkKind kind = LinkKind::NvSwitch;
  std::string name;          // "node0/gpu3->nvswitch", "node1/mlx5_2->rail2", "rail2->spine"
  double bandwidthGBps = 0;  // raw (wire) GB/s, this direction
  double latencyUs = 0;
};

// A path: link ids in travel order. Small paths (all but long NVLink-mesh relay chains) are stored inline, so
// returning one by value never allocates.
class Path {
 public:
  static constexpr int kInline = 8;
  Path() = default;
  void push(int linkId);
  std::span<const int> links() const { return heap_.empty() ? std::span<const int>(inline_.data(), n_) : heap_; }
  operator std::span<const int>() const { return links(); }  // NOLINT(google-explicit-constructor)
  const int* begin() const { return links().data(); }
  const int* end() const { return links().data() + n_; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int operator[](std::size_t i) const { return links()[i]; }

 private:
  std::array<int, kInline> inline_{};
  std::vector<int> heap_;  // used once a path outgrows the inline storage (then holds all of it)
  std::size_t n_ = 0;
};

// Layout guarantee (the lower bounds rely on it): vertices are node-major and every node is laid out alike (its
// GPUs first, in local order, then its NVSwitch or PCIe switches and CPUs, then its NICs); the shared fabric
// (leaves, spine) comes after all nodes. Links follow the same node-major, identical-per-node order.
class Network {
 public:
  // Validates the topology (Topology::validate) and builds the graph; the diagnostic names the first problem.
  static core::Result<Network> build(const core::Topology& topology);

  const core::Topology& topology() const { return topo_; }
  int nRanks() const { return topo_.nRanks(); }
  const std::vector<Vertex>& vertices() const { return vertices_; }
  const std::vector<Link>& links() const { return links_; }
  const Vertex& vertex(int id) const { return vertices_[id]; }
  const Link& link(int id) const { return links_[id]; }

  // Precondition: rank in [0, nRanks()).
  int gpuVertex(int rank) const { return topo_.nodeOf(rank) * vPerNode_ + topo_.localOf(rank); }
  // The rank of a GPU vertex, -1 for any other vertex.
  int rankOfVertex(int vertexId) const;

  // Link ids leaving / entering a vertex, in increasing id order.
  std::span<const int> outLinks(int vertexId) const;
  std::span<const int> inLinks(int vertexId) const;

  // The links a transfer from srcRank to dstRank crosses, in order. Empty when srcRank == dstRank, when a rank is
  // out of range, or when no path exists (a GPU without a NIC in a multi-node topology; validate() rejects that).
  Path path(int srcRank, int dstRank) const;
  // Sum of the latencies along path(srcRank, dstRank).
  double pathLatencyUs(int srcRank, int dstRank) const;
  // The smallest raw bandwidth along the path (0 for an empty path).
  double pathBandwidthGBps(int srcRank, int dstRank) const;

  // Node symmetry (the simulator's folding, docs/simulator.md "Symmetric schedules"): every node is alike, so a
  // renumbering of the nodes maps links to links. A link of node n (and, on a fat tree, the uplink and downlink of
  // node n's leaf) goes to the same link of the node n is renumbered to; the links shared by all nodes (a rail
  // leaf's uplink and downlink) stay where they are. linkNode: the node a link belongs to in that sense, -1 for a
  // shared link; linkAtNode: the same link of another node (a shared link itself).
  int linkNode(int linkId) const;
  int linkAtNode(int linkId, int node) const;

  // Vertex ids by role (-1 when absent).
  int nicVertex(int node, int nicIndex) const;
  int spineVertex() const { return spine_; }

  // A multi-line human-readable summary (vertex and link counts by kind).
  std::string describe() const;

 private:
  Network() = default;
  int addVertex(VertexKind kind, std::string name, int node, int index);
  int addLink(int src, int dst, LinkKind kind, double bw, double lat);
  void appendIntra(int node, int a, int b, Path& p) const;
  void finish();

  core::Topology topo_;
  std::vector<Vertex> vertices_;
  std::vector<Link> links_;
  std::vector<int> outStart_, outIds_, inStart_, inIds_;  // CSR adjacency
  std::vector<int> rankOfVertex_;                         // per vertex, -1 for non-GPU

  // Every node has the same layout: vertices [node * vPerNode_, ...) and links [node * lPerNode_, ...) in the
  // same order, so per-node quantities are a base plus a local offset from the tables below (-1 = none).
  int vPerNode_ = 0;
  int lPerNode_ = 0;
  int nNics_ = 0;
  int nicVertexOff_ = 0;                    // offset of NIC 0 among a node's vertices
  std::vector<int> upOff_, downOff_;        // per local GPU: gpu -> nvswitch/pcie switch, and back
  std::vector<int> nicOutOff_, nicInOff_;   // per local GPU: gpu -> rail NIC, and back
  std::vector<int> nicUpOff_, nicDownOff_;  // per NIC: NIC -> leaf, leaf -> NIC
  std::vector<int> rail_;                   // per local GPU: Topology::railOf
  // PCIe: the switch of each local GPU; per switch: switch -> cpu, cpu -> switch; per (s, t): cpu s -> cpu t.
  std::vector<int> switchOf_, swUpOff_, swDownOff_, hostOff_;
  // NVLink mesh: per local pair a * g + b: the direct link a -> b, or the relay GPUs visited between a and b.
  std::vector<int> meshOff_;
  std::vector<std::vector<int>> meshRelay_;
  // Fabric: leaves are per rail (rail-optimized) or per node (fat tree); per leaf: leaf -> spine, spine -> leaf.
  std::vector<int> leafVertex_, leafUp_, leafDown_;
  int spine_ = -1;
};

}  // namespace optiflow::sim
