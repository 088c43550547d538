// The intent IR: what a program in the OptiFlow language means once its loops, groups and strategies are expanded,
// and what the compiler turns into a schedule. It says which chunk moves from which rank to which, in rounds; it
// says nothing about links, channels, thread blocks or timing (the compiler decides those).
//
// Chunks. The collective's data is cut into blocks, every block into `parts` equal parts; chunk id =
// block * parts + part. The blocks of each collective (N = nRanks):
//   AllGather      N blocks; block b is rank b's input. At the end every rank holds every block.
//   ReduceScatter  N blocks; every rank holds its own contribution to every block; at the end rank b holds the sum
//                  of all contributions to block b.
//   AllReduce      N blocks (same cut as Reduce-Scatter); at the end every rank holds every block's sum.
//   Broadcast      1 block, held by the root; at the end every rank holds it.
//   Reduce         1 block, every rank contributes; at the end the root holds the sum.
//   AllToAll       N*N blocks; block i*N + j is what rank i sends to rank j; at the end rank j holds it.
//
// Values. What a rank holds of a chunk is a set of contributing ranks (one rank for the copy collectives). A Copy
// transfer makes the destination's value the source's; a Reduce transfer combines the source's value into the
// destination's (the two sets are disjoint: the language's checker guarantees it).
//
// Rounds. Transfers come in rounds (Transfer::round, non-decreasing along `transfers`). Within a round every
// transfer reads its source's value as it was at the start of the round, then all of the round's transfers are
// applied in list order. That makes exchanges (two ranks sending each other their partial sums, as recursive
// doubling does) expressible without temporaries; the compiler orders a round's reads before its writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optiflow/core/schedule.h"

namespace optiflow::core {

enum class TransferKind : std::uint8_t { Copy, Reduce };

struct Transfer {
  int chunk = 0;  // block * parts + part
  int src = 0;    // rank whose value is sent
  int dst = 0;    // rank that receives it
  TransferKind kind = TransferKind::Copy;
  int via = -1;   // relay rank (the data passes through its memory and links), -1 = direct
  int round = 0;  // see "Rounds" above
  int line = 0;   // source line of the statement that produced it (0 = none), for messages
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

struct IntentProgram {
  std::string name;
  Collective collective = Collective::AllGather;
  int root = 0;  // Broadcast and Reduce
  int nRanks = 0;
  int nBlocks = 0;  // see the table above: N, 1 or N*N
  int parts = 1;
  std::vector<Transfer> transfers;

  int nChunks() const { return nBlocks * parts; }
  int rounds() const { return transfers.empty() ? 0 : transfers.back().round + 1; }
};

// Number of blocks a collective is cut into for n ranks (the table above).
int intentBlocks(Collective c, int nRanks);

// The rank that must end with block `block` (AllGather/AllReduce/Broadcast: -1 = every rank; ReduceScatter: the
// block's index; Reduce: the root; AllToAll: block % N).
int intentOwner(Collective c, int nRanks, int root, int block);

// "block 5 (rank 5's data)", "block 9 (rank 1 -> rank 2)", ... for messages.
std::string describeBlock(Collective c, int nRanks, int block);

// Empty when well formed: positive sizes, ranks and relays in range, src != dst, via distinct from both, chunks
// in range, rounds non-decreasing, supported collective (not Custom).
std::string validateIntent(const IntentProgram& p);

}  // namespace optiflow::core
