#include "optiflow/synth/builtin_proposer.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "optiflow/dsl/ast.h"
#include "optiflow/dsl/parser.h"
#include "optiflow/synth/gallery.h"

namespace optiflow::synth {

namespace {

using dsl::Program;
using dsl::Stmt;
using dsl::StmtKind;
using dsl::Strategy;

// docs/language.md, "Group operations": the strategies each operation supports.
std::vector<Strategy> strategiesFor(core::Collective op) {
  switch (op) {
    case core::Collective::AllGather:
      return {Strategy::Ring, Strategy::Direct, Strategy::RecursiveDoubling, Strategy::Bruck, Strategy::Pat};
    case core::Collective::ReduceScatter:
      return {Strategy::Ring, Strategy::Direct, Strategy::RecursiveHalving, Strategy::Pat};
    case core::Collective::AllReduce:
      return {Strategy::Ring, Strategy::Direct, Strategy::RecursiveDoubling, Strategy::RecursiveHalving,
              Strategy::Tree};
    case core::Collective::Broadcast:
    case core::Collective::Reduce:
      return {Strategy::Tree, Strategy::Chain, Strategy::Direct};
    case core::Collective::AllToAll:
      return {Strategy::Direct, Strategy::Ring};
    case core::Collective::Custom:
      break;
  }
  return {};
}

// Programs are compared without their names and source locations: renaming one is not a new candidate.
std::string canonical(Program p) {
  p.name.clear();
  dsl::clearSourceLocs(p);
  return dsl::printProgram(p);
}

// The group operations of a body in source order (pre-order through for/if blocks).
void collectGroupOps(std::vector<Stmt>& body, std::vector<Stmt*>& out) {
  for (Stmt& s : body) {
    if (s.kind == StmtKind::GroupOp) out.push_back(&s);
    collectGroupOps(s.body, out);
    collectGroupOps(s.elseBody, out);
  }
}

struct Mutant {
  Program program;
  std::string what;
};

dsl::Expr intExpr(std::int64_t v) {
  dsl::Expr e;
  e.kind = dsl::ExprKind::Int;
  e.value = v;
  return e;
}

// Parts per block beyond this make steps too small to be worth their synchronisation.
constexpr std::int64_t kMaxSplit = 64;

dsl::Expr binary(const char* op, dsl::Expr a, dsl::Expr b) {
  dsl::Expr e;
  e.kind = dsl::ExprKind::Binary;
  e.text = op;
  e.args.push_back(std::move(a));
  e.args.push_back(std::move(b));
  return e;
}

dsl::Expr times(dsl::Expr a, std::int64_t k) {
  if (a.kind == dsl::ExprKind::Int) return intExpr(a.value * k);
  return binary("*", intExpr(k), std::move(a));
}

bool exprUses(const dsl::Expr& e, std::string_view name) {
  if (e.kind == dsl::ExprKind::Name && e.text == name) return true;
  return std::any_of(e.args.begin(), e.args.end(), [&](const dsl::Expr& a) { return exprUses(a, name); });
}

bool rangeUses(const dsl::Range& r, std::string_view name) {
  return (r.hasBegin && exprUses(r.begin, name)) || exprUses(r.end, name);
}

bool usesName(const std::vector<Stmt>& body, std::string_view name) {
  for (const Stmt& s : body) {
    if (exprUses(s.value, name) || exprUses(s.anchor, name) || exprUses(s.target, name) || rangeUses(s.range, name) ||
        exprUses(s.parts.one, name) || rangeUses(s.parts.range, name)) {
      return true;
    }
    for (const dsl::Expr& e : s.blockArgs) {
      if (exprUses(e, name)) return true;
    }
    for (const dsl::Expr& e : s.vias) {
      if (exprUses(e, name)) return true;
    }
    for (const dsl::Expr& e : s.group.items) {
      if (exprUses(e, name)) return true;
    }
    if (s.group.kind == dsl::GroupKind::Comprehension && rangeUses(s.group.range, name)) return true;
    if (usesName(s.body, name) || usesName(s.elseBody, name)) return true;
  }
  return false;
}

bool selectsParts(const std::vector<Stmt>& body) {
  for (const Stmt& s : body) {
    if (s.parts.kind != dsl::PartSelector::Kind::All) return true;
    if (selectsParts(s.body) || selectsParts(s.elseBody)) return true;
  }
  return false;
}

// part x -> parts k*x..k*x+k; parts a..b -> parts k*a..k*b.
void refineParts(std::vector<Stmt>& body, std::int64_t k) {
  for (Stmt& s : body) {
    dsl::PartSelector& ps = s.parts;
    if (ps.kind == dsl::PartSelector::Kind::One) {
      ps.kind = dsl::PartSelector::Kind::Range;
      ps.range.hasBegin = true;
      ps.range.begin = times(ps.one, k);
      ps.range.end = binary("+", times(ps.one, k), intExpr(k));
      ps.one = dsl::Expr{};
    } else if (ps.kind == dsl::PartSelector::Kind::Range) {
      if (ps.range.hasBegin) ps.range.begin = times(std::move(ps.range.begin), k);
      ps.range.end = times(std::move(ps.range.end), k);
    }
    refineParts(s.body, k);
    refineParts(s.elseBody, k);
  }
}

// Every program one edit away from `p`: one group operation's strategy swapped, the parts refined or coarsened,
// two adjacent stages swapped. Most are plausible; the expander rejects the rest with a reason, which goes into the
// history.
std::vector<Mutant> neighbours(const Program& p) {
  std::vector<Mutant> out;
  {
    Program probe = p;
    std::vector<Stmt*> ops;
    collectGroupOps(probe.body, ops);
    for (std::size_t k = 0; k < ops.size(); ++k) {
      for (Strategy s : strategiesFor(ops[k]->op)) {
        if (s == ops[k]->strategy) continue;
        Program q = p;
        std::vector<Stmt*> qops;
        collectGroupOps(q.body, qops);
        const Strategy old = qops[k]->strategy;
        qops[k]->strategy = s;
        out.push_back({std::move(q), fmt::format("stage {}: {} -> {}", k + 1, dsl::toString(old), dsl::toString(s))});
      }
    }
  }
  // Refine: every part becomes k parts (split e -> split e*k, part x -> parts k*x..k*x+k), which means exactly the
  // same data movement in finer chunks, so that stages can pipeline. Programs that compute with `parts` keep theirs.
  if (!usesName(p.body, "parts")) {
    for (std::int64_t k : {2, 4}) {
      Program q = p;
      auto split = std::find_if(q.body.begin(), q.body.end(), [](const Stmt& s) { return s.kind == StmtKind::Split; });
      if (split == q.body.end()) {
        Stmt s;
        s.kind = StmtKind::Split;
        s.value = intExpr(k);
        q.body.insert(q.body.begin(), std::move(s));
      } else if (split->value.kind == dsl::ExprKind::Int) {
        if (split->value.value * k > kMaxSplit) continue;
        split->value = intExpr(split->value.value * k);
      } else {
        split->value = times(std::move(split->value), k);
      }
      refineParts(q.body, k);
      out.push_back({std::move(q), fmt::format("parts refined x{}", k)});
    }
  }
  // Coarsen a plain integer split that no statement selects from.
  auto split = std::find_if(p.body.begin(), p.body.end(), [](const Stmt& s) { return s.kind == StmtKind::Split; });
  if (split != p.body.end() && split->value.kind == dsl::ExprKind::Int && split->value.value > 1 &&
      !selectsParts(p.body)) {
    Program q = p;
    auto qs = q.body.begin() + (split - p.body.begin());
    const std::int64_t k = split->value.value / 2;
    if (k <= 1) {
      q.body.erase(qs);
    } else {
      qs->value = intExpr(k);
    }
    out.push_back({std::move(q), fmt::format("split {} -> {}", split->value.value, std::max<std::int64_t>(k, 1))});
  }
  for (std::size_t i = 0; i + 1 < p.body.size(); ++i) {
    auto stage = [](const Stmt& s) { return s.kind == StmtKind::For || s.kind == StmtKind::GroupOp; };
    if (!stage(p.body[i]) || !stage(p.body[i + 1])) continue;
    Program q = p;
    std::swap(q.body[i], q.body[i + 1]);
    out.push_back({std::move(q), fmt::format("stages {} and {} swapped", i + 1, i + 2)});
  }
  return out;
}

// "rail_striped_v12" -> "rail_striped": children are named after the gallery program they descend from.
std::string rootName(const std::string& name) {
  const auto pos = name.rfind("_v");
  if (pos == std::string::npos || pos + 2 >= name.size()) return name;
  if (!std::all_of(name.begin() + static_cast<std::ptrdiff_t>(pos) + 2, name.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return name;
  }
  return name.substr(0, pos);
}

}  // namespace

BuiltinProposer::BuiltinProposer(std::uint64_t seed) : rng_(seed) {}

std::vector<Candidate> BuiltinProposer::propose(const ProposalContext& ctx) {
  std::vector<Candidate> out;
  const auto want = static_cast<std::size_t>(std::max(ctx.maxCandidates, 0));
  for (const CandidateRecord& r : ctx.history) {
    if (r.text.empty()) continue;
    auto parsed = dsl::parseProgram(r.text, r.id);
    if (parsed.ok()) seen_.insert(canonical(*parsed.program));
  }
  auto offer = [&](Program p, std::string origin) {
    if (out.size() >= want) return;
    const std::string key = canonical(p);
    if (!seen_.insert(key).second) return;
    out.push_back({dsl::printProgram(p), std::move(origin)});
  };

  // The gallery first: the known algorithms for this collective, in file order.
  for (const EmbeddedProgram& g : galleryPrograms()) {
    auto parsed = dsl::parseProgram(g.text, g.file);
    if (!parsed.ok() || parsed.program->collective != ctx.collective) continue;
    offer(std::move(*parsed.program), fmt::format("gallery:{}", g.file));
  }

  // Parents: the candidates that are best at some size, those with the most room to the bound first; then, for
  // diversity, the runners-up (second and third at any size).
  std::map<int, double> room;  // history index -> the largest ratio to the bound among the sizes it leads
  for (std::size_t s = 0; s < ctx.bestPerSize.size(); ++s) {
    const int b = ctx.bestPerSize[s];
    if (b < 0) continue;
    const SizeResult& sr = ctx.history[static_cast<std::size_t>(b)].sizes.at(s);
    room[b] = std::max(room[b], sr.boundUs > 0 ? sr.timeUs / sr.boundUs : 1.0);
  }
  std::vector<int> parents;
  for (const auto& [idx, ratio] : room) parents.push_back(idx);
  std::stable_sort(parents.begin(), parents.end(), [&](int a, int b) { return room[a] > room[b]; });
  for (std::size_t s = 0; s < ctx.sizes.size(); ++s) {
    std::vector<int> ok;
    for (std::size_t i = 0; i < ctx.history.size(); ++i) {
      const CandidateRecord& r = ctx.history[i];
      if (r.stage == "ok" && s < r.sizes.size() && r.sizes[s].ok) ok.push_back(static_cast<int>(i));
    }
    std::stable_sort(ok.begin(), ok.end(), [&](int a, int b) {
      return ctx.history[static_cast<std::size_t>(a)].sizes[s].timeUs <
             ctx.history[static_cast<std::size_t>(b)].sizes[s].timeUs;
    });
    for (std::size_t k = 1; k < std::min(ok.size(), kRanked); ++k) {
      if (std::find(parents.begin(), parents.end(), ok[k]) == parents.end()) parents.push_back(ok[k]);
    }
  }

  // Each parent's neighbours in a seeded random order; parents take turns so that every leader gets children.
  std::vector<std::vector<Mutant>> pools;
  std::vector<const CandidateRecord*> owners;
  for (int idx : parents) {
    const CandidateRecord& r = ctx.history[static_cast<std::size_t>(idx)];
    auto parsed = dsl::parseProgram(r.text, r.id);
    if (!parsed.ok()) continue;
    std::vector<Mutant> n = neighbours(*parsed.program);
    std::shuffle(n.begin(), n.end(), rng_);
    pools.push_back(std::move(n));
    owners.push_back(&r);
  }
  std::vector<std::size_t> next(pools.size(), 0);
  for (bool progress = true; progress && out.size() < want;) {
    progress = false;
    for (std::size_t k = 0; k < pools.size() && out.size() < want; ++k) {
      // Take this parent's next unseen neighbour.
      while (next[k] < pools[k].size()) {
        Mutant& m = pools[k][next[k]++];
        const std::size_t before = out.size();
        m.program.name = fmt::format("{}_v{}", rootName(owners[k]->name), ++counter_);
        offer(std::move(m.program), fmt::format("mutate:{}:{}", owners[k]->id, m.what));
        if (out.size() > before) {
          progress = true;
          break;
        }
        --counter_;
      }
    }
  }
  return out;
}

}  // namespace optiflow::synth
