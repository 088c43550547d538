// NCCL's cost model, rebuilt from the rules of NCCL 2.30.7's public source (src/graph/tuning.cc, search.cc, topo.h,
// src/enqueue.cc), restated in our own words; no NCCL code is copied. Section numbers below (1.1 .. 1.11) are those
// defined in docs/nccl-model.md, "Sources and section numbers".
#include "optiflow/sim/nccl_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <span>

#include <fmt/format.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/units.h"

namespace optiflow::sim {

namespace {

using core::Collective;
using core::IntraFabricKind;
using core::Topology;

constexpr int kAlgoTree = static_cast<int>(core::Algorithm::Tree);
constexpr int kAlgoRing = static_cast<int>(core::Algorithm::Ring);
constexpr int kAlgoPat = static_cast<int>(core::Algorithm::Pat);
constexpr int kLL = static_cast<int>(core::Protocol::LL);
constexpr int kLL128 = static_cast<int>(core::Protocol::LL128);
constexpr int kSimple = static_cast<int>(core::Protocol::Simple);

// Index of the per-generation rows: Volta, Ampere, Hopper, Blackwell.
int archIndex(NcclArch a) {
  switch (a) {
    case NcclArch::Volta:
      return 0;
    case NcclArch::Hopper:
      return 2;
    case NcclArch::Blackwell:
      return 3;
    default:
      return 1;
  }
}

// ---- 1.2: link bandwidths and the search's speed ladders ----
// NCCL's "effective" NVLink bandwidth per link (SM70 / SM80 / SM90 / SM100).
constexpr double kNvLinkBw[4] = {20.0, 20.0, 20.6, 40.1};
// The wire rate per link per direction, used to count a GPU's NVLinks from Topology's per-GPU bandwidth
// (NVLink 2/3/4: 25 GB/s; NVLink 5: 50 GB/s; NVIDIA's NVLink figures, e.g. A100: 12 x 25 = 300 GB/s per
// direction, nccl-tests#149).
constexpr double kNvLinkWireBw[4] = {25.0, 25.0, 25.0, 50.0};
// GPU <-> NIC PCIe path: Gen3 x16 = 12, Gen4 x16 = 24, Gen5 x16 = 48 (1.2 "PCI link").
constexpr double kGpuNicPcieBw[4] = {12.0, 24.0, 48.0, 48.0};

constexpr double kLadderIntraPreHopper[] = {40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3};
constexpr double kLadderNetPreHopper[] = {48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12};
constexpr double kLadderIntraHopper[] = {60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3};
constexpr double kLadderNetHopper[] = {48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12};
constexpr double kLadderIntraBlackwell[] = {90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18};
constexpr double kLadderNetBlackwell[] = {96, 86,   80, 48, 45.1, 42, 40,  30,  24,   22,
                                          20, 17.5, 15, 12, 6,    3,  2.4, 1.2, 0.24, 0.12};

std::span<const double> ladder(NcclArch a, bool withNet) {
  if (a == NcclArch::Blackwell) {
    return withNet ? std::span<const double>(kLadderNetBlackwell) : std::span<const double>(kLadderIntraBlackwell);
  }
  if (a == NcclArch::Hopper) {
    return withNet ? std::span<const double>(kLadderNetHopper) : std::span<const double>(kLadderIntraHopper);
  }
  return withNet ? std::span<const double>(kLadderNetPreHopper) : std::span<const double>(kLadderIntraPreHopper);
}

// ---- 1.3: constant tables ----
// Base latency per algorithm (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT) x (LL, LL128, Simple).
constexpr double kBaseLat[core::kNumAlgorithms][core::kNumProtocols] = {
    {6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {8.0, 8.0, 8.0}};
// Hardware latency per hop: [NVLINK, PCI, NET][algo][proto]. Cells NCCL leaves unset are 0 (never used).
constexpr double kHwLat[3][core::kNumAlgorithms][core::kNumProtocols] = {
    {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},
    {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},
    {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}},
};
constexpr int kHwNvLink = 0;
constexpr int kHwPci = 1;
constexpr int kHwNet = 2;
// Columns N1 / N2 / N4+ (index min(nNodes-1, 2)).
// llMaxBws rows: 0 Volta (1 node) / Intel CPU (multi-node), 1 Ampere / AMD, 2 Hopper, 3 Blackwell.
constexpr double kLlMaxBw[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282, 90, 70}};
constexpr double kPerChMaxRingLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {40, 40, 40}};
constexpr double kPerChMaxRingLL128BwBlackwell228[3] = {73.4, 34.6, 73.4};
constexpr double kPerChMaxTreeLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChMaxTreeBw[4][3] = {
    {26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
constexpr double kPerChMaxNvlsTreeBw[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0, 57.7, 45.5}, {0, 96.0, 80.0}};
constexpr double kNvlsTreeBlackwellN4Before230 = 43.8;
constexpr double kNvlsEfficiency[4] = {0, 0, 0.85, 0.74};
// Network post overhead per ring step (NCCL_NET_OVERHEAD), x3 for Simple.
constexpr double kNetOverheadIntel = 1.0;
constexpr double kNetOverheadAmd = 2.0;
constexpr double kNetOverheadSimpleFactor = 3.0;
// Tree correction factor by size, index floor(log2(nBytes / 64)); indices outside 0..22 use 1.0.
constexpr double kTreeCorrection[core::kNumProtocols][24] = {
    {1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1},
    {1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};
constexpr int kTreeCorrectionMaxIndex = 22;
// 1.4 protocol/algorithm derating.
constexpr double kRingLLFactor = 0.5;
constexpr double kLL128Factor = 0.92;
constexpr double kTreeFactor = 0.92;
constexpr double kTreeLLDivisor = 3.8;
constexpr double kTreeLL128OneNode = 7.0 / 9.0;
constexpr double kTreeLL128MultiNode = 120.0 / 128.0;
constexpr double kPatFactor = 0.75;
// 1.6: ring plateau latency multiplier (SM80+ / older) and its per-rank-per-channel byte threshold.
constexpr double kRingPlateauSm80 = 1.4;
constexpr double kRingPlateauOlder = 1.9;
constexpr double kRingPlateauBytes = 64;
// 1.5 PAT latency terms.
constexpr double kPatLatBase = 8.0;
constexpr double kPatInterDivisor = 3.5;
constexpr double kPatPerRank = 2.8;
// 1.3 threads and per-thread thresholds.
constexpr int kThreadsLL = 512;
constexpr int kThreadsLL128 = 640;
constexpr int kThreadsSimple = 512;
constexpr int kThreadsSimpleLow = 256;  // when ring bwIntra x nCh <= 12 GB/s
constexpr int kThreadsTree = 640;
constexpr int kThreadsMax = 640;
constexpr int kWarp = 32;
constexpr double kThresholdLL = 8;
constexpr double kThresholdLL128 = 8;
constexpr double kThresholdSimple = 64;
// 1.1/1.2: channel caps and NVLS CTAs.
constexpr int kMaxCommChannels = 64;
constexpr int kMaxSearchChannels = 32;  // ours, not NCCL's; never binds on the presets
constexpr int kNvlsChannelsHopper = 16;
constexpr int kNvlsChannelsBlackwell = 32;  // NCCL uses 24 or 32 on SM100; we take 32
constexpr double kDupMinBw = 25.0;
constexpr double kDupHopperBw = 50.0;
constexpr int kDupHopperMaxChannels = 4;
constexpr double kHopperMultiNodeDoubleBw = 45.0;
constexpr int kHopperMultiNodeDoubleBelow = 16;
constexpr int kPatMinVersion = 22300;
constexpr int kBlackwellCaps230 = 23000;

constexpr double kEps = 1e-9;

int floorDiv(double a, double b) { return b > 0 ? static_cast<int>(std::floor(a / b + kEps)) : 0; }

bool contains(const std::string& hay, std::string_view needle) { return hay.find(needle) != std::string::npos; }

NcclArch archFromGpu(const std::string& gpuType, std::vector<std::string>& notes) {
  std::string u = gpuType;
  for (auto& ch : u) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (contains(u, "V100")) return NcclArch::Volta;
  if (contains(u, "A100") || contains(u, "A800") || contains(u, "A30")) return NcclArch::Ampere;
  if (contains(u, "H100") || contains(u, "H200") || contains(u, "H800") || contains(u, "H20") || contains(u, "GH200")) {
    return NcclArch::Hopper;
  }
  if (contains(u, "B100") || contains(u, "B200") || contains(u, "B300")) return NcclArch::Blackwell;
  notes.push_back(
      fmt::format("GPU type \"{}\" not recognised; modelled as Ampere (set NcclModelOptions::arch)", gpuType));
  return NcclArch::Ampere;
}

// Highest ladder speed <= limit (the last one if none).
std::size_t firstSpeedAtMost(std::span<const double> lad, double limit) {
  std::size_t i = 0;
  while (i + 1 < lad.size() && lad[i] > limit + kEps) ++i;
  return i;
}

// ncclTopoDupChannels (1.1 step 3): x2 channels, /2 bw, unless bwIntra < 25, or Hopper+ with bwIntra < 50 and
// more than 4 channels.
void dupChannels(NcclGraph& g, NcclArch arch) {
  g.nChannels = g.searchChannels;
  if (g.nChannels == 0 || g.bwIntra < kDupMinBw) return;
  if (archIndex(arch) >= 2 && g.bwIntra < kDupHopperBw && g.nChannels > kDupHopperMaxChannels) return;
  g.nChannels = std::min(2 * g.nChannels, kMaxSearchChannels * 2);
  g.bwIntra /= 2;
  g.bwInter /= 2;
}

struct NodeBw {
  double totalBw = 0;    // summed NVLink (or PCI) bw of one GPU
  double maxPeerBw = 0;  // best single path to a peer GPU
  bool nvlink = true;
};

NodeBw intraBandwidth(const Topology& t, NcclArch arch, double pcieBw, std::vector<std::string>& notes) {
  NodeBw nb;
  const int ai = archIndex(arch);
  const int ppn = t.gpusPerNode;
  auto nccl = [&](double wireBw) {
    const double links = std::max(1.0, std::round(wireBw / kNvLinkWireBw[ai]));
    return links * kNvLinkBw[ai];
  };
  switch (t.intra.kind) {
    case IntraFabricKind::NvSwitch:
      nb.totalBw = nccl(t.intra.gpuBandwidthGBps);
      nb.maxPeerBw = nb.totalBw;
      break;
    case IntraFabricKind::NvLinkMesh: {
      double minTotal = -1;
      for (int g = 0; g < ppn; ++g) {
        double sum = 0;
        for (const auto& l : t.intra.links) {
          if (l.a == g || l.b == g) {
            sum += nccl(l.bandwidthGBps);
            nb.maxPeerBw = std::max(nb.maxPeerBw, nccl(l.bandwidthGBps));
          }
        }
        minTotal = minTotal < 0 ? sum : std::min(minTotal, sum);
      }
      nb.totalBw = std::max(0.0, minTotal);
      notes.emplace_back(
          "NVLink mesh: ring channels estimated from each GPU's summed NVLink bandwidth, as on an NVSwitch (NCCL's "
          "search would look for rings over the direct links)");
      break;
    }
    case IntraFabricKind::Pcie: {
      double minPeer = -1;
      for (int a = 0; a < ppn; ++a) {
        for (int b = 0; b < ppn; ++b) {
          if (a != b) {
            const double bw = t.intraBandwidth(a, b);
            minPeer = minPeer < 0 ? bw : std::min(minPeer, bw);
          }
        }
      }
      nb.totalBw = std::max(0.0, minPeer);
      nb.maxPeerBw = nb.totalBw;
      nb.nvlink = false;
      notes.emplace_back("PCIe node: ring speed taken from the slowest GPU-to-GPU PCIe path (GB/s as given)");
      break;
    }
  }
  if (ppn == 1) {
    nb.totalBw = 0;
    nb.maxPeerBw = 0;
  }
  // "a GPU's summed NVLink bw, or its PCI bw if larger"
  nb.totalBw = std::max(nb.totalBw, pcieBw);
  return nb;
}

}  // namespace

std::string_view toString(NcclArch a) {
  switch (a) {
    case NcclArch::Auto:
      return "auto";
    case NcclArch::Volta:
      return "Volta";
    case NcclArch::Ampere:
      return "Ampere";
    case NcclArch::Hopper:
      return "Hopper";
    case NcclArch::Blackwell:
      return "Blackwell";
  }
  return "?";
}

std::string_view toString(NcclCpu c) {
  switch (c) {
    case NcclCpu::Auto:
      return "auto";
    case NcclCpu::Intel:
      return "Intel";
    case NcclCpu::Amd:
      return "AMD";
  }
  return "?";
}

NcclTuning ncclTune(const Topology& t, const NcclModelOptions& o) {
  NcclTuning tu;
  tu.nNodes = std::max(1, t.nodes);
  tu.ppn = std::max(1, t.gpusPerNode);
  tu.nRanks = tu.nNodes * tu.ppn;
  tu.arch = o.arch == NcclArch::Auto ? archFromGpu(t.gpuType, tu.notes) : o.arch;
  tu.cpu = o.cpu != NcclCpu::Auto ? o.cpu : (tu.arch == NcclArch::Ampere ? NcclCpu::Amd : NcclCpu::Intel);
  const int ai = archIndex(tu.arch);
  const bool hopperPlus = ai >= 2;
  const double pcieBw = o.gpuNicPcieGBps > 0 ? o.gpuNicPcieGBps : kGpuNicPcieBw[ai];
  const NodeBw nb = intraBandwidth(t, tu.arch, tu.ppn == 1 ? pcieBw : 0.0, tu.notes);
  tu.totalBw = nb.totalBw;
  tu.ll128Enabled = nb.nvlink;  // typeIntra <= NVB; GPU and its NIC share a PCIe switch (typeInter <= PXB)

  const bool net = tu.nNodes > 1;
  NcclGraph ring;
  ring.nvlinkIntra = nb.nvlink;
  if (!net) {
    if (tu.ppn > 1 && nb.totalBw > 0) {
      // Intra-node ring: each channel passes every GPU's switch port once in each direction.
      auto lad = ladder(tu.arch, false);
      std::size_t i = firstSpeedAtMost(lad, std::min(nb.maxPeerBw, nb.totalBw));
      while (i + 1 < lad.size() && floorDiv(nb.totalBw, lad[i]) < 1) ++i;
      ring.searchChannels = std::min(floorDiv(nb.totalBw, lad[i]), kMaxSearchChannels);
      ring.bwIntra = ring.bwInter = lad[i];
      ring.present = ring.searchChannels > 0;
    }
  } else {
    // Networked ring: each channel enters a node through one NIC and leaves through one, so a NIC carries
    // floor(path / speed) channels per direction; inside the node (ppn-1)/ppn of the channels cross each GPU's
    // NVLink port in each direction (entry and exit rotate).
    std::vector<double> nicPath;
    for (const auto& nic : t.nics) {
      if (!nic.gpus.empty()) nicPath.push_back(std::min(nic.bandwidthGBps, pcieBw));
    }
    if (nicPath.empty()) {
      tu.notes.emplace_back("no NIC serves a GPU: no network path, nothing modelled");
    } else {
      const double maxBw = *std::max_element(nicPath.begin(), nicPath.end());
      tu.nicPathBw = maxBw;
      auto lad = ladder(tu.arch, true);
      auto channelsAt = [&](double speed) {
        int n = 0;
        for (double p : nicPath) n += floorDiv(p, speed);
        if (tu.ppn > 1) {
          n = std::min(n, floorDiv(nb.totalBw * tu.ppn, speed * (tu.ppn - 1)));
        }
        return std::min(n, kMaxSearchChannels);
      };
      std::size_t i = firstSpeedAtMost(lad, std::min(maxBw, nb.totalBw));
      while (i + 1 < lad.size() && channelsAt(lad[i]) < 1) ++i;
      ring.searchChannels = channelsAt(lad[i]);
      ring.bwIntra = ring.bwInter = lad[i];
      ring.present = ring.searchChannels > 0;
    }
  }
  NcclGraph tree = ring;
  dupChannels(ring, tu.arch);
  dupChannels(tree, tu.arch);
  // Pass 2 for trees on 2 nodes: raise bwIntra (only) up to 2 x bwInter while the NVLink ports carry it.
  if (tree.present && tu.nNodes == 2 && tu.ppn > 1) {
    auto lad = ladder(tu.arch, true);
    for (double s : lad) {
      if (s <= tree.bwIntra + kEps) break;
      if (s <= 2 * tree.bwInter + kEps && tree.nChannels * s * (tu.ppn - 1) <= nb.totalBw * tu.ppn + kEps) {
        tree.bwIntra = s;
        break;
      }
    }
  }
  tu.ring = ring;
  tu.tree = tree;
  tu.commChannels = ring.present ? std::min(2 * ring.nChannels, kMaxCommChannels) : 0;
  if (hopperPlus && net && ring.bwIntra > kHopperMultiNodeDoubleBw && tu.commChannels < kHopperMultiNodeDoubleBelow) {
    tu.commChannels = std::min(2 * tu.commChannels, kMaxCommChannels);
  }

  // NVLS graph (1.2): one head per GPU, bwIntra the highest intra speed s with (ppn - 1 + 2) x s within a GPU's
  // NVSwitch port; pass 2 raises the (single-node unused) bwInter to the top speed the port allows.
  if (hopperPlus && t.intra.kind == IntraFabricKind::NvSwitch && tu.ppn >= 2 && kNvlsEfficiency[ai] > 0) {
    auto lad = ladder(tu.arch, false);
    std::size_t i = 0;
    while (i + 1 < lad.size() && lad[i] * (tu.ppn + 1) > nb.totalBw + kEps) ++i;
    NcclGraph nv;
    nv.present = lad[i] * (tu.ppn + 1) <= nb.totalBw + kEps;
    nv.searchChannels = nv.nChannels = tu.ppn;
    if (net) {
      // Several nodes: the search pairs each NIC with its own GPU (net.localGpu), one head each, no GPU twice.
      std::vector<int> heads;
      for (const auto& nic : t.nics) {
        if (!nic.gpus.empty() && std::find(heads.begin(), heads.end(), nic.gpus.front()) == heads.end()) {
          heads.push_back(nic.gpus.front());
        }
      }
      nv.searchChannels = nv.nChannels = std::min(tu.ppn, static_cast<int>(heads.size()));
    }
    nv.bwIntra = lad[i];
    nv.bwInter = lad[firstSpeedAtMost(lad, nb.totalBw)];
    if (net) nv.bwInter = std::min(nv.bwInter, tu.nicPathBw);  // assumption (NVLSTree only), see header
    tu.nvls = nv;
    tu.nvlsChannels = tu.arch == NcclArch::Blackwell ? kNvlsChannelsBlackwell : kNvlsChannelsHopper;
  }
  return tu;
}

namespace {

int nSteps(Collective c, int n) {
  switch (c) {
    case Collective::AllReduce:
      return 2 * (n - 1);
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return n - 1;
    default:
      return n;
  }
}

bool algoSupports(core::Algorithm a, Collective c) {
  switch (c) {
    case Collective::AllReduce:
      return a != core::Algorithm::Pat;
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return a == core::Algorithm::Ring || a == core::Algorithm::Pat || a == core::Algorithm::Nvls ||
             a == core::Algorithm::CollNetDirect;
    case Collective::Broadcast:
    case Collective::Reduce:
      return a == core::Algorithm::Ring;
    default:
      return false;
  }
}

double log2Floor(int n) { return n > 1 ? std::floor(std::log2(static_cast<double>(n)) + kEps) : 0.0; }

// Bandwidth (algbw, GB/s) of ncclTopoTuneModel for one entry, before the size-dependent tree correction; 0 =
// unusable.
double modelBandwidth(const NcclTuning& tu, const NcclModelOptions& o, Collective c, int a, int p) {
  const auto algo = static_cast<core::Algorithm>(a);
  if (!algoSupports(algo, c)) return 0;
  if (!(o.algorithms & (1u << a)) || !(o.protocols & (1u << p))) return 0;
  const bool simpleOnly =
      algo == core::Algorithm::Nvls || algo == core::Algorithm::NvlsTree || algo == core::Algorithm::Pat;
  if (simpleOnly && p != kSimple) return 0;
  if (p == kLL128 && !tu.ll128Enabled) return 0;
  if (algo == core::Algorithm::CollNetDirect || algo == core::Algorithm::CollNetChain)
    return 0;  // no SHARP in Topology
  const int ai = archIndex(tu.arch);
  const int scale = std::min(tu.nNodes - 1, 2);
  const int n = tu.nRanks;
  const NcclGraph* g = nullptr;
  switch (algo) {
    case core::Algorithm::Ring:
      g = &tu.ring;
      break;
    case core::Algorithm::Tree:
      g = &tu.tree;
      break;
    case core::Algorithm::Nvls:
      if (!o.enableNvls || tu.nNodes > 1) return 0;  // multi-node NVLS needs CollNet (SHARP)
      g = &tu.nvls;
      break;
    case core::Algorithm::NvlsTree:
      if (!o.enableNvls || !o.enableNvlsTree || tu.nNodes == 1 || c != Collective::AllReduce) return 0;
      g = &tu.nvls;
      break;
    case core::Algorithm::Pat:
      if (tu.ppn != 1 || tu.nNodes < 2 || o.ncclVersion < kPatMinVersion) return 0;
      g = &tu.ring;
      break;
    default:
      return 0;
  }
  if (!g->present || g->nChannels == 0) return 0;
  const int nCh = g->nChannels;
  const double bw = tu.nNodes <= 2 ? g->bwIntra : g->bwInter;
  double busBw = nCh * bw;
  if (algo == core::Algorithm::Nvls || algo == core::Algorithm::NvlsTree) {
    if (nCh < 2) return 0;
    double intra = g->bwIntra * kNvlsEfficiency[ai] * (nCh - 1) / nCh;
    intra *= c == Collective::AllReduce ? 2.0 : static_cast<double>(tu.ppn - 1) / tu.ppn;
    double inter = g->bwInter * (algo == core::Algorithm::NvlsTree && tu.nNodes <= 2 ? 2.0 : 1.0);
    double perCh = std::min(intra, inter);
    if (algo == core::Algorithm::NvlsTree) {
      double cap = kPerChMaxNvlsTreeBw[ai][scale];
      if (tu.arch == NcclArch::Blackwell && scale == 2 && o.ncclVersion < kBlackwellCaps230) {
        cap = kNvlsTreeBlackwellN4Before230;
      }
      perCh = std::min(perCh, cap);
    }
    busBw = nCh * perCh;
  }
  const int llRow = tu.nNodes == 1 ? ai : (tu.cpu == NcclCpu::Intel ? 0 : 1);
  const double llMaxBw = kLlMaxBw[llRow][scale];
  if (algo == core::Algorithm::Ring && p == kLL) busBw = std::min(llMaxBw, kRingLLFactor * busBw);
  if (algo == core::Algorithm::Ring && p == kLL128) {
    double perCh = kPerChMaxRingLL128Bw[ai][scale];
    if (tu.arch == NcclArch::Blackwell && o.ncclVersion < kBlackwellCaps230) {
      perCh = kPerChMaxRingLL128BwBlackwell228[scale];
    }
    busBw = std::min(kLL128Factor * busBw, nCh * perCh);
  }
  if (algo == core::Algorithm::Tree) {
    busBw = std::min(kTreeFactor * busBw, nCh * kPerChMaxTreeBw[ai][scale]);
    if (p == kLL) busBw = std::min(busBw / kTreeLLDivisor, llMaxBw);
    if (p == kLL128) {
      busBw = std::min(busBw * (tu.nNodes == 1 ? kTreeLL128OneNode : kTreeLL128MultiNode),
                       nCh * kPerChMaxTreeLL128Bw[ai][scale]);
    }
  }
  if (algo == core::Algorithm::Pat) busBw *= kPatFactor;
  // Bus to algorithm bandwidth.
  const bool agRs = c == Collective::AllGather || c == Collective::ReduceScatter;
  if (algo == core::Algorithm::Ring ||
      ((algo == core::Algorithm::Nvls || algo == core::Algorithm::NvlsTree) && !agRs)) {
    return busBw * n / nSteps(c, n);
  }
  if (algo == core::Algorithm::Tree) return busBw * 0.5;
  return busBw;  // PAT and NVLS AG/RS: used as algbw
}

// `interScale` multiplies the network hops' latency (1 = NCCL's; 0 gives the latency without them).
double modelLatency(const NcclTuning& tu, Collective c, int a, int p, double interScale) {
  const auto algo = static_cast<core::Algorithm>(a);
  const int hw = tu.ring.nvlinkIntra ? kHwNvLink : kHwPci;
  const double intra = kHwLat[hw][a][p];
  // latencyInter is 0 for the IB and socket transports, so the Simple "flush" adds nothing.
  const double inter = interScale * kHwLat[kHwNet][tu.ppn == 1 ? kAlgoTree : a][p];
  const double base = kBaseLat[a][p];
  const int n = tu.nRanks;
  const double depth = log2Floor(tu.nNodes);
  switch (algo) {
    case core::Algorithm::Ring: {
      const int steps = nSteps(c, n);
      if (c == Collective::Broadcast || c == Collective::Reduce) {
        // One shared ring order on one node: one hop. Otherwise one per step (Simple from the Tree row),
        // node boundaries at NET cost -- our reading of 1.5 for several nodes.
        if (tu.nNodes == 1) return base + intra;
        const int q = p == kSimple ? kAlgoTree : kAlgoRing;
        const int interSteps = tu.nNodes - 1;
        return base + (steps - interSteps) * kHwLat[hw][q][p] + interSteps * interScale * kHwLat[kHwNet][q][p];
      }
      int interSteps = 0;
      if (tu.nNodes > 1) interSteps = c == Collective::AllReduce ? 2 * (tu.nNodes - 1) : tu.nNodes - 1;
      double intraStep = intra;
      if (tu.nNodes > 1) {
        const double overhead = (tu.cpu == NcclCpu::Amd ? kNetOverheadAmd : kNetOverheadIntel) *
                                (p == kSimple ? kNetOverheadSimpleFactor : 1.0);
        intraStep = std::max(intra, overhead);
      }
      return base + (steps - interSteps) * intraStep + interSteps * inter;
    }
    case core::Algorithm::Tree:
      return base + 2 * ((tu.ppn - 1) * intra + depth * inter);
    case core::Algorithm::Nvls:
      return intra + (tu.nNodes > 1 ? inter : 0);
    case core::Algorithm::NvlsTree:
      return base + intra + 2 * depth * inter;
    case core::Algorithm::Pat:
      return kPatLatBase + depth * inter / kPatInterDivisor + n * kPatPerRank;
    case core::Algorithm::CollNetDirect:
      return base + 2 * (std::min(1, tu.ppn - 1) * intra + (tu.ppn - 1) * 0.4) + inter;
    case core::Algorithm::CollNetChain:
      return base + 2 * (tu.ppn - 1) * intra + inter;
  }
  return -1;
}

double treeCorrection(int p, std::uint64_t nBytes) {
  if (nBytes < 64) return 1.0;
  const int idx = static_cast<int>(std::floor(std::log2(static_cast<double>(nBytes) / 64.0) + kEps));
  if (idx < 0 || idx > kTreeCorrectionMaxIndex) return 1.0;
  return kTreeCorrection[p][idx];
}

// 1.6 "Channels": start from the communicator's count, drop channels (then halve threads) while the message is
// too small to give every thread its threshold of bytes.
void pickChannels(NcclPrediction& pr, const NcclTuning& tu) {
  const int a = static_cast<int>(pr.algorithm);
  const int p = static_cast<int>(pr.protocol);
  const double bytes = static_cast<double>(pr.sizeBytes);
  if (pr.algorithm == core::Algorithm::Nvls || pr.algorithm == core::Algorithm::NvlsTree) {
    pr.channels = tu.nvlsChannels;
    pr.threads = 0;  // 1.6 gives no NVLS thread count
    pr.graphChannels = tu.nvls.nChannels;
    return;
  }
  pr.graphChannels = a == kAlgoTree ? tu.tree.nChannels : tu.ring.nChannels;
  int nt = 0;
  double threshold = 0;
  if (a == kAlgoTree || a == kAlgoPat) {
    nt = kThreadsTree;
  } else if (p == kLL) {
    nt = kThreadsLL;
  } else if (p == kLL128) {
    nt = kThreadsLL128;
  } else {
    nt = tu.ring.bwIntra * tu.ring.nChannels <= 12.0 ? kThreadsSimpleLow : kThreadsSimple;
  }
  if (p == kLL) threshold = kThresholdLL * (a == kAlgoRing ? tu.nRanks : 1);
  if (p == kLL128) threshold = kThresholdLL128;
  if (p == kSimple) threshold = kThresholdSimple;
  int nc = tu.commChannels;
  while (bytes < static_cast<double>(nc) * nt * threshold) {
    if (nc >= 2) {
      --nc;
    } else if (nt % 128 == 0) {
      nt /= 2;
    } else {
      break;
    }
  }
  if (p == kSimple && a == kAlgoRing) nt += kWarp;
  if (p == kSimple && a == kAlgoTree) nt += 4 * kWarp;
  pr.channels = nc;
  pr.threads = std::min(nt, kThreadsMax);
}

}  // namespace

NcclPrediction ncclPredict(const Topology& topo, Collective collective, std::uint64_t sizeBytes,
                           const NcclModelOptions& options) {
  return ncclPredict(ncclTune(topo, options), collective, sizeBytes, options);
}

NcclPrediction ncclPredict(const NcclTuning& tu, Collective collective, std::uint64_t sizeBytes,
                           const NcclModelOptions& options) {
  NcclPrediction pr;
  pr.collective = collective;
  pr.sizeBytes = sizeBytes;
  pr.nRanks = tu.nRanks;
  pr.tuning = tu;
  for (auto& row : pr.latency) row.fill(-1);
  for (auto& row : pr.bandwidth) row.fill(-1);
  for (auto& row : pr.time) row.fill(-1);
  for (auto& row : pr.netLatency) row.fill(-1);
  if (tu.nRanks < 2) {
    pr.error = "one rank: NCCL runs no algorithm (a local copy)";
    return pr;
  }
  const double bytes = static_cast<double>(sizeBytes);
  double best = -1;
  for (int a = 0; a < core::kNumAlgorithms; ++a) {
    for (int p = 0; p < core::kNumProtocols; ++p) {
      double bw = modelBandwidth(tu, options, collective, a, p);
      if (bw <= 0) continue;
      if (a == kAlgoTree && collective == Collective::AllReduce) bw *= treeCorrection(p, sizeBytes);
      double lat = modelLatency(tu, collective, a, p, 1.0);
      double latNoNet = modelLatency(tu, collective, a, p, 0.0);
      if (a == kAlgoRing && p == kSimple && collective == Collective::AllReduce && tu.nNodes > 1 &&
          bytes / (static_cast<double>(tu.commChannels) * tu.nRanks) >= kRingPlateauBytes) {
        const double plateau = archIndex(tu.arch) >= 1 ? kRingPlateauSm80 : kRingPlateauOlder;
        lat *= plateau;
        latNoNet *= plateau;
      }
      pr.netLatency[a][p] = lat - latNoNet;
      const double t = lat + bytes / (1000.0 * bw);
      pr.latency[a][p] = lat;
      pr.bandwidth[a][p] = bw;
      pr.time[a][p] = t;
      if (best < 0 || t < best) {
        best = t;
        pr.algorithm = static_cast<core::Algorithm>(a);
        pr.protocol = static_cast<core::Protocol>(p);
      }
    }
  }
  if (best < 0) {
    pr.error = fmt::format("NCCL's model has no usable algorithm for {} on this topology", core::toString(collective));
    return pr;
  }
  const int a = static_cast<int>(pr.algorithm);
  const int p = static_cast<int>(pr.protocol);
  pr.timeUs = best;
  pr.latencyUs = pr.latency[a][p];
  pr.algbwGBps = core::gbps(bytes, best);
  pr.busbwGBps = pr.algbwGBps * core::busBandwidthFactor(collective, tu.nRanks);
  pickChannels(pr, tu);
  return pr;
}

nlohmann::json ncclPredictionToJson(const NcclPrediction& p, bool withTable) {
  nlohmann::json j;
  j["size_bytes"] = p.sizeBytes;
  if (!p.ok()) {
    j["error"] = p.error;
    return j;
  }
  j["algorithm"] = std::string(toString(p.algorithm));
  j["protocol"] = std::string(toString(p.protocol));
  j["channels"] = p.channels;
  j["time_us"] = p.timeUs;
  j["algbw_gbps"] = p.algbwGBps;
  j["busbw_gbps"] = p.busbwGBps;
  if (withTable) {
    j["threads"] = p.threads;
    j["graph_channels"] = p.graphChannels;
    nlohmann::json table = nlohmann::json::object();
    for (int a = 0; a < core::kNumAlgorithms; ++a) {
      nlohmann::json row = nlohmann::json::object();
      for (int pr = 0; pr < core::kNumProtocols; ++pr) {
        row[std::string(toString(static_cast<core::Protocol>(pr)))] = p.time[a][pr];
      }
      table[std::string(toString(static_cast<core::Algorithm>(a)))] = row;
    }
    j["table"] = table;
  }
  return j;
}

nlohmann::json ncclTuningToJson(const NcclTuning& t) {
  auto graph = [](const NcclGraph& g) {
    return nlohmann::json{{"present", g.present},    {"search_channels", g.searchChannels},
                          {"channels", g.nChannels}, {"bw_intra", g.bwIntra},
                          {"bw_inter", g.bwInter},   {"type_intra", g.nvlinkIntra ? "NVL" : "PCI"}};
  };
  return nlohmann::json{{"arch", std::string(toString(t.arch))},
                        {"cpu", std::string(toString(t.cpu))},
                        {"nodes", t.nNodes},
                        {"ranks", t.nRanks},
                        {"ppn", t.ppn},
                        {"total_bw", t.totalBw},
                        {"nic_path_bw", t.nicPathBw},
                        {"ring", graph(t.ring)},
                        {"tree", graph(t.tree)},
                        {"nvls", graph(t.nvls)},
                        {"comm_channels", t.commChannels},
                        {"nvls_channels", t.nvlsChannels},
                        {"ll128", t.ll128Enabled},
                        {"notes", t.notes}};
}

}  // namespace optiflow::sim
