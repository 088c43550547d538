// The order of every thread block's steps: list scheduling over the blocks (docs/compiler.md). An abstract run of
// the schedule in which every block, whenever it is free, takes the step that can start first among those whose
// inputs are complete (ties: the longest chain of work behind it first, then creation order). A step waits for its
// dependencies; a receive also waits for its data and takes its connection's messages in the order they were sent.
// The order in which each block took its steps is the order we emit, so every block's order is one the machine can
// actually run: the schedule cannot deadlock, and both ends of every connection agree on its message order by
// construction.
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "scheduler_internal.h"

namespace optiflow::compiler::detail {

namespace {

// What every communicating step costs beyond its data in the list scheduler's estimate, by protocol in
// core::Protocol's order (LL, LL128, Simple): the simulator's calibrated per-step synchronisation
// (docs/simulator.md, SimParams::stepSyncUs).
constexpr double kStepSyncUs[core::kNumProtocols] = {0.0, 1.0, 9.0};

class ListRun {
 public:
  ListRun(const std::vector<Op>& ops, const std::vector<int>& deps, const std::vector<Hop>& hops,
          std::vector<std::vector<Block>>& blocks, int nRanks, Protocol proto, bool creationOrder)
      : ops_(ops),
        deps_(deps),
        hops_(hops),
        blocks_(blocks),
        nRanks_(nRanks),
        sync_(kStepSyncUs[static_cast<int>(proto)]),
        creationOrder_(creationOrder),
        nOps_(ops.size()) {}

  // Appends every step to its block's `ops` in the order the run took them; false with `error` set when the run
  // gets stuck (a dependency cycle through a connection's message order).
  bool run(std::string& error);

 private:
  // Per block: steps whose inputs are complete (by priority), and those that become ready later (by time).
  struct Avail {
    double negUp;
    int op;
    bool operator>(const Avail& e) const { return negUp != e.negUp ? negUp > e.negUp : op > e.op; }
  };
  struct Future {
    double t;
    double negUp;
    int op;
    bool operator>(const Future& e) const {
      if (t != e.t) return t > e.t;
      return negUp != e.negUp ? negUp > e.negUp : op > e.op;
    }
  };
  struct TbState {
    double free = 0;
    std::priority_queue<Avail, std::vector<Avail>, std::greater<>> avail;
    std::priority_queue<Future, std::vector<Future>, std::greater<>> future;
  };
  struct OpRun {
    double ready = 0;
    double negUp = 0;
    double dur = 0;
    int need = 0;
    int tb = 0;  // global block
    int hop = kNone;
    int fusedSend = kNone;
    OpKind kind = OpKind::Send;
  };
  struct HopRun {
    double arrival = 0;
    int recvOp = kNone;
    int senderTb = 0;  // global block of the send
    int next = kNone;  // the hop its block sent next (the block's in-flight list)
  };

  // The step an op lives in (a fused send lives in its receive's step).
  int stepOf(int op) const { return ops_[op].absorbed ? ops_[op].fusedInto : op; }

  // Phases, in the order run() takes them.
  // What each step waits for and whom it releases, with fused sends folded into their receive's step.
  void foldDependencies();
  // One global id per block, so the run's per-block state (queues, in-flight messages) is flat arrays.
  void numberBlocks();
  // What the run reads of every op and hop, packed together (ops_ is large; the run visits it in no useful order).
  void pack();
  // With creationOrder_, chains every block's sends so each connection carries its messages in creation order.
  void chainCreationOrder();
  // The steps ready at time 0, and every block queued for when it can first start something.
  void seed();
  // The discrete-event run itself; returns how many steps it took (all of them unless it got stuck), nullopt
  // (error set) if perform() found a bug.
  std::optional<std::size_t> runBlocks(std::string& error);
  // Takes step `opId` on its block at `start`; returns when it is done, nullopt (error set) if a receive would be
  // taken out of its connection's order (a bug).
  std::optional<double> perform(int opId, double start, std::string& error);

  // The run's events.
  int popEarliest();
  void wake(int tb);
  void release(int op, double at);
  void issue(int sendOp, double at);

  const std::vector<Op>& ops_;
  const std::vector<int>& deps_;
  const std::vector<Hop>& hops_;
  std::vector<std::vector<Block>>& blocks_;
  const int nRanks_;
  const double sync_;
  const bool creationOrder_;
  const std::size_t nOps_;

  std::vector<int> need_;
  std::vector<int> depStart_;
  std::vector<int> children_;
  std::vector<int> tbBase_;
  int nTb_ = 0;
  // Per block: when it is free, the steps whose inputs are complete (by priority), and those that become ready
  // later (by time). A global queue holds, per block, when it can next start something (at most one live entry per
  // block, moved up when the block can start earlier). Releases never go back in time, so this is a plain
  // discrete-event run.
  std::vector<TbState> tbs_;
  std::vector<std::vector<int>*> tbOps_;  // the block's emitted order
  std::vector<OpRun> run_;
  std::vector<HopRun> hopRun_;
  // Per sending block: the messages sent and not yet received, in order (a list through HopRun::next).
  std::vector<int> inFlightHead_;
  std::vector<int> inFlightTail_;
  // The blocks waiting to start something, by (pendingAt, block). A symmetric schedule has thousands of blocks
  // waiting for a handful of distinct times, so: an ordered map of the distinct times, each with a min-heap of
  // block ids. A block woken earlier than it was queued leaves its old entry behind; entries whose time is no
  // longer the block's pendingAt are skipped when they surface.
  std::vector<double> pendingAt_;
  std::map<double, std::vector<int>> waiting_;
  std::vector<std::vector<int>> spareBuckets_;  // emptied buckets, kept for their capacity
  std::vector<int> nextSend_;                   // with creationOrder_: per send, its block's next send
};

bool ListRun::run(std::string& error) {
  foldDependencies();
  numberBlocks();
  pack();
  chainCreationOrder();
  seed();
  std::size_t steps = 0;
  for (const Op& o : ops_) steps += o.absorbed ? 0 : 1;
  const std::optional<std::size_t> scheduled = runBlocks(error);
  if (!scheduled) return false;
  if (*scheduled != steps) {
    error = fmt::format(
        "could not order {} of {} steps: the program's dependencies and the connections' message order form a cycle",
        steps - *scheduled, steps);
    return false;
  }
  return true;
}

void ListRun::foldDependencies() {
  need_.assign(nOps_, 0);
  depStart_.assign(nOps_ + 1, 0);
  // The dependencies of every step (fused sends folded into their receive), deduplicated, then inverted.
  std::vector<int> flat;
  std::vector<int> flatStart(nOps_ + 1, 0);
  flat.reserve(deps_.size());
  std::vector<int> count(nOps_, 0);
  for (std::size_t i = 0; i < nOps_; ++i) {
    const Op& o = ops_[i];
    const std::size_t begin = flat.size();
    if (!o.absorbed) {
      for (int d = 0; d < o.depCount; ++d) {
        const int s = stepOf(deps_[o.depBegin + d]);
        if (s != static_cast<int>(i)) flat.push_back(s);
      }
      std::sort(flat.begin() + static_cast<std::ptrdiff_t>(begin), flat.end());
      flat.erase(std::unique(flat.begin() + static_cast<std::ptrdiff_t>(begin), flat.end()), flat.end());
      need_[i] = static_cast<int>(flat.size() - begin) + (o.kind == OpKind::Recv ? 1 : 0);
      for (std::size_t k = begin; k < flat.size(); ++k) ++count[flat[k]];
    }
    flatStart[i + 1] = static_cast<int>(flat.size());
  }
  for (std::size_t i = 0; i < nOps_; ++i) depStart_[i + 1] = depStart_[i] + count[i];
  children_.resize(depStart_[nOps_]);
  std::vector<int> fill(depStart_.begin(), depStart_.end() - 1);
  for (std::size_t i = 0; i < nOps_; ++i) {
    for (int k = flatStart[i]; k < flatStart[i + 1]; ++k) children_[fill[flat[k]]++] = static_cast<int>(i);
  }
}

void ListRun::numberBlocks() {
  tbBase_.assign(nRanks_ + 1, 0);
  for (int r = 0; r < nRanks_; ++r) tbBase_[r + 1] = tbBase_[r] + static_cast<int>(blocks_[r].size());
  nTb_ = tbBase_[nRanks_];
  tbs_.resize(nTb_);
  tbOps_.resize(nTb_);
  for (int r = 0; r < nRanks_; ++r) {
    for (std::size_t b = 0; b < blocks_[r].size(); ++b) {
      tbOps_[tbBase_[r] + static_cast<int>(b)] = &blocks_[r][b].ops;
    }
  }
  inFlightHead_.assign(nTb_, kNone);
  inFlightTail_.assign(nTb_, kNone);
  pendingAt_.assign(nTb_, std::numeric_limits<double>::infinity());
}

void ListRun::pack() {
  run_.resize(nOps_);
  for (std::size_t i = 0; i < nOps_; ++i) {
    const Op& o = ops_[i];
    OpRun& x = run_[i];
    x.negUp = -o.up;
    x.dur = o.dur;
    x.need = need_[i];
    x.tb = tbBase_[o.rank] + o.tb;
    x.hop = o.hop;
    x.fusedSend = o.fusedSend;
    x.kind = o.kind;
  }
  hopRun_.resize(hops_.size());
  for (std::size_t h = 0; h < hops_.size(); ++h) {
    hopRun_[h].recvOp = hops_[h].recvOp;
    hopRun_[h].senderTb = run_[hops_[h].sendOp].tb;
  }
}

// Without creationOrder_ a sender may overtake an earlier message, which is faster (it sends what is ready) but can
// leave a receiver whose own dependencies follow creation order (several reductions into one slot through a relay,
// for instance) waiting forever; compile() then retries with it (a valid sequential order of the program).
void ListRun::chainCreationOrder() {
  if (!creationOrder_) return;
  nextSend_.assign(nOps_, kNone);
  std::vector<int> lastSend(nTb_, kNone);
  for (std::size_t i = 0; i < nOps_; ++i) {
    if (ops_[i].kind != OpKind::Send) continue;
    const int tb = run_[i].tb;
    if (lastSend[tb] != kNone) {
      nextSend_[lastSend[tb]] = static_cast<int>(i);
      ++run_[stepOf(static_cast<int>(i))].need;
    }
    lastSend[tb] = static_cast<int>(i);
  }
}

void ListRun::seed() {
  for (std::size_t i = 0; i < nOps_; ++i) {
    if (!ops_[i].absorbed && run_[i].need == 0) {
      tbs_[run_[i].tb].future.push({0.0, run_[i].negUp, static_cast<int>(i)});
    }
  }
  for (int tb = 0; tb < nTb_; ++tb) wake(tb);
}

std::optional<std::size_t> ListRun::runBlocks(std::string& error) {
  std::size_t scheduled = 0;
  for (;;) {
    const int tb = popEarliest();
    if (tb == kNone) break;
    TbState& st = tbs_[tb];
    const double now = pendingAt_[tb];
    pendingAt_[tb] = std::numeric_limits<double>::infinity();
    while (!st.future.empty() && st.future.top().t <= now) {
      st.avail.push({st.future.top().negUp, st.future.top().op});
      st.future.pop();
    }
    if (st.avail.empty()) {
      wake(tb);
      continue;
    }
    const int opId = st.avail.top().op;
    st.avail.pop();
    const std::optional<double> done = perform(opId, now, error);
    if (!done) return std::nullopt;
    st.free = *done;
    tbOps_[tb]->push_back(opId);
    ++scheduled;
    for (int c = depStart_[opId]; c < depStart_[opId + 1]; ++c) release(children_[c], *done);
    wake(tb);
  }
  return scheduled;
}

std::optional<double> ListRun::perform(int opId, double start, std::string& error) {
  const OpRun& o = run_[opId];
  double done = start;
  switch (o.kind) {
    case OpKind::Copy:
      done = start + o.dur;
      break;
    case OpKind::Send:
      done = start + sync_ + o.dur;
      issue(opId, done);
      break;
    case OpKind::Recv: {
      const HopRun& h = hopRun_[o.hop];
      const int senderTb = h.senderTb;
      done = std::max(start + sync_, h.arrival);
      if (o.fusedSend != kNone) {
        const double fdur = run_[o.fusedSend].dur;
        // Cut-through: the forward streams while the input arrives.
        const double fwd = std::max(start + sync_ + fdur, h.arrival + 0.1 * fdur);
        done = std::max(done, fwd);
        issue(o.fusedSend, fwd);
      }
      if (inFlightHead_[senderTb] != o.hop) {
        error = "internal error: a receive was ordered out of its connection's order";
        return std::nullopt;
      }
      const int next = h.next;
      inFlightHead_[senderTb] = next;
      if (next == kNone) {
        inFlightTail_[senderTb] = kNone;
      } else {
        release(hopRun_[next].recvOp, hopRun_[next].arrival);
      }
      break;
    }
  }
  return done;
}

int ListRun::popEarliest() {
  while (!waiting_.empty()) {
    auto it = waiting_.begin();
    std::vector<int>& bucket = it->second;
    while (!bucket.empty()) {
      std::pop_heap(bucket.begin(), bucket.end(), std::greater<>());
      const int tb = bucket.back();
      bucket.pop_back();
      if (pendingAt_[tb] == it->first) return tb;
    }
    spareBuckets_.push_back(std::move(bucket));
    waiting_.erase(it);
  }
  return kNone;
}

void ListRun::wake(int tb) {
  TbState& st = tbs_[tb];
  double t;
  if (!st.avail.empty()) {
    t = st.free;
  } else if (!st.future.empty()) {
    t = std::max(st.free, st.future.top().t);
  } else {
    return;
  }
  if (t >= pendingAt_[tb]) return;  // already queued no later than that
  pendingAt_[tb] = t;
  auto [it, fresh] = waiting_.try_emplace(t);
  if (fresh && !spareBuckets_.empty()) {
    it->second = std::move(spareBuckets_.back());
    spareBuckets_.pop_back();
  }
  it->second.push_back(tb);
  std::push_heap(it->second.begin(), it->second.end(), std::greater<>());
}

void ListRun::release(int op, double at) {
  OpRun& x = run_[op];
  x.ready = std::max(x.ready, at);
  if (--x.need == 0) {
    tbs_[x.tb].future.push({x.ready, x.negUp, op});
    wake(x.tb);
  }
}

void ListRun::issue(int sendOp, double at) {
  const int hop = run_[sendOp].hop;
  if (creationOrder_ && nextSend_[sendOp] != kNone) release(stepOf(nextSend_[sendOp]), at);
  HopRun& h = hopRun_[hop];
  h.arrival = at;
  const int tb = h.senderTb;
  if (inFlightHead_[tb] == kNone) {
    inFlightHead_[tb] = inFlightTail_[tb] = hop;
    release(h.recvOp, at);
  } else {
    hopRun_[inFlightTail_[tb]].next = hop;
    inFlightTail_[tb] = hop;
  }
}

}  // namespace

bool Scheduler::order() { return ListRun(ops_, deps_, hops_, blocks_, n(), proto_, creationOrder_).run(error_); }

}  // namespace optiflow::compiler::detail
