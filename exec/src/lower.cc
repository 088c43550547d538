#include "optiflow/exec/levels.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace optiflow::exec {

namespace {

using core::BufferKind;
using core::BufferMode;
using core::Schedule;
using core::Step;
using core::StepOp;

// A connection in one direction: sender, receiver, channel.
using ConnKey = std::tuple<int, int, int>;
// One message: its connection and its index on it.
using MsgKey = std::tuple<int, int, int, int>;

// A node of the level graph: a transfer (one send matched with its receive, possibly on two ranks' timelines) or
// one rank's local computation. Stages: even numbers are local work before group stage/2, odd numbers are groups.
struct Node {
  bool transfer = false;
  int rank = -1;        // compute: the rank; transfer: the sender
  int order = 0;        // compute: position in the rank's sequence (local work of one stage runs in this order)
  std::vector<Op> ops;  // compute: the local ops
  // transfer
  int to = -1;
  int channel = 0;
  int seq = 0;
  int sendCount = -1;  // -1: no send seen
  int recvCount = -1;  // -1: no receive seen
  Ref src;
  Ref dst;
  std::string sendWhere;  // for diagnostics
  std::string recvWhere;
};

std::string stepWhere(int rank, int tbId, std::size_t step, StepOp op) {
  return fmt::format("rank {} tb {} step {} ({})", rank, tbId, step, core::toString(op));
}

Buffer physical(BufferKind k) {
  switch (k) {
    case BufferKind::Input:
      return Buffer::Input;
    case BufferKind::Output:
      return Buffer::Output;
    case BufferKind::Scratch:
      return Buffer::Scratch;
  }
  return Buffer::Input;
}

class Lowering {
 public:
  Lowering(const Schedule& s, BufferMode mode, const std::set<std::pair<int, int>>& snapshot)
      : s_(s), mode_(mode), snapshot_(snapshot) {}

  // Builds the graph; an empty message means success.
  std::string build() {
    const int n = s_.nRanks;
    temps_.assign(static_cast<std::size_t>(n), 0);
    slotBase_.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const core::BufferSizes phys = core::physicalSizes(s_, r, mode_);
      slotBase_[r] = {0, phys.input, phys.input + phys.output, phys.input + phys.output + phys.scratch};
      lastWriter_.clear();
      readers_.clear();
      if (std::string e = buildRank(r); !e.empty()) return e;
    }
    for (const auto& [key, id] : transferIds_) {
      const Node& t = nodes_[id];
      const auto& [from, to, ch, seq] = key;
      if (t.sendCount < 0) {
        return fmt::format("{} receives message {} from rank {} on channel {}, which rank {} never sends", t.recvWhere,
                           seq, from, ch, from);
      }
      if (t.recvCount < 0) {
        return fmt::format("{} sends message {} to rank {} on channel {}, which rank {} never receives", t.sendWhere,
                           seq, to, ch, to);
      }
      if (t.sendCount != t.recvCount) {
        return fmt::format("{} sends {} chunk(s) to rank {} on channel {}, but the matching receive ({}) takes {}",
                           t.sendWhere, t.sendCount, to, ch, t.recvWhere, t.recvCount);
      }
    }
    return {};
  }

  // Stages by longest path; an empty message means success.
  std::string stage() {
    const std::size_t n = nodes_.size();
    std::vector<std::vector<int>> out(n);
    std::vector<int> indeg(n, 0);
    for (const auto& [u, v] : edges_) {
      out[u].push_back(v);
      ++indeg[v];
    }
    stages_.assign(n, 0);
    std::vector<int> ready;
    for (std::size_t i = 0; i < n; ++i) {
      stages_[i] = nodes_[i].transfer ? 1 : 0;
      if (indeg[i] == 0) ready.push_back(static_cast<int>(i));
    }
    std::size_t done = 0;
    while (!ready.empty()) {
      const int u = ready.back();
      ready.pop_back();
      ++done;
      for (int v : out[u]) {
        const int su = stages_[u];
        // A group comes strictly after whatever it depends on; local work may share a stage with earlier local work.
        const int need = nodes_[v].transfer ? (su % 2 == 0 ? su + 1 : su + 2) : (su % 2 == 0 ? su : su + 1);
        stages_[v] = std::max(stages_[v], need);
        if (--indeg[v] == 0) ready.push_back(v);
      }
    }
    if (done == n) return {};
    // Name one transfer on a cycle: one still waiting whose predecessors include waiting nodes.
    for (std::size_t i = 0; i < n; ++i) {
      if (indeg[i] > 0 && nodes_[i].transfer) {
        const Node& t = nodes_[i];
        return fmt::format(
            "no sequence of groups can run this schedule: the transfer of {} to rank {} on channel {} "
            "(message {}) waits, through the data it reads and overwrites, on itself",
            t.sendWhere, t.to, t.channel, t.seq);
      }
    }
    return "no sequence of groups can run this schedule: its local dependencies form a cycle";
  }

  // Send endpoints whose source is overwritten later on their rank: the ones a retry snapshots.
  const std::set<std::pair<int, int>>& overwrittenSends() const { return overwritten_; }

  Lowered emit() const {
    Lowered out;
    out.name = s_.name;
    out.collective = s_.collective;
    out.mode = mode_;
    out.nRanks = s_.nRanks;
    int maxStage = 0;
    for (int st : stages_) maxStage = std::max(maxStage, st);
    const int nLevels = maxStage / 2 + 1;
    for (int r = 0; r < s_.nRanks; ++r) {
      const core::BufferSizes phys = core::physicalSizes(s_, r, mode_);
      const core::BufferSizes logical = core::logicalSizes(s_, r);
      out.chunkUnits = std::max({out.chunkUnits, logical.input, logical.output});
      RankLevels rl;
      rl.rank = r;
      rl.inputChunks = phys.input;
      rl.outputChunks = phys.output;
      rl.scratchChunks = phys.scratch;
      rl.tempChunks = temps_[r];
      rl.levels.resize(static_cast<std::size_t>(nLevels));
      out.ranks.push_back(std::move(rl));
      out.stats.maxTempChunks = std::max(out.stats.maxTempChunks, temps_[r]);
    }
    // Local work in each rank's sequence order.
    std::vector<int> computeIds;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!nodes_[i].transfer) computeIds.push_back(static_cast<int>(i));
    }
    std::sort(computeIds.begin(), computeIds.end(), [&](int a, int b) { return nodes_[a].order < nodes_[b].order; });
    for (int id : computeIds) {
      const Node& c = nodes_[id];
      Level& lv = out.ranks[c.rank].levels[stages_[id] / 2];
      for (const Op& op : c.ops) {
        lv.local.push_back(op);
        if (op.kind == OpKind::Copy) ++out.stats.copies;
        if (op.kind == OpKind::Reduce) ++out.stats.reductions;
      }
    }
    std::vector<bool> groupUsed(static_cast<std::size_t>(nLevels), false);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const Node& t = nodes_[i];
      if (!t.transfer) continue;
      const int level = stages_[i] / 2;
      groupUsed[level] = true;
      Op send;
      send.kind = OpKind::Send;
      send.peer = t.to;
      send.channel = t.channel;
      send.seq = t.seq;
      send.src = t.src;
      send.count = t.sendCount;
      out.ranks[t.rank].levels[level].group.push_back(send);
      Op recv = send;
      recv.kind = OpKind::Recv;
      recv.peer = t.rank;
      recv.src = {};
      recv.dst = t.dst;
      out.ranks[t.to].levels[level].group.push_back(recv);
      ++out.stats.sends;
    }
    for (RankLevels& rl : out.ranks) {
      for (Level& lv : rl.levels) {
        std::sort(lv.group.begin(), lv.group.end(), [](const Op& a, const Op& b) {
          return std::tie(a.peer, a.kind, a.channel, a.seq) < std::tie(b.peer, b.kind, b.channel, b.seq);
        });
        out.stats.maxGroupOps = std::max(out.stats.maxGroupOps, static_cast<int>(lv.group.size()));
      }
    }
    out.stats.levels = nLevels;
    out.stats.groups = static_cast<int>(std::count(groupUsed.begin(), groupUsed.end(), true));
    out.stats.snapshots = snapshot_.size();
    return out;
  }

 private:
  struct Access {
    std::vector<std::pair<Ref, int>> reads;  // (start, count)
    std::vector<std::pair<Ref, int>> writes;
  };

  // Resolves a logical range to one physical range (aliasing keeps ranges contiguous for every collective we know).
  std::string resolve(int r, BufferKind buf, int off, int count, const std::string& where, Ref& out) const {
    const core::BufferSizes logical = core::logicalSizes(s_, r);
    const int size = logical.of(buf);
    if (off < 0 || count < 1 || off > size - count) {
      return fmt::format("{}: {}[{}..{}) is outside the {}-chunk buffer", where, core::toString(buf), off,
                         static_cast<long long>(off) + count, size);
    }
    const core::BufferSizes phys = core::physicalSizes(s_, r, mode_);
    const core::Slot first = core::resolveSlot(s_, r, mode_, buf, off);
    for (int c = 0; c < count; ++c) {
      const core::Slot sl = core::resolveSlot(s_, r, mode_, buf, off + c);
      if (sl.buf != first.buf || sl.index != first.index + c || sl.index < 0 || sl.index >= phys.of(sl.buf)) {
        return fmt::format("{}: {}[{}..{}) does not resolve to one physical range in {} mode", where,
                           core::toString(buf), off, off + count, core::toString(mode_));
      }
    }
    out = {physical(first.buf), first.index};
    return {};
  }

  int slot(int r, Ref ref, int c) const { return slotBase_[r][static_cast<std::size_t>(ref.buf)] + ref.offset + c; }

  void touch(int r, int node, const Access& a) {
    for (const auto& [ref, count] : a.reads) {
      for (int c = 0; c < count; ++c) {
        const int x = slot(r, ref, c);
        if (auto it = lastWriter_.find(x); it != lastWriter_.end() && it->second != node) edge(it->second, node);
        readers_[x].push_back(node);
      }
    }
    for (const auto& [ref, count] : a.writes) {
      for (int c = 0; c < count; ++c) {
        const int x = slot(r, ref, c);
        if (auto it = lastWriter_.find(x); it != lastWriter_.end() && it->second != node) edge(it->second, node);
        auto& rd = readers_[x];
        for (int u : rd) {
          if (u == node) continue;
          edge(u, node);
          if (auto s = sendOf_.find(u); s != sendOf_.end()) overwritten_.insert(s->second);
        }
        rd.clear();
        lastWriter_[x] = node;
      }
    }
  }

  void edge(int u, int v) { edges_.emplace(u, v); }

  int newCompute(int r, std::vector<Op> ops) {
    Node c;
    c.rank = r;
    c.order = order_++;
    c.ops = std::move(ops);
    nodes_.push_back(std::move(c));
    return static_cast<int>(nodes_.size()) - 1;
  }

  int transfer(int from, int to, int ch, int seq) {
    auto [it, inserted] = transferIds_.try_emplace(MsgKey{from, to, ch, seq}, 0);
    if (inserted) {
      Node t;
      t.transfer = true;
      t.rank = from;
      t.to = to;
      t.channel = ch;
      t.seq = seq;
      nodes_.push_back(std::move(t));
      it->second = static_cast<int>(nodes_.size()) - 1;
    }
    return it->second;
  }

  Ref newTemp(int r, int count) {
    Ref t{Buffer::Temp, temps_[r]};
    temps_[r] += count;
    return t;
  }

  static Op copyOp(Ref src, Ref dst, int count) {
    Op o;
    o.kind = OpKind::Copy;
    o.src = src;
    o.dst = dst;
    o.count = count;
    return o;
  }

  static Op reduceOp(Ref a, Ref b, Ref dst, int count) {
    Op o;
    o.kind = OpKind::Reduce;
    o.src = a;
    o.src2 = b;
    o.dst = dst;
    o.count = count;
    return o;
  }

  std::string buildRank(int r) {
    const core::RankProgram& rp = s_.ranks[r];
    const auto& tbs = rp.threadBlocks;
    std::map<int, int> ids;
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      if (!ids.try_emplace(tbs[t].id, static_cast<int>(t)).second) {
        return fmt::format("rank {}: two thread blocks have id {}", r, tbs[t].id);
      }
    }
    // Steps in an order that respects program order and dependencies (Kahn over the rank's steps).
    std::vector<std::size_t> base(tbs.size() + 1, 0);
    for (std::size_t t = 0; t < tbs.size(); ++t) base[t + 1] = base[t] + tbs[t].steps.size();
    const std::size_t nSteps = base.back();
    std::vector<std::vector<std::size_t>> succ(nSteps);
    std::vector<int> indeg(nSteps, 0);
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      for (std::size_t i = 0; i < tbs[t].steps.size(); ++i) {
        const std::size_t id = base[t] + i;
        if (i > 0) {
          succ[id - 1].push_back(id);
          ++indeg[id];
        }
        for (const core::StepRef& d : tbs[t].steps[i].deps) {
          const auto it = ids.find(d.tb);
          if (it == ids.end() || d.step < 0 ||
              d.step >= static_cast<int>(tbs[static_cast<std::size_t>(it->second)].steps.size())) {
            return fmt::format("{}: depends on tb {} step {}, which does not exist",
                               stepWhere(r, tbs[t].id, i, tbs[t].steps[i].op), d.tb, d.step);
          }
          succ[base[static_cast<std::size_t>(it->second)] + static_cast<std::size_t>(d.step)].push_back(id);
          ++indeg[id];
        }
      }
    }
    // Each direction of a connection belongs to one block; messages are numbered along it.
    std::map<ConnKey, int> sendOwner;
    std::map<ConnKey, int> recvOwner;
    std::vector<int> sendSeq(tbs.size(), 0);
    std::vector<int> recvSeq(tbs.size(), 0);
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      const core::ThreadBlock& tb = tbs[t];
      bool sends = false;
      bool receives = false;
      for (const Step& st : tb.steps) {
        sends = sends || core::opSends(st.op);
        receives = receives || core::opReceives(st.op);
      }
      if (tb.channel < 0) return fmt::format("rank {} tb {}: channel {}", r, tb.id, tb.channel);
      auto peerOk = [&](int p) { return p >= 0 && p < s_.nRanks && p != r; };
      if (sends && !peerOk(tb.sendPeer)) return fmt::format("rank {} tb {}: send peer {}", r, tb.id, tb.sendPeer);
      if (receives && !peerOk(tb.recvPeer)) {
        return fmt::format("rank {} tb {}: receive peer {}", r, tb.id, tb.recvPeer);
      }
      if (sends && !sendOwner.try_emplace(ConnKey{r, tb.sendPeer, tb.channel}, tb.id).second) {
        return fmt::format("rank {}: two thread blocks send to rank {} on channel {}", r, tb.sendPeer, tb.channel);
      }
      if (receives && !recvOwner.try_emplace(ConnKey{tb.recvPeer, r, tb.channel}, tb.id).second) {
        return fmt::format("rank {}: two thread blocks receive from rank {} on channel {}", r, tb.recvPeer, tb.channel);
      }
    }
    // The schedule's local copies come first.
    for (const core::LocalCopy& lc : rp.localCopies) {
      const std::string at =
          fmt::format("rank {} local copy input {} -> output {}", r, lc.inputOffset, lc.outputOffset);
      Ref src;
      Ref dst;
      if (auto e = resolve(r, BufferKind::Input, lc.inputOffset, 1, at, src); !e.empty()) return e;
      if (auto e = resolve(r, BufferKind::Output, lc.outputOffset, 1, at, dst); !e.empty()) return e;
      if (src == dst) continue;
      const int c = newCompute(r, {copyOp(src, dst, 1)});
      touch(r, c, {{{src, 1}}, {{dst, 1}}});
    }
    std::set<std::size_t> ready;  // lowest id first: block order, then step order, as deterministic as the schedule
    for (std::size_t i = 0; i < nSteps; ++i) {
      if (indeg[i] == 0) ready.insert(i);
    }
    std::size_t visited = 0;
    while (!ready.empty()) {
      const std::size_t id = *ready.begin();
      ready.erase(ready.begin());
      ++visited;
      const std::size_t t = static_cast<std::size_t>(std::upper_bound(base.begin(), base.end(), id) - base.begin()) - 1;
      const std::size_t i = id - base[t];
      if (std::string e = lowerStep(r, t, i, sendSeq, recvSeq); !e.empty()) return e;
      for (std::size_t v : succ[id]) {
        if (--indeg[v] == 0) ready.insert(v);
      }
    }
    if (visited != nSteps) return fmt::format("rank {}: the dependencies between thread blocks form a cycle", r);
    return {};
  }

  std::string lowerStep(int r, std::size_t t, std::size_t i, std::vector<int>& sendSeq, std::vector<int>& recvSeq) {
    const core::ThreadBlock& tb = s_.ranks[r].threadBlocks[t];
    const Step& st = tb.steps[i];
    if (st.op == StepOp::Nop) return {};
    const std::string at = stepWhere(r, tb.id, i, st.op);
    const int cnt = st.count;
    if (cnt < 1) return fmt::format("{}: count {} (must be at least 1)", at, cnt);
    Ref src;
    Ref dst;
    if (core::opReadsSrc(st.op)) {
      if (auto e = resolve(r, st.srcBuf, st.srcOff, cnt, at, src); !e.empty()) return e;
    }
    if (core::opWritesDst(st.op)) {
      if (auto e = resolve(r, st.dstBuf, st.dstOff, cnt, at, dst); !e.empty()) return e;
    }
    // The receive, into its final place or into a temporary that a reduction reads.
    Ref landed;
    if (core::opReceives(st.op)) {
      const int seq = recvSeq[t]++;
      const int id = transfer(tb.recvPeer, r, tb.channel, seq);
      landed = (st.op == StepOp::Recv || st.op == StepOp::RecvCopySend) ? dst : newTemp(r, cnt);
      Node& n = nodes_[id];
      n.recvCount = cnt;
      n.dst = landed;
      n.recvWhere = at;
      touch(r, id, {{}, {{landed, cnt}}});
    }
    // Local work.
    Ref sendFrom = src;
    switch (st.op) {
      case StepOp::Copy:
        if (src != dst) {
          const int c = newCompute(r, {copyOp(src, dst, cnt)});
          touch(r, c, {{{src, cnt}}, {{dst, cnt}}});
        }
        break;
      case StepOp::Reduce: {
        const int c = newCompute(r, {reduceOp(dst, src, dst, cnt)});
        touch(r, c, {{{src, cnt}, {dst, cnt}}, {{dst, cnt}}});
        break;
      }
      case StepOp::RecvReduceSend: {
        const int c = newCompute(r, {reduceOp(src, landed, landed, cnt)});
        touch(r, c, {{{src, cnt}, {landed, cnt}}, {{landed, cnt}}});
        sendFrom = landed;
        break;
      }
      case StepOp::RecvReduceCopy: {
        const int c = newCompute(r, {reduceOp(src, landed, dst, cnt)});
        touch(r, c, {{{src, cnt}, {landed, cnt}}, {{dst, cnt}}});
        break;
      }
      case StepOp::RecvReduceCopySend: {
        const int c = newCompute(r, {reduceOp(src, landed, landed, cnt), copyOp(landed, dst, cnt)});
        touch(r, c, {{{src, cnt}, {landed, cnt}}, {{landed, cnt}, {dst, cnt}}});
        sendFrom = landed;
        break;
      }
      case StepOp::RecvCopySend:
        sendFrom = dst;
        break;
      default:
        break;
    }
    if (core::opSends(st.op)) {
      const int seq = sendSeq[t]++;
      if (snapshot_.count({r, static_cast<int>(orderOfSend_)}) != 0 && sendFrom.buf != Buffer::Temp) {
        const Ref snap = newTemp(r, cnt);
        const int c = newCompute(r, {copyOp(sendFrom, snap, cnt)});
        touch(r, c, {{{sendFrom, cnt}}, {{snap, cnt}}});
        sendFrom = snap;
      }
      const int id = transfer(r, tb.sendPeer, tb.channel, seq);
      Node& n = nodes_[id];
      n.sendCount = cnt;
      n.src = sendFrom;
      n.sendWhere = at;
      sendOf_[id] = {r, static_cast<int>(orderOfSend_)};
      ++orderOfSend_;
      touch(r, id, {{{sendFrom, cnt}}, {}});
    }
    return {};
  }

  const Schedule& s_;
  BufferMode mode_;
  const std::set<std::pair<int, int>>& snapshot_;  // (rank, send number) to snapshot
  std::vector<Node> nodes_;
  std::set<std::pair<int, int>> edges_;
  std::map<MsgKey, int> transferIds_;
  std::vector<int> temps_;
  std::vector<std::array<int, 4>> slotBase_;
  std::map<int, int> lastWriter_;  // per slot of the rank being built
  std::map<int, std::vector<int>> readers_;
  std::map<int, std::pair<int, int>> sendOf_;  // transfer node -> (rank, send number)
  std::set<std::pair<int, int>> overwritten_;
  std::size_t orderOfSend_ = 0;
  int order_ = 0;
  std::vector<int> stages_;
};

}  // namespace

std::string_view toString(Buffer b) {
  switch (b) {
    case Buffer::Input:
      return "input";
    case Buffer::Output:
      return "output";
    case Buffer::Scratch:
      return "scratch";
    case Buffer::Temp:
      return "temp";
  }
  return "?";
}

std::string_view toString(OpKind k) {
  switch (k) {
    case OpKind::Send:
      return "send";
    case OpKind::Recv:
      return "recv";
    case OpKind::Copy:
      return "copy";
    case OpKind::Reduce:
      return "reduce";
  }
  return "?";
}

core::Result<Lowered> lower(const core::Schedule& schedule, core::BufferMode mode) {
  const std::string file = schedule.name.empty() ? "<schedule>" : schedule.name;
  auto fail = [&](std::string message) { return core::Diagnostic{file, 0, 0, std::move(message)}; };
  if (std::string shape = core::validateShape(schedule); !shape.empty()) return fail(std::move(shape));
  if (schedule.nRanks < 1 || static_cast<int>(schedule.ranks.size()) != schedule.nRanks) {
    return fail(fmt::format("{} rank programs for {} ranks", schedule.ranks.size(), schedule.nRanks));
  }
  for (int r = 0; r < schedule.nRanks; ++r) {
    if (schedule.ranks[r].rank != r)
      return fail(fmt::format("rank program {} is numbered {}", r, schedule.ranks[r].rank));
  }
  const auto modes = core::supportedModes(schedule);
  if (std::find(modes.begin(), modes.end(), mode) == modes.end()) {
    return fail(fmt::format("the schedule does not support {} buffers", core::toString(mode)));
  }
  const std::set<std::pair<int, int>> none;
  Lowering first(schedule, mode, none);
  if (std::string e = first.build(); !e.empty()) return fail(std::move(e));
  std::string err = first.stage();
  if (err.empty()) return first.emit();
  if (first.overwrittenSends().empty()) return fail(std::move(err));
  // Again, with the sends whose source is overwritten later reading snapshots.
  const std::set<std::pair<int, int>> snap = first.overwrittenSends();
  Lowering second(schedule, mode, snap);
  if (std::string e = second.build(); !e.empty()) return fail(std::move(e));
  if (std::string e = second.stage(); !e.empty()) return fail(std::move(e));
  return second.emit();
}

std::uint64_t chunkElements(const Lowered& lowered, std::uint64_t sizeBytes) {
  const std::uint64_t units = static_cast<std::uint64_t>(std::max(lowered.chunkUnits, 1));
  return std::max<std::uint64_t>(1, sizeBytes / (units * sizeof(float)));
}

std::uint64_t effectiveBytes(const Lowered& lowered, std::uint64_t sizeBytes) {
  return chunkElements(lowered, sizeBytes) * static_cast<std::uint64_t>(std::max(lowered.chunkUnits, 1)) *
         sizeof(float);
}

std::string summary(const Lowered& l) {
  return fmt::format("{} levels ({} groups), {} sends, {} copies, {} reductions, up to {} ops per group{}",
                     l.stats.levels, l.stats.groups, l.stats.sends, l.stats.copies, l.stats.reductions,
                     l.stats.maxGroupOps,
                     l.stats.snapshots > 0 ? fmt::format(", {} sends from snapshots", l.stats.snapshots) : "");
}

}  // namespace optiflow::exec
