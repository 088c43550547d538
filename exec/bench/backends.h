// optiflow-bench's backends: the CPU one (always built) and the CUDA + NCCL one (built only where CUDA and NCCL
// were found; see exec/CMakeLists.txt).
#pragma once

#include <memory>

#include "optiflow/core/error.h"
#include "optiflow/exec/bench.h"
#include "optiflow/exec/rendezvous.h"

namespace optiflow::exec {

std::unique_ptr<BenchBackend> makeCpuBackend();

#if OPTIFLOW_BENCH_HAVE_CUDA
// Joins the run (rendezvous, NCCL communicator) on this process's GPU.
core::Result<std::unique_ptr<BenchBackend>> makeCudaBackend(const BenchOptions& options, const LaunchInfo& launch);
#endif

}  // namespace optiflow::exec
