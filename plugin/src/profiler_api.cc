#include "profiler_api.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "log.h"
#include "optiflow/plugin/params.h"
#include "optiflow/profiler/profiler.h"
#include "optiflow/schedcache/reader.h"

namespace optiflow::plugin {
namespace {

constexpr std::uint64_t kContextMagic = 0x524c464f52504f46ULL;  // "FOPROFLR": a context this library made

struct Context {
  std::uint64_t magic = kContextMagic;
  std::uint32_t nRanks = 0;
  profiler::Comm comm;
  Context(std::uint64_t commId, std::uint32_t ranks, std::unique_ptr<schedcache::Reader> reader)
      : nRanks(ranks), comm(commId, std::move(reader)) {}
};

// One set of pools per plugin library and process, made at the first communicator's init and freed at the last one's
// finalize (NCCL sends no event without a communicator, and unloads the library only after the last finalize).
// Events read the pointer without a lock; init and finalize change it under gLife.
std::atomic<profiler::Recorder*> gRecorder{nullptr};
std::mutex gLife;
std::size_t gContexts = 0;  // under gLife

profiler::Recorder* recorder() noexcept { return gRecorder.load(std::memory_order_acquire); }

// Under gLife.
void retainRecorder() {
  if (gRecorder.load(std::memory_order_relaxed) == nullptr) {
    gRecorder.store(new profiler::Recorder(), std::memory_order_release);
  }
  ++gContexts;
}

void releaseRecorder() {
  std::lock_guard<std::mutex> lock(gLife);
  if (gContexts > 0) --gContexts;
  if (gContexts == 0) delete gRecorder.exchange(nullptr, std::memory_order_acq_rel);
}

Context* contextOf(void* context) noexcept {
  auto* ctx = static_cast<Context*>(context);
  return ctx != nullptr && ctx->magic == kContextMagic ? ctx : nullptr;
}

}  // namespace

ncclResult_t profilerInit(void** context, std::uint64_t commId, int* eActivationMask, const char* /*commName*/,
                          int /*nNodes*/, int nRanks, int /*rank*/, ncclDebugLogger_t logFunction) noexcept {
  // An error here unloads the profiler for the whole process, so every problem is "measure nothing" instead.
  if (context == nullptr) return ncclInvalidArgument;
  *context = nullptr;
  try {
    Params params;
    std::string error;
    if (!readParams([](const char* name) -> const char* { return std::getenv(name); }, &params, &error)) {
      static std::atomic<bool> reported{false};
      if (!reported.exchange(true)) OPTIFLOW_PROFILER_WARN(logFunction, "measuring nothing: %s", error.c_str());
      if (eActivationMask != nullptr) *eActivationMask = 0;
      return ncclSuccess;
    }
    // NCCL keeps one mask per process and every init writes it: the same value every time.
    if (eActivationMask != nullptr) *eActivationMask = params.profilerEnabled ? kProfilerMask : 0;
    if (!params.profilerEnabled) return ncclSuccess;
    schedcache::Error attachError;
    std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(params.ns, &attachError);
    if (reader == nullptr) {
      static std::atomic<bool> reported{false};
      if (!reported.exchange(true)) {
        OPTIFLOW_PROFILER_INFO(logFunction, "no schedule cache for namespace %s (%s): this process records nothing",
                               params.ns.c_str(), attachError.message.c_str());
      }
    }
    auto ctx =
        std::make_unique<Context>(commId, nRanks > 0 ? static_cast<std::uint32_t>(nRanks) : 1u, std::move(reader));
    if (ctx->comm.recording()) {
      OPTIFLOW_PROFILER_INFO(logFunction, "timing collectives of communicator %016llx into namespace %s",
                             static_cast<unsigned long long>(commId), params.ns.c_str());
    }
    {
      std::lock_guard<std::mutex> lock(gLife);
      retainRecorder();
    }
    *context = ctx.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    OPTIFLOW_PROFILER_WARN(logFunction, "init: %s: this communicator records nothing", e.what());
    return ncclSuccess;
  } catch (...) {
    OPTIFLOW_PROFILER_WARN(logFunction, "init: unknown exception: this communicator records nothing");
    return ncclSuccess;
  }
}

ncclResult_t profilerStartEvent(void* context, void** eHandle, std::uint64_t type, void* parentObj,
                                const ncclProfilerCollDescr_t* coll,
                                const ncclProfilerKernelChDescr_t* kernelCh) noexcept {
  if (eHandle == nullptr) return ncclSuccess;
  *eHandle = nullptr;  // NCCL sends no stop or state for a null handle
  Context* ctx = contextOf(context);
  profiler::Recorder* rec = recorder();
  if (ctx == nullptr || rec == nullptr) return ncclSuccess;
  if (type == ncclProfileColl && coll != nullptr) {
    if (!ctx->comm.recording()) return ncclSuccess;
    profiler::CollEvent e;
    if (!profiler::collectiveFromNcclName(coll->func, &e.coll)) return ncclSuccess;
    const std::uint32_t typeBytes = profiler::datatypeBytes(coll->datatype);
    if (typeBytes == 0) return ncclSuccess;
    e.sizeBytes = profiler::ncclTestsBytes(e.coll, coll->count, typeBytes, ctx->nRanks);
    e.algorithm = profiler::algorithmFromNcclName(coll->algo);
    e.protocol = profiler::protocolFromNcclName(coll->proto);
    e.channels = coll->nChannels;
    *eHandle = rec->startColl(&ctx->comm, e);
  } else if (type == ncclProfileKernelCh && kernelCh != nullptr) {
    *eHandle = rec->startKernelCh(parentObj, kernelCh->pTimer);
  }
  // Any other type (NCCL may send some whatever the mask says): no handle.
  return ncclSuccess;
}

ncclResult_t profilerStopEvent(void* eHandle) noexcept {
  if (profiler::Recorder* rec = recorder()) rec->stopEvent(eHandle);
  return ncclSuccess;
}

ncclResult_t profilerRecordEventState(void* eHandle, int eState,
                                      const ncclProfilerEventStateArgs_v4_t* eStateArgs) noexcept {
  profiler::Recorder* rec = recorder();
  if (rec == nullptr || eStateArgs == nullptr || eState != ncclProfilerKernelChStop) return ncclSuccess;
  if (rec->kindOf(eHandle) != profiler::HandleKind::kKernelCh) return ncclSuccess;
  rec->kernelChStop(eHandle, eStateArgs->kernelCh.pTimer);
  return ncclSuccess;
}

ncclResult_t profilerFinalize(void* context) noexcept {
  Context* ctx = contextOf(context);
  if (ctx == nullptr) return ncclSuccess;
  if (profiler::Recorder* rec = recorder()) rec->finalizeComm(&ctx->comm);
  ctx->magic = 0;
  delete ctx;
  releaseRecorder();
  return ncclSuccess;
}

}  // namespace optiflow::plugin
