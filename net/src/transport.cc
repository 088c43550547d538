// Picks the transport the plugin uses.
#include <string>

#include "optiflow/net/transport.h"

namespace optiflow::net {

std::unique_ptr<Transport> makeTransport(const Options& options, LogFn log, Telemetry* telemetry, std::string* error) {
  try {
    if (options.kind == TransportKind::kIb) return makeIbTransport(options.ib, std::move(log), telemetry, error);
    if (options.kind == TransportKind::kAuto) {
      std::string why;
      if (auto ib = makeIbTransport(options.ib, log, telemetry, &why)) return ib;
      if (log) log(2, "OptiFlow: RDMA transport not used (" + why + "); using TCP sockets");
    }
    return makeTcpTransport(options.tcp, std::move(log), telemetry, error);
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("transport selection failed: ") + e.what();
    return nullptr;
  }
}

}  // namespace optiflow::net
