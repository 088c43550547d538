// The language-model proposer: builds a prompt from the language reference, the topology in compact form, the
// collective and the feedback of earlier rounds, asks the model, and pulls programs out of its reply. Candidates
// that failed to parse or expand go back with their errors verbatim for repair. When the model is unusable (no
// reply after retries, nothing parseable in several replies) it falls back to another proposer for the round
// and says so in the log.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optiflow/synth/llm_client.h"
#include "optiflow/synth/proposer.h"

namespace optiflow::synth {

struct LlmProposerOptions {
  int maxFeedbackCandidates = 12;          // the most earlier candidates shown in one prompt (best and latest first)
  std::size_t maxPromptBytes = 96u << 10;  // feedback is cut (oldest first) to stay below this
  // A round without a usable program is proposed by the fallback. After this many rounds in a row in which the
  // model did not answer at all, it is asked only every `reprobeEveryRounds` rounds (0: every round).
  int silentRoundsBeforeBackoff = 2;
  int reprobeEveryRounds = 4;
};

// The topology in a few lines: nodes, GPUs per node, NICs, link bandwidths and latencies.
std::string compactTopology(const core::Topology& topology);

// The two messages of one request: the system message (role, language reference, rules) and the user message
// (cluster, collective, sizes, feedback, what to write).
std::vector<ChatMessage> buildPrompt(const ProposalContext& context, const LlmProposerOptions& options);

class LlmProposer : public Proposer {
 public:
  // `fallback` is used for a round when the model is unusable; it must outlive this proposer.
  LlmProposer(LlmClient client, Proposer& fallback, LlmProposerOptions options = {});
  std::string_view name() const override { return "llm"; }
  std::vector<Candidate> propose(const ProposalContext& context) override;

 private:
  LlmClient client_;
  Proposer& fallback_;
  LlmProposerOptions options_;
  int unreachableRounds_ = 0;  // consecutive rounds in which the model did not answer
  int skippedRounds_ = 0;      // rounds proposed by the fallback without asking, since the model last answered
};

}  // namespace optiflow::synth
