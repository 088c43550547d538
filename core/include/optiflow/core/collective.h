// What a collective means, in chunks: the precondition (what each rank's input holds), the postcondition (what
// each output chunk must hold), and how buffers alias in in-place mode. The verifier proves schedules against
// this and the reference executor checks real bytes against it, so both agree by construction.
#pragma once

#include <string>
#include <vector>

#include "optiflow/core/schedule.h"

namespace optiflow::core {

enum class BufferMode : std::uint8_t { InPlace, OutOfPlace };

std::string_view toString(BufferMode m);

// Modes the schedule claims to support (Schedule::inPlace / outOfPlace), in-place first.
std::vector<BufferMode> supportedModes(const Schedule& s);

// Chunk `index` of rank `rank`'s input buffer, as it was before the collective started.
struct Contribution {
  int rank = 0;
  int index = 0;
  friend auto operator<=>(const Contribution&, const Contribution&) = default;
};

// A location in a rank's memory after aliasing is resolved.
struct Slot {
  BufferKind buf = BufferKind::Input;
  int index = 0;
  friend auto operator<=>(const Slot&, const Slot&) = default;
};

// Chunk counts of the logical buffers a collective defines for a rank, derived from nRanks and chunksPerLoop
// (MSCCL files may declare 0 for a buffer that aliases another). Scratch is as declared.
struct BufferSizes {
  int input = 0;
  int output = 0;
  int scratch = 0;
  int of(BufferKind k) const {
    switch (k) {
      case BufferKind::Input:
        return input;
      case BufferKind::Output:
        return output;
      case BufferKind::Scratch:
        return scratch;
    }
    return 0;
  }
};

// Error text when the schedule's shape cannot describe its collective (e.g. chunksPerLoop not divisible by nRanks
// where the collective needs it, unknown custom kind, root out of range); empty when fine.
std::string validateShape(const Schedule& s);

BufferSizes logicalSizes(const Schedule& s, int rank);

// Resolves a logical (buffer, index) of `rank` to the physical slot it occupies in `mode`. In in-place mode the
// All-Gather input is the rank's slice of the output, the Reduce-Scatter output is the rank's slice of the input,
// and for the other collectives the output is the input. Custom collectives never alias.
Slot resolveSlot(const Schedule& s, int rank, BufferMode mode, BufferKind buf, int index);

// Physical chunk count of each buffer of `rank` in `mode` (an aliased buffer has size 0).
BufferSizes physicalSizes(const Schedule& s, int rank, BufferMode mode);

// The postcondition for one output chunk: the multiset of contributions that must be combined there (one term
// for a copy collective, one per rank for a reduction). `constrained` is false where the collective leaves the
// chunk undefined (e.g. non-root ranks of Reduce).
struct Expected {
  bool constrained = false;
  std::vector<Contribution> terms;  // sorted
};
Expected expectedOutput(const Schedule& s, int rank, int outputIndex);

// Whether rank's input chunk `index` is read by the collective at all (Broadcast: only the root's input).
bool inputDefined(const Schedule& s, int rank, int index);

// The custom collectives we know postconditions for (Collective::Custom with Schedule::customKind).
//   "alltonext": rank r's input chunk j must end in rank r+1's output chunk j (msccl-tools' pipeline-forward).
std::vector<std::string> knownCustomKinds();

// nccl-tests conventions: the size S of a collective given each rank's buffer, and the busbw factor.
double busBandwidthFactor(Collective c, int nRanks);

}  // namespace optiflow::core
