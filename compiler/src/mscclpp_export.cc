#include "optiflow/compiler/mscclpp_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/compiler/verifier.h"

namespace optiflow::compiler::mscclpp {

namespace {

using core::BufferKind;
using core::Schedule;
using core::Step;
using core::StepOp;

constexpr int kPayloadPerSplitBlock = kMaxOperationsPerThreadBlock - 4;  // room for acquire+nop and nop+release

struct Conn {
  int sender = 0;
  int receiver = 0;
  int channel = 0;
  int senderTb = -1;    // block index on the sender
  int receiverTb = -1;  // block index on the receiver
  ChannelType type = ChannelType::Memory;
  int senderChannel = -1;    // GPU-level channel index of the type on the sender
  int receiverChannel = -1;  // ... on the receiver
  int remoteBuffer = -1;     // the sender's remote buffer: the receiver's scratch
};

struct Pairing {
  int conn = -1;
  int k = 0;
};

BufferRef localRef(BufferKind b, int index, int size) { return BufferRef{BufferRef::Kind::Local, b, 0, index, size}; }
BufferRef remoteRef(int gpuRemoteBuffer, int index, int size) {
  return BufferRef{BufferRef::Kind::Remote, BufferKind::Input, gpuRemoteBuffer, index, size};  // buffer: unused
}

// The operations of one MSCCL++ block before channel and buffer ids are made block-local: channel ids and remote
// buffer ids hold GPU-level indexes until materialize() maps them. A `nop` (__syncthreads) goes in only where the
// executor needs one: before a data operation that touches what an earlier one since the last nop wrote (or writes
// what it read), before a data operation after a wait, and before a signal that must cover earlier data operations.
// Consecutive waits (or signals) on channels of one type become one operation (up to 8 channels).
class BlockBuilder {
 public:
  using Resolve = std::function<int(BufferKind, int)>;  // (buffer, chunk) -> physical chunk id on this rank
  explicit BlockBuilder(Resolve resolve) : resolve_(std::move(resolve)) {}

  // The signal that follows a put: held back while more puts (or fused reduce-and-puts) follow, so that a run of
  // sends costs one nop and one signal over all their channels. It goes out before anything else, a wait above all
  // (holding it past a wait could deadlock).
  void signalLater(Op op) { pending_.push_back(std::move(op)); }
  void flush() {
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& p : pending) emitNow(std::move(p));
  }
  void release() {
    auto held = std::move(held_);
    held_.clear();
    for (auto& h : held) emitNow(std::move(h));
  }

  // The local consumption of a received chunk (copy or reduce out of its slot): held back while more waits
  // follow, so that a run of receives costs one wait over all their channels and one nop. Moving a wait ahead of
  // a copy or reduce never delays a signal, so it cannot deadlock.
  void consumeLater(Op op) { held_.push_back(std::move(op)); }

  void emit(Op op) {
    const bool batchable = op.type == OpType::Put || op.type == OpType::ReduceSend;
    if (!held_.empty() && op.type != OpType::Wait) release();
    if (!pending_.empty() && !batchable) flush();
    emitNow(std::move(op));
  }

  std::vector<Op>& ops() {
    release();
    flush();
    return ops_;
  }

 private:
  void emitNow(Op op) {
    const bool control = isControlOp(op);
    std::set<int> reads;
    std::set<int> writes;
    for (const auto& b : op.src) cellsOf(b, reads);
    for (const auto& b : op.dst) cellsOf(b, writes);
    bool nop = false;
    if (!control) {
      nop = waited_ || touches(reads, written_) || touches(writes, written_) || touches(writes, read_);
    } else if (op.type == OpType::Signal || op.type == OpType::RelaxedSignal || op.type == OpType::SemRelease) {
      nop = dataSinceNop_;
    } else {
      nop = touches(reads, written_);  // a port put of what a data operation just wrote
    }
    if (nop && !ops_.empty()) {
      ops_.push_back(Op{});
      read_.clear();
      written_.clear();
      waited_ = false;
      dataSinceNop_ = false;
    }
    if (!nop && !ops_.empty() && mergeable(ops_.back(), op)) {
      ops_.back().channelIds.push_back(op.channelIds.front());
      return;
    }
    if (op.type == OpType::Wait || op.type == OpType::RelaxedWait || op.type == OpType::SemAcquire) waited_ = true;
    if (!control) dataSinceNop_ = true;
    read_.insert(reads.begin(), reads.end());
    written_.insert(writes.begin(), writes.end());
    ops_.push_back(std::move(op));
  }
  static bool touches(const std::set<int>& a, const std::set<int>& b) {
    return std::any_of(a.begin(), a.end(), [&](int x) { return b.count(x) > 0; });
  }
  static bool mergeable(const Op& last, const Op& op) {
    return (op.type == OpType::Wait || op.type == OpType::Signal) && last.type == op.type &&
           last.channelType == op.channelType && op.channelIds.size() == 1 &&
           last.channelIds.size() < static_cast<std::size_t>(kMaxChannelsPerOperation) &&
           std::find(last.channelIds.begin(), last.channelIds.end(), op.channelIds.front()) == last.channelIds.end();
  }
  void cellsOf(const BufferRef& b, std::set<int>& out) const {
    if (b.kind != BufferRef::Kind::Local) return;
    for (int c = b.index; c < b.index + b.size; ++c) out.insert(resolve_(b.buffer, c));
  }

  Resolve resolve_;
  std::vector<Op> ops_;
  std::vector<Op> pending_;
  std::vector<Op> held_;
  std::set<int> read_;
  std::set<int> written_;
  bool waited_ = false;
  bool dataSinceNop_ = false;
};

Op channelOp(OpType t, ChannelType type, int gpuChannel) {
  Op o;
  o.type = t;
  o.channelType = type;
  o.channelIds = {gpuChannel};
  return o;
}

ThreadBlock materialize(int id, std::vector<Op> ops) {
  ThreadBlock tb;
  tb.id = id;
  std::map<ChannelType, std::vector<int>> channels;
  std::map<ChannelType, std::vector<int>> remotes;
  auto slot = [](std::vector<int>& list, int gpuIndex) {
    auto it = std::find(list.begin(), list.end(), gpuIndex);
    if (it != list.end()) return static_cast<int>(it - list.begin());
    list.push_back(gpuIndex);
    return static_cast<int>(list.size()) - 1;
  };
  for (auto& op : ops) {
    if (op.type == OpType::SemAcquire || op.type == OpType::SemRelease) continue;
    if (op.channelType) {
      for (int& c : op.channelIds) c = slot(channels[*op.channelType], c);
      for (auto* side : {&op.src, &op.dst})
        for (auto& b : *side)
          if (b.kind == BufferRef::Kind::Remote) b.id = slot(remotes[*op.channelType], b.id);
    }
  }
  for (const auto& [type, ids] : channels) tb.channels.push_back(BlockChannels{type, ids, std::nullopt});
  for (const auto& [type, ids] : remotes) tb.remoteBufferRefs.push_back(RemoteBufferRefs{type, ids});
  tb.ops = std::move(ops);
  return tb;
}

}  // namespace

core::Result<ExportResult> exportPlan(const Schedule& s, const ExportOptions& options) {
  const std::string file = s.name.empty() ? std::string("<schedule>") : s.name;
  auto fail = [&](std::string message) { return core::Diagnostic{file, 0, 0, std::move(message)}; };
  switch (s.collective) {
    case core::Collective::AllGather:
    case core::Collective::ReduceScatter:
    case core::Collective::AllReduce:
    case core::Collective::AllToAll:
      break;
    default:
      return fail(
          fmt::format("MSCCL++ plans cannot express {}: a plan carries no root (the executor would run it "
                      "for any root)",
                      core::toString(s.collective)));
  }
  const auto modes = core::supportedModes(s);
  core::BufferMode mode = modes.empty() ? core::BufferMode::OutOfPlace : modes.front();
  if (options.mode) {
    if (std::find(modes.begin(), modes.end(), *options.mode) == modes.end()) {
      return fail(fmt::format("the schedule does not support {} mode", core::toString(*options.mode)));
    }
    mode = *options.mode;
  }
  if (!options.scheduleProven) {
    Schedule one = s;
    one.inPlace = mode == core::BufferMode::InPlace;
    one.outOfPlace = !one.inPlace;
    const auto report = verify(one);
    if (!report.proven) {
      return fail(fmt::format("the schedule is not proven ({}), so it is not exported",
                              report.errors.empty() ? std::string("no detail") : report.errors.front().str()));
    }
  }
  const int n = s.nRanks;
  const int perNode = options.ranksPerNode > 0 ? options.ranksPerNode : n;
  if (n % perNode != 0) {
    return fail(fmt::format("{} ranks do not fill nodes of {} ranks", n, perNode));
  }
  auto node = [&](int r) { return r / perNode; };

  // Connections and the pairing of their sends and receives.
  std::vector<Conn> conns;
  std::map<std::tuple<int, int, int, int>, Pairing> pairing;  // (rank, tb, step) -> connection and ordinal
  std::map<std::tuple<int, int, int>, int> connIndex;         // (sender, receiver, channel)
  for (const auto& rp : s.ranks) {
    for (std::size_t t = 0; t < rp.threadBlocks.size(); ++t) {
      const auto& tb = rp.threadBlocks[t];
      if (tb.sendPeer < 0) continue;
      Conn c;
      c.sender = rp.rank;
      c.receiver = tb.sendPeer;
      c.channel = tb.channel;
      c.senderTb = static_cast<int>(t);
      c.type = node(c.sender) == node(c.receiver) ? ChannelType::Memory : ChannelType::Port;
      const auto& peer = s.ranks[static_cast<std::size_t>(tb.sendPeer)];
      for (std::size_t u = 0; u < peer.threadBlocks.size(); ++u) {
        if (peer.threadBlocks[u].recvPeer == rp.rank && peer.threadBlocks[u].channel == tb.channel)
          c.receiverTb = static_cast<int>(u);
      }
      if (c.receiverTb < 0)
        return fail(fmt::format("rank {} sends to rank {} with no receiving block", c.sender, c.receiver));
      connIndex[{c.sender, c.receiver, c.channel}] = static_cast<int>(conns.size());
      conns.push_back(c);
    }
  }
  for (std::size_t ci = 0; ci < conns.size(); ++ci) {
    const Conn& c = conns[ci];
    int k = 0;
    const auto& stb = s.ranks[static_cast<std::size_t>(c.sender)].threadBlocks[static_cast<std::size_t>(c.senderTb)];
    for (std::size_t i = 0; i < stb.steps.size(); ++i)
      if (core::opSends(stb.steps[i].op))
        pairing[{0, c.sender, c.senderTb, static_cast<int>(i)}] = Pairing{static_cast<int>(ci), k++};
    k = 0;
    const auto& rtb =
        s.ranks[static_cast<std::size_t>(c.receiver)].threadBlocks[static_cast<std::size_t>(c.receiverTb)];
    for (std::size_t i = 0; i < rtb.steps.size(); ++i)
      if (core::opReceives(rtb.steps[i].op))
        pairing[{1, c.receiver, c.receiverTb, static_cast<int>(i)}] = Pairing{static_cast<int>(ci), k++};
  }

  // A global topological order of the steps: every rank's blocks run their steps in it, which keeps the plan free
  // of deadlock whatever blocks are merged.
  std::vector<std::vector<int>> base(static_cast<std::size_t>(n));
  int total = 0;
  for (const auto& rp : s.ranks) {
    for (const auto& tb : rp.threadBlocks) {
      base[static_cast<std::size_t>(rp.rank)].push_back(total);
      total += static_cast<int>(tb.steps.size());
    }
  }
  std::vector<std::vector<int>> succ(static_cast<std::size_t>(total));
  std::vector<int> indeg(static_cast<std::size_t>(total), 0);
  auto edge = [&](int a, int b) {
    succ[static_cast<std::size_t>(a)].push_back(b);
    ++indeg[static_cast<std::size_t>(b)];
  };
  auto idOf = [&](int r, int t, int i) { return base[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] + i; };
  for (const auto& rp : s.ranks) {
    for (std::size_t t = 0; t < rp.threadBlocks.size(); ++t) {
      const auto& tb = rp.threadBlocks[t];
      for (std::size_t i = 0; i < tb.steps.size(); ++i) {
        const int id = idOf(rp.rank, static_cast<int>(t), static_cast<int>(i));
        if (i > 0) edge(id - 1, id);
        for (const auto& d : tb.steps[i].deps) {
          const int dt = core::findThreadBlock(rp, d.tb);
          if (dt >= 0) edge(idOf(rp.rank, dt, d.step), id);
        }
      }
    }
  }
  for (const auto& [key, p] : pairing) {
    if (std::get<0>(key) != 0) continue;
    const Conn& c = conns[static_cast<std::size_t>(p.conn)];
    // The k-th receive of the connection.
    const auto& rtb =
        s.ranks[static_cast<std::size_t>(c.receiver)].threadBlocks[static_cast<std::size_t>(c.receiverTb)];
    int k = 0;
    for (std::size_t i = 0; i < rtb.steps.size(); ++i) {
      if (!core::opReceives(rtb.steps[i].op)) continue;
      if (k++ == p.k) {
        edge(idOf(std::get<1>(key), std::get<2>(key), std::get<3>(key)),
             idOf(c.receiver, c.receiverTb, static_cast<int>(i)));
        break;
      }
    }
  }
  std::vector<int> topoIndex(static_cast<std::size_t>(total), -1);
  {
    std::deque<int> ready;
    for (int i = 0; i < total; ++i)
      if (indeg[static_cast<std::size_t>(i)] == 0) ready.push_back(i);
    int at = 0;
    while (!ready.empty()) {
      const int x = ready.front();
      ready.pop_front();
      topoIndex[static_cast<std::size_t>(x)] = at++;
      for (int y : succ[static_cast<std::size_t>(x)])
        if (--indeg[static_cast<std::size_t>(y)] == 0) ready.push_back(y);
    }
    if (at != total) return fail("the schedule's dependencies form a cycle");
  }

  // Protocol: packets when the schedule is LL and every step has a packet form over memory channels.
  bool packets = options.packets && s.protocol == core::Protocol::LL;
  ExportResult result;
  if (packets) {
    bool portUsed = std::any_of(conns.begin(), conns.end(), [](const Conn& c) { return c.type == ChannelType::Port; });
    bool rrs = false;
    for (const auto& rp : s.ranks)
      for (const auto& tb : rp.threadBlocks)
        for (const auto& st : tb.steps) rrs = rrs || st.op == StepOp::RecvReduceSend;
    if (portUsed || rrs) {
      packets = false;
      result.notes.push_back(portUsed ? "LL schedule exported with Simple operations: packets between nodes need "
                                        "port channels, which MSCCL++ v0.10 forwards only from packet-format scratch"
                                      : "LL schedule exported with Simple operations: a receive-reduce-send without a "
                                        "local copy has no packet operation in MSCCL++ v0.10");
    }
  }

  Plan& plan = result.plan;
  plan.name = options.name.empty() ? (s.name.empty() ? std::string("optiflow") : s.name) : options.name;
  plan.collective = s.collective;
  plan.collectiveName = std::string(core::toString(s.collective));
  plan.protocol = packets ? core::Protocol::LL : core::Protocol::Simple;
  plan.inPlace = mode == core::BufferMode::InPlace;
  plan.doubleScratchBuffer = packets;
  plan.minMessageSize = options.minMessageSize.value_or(s.minBytes);
  plan.maxMessageSize =
      options.maxMessageSize.value_or(s.maxBytes == 0 ? std::numeric_limits<std::uint64_t>::max() : s.maxBytes);
  plan.gpus.resize(static_cast<std::size_t>(n));

  // Channels, in one order for both ends of every pair of ranks (the executor pairs a rank's k-th channel to a peer
  // with the peer's k-th channel back), and the receivers' scratch as remote buffers.
  std::vector<int> order(conns.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const Conn& x = conns[static_cast<std::size_t>(a)];
    const Conn& y = conns[static_cast<std::size_t>(b)];
    return std::make_tuple(std::min(x.sender, x.receiver), std::max(x.sender, x.receiver), x.sender, x.channel) <
           std::make_tuple(std::min(y.sender, y.receiver), std::max(y.sender, y.receiver), y.sender, y.channel);
  });
  std::vector<std::map<ChannelType, int>> channelCount(static_cast<std::size_t>(n));
  std::map<std::tuple<int, int, ChannelType>, int> remoteIndex;
  for (int ci : order) {
    Conn& c = conns[static_cast<std::size_t>(ci)];
    auto& sg = plan.gpus[static_cast<std::size_t>(c.sender)];
    auto& rg = plan.gpus[static_cast<std::size_t>(c.receiver)];
    sg.channels.push_back(Channel{c.type, {c.receiver}, BufferKind::Input, false, {}});
    rg.channels.push_back(Channel{c.type, {c.sender}, BufferKind::Input, false, {}});
    c.senderChannel = channelCount[static_cast<std::size_t>(c.sender)][c.type]++;
    c.receiverChannel = channelCount[static_cast<std::size_t>(c.receiver)][c.type]++;
    const auto key = std::make_tuple(c.sender, c.receiver, c.type);
    auto it = remoteIndex.find(key);
    if (it == remoteIndex.end()) {
      it = remoteIndex.emplace(key, static_cast<int>(sg.remoteBuffers.size())).first;
      sg.remoteBuffers.push_back(RemoteBuffer{c.receiver, BufferKind::Scratch, {c.type}});
    }
    c.remoteBuffer = it->second;
  }

  // Scratch slots: one per receive, after the schedule's own scratch.
  std::vector<int> scratchTop(static_cast<std::size_t>(n));
  for (const auto& rp : s.ranks) scratchTop[static_cast<std::size_t>(rp.rank)] = rp.scratchChunks;
  std::map<std::tuple<int, int, int>, int> slotOf;  // (rank, tb, step) of a receive -> its scratch slot
  for (const auto& rp : s.ranks) {
    for (std::size_t t = 0; t < rp.threadBlocks.size(); ++t) {
      const auto& tb = rp.threadBlocks[t];
      for (std::size_t i = 0; i < tb.steps.size(); ++i) {
        if (!core::opReceives(tb.steps[i].op)) continue;
        slotOf[{rp.rank, static_cast<int>(t), static_cast<int>(i)}] = scratchTop[static_cast<std::size_t>(rp.rank)];
        scratchTop[static_cast<std::size_t>(rp.rank)] += tb.steps[i].count;
      }
    }
  }
  // The slot on the receiver that the k-th send of a connection fills.
  auto remoteSlot = [&](const Conn& c, int k) {
    const auto& rtb =
        s.ranks[static_cast<std::size_t>(c.receiver)].threadBlocks[static_cast<std::size_t>(c.receiverTb)];
    int j = 0;
    for (std::size_t i = 0; i < rtb.steps.size(); ++i) {
      if (!core::opReceives(rtb.steps[i].op)) continue;
      if (j++ == k) return slotOf[{c.receiver, c.receiverTb, static_cast<int>(i)}];
    }
    return -1;
  };

  // Blocks: per rank, the schedule's blocks that dependencies link, merged.
  for (const auto& rp : s.ranks) {
    const int r = rp.rank;
    auto& gpu = plan.gpus[static_cast<std::size_t>(r)];
    gpu.id = r;
    const auto sizes = core::logicalSizes(s, r);
    gpu.inputChunks = sizes.input;
    gpu.outputChunks = sizes.output;
    gpu.scratchChunks = scratchTop[static_cast<std::size_t>(r)];
    const std::size_t nb = rp.threadBlocks.size();
    std::vector<int> parent(nb);
    std::iota(parent.begin(), parent.end(), 0);
    std::function<int(int)> find = [&](int x) {
      return parent[static_cast<std::size_t>(x)] == x
                 ? x
                 : parent[static_cast<std::size_t>(x)] = find(parent[static_cast<std::size_t>(x)]);
    };
    for (std::size_t t = 0; t < nb; ++t)
      for (const auto& st : rp.threadBlocks[t].steps)
        for (const auto& d : st.deps) {
          const int dt = core::findThreadBlock(rp, d.tb);
          if (dt >= 0) parent[static_cast<std::size_t>(find(static_cast<int>(t)))] = find(dt);
        }
    std::map<int, std::vector<std::pair<int, int>>> groups;  // root -> (block, step)
    for (std::size_t t = 0; t < nb; ++t)
      for (std::size_t i = 0; i < rp.threadBlocks[t].steps.size(); ++i)
        groups[find(static_cast<int>(t))].emplace_back(static_cast<int>(t), static_cast<int>(i));
    // Blocks without steps still hold connections only when they send or receive; a block with no steps has none.
    int links = 0;
    for (auto& [root, steps] : groups) {
      (void)root;
      std::sort(steps.begin(), steps.end(), [&](const auto& a, const auto& b) {
        return topoIndex[static_cast<std::size_t>(idOf(r, a.first, a.second))] <
               topoIndex[static_cast<std::size_t>(idOf(r, b.first, b.second))];
      });
      BlockBuilder bb([&](BufferKind b, int chunk) {
        const core::Slot slot =
            b == BufferKind::Scratch ? core::Slot{b, chunk} : core::resolveSlot(s, r, mode, b, chunk);
        return static_cast<int>(slot.buf) * (1 << 24) + slot.index;
      });
      std::set<int> blocks;
      for (const auto& [t, i] : steps) blocks.insert(t);
      if (!packets) {
        // Ready handshake: a receiver tells its sender the run started, so the sender never overwrites scratch the
        // receiver still reads in the previous run.
        for (const auto& c : conns)
          if (c.receiver == r && blocks.count(c.receiverTb))
            bb.emit(channelOp(OpType::Signal, c.type, c.receiverChannel));
        for (const auto& c : conns)
          if (c.sender == r && blocks.count(c.senderTb)) bb.emit(channelOp(OpType::Wait, c.type, c.senderChannel));
      }
      for (const auto& [t, i] : steps) {
        const Step& st = rp.threadBlocks[static_cast<std::size_t>(t)].steps[static_cast<std::size_t>(i)];
        const int cnt = st.count;
        std::optional<Pairing> in;
        std::optional<Pairing> out;
        if (auto it = pairing.find({1, r, t, i}); it != pairing.end()) in = it->second;
        if (auto it = pairing.find({0, r, t, i}); it != pairing.end()) out = it->second;
        const Conn* ic = in ? &conns[static_cast<std::size_t>(in->conn)] : nullptr;
        const Conn* oc = out ? &conns[static_cast<std::size_t>(out->conn)] : nullptr;
        const int mySlot = in ? slotOf[{r, t, i}] : -1;
        const int theirSlot = out ? remoteSlot(*oc, out->k) : -1;
        const BufferRef src = localRef(st.srcBuf, st.srcOff, cnt);
        const BufferRef dst = localRef(st.dstBuf, st.dstOff, cnt);
        const BufferRef slot = localRef(BufferKind::Scratch, mySlot, cnt);
        auto send = [&](const BufferRef& from) {
          // Simple: put + signal (fused pwsf on a port channel); LL: packets carry their flag.
          if (packets) {
            Op o;
            o.type = OpType::PutPackets;
            o.channelType = ChannelType::Memory;
            o.src = {from};
            o.dst = {remoteRef(oc->remoteBuffer, theirSlot, cnt)};
            bb.emit(o);
            return;
          }
          Op o;
          o.channelType = oc->type;
          o.src = {from};
          o.dst = {remoteRef(oc->remoteBuffer, theirSlot, cnt)};
          if (oc->type == ChannelType::Port) {
            o.type = OpType::PutWithSignalAndFlush;
            o.channelIds = {oc->senderChannel};
            bb.emit(o);
          } else {
            o.type = OpType::Put;
            bb.emit(o);
            bb.signalLater(channelOp(OpType::Signal, oc->type, oc->senderChannel));
          }
        };
        auto waitIn = [&]() {
          if (!packets) bb.emit(channelOp(OpType::Wait, ic->type, ic->receiverChannel));
        };
        auto reduceOp = [&](OpType t2, std::vector<BufferRef> srcs, std::vector<BufferRef> dsts, bool remoteOut) {
          Op o;
          o.type = t2;
          o.src = std::move(srcs);
          o.dst = std::move(dsts);
          o.reduceOp = "sum";
          if (remoteOut) o.channelType = ChannelType::Memory;
          bb.emit(o);
        };
        auto copyOp = [&](OpType t2, const BufferRef& from, const BufferRef& to, bool hold = false) {
          Op o;
          o.type = t2;
          o.src = {from};
          o.dst = {to};
          if (hold) {
            bb.consumeLater(o);
          } else {
            bb.emit(o);
          }
        };
        switch (st.op) {
          case StepOp::Nop:
            break;
          case StepOp::Copy:
            copyOp(OpType::Copy, src, dst);
            break;
          case StepOp::Reduce:
            reduceOp(OpType::Reduce, {dst, src}, {dst}, false);
            break;
          case StepOp::Send:
            send(src);
            break;
          case StepOp::Recv:
            waitIn();
            copyOp(packets ? OpType::UnpackPackets : OpType::Copy, slot, dst, !packets);
            break;
          case StepOp::RecvCopySend:
            waitIn();
            copyOp(packets ? OpType::UnpackPackets : OpType::Copy, slot, dst);
            if (packets) {
              Op o;
              o.type = OpType::ReadPutPackets;
              o.channelType = ChannelType::Memory;
              o.src = {slot};
              o.dst = {remoteRef(oc->remoteBuffer, theirSlot, cnt)};
              bb.emit(o);
            } else {
              send(slot);
            }
            break;
          case StepOp::RecvReduceSend:  // never with packets
            waitIn();
            if (oc->type == ChannelType::Memory) {
              reduceOp(OpType::ReduceSend, {src, slot}, {slot, remoteRef(oc->remoteBuffer, theirSlot, cnt)}, true);
              bb.signalLater(channelOp(OpType::Signal, oc->type, oc->senderChannel));
            } else {
              reduceOp(OpType::Reduce, {src, slot}, {slot}, false);
              send(slot);
            }
            break;
          case StepOp::RecvReduceCopy:
            waitIn();
            if (packets) {
              reduceOp(OpType::ReducePackets, {src, slot}, {dst}, false);
            } else {
              Op o;
              o.type = OpType::Reduce;
              o.src = {src, slot};
              o.dst = {dst};
              o.reduceOp = "sum";
              bb.consumeLater(o);
            }
            break;
          case StepOp::RecvReduceCopySend:
            waitIn();
            if (packets) {
              reduceOp(OpType::ReduceSendPackets, {src, slot}, {dst, remoteRef(oc->remoteBuffer, theirSlot, cnt)},
                       true);
            } else if (oc->type == ChannelType::Memory) {
              reduceOp(OpType::ReduceSend, {src, slot}, {dst, remoteRef(oc->remoteBuffer, theirSlot, cnt)}, true);
              bb.signalLater(channelOp(OpType::Signal, oc->type, oc->senderChannel));
            } else {
              reduceOp(OpType::Reduce, {src, slot}, {dst}, false);
              send(dst);
            }
            break;
        }
      }
      // Split beyond the executor's 64 operations, chaining the parts: the first 16 links with device semaphores
      // (release at the end of a part, acquire at the start of the next), the next 16 with two-block barriers.
      auto& ops = bb.ops();
      if (ops.empty()) continue;
      if (ops.size() <= static_cast<std::size_t>(kMaxOperationsPerThreadBlock)) {
        gpu.threadBlocks.push_back(materialize(static_cast<int>(gpu.threadBlocks.size()), std::move(ops)));
        continue;
      }
      const std::size_t parts = (ops.size() + kPayloadPerSplitBlock - 1) / kPayloadPerSplitBlock;
      auto linkOp = [&](int link, bool arrive) {
        Op o;
        if (link < kMaxDeviceSemaphores) {
          o.type = arrive ? OpType::SemRelease : OpType::SemAcquire;
          o.semaphoreIds = {link};
        } else {
          o.type = OpType::Barrier;
          o.barrierId = link - kMaxDeviceSemaphores;
          o.numThreadBlocks = 2;
        }
        return o;
      };
      for (std::size_t p = 0; p < parts; ++p) {
        std::vector<Op> part;
        if (p > 0) {
          part.push_back(linkOp(links - 1, false));
          part.push_back(Op{});
        }
        const std::size_t from = p * kPayloadPerSplitBlock;
        const std::size_t to = std::min(ops.size(), from + kPayloadPerSplitBlock);
        part.insert(part.end(), ops.begin() + static_cast<std::ptrdiff_t>(from),
                    ops.begin() + static_cast<std::ptrdiff_t>(to));
        if (p + 1 < parts) {
          if (part.back().type != OpType::Nop) part.push_back(Op{});
          if (links < kMaxDeviceSemaphores) gpu.semaphoreInit.push_back(0);
          part.push_back(linkOp(links, true));
          ++links;
          ++result.splitBlocks;
        }
        gpu.threadBlocks.push_back(materialize(static_cast<int>(gpu.threadBlocks.size()), std::move(part)));
      }
    }
    if (links > kMaxDeviceSemaphores + kMaxDeviceSyncers) {
      return fail(fmt::format(
          "rank {}: its program needs {} links between thread blocks to stay under {} operations per block; MSCCL++ "
          "{} offers {} device semaphores (MAX_DEVICE_SEMAPHORES) and {} barriers (MAX_DEVICE_SYNCERS)",
          r, links, kMaxOperationsPerThreadBlock, kPinnedVersion, kMaxDeviceSemaphores, kMaxDeviceSyncers));
    }
  }
  if (result.splitBlocks > 0) {
    result.notes.push_back(fmt::format("{} thread blocks added to stay within {} operations per block",
                                       result.splitBlocks, kMaxOperationsPerThreadBlock));
  }
  if (const auto limits = checkPlanLimits(plan); !limits.empty()) {
    return fail(fmt::format("the plan exceeds an MSCCL++ {} executor limit: {}", kPinnedVersion, limits.front()));
  }
  const auto proof = verifyPlan(plan);
  if (!proof.proven) {
    const std::string why = proof.errors.empty() ? std::string("no detail") : proof.errors.front().str();
    // Nothing is exported unproven; a plan too large to prove is not a fault of the export.
    if (proof.beyondBudget) return fail("the plan is too large for the plan verifier, so it is not exported: " + why);
    return fail(fmt::format("internal error: the exported plan is not proven: {}", why));
  }
  return result;
}

}  // namespace optiflow::compiler::mscclpp
