// The compiler's scheduler (compiler/src: scheduler.cc builds, assigns and emits, scheduler_order.cc orders,
// limit_bounds.cc bounds the executor's limits before a build): the ops, hops and thread blocks a compilation works
// on, shared by those files. Private to the compiler.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/intent.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/topology.h"

namespace optiflow::compiler::detail {

using core::BufferKind;
using core::Collective;
using core::IntentProgram;
using core::Protocol;
using core::Schedule;
using core::Topology;

inline constexpr int kNone = -1;

struct Slot {
  BufferKind buf = BufferKind::Input;
  int index = kNone;  // kNone: the rank holds nothing of the chunk
  bool valid() const { return index >= 0; }
  friend bool operator==(const Slot&, const Slot&) = default;
};

enum class OpKind : std::uint8_t { Send, Recv, Copy };

struct Op {
  int rank = 0;
  OpKind kind = OpKind::Send;
  bool reduce = false;  // Recv: combine with the value at `src`
  int hop = kNone;      // Send/Recv
  Slot src;             // Send: what is read; Recv: the sender's slot (reduce: the local value combined); Copy: from
  Slot dst;             // Send: the peer's slot; Recv/Copy: what is written
  int depBegin = 0;
  int depCount = 0;
  int fusedSend = kNone;  // Recv: the Send op it forwards to (one receive-and-forward step)
  int forwardTo = kNone;  // Recv: the first rank a send fed only by this receive goes to (fusion candidate)
  bool absorbed = false;  // Send: part of a fused step
  int fusedInto = kNone;  // Send: the Recv op whose step carries it
  int tb = kNone;         // index into the rank's blocks
  double dur = 0;         // estimated transfer time (Send) or local copy time
  double up = 0;          // upward rank: this op's work plus the longest chain of work that depends on it
};

struct Hop {
  int src = 0;
  int dst = 0;
  int chunk = 0;  // schedule chunk
  int channel = 0;
  int sendOp = kNone;
  int recvOp = kNone;
};

struct Block {
  int sendPeer = kNone;
  int recvPeer = kNone;
  int channel = 0;
  std::vector<int> ops;
};

// Per rank: where every value lives and who touched every slot last, for the dependency derivation.
struct RankState {
  std::vector<Slot> loc;        // per schedule chunk: where the rank's current value is (index kNone: nothing)
  std::vector<int> writer;      // per canonical slot: the last op that wrote it
  std::vector<int> occupant;    // per canonical slot: the chunk whose current value lives there
  std::vector<int> lastReader;  // per canonical slot: head of the list (in readerPool_) of ops that read it since
  std::unordered_map<std::int64_t, int> scratchOf;  // (chunk, relay?) -> scratch index
  int scratch = 0;
};

// The channel of slice `j` of program chunk `chunk` with `slices` slices per chunk. Up to one slice per channel, a
// chunk's slices travel side by side on different channels (schedule chunk c on channel c mod channels). With more
// slices than channels they travel one after another on one channel and the program chunks are spread over the
// channels instead, so the first slices of a chunk arrive (and can be forwarded) early rather than all slices at the
// end together.
inline int channelOf(int chunk, int j, int slices, int channels, int parts) {
  if (slices <= channels) return (chunk * slices + j) % channels;
  if (channels == 1) return 0;
  // The digit sum of the block in base `channels`, plus the part: blocks that a connection carries are often
  // strided (the same GPU of every node: 8 apart), and a plain modulo would put them all on one channel.
  parts = std::max(1, parts);
  int digits = 0;
  for (int b = chunk / parts; b > 0; b /= channels) digits += b % channels;
  return (digits + chunk % parts) % channels;
}

// Lower bounds on what the executor's limits count, from the intent alone, before anything is built: they refuse
// only what a build would refuse too, at a small part of its cost (on 1024 ranks a `direct` layout takes seconds
// and a gigabyte to find that a rank needs 1023 blocks per channel). Placement gives every (channel, send peer) and
// every (channel, receive peer) of a rank one block, so a channel has at least as many blocks as distinct peers
// either way; and every send to one peer on one channel (every receive from one) is a step of that block.
class LimitBounds {
 public:
  LimitBounds(const IntentProgram& in, int slices);

  struct Blocks {
    int perChannel = 0;  // of a rank, on its fullest channel
    int perRank = 0;
  };
  Blocks blocks(int channels);
  // The most steps of a block with `channels` channels.
  int steps(int channels);

 private:
  struct Leg {
    int peer = 0;
    int chunk = 0;
  };
  std::span<const Leg> bucket(std::size_t k) const { return {legs_.data() + begin_[k], legs_.data() + begin_[k + 1]}; }
  int& count(int peer, int channel, int channels) {
    return counts_[static_cast<std::size_t>(peer) * static_cast<std::size_t>(channels) +
                   static_cast<std::size_t>(channel)];
  }
  void clear(std::size_t k, int channels);

  int n_;
  int parts_;
  int slices_;
  std::vector<std::size_t> begin_;  // per (rank, direction): where its hops start in legs_
  std::vector<Leg> legs_;
  std::vector<int> counts_;  // per (peer, channel), for one (rank, direction) at a time
};

class Scheduler {
 public:
  Scheduler(const IntentProgram& in, const Topology& topo, const CompileOptions& opt, int channels, int slices,
            Protocol proto, bool paired)
      : in_(in), topo_(topo), opt_(opt), ch_(channels), s_(slices), proto_(proto), paired_(paired) {}

  // Builds hops, ops and dependencies; false with error_ set when the intent is inconsistent.
  bool build();
  // Fusion and thread-block assignment, and the limits' figures (maxBlockSteps, ...), which do not depend on order.
  void place();
  // The order of every block's steps, by list scheduling (scheduler_order.cc); false with error_ set when the steps
  // cannot be ordered (a dependency cycle through a connection's first-in-first-out order).
  bool order();
  // Instead of order(): every block's steps in creation order (compileLayout); clearOrder() empties the blocks again.
  void keepPlacementOrder();
  void clearOrder() {
    for (auto& bl : blocks_) {
      for (Block& b : bl) b.ops.clear();
    }
  }
  // With `deps` false, the steps wait for nothing (a layout's steps are not ordered).
  Schedule emit(bool deps = true) const;

  // Without fusion every wait points to an earlier-created step, so ordering always succeeds: the fallback.
  void disableFusion() { fuse_ = false; }
  void keepCreationOrder() { creationOrder_ = true; }
  Protocol protocol() const { return proto_; }
  int channels() const { return ch_; }
  int slices() const { return s_; }
  int maxBlockSteps() const { return maxSteps_; }
  int maxBlocksPerChannel() const { return maxPerChannel_; }
  int maxBlocksPerRank() const { return maxPerRank_; }
  std::size_t hops() const { return hops_.size(); }
  std::size_t fused() const { return fused_; }
  const std::string& error() const { return error_; }

 private:
  int n() const { return in_.nRanks; }
  int channelOf(int chunk, int j) const { return detail::channelOf(chunk, j, s_, ch_, in_.parts); }
  int share() const { return in_.parts * s_; }  // schedule chunks per block
  int chunksPerLoop() const {
    const Collective c = in_.collective;
    if (c == Collective::Broadcast || c == Collective::Reduce) return share();
    return n() * share();
  }
  // Index of schedule chunk `sc` in the buffers of the collective (see docs/compiler.md, "Buffers").
  Slot initialSlot(int rank, int sc) const;
  Slot finalSlot(int rank, int sc) const;  // where the postcondition wants it, or invalid if not wanted here
  bool finalHolder(int rank, int sc) const { return finalSlot(rank, sc).valid(); }
  Slot receiveSlot(int rank, int sc);  // where a received (non-relayed) value is stored
  Slot relaySlot(int rank, int sc);
  Slot alternateSlot(int rank, int sc, Slot busy);
  bool readInRound(int rank, Slot s, int firstOp);
  int occupantOf(int rank, Slot s) {
    RankState& st = st_[rank];
    const int c = canonical(rank, s);
    growSlots(st, c);
    return st.occupant[c];
  }
  void setOccupant(int rank, Slot s, int chunk) {
    RankState& st = st_[rank];
    const int c = canonical(rank, s);
    growSlots(st, c);
    st.occupant[c] = chunk;
  }
  int canonical(int rank, Slot s) const;
  void growSlots(RankState& st, int index);

  int newOp(int rank, OpKind kind);
  void addDep(std::vector<int>& deps, int op) {
    if (op != kNone) deps.push_back(op);
  }
  void commitDeps(int op, std::vector<int>& deps);
  // Reads / writes for the hazard tracking; each returns the ops the accessor must wait for.
  void readDeps(int rank, Slot s, std::vector<int>& deps);
  void noteRead(int rank, Slot s, int op);
  void writeDeps(int rank, Slot s, std::vector<int>& deps);
  void noteWrite(int rank, Slot s, int op);

  void noteForward(int sendOp, int dst) {
    const Op& o = ops_[sendOp];
    if (o.depCount != 1) return;
    Op& r = ops_[deps_[o.depBegin]];
    if (r.kind == OpKind::Recv && r.forwardTo == kNone) r.forwardTo = dst;
  }

  // A pending receive of one round: the hop, and where its value lands.
  struct PendingRecv {
    int hop;
    bool reduce;
    int finalDst;  // the transfer's destination (a relay's second hop is created when the first one lands)
  };
  // build()'s phases, in order.
  // Every rank starts holding what the collective's input gives it; the hazard tracking starts from there.
  void placeInitialValues(int chunks);
  // Phase 1 of a round: every send of transfers [first, end) reads the value as it was when the round began.
  bool sendRound(std::size_t first, std::size_t end, std::vector<PendingRecv>& pending, std::vector<int>& deps);
  // Phase 2 of a round: the receives, in list order (several reductions into one slot are chained by their hazards).
  bool receiveRound(std::vector<PendingRecv>& pending, int roundFirstOp, std::vector<int>& deps);
  // One receive: where its value lands, its hazards, and for a relay the second hop it feeds.
  bool receive(const PendingRecv& pd, int roundFirstOp, std::vector<PendingRecv>& pending, std::vector<int>& deps);
  // A send over `h` of the value in `from`, ordered after what wrote it; its receive joins `pending`.
  void addSend(Hop h, Slot from, bool reduce, int finalDst, std::vector<PendingRecv>& pending, std::vector<int>& deps);
  // Values the postcondition wants in the output but that are elsewhere are copied there at the end.
  bool copyToFinal(int chunks, std::vector<int>& deps);
  // The hazard state is only needed while building: keep the scratch sizes, free the rest before scheduling.
  void dropHazardState();

  double hopDuration(int src, int dst) const;
  void estimate();
  int blockFor(int rank, int channel, int sendPeer, int recvPeer, bool create);
  static std::uint64_t blockKey(int rank, int channel, int peer) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 40) ^
           (static_cast<std::uint64_t>(static_cast<std::uint32_t>(channel)) << 24) ^ static_cast<std::uint32_t>(peer);
  }
  static int findBlock(const std::unordered_map<std::uint64_t, int>& index, int rank, int channel, int peer);
  int addBlock(int rank, int sendPeer, int recvPeer, int channel);
  void setSendPeer(int rank, int b, int peer);
  void setRecvPeer(int rank, int b, int peer);

  const IntentProgram& in_;
  const Topology& topo_;
  const CompileOptions& opt_;
  int ch_;
  int s_;
  Protocol proto_;
  bool paired_;
  bool fuse_ = true;
  bool creationOrder_ = false;
  std::string error_;

  std::vector<Op> ops_;
  std::vector<int> deps_;
  std::vector<Hop> hops_;
  std::vector<RankState> st_;
  struct ReaderLink {
    int op;
    int next;
  };
  std::vector<ReaderLink> readerPool_;  // singly linked reader lists of all slots (one allocation, not one per slot)
  std::vector<std::vector<Block>> blocks_;  // per rank
  // (rank, channel, peer) -> the rank's block sending to / receiving from that peer on that channel (blockFor)
  std::unordered_map<std::uint64_t, int> sendIndex_, recvIndex_;
  std::vector<int> scratchCount_;
  std::size_t fused_ = 0;
  int maxSteps_ = 0;
  int maxPerChannel_ = 0;
  int maxPerRank_ = 0;
};

}  // namespace optiflow::compiler::detail
