// Proof and real-bytes run of MSCCL++ execution plans (mscclpp_plan.h), with the executor's own semantics
// (MSCCL++ v0.10, src/core/include/execution_kernel.hpp), as docs/mscclpp.md lays out:
//   - the operations of a thread block are ordered only by a `nop` (__syncthreads) or a `barrier` between them;
//     signals, waits, flushes, semaphore operations and port-channel puts are issued by the block's first threads
//     and keep their program order among themselves;
//   - the j-th wait on a channel completes after the j-th signal of the channel's other end; `signal`/`wait` order
//     memory (release/acquire), `rlxsignal`/`rlxwait` only order control;
//   - a port-channel put completes remotely at the next signal, pws, pwsf or flush on its channel and releases its
//     source at the next flush or pwsf (a `flush` flushes as many channels as it has dst_buff entries);
//   - a packet read waits for the one packet write of its scratch chunk (the LL flag);
//   - switch-channel operations (glres, gstore, gstorepkt) read and write the buffers of every rank of the group;
//   - a pipeline runs its operations once per slice; the proof cuts every chunk into `pipelineIterations` slices;
//     thread-block groups (tbg_info) split every range as the executor does.
// Findings use the verifier's vocabulary (Property); `step` is the index of the operation in its block (for an
// operation inside a pipeline, the index of the pipeline; the message names the inner operation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/topology.h"

namespace optiflow::compiler::mscclpp {

struct PlanVerifyOptions {
  int pipelineIterations = 2;  // slices per chunk a pipeline runs over (the proof is for this count)
  std::size_t maxErrors = 32;
  bool checkReductionOrder = true;
};

// Checks the executor's limits, the references (channels, remote buffers, switch channels, chunk ranges), the
// pairing of signals and waits (no wait without its signal, no signal left over), freedom from deadlock, the
// absence of races between unordered accesses of one chunk (a remote access needs a signal/wait or packet chain
// from the other rank, and a rank's buffers belong to the collective only after it started), and the
// postcondition by symbolic execution. Never throws.
VerifyReport verifyPlan(const Plan& plan, const PlanVerifyOptions& options = {});

// Only the executor's limits (64 operations per block, 16 channels of each type per block, 8 channels per
// operation, 16 device semaphores and barriers): one message per violation naming the limit, the rank and the block.
std::vector<std::string> checkPlanLimits(const Plan& plan);

struct PlanRunOptions {
  int elementsPerChunk = 8;  // 32-bit elements per chunk slice
  std::uint64_t seed = 1;
  int orders = 4;  // random completion orders tried (each a topological order of the plan's dependencies)
  int pipelineIterations = 2;
};

struct PlanRunReport {
  bool passed = false;
  std::vector<std::string> errors;  // the plan could not run (references, deadlock)
  std::size_t mismatches = 0;       // output chunk slices with wrong bytes, over all orders
  std::vector<std::string> firstMismatches;
  int ordersRun = 0;
};

// Runs the plan on the CPU with real bytes (wrap-around 32-bit integer sums, so that any summation order gives the
// same bits) in several random completion orders the dependencies allow, and compares every output chunk with
// the collective. Never throws.
PlanRunReport runPlan(const Plan& plan, const PlanRunOptions& options = {});

// What the plan costs on the executor, first order and uncalibrated (docs/mscclpp.md, "Predicted times"): every
// operation in the dependency order of the proof; a thread block moves data at `blockGBps` at most, a rank's
// remote writes share its NVLink bandwidth (memory channels) or its NIC (port channels); a signal reaches the
// waiting rank after the path's latency plus `signalUs` (memory channel: the fence and the flag) or
// `portSignalUs` (port channel: the proxy's post and the network); LL packets carry half their bytes as flags and
// need no signal; each nop costs `nopUs`. The plan's time is the longest path or the busiest rank's bytes over its
// bandwidth, whichever is longer, plus the launch.
struct PlanTimingParams {
  double launchUs = 4.0;
  double blockGBps = 40.0;
  double localGBps = 1000.0;
  double signalUs = 0.7;
  double portSignalUs = 3.0;
  double nopUs = 0.02;
  double llEfficiency = 0.5;
  double nvlinkEfficiency = 0.8;
  double nicEfficiency = 0.96;
};

struct PlanTiming {
  bool ok = false;
  std::string error;
  double timeUs = 0;       // the prediction
  double pathUs = 0;       // the longest dependency path (launch excluded)
  double bandwidthUs = 0;  // the busiest rank's bytes over its bandwidth
};

// `sizeBytes` follows nccl-tests (the whole buffer; AllGather: the output). The topology gives the ranks per node,
// NVLink bandwidth and latency, and the NICs.
PlanTiming timePlan(const Plan& plan, const core::Topology& topology, std::uint64_t sizeBytes,
                    const PlanTimingParams& params = {});

}  // namespace optiflow::compiler::mscclpp
