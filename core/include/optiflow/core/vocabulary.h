// The words every component shares: which collective, which of NCCL's algorithms, which protocol. One type each,
// their names and NCCL's indices, all here: components convert through this header, never through strings.
// Algorithm and Protocol enumerate in NCCL's order (NCCL_ALGO_*, NCCL_PROTO_*), so ncclIndex is a cast; the
// schedule cache stores these indices and the plugins static_assert them against NCCL's.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace optiflow::core {

enum class Collective : std::uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, Reduce, AllToAll, Custom };
enum class Algorithm : std::uint8_t { Tree, Ring, CollNetDirect, CollNetChain, Nvls, NvlsTree, Pat };
enum class Protocol : std::uint8_t { LL, LL128, Simple };

inline constexpr int kNumAlgorithms = 7;
inline constexpr int kNumProtocols = 3;

std::string_view toString(Collective c);  // "allgather", "reducescatter", ...
std::string_view toString(Algorithm a);   // NCCL's names: "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", ...
std::string_view toString(Protocol p);    // "LL", "LL128", "Simple"
std::optional<Collective> parseCollective(std::string_view s);  // accepts MSCCL and our spellings
std::optional<Algorithm> parseAlgorithm(std::string_view s);    // case-insensitive
std::optional<Protocol> parseProtocol(std::string_view s);      // case-insensitive

constexpr int ncclIndex(Algorithm a) { return static_cast<int>(a); }
constexpr int ncclIndex(Protocol p) { return static_cast<int>(p); }
constexpr std::optional<Algorithm> algorithmFromNccl(int index) {
  if (index < 0 || index >= kNumAlgorithms) return std::nullopt;
  return static_cast<Algorithm>(index);
}
constexpr std::optional<Protocol> protocolFromNccl(int index) {
  if (index < 0 || index >= kNumProtocols) return std::nullopt;
  return static_cast<Protocol>(index);
}

// NCCL's ncclFunc_t: Broadcast 0, Reduce 1, AllGather 2, ReduceScatter 3, AllReduce 4; the collectives NCCL's tuner
// decides. Others have none.
constexpr std::optional<int> ncclFuncIndex(Collective c) {
  switch (c) {
    case Collective::Broadcast:
      return 0;
    case Collective::Reduce:
      return 1;
    case Collective::AllGather:
      return 2;
    case Collective::ReduceScatter:
      return 3;
    case Collective::AllReduce:
      return 4;
    default:
      return std::nullopt;
  }
}
constexpr std::optional<Collective> collectiveFromNcclFunc(int index) {
  constexpr Collective kByIndex[] = {Collective::Broadcast, Collective::Reduce, Collective::AllGather,
                                     Collective::ReduceScatter, Collective::AllReduce};
  if (index < 0 || index >= 5) return std::nullopt;
  return kByIndex[index];
}

}  // namespace optiflow::core
