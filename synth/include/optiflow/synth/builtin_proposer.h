// The built-in proposer: no network, deterministic for a seed. Round 0 proposes the gallery's programs for the
// collective; later rounds mutate the programs that are best at some size (by their ratio to the bound) and a few
// random others: a group strategy swapped for another, the data split into more or fewer parts, stages reordered.
// Mutations are made on the syntax tree and printed back, so every candidate is a well-formed program; whether it
// is a correct one is for the expander to say.
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "optiflow/synth/proposer.h"

namespace optiflow::synth {

class BuiltinProposer : public Proposer {
 public:
  explicit BuiltinProposer(std::uint64_t seed = 1);
  std::string_view name() const override { return "builtin"; }
  std::vector<Candidate> propose(const ProposalContext& context) override;
  // The leader and the runners-up at each size.
  std::size_t timesReadPerSize() const override { return kRanked; }
  static constexpr std::size_t kRanked = 3;

 private:
  std::mt19937_64 rng_;
  std::set<std::string> seen_;  // canonical texts already proposed (or in the history)
  int counter_ = 0;             // numbers the children: <gallery name>_v<counter>
};

}  // namespace optiflow::synth
