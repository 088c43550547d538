// Plugin logging goes through NCCL's logger, so NCCL_DEBUG / NCCL_DEBUG_SUBSYS control it like NCCL's own lines.
// Every line starts with "OptiFlow/<part>: ". TRACE lines are compiled out unless OPTIFLOW_PLUGIN_TRACE is defined.
#pragma once

#include "optiflow/plugin/abi/nccl_common.h"

#define OPTIFLOW_LOG(logger, level, subsys, fmt, ...)                                                     \
  do {                                                                                                    \
    ncclDebugLogger_t optiflowLogger_ = (logger);                                                         \
    if (optiflowLogger_ != nullptr) {                                                                     \
      optiflowLogger_((level), (subsys), __func__, __LINE__, "OptiFlow/" fmt __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                                     \
  } while (0)

#define OPTIFLOW_TUNER_WARN(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_WARN, NCCL_TUNING | NCCL_INIT, "Tuner: " fmt __VA_OPT__(, ) __VA_ARGS__)
#define OPTIFLOW_TUNER_INFO(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_INFO, NCCL_TUNING | NCCL_INIT, "Tuner: " fmt __VA_OPT__(, ) __VA_ARGS__)
#ifdef OPTIFLOW_PLUGIN_TRACE
#define OPTIFLOW_TUNER_TRACE(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_TRACE, NCCL_TUNING, "Tuner: " fmt __VA_OPT__(, ) __VA_ARGS__)
#else
#define OPTIFLOW_TUNER_TRACE(logger, fmt, ...) \
  do {                                         \
  } while (0)
#endif

// The net plugin: NCCL_DEBUG_SUBSYS=NET (INIT as well for init-time lines, which pass NCCL_INIT explicitly).
#define OPTIFLOW_NET_WARN(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_WARN, NCCL_NET, "Net: " fmt __VA_OPT__(, ) __VA_ARGS__)
#define OPTIFLOW_NET_INFO(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_INFO, NCCL_NET, "Net: " fmt __VA_OPT__(, ) __VA_ARGS__)
#define OPTIFLOW_NET_INIT_INFO(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_INFO, NCCL_NET | NCCL_INIT, "Net: " fmt __VA_OPT__(, ) __VA_ARGS__)
#ifdef OPTIFLOW_PLUGIN_TRACE
#define OPTIFLOW_NET_TRACE(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_TRACE, NCCL_NET, "Net: " fmt __VA_OPT__(, ) __VA_ARGS__)
#else
#define OPTIFLOW_NET_TRACE(logger, fmt, ...) \
  do {                                       \
  } while (0)
#endif

// The profiler plugin: NCCL_DEBUG_SUBSYS=PROFILE (INIT as well for init-time lines, which pass NCCL_INIT).
#define OPTIFLOW_PROFILER_WARN(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_WARN, NCCL_PROFILE | NCCL_INIT, "Profiler: " fmt __VA_OPT__(, ) __VA_ARGS__)
#define OPTIFLOW_PROFILER_INFO(logger, fmt, ...) \
  OPTIFLOW_LOG(logger, NCCL_LOG_INFO, NCCL_PROFILE | NCCL_INIT, "Profiler: " fmt __VA_OPT__(, ) __VA_ARGS__)
