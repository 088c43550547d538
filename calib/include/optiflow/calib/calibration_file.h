// The calibration file (CAL.toml) `optiflow calibrate` writes and every command with --topo reads
// (--calibration), as does optiflowd ([topology] calibration). One reader and one writer; docs/calibration.md
// documents every key.
//
// A calibration belongs to a kind of node and fabric, not to a node count: it names the GPU, GPUs per node, NICs
// per node and their bandwidth it was fitted on, and applies to any topology with the same four.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/topology.h"
#include "optiflow/sim/calibration.h"

namespace optiflow::calib {

inline constexpr int kCalibrationVersion = 1;

// A log the calibration was fitted on.
struct CalibrationSource {
  std::string file;
  std::string collective;  // core::toString name
  int ranks = 0;
  int nodes = 0;
  int rows = 0;            // rows used
  int incompleteRows = 0;  // rows cut off or unreadable
  std::string launch;      // "graph" or "host"
  int ncclVersion = 0;     // 0: the log does not say
};

// One model's fitted parameters and how well they fit their source rows.
struct ModelFit {
  sim::ModelCalibration params;
  std::vector<std::string> fitted;  // the keys the fit moved (the rest had no row that depends on them)
  double medianErrorPctBefore = 0;  // median |predicted - measured| / measured, uncalibrated
  double medianErrorPct = 0;        // the same, calibrated
  double maxErrorPct = 0;           // calibrated
};

// Per source row: the measurement and both models' predictions of NCCL's choice before and after.
struct Residual {
  std::string file;
  int line = 0;
  std::string collective;
  std::uint64_t sizeBytes = 0;
  std::string choice;  // NCCL's algorithm/protocol/channels, e.g. "Ring/LL128/16"
  double measuredUs = 0;
  double simulatorBeforeUs = 0;
  double simulatorUs = 0;
  double ncclModelBeforeUs = 0;
  double ncclModelUs = 0;
};

struct Calibration {
  std::string file;  // where it was read from (empty when built in memory)
  std::string writtenBy;
  // The kind of node and fabric.
  std::string gpu;
  int gpusPerNode = 0;
  int nicsPerNode = 0;
  double nicGBps = 0;    // per NIC per direction
  std::string fittedOn;  // the topology's name
  std::vector<CalibrationSource> sources;
  ModelFit simulator;
  ModelFit ncclModel;
  // The model with the smaller calibrated median error on the source rows (the worse of all rows and the rows from
  // 16 MiB; the simulator only where it times every row): what reports trust where the two disagree. "simulator" or
  // "nccl-model".
  std::string believe;
  std::vector<Residual> residuals;
};

core::Result<Calibration> parseCalibration(std::string_view text, std::string_view file);
core::Result<Calibration> readCalibrationFile(const std::filesystem::path& file);
std::string formatCalibration(const Calibration& c);

// Empty when `c` applies to `topo` (same GPU, GPUs per node, NICs per node and NIC bandwidth; any node count), else
// why not, naming both.
std::string appliesTo(const Calibration& c, const core::Topology& topo);
// Reads `file` and checks it applies to `topo`: the one call of every command that takes --calibration.
core::Result<Calibration> loadCalibrationFor(const std::filesystem::path& file, const core::Topology& topo);

}  // namespace optiflow::calib
