// Hand-written ring schedules for any rank count: the known-good inputs of the verifier, the reference executor
// and (later) the simulator tests. `channels` parallel rings each carry one piece of every rank's block.
#pragma once

#include <vector>

#include "optiflow/core/schedule.h"

namespace optiflow::core::fixtures {

struct RingOptions {
  int nRanks = 8;
  int channels = 1;
  bool inPlace = false;  // build the in-place variant (and claim only that mode)
  Protocol protocol = Protocol::Simple;
};

// The order in which each channel's ring visits the ranks (channel c uses orders[c % orders.size()]), each a
// permutation of 0..nRanks-1; empty means rank order on every channel.
using RingOrders = std::vector<std::vector<int>>;

// Building blocks for hand-written schedules (fixtures and tests).
Step makeStep(StepOp op, BufferKind srcBuf, int srcOff, BufferKind dstBuf, int dstOff, int count = 1);
ThreadBlock makeBlock(int id, int sendPeer, int recvPeer, int channel = 0, std::vector<Step> steps = {});
// A schedule with n empty rank programs claiming exactly one buffer mode.
Schedule emptySchedule(Collective c, int nRanks, int chunksPerLoop, bool inPlace);

Schedule ringAllGather(const RingOptions& o, const RingOrders& orders = {});
Schedule ringReduceScatter(const RingOptions& o, const RingOrders& orders = {});
Schedule ringAllReduce(const RingOptions& o, const RingOrders& orders = {});

}  // namespace optiflow::core::fixtures
