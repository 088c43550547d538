// optiflow-bench's CUDA + NCCL backend (built only where CUDA and NCCL were found; see exec/CMakeLists.txt). The CPU
// backend is in the library (bench.h).
#pragma once

#include <memory>

#include "optiflow/core/error.h"
#include "optiflow/exec/bench.h"
#include "optiflow/exec/rendezvous.h"

namespace optiflow::exec {

#if OPTIFLOW_BENCH_HAVE_CUDA
// Joins the run (rendezvous, NCCL communicator) on this process's GPU.
core::Result<std::unique_ptr<BenchBackend>> makeCudaBackend(const BenchOptions& options, const LaunchInfo& launch);
#endif

}  // namespace optiflow::exec
