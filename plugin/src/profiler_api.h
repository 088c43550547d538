// Layer (b) of the profiler plugin: NCCL's arguments in, ncclResult_t out; nothing thrown across. The per-version
// tables in profiler_exports.cc are thin adapters over these; the timing logic is optiflow::profiler (layer c).
// Every call but init and finalize is on NCCL's per-event path: no allocation, lock, system call or log line.
#pragma once

#include <cstdint>

#include "optiflow/plugin/abi/nccl_profiler.h"

namespace optiflow::plugin {

inline constexpr const char* kProfilerName = "OptiFlow";
// Collective and kernel-channel events only: the cheapest set that times a collective on the GPU.
inline constexpr int kProfilerMask = ncclProfileColl | ncclProfileKernelCh;

ncclResult_t profilerInit(void** context, std::uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                          int nRanks, int rank, ncclDebugLogger_t logFunction) noexcept;
// The version-neutral part of a descriptor: its type, parent, and the members OptiFlow reads.
ncclResult_t profilerStartEvent(void* context, void** eHandle, std::uint64_t type, void* parentObj,
                                const ncclProfilerCollDescr_t* coll,
                                const ncclProfilerKernelChDescr_t* kernelCh) noexcept;
ncclResult_t profilerStopEvent(void* eHandle) noexcept;
ncclResult_t profilerRecordEventState(void* eHandle, int eState,
                                      const ncclProfilerEventStateArgs_v4_t* eStateArgs) noexcept;
ncclResult_t profilerFinalize(void* context) noexcept;

}  // namespace optiflow::plugin
