// The GPU probe of a build without CUDA: nothing to measure, and the reason says so.
#include "optiflow/daemon/probe.h"

namespace optiflow::daemon {

GpuProbeResult probeGpuLinks() {
  GpuProbeResult result;
  result.detail = "built without CUDA";
  return result;
}

}  // namespace optiflow::daemon
