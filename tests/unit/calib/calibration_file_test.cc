// CAL.toml: what the writer writes the reader reads back exactly, and every wrong file is a diagnostic with its line.
#include <gtest/gtest.h>

#include <fstream>

#include "optiflow/calib/calibration_file.h"
#include "optiflow/core/topology.h"
#include "temp_dir.h"

namespace optiflow::calib {
namespace {

Calibration sample() {
  Calibration c;
  c.writtenBy = "optiflow test";
  c.gpu = "A100-SXM4";
  c.gpusPerNode = 8;
  c.nicsPerNode = 4;
  c.nicGBps = 25.0;
  c.fittedOn = "abci-a100x4";
  c.believe = "simulator";
  c.sources.push_back({"logs/x4 \"quoted\".log", "allreduce", 32, 4, 24, 1, "host", 20804});
  c.simulator.params.launchHostUs = 23.485909214468947;
  c.simulator.params.latencyScale = {1.0, 0.7011595490730945, 0.1 + 0.2};
  c.simulator.params.netHopLatencyScale = 0.848;
  c.simulator.params.nvlinkBandwidthScale = 1.04;
  c.simulator.params.netBandwidthScale = 0.738;
  c.simulator.fitted = {"launch_host_us", "latency_scale.LL", "net_bandwidth_scale"};
  c.simulator.medianErrorPctBefore = 23.6;
  c.simulator.medianErrorPct = 8.0;
  c.simulator.maxErrorPct = 39.7;
  c.ncclModel.params.launchGraphUs = 4.5;
  c.ncclModel.params.netBandwidthScale = 0.52;
  c.ncclModel.fitted = {"launch_graph_us", "net_bandwidth_scale"};
  c.residuals.push_back({"x4.log", 51, "allreduce", 4, "Tree/LL/1", 42.34, 61.8, 50.94, 63.2, 47.86});
  c.residuals.push_back({"x4.log", 74, "allreduce", 33554432, "Ring/LL128/8", 2075.4, 1554.7, 2035.77, -1, -1});
  return c;
}

std::string validText() { return formatCalibration(sample()); }

// The text with the first occurrence of `from` replaced by `to`.
std::string edited(std::string_view from, std::string_view to) {
  std::string t = validText();
  const auto at = t.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) t.replace(at, from.size(), to);
  return t;
}

TEST(CalibrationFile, RoundTripsExactly) {
  const Calibration c = sample();
  auto back = parseCalibration(formatCalibration(c), "cal.toml");
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->file, "cal.toml");
  EXPECT_EQ(back->writtenBy, c.writtenBy);
  EXPECT_EQ(back->gpu, c.gpu);
  EXPECT_EQ(back->gpusPerNode, 8);
  EXPECT_EQ(back->nicsPerNode, 4);
  EXPECT_EQ(back->nicGBps, 25.0);
  EXPECT_EQ(back->fittedOn, c.fittedOn);
  EXPECT_EQ(back->believe, "simulator");
  ASSERT_EQ(back->sources.size(), 1u);
  EXPECT_EQ(back->sources[0].file, c.sources[0].file);
  EXPECT_EQ(back->sources[0].ranks, 32);
  EXPECT_EQ(back->sources[0].nodes, 4);
  EXPECT_EQ(back->sources[0].rows, 24);
  EXPECT_EQ(back->sources[0].incompleteRows, 1);
  EXPECT_EQ(back->sources[0].launch, "host");
  EXPECT_EQ(back->sources[0].ncclVersion, 20804);
  // Bit-exact: the file is the calibration, not a rounded copy.
  EXPECT_EQ(back->simulator.params, c.simulator.params);
  EXPECT_EQ(back->ncclModel.params, c.ncclModel.params);
  EXPECT_FALSE(back->simulator.params.launchGraphUs.has_value());
  EXPECT_FALSE(back->ncclModel.params.launchHostUs.has_value());
  EXPECT_EQ(back->simulator.fitted, c.simulator.fitted);
  EXPECT_EQ(back->simulator.medianErrorPct, 8.0);
  EXPECT_EQ(back->simulator.maxErrorPct, 39.7);
  ASSERT_EQ(back->residuals.size(), 2u);
  EXPECT_EQ(back->residuals[1].sizeBytes, 33554432u);
  EXPECT_EQ(back->residuals[1].choice, "Ring/LL128/8");
  EXPECT_EQ(back->residuals[1].ncclModelUs, -1);
  EXPECT_EQ(back->residuals[0].line, 51);
  // And the text is stable: writing what was read gives the same file.
  Calibration again = *back;
  again.file.clear();
  EXPECT_EQ(formatCalibration(again), formatCalibration(c));
}

TEST(CalibrationFile, IdentityWhenModelTablesAreAbsent) {
  const std::string text =
      "format = \"optiflow-calibration\"\nversion = 1\n[node]\ngpu = \"H100-SXM5\"\ngpus_per_node = 8\n"
      "nics_per_node = 8\nnic_gbps = 50\n";
  auto c = parseCalibration(text, "min.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_TRUE(c->simulator.params.identity());
  EXPECT_TRUE(c->ncclModel.params.identity());
  EXPECT_TRUE(c->residuals.empty());
}

struct BadCase {
  std::string from;
  std::string to;
  int line;  // 0: any
  std::string expect;
};

TEST(CalibrationFile, EveryMistakeIsADiagnosticWithItsLine) {
  const std::vector<BadCase> cases = {
      {"format = \"optiflow-calibration\"", "format = \"optiflow-topology\"", 3, "not a calibration file"},
      {"version = 1", "version = 2", 4, "calibration version 1"},
      {"version = 1", "version = \"1\"", 4, "integer"},
      {"net_hop_latency_scale = 0.848", "net_hop_latency_scale = 0.0", 0, "[simulator] net_hop_latency_scale"},
      {"net_hop_latency_scale = 0.848", "net_hop_latency_scale = 51", 0, "0.02..50"},
      {"net_hop_latency_scale = 0.848", "net_hop_scale = 0.8", 0, "unknown key"},
      {"launch_host_us = 23.485909214468947", "launch_host_us = -1", 0, "launch_host_us"},
      {"latency_scale = { Simple = 1.0,", "latency_scale = { Simpel = 1.0,", 0,
       "[simulator.latency_scale] Simpel: unknown key"},
      {"gpus_per_node = 8", "gpus_per_node = 0", 0, "[node] gpus_per_node"},
      {"[node]", "[nodes]", 0, "node: missing"},
      {"believe = \"simulator\"", "believe = \"oracle\"", 0, "simulator\" or \"nccl-model"},
      {"fitted = [\"launch_host_us\"", "fitted = [\"launch_us\"", 0, "[simulator] fitted[0]"},
      {"size_bytes = 4\n", "size_bytes = \"4\"\n", 0, "[residual #1] size_bytes"},
      {"ranks = 32", "ranks = [32", 0, ""},  // not TOML: toml++'s message, with the line
  };
  const std::string good = validText();
  for (const auto& c : cases) {
    const std::string text = edited(c.from, c.to);
    auto r = parseCalibration(text, "bad.toml");
    ASSERT_FALSE(r.ok()) << c.to;
    EXPECT_EQ(r.error().file, "bad.toml");
    EXPECT_GT(r.error().line, 0) << c.to << ": " << r.error().str();
    if (c.line) {
      EXPECT_EQ(r.error().line, c.line) << r.error().str();
    }
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << c.to << " -> " << r.error().str();
  }
}

TEST(CalibrationFile, GarbageNeverCrashes) {
  for (std::string_view text : {"", "\x01\x02\xff\xfe", "[[[", "format = 1", "= = =", "version = 1\n[node]\n"}) {
    auto r = parseCalibration(text, "junk.toml");
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, "junk.toml");
    EXPECT_FALSE(r.error().message.empty());
  }
}

TEST(CalibrationFile, AppliesToAnyNodeCountOfTheSameKind) {
  Calibration c = sample();
  c.gpu = "A100-SXM4";
  c.gpusPerNode = 8;
  c.nicsPerNode = 8;
  c.nicGBps = 25.0;  // dgx-a100: 8 HDR rails of 25 GB/s
  for (const char* name : {"dgx-a100x1", "dgx-a100x4", "dgx-a100x64"}) {
    auto t = core::presetTopology(name);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(appliesTo(c, *t), "") << name;
  }
  auto h100 = core::presetTopology("dgx-h100x4");
  ASSERT_TRUE(h100.ok());
  const std::string why = appliesTo(c, *h100);
  EXPECT_NE(why.find("A100-SXM4 x8 GPUs, 8 NICs of 25.0 GB/s"), std::string::npos) << why;
  EXPECT_NE(why.find("H100-SXM5 x8 GPUs, 8 NICs of 50.0 GB/s"), std::string::npos) << why;
  c.nicsPerNode = 4;
  auto a100 = core::presetTopology("dgx-a100x4");
  EXPECT_NE(appliesTo(c, *a100).find("4 NICs"), std::string::npos);
}

TEST(CalibrationFile, LoadChecksTheTopologyAndNamesTheFile) {
  optiflow::testsupport::TempDir dir("calfile");
  const auto path = dir.path() / "cal.toml";
  Calibration c = sample();
  c.nicsPerNode = 8;
  dir.write("cal.toml", formatCalibration(c));
  auto a100 = core::presetTopology("dgx-a100x2");
  auto h100 = core::presetTopology("dgx-h100x2");
  ASSERT_TRUE(a100.ok() && h100.ok());
  auto ok = loadCalibrationFor(path, *a100);
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(ok->file, path.string());
  auto wrong = loadCalibrationFor(path, *h100);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().file, path.string());
  EXPECT_NE(wrong.error().message.find("dgx-h100x2"), std::string::npos);
  auto missing = loadCalibrationFor(dir.path() / "none.toml", *a100);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().str().find("none.toml"), std::string::npos);
  auto directory = readCalibrationFile(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.error().message.find("directory"), std::string::npos);
}

}  // namespace
}  // namespace optiflow::calib
