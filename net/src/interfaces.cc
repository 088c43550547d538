#include "interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

namespace optiflow::net::detail {
namespace {

constexpr int kDefaultSpeedMbps = 10000;

// Lower is better: IPv4, then global IPv6, then link-local IPv6 (needs a scope id, so only as a last resort).
int addressRank(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return 0;
  const auto* a6 = reinterpret_cast<const sockaddr_in6*>(addr);
  return IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr) ? 2 : 1;
}

int readSpeedMbps(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  long speed = -1;
  if (in >> speed && speed > 0 && speed <= INT_MAX) return static_cast<int>(speed);
  return kDefaultSpeedMbps;  // virtual interfaces report -1 or fail the read
}

std::string pciPath(const std::string& ifname) {
  const std::string link = "/sys/class/net/" + ifname + "/device";
  char* real = realpath(link.c_str(), nullptr);
  if (real == nullptr) return "";
  std::string path(real);
  std::free(real);
  return path;
}

}  // namespace

std::string addressText(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, buf, sizeof(buf));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf, sizeof(buf));
  } else {
    return "?";
  }
  return buf;
}

std::vector<Interface> listInterfaces(const std::vector<std::string>& ifnames, std::string* error) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    if (error != nullptr) *error = std::string("getifaddrs failed: ") + std::strerror(errno);
    return {};
  }
  struct Candidate {
    Interface iface;
    int rank = 3;
    bool loopback = false;
    unsigned index = 0;
  };
  std::map<std::string, Candidate> byName;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_name == nullptr) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0 || (ifa->ifa_flags & IFF_RUNNING) == 0) continue;
    Candidate& c = byName[ifa->ifa_name];
    const int rank = addressRank(ifa->ifa_addr);
    if (rank >= c.rank) continue;
    c.rank = rank;
    c.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    c.index = if_nametoindex(ifa->ifa_name);
    c.iface.name = ifa->ifa_name;
    c.iface.addrLen = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memset(&c.iface.addr, 0, sizeof(c.iface.addr));
    std::memcpy(&c.iface.addr, ifa->ifa_addr, c.iface.addrLen);
    c.iface.addrText = addressText(ifa->ifa_addr);
  }
  freeifaddrs(list);

  std::vector<Candidate> chosen;
  if (!ifnames.empty()) {
    for (const std::string& name : ifnames) {
      auto it = byName.find(name);
      if (it == byName.end()) {
        if (error != nullptr) *error = "interface '" + name + "' not found, down or without an IP address";
        return {};
      }
      if (std::none_of(chosen.begin(), chosen.end(), [&](const Candidate& c) { return c.iface.name == name; })) {
        chosen.push_back(it->second);
      }
    }
  } else {
    for (auto& [name, c] : byName) {
      if (!c.loopback) chosen.push_back(c);
    }
    if (chosen.empty()) {
      for (auto& [name, c] : byName) {
        if (c.loopback) chosen.push_back(c);
      }
    }
    std::sort(chosen.begin(), chosen.end(), [](const Candidate& a, const Candidate& b) { return a.index < b.index; });
  }
  if (chosen.empty()) {
    if (error != nullptr) *error = "no network interface is up with an IP address";
    return {};
  }
  std::vector<Interface> out;
  out.reserve(chosen.size());
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    Interface iface = std::move(chosen[i].iface);
    DeviceProps& p = iface.props;
    p.name = iface.name;
    p.pciPath = pciPath(iface.name);
    p.guid = i;
    p.ptrSupport = kPtrHost;
    p.regIsGlobal = true;
    p.speedMbps = readSpeedMbps(iface.name);
    p.maxRecvs = kMaxRecvs;
    out.push_back(std::move(iface));
  }
  return out;
}

}  // namespace optiflow::net::detail
