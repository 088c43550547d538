#include "optiflow/synth/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/units.h"

namespace optiflow::synth {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// plan.json is about five levels deep; anything far deeper is not a plan, and refusing it early keeps hostile
// input from costing stack or memory.
constexpr int kMaxNesting = 64;

// ---------------------------------------------------------------------------------------------------------------
// Field paths and where they are in the text

struct Seg {
  std::string key;  // empty: array index
  std::size_t index = 0;
};
using Path = std::vector<Seg>;

std::string pathString(const Path& path) {
  if (path.empty()) return "(top level)";
  std::string s;
  for (const Seg& seg : path) {
    if (seg.key.empty()) {
      s += fmt::format("[{}]", seg.index);
    } else {
      if (!s.empty()) s += '.';
      s += seg.key;
    }
  }
  return s;
}

// Thrown inside this file only; renderReport turns it into a Diagnostic.
struct FieldError {
  Path path;
  std::string message;
};

std::pair<int, int> lineColumn(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  int line = 1;
  std::size_t lineStart = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      lineStart = i + 1;
    }
  }
  return {line, static_cast<int>(offset - lineStart) + 1};
}

// Walks text that nlohmann already accepted, so it can be forgiving: it only has to find where a value starts.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  std::size_t pos() const { return pos_; }
  void advance() { pos_ = std::min(pos_ + 1, text_.size()); }
  void ws() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool at(char c) {
    ws();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  std::string_view string() {  // at '"'
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') pos_ += text_[pos_] == '\\' ? 2 : 1;
    pos_ = std::min(pos_, text_.size());
    const std::string_view s = text_.substr(start, pos_ - start);
    advance();
    return s;
  }
  void skipValue() {
    ws();
    int depth = 0;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '"') {
        string();
        if (depth == 0) return;
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return;
        if (--depth == 0) {
          advance();
          return;
        }
      } else if (c == ',' && depth == 0) {
        return;
      }
      ++pos_;
    }
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

// Byte offset of the value at `path`, or of the deepest enclosing value found (a missing key points at its object).
std::size_t locate(std::string_view text, const Path& path) {
  Scanner s(text);
  s.ws();
  std::size_t found = s.pos();
  for (const Seg& seg : path) {
    if (!seg.key.empty()) {
      if (!s.at('{')) return found;
      s.advance();
      bool hit = false;
      while (s.at('"')) {
        const std::string_view key = s.string();
        if (!s.at(':')) return found;
        s.advance();
        if (key == seg.key) {
          hit = true;
          break;
        }
        s.skipValue();
        if (!s.at(',')) return found;
        s.advance();
      }
      if (!hit) return found;
    } else {
      if (!s.at('[')) return found;
      s.advance();
      for (std::size_t i = 0; i < seg.index; ++i) {
        s.skipValue();
        if (!s.at(',')) return found;
        s.advance();
      }
    }
    s.ws();
    found = s.pos();
  }
  return found;
}

// Offset of the first bracket that goes deeper than kMaxNesting, if any.
std::optional<std::size_t> tooDeep(std::string_view text) {
  int depth = 0;
  bool inString = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        inString = false;
      }
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxNesting) return i;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

// Parses `text` or says where it is not JSON; `line` is the line of text within its file (history.jsonl).
std::optional<core::Diagnostic> parseJson(std::string_view text, const std::string& file, int line, json& out) {
  core::Diagnostic d{file, 0, 0, {}};
  auto place = [&](std::size_t offset) {
    const auto [l, c] = lineColumn(text, offset);
    d.line = line + l - 1;
    d.column = c;
  };
  if (const auto deep = tooDeep(text)) {
    place(*deep);
    d.message = fmt::format("JSON nested deeper than {} levels", kMaxNesting);
    return d;
  }
  try {
    out = json::parse(text.begin(), text.end());
    return std::nullopt;
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points at the character where the parser gave up.
    place(e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error ..." -> what follows the
    // position, which the diagnostic already carries.
    const auto column = what.find("column");
    const auto colon = column == std::string::npos ? std::string::npos : what.find(": ", column);
    if (colon != std::string::npos) what = what.substr(colon + 2);
    d.message = fmt::format("invalid JSON: {}", what);
    return d;
  } catch (const std::exception& e) {
    d.message = fmt::format("invalid JSON: {}", e.what());
    return d;
  }
}

core::Diagnostic fieldDiagnostic(std::string_view text, const std::string& file, int line, const FieldError& e) {
  const auto [l, c] = lineColumn(text, locate(text, e.path));
  return core::Diagnostic{file, line + l - 1, c, fmt::format("{}: {}", pathString(e.path), e.message)};
}

// ---------------------------------------------------------------------------------------------------------------
// Typed access that names the field on failure

std::string_view typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "something else";
  }
}

class Node {
 public:
  Node(const json& v, Path path) : v_(&v), path_(std::move(path)) {}

  bool isNull() const { return v_->is_null(); }
  const Path& path() const { return path_; }

  Node operator[](std::string_view key) const {
    auto v = find(key);
    if (!v) fail(child(key), "missing");
    return *v;
  }
  // Absent or null.
  std::optional<Node> optional(std::string_view key) const {
    auto v = find(key);
    if (!v || v->isNull()) return std::nullopt;
    return v;
  }
  std::vector<Node> items() const {
    if (!v_->is_array()) wrongType("an array");
    std::vector<Node> out;
    out.reserve(v_->size());
    for (std::size_t i = 0; i < v_->size(); ++i) {
      Path p = path_;
      p.push_back(Seg{{}, i});
      out.emplace_back((*v_)[i], std::move(p));
    }
    return out;
  }
  void requireObject() const {
    if (!v_->is_object()) wrongType("an object");
  }

  std::string str() const {
    if (!v_->is_string()) wrongType("a string");
    return v_->get<std::string>();
  }
  double number() const {
    if (!v_->is_number()) wrongType("a number");
    return v_->get<double>();
  }
  // Times and bounds: JSON cannot say NaN, but it can say -1.
  double nonNegative() const {
    const double v = number();
    if (!(v >= 0)) fail(path_, "expected a non-negative number");
    return v;
  }
  std::uint64_t count() const {
    if (!v_->is_number_unsigned()) wrongType("a non-negative integer");
    return v_->get<std::uint64_t>();
  }
  int integer() const {
    if (v_->is_number_unsigned()) {
      const auto u = v_->get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<int>::max())) return static_cast<int>(u);
    } else if (v_->is_number_integer()) {
      const auto i = v_->get<std::int64_t>();
      if (i >= std::numeric_limits<int>::min() && i <= std::numeric_limits<int>::max()) return static_cast<int>(i);
    } else {
      wrongType("an integer");
    }
    fail(path_, "integer out of range");
  }
  // Rank and node counts: a zero would turn every busbw into 0 and plot it.
  int positive() const {
    const int v = integer();
    if (v < 1) fail(path_, "expected a positive integer");
    return v;
  }
  bool boolean() const {
    if (!v_->is_boolean()) wrongType("a boolean");
    return v_->get<bool>();
  }

  [[noreturn]] static void fail(Path path, std::string message) {
    throw FieldError{std::move(path), std::move(message)};
  }

 private:
  Path child(std::string_view key) const {
    Path p = path_;
    p.push_back(Seg{std::string(key), 0});
    return p;
  }
  std::optional<Node> find(std::string_view key) const {
    requireObject();
    const auto it = v_->find(std::string(key));
    if (it == v_->end()) return std::nullopt;
    return Node(*it, child(key));
  }
  [[noreturn]] void wrongType(std::string_view expected) const {
    fail(path_, fmt::format("expected {} (got {})", expected, typeName(*v_)));
  }

  const json* v_;
  Path path_;
};

std::optional<std::string> optString(const Node& n, std::string_view key) {
  auto v = n.optional(key);
  return v ? std::optional(v->str()) : std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// What the page shows

struct Choice {
  std::string algorithm;
  std::string protocol;
  int channels = 0;
  double timeUs = 0;  // 0: no schedule at this size
};

struct Best {
  std::string candidate;
  std::string program;
  std::string config;
  double timeUs = 0;
  std::string programFile;
  std::string scheduleJson;
  std::string scheduleXml;
};

struct Entry {
  std::uint64_t sizeBytes = 0;
  std::optional<std::uint64_t> minBytes;
  std::optional<std::uint64_t> maxBytes;
  double boundUs = 0;
  std::optional<double> effectiveBoundUs;
  std::optional<Choice> nccl;
  std::optional<Choice> native;
  std::optional<Best> best;
};

struct CollectiveRun {
  std::string name;
  core::Collective kind = core::Collective::AllGather;
  int ranks = 0;
  std::optional<int> nodes;
  std::vector<Entry> entries;
};

struct Plan {
  std::string topology;
  int ranks = 0;
  int nodes = 0;
  std::optional<int> gpusPerNode;
  std::vector<std::pair<std::string, std::string>> meta;  // label, value, as shown under the title
  std::vector<CollectiveRun> collectives;
};

struct HistorySize {
  std::uint64_t sizeBytes = 0;
  bool ok = false;
  double timeUs = 0;
  double boundUs = 0;
};

struct HistoryRecord {
  std::string id;
  int round = 0;
  std::string stage;
  std::vector<HistorySize> sizes;
};

struct History {
  std::vector<HistoryRecord> records;
  bool truncatedTail = false;
};

std::optional<Choice> readChoice(const Node& entry, std::string_view key) {
  const Node n = entry[key];  // present, possibly null
  if (n.isNull()) return std::nullopt;
  Choice c;
  c.algorithm = n["algorithm"].str();
  c.protocol = n["protocol"].str();
  c.channels = n["channels"].integer();
  c.timeUs = n["time_us"].nonNegative();
  return c;
}

std::optional<Best> readBest(const Node& entry) {
  const Node n = entry["best"];
  if (n.isNull()) return std::nullopt;
  Best b;
  b.program = n["program"].str();
  b.timeUs = n["time_us"].nonNegative();
  b.candidate = optString(n, "candidate").value_or("");
  b.config = optString(n, "config").value_or("");
  b.programFile = optString(n, "program_file").value_or("");
  b.scheduleJson = optString(n, "schedule_json").value_or("");
  b.scheduleXml = optString(n, "schedule_xml").value_or("");
  return b;
}

Plan readPlan(const json& doc) {
  const Node root(doc, {});
  root.requireObject();
  if (auto f = optString(root, "format"); f && *f != "optiflow-plan") {
    Node::fail({Seg{"format", 0}}, fmt::format("expected \"optiflow-plan\", not \"{}\"", *f));
  }
  if (auto v = root.optional("version"); v && v->integer() != 1) {
    Node::fail({Seg{"version", 0}}, fmt::format("version {} is not supported (this build reads 1)", v->integer()));
  }
  Plan p;
  p.topology = root["topology"].str();
  p.ranks = root["ranks"].positive();
  p.nodes = root["nodes"].positive();
  if (auto g = root.optional("gpus_per_node")) p.gpusPerNode = g->integer();

  // The run's settings are informational and optional, but a value of the wrong type is reported, not guessed at.
  if (auto v = optString(root, "proposer")) p.meta.emplace_back("proposer", *v);
  if (auto v = optString(root, "evaluator")) p.meta.emplace_back("evaluator", *v);
  if (auto v = root.optional("seed")) p.meta.emplace_back("seed", fmt::format("{}", v->count()));
  if (auto v = root.optional("rounds")) p.meta.emplace_back("rounds", fmt::format("{}", v->integer()));
  if (auto v = root.optional("candidates")) p.meta.emplace_back("candidates", fmt::format("{}", v->integer()));
  if (auto v = root.optional("elapsed_s")) {
    const double s = v->nonNegative();
    p.meta.emplace_back("elapsed", s < 120 ? fmt::format("{:.1f} s", s)
                                           : fmt::format("{:.0f} min {:.0f} s", std::floor(s / 60), std::fmod(s, 60)));
  }
  if (auto v = optString(root, "stop_reason")) p.meta.emplace_back("stopped", *v);
  if (auto v = optString(root, "optiflow_version")) p.meta.emplace_back("optiflow", *v);

  for (const Node& c : root["collectives"].items()) {
    CollectiveRun run;
    const Node name = c["collective"];
    run.name = name.str();
    const auto kind = core::parseCollective(run.name);
    if (!kind) Node::fail(name.path(), fmt::format("unknown collective \"{}\"", run.name));
    run.kind = *kind;
    run.ranks = c.optional("ranks") ? c["ranks"].positive() : p.ranks;
    if (auto n = c.optional("nodes")) run.nodes = n->positive();
    for (const Node& e : c["entries"].items()) {
      Entry entry;
      entry.sizeBytes = e["size_bytes"].count();
      if (auto v = e.optional("min_bytes")) entry.minBytes = v->count();
      if (auto v = e.optional("max_bytes")) entry.maxBytes = v->count();
      entry.boundUs = e["bound_us"].nonNegative();
      if (auto v = e.optional("effective_bound_us")) entry.effectiveBoundUs = v->nonNegative();
      entry.nccl = readChoice(e, "nccl");
      entry.native = readChoice(e, "native");
      entry.best = readBest(e);
      run.entries.push_back(std::move(entry));
    }
    // The spec says ascending; sorting anyway keeps a hand-edited plan from drawing zigzags.
    std::stable_sort(run.entries.begin(), run.entries.end(),
                     [](const Entry& a, const Entry& b) { return a.sizeBytes < b.sizeBytes; });
    p.collectives.push_back(std::move(run));
  }
  return p;
}

HistoryRecord readRecord(const json& doc) {
  const Node root(doc, {});
  root.requireObject();
  HistoryRecord r;
  r.id = root["id"].str();
  r.round = root["round"].integer();
  r.stage = root["stage"].str();
  // Only evaluated candidates carry sizes; a rejected one may leave the array out.
  if (auto sizes = root.optional("sizes")) {
    for (const Node& s : sizes->items()) {
      HistorySize hs;
      hs.sizeBytes = s["size_bytes"].count();
      hs.ok = s["ok"].boolean();
      hs.timeUs = s.optional("time_us") ? s["time_us"].nonNegative() : 0;
      hs.boundUs = s.optional("bound_us") ? s["bound_us"].nonNegative() : 0;
      r.sizes.push_back(hs);
    }
  }
  return r;
}

std::optional<std::string> readFile(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(ss).str();
}

core::Result<Plan> loadPlan(const fs::path& dir) {
  const fs::path file = dir / "plan.json";
  const std::string name = file.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return core::Diagnostic{
        dir.string(), 0, 0,
        fs::exists(dir, ec) ? "not a directory (expected a run directory with plan.json)" : "no such directory"};
  }
  const auto text = readFile(file);
  if (!text) {
    return core::Diagnostic{name, 0, 0,
                            fs::exists(file, ec) ? "cannot read plan.json" : "missing (not a run directory?)"};
  }
  json doc;
  if (auto err = parseJson(*text, name, 1, doc)) return *err;
  try {
    return readPlan(doc);
  } catch (const FieldError& e) {
    return fieldDiagnostic(*text, name, 1, e);
  } catch (const std::exception& e) {
    return core::Diagnostic{name, 0, 0, fmt::format("cannot read the plan: {}", e.what())};
  }
}

// A missing history is no history; a last line without its newline is a write the run did not finish (it appends
// and flushes line by line), so it is skipped rather than failing the whole report.
core::Result<std::optional<History>> loadHistory(const fs::path& dir) {
  const fs::path file = dir / "history.jsonl";
  const std::string name = file.string();
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::optional<History>();
  const auto text = readFile(file);
  if (!text) return core::Diagnostic{name, 0, 0, "cannot read history.jsonl"};
  History h;
  std::size_t start = 0;
  int lineNo = 0;
  while (start < text->size()) {
    ++lineNo;
    const std::size_t end = text->find('\n', start);
    const bool last = end == std::string::npos;
    const std::string_view line = std::string_view(*text).substr(start, last ? std::string::npos : end - start);
    start = last ? text->size() : end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json doc;
    if (auto err = parseJson(line, name, lineNo, doc)) {
      if (last) {
        h.truncatedTail = true;
        break;
      }
      return *err;
    }
    try {
      h.records.push_back(readRecord(doc));
    } catch (const FieldError& e) {
      return fieldDiagnostic(line, name, lineNo, e);
    } catch (const std::exception& e) {
      return core::Diagnostic{name, lineNo, 0, fmt::format("cannot read the record: {}", e.what())};
    }
  }
  return std::optional<History>(std::move(h));
}

// ---------------------------------------------------------------------------------------------------------------
// Formatting

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
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
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Four significant digits, no exponent for everyday magnitudes, no trailing zeros.
std::string num(double v) {
  if (!std::isfinite(v)) return "-";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e15 || a < 1e-6) return fmt::format("{:.3g}", v);
  const int magnitude = static_cast<int>(std::floor(std::log10(a)));
  const int decimals = std::clamp(3 - magnitude, 0, 9);
  std::string s = fmt::format("{:.{}f}", v, decimals);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

std::string plural(int n, std::string_view what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

std::string coord(double v) { return fmt::format("{:.1f}", v); }

// Only relative paths inside the run directory become links: a plan that says "javascript:..." or "/etc/passwd"
// gets its text shown, not followed.
std::optional<std::string> safeHref(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.front() == '\\' || path.find(':') != std::string_view::npos) {
    return std::nullopt;
  }
  for (std::size_t start = 0; start <= path.size();) {
    const std::size_t end = std::min(path.find_first_of("/\\", start), path.size());
    if (path.substr(start, end - start) == "..") return std::nullopt;
    start = end + 1;
  }
  std::string out;
  for (const char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || std::string_view("-._~/!$&'()*+,;=@").find(ch) != std::string_view::npos) {
      out += ch;
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return esc(out);
}

std::string link(std::string_view path, std::string_view text) {
  if (auto href = safeHref(path)) return fmt::format("<a href=\"{}\">{}</a>", *href, esc(text));
  return esc(text);
}

std::string choiceLabel(const Choice& c) { return fmt::format("{}/{}/{}ch", c.algorithm, c.protocol, c.channels); }

// busbw in GB/s, nccl-tests style; nullopt where there is no time to convert.
std::optional<double> busbw(std::uint64_t sizeBytes, double timeUs, double factor) {
  if (!(timeUs > 0) || sizeBytes == 0) return std::nullopt;
  return core::gbps(static_cast<double>(sizeBytes), timeUs) * factor;
}

std::optional<double> choiceTime(const std::optional<Choice>& c) {
  if (!c || !(c->timeUs > 0)) return std::nullopt;
  return c->timeUs;
}

std::optional<double> bestTime(const std::optional<Best>& b) {
  if (!b || !(b->timeUs > 0)) return std::nullopt;
  return b->timeUs;
}

std::optional<double> ratio(std::optional<double> num, double den) {
  if (!num || !(den > 0)) return std::nullopt;
  return *num / den;
}

// ---------------------------------------------------------------------------------------------------------------
// SVG plots

struct Series {
  std::string_view key;  // data-series, and the legend's first word
  std::string_view label;
  std::string_view color;
  bool dashed = false;
  std::vector<std::optional<double>> values;  // per size
  std::vector<std::string> notes;             // per size, added to the point's tooltip
};

struct PlotSpec {
  std::string_view kind;  // data-plot: "busbw" or "ratio"
  std::string title;
  std::string yLabel;
  std::string unit;  // after values in tooltips
  bool logY = false;
  std::optional<double> reference;  // a horizontal line, e.g. time == bound
  std::string referenceLabel;
  std::vector<std::uint64_t> sizes;
  std::vector<Series> series;
};

constexpr double kWidth = 760;
constexpr double kHeight = 360;
constexpr double kLeft = 64;
constexpr double kRight = 16;
constexpr double kTop = 48;
constexpr double kBottom = 48;

double niceStep(double x) {
  const double p = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

struct Axis {
  double lo = 0;
  double hi = 1;
  bool log = false;
  std::vector<double> ticks;
  double fraction(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
};

Axis yAxis(const PlotSpec& spec) {
  double mn = std::numeric_limits<double>::infinity();
  double mx = 0;
  for (const Series& s : spec.series) {
    for (const auto& v : s.values) {
      if (!v) continue;
      mn = std::min(mn, *v);
      mx = std::max(mx, *v);
    }
  }
  if (spec.reference) {
    mn = std::min(mn, *spec.reference);
    mx = std::max(mx, *spec.reference);
  }
  Axis a;
  if (spec.logY) {
    a.log = true;
    if (!(mx > 0)) mx = 10;
    if (!(mn > 0) || !std::isfinite(mn)) mn = 1;
    // A little room so the reference line and the extreme points do not sit on the frame.
    a.lo = mn / 1.15;
    a.hi = mx * 1.15;
    const double decades = std::log10(a.hi / a.lo);
    const std::vector<double> mantissas = decades < 1    ? std::vector<double>{1, 1.2, 1.5, 2, 3, 4, 5, 6, 8}
                                          : decades <= 3 ? std::vector<double>{1, 2, 5}
                                                         : std::vector<double>{1};
    for (int e = static_cast<int>(std::floor(std::log10(a.lo))); e <= static_cast<int>(std::ceil(std::log10(a.hi)));
         ++e) {
      for (const double m : mantissas) {
        const double v = m * std::pow(10.0, e);
        if (v >= a.lo && v <= a.hi) a.ticks.push_back(v);
      }
    }
    return a;
  }
  if (!(mx > 0)) mx = 1;
  const double step = niceStep(mx / 5);
  a.lo = 0;
  a.hi = step * std::ceil(mx * 1.02 / step);
  for (int i = 0; i * step <= a.hi * (1 + 1e-9); ++i) a.ticks.push_back(i * step);
  return a;
}

std::string renderPlot(const PlotSpec& spec) {
  std::string out;
  auto o = std::back_inserter(out);
  const double plotW = kWidth - kLeft - kRight;
  const double plotH = kHeight - kTop - kBottom;

  // x: log2 of the message size, whole powers of two at the ends.
  double xmin = std::numeric_limits<double>::infinity();
  double xmax = -std::numeric_limits<double>::infinity();
  for (const std::uint64_t s : spec.sizes) {
    if (s == 0) continue;
    const double l = std::log2(static_cast<double>(s));
    xmin = std::min(xmin, l);
    xmax = std::max(xmax, l);
  }
  if (!std::isfinite(xmin)) {
    xmin = 10;
    xmax = 30;
  }
  int e0 = static_cast<int>(std::floor(xmin));
  int e1 = static_cast<int>(std::ceil(xmax));
  if (e1 == e0) {
    --e0;
    ++e1;
  }
  auto px = [&](double log2Size) { return kLeft + (log2Size - e0) / (e1 - e0) * plotW; };
  const Axis y = yAxis(spec);
  auto py = [&](double v) { return kTop + (1 - y.fraction(v)) * plotH; };

  fmt::format_to(o,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                 "role=\"img\" data-plot=\"{2}\">\n",
                 kWidth, kHeight, spec.kind);
  fmt::format_to(o, "<title>{}</title>\n", esc(spec.title));
  fmt::format_to(o, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" stroke=\"#999\"/>\n", kLeft, kTop,
                 plotW, plotH);

  // y grid and labels
  for (const double t : y.ticks) {
    const double ty = py(t);
    fmt::format_to(o, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>\n", kLeft, coord(ty),
                   kLeft + plotW, coord(ty));
    fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, coord(ty + 4), num(t));
  }
  // x ticks at every power of two, labels thinned to about ten
  const int span = e1 - e0;
  const int labelStep = span <= 10 ? 1 : span <= 20 ? 2 : span <= 40 ? 4 : 8;
  for (int e = e0; e <= e1; ++e) {
    const double tx = px(e);
    const bool labelled = e % labelStep == 0;
    fmt::format_to(o, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"{3}\"/>\n", coord(tx),
                   labelled ? kTop : kTop + plotH, kTop + plotH + (labelled ? 5 : 3), labelled ? "#e6e6e6" : "#999");
    if (labelled && e >= 0 && e < 64) {
      fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", coord(tx), kTop + plotH + 18,
                     core::formatSize(std::uint64_t{1} << e));
    }
  }
  fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">message size</text>\n", kLeft + plotW / 2,
                 kHeight - 8);
  fmt::format_to(o, "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">{1}</text>\n",
                 kTop + plotH / 2, esc(spec.yLabel));
  fmt::format_to(o, "<text class=\"title\" x=\"{}\" y=\"16\">{}</text>\n", kLeft, esc(spec.title));

  if (spec.reference) {
    fmt::format_to(o,
                   "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#444\" stroke-dasharray=\"2 3\" "
                   "data-reference=\"{3}\"/>\n",
                   kLeft, coord(py(*spec.reference)), kLeft + plotW, num(*spec.reference));
  }

  // Series: solid lines through consecutive sizes, a faint dotted bridge over sizes without a value, so a gap
  // never reads as a measurement (and never as zero).
  for (const Series& s : spec.series) {
    const std::string dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
    std::string points;
    std::string previous;  // the last plotted point, where a bridge starts
    bool gap = false;
    auto flush = [&] {
      if (points.find(' ') != std::string::npos) {
        fmt::format_to(o, "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}/>\n", points,
                       s.color, dash);
      }
      points.clear();
    };
    for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
      if (!s.values[i] || spec.sizes[i] == 0) {
        flush();
        gap = true;
        continue;
      }
      const std::string point =
          coord(px(std::log2(static_cast<double>(spec.sizes[i])))) + "," + coord(py(*s.values[i]));
      if (gap && !previous.empty()) {
        fmt::format_to(o,
                       "<polyline points=\"{} {}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1\" "
                       "stroke-dasharray=\"1 4\" opacity=\"0.6\" data-gap=\"{}\"/>\n",
                       previous, point, s.color, s.key);
      }
      gap = false;
      if (!points.empty()) points += ' ';
      points += point;
      previous = point;
    }
    flush();
  }
  bool any = false;
  for (const Series& s : spec.series) {
    for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
      if (!s.values[i] || spec.sizes[i] == 0) continue;
      any = true;
      const std::string note = s.notes[i].empty() ? "" : " (" + s.notes[i] + ")";
      // The bound is a limit, not a measurement: hollow markers.
      const std::string paint =
          s.dashed ? fmt::format("fill=\"#fff\" stroke=\"{}\"", s.color) : fmt::format("fill=\"{}\"", s.color);
      fmt::format_to(o,
                     "<circle data-plot=\"{}\" data-series=\"{}\" data-size=\"{}\" data-value=\"{}\" cx=\"{}\" "
                     "cy=\"{}\" r=\"3\" {}><title>{}</title></circle>\n",
                     spec.kind, s.key, spec.sizes[i], num(*s.values[i]),
                     coord(px(std::log2(static_cast<double>(spec.sizes[i])))), coord(py(*s.values[i])), paint,
                     esc(fmt::format("{} at {}: {} {}{}", s.key, core::formatSize(spec.sizes[i]), num(*s.values[i]),
                                     spec.unit, note)));
    }
  }
  if (!any) {
    fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n", kLeft + plotW / 2,
                   kTop + plotH / 2);
  }

  // Legend, one row above the frame.
  double lx = kLeft;
  for (const Series& s : spec.series) {
    fmt::format_to(o, "<line x1=\"{}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", lx,
                   lx + 18, s.color, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    const std::string text = fmt::format("{} ({})", s.key, s.label);
    fmt::format_to(o, "<text class=\"legend\" x=\"{}\" y=\"38\">{}</text>\n", lx + 22, esc(text));
    lx += 30 + 6.2 * static_cast<double>(text.size());
  }
  if (spec.reference) {
    fmt::format_to(o, "<line x1=\"{}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"#444\" stroke-dasharray=\"2 3\"/>\n", lx,
                   lx + 18);
    fmt::format_to(o, "<text class=\"legend\" x=\"{}\" y=\"38\">{}</text>\n", lx + 22, esc(spec.referenceLabel));
  }
  out += "</svg>\n";
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Page sections

constexpr std::string_view kColorNccl = "#d62728";
constexpr std::string_view kColorNative = "#ff7f0e";
constexpr std::string_view kColorOptiflow = "#1f77b4";
constexpr std::string_view kColorBound = "#7f7f7f";

constexpr std::string_view kStyle = R"(body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}
h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.8em 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f4f4f4}
.l{text-align:left}
.none{color:#999}
.win{color:#1a7f37;font-weight:600}
.loss{color:#b42318}
.gain{font-weight:600;background:#eaf6ea}
.note{color:#555}
.scroll{overflow-x:auto}
small{color:#666}
svg{display:block;margin:.6em 0}
svg text{font:11px sans-serif;fill:#333}
svg text.title{font-size:13px;font-weight:600}
)";

std::string td(const std::string& html, std::string_view cls = "", std::string_view title = "") {
  std::string attrs;
  if (!cls.empty()) attrs += fmt::format(" class=\"{}\"", cls);
  if (!title.empty()) attrs += fmt::format(" title=\"{}\"", esc(title));
  return fmt::format("<td{}>{}</td>", attrs, html);
}
std::string missing() { return td("&#8212;", "none"); }
std::string optNum(std::optional<double> v, std::string_view suffix = "") {
  return v ? td(num(*v) + std::string(suffix)) : missing();
}

void renderCollective(std::string& out, const CollectiveRun& c, int index) {
  auto o = std::back_inserter(out);
  const double factor = core::busBandwidthFactor(c.kind, c.ranks);
  const std::string anchor = fmt::format("c{}-{}", index, c.name);
  fmt::format_to(o, "<section id=\"{}\">\n<h2>{}, {} ranks{}</h2>\n", esc(anchor), esc(c.name), c.ranks,
                 c.nodes ? " on " + plural(*c.nodes, "node") : "");
  if (c.entries.empty()) {
    out += "<p class=\"note\">No message sizes in this run.</p>\n</section>\n";
    return;
  }

  // Headline: where the discovered schedules beat NCCL's own choice.
  int compared = 0;
  int wins = 0;
  double bestSpeedup = 0;
  std::uint64_t bestAt = 0;
  for (const Entry& e : c.entries) {
    const auto n = choiceTime(e.nccl);
    const auto b = bestTime(e.best);
    if (!n || !b) continue;
    ++compared;
    const double s = *n / *b;
    if (s > 1) ++wins;
    if (s > bestSpeedup) {
      bestSpeedup = s;
      bestAt = e.sizeBytes;
    }
  }
  if (compared > 0) {
    fmt::format_to(
        o, "<p>Faster than NCCL's choice at {} of {} sizes{}. busbw factor {} (nccl-tests).</p>\n", wins, compared,
        bestSpeedup > 1 ? fmt::format(", up to {}&#215; at {}", num(bestSpeedup), core::formatSize(bestAt)) : "",
        num(factor));
  } else {
    fmt::format_to(o, "<p>No size has both an NCCL time and a discovered schedule. busbw factor {}.</p>\n",
                   num(factor));
  }

  std::vector<std::uint64_t> sizes;
  for (const Entry& e : c.entries) sizes.push_back(e.sizeBytes);

  auto makeSeries = [&](std::string_view key, std::string_view label, std::string_view color, bool dashed) {
    Series s{key, label, color, dashed, {}, {}};
    s.values.resize(c.entries.size());
    s.notes.resize(c.entries.size());
    return s;
  };
  Series nccl = makeSeries("nccl", "NCCL's choice", kColorNccl, false);
  Series native = makeSeries("native", "best NCCL config", kColorNative, false);
  Series optiflow = makeSeries("optiflow", "discovered", kColorOptiflow, false);
  Series bound = makeSeries("bound", "lower bound", kColorBound, true);
  Series ncclRatio = makeSeries("nccl", "NCCL's choice", kColorNccl, false);
  Series nativeRatio = makeSeries("native", "best NCCL config", kColorNative, false);
  Series optiflowRatio = makeSeries("optiflow", "discovered", kColorOptiflow, false);
  for (std::size_t i = 0; i < c.entries.size(); ++i) {
    const Entry& e = c.entries[i];
    if (auto t = choiceTime(e.nccl)) {
      nccl.values[i] = busbw(e.sizeBytes, *t, factor);
      nccl.notes[i] = fmt::format("{}, {} \u00b5s", choiceLabel(*e.nccl), num(*t));
      ncclRatio.values[i] = ratio(t, e.boundUs);
      ncclRatio.notes[i] = nccl.notes[i];
    }
    if (auto t = choiceTime(e.native)) {
      native.values[i] = busbw(e.sizeBytes, *t, factor);
      native.notes[i] = fmt::format("{}, {} \u00b5s", choiceLabel(*e.native), num(*t));
      nativeRatio.values[i] = ratio(t, e.boundUs);
      nativeRatio.notes[i] = native.notes[i];
    }
    if (auto t = bestTime(e.best)) {
      optiflow.values[i] = busbw(e.sizeBytes, *t, factor);
      optiflow.notes[i] = fmt::format("{} {}, {} \u00b5s", e.best->program, e.best->config, num(*t));
      optiflowRatio.values[i] = ratio(t, e.boundUs);
      optiflowRatio.notes[i] = optiflow.notes[i];
    }
    bound.values[i] = busbw(e.sizeBytes, e.boundUs, factor);
    if (bound.values[i]) bound.notes[i] = fmt::format("{} \u00b5s", num(e.boundUs));
  }

  const PlotSpec bw{.kind = "busbw",
                    .title = fmt::format("{}: bus bandwidth", c.name),
                    .yLabel = "busbw (GB/s)",
                    .unit = "GB/s",
                    .logY = false,
                    .reference = std::nullopt,
                    .referenceLabel = "",
                    .sizes = sizes,
                    .series = {nccl, native, optiflow, bound}};
  const PlotSpec over{.kind = "ratio",
                      .title = fmt::format("{}: time over the lower bound", c.name),
                      .yLabel = "time / bound",
                      .unit = "\u00d7 bound",
                      .logY = true,
                      .reference = 1.0,
                      .referenceLabel = "time = bound",
                      .sizes = sizes,
                      .series = {ncclRatio, nativeRatio, optiflowRatio}};
  out += renderPlot(bw);
  out += renderPlot(over);

  out += "<div class=\"scroll\">\n<table class=\"data\">\n<thead>\n";
  out +=
      "<tr><th rowspan=\"2\">size</th><th colspan=\"3\">NCCL's choice</th><th colspan=\"3\">best NCCL-native</th>"
      "<th colspan=\"4\">OptiFlow</th><th colspan=\"2\">speedup</th><th colspan=\"2\">lower bound</th>"
      "<th colspan=\"2\">time / bound</th><th rowspan=\"2\">schedule</th></tr>\n";
  out +=
      "<tr><th>config</th><th>&#181;s</th><th>GB/s</th><th>config</th><th>&#181;s</th><th>GB/s</th>"
      "<th>program</th><th>config</th><th>&#181;s</th><th>GB/s</th><th>vs NCCL</th><th>vs native</th>"
      "<th>&#181;s</th><th>GB/s</th><th>NCCL</th><th>OptiFlow</th></tr>\n</thead>\n<tbody>\n";
  for (std::size_t i = 0; i < c.entries.size(); ++i) {
    const Entry& e = c.entries[i];
    std::string range;
    if (e.minBytes && e.maxBytes) {
      range = *e.maxBytes == std::numeric_limits<std::uint64_t>::max()
                  ? fmt::format("{} bytes; serves {} and up", e.sizeBytes, *e.minBytes)
                  : fmt::format("{} bytes; serves {} to {}", e.sizeBytes, *e.minBytes, *e.maxBytes);
    } else {
      range = fmt::format("{} bytes", e.sizeBytes);
    }
    std::string row = fmt::format("<tr data-size=\"{}\">", e.sizeBytes);
    row += td(core::formatSize(e.sizeBytes), "l", range);
    for (const auto* choice : {&e.nccl, &e.native}) {
      const auto t = choiceTime(*choice);
      row += *choice ? td(esc(choiceLabel(**choice)), "l") : missing();
      row += optNum(t);
      row += optNum(t ? busbw(e.sizeBytes, *t, factor) : std::nullopt);
    }
    const auto bt = bestTime(e.best);
    if (e.best) {
      std::string program = link(e.best->programFile, e.best->program);
      if (!e.best->candidate.empty()) program += fmt::format(" <small>{}</small>", esc(e.best->candidate));
      row += td(program, "l");
      row += td(esc(e.best->config), "l");
    } else {
      row += td("no candidate worked", "l none");
      row += missing();
    }
    row += optNum(bt);
    row += optNum(bt ? busbw(e.sizeBytes, *bt, factor) : std::nullopt);
    for (const auto& base : {choiceTime(e.nccl), choiceTime(e.native)}) {
      if (base && bt) {
        const double s = *base / *bt;
        row += td(num(s) + "&#215;", s > 1 ? "win" : s < 1 ? "loss" : "");
      } else {
        row += missing();
      }
    }
    const std::string effective =
        e.effectiveBoundUs ? fmt::format("at the simulator's link efficiencies: {} \u00b5s", num(*e.effectiveBoundUs))
                           : "";
    row += e.boundUs > 0 ? td(num(e.boundUs), "", effective) : missing();
    row += optNum(busbw(e.sizeBytes, e.boundUs, factor));
    row += optNum(ratio(choiceTime(e.nccl), e.boundUs), "&#215;");
    row += optNum(ratio(bt, e.boundUs), "&#215;");
    std::vector<std::string> files;
    if (e.best && !e.best->scheduleJson.empty()) files.push_back(link(e.best->scheduleJson, "json"));
    if (e.best && !e.best->scheduleXml.empty()) files.push_back(link(e.best->scheduleXml, "xml"));
    row += files.empty() ? missing() : td(fmt::format("{}", fmt::join(files, " ")), "l");
    row += "</tr>\n";
    out += row;
  }
  out += "</tbody>\n</table>\n</div>\n</section>\n";
}

void renderHistory(std::string& out, const History& h) {
  auto o = std::back_inserter(out);
  out += "<section id=\"history\">\n<h2>History</h2>\n";
  if (h.truncatedTail) {
    out +=
        "<p class=\"note\">The last line of history.jsonl is incomplete (the run stopped while writing it) and "
        "was skipped.</p>\n";
  }
  if (h.records.empty()) {
    out += "<p class=\"note\">history.jsonl holds no candidates.</p>\n</section>\n";
    return;
  }
  std::set<int> rounds;
  std::set<std::string> otherStages;
  static constexpr std::string_view kStages[] = {"ok", "parse", "expand", "duplicate"};
  auto known = [](std::string_view s) {
    return std::find(std::begin(kStages), std::end(kStages), s) != std::end(kStages);
  };
  for (const HistoryRecord& r : h.records) {
    rounds.insert(r.round);
    if (!known(r.stage)) otherStages.insert(r.stage);
  }
  fmt::format_to(o, "<p>{} candidates in {}.</p>\n", h.records.size(),
                 plural(static_cast<int>(rounds.size()), "round"));

  out += "<h3>Candidates per stage</h3>\n<table class=\"stages\">\n<tr><th>round</th><th>candidates</th>";
  for (const auto s : kStages) fmt::format_to(o, "<th>{}</th>", s);
  for (const auto& s : otherStages) fmt::format_to(o, "<th>{}</th>", esc(s));
  out += "</tr>\n";
  auto stageRow = [&](std::string_view label, std::optional<int> round) {
    std::map<std::string, int> counts;
    int total = 0;
    for (const HistoryRecord& r : h.records) {
      if (round && r.round != *round) continue;
      ++counts[r.stage];
      ++total;
    }
    fmt::format_to(o, "<tr data-round=\"{}\"><th>{}</th><td>{}</td>", label, label, total);
    for (const auto s : kStages) {
      fmt::format_to(o, "<td data-stage=\"{}\">{}</td>", s, counts[std::string(s)]);
    }
    for (const auto& s : otherStages) fmt::format_to(o, "<td data-stage=\"{0}\">{1}</td>", esc(s), counts[s]);
    out += "</tr>\n";
  };
  for (const int r : rounds) stageRow(fmt::format("{}", r), r);
  if (rounds.size() > 1) stageRow("all", std::nullopt);
  out += "</table>\n";

  // Best time per size so far, after each round, as a ratio to the bound (the time where there is no bound).
  std::set<std::uint64_t> sizes;
  for (const HistoryRecord& r : h.records) {
    if (r.stage != "ok") continue;
    for (const HistorySize& s : r.sizes) sizes.insert(s.sizeBytes);
  }
  if (sizes.empty()) {
    out += "<p class=\"note\">No candidate was evaluated.</p>\n</section>\n";
    return;
  }
  out +=
      "<h3>Best time over the lower bound, after each round</h3>\n<div class=\"scroll\">\n<table class=\"rounds\">\n";
  out += "<tr><th>size</th>";
  for (const int r : rounds) fmt::format_to(o, "<th>round {}</th>", r);
  out += "</tr>\n";
  for (const std::uint64_t size : sizes) {
    fmt::format_to(o, "<tr data-size=\"{}\"><td class=\"l\">{}</td>", size, core::formatSize(size));
    const HistoryRecord* best = nullptr;
    const HistorySize* bestSize = nullptr;
    std::optional<double> previous;
    for (const int round : rounds) {
      for (const HistoryRecord& r : h.records) {
        if (r.round != round || r.stage != "ok") continue;
        for (const HistorySize& s : r.sizes) {
          if (s.sizeBytes != size || !s.ok || !(s.timeUs > 0)) continue;
          if (!bestSize || s.timeUs < bestSize->timeUs) {
            best = &r;
            bestSize = &s;
          }
        }
      }
      if (!bestSize) {
        fmt::format_to(o, "<td data-round=\"{}\" class=\"none\">&#8212;</td>", round);
        continue;
      }
      const bool gain = !previous || bestSize->timeUs < *previous;
      previous = bestSize->timeUs;
      const std::string value = bestSize->boundUs > 0 ? num(bestSize->timeUs / bestSize->boundUs) + "&#215;"
                                                      : num(bestSize->timeUs) + " &#181;s";
      fmt::format_to(o, "<td data-round=\"{}\"{} title=\"{}\">{}</td>", round, gain ? " class=\"gain\"" : "",
                     esc(fmt::format("{} \u00b5s, {}", num(bestSize->timeUs), best->id)), value);
    }
    out += "</tr>\n";
  }
  out += "</table>\n</div>\n<p class=\"note\">Highlighted: the round that improved the size.</p>\n</section>\n";
}

std::string renderPage(const Plan& plan, const std::optional<History>& history) {
  std::string out;
  auto o = std::back_inserter(out);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  fmt::format_to(o, "<title>OptiFlow report: {}</title>\n", esc(plan.topology));
  fmt::format_to(o, "<style>\n{}</style>\n</head>\n<body>\n", kStyle);
  fmt::format_to(o, "<h1>OptiFlow report: {}</h1>\n", esc(plan.topology));
  fmt::format_to(o, "<p class=\"summary\">{} ranks on {}{}", plan.ranks, plural(plan.nodes, "node"),
                 plan.gpusPerNode ? fmt::format(" ({} GPUs per node)", *plan.gpusPerNode) : "");
  for (const auto& [label, value] : plan.meta) fmt::format_to(o, " &#183; {} {}", esc(label), esc(value));
  out += "</p>\n";
  if (plan.collectives.size() > 1 || history) {
    out += "<nav>";
    for (std::size_t i = 0; i < plan.collectives.size(); ++i) {
      fmt::format_to(o, "<a href=\"#{}\">{}</a> ", esc(fmt::format("c{}-{}", i, plan.collectives[i].name)),
                     esc(plan.collectives[i].name));
    }
    if (history) out += "<a href=\"#history\">history</a>";
    out += "</nav>\n";
  }
  if (plan.collectives.empty()) out += "<p class=\"note\">The plan holds no collectives.</p>\n";
  for (std::size_t i = 0; i < plan.collectives.size(); ++i) {
    renderCollective(out, plan.collectives[i], static_cast<int>(i));
  }
  if (history) renderHistory(out, *history);
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace

core::Result<std::string> renderReport(const std::filesystem::path& dir) {
  try {
    auto plan = loadPlan(dir);
    if (!plan) return plan.error();
    auto history = loadHistory(dir);
    if (!history) return history.error();
    return renderPage(*plan, *history);
  } catch (const std::exception& e) {
    return core::Diagnostic{dir.string(), 0, 0, fmt::format("cannot render the report: {}", e.what())};
  } catch (...) {
    return core::Diagnostic{dir.string(), 0, 0, "cannot render the report"};
  }
}

}  // namespace optiflow::synth
