// OptiFlow's own declarations of the parts of NCCL's plugin ABI every plugin shares, declared from the facts of
// NCCL's public headers (github.com/NVIDIA/nccl, versions 2.21-2.30): src/nccl.h.in (ncclResult_t),
// src/include/nccl_common.h (log levels, subsystems, the logger type, ncclFunc_t) and src/include/plugin/nccl_tuner.h
// (algorithm and protocol indices). NCCL's identifiers are kept verbatim; no NCCL code is copied, NCCL's headers are
// never included, and nothing links libnccl.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

typedef enum {
  NCCL_INIT = 0x1,
  NCCL_COLL = 0x2,
  NCCL_P2P = 0x4,
  NCCL_SHM = 0x8,
  NCCL_NET = 0x10,
  NCCL_GRAPH = 0x20,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALLOC = 0x100,
  NCCL_CALL = 0x200,
  NCCL_PROXY = 0x400,
  NCCL_NVLS = 0x800,
  NCCL_BOOTSTRAP = 0x1000,
  NCCL_REG = 0x2000,
  NCCL_PROFILE = 0x4000,
  NCCL_RAS = 0x8000,
  NCCL_ALL = ~0,
} ncclDebugLogSubSys;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

// Only values 0-4 reach a tuner (NCCL_NUM_FUNCTIONS = 5).
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclNumFuncs = 8,
} ncclFunc_t;

}  // extern "C"

// Indices into the cost table (NCCL_ALGO_* / NCCL_PROTO_*). NCCL_NUM_ALGORITHMS was 6 (no PAT) in 2.21-2.22.
inline constexpr int NCCL_ALGO_UNDEF = -1;
inline constexpr int NCCL_ALGO_TREE = 0;
inline constexpr int NCCL_ALGO_RING = 1;
inline constexpr int NCCL_ALGO_COLLNET_DIRECT = 2;
inline constexpr int NCCL_ALGO_COLLNET_CHAIN = 3;
inline constexpr int NCCL_ALGO_NVLS = 4;
inline constexpr int NCCL_ALGO_NVLS_TREE = 5;
inline constexpr int NCCL_ALGO_PAT = 6;
inline constexpr int NCCL_NUM_ALGORITHMS = 7;
inline constexpr int NCCL_PROTO_UNDEF = -1;
inline constexpr int NCCL_PROTO_LL = 0;
inline constexpr int NCCL_PROTO_LL128 = 1;
inline constexpr int NCCL_PROTO_SIMPLE = 2;
inline constexpr int NCCL_NUM_PROTOCOLS = 3;
inline constexpr float NCCL_ALGO_PROTO_IGNORE = -1.0f;
