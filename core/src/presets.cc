// Built-in node types. The numbers and their sources are listed in docs/topology.md ("Presets"); keep the two in
// step when a value changes.
#include <charconv>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "optiflow/core/topology.h"

namespace optiflow::core {

namespace {

struct NodeSpec {
  std::string_view name;
  std::string_view description;
  std::string_view gpuType;
  double nvswitchGBps;  // per GPU per direction
  std::string_view nicModel;
  double nicGbps;  // line rate, Gb/s
};

// NVLink hop: NCCL's per-hop NVLink latency for LL (tuning.cc); NIC: ~1 us RDMA one-way, switch: ~0.2 us per
// hop (both calibration.md, marked unverified there). The simulator owns protocol costs on top of these.
constexpr double kNvLinkHopUs = 0.6;
constexpr double kNicLatencyUs = 1.0;
constexpr double kIbSwitchHopUs = 0.2;
constexpr int kGpusPerNode = 8;

constexpr NodeSpec kSpecs[] = {
    {"dgx-a100", "NVIDIA DGX A100: 8x A100 SXM4, NVSwitch 300 GB/s per GPU, 8x ConnectX-6 HDR 200 Gb/s rails",
     "A100-SXM4", 300.0, "ConnectX-6 HDR", 200.0},
    {"dgx-h100", "NVIDIA DGX H100: 8x H100 SXM5, NVSwitch 450 GB/s per GPU, 8x ConnectX-7 NDR 400 Gb/s rails",
     "H100-SXM5", 450.0, "ConnectX-7 NDR", 400.0},
    {"hgx-h200", "NVIDIA HGX H200: 8x H200 SXM, NVSwitch 450 GB/s per GPU, 8x 400 Gb/s NICs (ConnectX-7) rails",
     "H200-SXM", 450.0, "ConnectX-7 NDR", 400.0},
};

Topology build(const NodeSpec& s, int nodes, std::string name) {
  Topology t;
  t.name = std::move(name);
  t.nodes = nodes;
  t.gpusPerNode = kGpusPerNode;
  t.gpuType = std::string(s.gpuType);
  t.intra.kind = IntraFabricKind::NvSwitch;
  t.intra.gpuBandwidthGBps = s.nvswitchGBps;
  t.intra.latencyUs = kNvLinkHopUs;
  for (int g = 0; g < kGpusPerNode; ++g) {
    // mlx5_N is what these systems name their compute NICs; one per GPU is the rail layout.
    t.nics.push_back(Nic{fmt::format("mlx5_{}", g), s.nicGbps / 8, kNicLatencyUs, {g}});
  }
  t.inter.kind = InterFabricKind::RailOptimized;
  t.inter.oversubscription = 1.0;
  t.inter.switchLatencyUs = kIbSwitchHopUs;
  return t;
}

const NodeSpec* findSpec(std::string_view name) {
  for (const auto& s : kSpecs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string presetNames() {
  std::string s;
  for (const auto& p : kSpecs) s += fmt::format("{}{}", s.empty() ? "" : ", ", p.name);
  return s;
}

// Whether `name` is meant as a preset: an exact name, or a name followed by 'x' and anything.
const NodeSpec* presetPrefix(std::string_view name) {
  for (const auto& s : kSpecs) {
    if (name == s.name ||
        (name.size() > s.name.size() && name.substr(0, s.name.size()) == s.name && name[s.name.size()] == 'x')) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace

std::vector<PresetInfo> presets() {
  std::vector<PresetInfo> out;
  for (const auto& s : kSpecs) {
    out.push_back(PresetInfo{std::string(s.name), std::string(s.description), std::string(s.gpuType), kGpusPerNode,
                             kGpusPerNode, s.nicGbps / 8});
  }
  return out;
}

Result<Topology> presetTopology(std::string_view name) {
  const Diagnostic unknown{"<preset>", 0, 0,
                           fmt::format("unknown preset \"{}\"; presets are {} (one node), or <preset>x<N> for N nodes "
                                       "(e.g. dgx-a100x4)",
                                       name, presetNames())};
  if (const NodeSpec* s = findSpec(name)) return build(*s, 1, std::string(name));
  const NodeSpec* s = presetPrefix(name);
  if (!s) return unknown;
  std::string_view count = name.substr(s->name.size() + 1);
  int n = 0;
  auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
  bool digitsOnly = !count.empty() && count.find_first_not_of("0123456789") == std::string_view::npos;
  if (!digitsOnly || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
      end != count.data() + count.size()) {
    return Diagnostic{"<preset>", 0, 0,
                      fmt::format("bad node count \"{}\" in preset \"{}\": expected {}x<N> with N a whole number in "
                                  "1..{}",
                                  count, name, s->name, Topology::kMaxNodes)};
  }
  if (ec == std::errc::result_out_of_range || n < 1 || n > Topology::kMaxNodes) {
    return Diagnostic{"<preset>", 0, 0,
                      fmt::format("node count {} in preset \"{}\" is out of range: expected 1..{}", count, name,
                                  Topology::kMaxNodes)};
  }
  return build(*s, n, std::string(name));
}

namespace {

// The first non-blank byte of the file is '<': NCCL's XML (a TOML topology starts with a key or a comment).
bool startsLikeXml(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c)) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (static_cast<unsigned char>(c) == 0xEF) {  // a UTF-8 byte order mark
      in.ignore(2);
      continue;
    }
    return c == '<';
  }
  return false;
}

// hints.nodes on a topology read from a file: the same node, that many times.
Result<Topology> withNodes(Topology t, int nodes, const std::string& path) {
  if (nodes <= 0 || nodes == t.nodes) return t;
  if (nodes > Topology::kMaxNodes) {
    return Diagnostic{path, 0, 0,
                      fmt::format("--nodes {} is out of range: expected 1..{}", nodes, Topology::kMaxNodes)};
  }
  if (nodes > 1 && t.inter.kind == InterFabricKind::None) {
    return Diagnostic{path, 0, 0,
                      fmt::format("--nodes {}: the topology describes no inter-node fabric ([inter] kind = \"none\"), "
                                  "so it cannot span several nodes",
                                  nodes)};
  }
  t.nodes = nodes;
  const std::vector<TopologyIssue> issues = t.validate();
  if (!issues.empty()) return Diagnostic{path, 0, 0, fmt::format("at {} nodes: {}", nodes, issues.front().str())};
  return t;
}

}  // namespace

Result<Topology> loadTopology(std::string_view presetOrPath, const TopologyHints& hints,
                              std::vector<std::string>* notes) {
  Result<Topology> preset = presetTopology(presetOrPath);
  if (preset.ok()) {
    if (hints.nodes <= 0 || hints.nodes == preset->nodes) return preset;
    if (findSpec(presetOrPath) != nullptr) return presetTopology(fmt::format("{}x{}", presetOrPath, hints.nodes));
    return Diagnostic{"<preset>", 0, 0,
                      fmt::format("preset \"{}\" has {} node(s) and --nodes says {}: give one of the two", presetOrPath,
                                  preset->nodes, hints.nodes)};
  }
  std::string path(presetOrPath);
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    if (!std::filesystem::is_directory(path, ec) && startsLikeXml(path)) return loadNcclTopoXml(path, hints, notes);
    auto t = loadTopologyFile(path);
    if (!t) return t;
    return withNodes(std::move(*t), hints.nodes, path);
  }
  // Looks like a preset with a bad count: that error is the useful one.
  if (presetPrefix(presetOrPath)) return preset;
  return Diagnostic{path, 0, 0,
                    fmt::format("not a built-in preset ({}, optionally with x<N> for N nodes) and not a readable "
                                "topology file (TOML, or NCCL's topology XML): no such file",
                                presetNames())};
}

}  // namespace optiflow::core
