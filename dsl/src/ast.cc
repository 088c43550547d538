#include "optiflow/dsl/ast.h"

namespace optiflow::dsl {

namespace {

constexpr Strategy kStrategies[] = {Strategy::Ring,
                                    Strategy::Direct,
                                    Strategy::Tree,
                                    Strategy::Chain,
                                    Strategy::RecursiveDoubling,
                                    Strategy::RecursiveHalving,
                                    Strategy::Bruck,
                                    Strategy::Pat};

void clearLocs(Range& r) {
  r.loc = {};
  clearSourceLocs(r.begin);
  clearSourceLocs(r.end);
}

void clearLocs(Stmt& s) {
  s.loc = {};
  clearSourceLocs(s.value);
  clearLocs(s.range);
  for (Stmt& c : s.body) clearLocs(c);
  for (Stmt& c : s.elseBody) clearLocs(c);
  s.group.loc = {};
  for (Expr& e : s.group.items) clearSourceLocs(e);
  clearLocs(s.group.range);
  clearSourceLocs(s.anchor);
  s.parts.loc = {};
  clearSourceLocs(s.parts.one);
  clearLocs(s.parts.range);
  for (Expr& e : s.blockArgs) clearSourceLocs(e);
  clearSourceLocs(s.target);
  for (Expr& e : s.vias) clearSourceLocs(e);
}

}  // namespace

std::string_view toString(Strategy s) {
  switch (s) {
    case Strategy::Ring:
      return "ring";
    case Strategy::Direct:
      return "direct";
    case Strategy::Tree:
      return "tree";
    case Strategy::Chain:
      return "chain";
    case Strategy::RecursiveDoubling:
      return "recursive_doubling";
    case Strategy::RecursiveHalving:
      return "recursive_halving";
    case Strategy::Bruck:
      return "bruck";
    case Strategy::Pat:
      return "pat";
  }
  return "?";
}

std::optional<Strategy> parseStrategy(std::string_view s) {
  for (Strategy st : kStrategies) {
    if (toString(st) == s) return st;
  }
  return std::nullopt;
}

void clearSourceLocs(Expr& e) {
  e.loc = {};
  for (Expr& a : e.args) clearSourceLocs(a);
}

void clearSourceLocs(Program& p) {
  p.loc = {};
  for (Stmt& s : p.body) clearLocs(s);
}

}  // namespace optiflow::dsl
