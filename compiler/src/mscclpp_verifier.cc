// The proof of MSCCL++ plans. The plan is unrolled into events (one per operation, per pipeline iteration), with
// edges for what orders them in the executor (nop and barrier inside a rank; signal -> wait, packet write -> packet
// read, semaphore release -> acquire between blocks and ranks). Each event reads and writes chunk slices ("cells");
// a race is two accesses of one cell, one a write, that no path orders. Paths are answered with vector clocks
// over a chain decomposition of the event graph (chains are built along program-order edges in topological order),
// once for all edges (control) and once for the edges that also order memory (no relaxed signal/wait). Then the
// events run in a topological order over symbolic values (sums of input cells) and the outputs are compared with
// the collective's postcondition. runPlan runs the same events over real bytes in random topological orders.
#include "optiflow/compiler/mscclpp_verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "optiflow/core/collective.h"

namespace optiflow::compiler::mscclpp {

namespace {

using core::BufferKind;
using core::BufferMode;

constexpr int kSelf = -1;   // an access that ends with its own event
constexpr int kNever = -2;  // an access that nothing is known to complete (a port put never flushed)
constexpr int kMaxCellsPerChunk = 64;
constexpr std::int64_t kClockBudget = std::int64_t{1} << 26;
constexpr std::int64_t kMaxCells = std::int64_t{1} << 22;
constexpr std::int64_t kMaxEvents = std::int64_t{1} << 20;
constexpr std::int64_t kMaxAccesses = std::int64_t{1} << 24;

enum class EventKind : std::uint8_t { Start, End, BlockEnd, Op, BarrierJoin };
enum class Combine : std::uint8_t { Copy, Ordered, Unordered };

struct Pred {
  int event = 0;
  bool memory = true;  // also orders memory (false: a relaxed signal/wait)
};

struct Event {
  EventKind kind = EventKind::Op;
  int rank = -1;
  int tb = -1;  // block index (== id)
  int op = -1;
  int inner = -1;  // operation inside a pipeline
  int iter = 0;
  const Op* o = nullptr;
  std::vector<Pred> preds;
};

struct RangeAccess {
  std::vector<int> cells;
  bool packet = false;
  int end = kSelf;
};

struct Xfer {
  std::vector<RangeAccess> srcs;
  std::vector<RangeAccess> dsts;
  Combine combine = Combine::Copy;
};

struct CellInfo {
  int rank = 0;
  BufferKind buf = BufferKind::Input;
  int chunk = 0;
  int sub = 0;
};

struct SyncUse {
  int event = 0;
  int tb = 0;
  bool relaxed = false;
};

struct ChannelEnd {
  int peer = -1;
  int ordinal = 0;  // among this rank's channels of the type to that peer
};

struct NvlsGroup {
  std::vector<int> ranks;
  BufferKind buffer = BufferKind::Input;
  int size = 0;
};

struct PendingPort {
  int event = 0;
  int xfer = 0;
  int range = 0;
  bool isSrc = false;
  int channel = 0;  // GPU-level port channel index
};

struct BarrierUse {
  int tb = 0;
  int arrive = 0;
  int leave = 0;
  int expected = 0;
};

bool isPacketOp(OpType t) {
  switch (t) {
    case OpType::PutPackets:
    case OpType::ReadPutPackets:
    case OpType::ReduceSendPackets:
    case OpType::CopyPackets:
    case OpType::UnpackPackets:
    case OpType::ReducePackets:
    case OpType::ReduceCopyPackets:
    case OpType::ReduceCopySendPackets:
    case OpType::MultiStorePackets:
      return true;
    default:
      return false;
  }
}

std::string_view bufName(BufferKind b) {
  switch (b) {
    case BufferKind::Input:
      return "input";
    case BufferKind::Output:
      return "output";
    case BufferKind::Scratch:
      return "scratch";
  }
  return "?";
}

// A symbolic value: a leaf (one input cell of one rank) or a combination of values.
struct Term {
  int rank = -1;
  int cell = -1;
  Combine combine = Combine::Copy;
  std::vector<std::shared_ptr<const Term>> kids;
  std::vector<std::pair<int, int>> contributions;  // sorted (rank, logical input cell)
};
using TermPtr = std::shared_ptr<const Term>;

std::string shapeOf(const TermPtr& t, std::size_t budget) {
  if (!t) return "?";
  if (t->kids.empty()) return fmt::format("{}", t->rank);
  std::vector<std::string> parts;
  for (const auto& k : t->kids) parts.push_back(shapeOf(k, budget));
  if (t->combine == Combine::Unordered) std::sort(parts.begin(), parts.end());
  std::string out = t->combine == Combine::Unordered ? "{" : "(";
  for (std::size_t i = 0; i < parts.size() && out.size() < budget; ++i) out += (i ? "+" : "") + parts[i];
  out += t->combine == Combine::Unordered ? "}" : ")";
  return out;
}

class Model {
 public:
  Model(const Plan& plan, int iterations, std::size_t maxErrors, VerifyReport& report)
      : plan_(plan), iterations_(std::max(1, iterations)), maxErrors_(maxErrors), report_(report) {}

  // Builds events, accesses and synchronization edges. False when the plan is too broken for the later phases.
  bool build();
  // Topological order over all edges; false (with a deadlock finding) on a cycle.
  bool order(std::vector<int>& out, std::mt19937_64* shuffle) const;
  bool clocks(const std::vector<int>& topo);
  void checkRaces();
  void execute(const std::vector<int>& topo, bool reductionOrder);
  bool runBytes(const std::vector<int>& topo, int elements, std::uint64_t seed, PlanRunReport& run) const;
  PlanTiming time(const std::vector<int>& topo, const core::Topology& topology, std::uint64_t sizeBytes,
                  const PlanTimingParams& params) const;

  std::size_t eventCount() const { return events_.size(); }

 private:
  void error(Property p, int rank, int tb, int step, std::string message) {
    report_.proven = false;
    if (report_.errors.size() >= maxErrors_) {
      ++report_.suppressedErrors;
      return;
    }
    report_.errors.push_back(Finding{Severity::Error, p, mode_, rank, tb, step, std::move(message)});
  }
  void warning(Property p, int rank, int tb, int step, std::string message) {
    if (report_.warnings.size() >= maxErrors_) {
      ++report_.suppressedWarnings;
      return;
    }
    report_.warnings.push_back(Finding{Severity::Warning, p, mode_, rank, tb, step, std::move(message)});
  }
  void errorAt(Property p, int event, const std::string& what) {
    const Event& e = events_[static_cast<std::size_t>(event)];
    error(p, e.rank, e.tb, e.op, fmt::format("{}: {}", describe(event), what));
  }
  std::string describe(int event) const;
  std::string cellName(int cell) const;

  bool shape();
  int newEvent(EventKind kind, int rank, int tb, int op, int inner, int iter, const Op* o) {
    events_.push_back(Event{kind, rank, tb, op, inner, iter, o, {}});
    xfers_.emplace_back();
    return static_cast<int>(events_.size()) - 1;
  }
  void addPred(int event, int pred, bool memory = true) {
    if (pred >= 0) events_[static_cast<std::size_t>(event)].preds.push_back(Pred{pred, memory});
  }
  int logicalSize(int rank, BufferKind b) const;
  int cellOf(int rank, BufferKind logical, int chunk, int sub) const;
  // The cells of `ref` in buffer `buf` of `owner`, cut by the op's thread-block group and the pipeline iteration.
  bool cells(int event, int owner, BufferKind buf, const BufferRef& ref, std::vector<int>& out);
  bool describeOp(int event, std::vector<PendingPort>& pending);
  std::optional<ChannelEnd> channel(int event, ChannelType type, std::size_t slot, int* gpuIndex);
  std::optional<std::pair<int, BufferKind>> remote(int event, ChannelType type, const BufferRef& ref);
  const NvlsGroup* nvls(int event, const BufferRef& ref);
  void matchCounters();
  void matchPackets();

 public:
  // Channels that several blocks signal or wait on: where the blocks' uses are ordered one after another by the
  // other edges (e.g. blocks split under the 64-operation limit and chained by semaphores), the j-th wait pairs with
  // the j-th signal in that order; otherwise only the last wait is known to follow every signal. True when edges
  // were added (the caller orders again).
  bool resolveShared(const std::vector<int>& topo);

 private:
  void matchBarriers();

  const Plan& plan_;
  int iterations_;
  std::size_t maxErrors_;
  VerifyReport& report_;
  BufferMode mode_ = BufferMode::OutOfPlace;
  int n_ = 0;
  int cellsPerChunk_ = 1;
  core::Schedule shadow_;
  std::vector<int> rankBase_;                   // first cell of each rank
  std::vector<std::array<int, 3>> bufBase_;     // per rank: first cell of input, output, scratch (physical)
  std::vector<std::array<int, 3>> physChunks_;  // per rank: physical chunks of input, output, scratch
  std::vector<CellInfo> cellInfo_;
  std::vector<Event> events_;
  std::vector<std::vector<Xfer>> xfers_;
  std::vector<int> start_, end_;
  // Per rank and type: the peer of every GPU-level channel, its ordinal, and per block the GPU-level indexes.
  std::vector<std::map<ChannelType, std::vector<ChannelEnd>>> gpuChannels_;
  std::vector<std::vector<NvlsGroup>> nvlsGroups_;
  std::map<std::tuple<int, int, int, int>, std::vector<SyncUse>> signals_, waits_;  // (rank, type, peer, ordinal)
  std::map<std::pair<int, int>, std::vector<SyncUse>> semAcquire_, semRelease_;     // (rank, semaphore)
  std::map<int, std::vector<int>> packetWriters_;                                   // cell -> events
  std::vector<std::pair<int, int>> packetReads_;                                    // (event, cell)
  std::map<std::pair<int, int>, std::vector<BarrierUse>> barriers_;                 // (rank, barrier id)
  std::vector<std::tuple<int, int, int, int>> deferred_;
  // Vector clocks.
  std::vector<int> chain_, pos_;
  int chains_ = 0;
  std::vector<std::vector<std::uint32_t>> memClock_, ctlClock_;

 public:
  bool hb(int a, int b, bool memory) const {
    if (a == b) return true;
    const auto& row = (memory ? memClock_ : ctlClock_)[static_cast<std::size_t>(b)];
    const auto c = static_cast<std::size_t>(chain_[static_cast<std::size_t>(a)]);
    return c < row.size() && row[c] >= static_cast<std::uint32_t>(pos_[static_cast<std::size_t>(a)]);
  }
  const std::vector<int>& starts() const { return start_; }
  std::vector<TermPtr> finalValues_;
};

std::string Model::describe(int event) const {
  const Event& e = events_[static_cast<std::size_t>(event)];
  switch (e.kind) {
    case EventKind::Start:
      return fmt::format("start of rank {}", e.rank);
    case EventKind::End:
      return fmt::format("end of rank {}", e.rank);
    case EventKind::BlockEnd:
      return fmt::format("end of rank {} tb {}", e.rank, e.tb);
    case EventKind::BarrierJoin:
      return fmt::format("barrier of rank {}", e.rank);
    case EventKind::Op:
      break;
  }
  if (e.inner >= 0) {
    return fmt::format("op {} (pipeline iteration {}, inner op {} {})", e.op, e.iter, e.inner, toString(e.o->type));
  }
  return fmt::format("op {} ({})", e.op, toString(e.o->type));
}

std::string Model::cellName(int cell) const {
  const CellInfo& c = cellInfo_[static_cast<std::size_t>(cell)];
  if (cellsPerChunk_ == 1) return fmt::format("rank {} {} chunk {}", c.rank, bufName(c.buf), c.chunk);
  return fmt::format("rank {} {} chunk {} (slice {}/{})", c.rank, bufName(c.buf), c.chunk, c.sub, cellsPerChunk_);
}

int Model::logicalSize(int rank, BufferKind b) const {
  const auto sizes = core::logicalSizes(shadow_, rank);
  switch (b) {
    case BufferKind::Input:
      return sizes.input;
    case BufferKind::Output:
      return sizes.output;
    case BufferKind::Scratch:
      return plan_.gpus[static_cast<std::size_t>(rank)].scratchChunks;
  }
  return 0;
}

int Model::cellOf(int rank, BufferKind logical, int chunk, int sub) const {
  const core::Slot s = logical == BufferKind::Scratch ? core::Slot{BufferKind::Scratch, chunk}
                                                      : core::resolveSlot(shadow_, rank, mode_, logical, chunk);
  const auto b = static_cast<std::size_t>(s.buf);
  return bufBase_[static_cast<std::size_t>(rank)][b] + s.index * cellsPerChunk_ + sub;
}

bool Model::shape() {
  const auto& g0 = plan_.gpus.front();
  n_ = static_cast<int>(plan_.gpus.size());
  mode_ = plan_.inPlace ? BufferMode::InPlace : BufferMode::OutOfPlace;
  report_.modesChecked = {mode_};
  shadow_.collective = plan_.collective;
  shadow_.nRanks = n_;
  shadow_.inPlace = plan_.inPlace;
  shadow_.outOfPlace = !plan_.inPlace;
  switch (plan_.collective) {
    case core::Collective::AllGather:
      shadow_.chunksPerLoop = g0.outputChunks > 0 ? g0.outputChunks : g0.inputChunks * n_;
      break;
    case core::Collective::ReduceScatter:
      shadow_.chunksPerLoop = g0.inputChunks > 0 ? g0.inputChunks : g0.outputChunks * n_;
      break;
    default:
      shadow_.chunksPerLoop = std::max(g0.inputChunks, g0.outputChunks);
      break;
  }
  if (shadow_.chunksPerLoop <= 0) {
    error(Property::Shape, 0, -1, -1, "input_chunks and output_chunks are both 0");
    return false;
  }
  for (const auto& g : plan_.gpus) {
    core::RankProgram rp;
    rp.rank = g.id;
    rp.scratchChunks = g.scratchChunks;
    shadow_.ranks.push_back(rp);
  }
  if (auto why = core::validateShape(shadow_); !why.empty()) {
    error(Property::Shape, -1, -1, -1, why);
    return false;
  }
  bool ok = true;
  for (const auto& g : plan_.gpus) {
    const auto sizes = core::logicalSizes(shadow_, g.id);
    auto checkDeclared = [&](int declared, int logical, std::string_view field, BufferKind b) {
      if (declared == logical) return;
      const auto phys = core::physicalSizes(shadow_, g.id, mode_);
      const int physical = b == BufferKind::Input ? phys.input : phys.output;
      if (declared == 0 && physical == 0) return;  // aliased in place: the plan may leave it out
      error(Property::Shape, g.id, -1, -1,
            fmt::format("{} is {}, but {} on {} ranks with {} chunks needs {}", field, declared,
                        core::toString(plan_.collective), n_, shadow_.chunksPerLoop, logical));
      ok = false;
    };
    checkDeclared(g.inputChunks, sizes.input, "input_chunks", BufferKind::Input);
    checkDeclared(g.outputChunks, sizes.output, "output_chunks", BufferKind::Output);
  }
  if (!ok) return false;

  // Cells: every chunk is cut into pipeline slices and into the parts of the largest thread-block group.
  int groups = 1;
  bool pipelines = false;
  std::set<std::pair<std::uint64_t, int>> ratios;
  for (const auto& g : plan_.gpus) {
    for (const auto& tb : g.threadBlocks) {
      std::vector<const Op*> all;
      for (const auto& op : tb.ops) {
        all.push_back(&op);
        if (op.type == OpType::Pipeline) {
          pipelines = true;
          ratios.insert({op.unitSize, op.numChunks});
          for (const auto& inner : op.ops) all.push_back(&inner);
        }
      }
      for (const Op* op : all) {
        if (!op->tbgSize) continue;
        const int l = std::lcm(groups, *op->tbgSize);
        if (l > kMaxCellsPerChunk) {
          error(Property::Shape, g.id, tb.id, -1,
                fmt::format("thread-block group sizes need {} parts per chunk; the verifier handles up to {}", l,
                            kMaxCellsPerChunk));
          return false;
        }
        groups = l;
        if (*op->tbgId >= *op->tbgSize) {
          error(Property::Reference, g.id, tb.id, -1,
                fmt::format("tbg_info tb_id {} is not below tbg_size {}", *op->tbgId, *op->tbgSize));
          ok = false;
        }
      }
    }
  }
  if (!ok) return false;
  cellsPerChunk_ = groups * (pipelines ? iterations_ : 1);
  if (cellsPerChunk_ > kMaxCellsPerChunk) {
    error(Property::Shape, -1, -1, -1, "too many slices per chunk for the verifier");
    return false;
  }
  if (ratios.size() > 1) {
    warning(Property::Shape, -1, -1, -1,
            "pipelines of different unit_size / num_chunks run different iteration counts at one message size; "
            "the proof runs every pipeline the same number of iterations");
  }
  if (plan_.reuseResources) {
    warning(Property::Shape, -1, -1, -1,
            "reuse_resources: for chunks larger than the executor's fixed scratch the executor folds scratch "
            "offsets; the proof is for chunks that fit");
  }
  for (const auto& note : plan_.schemaNotes) error(Property::Shape, -1, -1, -1, note);

  // Budgets: the proof is linear in cells and events; a hostile file must not make it allocate without bound.
  std::int64_t cellBudget = 0;
  std::int64_t eventBudget = 0;
  for (const auto& g : plan_.gpus) {
    cellBudget += static_cast<std::int64_t>(g.inputChunks + g.outputChunks + g.scratchChunks) * cellsPerChunk_;
    for (const auto& tb : g.threadBlocks) {
      for (const auto& op : tb.ops)
        eventBudget += 1 + static_cast<std::int64_t>(op.ops.size()) * (pipelines ? iterations_ : 1);
    }
  }
  if (cellBudget > kMaxCells || eventBudget > kMaxEvents) {
    report_.beyondBudget = true;
    error(Property::Shape, -1, -1, -1,
          fmt::format("{} chunk slices and {} operation runs are beyond the verifier's budget ({} and {})", cellBudget,
                      eventBudget, kMaxCells, kMaxEvents));
    return false;
  }
  int total = 0;
  for (int r = 0; r < n_; ++r) {
    const auto phys = core::physicalSizes(shadow_, r, mode_);
    const int scratch = plan_.gpus[static_cast<std::size_t>(r)].scratchChunks;
    rankBase_.push_back(total);
    physChunks_.push_back({phys.input, phys.output, scratch});
    bufBase_.push_back(
        {total, total + phys.input * cellsPerChunk_, total + (phys.input + phys.output) * cellsPerChunk_});
    const std::array<BufferKind, 3> kinds{BufferKind::Input, BufferKind::Output, BufferKind::Scratch};
    const std::array<int, 3> counts{phys.input, phys.output, scratch};
    for (std::size_t b = 0; b < 3; ++b) {
      for (int c = 0; c < counts[b]; ++c) {
        for (int s = 0; s < cellsPerChunk_; ++s) cellInfo_.push_back(CellInfo{r, kinds[b], c, s});
      }
    }
    total += (phys.input + phys.output + scratch) * cellsPerChunk_;
  }
  return true;
}

bool Model::cells(int event, int owner, BufferKind buf, const BufferRef& ref, std::vector<int>& out) {
  const Event& e = events_[static_cast<std::size_t>(event)];
  const int size = logicalSize(owner, buf);
  if (ref.size <= 0 || ref.index + ref.size > size) {
    errorAt(Property::Reference, event,
            fmt::format("chunks [{}, {}) of rank {}'s {} buffer, which has {} chunks", ref.index, ref.index + ref.size,
                        owner, bufName(buf), size));
    return false;
  }
  int lo = ref.index * cellsPerChunk_;
  int hi = (ref.index + ref.size) * cellsPerChunk_;
  if (e.o->tbgSize) {
    const int len = hi - lo;
    const int g = *e.o->tbgSize;
    const int t = *e.o->tbgId;
    hi = lo + (t + 1) * len / g;
    lo = lo + t * len / g;
  }
  if (e.inner >= 0) {
    const Op& pipe = plan_.gpus[static_cast<std::size_t>(e.rank)]
                         .threadBlocks[static_cast<std::size_t>(e.tb)]
                         .ops[static_cast<std::size_t>(e.op)];
    const int unit = pipe.numChunks * cellsPerChunk_ / iterations_;
    const int a = lo + e.iter * unit;
    const int b = std::min(a + unit, hi);
    lo = a;
    hi = std::max(a, b);
  }
  out.clear();
  for (int c = lo; c < hi; ++c) out.push_back(cellOf(owner, buf, c / cellsPerChunk_, c % cellsPerChunk_));
  return true;
}

std::optional<ChannelEnd> Model::channel(int event, ChannelType type, std::size_t slot, int* gpuIndex) {
  const Event& e = events_[static_cast<std::size_t>(event)];
  const auto& tb = plan_.gpus[static_cast<std::size_t>(e.rank)].threadBlocks[static_cast<std::size_t>(e.tb)];
  if (slot >= e.o->channelIds.size()) {
    errorAt(Property::Reference, event,
            fmt::format("names {} channels, needs at least {}", e.o->channelIds.size(), slot + 1));
    return std::nullopt;
  }
  const int id = e.o->channelIds[slot];
  std::vector<int> blockList;
  for (const auto& bc : tb.channels)
    if (bc.type == type) blockList.insert(blockList.end(), bc.ids.begin(), bc.ids.end());
  if (id < 0 || id >= static_cast<int>(blockList.size())) {
    errorAt(Property::Reference, event,
            fmt::format("channel id {} but the block has {} {} channels", id, blockList.size(), toString(type)));
    return std::nullopt;
  }
  const int g = blockList[static_cast<std::size_t>(id)];
  const auto& list = gpuChannels_[static_cast<std::size_t>(e.rank)][type];
  if (g < 0 || g >= static_cast<int>(list.size())) {
    errorAt(
        Property::Reference, event,
        fmt::format("block channel {} is GPU {} channel {}, but the GPU has {}", id, toString(type), g, list.size()));
    return std::nullopt;
  }
  if (gpuIndex) *gpuIndex = g;
  return list[static_cast<std::size_t>(g)];
}

std::optional<std::pair<int, BufferKind>> Model::remote(int event, ChannelType type, const BufferRef& ref) {
  const Event& e = events_[static_cast<std::size_t>(event)];
  const auto& gpu = plan_.gpus[static_cast<std::size_t>(e.rank)];
  const auto& tb = gpu.threadBlocks[static_cast<std::size_t>(e.tb)];
  if (ref.kind != BufferRef::Kind::Remote) {
    errorAt(Property::Reference, event, "expects a remote buffer (buffer_id) here");
    return std::nullopt;
  }
  std::vector<int> list;
  for (const auto& rr : tb.remoteBufferRefs)
    if (rr.accessType == type) list.insert(list.end(), rr.ids.begin(), rr.ids.end());
  if (ref.id < 0 || ref.id >= static_cast<int>(list.size())) {
    errorAt(Property::Reference, event,
            fmt::format("buffer_id {} but the block has {} remote buffers for {} channels", ref.id, list.size(),
                        toString(type)));
    return std::nullopt;
  }
  const int k = list[static_cast<std::size_t>(ref.id)];
  if (k < 0 || k >= static_cast<int>(gpu.remoteBuffers.size())) {
    errorAt(Property::Reference, event, fmt::format("remote buffer {} does not exist", k));
    return std::nullopt;
  }
  const auto& rb = gpu.remoteBuffers[static_cast<std::size_t>(k)];
  if (std::find(rb.accessChannelTypes.begin(), rb.accessChannelTypes.end(), type) == rb.accessChannelTypes.end()) {
    errorAt(Property::Reference, event,
            fmt::format("remote buffer {} is not accessible through {} channels", k, toString(type)));
    return std::nullopt;
  }
  return std::make_pair(rb.rank, rb.type);
}

const NvlsGroup* Model::nvls(int event, const BufferRef& ref) {
  const Event& e = events_[static_cast<std::size_t>(event)];
  const auto& tb = plan_.gpus[static_cast<std::size_t>(e.rank)].threadBlocks[static_cast<std::size_t>(e.tb)];
  if (ref.kind != BufferRef::Kind::Switch) {
    errorAt(Property::Reference, event, "expects a switch channel buffer (switch_channel_id) here");
    return nullptr;
  }
  std::vector<int> list;
  for (const auto& bc : tb.channels)
    if (bc.type == ChannelType::Switch) list.insert(list.end(), bc.ids.begin(), bc.ids.end());
  if (ref.id < 0 || ref.id >= static_cast<int>(list.size())) {
    errorAt(Property::Reference, event,
            fmt::format("switch_channel_id {} but the block has {} switch channels", ref.id, list.size()));
    return nullptr;
  }
  const int g = list[static_cast<std::size_t>(ref.id)];
  const auto& groups = nvlsGroups_[static_cast<std::size_t>(e.rank)];
  if (g < 0 || g >= static_cast<int>(groups.size())) {
    errorAt(Property::Reference, event, fmt::format("switch channel {} does not exist", g));
    return nullptr;
  }
  const NvlsGroup& grp = groups[static_cast<std::size_t>(g)];
  if (std::find(grp.ranks.begin(), grp.ranks.end(), e.rank) == grp.ranks.end()) {
    errorAt(Property::Reference, event, fmt::format("switch channel {}'s group does not include rank {}", g, e.rank));
    return nullptr;
  }
  for (int peer : grp.ranks) {
    const auto& theirs = nvlsGroups_[static_cast<std::size_t>(peer)];
    const bool found = std::any_of(theirs.begin(), theirs.end(),
                                   [&](const NvlsGroup& x) { return x.ranks == grp.ranks && x.buffer == grp.buffer; });
    if (!found) {
      errorAt(Property::Reference, event,
              fmt::format("rank {} of the switch group has no switch channel over the same ranks and buffer", peer));
      return nullptr;
    }
  }
  return &grp;
}

bool Model::describeOp(int event, std::vector<PendingPort>& pending) {
  const Event& ev = events_[static_cast<std::size_t>(event)];
  const Op& o = *ev.o;
  const int r = ev.rank;
  auto& xs = xfers_[static_cast<std::size_t>(event)];
  auto local = [&](const BufferRef& ref, RangeAccess& out, bool packet) {
    if (ref.kind != BufferRef::Kind::Local) {
      errorAt(Property::Reference, event, "expects a local buffer (type) here");
      return false;
    }
    if (packet && ref.buffer != BufferKind::Scratch) {
      errorAt(Property::Reference, event,
              fmt::format("packets live in the scratch buffer, but this names the {} buffer", bufName(ref.buffer)));
      return false;
    }
    out.packet = packet;
    return cells(event, r, ref.buffer, ref, out.cells);
  };
  auto far = [&](const BufferRef& ref, ChannelType t, RangeAccess& out, bool packet) {
    const auto rb = remote(event, t, ref);
    if (!rb) return false;
    if (packet && rb->second != BufferKind::Scratch) {
      errorAt(Property::Reference, event,
              fmt::format("packets go to a scratch buffer, but remote buffer {} is rank {}'s {} buffer", ref.id,
                          rb->first, bufName(rb->second)));
      return false;
    }
    out.packet = packet;
    return cells(event, rb->first, rb->second, ref, out.cells);
  };
  auto needChannelType = [&]() -> std::optional<ChannelType> {
    if (!o.channelType || (*o.channelType != ChannelType::Memory && *o.channelType != ChannelType::Port)) {
      errorAt(Property::Reference, event, "needs channel_type \"memory\" or \"port\"");
      return std::nullopt;
    }
    return *o.channelType;
  };
  auto counts = [&](std::size_t minSrc, std::size_t minDst) {
    if (o.src.size() < minSrc || o.dst.size() < minDst) {
      errorAt(Property::Reference, event,
              fmt::format("has {} src_buff and {} dst_buff entries, needs at least {} and {}", o.src.size(),
                          o.dst.size(), minSrc, minDst));
      return false;
    }
    return true;
  };
  auto sameLength = [&](const Xfer& x) {
    std::size_t len = x.srcs.empty() ? x.dsts.front().cells.size() : x.srcs.front().cells.size();
    for (const auto* side : {&x.srcs, &x.dsts}) {
      for (const auto& ra : *side) {
        if (ra.cells.size() != len) {
          errorAt(Property::Reference, event, "its source and destination ranges differ in size");
          return false;
        }
      }
    }
    return true;
  };
  auto signalOn = [&](ChannelType t, std::size_t slot, bool relaxed) {
    int g = 0;
    auto end = channel(event, t, slot, &g);
    if (!end) return false;
    signals_[{end->peer, static_cast<int>(t), r, end->ordinal}].push_back(SyncUse{event, ev.tb, relaxed});
    if (t == ChannelType::Port) {
      for (auto& p : pending) {
        if (!p.isSrc && p.channel == g && p.event != event) {
          xfers_[static_cast<std::size_t>(p.event)][static_cast<std::size_t>(p.xfer)]
              .dsts[static_cast<std::size_t>(p.range)]
              .end = event;
          p.channel = -1;
        }
      }
    }
    return true;
  };
  auto flushOn = [&](int g) {
    for (auto& p : pending) {
      if (p.channel == g && p.event != event) {
        auto& x = xfers_[static_cast<std::size_t>(p.event)][static_cast<std::size_t>(p.xfer)];
        (p.isSrc ? x.srcs : x.dsts)[static_cast<std::size_t>(p.range)].end = event;
        p.channel = -1;
      }
    }
  };
  const bool ll = plan_.protocol == core::Protocol::LL;
  if (isPacketOp(o.type) && !ll) {
    errorAt(Property::Shape, event,
            "a packet operation in a Simple plan: the executor sizes scratch for packets only when protocol is LL");
    return false;
  }

  switch (o.type) {
    case OpType::Nop:
    case OpType::Barrier:
    case OpType::Pipeline:
      return true;
    case OpType::Put:
    case OpType::PutWithSignal:
    case OpType::PutWithSignalAndFlush:
    case OpType::PutPackets: {
      const auto t = needChannelType();
      if (!t) return false;
      const bool packet = o.type == OpType::PutPackets;
      if (o.type != OpType::Put && !packet && *t == ChannelType::Memory) {
        errorAt(Property::Shape, event,
                fmt::format("{} on a memory channel: MSCCL++ {} sends no signal for it (only port channels "
                            "signal from a put)",
                            toString(o.type), kPinnedVersion));
        return false;
      }
      if (!counts(1, 1)) return false;
      if (o.src.size() != o.dst.size()) {
        errorAt(Property::Reference, event,
                fmt::format("has {} sources for {} destinations; the executor pairs them", o.src.size(), o.dst.size()));
        return false;
      }
      for (std::size_t i = 0; i < o.dst.size(); ++i) {
        Xfer x;
        x.srcs.emplace_back();
        x.dsts.emplace_back();
        // A port ppkt copies packets that are already in local scratch (no flag wait); a memory ppkt packs data.
        const bool srcPacketFormat = packet && *t == ChannelType::Port;
        if (!local(o.src[i], x.srcs[0], srcPacketFormat)) return false;
        x.srcs[0].packet = false;  // a plain read (no flag wait) in both cases
        if (!far(o.dst[i], *t, x.dsts[0], packet)) return false;
        if (!sameLength(x)) return false;
        if (*t == ChannelType::Port) {
          int g = 0;
          if (!channel(event, *t, i, &g)) return false;
          const int xi = static_cast<int>(xs.size());
          if (o.type == OpType::PutWithSignalAndFlush) {
            // completes here
          } else {
            pending.push_back(PendingPort{event, xi, 0, true, g});
            if (o.type == OpType::Put) pending.push_back(PendingPort{event, xi, 0, false, g});
          }
          if (o.type == OpType::Put) x.dsts[0].end = kNever;
          x.srcs[0].end = o.type == OpType::PutWithSignalAndFlush ? kSelf : kNever;
          if (packet) x.dsts[0].end = kSelf;  // the flag travels with the data
        }
        xs.push_back(std::move(x));
        if (*t == ChannelType::Port && (o.type == OpType::PutWithSignal || o.type == OpType::PutWithSignalAndFlush)) {
          if (!signalOn(*t, i, false)) return false;
        }
      }
      if (packet && *t == ChannelType::Port) {
        // the local read is issued by the proxy later; flush completes it
      }
      return true;
    }
    case OpType::Get: {
      if (o.channelType != ChannelType::Memory) {
        errorAt(Property::Reference, event, "get works on memory channels only");
        return false;
      }
      if (!counts(1, 1) || o.src.size() != o.dst.size()) {
        if (o.src.size() != o.dst.size()) errorAt(Property::Reference, event, "needs as many sources as destinations");
        return false;
      }
      for (std::size_t i = 0; i < o.src.size(); ++i) {
        Xfer x;
        x.srcs.emplace_back();
        x.dsts.emplace_back();
        if (!far(o.src[i], ChannelType::Memory, x.srcs[0], false) || !local(o.dst[i], x.dsts[0], false)) return false;
        if (!sameLength(x)) return false;
        xs.push_back(std::move(x));
      }
      return true;
    }
    case OpType::Copy:
    case OpType::CopyPackets:
    case OpType::UnpackPackets: {
      if (!counts(1, 1)) return false;
      Xfer x;
      x.srcs.emplace_back();
      x.dsts.emplace_back();
      if (!local(o.src[0], x.srcs[0], o.type == OpType::UnpackPackets)) return false;
      if (!local(o.dst[0], x.dsts[0], o.type == OpType::CopyPackets)) return false;
      if (!sameLength(x)) return false;
      xs.push_back(std::move(x));
      return true;
    }
    case OpType::Signal:
    case OpType::RelaxedSignal:
    case OpType::Wait:
    case OpType::RelaxedWait: {
      const auto t = needChannelType();
      if (!t) return false;
      if (o.channelIds.empty()) {
        errorAt(Property::Reference, event, "names no channel");
        return false;
      }
      // The relaxed forms exist for memory channels; on a port channel the executor signals and waits normally.
      const bool relaxed =
          (o.type == OpType::RelaxedSignal || o.type == OpType::RelaxedWait) && *t == ChannelType::Memory;
      for (std::size_t i = 0; i < o.channelIds.size(); ++i) {
        if (o.type == OpType::Signal || o.type == OpType::RelaxedSignal) {
          if (!signalOn(*t, i, relaxed)) return false;
        } else {
          auto end = channel(event, *t, i, nullptr);
          if (!end) return false;
          waits_[{r, static_cast<int>(*t), end->peer, end->ordinal}].push_back(SyncUse{event, ev.tb, relaxed});
        }
      }
      return true;
    }
    case OpType::Flush: {
      if (o.channelType != ChannelType::Port) {
        errorAt(Property::Reference, event, "flush works on port channels only");
        return false;
      }
      const std::size_t flushed = std::min(o.channelIds.size(), o.dst.size());
      if (flushed < o.channelIds.size()) {
        warning(Property::Matching, ev.rank, ev.tb, ev.op,
                fmt::format("{}: names {} channels but has {} dst_buff entries; MSCCL++ {} flushes as many "
                            "channels as there are dst_buff entries",
                            describe(event), o.channelIds.size(), o.dst.size(), kPinnedVersion));
      }
      for (std::size_t i = 0; i < flushed; ++i) {
        int g = 0;
        if (!channel(event, ChannelType::Port, i, &g)) return false;
        flushOn(g);
      }
      return true;
    }
    case OpType::Reduce:
    case OpType::ReduceSend:
    case OpType::ReadReduce:
    case OpType::ReadReduceSend: {
      if (!counts(2, 1)) return false;
      const bool readRemote = o.type == OpType::ReadReduce || o.type == OpType::ReadReduceSend;
      const bool send = o.type == OpType::ReduceSend || o.type == OpType::ReadReduceSend;
      if ((readRemote || (send && o.dst.size() > 1)) && o.channelType != ChannelType::Memory) {
        errorAt(Property::Reference, event, "reads or writes peers' memory and needs channel_type \"memory\"");
        return false;
      }
      if (!send && o.dst.size() > 1) {
        errorAt(Property::Reference, event, "has more than one destination but sends nothing");
        return false;
      }
      Xfer x;
      x.combine = Combine::Ordered;
      x.srcs.resize(o.src.size());
      x.dsts.resize(o.dst.size());
      if (!local(o.src[0], x.srcs[0], false)) return false;
      for (std::size_t i = 1; i < o.src.size(); ++i) {
        if (readRemote ? !far(o.src[i], ChannelType::Memory, x.srcs[i], false) : !local(o.src[i], x.srcs[i], false))
          return false;
      }
      if (!local(o.dst[0], x.dsts[0], false)) return false;
      for (std::size_t i = 1; i < o.dst.size(); ++i)
        if (!far(o.dst[i], ChannelType::Memory, x.dsts[i], false)) return false;
      if (!sameLength(x)) return false;
      xs.push_back(std::move(x));
      return true;
    }
    case OpType::ReadPutPackets: {
      const auto t = needChannelType();
      if (!t || !counts(1, 1)) return false;
      Xfer x;
      x.srcs.emplace_back();
      if (!local(o.src[0], x.srcs[0], true)) return false;
      for (const auto& d : o.dst) {
        x.dsts.emplace_back();
        if (!far(d, *t, x.dsts.back(), true)) return false;
      }
      if (!sameLength(x)) return false;
      xs.push_back(std::move(x));
      return true;
    }
    case OpType::ReduceSendPackets:
    case OpType::ReducePackets:
    case OpType::ReduceCopySendPackets:
    case OpType::ReduceCopyPackets: {
      const bool copy = o.type == OpType::ReduceCopySendPackets || o.type == OpType::ReduceCopyPackets;
      const bool send = o.type == OpType::ReduceSendPackets || o.type == OpType::ReduceCopySendPackets;
      if (!counts(1, copy ? 2 : 1)) return false;
      const std::size_t localDsts = copy ? 2 : 1;
      if (!send && o.dst.size() > localDsts) {
        errorAt(Property::Reference, event, "has remote destinations but sends nothing");
        return false;
      }
      if (send && o.dst.size() > localDsts && o.channelType != ChannelType::Memory) {
        errorAt(Property::Reference, event, "sends packets to peers and needs channel_type \"memory\"");
        return false;
      }
      Xfer x;
      x.combine = Combine::Ordered;
      // The executor adds the received packets first, then the local data.
      for (std::size_t i = 1; i < o.src.size(); ++i) {
        x.srcs.emplace_back();
        if (!local(o.src[i], x.srcs.back(), true)) return false;
      }
      x.srcs.emplace_back();
      if (!local(o.src[0], x.srcs.back(), false)) return false;
      x.dsts.emplace_back();
      if (!local(o.dst[0], x.dsts.back(), false)) return false;
      if (copy) {
        x.dsts.emplace_back();
        if (!local(o.dst[1], x.dsts.back(), true)) return false;
      }
      for (std::size_t i = localDsts; i < o.dst.size(); ++i) {
        x.dsts.emplace_back();
        if (!far(o.dst[i], ChannelType::Memory, x.dsts.back(), true)) return false;
      }
      if (!sameLength(x)) return false;
      xs.push_back(std::move(x));
      return true;
    }
    case OpType::MultiLoadReduceStore:
    case OpType::MultiStore:
    case OpType::MultiStorePackets: {
      if (!counts(1, 1)) return false;
      const NvlsGroup* dg = nvls(event, o.dst[0]);
      if (!dg) return false;
      Xfer x;
      if (o.type == OpType::MultiLoadReduceStore) {
        const NvlsGroup* sg = nvls(event, o.src[0]);
        if (!sg) return false;
        if (sg->ranks != dg->ranks) {
          errorAt(Property::Reference, event, "loads from one switch group and stores to another");
          return false;
        }
        x.combine = Combine::Unordered;
        for (int peer : sg->ranks) {
          x.srcs.emplace_back();
          if (!cells(event, peer, sg->buffer, o.src[0], x.srcs.back().cells)) return false;
        }
      } else {
        x.srcs.emplace_back();
        if (!local(o.src[0], x.srcs.back(), o.type == OpType::MultiStorePackets)) return false;
      }
      const bool packet = o.type == OpType::MultiStorePackets;
      if (packet && dg->buffer != BufferKind::Scratch) {
        errorAt(Property::Reference, event, "stores packets through a switch channel whose buffer is not scratch");
        return false;
      }
      for (int peer : dg->ranks) {
        x.dsts.emplace_back();
        x.dsts.back().packet = packet;
        if (!cells(event, peer, dg->buffer, o.dst[0], x.dsts.back().cells)) return false;
      }
      if (!sameLength(x)) return false;
      xs.push_back(std::move(x));
      return true;
    }
    case OpType::SemAcquire:
    case OpType::SemRelease: {
      const auto& sems = plan_.gpus[static_cast<std::size_t>(r)].semaphoreInit;
      if (o.semaphoreIds.empty()) {
        errorAt(Property::Reference, event, "names no semaphore");
        return false;
      }
      for (int id : o.semaphoreIds) {
        if (id >= static_cast<int>(sems.size())) {
          errorAt(Property::Reference, event, fmt::format("semaphore {} but rank {} declares {}", id, r, sems.size()));
          return false;
        }
        auto& m = o.type == OpType::SemAcquire ? semAcquire_ : semRelease_;
        m[{r, id}].push_back(SyncUse{event, ev.tb, false});
      }
      return true;
    }
  }
  return true;
}

bool Model::build() {
  if (plan_.gpus.empty()) {
    error(Property::Shape, -1, -1, -1, "the plan has no gpus");
    return false;
  }
  if (!shape()) return false;
  // Channels.
  gpuChannels_.resize(static_cast<std::size_t>(n_));
  nvlsGroups_.resize(static_cast<std::size_t>(n_));
  bool ok = true;
  for (int r = 0; r < n_; ++r) {
    const auto& g = plan_.gpus[static_cast<std::size_t>(r)];
    std::map<std::pair<ChannelType, int>, int> ordinal;
    for (const auto& ch : g.channels) {
      if (ch.type == ChannelType::Switch) {
        for (const auto& grp : ch.rankGroups)
          nvlsGroups_[static_cast<std::size_t>(r)].push_back({grp.ranks, ch.switchBuffer, grp.size});
        continue;
      }
      for (int peer : ch.connectedTo) {
        if (peer == r) {
          error(Property::Reference, r, -1, -1,
                fmt::format("a {} channel connects rank {} to itself", toString(ch.type), r));
          ok = false;
        }
        gpuChannels_[static_cast<std::size_t>(r)][ch.type].push_back(ChannelEnd{peer, ordinal[{ch.type, peer}]++});
      }
    }
  }
  if (!ok) return false;

  // Events.
  for (int r = 0; r < n_; ++r) start_.push_back(newEvent(EventKind::Start, r, -1, -1, -1, 0, nullptr));
  for (int r = 0; r < n_; ++r) end_.push_back(newEvent(EventKind::End, r, -1, -1, -1, 0, nullptr));
  for (int r = 0; r < n_; ++r) {
    const auto& g = plan_.gpus[static_cast<std::size_t>(r)];
    std::map<int, int> barrierCount;
    for (std::size_t ti = 0; ti < g.threadBlocks.size(); ++ti) {
      const auto& tb = g.threadBlocks[ti];
      const int t = static_cast<int>(ti);
      int lastNop = start_[static_cast<std::size_t>(r)];
      int lastControl = -1;
      std::vector<int> since;
      std::vector<PendingPort> pending;
      std::map<int, int> myBarriers;
      auto add = [&](const Op& o, int opIndex, int inner, int iter) {
        if (o.type == OpType::Nop || o.type == OpType::Barrier) {
          const int e = newEvent(EventKind::Op, r, t, opIndex, inner, iter, &o);
          addPred(e, lastNop);
          addPred(e, lastControl);
          for (int s : since) addPred(e, s);
          since.clear();
          lastControl = -1;
          lastNop = e;
          if (o.type == OpType::Barrier) {
            const int leave = newEvent(EventKind::Op, r, t, opIndex, inner, iter, &o);
            addPred(leave, e);
            lastNop = leave;
            if (!o.barrierId || !o.numThreadBlocks) {
              errorAt(Property::Reference, e, "needs barrier_id and num_threadblocks");
              ok = false;
              return;
            }
            barriers_[{r, *o.barrierId}].push_back(BarrierUse{t, e, leave, *o.numThreadBlocks});
          }
          return;
        }
        const int e = newEvent(EventKind::Op, r, t, opIndex, inner, iter, &o);
        addPred(e, lastNop);
        if (isControlOp(o)) {
          addPred(e, lastControl);
          lastControl = e;
        }
        since.push_back(e);
        if (!describeOp(e, pending)) ok = false;
      };
      for (std::size_t oi = 0; oi < tb.ops.size(); ++oi) {
        const Op& op = tb.ops[oi];
        if (op.type == OpType::Pipeline) {
          for (int it = 0; it < iterations_; ++it) {
            for (std::size_t k = 0; k < op.ops.size(); ++k)
              add(op.ops[k], static_cast<int>(oi), static_cast<int>(k), it);
          }
        } else {
          add(op, static_cast<int>(oi), -1, 0);
        }
        if (report_.errors.size() >= maxErrors_) return false;
      }
      const int blockEnd = newEvent(EventKind::BlockEnd, r, t, -1, -1, 0, nullptr);
      addPred(blockEnd, lastNop);
      addPred(blockEnd, lastControl);
      for (int s : since) addPred(blockEnd, s);
      addPred(end_[static_cast<std::size_t>(r)], blockEnd);
    }
    (void)barrierCount;
  }
  if (!ok) return false;
  // The start and the end of every rank: the user's buffers belong to the collective in between.
  for (int r = 0; r < n_; ++r) {
    Xfer init;
    RangeAccess all;
    for (int b = 0; b < 2; ++b) {
      for (int c = 0; c < physChunks_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] * cellsPerChunk_; ++c)
        all.cells.push_back(bufBase_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] + c);
    }
    init.dsts.push_back(all);
    xfers_[static_cast<std::size_t>(start_[static_cast<std::size_t>(r)])].push_back(std::move(init));
    Xfer fin;
    RangeAccess outs;
    const int outputs = logicalSize(r, BufferKind::Output);
    for (int c = 0; c < outputs; ++c)
      for (int s = 0; s < cellsPerChunk_; ++s) outs.cells.push_back(cellOf(r, BufferKind::Output, c, s));
    fin.srcs.push_back(outs);
    xfers_[static_cast<std::size_t>(end_[static_cast<std::size_t>(r)])].push_back(std::move(fin));
  }
  std::int64_t accesses = 0;
  for (const auto& xs : xfers_)
    for (const auto& x : xs)
      for (const auto* side : {&x.srcs, &x.dsts})
        for (const auto& ra : *side) accesses += static_cast<std::int64_t>(ra.cells.size());
  if (accesses > kMaxAccesses) {
    report_.beyondBudget = true;
    error(Property::Shape, -1, -1, -1,
          fmt::format("{} chunk-slice accesses are beyond the verifier's budget ({})", accesses, kMaxAccesses));
    return false;
  }
  for (std::size_t e = 0; e < events_.size(); ++e) {
    for (const auto& x : xfers_[e]) {
      for (const auto& src : x.srcs)
        if (src.packet)
          for (int c : src.cells) packetReads_.emplace_back(static_cast<int>(e), c);
      for (const auto& dst : x.dsts)
        if (dst.packet)
          for (int c : dst.cells) packetWriters_[c].push_back(static_cast<int>(e));
    }
  }
  matchCounters();
  matchPackets();
  matchBarriers();
  for (const auto& ev : events_) report_.steps += ev.kind == EventKind::Op ? 1 : 0;
  return report_.errors.empty() || std::all_of(report_.errors.begin(), report_.errors.end(),
                                               [](const Finding& f) { return f.property != Property::Reference; });
}

void Model::matchCounters() {
  // Signals to waits: the j-th wait on a channel completes after the j-th signal of its other end, when one block
  // signals and one block waits (otherwise which signal a wait sees depends on timing, and only the last wait is
  // known to follow all signals).
  std::set<std::tuple<int, int, int, int>> keys;
  for (const auto& [k, v] : signals_) keys.insert(k);
  for (const auto& [k, v] : waits_) keys.insert(k);
  auto blocks = [](const std::vector<SyncUse>& v) {
    std::set<int> s;
    for (const auto& u : v) s.insert(u.tb);
    return s.size();
  };
  for (const auto& key : keys) {
    const auto& sig = signals_[key];
    const auto& wt = waits_[key];
    const auto [rank, type, peer, ordinal] = key;
    const auto typeName = toString(static_cast<ChannelType>(type));
    if (wt.size() > sig.size()) {
      for (std::size_t j = sig.size(); j < wt.size(); ++j) {
        errorAt(Property::Deadlock, wt[j].event,
                fmt::format("wait #{} on the {} channel from rank {} (its #{}) never completes: rank {} signals "
                            "that channel {} times",
                            j + 1, typeName, peer, ordinal, peer, sig.size()));
      }
    } else if (sig.size() > wt.size()) {
      for (std::size_t j = wt.size(); j < sig.size(); ++j) {
        errorAt(Property::Matching, sig[j].event,
                fmt::format("signal #{} to rank {} on its {} channel #{} has no wait: the semaphore stays ahead "
                            "and the next run's wait passes too early",
                            j + 1, rank, typeName, ordinal));
      }
    }
    report_.transfers += std::min(sig.size(), wt.size());
    const bool ordered = blocks(sig) <= 1 && blocks(wt) <= 1;
    if (!ordered) {
      deferred_.push_back(key);  // resolved once the other edges tell whether the blocks take turns
      continue;
    }
    for (std::size_t j = 0; j < wt.size() && j < sig.size(); ++j)
      addPred(wt[j].event, sig[j].event, !sig[j].relaxed && !wt[j].relaxed);
  }
  // Device semaphores: acquire #j needs release #(j - init_value).
  std::set<std::pair<int, int>> semKeys;
  for (const auto& [k, v] : semAcquire_) semKeys.insert(k);
  for (const auto& [k, v] : semRelease_) semKeys.insert(k);
  for (const auto& key : semKeys) {
    const auto& acq = semAcquire_[key];
    const auto& rel = semRelease_[key];
    const int init =
        plan_.gpus[static_cast<std::size_t>(key.first)].semaphoreInit[static_cast<std::size_t>(key.second)];
    const bool ordered = blocks(acq) <= 1 && blocks(rel) <= 1;
    for (std::size_t j = 0; j < acq.size(); ++j) {
      const long need = static_cast<long>(j) + 1 - init;  // releases that acquire #j+1 consumes
      if (need <= 0) continue;
      if (need > static_cast<long>(rel.size())) {
        errorAt(Property::Deadlock, acq[j].event,
                fmt::format("sem_acquire #{} of semaphore {} never completes: init_value {} and {} releases", j + 1,
                            key.second, init, rel.size()));
        continue;
      }
      if (ordered) {
        addPred(acq[j].event, rel[static_cast<std::size_t>(need - 1)].event);
      } else if (need == static_cast<long>(rel.size())) {
        for (const auto& s : rel) addPred(acq[j].event, s.event);
      }
    }
  }
}

bool Model::resolveShared(const std::vector<int>& topo) {
  if (deferred_.empty()) return false;
  std::vector<int> at(events_.size(), 0);
  for (std::size_t i = 0; i < topo.size(); ++i) at[static_cast<std::size_t>(topo[i])] = static_cast<int>(i);
  auto chainOf = [&](std::vector<SyncUse> v, bool& total) {
    std::sort(v.begin(), v.end(), [&](const SyncUse& a, const SyncUse& b) {
      return at[static_cast<std::size_t>(a.event)] < at[static_cast<std::size_t>(b.event)];
    });
    total = true;
    for (std::size_t i = 0; i + 1 < v.size(); ++i)
      if (!hb(v[i].event, v[i + 1].event, false)) total = false;
    return v;
  };
  for (const auto& key : deferred_) {
    bool sigTotal = false;
    bool waitTotal = false;
    const auto sig = chainOf(signals_[key], sigTotal);
    const auto wt = chainOf(waits_[key], waitTotal);
    const auto [rank, type, peer, ordinal] = key;
    if (sigTotal && waitTotal) {
      for (std::size_t j = 0; j < wt.size() && j < sig.size(); ++j)
        addPred(wt[j].event, sig[j].event, !sig[j].relaxed && !wt[j].relaxed);
      continue;
    }
    warning(Property::Matching, rank, -1, -1,
            fmt::format("several blocks signal or wait on rank {}'s {} channel #{} from rank {} in no fixed order: "
                        "only the last wait is known to follow every signal",
                        rank, toString(static_cast<ChannelType>(type)), ordinal, peer));
    if (!wt.empty() && wt.size() <= sig.size()) {
      for (const auto& sg : sig) addPred(wt.back().event, sg.event, !sg.relaxed && !wt.back().relaxed);
    }
  }
  deferred_.clear();
  return true;
}

void Model::matchPackets() {
  for (const auto& [event, cell] : packetReads_) {
    auto it = packetWriters_.find(cell);
    if (it == packetWriters_.end()) {
      errorAt(Property::Deadlock, event,
              fmt::format("waits for packets in {} that no operation writes", cellName(cell)));
      continue;
    }
    for (int w : it->second) addPred(event, w);
  }
  for (const auto& [cell, writers] : packetWriters_) {
    if (writers.size() > 1) {
      errorAt(Property::Race, writers[1],
              fmt::format("writes packets to {} that {} also writes in the same run: a reader may take either "
                          "(the LL flag is the same)",
                          cellName(cell), describe(writers[0])));
    }
  }
}

void Model::matchBarriers() {
  for (auto& [key, uses] : barriers_) {
    // The j-th barrier of each block meets the j-th of the others.
    std::map<int, std::vector<const BarrierUse*>> byBlock;
    for (const auto& u : uses) byBlock[u.tb].push_back(&u);
    std::size_t rounds = 0;
    for (const auto& [tb, v] : byBlock) rounds = std::max(rounds, v.size());
    for (std::size_t j = 0; j < rounds; ++j) {
      std::vector<const BarrierUse*> members;
      for (const auto& [tb, v] : byBlock)
        if (j < v.size()) members.push_back(v[j]);
      const int expected = members.front()->expected;
      if (static_cast<int>(members.size()) != expected) {
        errorAt(Property::Deadlock, members.front()->arrive,
                fmt::format("barrier {} (round {}) waits for {} thread blocks but {} reach it", key.second, j + 1,
                            expected, members.size()));
        continue;
      }
      const int join = newEvent(EventKind::BarrierJoin, key.first, -1, -1, -1, 0, nullptr);
      for (const auto* m : members) {
        addPred(join, m->arrive);
        addPred(m->leave, join);
      }
    }
  }
}

bool Model::order(std::vector<int>& out, std::mt19937_64* shuffle) const {
  const std::size_t n = events_.size();
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<int>> succ(n);
  for (std::size_t e = 0; e < n; ++e) {
    for (const auto& p : events_[e].preds) {
      succ[static_cast<std::size_t>(p.event)].push_back(static_cast<int>(e));
      ++indeg[e];
    }
  }
  std::vector<int> ready;
  for (std::size_t e = 0; e < n; ++e)
    if (indeg[e] == 0) ready.push_back(static_cast<int>(e));
  out.clear();
  while (!ready.empty()) {
    std::size_t pick = 0;
    if (shuffle) {
      pick = static_cast<std::size_t>((*shuffle)() % ready.size());
    } else {
      pick = ready.size() - 1;
    }
    const int e = ready[pick];
    ready[pick] = ready.back();
    ready.pop_back();
    out.push_back(e);
    for (int s : succ[static_cast<std::size_t>(e)])
      if (--indeg[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
  }
  return out.size() == n;
}

bool Model::clocks(const std::vector<int>& topo) {
  // Chains are grown in topological order: an event extends a chain whose last event happens before it (through
  // memory-ordering edges), preferring a direct predecessor's; otherwise it starts a chain. Clock rows are as wide
  // as the chain count when the event is reached (later chains are 0 there).
  const std::size_t n = events_.size();
  chain_.assign(n, -1);
  pos_.assign(n, 0);
  memClock_.assign(n, {});
  ctlClock_.assign(n, {});
  std::vector<int> tail;
  std::int64_t cells = 0;
  for (int e : topo) {
    const auto ue = static_cast<std::size_t>(e);
    auto& mem = memClock_[ue];
    auto& ctl = ctlClock_[ue];
    mem.assign(tail.size() + 1, 0);
    ctl.assign(tail.size() + 1, 0);
    for (const auto& p : events_[ue].preds) {
      const auto& pc = ctlClock_[static_cast<std::size_t>(p.event)];
      const auto& pm = memClock_[static_cast<std::size_t>(p.event)];
      for (std::size_t c = 0; c < pc.size(); ++c) ctl[c] = std::max(ctl[c], pc[c]);
      if (p.memory)
        for (std::size_t c = 0; c < pm.size(); ++c) mem[c] = std::max(mem[c], pm[c]);
    }
    int c = -1;
    for (const auto& p : events_[ue].preds) {
      const int pcn = chain_[static_cast<std::size_t>(p.event)];
      if (p.memory && tail[static_cast<std::size_t>(pcn)] == p.event) {
        c = pcn;
        break;
      }
    }
    if (c < 0) {
      for (std::size_t k = 0; k < tail.size(); ++k) {
        if (mem[k] != 0 && mem[k] == static_cast<std::uint32_t>(pos_[static_cast<std::size_t>(tail[k])])) {
          c = static_cast<int>(k);
          break;
        }
      }
    }
    if (c < 0) {
      c = static_cast<int>(tail.size());
      tail.push_back(e);
      pos_[ue] = 1;
    } else {
      pos_[ue] = pos_[static_cast<std::size_t>(tail[static_cast<std::size_t>(c)])] + 1;
      tail[static_cast<std::size_t>(c)] = e;
    }
    chain_[ue] = c;
    mem.resize(tail.size(), 0);
    ctl.resize(tail.size(), 0);
    mem[static_cast<std::size_t>(c)] = static_cast<std::uint32_t>(pos_[ue]);
    ctl[static_cast<std::size_t>(c)] = static_cast<std::uint32_t>(pos_[ue]);
    cells += static_cast<std::int64_t>(tail.size());
    if (cells > kClockBudget) {
      report_.beyondBudget = true;
      error(Property::Shape, -1, -1, -1,
            fmt::format("{} events over {}+ parallel chains is beyond the verifier's budget", n, tail.size()));
      return false;
    }
  }
  chains_ = static_cast<int>(tail.size());
  return true;
}

void Model::checkRaces() {
  struct Access {
    int event;
    int end;
    bool write;
  };
  std::vector<std::vector<Access>> byCell(cellInfo_.size());
  for (std::size_t e = 0; e < events_.size(); ++e) {
    for (const auto& x : xfers_[e]) {
      for (const auto& s : x.srcs)
        for (int c : s.cells) byCell[static_cast<std::size_t>(c)].push_back(Access{static_cast<int>(e), s.end, false});
      for (const auto& d : x.dsts)
        for (int c : d.cells) byCell[static_cast<std::size_t>(c)].push_back(Access{static_cast<int>(e), d.end, true});
    }
  }
  std::set<std::pair<int, int>> reported;
  std::int64_t pairs = 0;
  for (std::size_t cell = 0; cell < byCell.size(); ++cell) {
    const auto& acc = byCell[cell];
    for (std::size_t i = 0; i < acc.size(); ++i) {
      pairs += static_cast<std::int64_t>(acc.size() - i);
      if (pairs > kClockBudget * 4) {
        report_.beyondBudget = true;
        error(Property::Shape, -1, -1, -1, "too many accesses of single chunks for the race check's budget");
        return;
      }
      for (std::size_t j = i + 1; j < acc.size(); ++j) {
        const Access& a = acc[i];
        const Access& b = acc[j];
        if (a.event == b.event || (!a.write && !b.write)) continue;
        auto before = [&](const Access& x, const Access& y) {
          if (x.end == kNever) return false;
          const int xe = x.end == kSelf ? x.event : x.end;
          const bool fromStart = events_[static_cast<std::size_t>(x.event)].kind == EventKind::Start;
          return hb(xe, y.event, !fromStart);
        };
        if (before(a, b) || before(b, a)) continue;
        auto controlOnly = [&](const Access& x, const Access& y) {
          if (x.end == kNever) return false;
          return hb(x.end == kSelf ? x.event : x.end, y.event, false);
        };
        const bool relaxedOnly = controlOnly(a, b) || controlOnly(b, a);
        const int first = std::min(a.event, b.event);
        const int second = std::max(a.event, b.event);
        if (!reported.insert({first, second}).second) continue;
        const Access& shown = events_[static_cast<std::size_t>(a.event)].kind == EventKind::Op ? a : b;
        const Access& other = &shown == &a ? b : a;
        const Event& oe = events_[static_cast<std::size_t>(other.event)];
        std::string why;
        if (oe.kind == EventKind::Start) {
          why = fmt::format(
              "{} {} before rank {} is known to have started the collective (nothing from rank {} "
              "precedes it)",
              shown.write ? "writes" : "reads", cellName(static_cast<int>(cell)), oe.rank, oe.rank);
        } else if (oe.kind == EventKind::End) {
          why = fmt::format("writes {}, and no signal/wait orders that write before rank {} finishes{}",
                            cellName(static_cast<int>(cell)), oe.rank,
                            shown.end == kNever ? " (a port put that no signal or flush completes)"
                            : relaxedOnly       ? " (only rlxsignal/rlxwait follow it, and they do not order memory)"
                                                : "");
        } else {
          why = fmt::format(
              "{} {} while {} {} it, and {}", shown.write ? "writes" : "reads", cellName(static_cast<int>(cell)),
              fmt::format("rank {} tb {} {}", oe.rank, oe.tb, describe(other.event)), other.write ? "writes" : "reads",
              relaxedOnly ? "only rlxsignal/rlxwait order them, which do not order memory"
                          : "no nop, signal/wait or packet flag orders them");
        }
        errorAt(Property::Race, shown.event, why);
        if (report_.errors.size() >= maxErrors_) return;
      }
    }
  }
}

void Model::execute(const std::vector<int>& topo, bool reductionOrder) {
  std::vector<TermPtr> value(cellInfo_.size());
  std::set<std::pair<int, int>> reported;
  for (int e : topo) {
    const Event& ev = events_[static_cast<std::size_t>(e)];
    if (ev.kind == EventKind::Start) {
      const int inputs = logicalSize(ev.rank, BufferKind::Input);
      for (int c = 0; c < inputs; ++c) {
        if (!core::inputDefined(shadow_, ev.rank, c)) continue;
        for (int s = 0; s < cellsPerChunk_; ++s) {
          auto t = std::make_shared<Term>();
          t->rank = ev.rank;
          t->cell = c * cellsPerChunk_ + s;
          t->contributions = {{t->rank, t->cell}};
          value[static_cast<std::size_t>(cellOf(ev.rank, BufferKind::Input, c, s))] = std::move(t);
        }
      }
      continue;
    }
    if (ev.kind != EventKind::Op) continue;
    for (const auto& x : xfers_[static_cast<std::size_t>(e)]) {
      const std::size_t len = x.srcs.front().cells.size();
      std::vector<TermPtr> results(len);
      for (std::size_t k = 0; k < len; ++k) {
        std::vector<TermPtr> in;
        for (const auto& s : x.srcs) {
          const int c = s.cells[k];
          const TermPtr& v = value[static_cast<std::size_t>(c)];
          if (!v) {
            if (reported.insert({e, c}).second)
              errorAt(Property::Uninitialized, e, fmt::format("reads {}, which holds no data yet", cellName(c)));
            in.clear();
            break;
          }
          in.push_back(v);
        }
        if (in.empty()) continue;
        if (x.combine == Combine::Copy) {
          results[k] = in.front();
          continue;
        }
        auto t = std::make_shared<Term>();
        t->combine = x.combine;
        t->kids = in;
        for (const auto& kid : in)
          t->contributions.insert(t->contributions.end(), kid->contributions.begin(), kid->contributions.end());
        std::sort(t->contributions.begin(), t->contributions.end());
        if (std::adjacent_find(t->contributions.begin(), t->contributions.end()) != t->contributions.end()) {
          const auto dup = *std::adjacent_find(t->contributions.begin(), t->contributions.end());
          if (reported.insert({e, -1}).second) {
            errorAt(Property::ReducedTwice, e,
                    fmt::format("adds rank {}'s input chunk {} twice into {}", dup.first, dup.second / cellsPerChunk_,
                                cellName(x.dsts.front().cells[k])));
          }
        }
        results[k] = std::move(t);
      }
      for (const auto& d : x.dsts)
        for (std::size_t k = 0; k < len; ++k)
          if (results[k]) value[static_cast<std::size_t>(d.cells[k])] = results[k];
    }
  }
  // Postcondition.
  std::map<std::pair<int, int>, std::pair<std::string, int>> shapes;  // (chunk, slice) -> (shape, rank)
  for (int r = 0; r < n_; ++r) {
    const int outputs = logicalSize(r, BufferKind::Output);
    for (int o = 0; o < outputs; ++o) {
      const auto expected = core::expectedOutput(shadow_, r, o);
      if (!expected.constrained) continue;
      for (int s = 0; s < cellsPerChunk_; ++s) {
        const int cell = cellOf(r, BufferKind::Output, o, s);
        const TermPtr& v = value[static_cast<std::size_t>(cell)];
        std::vector<std::pair<int, int>> want;
        for (const auto& t : expected.terms) want.emplace_back(t.rank, t.index * cellsPerChunk_ + s);
        std::sort(want.begin(), want.end());
        if (!v || v->contributions != want) {
          std::string got = "nothing";
          if (v) {
            got.clear();
            for (std::size_t i = 0; i < v->contributions.size() && i < 6; ++i) {
              got += fmt::format("{}r{}c{}", i ? "+" : "", v->contributions[i].first,
                                 v->contributions[i].second / cellsPerChunk_);
            }
            if (v->contributions.size() > 6) got += fmt::format("+... ({} terms)", v->contributions.size());
          }
          std::string want1;
          for (std::size_t i = 0; i < want.size() && i < 6; ++i)
            want1 += fmt::format("{}r{}c{}", i ? "+" : "", want[i].first, want[i].second / cellsPerChunk_);
          if (want.size() > 6) want1 += fmt::format("+... ({} terms)", want.size());
          error(Property::Postcondition, r, -1, -1,
                fmt::format("output chunk {}{} ends with {}, expected {}", o,
                            cellsPerChunk_ > 1 ? fmt::format(" slice {}", s) : std::string(), got, want1));
          if (report_.errors.size() >= maxErrors_) return;
          continue;
        }
        if (reductionOrder && want.size() > 1 && plan_.collective != core::Collective::AllGather) {
          const std::string sh = shapeOf(v, 200);
          auto [it, inserted] = shapes.try_emplace({o, s}, sh, r);
          if (!inserted && it->second.first != sh) {
            warning(Property::ReductionOrder, r, -1, -1,
                    fmt::format("output chunk {} is summed as {} here and as {} on rank {}: floating-point results "
                                "may differ between ranks",
                                o, sh, it->second.first, it->second.second));
          }
        }
      }
    }
  }
}

bool Model::runBytes(const std::vector<int>& topo, int elements, std::uint64_t seed, PlanRunReport& run) const {
  using Cell = std::shared_ptr<const std::vector<std::uint32_t>>;
  std::vector<Cell> value(cellInfo_.size());
  const auto el = static_cast<std::size_t>(elements);
  auto inputValue = [&](int rank, int logicalCell) {
    std::mt19937_64 g(seed * 1000003ULL + static_cast<std::uint64_t>(rank) * 7919ULL +
                      static_cast<std::uint64_t>(logicalCell));
    auto v = std::make_shared<std::vector<std::uint32_t>>(el);
    for (auto& x : *v) x = static_cast<std::uint32_t>(g());
    return v;
  };
  for (int e : topo) {
    const Event& ev = events_[static_cast<std::size_t>(e)];
    if (ev.kind == EventKind::Start) {
      const int inputs = logicalSize(ev.rank, BufferKind::Input);
      for (int c = 0; c < inputs; ++c) {
        if (!core::inputDefined(shadow_, ev.rank, c)) continue;
        for (int s = 0; s < cellsPerChunk_; ++s)
          value[static_cast<std::size_t>(cellOf(ev.rank, BufferKind::Input, c, s))] =
              inputValue(ev.rank, c * cellsPerChunk_ + s);
      }
      continue;
    }
    if (ev.kind != EventKind::Op) continue;
    for (const auto& x : xfers_[static_cast<std::size_t>(e)]) {
      const std::size_t len = x.srcs.front().cells.size();
      std::vector<Cell> results(len);
      for (std::size_t k = 0; k < len; ++k) {
        auto sum = std::make_shared<std::vector<std::uint32_t>>(el, 0U);
        bool ok = true;
        for (const auto& s : x.srcs) {
          const Cell& v = value[static_cast<std::size_t>(s.cells[k])];
          if (!v) {
            ok = false;
            break;
          }
          for (std::size_t i = 0; i < el; ++i) (*sum)[i] += (*v)[i];
        }
        if (ok) results[k] = std::move(sum);
      }
      for (const auto& d : x.dsts)
        for (std::size_t k = 0; k < len; ++k) value[static_cast<std::size_t>(d.cells[k])] = results[k];
    }
  }
  bool passed = true;
  for (int r = 0; r < n_; ++r) {
    const int outputs = logicalSize(r, BufferKind::Output);
    for (int o = 0; o < outputs; ++o) {
      const auto expected = core::expectedOutput(shadow_, r, o);
      if (!expected.constrained) continue;
      for (int s = 0; s < cellsPerChunk_; ++s) {
        std::vector<std::uint32_t> want(el, 0U);
        for (const auto& t : expected.terms) {
          const auto v = inputValue(t.rank, t.index * cellsPerChunk_ + s);
          for (std::size_t i = 0; i < el; ++i) want[i] += (*v)[i];
        }
        const Cell& got = value[static_cast<std::size_t>(cellOf(r, BufferKind::Output, o, s))];
        if (!got || *got != want) {
          passed = false;
          ++run.mismatches;
          if (run.firstMismatches.size() < 8) {
            run.firstMismatches.push_back(fmt::format(
                "rank {} output chunk {}{}: {}", r, o, cellsPerChunk_ > 1 ? fmt::format(" slice {}", s) : std::string(),
                got ? fmt::format("element 0 is {:#x}, expected {:#x}", (*got)[0], want[0])
                    : std::string("never written")));
          }
        }
      }
    }
  }
  return passed;
}

std::string blockLimitPrefix(int rank, int tb) { return fmt::format("rank {} tb {}", rank, tb); }

}  // namespace

std::vector<std::string> checkPlanLimits(const Plan& plan) {
  std::vector<std::string> out;
  for (const auto& g : plan.gpus) {
    if (g.semaphoreInit.size() > static_cast<std::size_t>(kMaxDeviceSemaphores)) {
      out.push_back(fmt::format("rank {}: {} device semaphores, the executor holds at most {} (MAX_DEVICE_SEMAPHORES)",
                                g.id, g.semaphoreInit.size(), kMaxDeviceSemaphores));
    }
    for (const auto& tb : g.threadBlocks) {
      std::size_t ops = 0;
      for (const auto& op : tb.ops) ops += 1 + op.ops.size();
      if (ops > static_cast<std::size_t>(kMaxOperationsPerThreadBlock)) {
        out.push_back(fmt::format("{}: {} operations, the executor runs at most {} per thread block (MAX_OPERATION)",
                                  blockLimitPrefix(g.id, tb.id), ops, kMaxOperationsPerThreadBlock));
      }
      std::map<ChannelType, std::size_t> perType;
      for (const auto& c : tb.channels) perType[c.type] += c.ids.size();
      for (const auto& [type, count] : perType) {
        if (count > static_cast<std::size_t>(kMaxChannels)) {
          out.push_back(fmt::format("{}: {} {} channels, the executor holds at most {} per thread block (MAX_CHANNEL)",
                                    blockLimitPrefix(g.id, tb.id), count, toString(type), kMaxChannels));
        }
      }
      std::map<ChannelType, std::size_t> remotes;
      for (const auto& r : tb.remoteBufferRefs) remotes[r.accessType] += r.ids.size();
      for (const auto& [type, count] : remotes) {
        if (count > static_cast<std::size_t>(kMaxChannels)) {
          out.push_back(
              fmt::format("{}: {} remote buffers for {} channels, the executor holds at most {} (MAX_CHANNEL)",
                          blockLimitPrefix(g.id, tb.id), count, toString(type), kMaxChannels));
        }
      }
      auto checkOp = [&](const Op& op, std::size_t index) {
        if (op.channelIds.size() > static_cast<std::size_t>(kMaxChannelsPerOperation)) {
          out.push_back(fmt::format(
              "{} op {} ({}): {} channels, the executor takes at most {} per operation "
              "(MAX_CHANNEL_PER_OPERATION)",
              blockLimitPrefix(g.id, tb.id), index, toString(op.type), op.channelIds.size(), kMaxChannelsPerOperation));
        }
        const std::size_t refs = static_cast<std::size_t>(2 + kMaxChannelsPerOperation);
        if (op.src.size() > refs || op.dst.size() > refs) {
          out.push_back(fmt::format("{} op {} ({}): more than {} buffers on one side", blockLimitPrefix(g.id, tb.id),
                                    index, toString(op.type), refs));
        }
        if (op.semaphoreIds.size() > static_cast<std::size_t>(kMaxDeviceSemaphores)) {
          out.push_back(fmt::format("{} op {} ({}): more than {} semaphores", blockLimitPrefix(g.id, tb.id), index,
                                    toString(op.type), kMaxDeviceSemaphores));
        }
        if (op.barrierId && *op.barrierId >= kMaxDeviceSyncers) {
          out.push_back(fmt::format("{} op {} (barrier): barrier_id {}, the executor has {} (MAX_DEVICE_SYNCERS)",
                                    blockLimitPrefix(g.id, tb.id), index, *op.barrierId, kMaxDeviceSyncers));
        }
      };
      for (std::size_t i = 0; i < tb.ops.size(); ++i) {
        checkOp(tb.ops[i], i);
        for (const auto& inner : tb.ops[i].ops) checkOp(inner, i);
      }
    }
  }
  return out;
}

VerifyReport verifyPlan(const Plan& plan, const PlanVerifyOptions& options) {
  VerifyReport report;
  report.proven = true;
  for (const auto& msg : checkPlanLimits(plan))
    report.errors.push_back(Finding{Severity::Error, Property::Shape,
                                    plan.inPlace ? BufferMode::InPlace : BufferMode::OutOfPlace, -1, -1, -1, msg});
  Model model(plan, options.pipelineIterations, options.maxErrors, report);
  if (!model.build()) {
    report.proven = false;
    return report;
  }
  std::vector<int> topo;
  if (!model.order(topo, nullptr)) {
    report.proven = false;
    report.errors.push_back(Finding{Severity::Error, Property::Deadlock,
                                    plan.inPlace ? BufferMode::InPlace : BufferMode::OutOfPlace, -1, -1, -1,
                                    fmt::format("the waits form a cycle: {} of {} events can never run",
                                                model.eventCount() - topo.size(), model.eventCount())});
    return report;
  }
  if (!model.clocks(topo)) {
    report.proven = false;
    return report;
  }
  if (model.resolveShared(topo)) {
    if (!model.order(topo, nullptr)) {
      report.proven = false;
      report.errors.push_back(Finding{Severity::Error, Property::Deadlock,
                                      plan.inPlace ? BufferMode::InPlace : BufferMode::OutOfPlace, -1, -1, -1,
                                      fmt::format("the waits form a cycle: {} of {} events can never run",
                                                  model.eventCount() - topo.size(), model.eventCount())});
      return report;
    }
    if (!model.clocks(topo)) {
      report.proven = false;
      return report;
    }
  }
  model.checkRaces();
  model.execute(topo, options.checkReductionOrder);
  report.proven = report.errors.empty();
  return report;
}

PlanTiming Model::time(const std::vector<int>& topo, const core::Topology& topology, std::uint64_t sizeBytes,
                       const PlanTimingParams& p) const {
  PlanTiming t;
  // Bytes of one cell: the buffer the size counts, cut into its chunks and the chunks into cells.
  const int chunks = plan_.collective == core::Collective::AllGather ? logicalSize(0, BufferKind::Output)
                                                                     : logicalSize(0, BufferKind::Input);
  if (chunks <= 0) {
    t.error = "the plan declares no chunks";
    return t;
  }
  const double cellBytes = static_cast<double>(sizeBytes) / chunks / cellsPerChunk_;
  const int perNode = std::max(1, topology.gpusPerNode);
  const double nvlinkGBps = std::max(1e-3, topology.intra.gpuBandwidthGBps * p.nvlinkEfficiency);
  auto nicGBps = [&](int rank) {
    const int local = rank % perNode;
    for (const auto& nic : topology.nics)
      if (std::find(nic.gpus.begin(), nic.gpus.end(), local) != nic.gpus.end())
        return nic.bandwidthGBps * p.nicEfficiency;
    return topology.nics.empty() ? nvlinkGBps : topology.nics.front().bandwidthGBps * p.nicEfficiency;
  };
  auto nicLatency = [&]() {
    return (topology.nics.empty() ? 0.0 : topology.nics.front().latencyUs) + 2 * topology.inter.switchLatencyUs;
  };
  std::vector<double> finish(events_.size(), 0.0);
  std::map<std::pair<int, int>, double> busy;  // (rank, block) -> when its threads are free
  std::vector<double> nvBytes(static_cast<std::size_t>(n_), 0.0);
  std::vector<double> netBytes(static_cast<std::size_t>(n_), 0.0);
  for (int e : topo) {
    const Event& ev = events_[static_cast<std::size_t>(e)];
    double start = 0;
    for (const auto& pr : ev.preds) {
      const Event& pe = events_[static_cast<std::size_t>(pr.event)];
      double lat = 0;
      if (pe.kind == EventKind::Op && ev.kind == EventKind::Op && pe.rank != ev.rank) {
        const bool net = topology.nodeOf(pe.rank) != topology.nodeOf(ev.rank);
        const bool packet = isPacketOp(pe.o->type);
        lat = net ? nicLatency() + (packet ? 0.0 : p.portSignalUs)
                  : topology.intra.latencyUs + (packet ? 0.0 : p.signalUs);
      }
      start = std::max(start, finish[static_cast<std::size_t>(pr.event)] + lat);
    }
    double duration = 0;
    if (ev.kind == EventKind::Op) {
      if (ev.o->type == OpType::Nop || ev.o->type == OpType::Barrier) duration = p.nopUs;
      double bytesOut = 0;
      double localBytes = 0;
      bool net = false;
      for (const auto& x : xfers_[static_cast<std::size_t>(e)]) {
        for (const auto& d : x.dsts) {
          if (d.cells.empty()) continue;
          const double b = static_cast<double>(d.cells.size()) * cellBytes / (d.packet ? p.llEfficiency : 1.0);
          const int owner = cellInfo_[static_cast<std::size_t>(d.cells.front())].rank;
          if (owner == ev.rank) {
            localBytes += b;
          } else {
            bytesOut += b;
            const bool crosses = topology.nodeOf(owner) != topology.nodeOf(ev.rank);
            net = net || crosses;
            (crosses ? netBytes : nvBytes)[static_cast<std::size_t>(ev.rank)] += b;
          }
        }
        for (const auto& s : x.srcs) {
          if (s.cells.empty()) continue;
          const int owner = cellInfo_[static_cast<std::size_t>(s.cells.front())].rank;
          if (owner != ev.rank) bytesOut += static_cast<double>(s.cells.size()) * cellBytes;  // remote reads
        }
      }
      const double linkGBps = net ? nicGBps(ev.rank) : nvlinkGBps;
      duration +=
          localBytes / (std::min(p.localGBps, p.blockGBps) * 1e3) + bytesOut / (std::min(linkGBps, p.blockGBps) * 1e3);
      if (!isControlOp(*ev.o) || bytesOut + localBytes > 0) {
        auto& f = busy[{ev.rank, ev.tb}];
        start = std::max(start, f);
        f = start + duration;
      }
    }
    finish[static_cast<std::size_t>(e)] = start + duration;
    t.pathUs = std::max(t.pathUs, finish[static_cast<std::size_t>(e)]);
  }
  for (int r = 0; r < n_; ++r) {
    t.bandwidthUs = std::max(t.bandwidthUs, nvBytes[static_cast<std::size_t>(r)] / (nvlinkGBps * 1e3));
    t.bandwidthUs = std::max(t.bandwidthUs, netBytes[static_cast<std::size_t>(r)] / (nicGBps(r) * 1e3));
  }
  t.timeUs = p.launchUs + std::max(t.pathUs, t.bandwidthUs);
  t.ok = true;
  return t;
}

PlanRunReport runPlan(const Plan& plan, const PlanRunOptions& options) {
  PlanRunReport run;
  VerifyReport scratch;
  Model model(plan, options.pipelineIterations, 32, scratch);
  if (!model.build()) {
    for (const auto& f : scratch.errors) run.errors.push_back(f.str());
    return run;
  }
  {
    std::vector<int> topo;
    if (!model.order(topo, nullptr)) {
      run.errors.push_back("the waits form a cycle: the plan hangs");
      return run;
    }
    if (model.clocks(topo)) model.resolveShared(topo);
  }
  std::mt19937_64 rng(options.seed);
  bool passed = true;
  for (int k = 0; k < std::max(1, options.orders); ++k) {
    std::vector<int> topo;
    if (!model.order(topo, &rng)) {
      run.errors.push_back("the waits form a cycle: the plan hangs");
      return run;
    }
    if (!model.runBytes(topo, std::max(1, options.elementsPerChunk), options.seed, run)) passed = false;
    ++run.ordersRun;
  }
  for (const auto& f : scratch.errors)
    if (f.property == Property::Deadlock) run.errors.push_back(f.str());
  run.passed = passed && run.errors.empty();
  return run;
}

PlanTiming timePlan(const Plan& plan, const core::Topology& topology, std::uint64_t sizeBytes,
                    const PlanTimingParams& params) {
  PlanTiming t;
  if (static_cast<int>(plan.gpus.size()) != topology.nRanks()) {
    t.error = fmt::format("the plan has {} ranks but the topology {} has {} GPUs", plan.gpus.size(), topology.name,
                          topology.nRanks());
    return t;
  }
  VerifyReport scratch;
  Model model(plan, 2, 32, scratch);
  std::vector<int> topo;
  if (!model.build() || !model.order(topo, nullptr)) {
    t.error = scratch.errors.empty() ? std::string("the plan cannot run: its waits form a cycle")
                                     : scratch.errors.front().str();
    return t;
  }
  if (model.clocks(topo) && model.resolveShared(topo)) model.order(topo, nullptr);
  return model.time(topo, topology, sizeBytes, params);
}

}  // namespace optiflow::compiler::mscclpp
