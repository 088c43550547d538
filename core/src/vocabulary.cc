#include "optiflow/core/vocabulary.h"

#include <cctype>
#include <string>

namespace optiflow::core {

namespace {

// Case, '_', '-' and spaces do not matter: "AllGather", "all_gather" and "allgather" are one name.
std::string normalise(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '_' || ch == '-' || ch == ' ') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  }
  return out;
}

}  // namespace

std::string_view toString(Collective c) {
  switch (c) {
    case Collective::AllGather:
      return "allgather";
    case Collective::ReduceScatter:
      return "reducescatter";
    case Collective::AllReduce:
      return "allreduce";
    case Collective::Broadcast:
      return "broadcast";
    case Collective::Reduce:
      return "reduce";
    case Collective::AllToAll:
      return "alltoall";
    case Collective::Custom:
      return "custom";
  }
  return "?";
}

std::string_view toString(Protocol p) {
  switch (p) {
    case Protocol::LL:
      return "LL";
    case Protocol::LL128:
      return "LL128";
    case Protocol::Simple:
      return "Simple";
  }
  return "?";
}

std::optional<Collective> parseCollective(std::string_view s) {
  const std::string n = normalise(s);
  if (n == "allgather") return Collective::AllGather;
  if (n == "reducescatter") return Collective::ReduceScatter;
  if (n == "allreduce") return Collective::AllReduce;
  if (n == "broadcast") return Collective::Broadcast;
  if (n == "reduce") return Collective::Reduce;
  if (n == "alltoall") return Collective::AllToAll;
  if (n == "custom") return Collective::Custom;
  return std::nullopt;
}

std::optional<Protocol> parseProtocol(std::string_view s) {
  const std::string n = normalise(s);
  if (n == "simple") return Protocol::Simple;
  if (n == "ll") return Protocol::LL;
  if (n == "ll128") return Protocol::LL128;
  return std::nullopt;
}

std::string_view toString(Algorithm a) {
  switch (a) {
    case Algorithm::Tree:
      return "Tree";
    case Algorithm::Ring:
      return "Ring";
    case Algorithm::CollNetDirect:
      return "CollNetDirect";
    case Algorithm::CollNetChain:
      return "CollNetChain";
    case Algorithm::Nvls:
      return "NVLS";
    case Algorithm::NvlsTree:
      return "NVLSTree";
    case Algorithm::Pat:
      return "PAT";
  }
  return "?";
}

std::optional<Algorithm> parseAlgorithm(std::string_view s) {
  const std::string n = normalise(s);
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const auto a = static_cast<Algorithm>(i);
    if (normalise(toString(a)) == n) return a;
  }
  return std::nullopt;
}

}  // namespace optiflow::core
