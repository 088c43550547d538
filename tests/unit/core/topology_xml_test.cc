// NCCL's topology XML as a Topology: dumps (NCCL_TOPO_DUMP_FILE) and cloud skeletons (NCCL_TOPO_FILE), read by the
// one loader every command's --topo goes through.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "temp_dir.h"

namespace optiflow::core {
namespace {

namespace fs = std::filesystem;

TopologyHints nodes(int n) {
  TopologyHints h;
  h.nodes = n;
  return h;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const char* kNvSwitchXml = R"(<system version="1">
  <cpu numaid="0" affinity="ffff" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:07:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="80" rank="0" gdr="1">
          <nvlink target="0000:c4:00.0" count="6" tclass="0x068000"/>
          <nvlink target="0000:c5:00.0" count="6" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:0b:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="80" rank="1" gdr="1">
          <nvlink target="0000:c4:00.0" count="6" tclass="0x068000"/>
          <nvlink target="0000:c5:00.0" count="6" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:0c:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
        <nic>
          <net name="mlx5_0" dev="0" speed="200000" port="1" latency="0" guid="0x1" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
    </pci>
    <pci busid="0000:41:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:47:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="2" sm="80" rank="2" gdr="1">
          <nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:4e:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="3" sm="80" rank="3" gdr="1">
          <nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:4f:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
        <nic>
          <net name="mlx5_1" dev="1" speed="200000" port="1" latency="0" guid="0x2" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
    </pci>
  </cpu>
</system>
)";

TEST(NcclTopoTest, NvSwitchNodeWithRails) {
  auto t = parseNcclTopoXml(kNvSwitchXml, "node.xml", nodes(2));
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->gpusPerNode, 4);
  EXPECT_EQ(t->nodes, 2);
  EXPECT_EQ(t->gpuType, "A100");
  EXPECT_EQ(t->intra.kind, IntraFabricKind::NvSwitch);
  EXPECT_DOUBLE_EQ(t->intra.gpuBandwidthGBps, 300);  // 12 NVLink 3 links x 25 GB/s
  ASSERT_EQ(t->nics.size(), 2u);
  EXPECT_EQ(t->nics[0].name, "mlx5_0");
  EXPECT_DOUBLE_EQ(t->nics[0].bandwidthGBps, 25);  // 200000 Mb/s
  EXPECT_EQ(t->nics[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(t->nics[1].gpus, (std::vector<int>{2, 3}));
  EXPECT_NE(t->inter.kind, InterFabricKind::None);
  EXPECT_TRUE(t->validate().empty());
}

TEST(NcclTopoTest, MeshAndPcieNodes) {
  const char* mesh = R"(<system version="1"><cpu numaid="0">
    <pci busid="0000:01:00.0"><gpu dev="0" sm="70">
      <nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu></pci>
    <pci busid="0000:02:00.0"><gpu dev="1" sm="70">
      <nvlink target="0000:01:00.0" count="2" tclass="0x030200"/></gpu></pci>
  </cpu></system>)";
  auto m = parseNcclTopoXml(mesh, "mesh.xml", nodes(1));
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(m->intra.kind, IntraFabricKind::NvLinkMesh);
  ASSERT_EQ(m->intra.links.size(), 1u);
  EXPECT_DOUBLE_EQ(m->intra.links[0].bandwidthGBps, 50);
  EXPECT_EQ(m->gpuType, "V100");

  const char* pcie = R"(<system version="1"><cpu numaid="0">
    <pci busid="0000:10:00.0" link_speed="8.0 GT/s PCIe" link_width="16">
      <pci busid="0000:11:00.0" link_speed="8.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="75"/></pci>
      <pci busid="0000:12:00.0" link_speed="8.0 GT/s PCIe" link_width="16"><gpu dev="1" sm="75"/></pci>
    </pci>
    <pci busid="0000:20:00.0" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="2" sm="75"/></pci>
  </cpu></system>)";
  auto p = parseNcclTopoXml(pcie, "pcie.xml", nodes(1));
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(p->intra.kind, IntraFabricKind::Pcie);
  ASSERT_EQ(p->intra.switches.size(), 2u);
  EXPECT_EQ(p->intra.switches[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(p->intra.gpuBandwidthGBps, 12);  // Gen3 x16 in NCCL's units
  EXPECT_GT(p->intra.hostBandwidthGBps, 0);
}

TEST(NcclTopoTest, ErrorsNameTheFileAndWhatIsMissing) {
  auto notXml = parseNcclTopoXml("<system", "a.xml", nodes(1));
  ASSERT_FALSE(notXml.ok());
  EXPECT_NE(notXml.error().str().find("a.xml: not an NCCL topology file"), std::string::npos);
  auto noSystem = parseNcclTopoXml("<graphs/>", "b.xml", nodes(1));
  ASSERT_FALSE(noSystem.ok());
  EXPECT_NE(noSystem.error().str().find("no <system> root element"), std::string::npos);
  auto noGpu = parseNcclTopoXml("<system version=\"1\"><cpu/></system>", "c.xml", nodes(1));
  ASSERT_FALSE(noGpu.ok());
  EXPECT_NE(noGpu.error().str().find("c.xml: no GPU"), std::string::npos);
  const char* noNet = R"(<system><cpu><pci busid="0000:01:00.0"><gpu dev="0" sm="90"/></pci></cpu></system>)";
  auto one = parseNcclTopoXml(noNet, "d.xml", nodes(1));
  ASSERT_TRUE(one.ok()) << one.error().str();
  auto multi = parseNcclTopoXml(noNet, "d.xml", nodes(2));
  ASSERT_FALSE(multi.ok());
  EXPECT_NE(multi.error().str().find("no NIC"), std::string::npos);
  const char* noSpeed = R"(<system><cpu><pci busid="0000:01:00.0"><gpu dev="0" sm="90"/></pci>
    <pci busid="0000:02:00.0"><nic><net name="eth0"/></nic></pci></cpu></system>)";
  auto speed = parseNcclTopoXml(noSpeed, "e.xml", nodes(1));
  ASSERT_FALSE(speed.ok());
  EXPECT_NE(speed.error().str().find("<net name=\"eth0\"> has no speed"), std::string::npos);
  EXPECT_NE(loadNcclTopoXml("/nonexistent/topo.xml", {}).error().str().find("/nonexistent/topo.xml"),
            std::string::npos);
}

// A p4d-like skeleton: two PCIe switches, each with two A100-SXM4-40GB (device 0x20b0) and one EFA NIC; no <gpu>,
// no <nvlink>, no <net>.
const char* kSkeleton = R"(<!-- a comment first, as the vendors' files have -->
<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="ffff:ff:01.0" class="0x060400" vendor="0xffff" device="0xffff" link_speed="8 GT/s" link_width="16">
      <pci busid="0000:10:1c.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="8 GT/s" link_width="16"/>
      <pci busid="0000:10:1d.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="8 GT/s" link_width="16"/>
      <pci busid="0000:10:1b.0" class="0x020000" vendor="0x1d0f" device="0xefa0" link_speed="8 GT/s" link_width="16"/>
    </pci>
    <pci busid="ffff:ff:02.0" class="0x060400" vendor="0xffff" device="0xffff" link_speed="8 GT/s" link_width="16">
      <pci busid="0000:20:1c.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="8 GT/s" link_width="16"/>
      <pci busid="0000:20:1d.0" class="0x030200" vendor="0x10de" device="0x20b0" link_speed="8 GT/s" link_width="16"/>
      <pci busid="0000:20:1b.0" class="0x020000" vendor="0x1d0f" device="0xefa0" link_speed="8 GT/s" link_width="16"/>
    </pci>
  </cpu>
</system>
)";

TEST(NcclTopoTest, SkeletonTakesTheModelFromThePciIdAndTheNicSpeedFromTheHints) {
  TopologyHints h = nodes(2);
  auto missing = parseNcclTopoXml(kSkeleton, "p4d.xml", h);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(contains(missing.error().str(), "p4d.xml: NIC <pci busid=\"0000:10:1b.0\"")) << missing.error().str();
  EXPECT_TRUE(contains(missing.error().str(), "--nic-gbps")) << missing.error().str();

  h.nicGbps = 100;
  std::vector<std::string> notes;
  auto t = parseNcclTopoXml(kSkeleton, "p4d.xml", h, &notes);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->gpuType, "A100");
  EXPECT_EQ(t->gpusPerNode, 4);
  EXPECT_EQ(t->nodes, 2);
  // Four SXM GPUs and no <nvlink>: not assumed to be an NVSwitch board (only 8-GPU boards are); PCIe, said so.
  EXPECT_EQ(t->intra.kind, IntraFabricKind::Pcie);
  ASSERT_EQ(t->intra.switches.size(), 2u);
  EXPECT_DOUBLE_EQ(t->intra.gpuBandwidthGBps, 12);  // 8 GT/s x16 in NCCL's units
  ASSERT_EQ(t->nics.size(), 2u);
  EXPECT_DOUBLE_EQ(t->nics[0].bandwidthGBps, 12.5);
  EXPECT_EQ(t->nics[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(t->nics[1].gpus, (std::vector<int>{2, 3}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(contains(notes[0], "modelled as PCIe only")) << notes[0];

  // One node needs no NIC speed: the NICs are left out, and the note says so.
  notes.clear();
  auto one = parseNcclTopoXml(kSkeleton, "p4d.xml", {}, &notes);
  ASSERT_TRUE(one.ok()) << one.error().str();
  EXPECT_TRUE(one->nics.empty());
  EXPECT_EQ(notes.size(), 2u);
}

TEST(NcclTopoTest, UnknownGpuNeedsTheGpuHint) {
  std::string unknown = kSkeleton;
  for (std::size_t at = unknown.find("0x20b0"); at != std::string::npos; at = unknown.find("0x20b0"))
    unknown.replace(at, 6, "0x9999");
  auto t = parseNcclTopoXml(unknown, "odd.xml", {});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.error().str(),
                       "odd.xml: GPU 0 (<pci busid=\"0000:10:1c.0\" vendor=\"0x10de\" "
                       "device=\"0x9999\">) has no model"))
      << t.error().str();
  EXPECT_TRUE(contains(t.error().str(), "--gpu")) << t.error().str();
  TopologyHints h;
  h.gpuType = "H100";
  auto named = parseNcclTopoXml(unknown, "odd.xml", h);
  ASSERT_TRUE(named.ok()) << named.error().str();
  EXPECT_EQ(named->gpuType, "H100");
  h.gpuType = "TPU";
  auto bad = parseNcclTopoXml(unknown, "odd.xml", h);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.error().str(), "\"TPU\" (--gpu)")) << bad.error().str();
}

TEST(NcclTopoTest, EightSxmGpusWithoutNvlinksAreAnNvSwitchBoard) {
  std::string eight = "<system version=\"1\"><cpu numaid=\"0\">";
  for (int g = 0; g < 8; ++g) {
    eight +=
        "<pci busid=\"0000:" + std::to_string(10 + g) +
        ":00.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x2330\" link_speed=\"32 GT/s\" link_width=\"16\"/>";
  }
  eight += "</cpu></system>";
  std::vector<std::string> notes;
  auto t = parseNcclTopoXml(eight, "h100.xml", {}, &notes);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->gpuType, "H100");
  EXPECT_EQ(t->intra.kind, IntraFabricKind::NvSwitch);
  EXPECT_DOUBLE_EQ(t->intra.gpuBandwidthGBps, 450);  // 18 NVLink 4 links x 25 GB/s
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(contains(notes[0], "NVSwitch baseboard")) << notes[0];
}

// The one loader: presets, TOML and XML by content, and --nodes.
TEST(NcclTopoTest, LoadTopologyTellsXmlFromTomlByContent) {
  optiflow::testsupport::TempDir dir("topo-xml-load");
  const fs::path xml = dir.path() / "node.topo";  // no .xml suffix: told by content
  std::ofstream(xml) << "\n  " << kNvSwitchXml;
  auto t = loadTopology(xml.string(), nodes(4));
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->nodes, 4);
  EXPECT_EQ(t->nRanks(), 16);

  const fs::path toml = dir.path() / "node.toml";
  std::ofstream(toml) << topologyToToml(*t);
  auto again = loadTopology(toml.string(), nodes(8));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(again->nodes, 8);
  auto same = loadTopology(toml.string());
  ASSERT_TRUE(same.ok()) << same.error().str();
  EXPECT_EQ(same->nodes, 4);

  auto preset = loadTopology("dgx-a100", nodes(4));
  ASSERT_TRUE(preset.ok()) << preset.error().str();
  EXPECT_EQ(preset->nodes, 4);
  auto clash = loadTopology("dgx-a100x2", nodes(4));
  ASSERT_FALSE(clash.ok());
  EXPECT_TRUE(contains(clash.error().str(), "has 2 node(s) and --nodes says 4")) << clash.error().str();

  std::ofstream(dir.path() / "broken.xml") << "<system><cpu>";
  auto broken = loadTopology((dir.path() / "broken.xml").string());
  ASSERT_FALSE(broken.ok());
  EXPECT_TRUE(contains(broken.error().str(), "broken.xml: not an NCCL topology file: XML error"))
      << broken.error().str();
}

// The real files cloud images ship (../shared/reference/nccl-topo; tests skip without it).
fs::path topoDir() { return fs::path(OPTIFLOW_SOURCE_DIR "/../shared/reference/nccl-topo"); }

TEST(NcclTopoTest, RealCloudFiles) {
  if (!fs::exists(topoDir())) GTEST_SKIP() << "no ../shared/reference/nccl-topo in this checkout";
  // Azure NC A100 v4: a dump-like file, 4 A100 PCIe, NVLinks that target their own GPU, one Ethernet NIC.
  auto nc = loadTopology((topoDir() / "azure-ncv4-topo.xml").string());
  ASSERT_TRUE(nc.ok()) << nc.error().str();
  EXPECT_EQ(nc->gpusPerNode, 4);
  EXPECT_EQ(nc->gpuType, "A100");
  EXPECT_EQ(nc->intra.kind, IntraFabricKind::Pcie);
  ASSERT_EQ(nc->nics.size(), 1u);
  EXPECT_DOUBLE_EQ(nc->nics[0].bandwidthGBps, 12.5);  // speed="100000" Mb/s
  auto nc2 = loadTopology((topoDir() / "azure-ncv4-topo.xml").string(), nodes(2));
  ASSERT_TRUE(nc2.ok()) << nc2.error().str();
  EXPECT_EQ(nc2->nRanks(), 8);

  // AWS p4d.24xlarge: a skeleton; eight A100-SXM4-40GB, four EFA NICs, one per two GPUs.
  const std::string p4d = (topoDir() / "aws-p4d-24xl-topo.xml").string();
  auto noSpeed = loadTopology(p4d, nodes(2));
  ASSERT_FALSE(noSpeed.ok());
  EXPECT_TRUE(contains(noSpeed.error().str(), "aws-p4d-24xl-topo.xml")) << noSpeed.error().str();
  EXPECT_TRUE(contains(noSpeed.error().str(), "--nic-gbps")) << noSpeed.error().str();
  TopologyHints h = nodes(2);
  h.nicGbps = 100;
  auto t = loadTopology(p4d, h);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->gpuType, "A100");
  EXPECT_EQ(t->gpusPerNode, 8);
  EXPECT_EQ(t->intra.kind, IntraFabricKind::NvSwitch);
  EXPECT_DOUBLE_EQ(t->intra.gpuBandwidthGBps, 300);
  ASSERT_EQ(t->nics.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t->nics[i].gpus, (std::vector<int>{static_cast<int>(2 * i), static_cast<int>(2 * i + 1)}));
  }
  EXPECT_EQ(t->inter.kind, InterFabricKind::FatTree);
}

}  // namespace
}  // namespace optiflow::core
