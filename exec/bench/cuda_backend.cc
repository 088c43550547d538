// optiflow-bench's CUDA backend: one process per GPU, one NCCL communicator, the lowered levels run as one
// ncclGroupStart/ncclGroupEnd of ncclSend/ncclRecv per level on one stream, copies as cudaMemcpyAsync and
// reductions as cuBLAS axpy (dst = a + b), so no kernel of our own needs nvcc. A consumer of NCCL and CUDA like
// nccl-tests: it includes the installed nccl.h and cuda_runtime.h and is built only where they were found.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "backends.h"
#include "optiflow/exec/rendezvous.h"
#include "optiflow/sim/reference_executor.h"

namespace optiflow::exec {

namespace {

using Clock = std::chrono::steady_clock;

core::Diagnostic err(std::string m) { return {"", 0, 0, std::move(m)}; }

std::string cudaText(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorString(e), static_cast<int>(e)); }

// What every rank tells the others for the "#  Rank" lines: fixed size, gathered through NCCL.
struct RankInfo {
  int rank = 0;
  int pid = 0;
  int device = 0;
  char host[64] = {};
  char busId[32] = {};
  char gpu[96] = {};
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  cudaError_t allocate(std::size_t bytes) {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    bytes_ = bytes;
    return cudaMalloc(&p_, std::max<std::size_t>(bytes, 16));
  }
  float* f() const { return static_cast<float*>(p_); }
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

class CudaBackend : public BenchBackend {
 public:
  ~CudaBackend() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (comm_ != nullptr) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  core::Result<bool> init(const BenchOptions& o, const LaunchInfo& launch) {
    rank_ = launch.rank;
    size_ = launch.size;
    // The rendezvous first where it needs no GPU (every rank but 0 only receives), so that its errors show on any
    // machine; rank 0 needs NCCL's id before it can hand it out.
    const std::string key = !o.rendezvousKey.empty() ? o.rendezvousKey : launch.jobKey;
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(o.rendezvousTimeoutS * 1000));
    auto exchange = [&](const Blob& blob) -> core::Result<Blob> {
      if (!o.rendezvous.empty()) {
        auto hp = parseHostPort(o.rendezvous);
        if (!hp) return hp.error();
        return exchangeOverTcp(*hp, rank_, size_, blob, timeout);
      }
      return exchangeOverFile(o.rendezvousDir, key, rank_, blob, timeout);
    };
    if (size_ > 1 && o.rendezvous.empty() && o.rendezvousDir.empty()) {
      return err(
          fmt::format("{} ranks ({}) need --rendezvous host:port or --rendezvous-dir DIR", size_, launch.source));
    }
    ncclUniqueId id{};
    if (size_ > 1 && rank_ != 0) {
      auto got = exchange(Blob{});
      if (!got) return got.error();
      if (got->size() != sizeof id) return err("the rendezvous handed out an id of the wrong size");
      std::memcpy(&id, got->data(), sizeof id);
    }
    int devices = 0;
    if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices < 1) {
      return err(fmt::format("no CUDA device: {}", e != cudaSuccess ? cudaText(e) : "0 devices"));
    }
    device_ = launch.localRank % devices;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return err(fmt::format("cudaSetDevice({}): {}", device_, cudaText(e)));
    }
    if (rank_ == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return err(fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
      }
      if (size_ > 1) {
        const Blob blob(reinterpret_cast<const std::uint8_t*>(&id),
                        reinterpret_cast<const std::uint8_t*>(&id) + sizeof id);
        if (auto served = exchange(blob); !served) return served.error();
      }
    }
    if (ncclResult_t r = ncclCommInitRank(&comm_, size_, id, rank_); r != ncclSuccess) {
      return err(fmt::format("ncclCommInitRank (rank {} of {}): {}", rank_, size_, ncclGetErrorString(r)));
    }
    if (rank_ == 0 && !o.rendezvousDir.empty()) removeRendezvousFile(o.rendezvousDir, key);  // every rank joined
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return err(fmt::format("cudaStreamCreate: {}", cudaText(e)));
    }
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS) {
      return err("cuBLAS could not be initialised (reductions use cublasSaxpy)");
    }
    return gatherRankLines();
  }

  std::string_view name() const override { return "cuda"; }
  int rank() const override { return rank_; }
  core::Result<bool> accepts(int nRanks) const override {
    if (nRanks != size_) {
      return err(fmt::format("a schedule of {} ranks cannot run on {} processes (one per GPU)", nRanks, size_));
    }
    if (aborted_) return err("the NCCL communicator was aborted after a hang");
    return true;
  }
  std::vector<std::string> rankLines(int) override { return lines_; }

  core::Result<ModeResult> run(const core::Schedule& schedule, const Lowered& lowered, std::uint64_t elements,
                               const BenchOptions& o) override {
    if (auto a = accepts(lowered.nRanks); !a) return a.error();
    const RankLevels& rl = lowered.ranks[rank_];
    const std::size_t chunkBytes = elements * sizeof(float);
    DeviceBuffer bufs[4];
    const int chunks[4] = {rl.inputChunks, rl.outputChunks, rl.scratchChunks, rl.tempChunks};
    for (int b = 0; b < 4; ++b) {
      if (cudaError_t e = bufs[b].allocate(static_cast<std::size_t>(chunks[b]) * chunkBytes); e != cudaSuccess) {
        return err(
            fmt::format("cudaMalloc of {} bytes: {}", static_cast<std::size_t>(chunks[b]) * chunkBytes, cudaText(e)));
      }
    }
    auto at = [&](Ref r) { return bufs[static_cast<int>(r.buf)].f() + static_cast<std::size_t>(r.offset) * elements; };
    auto once = [&]() -> core::Result<bool> {
      for (std::size_t lv = 0; lv < rl.levels.size(); ++lv) {
        const Level& level = rl.levels[lv];
        for (const Op& op : level.local) {
          const std::size_t n = static_cast<std::size_t>(op.count) * elements;
          if (op.kind == OpKind::Copy) {
            if (at(op.dst) != at(op.src)) {
              if (auto e =
                      cudaMemcpyAsync(at(op.dst), at(op.src), n * sizeof(float), cudaMemcpyDeviceToDevice, stream_);
                  e != cudaSuccess) {
                return err(fmt::format("level {}: cudaMemcpyAsync: {}", lv, cudaText(e)));
              }
            }
            continue;
          }
          // dst = src + src2 as axpy: y += 1 * x.
          const float one = 1.0f;
          const float* x = at(op.src2);
          if (at(op.dst) == at(op.src2)) {
            x = at(op.src);
          } else if (at(op.dst) != at(op.src)) {
            if (auto e = cudaMemcpyAsync(at(op.dst), at(op.src), n * sizeof(float), cudaMemcpyDeviceToDevice, stream_);
                e != cudaSuccess) {
              return err(fmt::format("level {}: cudaMemcpyAsync: {}", lv, cudaText(e)));
            }
          }
          if (cublasSaxpy_64(blas_, static_cast<std::int64_t>(n), &one, x, 1, at(op.dst), 1) != CUBLAS_STATUS_SUCCESS) {
            return err(fmt::format("level {}: cublasSaxpy failed", lv));
          }
        }
        if (level.group.empty()) continue;
        ncclGroupStart();
        for (const Op& op : level.group) {
          const std::size_t n = static_cast<std::size_t>(op.count) * elements;
          const ncclResult_t r = op.kind == OpKind::Send ? ncclSend(at(op.src), n, ncclFloat, op.peer, comm_, stream_)
                                                         : ncclRecv(at(op.dst), n, ncclFloat, op.peer, comm_, stream_);
          if (r != ncclSuccess) {
            ncclGroupEnd();
            return err(fmt::format("level {}: ncclSend/ncclRecv: {}", lv, ncclGetErrorString(r)));
          }
        }
        if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess) {
          return err(fmt::format("level {}: ncclGroupEnd: {}", lv, ncclGetErrorString(r)));
        }
      }
      return true;
    };
    ModeResult m;
    m.ran = true;
    if (o.check) {
      // The reference inputs of this rank where the collective reads them, poison everywhere else.
      const std::size_t epc = elements;
      const sim::ReferenceInputs inputs(schedule, 1, static_cast<int>(std::min<std::uint64_t>(epc, 1U << 30)));
      std::vector<float> host[4];
      for (int b = 0; b < 4; ++b) host[b].assign(static_cast<std::size_t>(chunks[b]) * epc, sim::poisonValue());
      const int inChunks = core::logicalSizes(schedule, rank_).input;
      for (int c = 0; c < inChunks; ++c) {
        if (!core::inputDefined(schedule, rank_, c)) continue;
        const core::Slot sl = core::resolveSlot(schedule, rank_, lowered.mode, core::BufferKind::Input, c);
        float* p = host[static_cast<int>(sl.buf)].data() + static_cast<std::size_t>(sl.index) * epc;
        for (std::size_t e = 0; e < epc; ++e) p[e] = inputs.at(rank_, c, e);
      }
      for (int b = 0; b < 4; ++b) {
        cudaMemcpy(bufs[b].get(), host[b].data(), host[b].size() * sizeof(float), cudaMemcpyHostToDevice);
      }
      if (auto r = once(); !r) return r.error();
      if (auto w = wait(o); !w) return w.error();
      for (int b = 0; b < 3; ++b) {
        cudaMemcpy(host[b].data(), bufs[b].get(), host[b].size() * sizeof(float), cudaMemcpyDeviceToHost);
      }
      sim::CheckReport report;
      sim::compareOutputs(
          schedule, lowered.mode, inputs,
          [&](int r, int o2) -> const float* {
            if (r != rank_) return nullptr;
            const core::Slot sl = core::resolveSlot(schedule, r, lowered.mode, core::BufferKind::Output, o2);
            return host[static_cast<int>(sl.buf)].data() + static_cast<std::size_t>(sl.index) * epc;
          },
          0, report);
      auto total = sumOverRanks(static_cast<double>(report.mismatchCount), o);
      if (!total) return total.error();
      m.wrong = static_cast<std::int64_t>(*total);
    }
    auto timed = timeIt(o, once);
    if (!timed) return timed.error();
    m.timeUs = *timed;
    return m;
  }

  core::Result<ModeResult> runNccl(core::Collective c, std::uint64_t bytes, bool inPlace,
                                   const BenchOptions& o) override {
    if (aborted_) return err("the NCCL communicator was aborted after a hang");
    const std::size_t total = bytes / sizeof(float);
    const std::size_t per = total / static_cast<std::size_t>(size_);
    DeviceBuffer send;
    DeviceBuffer recv;
    std::size_t sendElems = total;
    std::size_t recvElems = total;
    if (c == core::Collective::AllGather) sendElems = per;
    if (c == core::Collective::ReduceScatter) recvElems = per;
    if (cudaError_t e = send.allocate(sendElems * sizeof(float)); e != cudaSuccess) return err(cudaText(e));
    if (cudaError_t e = recv.allocate(recvElems * sizeof(float)); e != cudaSuccess) return err(cudaText(e));
    // On the run's stream: it is non-blocking, so nothing on the legacy default stream orders before it.
    cudaMemsetAsync(send.get(), 0, sendElems * sizeof(float), stream_);
    cudaMemsetAsync(recv.get(), 0, recvElems * sizeof(float), stream_);
    // In place as nccl-tests lays it out: the send buffer is this rank's slice of the receive buffer (All-Gather),
    // the receive buffer this rank's slice of the send buffer (Reduce-Scatter), or the same buffer.
    float* sb = send.f();
    float* rb = recv.f();
    if (inPlace) {
      if (c == core::Collective::AllGather) {
        sb = rb + static_cast<std::size_t>(rank_) * per;
      } else if (c == core::Collective::ReduceScatter) {
        rb = sb + static_cast<std::size_t>(rank_) * per;
      } else {
        sb = rb;
      }
    }
    auto once = [&]() -> core::Result<bool> {
      ncclResult_t r = ncclSuccess;
      switch (c) {
        case core::Collective::AllGather:
          r = ncclAllGather(sb, rb, per, ncclFloat, comm_, stream_);
          break;
        case core::Collective::ReduceScatter:
          r = ncclReduceScatter(sb, rb, per, ncclFloat, ncclSum, comm_, stream_);
          break;
        case core::Collective::AllReduce:
          r = ncclAllReduce(sb, rb, total, ncclFloat, ncclSum, comm_, stream_);
          break;
        case core::Collective::Broadcast:
          r = ncclBroadcast(sb, rb, total, ncclFloat, 0, comm_, stream_);
          break;
        case core::Collective::Reduce:
          r = ncclReduce(sb, rb, total, ncclFloat, ncclSum, 0, comm_, stream_);
          break;
        case core::Collective::AllToAll:
          if (inPlace) return err("NCCL's All-to-All has no in-place form");
          r = ncclAlltoAll(sb, rb, per, ncclFloat, comm_, stream_);
          break;
        case core::Collective::Custom:
          return err("NCCL has no such collective");
      }
      if (r != ncclSuccess) return err(fmt::format("NCCL {}: {}", core::toString(c), ncclGetErrorString(r)));
      return true;
    };
    ModeResult m;
    if (c == core::Collective::AllToAll && inPlace) return m;  // N/A, as nccl-tests prints it
    m.ran = true;
    auto timed = timeIt(o, once);
    if (!timed) return timed.error();
    m.timeUs = *timed;
    return m;
  }

 private:
  // Waits for the stream within --timeout; a hang aborts the communicator (NCCL cannot be trusted after it).
  core::Result<bool> wait(const BenchOptions& o) {
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.timeoutS * 1000));
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) return err(fmt::format("the stream failed: {}", cudaText(e)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        return err(fmt::format("NCCL failed asynchronously: {}", ncclGetErrorString(async)));
      }
      if (Clock::now() >= end) {
        aborted_ = true;
        return err(fmt::format("hang: the run did not finish within {} s (--timeout); the communicator is aborted",
                               o.timeoutS));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  core::Result<double> sumOverRanks(double v, const BenchOptions& o) {
    DeviceBuffer d;
    if (cudaError_t e = d.allocate(sizeof(double)); e != cudaSuccess) return err(cudaText(e));
    cudaMemcpy(d.get(), &v, sizeof v, cudaMemcpyHostToDevice);
    if (ncclResult_t r = ncclAllReduce(d.get(), d.get(), 1, ncclDouble, ncclSum, comm_, stream_); r != ncclSuccess) {
      return err(fmt::format("ncclAllReduce: {}", ncclGetErrorString(r)));
    }
    if (auto w = wait(o); !w) return w.error();
    double out = 0;
    cudaMemcpy(&out, d.get(), sizeof out, cudaMemcpyDeviceToHost);
    return out;
  }

  // Warm-up, a barrier, then the timed iterations (plain launches, or -G iterations captured in one CUDA graph and
  // replayed); the per-iteration time averaged over ranks, as nccl-tests does by default.
  template <typename Once>
  core::Result<double> timeIt(const BenchOptions& o, Once& once) {
    for (int i = 0; i < o.warmup; ++i) {
      if (auto r = once(); !r) return r.error();
    }
    if (auto w = wait(o); !w) return w.error();
    if (auto b = sumOverRanks(0, o); !b) return b.error();  // a barrier
    cudaGraphExec_t exec = nullptr;
    if (o.graph > 0) {
      cudaGraph_t graph = nullptr;
      if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
        return err(fmt::format("cudaStreamBeginCapture: {}", cudaText(e)));
      }
      for (int i = 0; i < o.graph; ++i) {
        if (auto r = once(); !r) {
          cudaStreamEndCapture(stream_, &graph);
          if (graph != nullptr) cudaGraphDestroy(graph);
          return r.error();
        }
      }
      if (cudaError_t e = cudaStreamEndCapture(stream_, &graph); e != cudaSuccess) {
        return err(fmt::format("cudaStreamEndCapture: {}", cudaText(e)));
      }
      const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      if (e != cudaSuccess) return err(fmt::format("cudaGraphInstantiate: {}", cudaText(e)));
    }
    const auto start = Clock::now();
    for (int i = 0; i < o.iters; ++i) {
      if (exec != nullptr) {
        if (cudaError_t e = cudaGraphLaunch(exec, stream_); e != cudaSuccess) {
          cudaGraphExecDestroy(exec);
          return err(fmt::format("cudaGraphLaunch: {}", cudaText(e)));
        }
      } else if (auto r = once(); !r) {
        return r.error();
      }
    }
    auto w = wait(o);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      (static_cast<double>(o.iters) * (exec != nullptr ? o.graph : 1));
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (!w) return w.error();
    auto sum = sumOverRanks(us, o);
    if (!sum) return sum.error();
    return *sum / size_;
  }

  core::Result<bool> gatherRankLines() {
    RankInfo mine;
    mine.rank = rank_;
    mine.pid = static_cast<int>(::getpid());
    mine.device = device_;
    ::gethostname(mine.host, sizeof mine.host - 1);
    cudaDeviceGetPCIBusId(mine.busId, sizeof mine.busId - 1, device_);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
      const std::size_t n = std::min(sizeof mine.gpu - 1, ::strnlen(prop.name, sizeof prop.name));
      std::memcpy(mine.gpu, prop.name, n);
    }
    DeviceBuffer d;
    if (cudaError_t e = d.allocate(sizeof(RankInfo) * static_cast<std::size_t>(size_)); e != cudaSuccess) {
      return err(cudaText(e));
    }
    auto* slot = static_cast<char*>(d.get()) + sizeof(RankInfo) * static_cast<std::size_t>(rank_);
    cudaMemcpy(slot, &mine, sizeof mine, cudaMemcpyHostToDevice);
    if (ncclResult_t r = ncclAllGather(slot, d.get(), sizeof(RankInfo), ncclChar, comm_, stream_); r != ncclSuccess) {
      return err(fmt::format("ncclAllGather: {}", ncclGetErrorString(r)));
    }
    BenchOptions o;
    o.timeoutS = 120;
    if (auto w = wait(o); !w) return w.error();
    std::vector<RankInfo> all(static_cast<std::size_t>(size_));
    cudaMemcpy(all.data(), d.get(), sizeof(RankInfo) * all.size(), cudaMemcpyDeviceToHost);
    for (RankInfo& ri : all) {
      ri.host[sizeof ri.host - 1] = '\0';
      ri.busId[sizeof ri.busId - 1] = '\0';
      ri.gpu[sizeof ri.gpu - 1] = '\0';
      lines_.push_back(fmt::format("#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [{}] {}", ri.rank, ri.pid,
                                   ri.host, ri.device, ri.busId, ri.gpu));
    }
    return true;
  }

  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  bool aborted_ = false;
  std::vector<std::string> lines_;
};

}  // namespace

core::Result<std::unique_ptr<BenchBackend>> makeCudaBackend(const BenchOptions& options, const LaunchInfo& launch) {
  auto backend = std::make_unique<CudaBackend>();
  if (auto r = backend->init(options, launch); !r) return r.error();
  return std::unique_ptr<BenchBackend>(std::move(backend));
}

}  // namespace optiflow::exec
