// nccl_plugin_check: a tiny NCCL client for the GPU check of the OptiFlow NCCL plugins
// (scripts/device-check-plugins.sh). It is a test client, not plugin code: it includes NCCL's nccl.h and links
// libnccl and cudart, and sees our plugins only through NCCL (NCCL_TUNER_PLUGIN / NCCL_NET_PLUGIN, which the script
// sets), exactly like a training job.
//
//   nccl_plugin_check [--ndev N]
//     ncclCommInitAll over the visible GPUs (all of them, or the first N), then AllReduce, AllGather, ReduceScatter
//     and Broadcast (float) at 1 KiB, 1 MiB and 64 MiB per rank, out of place, each followed by
//     cudaStreamSynchronize; every result is checked on the host. Prints "nccl_plugin_check: OK" on success.
//
//     With one GPU the communicator has nRanks=1: the tuner's init still runs (that is what the check is for), but
//     its cost table is trivial (every entry -1 except RING/SIMPLE = 0.0, ../shared/reference/nccl-plugin-abi.md
//     2.3), and NCCL runs one-rank collectives as a local copy, so getCollInfo is likely never called [inferred].
//     With 2 or more GPUs the communicator has that many ranks and the cost table is a real one.
//
//   nccl_plugin_check --tuner-probe [--ranks N] [--plugin NAME_OR_PATH]
//     No GPU and no NCCL call: dlopen the tuner library the way NCCL does (RTLD_NOW|RTLD_LOCAL, default
//     "libnccl-tuner-optiflow.so" through LD_LIBRARY_PATH), call ncclTunerPlugin_v5's init for one communicator
//     (N ranks, 1 node) with a printf logger, then finalize. It shows what the tuner does at init with the current
//     OPTIFLOW_* environment on a machine without a GPU; it is no substitute for the NCCL run.
//
//   nccl_plugin_check --rank R --nranks N --id-file FILE [--iters K]
//     One rank of an N-rank communicator in this process, on GPU 0 (several processes may share one GPU when each
//     has its own NCCL_HOSTID: NCCL then treats them as separate nodes and their traffic goes through the net
//     plugin). Rank 0 writes ncclGetUniqueId to FILE, the others wait for it; then ncclCommInitRank, AllReduce and
//     AllGather (float) at 4 KiB, 1 MiB and 16 MiB, K times each (default 5, so the profiler sees repeated calls),
//     results checked on this rank.
//
// Exit status: 0 OK; 1 a CUDA/NCCL call failed or a result was wrong; 2 no GPU (CUDA sees no device);
// 3 ncclCommInitAll failed (the script's case (c) expects this); 4 bad usage; 5 the tuner probe's init failed.

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitNoGpu = 2;
constexpr int kExitInitFailed = 3;
constexpr int kExitUsage = 4;
constexpr int kExitProbeInitFailed = 5;

[[noreturn]] void die(int code, const char* fmt, ...) {
  std::fflush(stdout);
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("nccl_plugin_check: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
  std::exit(code);
}

#define CUDA_OK(call)                                                                                            \
  do {                                                                                                           \
    const cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) die(kExitFailed, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)

#define NCCL_OK(call)                                                                                                  \
  do {                                                                                                                 \
    const ncclResult_t r_ = (call);                                                                                    \
    if (r_ != ncclSuccess) {                                                                                           \
      die(kExitFailed, "%s:%d: %s: %s (%d)", __FILE__, __LINE__, #call, ncclGetErrorString(r_), static_cast<int>(r_)); \
    }                                                                                                                  \
  } while (0)

// Small integers, so float sums over up to 64 ranks are exact.
float inputValue(int rank, std::size_t i) { return static_cast<float>((rank + 1) + static_cast<int>(i % 251)); }

struct Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* send = nullptr;  // capacity: nRanks * maxCount floats (ReduceScatter's input)
  float* recv = nullptr;  // capacity: nRanks * maxCount floats (AllGather's output)
};

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast };
const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "AllReduce";
    case Coll::kAllGather:
      return "AllGather";
    case Coll::kReduceScatter:
      return "ReduceScatter";
    case Coll::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

std::string sizeText(std::size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// Runs one collective on every rank (count floats per rank, as nccl-tests' per-rank size) and checks it on the host.
// Returns the number of wrong elements (0: correct).
std::size_t runOne(std::vector<Rank>& ranks, Coll coll, std::size_t count) {
  const int n = static_cast<int>(ranks.size());
  const std::size_t nSend = coll == Coll::kReduceScatter ? count * static_cast<std::size_t>(n) : count;
  const std::size_t nRecv = coll == Coll::kAllGather ? count * static_cast<std::size_t>(n) : count;

  std::vector<float> host(std::max(nSend, nRecv));
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < nSend; ++i) host[i] = inputValue(r, i);
    CUDA_OK(cudaSetDevice(ranks[r].device));
    CUDA_OK(cudaMemcpy(ranks[r].send, host.data(), nSend * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(ranks[r].recv, 0xff, nRecv * sizeof(float)));  // NaN: stale output cannot pass
    CUDA_OK(cudaDeviceSynchronize());
  }

  NCCL_OK(ncclGroupStart());
  for (Rank& rk : ranks) {
    switch (coll) {
      case Coll::kAllReduce:
        NCCL_OK(ncclAllReduce(rk.send, rk.recv, count, ncclFloat, ncclSum, rk.comm, rk.stream));
        break;
      case Coll::kAllGather:
        NCCL_OK(ncclAllGather(rk.send, rk.recv, count, ncclFloat, rk.comm, rk.stream));
        break;
      case Coll::kReduceScatter:
        NCCL_OK(ncclReduceScatter(rk.send, rk.recv, count, ncclFloat, ncclSum, rk.comm, rk.stream));
        break;
      case Coll::kBroadcast:
        NCCL_OK(ncclBroadcast(rk.send, rk.recv, count, ncclFloat, /*root=*/0, rk.comm, rk.stream));
        break;
    }
  }
  NCCL_OK(ncclGroupEnd());
  for (Rank& rk : ranks) {
    CUDA_OK(cudaSetDevice(rk.device));
    CUDA_OK(cudaStreamSynchronize(rk.stream));
  }

  int sumOfRanks = 0;  // sum over r of (r + 1)
  for (int r = 0; r < n; ++r) sumOfRanks += r + 1;
  std::size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(ranks[r].device));
    CUDA_OK(cudaMemcpy(host.data(), ranks[r].recv, nRecv * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < nRecv; ++i) {
      float want = 0.0F;
      switch (coll) {
        case Coll::kAllReduce:
          want = static_cast<float>(sumOfRanks + n * static_cast<int>(i % 251));
          break;
        case Coll::kAllGather:
          want = inputValue(static_cast<int>(i / count), i % count);
          break;
        case Coll::kReduceScatter: {
          const std::size_t j = static_cast<std::size_t>(r) * count + i;
          want = static_cast<float>(sumOfRanks + n * static_cast<int>(j % 251));
          break;
        }
        case Coll::kBroadcast:
          want = inputValue(0, i);
          break;
      }
      if (host[i] != want) {
        if (wrong < 5) {
          std::printf("  rank %d element %zu: got %g, want %g\n", r, i, static_cast<double>(host[i]),
                      static_cast<double>(want));
        }
        ++wrong;
      }
    }
  }
  return wrong;
}

int runNccl(int ndevWanted) {
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  std::printf("nccl_plugin_check: NCCL library %d (header %d.%d.%d)\n", version, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev <= 0) {
    std::printf("nccl_plugin_check: no GPU: cudaGetDeviceCount: %s (%s)\n",
                e == cudaSuccess ? "0 devices" : cudaGetErrorName(e),
                e == cudaSuccess ? "no CUDA device visible" : cudaGetErrorString(e));
    std::fflush(stdout);
    return kExitNoGpu;
  }
  if (ndevWanted > 0 && ndevWanted < ndev) ndev = ndevWanted;
  for (int d = 0; d < ndev; ++d) {
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, d));
    std::printf("nccl_plugin_check: GPU %d: %s\n", d, prop.name);
  }
  if (ndev == 1) {
    std::printf(
        "nccl_plugin_check: 1 GPU: the communicator has nRanks=1, so the tuner's cost table is trivial "
        "(only RING/SIMPLE); the check is that the plugin loads and initialises\n");
  }

  std::vector<Rank> ranks(static_cast<std::size_t>(ndev));
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ndev));
  std::vector<int> devs(static_cast<std::size_t>(ndev));
  for (int d = 0; d < ndev; ++d) devs[d] = d;
  std::fflush(stdout);
  const ncclResult_t ir = ncclCommInitAll(comms.data(), ndev, devs.data());
  if (ir != ncclSuccess) {
    std::printf("nccl_plugin_check: ncclCommInitAll failed: %s (%d): %s\n", ncclGetErrorString(ir),
                static_cast<int>(ir), ncclGetLastError(nullptr));
    std::fflush(stdout);
    return kExitInitFailed;
  }
  std::printf("nccl_plugin_check: ncclCommInitAll: %d rank%s\n", ndev, ndev == 1 ? "" : "s");

  const std::size_t sizes[] = {std::size_t{1} << 10, std::size_t{1} << 20, std::size_t{64} << 20};
  const std::size_t maxCount = sizes[2] / sizeof(float);
  for (int d = 0; d < ndev; ++d) {
    Rank& rk = ranks[d];
    rk.device = d;
    rk.comm = comms[d];
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamCreateWithFlags(&rk.stream, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&rk.send), maxCount * static_cast<std::size_t>(ndev) * sizeof(float)));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&rk.recv), maxCount * static_cast<std::size_t>(ndev) * sizeof(float)));
  }

  std::size_t failures = 0;
  for (Coll coll : {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter, Coll::kBroadcast}) {
    for (std::size_t bytes : sizes) {
      const std::size_t wrong = runOne(ranks, coll, bytes / sizeof(float));
      std::printf("nccl_plugin_check: %-13s %7s per rank: %s\n", collName(coll), sizeText(bytes).c_str(),
                  wrong == 0 ? "ok" : (std::to_string(wrong) + " wrong elements").c_str());
      std::fflush(stdout);
      if (wrong != 0) ++failures;
    }
  }

  for (Rank& rk : ranks) {
    CUDA_OK(cudaSetDevice(rk.device));
    CUDA_OK(cudaFree(rk.send));
    CUDA_OK(cudaFree(rk.recv));
    CUDA_OK(cudaStreamDestroy(rk.stream));
    NCCL_OK(ncclCommDestroy(rk.comm));  // tuner finalize runs here
  }
  if (failures != 0) {
    std::printf("nccl_plugin_check: FAILED: %zu collective/size pairs gave wrong results\n", failures);
    return kExitFailed;
  }
  std::printf("nccl_plugin_check: OK\n");
  return kExitOk;
}

// One rank of a multi-process communicator (see the header comment).
int runRank(int rank, int nranks, const std::string& idFile, int iters) {
  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev <= 0) {
    std::printf("nccl_plugin_check: no GPU: cudaGetDeviceCount: %s\n",
                e == cudaSuccess ? "0 devices" : cudaGetErrorName(e));
    return kExitNoGpu;
  }
  CUDA_OK(cudaSetDevice(0));
  ncclUniqueId id{};
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    const std::string tmp = idFile + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr || std::fwrite(&id, sizeof id, 1, f) != 1 || std::fclose(f) != 0)
      die(kExitFailed, "cannot write %s", tmp.c_str());
    if (std::rename(tmp.c_str(), idFile.c_str()) != 0) die(kExitFailed, "cannot rename %s", tmp.c_str());
  } else {
    bool got = false;
    for (int i = 0; i < 600 && !got; ++i) {  // at most 60 s for rank 0 to write it
      FILE* f = std::fopen(idFile.c_str(), "rb");
      if (f != nullptr) {
        got = std::fread(&id, sizeof id, 1, f) == 1;
        std::fclose(f);
      }
      if (!got) ::usleep(100000);
    }
    if (!got) die(kExitFailed, "no unique id in %s after 60 s", idFile.c_str());
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t ir = ncclCommInitRank(&comm, nranks, id, rank);
  if (ir != ncclSuccess) {
    std::printf("nccl_plugin_check: ncclCommInitRank failed: %s (%d): %s\n", ncclGetErrorString(ir),
                static_cast<int>(ir), ncclGetLastError(nullptr));
    return kExitInitFailed;
  }
  std::printf("nccl_plugin_check: rank %d of %d initialised\n", rank, nranks);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t sizes[] = {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  const std::size_t maxCount = sizes[2] / sizeof(float);
  float* send = nullptr;
  float* recv = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&send), maxCount * sizeof(float)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&recv), maxCount * static_cast<std::size_t>(nranks) * sizeof(float)));
  std::size_t failures = 0;
  for (bool gather : {false, true}) {
    for (std::size_t bytes : sizes) {
      const std::size_t count = bytes / sizeof(float);
      std::vector<float> host(count);
      for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
      CUDA_OK(cudaMemcpy(send, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      for (int k = 0; k < iters; ++k) {
        if (gather) {
          NCCL_OK(ncclAllGather(send, recv, count, ncclFloat, comm, stream));
        } else {
          NCCL_OK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
        }
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      const std::size_t nRecv = gather ? count * static_cast<std::size_t>(nranks) : count;
      std::vector<float> out(nRecv);
      CUDA_OK(cudaMemcpy(out.data(), recv, nRecv * sizeof(float), cudaMemcpyDeviceToHost));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < nRecv; ++i) {
        const float want = gather
                               ? static_cast<float>(static_cast<int>(i / count) + 1 + static_cast<int>((i % count) % 7))
                               : static_cast<float>(nranks * (nranks + 1) / 2 + nranks * static_cast<int>(i % 7));
        if (out[i] != want) ++wrong;
      }
      std::printf("nccl_plugin_check: rank %d %-9s %7s per rank x %d: %s\n", rank, gather ? "AllGather" : "AllReduce",
                  sizeText(bytes).c_str(), iters,
                  wrong == 0 ? "ok" : (std::to_string(wrong) + " wrong elements").c_str());
      if (wrong != 0) ++failures;
    }
  }
  CUDA_OK(cudaFree(send));
  CUDA_OK(cudaFree(recv));
  CUDA_OK(cudaStreamDestroy(stream));
  NCCL_OK(ncclCommDestroy(comm));  // tuner and profiler finalize run here
  if (failures != 0) {
    std::printf("nccl_plugin_check: FAILED: %zu collective/size pairs gave wrong results\n", failures);
    return kExitFailed;
  }
  std::printf("nccl_plugin_check: OK\n");
  return kExitOk;
}

// NCCL's v5 tuner table, declared here with plain types (nccl.h declares none of the plugin ABI). Field order and
// sizes follow ../shared/reference/nccl-plugin-abi.md 2.1 and 2.4: init(void** ctx, uint64_t commId, size_t nRanks,
// size_t nNodes, logger, ncclNvlDomainInfo_v5_t*, ncclTunerConstants_v5_t*), getCollInfo, finalize.
using ProbeLogger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
struct ProbeNvlDomainInfo {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
};
struct ProbeTunerV5 {
  const char* name;
  ncclResult_t (*init)(void** ctx, std::uint64_t commId, std::size_t nRanks, std::size_t nNodes, ProbeLogger log,
                       ProbeNvlDomainInfo* nvl, void* constants);
  void* getCollInfo;
  ncclResult_t (*finalize)(void* ctx);
};

void probeLogger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  const char* levelName = level == 2 ? "WARN" : level == 3 ? "INFO" : "LOG";
  std::printf("[tuner-probe] %s (flags 0x%lx, %s:%d) ", levelName, flags, file, line);
  std::va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::putchar('\n');
}

int runProbe(const char* plugin, int nRanks) {
  void* lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die(kExitFailed, "dlopen(%s): %s", plugin, dlerror());
  const auto* tuner = static_cast<const ProbeTunerV5*>(dlsym(lib, "ncclTunerPlugin_v5"));
  if (tuner == nullptr) die(kExitFailed, "dlsym(ncclTunerPlugin_v5) in %s: %s", plugin, dlerror());
  std::printf("nccl_plugin_check: tuner probe: %s exports ncclTunerPlugin_v5 named '%s'\n", plugin, tuner->name);
  ProbeNvlDomainInfo nvl{1, nRanks, nRanks};
  static double constants[144] = {};  // ncclTunerConstants_v5_t: 144 doubles, 1152 B (the plugin leaves them as is)
  // A fresh communicator id per run, as NCCL's commHash is: the tuner records (pins) each id's plan in the cache.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::uint64_t commId = (static_cast<std::uint64_t>(now.tv_sec) << 32) ^
                               static_cast<std::uint64_t>(now.tv_nsec) ^ (static_cast<std::uint64_t>(getpid()) << 16);
  void* ctx = nullptr;
  std::fflush(stdout);
  const ncclResult_t r = tuner->init(&ctx, commId, static_cast<std::size_t>(nRanks), 1, probeLogger, &nvl, constants);
  std::printf("nccl_plugin_check: tuner probe: init(%d ranks, 1 node) returned %d (%s)\n", nRanks, static_cast<int>(r),
              ncclGetErrorString(r));
  if (r == ncclSuccess) tuner->finalize(ctx);
  dlclose(lib);
  std::fflush(stdout);
  return r == ncclSuccess ? kExitOk : kExitProbeInitFailed;
}

int parseInt(const char* flag, const char* value, int lo, int hi) {
  char* end = nullptr;
  const long v = value == nullptr ? 0 : std::strtol(value, &end, 10);
  if (value == nullptr || *end != '\0' || v < lo || v > hi)
    die(kExitUsage, "%s needs an integer in [%d, %d]", flag, lo, hi);
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep our lines in order with NCCL's (also on stdout)
  bool probe = false;
  int ndev = 0;
  int probeRanks = 1;
  const char* plugin = "libnccl-tuner-optiflow.so";
  int rank = -1;
  int nranks = 0;
  int iters = 5;
  std::string idFile;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--tuner-probe") {
      probe = true;
    } else if (a == "--ndev") {
      ndev = parseInt("--ndev", next, 1, 64);
      ++i;
    } else if (a == "--ranks") {
      probeRanks = parseInt("--ranks", next, 1, 4096);
      ++i;
    } else if (a == "--rank") {
      rank = parseInt("--rank", next, 0, 4095);
      ++i;
    } else if (a == "--nranks") {
      nranks = parseInt("--nranks", next, 1, 4096);
      ++i;
    } else if (a == "--iters") {
      iters = parseInt("--iters", next, 1, 1000);
      ++i;
    } else if (a == "--id-file" && next != nullptr) {
      idFile = next;
      ++i;
    } else if (a == "--plugin" && next != nullptr) {
      plugin = next;
      ++i;
    } else {
      die(kExitUsage,
          "usage: nccl_plugin_check [--ndev N] | --tuner-probe [--ranks N] [--plugin NAME_OR_PATH] | --rank R --nranks "
          "N "
          "--id-file FILE [--iters K] (got '%s')",
          a.c_str());
    }
  }
  if (rank >= 0) {
    if (nranks <= rank || idFile.empty()) die(kExitUsage, "--rank R needs --nranks N > R and --id-file FILE");
    return runRank(rank, nranks, idFile, iters);
  }
  return probe ? runProbe(plugin, probeRanks) : runNccl(ndev);
}
