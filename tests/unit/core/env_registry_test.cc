// The OPTIFLOW_* registry form (core/env.h): strict parsing per type, unknown names across tables, and the docs
// showing exactly what describe() renders for each table.
#include "optiflow/core/env.h"

#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/text_file.h"
#include "optiflow/plugin/params.h"

namespace optiflow::core::env {
namespace {

const char* gName = nullptr;
const char* gValue = nullptr;
const char* oneVariable(const char* name) { return std::string_view(name) == gName ? gValue : nullptr; }

Value readAs(const ParamSpec& spec, const char* value) {
  gName = spec.name;
  gValue = value;
  return read(spec, oneVariable);
}

constexpr const ParamSpec& kPort = find(kDaemonParams, "OPTIFLOW_METRICS_PORT");
static_assert(std::string_view(kPort.name) == "OPTIFLOW_METRICS_PORT", "find() resolves names at compile time");

TEST(EnvRegistry, UnsetAndEmptyMeanTheDefault) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    const Value v = readAs(kPort, value);
    EXPECT_FALSE(v.text);
    EXPECT_TRUE(v.error.empty()) << v.error;
  }
}

TEST(EnvRegistry, EachTypeAcceptsItsValuesOnly) {
  struct Case {
    const ParamSpec& spec;
    std::vector<const char*> good, bad;
  };
  const Case cases[] = {
      {kPort, {"0", "9464", "65535"}, {"80x", "-1", "65536", " 80", "+80", "0x50"}},
      {find(kDaemonParams, "OPTIFLOW_NAMESPACE"), {"job-7", "a.b_c"}, {"a b", "../etc", "a/b"}},
      {find(kDaemonParams, "OPTIFLOW_LOG_LEVEL"), {"trace", "error"}, {"loud", "INFO", "info "}},
      {find(kDaemonParams, "OPTIFLOW_PROPOSER"), {"builtin", "llm"}, {"gpt", "llm|builtin"}},
      {find(kDaemonParams, "OPTIFLOW_STATE_DIR"), {"/var/lib/x", "/"}, {"relative/dir", "./x", "~/x"}},
      {find(kDaemonParams, "OPTIFLOW_LLM_API_KEY"), {"sk-anything at all\n", " "}, {}},
      {find(kDaemonParams, "OPTIFLOW_TEST_PUBLISH_STALL_MS"), {"0", "600000"}, {"600001", "-5", "1s"}},
  };
  for (const Case& c : cases) {
    for (const char* value : c.good) {
      const Value v = readAs(c.spec, value);
      EXPECT_TRUE(v.error.empty()) << v.error;
      ASSERT_TRUE(v.text) << c.spec.name << "=" << value;
      EXPECT_EQ(*v.text, value);
    }
    for (const char* value : c.bad) {
      const Value v = readAs(c.spec, value);
      EXPECT_FALSE(v.text) << c.spec.name << "=" << value;
      EXPECT_EQ(v.error.rfind(std::string(c.spec.name) + "='" + value + "': expected ", 0), 0u) << v.error;
    }
  }
  EXPECT_EQ(asInteger(*readAs(kPort, "65535").text), 65535);
  EXPECT_EQ(readAs(kPort, "x").error, "OPTIFLOW_METRICS_PORT='x': expected an integer, 0-65535");
}

TEST(EnvRegistry, UnknownNamesAreThoseNoTableKnows) {
  std::string a = "OPTIFLOW_PLNA=1", b = "OPTIFLOW_LLM_API_KEY=sk", c = "OPTIFLOW_TUNER=off", d = "PATH=/bin",
              e = "OPTIFLOW_METRICS_PORT";
  char* envp[] = {a.data(), b.data(), c.data(), d.data(), e.data(), nullptr};
  EXPECT_EQ(unknownNames(envp, {kDaemonParams}), (std::vector<std::string>{"OPTIFLOW_PLNA", "OPTIFLOW_TUNER"}));
  EXPECT_EQ(unknownNames(envp, {kDaemonParams, plugin::kParams}), std::vector<std::string>{"OPTIFLOW_PLNA"});
  EXPECT_TRUE(unknownNames(nullptr, {kDaemonParams}).empty());
}

TEST(EnvRegistry, TablesAreWellFormedAndAgreeOnSharedNames) {
  std::map<std::string_view, const ParamSpec*> seen;
  using Table = std::span<const ParamSpec>;
  for (Table table : {Table(kDaemonParams), Table(plugin::kParams)}) {
    std::set<std::string_view> names;
    for (const ParamSpec& spec : table) {
      const std::string_view name(spec.name);
      EXPECT_EQ(name.rfind("OPTIFLOW_", 0), 0u) << name;
      EXPECT_TRUE(names.insert(name).second) << name << " twice in one table";
      EXPECT_NE(std::string_view(spec.doc), "") << name;
      if (*spec.defaultValue != '\0') {
        EXPECT_TRUE(readAs(spec, spec.defaultValue).text) << name << ": its default does not parse";
      }
      auto [it, first] = seen.emplace(name, &spec);
      if (first) continue;
      EXPECT_EQ(it->second->type, spec.type) << name << " parses differently in two tables";
      EXPECT_EQ(std::string_view(it->second->allowed), std::string_view(spec.allowed)) << name;
    }
  }
}

// The docs show describe()'s tables verbatim: a variable added, changed or removed in a table without its doc (or
// the other way round) fails here.
void expectTableIn(const char* doc, const std::string& table) {
  const auto text = readWholeFile(std::string(OPTIFLOW_SOURCE_DIR) + "/" + doc);
  ASSERT_TRUE(text) << doc;
  EXPECT_NE(text->find(table), std::string::npos) << doc << " should contain, verbatim:\n" << table;
}

TEST(EnvRegistry, ConfigDocShowsTheDaemonTable) { expectTableIn("docs/config.md", describe(kDaemonParams)); }

TEST(EnvRegistry, SchedcacheDocShowsThePluginTable) { expectTableIn("docs/schedcache.md", plugin::describeParams()); }

}  // namespace
}  // namespace optiflow::core::env
