// The deterministic compiler: intent IR (core/intent.h) + topology + message size -> a verified schedule IR.
// It routes every transfer (relays become two hops through the relay's scratch), places every value in a buffer
// slot (input, output, or scratch for partial sums and relayed data), derives the per-chunk dependencies (data,
// and the write-after-read / write-after-write orderings buffer reuse needs, in both buffer modes), fuses a
// receive with the send it feeds into one receive-and-forward step, assigns channels and thread blocks within
// the executor's limits, and orders every thread block's steps by list scheduling (docs/compiler.md). The result
// always goes through the verifier; a schedule that is not proven is an internal error, never an output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/compiler/verifier.h"
#include "optiflow/core/error.h"
#include "optiflow/core/intent.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"

namespace optiflow::compiler {

// What the executor we export to accepts. msccl() is the MSCCL executor of NCCL (the "new" dialect, the
// strictest of those checkMscclLimits knows); none() drops every limit but the IR's own.
struct ExecutorLimits {
  int maxChannels = 32;
  int maxBlocksPerChannel = 32;
  int maxBlocksPerRank = 1024;
  int maxStepsPerBlock = 64;
  // MSCCL's per-step count limit (< 72) needs no field: every step the compiler emits carries one chunk.
  static ExecutorLimits msccl() { return {}; }
  static ExecutorLimits none() { return {1 << 20, 1 << 20, 1 << 20, 1 << 30}; }
};

struct CompileOptions {
  // The message size (nccl-tests convention) the schedule is tuned for; 0 = size-independent defaults.
  std::uint64_t sizeBytes = 0;
  std::optional<core::Protocol> protocol;  // unset: chosen from the size (docs/compiler.md)
  int channels = 0;                        // parallel copies of every connection; 0 = choose
  // Every intent chunk is cut into this many schedule chunks; 0 = as many as channels. Up to one slice per
  // channel, a chunk's slices ride different channels side by side; with more slices than channels they ride one
  // channel one after another and the chunks are spread over the channels (docs/compiler.md).
  int slices = 0;
  ExecutorLimits limits = ExecutorLimits::msccl();
  // Past this many transfers (after slicing) a build whose steps the bounds already put over the executor's limit
  // is not made (it takes about 250 bytes per transfer): the channels go up as if it had counted the bounds' least.
  // Below, it is made, for the steps it counts lead the channels further (docs/compiler.md, step 8).
  std::size_t boundedBuildsAbove = std::size_t{1} << 18;
  bool verify = true;  // run the verifier (turn off only in benchmarks of the compiler itself)
};

struct CompileResult {
  core::Schedule schedule;  // supports both buffer modes (in-place and out-of-place)
  VerifyReport report;      // proven when options.verify
  core::Protocol protocol = core::Protocol::Simple;
  int channels = 1;
  int slices = 1;
  std::size_t hops = 0;   // point-to-point transfers after routing and slicing
  std::size_t fused = 0;  // receives fused with the send they feed
  std::string summary;    // one line: "12 thread blocks/rank max, 3 channels, Simple, 4 slices, ..."
};

// The error of a compile that ran out of memory: the one failure that says nothing about the program or options.
inline constexpr std::string_view kOutOfMemory = "out of memory while compiling";

// Errors: a malformed intent (validateIntent), limits that cannot be met (naming the limit and what exceeded it),
// sizes beyond the IR's limits, kOutOfMemory, or (a bug) a schedule the verifier did not prove, with its first
// findings.
core::Result<CompileResult> compile(const core::IntentProgram& intent, const core::Topology& topology,
                                    const CompileOptions& options = {});

namespace detail {
class Scheduler;
}

// compile() in two halves: compileLayout() routes, fuses and places every step (thread blocks, channels,
// connections, within the executor's limits); compile(Layout&&) orders every block's steps, emits and verifies.
// The layout's schedule has compile()'s thread blocks, channels and steps, each block's steps in the order they
// were created and waiting for nothing: not a runnable schedule, but it gives what does not depend on the order of
// steps (the bytes every link carries, every block's work: sim::lowerBoundUs with one exact iteration), so a search
// can set an option aside after half the work of compiling it. One case differs: when no order of the fused steps
// runs, compile() starts again with its fallbacks (docs/compiler.md, "Ordering"), and its schedule has more steps
// than the layout. A layout refers to the intent, topology and options it was made from: they must outlive it.
class Layout {
 public:
  Layout(Layout&&) noexcept;
  Layout& operator=(Layout&&) noexcept;
  ~Layout();

  core::Schedule schedule;  // compile(Layout&&) does not need it: a caller may move it out

 private:
  Layout();
  friend core::Result<Layout> compileLayout(const core::IntentProgram&, const core::Topology&, const CompileOptions&);
  friend core::Result<CompileResult> compile(Layout&& layout);

  const core::IntentProgram* intent_ = nullptr;
  const core::Topology* topology_ = nullptr;
  const CompileOptions* options_ = nullptr;
  std::unique_ptr<detail::Scheduler> sch_;  // placed, not ordered; its protocol, channels and slices are the layout's
};

// Errors are compile()'s.
core::Result<Layout> compileLayout(const core::IntentProgram& intent, const core::Topology& topology,
                                   const CompileOptions& options);
// The same result as compile() of the layout's intent, topology and options; a layout compiles once.
core::Result<CompileResult> compile(Layout&& layout);

// The protocol the compiler picks for `sizeBytes` when none is given.
core::Protocol chooseProtocol(const core::IntentProgram& intent, std::uint64_t sizeBytes);

}  // namespace optiflow::compiler
