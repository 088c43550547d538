// `optiflow calibrate` and --calibration as a user runs them: a pasted nccl-tests log in, CAL.toml out, and the
// file used by the other commands; every wrong input an exit code 2 with a message naming the file.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using optiflow::testsupport::slurp;
using CliResult = optiflow::testsupport::CommandResult;

// An all_reduce_perf log of `nodes` x 8 GPUs as mpirun prints it with --tag-output: every line prefixed, NCCL INFO
// lines in between, the last row cut off. The times follow a latency-bandwidth line, 30 us + size / 12 GB/s.
std::string pastedLog(int nodes) {
  std::string log;
  int rank = 0;
  auto put = [&](const std::string& line) { log += fmt::format("[1,{}]<stdout>:{}\n", rank % 8, line); };
  put("# nThread 1 nGpus 1 minBytes 1024 maxBytes 268435456 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 "
      "validation: 1 graph: 0");
  put("#");
  put("# Using devices");
  for (rank = 0; rank < 8 * nodes; ++rank) {
    put(
        fmt::format("#  Rank {:2} Group  0 Pid {:6} on    node-{:03} device {:2} [0000:{:02x}:00] NVIDIA "
                    "A100-SXM4-80GB",
                    rank, 5000 + rank, rank / 8, rank % 8, 16 * (rank % 8)));
    if (rank % 8 == 0)
      put(fmt::format("node-{:03}:{}:{} [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB", rank / 8, 5000 + rank,
                      5100 + rank));
  }
  rank = 0;
  put("#");
  put("#                                                              out-of-place                       in-place   "
      "       ");
  put("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
      "#wrong");
  put("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
      "(GB/s)       ");
  const int n = 8 * nodes;
  for (std::uint64_t s = 1024; s <= (256u << 20); s *= 4) {
    const double t = 30.0 + static_cast<double>(s) / 12e3;
    const double algbw = static_cast<double>(s) / t / 1e3;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    put(fmt::format("{:>12} {:>13} {:>9} {:>7} {:>7} {:8.2f} {:7.2f} {:7.2f} {:6} {:8.2f} {:7.2f} {:7.2f} {:6}", s,
                    s / 4, "float", "sum", -1, t, algbw, busbw, 0, t, algbw, busbw, 0));
    if (s == 65536) put("node-000:5000:5150 [0] NCCL INFO Connected all trees");
  }
  put("   1073741824     268435456     float     sum      -1  89");  // the job was killed here
  return log;
}

class CalibrateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("optiflow-calibrate-e2e-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult run(const std::string& args) {
    return optiflow::testsupport::runCommand(fmt::format("{} {}", OPTIFLOW_CLI, args), dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(CalibrateCli, FitsAPastedLogWritesCalTomlAndOtherCommandsUseIt) {
  const std::string log = write("x2.log", pastedLog(2));
  const std::string cal = path("cal.toml");
  auto fit = run(fmt::format("calibrate {} --topo dgx-a100x2 -o {}", log, cal));
  ASSERT_EQ(fit.rc, 0) << fit.err;
  EXPECT_NE(fit.out.find("against 10 row(s) of 1 log(s); 1 row(s) cut off"), std::string::npos) << fit.out;
  EXPECT_NE(fit.out.find("median error"), std::string::npos);
  EXPECT_NE(fit.out.find("bound_us"), std::string::npos);  // every report shows the lower bound
  EXPECT_NE(fit.out.find("wrote " + cal), std::string::npos);
  const std::string text = slurp(cal);
  EXPECT_NE(text.find("format = \"optiflow-calibration\""), std::string::npos);
  EXPECT_NE(text.find("file = \"" + log + "\""), std::string::npos);  // it names its source
  EXPECT_NE(text.find("incomplete_rows = 1"), std::string::npos);
  EXPECT_NE(text.find("[[residual]]"), std::string::npos);

  // Checked against the same log: the calibrated models are closer than the uncalibrated ones.
  auto check = run(fmt::format("calibrate {} --topo dgx-a100x2 --calibration {} --json", log, cal));
  ASSERT_EQ(check.rc, 0) << check.err;
  const auto j = nlohmann::json::parse(check.out);
  EXPECT_FALSE(j.at("fitted").get<bool>());
  ASSERT_EQ(j.at("rows").size(), 10u);
  for (const char* model : {"simulator", "nccl_model"}) {
    EXPECT_LT(j.at(model).at("median_error_pct").get<double>(), j.at(model).at("median_error_pct_before").get<double>())
        << model;
  }
  for (const auto& row : j.at("rows")) {
    EXPECT_GE(row.at("measured_us").get<double>(), 30.0);
    EXPECT_GT(row.at("bound_us").get<double>(), 0.0);
    if (row.at("simulator_us").get<double>() >= 0) {
      EXPECT_GE(row.at("simulator_us").get<double>(), row.at("bound_us").get<double>() * (1 - 1e-9));
    }
  }
  EXPECT_FALSE(j.at("sources").at(0).at("incomplete_rows").get<int>() == 0);

  // A calibration is per kind of node: the same file applies at eight nodes, and changes NCCL's time there.
  auto plain = run("baseline --topo dgx-a100x8 --coll allreduce --sizes 64MiB --launch host --json");
  auto calibrated =
      run(fmt::format("baseline --topo dgx-a100x8 --coll allreduce --sizes 64MiB --launch host --simulate "
                      "--calibration {} --json",
                      cal));
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_EQ(calibrated.rc, 0) << calibrated.err;
  const double before = nlohmann::json::parse(plain.out).at("rows").at(0).at("time_us").get<double>();
  const auto row = nlohmann::json::parse(calibrated.out).at("rows").at(0);
  EXPECT_NE(row.at("time_us").get<double>(), before);
  EXPECT_GT(row.at("simulated").at("time_us").get<double>(), row.at("bound_us").get<double>());
  for (const std::string cmd : {"bound --coll allgather --sizes 1MiB", "baseline --coll allgather --sizes 1MiB"}) {
    auto r = run(fmt::format("{} --topo dgx-a100x4 --calibration {}", cmd, cal));
    EXPECT_EQ(r.rc, 0) << cmd << ": " << r.err;
  }
}

TEST_F(CalibrateCli, ALogOfAnotherClusterIsAnErrorNamingTheFileAndBothCounts) {
  const std::string log = write("x2.log", pastedLog(2));
  auto r = run(fmt::format("calibrate {} --topo dgx-a100x4", log));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find(log), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("16 ranks on 2 node(s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("32 ranks on 4 node(s)"), std::string::npos) << r.err;
}

TEST_F(CalibrateCli, WrongInputsAreErrorsThatNameTheFile) {
  const std::string log = write("x2.log", pastedLog(2));
  const std::string cal = path("cal.toml");
  ASSERT_EQ(run(fmt::format("calibrate {} --topo dgx-a100x2 -o {}", log, cal)).rc, 0);
  // The calibration of A100 nodes on H100 nodes.
  auto other = run(fmt::format("baseline --topo dgx-h100x2 --coll allreduce --calibration {}", cal));
  EXPECT_EQ(other.rc, 2);
  EXPECT_NE(other.err.find(cal), std::string::npos) << other.err;
  EXPECT_NE(other.err.find("H100"), std::string::npos) << other.err;
  // A broken calibration file: its line.
  std::string text = slurp(cal);
  text.replace(text.find("net_bandwidth_scale = "), 22, "net_bandwidth_scale = \"fast\" #");
  const std::string bad = write("bad.toml", text);
  auto broken = run(fmt::format("simulate x.json --topo dgx-a100x2 --calibration {}", bad));
  EXPECT_EQ(broken.rc, 2);
  EXPECT_NE(broken.err.find(bad + ":"), std::string::npos) << broken.err;
  EXPECT_NE(broken.err.find("net_bandwidth_scale"), std::string::npos) << broken.err;
  // Not a log, a missing log, and nothing usable.
  for (const std::string& input : {write("notes.txt", "hello\nworld\n"), path("missing.log"), write("empty.log", "")}) {
    auto r = run(fmt::format("calibrate {} --topo dgx-a100x2", input));
    EXPECT_EQ(r.rc, 2) << input;
    EXPECT_NE(r.err.find(input), std::string::npos) << r.err;
  }
  // --calibration checks, -o writes: not both.
  EXPECT_EQ(run(fmt::format("calibrate {} --topo dgx-a100x2 --calibration {} -o {}", log, cal, path("x.toml"))).rc, 2);
}

// NCCL's topology dump of one DGX A100 node: 8 GPUs on NVSwitch (12 NVLinks each), 8 HDR NICs, one per GPU.
std::string dgxA100Dump() {
  std::string x = "<system version=\"1\">\n  <cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n";
  for (int g = 0; g < 8; ++g) {
    x += fmt::format(
        "    <pci busid=\"0000:{0:02x}:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
        "      <pci busid=\"0000:{1:02x}:00.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x20b2\" "
        "link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
        "        <gpu dev=\"{2}\" sm=\"80\" rank=\"{2}\" gdr=\"1\"><nvlink target=\"0000:c4:00.0\" count=\"12\" "
        "tclass=\"0x068000\"/></gpu>\n"
        "      </pci>\n"
        "      <pci busid=\"0000:{3:02x}:00.0\" class=\"0x020700\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
        "        <nic><net name=\"mlx5_{2}\" dev=\"{2}\" speed=\"200000\" port=\"1\" gdr=\"1\"/></nic>\n"
        "      </pci>\n"
        "    </pci>\n",
        16 * g + 1, 16 * g + 2, g, 16 * g + 3);
  }
  return x + "  </cpu>\n</system>\n";
}

// --topo takes NCCL's topology XML; a one-node file stands for the node count of the log (no --nodes needed).
TEST_F(CalibrateCli, TopologyXmlOfOneNodeServesTheLogsNodeCount) {
  const std::string xml = write("dgx.xml", dgxA100Dump());
  const std::string log = write("x2.log", pastedLog(2));
  auto r = run(fmt::format("calibrate {} --topo {} --json", log, xml));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("ranks").get<int>(), 16);
  ASSERT_FALSE(j.at("rows").empty());
  EXPECT_EQ(j.at("rows")[0].at("topology").get<std::string>(), "dgxx2");
  // The same file at a node count the log does not have is the usual error naming both counts.
  auto wrong = run(fmt::format("calibrate {} --topo {} --nodes 4", log, xml));
  EXPECT_EQ(wrong.rc, 2);
  EXPECT_NE(wrong.err.find("x2.log"), std::string::npos) << wrong.err;
  // Other commands read it too, with --nodes.
  auto base = run(fmt::format("baseline --topo {} --nodes 2 --coll allreduce --sizes 1GiB --json", xml));
  ASSERT_EQ(base.rc, 0) << base.err;
  auto preset = run("baseline --topo dgx-a100x2 --coll allreduce --sizes 1GiB --json");
  ASSERT_EQ(preset.rc, 0) << preset.err;
  // The dump describes what the preset does, so NCCL's model gives the same time.
  const auto a = nlohmann::json::parse(base.out).at("rows");
  const auto b = nlohmann::json::parse(preset.out).at("rows");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].at("algorithm"), b[0].at("algorithm"));
  EXPECT_NEAR(a[0].at("time_us").get<double>(), b[0].at("time_us").get<double>(), 1e-6) << base.out << preset.out;
}

// The real logs of ../shared, when this checkout has them: the ABCI four-node run on its topology file.
TEST_F(CalibrateCli, RealAbciLog) {
  const fs::path logs = fs::path(OPTIFLOW_SOURCE_DIR) / "../shared/reference/nccl-tests-logs";
  if (!fs::exists(logs)) GTEST_SKIP() << "no ../shared/reference/nccl-tests-logs in this checkout";
  auto r = run(fmt::format("calibrate {} --topo {}/examples/topologies/abci-a100x4.toml --json",
                           (logs / "abci-a100x4-allreduce.log").string(), OPTIFLOW_SOURCE_DIR));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("ranks").get<int>(), 32);
  EXPECT_EQ(j.at("rows").size(), 24u);
  const std::string believe = j.at("believe").get<std::string>();
  const auto& m = j.at(believe == "simulator" ? "simulator" : "nccl_model");
  EXPECT_LT(m.at("median_error_pct").get<double>(), 10.0);
}

}  // namespace
