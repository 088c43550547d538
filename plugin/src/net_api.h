// Layer (b) of the net plugin: NCCL's arguments in, ncclResult_t out, version-neutral. Owns the process-wide state
// (the Transport, its telemetry, the init reference count), wraps the transport's objects in the handles NCCL holds
// (listen/send/recv comms, requests), keeps re-entered connects keyed by the handle buffer, validates every argument,
// catches everything, and aborts on the first error only when OPTIFLOW_ABORT_ON_ERROR=1. The per-version tables in
// net_exports.cc are thin adapters over these.
//
// Lifetime: the transport is created by the first successful init. v9/v10 init is called once per process and holds
// it for the life of the process; from v11 every communicator inits and finalizes, and the transport is destroyed
// when the last context is finalized and no comm it made is still open.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optiflow/plugin/abi/nccl_common.h"

namespace optiflow::plugin {

inline constexpr const char* kNetName = "OptiFlow";

// One device's properties, before conversion to a version's struct. The strings live as long as the process.
struct NetDeviceInfo {
  char* name = nullptr;
  char* pciPath = nullptr;  // nullptr for a virtual device
  std::uint64_t guid = 0;
  int ptrSupport = 0;
  int regIsGlobal = 0;
  int forceFlush = 0;
  int speedMbps = 0;
  int port = 0;
  float latencyUs = 0;
  int maxComms = 0;
  int maxRecvs = 0;
  std::size_t maxP2pBytes = 0;
  std::size_t maxCollBytes = 0;
};

// v9/v10: ctx == nullptr (one init per process; later calls succeed without re-reading anything). v11+: *ctx gets a
// per-communicator context for finalize. trafficClass: -1 when undefined.
ncclResult_t netInit(void** ctx, std::uint64_t commId, int trafficClass, ncclDebugLogger_t logFunction) noexcept;
ncclResult_t netFinalize(void* ctx) noexcept;
ncclResult_t netDevices(int* ndev) noexcept;
ncclResult_t netGetProperties(int dev, NetDeviceInfo* out) noexcept;
ncclResult_t netListen(int dev, void* handle, void** listenComm) noexcept;
ncclResult_t netConnect(int dev, void* handle, void** sendComm) noexcept;
ncclResult_t netAccept(void* listenComm, void** recvComm) noexcept;
ncclResult_t netRegMr(void* comm, void* data, std::size_t size, int type, void** mhandle) noexcept;
ncclResult_t netRegMrDmaBuf(void* comm, void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                            void** mhandle) noexcept;
ncclResult_t netDeregMr(void* comm, void* mhandle) noexcept;
ncclResult_t netIsend(void* sendComm, void* data, std::size_t size, int tag, void* mhandle, void** request) noexcept;
ncclResult_t netIrecv(void* recvComm, int n, void** data, const std::size_t* sizes, const int* tags, void** mhandles,
                      void** request) noexcept;
ncclResult_t netIflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles, void** request) noexcept;
ncclResult_t netTest(void* request, int* done, int* sizes) noexcept;
ncclResult_t netCloseSend(void* sendComm) noexcept;
ncclResult_t netCloseRecv(void* recvComm) noexcept;
ncclResult_t netCloseListen(void* listenComm) noexcept;
// Host-only plugin: no device-side memory handles and nothing to do when the device consumed a receive.
ncclResult_t netGetDeviceMr(void* comm, void* mhandle, void** dptrMhandle) noexcept;
ncclResult_t netIrecvConsumed(void* recvComm, int n, void* request) noexcept;
// v11+ hints (bitmasks of op/algo/proto, peer and flow counts): accepted, logged at TRACE, not acted on.
ncclResult_t netSetNetAttr(void* ctx, std::uint32_t op, std::uint32_t algo, std::uint32_t proto) noexcept;

// For the export layer's catch blocks: logs "<where>: <what>" and returns ncclInternalError (or aborts when
// OPTIFLOW_ABORT_ON_ERROR=1).
ncclResult_t netUnexpected(const char* where, const char* what) noexcept;

}  // namespace optiflow::plugin
