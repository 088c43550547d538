// The tuner plugin ABI, versions 2-6 (NCCL 2.21-2.30), declared from the facts of NCCL's public headers
// src/include/plugin/tuner/tuner_v2.h .. tuner_v6.h and src/include/plugin/nccl_tuner.h (github.com/NVIDIA/nccl); no
// NCCL code is copied. Field order is the ABI; sizes are pinned below. Each symbol ncclTunerPlugin_vN is a const data
// object.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optiflow/plugin/abi/nccl_common.h"

extern "C" {

// v2 (NCCL 2.21): context last in init; getCollInfo chooses algorithm/protocol directly.
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v2_t;

// v3 (NCCL 2.22-2.23): the cost table. collCostTable is really float[numAlgo][numProto], cast to float**.
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v3_t;

// v4 (NCCL 2.24-2.27): regBuff before nChannels.
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

// The communicator's live tuning constants (µs, GB/s); a tuner may edit them in init. Layout from NCCL's core
// tuner_v5.h, which includes perChMaxNVLSTreeBws (the example plugin's copy lacks it).
typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} ncclTunerConstants_v5_t;

// v5 (NCCL 2.28-2.29): context first in init, which also receives the communicator id.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

// v6 (NCCL 2.30): v5 plus an optional getChunkSize (NULL allowed).
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v6_t* nvlDomainInfo, ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algorithm, int protocol,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

}  // extern "C"

static_assert(sizeof(ncclTuner_v2_t) == 32 && sizeof(ncclTuner_v3_t) == 32 && sizeof(ncclTuner_v4_t) == 32);
static_assert(sizeof(ncclTuner_v5_t) == 32 && sizeof(ncclTuner_v6_t) == 40);
static_assert(offsetof(ncclTuner_v6_t, getChunkSize) == 32);
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(sizeof(ncclTunerConstants_v5_t) == 1152);
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 7 * 3 * 8);
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == 1152 - 12 * 8);
