// The syntax tree of an OptiFlow program (docs/language.md). The parser builds it, the printer writes it back,
// the expander evaluates it on a topology. Plain values: copying a Program copies the whole tree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/schedule.h"

namespace optiflow::dsl {

struct SourceLoc {
  int line = 0;    // 1-based
  int column = 0;  // 1-based
  friend bool operator==(const SourceLoc&, const SourceLoc&) = default;
};

enum class ExprKind : std::uint8_t {
  Int,     // value
  Name,    // text: a variable or a built-in (nodes, gpus, ranks, rails, parts, root)
  Call,    // text(args...): rank, nodeof, localof, min, max, pow, log2
  Unary,   // text is "-" or "not"; args[0]
  Binary,  // text is the operator (+ - * / % == != < <= > >= and or); args[0], args[1]
};

struct Expr {
  ExprKind kind = ExprKind::Int;
  SourceLoc loc;
  std::int64_t value = 0;
  std::string text;
  std::vector<Expr> args;
  friend bool operator==(const Expr&, const Expr&) = default;
};

// `a..b` is [a, b); a bare `e` is [0, e).
struct Range {
  SourceLoc loc;
  bool hasBegin = false;
  Expr begin;
  Expr end;
  friend bool operator==(const Range&, const Range&) = default;
};

enum class GroupKind : std::uint8_t {
  All,            // all
  Node,           // node(e): the GPUs of node e in local order
  Rail,           // rail(e): GPU e of every node in node order
  List,           // {e1, e2, ...}: these ranks in this order
  Comprehension,  // {e for v in range}: ranks in iteration order
};

struct Group {
  GroupKind kind = GroupKind::All;
  SourceLoc loc;
  std::vector<Expr> items;  // Node/Rail: the index; List: the ranks; Comprehension: the element expression
  std::string var;          // Comprehension
  Range range;              // Comprehension
  friend bool operator==(const Group&, const Group&) = default;
};

enum class Strategy : std::uint8_t { Ring, Direct, Tree, Chain, RecursiveDoubling, RecursiveHalving, Bruck, Pat };
// Spellings: ring direct tree chain recursive_doubling recursive_halving bruck pat.
std::string_view toString(Strategy s);
std::optional<Strategy> parseStrategy(std::string_view s);  // exact spelling only

// `part e` selects one part, `parts a..b` a range; absent = every part.
struct PartSelector {
  enum class Kind : std::uint8_t { All, One, Range } kind = Kind::All;
  SourceLoc loc;
  Expr one;
  Range range;
  friend bool operator==(const PartSelector&, const PartSelector&) = default;
};

enum class StmtKind : std::uint8_t {
  Let,      // let name = value
  Split,    // split value
  For,      // for name in range: body
  If,       // if value: body [else: elseBody]
  GroupOp,  // op group [from|to anchor] by strategy [parts]
  Send,     // send block(args) [parts] from value to target [via vias]
};

struct Stmt {
  StmtKind kind = StmtKind::Let;
  SourceLoc loc;
  std::string name;  // Let, For
  Expr value;        // Let, Split, If (condition), Send (source rank)
  Range range;       // For
  std::vector<Stmt> body;
  std::vector<Stmt> elseBody;
  // GroupOp
  core::Collective op = core::Collective::AllGather;  // AllGather ... AllToAll (never Custom)
  Group group;
  bool hasAnchor = false;  // broadcast ... from e, reduce ... to e
  Expr anchor;
  Strategy strategy = Strategy::Ring;
  PartSelector parts;  // GroupOp and Send
  // Send
  std::vector<Expr> blockArgs;  // block(b) or, for AllToAll, block(i, j)
  Expr target;
  std::vector<Expr> vias;  // at most one relay is compiled today; the checker says so for more
  friend bool operator==(const Stmt&, const Stmt&) = default;
};

struct Program {
  core::Collective collective = core::Collective::AllGather;
  std::string name;
  SourceLoc loc;
  std::vector<Stmt> body;
  friend bool operator==(const Program&, const Program&) = default;
};

// Resets every SourceLoc in the tree, so that programs can be compared by content (round trips, caches).
void clearSourceLocs(Program& p);
void clearSourceLocs(Expr& e);

}  // namespace optiflow::dsl
