// The OptiFlow lexer, parser and printer (docs/language.md): every construct, exact round trips, precise
// diagnostics, and robustness against hostile input.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/dsl/ast.h"
#include "optiflow/dsl/parser.h"

namespace optiflow::dsl {
namespace {

std::string joinErrors(const std::vector<core::Diagnostic>& errors) {
  std::string out;
  for (const core::Diagnostic& d : errors) out += d.str() + "\n";
  return out;
}

Program parseOk(std::string_view text) {
  ParseResult r = parseProgram(text, "test.ofl");
  EXPECT_TRUE(r.ok()) << joinErrors(r.errors) << "in:\n" << text;
  EXPECT_TRUE(r.errors.empty());
  return r.ok() ? *r.program : Program{};
}

std::vector<core::Diagnostic> parseErrors(std::string_view text) {
  ParseResult r = parseProgram(text, "test.ofl");
  EXPECT_FALSE(r.ok()) << "expected errors in:\n" << text;
  EXPECT_FALSE(r.errors.empty());
  return r.errors;
}

Program withoutLocs(Program p) {
  clearSourceLocs(p);
  return p;
}

// The value of `let x = <text>`.
Expr parseExpr(std::string_view text) {
  Program p = parseOk("allgather t\nlet x = " + std::string(text) + "\n");
  if (p.body.size() != 1) return Expr{};
  return p.body[0].value;
}

Expr intE(std::int64_t v) {
  Expr e;
  e.kind = ExprKind::Int;
  e.value = v;
  return e;
}
Expr nameE(std::string n) {
  Expr e;
  e.kind = ExprKind::Name;
  e.text = std::move(n);
  return e;
}
Expr binE(std::string op, Expr a, Expr b) {
  Expr e;
  e.kind = ExprKind::Binary;
  e.text = std::move(op);
  e.args = {std::move(a), std::move(b)};
  return e;
}
Expr unE(std::string op, Expr a) {
  Expr e;
  e.kind = ExprKind::Unary;
  e.text = std::move(op);
  e.args = {std::move(a)};
  return e;
}
Expr callE(std::string f, std::vector<Expr> args) {
  Expr e;
  e.kind = ExprKind::Call;
  e.text = std::move(f);
  e.args = std::move(args);
  return e;
}
Expr noLoc(Expr e) {
  clearSourceLocs(e);
  return e;
}

// ---------------------------------------------------------------------------------------------------------------
// Constructs

TEST(DslParser, HeaderForEveryCollective) {
  const std::pair<std::string_view, core::Collective> cases[] = {
      {"allgather", core::Collective::AllGather}, {"reducescatter", core::Collective::ReduceScatter},
      {"allreduce", core::Collective::AllReduce}, {"broadcast", core::Collective::Broadcast},
      {"reduce", core::Collective::Reduce},       {"alltoall", core::Collective::AllToAll}};
  for (const auto& [word, coll] : cases) {
    Program p = parseOk(std::string(word) + " my_algo_2\n");
    EXPECT_EQ(p.collective, coll) << word;
    EXPECT_EQ(p.name, "my_algo_2");
    EXPECT_EQ(p.loc, (SourceLoc{1, 1}));
    EXPECT_TRUE(p.body.empty());
  }
  // No trailing newline, leading blank lines and comments, CRLF.
  EXPECT_EQ(parseOk("\n# hello\n\nreduce r").name, "r");
  EXPECT_EQ(parseOk("\n# hello\n\nreduce r").loc, (SourceLoc{4, 1}));
  Program crlf = parseOk("allgather c\r\n  split 2\r\n");
  ASSERT_EQ(crlf.body.size(), 1u);
  EXPECT_EQ(crlf.body[0].value.value, 2);
}

TEST(DslParser, LetAndSplit) {
  Program p = parseOk("allgather t\nlet half = ranks / 2\nsplit 4\n");
  ASSERT_EQ(p.body.size(), 2u);
  EXPECT_EQ(p.body[0].kind, StmtKind::Let);
  EXPECT_EQ(p.body[0].name, "half");
  EXPECT_EQ(noLoc(p.body[0].value), binE("/", nameE("ranks"), intE(2)));
  EXPECT_EQ(p.body[0].loc, (SourceLoc{2, 1}));
  EXPECT_EQ(p.body[0].value.loc, (SourceLoc{2, 12}));
  EXPECT_EQ(p.body[1].kind, StmtKind::Split);
  EXPECT_EQ(p.body[1].value, (Expr{ExprKind::Int, {3, 7}, 4, "", {}}));
}

TEST(DslParser, ForWithBothRangeForms) {
  Program p = parseOk(
      "allgather t\n"
      "  for g in gpus: split 1\n"
      "  for s in 1..nodes - 1:\n"
      "    split 2\n"
      "    split 3\n");
  ASSERT_EQ(p.body.size(), 2u);
  const Stmt& a = p.body[0];
  EXPECT_EQ(a.kind, StmtKind::For);
  EXPECT_EQ(a.name, "g");
  EXPECT_FALSE(a.range.hasBegin);
  EXPECT_EQ(noLoc(a.range.end), nameE("gpus"));
  EXPECT_EQ(a.range.begin, Expr{});  // untouched when absent
  EXPECT_EQ(a.range.loc, (SourceLoc{2, 12}));
  ASSERT_EQ(a.body.size(), 1u);
  EXPECT_EQ(a.body[0].loc, (SourceLoc{2, 18}));
  const Stmt& b = p.body[1];
  EXPECT_TRUE(b.range.hasBegin);
  EXPECT_EQ(noLoc(b.range.begin), intE(1));
  EXPECT_EQ(noLoc(b.range.end), binE("-", nameE("nodes"), intE(1)));
  ASSERT_EQ(b.body.size(), 2u);
  EXPECT_EQ(b.body[1].value.value, 3);
  EXPECT_EQ(b.body[1].loc, (SourceLoc{5, 5}));
}

TEST(DslParser, IfElseBlocksAndOneLiners) {
  Program p = parseOk(
      "allgather t\n"
      "if gpus == 8: split 1\n"
      "else: split 2\n"
      "if nodes > 1:\n"
      "  split 3\n"
      "else:\n"
      "  if not nodes == 0:\n"
      "    split 4\n"
      "if 1: split 5\n"
      "split 6\n");
  ASSERT_EQ(p.body.size(), 4u);
  const Stmt& a = p.body[0];
  EXPECT_EQ(a.kind, StmtKind::If);
  EXPECT_EQ(noLoc(a.value), binE("==", nameE("gpus"), intE(8)));
  ASSERT_EQ(a.body.size(), 1u);
  ASSERT_EQ(a.elseBody.size(), 1u);
  EXPECT_EQ(a.elseBody[0].value.value, 2);
  const Stmt& b = p.body[1];
  ASSERT_EQ(b.elseBody.size(), 1u);
  EXPECT_EQ(b.elseBody[0].kind, StmtKind::If);
  EXPECT_EQ(noLoc(b.elseBody[0].value), unE("not", binE("==", nameE("nodes"), intE(0))));
  EXPECT_TRUE(b.elseBody[0].elseBody.empty());
  EXPECT_TRUE(p.body[2].elseBody.empty());
  EXPECT_EQ(p.body[3].kind, StmtKind::Split);
}

TEST(DslParser, ElseLinesUpWithItsIf) {
  // The inner one-line `if` does not take an `else` at the outer column: that `else` has no `if` of its own.
  std::vector<core::Diagnostic> errors = parseErrors(
      "allgather t\n"
      "for a in 2: if a: split 1\n"
      "else: split 2\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].line, 3);
  EXPECT_NE(errors[0].message.find("'else' without a matching 'if'"), std::string::npos);
  // Nested blocks: each else pairs with the if at its own column.
  Program p = parseOk(
      "allgather t\n"
      "if 1:\n"
      "  if 2:\n"
      "    split 1\n"
      "else:\n"
      "  split 2\n");
  ASSERT_EQ(p.body.size(), 1u);
  EXPECT_EQ(p.body[0].elseBody.size(), 1u);
  EXPECT_TRUE(p.body[0].body[0].elseBody.empty());
}

TEST(DslParser, EveryGroupKind) {
  Program p = parseOk(
      "allgather t\n"
      "allgather all by ring\n"
      "allgather node(n + 1) by direct\n"
      "allgather rail(g) by bruck\n"
      "allgather {0, rank(1, 2), 3} by pat\n"
      "allgather {rank(n, g) for n in 1..nodes} by recursive_doubling\n");
  ASSERT_EQ(p.body.size(), 5u);
  EXPECT_EQ(p.body[0].group.kind, GroupKind::All);
  EXPECT_TRUE(p.body[0].group.items.empty());
  EXPECT_EQ(p.body[0].group.loc, (SourceLoc{2, 11}));
  EXPECT_EQ(p.body[1].group.kind, GroupKind::Node);
  ASSERT_EQ(p.body[1].group.items.size(), 1u);
  EXPECT_EQ(noLoc(p.body[1].group.items[0]), binE("+", nameE("n"), intE(1)));
  EXPECT_EQ(p.body[2].group.kind, GroupKind::Rail);
  EXPECT_EQ(p.body[2].strategy, Strategy::Bruck);
  const Group& list = p.body[3].group;
  EXPECT_EQ(list.kind, GroupKind::List);
  ASSERT_EQ(list.items.size(), 3u);
  EXPECT_EQ(noLoc(list.items[1]), callE("rank", {intE(1), intE(2)}));
  EXPECT_EQ(list.items[2].loc, (SourceLoc{5, 27}));
  const Group& comp = p.body[4].group;
  EXPECT_EQ(comp.kind, GroupKind::Comprehension);
  EXPECT_EQ(comp.var, "n");
  ASSERT_EQ(comp.items.size(), 1u);
  EXPECT_EQ(noLoc(comp.items[0]), callE("rank", {nameE("n"), nameE("g")}));
  EXPECT_TRUE(comp.range.hasBegin);
  EXPECT_EQ(noLoc(comp.range.end), nameE("nodes"));
  EXPECT_EQ(p.body[4].strategy, Strategy::RecursiveDoubling);
}

TEST(DslParser, AllSixGroupOperations) {
  Program p = parseOk(
      "allreduce t\n"
      "allgather all by ring\n"
      "reducescatter all by recursive_halving part 1\n"
      "allreduce all by tree parts 0..2\n"
      "broadcast node(n) from rank(n, 0) by chain\n"
      "reduce rail(0) to root by direct parts parts\n"
      "alltoall all by direct\n");
  ASSERT_EQ(p.body.size(), 6u);
  const core::Collective ops[] = {core::Collective::AllGather, core::Collective::ReduceScatter,
                                  core::Collective::AllReduce, core::Collective::Broadcast,
                                  core::Collective::Reduce,    core::Collective::AllToAll};
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(p.body[i].kind, StmtKind::GroupOp);
    EXPECT_EQ(p.body[i].op, ops[i]);
    EXPECT_EQ(p.body[i].hasAnchor, i == 3 || i == 4) << i;
  }
  EXPECT_EQ(p.body[0].parts.kind, PartSelector::Kind::All);
  EXPECT_EQ(p.body[1].parts.kind, PartSelector::Kind::One);
  EXPECT_EQ(p.body[1].parts.one.value, 1);
  EXPECT_EQ(p.body[1].parts.loc, (SourceLoc{3, 40}));
  EXPECT_EQ(p.body[2].parts.kind, PartSelector::Kind::Range);
  EXPECT_TRUE(p.body[2].parts.range.hasBegin);
  EXPECT_EQ(p.body[2].parts.range.end.value, 2);
  EXPECT_EQ(p.body[2].strategy, Strategy::Tree);
  EXPECT_EQ(noLoc(p.body[3].anchor), callE("rank", {nameE("n"), intE(0)}));
  EXPECT_EQ(p.body[3].strategy, Strategy::Chain);
  EXPECT_EQ(noLoc(p.body[4].anchor), nameE("root"));
  // `parts parts`: the keyword, then the built-in name as the range's end.
  EXPECT_EQ(p.body[4].parts.kind, PartSelector::Kind::Range);
  EXPECT_FALSE(p.body[4].parts.range.hasBegin);
  EXPECT_EQ(noLoc(p.body[4].parts.range.end), nameE("parts"));
}

TEST(DslParser, EveryStrategyName) {
  for (Strategy s : {Strategy::Ring, Strategy::Direct, Strategy::Tree, Strategy::Chain, Strategy::RecursiveDoubling,
                     Strategy::RecursiveHalving, Strategy::Bruck, Strategy::Pat}) {
    EXPECT_EQ(parseStrategy(toString(s)), s);
    Program p = parseOk("allgather t\nallgather all by " + std::string(toString(s)) + "\n");
    ASSERT_EQ(p.body.size(), 1u);
    EXPECT_EQ(p.body[0].strategy, s);
  }
  EXPECT_EQ(parseStrategy("Ring"), std::nullopt);
  EXPECT_EQ(parseStrategy(""), std::nullopt);
}

TEST(DslParser, Sends) {
  Program p = parseOk(
      "alltoall t\n"
      "send block(r) from r to (r + 1) % ranks\n"
      "send block(i, j) part 0 from i to j via rank(nodeof(i), localof(j))\n"
      "send block(b) parts 1..3 from 0 to 1 via 2, 3\n");
  ASSERT_EQ(p.body.size(), 3u);
  const Stmt& a = p.body[0];
  EXPECT_EQ(a.kind, StmtKind::Send);
  ASSERT_EQ(a.blockArgs.size(), 1u);
  EXPECT_EQ(noLoc(a.value), nameE("r"));
  EXPECT_EQ(noLoc(a.target), binE("%", binE("+", nameE("r"), intE(1)), nameE("ranks")));
  EXPECT_EQ(a.target.loc, (SourceLoc{2, 25}));  // the parenthesis that starts it
  EXPECT_TRUE(a.vias.empty());
  const Stmt& b = p.body[1];
  ASSERT_EQ(b.blockArgs.size(), 2u);
  EXPECT_EQ(b.parts.kind, PartSelector::Kind::One);
  ASSERT_EQ(b.vias.size(), 1u);
  EXPECT_EQ(noLoc(b.vias[0]), callE("rank", {callE("nodeof", {nameE("i")}), callE("localof", {nameE("j")})}));
  const Stmt& c = p.body[2];
  EXPECT_EQ(c.parts.kind, PartSelector::Kind::Range);
  ASSERT_EQ(c.vias.size(), 2u);
  EXPECT_EQ(c.vias[1].value, 3);
}

TEST(DslParser, ReduceIsAlwaysTheGroupOperation) {
  Program p = parseOk("reduce t\nreduce all to 0 by tree\n");
  ASSERT_EQ(p.body.size(), 1u);
  EXPECT_EQ(p.body[0].kind, StmtKind::GroupOp);
  EXPECT_EQ(p.body[0].op, core::Collective::Reduce);
  std::vector<core::Diagnostic> errors = parseErrors("reduce t\nreduce block(0) from 1 to 0\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("expected a group"), std::string::npos);
}

TEST(DslParser, BodyIndentedOrNot) {
  const Program flat = parseOk("allgather t\nsplit 2\nfor g in gpus:\n  split 1\n");
  const Program indented = parseOk("allgather t\n    split 2\n    for g in gpus:\n       split 1\n");
  EXPECT_EQ(withoutLocs(flat), withoutLocs(indented));
  EXPECT_EQ(indented.body[1].body[0].loc, (SourceLoc{4, 8}));
  // A header indented like the body (a program pasted from a document) is accepted too.
  EXPECT_EQ(withoutLocs(parseOk("  allgather t\n  split 2\n  for g in gpus:\n    split 1\n")), withoutLocs(flat));
}

// ---------------------------------------------------------------------------------------------------------------
// Expressions

TEST(DslParser, ExpressionTrees) {
  EXPECT_EQ(noLoc(parseExpr("1 + 2 * 3")), binE("+", intE(1), binE("*", intE(2), intE(3))));
  EXPECT_EQ(noLoc(parseExpr("(1 + 2) * 3")), binE("*", binE("+", intE(1), intE(2)), intE(3)));
  EXPECT_EQ(noLoc(parseExpr("1 - 2 - 3")), binE("-", binE("-", intE(1), intE(2)), intE(3)));
  EXPECT_EQ(noLoc(parseExpr("8 / 4 % 3")), binE("%", binE("/", intE(8), intE(4)), intE(3)));
  EXPECT_EQ(noLoc(parseExpr("-a * b")), binE("*", unE("-", nameE("a")), nameE("b")));
  EXPECT_EQ(noLoc(parseExpr("- -a")), unE("-", unE("-", nameE("a"))));
  EXPECT_EQ(noLoc(parseExpr("not a == b")), unE("not", binE("==", nameE("a"), nameE("b"))));
  EXPECT_EQ(noLoc(parseExpr("a or b and c")), binE("or", nameE("a"), binE("and", nameE("b"), nameE("c"))));
  EXPECT_EQ(noLoc(parseExpr("not a and b")), binE("and", unE("not", nameE("a")), nameE("b")));
  EXPECT_EQ(noLoc(parseExpr("a + 1 < b * 2")),
            binE("<", binE("+", nameE("a"), intE(1)), binE("*", nameE("b"), intE(2))));
  EXPECT_EQ(noLoc(parseExpr("min(a, max(b, 1))")), callE("min", {nameE("a"), callE("max", {nameE("b"), intE(1)})}));
  EXPECT_EQ(noLoc(parseExpr("((x))")), nameE("x"));
  EXPECT_EQ(noLoc(parseExpr("9223372036854775807")), intE(9223372036854775807));
  EXPECT_EQ(noLoc(parseExpr("007")), intE(7));
  EXPECT_EQ(noLoc(parseExpr("parts - 1")), binE("-", nameE("parts"), intE(1)));
  for (std::string_view op : {"==", "!=", "<", "<=", ">", ">="}) {
    EXPECT_EQ(noLoc(parseExpr("a " + std::string(op) + " b")), binE(std::string(op), nameE("a"), nameE("b")));
  }
  // A binary node starts where its left operand starts.
  EXPECT_EQ(parseExpr("(a + b) * c").loc, (SourceLoc{2, 9}));
  EXPECT_EQ(parseExpr("(a + b) * c").args[0].loc, (SourceLoc{2, 9}));
  EXPECT_EQ(parseExpr("(a + b) * c").args[0].args[1].loc, (SourceLoc{2, 14}));
}

TEST(DslParser, MinimalParenthesesInPrint) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"1 + 2 * 3", "1 + 2 * 3"},
      {"(1 + 2) * 3", "(1 + 2) * 3"},
      {"1 - (2 - 3)", "1 - (2 - 3)"},
      {"(1 - 2) - 3", "1 - 2 - 3"},
      {"a * (b * c)", "a * (b * c)"},
      {"(a / b) * c", "a / b * c"},
      {"a % (b + 1)", "a % (b + 1)"},
      {"((a))", "a"},
      {"-(a + b)", "-(a + b)"},
      {"-(-(a))", "--a"},
      {"(-a) * b", "-a * b"},
      {"a - -b", "a - -b"},
      {"not (a == b)", "not a == b"},
      {"(not a) == b", "(not a) == b"},
      {"not (a and b)", "not (a and b)"},
      {"not not a", "not not a"},
      {"a and (not b)", "a and not b"},
      {"a or (b and c)", "a or b and c"},
      {"(a or b) and c", "(a or b) and c"},
      {"a and (b or c)", "a and (b or c)"},
      {"a or (b or c)", "a or (b or c)"},
      {"(a < b) == c", "(a < b) == c"},
      {"a == (b == c)", "a == (b == c)"},
      {"(a + 1) < (b * 2)", "a + 1 < b * 2"},
      {"f((a + b), -(c))", "f(a + b, -c)"},
      {"(a == b) and (c != d)", "a == b and c != d"},
  };
  for (const auto& [in, out] : cases) {
    const Expr e = parseExpr(in);
    EXPECT_EQ(printExpr(e), out) << in;
    EXPECT_EQ(noLoc(parseExpr(printExpr(e))), noLoc(e)) << in;
  }
}

TEST(DslParser, PrintsHandBuiltTreesWithTheRightParentheses) {
  // Trees the parser would only produce from parenthesised text.
  EXPECT_EQ(printExpr(binE("-", intE(1), binE("+", intE(2), intE(3)))), "1 - (2 + 3)");
  EXPECT_EQ(printExpr(binE("*", binE("+", intE(1), intE(2)), binE("-", intE(3), intE(4)))), "(1 + 2) * (3 - 4)");
  EXPECT_EQ(printExpr(unE("-", binE("*", intE(2), intE(3)))), "-(2 * 3)");
  EXPECT_EQ(printExpr(binE("<", unE("not", nameE("a")), intE(1))), "(not a) < 1");
  EXPECT_EQ(printExpr(callE("rank", {binE("or", nameE("a"), nameE("b")), intE(0)})), "rank(a or b, 0)");
}

// ---------------------------------------------------------------------------------------------------------------
// Printing and round trips

TEST(DslParser, CanonicalText) {
  const Program p = parseOk(
      "allgather   messy   # a comment\n"
      "for g in gpus :   allgather rail( g ) by ring part ( 1 )\n"
      "if (a==1): split 2\n"
      "else :\n"
      "   split 3\n"
      "broadcast node(n) from rank(n,0) by tree parts 0 .. 2\n"
      "send block(r) from r to ((r + 1) % ranks) via rank(nodeof(r), 3)\n"
      "allgather {x*2 for x in 4} by direct\n"
      "allgather {1,2} by bruck\n");
  EXPECT_EQ(printProgram(p),
            "allgather messy\n"
            "  for g in gpus:\n"
            "    allgather rail(g) by ring part 1\n"
            "  if a == 1:\n"
            "    split 2\n"
            "  else:\n"
            "    split 3\n"
            "  broadcast node(n) from rank(n, 0) by tree parts 0..2\n"
            "  send block(r) from r to (r + 1) % ranks via rank(nodeof(r), 3)\n"
            "  allgather {x * 2 for x in 4} by direct\n"
            "  allgather {1, 2} by bruck\n");
  EXPECT_EQ(printProgram(parseOk("reduce r\nreduce all to 0 by chain\nlet z = -1\n")),
            "reduce r\n  reduce all to 0 by chain\n  let z = -1\n");
  EXPECT_EQ(printProgram(parseOk("alltoall e\n")), "alltoall e\n");
}

const char* const kPrograms[] = {
    // The example of docs/language.md.
    R"(allgather hierarchical_rail
  # every rail is a ring across the nodes, then every node shares what it has over NVSwitch
  for g in gpus: allgather rail(g) by ring
  for n in nodes: allgather node(n) by direct
)",
    // The reduce-scatter of the "where a reduce-scatter puts a chunk" paragraph.
    R"(reducescatter hier_rs
for n in nodes: reducescatter node(n) by ring
for g in gpus: reducescatter rail(g) by direct
)",
    R"(allreduce pipelined
split 4
for p in parts:
  allreduce all by ring part p
)",
    R"(broadcast two_level
  broadcast {rank(n, 0) for n in nodes} from root by tree
  for n in nodes:
    broadcast node(n) from rank(n, 0) by chain parts 0..2
    broadcast node(n) from rank(n, 0) by direct parts 2..parts
)",
    R"(reduce two_level
for n in nodes:
  reduce node(n) to rank(n, localof(root)) by tree
reduce {rank(n, localof(root)) for n in nodes} to root by chain
)",
    R"(alltoall pxn
  for i in ranks:
    for j in ranks:
      if nodeof(i) == nodeof(j):
        send block(i, j) from i to j
      else:
        send block(i, j) from i to j via rank(nodeof(i), localof(j))
)",
    R"(allgather manual_ring
  let n = ranks
  let half = n / 2
  for step in 0..n - 1:
    for r in ranks:
      let b = (r - step + n) % n
      send block(b) from r to (r + 1) % n
)",
    R"(allreduce exprs
  let a = -(1 + 2) * 3 - -4
  let b = not (a > 1 and a < 10) or a == 5
  let c = min(max(a, 1), pow(2, log2(ranks)))
  if not a != 0 and (b or c >= 2):
    allreduce all by recursive_doubling
  else:
    allreduce all by recursive_halving
)",
    R"(allgather one_liners
for n in nodes: for g in gpus: send block(rank(n, g)) from rank(n, g) to rank((n + 1) % nodes, g)
for n in nodes: if n > 0: allgather node(n) by ring
)",
    R"(allgather lists
  allgather {0, 1, 2, 3} by bruck
  for g in gpus:
    allgather {rank(0, g), rank(1, g)} by pat parts 0..1
    allgather {rank(n, g) for n in 1..nodes} by ring
)",
    R"(allgather conditional
if gpus == 8: allgather all by ring
else: allgather all by direct
if nodes > 1:
  for g in gpus: allgather rail(g) by recursive_doubling part 0
)",
    R"(reducescatter rs_mix
split 2
reducescatter all by recursive_halving part 0
reducescatter all by pat part 1
)",
    R"(allgather sends
  split 4
  for r in ranks:
    send block(r) part 0 from r to (r + 1) % ranks
    send block(r) parts 1..parts from r to (r + 1) % ranks via rank(nodeof(r), 3)
    send block(r) parts parts from r to r via 1, 2
)",
    R"(allreduce deep
for a in 2:
  for b in 0..2:
    if a == b:
      if a == 0:
        allreduce node(a) by tree
      else:
        for c in 0..a * 2:
          allreduce rail(c) by direct part c % 2
    else:
      let d = a - b
      allreduce {a, b, d} by ring
)",
    R"(alltoall shifted
alltoall all by direct
for n in nodes: alltoall node(n) by ring
for g in gpus:
  alltoall rail(g) by direct parts 0..1
  alltoall {r for r in ranks} by ring
)",
    "allgather crlf_and_comments\r\n\r\n  # comment line\r\n  for g in gpus:   # trailing\r\n\r\n    allgather "
    "rail(g) by ring\r\n",
    R"(allgather arithmetic
let x = 1 - (2 - 3) - 4 * (5 % 6) / 7
let y = (x + 1) * (x - 1) % ranks
let z = x < y or x >= y and not x == y
let w = ((((1))))
split max(1, min(8, ranks / 64))
)",
    R"(allgather weird_indent
    for g in gpus:
       allgather rail(g) by ring
       if g == 0:
         allgather all by direct
    allgather all by direct
)",
    R"(broadcast edge_names
let parts_copy = parts
let root2 = root + 1
broadcast all from root2 % ranks by direct parts 0..parts
)",
};

TEST(DslParser, RoundTripAndIdempotentPrint) {
  int n = 0;
  for (const char* text : kPrograms) {
    SCOPED_TRACE(text);
    const Program p = parseOk(text);
    ASSERT_FALSE(p.name.empty());
    const std::string printed = printProgram(p);
    const Program again = parseOk(printed);
    EXPECT_EQ(withoutLocs(again), withoutLocs(p)) << printed;
    EXPECT_EQ(printProgram(again), printed);
    ++n;
  }
  EXPECT_GE(n, 15);
}

TEST(DslParser, EqualityIgnoringLocsStillSeesContent) {
  const Program a = parseOk("allgather t\nfor g in gpus: allgather rail(g) by ring\n");
  const Program b = parseOk("allgather t\n  for g in gpus:\n    allgather rail(g) by ring\n");
  EXPECT_NE(a, b);  // different locations
  EXPECT_EQ(withoutLocs(a), withoutLocs(b));
  for (std::string_view other : {"allgather t\nfor g in gpus: allgather rail(g) by direct\n",
                                 "allgather t\nfor h in gpus: allgather rail(h) by ring\n",
                                 "allgather t\nfor g in 0..gpus: allgather rail(g) by ring\n",
                                 "allgather u\nfor g in gpus: allgather rail(g) by ring\n",
                                 "allgather t\nfor g in gpus: allgather node(g) by ring\n",
                                 "allgather t\nfor g in gpus: allgather rail(g) by ring part 0\n"}) {
    EXPECT_NE(withoutLocs(parseOk(other)), withoutLocs(a)) << other;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Diagnostics

struct BadCase {
  std::string_view text;
  int line;
  int column;
  std::string_view phrase;
};

TEST(DslParser, MalformedInputsPointAtTheProblem) {
  const BadCase cases[] = {
      {"allgather x\nallgather rail(g) by rign\n", 2, 22,
       "expected a strategy (ring, direct, tree, chain, recursive_doubling, recursive_halving, bruck, pat) after "
       "'by', found 'rign'; did you mean 'ring'?"},
      {"allgather x\nfor g in gpus\n  allgather all by ring\n", 2, 14,
       "expected ':' after the range of 'for', found end of line"},
      {"allgather x\nallgathr all by ring\n", 2, 1,
       "unknown statement 'allgathr': expected let, split, for, if, send, allgather, reducescatter, allreduce, "
       "broadcast, reduce or alltoall; did you mean 'allgather'?"},
      {"", 1, 1, "empty program: expected a header such as 'allgather my_algorithm'"},
      {"# only a comment\n\n   \n", 1, 1, "empty program"},
      {"allgathr x\n", 1, 1, "expected a header such as 'allgather my_algorithm'"},
      {"allgather\n", 1, 10, "expected the algorithm's name after 'allgather', found end of line"},
      {"allgather x y\n", 1, 13, "expected end of line after the header 'allgather x', found 'y'"},
      {"for g in gpus: allgather rail(g) by ring\n", 1, 1, "before the first statement, found 'for'"},
      {"allgather x\nlet = 3\n", 2, 5, "expected a name after 'let', found '='"},
      {"allgather x\nlet for = 3\n", 2, 5, "found 'for' (a keyword cannot be a name)"},
      {"allgather x\nlet y == 3\n", 2, 7, "expected '=' after 'let y', found '=='"},
      {"allgather x\nlet y = 3 +\n", 2, 12, "expected an expression after '+', found end of line"},
      {"allgather x\nlet y = (1 + 2\n", 2, 15, "expected ')' to close the '(' at line 2, column 9, found end of line"},
      {"allgather x\nlet y = a < b < c\n", 2, 15, "comparisons cannot be chained"},
      {"allgather x\nif a = 1:\n  split 2\n", 2, 6, "found '=' (compare with '==')"},
      {"allgather x\nfor g gpus:\n", 2, 7, "expected 'in' after 'for g', found 'gpus'"},
      {"allgather x\nfor g in gpus:\nsplit 2\n", 3, 1,
       "expected an indented block after the ':' of 'for', found 'split'"},
      {"allgather x\nfor g in gpus:\n", 3, 1, "expected an indented block after the ':' of 'for', found end of file"},
      {"allgather x\nallgather rial(g) by ring\n", 2, 11, "after 'allgather', found 'rial'; did you mean 'rail'?"},
      {"allgather x\nallgather all ring\n", 2, 15, "expected 'by' after the group, found 'ring'"},
      {"allgather x\nallgather all from 0 by ring\n", 2, 15, "(only broadcast takes 'from' and reduce 'to')"},
      {"allgather x\nif x == 1\n  split 2\nelse:\n  split 3\n", 2, 10,
       "expected ':' after the condition of 'if', found end of line"},
      {"allgather x\nbroadcast all by tree\n", 2, 15, "expected 'from' and the root after the group of 'broadcast'"},
      {"allgather x\nreduce all from 0 by tree\n", 2, 12, "expected 'to' and the root after the group of 'reduce'"},
      {"allgather x\nallgather all by ring parts\n", 2, 28, "expected an expression after 'parts', found end of line"},
      {"allgather x\nallgather all by ring 3\n", 2, 23, "expected 'part', 'parts' or end of line after the strategy"},
      {"allgather x\nsend block(1) to 2\n", 2, 15, "expected 'from', 'part' or 'parts' after 'block(...)', found 'to'"},
      {"allgather x\nsend block(1, 2, 3) from 0 to 1\n", 2, 16, "block() takes one or two indices"},
      {"allgather x\nsend blok(1) from 0 to 1\n", 2, 6, "expected 'block' after 'send', found 'blok'; did you mean"},
      {"allgather x\nsend block(1) from 0 2\n", 2, 22, "expected 'to' and the destination after the source rank"},
      {"allgather x\nsend block(1) from 0 to 1 via\n", 2, 30, "expected an expression after 'via', found end of line"},
      {"allgather x\nsend block(1) from 0 to 1 vai 2\n", 2, 27, "did you mean 'via'?"},
      {"allgather x\nallgather {} by ring\n", 2, 12, "a group cannot be empty"},
      {"allgather x\nallgather {1, 2 by ring\n", 2, 17,
       "expected ',' or '}' in the group opened at line 2, column 11, found 'by'"},
      {"allgather x\nallgather {r for in ranks} by ring\n", 2, 18, "expected the variable after 'for' in the group"},
      {"allgather x\nelse:\n  split 1\n", 2, 1, "'else' without a matching 'if'"},
      {"allgather x\nsplit 2\n  split 3\n", 3, 3, "unexpected indentation"},
      {"allgather x\n  split 2\n split 3\n", 3, 2, "indentation does not match any outer block"},
      {"allgather x\nfor g in gpus:\n    split 2\n  split 3\n", 4, 3, "indentation does not match any outer block"},
      {"allgather x\n\tsplit 2\n", 2, 1, "use spaces for indentation"},
      {"allgather x\n  \t  split 2\n", 2, 3, "use spaces for indentation"},
      {"allgather x\nlet y = 99999999999999999999\n", 2, 9, "integer '99999999999999999999' is too large"},
      {"allgather x\nlet y = 9223372036854775808\n", 2, 9, "is too large"},
      {"allgather x\nlet y = 12ab\n", 2, 9, "invalid number '12ab'"},
      {"allgather x\nlet y = a $ b\n", 2, 11, "unexpected character '$'"},
      {"allgather x\nlet y = a \x01 b\n", 2, 11, "control character 0x01 at column 11"},
      {"allgather x\nlet y = \xc3\xa9\n", 2, 9, "non-ASCII byte 0xc3 at column 9"},
      {"allgather x\nlet y = a # \x07 bell\n", 2, 13, "in a comment"},
      {"allgather x\nallgather all by tre\xc3\xa9\n", 2, 21, "non-ASCII byte 0xc3 at column 21"},
      {"allgather x\n  for g in gpus:\n    split 1\n\tsplit 2\n", 4, 1, "use spaces for indentation"},
      {"allgather x\n  split 1\n{}\n", 3, 1, "expected a statement (let"},
      {"allgather x\nlet y = a . b\n", 2, 11, "unexpected character '.' (a range is written 'a..b')"},
      {"allgather x\nlet y = a && b\n", 2, 11, "(write 'and')"},
      {"allgather x\n  split 2\nsplit 3\n", 3, 1, "expected every statement of the body indented like the first one"},
      {"allgather x\nlet y = f(1,)\n", 2, 13, "expected an expression after ',', found ')'"},
      {"allgather x\nlet y = f(1 2)\n", 2, 13, "expected ',' or ')' in the call to 'f' opened at line 2, column 10"},
      {"allgather x\nlet y = a and or b\n", 2, 15, "expected an expression after 'and', found 'or'"},
      {"allgather x\n42\n", 2, 1, "expected a statement (let, split,"},
      {"allgather x\nfor g in gpus: allgathr all by ring\n", 2, 16, "unknown statement 'allgathr'"},
      {"allgather x\nallgather all by\n", 2, 17, "after 'by', found end of line"},
      {"allgather x\nallgather node 0 by ring\n", 2, 16, "expected '(' after 'node', found '0'"},
      {"allgather x\nsplit\n", 2, 6, "expected an expression after 'split', found end of line"},
      {"allgather x\nsplit 2 3\n", 2, 9, "expected end of line after the number of parts of 'split', found '3'"},
      {"allgather x\nif 1:\n  split 1\nelse\n", 4, 5, "expected ':' after 'else', found end of line"},
      {"allgather x\nlet y = rank()\n", 2, 14, "expected an expression after '(', found ')'"},
      {"allgather x\nlet y = a +\n", 2, 12, "found end of line"},
      {"allgather x\nlet verylongname_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 1\n", 2, 63,
       "expected '=' after 'let verylongname_"},
  };
  ASSERT_GE(std::size(cases), 25u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(std::string(c.text));
    const ParseResult r = parseProgram(c.text, "bad.ofl");
    ASSERT_FALSE(r.ok());
    ASSERT_EQ(r.errors.size(), 1u) << joinErrors(r.errors);
    const core::Diagnostic& d = r.errors[0];
    EXPECT_EQ(d.file, "bad.ofl");
    EXPECT_EQ(d.line, c.line) << d.str();
    EXPECT_EQ(d.column, c.column) << d.str();
    EXPECT_NE(d.message.find(c.phrase), std::string::npos) << d.str();
  }
}

TEST(DslParser, SuggestionsOnlyForNearMisses) {
  std::vector<core::Diagnostic> errors = parseErrors("allgather x\nallgather all by zzzz\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message.find("did you mean"), std::string::npos);
  errors = parseErrors("allgather x\nallgather all by recursive_doubing\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("did you mean 'recursive_doubling'?"), std::string::npos);
  errors = parseErrors("allgather x\nbroadcats all from 0 by tree\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("did you mean 'broadcast'?"), std::string::npos);
}

TEST(DslParser, OneErrorPerBadLineInOnePass) {
  const std::vector<core::Diagnostic> errors = parseErrors(
      "allgather x\n"
      "allgathr all by ring\n"
      "allgather all by ring\n"
      "allgather all by rign\n"
      "let = 1\n"
      "split 4\n");
  ASSERT_EQ(errors.size(), 3u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 2);
  EXPECT_EQ(errors[1].line, 4);
  EXPECT_EQ(errors[2].line, 5);
  EXPECT_NE(errors[0].message.find("unknown statement"), std::string::npos);
  EXPECT_NE(errors[1].message.find("strategy"), std::string::npos);
  EXPECT_NE(errors[2].message.find("a name after 'let'"), std::string::npos);
}

TEST(DslParser, ErrorsInsideABlockWhoseHeaderFailed) {
  const std::vector<core::Diagnostic> errors = parseErrors(
      "allgather x\n"
      "for g in gpus\n"
      "  allgathr all by ring\n"
      "  allgather all by ring\n"
      "split $\n");
  ASSERT_EQ(errors.size(), 3u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 2);
  EXPECT_EQ(errors[1].line, 3);
  EXPECT_EQ(errors[1].column, 3);
  EXPECT_EQ(errors[2].line, 5);
  EXPECT_EQ(errors[2].column, 7);
}

TEST(DslParser, TooManyErrorsStops) {
  std::string text = "allgather x\n";
  for (int i = 0; i < 50; ++i) text += "bogus line\n";
  const std::vector<core::Diagnostic> errors = parseErrors(text);
  ASSERT_EQ(errors.size(), kMaxErrors + 1);
  for (std::size_t i = 0; i < kMaxErrors; ++i) {
    EXPECT_EQ(errors[i].line, static_cast<int>(i) + 2);
    EXPECT_NE(errors[i].message.find("unknown statement 'bogus'"), std::string::npos);
  }
  EXPECT_EQ(errors.back().message, "too many errors; stopping");
  EXPECT_GE(errors.back().line, 1);
}

TEST(DslParser, TabsAreReportedPerLine) {
  const std::vector<core::Diagnostic> errors = parseErrors(
      "allgather x\n"
      "for g in gpus:\n"
      "\tallgather rail(g) by ring\n"
      "\tallgather node(g) by ring\n");
  ASSERT_EQ(errors.size(), 2u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 3);
  EXPECT_EQ(errors[1].line, 4);
  EXPECT_EQ(errors[0].message, "use spaces for indentation, found a tab");
  // Tabs between tokens and on blank lines are only whitespace.
  parseOk("allgather x\n\t\n\nallgather\tall by  ring\t# ok\n");
}

TEST(DslParser, BadDedentIsOneError) {
  const std::vector<core::Diagnostic> errors = parseErrors(
      "allgather x\n"
      "  for g in gpus:\n"
      "    allgather rail(g) by ring\n"
      "   allgather node(0) by direct\n"
      "  allgather all by ring\n");
  ASSERT_EQ(errors.size(), 1u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 4);
  EXPECT_EQ(errors[0].column, 4);
  EXPECT_NE(errors[0].message.find("indentation does not match any outer block: 3 spaces here, open blocks at 0, 2, 4"),
            std::string::npos)
      << errors[0].message;
}

TEST(DslParser, FormatDiagnosticShowsTheLineAndACaret) {
  const std::string text = "allgather x\n# c\nallgather rail(g) by rign\n";
  const std::vector<core::Diagnostic> errors = parseErrors(text);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(formatDiagnostic(errors[0], text),
            errors[0].str() + "\n    allgather rail(g) by rign\n    " + std::string(21, ' ') + "^");
  EXPECT_EQ(errors[0].str().rfind("test.ofl:3:22: expected a strategy", 0), 0u);
  core::Diagnostic d{"f", 0, 0, "no place"};
  EXPECT_EQ(formatDiagnostic(d, text), "f: no place");
  d = core::Diagnostic{"f", 9, 1, "past the end"};
  EXPECT_EQ(formatDiagnostic(d, text), "f:9:1: past the end");
  // Control bytes are masked and tabs keep the caret aligned.
  d = core::Diagnostic{"f", 1, 4, "here"};
  EXPECT_EQ(formatDiagnostic(d, "a\tb\x01x\r\nsecond"), "f:1:4: here\n    a\tb?x\n     \t ^");
}

// ---------------------------------------------------------------------------------------------------------------
// Hostile input

TEST(DslParser, DeepParenthesesAreRefused) {
  const std::string deep = "allgather x\nlet y = " + std::string(1000, '(') + "1" + std::string(1000, ')') + "\n";
  const std::vector<core::Diagnostic> errors = parseErrors(deep);
  ASSERT_EQ(errors.size(), 1u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 2);
  EXPECT_EQ(errors[0].column, 9 + kMaxNesting);
  EXPECT_NE(errors[0].message.find("too deeply nested"), std::string::npos);
  // Exactly at the limit is fine, and survives a round trip.
  const std::string ok =
      "allgather x\nlet y = " + std::string(kMaxNesting, '(') + "1" + std::string(kMaxNesting, ')') + "\n";
  EXPECT_EQ(printProgram(parseOk(ok)), "allgather x\n  let y = 1\n");
  // Calls, unary operators and `not` count too.
  std::string calls = "allgather x\nlet y = ";
  for (int i = 0; i < 1000; ++i) calls += "f(";
  calls += "1" + std::string(1000, ')') + "\n";
  EXPECT_NE(parseErrors(calls)[0].message.find("too deeply nested"), std::string::npos);
  EXPECT_NE(parseErrors("allgather x\nlet y = " + std::string(100000, '-') + "1\n")[0].message.find("deeply"),
            std::string::npos);
  std::string nots = "allgather x\nlet y = ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(parseErrors(nots + "1\n")[0].message.find("deeply"), std::string::npos);
}

TEST(DslParser, DeepBlocksAreRefusedOnce) {
  std::string text = "allgather x\n";
  for (int i = 0; i < 300; ++i) text += std::string(2 * i, ' ') + "for v" + std::to_string(i) + " in 2:\n";
  text += std::string(600, ' ') + "split 1\n";
  const std::vector<core::Diagnostic> errors = parseErrors(text);
  ASSERT_EQ(errors.size(), 1u) << joinErrors(errors);
  EXPECT_EQ(errors[0].line, 2 + kMaxNesting);
  EXPECT_NE(errors[0].message.find("too deeply nested"), std::string::npos);
  // The same on one line.
  std::string chain = "allgather x\n";
  for (int i = 0; i < 300; ++i) chain += "for v in 2: ";
  chain += "split 1\n";
  const std::vector<core::Diagnostic> chainErrors = parseErrors(chain);
  ASSERT_EQ(chainErrors.size(), 1u) << joinErrors(chainErrors);
  EXPECT_EQ(chainErrors[0].line, 2);
  // Many levels of bad indentation under a failed line: no recursion past the limit either.
  std::string stairs = "allgather x\nbogus\n";
  for (int i = 1; i < 1000; ++i) stairs += std::string(static_cast<std::size_t>(i), ' ') + "split 1\n";
  const std::vector<core::Diagnostic> stairErrors = parseErrors(stairs);
  ASSERT_LT(stairs.size(), kMaxProgramBytes);
  ASSERT_EQ(stairErrors.size(), kMaxErrors + 1);
  EXPECT_EQ(stairErrors[0].line, 2);
  EXPECT_NE(stairErrors[1].message.find("unexpected indentation"), std::string::npos);
}

TEST(DslParser, LongOperatorChains) {
  std::string sum = "1";
  for (int i = 0; i < 1000; ++i) sum += " + 1";
  const Expr e = parseExpr(sum);
  EXPECT_EQ(printExpr(e), sum);
  for (int i = 0; i < 5000; ++i) sum += " + 1";
  const std::vector<core::Diagnostic> errors = parseErrors("allgather x\nlet y = " + sum + "\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("expression too long"), std::string::npos);
}

TEST(DslParser, HugeInputs) {
  const std::string tooBig(kMaxProgramBytes + 1, 'a');
  const std::vector<core::Diagnostic> errors = parseErrors(tooBig);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].line, 1);
  EXPECT_EQ(errors[0].column, 1);
  EXPECT_NE(errors[0].message.find("program too large"), std::string::npos);
  // A valid program just under the limit parses whole.
  std::string big = "allgather big\n";
  const std::string line = "allgather all by ring part 1\n";
  while (big.size() + line.size() <= kMaxProgramBytes) big += line;
  const Program p = parseOk(big);
  EXPECT_EQ(p.body.size(), (big.size() - 14) / line.size());
  // One enormous line of garbage, and megabytes of errors: bounded output.
  EXPECT_EQ(parseErrors("allgather x\nlet y = " + std::string(kMaxProgramBytes - 100, '(')).size(), 1u);
  std::string manyBad = "allgather x\n";
  while (manyBad.size() + 4 < kMaxProgramBytes) manyBad += "?!\n";
  EXPECT_EQ(parseErrors(manyBad).size(), kMaxErrors + 1);
}

void checkAnyInput(std::string_view text, int& okCount) {
  const ParseResult r = parseProgram(text, "fuzz");
  ASSERT_EQ(r.ok(), r.errors.empty());
  ASSERT_LE(r.errors.size(), kMaxErrors + 1);
  for (const core::Diagnostic& d : r.errors) {
    ASSERT_GE(d.line, 1) << d.str();
    ASSERT_GE(d.column, 1) << d.str();
    ASSERT_FALSE(d.message.empty());
    ASSERT_EQ(d.file, "fuzz");
    ASSERT_EQ(formatDiagnostic(d, text).rfind(d.str(), 0), 0u);
  }
  if (!r.ok()) return;
  ++okCount;
  const std::string printed = printProgram(*r.program);
  const ParseResult back = parseProgram(printed, "fuzz");
  ASSERT_TRUE(back.ok()) << printed << joinErrors(back.errors);
  ASSERT_EQ(withoutLocs(*back.program), withoutLocs(*r.program)) << text << "\n--\n" << printed;
  ASSERT_EQ(printProgram(*back.program), printed);
}

TEST(DslParser, RandomGarbageNeverCrashes) {
  std::mt19937 rng(20240611);
  const std::string_view pieces[] = {
      "allgather ", "reduce ", "broadcast ", "for ",  "in ",   "if ",    "else", ":",
      "\n",         "\n  ",    "\n    ",     "\t",    " ",     "(",      ")",    "{",
      "}",          ",",       "..",         "..",    "by ",   "ring",   "tree", "from ",
      "to ",        "via ",    "send ",      "block", "part ", "parts ", "let ", "= ",
      "==",         "<",       "not ",       "and ",  "or ",   "-",      "+",    "*",
      "%",          "/",       "x",          "g",     "0",     "7",      "all",  "node(",
      "rail(",      "#c\n",    "split ",     "ranks", "\r\n",  "\xff",   "\x01", "99999999999999999999"};
  int okCount = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    if (i % 3 == 0) text = "allgather r\n";
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      if (rng() % 8 == 0) {
        text += static_cast<char>(rng() % 256);
      } else {
        text += pieces[rng() % std::size(pieces)];
      }
    }
    SCOPED_TRACE(text);
    checkAnyInput(text, okCount);
    if (HasFatalFailure()) return;
  }
  // Mutations of valid programs: byte flips, deletions, duplications, swapped lines.
  for (int i = 0; i < 4000; ++i) {
    std::string text = kPrograms[rng() % std::size(kPrograms)];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits && !text.empty(); ++k) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 5) {
        case 0:
          text[at] = static_cast<char>(text[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        case 2:
          text.insert(at, text.substr(at, 1 + rng() % 16));
          break;
        case 3:
          text.insert(at, std::string(pieces[rng() % std::size(pieces)]));
          break;
        default:
          text.resize(at);
          break;
      }
    }
    SCOPED_TRACE(text);
    checkAnyInput(text, okCount);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(okCount, 100);  // the round-trip branch was exercised
}

}  // namespace
}  // namespace optiflow::dsl
