// The reference executor: runs a schedule on the CPU with real bytes, one thread per rank, real buffers and
// real float32 sums, and compares every output chunk with a direct computation of the collective. It is the test
// oracle for everything that produces schedules.
//
// Inputs are small positive integers stored as float (their sum over all ranks stays below 2^24), so every
// reduction order gives the same bits and outputs are compared bitwise. Memory the collective leaves undefined
// (scratch, output, inputs the collective does not read) starts as a signalling-NaN pattern, so a schedule that
// reads garbage shows up as a mismatch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"

namespace optiflow::sim {

struct CheckOptions {
  int elementsPerChunk = 8;                  // float32 elements in one chunk
  std::optional<core::BufferMode> mode;      // default: every mode the schedule supports
  std::uint64_t seed = 1;                    // input values are derived from it
  std::chrono::milliseconds timeout{30000};  // a schedule that makes no progress this long has hung
  std::size_t maxMismatches = 16;            // mismatches listed (all are counted)
};

struct Mismatch {
  core::BufferMode mode = core::BufferMode::OutOfPlace;
  int rank = 0;
  int outputIndex = 0;  // chunk index in the logical output buffer
  int element = 0;      // first differing float in the chunk
  float expected = 0;
  float actual = 0;
  int differing = 0;  // floats of the chunk that differ
};

// What an entry of CheckReport::errors is about.
enum class ErrorKind : std::uint8_t {
  Shape,          // the schedule's shape cannot describe its collective, or a bad option
  Reference,      // a step names a buffer range, peer, block or dependency that does not exist
  Connection,     // two blocks of a rank use the same (peer, channel) connection in the same direction
  CountMismatch,  // a receive's count differs from the message at the head of its connection
  Hang,           // no rank could make progress (deadlock) or nothing completed within the timeout
  Leftover,       // a message was sent but never received
  Resource,       // buffers could not be allocated or threads started
};

std::string_view toString(ErrorKind k);

struct CheckReport {
  bool passed = false;
  std::vector<core::BufferMode> modesRun;
  std::size_t mismatchCount = 0;  // mismatched output chunks, over all modes
  std::vector<Mismatch> mismatches;
  std::vector<std::string> errors;    // hang, bad reference, count mismatch on a connection, ...
  std::vector<ErrorKind> errorKinds;  // parallel to errors
  std::chrono::microseconds elapsed{0};

  bool hasError(ErrorKind k) const;
};

// Never throws for a bad schedule and never hangs: problems come back in the report.
CheckReport runReference(const core::Schedule& schedule, const CheckOptions& options = {});

// The reference executor's inputs and its output check, shared with every other executor of real bytes (exec's CPU
// backend), so that all of them are judged by one comparison with the collective's definition.
//
// Input values: integers in [1, range] as float, derived from the seed (see the top of this file).
class ReferenceInputs {
 public:
  ReferenceInputs(const core::Schedule& s, std::uint64_t seed, int elementsPerChunk);
  // Element `element` of chunk `chunk` of rank `rank`'s logical input buffer.
  float at(int rank, int chunk, std::size_t element) const;
  int elementsPerChunk() const { return static_cast<int>(epc_); }

 private:
  float compute(int rank, int chunk, std::size_t element) const;

  std::uint64_t seed_;
  std::size_t epc_;
  std::uint32_t range_;
  std::vector<float> table_;
  std::vector<std::size_t> offsets_;
  std::vector<int> chunks_;
};

// The value memory the collective leaves undefined starts with: a signalling NaN no input or sum can produce.
float poisonValue();

// Compares every constrained output chunk of every rank, in `mode`, with the collective's definition computed from
// `inputs`; outputChunk(rank, index) is that rank's logical output chunk (elementsPerChunk floats), or null for a
// rank the caller does not hold (a process of a multi-process run checks its own rank). Mismatches are
// counted in report.mismatchCount and the first maxMismatches are listed in report.mismatches.
void compareOutputs(const core::Schedule& s, core::BufferMode mode, const ReferenceInputs& inputs,
                    const std::function<const float*(int rank, int outputIndex)>& outputChunk,
                    std::size_t maxMismatches, CheckReport& report);

}  // namespace optiflow::sim
