#include "lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "optiflow/dsl/parser.h"

namespace optiflow::dsl::detail {

namespace {

bool isAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isControl(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && c != '\t') || u == 0x7f;
}
bool isNonAscii(char c) { return static_cast<unsigned char>(c) >= 0x80; }

std::string describeByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (isNonAscii(c)) return fmt::format("non-ASCII byte 0x{:02x}", u);
  return fmt::format("control character 0x{:02x}", u);
}

}  // namespace

std::string clip(std::string_view s) {
  constexpr std::size_t kMax = 32;
  if (s.size() <= kMax) return std::string(s);
  return std::string(s.substr(0, kMax - 3)) + "...";
}

void Diagnostics::add(int line, int column, std::string message) {
  list_.push_back(core::Diagnostic{file_, std::max(line, 1), std::max(column, 1), std::move(message)});
  if (list_.size() > kMaxErrors) throw TooManyErrors{};
}

std::vector<core::Diagnostic> Diagnostics::finish() && {
  // The lexer reads a line ahead of the parser, so the two streams can interleave out of order.
  std::stable_sort(list_.begin(), list_.end(), [](const core::Diagnostic& a, const core::Diagnostic& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  if (list_.size() > kMaxErrors) {
    core::Diagnostic stop = list_[kMaxErrors];
    stop.message = "too many errors; stopping";
    list_.resize(kMaxErrors);
    list_.push_back(std::move(stop));
  }
  return std::move(list_);
}

const Token& Lexer::peek(std::size_t ahead) {
  while (queue_.size() <= ahead && !done_) lexLine();
  if (queue_.size() <= ahead) return queue_.back();  // the End token, which is never consumed
  return queue_[ahead];
}

Token Lexer::next() {
  Token t = peek();
  if (t.kind != TokKind::End) queue_.pop_front();
  return t;
}

void Lexer::push(TokKind kind, std::size_t column, std::string_view text, std::int64_t value) {
  queue_.push_back(Token{kind, text, value, line_, static_cast<int>(column)});
}

void Lexer::error(std::size_t column, std::string message) {
  diags_.add(line_, static_cast<int>(column), std::move(message));
  push(TokKind::Error, column);
  push(TokKind::Newline, column);
}

void Lexer::checkComment(std::string_view line, std::size_t from) {
  // Comments may hold UTF-8 (they are dropped), but no control characters, which would garble diagnostics.
  for (std::size_t i = from; i < line.size(); ++i) {
    if (isControl(line[i])) {
      diags_.add(line_, static_cast<int>(i + 1),
                 fmt::format("{} at column {} in a comment is not allowed", describeByte(line[i]), i + 1));
      return;
    }
  }
}

void Lexer::lexLine() {
  const std::size_t before = queue_.size();
  while (queue_.size() == before) {
    if (pos_ >= text_.size()) {
      // End of text: close every open block, then End at the position just past the text.
      int line = std::max(line_, 1);
      std::size_t column = 1;
      if (!text_.empty()) {
        if (text_.back() == '\n') {
          line = line_ + 1;
        } else {
          const std::size_t lastStart = text_.rfind('\n') == std::string_view::npos ? 0 : text_.rfind('\n') + 1;
          column = text_.size() - lastStart + 1;
        }
      }
      line_ = line;
      while (indents_.size() > 1) {
        indents_.pop_back();
        push(TokKind::Dedent, column);
      }
      push(TokKind::End, column);
      done_ = true;
      return;
    }
    ++line_;
    const std::size_t start = pos_;
    const std::size_t nl = text_.find('\n', pos_);
    std::size_t end = nl == std::string_view::npos ? text_.size() : nl;
    pos_ = nl == std::string_view::npos ? text_.size() : nl + 1;
    if (end > start && text_[end - 1] == '\r') --end;  // CRLF files
    const std::string_view line = text_.substr(start, end - start);

    std::size_t i = 0;
    std::size_t tabColumn = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) {
      if (line[i] == '\t' && tabColumn == 0) tabColumn = i + 1;
      ++i;
    }
    if (i == line.size() || line[i] == '#') {  // blank or comment-only: no tokens, no indentation change
      checkComment(line, i);
      continue;
    }
    // A tab counts as one column so that the structure stays as written; the error is reported once per line.
    if (tabColumn != 0) diags_.add(line_, static_cast<int>(tabColumn), "use spaces for indentation, found a tab");
    const int width = static_cast<int>(i);
    if (!started_) {
      started_ = true;
      indents_.assign(1, width);
    } else if (width > indents_.back()) {
      indents_.push_back(width);
      push(TokKind::Indent, i + 1);
    } else if (width < indents_.back()) {
      std::string open;
      const std::size_t shown = std::min<std::size_t>(indents_.size(), 4);
      for (std::size_t k = indents_.size() - shown; k < indents_.size(); ++k) {
        open += fmt::format("{}{}", open.empty() ? "" : ", ", indents_[k]);
      }
      while (indents_.size() > 1 && indents_.back() > width) {
        indents_.pop_back();
        push(TokKind::Dedent, i + 1);
      }
      if (indents_.back() != width) {
        if (tabColumn != 0) {
          // The tab already reported is the cause; skip the line quietly.
          push(TokKind::Error, i + 1);
          push(TokKind::Newline, i + 1);
          continue;
        }
        error(i + 1, fmt::format("indentation does not match any outer block: {} spaces here, open blocks at {}", width,
                                 open));
        continue;
      }
    }
    tokenize(line, i);
  }
}

void Lexer::tokenize(std::string_view line, std::size_t i) {
  std::size_t lastEnd = i;
  while (i < line.size()) {
    const char c = line[i];
    if (c == ' ' || c == '\t') {
      ++i;
      continue;
    }
    if (c == '#') {
      checkComment(line, i);
      break;
    }
    const std::size_t column = i + 1;
    std::size_t j = i + 1;
    if (isAlpha(c)) {
      while (j < line.size() && (isAlpha(line[j]) || isDigit(line[j]))) ++j;
      push(TokKind::Name, column, line.substr(i, j - i));
    } else if (isDigit(c)) {
      while (j < line.size() && isDigit(line[j])) ++j;
      if (j < line.size() && isAlpha(line[j])) {
        std::size_t k = j;
        while (k < line.size() && (isAlpha(line[k]) || isDigit(line[k]))) ++k;
        return error(column,
                     fmt::format("invalid number '{}': a name cannot start with a digit", clip(line.substr(i, k - i))));
      }
      std::int64_t value = 0;
      for (std::size_t k = i; k < j; ++k) {
        const int digit = line[k] - '0';
        if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
          return error(column, fmt::format("integer '{}' is too large (the largest is {})", clip(line.substr(i, j - i)),
                                           std::numeric_limits<std::int64_t>::max()));
        }
        value = value * 10 + digit;
      }
      push(TokKind::Int, column, line.substr(i, j - i), value);
    } else {
      const char d = i + 1 < line.size() ? line[i + 1] : '\0';
      const bool two = (d == '=' && (c == '=' || c == '!' || c == '<' || c == '>')) || (c == '.' && d == '.');
      if (two) {
        j = i + 2;
      } else if (std::string_view("+-*/%=<>(){},:").find(c) == std::string_view::npos) {
        if (isControl(c) || isNonAscii(c)) {
          // A bad byte inside a word ("tre\xc3\xa9") spoils the whole word: the parser must not judge its prefix.
          if (lastEnd == i && !queue_.empty() && queue_.back().line == line_ &&
              (queue_.back().kind == TokKind::Name || queue_.back().kind == TokKind::Int)) {
            queue_.pop_back();
          }
          return error(
              column, fmt::format("{} at column {} is not allowed: programs are plain ASCII", describeByte(c), column));
        }
        std::string hint;
        if (c == '!') hint = " (write '!=' or 'not')";
        if (c == '&') hint = " (write 'and')";
        if (c == '|') hint = " (write 'or')";
        if (c == '.') hint = " (a range is written 'a..b')";
        return error(column, fmt::format("unexpected character '{}'{}", c, hint));
      }
      push(TokKind::Op, column, line.substr(i, j - i));
    }
    i = j;
    lastEnd = j;
  }
  push(TokKind::Newline, lastEnd + 1);
}

}  // namespace optiflow::dsl::detail
