// Errors that point at the input: file, line, column, and what was expected. Every parser returns these instead
// of throwing past its boundary, so a bad file never takes down the tool, the daemon or a training process.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace optiflow::core {

struct Diagnostic {
  std::string file;  // path or a name such as "<preset>" or "<stdin>"
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown
  std::string message;

  // "file:line:column: message", leaving out the parts that are unknown.
  std::string str() const;
};

// A value or a diagnostic (a small std::expected for C++20).
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT(google-explicit-constructor)
  Result(Diagnostic error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const Diagnostic& error() const { return std::get<Diagnostic>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Diagnostic> v_;
};

}  // namespace optiflow::core
