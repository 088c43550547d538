#include "optiflow/sim/reference_executor.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace optiflow::sim {

namespace {

using core::BufferKind;
using core::BufferMode;
using core::Schedule;
using core::Step;
using core::StepOp;
using Clock = std::chrono::steady_clock;

// A signalling NaN (exponent all ones, quiet bit clear, payload 0x00dead): no valid input or sum has these bits,
// and any arithmetic on it gives a NaN, so reading undefined memory always ends in a mismatch.
constexpr std::uint32_t kPoisonBits = 0x7f80deadU;
constexpr std::size_t kMaxValidationErrors = 32;
constexpr std::size_t kMaxStuckListed = 64;

float poison() { return std::bit_cast<float>(kPoisonBits); }

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}

using InputValues = ReferenceInputs;

std::string where(int rank, int tbId, int step, StepOp op) {
  return fmt::format("rank {} tb {} step {} ({})", rank, tbId, step, core::toString(op));
}

struct Error {
  ErrorKind kind;
  std::string message;
};

// ---------------------------------------------------------------------------------------------------------------
// Up-front validation: everything the run relies on, so a bad schedule is reported instead of crashing.

struct TbPlan {
  int recvConn = -1;  // index into the rank's inbound connections
  int sendRank = -1;
  int sendConn = -1;                                   // index into sendRank's inbound connections
  std::vector<std::vector<std::pair<int, int>>> deps;  // per step: (block index, step index)
};

struct RankPlan {
  std::vector<TbPlan> tbs;
  std::vector<std::pair<int, int>> inbound;  // (sender, channel) of each inbound connection
};

struct Plan {
  std::vector<RankPlan> ranks;
};

class Validator {
 public:
  Validator(const Schedule& s, const std::vector<BufferMode>& modes) : s_(s), modes_(modes) {}

  std::vector<Error> run(Plan& plan) {
    if (std::string shape = core::validateShape(s_); !shape.empty()) {
      add(ErrorKind::Shape, std::move(shape));
      return std::move(errors_);
    }
    const int n = s_.nRanks;
    plan.ranks.resize(n);
    // (sender, receiver, channel) -> index among the receiver's inbound connections.
    std::map<std::tuple<int, int, int>, int> connIndex;
    auto conn = [&](int from, int to, int channel) {
      auto [it, inserted] = connIndex.try_emplace({from, to, channel}, 0);
      if (inserted) {
        it->second = static_cast<int>(plan.ranks[to].inbound.size());
        plan.ranks[to].inbound.emplace_back(from, channel);
      }
      return it->second;
    };

    for (int r = 0; r < n && !full(); ++r) {
      const core::RankProgram& rp = s_.ranks[r];
      RankPlan& rplan = plan.ranks[r];
      rplan.tbs.resize(rp.threadBlocks.size());
      const core::BufferSizes logical = core::logicalSizes(s_, r);
      std::map<int, int> ids;
      std::map<std::pair<int, int>, int> sendUse;  // (peer, channel) -> block id
      std::map<std::pair<int, int>, int> recvUse;
      for (std::size_t t = 0; t < rp.threadBlocks.size(); ++t) {
        const core::ThreadBlock& tb = rp.threadBlocks[t];
        if (auto [it, inserted] = ids.try_emplace(tb.id, static_cast<int>(t)); !inserted) {
          add(ErrorKind::Reference, fmt::format("rank {}: two thread blocks have id {}", r, tb.id));
        }
        if (tb.channel < 0) add(ErrorKind::Reference, fmt::format("rank {} tb {}: channel {}", r, tb.id, tb.channel));
        bool sends = false;
        bool receives = false;
        for (const Step& st : tb.steps) {
          sends = sends || core::opSends(st.op);
          receives = receives || core::opReceives(st.op);
        }
        if (sends && !checkPeer(r, tb.id, "send", tb.sendPeer)) sends = false;
        if (receives && !checkPeer(r, tb.id, "receive", tb.recvPeer)) receives = false;
        TbPlan& tplan = rplan.tbs[t];
        if (sends && tb.channel >= 0) {
          if (auto [it, inserted] = sendUse.try_emplace({tb.sendPeer, tb.channel}, tb.id); !inserted) {
            add(ErrorKind::Connection, fmt::format("rank {}: tb {} and tb {} both send to rank {} on channel {}", r,
                                                   it->second, tb.id, tb.sendPeer, tb.channel));
          }
          tplan.sendRank = tb.sendPeer;
          tplan.sendConn = conn(r, tb.sendPeer, tb.channel);
        }
        if (receives && tb.channel >= 0) {
          if (auto [it, inserted] = recvUse.try_emplace({tb.recvPeer, tb.channel}, tb.id); !inserted) {
            add(ErrorKind::Connection, fmt::format("rank {}: tb {} and tb {} both receive from rank {} on channel {}",
                                                   r, it->second, tb.id, tb.recvPeer, tb.channel));
          }
          tplan.recvConn = conn(tb.recvPeer, r, tb.channel);
        }
        for (std::size_t i = 0; i < tb.steps.size(); ++i) {
          const Step& st = tb.steps[i];
          const auto at = [&] { return where(r, tb.id, static_cast<int>(i), st.op); };  // only formatted on error
          // MSCCL writes cnt="0" on nop steps; they move no data.
          if (st.op != core::StepOp::Nop && st.count < 1) {
            add(ErrorKind::Reference, fmt::format("{}: count {} (must be at least 1)", at(), st.count));
            continue;
          }
          if (core::opReadsSrc(st.op)) checkRange(r, at, "source", logical, st.srcBuf, st.srcOff, st.count);
          if (core::opWritesDst(st.op)) checkRange(r, at, "destination", logical, st.dstBuf, st.dstOff, st.count);
        }
      }
      // Dependencies, once every block id of the rank is known.
      for (std::size_t t = 0; t < rp.threadBlocks.size(); ++t) {
        const core::ThreadBlock& tb = rp.threadBlocks[t];
        auto& deps = rplan.tbs[t].deps;
        deps.resize(tb.steps.size());
        for (std::size_t i = 0; i < tb.steps.size(); ++i) {
          for (const core::StepRef& d : tb.steps[i].deps) {
            const auto it = ids.find(d.tb);
            if (it == ids.end()) {
              add(ErrorKind::Reference, fmt::format("{}: depends on tb {}, which rank {} does not have",
                                                    where(r, tb.id, static_cast<int>(i), tb.steps[i].op), d.tb, r));
              continue;
            }
            const auto& target = rp.threadBlocks[it->second];
            if (d.step < 0 || d.step >= static_cast<int>(target.steps.size())) {
              add(ErrorKind::Reference,
                  fmt::format("{}: depends on tb {} step {}, but that block has {} steps",
                              where(r, tb.id, static_cast<int>(i), tb.steps[i].op), d.tb, d.step, target.steps.size()));
              continue;
            }
            deps[i].emplace_back(it->second, d.step);
          }
        }
      }
      for (const core::LocalCopy& lc : rp.localCopies) {
        const auto at = [&] {
          return fmt::format("rank {} local copy input {} -> output {}", r, lc.inputOffset, lc.outputOffset);
        };
        checkRange(r, at, "source", logical, BufferKind::Input, lc.inputOffset, 1);
        checkRange(r, at, "destination", logical, BufferKind::Output, lc.outputOffset, 1);
      }
    }
    return std::move(errors_);
  }

 private:
  bool full() const { return errors_.size() >= kMaxValidationErrors; }

  void add(ErrorKind k, std::string msg) {
    if (!full()) errors_.push_back({k, std::move(msg)});
  }

  bool checkPeer(int r, int tbId, std::string_view dir, int peer) {
    if (peer < 0 || peer >= s_.nRanks) {
      add(ErrorKind::Reference, fmt::format("rank {} tb {}: {}s but its {} peer is {}", r, tbId, dir, dir, peer));
      return false;
    }
    if (peer == r) {
      add(ErrorKind::Reference, fmt::format("rank {} tb {}: its {} peer is the rank itself", r, tbId, dir));
      return false;
    }
    return true;
  }

  template <typename At>
  void checkRange(int r, const At& at, std::string_view what, const core::BufferSizes& logical, BufferKind buf, int off,
                  int count) {
    const int size = logical.of(buf);
    if (off < 0 || off > size - count) {
      add(ErrorKind::Reference, fmt::format("{}: {} {}[{}..{}) is outside the {}-chunk buffer", at(), what,
                                            core::toString(buf), off, static_cast<long long>(off) + count, size));
      return;
    }
    for (BufferMode m : modes_) {
      const core::BufferSizes phys = core::physicalSizes(s_, r, m);
      for (int c = off; c < off + count; ++c) {
        const core::Slot slot = core::resolveSlot(s_, r, m, buf, c);
        if (slot.index < 0 || slot.index >= phys.of(slot.buf)) {
          add(ErrorKind::Reference, fmt::format("{}: {} {}[{}] resolves outside the physical buffer in {} mode", at(),
                                                what, core::toString(buf), c, core::toString(m)));
          return;
        }
      }
    }
  }

  const Schedule& s_;
  const std::vector<BufferMode>& modes_;
  std::vector<Error> errors_;
};

// ---------------------------------------------------------------------------------------------------------------
// One run of the schedule in one buffer mode.

struct Message {
  std::vector<float> data;  // snapshot taken at send time, as a real send copies the data out
  int count = 0;
  int fromTb = 0;  // block id and step of the sender, for diagnostics
  int fromStep = 0;
};

struct RankState {
  std::vector<float> input, output, scratch;  // physical buffers

  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu. Sends never block: the queues are unbounded. The real runtime has a bounded number of slots per
  // connection, so a schedule that relies on deep buffering can deadlock there and not here; the verifier's
  // deadlock check is what covers that.
  std::vector<std::deque<Message>> inbox;  // one per inbound connection
  std::uint64_t arrivals = 0;              // messages ever queued; lets the thread wait without losing a wakeup
  bool waiting = false;                    // parked with nothing runnable; cleared by whoever queues a message

  // Owned by the rank's thread while it runs; read by the monitor only after the threads are joined.
  std::vector<int> next;  // per block: index of the next step to run
  bool finished = false;
};

class Run {
 public:
  Run(const Schedule& s, const Plan& plan, const CheckOptions& o, BufferMode mode, const InputValues& values)
      : s_(s), plan_(plan), opt_(o), mode_(mode), values_(values), epc_(static_cast<std::size_t>(o.elementsPerChunk)) {
    for (int r = 0; r < s.nRanks; ++r) {
      auto rs = std::make_unique<RankState>();
      const core::BufferSizes phys = core::physicalSizes(s, r, mode);
      rs->input.assign(static_cast<std::size_t>(phys.input) * epc_, poison());
      rs->output.assign(static_cast<std::size_t>(phys.output) * epc_, poison());
      rs->scratch.assign(static_cast<std::size_t>(phys.scratch) * epc_, poison());
      rs->inbox.resize(plan.ranks[r].inbound.size());
      rs->next.assign(s.ranks[r].threadBlocks.size(), 0);
      ranks_.push_back(std::move(rs));
    }
    // Inputs after the poison, so in-place aliases of the output get real values.
    for (int r = 0; r < s.nRanks; ++r) {
      const int inputs = core::logicalSizes(s, r).input;
      for (int c = 0; c < inputs; ++c) {
        if (!core::inputDefined(s, r, c)) continue;
        float* p = chunk(r, BufferKind::Input, c);
        for (std::size_t e = 0; e < epc_; ++e) p[e] = values.at(r, c, e);
      }
    }
  }

  // Runs to completion, deadlock, error or timeout; appends errors and mismatches to the report.
  void execute(CheckReport& report) {
    for (int r = 0; r < s_.nRanks; ++r) {
      for (const core::LocalCopy& lc : s_.ranks[r].localCopies) {
        std::memmove(chunk(r, BufferKind::Output, lc.outputOffset), chunk(r, BufferKind::Input, lc.inputOffset),
                     epc_ * sizeof(float));
      }
    }
    const int n = s_.nRanks;
    bool timedOut = false;
    bool deadlock = false;
    {
      std::vector<std::jthread> threads;
      threads.reserve(static_cast<std::size_t>(n));
      try {
        for (int r = 0; r < n; ++r) {
          threads.emplace_back([this, r](std::stop_token st) { rankMain(st, r); });
        }
      } catch (...) {
        stopAll(threads);  // the threads already started must not be left parked: the joins would hang
        throw;
      }
      // The progress monitor: all ranks idle (parked with nothing receivable, or finished) is exact, since an idle
      // rank sends nothing; the timeout catches anything else that stops completing steps.
      const auto slice = std::max<std::chrono::milliseconds>(opt_.timeout / 4, std::chrono::milliseconds(1));
      {
        std::unique_lock lk(globalMu_);
        std::uint64_t lastProgress = progress_.load(std::memory_order_relaxed);
        auto lastChange = Clock::now();
        while (!failed_ && idle_ < n) {
          globalCv_.wait_for(lk, slice, [&] { return failed_ || idle_ >= n; });
          if (failed_ || idle_ >= n) break;
          const std::uint64_t p = progress_.load(std::memory_order_relaxed);
          if (p != lastProgress) {
            lastProgress = p;
            lastChange = Clock::now();
          } else if (Clock::now() - lastChange >= opt_.timeout) {
            timedOut = true;
            break;
          }
        }
        deadlock = !failed_ && !timedOut && finished_ < n;
      }
      stopAll(threads);
    }  // joins
    const std::string tag(core::toString(mode_));
    for (auto& e : errors_) addError(report, e.kind, fmt::format("{}: {}", tag, e.message));
    if (deadlock || timedOut) {
      addError(report, ErrorKind::Hang,
               deadlock ? fmt::format("{}: deadlock: every unfinished rank is blocked and no message it can receive "
                                      "is queued",
                                      tag)
                        : fmt::format("{}: hang: no step completed within {} ms", tag, opt_.timeout.count()));
      reportStuck(report, tag);
    }
    const bool allFinished = std::all_of(ranks_.begin(), ranks_.end(), [](const auto& rs) { return rs->finished; });
    if (!allFinished) return;  // stopped early: the outputs mean nothing
    reportLeftovers(report, tag);
    compare(report);
  }

 private:
  enum class StepResult : std::uint8_t { Done, NotReady, Failed };

  void stopAll(std::vector<std::jthread>& threads) {
    for (auto& t : threads) t.request_stop();
    for (auto& rs : ranks_) {
      std::lock_guard lk(rs->mu);  // a thread between its predicate check and its wait still gets the notify
      rs->cv.notify_all();
    }
  }

  static void addError(CheckReport& report, ErrorKind k, std::string msg) {
    report.errors.push_back(std::move(msg));
    report.errorKinds.push_back(k);
  }

  float* chunk(int rank, BufferKind buf, int index) {
    const core::Slot slot = core::resolveSlot(s_, rank, mode_, buf, index);
    RankState& rs = *ranks_[rank];
    std::vector<float>& b = slot.buf == BufferKind::Input    ? rs.input
                            : slot.buf == BufferKind::Output ? rs.output
                                                             : rs.scratch;
    return b.data() + static_cast<std::size_t>(slot.index) * epc_;
  }

  std::vector<float> gather(int rank, BufferKind buf, int off, int count) {
    std::vector<float> v(static_cast<std::size_t>(count) * epc_);
    for (int c = 0; c < count; ++c) {
      std::memcpy(v.data() + static_cast<std::size_t>(c) * epc_, chunk(rank, buf, off + c), epc_ * sizeof(float));
    }
    return v;
  }

  void scatter(int rank, BufferKind buf, int off, const std::vector<float>& v) {
    const int count = static_cast<int>(v.size() / epc_);
    for (int c = 0; c < count; ++c) {
      std::memcpy(chunk(rank, buf, off + c), v.data() + static_cast<std::size_t>(c) * epc_, epc_ * sizeof(float));
    }
  }

  static void accumulate(std::vector<float>& acc, const std::vector<float>& add) {
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += add[i];
  }

  void fail(ErrorKind k, std::string msg) {
    std::lock_guard lk(globalMu_);
    errors_.push_back({k, std::move(msg)});
    failed_ = true;
    globalCv_.notify_all();
  }

  void deliver(int to, int conn, Message msg) {
    RankState& rs = *ranks_[to];
    {
      std::lock_guard lk(rs.mu);
      rs.inbox[conn].push_back(std::move(msg));
      ++rs.arrivals;
      if (rs.waiting) {
        // Un-idle the receiver here, while the sender is still running, so the monitor never sees everyone idle
        // with a message in flight.
        rs.waiting = false;
        std::lock_guard g(globalMu_);
        --idle_;
      }
    }
    rs.cv.notify_one();
  }

  StepResult tryStep(int r, int t) {
    RankState& rs = *ranks_[r];
    const core::ThreadBlock& tb = s_.ranks[r].threadBlocks[t];
    const TbPlan& tp = plan_.ranks[r].tbs[t];
    const int i = rs.next[t];
    const Step& st = tb.steps[i];
    for (const auto& [dt, ds] : tp.deps[i]) {
      if (rs.next[dt] <= ds) return StepResult::NotReady;
    }
    Message in;
    if (core::opReceives(st.op)) {
      std::unique_lock lk(rs.mu);
      auto& q = rs.inbox[tp.recvConn];
      if (q.empty()) return StepResult::NotReady;
      if (q.front().count != st.count) {
        const Message& m = q.front();
        const std::string msg = fmt::format(
            "{}: receives {} chunk(s) from rank {} on channel {}, but the message there (sent by rank {} "
            "tb {} step {}) has {}",
            where(r, tb.id, i, st.op), st.count, tb.recvPeer, tb.channel, tb.recvPeer, m.fromTb, m.fromStep, m.count);
        lk.unlock();
        fail(ErrorKind::CountMismatch, msg);
        return StepResult::Failed;
      }
      in = std::move(q.front());
      q.pop_front();
    }
    Message out;
    bool send = false;
    switch (st.op) {
      case StepOp::Send:
        out.data = gather(r, st.srcBuf, st.srcOff, st.count);
        send = true;
        break;
      case StepOp::Recv:
        scatter(r, st.dstBuf, st.dstOff, in.data);
        break;
      case StepOp::RecvCopySend:
        scatter(r, st.dstBuf, st.dstOff, in.data);
        out.data = std::move(in.data);
        send = true;
        break;
      case StepOp::RecvReduceSend:
        out.data = gather(r, st.srcBuf, st.srcOff, st.count);
        accumulate(out.data, in.data);
        send = true;
        break;
      case StepOp::RecvReduceCopy:
      case StepOp::RecvReduceCopySend:
        out.data = gather(r, st.srcBuf, st.srcOff, st.count);
        accumulate(out.data, in.data);
        scatter(r, st.dstBuf, st.dstOff, out.data);
        send = st.op == StepOp::RecvReduceCopySend;
        break;
      case StepOp::Copy:
        scatter(r, st.dstBuf, st.dstOff, gather(r, st.srcBuf, st.srcOff, st.count));
        break;
      case StepOp::Reduce: {
        std::vector<float> acc = gather(r, st.dstBuf, st.dstOff, st.count);
        accumulate(acc, gather(r, st.srcBuf, st.srcOff, st.count));
        scatter(r, st.dstBuf, st.dstOff, acc);
        break;
      }
      case StepOp::Nop:
        break;
    }
    if (send) {
      out.count = st.count;
      out.fromTb = tb.id;
      out.fromStep = i;
      deliver(tp.sendRank, tp.sendConn, std::move(out));
    }
    ++rs.next[t];
    progress_.fetch_add(1, std::memory_order_relaxed);
    return StepResult::Done;
  }

  // One rank's thread: interleaves the rank's blocks cooperatively, one step per block per pass, and parks on the
  // rank's condition variable when nothing is runnable (only a message arrival can change that: deps are local).
  void rankMain(const std::stop_token& stop, int r) {
    RankState& rs = *ranks_[r];
    const auto& tbs = s_.ranks[r].threadBlocks;
    const int nTb = static_cast<int>(tbs.size());
    while (!stop.stop_requested()) {
      std::uint64_t seen = 0;
      {
        std::lock_guard lk(rs.mu);
        seen = rs.arrivals;
      }
      bool progressed = false;
      bool done = true;
      for (int t = 0; t < nTb; ++t) {
        if (rs.next[t] >= static_cast<int>(tbs[t].steps.size())) continue;
        switch (tryStep(r, t)) {
          case StepResult::Done:
            progressed = true;
            break;
          case StepResult::NotReady:
            break;
          case StepResult::Failed:
            return;
        }
        if (rs.next[t] < static_cast<int>(tbs[t].steps.size())) done = false;
      }
      if (done) {
        rs.finished = true;
        std::lock_guard g(globalMu_);
        ++finished_;
        if (++idle_ >= s_.nRanks) globalCv_.notify_all();
        return;
      }
      if (progressed) continue;
      std::unique_lock lk(rs.mu);
      if (rs.arrivals != seen) continue;  // something arrived during the pass: look again
      rs.waiting = true;
      {
        std::lock_guard g(globalMu_);
        if (++idle_ >= s_.nRanks) globalCv_.notify_all();
      }
      rs.cv.wait(lk, [&] { return !rs.waiting || stop.stop_requested(); });
    }
  }

  void reportStuck(CheckReport& report, const std::string& tag) {
    std::size_t listed = 0;
    std::size_t stuck = 0;
    for (int r = 0; r < s_.nRanks; ++r) {
      RankState& rs = *ranks_[r];
      const auto& tbs = s_.ranks[r].threadBlocks;
      for (std::size_t t = 0; t < tbs.size(); ++t) {
        const int i = rs.next[t];
        if (i >= static_cast<int>(tbs[t].steps.size())) continue;
        ++stuck;
        if (listed >= kMaxStuckListed) continue;
        ++listed;
        const Step& st = tbs[t].steps[i];
        const TbPlan& tp = plan_.ranks[r].tbs[t];
        std::string why;
        for (const auto& [dt, ds] : tp.deps[i]) {
          if (rs.next[dt] > ds) continue;
          const auto& dtb = tbs[dt];
          why = fmt::format("waits for {}, which has not completed (tb {} is at step {})",
                            where(r, dtb.id, ds, dtb.steps[ds].op), dtb.id, rs.next[dt]);
          break;
        }
        if (why.empty() && core::opReceives(st.op)) {
          const auto& q = rs.inbox[tp.recvConn];
          why = q.empty() ? fmt::format("waits for a message from rank {} on channel {} (none queued)", tbs[t].recvPeer,
                                        tbs[t].channel)
                          : fmt::format("has a message from rank {} on channel {} queued (stopped before it ran)",
                                        tbs[t].recvPeer, tbs[t].channel);
        }
        if (why.empty()) why = "is runnable (stopped before it ran)";
        addError(report, ErrorKind::Hang, fmt::format("{}: stuck: {} {}", tag, where(r, tbs[t].id, i, st.op), why));
      }
    }
    if (stuck > listed) {
      addError(report, ErrorKind::Hang, fmt::format("{}: ... and {} more stuck blocks", tag, stuck - listed));
    }
  }

  void reportLeftovers(CheckReport& report, const std::string& tag) {
    for (int r = 0; r < s_.nRanks; ++r) {
      const RankState& rs = *ranks_[r];
      for (std::size_t c = 0; c < rs.inbox.size(); ++c) {
        const auto& q = rs.inbox[c];
        if (q.empty()) continue;
        const auto [from, channel] = plan_.ranks[r].inbound[c];
        addError(report, ErrorKind::Leftover,
                 fmt::format("{}: {} message(s) from rank {} to rank {} on channel {} were never received (the first "
                             "sent by rank {} tb {} step {})",
                             tag, q.size(), from, r, channel, from, q.front().fromTb, q.front().fromStep));
      }
    }
  }

  void compare(CheckReport& report) {
    compareOutputs(
        s_, mode_, values_, [this](int r, int o) -> const float* { return chunk(r, BufferKind::Output, o); },
        opt_.maxMismatches, report);
  }

  const Schedule& s_;
  const Plan& plan_;
  const CheckOptions& opt_;
  BufferMode mode_;
  const InputValues& values_;
  std::size_t epc_;
  std::vector<std::unique_ptr<RankState>> ranks_;

  std::atomic<std::uint64_t> progress_{0};  // steps completed, all ranks
  std::mutex globalMu_;                     // lock order: a rank's mu before globalMu_
  std::condition_variable globalCv_;
  int idle_ = 0;      // ranks parked with nothing runnable, or finished (guarded by globalMu_)
  int finished_ = 0;  // guarded by globalMu_
  bool failed_ = false;
  std::vector<Error> errors_;  // guarded by globalMu_
};

}  // namespace

ReferenceInputs::ReferenceInputs(const Schedule& s, std::uint64_t seed, int elementsPerChunk)
    : seed_(splitmix64(seed)), epc_(static_cast<std::size_t>(std::max(elementsPerChunk, 1))) {
  range_ = 1U << 16U;
  while (range_ > 1 && static_cast<std::uint64_t>(range_) * static_cast<std::uint64_t>(s.nRanks) > (1ULL << 24U)) {
    range_ >>= 1U;
  }
  // Tabulated once: the output check reads every input element once per rank that needs it.
  for (int r = 0; r < s.nRanks; ++r) {
    offsets_.push_back(table_.size());
    chunks_.push_back(core::logicalSizes(s, r).input);
    for (int c = 0; c < chunks_.back(); ++c) {
      for (std::size_t e = 0; e < epc_; ++e) table_.push_back(compute(r, c, e));
    }
  }
}

float ReferenceInputs::at(int rank, int chunk, std::size_t element) const {
  if (rank >= 0 && rank < static_cast<int>(chunks_.size()) && chunk >= 0 && chunk < chunks_[rank]) {
    return table_[offsets_[rank] + static_cast<std::size_t>(chunk) * epc_ + element];
  }
  return compute(rank, chunk, element);
}

float ReferenceInputs::compute(int rank, int chunk, std::size_t element) const {
  std::uint64_t h = splitmix64(seed_ ^ static_cast<std::uint64_t>(rank));
  h = splitmix64(h ^ (static_cast<std::uint64_t>(chunk) << 20U));
  h = splitmix64(h ^ static_cast<std::uint64_t>(element));
  return static_cast<float>(1 + h % range_);
}

float poisonValue() { return poison(); }

void compareOutputs(const Schedule& s, BufferMode mode, const ReferenceInputs& inputs,
                    const std::function<const float*(int rank, int outputIndex)>& outputChunk,
                    std::size_t maxMismatches, CheckReport& report) {
  const std::size_t epc = static_cast<std::size_t>(inputs.elementsPerChunk());
  // Many output chunks share their terms (every rank's chunk o of an All-Reduce): compute each sum once.
  std::map<std::vector<core::Contribution>, std::vector<float>> sums;
  for (int r = 0; r < s.nRanks; ++r) {
    const int outputs = core::logicalSizes(s, r).output;
    for (int o = 0; o < outputs; ++o) {
      core::Expected e = core::expectedOutput(s, r, o);
      if (!e.constrained) continue;
      auto [it, inserted] = sums.try_emplace(std::move(e.terms));
      std::vector<float>& expected = it->second;
      if (inserted) {
        expected.resize(epc);
        for (std::size_t el = 0; el < epc; ++el) {
          double sum = 0;  // exact: the inputs are small integers
          for (const core::Contribution& c : it->first) sum += inputs.at(c.rank, c.index, el);
          expected[el] = static_cast<float>(sum);
        }
      }
      const float* actual = outputChunk(r, o);
      if (actual == nullptr) continue;  // a rank this process does not hold
      Mismatch m;
      for (std::size_t el = 0; el < epc; ++el) {
        if (std::bit_cast<std::uint32_t>(expected[el]) == std::bit_cast<std::uint32_t>(actual[el])) continue;
        if (m.differing++ == 0) {
          m.element = static_cast<int>(el);
          m.expected = expected[el];
          m.actual = actual[el];
        }
      }
      if (m.differing == 0) continue;
      ++report.mismatchCount;
      if (report.mismatches.size() < maxMismatches) {
        m.mode = mode;
        m.rank = r;
        m.outputIndex = o;
        report.mismatches.push_back(m);
      }
    }
  }
}

std::string_view toString(ErrorKind k) {
  switch (k) {
    case ErrorKind::Shape:
      return "shape";
    case ErrorKind::Reference:
      return "reference";
    case ErrorKind::Connection:
      return "connection";
    case ErrorKind::CountMismatch:
      return "count-mismatch";
    case ErrorKind::Hang:
      return "hang";
    case ErrorKind::Leftover:
      return "leftover";
    case ErrorKind::Resource:
      return "resource";
  }
  return "?";
}

bool CheckReport::hasError(ErrorKind k) const {
  return std::find(errorKinds.begin(), errorKinds.end(), k) != errorKinds.end();
}

CheckReport runReference(const core::Schedule& schedule, const CheckOptions& options) {
  const auto start = Clock::now();
  CheckReport report;
  auto finish = [&] {
    report.passed = report.errors.empty() && report.mismatchCount == 0 && !report.modesRun.empty();
    report.elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    return report;
  };
  if (options.elementsPerChunk < 1) {
    report.errors.push_back(fmt::format("elementsPerChunk must be at least 1, got {}", options.elementsPerChunk));
    report.errorKinds.push_back(ErrorKind::Shape);
    return finish();
  }
  std::vector<BufferMode> modes;
  if (options.mode) {
    const auto supported = core::supportedModes(schedule);
    if (std::find(supported.begin(), supported.end(), *options.mode) == supported.end()) {
      report.errors.push_back(fmt::format("the schedule does not support {} buffers", core::toString(*options.mode)));
      report.errorKinds.push_back(ErrorKind::Shape);
      return finish();
    }
    modes.push_back(*options.mode);
  } else {
    modes = core::supportedModes(schedule);
  }
  Plan plan;
  for (Error& e : Validator(schedule, modes).run(plan)) {
    report.errors.push_back(std::move(e.message));
    report.errorKinds.push_back(e.kind);
  }
  if (!report.errors.empty()) return finish();
  const InputValues values(schedule, options.seed, options.elementsPerChunk);
  for (BufferMode m : modes) {
    try {
      Run run(schedule, plan, options, m, values);
      run.execute(report);
    } catch (const std::exception& e) {  // buffers too large to allocate, threads that cannot be started
      report.errors.push_back(fmt::format("{}: could not run: {}", core::toString(m), e.what()));
      report.errorKinds.push_back(ErrorKind::Resource);
    }
    report.modesRun.push_back(m);
  }
  return finish();
}

}  // namespace optiflow::sim
