#include "optiflow/core/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace optiflow::core {

std::string_view toString(IntraFabricKind k) {
  switch (k) {
    case IntraFabricKind::NvSwitch:
      return "nvswitch";
    case IntraFabricKind::NvLinkMesh:
      return "nvlink-mesh";
    case IntraFabricKind::Pcie:
      return "pcie";
  }
  return "?";
}

std::string_view toString(InterFabricKind k) {
  switch (k) {
    case InterFabricKind::None:
      return "none";
    case InterFabricKind::RailOptimized:
      return "rail-optimized";
    case InterFabricKind::FatTree:
      return "fat-tree";
  }
  return "?";
}

std::string TopologyIssue::str() const { return path.empty() ? message : fmt::format("{}: {}", path, message); }

std::vector<int> Topology::nicsOf(int local) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(nics.size()); ++i) {
    if (std::find(nics[i].gpus.begin(), nics[i].gpus.end(), local) != nics[i].gpus.end()) out.push_back(i);
  }
  return out;
}

int Topology::railOf(int local) const {
  for (int i = 0; i < static_cast<int>(nics.size()); ++i) {
    if (std::find(nics[i].gpus.begin(), nics[i].gpus.end(), local) != nics[i].gpus.end()) return i;
  }
  return -1;
}

namespace {

int switchOf(const IntraFabric& f, int local) {
  for (int s = 0; s < static_cast<int>(f.switches.size()); ++s) {
    const auto& g = f.switches[s].gpus;
    if (std::find(g.begin(), g.end(), local) != g.end()) return s;
  }
  return -1;
}

const NvLinkPair* findLink(const IntraFabric& f, int a, int b) {
  for (const auto& l : f.links) {
    if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) return &l;
  }
  return nullptr;
}

}  // namespace

double Topology::intraBandwidth(int a, int b) const {
  if (a == b || a < 0 || b < 0 || a >= gpusPerNode || b >= gpusPerNode) return 0;
  switch (intra.kind) {
    case IntraFabricKind::NvSwitch:
      return intra.gpuBandwidthGBps;
    case IntraFabricKind::NvLinkMesh: {
      const NvLinkPair* l = findLink(intra, a, b);
      return l ? l->bandwidthGBps : 0;
    }
    case IntraFabricKind::Pcie: {
      int sa = switchOf(intra, a);
      int sb = switchOf(intra, b);
      if (sa < 0 || sb < 0) return 0;
      if (sa == sb) return intra.gpuBandwidthGBps;
      return std::min({intra.gpuBandwidthGBps, intra.switches[sa].uplinkGBps, intra.switches[sb].uplinkGBps,
                       intra.hostBandwidthGBps});
    }
  }
  return 0;
}

double Topology::intraLatencyUs(int a, int b) const {
  if (intraBandwidth(a, b) <= 0) return 0;
  switch (intra.kind) {
    case IntraFabricKind::NvSwitch:
      return intra.latencyUs;
    case IntraFabricKind::NvLinkMesh:
      return findLink(intra, a, b)->latencyUs;
    case IntraFabricKind::Pcie:
      return switchOf(intra, a) == switchOf(intra, b) ? intra.latencyUs : intra.latencyUs + intra.hostLatencyUs;
  }
  return 0;
}

double Topology::nodeEgressBandwidth() const {
  double sum = 0;
  for (const auto& n : nics) sum += n.bandwidthGBps;
  return inter.oversubscription > 0 ? sum / inter.oversubscription : sum;
}

double Topology::interLatencyUs(int srcNic, int dstNic) const {
  int n = static_cast<int>(nics.size());
  if (srcNic < 0 || dstNic < 0 || srcNic >= n || dstNic >= n) return 0;
  int hops = (inter.kind == InterFabricKind::RailOptimized && srcNic == dstNic) ? 1 : 3;
  return std::max(nics[srcNic].latencyUs, nics[dstNic].latencyUs) + hops * inter.switchLatencyUs;
}

// ---- validation ----

namespace {

class Checker {
 public:
  void add(std::string path, std::string message) { issues_.push_back({std::move(path), std::move(message)}); }

  void bandwidth(const std::string& path, double v) {
    if (!std::isfinite(v) || v < Topology::kMinBandwidthGBps || v > Topology::kMaxBandwidthGBps) {
      add(path, fmt::format("expected a bandwidth in GB/s, >= {} and <= {}, got {}", Topology::kMinBandwidthGBps,
                            Topology::kMaxBandwidthGBps, v));
    }
  }
  void latency(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0 || v > Topology::kMaxLatencyUs) {
      add(path, fmt::format("expected a latency in us, >= 0 and <= {}, got {}", Topology::kMaxLatencyUs, v));
    }
  }
  // Returns false when out of range, so callers can skip lookups by that index.
  bool gpu(const std::string& path, int g, int gpusPerNode) {
    if (g >= 0 && g < gpusPerNode) return true;
    add(path, fmt::format("GPU index {} is out of range: a node has GPUs 0..{} (gpus_per_node = {})", g,
                          gpusPerNode - 1, gpusPerNode));
    return false;
  }

  std::vector<TopologyIssue> take() { return std::move(issues_); }

 private:
  std::vector<TopologyIssue> issues_;
};

void checkNvSwitch(const Topology& t, Checker& c) {
  c.bandwidth("intra.gpu_bandwidth_gbytes_per_s", t.intra.gpuBandwidthGBps);
  c.latency("intra.latency_us", t.intra.latencyUs);
}

void checkMesh(const Topology& t, Checker& c) {
  const IntraFabric& f = t.intra;
  c.latency("intra.latency_us", f.latencyUs);
  if (f.links.empty() && t.gpusPerNode > 1) c.add("intra.links", "an nvlink-mesh needs at least one link");
  std::set<std::pair<int, int>> seen;
  std::vector<std::vector<int>> adj(t.gpusPerNode);
  for (size_t i = 0; i < f.links.size(); ++i) {
    const NvLinkPair& l = f.links[i];
    std::string p = fmt::format("intra.links[{}]", i);
    bool okA = c.gpu(p + ".gpus[0]", l.a, t.gpusPerNode);
    bool okB = c.gpu(p + ".gpus[1]", l.b, t.gpusPerNode);
    if (okA && okB) {
      if (l.a == l.b) {
        c.add(p + ".gpus", fmt::format("a link needs two different GPUs, got [{}, {}]", l.a, l.b));
      } else if (!seen.insert(std::minmax(l.a, l.b)).second) {
        c.add(p + ".gpus",
              fmt::format("GPUs {} and {} are linked twice; give one entry with the summed bandwidth", l.a, l.b));
      } else {
        adj[l.a].push_back(l.b);
        adj[l.b].push_back(l.a);
      }
    }
    c.bandwidth(p + ".bandwidth_gbytes_per_s", l.bandwidthGBps);
    c.latency(p + ".latency_us", l.latencyUs);
  }
  if (f.links.empty()) return;
  // Unconnected GPUs could only talk through host memory, which this model does not describe.
  std::vector<bool> reached(t.gpusPerNode, false);
  std::vector<int> stack{0};
  reached[0] = true;
  while (!stack.empty()) {
    int g = stack.back();
    stack.pop_back();
    for (int h : adj[g]) {
      if (!reached[h]) {
        reached[h] = true;
        stack.push_back(h);
      }
    }
  }
  for (int g = 0; g < t.gpusPerNode; ++g) {
    if (!reached[g]) {
      c.add("intra.links", fmt::format("GPU {} cannot reach GPU 0 over NVLink (the mesh must be connected)", g));
      break;
    }
  }
}

void checkPcie(const Topology& t, Checker& c) {
  const IntraFabric& f = t.intra;
  c.bandwidth("intra.gpu_bandwidth_gbytes_per_s", f.gpuBandwidthGBps);
  c.latency("intra.latency_us", f.latencyUs);
  if (f.switches.empty()) {
    c.add("intra.switches", "a pcie fabric needs at least one switch");
    return;
  }
  std::vector<int> owner(t.gpusPerNode, -1);
  for (size_t s = 0; s < f.switches.size(); ++s) {
    std::string p = fmt::format("intra.switches[{}]", s);
    if (f.switches[s].gpus.empty()) c.add(p + ".gpus", "a switch needs at least one GPU");
    for (size_t j = 0; j < f.switches[s].gpus.size(); ++j) {
      int g = f.switches[s].gpus[j];
      std::string gp = fmt::format("{}.gpus[{}]", p, j);
      if (!c.gpu(gp, g, t.gpusPerNode)) continue;
      if (owner[g] >= 0) {
        c.add(gp, fmt::format("GPU {} is already under intra.switches[{}]; a GPU sits under exactly one switch", g,
                              owner[g]));
      } else {
        owner[g] = static_cast<int>(s);
      }
    }
    c.bandwidth(p + ".uplink_bandwidth_gbytes_per_s", f.switches[s].uplinkGBps);
  }
  for (int g = 0; g < t.gpusPerNode; ++g) {
    if (owner[g] < 0) {
      c.add("intra.switches", fmt::format("GPU {} is under no switch", g));
      break;
    }
  }
  if (f.switches.size() > 1 || f.hostBandwidthGBps != 0) {
    c.bandwidth("intra.host_bandwidth_gbytes_per_s", f.hostBandwidthGBps);
  }
  c.latency("intra.host_latency_us", f.hostLatencyUs);
}

void checkUnusedIntraFields(const Topology& t, Checker& c) {
  const IntraFabric& f = t.intra;
  std::string_view k = toString(f.kind);
  if (f.kind != IntraFabricKind::NvLinkMesh && !f.links.empty()) {
    c.add("intra.links", fmt::format("links are only for kind = \"nvlink-mesh\", not \"{}\"", k));
  }
  if (f.kind != IntraFabricKind::Pcie) {
    if (!f.switches.empty())
      c.add("intra.switches", fmt::format("switches are only for kind = \"pcie\", not \"{}\"", k));
    if (f.hostBandwidthGBps != 0 || f.hostLatencyUs != 0) {
      c.add("intra.host_bandwidth_gbytes_per_s", fmt::format("host path is only for kind = \"pcie\", not \"{}\"", k));
    }
  }
  if (f.kind == IntraFabricKind::NvLinkMesh && f.gpuBandwidthGBps != 0) {
    c.add("intra.gpu_bandwidth_gbytes_per_s", "an nvlink-mesh has per-link bandwidths only (intra.links)");
  }
}

void checkNics(const Topology& t, Checker& c) {
  std::set<std::string> names;
  std::vector<bool> served(t.gpusPerNode, false);
  for (size_t i = 0; i < t.nics.size(); ++i) {
    const Nic& n = t.nics[i];
    std::string p = fmt::format("nics[{}]", i);
    if (n.name.empty()) {
      c.add(p + ".name", "expected a non-empty NIC name");
    } else if (!names.insert(n.name).second) {
      c.add(p + ".name", fmt::format("NIC name \"{}\" is used twice", n.name));
    }
    c.bandwidth(p + ".bandwidth_gbytes_per_s", n.bandwidthGBps);
    c.latency(p + ".latency_us", n.latencyUs);
    if (n.gpus.empty()) c.add(p + ".gpus", "a NIC must serve at least one local GPU");
    std::set<int> mine;
    for (size_t j = 0; j < n.gpus.size(); ++j) {
      std::string gp = fmt::format("{}.gpus[{}]", p, j);
      if (!c.gpu(gp, n.gpus[j], t.gpusPerNode)) continue;
      if (!mine.insert(n.gpus[j]).second) {
        c.add(gp, fmt::format("GPU {} is listed twice", n.gpus[j]));
      } else {
        served[n.gpus[j]] = true;
      }
    }
  }
  if (t.nodes > 1) {
    if (t.nics.empty()) {
      c.add("nics", fmt::format("a topology of {} nodes needs at least one NIC per node", t.nodes));
      return;
    }
    for (int g = 0; g < t.gpusPerNode; ++g) {
      if (!served[g]) {
        c.add("nics", fmt::format("GPU {} is served by no NIC (every GPU needs one when nodes > 1)", g));
        break;
      }
    }
  }
}

void checkInter(const Topology& t, Checker& c) {
  const InterFabric& f = t.inter;
  if (f.kind == InterFabricKind::None) {
    if (t.nodes > 1) {
      c.add("inter", fmt::format("an inter-node fabric is required when nodes > 1 (nodes = {})", t.nodes));
    } else if (f.oversubscription != 1.0 || f.switchLatencyUs != 0) {
      c.add("inter", "oversubscription/switch latency are set but there is no inter-node fabric");
    }
    return;
  }
  if (!std::isfinite(f.oversubscription) || f.oversubscription < 1 ||
      f.oversubscription > Topology::kMaxOversubscription) {
    c.add("inter.oversubscription", fmt::format("expected a ratio >= 1 and <= {} (1 = non-blocking), got {}",
                                                Topology::kMaxOversubscription, f.oversubscription));
  }
  c.latency("inter.switch_latency_us", f.switchLatencyUs);
}

}  // namespace

std::vector<TopologyIssue> Topology::validate() const {
  Checker c;
  if (name.empty()) c.add("name", "expected a non-empty topology name");
  bool shapeOk = true;
  if (nodes < 1 || nodes > kMaxNodes) {
    c.add("nodes", fmt::format("expected 1..{} nodes, got {}", kMaxNodes, nodes));
    shapeOk = false;
  }
  if (gpusPerNode < 1 || gpusPerNode > kMaxGpusPerNode) {
    c.add("gpus_per_node", fmt::format("expected 1..{} GPUs per node, got {}", kMaxGpusPerNode, gpusPerNode));
    shapeOk = false;
  }
  if (shapeOk && static_cast<std::int64_t>(nodes) * gpusPerNode > kMaxRanks) {
    c.add("nodes", fmt::format("{} nodes x {} GPUs = {} ranks, more than the {} supported", nodes, gpusPerNode,
                               static_cast<std::int64_t>(nodes) * gpusPerNode, kMaxRanks));
    shapeOk = false;
  }
  if (gpuType.empty()) c.add("gpu_type", "expected a non-empty GPU type name");
  // Everything below indexes GPUs, which needs a sane gpusPerNode.
  if (!shapeOk) return c.take();
  switch (intra.kind) {
    case IntraFabricKind::NvSwitch:
      checkNvSwitch(*this, c);
      break;
    case IntraFabricKind::NvLinkMesh:
      checkMesh(*this, c);
      break;
    case IntraFabricKind::Pcie:
      checkPcie(*this, c);
      break;
  }
  checkUnusedIntraFields(*this, c);
  checkNics(*this, c);
  checkInter(*this, c);
  return c.take();
}

// ---- output ----

nlohmann::json topologyToJson(const Topology& t) {
  using nlohmann::json;
  json intra = {{"kind", toString(t.intra.kind)}};
  switch (t.intra.kind) {
    case IntraFabricKind::NvSwitch:
      intra["gpu_bandwidth_gbytes_per_s"] = t.intra.gpuBandwidthGBps;
      intra["latency_us"] = t.intra.latencyUs;
      break;
    case IntraFabricKind::NvLinkMesh: {
      intra["latency_us"] = t.intra.latencyUs;
      json links = json::array();
      for (const auto& l : t.intra.links) {
        links.push_back(
            {{"gpus", {l.a, l.b}}, {"bandwidth_gbytes_per_s", l.bandwidthGBps}, {"latency_us", l.latencyUs}});
      }
      intra["links"] = std::move(links);
      break;
    }
    case IntraFabricKind::Pcie: {
      intra["gpu_bandwidth_gbytes_per_s"] = t.intra.gpuBandwidthGBps;
      intra["latency_us"] = t.intra.latencyUs;
      intra["host_bandwidth_gbytes_per_s"] = t.intra.hostBandwidthGBps;
      intra["host_latency_us"] = t.intra.hostLatencyUs;
      json sw = json::array();
      for (const auto& s : t.intra.switches) {
        sw.push_back({{"gpus", s.gpus}, {"uplink_bandwidth_gbytes_per_s", s.uplinkGBps}});
      }
      intra["switches"] = std::move(sw);
      break;
    }
  }
  json nics = json::array();
  for (const auto& n : t.nics) {
    nics.push_back(
        {{"name", n.name}, {"bandwidth_gbytes_per_s", n.bandwidthGBps}, {"latency_us", n.latencyUs}, {"gpus", n.gpus}});
  }
  json inter = {{"kind", toString(t.inter.kind)}};
  if (t.inter.kind != InterFabricKind::None) {
    inter["oversubscription"] = t.inter.oversubscription;
    inter["switch_latency_us"] = t.inter.switchLatencyUs;
  }
  std::vector<int> rail(t.gpusPerNode > 0 ? t.gpusPerNode : 0);
  for (int g = 0; g < static_cast<int>(rail.size()); ++g) rail[g] = t.railOf(g);
  json gpus = json::array();
  for (int r = 0; r < t.nRanks(); ++r) {
    int local = t.localOf(r);
    json g = {{"rank", r}, {"node", t.nodeOf(r)}, {"local", local}};
    if (rail[local] >= 0) {
      g["nic"] = rail[local];
      g["nic_name"] = t.nics[rail[local]].name;
    } else {
      g["nic"] = nullptr;
    }
    gpus.push_back(std::move(g));
  }
  return {{"name", t.name},
          {"nodes", t.nodes},
          {"gpus_per_node", t.gpusPerNode},
          {"n_ranks", t.nRanks()},
          {"gpu_type", t.gpuType},
          {"intra", std::move(intra)},
          {"nics", std::move(nics)},
          {"node_egress_gbytes_per_s", t.nodeEgressBandwidth()},
          {"inter", std::move(inter)},
          {"gpus", std::move(gpus)}};
}

namespace {

std::string joinInts(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s;
}

}  // namespace

std::string describeTopology(const Topology& t) {
  std::string out = fmt::format("{}: {} node{} x {} {} = {} GPUs\n", t.name, t.nodes, t.nodes == 1 ? "" : "s",
                                t.gpusPerNode, t.gpuType, t.nRanks());
  switch (t.intra.kind) {
    case IntraFabricKind::NvSwitch:
      out += fmt::format("intra-node: NVSwitch, {} GB/s per GPU per direction, {} us\n", t.intra.gpuBandwidthGBps,
                         t.intra.latencyUs);
      break;
    case IntraFabricKind::NvLinkMesh:
      out += fmt::format("intra-node: NVLink mesh, {} links\n", t.intra.links.size());
      for (const auto& l : t.intra.links) {
        out += fmt::format("  GPU {} <-> GPU {}  {:>7} GB/s  {} us\n", l.a, l.b, l.bandwidthGBps, l.latencyUs);
      }
      break;
    case IntraFabricKind::Pcie:
      out += fmt::format("intra-node: PCIe, {} GB/s per GPU, {} us; {} switches, host path {} GB/s +{} us\n",
                         t.intra.gpuBandwidthGBps, t.intra.latencyUs, t.intra.switches.size(),
                         t.intra.hostBandwidthGBps, t.intra.hostLatencyUs);
      for (size_t s = 0; s < t.intra.switches.size(); ++s) {
        out += fmt::format("  switch {}: GPUs {}  uplink {} GB/s\n", s, joinInts(t.intra.switches[s].gpus),
                           t.intra.switches[s].uplinkGBps);
      }
      break;
  }
  if (!t.nics.empty()) {
    size_t w = 4;
    for (const auto& n : t.nics) w = std::max(w, n.name.size());
    out += fmt::format("NICs per node: {} ({} GB/s node egress)\n", t.nics.size(), t.nodeEgressBandwidth());
    out += fmt::format("  {:<{}}  {:>8}  {:>7}  {}\n", "name", w, "GB/s", "lat us", "GPUs");
    for (const auto& n : t.nics) {
      out += fmt::format("  {:<{}}  {:>8}  {:>7}  {}\n", n.name, w, n.bandwidthGBps, n.latencyUs, joinInts(n.gpus));
    }
  }
  if (t.inter.kind != InterFabricKind::None) {
    out += fmt::format("inter-node: {}, oversubscription {}:1, {} us per switch hop\n", toString(t.inter.kind),
                       t.inter.oversubscription, t.inter.switchLatencyUs);
  }
  return out;
}

}  // namespace optiflow::core
