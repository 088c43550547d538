// Lower bounds: cut (throughput) bounds over vertex sets of a graph of the machine, All-Reduce partition bounds,
// and a latency bound. docs/bounds.md has every formula and why it holds.
#include "optiflow/sim/bounds.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/network.h"

namespace optiflow::sim {

namespace {

using core::Collective;
using core::Topology;

// Bandwidths are summed in fixed point (1e-6 GB/s) so that the millions of incremental updates of an enumeration
// leave no rounding drift and equal cuts compare equal.
constexpr double kBwScale = 1e6;
using Fixed = std::int64_t;
constexpr Fixed kNoCut = std::numeric_limits<Fixed>::max();

Fixed toFixed(double gbps) { return static_cast<Fixed>(std::llround(gbps * kBwScale)); }
double toGBps(Fixed f) { return static_cast<double>(f) / kBwScale; }

// ---- the cut graph ----
//
// The Network's graph (the one the simulator routes over), re-indexed so that node k's vertices are
// [k * L, (k + 1) * L) in the same local order for every node, followed by the shared fabric switches. A fabric
// switch whose only non-fabric neighbours are one node's vertices (the per-node leaf of a fat tree) is counted
// as that node's vertex, so "one node" includes its leaf and its oversubscribed uplink. On a single node the
// NICs and the fabric are left out: path() never routes a transfer between GPUs of one node through them, so
// they add no capacity any schedule can use (and single-node bounds stay at the NVSwitch/NVLink figures).
struct LocalVertex {
  std::string name;
  int gpu = -1;  // local GPU index, -1 for other vertices
  int nic = -1;  // index into Topology::nics
};

struct CutGraph {
  int nodes = 1;
  std::vector<LocalVertex> local;   // the vertices of one node (all nodes are identical)
  std::vector<std::string> fabric;  // names of the shared fabric vertices
  int nVertices = 0;                // nodes * local.size() + fabric.size()
  // CSR adjacency over all vertices.
  std::vector<int> outStart, outTo, inStart, inFrom;
  std::vector<Fixed> outBw, inBw;

  int localCount() const { return static_cast<int>(local.size()); }
  int nodeOf(int v) const { return v < nodes * localCount() ? v / localCount() : -1; }
  int gpuOf(int v) const { return nodeOf(v) < 0 ? -1 : local[static_cast<size_t>(v % localCount())].gpu; }
  std::string name(int v) const {
    if (nodeOf(v) < 0) return fabric[static_cast<size_t>(v - nodes * localCount())];
    return fmt::format("node {} {}", nodeOf(v), local[static_cast<size_t>(v % localCount())].name);
  }
};

CutGraph buildCutGraph(const Network& net) {
  const Topology& t = net.topology();
  const auto& vs = net.vertices();
  const int nv = static_cast<int>(vs.size());
  CutGraph g;
  g.nodes = t.nodes;
  auto fabricKind = [](VertexKind k) { return k == VertexKind::LeafSwitch || k == VertexKind::SpineSwitch; };
  auto kept = [&](const Vertex& v) { return t.nodes > 1 || !(v.kind == VertexKind::Nic || fabricKind(v.kind)); };
  // Owner node of every vertex: its own node, or the single node a fabric switch serves (-1: shared).
  std::vector<int> owner(static_cast<size_t>(nv), -1);
  for (int v = 0; v < nv; ++v) owner[static_cast<size_t>(v)] = vs[static_cast<size_t>(v)].node;
  if (t.nodes > 1) {
    for (int v = 0; v < nv; ++v) {
      if (vs[static_cast<size_t>(v)].node >= 0) continue;
      int only = -1;
      bool shared = false;
      auto see = [&](int u) {
        int n = vs[static_cast<size_t>(u)].node;
        if (n < 0) return;
        if (only < 0) only = n;
        if (n != only) shared = true;
      };
      for (int l : net.outLinks(v)) see(net.link(l).dst);
      for (int l : net.inLinks(v)) see(net.link(l).src);
      if (!shared && only >= 0) owner[static_cast<size_t>(v)] = only;
    }
  }
  std::vector<std::vector<int>> perNode(static_cast<size_t>(t.nodes));
  std::vector<int> shared;
  for (int v = 0; v < nv; ++v) {
    const Vertex& x = vs[static_cast<size_t>(v)];
    if (!kept(x)) continue;
    int o = owner[static_cast<size_t>(v)];
    if (o >= 0) {
      perNode[static_cast<size_t>(o)].push_back(v);
    } else {
      shared.push_back(v);
    }
  }
  // Vertex ids grow with the node and with the local order (Network builds every node alike), so the lists line
  // up; check it rather than trust it.
  const auto& first = perNode[0];
  for (const auto& list : perNode) {
    bool same = list.size() == first.size();
    for (size_t i = 0; same && i < list.size(); ++i) {
      const Vertex& a = vs[static_cast<size_t>(first[i])];
      const Vertex& b = vs[static_cast<size_t>(list[i])];
      same = a.kind == b.kind && (a.node < 0 || a.index == b.index);  // attached leaves are indexed by node
    }
    if (!same) throw std::logic_error("bounds: the network's nodes are not laid out alike");
  }
  std::vector<int> index(static_cast<size_t>(nv), -1);
  const int L = static_cast<int>(first.size());
  for (int k = 0; k < t.nodes; ++k) {
    for (int l = 0; l < L; ++l)
      index[static_cast<size_t>(perNode[static_cast<size_t>(k)][static_cast<size_t>(l)])] = k * L + l;
  }
  for (size_t i = 0; i < shared.size(); ++i) index[static_cast<size_t>(shared[i])] = t.nodes * L + static_cast<int>(i);
  for (int v : first) {
    const Vertex& x = vs[static_cast<size_t>(v)];
    std::string name = x.name;
    if (auto slash = name.find('/'); slash != std::string::npos) name = name.substr(slash + 1);
    g.local.push_back({name, x.kind == VertexKind::Gpu ? x.index : -1, x.kind == VertexKind::Nic ? x.index : -1});
  }
  for (int v : shared) g.fabric.push_back(vs[static_cast<size_t>(v)].name);
  g.nVertices = t.nodes * L + static_cast<int>(shared.size());

  // CSR over the kept links.
  struct E {
    int a, b;
    Fixed bw;
  };
  std::vector<E> edges;
  edges.reserve(net.links().size());
  for (const Link& l : net.links()) {
    int a = index[static_cast<size_t>(l.src)];
    int b = index[static_cast<size_t>(l.dst)];
    if (a < 0 || b < 0 || a == b) continue;
    edges.push_back({a, b, toFixed(l.bandwidthGBps)});
  }
  std::vector<int> outDeg(static_cast<size_t>(g.nVertices), 0), inDeg(static_cast<size_t>(g.nVertices), 0);
  for (const auto& e : edges) {
    ++outDeg[static_cast<size_t>(e.a)];
    ++inDeg[static_cast<size_t>(e.b)];
  }
  auto prefix = [](const std::vector<int>& deg) {
    std::vector<int> start(deg.size() + 1, 0);
    for (size_t i = 0; i < deg.size(); ++i) start[i + 1] = start[i] + deg[i];
    return start;
  };
  g.outStart = prefix(outDeg);
  g.inStart = prefix(inDeg);
  g.outTo.resize(edges.size());
  g.outBw.resize(edges.size());
  g.inFrom.resize(edges.size());
  g.inBw.resize(edges.size());
  std::vector<int> outPos(g.outStart.begin(), g.outStart.end() - 1);
  std::vector<int> inPos(g.inStart.begin(), g.inStart.end() - 1);
  for (const auto& e : edges) {
    auto o = static_cast<size_t>(outPos[static_cast<size_t>(e.a)]++);
    g.outTo[o] = e.b;
    g.outBw[o] = e.bw;
    auto i = static_cast<size_t>(inPos[static_cast<size_t>(e.b)]++);
    g.inFrom[i] = e.a;
    g.inBw[i] = e.bw;
  }
  return g;
}

// Bandwidth leaving (out) and entering (in) a vertex set, kept up to date as vertices join or leave it.
struct CutState {
  Fixed out = 0;
  Fixed in = 0;
  int gpus = 0;

  // `member(y)` is the membership before the toggle; x toggles.
  template <typename Member>
  void toggle(const CutGraph& g, int x, bool adding, Member&& member) {
    const int sign = adding ? 1 : -1;
    for (int i = g.outStart[static_cast<size_t>(x)]; i < g.outStart[static_cast<size_t>(x) + 1]; ++i) {
      int y = g.outTo[static_cast<size_t>(i)];
      if (y == x) continue;
      Fixed b = g.outBw[static_cast<size_t>(i)];
      if (member(y)) {
        in -= sign * b;  // x -> y stops (adding) or starts (removing) entering the set
      } else {
        out += sign * b;
      }
    }
    for (int i = g.inStart[static_cast<size_t>(x)]; i < g.inStart[static_cast<size_t>(x) + 1]; ++i) {
      int y = g.inFrom[static_cast<size_t>(i)];
      if (y == x) continue;
      Fixed b = g.inBw[static_cast<size_t>(i)];
      if (member(y)) {
        out -= sign * b;
      } else {
        in += sign * b;
      }
    }
    if (g.gpuOf(x) >= 0) gpus += sign;
  }
};

// ---- which sets, and the best (smallest) boundary bandwidth seen for each (GPU count, root inside) ----

enum class SetKind : std::uint8_t { Exhaustive, Local, NodeUnion, Gpu, Node, SwitchGroup };

struct Witness {
  SetKind kind = SetKind::Exhaustive;
  bool complement = false;  // the set is everything except the described one
  std::uint64_t mask = 0;   // Exhaustive: global vertices; Local: local vertices
  int node = 0;             // Local, Gpu, Node, SwitchGroup
  int gpu = 0;              // Gpu: local index; SwitchGroup: local vertex of the switch
  bool withNics = false;    // Gpu: the region includes the NICs only this GPU uses
  std::vector<int> nodes;   // NodeUnion
};

struct Side {
  Fixed bw = kNoCut;
  Witness w;
};

struct Entry {
  Side out;  // smallest bandwidth leaving a set of this class
  Side in;   // smallest bandwidth entering one
};

struct Key {
  int gpus = 0;
  bool rootIn = false;
  friend auto operator<=>(const Key&, const Key&) = default;
};

using CutTable = std::map<Key, Entry>;

void record(CutTable& table, Key k, Fixed out, Fixed in, const Witness& w) {
  Entry& e = table[k];
  if (out < e.out.bw) e.out = {out, w};
  if (in < e.in.bw) e.in = {in, w};
}

// A set and its complement.
void recordBoth(CutTable& table, int nRanks, Key k, Fixed out, Fixed in, Witness w) {
  record(table, k, out, in, w);
  w.complement = !w.complement;
  record(table, Key{nRanks - k.gpus, !k.rootIn}, in, out, w);
}

std::string joinNames(const CutGraph& g, const std::vector<int>& locals) {
  std::string s;
  for (int l : locals) s += fmt::format("{}{}", s.empty() ? "" : ", ", g.local[static_cast<size_t>(l)].name);
  return s;
}

std::string nodeList(const std::vector<int>& nodes) {
  std::vector<int> sorted = nodes;
  std::sort(sorted.begin(), sorted.end());
  bool contiguous = sorted.back() - sorted.front() + 1 == static_cast<int>(sorted.size());
  if (sorted.size() == 1) return fmt::format("node {}", sorted[0]);
  if (contiguous) return fmt::format("nodes {}..{}", sorted.front(), sorted.back());
  std::string s;
  for (int n : sorted) s += fmt::format("{}{}", s.empty() ? "" : ",", n);
  return "nodes " + s;
}

// The NICs of one node that no other GPU of it is linked to.
std::vector<int> exclusiveNics(const CutGraph& g, int gpu) {
  std::vector<int> out;
  const int L = g.localCount();
  for (int l = 0; l < L; ++l) {
    if (g.local[static_cast<size_t>(l)].nic < 0) continue;
    bool mine = false, other = false;
    for (int i = g.outStart[static_cast<size_t>(l)]; i < g.outStart[static_cast<size_t>(l) + 1]; ++i) {
      int y = g.outTo[static_cast<size_t>(i)];
      int yg = y < L ? g.local[static_cast<size_t>(y)].gpu : -1;
      if (yg == gpu) mine = true;
      if (yg >= 0 && yg != gpu) other = true;
    }
    if (mine && !other) out.push_back(l);
  }
  return out;
}

std::string describeSet(const CutGraph& g, const Witness& w) {
  std::string base;
  switch (w.kind) {
    case SetKind::Exhaustive: {
      std::vector<std::string> names;
      for (int v = 0; v < g.nVertices; ++v) {
        if ((w.mask >> v) & 1U) names.push_back(g.nodes > 1 ? g.name(v) : g.local[static_cast<size_t>(v)].name);
      }
      std::string s;
      for (const auto& n : names) s += fmt::format("{}{}", s.empty() ? "" : ", ", n);
      base = "{" + s + "}";
      break;
    }
    case SetKind::Local: {
      std::vector<int> locals;
      for (int l = 0; l < g.localCount(); ++l) {
        if ((w.mask >> l) & 1U) locals.push_back(l);
      }
      base = fmt::format("{{{}}} of node {}", joinNames(g, locals), w.node);
      break;
    }
    case SetKind::NodeUnion:
      base = nodeList(w.nodes);
      break;
    case SetKind::Gpu: {
      base = fmt::format("GPU {} of node {}", w.gpu, w.node);
      if (w.withNics) base += fmt::format(" with {}", joinNames(g, exclusiveNics(g, w.gpu)));
      break;
    }
    case SetKind::Node:
      base = fmt::format("node {}", w.node);
      break;
    case SetKind::SwitchGroup:
      base = fmt::format("{} of node {} and its GPUs", g.local[static_cast<size_t>(w.gpu)].name, w.node);
      break;
  }
  return w.complement ? "everything but " + base : base;
}

// ---- latency ----

struct Latencies {
  double maxIntraPair = 0;  // the farthest pair of GPUs of one node (shortest path within the node)
  double maxFromRoot = 0;   // the farthest GPU of the root's node from the root (either direction)
  double inter = 0;         // the cheapest message between GPUs of different nodes
  double minMessage = 0;    // the cheapest message between any two GPUs
};

Latencies computeLatencies(const Topology& t, int rootLocal) {
  Latencies lat;
  const int n = t.gpusPerNode;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (t.nodes > 1) {
    lat.inter = kInf;
    for (size_t a = 0; a < t.nics.size(); ++a) {
      for (size_t b = 0; b < t.nics.size(); ++b) {
        lat.inter = std::min(lat.inter, t.interLatencyUs(static_cast<int>(a), static_cast<int>(b)));
      }
    }
    if (t.nics.empty()) lat.inter = 0;
  }
  double minIntra = kInf;
  if (n > 1) {
    // Shortest paths over direct intra-node connections (a mesh may need relays); within a node a message can
    // also leave through the network and come back, so that path caps every pair.
    std::vector<std::vector<double>> d(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), kInf));
    for (int s = 0; s < n; ++s) {
      auto& dist = d[static_cast<size_t>(s)];
      dist[static_cast<size_t>(s)] = 0;
      using Item = std::pair<double, int>;
      std::priority_queue<Item, std::vector<Item>, std::greater<>> pq;
      pq.push({0.0, s});
      while (!pq.empty()) {
        auto [du, u] = pq.top();
        pq.pop();
        if (du > dist[static_cast<size_t>(u)]) continue;
        for (int v = 0; v < n; ++v) {
          if (v == u || t.intraBandwidth(u, v) <= 0) continue;
          double dv = du + t.intraLatencyUs(u, v);
          if (dv < dist[static_cast<size_t>(v)]) {
            dist[static_cast<size_t>(v)] = dv;
            pq.push({dv, v});
          }
        }
      }
      if (t.nodes > 1) {
        for (auto& x : dist) x = std::min(x, lat.inter);
        dist[static_cast<size_t>(s)] = 0;
      }
    }
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        double x = d[static_cast<size_t>(a)][static_cast<size_t>(b)];
        lat.maxIntraPair = std::max(lat.maxIntraPair, x);
        minIntra = std::min(minIntra, x);
        if (a == rootLocal || b == rootLocal) lat.maxFromRoot = std::max(lat.maxFromRoot, x);
      }
    }
  }
  lat.minMessage = std::min(minIntra, t.nodes > 1 ? lat.inter : kInf);
  if (!std::isfinite(lat.minMessage)) lat.minMessage = 0;
  return lat;
}

// ---- per-collective terms ----

// The fraction of M (the nccl-tests size) that must leave (out) or enter (in) a set holding `c` of the N GPUs
// (rootIn: whether the root is among them). 0 where the set gives no bound.
struct Fractions {
  double out = 0;
  double in = 0;
};

Fractions fractions(Collective coll, int c, bool rootIn, int n) {
  const bool split = c > 0 && c < n;
  const double dc = c;
  const double dn = n;
  switch (coll) {
    case Collective::AllGather:  // the chunks of S must leave S; the others' chunks must enter it
      return split ? Fractions{dc / dn, (dn - dc) / dn} : Fractions{};
    case Collective::ReduceScatter:  // contributions to chunks owned outside leave; to chunks owned inside enter
      return split ? Fractions{(dn - dc) / dn, dc / dn} : Fractions{};
    case Collective::AllReduce:  // every element must cross both ways (holds with in-network reduction too)
      return split ? Fractions{1, 1} : Fractions{};
    case Collective::AllToAll:  // c (N-c) blocks of M/N each way
      return split ? Fractions{dc * (dn - dc) / dn, dc * (dn - dc) / dn} : Fractions{};
    case Collective::Broadcast:
      if (rootIn && c < n) return {1, 0};
      if (!rootIn && c > 0) return {0, 1};
      return {};
    case Collective::Reduce:
      if (!rootIn && c > 0) return {1, 0};
      if (rootIn && c < n) return {0, 1};
      return {};
    case Collective::Custom:
      return {};
  }
  return {};
}

std::string fractionText(Collective coll, int c, int n, bool outSide) {
  switch (coll) {
    case Collective::AllGather:
      return outSide ? fmt::format("its {} GPUs' chunks, {}/{} of M", c, c, n)
                     : fmt::format("the other {} GPUs' chunks, {}/{} of M", n - c, n - c, n);
    case Collective::ReduceScatter:
      return outSide ? fmt::format("its contributions to the other {} GPUs' chunks, {}/{} of M", n - c, n - c, n)
                     : fmt::format("the outside contributions to its {} GPUs' chunks, {}/{} of M", c, c, n);
    case Collective::AllReduce:
      return outSide ? "every element once (all of M)" : "every element once (all of M)";
    case Collective::AllToAll:
      return fmt::format("{} x {} blocks of M/{}, {}/{} of M", c, n - c, n, static_cast<long long>(c) * (n - c), n);
    case Collective::Broadcast:
    case Collective::Reduce:
    case Collective::Custom:
      return "all of M";
  }
  return "";
}

struct Term {
  double coef = 0;  // time per byte, in us per byte x 1e3 (= fraction / GB/s)
  BoundKind kind = BoundKind::None;
  std::string text;
};

void consider(Term& best, double coef, BoundKind kind, const std::function<std::string()>& text) {
  // Ties go to the earlier (named) term so the description names the simplest constraint.
  if (coef > best.coef * (1 + 1e-12)) best = {coef, kind, text()};
}

}  // namespace

// ---- BoundModel ----

struct BoundModel::Impl {
  Topology topo;
  BoundOptions opts;
  SwitchReduction reduction = SwitchReduction::None;
  CutGraph graph;
  int rootNode = 0;
  int rootLocal = 0;
  CutTable all;                                  // every enumerated set
  CutTable gpuSets;                              // the per-GPU regions and their complements
  CutTable nodeSets;                             // single nodes and their complements
  std::vector<Fixed> gpuRegionOut, gpuRegionIn;  // per local GPU: smallest region egress / ingress
  Fixed nodeOut = 0, nodeIn = 0;                 // one node's egress / ingress
  Latencies lat;
  std::string enumeration;

  void enumerate();
  void enumerateExhaustive();
  void enumerateLocal();
  void enumerateNamed();
  void enumerateNodeUnions();
  Term bestCut(const CutTable& table, Collective coll, BoundKind kind) const;
};

namespace {

bool nvlsCapable(const Topology& t) {
  if (t.intra.kind != core::IntraFabricKind::NvSwitch) return false;
  std::string gpu;
  for (char ch : t.gpuType) gpu += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* p : {"h100", "h200", "h800", "h20", "gh200", "b100", "b200", "b300", "gb200", "gb300"}) {
    if (gpu.find(p) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

void BoundModel::Impl::enumerateExhaustive() {
  const int v = graph.nVertices;
  // Root membership is tracked through the root's vertex.
  const int rootVertex = rootNode * graph.localCount() + rootLocal;
  CutState st;
  std::uint64_t mask = 0;
  const std::uint64_t count = std::uint64_t{1} << v;
  for (std::uint64_t i = 1; i < count; ++i) {
    int x = std::countr_zero(i);
    bool adding = ((mask >> x) & 1U) == 0;
    st.toggle(graph, x, adding, [&](int y) { return ((mask >> y) & 1U) != 0; });
    mask ^= std::uint64_t{1} << x;
    Witness w;
    w.kind = SetKind::Exhaustive;
    w.mask = mask;
    record(all, Key{st.gpus, ((mask >> rootVertex) & 1U) != 0}, st.out, st.in, w);
  }
  enumeration = fmt::format("exhaustive: all 2^{} - 1 = {} non-empty sets of the {} vertices", v, count - 1, v);
}

void BoundModel::Impl::enumerateLocal() {
  // Every subset of one node's vertices (GPUs, intra switches, NICs), and its complement in the whole graph. All
  // nodes are identical and only edges touching the subset cross its boundary, so node 0 stands for every node;
  // the root's position is applied per role (the subset lies in the root's node, or in another node).
  const int L = graph.localCount();
  const int n = topo.nRanks();
  struct Best {
    Fixed out = kNoCut, in = kNoCut;
    std::uint64_t outMask = 0, inMask = 0;
  };
  // [gpus][rootIn] for the root-node role, and [gpus] for the other-node role.
  std::vector<std::array<Best, 2>> rootRole(static_cast<size_t>(topo.gpusPerNode) + 1);
  std::vector<Best> otherRole(static_cast<size_t>(topo.gpusPerNode) + 1);
  auto keep = [](Best& b, Fixed out, Fixed in, std::uint64_t mask) {
    if (out < b.out) b.out = out, b.outMask = mask;
    if (in < b.in) b.in = in, b.inMask = mask;
  };
  CutState st;
  std::uint64_t mask = 0;
  const std::uint64_t count = std::uint64_t{1} << L;
  for (std::uint64_t i = 1; i < count; ++i) {
    int x = std::countr_zero(i);
    bool adding = ((mask >> x) & 1U) == 0;
    st.toggle(graph, x, adding, [&](int y) { return y < L && ((mask >> y) & 1U) != 0; });
    mask ^= std::uint64_t{1} << x;
    auto c = static_cast<size_t>(st.gpus);
    keep(rootRole[c][(mask >> rootLocal) & 1U], st.out, st.in, mask);
    keep(otherRole[c], st.out, st.in, mask);
  }
  const int otherNode = rootNode == 0 ? 1 : 0;
  auto emit = [&](const Best& b, int node, int c, bool rootIn) {
    if (b.out == kNoCut) return;
    Witness w;
    w.kind = SetKind::Local;
    w.node = node;
    w.mask = b.outMask;
    recordBoth(all, n, Key{c, rootIn}, b.out, kNoCut, w);
    w.mask = b.inMask;
    recordBoth(all, n, Key{c, rootIn}, kNoCut, b.in, w);
  };
  for (int c = 0; c <= topo.gpusPerNode; ++c) {
    for (int r = 0; r < 2; ++r) emit(rootRole[static_cast<size_t>(c)][static_cast<size_t>(r)], rootNode, c, r == 1);
    if (topo.nodes > 1) emit(otherRole[static_cast<size_t>(c)], otherNode, c, false);
  }
  enumeration = fmt::format(
      "every subset of one node's {} vertices (2^{} - 1 = {} sets) and its complement, node 0 standing for every "
      "node",
      L, L, count - 1);
}

void BoundModel::Impl::enumerateNamed() {
  const int L = graph.localCount();
  const int n = topo.nRanks();
  auto cutOf = [&](const std::vector<int>& locals) {
    std::vector<char> member(static_cast<size_t>(L), 0);
    CutState st;
    for (int l : locals) {
      st.toggle(graph, l, true, [&](int y) { return y < L && member[static_cast<size_t>(y)] != 0; });
      member[static_cast<size_t>(l)] = 1;
    }
    return st;
  };
  const int otherNode = rootNode == 0 ? 1 : 0;
  auto both = [&](CutTable& table, const std::vector<int>& locals, int c, bool containsRootGpu, Witness w) {
    CutState st = cutOf(locals);
    w.node = rootNode;
    recordBoth(table, n, Key{c, containsRootGpu}, st.out, st.in, w);
    recordBoth(all, n, Key{c, containsRootGpu}, st.out, st.in, w);
    if (topo.nodes > 1) {
      w.node = otherNode;
      recordBoth(table, n, Key{c, false}, st.out, st.in, w);
      recordBoth(all, n, Key{c, false}, st.out, st.in, w);
    }
    return st;
  };
  // Per GPU: the GPU alone, and with the NICs only it uses (the better of the two regions counts).
  gpuRegionOut.assign(static_cast<size_t>(topo.gpusPerNode), kNoCut);
  gpuRegionIn.assign(static_cast<size_t>(topo.gpusPerNode), kNoCut);
  for (int gpu = 0; gpu < topo.gpusPerNode; ++gpu) {
    std::vector<int> nics = exclusiveNics(graph, gpu);
    for (int withNics = 0; withNics < (nics.empty() ? 1 : 2); ++withNics) {
      std::vector<int> locals{gpu};
      if (withNics) locals.insert(locals.end(), nics.begin(), nics.end());
      Witness w;
      w.kind = SetKind::Gpu;
      w.gpu = gpu;
      w.withNics = withNics != 0;
      // The root-node role names the root GPU only when this is it; other GPUs of the root's node are covered
      // by the other-node role (same cut, root outside).
      CutState st = both(gpuSets, locals, 1, gpu == rootLocal, w);
      auto g = static_cast<size_t>(gpu);
      gpuRegionOut[g] = std::min(gpuRegionOut[g], st.out);
      gpuRegionIn[g] = std::min(gpuRegionIn[g], st.in);
    }
  }
  if (topo.nodes > 1) {
    std::vector<int> locals(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) locals[static_cast<size_t>(l)] = l;
    Witness w;
    w.kind = SetKind::Node;
    CutState st = both(nodeSets, locals, topo.gpusPerNode, true, w);
    nodeOut = st.out;
    nodeIn = st.in;
  }
  // Intra switches with the GPUs attached to them (PCIe switch groups), for nodes too big for enumerateLocal.
  if (L > opts.maxExhaustiveVertices) {
    for (int s = 0; s < L; ++s) {
      if (graph.local[static_cast<size_t>(s)].gpu >= 0 || graph.local[static_cast<size_t>(s)].nic >= 0) continue;
      std::vector<int> locals{s};
      bool hasRoot = false;
      for (int i = graph.outStart[static_cast<size_t>(s)]; i < graph.outStart[static_cast<size_t>(s) + 1]; ++i) {
        int y = graph.outTo[static_cast<size_t>(i)];
        if (y < L && graph.local[static_cast<size_t>(y)].gpu >= 0) {
          locals.push_back(y);
          hasRoot = hasRoot || y == rootLocal;
        }
      }
      Witness w;
      w.kind = SetKind::SwitchGroup;
      w.gpu = s;
      CutTable scratch;
      both(scratch, locals, static_cast<int>(locals.size()) - 1, hasRoot, w);
    }
  }
}

void BoundModel::Impl::enumerateNodeUnions() {
  // Unions of whole nodes: the prefixes of four node orders (the root's node first or last, each forwards and
  // backwards), so that unions with and without the root's node, and their complements, all appear.
  const int nodes = topo.nodes;
  const int L = graph.localCount();
  const int n = topo.nRanks();
  std::vector<int> others;
  for (int k = 0; k < nodes; ++k) {
    if (k != rootNode) others.push_back(k);
  }
  std::vector<std::vector<int>> orders;
  std::vector<int> first{rootNode};
  first.insert(first.end(), others.begin(), others.end());
  std::vector<int> last = others;
  last.push_back(rootNode);
  orders.push_back(first);
  orders.push_back(last);
  orders.emplace_back(first.rbegin(), first.rend());
  orders.emplace_back(last.rbegin(), last.rend());
  std::vector<char> member(static_cast<size_t>(graph.nVertices), 0);
  for (const auto& order : orders) {
    std::fill(member.begin(), member.end(), 0);
    CutState st;
    bool rootIn = false;
    for (int k = 0; k + 1 < nodes; ++k) {
      int node = order[static_cast<size_t>(k)];
      for (int l = 0; l < L; ++l) {
        int v = node * L + l;
        st.toggle(graph, v, true, [&](int y) { return member[static_cast<size_t>(y)] != 0; });
        member[static_cast<size_t>(v)] = 1;
      }
      rootIn = rootIn || node == rootNode;
      if (k == 0) continue;  // single nodes are the named node sets
      Witness w;
      w.kind = SetKind::NodeUnion;
      w.nodes.assign(order.begin(), order.begin() + k + 1);
      recordBoth(all, n, Key{st.gpus, rootIn}, st.out, st.in, w);
    }
  }
}

void BoundModel::Impl::enumerate() {
  enumerateNamed();
  if (graph.nVertices <= opts.maxExhaustiveVertices) {
    enumerateExhaustive();
    return;
  }
  if (graph.localCount() <= opts.maxExhaustiveVertices) {
    enumerateLocal();
  } else {
    enumeration = fmt::format(
        "one node has {} vertices (> {}): per node only each GPU (alone and with its own NICs), each intra switch "
        "with its GPUs, and the whole node, with complements",
        graph.localCount(), opts.maxExhaustiveVertices);
  }
  if (topo.nodes > 2) {
    enumerateNodeUnions();
    enumeration += fmt::format("; unions of 2..{} whole nodes along 4 node orders ({} sets) and complements",
                               topo.nodes - 1, 4 * (topo.nodes - 2));
  }
}

BoundModel::BoundModel(const Topology& t, const BoundOptions& options) : impl_(std::make_unique<Impl>()) {
  std::string err = validateBoundOptions(t, options);
  if (!err.empty()) throw std::invalid_argument(err);
  Impl& m = *impl_;
  m.topo = t;
  m.opts = options;
  m.reduction = options.switchReduction;
  if (m.reduction == SwitchReduction::Auto) {
    m.reduction = nvlsCapable(t) ? SwitchReduction::IntraNode : SwitchReduction::None;
  }
  m.rootNode = t.nodeOf(options.root);
  m.rootLocal = t.localOf(options.root);
  auto net = Network::build(t);
  if (!net.ok()) throw std::invalid_argument(net.error().message);
  m.graph = buildCutGraph(*net);
  m.lat = computeLatencies(t, m.rootLocal);
  m.enumerate();
}

BoundModel::~BoundModel() = default;
BoundModel::BoundModel(BoundModel&&) noexcept = default;
BoundModel& BoundModel::operator=(BoundModel&&) noexcept = default;

std::string BoundModel::enumeration() const { return impl_->enumeration; }
SwitchReduction BoundModel::switchReduction() const { return impl_->reduction; }

// The largest term over one table of sets.
Term BoundModel::Impl::bestCut(const CutTable& table, Collective coll, BoundKind kind) const {
  const Impl& m = *this;
  const int n = m.topo.nRanks();
  Term best;
  for (const auto& [key, e] : table) {
    Fractions f = fractions(coll, key.gpus, key.rootIn, n);
    for (int side = 0; side < 2; ++side) {
      const Side& s = side == 0 ? e.out : e.in;
      double frac = side == 0 ? f.out : f.in;
      if (frac <= 0 || s.bw == kNoCut) continue;
      double coef = s.bw > 0 ? frac / toGBps(s.bw) : std::numeric_limits<double>::infinity();
      const int gpus = key.gpus;  // clang < 16 cannot capture a structured binding
      consider(best, coef, kind, [&] {
        const char* label = kind == BoundKind::PerGpu    ? "GPU cut"
                            : kind == BoundKind::PerNode ? "node cut"
                                                         : "vertex cut";
        return fmt::format("{}: {} ({} of {} GPUs) must {} {} over {} GB/s of {}", label, describeSet(m.graph, s.w),
                           gpus, n, side == 0 ? "send out" : "receive", fractionText(coll, gpus, n, side == 0),
                           toGBps(s.bw), side == 0 ? "egress" : "ingress");
      });
    }
  }
  return best;
}

Bound BoundModel::bound(Collective coll, std::uint64_t sizeBytes) const {
  const Impl& m = *impl_;
  Bound b;
  b.sizeBytes = sizeBytes;
  const int n = m.topo.nRanks();
  if (coll == Collective::Custom) {
    b.description = "no bound for custom collectives";
    return b;
  }
  if (n <= 1 || sizeBytes == 0) {
    b.description = n <= 1 ? "one rank: nothing to communicate" : "empty buffer: nothing to communicate";
    return b;
  }
  const double bytes = static_cast<double>(sizeBytes);
  auto us = [&](double coef) { return coef * bytes / 1e3; };  // (fraction / GB/s) x bytes -> us

  Term gpu = m.bestCut(m.gpuSets, coll, BoundKind::PerGpu);
  Term node = m.bestCut(m.nodeSets, coll, BoundKind::PerNode);
  Term cut = m.bestCut(m.all, coll, BoundKind::VertexCut);
  Term partition;
  Term gpuPartition;
  Term nodePartition;
  if (coll == Collective::AllReduce) {
    // Without switch reduction every element needs at least 2(k-1) transfers between k groups that each reduce
    // internally for free (one-way gossip), each leaving one group: T >= 2(k-1) M / sum of group egress.
    const int nodes = m.topo.nodes;
    if (m.reduction == SwitchReduction::None) {
      Fixed sumOut = 0, sumIn = 0;
      for (size_t g = 0; g < m.gpuRegionOut.size(); ++g) {
        sumOut += m.gpuRegionOut[g];
        sumIn += m.gpuRegionIn[g];
      }
      const double k = n;
      for (int side = 0; side < 2; ++side) {
        double total = toGBps(side == 0 ? sumOut : sumIn) * nodes;
        consider(gpuPartition, 2 * (k - 1) / total, BoundKind::GpuPartition, [&] {
          return fmt::format(
              "no in-network reduction: each element needs 2(N-1) = {} GPU-to-GPU transfers, over the {} GPUs' "
              "total {} of {} GB/s (2(N-1)/N of M over {} GB/s per GPU)",
              2 * (n - 1), n, side == 0 ? "egress" : "ingress", total, total / k);
        });
      }
    }
    if (m.reduction != SwitchReduction::Everywhere && nodes > 1) {
      const double k = nodes;
      for (int side = 0; side < 2; ++side) {
        double per = toGBps(side == 0 ? m.nodeOut : m.nodeIn);
        consider(nodePartition, 2 * (k - 1) / (k * per), BoundKind::NodePartition, [&] {
          return fmt::format(
              "no reduction in the network fabric: each element needs 2(n-1) = {} transfers between the {} nodes, "
              "over their total {} of {} GB/s (2(n-1)/n of M over {} GB/s per node)",
              2 * (nodes - 1), nodes, side == 0 ? "egress" : "ingress", k * per, per);
        });
      }
    }
    partition = gpuPartition.coef >= nodePartition.coef ? gpuPartition : nodePartition;
  }
  b.perGpuUs = us(std::max(gpu.coef, gpuPartition.coef));
  b.perNodeUs = us(std::max(node.coef, nodePartition.coef));
  b.cutUs = us(cut.coef);
  b.partitionUs = us(partition.coef);

  Term best;
  for (const Term* t : {&node, &nodePartition, &gpu, &gpuPartition, &cut}) {
    if (t->coef > best.coef * (1 + 1e-12)) best = *t;
  }
  b.bandwidthUs = us(best.coef);

  // Latency: the farthest pair that must communicate, over its cheapest path, no protocol overheads.
  const bool rooted = coll == Collective::Broadcast || coll == Collective::Reduce;
  const double intra = m.topo.gpusPerNode > 1 ? (rooted ? m.lat.maxFromRoot : m.lat.maxIntraPair) : 0;
  const double inter = m.topo.nodes > 1 ? m.lat.inter : 0;
  double latency = std::max(intra, inter);
  std::string latText =
      inter >= intra ? fmt::format(
                           "latency: GPUs on different nodes are at least {} us apart (NIC and switch hops, no "
                           "protocol overheads)",
                           inter)
                     : fmt::format("latency: the farthest GPUs {}of one node are {} us apart (no protocol overheads)",
                                   rooted ? "from the root " : "", intra);
  const int rounds = static_cast<int>(std::ceil(std::log2(static_cast<double>(n))));
  b.singlePortLatencyUs = m.topo.nodes > 1 ? (rounds - 1) * m.lat.minMessage + m.lat.inter : rounds * m.lat.minMessage;
  if (m.opts.singlePortLatency && b.singlePortLatencyUs > latency) {
    latency = b.singlePortLatencyUs;
    latText = fmt::format("latency (single-port model): ceil(log2 {}) = {} rounds of >= {} us{}", n, rounds,
                          m.lat.minMessage, m.topo.nodes > 1 ? ", one of them between nodes" : "");
  }
  b.latencyUs = latency;

  if (b.bandwidthUs >= b.latencyUs) {
    b.timeUs = b.bandwidthUs;
    b.binding = best.kind;
    b.description = best.text;
  } else {
    b.timeUs = b.latencyUs;
    b.binding = BoundKind::Latency;
    b.description = latText;
  }
  b.algbwGBps = core::gbps(bytes, b.timeUs);
  b.busbwGBps = b.algbwGBps * core::busBandwidthFactor(coll, n);
  return b;
}

std::string_view toString(BoundKind k) {
  switch (k) {
    case BoundKind::None:
      return "none";
    case BoundKind::Latency:
      return "latency";
    case BoundKind::PerGpu:
      return "per-gpu";
    case BoundKind::PerNode:
      return "per-node";
    case BoundKind::VertexCut:
      return "vertex-cut";
    case BoundKind::GpuPartition:
      return "gpu-partition";
    case BoundKind::NodePartition:
      return "node-partition";
  }
  return "?";
}

core::Topology effectiveTopology(const core::Topology& t, double nvlinkEfficiency, double pciEfficiency,
                                 double netEfficiency) {
  core::Topology e = t;
  const double intra = t.intra.kind == core::IntraFabricKind::Pcie ? pciEfficiency : nvlinkEfficiency;
  e.intra.gpuBandwidthGBps *= intra;
  for (auto& l : e.intra.links) l.bandwidthGBps *= nvlinkEfficiency;
  for (auto& sw : e.intra.switches) sw.uplinkGBps *= pciEfficiency;
  e.intra.hostBandwidthGBps *= pciEfficiency;
  for (auto& nic : e.nics) nic.bandwidthGBps *= netEfficiency;
  return e;
}

std::string_view toString(SwitchReduction r) {
  switch (r) {
    case SwitchReduction::Auto:
      return "auto";
    case SwitchReduction::None:
      return "none";
    case SwitchReduction::IntraNode:
      return "intra-node";
    case SwitchReduction::Everywhere:
      return "everywhere";
  }
  return "?";
}

std::string validateBoundOptions(const Topology& t, const BoundOptions& options) {
  if (t.nRanks() < 1) return "the topology has no GPUs";
  if (options.root < 0 || options.root >= t.nRanks()) {
    return fmt::format("root {} is out of range: the topology has ranks 0..{}", options.root, t.nRanks() - 1);
  }
  if (options.maxExhaustiveVertices < 1 || options.maxExhaustiveVertices > 26) {
    return fmt::format("maxExhaustiveVertices {} is out of range: expected 1..26", options.maxExhaustiveVertices);
  }
  return "";
}

Bound lowerBound(const Topology& t, Collective c, std::uint64_t sizeBytes, const BoundOptions& options) {
  return BoundModel(t, options).bound(c, sizeBytes);
}

std::vector<Bound> lowerBounds(const Topology& t, Collective c, const std::vector<std::uint64_t>& sizes,
                               const BoundOptions& options) {
  BoundModel m(t, options);
  std::vector<Bound> out;
  out.reserve(sizes.size());
  for (auto s : sizes) out.push_back(m.bound(c, s));
  return out;
}

nlohmann::json boundToJson(const Bound& b) {
  return nlohmann::json{{"size_bytes", b.sizeBytes},      {"time_us", b.timeUs},
                        {"algbw_gbps", b.algbwGBps},      {"busbw_gbps", b.busbwGBps},
                        {"latency_us", b.latencyUs},      {"bandwidth_us", b.bandwidthUs},
                        {"binding", toString(b.binding)}, {"description", b.description}};
}

}  // namespace optiflow::sim
