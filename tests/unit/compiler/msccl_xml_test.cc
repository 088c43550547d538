#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "optiflow/compiler/msccl_xml.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/schedule_json.h"

namespace {

using namespace optiflow;
using core::MscclDialect;
using core::Schedule;
using core::StepOp;
using core::StepRef;

namespace fs = std::filesystem;

std::string readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t countOf(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

struct Expected {
  MscclDialect dialect;
  core::Collective collective;
  int nRanks;
};

const std::map<std::string, Expected>& samples() {
  using C = core::Collective;
  static const std::map<std::string, Expected> m = {
      {"ag-8gpu-ll128-ndv4.xml", {MscclDialect::New, C::AllGather, 8}},
      {"ag-16gpu-ll-allpairs-mi250.xml", {MscclDialect::New, C::AllGather, 16}},
      {"ag-32gpu-simple-2node-teccl.xml", {MscclDialect::New, C::AllGather, 32}},
      {"ar-8gpu-ll-allpairs-scratch-ndv4.xml", {MscclDialect::New, C::AllReduce, 8}},
      {"ar-8gpu-ll128-ring-ndv4.xml", {MscclDialect::New, C::AllReduce, 8}},
      {"ar-8gpu-ll-1shot-outofplace-mi300.xml", {MscclDialect::New, C::AllReduce, 8}},
      {"ar-8gpu-simple-ndv5.xml", {MscclDialect::New, C::AllReduce, 8}},
      {"ar-4gpu-simple-hier-scratch-ncv4.xml", {MscclDialect::New, C::AllReduce, 4}},
      {"a2a-8gpu-ll-mi300.xml", {MscclDialect::New, C::AllToAll, 8}},
      {"a2a-32gpu-ll128-2node-hier.xml", {MscclDialect::New, C::AllToAll, 32}},
      {"old-rt-ar-8gpu-ll-scratch.xml", {MscclDialect::OldRuntime, C::AllReduce, 8}},
      {"old-ar-8gpu-ll128-ring.xml", {MscclDialect::Old, C::AllReduce, 8}},
      {"old-ar-8gpu-simple-ndv2.xml", {MscclDialect::Old, C::AllReduce, 8}},
      {"old-custom-24gpu-alltonext.xml", {MscclDialect::Old, C::Custom, 24}},
  };
  return m;
}

fs::path samplesDir() { return fs::path(OPTIFLOW_SAMPLES_DIR); }

Schedule importSample(const std::string& name) {
  const fs::path p = samplesDir() / name;
  auto r = compiler::importMscclXml(readFile(p), p.string());
  EXPECT_TRUE(r.ok()) << r.error().str();
  return r.ok() ? *r : Schedule{};
}

TEST(MscclXmlSamples, AllFourteenImportAndRoundTripLosslessly) {
  if (!fs::is_directory(samplesDir())) GTEST_SKIP() << "no samples at " << samplesDir();
  int seen = 0;
  for (const auto& [name, exp] : samples()) {
    SCOPED_TRACE(name);
    const fs::path p = samplesDir() / name;
    ASSERT_TRUE(fs::exists(p));
    const std::string text = readFile(p);
    auto r = compiler::importMscclXml(text, p.string());
    ASSERT_TRUE(r.ok()) << r.error().str();
    const Schedule& s = *r;
    ++seen;
    EXPECT_EQ(s.dialect, exp.dialect);
    EXPECT_EQ(s.collective, exp.collective);
    EXPECT_EQ(s.nRanks, exp.nRanks);
    ASSERT_EQ(s.ranks.size(), static_cast<std::size_t>(exp.nRanks));
    // Counts as in the file.
    std::size_t tbs = 0;
    std::size_t copies = 0;
    std::size_t withDep = 0;
    for (const auto& rp : s.ranks) {
      tbs += rp.threadBlocks.size();
      copies += rp.localCopies.size();
      for (const auto& tb : rp.threadBlocks) {
        for (const auto& st : tb.steps) withDep += st.deps.size();
      }
    }
    EXPECT_EQ(countOf(text, "<gpu "), s.ranks.size());
    EXPECT_EQ(countOf(text, "<tb "), tbs);
    EXPECT_EQ(countOf(text, "<step "), core::totalSteps(s));
    EXPECT_EQ(countOf(text, "<copy "), copies);
    EXPECT_EQ(countOf(text, "<step ") - countOf(text, "depid=\"-1\""), withDep);
    EXPECT_EQ(countOf(text, "hasdep=\"1\""), [&] {
      std::size_t n = 0;
      for (const auto& rp : s.ranks)
        for (const auto& tb : rp.threadBlocks)
          for (const auto& st : tb.steps) n += st.hasDep ? 1 : 0;
      return n;
    }());

    // Real files that run on their runtime fit its limits.
    EXPECT_EQ(compiler::checkMscclLimits(s), std::vector<std::string>{});

    // XML round trip in the file's own dialect.
    const std::string xml = compiler::exportMscclXml(s);
    auto again = compiler::importMscclXml(xml, "<export>");
    ASSERT_TRUE(again.ok()) << again.error().str();
    EXPECT_TRUE(*again == s);
    EXPECT_EQ(countOf(xml, "<step "), countOf(text, "<step "));

    // JSON round trip.
    auto fromJson = core::parseScheduleJson(core::scheduleToJson(s), "<json>");
    ASSERT_TRUE(fromJson.ok()) << fromJson.error().str();
    EXPECT_TRUE(*fromJson == s);
  }
  EXPECT_EQ(seen, 14);
}

TEST(MscclXmlSamples, SpecialFeaturesAreKept) {
  if (!fs::is_directory(samplesDir())) GTEST_SKIP() << "no samples at " << samplesDir();
  const Schedule teccl = importSample("ag-32gpu-simple-2node-teccl.xml");
  EXPECT_EQ(teccl.maxBytes, 100000000000ULL);
  EXPECT_EQ(teccl.minBytes, 1024u);
  ASSERT_TRUE(teccl.redop.has_value());
  EXPECT_EQ(*teccl.redop, "nop");
  ASSERT_EQ(teccl.ranks[0].localCopies.size(), 2u);
  EXPECT_EQ(teccl.ranks[0].localCopies[1], (core::LocalCopy{1, 1}));
  EXPECT_TRUE(teccl.inPlace);
  EXPECT_FALSE(teccl.outOfPlace);
  // <step s="1" ... depid="2" deps="1" hasdep="0"/> of gpu 0 tb 0.
  EXPECT_EQ(teccl.ranks[0].threadBlocks[0].steps[1].deps, (std::vector<StepRef>{{2, 1}}));

  const Schedule custom = importSample("old-custom-24gpu-alltonext.xml");
  EXPECT_EQ(custom.collective, core::Collective::Custom);
  EXPECT_EQ(custom.customKind, "pipeline-forward");
  EXPECT_EQ(custom.ranks[0].outputChunks, 0);
  EXPECT_EQ(custom.ranks[23].inputChunks, 0);

  const Schedule oldRt = importSample("old-rt-ar-8gpu-ll-scratch.xml");
  EXPECT_EQ(oldRt.minBytes, 8u);
  EXPECT_EQ(oldRt.maxBytes, 409600u);
  EXPECT_TRUE(oldRt.inPlace);
  EXPECT_FALSE(oldRt.outOfPlace);

  const Schedule hier = importSample("a2a-32gpu-ll128-2node-hier.xml");
  EXPECT_EQ(hier.nChannels, 6);
  EXPECT_EQ(hier.maxBytes, 0u);
  const Schedule ncv4 = importSample("ar-4gpu-simple-hier-scratch-ncv4.xml");
  EXPECT_NE(ncv4.ranks[0].scratchChunks, ncv4.ranks[1].scratchChunks);

  const Schedule ag = importSample("ag-8gpu-ll128-ndv4.xml");
  EXPECT_EQ(ag.ranks[0].inputChunks, 0);
  EXPECT_EQ(ag.protocol, core::Protocol::LL128);
}

TEST(MscclXmlSamples, ExportInEveryDialectReimports) {
  if (!fs::is_directory(samplesDir())) GTEST_SKIP() << "no samples at " << samplesDir();
  const Schedule s = importSample("ar-8gpu-ll-1shot-outofplace-mi300.xml");
  for (MscclDialect d : {MscclDialect::New, MscclDialect::OldRuntime, MscclDialect::Old}) {
    const std::string xml = compiler::exportMscclXml(s, d);
    auto r = compiler::importMscclXml(xml, "<x>");
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->dialect, d);
    EXPECT_EQ(r->ranks, s.ranks);
    EXPECT_EQ(xml.find("outofplace") != std::string::npos, d == MscclDialect::New);
    EXPECT_EQ(xml.find("minBytes") != std::string::npos, d != MscclDialect::Old);
  }
}

TEST(MscclXmlExport, DialectSpellingsAndExtensions) {
  Schedule s = core::fixtures::ringReduceScatter({.nRanks = 4});
  s.dialect = MscclDialect::New;
  EXPECT_NE(compiler::exportMscclXml(s).find(R"(coll="reducescatter")"), std::string::npos);
  EXPECT_NE(compiler::exportMscclXml(s, MscclDialect::OldRuntime).find(R"(coll="reduce_scatter")"), std::string::npos);
  EXPECT_NE(compiler::exportMscclXml(s, MscclDialect::Old).find(R"(coll="reduce_scatter")"), std::string::npos);

  // No declaration, one element per line: the runtime's reader needs both.
  const std::string xml = compiler::exportMscclXml(s);
  EXPECT_EQ(xml.rfind("<algo ", 0), 0u);
  EXPECT_EQ(xml.find("<?xml"), std::string::npos);

  Schedule b = core::fixtures::ringAllGather({.nRanks = 4});
  b.collective = core::Collective::Broadcast;
  b.root = 3;
  b.nThreads = 256;
  b.name = "a<b & \"c\"\n";
  const std::string bx = compiler::exportMscclXml(b);
  EXPECT_NE(bx.find(R"(root="3")"), std::string::npos);
  EXPECT_NE(bx.find(R"(nthreads="256")"), std::string::npos);
  auto back = compiler::importMscclXml(bx, "<b>");
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(*back, b);

  Schedule c = b;
  c.collective = core::Collective::Custom;
  c.customKind = "alltonext";  // differs from the name: written as our customkind extension
  auto cb = compiler::importMscclXml(compiler::exportMscclXml(c), "<c>");
  ASSERT_TRUE(cb.ok()) << cb.error().str();
  EXPECT_EQ(*cb, c);
}

// Written to a stream the text is the same, in pieces of about a MiB (this one is several).
TEST(MscclXmlExport, WrittenARankAtATimeIsTheSameText) {
  const Schedule s = core::fixtures::ringAllGather({.nRanks = 64, .channels = 8});
  const std::string xml = compiler::exportMscclXml(s);
  EXPECT_GT(xml.size(), std::size_t{3} << 20);
  std::ostringstream written;
  compiler::writeMscclXml(s, written);
  EXPECT_EQ(written.str(), xml);
}

TEST(MscclXmlExport, MultiDependencyStepsBecomeNopChains) {
  Schedule s;
  s.name = "deps";
  s.nRanks = 2;
  s.ranks.resize(2);
  s.ranks[1].rank = 1;
  auto& rp = s.ranks[0];
  auto step = [](StepOp op, std::vector<StepRef> deps = {}) {
    core::Step st;
    st.op = op;
    st.srcOff = 0;
    st.dstOff = 0;
    st.deps = std::move(deps);
    return st;
  };
  core::ThreadBlock t0{.id = 0, .sendPeer = 1, .recvPeer = -1, .channel = 0, .steps = {}};
  t0.steps = {step(StepOp::Send), step(StepOp::Send)};
  core::ThreadBlock t1{.id = 1, .sendPeer = -1, .recvPeer = 1, .channel = 0, .steps = {}};
  t1.steps = {step(StepOp::Recv)};
  core::ThreadBlock t2{.id = 2, .sendPeer = -1, .recvPeer = -1, .channel = 0, .steps = {}};
  // step 0 waits on three steps; step 1 waits on step 0 of its own block (which moves to index 2).
  t2.steps = {step(StepOp::Copy, {{0, 1}, {1, 0}, {0, 0}}), step(StepOp::Reduce, {{2, 0}})};
  core::ThreadBlock t3{.id = 3, .sendPeer = -1, .recvPeer = -1, .channel = 0, .steps = {}};
  t3.steps = {step(StepOp::Copy, {{2, 1}})};
  rp.threadBlocks = {t0, t1, t2, t3};

  const std::string xml = compiler::exportMscclXml(s);
  std::ostringstream written;  // a rank at a time, expanded on its own
  compiler::writeMscclXml(s, written);
  EXPECT_EQ(written.str(), xml);
  auto r = compiler::importMscclXml(xml, "<deps>");
  ASSERT_TRUE(r.ok()) << r.error().str() << "\n" << xml;
  const auto& tbs = r->ranks[0].threadBlocks;
  ASSERT_EQ(tbs[2].steps.size(), 4u) << xml;
  EXPECT_EQ(tbs[2].steps[0].op, StepOp::Nop);
  EXPECT_EQ(tbs[2].steps[0].deps, (std::vector<StepRef>{{0, 1}}));
  EXPECT_EQ(tbs[2].steps[0].count, 0);
  EXPECT_EQ(tbs[2].steps[1].op, StepOp::Nop);
  EXPECT_EQ(tbs[2].steps[1].deps, (std::vector<StepRef>{{1, 0}}));
  EXPECT_EQ(tbs[2].steps[2].op, StepOp::Copy);
  EXPECT_EQ(tbs[2].steps[2].deps, (std::vector<StepRef>{{0, 0}}));
  EXPECT_EQ(tbs[2].steps[3].op, StepOp::Reduce);
  EXPECT_EQ(tbs[2].steps[3].deps, (std::vector<StepRef>{{2, 2}}));  // renumbered
  EXPECT_EQ(tbs[3].steps[0].deps, (std::vector<StepRef>{{2, 3}}));  // renumbered from another block
  // The targets of the moved dependencies publish their completion.
  EXPECT_TRUE(tbs[0].steps[1].hasDep);
  EXPECT_TRUE(tbs[1].steps[0].hasDep);
  EXPECT_TRUE(tbs[0].steps[0].hasDep);
  // Single-dependency steps are untouched, hasdep included (it was never set in this hand-made schedule).
  EXPECT_FALSE(tbs[2].steps[2].hasDep);
  EXPECT_EQ(tbs[0].steps.size(), 2u);
  EXPECT_EQ(countOf(xml, "type=\"nop\""), 2u);
  // Already single-dependency: the export is a fixed point.
  EXPECT_EQ(compiler::exportMscclXml(*r), xml);
}

// A small new-dialect document, one element per line, to plant errors at known lines.
std::string smallXml(const std::string& stepLine, const std::string& algoExtra = "",
                     const std::string& gpu1 = R"(  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">)") {
  return "<!-- test -->\n"                                                                                // 1
         R"(<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" )"  // 2
         R"(inplace="0" outofplace="1" minBytes="0" maxBytes="0")" +
         algoExtra + ">\n" +
         R"(  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">)"
         "\n"  // 3
         R"(    <tb id="0" send="1" recv="-1" chan="0">)"
         "\n"  // 4
         "      " +
         stepLine + "\n" +  // 5
         "    </tb>\n"      // 6
         "  </gpu>\n" +     // 7
         gpu1 +
         "\n" +        // 8
         "  </gpu>\n"  // 9
         "</algo>";    // 10, no final newline
}

const std::string kGoodStep =
    R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>)";

std::string withStep(const std::string& from, const std::string& to) {
  std::string s = kGoodStep;
  s.replace(s.find(from), from.size(), to);
  return s;
}

void expectError(const std::string& xml, int line, const std::string& text) {
  auto r = compiler::importMscclXml(xml, "t.xml");
  ASSERT_FALSE(r.ok()) << xml;
  EXPECT_EQ(r.error().file, "t.xml");
  EXPECT_EQ(r.error().line, line) << r.error().str();
  EXPECT_GT(r.error().column, 0) << r.error().str();
  EXPECT_NE(r.error().message.find(text), std::string::npos) << r.error().str();
}

TEST(MscclXmlImport, SmallDocumentParses) {
  auto r = compiler::importMscclXml(smallXml(kGoodStep), "t.xml");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->ranks[0].threadBlocks[0].steps.size(), 1u);
  EXPECT_TRUE(r->ranks[1].threadBlocks.empty());
}

TEST(MscclXmlImport, MalformedFilesPointAtTheProblem) {
  // pugixml notices an unterminated tag where the next one starts.
  expectError(smallXml("<step s=\"0\""), 6, "malformed XML");
  expectError(smallXml(kGoodStep + "</step>"), 5, "malformed XML");
  expectError(smallXml(withStep(R"(cnt="1")", R"(cnt="one")")), 5, "attribute 'cnt' of <step>: expected an integer");
  expectError(smallXml(withStep(R"(cnt="1")", R"(cnt="1.0")")), 5, "found \"1.0\"");
  expectError(smallXml(withStep(R"(type="s")", R"(type="send")")), 5, "unknown step type \"send\"");
  expectError(smallXml(withStep(R"(srcbuf="i")", R"(srcbuf="x")")), 5, "unknown buffer \"x\"");
  expectError(smallXml(withStep(R"(s="0")", R"(s="1")")), 5, "numbered 0..n-1 in order");
  expectError(smallXml(withStep(R"( hasdep="0")", "")), 5, "missing the required attribute 'hasdep'");
  expectError(smallXml(withStep(R"(hasdep="0")", R"(hasdep="2")")), 5, "'hasdep'");
  expectError(smallXml(withStep(R"(hasdep="0")", R"(hasdep="0" hasDep="1")")), 5, "unknown attribute 'hasDep'");
  expectError(smallXml(withStep(R"(depid="-1")", R"(depid="3")")), 5, "names no step");
  expectError(smallXml(withStep(R"(cnt="1")", R"(cnt="99999999999")")), 5, "expected an integer in [0, 1048576]");
  expectError(smallXml(kGoodStep, "", R"(  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">)"), 8,
              "duplicate gpu id 0 (first defined at line 3)");
  expectError(smallXml(kGoodStep, "", R"(  <gpu id="2" i_chunks="1" o_chunks="2" s_chunks="0">)"), 8,
              "gpu id 2 is out of range");
  expectError(smallXml(kGoodStep, "", R"(  <gpu id="1" i_chunks="2000000000" o_chunks="2" s_chunks="0">)"), 8,
              "i_chunks");
  expectError(smallXml(kGoodStep, "", R"(  <gpu id="1" i_chunks="1" o_chunks="2">)"), 8,
              "missing the required attribute 's_chunks'");
  expectError(smallXml(kGoodStep, "",
                       R"(  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0"><tb id="0" )"
                       R"(send="-1" recv="-1" chan="0"/><tb id="0" send="-1" recv="-1" chan="0"/>)"),
              8, "duplicate thread block id 0 on gpu 1");
  expectError(smallXml(kGoodStep, "", R"(  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0"><tbx/>)"), 8,
              "unexpected element <tbx>");
  expectError(smallXml(kGoodStep, R"( extra="1")"), 2, "unknown attribute 'extra' on <algo>");
  expectError(smallXml(kGoodStep, R"( root="5")"), 2, "'root'");

  // ngpus mismatch: only gpu 0 present.
  std::string one = smallXml(kGoodStep);
  one.replace(one.find("  <gpu id=\"1\""), one.find("</algo>") - one.find("  <gpu id=\"1\""), "");
  expectError(one, 2, "ngpus is 2 but the file has 1 <gpu> elements (gpu id 1 is missing)");

  // The new dialect needs minBytes/maxBytes.
  std::string noMin = smallXml(kGoodStep);
  noMin.replace(noMin.find(R"( minBytes="0")"), 13, "");
  expectError(noMin, 2, "missing the required attribute 'minBytes'");

  expectError("<foo/>", 1, "expected <algo> as the root element, found <foo>");
  expectError("\n\n<algo", 3, "malformed XML");
  expectError(smallXml(kGoodStep) + "<algo/>", 10, "a second top-level element");
}

TEST(MscclXmlImport, LineNumbersSurviveCrLf) {
  std::string xml = smallXml(withStep(R"(type="s")", R"(type="zz")"));
  std::string crlf;
  for (char c : xml) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  expectError(crlf, 5, "unknown step type \"zz\"");
}

TEST(MscclXmlImport, HasDepIsKeptAsWritten) {
  // hasdep="1" on a step nobody waits for, and a dependency on a step with hasdep="0": both kept.
  auto r = compiler::importMscclXml(smallXml(withStep(R"(hasdep="0")", R"(hasdep="1")")), "t.xml");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_TRUE(r->ranks[0].threadBlocks[0].steps[0].hasDep);
}

TEST(MscclLimits, ReportsRuntimeLimits) {
  Schedule s = core::fixtures::ringAllGather({.nRanks = 4});
  EXPECT_TRUE(compiler::checkMscclLimits(s).empty());
  s.nChannels = 40;
  auto& tb = s.ranks[0].threadBlocks[0];
  while (tb.steps.size() < 70) tb.steps.push_back(tb.steps.back());
  tb.steps[0].count = 80;
  auto v = compiler::checkMscclLimits(s);
  auto has = [&](const std::string& needle) {
    for (const auto& m : v)
      if (m.find(needle) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("MAXCHANNELS")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("MSCCL_MAX_NUM_STEPS")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("MSCCL_MAX_COUNT")) << ::testing::PrintToString(v);
  s.dialect = MscclDialect::Old;  // the old runtime allows 256 steps
  EXPECT_FALSE([&] {
    for (const auto& m : compiler::checkMscclLimits(s))
      if (m.find("MSCCL_MAX_NUM_STEPS") != std::string::npos) return true;
    return false;
  }());
}

TEST(ScheduleIo, LoadsEitherFormatByContent) {
  const fs::path dir = fs::temp_directory_path() / "optiflow_schedule_io_test";
  fs::create_directories(dir);
  const Schedule s = core::fixtures::ringAllGather({.nRanks = 4, .channels = 2});
  const std::string jsonPath = (dir / "ring.sched").string();  // extension says nothing
  const std::string xmlPath = (dir / "ring.xml").string();
  ASSERT_FALSE(compiler::saveSchedule(s, jsonPath, compiler::ScheduleFormat::Json).has_value());
  ASSERT_FALSE(compiler::saveSchedule(s, xmlPath).has_value());
  EXPECT_EQ(readFile(xmlPath).rfind("<algo", 0), 0u);
  auto j = compiler::loadSchedule(jsonPath);
  ASSERT_TRUE(j.ok()) << j.error().str();
  EXPECT_EQ(*j, s);
  auto x = compiler::loadSchedule(xmlPath);
  ASSERT_TRUE(x.ok()) << x.error().str();
  EXPECT_EQ(*x, s);
  EXPECT_EQ(compiler::formatSchedule(s, compiler::ScheduleFormat::Json), core::scheduleToJson(s));

  auto missing = compiler::loadSchedule((dir / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos) << missing.error().str();

  { std::ofstream(dir / "junk.txt") << "\n  hello"; }
  auto junk = compiler::loadSchedule((dir / "junk.txt").string());
  ASSERT_FALSE(junk.ok());
  EXPECT_EQ(junk.error().line, 2);
  EXPECT_EQ(junk.error().column, 3);
  EXPECT_NE(junk.error().message.find("found 'h'"), std::string::npos) << junk.error().str();

  auto empty = compiler::parseSchedule("  \n", "e");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ScheduleIo, ExampleFilesLoad) {
  const fs::path dir = fs::path(OPTIFLOW_SOURCE_DIR) / "examples" / "schedules";
  if (!fs::is_directory(dir)) GTEST_SKIP();
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    SCOPED_TRACE(e.path().string());
    auto r = compiler::loadSchedule(e.path().string());
    ASSERT_TRUE(r.ok()) << r.error().str();
    ++n;
  }
  EXPECT_GT(n, 0);
}

}  // namespace
