#include <unistd.h>

#include <chrono>

#include <fmt/format.h>

#include "optiflow/core/units.h"
#include "optiflow/exec/bench.h"
#include "optiflow/exec/cpu_backend.h"

namespace optiflow::exec {

namespace {

// The CPU backend holds every buffer of every rank in one process: refuse runs that would take more than this.
constexpr std::uint64_t kMaxCpuBytes = 8ULL << 30;

class CpuBenchBackend : public BenchBackend {
 public:
  std::string_view name() const override { return "cpu"; }
  int rank() const override { return 0; }
  core::Result<bool> accepts(int nRanks) const override {
    if (nRanks < 1 || nRanks > 4096) return core::Diagnostic{"", 0, 0, fmt::format("{} ranks", nRanks)};
    return true;
  }

  std::vector<std::string> rankLines(int nRanks) override {
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    std::vector<std::string> out;
    for (int r = 0; r < nRanks; ++r) {
      out.push_back(
          fmt::format("#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [cpu] CPU thread", r, ::getpid(), host, r));
    }
    return out;
  }

  core::Result<ModeResult> run(const core::Schedule& schedule, const Lowered& lowered, std::uint64_t elements,
                               const BenchOptions& options) override {
    std::uint64_t chunks = 0;
    for (const RankLevels& rl : lowered.ranks) {
      chunks += static_cast<std::uint64_t>(rl.inputChunks + rl.outputChunks + rl.scratchChunks + rl.tempChunks);
    }
    if (chunks * elements * sizeof(float) > kMaxCpuBytes) {
      return core::Diagnostic{
          "", 0, 0,
          fmt::format("the CPU backend would hold {} of buffers for all ranks (at most {})",
                      core::formatSize(chunks * elements * sizeof(float)), core::formatSize(kMaxCpuBytes))};
    }
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(options.timeoutS * 1000));
    ModeResult m;
    m.ran = true;
    if (options.check) {
      CpuOptions co;
      co.elementsPerChunk = static_cast<int>(std::min<std::uint64_t>(elements, 1U << 30));
      co.timeout = timeout;
      const sim::CheckReport r = checkLowered(schedule, lowered, co);
      if (!r.errors.empty()) return core::Diagnostic{"", 0, 0, r.errors.front()};
      m.wrong = static_cast<std::int64_t>(r.mismatchCount);
    }
    const CpuTiming t = timeLowered(lowered, elements, options.warmup, options.iters, timeout);
    if (!t.ok) return core::Diagnostic{"", 0, 0, t.error};
    m.timeUs = t.avgUs;
    return m;
  }

  core::Result<ModeResult> runNccl(core::Collective, std::uint64_t, bool, const BenchOptions&) override {
    return core::Diagnostic{"", 0, 0, "the CPU backend has no NCCL"};
  }
};

}  // namespace

std::unique_ptr<BenchBackend> makeCpuBenchBackend() { return std::make_unique<CpuBenchBackend>(); }

}  // namespace optiflow::exec
