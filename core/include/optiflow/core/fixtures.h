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

// Building blocks for hand-written schedules (fixtures and tests).
Step makeStep(StepOp op, BufferKind srcBuf, int srcOff, BufferKind dstBuf, int dstOff, int count = 1);
ThreadBlock makeBlock(int id, int sendPeer, int recvPeer, int channel = 0, std::vector<Step> steps = {});
// A schedule with n empty rank programs claiming exactly one buffer mode.
Schedule emptySchedule(Collective c, int nRanks, int chunksPerLoop, bool inPlace);

Schedule ringAllGather(const RingOptions& o);
Schedule ringReduceScatter(const RingOptions& o);
Schedule ringAllReduce(const RingOptions& o);

}  // namespace optiflow::core::fixtures
