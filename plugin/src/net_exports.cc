// Layer (a): the extern "C" net tables NCCL 2.24-2.30 look up (ncclNetPlugin_v9 ... _v12), each a const data object
// of function pointers, with thin adapters that drop or reorder arguments for net_api.h and convert properties to
// each version's struct. Every adapter is noexcept and catches everything: nothing unwinds into NCCL.
#include <cstring>
#include <exception>

#include "export.h"
#include "net_api.h"
#include "optiflow/plugin/abi/nccl_net.h"

namespace {

namespace api = optiflow::plugin;

template <typename F>
ncclResult_t guarded(const char* where, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    return api::netUnexpected(where, e.what());
  } catch (...) {
    return api::netUnexpected(where, "unknown exception");
  }
}

// One device, no fusion (makeVDevice is NULL), host memory only unless the transport says more.
template <typename Props>
ncclResult_t getProperties(int dev, Props* props) noexcept {
  return guarded("getProperties", [&] {
    api::NetDeviceInfo info;
    const ncclResult_t r = api::netGetProperties(dev, props == nullptr ? nullptr : &info);
    if (r != ncclSuccess) return r;
    std::memset(props, 0, sizeof(*props));
    props->name = info.name;
    props->pciPath = info.pciPath;
    props->guid = info.guid;
    props->ptrSupport = info.ptrSupport;
    props->regIsGlobal = info.regIsGlobal;
    props->forceFlush = info.forceFlush;
    props->speed = info.speedMbps;
    props->port = info.port;
    props->latency = info.latencyUs;
    props->maxComms = info.maxComms;
    props->maxRecvs = info.maxRecvs;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = 0;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = info.maxP2pBytes;
    props->maxCollBytes = info.maxCollBytes;
    if constexpr (requires { props->maxMultiRequestSize; }) props->maxMultiRequestSize = 1;
    if constexpr (requires { props->railId; }) {
      props->railId = NCCL_NET_ID_UNDEF;
      props->planeId = NCCL_NET_ID_UNDEF;
    }
    return ncclSuccess;
  });
}

// ---- entries common to every version ----------------------------------------------------------------------------
ncclResult_t devices(int* ndev) noexcept {
  return guarded("devices", [&] { return api::netDevices(ndev); });
}
ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** /*recvDevComm*/) noexcept {
  return guarded("accept", [&] { return api::netAccept(listenComm, recvComm); });
}
ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept {
  return guarded("regMr", [&] { return api::netRegMr(comm, data, size, type, mhandle); });
}
ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                         void** mhandle) noexcept {
  return guarded("regMrDmaBuf", [&] { return api::netRegMrDmaBuf(comm, data, size, type, offset, fd, mhandle); });
}
ncclResult_t deregMr(void* comm, void* mhandle) noexcept {
  return guarded("deregMr", [&] { return api::netDeregMr(comm, mhandle); });
}
ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) noexcept {
  return guarded("iflush", [&] { return api::netIflush(recvComm, n, data, sizes, mhandles, request); });
}
ncclResult_t test(void* request, int* done, int* sizes) noexcept {
  return guarded("test", [&] { return api::netTest(request, done, sizes); });
}
ncclResult_t closeSend(void* sendComm) noexcept {
  return guarded("closeSend", [&] { return api::netCloseSend(sendComm); });
}
ncclResult_t closeRecv(void* recvComm) noexcept {
  return guarded("closeRecv", [&] { return api::netCloseRecv(recvComm); });
}
ncclResult_t closeListen(void* listenComm) noexcept {
  return guarded("closeListen", [&] { return api::netCloseListen(listenComm); });
}
ncclResult_t getDeviceMr(void* comm, void* mhandle, void** dptrMhandle) noexcept {
  return guarded("getDeviceMr", [&] { return api::netGetDeviceMr(comm, mhandle, dptrMhandle); });
}
ncclResult_t irecvConsumed(void* recvComm, int n, void* request) noexcept {
  return guarded("irecvConsumed", [&] { return api::netIrecvConsumed(recvComm, n, request); });
}

// ---- v9/v10: init once, no context -------------------------------------------------------------------------------
ncclResult_t initV9(ncclDebugLogger_t logFunction) noexcept {
  return guarded("init", [&] { return api::netInit(nullptr, 0, NCCL_NET_TRAFFIC_CLASS_UNDEF, logFunction); });
}
ncclResult_t initV10(ncclDebugLogger_t logFunction, ncclProfilerCallback_t /*profFunction*/) noexcept {
  return initV9(logFunction);
}
ncclResult_t listenV9(int dev, void* handle, void** listenComm) noexcept {
  return guarded("listen", [&] { return api::netListen(dev, handle, listenComm); });
}
ncclResult_t connectV9(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v9_t** /*sendDevComm*/) noexcept {
  return guarded("connect", [&] { return api::netConnect(dev, handle, sendComm); });
}
// The traffic class of a v10 connection is the transport's (set at init from v11 configs only).
ncclResult_t connectV10(int dev, ncclNetCommConfig_v10_t* /*config*/, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v10_t** sendDevComm) noexcept {
  return connectV9(dev, handle, sendComm, sendDevComm);
}
ncclResult_t isendV9(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) noexcept {
  return guarded("isend", [&] { return api::netIsend(sendComm, data, size, tag, mhandle, request); });
}
ncclResult_t irecvV9(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) noexcept {
  return guarded("irecv", [&] { return api::netIrecv(recvComm, n, data, sizes, tags, mhandles, request); });
}
// Profiler handles are ignored: the plugin emits no profiler events of its own.
ncclResult_t isendV10(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* /*phandle*/,
                      void** request) noexcept {
  return isendV9(sendComm, data, size, tag, mhandle, request);
}
ncclResult_t irecvV10(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                      void** /*phandles*/, void** request) noexcept {
  return irecvV9(recvComm, n, data, sizes, tags, mhandles, request);
}

// ---- v11/v12: per-communicator context ---------------------------------------------------------------------------
ncclResult_t initV11(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFunction,
                     ncclProfilerCallback_t /*profFunction*/) noexcept {
  return guarded("init", [&] {
    if (ctx == nullptr) return api::netUnexpected("init", "ctx is NULL (expected a pointer to receive the context)");
    const int trafficClass = config == nullptr ? NCCL_NET_TRAFFIC_CLASS_UNDEF : config->trafficClass;
    return api::netInit(ctx, commId, trafficClass, logFunction);
  });
}
ncclResult_t finalizeV11(void* ctx) noexcept {
  return guarded("finalize", [&] { return api::netFinalize(ctx); });
}
ncclResult_t listenV11(void* /*ctx*/, int dev, void* handle, void** listenComm) noexcept {
  return listenV9(dev, handle, listenComm);
}
ncclResult_t connectV11(void* /*ctx*/, int dev, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v11_t** sendDevComm) noexcept {
  return connectV9(dev, handle, sendComm, sendDevComm);
}
ncclResult_t setNetAttrV11(void* ctx, ncclNetAttr_v11_t* attr) noexcept {
  return guarded("setNetAttr", [&] {
    if (attr == nullptr) return ncclSuccess;
    return api::netSetNetAttr(ctx, attr->op, attr->algo, attr->proto);
  });
}

}  // namespace

extern "C" {

OPTIFLOW_EXPORT extern const ncclNet_v12_t ncclNetPlugin_v12;
OPTIFLOW_EXPORT extern const ncclNet_v11_t ncclNetPlugin_v11;
OPTIFLOW_EXPORT extern const ncclNet_v10_t ncclNetPlugin_v10;
OPTIFLOW_EXPORT extern const ncclNet_v9_t ncclNetPlugin_v9;

const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = api::kNetName,
    .init = initV11,
    .devices = devices,
    .getProperties = getProperties<ncclNetProperties_v12_t>,
    .listen = listenV11,
    .connect = connectV11,
    .accept = accept,
    .regMr = regMr,
    .regMrDmaBuf = regMrDmaBuf,
    .deregMr = deregMr,
    .isend = isendV10,
    .irecv = irecvV10,
    .iflush = iflush,
    .test = test,
    .closeSend = closeSend,
    .closeRecv = closeRecv,
    .closeListen = closeListen,
    .getDeviceMr = getDeviceMr,
    .irecvConsumed = irecvConsumed,
    .makeVDevice = nullptr,
    .finalize = finalizeV11,
    .setNetAttr = setNetAttrV11,
};

const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = api::kNetName,
    .init = initV11,
    .devices = devices,
    .getProperties = getProperties<ncclNetProperties_v11_t>,
    .listen = listenV11,
    .connect = connectV11,
    .accept = accept,
    .regMr = regMr,
    .regMrDmaBuf = regMrDmaBuf,
    .deregMr = deregMr,
    .isend = isendV10,
    .irecv = irecvV10,
    .iflush = iflush,
    .test = test,
    .closeSend = closeSend,
    .closeRecv = closeRecv,
    .closeListen = closeListen,
    .getDeviceMr = getDeviceMr,
    .irecvConsumed = irecvConsumed,
    .makeVDevice = nullptr,
    .finalize = finalizeV11,
    .setNetAttr = setNetAttrV11,
};

const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = api::kNetName,
    .init = initV10,
    .devices = devices,
    .getProperties = getProperties<ncclNetProperties_v10_t>,
    .listen = listenV9,
    .connect = connectV10,
    .accept = accept,
    .regMr = regMr,
    .regMrDmaBuf = regMrDmaBuf,
    .deregMr = deregMr,
    .isend = isendV10,
    .irecv = irecvV10,
    .iflush = iflush,
    .test = test,
    .closeSend = closeSend,
    .closeRecv = closeRecv,
    .closeListen = closeListen,
    .getDeviceMr = getDeviceMr,
    .irecvConsumed = irecvConsumed,
    .makeVDevice = nullptr,
};

const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = api::kNetName,
    .init = initV9,
    .devices = devices,
    .getProperties = getProperties<ncclNetProperties_v9_t>,
    .listen = listenV9,
    .connect = connectV9,
    .accept = accept,
    .regMr = regMr,
    .regMrDmaBuf = regMrDmaBuf,
    .deregMr = deregMr,
    .isend = isendV9,
    .irecv = irecvV9,
    .iflush = iflush,
    .test = test,
    .closeSend = closeSend,
    .closeRecv = closeRecv,
    .closeListen = closeListen,
    .getDeviceMr = getDeviceMr,
    .irecvConsumed = irecvConsumed,
    .makeVDevice = nullptr,
};

}  // extern "C"
