// Layer (a): the extern "C" profiler tables NCCL 2.27-2.30 look up (ncclProfiler_v4 ... _v6), each a const data
// object of function pointers, with thin adapters that read each version's descriptor for profiler_api.h.
#include "export.h"
#include "optiflow/plugin/abi/nccl_profiler.h"
#include "profiler_api.h"

namespace {

using optiflow::plugin::kProfilerName;

template <typename Descr>
ncclResult_t startEvent(void* context, void** eHandle, Descr* eDescr) {
  if (eDescr == nullptr) {
    if (eHandle != nullptr) *eHandle = nullptr;
    return ncclSuccess;
  }
  return optiflow::plugin::profilerStartEvent(context, eHandle, static_cast<uint64_t>(eDescr->type), eDescr->parentObj,
                                              &eDescr->coll, &eDescr->kernelCh);
}

ncclResult_t initV4(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                    int nranks, int rank, ncclDebugLogger_t logfn) {
  return optiflow::plugin::profilerInit(context, commHash, eActivationMask, commName, nNodes, nranks, rank, logfn);
}

ncclResult_t initV5(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes, int nranks,
                    int rank, ncclDebugLogger_t logfn) {
  return optiflow::plugin::profilerInit(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);
}

ncclResult_t startEventV4(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr) {
  return startEvent(context, eHandle, eDescr);
}
ncclResult_t startEventV5(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr) {
  return startEvent(context, eHandle, eDescr);
}
ncclResult_t startEventV6(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr) {
  return startEvent(context, eHandle, eDescr);
}

ncclResult_t stopEvent(void* eHandle) { return optiflow::plugin::profilerStopEvent(eHandle); }

ncclResult_t recordEventState(void* eHandle, ncclProfilerEventState_v4_t eState,
                              ncclProfilerEventStateArgs_v4_t* eStateArgs) {
  return optiflow::plugin::profilerRecordEventState(eHandle, static_cast<int>(eState), eStateArgs);
}

ncclResult_t finalize(void* context) { return optiflow::plugin::profilerFinalize(context); }

}  // namespace

extern "C" {

OPTIFLOW_EXPORT extern const ncclProfiler_v6_t ncclProfiler_v6;
OPTIFLOW_EXPORT extern const ncclProfiler_v5_t ncclProfiler_v5;
OPTIFLOW_EXPORT extern const ncclProfiler_v4_t ncclProfiler_v4;

const ncclProfiler_v6_t ncclProfiler_v6 = {kProfilerName, initV5, startEventV6, stopEvent, recordEventState, finalize};
const ncclProfiler_v5_t ncclProfiler_v5 = {kProfilerName, initV5, startEventV5, stopEvent, recordEventState, finalize};
const ncclProfiler_v4_t ncclProfiler_v4 = {kProfilerName, initV4, startEventV4, stopEvent, recordEventState, finalize};

}  // extern "C"
