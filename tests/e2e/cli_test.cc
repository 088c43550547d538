// Runs the optiflow binary as a user does and checks exit codes, output and files.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
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

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("optiflow-e2e-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult run(const std::string& args) {
    return optiflow::testsupport::runCommand(fmt::format("{} {}", OPTIFLOW_CLI, args), dir_);
  }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  fs::path dir_;
};

TEST_F(Cli, PrintsItsVersion) {
  const CliResult r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("optiflow 0."), std::string::npos) << r.out;
}

TEST_F(Cli, BadUsageExitsWithTwo) {
  EXPECT_EQ(run("").rc, 2);
  EXPECT_EQ(run("frobnicate").rc, 2);
  EXPECT_EQ(run("verify").rc, 2);
}

TEST_F(Cli, ListsThePresets) {
  const CliResult r = run("topo presets");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* p : {"dgx-a100", "dgx-h100", "hgx-h200"}) EXPECT_NE(r.out.find(p), std::string::npos) << p;
}

TEST_F(Cli, ShowsDgxA100x4AsJson) {
  const CliResult r = run("topo show dgx-a100x4 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("nodes").get<int>(), 4);
  EXPECT_EQ(j.at("gpus_per_node").get<int>(), 8);
  EXPECT_EQ(j.at("n_ranks").get<int>(), 32);
  ASSERT_EQ(j.at("gpus").size(), 32u);
  const auto& nics = j.at("nics");
  ASSERT_EQ(nics.size(), 8u);
  for (const auto& nic : nics) EXPECT_DOUBLE_EQ(nic.at("bandwidth_gbytes_per_s").get<double>(), 25.0);
}

TEST_F(Cli, TopologyErrorsNameFileAndLine) {
  const fs::path p = write("bad.toml", "name = \"x\"\nnodes = \"four\"\n");
  const CliResult r = run(fmt::format("topo show {}", p.string()));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("bad.toml:2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nodes"), std::string::npos) << r.err;
  const CliResult unknown = run("topo show no-such-preset");
  EXPECT_EQ(unknown.rc, 2);
  EXPECT_FALSE(unknown.err.empty());
}

// A cloud skeleton for NCCL_TOPO_FILE (GPUs and NICs as PCI ids only): what it lacks comes from flags, or the
// error names the flag; what was assumed is a note on stderr.
TEST_F(Cli, TopologySkeletonXmlTakesWhatItLacksFromFlags) {
  std::string xml = "<system version=\"1\"><cpu numaid=\"0\">";
  for (int sw = 0; sw < 4; ++sw) {
    xml += fmt::format("<pci busid=\"ffff:ff:0{}.0\" class=\"0x060400\" link_speed=\"16 GT/s\" link_width=\"16\">", sw);
    for (int g = 0; g < 2; ++g) {
      xml += fmt::format("<pci busid=\"0000:{}0:1{}.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x2330\"/>",
                         sw + 1, g);
    }
    xml += fmt::format("<pci busid=\"0000:{}0:1b.0\" class=\"0x020000\" vendor=\"0x1d0f\" device=\"0xefa1\"/></pci>",
                       sw + 1);
  }
  xml += "</cpu></system>";
  const fs::path p = write("p5-like.xml", xml);
  const CliResult missing = run(fmt::format("topo show {} --nodes 2", p.string()));
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.err.find("p5-like.xml"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("--nic-gbps"), std::string::npos) << missing.err;
  const CliResult r = run(fmt::format("topo show {} --nodes 2 --nic-gbps 400 --json", p.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("note:"), std::string::npos) << r.err;  // 8 SXM H100 without <nvlink>: NVSwitch assumed
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("n_ranks").get<int>(), 16);
  EXPECT_EQ(j.at("gpu_type").get<std::string>(), "H100");
  EXPECT_EQ(j.at("nics").size(), 4u);
  EXPECT_DOUBLE_EQ(j.at("nics")[0].at("bandwidth_gbytes_per_s").get<double>(), 50.0);
  // Every command that takes --topo reads it the same way.
  const CliResult bound =
      run(fmt::format("bound --topo {} --nodes 2 --nic-gbps 400 --coll allgather --sizes 1GiB", p.string()));
  EXPECT_EQ(bound.rc, 0) << bound.err;
  const CliResult badGpu = run(fmt::format("topo show {} --gpu TPUv5", p.string()));
  EXPECT_EQ(badGpu.rc, 2);
  EXPECT_NE(badGpu.err.find("TPUv5"), std::string::npos) << badGpu.err;
}

TEST_F(Cli, RingFixturesVerifyAndCheckInBothFormats) {
  for (const char* coll : {"allgather", "reducescatter", "allreduce"}) {
    for (int ranks : {2, 5, 16, 64}) {
      for (const char* format : {"json", "msccl-xml"}) {
        const fs::path p = dir_ / fmt::format("{}-{}.{}", coll, ranks, format);
        ASSERT_EQ(run(fmt::format("fixture --coll {} --ranks {} --channels 2 --format {} -o {}", coll, ranks, format,
                                  p.string()))
                      .rc,
                  0);
        const CliResult v = run(fmt::format("verify {}", p.string()));
        EXPECT_EQ(v.rc, 0) << coll << " " << ranks << " " << format << "\n" << v.out << v.err;
        EXPECT_NE(v.out.find("PROVEN"), std::string::npos);
        const CliResult c = run(fmt::format("check {}", p.string()));
        EXPECT_EQ(c.rc, 0) << coll << " " << ranks << " " << format << "\n" << c.out << c.err;
        EXPECT_NE(c.out.find("PASSED"), std::string::npos);
      }
    }
  }
}

TEST_F(Cli, BrokenScheduleIsRejectedByVerifyAndCheckWithALocation) {
  const fs::path good = dir_ / "ag.json";
  ASSERT_EQ(run(fmt::format("fixture --coll allgather --ranks 4 -o {}", good.string())).rc, 0);
  auto j = nlohmann::json::parse(slurp(good));
  // Rank 2 stores its last received chunk at the wrong offset: one output chunk stays empty, another is clobbered.
  auto& steps = j["ranks"][2]["threadblocks"][0]["steps"];
  auto& last = steps[steps.size() - 1];
  last["dst"]["off"] = 0;
  const fs::path bad = write("bad.json", j.dump());
  const CliResult v = run(fmt::format("verify {}", bad.string()));
  EXPECT_EQ(v.rc, 1) << v.out << v.err;
  EXPECT_NE(v.out.find("rank 2"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("NOT PROVEN"), std::string::npos) << v.out;
  const CliResult vj = run(fmt::format("verify {} --json", bad.string()));
  EXPECT_EQ(vj.rc, 1);
  const auto report = nlohmann::json::parse(vj.out);
  EXPECT_FALSE(report.at("proven").get<bool>());
  EXPECT_FALSE(report.at("errors").empty());
  const CliResult c = run(fmt::format("check {}", bad.string()));
  EXPECT_EQ(c.rc, 1) << c.out << c.err;
  EXPECT_NE(c.out.find("FAILED"), std::string::npos);
}

TEST_F(Cli, UnreadableOrMalformedSchedulesExitWithTwo) {
  EXPECT_EQ(run(fmt::format("verify {}", (dir_ / "missing.json").string())).rc, 2);
  const fs::path p = write("broken.xml", "<algo name=\"x\" proto=\"Simple\">\n  <gpu id=\"0\">\n</algo>\n");
  const CliResult r = run(fmt::format("verify {}", p.string()));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("broken.xml:"), std::string::npos) << r.err;
}

TEST_F(Cli, ConvertRoundTripsThroughBothFormats) {
  const fs::path xml = dir_ / "ar.xml";
  ASSERT_EQ(run(fmt::format("fixture --coll allreduce --ranks 8 --channels 2 --in-place --format msccl-xml -o {}",
                            xml.string()))
                .rc,
            0);
  const fs::path json = dir_ / "ar.json";
  ASSERT_EQ(run(fmt::format("convert {} --to json -o {}", xml.string(), json.string())).rc, 0);
  const fs::path xml2 = dir_ / "ar2.xml";
  ASSERT_EQ(run(fmt::format("convert {} --to msccl-xml -o {}", json.string(), xml2.string())).rc, 0);
  EXPECT_EQ(slurp(xml), slurp(xml2));
  EXPECT_EQ(run(fmt::format("verify {}", xml2.string())).rc, 0);
}

// The real MSCCL files: the verifier's verdict is pinned, and the reference executor agrees with it on each.
TEST_F(Cli, VerifyAndCheckAgreeOnRealMscclFiles) {
  const fs::path samples = OPTIFLOW_SAMPLES_DIR;
  if (!fs::is_directory(samples)) GTEST_SKIP() << "no samples folder at " << samples;
  // Two blocks share one NCCL connection on ranks 2, 3, 6 and 7: not executable on MSCCL.
  const std::set<std::string> wrong = {"old-ar-8gpu-simple-ndv2.xml"};
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(samples)) {
    if (entry.path().extension() != ".xml") continue;
    ++seen;
    const std::string name = entry.path().filename().string();
    const CliResult v = run(fmt::format("verify {}", entry.path().string()));
    const CliResult c = run(fmt::format("check {}", entry.path().string()));
    const int expected = wrong.count(name) ? 1 : 0;
    EXPECT_EQ(v.rc, expected) << name << "\n" << v.out << v.err;
    EXPECT_EQ(c.rc, expected) << name << "\n" << c.out << c.err;
  }
  EXPECT_EQ(seen, 14);
}

TEST_F(Cli, BoundPrintsTheWorkedNodeCutNumbers) {
  const CliResult r = run("bound --topo dgx-a100x4 --coll allgather --sizes 1MiB,1GiB --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("rows").size(), 2u);
  const auto& big = j.at("rows")[1];
  EXPECT_EQ(big.at("size_bytes").get<std::uint64_t>(), 1ull << 30);
  EXPECT_NEAR(big.at("algbw_gbps").get<double>(), 266.67, 0.01);
  EXPECT_NEAR(big.at("busbw_gbps").get<double>(), 258.33, 0.01);
  EXPECT_EQ(run("bound --topo dgx-a100x4 --coll allgather --sizes 1MiB:1KiB").rc, 2);
}

TEST_F(Cli, BaselineRowsCarryNcclsChoiceAndTheBound) {
  const CliResult r = run("baseline --topo dgx-a100 --coll allreduce --sizes 1KiB,1GiB --json --simulate");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out).at("rows");
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    for (const char* key :
         {"size_bytes", "algorithm", "protocol", "channels", "time_us", "algbw_gbps", "busbw_gbps", "bound_us"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    EXPECT_GE(row.at("time_us").get<double>(), row.at("bound_us").get<double>());
    EXPECT_GE(row.at("simulated").at("time_us").get<double>(), row.at("bound_us").get<double>());
  }
  EXPECT_EQ(rows[0].at("algorithm"), "Ring");
  EXPECT_EQ(rows[0].at("protocol"), "LL");
  EXPECT_EQ(rows[1].at("protocol"), "Simple");
}

TEST_F(Cli, SimulateTimesAScheduleAboveItsBound) {
  const fs::path p = dir_ / "ag32.json";
  ASSERT_EQ(run(fmt::format("fixture --coll allgather --ranks 32 --channels 2 -o {}", p.string())).rc, 0);
  const CliResult r = run(fmt::format("simulate {} --topo dgx-a100x4 --sizes 1KiB:1GiB:32 --json", p.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out).at("rows");
  ASSERT_EQ(rows.size(), 5u);
  double lastBusbw = 0;
  for (const auto& row : rows) {
    EXPECT_GE(row.at("time_us").get<double>(), row.at("bound_us").get<double>());
    EXPECT_FALSE(row.at("below_bound").get<bool>());
    EXPECT_FALSE(row.at("links").empty());
    EXPECT_FALSE(row.at("critical_path").empty());
    EXPECT_TRUE(row.at("bottleneck").contains("link"));
    EXPECT_GE(row.at("busbw_gbps").get<double>(), lastBusbw);
    lastBusbw = row.at("busbw_gbps").get<double>();
  }
  const CliResult text = run(fmt::format("simulate {} --topo dgx-a100x4 --sizes 1GiB", p.string()));
  EXPECT_EQ(text.rc, 0);
  EXPECT_NE(text.out.find("bound_us"), std::string::npos) << text.out;
  // 32 ranks do not fit on one 8-GPU node.
  const CliResult wrong = run(fmt::format("simulate {} --topo dgx-a100 --sizes 1MiB", p.string()));
  EXPECT_EQ(wrong.rc, 2);
  EXPECT_NE(wrong.err.find("32 ranks"), std::string::npos) << wrong.err;
}

// ---- the language: compile, its errors, and compare over the gallery (examples/programs) ----

fs::path galleryFile(const std::string& name) { return fs::path(OPTIFLOW_SOURCE_DIR) / "examples" / "programs" / name; }

TEST_F(Cli, CompilesAGalleryProgramIntoAScheduleVerifyProves) {
  const fs::path program = galleryFile("allgather_hier_rail.ofl");
  ASSERT_TRUE(fs::exists(program)) << program;
  const fs::path out = dir_ / "ag.json";
  const CliResult r =
      run(fmt::format("compile {} --topo dgx-a100x4 --size 1MiB -o {}", program.string(), out.string()));
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(j.at("collective"), "allgather");
  EXPECT_EQ(j.at("n_ranks").get<int>(), 32);
  const CliResult v = run(fmt::format("verify {}", out.string()));
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("PROVEN"), std::string::npos) << v.out;
  // Without -o the schedule goes to standard output.
  const CliResult stdoutRun = run(fmt::format("compile {} --topo dgx-a100 --size 1MiB", program.string()));
  ASSERT_EQ(stdoutRun.rc, 0) << stdoutRun.err;
  EXPECT_EQ(nlohmann::json::parse(stdoutRun.out).at("n_ranks").get<int>(), 8);
}

TEST_F(Cli, CompileReportsASyntaxErrorWithLineColumnAndCaret) {
  const fs::path p = write("typo.ofl",
                           "allgather typo\n"
                           "  for g in gpus:\n"
                           "    allgather rail(g) by rign\n"
                           "  for n in nodes: allgather node(n) by direct\n");
  const CliResult r = run(fmt::format("compile {} --topo dgx-a100x2", p.string()));
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("typo.ofl:3:26:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("found 'rign'"), std::string::npos) << r.err;
  // The offending line, then a caret line whose caret sits under the 'r' of 'rign'.
  std::istringstream lines(r.err);
  std::string line;
  std::string echoed;
  std::string caret;
  while (std::getline(lines, line)) {
    if (line.find("allgather rail(g) by rign") != std::string::npos) {
      echoed = line;
      std::getline(lines, caret);
      break;
    }
  }
  ASSERT_FALSE(echoed.empty()) << r.err;
  EXPECT_EQ(caret.find_first_not_of(' '), echoed.find("rign")) << r.err;
  EXPECT_EQ(caret.substr(caret.find_first_not_of(' ')), "^") << r.err;
}

TEST_F(Cli, CompileReportsASemanticErrorWithItsLine) {
  const fs::path p = write("six.ofl",
                           "allgather six\n"
                           "  for n in nodes:\n"
                           "    allgather {rank(n, g) for g in 6} by recursive_doubling\n");
  const CliResult r = run(fmt::format("compile {} --topo dgx-a100", p.string()));
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("six.ofl:3:5: allgather by recursive_doubling needs a group of a power-of-two size; "
                       "{rank(n, g) for g in 6} has 6 members (use bruck or pat)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("    allgather {rank(n, g) for g in 6} by recursive_doubling\n"), std::string::npos) << r.err;
}

TEST_F(Cli, CompilesToMscclXmlThatVerifyAccepts) {
  const fs::path out = dir_ / "ar.xml";
  const CliResult r = run(fmt::format("compile {} --topo dgx-a100x2 --size 256MiB --format msccl-xml -o {}",
                                      galleryFile("allreduce_hier.ofl").string(), out.string()));
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string xml = slurp(out);
  EXPECT_EQ(xml.rfind("<algo", 0), 0u) << xml.substr(0, 200);
  const CliResult v = run(fmt::format("verify {}", out.string()));
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("PROVEN"), std::string::npos) << v.out;
  const CliResult c = run(fmt::format("check {}", out.string()));
  EXPECT_EQ(c.rc, 0) << c.out << c.err;
}

TEST_F(Cli, CompareRanksTheAllGatherGalleryAgainstNcclAndTheBound) {
  const std::string programs = (fs::path(OPTIFLOW_SOURCE_DIR) / "examples" / "programs" / "allgather_*.ofl").string();
  const CliResult r =
      run(fmt::format("compare {} --topo dgx-a100 --coll allgather --sizes 1KiB,1MiB --json", programs));
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 2u);
  const std::uint64_t sizes[] = {1024, 1 << 20};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    for (const char* key : {"size_bytes", "nccl_time_us", "best_program", "best_time_us", "bound_us"}) {
      EXPECT_TRUE(row.contains(key)) << key << " in " << row.dump();
    }
    EXPECT_EQ(row.at("size_bytes").get<std::uint64_t>(), sizes[i]);
    EXPECT_FALSE(row.at("best_program").get<std::string>().empty());
    EXPECT_GT(row.at("nccl_time_us").get<double>(), 0.0);
    EXPECT_GE(row.at("best_time_us").get<double>(), row.at("bound_us").get<double>()) << row.dump();
  }
}

}  // namespace
