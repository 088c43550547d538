// The network interfaces the TCP transport uses as devices (private to optiflow::net).
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "optiflow/net/transport.h"

namespace optiflow::net::detail {

struct Interface {
  std::string name;
  sockaddr_storage addr{};  // port 0
  socklen_t addrLen = 0;
  std::string addrText;  // "10.0.0.1" / "fe80::1"
  DeviceProps props;
};

// Up and running interfaces with an IPv4 or IPv6 address (IPv4 preferred, link-local IPv6 only when an interface has
// nothing else), sorted by interface index. ifnames empty: every non-loopback interface, else loopback; otherwise
// exactly the named ones (an unknown name is an error). Empty result with *error when nothing fits.
std::vector<Interface> listInterfaces(const std::vector<std::string>& ifnames, std::string* error);

// "1.2.3.4" / "::1" for an AF_INET/AF_INET6 address; "?" otherwise.
std::string addressText(const sockaddr* addr);

}  // namespace optiflow::net::detail
