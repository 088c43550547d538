// PlanItem <-> PlanEntry: the one place where core's words become the NCCL indices the segment stores, and back.
// The writer (and the plan hash, which hashes what the segment stores) and the reader use these; nothing else does.
#pragma once

#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::schedcache::detail {

// Decision fields, times and schedule id; jsonPath/xmlPath are kNoString (the writer interns the paths). What
// validatePlan rejects stays rejectable: a collective without an ncclFunc_t index becomes 0xff, an out-of-range
// algorithm or protocol keeps its integer.
PlanEntry toEntry(const PlanItem& item);
// The inverse for an entry checkSlotContent accepted; paths are left empty (the reader resolves the offsets).
PlanItem fromEntry(const PlanEntry& entry);
// One trial candidate, both ways.
TrialEntry toTrialEntry(const TrialCandidate& candidate);
TrialCandidate fromTrialEntry(const TrialEntry& entry);

}  // namespace optiflow::schedcache::detail
