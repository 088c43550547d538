// How the processes of one optiflow-bench run find each other: which rank this process is (from the launcher's
// environment), and a small exchange in which rank 0 hands every other rank an opaque blob (NCCL's unique id), over
// TCP (`--rendezvous host:port`, rank 0 listens) or through a file in a directory every rank sees
// (`--rendezvous-dir`). Plain C++ on the project's socket toolkit (net/socket.h); no CUDA.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/core/error.h"

namespace optiflow::exec {

struct LaunchInfo {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  std::string source;  // "OMPI_COMM_WORLD_*", "SLURM_*", "RANK/WORLD_SIZE", "PMI_*" or "none" (a single process)
  std::string jobKey;  // a job id when the launcher gives one (SLURM_JOB_ID, ...), else empty
};

// Reads the launcher's variables through `getenv` (std::getenv by default), first match wins: Open MPI
// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), Slurm (SLURM_PROCID/NTASKS/LOCALID), torchrun and friends
// (RANK/WORLD_SIZE/LOCAL_RANK), PMI (PMI_RANK/PMI_SIZE). None set: rank 0 of 1. A variable that is set but not a
// number, or a rank outside [0, size), is an error naming the variable.
core::Result<LaunchInfo> launchInfoFromEnv(const std::function<const char*(const char*)>& getenv = {});

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};
// "host:port", "[v6addr]:port"; port 1..65535.
core::Result<HostPort> parseHostPort(std::string_view text);

using Blob = std::vector<std::uint8_t>;
inline constexpr std::size_t kMaxBlobBytes = 4096;

// Rank 0 listens on `at` and sends `blob` to each of the other size-1 ranks, which connect (retrying until rank 0
// is up) and return it. Rank 0 returns its own blob once every rank has it. Every wait ends at `timeout` with an
// error that says who was waited for.
core::Result<Blob> exchangeOverTcp(const HostPort& at, int rank, int size, const Blob& blob,
                                   std::chrono::milliseconds timeout);

// Rank 0 writes `blob` to DIR/optiflow-bench-<key>.id (written aside and renamed, so no rank reads half a file);
// the others wait for it. `key` keeps concurrent or earlier runs apart (a job id, or one the user gives); rank 0
// removes the file with removeRendezvousFile once every rank has joined.
core::Result<Blob> exchangeOverFile(const std::string& dir, const std::string& key, int rank, const Blob& blob,
                                    std::chrono::milliseconds timeout);
void removeRendezvousFile(const std::string& dir, const std::string& key);

}  // namespace optiflow::exec
