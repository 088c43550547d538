#include "optiflow/compiler/msccl_xml.h"

#include "optiflow/core/text_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <pugixml.hpp>
#include <string>
#include <utility>
#include <vector>

#include "optiflow/core/schedule_json.h"  // the shared parser limits

namespace optiflow::compiler {

using core::BufferKind;
using core::Collective;
using core::Diagnostic;
using core::MscclDialect;
using core::Schedule;
using core::Step;
using core::StepOp;
using core::StepRef;

std::string_view mscclStepType(StepOp op) {
  switch (op) {
    case StepOp::Send:
      return "s";
    case StepOp::Recv:
      return "r";
    case StepOp::RecvCopySend:
      return "rcs";
    case StepOp::RecvReduceSend:
      return "rrs";
    case StepOp::RecvReduceCopy:
      return "rrc";
    case StepOp::RecvReduceCopySend:
      return "rrcs";
    case StepOp::Copy:
      return "cpy";
    case StepOp::Reduce:
      return "re";
    case StepOp::Nop:
      return "nop";
  }
  return "nop";
}

std::optional<StepOp> parseMscclStepType(std::string_view type) {
  for (StepOp op : {StepOp::Send, StepOp::Recv, StepOp::RecvCopySend, StepOp::RecvReduceSend, StepOp::RecvReduceCopy,
                    StepOp::RecvReduceCopySend, StepOp::Copy, StepOp::Reduce, StepOp::Nop}) {
    if (mscclStepType(op) == type) return op;
  }
  return std::nullopt;
}

namespace {

char bufferLetter(BufferKind b) {
  switch (b) {
    case BufferKind::Input:
      return 'i';
    case BufferKind::Output:
      return 'o';
    case BufferKind::Scratch:
      return 's';
  }
  return 'i';
}

std::optional<BufferKind> parseBufferLetter(std::string_view s) {
  if (s == "i") return BufferKind::Input;
  if (s == "o") return BufferKind::Output;
  if (s == "s") return BufferKind::Scratch;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// Import

struct ImportError {
  std::size_t offset;
  std::string message;
};

constexpr std::string_view kAlgoAttrs[] = {"name",  "proto",    "nchannels",  "nchunksperloop", "ngpus",
                                           "coll",  "inplace",  "outofplace", "minBytes",       "maxBytes",
                                           "redop", "nthreads", "root",       "customkind"};
constexpr std::string_view kGpuAttrs[] = {"id", "i_chunks", "o_chunks", "s_chunks"};
constexpr std::string_view kCopyAttrs[] = {"i_off", "o_off"};
constexpr std::string_view kTbAttrs[] = {"id", "send", "recv", "chan"};
constexpr std::string_view kStepAttrs[] = {"s",      "type", "srcbuf", "srcoff", "dstbuf",
                                           "dstoff", "cnt",  "depid",  "deps",   "hasdep"};

template <std::size_t N>
std::string joinNames(const std::string_view (&names)[N]) {
  std::string out;
  for (auto n : names) out += fmt::format("{}{}", out.empty() ? "" : " ", n);
  return out;
}

class Importer {
 public:
  explicit Importer(std::string_view text) : text_(text) {}

  Schedule run() {
    pugi::xml_document doc;
    const pugi::xml_parse_result res =
        doc.load_buffer(text_.data(), text_.size(), pugi::parse_default, pugi::encoding_utf8);
    if (!res) {
      throw ImportError{static_cast<std::size_t>(std::max<std::ptrdiff_t>(res.offset, 0)),
                        fmt::format("malformed XML: {}", res.description())};
    }
    pugi::xml_node algo;
    for (pugi::xml_node n : doc.children()) {
      if (n.type() == pugi::node_element) {
        if (algo) throw ImportError{nodeOffset(n), fmt::format("a second top-level element <{}>", n.name())};
        algo = n;
      } else {
        checkNonElement(n, "the document");
      }
    }
    if (!algo) throw ImportError{0, "no <algo> element: this is not an MSCCL algorithm file"};
    if (std::string_view(algo.name()) != "algo") {
      throw ImportError{nodeOffset(algo), fmt::format("expected <algo> as the root element, found <{}>", algo.name())};
    }
    return readAlgo(algo);
  }

  std::size_t nodeOffset(const pugi::xml_node& n) const {
    const std::ptrdiff_t off = n.offset_debug();
    if (off < 0 || static_cast<std::size_t>(off) > text_.size()) return 0;
    auto o = static_cast<std::size_t>(off);
    if (o > 0 && text_[o - 1] == '<') --o;  // point at the '<'
    return o;
  }

  // Offset of attribute `name` inside the start tag of n (scans the tag, skipping quoted values).
  std::size_t attrOffset(const pugi::xml_node& n, std::string_view name) const {
    const std::size_t start = nodeOffset(n);
    std::size_t pos = start;
    if (pos < text_.size() && text_[pos] == '<') ++pos;
    auto isSpace = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (pos < text_.size() && !isSpace(text_[pos]) && text_[pos] != '>' && text_[pos] != '/') ++pos;
    while (pos < text_.size()) {
      while (pos < text_.size() && isSpace(text_[pos])) ++pos;
      if (pos >= text_.size() || text_[pos] == '>' || text_[pos] == '/') break;
      const std::size_t nameStart = pos;
      while (pos < text_.size() && !isSpace(text_[pos]) && text_[pos] != '=' && text_[pos] != '>') ++pos;
      if (text_.substr(nameStart, pos - nameStart) == name) return nameStart;
      while (pos < text_.size() && isSpace(text_[pos])) ++pos;
      if (pos < text_.size() && text_[pos] == '=') ++pos;
      while (pos < text_.size() && isSpace(text_[pos])) ++pos;
      if (pos < text_.size() && (text_[pos] == '"' || text_[pos] == '\'')) {
        const char q = text_[pos];
        ++pos;
        while (pos < text_.size() && text_[pos] != q) ++pos;
        ++pos;
      } else {
        break;
      }
    }
    return start;
  }

 private:
  void checkNonElement(const pugi::xml_node& n, std::string_view where) const {
    switch (n.type()) {
      case pugi::node_comment:
      case pugi::node_declaration:
      case pugi::node_pi:
      case pugi::node_doctype:
        return;
      case pugi::node_pcdata:
      case pugi::node_cdata: {
        const std::string_view v = n.value();
        if (v.find_first_not_of(" \t\r\n") == std::string_view::npos) return;
        std::size_t at = 0;
        // pcdata has no offset of its own; point at the parent element.
        at = nodeOffset(n.parent());
        throw ImportError{at, fmt::format("unexpected text inside {}", where)};
      }
      default:
        return;
    }
  }

  // <step> and <copy> have no children (comments aside).
  void checkLeaf(const pugi::xml_node& n) const {
    for (pugi::xml_node c : n.children()) {
      if (c.type() == pugi::node_element) {
        throw ImportError{nodeOffset(c), fmt::format("unexpected element <{}> inside <{}>", c.name(), n.name())};
      }
      checkNonElement(c, fmt::format("<{}>", n.name()));
    }
  }

  template <std::size_t N>
  void checkAttrs(const pugi::xml_node& n, const std::string_view (&allowed)[N]) const {
    std::vector<std::string_view> seen;
    for (pugi::xml_attribute a : n.attributes()) {
      const std::string_view name = a.name();
      if (std::find(std::begin(allowed), std::end(allowed), name) == std::end(allowed)) {
        throw ImportError{attrOffset(n, name), fmt::format("unknown attribute '{}' on <{}> (known: {})", name, n.name(),
                                                           joinNames(allowed))};
      }
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        throw ImportError{attrOffset(n, name), fmt::format("duplicate attribute '{}' on <{}>", name, n.name())};
      }
      seen.push_back(name);
    }
  }

  const char* required(const pugi::xml_node& n, const char* name, std::string_view why = {}) const {
    pugi::xml_attribute a = n.attribute(name);
    if (!a) {
      throw ImportError{nodeOffset(n), fmt::format("<{}> is missing the required attribute '{}'{}", n.name(), name,
                                                   why.empty() ? "" : fmt::format(" ({})", why))};
    }
    return a.value();
  }

  std::int64_t integer(const pugi::xml_node& n, const char* name, std::int64_t lo, std::int64_t hi) const {
    const std::string_view v = required(n, name);
    std::int64_t x = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || x < lo || x > hi) {
      throw ImportError{attrOffset(n, name), fmt::format("attribute '{}' of <{}>: expected an integer in [{}, {}], "
                                                         "found \"{}\"",
                                                         name, n.name(), lo, hi, v)};
    }
    return x;
  }
  int intAttr(const pugi::xml_node& n, const char* name, int lo, int hi) const {
    return static_cast<int>(integer(n, name, lo, hi));
  }
  std::uint64_t u64Attr(const pugi::xml_node& n, const char* name) const {
    const std::string_view v = required(n, name);
    std::uint64_t x = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
      throw ImportError{attrOffset(n, name),
                        fmt::format("attribute '{}' of <{}>: expected a non-negative integer below 2^64, found \"{}\"",
                                    name, n.name(), v)};
    }
    return x;
  }
  bool flagAttr(const pugi::xml_node& n, const char* name) const { return intAttr(n, name, 0, 1) != 0; }

  Schedule readAlgo(const pugi::xml_node& algo) {
    checkAttrs(algo, kAlgoAttrs);
    Schedule s;
    const bool hasOutOfPlace = !algo.attribute("outofplace").empty();
    const bool hasMin = !algo.attribute("minBytes").empty();
    const bool hasMax = !algo.attribute("maxBytes").empty();
    if (hasOutOfPlace) {
      s.dialect = MscclDialect::New;
    } else if (hasMin || hasMax) {
      s.dialect = MscclDialect::OldRuntime;
    } else {
      s.dialect = MscclDialect::Old;
    }
    s.name = algo.attribute("name").value();
    {
      const std::string_view proto = required(algo, "proto");
      auto p = core::parseProtocol(proto);
      if (!p) {
        throw ImportError{
            attrOffset(algo, "proto"),
            fmt::format("attribute 'proto' of <algo>: expected Simple, LL or LL128, found \"{}\"", proto)};
      }
      s.protocol = *p;
    }
    s.nChannels = intAttr(algo, "nchannels", 1, core::kMaxScheduleChannels);
    s.chunksPerLoop = intAttr(algo, "nchunksperloop", 1, core::kMaxScheduleChunks);
    s.nRanks = intAttr(algo, "ngpus", 1, core::kMaxScheduleRanks);
    {
      const std::string_view coll = required(algo, "coll");
      auto c = core::parseCollective(coll);
      if (!c) {
        throw ImportError{attrOffset(algo, "coll"),
                          fmt::format("attribute 'coll' of <algo>: unsupported collective \"{}\" (supported: "
                                      "allgather, reducescatter/reduce_scatter, allreduce, broadcast, reduce, "
                                      "alltoall, custom)",
                                      coll)};
      }
      s.collective = *c;
    }
    s.inPlace = flagAttr(algo, "inplace");
    if (s.dialect == MscclDialect::New) {
      s.outOfPlace = flagAttr(algo, "outofplace");
      const char* why = "the new dialect (a file with 'outofplace') requires minBytes and maxBytes";
      required(algo, "minBytes", why);
      required(algo, "maxBytes", why);
    } else {
      // The older runtimes have no 'outofplace': an algorithm serves either in-place or out-of-place calls.
      s.outOfPlace = !s.inPlace;
      if (s.dialect == MscclDialect::OldRuntime) {
        const char* why = "minBytes and maxBytes come together";
        required(algo, "minBytes", why);
        required(algo, "maxBytes", why);
      }
    }
    if (hasMin) s.minBytes = u64Attr(algo, "minBytes");
    if (hasMax) s.maxBytes = u64Attr(algo, "maxBytes");
    if (pugi::xml_attribute a = algo.attribute("redop")) s.redop = std::string(a.value());
    if (algo.attribute("nthreads")) s.nThreads = intAttr(algo, "nthreads", 0, core::kMaxScheduleThreads);
    if (algo.attribute("root")) s.root = intAttr(algo, "root", 0, s.nRanks - 1);
    if (pugi::xml_attribute a = algo.attribute("customkind")) {
      s.customKind = a.value();
    } else if (s.collective == Collective::Custom) {
      s.customKind = s.name;
    }

    s.ranks.resize(static_cast<std::size_t>(s.nRanks));
    std::vector<std::size_t> gpuSeenAt(static_cast<std::size_t>(s.nRanks), std::string_view::npos);
    std::int64_t totalChunks = 0;
    int nGpus = 0;
    for (pugi::xml_node n : algo.children()) {
      if (n.type() != pugi::node_element) {
        checkNonElement(n, "<algo>");
        continue;
      }
      if (std::string_view(n.name()) != "gpu") {
        throw ImportError{nodeOffset(n),
                          fmt::format("unexpected element <{}> inside <algo> (expected <gpu>)", n.name())};
      }
      checkAttrs(n, kGpuAttrs);
      const int id = intAttr(n, "id", 0, std::numeric_limits<int>::max());
      if (id >= s.nRanks) {
        throw ImportError{attrOffset(n, "id"), fmt::format("gpu id {} is out of range: ngpus is {}, so ids must be "
                                                           "0..{}",
                                                           id, s.nRanks, s.nRanks - 1)};
      }
      auto& seen = gpuSeenAt[static_cast<std::size_t>(id)];
      if (seen != std::string_view::npos) {
        throw ImportError{attrOffset(n, "id"),
                          fmt::format("duplicate gpu id {} (first defined at line {})", id, lineOf(seen))};
      }
      seen = nodeOffset(n);
      ++nGpus;
      core::RankProgram& rp = s.ranks[static_cast<std::size_t>(id)];
      readGpu(n, rp, id, s.nRanks);
      totalChunks += std::int64_t{rp.inputChunks} + rp.outputChunks + rp.scratchChunks;
      if (totalChunks > core::kMaxScheduleTotalChunks) {
        throw ImportError{nodeOffset(n), fmt::format("the buffers of all gpus together exceed the limit of {} chunks",
                                                     core::kMaxScheduleTotalChunks)};
      }
    }
    if (nGpus != s.nRanks) {
      int missing = 0;
      while (missing < s.nRanks && gpuSeenAt[static_cast<std::size_t>(missing)] != std::string_view::npos) ++missing;
      throw ImportError{attrOffset(algo, "ngpus"), fmt::format("ngpus is {} but the file has {} <gpu> elements "
                                                               "(gpu id {} is missing)",
                                                               s.nRanks, nGpus, missing)};
    }
    return s;
  }

  void readGpu(const pugi::xml_node& g, core::RankProgram& rp, int id, int nRanks) {
    rp.rank = id;
    rp.inputChunks = intAttr(g, "i_chunks", 0, core::kMaxScheduleChunks);
    rp.outputChunks = intAttr(g, "o_chunks", 0, core::kMaxScheduleChunks);
    rp.scratchChunks = intAttr(g, "s_chunks", 0, core::kMaxScheduleChunks);
    std::map<int, std::size_t> tbSeenAt;
    for (pugi::xml_node n : g.children()) {
      if (n.type() != pugi::node_element) {
        checkNonElement(n, "<gpu>");
        continue;
      }
      const std::string_view name = n.name();
      if (name == "copy") {
        checkAttrs(n, kCopyAttrs);
        checkLeaf(n);
        core::LocalCopy c;
        c.inputOffset = intAttr(n, "i_off", 0, core::kMaxScheduleChunks);
        c.outputOffset = intAttr(n, "o_off", 0, core::kMaxScheduleChunks);
        rp.localCopies.push_back(c);
        continue;
      }
      if (name != "tb") {
        throw ImportError{nodeOffset(n),
                          fmt::format("unexpected element <{}> inside <gpu> (expected <tb> or <copy>)", name)};
      }
      checkAttrs(n, kTbAttrs);
      core::ThreadBlock tb;
      tb.id = intAttr(n, "id", 0, core::kMaxScheduleBlockId);
      auto [it, fresh] = tbSeenAt.emplace(tb.id, nodeOffset(n));
      if (!fresh) {
        throw ImportError{attrOffset(n, "id"), fmt::format("duplicate thread block id {} on gpu {} (first defined at "
                                                           "line {})",
                                                           tb.id, id, lineOf(it->second))};
      }
      tb.sendPeer = intAttr(n, "send", -1, nRanks - 1);
      tb.recvPeer = intAttr(n, "recv", -1, nRanks - 1);
      tb.channel = intAttr(n, "chan", -1, core::kMaxScheduleChannels - 1);
      readSteps(n, tb);
      rp.threadBlocks.push_back(std::move(tb));
    }
  }

  void readSteps(const pugi::xml_node& t, core::ThreadBlock& tb) {
    for (pugi::xml_node n : t.children()) {
      if (n.type() != pugi::node_element) {
        checkNonElement(n, "<tb>");
        continue;
      }
      if (std::string_view(n.name()) != "step") {
        throw ImportError{nodeOffset(n),
                          fmt::format("unexpected element <{}> inside <tb> (expected <step>)", n.name())};
      }
      checkAttrs(n, kStepAttrs);
      checkLeaf(n);
      const int expected = static_cast<int>(tb.steps.size());
      const int sIdx = intAttr(n, "s", 0, std::numeric_limits<int>::max());
      if (sIdx != expected) {
        throw ImportError{attrOffset(n, "s"), fmt::format("step s=\"{}\" where s=\"{}\" was expected: the steps of a "
                                                          "<tb> must be numbered 0..n-1 in order",
                                                          sIdx, expected)};
      }
      Step st;
      {
        const std::string_view type = required(n, "type");
        auto op = parseMscclStepType(type);
        if (!op) {
          throw ImportError{attrOffset(n, "type"), fmt::format("unknown step type \"{}\" (known: s r rcs rrs rrc rrcs "
                                                               "cpy re nop)",
                                                               type)};
        }
        st.op = *op;
      }
      st.srcBuf = bufferAttr(n, "srcbuf");
      st.srcOff = intAttr(n, "srcoff", -1, core::kMaxScheduleChunks);
      st.dstBuf = bufferAttr(n, "dstbuf");
      st.dstOff = intAttr(n, "dstoff", -1, core::kMaxScheduleChunks);
      st.count = intAttr(n, "cnt", 0, core::kMaxScheduleChunks);
      const int depid = intAttr(n, "depid", -1, core::kMaxScheduleBlockId);
      const int deps = intAttr(n, "deps", -1, core::kMaxScheduleStepIndex);
      if (depid >= 0) {
        if (deps < 0) {
          throw ImportError{
              attrOffset(n, "deps"),
              fmt::format("depid=\"{}\" names a thread block but deps=\"{}\" names no step", depid, deps)};
        }
        st.deps.push_back(StepRef{depid, deps});
      }
      st.hasDep = flagAttr(n, "hasdep");
      tb.steps.push_back(std::move(st));
    }
  }

  BufferKind bufferAttr(const pugi::xml_node& n, const char* name) const {
    const std::string_view v = required(n, name);
    auto b = parseBufferLetter(v);
    if (!b) {
      throw ImportError{attrOffset(n, name), fmt::format("attribute '{}' of <{}>: unknown buffer \"{}\" (expected i, "
                                                         "o or s)",
                                                         name, n.name(), v)};
    }
    return *b;
  }

  int lineOf(std::size_t offset) const {
    int line = 1;
    for (std::size_t i = 0; i < offset && i < text_.size(); ++i) line += text_[i] == '\n' ? 1 : 0;
    return line;
  }

  std::string_view text_;
};

// ---------------------------------------------------------------------------------------------------------------
// Export

std::string escapeAttr(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("&#{};", static_cast<int>(c));
        } else {
          out += ch;
        }
    }
  }
  return out;
}

Step makeNop(StepRef dep) {
  Step nop;
  nop.op = StepOp::Nop;
  nop.srcBuf = BufferKind::Input;
  nop.srcOff = -1;
  nop.dstBuf = BufferKind::Output;
  nop.dstOff = -1;
  nop.count = 0;
  nop.deps = {dep};
  nop.hasDep = false;
  return nop;
}

bool hasMultiDeps(const core::RankProgram& rp) {
  for (const auto& tb : rp.threadBlocks) {
    for (const auto& st : tb.steps) {
      if (st.deps.size() > 1) return true;
    }
  }
  return false;
}

// Rewrites every step of the rank with several dependencies into nops + the step, renumbering the block and every
// dependency pointing into it.
void expandMultiDeps(core::RankProgram& rp) {
  // newIndex[b][i]: where step i of block b lands.
  std::vector<std::vector<int>> newIndex(rp.threadBlocks.size());
  for (std::size_t b = 0; b < rp.threadBlocks.size(); ++b) {
    int next = 0;
    for (const auto& st : rp.threadBlocks[b].steps) {
      next += st.deps.size() > 1 ? static_cast<int>(st.deps.size()) - 1 : 0;
      newIndex[b].push_back(next++);
    }
  }
  auto remap = [&](StepRef r) {
    const int b = core::findThreadBlock(rp, r.tb);
    if (b < 0) return r;
    const auto& idx = newIndex[static_cast<std::size_t>(b)];
    if (r.step < 0 || r.step >= static_cast<int>(idx.size())) return r;
    return StepRef{r.tb, idx[static_cast<std::size_t>(r.step)]};
  };
  std::vector<StepRef> movedTargets;
  for (auto& tb : rp.threadBlocks) {
    std::vector<Step> steps;
    steps.reserve(tb.steps.size());
    for (auto& st : tb.steps) {
      for (auto& d : st.deps) d = remap(d);
      if (st.deps.size() > 1) {
        for (std::size_t j = 0; j + 1 < st.deps.size(); ++j) steps.push_back(makeNop(st.deps[j]));
        movedTargets.insert(movedTargets.end(), st.deps.begin(), st.deps.end());
        st.deps = {st.deps.back()};
      }
      steps.push_back(std::move(st));
    }
    tb.steps = std::move(steps);
  }
  for (const StepRef& r : movedTargets) {
    const int b = core::findThreadBlock(rp, r.tb);
    if (b < 0) continue;
    auto& steps = rp.threadBlocks[static_cast<std::size_t>(b)].steps;
    if (r.step >= 0 && r.step < static_cast<int>(steps.size())) steps[static_cast<std::size_t>(r.step)].hasDep = true;
  }
}

// Ranks where no step has more than one dependency come back unchanged.
Schedule expandMultiDeps(const Schedule& in) {
  Schedule s = in;
  for (auto& rp : s.ranks) {
    if (hasMultiDeps(rp)) expandMultiDeps(rp);
  }
  return s;
}

std::string collName(Collective c, MscclDialect d) {
  if (c == Collective::ReduceScatter) return d == MscclDialect::New ? "reducescatter" : "reduce_scatter";
  return std::string(core::toString(c));
}

}  // namespace

core::Result<Schedule> importMscclXml(std::string_view text, std::string_view fileName) {
  Diagnostic d;
  d.file = std::string(fileName);
  try {
    Importer imp(text);
    try {
      return imp.run();
    } catch (const ImportError& e) {
      auto [line, col] = core::lineColumn(text, e.offset);
      d.line = line;
      d.column = col;
      d.message = e.message;
      return d;
    }
  } catch (const std::exception& e) {
    d.message = fmt::format("cannot read MSCCL XML: {}", e.what());
    return d;
  } catch (...) {
    d.message = "cannot read MSCCL XML: unexpected error";
    return d;
  }
}

namespace {

// With a sink, the text goes there after every rank once a MiB of it has gathered. Ranks are expanded
// (expandMultiDeps) one at a time: the schedule is not copied.
std::string writeXml(const Schedule& s, std::optional<MscclDialect> dialectOpt, std::ostream* sink) {
  const MscclDialect dialect = dialectOpt.value_or(s.dialect);
  std::string out;
  out += fmt::format(R"(<algo name="{}" proto="{}" nchannels="{}" nchunksperloop="{}" ngpus="{}" coll="{}")",
                     escapeAttr(s.name), core::toString(s.protocol), s.nChannels, s.chunksPerLoop, s.nRanks,
                     collName(s.collective, dialect));
  out += fmt::format(R"( inplace="{}")", s.inPlace ? 1 : 0);
  if (dialect == MscclDialect::New) out += fmt::format(R"( outofplace="{}")", s.outOfPlace ? 1 : 0);
  if (dialect != MscclDialect::Old) out += fmt::format(R"( minBytes="{}" maxBytes="{}")", s.minBytes, s.maxBytes);
  if (s.redop) out += fmt::format(R"( redop="{}")", escapeAttr(*s.redop));
  if (s.nThreads) out += fmt::format(R"( nthreads="{}")", *s.nThreads);
  if (s.collective == Collective::Broadcast || s.collective == Collective::Reduce || s.root != 0) {
    out += fmt::format(R"( root="{}")", s.root);
  }
  const std::string_view impliedKind = s.collective == Collective::Custom ? std::string_view(s.name) : "";
  if (s.customKind != impliedKind) out += fmt::format(R"( customkind="{}")", escapeAttr(s.customKind));
  out += ">\n";
  for (const auto& given : s.ranks) {
    std::optional<core::RankProgram> expanded;
    if (hasMultiDeps(given)) expandMultiDeps(expanded.emplace(given));
    const core::RankProgram& rp = expanded ? *expanded : given;
    out += fmt::format(R"(  <gpu id="{}" i_chunks="{}" o_chunks="{}" s_chunks="{}">)", rp.rank, rp.inputChunks,
                       rp.outputChunks, rp.scratchChunks);
    out += '\n';
    for (const auto& c : rp.localCopies) {
      out += fmt::format(R"(    <copy i_off="{}" o_off="{}"/>)", c.inputOffset, c.outputOffset);
      out += '\n';
    }
    for (const auto& tb : rp.threadBlocks) {
      out +=
          fmt::format(R"(    <tb id="{}" send="{}" recv="{}" chan="{}">)", tb.id, tb.sendPeer, tb.recvPeer, tb.channel);
      out += '\n';
      for (std::size_t i = 0; i < tb.steps.size(); ++i) {
        const Step& st = tb.steps[i];
        const StepRef dep = st.deps.empty() ? StepRef{-1, -1} : st.deps.front();
        out += fmt::format(
            R"(      <step s="{}" type="{}" srcbuf="{}" srcoff="{}" dstbuf="{}" dstoff="{}" cnt="{}" depid="{}" )"
            R"(deps="{}" hasdep="{}"/>)",
            i, mscclStepType(st.op), bufferLetter(st.srcBuf), st.srcOff, bufferLetter(st.dstBuf), st.dstOff, st.count,
            dep.tb, dep.step, st.hasDep ? 1 : 0);
        out += '\n';
      }
      out += "    </tb>\n";
    }
    out += "  </gpu>\n";
    if (sink && out.size() >= (std::size_t{1} << 20)) {
      sink->write(out.data(), static_cast<std::streamsize>(out.size()));
      out.clear();
    }
  }
  out += "</algo>\n";
  if (sink) {
    sink->write(out.data(), static_cast<std::streamsize>(out.size()));
    out.clear();
  }
  return out;
}

}  // namespace

std::string exportMscclXml(const Schedule& s, std::optional<MscclDialect> dialect) {
  return writeXml(s, dialect, nullptr);
}

void writeMscclXml(const Schedule& s, std::ostream& out, std::optional<MscclDialect> dialect) {
  writeXml(s, dialect, &out);
}

namespace {

// MSCCL runtime limits. Sources (read in the public repositories):
//  * new dialect: Azure/msccl-executor-nccl, src/include/msccl/msccl_struct.h (commit 206e0c49):
//      MSCCL_MAX_NUM_STEPS 64 (later commits, e.g. 7e2022f2, make it a build variable MSCCL_MAX_NUM_STEPS passed
//      by the Makefile; RCCL's copy of the executor uses 256), MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL 32,
//      MSCCL_MAX_NUM_THREAD_BLOCKS = 32 * MAXCHANNELS, MSCCL_MAX_COUNT 72 (cnt must be < 72),
//      dependentBid is int8_t and offsets are int16_t in mscclTransmission;
//    src/include/device.h (commit 8959f0e5): MAXCHANNELS 32;
//    src/misc/msccl/msccl_parser.cc (commit 3b40a2a8): rejects s >= MSCCL_MAX_NUM_STEPS, bid >= max blocks,
//      missing block ids ("thread block %d is missing"), chan outside [0, MAXCHANNELS], a peer equal to the gpu,
//      a send/recv step in a block without that peer, more than 32 send or recv peers on a channel, cnt outside
//      [0, 72), and nop dependencies followed by a step without its own dependency;
//    src/include/msccl/msccl_parser.h: MAX_STR_LEN 255 per attribute value (no bounds check), MAX_SUBS 1024
//      children per element, MAX_NODES 32768 elements loaded per rank.
//  * old and old-runtime dialects: microsoft/msccl, src/include/msccl.h (commit 01cc7cfe): MSCCL_MAX_NUM_STEPS 256,
//      MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL 32, MSCCL_MAX_NUM_THREAD_BLOCKS 108*2 = 216, MSCCL_MAX_COUNT 72,
//      MSCCL_MAX_ALGO_NAME 63; MAXCHANNELS 32 (NCCL 2.8-2.12 devcomm.h).
constexpr int kMaxChannels = 32;
constexpr int kMaxBlocksPerChannel = 32;
constexpr int kMaxCount = 72;
constexpr int kMaxDepBlockId = 127;  // int8_t dependentBid
constexpr int kMaxOffset = 32767;    // int16_t offsets
constexpr std::size_t kMaxStrLen = 255;
constexpr int kMaxSubs = 1024;
constexpr int kMaxNodes = 32768;

struct Limits {
  int maxSteps;
  int maxBlocks;
  std::size_t maxName;
  std::string_view source;
};

Limits limitsFor(MscclDialect d) {
  if (d == MscclDialect::New) {
    return {64, kMaxBlocksPerChannel * kMaxChannels, kMaxStrLen, "Azure/msccl-executor-nccl"};
  }
  return {256, 216, 63, "microsoft/msccl"};
}

}  // namespace

std::vector<std::string> checkMscclLimits(const Schedule& in) {
  std::vector<std::string> v;
  const Limits lim = limitsFor(in.dialect);
  const Schedule s = expandMultiDeps(in);
  if (s.nChannels > kMaxChannels) {
    v.push_back(fmt::format("nchannels {} exceeds MAXCHANNELS = {}", s.nChannels, kMaxChannels));
  }
  if (s.name.size() > lim.maxName) {
    v.push_back(fmt::format("the algorithm name has {} characters; {} reads at most {}", s.name.size(), lim.source,
                            lim.maxName));
  }
  if (s.maxBytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
      s.minBytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    v.push_back("minBytes/maxBytes do not fit the runtime's int64_t");
  }
  if (s.maxBytes != 0 && s.maxBytes < s.minBytes) {
    v.push_back(fmt::format("maxBytes {} is below minBytes {}: the runtime would never select this algorithm",
                            s.maxBytes, s.minBytes));
  }
  if (static_cast<int>(s.ranks.size()) > kMaxSubs) {
    v.push_back(
        fmt::format("{} <gpu> elements; the runtime's XML reader keeps at most {} children", s.ranks.size(), kMaxSubs));
  }
  for (const auto& rp : s.ranks) {
    const int r = rp.rank;
    const int nTb = static_cast<int>(rp.threadBlocks.size());
    if (nTb > lim.maxBlocks) {
      v.push_back(fmt::format("rank {}: {} thread blocks; {} allows at most {} (MSCCL_MAX_NUM_THREAD_BLOCKS)", r, nTb,
                              lim.source, lim.maxBlocks));
    }
    if (nTb + static_cast<int>(rp.localCopies.size()) > kMaxSubs) {
      v.push_back(fmt::format("rank {}: {} children of <gpu>; the runtime's XML reader keeps at most {}", r,
                              nTb + static_cast<int>(rp.localCopies.size()), kMaxSubs));
    }
    std::vector<char> present(static_cast<std::size_t>(std::max(nTb, 0)), 0);
    std::map<int, int> sendersPerChannel, receiversPerChannel;
    std::size_t nodes = 1 + s.ranks.size();
    for (const auto& tb : rp.threadBlocks) {
      nodes += 1 + tb.steps.size();
      if (tb.id >= 0 && tb.id < nTb) present[static_cast<std::size_t>(tb.id)] = 1;
      if (tb.id >= lim.maxBlocks) {
        v.push_back(
            fmt::format("rank {} tb {}: id must be below {} (MSCCL_MAX_NUM_THREAD_BLOCKS)", r, tb.id, lim.maxBlocks));
      }
      if (tb.channel < 0 || tb.channel >= kMaxChannels) {
        v.push_back(fmt::format("rank {} tb {}: channel {} outside [0, {})", r, tb.id, tb.channel, kMaxChannels));
      } else if (tb.channel >= s.nChannels) {
        v.push_back(fmt::format("rank {} tb {}: channel {} but nchannels is {}", r, tb.id, tb.channel, s.nChannels));
      }
      if (tb.sendPeer == r || tb.recvPeer == r) {
        v.push_back(fmt::format("rank {} tb {}: a block cannot send to or receive from its own rank", r, tb.id));
      }
      if (tb.sendPeer >= 0) ++sendersPerChannel[tb.channel];
      if (tb.recvPeer >= 0) ++receiversPerChannel[tb.channel];
      if (static_cast<int>(tb.steps.size()) > lim.maxSteps) {
        v.push_back(fmt::format("rank {} tb {}: {} steps (nops included); {} allows at most {} (MSCCL_MAX_NUM_STEPS)",
                                r, tb.id, tb.steps.size(), lim.source, lim.maxSteps));
      }
      bool pendingNopDeps = false;
      for (std::size_t i = 0; i < tb.steps.size(); ++i) {
        const Step& st = tb.steps[i];
        const auto where = [&] { return fmt::format("rank {} tb {} step {}", r, tb.id, i); };
        if (st.op != StepOp::Nop && (st.count < 0 || st.count >= kMaxCount)) {
          v.push_back(fmt::format("{}: cnt {} outside [0, {}) (MSCCL_MAX_COUNT)", where(), st.count, kMaxCount));
        }
        if (st.srcOff > kMaxOffset || st.dstOff > kMaxOffset) {
          v.push_back(fmt::format("{}: offset above {} (stored as int16_t)", where(), kMaxOffset));
        }
        for (const auto& d : st.deps) {
          if (d.tb > kMaxDepBlockId) {
            v.push_back(fmt::format("{}: depends on tb {}; the runtime stores dependency block ids as int8_t (<= {})",
                                    where(), d.tb, kMaxDepBlockId));
          }
        }
        if (core::opSends(st.op) && tb.sendPeer < 0) {
          v.push_back(fmt::format("{}: a sending step in a block without a send peer", where()));
        }
        if (core::opReceives(st.op) && tb.recvPeer < 0) {
          v.push_back(fmt::format("{}: a receiving step in a block without a recv peer", where()));
        }
        if (st.op == StepOp::Nop) {
          pendingNopDeps = pendingNopDeps || !st.deps.empty();
        } else {
          if (pendingNopDeps && st.deps.empty() && in.dialect == MscclDialect::New) {
            v.push_back(
                fmt::format("{}: follows nop dependencies but has no dependency of its own; the executor "
                            "rejects such a chain",
                            where()));
          }
          pendingNopDeps = false;
        }
      }
    }
    for (int i = 0; i < nTb; ++i) {
      if (!present[static_cast<std::size_t>(i)]) {
        v.push_back(
            fmt::format("rank {}: thread block ids must be 0..{} without gaps; id {} is missing", r, nTb - 1, i));
        break;
      }
    }
    for (const auto& [chan, n] : sendersPerChannel) {
      if (n > kMaxBlocksPerChannel) {
        v.push_back(fmt::format("rank {} channel {}: {} sending blocks; at most {} per channel", r, chan, n,
                                kMaxBlocksPerChannel));
      }
    }
    for (const auto& [chan, n] : receiversPerChannel) {
      if (n > kMaxBlocksPerChannel) {
        v.push_back(fmt::format("rank {} channel {}: {} receiving blocks; at most {} per channel", r, chan, n,
                                kMaxBlocksPerChannel));
      }
    }
    if (static_cast<int>(nodes) > kMaxNodes) {
      v.push_back(
          fmt::format("rank {}: {} XML elements to load; the runtime's reader is limited to {}", r, nodes, kMaxNodes));
    }
  }
  return v;
}

}  // namespace optiflow::compiler
