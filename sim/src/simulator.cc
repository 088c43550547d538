// The simulator's event loop (docs/simulator.md, "The time model"): the Engine checks a schedule and lays it out as
// blocks, steps and connections, runs the step instances through one (time, sequence) event queue (readiness, the
// per-step synchronisation, heads and tails of data, block order), and turns the run into a SimResult
// (extrapolation, link usage, the critical path). How fast data moves is the flow model's (flow_model.h): the engine
// starts a flow for every sending step and schedules the drain events the model asks for.
#include "optiflow/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "flow_model.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/units.h"

namespace optiflow::sim {

namespace {

using core::StepOp;
using detail::Drain;
using detail::FlowModel;
using detail::kInf;

bool isLocal(StepOp op) { return op == StepOp::Copy || op == StepOp::Reduce; }
// Inline copies of core::opSends/opReceives for the hot loop; keep them identical to core/src/schedule.cc.
constexpr bool sends(StepOp op) {
  return op == StepOp::Send || op == StepOp::RecvCopySend || op == StepOp::RecvReduceSend ||
         op == StepOp::RecvReduceCopySend;
}
constexpr bool receives(StepOp op) {
  return op == StepOp::Recv || op == StepOp::RecvCopySend || op == StepOp::RecvReduceSend ||
         op == StepOp::RecvReduceCopy || op == StepOp::RecvReduceCopySend;
}

SimResult failure(std::string msg, std::uint64_t size) {
  SimResult r;
  r.ok = false;
  r.error = std::move(msg);
  r.sizeBytes = size;
  return r;
}

struct BlockInfo {
  int rank = 0;
  int tbId = 0;
  int first = 0;  // global step index of its first step
  int n = 0;
};

struct StepInfo {
  int block = 0;
  int recvFrom = -1;  // global step of the matching send (receiving ops)
  int sendTo = -1;    // global step of the matching receive (sending ops)
  int conn = -1;      // connection of the outgoing transfer (sending ops)
  int depStart = 0;
  int nDeps = 0;
  int count = 0;
  StepOp op = StepOp::Nop;
};

struct Conn {
  int src = 0;
  int dst = 0;
  int pathStart = 0;
  int pathLen = 0;
  double hopUs = 0;  // head/tail delay: max(path latency, protocol hop latency) + network overhead
  int cls = 0;       // HopClass of the path (the worst link class on it)
};

// Instance flags.
constexpr std::uint8_t kStarted = 1;
constexpr std::uint8_t kDone = 2;
constexpr std::uint8_t kDrained = 4;       // its outgoing flow has drained (end holds the drain time)
constexpr std::uint8_t kHeadSent = 8;      // sender: the head of its data was delivered to the receiver
constexpr std::uint8_t kTailArrived = 16;  // sender: the tail of its data arrived (tail holds the time)
constexpr std::uint8_t kEndByInput = 32;   // its end was set by its input's tail

enum class Ev : std::uint8_t { StepEnd, FlowDrain, Head, Tail, Begin };

struct Event {
  double time;
  std::uint64_t seq;
  int a;                 // instance or flow id
  std::uint32_t packed;  // flow version << 3 | type
  Ev type() const { return static_cast<Ev>(packed & 7u); }
  std::uint32_t version() const { return packed >> 3; }
};

// Min-heap of events by (time, seq): keys are unique, so any correct heap pops them in one order. A flow has at
// most one drain event in it: a rate change replaces the old one in place (it would only have been popped and
// discarded as stale), which keeps the heap small when rates change often.
class EventHeap {
 public:
  bool empty() const { return h_.empty(); }
  const Event& top() const { return h_.front(); }
  void push(const Event& e) {
    h_.push_back(e);
    siftUp(h_.size() - 1, e);
  }
  // A drain event for `flow`; returns whether it replaced the flow's previous one.
  bool pushDrain(const Event& e, int flow) {
    if (static_cast<std::size_t>(flow) >= pos_.size()) pos_.resize(static_cast<std::size_t>(flow) + 1, kNone);
    const std::size_t i = pos_[flow];
    if (i == kNone) {
      push(e);
      return false;
    }
    update(i, e);
    return true;
  }
  // Drops `flow`'s drain event if it has one; returns whether it did.
  bool removeDrain(int flow) {
    if (static_cast<std::size_t>(flow) >= pos_.size() || pos_[flow] == kNone) return false;
    const std::size_t i = pos_[flow];
    pos_[flow] = kNone;
    const Event last = h_.back();
    h_.pop_back();
    if (i < h_.size()) update(i, last);
    return true;
  }
  Event pop() {
    const Event e = h_.front();
    if (e.type() == Ev::FlowDrain) pos_[e.a] = kNone;
    const Event last = h_.back();
    h_.pop_back();
    if (h_.empty()) return e;
    // Like std::pop_heap: the hole goes down to a leaf along the smaller children, then `last` rises from there
    // (one comparison per level on the way down; `last` is usually large and rises little).
    const std::size_t n = h_.size();
    std::size_t i = 0;
    for (std::size_t c = 1; c < n; c = 2 * i + 1) {
      if (c + 1 < n && less(h_[c + 1], h_[c])) ++c;
      place(i, h_[c]);
      i = c;
    }
    siftUp(i, last);
    return e;
  }

 private:
  static constexpr std::size_t kNone = ~std::size_t{0};
  static bool less(const Event& x, const Event& y) { return x.time < y.time || (x.time == y.time && x.seq < y.seq); }
  void place(std::size_t i, const Event& e) {
    h_[i] = e;
    if (e.type() == Ev::FlowDrain) pos_[e.a] = i;
  }
  void update(std::size_t i, const Event& e) {
    if (i > 0 && less(e, h_[(i - 1) / 2])) {
      siftUp(i, e);
    } else {
      siftDown(i, e);
    }
  }
  void siftUp(std::size_t i, const Event& e) {
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!less(e, h_[parent])) break;
      place(i, h_[parent]);
      i = parent;
    }
    place(i, e);
  }
  void siftDown(std::size_t i, const Event& e) {
    const std::size_t n = h_.size();
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && less(h_[c + 1], h_[c])) ++c;
      if (!less(h_[c], e)) break;
      place(i, h_[c]);
      i = c;
    }
    place(i, e);
  }
  std::vector<Event> h_;
  std::vector<std::size_t> pos_;  // per flow: index of its drain event in h_, or kNone
};

// How a chunk of `chunkBytes` is cut into loop iterations, and how many of them are simulated exactly.
struct Iterations {
  std::uint64_t count = 1;
  double chunkBytes = 0;  // per iteration
  int exact = 1;
};
Iterations iterationsOf(double chunkBytes, double iterationChunkBytes, int maxExactIterations,
                        std::uint64_t maxStepInstances, int nSteps) {
  Iterations it;
  const double iters = std::max(1.0, std::ceil(chunkBytes / iterationChunkBytes));
  it.count = static_cast<std::uint64_t>(std::min(iters, 9e15));
  it.chunkBytes = chunkBytes / static_cast<double>(it.count);
  std::uint64_t k = std::min<std::uint64_t>(it.count, static_cast<std::uint64_t>(std::max(1, maxExactIterations)));
  if (nSteps > 0) k = std::min<std::uint64_t>(k, std::max<std::uint64_t>(1, maxStepInstances / nSteps));
  k = std::min<std::uint64_t>(k, static_cast<std::uint64_t>(std::numeric_limits<int>::max()) /
                                     std::max<std::uint64_t>(1, static_cast<std::uint64_t>(nSteps)));
  it.exact = static_cast<int>(std::max<std::uint64_t>(1, k));
  return it;
}

// When data movement starts: the launch and the protocol's base latency.
double startUs(const SimParams& p, int proto) {
  return std::max(0.0, p.launchUs) + std::max(0.0, p.baseLatencyUs[proto]);
}

class Engine {
 public:
  // `sym`: nodeSymmetry(s, net), found once by the caller (simulate() may run several engines on one schedule).
  Engine(const core::Schedule& s, const Network& net, std::uint64_t size, const SimParams& p, NodeSymmetry sym)
      : s_(s), net_(net), size_(size), p_(p), sym_(sym), fold_(sym.fold) {}

  SimResult run();
  // The sums of lowerBoundUs per byte of an iteration's chunk, which do not depend on the size (boundCurve): per
  // block, its steps back to back at their own fastest (sync us, us per byte); the busiest link's wire bytes at its
  // effective capacity (us per byte per iteration). False for a malformed schedule.
  bool boundTerms(std::vector<std::pair<double, double>>& chains, double& linkUsPerByte);
  int steps() const { return nSteps_; }
  int protocol() const { return proto_; }

 private:
  std::string setUp();
  std::string prepare();
  void simulateExact();
  // events
  // Events at the current time go to a FIFO (they would pop after every heap event of this time anyway, having
  // larger sequence numbers), which keeps the heap small; the order is exactly that of one (time, seq) heap.
  void push(double t, Ev type, int a, std::uint32_t version = 0) {
    Event e{t, seq_++, a, (version << 3) | static_cast<std::uint32_t>(type)};
    // events_ counts every event pushed (each was popped once): a drain event dropped from the heap because a newer
    // one for its flow superseded it counts as processed, as it did when it stayed in the heap until it was stale.
    if (t == now_) {
      if (type == Ev::FlowDrain && q_.removeDrain(a)) ++events_;
      nowQ_.push_back(e);
    } else if (type == Ev::FlowDrain) {
      if (q_.pushDrain(e, a)) ++events_;
    } else {
      q_.push(e);
    }
  }
  void resolve(int inst, int cause, WaitKind kind);
  void start(int inst);
  void begin(int inst);
  void finishStep(int inst, double t, bool byInput, int inputInst);
  void onStepEnd(int inst);
  void onDrain(int flow);
  void onHead(int sendInst);
  void onTail(int sendInst);
  void inputTailArrived(int recvInst, int sendInst);
  // flows
  void startFlow(int inst);
  bool endInstant();
  // Pushes the drain events the flow model's last flush asked for, in its order.
  void scheduleDrains() {
    for (const Drain& d : flows_.drains()) push(d.time, Ev::FlowDrain, d.flow, d.version);
  }
  // A flow's top rate on connection `c`: the protocol's cap (if any) and every link's effective capacity.
  double maxFlowRate(int c) const {
    double mx = p_.flowCapGBps[proto_] > 0 ? p_.flowCapGBps[proto_] * 1e3 / eff_ : kInf;
    for (int l : connPath(c)) mx = std::min(mx, flows_.fullCapacity()[l]);
    return mx;
  }

  // Folding (docs/simulator.md "Symmetric schedules"): `rank` renumbered by the group element that takes `node` to
  // the simulated node standing for it (node % period).
  int fromNode(int node, int rank) const {
    const core::Topology& t = net_.topology();
    const int m = t.nodeOf(rank);
    const int shift = node - node % sym_.period;
    return t.rankOf(sym_.kind == NodeSymmetry::Kind::Xor ? m ^ shift : (m - shift + t.nodes) % t.nodes,
                    t.localOf(rank));
  }
  // The link a simulated flow shares for `l`: the same link of the simulated node standing for l's node.
  int foldedLink(int l) const {
    const int node = net_.linkNode(l);
    return node < 0 ? l : net_.linkAtNode(l, node % sym_.period);
  }
  void clearLayout() {
    blocks_.clear();
    steps_.clear();
    deps_.clear();
    conns_.clear();
    connPaths_.clear();
  }

  int instOf(int iter, int g) const { return iter * nSteps_ + g; }
  int stepOf(int inst) const { return inst % nSteps_; }
  int iterOf(int inst) const { return inst / nSteps_; }
  double dataBytes(int g) const { return steps_[g].count * iterChunk_; }
  std::span<const int> connPath(int c) const {
    return std::span<const int>(connPaths_).subspan(conns_[c].pathStart, conns_[c].pathLen);
  }

  const core::Schedule& s_;
  const Network& net_;
  std::uint64_t size_;
  const SimParams& p_;
  NodeSymmetry sym_;
  int fold_ = 1;             // nodes each simulated node stands for (1: every rank is simulated)
  bool mayStop_ = false;     // SimParams::stopAtUs applies to this run (setUp)
  bool stopped_ = false;     // a step ended after it
  bool timedOut_ = false;    // SimParams::deadline passed
  bool unfoldable_ = false;  // a folded path crosses one link twice: simulate every rank instead
  int proto_ = 0;
  double eff_ = 1;
  double slice_ = 0;

  std::vector<BlockInfo> blocks_;
  std::vector<StepInfo> steps_;
  std::vector<int> deps_;               // global step ids
  std::vector<int> revStart_, revIds_;  // dependents of each step (CSR)
  std::vector<Conn> conns_;
  std::vector<int> connPaths_;
  std::vector<double> stepSync_;  // per step: SimParams::stepSyncUs of its hop class (0 for local steps)
  int nSteps_ = 0;

  // sizes
  double chunkBytes_ = 0;
  double iterChunk_ = 0;
  std::uint64_t iterations_ = 1;
  int exactIters_ = 1;
  double t0_ = 0;

  // instances
  std::vector<double> start_, end_, tail_;
  std::vector<int> pending_, cause_;
  std::vector<std::uint8_t> flags_, waitKind_;
  std::vector<int> flowOf_;      // per instance: active flow id (-1)
  std::vector<int> startedNow_;  // instances whose flow started in this instant, in order

  FlowModel flows_;

  EventHeap q_;
  std::vector<Event> nowQ_;  // FIFO of events at now_
  std::size_t nowHead_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t events_ = 0;
  double now_ = 0;
};

std::string Engine::prepare() {
  const int n = s_.nRanks;
  if (n != net_.nRanks()) {
    return fmt::format("schedule '{}' has {} ranks but topology '{}' has {}", s_.name, n, net_.topology().name,
                       net_.nRanks());
  }
  if (static_cast<int>(s_.ranks.size()) != n) {
    return fmt::format("schedule '{}' declares {} ranks but has {} rank programs", s_.name, n, s_.ranks.size());
  }
  if (s_.chunksPerLoop <= 0) return fmt::format("chunksPerLoop must be positive, got {}", s_.chunksPerLoop);
  // Folded, only the ranks of nodes 0 .. period-1 are laid out; every other rank runs the same program (nodeSymmetry
  // checked it).
  const int simulated = fold_ > 1 ? sym_.period * net_.topology().gpusPerNode : n;

  // Blocks and steps.
  std::uint64_t total = 0;
  for (int r = 0; r < simulated; ++r) {
    for (const auto& tb : s_.ranks[r].threadBlocks) total += tb.steps.size();
  }
  if (total > static_cast<std::uint64_t>(std::numeric_limits<int>::max() / 2) || total > p_.maxStepInstances) {
    return fmt::format("schedule has {} steps, above the simulator's limit of {} (SimParams::maxStepInstances)", total,
                       p_.maxStepInstances);
  }
  nSteps_ = static_cast<int>(total);
  steps_.resize(total);
  std::vector<std::vector<int>> rankBlocks(simulated);  // global block indices per rank
  for (int r = 0; r < simulated; ++r) {
    const auto& rp = s_.ranks[r];
    for (int b = 0; b < static_cast<int>(rp.threadBlocks.size()); ++b) {
      const auto& tb = rp.threadBlocks[b];
      auto where = [&] { return fmt::format("rank {} tb {}", r, tb.id); };
      if (tb.sendPeer != -1 && (tb.sendPeer < 0 || tb.sendPeer >= n || tb.sendPeer == r)) {
        return fmt::format("{}: send peer {} is not another rank in [0, {})", where(), tb.sendPeer, n);
      }
      if (tb.recvPeer != -1 && (tb.recvPeer < 0 || tb.recvPeer >= n || tb.recvPeer == r)) {
        return fmt::format("{}: receive peer {} is not another rank in [0, {})", where(), tb.recvPeer, n);
      }
      if (tb.channel < 0 || tb.channel >= (1 << 20))
        return fmt::format("{}: channel {} out of range", where(), tb.channel);
      for (int b2 = 0; b2 < b; ++b2) {
        if (rp.threadBlocks[b2].id == tb.id) return fmt::format("rank {}: two thread blocks with id {}", r, tb.id);
      }
      BlockInfo bi;
      bi.rank = r;
      bi.tbId = tb.id;
      bi.first = blocks_.empty() ? 0 : blocks_.back().first + blocks_.back().n;
      bi.n = static_cast<int>(tb.steps.size());
      rankBlocks[r].push_back(static_cast<int>(blocks_.size()));
      blocks_.push_back(bi);
    }
  }
  // Steps, dependencies.
  for (int gb = 0; gb < static_cast<int>(blocks_.size()); ++gb) {
    const auto& bi = blocks_[gb];
    const auto& rp = s_.ranks[bi.rank];
    const auto& tb = rp.threadBlocks[gb - rankBlocks[bi.rank].front()];
    for (int i = 0; i < bi.n; ++i) {
      const auto& st = tb.steps[i];
      auto& si = steps_[bi.first + i];
      si.block = gb;
      si.op = st.op;
      si.count = st.count;
      auto where = [&] { return fmt::format("rank {} tb {} step {}", bi.rank, tb.id, i); };
      if (static_cast<int>(st.op) > static_cast<int>(StepOp::Nop)) return fmt::format("{}: unknown op", where());
      if (st.op != StepOp::Nop && st.count <= 0) return fmt::format("{}: count {} must be positive", where(), st.count);
      if (sends(st.op) && tb.sendPeer < 0) return fmt::format("{}: sends but the block has no send peer", where());
      if (receives(st.op) && tb.recvPeer < 0) {
        return fmt::format("{}: receives but the block has no receive peer", where());
      }
      si.depStart = static_cast<int>(deps_.size());
      for (const auto& d : st.deps) {
        int tbi = core::findThreadBlock(rp, d.tb);
        if (tbi < 0) return fmt::format("{}: depends on thread block {} which does not exist", where(), d.tb);
        const auto& dtb = rp.threadBlocks[tbi];
        if (d.step < 0 || d.step >= static_cast<int>(dtb.steps.size())) {
          return fmt::format("{}: depends on step {} of tb {}, which has {} steps", where(), d.step, d.tb,
                             dtb.steps.size());
        }
        deps_.push_back(blocks_[rankBlocks[bi.rank][tbi]].first + d.step);
      }
      si.nDeps = static_cast<int>(deps_.size()) - si.depStart;
    }
  }
  revStart_.assign(nSteps_ + 1, 0);
  for (int d : deps_) ++revStart_[d + 1];
  for (int g = 0; g < nSteps_; ++g) revStart_[g + 1] += revStart_[g];
  revIds_.resize(deps_.size());
  {
    std::vector<int> pos(revStart_.begin(), revStart_.end() - 1);
    for (int g = 0; g < nSteps_; ++g) {
      for (int k = 0; k < steps_[g].nDeps; ++k) revIds_[pos[deps_[steps_[g].depStart + k]]++] = g;
    }
  }

  // Connections: (sender, receiver, channel); the k-th send pairs with the k-th receive.
  std::unordered_map<std::uint64_t, std::pair<int, int>> connBlocks;  // key -> (sending block, receiving block)
  auto key = [](int a, int b, int ch) {
    return (static_cast<std::uint64_t>(a) << 42) | (static_cast<std::uint64_t>(b) << 21) |
           static_cast<std::uint64_t>(ch);
  };
  std::vector<std::uint64_t> keyOrder;
  for (int gb = 0; gb < static_cast<int>(blocks_.size()); ++gb) {
    const auto& bi = blocks_[gb];
    const auto& tb = s_.ranks[bi.rank].threadBlocks[gb - rankBlocks[bi.rank].front()];
    bool anySend = false, anyRecv = false;
    for (int i = 0; i < bi.n; ++i) {
      anySend = anySend || sends(steps_[bi.first + i].op);
      anyRecv = anyRecv || receives(steps_[bi.first + i].op);
    }
    if (anySend) {
      auto k = key(bi.rank, tb.sendPeer, tb.channel);
      auto [it, fresh] = connBlocks.try_emplace(k, -1, -1);
      if (fresh) keyOrder.push_back(k);
      if (it->second.first >= 0) {
        return fmt::format("rank {}: thread blocks {} and {} both send to rank {} on channel {}", bi.rank,
                           blocks_[it->second.first].tbId, tb.id, tb.sendPeer, tb.channel);
      }
      it->second.first = gb;
    }
    if (anyRecv) {
      // Folded, a connection is known by its image whose sender is on node 0.
      auto k = fold_ > 1 ? key(fromNode(net_.topology().nodeOf(tb.recvPeer), tb.recvPeer),
                               fromNode(net_.topology().nodeOf(tb.recvPeer), bi.rank), tb.channel)
                         : key(tb.recvPeer, bi.rank, tb.channel);
      auto [it, fresh] = connBlocks.try_emplace(k, -1, -1);
      if (fresh) keyOrder.push_back(k);
      if (it->second.second >= 0) {
        return fmt::format("rank {}: thread blocks {} and {} both receive from rank {} on channel {}", bi.rank,
                           blocks_[it->second.second].tbId, tb.id, tb.recvPeer, tb.channel);
      }
      it->second.second = gb;
    }
  }
  std::vector<int> sendList, recvList;
  for (auto k : keyOrder) {
    const auto [sb, rb] = connBlocks[k];
    const int src = static_cast<int>(k >> 42);
    const int dst = static_cast<int>((k >> 21) & ((1u << 21) - 1));
    const int ch = static_cast<int>(k & ((1u << 21) - 1));
    sendList.clear();
    recvList.clear();
    if (sb >= 0) {
      for (int i = 0; i < blocks_[sb].n; ++i) {
        if (sends(steps_[blocks_[sb].first + i].op)) sendList.push_back(blocks_[sb].first + i);
      }
    }
    if (rb >= 0) {
      for (int i = 0; i < blocks_[rb].n; ++i) {
        if (receives(steps_[blocks_[rb].first + i].op)) recvList.push_back(blocks_[rb].first + i);
      }
    }
    if (sendList.size() != recvList.size()) {
      return fmt::format("connection {} -> {} on channel {}: {} sends but {} receives", src, dst, ch, sendList.size(),
                         recvList.size());
    }
    Conn c;
    c.src = src;
    c.dst = dst;
    Path path = net_.path(src, dst);
    if (path.empty()) return fmt::format("no network path from rank {} to rank {}", src, dst);
    c.pathStart = static_cast<int>(connPaths_.size());
    c.pathLen = static_cast<int>(path.size());
    double lat = 0;
    int cls = 0;
    for (int l : path) {
      // Folded, a flow shares the links of node 0 (and the shared ones) with the images of every other flow.
      const int at = fold_ > 1 ? foldedLink(l) : l;
      for (int i = c.pathStart; fold_ > 1 && i < static_cast<int>(connPaths_.size()); ++i) {
        if (connPaths_[static_cast<std::size_t>(i)] == at) unfoldable_ = true;
      }
      connPaths_.push_back(at);
      lat += net_.link(l).latencyUs;
      cls = std::max(cls, static_cast<int>(hopClassOf(net_.link(l).kind)));
    }
    if (unfoldable_) return "unfoldable";
    c.cls = cls;
    c.hopUs = std::max(lat, p_.hopLatencyUs[cls][proto_]);
    if (cls == static_cast<int>(HopClass::Net)) {
      c.hopUs += p_.netOverheadUs * (proto_ == protocolIndex(core::Protocol::Simple) ? p_.netOverheadSimpleFactor : 1);
    }
    const int ci = static_cast<int>(conns_.size());
    conns_.push_back(c);
    for (std::size_t k2 = 0; k2 < sendList.size(); ++k2) {
      auto& ss = steps_[sendList[k2]];
      auto& rs = steps_[recvList[k2]];
      if (ss.count != rs.count) {
        return fmt::format("connection {} -> {} on channel {}: message {} is {} chunks sent but {} received", src, dst,
                           ch, k2, ss.count, rs.count);
      }
      ss.sendTo = recvList[k2];
      ss.conn = ci;
      rs.recvFrom = sendList[k2];
    }
  }
  // Per-step synchronisation: the worst hop class among the step's outgoing and incoming connections.
  stepSync_.assign(steps_.size(), 0.0);
  for (int g = 0; g < nSteps_; ++g) {
    const auto& si = steps_[g];
    int cls = -1;
    if (si.conn >= 0) cls = conns_[si.conn].cls;
    if (si.recvFrom >= 0 && steps_[si.recvFrom].conn >= 0) cls = std::max(cls, conns_[steps_[si.recvFrom].conn].cls);
    if (cls >= 0) stepSync_[g] = std::max(0.0, p_.stepSyncUs[cls][proto_]);
  }
  return {};
}

void Engine::startFlow(int inst) {
  const int g = stepOf(inst);
  const auto& si = steps_[g];
  const Conn& c = conns_[si.conn];
  const double wire = dataBytes(g) / eff_;
  const int f = flows_.start(inst, c.pathStart, c.pathLen, wire, maxFlowRate(si.conn), now_);
  flowOf_[inst] = f;
  if (flows_.drainsNow(f)) {
    push(now_, Ev::FlowDrain, f, flows_.version(f));
    push(now_ + c.hopUs, Ev::Head, inst);
    return;
  }
  startedNow_.push_back(inst);  // its head is scheduled once the instant's rates are known (endInstant)
}

// Every event of this instant has run: the flow model sets the rates its starts and finishes changed, once, and the
// heads of the flows started now go out at their starting rate: the hop latency plus one slice (cut-through at
// slice granularity). Returns false when there was nothing to do.
bool Engine::endInstant() {
  if (!flows_.dirty() && startedNow_.empty()) return false;
  flows_.flush(now_);
  scheduleDrains();
  for (int inst : startedNow_) {
    const int g = stepOf(inst);
    const double firstSlice = std::min(dataBytes(g), slice_) / eff_;
    push(now_ + conns_[steps_[g].conn].hopUs + firstSlice / flows_.rate(flowOf_[inst]), Ev::Head, inst);
  }
  startedNow_.clear();
  return true;
}

void Engine::onDrain(int f) {
  const int inst = flows_.instOf(f);
  flows_.finish(f, now_);
  flowOf_[inst] = -1;
  const int g = stepOf(inst);
  push(now_ + conns_[steps_[g].conn].hopUs, Ev::Tail, inst);
  flags_[inst] |= kDrained;
  end_[inst] = now_;  // drain time until the step really ends
  const StepOp op = steps_[g].op;
  if (!receives(op)) {
    finishStep(inst, now_, false, -1);
    return;
  }
  const int in = instOf(iterOf(inst), steps_[g].recvFrom);
  if (flags_[in] & kTailArrived) {
    const double lag = (now_ - start_[inst]) * std::min(1.0, dataBytes(g) > 0 ? slice_ / dataBytes(g) : 1.0);
    const double t = tail_[in] + lag;
    if (t > now_) {
      finishStep(inst, t, true, in);
    } else {
      finishStep(inst, now_, false, -1);
    }
  }
}

void Engine::finishStep(int inst, double t, bool byInput, int inputInst) {
  end_[inst] = t;
  if (byInput) {
    flags_[inst] |= kEndByInput;
    cause_[inst] = inputInst;  // the critical path follows the input from here
    waitKind_[inst] = static_cast<std::uint8_t>(WaitKind::DataTail);
  }
  push(t, Ev::StepEnd, inst);
}

void Engine::onHead(int sendInst) {
  if (flags_[sendInst] & kHeadSent) return;
  flags_[sendInst] |= kHeadSent;
  const int recv = instOf(iterOf(sendInst), steps_[stepOf(sendInst)].sendTo);
  resolve(recv, sendInst, WaitKind::DataHead);
}

void Engine::onTail(int sendInst) {
  onHead(sendInst);  // a head never arrives after its tail
  flags_[sendInst] |= kTailArrived;
  tail_[sendInst] = now_;
  const int recv = instOf(iterOf(sendInst), steps_[stepOf(sendInst)].sendTo);
  if (flags_[recv] & kStarted) inputTailArrived(recv, sendInst);
}

// The input of a started receiving step has fully arrived (now).
void Engine::inputTailArrived(int recv, int sendInst) {
  const int g = stepOf(recv);
  const StepOp op = steps_[g].op;
  if (flags_[recv] & kDone) return;
  if (!sends(op)) {
    finishStep(recv, now_, true, sendInst);
    return;
  }
  if (flags_[recv] & kDrained) {
    const double lag = (end_[recv] - start_[recv]) * std::min(1.0, dataBytes(g) > 0 ? slice_ / dataBytes(g) : 1.0);
    finishStep(recv, now_ + lag, true, sendInst);
  }
}

void Engine::resolve(int inst, int cause, WaitKind kind) {
  if (--pending_[inst] > 0) return;
  cause_[inst] = cause;
  waitKind_[inst] = static_cast<std::uint8_t>(kind);
  start(inst);
}

// A step whose prerequisites are met: communicating steps first pay their per-step synchronisation.
void Engine::start(int inst) {
  const double sync = stepSync_[stepOf(inst)];
  if (sync > 0) {
    push(now_ + sync, Ev::Begin, inst);
    return;
  }
  begin(inst);
}

void Engine::begin(int inst) {
  flags_[inst] |= kStarted;
  start_[inst] = now_;
  const int g = stepOf(inst);
  const StepOp op = steps_[g].op;
  if (op == StepOp::Nop) {
    finishStep(inst, now_, false, -1);
    return;
  }
  if (isLocal(op)) {
    const double rate = p_.localCopyGBps > 0 ? p_.localCopyGBps * 1e3 : kInf;
    finishStep(inst, now_ + dataBytes(g) / rate, false, -1);
    return;
  }
  if (sends(op)) {
    startFlow(inst);  // receiving-and-forwarding ops also wait for their input's tail (onDrain)
    return;
  }
  // Pure receives end when the input's tail has arrived.
  const int in = instOf(iterOf(inst), steps_[g].recvFrom);
  if (flags_[in] & kTailArrived) finishStep(inst, now_, false, -1);
}

void Engine::onStepEnd(int inst) {
  flags_[inst] |= kDone;
  const int it = iterOf(inst);
  const int g = stepOf(inst);
  const auto& bi = blocks_[steps_[g].block];
  if (g + 1 < bi.first + bi.n) {
    resolve(instOf(it, g + 1), inst, WaitKind::BlockOrder);
  } else if (it + 1 < exactIters_ && bi.n > 0) {
    resolve(instOf(it + 1, bi.first), inst, WaitKind::BlockOrder);
  }
  for (int k = revStart_[g]; k < revStart_[g + 1]; ++k) resolve(instOf(it, revIds_[k]), inst, WaitKind::Dependency);
}

void Engine::simulateExact() {
  const std::size_t ni = static_cast<std::size_t>(nSteps_) * exactIters_;
  start_.assign(ni, 0);
  end_.assign(ni, 0);
  tail_.assign(ni, 0);
  pending_.assign(ni, 0);
  cause_.assign(ni, -1);
  flags_.assign(ni, 0);
  waitKind_.assign(ni, 0);
  flowOf_.assign(ni, -1);
  startedNow_.clear();
  for (int it = 0; it < exactIters_; ++it) {
    for (int g = 0; g < nSteps_; ++g) {
      const auto& si = steps_[g];
      int p = si.nDeps + (receives(si.op) ? 1 : 0);
      if (g != blocks_[si.block].first || it > 0) ++p;
      pending_[instOf(it, g)] = p;
    }
  }
  now_ = t0_;
  for (int g = 0; g < nSteps_; ++g) {
    if (pending_[g] == 0) start(g);
  }
  std::uint32_t sinceClock = 0;  // events since the deadline was last read
  if (p_.deadline && std::chrono::steady_clock::now() > *p_.deadline) {
    timedOut_ = true;
    return;
  }
  for (;;) {
    Event e;
    if (!q_.empty() && q_.top().time == now_) {
      e = q_.pop();
    } else if (nowHead_ < nowQ_.size()) {
      e = nowQ_[nowHead_++];
      if (nowHead_ == nowQ_.size()) {
        nowQ_.clear();
        nowHead_ = 0;
      }
    } else if (endInstant()) {
      continue;  // it may have scheduled events at this instant
    } else if (!q_.empty()) {
      e = q_.pop();
      now_ = e.time;
    } else {
      break;
    }
    ++events_;
    if (p_.deadline && (++sinceClock & 4095) == 0 && std::chrono::steady_clock::now() > *p_.deadline) {
      timedOut_ = true;
      return;
    }
    switch (e.type()) {
      case Ev::StepEnd:
        onStepEnd(e.a);
        // A step's end is never after the makespan (unlike a superseded head or drain event's time).
        if (mayStop_ && now_ > p_.stopAtUs) {
          stopped_ = true;
          return;
        }
        break;
      case Ev::FlowDrain:
        if (flows_.current(e.a, e.version())) onDrain(e.a);
        break;
      case Ev::Head:
        onHead(e.a);
        break;
      case Ev::Tail:
        onTail(e.a);
        break;
      case Ev::Begin:
        begin(e.a);
        break;
    }
  }
}

std::string Engine::setUp() {
  const core::Protocol proto = p_.protocol.value_or(s_.protocol);
  proto_ = protocolIndex(proto);
  if (proto_ < 0 || proto_ > 2) return "unknown protocol";
  eff_ = p_.protocolEfficiency[proto_];
  if (!(eff_ > 0 && eff_ <= 1)) return "SimParams::protocolEfficiency must be in (0, 1]";
  for (double e : p_.linkEfficiency) {
    if (!(e > 0)) return "SimParams::linkEfficiency must be positive";
  }
  if (!(p_.iterationChunkBytes[proto_] > 0)) return "SimParams::iterationChunkBytes must be positive";
  slice_ = std::max(0.0, p_.sliceBytes[proto_]);
  std::string err = prepare();
  if (unfoldable_) {
    clearLayout();
    unfoldable_ = false;
    sym_ = NodeSymmetry{};
    fold_ = 1;
    err = prepare();
  }
  if (!err.empty()) return err;

  chunkBytes_ = static_cast<double>(size_) / s_.chunksPerLoop;
  const Iterations it =
      iterationsOf(chunkBytes_, p_.iterationChunkBytes[proto_], p_.maxExactIterations, p_.maxStepInstances, nSteps_);
  iterations_ = it.count;
  iterChunk_ = it.chunkBytes;
  exactIters_ = it.exact;
  t0_ = startUs(p_, proto_);
  // Only where no exact iteration is extrapolated, or simulate() will not run again with more of them: an
  // extrapolated time is never below the makespan, but a run that is not yet steady is replaced by the next.
  mayStop_ =
      p_.stopAtUs > 0 && (iterations_ <= static_cast<std::uint64_t>(exactIters_) ||
                          exactIters_ < p_.maxExactIterations || p_.maxExactIterations >= kMaxAdaptiveIterations);

  if (fold_ > 1) {
    // A link all nodes share carries every node's image of each flow on it.
    std::vector<double> share(net_.links().size(), 1.0);
    for (std::size_t l = 0; l < share.size(); ++l) {
      if (net_.linkNode(static_cast<int>(l)) < 0) share[l] = 1.0 / fold_;
    }
    flows_.init(net_, p_, connPaths_, &share);
  } else {
    flows_.init(net_, p_, connPaths_);
  }
  return {};
}

SimResult Engine::run() {
  if (std::string err = setUp(); !err.empty()) return failure(std::move(err), size_);
  simulateExact();
  if (timedOut_) {
    SimResult r = failure("the time budget ran out during the simulation", size_);
    r.timedOut = true;
    return r;
  }

  SimResult r;
  r.sizeBytes = size_;
  r.protocol = p_.protocol.value_or(s_.protocol);
  r.chunkBytes = chunkBytes_;
  r.iterations = iterations_;
  r.simulatedIterations = exactIters_;
  r.extrapolated = iterations_ > static_cast<std::uint64_t>(exactIters_);
  r.startUs = t0_;
  r.events = events_;
  r.steps = static_cast<std::uint64_t>(nSteps_) * exactIters_;
  r.symmetry = sym_;
  if (stopped_) {
    r.ok = true;
    r.cutOff = true;
    r.timeUs = now_;
    return r;
  }

  // Deadlock: steps that never completed.
  const std::size_t ni = static_cast<std::size_t>(nSteps_) * exactIters_;
  std::size_t stuck = 0;
  std::size_t firstStuck = ni;
  for (std::size_t i = 0; i < ni; ++i) {
    if (!(flags_[i] & kDone)) {
      if (firstStuck == ni) firstStuck = i;
      ++stuck;
    }
  }
  if (stuck > 0) {
    const int g = stepOf(static_cast<int>(firstStuck));
    const auto& bi = blocks_[steps_[g].block];
    return failure(fmt::format("deadlock: {} of {} steps never completed; the first is rank {} tb {} step {} ({}), "
                               "iteration {}, waiting on {} unresolved prerequisite(s)",
                               stuck, ni, bi.rank, bi.tbId, g - bi.first, core::toString(steps_[g].op),
                               static_cast<int>(firstStuck) / nSteps_, pending_[firstStuck]),
                   size_);
  }

  // Per-iteration finish times, extrapolation.
  std::vector<double> iterEnd(exactIters_, t0_);
  int lastInst = -1;
  double makespan = t0_;
  for (std::size_t i = 0; i < ni; ++i) {
    const int it = static_cast<int>(i) / nSteps_;
    iterEnd[it] = std::max(iterEnd[it], end_[i]);
    if (end_[i] > makespan || (end_[i] == makespan && lastInst < 0)) {
      makespan = end_[i];
      lastInst = static_cast<int>(i);
    }
  }
  double total = makespan;
  if (r.extrapolated) {
    const double delta = exactIters_ >= 2 ? iterEnd[exactIters_ - 1] - iterEnd[exactIters_ - 2] : iterEnd[0] - t0_;
    if (exactIters_ >= 3) {
      const double before = iterEnd[exactIters_ - 2] - iterEnd[exactIters_ - 3];
      r.steady = std::abs(delta - before) <= 0.01 * std::max(delta, before);
    } else {
      r.steady = false;
    }
    total = makespan + static_cast<double>(iterations_ - static_cast<std::uint64_t>(exactIters_)) * delta;
  }
  const std::vector<double>& cap = flows_.capacity();
  const std::vector<double>& linkBytes = flows_.linkBytes();
  const std::vector<double>& busyUs = flows_.busyUs();
  // No link can carry its bytes faster than its capacity: an extrapolation that has not reached the steady state
  // must never report less (this also keeps every result at or above the cut bounds, which use raw bandwidths).
  {
    const double scaleAll = static_cast<double>(iterations_) / exactIters_;
    double floor = t0_;
    for (std::size_t l = 0; l < cap.size(); ++l) {
      if (cap[l] > 0) floor = std::max(floor, t0_ + linkBytes[l] * scaleAll / cap[l]);
    }
    total = std::max(total, floor);
  }
  r.timeUs = total;
  r.algbwGBps = core::gbps(static_cast<double>(size_), r.timeUs);
  r.busbwGBps = r.algbwGBps * core::busBandwidthFactor(s_.collective, s_.nRanks);

  // Links. Folded, every node's link saw what node 0's did, and a shared link every node's images of its flows.
  const double scale = static_cast<double>(iterations_) / exactIters_;
  const double exactSpan = makespan - t0_;
  const double fullSpan = total - t0_;
  const std::vector<double>& fullCap = flows_.fullCapacity();
  r.links.resize(cap.size());
  double bestU = -1;
  for (std::size_t l = 0; l < cap.size(); ++l) {
    auto& u = r.links[l];
    const int at = fold_ > 1 ? foldedLink(static_cast<int>(l)) : static_cast<int>(l);
    const double images = fold_ > 1 && net_.linkNode(at) < 0 ? fold_ : 1;
    u.bytes = linkBytes[at] * scale * images;
    u.busyUs = busyUs[at];
    u.busyFraction = exactSpan > 0 ? busyUs[at] / exactSpan : 0;
    u.utilisation = fullSpan > 0 && fullCap[l] > 0 ? u.bytes / (fullCap[l] * fullSpan) : 0;
    if (u.bytes > 0) {
      const bool better =
          u.utilisation > bestU || (u.utilisation == bestU && u.bytes > r.links[r.bottleneckLink].bytes);
      if (better) {
        bestU = u.utilisation;
        r.bottleneckLink = static_cast<int>(l);
      }
    }
  }

  // Critical path: from the last step to finish back along what each waited on.
  std::vector<CriticalStep> path;
  for (int i = lastInst; i >= 0 && path.size() < p_.maxCriticalPath;) {
    const int g = stepOf(i);
    const auto& bi = blocks_[steps_[g].block];
    const auto& tb = s_.ranks[bi.rank].threadBlocks;
    CriticalStep c;
    c.rank = bi.rank;
    c.tb = bi.tbId;
    c.step = g - bi.first;
    c.iteration = iterOf(i);
    c.op = steps_[g].op;
    int tbIndex = core::findThreadBlock(s_.ranks[bi.rank], bi.tbId);
    if (sends(c.op)) {
      c.peer = tb[tbIndex].sendPeer;
    } else if (receives(c.op)) {
      c.peer = tb[tbIndex].recvPeer;
    }
    c.startUs = start_[i];
    c.endUs = end_[i];
    c.waitedOn = static_cast<WaitKind>(waitKind_[i]);
    path.push_back(c);
    i = cause_[i];
  }
  std::reverse(path.begin(), path.end());
  r.criticalPath = std::move(path);
  r.ok = true;
  return r;
}

bool Engine::boundTerms(std::vector<std::pair<double, double>>& chains, double& linkUsPerByte) {
  if (!setUp().empty()) return false;
  const std::vector<double>& cap = flows_.capacity();
  std::vector<double> perByte(cap.size(), 0.0);  // wire bytes per byte of an iteration's chunk
  chains.clear();
  for (const BlockInfo& bi : blocks_) {
    double sync = 0;
    double usPerByte = 0;
    for (int g = bi.first; g < bi.first + bi.n; ++g) {
      const StepInfo& si = steps_[g];
      if (si.op == StepOp::Nop) continue;
      sync += stepSync_[g];
      if (isLocal(si.op)) {
        if (p_.localCopyGBps > 0) usPerByte += si.count / (p_.localCopyGBps * 1e3);
      } else if (sends(si.op) && si.conn >= 0) {
        const double wire = si.count / eff_;
        const double mx = maxFlowRate(si.conn);
        for (int l : connPath(si.conn)) perByte[l] += wire;
        if (mx < kInf) usPerByte += wire / mx;
      }
    }
    chains.emplace_back(sync, usPerByte);
  }
  linkUsPerByte = 0;
  for (std::size_t l = 0; l < cap.size(); ++l) {
    if (cap[l] > 0) linkUsPerByte = std::max(linkUsPerByte, perByte[l] / cap[l]);
  }
  return true;
}

}  // namespace

namespace {

NodeSymmetry foldingOf(const core::Schedule& schedule, const Network& network, const SimParams& params) {
  return params.foldSymmetricNodes ? nodeSymmetry(schedule, network) : NodeSymmetry{};
}

}  // namespace

SimResult simulate(const core::Schedule& schedule, const Network& network, std::uint64_t sizeBytes,
                   const SimParams& params) {
  try {
    // Extrapolation from the exactly simulated iterations is only sound once they take equal time; pipelines
    // such as trees and chains take longer to settle, so simulate more of them until they do.
    SimParams p = params;
    const NodeSymmetry sym = foldingOf(schedule, network, p);
    SimResult r = Engine(schedule, network, sizeBytes, p, sym).run();
    while (r.ok && !r.cutOff && r.extrapolated && !r.steady && r.simulatedIterations == p.maxExactIterations &&
           p.maxExactIterations < kMaxAdaptiveIterations) {
      p.maxExactIterations = std::min(kMaxAdaptiveIterations, p.maxExactIterations * 2);
      r = Engine(schedule, network, sizeBytes, p, sym).run();
    }
    return r;
  } catch (const std::bad_alloc&) {
    return failure("out of memory while simulating", sizeBytes);
  } catch (const std::exception& ex) {
    return failure(fmt::format("internal error: {}", ex.what()), sizeBytes);
  }
}

double lowerBoundUs(const core::Schedule& schedule, const Network& network, std::uint64_t sizeBytes,
                    const SimParams& params) {
  return boundCurve(schedule, network, params).at(sizeBytes);
}

BoundCurve boundCurve(const core::Schedule& schedule, const Network& network, const SimParams& params) {
  BoundCurve c;
  try {
    // The size only sets the iterations, which the terms are per: any size reads the same steps.
    Engine e(schedule, network, 1, params, foldingOf(schedule, network, params));
    std::vector<std::pair<double, double>> chains;
    if (!e.boundTerms(chains, c.linkUsPerByte_)) return c;
    // Only the upper envelope of the blocks' lines can be the slowest block at some size.
    std::sort(chains.begin(), chains.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second > b.second;
    });
    for (const auto& [sync, perByte] : chains) {
      if (c.chains_.empty() || perByte > c.chains_.back().usPerByte) c.chains_.push_back({sync, perByte});
    }
    c.t0Us_ = startUs(params, e.protocol());
    c.chunksPerLoop_ = schedule.chunksPerLoop;
    c.iterationChunkBytes_ = params.iterationChunkBytes[e.protocol()];
    c.maxExactIterations_ = params.maxExactIterations;
    c.maxStepInstances_ = params.maxStepInstances;
    c.steps_ = e.steps();
    c.ok_ = true;
  } catch (const std::exception&) {
    c = BoundCurve{};
  }
  return c;
}

double BoundCurve::at(std::uint64_t sizeBytes) const {
  if (!ok_) return 0;
  const Iterations it = iterationsOf(static_cast<double>(sizeBytes) / chunksPerLoop_, iterationChunkBytes_,
                                     maxExactIterations_, maxStepInstances_, steps_);
  double chain = 0;
  for (const Chain& c : chains_) chain = std::max(chain, c.syncUs + c.usPerByte * it.chunkBytes);
  const double link = linkUsPerByte_ * it.chunkBytes * static_cast<double>(it.count);
  return t0Us_ + std::max(chain * it.exact, link);
}

SimResult simulate(const core::Schedule& schedule, const core::Topology& topology, std::uint64_t sizeBytes,
                   const SimParams& params) {
  auto net = Network::build(topology);
  if (!net) return failure(net.error().message, sizeBytes);
  return simulate(schedule, *net, sizeBytes, params);
}

}  // namespace optiflow::sim
