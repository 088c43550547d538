#include "optiflow/exec/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace optiflow::exec {

namespace {

using Clock = std::chrono::steady_clock;

struct Message {
  int channel = 0;
  int seq = 0;
  std::vector<float> data;
};

struct RankState {
  std::vector<float> buffers[4];  // indexed by Buffer
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<Message>> inbox;  // per sender; guarded by mu
};

struct Failure {
  sim::ErrorKind kind;
  std::string message;
};

// The transports of one run: in-process mailboxes, one FIFO per ordered pair of ranks, as NCCL keeps one per peer.
class World {
 public:
  World(const Lowered& l, std::size_t epc, std::chrono::milliseconds timeout) : l_(l), epc_(epc), timeout_(timeout) {
    for (const RankLevels& rl : l.ranks) {
      auto rs = std::make_unique<RankState>();
      const float poison = sim::poisonValue();
      rs->buffers[0].assign(static_cast<std::size_t>(rl.inputChunks) * epc, poison);
      rs->buffers[1].assign(static_cast<std::size_t>(rl.outputChunks) * epc, poison);
      rs->buffers[2].assign(static_cast<std::size_t>(rl.scratchChunks) * epc, poison);
      rs->buffers[3].assign(static_cast<std::size_t>(rl.tempChunks) * epc, poison);
      rs->inbox.resize(l.ranks.size());
      ranks_.push_back(std::move(rs));
    }
  }

  float* at(int rank, Ref r) {
    return ranks_[rank]->buffers[static_cast<std::size_t>(r.buf)].data() + static_cast<std::size_t>(r.offset) * epc_;
  }

  // Runs every level of `rank` once; false when it failed or another rank did.
  bool runRank(int rank) {
    const RankLevels& rl = l_.ranks[rank];
    for (std::size_t lv = 0; lv < rl.levels.size(); ++lv) {
      const Level& level = rl.levels[lv];
      for (const Op& op : level.local) local(rank, op);
      // The group: sends first (they never wait), then the receives in posting order.
      for (const Op& op : level.group) {
        if (op.kind != OpKind::Send) continue;
        Message m{op.channel, op.seq, {}};
        const float* p = at(rank, op.src);
        m.data.assign(p, p + static_cast<std::size_t>(op.count) * epc_);
        RankState& to = *ranks_[op.peer];
        {
          std::lock_guard lk(to.mu);
          to.inbox[rank].push_back(std::move(m));
        }
        to.cv.notify_all();
      }
      for (const Op& op : level.group) {
        if (op.kind != OpKind::Recv) continue;
        if (!receive(rank, lv, op)) return false;
      }
    }
    return true;
  }

  void fail(sim::ErrorKind k, std::string msg) {
    {
      std::lock_guard lk(failMu_);
      if (failures_.size() < 16) failures_.push_back({k, std::move(msg)});
    }
    aborted_.store(true);
    for (auto& rs : ranks_) {
      std::lock_guard lk(rs->mu);
      rs->cv.notify_all();
    }
  }

  bool aborted() const { return aborted_.load(); }
  std::vector<Failure>& failures() { return failures_; }

  // Messages sent and never received, one line per pair.
  void leftovers(std::vector<Failure>& out) {
    for (std::size_t to = 0; to < ranks_.size(); ++to) {
      for (std::size_t from = 0; from < ranks_[to]->inbox.size(); ++from) {
        const auto& q = ranks_[to]->inbox[from];
        if (q.empty()) continue;
        out.push_back({sim::ErrorKind::Leftover,
                       fmt::format("{} message(s) from rank {} to rank {} were never received (the first: channel "
                                   "{}, message {})",
                                   q.size(), from, to, q.front().channel, q.front().seq)});
      }
    }
  }

 private:
  void local(int rank, const Op& op) {
    const std::size_t n = static_cast<std::size_t>(op.count) * epc_;
    float* dst = at(rank, op.dst);
    const float* a = at(rank, op.src);
    if (op.kind == OpKind::Copy) {
      std::memmove(dst, a, n * sizeof(float));
    } else if (op.kind == OpKind::Reduce) {
      const float* b = at(rank, op.src2);
      for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
    }
  }

  bool receive(int rank, std::size_t level, const Op& op) {
    RankState& rs = *ranks_[rank];
    std::unique_lock lk(rs.mu);
    auto& q = rs.inbox[op.peer];
    const auto deadline = Clock::now() + timeout_;
    while (q.empty() && !aborted()) {
      if (rs.cv.wait_until(lk, deadline) == std::cv_status::timeout && q.empty()) {
        lk.unlock();
        fail(sim::ErrorKind::Hang,
             fmt::format("hang: rank {} level {} waits for message {} from rank {} on channel {}: nothing arrived "
                         "within {} ms",
                         rank, level, op.seq, op.peer, op.channel, timeout_.count()));
        return false;
      }
    }
    if (aborted()) return false;
    Message m = std::move(q.front());
    q.pop_front();
    lk.unlock();
    const std::size_t n = static_cast<std::size_t>(op.count) * epc_;
    if (m.channel != op.channel || m.seq != op.seq || m.data.size() != n) {
      fail(sim::ErrorKind::CountMismatch,
           fmt::format("rank {} level {} receives message {} on channel {} ({} chunk(s)) from rank {}, but the "
                       "next message from that rank is message {} on channel {} ({} floats)",
                       rank, level, op.seq, op.channel, op.count, op.peer, m.seq, m.channel, m.data.size()));
      return false;
    }
    std::memcpy(at(rank, op.dst), m.data.data(), n * sizeof(float));
    return true;
  }

  const Lowered& l_;
  std::size_t epc_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::atomic<bool> aborted_{false};
  std::mutex failMu_;
  std::vector<Failure> failures_;
};

void addError(sim::CheckReport& report, sim::ErrorKind k, std::string msg) {
  report.errors.push_back(std::move(msg));
  report.errorKinds.push_back(k);
}

// Runs fn(rank) on one thread per rank; false (with a Resource failure) when the threads cannot be started.
template <typename Fn>
bool onThreads(World& world, int n, Fn fn) {
  std::vector<std::jthread> threads;
  try {
    threads.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  } catch (const std::exception& e) {
    world.fail(sim::ErrorKind::Resource, fmt::format("could not start {} threads: {}", n, e.what()));
    return false;  // the started threads see the abort and end; the jthreads join
  }
  return true;
}

}  // namespace

sim::CheckReport checkLowered(const core::Schedule& schedule, const Lowered& lowered, const CpuOptions& options) {
  const auto start = Clock::now();
  sim::CheckReport report;
  const std::string tag(core::toString(lowered.mode));
  auto finish = [&] {
    report.modesRun.push_back(lowered.mode);
    report.passed = report.errors.empty() && report.mismatchCount == 0;
    report.elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    return report;
  };
  if (options.elementsPerChunk < 1 || lowered.nRanks != schedule.nRanks ||
      static_cast<int>(lowered.ranks.size()) != schedule.nRanks) {
    addError(report, sim::ErrorKind::Shape,
             fmt::format("{}: the lowering has {} ranks for a {}-rank schedule, {} elements per chunk", tag,
                         lowered.ranks.size(), schedule.nRanks, options.elementsPerChunk));
    return finish();
  }
  const std::size_t epc = static_cast<std::size_t>(options.elementsPerChunk);
  try {
    const sim::ReferenceInputs inputs(schedule, options.seed, options.elementsPerChunk);
    World world(lowered, epc, options.timeout);
    // Inputs where the collective reads them, through the aliasing of the mode.
    for (int r = 0; r < schedule.nRanks; ++r) {
      const int chunks = core::logicalSizes(schedule, r).input;
      for (int c = 0; c < chunks; ++c) {
        if (!core::inputDefined(schedule, r, c)) continue;
        const core::Slot sl = core::resolveSlot(schedule, r, lowered.mode, core::BufferKind::Input, c);
        float* p = world.at(r, {static_cast<Buffer>(sl.buf), sl.index});
        for (std::size_t e = 0; e < epc; ++e) p[e] = inputs.at(r, c, e);
      }
    }
    onThreads(world, schedule.nRanks, [&](int r) { world.runRank(r); });
    for (Failure& f : world.failures()) addError(report, f.kind, fmt::format("{}: {}", tag, f.message));
    if (world.aborted()) return finish();
    std::vector<Failure> left;
    world.leftovers(left);
    for (Failure& f : left) addError(report, f.kind, fmt::format("{}: {}", tag, f.message));
    sim::compareOutputs(
        schedule, lowered.mode, inputs,
        [&](int r, int o) -> const float* {
          const core::Slot sl = core::resolveSlot(schedule, r, lowered.mode, core::BufferKind::Output, o);
          return world.at(r, {static_cast<Buffer>(sl.buf), sl.index});
        },
        options.maxMismatches, report);
  } catch (const std::exception& e) {  // buffers too large to allocate
    addError(report, sim::ErrorKind::Resource, fmt::format("{}: could not run: {}", tag, e.what()));
  }
  return finish();
}

sim::CheckReport checkOnCpu(const core::Schedule& schedule, const CpuOptions& options) {
  sim::CheckReport all;
  const auto modes = core::supportedModes(schedule);
  for (core::BufferMode m : modes) {
    auto lowered = lower(schedule, m);
    if (!lowered.ok()) {
      addError(all, sim::ErrorKind::Reference, fmt::format("{}: {}", core::toString(m), lowered.error().str()));
      all.modesRun.push_back(m);
      continue;
    }
    sim::CheckReport one = checkLowered(schedule, *lowered, options);
    all.modesRun.push_back(m);
    all.mismatchCount += one.mismatchCount;
    for (const sim::Mismatch& mm : one.mismatches) {
      if (all.mismatches.size() < options.maxMismatches) all.mismatches.push_back(mm);
    }
    for (std::size_t i = 0; i < one.errors.size(); ++i) addError(all, one.errorKinds[i], one.errors[i]);
    all.elapsed += one.elapsed;
  }
  all.passed = !modes.empty() && all.errors.empty() && all.mismatchCount == 0;
  return all;
}

CpuTiming timeLowered(const Lowered& lowered, std::uint64_t elementsPerChunk, int warmup, int iterations,
                      std::chrono::milliseconds timeout) {
  CpuTiming out;
  if (iterations < 1 || warmup < 0 || elementsPerChunk < 1) {
    out.error = fmt::format("iterations {} and warmup {} (need at least 1 and 0)", iterations, warmup);
    return out;
  }
  try {
    World world(lowered, static_cast<std::size_t>(elementsPerChunk), timeout);
    const int n = lowered.nRanks;
    Clock::time_point begin;
    Clock::time_point end;
    std::barrier sync(n, [&]() noexcept { end = Clock::now(); });
    std::atomic<bool> failed{false};
    onThreads(world, n, [&](int r) {
      for (int it = 0; it < warmup + iterations; ++it) {
        // Every rank arrives at each barrier, failed or not, so that none waits forever.
        if (it == warmup) {
          sync.arrive_and_wait();
          if (r == 0) begin = end;
        }
        if (!failed.load() && !world.runRank(r)) failed.store(true);
      }
      sync.arrive_and_wait();
    });
    if (world.aborted() || failed.load()) {
      out.error = world.failures().empty() ? "a rank failed" : world.failures().front().message;
      return out;
    }
    out.ok = true;
    out.avgUs = std::chrono::duration<double, std::micro>(end - begin).count() / iterations;
  } catch (const std::exception& e) {
    out.error = fmt::format("could not run: {}", e.what());
  }
  return out;
}

}  // namespace optiflow::exec
