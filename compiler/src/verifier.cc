// The verifier. Phases, each run only when the previous ones found the schedule well formed enough:
//
//   1. Shape and references (mode-independent): declared sizes, thread block ids, peers, channels, counts,
//      dependencies. Everything later indexes through these, so any error here stops verification.
//   2. Connections and matching: one block per (peer, channel, direction); the k-th send on a connection pairs
//      with the k-th receive and both move the same number of chunks.
//   3. Deadlock: the graph of program order, explicit dependencies and send->receive waits must be acyclic. Kahn's
//      algorithm yields the topological order every later phase walks; a leftover node set yields a cycle.
//   4. Per buffer mode: buffer ranges after aliasing, then
//      a. races: vector clocks over thread blocks (below);
//      b. data: symbolic execution in topological order over multisets of contributions, with the postcondition
//         and the reduction-order warning at the end.
//
// Complexity, with S steps, B thread blocks over all ranks, C physical chunks, A chunk accesses (sum of counts):
//   phases 1-3: O(S + B + dependencies) time and memory.
//   races:      first a screen with rank-local clocks (program order and dependencies only): O(S * b + A * R) with b
//               the blocks of one rank and R the number of reads of one chunk between two writes of it. Only groups
//               with a rank where a conflicting pair is left unordered get the full passes, which follow the
//               send->receive waits too (every compiled schedule orders its hazards by dependencies and skips them):
//               O(S * B + A * R) time; memory
//               O(B * G + P * G) for the current clocks plus the P snapshots alive at once (sends whose receive and
//               steps whose dependents are not processed yet), with G <= B columns per pass. When B * B would be
//               too large, ranks are split into groups of at most G blocks and one pass is run per group (a clock
//               only needs the entries of blocks of the rank whose accesses it is compared against); the time
//               stays O(S * B).
//   data:       O(A * T) time where T is the number of contributions in a value (1 for copy collectives, up to
//               nRanks for reductions); values are shared, immutable and reference counted, so forwarding is O(1).
#include "optiflow/compiler/verifier.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace optiflow::compiler {

using core::BufferKind;
using core::BufferMode;
using core::Contribution;
using core::Schedule;
using core::Step;
using core::StepOp;

std::string_view toString(Property p) {
  switch (p) {
    case Property::Shape:
      return "shape";
    case Property::Reference:
      return "reference";
    case Property::Connection:
      return "connection";
    case Property::Matching:
      return "matching";
    case Property::Deadlock:
      return "deadlock";
    case Property::Race:
      return "race";
    case Property::Uninitialized:
      return "uninitialized";
    case Property::ReducedTwice:
      return "reduced-twice";
    case Property::Postcondition:
      return "postcondition";
    case Property::HasDep:
      return "hasdep";
    case Property::ReductionOrder:
      return "reduction-order";
  }
  return "unknown";
}

std::string Finding::str() const {
  std::string out;
  if (rank >= 0) out += fmt::format("rank {}", rank);
  if (tb >= 0) out += fmt::format("{}tb {}", out.empty() ? "" : " ", tb);
  if (step >= 0) out += fmt::format("{}step {}", out.empty() ? "" : " ", step);
  out += fmt::format("{}({}): [{}] {}", out.empty() ? "" : " ", core::toString(mode), toString(property), message);
  return out;
}

namespace {

constexpr int kNone = -1;
constexpr std::size_t kMaxListed = 4;  // items listed in one message (cycle steps, contributions)

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A symbolic chunk value: the sorted multiset of contributions combined into it and a hash of the shape of the
// reduction tree that built it (commutative at each node, since a (+) b == b (+) a bitwise, but not associative).
struct Value {
  std::vector<Contribution> terms;
  std::uint64_t tree = 0;
};
using ValuePtr = std::shared_ptr<const Value>;

std::string termsText(const std::vector<Contribution>& terms) {
  std::string out;
  for (std::size_t i = 0; i < terms.size() && i < kMaxListed; ++i) {
    out += fmt::format("{}(rank {}, chunk {})", i ? ", " : "", terms[i].rank, terms[i].index);
  }
  if (terms.size() > kMaxListed) out += fmt::format(" and {} more", terms.size() - kMaxListed);
  return out;
}

struct OutOfTime {};  // VerifyOptions::deadline passed

class Verifier {
 public:
  Verifier(const Schedule& s, const VerifyOptions& o, VerifyReport& r) : s_(s), opt_(o), rep_(r) {}

  void run();

 private:
  // Called once per step by the passes that take long on large schedules; looks at the clock every 65536 calls.
  void tick() {
    if (opt_.deadline && (++ticks_ & 0xFFFFu) == 0 && std::chrono::steady_clock::now() > *opt_.deadline) {
      throw OutOfTime{};
    }
  }
  std::uint32_t ticks_ = 0;

  // ---- reporting -------------------------------------------------------------------------------------------
  void add(Severity sev, Property p, int rank, int tb, int step, std::string msg) {
    Finding f;
    f.severity = sev;
    f.property = p;
    f.mode = mode_;
    f.rank = rank;
    f.tb = tb;
    f.step = step;
    f.message = std::move(msg);
    auto& list = sev == Severity::Error ? rep_.errors : rep_.warnings;
    if (list.size() >= opt_.maxErrors) {
      ++(sev == Severity::Error ? rep_.suppressedErrors : rep_.suppressedWarnings);
      return;
    }
    list.push_back(std::move(f));
  }
  void error(Property p, int rank, int tb, int step, std::string msg) {
    add(Severity::Error, p, rank, tb, step, std::move(msg));
  }
  void errorAt(Property p, int node, std::string msg) {
    error(p, rankOf(node), tbIdOf(node), stepOf(node), std::move(msg));
  }
  std::size_t errorCount() const { return rep_.errors.size() + rep_.suppressedErrors; }

  // ---- node addressing -------------------------------------------------------------------------------------
  int rankOf(int node) const { return blockRank_[nodeBlock_[node]]; }
  int tbIdOf(int node) const { return block(nodeBlock_[node]).id; }
  int stepOf(int node) const { return node - stepBase_[nodeBlock_[node]]; }
  const core::ThreadBlock& block(int g) const { return s_.ranks[blockRank_[g]].threadBlocks[blockIdx_[g]]; }
  const Step& stepAt(int node) const { return block(nodeBlock_[node]).steps[stepOf(node)]; }
  std::string where(int node) const {
    return fmt::format("rank {} tb {} step {} ({})", rankOf(node), tbIdOf(node), stepOf(node),
                       core::toString(stepAt(node).op));
  }

  // ---- phases ----------------------------------------------------------------------------------------------
  bool checkShape();
  bool checkReferences();
  bool checkConnections();
  bool matchTransfers();
  void checkHasDep();
  bool orderSteps();
  void verifyMode(BufferMode mode);
  bool checkRanges();
  void checkRaces();
  std::vector<char> ranksNeedingFullClocks();
  void screenRanks(int first, int last, std::vector<char>& flagged);
  void raceGroup(const std::vector<int>& column, int columns, const std::vector<char>& rankInGroup);
  void execute();

  // Physical chunk id of a logical (buffer, index) of `rank` in the current mode; kNone if outside the buffers.
  int chunkId(int rank, BufferKind buf, std::int64_t index) const;
  std::string chunkName(int rank, BufferKind buf, int index) const;
  std::string physicalName(int rank, int id) const;
  bool localRange(int rank, BufferKind buf, int off, int count, std::vector<int>& ids) const;

  const Schedule& s_;
  const VerifyOptions& opt_;
  VerifyReport& rep_;
  BufferMode mode_ = BufferMode::OutOfPlace;

  // Blocks (global index g) and steps (global node id).
  std::vector<int> rankBlockBase_;  // first global block of each rank, size nRanks + 1
  std::vector<int> blockRank_, blockIdx_;
  std::vector<int> stepBase_;  // first node of each block, size B + 1
  std::vector<int> nodeBlock_;
  std::vector<int> depOff_, depNode_;    // CSR: resolved dependencies of each node
  std::vector<int> succOff_, succNode_;  // CSR: nodes that depend on each node
  std::vector<int> sendTo_, recvFrom_;   // matched receive of a sending node / matched send of a receiving node
  std::vector<int> order_;               // topological order
  // What the per-mode passes read of every step, in topological order: they visit the steps in an order unrelated
  // to where the schedule keeps them, and reading them through the schedule costs several cache misses each.
  struct OrderedStep {
    int node;
    int rank;
    int block;  // global block
    int pos;    // index in its block
    int count;
    int srcOff;
    int dstOff;
    StepOp op;
    BufferKind srcBuf;
    BufferKind dstBuf;
  };
  std::vector<OrderedStep> ordered_;
  std::vector<core::BufferSizes> logical_;  // per rank

  // Per mode: physical chunk layout.
  std::vector<int> chunkBase_;               // per rank, size nRanks + 1
  std::vector<core::BufferSizes> physical_;  // per rank
};

// ---------------------------------------------------------------------------------------------------------------
// Phase 1: shape and references.

bool Verifier::checkShape() {
  if (const std::string e = core::validateShape(s_); !e.empty()) {
    error(Property::Shape, kNone, kNone, kNone, e);
    return false;
  }
  bool ok = true;
  for (int r = 0; r < s_.nRanks; ++r) {
    const auto& rp = s_.ranks[r];
    const core::BufferSizes need = core::logicalSizes(s_, r);
    auto declared = [&](std::string_view what, int have, int needed) {
      if (have < 0 || (have != 0 && have < needed)) {
        error(Property::Shape, r, kNone, kNone,
              fmt::format("declares {} {} chunks but the collective needs {}", have, what, needed));
        ok = false;
      }
    };
    declared("input", rp.inputChunks, need.input);
    declared("output", rp.outputChunks, need.output);
    if (rp.scratchChunks < 0) {
      error(Property::Shape, r, kNone, kNone, fmt::format("declares {} scratch chunks", rp.scratchChunks));
      ok = false;
    }
  }
  return ok;
}

bool Verifier::checkReferences() {
  const std::size_t before = errorCount();
  const int n = s_.nRanks;
  // Global numbering of blocks and steps; sizes are bounded by the containers, but guard the int range.
  std::int64_t blocks = 0;
  std::int64_t steps = 0;
  for (const auto& rp : s_.ranks) {
    blocks += static_cast<std::int64_t>(rp.threadBlocks.size());
    for (const auto& tb : rp.threadBlocks) steps += static_cast<std::int64_t>(tb.steps.size());
  }
  if (blocks + steps >= std::numeric_limits<int>::max() / 2) {
    error(Property::Shape, kNone, kNone, kNone, fmt::format("schedule too large ({} steps)", steps));
    return false;
  }
  rankBlockBase_.assign(static_cast<std::size_t>(n) + 1, 0);
  for (int r = 0; r < n; ++r) {
    rankBlockBase_[r + 1] = rankBlockBase_[r] + static_cast<int>(s_.ranks[r].threadBlocks.size());
  }
  const int nb = rankBlockBase_[n];
  blockRank_.resize(nb);
  blockIdx_.resize(nb);
  stepBase_.assign(static_cast<std::size_t>(nb) + 1, 0);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < static_cast<int>(s_.ranks[r].threadBlocks.size()); ++i) {
      const int g = rankBlockBase_[r] + i;
      blockRank_[g] = r;
      blockIdx_[g] = i;
      stepBase_[g + 1] = stepBase_[g] + static_cast<int>(s_.ranks[r].threadBlocks[i].steps.size());
    }
  }
  const int ns = stepBase_[nb];
  nodeBlock_.resize(ns);
  for (int g = 0; g < nb; ++g) std::fill(nodeBlock_.begin() + stepBase_[g], nodeBlock_.begin() + stepBase_[g + 1], g);

  // Block ids, peers, channels.
  std::vector<std::unordered_map<int, int>> byId(n);  // tb id -> block index, per rank
  for (int r = 0; r < n; ++r) {
    const auto& rp = s_.ranks[r];
    for (int i = 0; i < static_cast<int>(rp.threadBlocks.size()); ++i) {
      const auto& tb = rp.threadBlocks[i];
      if (tb.id < 0) error(Property::Reference, r, tb.id, kNone, fmt::format("thread block id {} is negative", tb.id));
      if (!byId[r].emplace(tb.id, i).second) {
        error(Property::Reference, r, tb.id, kNone, fmt::format("thread block id {} is used twice", tb.id));
      }
      auto peer = [&](std::string_view dir, int p) {
        if (p == kNone) return;
        if (p < 0 || p >= n) {
          error(Property::Reference, r, tb.id, kNone, fmt::format("{} peer {} is not a rank (0..{})", dir, p, n - 1));
        } else if (p == r) {
          error(Property::Reference, r, tb.id, kNone, fmt::format("{} peer is the rank itself", dir));
        }
      };
      peer("send", tb.sendPeer);
      peer("recv", tb.recvPeer);
      if (tb.channel < 0 || tb.channel >= s_.nChannels) {
        error(Property::Reference, r, tb.id, kNone,
              fmt::format("channel {} is outside the schedule's {} channels", tb.channel, s_.nChannels));
      }
    }
  }

  // Steps: counts and dependencies.
  depOff_.assign(static_cast<std::size_t>(ns) + 1, 0);
  depNode_.clear();
  for (int g = 0; g < nb; ++g) {
    const int r = blockRank_[g];
    const auto& tb = block(g);
    for (int k = 0; k < static_cast<int>(tb.steps.size()); ++k) {
      const Step& st = tb.steps[k];
      const int node = stepBase_[g] + k;
      if (st.op != StepOp::Nop && st.count <= 0) {
        error(Property::Reference, r, tb.id, k, fmt::format("{} moves {} chunks", core::toString(st.op), st.count));
      }
      for (const auto& d : st.deps) {
        if (d.tb == kNone) continue;  // MSCCL's "no dependency"
        const auto it = byId[r].find(d.tb);
        if (it == byId[r].end()) {
          error(Property::Reference, r, tb.id, k,
                fmt::format("depends on thread block {}, which does not exist", d.tb));
          continue;
        }
        const int dg = rankBlockBase_[r] + it->second;
        const int len = stepBase_[dg + 1] - stepBase_[dg];
        if (d.step < 0 || d.step >= len) {
          error(Property::Reference, r, tb.id, k,
                fmt::format("depends on tb {} step {}, but that block has {} steps", d.tb, d.step, len));
          continue;
        }
        const int target = stepBase_[dg] + d.step;
        if (target == node) {
          error(Property::Reference, r, tb.id, k, "depends on itself");
          continue;
        }
        depNode_.push_back(target);
      }
      depOff_[node + 1] = static_cast<int>(depNode_.size());
    }
  }
  // Reverse CSR.
  succOff_.assign(static_cast<std::size_t>(ns) + 1, 0);
  for (int t : depNode_) ++succOff_[t + 1];
  for (int i = 0; i < ns; ++i) succOff_[i + 1] += succOff_[i];
  succNode_.assign(depNode_.size(), 0);
  {
    std::vector<int> fill(succOff_.begin(), succOff_.end() - 1);
    for (int v = 0; v < ns; ++v) {
      for (int e = depOff_[v]; e < depOff_[v + 1]; ++e) succNode_[fill[depNode_[e]]++] = v;
    }
  }
  return errorCount() == before;
}

// ---------------------------------------------------------------------------------------------------------------
// Phase 2: connections and matching.

bool Verifier::checkConnections() {
  const std::size_t before = errorCount();
  for (int r = 0; r < s_.nRanks; ++r) {
    std::map<std::pair<int, int>, int> sendConn, recvConn;  // (peer, channel) -> tb id
    for (const auto& tb : s_.ranks[r].threadBlocks) {
      if (tb.sendPeer != kNone) {
        const auto [it, fresh] = sendConn.emplace(std::make_pair(tb.sendPeer, tb.channel), tb.id);
        if (!fresh) {
          error(Property::Connection, r, tb.id, kNone,
                fmt::format("sends to rank {} on channel {} like tb {} (one connection per block)", tb.sendPeer,
                            tb.channel, it->second));
        }
      }
      if (tb.recvPeer != kNone) {
        const auto [it, fresh] = recvConn.emplace(std::make_pair(tb.recvPeer, tb.channel), tb.id);
        if (!fresh) {
          error(Property::Connection, r, tb.id, kNone,
                fmt::format("receives from rank {} on channel {} like tb {} (one connection per block)", tb.recvPeer,
                            tb.channel, it->second));
        }
      }
      for (int k = 0; k < static_cast<int>(tb.steps.size()); ++k) {
        const StepOp op = tb.steps[k].op;
        if (core::opSends(op) && tb.sendPeer == kNone) {
          error(Property::Connection, r, tb.id, k,
                fmt::format("{} sends but the block has no send peer", toString(op)));
        }
        if (core::opReceives(op) && tb.recvPeer == kNone) {
          error(Property::Connection, r, tb.id, k,
                fmt::format("{} receives but the block has no recv peer", toString(op)));
        }
      }
    }
  }
  return errorCount() == before;
}

bool Verifier::matchTransfers() {
  const std::size_t before = errorCount();
  const int ns = static_cast<int>(nodeBlock_.size());
  sendTo_.assign(ns, kNone);
  recvFrom_.assign(ns, kNone);
  // (sender, receiver, channel) -> receiving block; unique after checkConnections.
  std::map<std::tuple<int, int, int>, int> receiver;
  const int nb = static_cast<int>(blockRank_.size());
  for (int g = 0; g < nb; ++g) {
    const auto& tb = block(g);
    if (tb.recvPeer != kNone) receiver.emplace(std::make_tuple(tb.recvPeer, blockRank_[g], tb.channel), g);
  }
  std::vector<char> receiverUsed(nb, 0);
  auto listOf = [&](int g, bool sends) {
    std::vector<int> out;
    for (int v = stepBase_[g]; v < stepBase_[g + 1]; ++v) {
      const StepOp op = stepAt(v).op;
      if (sends ? core::opSends(op) : core::opReceives(op)) out.push_back(v);
    }
    return out;
  };
  for (int g = 0; g < nb; ++g) {
    const auto& tb = block(g);
    const int r = blockRank_[g];
    if (tb.sendPeer == kNone) continue;
    const std::vector<int> sends = listOf(g, true);
    const auto it = receiver.find(std::make_tuple(r, tb.sendPeer, tb.channel));
    if (it == receiver.end()) {
      if (!sends.empty()) {
        errorAt(Property::Matching, sends.front(),
                fmt::format("{} sends to rank {} on channel {}, but no block of rank {} receives from rank {} on that "
                            "channel",
                            sends.size(), tb.sendPeer, tb.channel, tb.sendPeer, r));
      }
      continue;
    }
    const int rg = it->second;
    receiverUsed[rg] = 1;
    const std::vector<int> recvs = listOf(rg, false);
    const std::size_t pairs = std::min(sends.size(), recvs.size());
    for (std::size_t k = 0; k < pairs; ++k) {
      const int sv = sends[k];
      const int rv = recvs[k];
      if (stepAt(sv).count != stepAt(rv).count) {
        errorAt(Property::Matching, rv,
                fmt::format("receive #{} on the connection from rank {} (channel {}) expects {} chunks but the "
                            "matching send {} sends {}",
                            k, r, tb.channel, stepAt(rv).count, where(sv), stepAt(sv).count));
      }
      sendTo_[sv] = rv;
      recvFrom_[rv] = sv;
    }
    rep_.transfers += pairs;
    if (sends.size() > pairs) {
      errorAt(Property::Matching, sends[pairs],
              fmt::format("{} sends to rank {} on channel {} but rank {} receives only {}; this one is unmatched",
                          sends.size(), tb.sendPeer, tb.channel, tb.sendPeer, recvs.size()));
    } else if (recvs.size() > pairs) {
      errorAt(Property::Matching, recvs[pairs],
              fmt::format("{} receives from rank {} on channel {} but rank {} sends only {}; this one waits forever",
                          recvs.size(), r, tb.channel, r, sends.size()));
    }
  }
  for (int g = 0; g < nb; ++g) {
    if (receiverUsed[g] || block(g).recvPeer == kNone) continue;
    const std::vector<int> recvs = listOf(g, false);
    if (!recvs.empty()) {
      const auto& tb = block(g);
      errorAt(Property::Matching, recvs.front(),
              fmt::format("{} receives from rank {} on channel {}, but no block of rank {} sends to rank {} on that "
                          "channel",
                          recvs.size(), tb.recvPeer, tb.channel, tb.recvPeer, blockRank_[g]));
    }
  }
  return errorCount() == before;
}

void Verifier::checkHasDep() {
  const int ns = static_cast<int>(nodeBlock_.size());
  std::vector<char> reported(ns, 0);
  for (int v = 0; v < ns; ++v) {
    for (int e = depOff_[v]; e < depOff_[v + 1]; ++e) {
      const int t = depNode_[e];
      if (stepAt(t).hasDep || reported[t]) continue;
      reported[t] = 1;
      errorAt(Property::HasDep, t,
              fmt::format("{} waits on this step, but it has hasdep=0 so it never publishes its completion flag",
                          where(v)));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Phase 3: deadlock freedom and the topological order.

bool Verifier::orderSteps() {
  const int ns = static_cast<int>(nodeBlock_.size());
  std::vector<int> indeg(ns, 0);
  for (int v = 0; v < ns; ++v) {
    int d = depOff_[v + 1] - depOff_[v];
    if (v != stepBase_[nodeBlock_[v]]) ++d;
    if (recvFrom_[v] != kNone) ++d;
    indeg[v] = d;
  }
  order_.clear();
  order_.reserve(ns);
  for (int v = 0; v < ns; ++v) {
    if (indeg[v] == 0) order_.push_back(v);
  }
  for (std::size_t head = 0; head < order_.size(); ++head) {
    const int v = order_[head];
    auto release = [&](int w) {
      if (--indeg[w] == 0) order_.push_back(w);
    };
    if (v + 1 < stepBase_[nodeBlock_[v] + 1]) release(v + 1);
    for (int e = succOff_[v]; e < succOff_[v + 1]; ++e) release(succNode_[e]);
    if (sendTo_[v] != kNone) release(sendTo_[v]);
  }
  if (static_cast<int>(order_.size()) == ns) {
    ordered_.resize(order_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) {
      const int v = order_[i];
      const Step& st = stepAt(v);
      ordered_[i] = {v,         rankOf(v), nodeBlock_[v], stepOf(v), st.count,
                     st.srcOff, st.dstOff, st.op,         st.srcBuf, st.dstBuf};
    }
    return true;
  }

  // Every unprocessed node has an unprocessed predecessor: walk predecessors until a node repeats.
  std::vector<int> seenAt(ns, kNone);
  int v = 0;
  while (indeg[v] == 0) ++v;
  std::vector<int> path;
  while (seenAt[v] == kNone) {
    seenAt[v] = static_cast<int>(path.size());
    path.push_back(v);
    int next = kNone;
    if (v != stepBase_[nodeBlock_[v]] && indeg[v - 1] > 0) next = v - 1;
    for (int e = depOff_[v]; next == kNone && e < depOff_[v + 1]; ++e) {
      if (indeg[depNode_[e]] > 0) next = depNode_[e];
    }
    if (next == kNone && recvFrom_[v] != kNone && indeg[recvFrom_[v]] > 0) next = recvFrom_[v];
    if (next == kNone) break;  // cannot happen; defensive
    v = next;
  }
  std::vector<int> cycle(path.begin() + (seenAt[v] == kNone ? 0 : seenAt[v]), path.end());
  std::reverse(cycle.begin(), cycle.end());  // predecessor walk -> execution order
  // Start the report at the step that comes first in (rank, tb, step) order, so it is deterministic.
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string text;
  for (std::size_t i = 0; i < cycle.size() && i < 2 * kMaxListed; ++i) text += where(cycle[i]) + " -> ";
  text += cycle.size() > 2 * kMaxListed ? fmt::format("... ({} steps in all)", cycle.size()) : where(cycle.front());
  errorAt(Property::Deadlock, cycle.front(),
          fmt::format("waits in a cycle ({} of {} steps can never run): {}", static_cast<int>(ns - order_.size()), ns,
                      text));
  return false;
}

// ---------------------------------------------------------------------------------------------------------------
// Phase 4: per buffer mode.

int Verifier::chunkId(int rank, BufferKind buf, std::int64_t index) const {
  const core::BufferSizes& logical = logical_[rank];
  const int size = buf == BufferKind::Input    ? logical.input
                   : buf == BufferKind::Output ? logical.output
                                               : logical.scratch;
  if (index < 0 || index >= size) return kNone;
  const core::Slot slot = core::resolveSlot(s_, rank, mode_, buf, static_cast<int>(index));
  const core::BufferSizes& p = physical_[rank];
  switch (slot.buf) {
    case BufferKind::Input:
      return slot.index >= 0 && slot.index < p.input ? chunkBase_[rank] + slot.index : kNone;
    case BufferKind::Output:
      return slot.index >= 0 && slot.index < p.output ? chunkBase_[rank] + p.input + slot.index : kNone;
    case BufferKind::Scratch:
      return slot.index >= 0 && slot.index < p.scratch ? chunkBase_[rank] + p.input + p.output + slot.index : kNone;
  }
  return kNone;
}

std::string Verifier::chunkName(int rank, BufferKind buf, int index) const {
  const core::Slot slot = core::resolveSlot(s_, rank, mode_, buf, index);
  if (slot.buf == buf && slot.index == index) return fmt::format("{}[{}]", core::toString(buf), index);
  return fmt::format("{}[{}] (= {}[{}])", core::toString(buf), index, core::toString(slot.buf), slot.index);
}

std::string Verifier::physicalName(int rank, int id) const {
  int i = id - chunkBase_[rank];
  const core::BufferSizes& p = physical_[rank];
  if (i < p.input) return fmt::format("{}[{}]", core::toString(BufferKind::Input), i);
  i -= p.input;
  if (i < p.output) return fmt::format("{}[{}]", core::toString(BufferKind::Output), i);
  return fmt::format("{}[{}]", core::toString(BufferKind::Scratch), i - p.output);
}

bool Verifier::localRange(int rank, BufferKind buf, int off, int count, std::vector<int>& ids) const {
  ids.clear();
  for (std::int64_t i = 0; i < count; ++i) {
    const int id = chunkId(rank, buf, std::int64_t{off} + i);
    if (id == kNone) return false;
    ids.push_back(id);
  }
  return true;
}

bool Verifier::checkRanges() {
  const std::size_t before = errorCount();
  std::vector<int> ids;
  for (int v = 0; v < static_cast<int>(nodeBlock_.size()); ++v) {
    const Step& st = stepAt(v);
    const int r = rankOf(v);
    auto check = [&](std::string_view what, BufferKind buf, int off) {
      const core::BufferSizes logical = core::logicalSizes(s_, r);
      const int size = buf == BufferKind::Input    ? logical.input
                       : buf == BufferKind::Output ? logical.output
                                                   : logical.scratch;
      // Range check in 64 bits before touching anything, so absurd counts are rejected without a loop.
      if (off < 0 || std::int64_t{off} + st.count > size || !localRange(r, buf, off, st.count, ids)) {
        errorAt(Property::Reference, v,
                fmt::format("{} range {}[{}..{}) is outside the buffer ({} chunks{})", what, core::toString(buf), off,
                            std::int64_t{off} + st.count, size,
                            mode_ == BufferMode::InPlace ? " in-place, after aliasing" : ""));
      }
    };
    if (core::opReadsSrc(st.op)) check("src", st.srcBuf, st.srcOff);
    if (core::opWritesDst(st.op)) check("dst", st.dstBuf, st.dstOff);
  }
  for (int r = 0; r < s_.nRanks; ++r) {
    for (const auto& lc : s_.ranks[r].localCopies) {
      if (chunkId(r, BufferKind::Input, lc.inputOffset) == kNone ||
          chunkId(r, BufferKind::Output, lc.outputOffset) == kNone) {
        error(
            Property::Reference, r, kNone, kNone,
            fmt::format("local copy input[{}] -> output[{}] is outside the buffers", lc.inputOffset, lc.outputOffset));
      }
    }
  }
  return errorCount() == before;
}

// Races. A pass keeps, for every block, the vector clock of its last processed step restricted to `columns`
// blocks (those of the ranks in the group); a step's clock is the join of its block's clock, its matched send's
// clock and its dependencies' clocks, with its own entry set to its 1-based position. x happens before y (both on
// one rank, x processed first) iff clock(y)[column(block(x))] >= position(x). Per physical chunk, the last write
// and the reads since then are kept (as FastTrack does): a write must be ordered after both, a read after the
// write; then earlier accesses are ordered transitively.
void Verifier::raceGroup(const std::vector<int>& column, int columns, const std::vector<char>& rankInGroup) {
  const int nb = static_cast<int>(blockRank_.size());
  const int ns = static_cast<int>(nodeBlock_.size());
  const auto g64 = static_cast<std::size_t>(columns);
  std::vector<std::int32_t> clocks(static_cast<std::size_t>(nb) * g64, 0);
  // Snapshots for nodes whose clock is needed later, freed when the last consumer has joined it.
  std::vector<std::unique_ptr<std::int32_t[]>> snap(ns);
  std::vector<int> consumers(ns, 0);
  for (int v = 0; v < ns; ++v) consumers[v] = (sendTo_[v] != kNone ? 1 : 0) + (succOff_[v + 1] - succOff_[v]);

  const int nChunks = chunkBase_.back();
  std::vector<int> lastWrite(nChunks, kNone);
  std::vector<std::vector<int>> reads(nChunks);
  std::vector<int> ids;

  auto join = [&](std::int32_t* dst, int from) {
    const std::int32_t* src = snap[from].get();
    for (std::size_t i = 0; i < g64; ++i) dst[i] = std::max(dst[i], src[i]);
    if (--consumers[from] == 0) snap[from].reset();
  };
  for (const int v : order_) {
    tick();
    const int g = nodeBlock_[v];
    std::int32_t* c = clocks.data() + static_cast<std::size_t>(g) * g64;
    if (recvFrom_[v] != kNone) join(c, recvFrom_[v]);
    for (int e = depOff_[v]; e < depOff_[v + 1]; ++e) join(c, depNode_[e]);
    if (column[g] != kNone) c[column[g]] = stepOf(v) + 1;
    if (consumers[v] > 0) {
      snap[v] = std::make_unique<std::int32_t[]>(g64);
      std::copy(c, c + g64, snap[v].get());
    }
    const int r = blockRank_[g];
    if (!rankInGroup[r]) continue;
    const Step& st = stepAt(v);
    auto ordered = [&](int x) { return c[column[nodeBlock_[x]]] >= stepOf(x) + 1; };
    bool reported = false;
    auto race = [&](int x, bool iWrite, bool otherWrites, int chunk) {
      if (reported) return;
      reported = true;
      errorAt(
          Property::Race, v,
          fmt::format("{} {}, which {} {}, and neither step is ordered before the other", iWrite ? "writes" : "reads",
                      physicalName(r, chunk), where(x), otherWrites ? "writes" : "reads"));
    };
    const bool reads_ = core::opReadsSrc(st.op);
    const bool writes = core::opWritesDst(st.op);
    if (reads_ && localRange(r, st.srcBuf, st.srcOff, st.count, ids)) {
      for (const int id : ids) {
        const int w = lastWrite[id];
        if (w != kNone && w != v && !ordered(w)) race(w, false, true, id);
        auto& rl = reads[id];
        if (rl.empty() || rl.back() != v) rl.push_back(v);
      }
    }
    if (writes && localRange(r, st.dstBuf, st.dstOff, st.count, ids)) {
      for (const int id : ids) {
        const int w = lastWrite[id];
        if (w != kNone && w != v && !ordered(w)) race(w, true, true, id);
        for (const int x : reads[id]) {
          if (x != v && !ordered(x)) race(x, true, false, id);
        }
        reads[id].clear();
        lastWrite[id] = v;
      }
    }
  }
}

// A screening pass with rank-local clocks: program order and dependencies (which never leave a rank), without the
// send->receive waits. Whatever it orders is ordered, so a rank whose conflicting accesses it all orders has no race;
// it returns the ranks where some pair is left, which checkRaces then examines with full clocks. Every access pair
// the full passes compare is compared here too (same topological order, same per-chunk state), so skipping the
// groups without such a rank changes no finding. Compiled schedules order every hazard by a dependency and skip the
// full passes entirely: this pass costs O(S * blocks per rank).
std::vector<char> Verifier::ranksNeedingFullClocks() {
  const int n = s_.nRanks;
  std::vector<char> flagged(n, 0);
  // A rank's clocks are as wide as its blocks, and one pass keeps the clocks of all its ranks' blocks: the ranks go
  // in groups whose clocks fit the budget, one pass each (the clocks never leave a rank, so the groups are
  // independent; on 1024 ranks of 156 blocks that is two passes). A rank whose clocks alone are over it is left to
  // the full passes.
  auto entries = [&](int r) {
    const std::int64_t width = rankBlockBase_[r + 1] - rankBlockBase_[r];
    return width * width;
  };
  int first = 0;
  while (first < n) {
    if (entries(first) > opt_.clockBudget) {
      flagged[first++] = 1;
      continue;
    }
    std::int64_t sum = 0;
    int last = first;
    while (last < n && sum + entries(last) <= opt_.clockBudget) sum += entries(last++);
    screenRanks(first, last, flagged);
    first = last;
  }
  return flagged;
}

// One group of the screen: ranks [first, last).
void Verifier::screenRanks(int first, int last, std::vector<char>& flagged) {
  const int nb = static_cast<int>(blockRank_.size());
  const int ns = static_cast<int>(nodeBlock_.size());
  // Per block of the group, its running clock over the blocks of its rank.
  std::vector<std::int64_t> rowOff(static_cast<std::size_t>(nb) + 1, 0);
  int maxWidth = 0;
  for (int g = 0; g < nb; ++g) {
    const int r = blockRank_[g];
    const int width = r >= first && r < last ? rankBlockBase_[r + 1] - rankBlockBase_[r] : 0;
    maxWidth = std::max(maxWidth, width);
    rowOff[g + 1] = rowOff[g] + width;
  }
  std::vector<std::int32_t> clocks(static_cast<std::size_t>(rowOff[nb]), 0);
  // Snapshots of the clocks later steps join, in one pool with a free list per width (no allocation per step).
  std::vector<std::int32_t> pool;
  std::vector<std::vector<std::int64_t>> freeSlots(static_cast<std::size_t>(maxWidth) + 1);
  std::vector<std::int64_t> snap(ns, -1);
  std::vector<int> consumers(ns, 0);
  for (int v = 0; v < ns; ++v) consumers[v] = succOff_[v + 1] - succOff_[v];
  const int nChunks = chunkBase_.back();
  std::vector<int> lastWrite(nChunks, kNone);
  // The reads of each chunk since its last write, as lists in one pool (the order does not matter here).
  struct ReadLink {
    int node;
    int next;
  };
  std::vector<ReadLink> readPool;
  std::vector<int> readHead(nChunks, kNone);
  std::vector<int> ids;
  for (const OrderedStep& st : ordered_) {
    tick();
    const int r = st.rank;
    if (r < first || r >= last) continue;
    const int v = st.node;
    const int base = rankBlockBase_[r];
    const int width = rankBlockBase_[r + 1] - base;
    std::int32_t* c = clocks.data() + rowOff[st.block];
    for (int e = depOff_[v]; e < depOff_[v + 1]; ++e) {
      const int from = depNode_[e];
      const std::int32_t* src = pool.data() + snap[from];
      for (int i = 0; i < width; ++i) c[i] = std::max(c[i], src[i]);
      if (--consumers[from] == 0) freeSlots[width].push_back(snap[from]);
    }
    c[st.block - base] = st.pos + 1;
    if (consumers[v] > 0) {
      auto& slots = freeSlots[width];
      if (slots.empty()) {
        snap[v] = static_cast<std::int64_t>(pool.size());
        pool.resize(pool.size() + static_cast<std::size_t>(width));
      } else {
        snap[v] = slots.back();
        slots.pop_back();
      }
      std::copy(c, c + width, pool.data() + snap[v]);
    }
    if (flagged[r]) continue;
    auto ordered = [&](int x) { return c[nodeBlock_[x] - base] >= stepOf(x) + 1; };
    if (core::opReadsSrc(st.op) && localRange(r, st.srcBuf, st.srcOff, st.count, ids)) {
      for (const int id : ids) {
        const int w = lastWrite[id];
        if (w != kNone && w != v && !ordered(w)) flagged[r] = 1;
        if (readHead[id] == kNone || readPool[readHead[id]].node != v) {
          readPool.push_back({v, readHead[id]});
          readHead[id] = static_cast<int>(readPool.size()) - 1;
        }
      }
    }
    if (core::opWritesDst(st.op) && localRange(r, st.dstBuf, st.dstOff, st.count, ids)) {
      for (const int id : ids) {
        const int w = lastWrite[id];
        if (w != kNone && w != v && !ordered(w)) flagged[r] = 1;
        for (int x = readHead[id]; x != kNone; x = readPool[x].next) {
          if (readPool[x].node != v && !ordered(readPool[x].node)) flagged[r] = 1;
        }
        readHead[id] = kNone;
        lastWrite[id] = v;
      }
    }
  }
}

void Verifier::checkRaces() {
  const int n = s_.nRanks;
  const int nb = static_cast<int>(blockRank_.size());
  if (nb == 0) return;
  const std::vector<char> needed = ranksNeedingFullClocks();
  int maxPerRank = 1;
  for (int r = 0; r < n; ++r) maxPerRank = std::max(maxPerRank, rankBlockBase_[r + 1] - rankBlockBase_[r]);
  const auto budget = static_cast<int>(std::clamp<std::int64_t>(opt_.clockBudget / nb, 1, nb));
  const int cap = std::max(budget, maxPerRank);
  int r = 0;
  while (r < n) {
    std::vector<int> column(nb, kNone);
    std::vector<char> inGroup(n, 0);
    int cols = 0;
    while (r < n && (cols == 0 || cols + (rankBlockBase_[r + 1] - rankBlockBase_[r]) <= cap)) {
      inGroup[r] = 1;
      for (int g = rankBlockBase_[r]; g < rankBlockBase_[r + 1]; ++g) column[g] = cols++;
      ++r;
    }
    bool any = false;
    for (int q = 0; q < n; ++q) any = any || (inGroup[q] && needed[q]);
    if (cols > 0 && any) raceGroup(column, cols, inGroup);
  }
}

// Symbolic execution in topological order.
void Verifier::execute() {
  const int ns = static_cast<int>(nodeBlock_.size());
  const int nChunks = chunkBase_.back();
  std::vector<ValuePtr> mem(nChunks);
  std::vector<int> writer(nChunks, kNone);
  // Values in flight: every matched send owns `count` slots of one pool, filled when it runs and emptied by its
  // receive (one allocation in all rather than one per send).
  struct Slots {
    std::int64_t off = -1;
    int count = 0;
  };
  std::vector<Slots> inflightAt(ns);
  std::int64_t inflightSize = 0;
  for (const OrderedStep& st : ordered_) {
    if (core::opSends(st.op) && sendTo_[st.node] != kNone) {
      inflightAt[st.node] = {inflightSize, std::max(st.count, 0)};
      inflightSize += std::max(st.count, 0);
    }
  }
  std::vector<ValuePtr> inflight(static_cast<std::size_t>(inflightSize));

  // Initial state, then TE-CCL's local copies.
  for (int r = 0; r < s_.nRanks; ++r) {
    const int inputs = core::logicalSizes(s_, r).input;
    for (int i = 0; i < inputs; ++i) {
      if (!core::inputDefined(s_, r, i)) continue;
      const int id = chunkId(r, BufferKind::Input, i);
      if (id == kNone) continue;
      auto val = std::make_shared<Value>();
      val->terms.push_back({r, i});
      val->tree =
          mix((static_cast<std::uint64_t>(static_cast<std::uint32_t>(r)) << 32) | static_cast<std::uint32_t>(i));
      mem[id] = std::move(val);
    }
    for (const auto& lc : s_.ranks[r].localCopies) {
      const int from = chunkId(r, BufferKind::Input, lc.inputOffset);
      const int to = chunkId(r, BufferKind::Output, lc.outputOffset);
      if (from != kNone && to != kNone) mem[to] = mem[from];
    }
  }

  std::vector<int> src, dst;
  std::vector<ValuePtr> srcVals, dstVals, recvVals, out;
  for (const OrderedStep& st : ordered_) {
    tick();
    if (st.op == StepOp::Nop) continue;
    const int v = st.node;
    const int r = st.rank;
    const bool readsSrc = core::opReadsSrc(st.op);
    const bool writesDst = core::opWritesDst(st.op);
    if (readsSrc) localRange(r, st.srcBuf, st.srcOff, st.count, src);
    if (writesDst) localRange(r, st.dstBuf, st.dstOff, st.count, dst);
    const auto cnt = static_cast<std::size_t>(st.count);

    bool uninitReported = false;
    auto load = [&](const std::vector<int>& ids, BufferKind buf, int off, std::string_view what,
                    std::vector<ValuePtr>& vals) {
      vals.clear();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        vals.push_back(mem[ids[i]]);
        if (!vals.back() && !uninitReported) {
          uninitReported = true;
          errorAt(Property::Uninitialized, v,
                  fmt::format("reads {} {}, which holds no defined data", what,
                              chunkName(r, buf, off + static_cast<int>(i))));
        }
      }
    };
    if (readsSrc) load(src, st.srcBuf, st.srcOff, "src", srcVals);
    if (st.op == StepOp::Reduce) load(dst, st.dstBuf, st.dstOff, "dst", dstVals);
    recvVals.clear();
    if (core::opReceives(st.op)) {
      const Slots& in = inflightAt[recvFrom_[v]];
      const auto first = inflight.begin() + in.off;
      recvVals.assign(std::make_move_iterator(first), std::make_move_iterator(first + in.count));
      recvVals.resize(cnt);
    }

    bool twiceReported = false;
    auto reduce = [&](const std::vector<ValuePtr>& a, const std::vector<ValuePtr>& b) {
      std::vector<ValuePtr> res(cnt);
      for (std::size_t i = 0; i < cnt; ++i) {
        if (!a[i] || !b[i]) continue;  // undefined stays undefined; the read was reported where it happened
        auto val = std::make_shared<Value>();
        val->terms.resize(a[i]->terms.size() + b[i]->terms.size());
        std::merge(a[i]->terms.begin(), a[i]->terms.end(), b[i]->terms.begin(), b[i]->terms.end(), val->terms.begin());
        const auto dup = std::adjacent_find(val->terms.begin(), val->terms.end());
        if (dup != val->terms.end() && !twiceReported) {
          twiceReported = true;
          errorAt(Property::ReducedTwice, v,
                  fmt::format("combines two values that both contain (rank {}, chunk {}) at chunk {} of the step",
                              dup->rank, dup->index, i));
        }
        const std::uint64_t lo = std::min(a[i]->tree, b[i]->tree);
        const std::uint64_t hi = std::max(a[i]->tree, b[i]->tree);
        val->tree = mix(lo ^ mix(hi + 0x51ed2701ULL));
        res[i] = std::move(val);
      }
      return res;
    };

    out.clear();
    switch (st.op) {
      case StepOp::Send:
        out = srcVals;
        break;
      case StepOp::Recv:
        dstVals = recvVals;
        break;
      case StepOp::RecvCopySend:
        dstVals = recvVals;
        out = recvVals;
        break;
      case StepOp::RecvReduceSend:
        out = reduce(recvVals, srcVals);
        break;
      case StepOp::RecvReduceCopy:
        dstVals = reduce(srcVals, recvVals);
        break;
      case StepOp::RecvReduceCopySend:
        dstVals = reduce(srcVals, recvVals);
        out = dstVals;
        break;
      case StepOp::Copy:
        dstVals = srcVals;
        break;
      case StepOp::Reduce:
        dstVals = reduce(dstVals, srcVals);
        break;
      case StepOp::Nop:
        break;
    }
    if (core::opSends(st.op) && sendTo_[v] != kNone) {
      const std::size_t slots = std::min(out.size(), static_cast<std::size_t>(st.count));
      std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(slots), inflight.begin() + inflightAt[v].off);
    }
    if (writesDst) {
      for (std::size_t i = 0; i < dst.size() && i < dstVals.size(); ++i) {
        mem[dst[i]] = dstVals[i];
        writer[dst[i]] = v;
      }
    }
  }

  // Postcondition and reduction order.
  std::unordered_map<std::uint64_t, std::pair<int, std::uint64_t>> orderSeen;  // (chunk, terms) -> (rank, tree)
  std::size_t orderWarnings = 0;
  for (int r = 0; r < s_.nRanks; ++r) {
    const int outputs = core::logicalSizes(s_, r).output;
    for (int j = 0; j < outputs; ++j) {
      const core::Expected exp = core::expectedOutput(s_, r, j);
      if (!exp.constrained) continue;
      const int id = chunkId(r, BufferKind::Output, j);
      if (id == kNone) continue;  // reported as a shape problem already
      const ValuePtr& val = mem[id];
      const std::vector<Contribution> none;
      const std::vector<Contribution>& have = val ? val->terms : none;
      if (have != exp.terms) {
        std::vector<Contribution> missing, extra;
        std::set_difference(exp.terms.begin(), exp.terms.end(), have.begin(), have.end(), std::back_inserter(missing));
        std::set_difference(have.begin(), have.end(), exp.terms.begin(), exp.terms.end(), std::back_inserter(extra));
        std::string msg = fmt::format("output chunk {} ", chunkName(r, BufferKind::Output, j));
        msg += val ? fmt::format("holds {} contributions", have.size()) : std::string("holds no defined data");
        if (!missing.empty()) msg += fmt::format("; missing {}", termsText(missing));
        if (!extra.empty()) msg += fmt::format("; extra {}", termsText(extra));
        msg += writer[id] == kNone ? "; never written by the schedule" : std::string("; last written by this step");
        const int w = writer[id];
        error(Property::Postcondition, r, w == kNone ? kNone : tbIdOf(w), w == kNone ? kNone : stepOf(w), msg);
        continue;
      }
      if (!opt_.checkReductionOrder || have.size() < 2) continue;
      std::uint64_t key = mix(static_cast<std::uint64_t>(j));
      for (const auto& c : have) {
        key = mix(key ^ ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.rank)) << 32) |
                         static_cast<std::uint32_t>(c.index)));
      }
      const auto [it, fresh] = orderSeen.emplace(key, std::make_pair(r, val->tree));
      if (!fresh && it->second.second != val->tree) {
        if (orderWarnings++ < 8) {
          const int w = writer[id];
          add(Severity::Warning, Property::ReductionOrder, r, w == kNone ? kNone : tbIdOf(w),
              w == kNone ? kNone : stepOf(w),
              fmt::format("output chunk {} combines the same {} contributions as on rank {} but in a different "
                          "order, so floating-point results can differ bitwise between ranks",
                          j, have.size(), it->second.first));
        } else {
          ++rep_.suppressedWarnings;
        }
      }
    }
  }
  if (orderWarnings > 8) {
    add(Severity::Warning, Property::ReductionOrder, kNone, kNone, kNone,
        fmt::format("{} output chunks in all are reduced in an order that differs between ranks", orderWarnings));
  }
}

void Verifier::verifyMode(BufferMode mode) {
  mode_ = mode;
  const int n = s_.nRanks;
  physical_.resize(n);
  logical_.resize(n);
  chunkBase_.assign(static_cast<std::size_t>(n) + 1, 0);
  for (int r = 0; r < n; ++r) {
    physical_[r] = core::physicalSizes(s_, r, mode);
    logical_[r] = core::logicalSizes(s_, r);
    const std::int64_t total = std::int64_t{chunkBase_[r]} + std::max(0, physical_[r].input) +
                               std::max(0, physical_[r].output) + std::max(0, physical_[r].scratch);
    if (total > (std::int64_t{1} << 28)) {
      error(Property::Shape, r, kNone, kNone, "buffers too large to verify");
      return;
    }
    chunkBase_[r + 1] = static_cast<int>(total);
  }
  if (!checkRanges()) return;
  checkRaces();
  execute();
}

void Verifier::run() {
  rep_.steps = core::totalSteps(s_);
  rep_.modesChecked = core::supportedModes(s_);
  mode_ = rep_.modesChecked.empty() ? BufferMode::OutOfPlace : rep_.modesChecked.front();
  if (!checkShape()) return;
  if (!checkReferences()) return;
  if (!checkConnections()) return;
  if (!matchTransfers()) return;
  checkHasDep();
  if (!orderSteps()) return;
  for (const BufferMode m : rep_.modesChecked) verifyMode(m);
}

}  // namespace

VerifyReport verify(const Schedule& schedule, const VerifyOptions& options) {
  VerifyReport report;
  Verifier v(schedule, options, report);
  try {
    v.run();
  } catch (const OutOfTime&) {
    report.timedOut = true;
  }
  report.proven = !report.timedOut && report.errors.empty() && report.suppressedErrors == 0;
  return report;
}

}  // namespace optiflow::compiler
