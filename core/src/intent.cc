#include "optiflow/core/intent.h"

#include <fmt/format.h>

namespace optiflow::core {

int intentBlocks(Collective c, int nRanks) {
  switch (c) {
    case Collective::Broadcast:
    case Collective::Reduce:
      return 1;
    case Collective::AllToAll:
      return nRanks * nRanks;
    default:
      return nRanks;
  }
}

int intentOwner(Collective c, int nRanks, int root, int block) {
  switch (c) {
    case Collective::ReduceScatter:
      return block;
    case Collective::Reduce:
      return root;
    case Collective::AllToAll:
      return nRanks > 0 ? block % nRanks : -1;
    default:
      return -1;
  }
}

std::string describeBlock(Collective c, int nRanks, int block) {
  switch (c) {
    case Collective::AllGather:
      return fmt::format("block {} (rank {}'s data)", block, block);
    case Collective::ReduceScatter:
    case Collective::AllReduce:
      return fmt::format("block {}", block);
    case Collective::Broadcast:
    case Collective::Reduce:
      return "the data";
    case Collective::AllToAll:
      return nRanks > 0 ? fmt::format("block {} (rank {} -> rank {})", block, block / nRanks, block % nRanks)
                        : fmt::format("block {}", block);
    case Collective::Custom:
      break;
  }
  return fmt::format("block {}", block);
}

std::string validateIntent(const IntentProgram& p) {
  if (p.collective == Collective::Custom) return "custom collectives have no intent form";
  if (p.nRanks <= 0) return fmt::format("rank count must be positive, got {}", p.nRanks);
  if (p.nBlocks != intentBlocks(p.collective, p.nRanks)) {
    return fmt::format("{} on {} ranks has {} blocks, not {}", toString(p.collective), p.nRanks,
                       intentBlocks(p.collective, p.nRanks), p.nBlocks);
  }
  if (p.parts <= 0) return fmt::format("parts must be positive, got {}", p.parts);
  if (static_cast<long long>(p.nBlocks) * p.parts > (1 << 30)) return "too many chunks";
  if ((p.collective == Collective::Broadcast || p.collective == Collective::Reduce) &&
      (p.root < 0 || p.root >= p.nRanks)) {
    return fmt::format("root {} is not a rank of {}", p.root, p.nRanks);
  }
  int round = 0;
  for (std::size_t i = 0; i < p.transfers.size(); ++i) {
    const Transfer& t = p.transfers[i];
    auto bad = [&](std::string_view what) { return fmt::format("transfer {}: {}", i, what); };
    if (t.chunk < 0 || t.chunk >= p.nChunks()) return bad(fmt::format("chunk {} out of range", t.chunk));
    if (t.src < 0 || t.src >= p.nRanks || t.dst < 0 || t.dst >= p.nRanks) return bad("rank out of range");
    if (t.src == t.dst) return bad("source and destination are the same rank");
    if (t.via != -1 && (t.via < 0 || t.via >= p.nRanks || t.via == t.src || t.via == t.dst)) {
      return bad("relay must be a third rank");
    }
    if (t.round < round) return bad("rounds must not decrease along the list");
    round = t.round;
  }
  return {};
}

}  // namespace optiflow::core
