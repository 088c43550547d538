// The OptiFlow lexer (docs/language.md, "Lexical structure"), internal to the dsl library. It turns the text into
// tokens one line at a time, with Python-style INDENT/DEDENT tokens, so the parser needs no knowledge of spaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"

namespace optiflow::dsl::detail {

enum class TokKind : std::uint8_t {
  Name,     // identifiers and keywords alike; the parser decides by context
  Int,      // value holds the number
  Op,       // text is one of + - * / % == != < <= > >= = ( ) { } , : ..
  Newline,  // end of a non-blank line; column is just after its last token
  Indent,   // the line is indented deeper than the enclosing block
  Dedent,   // one block ends (one token per closed block)
  End,      // end of the text; repeated forever
  Error,    // the lexer has reported a problem here and dropped the rest of the line
};

struct Token {
  TokKind kind = TokKind::End;
  std::string_view text;  // Name, Int, Op: the source text
  std::int64_t value = 0;
  int line = 1;
  int column = 1;
};

// Source text as quoted in messages: cut to a few dozen characters, whatever the input.
std::string clip(std::string_view s);

// Thrown once more than kMaxErrors diagnostics have been collected: parsing stops there.
struct TooManyErrors {};

// The diagnostics of one parse, shared by the lexer and the parser.
class Diagnostics {
 public:
  explicit Diagnostics(std::string_view file) : file_(file) {}
  void add(int line, int column, std::string message);  // throws TooManyErrors past the limit
  // Sorted by position, cut to kMaxErrors with a final "too many errors; stopping".
  std::vector<core::Diagnostic> finish() &&;
  std::size_t size() const { return list_.size(); }

 private:
  std::string file_;
  std::vector<core::Diagnostic> list_;
};

class Lexer {
 public:
  Lexer(std::string_view text, Diagnostics& diags) : text_(text), diags_(diags) {}

  // The token `ahead` positions from the current one. References stay valid until that token is consumed.
  const Token& peek(std::size_t ahead = 0);
  Token next();

 private:
  void lexLine();  // reads physical lines until one yields tokens, or the text ends
  void tokenize(std::string_view line, std::size_t from);
  void checkComment(std::string_view line, std::size_t from);
  void push(TokKind kind, std::size_t column, std::string_view text = {}, std::int64_t value = 0);
  void error(std::size_t column, std::string message);  // reports and ends the line with an Error token

  std::string_view text_;
  Diagnostics& diags_;
  std::size_t pos_ = 0;
  int line_ = 0;  // number of the last physical line read
  bool started_ = false;
  bool done_ = false;
  std::vector<int> indents_;  // open block indentations; [0] is the header's
  std::deque<Token> queue_;
};

}  // namespace optiflow::dsl::detail
