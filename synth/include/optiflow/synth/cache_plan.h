// A run directory's plan.json (synth/plan.h documents it) as the schedule cache holds it: one PlanItem per
// collective and size entry, with the NCCL-native decision the tuner applies on stock NCCL and the synthesized
// schedule's files for `optiflow cache show|verify`. Used by `optiflow cache publish` and optiflowd.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "optiflow/core/error.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::synth {

// Reads PLAN_DIR/plan.json (format "optiflow-plan", version 1). Per entry: the range [min_bytes, max_bytes], the
// decision from "native" (no algorithm when native is absent or null, its time_us is 0 or its algorithm or
// protocol is a name the cache does not know), the times, and from "best" (may be null) the absolute paths of
// schedule_json/schedule_xml with the schedule id (scheduleFileId of the JSON file). Plan::source is planDir made
// absolute. The plan must pass schedcache::validatePlan.
//
// With verify, every referenced schedule file (JSON and XML) must load, pass compiler::verify and be the entry's
// collective on its ranks. Errors name the file (plan.json, with the entry path such as
// collectives[0].entries[3].native.algorithm, or the schedule file with the first finding) and what was expected.
// Never throws.
core::Result<schedcache::Plan> loadPlanForCache(const std::filesystem::path& planDir, bool verify);

// The plan file loadPlanForCache reads, as its errors name it (absolute): an error naming another file is about a
// schedule the plan references (the CLI tells bad input from a schedule that fails its checks by this).
std::filesystem::path planFileFor(const std::filesystem::path& planDir);

// CRC-64 (XZ) of a schedule file's bytes; never 0 (0 means "no schedule" in the cache).
std::uint64_t scheduleFileId(std::string_view bytes);

// The checks a schedule file of `item` passes before a plan naming it is published (and `optiflow cache verify`
// repeats): it exists, loads, is item's collective on item's ranks and the verifier proves it. `ref` says who names
// the file ("collectives[0].entries[2].best.schedule_json (in /runs/a/plan.json)"); the error names the file.
std::optional<core::Diagnostic> checkScheduleFile(const std::filesystem::path& file, const std::string& ref,
                                                  const schedcache::PlanItem& item);

}  // namespace optiflow::synth
