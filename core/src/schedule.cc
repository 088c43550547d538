#include "optiflow/core/schedule.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace optiflow::core {

std::string_view toString(BufferKind b) {
  switch (b) {
    case BufferKind::Input:
      return "input";
    case BufferKind::Output:
      return "output";
    case BufferKind::Scratch:
      return "scratch";
  }
  return "?";
}

std::string_view toString(StepOp op) {
  switch (op) {
    case StepOp::Send:
      return "send";
    case StepOp::Recv:
      return "recv";
    case StepOp::RecvCopySend:
      return "recv_copy_send";
    case StepOp::RecvReduceSend:
      return "recv_reduce_send";
    case StepOp::RecvReduceCopy:
      return "recv_reduce_copy";
    case StepOp::RecvReduceCopySend:
      return "recv_reduce_copy_send";
    case StepOp::Copy:
      return "copy";
    case StepOp::Reduce:
      return "reduce";
    case StepOp::Nop:
      return "nop";
  }
  return "?";
}

bool opReceives(StepOp op) {
  return op == StepOp::Recv || op == StepOp::RecvCopySend || op == StepOp::RecvReduceSend ||
         op == StepOp::RecvReduceCopy || op == StepOp::RecvReduceCopySend;
}

bool opSends(StepOp op) {
  return op == StepOp::Send || op == StepOp::RecvCopySend || op == StepOp::RecvReduceSend ||
         op == StepOp::RecvReduceCopySend;
}

bool opReadsSrc(StepOp op) {
  return op == StepOp::Send || op == StepOp::RecvReduceSend || op == StepOp::RecvReduceCopy ||
         op == StepOp::RecvReduceCopySend || op == StepOp::Copy || op == StepOp::Reduce;
}

bool opWritesDst(StepOp op) {
  return op == StepOp::Recv || op == StepOp::RecvCopySend || op == StepOp::RecvReduceCopy ||
         op == StepOp::RecvReduceCopySend || op == StepOp::Copy || op == StepOp::Reduce;
}

bool opReduces(StepOp op) {
  return op == StepOp::RecvReduceSend || op == StepOp::RecvReduceCopy || op == StepOp::RecvReduceCopySend ||
         op == StepOp::Reduce;
}

int findThreadBlock(const RankProgram& rp, int tbId) {
  // Blocks are usually stored in id order; try the direct index first.
  if (tbId >= 0 && tbId < static_cast<int>(rp.threadBlocks.size()) && rp.threadBlocks[tbId].id == tbId) return tbId;
  for (std::size_t i = 0; i < rp.threadBlocks.size(); ++i) {
    if (rp.threadBlocks[i].id == tbId) return static_cast<int>(i);
  }
  return -1;
}

void recomputeHasDep(Schedule& s) {
  for (auto& rp : s.ranks) {
    for (auto& tb : rp.threadBlocks) {
      for (auto& st : tb.steps) st.hasDep = false;
    }
    for (const auto& tb : rp.threadBlocks) {
      for (const auto& st : tb.steps) {
        for (const auto& d : st.deps) {
          const int idx = findThreadBlock(rp, d.tb);
          if (idx < 0) continue;
          auto& target = rp.threadBlocks[idx];
          if (d.step >= 0 && d.step < static_cast<int>(target.steps.size())) target.steps[d.step].hasDep = true;
        }
      }
    }
  }
}

std::size_t totalSteps(const Schedule& s) {
  std::size_t n = 0;
  for (const auto& rp : s.ranks) {
    for (const auto& tb : rp.threadBlocks) n += tb.steps.size();
  }
  return n;
}

}  // namespace optiflow::core
