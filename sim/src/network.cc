#include "optiflow/sim/network.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

#include <fmt/format.h>

namespace optiflow::sim {

std::string_view toString(VertexKind k) {
  switch (k) {
    case VertexKind::Gpu:
      return "gpu";
    case VertexKind::NvSwitch:
      return "nvswitch";
    case VertexKind::PcieSwitch:
      return "pcie-switch";
    case VertexKind::Cpu:
      return "cpu";
    case VertexKind::Nic:
      return "nic";
    case VertexKind::LeafSwitch:
      return "leaf";
    case VertexKind::SpineSwitch:
      return "spine";
  }
  return "?";
}

std::string_view toString(LinkKind k) {
  switch (k) {
    case LinkKind::NvLink:
      return "nvlink";
    case LinkKind::NvSwitch:
      return "nvswitch";
    case LinkKind::Pcie:
      return "pcie";
    case LinkKind::Host:
      return "host";
    case LinkKind::GpuNic:
      return "gpu-nic";
    case LinkKind::NicFabric:
      return "nic-fabric";
    case LinkKind::FabricCore:
      return "fabric-core";
  }
  return "?";
}

std::string_view toString(HopClass c) {
  switch (c) {
    case HopClass::NvLink:
      return "nvlink";
    case HopClass::Pci:
      return "pci";
    case HopClass::Net:
      return "net";
  }
  return "?";
}

HopClass hopClassOf(LinkKind k) {
  switch (k) {
    case LinkKind::NvLink:
    case LinkKind::NvSwitch:
      return HopClass::NvLink;
    case LinkKind::Pcie:
    case LinkKind::Host:
      return HopClass::Pci;
    case LinkKind::GpuNic:
    case LinkKind::NicFabric:
    case LinkKind::FabricCore:
      return HopClass::Net;
  }
  return HopClass::NvLink;
}

void Path::push(int linkId) {
  if (heap_.empty() && n_ < static_cast<std::size_t>(kInline)) {
    inline_[n_++] = linkId;
    return;
  }
  if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(n_));
  heap_.push_back(linkId);
  ++n_;
}

namespace {

// The part of a vertex name after "node<n>/", for link names inside one node.
std::string_view shortName(const Vertex& v) {
  std::string_view s = v.name;
  if (v.node >= 0) {
    auto slash = s.find('/');
    if (slash != std::string_view::npos) s.remove_prefix(slash + 1);
  }
  return s;
}

}  // namespace

int Network::addVertex(VertexKind kind, std::string name, int node, int index) {
  Vertex v;
  v.id = static_cast<int>(vertices_.size());
  v.kind = kind;
  v.name = std::move(name);
  v.node = node;
  v.index = index;
  vertices_.push_back(std::move(v));
  return vertices_.back().id;
}

int Network::addLink(int src, int dst, LinkKind kind, double bw, double lat) {
  Link l;
  l.id = static_cast<int>(links_.size());
  l.src = src;
  l.dst = dst;
  l.kind = kind;
  const Vertex& a = vertices_[src];
  const Vertex& b = vertices_[dst];
  l.name = (a.node >= 0 && a.node == b.node) ? fmt::format("{}->{}", a.name, shortName(b))
                                             : fmt::format("{}->{}", a.name, b.name);
  l.bandwidthGBps = bw;
  l.latencyUs = lat;
  links_.push_back(std::move(l));
  return links_.back().id;
}

core::Result<Network> Network::build(const core::Topology& t) {
  auto issues = t.validate();
  if (!issues.empty()) {
    return core::Diagnostic{"<topology>", 0, 0,
                            fmt::format("topology '{}' is not usable: {}{}", t.name, issues.front().str(),
                                        issues.size() > 1 ? fmt::format(" (and {} more)", issues.size() - 1) : "")};
  }
  Network net;
  net.topo_ = t;
  const int g = t.gpusPerNode;
  const int nodes = t.nodes;
  const int nNics = static_cast<int>(t.nics.size());
  const auto kind = t.intra.kind;
  const bool fabric = t.inter.kind != core::InterFabricKind::None;
  const int nSw = kind == core::IntraFabricKind::Pcie ? static_cast<int>(t.intra.switches.size()) : 0;
  net.nNics_ = nNics;

  net.rail_.resize(g);
  for (int l = 0; l < g; ++l) net.rail_[l] = t.railOf(l);
  if (kind == core::IntraFabricKind::Pcie) {
    net.switchOf_.assign(g, -1);
    for (int s = 0; s < nSw; ++s) {
      for (int gpu : t.intra.switches[s].gpus) {
        if (gpu >= 0 && gpu < g && net.switchOf_[gpu] < 0) net.switchOf_[gpu] = s;
      }
    }
  }

  // ---- vertices: per node, then the fabric ----
  for (int n = 0; n < nodes; ++n) {
    for (int l = 0; l < g; ++l) net.addVertex(VertexKind::Gpu, fmt::format("node{}/gpu{}", n, l), n, l);
    if (kind == core::IntraFabricKind::NvSwitch)
      net.addVertex(VertexKind::NvSwitch, fmt::format("node{}/nvswitch", n), n, 0);
    for (int s = 0; s < nSw; ++s) net.addVertex(VertexKind::PcieSwitch, fmt::format("node{}/pcie{}", n, s), n, s);
    for (int s = 0; s < nSw; ++s) net.addVertex(VertexKind::Cpu, fmt::format("node{}/cpu{}", n, s), n, s);
    if (n == 0) net.nicVertexOff_ = static_cast<int>(net.vertices_.size());
    for (int i = 0; i < nNics; ++i) net.addVertex(VertexKind::Nic, fmt::format("node{}/{}", n, t.nics[i].name), n, i);
    if (n == 0) net.vPerNode_ = static_cast<int>(net.vertices_.size());
  }
  const bool railOpt = fabric && t.inter.kind == core::InterFabricKind::RailOptimized;
  const int nLeaves = !fabric ? 0 : (railOpt ? nNics : nodes);
  for (int i = 0; i < nLeaves; ++i) {
    net.leafVertex_.push_back(
        net.addVertex(VertexKind::LeafSwitch, railOpt ? fmt::format("rail{}", i) : fmt::format("leaf{}", i), -1, i));
  }
  if (fabric) net.spine_ = net.addVertex(VertexKind::SpineSwitch, "spine", -1, 0);

  // ---- links: per node in the same order, then the fabric core ----
  net.upOff_.assign(g, -1);
  net.downOff_.assign(g, -1);
  net.nicOutOff_.assign(g, -1);
  net.nicInOff_.assign(g, -1);
  net.nicUpOff_.assign(nNics, -1);
  net.nicDownOff_.assign(nNics, -1);
  net.swUpOff_.assign(nSw, -1);
  net.swDownOff_.assign(nSw, -1);
  net.hostOff_.assign(static_cast<std::size_t>(nSw) * nSw, -1);
  if (kind == core::IntraFabricKind::NvLinkMesh) net.meshOff_.assign(static_cast<std::size_t>(g) * g, -1);
  for (int n = 0; n < nodes; ++n) {
    const int vb = n * net.vPerNode_;
    const int lb = static_cast<int>(net.links_.size());
    auto off = [&](int id) { return id - lb; };
    switch (kind) {
      case core::IntraFabricKind::NvSwitch: {
        const int sw = vb + g;
        for (int l = 0; l < g; ++l) {
          int up = net.addLink(vb + l, sw, LinkKind::NvSwitch, t.intra.gpuBandwidthGBps, t.intra.latencyUs);
          int down = net.addLink(sw, vb + l, LinkKind::NvSwitch, t.intra.gpuBandwidthGBps, 0);
          if (n == 0) {
            net.upOff_[l] = off(up);
            net.downOff_[l] = off(down);
          }
        }
        break;
      }
      case core::IntraFabricKind::NvLinkMesh:
        for (const auto& p : t.intra.links) {
          int ab = net.addLink(vb + p.a, vb + p.b, LinkKind::NvLink, p.bandwidthGBps, p.latencyUs);
          int ba = net.addLink(vb + p.b, vb + p.a, LinkKind::NvLink, p.bandwidthGBps, p.latencyUs);
          if (n == 0) {
            net.meshOff_[static_cast<std::size_t>(p.a) * g + p.b] = off(ab);
            net.meshOff_[static_cast<std::size_t>(p.b) * g + p.a] = off(ba);
          }
        }
        break;
      case core::IntraFabricKind::Pcie: {
        const int swBase = vb + g;
        const int cpuBase = vb + g + nSw;
        for (int l = 0; l < g; ++l) {
          int s = net.switchOf_[l];
          if (s < 0) continue;
          int up = net.addLink(vb + l, swBase + s, LinkKind::Pcie, t.intra.gpuBandwidthGBps, t.intra.latencyUs);
          int down = net.addLink(swBase + s, vb + l, LinkKind::Pcie, t.intra.gpuBandwidthGBps, 0);
          if (n == 0) {
            net.upOff_[l] = off(up);
            net.downOff_[l] = off(down);
          }
        }
        if (nSw > 1) {
          for (int s = 0; s < nSw; ++s) {
            double bw = t.intra.switches[s].uplinkGBps;
            int up = net.addLink(swBase + s, cpuBase + s, LinkKind::Pcie, bw, 0);
            int down = net.addLink(cpuBase + s, swBase + s, LinkKind::Pcie, bw, 0);
            if (n == 0) {
              net.swUpOff_[s] = off(up);
              net.swDownOff_[s] = off(down);
            }
          }
          if (t.intra.hostBandwidthGBps > 0) {
            for (int s = 0; s < nSw; ++s) {
              for (int u = 0; u < nSw; ++u) {
                if (s == u) continue;
                int h = net.addLink(cpuBase + s, cpuBase + u, LinkKind::Host, t.intra.hostBandwidthGBps,
                                    t.intra.hostLatencyUs);
                if (n == 0) net.hostOff_[static_cast<std::size_t>(s) * nSw + u] = off(h);
              }
            }
          }
        }
        break;
      }
    }
    // GPU <-> NIC for every (GPU, NIC) pair the topology lists; paths use the rail.
    const int nicBase = vb + net.nicVertexOff_;
    for (int l = 0; l < g; ++l) {
      for (int i = 0; i < nNics; ++i) {
        const auto& gs = t.nics[i].gpus;
        if (std::find(gs.begin(), gs.end(), l) == gs.end()) continue;
        int out = net.addLink(vb + l, nicBase + i, LinkKind::GpuNic, t.nics[i].bandwidthGBps, 0);
        int in = net.addLink(nicBase + i, vb + l, LinkKind::GpuNic, t.nics[i].bandwidthGBps, 0);
        if (n == 0 && i == net.rail_[l]) {
          net.nicOutOff_[l] = off(out);
          net.nicInOff_[l] = off(in);
        }
      }
    }
    if (fabric) {
      for (int i = 0; i < nNics; ++i) {
        const int leaf = net.leafVertex_[railOpt ? i : n];
        int up = net.addLink(nicBase + i, leaf, LinkKind::NicFabric, t.nics[i].bandwidthGBps, t.nics[i].latencyUs);
        int down =
            net.addLink(leaf, nicBase + i, LinkKind::NicFabric, t.nics[i].bandwidthGBps, t.inter.switchLatencyUs);
        if (n == 0) {
          net.nicUpOff_[i] = off(up);
          net.nicDownOff_[i] = off(down);
        }
      }
    }
    if (n == 0) net.lPerNode_ = static_cast<int>(net.links_.size());
  }
  if (fabric) {
    const double over = t.inter.oversubscription >= 1 ? t.inter.oversubscription : 1.0;
    for (int i = 0; i < nLeaves; ++i) {
      double bw = railOpt ? nodes * t.nics[i].bandwidthGBps / over : t.nodeEgressBandwidth();
      net.leafUp_.push_back(
          net.addLink(net.leafVertex_[i], net.spine_, LinkKind::FabricCore, bw, t.inter.switchLatencyUs));
      net.leafDown_.push_back(
          net.addLink(net.spine_, net.leafVertex_[i], LinkKind::FabricCore, bw, t.inter.switchLatencyUs));
    }
  }

  // NVLink mesh relays: for every pair without a direct link, the shortest chain of relay GPUs, the widest
  // (largest bottleneck bandwidth) among equally short ones, lowest GPU index on ties.
  if (kind == core::IntraFabricKind::NvLinkMesh) {
    net.meshRelay_.assign(static_cast<std::size_t>(g) * g, {});
    std::vector<std::vector<std::pair<int, double>>> adj(g);
    for (int a = 0; a < g; ++a) {
      for (int b = 0; b < g; ++b) {
        int o = net.meshOff_[static_cast<std::size_t>(a) * g + b];
        if (o >= 0) adj[a].push_back({b, net.links_[o].bandwidthGBps});
      }
    }
    std::vector<int> dist(g), pred(g);
    std::vector<double> best(g);
    for (int a = 0; a < g; ++a) {
      std::fill(dist.begin(), dist.end(), -1);
      std::fill(pred.begin(), pred.end(), -1);
      std::fill(best.begin(), best.end(), 0.0);
      dist[a] = 0;
      best[a] = std::numeric_limits<double>::infinity();
      std::vector<int> frontier{a};
      while (!frontier.empty()) {
        std::vector<int> next;
        for (int u : frontier) {
          for (auto [v, bw] : adj[u]) {
            if (dist[v] == -1) {
              dist[v] = dist[u] + 1;
              next.push_back(v);
            }
            if (dist[v] == dist[u] + 1) {
              double cand = std::min(best[u], bw);
              if (cand > best[v] || (cand == best[v] && (pred[v] < 0 || u < pred[v]))) {
                best[v] = cand;
                pred[v] = u;
              }
            }
          }
        }
        std::sort(next.begin(), next.end());
        frontier = std::move(next);
      }
      for (int b = 0; b < g; ++b) {
        if (b == a || dist[b] <= 1) continue;
        std::vector<int> chain;
        for (int v = pred[b]; v != a && v >= 0; v = pred[v]) chain.push_back(v);
        std::reverse(chain.begin(), chain.end());
        net.meshRelay_[static_cast<std::size_t>(a) * g + b] = std::move(chain);
      }
    }
  }

  net.finish();
  return net;
}

void Network::finish() {
  const int nv = static_cast<int>(vertices_.size());
  rankOfVertex_.assign(nv, -1);
  for (int v = 0; v < nv; ++v) {
    if (vertices_[v].kind == VertexKind::Gpu) rankOfVertex_[v] = topo_.rankOf(vertices_[v].node, vertices_[v].index);
  }
  outStart_.assign(nv + 1, 0);
  inStart_.assign(nv + 1, 0);
  for (const auto& l : links_) {
    ++outStart_[l.src + 1];
    ++inStart_[l.dst + 1];
  }
  for (int v = 0; v < nv; ++v) {
    outStart_[v + 1] += outStart_[v];
    inStart_[v + 1] += inStart_[v];
  }
  outIds_.assign(links_.size(), 0);
  inIds_.assign(links_.size(), 0);
  std::vector<int> po(outStart_.begin(), outStart_.end() - 1), pi(inStart_.begin(), inStart_.end() - 1);
  for (const auto& l : links_) {
    outIds_[po[l.src]++] = l.id;
    inIds_[pi[l.dst]++] = l.id;
  }
}

int Network::rankOfVertex(int vertexId) const {
  if (vertexId < 0 || vertexId >= static_cast<int>(rankOfVertex_.size())) return -1;
  return rankOfVertex_[vertexId];
}

std::span<const int> Network::outLinks(int v) const {
  if (v < 0 || v >= static_cast<int>(vertices_.size())) return {};
  return std::span<const int>(outIds_).subspan(outStart_[v], outStart_[v + 1] - outStart_[v]);
}

std::span<const int> Network::inLinks(int v) const {
  if (v < 0 || v >= static_cast<int>(vertices_.size())) return {};
  return std::span<const int>(inIds_).subspan(inStart_[v], inStart_[v + 1] - inStart_[v]);
}

int Network::nicVertex(int node, int nicIndex) const {
  if (node < 0 || node >= topo_.nodes || nicIndex < 0 || nicIndex >= nNics_) return -1;
  return node * vPerNode_ + nicVertexOff_ + nicIndex;
}

void Network::appendIntra(int node, int a, int b, Path& p) const {
  const int lb = node * lPerNode_;
  const int g = topo_.gpusPerNode;
  switch (topo_.intra.kind) {
    case core::IntraFabricKind::NvSwitch:
      p.push(lb + upOff_[a]);
      p.push(lb + downOff_[b]);
      return;
    case core::IntraFabricKind::NvLinkMesh: {
      int prev = a;
      for (int v : meshRelay_[static_cast<std::size_t>(a) * g + b]) {
        p.push(lb + meshOff_[static_cast<std::size_t>(prev) * g + v]);
        prev = v;
      }
      int o = meshOff_[static_cast<std::size_t>(prev) * g + b];
      if (o >= 0) p.push(lb + o);
      return;
    }
    case core::IntraFabricKind::Pcie: {
      int sa = switchOf_[a];
      int sb = switchOf_[b];
      if (sa < 0 || sb < 0) return;
      p.push(lb + upOff_[a]);
      if (sa != sb) {
        const int nSw = static_cast<int>(swUpOff_.size());
        int h = hostOff_[static_cast<std::size_t>(sa) * nSw + sb];
        if (h < 0) {
          p = Path();
          return;
        }
        p.push(lb + swUpOff_[sa]);
        p.push(lb + h);
        p.push(lb + swDownOff_[sb]);
      }
      p.push(lb + downOff_[b]);
      return;
    }
  }
}

Path Network::path(int src, int dst) const {
  Path p;
  const int n = nRanks();
  if (src < 0 || dst < 0 || src >= n || dst >= n || src == dst) return p;
  const int na = topo_.nodeOf(src), nb = topo_.nodeOf(dst);
  const int a = topo_.localOf(src), b = topo_.localOf(dst);
  if (na == nb) {
    appendIntra(na, a, b, p);
    return p;
  }
  const int ra = rail_[a], rb = rail_[b];
  if (ra < 0 || rb < 0 || spine_ < 0 || nicOutOff_[a] < 0 || nicInOff_[b] < 0) return p;
  const bool railOpt = topo_.inter.kind == core::InterFabricKind::RailOptimized;
  p.push(na * lPerNode_ + nicOutOff_[a]);
  p.push(na * lPerNode_ + nicUpOff_[ra]);
  const int leafA = railOpt ? ra : na;
  const int leafB = railOpt ? rb : nb;
  if (leafA != leafB) {
    p.push(leafUp_[leafA]);
    p.push(leafDown_[leafB]);
  }
  p.push(nb * lPerNode_ + nicDownOff_[rb]);
  p.push(nb * lPerNode_ + nicInOff_[b]);
  return p;
}

int Network::linkNode(int linkId) const {
  const int perNode = topo_.nodes * lPerNode_;
  if (linkId < perNode) return lPerNode_ > 0 ? linkId / lPerNode_ : -1;
  if (topo_.inter.kind == core::InterFabricKind::RailOptimized) return -1;
  // Fat tree: one leaf per node, its uplink and downlink added one after the other, in leaf order.
  const std::size_t leaf = static_cast<std::size_t>(linkId - perNode) / 2;
  return leaf < leafUp_.size() ? static_cast<int>(leaf) : -1;
}

int Network::linkAtNode(int linkId, int node) const {
  const int own = linkNode(linkId);
  if (own < 0) return linkId;
  if (linkId < topo_.nodes * lPerNode_) return linkId + (node - own) * lPerNode_;
  const auto to = static_cast<std::size_t>(node);
  return linkId == leafUp_[static_cast<std::size_t>(own)] ? leafUp_[to] : leafDown_[to];
}

double Network::pathLatencyUs(int src, int dst) const {
  double s = 0;
  for (int l : path(src, dst)) s += links_[l].latencyUs;
  return s;
}

double Network::pathBandwidthGBps(int src, int dst) const {
  Path p = path(src, dst);
  if (p.empty()) return 0;
  double bw = std::numeric_limits<double>::infinity();
  for (int l : p) bw = std::min(bw, links_[l].bandwidthGBps);
  return bw;
}

std::string Network::describe() const {
  std::map<std::string_view, int> vk, lk;
  for (const auto& v : vertices_) ++vk[toString(v.kind)];
  for (const auto& l : links_) ++lk[toString(l.kind)];
  std::string out = fmt::format("network of {}: {} ranks, {} vertices, {} directed links\n", topo_.name, nRanks(),
                                vertices_.size(), links_.size());
  out += "  vertices:";
  for (auto& [k, c] : vk) out += fmt::format(" {} {}", c, k);
  out += "\n  links:";
  for (auto& [k, c] : lk) out += fmt::format(" {} {}", c, k);
  out += "\n";
  return out;
}

}  // namespace optiflow::sim
