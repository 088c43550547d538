// MSCCL++ execution plans (the JSON that MSCCL++ v0.10's executor loads, src/core/executor/execution_plan.cc):
// the representation, its one reader and its one writer. The meaning of every field and operation, as the
// executor gives it, is in docs/mscclpp.md; the proof is mscclpp_verifier.h, the export from the schedule IR
// mscclpp_export.h.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/vocabulary.h"

namespace optiflow::compiler::mscclpp {

// The MSCCL++ version whose schema the reader accepts and the writer emits.
inline constexpr std::string_view kPinnedVersion = "0.10.0";

// The executor's limits (src/core/include/execution_common.hpp of v0.10).
inline constexpr int kMaxOperationsPerThreadBlock = 64;  // MAX_OPERATION (a pipeline counts 1 + its inner ops)
inline constexpr int kMaxChannels = 16;                  // MAX_CHANNEL: memory, port and switch channels of a block
inline constexpr int kMaxChannelsPerOperation = 8;       // MAX_CHANNEL_PER_OPERATION
inline constexpr int kMaxDeviceSemaphores = 16;          // MAX_DEVICE_SEMAPHORES
inline constexpr int kMaxDeviceSyncers = 16;             // MAX_DEVICE_SYNCERS (barrier ids)

enum class ChannelType : std::uint8_t { None, Memory, Port, Switch };

// Operation names as the plan spells them ("put", "rres", "ppkt", ...), in the executor's order.
enum class OpType : std::uint8_t {
  Nop,                    // nop: __syncthreads of the block
  Barrier,                // barrier: all blocks of barrier_id (num_threadblocks of them) meet
  Put,                    // put: local src[i] -> remote dst[i]
  PutWithSignal,          // pws: put, then signal (port channels)
  PutWithSignalAndFlush,  // pwsf: put, signal, flush (port channels)
  Get,                    // get: remote src[i] -> local dst[i] (memory channels)
  Copy,                   // copy: local src[0] -> local dst[0]
  Signal,                 // signal: release + semaphore increment on each channel
  Wait,                   // wait: acquire wait on each channel
  Flush,                  // flush: completes the port channels' outstanding puts
  Reduce,                 // re: dst[0] = src[0] + src[1..] (all local)
  ReduceSend,             // res: re, then dst[1..] (remote) = the result
  ReadReduce,             // rre: dst[0] = src[0] + remote src[1..]
  ReadReduceSend,         // rres: rre, then dst[1..] (remote) = the result
  PutPackets,             // ppkt: local src[i] -> remote scratch dst[i] as LL packets
  ReadPutPackets,         // rppkt: local scratch packets src[0] (flag-waited) -> remote scratch dst[i]
  ReduceSendPackets,      // respkt: dst[0] = packets src[1..] + src[0]; packets of the result -> remote dst[1..]
  CopyPackets,            // cpkt: local src[0] -> local scratch dst[0] as packets
  UnpackPackets,          // upkt: local scratch packets src[0] (flag-waited) -> local dst[0]
  ReducePackets,          // repkt: respkt without the remote sends
  ReduceCopyPackets,      // recpkt: recspkt without the remote sends
  ReduceCopySendPackets,  // recspkt: respkt that also writes the result as packets to local scratch dst[1]
  MultiLoadReduceStore,   // glres: switch channel: sum over the group's buffers -> stored to every group buffer
  MultiStore,             // gstore: local src[0] -> every group buffer
  MultiStorePackets,      // gstorepkt: local scratch packets src[0] -> every group scratch as packets
  RelaxedSignal,          // rlxsignal: semaphore increment without release
  RelaxedWait,            // rlxwait: wait without acquire
  Pipeline,               // pipeline: its ops, repeated over iter_context.unit_size slices
  SemAcquire,             // sem_acquire: device semaphores shared by the blocks of a rank
  SemRelease,             // sem_release
};

std::string_view toString(OpType t);
std::optional<OpType> parseOpType(std::string_view name);
std::string_view toString(ChannelType t);  // "memory", "port", "switch", "none"
std::optional<ChannelType> parseChannelType(std::string_view name);
std::string_view bufferLetter(core::BufferKind b);  // "i", "o", "s"

struct BufferRef {
  enum class Kind : std::uint8_t { Local, Remote, Switch };
  Kind kind = Kind::Local;
  core::BufferKind buffer = core::BufferKind::Input;  // Local: the buffer ("type")
  int id = 0;  // Remote: buffer_id (a remote buffer of the block for the op's channel type); Switch: switch_channel_id
  int index = 0;  // first chunk
  int size = 1;   // chunks
  friend bool operator==(const BufferRef&, const BufferRef&) = default;
};

struct Op {
  OpType type = OpType::Nop;
  std::optional<ChannelType> channelType;
  std::vector<int> channelIds;  // indexes into the block's channels of channelType
  std::vector<BufferRef> src;
  std::vector<BufferRef> dst;
  std::vector<int> semaphoreIds;
  std::optional<int> barrierId;
  std::optional<int> numThreadBlocks;
  std::optional<int> tbgId;  // tbg_info: this block's share of a thread-block group
  std::optional<int> tbgSize;
  std::optional<std::string> reduceOp;
  std::uint64_t unitSize = 0;  // pipeline: iter_context.unit_size (bytes)
  int numChunks = 0;           // pipeline: iter_context.num_chunks
  std::vector<Op> ops;         // pipeline: the repeated operations
  friend bool operator==(const Op&, const Op&) = default;
};

// A synchronisation rather than a data move: signals, waits, flushes, semaphores, and the puts of a port channel
// (the proxy moves their data, ordered by the same signals).
bool isControlOp(const Op& o);

struct BlockChannels {
  ChannelType type = ChannelType::Memory;
  std::vector<int> ids;                    // indexes into the GPU's channels of this type (flattened per peer)
  std::optional<core::BufferKind> buffer;  // "buff" (optional)
  friend bool operator==(const BlockChannels&, const BlockChannels&) = default;
};

struct RemoteBufferRefs {
  ChannelType accessType = ChannelType::Memory;
  std::vector<int> ids;  // indexes into the GPU's remote_buffers
  friend bool operator==(const RemoteBufferRefs&, const RemoteBufferRefs&) = default;
};

struct ThreadBlock {
  int id = 0;
  std::vector<Op> ops;
  std::vector<BlockChannels> channels;
  std::vector<RemoteBufferRefs> remoteBufferRefs;
  friend bool operator==(const ThreadBlock&, const ThreadBlock&) = default;
};

struct RankGroup {
  int size = 0;  // chunks of the switch buffer
  std::vector<int> ranks;
  friend bool operator==(const RankGroup&, const RankGroup&) = default;
};

struct Channel {
  ChannelType type = ChannelType::Memory;
  std::vector<int> connectedTo;                             // memory/port: one channel per entry
  core::BufferKind switchBuffer = core::BufferKind::Input;  // switch: buffer_type
  bool legacyBuffKey = false;         // switch: written as "buff" (before v0.10), which v0.10's parser does not read
  std::vector<RankGroup> rankGroups;  // switch
  friend bool operator==(const Channel&, const Channel&) = default;
};

struct RemoteBuffer {
  int rank = 0;  // whose buffer
  core::BufferKind type = core::BufferKind::Input;
  std::vector<ChannelType> accessChannelTypes;
  friend bool operator==(const RemoteBuffer&, const RemoteBuffer&) = default;
};

struct Gpu {
  int id = 0;
  int inputChunks = 0;
  int outputChunks = 0;
  int scratchChunks = 0;
  std::vector<Channel> channels;
  std::vector<RemoteBuffer> remoteBuffers;
  std::vector<int> semaphoreInit;  // semaphores[].init_value
  std::vector<ThreadBlock> threadBlocks;
  friend bool operator==(const Gpu&, const Gpu&) = default;
};

struct Plan {
  std::string name;
  core::Collective collective = core::Collective::AllReduce;
  std::string collectiveName;                        // as written ("allreduce", ...)
  core::Protocol protocol = core::Protocol::Simple;  // Simple or LL
  bool inPlace = false;
  bool reuseResources = false;
  int threadsPerBlock = 1024;
  bool doubleScratchBuffer = false;
  int bufferAlignment = 16;
  std::uint64_t minMessageSize = 0;
  std::uint64_t maxMessageSize = std::numeric_limits<std::uint64_t>::max();
  std::vector<Gpu> gpus;  // gpus[r].id == r
  // Fields v0.10's parser requires that the file left out or spelled the older way (e.g. "a switch channel names
  // its buffer with 'buff'"): the reader accepts such a file so it can be proven, the verifier reports them.
  std::vector<std::string> schemaNotes;
  friend bool operator==(const Plan&, const Plan&) = default;
};

// True when `text` is a JSON object with a top-level "gpus" array (an MSCCL++ plan) rather than OptiFlow's own
// schedule JSON (which has "format"). Never throws.
bool looksLikeMscclppPlan(std::string_view text);

// Reads a plan. Structural problems (malformed JSON, missing fields, wrong types, unknown operation or buffer names,
// gpu ids out of order, values beyond the reader's limits) are a Diagnostic with the field's path, line and column.
// References between parts (channel ids, buffer ids, chunk ranges) are the verifier's. Never throws.
core::Result<Plan> parseMscclppPlan(std::string_view text, std::string_view fileName);

// The plan as JSON in v0.10's schema, fields in the order MSCCL++'s own tools write them. parseMscclppPlan of the
// result gives back `plan` (schemaNotes aside: the writer always uses v0.10's spelling).
std::string writeMscclppPlan(const Plan& plan);

}  // namespace optiflow::compiler::mscclpp
