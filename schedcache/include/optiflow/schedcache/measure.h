// Measured collectives as a process reads them out of the segment's MeasureRegion (layout.h): the profiler plugin
// writes them, `optiflow cache measurements` and optiflowd read them. The quantiles come from the fixed-size sketch.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::schedcache {

struct Measurement {
  std::uint64_t commId = 0;
  core::Collective coll = core::Collective::AllReduce;
  std::uint64_t sizeBytes = 0;
  std::optional<core::Algorithm> algorithm;  // nullopt: NCCL named an algorithm this build does not know
  std::optional<core::Protocol> protocol;
  std::uint32_t channels = 0;
  std::uint64_t calls = 0;
  double minUs = 0;
  double meanUs = 0;
  double medianUs = 0;  // from the sketch: within 3.1% of a recorded time
  double p90Us = 0;
  std::int64_t lastNs = 0;  // GPU globaltimer of the last call's stop
};

// NCCL's own (algorithm, protocol) for calls of one communicator, collective and size: the argmin of NCCL's cost
// table before the tuner changed it, as of the last call (ChoiceRecord).
struct NcclChoice {
  std::uint64_t commId = 0;
  core::Collective coll = core::Collective::AllReduce;
  std::uint64_t sizeBytes = 0;
  std::optional<core::Algorithm> algorithm;  // nullopt: an index this build does not know
  std::optional<core::Protocol> protocol;
  std::uint64_t calls = 0;
};

// The midpoint, in ns, of the times bucket b of the sketch holds.
double sketchMidpointNs(std::uint32_t bucket);
// The q-quantile (0 < q <= 1) of the times counted in sketch[kSketchBuckets], in ns: the midpoint of the bucket that
// holds the ceil(q * total)-th smallest time; 0 for an empty sketch.
double sketchQuantileNs(const std::uint32_t* sketch, double q);

// A record copied with relaxed loads into its process-side form (quantiles computed); nullopt for a free record, one
// not yet ready, one without calls or one whose collective is out of range.
std::optional<Measurement> toMeasurement(const MeasureRecord& copy);

}  // namespace optiflow::schedcache
