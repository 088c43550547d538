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

// Every program one edit away from `p`: one group operation's strategy swapped, the split changed, two adjacent
// stages swapped. Most are plausible; the expander rejects the rest with a reason, which goes into the history.
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
  // Split: a program without part selectors means the same with more parts, and finer chunks let the stages
  // pipeline; one that selects parts by GPU index (split gpus) keeps its split.
  auto split = std::find_if(p.body.begin(), p.body.end(), [](const Stmt& s) { return s.kind == StmtKind::Split; });
  if (split == p.body.end()) {
    for (std::int64_t k : {2, 4}) {
      Program q = p;
      Stmt s;
      s.kind = StmtKind::Split;
      s.value = intExpr(k);
      q.body.insert(q.body.begin(), std::move(s));
      out.push_back({std::move(q), fmt::format("split {}", k)});
    }
  } else if (split->value.kind == dsl::ExprKind::Int) {
    const std::int64_t n = split->value.value;
    for (std::int64_t k : {n * 2, n / 2}) {
      if (k < 1 || k > 16 || k == n) continue;
      Program q = p;
      auto qs = q.body.begin() + (split - p.body.begin());
      if (k == 1) {
        q.body.erase(qs);
      } else {
        qs->value = intExpr(k);
      }
      out.push_back({std::move(q), fmt::format("split {} -> {}", n, k)});
    }
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
    for (std::size_t k = 1; k < std::min<std::size_t>(ok.size(), 3); ++k) {
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
