// Recursive-descent parser of the OptiFlow language (docs/language.md, "Grammar"). Every syntax error is reported
// once, at the token where the text stops making sense; the statement is then abandoned and parsing resumes at
// the next line (or after the block that line opened), so one pass reports every independent problem.
#include "optiflow/dsl/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <exception>
#include <initializer_list>
#include <new>
#include <optional>
#include <utility>

#include "lexer.h"

namespace optiflow::dsl {

namespace {

using detail::clip;
using detail::Diagnostics;
using detail::Lexer;
using detail::Token;
using detail::TokKind;
using detail::TooManyErrors;

// A statement with more binary operators than this is refused: operator chains are parsed in loops, but the tree
// they build is as deep as the chain, and every later walk over it (printing, comparing, freeing) recurses.
constexpr std::size_t kMaxOperatorsPerStatement = 1024;

constexpr std::string_view kStrategyList =
    "ring, direct, tree, chain, recursive_doubling, recursive_halving, bruck, pat";
constexpr std::string_view kStatementList =
    "let, split, for, if, send, allgather, reducescatter, allreduce, broadcast, reduce or alltoall";
constexpr std::string_view kGroupList = "all, node(e), rail(e), {e, ...} or {e for v in range}";

const std::initializer_list<std::string_view> kStrategyNames = {
    "ring", "direct", "tree", "chain", "recursive_doubling", "recursive_halving", "bruck", "pat"};
const std::initializer_list<std::string_view> kStatementWords = {
    "let", "split", "for", "if", "send", "allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"};
const std::initializer_list<std::string_view> kCollectiveNames = {"allgather", "reducescatter", "allreduce",
                                                                  "broadcast", "reduce",        "alltoall"};
constexpr core::Collective kCollectives[] = {core::Collective::AllGather, core::Collective::ReduceScatter,
                                             core::Collective::AllReduce, core::Collective::Broadcast,
                                             core::Collective::Reduce,    core::Collective::AllToAll};

// Words that cannot name a variable. `parts` is a keyword after a group operation or block(...), but also the
// built-in number of parts, so it is allowed in expressions (never as a bound name).
const std::initializer_list<std::string_view> kReserved = {
    "let",       "split",     "for",    "in",       "if",    "else",  "by",        "from",
    "to",        "via",       "send",   "part",     "parts", "block", "allgather", "reducescatter",
    "allreduce", "broadcast", "reduce", "alltoall", "and",   "or",    "not"};

bool isReserved(std::string_view s) { return std::find(kReserved.begin(), kReserved.end(), s) != kReserved.end(); }

std::optional<core::Collective> collectiveNamed(std::string_view s) {
  for (core::Collective c : kCollectives) {
    if (core::toString(c) == s) return c;
  }
  return std::nullopt;
}

// Optimal string alignment distance: a swapped pair of letters ("rign") counts as one edit. Three rolling rows on
// the stack; callers keep both words short.
std::size_t editDistance(std::string_view a, std::string_view b) {
  constexpr std::size_t kMaxLen = 48;
  if (a.size() >= kMaxLen || b.size() >= kMaxLen) return kMaxLen;
  std::array<std::size_t, kMaxLen + 1> prev2{}, prev{}, cur{};
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    prev2 = prev;
    prev = cur;
  }
  return prev[b.size()];
}

// "; did you mean 'ring'?" when the found word is a near miss of one candidate, else "".
std::string suggest(const Token& t, std::initializer_list<std::string_view> candidates) {
  if (t.kind != TokKind::Name || t.text.size() > 40) return "";
  const std::size_t limit = t.text.size() <= 4 ? 1 : 2;
  std::string_view best;
  std::size_t bestDistance = limit + 1;
  for (std::string_view c : candidates) {
    const std::size_t dist = editDistance(t.text, c);
    if (dist > 0 && dist < bestDistance) {
      best = c;
      bestDistance = dist;
    }
  }
  if (best.empty()) return "";
  return fmt::format("; did you mean '{}'?", best);
}

// How a token is named in "found ..." (and "after ...").
std::string describe(const Token& t) {
  switch (t.kind) {
    case TokKind::Name:
    case TokKind::Int:
    case TokKind::Op:
      return fmt::format("'{}'", clip(t.text));
    case TokKind::Newline:
      return "end of line";
    case TokKind::Indent:
      return "an indented line";
    case TokKind::Dedent:
      return "the end of the block";
    case TokKind::End:
    case TokKind::Error:
      break;
  }
  return "end of file";
}

// The statement is abandoned; its diagnostic has been recorded (or the lexer's stands for it).
struct SyntaxError {};

class Parser {
 public:
  Parser(std::string_view text, Diagnostics& diags) : lex_(text, diags), diags_(diags) {}

  Program parse();

 private:
  // Counts one level of blocks, parentheses, calls or unary operators for as long as it lives.
  class Nest {
   public:
    Nest(Parser& p, const Token& at) : p_(p) {
      if (p.depth_ >= kMaxNesting) p.fail(at, nestingMessage());
      ++p_.depth_;
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  static std::string nestingMessage() {
    return fmt::format("too deeply nested: more than {} levels of blocks, parentheses and calls", kMaxNesting);
  }

  const Token& tok() { return lex_.peek(); }
  Token advance() {
    prev_ = lex_.next();
    return prev_;
  }
  bool atName(std::string_view s) { return tok().kind == TokKind::Name && tok().text == s; }
  bool atOp(std::string_view s) { return tok().kind == TokKind::Op && tok().text == s; }
  static SourceLoc locOf(const Token& t) { return SourceLoc{t.line, t.column}; }

  void report(const Token& at, std::string message) {
    if (at.kind != TokKind::Error) diags_.add(at.line, at.column, std::move(message));
  }
  [[noreturn]] void fail(const Token& at, std::string message) {
    report(at, std::move(message));
    throw SyntaxError{};
  }
  void expectName(std::string_view word, std::string_view what) {
    if (atName(word)) {
      advance();
      return;
    }
    fail(tok(), fmt::format("expected '{}' {}, found {}{}", word, what, describe(tok()), suggest(tok(), {word})));
  }
  void expectOp(std::string_view op, std::string_view what) {
    if (atOp(op)) {
      advance();
      return;
    }
    fail(tok(), fmt::format("expected '{}' {}, found {}", op, what, describe(tok())));
  }
  void expectEnd(std::string_view what) {
    if (tok().kind == TokKind::Newline) {
      advance();
      return;
    }
    fail(tok(), fmt::format("expected end of line after {}, found {}", what, describe(tok())));
  }
  // A name that a statement binds (let, for, comprehension).
  std::string expectBoundName(std::string_view what) {
    const Token t = tok();
    if (t.kind == TokKind::Name && !isReserved(t.text)) {
      advance();
      return std::string(t.text);
    }
    fail(t, fmt::format("expected {}, found {}{}", what, describe(t),
                        t.kind == TokKind::Name ? " (a keyword cannot be a name)" : ""));
  }

  // Statements and blocks.
  void parseHeader(Program& p);
  std::vector<Stmt> parseBlock();
  void parseIgnoredBlock();
  void skipIndentedBlock();
  std::optional<Stmt> parseStatement();
  Stmt parseStatementInner();
  std::vector<Stmt> parseSuite(std::string_view keyword);
  void recover();
  Stmt parseLet();
  Stmt parseSplit();
  Stmt parseFor();
  Stmt parseIf();
  Stmt parseGroupOp(core::Collective op);
  Stmt parseSend();
  bool parseSelect(PartSelector& sel);
  Group parseGroup(std::string_view opName);
  Range parseRange();

  // Expressions, lowest precedence first.
  Expr parseExpr() { return parseOr(); }
  Expr parseOr();
  Expr parseAnd();
  Expr parseNot();
  Expr parseComparison();
  Expr parseAdditive();
  Expr parseTerm();
  Expr parseUnary();
  // A prefix operator (`not`, unary `-`) at the current token, applied to what `operand` parses.
  Expr parsePrefix(const char* text, Expr (Parser::*operand)());
  Expr parsePrimary();
  Expr binary(const Token& op, Expr lhs, Expr rhs);

  Lexer lex_;
  Diagnostics& diags_;
  Token prev_;
  int depth_ = 0;
  std::size_t operators_ = 0;  // binary operators in the current statement
};

Program Parser::parse() {
  Program p;
  if (tok().kind == TokKind::End) {
    diags_.add(1, 1, "empty program: expected a header such as 'allgather my_algorithm'");
    return p;
  }
  parseHeader(p);
  if (tok().kind == TokKind::Indent) {
    const Token first = advance();
    p.body = parseBlock();
    if (tok().kind == TokKind::Dedent) advance();
    // Only where a statement follows: anything else gets its own, more precise, error.
    const Token& next = tok();
    if (next.kind == TokKind::Name &&
        std::find(kStatementWords.begin(), kStatementWords.end(), next.text) != kStatementWords.end()) {
      report(tok(), fmt::format("expected every statement of the body indented like the first one (line {}, column "
                                "{}), found {} at column {}",
                                first.line, first.column, describe(tok()), tok().column));
    }
  }
  // The base level is never closed, so only the end of the text stops this loop.
  while (tok().kind != TokKind::End) {
    if (tok().kind == TokKind::Dedent) {
      advance();
      continue;
    }
    std::vector<Stmt> more = parseBlock();
    for (Stmt& s : more) p.body.push_back(std::move(s));
  }
  return p;
}

void Parser::parseHeader(Program& p) {
  const Token t = tok();
  const std::string expected = "expected a header such as 'allgather my_algorithm'";
  if (t.kind == TokKind::Name &&
      std::find(kStatementWords.begin(), kStatementWords.end(), t.text) != kStatementWords.end() &&
      !collectiveNamed(t.text)) {
    // The header is missing: say so, and read this line as the first statement.
    report(t, fmt::format("{} before the first statement, found {}", expected, describe(t)));
    return;
  }
  try {
    const std::optional<core::Collective> c = t.kind == TokKind::Name ? collectiveNamed(t.text) : std::nullopt;
    if (!c) {
      fail(t, fmt::format("{} (a collective: allgather, reducescatter, allreduce, broadcast, reduce or alltoall, then "
                          "a name), found {}{}",
                          expected, describe(t), suggest(t, kCollectiveNames)));
    }
    advance();
    const Token name = tok();
    if (name.kind != TokKind::Name) {
      fail(name, fmt::format("expected the algorithm's name after '{}', found {}", t.text, describe(name)));
    }
    advance();
    expectEnd(fmt::format("the header '{} {}'", t.text, clip(name.text)));
    p.collective = *c;
    p.name = std::string(name.text);
    p.loc = locOf(t);
  } catch (const SyntaxError&) {
    while (tok().kind != TokKind::Newline && tok().kind != TokKind::End) advance();
    if (tok().kind == TokKind::Newline) advance();
  }
}

std::vector<Stmt> Parser::parseBlock() {
  std::vector<Stmt> out;
  while (tok().kind != TokKind::Dedent && tok().kind != TokKind::End) {
    if (tok().kind == TokKind::Indent) {
      report(tok(), "unexpected indentation: the line before does not end with ':'");
      parseIgnoredBlock();
      continue;
    }
    if (std::optional<Stmt> s = parseStatement()) out.push_back(std::move(*s));
  }
  return out;
}

// Reads an indented block that belongs to nothing, for the errors inside it.
void Parser::parseIgnoredBlock() {
  if (depth_ >= kMaxNesting) return skipIndentedBlock();
  ++depth_;
  advance();
  try {
    parseBlock();
  } catch (...) {
    --depth_;
    throw;
  }
  --depth_;
  if (tok().kind == TokKind::Dedent) advance();
}

// Skips from an Indent to its matching Dedent without parsing (no recursion, whatever the depth).
void Parser::skipIndentedBlock() {
  int level = 0;
  while (tok().kind != TokKind::End) {
    const TokKind k = advance().kind;
    if (k == TokKind::Indent) ++level;
    if (k == TokKind::Dedent && --level <= 0) return;
  }
}

std::optional<Stmt> Parser::parseStatement() {
  operators_ = 0;
  const Token first = tok();
  try {
    return parseStatementInner();
  } catch (const SyntaxError&) {
    recover();
    // The `else` of a failed `if` is part of the same problem, not an `else` without an `if`.
    const bool isIf = first.kind == TokKind::Name && first.text == "if";
    if (isIf && atName("else") && tok().column == first.column) recover();
    return std::nullopt;
  }
}

// Skips the rest of the line and, if it opened a block, reads that block for its own errors.
void Parser::recover() {
  while (tok().kind != TokKind::Newline && tok().kind != TokKind::End) advance();
  if (tok().kind == TokKind::Newline) advance();
  if (tok().kind == TokKind::Indent) parseIgnoredBlock();
}

Stmt Parser::parseStatementInner() {
  const Token t = tok();
  if (t.kind != TokKind::Name) {
    fail(t, fmt::format("expected a statement ({}), found {}", kStatementList, describe(t)));
  }
  if (t.text == "let") return parseLet();
  if (t.text == "split") return parseSplit();
  if (t.text == "for") return parseFor();
  if (t.text == "if") return parseIf();
  if (t.text == "send") return parseSend();
  if (std::optional<core::Collective> c = collectiveNamed(t.text)) return parseGroupOp(*c);
  if (t.text == "else") fail(t, "'else' without a matching 'if' (an 'else' must line up with its 'if')");
  fail(t, fmt::format("unknown statement {}: expected {}{}", describe(t), kStatementList, suggest(t, kStatementWords)));
}

// `:` then either a statement on the same line or an indented block.
std::vector<Stmt> Parser::parseSuite(std::string_view keyword) {
  std::vector<Stmt> body;
  if (depth_ >= kMaxNesting) {
    // Report once for the whole deep block and skip it without descending.
    report(tok(), nestingMessage());
    while (tok().kind != TokKind::Newline && tok().kind != TokKind::End) advance();
    if (tok().kind == TokKind::Newline) advance();
    if (tok().kind == TokKind::Indent) skipIndentedBlock();
    return body;
  }
  ++depth_;
  try {
    if (tok().kind == TokKind::Newline) {
      advance();
      if (tok().kind == TokKind::Indent) {
        advance();
        body = parseBlock();
        if (tok().kind == TokKind::Dedent) advance();
      } else {
        // Not a statement-level failure: the next line is a sibling and is parsed as such.
        report(tok(),
               fmt::format("expected an indented block after the ':' of '{}', found {}", keyword, describe(tok())));
      }
    } else if (std::optional<Stmt> s = parseStatement()) {
      body.push_back(std::move(*s));
    }
  } catch (...) {
    --depth_;
    throw;
  }
  --depth_;
  return body;
}

Stmt Parser::parseLet() {
  Stmt s;
  s.kind = StmtKind::Let;
  s.loc = locOf(advance());
  s.name = expectBoundName("a name after 'let'");
  expectOp("=", fmt::format("after 'let {}'", s.name));
  s.value = parseExpr();
  expectEnd(fmt::format("the value of 'let {}'", s.name));
  return s;
}

Stmt Parser::parseSplit() {
  Stmt s;
  s.kind = StmtKind::Split;
  s.loc = locOf(advance());
  s.value = parseExpr();
  expectEnd("the number of parts of 'split'");
  return s;
}

Stmt Parser::parseFor() {
  Stmt s;
  s.kind = StmtKind::For;
  s.loc = locOf(advance());
  s.name = expectBoundName("the loop variable after 'for'");
  expectName("in", fmt::format("after 'for {}'", s.name));
  s.range = parseRange();
  expectOp(":", "after the range of 'for'");
  s.body = parseSuite("for");
  return s;
}

Stmt Parser::parseIf() {
  Stmt s;
  s.kind = StmtKind::If;
  const Token ifTok = advance();
  s.loc = locOf(ifTok);
  s.value = parseExpr();
  if (!atOp(":")) {
    fail(tok(), fmt::format("expected ':' after the condition of 'if', found {}{}", describe(tok()),
                            atOp("=") ? " (compare with '==')" : ""));
  }
  advance();
  s.body = parseSuite("if");
  // An `else` belongs to the `if` it lines up with; any other is reported by the enclosing block.
  if (atName("else") && tok().line > ifTok.line && tok().column == ifTok.column) {
    advance();
    expectOp(":", "after 'else'");
    s.elseBody = parseSuite("else");
  }
  return s;
}

bool Parser::parseSelect(PartSelector& sel) {
  if (atName("part")) {
    sel.kind = PartSelector::Kind::One;
    sel.loc = locOf(advance());
    sel.one = parseExpr();
    return true;
  }
  if (atName("parts")) {
    sel.kind = PartSelector::Kind::Range;
    sel.loc = locOf(advance());
    sel.range = parseRange();
    return true;
  }
  return false;
}

Stmt Parser::parseGroupOp(core::Collective op) {
  Stmt s;
  s.kind = StmtKind::GroupOp;
  s.op = op;
  const Token opTok = advance();
  s.loc = locOf(opTok);
  s.group = parseGroup(opTok.text);
  std::string_view after = "after the group";
  if (op == core::Collective::Broadcast || op == core::Collective::Reduce) {
    const bool bcast = op == core::Collective::Broadcast;
    expectName(bcast ? "from" : "to",
               bcast ? "and the root after the group of 'broadcast'" : "and the root after the group of 'reduce'");
    s.hasAnchor = true;
    s.anchor = parseExpr();
    after = "after the root";
  }
  if ((atName("from") || atName("to")) && !s.hasAnchor) {
    fail(tok(), fmt::format("expected 'by' after the group, found {} (only broadcast takes 'from' and reduce 'to')",
                            describe(tok())));
  }
  expectName("by", after);
  const Token st = tok();
  const std::optional<Strategy> strategy = st.kind == TokKind::Name ? parseStrategy(st.text) : std::nullopt;
  if (!strategy) {
    fail(st, fmt::format("expected a strategy ({}) after 'by', found {}{}", kStrategyList, describe(st),
                         suggest(st, kStrategyNames)));
  }
  advance();
  s.strategy = *strategy;
  if (parseSelect(s.parts)) {
    expectEnd("the part selection");
  } else if (tok().kind != TokKind::Newline) {
    fail(tok(), fmt::format("expected 'part', 'parts' or end of line after the strategy, found {}{}", describe(tok()),
                            suggest(tok(), {"part", "parts"})));
  } else {
    advance();
  }
  return s;
}

Stmt Parser::parseSend() {
  Stmt s;
  s.kind = StmtKind::Send;
  s.loc = locOf(advance());
  expectName("block", "after 'send'");
  const Token open = tok();
  expectOp("(", "after 'block'");
  {
    Nest nest(*this, open);
    s.blockArgs.push_back(parseExpr());
    if (atOp(",")) {
      advance();
      s.blockArgs.push_back(parseExpr());
    }
    if (atOp(",")) fail(tok(), "expected ')': block() takes one or two indices (block(b) or block(i, j)), found ','");
    expectOp(")", "to close 'block('");
  }
  const bool selected = parseSelect(s.parts);
  if (!atName("from")) {
    fail(tok(), fmt::format("expected {} after '{}', found {}{}", selected ? "'from'" : "'from', 'part' or 'parts'",
                            selected ? "the part selection" : "block(...)", describe(tok()), suggest(tok(), {"from"})));
  }
  advance();
  s.value = parseExpr();
  expectName("to", "and the destination after the source rank");
  s.target = parseExpr();
  if (atName("via")) {
    advance();
    s.vias.push_back(parseExpr());
    while (atOp(",")) {
      advance();
      s.vias.push_back(parseExpr());
    }
    expectEnd("the relay");
  } else if (tok().kind != TokKind::Newline) {
    fail(tok(), fmt::format("expected 'via' or end of line after the destination rank, found {}{}", describe(tok()),
                            suggest(tok(), {"via"})));
  } else {
    advance();
  }
  return s;
}

Group Parser::parseGroup(std::string_view opName) {
  Group g;
  const Token t = tok();
  g.loc = locOf(t);
  if (atName("all")) {
    advance();
    g.kind = GroupKind::All;
    return g;
  }
  if (atName("node") || atName("rail")) {
    g.kind = t.text == "node" ? GroupKind::Node : GroupKind::Rail;
    advance();
    const Token open = tok();
    expectOp("(", fmt::format("after '{}'", t.text));
    Nest nest(*this, open);
    g.items.push_back(parseExpr());
    expectOp(")", fmt::format("to close '{}('", t.text));
    return g;
  }
  if (atOp("{")) {
    advance();
    const std::string where = fmt::format("the group opened at line {}, column {}", t.line, t.column);
    if (atOp("}")) fail(tok(), "expected a rank or 'e for v in range' after '{', found '}' (a group cannot be empty)");
    Expr first = parseExpr();
    if (atName("for")) {
      advance();
      g.kind = GroupKind::Comprehension;
      g.items.push_back(std::move(first));
      g.var = expectBoundName("the variable after 'for' in the group");
      expectName("in", fmt::format("after 'for {}'", g.var));
      g.range = parseRange();
      expectOp("}", "to close " + where);
      return g;
    }
    g.kind = GroupKind::List;
    g.items.push_back(std::move(first));
    while (atOp(",")) {
      advance();
      g.items.push_back(parseExpr());
    }
    if (!atOp("}")) fail(tok(), fmt::format("expected ',' or '}}' in {}, found {}", where, describe(tok())));
    advance();
    return g;
  }
  fail(t, fmt::format("expected a group ({}) after '{}', found {}{}", kGroupList, opName, describe(t),
                      suggest(t, {"all", "node", "rail"})));
}

Range Parser::parseRange() {
  Range r;
  r.loc = locOf(tok());
  Expr first = parseExpr();
  if (atOp("..")) {
    advance();
    r.hasBegin = true;
    r.begin = std::move(first);
    r.end = parseExpr();
  } else {
    r.end = std::move(first);
  }
  return r;
}

Expr Parser::binary(const Token& op, Expr lhs, Expr rhs) {
  if (++operators_ > kMaxOperatorsPerStatement) {
    fail(op, fmt::format("expression too long: more than {} operators in one statement", kMaxOperatorsPerStatement));
  }
  Expr e;
  e.kind = ExprKind::Binary;
  e.loc = lhs.loc;
  e.text = std::string(op.text);
  e.args.reserve(2);
  e.args.push_back(std::move(lhs));
  e.args.push_back(std::move(rhs));
  return e;
}

Expr Parser::parseOr() {
  Expr lhs = parseAnd();
  while (atName("or")) {
    const Token op = advance();
    lhs = binary(op, std::move(lhs), parseAnd());
  }
  return lhs;
}

Expr Parser::parseAnd() {
  Expr lhs = parseNot();
  while (atName("and")) {
    const Token op = advance();
    lhs = binary(op, std::move(lhs), parseNot());
  }
  return lhs;
}

Expr Parser::parsePrefix(const char* text, Expr (Parser::*operand)()) {
  const Token op = tok();
  Nest nest(*this, op);
  advance();
  Expr e;
  e.kind = ExprKind::Unary;
  e.loc = locOf(op);
  e.text = text;
  e.args.push_back((this->*operand)());
  return e;
}

Expr Parser::parseNot() { return atName("not") ? parsePrefix("not", &Parser::parseNot) : parseComparison(); }

bool isComparison(const Token& t) {
  if (t.kind != TokKind::Op) return false;
  return t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=";
}

Expr Parser::parseComparison() {
  Expr lhs = parseAdditive();
  if (!isComparison(tok())) return lhs;
  const Token op = advance();
  lhs = binary(op, std::move(lhs), parseAdditive());
  if (isComparison(tok())) {
    fail(tok(), fmt::format("comparisons cannot be chained (write 'a < b and b < c'), found a second comparison {}",
                            describe(tok())));
  }
  return lhs;
}

Expr Parser::parseAdditive() {
  Expr lhs = parseTerm();
  while (atOp("+") || atOp("-")) {
    const Token op = advance();
    lhs = binary(op, std::move(lhs), parseTerm());
  }
  return lhs;
}

Expr Parser::parseTerm() {
  Expr lhs = parseUnary();
  while (atOp("*") || atOp("/") || atOp("%")) {
    const Token op = advance();
    lhs = binary(op, std::move(lhs), parseUnary());
  }
  return lhs;
}

Expr Parser::parseUnary() { return atOp("-") ? parsePrefix("-", &Parser::parseUnary) : parsePrimary(); }

Expr Parser::parsePrimary() {
  const Token t = tok();
  Expr e;
  e.loc = locOf(t);
  if (t.kind == TokKind::Int) {
    advance();
    e.kind = ExprKind::Int;
    e.value = t.value;
    return e;
  }
  if (t.kind == TokKind::Name && (!isReserved(t.text) || t.text == "parts")) {
    advance();
    e.text = std::string(t.text);
    if (!atOp("(")) {
      e.kind = ExprKind::Name;
      return e;
    }
    const Token open = tok();
    Nest nest(*this, open);
    advance();
    e.kind = ExprKind::Call;
    e.args.push_back(parseExpr());
    while (atOp(",")) {
      advance();
      e.args.push_back(parseExpr());
    }
    if (!atOp(")")) {
      fail(tok(), fmt::format("expected ',' or ')' in the call to '{}' opened at line {}, column {}, found {}",
                              clip(t.text), open.line, open.column, describe(tok())));
    }
    advance();
    return e;
  }
  if (t.kind == TokKind::Op && t.text == "(") {
    Nest nest(*this, t);
    advance();
    Expr inner = parseExpr();
    if (!atOp(")")) {
      fail(tok(), fmt::format("expected ')' to close the '(' at line {}, column {}, found {}", t.line, t.column,
                              describe(tok())));
    }
    advance();
    inner.loc = e.loc;  // the node starts at its parenthesis
    return inner;
  }
  fail(t, fmt::format("expected an expression after {}, found {}", describe(prev_), describe(t)));
}

}  // namespace

ParseResult parseProgram(std::string_view text, std::string_view fileName) {
  ParseResult result;
  try {
    if (text.size() > kMaxProgramBytes) {
      result.errors.push_back(core::Diagnostic{
          std::string(fileName), 1, 1,
          fmt::format("program too large: {} bytes (the limit is {} bytes)", text.size(), kMaxProgramBytes)});
      return result;
    }
    Diagnostics diags(fileName);
    Program program;
    try {
      Parser parser(text, diags);
      program = parser.parse();
    } catch (const TooManyErrors&) {
      // the diagnostics collected so far are the answer
    } catch (const SyntaxError&) {
      // only statements throw it, and they catch it; kept so that a slip can never escape
    }
    result.errors = std::move(diags).finish();
    if (result.errors.empty()) result.program = std::move(program);
  } catch (const std::bad_alloc&) {
    result.program.reset();
    result.errors.assign(1, core::Diagnostic{std::string(fileName), 1, 1, "out of memory while parsing"});
  } catch (const std::exception& e) {
    result.program.reset();
    result.errors.assign(
        1, core::Diagnostic{std::string(fileName), 1, 1, fmt::format("internal error while parsing: {}", e.what())});
  }
  return result;
}

std::string formatDiagnostic(const core::Diagnostic& d, std::string_view text) {
  std::string out = d.str();
  if (d.line < 1) return out;
  std::size_t start = 0;
  for (int l = 1; l < d.line; ++l) {
    const std::size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) return out;
    start = nl + 1;
  }
  std::size_t end = text.find('\n', start);
  if (end == std::string_view::npos) end = text.size();
  if (end > start && text[end - 1] == '\r') --end;
  // Bytes that would garble a terminal or misplace the caret are shown as '?'.
  std::string line;
  for (std::size_t i = start; i < end; ++i) {
    const auto u = static_cast<unsigned char>(text[i]);
    line += (u == '\t' || (u >= 0x20 && u < 0x7f)) ? text[i] : '?';
  }
  std::string caret;
  const std::size_t column = d.column < 1 ? 1 : static_cast<std::size_t>(d.column);
  for (std::size_t i = 0; i + 1 < column; ++i) caret += i < line.size() && line[i] == '\t' ? '\t' : ' ';
  return fmt::format("{}\n    {}\n    {}^", out, line, caret);
}

}  // namespace optiflow::dsl
