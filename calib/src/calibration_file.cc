// CAL.toml: the one reader and the one writer. Strict like every TOML file of ours: an unknown key, a wrong type or
// a value out of range is a diagnostic naming the file, the line and what was expected (docs/calibration.md).
#include "optiflow/calib/calibration_file.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "optiflow/core/text_file.h"

namespace optiflow::calib {

namespace {

constexpr std::string_view kFormatName = "optiflow-calibration";
constexpr std::uintmax_t kMaxFileBytes = 16u << 20;
constexpr std::string_view kProtocolKeys[] = {"Simple", "LL", "LL128"};  // protocolIndex order
constexpr std::string_view kModels[] = {"simulator", "nccl-model"};

struct Bad {
  core::Diagnostic diag;
};

// Reads one table: every key it is asked for is marked, and done() rejects the rest.
class Table {
 public:
  Table(std::string file, const toml::table& t, std::string label)
      : file_(std::move(file)), t_(t), label_(std::move(label)) {}

  const std::string& file() const { return file_; }
  const std::string& label() const { return label_; }

  [[noreturn]] void fail(const toml::source_region& at, const std::string& msg) const {
    throw Bad{core::Diagnostic{file_, static_cast<int>(at.begin.line), static_cast<int>(at.begin.column), msg}};
  }
  std::string name(std::string_view key) const {
    return label_.empty() ? std::string(key) : fmt::format("[{}] {}", label_, key);
  }

  const toml::node* find(std::string_view key) {
    seen_.emplace_back(key);
    return t_.get(key);
  }
  const toml::node& need(std::string_view key, std::string_view expected) {
    const toml::node* n = find(key);
    if (!n) fail(t_.source(), fmt::format("{}: missing; expected {}", name(key), expected));
    return *n;
  }

  std::string string(std::string_view key, bool required = false) {
    const toml::node* n = required ? &need(key, "a string") : find(key);
    if (!n) return {};
    if (!n->is_string()) fail(n->source(), fmt::format("{}: expected a string", name(key)));
    return n->as_string()->get();
  }
  std::int64_t integer(std::string_view key, std::int64_t lo, std::int64_t hi, bool required = false) {
    const toml::node* n = required ? &need(key, "an integer") : find(key);
    if (!n) return 0;
    const auto* i = n->as_integer();
    if (!i || i->get() < lo || i->get() > hi)
      fail(n->source(), fmt::format("{}: expected an integer in {}..{}", name(key), lo, hi));
    return i->get();
  }
  std::optional<double> number(std::string_view key, double lo, double hi, bool required = false) {
    const toml::node* n = required ? &need(key, "a number") : find(key);
    if (!n) return std::nullopt;
    std::optional<double> v;
    if (const auto* i = n->as_integer()) v = static_cast<double>(i->get());
    if (const auto* f = n->as_floating_point()) v = f->get();
    if (!v || !std::isfinite(*v) || *v < lo || *v > hi)
      fail(n->source(), fmt::format("{}: expected a number in {}..{}", name(key), lo, hi));
    return v;
  }
  const toml::table* table(std::string_view key, bool required) {
    const toml::node* n = required ? &need(key, "a table") : find(key);
    if (!n) return nullptr;
    if (!n->is_table()) fail(n->source(), fmt::format("{}: expected a table", name(key)));
    return n->as_table();
  }
  const toml::array* array(std::string_view key) {
    const toml::node* n = find(key);
    if (!n) return nullptr;
    if (!n->is_array()) fail(n->source(), fmt::format("{}: expected an array", name(key)));
    return n->as_array();
  }
  void done() const {
    for (auto&& [k, v] : t_) {
      if (std::find(seen_.begin(), seen_.end(), k.str()) != seen_.end()) continue;
      std::string keys;
      for (const auto& s : seen_) keys += (keys.empty() ? "" : ", ") + s;
      fail(k.source().begin.line ? k.source() : v.source(),
           fmt::format("{}: unknown key; expected one of: {}", name(k.str()), keys));
    }
  }

 private:
  std::string file_;
  const toml::table& t_;
  std::string label_;
  std::vector<std::string> seen_;
};

// The elements of an array of tables, each read with `read` and checked with done().
template <typename F>
void eachTable(Table& parent, std::string_view key, F read) {
  const toml::array* a = parent.array(key);
  if (!a) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& n = *a->get(i);
    if (!n.is_table()) parent.fail(n.source(), fmt::format("{}[{}]: expected a table", parent.name(key), i));
    Table t(parent.file(), *n.as_table(), fmt::format("{} #{}", key, i + 1));
    read(t);
    t.done();
  }
}

// What `fitted` may name: the parameters of a model table.
constexpr std::string_view kModelKeys[] = {"launch_graph_us",        "launch_host_us",        "latency_scale.Simple",
                                           "latency_scale.LL",       "latency_scale.LL128",   "bandwidth_scale.Simple",
                                           "bandwidth_scale.LL",     "bandwidth_scale.LL128", "net_hop_latency_scale",
                                           "nvlink_bandwidth_scale", "net_bandwidth_scale"};

double scale(Table& t, std::string_view key) {
  return t.number(key, sim::kMinCalibrationScale, sim::kMaxCalibrationScale).value_or(1.0);
}

ModelFit readModel(Table& t) {
  ModelFit m;
  auto& p = m.params;
  p.launchGraphUs = t.number("launch_graph_us", 0, sim::kMaxCalibrationLaunchUs);
  p.launchHostUs = t.number("launch_host_us", 0, sim::kMaxCalibrationLaunchUs);
  auto perProtocol = [&](std::string_view key, std::array<double, 3>& out, auto limit) {
    const toml::table* table = t.table(key, false);
    if (!table) return;
    Table l(t.file(), *table, fmt::format("{}.{}", t.label(), key));
    for (std::size_t k = 0; k < 3; ++k) {
      out[k] = l.number(kProtocolKeys[k], sim::kMinCalibrationScale, limit(static_cast<int>(k))).value_or(1.0);
    }
    l.done();
  };
  perProtocol("latency_scale", p.latencyScale, [](int) { return sim::kMaxCalibrationScale; });
  perProtocol("bandwidth_scale", p.bandwidthScale, [](int k) { return sim::maxProtocolBandwidthScale(k); });
  p.netHopLatencyScale = scale(t, "net_hop_latency_scale");
  p.nvlinkBandwidthScale = scale(t, "nvlink_bandwidth_scale");
  p.netBandwidthScale = scale(t, "net_bandwidth_scale");
  if (const toml::array* a = t.array("fitted")) {
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& n = *a->get(i);
      const bool known = n.is_string() && std::find(std::begin(kModelKeys), std::end(kModelKeys),
                                                    n.as_string()->get()) != std::end(kModelKeys);
      if (!known)
        t.fail(n.source(), fmt::format("{}[{}]: expected the name of a parameter of this table", t.name("fitted"), i));
      m.fitted.push_back(n.as_string()->get());
    }
  }
  m.medianErrorPctBefore = t.number("median_error_pct_before", 0, 1e9).value_or(0);
  m.medianErrorPct = t.number("median_error_pct", 0, 1e9).value_or(0);
  m.maxErrorPct = t.number("max_error_pct", 0, 1e9).value_or(0);
  t.done();
  return m;
}

std::string formatNumber(double v) {
  // Shortest text that reads back to the same double: the file is the calibration, not a rounded copy of it.
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string tomlString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
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
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void writeModel(std::string& out, std::string_view table, const ModelFit& m) {
  const auto& p = m.params;
  out += fmt::format("\n[{}]\n", table);
  if (p.launchGraphUs) out += fmt::format("launch_graph_us = {}\n", formatNumber(*p.launchGraphUs));
  if (p.launchHostUs) out += fmt::format("launch_host_us = {}\n", formatNumber(*p.launchHostUs));
  out += fmt::format("latency_scale = {{ Simple = {}, LL = {}, LL128 = {} }}\n", formatNumber(p.latencyScale[0]),
                     formatNumber(p.latencyScale[1]), formatNumber(p.latencyScale[2]));
  out += fmt::format("bandwidth_scale = {{ Simple = {}, LL = {}, LL128 = {} }}\n", formatNumber(p.bandwidthScale[0]),
                     formatNumber(p.bandwidthScale[1]), formatNumber(p.bandwidthScale[2]));
  out += fmt::format("net_hop_latency_scale = {}\n", formatNumber(p.netHopLatencyScale));
  out += fmt::format("nvlink_bandwidth_scale = {}\n", formatNumber(p.nvlinkBandwidthScale));
  out += fmt::format("net_bandwidth_scale = {}\n", formatNumber(p.netBandwidthScale));
  std::string fitted;
  for (const auto& f : m.fitted) fitted += (fitted.empty() ? "" : ", ") + tomlString(f);
  out += fmt::format("fitted = [{}]\n", fitted);
  out += fmt::format("median_error_pct_before = {}\n", formatNumber(m.medianErrorPctBefore));
  out += fmt::format("median_error_pct = {}\n", formatNumber(m.medianErrorPct));
  out += fmt::format("max_error_pct = {}\n", formatNumber(m.maxErrorPct));
}

Calibration readDocument(const toml::table& doc, const std::string& file) {
  Calibration c;
  c.file = file;
  Table top(file, doc, "");
  const std::string format = top.string("format", true);
  if (format != kFormatName) {
    top.fail(doc.get("format")->source(),
             fmt::format("format = {}: expected \"{}\" (not a calibration file)", tomlString(format), kFormatName));
  }
  const auto version = top.integer("version", 1, std::numeric_limits<int>::max(), true);
  if (version != kCalibrationVersion) {
    top.fail(doc.get("version")->source(),
             fmt::format("version = {}: this optiflow reads calibration version {}; run optiflow calibrate again",
                         version, kCalibrationVersion));
  }
  c.writtenBy = top.string("written_by");
  c.believe = top.string("believe");
  if (!c.believe.empty() && std::find(std::begin(kModels), std::end(kModels), c.believe) == std::end(kModels)) {
    top.fail(doc.get("believe")->source(), "believe: expected \"simulator\" or \"nccl-model\"");
  }
  {
    Table node(file, *top.table("node", true), "node");
    c.gpu = node.string("gpu", true);
    c.gpusPerNode = static_cast<int>(node.integer("gpus_per_node", 1, core::Topology::kMaxGpusPerNode, true));
    c.nicsPerNode = static_cast<int>(node.integer("nics_per_node", 0, 1024, true));
    c.nicGBps = node.number("nic_gbps", 0, core::Topology::kMaxBandwidthGBps, true).value_or(0);
    c.fittedOn = node.string("fitted_on");
    node.done();
  }
  eachTable(top, "source", [&](Table& t) {
    CalibrationSource s;
    s.file = t.string("file", true);
    s.collective = t.string("collective");
    s.ranks = static_cast<int>(t.integer("ranks", 0, core::Topology::kMaxRanks));
    s.nodes = static_cast<int>(t.integer("nodes", 0, core::Topology::kMaxNodes));
    s.rows = static_cast<int>(t.integer("rows", 0, std::numeric_limits<int>::max()));
    s.incompleteRows = static_cast<int>(t.integer("incomplete_rows", 0, std::numeric_limits<int>::max()));
    s.launch = t.string("launch");
    s.ncclVersion = static_cast<int>(t.integer("nccl_version", 0, 999999));
    c.sources.push_back(std::move(s));
  });
  for (auto [key, fit] : {std::pair{"simulator", &c.simulator}, std::pair{"nccl_model", &c.ncclModel}}) {
    if (const toml::table* m = top.table(key, false)) {
      Table t(file, *m, key);
      *fit = readModel(t);
    }
  }
  eachTable(top, "residual", [&](Table& t) {
    Residual r;
    r.file = t.string("file");
    r.line = static_cast<int>(t.integer("line", 0, std::numeric_limits<int>::max()));
    r.collective = t.string("collective");
    r.sizeBytes = static_cast<std::uint64_t>(t.integer("size_bytes", 0, std::numeric_limits<std::int64_t>::max()));
    r.choice = t.string("choice");
    r.measuredUs = t.number("measured_us", 0, 1e12).value_or(0);
    r.simulatorBeforeUs = t.number("simulator_before_us", -1, 1e12).value_or(0);
    r.simulatorUs = t.number("simulator_us", -1, 1e12).value_or(0);
    r.ncclModelBeforeUs = t.number("nccl_model_before_us", -1, 1e12).value_or(0);
    r.ncclModelUs = t.number("nccl_model_us", -1, 1e12).value_or(0);
    c.residuals.push_back(std::move(r));
  });
  top.done();
  return c;
}

}  // namespace

core::Result<Calibration> parseCalibration(std::string_view text, std::string_view file) {
  const std::string name(file);
  try {
    toml::table doc = toml::parse(text, name);
    return readDocument(doc, name);
  } catch (const toml::parse_error& e) {
    return core::Diagnostic{name, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column),
                            std::string(e.description())};
  } catch (const Bad& b) {
    return b.diag;
  } catch (const std::exception& e) {  // allocation failure on a hostile file: still a diagnostic
    return core::Diagnostic{name, 0, 0, e.what()};
  }
}

core::Result<Calibration> readCalibrationFile(const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    return core::Diagnostic{file.string(), 0, 0, "is a directory: expected a calibration file (CAL.toml)"};
  }
  const auto size = std::filesystem::file_size(file, ec);
  if (!ec && size > kMaxFileBytes) {
    return core::Diagnostic{file.string(), 0, 0,
                            fmt::format("{} bytes: a calibration file is at most {}", size, kMaxFileBytes)};
  }
  const auto text = core::readWholeFile(file);
  if (!text) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
  return parseCalibration(*text, file.string());
}

std::string formatCalibration(const Calibration& c) {
  std::string out;
  out += "# OptiFlow calibration of both models of collective times (docs/calibration.md). Written by optiflow\n";
  out += "# calibrate; applies to every topology of the same kind of node and fabric, at any node count.\n";
  out += fmt::format("format = {}\nversion = {}\n", tomlString(kFormatName), kCalibrationVersion);
  if (!c.writtenBy.empty()) out += fmt::format("written_by = {}\n", tomlString(c.writtenBy));
  if (!c.believe.empty()) out += fmt::format("believe = {}\n", tomlString(c.believe));
  out += fmt::format("\n[node]\ngpu = {}\ngpus_per_node = {}\nnics_per_node = {}\nnic_gbps = {}\n", tomlString(c.gpu),
                     c.gpusPerNode, c.nicsPerNode, formatNumber(c.nicGBps));
  if (!c.fittedOn.empty()) out += fmt::format("fitted_on = {}\n", tomlString(c.fittedOn));
  for (const auto& s : c.sources) {
    out += fmt::format("\n[[source]]\nfile = {}\n", tomlString(s.file));
    if (!s.collective.empty()) out += fmt::format("collective = {}\n", tomlString(s.collective));
    out += fmt::format("ranks = {}\nnodes = {}\nrows = {}\nincomplete_rows = {}\n", s.ranks, s.nodes, s.rows,
                       s.incompleteRows);
    if (!s.launch.empty()) out += fmt::format("launch = {}\n", tomlString(s.launch));
    if (s.ncclVersion > 0) out += fmt::format("nccl_version = {}\n", s.ncclVersion);
  }
  writeModel(out, "simulator", c.simulator);
  writeModel(out, "nccl_model", c.ncclModel);
  for (const auto& r : c.residuals) {
    out += fmt::format(
        "\n[[residual]]\nfile = {}\nline = {}\ncollective = {}\nsize_bytes = {}\nchoice = {}\nmeasured_us = {}\n"
        "simulator_before_us = {}\nsimulator_us = {}\nnccl_model_before_us = {}\nnccl_model_us = {}\n",
        tomlString(r.file), r.line, tomlString(r.collective), r.sizeBytes, tomlString(r.choice),
        formatNumber(r.measuredUs), formatNumber(r.simulatorBeforeUs), formatNumber(r.simulatorUs),
        formatNumber(r.ncclModelBeforeUs), formatNumber(r.ncclModelUs));
  }
  return out;
}

std::string appliesTo(const Calibration& c, const core::Topology& topo) {
  const int nics = static_cast<int>(topo.nics.size());
  const double nicGBps = topo.nics.empty() ? 0.0 : topo.nics.front().bandwidthGBps;
  const std::string have =
      fmt::format("{} x{} GPUs, {} NICs of {} GB/s", topo.gpuType, topo.gpusPerNode, nics, formatNumber(nicGBps));
  const std::string want =
      fmt::format("{} x{} GPUs, {} NICs of {} GB/s", c.gpu, c.gpusPerNode, c.nicsPerNode, formatNumber(c.nicGBps));
  const bool sameNic = c.nicsPerNode == nics && std::abs(c.nicGBps - nicGBps) <= 1e-6 * std::max(1.0, c.nicGBps);
  if (c.gpu == topo.gpuType && c.gpusPerNode == topo.gpusPerNode && sameNic) return {};
  return fmt::format("the calibration{} was fitted on nodes of {}; topology {} has nodes of {}",
                     c.file.empty() ? "" : " " + c.file, want, topo.name, have);
}

core::Result<Calibration> loadCalibrationFor(const std::filesystem::path& file, const core::Topology& topo) {
  auto c = readCalibrationFile(file);
  if (!c) return c;
  if (std::string why = appliesTo(*c, topo); !why.empty()) return core::Diagnostic{file.string(), 0, 0, why};
  return c;
}

}  // namespace optiflow::calib
