// The verifier: a symbolic proof that a schedule computes its collective. Nothing reaches a plan or the cache
// unless verify() returned proven == true.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"

namespace optiflow::compiler {

// The property a finding is about; the names are stable and appear in CLI and JSON output.
enum class Property : std::uint8_t {
  Shape,          // declared sizes, ranks, chunk counts, root, custom kind
  Reference,      // a step names a buffer range, peer, block or dependency that does not exist
  Connection,     // two blocks of a rank share a (peer, channel) connection in the same direction
  Matching,       // sends and receives on a connection do not pair up (count, order, leftovers)
  Deadlock,       // the dependency graph including send->receive waits has a cycle, or a step waits forever
  Race,           // two unordered steps touch the same chunk and at least one writes it
  Uninitialized,  // a step reads a chunk that holds no defined data
  ReducedTwice,   // a reduction combines a contribution that is already present
  Postcondition,  // an output chunk ends with the wrong contents (missing or wrong contributions)
  HasDep,         // a step is waited on but does not publish its completion (MSCCL's hasdep="0")
  ReductionOrder  // (warning) ranks reduce the same output chunk in different orders
};

std::string_view toString(Property p);

enum class Severity : std::uint8_t { Error, Warning };

struct Finding {
  Severity severity = Severity::Error;
  Property property = Property::Shape;
  // Mode-independent findings (shape, references, connections, matching, hasdep, deadlock) carry the first mode.
  core::BufferMode mode = core::BufferMode::OutOfPlace;
  int rank = -1;  // -1 where not tied to one
  int tb = -1;    // thread block id
  int step = -1;  // step index in the block
  std::string message;

  // "rank 3 tb 1 step 4 (in-place): [race] ..." with the location parts that are known.
  std::string str() const;
};

struct VerifyOptions {
  std::size_t maxErrors = 32;  // stop collecting after this many errors (the verdict stays "not proven")
  bool checkReductionOrder = true;
  // Entries of the race passes' clock matrices (32-bit each) held at once; the ranks go in groups that fit it.
  std::int64_t clockBudget = std::int64_t{1} << 24;
  // Past it the verifier gives up: not proven, VerifyReport::timedOut set (the synthesis loop's time budget).
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

struct VerifyReport {
  bool proven = false;
  std::vector<core::BufferMode> modesChecked;
  std::vector<Finding> errors;
  std::vector<Finding> warnings;
  std::size_t steps = 0;
  std::size_t transfers = 0;           // matched send/receive pairs
  std::size_t suppressedErrors = 0;    // errors found after maxErrors was reached (not in `errors`)
  std::size_t suppressedWarnings = 0;  // likewise for warnings
  bool timedOut = false;               // VerifyOptions::deadline passed: not proven, nothing found either
  bool beyondBudget = false;           // too large for a pass's budget (the plan verifier): not proven, not disproven
};

// Checks, for every mode in core::supportedModes: shape and references, one connection per (peer, channel) and
// direction, send/receive matching, freedom from deadlock (program order + dependencies + send->receive waits
// acyclic), absence of data races (happens-before via vector clocks), then a symbolic execution proving that every
// constrained output chunk holds exactly core::expectedOutput. Never throws and never crashes on malformed input:
// broken references are reported as Property::Reference and the later phases are skipped.
VerifyReport verify(const core::Schedule& schedule, const VerifyOptions& options = {});

}  // namespace optiflow::compiler
