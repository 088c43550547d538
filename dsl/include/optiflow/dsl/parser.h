// Parsing and printing OptiFlow programs (docs/language.md). The parser never throws and never crashes: every
// problem comes back as a diagnostic naming line, column, the offending text and what was expected, one per
// problem (it resynchronises at the next line), so a language model that wrote the program can repair it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"
#include "optiflow/dsl/ast.h"

namespace optiflow::dsl {

// Inputs beyond these are refused with a diagnostic (no unbounded recursion or allocation on hostile input).
inline constexpr std::size_t kMaxProgramBytes = 1 << 20;
inline constexpr int kMaxNesting = 64;  // nested for/if blocks, parentheses and calls together
inline constexpr std::size_t kMaxErrors = 20;

struct ParseResult {
  std::optional<Program> program;        // set when errors is empty
  std::vector<core::Diagnostic> errors;  // in source order, at most kMaxErrors (+1 saying more were cut)
  bool ok() const { return program.has_value(); }
};

// `fileName` labels the diagnostics ("<stdin>", "<proposal 3>", a path).
ParseResult parseProgram(std::string_view text, std::string_view fileName);

// Canonical text: header, two-space indentation, one statement per line, `for`/`if` bodies as indented blocks,
// minimal parentheses. parseProgram(printProgram(p)) gives a program equal to p up to source locations.
std::string printProgram(const Program& p);
std::string printExpr(const Expr& e);

// A diagnostic with the source line it points at and a caret under the column:
//   prog.ofl:3:22: expected a strategy (ring, direct, ...) after 'by', found 'rign'
//       allgather rail(g) by rign
//                            ^
std::string formatDiagnostic(const core::Diagnostic& d, std::string_view text);

}  // namespace optiflow::dsl
