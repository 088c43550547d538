#include "optiflow/core/topology.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace optiflow::core {
namespace {

// ---- helpers ----

Topology parseOk(std::string_view text, std::string_view file = "test.toml") {
  Result<Topology> r = parseTopologyToml(text, file);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().str()) << "\n--- input ---\n" << text;
  return r.ok() ? r.value() : Topology{};
}

void expectRoundTrip(const Topology& t) {
  std::string text = topologyToToml(t);
  Result<Topology> back = parseTopologyToml(text, "<roundtrip>");
  ASSERT_TRUE(back.ok()) << back.error().str() << "\n" << text;
  EXPECT_EQ(back.value(), t) << text;
}

// Replaces 1-based lines of `base`; a replacement may hold several lines or be empty.
std::string edit(const std::string& base, const std::map<int, std::string>& lines) {
  std::istringstream in(base);
  std::string out, line;
  for (int n = 1; std::getline(in, line); ++n) {
    auto it = lines.find(n);
    out += (it == lines.end() ? line : it->second) + "\n";
  }
  return out;
}

// Asserts a diagnostic naming bad.toml, the line, and every fragment (key path, what was expected).
void expectError(const std::string& text, int line, const std::vector<std::string>& fragments) {
  Result<Topology> r = parseTopologyToml(text, "bad.toml");
  ASSERT_FALSE(r.ok()) << "accepted:\n" << text;
  const Diagnostic& d = r.error();
  std::string s = d.str();
  EXPECT_EQ(d.file, "bad.toml") << s;
  EXPECT_EQ(d.line, line) << s << "\n--- input ---\n" << text;
  if (line > 0) {
    EXPECT_GT(d.column, 0) << s;
    EXPECT_NE(s.find("bad.toml:" + std::to_string(line) + ":"), std::string::npos) << s;
  }
  for (const auto& f : fragments) EXPECT_NE(s.find(f), std::string::npos) << "missing \"" << f << "\" in: " << s;
}

// Lines are numbered in the comments because the error tests below address them.
const std::string kBase =
    "name = \"t\"\n"                      // 1
    "nodes = 2\n"                         // 2
    "gpus_per_node = 2\n"                 // 3
    "gpu_type = \"X\"\n"                  // 4
    "\n"                                  // 5
    "[intra]\n"                           // 6
    "kind = \"nvswitch\"\n"               // 7
    "gpu_bandwidth_gbytes_per_s = 100\n"  // 8
    "latency_us = 0.5\n"                  // 9
    "\n"                                  // 10
    "[[nics]]\n"                          // 11
    "name = \"n0\"\n"                     // 12
    "gbps = 200\n"                        // 13
    "latency_us = 1.0\n"                  // 14
    "gpus = [0]\n"                        // 15
    "\n"                                  // 16
    "[[nics]]\n"                          // 17
    "name = \"n1\"\n"                     // 18
    "bandwidth_gbytes_per_s = 25.0\n"     // 19
    "latency_us = 1.0\n"                  // 20
    "gpus = [1]\n"                        // 21
    "\n"                                  // 22
    "[inter]\n"                           // 23
    "kind = \"fat-tree\"\n"               // 24
    "switch_latency_us = 0.2\n";          // 25

const std::string kMesh =
    "nodes = 1\n"                     // 1
    "gpus_per_node = 4\n"             // 2
    "[intra]\n"                       // 3
    "kind = \"nvlink-mesh\"\n"        // 4
    "latency_us = 0.7\n"              // 5
    "[[intra.links]]\n"               // 6
    "gpus = [0, 1]\n"                 // 7
    "bandwidth_gbytes_per_s = 50\n"   // 8
    "[[intra.links]]\n"               // 9
    "gpus = [1, 2]\n"                 // 10
    "bandwidth_gbytes_per_s = 25\n"   // 11
    "latency_us = 0.9\n"              // 12
    "[[intra.links]]\n"               // 13
    "gpus = [2, 3]\n"                 // 14
    "bandwidth_gbytes_per_s = 25\n";  // 15

const std::string kPcie =
    "nodes = 1\n"                            // 1
    "gpus_per_node = 4\n"                    // 2
    "[intra]\n"                              // 3
    "kind = \"pcie\"\n"                      // 4
    "gpu_bandwidth_gbytes_per_s = 24\n"      // 5
    "latency_us = 1.0\n"                     // 6
    "host_bandwidth_gbytes_per_s = 16\n"     // 7
    "host_latency_us = 0.5\n"                // 8
    "[[intra.switches]]\n"                   // 9
    "gpus = [0, 1]\n"                        // 10
    "uplink_bandwidth_gbytes_per_s = 24\n"   // 11
    "[[intra.switches]]\n"                   // 12
    "gpus = [2, 3]\n"                        // 13
    "uplink_bandwidth_gbytes_per_s = 12\n";  // 14

// ---- presets ----

TEST(TopologyPresets, ListsTheBuiltInNodeTypes) {
  std::vector<PresetInfo> p = presets();
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].name, "dgx-a100");
  EXPECT_EQ(p[1].name, "dgx-h100");
  EXPECT_EQ(p[2].name, "hgx-h200");
  for (const auto& info : p) {
    EXPECT_EQ(info.gpusPerNode, 8);
    EXPECT_EQ(info.nics, 8);
    EXPECT_FALSE(info.description.empty());
    Result<Topology> t = presetTopology(info.name);
    ASSERT_TRUE(t.ok()) << info.name;
    EXPECT_TRUE(t->validate().empty());
    EXPECT_EQ(t->nodes, 1);
    EXPECT_EQ(t->gpuType, info.gpuType);
    EXPECT_DOUBLE_EQ(t->nics[0].bandwidthGBps, info.nicBandwidthGBps);
  }
  EXPECT_DOUBLE_EQ(p[0].nicBandwidthGBps, 25.0);
  EXPECT_DOUBLE_EQ(p[1].nicBandwidthGBps, 50.0);
  EXPECT_DOUBLE_EQ(p[2].nicBandwidthGBps, 50.0);
}

TEST(TopologyPresets, DgxA100Numbers) {
  Result<Topology> r = presetTopology("dgx-a100");
  ASSERT_TRUE(r.ok());
  const Topology& t = *r;
  EXPECT_EQ(t.nRanks(), 8);
  EXPECT_EQ(t.intra.kind, IntraFabricKind::NvSwitch);
  EXPECT_DOUBLE_EQ(t.intra.gpuBandwidthGBps, 300.0);
  ASSERT_EQ(t.nics.size(), 8u);
  for (int g = 0; g < 8; ++g) {
    EXPECT_DOUBLE_EQ(t.nics[g].bandwidthGBps, 25.0);
    EXPECT_EQ(t.nics[g].gpus, std::vector<int>{g});
  }
  EXPECT_EQ(t.inter.kind, InterFabricKind::RailOptimized);
  EXPECT_DOUBLE_EQ(t.nodeEgressBandwidth(), 200.0);
}

TEST(TopologyPresets, H100AndH200Numbers) {
  for (const char* name : {"dgx-h100", "hgx-h200"}) {
    Result<Topology> r = presetTopology(name);
    ASSERT_TRUE(r.ok()) << name;
    EXPECT_DOUBLE_EQ(r->intra.gpuBandwidthGBps, 450.0) << name;
    EXPECT_DOUBLE_EQ(r->nics[3].bandwidthGBps, 50.0) << name;
    EXPECT_DOUBLE_EQ(r->nodeEgressBandwidth(), 400.0) << name;
  }
}

TEST(TopologyPresets, NodeCountSuffix) {
  struct Case {
    const char* name;
    int nodes;
  };
  for (Case c : {Case{"dgx-a100x1", 1}, Case{"dgx-a100x4", 4}, Case{"dgx-h100x16", 16}, Case{"hgx-h200x128", 128},
                 Case{"dgx-a100x4096", 4096}, Case{"dgx-a100x004", 4}}) {
    Result<Topology> r = presetTopology(c.name);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.error().str();
    EXPECT_EQ(r->nodes, c.nodes) << c.name;
    EXPECT_EQ(r->nRanks(), c.nodes * 8) << c.name;
    EXPECT_EQ(r->name, c.name);
  }
}

TEST(TopologyPresets, RejectsBadNames) {
  struct Case {
    const char* name;
    const char* fragment;
  };
  for (Case c : {Case{"dgx-a100x0", "out of range"}, Case{"dgx-a100x4097", "out of range"},
                 Case{"dgx-a100x99999999999999999999", "out of range"}, Case{"dgx-a100x", "bad node count"},
                 Case{"dgx-a100x-1", "bad node count"}, Case{"dgx-a100x4abc", "bad node count"},
                 Case{"dgx-a100x+4", "bad node count"}, Case{"dgx-a100x 4", "bad node count"},
                 Case{"dgx-b200", "unknown preset"}, Case{"", "unknown preset"}, Case{"DGX-A100", "unknown preset"},
                 Case{"dgx-a100-4", "unknown preset"}}) {
    Result<Topology> r = presetTopology(c.name);
    ASSERT_FALSE(r.ok()) << c.name;
    std::string s = r.error().str();
    EXPECT_NE(s.find(c.fragment), std::string::npos) << c.name << ": " << s;
  }
  std::string s = presetTopology("dgx-b200").error().str();
  EXPECT_NE(s.find("dgx-a100, dgx-h100, hgx-h200"), std::string::npos) << s;
  EXPECT_NE(s.find("x<N>"), std::string::npos) << s;
}

// ---- accessors ----

TEST(TopologyAccessors, RankNumberingIsNodeMajor) {
  Topology t = *presetTopology("dgx-a100x4");
  EXPECT_EQ(t.nRanks(), 32);
  for (int r = 0; r < t.nRanks(); ++r) {
    EXPECT_EQ(t.nodeOf(r), r / 8);
    EXPECT_EQ(t.localOf(r), r % 8);
    EXPECT_EQ(t.rankOf(t.nodeOf(r), t.localOf(r)), r);
  }
  EXPECT_EQ(t.rankOf(3, 7), 31);
  EXPECT_EQ(t.rankOf(1, 0), 8);
}

TEST(TopologyAccessors, NicsAndRails) {
  Topology t = *presetTopology("dgx-a100x2");
  EXPECT_EQ(t.nicsOf(5), std::vector<int>{5});
  EXPECT_EQ(t.railOf(5), 5);
  EXPECT_EQ(t.railOf(8), -1);
  EXPECT_TRUE(t.nicsOf(-1).empty());
  // A GPU with two NICs: the first listed is its rail.
  t.nics[2].gpus.push_back(5);
  EXPECT_EQ(t.nicsOf(5), (std::vector<int>{2, 5}));
  EXPECT_EQ(t.railOf(5), 2);
}

TEST(TopologyAccessors, NvSwitchBandwidthAndLatency) {
  Topology t = *presetTopology("dgx-h100");
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 7), 450.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(7, 0), 450.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(3, 3), 0.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 8), 0.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(-1, 0), 0.0);
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(0, 7), 0.6);
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(3, 3), 0.0);
}

TEST(TopologyAccessors, EgressAndInterLatency) {
  Topology t = *presetTopology("dgx-a100x2");
  EXPECT_DOUBLE_EQ(t.nodeEgressBandwidth(), 200.0);
  EXPECT_DOUBLE_EQ(t.interLatencyUs(3, 3), 1.0 + 0.2);      // same rail: one leaf switch
  EXPECT_DOUBLE_EQ(t.interLatencyUs(3, 4), 1.0 + 3 * 0.2);  // across rails: leaf, spine, leaf
  EXPECT_DOUBLE_EQ(t.interLatencyUs(0, 8), 0.0);
  t.inter.kind = InterFabricKind::FatTree;
  t.inter.oversubscription = 4;
  EXPECT_DOUBLE_EQ(t.nodeEgressBandwidth(), 50.0);
  EXPECT_DOUBLE_EQ(t.interLatencyUs(3, 3), 1.0 + 3 * 0.2);
}

TEST(TopologyValidate, ReportsEveryProblemWithItsPath) {
  Topology t = *presetTopology("dgx-a100x2");
  EXPECT_TRUE(t.validate().empty());
  t.nics[2].gpus = {9};
  t.nics[4].bandwidthGBps = 0;
  t.nics[5].latencyUs = -1;
  t.inter.oversubscription = 0.5;
  std::vector<TopologyIssue> issues = t.validate();
  std::vector<std::string> paths;
  for (const auto& i : issues) paths.push_back(i.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"nics[2].gpus[0]", "nics[4].bandwidth_gbytes_per_s", "nics[5].latency_us",
                                             "nics", "inter.oversubscription"}));
  EXPECT_NE(issues[0].str().find("GPU index 9 is out of range"), std::string::npos) << issues[0].str();
  EXPECT_NE(issues[3].str().find("GPU 2 is served by no NIC"), std::string::npos) << issues[3].str();
}

TEST(TopologyValidate, ShapeAndFabricRules) {
  Topology t = *presetTopology("dgx-a100");
  t.nodes = 0;
  ASSERT_FALSE(t.validate().empty());
  EXPECT_EQ(t.validate()[0].path, "nodes");
  t = *presetTopology("dgx-a100x2");
  t.nics.clear();
  ASSERT_EQ(t.validate().size(), 1u);
  EXPECT_EQ(t.validate()[0].path, "nics");
  t = *presetTopology("dgx-a100x2");
  t.inter.kind = InterFabricKind::None;
  ASSERT_EQ(t.validate().size(), 1u);
  EXPECT_EQ(t.validate()[0].path, "inter");
  // One node needs neither NICs nor an inter-node fabric.
  t.nodes = 1;
  t.nics.clear();
  t.inter = InterFabric{};
  EXPECT_TRUE(t.validate().empty());
  t.intra.links.push_back(NvLinkPair{0, 1, 25, 0});
  ASSERT_EQ(t.validate().size(), 1u);
  EXPECT_EQ(t.validate()[0].path, "intra.links");
  t = *presetTopology("dgx-a100");
  t.nodes = 4096;
  t.gpusPerNode = 1024;
  ASSERT_FALSE(t.validate().empty());
  EXPECT_NE(t.validate()[0].message.find("ranks"), std::string::npos);
}

// ---- JSON and text ----

TEST(TopologyOutput, JsonOfDgxA100x4) {
  nlohmann::json j = topologyToJson(*presetTopology("dgx-a100x4"));
  EXPECT_EQ(j["name"], "dgx-a100x4");
  EXPECT_EQ(j["nodes"], 4);
  EXPECT_EQ(j["gpus_per_node"], 8);
  EXPECT_EQ(j["n_ranks"], 32);
  EXPECT_EQ(j["gpu_type"], "A100-SXM4");
  EXPECT_EQ(j["intra"]["kind"], "nvswitch");
  EXPECT_DOUBLE_EQ(j["intra"]["gpu_bandwidth_gbytes_per_s"].get<double>(), 300.0);
  ASSERT_EQ(j["nics"].size(), 8u);
  for (const auto& n : j["nics"]) {
    EXPECT_DOUBLE_EQ(n["bandwidth_gbytes_per_s"].get<double>(), 25.0);
    EXPECT_TRUE(n.contains("latency_us"));
    EXPECT_EQ(n["gpus"].size(), 1u);
  }
  EXPECT_EQ(j["nics"][3]["name"], "mlx5_3");
  EXPECT_DOUBLE_EQ(j["node_egress_gbytes_per_s"].get<double>(), 200.0);
  EXPECT_EQ(j["inter"]["kind"], "rail-optimized");
  ASSERT_EQ(j["gpus"].size(), 32u);
  const auto& g = j["gpus"][13];
  EXPECT_EQ(g["rank"], 13);
  EXPECT_EQ(g["node"], 1);
  EXPECT_EQ(g["local"], 5);
  EXPECT_EQ(g["nic"], 5);
  EXPECT_EQ(g["nic_name"], "mlx5_5");
}

TEST(TopologyOutput, JsonOfSingleNodeWithoutNics) {
  Topology t = parseOk(kPcie);
  nlohmann::json j = topologyToJson(t);
  EXPECT_EQ(j["inter"]["kind"], "none");
  EXPECT_TRUE(j["nics"].empty());
  ASSERT_EQ(j["gpus"].size(), 4u);
  EXPECT_TRUE(j["gpus"][0]["nic"].is_null());
  EXPECT_EQ(j["intra"]["switches"].size(), 2u);
}

TEST(TopologyOutput, Describe) {
  std::string s = describeTopology(*presetTopology("dgx-a100x4"));
  EXPECT_NE(s.find("dgx-a100x4: 4 nodes x 8 A100-SXM4 = 32 GPUs"), std::string::npos) << s;
  EXPECT_NE(s.find("NVSwitch, 300 GB/s"), std::string::npos) << s;
  EXPECT_NE(s.find("NICs per node: 8 (200 GB/s node egress)"), std::string::npos) << s;
  EXPECT_NE(s.find("mlx5_7"), std::string::npos) << s;
  EXPECT_NE(s.find("rail-optimized"), std::string::npos) << s;
  EXPECT_NE(describeTopology(parseOk(kMesh)).find("GPU 1 <-> GPU 2"), std::string::npos);
  EXPECT_NE(describeTopology(parseOk(kPcie)).find("switch 1: GPUs 2,3"), std::string::npos);
}

// ---- TOML: each fabric kind ----

TEST(TopologyToml, NvSwitchWithLineRatesAndDefaults) {
  Topology t = parseOk(kBase);
  EXPECT_EQ(t.name, "t");
  EXPECT_EQ(t.nodes, 2);
  EXPECT_EQ(t.gpusPerNode, 2);
  EXPECT_EQ(t.gpuType, "X");
  EXPECT_DOUBLE_EQ(t.intra.gpuBandwidthGBps, 100.0);  // an integer is fine where a float is expected
  EXPECT_DOUBLE_EQ(t.nics[0].bandwidthGBps, 25.0);    // gbps = 200
  EXPECT_DOUBLE_EQ(t.nics[1].bandwidthGBps, 25.0);
  EXPECT_EQ(t.inter.kind, InterFabricKind::FatTree);
  EXPECT_DOUBLE_EQ(t.inter.oversubscription, 1.0);
  // name and gpu_type are optional: the file stem and "GPU".
  Topology u = parseOk(edit(kBase, {{1, ""}, {4, ""}}), "/some/dir/my-cluster.toml");
  EXPECT_EQ(u.name, "my-cluster");
  EXPECT_EQ(u.gpuType, "GPU");
  EXPECT_EQ(parseOk(edit(kBase, {{1, ""}}), "<stdin>").name, "custom");
}

TEST(TopologyToml, NvLinkMesh) {
  Topology t = parseOk(kMesh);
  EXPECT_EQ(t.intra.kind, IntraFabricKind::NvLinkMesh);
  ASSERT_EQ(t.intra.links.size(), 3u);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 1), 50.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(1, 0), 50.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(2, 1), 25.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 3), 0.0);  // no direct link
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(0, 1), 0.7);  // the mesh default
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(1, 2), 0.9);  // its own
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(0, 3), 0.0);
  EXPECT_EQ(t.inter.kind, InterFabricKind::None);
  expectRoundTrip(t);
}

TEST(TopologyToml, PcieSwitches) {
  Topology t = parseOk(kPcie);
  EXPECT_EQ(t.intra.kind, IntraFabricKind::Pcie);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 1), 24.0);  // same switch
  EXPECT_DOUBLE_EQ(t.intraBandwidth(2, 3), 24.0);
  EXPECT_DOUBLE_EQ(t.intraBandwidth(0, 2), 12.0);  // through the CPU: min(24, 24, 12, 16)
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(t.intraLatencyUs(1, 3), 1.5);
  // One switch needs no host path.
  Topology one = parseOk(edit(kPcie, {{7, ""}, {8, ""}, {10, "gpus = [0, 1, 2, 3]"}, {12, ""}, {13, ""}, {14, ""}}));
  EXPECT_DOUBLE_EQ(one.intra.hostBandwidthGBps, 0.0);
  EXPECT_DOUBLE_EQ(one.intraBandwidth(0, 3), 24.0);
  expectRoundTrip(t);
  expectRoundTrip(one);
}

TEST(TopologyToml, InlineTablesAreAccepted) {
  Topology t = parseOk(
      "nodes = 2\ngpus_per_node = 2\n"
      "intra = { kind = \"nvswitch\", gpu_bandwidth_gbytes_per_s = 1.5, latency_us = 0 }\n"
      "nics = [ { name = \"a\", gbps = 100, latency_us = 2, gpus = [0, 1] } ]\n"
      "inter = { kind = \"rail-optimized\", oversubscription = 3, switch_latency_us = 0.1 }\n");
  EXPECT_DOUBLE_EQ(t.nics[0].bandwidthGBps, 12.5);
  EXPECT_DOUBLE_EQ(t.nodeEgressBandwidth(), 12.5 / 3);
  expectRoundTrip(t);
}

TEST(TopologyToml, RoundTripPresetsAndOddValues) {
  for (const auto& p : presets()) expectRoundTrip(*presetTopology(p.name));
  expectRoundTrip(*presetTopology("hgx-h200x1024"));
  Topology t = *presetTopology("dgx-a100x3");
  t.name = "quote \" backslash \\ tab \t newline \n bell \x07 unicode \xc3\xa9";
  t.gpuType = "A100 \"80GB\"";
  t.nics[0].bandwidthGBps = 0.1 + 0.2;  // not representable in short decimal form
  t.nics[1].latencyUs = 1e-300;
  t.nics[2].bandwidthGBps = 123456.789012345;
  t.inter.oversubscription = 1.0000000000000002;
  t.intra.latencyUs = 0;
  ASSERT_TRUE(t.validate().empty());
  expectRoundTrip(t);
}

TEST(TopologyToml, ExampleFilesLoad) {
  std::filesystem::path dir = std::filesystem::path(OPTIFLOW_SOURCE_DIR) / "examples" / "topologies";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    Result<Topology> r = loadTopologyFile(e.path().string());
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->name, e.path().stem().string());
    expectRoundTrip(*r);
    ++n;
  }
  EXPECT_GE(n, 3);

  Topology a100 = *loadTopologyFile((dir / "dgx-a100x2.toml").string());
  EXPECT_EQ(a100, *presetTopology("dgx-a100x2"));  // the hand-written file is the preset

  Topology v100 = *loadTopologyFile((dir / "dgx1-v100x2.toml").string());
  EXPECT_EQ(v100.intra.kind, IntraFabricKind::NvLinkMesh);
  EXPECT_EQ(v100.intra.links.size(), 16u);
  for (int g = 0; g < 8; ++g) {
    double sum = 0;
    for (int h = 0; h < 8; ++h) sum += v100.intraBandwidth(g, h);
    EXPECT_DOUBLE_EQ(sum, 150.0) << "GPU " << g << ": 6 NVLink2 links x 25 GB/s";
  }
  EXPECT_EQ(v100.railOf(3), 1);
  EXPECT_DOUBLE_EQ(v100.nodeEgressBandwidth(), 50.0);

  Topology pcie = *loadTopologyFile((dir / "pcie-8gpu-x4.toml").string());
  EXPECT_EQ(pcie.nRanks(), 32);
  EXPECT_DOUBLE_EQ(pcie.intraBandwidth(1, 6), 16.0);
  EXPECT_DOUBLE_EQ(pcie.nodeEgressBandwidth(), 12.5);
}

// ---- TOML: errors (file, line, column, key path, what was expected) ----

TEST(TopologyTomlErrors, SyntaxErrorsAreDiagnostics) {
  expectError(edit(kBase, {{8, "gpu_bandwidth_gbytes_per_s = = 3"}}), 8, {"invalid TOML"});
  expectError(edit(kBase, {{9, "gpu_bandwidth_gbytes_per_s = 3"}}), 9, {"invalid TOML"});  // duplicate key
  expectError(edit(kBase, {{12, "name = \"unterminated"}}), 12, {"invalid TOML"});
  Result<Topology> r = parseTopologyToml(std::string("\0\xff\xfe[[", 5), "bad.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "bad.toml");
}

TEST(TopologyTomlErrors, UnknownKeys) {
  expectError(edit(kBase, {{2, "nodez = 2"}}), 2, {"nodez: unknown key", "expected one of", "nodes"});
  expectError(edit(kBase, {{19, "bandwith_gbytes_per_s = 25.0"}}), 19,
              {"nics[1].bandwith_gbytes_per_s: unknown key", "bandwidth_gbytes_per_s"});
  expectError(edit(kBase, {{8, "links = []"}}), 8, {"intra.links: unknown key for kind = \"nvswitch\""});
  expectError(edit(kBase, {{25, "switch_latency_us = 0.2\nhops = 3"}}), 26, {"inter.hops: unknown key"});
  expectError(edit(kMesh, {{12, "latency = 0.9"}}), 12, {"intra.links[1].latency: unknown key"});
  expectError(edit(kPcie, {{14, "uplink_gbps = 12"}}), 14, {"intra.switches[1].uplink_gbps: unknown key"});
}

TEST(TopologyTomlErrors, WrongTypes) {
  expectError(edit(kBase, {{2, "nodes = \"4\""}}), 2, {"nodes: expected an integer, got a string"});
  expectError(edit(kBase, {{2, "nodes = 2.0"}}), 2, {"nodes: expected an integer, got a float"});
  expectError(edit(kBase, {{1, "name = 7"}}), 1, {"name: expected a string, got an integer"});
  expectError(edit(kBase, {{21, "gpus = [0, \"1\"]"}}), 21,
              {"nics[1].gpus[1]: expected local GPU indices, got a string"});
  expectError(edit(kBase, {{15, "gpus = 0"}}), 15, {"nics[0].gpus: expected an array of local GPU indices"});
  expectError(edit(kBase, {{20, "latency_us = true"}}), 20,
              {"nics[1].latency_us: expected a latency in us", "boolean"});
  expectError(edit(kBase, {{6, "intra = 5"}, {7, ""}, {8, ""}, {9, ""}}), 6,
              {"intra: expected a table, got an integer"});
  expectError(edit(kBase, {{2, "nodes = 2\nnics = 5"},
                           {11, ""},
                           {12, ""},
                           {13, ""},
                           {14, ""},
                           {15, ""},
                           {17, ""},
                           {18, ""},
                           {19, ""},
                           {20, ""},
                           {21, ""}}),
              3, {"nics: expected an array of tables, got an integer"});
  expectError(edit(kBase, {{8, "gpu_bandwidth_gbytes_per_s = 1979-05-27"}}), 8,
              {"intra.gpu_bandwidth_gbytes_per_s: expected a bandwidth in GB/s (a number), got a date"});
  expectError(edit(kMesh, {{7, "gpus = [0, 1, 2]"}}), 7, {"intra.links[0].gpus: expected exactly two GPU indices"});
  expectError(edit(kBase, {{7, "kind = \"nvlinkswitch\""}}), 7,
              {"intra.kind: unknown intra-node fabric \"nvlinkswitch\"", "\"nvswitch\", \"nvlink-mesh\" or \"pcie\""});
  expectError(edit(kBase, {{24, "kind = \"none\""}}), 24, {"inter.kind: unknown inter-node fabric \"none\""});
  expectError(edit(kBase, {{1, "name = \"t\"\nversion = 2"}}), 2, {"version", "unsupported format version 2"});
}

TEST(TopologyTomlErrors, MissingKeys) {
  expectError(edit(kBase, {{2, ""}}), 0, {"nodes: missing required key", "integer"});
  expectError("", 0, {"nodes: missing required key"});
  expectError(edit(kBase, {{6, ""}, {7, ""}, {8, ""}, {9, ""}}), 0, {"intra: missing required key"});
  expectError(edit(kBase, {{9, ""}}), 6, {"intra.latency_us: missing required key", "latency in us"});
  expectError(edit(kBase, {{7, ""}}), 6, {"intra.kind: missing required key"});
  expectError(edit(kBase, {{14, ""}}), 11, {"nics[0].latency_us: missing required key"});
  expectError(edit(kBase, {{13, ""}}), 11, {"nics[0]: missing bandwidth", "gbps", "bandwidth_gbytes_per_s"});
  expectError(edit(kBase, {{25, ""}}), 23, {"inter.switch_latency_us: missing required key"});
  expectError(edit(kMesh, {{10, ""}}), 9, {"intra.links[1].gpus: missing required key"});
  expectError(edit(kPcie, {{6, ""}}), 3, {"intra.latency_us: missing required key"});
}

TEST(TopologyTomlErrors, OutOfRangeValues) {
  expectError(edit(kBase, {{2, "nodes = 0"}}), 2, {"nodes: expected 1..4096 nodes, got 0"});
  expectError(edit(kBase, {{2, "nodes = 70000"}}), 2, {"nodes: expected 1..4096 nodes"});
  expectError(edit(kBase, {{2, "nodes = 99999999999"}}), 2, {"nodes: 99999999999 is out of range"});
  expectError(edit(kBase, {{3, "gpus_per_node = 2000"}}), 3, {"gpus_per_node: expected 1..1024"});
  expectError(edit(kBase, {{21, "gpus = [5]"}}), 21, {"nics[1].gpus[0]: GPU index 5 is out of range", "0..1"});
  expectError(edit(kBase, {{21, "gpus = [1, -1]"}}), 21, {"nics[1].gpus[1]: GPU index -1 is out of range"});
  expectError(edit(kBase, {{15, "gpus = [0, 0]"}}), 15, {"nics[0].gpus[1]: GPU 0 is listed twice"});
  expectError(edit(kBase, {{15, "gpus = []"}}), 15, {"nics[0].gpus: a NIC must serve at least one local GPU"});
  expectError(edit(kBase, {{19, "bandwidth_gbytes_per_s = 0"}}), 19,
              {"nics[1].bandwidth_gbytes_per_s: expected a bandwidth in GB/s, >= 0.001", "got 0"});
  expectError(edit(kBase, {{8, "gpu_bandwidth_gbytes_per_s = -300"}}), 8,
              {"intra.gpu_bandwidth_gbytes_per_s", ">= 0.001"});
  // Positive but absurdly small: would round to zero in the bounds and overflow reports.
  expectError(edit(kBase, {{8, "gpu_bandwidth_gbytes_per_s = 1e-300"}}), 8,
              {"intra.gpu_bandwidth_gbytes_per_s", ">= 0.001", "got 1e-300"});
  expectError(edit(kBase, {{8, "gpu_bandwidth_gbytes_per_s = inf"}}), 8, {"intra.gpu_bandwidth_gbytes_per_s", "inf"});
  expectError(edit(kBase, {{13, "gbps = -100"}}), 13, {"nics[0].gbps: expected a line rate in Gb/s > 0"});
  expectError(edit(kBase, {{13, "gbps = 200\nbandwidth_gbytes_per_s = 25.0"}}), 14,
              {"nics[0].bandwidth_gbytes_per_s: give either gbps or bandwidth_gbytes_per_s"});
  expectError(edit(kBase, {{20, "latency_us = -1"}}), 20, {"nics[1].latency_us: expected a latency in us, >= 0"});
  expectError(edit(kBase, {{14, "latency_us = nan"}}), 14, {"nics[0].latency_us", "nan"});
  expectError(edit(kBase, {{18, "name = \"n0\""}}), 18, {"nics[1].name: NIC name \"n0\" is used twice"});
  expectError(edit(kBase, {{12, "name = \"\""}}), 12, {"nics[0].name: expected a non-empty NIC name"});
  expectError(edit(kBase, {{25, "switch_latency_us = 0.2\noversubscription = 0.5"}}), 26,
              {"inter.oversubscription: expected a ratio >= 1", "got 0.5"});
  expectError(edit(kBase, {{25, "switch_latency_us = -0.2"}}), 25, {"inter.switch_latency_us"});
}

TEST(TopologyTomlErrors, MultiNodeNeedsNicsAndFabric) {
  Result<Topology> r = parseTopologyToml(edit(kBase, {{21, "gpus = [0]"}}), "bad.toml");
  ASSERT_FALSE(r.ok());
  // The issue concerns the whole nics array, which starts at the first [[nics]].
  EXPECT_EQ(r.error().line, 11) << r.error().str();
  EXPECT_NE(r.error().str().find("nics: GPU 1 is served by no NIC"), std::string::npos) << r.error().str();
  expectError(edit(kBase, {{23, ""}, {24, ""}, {25, ""}}), 0, {"inter: an inter-node fabric is required"});
  std::string noNics =
      edit(kBase, {{11, ""}, {12, ""}, {13, ""}, {14, ""}, {15, ""}, {17, ""}, {18, ""}, {19, ""}, {20, ""}, {21, ""}});
  expectError(noNics, 0, {"nics: a topology of 2 nodes needs at least one NIC"});
  // ...but one node needs neither.
  Topology t = parseOk(edit(noNics, {{2, "nodes = 1"}, {23, ""}, {24, ""}, {25, ""}}));
  EXPECT_TRUE(t.nics.empty());
  expectRoundTrip(t);
}

TEST(TopologyTomlErrors, MeshRules) {
  expectError(edit(kMesh, {{14, "gpus = [2, 2]"}}), 14, {"intra.links[2].gpus: a link needs two different GPUs"});
  expectError(edit(kMesh, {{14, "gpus = [1, 0]"}}), 14, {"intra.links[2].gpus: GPUs 1 and 0 are linked twice"});
  expectError(edit(kMesh, {{7, "gpus = [0, 4]"}}), 7, {"intra.links[0].gpus[1]: GPU index 4 is out of range"});
  expectError(edit(kMesh, {{15, "bandwidth_gbytes_per_s = -25"}}), 15, {"intra.links[2].bandwidth_gbytes_per_s"});
  expectError(edit(kMesh, {{12, "latency_us = -0.9"}}), 12, {"intra.links[1].latency_us"});
  // Links 0-1, 1-2, 0-2 leave GPU 3 alone; the issue points at the links array (its first element).
  expectError(edit(kMesh, {{14, "gpus = [0, 2]"}}), 6, {"intra.links: GPU 3 cannot reach GPU 0"});
  expectError(edit(kMesh, {{5, "latency_us = 0.7\ngpu_bandwidth_gbytes_per_s = 3"}}), 6,
              {"intra.gpu_bandwidth_gbytes_per_s: unknown key for kind = \"nvlink-mesh\""});
}

TEST(TopologyTomlErrors, PcieRules) {
  expectError(edit(kPcie, {{13, "gpus = [1, 2, 3]"}}), 13,
              {"intra.switches[1].gpus[0]: GPU 1 is already under intra.switches[0]"});
  expectError(edit(kPcie, {{13, "gpus = [2]"}}), 9, {"intra.switches: GPU 3 is under no switch"});
  expectError(edit(kPcie, {{14, "uplink_bandwidth_gbytes_per_s = 0"}}), 14,
              {"intra.switches[1].uplink_bandwidth_gbytes_per_s: expected a bandwidth"});
  // Two switches need the path between them; the key is absent, so the issue points at [intra].
  expectError(edit(kPcie, {{7, ""}}), 3, {"intra.host_bandwidth_gbytes_per_s: expected a bandwidth", "got 0"});
  expectError(edit(kPcie, {{13, "gpus = []"}}), 13, {"intra.switches[1].gpus: a switch needs at least one GPU"});
}

TEST(TopologyTomlErrors, ReportsHowManyMoreProblems) {
  Result<Topology> r = parseTopologyToml(edit(kBase, {{15, "gpus = [7]"}, {21, "gpus = [8]"}}), "bad.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().line, 15);
  EXPECT_NE(r.error().message.find("and 2 more problems"), std::string::npos) << r.error().str();
}

// ---- files and the preset-or-file entry point ----

TEST(TopologyLoad, UnreadableFiles) {
  Result<Topology> r = loadTopologyFile("/nonexistent/dir/topo.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "/nonexistent/dir/topo.toml");
  EXPECT_NE(r.error().message.find("cannot read topology file"), std::string::npos) << r.error().str();
  Result<Topology> d = loadTopologyFile(OPTIFLOW_SOURCE_DIR);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("directory"), std::string::npos) << d.error().str();
}

TEST(TopologyLoad, PresetOrPath) {
  Result<Topology> p = loadTopology("dgx-h100x2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->nRanks(), 16);

  std::string file = std::string(OPTIFLOW_SOURCE_DIR) + "/examples/topologies/dgx1-v100x2.toml";
  Result<Topology> f = loadTopology(file);
  ASSERT_TRUE(f.ok()) << f.error().str();
  EXPECT_EQ(f->name, "dgx1-v100x2");

  Result<Topology> neither = loadTopology("no-such-thing");
  ASSERT_FALSE(neither.ok());
  std::string s = neither.error().str();
  EXPECT_NE(s.find("no-such-thing"), std::string::npos) << s;
  EXPECT_NE(s.find("preset"), std::string::npos) << s;
  EXPECT_NE(s.find("dgx-a100"), std::string::npos) << s;
  EXPECT_NE(s.find("file"), std::string::npos) << s;

  Result<Topology> badCount = loadTopology("dgx-a100x0");
  ASSERT_FALSE(badCount.ok());
  EXPECT_NE(badCount.error().str().find("out of range"), std::string::npos) << badCount.error().str();

  // A file's own diagnostics come through unchanged.
  std::filesystem::path tmp = std::filesystem::temp_directory_path() / "optiflow_topology_test_bad.toml";
  {
    std::ofstream out(tmp);
    out << edit(kBase, {{21, "gpus = [5]"}});
  }
  Result<Topology> bad = loadTopology(tmp.string());
  std::filesystem::remove(tmp);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().file, tmp.string());
  EXPECT_EQ(bad.error().line, 21);
}

}  // namespace
}  // namespace optiflow::core
