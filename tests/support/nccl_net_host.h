// NCCL as the host of a net plugin, for the ABI and multi-process tests: ncclNetPlugin_v9 ... _v12 behind one
// interface, as NCCL's per-version shims present them to its proxy. Shared by tests/abi/net_abi_test.cc and
// tests/multiproc/net_peer.cc.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "optiflow/plugin/abi/nccl_net.h"

namespace optiflow::testsupport {

class NcclNetHost {
 public:
  // `logger` gets the plugin's log lines; `commId` is what NCCL 2.29+ passes to init (v11, v12).
  NcclNetHost(ncclDebugLogger_t logger, std::uint64_t commId) : logger_(logger), commId_(commId) {}

  // Takes ncclNetPlugin_v<abi> from `lib`; false when the library does not export it.
  bool load(void* lib, int abi) {
    abi_ = abi;
    void* t = dlsym(lib, ("ncclNetPlugin_v" + std::to_string(abi)).c_str());
    v9_ = abi == 9 ? static_cast<const ncclNet_v9_t*>(t) : nullptr;
    v10_ = abi == 10 ? static_cast<const ncclNet_v10_t*>(t) : nullptr;
    v11_ = abi == 11 ? static_cast<const ncclNet_v11_t*>(t) : nullptr;
    v12_ = abi == 12 ? static_cast<const ncclNet_v12_t*>(t) : nullptr;
    return ok();
  }
  bool ok() const { return v9_ || v10_ || v11_ || v12_; }
  int abi() const { return abi_; }
  ncclResult_t init() {
    ncclNetCommConfig_v11_t config{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    if (v9_) return v9_->init(logger_);
    if (v10_) return v10_->init(logger_, nullptr);
    if (v11_) return v11_->init(&ctx_, commId_, &config, logger_, nullptr);
    return v12_->init(&ctx_, commId_, &config, logger_, nullptr);
  }
  ncclResult_t finalize() {
    if (v11_) return v11_->finalize(ctx_);
    if (v12_) return v12_->finalize(ctx_);
    return ncclSuccess;
  }
  ncclResult_t listen(int dev, void* handle, void** lc) {
    if (v9_) return v9_->listen(dev, handle, lc);
    if (v10_) return v10_->listen(dev, handle, lc);
    if (v11_) return v11_->listen(ctx_, dev, handle, lc);
    return v12_->listen(ctx_, dev, handle, lc);
  }
  ncclResult_t connect(int dev, void* handle, void** sc) {
    ncclNetDeviceHandle_v9_t* devComm = nullptr;
    ncclNetCommConfig_v10_t config{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    if (v9_) return v9_->connect(dev, handle, sc, &devComm);
    if (v10_) return v10_->connect(dev, &config, handle, sc, &devComm);
    if (v11_) return v11_->connect(ctx_, dev, handle, sc, &devComm);
    return v12_->connect(ctx_, dev, handle, sc, &devComm);
  }
  ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) {
    if (v9_) return v9_->isend(sc, data, size, tag, mh, req);
    return v10plus([&](auto* t) { return t->isend(sc, data, size, tag, mh, nullptr, req); });
  }
  ncclResult_t irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
    if (v9_) return v9_->irecv(rc, n, data, sizes, tags, mhs, req);
    void* phandles[8] = {};
    return v10plus([&](auto* t) { return t->irecv(rc, n, data, sizes, tags, mhs, phandles, req); });
  }
  template <typename F>
  ncclResult_t all(F f) {
    if (v9_) return f(v9_);
    return v10plus(f);
  }
  ncclResult_t devices(int* n) {
    return all([&](auto* t) { return t->devices(n); });
  }
  ncclResult_t accept(void* lc, void** rc) {
    ncclNetDeviceHandle_v9_t* devComm = nullptr;
    return all([&](auto* t) { return t->accept(lc, rc, &devComm); });
  }
  ncclResult_t regMr(void* comm, void* data, size_t size, void** mh) {
    return all([&](auto* t) { return t->regMr(comm, data, size, NCCL_PTR_HOST, mh); });
  }
  ncclResult_t deregMr(void* comm, void* mh) {
    return all([&](auto* t) { return t->deregMr(comm, mh); });
  }
  ncclResult_t test(void* req, int* done, int* sizes) {
    return all([&](auto* t) { return t->test(req, done, sizes); });
  }
  ncclResult_t closeSend(void* c) {
    return all([&](auto* t) { return t->closeSend(c); });
  }
  ncclResult_t closeRecv(void* c) {
    return all([&](auto* t) { return t->closeRecv(c); });
  }
  ncclResult_t closeListen(void* c) {
    return all([&](auto* t) { return t->closeListen(c); });
  }
  const ncclNet_v9_t* v9() const { return v9_; }
  const ncclNet_v10_t* v10() const { return v10_; }
  const ncclNet_v11_t* v11() const { return v11_; }
  const ncclNet_v12_t* v12() const { return v12_; }
  void* ctx() const { return ctx_; }

 private:
  template <typename F>
  ncclResult_t v10plus(F f) {
    if (v10_) return f(v10_);
    if (v11_) return f(v11_);
    return f(v12_);
  }
  int abi_ = 0;
  ncclDebugLogger_t logger_;
  std::uint64_t commId_;
  void* ctx_ = nullptr;
  const ncclNet_v9_t* v9_ = nullptr;
  const ncclNet_v10_t* v10_ = nullptr;
  const ncclNet_v11_t* v11_ = nullptr;
  const ncclNet_v12_t* v12_ = nullptr;
};

}  // namespace optiflow::testsupport
