#include "optiflow/core/collective.h"

#include <algorithm>

#include <fmt/format.h>

namespace optiflow::core {

namespace {

bool isAllToNext(const Schedule& s) {
  return s.collective == Collective::Custom && (s.customKind == "alltonext" || s.customKind == "pipeline-forward");
}

// Chunks each rank contributes (All-Gather) or receives (Reduce-Scatter); the block size of All-to-All.
int share(const Schedule& s) { return s.nRanks > 0 ? s.chunksPerLoop / s.nRanks : 0; }

}  // namespace

std::string_view toString(BufferMode m) { return m == BufferMode::InPlace ? "in-place" : "out-of-place"; }

std::vector<BufferMode> supportedModes(const Schedule& s) {
  std::vector<BufferMode> modes;
  if (s.inPlace) modes.push_back(BufferMode::InPlace);
  if (s.outOfPlace) modes.push_back(BufferMode::OutOfPlace);
  return modes;
}

std::string validateShape(const Schedule& s) {
  if (s.nRanks <= 0) return fmt::format("ngpus must be positive, got {}", s.nRanks);
  if (static_cast<int>(s.ranks.size()) != s.nRanks) {
    return fmt::format("schedule declares {} ranks but describes {}", s.nRanks, s.ranks.size());
  }
  for (int r = 0; r < s.nRanks; ++r) {
    if (s.ranks[r].rank != r) return fmt::format("rank program {} is numbered {}", r, s.ranks[r].rank);
  }
  if (s.chunksPerLoop <= 0) return fmt::format("nchunksperloop must be positive, got {}", s.chunksPerLoop);
  if (!s.inPlace && !s.outOfPlace) return "schedule supports neither in-place nor out-of-place buffers";
  switch (s.collective) {
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      if (s.chunksPerLoop % s.nRanks != 0) {
        return fmt::format("nchunksperloop {} is not a multiple of the {} ranks that {} needs", s.chunksPerLoop,
                           s.nRanks, toString(s.collective));
      }
      break;
    case Collective::Broadcast:
    case Collective::Reduce:
      if (s.root < 0 || s.root >= s.nRanks) return fmt::format("root {} is not a rank of {}", s.root, s.nRanks);
      break;
    case Collective::AllReduce:
      break;
    case Collective::Custom:
      if (!isAllToNext(s)) {
        return fmt::format("custom collective '{}' has no known postcondition (known: alltonext)", s.customKind);
      }
      break;
  }
  return {};
}

BufferSizes logicalSizes(const Schedule& s, int rank) {
  BufferSizes b;
  const int c = s.chunksPerLoop;
  b.scratch = (rank >= 0 && rank < static_cast<int>(s.ranks.size())) ? s.ranks[rank].scratchChunks : 0;
  switch (s.collective) {
    case Collective::AllGather:
      b.input = share(s);
      b.output = c;
      break;
    case Collective::ReduceScatter:
      b.input = c;
      b.output = share(s);
      break;
    case Collective::AllReduce:
    case Collective::AllToAll:
    case Collective::Broadcast:
    case Collective::Reduce:
      b.input = c;
      b.output = c;
      break;
    case Collective::Custom:
      b.input = rank < s.nRanks - 1 ? c : 0;
      b.output = rank > 0 ? c : 0;
      break;
  }
  return b;
}

Slot resolveSlot(const Schedule& s, int rank, BufferMode mode, BufferKind buf, int index) {
  if (mode == BufferMode::OutOfPlace || s.collective == Collective::Custom) return {buf, index};
  switch (s.collective) {
    case Collective::AllGather:
      if (buf == BufferKind::Input) return {BufferKind::Output, rank * share(s) + index};
      return {buf, index};
    case Collective::ReduceScatter:
      if (buf == BufferKind::Output) return {BufferKind::Input, rank * share(s) + index};
      return {buf, index};
    default:
      if (buf == BufferKind::Output) return {BufferKind::Input, index};
      return {buf, index};
  }
}

BufferSizes physicalSizes(const Schedule& s, int rank, BufferMode mode) {
  BufferSizes b = logicalSizes(s, rank);
  if (mode == BufferMode::OutOfPlace || s.collective == Collective::Custom) return b;
  if (s.collective == Collective::AllGather) {
    b.input = 0;
  } else {
    b.output = 0;
  }
  return b;
}

Expected expectedOutput(const Schedule& s, int rank, int outputIndex) {
  Expected e;
  const int n = s.nRanks;
  const int k = share(s);
  switch (s.collective) {
    case Collective::AllGather:
      e.constrained = true;
      e.terms.push_back({outputIndex / k, outputIndex % k});
      break;
    case Collective::ReduceScatter:
      e.constrained = true;
      for (int src = 0; src < n; ++src) e.terms.push_back({src, rank * k + outputIndex});
      break;
    case Collective::AllReduce:
      e.constrained = true;
      for (int src = 0; src < n; ++src) e.terms.push_back({src, outputIndex});
      break;
    case Collective::AllToAll:
      e.constrained = true;
      e.terms.push_back({outputIndex / k, rank * k + outputIndex % k});
      break;
    case Collective::Broadcast:
      e.constrained = true;
      e.terms.push_back({s.root, outputIndex});
      break;
    case Collective::Reduce:
      if (rank == s.root) {
        e.constrained = true;
        for (int src = 0; src < n; ++src) e.terms.push_back({src, outputIndex});
      }
      break;
    case Collective::Custom:
      if (isAllToNext(s) && rank > 0) {
        e.constrained = true;
        e.terms.push_back({rank - 1, outputIndex});
      }
      break;
  }
  std::sort(e.terms.begin(), e.terms.end());
  return e;
}

bool inputDefined(const Schedule& s, int rank, int index) {
  const BufferSizes b = logicalSizes(s, rank);
  if (index < 0 || index >= b.input) return false;
  if (s.collective == Collective::Broadcast) return rank == s.root;
  return true;
}

std::vector<std::string> knownCustomKinds() { return {"alltonext"}; }

double busBandwidthFactor(Collective c, int nRanks) {
  const double n = nRanks;
  switch (c) {
    case Collective::AllReduce:
      return nRanks > 0 ? 2.0 * (n - 1) / n : 0.0;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      return nRanks > 0 ? (n - 1) / n : 0.0;
    case Collective::Broadcast:
    case Collective::Reduce:
    case Collective::Custom:
      return 1.0;
  }
  return 1.0;
}

}  // namespace optiflow::core
