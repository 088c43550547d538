#include "optiflow/exec/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "optiflow/net/socket.h"

namespace optiflow::exec {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x4f465256;  // "OFRV"
constexpr std::string_view kWhere = "<rendezvous>";

core::Diagnostic error(std::string message) { return {std::string(kWhere), 0, 0, std::move(message)}; }

std::optional<long long> toInt(std::string_view s) {
  long long v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

void putU32(Blob& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

std::uint32_t getU32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}

double seconds(std::chrono::milliseconds t) { return std::chrono::duration<double>(t).count(); }

// The first address of host:port (numeric or a name), for listening or connecting.
core::Result<sockaddr_storage> resolve(const HostPort& at, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(at.port);
  if (int rc = getaddrinfo(at.host.c_str(), port.c_str(), &hints, &res); rc != 0 || res == nullptr) {
    return error(fmt::format("cannot resolve {}: {}", at.host, gai_strerror(rc)));
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  length = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

}  // namespace

core::Result<LaunchInfo> launchInfoFromEnv(const std::function<const char*(const char*)>& getenvFn) {
  auto get = [&](const char* name) -> const char* { return getenvFn ? getenvFn(name) : std::getenv(name); };
  struct Scheme {
    const char* rank;
    const char* size;
    const char* local;
    const char* source;
  };
  static constexpr Scheme kSchemes[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_*"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_*"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_*"},
  };
  LaunchInfo info;
  for (const char* k : {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"}) {
    if (const char* v = get(k); v != nullptr && *v != '\0') {
      info.jobKey = v;
      break;
    }
  }
  for (const Scheme& s : kSchemes) {
    const char* rank = get(s.rank);
    if (rank == nullptr) continue;
    const char* size = get(s.size);
    if (size == nullptr) {
      return core::Diagnostic{"<environment>", 0, 0, fmt::format("{} is set but {} is not", s.rank, s.size)};
    }
    const auto r = toInt(rank);
    const auto n = toInt(size);
    if (!n || *n < 1 || *n > (1 << 20)) {
      return core::Diagnostic{"<environment>", 0, 0,
                              fmt::format("{}='{}': expected a world size from 1 to {}", s.size, size, 1 << 20)};
    }
    if (!r || *r < 0 || *r >= *n) {
      return core::Diagnostic{"<environment>", 0, 0,
                              fmt::format("{}='{}': expected a rank from 0 to {}", s.rank, rank, *n - 1)};
    }
    info.rank = static_cast<int>(*r);
    info.size = static_cast<int>(*n);
    info.source = s.source;
    if (const char* local = get(s.local)) {
      const auto l = toInt(local);
      if (!l || *l < 0 || *l > (1 << 20)) {
        return core::Diagnostic{"<environment>", 0, 0,
                                fmt::format("{}='{}': expected a local rank (0 or more)", s.local, local)};
      }
      info.localRank = static_cast<int>(*l);
    }
    return info;
  }
  info.source = "none";
  return info;
}

core::Result<HostPort> parseHostPort(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return core::Diagnostic{"--rendezvous", 0, 0,
                            fmt::format("'{}': {}; expected host:port (or [ipv6]:port), port 1-65535", text, why)};
  };
  HostPort hp;
  std::string_view port;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("no ]: after the IPv6 address");
    }
    hp.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  if (hp.host.empty()) return bad("no host");
  const auto p = toInt(port);
  if (!p || *p < 1 || *p > 65535) return bad("the port is not a number from 1 to 65535");
  hp.port = static_cast<std::uint16_t>(*p);
  return hp;
}

core::Result<Blob> exchangeOverTcp(const HostPort& at, int rank, int size, const Blob& blob,
                                   std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) return error(fmt::format("rank {} of {}", rank, size));
  if (blob.size() > kMaxBlobBytes) return error(fmt::format("a blob of {} bytes is too large", blob.size()));
  socklen_t length = 0;
  auto addr = resolve(at, length);
  if (!addr) return addr.error();
  const std::string where = fmt::format("{}:{}", at.host, at.port);
  const net::Deadline deadline(seconds(timeout));
  if (rank != 0) {
    // Rank 0 may not be listening yet: retry refused connections until the deadline.
    net::Fd fd;
    for (;;) {
      const net::SocketStatus st =
          net::connectWithin(reinterpret_cast<const sockaddr*>(&*addr), length, deadline, "rank 0", &fd);
      if (st) break;
      if (st.expired()) {
        return error(fmt::format("rank {}: no rank 0 answered at {} within {} s ({})", rank, where, seconds(timeout),
                                 st.message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Blob hello;
    putU32(hello, kMagic);
    putU32(hello, static_cast<std::uint32_t>(rank));
    putU32(hello, static_cast<std::uint32_t>(size));
    if (auto st = net::sendAll(fd.get(), hello.data(), hello.size(), deadline, "the rendezvous hello"); !st) {
      return error(fmt::format("rank {} at {}: {}", rank, where, st.message()));
    }
    std::uint8_t head[8];
    if (auto st = net::recvAll(fd.get(), head, sizeof head, deadline, "rank 0's reply"); !st) {
      return error(fmt::format("rank {} at {}: {}", rank, where, st.message()));
    }
    const std::uint32_t n = getU32(head + 4);
    if (getU32(head) != kMagic || n > kMaxBlobBytes) {
      return error(fmt::format("rank {}: {} is not an optiflow-bench rendezvous (or another run's)", rank, where));
    }
    Blob out(n);
    if (auto st = net::recvAll(fd.get(), out.data(), n, deadline, "the unique id"); !st) {
      return error(fmt::format("rank {} at {}: {}", rank, where, st.message()));
    }
    return out;
  }
  net::Fd listener;
  sockaddr_storage bound{};
  if (auto st = net::listenOn(reinterpret_cast<const sockaddr*>(&*addr), length, 256, &listener, &bound); !st) {
    return error(fmt::format("rank 0 cannot listen on {}: {}", where, st.message()));
  }
  std::set<int> served;
  while (static_cast<int>(served.size()) < size - 1) {
    if (auto st = deadline.check("the other ranks"); !st) {
      std::string missing;
      for (int r = 1; r < size && missing.size() < 200; ++r) {
        if (served.count(r) == 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
      return error(fmt::format("rank 0 at {}: {} of {} ranks joined within {} s; missing: {}", where, served.size() + 1,
                               size, seconds(timeout), missing));
    }
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, deadline.pollMs()) <= 0) continue;
    net::Fd conn;
    sockaddr_storage peer{};
    if (net::acceptStream(listener.get(), &conn, &peer) != net::Io::kDone) continue;
    // A short deadline per client: a stray connection (a port scanner, another program) cannot stall the others.
    const net::Deadline each(std::min(5.0, seconds(timeout)));
    std::uint8_t hello[12];
    if (!net::recvAll(conn.get(), hello, sizeof hello, each, "a rank's hello")) continue;
    const std::uint32_t r = getU32(hello + 4);
    if (getU32(hello) != kMagic || getU32(hello + 8) != static_cast<std::uint32_t>(size) || r == 0 ||
        r >= static_cast<std::uint32_t>(size)) {
      continue;  // not one of ours: ignore it
    }
    Blob reply;
    putU32(reply, kMagic);
    putU32(reply, static_cast<std::uint32_t>(blob.size()));
    reply.insert(reply.end(), blob.begin(), blob.end());
    if (!net::sendAll(conn.get(), reply.data(), reply.size(), each, "the unique id")) continue;
    served.insert(static_cast<int>(r));
  }
  return blob;
}

namespace {

fs::path rendezvousFile(const std::string& dir, const std::string& key) {
  std::string safe;
  for (char c : key)
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return fs::path(dir) / fmt::format("optiflow-bench-{}.id", safe.empty() ? "default" : safe);
}

}  // namespace

core::Result<Blob> exchangeOverFile(const std::string& dir, const std::string& key, int rank, const Blob& blob,
                                    std::chrono::milliseconds timeout) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return error(fmt::format("--rendezvous-dir {}: not a directory", dir));
  if (blob.size() > kMaxBlobBytes) return error(fmt::format("a blob of {} bytes is too large", blob.size()));
  const fs::path file = rendezvousFile(dir, key);
  if (rank == 0) {
    Blob content;
    putU32(content, kMagic);
    putU32(content, static_cast<std::uint32_t>(blob.size()));
    content.insert(content.end(), blob.begin(), blob.end());
    const fs::path aside = file.string() + fmt::format(".{}.tmp", ::getpid());
    {
      std::ofstream out(aside, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
      if (!out) return error(fmt::format("rank 0 cannot write {}", aside.string()));
    }
    fs::rename(aside, file, ec);
    if (ec) return error(fmt::format("rank 0 cannot rename {} to {}: {}", aside.string(), file.string(), ec.message()));
    return blob;
  }
  const auto end = Clock::now() + timeout;
  for (;;) {
    std::ifstream in(file, std::ios::binary);
    if (in) {
      const Blob content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (content.size() >= 8 && getU32(content.data()) == kMagic && getU32(content.data() + 4) <= kMaxBlobBytes &&
          content.size() == 8 + getU32(content.data() + 4)) {
        return Blob(content.begin() + 8, content.end());
      }
      return error(fmt::format("rank {}: {} is not an optiflow-bench rendezvous file", rank, file.string()));
    }
    if (Clock::now() >= end) {
      return error(fmt::format("rank {}: rank 0 wrote no {} within {} s", rank, file.string(), seconds(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void removeRendezvousFile(const std::string& dir, const std::string& key) {
  std::error_code ec;
  fs::remove(rendezvousFile(dir, key), ec);
}

}  // namespace optiflow::exec
