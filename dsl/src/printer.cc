// The canonical text of a program: what parseProgram reads back into the same tree (up to source locations).
#include <fmt/format.h>

#include <string>

#include "optiflow/dsl/parser.h"

namespace optiflow::dsl {

namespace {

// Binding strength, loosest first, as the parser reads them: or, and, not, comparisons, + -, * / %, unary -.
constexpr int kPrecOr = 1;
constexpr int kPrecAnd = 2;
constexpr int kPrecNot = 3;
constexpr int kPrecCompare = 4;
constexpr int kPrecAdd = 5;
constexpr int kPrecMul = 6;
constexpr int kPrecNeg = 7;
constexpr int kPrecPrimary = 8;

int precedence(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Int:
    case ExprKind::Name:
    case ExprKind::Call:
      return kPrecPrimary;
    case ExprKind::Unary:
      return e.text == "not" ? kPrecNot : kPrecNeg;
    case ExprKind::Binary:
      if (e.text == "or") return kPrecOr;
      if (e.text == "and") return kPrecAnd;
      if (e.text == "+" || e.text == "-") return kPrecAdd;
      if (e.text == "*" || e.text == "/" || e.text == "%") return kPrecMul;
      return kPrecCompare;
  }
  return kPrecPrimary;
}

// Writes e, in parentheses when it binds more loosely than its position requires.
void writeExpr(std::string& out, const Expr& e, int minPrec) {
  const int prec = precedence(e);
  const bool paren = prec < minPrec;
  if (paren) out += '(';
  switch (e.kind) {
    case ExprKind::Int:
      out += fmt::format("{}", e.value);
      break;
    case ExprKind::Name:
      out += e.text;
      break;
    case ExprKind::Call:
      out += e.text;
      out += '(';
      for (std::size_t i = 0; i < e.args.size(); ++i) {
        if (i > 0) out += ", ";
        writeExpr(out, e.args[i], 0);
      }
      out += ')';
      break;
    case ExprKind::Unary:
      out += e.text == "not" ? "not " : e.text;
      if (!e.args.empty()) writeExpr(out, e.args[0], prec);
      break;
    case ExprKind::Binary:
      if (e.args.size() != 2) break;
      // Left-associative: an equal operator on the left needs no parentheses, on the right it does. Comparisons
      // do not chain, so they need them on both sides.
      writeExpr(out, e.args[0], prec == kPrecCompare ? prec + 1 : prec);
      out += fmt::format(" {} ", e.text);
      writeExpr(out, e.args[1], prec + 1);
      break;
  }
  if (paren) out += ')';
}

std::string expr(const Expr& e) {
  std::string out;
  writeExpr(out, e, 0);
  return out;
}

std::string range(const Range& r) { return r.hasBegin ? expr(r.begin) + ".." + expr(r.end) : expr(r.end); }

std::string group(const Group& g) {
  switch (g.kind) {
    case GroupKind::All:
      return "all";
    case GroupKind::Node:
    case GroupKind::Rail: {
      const std::string arg = g.items.empty() ? std::string() : expr(g.items[0]);
      return fmt::format("{}({})", g.kind == GroupKind::Node ? "node" : "rail", arg);
    }
    case GroupKind::List: {
      std::string out = "{";
      for (std::size_t i = 0; i < g.items.size(); ++i) out += (i > 0 ? ", " : "") + expr(g.items[i]);
      return out + "}";
    }
    case GroupKind::Comprehension: {
      const std::string item = g.items.empty() ? std::string() : expr(g.items[0]);
      return fmt::format("{{{} for {} in {}}}", item, g.var, range(g.range));
    }
  }
  return "all";
}

std::string select(const PartSelector& s) {
  switch (s.kind) {
    case PartSelector::Kind::All:
      return "";
    case PartSelector::Kind::One:
      return " part " + expr(s.one);
    case PartSelector::Kind::Range:
      return " parts " + range(s.range);
  }
  return "";
}

void writeBlock(std::string& out, const std::vector<Stmt>& body, int indent);

void writeStmt(std::string& out, const Stmt& s, int indent) {
  out.append(static_cast<std::size_t>(indent), ' ');
  switch (s.kind) {
    case StmtKind::Let:
      out += fmt::format("let {} = {}\n", s.name, expr(s.value));
      break;
    case StmtKind::Split:
      out += fmt::format("split {}\n", expr(s.value));
      break;
    case StmtKind::For:
      out += fmt::format("for {} in {}:\n", s.name, range(s.range));
      writeBlock(out, s.body, indent + 2);
      break;
    case StmtKind::If:
      out += fmt::format("if {}:\n", expr(s.value));
      writeBlock(out, s.body, indent + 2);
      if (!s.elseBody.empty()) {
        out.append(static_cast<std::size_t>(indent), ' ');
        out += "else:\n";
        writeBlock(out, s.elseBody, indent + 2);
      }
      break;
    case StmtKind::GroupOp: {
      std::string anchor;
      if (s.hasAnchor) anchor = fmt::format(" {} {}", s.op == core::Collective::Reduce ? "to" : "from", expr(s.anchor));
      out += fmt::format("{} {}{} by {}{}\n", core::toString(s.op), group(s.group), anchor, toString(s.strategy),
                         select(s.parts));
      break;
    }
    case StmtKind::Send: {
      std::string args;
      for (std::size_t i = 0; i < s.blockArgs.size(); ++i) args += (i > 0 ? ", " : "") + expr(s.blockArgs[i]);
      std::string via;
      for (std::size_t i = 0; i < s.vias.size(); ++i) via += (i > 0 ? ", " : " via ") + expr(s.vias[i]);
      out +=
          fmt::format("send block({}){} from {} to {}{}\n", args, select(s.parts), expr(s.value), expr(s.target), via);
      break;
    }
  }
}

void writeBlock(std::string& out, const std::vector<Stmt>& body, int indent) {
  for (const Stmt& s : body) writeStmt(out, s, indent);
}

}  // namespace

std::string printExpr(const Expr& e) { return expr(e); }

std::string printProgram(const Program& p) {
  std::string out = fmt::format("{} {}\n", core::toString(p.collective), p.name);
  writeBlock(out, p.body, 2);
  return out;
}

}  // namespace optiflow::dsl
