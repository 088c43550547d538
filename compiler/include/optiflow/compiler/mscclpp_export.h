// Schedule IR -> MSCCL++ v0.10 execution plan (docs/mscclpp.md, "Export"). Every transfer of the schedule becomes
// a one-sided write into a scratch slot of the receiver that no other transfer uses (a put plus a signal, or LL
// packets that carry their own flag), and the receive step consumes the slot locally (copy, reduce, or the fused
// res/respkt that also forwards). Memory channels inside a node, port channels between nodes. Thread blocks of a
// rank that the schedule links by dependencies become one MSCCL++ block (program order carries the dependency);
// a block beyond the executor's 64 operations is split into blocks chained by device semaphores. The result is
// proven with mscclpp::verifyPlan before it is returned.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"

namespace optiflow::compiler::mscclpp {

struct ExportOptions {
  int ranksPerNode = 0;                         // 0: every rank on one node (memory channels only)
  std::optional<core::BufferMode> mode;         // unset: in-place where the schedule supports it, else out-of-place
  std::optional<std::uint64_t> minMessageSize;  // unset: the schedule's minBytes
  std::optional<std::uint64_t> maxMessageSize;  // unset: the schedule's maxBytes (0 there: no upper limit)
  bool packets = true;  // LL schedules use packet operations where every step has one (else Simple operations)
  std::string name;     // unset: the schedule's name
  // The caller has proven this very schedule in every mode it supports (compiler::verify, e.g. the synthesis loop's
  // winners): the export does not prove it again. The exported plan is proven either way.
  bool scheduleProven = false;
};

struct ExportResult {
  Plan plan;
  std::vector<std::string> notes;  // choices the caller may want to print (protocol fallback, splits)
  int splitBlocks = 0;             // blocks added to stay within 64 operations per block
};

// Errors: a schedule that is not proven, a collective MSCCL++ plans cannot express (Broadcast and Reduce carry no
// root in a plan; custom collectives), a buffer mode the schedule does not support, an executor limit that cannot
// be met (naming the limit and the rank), or (a bug) an exported plan the verifier does not prove.
core::Result<ExportResult> exportPlan(const core::Schedule& schedule, const ExportOptions& options = {});

}  // namespace optiflow::compiler::mscclpp
