// Reads the XML NCCL writes to NCCL_TOPO_DUMP_FILE (its view of one node: a tree of <cpu>/<pci> elements with <gpu>
// and <nic>/<net> leaves) into our Topology model. Bandwidths follow NCCL's own conventions where it has them (PCIe:
// 12 GB/s for Gen3 x16, scaled by speed and width; NIC speed in Mb/s), and the presets' latencies otherwise.
#include "nccl_topo.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <pugixml.hpp>

namespace optiflow::daemon {

namespace {

constexpr double kNvLinkHopUs = 0.6;   // as the presets (core/src/presets.cc)
constexpr double kNicLatencyUs = 1.0;  // as the presets
constexpr double kSwitchHopUs = 0.2;   // as the presets
constexpr double kPcieLatencyUs = 1.0;
constexpr double kDefaultPcieGBps = 24;  // Gen4 x16 in NCCL's units, when a <pci> gives no speed or width
constexpr std::uintmax_t kMaxFileBytes = 16u << 20;

// NVSwitch is a bridge (class 0x0680); a GPU is a display/3D controller (0x03xx).
bool isSwitchClass(std::string_view c) { return c.rfind("0x0680", 0) == 0; }

// Per-direction bandwidth of one NVLink by SM version: NVLink 1 (sm60) 20 GB/s, 2-4 (sm70-sm90) 25, 5 (sm100) 50.
double nvlinkGBps(int sm) {
  if (sm >= 100) return 50;
  if (sm >= 70) return 25;
  return 20;
}

std::string gpuTypeOf(int sm) {
  switch (sm / 10) {
    case 6:
      return "P100";
    case 7:
      return "V100";
    case 8:
      return sm == 80 ? "A100" : fmt::format("sm{}", sm);
    case 9:
      return "H100";
    case 10:
      return "B200";
    default:
      return fmt::format("sm{}", sm);
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// "16.0 GT/s PCIe" x "16" -> GB/s per direction in NCCL's units (Gen3 x16 = 12).
double pcieGBps(const pugi::xml_node& pci) {
  const double speed = std::atof(pci.attribute("link_speed").as_string(""));
  const int width = pci.attribute("link_width").as_int(0);
  if (speed <= 0 || width <= 0) return kDefaultPcieGBps;
  return speed * width * 12.0 / (8.0 * 16);
}

struct Gpu {
  int dev = 0;
  int sm = 0;
  std::string busId;  // of the <pci> element holding it
  pugi::xml_node node;
};

// Depth of the deepest element that contains both a and b (the closer two devices sit in the PCI tree, the higher).
int commonDepth(pugi::xml_node a, pugi::xml_node b) {
  std::vector<pugi::xml_node> pa, pb;
  for (auto n = a; n; n = n.parent()) pa.push_back(n);
  for (auto n = b; n; n = n.parent()) pb.push_back(n);
  std::reverse(pa.begin(), pa.end());
  std::reverse(pb.begin(), pb.end());
  int d = 0;
  while (static_cast<std::size_t>(d) < pa.size() && static_cast<std::size_t>(d) < pb.size() && pa[d] == pb[d]) ++d;
  return d;
}

}  // namespace

core::Result<core::Topology> parseNcclTopoXml(std::string_view xml, std::string_view fileName, int nodes) {
  const std::string file(fileName);
  auto error = [&](std::string message) { return core::Diagnostic{file, 0, 0, std::move(message)}; };
  pugi::xml_document doc;
  const pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
  if (!parsed) {
    return error(
        fmt::format("not an NCCL topology dump: XML error at byte {}: {}", parsed.offset, parsed.description()));
  }
  const pugi::xml_node system = doc.child("system");
  if (!system) return error("not an NCCL topology dump: no <system> root element (NCCL_TOPO_DUMP_FILE writes one)");

  std::vector<Gpu> gpus;
  for (const pugi::xpath_node& x : system.select_nodes(".//gpu")) {
    Gpu g;
    g.node = x.node();
    g.dev = g.node.attribute("dev").as_int(static_cast<int>(gpus.size()));
    g.sm = g.node.attribute("sm").as_int(0);
    g.busId = lower(g.node.parent().attribute("busid").as_string(""));
    gpus.push_back(std::move(g));
  }
  if (gpus.empty()) return error("no <gpu> element: the dump describes no GPU (was it written by a GPU process?)");
  std::sort(gpus.begin(), gpus.end(), [](const Gpu& a, const Gpu& b) { return a.dev < b.dev; });
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].dev != static_cast<int>(i)) {
      return error(
          fmt::format("<gpu> dev numbers are {}..., expected 0..{} each once", gpus.front().dev, gpus.size() - 1));
    }
  }
  const int sm = gpus.front().sm;
  if (sm <= 0) return error("<gpu dev=\"0\"> has no sm attribute (expected e.g. sm=\"80\")");

  core::Topology t;
  t.name = std::filesystem::path(file).stem().string();
  if (t.name.empty()) t.name = "nccl-topo";
  t.nodes = nodes;
  t.gpusPerNode = static_cast<int>(gpus.size());
  t.gpuType = gpuTypeOf(sm);

  // NVLinks: to a switch (NVSwitch systems) or to another GPU by bus id (meshes).
  std::map<std::string, int> byBus;
  for (const Gpu& g : gpus) byBus[g.busId] = g.dev;
  double minSwitchGBps = -1;
  std::map<std::pair<int, int>, double> pairs;
  for (const Gpu& g : gpus) {
    double toSwitch = 0;
    for (const pugi::xml_node& l : g.node.children("nvlink")) {
      const double bw = l.attribute("count").as_int(1) * nvlinkGBps(g.sm);
      if (isSwitchClass(l.attribute("tclass").as_string(""))) {
        toSwitch += bw;
      } else if (auto it = byBus.find(lower(l.attribute("target").as_string(""))); it != byBus.end()) {
        if (it->second != g.dev) pairs[{std::min(g.dev, it->second), std::max(g.dev, it->second)}] = bw;
      }
    }
    if (toSwitch > 0) minSwitchGBps = minSwitchGBps < 0 ? toSwitch : std::min(minSwitchGBps, toSwitch);
  }
  if (minSwitchGBps > 0) {
    t.intra.kind = core::IntraFabricKind::NvSwitch;
    t.intra.gpuBandwidthGBps = minSwitchGBps;
    t.intra.latencyUs = kNvLinkHopUs;
  } else if (!pairs.empty() && gpus.size() > 1) {
    t.intra.kind = core::IntraFabricKind::NvLinkMesh;
    t.intra.latencyUs = kNvLinkHopUs;
    for (const auto& [ab, bw] : pairs) t.intra.links.push_back(core::NvLinkPair{ab.first, ab.second, bw, kNvLinkHopUs});
  } else {
    // PCIe: GPUs grouped by the element above their own <pci> (their switch, or the CPU when attached directly).
    t.intra.kind = core::IntraFabricKind::Pcie;
    t.intra.latencyUs = kPcieLatencyUs;
    double gpuGBps = -1;
    std::vector<pugi::xml_node> parents;
    for (const Gpu& g : gpus) {
      const pugi::xml_node pci = g.node.parent();
      const double bw = pcieGBps(pci);
      gpuGBps = gpuGBps < 0 ? bw : std::min(gpuGBps, bw);
      const pugi::xml_node up = pci.parent();
      auto it = std::find(parents.begin(), parents.end(), up);
      if (it == parents.end()) {
        parents.push_back(up);
        t.intra.switches.push_back(
            core::PcieSwitch{{g.dev}, std::string_view(up.name()) == "pci" ? pcieGBps(up) : kDefaultPcieGBps});
      } else {
        t.intra.switches[static_cast<std::size_t>(it - parents.begin())].gpus.push_back(g.dev);
      }
    }
    t.intra.gpuBandwidthGBps = gpuGBps;
    if (t.intra.switches.size() > 1) {
      double host = kDefaultPcieGBps;
      for (const auto& s : t.intra.switches) host = std::min(host, s.uplinkGBps);
      t.intra.hostBandwidthGBps = host;
      t.intra.hostLatencyUs = kPcieLatencyUs;
    }
  }

  // NICs: each <net> with its speed; every GPU is served by the NIC nearest to it in the tree (lowest index on ties).
  std::vector<pugi::xml_node> nets;
  for (const pugi::xpath_node& x : system.select_nodes(".//net")) {
    const pugi::xml_node n = x.node();
    const std::string name = n.attribute("name").as_string("");
    const double mbps = n.attribute("speed").as_double(0);
    if (name.empty()) return error(fmt::format("<net> element {} has no name attribute", nets.size()));
    if (mbps <= 0) return error(fmt::format("<net name=\"{}\"> has no speed attribute (Mb/s, e.g. 200000)", name));
    const double latency = n.attribute("latency").as_double(0);
    t.nics.push_back(core::Nic{name, mbps / 8000.0, latency > 0 ? latency : kNicLatencyUs, {}});
    nets.push_back(n);
  }
  if (!nets.empty()) {
    for (const Gpu& g : gpus) {
      std::size_t best = 0;
      int bestDepth = -1;
      for (std::size_t i = 0; i < nets.size(); ++i) {
        const int d = commonDepth(g.node, nets[i]);
        if (d > bestDepth) {
          bestDepth = d;
          best = i;
        }
      }
      t.nics[best].gpus.push_back(g.dev);
    }
    // A NIC no GPU is nearest to serves nobody: leave it out (validate requires every NIC to serve a GPU).
    std::erase_if(t.nics, [](const core::Nic& n) { return n.gpus.empty(); });
  }
  if (nodes > 1) {
    if (t.nics.empty()) {
      return error(
          fmt::format("no <net> element: a topology of {} nodes needs the NICs (run NCCL with its network "
                      "plugin loaded when dumping)",
                      nodes));
    }
    t.inter.kind = t.nics.size() >= gpus.size() ? core::InterFabricKind::RailOptimized : core::InterFabricKind::FatTree;
    t.inter.switchLatencyUs = kSwitchHopUs;
  }
  const std::vector<core::TopologyIssue> issues = t.validate();
  if (!issues.empty())
    return error(fmt::format("the topology read from the dump is not usable: {}", issues.front().str()));
  return t;
}

core::Result<core::Topology> readNcclTopoDump(const std::filesystem::path& file, int nodes) {
  const std::string name = file.string();
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return core::Diagnostic{name, 0, 0, fmt::format("cannot read the NCCL topology dump: {}", ec.message())};
  if (size > kMaxFileBytes) {
    return core::Diagnostic{name, 0, 0,
                            fmt::format("the NCCL topology dump is {} bytes; the limit is {}", size, kMaxFileBytes)};
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in || in.bad()) return core::Diagnostic{name, 0, 0, "cannot read the NCCL topology dump"};
  return parseNcclTopoXml(ss.str(), name, nodes);
}

}  // namespace optiflow::daemon
