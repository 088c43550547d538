// `optiflow report DIR`: a self-contained HTML page (inline SVG, no scripts, no network) for a run directory
// (plan.h): per collective, busbw against message size for NCCL's choice, the best NCCL-native configuration, the
// discovered schedules and the lower bound, the way nccl-tests users read their curves; the table behind it; and
// how the best time per size improved round by round (from history.jsonl).
#pragma once

#include <filesystem>
#include <string>

#include "optiflow/core/error.h"

namespace optiflow::synth {

// Reads DIR/plan.json (required) and DIR/history.jsonl (optional); errors name the file and what was wrong.
core::Result<std::string> renderReport(const std::filesystem::path& dir);

}  // namespace optiflow::synth
