// TCP send/receive comms and the pieces the TCP transport shares with them (private to optiflow::net).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "interfaces.h"
#include "optiflow/net/socket.h"
#include "optiflow/net/telemetry.h"
#include "optiflow/net/transport.h"

namespace optiflow::net::detail {

// What a comm needs once its streams are connected. The comm owns the sockets.
struct TcpConnection {
  std::vector<Fd> fds;                // by stream index
  std::vector<int> railOfStream;      // by stream index
  std::vector<std::string> railNics;  // local interface name of each rail
  std::string peer;                   // remote IP text, for logs and the peer record
  LogFn log;
  Telemetry* telemetry = nullptr;  // may be null: nothing is counted
  std::uint64_t minStripeBytes = 0;
};

std::unique_ptr<SendComm> makeTcpSendComm(TcpConnection connection);
std::unique_ptr<RecvComm> makeTcpRecvComm(TcpConnection connection);

// makeTcpTransport over a given interface list (tests: two devices named differently on 127.0.0.1).
std::unique_ptr<Transport> makeTcpTransportOn(std::vector<Interface> interfaces, const TcpOptions& options, LogFn log,
                                              Telemetry* telemetry);

// Logs at WARN through log (if set), prefixed "TCP: " (the plugin adds "OptiFlow/Net: ").
void warn(const LogFn& log, const std::string& message);

}  // namespace optiflow::net::detail
