// The CPU backend: runs lowered levels with one thread per rank, real float32 bytes and in-process transports
// between the threads, with the group semantics stock NCCL gives (a group's sends never wait; its receives complete
// before the level's successor starts). It is how the lowering is proven without a GPU, and optiflow-bench's
// `--backend cpu`.
//
// The result is judged by the reference executor's own inputs and comparison (sim::ReferenceInputs,
// sim::compareOutputs): wrong bytes are mismatches; a receive whose message never comes is a hang, detected by a
// deadline; a message nobody receives is a leftover. Never throws and never hangs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "optiflow/core/schedule.h"
#include "optiflow/exec/levels.h"
#include "optiflow/sim/reference_executor.h"

namespace optiflow::exec {

struct CpuOptions {
  int elementsPerChunk = 8;
  std::uint64_t seed = 1;
  // A receive that waits this long for its message has hung: generous, it only bounds a hang.
  std::chrono::milliseconds timeout{30000};
  std::size_t maxMismatches = 16;
};

// Runs `lowered` (a lowering of `schedule`) once with the reference inputs and compares the outputs with the
// collective's definition. Errors use sim::ErrorKind: Hang, Leftover, CountMismatch, Resource.
sim::CheckReport checkLowered(const core::Schedule& schedule, const Lowered& lowered, const CpuOptions& options = {});

// Lowers `schedule` in every mode it supports and checks each on the CPU; a lowering failure is an error of kind
// Reference in the report (with the lowering's message).
sim::CheckReport checkOnCpu(const core::Schedule& schedule, const CpuOptions& options = {});

struct CpuTiming {
  bool ok = false;
  std::string error;
  double avgUs = 0;  // wall clock per iteration, all ranks (from the start barrier to the last rank's end)
};

// Times `iterations` runs of `lowered` after `warmup` untimed ones, with `elementsPerChunk` floats per chunk.
CpuTiming timeLowered(const Lowered& lowered, std::uint64_t elementsPerChunk, int warmup, int iterations,
                      std::chrono::milliseconds timeout);

}  // namespace optiflow::exec
