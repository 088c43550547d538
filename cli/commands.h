// The optiflow subcommands that report times: simulate, bound, baseline. Each prints a table (or JSON rows with
// the same fields: size_bytes, time_us, algbw_gbps, busbw_gbps) and always shows the lower bound beside a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/calib/calibration_file.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;

// Two predictions of one time (the simulator's and NCCL's own model's) further apart than this share of the smaller
// are reported as a disagreement, by calibrate and synthesize alike.
inline constexpr double kModelDisagreement = 0.10;
inline bool modelsDisagree(double a, double b) { return std::abs(a - b) > kModelDisagreement * std::min(a, b); }

struct PerfArgs {
  std::string topology = "dgx-a100";
  std::string collective = "allreduce";
  std::string sizes = "1KiB:1GiB";
  std::string launch = "graph";  // graph | host: the kernel launch the simulator charges
  std::string protocol;          // simulate: force LL | LL128 | Simple (default: the schedule's own)
  bool json = false;
  bool simulateNccl = false;          // baseline: also time NCCL's own algorithm as a schedule with the simulator
  std::string calibration;            // CAL.toml (docs/calibration.md); empty: the uncalibrated models
  core::TopologyHints topologyHints;  // --nodes, --gpu, --nic-gbps (NCCL topology XML)
};

struct CompileArgs {
  std::string program;
  std::string topology;
  std::string size;  // empty: size-independent defaults
  std::string format = "json";
  std::string output;
  std::string protocol;  // empty: chosen from the size
  int channels = 0;
  int slices = 0;
  int root = 0;
  std::string limits = "msccl";
  std::string calibration;
  core::TopologyHints topologyHints;  // --nodes, --gpu, --nic-gbps (NCCL topology XML)
};

struct CompareArgs {
  std::vector<std::string> programs;
  std::string topology;
  std::string collective = "allgather";
  std::string sizes = "1KiB:1GiB:4";
  std::string launch = "graph";
  int root = 0;
  bool json = false;
  bool verbose = false;
  std::string calibration;
  core::TopologyHints topologyHints;  // --nodes, --gpu, --nic-gbps (NCCL topology XML)
};

struct SynthArgs {
  std::string topology;
  std::string collective = "allgather";
  std::string sizes = "1KiB:1GiB:4";
  std::string proposer = "builtin";     // builtin | llm
  std::string evaluator = "simulator";  // simulator | hardware
  std::string launcher;                 // hardware: the command, with {batch} and {out}
  double launcherTimeoutS = 1800;
  std::string llmUrl;
  std::string llmModel;
  std::string llmApiKeyFile;
  double llmTimeoutS = 120;
  int rounds = 8;
  int candidates = 8;  // per round
  double timeBudgetS = 0;
  std::uint64_t seed = 1;
  std::string out;  // empty: optiflow-runs/<topology>-<collective>
  bool resume = false;
  bool force = false;
  std::string launch = "graph";
  int root = 0;
  bool json = false;
  bool quiet = false;
  std::string calibration;
  core::TopologyHints topologyHints;  // --nodes, --gpu, --nic-gbps (NCCL topology XML)
};

// `optiflow calibrate LOG... --topo T [--topo T2 ...] [-o CAL.toml]`: fits both models to nccl-tests logs
// (docs/calibration.md).
struct CalibrateArgs {
  std::vector<std::string> logs;
  std::vector<std::string> topologies;  // one per node count of the logs, all one kind of node
  std::string output;                   // CAL.toml to write; empty: print only
  std::string calibration;              // check this calibration against the logs instead of fitting one
  std::string collective;               // only runs of this collective
  bool json = false;
  core::TopologyHints topologyHints;  // --gpu, --nic-gbps; --nodes (else a one-node file spans the logs' counts)
};

// --topo with its hints, through core::loadTopology (preset, TOML or NCCL topology XML); prints what was assumed as
// notes and the error, if any, to stderr.
std::optional<core::Topology> topologyArg(const std::string& spec, const core::TopologyHints& hints);

// --calibration PATH for `topo`: nullopt (after printing why) when it cannot be read or does not apply; an empty
// optional when `path` is empty.
std::optional<std::optional<calib::Calibration>> calibrationArg(const std::string& path, const core::Topology& topo);
// The simulator's parameters for `launch` ("graph" or "host"), calibrated when `cal` has a value.
sim::SimParams simParamsFor(const std::optional<calib::Calibration>& cal, const std::string& launch);

struct ReportArgs {
  std::string dir;
  std::string output;  // empty: DIR/report.html
};

// `optiflow cache publish|show|verify|clear|rails`: the per-node schedule cache (/dev/shm/optiflow-<namespace>) the
// NCCL tuner plugin reads.
struct CacheArgs {
  std::string ns;         // empty: $OPTIFLOW_NAMESPACE, else "default"
  std::string planDir;    // publish: run directory of `optiflow synthesize`
  std::string group;      // publish: group that may read the segment (mode 0660); empty: owner only (0600)
  bool noVerify = false;  // publish: skip proving the referenced schedules
  bool json = false;      // show
  bool remove = false;    // clear: delete the segment
  bool force = false;     // clear --remove: even with communicators initialised in the last kPinAdoptWindowS
  std::vector<std::string> railWeights;  // rails set: NAME=WEIGHT
};

// MSCCL++ execution plans (cli/mscclpp_commands.cc). mscclppPlanText: the file's text when it is an MSCCL++ plan
// (told by content), nullopt otherwise (not one, or unreadable: the caller's own loader reports that).
std::optional<std::string> mscclppPlanText(const std::string& path);
int runVerifyMscclpp(const std::string& path, const std::string& text, bool json);
int runCheckMscclpp(const std::string& path, const std::string& text, bool json, int elements, std::uint64_t seed);
// `optiflow convert FILE --to mscclpp`: the schedule (JSON or MSCCL XML) as an MSCCL++ plan.
int runConvertToMscclpp(const std::string& path, int ranksPerNode, const std::string& mode, const std::string& out);
// `optiflow export mscclpp RUN_DIR -o DIR`: every winning schedule of a run as proven MSCCL++ plans (one per
// collective, buffer mode and size range) and DIR/manifest.json saying what each serves.
int runExportMscclpp(const std::string& runDir, const std::string& outDir);
// `optiflow simulate PLAN.json`: the MSCCL++ plan's predicted time per size (compiler::mscclpp::timePlan) beside
// the lower bound.
int runSimulateMscclpp(const std::string& path, const std::string& text, const core::Topology& topology,
                       const std::vector<std::uint64_t>& sizes, bool json);

int runCalibrate(const CalibrateArgs& args);
int runCompile(const CompileArgs& args);
int runCompare(const CompareArgs& args);
int runSynthesize(const SynthArgs& args);
int runReport(const ReportArgs& args);
int runSimulate(const std::string& scheduleFile, const PerfArgs& args);
int runBound(const PerfArgs& args);
int runBaseline(const PerfArgs& args);
int runCachePublish(const CacheArgs& args);
int runCacheShow(const CacheArgs& args);
int runCacheVerify(const CacheArgs& args);
int runCacheClear(const CacheArgs& args);
int runCacheRails(const CacheArgs& args);
int runCacheRailsSet(const CacheArgs& args);
int runCacheMeasurements(const CacheArgs& args);

}  // namespace optiflow::cli
