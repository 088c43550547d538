// MSCCL XML import and export (the algorithm files of the MSCCL runtime, the MSCCL executor of
// Azure/msccl-executor-nccl and RCCL, msccl-tools, TACCL and TE-CCL). The mapping to core::Schedule, the three
// dialects and our extensions are documented in docs/schedule-format.md.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"

namespace optiflow::compiler {

// The MSCCL letter of an op ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop") and back.
std::string_view mscclStepType(core::StepOp op);
std::optional<core::StepOp> parseMscclStepType(std::string_view type);

// Reads an MSCCL XML algorithm in any of the three dialects (detected from the <algo> attributes: `outofplace`
// -> new; `minBytes`/`maxBytes` without `outofplace` -> old runtime; neither -> old). Structural problems
// (malformed XML, missing or unknown attributes, non-integer values, unknown step types or buffers, steps out of
// order, duplicate or missing gpu/tb ids, values beyond the parser limits) come back as a Diagnostic with line and
// column. Semantic checks (deadlock, data flow, connections) are the verifier's. Everything is kept as written,
// `hasdep` included, so exportMscclXml(importMscclXml(x)) re-imports to the same Schedule. Never throws.
core::Result<core::Schedule> importMscclXml(std::string_view text, std::string_view fileName);

// Writes s as MSCCL XML in `dialect` (default: s.dialect). A step with several dependencies is preceded by `nop`
// steps that carry all but the last one (MSCCL allows one dependency per step); later steps of the block are
// renumbered, every dependency pointing into the block is rewritten, and the targets of the moved dependencies get
// hasdep="1". Steps with at most one dependency are written as they are. The output has no XML declaration and
// keeps each element on one line, as the runtime's own minimal XML reader requires.
std::string exportMscclXml(const core::Schedule& s, std::optional<core::MscclDialect> dialect = {});
// The same text, written to `out` a rank at a time; the stream's state tells whether it was written.
void writeMscclXml(const core::Schedule& s, std::ostream& out, std::optional<core::MscclDialect> dialect = {});

// The limits the MSCCL runtimes enforce when they load a file (thread blocks per GPU and per channel, channels,
// steps per block, chunks per transfer, ...), checked on the XML that exportMscclXml would write (after nop
// insertion). One message per violation; empty when the schedule fits. Values and sources are in msccl_xml.cc
// and docs/schedule-format.md.
std::vector<std::string> checkMscclLimits(const core::Schedule& s);

}  // namespace optiflow::compiler
