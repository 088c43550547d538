// The language-model proposer: what its prompt tells the model, what it makes of the replies of a local
// OpenAI-compatible server, and when it hands a round to the fallback proposer.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llm_test_support.h"
#include "optiflow/core/topology.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/llm_proposer.h"

namespace optiflow::synth {
namespace {

using llmtest::completionJson;
using llmtest::FakeLlmServer;
using llmtest::LogCapture;
using llmtest::unusedPort;

constexpr std::uint64_t kMiB = 1u << 20;

core::Topology preset(const char* name) {
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << t.error().str();
  return t.ok() ? *t : core::Topology{};
}

class FakeProposer : public Proposer {
 public:
  std::string_view name() const override { return "fake"; }
  std::vector<Candidate> propose(const ProposalContext&) override {
    ++calls;
    return {{"allgather f1\n  allgather all by ring\n", "fake:1"},
            {"allgather f2\n  allgather all by direct\n", "fake:2"},
            {"allgather f3\n  allgather all by bruck\n", "fake:3"}};
  }
  int calls = 0;
};

CandidateRecord okRecord(const std::string& id, const std::string& name, std::uint64_t size, double timeUs,
                         double boundUs, double ncclUs) {
  CandidateRecord r;
  r.id = id;
  r.origin = "llm";
  r.name = name;
  r.text = "allgather " + name + "\n  allgather all by ring\n";
  r.stage = "ok";
  SizeResult s;
  s.sizeBytes = size;
  s.ok = true;
  s.timeUs = timeUs;
  s.boundUs = boundUs;
  s.ncclUs = ncclUs;
  s.config = "LL128/2ch/2sl";
  s.bottleneck = "node0.gpu3->nic3 (97%)";
  r.sizes.push_back(s);
  return r;
}

const char* const kParseErrors =
    "<proposal 2>:2:39: expected a strategy (ring, direct, tree, chain, recursive_doubling, recursive_halving, "
    "bruck, pat) after 'by', found 'rign'; did you mean 'ring'?\n"
    "      for g in gpus: allgather rail(g) by rign\n"
    "                                          ^";

CandidateRecord failedRecord(const std::string& id, const std::string& name) {
  CandidateRecord r;
  r.id = id;
  r.origin = "llm";
  r.name = name;
  r.text = "allgather " + name + "\n  for g in gpus: allgather rail(g) by rign\n";
  r.stage = "parse";
  r.errors = kParseErrors;
  return r;
}

std::size_t promptBytes(const std::vector<ChatMessage>& messages) {
  std::size_t n = 0;
  for (const ChatMessage& m : messages) n += m.content.size();
  return n;
}

TEST(CompactTopology, NamesShapeFabricsAndRails) {
  const core::Topology t = preset("dgx-a100x4");
  const std::string s = compactTopology(t);
  EXPECT_NE(s.find("dgx-a100x4"), std::string::npos) << s;
  EXPECT_NE(s.find("4 nodes x 8 GPUs"), std::string::npos) << s;
  EXPECT_NE(s.find("32 ranks"), std::string::npos) << s;
  EXPECT_NE(s.find(fmt::format("NVSwitch, {:g} GB/s", t.intra.gpuBandwidthGBps)), std::string::npos) << s;
  EXPECT_NE(s.find(fmt::format("8 per node (rails = 8), {:g} GB/s", t.nics[0].bandwidthGBps)), std::string::npos) << s;
  EXPECT_NE(s.find("NIC g serves GPU g"), std::string::npos) << s;
  EXPECT_NE(s.find("rail-optimized"), std::string::npos) << s;
  EXPECT_LE(std::count(s.begin(), s.end(), '\n'), 8) << "a few lines, not a table: " << s;
}

TEST(CompactTopology, SharedNicsPcieAndOneNode) {
  core::Topology t;
  t.name = "box";
  t.nodes = 1;
  t.gpusPerNode = 4;
  t.intra.kind = core::IntraFabricKind::Pcie;
  t.intra.gpuBandwidthGBps = 24;
  t.intra.latencyUs = 1.5;
  t.intra.switches = {{{0, 1}, 24}, {{2, 3}, 24}};
  t.intra.hostBandwidthGBps = 20;
  t.intra.hostLatencyUs = 2;
  t.nics = {{"eth0", 12.5, 3, {0, 1}}, {"eth1", 12.5, 3, {2}}};
  const std::string s = compactTopology(t);
  EXPECT_NE(s.find("1 node x 4 GPUs = 4 ranks"), std::string::npos) << s;
  EXPECT_NE(s.find("PCIe, 24 GB/s per GPU, 1.5 us; 2 switches (GPUs 0,1 | 2,3)"), std::string::npos) << s;
  EXPECT_NE(s.find("via the CPU at 20 GB/s"), std::string::npos) << s;
  EXPECT_NE(s.find("NIC 0: GPUs 0,1; NIC 1: GPUs 2"), std::string::npos) << s;
  EXPECT_NE(s.find("GPUs without a NIC of their own: 3"), std::string::npos) << s;
  EXPECT_NE(s.find("inter-node: none"), std::string::npos) << s;
}

TEST(BuildPrompt, CarriesReferenceTopologyErrorsAndTimes) {
  const core::Topology topo = preset("dgx-a100x4");
  std::vector<CandidateRecord> history = {okRecord("r0c0", "ring_all", kMiB, 150, 100, 120),
                                          failedRecord("r0c1", "broken")};
  const ProposalContext context{topo, core::Collective::AllGather, {kMiB, 64 * kMiB}, 1, 5, history, {0, -1}};
  const auto messages = buildPrompt(context, {});
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].role, "system");
  EXPECT_EQ(messages[1].role, "user");
  const std::string& system = messages[0].content;
  const std::string& user = messages[1].content;

  ASSERT_GT(languageReference().size(), 1000u);
  EXPECT_NE(system.find(languageReference()), std::string::npos);
  EXPECT_NE(system.find("```ofl"), std::string::npos);
  EXPECT_NE(system.find("One program per block"), std::string::npos);

  EXPECT_NE(user.find(compactTopology(topo)), std::string::npos) << user;
  EXPECT_NE(user.find("allgather"), std::string::npos);
  EXPECT_NE(user.find("1MiB, 64MiB"), std::string::npos) << user;
  EXPECT_NE(user.find(kParseErrors), std::string::npos) << "errors verbatim:\n" << user;
  EXPECT_NE(user.find(history[1].text), std::string::npos) << "the failed program's text:\n" << user;
  EXPECT_NE(user.find(history[0].text), std::string::npos);
  EXPECT_NE(user.find("150.0 us = 1.50x the lower bound (100.0 us)"), std::string::npos) << user;
  EXPECT_NE(user.find("NCCL 120.0 us, so 1.25x NCCL's time"), std::string::npos) << user;
  EXPECT_NE(user.find("bottleneck node0.gpu3->nic3 (97%)"), std::string::npos) << user;
  EXPECT_NE(user.find("- 1MiB: ring_all (r0c0)"), std::string::npos) << "best per size:\n" << user;
  EXPECT_NE(user.find("- 64MiB: no working program yet"), std::string::npos) << user;
  EXPECT_NE(user.find("REJECTED at parse"), std::string::npos) << user;
  EXPECT_NE(user.find("repaired version"), std::string::npos) << user;
  EXPECT_NE(user.find("up to 5 new"), std::string::npos) << user;
}

TEST(BuildPrompt, FirstRoundHasNoFeedbackAndNoRepairRequest) {
  const core::Topology topo = preset("dgx-a100x2");
  const std::vector<CandidateRecord> history;
  const ProposalContext context{topo, core::Collective::ReduceScatter, {kMiB}, 0, 8, history, {}};
  const auto messages = buildPrompt(context, {});
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].content.find("`reducescatter <name>`"), std::string::npos) << messages[0].content;
  EXPECT_NE(messages[1].content.find("No programs have been tried yet"), std::string::npos);
  EXPECT_EQ(messages[1].content.find("repaired"), std::string::npos);
}

TEST(BuildPrompt, DropsTheOldestFeedbackToFitMaxPromptBytes) {
  const core::Topology topo = preset("dgx-a100x2");
  std::vector<CandidateRecord> history;
  for (int i = 0; i < 3; ++i) {
    CandidateRecord r = okRecord(fmt::format("r{}c0", i), fmt::format("p{}", i), kMiB, 10, 5, 9);
    r.text += fmt::format("  # marker-{}-end\n", i);
    history.push_back(r);
  }
  const ProposalContext context{topo, core::Collective::AllGather, {kMiB}, 3, 4, history, {}};
  LlmProposerOptions options;
  options.maxPromptBytes = 1u << 30;
  const std::size_t full = promptBytes(buildPrompt(context, options));
  const std::string all = buildPrompt(context, options)[1].content;
  for (int i = 0; i < 3; ++i) EXPECT_NE(all.find(fmt::format("marker-{}-end", i)), std::string::npos);

  options.maxPromptBytes = full - 1;
  const auto cut = buildPrompt(context, options);
  EXPECT_LE(promptBytes(cut), options.maxPromptBytes);
  EXPECT_EQ(cut[1].content.find("marker-0-end"), std::string::npos) << cut[1].content;
  EXPECT_NE(cut[1].content.find("marker-1-end"), std::string::npos);
  EXPECT_NE(cut[1].content.find("marker-2-end"), std::string::npos);
  EXPECT_NE(cut[1].content.find("1 older ones left out"), std::string::npos) << cut[1].content;
  EXPECT_NE(cut[0].content.find(languageReference()), std::string::npos) << "the reference is never cut";
}

TEST(BuildPrompt, ShowsTheBestAndTheLatestUpToMaxFeedbackCandidates) {
  const core::Topology topo = preset("dgx-a100x2");
  std::vector<CandidateRecord> history;
  for (int i = 0; i < 20; ++i) {
    CandidateRecord r = okRecord(fmt::format("r{}c0", i), fmt::format("p{}", i), kMiB, 10, 5, 9);
    r.text += fmt::format("  # marker-{:02}-end\n", i);
    history.push_back(r);
  }
  const ProposalContext context{topo, core::Collective::AllGather, {kMiB}, 20, 4, history, {2}};
  LlmProposerOptions options;
  options.maxFeedbackCandidates = 3;
  const std::string user = buildPrompt(context, options)[1].content;
  std::vector<int> shown;
  for (int i = 0; i < 20; ++i) {
    if (user.find(fmt::format("marker-{:02}-end", i)) != std::string::npos) shown.push_back(i);
  }
  EXPECT_EQ(shown, (std::vector<int>{2, 18, 19})) << user;
  EXPECT_NE(user.find("3 of 20 shown"), std::string::npos) << user;
}

class LlmProposerTest : public ::testing::Test {
 protected:
  LlmConfig config() const {
    LlmConfig c;
    c.baseUrl = server_.baseUrl();
    c.model = "test-model";
    c.maxAttempts = 1;
    c.backoffS = 0.01;
    c.maxBackoffS = 0.01;
    c.timeoutS = 5;
    return c;
  }
  void reply(std::string content) {
    server_.onPost([content](const httplib::Request&, httplib::Response& res, int) {
      res.set_content(completionJson(content), "application/json");
    });
  }

  FakeLlmServer server_;
  FakeProposer fallback_;
  core::Topology topo_ = preset("dgx-a100x4");
  std::vector<CandidateRecord> history_;
};

TEST_F(LlmProposerTest, ProposesTheProgramsOfTheReply) {
  reply(
      "Two ideas.\n\n```ofl\nallgather ring_a\n  allgather all by ring\n```\n\n"
      "```ofl\nallgather hier_b\n  for g in gpus: allgather rail(g) by ring\n  for n in nodes: allgather node(n) by "
      "direct\n```\n");
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 8, history_, {}};
  const std::vector<Candidate> got = proposer.propose(context);

  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].text, "allgather ring_a\n  allgather all by ring\n");
  EXPECT_EQ(got[1].text,
            "allgather hier_b\n  for g in gpus: allgather rail(g) by ring\n  for n in nodes: allgather node(n) by "
            "direct\n");
  EXPECT_EQ(got[0].origin, "llm");
  EXPECT_EQ(got[1].origin, "llm");
  EXPECT_EQ(fallback_.calls, 0);

  // One request, carrying the prompt buildPrompt makes.
  const auto seen = server_.seen();
  ASSERT_EQ(seen.size(), 1u);
  const nlohmann::json body = nlohmann::json::parse(seen[0].body);
  const auto expected = buildPrompt(context, {});
  ASSERT_EQ(body.at("messages").size(), expected.size());
  EXPECT_EQ(body["messages"][0].at("content"), expected[0].content);
  EXPECT_EQ(body["messages"][1].at("content"), expected[1].content);
  EXPECT_NE(body["messages"][0]["content"].get<std::string>().find("# The OptiFlow language"), std::string::npos);
}

TEST_F(LlmProposerTest, MarksRepairsOfFailedCandidates) {
  history_ = {okRecord("r0c0", "ring_all", kMiB, 150, 100, 120), failedRecord("r0c1", "broken")};
  reply(
      "```ofl\nallgather broken\n  for g in gpus: allgather rail(g) by ring\n```\n"
      "```ofl\nallgather fresh\n  allgather all by pat\n```\n");
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 1, 8, history_, {0}};
  const std::vector<Candidate> got = proposer.propose(context);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].origin, "llm-repair:r0c1");
  EXPECT_EQ(got[1].origin, "llm");
}

TEST_F(LlmProposerTest, CapsAtMaxCandidates) {
  std::string content;
  for (int i = 0; i < 5; ++i) content += fmt::format("```ofl\nallgather p{}\n  allgather all by ring\n```\n", i);
  reply(content);
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 3, history_, {}};
  const std::vector<Candidate> got = proposer.propose(context);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].text, "allgather p2\n  allgather all by ring\n");
}

TEST_F(LlmProposerTest, NoRequestWhenNoCandidatesAreWanted) {
  reply("```ofl\nallgather p\n  allgather all by ring\n```\n");
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 0, history_, {}};
  EXPECT_TRUE(proposer.propose(context).empty());
  EXPECT_EQ(server_.calls(), 0);
  EXPECT_EQ(fallback_.calls, 0);
}

TEST_F(LlmProposerTest, FailedRequestFallsBackAtOnce) {
  server_.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.status = 500;
    res.set_content("internal error", "text/plain");
  });
  LogCapture logs;
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 2, history_, {}};
  const std::vector<Candidate> got = proposer.propose(context);
  EXPECT_EQ(fallback_.calls, 1);
  ASSERT_EQ(got.size(), 2u) << "capped at maxCandidates";
  EXPECT_EQ(got[0].origin, "fake:1");
  EXPECT_EQ(got[1].origin, "fake:2");
  EXPECT_EQ(server_.calls(), 1);
  EXPECT_EQ(logs.countLines("using the fake proposer for this round"), 1) << logs.text();
  EXPECT_NE(logs.text().find("HTTP 500"), std::string::npos) << logs.text();
}

TEST_F(LlmProposerTest, AReplyWithoutProgramsIsRepairedOnceInTheSameRound) {
  server_.onPost([](const httplib::Request& req, httplib::Response& res, int call) {
    // The second request carries the model's first reply and the rule it missed.
    const bool repair = req.body.find("held no program") != std::string::npos;
    res.set_content(completionJson(call == 1 || !repair ? "Sure! Here is my idea in words."
                                                        : "```ofl\nallgather fixed\n  allgather all by ring\n```"),
                    "application/json");
  });
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 8, history_, {}};
  const std::vector<Candidate> got = proposer.propose(context);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].origin, "llm");
  EXPECT_EQ(server_.calls(), 2);
  EXPECT_EQ(fallback_.calls, 0);
  const nlohmann::json second = nlohmann::json::parse(server_.seen().at(1).body);
  const nlohmann::json& messages = second.at("messages");
  ASSERT_GE(messages.size(), 4u);
  EXPECT_EQ(messages[messages.size() - 2].at("role"), "assistant");
  EXPECT_EQ(messages[messages.size() - 2].at("content"), "Sure! Here is my idea in words.");
}

TEST_F(LlmProposerTest, ARoundWithoutProgramsIsNeverEmpty) {
  // An empty round would end the loop ("the proposer has nothing new"); the fallback proposes instead.
  reply("I am sorry, I cannot write programs in that language.");
  LogCapture logs;
  LlmProposer proposer(LlmClient(config()), fallback_);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 8, history_, {}};
  EXPECT_EQ(proposer.propose(context).size(), 3u);
  EXPECT_EQ(server_.calls(), 2) << "the reply and one repair request";
  EXPECT_EQ(fallback_.calls, 1);
  EXPECT_EQ(logs.countLines("no program in the model's reply, twice; using the fake proposer"), 1) << logs.text();

  // A usable reply is used as it is.
  reply("```ofl\nallgather back\n  allgather all by ring\n```");
  const std::vector<Candidate> good = proposer.propose(context);
  ASSERT_EQ(good.size(), 1u);
  EXPECT_EQ(good[0].origin, "llm");
  EXPECT_EQ(server_.calls(), 3);
  EXPECT_EQ(fallback_.calls, 1);
}

TEST_F(LlmProposerTest, AnUnreachableModelIsAskedOnlyEveryFewRounds) {
  LlmConfig c = config();
  c.baseUrl = fmt::format("http://127.0.0.1:{}/v1", unusedPort());
  LlmProposerOptions options;
  options.silentRoundsBeforeBackoff = 2;
  options.reprobeEveryRounds = 3;
  LogCapture logs;
  LlmProposer proposer(LlmClient(c), fallback_, options);
  const ProposalContext context{topo_, core::Collective::AllGather, {kMiB}, 0, 8, history_, {}};
  for (int round = 0; round < 8; ++round) EXPECT_EQ(proposer.propose(context).size(), 3u) << round;
  EXPECT_EQ(fallback_.calls, 8);
  // Asked in rounds 1 and 2, then every third round: 5 and 8.
  EXPECT_EQ(logs.countLines("no reply from the model"), 4) << logs.text();
  EXPECT_EQ(logs.countLines("asked again every 3 rounds"), 4) << logs.text();
}

}  // namespace
}  // namespace optiflow::synth
