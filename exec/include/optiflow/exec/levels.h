// Lowering a verified schedule to per-rank levels, the form stock NCCL can run: each level is some local work (copies
// and reductions) followed by one group of point-to-point sends and receives (one ncclGroupStart/ncclGroupEnd, one
// launch). Inside a group NCCL runs every send and receive concurrently and knows no order between them, so a level
// may only send data that was complete before it started, and may not receive into memory another operation of the
// same group reads or writes. The lowering derives the data dependencies of the schedule (per chunk of every
// buffer, after in-place aliasing) and gives every transfer the earliest level those allow: no level waits on
// itself, and a transfer moves as soon as its data exists, so the schedule's chunk pipelining survives (slices are
// never merged) and its channels stay separate messages.
//
// No CUDA here: the CPU backend (cpu_backend.h) and optiflow-bench's CUDA backend both run this form.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/collective.h"
#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"

namespace optiflow::exec {

// Physical buffers of a rank: the collective's three after in-place aliasing, and the lowering's own temporaries
// (received data that is reduced before it is stored or forwarded, and snapshots of data a send must not see
// overwritten).
enum class Buffer : std::uint8_t { Input, Output, Scratch, Temp };
std::string_view toString(Buffer b);

enum class OpKind : std::uint8_t {
  Send,    // src[count] to peer
  Recv,    // peer's message into dst[count]
  Copy,    // dst = src
  Reduce,  // dst = src + src2 (float32 sum); dst may be src or src2
};
std::string_view toString(OpKind k);

struct Ref {
  Buffer buf = Buffer::Input;
  int offset = 0;  // in chunks
  friend bool operator==(const Ref&, const Ref&) = default;
};

struct Op {
  OpKind kind = OpKind::Copy;
  int peer = -1;    // Send, Recv
  int channel = 0;  // Send, Recv: the schedule's channel
  int seq = 0;      // Send, Recv: index of the message on its connection (sender, receiver, channel)
  Ref src;          // Send, Copy, Reduce
  Ref src2;         // Reduce
  Ref dst;          // Recv, Copy, Reduce
  int count = 1;    // chunks
  friend bool operator==(const Op&, const Op&) = default;
};

// One level of one rank: `local` runs first, in order; then `group` as one group of sends and receives, posted in
// the order given (sorted by peer, channel and message index, so that both ends of every pair post in the same
// order, as NCCL matches a pair's sends and receives in posting order).
struct Level {
  std::vector<Op> local;
  std::vector<Op> group;
};

struct RankLevels {
  int rank = 0;
  int inputChunks = 0;  // physical buffer sizes in chunks (an aliased buffer has 0)
  int outputChunks = 0;
  int scratchChunks = 0;
  int tempChunks = 0;
  std::vector<Level> levels;  // the same count on every rank; a level may be empty on some ranks
};

struct LoweringStats {
  int levels = 0;  // levels in all (the last may hold only local work)
  int groups = 0;  // levels with a group on at least one rank
  std::size_t sends = 0;
  std::size_t copies = 0;
  std::size_t reductions = 0;
  std::size_t snapshots = 0;  // sends that read a copy taken at their point in the schedule (see lower())
  int maxGroupOps = 0;        // most sends and receives in one group of one rank
  int maxTempChunks = 0;
};

struct Lowered {
  std::string name;
  core::Collective collective = core::Collective::AllGather;
  core::BufferMode mode = core::BufferMode::OutOfPlace;
  int nRanks = 0;
  int chunkUnits = 1;  // the buffer (nccl-tests' size) is this many chunks: see chunkElements()
  std::vector<RankLevels> ranks;
  LoweringStats stats;
};

// Lowers `schedule` in `mode` (one of the modes it supports). The schedule should be verified; whatever it is, a
// problem comes back as a diagnostic (file = the schedule's name) and never as a crash: a receive without its send
// or the reverse, message sizes that differ on one connection, references outside a buffer, dependency cycles, and
// data dependencies that no sequence of groups can satisfy (a level that would wait on itself).
//
// A send normally reads its source directly during its group. Where that is impossible (a rank sends a chunk and
// receives into the same chunk in what must be one group, as in a pairwise exchange in place), the send reads a
// snapshot taken by a copy at its place in the schedule, as the schedule's own engines copy data out at send time.
core::Result<Lowered> lower(const core::Schedule& schedule, core::BufferMode mode);

// Float32 elements per chunk for a buffer of `sizeBytes` (nccl-tests' size: the All-Gather output, the
// Reduce-Scatter input, the buffer of the others): at least 1, rounded down as nccl-tests rounds its counts.
std::uint64_t chunkElements(const Lowered& lowered, std::uint64_t sizeBytes);
// The size actually moved for `sizeBytes` after that rounding.
std::uint64_t effectiveBytes(const Lowered& lowered, std::uint64_t sizeBytes);

// One line: "12 levels (11 groups), 96 sends, 0 copies, 42 reductions, up to 4 ops per group".
std::string summary(const Lowered& lowered);

}  // namespace optiflow::exec
