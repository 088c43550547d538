// The GPU probe of a build that found the CUDA headers. The runtime is dlopen'ed (never linked), so optiflowd still
// starts on a node without the driver or the toolkit and reports why it measured nothing. What it measures: pinned
// host -> GPU 0 copies, and GPU 0 -> GPU 1 copies when two GPUs can access each other. The contexts it creates are
// reset afterwards, so the daemon's idle footprint (host and GPU memory) does not keep them.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "optiflow/daemon/probe.h"

#ifndef OPTIFLOW_CUDA_ROOT
#define OPTIFLOW_CUDA_ROOT "/usr/local/cuda"
#endif

namespace optiflow::daemon {
namespace {

constexpr std::size_t kCopyBytes = std::size_t{64} << 20;
constexpr int kCopies = 4;  // timed, after one warm-up copy

// The few runtime entry points the probe uses; their C signatures are stable from CUDA 11 to 13.
struct Cudart {
  cudaError_t (*getDeviceCount)(int*) = nullptr;
  cudaError_t (*setDevice)(int) = nullptr;
  cudaError_t (*malloc)(void**, std::size_t) = nullptr;
  cudaError_t (*free)(void*) = nullptr;
  cudaError_t (*mallocHost)(void**, std::size_t) = nullptr;
  cudaError_t (*freeHost)(void*) = nullptr;
  cudaError_t (*memcpy)(void*, const void*, std::size_t, cudaMemcpyKind) = nullptr;
  cudaError_t (*memcpyPeer)(void*, int, const void*, int, std::size_t) = nullptr;
  cudaError_t (*canAccessPeer)(int*, int, int) = nullptr;
  cudaError_t (*enablePeerAccess)(int, unsigned int) = nullptr;
  cudaError_t (*deviceSynchronize)() = nullptr;
  cudaError_t (*deviceReset)() = nullptr;
  const char* (*getErrorString)(cudaError_t) = nullptr;
};

template <typename Fn>
bool bind(void* library, const char* symbol, Fn* out, std::string* missing) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    *missing = symbol;
    return false;
  }
  *out = reinterpret_cast<Fn>(address);
  return true;
}

// Loaded once and kept for the life of the process: unloading a CUDA runtime is not safe.
const Cudart* loadCudart(std::string* error) {
  static std::once_flag once;
  static Cudart table;
  static const Cudart* loaded = nullptr;
  static std::string why;
  std::call_once(once, [] {
    // The driver first: without it the runtime loads but every call fails, and its message is less clear.
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == nullptr) {
      const char* e = dlerror();
      why = fmt::format("no CUDA driver (libcuda.so.1: {})", e != nullptr ? e : "not found");
      return;
    }
    const std::vector<std::string> names = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                            OPTIFLOW_CUDA_ROOT "/lib64/libcudart.so"};
    void* library = nullptr;
    std::string tried;
    for (const std::string& name : names) {
      library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
      tried += (tried.empty() ? "" : ", ") + name;
    }
    if (library == nullptr) {
      why = fmt::format("no CUDA runtime (tried {})", tried);
      return;
    }
    std::string missing;
    const bool ok = bind(library, "cudaGetDeviceCount", &table.getDeviceCount, &missing) &&
                    bind(library, "cudaSetDevice", &table.setDevice, &missing) &&
                    bind(library, "cudaMalloc", &table.malloc, &missing) &&
                    bind(library, "cudaFree", &table.free, &missing) &&
                    bind(library, "cudaMallocHost", &table.mallocHost, &missing) &&
                    bind(library, "cudaFreeHost", &table.freeHost, &missing) &&
                    bind(library, "cudaMemcpy", &table.memcpy, &missing) &&
                    bind(library, "cudaMemcpyPeer", &table.memcpyPeer, &missing) &&
                    bind(library, "cudaDeviceCanAccessPeer", &table.canAccessPeer, &missing) &&
                    bind(library, "cudaDeviceEnablePeerAccess", &table.enablePeerAccess, &missing) &&
                    bind(library, "cudaDeviceSynchronize", &table.deviceSynchronize, &missing) &&
                    bind(library, "cudaDeviceReset", &table.deviceReset, &missing) &&
                    bind(library, "cudaGetErrorString", &table.getErrorString, &missing);
    if (!ok) {
      why = fmt::format("the CUDA runtime lacks {}", missing);
      return;
    }
    loaded = &table;
  });
  if (loaded == nullptr) *error = why;
  return loaded;
}

class Probe {
 public:
  explicit Probe(const Cudart& rt) : rt_(rt) {}
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  ~Probe() {
    for (const auto& [device, pointer] : device_) {
      rt_.setDevice(device);
      rt_.free(pointer);
    }
    if (host_ != nullptr) rt_.freeHost(host_);
    // Drop the contexts: a context costs host memory and hundreds of MiB on the GPU the jobs need.
    for (int device : touched_) {
      rt_.setDevice(device);
      rt_.deviceReset();
    }
  }

  // "" or what failed ("cudaMalloc on GPU 1: out of memory").
  std::string check(cudaError_t e, const char* call, int device = -1) const {
    if (e == cudaSuccess) return "";
    const std::string on = device >= 0 ? fmt::format(" on GPU {}", device) : "";
    return fmt::format("{}{}: {}", call, on, rt_.getErrorString(e));
  }

  std::string use(int device) {
    if (std::find(touched_.begin(), touched_.end(), device) == touched_.end()) touched_.push_back(device);
    return check(rt_.setDevice(device), "cudaSetDevice", device);
  }

  std::string deviceBuffer(int device, void** out) {
    if (std::string e = use(device); !e.empty()) return e;
    if (std::string e = check(rt_.malloc(out, kCopyBytes), "cudaMalloc", device); !e.empty()) return e;
    device_.emplace_back(device, *out);
    return "";
  }

  std::string hostToDevice(double* gbps) {
    void* dst = nullptr;
    if (std::string e = deviceBuffer(0, &dst); !e.empty()) return e;
    if (std::string e = check(rt_.mallocHost(&host_, kCopyBytes), "cudaMallocHost"); !e.empty()) return e;
    return timeCopies(
        gbps, [&] { return rt_.memcpy(dst, host_, kCopyBytes, cudaMemcpyHostToDevice); }, 0);
  }

  std::string peer(double* gbps, std::string* note) {
    int can01 = 0;
    if (std::string e = check(rt_.canAccessPeer(&can01, 0, 1), "cudaDeviceCanAccessPeer"); !e.empty()) return e;
    if (can01 == 0) {
      *note = "GPU 0 cannot access GPU 1 directly: no peer copy measured";
      return "";
    }
    void* src = nullptr;
    void* dst = nullptr;
    if (std::string e = deviceBuffer(1, &dst); !e.empty()) return e;
    if (std::string e = deviceBuffer(0, &src); !e.empty()) return e;
    const cudaError_t enabled = rt_.enablePeerAccess(1, 0);
    if (enabled != cudaSuccess && enabled != cudaErrorPeerAccessAlreadyEnabled) {
      return check(enabled, "cudaDeviceEnablePeerAccess", 0);
    }
    return timeCopies(
        gbps, [&] { return rt_.memcpyPeer(dst, 1, src, 0, kCopyBytes); }, 0);
  }

 private:
  template <typename Copy>
  std::string timeCopies(double* gbps, Copy copy, int device) {
    if (std::string e = check(copy(), "warm-up copy", device); !e.empty()) return e;
    if (std::string e = check(rt_.deviceSynchronize(), "cudaDeviceSynchronize", device); !e.empty()) return e;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCopies; ++i) {
      if (std::string e = check(copy(), "copy", device); !e.empty()) return e;
    }
    if (std::string e = check(rt_.deviceSynchronize(), "cudaDeviceSynchronize", device); !e.empty()) return e;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *gbps = static_cast<double>(kCopyBytes) * kCopies / std::max(s, 1e-9) / 1e9;
    return "";
  }

  const Cudart& rt_;
  void* host_ = nullptr;
  std::vector<std::pair<int, void*>> device_;
  std::vector<int> touched_;
};

}  // namespace

GpuProbeResult probeGpuLinks() {
  GpuProbeResult result;
  try {
    std::string error;
    const Cudart* rt = loadCudart(&error);
    if (rt == nullptr) {
      result.detail = error;
      return result;
    }
    int count = 0;
    const cudaError_t e = rt->getDeviceCount(&count);
    if (e != cudaSuccess) {
      result.detail = fmt::format("cudaGetDeviceCount: {}", rt->getErrorString(e));
      return result;
    }
    if (count < 1) {
      result.detail = "no GPU";
      return result;
    }
    Probe probe(*rt);
    if (std::string f = probe.hostToDevice(&result.hostBandwidthGBps); !f.empty()) {
      result.detail = f;
      return result;
    }
    std::string note = count < 2 ? "one GPU: no peer copy measured" : "";
    if (count >= 2) {
      if (std::string f = probe.peer(&result.peerBandwidthGBps, &note); !f.empty()) {
        result.detail = f;
        result.hostBandwidthGBps = 0;
        return result;
      }
    }
    result.available = true;
    result.detail = fmt::format("{} GPU(s): pinned host -> GPU 0 {:.1f} GB/s", count, result.hostBandwidthGBps);
    if (result.peerBandwidthGBps > 0)
      result.detail += fmt::format(", GPU 0 -> GPU 1 {:.1f} GB/s", result.peerBandwidthGBps);
    if (!note.empty()) result.detail += "; " + note;
  } catch (const std::exception& ex) {
    result = GpuProbeResult{};
    result.detail = fmt::format("GPU probe failed: {}", ex.what());
  }
  return result;
}

}  // namespace optiflow::daemon
