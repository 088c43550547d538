#include "optiflow/core/schedule_json.h"

#include "optiflow/core/json_walk.h"
#include "optiflow/core/text_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace optiflow::core {

std::string_view toString(MscclDialect d) {
  switch (d) {
    case MscclDialect::New:
      return "new";
    case MscclDialect::OldRuntime:
      return "old-runtime";
    case MscclDialect::Old:
      return "old";
  }
  return "?";
}

std::optional<MscclDialect> parseMscclDialect(std::string_view s) {
  if (s == "new") return MscclDialect::New;
  if (s == "old-runtime") return MscclDialect::OldRuntime;
  if (s == "old") return MscclDialect::Old;
  return std::nullopt;
}

std::optional<StepOp> parseStepOp(std::string_view s) {
  for (StepOp op : {StepOp::Send, StepOp::Recv, StepOp::RecvCopySend, StepOp::RecvReduceSend, StepOp::RecvReduceCopy,
                    StepOp::RecvReduceCopySend, StepOp::Copy, StepOp::Reduce, StepOp::Nop}) {
    if (toString(op) == s) return op;
  }
  return std::nullopt;
}

std::optional<BufferKind> parseBufferKind(std::string_view s) {
  for (BufferKind b : {BufferKind::Input, BufferKind::Output, BufferKind::Scratch}) {
    if (toString(b) == s) return b;
  }
  return std::nullopt;
}

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// Writer

std::string quote(std::string_view s) {
  // replace: invalid UTF-8 (possible in names imported from XML) must not make the writer throw.
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string stepJson(const Step& st) {
  std::string deps;
  for (std::size_t i = 0; i < st.deps.size(); ++i) {
    deps += fmt::format("{}[{}, {}]", i ? ", " : "", st.deps[i].tb, st.deps[i].step);
  }
  return fmt::format(
      R"({{"op": "{}", "src": {{"buf": "{}", "off": {}}}, "dst": {{"buf": "{}", "off": {}}}, "count": {}, )"
      R"("deps": [{}], "has_dep": {}}})",
      toString(st.op), toString(st.srcBuf), st.srcOff, toString(st.dstBuf), st.dstOff, st.count, deps,
      st.hasDep ? "true" : "false");
}

// Emits lines with an indentation level; with indent < 0 everything goes on one line. With a sink, the text goes
// there whenever a MiB of it has gathered.
class Out {
 public:
  Out(int indent, std::ostream* sink) : indent_(indent), sink_(sink) {}
  void line(int level, std::string_view text) {
    if (indent_ >= 0) s_.append(static_cast<std::size_t>(level * indent_), ' ');
    s_ += text;
    if (indent_ >= 0) s_ += '\n';
    if (sink_ && s_.size() >= kPiece) flush();
  }
  // Separator after a member: "," then the line break (or a space when compact).
  static std::string_view sep(bool last) { return last ? "" : ","; }
  std::string take() {
    flush();
    return std::move(s_);
  }
  bool compact() const { return indent_ < 0; }

 private:
  static constexpr std::size_t kPiece = std::size_t{1} << 20;
  void flush() {
    if (!sink_) return;
    sink_->write(s_.data(), static_cast<std::streamsize>(s_.size()));
    s_.clear();
  }
  int indent_;
  std::ostream* sink_;
  std::string s_;
};

std::string writeJson(const Schedule& s, int indent, std::ostream* sink) {
  Out out(indent, sink);
  const std::string_view sp = out.compact() ? "" : " ";
  std::vector<std::string> top;
  top.push_back(fmt::format(R"("format":{}{})", sp, quote(kScheduleJsonFormat)));
  top.push_back(fmt::format(R"("version":{}{})", sp, kScheduleJsonVersion));
  top.push_back(fmt::format(R"("name":{}{})", sp, quote(s.name)));
  top.push_back(fmt::format(R"("collective":{}{})", sp, quote(toString(s.collective))));
  if (s.collective == Collective::Custom || !s.customKind.empty()) {
    top.push_back(fmt::format(R"("custom_kind":{}{})", sp, quote(s.customKind)));
  }
  if (s.collective == Collective::Broadcast || s.collective == Collective::Reduce || s.root != 0) {
    top.push_back(fmt::format(R"("root":{}{})", sp, s.root));
  }
  top.push_back(fmt::format(R"("protocol":{}{})", sp, quote(toString(s.protocol))));
  top.push_back(fmt::format(R"("n_ranks":{}{})", sp, s.nRanks));
  top.push_back(fmt::format(R"("n_channels":{}{})", sp, s.nChannels));
  top.push_back(fmt::format(R"("chunks_per_loop":{}{})", sp, s.chunksPerLoop));
  top.push_back(fmt::format(R"("in_place":{}{})", sp, s.inPlace ? "true" : "false"));
  top.push_back(fmt::format(R"("out_of_place":{}{})", sp, s.outOfPlace ? "true" : "false"));
  top.push_back(fmt::format(R"("min_bytes":{}{})", sp, s.minBytes));
  top.push_back(fmt::format(R"("max_bytes":{}{})", sp, s.maxBytes));
  if (s.redop) top.push_back(fmt::format(R"("redop":{}{})", sp, quote(*s.redop)));
  if (s.nThreads) top.push_back(fmt::format(R"("nthreads":{}{})", sp, *s.nThreads));
  top.push_back(fmt::format(R"("msccl_dialect":{}{})", sp, quote(toString(s.dialect))));

  out.line(0, "{");
  for (const auto& t : top) out.line(1, t + ",");
  if (s.ranks.empty()) {
    out.line(1, R"("ranks": [])");
  } else {
    out.line(1, R"("ranks": [)");
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      const RankProgram& rp = s.ranks[r];
      std::string copies;
      for (std::size_t i = 0; i < rp.localCopies.size(); ++i) {
        copies += fmt::format(R"({}{{"input_offset": {}, "output_offset": {}}})", i ? ", " : "",
                              rp.localCopies[i].inputOffset, rp.localCopies[i].outputOffset);
      }
      const std::string head =
          fmt::format(R"({{"rank": {}, "input_chunks": {}, "output_chunks": {}, "scratch_chunks": {}, )"
                      R"("local_copies": [{}], "threadblocks": [)",
                      rp.rank, rp.inputChunks, rp.outputChunks, rp.scratchChunks, copies);
      const bool lastRank = r + 1 == s.ranks.size();
      if (rp.threadBlocks.empty()) {
        out.line(2, head + "]}" + std::string(Out::sep(lastRank)));
        continue;
      }
      out.line(2, head);
      for (std::size_t b = 0; b < rp.threadBlocks.size(); ++b) {
        const ThreadBlock& tb = rp.threadBlocks[b];
        const bool lastTb = b + 1 == rp.threadBlocks.size();
        const std::string tbHead = fmt::format(R"({{"id": {}, "send": {}, "recv": {}, "channel": {}, "steps": [)",
                                               tb.id, tb.sendPeer, tb.recvPeer, tb.channel);
        if (tb.steps.empty()) {
          out.line(3, tbHead + "]}" + std::string(Out::sep(lastTb)));
          continue;
        }
        out.line(3, tbHead);
        for (std::size_t i = 0; i < tb.steps.size(); ++i) {
          out.line(4, stepJson(tb.steps[i]) + std::string(Out::sep(i + 1 == tb.steps.size())));
        }
        out.line(3, "]}" + std::string(Out::sep(lastTb)));
      }
      out.line(2, "]}" + std::string(Out::sep(lastRank)));
    }
    out.line(1, "]");
  }
  out.line(0, "}");
  return out.take();
}

}  // namespace

std::string scheduleToJson(const Schedule& s, int indent) { return writeJson(s, indent, nullptr); }

void writeScheduleJson(const Schedule& s, std::ostream& out, int indent) { writeJson(s, indent, &out); }

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Reader

struct SchemaError {
  JsonPath path;
  std::string message;
};

std::string describe(const json& v) {
  std::string shown = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return fmt::format("the string {}", shown);
    case json::value_t::boolean:
      return fmt::format("the boolean {}", shown);
    case json::value_t::number_float:
      return fmt::format("the number {}", shown);
    default:
      return fmt::format("{}", shown);
  }
}

class Reader {
 public:
  [[noreturn]] void fail(std::string message) const { throw SchemaError{path_, std::move(message)}; }
  [[noreturn]] void failAt(std::string_view key, std::string message) const {
    auto p = path_;
    p.push_back(PathSegment{std::string(key), 0});
    throw SchemaError{std::move(p), std::move(message)};
  }

  // RAII path element.
  class Scope {
   public:
    Scope(Reader& r, PathSegment seg) : r_(r) { r_.path_.push_back(std::move(seg)); }
    ~Scope() { r_.path_.pop_back(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Reader& r_;
  };
  Scope key(std::string_view k) { return Scope(*this, PathSegment{std::string(k), 0}); }
  Scope index(std::size_t i) { return Scope(*this, PathSegment{std::string(), i}); }

  void expectObject(const json& v, std::string_view what) const {
    if (!v.is_object()) fail(fmt::format("expected {} (a JSON object), found {}", what, describe(v)));
  }
  void expectArray(const json& v, std::string_view what) const {
    if (!v.is_array()) fail(fmt::format("expected {} (a JSON array), found {}", what, describe(v)));
  }

  void checkKeys(const json& obj, std::initializer_list<std::string_view> allowed) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
      std::string list;
      for (auto a : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
      failAt(it.key(), fmt::format("unknown key \"{}\" (allowed here: {})", it.key(), list));
    }
  }

  const json& required(const json& obj, std::string_view k) const {
    auto it = obj.find(std::string(k));
    if (it == obj.end()) fail(fmt::format("missing required key \"{}\"", k));
    return *it;
  }
  static const json* optional(const json& obj, std::string_view k) {
    auto it = obj.find(std::string(k));
    return it == obj.end() ? nullptr : &*it;
  }

  std::int64_t integer(const json& v, std::int64_t lo, std::int64_t hi) const {
    std::int64_t x = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi)) fail(fmt::format("expected an integer in [{}, {}], found {}", lo, hi, u));
      x = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
    } else {
      fail(fmt::format("expected an integer in [{}, {}], found {}", lo, hi, describe(v)));
    }
    if (x < lo || x > hi) fail(fmt::format("expected an integer in [{}, {}], found {}", lo, hi, x));
    return x;
  }
  int intIn(const json& v, int lo, int hi) const { return static_cast<int>(integer(v, lo, hi)); }
  std::uint64_t u64(const json& v) const {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(fmt::format("expected a non-negative integer, found {}", describe(v)));
  }
  bool boolean(const json& v) const {
    if (!v.is_boolean()) fail(fmt::format("expected true or false, found {}", describe(v)));
    return v.get<bool>();
  }
  std::string string(const json& v) const {
    if (!v.is_string()) fail(fmt::format("expected a string, found {}", describe(v)));
    return v.get<std::string>();
  }

  // Helpers that read obj[k] inside a path scope.
  int intField(const json& obj, std::string_view k, int lo, int hi, std::optional<int> dflt = {}) {
    const json* v = optional(obj, k);
    if (!v) {
      if (dflt) return *dflt;
      fail(fmt::format("missing required key \"{}\"", k));
    }
    auto s = key(k);
    return intIn(*v, lo, hi);
  }
  bool boolField(const json& obj, std::string_view k, bool dflt) {
    const json* v = optional(obj, k);
    if (!v) return dflt;
    auto s = key(k);
    return boolean(*v);
  }

 private:
  JsonPath path_;
};

constexpr std::string_view kOpNames =
    "send, recv, recv_copy_send, recv_reduce_send, recv_reduce_copy, "
    "recv_reduce_copy_send, copy, reduce, nop";

void readBufRef(Reader& rd, const json& v, BufferKind& buf, int& off) {
  rd.expectObject(v, "a buffer reference {\"buf\": ..., \"off\": ...}");
  rd.checkKeys(v, {"buf", "off"});
  if (const json* b = Reader::optional(v, "buf")) {
    auto s = rd.key("buf");
    const std::string name = rd.string(*b);
    auto kind = parseBufferKind(name);
    if (!kind) rd.fail(fmt::format("expected one of input, output, scratch, found \"{}\"", name));
    buf = *kind;
  }
  off = rd.intField(v, "off", -1, kMaxScheduleChunks, off);
}

Step readStep(Reader& rd, const json& v) {
  rd.expectObject(v, "a step");
  rd.checkKeys(v, {"op", "src", "dst", "count", "deps", "has_dep"});
  Step st;
  {
    const json& opv = rd.required(v, "op");
    auto s = rd.key("op");
    const std::string name = rd.string(opv);
    auto op = parseStepOp(name);
    if (!op) rd.fail(fmt::format("expected one of {}, found \"{}\"", kOpNames, name));
    st.op = *op;
  }
  if (const json* src = Reader::optional(v, "src")) {
    auto s = rd.key("src");
    readBufRef(rd, *src, st.srcBuf, st.srcOff);
  }
  if (const json* dst = Reader::optional(v, "dst")) {
    auto s = rd.key("dst");
    readBufRef(rd, *dst, st.dstBuf, st.dstOff);
  }
  st.count = rd.intField(v, "count", 0, kMaxScheduleChunks, 1);
  if (const json* deps = Reader::optional(v, "deps")) {
    auto s = rd.key("deps");
    rd.expectArray(*deps, "a list of [thread block id, step index] pairs");
    for (std::size_t i = 0; i < deps->size(); ++i) {
      auto si = rd.index(i);
      const json& d = (*deps)[i];
      if (!d.is_array() || d.size() != 2) {
        rd.fail(fmt::format("expected a pair [thread block id, step index], found {}", describe(d)));
      }
      StepRef ref;
      {
        auto s0 = rd.index(0);
        ref.tb = rd.intIn(d[0], 0, kMaxScheduleBlockId);
      }
      {
        auto s1 = rd.index(1);
        ref.step = rd.intIn(d[1], 0, kMaxScheduleStepIndex);
      }
      st.deps.push_back(ref);
    }
  }
  st.hasDep = rd.boolField(v, "has_dep", false);
  return st;
}

ThreadBlock readThreadBlock(Reader& rd, const json& v, int nRanks) {
  rd.expectObject(v, "a thread block");
  rd.checkKeys(v, {"id", "send", "recv", "channel", "steps"});
  ThreadBlock tb;
  tb.id = rd.intField(v, "id", 0, kMaxScheduleBlockId);
  tb.sendPeer = rd.intField(v, "send", -1, nRanks - 1, -1);
  tb.recvPeer = rd.intField(v, "recv", -1, nRanks - 1, -1);
  tb.channel = rd.intField(v, "channel", -1, kMaxScheduleChannels - 1, 0);
  const json& steps = rd.required(v, "steps");
  auto s = rd.key("steps");
  rd.expectArray(steps, "the list of steps");
  tb.steps.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    auto si = rd.index(i);
    tb.steps.push_back(readStep(rd, steps[i]));
  }
  return tb;
}

RankProgram readRank(Reader& rd, const json& v, std::size_t expectedRank, int nRanks) {
  rd.expectObject(v, "a rank program");
  rd.checkKeys(v, {"rank", "input_chunks", "output_chunks", "scratch_chunks", "local_copies", "threadblocks"});
  RankProgram rp;
  rp.rank = rd.intField(v, "rank", 0, nRanks - 1);
  if (rp.rank != static_cast<int>(expectedRank)) {
    auto s = rd.key("rank");
    rd.fail(fmt::format("ranks must be listed in order: expected rank {}, found {}", expectedRank, rp.rank));
  }
  rp.inputChunks = rd.intField(v, "input_chunks", 0, kMaxScheduleChunks, 0);
  rp.outputChunks = rd.intField(v, "output_chunks", 0, kMaxScheduleChunks, 0);
  rp.scratchChunks = rd.intField(v, "scratch_chunks", 0, kMaxScheduleChunks, 0);
  if (const json* copies = Reader::optional(v, "local_copies")) {
    auto s = rd.key("local_copies");
    rd.expectArray(*copies, "a list of local copies");
    for (std::size_t i = 0; i < copies->size(); ++i) {
      auto si = rd.index(i);
      const json& c = (*copies)[i];
      rd.expectObject(c, "a local copy {\"input_offset\": ..., \"output_offset\": ...}");
      rd.checkKeys(c, {"input_offset", "output_offset"});
      LocalCopy lc;
      lc.inputOffset = rd.intField(c, "input_offset", 0, kMaxScheduleChunks);
      lc.outputOffset = rd.intField(c, "output_offset", 0, kMaxScheduleChunks);
      rp.localCopies.push_back(lc);
    }
  }
  const json& tbs = rd.required(v, "threadblocks");
  auto s = rd.key("threadblocks");
  rd.expectArray(tbs, "the list of thread blocks");
  std::set<int> ids;
  for (std::size_t i = 0; i < tbs.size(); ++i) {
    auto si = rd.index(i);
    rp.threadBlocks.push_back(readThreadBlock(rd, tbs[i], nRanks));
    if (!ids.insert(rp.threadBlocks.back().id).second) {
      auto sk = rd.key("id");
      rd.fail(fmt::format("duplicate thread block id {} on rank {}", rp.threadBlocks.back().id, rp.rank));
    }
  }
  return rp;
}

Schedule readSchedule(Reader& rd, const json& v) {
  rd.expectObject(v, "a schedule object");
  {
    const json& f = rd.required(v, "format");
    auto s = rd.key("format");
    if (!f.is_string() || f.get<std::string>() != kScheduleJsonFormat) {
      rd.fail(fmt::format("expected \"{}\", found {}", kScheduleJsonFormat, describe(f)));
    }
  }
  {
    const json& ver = rd.required(v, "version");
    auto s = rd.key("version");
    if (!ver.is_number_integer() || ver.get<std::int64_t>() != kScheduleJsonVersion) {
      rd.fail(fmt::format("unsupported schedule format version {} (this build reads version {})", describe(ver),
                          kScheduleJsonVersion));
    }
  }
  rd.checkKeys(v, {"format", "version", "name", "collective", "custom_kind", "root", "protocol", "n_ranks",
                   "n_channels", "chunks_per_loop", "in_place", "out_of_place", "min_bytes", "max_bytes", "redop",
                   "nthreads", "msccl_dialect", "ranks"});
  Schedule s;
  if (const json* n = Reader::optional(v, "name")) {
    auto k = rd.key("name");
    s.name = rd.string(*n);
  }
  {
    const json& c = rd.required(v, "collective");
    auto k = rd.key("collective");
    const std::string name = rd.string(c);
    auto coll = parseCollective(name);
    if (!coll) {
      rd.fail(fmt::format(
          "expected one of allgather, reducescatter, allreduce, broadcast, reduce, alltoall, custom, found \"{}\"",
          name));
    }
    s.collective = *coll;
  }
  if (const json* ck = Reader::optional(v, "custom_kind")) {
    auto k = rd.key("custom_kind");
    s.customKind = rd.string(*ck);
  }
  s.nRanks = rd.intField(v, "n_ranks", 1, kMaxScheduleRanks);
  s.root = rd.intField(v, "root", 0, s.nRanks - 1, 0);
  if (const json* p = Reader::optional(v, "protocol")) {
    auto k = rd.key("protocol");
    const std::string name = rd.string(*p);
    auto proto = parseProtocol(name);
    if (!proto) rd.fail(fmt::format("expected one of Simple, LL, LL128, found \"{}\"", name));
    s.protocol = *proto;
  }
  s.nChannels = rd.intField(v, "n_channels", 1, kMaxScheduleChannels, 1);
  s.chunksPerLoop = rd.intField(v, "chunks_per_loop", 1, kMaxScheduleChunks, 1);
  s.inPlace = rd.boolField(v, "in_place", false);
  s.outOfPlace = rd.boolField(v, "out_of_place", true);
  if (const json* x = Reader::optional(v, "min_bytes")) {
    auto k = rd.key("min_bytes");
    s.minBytes = rd.u64(*x);
  }
  if (const json* x = Reader::optional(v, "max_bytes")) {
    auto k = rd.key("max_bytes");
    s.maxBytes = rd.u64(*x);
  }
  if (const json* x = Reader::optional(v, "redop")) {
    auto k = rd.key("redop");
    s.redop = rd.string(*x);
  }
  if (Reader::optional(v, "nthreads")) s.nThreads = rd.intField(v, "nthreads", 0, kMaxScheduleThreads);
  if (const json* x = Reader::optional(v, "msccl_dialect")) {
    auto k = rd.key("msccl_dialect");
    const std::string name = rd.string(*x);
    auto d = parseMscclDialect(name);
    if (!d) rd.fail(fmt::format("expected one of new, old-runtime, old, found \"{}\"", name));
    s.dialect = *d;
  }
  const json& ranks = rd.required(v, "ranks");
  auto k = rd.key("ranks");
  rd.expectArray(ranks, "the list of rank programs");
  if (ranks.size() != static_cast<std::size_t>(s.nRanks)) {
    rd.fail(fmt::format("n_ranks is {} but {} rank programs are listed", s.nRanks, ranks.size()));
  }
  std::int64_t totalChunks = 0;
  s.ranks.reserve(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    auto si = rd.index(i);
    s.ranks.push_back(readRank(rd, ranks[i], i, s.nRanks));
    const RankProgram& rp = s.ranks.back();
    totalChunks += std::int64_t{rp.inputChunks} + rp.outputChunks + rp.scratchChunks;
    if (totalChunks > kMaxScheduleTotalChunks) {
      rd.fail(fmt::format("the buffers of all ranks together exceed the limit of {} chunks", kMaxScheduleTotalChunks));
    }
  }
  return s;
}

}  // namespace

Result<Schedule> parseScheduleJson(std::string_view text, std::string_view fileName) {
  Diagnostic d;
  d.file = std::string(fileName);
  try {
    if (const auto deep = firstBeyondNesting(text, static_cast<int>(kMaxScheduleNesting))) {
      auto [line, col] = lineColumn(text, *deep);
      d.line = line;
      d.column = col;
      d.message = fmt::format("JSON nested deeper than {} levels; this is not a schedule file", kMaxScheduleNesting);
      return d;
    }
    json doc;
    try {
      doc = json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
      // e.byte is the 1-based index of the character where the error was noticed.
      const std::size_t at = e.byte > 0 ? e.byte - 1 : 0;
      auto [line, col] = lineColumn(text, at);
      d.line = line;
      d.column = col;
      std::string what = e.what();
      // "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error while parsing ..." ->
      // keep what follows the position, which we already report.
      const auto colon = what.find(": ", what.find("column"));
      if (what.find("column") != std::string::npos && colon != std::string::npos) what = what.substr(colon + 2);
      d.message = fmt::format("JSON syntax error: {}", what);
      return d;
    }
    Reader rd;
    try {
      return readSchedule(rd, doc);
    } catch (const SchemaError& e) {
      auto [line, col] = lineColumn(text, locateJsonPath(text, e.path));
      d.line = line;
      d.column = col;
      d.message = fmt::format("{}: {}", pathString(e.path), e.message);
      return d;
    }
  } catch (const std::exception& e) {
    d.message = fmt::format("cannot read schedule JSON: {}", e.what());
    return d;
  } catch (...) {
    d.message = "cannot read schedule JSON: unexpected error";
    return d;
  }
}

}  // namespace optiflow::core
