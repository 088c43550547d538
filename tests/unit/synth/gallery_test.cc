// The gallery (examples/programs/*.ofl, docs/language.md "Gallery"): every program, on every preset below, parses,
// expands, compiles to a proven schedule at a small and a large size, passes the reference executor (presets of at
// most 16 ranks) and simulates no faster than the lower bound. Programs that cannot apply to a preset are listed in
// kExpectedFailures with the reason, and must fail there with the expected message.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/parser.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/sim/reference_executor.h"
#include "optiflow/sim/simulator.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::synth {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMinPrograms = 18;
constexpr std::uint64_t kSmall = 64ull << 10;   // 64KiB
constexpr std::uint64_t kLarge = 256ull << 20;  // 256MiB
constexpr int kMaxReferenceRanks = 16;          // the reference executor runs on presets up to this many ranks

const std::vector<std::string>& presetNames() {
  static const std::vector<std::string> names = {"dgx-a100", "dgx-a100x2", "dgx-h100x3", "hgx-h200x2", "dgx-a100x4"};
  return names;
}

// A program that does not apply to a preset: where it fails and the text the error must contain.
struct ExpectedFailure {
  std::string_view program;  // file stem
  std::string_view preset;   // "*" = every preset
  Stage stage;
  std::string_view message;
  std::string_view reason;
};

constexpr ExpectedFailure kExpectedFailures[] = {
    {"allgather_recursive_doubling", "dgx-h100x3", Stage::Expand,
     "allgather by recursive_doubling needs a group of a power-of-two size; all has 24 members",
     "3 nodes x 8 GPUs = 24 ranks is not a power of two"},
    {"reducescatter_recursive_halving", "dgx-h100x3", Stage::Expand,
     "reducescatter by recursive_halving needs a group of a power-of-two size; all has 24 members",
     "3 nodes x 8 GPUs = 24 ranks is not a power of two"},
    {"allreduce_recursive_doubling", "dgx-h100x3", Stage::Expand,
     "allreduce by recursive_doubling needs a group of a power-of-two size; all has 24 members",
     "3 nodes x 8 GPUs = 24 ranks is not a power of two"},
    {"allreduce_rabenseifner", "dgx-h100x3", Stage::Expand,
     "allreduce by recursive_halving needs a group of a power-of-two size; all has 24 members",
     "3 nodes x 8 GPUs = 24 ranks is not a power of two"},
};

// Simulating these schedules at kLarge takes 3 to 12 s each (every GPU talks to every other one: ~4000 concurrent
// flows on 24-32 ranks, and the simulator shares every link max-min fairly among them), which alone would triple
// the test's time. They are simulated at kSmall instead (the same checks: ok, not below the bound); the other
// presets simulate them at kLarge.
struct SlowSimulation {
  std::string_view program;
  std::string_view preset;
};

constexpr SlowSimulation kSlowSimulations[] = {
    {"allgather_direct", "dgx-h100x3"},     {"allgather_direct", "dgx-a100x4"}, {"reducescatter_direct", "dgx-h100x3"},
    {"reducescatter_direct", "dgx-a100x4"}, {"allreduce_direct", "dgx-h100x3"}, {"allreduce_direct", "dgx-a100x4"},
    {"alltoall_direct", "dgx-h100x3"},      {"alltoall_direct", "dgx-a100x4"},  {"alltoall_ring", "dgx-h100x3"},
    {"alltoall_ring", "dgx-a100x4"},
};

// Under AddressSanitizer everything runs 20-30x slower; the large-size simulations are covered by the plain build.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

bool slowSimulation(std::string_view program, std::string_view preset) {
  return std::any_of(std::begin(kSlowSimulations), std::end(kSlowSimulations),
                     [&](const SlowSimulation& s) { return s.program == program && s.preset == preset; });
}

const ExpectedFailure* expectedFailure(std::string_view program, std::string_view preset) {
  for (const ExpectedFailure& e : kExpectedFailures) {
    if (e.program == program && (e.preset == "*" || e.preset == preset)) return &e;
  }
  return nullptr;
}

fs::path galleryDir() { return fs::path(OPTIFLOW_SOURCE_DIR) / "examples" / "programs"; }

// The gallery's file stems, sorted (empty when the folder is missing: GalleryFiles.AtLeastEighteen says so).
const std::vector<std::string>& galleryPrograms() {
  static const std::vector<std::string> programs = [] {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(galleryDir(), ec)) {
      if (entry.path().extension() == ".ofl") out.push_back(entry.path().stem().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }();
  return programs;
}

std::string readProgram(const std::string& stem) {
  std::ifstream in(galleryDir() / (stem + ".ofl"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

core::Topology topology(const std::string& preset) {
  auto t = core::presetTopology(preset);
  EXPECT_TRUE(t.ok()) << preset << ": " << (t.ok() ? "" : t.error().str());
  return t.value();
}

bool rooted(core::Collective c) { return c == core::Collective::Broadcast || c == core::Collective::Reduce; }

std::string testName(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

TEST(GalleryFiles, AtLeastEighteen) { EXPECT_GE(galleryPrograms().size(), kMinPrograms) << "in " << galleryDir(); }

// Every file starts with its `#` comment (1 to 3 lines), and every collective has several programs, some of them
// hierarchical (using node(..) or rail(..) groups).
TEST(GalleryFiles, EveryCollectiveHasStandardAndHierarchicalPrograms) {
  std::map<std::string, int> standard;
  std::map<std::string, int> hierarchical;
  for (const std::string& stem : galleryPrograms()) {
    const std::string text = readProgram(stem);
    std::istringstream lines(text);
    std::string line;
    int comments = 0;
    while (std::getline(lines, line) && line.rfind('#', 0) == 0) ++comments;
    EXPECT_GE(comments, 1) << stem << ": no leading # comment";
    EXPECT_LE(comments, 3) << stem << ": the leading comment is longer than 3 lines";
    const dsl::ParseResult parsed = dsl::parseProgram(text, stem + ".ofl");
    ASSERT_TRUE(parsed.ok()) << stem;
    const std::string coll(core::toString(parsed.program->collective));
    EXPECT_EQ(stem.rfind(coll + "_", 0), 0u) << stem << ": the file name does not start with " << coll;
    const bool hier = text.find("node(") != std::string::npos || text.find("rail(") != std::string::npos;
    ++(hier ? hierarchical : standard)[coll];
  }
  for (const char* c : {"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"}) {
    EXPECT_GE(standard[c], 1) << c;
    EXPECT_GE(hierarchical[c], 1) << c;
  }
}

TEST(GalleryFiles, ExpectedFailuresNameRealProgramsAndPresets) {
  const auto& programs = galleryPrograms();
  for (const ExpectedFailure& e : kExpectedFailures) {
    EXPECT_TRUE(std::find(programs.begin(), programs.end(), e.program) != programs.end()) << e.program;
    if (e.preset != "*") {
      const auto& presets = presetNames();
      EXPECT_TRUE(std::find(presets.begin(), presets.end(), e.preset) != presets.end()) << e.preset;
    }
    EXPECT_FALSE(e.reason.empty());
  }
  for (const SlowSimulation& s : kSlowSimulations) {
    EXPECT_TRUE(std::find(programs.begin(), programs.end(), s.program) != programs.end()) << s.program;
  }
}

// docs/language.md's "Gallery" lists every program in its table and quotes at least 6 of them verbatim.
TEST(GalleryFiles, TheDocsListEveryProgramAndQuoteSomeVerbatim) {
  std::ifstream in(fs::path(OPTIFLOW_SOURCE_DIR) / "docs" / "language.md", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::size_t gallery = doc.find("\n## Gallery\n");
  ASSERT_NE(gallery, std::string::npos) << "docs/language.md has no Gallery section";
  const std::string section = doc.substr(gallery);
  int quoted = 0;
  for (const std::string& stem : galleryPrograms()) {
    EXPECT_NE(section.find("| `" + stem + ".ofl` |"), std::string::npos) << stem << " is not in the Gallery table";
    const std::string heading = "`examples/programs/" + stem + ".ofl`:\n\n```\n";
    const std::size_t at = section.find(heading);
    if (at == std::string::npos) continue;
    const std::size_t begin = at + heading.size();
    const std::size_t end = section.find("```", begin);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(section.substr(begin, end - begin), readProgram(stem)) << stem << ": the docs quote an old version";
    ++quoted;
  }
  EXPECT_GE(quoted, 6);
}

// ---- printer round trip: parse -> print -> parse gives the same program and the same text ----

class GalleryRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(GalleryRoundTrip, PrintsAndParsesBackToTheSameProgram) {
  const std::string text = readProgram(GetParam());
  const dsl::ParseResult first = dsl::parseProgram(text, GetParam() + ".ofl");
  ASSERT_TRUE(first.ok()) << (first.errors.empty() ? "" : first.errors.front().str());
  const std::string printed = dsl::printProgram(*first.program);
  const dsl::ParseResult second = dsl::parseProgram(printed, "<printed>");
  ASSERT_TRUE(second.ok()) << printed << "\n" << (second.errors.empty() ? "" : second.errors.front().str());
  EXPECT_EQ(dsl::printProgram(*second.program), printed);
  dsl::Program a = *first.program;
  dsl::Program b = *second.program;
  dsl::clearSourceLocs(a);
  dsl::clearSourceLocs(b);
  EXPECT_TRUE(a == b) << printed;
}

INSTANTIATE_TEST_SUITE_P(Gallery, GalleryRoundTrip, ::testing::ValuesIn(galleryPrograms()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ---- every program on every preset ----

struct Case {
  std::string program;
  std::string preset;
};

std::vector<Case> allCases() {
  std::vector<Case> out;
  for (const std::string& p : galleryPrograms()) {
    for (const std::string& t : presetNames()) out.push_back({p, t});
  }
  return out;
}

class GalleryProgram : public ::testing::TestWithParam<Case> {};

// Compiles `intent` at `size` and checks the result; `expected` (a compile-stage failure) inverts the check.
// `simulateAt` is the size whose schedule is simulated (kLarge, or kSmall for kSlowSimulations).
void checkSize(const core::IntentProgram& intent, const core::Topology& topo, std::uint64_t size, int root,
               const ExpectedFailure* expected, std::uint64_t simulateAt, const std::string& what) {
  SCOPED_TRACE(fmt::format("{} at {} bytes", what, size));
  compiler::CompileOptions options;
  options.sizeBytes = size;
  const auto compiled = compiler::compile(intent, topo, options);
  if (expected != nullptr && expected->stage == Stage::Compile) {
    ASSERT_FALSE(compiled.ok()) << "expected to fail (" << expected->reason << ") but compiled: update "
                                << "kExpectedFailures";
    EXPECT_NE(compiled.error().str().find(expected->message), std::string::npos) << compiled.error().str();
    return;
  }
  ASSERT_TRUE(compiled.ok()) << compiled.error().str();
  EXPECT_TRUE(compiled->report.proven);
  if (topo.nRanks() <= kMaxReferenceRanks) {
    sim::CheckOptions check;
    check.elementsPerChunk = 2;
    const sim::CheckReport ref = sim::runReference(compiled->schedule, check);
    EXPECT_TRUE(ref.passed) << (ref.errors.empty() ? std::to_string(ref.mismatchCount) + " mismatches"
                                                   : ref.errors.front());
  }
  if (size == simulateAt) {
    const sim::SimResult sr = sim::simulate(compiled->schedule, topo, size);
    ASSERT_TRUE(sr.ok) << sr.error;
    sim::BoundOptions bo;
    bo.root = root;
    const sim::BoundModel bounds(topo, bo);
    EXPECT_GE(sr.timeUs, bounds.bound(intent.collective, size).timeUs);
  }
}

TEST_P(GalleryProgram, CompilesProvenAndRunsOnPreset) {
  const Case& c = GetParam();
  const std::string file = c.program + ".ofl";
  const std::string text = readProgram(c.program);
  ASSERT_FALSE(text.empty()) << file;
  const core::Topology topo = topology(c.preset);
  const ExpectedFailure* expected = expectedFailure(c.program, c.preset);

  const dsl::ParseResult parsed = dsl::parseProgram(text, file);
  ASSERT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors.front().str());
  std::vector<int> roots = {0};
  if (rooted(parsed.program->collective) && c.preset == "dgx-a100x2") roots.push_back(5);

  for (int root : roots) {
    const std::string what = fmt::format("{} on {} (root {})", file, c.preset, root);
    SCOPED_TRACE(what);
    dsl::ExpandOptions eo;
    eo.root = root;
    const Frontend fe = parseAndExpand(text, file, topo, eo);
    if (expected != nullptr && expected->stage != Stage::Compile) {
      ASSERT_FALSE(fe.ok()) << "expected to fail (" << expected->reason << "): update kExpectedFailures";
      EXPECT_EQ(fe.failedAt, expected->stage) << fe.message;
      EXPECT_NE(fe.message.find(expected->message), std::string::npos) << fe.message;
      continue;
    }
    ASSERT_TRUE(fe.ok()) << fe.message;
    EXPECT_EQ(fe.intent->collective, parsed.program->collective);
    EXPECT_EQ(fe.intent->nRanks, topo.nRanks());
    const std::uint64_t simulateAt = kSanitized || slowSimulation(c.program, c.preset) ? kSmall : kLarge;
    for (std::uint64_t size : {kSmall, kLarge}) checkSize(*fe.intent, topo, size, root, expected, simulateAt, what);
  }
}

INSTANTIATE_TEST_SUITE_P(Gallery, GalleryProgram, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return p.param.program + "__" + testName(p.param.preset);
                         });

}  // namespace
}  // namespace optiflow::synth
