#include "optiflow/compiler/scheduler.h"

#include <algorithm>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule_json.h"
#include "scheduler_internal.h"

namespace optiflow::compiler {

using core::Collective;
using core::IntentProgram;
using core::Protocol;
using core::Topology;

namespace detail {

using core::StepOp;
using core::Transfer;
using core::TransferKind;

namespace {

// Data bytes per wire byte, by protocol in core::Protocol's order (LL, LL128, Simple) (docs/simulator.md,
// protocolEfficiency).
constexpr double kProtocolEfficiency[core::kNumProtocols] = {0.5, 120.0 / 128.0, 1.0};

}  // namespace

Slot Scheduler::initialSlot(int rank, int sc) const {
  const int k = share();
  const int block = sc / k;
  switch (in_.collective) {
    case Collective::AllGather:
      return block == rank ? Slot{BufferKind::Input, sc - rank * k} : Slot{};
    case Collective::ReduceScatter:
    case Collective::AllReduce:
    case Collective::Reduce:
      return {BufferKind::Input, sc};
    case Collective::Broadcast:
      return rank == in_.root ? Slot{BufferKind::Input, sc} : Slot{};
    case Collective::AllToAll: {
      const int from = block / n();
      const int to = block % n();
      return from == rank ? Slot{BufferKind::Input, to * k + sc % k} : Slot{};
    }
    case Collective::Custom:
      break;
  }
  return {};
}

Slot Scheduler::finalSlot(int rank, int sc) const {
  const int k = share();
  const int block = sc / k;
  switch (in_.collective) {
    case Collective::AllGather:
    case Collective::AllReduce:
    case Collective::Broadcast:
      return {BufferKind::Output, sc};
    case Collective::ReduceScatter:
      return block == rank ? Slot{BufferKind::Output, sc - rank * k} : Slot{};
    case Collective::Reduce:
      return rank == in_.root ? Slot{BufferKind::Output, sc} : Slot{};
    case Collective::AllToAll: {
      const int from = block / n();
      const int to = block % n();
      return to == rank ? Slot{BufferKind::Output, from * k + sc % k} : Slot{};
    }
    case Collective::Custom:
      break;
  }
  return {};
}

Slot Scheduler::receiveSlot(int rank, int sc) {
  const Slot f = finalSlot(rank, sc);
  if (f.valid()) return f;
  // All-Reduce and Reduce may use every rank's output as work space (Reduce leaves non-root outputs undefined).
  if (in_.collective == Collective::Reduce) return {BufferKind::Output, sc};
  RankState& st = st_[rank];
  const std::int64_t key = static_cast<std::int64_t>(sc) * 3;
  auto [it, inserted] = st.scratchOf.try_emplace(key, st.scratch);
  if (inserted) ++st.scratch;
  return {BufferKind::Scratch, it->second};
}

Slot Scheduler::relaySlot(int rank, int sc) {
  RankState& st = st_[rank];
  const std::int64_t key = static_cast<std::int64_t>(sc) * 3 + 1;
  auto [it, inserted] = st.scratchOf.try_emplace(key, st.scratch);
  if (inserted) ++st.scratch;
  return {BufferKind::Scratch, it->second};
}

bool Scheduler::readInRound(int rank, Slot s, int firstOp) {
  RankState& st = st_[rank];
  const int c = canonical(rank, s);
  growSlots(st, c);
  return st.lastReader[c] != kNone && readerPool_[st.lastReader[c]].op >= firstOp;
}

// The other of two scratch homes of a chunk on a rank (never the one `busy` names).
Slot Scheduler::alternateSlot(int rank, int sc, Slot busy) {
  RankState& st = st_[rank];
  for (int variant : {2, 0}) {
    const std::int64_t key = static_cast<std::int64_t>(sc) * 3 + variant;
    auto [it, inserted] = st.scratchOf.try_emplace(key, st.scratch);
    if (inserted) ++st.scratch;
    const Slot cand{BufferKind::Scratch, it->second};
    if (!(cand == busy)) return cand;
  }
  return busy;
}

// One index per physical location, with the in-place aliasing applied: tracking hazards on these makes the
// dependencies right for both buffer modes at once (out-of-place only has fewer real conflicts).
int Scheduler::canonical(int rank, Slot s) const {
  const int c = chunksPerLoop();
  const int k = share();
  const int inSize = in_.collective == Collective::AllGather ? k : c;
  switch (s.buf) {
    case BufferKind::Input:
      if (in_.collective == Collective::AllGather) return rank * k + s.index;  // the rank's slice of the output
      return s.index;
    case BufferKind::Output:
      if (in_.collective == Collective::AllGather) return s.index;
      if (in_.collective == Collective::ReduceScatter) return rank * k + s.index;
      return s.index;  // the others alias output onto input
    case BufferKind::Scratch:
      return (in_.collective == Collective::AllGather ? c : std::max(inSize, c)) + s.index;
  }
  return 0;
}

void Scheduler::growSlots(RankState& st, int index) {
  if (index >= static_cast<int>(st.writer.size())) {
    const std::size_t size = std::max<std::size_t>(index + 1, st.writer.size() * 2);
    st.writer.resize(size, kNone);
    st.occupant.resize(size, kNone);
    st.lastReader.resize(size, kNone);
  }
}

int Scheduler::newOp(int rank, OpKind kind) {
  Op op;
  op.rank = rank;
  op.kind = kind;
  ops_.push_back(op);
  return static_cast<int>(ops_.size()) - 1;
}

void Scheduler::commitDeps(int op, std::vector<int>& deps) {
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  std::erase(deps, op);
  ops_[op].depBegin = static_cast<int>(deps_.size());
  ops_[op].depCount = static_cast<int>(deps.size());
  deps_.insert(deps_.end(), deps.begin(), deps.end());
  deps.clear();
}

void Scheduler::readDeps(int rank, Slot s, std::vector<int>& deps) {
  RankState& st = st_[rank];
  const int c = canonical(rank, s);
  growSlots(st, c);
  addDep(deps, st.writer[c]);
}

void Scheduler::noteRead(int rank, Slot s, int op) {
  RankState& st = st_[rank];
  const int c = canonical(rank, s);
  growSlots(st, c);
  readerPool_.push_back({op, st.lastReader[c]});
  st.lastReader[c] = static_cast<int>(readerPool_.size()) - 1;
}

void Scheduler::writeDeps(int rank, Slot s, std::vector<int>& deps) {
  RankState& st = st_[rank];
  const int c = canonical(rank, s);
  growSlots(st, c);
  addDep(deps, st.writer[c]);
  for (int r = st.lastReader[c]; r != kNone; r = readerPool_[r].next) addDep(deps, readerPool_[r].op);
}

void Scheduler::noteWrite(int rank, Slot s, int op) {
  RankState& st = st_[rank];
  const int c = canonical(rank, s);
  growSlots(st, c);
  st.writer[c] = op;
  st.lastReader[c] = kNone;
}

bool Scheduler::build() {
  const int c = in_.nChunks() * s_;  // schedule chunks (All-to-All has more than one buffer holds)
  placeInitialValues(c);
  const std::size_t expectHops = in_.transfers.size() * static_cast<std::size_t>(s_);
  hops_.reserve(expectHops);
  ops_.reserve(expectHops * 2 + static_cast<std::size_t>(n()) * c / 4);
  std::vector<int> deps;
  std::vector<PendingRecv> pending;
  std::size_t i = 0;
  const auto& tr = in_.transfers;
  // Round by round: all reads of a round first, then its writes (docs/compiler.md, "Dependencies").
  while (i < tr.size()) {
    std::size_t end = i;
    while (end < tr.size() && tr[end].round == tr[i].round) ++end;
    pending.clear();
    const int roundFirstOp = static_cast<int>(ops_.size());
    if (!sendRound(i, end, pending, deps)) return false;
    if (!receiveRound(pending, roundFirstOp, deps)) return false;
    i = end;
  }
  if (!copyToFinal(c, deps)) return false;
  dropHazardState();
  estimate();
  return true;
}

void Scheduler::placeInitialValues(int chunks) {
  st_.assign(n(), RankState{});
  for (int r = 0; r < n(); ++r) {
    st_[r].loc.resize(chunks);
    for (int sc = 0; sc < chunks; ++sc) {
      st_[r].loc[sc] = initialSlot(r, sc);
      if (st_[r].loc[sc].valid()) setOccupant(r, st_[r].loc[sc], sc);
    }
  }
}

bool Scheduler::sendRound(std::size_t first, std::size_t end, std::vector<PendingRecv>& pending,
                          std::vector<int>& deps) {
  const auto& tr = in_.transfers;
  for (std::size_t t = first; t < end; ++t) {
    const Transfer& x = tr[t];
    for (int j = 0; j < s_; ++j) {
      const int sc = x.chunk * s_ + j;
      const Slot from = st_[x.src].loc[sc];
      if (!from.valid()) {
        error_ = fmt::format("transfer {} (round {}, line {}): rank {} sends chunk {} but holds nothing of it", t,
                             x.round, x.line, x.src, x.chunk);
        return false;
      }
      Hop h;
      h.src = x.src;
      h.dst = x.via >= 0 ? x.via : x.dst;
      h.chunk = sc;
      h.channel = channelOf(x.chunk, j);
      addSend(h, from, x.kind == TransferKind::Reduce, x.dst, pending, deps);
    }
  }
  return true;
}

void Scheduler::addSend(Hop h, Slot from, bool reduce, int finalDst, std::vector<PendingRecv>& pending,
                        std::vector<int>& deps) {
  const int hopId = static_cast<int>(hops_.size());
  const int op = newOp(h.src, OpKind::Send);
  ops_[op].hop = hopId;
  ops_[op].src = from;
  readDeps(h.src, from, deps);
  commitDeps(op, deps);
  noteRead(h.src, from, op);
  noteForward(op, h.dst);
  h.sendOp = op;
  hops_.push_back(h);
  pending.push_back({hopId, reduce, finalDst});
}

bool Scheduler::receiveRound(std::vector<PendingRecv>& pending, int roundFirstOp, std::vector<int>& deps) {
  // A relay's second hop joins `pending` while the loop runs, so it is received in this round too.
  for (std::size_t p = 0; p < pending.size(); ++p) {
    const PendingRecv pd = pending[p];
    if (!receive(pd, roundFirstOp, pending, deps)) return false;
  }
  return true;
}

bool Scheduler::receive(const PendingRecv& pd, int roundFirstOp, std::vector<PendingRecv>& pending,
                        std::vector<int>& deps) {
  Hop& h = hops_[pd.hop];
  const int sc = h.chunk;
  const bool relayHop = h.dst != pd.finalDst;
  const int op = newOp(h.dst, OpKind::Recv);
  Op& o = ops_[op];
  o.hop = pd.hop;
  o.src = ops_[h.sendOp].src;
  Slot to;
  if (relayHop) {
    to = relaySlot(h.dst, sc);
  } else if (pd.reduce) {
    const Slot cur = st_[h.dst].loc[sc];
    if (!cur.valid()) {
      error_ = fmt::format("a reduction into rank {} of chunk {} finds nothing to reduce into", h.dst, sc);
      return false;
    }
    o.reduce = true;
    o.src = cur;
    readDeps(h.dst, cur, deps);
    noteRead(h.dst, cur, op);
    to = receiveSlot(h.dst, sc);
  } else {
    to = receiveSlot(h.dst, sc);
  }
  // Never overwrite a value a send of this same round still reads (an exchange): land beside it instead, so
  // no receive waits on a send of its own round (the final copy puts values where the output wants them).
  if (!relayHop && readInRound(h.dst, to, roundFirstOp)) to = alternateSlot(h.dst, sc, to);
  // Nor a slot where another chunk's value still lives (in place, an All-to-All's output slot holds what the
  // rank has yet to send): land in scratch; the final copy moves it once the slot is free.
  if (!relayHop) {
    const int occ = occupantOf(h.dst, to);
    if (occ != kNone && occ != sc) to = alternateSlot(h.dst, sc, to);
  }
  o.dst = to;
  ops_[h.sendOp].dst = to;
  writeDeps(h.dst, to, deps);
  commitDeps(op, deps);
  noteWrite(h.dst, to, op);
  h.recvOp = op;
  if (relayHop) {
    // Second hop: relay -> destination, created now so that it depends on the first one's arrival.
    Hop h2;
    h2.src = h.dst;
    h2.dst = pd.finalDst;
    h2.chunk = sc;
    h2.channel = h.channel;
    addSend(h2, to, pd.reduce, pd.finalDst, pending, deps);  // invalidates h and o
  } else {
    const Slot old = st_[h.dst].loc[sc];
    if (old.valid() && occupantOf(h.dst, old) == sc) setOccupant(h.dst, old, kNone);
    st_[h.dst].loc[sc] = to;
    setOccupant(h.dst, to, sc);
  }
  return true;
}

bool Scheduler::copyToFinal(int chunks, std::vector<int>& deps) {
  // An All-Gather rank's own block, a root's data, anything a one-rank program never moves. Counted first: ops_
  // holds every op of the program by now, and growing it by doubling would copy all of them for a few copies more.
  std::size_t copies = 0;
  for (int r = 0; r < n(); ++r) {
    for (int sc = 0; sc < chunks; ++sc) {
      const Slot f = finalSlot(r, sc);
      copies += f.valid() && st_[r].loc[sc].valid() && !(st_[r].loc[sc] == f) ? 1 : 0;
    }
  }
  ops_.reserve(ops_.size() + copies);
  for (int r = 0; r < n(); ++r) {
    for (int sc = 0; sc < chunks; ++sc) {
      const Slot f = finalSlot(r, sc);
      if (!f.valid()) continue;
      const Slot cur = st_[r].loc[sc];
      if (!cur.valid()) {
        error_ = fmt::format("rank {} never receives chunk {} that the collective requires", r, sc);
        return false;
      }
      if (cur == f) continue;
      const int op = newOp(r, OpKind::Copy);
      ops_[op].src = cur;
      ops_[op].dst = f;
      readDeps(r, cur, deps);
      writeDeps(r, f, deps);
      commitDeps(op, deps);
      noteRead(r, cur, op);
      noteWrite(r, f, op);
      st_[r].loc[sc] = f;
    }
  }
  return true;
}

void Scheduler::dropHazardState() {
  scratchCount_.resize(n());
  for (int r = 0; r < n(); ++r) scratchCount_[r] = st_[r].scratch;
  std::vector<RankState>().swap(st_);
  std::vector<ReaderLink>().swap(readerPool_);
}

double Scheduler::hopDuration(int src, int dst) const {
  const double bytes = opt_.sizeBytes > 0 ? static_cast<double>(opt_.sizeBytes) / chunksPerLoop() : 1.0;
  double bw = 0;
  double lat = 0;
  const int a = topo_.localOf(src);
  const int b = topo_.localOf(dst);
  if (topo_.nodeOf(src) == topo_.nodeOf(dst)) {
    bw = topo_.intraBandwidth(a, b);
    lat = topo_.intraLatencyUs(a, b);
    if (bw <= 0) {  // relayed inside the node by the fabric
      bw = std::max(1.0, topo_.intra.gpuBandwidthGBps * 0.5);
      lat = 2 * std::max(1.0, topo_.intra.latencyUs);
    }
  } else {
    const int ra = topo_.railOf(a);
    const int rb = topo_.railOf(b);
    bw = ra >= 0 ? topo_.nics[ra].bandwidthGBps : std::max(1.0, topo_.nodeEgressBandwidth());
    lat = (ra >= 0 && rb >= 0) ? topo_.interLatencyUs(ra, rb) : 5.0;
  }
  const double wire = bytes / kProtocolEfficiency[static_cast<int>(proto_)];
  return lat + 1.0 + wire / (bw * 1e3);  // GB/s = 1e3 bytes per microsecond
}

// Durations and upward ranks (the longest chain of estimated work from an op to the end): the list scheduler's
// priority among steps that are ready at the same time.
void Scheduler::estimate() {
  const double copyUs = opt_.sizeBytes > 0 ? static_cast<double>(opt_.sizeBytes) / chunksPerLoop() / 1e6 : 0.01;
  for (Op& o : ops_) {
    if (o.kind == OpKind::Send) {
      o.dur = hopDuration(hops_[o.hop].src, hops_[o.hop].dst);
    } else if (o.kind == OpKind::Copy) {
      o.dur = std::max(copyUs, 1e-3);
    }
  }
  for (Op& o : ops_) {
    if (o.kind == OpKind::Recv) o.dur = ops_[hops_[o.hop].sendOp].dur;
  }
  // Reverse creation order is a reverse topological order (dependencies are always created first).
  std::vector<double> child(ops_.size(), 0.0);
  for (std::size_t i = ops_.size(); i-- > 0;) {
    Op& o = ops_[i];
    o.up = (o.kind == OpKind::Recv ? 0.0 : o.dur) + child[i];
    if (o.kind == OpKind::Recv) {
      const int s = hops_[o.hop].sendOp;
      child[s] = std::max(child[s], o.up);
    }
    for (int d = 0; d < o.depCount; ++d) {
      const int p = deps_[o.depBegin + d];
      child[p] = std::max(child[p], o.up);
    }
  }
}

// Each (channel, send peer) and each (channel, receive peer) of a rank names at most one block: a block gets a peer
// only where no block has it yet. So the blocks are found through two maps instead of a scan of the rank's blocks
// (a `direct` program has a block per peer and channel, and every transfer looks one up).
int Scheduler::blockFor(int rank, int channel, int sendPeer, int recvPeer, bool create) {
  auto& bl = blocks_[rank];
  const int bySend = sendPeer >= 0 ? findBlock(sendIndex_, rank, channel, sendPeer) : kNone;
  const int byRecv = recvPeer >= 0 ? findBlock(recvIndex_, rank, channel, recvPeer) : kNone;
  if (sendPeer >= 0 && recvPeer >= 0) {  // a fused step needs both ends in one block
    if (bySend >= 0 && byRecv >= 0) return bySend == byRecv ? bySend : kNone;
    const int b = bySend >= 0 ? bySend : byRecv;
    if (b >= 0) {
      if (bySend >= 0 && bl[b].recvPeer == kNone) {
        setRecvPeer(rank, b, recvPeer);
        return b;
      }
      if (byRecv >= 0 && bl[b].sendPeer == kNone) {
        setSendPeer(rank, b, sendPeer);
        return b;
      }
      return kNone;
    }
    if (!create) return kNone;
    return addBlock(rank, sendPeer, recvPeer, channel);
  }
  if (sendPeer >= 0 && bySend >= 0) return bySend;
  if (recvPeer >= 0 && byRecv >= 0) return byRecv;
  if (paired_) {  // share a block with the opposite direction of the same peer
    if (sendPeer >= 0) {
      const int b = findBlock(recvIndex_, rank, channel, sendPeer);
      if (b >= 0 && bl[b].sendPeer == kNone) {
        setSendPeer(rank, b, sendPeer);
        return b;
      }
    } else {
      const int b = findBlock(sendIndex_, rank, channel, recvPeer);
      if (b >= 0 && bl[b].recvPeer == kNone) {
        setRecvPeer(rank, b, recvPeer);
        return b;
      }
    }
  }
  return addBlock(rank, sendPeer, recvPeer, channel);
}

int Scheduler::findBlock(const std::unordered_map<std::uint64_t, int>& index, int rank, int channel, int peer) {
  const auto it = index.find(blockKey(rank, channel, peer));
  return it == index.end() ? kNone : it->second;
}

int Scheduler::addBlock(int rank, int sendPeer, int recvPeer, int channel) {
  auto& bl = blocks_[rank];
  const int b = static_cast<int>(bl.size());
  bl.push_back({kNone, kNone, channel, {}});
  if (sendPeer >= 0) setSendPeer(rank, b, sendPeer);
  if (recvPeer >= 0) setRecvPeer(rank, b, recvPeer);
  return b;
}

void Scheduler::setSendPeer(int rank, int b, int peer) {
  Block& blk = blocks_[rank][b];
  blk.sendPeer = peer;
  sendIndex_.emplace(blockKey(rank, blk.channel, peer), b);
}

void Scheduler::setRecvPeer(int rank, int b, int peer) {
  Block& blk = blocks_[rank][b];
  blk.recvPeer = peer;
  recvIndex_.emplace(blockKey(rank, blk.channel, peer), b);
}

void Scheduler::place() {
  blocks_.assign(n(), {});
  sendIndex_.clear();
  recvIndex_.clear();
  // Fusion and placement in creation order (a topological order), so the keys of fused steps are final before
  // anything that depends on them is looked at.
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    Op& o = ops_[i];
    if (o.kind == OpKind::Copy || o.absorbed) continue;
    const Hop& h = hops_[o.hop];
    if (o.kind == OpKind::Send) {
      // A send fed by exactly one receive of the value it forwards becomes a receive-and-forward step.
      if (fuse_ && o.depCount == 1) {
        const int g = deps_[o.depBegin];
        Op& r = ops_[g];
        if (r.kind == OpKind::Recv && r.fusedSend == kNone && r.dst == o.src && r.tb != kNone &&
            hops_[r.hop].channel == h.channel) {
          const Block& cur = blocks_[o.rank][r.tb];
          if (cur.sendPeer == h.dst || cur.sendPeer == kNone) {
            // The receive's block must also be the (only) block sending to h.dst on this channel.
            const int b = blockFor(o.rank, h.channel, h.dst, hops_[r.hop].src, false);
            if (b == r.tb) {
              r.fusedSend = static_cast<int>(i);
              o.absorbed = true;
              o.fusedInto = g;
              o.tb = r.tb;
              ++fused_;
              continue;
            }
          }
        }
      }
      o.tb = blockFor(o.rank, h.channel, h.dst, kNone, true);
    } else {
      // A receive whose value is forwarded joins the block sending there, so the two can fuse.
      if (o.forwardTo != kNone) o.tb = blockFor(o.rank, h.channel, o.forwardTo, h.src, true);
      if (o.tb == kNone) o.tb = blockFor(o.rank, h.channel, kNone, h.src, true);
    }
  }
  // Local copies go to the block of their latest dependency (or the rank's first block).
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    Op& o = ops_[i];
    if (o.kind != OpKind::Copy) continue;
    int best = kNone;
    for (int d = 0; d < o.depCount; ++d) best = ops_[deps_[o.depBegin + d]].tb;  // the latest created
    if (best == kNone) {
      if (blocks_[o.rank].empty()) blocks_[o.rank].push_back({kNone, kNone, 0, {}});
      best = 0;
    }
    o.tb = best;
  }
  // Every op but a fused send is one step of its block, whatever the order.
  std::vector<std::vector<int>> steps(n());
  for (int r = 0; r < n(); ++r) steps[r].assign(blocks_[r].size(), 0);
  for (const Op& o : ops_) {
    if (!o.absorbed) ++steps[o.rank][o.tb];
  }
  // One block per (peer, direction, channel) means blocks per channel also bound the peers per channel.
  maxSteps_ = maxPerChannel_ = maxPerRank_ = 0;
  std::vector<int> perChannel(ch_);
  for (int r = 0; r < n(); ++r) {
    const auto& bl = blocks_[r];
    std::fill(perChannel.begin(), perChannel.end(), 0);
    for (std::size_t b = 0; b < bl.size(); ++b) {
      maxSteps_ = std::max(maxSteps_, steps[r][b]);
      ++perChannel[bl[b].channel];
    }
    maxPerRank_ = std::max(maxPerRank_, static_cast<int>(bl.size()));
    for (int c = 0; c < ch_; ++c) maxPerChannel_ = std::max(maxPerChannel_, perChannel[c]);
  }
  // Only placement looks blocks up; a layout waiting to be ordered need not keep the maps.
  decltype(sendIndex_)().swap(sendIndex_);
  decltype(recvIndex_)().swap(recvIndex_);
}

void Scheduler::keepPlacementOrder() {
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const Op& o = ops_[i];
    if (!o.absorbed) blocks_[o.rank][o.tb].ops.push_back(static_cast<int>(i));
  }
}

Schedule Scheduler::emit(bool deps) const {
  Schedule s;
  s.name = in_.name;
  s.collective = in_.collective;
  s.root = in_.root;
  s.protocol = proto_;
  s.nRanks = n();
  s.nChannels = ch_;
  s.chunksPerLoop = chunksPerLoop();
  s.inPlace = true;
  s.outOfPlace = true;
  s.ranks.resize(n());
  // Position of every op: (block, step index).
  std::vector<std::pair<int, int>> at(ops_.size(), {kNone, kNone});
  for (int r = 0; r < n(); ++r) {
    for (std::size_t b = 0; b < blocks_[r].size(); ++b) {
      const auto& ops = blocks_[r][b].ops;
      for (std::size_t k = 0; k < ops.size(); ++k) {
        at[ops[k]] = {static_cast<int>(b), static_cast<int>(k)};
        if (ops_[ops[k]].fusedSend != kNone) at[ops_[ops[k]].fusedSend] = at[ops[k]];
      }
    }
  }
  std::vector<int> latest;
  std::vector<int> touched;
  for (int r = 0; r < n(); ++r) {
    core::RankProgram& rp = s.ranks[r];
    rp.rank = r;
    const core::BufferSizes sizes = [&] {
      core::BufferSizes b;
      b.input = in_.collective == Collective::AllGather ? share() : chunksPerLoop();
      b.output = in_.collective == Collective::ReduceScatter ? share() : chunksPerLoop();
      return b;
    }();
    rp.inputChunks = sizes.input;
    rp.outputChunks = sizes.output;
    rp.scratchChunks = scratchCount_[r];
    latest.assign(blocks_[r].size(), kNone);
    for (std::size_t b = 0; b < blocks_[r].size(); ++b) {
      const Block& blk = blocks_[r][b];
      core::ThreadBlock tb;
      tb.id = static_cast<int>(b);
      tb.sendPeer = blk.sendPeer;
      tb.recvPeer = blk.recvPeer;
      tb.channel = blk.channel;
      tb.steps.reserve(blk.ops.size());
      for (std::size_t k = 0; k < blk.ops.size(); ++k) {
        const Op& o = ops_[blk.ops[k]];
        core::Step st;
        st.count = 1;
        st.srcBuf = o.src.buf;
        st.srcOff = o.src.index;
        st.dstBuf = o.dst.buf;
        st.dstOff = o.dst.index;
        switch (o.kind) {
          case OpKind::Send:
            st.op = StepOp::Send;
            break;
          case OpKind::Copy:
            st.op = StepOp::Copy;
            break;
          case OpKind::Recv:
            if (o.fusedSend != kNone) {
              st.op = o.reduce ? StepOp::RecvReduceCopySend : StepOp::RecvCopySend;
            } else {
              st.op = o.reduce ? StepOp::RecvReduceCopy : StepOp::Recv;
            }
            break;
        }
        // Dependencies on other blocks: only the latest step of each block is needed.
        touched.clear();
        auto collect = [&](const Op& x) {
          for (int d = 0; d < x.depCount; ++d) {
            const int dep = deps_[x.depBegin + d];
            const auto [db, ds] = at[dep];
            if (db == static_cast<int>(b) || db == kNone) continue;
            if (latest[db] == kNone) touched.push_back(db);
            latest[db] = std::max(latest[db], ds);
          }
        };
        if (deps) {
          collect(o);
          if (o.fusedSend != kNone) collect(ops_[o.fusedSend]);
        }
        std::sort(touched.begin(), touched.end());
        for (int db : touched) {
          st.deps.push_back({db, latest[db]});
          latest[db] = kNone;
        }
        tb.steps.push_back(std::move(st));
      }
      rp.threadBlocks.push_back(std::move(tb));
    }
  }
  core::recomputeHasDep(s);
  return s;
}

}  // namespace detail

namespace {

// Memory guards (about 40 bytes per rank-chunk pair and 200 per transfer at the peak).
constexpr std::uint64_t kMaxStateEntries = std::uint64_t{1} << 27;
constexpr std::uint64_t kMaxHops = std::uint64_t{1} << 24;

int ceilDiv(std::uint64_t a, std::uint64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

Protocol chooseProtocol(const IntentProgram& intent, std::uint64_t sizeBytes) {
  if (sizeBytes == 0 || intent.nChunks() <= 0) return Protocol::Simple;
  int bufferChunks = intent.nChunks();
  if (intent.collective == Collective::AllToAll && intent.nRanks > 0) bufferChunks /= intent.nRanks;
  const double chunk = static_cast<double>(sizeBytes) / std::max(bufferChunks, 1);
  if (chunk <= 16.0 * 1024) return Protocol::LL;
  if (chunk <= 512.0 * 1024) return Protocol::LL128;
  return Protocol::Simple;
}

namespace {

core::Diagnostic failure(std::string m) { return core::Diagnostic{"<compiler>", 0, 0, std::move(m)}; }

// Past this many channels the limit on steps is not checked in advance.
constexpr int kMaxChannelsChecked = 64;

// Whether a build with `from` channels, or with a count the compiler may go on to from there, may meet the limit on
// steps by the bounds. From a build over the limit the compiler goes to a multiple of its count, to one more (where
// more channels did not lower the steps), or to the executor's most, where it stops: so every count from `from` to
// the most may come. `steps`: the bound per channel count, kept across the rebuilds of one compile.
// The bound's steps with `channels` channels, counted once per compile into `steps`.
int boundAt(detail::LimitBounds& least, int channels, std::map<int, int>& steps) {
  auto [it, fresh] = steps.try_emplace(channels, 0);
  if (fresh) it->second = least.steps(channels);
  return it->second;
}

bool stepsInReach(detail::LimitBounds& least, int from, const ExecutorLimits& lim, std::map<int, int>& steps) {
  for (int c = from; c <= lim.maxChannels; ++c) {
    if (boundAt(least, c, steps) <= lim.maxStepsPerBlock) return true;
  }
  return false;
}

std::string stepsOutOfReach(int channels, const ExecutorLimits& lim) {
  return fmt::format(
      "a thread block needs more than {} steps with {} channel{} and with every channel count the compiler would go "
      "on to; the executor allows {} steps per block and {} channels: use fewer parts or a program with fewer hops "
      "per rank",
      lim.maxStepsPerBlock, channels, channels == 1 ? "" : "s", lim.maxStepsPerBlock, lim.maxChannels);
}

// `atLeast`: counted by LimitBounds, not by a build.
std::string tooManyBlocks(int perChannel, int perRank, int channels, const ExecutorLimits& lim, bool atLeast) {
  return fmt::format(
      "a rank needs {}{} thread blocks on one channel ({} in all) with {} channel{}; the executor allows {} per "
      "channel and {} per rank: use fewer peers per rank (e.g. a hierarchical program) or fewer channels",
      atLeast ? "at least " : "", perChannel, perRank, channels, channels == 1 ? "" : "s", lim.maxBlocksPerChannel,
      lim.maxBlocksPerRank);
}

std::string tooManySteps(int steps, int channels, const ExecutorLimits& lim) {
  return fmt::format(
      "a thread block needs {} steps with {} channels; the executor allows {} steps per block and {} channels: use "
      "fewer parts or a program with fewer hops per rank",
      steps, channels, lim.maxStepsPerBlock, lim.maxChannels);
}

// compile()'s work up to the schedule: with `ordered` false, the blocks keep their steps in creation order
// (compileLayout). Both take the same decisions (pairing, more channels) from the placement, before any order.
// The scheduler returned met the executor's limits.
core::Result<std::unique_ptr<detail::Scheduler>> schedule(const IntentProgram& intent, const Topology& topology,
                                                          const CompileOptions& options, bool ordered) {
  if (std::string e = core::validateIntent(intent); !e.empty()) return failure("malformed intent program: " + e);
  if (topology.nRanks() != intent.nRanks) {
    return failure(
        fmt::format("the program was expanded for {} ranks but the topology has {}", intent.nRanks, topology.nRanks()));
  }
  if (options.channels < 0 || options.slices < 0) return failure("channels and slices must not be negative");
  const ExecutorLimits& lim = options.limits;
  const Protocol proto = options.protocol.value_or(chooseProtocol(intent, options.sizeBytes));
  int channels = options.channels;
  if (channels == 0) {
    // Simple pays a synchronisation per step; parallel blocks per connection hide it once chunks are large.
    channels = 1;
    if (proto == Protocol::Simple && options.sizeBytes > 0) {
      int bufferChunks = intent.nChunks();
      if (intent.collective == Collective::AllToAll) bufferChunks /= std::max(intent.nRanks, 1);
      const double chunk = static_cast<double>(options.sizeBytes) / std::max(bufferChunks, 1);
      channels = chunk >= 8.0 * 1048576 ? 4 : chunk >= 2.0 * 1048576 ? 2 : 1;
    }
  }
  channels = std::min(channels, lim.maxChannels);
  const int slices = options.slices == 0 ? channels : options.slices;
  // The compiler keeps, per rank, where every chunk's value lives, and a few steps per transfer: refuse inputs whose
  // state would not fit in memory before allocating it (an All-to-All over thousands of ranks has ranks^3 entries).
  const std::uint64_t chunks = static_cast<std::uint64_t>(intent.nChunks()) * static_cast<std::uint64_t>(slices);
  const std::uint64_t stateEntries = chunks * static_cast<std::uint64_t>(intent.nRanks);
  const std::uint64_t hops = static_cast<std::uint64_t>(intent.transfers.size()) * static_cast<std::uint64_t>(slices);
  if (chunks > static_cast<std::uint64_t>(core::kMaxScheduleChunks) || stateEntries > kMaxStateEntries ||
      hops > kMaxHops) {
    return failure(fmt::format(
        "too large to compile: {} ranks x {} chunks after slicing ({} transfers); the compiler handles at most {} "
        "rank-chunk pairs and {} transfers: use fewer parts or slices, or a program for fewer ranks",
        intent.nRanks, chunks, hops, kMaxStateEntries, kMaxHops));
  }
  // A build over too many blocks fails for good; one over too many steps is tried again with more channels, up to
  // the executor's most: out of reach when a block has too many at every count from here.
  detail::LimitBounds least(intent, slices);
  if (const detail::LimitBounds::Blocks b = least.blocks(channels);
      b.perChannel > lim.maxBlocksPerChannel || b.perRank > lim.maxBlocksPerRank) {
    return failure(tooManyBlocks(b.perChannel, b.perRank, channels, lim, true));
  }
  std::map<int, int> boundSteps;  // per channel count
  const bool checkSteps = lim.maxChannels <= kMaxChannelsChecked;
  if (checkSteps && !stepsInReach(least, channels, lim, boundSteps)) return failure(stepsOutOfReach(channels, lim));
  int lastSteps = -1;
  bool oneMore = false;  // the channel count was raised by one where more channels did not help
  // From a count whose blocks have `steps` steps, over the limit (`counted` by a build, or the bounds' least): the
  // count to build next, or a refusal.
  auto raise = [&](int steps, bool counted) -> std::optional<std::string> {
    const auto over = [&] { return counted ? tooManySteps(steps, channels, lim) : stepsOutOfReach(channels, lim); };
    // More channels spread the chunks of every connection over more blocks (chunk c rides channel c mod channels);
    // if that did not help last time, a multiple of the count will not now either (a connection's chunks a power of
    // two apart all ride one channel of every count that divides their stride), unless the slices still ride one
    // channel per chunk (more slices than channels), which stops once the channels catch up with the slices. One
    // more channel then, once: a count that does not divide the stride spreads them.
    int need = std::min(lim.maxChannels, channels * ceilDiv(steps, lim.maxStepsPerBlock));
    if (lastSteps >= 0 && steps >= lastSteps && slices <= channels) {
      if (oneMore || channels >= lim.maxChannels) return over();
      need = channels + 1;
      oneMore = true;
    }
    if (need <= channels) return over();
    // Nor is it built again where no build from here can meet the limit by the bounds.
    if (checkSteps && !stepsInReach(least, need, lim, boundSteps)) return stepsOutOfReach(need, lim);
    lastSteps = steps;
    channels = need;
    return std::nullopt;
  };
  // A large build the bounds already put over the limit on steps is not made (on 1024 ranks rail_striped's build
  // with one channel took 2 GB only to be refused): the count goes up as if the build had counted the bound's least.
  // Being less than the count, the bound leads by smaller steps, so a small build is made for its count.
  const bool boundedBuilds = checkSteps && hops > options.boundedBuildsAbove;
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (int b; boundedBuilds && (b = boundAt(least, channels, boundSteps)) > lim.maxStepsPerBlock;) {
      if (std::optional<std::string> refused = raise(b, false)) return failure(*refused);
    }
    for (bool paired : {false, true}) {
      // The fastest ordering first; if its abstract run gets stuck, connections keep creation order; if that is
      // stuck too (a fused receive-and-forward tied to a later send), no fusion, where every wait points to an
      // earlier-created step and the run always completes. A layout is not ordered: it is the first variant's.
      std::unique_ptr<detail::Scheduler> built;
      for (int variant = 0; variant < 3; ++variant) {
        built = std::make_unique<detail::Scheduler>(intent, topology, options, channels, slices, proto, paired);
        if (variant >= 1) built->keepCreationOrder();
        if (variant >= 2) built->disableFusion();
        if (!built->build()) return failure(built->error());
        built->place();
        if (!ordered) {
          built->keepPlacementOrder();
          break;
        }
        if (built->order()) break;
        if (variant == 2) return failure(built->error());
      }
      detail::Scheduler& sch = *built;
      if (sch.maxBlocksPerChannel() > lim.maxBlocksPerChannel || sch.maxBlocksPerRank() > lim.maxBlocksPerRank) {
        if (!paired) continue;
        return failure(tooManyBlocks(sch.maxBlocksPerChannel(), sch.maxBlocksPerRank(), channels, lim, false));
      }
      if (sch.maxBlockSteps() > lim.maxStepsPerBlock) {
        if (std::optional<std::string> refused = raise(sch.maxBlockSteps(), true)) return failure(*refused);
        break;  // rebuild with more channels
      }
      return built;
    }
  }
  return failure("could not meet the executor's limits");
}

// The schedule and its figures from a scheduler whose blocks are ordered.
core::Result<CompileResult> result(const detail::Scheduler& sch, const CompileOptions& options) {
  CompileResult res;
  res.schedule = sch.emit();
  res.protocol = sch.protocol();
  res.channels = sch.channels();
  res.slices = sch.slices();
  res.hops = sch.hops();
  res.fused = sch.fused();
  res.summary = fmt::format(
      "{}, {} channel{}, {} slice{} per chunk, {} transfers ({} receive-and-forward), at most {} thread blocks and "
      "{} steps per block",
      core::toString(res.protocol), res.channels, res.channels == 1 ? "" : "s", res.slices, res.slices == 1 ? "" : "s",
      res.hops, res.fused, sch.maxBlocksPerRank(), sch.maxBlockSteps());
  if (options.verify) {
    res.report = verify(res.schedule);
    if (!res.report.proven) {
      std::string m = "internal error: the compiled schedule is not proven by the verifier:";
      for (std::size_t k = 0; k < res.report.errors.size() && k < 3; ++k) m += "\n  " + res.report.errors[k].str();
      return failure(m);
    }
  }
  return res;
}

}  // namespace

Layout::Layout() = default;
Layout::Layout(Layout&&) noexcept = default;
Layout& Layout::operator=(Layout&&) noexcept = default;
Layout::~Layout() = default;

core::Result<Layout> compileLayout(const IntentProgram& intent, const Topology& topology,
                                   const CompileOptions& options) {
  try {
    auto scheduled = schedule(intent, topology, options, false);
    if (!scheduled) return scheduled.error();
    Layout layout;
    layout.schedule = (*scheduled)->emit(false);
    layout.intent_ = &intent;
    layout.topology_ = &topology;
    layout.options_ = &options;
    layout.sch_ = std::move(scheduled).value();
    return layout;
  } catch (const std::bad_alloc&) {
    return failure(std::string(kOutOfMemory));
  }
}

core::Result<CompileResult> compile(Layout&& layout) {
  try {
    if (!layout.sch_) return failure("internal error: compile() of a layout that was moved from or compiled");
    const std::unique_ptr<detail::Scheduler> sch = std::move(layout.sch_);
    sch->clearOrder();
    if (sch->order()) return result(*sch, *layout.options_);
    // The fused steps cannot be ordered: compile()'s fallbacks (creation order, then no fusion) from the start.
    auto scheduled = schedule(*layout.intent_, *layout.topology_, *layout.options_, true);
    if (!scheduled) return scheduled.error();
    return result(**scheduled, *layout.options_);
  } catch (const std::bad_alloc&) {
    return failure(std::string(kOutOfMemory));
  }
}

core::Result<CompileResult> compile(const IntentProgram& intent, const Topology& topology,
                                    const CompileOptions& options) {
  auto layout = compileLayout(intent, topology, options);
  if (!layout) return layout.error();
  return compile(std::move(layout).value());
}

}  // namespace optiflow::compiler
