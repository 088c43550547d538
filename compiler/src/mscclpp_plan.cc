#include "optiflow/compiler/mscclpp_plan.h"

#include <fmt/format.h>

#include <array>
#include <utility>

#include <nlohmann/json.hpp>

#include "optiflow/core/json_walk.h"

namespace optiflow::compiler::mscclpp {

namespace {

using core::BufferKind;
using core::JsonNode;
using OrderedJson = nlohmann::ordered_json;

// The reader's limits: far above any real plan, low enough that a hostile file cannot make the verifier's
// per-chunk work explode.
constexpr int kMaxRanks = 4096;
constexpr int kMaxChunks = 1 << 16;
constexpr int kMaxBlocks = 4096;
constexpr int kMaxOps = 1 << 16;
constexpr int kMaxIndex = 1 << 20;

constexpr std::array<std::pair<OpType, std::string_view>, 30> kOpNames{{
    {OpType::Nop, "nop"},
    {OpType::Barrier, "barrier"},
    {OpType::Put, "put"},
    {OpType::PutWithSignal, "pws"},
    {OpType::PutWithSignalAndFlush, "pwsf"},
    {OpType::Get, "get"},
    {OpType::Copy, "copy"},
    {OpType::Signal, "signal"},
    {OpType::Wait, "wait"},
    {OpType::Flush, "flush"},
    {OpType::Reduce, "re"},
    {OpType::ReduceSend, "res"},
    {OpType::ReadReduce, "rre"},
    {OpType::ReadReduceSend, "rres"},
    {OpType::PutPackets, "ppkt"},
    {OpType::ReadPutPackets, "rppkt"},
    {OpType::ReduceSendPackets, "respkt"},
    {OpType::CopyPackets, "cpkt"},
    {OpType::UnpackPackets, "upkt"},
    {OpType::ReducePackets, "repkt"},
    {OpType::ReduceCopyPackets, "recpkt"},
    {OpType::ReduceCopySendPackets, "recspkt"},
    {OpType::MultiLoadReduceStore, "glres"},
    {OpType::MultiStore, "gstore"},
    {OpType::MultiStorePackets, "gstorepkt"},
    {OpType::RelaxedSignal, "rlxsignal"},
    {OpType::RelaxedWait, "rlxwait"},
    {OpType::Pipeline, "pipeline"},
    {OpType::SemAcquire, "sem_acquire"},
    {OpType::SemRelease, "sem_release"},
}};

BufferKind bufferOf(const JsonNode& n) {
  const std::string s = n.str();
  if (s == "i") return BufferKind::Input;
  if (s == "o") return BufferKind::Output;
  if (s == "s") return BufferKind::Scratch;
  n.fail(fmt::format("expected a buffer type \"i\", \"o\" or \"s\", got \"{}\"", s));
}

ChannelType channelOf(const JsonNode& n) {
  const std::string s = n.str();
  if (auto t = parseChannelType(s)) return *t;
  n.fail(fmt::format("expected a channel type \"memory\", \"port\", \"switch\" or \"none\", got \"{}\"", s));
}

std::vector<int> intList(const JsonNode& n, int lo, int hi) {
  std::vector<int> out;
  for (const auto& item : n.items()) out.push_back(item.intIn(lo, hi));
  return out;
}

BufferRef readBufferRef(const JsonNode& n) {
  n.requireObject();
  BufferRef r;
  const auto type = n.optional("type");
  const auto remote = n.optional("buffer_id");
  const auto sw = n.optional("switch_channel_id");
  const int given = (type ? 1 : 0) + (remote ? 1 : 0) + (sw ? 1 : 0);
  if (given != 1) n.fail("expected exactly one of \"type\", \"buffer_id\" or \"switch_channel_id\"");
  if (type) {
    r.kind = BufferRef::Kind::Local;
    r.buffer = bufferOf(*type);
  } else if (remote) {
    r.kind = BufferRef::Kind::Remote;
    r.id = remote->intIn(0, kMaxIndex);
  } else {
    r.kind = BufferRef::Kind::Switch;
    r.id = sw->intIn(0, kMaxIndex);
  }
  r.index = n["index"].intIn(0, kMaxChunks);
  r.size = n["size"].intIn(0, kMaxChunks);
  return r;
}

Op readOp(const JsonNode& n, bool inPipeline) {
  n.requireObject();
  Op op;
  const auto nameNode = n["name"];
  const std::string name = nameNode.str();
  const auto t = parseOpType(name);
  if (!t)
    nameNode.fail(
        fmt::format("unknown operation \"{}\" (MSCCL++ {} knows nop, put, rres, ppkt, ...)", name, kPinnedVersion));
  op.type = *t;
  if (auto c = n.optional("channel_type")) op.channelType = channelOf(*c);
  if (auto c = n.optional("channel_ids")) op.channelIds = intList(*c, 0, 255);
  if (auto s = n.optional("src_buff"))
    for (const auto& b : s->items()) op.src.push_back(readBufferRef(b));
  if (auto d = n.optional("dst_buff"))
    for (const auto& b : d->items()) op.dst.push_back(readBufferRef(b));
  if (auto s = n.optional("semaphore_ids")) op.semaphoreIds = intList(*s, 0, kMaxIndex);
  if (auto b = n.optional("barrier_id")) op.barrierId = b->intIn(0, kMaxIndex);
  if (auto b = n.optional("num_threadblocks")) op.numThreadBlocks = b->intIn(0, kMaxBlocks);
  if (auto g = n.optional("tbg_info")) {
    op.tbgId = (*g)["tb_id"].intIn(0, kMaxBlocks);
    op.tbgSize = (*g)["tbg_size"].intIn(1, kMaxBlocks);
  }
  if (auto r = n.optional("reduce_op")) op.reduceOp = r->str();
  if (op.type == OpType::Pipeline) {
    if (inPipeline) nameNode.fail("expected no pipeline inside a pipeline (the executor runs one level)");
    const auto ctx = n["iter_context"];
    op.unitSize = ctx["unit_size"].unsignedIn(1, std::numeric_limits<std::uint32_t>::max());
    op.numChunks = ctx["num_chunks"].intIn(1, kMaxChunks);
    for (const auto& inner : n["ops"].items()) op.ops.push_back(readOp(inner, true));
    if (op.ops.size() > static_cast<std::size_t>(kMaxOps)) n.fail("too many operations in the pipeline");
  }
  return op;
}

ThreadBlock readBlock(const JsonNode& n) {
  n.requireObject();
  ThreadBlock tb;
  tb.id = n["id"].intIn(0, kMaxBlocks - 1);
  const auto ops = n["ops"].items();
  if (ops.size() > static_cast<std::size_t>(kMaxOps)) n["ops"].fail("too many operations");
  for (const auto& o : ops) tb.ops.push_back(readOp(o, false));
  if (auto chans = n.optional("channels")) {
    for (const auto& c : chans->items()) {
      BlockChannels bc;
      bc.type = channelOf(c["channel_type"]);
      bc.ids = intList(c["channel_ids"], 0, kMaxIndex);
      if (auto b = c.optional("buff")) bc.buffer = bufferOf(*b);
      tb.channels.push_back(std::move(bc));
    }
  }
  if (auto refs = n.optional("remote_buffer_refs")) {
    for (const auto& r : refs->items()) {
      RemoteBufferRefs rr;
      rr.accessType = channelOf(r["access_channel_type"]);
      rr.ids = intList(r["remote_buffer_ids"], 0, kMaxIndex);
      tb.remoteBufferRefs.push_back(std::move(rr));
    }
  }
  return tb;
}

Gpu readGpu(const JsonNode& n, int expectedId, int nRanks, std::vector<std::string>& notes) {
  n.requireObject();
  Gpu g;
  const auto idNode = n["id"];
  g.id = idNode.intIn(0, kMaxRanks - 1);
  if (g.id != expectedId)
    idNode.fail(fmt::format("expected id {} (the executor reads gpus[rank] and requires id == rank)", expectedId));
  g.inputChunks = n["input_chunks"].intIn(0, kMaxChunks);
  g.outputChunks = n["output_chunks"].intIn(0, kMaxChunks);
  g.scratchChunks = n["scratch_chunks"].intIn(0, kMaxChunks);
  for (const auto& c : n["channels"].items()) {
    Channel ch;
    ch.type = channelOf(c["channel_type"]);
    if (ch.type == ChannelType::Switch) {
      if (auto b = c.optional("buffer_type")) {
        ch.switchBuffer = bufferOf(*b);
      } else if (auto old = c.optional("buff")) {
        ch.switchBuffer = bufferOf(*old);
        ch.legacyBuffKey = true;
        notes.push_back(
            fmt::format("{}: a switch channel names its buffer with \"buff\" (before v0.10); the "
                        "parser of MSCCL++ {} reads \"buffer_type\" and cannot load this plan",
                        core::pathString(c.path()), kPinnedVersion));
      } else {
        c["buffer_type"];  // reports it missing
      }
      for (const auto& grp : c["rank_groups"].items()) {
        RankGroup rg;
        rg.size = grp["size"].intIn(0, kMaxChunks);
        rg.ranks = intList(grp["ranks"], 0, nRanks - 1);
        ch.rankGroups.push_back(std::move(rg));
      }
    } else if (ch.type == ChannelType::None) {
      c["channel_type"].fail("expected a channel of type \"memory\", \"port\" or \"switch\"");
    } else {
      ch.connectedTo = intList(c["connected_to"], 0, nRanks - 1);
    }
    g.channels.push_back(std::move(ch));
  }
  if (auto rbs = n.optional("remote_buffers")) {
    for (const auto& rb : rbs->items()) {
      RemoteBuffer b;
      b.rank = rb["rank"].intIn(0, nRanks - 1);
      b.type = bufferOf(rb["type"]);
      for (const auto& t : rb["access_channel_types"].items()) b.accessChannelTypes.push_back(channelOf(t));
      g.remoteBuffers.push_back(std::move(b));
    }
  }
  if (auto sems = n.optional("semaphores")) {
    for (const auto& s : sems->items()) g.semaphoreInit.push_back(s["init_value"].intIn(0, 1 << 30));
  }
  const auto blocks = n["threadblocks"].items();
  if (blocks.size() > static_cast<std::size_t>(kMaxBlocks)) n["threadblocks"].fail("too many thread blocks");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    g.threadBlocks.push_back(readBlock(blocks[i]));
    if (g.threadBlocks.back().id != static_cast<int>(i)) {
      blocks[i]["id"].fail(fmt::format("expected id {} (the executor indexes thread blocks by id)", i));
    }
  }
  return g;
}

OrderedJson bufferRefJson(const BufferRef& r) {
  OrderedJson j;
  switch (r.kind) {
    case BufferRef::Kind::Local:
      j["type"] = std::string(bufferLetter(r.buffer));
      break;
    case BufferRef::Kind::Remote:
      j["buffer_id"] = r.id;
      break;
    case BufferRef::Kind::Switch:
      j["switch_channel_id"] = r.id;
      break;
  }
  j["index"] = r.index;
  j["size"] = r.size;
  return j;
}

OrderedJson opJson(const Op& op) {
  OrderedJson j;
  j["name"] = std::string(toString(op.type));
  if (op.type == OpType::Pipeline) {
    j["iter_context"] = {{"unit_size", op.unitSize}, {"num_chunks", op.numChunks}};
    j["ops"] = OrderedJson::array();
    for (const auto& inner : op.ops) j["ops"].push_back(opJson(inner));
  }
  if (!op.src.empty()) {
    j["src_buff"] = OrderedJson::array();
    for (const auto& b : op.src) j["src_buff"].push_back(bufferRefJson(b));
  }
  if (!op.dst.empty()) {
    j["dst_buff"] = OrderedJson::array();
    for (const auto& b : op.dst) j["dst_buff"].push_back(bufferRefJson(b));
  }
  if (op.channelType) j["channel_type"] = std::string(toString(*op.channelType));
  if (!op.channelIds.empty()) j["channel_ids"] = op.channelIds;
  if (!op.semaphoreIds.empty()) j["semaphore_ids"] = op.semaphoreIds;
  if (op.barrierId) j["barrier_id"] = *op.barrierId;
  if (op.numThreadBlocks) j["num_threadblocks"] = *op.numThreadBlocks;
  if (op.tbgId && op.tbgSize) j["tbg_info"] = {{"tb_id", *op.tbgId}, {"tbg_size", *op.tbgSize}};
  if (op.reduceOp) j["reduce_op"] = *op.reduceOp;
  return j;
}

}  // namespace

std::string_view toString(OpType t) {
  for (const auto& [type, name] : kOpNames)
    if (type == t) return name;
  return "?";
}

std::optional<OpType> parseOpType(std::string_view name) {
  for (const auto& [type, n] : kOpNames)
    if (n == name) return type;
  return std::nullopt;
}

std::string_view toString(ChannelType t) {
  switch (t) {
    case ChannelType::None:
      return "none";
    case ChannelType::Memory:
      return "memory";
    case ChannelType::Port:
      return "port";
    case ChannelType::Switch:
      return "switch";
  }
  return "?";
}

std::optional<ChannelType> parseChannelType(std::string_view name) {
  if (name == "memory") return ChannelType::Memory;
  if (name == "port") return ChannelType::Port;
  if (name == "switch") return ChannelType::Switch;
  if (name == "none") return ChannelType::None;
  return std::nullopt;
}

std::string_view bufferLetter(BufferKind b) {
  switch (b) {
    case BufferKind::Input:
      return "i";
    case BufferKind::Output:
      return "o";
    case BufferKind::Scratch:
      return "s";
  }
  return "?";
}

bool looksLikeMscclppPlan(std::string_view text) {
  std::size_t pos = text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) {
    ++pos;
  }
  if (pos >= text.size() || text[pos] != '{') return false;
  if (core::firstBeyondNesting(text, 64)) return false;
  const auto doc = nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(pos), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return false;
  return doc.contains("gpus") && !doc.contains("format");
}

core::Result<Plan> parseMscclppPlan(std::string_view text, std::string_view fileName) {
  Plan plan;
  auto error =
      core::readJsonDocument(text, std::string(fileName), 1, "an MSCCL++ execution plan", [&](const JsonNode& root) {
        root.requireObject();
        plan.name = root["name"].str();
        const auto collNode = root["collective"];
        plan.collectiveName = collNode.str();
        const std::string& c = plan.collectiveName;
        if (c == "allreduce") {
          plan.collective = core::Collective::AllReduce;
        } else if (c == "allgather") {
          plan.collective = core::Collective::AllGather;
        } else if (c == "reducescatter") {
          plan.collective = core::Collective::ReduceScatter;
        } else if (c == "alltoall") {
          plan.collective = core::Collective::AllToAll;
        } else if (c == "broadcast") {
          plan.collective = core::Collective::Broadcast;
        } else {
          collNode.fail(
              fmt::format("expected a collective \"allreduce\", \"allgather\", "
                          "\"reducescatter\", \"alltoall\" or \"broadcast\", got \"{}\"",
                          c));
        }
        const auto protoNode = root["protocol"];
        const std::string proto = protoNode.str();
        if (proto == "LL") {
          plan.protocol = core::Protocol::LL;
        } else if (proto == "Simple") {
          plan.protocol = core::Protocol::Simple;
        } else {
          protoNode.fail(fmt::format("expected a protocol \"Simple\" or \"LL\", got \"{}\"", proto));
        }
        plan.inPlace = root["inplace"].boolean();
        if (auto v = root.optional("reuse_resources")) {
          plan.reuseResources = v->boolean();
        }
        if (auto v = root.optional("num_threads_per_block")) {
          plan.threadsPerBlock = v->intIn(32, 1024);
        }
        if (auto v = root.optional("use_double_scratch_buffer")) {
          plan.doubleScratchBuffer = v->boolean();
        }
        if (auto v = root.optional("buffer_alignment")) {
          plan.bufferAlignment = v->intIn(1, 1 << 20);
        }
        if (auto v = root.optional("min_message_size")) {
          plan.minMessageSize = v->unsignedIn(0, std::numeric_limits<std::uint64_t>::max());
        }
        if (auto v = root.optional("max_message_size")) {
          plan.maxMessageSize = v->unsignedIn(0, std::numeric_limits<std::uint64_t>::max());
        }
        const auto gpusNode = root["gpus"];
        const auto gpus = gpusNode.items();
        if (gpus.empty()) gpusNode.fail("expected at least one gpu");
        if (gpus.size() > static_cast<std::size_t>(kMaxRanks)) {
          gpusNode.fail(fmt::format("expected at most {} gpus", kMaxRanks));
        }
        const int n = static_cast<int>(gpus.size());
        for (int r = 0; r < n; ++r) {
          plan.gpus.push_back(readGpu(gpus[r], r, n, plan.schemaNotes));
        }
      });
  if (error) return *error;
  return plan;
}

std::string writeMscclppPlan(const Plan& plan) {
  OrderedJson j;
  j["name"] = plan.name;
  j["collective"] = plan.collectiveName.empty() ? std::string(core::toString(plan.collective)) : plan.collectiveName;
  j["protocol"] = plan.protocol == core::Protocol::LL ? "LL" : "Simple";
  j["inplace"] = plan.inPlace;
  j["reuse_resources"] = plan.reuseResources;
  j["num_threads_per_block"] = plan.threadsPerBlock;
  j["use_double_scratch_buffer"] = plan.doubleScratchBuffer;
  j["buffer_alignment"] = plan.bufferAlignment;
  j["min_message_size"] = plan.minMessageSize;
  j["max_message_size"] = plan.maxMessageSize;
  j["gpus"] = OrderedJson::array();
  for (const auto& g : plan.gpus) {
    OrderedJson gj;
    gj["id"] = g.id;
    gj["input_chunks"] = g.inputChunks;
    gj["output_chunks"] = g.outputChunks;
    gj["scratch_chunks"] = g.scratchChunks;
    gj["threadblocks"] = OrderedJson::array();
    for (const auto& tb : g.threadBlocks) {
      OrderedJson tj;
      tj["id"] = tb.id;
      tj["ops"] = OrderedJson::array();
      for (const auto& op : tb.ops) tj["ops"].push_back(opJson(op));
      tj["channels"] = OrderedJson::array();
      for (const auto& c : tb.channels) {
        OrderedJson cj;
        cj["channel_type"] = std::string(toString(c.type));
        cj["channel_ids"] = c.ids;
        if (c.buffer) cj["buff"] = std::string(bufferLetter(*c.buffer));
        tj["channels"].push_back(std::move(cj));
      }
      tj["remote_buffer_refs"] = OrderedJson::array();
      for (const auto& r : tb.remoteBufferRefs) {
        tj["remote_buffer_refs"].push_back(
            {{"access_channel_type", std::string(toString(r.accessType))}, {"remote_buffer_ids", r.ids}});
      }
      gj["threadblocks"].push_back(std::move(tj));
    }
    gj["channels"] = OrderedJson::array();
    for (const auto& c : g.channels) {
      OrderedJson cj;
      cj["channel_type"] = std::string(toString(c.type));
      if (c.type == ChannelType::Switch) {
        cj["buffer_type"] = std::string(bufferLetter(c.switchBuffer));
        cj["rank_groups"] = OrderedJson::array();
        for (const auto& rg : c.rankGroups) cj["rank_groups"].push_back({{"size", rg.size}, {"ranks", rg.ranks}});
      } else {
        cj["connected_to"] = c.connectedTo;
      }
      gj["channels"].push_back(std::move(cj));
    }
    gj["remote_buffers"] = OrderedJson::array();
    for (const auto& rb : g.remoteBuffers) {
      OrderedJson types = OrderedJson::array();
      for (auto t : rb.accessChannelTypes) types.push_back(std::string(toString(t)));
      gj["remote_buffers"].push_back(
          {{"rank", rb.rank}, {"type", std::string(bufferLetter(rb.type))}, {"access_channel_types", types}});
    }
    gj["semaphores"] = OrderedJson::array();
    for (int v : g.semaphoreInit) gj["semaphores"].push_back({{"init_value", v}});
    j["gpus"].push_back(std::move(gj));
  }
  return j.dump(2) + "\n";
}

bool isControlOp(const Op& o) {
  switch (o.type) {
    case OpType::Signal:
    case OpType::Wait:
    case OpType::RelaxedSignal:
    case OpType::RelaxedWait:
    case OpType::Flush:
    case OpType::SemAcquire:
    case OpType::SemRelease:
      return true;
    case OpType::Put:
    case OpType::PutWithSignal:
    case OpType::PutWithSignalAndFlush:
    case OpType::PutPackets:
      return o.channelType == ChannelType::Port;
    default:
      return false;
  }
}

}  // namespace optiflow::compiler::mscclpp
