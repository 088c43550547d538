// NCCL's own performance model, rebuilt from the rules of NCCL's public source (NCCL 2.30.7 src/graph/tuning.cc,
// search.cc, topo.h, src/enqueue.cc; identical in 2.28.9 for Volta/Ampere/Hopper): the graph search results NCCL
// would derive for a topology, the
// latency and bandwidth tables of ncclTopoTuneModel, the cost table time = lat + bytes / bw per (algorithm,
// protocol), and NCCL's choice (the minimum) with its runtime channel count. This is what NCCL *predicts* for itself,
// not what it achieves; docs/nccl-model.md lists every constant with its section (sections 1.1 .. 1.11 are defined
// there, each naming its NCCL source file) and what is left out.
//
// Units: bytes, microseconds, GB/s (1e9 bytes per second). Sizes are nccl-tests sizes (the whole buffer: the
// All-Gather output, the Reduce-Scatter input).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"

namespace optiflow::sim {

// NCCL's algorithms and protocols are core::Algorithm and core::Protocol (core/vocabulary.h), in NCCL's order: the
// tables below are indexed by them.

// The GPU generation selects NCCL's constant rows (per-link NVLink bw, search ladders, caps, NVLS efficiency).
enum class NcclArch : std::uint8_t { Auto, Volta, Ampere, Hopper, Blackwell };
// The host CPU selects the network post overhead and, on several nodes, the llMaxBw row. Our Topology does not
// describe the host, so it is an option; Auto = A100 systems AMD (DGX A100 / Azure NDv4: EPYC), everything else
// Intel (DGX H100 / HGX H200 / ND H100 v5: Xeon 8480C), per Azure's published ND A100 v4 / ND H100 v5 results and
// NVIDIA's MLCommons H200 system description.
enum class NcclCpu : std::uint8_t { Auto, Intel, Amd };

std::string_view toString(NcclArch a);
std::string_view toString(NcclCpu c);

// A bit per core::Algorithm / core::Protocol (what NCCL_ALGO / NCCL_PROTO allow).
inline constexpr std::uint32_t kNcclAllAlgos = (1u << core::kNumAlgorithms) - 1;
inline constexpr std::uint32_t kNcclAllProtos = (1u << core::kNumProtocols) - 1;
constexpr std::uint32_t ncclAlgoBit(core::Algorithm a) { return 1u << static_cast<unsigned>(a); }
constexpr std::uint32_t ncclProtoBit(core::Protocol p) { return 1u << static_cast<unsigned>(p); }

struct NcclModelOptions {
  NcclArch arch = NcclArch::Auto;  // Auto: from Topology::gpuType (V100, A100/A800, H100/H200/H800, B100/B200)
  NcclCpu cpu = NcclCpu::Auto;
  // NCCL version as major*10000 + minor*100 + patch. It matters only where NCCL's rules change: PAT exists from
  // 2.23, and Blackwell's LL128 ring / NVLSTree caps differ before 2.30.
  int ncclVersion = 23007;
  // GPU <-> NIC PCIe path bandwidth as NCCL computes it (width x per-lane rate / 80); 0 = by generation: Volta
  // Gen3 x16 = 12, Ampere Gen4 x16 = 24, Hopper/Blackwell Gen5 x16 = 48 (section 1.2 and its derived table).
  double gpuNicPcieGBps = 0;
  std::uint32_t algorithms = kNcclAllAlgos;  // NCCL_ALGO
  std::uint32_t protocols = kNcclAllProtos;  // NCCL_PROTO
  bool enableNvls = true;                    // NCCL_NVLS_ENABLE (NVLS needs Hopper+ and NVSwitch, one node here)
  // NVLSTree (AllReduce: NVLS inside each node, a tree between nodes), as NCCL enables it on several nodes of
  // NVLS-capable GPUs (Hopper+, NVSwitch) without SHARP. Its graph: one head per GPU that has a NIC of its own (at
  // most the GPUs per node), bwIntra as on one node, bwInter the GPU<->NIC path; see docs/nccl-model.md. Off gives the
  // Ring/Tree-only NCCL of the reference sheet's derived H100 4 x 8 column (NCCL_ALGO without NVLSTree).
  bool enableNvlsTree = true;
};

// One graph search result (section 1.1 step 2, 1.2): parallel channels that each sustain bwIntra inside the node and
// bwInter to the NIC, after channel duplication (ncclTopoDupChannels).
struct NcclGraph {
  bool present = false;
  int searchChannels = 0;  // what the search found, before duplication
  int nChannels = 0;       // after duplication: what the cost model uses
  double bwIntra = 0;      // GB/s per channel
  double bwInter = 0;
  bool nvlinkIntra = true;  // typeIntra is NVLink (else PCI): selects the hardware latency row
};

// What ncclTopoTuneModel sees for one communicator.
struct NcclTuning {
  NcclArch arch = NcclArch::Ampere;
  NcclCpu cpu = NcclCpu::Intel;
  int nNodes = 1;
  int nRanks = 1;
  int ppn = 1;           // ranks per node
  double totalBw = 0;    // one GPU's summed NVLink bw (or PCI bw if larger), GB/s
  double nicPathBw = 0;  // min(NIC, GPU<->NIC PCIe) per NIC, GB/s; 0 on one node
  NcclGraph ring;
  NcclGraph tree;
  NcclGraph nvls;
  int commChannels = 0;  // comm->nChannels: the rings the kernels run (ring graph x2, capped at 64, ...)
  int nvlsChannels = 0;  // NVLS CTAs (16 on Hopper)
  bool ll128Enabled = true;
  std::vector<std::string> notes;  // approximations taken for this topology (empty on the presets)
};

NcclTuning ncclTune(const core::Topology& topo, const NcclModelOptions& options = {});

// latency (us), bandwidth (GB/s of user buffer, i.e. algbw) and time per (algo, proto); -1 where unusable.
using NcclTable = std::array<std::array<double, core::kNumProtocols>, core::kNumAlgorithms>;

struct NcclPrediction {
  std::string error;  // non-empty when NCCL's model has nothing for this case (then the numbers below are -1)
  core::Collective collective = core::Collective::AllReduce;
  std::uint64_t sizeBytes = 0;
  int nRanks = 0;
  core::Algorithm algorithm = core::Algorithm::Ring;
  core::Protocol protocol = core::Protocol::Simple;
  int channels = 0;       // runtime channels NCCL launches for this size (1.6 "Channels")
  int threads = 0;        // threads per channel it launches
  int graphChannels = 0;  // the chosen algorithm's graph channels, which the bandwidth model uses
  double latencyUs = -1;  // of the chosen entry
  double timeUs = -1;
  double algbwGBps = -1;   // sizeBytes / time
  double busbwGBps = -1;   // algbw x nccl-tests factor
  NcclTable latency{};     // per algo/proto, -1 where unusable
  NcclTable bandwidth{};   // algbw per algo/proto (tree correction applied), -1 where unusable
  NcclTable time{};        // -1 where unusable
  NcclTable netLatency{};  // the part of `latency` the network hops contribute (0 on one node), -1 where unusable
  NcclTuning tuning;

  bool ok() const { return error.empty(); }
};

NcclPrediction ncclPredict(const core::Topology& topo, core::Collective collective, std::uint64_t sizeBytes,
                           const NcclModelOptions& options = {});
// The same with the tuning computed once (for size sweeps).
NcclPrediction ncclPredict(const NcclTuning& tuning, core::Collective collective, std::uint64_t sizeBytes,
                           const NcclModelOptions& options = {});

// {"size_bytes", "algorithm", "protocol", "channels", "time_us", "algbw_gbps", "busbw_gbps"} plus, with
// `withTable`, "threads", "graph_channels" and "table": {algo: {proto: time_us or -1}}.
nlohmann::json ncclPredictionToJson(const NcclPrediction& p, bool withTable = false);
nlohmann::json ncclTuningToJson(const NcclTuning& t);

}  // namespace optiflow::sim
