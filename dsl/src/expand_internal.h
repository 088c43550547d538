// The expander's internals, shared by expand.cc (evaluation, statements, the final check) and expand_ops.cc (group
// operations, strategies, sends and the round engine).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "expand_state.h"
#include "optiflow/dsl/expand.h"

namespace optiflow::dsl::detail {

// Nested expressions and statements together; the parser stops at 64, hand-built trees may go deeper.
inline constexpr int kMaxDepth = 200;
inline constexpr int kMaxParts = 64;

// How a round's transfers land: Copy (allgather, broadcast, alltoall: skip what the receiver already has, refuse
// to overwrite a different value), Reduce (add into the receiver, the sender keeps its value) or ReduceDrop (add,
// and the sender's value is gone: it now lives in the receiver's sum).
enum class Move : std::uint8_t { Copy, Reduce, ReduceDrop };

struct Pending {
  int chunk = 0;
  int src = 0;
  int dst = 0;
  std::uint32_t value = 0;  // the sender's value at the start of the round
};

// A group operation with its operands evaluated.
struct GroupOp {
  const Stmt* stmt = nullptr;
  std::string label;  // "allgather node(0) by ring", leads every message about the operation
  std::string group;  // "node(0)"
  std::vector<int> members;
  int m = 0;
  int partLo = 0;
  int partHi = 1;
  int anchorPos = -1;  // broadcast/reduce: the anchor's position in members
};

// One member's value of one chunk, gathered before an operation plans its rounds.
struct Holder {
  int chunk = 0;
  int pos = 0;
  std::uint32_t value = 0;
};

// A value's path along the group order: from position `start`, `hops` steps forward.
struct Segment {
  int chunk = 0;
  int start = 0;
  int hops = 0;
};

std::string quoteExpr(const Expr& e);
std::string quoteRange(const Range& r);
std::string quoteGroup(const Group& g);
std::string_view strategyName(Strategy s);
std::string_view collectiveName(core::Collective c);

class Expander {
 public:
  Expander(const Program& program, const core::Topology& topology, std::string_view fileName,
           const ExpandOptions& options);
  ExpandResult run();

 private:
  struct Binding {
    std::string name;
    std::optional<std::int64_t> value;  // nullopt: its definition failed (uses fail silently, no second error)
    int line = 0;
  };

  // ---- expand.cc ----
  void error(SourceLoc loc, std::string message);
  bool setup();
  const Binding* lookup(std::string_view name) const;
  bool checkBindable(const std::string& name, SourceLoc loc);
  std::optional<std::int64_t> eval(const Expr& e);
  std::optional<std::int64_t> evalNode(const Expr& e);
  std::optional<std::int64_t> evalName(const Expr& e);
  std::optional<std::int64_t> evalCall(const Expr& e);
  std::optional<std::int64_t> evalBinary(const Expr& e);
  bool evalRange(const Range& r, std::int64_t* lo, std::int64_t* hi);
  std::optional<int> evalRank(const Expr& e, std::string_view what);
  bool chargeIterations(std::int64_t count, SourceLoc loc, std::string_view what);
  void execBlock(const std::vector<Stmt>& body);
  void exec(const Stmt& s);
  void execFor(const Stmt& s);
  void execSplit(const Stmt& s);
  bool ensureState();
  void checkEnd();
  std::string chunkName(int chunk) const;

  // ---- expand_ops.cc ----
  void runGroupOp(const Stmt& s);
  void runSend(const Stmt& s);
  bool evalGroup(const Group& g, GroupOp* op);
  bool addMember(const Expr& at, std::int64_t rank, GroupOp* op, const std::string& iteration);
  bool evalParts(const PartSelector& sel, int* lo, int* hi);
  bool selected(const GroupOp& g, int chunk) const {
    if (parts_ == 1) return true;
    const int p = chunk % parts_;
    return p >= g.partLo && p < g.partHi;
  }
  void collectHolders(GroupOp& g);
  bool checkSameValues(const GroupOp& g);
  bool checkDisjoint(const GroupOp& g);
  void prepareTargets(const GroupOp& g);
  int targetPos(int chunk) const;
  std::vector<Segment>& holderSegments(const GroupOp& g);
  bool emitRound(const GroupOp& g, Move mode, std::int64_t* landed = nullptr);
  bool land(const Stmt& s, std::string_view label, const Pending& p, Move mode, int via, bool* wrote);
  bool emit(const Stmt& s, std::string_view label, int chunk, int src, int dst, core::TransferKind kind, int via);
  void newRound() { needRound_ = true; }

  bool allgather(GroupOp& g, Strategy st);
  bool agSegments(GroupOp& g, bool ring);
  bool agLogSteps(GroupOp& g, Strategy st);
  bool reducescatter(GroupOp& g, Strategy st);
  bool allreduce(GroupOp& g, Strategy st);
  bool broadcast(GroupOp& g, Strategy st);
  bool reduce(GroupOp& g, Strategy st);
  bool alltoall(GroupOp& g, Strategy st);
  bool reduceTree(GroupOp& g);
  bool broadcastTree(GroupOp& g, const std::vector<int>& chunks);

  // ---- inputs ----
  const Program& program_;
  const core::Topology& topo_;
  std::string file_;
  ExpandOptions opt_;

  // ---- evaluation ----
  int nRanks_ = 0;
  int root_ = 0;
  int parts_ = 1;
  int splitLine_ = 0;  // where `split` ran, 0 = not yet
  int firstMoveLine_ = 0;
  std::vector<Binding> scope_;
  const Stmt* stmt_ = nullptr;  // innermost statement being run (errors are keyed by it)
  int depth_ = 0;
  std::uint64_t iterations_ = 0;

  // ---- errors ----
  std::vector<core::Diagnostic> errors_;
  std::unordered_set<std::uint64_t> reported_;  // statement locations that already have an error
  bool stop_ = false;

  // ---- data ----
  std::optional<ValueTable> values_;
  StateStore state_;
  bool stateReady_ = false;
  bool stateOk_ = false;
  int nBlocks_ = 0;
  int nChunks_ = 0;
  std::vector<int> pos_;      // per rank: position in the current group, -1 outside it
  std::vector<int> byLocal_;  // per local GPU index: first member of the current group with it, -1 none
  std::vector<int> byNode_;   // per node: first member of the current group on it, -1 none

  // ---- output ----
  std::vector<core::Transfer> transfers_;
  int nextRound_ = 0;
  int curRound_ = 0;
  bool needRound_ = true;
  bool inSendRound_ = false;                   // the last thing that ran was a send: later sends may join it
  std::unordered_set<std::uint64_t> written_;  // (rank, chunk) pairs the current send round wrote

  // ---- scratch reused across operations ----
  std::vector<Holder> holders_;
  std::vector<Holder> sorted_;
  std::vector<std::size_t> chunkStart_;
  std::vector<Segment> segments_;
  std::vector<Pending> pending_;
};

}  // namespace optiflow::dsl::detail
