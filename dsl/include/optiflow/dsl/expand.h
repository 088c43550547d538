// Expansion: a parsed program evaluated on a topology, checked, and turned into the intent IR (core/intent.h).
// Every error names the statement's line and column and says what is wrong in the program's own terms
// ("rank 5 already holds rank 9's contribution to block 3: reducing it again would count it twice").
#pragma once

#include <cstdint>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/ast.h"

namespace optiflow::dsl {

struct ExpandOptions {
  int root = 0;  // Broadcast and Reduce
  // Refuse programs that would produce more transfers or loop iterations than this (hostile or runaway input).
  std::uint64_t maxTransfers = 64u << 20;
  std::uint64_t maxIterations = 16u << 20;
  std::size_t maxErrors = 20;
};

struct ExpandResult {
  std::optional<core::IntentProgram> intent;  // set when errors is empty
  std::vector<core::Diagnostic> errors;
  bool ok() const { return intent.has_value(); }
};

// `fileName` labels the diagnostics. Checks, besides evaluation errors (unknown names, division by zero, ranks
// out of range, empty or duplicated groups): that every group operation and send fits the collective and the
// data's state at that point (no copy over a different partial value, no contribution counted twice, nothing
// sent that the sender does not hold), that the strategy supports the operation and the group (e.g. recursive
// doubling needs a power-of-two group), and at the end that every rank holds what the collective defines (the
// first missing piece named: "at the end rank 3 lacks block 17 (rank 17's data)").
ExpandResult expand(const Program& program, const core::Topology& topology, std::string_view fileName,
                    const ExpandOptions& options = {});

}  // namespace optiflow::dsl
