// The schedule IR: what every producer (compiler, importers, fixtures) emits and every consumer (verifier,
// simulator, reference executor, exporters) reads. It maps one-to-one onto MSCCL XML: per rank, thread blocks
// with one send peer and one receive peer on a channel, each an ordered list of steps over chunk ranges.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/vocabulary.h"

namespace optiflow::core {

enum class BufferKind : std::uint8_t { Input, Output, Scratch };

// Step operations, named after what they do; the MSCCL XML letters are in comments.
enum class StepOp : std::uint8_t {
  Send,                // s:    send src[cnt] to the block's send peer
  Recv,                // r:    receive cnt chunks from the recv peer into dst
  RecvCopySend,        // rcs:  receive into dst and forward the same data to the send peer
  RecvReduceSend,      // rrs:  receive, combine with src, forward the result (nothing stored)
  RecvReduceCopy,      // rrc:  receive, dst = src (+) received
  RecvReduceCopySend,  // rrcs: receive, dst = src (+) received, forward dst
  Copy,                // cpy:  dst = src (local)
  Reduce,              // re:   dst = dst (+) src (local)
  Nop,                 // nop:  carries a dependency only
};

// A dependency on another step of the same rank: thread block id (not index) and step index in that block.
struct StepRef {
  int tb = -1;
  int step = -1;
  friend bool operator==(const StepRef&, const StepRef&) = default;
};

// Both buffer references are kept as written, as MSCCL XML does: for a send the dst names where the data lands on
// the peer, for a receive the src names where it came from. Only opReadsSrc/opWritesDst say which are local.
// The one-byte fields come first so that a step packs into 40 bytes, not 56: a schedule of 1024 GPUs has millions.
struct Step {
  StepOp op = StepOp::Nop;
  BufferKind srcBuf = BufferKind::Input;
  BufferKind dstBuf = BufferKind::Output;
  bool hasDep = false;  // some other step waits on this one (MSCCL publishes a flag only then)
  int srcOff = -1;      // -1 where the file gives none
  int dstOff = -1;
  int count = 1;              // contiguous chunks moved
  std::vector<StepRef> deps;  // steps of other blocks on this rank that must complete first
  friend bool operator==(const Step&, const Step&) = default;
};
static_assert(sizeof(Step) == 16 + sizeof(std::vector<StepRef>), "Step has padding again");

struct ThreadBlock {
  int id = 0;
  int sendPeer = -1;
  int recvPeer = -1;
  int channel = 0;
  std::vector<Step> steps;
  friend bool operator==(const ThreadBlock&, const ThreadBlock&) = default;
};

// TE-CCL/TACCL extension: a local input->output copy done before the schedule starts.
struct LocalCopy {
  int inputOffset = 0;
  int outputOffset = 0;
  friend bool operator==(const LocalCopy&, const LocalCopy&) = default;
};

struct RankProgram {
  int rank = 0;
  int inputChunks = 0;    // as declared (MSCCL i_chunks); 0 is allowed where the buffer aliases another
  int outputChunks = 0;   // MSCCL o_chunks
  int scratchChunks = 0;  // MSCCL s_chunks
  std::vector<ThreadBlock> threadBlocks;
  std::vector<LocalCopy> localCopies;
  friend bool operator==(const RankProgram&, const RankProgram&) = default;
};

// Which MSCCL XML dialect a schedule came from or should be written as.
enum class MscclDialect : std::uint8_t { New, OldRuntime, Old };

struct Schedule {
  std::string name;
  Collective collective = Collective::AllGather;
  std::string customKind;  // for Collective::Custom: the name of the postcondition (e.g. "alltonext")
  int root = 0;            // Broadcast and Reduce
  Protocol protocol = Protocol::Simple;
  int nRanks = 0;
  int nChannels = 1;
  int chunksPerLoop = 1;  // MSCCL nchunksperloop: the buffer is cut into this many chunks per iteration
  bool inPlace = false;
  bool outOfPlace = true;
  std::uint64_t minBytes = 0;
  std::uint64_t maxBytes = 0;        // 0 = no upper limit
  std::optional<std::string> redop;  // written by TACCL/TE-CCL; kept for lossless round trips
  std::optional<int> nThreads;       // old runtime's optional nthreads
  MscclDialect dialect = MscclDialect::New;
  std::vector<RankProgram> ranks;  // ranks[r].rank == r
  friend bool operator==(const Schedule&, const Schedule&) = default;
};

std::string_view toString(BufferKind b);
std::string_view toString(StepOp op);

// What each op touches, so consumers do not each re-derive it.
bool opReceives(StepOp op);
bool opSends(StepOp op);
bool opReadsSrc(StepOp op);   // reads the local src range
bool opWritesDst(StepOp op);  // writes the local dst range
bool opReduces(StepOp op);

// Index of the block with this id in rp.threadBlocks, or -1.
int findThreadBlock(const RankProgram& rp, int tbId);

// Recomputes Step::hasDep from the dependencies actually present.
void recomputeHasDep(Schedule& s);

// Total number of steps over all ranks and blocks.
std::size_t totalSteps(const Schedule& s);

}  // namespace optiflow::core
