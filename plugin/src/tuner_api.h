// Layer (b) of the tuner plugin: NCCL's arguments in, ncclResult_t out. Validates arguments, catches everything,
// never lets an exception or an abort (unless OPTIFLOW_ABORT_ON_ERROR=1) reach NCCL. The per-version tables in
// tuner_exports.cc are thin adapters over these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "optiflow/plugin/abi/nccl_common.h"

namespace optiflow::plugin {

inline constexpr const char* kTunerName = "OptiFlow";

ncclResult_t tunerInit(void** context, std::optional<std::uint64_t> commId, std::size_t nRanks, std::size_t nNodes,
                       ncclDebugLogger_t logFunction) noexcept;
ncclResult_t tunerGetCollInfo(void* context, ncclFunc_t collType, std::size_t nBytes, float** collCostTable,
                              int numAlgo, int numProto, int* nChannels) noexcept;
ncclResult_t tunerGetCollInfoV2(void* context, ncclFunc_t collType, std::size_t nBytes, int collNetSupport,
                                int nvlsSupport, int* algorithm, int* protocol, int* nChannels) noexcept;
ncclResult_t tunerGetChunkSize(void* context, ncclFunc_t collType, std::size_t nBytes, int algorithm, int protocol,
                               std::size_t* chunkSize) noexcept;
ncclResult_t tunerFinalize(void* context) noexcept;

}  // namespace optiflow::plugin
