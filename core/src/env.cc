#include "optiflow/core/env.h"

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::core::env {

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
    case ParamType::kIntRange:
      return std::string("an integer, ") + p.allowed;
    case ParamType::kIfnameList:
      return "a comma list of interface names (1-15 characters of [A-Za-z0-9_.:-] each, at most 16 names)";
    case ParamType::kBytes:
      return "bytes (digits, optionally followed by K, M or G), at most 1G";
    case ParamType::kAbsolutePath:
      return "an absolute path";
    case ParamType::kString:
      return "a string";
  }
  return "";
}

int seconds(std::string_view v);
std::optional<std::int64_t> integer(std::string_view v, std::int64_t max);
std::optional<std::pair<std::int64_t, std::int64_t>> range(const char* allowed);
std::optional<std::vector<std::string>> ifnames(std::string_view v);
std::optional<std::uint64_t> bytes(std::string_view v);

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
    case ParamType::kIntRange: {
      const auto r = range(p.allowed);
      const auto n = integer(v, std::int64_t{1} << 40);
      return r && n && *n >= r->first && *n <= r->second;
    }
    case ParamType::kIfnameList:
      return ifnames(v).has_value();
    case ParamType::kBytes:
      return bytes(v).has_value();
    case ParamType::kAbsolutePath:
      return v.front() == '/';
    case ParamType::kString:
      return true;
  }
  return false;
}

// Plain decimal digits only (no sign, no spaces, no 0x), value <= max.
std::optional<std::int64_t> integer(std::string_view v, std::int64_t max) {
  if (v.empty() || v.size() > 18) return std::nullopt;
  std::int64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n > max) return std::nullopt;
  return n;
}

std::optional<std::pair<std::int64_t, std::int64_t>> range(const char* allowed) {
  const std::string_view a(allowed);
  const std::size_t dash = a.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const auto lo = integer(a.substr(0, dash), INT32_MAX);
  const auto hi = integer(a.substr(dash + 1), INT32_MAX);
  if (!lo || !hi) return std::nullopt;
  return std::make_pair(*lo, *hi);
}

// IFNAMSIZ is 16 with the terminator; no whitespace, slashes or empty names ("eth0,,eth1" is a typo).
std::optional<std::vector<std::string>> ifnames(std::string_view v) {
  std::vector<std::string> out;
  while (true) {
    const std::size_t comma = v.find(',');
    const std::string_view name = v.substr(0, comma);
    if (name.empty() || name.size() > 15) return std::nullopt;
    for (char c : name) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '.' || c == ':' || c == '-';
      if (!ok) return std::nullopt;
    }
    out.emplace_back(name);
    if (out.size() > 16) return std::nullopt;
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return out;
}

std::optional<std::uint64_t> bytes(std::string_view v) {
  constexpr std::int64_t kMax = std::int64_t{1} << 30;
  std::int64_t unit = 1;
  if (!v.empty()) {
    switch (v.back()) {
      case 'K':
      case 'k':
        unit = std::int64_t{1} << 10;
        break;
      case 'M':
      case 'm':
        unit = std::int64_t{1} << 20;
        break;
      case 'G':
      case 'g':
        unit = std::int64_t{1} << 30;
        break;
      default:
        break;
    }
    if (unit != 1) v.remove_suffix(1);
  }
  const auto n = integer(v, kMax);
  if (!n || *n * unit > kMax) return std::nullopt;
  return static_cast<std::uint64_t>(*n * unit);
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

const char* processEnv(const char* name) { return std::getenv(name); }

Value read(const ParamSpec& spec, GetEnv getEnv) {
  const char* raw = getEnv(spec.name);
  if (raw == nullptr || *raw == '\0') return {};  // unset and empty both mean the default
  const std::string_view v(raw);
  if (!valid(spec, v))
    return {std::nullopt, std::string(spec.name) + "='" + std::string(v) + "': expected " + expected(spec)};
  return {v, {}};
}

std::int64_t asInteger(std::string_view valid) { return integer(valid, INT64_MAX).value_or(0); }

std::uint64_t asBytes(std::string_view valid) { return bytes(valid).value_or(0); }

std::vector<std::string> asIfnames(std::string_view valid) {
  return ifnames(valid).value_or(std::vector<std::string>{});
}

std::vector<std::string> unknownNames(char** envp, std::initializer_list<std::span<const ParamSpec>> tables) {
  std::vector<std::string> unknown;
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("OPTIFLOW_", 0) != 0) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    bool known = false;
    for (std::span<const ParamSpec> table : tables) {
      for (const ParamSpec& spec : table) known = known || name == spec.name;
    }
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

std::string describe(std::span<const ParamSpec> table) {
  std::string s = "| Variable | Default | Meaning |\n|---|---|---|\n";
  for (const ParamSpec& spec : table) {
    s += std::string("| `") + spec.name + "` | " +
         (*spec.defaultValue ? std::string("`") + spec.defaultValue + "`" : std::string("unset")) + " | " + spec.doc +
         " |\n";
  }
  return s;
}

}  // namespace optiflow::core::env
