#include "optiflow/core/json_walk.h"

#include "optiflow/core/text_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace optiflow::core {
namespace {

using json = nlohmann::json;

// The run directory's documents are about five levels deep; anything far deeper is not one of them, and refusing it
// before parsing keeps hostile input from costing stack or memory.
constexpr int kMaxNesting = 64;

// Thrown by JsonNode inside readJsonDocument only, which turns it into a Diagnostic: it unwinds a failed read out of
// the reader's straight-line code and never crosses this module's boundary.
struct FieldError {
  JsonPath path;
  std::string message;
};

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
std::size_t locateIn(std::string_view text, const JsonPath& path) {
  Scanner s(text);
  s.ws();
  std::size_t found = s.pos();
  for (const PathSegment& seg : path) {
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

}  // namespace

std::optional<std::size_t> firstBeyondNesting(std::string_view text, int maxNesting) {
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
      if (++depth > maxNesting) return i;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

std::size_t locateJsonPath(std::string_view text, const JsonPath& path) { return locateIn(text, path); }

std::string pathString(const JsonPath& path) {
  if (path.empty()) return "(top level)";
  std::string s;
  for (const PathSegment& seg : path) {
    if (seg.key.empty()) {
      s += fmt::format("[{}]", seg.index);
    } else {
      if (!s.empty()) s += '.';
      s += seg.key;
    }
  }
  return s;
}

std::string JsonNode::got() const {
  // A container is named, not printed: it may be the whole (large) document.
  if (v_->is_object()) return "got an object";
  if (v_->is_array()) return "got an array";
  std::string text = v_->dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("got {}", text);
}

void JsonNode::failAt(JsonPath path, std::string message) { throw FieldError{std::move(path), std::move(message)}; }

void JsonNode::fail(std::string message) const { failAt(path_, std::move(message)); }

void JsonNode::expected(std::string_view what) const { fail(fmt::format("expected {}, {}", what, got())); }

std::optional<JsonNode> JsonNode::find(std::string_view key) const {
  requireObject();
  const auto it = v_->find(key);
  if (it == v_->end()) return std::nullopt;
  JsonPath p = path_;
  p.push_back(PathSegment{std::string(key), 0});
  return JsonNode(*it, std::move(p));
}

JsonNode JsonNode::operator[](std::string_view key) const {
  auto v = find(key);
  if (!v) {
    JsonPath p = path_;
    p.push_back(PathSegment{std::string(key), 0});
    failAt(std::move(p), "missing");
  }
  return *v;
}

std::optional<JsonNode> JsonNode::optional(std::string_view key) const {
  auto v = find(key);
  if (!v || v->isNull()) return std::nullopt;
  return v;
}

std::vector<JsonNode> JsonNode::items() const {
  if (!v_->is_array()) expected("an array");
  std::vector<JsonNode> out;
  out.reserve(v_->size());
  for (std::size_t i = 0; i < v_->size(); ++i) {
    JsonPath p = path_;
    p.push_back(PathSegment{{}, i});
    out.emplace_back((*v_)[i], std::move(p));
  }
  return out;
}

void JsonNode::requireObject() const {
  if (!v_->is_object()) expected("an object");
}

std::string JsonNode::str() const {
  if (!v_->is_string()) expected("a string");
  return v_->get<std::string>();
}

bool JsonNode::boolean() const {
  if (!v_->is_boolean()) expected("true or false");
  return v_->get<bool>();
}

// Integers must be written as integers: get<>() would truncate 4096.5 and wrap -1 to 2^64-1.
std::uint64_t JsonNode::unsignedIn(std::uint64_t lo, std::uint64_t hi) const {
  if (!v_->is_number_unsigned() || v_->get<std::uint64_t>() < lo || v_->get<std::uint64_t>() > hi) {
    expected(fmt::format("an integer in [{}, {}]", lo, hi));
  }
  return v_->get<std::uint64_t>();
}

int JsonNode::intIn(int lo, int hi) const {
  if (v_->is_number_integer() && !v_->is_number_unsigned()) {
    const auto i = v_->get<std::int64_t>();
    if (i >= lo && i <= hi) return static_cast<int>(i);
  } else if (v_->is_number_unsigned()) {
    const auto u = v_->get<std::uint64_t>();
    if (hi >= 0 && u <= static_cast<std::uint64_t>(hi) && static_cast<std::int64_t>(u) >= lo)
      return static_cast<int>(u);
  }
  expected(fmt::format("an integer in [{}, {}]", lo, hi));
}

double JsonNode::nonNegative() const {
  // JSON cannot say NaN, but it can say -1 or 1e300; the cache holds floats.
  if (!v_->is_number() || !(v_->get<double>() >= 0) || v_->get<double>() > std::numeric_limits<float>::max()) {
    expected("a non-negative number (microseconds) below 3.4e38");
  }
  return v_->get<double>();
}

std::optional<core::Diagnostic> readJsonDocument(std::string_view text, const std::string& file, int firstLine,
                                                 std::string_view what,
                                                 const std::function<void(const JsonNode&)>& read) {
  core::Diagnostic d{file, 0, 0, {}};
  auto place = [&](std::size_t offset) {
    const auto [l, c] = lineColumn(text, offset);
    d.line = firstLine + l - 1;
    d.column = c;
  };
  if (const auto deep = firstBeyondNesting(text, kMaxNesting)) {
    place(*deep);
    d.message = fmt::format("expected JSON ({}), not nested deeper than {} levels", what, kMaxNesting);
    return d;
  }
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points at the character where the parser gave up.
    place(e.byte > 0 ? e.byte - 1 : 0);
    std::string why = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error ..." -> what follows the
    // position, which the diagnostic already carries.
    const auto column = why.find("column");
    const auto colon = column == std::string::npos ? std::string::npos : why.find(": ", column);
    if (colon != std::string::npos) why = why.substr(colon + 2);
    d.message = fmt::format("expected JSON ({}): {}", what, why);
    return d;
  } catch (const std::exception& e) {
    d.message = fmt::format("expected JSON ({}): {}", what, e.what());
    return d;
  }
  try {
    if (!doc.is_object()) {
      place(locateIn(text, {}));
      d.message = fmt::format("expected a JSON object ({}), {}", what, JsonNode(doc, {}).got());
      return d;
    }
    read(JsonNode(doc, {}));
    return std::nullopt;
  } catch (const FieldError& e) {
    place(locateIn(text, e.path));
    d.message = fmt::format("{}: {}", pathString(e.path), e.message);
    return d;
  } catch (const std::exception& e) {
    // Allocation failure or a library bug: still an error naming the file, never a crash of the daemon.
    d.message = fmt::format("cannot read {}: {}", what, e.what());
    return d;
  }
}

}  // namespace optiflow::core
