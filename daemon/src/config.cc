// optiflowd's TOML config: a strict reader in the style of core/src/topology_toml.cc (every unknown key, wrong type
// and out-of-range value is a diagnostic with file, line, column and the key), then the OPTIFLOW_* overrides.
#include "optiflow/daemon/config.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "optiflow/core/env.h"
#include "optiflow/core/units.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::daemon {

namespace fs = std::filesystem;

namespace {

constexpr std::uintmax_t kMaxFileBytes = 1u << 20;
constexpr std::uint64_t kMaxSizeBytes = 16ull << 30;  // the largest message size worth synthesizing for
constexpr std::size_t kMaxSizes = 64;

// The collectives NCCL's tuner asks about (core::ncclFuncIndex); alltoall has no tuner entry point.
constexpr std::string_view kCollectives[] = {"allgather", "reducescatter", "allreduce", "broadcast", "reduce"};
constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn", "error"};

struct Failure {
  core::Diagnostic diag;
};

std::string_view typeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

template <typename Range>
std::string joinNames(const Range& names) {
  std::string s;
  for (const auto& n : names) s += fmt::format("{}{}", s.empty() ? "" : ", ", n);
  return s;
}

// The value as the file wrote it, for messages ("cpu_cores = 0: expected ...").
std::string render(const toml::node& n) {
  std::string out;
  if (const auto* s = n.as_string()) {
    out = fmt::format("\"{}\"", s->get());
  } else if (const auto* i = n.as_integer()) {
    out = fmt::format("{}", i->get());
  } else if (const auto* f = n.as_floating_point()) {
    out = fmt::format("{}", f->get());
  } else if (const auto* b = n.as_boolean()) {
    out = b->get() ? "true" : "false";
  } else if (const auto* a = n.as_array()) {
    out = "[";
    for (std::size_t k = 0; k < a->size(); ++k) out += (k ? ", " : "") + render(*a->get(k));
    out += "]";
  } else {
    out = std::string(typeName(n.type()));
  }
  if (out.size() > 60) out = out.substr(0, 57) + "...";
  return out;
}

bool validHostPort(std::string_view s) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) return false;
  std::string_view host = s.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
  } else if (host.find_first_of(" /:") != std::string_view::npos) {  // IPv6 needs brackets: [::1]:7000
    return false;
  }
  std::string_view port = s.substr(colon + 1);
  int p = -1;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  return ec == std::errc() && end == port.data() + port.size() && p >= 0 && p <= 65535;
}

bool validEnvName(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const toml::source_position& at, std::string message) const {
    throw Failure{core::Diagnostic{file_, static_cast<int>(at.line), static_cast<int>(at.column), std::move(message)}};
  }
  const std::string& file() const { return file_; }

  // Where each "[section] key" was read, for checks that span keys.
  std::map<std::string, toml::source_position> where;

 private:
  std::string file_;
};

// One table of the file: rejects unknown keys on construction, then typed getters that check ranges.
class Section {
 public:
  Section(Reader& r, const toml::table* t, std::string name, std::vector<std::string_view> keys)
      : r_(r), t_(t), name_(std::move(name)) {
    if (!t_) return;
    for (auto&& [k, v] : *t_) {
      if (std::find(keys.begin(), keys.end(), k.str()) != keys.end()) continue;
      toml::source_position at = k.source().begin.line ? k.source().begin : v.source().begin;
      r_.fail(at, fmt::format("{}: unknown key; expected one of: {}", label(k.str()), joinNames(keys)));
    }
  }

  bool present() const { return t_ != nullptr; }
  const toml::node* get(std::string_view key) {
    if (!t_) return nullptr;
    const toml::node* n = t_->get(key);
    if (n) r_.where[label(key)] = n->source().begin;
    return n;
  }
  toml::source_position position() const { return t_ ? t_->source().begin : toml::source_position{}; }
  std::string label(std::string_view key) const {
    return name_.empty() ? std::string(key) : fmt::format("[{}] {}", name_, key);
  }
  [[noreturn]] void bad(const toml::node& n, std::string_view key, std::string_view expected) const {
    r_.fail(n.source().begin, fmt::format("{} = {}: expected {}", label(key), render(n), expected));
  }

  void string(std::string_view key, std::string& out, std::string_view expected = "a string") {
    const toml::node* n = get(key);
    if (!n) return;
    if (!n->is_string()) bad(*n, key, fmt::format("{}, got {}", expected, typeName(n->type())));
    out = n->as_string()->get();
  }
  // A string that must be one of `choices`.
  template <typename Range>
  void choice(std::string_view key, std::string& out, const Range& choices) {
    const toml::node* n = get(key);
    if (!n) return;
    const std::string expected = fmt::format("one of {}", joinNames(choices));
    if (!n->is_string()) bad(*n, key, expected);
    const std::string& v = n->as_string()->get();
    if (std::find(std::begin(choices), std::end(choices), v) == std::end(choices)) bad(*n, key, expected);
    out = v;
  }
  // Relative to the config file's directory; "" stays "".
  void path(std::string_view key, fs::path& out) {
    const toml::node* n = get(key);
    if (!n) return;
    if (!n->is_string()) bad(*n, key, fmt::format("a path (string), got {}", typeName(n->type())));
    const std::string& v = n->as_string()->get();
    if (v.find('\0') != std::string::npos) bad(*n, key, "a path without NUL characters");
    out = v.empty() ? fs::path() : fs::path(r_.file()).parent_path() / v;
    if (!v.empty() && fs::path(v).is_absolute()) out = v;
    out = out.lexically_normal();
  }
  void boolean(std::string_view key, bool& out) {
    const toml::node* n = get(key);
    if (!n) return;
    if (!n->is_boolean()) bad(*n, key, fmt::format("true or false, got {}", typeName(n->type())));
    out = n->as_boolean()->get();
  }
  template <typename Int>
  void integer(std::string_view key, Int& out, std::int64_t lo, std::int64_t hi, std::string_view what) {
    const toml::node* n = get(key);
    if (!n) return;
    const std::string expected = fmt::format("{} in {}..{}", what, lo, hi);
    if (!n->is_integer()) bad(*n, key, fmt::format("{} (an integer), got {}", expected, typeName(n->type())));
    const std::int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) bad(*n, key, expected);
    out = static_cast<Int>(v);
  }
  void number(std::string_view key, double& out, double lo, double hi, std::string_view what) {
    const toml::node* n = get(key);
    if (!n) return;
    const std::string expected = fmt::format("{} in {}..{}", what, lo, hi);
    double v = 0;
    if (const auto* i = n->as_integer()) {
      v = static_cast<double>(i->get());
    } else if (const auto* f = n->as_floating_point()) {
      v = f->get();
    } else {
      bad(*n, key, fmt::format("{} (a number), got {}", expected, typeName(n->type())));
    }
    if (!std::isfinite(v) || v < lo || v > hi) bad(*n, key, expected);
    out = v;
  }
  // An integer number of bytes, or a string such as "64KiB".
  std::uint64_t sizeValue(const toml::node& n, std::string_view key, std::uint64_t lo, std::uint64_t hi) const {
    const std::string expected = fmt::format("a size in {}..{} (bytes, or a string such as \"64KiB\" or \"1MiB\")",
                                             core::formatSize(lo), core::formatSize(hi));
    std::uint64_t v = 0;
    if (const auto* i = n.as_integer()) {
      if (i->get() < 0) bad(n, key, expected);
      v = static_cast<std::uint64_t>(i->get());
    } else if (const auto* s = n.as_string()) {
      auto parsed = core::parseSize(s->get());
      if (!parsed) bad(n, key, fmt::format("{}: {}", expected, parsed.error().message));
      v = *parsed;
    } else {
      bad(n, key, fmt::format("{}, got {}", expected, typeName(n.type())));
    }
    if (v < lo || v > hi) bad(n, key, expected);
    return v;
  }
  void size(std::string_view key, std::uint64_t& out, std::uint64_t lo, std::uint64_t hi) {
    if (const toml::node* n = get(key)) out = sizeValue(*n, key, lo, hi);
  }
  const toml::array* array(std::string_view key, std::string_view expected) {
    const toml::node* n = get(key);
    if (!n) return nullptr;
    if (!n->is_array()) bad(*n, key, fmt::format("{}, got {}", expected, typeName(n->type())));
    return n->as_array();
  }
  // Element i of an array key, labelled "[section] key[i]".
  [[noreturn]] void badElement(const toml::node& n, std::string_view key, std::size_t i,
                               std::string_view expected) const {
    r_.fail(n.source().begin, fmt::format("{}[{}] = {}: expected {}", label(key), i, render(n), expected));
  }

 private:
  Reader& r_;
  const toml::table* t_;
  std::string name_;
};

const toml::table* subTable(Reader& r, const toml::table& root, std::string_view name) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  if (!n->is_table()) {
    r.fail(n->source().begin, fmt::format("[{}]: expected a table (section), got {}", name, typeName(n->type())));
  }
  return n->as_table();
}

void readCache(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "cache"), "cache", {"namespace", "group"});
  if (const toml::node* n = s.get("namespace")) {
    if (!n->is_string() || !schedcache::validNamespace(n->as_string()->get())) {
      s.bad(*n, "namespace", "a namespace: 1-64 characters of [A-Za-z0-9_.-]");
    }
    c.ns = n->as_string()->get();
  }
  if (const toml::node* n = s.get("group")) {
    const std::string expected = "a group name (\"\" for none): [A-Za-z0-9_.-], at most 32 characters";
    if (!n->is_string()) s.bad(*n, "group", expected);
    const std::string& g = n->as_string()->get();
    const bool ok = g.size() <= 32 && std::all_of(g.begin(), g.end(), [](char ch) {
                      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-';
                    });
    if (!ok) s.bad(*n, "group", expected);
    c.group = g;
  }
}

void readTopology(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "topology"), "topology", {"preset", "file", "nccl_topo_dump", "nodes", "calibration"});
  const std::string_view sources = "exactly one of preset, file, nccl_topo_dump";
  if (!s.present()) r.fail({}, fmt::format("[topology]: missing section; it needs {}", sources));
  if (const toml::node* n = s.get("preset")) {
    if (!n->is_string()) s.bad(*n, "preset", "a preset name such as \"dgx-a100\" or \"dgx-h100x2\"");
    auto topo = core::presetTopology(n->as_string()->get());
    if (!topo) s.bad(*n, "preset", topo.error().message);
    c.preset = n->as_string()->get();
  }
  s.path("file", c.topologyFile);
  s.path("nccl_topo_dump", c.ncclTopoDump);
  const int given = (c.preset.empty() ? 0 : 1) + (c.topologyFile.empty() ? 0 : 1) + (c.ncclTopoDump.empty() ? 0 : 1);
  if (given != 1) {
    r.fail(s.position(),
           fmt::format("[topology]: {} given; it needs {}", given == 0 ? "no source" : "several sources", sources));
  }
  if (const toml::node* n = s.get("nodes")) {
    if (c.ncclTopoDump.empty()) {
      s.bad(*n, "nodes", "no nodes key: only nccl_topo_dump takes it (a preset says dgx-a100x4, a file says nodes)");
    }
    s.integer("nodes", c.nodes, 1, core::Topology::kMaxNodes, "a node count");
  }
  s.path("calibration", c.calibrationFile);
  if (!c.calibrationFile.empty()) {
    auto cal = calib::readCalibrationFile(c.calibrationFile);
    if (!cal) {
      r.fail(r.where["[topology] calibration"],
             fmt::format("[topology] calibration = \"{}\": {}", c.calibrationFile.string(), cal.error().str()));
    }
    c.calibration = std::move(cal).value();
  }
}

void readSynthesis(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "synthesis"), "synthesis",
            {"proposer", "evaluator", "collectives", "sizes", "rounds", "candidates_per_round", "interval_s",
             "trial_calls", "state_dir", "seed"});
  constexpr std::string_view kProposers[] = {"builtin", "llm"};
  constexpr std::string_view kEvaluators[] = {"simulator"};
  s.choice("proposer", c.proposer, kProposers);
  s.choice("evaluator", c.evaluator, kEvaluators);
  if (const toml::array* a = s.array("collectives", "an array of collective names")) {
    const std::string expected = fmt::format("a collective: one of {}", joinNames(kCollectives));
    if (a->empty()) s.bad(*s.get("collectives"), "collectives", "at least one collective");
    c.collectives.clear();
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (!e.is_string()) s.badElement(e, "collectives", i, expected);
      const std::string& name = e.as_string()->get();
      if (std::find(std::begin(kCollectives), std::end(kCollectives), name) == std::end(kCollectives)) {
        s.badElement(e, "collectives", i, expected);
      }
      if (std::find(c.collectives.begin(), c.collectives.end(), name) != c.collectives.end()) {
        s.badElement(e, "collectives", i, "each collective once");
      }
      c.collectives.push_back(name);
    }
  }
  if (const toml::array* a = s.array("sizes", "an array of sizes (bytes, or strings such as \"1MiB\")")) {
    if (a->empty() || a->size() > kMaxSizes) {
      s.bad(*s.get("sizes"), "sizes", fmt::format("1..{} sizes", kMaxSizes));
    }
    c.sizes.clear();
    for (std::size_t i = 0; i < a->size(); ++i) {
      c.sizes.push_back(s.sizeValue(*a->get(i), fmt::format("sizes[{}]", i), 1, kMaxSizeBytes));
    }
    std::sort(c.sizes.begin(), c.sizes.end());
    c.sizes.erase(std::unique(c.sizes.begin(), c.sizes.end()), c.sizes.end());
  }
  s.integer("rounds", c.rounds, 1, 1000, "a round count");
  s.integer("candidates_per_round", c.candidatesPerRound, 1, 1000, "a candidate count");
  s.number("interval_s", c.intervalS, 1, 7 * 86400, "seconds");
  s.integer("trial_calls", c.trialCalls, 0, static_cast<int>(schedcache::kMaxTrialCalls), "calls per candidate");
  s.path("state_dir", c.stateDir);
  s.integer("seed", c.seed, 0, std::numeric_limits<std::int64_t>::max(), "a seed");
}

void readLlm(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "llm"), "llm", {"endpoint", "model", "api_key_env", "timeout_s"});
  if (const toml::node* n = s.get("endpoint")) {
    const std::string_view expected = "an http:// or https:// base URL such as \"http://127.0.0.1:8000/v1\"";
    if (!n->is_string()) s.bad(*n, "endpoint", expected);
    const std::string& v = n->as_string()->get();
    if ((v.rfind("http://", 0) != 0 && v.rfind("https://", 0) != 0) || v.size() < 9) s.bad(*n, "endpoint", expected);
    c.llm.client.baseUrl = v;
  }
  s.string("model", c.llm.client.model, "a model name");
  if (const toml::node* n = s.get("api_key_env")) {
    const std::string_view expected = "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)";
    if (!n->is_string() || !validEnvName(n->as_string()->get())) s.bad(*n, "api_key_env", expected);
    c.llm.apiKeyEnv = n->as_string()->get();
  }
  s.number("timeout_s", c.llm.client.timeoutS, 1, 3600, "seconds");
}

void readBudget(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "budget"), "budget", {"cpu_cores", "nice", "busy_calls_per_s", "idle_window_s"});
  s.number("cpu_cores", c.cpuCores, 0.05, 64, "a number of cores");
  s.integer("nice", c.nice, 0, 19, "a nice value");
  s.number("busy_calls_per_s", c.busyCallsPerS, 0, 1e9, "collective calls per second");
  s.number("idle_window_s", c.idleWindowS, 0, 3600, "seconds");
}

void readProbe(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "probe"), "probe", {"enabled", "listen", "peers", "interval_s", "bytes"});
  s.boolean("enabled", c.probeEnabled);
  if (const toml::node* n = s.get("listen")) {
    const std::string_view expected = "\"host:port\" (port 0: any free port) or \"\" to disable the responder";
    if (!n->is_string()) s.bad(*n, "listen", expected);
    const std::string& v = n->as_string()->get();
    if (!v.empty() && !validHostPort(v)) s.bad(*n, "listen", expected);
    c.probeListen = v;
  }
  if (const toml::array* a = s.array("peers", "an array of \"host:port\" strings")) {
    c.probePeers.clear();
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (!e.is_string() || !validHostPort(e.as_string()->get()) || e.as_string()->get().ends_with(":0")) {
        s.badElement(e, "peers", i, "\"host:port\" of another daemon's probe responder (port 1..65535)");
      }
      c.probePeers.push_back(e.as_string()->get());
    }
  }
  s.number("interval_s", c.probeIntervalS, 1, 7 * 86400, "seconds");
  s.size("bytes", c.probeBytes, 4096, 256ull << 20);  // probe.h kMaxProbeBytes: what a responder allocates
}

void readMetrics(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "metrics"), "metrics", {"address", "port"});
  if (const toml::node* n = s.get("address")) {
    const std::string_view expected = "an address to bind such as \"127.0.0.1\", \"0.0.0.0\" or \"::1\"";
    if (!n->is_string() || n->as_string()->get().empty() ||
        n->as_string()->get().find_first_of(" /") != std::string::npos) {
      s.bad(*n, "address", expected);
    }
    c.metricsAddress = n->as_string()->get();
  }
  s.integer("port", c.metricsPort, 0, 65535, "a TCP port (0: any free port)");
}

void readShare(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "share"), "share", {"role", "dir"});
  constexpr std::string_view kRoles[] = {"standalone", "leader", "follower"};
  std::string role = "standalone";
  s.choice("role", role, kRoles);
  c.role = role == "leader" ? Role::kLeader : role == "follower" ? Role::kFollower : Role::kStandalone;
  s.path("dir", c.shareDir);
  if (c.role != Role::kStandalone && c.shareDir.empty()) {
    auto it = r.where.find("[share] role");
    r.fail(it != r.where.end() ? it->second : s.position(),
           fmt::format("[share] role = \"{}\": needs [share] dir, the directory the leader and followers share", role));
  }
}

void readLog(Reader& r, const toml::table& root, Config& c) {
  Section s(r, subTable(r, root, "log"), "log", {"level", "json"});
  s.choice("level", c.logLevel, kLogLevels);
  s.boolean("json", c.logJson);
}

Config readConfig(Reader& r, const toml::table& root) {
  constexpr std::string_view kTop[] = {"version", "cache", "topology", "synthesis", "llm",
                                       "budget",  "probe", "metrics",  "share",     "log"};
  for (auto&& [k, v] : root) {
    if (std::find(std::begin(kTop), std::end(kTop), k.str()) != std::end(kTop)) continue;
    toml::source_position at = k.source().begin.line ? k.source().begin : v.source().begin;
    r.fail(at, fmt::format("{}: unknown {}; expected version or one of the sections: {}", k.str(),
                           v.is_table() ? "section" : "key", joinNames(std::span(kTop).subspan(1))));
  }
  const toml::node* version = root.get("version");
  if (!version) r.fail({}, fmt::format("version: missing; the first line should be `version = {}`", kConfigVersion));
  if (!version->is_integer() || version->as_integer()->get() != kConfigVersion) {
    r.fail(version->source().begin, fmt::format("version = {}: expected {} (the only config version this optiflowd "
                                                "reads)",
                                                render(*version), kConfigVersion));
  }
  Config c;
  readCache(r, root, c);
  readTopology(r, root, c);
  readSynthesis(r, root, c);
  readLlm(r, root, c);
  readBudget(r, root, c);
  readProbe(r, root, c);
  readMetrics(r, root, c);
  readShare(r, root, c);
  readLog(r, root, c);
  return c;
}

// The overrides of config.h, through the registry (core/env.h: strict parsing, errors naming the variable).
std::optional<core::Diagnostic> applyEnv(Config& c, GetEnv getEnv) {
  if (!getEnv) return std::nullopt;
  namespace env = core::env;
  const env::Value ns = env::read(env::find(env::kDaemonParams, "OPTIFLOW_NAMESPACE"), getEnv);
  const env::Value port = env::read(env::find(env::kDaemonParams, "OPTIFLOW_METRICS_PORT"), getEnv);
  const env::Value level = env::read(env::find(env::kDaemonParams, "OPTIFLOW_LOG_LEVEL"), getEnv);
  const env::Value proposer = env::read(env::find(env::kDaemonParams, "OPTIFLOW_PROPOSER"), getEnv);
  const env::Value stateDir = env::read(env::find(env::kDaemonParams, "OPTIFLOW_STATE_DIR"), getEnv);
  for (const env::Value* v : {&ns, &port, &level, &proposer, &stateDir}) {
    if (!v->error.empty()) return core::Diagnostic{"", 0, 0, v->error};
  }
  if (ns.text) c.ns = std::string(*ns.text);
  if (port.text) c.metricsPort = static_cast<int>(env::asInteger(*port.text));
  if (level.text) c.logLevel = std::string(*level.text);
  if (proposer.text) c.proposer = std::string(*proposer.text);
  if (stateDir.text) c.stateDir = fs::path(*stateDir.text).lexically_normal();
  return std::nullopt;
}

// Checks that involve keys of several sections, run after the overrides.
std::optional<core::Diagnostic> crossCheck(const Config& c, const Reader& r) {
  if (c.proposer == "llm" && (c.llm.client.baseUrl.empty() || c.llm.client.model.empty())) {
    auto it = r.where.find("[synthesis] proposer");
    const toml::source_position at = it != r.where.end() ? it->second : toml::source_position{};
    return core::Diagnostic{
        r.file(), static_cast<int>(at.line), static_cast<int>(at.column),
        fmt::format("[synthesis] proposer = \"llm\"{}: needs [llm] endpoint and [llm] model "
                    "(missing: {})",
                    it == r.where.end() ? " (from OPTIFLOW_PROPOSER)" : "",
                    c.llm.client.baseUrl.empty() ? (c.llm.client.model.empty() ? "both" : "endpoint") : "model")};
  }
  return std::nullopt;
}

}  // namespace

core::Result<Config> parseConfig(std::string_view text, const fs::path& file, GetEnv getEnv) {
  const std::string name = file.string();
  try {
    toml::table root = toml::parse(text, name);
    Reader r(name);
    Config c = readConfig(r, root);
    c.file = file;
    if (auto e = applyEnv(c, getEnv)) return *e;
    if (auto e = crossCheck(c, r)) return *e;
    return c;
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return core::Diagnostic{name, static_cast<int>(b.line), static_cast<int>(b.column),
                            fmt::format("invalid TOML: {}", e.description())};
  } catch (const Failure& f) {
    return f.diag;
  } catch (const std::exception& e) {
    return core::Diagnostic{name, 0, 0, fmt::format("cannot read the config: {}", e.what())};
  }
}

core::Result<Config> loadConfig(const fs::path& file, GetEnv getEnv) {
  const std::string name = file.string();
  std::error_code ec;
  if (fs::is_directory(file, ec)) return core::Diagnostic{name, 0, 0, "is a directory, not a config file"};
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec) return core::Diagnostic{name, 0, 0, fmt::format("cannot read the config: {}", ec.message())};
  if (size > kMaxFileBytes) {
    return core::Diagnostic{name, 0, 0, fmt::format("the config is {} bytes; the limit is {}", size, kMaxFileBytes)};
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return core::Diagnostic{name, 0, 0, "cannot open the config for reading"};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return core::Diagnostic{name, 0, 0, "error while reading the config"};
  return parseConfig(ss.str(), file, getEnv);
}

namespace {

core::Result<core::Topology> configuredTopology(const Config& config) {
  if (!config.preset.empty()) return core::presetTopology(config.preset);
  if (!config.topologyFile.empty()) return core::loadTopologyFile(config.topologyFile.string());
  if (!config.ncclTopoDump.empty()) {
    core::TopologyHints hints;
    hints.nodes = config.nodes > 0 ? config.nodes : 1;
    return core::loadNcclTopoXml(config.ncclTopoDump.string(), hints);
  }
  return core::Diagnostic{config.file.string(), 0, 0, "[topology]: no source (preset, file or nccl_topo_dump)"};
}

}  // namespace

core::Result<core::Topology> loadConfiguredTopology(const Config& config) {
  auto topo = configuredTopology(config);
  if (topo && config.calibration) {
    if (std::string why = calib::appliesTo(*config.calibration, *topo); !why.empty()) {
      return core::Diagnostic{config.file.string(), 0, 0, fmt::format("[topology] calibration: {}", why)};
    }
  }
  return topo;
}

core::Result<fs::path> resolveStateDir(const Config& config, GetEnv getEnv) {
  auto usable = [](const fs::path& dir, bool create) -> std::optional<std::string> {
    std::error_code ec;
    if (create) fs::create_directories(dir, ec);
    if (ec) return fmt::format("cannot create it: {}", ec.message());
    if (!fs::is_directory(dir, ec)) return std::string("not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) return std::string("not writable by this user");
    return std::nullopt;
  };
  if (!config.stateDir.empty()) {
    if (auto why = usable(config.stateDir, true)) {
      return core::Diagnostic{config.file.string(), 0, 0,
                              fmt::format("[synthesis] state_dir \"{}\": {}", config.stateDir.string(), *why)};
    }
    return config.stateDir;
  }
  const char* state = getEnv ? getEnv("STATE_DIRECTORY") : nullptr;
  if (state && *state) {
    // systemd passes a colon-separated list when the unit names several; the first is ours.
    const std::string first = std::string(state).substr(0, std::string(state).find(':'));
    if (auto why = usable(first, true)) {
      return core::Diagnostic{"", 0, 0, fmt::format("STATE_DIRECTORY='{}': {}", first, *why)};
    }
    return fs::path(first);
  }
  const fs::path system = "/var/lib/optiflow";
  if (!usable(system, true)) return system;
  const char* tmp = getEnv ? getEnv("TMPDIR") : nullptr;
  const fs::path fallback = fs::path(tmp && *tmp ? tmp : "/tmp") / fmt::format("optiflowd-{}", ::getuid());
  if (auto why = usable(fallback, true)) {
    return core::Diagnostic{
        "", 0, 0,
        fmt::format("no state directory: /var/lib/optiflow is not writable and {}: {}", fallback.string(), *why)};
  }
  std::error_code ec;
  fs::permissions(fallback, fs::perms::owner_all, fs::perm_options::replace, ec);
  return fallback;
}

}  // namespace optiflow::daemon
