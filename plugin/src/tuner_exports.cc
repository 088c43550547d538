// Layer (a): the extern "C" tuner tables NCCL 2.21-2.30 look up (ncclTunerPlugin_v2 ... _v6), each a const data
// object of function pointers, with thin adapters that reorder arguments for tuner_api.h.
#include "export.h"
#include "optiflow/plugin/abi/nccl_tuner.h"
#include "tuner_api.h"

namespace {

using optiflow::plugin::kTunerName;

ncclResult_t initV2(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) {
  return optiflow::plugin::tunerInit(context, std::nullopt, nRanks, nNodes, logFunction);
}

ncclResult_t getCollInfoV2(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                           int /*numPipeOps*/, int* algorithm, int* protocol, int* nChannels) {
  return optiflow::plugin::tunerGetCollInfoV2(context, collType, nBytes, collNetSupport, nvlsSupport, algorithm,
                                              protocol, nChannels);
}

ncclResult_t getCollInfoV3(void* context, ncclFunc_t collType, size_t nBytes, int /*numPipeOps*/, float** collCostTable,
                           int numAlgo, int numProto, int* nChannels) {
  return optiflow::plugin::tunerGetCollInfo(context, collType, nBytes, collCostTable, numAlgo, numProto, nChannels);
}

ncclResult_t getCollInfoV4(void* context, ncclFunc_t collType, size_t nBytes, int /*numPipeOps*/, float** collCostTable,
                           int numAlgo, int numProto, int /*regBuff*/, int* nChannels) {
  return optiflow::plugin::tunerGetCollInfo(context, collType, nBytes, collCostTable, numAlgo, numProto, nChannels);
}

// The constants are left as NCCL filled them: our plans choose among NCCL's algorithms, not re-fit its model.
ncclResult_t initV5(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                    ncclNvlDomainInfo_v5_t* /*nvlDomainInfo*/, ncclTunerConstants_v5_t* /*constants*/) {
  return optiflow::plugin::tunerInit(context, commId, nRanks, nNodes, logFunction);
}

ncclResult_t getChunkSizeV6(void* context, ncclFunc_t collType, size_t nBytes, int algorithm, int protocol,
                            int /*nChannels*/, size_t* chunkSize) {
  return optiflow::plugin::tunerGetChunkSize(context, collType, nBytes, algorithm, protocol, chunkSize);
}

ncclResult_t finalize(void* context) { return optiflow::plugin::tunerFinalize(context); }

}  // namespace

extern "C" {

OPTIFLOW_EXPORT extern const ncclTuner_v6_t ncclTunerPlugin_v6;
OPTIFLOW_EXPORT extern const ncclTuner_v5_t ncclTunerPlugin_v5;
OPTIFLOW_EXPORT extern const ncclTuner_v4_t ncclTunerPlugin_v4;
OPTIFLOW_EXPORT extern const ncclTuner_v3_t ncclTunerPlugin_v3;
OPTIFLOW_EXPORT extern const ncclTuner_v2_t ncclTunerPlugin_v2;

const ncclTuner_v6_t ncclTunerPlugin_v6 = {kTunerName, initV5, getCollInfoV4, finalize, getChunkSizeV6};
const ncclTuner_v5_t ncclTunerPlugin_v5 = {kTunerName, initV5, getCollInfoV4, finalize};
const ncclTuner_v4_t ncclTunerPlugin_v4 = {kTunerName, initV2, getCollInfoV4, finalize};
const ncclTuner_v3_t ncclTunerPlugin_v3 = {kTunerName, initV2, getCollInfoV3, finalize};
const ncclTuner_v2_t ncclTunerPlugin_v2 = {kTunerName, initV2, getCollInfoV2, finalize};

}  // extern "C"
