// NCCL's XML view of one node as our Topology: the dump NCCL writes to NCCL_TOPO_DUMP_FILE (a tree of <cpu>/<pci>
// elements with <gpu> and <nic>/<net> leaves) and the skeletons cloud images ship for NCCL_TOPO_FILE (the PCI tree
// only: GPUs and NICs as <pci> elements with class, vendor and device ids, no <gpu> or <net>). Bandwidths follow
// NCCL's own conventions where it has them (PCIe: 12 GB/s for Gen3 x16, scaled by speed and width; NIC speed in
// Mb/s), and the presets' latencies otherwise. What a file lacks comes from TopologyHints, or the error names it.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "optiflow/core/text_file.h"
#include "optiflow/core/topology.h"

namespace optiflow::core {

namespace {

constexpr double kNvLinkHopUs = 0.6;   // as the presets (core/src/presets.cc)
constexpr double kNicLatencyUs = 1.0;  // as the presets
constexpr double kSwitchHopUs = 0.2;   // as the presets
constexpr double kPcieLatencyUs = 1.0;
constexpr double kDefaultPcieGBps = 24;  // Gen4 x16 in NCCL's units, when a <pci> gives no speed or width
constexpr std::uintmax_t kMaxFileBytes = 16u << 20;
constexpr std::string_view kNvidiaVendor = "0x10de";

// NVSwitch is a bridge (class 0x0680); a GPU is a display/3D controller (0x03xx); a NIC a network controller
// (0x0200 Ethernet, 0x0207 InfiniBand: 0x02xx).
bool isSwitchClass(std::string_view c) { return c.rfind("0x0680", 0) == 0; }
bool isGpuClass(std::string_view c) { return c.rfind("0x03", 0) == 0; }
bool isNicClass(std::string_view c) { return c.rfind("0x02", 0) == 0; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// NVIDIA data-centre GPUs by PCI device id (the pci.ids database): the model, its SM version, and whether it is an
// SXM part (on an HGX/DGX baseboard: NVLink to every peer; 8 of them sit behind NVSwitches from A100 on).
struct GpuModel {
  std::string_view device;
  std::string_view type;
  int sm;
  bool sxm;
};
constexpr GpuModel kGpuModels[] = {
    {"0x1db1", "V100", 70, true},  {"0x1db5", "V100", 70, true},  {"0x1db8", "V100", 70, true},
    {"0x1db4", "V100", 70, false}, {"0x1db6", "V100", 70, false}, {"0x1df6", "V100", 70, false},
    {"0x20b0", "A100", 80, true},  {"0x20b2", "A100", 80, true},  {"0x20b3", "A100", 80, true},
    {"0x20f3", "A800", 80, true},  {"0x20b1", "A100", 80, false}, {"0x20b5", "A100", 80, false},
    {"0x20f1", "A100", 80, false}, {"0x20f5", "A800", 80, false}, {"0x20f6", "A800", 80, false},
    {"0x2330", "H100", 90, true},  {"0x2324", "H800", 90, true},  {"0x2335", "H200", 90, true},
    {"0x2331", "H100", 90, false}, {"0x2321", "H100", 90, false}, {"0x2322", "H800", 90, false},
    {"0x2901", "B200", 100, true},
};

std::optional<GpuModel> modelOfDevice(std::string_view device) {
  const std::string d = lower(std::string(device));
  for (const GpuModel& m : kGpuModels) {
    if (m.device == d) return m;
  }
  return std::nullopt;
}

// SM version of a GPU type named on the command line (the names Topology::gpuType and the presets use).
std::optional<int> smOfType(std::string_view type) {
  const std::string t = lower(std::string(type));
  if (t.rfind("v100", 0) == 0) return 70;
  if (t.rfind("a100", 0) == 0 || t.rfind("a800", 0) == 0) return 80;
  if (t.rfind("h100", 0) == 0 || t.rfind("h200", 0) == 0 || t.rfind("h800", 0) == 0) return 90;
  if (t.rfind("b100", 0) == 0 || t.rfind("b200", 0) == 0 || t.rfind("gb200", 0) == 0) return 100;
  return std::nullopt;
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

// Per-direction bandwidth of one NVLink by SM version: NVLink 1 (sm60) 20 GB/s, 2-4 (sm70-sm90) 25, 5 (sm100) 50.
double nvlinkGBps(int sm) {
  if (sm >= 100) return 50;
  if (sm >= 70) return 25;
  return 20;
}

// NVLinks per SXM GPU (V100 6, A100 12, H100/H200 18, B200 18): the per-GPU NVSwitch bandwidth of a baseboard
// whose skeleton file has no <nvlink> elements.
int nvlinksPerSxmGpu(int sm) {
  if (sm >= 90) return 18;
  if (sm >= 80) return 12;
  return 6;
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
  std::string type;
  bool sxm = false;
  std::string busId;   // of the <pci> element holding it (or being it, in a skeleton)
  pugi::xml_node pci;  // that <pci> element
  pugi::xml_node gpu;  // the <gpu> element; empty in a skeleton
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

std::string describePci(const pugi::xml_node& pci) {
  return fmt::format("<pci busid=\"{}\" vendor=\"{}\" device=\"{}\">", pci.attribute("busid").as_string("?"),
                     pci.attribute("vendor").as_string("?"), pci.attribute("device").as_string("?"));
}

class Reader {
 public:
  Reader(std::string file, const TopologyHints& hints, std::vector<std::string>* notes)
      : file_(std::move(file)), hints_(hints), notes_(notes) {}

  Result<Topology> read(std::string_view xml) {
    pugi::xml_document doc;
    const pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
    if (!parsed) {
      return error(
          fmt::format("not an NCCL topology file: XML error at byte {}: {}", parsed.offset, parsed.description()));
    }
    const pugi::xml_node system = doc.child("system");
    if (!system) {
      return error(
          "not an NCCL topology file: no <system> root element (NCCL_TOPO_DUMP_FILE and NCCL_TOPO_FILE have one)");
    }
    if (auto r = readGpus(system); !r) return r.error();
    Topology t;
    t.name = std::filesystem::path(file_).stem().string();
    if (t.name.empty()) t.name = "nccl-topo";
    t.nodes = hints_.nodes > 0 ? hints_.nodes : 1;
    t.gpusPerNode = static_cast<int>(gpus_.size());
    t.gpuType = gpus_.front().type;
    readIntra(t);
    if (auto r = readNics(system, t); !r) return r.error();
    if (t.nodes > 1) {
      if (t.nics.empty()) {
        return error(
            fmt::format("no NIC (<net> element, or <pci> of a network class 0x02xx): a topology of {} nodes needs "
                        "them (dump the topology with NCCL's network plugin loaded)",
                        t.nodes));
      }
      t.inter.kind = t.nics.size() >= gpus_.size() ? InterFabricKind::RailOptimized : InterFabricKind::FatTree;
      t.inter.switchLatencyUs = kSwitchHopUs;
    }
    const std::vector<TopologyIssue> issues = t.validate();
    if (!issues.empty()) return error(fmt::format("the topology read from it is not usable: {}", issues.front().str()));
    return t;
  }

 private:
  Diagnostic error(std::string message) const { return Diagnostic{file_, 0, 0, std::move(message)}; }
  void note(std::string message) const {
    if (notes_ != nullptr) notes_->push_back(fmt::format("{}: {}", file_, message));
  }

  // The GPU model of a <pci> element, from the command line, the <gpu sm> attribute or the PCI device id.
  Result<bool> identify(Gpu& g) const {
    const std::string vendor = lower(g.pci.attribute("vendor").as_string(""));
    const std::optional<GpuModel> model =
        vendor == kNvidiaVendor ? modelOfDevice(g.pci.attribute("device").as_string("")) : std::nullopt;
    if (model) g.sxm = model->sxm;
    if (!hints_.gpuType.empty()) {
      const std::optional<int> sm = smOfType(hints_.gpuType);
      if (!sm) {
        return error(
            fmt::format("GPU type \"{}\" (--gpu) is not one the model knows: expected V100, A100, A800, H100, "
                        "H200, H800 or B200",
                        hints_.gpuType));
      }
      g.sm = *sm;
      g.type = hints_.gpuType;
      return true;
    }
    if (g.gpu) g.sm = g.gpu.attribute("sm").as_int(0);
    if (g.sm > 0) {
      g.type = model ? std::string(model->type) : gpuTypeOf(g.sm);
      return true;
    }
    if (model) {
      g.sm = model->sm;
      g.type = std::string(model->type);
      return true;
    }
    return error(
        fmt::format("GPU {} ({}) has no model: no <gpu sm=\"...\"> and a PCI device id not in the table of "
                    "known GPUs; give the GPU type (--gpu A100, H100, ...)",
                    g.dev, describePci(g.pci)));
  }

  Result<bool> readGpus(const pugi::xml_node& system) {
    for (const pugi::xpath_node& x : system.select_nodes(".//gpu")) {
      Gpu g;
      g.gpu = x.node();
      g.pci = g.gpu.parent();
      g.dev = g.gpu.attribute("dev").as_int(static_cast<int>(gpus_.size()));
      g.busId = lower(g.pci.attribute("busid").as_string(""));
      gpus_.push_back(std::move(g));
    }
    if (gpus_.empty()) {
      // A skeleton: NVIDIA display/3D controllers in the PCI tree, numbered in document order (NCCL's order too).
      for (const pugi::xpath_node& x : system.select_nodes(".//pci")) {
        const pugi::xml_node pci = x.node();
        if (!isGpuClass(pci.attribute("class").as_string("")) ||
            lower(pci.attribute("vendor").as_string("")) != kNvidiaVendor) {
          continue;
        }
        Gpu g;
        g.pci = pci;
        g.dev = static_cast<int>(gpus_.size());
        g.busId = lower(pci.attribute("busid").as_string(""));
        gpus_.push_back(std::move(g));
      }
    }
    if (gpus_.empty()) {
      return error("no GPU: neither <gpu> elements nor <pci> elements of an NVIDIA display class (0x03xx)");
    }
    std::sort(gpus_.begin(), gpus_.end(), [](const Gpu& a, const Gpu& b) { return a.dev < b.dev; });
    for (std::size_t i = 0; i < gpus_.size(); ++i) {
      if (gpus_[i].dev != static_cast<int>(i)) {
        return error(
            fmt::format("<gpu> dev numbers are {}..., expected 0..{} each once", gpus_.front().dev, gpus_.size() - 1));
      }
      if (auto r = identify(gpus_[i]); !r) return r.error();
      if (gpus_[i].sm != gpus_.front().sm) {
        return error(fmt::format("GPU {} is sm{} and GPU 0 sm{}: one node has one kind of GPU here", i, gpus_[i].sm,
                                 gpus_.front().sm));
      }
    }
    return true;
  }

  void readIntra(Topology& t) const {
    // NVLinks: to a switch (NVSwitch systems) or to another GPU by bus id (meshes). A link that targets its own GPU
    // (some cloud files carry them) connects nothing.
    std::map<std::string, int> byBus;
    for (const Gpu& g : gpus_) byBus[g.busId] = g.dev;
    double minSwitchGBps = -1;
    bool anyNvlink = false;
    std::map<std::pair<int, int>, double> pairs;
    for (const Gpu& g : gpus_) {
      if (!g.gpu) continue;
      double toSwitch = 0;
      for (const pugi::xml_node& l : g.gpu.children("nvlink")) {
        anyNvlink = true;
        const double bw = l.attribute("count").as_int(1) * nvlinkGBps(g.sm);
        if (isSwitchClass(l.attribute("tclass").as_string(""))) {
          toSwitch += bw;
        } else if (auto it = byBus.find(lower(l.attribute("target").as_string(""))); it != byBus.end()) {
          if (it->second != g.dev) pairs[{std::min(g.dev, it->second), std::max(g.dev, it->second)}] = bw;
        }
      }
      if (toSwitch > 0) minSwitchGBps = minSwitchGBps < 0 ? toSwitch : std::min(minSwitchGBps, toSwitch);
    }
    const Gpu& g0 = gpus_.front();
    if (minSwitchGBps <= 0 && !anyNvlink && g0.sxm && gpus_.size() == 8 && g0.sm >= 80) {
      // A skeleton of an 8-GPU SXM baseboard (HGX/DGX A100 and later): every such board has NVSwitches.
      minSwitchGBps = nvlinksPerSxmGpu(g0.sm) * nvlinkGBps(g0.sm);
      note(
          fmt::format("no <nvlink> elements; 8 SXM {} GPUs: taken as an NVSwitch baseboard, {} NVLinks x {} GB/s "
                      "per GPU",
                      g0.type, nvlinksPerSxmGpu(g0.sm), nvlinkGBps(g0.sm)));
    }
    if (minSwitchGBps > 0) {
      t.intra.kind = IntraFabricKind::NvSwitch;
      t.intra.gpuBandwidthGBps = minSwitchGBps;
      t.intra.latencyUs = kNvLinkHopUs;
      return;
    }
    if (!pairs.empty() && gpus_.size() > 1) {
      t.intra.kind = IntraFabricKind::NvLinkMesh;
      t.intra.latencyUs = kNvLinkHopUs;
      for (const auto& [ab, bw] : pairs) t.intra.links.push_back(NvLinkPair{ab.first, ab.second, bw, kNvLinkHopUs});
      return;
    }
    if (!anyNvlink && g0.sxm && gpus_.size() > 1) {
      note(
          fmt::format("no <nvlink> elements for {} SXM {} GPUs: modelled as PCIe only; a file with the NVLinks "
                      "(NCCL_TOPO_DUMP_FILE) or a TOML topology describes them",
                      gpus_.size(), g0.type));
    }
    // PCIe: GPUs grouped by the element above their own <pci> (their switch, or the CPU when attached directly).
    t.intra.kind = IntraFabricKind::Pcie;
    t.intra.latencyUs = kPcieLatencyUs;
    double gpuGBps = -1;
    std::vector<pugi::xml_node> parents;
    for (const Gpu& g : gpus_) {
      const double bw = pcieGBps(g.pci);
      gpuGBps = gpuGBps < 0 ? bw : std::min(gpuGBps, bw);
      const pugi::xml_node up = g.pci.parent();
      auto it = std::find(parents.begin(), parents.end(), up);
      if (it == parents.end()) {
        parents.push_back(up);
        t.intra.switches.push_back(
            PcieSwitch{{g.dev}, std::string_view(up.name()) == "pci" ? pcieGBps(up) : kDefaultPcieGBps});
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

  // NICs: each <net> with its speed (or, in a skeleton, each <pci> of a network class with --nic-gbps); every GPU is
  // served by the NIC nearest to it in the tree (lowest index on ties).
  Result<bool> readNics(const pugi::xml_node& system, Topology& t) const {
    std::vector<pugi::xml_node> places;
    for (const pugi::xpath_node& x : system.select_nodes(".//net")) {
      const pugi::xml_node n = x.node();
      const std::string name = n.attribute("name").as_string("");
      if (name.empty()) return error(fmt::format("<net> element {} has no name attribute", places.size()));
      double mbps = n.attribute("speed").as_double(0);
      if (mbps <= 0 && hints_.nicGbps > 0) mbps = hints_.nicGbps * 1000;
      if (mbps <= 0) {
        return error(
            fmt::format("<net name=\"{}\"> has no speed attribute (Mb/s, e.g. 200000); or give the NIC "
                        "speed (--nic-gbps 200)",
                        name));
      }
      const double latency = n.attribute("latency").as_double(0);
      t.nics.push_back(Nic{name, mbps / 8000.0, latency > 0 ? latency : kNicLatencyUs, {}});
      places.push_back(n);
    }
    if (places.empty()) {
      std::vector<pugi::xml_node> pcis;
      for (const pugi::xpath_node& x : system.select_nodes(".//pci")) {
        if (isNicClass(x.node().attribute("class").as_string(""))) pcis.push_back(x.node());
      }
      if (!pcis.empty() && t.nodes == 1 && hints_.nicGbps <= 0) {
        note(fmt::format("{} NIC(s) without a speed left out: one node does not use them", pcis.size()));
        pcis.clear();
      }
      for (const pugi::xml_node& p : pcis) {
        if (hints_.nicGbps <= 0) {
          return error(
              fmt::format("NIC {} has no speed (a skeleton file names no <net>): give the speed of each "
                          "NIC in Gb/s (--nic-gbps, e.g. 100 for EFA on p4d, 200 for HDR InfiniBand)",
                          describePci(p)));
        }
        t.nics.push_back(Nic{fmt::format("nic{}", t.nics.size()), hints_.nicGbps / 8.0, kNicLatencyUs, {}});
        places.push_back(p);
      }
    }
    if (places.empty()) return true;
    for (const Gpu& g : gpus_) {
      std::size_t best = 0;
      int bestDepth = -1;
      for (std::size_t i = 0; i < places.size(); ++i) {
        const int d = commonDepth(g.gpu ? g.gpu : g.pci, places[i]);
        if (d > bestDepth) {
          bestDepth = d;
          best = i;
        }
      }
      t.nics[best].gpus.push_back(g.dev);
    }
    // A NIC no GPU is nearest to serves nobody: leave it out (validate requires every NIC to serve a GPU).
    std::erase_if(t.nics, [](const Nic& n) { return n.gpus.empty(); });
    return true;
  }

  std::string file_;
  const TopologyHints& hints_;
  std::vector<std::string>* notes_;
  std::vector<Gpu> gpus_;
};

}  // namespace

Result<Topology> parseNcclTopoXml(std::string_view xml, std::string_view fileName, const TopologyHints& hints,
                                  std::vector<std::string>* notes) {
  return Reader(std::string(fileName), hints, notes).read(xml);
}

Result<Topology> loadNcclTopoXml(const std::string& path, const TopologyHints& hints, std::vector<std::string>* notes) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return Diagnostic{path, 0, 0, fmt::format("cannot read the NCCL topology file: {}", ec.message())};
  if (size > kMaxFileBytes) {
    return Diagnostic{path, 0, 0,
                      fmt::format("the NCCL topology file is {} bytes; the limit is {}", size, kMaxFileBytes)};
  }
  const std::optional<std::string> text = readWholeFile(path);
  if (!text) return Diagnostic{path, 0, 0, "cannot read the NCCL topology file"};
  return parseNcclTopoXml(*text, path, hints, notes);
}

}  // namespace optiflow::core
