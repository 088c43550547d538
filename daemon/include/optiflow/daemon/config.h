// optiflowd's configuration: a TOML file with a `version` key (docs/config.md documents every key; the example is
// daemon/etc/optiflowd.toml), then OPTIFLOW_* environment overrides. Every key is validated: an unknown key, a wrong
// type or a value out of range is an error naming the file, the line and the key, and what was expected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/calib/calibration_file.h"
#include "optiflow/core/env.h"
#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"

#include "optiflow/synth/llm_client.h"

namespace optiflow::daemon {

inline constexpr int kConfigVersion = 1;

enum class Role { kStandalone, kLeader, kFollower };

// [llm]: the LLM client's own settings (synth::LlmConfig: endpoint = baseUrl, model, timeout_s; one type for the CLI
// and the daemon) and the name of the variable the key is read from, never the key itself.
struct LlmSettings {
  synth::LlmConfig client = [] {
    synth::LlmConfig c;
    c.timeoutS = 60;
    c.maxAttempts = 2;  // a dead endpoint must not hold a pass for minutes: the builtin proposer stands in
    return c;
  }();
  std::string apiKeyEnv = "OPENAI_API_KEY";
};

struct Config {
  std::filesystem::path file;  // where it was read from (for logs and SIGHUP)

  // [cache]
  std::string ns = "default";  // OPTIFLOW_NAMESPACE
  std::string group;           // segment mode 0660 for this group ("" -> 0600)

  // [topology]: exactly one of preset / file / nccl_topo_dump
  std::string preset;                  // e.g. "dgx-a100x4"
  std::filesystem::path topologyFile;  // our TOML topology
  std::filesystem::path ncclTopoDump;  // NCCL_TOPO_DUMP_FILE XML
  int nodes = 0;                       // with nccl_topo_dump: how many such nodes the job spans (0: 1)
  // optiflow calibrate's CAL.toml (docs/calibration.md), read with the config; it must fit the topology's kind of
  // node (loadConfiguredTopology checks). Synthesis times with the calibrated simulator.
  std::filesystem::path calibrationFile;
  std::optional<calib::Calibration> calibration;

  // [synthesis]
  std::string proposer = "builtin";  // builtin | llm
  std::string evaluator = "simulator";
  std::vector<std::string> collectives = {"allgather", "reducescatter", "allreduce"};  // before any activity is seen
  std::vector<std::uint64_t> sizes;  // bytes; empty: 1 KiB .. 1 GiB, x4 steps
  int rounds = 4;
  int candidatesPerRound = 8;
  double intervalS = 600;  // re-synthesize a workload at most this often
  // Calls each NCCL-native candidate of a plan entry gets on a communicator's first calls (NCCL's own choice and the
  // decision, until both are measured; docs/profiler.md); 0: no trials.
  int trialCalls = 10;
  std::filesystem::path stateDir;  // run directories; "" -> $STATE_DIRECTORY, /var/lib/optiflow, or a temp dir
  std::uint64_t seed = 1;

  LlmSettings llm;  // [llm], used when proposer = "llm"

  // [budget]
  double cpuCores = 1.0;      // the work never uses more CPU time than this many cores (0.05 .. 64)
  int nice = 10;              // applied to the work threads (0 .. 19)
  double busyCallsPerS = 50;  // the node's jobs are busy while their tuner calls exceed this rate
  double idleWindowS = 2;     // a gap must last this long before heavy work resumes

  // [probe]
  bool probeEnabled = true;
  std::string probeListen = "127.0.0.1:0";  // host:port of this daemon's probe responder ("" disables it)
  std::vector<std::string> probePeers;      // host:port of other nodes' responders
  double probeIntervalS = 300;
  std::uint64_t probeBytes = 16ull << 20;

  // [metrics]
  std::string metricsAddress = "127.0.0.1";
  int metricsPort = 9464;  // OPTIFLOW_METRICS_PORT; 0: a free port (logged; in <state dir>/<namespace>/metrics.port)

  // [share]
  Role role = Role::kStandalone;
  std::filesystem::path shareDir;  // leader: copies each published plan here; follower: publishes what it finds

  // [log]
  std::string logLevel = "info";  // OPTIFLOW_LOG_LEVEL: trace|debug|info|warn|error
  bool logJson = false;           // one JSON object per line (structured logs)
};

// Reads an environment variable (nullptr: unset). A null GetEnv means "no environment" (tests).
using core::env::GetEnv;
// The process environment (std::getenv), for the daemon and the CLI.
using core::env::processEnv;

// Reads and validates `file`, then applies overrides: OPTIFLOW_NAMESPACE, OPTIFLOW_METRICS_PORT,
// OPTIFLOW_LOG_LEVEL, OPTIFLOW_PROPOSER, OPTIFLOW_STATE_DIR (core::env::kDaemonParams; an override that does not
// parse is an error naming the variable). Errors: "optiflowd.toml:12: [budget] cpu_cores = 0: expected a number of
// cores in 0.05..64". A variable set to the empty string counts as unset. Relative paths in the file are relative to
// its directory.
core::Result<Config> loadConfig(const std::filesystem::path& file, GetEnv getEnv);
// The same over text already read; `file` names it in diagnostics and anchors relative paths.
core::Result<Config> parseConfig(std::string_view text, const std::filesystem::path& file, GetEnv getEnv);

// The topology the config names: the preset, the TOML file (core::loadTopologyFile), or the NCCL topology dump
// (NCCL_TOPO_DUMP_FILE XML, `nodes` such nodes). Errors name the file and what was missing, or why the calibration
// does not apply to it.
core::Result<core::Topology> loadConfiguredTopology(const Config& config);

// The state directory to use (Config::stateDir, else $STATE_DIRECTORY, /var/lib/optiflow when writable, else
// $TMPDIR/optiflowd-<uid>), created if needed.
core::Result<std::filesystem::path> resolveStateDir(const Config& config, GetEnv getEnv);

}  // namespace optiflow::daemon
