// Topology TOML: a strict reader (unknown keys, wrong types, missing keys and bad values are all diagnostics with
// file, line, column and key path) and a canonical writer. Semantic checks live in Topology::validate() only;
// the reader remembers where each key path came from so validate()'s issues point into the file too.
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "optiflow/core/topology.h"

namespace optiflow::core {

namespace {

constexpr int kFormatVersion = 1;
constexpr std::uintmax_t kMaxFileBytes = 16u << 20;

// Thrown inside the reader only; parseTopologyToml turns it back into a Diagnostic.
struct ParseFailure {
  Diagnostic diag;
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

std::string join(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

std::string listKeys(const std::vector<std::string_view>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", keys[i]);
  return s;
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const toml::source_position& at, std::string message) const {
    throw ParseFailure{Diagnostic{file_, static_cast<int>(at.line), static_cast<int>(at.column), std::move(message)}};
  }
  [[noreturn]] void failAt(const toml::node& n, const std::string& path, std::string_view what) const {
    fail(n.source().begin, fmt::format("{}: {}", path, what));
  }

  void remember(const std::string& path, const toml::node& n) { where_[path] = n.source().begin; }
  void remember(const std::string& path, toml::source_position p) { where_[path] = p; }

  // Where a validate() issue points: the key itself, else the nearest enclosing key or element that was read.
  toml::source_position locate(std::string path) const {
    while (!path.empty()) {
      if (auto it = where_.find(path); it != where_.end()) return it->second;
      if (path.back() == ']') {
        path.erase(path.rfind('['));
      } else {
        auto dot = path.rfind('.');
        path.erase(dot == std::string::npos ? 0 : dot);
      }
    }
    return {};
  }

  const toml::table& asTable(const toml::node& n, const std::string& path) {
    const toml::table* t = n.as_table();
    if (!t) failAt(n, path, fmt::format("expected a table, got {}", typeName(n.type())));
    remember(path, n);
    return *t;
  }

  void onlyKeys(const toml::table& t, const std::string& path, const std::vector<std::string_view>& allowed,
                std::string_view context = {}) const {
    for (auto&& [k, v] : t) {
      if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
      toml::source_position at = k.source().begin.line ? k.source().begin : v.source().begin;
      fail(at, fmt::format("{}: unknown key{}; expected one of: {}", join(path, k.str()), context, listKeys(allowed)));
    }
  }

  const toml::node* optional(const toml::table& t, std::string_view key) const { return t.get(key); }

  const toml::node& required(const toml::table& t, const std::string& path, std::string_view key,
                             std::string_view expected) const {
    if (const toml::node* n = t.get(key)) return *n;
    // The root table has no useful position; a sub-table points at its header.
    toml::source_position at = path.empty() ? toml::source_position{} : t.source().begin;
    fail(at, fmt::format("{}: missing required key (expected {})", join(path, key), expected));
  }

  std::string string(const toml::node& n, const std::string& path) {
    const auto* v = n.as_string();
    if (!v) failAt(n, path, fmt::format("expected a string, got {}", typeName(n.type())));
    remember(path, n);
    return v->get();
  }

  int integer(const toml::node& n, const std::string& path, std::string_view what = "an integer") {
    const auto* v = n.as_integer();
    if (!v) failAt(n, path, fmt::format("expected {}, got {}", what, typeName(n.type())));
    std::int64_t x = v->get();
    if (x < INT_MIN || x > INT_MAX) failAt(n, path, fmt::format("{} is out of range for {}", x, what));
    remember(path, n);
    return static_cast<int>(x);
  }

  // Integers are accepted where a float is expected: "25" is as good as "25.0" for a bandwidth.
  double number(const toml::node& n, const std::string& path, std::string_view what) {
    double x = 0;
    if (const auto* f = n.as_floating_point()) {
      x = f->get();
    } else if (const auto* i = n.as_integer()) {
      x = static_cast<double>(i->get());
    } else {
      failAt(n, path, fmt::format("expected {} (a number), got {}", what, typeName(n.type())));
    }
    remember(path, n);
    return x;
  }

  std::vector<int> intArray(const toml::node& n, const std::string& path, std::string_view what) {
    const toml::array* a = n.as_array();
    if (!a) failAt(n, path, fmt::format("expected an array of {}, got {}", what, typeName(n.type())));
    remember(path, n);
    std::vector<int> out;
    out.reserve(a->size());
    for (size_t i = 0; i < a->size(); ++i) out.push_back(integer(*a->get(i), fmt::format("{}[{}]", path, i), what));
    return out;
  }

  // An array of tables ([[x]] or an inline array of inline tables); calls f(table, elementPath) per element.
  template <typename F>
  void tables(const toml::node& n, const std::string& path, F&& f) {
    const toml::array* a = n.as_array();
    if (!a) failAt(n, path, fmt::format("expected an array of tables, got {}", typeName(n.type())));
    remember(path, n);
    for (size_t i = 0; i < a->size(); ++i) {
      std::string p = fmt::format("{}[{}]", path, i);
      f(asTable(*a->get(i), p), p);
    }
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, toml::source_position> where_;
};

constexpr std::string_view kBandwidth = "a bandwidth in GB/s";
constexpr std::string_view kLatency = "a latency in us";
constexpr std::string_view kGpuIndex = "local GPU indices";

void readIntra(Reader& r, const toml::table& root, Topology& t) {
  const toml::table& in = r.asTable(r.required(root, "", "intra", "a table [intra]"), "intra");
  const toml::node& kindNode = r.required(in, "intra", "kind", "\"nvswitch\", \"nvlink-mesh\" or \"pcie\"");
  std::string kind = r.string(kindNode, "intra.kind");
  IntraFabric& f = t.intra;
  if (kind == "nvswitch") {
    f.kind = IntraFabricKind::NvSwitch;
    r.onlyKeys(in, "intra", {"kind", "gpu_bandwidth_gbytes_per_s", "latency_us"}, " for kind = \"nvswitch\"");
    f.gpuBandwidthGBps = r.number(r.required(in, "intra", "gpu_bandwidth_gbytes_per_s", kBandwidth),
                                  "intra.gpu_bandwidth_gbytes_per_s", kBandwidth);
    f.latencyUs = r.number(r.required(in, "intra", "latency_us", kLatency), "intra.latency_us", kLatency);
  } else if (kind == "nvlink-mesh") {
    f.kind = IntraFabricKind::NvLinkMesh;
    r.onlyKeys(in, "intra", {"kind", "latency_us", "links"}, " for kind = \"nvlink-mesh\"");
    f.latencyUs = r.number(r.required(in, "intra", "latency_us", kLatency), "intra.latency_us", kLatency);
    r.tables(r.required(in, "intra", "links", "an array of tables [[intra.links]]"), "intra.links",
             [&](const toml::table& lt, const std::string& p) {
               r.onlyKeys(lt, p, {"gpus", "bandwidth_gbytes_per_s", "latency_us"});
               const toml::node& gn = r.required(lt, p, "gpus", "a pair of local GPU indices");
               std::vector<int> g = r.intArray(gn, p + ".gpus", kGpuIndex);
               if (g.size() != 2) {
                 r.failAt(gn, p + ".gpus", fmt::format("expected exactly two GPU indices, got {}", g.size()));
               }
               NvLinkPair l;
               l.a = g[0];
               l.b = g[1];
               l.bandwidthGBps = r.number(r.required(lt, p, "bandwidth_gbytes_per_s", kBandwidth),
                                          p + ".bandwidth_gbytes_per_s", kBandwidth);
               const toml::node* lat = r.optional(lt, "latency_us");
               l.latencyUs = lat ? r.number(*lat, p + ".latency_us", kLatency) : f.latencyUs;
               f.links.push_back(l);
             });
  } else if (kind == "pcie") {
    f.kind = IntraFabricKind::Pcie;
    r.onlyKeys(in, "intra",
               {"kind", "gpu_bandwidth_gbytes_per_s", "latency_us", "host_bandwidth_gbytes_per_s", "host_latency_us",
                "switches"},
               " for kind = \"pcie\"");
    f.gpuBandwidthGBps = r.number(r.required(in, "intra", "gpu_bandwidth_gbytes_per_s", kBandwidth),
                                  "intra.gpu_bandwidth_gbytes_per_s", kBandwidth);
    f.latencyUs = r.number(r.required(in, "intra", "latency_us", kLatency), "intra.latency_us", kLatency);
    if (const toml::node* n = r.optional(in, "host_bandwidth_gbytes_per_s")) {
      f.hostBandwidthGBps = r.number(*n, "intra.host_bandwidth_gbytes_per_s", kBandwidth);
    }
    if (const toml::node* n = r.optional(in, "host_latency_us")) {
      f.hostLatencyUs = r.number(*n, "intra.host_latency_us", kLatency);
    }
    r.tables(r.required(in, "intra", "switches", "an array of tables [[intra.switches]]"), "intra.switches",
             [&](const toml::table& st, const std::string& p) {
               r.onlyKeys(st, p, {"gpus", "uplink_bandwidth_gbytes_per_s"});
               PcieSwitch s;
               s.gpus = r.intArray(r.required(st, p, "gpus", "an array of local GPU indices"), p + ".gpus", kGpuIndex);
               s.uplinkGBps = r.number(r.required(st, p, "uplink_bandwidth_gbytes_per_s", kBandwidth),
                                       p + ".uplink_bandwidth_gbytes_per_s", kBandwidth);
               f.switches.push_back(std::move(s));
             });
  } else {
    r.failAt(kindNode, "intra.kind",
             fmt::format("unknown intra-node fabric \"{}\"; expected \"nvswitch\", \"nvlink-mesh\" or \"pcie\"", kind));
  }
}

void readNics(Reader& r, const toml::table& root, Topology& t) {
  const toml::node* n = r.optional(root, "nics");
  if (!n) return;
  r.tables(*n, "nics", [&](const toml::table& nt, const std::string& p) {
    r.onlyKeys(nt, p, {"name", "gbps", "bandwidth_gbytes_per_s", "latency_us", "gpus"});
    Nic nic;
    nic.name = r.string(r.required(nt, p, "name", "a string"), p + ".name");
    const toml::node* gbps = r.optional(nt, "gbps");
    const toml::node* gbytes = r.optional(nt, "bandwidth_gbytes_per_s");
    if (gbps && gbytes) {
      r.failAt(*gbytes, p + ".bandwidth_gbytes_per_s", "give either gbps or bandwidth_gbytes_per_s, not both");
    } else if (gbps) {
      double bits = r.number(*gbps, p + ".gbps", "a line rate in Gb/s");
      if (!std::isfinite(bits) || bits <= 0) {
        r.failAt(*gbps, p + ".gbps", fmt::format("expected a line rate in Gb/s > 0, got {}", bits));
      }
      nic.bandwidthGBps = bits / 8;
      r.remember(p + ".bandwidth_gbytes_per_s", *gbps);
    } else if (gbytes) {
      nic.bandwidthGBps = r.number(*gbytes, p + ".bandwidth_gbytes_per_s", kBandwidth);
    } else {
      r.fail(nt.source().begin,
             fmt::format("{}: missing bandwidth: give gbps (line rate, e.g. 200 for HDR) or bandwidth_gbytes_per_s "
                         "(e.g. 25.0)",
                         p));
    }
    nic.latencyUs = r.number(r.required(nt, p, "latency_us", kLatency), p + ".latency_us", kLatency);
    nic.gpus = r.intArray(r.required(nt, p, "gpus", "an array of local GPU indices"), p + ".gpus", kGpuIndex);
    t.nics.push_back(std::move(nic));
  });
}

void readInter(Reader& r, const toml::table& root, Topology& t) {
  const toml::node* n = r.optional(root, "inter");
  if (!n) return;
  const toml::table& in = r.asTable(*n, "inter");
  r.onlyKeys(in, "inter", {"kind", "oversubscription", "switch_latency_us"});
  const toml::node& kindNode = r.required(in, "inter", "kind", "\"rail-optimized\" or \"fat-tree\"");
  std::string kind = r.string(kindNode, "inter.kind");
  if (kind == "rail-optimized") {
    t.inter.kind = InterFabricKind::RailOptimized;
  } else if (kind == "fat-tree") {
    t.inter.kind = InterFabricKind::FatTree;
  } else {
    r.failAt(kindNode, "inter.kind",
             fmt::format("unknown inter-node fabric \"{}\"; expected \"rail-optimized\" or \"fat-tree\" (leave out "
                         "[inter] for a single node)",
                         kind));
  }
  if (const toml::node* o = r.optional(in, "oversubscription")) {
    t.inter.oversubscription = r.number(*o, "inter.oversubscription", "an oversubscription ratio");
  }
  t.inter.switchLatencyUs =
      r.number(r.required(in, "inter", "switch_latency_us", kLatency), "inter.switch_latency_us", kLatency);
}

std::string defaultName(std::string_view fileName) {
  std::string stem = std::filesystem::path(std::string(fileName)).stem().string();
  if (stem.empty() || stem.front() == '<') return "custom";
  return stem;
}

Topology readTopology(Reader& r, const toml::table& root, std::string_view fileName) {
  r.onlyKeys(root, "", {"version", "name", "nodes", "gpus_per_node", "gpu_type", "intra", "nics", "inter"});
  if (const toml::node* v = root.get("version")) {
    int version = r.integer(*v, "version");
    if (version != kFormatVersion) {
      r.failAt(*v, "version",
               fmt::format("unsupported format version {}; this build reads version {}", version, kFormatVersion));
    }
  }
  Topology t;
  const toml::node* name = root.get("name");
  t.name = name ? r.string(*name, "name") : defaultName(fileName);
  t.nodes = r.integer(r.required(root, "", "nodes", "an integer"), "nodes");
  t.gpusPerNode = r.integer(r.required(root, "", "gpus_per_node", "an integer"), "gpus_per_node");
  const toml::node* gpuType = root.get("gpu_type");
  t.gpuType = gpuType ? r.string(*gpuType, "gpu_type") : "GPU";
  readIntra(r, root, t);
  readNics(r, root, t);
  readInter(r, root, t);
  return t;
}

// ---- writer ----

std::string tomlString(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", c);
        } else {
          out += ch;  // UTF-8 passes through: the parser already checked it
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back to the same double, always spelled as a TOML float.
std::string tomlFloat(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n' covers inf and nan
  return s;
}

std::string tomlInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace

Result<Topology> parseTopologyToml(std::string_view text, std::string_view fileName) {
  std::string file(fileName);
  try {
    toml::table root = toml::parse(text, file);
    Reader r(file);
    Topology t = readTopology(r, root, fileName);
    std::vector<TopologyIssue> issues = t.validate();
    if (!issues.empty()) {
      toml::source_position at = r.locate(issues.front().path);
      std::string more = issues.size() > 1 ? fmt::format(" (and {} more problems)", issues.size() - 1) : "";
      return Diagnostic{file, static_cast<int>(at.line), static_cast<int>(at.column), issues.front().str() + more};
    }
    return t;
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return Diagnostic{file, static_cast<int>(b.line), static_cast<int>(b.column),
                      fmt::format("invalid TOML: {}", e.description())};
  } catch (const ParseFailure& f) {
    return f.diag;
  } catch (const std::exception& e) {
    return Diagnostic{file, 0, 0, fmt::format("cannot read topology: {}", e.what())};
  }
}

Result<Topology> loadTopologyFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Diagnostic{path, 0, 0, "is a directory, not a topology file"};
  std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return Diagnostic{path, 0, 0, fmt::format("cannot read topology file: {}", ec.message())};
  if (size > kMaxFileBytes) {
    return Diagnostic{path, 0, 0, fmt::format("topology file is {} bytes; the limit is {}", size, kMaxFileBytes)};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Diagnostic{path, 0, 0, "cannot open topology file for reading"};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Diagnostic{path, 0, 0, "error while reading topology file"};
  return parseTopologyToml(ss.str(), path);
}

std::string topologyToToml(const Topology& t) {
  std::string out = "# OptiFlow topology (format: docs/topology.md)\n";
  out += fmt::format("version = {}\n", kFormatVersion);
  out += fmt::format("name = {}\n", tomlString(t.name));
  out += fmt::format("nodes = {}\n", t.nodes);
  out += fmt::format("gpus_per_node = {}\n", t.gpusPerNode);
  out += fmt::format("gpu_type = {}\n", tomlString(t.gpuType));

  const IntraFabric& f = t.intra;
  out += fmt::format("\n[intra]\nkind = \"{}\"\n", toString(f.kind));
  switch (f.kind) {
    case IntraFabricKind::NvSwitch:
      out += fmt::format("gpu_bandwidth_gbytes_per_s = {}\n", tomlFloat(f.gpuBandwidthGBps));
      out += fmt::format("latency_us = {}\n", tomlFloat(f.latencyUs));
      break;
    case IntraFabricKind::NvLinkMesh:
      out += fmt::format("latency_us = {}\n", tomlFloat(f.latencyUs));
      out += "links = [\n";
      for (const auto& l : f.links) {
        out += fmt::format("  {{ gpus = [{}, {}], bandwidth_gbytes_per_s = {}, latency_us = {} }},\n", l.a, l.b,
                           tomlFloat(l.bandwidthGBps), tomlFloat(l.latencyUs));
      }
      out += "]\n";
      break;
    case IntraFabricKind::Pcie:
      out += fmt::format("gpu_bandwidth_gbytes_per_s = {}\n", tomlFloat(f.gpuBandwidthGBps));
      out += fmt::format("latency_us = {}\n", tomlFloat(f.latencyUs));
      if (f.hostBandwidthGBps != 0) {
        out += fmt::format("host_bandwidth_gbytes_per_s = {}\n", tomlFloat(f.hostBandwidthGBps));
      }
      out += fmt::format("host_latency_us = {}\n", tomlFloat(f.hostLatencyUs));
      out += "switches = [\n";
      for (const auto& s : f.switches) {
        out += fmt::format("  {{ gpus = {}, uplink_bandwidth_gbytes_per_s = {} }},\n", tomlInts(s.gpus),
                           tomlFloat(s.uplinkGBps));
      }
      out += "]\n";
      break;
  }

  for (const auto& n : t.nics) {
    out += "\n[[nics]]\n";
    out += fmt::format("name = {}\n", tomlString(n.name));
    out += fmt::format("bandwidth_gbytes_per_s = {}\n", tomlFloat(n.bandwidthGBps));
    out += fmt::format("latency_us = {}\n", tomlFloat(n.latencyUs));
    out += fmt::format("gpus = {}\n", tomlInts(n.gpus));
  }

  if (t.inter.kind != InterFabricKind::None) {
    out += fmt::format("\n[inter]\nkind = \"{}\"\n", toString(t.inter.kind));
    out += fmt::format("oversubscription = {}\n", tomlFloat(t.inter.oversubscription));
    out += fmt::format("switch_latency_us = {}\n", tomlFloat(t.inter.switchLatencyUs));
  }
  return out;
}

}  // namespace optiflow::core
