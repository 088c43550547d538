// Programs out of model replies: the fence styles models use, bare programs in prose, and hostile input.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/synth/reply_parser.h"

namespace optiflow::synth {
namespace {

using Programs = std::vector<std::string>;

TEST(ReplyParser, FencedBlockWithOflTagAndProse) {
  const std::string reply =
      "Here is a ring, which is bandwidth-optimal:\n"
      "\n"
      "```ofl\n"
      "allgather ring_all\n"
      "  allgather all by ring\n"
      "```\n"
      "\n"
      "It uses every link once per step.\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"allgather ring_all\n  allgather all by ring\n"});
}

TEST(ReplyParser, SeveralFencesWithAndWithoutTags) {
  const std::string reply =
      "First:\n```\nallgather a\n  allgather all by ring\n```\n"
      "Second:\n```optiflow\nallgather b\n  allgather all by direct\n```\n"
      "Third:\n~~~text\nallgather c\n  allgather all by bruck\n~~~\n"
      "Fourth:\n```python\nallgather d\n  allgather all by pat\n```\n";
  EXPECT_EQ(extractPrograms(reply),
            (Programs{"allgather a\n  allgather all by ring\n", "allgather b\n  allgather all by direct\n",
                      "allgather c\n  allgather all by bruck\n", "allgather d\n  allgather all by pat\n"}));
}

TEST(ReplyParser, OtherLanguageBlocksWithoutAProgramAreIgnored) {
  const std::string reply =
      "Run it with:\n```bash\noptiflow compile prog.ofl --topo dgx-a100x4\n```\n"
      "```json\n{\"not\": \"a program\"}\n```\n"
      "```ofl\nreducescatter rs\n  reducescatter all by ring\n```\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"reducescatter rs\n  reducescatter all by ring\n"});
}

TEST(ReplyParser, OflBlockIsKeptEvenIfItDoesNotLookLikeAProgram) {
  // The parser's error on it goes back to the model, which is more useful than silently dropping it.
  EXPECT_EQ(extractPrograms("```ofl\nallgaher typo\n  allgather all by ring\n```"),
            Programs{"allgaher typo\n  allgather all by ring\n"});
}

TEST(ReplyParser, CommentsAndBlankLinesInsideAProgramAreKept) {
  const std::string reply =
      "```ofl\n"
      "# rails first, then NVSwitch\n"
      "allgather hier\n"
      "  for g in gpus: allgather rail(g) by ring\n"
      "\n"
      "  # then inside each node\n"
      "  for n in nodes: allgather node(n) by direct\n"
      "```\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"# rails first, then NVSwitch\n"
                                             "allgather hier\n"
                                             "  for g in gpus: allgather rail(g) by ring\n"
                                             "\n"
                                             "  # then inside each node\n"
                                             "  for n in nodes: allgather node(n) by direct\n"});
}

TEST(ReplyParser, TwoProgramsInOneFenceAreSplit) {
  const std::string reply =
      "```ofl\n"
      "allgather one\n"
      "  allgather all by ring\n"
      "\n"
      "# the second\n"
      "allgather two\n"
      "  allgather all by direct\n"
      "```";
  EXPECT_EQ(extractPrograms(reply), (Programs{"allgather one\n  allgather all by ring\n",
                                              "# the second\nallgather two\n  allgather all by direct\n"}));
}

TEST(ReplyParser, UnindentedBodyIsNotSplit) {
  const std::string program =
      "allgather flat\n"
      "split 2\n"
      "allgather all by ring\n";
  EXPECT_EQ(extractPrograms("```\n" + program + "```\n"), Programs{program});
}

TEST(ReplyParser, IndentedFenceInAListIsDedented) {
  const std::string reply =
      "1. A ring:\n"
      "   ```ofl\n"
      "   allgather listed\n"
      "     allgather all by ring\n"
      "   ```\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"allgather listed\n  allgather all by ring\n"});
}

TEST(ReplyParser, LongerFenceClosesOnlyWithALongEnoughFence) {
  const std::string reply =
      "````ofl\n"
      "allgather quoted\n"
      "  allgather all by ring\n"
      "```\n"
      "  allgather all by direct\n"
      "````\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"allgather quoted\n  allgather all by ring\n```\n"
                                             "  allgather all by direct\n"});
}

TEST(ReplyParser, UnterminatedFenceRunsToTheEnd) {
  EXPECT_EQ(extractPrograms("Sure.\n```ofl\nallgather cut_off\n  allgather all by ring\n  for n in nodes:"),
            Programs{"allgather cut_off\n  allgather all by ring\n  for n in nodes:\n"});
}

TEST(ReplyParser, CrlfLineEndings) {
  EXPECT_EQ(extractPrograms("Here:\r\n```ofl\r\nallgather crlf\r\n  allgather all by ring   \r\n```\r\nDone.\r\n"),
            Programs{"allgather crlf\n  allgather all by ring\n"});
}

TEST(ReplyParser, BareProgramWithProseAround) {
  const std::string reply =
      "I would use a hierarchical algorithm.\n"
      "allgather hier_bare\n"
      "  for g in gpus: allgather rail(g) by ring\n"
      "  for n in nodes: allgather node(n) by direct\n"
      "\n"
      "This keeps the inter-node traffic on one rail per GPU.\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"allgather hier_bare\n"
                                             "  for g in gpus: allgather rail(g) by ring\n"
                                             "  for n in nodes: allgather node(n) by direct\n"});
}

TEST(ReplyParser, SeveralBarePrograms) {
  const std::string reply =
      "allreduce one\n"
      "  allreduce all by ring\n"
      "and\n"
      "allreduce two\n"
      "\n"
      "  allreduce all by recursive_doubling\n"
      "That is all.";
  EXPECT_EQ(extractPrograms(reply), (Programs{"allreduce one\n  allreduce all by ring\n",
                                              "allreduce two\n\n  allreduce all by recursive_doubling\n"}));
}

TEST(ReplyParser, BareProgramWithUnindentedBody) {
  const std::string reply =
      "Program:\n"
      "broadcast flat_tree\n"
      "split 4\n"
      "broadcast all from root by tree\n"
      "For large messages, split more.\n";
  EXPECT_EQ(extractPrograms(reply), Programs{"broadcast flat_tree\nsplit 4\nbroadcast all from root by tree\n"});
}

TEST(ReplyParser, HeaderWithoutBodyInProseIsNotAProgram) {
  EXPECT_TRUE(extractPrograms("You could reduce costs\nby using a tree.\nallgather everything\nthen stop.").empty());
}

TEST(ReplyParser, DuplicatesAreDropped) {
  const std::string program = "allgather same\n  allgather all by ring\n";
  EXPECT_EQ(extractPrograms("```ofl\n" + program + "```\nagain:\n```\n\n" + program + "\n```\n"), Programs{program});
}

TEST(ReplyParser, EmptyAndProseOnlyReplies) {
  EXPECT_TRUE(extractPrograms("").empty());
  EXPECT_TRUE(extractPrograms("\n\n  \r\n").empty());
  EXPECT_TRUE(extractPrograms("I cannot help with that.").empty());
  EXPECT_TRUE(extractPrograms("```ofl\n```").empty());
  EXPECT_TRUE(extractPrograms("```").empty());
  EXPECT_TRUE(extractPrograms("Use `allgather all by ring` inline.").empty());
}

TEST(ReplyParser, HugeInputEndsWithAtMostTheCap) {
  // Many fence openers, long lines and header-like lines (quadratic work would take minutes here, and ctest's
  // timeout would end it). That the work is linear is measured by bench/compile_bench.cc (BM_ExtractPrograms, with
  // its complexity fit), not by a wall-clock limit here.
  std::string reply;
  for (int i = 0; i < 200000; ++i) reply += "```\nallgather x\n";
  reply += std::string(4u << 20, 'a');
  const Programs programs = extractPrograms(reply);
  EXPECT_LE(programs.size(), 256u);
}

TEST(ReplyParser, ManyDistinctProgramsAreCapped) {
  std::string reply;
  for (int i = 0; i < 1000; ++i)
    reply += "```ofl\nallgather p" + std::to_string(i) + "\n  allgather all by ring\n```\n";
  const Programs programs = extractPrograms(reply);
  ASSERT_EQ(programs.size(), 256u);
  EXPECT_EQ(programs.front(), "allgather p0\n  allgather all by ring\n");
}

}  // namespace
}  // namespace optiflow::synth
