// The net plugin ABI, versions 9-12 (NCCL 2.24-2.30), declared from the facts of NCCL's public headers
// src/include/plugin/net/net_v9.h .. net_v12.h and src/include/plugin/nccl_net.h (github.com/NVIDIA/nccl); no NCCL
// code is copied. Field order is the ABI; the struct sizes and the property offsets are pinned below. Each symbol
// ncclNetPlugin_vN is a const data object. CollNet is not declared: we export none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optiflow/plugin/abi/nccl_common.h"

inline constexpr int NCCL_NET_HANDLE_MAXSIZE = 128;
inline constexpr int NCCL_PTR_HOST = 0x1;
inline constexpr int NCCL_PTR_CUDA = 0x2;
inline constexpr int NCCL_PTR_DMABUF = 0x4;
inline constexpr int NCCL_NET_MAX_REQUESTS = 32;
inline constexpr int NCCL_NET_MAX_DEVS_PER_NIC_V9 = 4;  // also v10 and v11
inline constexpr int NCCL_NET_MAX_DEVS_PER_NIC_V12 = 8;
inline constexpr int NCCL_NET_TRAFFIC_CLASS_UNDEF = -1;
inline constexpr int NCCL_NET_ID_UNDEF = -1;  // v12 railId / planeId

extern "C" {

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
} ncclNetDeviceType;

// Device offload handle (same layout v9-v12); a host-only plugin never fills one.
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v12_t;

// v10+: a plugin may emit its own profiler events through this.
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                               void* extData);

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
  int trafficClass;  // NCCL_NET_TRAFFIC_CLASS_UNDEF: the plugin's default
} ncclNetCommConfig_v10_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;

// v9 and v10 share one layout.
typedef struct {
  char* name;
  char* pciPath;  // NULL for a virtual device
  uint64_t guid;
  int ptrSupport;   // NCCL_PTR_* mask
  int regIsGlobal;  // registrations are not tied to one comm
  int forceFlush;
  int speed;  // Mbps
  int port;
  float latency;  // µs; 0: NCCL's default
  int maxComms;
  int maxRecvs;  // largest n of a grouped irecv
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;  // 1: no multi-request
} ncclNetProperties_v11_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;   // NCCL_NET_ID_UNDEF when unknown
  int16_t planeId;  // NCCL_NET_ID_UNDEF when unknown
} ncclNetProperties_v12_t;

// setNetAttr hints (v11+): per direction, then bitmasks of collective, algorithm and protocol (-1: undefined).
typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

// v9 (NCCL 2.24-2.25): init once per process; sizes are size_t except in iflush and test.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

// v10 (NCCL 2.26-2.27): profiler callback in init, comm config in connect, profiler handles in isend/irecv.
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

// v11 (NCCL 2.28-2.29): init and finalize per communicator with a context that listen and connect receive.
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v11_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

// v12 (NCCL 2.30): v11's functions with v12 properties (8 fused devices, rail and plane ids).
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

}  // extern "C"

// Sizes and offsets as NCCL's own v9-v11 declarations lay them out on x86-64; v12 properties from the field list
// of NCCL 2.30's net_v12.h.
static_assert(sizeof(ncclNet_v9_t) == 160 && sizeof(ncclNet_v10_t) == 160);
static_assert(sizeof(ncclNet_v11_t) == 176 && sizeof(ncclNet_v12_t) == 176);
static_assert(offsetof(ncclNet_v9_t, test) == 13 * 8 && offsetof(ncclNet_v9_t, makeVDevice) == 19 * 8);
static_assert(offsetof(ncclNet_v10_t, connect) == 5 * 8 && offsetof(ncclNet_v10_t, makeVDevice) == 19 * 8);
static_assert(offsetof(ncclNet_v11_t, finalize) == 20 * 8 && offsetof(ncclNet_v11_t, setNetAttr) == 21 * 8);
static_assert(offsetof(ncclNet_v12_t, finalize) == 20 * 8 && offsetof(ncclNet_v12_t, setNetAttr) == 21 * 8);

static_assert(sizeof(ncclNetProperties_v9_t) == 104);
static_assert(sizeof(ncclNetProperties_v11_t) == 112);
static_assert(sizeof(ncclNetProperties_v12_t) == 128);
static_assert(offsetof(ncclNetProperties_v11_t, guid) == 16 && offsetof(ncclNetProperties_v11_t, ptrSupport) == 24 &&
              offsetof(ncclNetProperties_v11_t, regIsGlobal) == 28 &&
              offsetof(ncclNetProperties_v11_t, forceFlush) == 32 && offsetof(ncclNetProperties_v11_t, speed) == 36 &&
              offsetof(ncclNetProperties_v11_t, port) == 40 && offsetof(ncclNetProperties_v11_t, latency) == 44 &&
              offsetof(ncclNetProperties_v11_t, maxComms) == 48 && offsetof(ncclNetProperties_v11_t, maxRecvs) == 52 &&
              offsetof(ncclNetProperties_v11_t, netDeviceType) == 56 &&
              offsetof(ncclNetProperties_v11_t, netDeviceVersion) == 60 &&
              offsetof(ncclNetProperties_v11_t, vProps) == 64 && offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88 &&
              offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96 &&
              offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64 && offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88 &&
              offsetof(ncclNetProperties_v9_t, maxCollBytes) == 96);
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64 &&
              offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104 &&
              offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112 &&
              offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120 &&
              offsetof(ncclNetProperties_v12_t, railId) == 124 && offsetof(ncclNetProperties_v12_t, planeId) == 126);
static_assert(sizeof(ncclNetDeviceHandle_v9_t) == 32 && sizeof(ncclNetCommConfig_v10_t) == 4);
static_assert(sizeof(ncclNetAttr_v11_t) == 44 && offsetof(ncclNetAttr_v11_t, op) == 32);
static_assert(sizeof(ncclNetVDeviceProps_v9_t) == 20 && sizeof(ncclNetVDeviceProps_v12_t) == 36);
