// The fit behind `optiflow calibrate`: nccl-tests rows become observations of NCCL's own choice on a topology, and
// the parameters both models share (calibration.h) are fitted to them, each model on its own, by least squares on
// log time (Levenberg-Marquardt, weak priors at the defaults so that a parameter no row constrains stays where it
// was). docs/calibration.md describes the method and its limits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/calib/calibration_file.h"
#include "optiflow/calib/nccl_tests_log.h"
#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/calibration.h"
#include "optiflow/sim/nccl_model.h"

namespace optiflow::calib {

// One measured size: what the fit matches.
struct Observation {
  std::string file;
  int line = 0;
  core::Collective collective = core::Collective::AllReduce;
  std::uint64_t sizeBytes = 0;
  double measuredUs = 0;
  sim::LaunchMode launch = sim::LaunchMode::Host;
  int ncclVersion = 0;  // 0: the log does not say
  int topology = 0;     // index into Observations::topologies: the cluster the row was measured on
};

struct Observations {
  // One kind of node at one or more node counts: every row names the one its run matched.
  std::vector<core::Topology> topologies;
  std::vector<Observation> rows;
  std::vector<CalibrationSource> sources;
  std::vector<std::string> notes;  // rows and runs left out, and why
};

struct FitOptions {
  std::optional<core::Collective> collective;  // only runs of this collective (all when empty)
  int maxIterations = 60;
  int threads = 0;  // simulations in parallel; 0: one per hardware thread
};

// The rows of `logs` that can be matched on `topo`. An error when a run's rank or node count differs from the
// topology's (naming the file and both counts), when a run names no ranks, or when no row is left.
core::Result<Observations> observationsFrom(const std::vector<NcclTestsLog>& logs, const core::Topology& topo,
                                            const FitOptions& options = {});
// The same against several node counts of one kind of node (an error when they are not one kind): each run goes to
// the topology with its rank and node count. Logs of two node counts tell a network hop's latency from the fixed
// latency, which one node count cannot.
core::Result<Observations> observationsFrom(const std::vector<NcclTestsLog>& logs,
                                            const std::vector<core::Topology>& topos, const FitOptions& options = {});

// Both models' predictions of every observation under `cal` (identity parameters give the uncalibrated models), as
// residual rows; simulatorUs is -1 where NCCL's choice has no schedule (NVLS, PAT, CollNet), and the choice column
// names it.
std::vector<Residual> predict(const Observations& obs, const sim::ModelCalibration& sim,
                              const sim::ModelCalibration& model);

// Median and maximum |predicted - measured| / measured in percent over the rows with a prediction (>= minSize);
// -1 when there is none.
struct ErrorSummary {
  int rows = 0;
  double medianPct = -1;
  double maxPct = -1;
};
// From this size nccl-tests rows are bandwidth-bound on every cluster in docs/calibration.md: reports give the
// error from here up beside the overall one, and `believe` weighs both.
inline constexpr std::uint64_t kBandwidthBoundBytes = 16u << 20;
enum class Model : std::uint8_t { SimulatorBefore, Simulator, NcclModelBefore, NcclModel };
ErrorSummary summarize(const std::vector<Residual>& rows, Model which, std::uint64_t minSize = 0);

// Fits both models to `obs`; the result has the kind of node, sources, both fits, believe and residuals filled in.
Calibration fitCalibration(const Observations& obs, const FitOptions& options = {});

}  // namespace optiflow::calib
