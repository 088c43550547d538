#include "optiflow/calib/nccl_tests_log.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "optiflow/core/json_walk.h"
#include "optiflow/core/text_file.h"

namespace optiflow::calib {

namespace {

using core::Collective;

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::vector<std::string_view> tokens(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && isSpace(s[i])) ++i;
    const std::size_t b = i;
    while (i < s.size() && !isSpace(s[i])) ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

std::optional<std::uint64_t> toUint(std::string_view t) {
  std::uint64_t v = 0;
  if (t.empty() || t.size() > 20) return std::nullopt;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<std::int64_t> toInt(std::string_view t) {
  std::int64_t v = 0;
  if (t.empty() || t.size() > 20) return std::nullopt;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<double> toDouble(std::string_view t) {
  double v = 0;
  if (t.empty() || t.size() > 40) return std::nullopt;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool isWord(std::string_view t) {
  if (t.empty() || t.size() > 24) return false;
  if (!std::isalpha(static_cast<unsigned char>(t[0]))) return false;
  return std::all_of(t.begin(), t.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before.
int normaliseVersionCode(std::int64_t code) {
  if (code <= 0 || code > 1000000) return 0;
  if (code < 10000) return static_cast<int>((code / 1000) * 10000 + ((code % 1000) / 100) * 100 + code % 100);
  return static_cast<int>(code);
}

// "2.18.5+cuda12.2" -> 21805.
int parseDottedVersion(std::string_view v) {
  int parts[3] = {0, 0, 0};
  int k = 0;
  std::size_t i = 0;
  while (k < 3 && i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) {
    int n = 0;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && n < 100000) n = n * 10 + (v[i++] - '0');
    parts[k++] = n;
    if (i < v.size() && v[i] == '.')
      ++i;
    else
      break;
  }
  if (k < 2 || parts[0] > 99 || parts[1] > 99 || parts[2] > 99) return 0;  // major * 10000 must fit an int
  return parts[0] * 10000 + parts[1] * 100 + parts[2];
}

// A header line is '#' after nothing or after one prefix token (mpirun's "[1,0]<stdout>:", srun's "0:", "[0]").
// NCCL's own log lines ("host:pid:tid [dev] NCCL INFO ...") are never headers.
std::optional<std::string_view> headerBody(std::string_view line) {
  const std::size_t hash = line.find('#');
  if (hash == std::string_view::npos) return std::nullopt;
  const auto pre = tokens(line.substr(0, hash));
  if (pre.size() > 1) return std::nullopt;
  if (!pre.empty() && pre[0].size() > 48) return std::nullopt;
  return line.substr(hash + 1);
}

// Where the value after `key` stands in `t` ("key value" or "key: value"); nullopt when absent.
std::optional<std::string_view> valueAfter(const std::vector<std::string_view>& t, std::string_view key) {
  for (std::size_t i = 0; i + 1 < t.size(); ++i) {
    if (t[i] == key) return t[i + 1];
  }
  return std::nullopt;
}

// Column layout of a table, from its header line or nccl-tests' defaults.
struct Layout {
  // Row token index of redop and root; -1 when the table has no such column (before 2022-08 only broadcast_perf and
  // reduce_perf print a root, and all_gather_perf and broadcast_perf no redop).
  int redop = 3;
  int root = 4;
  // Row token index of each mode's time and #wrong/error; -1 when the group is absent.
  int time[2] = {5, 9};
  int wrong[2] = {8, 12};
  bool errorFloat = false;  // "error" (before 2022-08) instead of "#wrong"
  int needed = 13;          // tokens a complete row has (up to the last column we read)
};

// A headerless row (a pasted table body): nccl-tests' layout, with a redop column when the fourth token is a word and
// a root column when the next is an integer and there are enough columns for it.
Layout defaultLayout(const std::vector<std::string_view>& t, bool rowRedop) {
  Layout l;
  int lead = rowRedop ? 4 : 3;
  l.redop = rowRedop ? 3 : -1;
  const bool hasRoot = static_cast<int>(t.size()) >= lead + 9 && toInt(t[static_cast<std::size_t>(lead)]).has_value();
  l.root = hasRoot ? lead : -1;
  if (hasRoot) ++lead;
  l.time[0] = lead;
  l.wrong[0] = lead + 3;
  l.time[1] = lead + 4;
  l.wrong[1] = lead + 7;
  l.needed = lead + 8;
  // Rows without redop or root are older than 2022-09; those older than 2022-08 have the "error" float (a #wrong
  // count of the month between parses as an integer).
  l.errorFloat = !(rowRedop && hasRoot);
  return l;
}

// The header line "size count type redop [root] time algbw busbw #wrong time ...". nullopt when `body` is not it.
std::optional<Layout> layoutFromHeader(std::string_view body) {
  const auto t = tokens(body);
  if (t.size() < 6 || t[0] != "size" || t[1] != "count") return std::nullopt;
  Layout l;
  l.redop = l.root = -1;
  l.time[0] = l.time[1] = l.wrong[0] = l.wrong[1] = -1;
  int group = -1;
  int last = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const int idx = static_cast<int>(i);
    if (group < 0 && t[i] == "redop") l.redop = idx;
    if (group < 0 && t[i] == "root") l.root = idx;
    if (t[i] == "time" || t[i] == "cputime") {
      if (++group > 1) break;
      l.time[group] = idx;
      last = std::max(last, idx);
    } else if (group >= 0 && (t[i] == "#wrong" || t[i] == "error" || t[i] == "wrong")) {
      l.wrong[group] = idx;
      l.errorFloat = t[i] == "error";
      last = std::max(last, idx);
    }
  }
  if (l.time[0] < 0) return std::nullopt;
  l.needed = last + 1;
  return l;
}

struct Parser {
  std::string_view file;
  NcclTestsLog log;
  LogRun* run = nullptr;
  std::optional<Layout> layout;
  std::set<int> rankIds;
  std::vector<std::string> hostOrder;
  bool runHasRows = false;
  int globalNcclVersion = 0;  // an INFO line's "NCCL version" applies to the run it sits in

  std::string where(int line) const { return fmt::format("{}:{}", file, line); }

  void finishRun() {
    if (!run) return;
    run->ranks = static_cast<int>(rankIds.size());
    run->hosts = hostOrder;
    run->nodes = static_cast<int>(hostOrder.size());
    if (run->ncclVersion == 0) run->ncclVersion = globalNcclVersion;
  }

  void startRun(int line) {
    finishRun();
    log.runs.emplace_back();
    run = &log.runs.back();
    run->line = line;
    layout.reset();
    rankIds.clear();
    hostOrder.clear();
    runHasRows = false;
  }

  // A header line opens a new run when the current one already has rows (or none is open).
  void ensureRunForHeader(int line) {
    if (!run || runHasRows) startRun(line);
  }

  void header(std::string_view body, int line) {
    const auto t = tokens(body);
    if (t.empty()) return;
    if (t[0] == "nccl-tests" && t.size() >= 2 && t[1] == "version") {
      ensureRunForHeader(line);
      if (t.size() >= 3) run->testsVersion = std::string(t[2]);
      for (std::string_view x : t) {
        if (x.starts_with("nccl-library=")) {
          if (auto v = toInt(x.substr(13))) run->ncclVersion = normaliseVersionCode(*v);
        }
      }
      return;
    }
    if (t[0] == "Collective" && t.size() >= 4 && t[1] == "test" && t[2] == "starting:") {
      if (!run || runHasRows || !run->program.empty()) startRun(line);
      run->program = std::string(t[3]);
      if (auto c = collectiveFromProgram(t[3])) {
        run->collective = c;
        run->collectiveFrom = "program";
      }
      return;
    }
    if (t[0] == "nThread") {
      if (!run || runHasRows || run->iters > 0) startRun(line);
      if (auto v = valueAfter(t, "graph:")) run->graph = static_cast<int>(toInt(*v).value_or(0));
      // "warmup iters: W iters: I agg iters: K": the plain "iters:" is the third.
      for (std::size_t i = 1; i + 1 < t.size(); ++i) {
        if (t[i] != "iters:") continue;
        const int v = static_cast<int>(toInt(t[i + 1]).value_or(0));
        if (t[i - 1] == "warmup")
          run->warmupIters = v;
        else if (t[i - 1] != "agg")
          run->iters = v;
      }
      return;
    }
    if (t[0] == "Rank" && t.size() >= 2) {
      const auto id = toInt(t[1]);
      const auto host = valueAfter(t, "on");
      if (!id || *id < 0 || *id > (1 << 24) || !host) return;
      ensureRunForHeader(line);
      rankIds.insert(static_cast<int>(*id));
      if (std::find(hostOrder.begin(), hostOrder.end(), *host) == hostOrder.end()) hostOrder.emplace_back(*host);
      if (*id == 0 || run->gpuName.empty()) {
        const std::size_t close = body.find(']');
        if (close != std::string_view::npos) {
          std::string_view name = body.substr(close + 1);
          while (!name.empty() && isSpace(name.front())) name.remove_prefix(1);
          while (!name.empty() && isSpace(name.back())) name.remove_suffix(1);
          run->gpuName = std::string(name.substr(0, 128));
        }
      }
      return;
    }
    if (auto l = layoutFromHeader(body)) {
      ensureRunForHeader(line);
      layout = l;
      for (std::string_view x : t) {
        if (x == "cputime") run->cpuTime = true;
      }
      return;
    }
  }

  // `line` holds a data row if, after at most one prefix token, it reads "size count type" (a row cut off right after
  // its first columns is still a row, counted as cut off).
  void maybeRow(std::string_view text, int lineNo) {
    auto t = tokens(text);
    if (t.size() < 3) return;
    std::size_t start = 0;
    if (!toUint(t[0]) || !toUint(t[1]) || !isWord(t[2])) start = 1;
    if (t.size() < start + 3) return;
    if (!toUint(t[start]) || !toUint(t[start + 1]) || typeBytes(t[start + 2]) == 0) return;
    t.erase(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(start));
    if (!run) startRun(lineNo);
    // Before 2022-09 the copy collectives print an empty redop, so the row lacks a column its header names.
    const bool rowRedop = t.size() > 3 && isWord(t[3]);
    Layout l = layout ? *layout : defaultLayout(t, rowRedop);
    if (l.redop >= 0 && !rowRedop) {
      for (int* c : {&l.root, &l.time[0], &l.time[1], &l.wrong[0], &l.wrong[1]}) {
        if (*c > l.redop) --*c;
      }
      l.redop = -1;
      --l.needed;
    }
    runHasRows = true;
    if (static_cast<int>(t.size()) < l.needed) {
      ++run->incompleteRows;
      run->notes.push_back(
          fmt::format("{}: row cut off ({} of {} columns), left out", where(lineNo), t.size(), l.needed));
      return;
    }
    LogRow r;
    r.line = lineNo;
    r.sizeBytes = *toUint(t[0]);
    r.count = *toUint(t[1]);
    r.type = std::string(t[2]);
    if (l.redop >= 0) r.redop = std::string(t[static_cast<std::size_t>(l.redop)]);
    if (l.root >= 0) {
      const auto root = toInt(t[static_cast<std::size_t>(l.root)]).value_or(-1);
      r.root = static_cast<int>(std::clamp<std::int64_t>(root, -1, 1 << 24));
    }
    for (int m = 0; m < 2; ++m) {
      if (l.time[m] < 0) continue;
      const auto v = toDouble(t[static_cast<std::size_t>(l.time[m])]);
      if (v && *v > 0) (m == 0 ? r.outOfPlaceUs : r.inPlaceUs) = *v;
      if (l.wrong[m] >= 0) {
        const std::string_view w = t[static_cast<std::size_t>(l.wrong[m])];
        std::int64_t wrong = -1;
        if (auto i = toInt(w)) {
          wrong = std::max<std::int64_t>(*i, -1);
        } else if (auto d = toDouble(w)) {
          // The old "error" column is the largest deviation: above float noise it means wrong results. A #wrong
          // count prints with %g, so a large one reads as a float ("1.04858e+06").
          if (l.errorFloat)
            wrong = *d > 1e-3 ? 1 : 0;
          else
            wrong = *d > 0 ? std::max<std::int64_t>(1, static_cast<std::int64_t>(std::min(*d, 1e18))) : 0;
        }
        (m == 0 ? r.outOfPlaceWrong : r.inPlaceWrong) = wrong;
      }
    }
    if (!r.outOfPlaceUs && !r.inPlaceUs) {
      ++run->incompleteRows;
      run->notes.push_back(fmt::format("{}: row has no readable time, left out", where(lineNo)));
      return;
    }
    run->rows.push_back(std::move(r));
  }

  void infoLine(std::string_view text) {
    const std::size_t at = text.find("NCCL version ");
    if (at == std::string_view::npos) return;
    const int v = parseDottedVersion(text.substr(at + 13));
    if (v == 0) return;
    if (run) {
      if (run->ncclVersion == 0) run->ncclVersion = v;
    } else {
      globalNcclVersion = v;
    }
  }

  void parseText(std::string_view text) {
    int lineNo = 0;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      ++lineNo;
      if (line.size() > 4096) continue;  // not a line nccl-tests writes
      if (line.find("NCCL ") != std::string_view::npos &&
          (line.find(" INFO ") != std::string_view::npos || line.find(" WARN ") != std::string_view::npos)) {
        infoLine(line);
        continue;
      }
      if (auto body = headerBody(line)) {
        header(*body, lineNo);
        continue;
      }
      maybeRow(line, lineNo);
    }
    finishRun();
  }
};

// Collective from the columns of the rows: redop, root and how count relates to size. nccl-tests prints size as the
// whole buffer and count as the collective's count argument: per rank for all_gather, reduce_scatter, alltoall,
// gather and scatter (size = count x type x ranks), the whole buffer for the rest.
std::optional<Collective> inferCollective(const LogRun& run) {
  std::optional<Collective> seen;
  for (const LogRow& r : run.rows) {
    const int tb = typeBytes(r.type);
    if (tb == 0 || r.count == 0) continue;
    const std::uint64_t perRank = r.count * static_cast<std::uint64_t>(tb);
    // Copy collectives print "none", or nothing before 2022-09.
    const bool reduce = !r.redop.empty() && r.redop != "none";
    const bool gathered = run.ranks > 0 && perRank * static_cast<std::uint64_t>(run.ranks) == r.sizeBytes;
    std::optional<Collective> c;
    if (r.root >= 0) {
      // With a root and a gathered size it is gather_perf or scatter_perf: no collective of ours.
      if (perRank == r.sizeBytes) c = reduce ? Collective::Reduce : Collective::Broadcast;
    } else if (reduce && perRank == r.sizeBytes) {
      c = Collective::AllReduce;
    } else if (gathered) {
      // alltoall_perf prints the same columns as all_gather_perf; only its program name tells them apart.
      c = reduce ? Collective::ReduceScatter : Collective::AllGather;
    }
    if (!c) continue;
    if (seen && *seen != *c) return std::nullopt;
    seen = c;
  }
  return seen;
}

std::optional<double> jsonNumber(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

// A number as an int, clamped (a double past INT_MAX must not reach static_cast<int>).
std::optional<int> jsonInt(const nlohmann::json& j, std::string_view key) {
  const auto v = jsonNumber(j, key);
  if (!v) return std::nullopt;
  return static_cast<int>(std::clamp(*v, -2147483648.0, 2147483647.0));
}

std::string jsonString(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>().substr(0, 256);
}

core::Result<NcclTestsLog> parseJson(std::string_view text, std::string_view file) {
  if (const auto deep = core::firstBeyondNesting(text, 16)) {
    const auto [line, column] = core::lineColumn(text, *deep);
    return core::Diagnostic{std::string(file), line, column,
                            "JSON nested deeper than 16 levels: not a file nccl-tests writes with -J"};
  }
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return core::Diagnostic{std::string(file), 1, 1, "not JSON nccl-tests writes with -J: expected an object"};
  }
  const auto res = j.find("results");
  if (res == j.end() || !res->is_array()) {
    return core::Diagnostic{std::string(file), 0, 0,
                            "nccl-tests JSON without a \"results\" array: expected {\"config\", \"results\": [...]}"};
  }
  NcclTestsLog log;
  log.file = std::string(file);
  log.json = true;
  LogRun run;
  const nlohmann::json config = j.value("config", nlohmann::json::object());
  // nccl-tests names the program only in the command line: "args"[0] is its path.
  std::string program;
  if (const auto args = j.find("args");
      args != j.end() && args->is_array() && !args->empty() && args->front().is_string()) {
    const std::string path = args->front().get<std::string>();
    const std::size_t slash = path.find_last_of('/');
    program = path.substr(slash == std::string::npos ? 0 : slash + 1, 256);
  }
  std::vector<std::string> names = {program};
  for (const char* key : {"collective", "test", "name", "program", "op"}) {
    names.push_back(jsonString(config, key));
    names.push_back(jsonString(j, key));
  }
  for (const std::string& p : names) {
    if (p.empty()) continue;
    if (auto c = collectiveFromProgram(p)) {
      run.program = p;
      run.collective = c;
      run.collectiveFrom = "program";
      break;
    }
    if (auto c = core::parseCollective(p)) {
      run.program = p;
      run.collective = c;
      run.collectiveFrom = "program";
      break;
    }
  }
  if (run.program.empty()) run.program = program;
  run.graph = jsonInt(config, "graph").value_or(0);
  run.iters = jsonInt(config, "iterations").value_or(jsonInt(config, "iters").value_or(0));
  run.warmupIters = jsonInt(config, "warmup_iters").value_or(0);
  run.ncclVersion = normaliseVersionCode(jsonInt(j, "nccl_version").value_or(0));
  std::set<int> ranks;
  std::vector<std::string> hosts;
  const nlohmann::json* devices = nullptr;
  if (config.is_object() && config.contains("devices") && config["devices"].is_array()) devices = &config["devices"];
  if (!devices && j.contains("devices") && j["devices"].is_array()) devices = &j["devices"];
  if (devices) {
    int next = 0;
    for (const auto& d : *devices) {
      const int r = jsonInt(d, "rank").value_or(next);
      ++next;
      if (r < 0 || r > (1 << 24)) continue;
      ranks.insert(r);
      for (const char* key : {"hostname", "host", "node"}) {
        const std::string h = jsonString(d, key);
        if (!h.empty()) {
          if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
          break;
        }
      }
      if (run.gpuName.empty()) {
        for (const char* key : {"device_info", "name", "device_name"}) {
          if (run.gpuName.empty()) run.gpuName = jsonString(d, key);
        }
      }
    }
  }
  // nccl-tests lists each process's first device, and a process drives nThreads x nGpus ranks.
  const int perProcess = std::clamp(jsonInt(config, "ngpus").value_or(1), 1, 1024) *
                         std::clamp(jsonInt(config, "nthreads").value_or(1), 1, 1024);
  run.ranks = static_cast<int>(std::min<std::size_t>(ranks.size() * static_cast<std::size_t>(perProcess), 1 << 24));
  run.hosts = hosts;
  run.nodes = static_cast<int>(hosts.size());
  int index = 0;
  for (const auto& r : *res) {
    ++index;
    const auto size = jsonNumber(r, "size");
    if (!size || *size <= 0 || *size > 1.8e19) {
      ++run.incompleteRows;
      run.notes.push_back(fmt::format("{}: results[{}] has no \"size\", left out", file, index - 1));
      continue;
    }
    LogRow row;
    row.sizeBytes = static_cast<std::uint64_t>(*size);
    row.count = static_cast<std::uint64_t>(std::clamp(jsonNumber(r, "count").value_or(0), 0.0, 1.8e19));
    row.type = jsonString(r, "type");
    row.redop = jsonString(r, "redop");
    // nccl-tests writes root as the text of the table column ("    -1").
    std::optional<std::int64_t> root;
    if (const auto v = jsonNumber(r, "root")) root = static_cast<std::int64_t>(std::clamp(*v, -1.0, 16777216.0));
    const std::string rootText = jsonString(r, "root");
    if (const auto t = tokens(rootText); !root && t.size() == 1) root = toInt(t[0]);
    row.root = static_cast<int>(std::clamp<std::int64_t>(root.value_or(-1), -1, 1 << 24));
    for (int m = 0; m < 2; ++m) {
      const char* key = m == 0 ? "out_of_place" : "in_place";
      if (!r.is_object() || !r.contains(key)) continue;
      const auto& g = r[key];
      auto t = jsonNumber(g, "time");
      if (!t) {
        t = jsonNumber(g, "cpu_time");
        if (t) run.cpuTime = true;
      }
      if (t && *t > 0) (m == 0 ? row.outOfPlaceUs : row.inPlaceUs) = *t;
      for (const char* w : {"nwrong", "wrong", "errors"}) {
        if (auto v = jsonNumber(g, w)) {
          (m == 0 ? row.outOfPlaceWrong : row.inPlaceWrong) = static_cast<std::int64_t>(std::clamp(*v, -1.0, 1e18));
          break;
        }
      }
    }
    if (!row.outOfPlaceUs && !row.inPlaceUs) {
      ++run.incompleteRows;
      run.notes.push_back(fmt::format("{}: results[{}] has no time, left out", file, index - 1));
      continue;
    }
    run.rows.push_back(std::move(row));
  }
  log.runs.push_back(std::move(run));
  return log;
}

}  // namespace

int typeBytes(std::string_view type) {
  static constexpr std::pair<std::string_view, int> kTypes[] = {
      {"int8", 1},  {"uint8", 1},   {"char", 1},     {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"f8e4m3", 1}, {"f8e5m2", 1},
      {"half", 2},  {"float16", 2}, {"bfloat16", 2}, {"bf16", 2},     {"fp16", 2},     {"float", 4},  {"float32", 4},
      {"int32", 4}, {"uint32", 4},  {"int", 4},      {"double", 8},   {"float64", 8},  {"int64", 8},  {"uint64", 8},
  };
  for (const auto& [name, bytes] : kTypes) {
    if (type == name) return bytes;
  }
  return 0;
}

std::optional<core::Collective> collectiveFromProgram(std::string_view program) {
  const std::size_t slash = program.find_last_of('/');
  if (slash != std::string_view::npos) program.remove_prefix(slash + 1);
  static constexpr std::pair<std::string_view, Collective> kPrograms[] = {
      {"all_reduce_perf", Collective::AllReduce},
      {"all_gather_perf", Collective::AllGather},
      {"reduce_scatter_perf", Collective::ReduceScatter},
      {"broadcast_perf", Collective::Broadcast},
      {"reduce_perf", Collective::Reduce},
      {"alltoall_perf", Collective::AllToAll},
  };
  for (const auto& [name, c] : kPrograms) {
    if (program == name || program.starts_with(std::string(name) + "_")) return c;
  }
  return std::nullopt;
}

core::Result<NcclTestsLog> parseNcclTestsLog(std::string_view text, std::string_view file) {
  std::size_t first = 0;
  while (first < text.size() && (isSpace(text[first]) || text[first] == '\n')) ++first;
  NcclTestsLog log;
  if (first < text.size() && text[first] == '{') {
    auto json = parseJson(text, file);
    if (!json) return json;
    log = std::move(*json);
  } else {
    Parser p{file, {}, nullptr, std::nullopt, {}, {}, false, 0};
    p.log.file = std::string(file);
    p.parseText(text);
    log = std::move(p.log);
  }
  // Drop header-only runs that precede a real one (a version line, then the run).
  std::vector<LogRun> runs;
  for (LogRun& r : log.runs) {
    if (r.rows.empty() && r.incompleteRows == 0) continue;
    runs.push_back(std::move(r));
  }
  log.runs = std::move(runs);
  for (LogRun& r : log.runs) {
    // A named program settles it: sendrecv_perf's rows read like all_reduce_perf's, gather_perf's like a broadcast.
    if (!r.collective && r.program.empty()) {
      if (auto c = inferCollective(r)) {
        r.collective = c;
        r.collectiveFrom = "columns";
      }
    }
  }
  int rows = 0;
  for (const LogRun& r : log.runs) rows += static_cast<int>(r.rows.size());
  if (rows == 0 && log.json) {
    return core::Diagnostic{std::string(file), 0, 0,
                            "nccl-tests JSON without a usable result: expected \"results\" entries with a \"size\" "
                            "and an \"out_of_place\" or \"in_place\" time"};
  }
  if (rows == 0) {
    const int incomplete = log.runs.empty() ? 0 : log.runs.front().incompleteRows;
    return core::Diagnostic{std::string(file), incomplete > 0 ? log.runs.front().line : 0, 0,
                            incomplete > 0
                                ? fmt::format("no complete result row ({} cut off): expected rows \"size count type "
                                              "redop root time algbw busbw #wrong time algbw busbw #wrong\"",
                                              incomplete)
                                : "not an nccl-tests log: no result row (expected lines \"size count type redop "
                                  "root time algbw busbw #wrong ...\" after the \"#  Rank\" lines)"};
  }
  return log;
}

core::Result<NcclTestsLog> readNcclTestsLog(const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    return core::Diagnostic{file.string(), 0, 0, "is a directory: expected an nccl-tests log file"};
  }
  const auto text = core::readWholeFile(file);
  if (!text) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
  return parseNcclTestsLog(*text, file.string());
}

}  // namespace optiflow::calib
