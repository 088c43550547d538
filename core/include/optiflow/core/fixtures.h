// Hand-written ring schedules for any rank count: the known-good inputs of the verifier, the reference executor
// and (later) the simulator tests. `channels` parallel rings each carry one piece of every rank's block.
#pragma once

#include "optiflow/core/schedule.h"

namespace optiflow::core::fixtures {

struct RingOptions {
  int nRanks = 8;
  int channels = 1;
  bool inPlace = false;  // build the in-place variant (and claim only that mode)
  Protocol protocol = Protocol::Simple;
};

Schedule ringAllGather(const RingOptions& o);
Schedule ringReduceScatter(const RingOptions& o);
Schedule ringAllReduce(const RingOptions& o);

}  // namespace optiflow::core::fixtures
