#include "optiflow/plugin/params.h"

#include <cstring>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::plugin {

namespace {

bool oneOf(std::string_view value, std::string_view allowed) {
  while (!allowed.empty()) {
    const std::size_t bar = allowed.find('|');
    if (allowed.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) break;
    allowed.remove_prefix(bar + 1);
  }
  return false;
}

std::string expected(const ParamSpec& p) {
  switch (p.type) {
    case ParamType::kBool:
      return "0 or 1";
    case ParamType::kEnum: {
      std::string s = "one of ";
      for (const char* c = p.allowed; *c != '\0'; ++c) s += *c == '|' ? std::string(", ") : std::string(1, *c);
      return s;
    }
    case ParamType::kNamespace:
      return "1-64 characters of [A-Za-z0-9_.-]";
    case ParamType::kPlanHash:
      return "a plan's content hash: 16 hex digits, as `optiflow cache show` prints it";
    case ParamType::kSeconds:
      return "whole seconds, 0-86400";
  }
  return "";
}

int seconds(std::string_view v);

bool valid(const ParamSpec& p, std::string_view v) {
  switch (p.type) {
    case ParamType::kBool:
      return v == "0" || v == "1";
    case ParamType::kEnum:
      return oneOf(v, p.allowed);
    case ParamType::kNamespace:
      return schedcache::validNamespace(v);
    case ParamType::kPlanHash:
      return schedcache::parseHash(v).has_value();
    case ParamType::kSeconds:
      return seconds(v) >= 0;
  }
  return false;
}

// -1 unless v is 1-5 decimal digits with a value of at most one day.
int seconds(std::string_view v) {
  if (v.empty() || v.size() > 5) return -1;
  int n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n <= 86400 ? n : -1;
}

}  // namespace

bool readParams(GetEnv getEnv, Params* out, std::string* error) {
  Params p;
  for (const ParamSpec& spec : kParams) {
    const char* raw = getEnv(spec.name);
    if (raw == nullptr || *raw == '\0') continue;  // unset and empty both mean the default
    const std::string_view v(raw);
    if (!valid(spec, v)) {
      *error = std::string(spec.name) + "='" + std::string(v) + "': expected " + expected(spec);
      return false;
    }
    const std::string_view name(spec.name);
    if (name == "OPTIFLOW_TUNER") {
      p.tunerEnabled = v == "on";
    } else if (name == "OPTIFLOW_NAMESPACE") {
      p.ns = std::string(v);
    } else if (name == "OPTIFLOW_PLAN") {
      p.plan = schedcache::parseHash(v);
    } else if (name == "OPTIFLOW_PLAN_MISSING") {
      p.planMissingDefaults = v == "defaults";
    } else if (name == "OPTIFLOW_SETTLE_S") {
      p.settleS = seconds(v);
    } else if (name == "OPTIFLOW_ABORT_ON_ERROR") {
      p.abortOnError = v == "1";
    }
  }
  *out = std::move(p);
  return true;
}

std::vector<std::string> unknownParams(char** envp) {
  std::vector<std::string> unknown;
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("OPTIFLOW_", 0) != 0) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    bool known = false;
    for (const ParamSpec& spec : kParams) known = known || name == spec.name;
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

std::string describeParams() {
  std::string s = "| Variable | Default | Meaning |\n|---|---|---|\n";
  for (const ParamSpec& spec : kParams) {
    s += std::string("| `") + spec.name + "` | " +
         (*spec.defaultValue ? std::string("`") + spec.defaultValue + "`" : std::string("unset")) + " | " + spec.doc +
         " |\n";
  }
  return s;
}

}  // namespace optiflow::plugin
