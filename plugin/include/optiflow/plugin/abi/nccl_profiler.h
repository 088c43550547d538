// The profiler plugin ABI, versions 4-6 (NCCL 2.27-2.30), declared from the facts of NCCL's public headers
// src/include/plugin/nccl_profiler.h and src/include/plugin/profiler/profiler_v4.h .. profiler_v6.h
// (github.com/NVIDIA/nccl); no NCCL code is copied. Field order is the ABI; the offsets OptiFlow reads are pinned
// below. Each symbol ncclProfiler_vN is a const data object. Only the union members OptiFlow reads or a host needs
// to fill are declared (coll, kernelCh); `reserved` keeps each union at least as large as NCCL's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optiflow/plugin/abi/nccl_common.h"

extern "C" {

// Event types: the bits of the activation mask and the values of a descriptor's `type`.
enum {
  ncclProfileGroup = (1 << 0),
  ncclProfileColl = (1 << 1),
  ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3),
  ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5),
  ncclProfileKernelCh = (1 << 6),
  ncclProfileNetPlugin = (1 << 7),
  ncclProfileGroupApi = (1 << 8),       // v5+
  ncclProfileCollApi = (1 << 9),        // v5+
  ncclProfileP2pApi = (1 << 10),        // v5+
  ncclProfileKernelLaunch = (1 << 11),  // v5+
  ncclProfileCeColl = (1 << 12),        // v6
  ncclProfileCeSync = (1 << 13),        // v6
  ncclProfileCeBatch = (1 << 14),       // v6
};

// State transitions (recordEventState); the kernel channel's stop is the only one OptiFlow uses. The same values in
// v4, v5 and v6.
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerKernelChStop = 22,
} ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_v4_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_v4_t ncclProfilerEventState_v6_t;

// The collective (host side): seqNumber .. proto are common to v4, v5 and v6; v5 adds parentGroup.
typedef struct {
  uint64_t seqNumber;
  const char* func;  // "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AlltoAll", ...
  void const* sendBuff;
  void* recvBuff;
  size_t count;  // NCCL's count argument (per rank for AllGather / ReduceScatter)
  int root;
  const char* datatype;  // "ncclFloat32", ...
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;   // "Ring", "Tree", "NVLS", ...
  const char* proto;  // "LL", "LL128", "Simple"
  void* parentGroup;  // v5+; absent in v4 (the union is larger anyway)
} ncclProfilerCollDescr_t;

typedef struct {
  uint8_t channelId;
  uint64_t pTimer;  // GPU globaltimer at the channel's start, ns
} ncclProfilerKernelChDescr_t;

typedef struct {
  uint8_t type;  // one of ncclProfile* (v4: 8 bits)
  void* parentObj;
  int rank;
  union {
    ncclProfilerCollDescr_t coll;
    ncclProfilerKernelChDescr_t kernelCh;
    uint8_t reserved[104];
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  uint64_t type;  // v5+: 64 bits
  void* parentObj;
  int rank;
  union {
    ncclProfilerCollDescr_t coll;
    ncclProfilerKernelChDescr_t kernelCh;
    uint8_t reserved[112];
  };
} ncclProfilerEventDescr_v5_t;

// v6 adds the copy-engine members (ceColl, ceSync, ceBatch) at the end of the union.
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    ncclProfilerCollDescr_t coll;
    ncclProfilerKernelChDescr_t kernelCh;
    uint8_t reserved[128];
  };
} ncclProfilerEventDescr_v6_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;  // GPU globaltimer at the channel's stop, ns
  } kernelCh;
} ncclProfilerEventStateArgs_v4_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;

// v4 (NCCL 2.27): commName before the communicator hash.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

// v5 (NCCL 2.28): the communicator id right after the context.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

// v6 (NCCL 2.29-2.30): v5's calls with v6's descriptor.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

}  // extern "C"

static_assert(sizeof(ncclProfiler_v4_t) == 48 && sizeof(ncclProfiler_v5_t) == 48 && sizeof(ncclProfiler_v6_t) == 48);
static_assert(offsetof(ncclProfilerEventDescr_v4_t, parentObj) == 8 &&
              offsetof(ncclProfilerEventDescr_v4_t, rank) == 16);
static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll) == 24 && offsetof(ncclProfilerEventDescr_v5_t, coll) == 24 &&
              offsetof(ncclProfilerEventDescr_v6_t, coll) == 24);
static_assert(offsetof(ncclProfilerCollDescr_t, func) == 8 && offsetof(ncclProfilerCollDescr_t, count) == 32 &&
              offsetof(ncclProfilerCollDescr_t, datatype) == 48 && offsetof(ncclProfilerCollDescr_t, nChannels) == 56 &&
              offsetof(ncclProfilerCollDescr_t, algo) == 64 && offsetof(ncclProfilerCollDescr_t, proto) == 72);
static_assert(offsetof(ncclProfilerKernelChDescr_t, pTimer) == 8);
static_assert(sizeof(ncclProfilerEventStateArgs_v4_t) == 8);
