#include "optiflow/daemon/metrics.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace optiflow::daemon {

namespace {

bool nameChar(char c, bool first) {
  const bool alpha = std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  return first ? alpha : alpha || std::isdigit(static_cast<unsigned char>(c));
}

// A bad name is repaired the way Prometheus client libraries do (invalid characters become '_'), never dropped: a
// typo then shows up in /metrics instead of silently losing the value.
std::string sanitize(const std::string& name) {
  if (name.empty()) return "_";
  std::string out = name;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!nameChar(out[i], i == 0)) out[i] = '_';
  }
  return out;
}

std::string escape(std::string_view s, bool quotes) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

}  // namespace

std::string promLabels(std::initializer_list<std::pair<std::string_view, std::string_view>> labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += sanitize(std::string(k));
    out += "=\"";
    out += escape(v, true);
    out += '"';
  }
  return out;
}

void Metrics::add(const std::string& name, double v, const std::string& labels) {
  std::lock_guard lock(mutex_);
  families_[sanitize(name)].values[labels] += v;
}

void Metrics::set(const std::string& name, double v, const std::string& labels) {
  std::lock_guard lock(mutex_);
  families_[sanitize(name)].values[labels] = v;
}

double Metrics::get(const std::string& name, const std::string& labels) const {
  std::lock_guard lock(mutex_);
  auto f = families_.find(sanitize(name));
  if (f == families_.end()) return 0;
  auto v = f->second.values.find(labels);
  return v == f->second.values.end() ? 0 : v->second;
}

void Metrics::describe(const std::string& name, const std::string& type, const std::string& help) {
  std::lock_guard lock(mutex_);
  Family& f = families_[sanitize(name)];
  f.type = type == "counter" || type == "gauge" ? type : "untyped";
  f.help = help;
}

std::string Metrics::renderPrometheus() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (!f.help.empty()) out += fmt::format("# HELP {} {}\n", name, escape(f.help, false));
    out += fmt::format("# TYPE {} {}\n", name, f.type.empty() ? "untyped" : f.type);
    for (const auto& [labels, v] : f.values) {
      out += labels.empty() ? name : fmt::format("{}{{{}}}", name, labels);
      out += ' ';
      out += value(v);
      out += '\n';
    }
  }
  return out;
}

}  // namespace optiflow::daemon
