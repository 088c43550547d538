// Group operations, strategies and sends: each strategy plans one round at a time from the current state, and
// emitRound applies it with the intent IR's semantics (every transfer reads the state as it was at the start of
// the round, then the round lands in list order).
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "expand_internal.h"

namespace optiflow::dsl::detail {

namespace {

using core::Collective;

bool isPow2(int m) { return m > 0 && (m & (m - 1)) == 0; }

// The largest power of two below m (m >= 2).
int highestPow2Below(int m) {
  int d = 1;
  while (d * 2 < m) d *= 2;
  return d;
}

int ceilLog2(int m) {
  int k = 0;
  while ((1 << k) < m) ++k;
  return k;
}

bool summed(Collective c) {
  return c == Collective::ReduceScatter || c == Collective::AllReduce || c == Collective::Reduce;
}

std::string_view supportedList(Collective op) {
  switch (op) {
    case Collective::AllGather:
      return "ring, direct, recursive_doubling, bruck or pat";
    case Collective::ReduceScatter:
      return "ring, direct, recursive_halving or pat";
    case Collective::AllReduce:
      return "ring, direct, recursive_doubling, recursive_halving or tree";
    case Collective::Broadcast:
    case Collective::Reduce:
      return "tree, chain or direct";
    case Collective::AllToAll:
      return "direct or ring";
    case Collective::Custom:
      break;
  }
  return "";
}

bool supports(Collective op, Strategy s) {
  using S = Strategy;
  switch (op) {
    case Collective::AllGather:
      return s == S::Ring || s == S::Direct || s == S::RecursiveDoubling || s == S::Bruck || s == S::Pat;
    case Collective::ReduceScatter:
      return s == S::Ring || s == S::Direct || s == S::RecursiveHalving || s == S::Pat;
    case Collective::AllReduce:
      return s == S::Ring || s == S::Direct || s == S::RecursiveDoubling || s == S::RecursiveHalving || s == S::Tree;
    case Collective::Broadcast:
    case Collective::Reduce:
      return s == S::Tree || s == S::Chain || s == S::Direct;
    case Collective::AllToAll:
      return s == S::Direct || s == S::Ring;
    case Collective::Custom:
      break;
  }
  return false;
}

// Why group operation `op` makes no sense on the data of a `prog` program; empty when it does.
std::string misfit(Collective prog, Collective op) {
  const std::string_view name = collectiveName(prog);
  if (prog == Collective::AllToAll) {
    if (op == Collective::AllToAll) return {};
    if (summed(op)) return "alltoall data has no partial sums to reduce; use alltoall/send";
    return "every alltoall block belongs to one rank, so copying it to a whole group is wasted; use alltoall/send";
  }
  if (op == Collective::AllToAll) {
    return fmt::format(
        "alltoall moves block(i, j) from rank i to rank j, and {} data has no such blocks; use {}", name,
        summed(prog) ? "reducescatter/allreduce/reduce/allgather/broadcast/send" : "allgather/broadcast/send");
  }
  if (!summed(prog) && summed(op)) {
    return fmt::format("{} data has no partial sums to reduce; use allgather/broadcast/send", name);
  }
  return {};
}

// Runs `f` when the scope ends.
template <typename F>
class OnExit {
 public:
  explicit OnExit(F f) : f_(std::move(f)) {}
  OnExit(const OnExit&) = delete;
  OnExit& operator=(const OnExit&) = delete;
  ~OnExit() { f_(); }

 private:
  F f_;
};

std::string selectionText(const PartSelector& sel) {
  switch (sel.kind) {
    case PartSelector::Kind::One:
      return " part " + quoteExpr(sel.one);
    case PartSelector::Kind::Range:
      return " parts " + quoteRange(sel.range);
    default:
      return {};
  }
}

// Calls f(begin, end) for every run of holders_ entries with the same chunk.
template <typename F>
void forEachChunk(const std::vector<Holder>& hs, F&& f) {
  for (std::size_t b = 0; b < hs.size();) {
    std::size_t e = b + 1;
    while (e < hs.size() && hs[e].chunk == hs[b].chunk) ++e;
    f(b, e);
    b = e;
  }
}

}  // namespace

// ---- operands ----

bool Expander::addMember(const Expr& at, std::int64_t rank, GroupOp* op, const std::string& iteration) {
  if (rank < 0 || rank >= nRanks_) {
    error(at.loc, fmt::format("{}: rank {} is out of range{}: the cluster has {} ranks (0..{})", op->group, rank,
                              iteration, nRanks_, nRanks_ - 1));
    return false;
  }
  const int r = static_cast<int>(rank);
  if (pos_[r] >= 0) {
    error(at.loc,
          fmt::format("rank {} appears twice in {}{}; group members must be distinct", r, op->group, iteration));
    return false;
  }
  pos_[r] = static_cast<int>(op->members.size());
  op->members.push_back(r);
  return true;
}

bool Expander::evalGroup(const Group& grp, GroupOp* op) {
  switch (grp.kind) {
    case GroupKind::All:
      op->group = "all";
      op->members.reserve(static_cast<std::size_t>(nRanks_));
      for (int r = 0; r < nRanks_; ++r) {
        pos_[r] = r;
        op->members.push_back(r);
      }
      return true;
    case GroupKind::Node:
    case GroupKind::Rail: {
      const bool node = grp.kind == GroupKind::Node;
      const std::string_view kind = node ? "node" : "rail";
      if (grp.items.size() != 1) {
        error(grp.loc, fmt::format("{}(...) takes one index", kind));
        return false;
      }
      const std::optional<std::int64_t> v = eval(grp.items[0]);
      if (!v) return false;
      const int limit = node ? topo_.nodes : topo_.gpusPerNode;
      if (*v < 0 || *v >= limit) {
        error(grp.items[0].loc, node ? fmt::format("{}: node {} is out of range: the cluster has {} nodes (0..{})",
                                                   quoteGroup(grp), *v, limit, limit - 1)
                                     : fmt::format("{}: rail {} is out of range: a node has {} GPUs, so rails 0..{}",
                                                   quoteGroup(grp), *v, limit, limit - 1));
        return false;
      }
      const int idx = static_cast<int>(*v);
      op->group = fmt::format("{}({})", kind, idx);
      if (node) {
        for (int g = 0; g < topo_.gpusPerNode; ++g) addMember(grp.items[0], topo_.rankOf(idx, g), op, "");
      } else {
        for (int n = 0; n < topo_.nodes; ++n) addMember(grp.items[0], topo_.rankOf(n, idx), op, "");
      }
      return true;
    }
    case GroupKind::List:
      op->group = quoteGroup(grp);
      if (grp.items.empty()) {
        error(grp.loc, "the group {{}} is empty");
        return false;
      }
      for (const Expr& item : grp.items) {
        const std::optional<std::int64_t> v = eval(item);
        if (!v || !addMember(item, *v, op, "")) return false;
      }
      return true;
    case GroupKind::Comprehension: {
      op->group = quoteGroup(grp);
      if (grp.items.size() != 1) {
        error(grp.loc, fmt::format("{}: a comprehension has one element expression", op->group));
        return false;
      }
      if (!checkBindable(grp.var, grp.range.loc)) return false;
      std::int64_t lo = 0;
      std::int64_t hi = 0;
      if (!evalRange(grp.range, &lo, &hi)) return false;
      if (hi <= lo) {
        error(grp.loc, fmt::format("the group {} is empty: {} in {} = {}..{} takes no value", op->group, grp.var,
                                   quoteRange(grp.range), lo, hi));
        return false;
      }
      std::int64_t count = 0;
      if (__builtin_sub_overflow(hi, lo, &count) || count > nRanks_) {
        // More values than ranks: some rank must repeat, or a long range is hostile input.
        count = std::min<std::int64_t>(count > 0 ? count : nRanks_ + 1, std::int64_t{nRanks_} + 1);
      }
      if (!chargeIterations(count, grp.loc, op->group)) return false;
      for (std::int64_t i = 0; i < count; ++i) {
        scope_.push_back(Binding{grp.var, lo + i, grp.loc.line});
        const std::optional<std::int64_t> v = eval(grp.items[0]);
        scope_.pop_back();
        if (!v || !addMember(grp.items[0], *v, op, fmt::format(" (for {} = {})", grp.var, lo + i))) return false;
      }
      return true;
    }
  }
  error(grp.loc, "malformed group");
  return false;
}

bool Expander::evalParts(const PartSelector& sel, int* lo, int* hi) {
  *lo = 0;
  *hi = parts_;
  const std::string hint = parts_ == 1 ? " (split cuts it into more)" : "";
  switch (sel.kind) {
    case PartSelector::Kind::All:
      return true;
    case PartSelector::Kind::One: {
      const std::optional<std::int64_t> v = eval(sel.one);
      if (!v) return false;
      if (*v < 0 || *v >= parts_) {
        error(sel.one.loc, fmt::format("part {} is out of range: the data has {} part{} (0..{}){}", *v, parts_,
                                       parts_ == 1 ? "" : "s", parts_ - 1, hint));
        return false;
      }
      *lo = static_cast<int>(*v);
      *hi = *lo + 1;
      return true;
    }
    case PartSelector::Kind::Range: {
      std::int64_t a = 0;
      std::int64_t b = 0;
      if (!evalRange(sel.range, &a, &b)) return false;
      if (a < 0 || b > parts_) {
        error(sel.range.loc, fmt::format("parts {}..{} is out of range: the data has {} part{} (0..{}){}", a, b, parts_,
                                         parts_ == 1 ? "" : "s", parts_ - 1, hint));
        return false;
      }
      if (a >= b) {
        error(sel.range.loc, fmt::format("parts {}..{} selects no part", a, b));
        return false;
      }
      *lo = static_cast<int>(a);
      *hi = static_cast<int>(b);
      return true;
    }
  }
  error(sel.loc, "malformed part selection");
  return false;
}

// ---- group operations ----

void Expander::runGroupOp(const Stmt& s) {
  inSendRound_ = false;
  const Collective op = s.op;
  const std::string_view opName = collectiveName(op);
  if (opName == "?") {
    error(s.loc, "malformed group operation");
    return;
  }
  if (const std::string why = misfit(program_.collective, op); !why.empty()) {
    error(s.loc, fmt::format("{} {} in a {} program: {}", opName, quoteGroup(s.group),
                             collectiveName(program_.collective), why));
    return;
  }
  if (!supports(op, s.strategy)) {
    error(s.loc, fmt::format("{} does not support strategy '{}'; use {}", opName, strategyName(s.strategy),
                             supportedList(op)));
    return;
  }
  const bool anchored = op == Collective::Broadcast || op == Collective::Reduce;
  if (anchored != s.hasAnchor) {
    error(s.loc, anchored ? fmt::format("{} needs an anchor: {} G {} r", opName, opName,
                                        op == Collective::Broadcast ? "from" : "to")
                          : fmt::format("{} takes no anchor", opName));
    return;
  }

  GroupOp g;
  g.stmt = &s;
  const OnExit clear([&] {
    for (int r : g.members) {
      pos_[r] = -1;
      byLocal_[topo_.localOf(r)] = -1;
      byNode_[topo_.nodeOf(r)] = -1;
    }
  });
  if (!evalGroup(s.group, &g)) return;
  g.m = static_cast<int>(g.members.size());
  if (!evalParts(s.parts, &g.partLo, &g.partHi)) return;
  // A group operation costs work per member and selected part even when it moves nothing; count that work against
  // the same budget as loop iterations, so a loop of no-op operations cannot run for minutes.
  if (!chargeIterations(std::int64_t{g.m} * std::max<std::int64_t>(g.partHi - g.partLo, 1), s.loc,
                        fmt::format("{} {}", opName, g.group))) {
    return;
  }
  std::string anchorText;
  if (anchored) {
    const std::optional<int> r = evalRank(s.anchor, op == Collective::Broadcast ? "broadcast from" : "reduce to");
    if (!r) return;
    if (pos_[*r] < 0) {
      error(s.anchor.loc, fmt::format("{} {} {} {}: rank {} is not a member of {}", opName, g.group,
                                      op == Collective::Broadcast ? "from" : "to", quoteExpr(s.anchor), *r, g.group));
      return;
    }
    g.anchorPos = pos_[*r];
    anchorText = fmt::format(" {} {}", op == Collective::Broadcast ? "from" : "to", quoteExpr(s.anchor));
  }
  g.label =
      fmt::format("{} {}{} by {}{}", opName, g.group, anchorText, strategyName(s.strategy), selectionText(s.parts));
  const bool pow2 = (op == Collective::AllGather && s.strategy == Strategy::RecursiveDoubling) ||
                    (op == Collective::ReduceScatter && s.strategy == Strategy::RecursiveHalving) ||
                    (op == Collective::AllReduce &&
                     (s.strategy == Strategy::RecursiveDoubling || s.strategy == Strategy::RecursiveHalving));
  if (pow2 && !isPow2(g.m)) {
    const std::string_view alt = op == Collective::AllGather       ? "bruck or pat"
                                 : op == Collective::ReduceScatter ? "ring or pat"
                                                                   : "ring or tree";
    error(s.loc, fmt::format("{} by {} needs a group of a power-of-two size; {} has {} members (use {})", opName,
                             strategyName(s.strategy), g.group, g.m, alt));
    return;
  }
  if (g.m == 1) return;  // nothing to move within one rank
  switch (op) {
    case Collective::AllGather:
      allgather(g, s.strategy);
      return;
    case Collective::ReduceScatter:
      reducescatter(g, s.strategy);
      return;
    case Collective::AllReduce:
      allreduce(g, s.strategy);
      return;
    case Collective::Broadcast:
      broadcast(g, s.strategy);
      return;
    case Collective::Reduce:
      reduce(g, s.strategy);
      return;
    case Collective::AllToAll:
      alltoall(g, s.strategy);
      return;
    case Collective::Custom:
      return;
  }
}

void Expander::collectHolders(GroupOp& g) {
  holders_.clear();
  for (int p = 0; p < g.m; ++p) {
    state_.forEachHeld(g.members[p], [&](int c, std::uint32_t v) {
      if (selected(g, c)) holders_.push_back(Holder{c, p, v});
    });
  }
  // Gathered in position order: a stable sort by chunk gives (chunk, position) order. A counting sort when the
  // holders are many compared with the chunks, a comparison sort otherwise (small groups in big programs).
  if (holders_.size() * 4 < static_cast<std::size_t>(nChunks_)) {
    std::stable_sort(holders_.begin(), holders_.end(),
                     [](const Holder& x, const Holder& y) { return x.chunk < y.chunk; });
    return;
  }
  chunkStart_.assign(static_cast<std::size_t>(nChunks_) + 1, 0);
  for (const Holder& h : holders_) ++chunkStart_[h.chunk + 1];
  for (int c = 0; c < nChunks_; ++c) chunkStart_[c + 1] += chunkStart_[c];
  sorted_.resize(holders_.size());
  for (const Holder& h : holders_) sorted_[chunkStart_[h.chunk]++] = h;
  holders_.swap(sorted_);
}

bool Expander::checkSameValues(const GroupOp& g) {
  bool ok = true;
  forEachChunk(holders_, [&](std::size_t b, std::size_t e) {
    if (!ok) return;
    for (std::size_t i = b + 1; i < e; ++i) {
      if (holders_[i].value != holders_[b].value) {
        error(
            g.stmt->loc,
            fmt::format("{}: rank {} and rank {} hold different partial values of {}; allgather copies values, so "
                        "sum them first (reducescatter, allreduce or reduce)",
                        g.label, g.members[holders_[b].pos], g.members[holders_[i].pos], chunkName(holders_[b].chunk)));
        ok = false;
        return;
      }
    }
  });
  return ok;
}

bool Expander::checkDisjoint(const GroupOp& g) {
  struct Piece {
    int lo;
    int hi;
    int pos;
  };
  std::vector<Piece> pieces;
  bool ok = true;
  forEachChunk(holders_, [&](std::size_t b, std::size_t e) {
    if (!ok || e - b < 2) return;
    pieces.clear();
    for (std::size_t i = b; i < e; ++i) {
      for (const Interval& iv : values_->intervals(holders_[i].value)) {
        pieces.push_back({iv.lo, iv.hi, holders_[i].pos});
      }
    }
    std::sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) { return x.lo < y.lo; });
    std::size_t widest = 0;  // the piece reaching furthest so far
    for (std::size_t i = 1; i < pieces.size(); ++i) {
      if (pieces[i].lo < pieces[widest].hi) {
        error(g.stmt->loc, fmt::format("{}: rank {} and rank {} both hold rank {}'s contribution to {}: adding them "
                                       "up would count it twice",
                                       g.label, g.members[std::min(pieces[widest].pos, pieces[i].pos)],
                                       g.members[std::max(pieces[widest].pos, pieces[i].pos)], pieces[i].lo,
                                       chunkName(holders_[b].chunk)));
        ok = false;
        return;
      }
      if (pieces[i].hi > pieces[widest].hi) widest = i;
    }
  });
  return ok;
}

void Expander::prepareTargets(const GroupOp& g) {
  for (int p = 0; p < g.m; ++p) {
    const int r = g.members[p];
    if (byLocal_[topo_.localOf(r)] < 0) byLocal_[topo_.localOf(r)] = p;
    if (byNode_[topo_.nodeOf(r)] < 0) byNode_[topo_.nodeOf(r)] = p;
  }
}

int Expander::targetPos(int chunk) const {
  const int block = chunk / parts_;
  const int owner = program_.collective == Collective::Reduce ? root_ : block;
  if (pos_[owner] >= 0) return pos_[owner];
  if (const int p = byLocal_[topo_.localOf(owner)]; p >= 0) return p;
  if (const int p = byNode_[topo_.nodeOf(owner)]; p >= 0) return p;
  return 0;
}

// The stretches of the group order that allgather ring/direct fill: from each holder up to the next one.
std::vector<Segment>& Expander::holderSegments(const GroupOp& g) {
  segments_.clear();
  forEachChunk(holders_, [&](std::size_t b, std::size_t e) {
    if (static_cast<int>(e - b) == g.m) return;  // everyone has it
    for (std::size_t i = b; i < e; ++i) {
      const int start = holders_[i].pos;
      const int next = holders_[i + 1 < e ? i + 1 : b].pos;
      int len = (next - start + g.m) % g.m;
      if (len == 0) len = g.m;
      if (len > 1) segments_.push_back(Segment{holders_[b].chunk, start, len - 1});
    }
  });
  return segments_;
}

bool Expander::emitRound(const GroupOp& g, Move mode, std::int64_t* landed) {
  newRound();
  // Planners that walked the senders' holdings already know the values (the state has not changed since).
  for (Pending& p : pending_) {
    if (p.value == ValueTable::kEmpty) p.value = state_.get(p.src, p.chunk);
  }
  for (const Pending& p : pending_) {
    if (p.value == ValueTable::kEmpty) {
      error(g.stmt->loc,
            fmt::format("{}: rank {} holds nothing of {} at this point", g.label, p.src, chunkName(p.chunk)));
      return false;
    }
  }
  // Senders give their value away before anything lands, so what a sender receives in the same round is a copy.
  if (mode == Move::ReduceDrop) {
    for (const Pending& p : pending_) state_.set(p.src, p.chunk, ValueTable::kEmpty);
  }
  std::int64_t n = 0;
  for (const Pending& p : pending_) {
    bool wrote = false;
    if (!land(*g.stmt, g.label, p, mode, -1, &wrote)) return false;
    n += wrote ? 1 : 0;
  }
  if (landed != nullptr) *landed = n;
  return !stop_;
}

bool Expander::land(const Stmt& s, std::string_view label, const Pending& p, Move mode, int via, bool* wrote) {
  *wrote = false;
  const std::uint32_t have = state_.get(p.dst, p.chunk);
  if (mode == Move::Copy) {
    if (have == p.value) return true;  // already there
    if (have != ValueTable::kEmpty) {
      error(s.loc, fmt::format("{}: copying rank {}'s value would overwrite rank {}'s partial sum of {}; reduce it "
                               "(reducescatter/allreduce/send into an empty rank) instead",
                               label, p.src, p.dst, chunkName(p.chunk)));
      return false;
    }
    state_.set(p.dst, p.chunk, p.value);
    *wrote = true;
    return emit(s, label, p.chunk, p.src, p.dst, core::TransferKind::Copy, via);
  }
  if (have == ValueTable::kEmpty) {
    state_.set(p.dst, p.chunk, p.value);
    *wrote = true;
    return emit(s, label, p.chunk, p.src, p.dst, core::TransferKind::Copy, via);
  }
  if (values_->size() >= ValueTable::kMaxValues) {
    error(s.loc,
          fmt::format("{}: the program builds more than {} distinct partial sums", label, ValueTable::kMaxValues));
    stop_ = true;
    return false;
  }
  int overlap = -1;
  const std::optional<std::uint32_t> sum = values_->unite(have, p.value, &overlap);
  if (!sum) {
    error(s.loc, fmt::format("{}: rank {} already holds rank {}'s contribution to {}: adding it again would count it "
                             "twice",
                             label, p.dst, overlap, chunkName(p.chunk)));
    return false;
  }
  state_.set(p.dst, p.chunk, *sum);
  *wrote = true;
  return emit(s, label, p.chunk, p.src, p.dst, core::TransferKind::Reduce, via);
}

bool Expander::emit(const Stmt& s, std::string_view label, int chunk, int src, int dst, core::TransferKind kind,
                    int via) {
  if (transfers_.size() >= opt_.maxTransfers) {
    error(s.loc, fmt::format("{}: the program needs more than {} transfers, the most it may produce", label,
                             opt_.maxTransfers));
    stop_ = true;
    return false;
  }
  if (needRound_) {
    curRound_ = nextRound_++;
    needRound_ = false;
  }
  transfers_.push_back(core::Transfer{chunk, src, dst, kind, via, curRound_, s.loc.line});
  return true;
}

// ---- strategies ----

bool Expander::allgather(GroupOp& g, Strategy st) {
  collectHolders(g);
  if (!checkSameValues(g)) return false;
  if (st == Strategy::Ring) return agSegments(g, true);
  if (st == Strategy::Direct) return agSegments(g, false);
  return agLogSteps(g, st);
}

bool Expander::agSegments(GroupOp& g, bool ring) {
  std::vector<Segment>& segs = holderSegments(g);
  const int m = g.m;
  if (!ring) {
    pending_.clear();
    for (const Segment& sg : segs) {
      for (int d = 1; d <= sg.hops; ++d) {
        pending_.push_back(Pending{sg.chunk, g.members[sg.start], g.members[(sg.start + d) % m]});
      }
    }
    return pending_.empty() || emitRound(g, Move::Copy);
  }
  // Round t carries hop t of every stretch; the longest stretches come first so each round is a prefix.
  std::stable_sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.hops > b.hops; });
  const int rounds = segs.empty() ? 0 : segs.front().hops;
  for (int t = 0; t < rounds; ++t) {
    pending_.clear();
    for (const Segment& sg : segs) {
      if (sg.hops <= t) break;
      pending_.push_back(Pending{sg.chunk, g.members[(sg.start + t) % m], g.members[(sg.start + t + 1) % m]});
    }
    if (!emitRound(g, Move::Copy)) return false;
  }
  return true;
}

bool Expander::agLogSteps(GroupOp& g, Strategy st) {
  const int m = g.m;
  std::int64_t missing = 0;  // (member, chunk) pairs still to fill: stop as soon as it is 0
  forEachChunk(holders_, [&](std::size_t b, std::size_t e) { missing += m - static_cast<std::int64_t>(e - b); });
  std::vector<int> distances;
  if (st == Strategy::Pat) {
    for (int d = highestPow2Below(m); d >= 1; d /= 2) distances.push_back(d);
  } else {
    for (int d = 1; d < m; d *= 2) distances.push_back(d);
  }
  for (int d : distances) {
    if (missing <= 0) break;
    pending_.clear();
    for (int i = 0; i < m; ++i) {
      // recursive doubling: i sends to i xor d; bruck and pat: i receives from i + d
      const int src = st == Strategy::RecursiveDoubling ? g.members[i] : g.members[(i + d) % m];
      const int dst = st == Strategy::RecursiveDoubling ? g.members[i ^ d] : g.members[i];
      state_.forEachHeld(src, [&](int c, std::uint32_t v) {
        if (selected(g, c) && state_.get(dst, c) == ValueTable::kEmpty) pending_.push_back(Pending{c, src, dst, v});
      });
    }
    std::int64_t landed = 0;
    if (!emitRound(g, Move::Copy, &landed)) return false;
    missing -= landed;
  }
  return true;
}

bool Expander::reducescatter(GroupOp& g, Strategy st) {
  const int m = g.m;
  prepareTargets(g);
  collectHolders(g);
  if (!checkDisjoint(g)) return false;
  if (st == Strategy::Ring || st == Strategy::Direct) {
    segments_.clear();
    pending_.clear();
    forEachChunk(holders_, [&](std::size_t b, std::size_t e) {
      const int c = holders_[b].chunk;
      const int t = targetPos(c);
      if (st == Strategy::Direct) {
        for (std::size_t i = b; i < e; ++i) {
          if (holders_[i].pos != t) pending_.push_back(Pending{c, g.members[holders_[i].pos], g.members[t]});
        }
        return;
      }
      // The partial sum starts at the first holder after the target and travels forward to it.
      int first = -1;
      int firstDist = m;
      for (std::size_t i = b; i < e; ++i) {
        const int dist = (holders_[i].pos - t + m) % m;
        if (dist != 0 && dist < firstDist) {
          firstDist = dist;
          first = holders_[i].pos;
        }
      }
      if (first >= 0) segments_.push_back(Segment{c, first, (t - first + m) % m});
    });
    if (st == Strategy::Direct) return pending_.empty() || emitRound(g, Move::ReduceDrop);
    std::stable_sort(segments_.begin(), segments_.end(),
                     [](const Segment& a, const Segment& b) { return a.hops > b.hops; });
    const int rounds = segments_.empty() ? 0 : segments_.front().hops;
    for (int t = 0; t < rounds; ++t) {
      pending_.clear();
      for (const Segment& sg : segments_) {
        if (sg.hops <= t) break;
        pending_.push_back(Pending{sg.chunk, g.members[(sg.start + t) % m], g.members[(sg.start + t + 1) % m]});
      }
      if (!emitRound(g, Move::ReduceDrop)) return false;
    }
    return true;
  }
  // recursive_halving: distances m/2 .. 1, a chunk crosses to the half its target is in.
  // pat: distances from the largest power of two below m down to 1, a chunk moves forward by d when bit d of its
  // distance to the target is set.
  for (int d = st == Strategy::Pat ? highestPow2Below(m) : m / 2; d >= 1; d /= 2) {
    pending_.clear();
    for (int i = 0; i < m; ++i) {
      const int partner = st == Strategy::Pat ? (i + d) % m : (i ^ d);
      state_.forEachHeld(g.members[i], [&](int c, std::uint32_t v) {
        if (!selected(g, c)) return;
        const int t = targetPos(c);
        const bool moves = st == Strategy::Pat ? (((t - i + m) % m) & d) != 0 : (t & d) == (partner & d);
        if (moves) pending_.push_back(Pending{c, g.members[i], g.members[partner], v});
      });
    }
    if (!emitRound(g, Move::ReduceDrop)) return false;
  }
  return true;
}

bool Expander::allreduce(GroupOp& g, Strategy st) {
  switch (st) {
    case Strategy::Ring:
      return reducescatter(g, Strategy::Ring) && allgather(g, Strategy::Ring);
    case Strategy::Direct:
      return reducescatter(g, Strategy::Direct) && allgather(g, Strategy::Direct);
    case Strategy::RecursiveHalving:
      return reducescatter(g, Strategy::RecursiveHalving) && allgather(g, Strategy::RecursiveDoubling);
    case Strategy::RecursiveDoubling: {
      collectHolders(g);
      if (!checkDisjoint(g)) return false;
      for (int d = 1; d < g.m; d *= 2) {
        pending_.clear();
        for (int i = 0; i < g.m; ++i) {
          const int src = g.members[i];
          const int dst = g.members[i ^ d];
          state_.forEachHeld(src, [&](int c, std::uint32_t v) {
            if (selected(g, c)) pending_.push_back(Pending{c, src, dst, v});
          });
        }
        if (!emitRound(g, Move::Reduce)) return false;
      }
      return true;
    }
    case Strategy::Tree: {
      collectHolders(g);
      if (!checkDisjoint(g)) return false;
      g.anchorPos = 0;
      if (!reduceTree(g)) return false;
      std::vector<int> chunks;
      state_.forEachHeld(g.members[0], [&](int c, std::uint32_t) {
        if (selected(g, c)) chunks.push_back(c);
      });
      std::sort(chunks.begin(), chunks.end());
      return broadcastTree(g, chunks);
    }
    default:
      return false;
  }
}

// Binomial tree over positions relative to the anchor: the parent of relative position i is i with its lowest set
// bit cleared. Reduce climbs it leaves first; broadcast walks it down from the anchor.
bool Expander::reduceTree(GroupOp& g) {
  const int m = g.m;
  const int a = g.anchorPos;
  for (int bit = 1; bit < m; bit *= 2) {
    pending_.clear();
    for (int i = bit; i < m; i += 2 * bit) {
      const int src = g.members[(a + i) % m];
      const int dst = g.members[(a + i - bit) % m];
      state_.forEachHeld(src, [&](int c, std::uint32_t v) {
        if (selected(g, c)) pending_.push_back(Pending{c, src, dst, v});
      });
    }
    if (!pending_.empty() && !emitRound(g, Move::ReduceDrop)) return false;
  }
  return true;
}

bool Expander::broadcastTree(GroupOp& g, const std::vector<int>& chunks) {
  const int m = g.m;
  const int a = g.anchorPos;
  for (int k = ceilLog2(m) - 1; k >= 0; --k) {
    const int bit = 1 << k;
    pending_.clear();
    for (int i = 0; i + bit < m; i += 2 * bit) {
      const int src = g.members[(a + i) % m];
      const int dst = g.members[(a + i + bit) % m];
      for (int c : chunks) pending_.push_back(Pending{c, src, dst});
    }
    if (!emitRound(g, Move::Copy)) return false;
  }
  return true;
}

bool Expander::broadcast(GroupOp& g, Strategy st) {
  const int m = g.m;
  const int a = g.anchorPos;
  const int root = g.members[a];
  std::vector<int> chunks;
  state_.forEachHeld(root, [&](int c, std::uint32_t) {
    if (selected(g, c)) chunks.push_back(c);
  });
  std::sort(chunks.begin(), chunks.end());
  if (chunks.empty()) {
    const std::string what = nBlocks_ == 1 && g.partHi - g.partLo == 1 ? chunkName(g.partLo)
                             : g.partHi - g.partLo == parts_           ? std::string("the data")
                                                                       : std::string("the selected parts");
    error(g.stmt->loc, fmt::format("{}: rank {} holds nothing of {} at this point", g.label, root, what));
    return false;
  }
  if (st == Strategy::Tree) return broadcastTree(g, chunks);
  if (st == Strategy::Chain) {
    for (int t = 0; t + 1 < m; ++t) {
      pending_.clear();
      for (int c : chunks) pending_.push_back(Pending{c, g.members[(a + t) % m], g.members[(a + t + 1) % m]});
      if (!emitRound(g, Move::Copy)) return false;
    }
    return true;
  }
  pending_.clear();
  for (int i = 1; i < m; ++i) {
    for (int c : chunks) pending_.push_back(Pending{c, root, g.members[(a + i) % m]});
  }
  return emitRound(g, Move::Copy);
}

bool Expander::reduce(GroupOp& g, Strategy st) {
  const int m = g.m;
  const int a = g.anchorPos;
  collectHolders(g);
  if (!checkDisjoint(g)) return false;
  if (st == Strategy::Tree) return reduceTree(g);
  if (st == Strategy::Chain) {
    // relative positions 1 -> 2 -> ... -> m-1 -> 0 (the anchor), each hop adding the receiver's value
    for (int t = 0; t + 1 < m; ++t) {
      const int src = g.members[(a + t + 1) % m];
      const int dst = g.members[(a + t + 2) % m];
      pending_.clear();
      state_.forEachHeld(src, [&](int c, std::uint32_t v) {
        if (selected(g, c)) pending_.push_back(Pending{c, src, dst, v});
      });
      if (!pending_.empty() && !emitRound(g, Move::ReduceDrop)) return false;
    }
    return true;
  }
  pending_.clear();
  for (int i = 1; i < m; ++i) {
    const int src = g.members[(a + i) % m];
    state_.forEachHeld(src, [&](int c, std::uint32_t v) {
      if (selected(g, c)) pending_.push_back(Pending{c, src, g.members[a], v});
    });
  }
  return pending_.empty() || emitRound(g, Move::ReduceDrop);
}

bool Expander::alltoall(GroupOp& g, Strategy st) {
  const int m = g.m;
  // Every selected chunk a member holds whose destination is another member.
  std::vector<Pending> moves;
  for (int p = 0; p < m; ++p) {
    const int a = g.members[p];
    state_.forEachHeld(a, [&](int c, std::uint32_t v) {
      if (!selected(g, c)) return;
      const int j = (c / parts_) % nRanks_;
      if (j != a && pos_[j] >= 0) moves.push_back(Pending{c, a, j, v});
    });
  }
  // direct: one round, grouped by receiver so one receiver's state at a time stays in cache. ring: round k carries
  // what every member sends k positions ahead. Both a stable counting sort.
  auto key = [&](const Pending& p) {
    return st == Strategy::Direct ? pos_[p.dst] : (pos_[p.dst] - pos_[p.src] + m) % m;
  };
  std::vector<std::size_t> first(static_cast<std::size_t>(m) + 1, 0);
  for (const Pending& p : moves) ++first[key(p) + 1];
  for (int k = 0; k < m; ++k) first[k + 1] += first[k];
  pending_.resize(moves.size());
  for (const Pending& p : moves) pending_[first[key(p)]++] = p;
  if (st == Strategy::Direct) return pending_.empty() || emitRound(g, Move::Copy);
  moves.swap(pending_);  // now sorted by k; first[k] is the end of bucket k
  std::size_t b = 0;
  for (int k = 0; k < m; ++k) {
    if (first[k] == b) continue;
    pending_.assign(moves.begin() + static_cast<std::ptrdiff_t>(b),
                    moves.begin() + static_cast<std::ptrdiff_t>(first[k]));
    if (!emitRound(g, Move::Copy)) return false;
    b = first[k];
  }
  return true;
}

// ---- sends ----

void Expander::runSend(const Stmt& s) {
  const Collective coll = program_.collective;
  std::string blockText;
  for (std::size_t i = 0; i < s.blockArgs.size(); ++i) blockText += (i > 0 ? ", " : "") + quoteExpr(s.blockArgs[i]);
  std::string label = fmt::format("send block({}){} from {} to {}", blockText, selectionText(s.parts),
                                  quoteExpr(s.value), quoteExpr(s.target));
  if (!s.vias.empty()) label += " via " + quoteExpr(s.vias[0]);
  if (s.vias.size() > 1) {
    error(s.vias[1].loc, fmt::format("{}: only one relay per send is compiled today", label));
    return;
  }
  int block = 0;
  if (coll == Collective::AllToAll) {
    if (s.blockArgs.size() != 2) {
      error(s.loc, fmt::format("{}: alltoall blocks are named block(i, j), what rank i sends to rank j", label));
      return;
    }
    const std::optional<int> i = evalRank(s.blockArgs[0], "block source");
    if (!i) return;
    const std::optional<int> j = evalRank(s.blockArgs[1], "block destination");
    if (!j) return;
    block = *i * nRanks_ + *j;
  } else {
    if (s.blockArgs.size() != 1) {
      error(s.loc, fmt::format("{}: {} blocks are named block(b), with one index", label, collectiveName(coll)));
      return;
    }
    const std::optional<std::int64_t> b = eval(s.blockArgs[0]);
    if (!b) return;
    if (*b < 0 || *b >= nBlocks_) {
      error(s.blockArgs[0].loc,
            nBlocks_ == 1
                ? fmt::format("{}: {} data is a single block, block(0); got block {}", label, collectiveName(coll), *b)
                : fmt::format("{}: block {} is out of range: {} data has {} blocks (0..{})", label, *b,
                              collectiveName(coll), nBlocks_, nBlocks_ - 1));
      return;
    }
    block = static_cast<int>(*b);
  }
  int lo = 0;
  int hi = 1;
  if (!evalParts(s.parts, &lo, &hi)) return;
  const std::optional<int> src = evalRank(s.value, "source rank");
  if (!src) return;
  const std::optional<int> dst = evalRank(s.target, "destination rank");
  if (!dst) return;
  if (*src == *dst) {
    error(s.loc, fmt::format("{}: rank {} would send to itself", label, *src));
    return;
  }
  int via = -1;
  if (!s.vias.empty()) {
    const std::optional<int> v = evalRank(s.vias[0], "relay");
    if (!v) return;
    if (*v == *src || *v == *dst) {
      error(s.vias[0].loc, fmt::format("{}: the relay must be a third rank, not the {} (rank {})", label,
                                       *v == *src ? "source" : "destination", *v));
      return;
    }
    via = *v;
  }
  for (int part = lo; part < hi; ++part) {
    const int chunk = block * parts_ + part;
    const std::uint32_t value = state_.get(*src, chunk);
    if (value == ValueTable::kEmpty) {
      error(s.loc, fmt::format("{}: rank {} holds nothing of {} at this point", label, *src, chunkName(chunk)));
      return;
    }
    // A send joins the current round unless it reads or writes what the round already wrote.
    const std::uint64_t srcKey = static_cast<std::uint64_t>(*src) * static_cast<std::uint64_t>(nChunks_) + chunk;
    const std::uint64_t dstKey = static_cast<std::uint64_t>(*dst) * static_cast<std::uint64_t>(nChunks_) + chunk;
    if (!inSendRound_ || written_.count(srcKey) != 0 || written_.count(dstKey) != 0) {
      newRound();
      written_.clear();
      inSendRound_ = true;
    }
    Move mode = Move::Copy;
    if (summed(coll)) mode = state_.get(*dst, chunk) == ValueTable::kEmpty ? Move::Reduce : Move::ReduceDrop;
    if (mode == Move::ReduceDrop) state_.set(*src, chunk, ValueTable::kEmpty);
    bool wrote = false;
    if (!land(s, label, Pending{chunk, *src, *dst, value}, mode, via, &wrote)) return;
    if (wrote) {
      written_.insert(dstKey);
      if (mode == Move::ReduceDrop) written_.insert(srcKey);
    }
  }
}

}  // namespace optiflow::dsl::detail
