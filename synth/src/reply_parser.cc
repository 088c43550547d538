#include "optiflow/synth/reply_parser.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <unordered_set>

namespace optiflow::synth {
namespace {

// Bounds on hostile or runaway replies; the scan is linear in what is kept.
constexpr std::size_t kMaxReplyBytes = 16u << 20;
constexpr std::size_t kMaxPrograms = 256;

constexpr std::array<std::string_view, 6> kCollectives = {"allgather", "reducescatter", "allreduce",
                                                          "broadcast", "reduce",        "alltoall"};

bool isSpace(char c) { return c == ' ' || c == '\t'; }
bool isIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool isIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

bool isBlank(std::string_view line) { return trim(line).empty(); }

std::size_t indentOf(std::string_view line) {
  std::size_t i = 0;
  while (i < line.size() && isSpace(line[i])) ++i;
  return i;
}

bool isComment(std::string_view line) {
  const std::string_view t = trim(line);
  return !t.empty() && t.front() == '#';
}

// Reads an identifier at the front of `s`; empty when there is none.
std::string_view takeIdent(std::string_view& s) {
  if (s.empty() || !isIdentStart(s.front())) return {};
  std::size_t n = 1;
  while (n < s.size() && isIdentChar(s[n])) ++n;
  const std::string_view id = s.substr(0, n);
  s.remove_prefix(n);
  return id;
}

void skipSpaces(std::string_view& s) {
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
}

bool isCollective(std::string_view word) {
  return std::find(kCollectives.begin(), kCollectives.end(), word) != kCollectives.end();
}

// "allgather my_ring" (a trailing comment allowed; a stray ':' tolerated so the parser can name the mistake).
bool isHeader(std::string_view line) {
  std::string_view s = trim(line);
  if (!isCollective(takeIdent(s))) return false;
  if (s.empty() || !isSpace(s.front())) return false;
  skipSpaces(s);
  if (takeIdent(s).empty()) return false;
  skipSpaces(s);
  if (!s.empty() && s.front() == ':') {
    s.remove_prefix(1);
    skipSpaces(s);
  }
  return s.empty() || s.front() == '#';
}

// A statement written at the header's own indentation (the language allows an unindented body). Strict enough
// that prose ("For each node, ...") does not pass.
bool isFlushStatement(std::string_view line) {
  std::string_view s = trim(line);
  std::string_view rest = s;
  const std::string_view word = takeIdent(rest);
  if (word.empty() || (!rest.empty() && !isSpace(rest.front()) && rest.front() != ':' && rest.front() != '(')) {
    return false;
  }
  skipSpaces(rest);
  if (word == "let") {
    if (takeIdent(rest).empty()) return false;
    skipSpaces(rest);
    return rest.starts_with("=");
  }
  if (word == "split") return !rest.empty();
  if (word == "for") {
    if (takeIdent(rest).empty()) return false;
    skipSpaces(rest);
    return rest.starts_with("in") && rest.find(':') != std::string_view::npos;
  }
  if (word == "if") return s.find(':') != std::string_view::npos;
  if (word == "else") return rest.starts_with(":");
  if (word == "send") return rest.starts_with("block");
  if (isCollective(word)) return !isHeader(line) && s.find(" by ") != std::string_view::npos;
  return false;
}

// Trailing whitespace off every line, blank lines off both ends, the common indentation removed.
std::string normalize(const std::vector<std::string_view>& lines, std::size_t begin, std::size_t end) {
  while (begin < end && isBlank(lines[begin])) ++begin;
  while (end > begin && isBlank(lines[end - 1])) --end;
  if (begin == end) return {};
  std::size_t common = std::string_view::npos;
  for (std::size_t i = begin; i < end; ++i) {
    if (isBlank(lines[i])) continue;
    std::size_t spaces = 0;
    while (spaces < lines[i].size() && lines[i][spaces] == ' ') ++spaces;
    common = std::min(common, spaces);
  }
  std::string out;
  for (std::size_t i = begin; i < end; ++i) {
    std::string_view l = lines[i];
    while (!l.empty() && std::isspace(static_cast<unsigned char>(l.back())) != 0) l.remove_suffix(1);
    if (!l.empty()) l.remove_prefix(std::min(common, l.size()));
    out.append(l);
    out.push_back('\n');
  }
  return out;
}

class Collector {
 public:
  void add(std::string program) {
    if (program.empty() || programs_.size() >= kMaxPrograms) return;
    if (seen_.insert(program).second) programs_.push_back(std::move(program));
  }
  std::vector<std::string> take() { return std::move(programs_); }
  bool empty() const { return programs_.empty(); }

 private:
  std::vector<std::string> programs_;
  std::unordered_set<std::string> seen_;
};

// A fenced block's lines; several programs in one block (a model ignoring "one per fence") are split at
// their headers, comment lines just above a header going with it.
void addBlock(const std::vector<std::string_view>& lines, Collector& out) {
  std::size_t minIndent = std::string_view::npos;
  for (std::string_view l : lines) {
    if (!isBlank(l)) minIndent = std::min(minIndent, indentOf(l));
  }
  std::size_t start = 0;
  bool seenHeader = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (indentOf(lines[i]) != minIndent || !isHeader(lines[i])) continue;
    if (seenHeader) {
      std::size_t cut = i;
      while (cut > start && (isComment(lines[cut - 1]) || isBlank(lines[cut - 1]))) --cut;
      while (cut < i && isBlank(lines[cut])) ++cut;
      out.add(normalize(lines, start, cut));
      start = cut;
    }
    seenHeader = true;
  }
  out.add(normalize(lines, start, lines.size()));
}

struct Fence {
  char ch = 0;
  std::size_t length = 0;
  std::size_t indent = 0;
  std::string tag;
};

// "```ofl", "~~~", "  ```python title": fills `fence`; false for other lines.
bool openingFence(std::string_view line, Fence& fence) {
  const std::size_t indent = indentOf(line);
  std::string_view s = line.substr(indent);
  if (s.size() < 3 || (s.front() != '`' && s.front() != '~')) return false;
  const char ch = s.front();
  std::size_t n = 0;
  while (n < s.size() && s[n] == ch) ++n;
  if (n < 3) return false;
  const std::string_view info = trim(s.substr(n));
  if (ch == '`' && info.find('`') != std::string_view::npos) return false;  // inline code, not a fence
  fence.ch = ch;
  fence.length = n;
  fence.indent = indent;
  std::string_view rest = info;
  while (!rest.empty() && (rest.front() == '{' || rest.front() == '.')) rest.remove_prefix(1);
  std::size_t tagEnd = 0;
  while (tagEnd < rest.size() && !isSpace(rest[tagEnd]) && rest[tagEnd] != '}') ++tagEnd;
  fence.tag.clear();
  for (char c : rest.substr(0, tagEnd))
    fence.tag.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return true;
}

bool closingFence(std::string_view line, const Fence& fence) {
  const std::string_view s = trim(line);
  return s.size() >= fence.length && std::all_of(s.begin(), s.end(), [&](char c) { return c == fence.ch; });
}

bool looksLikeProgram(const std::vector<std::string_view>& lines) {
  return std::any_of(lines.begin(), lines.end(), [](std::string_view l) { return isHeader(l); });
}

void extractFenced(const std::vector<std::string_view>& lines, Collector& out) {
  std::size_t i = 0;
  while (i < lines.size()) {
    Fence fence;
    if (!openingFence(lines[i], fence)) {
      ++i;
      continue;
    }
    std::vector<std::string_view> body;
    std::size_t j = i + 1;
    for (; j < lines.size() && !closingFence(lines[j], fence); ++j) {
      // Content is indented relative to its fence (a fence inside a list item).
      std::string_view l = lines[j];
      l.remove_prefix(std::min(fence.indent, indentOf(l)));
      body.push_back(l);
    }
    const bool ourTag = fence.tag == "ofl" || fence.tag == "optiflow";
    if (ourTag || looksLikeProgram(body)) addBlock(body, out);
    i = j + 1;  // past the closing fence, or past the end for an unterminated one
  }
}

// Programs without fences: a header line and the lines that continue it (indented deeper, or statements at its
// own indentation); prose before and after is left out.
void extractBare(const std::vector<std::string_view>& lines, Collector& out) {
  std::size_t i = 0;
  while (i < lines.size()) {
    if (!isHeader(lines[i])) {
      ++i;
      continue;
    }
    const std::size_t headerIndent = indentOf(lines[i]);
    const auto isBody = [&](std::string_view l) {
      return !isBlank(l) && (indentOf(l) > headerIndent || (indentOf(l) == headerIndent && isFlushStatement(l)));
    };
    std::size_t end = i + 1;
    bool hasBody = false;
    while (end < lines.size()) {
      // Blank lines and comments at the header's indentation belong to the program only when a statement follows.
      std::size_t k = end;
      while (k < lines.size() && !isBody(lines[k]) &&
             (isBlank(lines[k]) || (isComment(lines[k]) && indentOf(lines[k]) == headerIndent))) {
        ++k;
      }
      if (k == lines.size() || !isBody(lines[k])) break;
      hasBody = true;
      end = k + 1;
    }
    if (hasBody) {
      out.add(normalize(lines, i, end));
      i = end;
    } else {
      ++i;
    }
  }
}

}  // namespace

std::vector<std::string> extractPrograms(std::string_view reply) {
  try {
    reply = reply.substr(0, std::min(reply.size(), kMaxReplyBytes));
    std::vector<std::string_view> lines;
    std::size_t pos = 0;
    while (pos <= reply.size()) {
      std::size_t nl = reply.find('\n', pos);
      if (nl == std::string_view::npos) nl = reply.size();
      std::string_view line = reply.substr(pos, nl - pos);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      lines.push_back(line);
      pos = nl + 1;
    }
    Collector out;
    extractFenced(lines, out);
    if (out.empty()) extractBare(lines, out);
    return out.take();
  } catch (...) {
    // Only allocation can fail here; a reply we cannot hold gives no programs.
    return {};
  }
}

}  // namespace optiflow::synth
