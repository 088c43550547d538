// Reading JSON documents with errors that name the field's path, the line and column where it stands, and what was
// expected: the run directory's plan.json and history.jsonl (synth/run_dir.cc) and the native schedule format
// (core/schedule_json.cc) use this one walker.
//
// Messages are "<path>: <what>", for example
//   collectives[0].entries[2].bound_us: missing
//   collectives[0].ranks: expected an integer in [1, 4294967295], got "8"
//   sizes[0].time_us: expected a non-negative number (microseconds), got true
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "optiflow/core/error.h"

namespace optiflow::core {

struct PathSegment {
  std::string key;  // empty: an array index
  std::size_t index = 0;
};
using JsonPath = std::vector<PathSegment>;

std::string pathString(const JsonPath& path);  // "collectives[0].entries[2]"; "(top level)" for the root
// Offset of the first bracket of `text` that opens level maxNesting + 1 (strings skipped), if any: checked before a
// DOM parser sees hostile input.
std::optional<std::size_t> firstBeyondNesting(std::string_view text, int maxNesting);
// Byte offset in `text` (valid JSON) of the value at `path`, or of the deepest enclosing value found (a missing key
// points at its object).
std::size_t locateJsonPath(std::string_view text, const JsonPath& path);

// A value of the document being read, with its path. Accessors check the type and range and, on a mismatch, end the
// read with a diagnostic (readJsonDocument catches it): a reader is written as straight-line code.
class JsonNode {
 public:
  JsonNode(const nlohmann::json& v, JsonPath path) : v_(&v), path_(std::move(path)) {}

  const JsonPath& path() const { return path_; }
  const nlohmann::json& raw() const { return *v_; }
  bool isNull() const { return v_->is_null(); }

  JsonNode operator[](std::string_view key) const;               // must be present ("missing")
  std::optional<JsonNode> optional(std::string_view key) const;  // absent or null: nullopt
  std::vector<JsonNode> items() const;                           // must be an array
  void requireObject() const;

  std::string str() const;
  bool boolean() const;
  std::uint64_t unsignedIn(std::uint64_t lo, std::uint64_t hi) const;
  int intIn(int lo, int hi) const;
  double nonNegative() const;  // finite, >= 0, and what a float holds (the cache stores floats)

  [[noreturn]] void fail(std::string message) const;
  [[noreturn]] static void failAt(JsonPath path, std::string message);

  // `got "fast"`, `got an object`: what stands there, short.
  std::string got() const;

 private:
  std::optional<JsonNode> find(std::string_view key) const;
  [[noreturn]] void expected(std::string_view what) const;

  const nlohmann::json* v_;
  JsonPath path_;
};

// Parses `text` (at most 64 levels deep) and runs `read` over its root. Any failure, a syntax error or a field that
// `read` rejects, is a diagnostic for `file`, with the line and column within the file (`firstLine` is the line the
// text starts on: history.jsonl's lines are documents of their own). `what` names the document for a syntax error
// ("an optiflow plan"). Never throws.
std::optional<core::Diagnostic> readJsonDocument(std::string_view text, const std::string& file, int firstLine,
                                                 std::string_view what,
                                                 const std::function<void(const JsonNode&)>& read);

}  // namespace optiflow::core
