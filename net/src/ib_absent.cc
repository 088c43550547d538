// The RDMA transport when rdma-core's headers were not found at build time: makeTransport falls back to TCP.
#include "optiflow/net/transport.h"

namespace optiflow::net {

std::unique_ptr<Transport> makeIbTransport(const IbOptions& /*options*/, LogFn /*log*/, Telemetry* /*telemetry*/,
                                           std::string* error) {
  if (error != nullptr) *error = "built without rdma-core (libibverbs-dev)";
  return nullptr;
}

}  // namespace optiflow::net
