#include "optiflow/dsl/expand.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <exception>
#include <iterator>
#include <limits>

#include "expand_internal.h"

namespace optiflow::dsl {

namespace detail {

namespace {

constexpr std::array<std::string_view, 6> kBuiltins = {"nodes", "gpus", "ranks", "rails", "parts", "root"};

struct Function {
  std::string_view name;
  std::size_t arity;
  std::string_view usage;
};
constexpr std::array<Function, 7> kFunctions = {{{"rank", 2, "rank(n, g)"},
                                                 {"nodeof", 1, "nodeof(r)"},
                                                 {"localof", 1, "localof(r)"},
                                                 {"min", 2, "min(a, b)"},
                                                 {"max", 2, "max(a, b)"},
                                                 {"pow", 2, "pow(a, b)"},
                                                 {"log2", 1, "log2(a)"}}};

bool isBuiltin(std::string_view n) { return std::find(kBuiltins.begin(), kBuiltins.end(), n) != kBuiltins.end(); }

const Function* findFunction(std::string_view n) {
  for (const Function& f : kFunctions) {
    if (f.name == n) return &f;
  }
  return nullptr;
}

std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'nodes'?)" when a candidate is close enough to be the intended name.
std::string suggestion(std::string_view name, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  std::size_t bestDist = std::numeric_limits<std::size_t>::max();
  for (std::string_view c : candidates) {
    const std::size_t d = editDistance(name, c);
    if (d < bestDist) {
      bestDist = d;
      best = c;
    }
  }
  const std::size_t allowed = name.size() <= 3 ? 1 : 2;
  if (best.empty() || bestDist > allowed || bestDist >= name.size()) return {};
  return fmt::format(" (did you mean '{}'?)", best);
}

int precedence(const Expr& e) {
  if (e.kind == ExprKind::Unary) return e.text == "not" ? 3 : 7;
  if (e.kind != ExprKind::Binary) return 8;
  const std::string& op = e.text;
  if (op == "or") return 1;
  if (op == "and") return 2;
  if (op == "+" || op == "-") return 5;
  if (op == "*" || op == "/" || op == "%") return 6;
  return 4;  // comparisons
}

void printExprTo(const Expr& e, std::string& out, int depth) {
  if (depth > 40) {
    out += "...";
    return;
  }
  auto operand = [&](const Expr& a, bool paren) {
    if (paren) out += '(';
    printExprTo(a, out, depth + 1);
    if (paren) out += ')';
  };
  switch (e.kind) {
    case ExprKind::Int:
      out += fmt::format("{}", e.value);
      return;
    case ExprKind::Name:
      out += e.text;
      return;
    case ExprKind::Call:
      out += e.text;
      out += '(';
      for (std::size_t i = 0; i < e.args.size(); ++i) {
        if (i > 0) out += ", ";
        printExprTo(e.args[i], out, depth + 1);
      }
      out += ')';
      return;
    case ExprKind::Unary:
      out += e.text == "not" ? "not " : e.text;
      if (!e.args.empty()) operand(e.args[0], precedence(e.args[0]) < precedence(e));
      return;
    case ExprKind::Binary:
      if (e.args.size() != 2) break;
      operand(e.args[0], precedence(e.args[0]) < precedence(e));
      out += fmt::format(" {} ", e.text);
      operand(e.args[1], precedence(e.args[1]) <= precedence(e));
      return;
  }
  out += "?";
}

std::uint64_t locKey(SourceLoc loc) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(loc.line)) << 32) |
         static_cast<std::uint32_t>(loc.column);
}

std::int64_t floorDiv(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

std::int64_t floorMod(std::int64_t a, std::int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 is undefined in C++
  std::int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// "rank(n, g)" or "rank(n, g) = rank(4, 0)" when the arguments are not literals.
std::string callWithValues(const Expr& e, const std::vector<std::int64_t>& args) {
  std::string lit = e.text + "(";
  for (std::size_t i = 0; i < args.size(); ++i) lit += fmt::format("{}{}", i > 0 ? ", " : "", args[i]);
  lit += ")";
  const std::string src = quoteExpr(e);
  return src == lit ? src : fmt::format("{} = {}", src, lit);
}

}  // namespace

std::string quoteExpr(const Expr& e) {
  std::string out;
  printExprTo(e, out, 0);
  return out;
}

std::string quoteRange(const Range& r) {
  return r.hasBegin ? fmt::format("{}..{}", quoteExpr(r.begin), quoteExpr(r.end)) : quoteExpr(r.end);
}

std::string quoteGroup(const Group& g) {
  switch (g.kind) {
    case GroupKind::All:
      return "all";
    case GroupKind::Node:
    case GroupKind::Rail:
      return fmt::format("{}({})", g.kind == GroupKind::Node ? "node" : "rail",
                         g.items.empty() ? std::string("?") : quoteExpr(g.items[0]));
    case GroupKind::List: {
      std::string out = "{";
      for (std::size_t i = 0; i < g.items.size(); ++i) {
        if (i > 0) out += ", ";
        if (out.size() > 60) {
          out += "...";
          break;
        }
        out += quoteExpr(g.items[i]);
      }
      return out + "}";
    }
    case GroupKind::Comprehension:
      return fmt::format("{{{} for {} in {}}}", g.items.empty() ? std::string("?") : quoteExpr(g.items[0]), g.var,
                         quoteRange(g.range));
  }
  return "?";
}

std::string_view strategyName(Strategy s) { return toString(s); }

std::string_view collectiveName(core::Collective c) {
  switch (c) {
    case core::Collective::AllGather:
      return "allgather";
    case core::Collective::ReduceScatter:
      return "reducescatter";
    case core::Collective::AllReduce:
      return "allreduce";
    case core::Collective::Broadcast:
      return "broadcast";
    case core::Collective::Reduce:
      return "reduce";
    case core::Collective::AllToAll:
      return "alltoall";
    case core::Collective::Custom:
      break;
  }
  return "?";
}

Expander::Expander(const Program& program, const core::Topology& topology, std::string_view fileName,
                   const ExpandOptions& options)
    : program_(program), topo_(topology), file_(fileName), opt_(options) {}

void Expander::error(SourceLoc loc, std::string message) {
  if (stop_) return;
  // One error per statement: a bad statement in a loop must not repeat itself for every iteration.
  if (!reported_.insert(locKey(stmt_ != nullptr ? stmt_->loc : loc)).second) return;
  errors_.push_back(core::Diagnostic{file_, loc.line, loc.column, std::move(message)});
  if (errors_.size() >= std::max<std::size_t>(1, opt_.maxErrors)) stop_ = true;
}

bool Expander::setup() {
  const SourceLoc at = program_.loc;
  switch (program_.collective) {
    case core::Collective::AllGather:
    case core::Collective::ReduceScatter:
    case core::Collective::AllReduce:
    case core::Collective::Broadcast:
    case core::Collective::Reduce:
    case core::Collective::AllToAll:
      break;
    default:
      error(at, "the program's collective must be allgather, reducescatter, allreduce, broadcast, reduce or alltoall");
      return false;
  }
  const std::int64_t n = static_cast<std::int64_t>(topo_.nodes) * topo_.gpusPerNode;
  if (topo_.nodes < 1 || topo_.gpusPerNode < 1 || n > core::Topology::kMaxRanks) {
    error(at, fmt::format("topology '{}' has {} nodes of {} GPUs: expected 1..{} ranks in all", topo_.name, topo_.nodes,
                          topo_.gpusPerNode, core::Topology::kMaxRanks));
    return false;
  }
  nRanks_ = static_cast<int>(n);
  const bool rooted =
      program_.collective == core::Collective::Broadcast || program_.collective == core::Collective::Reduce;
  if (rooted) {
    if (opt_.root < 0 || opt_.root >= nRanks_) {
      error(at,
            fmt::format("root {} is out of range: the cluster has {} ranks (0..{})", opt_.root, nRanks_, nRanks_ - 1));
      return false;
    }
    root_ = opt_.root;
  }
  values_.emplace(nRanks_);
  pos_.assign(static_cast<std::size_t>(nRanks_), -1);
  byLocal_.assign(static_cast<std::size_t>(topo_.gpusPerNode), -1);
  byNode_.assign(static_cast<std::size_t>(topo_.nodes), -1);
  return true;
}

ExpandResult Expander::run() {
  ExpandResult result;
  if (setup()) {
    execBlock(program_.body);
    if (errors_.empty() && ensureState()) checkEnd();
  }
  if (errors_.empty()) {
    core::IntentProgram p;
    p.name = program_.name;
    p.collective = program_.collective;
    p.root = root_;
    p.nRanks = nRanks_;
    p.nBlocks = nBlocks_;
    p.parts = parts_;
    p.transfers = std::move(transfers_);
    if (std::string bad = core::validateIntent(p); !bad.empty()) {
      errors_.push_back(core::Diagnostic{file_, program_.loc.line, program_.loc.column,
                                         fmt::format("internal error: the expansion is not a valid intent: {}", bad)});
    } else {
      result.intent = std::move(p);
    }
  }
  result.errors = std::move(errors_);
  return result;
}

// ---- names and expressions ----

const Expander::Binding* Expander::lookup(std::string_view name) const {
  for (auto it = scope_.rbegin(); it != scope_.rend(); ++it) {
    if (it->name == name) return &*it;
  }
  return nullptr;
}

bool Expander::checkBindable(const std::string& name, SourceLoc loc) {
  if (name.empty()) {
    error(loc, "a name is missing here");
    return false;
  }
  if (isBuiltin(name)) {
    error(loc, fmt::format("'{}' is a built-in name and cannot be rebound; pick another name", name));
    return false;
  }
  if (findFunction(name) != nullptr) {
    error(loc, fmt::format("'{}' is a built-in function and cannot be rebound; pick another name", name));
    return false;
  }
  if (const Binding* b = lookup(name)) {
    error(loc,
          fmt::format("'{}' is already bound (line {}); names cannot be rebound, pick another name", name, b->line));
    return false;
  }
  return true;
}

std::optional<std::int64_t> Expander::eval(const Expr& e) {
  if (depth_ >= kMaxDepth) {
    error(e.loc, fmt::format("expression nested more than {} levels deep", kMaxDepth));
    return std::nullopt;
  }
  ++depth_;
  std::optional<std::int64_t> v = evalNode(e);
  --depth_;
  return v;
}

std::optional<std::int64_t> Expander::evalNode(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Int:
      return e.value;
    case ExprKind::Name:
      return evalName(e);
    case ExprKind::Call:
      return evalCall(e);
    case ExprKind::Unary: {
      if (e.args.size() != 1 || (e.text != "-" && e.text != "not")) break;
      const std::optional<std::int64_t> a = eval(e.args[0]);
      if (!a) return std::nullopt;
      if (e.text == "not") return *a == 0 ? 1 : 0;
      if (*a == std::numeric_limits<std::int64_t>::min()) {
        error(e.loc, fmt::format("'{}' overflows 64-bit integers", quoteExpr(e)));
        return std::nullopt;
      }
      return -*a;
    }
    case ExprKind::Binary:
      return evalBinary(e);
  }
  error(e.loc, fmt::format("malformed expression '{}'", quoteExpr(e)));
  return std::nullopt;
}

std::optional<std::int64_t> Expander::evalName(const Expr& e) {
  if (const Binding* b = lookup(e.text)) return b->value;  // nullopt: already reported where it was defined
  if (e.text == "nodes") return topo_.nodes;
  if (e.text == "gpus") return topo_.gpusPerNode;
  if (e.text == "ranks") return nRanks_;
  if (e.text == "rails") return static_cast<std::int64_t>(topo_.nics.size());
  if (e.text == "parts") return parts_;
  if (e.text == "root") return root_;
  if (const Function* f = findFunction(e.text)) {
    error(e.loc, fmt::format("'{}' is a function: call it as {}", e.text, f->usage));
    return std::nullopt;
  }
  std::vector<std::string_view> candidates(kBuiltins.begin(), kBuiltins.end());
  for (const Binding& b : scope_) candidates.push_back(b.name);
  error(e.loc, fmt::format("unknown name '{}'{}", e.text, suggestion(e.text, candidates)));
  return std::nullopt;
}

std::optional<std::int64_t> Expander::evalCall(const Expr& e) {
  const Function* f = findFunction(e.text);
  if (f == nullptr) {
    if (isBuiltin(e.text) || lookup(e.text) != nullptr) {
      error(e.loc, fmt::format("'{}' is a number, not a function", e.text));
    } else {
      std::vector<std::string_view> candidates;
      for (const Function& g : kFunctions) candidates.push_back(g.name);
      error(e.loc, fmt::format("unknown function '{}'{}; the functions are rank, nodeof, localof, min, max, pow and "
                               "log2",
                               e.text, suggestion(e.text, candidates)));
    }
    return std::nullopt;
  }
  if (e.args.size() != f->arity) {
    error(e.loc, fmt::format("{} takes {} argument{} ({}), got {}", f->name, f->arity, f->arity == 1 ? "" : "s",
                             f->usage, e.args.size()));
    return std::nullopt;
  }
  std::vector<std::int64_t> a;
  for (const Expr& arg : e.args) {
    const std::optional<std::int64_t> v = eval(arg);
    if (!v) return std::nullopt;
    a.push_back(*v);
  }
  const std::string_view name = f->name;
  if (name == "rank") {
    if (a[0] < 0 || a[0] >= topo_.nodes) {
      error(e.args[0].loc, fmt::format("{}: node {} is out of range: the cluster has {} nodes (0..{})",
                                       callWithValues(e, a), a[0], topo_.nodes, topo_.nodes - 1));
      return std::nullopt;
    }
    if (a[1] < 0 || a[1] >= topo_.gpusPerNode) {
      error(e.args[1].loc, fmt::format("{}: GPU {} is out of range: a node has {} GPUs (0..{})", callWithValues(e, a),
                                       a[1], topo_.gpusPerNode, topo_.gpusPerNode - 1));
      return std::nullopt;
    }
    return a[0] * topo_.gpusPerNode + a[1];
  }
  if (name == "nodeof" || name == "localof") {
    if (a[0] < 0 || a[0] >= nRanks_) {
      error(e.args[0].loc, fmt::format("{}: rank {} is out of range: the cluster has {} ranks (0..{})",
                                       callWithValues(e, a), a[0], nRanks_, nRanks_ - 1));
      return std::nullopt;
    }
    return name == "nodeof" ? a[0] / topo_.gpusPerNode : a[0] % topo_.gpusPerNode;
  }
  if (name == "min") return std::min(a[0], a[1]);
  if (name == "max") return std::max(a[0], a[1]);
  if (name == "pow") {
    if (a[1] < 0) {
      error(e.args[1].loc, fmt::format("{}: the exponent must not be negative", callWithValues(e, a)));
      return std::nullopt;
    }
    std::int64_t result = 1;
    std::int64_t base = a[0];
    for (std::int64_t exp = a[1]; exp > 0; exp >>= 1) {
      if ((exp & 1) != 0 && __builtin_mul_overflow(result, base, &result)) {
        error(e.loc, fmt::format("{} overflows 64-bit integers", callWithValues(e, a)));
        return std::nullopt;
      }
      if (exp > 1 && __builtin_mul_overflow(base, base, &base)) {
        error(e.loc, fmt::format("{} overflows 64-bit integers", callWithValues(e, a)));
        return std::nullopt;
      }
    }
    return result;
  }
  // log2
  if (a[0] < 1) {
    error(e.args[0].loc, fmt::format("{}: the argument must be at least 1", callWithValues(e, a)));
    return std::nullopt;
  }
  std::int64_t r = 0;
  for (std::int64_t v = a[0]; v > 1; v >>= 1) ++r;
  return r;
}

std::optional<std::int64_t> Expander::evalBinary(const Expr& e) {
  if (e.args.size() != 2) {
    error(e.loc, fmt::format("malformed expression '{}'", quoteExpr(e)));
    return std::nullopt;
  }
  const std::string& op = e.text;
  if (op == "and" || op == "or") {  // short-circuit, so `g > 0 and 8 / g > 1` is safe
    const std::optional<std::int64_t> a = eval(e.args[0]);
    if (!a) return std::nullopt;
    if (op == "and" && *a == 0) return 0;
    if (op == "or" && *a != 0) return 1;
    const std::optional<std::int64_t> b = eval(e.args[1]);
    if (!b) return std::nullopt;
    return *b != 0 ? 1 : 0;
  }
  const std::optional<std::int64_t> a = eval(e.args[0]);
  if (!a) return std::nullopt;
  const std::optional<std::int64_t> b = eval(e.args[1]);
  if (!b) return std::nullopt;
  std::int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(*a, *b, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(*a, *b, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(*a, *b, &r);
  } else if (op == "/" || op == "%") {
    if (*b == 0) {
      error(e.loc, fmt::format("division by zero in '{}': '{}' is 0", quoteExpr(e), quoteExpr(e.args[1])));
      return std::nullopt;
    }
    if (op == "/") {
      overflow = *a == std::numeric_limits<std::int64_t>::min() && *b == -1;
      if (!overflow) r = floorDiv(*a, *b);
    } else {
      r = floorMod(*a, *b);
    }
  } else if (op == "==") {
    r = *a == *b;
  } else if (op == "!=") {
    r = *a != *b;
  } else if (op == "<") {
    r = *a < *b;
  } else if (op == "<=") {
    r = *a <= *b;
  } else if (op == ">") {
    r = *a > *b;
  } else if (op == ">=") {
    r = *a >= *b;
  } else {
    error(e.loc, fmt::format("unknown operator '{}'", op));
    return std::nullopt;
  }
  if (overflow) {
    error(e.loc, fmt::format("'{}' overflows 64-bit integers ({} {} {})", quoteExpr(e), *a, op, *b));
    return std::nullopt;
  }
  return r;
}

bool Expander::evalRange(const Range& r, std::int64_t* lo, std::int64_t* hi) {
  *lo = 0;
  if (r.hasBegin) {
    const std::optional<std::int64_t> b = eval(r.begin);
    if (!b) return false;
    *lo = *b;
  }
  const std::optional<std::int64_t> e = eval(r.end);
  if (!e) return false;
  *hi = *e;
  return true;
}

std::optional<int> Expander::evalRank(const Expr& e, std::string_view what) {
  const std::optional<std::int64_t> v = eval(e);
  if (!v) return std::nullopt;
  if (*v < 0 || *v >= nRanks_) {
    const std::string src = quoteExpr(e);
    const std::string shown = src == fmt::format("{}", *v) ? src : fmt::format("{} = {}", src, *v);
    error(e.loc,
          fmt::format("{} {} is out of range: the cluster has {} ranks (0..{})", what, shown, nRanks_, nRanks_ - 1));
    return std::nullopt;
  }
  return static_cast<int>(*v);
}

bool Expander::chargeIterations(std::int64_t count, SourceLoc loc, std::string_view what) {
  const std::uint64_t c = count > 0 ? static_cast<std::uint64_t>(count) : 0;
  if (c > opt_.maxIterations || iterations_ + c > opt_.maxIterations) {
    error(loc, fmt::format("'{}' would run {} more iterations; the program may run at most {} loop iterations in "
                           "all",
                           what, c, opt_.maxIterations));
    stop_ = true;
    return false;
  }
  iterations_ += c;
  return true;
}

// ---- statements ----

void Expander::execBlock(const std::vector<Stmt>& body) {
  const std::size_t mark = scope_.size();  // `let` binds to the end of its block
  for (const Stmt& s : body) {
    if (stop_) break;
    exec(s);
  }
  scope_.resize(mark);
}

void Expander::exec(const Stmt& s) {
  if (depth_ >= kMaxDepth) {
    error(s.loc, fmt::format("statements nested more than {} levels deep", kMaxDepth));
    return;
  }
  ++depth_;
  const Stmt* outer = stmt_;
  stmt_ = &s;
  switch (s.kind) {
    case StmtKind::Let: {
      if (checkBindable(s.name, s.loc)) {
        const std::optional<std::int64_t> v = eval(s.value);
        scope_.push_back(Binding{s.name, v, s.loc.line});
      }
      break;
    }
    case StmtKind::Split:
      execSplit(s);
      break;
    case StmtKind::For:
      execFor(s);
      break;
    case StmtKind::If: {
      const std::optional<std::int64_t> c = eval(s.value);
      if (c) execBlock(*c != 0 ? s.body : s.elseBody);
      break;
    }
    case StmtKind::GroupOp:
      if (firstMoveLine_ == 0) firstMoveLine_ = s.loc.line;
      if (ensureState()) runGroupOp(s);
      break;
    case StmtKind::Send:
      if (firstMoveLine_ == 0) firstMoveLine_ = s.loc.line;
      if (ensureState()) runSend(s);
      break;
    default:
      error(s.loc, "malformed statement");
      break;
  }
  stmt_ = outer;
  --depth_;
}

void Expander::execSplit(const Stmt& s) {
  if (splitLine_ != 0) {
    error(s.loc, fmt::format("split may appear only once; the data was already split at line {}", splitLine_));
    return;
  }
  if (firstMoveLine_ != 0) {
    error(s.loc, fmt::format("split must come before any group operation or send; the first one is at line {}",
                             firstMoveLine_));
    return;
  }
  const std::optional<std::int64_t> v = eval(s.value);
  if (!v) return;
  if (*v < 1 || *v > kMaxParts) {
    error(s.value.loc,
          fmt::format("split {}: the number of parts must be in 1..{}, got {}", quoteExpr(s.value), kMaxParts, *v));
    return;
  }
  parts_ = static_cast<int>(*v);
  splitLine_ = s.loc.line;
}

void Expander::execFor(const Stmt& s) {
  if (!checkBindable(s.name, s.loc)) return;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  if (!evalRange(s.range, &lo, &hi)) return;
  std::int64_t count = 0;
  if (hi > lo && __builtin_sub_overflow(hi, lo, &count)) count = std::numeric_limits<std::int64_t>::max();
  if (!chargeIterations(count, s.loc, fmt::format("for {} in {}", s.name, quoteRange(s.range)))) return;
  for (std::int64_t i = 0; i < count && !stop_; ++i) {
    scope_.push_back(Binding{s.name, lo + i, s.loc.line});
    execBlock(s.body);
    scope_.pop_back();
  }
}

// ---- the data ----

std::string Expander::chunkName(int chunk) const {
  const std::string block = core::describeBlock(program_.collective, nRanks_, chunk / parts_);
  return parts_ == 1 ? block : fmt::format("part {} of {}", chunk % parts_, block);
}

bool Expander::ensureState() {
  if (stateReady_) return stateOk_;
  stateReady_ = true;
  const auto n = static_cast<std::int64_t>(nRanks_);
  const core::Collective c = program_.collective;
  std::int64_t blocks = n;
  if (c == core::Collective::Broadcast || c == core::Collective::Reduce) blocks = 1;
  if (c == core::Collective::AllToAll) blocks = n * n;
  const std::int64_t chunks = blocks * parts_;
  // What every rank holds at the start: one entry per (rank, chunk) pair that is not empty.
  std::int64_t initial = chunks;
  if (c == core::Collective::ReduceScatter || c == core::Collective::AllReduce || c == core::Collective::Reduce) {
    initial = chunks * n;
  }
  if (chunks > (std::int64_t{1} << 30) || static_cast<std::uint64_t>(initial) > opt_.maxTransfers) {
    const SourceLoc at = stmt_ != nullptr ? stmt_->loc : program_.loc;
    error(at, fmt::format("{} on {} ranks in {} part{} is too large to expand: {} chunks, {} initial values (at most "
                          "{})",
                          collectiveName(c), n, parts_, parts_ == 1 ? "" : "s", chunks, initial,
                          std::min<std::uint64_t>(opt_.maxTransfers, std::uint64_t{1} << 30)));
    stop_ = true;
    return false;
  }
  nBlocks_ = static_cast<int>(blocks);
  nChunks_ = static_cast<int>(chunks);
  state_.init(nRanks_, nChunks_);
  switch (c) {
    case core::Collective::AllGather:
      for (int b = 0; b < nRanks_; ++b) {
        for (int p = 0; p < parts_; ++p) state_.set(b, b * parts_ + p, values_->singleton(b));
      }
      break;
    case core::Collective::ReduceScatter:
    case core::Collective::AllReduce:
    case core::Collective::Reduce:
      for (int r = 0; r < nRanks_; ++r) {
        for (int ch = 0; ch < nChunks_; ++ch) state_.set(r, ch, values_->singleton(r));
      }
      break;
    case core::Collective::Broadcast:
      for (int p = 0; p < parts_; ++p) state_.set(root_, p, values_->singleton(root_));
      break;
    case core::Collective::AllToAll:
      for (int i = 0; i < nRanks_; ++i) {
        for (int j = 0; j < nRanks_; ++j) {
          for (int p = 0; p < parts_; ++p) state_.set(i, (i * nRanks_ + j) * parts_ + p, values_->singleton(i));
        }
      }
      break;
    default:
      break;
  }
  stateOk_ = true;
  return true;
}

void Expander::checkEnd() {
  const core::Collective c = program_.collective;
  const bool summed =
      c == core::Collective::ReduceScatter || c == core::Collective::AllReduce || c == core::Collective::Reduce;
  // True when rank r holds what it must of `chunk`; otherwise reports it and returns false.
  auto check = [&](int r, int chunk) {
    const std::uint32_t v = state_.get(r, chunk);
    if (summed ? v == values_->full() : v != ValueTable::kEmpty) return true;
    const std::string who = (c == core::Collective::Reduce || c == core::Collective::Broadcast) && r == root_
                                ? fmt::format("rank {} (the root)", r)
                                : fmt::format("rank {}", r);
    if (v == ValueTable::kEmpty) {
      error(program_.loc, fmt::format("at the end {} lacks {}: no statement delivers {}", who, chunkName(chunk),
                                      summed ? "its sum" : "it"));
      return false;
    }
    std::int64_t count = 0;
    const std::vector<int> miss = values_->missing(v, 4, &count);
    std::string list;
    for (std::size_t i = 0; i < miss.size(); ++i) {
      list += fmt::format("{}{}", i == 0 ? "" : (i + 1 == miss.size() && count == std::ssize(miss) ? " and " : ", "),
                          miss[i]);
    }
    if (count > std::ssize(miss)) list += fmt::format(" and {} more", count - std::ssize(miss));
    error(program_.loc,
          fmt::format("at the end {} holds an incomplete sum of {}: the contribution{} of rank{} {} {} missing", who,
                      chunkName(chunk), count == 1 ? "" : "s", count == 1 ? "" : "s", list, count == 1 ? "is" : "are"));
    return false;
  };
  switch (c) {
    case core::Collective::AllGather:
    case core::Collective::AllReduce:
      for (int r = 0; r < nRanks_; ++r) {
        for (int ch = 0; ch < nChunks_; ++ch) {
          if (!check(r, ch)) return;
        }
      }
      return;
    case core::Collective::ReduceScatter:
      for (int b = 0; b < nRanks_; ++b) {
        for (int p = 0; p < parts_; ++p) {
          if (!check(b, b * parts_ + p)) return;
        }
      }
      return;
    case core::Collective::Broadcast:
      for (int r = 0; r < nRanks_; ++r) {
        for (int p = 0; p < parts_; ++p) {
          if (!check(r, p)) return;
        }
      }
      return;
    case core::Collective::Reduce:
      for (int p = 0; p < parts_; ++p) {
        if (!check(root_, p)) return;
      }
      return;
    case core::Collective::AllToAll:
      for (int j = 0; j < nRanks_; ++j) {
        for (int i = 0; i < nRanks_; ++i) {
          for (int p = 0; p < parts_; ++p) {
            if (!check(j, (i * nRanks_ + j) * parts_ + p)) return;
          }
        }
      }
      return;
    default:
      return;
  }
}

}  // namespace detail

ExpandResult expand(const Program& program, const core::Topology& topology, std::string_view fileName,
                    const ExpandOptions& options) {
  try {
    detail::Expander e(program, topology, fileName, options);
    return e.run();
  } catch (const std::exception& ex) {  // out of memory on hostile input: a diagnostic, never an exception
    ExpandResult r;
    r.errors.push_back(core::Diagnostic{std::string(fileName), program.loc.line, program.loc.column,
                                        fmt::format("the program could not be expanded: {}", ex.what())});
    return r;
  }
}

}  // namespace optiflow::dsl
