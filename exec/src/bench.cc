#include "optiflow/exec/bench.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/units.h"

namespace optiflow::exec {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

core::Diagnostic argError(std::string message) { return {"optiflow-bench", 0, 0, std::move(message)}; }

bool reduces(core::Collective c) {
  return c == core::Collective::AllReduce || c == core::Collective::ReduceScatter || c == core::Collective::Reduce;
}

bool rooted(core::Collective c) { return c == core::Collective::Broadcast || c == core::Collective::Reduce; }

// nccl-tests' count column: elements per rank for All-Gather and Reduce-Scatter, of the buffer for the others.
std::uint64_t countOf(core::Collective c, std::uint64_t bytes, int nRanks) {
  const std::uint64_t elems = bytes / sizeof(float);
  if (c == core::Collective::AllGather || c == core::Collective::ReduceScatter) {
    return elems / static_cast<std::uint64_t>(std::max(nRanks, 1));
  }
  return elems;
}

// nccl-tests prints times with 2, 1 or 0 decimals to fit 7 columns.
std::string timeText(double us) {
  if (us < 1e4) return fmt::format("{:.2f}", us);
  if (us < 1e5) return fmt::format("{:.1f}", us);
  return fmt::format("{:.0f}", us);
}

std::string bwText(double gbps) { return fmt::format("{:.2f}", gbps); }

core::Result<std::vector<BenchItem>> loadBatch(const fs::path& dir) {
  const fs::path manifest = dir / kBatchManifest;
  const std::string where = manifest.string();
  std::ifstream in(manifest, std::ios::binary);
  if (!in) return core::Diagnostic{where, 0, 0, "cannot read the batch manifest (a batch directory holds batch.json)"};
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return core::Diagnostic{where, 0, 0, "not a JSON object"};
  if (!j.contains("format") || j["format"] != kBatchFormat) {
    return core::Diagnostic{where, 0, 0, fmt::format("format: expected \"{}\"", kBatchFormat)};
  }
  if (!j.contains("items") || !j["items"].is_array()) return core::Diagnostic{where, 0, 0, "items: expected an array"};
  std::vector<BenchItem> out;
  for (std::size_t i = 0; i < j["items"].size(); ++i) {
    const json& it = j["items"][i];
    const std::string at = fmt::format("items[{}]", i);
    if (!it.is_object() || !it.contains("id") || !it["id"].is_string() || !it.contains("schedule") ||
        !it["schedule"].is_string()) {
      return core::Diagnostic{where, 0, 0, fmt::format("{}: expected {{\"id\": string, \"schedule\": string}}", at)};
    }
    const std::string file = it["schedule"].get<std::string>();
    if (file.find('/') != std::string::npos || file.starts_with(".")) {
      return core::Diagnostic{where, 0, 0,
                              fmt::format("{}.schedule: {:s} must name a file in the batch directory", at, file)};
    }
    auto s = compiler::loadSchedule((dir / file).string());
    if (!s) return s.error();
    BenchItem item{it["id"].get<std::string>(), (dir / file).string(), std::move(s).value(), {}};
    if (it.contains("sizes")) {
      if (!it["sizes"].is_array()) return core::Diagnostic{where, 0, 0, fmt::format("{}.sizes: expected an array", at)};
      for (const json& v : it["sizes"]) {
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() == 0) {
          return core::Diagnostic{where, 0, 0, fmt::format("{}.sizes: expected positive byte counts", at)};
        }
        item.sizes.push_back(v.get<std::uint64_t>());
      }
    }
    out.push_back(std::move(item));
  }
  return out;
}

ModeResult modeFromJson(const json& j) {
  ModeResult m;
  if (!j.is_object()) return m;
  m.ran = true;
  if (j.contains("time_us") && j["time_us"].is_number()) m.timeUs = j["time_us"].get<double>();
  if (j.contains("wrong") && j["wrong"].is_number_integer()) m.wrong = j["wrong"].get<std::int64_t>();
  return m;
}

}  // namespace

std::string_view ncclTestsProgram(core::Collective c) {
  switch (c) {
    case core::Collective::AllGather:
      return "all_gather_perf";
    case core::Collective::ReduceScatter:
      return "reduce_scatter_perf";
    case core::Collective::AllReduce:
      return "all_reduce_perf";
    case core::Collective::Broadcast:
      return "broadcast_perf";
    case core::Collective::Reduce:
      return "reduce_perf";
    case core::Collective::AllToAll:
      return "alltoall_perf";
    case core::Collective::Custom:
      break;
  }
  return "custom_perf";
}

core::Result<ParsedArgs> parseBenchArgs(int argc, const char* const* argv, bool cudaBuilt) {
  ParsedArgs parsed;
  BenchOptions& o = parsed.options;
  CLI::App app{
      "optiflow-bench: time schedules (and NCCL's own collectives) on GPUs through stock NCCL, in "
      "nccl-tests' layout"};
  app.name("optiflow-bench");
  std::string sizes = "1KiB:1GiB";
  app.add_option("schedules", o.schedules, "schedule files (JSON or MSCCL XML) or batch directories");
  app.add_option("--sizes", sizes, "sizes as nccl-tests counts them: 1KiB:1GiB, 1MiB:64MiB:4, 4096,1MiB");
  app.add_option("--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1 << 20));
  app.add_option("--warmup", o.warmup, "untimed iterations before them")->check(CLI::Range(0, 1 << 20));
  app.add_option("-G", o.graph, "capture this many iterations in one CUDA graph and replay it (CUDA backend)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_flag("--check", o.check, "check every result against the collective's definition (#wrong)");
  app.add_flag("--nccl", o.nccl, "also time NCCL's own collective at the same sizes (CUDA backend)");
  app.add_flag("--json", o.json, "write JSON instead of the nccl-tests text layout");
  app.add_option("-o,--output", o.output, "write to this file instead of standard output");
  o.backend = "cuda";
  app.add_option("--backend", o.backend, "cuda (GPUs through NCCL) or cpu (threads, real bytes, no GPU)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--rendezvous", o.rendezvous, "host:port where rank 0 hands out NCCL's unique id");
  app.add_option("--rendezvous-dir", o.rendezvousDir, "a directory every rank sees, for the unique id");
  app.add_option("--rendezvous-key", o.rendezvousKey, "keeps runs apart in --rendezvous-dir (default: the job id)");
  app.add_option("--rendezvous-timeout", o.rendezvousTimeoutS, "seconds to wait for the other ranks")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--timeout", o.timeoutS, "seconds one schedule at one size may take before it counts as hung")
      ->check(CLI::Range(0.1, 86400.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    parsed.help = true;
    parsed.helpText = app.help();
    return parsed;
  } catch (const CLI::ParseError& e) {
    return argError(e.what());
  }
  auto list = core::parseSizeList(sizes);
  if (!list) return argError(fmt::format("--sizes: {}", list.error().message));
  o.sizes = std::move(list).value();
  if (std::find(o.sizes.begin(), o.sizes.end(), 0u) != o.sizes.end()) {
    return argError("--sizes: a size of 0 moves nothing; start at 1 byte or more");
  }
  if (o.schedules.empty() && !o.nccl) return argError("nothing to time: give schedule files (or --nccl)");
  if (o.backend == "cuda" && !cudaBuilt) {
    return argError(
        "--backend cuda: this optiflow-bench was built without CUDA and NCCL (not found under "
        "OPTIFLOW_CUDA_ROOT when it was configured); use --backend cpu, or rebuild where they are");
  }
  if (o.backend == "cpu") {
    if (o.nccl) return argError("--nccl needs --backend cuda (the CPU backend has no NCCL)");
    if (o.graph > 0) return argError("-G needs --backend cuda (CUDA graphs)");
  }
  if (!o.rendezvous.empty() && !o.rendezvousDir.empty()) {
    return argError("--rendezvous and --rendezvous-dir: give one of them");
  }
  return parsed;
}

core::Result<std::vector<BenchItem>> loadBenchItems(const std::vector<std::string>& paths) {
  std::vector<BenchItem> items;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      auto batch = loadBatch(p);
      if (!batch) return batch.error();
      for (BenchItem& b : *batch) items.push_back(std::move(b));
      continue;
    }
    auto s = compiler::loadSchedule(p);
    if (!s) return s.error();
    items.push_back({fs::path(p).filename().string(), p, std::move(s).value(), {}});
  }
  return items;
}

std::string batchManifestJson(const std::vector<BenchItem>& items, const std::vector<std::string>& files) {
  json j;
  j["format"] = kBatchFormat;
  j["version"] = 1;
  j["items"] = json::array();
  for (std::size_t i = 0; i < items.size() && i < files.size(); ++i) {
    json it;
    it["id"] = items[i].id;
    it["schedule"] = files[i];
    it["sizes"] = items[i].sizes;
    j["items"].push_back(it);
  }
  return j.dump(1) + "\n";
}

bool runBench(const BenchOptions& options, const std::vector<BenchItem>& items, BenchBackend& backend,
              std::vector<ItemResult>& results) {
  bool allOk = true;
  std::set<core::Collective> collectives;
  for (const BenchItem& item : items) {
    ItemResult res;
    res.id = item.id;
    res.name = item.schedule.name;
    res.collective = item.schedule.collective;
    res.nRanks = item.schedule.nRanks;
    if (item.schedule.collective != core::Collective::Custom) collectives.insert(item.schedule.collective);
    auto fail = [&](std::string why) {
      res.ok = false;
      res.error = std::move(why);
      allOk = false;
    };
    if (auto acc = backend.accepts(item.schedule.nRanks); !acc) {
      fail(acc.error().message);
      results.push_back(std::move(res));
      continue;
    }
    std::optional<Lowered> lowered[2];  // out-of-place, in-place
    const auto modes = core::supportedModes(item.schedule);
    for (core::BufferMode m : modes) {
      auto l = lower(item.schedule, m);
      if (!l) {
        fail(l.error().str());
        break;
      }
      lowered[m == core::BufferMode::OutOfPlace ? 0 : 1] = std::move(l).value();
    }
    if (!res.ok || modes.empty()) {
      if (res.ok) fail("the schedule claims neither buffer mode");
      results.push_back(std::move(res));
      continue;
    }
    const Lowered& any = lowered[0] ? *lowered[0] : *lowered[1];
    res.lowering = summary(any);
    const std::vector<std::uint64_t>& sizes = item.sizes.empty() ? options.sizes : item.sizes;
    for (std::uint64_t size : sizes) {
      SizeRow row;
      row.sizeBytes = effectiveBytes(any, size);
      row.count = countOf(item.schedule.collective, row.sizeBytes, item.schedule.nRanks);
      for (int m = 0; m < 2 && res.ok; ++m) {
        if (!lowered[m]) continue;
        auto r = backend.run(item.schedule, *lowered[m], chunkElements(*lowered[m], size), options);
        if (!r) {
          fail(fmt::format("{} at {}: {}", m == 0 ? "out-of-place" : "in-place", core::formatSize(size),
                           r.error().message));
          break;
        }
        (m == 0 ? row.outOfPlace : row.inPlace) = *r;
      }
      if (!res.ok) break;
      res.rows.push_back(row);
    }
    results.push_back(std::move(res));
  }
  if (options.nccl) {
    for (core::Collective c : collectives) {
      ItemResult res;
      res.id = fmt::format("nccl-{}", core::toString(c));
      res.name = res.id;
      res.collective = c;
      res.nccl = true;
      res.nRanks = items.empty() ? 0 : items.front().schedule.nRanks;
      for (std::uint64_t size : options.sizes) {
        SizeRow row;
        const std::uint64_t unit = sizeof(float) * static_cast<std::uint64_t>(std::max(res.nRanks, 1));
        row.sizeBytes = std::max(unit, size / unit * unit);
        row.count = countOf(c, row.sizeBytes, res.nRanks);
        bool failed = false;
        for (int m = 0; m < 2 && !failed; ++m) {
          auto r = backend.runNccl(c, row.sizeBytes, m == 1, options);
          if (!r) {
            res.ok = false;
            res.error = r.error().message;
            allOk = false;
            failed = true;
          } else {
            (m == 0 ? row.outOfPlace : row.inPlace) = *r;
          }
        }
        if (failed) break;
        res.rows.push_back(row);
      }
      results.push_back(std::move(res));
    }
  }
  return allOk;
}

void writeText(std::ostream& out, const BenchOptions& o, const std::vector<ItemResult>& results,
               BenchBackend& backend) {
  const std::uint64_t minB = o.sizes.empty() ? 0 : o.sizes.front();
  const std::uint64_t maxB = o.sizes.empty() ? 0 : o.sizes.back();
  for (const ItemResult& r : results) {
    const std::string program =
        r.nccl ? std::string(ncclTestsProgram(r.collective))
               : fmt::format("{}_optiflow-{}", ncclTestsProgram(r.collective), r.id.empty() ? "schedule" : r.id);
    std::string prog;
    for (char c : program) prog += (c == ' ' || c == '\t') ? '_' : c;
    out << "# Collective test starting: " << prog << "\n";
    out << fmt::format(
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: 2(factor) warmup iters: {} iters: {} agg iters: 1 "
        "validation: {} graph: {}\n",
        minB, maxB, o.warmup, o.iters, o.check ? 1 : 0, o.graph);
    out << "#\n# optiflow-bench backend " << backend.name()
        << (r.nccl ? ", NCCL's own collective" : fmt::format(", schedule {}", r.name)) << "\n";
    if (!r.lowering.empty()) out << "# lowering: " << r.lowering << "\n";
    out << "#\n# Using devices\n";
    for (const std::string& line : backend.rankLines(r.nRanks)) out << line << "\n";
    if (!r.ok) out << "# optiflow-bench: " << r.id << ": " << r.error << "\n";
    out << "#\n";
    out << "#                                                              out-of-place                       "
           "in-place          \n";
    out << "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
           "busbw #wrong\n";
    out << "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
           "(GB/s)       \n";
    const double factor = core::busBandwidthFactor(r.collective, std::max(r.nRanks, 1));
    double busSum = 0;
    int busN = 0;
    std::int64_t wrongAll = 0;
    for (const SizeRow& row : r.rows) {
      std::string line = fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", row.sizeBytes, row.count, "float",
                                     reduces(r.collective) ? "sum" : "none", rooted(r.collective) ? 0 : -1);
      for (const ModeResult* m : {&row.outOfPlace, &row.inPlace}) {
        if (!m->ran) {
          line += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A");
          continue;
        }
        const double alg = core::gbps(static_cast<double>(row.sizeBytes), m->timeUs);
        busSum += alg * factor;
        ++busN;
        if (m->wrong > 0) wrongAll += m->wrong;
        line += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", timeText(m->timeUs), bwText(alg), bwText(alg * factor),
                            m->wrong < 0 ? std::string("N/A") : std::to_string(m->wrong));
      }
      out << line << "\n";
    }
    out << "# Out of bounds values : " << wrongAll << (wrongAll == 0 ? " OK" : " FAILED") << "\n";
    out << fmt::format("# Avg bus bandwidth    : {:.4f} \n", busN > 0 ? busSum / busN : 0.0);
    out << "#\n# Collective test concluded: " << prog << "\n#\n";
  }
}

std::string resultsJson(const BenchOptions& o, const std::vector<ItemResult>& results, std::string_view backend) {
  json j;
  j["format"] = kResultsFormat;
  j["version"] = 1;
  j["backend"] = backend;
  j["iters"] = o.iters;
  j["warmup"] = o.warmup;
  j["graph"] = o.graph;
  j["results"] = json::array();
  for (const ItemResult& r : results) {
    json it;
    it["id"] = r.id;
    it["name"] = r.name;
    it["collective"] = core::toString(r.collective);
    it["ranks"] = r.nRanks;
    it["nccl"] = r.nccl;
    it["ok"] = r.ok;
    it["error"] = r.error;
    it["lowering"] = r.lowering;
    it["rows"] = json::array();
    const double factor = core::busBandwidthFactor(r.collective, std::max(r.nRanks, 1));
    for (const SizeRow& row : r.rows) {
      json jr;
      jr["size"] = row.sizeBytes;
      jr["count"] = row.count;
      for (const auto& [key, m] : {std::pair{"out_of_place", &row.outOfPlace}, std::pair{"in_place", &row.inPlace}}) {
        if (!m->ran) {
          jr[key] = nullptr;
          continue;
        }
        const double alg = core::gbps(static_cast<double>(row.sizeBytes), m->timeUs);
        jr[key] = {{"time_us", m->timeUs}, {"alg_bw", alg}, {"bus_bw", alg * factor}, {"wrong", m->wrong}};
      }
      it["rows"].push_back(jr);
    }
    j["results"].push_back(it);
  }
  return j.dump(1) + "\n";
}

core::Result<std::vector<ItemResult>> parseResultsJson(std::string_view text, std::string_view file) {
  const std::string where(file);
  const json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return core::Diagnostic{where, 0, 0, "not a JSON object"};
  if (!j.contains("format") || j["format"] != kResultsFormat) {
    return core::Diagnostic{where, 0, 0, fmt::format("format: expected \"{}\"", kResultsFormat)};
  }
  if (!j.contains("results") || !j["results"].is_array()) {
    return core::Diagnostic{where, 0, 0, "results: expected an array"};
  }
  std::vector<ItemResult> out;
  for (std::size_t i = 0; i < j["results"].size(); ++i) {
    const json& it = j["results"][i];
    const std::string at = fmt::format("results[{}]", i);
    if (!it.is_object() || !it.contains("id") || !it["id"].is_string() || !it.contains("rows") ||
        !it["rows"].is_array()) {
      return core::Diagnostic{where, 0, 0, fmt::format("{}: expected {{\"id\": string, \"rows\": array, ...}}", at)};
    }
    ItemResult r;
    r.id = it["id"].get<std::string>();
    if (it.contains("name") && it["name"].is_string()) r.name = it["name"].get<std::string>();
    if (it.contains("ok") && it["ok"].is_boolean()) r.ok = it["ok"].get<bool>();
    if (it.contains("error") && it["error"].is_string()) r.error = it["error"].get<std::string>();
    if (it.contains("nccl") && it["nccl"].is_boolean()) r.nccl = it["nccl"].get<bool>();
    if (it.contains("ranks") && it["ranks"].is_number_integer()) r.nRanks = it["ranks"].get<int>();
    if (it.contains("collective") && it["collective"].is_string()) {
      if (auto c = core::parseCollective(it["collective"].get<std::string>())) r.collective = *c;
    }
    for (std::size_t k = 0; k < it["rows"].size(); ++k) {
      const json& jr = it["rows"][k];
      if (!jr.is_object() || !jr.contains("size") || !jr["size"].is_number_unsigned()) {
        return core::Diagnostic{where, 0, 0, fmt::format("{}.rows[{}].size: expected a byte count", at, k)};
      }
      SizeRow row;
      row.sizeBytes = jr["size"].get<std::uint64_t>();
      if (jr.contains("count") && jr["count"].is_number_unsigned()) row.count = jr["count"].get<std::uint64_t>();
      if (jr.contains("out_of_place")) row.outOfPlace = modeFromJson(jr["out_of_place"]);
      if (jr.contains("in_place")) row.inPlace = modeFromJson(jr["in_place"]);
      for (const ModeResult* m : {&row.outOfPlace, &row.inPlace}) {
        if (m->wrong < -1) {
          return core::Diagnostic{where, 0, 0,
                                  fmt::format("{}.rows[{}]: wrong must be -1 (not checked) or more", at, k)};
        }
        if (m->ran && !(std::isfinite(m->timeUs) && m->timeUs > 0)) {
          return core::Diagnostic{where, 0, 0, fmt::format("{}.rows[{}]: time_us must be a positive number", at, k)};
        }
      }
      r.rows.push_back(row);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace optiflow::exec
