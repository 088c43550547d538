#include "optiflow/synth/run_dir.h"

#include "optiflow/core/json_walk.h"
#include "optiflow/core/text_file.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "optiflow/compiler/mscclpp_export.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/parallel.h"
#include "optiflow/core/units.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::synth {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using core::JsonNode;

constexpr const char* kPlanFormat = "optiflow-plan";
constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kMaxU32 = std::numeric_limits<std::uint32_t>::max();
constexpr int kMaxInt = std::numeric_limits<int>::max();

// ---------------------------------------------------------------------------------------------------------------
// Files

core::Result<bool> writeText(const fs::path& file, std::string_view text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return core::Diagnostic{file.string(), 0, 0, "cannot write the file"};
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// plan.json: writer

json nativeToJson(const NativeChoice& n) {
  json j = {{"algorithm", n.algorithm}, {"protocol", n.protocol}, {"channels", n.channels}, {"time_us", n.timeUs}};
  if (n.chunkBytes != 0) j["chunk_bytes"] = n.chunkBytes;
  if (n.measured) {  // optiflowd measured time_us in running jobs; simulated_us is the simulator's time
    j["measured"] = true;
    j["simulated_us"] = n.simulatedUs;
  }
  return j;
}

json trialsToJson(const PlanEntry& e) {
  json candidates = json::array();
  for (const PlanTrial& t : e.trials) {
    if (t.algorithm.empty()) {
      candidates.push_back({{"algorithm", nullptr}});
      continue;
    }
    json c = {{"algorithm", t.algorithm},
              {"protocol", t.protocol.empty() ? json(nullptr) : json(t.protocol)},
              {"channels", t.channels}};
    if (t.chunkBytes != 0) c["chunk_bytes"] = t.chunkBytes;
    candidates.push_back(std::move(c));
  }
  return {{"calls", e.trialCalls}, {"candidates", std::move(candidates)}};
}

json optionalNative(const std::optional<NativeChoice>& n) { return n ? nativeToJson(*n) : json(nullptr); }

json bestToJson(const PlanBest& b) {
  json j = {{"candidate", b.candidate},
            {"program", b.program},
            {"origin", b.origin},
            {"config", b.config},
            {"protocol", b.protocol},
            {"channels", b.channels},
            {"time_us", b.timeUs},
            {"bottleneck", b.bottleneck},
            {"program_file", b.programFile},
            {"schedule_json", b.scheduleJson},
            {"schedule_xml", b.scheduleXml}};
  if (b.measured) {  // the hardware evaluator measured time_us; simulated_us is the simulator's time
    j["measured"] = true;
    j["simulated_us"] = b.simulatedUs;
  }
  return j;
}

json planToJson(const PlanFile& p) {
  json collectives = json::array();
  for (const PlanCollective& c : p.collectives) {
    json entries = json::array();
    for (const PlanEntry& e : c.entries) {
      json entry = {{"size_bytes", e.sizeBytes},
                    {"min_bytes", e.minBytes},
                    {"max_bytes", e.maxBytes},
                    {"bound_us", e.boundUs},
                    {"effective_bound_us", e.effectiveBoundUs},
                    {"nccl", optionalNative(e.nccl)},
                    {"native", optionalNative(e.native)},
                    {"best", e.best ? bestToJson(*e.best) : json(nullptr)}};
      if (!e.trials.empty()) entry["trials"] = trialsToJson(e);
      entries.push_back(std::move(entry));
    }
    collectives.push_back({{"collective", std::string(core::toString(c.collective))},
                           {"ranks", c.ranks},
                           {"nodes", c.nodes},
                           {"entries", std::move(entries)}});
  }
  json j = {{"format", kPlanFormat},          {"version", kPlanVersion}, {"optiflow_version", p.optiflowVersion},
            {"topology", p.topology},         {"ranks", p.ranks},        {"nodes", p.nodes},
            {"gpus_per_node", p.gpusPerNode}, {"proposer", p.proposer},  {"evaluator", p.evaluator}};
  if (p.seed) j["seed"] = *p.seed;
  if (p.rounds) j["rounds"] = *p.rounds;
  if (p.candidates) j["candidates"] = *p.candidates;
  if (p.evaluated) j["evaluated"] = *p.evaluated;
  if (p.elapsedS) j["elapsed_s"] = *p.elapsedS;
  if (p.stopReason) j["stop_reason"] = *p.stopReason;
  if (!p.runs.empty()) j["runs"] = p.runs;
  j["collectives"] = std::move(collectives);
  return j;
}

// ---------------------------------------------------------------------------------------------------------------
// plan.json: reader

NativeChoice readNative(const JsonNode& n) {
  n.requireObject();
  NativeChoice c;
  c.algorithm = n["algorithm"].str();
  c.protocol = n["protocol"].str();
  c.channels = n["channels"].intIn(0, kMaxInt);
  c.timeUs = n["time_us"].nonNegative();
  if (auto k = n.optional("chunk_bytes")) c.chunkBytes = k->unsignedIn(0, kMaxU64);
  if (auto m = n.optional("measured")) c.measured = m->boolean();
  if (auto m = n.optional("simulated_us")) c.simulatedUs = m->nonNegative();
  return c;
}

// "trials": {"calls": N, "candidates": [...]}; names are checked where the plan becomes a cache plan (cache_plan.cc).
void readTrials(const JsonNode& e, PlanEntry& entry) {
  auto t = e.optional("trials");
  if (!t) return;
  if (!t->raw().is_object()) t->fail(fmt::format("expected an object or null, {}", t->got()));
  entry.trialCalls = (*t)["calls"].intIn(1, static_cast<int>(schedcache::kMaxTrialCalls));
  for (const JsonNode& c : (*t)["candidates"].items()) {
    c.requireObject();
    PlanTrial trial;
    const std::optional<JsonNode> alg = c.optional("algorithm");  // absent or null: NCCL's own choice
    if (!alg) {
      for (const char* key : {"protocol", "channels", "chunk_bytes"}) {
        if (auto v = c.optional(key)) v->fail("NCCL's own choice (algorithm null) takes no " + std::string(key));
      }
      entry.trials.push_back(trial);
      continue;
    }
    trial.algorithm = alg->str();
    if (trial.algorithm.empty()) alg->fail("expected an algorithm name or null, got \"\"");
    if (auto p = c.optional("protocol")) trial.protocol = p->str();
    if (auto ch = c.optional("channels")) trial.channels = ch->intIn(0, kMaxInt);
    if (auto k = c.optional("chunk_bytes")) trial.chunkBytes = k->unsignedIn(0, kMaxU64);
    entry.trials.push_back(std::move(trial));
  }
}

std::optional<NativeChoice> optionalNativeAt(const JsonNode& entry, std::string_view key) {
  auto n = entry.optional(key);
  if (!n) return std::nullopt;
  if (!n->raw().is_object()) n->fail(fmt::format("expected an object or null, {}", n->got()));
  return readNative(*n);
}

std::string optionalString(const JsonNode& n, std::string_view key) {
  auto v = n.optional(key);
  return v ? v->str() : std::string();
}

std::string fileName(const JsonNode& n, std::string_view key) {
  const JsonNode v = n[key];
  std::string s = v.str();
  if (s.empty()) v.fail("expected a file name, got \"\"");
  return s;
}

std::optional<PlanBest> readBest(const JsonNode& entry) {
  auto n = entry.optional("best");
  if (!n) return std::nullopt;
  if (!n->raw().is_object()) n->fail(fmt::format("expected an object or null, {}", n->got()));
  PlanBest b;
  b.program = (*n)["program"].str();
  b.timeUs = (*n)["time_us"].nonNegative();
  b.scheduleJson = fileName(*n, "schedule_json");
  b.scheduleXml = fileName(*n, "schedule_xml");
  b.candidate = optionalString(*n, "candidate");
  b.origin = optionalString(*n, "origin");
  b.config = optionalString(*n, "config");
  b.protocol = optionalString(*n, "protocol");
  if (auto c = n->optional("channels")) b.channels = c->intIn(0, kMaxInt);
  b.bottleneck = optionalString(*n, "bottleneck");
  if (auto m = n->optional("measured")) b.measured = m->boolean();
  if (auto m = n->optional("simulated_us")) b.simulatedUs = m->nonNegative();
  b.programFile = optionalString(*n, "program_file");
  return b;
}

PlanEntry readEntry(const JsonNode& e) {
  e.requireObject();
  PlanEntry entry;
  entry.sizeBytes = e["size_bytes"].unsignedIn(0, kMaxU64);
  entry.minBytes = e["min_bytes"].unsignedIn(0, kMaxU64);
  const JsonNode max = e["max_bytes"];
  entry.maxBytes = max.unsignedIn(0, kMaxU64);
  if (entry.minBytes > entry.maxBytes) {
    max.fail(fmt::format("expected at least min_bytes ({}), got {}", entry.minBytes, entry.maxBytes));
  }
  entry.boundUs = e["bound_us"].nonNegative();
  if (auto v = e.optional("effective_bound_us")) entry.effectiveBoundUs = v->nonNegative();
  entry.nccl = optionalNativeAt(e, "nccl");
  entry.native = optionalNativeAt(e, "native");
  entry.best = readBest(e);
  readTrials(e, entry);
  return entry;
}

PlanCollective readCollective(const JsonNode& c) {
  c.requireObject();
  PlanCollective run;
  const JsonNode name = c["collective"];
  const std::string text = name.str();
  const auto kind = core::parseCollective(text);
  if (!kind || *kind == core::Collective::Custom) {
    name.fail(
        fmt::format("expected allgather, reducescatter, allreduce, broadcast, reduce or alltoall, got \"{}\"", text));
  }
  run.collective = *kind;
  const JsonNode ranks = c["ranks"];
  run.ranks = static_cast<int>(ranks.unsignedIn(0, kMaxU32 >> 1));
  if (run.ranks == 0) ranks.fail("expected at least 1, got 0");
  const JsonNode nodes = c["nodes"];
  const std::uint64_t n = nodes.unsignedIn(0, kMaxU32 >> 1);
  if (n == 0 || n > static_cast<std::uint64_t>(run.ranks)) {
    nodes.fail(fmt::format("expected 1 to {} (ranks), got {}", run.ranks, n));
  }
  run.nodes = static_cast<int>(n);
  for (const JsonNode& e : c["entries"].items()) run.entries.push_back(readEntry(e));
  // Written ascending; sorting anyway keeps a hand-edited plan from serving sizes out of order.
  std::stable_sort(run.entries.begin(), run.entries.end(),
                   [](const PlanEntry& a, const PlanEntry& b) { return a.sizeBytes < b.sizeBytes; });
  return run;
}

int positiveCount(const JsonNode& n) {
  const int v = n.intIn(0, kMaxInt);
  if (v < 1) n.fail(fmt::format("expected at least 1, got {}", v));
  return v;
}

PlanFile readPlanRoot(const JsonNode& root) {
  const JsonNode format = root["format"];
  if (format.str() != kPlanFormat) format.fail(fmt::format("expected \"{}\", {}", kPlanFormat, format.got()));
  const auto version = root.optional("version");
  if (!version || !version->raw().is_number_unsigned() || version->raw().get<std::uint64_t>() != kPlanVersion) {
    JsonNode::failAt({{"version", 0}}, fmt::format("expected {} (the plan version this build reads), {}", kPlanVersion,
                                                   version ? version->got() : "missing"));
  }
  PlanFile p;
  p.topology = root["topology"].str();
  p.ranks = positiveCount(root["ranks"]);
  p.nodes = positiveCount(root["nodes"]);
  if (auto g = root.optional("gpus_per_node")) p.gpusPerNode = g->intIn(0, kMaxInt);
  // The run's settings are informational and optional, but a value of the wrong type is reported, not guessed at.
  p.optiflowVersion = optionalString(root, "optiflow_version");
  p.proposer = optionalString(root, "proposer");
  p.evaluator = optionalString(root, "evaluator");
  if (auto v = root.optional("seed")) p.seed = v->unsignedIn(0, kMaxU64);
  if (auto v = root.optional("rounds")) p.rounds = v->intIn(0, kMaxInt);
  if (auto v = root.optional("candidates")) p.candidates = v->intIn(0, kMaxInt);
  if (auto v = root.optional("evaluated")) p.evaluated = v->intIn(0, kMaxInt);
  if (auto v = root.optional("elapsed_s")) p.elapsedS = v->nonNegative();
  if (auto v = root.optional("stop_reason")) p.stopReason = v->str();
  if (auto runs = root.optional("runs")) {
    for (const JsonNode& r : runs->items()) p.runs.push_back(r.str());
  }
  for (const JsonNode& c : root["collectives"].items()) p.collectives.push_back(readCollective(c));
  return p;
}

// ---------------------------------------------------------------------------------------------------------------
// history.jsonl

json recordToJson(const CandidateRecord& r) {
  json sizes = json::array();
  for (const SizeResult& s : r.sizes) {
    json size = {
        {"size_bytes", s.sizeBytes}, {"ok", s.ok},          {"error", s.error},   {"time_us", s.timeUs},
        {"bound_us", s.boundUs},     {"nccl_us", s.ncclUs}, {"config", s.config}, {"bottleneck", s.bottleneck}};
    // The hardware evaluator's: time_us measured, simulated_us the simulator's; or why it was not measured.
    if (s.measured) {
      size["measured"] = true;
      size["simulated_us"] = s.simulatedUs;
    }
    if (!s.measureError.empty()) size["measure_error"] = s.measureError;
    sizes.push_back(std::move(size));
  }
  return {{"id", r.id},     {"round", r.round}, {"origin", r.origin}, {"name", r.name},
          {"text", r.text}, {"stage", r.stage}, {"errors", r.errors}, {"sizes", std::move(sizes)}};
}

CandidateRecord readRecordRoot(const JsonNode& root) {
  CandidateRecord r;
  r.id = root["id"].str();
  r.round = root["round"].intIn(0, kMaxInt);
  r.origin = root["origin"].str();
  r.name = root["name"].str();
  r.text = root["text"].str();
  r.stage = root["stage"].str();
  r.errors = root["errors"].str();
  for (const JsonNode& s : root["sizes"].items()) {
    s.requireObject();
    SizeResult sr;
    sr.sizeBytes = s["size_bytes"].unsignedIn(0, kMaxU64);
    sr.ok = s["ok"].boolean();
    sr.error = s["error"].str();
    sr.timeUs = s["time_us"].nonNegative();
    sr.boundUs = s["bound_us"].nonNegative();
    sr.ncclUs = s["nccl_us"].nonNegative();
    sr.config = s["config"].str();
    sr.bottleneck = s["bottleneck"].str();
    if (auto m = s.optional("measured")) sr.measured = m->boolean();
    if (auto m = s.optional("simulated_us")) sr.simulatedUs = m->nonNegative();
    if (auto m = s.optional("measure_error")) sr.measureError = m->str();
    r.sizes.push_back(std::move(sr));
  }
  return r;
}

}  // namespace

std::string scheduleStem(core::Collective collective, std::uint64_t sizeBytes) {
  return fmt::format("{}-{}", core::toString(collective), core::formatSize(sizeBytes));
}

PlanFile makePlan(const core::Topology& topology, const SynthConfig& config, const SynthResult& result,
                  const RunInfo& info) {
  PlanCollective coll;
  coll.collective = config.collective;
  coll.ranks = topology.nRanks();
  coll.nodes = topology.nodes;
  const std::size_t n = result.sizes.size();
  for (std::size_t s = 0; s < n; ++s) {
    const SizeBest& sb = result.sizes[s];
    PlanEntry e;
    e.sizeBytes = sb.sizeBytes;
    // Entry s serves [its size, the next size): the tuner looks a call up by its size.
    e.minBytes = s == 0 ? 0 : sb.sizeBytes;
    e.maxBytes = s + 1 < n ? result.sizes[s + 1].sizeBytes - 1 : kMaxU64;
    e.boundUs = sb.boundUs;
    e.effectiveBoundUs = sb.effectiveBoundUs;
    e.nccl = sb.nccl;
    e.native = sb.bestNative;
    if (sb.best >= 0 && static_cast<std::size_t>(sb.best) < result.history.size()) {
      const CandidateRecord& r = result.history[static_cast<std::size_t>(sb.best)];
      const std::string stem = scheduleStem(config.collective, sb.sizeBytes);
      PlanBest b;
      b.candidate = r.id;
      b.program = r.name;
      b.origin = r.origin;
      b.config = sb.config;
      b.protocol = sb.schedule ? std::string(core::toString(sb.schedule->protocol)) : std::string();
      b.channels = sb.schedule ? sb.schedule->nChannels : 0;
      b.timeUs = sb.bestUs;
      b.measured = sb.measured;
      b.simulatedUs = sb.simulatedUs;
      b.bottleneck = s < r.sizes.size() ? r.sizes[s].bottleneck : std::string();
      b.programFile = fmt::format("programs/{}.ofl", r.id);
      b.scheduleJson = fmt::format("schedules/{}.json", stem);
      b.scheduleXml = fmt::format("schedules/{}.xml", stem);
      e.best = std::move(b);
    }
    coll.entries.push_back(std::move(e));
  }
  PlanFile p;
  p.optiflowVersion = OPTIFLOW_VERSION;
  p.topology = topology.name;
  p.ranks = topology.nRanks();
  p.nodes = topology.nodes;
  p.gpusPerNode = topology.gpusPerNode;
  p.proposer = info.proposer;
  p.evaluator = info.evaluator;
  p.seed = info.seed;
  p.rounds = result.roundsRun;
  p.candidates = static_cast<int>(result.history.size());
  int evaluated = 0;
  for (const CandidateRecord& r : result.history) evaluated += r.stage == "ok" ? 1 : 0;
  p.evaluated = evaluated;
  p.elapsedS = result.elapsedS;
  p.stopReason = result.stopReason;
  p.collectives.push_back(std::move(coll));
  return p;
}

std::string formatPlan(const PlanFile& plan) { return planToJson(plan).dump(2) + "\n"; }

core::Result<PlanFile> parsePlan(std::string_view text, const std::string& file) {
  PlanFile plan;
  if (auto err = core::readJsonDocument(text, file, 1, "an optiflow plan",
                                        [&](const JsonNode& root) { plan = readPlanRoot(root); })) {
    return *err;
  }
  return plan;
}

core::Result<PlanFile> readPlan(const fs::path& file) {
  std::error_code ec;
  const fs::path dir = file.parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) {
    return core::Diagnostic{file.string(), 0, 0,
                            fmt::format("no such file: {} is not a directory (expected the run directory of "
                                        "`optiflow synthesize`)",
                                        dir.string())};
  }
  if (!fs::is_regular_file(file, ec)) {
    return core::Diagnostic{file.string(), 0, 0,
                            "no such file (expected the plan of a run directory of `optiflow synthesize`)"};
  }
  const auto text = core::readWholeFile(file);
  if (!text) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
  return parsePlan(*text, file.string());
}

core::Result<bool> writePlan(const fs::path& file, const PlanFile& plan) {
  const fs::path tmp = file.parent_path() / fmt::format(".{}.tmp-{}", file.filename().string(), ::getpid());
  auto w = writeText(tmp, formatPlan(plan));
  if (!w) return w;
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return core::Diagnostic{file.string(), 0, 0, "cannot write the file: " + ec.message()};
  }
  return true;
}

PlanFile mergePlans(const std::vector<PlanFile>& plans, const std::vector<std::string>& runDirs) {
  PlanFile merged;
  if (!plans.empty()) {
    const PlanFile& first = plans.front();
    merged.optiflowVersion = first.optiflowVersion;
    merged.topology = first.topology;
    merged.ranks = first.ranks;
    merged.nodes = first.nodes;
    merged.gpusPerNode = first.gpusPerNode;
    merged.proposer = first.proposer;
    merged.evaluator = first.evaluator;
    merged.seed = first.seed;
  }
  merged.runs = runDirs;
  for (const PlanFile& p : plans) {
    merged.collectives.insert(merged.collectives.end(), p.collectives.begin(), p.collectives.end());
  }
  return merged;
}

core::Result<bool> writeRunDirectory(const fs::path& dir, const core::Topology& topology, const SynthConfig& config,
                                     const SynthResult& result, const RunInfo& info) {
  std::error_code ec;
  fs::create_directories(dir / "programs", ec);
  if (!ec) fs::create_directories(dir / "schedules", ec);
  if (ec) return core::Diagnostic{dir.string(), 0, 0, "cannot create the directory: " + ec.message()};
  // Each winner's files (native JSON, MSCCL XML, the MSCCL++ plan, which is proven as it is exported) are made and
  // written in parallel, largest size first; the first failure in size order is reported.
  const std::size_t n = result.sizes.size();
  std::vector<core::Result<bool>> wrote(n, true);
  core::parallelFor(n, config.threads, [&](std::size_t i) {
    const std::size_t s = n - 1 - i;
    const SizeBest& sb = result.sizes[s];
    if (sb.best < 0 || !sb.schedule) return;
    auto& w = wrote[s];
    const std::string stem = scheduleStem(config.collective, sb.sizeBytes);
    for (auto [ext, format] :
         {std::pair{".json", compiler::ScheduleFormat::Json}, std::pair{".xml", compiler::ScheduleFormat::MscclXml}}) {
      if (auto err = compiler::saveSchedule(*sb.schedule, (dir / "schedules" / (stem + ext)).string(), format)) {
        w = *err;
        return;
      }
    }
    // The MSCCL++ execution plan where the collective has one (not Broadcast/Reduce: a plan carries no root);
    // `optiflow export mscclpp` writes the plan directory with size ranges and a manifest.
    compiler::mscclpp::ExportOptions eo;
    eo.ranksPerNode = topology.gpusPerNode;
    eo.scheduleProven = true;  // a best is taken only proven, in every mode (synth::prove)
    if (auto plan = compiler::mscclpp::exportPlan(*sb.schedule, eo)) {
      w = writeText(dir / "schedules" / (stem + ".mscclpp.json"), compiler::mscclpp::writeMscclppPlan(plan->plan));
    } else if (config.collective != core::Collective::Broadcast && config.collective != core::Collective::Reduce) {
      spdlog::warn("no MSCCL++ plan for {}: {}", stem, plan.error().message);
    }
  });
  for (std::size_t s = 0; s < n; ++s) {
    if (!wrote[s]) return wrote[s];
    const SizeBest& sb = result.sizes[s];
    if (sb.best < 0 || !sb.schedule) continue;
    // One program may lead several sizes: its file is written here, never by two threads at once.
    const CandidateRecord& r = result.history.at(static_cast<std::size_t>(sb.best));
    auto w = writeText(dir / "programs" / (r.id + ".ofl"), r.text);
    if (!w) return w;
  }
  // The plan last: a reader (the daemon, a report) that sees plan.json sees the files it names.
  return writePlan(dir / "plan.json", makePlan(topology, config, result, info));
}

std::string formatRecord(const CandidateRecord& record) { return recordToJson(record).dump(); }

core::Result<CandidateRecord> parseRecord(std::string_view line, const std::string& file, int lineNo) {
  CandidateRecord record;
  if (auto err = core::readJsonDocument(line, file, lineNo, "a candidate record",
                                        [&](const JsonNode& root) { record = readRecordRoot(root); })) {
    return *err;
  }
  return record;
}

core::Result<History> readHistory(const fs::path& file) {
  History h;
  std::error_code ec;
  if (!fs::exists(file, ec)) return h;
  const auto text = core::readWholeFile(file);
  if (!text) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
  std::size_t start = 0;
  int lineNo = 0;
  while (start < text->size()) {
    ++lineNo;
    const std::size_t end = text->find('\n', start);
    const bool last = end == std::string::npos;
    const std::string_view line = std::string_view(*text).substr(start, last ? std::string::npos : end - start);
    start = last ? text->size() : end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto r = parseRecord(line, file.string(), lineNo);
    if (!r) {
      if (last) {
        h.tornTail = true;
        break;
      }
      return r.error();
    }
    h.records.push_back(std::move(r).value());
  }
  return h;
}

HistoryWriter::HistoryWriter(fs::path file) : file_(std::move(file)) {}

core::Result<HistoryWriter> HistoryWriter::open(const fs::path& file) {
  std::error_code ec;
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  if (fs::is_regular_file(file, ec)) {
    // A torn last line (no newline): cut it off, or the next record would be glued to it.
    const auto text = core::readWholeFile(file);
    if (!text) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
    if (!text->empty() && text->back() != '\n') {
      const std::size_t keep = text->rfind('\n') == std::string::npos ? 0 : text->rfind('\n') + 1;
      if (parseRecord(std::string_view(*text).substr(keep))) {
        std::ofstream(file, std::ios::binary | std::ios::app) << '\n';  // whole but for its newline: kept
      } else {
        fs::resize_file(file, keep, ec);
        if (ec) return core::Diagnostic{file.string(), 0, 0, "cannot cut off its torn last line: " + ec.message()};
      }
    }
  }
  std::ofstream probe(file, std::ios::binary | std::ios::app);
  if (!probe) return core::Diagnostic{file.string(), 0, 0, "cannot open the file for appending"};
  return HistoryWriter(file);
}

bool HistoryWriter::append(const CandidateRecord& record) {
  std::ofstream out(file_, std::ios::binary | std::ios::app);
  out << formatRecord(record) << '\n';
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace optiflow::synth
