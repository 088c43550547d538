// The native schedule file: versioned JSON that holds every field of core::Schedule, so that
// parseScheduleJson(scheduleToJson(s)) == s for every schedule. The format is documented in docs/schedule-format.md.
//
// The sanity limits below are applied by every schedule parser (this one and the MSCCL XML importer), so a hostile
// or corrupt file cannot make a later stage (verifier, simulator, executor) allocate without bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"

namespace optiflow::core {

inline constexpr std::string_view kScheduleJsonFormat = "optiflow-schedule";
inline constexpr int kScheduleJsonVersion = 1;

// Parser limits (see docs/schedule-format.md, "Limits"). Far above any real schedule (the largest public MSCCL
// file has 32 ranks and 128 chunks), far below what would exhaust memory.
inline constexpr int kMaxScheduleRanks = 16384;                   // n_ranks / ngpus
inline constexpr int kMaxScheduleChannels = 4096;                 // n_channels, channel ids
inline constexpr int kMaxScheduleChunks = 1 << 20;                // per buffer, per loop; offsets and counts
inline constexpr std::int64_t kMaxScheduleTotalChunks = 1 << 26;  // sum of all buffers over all ranks
inline constexpr int kMaxScheduleBlockId = 1 << 20;               // thread block ids (and dependency block ids)
inline constexpr int kMaxScheduleStepIndex = 1 << 20;             // dependency step indices
inline constexpr int kMaxScheduleThreads = 1 << 16;               // nthreads
inline constexpr std::size_t kMaxScheduleNesting = 64;            // JSON nesting depth

// Readable spellings used by the JSON format; parse functions return nullopt for anything else.
std::string_view toString(MscclDialect d);  // "new", "old-runtime", "old"
std::optional<MscclDialect> parseMscclDialect(std::string_view s);
std::optional<StepOp> parseStepOp(std::string_view s);          // toString(StepOp) names
std::optional<BufferKind> parseBufferKind(std::string_view s);  // "input", "output", "scratch"

// Serialises s. indent >= 0: one line per field at the top level, one line per rank header, block header and step,
// nested by `indent` spaces per level; indent < 0: everything on one line. Never throws.
std::string scheduleToJson(const Schedule& s, int indent = 1);
// The same text, written to `out` a piece at a time (a schedule of 1024 ranks is hundreds of MB of text). The
// stream's state tells whether it was written.
void writeScheduleJson(const Schedule& s, std::ostream& out, int indent = 1);

// Parses a native schedule file. Syntax errors carry line and column; schema errors name the JSON path
// (e.g. "ranks[3].threadblocks[0].steps[7].op") with what was expected and what was found, and the line and
// column of the offending value. Unknown keys are rejected. Never throws.
Result<Schedule> parseScheduleJson(std::string_view text, std::string_view fileName);

}  // namespace optiflow::core
