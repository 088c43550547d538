// The reference executor: runs a schedule on the CPU with real bytes, one thread per rank, real buffers and
// real float32 sums, and compares every output chunk with a direct computation of the collective. It is the test
// oracle for everything that produces schedules.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"

namespace optiflow::sim {

struct CheckOptions {
  int elementsPerChunk = 8;                      // float32 elements in one chunk
  std::optional<core::BufferMode> mode;          // default: every mode the schedule supports
  std::uint64_t seed = 1;                        // input values are derived from it
  std::chrono::milliseconds timeout{30000};      // a schedule that makes no progress this long has hung
  std::size_t maxMismatches = 16;                // mismatches listed (all are counted)
};

struct Mismatch {
  core::BufferMode mode = core::BufferMode::OutOfPlace;
  int rank = 0;
  int outputIndex = 0;  // chunk index in the logical output buffer
  int element = 0;      // first differing float in the chunk
  float expected = 0;
  float actual = 0;
};

struct CheckReport {
  bool passed = false;
  std::vector<core::BufferMode> modesRun;
  std::size_t mismatchCount = 0;
  std::vector<Mismatch> mismatches;
  std::vector<std::string> errors;  // hang, bad reference, count mismatch on a connection, ...
  std::chrono::microseconds elapsed{0};
};

CheckReport runReference(const core::Schedule& schedule, const CheckOptions& options = {});

}  // namespace optiflow::sim
