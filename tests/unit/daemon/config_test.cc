// optiflowd's config: every error class names the file, the line and the key; the OPTIFLOW_* overrides; the state
// directory; the NCCL topology dump reader; and the example config shipped in daemon/etc.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "optiflow/daemon/config.h"
#include "optiflow/daemon/daemon.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::daemon {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string>& env() {
  static std::map<std::string, std::string> e;
  return e;
}
const char* fakeEnv(const char* name) {
  auto it = env().find(name);
  return it == env().end() ? nullptr : it->second.c_str();
}

const char* kMinimal =
    "version = 1\n"
    "[topology]\n"
    "preset = \"dgx-a100\"\n";

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { env().clear(); }
  void TearDown() override { env().clear(); }

  core::Result<Config> parse(const std::string& text) { return parseConfig(text, "/etc/optiflow/test.toml", &fakeEnv); }
  // The error text of a config that must fail.
  std::string error(const std::string& text) {
    auto r = parse(text);
    EXPECT_FALSE(r.ok()) << "expected an error for:\n" << text;
    return r.ok() ? std::string() : r.error().str();
  }
  int line(const std::string& text) {
    auto r = parse(text);
    return r.ok() ? -1 : r.error().line;
  }
};

TEST_F(ConfigTest, MinimalConfigGivesTheDocumentedDefaults) {
  auto r = parse(kMinimal);
  ASSERT_TRUE(r.ok()) << r.error().str();
  const Config& c = *r;
  EXPECT_EQ(c.file, fs::path("/etc/optiflow/test.toml"));
  EXPECT_EQ(c.ns, "default");
  EXPECT_EQ(c.preset, "dgx-a100");
  EXPECT_EQ(c.proposer, "builtin");
  EXPECT_EQ(c.evaluator, "simulator");
  EXPECT_EQ(c.collectives, (std::vector<std::string>{"allgather", "reducescatter", "allreduce"}));
  EXPECT_TRUE(c.sizes.empty());
  EXPECT_EQ(c.rounds, 4);
  EXPECT_DOUBLE_EQ(c.cpuCores, 1.0);
  EXPECT_EQ(c.nice, 10);
  EXPECT_EQ(c.metricsAddress, "127.0.0.1");
  EXPECT_EQ(c.metricsPort, 9464);
  EXPECT_EQ(c.role, Role::kStandalone);
  EXPECT_EQ(c.logLevel, "info");
  EXPECT_FALSE(c.logJson);
}

TEST_F(ConfigTest, EveryKeyIsRead) {
  auto r = parse(R"(version = 1
[cache]
namespace = "job-7"
group = "ml"
[topology]
nccl_topo_dump = "topo.xml"
nodes = 4
[synthesis]
proposer = "llm"
evaluator = "simulator"
collectives = ["allreduce", "broadcast"]
sizes = ["1MiB", 4096, "64KiB", 4096]
rounds = 2
candidates_per_round = 3
interval_s = 120.5
state_dir = "state"
seed = 42
[llm]
endpoint = "http://127.0.0.1:8000/v1"
model = "m"
api_key_env = "MY_KEY"
timeout_s = 30
[budget]
cpu_cores = 0.5
nice = 19
busy_calls_per_s = 10
idle_window_s = 1.5
[probe]
enabled = false
listen = "0.0.0.0:7000"
peers = ["10.0.0.2:7000", "[fe80::1]:7000"]
interval_s = 60
bytes = "1MiB"
[metrics]
address = "0.0.0.0"
port = 0
[share]
role = "leader"
dir = "/shared/optiflow"
[log]
level = "debug"
json = true
)");
  ASSERT_TRUE(r.ok()) << r.error().str();
  const Config& c = *r;
  EXPECT_EQ(c.ns, "job-7");
  EXPECT_EQ(c.group, "ml");
  EXPECT_EQ(c.ncclTopoDump, fs::path("/etc/optiflow/topo.xml"));  // relative to the config's directory
  EXPECT_EQ(c.nodes, 4);
  EXPECT_EQ(c.proposer, "llm");
  EXPECT_EQ(c.collectives, (std::vector<std::string>{"allreduce", "broadcast"}));
  EXPECT_EQ(c.sizes, (std::vector<std::uint64_t>{4096, 65536, 1 << 20}));  // sorted, duplicates dropped
  EXPECT_EQ(c.rounds, 2);
  EXPECT_EQ(c.candidatesPerRound, 3);
  EXPECT_DOUBLE_EQ(c.intervalS, 120.5);
  EXPECT_EQ(c.stateDir, fs::path("/etc/optiflow/state"));
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.llm.client.baseUrl, "http://127.0.0.1:8000/v1");
  EXPECT_EQ(c.llm.client.model, "m");
  EXPECT_EQ(c.llm.apiKeyEnv, "MY_KEY");
  EXPECT_DOUBLE_EQ(c.llm.client.timeoutS, 30);
  EXPECT_DOUBLE_EQ(c.cpuCores, 0.5);
  EXPECT_EQ(c.nice, 19);
  EXPECT_DOUBLE_EQ(c.busyCallsPerS, 10);
  EXPECT_DOUBLE_EQ(c.idleWindowS, 1.5);
  EXPECT_FALSE(c.probeEnabled);
  EXPECT_EQ(c.probeListen, "0.0.0.0:7000");
  EXPECT_EQ(c.probePeers, (std::vector<std::string>{"10.0.0.2:7000", "[fe80::1]:7000"}));
  EXPECT_DOUBLE_EQ(c.probeIntervalS, 60);
  EXPECT_EQ(c.probeBytes, 1u << 20);
  EXPECT_EQ(c.metricsAddress, "0.0.0.0");
  EXPECT_EQ(c.metricsPort, 0);
  EXPECT_EQ(c.role, Role::kLeader);
  EXPECT_EQ(c.shareDir, fs::path("/shared/optiflow"));
  EXPECT_EQ(c.logLevel, "debug");
  EXPECT_TRUE(c.logJson);
}

TEST_F(ConfigTest, InvalidTomlNamesFileLineAndColumn) {
  auto r = parse("version = 1\n[topology]\npreset = \"dgx-a100\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "/etc/optiflow/test.toml");
  EXPECT_EQ(r.error().line, 3);
  EXPECT_GT(r.error().column, 0);
  EXPECT_NE(r.error().str().find("invalid TOML"), std::string::npos) << r.error().str();
}

TEST_F(ConfigTest, VersionIsRequiredAndChecked) {
  EXPECT_NE(error("[topology]\npreset = \"dgx-a100\"\n").find("version: missing"), std::string::npos);
  const std::string wrong = "version = 2\n[topology]\npreset = \"dgx-a100\"\n";
  EXPECT_NE(error(wrong).find("test.toml:1:"), std::string::npos) << error(wrong);
  EXPECT_NE(error(wrong).find("version = 2: expected 1"), std::string::npos) << error(wrong);
  EXPECT_NE(error("version = \"1\"\n[topology]\npreset = \"dgx-a100\"\n").find("version = \"1\""), std::string::npos);
}

TEST_F(ConfigTest, UnknownKeyNamesLineKeyAndTheKnownKeys) {
  const std::string text = std::string(kMinimal) + "[budget]\ncpu_cores = 1\ncpu_core = 2\n";
  const std::string e = error(text);
  EXPECT_EQ(line(text), 6);
  EXPECT_NE(e.find("/etc/optiflow/test.toml:6:"), std::string::npos) << e;
  EXPECT_NE(e.find("[budget] cpu_core: unknown key; expected one of: cpu_cores, nice, busy_calls_per_s, "
                   "idle_window_s"),
            std::string::npos)
      << e;
}

TEST_F(ConfigTest, UnknownSectionAndTopLevelKey) {
  const std::string section = std::string(kMinimal) + "[budgets]\ncpu_cores = 1\n";
  EXPECT_EQ(line(section), 4);
  EXPECT_NE(error(section).find("budgets: unknown section"), std::string::npos) << error(section);
  const std::string key = "version = 1\nnamespace = \"x\"\n[topology]\npreset = \"dgx-a100\"\n";
  EXPECT_EQ(line(key), 2);
  EXPECT_NE(error(key).find("namespace: unknown key; expected version or one of the sections: cache, topology"),
            std::string::npos)
      << error(key);
  // A section written as a key.
  const std::string notTable = "version = 1\nbudget = 3\n[topology]\npreset = \"dgx-a100\"\n";
  EXPECT_EQ(line(notTable), 2);
  EXPECT_NE(error(notTable).find("[budget]: expected a table (section), got an integer"), std::string::npos)
      << error(notTable);
}

TEST_F(ConfigTest, WrongTypesNameTheKeyAndTheExpectedType) {
  const std::string text = std::string(kMinimal) + "[synthesis]\nrounds = \"four\"\n";
  EXPECT_EQ(line(text), 5);
  EXPECT_NE(error(text).find("[synthesis] rounds = \"four\": expected a round count in 1..1000 (an integer), got a "
                             "string"),
            std::string::npos)
      << error(text);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nrounds = 2.5\n").find("got a float"), std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[log]\njson = 1\n").find("[log] json = 1: expected true or false"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\ncollectives = \"allreduce\"\n")
                .find("[synthesis] collectives = \"allreduce\": expected an array"),
            std::string::npos);
}

TEST_F(ConfigTest, OutOfRangeValuesNameTheRange) {
  const std::string text = std::string(kMinimal) + "[budget]\ncpu_cores = 0\n";
  EXPECT_EQ(line(text), 5);
  EXPECT_NE(error(text).find("[budget] cpu_cores = 0: expected a number of cores in 0.05..64"), std::string::npos)
      << error(text);
  EXPECT_NE(error(std::string(kMinimal) + "[budget]\nnice = 20\n")
                .find("[budget] nice = 20: expected a nice value "
                      "in 0..19"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[metrics]\nport = 70000\n").find("[metrics] port = 70000"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nrounds = 0\n").find("in 1..1000"), std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[budget]\nidle_window_s = -1\n").find("idle_window_s = -1"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[budget]\ncpu_cores = nan\n").find("cpu_cores = nan"), std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[probe]\nbytes = 100\n")
                .find("[probe] bytes = 100: expected a size in "
                      "4KiB..256MiB"),
            std::string::npos);
}

TEST_F(ConfigTest, ChoicesListTheAcceptedValues) {
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nproposer = \"gpt\"\n")
                .find("[synthesis] proposer = \"gpt\": expected one of builtin, llm"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nevaluator = \"hardware\"\n").find("one of simulator"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[log]\nlevel = \"verbose\"\n")
                .find("expected one of trace, debug, info, warn, error"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[share]\nrole = \"boss\"\n").find("one of standalone, leader, follower"),
            std::string::npos);
}

TEST_F(ConfigTest, CollectivesAreTheTunersNames) {
  const std::string bad = std::string(kMinimal) + "[synthesis]\ncollectives = [\"allreduce\", \"all_gather\"]\n";
  EXPECT_EQ(line(bad), 5);
  EXPECT_NE(error(bad).find("[synthesis] collectives[1] = \"all_gather\": expected a collective: one of allgather, "
                            "reducescatter, allreduce, broadcast, reduce"),
            std::string::npos)
      << error(bad);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\ncollectives = [\"alltoall\"]\n").find("collectives[0]"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\ncollectives = [\"reduce\", \"reduce\"]\n")
                .find("collectives[1] = \"reduce\": expected each collective once"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\ncollectives = []\n").find("at least one collective"),
            std::string::npos);
}

TEST_F(ConfigTest, SizesAcceptBytesAndUnits) {
  auto r = parse(std::string(kMinimal) + "[synthesis]\nsizes = [\"1KiB\", \"1M\", 65536, \"1GiB\"]\n");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->sizes, (std::vector<std::uint64_t>{1024, 65536, 1 << 20, 1u << 30}));
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nsizes = [\"1KiB\", \"lots\"]\n")
                .find("[synthesis] sizes[1] = \"lots\": expected a size in 1B..16GiB"),
            std::string::npos)
      << error(std::string(kMinimal) + "[synthesis]\nsizes = [\"1KiB\", \"lots\"]\n");
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nsizes = [0]\n").find("sizes[0] = 0"), std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nsizes = [true]\n").find("sizes[0] = true"), std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[synthesis]\nsizes = []\n").find("1..64 sizes"), std::string::npos);
}

TEST_F(ConfigTest, TopologyNeedsExactlyOneSource) {
  EXPECT_NE(error("version = 1\n").find("[topology]: missing section"), std::string::npos);
  const std::string none = "version = 1\n[topology]\n";
  EXPECT_NE(error(none).find("[topology]: no source given; it needs exactly one of preset, file, nccl_topo_dump"),
            std::string::npos)
      << error(none);
  const std::string two = "version = 1\n\n[topology]\npreset = \"dgx-a100\"\nfile = \"t.toml\"\n";
  EXPECT_EQ(line(two), 3);
  EXPECT_NE(error(two).find("several sources"), std::string::npos);
  const std::string preset = "version = 1\n[topology]\npreset = \"dgx-z900\"\n";
  EXPECT_EQ(line(preset), 3);
  EXPECT_NE(error(preset).find("[topology] preset = \"dgx-z900\": expected unknown preset"), std::string::npos)
      << error(preset);
  EXPECT_NE(error(std::string(kMinimal) + "nodes = 2\n").find("[topology] nodes = 2"), std::string::npos);
  auto many = parse("version = 1\n[topology]\npreset = \"dgx-h100x16\"\n");
  ASSERT_TRUE(many.ok()) << many.error().str();
  auto topo = loadConfiguredTopology(*many);
  ASSERT_TRUE(topo.ok()) << topo.error().str();
  EXPECT_EQ(topo->nodes, 16);
}

TEST_F(ConfigTest, CrossKeyRules) {
  const std::string llm = std::string(kMinimal) + "[synthesis]\nproposer = \"llm\"\n[llm]\nmodel = \"m\"\n";
  EXPECT_EQ(line(llm), 5);
  EXPECT_NE(error(llm).find("[synthesis] proposer = \"llm\": needs [llm] endpoint and [llm] model (missing: "
                            "endpoint)"),
            std::string::npos)
      << error(llm);
  EXPECT_NE(error(std::string(kMinimal) + "[llm]\nendpoint = \"127.0.0.1:8000\"\n").find("[llm] endpoint"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[llm]\napi_key_env = \"MY-KEY\"\n").find("[llm] api_key_env"),
            std::string::npos);
  const std::string follower = std::string(kMinimal) + "[share]\nrole = \"follower\"\n";
  EXPECT_EQ(line(follower), 5);
  EXPECT_NE(error(follower).find("[share] role = \"follower\": needs [share] dir"), std::string::npos)
      << error(follower);
  EXPECT_NE(error(std::string(kMinimal) + "[cache]\nnamespace = \"a/b\"\n")
                .find("[cache] namespace = \"a/b\": expected a namespace"),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[probe]\npeers = [\"10.0.0.2\"]\n").find("[probe] peers[0] = \"10.0.0.2\""),
            std::string::npos);
  EXPECT_NE(error(std::string(kMinimal) + "[probe]\nlisten = \"x:99999\"\n").find("[probe] listen"), std::string::npos);
}

TEST_F(ConfigTest, EnvironmentOverrides) {
  env()["OPTIFLOW_NAMESPACE"] = "from-env";
  env()["OPTIFLOW_METRICS_PORT"] = "0";
  env()["OPTIFLOW_LOG_LEVEL"] = "warn";
  env()["OPTIFLOW_STATE_DIR"] = "/var/tmp/x/../state";
  env()["OPTIFLOW_PROPOSER"] = "";  // empty counts as unset
  auto r = parse(kMinimal);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->ns, "from-env");
  EXPECT_EQ(r->metricsPort, 0);
  EXPECT_EQ(r->logLevel, "warn");
  EXPECT_EQ(r->stateDir, fs::path("/var/tmp/state"));
  EXPECT_EQ(r->proposer, "builtin");

  // Without a GetEnv nothing is overridden.
  auto plain = parseConfig(kMinimal, "x.toml", nullptr);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ns, "default");
}

TEST_F(ConfigTest, BadOverridesNameTheVariable) {
  const std::pair<const char*, const char*> cases[] = {
      {"OPTIFLOW_NAMESPACE", "a b"},         {"OPTIFLOW_METRICS_PORT", "80x"}, {"OPTIFLOW_METRICS_PORT", "-1"},
      {"OPTIFLOW_METRICS_PORT", "65536"},    {"OPTIFLOW_LOG_LEVEL", "loud"},   {"OPTIFLOW_PROPOSER", "gpt"},
      {"OPTIFLOW_STATE_DIR", "relative/dir"}};
  for (const auto& [var, value] : cases) {
    env().clear();
    env()[var] = value;
    const std::string e = error(kMinimal);
    EXPECT_NE(e.find(std::string(var) + "='" + value + "': expected"), std::string::npos) << e;
  }
  // An override that makes the config inconsistent is caught too.
  env().clear();
  env()["OPTIFLOW_PROPOSER"] = "llm";
  EXPECT_NE(error(kMinimal).find("(from OPTIFLOW_PROPOSER): needs [llm] endpoint"), std::string::npos)
      << error(kMinimal);
}

// Every value an enum override of the registry (core::env::kDaemonParams) accepts, the file's key accepts too.
TEST_F(ConfigTest, EnumOverridesAcceptWhatTheirKeysAccept) {
  const std::pair<const char*, const char*> overrides[] = {{"OPTIFLOW_LOG_LEVEL", "[log]\nlevel"},
                                                           {"OPTIFLOW_PROPOSER", "[synthesis]\nproposer"}};
  for (const auto& [var, key] : overrides) {
    for (const core::env::ParamSpec& spec : core::env::kDaemonParams) {
      if (std::string_view(spec.name) != var) continue;
      ASSERT_EQ(spec.type, core::env::ParamType::kEnum) << var;
      std::string_view allowed = spec.allowed;
      while (!allowed.empty()) {
        const std::string value(allowed.substr(0, allowed.find('|')));
        allowed.remove_prefix(std::min(allowed.size(), value.size() + 1));
        env().clear();
        env()[var] = value;
        std::string text = std::string(kMinimal) + key + " = \"" + value + "\"\n";
        if (value == "llm") text += "[llm]\nendpoint = \"http://127.0.0.1:8000/v1\"\nmodel = \"m\"\n";
        EXPECT_TRUE(parse(text).ok()) << var << "=" << value << ": " << parse(text).error().str();
        env().clear();
        EXPECT_TRUE(parse(text).ok()) << key << " = " << value << ": " << parse(text).error().str();
      }
    }
  }
}

TEST_F(ConfigTest, LoadConfigReadsFilesAndNamesMissingOnes) {
  const fs::path dir = fs::temp_directory_path() / ("optiflowd-config-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "optiflowd.toml";
  std::ofstream(file) << kMinimal << "[synthesis]\nstate_dir = \"st\"\n";
  auto r = loadConfig(file, &fakeEnv);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->file, file);
  EXPECT_EQ(r->stateDir, dir / "st");

  auto missing = loadConfig(dir / "nope.toml", &fakeEnv);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().str().find("nope.toml: cannot read the config"), std::string::npos);
  EXPECT_FALSE(loadConfig(dir, &fakeEnv).ok());

  // resolveStateDir: the configured directory is created.
  auto state = resolveStateDir(*r, &fakeEnv);
  ASSERT_TRUE(state.ok()) << state.error().str();
  EXPECT_EQ(*state, dir / "st");
  EXPECT_TRUE(fs::is_directory(dir / "st"));
  // Unset: $STATE_DIRECTORY (systemd; the first of a list) comes next.
  Config unset = *r;
  unset.stateDir.clear();
  env()["STATE_DIRECTORY"] = (dir / "sd").string() + ":" + (dir / "other").string();
  auto sd = resolveStateDir(unset, &fakeEnv);
  ASSERT_TRUE(sd.ok()) << sd.error().str();
  EXPECT_EQ(*sd, dir / "sd");
  // A state dir that is a file is an error naming it.
  std::ofstream(dir / "file") << "x";
  Config bad = *r;
  bad.stateDir = dir / "file";
  auto err = resolveStateDir(bad, &fakeEnv);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().str().find("state_dir"), std::string::npos) << err.error().str();
  fs::remove_all(dir);
}

TEST_F(ConfigTest, CalibrationIsReadWithTheConfigAndCheckedAgainstTheTopology) {
  const fs::path dir = fs::temp_directory_path() / ("optiflowd-calibration-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  calib::Calibration cal;
  cal.gpu = "A100-SXM4";
  cal.gpusPerNode = 8;
  cal.nicsPerNode = 8;
  cal.nicGBps = 25;
  cal.simulator.params.launchGraphUs = 7.5;
  cal.simulator.params.netBandwidthScale = 0.7;
  std::ofstream(dir / "cal.toml") << calib::formatCalibration(cal);
  std::ofstream(dir / "bad.toml") << "format = \"optiflow-calibration\"\nversion = 1\n[node]\ngpu = 3\n";
  auto config = [&](std::string_view preset, std::string_view file) {
    std::ofstream(dir / "optiflowd.toml")
        << "version = 1\n[topology]\npreset = \"" << preset << "\"\ncalibration = \"" << file << "\"\n";
    return loadConfig(dir / "optiflowd.toml", &fakeEnv);
  };
  auto ok = config("dgx-a100x4", "cal.toml");  // relative to the config's directory
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(ok->calibrationFile, dir / "cal.toml");
  ASSERT_TRUE(ok->calibration.has_value());
  EXPECT_EQ(ok->calibration->simulator.params.launchGraphUs, 7.5);
  EXPECT_TRUE(loadConfiguredTopology(*ok).ok());
  // Another kind of node: the topology does not load, and the error says why.
  auto h100 = config("dgx-h100x2", "cal.toml");
  ASSERT_TRUE(h100.ok());
  auto topo = loadConfiguredTopology(*h100);
  ASSERT_FALSE(topo.ok());
  EXPECT_NE(topo.error().str().find("[topology] calibration"), std::string::npos) << topo.error().str();
  EXPECT_NE(topo.error().str().find("H100"), std::string::npos) << topo.error().str();
  // A bad or missing calibration file fails the config at its line, naming both files.
  auto bad = config("dgx-a100x4", "bad.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().line, 4) << bad.error().str();
  EXPECT_NE(bad.error().str().find("bad.toml:4"), std::string::npos) << bad.error().str();
  EXPECT_NE(bad.error().str().find("[node] gpu"), std::string::npos) << bad.error().str();
  auto missing = config("dgx-a100x4", "none.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().str().find("none.toml"), std::string::npos) << missing.error().str();
  fs::remove_all(dir);
}

TEST_F(ConfigTest, ExampleConfigIsValid) {
  const fs::path example = fs::path(OPTIFLOW_SOURCE_DIR) / "daemon/etc/optiflowd.toml";
  auto r = loadConfig(example, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_FALSE(r->preset.empty());
  EXPECT_EQ(r->proposer, "builtin");
  EXPECT_EQ(r->metricsAddress, "127.0.0.1");
  EXPECT_EQ(r->metricsPort, 9464);
  EXPECT_TRUE(r->stateDir.empty());
  EXPECT_TRUE(loadConfiguredTopology(*r).ok());
}

// ---- NCCL topology dumps ----

// Four GPUs behind an NVSwitch and one NIC: the loader itself is tested in tests/unit/core/topology_xml_test.cc.
const char* kNvSwitchXml = R"(<system version="1"><cpu numaid="0">
  <pci busid="0000:07:00.0"><gpu dev="0" sm="80"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu></pci>
  <pci busid="0000:0b:00.0"><gpu dev="1" sm="80"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu></pci>
  <pci busid="0000:47:00.0"><gpu dev="2" sm="80"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu></pci>
  <pci busid="0000:4e:00.0"><gpu dev="3" sm="80"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu></pci>
  <pci busid="0000:0c:00.0"><nic><net name="mlx5_0" speed="200000"/></nic></pci>
</cpu></system>
)";

TEST(NcclTopoTest, ConfigLoadsTheDump) {
  const fs::path dir = fs::temp_directory_path() / ("optiflowd-topo-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "topo.xml") << kNvSwitchXml;
  std::ofstream(dir / "d.toml") << "version = 1\n[topology]\nnccl_topo_dump = \"topo.xml\"\nnodes = 3\n";
  auto c = loadConfig(dir / "d.toml", nullptr);
  ASSERT_TRUE(c.ok()) << c.error().str();
  auto t = loadConfiguredTopology(*c);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->nodes, 3);
  EXPECT_EQ(t->nRanks(), 12);
  fs::remove_all(dir);
}

// ---- the daemon's lifecycle, in process ----

TEST(DaemonTest, LockRefusesASecondDaemonAndStopIsQuick) {
  const std::string ns = "h-da-unit-" + std::to_string(::getpid());
  const fs::path dir = fs::temp_directory_path() / ("optiflowd-daemon-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "d.toml";
  std::ofstream(file) << "version = 1\n[cache]\nnamespace = \"" << ns
                      << "\"\n[topology]\npreset = \"dgx-a100\"\n[synthesis]\ncollectives = [\"allgather\"]\n"
                         "sizes = [\"4KiB\"]\nrounds = 1\ncandidates_per_round = 1\nstate_dir = \"state\"\n"
                         "[probe]\nlisten = \"\"\n[metrics]\nport = 0\n";
  auto config = loadConfig(file, nullptr);
  ASSERT_TRUE(config.ok()) << config.error().str();

  int code = -1;
  auto first = Daemon::create(*config, nullptr, &code);
  ASSERT_TRUE(first.ok()) << first.error().str();
  EXPECT_EQ(code, 0);
  EXPECT_GT((*first)->metricsPort(), 0);
  EXPECT_DOUBLE_EQ((*first)->metrics().get("optiflowd_up"), 1);

  auto second = Daemon::create(*config, nullptr, &code);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(code, 3);
  EXPECT_NE(
      second.error().str().find("another optiflowd (pid " + std::to_string(::getpid()) + ") serves namespace " + ns),
      std::string::npos)
      << second.error().str();

  // The refused daemon left the holder's pid in the lock file.
  std::ifstream lockFile("/dev/shm/optiflow-" + ns + ".daemon.lock");
  std::string pidText;
  lockFile >> pidText;
  EXPECT_EQ(pidText, std::to_string(::getpid()));

  Config noGroup = *config;
  noGroup.ns = ns + "-g";
  noGroup.group = "no-such-group-optiflow";
  auto grouped = Daemon::create(noGroup, nullptr, &code);
  ASSERT_FALSE(grouped.ok());
  EXPECT_EQ(code, 2);
  EXPECT_NE(grouped.error().str().find("no-such-group-optiflow"), std::string::npos);

  Daemon& d = **first;
  auto done = std::async(std::launch::async, [&] { return d.run(); });
  // A reload of a file that no longer parses keeps the running config and counts the error.
  std::ofstream(file, std::ios::trunc) << "version = 1\n[topology]\n";
  d.requestReload();
  EXPECT_DOUBLE_EQ(d.metrics().get("optiflowd_errors_total", "kind=\"config\""), 1);
  EXPECT_DOUBLE_EQ(d.metrics().get("optiflowd_config_reloads_total"), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // run() is under way: the stop reaches a running loop
  // A stop takes well under a second; the deadline is one only a hang reaches.
  d.requestStop();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "run() ignored requestStop()";
  EXPECT_EQ(done.get(), 0);
  first.value().reset();

  // The lock went with the daemon: a new one may start.
  auto again = Daemon::create(*config, nullptr, &code);
  EXPECT_TRUE(again.ok()) << (again.ok() ? "" : again.error().str());
  if (again.ok()) again.value().reset();
  schedcache::Error err;
  schedcache::Writer::remove(ns, &err);
  ::unlink(("/dev/shm/optiflow-" + ns + ".daemon.lock").c_str());
  ::unlink(("/dev/shm/optiflow-" + ns + "-g.daemon.lock").c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace optiflow::daemon
