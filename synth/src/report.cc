#include "optiflow/synth/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/text_file.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::synth {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------------------
// What the page shows: the run directory's records (run_dir.h), read by its one reader

using Choice = NativeChoice;
using Best = PlanBest;
using Entry = PlanEntry;

std::string collectiveName(const PlanCollective& c) { return std::string(core::toString(c.collective)); }

// The run's settings, as shown under the title (label, value); a merged plan has none of a single run's.
std::vector<std::pair<std::string, std::string>> runSettings(const PlanFile& p) {
  std::vector<std::pair<std::string, std::string>> meta;
  if (!p.proposer.empty()) meta.emplace_back("proposer", p.proposer);
  if (!p.evaluator.empty()) meta.emplace_back("evaluator", p.evaluator);
  if (p.seed) meta.emplace_back("seed", fmt::format("{}", *p.seed));
  if (p.rounds) meta.emplace_back("rounds", fmt::format("{}", *p.rounds));
  if (p.candidates) meta.emplace_back("candidates", fmt::format("{}", *p.candidates));
  if (p.elapsedS) {
    const double s = *p.elapsedS;
    meta.emplace_back("elapsed", s < 120 ? fmt::format("{:.1f} s", s)
                                         : fmt::format("{:.0f} min {:.0f} s", std::floor(s / 60), std::fmod(s, 60)));
  }
  if (p.stopReason) meta.emplace_back("stopped", *p.stopReason);
  if (!p.optiflowVersion.empty()) meta.emplace_back("optiflow", p.optiflowVersion);
  return meta;
}

core::Result<PlanFile> loadPlan(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return core::Diagnostic{
        dir.string(), 0, 0,
        fs::exists(dir, ec) ? "not a directory (expected a run directory with plan.json)" : "no such directory"};
  }
  return readPlan(dir / "plan.json");
}

// A missing history is no history.
core::Result<std::optional<History>> loadHistory(const fs::path& dir) {
  const fs::path file = dir / "history.jsonl";
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::optional<History>();
  auto h = readHistory(file);
  if (!h) return h.error();
  return std::optional<History>(std::move(h).value());
}

// ---------------------------------------------------------------------------------------------------------------
// Formatting

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Four significant digits, no exponent for everyday magnitudes, no trailing zeros.
std::string num(double v) {
  if (!std::isfinite(v)) return "-";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e15 || a < 1e-6) return fmt::format("{:.3g}", v);
  const int magnitude = static_cast<int>(std::floor(std::log10(a)));
  const int decimals = std::clamp(3 - magnitude, 0, 9);
  std::string s = fmt::format("{:.{}f}", v, decimals);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

std::string plural(int n, std::string_view what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

std::string coord(double v) { return fmt::format("{:.1f}", v); }

// Only relative paths inside the run directory become links: a plan that says "javascript:..." or "/etc/passwd"
// gets its text shown, not followed.
std::optional<std::string> safeHref(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.front() == '\\' || path.find(':') != std::string_view::npos) {
    return std::nullopt;
  }
  for (std::size_t start = 0; start <= path.size();) {
    const std::size_t end = std::min(path.find_first_of("/\\", start), path.size());
    if (path.substr(start, end - start) == "..") return std::nullopt;
    start = end + 1;
  }
  std::string out;
  for (const char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || std::string_view("-._~/!$&'()*+,;=@").find(ch) != std::string_view::npos) {
      out += ch;
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return esc(out);
}

std::string link(std::string_view path, std::string_view text) {
  if (auto href = safeHref(path)) return fmt::format("<a href=\"{}\">{}</a>", *href, esc(text));
  return esc(text);
}

std::string choiceLabel(const Choice& c) { return fmt::format("{}/{}/{}ch", c.algorithm, c.protocol, c.channels); }

// busbw in GB/s, nccl-tests style; nullopt where there is no time to convert.
std::optional<double> busbw(std::uint64_t sizeBytes, double timeUs, double factor) {
  if (!(timeUs > 0) || sizeBytes == 0) return std::nullopt;
  return core::gbps(static_cast<double>(sizeBytes), timeUs) * factor;
}

std::optional<double> choiceTime(const std::optional<Choice>& c) {
  if (!c || !(c->timeUs > 0)) return std::nullopt;
  return c->timeUs;
}

std::optional<double> bestTime(const std::optional<Best>& b) {
  if (!b || !(b->timeUs > 0)) return std::nullopt;
  return b->timeUs;
}

std::optional<double> ratio(std::optional<double> num, double den) {
  if (!num || !(den > 0)) return std::nullopt;
  return *num / den;
}

// ---------------------------------------------------------------------------------------------------------------
// SVG plots

struct Series {
  std::string_view key;  // data-series, and the legend's first word
  std::string_view label;
  std::string_view color;
  bool dashed = false;
  std::vector<std::optional<double>> values;  // per size
  std::vector<std::string> notes;             // per size, added to the point's tooltip
};

struct PlotSpec {
  std::string_view kind;  // data-plot: "busbw" or "ratio"
  std::string title;
  std::string yLabel;
  std::string unit;  // after values in tooltips
  bool logY = false;
  std::optional<double> reference;  // a horizontal line, e.g. time == bound
  std::string referenceLabel;
  std::vector<std::uint64_t> sizes;
  std::vector<Series> series;
};

constexpr double kWidth = 760;
constexpr double kHeight = 360;
constexpr double kLeft = 64;
constexpr double kRight = 16;
constexpr double kTop = 48;
constexpr double kBottom = 48;

double niceStep(double x) {
  const double p = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

struct Axis {
  double lo = 0;
  double hi = 1;
  bool log = false;
  std::vector<double> ticks;
  double fraction(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
};

Axis yAxis(const PlotSpec& spec) {
  double mn = std::numeric_limits<double>::infinity();
  double mx = 0;
  for (const Series& s : spec.series) {
    for (const auto& v : s.values) {
      if (!v) continue;
      mn = std::min(mn, *v);
      mx = std::max(mx, *v);
    }
  }
  if (spec.reference) {
    mn = std::min(mn, *spec.reference);
    mx = std::max(mx, *spec.reference);
  }
  Axis a;
  if (spec.logY) {
    a.log = true;
    if (!(mx > 0)) mx = 10;
    if (!(mn > 0) || !std::isfinite(mn)) mn = 1;
    // A little room so the reference line and the extreme points do not sit on the frame.
    a.lo = mn / 1.15;
    a.hi = mx * 1.15;
    const double decades = std::log10(a.hi / a.lo);
    const std::vector<double> mantissas = decades < 1    ? std::vector<double>{1, 1.2, 1.5, 2, 3, 4, 5, 6, 8}
                                          : decades <= 3 ? std::vector<double>{1, 2, 5}
                                                         : std::vector<double>{1};
    for (int e = static_cast<int>(std::floor(std::log10(a.lo))); e <= static_cast<int>(std::ceil(std::log10(a.hi)));
         ++e) {
      for (const double m : mantissas) {
        const double v = m * std::pow(10.0, e);
        if (v >= a.lo && v <= a.hi) a.ticks.push_back(v);
      }
    }
    return a;
  }
  if (!(mx > 0)) mx = 1;
  const double step = niceStep(mx / 5);
  a.lo = 0;
  a.hi = step * std::ceil(mx * 1.02 / step);
  for (int i = 0; i * step <= a.hi * (1 + 1e-9); ++i) a.ticks.push_back(i * step);
  return a;
}

std::string renderPlot(const PlotSpec& spec) {
  std::string out;
  auto o = std::back_inserter(out);
  const double plotW = kWidth - kLeft - kRight;
  const double plotH = kHeight - kTop - kBottom;

  // x: log2 of the message size, whole powers of two at the ends.
  double xmin = std::numeric_limits<double>::infinity();
  double xmax = -std::numeric_limits<double>::infinity();
  for (const std::uint64_t s : spec.sizes) {
    if (s == 0) continue;
    const double l = std::log2(static_cast<double>(s));
    xmin = std::min(xmin, l);
    xmax = std::max(xmax, l);
  }
  if (!std::isfinite(xmin)) {
    xmin = 10;
    xmax = 30;
  }
  int e0 = static_cast<int>(std::floor(xmin));
  int e1 = static_cast<int>(std::ceil(xmax));
  if (e1 == e0) {
    --e0;
    ++e1;
  }
  auto px = [&](double log2Size) { return kLeft + (log2Size - e0) / (e1 - e0) * plotW; };
  const Axis y = yAxis(spec);
  auto py = [&](double v) { return kTop + (1 - y.fraction(v)) * plotH; };

  fmt::format_to(o,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                 "role=\"img\" data-plot=\"{2}\">\n",
                 kWidth, kHeight, spec.kind);
  fmt::format_to(o, "<title>{}</title>\n", esc(spec.title));
  fmt::format_to(o, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" stroke=\"#999\"/>\n", kLeft, kTop,
                 plotW, plotH);

  // y grid and labels
  for (const double t : y.ticks) {
    const double ty = py(t);
    fmt::format_to(o, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>\n", kLeft, coord(ty),
                   kLeft + plotW, coord(ty));
    fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, coord(ty + 4), num(t));
  }
  // x ticks at every power of two, labels thinned to about ten
  const int span = e1 - e0;
  const int labelStep = span <= 10 ? 1 : span <= 20 ? 2 : span <= 40 ? 4 : 8;
  for (int e = e0; e <= e1; ++e) {
    const double tx = px(e);
    const bool labelled = e % labelStep == 0;
    fmt::format_to(o, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"{3}\"/>\n", coord(tx),
                   labelled ? kTop : kTop + plotH, kTop + plotH + (labelled ? 5 : 3), labelled ? "#e6e6e6" : "#999");
    if (labelled && e >= 0 && e < 64) {
      fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", coord(tx), kTop + plotH + 18,
                     core::formatSize(std::uint64_t{1} << e));
    }
  }
  fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">message size</text>\n", kLeft + plotW / 2,
                 kHeight - 8);
  fmt::format_to(o, "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">{1}</text>\n",
                 kTop + plotH / 2, esc(spec.yLabel));
  fmt::format_to(o, "<text class=\"title\" x=\"{}\" y=\"16\">{}</text>\n", kLeft, esc(spec.title));

  if (spec.reference) {
    fmt::format_to(o,
                   "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#444\" stroke-dasharray=\"2 3\" "
                   "data-reference=\"{3}\"/>\n",
                   kLeft, coord(py(*spec.reference)), kLeft + plotW, num(*spec.reference));
  }

  // Series: solid lines through consecutive sizes, a faint dotted bridge over sizes without a value, so a gap
  // never reads as a measurement (and never as zero).
  for (const Series& s : spec.series) {
    const std::string dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
    std::string points;
    std::string previous;  // the last plotted point, where a bridge starts
    bool gap = false;
    auto flush = [&] {
      if (points.find(' ') != std::string::npos) {
        fmt::format_to(o, "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}/>\n", points,
                       s.color, dash);
      }
      points.clear();
    };
    for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
      if (!s.values[i] || spec.sizes[i] == 0) {
        flush();
        gap = true;
        continue;
      }
      const std::string point =
          coord(px(std::log2(static_cast<double>(spec.sizes[i])))) + "," + coord(py(*s.values[i]));
      if (gap && !previous.empty()) {
        fmt::format_to(o,
                       "<polyline points=\"{} {}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1\" "
                       "stroke-dasharray=\"1 4\" opacity=\"0.6\" data-gap=\"{}\"/>\n",
                       previous, point, s.color, s.key);
      }
      gap = false;
      if (!points.empty()) points += ' ';
      points += point;
      previous = point;
    }
    flush();
  }
  bool any = false;
  for (const Series& s : spec.series) {
    for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
      if (!s.values[i] || spec.sizes[i] == 0) continue;
      any = true;
      const std::string note = s.notes[i].empty() ? "" : " (" + s.notes[i] + ")";
      // The bound is a limit, not a measurement: hollow markers.
      const std::string paint =
          s.dashed ? fmt::format("fill=\"#fff\" stroke=\"{}\"", s.color) : fmt::format("fill=\"{}\"", s.color);
      fmt::format_to(o,
                     "<circle data-plot=\"{}\" data-series=\"{}\" data-size=\"{}\" data-value=\"{}\" cx=\"{}\" "
                     "cy=\"{}\" r=\"3\" {}><title>{}</title></circle>\n",
                     spec.kind, s.key, spec.sizes[i], num(*s.values[i]),
                     coord(px(std::log2(static_cast<double>(spec.sizes[i])))), coord(py(*s.values[i])), paint,
                     esc(fmt::format("{} at {}: {} {}{}", s.key, core::formatSize(spec.sizes[i]), num(*s.values[i]),
                                     spec.unit, note)));
    }
  }
  if (!any) {
    fmt::format_to(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n", kLeft + plotW / 2,
                   kTop + plotH / 2);
  }

  // Legend, one row above the frame.
  double lx = kLeft;
  for (const Series& s : spec.series) {
    fmt::format_to(o, "<line x1=\"{}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", lx,
                   lx + 18, s.color, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    const std::string text = fmt::format("{} ({})", s.key, s.label);
    fmt::format_to(o, "<text class=\"legend\" x=\"{}\" y=\"38\">{}</text>\n", lx + 22, esc(text));
    lx += 30 + 6.2 * static_cast<double>(text.size());
  }
  if (spec.reference) {
    fmt::format_to(o, "<line x1=\"{}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"#444\" stroke-dasharray=\"2 3\"/>\n", lx,
                   lx + 18);
    fmt::format_to(o, "<text class=\"legend\" x=\"{}\" y=\"38\">{}</text>\n", lx + 22, esc(spec.referenceLabel));
  }
  out += "</svg>\n";
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Page sections

constexpr std::string_view kColorNccl = "#d62728";
constexpr std::string_view kColorNative = "#ff7f0e";
constexpr std::string_view kColorOptiflow = "#1f77b4";
constexpr std::string_view kColorBound = "#7f7f7f";

constexpr std::string_view kStyle = R"(body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}
h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.8em 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f4f4f4}
.l{text-align:left}
.none{color:#999}
.win{color:#1a7f37;font-weight:600}
.loss{color:#b42318}
.gain{font-weight:600;background:#eaf6ea}
.note{color:#555}
.scroll{overflow-x:auto}
small{color:#666}
svg{display:block;margin:.6em 0}
svg text{font:11px sans-serif;fill:#333}
svg text.title{font-size:13px;font-weight:600}
)";

std::string td(const std::string& html, std::string_view cls = "", std::string_view title = "") {
  std::string attrs;
  if (!cls.empty()) attrs += fmt::format(" class=\"{}\"", cls);
  if (!title.empty()) attrs += fmt::format(" title=\"{}\"", esc(title));
  return fmt::format("<td{}>{}</td>", attrs, html);
}
std::string missing() { return td("&#8212;", "none"); }
std::string optNum(std::optional<double> v, std::string_view suffix = "") {
  return v ? td(num(*v) + std::string(suffix)) : missing();
}

// The MSCCL++ plan that synthesize wrote beside a winner (schedules/STEM.mscclpp.json), when the run directory has
// it: its link, and its own predicted time where that differs from the schedule's by more than 10%.
struct MscclppContext {
  std::filesystem::path dir;
  std::optional<core::Topology> topology;
};

std::string mscclppCell(const MscclppContext& ctx, const PlanEntry& e) {
  if (!e.best || ctx.dir.empty()) return "";
  const std::string& json = e.best->scheduleJson;
  const std::string_view prefix = "schedules/";
  if (json.rfind(prefix, 0) != 0 || json.find("..") != std::string::npos || json.size() < 5 ||
      json.compare(json.size() - 5, 5, ".json") != 0) {
    return "";
  }
  const std::string rel = json.substr(0, json.size() - 5) + ".mscclpp.json";
  const auto text = core::readWholeFile(ctx.dir / rel);
  if (!text) return "";
  std::string cell = link(rel, "mscclpp");
  if (!ctx.topology) return cell;
  const auto plan = compiler::mscclpp::parseMscclppPlan(*text, rel);
  if (!plan) return cell;
  const auto t = compiler::mscclpp::timePlan(*plan, *ctx.topology, e.sizeBytes);
  if (t.ok && std::abs(t.timeUs - e.best->timeUs) > 0.1 * e.best->timeUs) {
    cell += fmt::format(
        " <span class=\"note\" title=\"predicted time of the MSCCL++ plan (one-sided puts and "
        "signals), beside the schedule's {} \u00b5s\">(plan {} \u00b5s)</span>",
        num(e.best->timeUs), num(t.timeUs));
  }
  return cell;
}

void renderCollective(std::string& out, const PlanCollective& c, int index, const MscclppContext& mscclpp) {
  auto o = std::back_inserter(out);
  const double factor = core::busBandwidthFactor(c.collective, c.ranks);
  const std::string name = collectiveName(c);
  const std::string anchor = fmt::format("c{}-{}", index, name);
  fmt::format_to(o, "<section id=\"{}\">\n<h2>{}, {} ranks on {}</h2>\n", esc(anchor), esc(name), c.ranks,
                 plural(c.nodes, "node"));
  if (c.entries.empty()) {
    out += "<p class=\"note\">No message sizes in this run.</p>\n</section>\n";
    return;
  }

  // Headline: where the discovered schedules beat NCCL's own choice.
  int compared = 0;
  int wins = 0;
  double bestSpeedup = 0;
  std::uint64_t bestAt = 0;
  for (const Entry& e : c.entries) {
    const auto n = choiceTime(e.nccl);
    const auto b = bestTime(e.best);
    if (!n || !b) continue;
    ++compared;
    const double s = *n / *b;
    if (s > 1) ++wins;
    if (s > bestSpeedup) {
      bestSpeedup = s;
      bestAt = e.sizeBytes;
    }
  }
  if (compared > 0) {
    fmt::format_to(
        o, "<p>Faster than NCCL's choice at {} of {} sizes{}. busbw factor {} (nccl-tests).</p>\n", wins, compared,
        bestSpeedup > 1 ? fmt::format(", up to {}&#215; at {}", num(bestSpeedup), core::formatSize(bestAt)) : "",
        num(factor));
  } else {
    fmt::format_to(o, "<p>No size has both an NCCL time and a discovered schedule. busbw factor {}.</p>\n",
                   num(factor));
  }

  std::vector<std::uint64_t> sizes;
  for (const Entry& e : c.entries) sizes.push_back(e.sizeBytes);

  auto makeSeries = [&](std::string_view key, std::string_view label, std::string_view color, bool dashed) {
    Series s{key, label, color, dashed, {}, {}};
    s.values.resize(c.entries.size());
    s.notes.resize(c.entries.size());
    return s;
  };
  Series nccl = makeSeries("nccl", "NCCL's choice", kColorNccl, false);
  Series native = makeSeries("native", "best NCCL config", kColorNative, false);
  Series optiflow = makeSeries("optiflow", "discovered", kColorOptiflow, false);
  Series bound = makeSeries("bound", "lower bound", kColorBound, true);
  Series ncclRatio = makeSeries("nccl", "NCCL's choice", kColorNccl, false);
  Series nativeRatio = makeSeries("native", "best NCCL config", kColorNative, false);
  Series optiflowRatio = makeSeries("optiflow", "discovered", kColorOptiflow, false);
  for (std::size_t i = 0; i < c.entries.size(); ++i) {
    const Entry& e = c.entries[i];
    if (auto t = choiceTime(e.nccl)) {
      nccl.values[i] = busbw(e.sizeBytes, *t, factor);
      nccl.notes[i] = fmt::format("{}, {} \u00b5s", choiceLabel(*e.nccl), num(*t));
      ncclRatio.values[i] = ratio(t, e.boundUs);
      ncclRatio.notes[i] = nccl.notes[i];
    }
    if (auto t = choiceTime(e.native)) {
      native.values[i] = busbw(e.sizeBytes, *t, factor);
      native.notes[i] = fmt::format("{}, {} \u00b5s", choiceLabel(*e.native), num(*t));
      nativeRatio.values[i] = ratio(t, e.boundUs);
      nativeRatio.notes[i] = native.notes[i];
    }
    if (auto t = bestTime(e.best)) {
      optiflow.values[i] = busbw(e.sizeBytes, *t, factor);
      optiflow.notes[i] = fmt::format("{} {}, {} \u00b5s", e.best->program, e.best->config, num(*t));
      optiflowRatio.values[i] = ratio(t, e.boundUs);
      optiflowRatio.notes[i] = optiflow.notes[i];
    }
    bound.values[i] = busbw(e.sizeBytes, e.boundUs, factor);
    if (bound.values[i]) bound.notes[i] = fmt::format("{} \u00b5s", num(e.boundUs));
  }

  const PlotSpec bw{.kind = "busbw",
                    .title = fmt::format("{}: bus bandwidth", name),
                    .yLabel = "busbw (GB/s)",
                    .unit = "GB/s",
                    .logY = false,
                    .reference = std::nullopt,
                    .referenceLabel = "",
                    .sizes = sizes,
                    .series = {nccl, native, optiflow, bound}};
  const PlotSpec over{.kind = "ratio",
                      .title = fmt::format("{}: time over the lower bound", name),
                      .yLabel = "time / bound",
                      .unit = "\u00d7 bound",
                      .logY = true,
                      .reference = 1.0,
                      .referenceLabel = "time = bound",
                      .sizes = sizes,
                      .series = {ncclRatio, nativeRatio, optiflowRatio}};
  out += renderPlot(bw);
  out += renderPlot(over);

  out += "<div class=\"scroll\">\n<table class=\"data\">\n<thead>\n";
  out +=
      "<tr><th rowspan=\"2\">size</th><th colspan=\"3\">NCCL's choice</th><th colspan=\"3\">best NCCL-native</th>"
      "<th colspan=\"4\">OptiFlow</th><th colspan=\"2\">speedup</th><th colspan=\"2\">lower bound</th>"
      "<th colspan=\"2\">time / bound</th><th rowspan=\"2\">schedule</th></tr>\n";
  out +=
      "<tr><th>config</th><th>&#181;s</th><th>GB/s</th><th>config</th><th>&#181;s</th><th>GB/s</th>"
      "<th>program</th><th>config</th><th>&#181;s</th><th>GB/s</th><th>vs NCCL</th><th>vs native</th>"
      "<th>&#181;s</th><th>GB/s</th><th>NCCL</th><th>OptiFlow</th></tr>\n</thead>\n<tbody>\n";
  for (std::size_t i = 0; i < c.entries.size(); ++i) {
    const Entry& e = c.entries[i];
    const std::string range = e.maxBytes == std::numeric_limits<std::uint64_t>::max()
                                  ? fmt::format("{} bytes; serves {} and up", e.sizeBytes, e.minBytes)
                                  : fmt::format("{} bytes; serves {} to {}", e.sizeBytes, e.minBytes, e.maxBytes);
    std::string row = fmt::format("<tr data-size=\"{}\">", e.sizeBytes);
    row += td(core::formatSize(e.sizeBytes), "l", range);
    for (const auto* choice : {&e.nccl, &e.native}) {
      const auto t = choiceTime(*choice);
      row += *choice ? td(esc(choiceLabel(**choice)), "l") : missing();
      row += optNum(t);
      row += optNum(t ? busbw(e.sizeBytes, *t, factor) : std::nullopt);
    }
    const auto bt = bestTime(e.best);
    if (e.best) {
      std::string program = link(e.best->programFile, e.best->program);
      if (!e.best->candidate.empty()) program += fmt::format(" <small>{}</small>", esc(e.best->candidate));
      row += td(program, "l");
      row += td(esc(e.best->config), "l");
    } else {
      row += td("no candidate worked", "l none");
      row += missing();
    }
    row += optNum(bt);
    row += optNum(bt ? busbw(e.sizeBytes, *bt, factor) : std::nullopt);
    for (const auto& base : {choiceTime(e.nccl), choiceTime(e.native)}) {
      if (base && bt) {
        const double s = *base / *bt;
        row += td(num(s) + "&#215;", s > 1 ? "win" : s < 1 ? "loss" : "");
      } else {
        row += missing();
      }
    }
    const std::string effective =
        e.effectiveBoundUs > 0
            ? fmt::format("at the simulator's link efficiencies: {} \u00b5s", num(e.effectiveBoundUs))
            : "";
    row += e.boundUs > 0 ? td(num(e.boundUs), "", effective) : missing();
    row += optNum(busbw(e.sizeBytes, e.boundUs, factor));
    row += optNum(ratio(choiceTime(e.nccl), e.boundUs), "&#215;");
    row += optNum(ratio(bt, e.boundUs), "&#215;");
    std::vector<std::string> files;
    if (e.best && !e.best->scheduleJson.empty()) files.push_back(link(e.best->scheduleJson, "json"));
    if (e.best && !e.best->scheduleXml.empty()) files.push_back(link(e.best->scheduleXml, "xml"));
    if (const std::string m = mscclppCell(mscclpp, e); !m.empty()) files.push_back(m);
    row += files.empty() ? missing() : td(fmt::format("{}", fmt::join(files, " ")), "l");
    row += "</tr>\n";
    out += row;
  }
  out += "</tbody>\n</table>\n</div>\n</section>\n";
}

void renderHistory(std::string& out, const History& h) {
  auto o = std::back_inserter(out);
  out += "<section id=\"history\">\n<h2>History</h2>\n";
  if (h.tornTail) {
    out +=
        "<p class=\"note\">The last line of history.jsonl is incomplete (the run stopped while writing it) and "
        "was skipped.</p>\n";
  }
  if (h.records.empty()) {
    out += "<p class=\"note\">history.jsonl holds no candidates.</p>\n</section>\n";
    return;
  }
  std::set<int> rounds;
  std::set<std::string> otherStages;
  static constexpr std::string_view kStages[] = {"ok", "parse", "expand", "duplicate"};
  auto known = [](std::string_view s) {
    return std::find(std::begin(kStages), std::end(kStages), s) != std::end(kStages);
  };
  for (const CandidateRecord& r : h.records) {
    rounds.insert(r.round);
    if (!known(r.stage)) otherStages.insert(r.stage);
  }
  fmt::format_to(o, "<p>{} candidates in {}.</p>\n", h.records.size(),
                 plural(static_cast<int>(rounds.size()), "round"));

  out += "<h3>Candidates per stage</h3>\n<table class=\"stages\">\n<tr><th>round</th><th>candidates</th>";
  for (const auto s : kStages) fmt::format_to(o, "<th>{}</th>", s);
  for (const auto& s : otherStages) fmt::format_to(o, "<th>{}</th>", esc(s));
  out += "</tr>\n";
  auto stageRow = [&](std::string_view label, std::optional<int> round) {
    std::map<std::string, int> counts;
    int total = 0;
    for (const CandidateRecord& r : h.records) {
      if (round && r.round != *round) continue;
      ++counts[r.stage];
      ++total;
    }
    fmt::format_to(o, "<tr data-round=\"{}\"><th>{}</th><td>{}</td>", label, label, total);
    for (const auto s : kStages) {
      fmt::format_to(o, "<td data-stage=\"{}\">{}</td>", s, counts[std::string(s)]);
    }
    for (const auto& s : otherStages) fmt::format_to(o, "<td data-stage=\"{0}\">{1}</td>", esc(s), counts[s]);
    out += "</tr>\n";
  };
  for (const int r : rounds) stageRow(fmt::format("{}", r), r);
  if (rounds.size() > 1) stageRow("all", std::nullopt);
  out += "</table>\n";

  // Best time per size so far, after each round, as a ratio to the bound (the time where there is no bound).
  std::set<std::uint64_t> sizes;
  for (const CandidateRecord& r : h.records) {
    if (r.stage != "ok") continue;
    for (const SizeResult& s : r.sizes) sizes.insert(s.sizeBytes);
  }
  if (sizes.empty()) {
    out += "<p class=\"note\">No candidate was evaluated.</p>\n</section>\n";
    return;
  }
  out +=
      "<h3>Best time over the lower bound, after each round</h3>\n<div class=\"scroll\">\n<table class=\"rounds\">\n";
  out += "<tr><th>size</th>";
  for (const int r : rounds) fmt::format_to(o, "<th>round {}</th>", r);
  out += "</tr>\n";
  for (const std::uint64_t size : sizes) {
    fmt::format_to(o, "<tr data-size=\"{}\"><td class=\"l\">{}</td>", size, core::formatSize(size));
    const CandidateRecord* best = nullptr;
    const SizeResult* bestSize = nullptr;
    std::optional<double> previous;
    for (const int round : rounds) {
      for (const CandidateRecord& r : h.records) {
        if (r.round != round || r.stage != "ok") continue;
        for (const SizeResult& s : r.sizes) {
          if (s.sizeBytes != size || !s.ok || !(s.timeUs > 0)) continue;
          if (!bestSize || s.timeUs < bestSize->timeUs) {
            best = &r;
            bestSize = &s;
          }
        }
      }
      if (!bestSize) {
        fmt::format_to(o, "<td data-round=\"{}\" class=\"none\">&#8212;</td>", round);
        continue;
      }
      const bool gain = !previous || bestSize->timeUs < *previous;
      previous = bestSize->timeUs;
      const std::string value = bestSize->boundUs > 0 ? num(bestSize->timeUs / bestSize->boundUs) + "&#215;"
                                                      : num(bestSize->timeUs) + " &#181;s";
      fmt::format_to(o, "<td data-round=\"{}\"{} title=\"{}\">{}</td>", round, gain ? " class=\"gain\"" : "",
                     esc(fmt::format("{} \u00b5s, {}", num(bestSize->timeUs), best->id)), value);
    }
    out += "</tr>\n";
  }
  out += "</table>\n</div>\n<p class=\"note\">Highlighted: the round that improved the size.</p>\n</section>\n";
}

std::string renderPage(const PlanFile& plan, const std::optional<History>& history, const MscclppContext& mscclpp) {
  std::string out;
  auto o = std::back_inserter(out);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  fmt::format_to(o, "<title>OptiFlow report: {}</title>\n", esc(plan.topology));
  fmt::format_to(o, "<style>\n{}</style>\n</head>\n<body>\n", kStyle);
  fmt::format_to(o, "<h1>OptiFlow report: {}</h1>\n", esc(plan.topology));
  fmt::format_to(o, "<p class=\"summary\">{} ranks on {}{}", plan.ranks, plural(plan.nodes, "node"),
                 plan.gpusPerNode > 0 ? fmt::format(" ({} GPUs per node)", plan.gpusPerNode) : "");
  for (const auto& [label, value] : runSettings(plan)) fmt::format_to(o, " &#183; {} {}", esc(label), esc(value));
  out += "</p>\n";
  if (plan.collectives.size() > 1 || history) {
    out += "<nav>";
    for (std::size_t i = 0; i < plan.collectives.size(); ++i) {
      const std::string name = collectiveName(plan.collectives[i]);
      fmt::format_to(o, "<a href=\"#{}\">{}</a> ", esc(fmt::format("c{}-{}", i, name)), esc(name));
    }
    if (history) out += "<a href=\"#history\">history</a>";
    out += "</nav>\n";
  }
  if (plan.collectives.empty()) out += "<p class=\"note\">The plan holds no collectives.</p>\n";
  for (std::size_t i = 0; i < plan.collectives.size(); ++i) {
    renderCollective(out, plan.collectives[i], static_cast<int>(i), mscclpp);
  }
  if (history) renderHistory(out, *history);
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace

core::Result<std::string> renderReport(const std::filesystem::path& dir) {
  try {
    auto plan = loadPlan(dir);
    if (!plan) return plan.error();
    auto history = loadHistory(dir);
    if (!history) return history.error();
    MscclppContext mscclpp{dir, std::nullopt};
    if (auto topo = core::loadTopology(plan->topology)) mscclpp.topology = std::move(topo).value();
    return renderPage(*plan, *history, mscclpp);
  } catch (const std::exception& e) {
    return core::Diagnostic{dir.string(), 0, 0, fmt::format("cannot render the report: {}", e.what())};
  } catch (...) {
    return core::Diagnostic{dir.string(), 0, 0, "cannot render the report"};
  }
}

}  // namespace optiflow::synth
