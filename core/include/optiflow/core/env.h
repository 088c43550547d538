// The one form every OPTIFLOW_* environment variable takes: a typed registry entry (name, type, default, allowed
// values, documentation), read once at init and parsed strictly. A value that does not parse is an error naming the
// variable, the value and what was expected, never a silent default; unset and empty both mean the default.
//
// Two tables use it: the plugins' (optiflow::plugin::kParams, plugin/include/optiflow/plugin/params.h, rendered into
// docs/schedcache.md) and optiflowd's and the optiflow CLI's (kDaemonParams below, rendered into docs/config.md).
// The daemon's table lives here, below the plugins, so that the plugins' unknown-variable warning knows it too.
//
// Library optiflow::core_env: the C++ standard library and optiflow::schedcache's namespace and hash rules only (no
// fmt, no spdlog), because it is linked into the plugin .so files.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace optiflow::core::env {

enum class ParamType {
  kBool,
  kEnum,
  kNamespace,
  kPlanHash,
  kSeconds,
  kIntRange,      // decimal integer within `allowed` ("1-16")
  kIfnameList,    // comma list of network interface names
  kBytes,         // decimal bytes, optional K/M/G suffix (KiB, MiB, GiB), at most 1 GiB
  kAbsolutePath,  // starts with '/'
  kString,        // anything (never an error, never echoed in one)
};

struct ParamSpec {
  const char* name;
  ParamType type;
  const char* defaultValue;  // as a user would write it; "" for unset
  const char* allowed;       // kEnum: values separated by '|'; kIntRange: "min-max"
  const char* doc;
};

// optiflowd's overrides of its config file, and what the optiflow CLI reads. "" defaults: unset, the config file's
// value applies (daemon/include/optiflow/daemon/config.h has the file's defaults).
inline constexpr ParamSpec kDaemonParams[] = {
    {"OPTIFLOW_NAMESPACE", ParamType::kNamespace, "", "",
     "Overrides `[cache] namespace`; `optiflow cache` reads it when `--namespace` is not given (else `default`). "
     "[A-Za-z0-9_.-], 1-64 characters."},
    {"OPTIFLOW_METRICS_PORT", ParamType::kIntRange, "", "0-65535",
     "Overrides `[metrics] port`: 0-65535; 0: any free port."},
    {"OPTIFLOW_LOG_LEVEL", ParamType::kEnum, "", "trace|debug|info|warn|error",
     "Overrides `[log] level`: trace, debug, info, warn or error."},
    {"OPTIFLOW_PROPOSER", ParamType::kEnum, "", "builtin|llm",
     "Overrides `[synthesis] proposer`: builtin or llm (llm still needs `[llm] endpoint` and `model`)."},
    {"OPTIFLOW_STATE_DIR", ParamType::kAbsolutePath, "", "", "Overrides `[synthesis] state_dir`; an absolute path."},
    {"OPTIFLOW_LLM_API_KEY", ParamType::kString, "", "",
     "`optiflow synthesize --proposer llm`: the API key when `--llm-api-key-file` is not given (surrounding "
     "whitespace dropped). optiflowd reads the variable `[llm] api_key_env` names instead."},
    {"OPTIFLOW_TEST_PUBLISH_STALL_MS", ParamType::kIntRange, "", "0-600000",
     "**Test only**: milliseconds, 0-600000: every publish sleeps this long halfway through writing its slot "
     "(`Writer::setMidWriteHookForTest`), so a test can `kill -9` the daemon mid-publish. optiflowd logs a warning "
     "when it is set. Never set it in production."},
};

// Reads an environment variable (nullptr: unset).
using GetEnv = const char* (*)(const char*);
// The process environment (std::getenv).
const char* processEnv(const char* name);

struct Value {
  std::optional<std::string_view> text;  // set, non-empty and valid; nullopt: the default applies, or error is set
  std::string error;                     // set but invalid: "OPTIFLOW_X='v': expected ..."
};

// spec's variable through getEnv, validated against its type.
Value read(const ParamSpec& spec, GetEnv getEnv);

// Conversions of a text read() accepted: kIntRange and kSeconds; kBytes; kIfnameList.
std::int64_t asInteger(std::string_view valid);
std::uint64_t asBytes(std::string_view valid);
std::vector<std::string> asIfnames(std::string_view valid);

// The entry of `table` named `name`; a name not in the table does not compile.
consteval const ParamSpec& find(std::span<const ParamSpec> table, std::string_view name) {
  for (const ParamSpec& spec : table) {
    if (std::string_view(spec.name) == name) return spec;
  }
  throw "not in the table";
}

// OPTIFLOW_* names in envp that none of the tables knows (likely typos), for a warning at init.
std::vector<std::string> unknownNames(char** envp, std::initializer_list<std::span<const ParamSpec>> tables);

// A Markdown table of `table` (variable, default, meaning), as the docs show it.
std::string describe(std::span<const ParamSpec> table);

}  // namespace optiflow::core::env
