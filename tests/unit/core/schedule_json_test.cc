#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "optiflow/core/fixtures.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/schedule_json.h"

namespace {

using namespace optiflow::core;

// A schedule that sets every field away from its default.
Schedule everyField() {
  Schedule s;
  s.name = "weird \"name\" \\ with \xc3\xa9 and\ttab";
  s.collective = Collective::Custom;
  s.customKind = "alltonext";
  s.root = 2;
  s.protocol = Protocol::LL128;
  s.nRanks = 3;
  s.nChannels = 6;
  s.chunksPerLoop = 12;
  s.inPlace = true;
  s.outOfPlace = false;
  s.minBytes = 17;
  s.maxBytes = 100000000000ULL;
  s.redop = "nop";
  s.nThreads = 512;
  s.dialect = MscclDialect::OldRuntime;
  for (int r = 0; r < 3; ++r) {
    RankProgram rp;
    rp.rank = r;
    rp.inputChunks = 4;
    rp.outputChunks = r == 0 ? 0 : 12;
    rp.scratchChunks = r;
    rp.localCopies = {{0, 1}, {3, 2}};
    ThreadBlock a;
    a.id = 0;
    a.sendPeer = (r + 1) % 3;
    a.recvPeer = -1;
    a.channel = 5;
    Step s0;
    s0.op = StepOp::Send;
    s0.srcBuf = BufferKind::Scratch;
    s0.srcOff = 3;
    s0.dstBuf = BufferKind::Input;
    s0.dstOff = -1;
    s0.count = 2;
    s0.hasDep = true;
    a.steps.push_back(s0);
    ThreadBlock b;
    b.id = 7;
    b.sendPeer = -1;
    b.recvPeer = (r + 2) % 3;
    b.channel = 0;
    Step s1;
    s1.op = StepOp::RecvReduceCopySend;
    s1.deps = {{0, 0}, {7, 0}};
    b.steps.push_back(Step{});
    b.steps.push_back(s1);
    ThreadBlock empty;
    empty.id = 3;
    rp.threadBlocks = {a, b, empty};
    s.ranks.push_back(rp);
  }
  return s;
}

TEST(ScheduleJson, RoundTripsEveryFieldAtEveryIndent) {
  const Schedule s = everyField();
  for (int indent : {-1, 0, 1, 2, 4}) {
    const std::string text = scheduleToJson(s, indent);
    auto back = parseScheduleJson(text, "<test>");
    ASSERT_TRUE(back.ok()) << back.error().str() << "\n" << text;
    EXPECT_EQ(*back, s) << "indent " << indent;
  }
}

TEST(ScheduleJson, RoundTripsTheRingFixtures) {
  for (int n : {2, 4, 8}) {
    for (bool inPlace : {false, true}) {
      for (const Schedule& s : {fixtures::ringAllGather({.nRanks = n, .channels = 2, .inPlace = inPlace}),
                                fixtures::ringReduceScatter({.nRanks = n, .channels = 3, .inPlace = inPlace}),
                                fixtures::ringAllReduce({.nRanks = n, .channels = 1, .inPlace = inPlace})}) {
        auto back = parseScheduleJson(scheduleToJson(s), "<ring>");
        ASSERT_TRUE(back.ok()) << back.error().str();
        EXPECT_EQ(*back, s);
      }
    }
  }
}

TEST(ScheduleJson, WritesOneStepPerLineAndReadableNames) {
  const std::string text = scheduleToJson(fixtures::ringAllGather({.nRanks = 4}));
  EXPECT_EQ(text.rfind("{\n \"format\": \"optiflow-schedule\",\n \"version\": 1,", 0), 0u) << text;
  EXPECT_NE(text.find(R"({"op": "send", "src": {"buf": "input", "off": )"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("msccl_dialect": "new")"), std::string::npos);
  // Every step sits on its own line.
  std::size_t lines = 0;
  for (std::size_t p = text.find("{\"op\""); p != std::string::npos; p = text.find("{\"op\"", p + 1)) {
    EXPECT_EQ(text[p - 1], ' ');
    ++lines;
  }
  EXPECT_EQ(lines, totalSteps(fixtures::ringAllGather({.nRanks = 4})));
  // Compact output is a single line.
  EXPECT_EQ(scheduleToJson(fixtures::ringAllGather({.nRanks = 4}), -1).find('\n'), std::string::npos);
}

// A small valid document, one field per line, used to plant errors at known lines.
std::string smallDoc(const std::string& stepLine = R"({"op": "send", "count": 1})", const std::string& extraTop = "") {
  return "{\n"                                         // line 1
         " \"format\": \"optiflow-schedule\",\n"       // 2
         " \"version\": 1,\n"                          // 3
         " \"collective\": \"allgather\",\n"           // 4
         " \"n_ranks\": 2,\n" +                        // 5
         extraTop +                                    // (optional, one line)
         " \"ranks\": [\n"                             // 6
         "  {\"rank\": 0, \"threadblocks\": [\n"       // 7
         "   {\"id\": 0, \"send\": 1, \"steps\": [\n"  // 8
         "    " +
         stepLine +
         "\n"                                       // 9
         "   ]}]},\n"                               // 10
         "  {\"rank\": 1, \"threadblocks\": []}\n"  // 11
         " ]\n"
         "}\n";
}

TEST(ScheduleJson, MinimalDocumentUsesDefaults) {
  auto s = parseScheduleJson(smallDoc(), "small.json");
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->nRanks, 2);
  EXPECT_EQ(s->ranks[0].threadBlocks[0].steps[0].op, StepOp::Send);
  EXPECT_EQ(s->ranks[0].threadBlocks[0].recvPeer, -1);
  EXPECT_EQ(s->protocol, Protocol::Simple);
}

TEST(ScheduleJson, SyntaxErrorsCarryLineAndColumn) {
  std::string doc = smallDoc(R"({"op": "send", "count": 1,})");  // trailing comma on line 9
  auto s = parseScheduleJson(doc, "bad.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().file, "bad.json");
  EXPECT_EQ(s.error().line, 9);
  EXPECT_GT(s.error().column, 20);
  EXPECT_NE(s.error().message.find("JSON syntax error"), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.find("[json.exception"), std::string::npos) << s.error().message;

  auto t = parseScheduleJson("{\n \"format\": \"optiflow-schedule\",\n \"version\": 1\n", "cut.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().line, 4);
}

TEST(ScheduleJson, SchemaErrorsNameThePathAndTheLine) {
  auto s = parseScheduleJson(smallDoc(R"({"op": "sned"})"), "op.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().line, 9);
  EXPECT_EQ(s.error().column, 12);  // the value "sned"
  EXPECT_NE(s.error().message.find("ranks[0].threadblocks[0].steps[0].op"), std::string::npos) << s.error().str();
  EXPECT_NE(s.error().message.find("recv_copy_send"), std::string::npos) << s.error().str();
  EXPECT_NE(s.error().message.find("\"sned\""), std::string::npos) << s.error().str();

  auto c = parseScheduleJson(smallDoc(R"({"op": "send", "count": 1.5})"), "count.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().line, 9);
  EXPECT_NE(c.error().message.find("steps[0].count: expected an integer"), std::string::npos) << c.error().str();
  EXPECT_NE(c.error().message.find("1.5"), std::string::npos) << c.error().str();

  auto d = parseScheduleJson(smallDoc(R"({"op": "send", "deps": [[0]]})"), "deps.json");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("steps[0].deps[0]: expected a pair"), std::string::npos) << d.error().str();
}

TEST(ScheduleJson, RejectsUnknownKeys) {
  auto s = parseScheduleJson(smallDoc(R"({"op": "send", "hasdep": true})"), "k.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().line, 9);
  EXPECT_NE(s.error().message.find("unknown key \"hasdep\""), std::string::npos) << s.error().str();
  EXPECT_NE(s.error().message.find("has_dep"), std::string::npos) << s.error().str();

  auto t = parseScheduleJson(smallDoc(R"({"op": "send"})", " \"colour\": \"red\",\n"), "top.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().line, 6);
  EXPECT_NE(t.error().message.find("colour"), std::string::npos) << t.error().str();
}

TEST(ScheduleJson, VersionAndFormatMismatchesAreClear) {
  std::string doc = smallDoc();
  doc.replace(doc.find("\"version\": 1"), 12, "\"version\": 2");
  auto s = parseScheduleJson(doc, "v2.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().line, 3);
  EXPECT_NE(s.error().message.find("unsupported schedule format version 2"), std::string::npos) << s.error().str();
  EXPECT_NE(s.error().message.find("reads version 1"), std::string::npos) << s.error().str();

  auto f = parseScheduleJson(R"({"format": "msccl", "version": 1})", "f.json");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("expected \"optiflow-schedule\""), std::string::npos) << f.error().str();

  auto n = parseScheduleJson("[1, 2]", "arr.json");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("expected a schedule object"), std::string::npos) << n.error().str();
}

TEST(ScheduleJson, StructuralChecks) {
  std::string doc = smallDoc();
  doc.replace(doc.find("\"n_ranks\": 2"), 12, "\"n_ranks\": 3");
  auto s = parseScheduleJson(doc, "n.json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("n_ranks is 3 but 2 rank programs"), std::string::npos) << s.error().str();

  doc = smallDoc();
  doc.replace(doc.find("{\"rank\": 1"), 10, "{\"rank\": 0");
  auto o = parseScheduleJson(doc, "order.json");
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().line, 11);
  EXPECT_NE(o.error().message.find("ranks[1].rank"), std::string::npos) << o.error().str();

  doc = smallDoc();
  doc.replace(doc.find("\"send\": 1"), 9, "\"send\": 2");
  auto p = parseScheduleJson(doc, "peer.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("threadblocks[0].send: expected an integer in [-1, 1], found 2"), std::string::npos)
      << p.error().str();
}

TEST(ScheduleJson, RejectsHostileNumbersAndNesting) {
  std::string doc = smallDoc();
  doc.replace(doc.find("{\"rank\": 1,"), 11, "{\"rank\": 1, \"input_chunks\": 2000000000,");
  auto s = parseScheduleJson(doc, "big.json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("ranks[1].input_chunks: expected an integer in [0, 1048576]"), std::string::npos)
      << s.error().str();

  std::string deep(200, '[');
  auto d = parseScheduleJson(deep, "deep.json");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("nested deeper"), std::string::npos) << d.error().str();

  auto e = parseScheduleJson("", "empty.json");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("JSON syntax error"), std::string::npos);
}

// Written to a stream the text is the same, in pieces of about a MiB (this one is several), compact or indented.
TEST(ScheduleJson, WrittenInPiecesIsTheSameText) {
  const Schedule s = fixtures::ringAllGather({.nRanks = 64, .channels = 8});
  for (int indent : {-1, 1, 2}) {
    const std::string text = scheduleToJson(s, indent);
    EXPECT_GT(text.size(), std::size_t{3} << 20) << indent;
    std::ostringstream written;
    writeScheduleJson(s, written, indent);
    EXPECT_EQ(written.str(), text) << indent;
  }
}

TEST(ScheduleJson, NeverThrowsOnGarbage) {
  for (std::string_view text : {"{", "}", "nul", "{\"format\": 1}", "\xff\xfe", "{\"a\":\"\\ud800\"}",
                                R"({"format": "optiflow-schedule", "version": 1, "n_ranks": 1, "ranks": [7]})"}) {
    auto r = parseScheduleJson(text, "g.json");
    EXPECT_FALSE(r.ok()) << text;
  }
}

}  // namespace
