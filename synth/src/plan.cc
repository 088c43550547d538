#include "optiflow/synth/plan.h"

#include <limits>
#include <system_error>

#include <fmt/format.h>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/units.h"

namespace optiflow::synth {

namespace {

namespace fs = std::filesystem;

constexpr int kPlanVersion = 1;

nlohmann::json sizeToJson(const SizeResult& s) {
  return {{"size_bytes", s.sizeBytes}, {"ok", s.ok},          {"error", s.error},   {"time_us", s.timeUs},
          {"bound_us", s.boundUs},     {"nccl_us", s.ncclUs}, {"config", s.config}, {"bottleneck", s.bottleneck}};
}

// Reads one typed field; the error names its path ("sizes[2].time_us: expected a number").
template <typename T>
bool field(const nlohmann::json& j, const char* key, const std::string& path, T& out, std::string& error) {
  auto it = j.find(key);
  if (it == j.end()) {
    error = fmt::format("{}{}: missing", path, key);
    return false;
  }
  // get<T>() would truncate 4096.5 to 4096 and wrap -1 to 2^64-1: integers must be written as integers.
  bool typed = true;
  const char* kind = "a number";
  if constexpr (std::is_same_v<T, std::string>) {
    typed = it->is_string();
    kind = "a string";
  } else if constexpr (std::is_same_v<T, bool>) {
    typed = it->is_boolean();
    kind = "true or false";
  } else if constexpr (std::is_unsigned_v<T>) {
    typed = it->is_number_unsigned();
    kind = "a non-negative integer";
  } else if constexpr (std::is_integral_v<T>) {
    typed = it->is_number_integer();
    kind = "an integer";
  } else {
    typed = it->is_number();
  }
  if (typed) {
    try {
      out = it->get<T>();
      return true;
    } catch (const nlohmann::json::exception&) {
      // out of T's range
    }
  }
  error = fmt::format("{}{}: expected {}", path, key, kind);
  return false;
}

nlohmann::json nativeToJson(const NativeChoice& n) {
  return {{"algorithm", n.algorithm}, {"protocol", n.protocol}, {"channels", n.channels}, {"time_us", n.timeUs}};
}

std::string collectiveName(core::Collective c) { return std::string(core::toString(c)); }

std::string scheduleStem(core::Collective c, std::uint64_t size) {
  return fmt::format("{}-{}", collectiveName(c), core::formatSize(size));
}

core::Result<bool> writeText(const fs::path& file, std::string_view text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return core::Diagnostic{file.string(), 0, 0, "cannot write the file"};
  return true;
}

}  // namespace

nlohmann::json recordToJson(const CandidateRecord& r) {
  nlohmann::json sizes = nlohmann::json::array();
  for (const SizeResult& s : r.sizes) sizes.push_back(sizeToJson(s));
  return {{"id", r.id},     {"round", r.round}, {"origin", r.origin}, {"name", r.name},
          {"text", r.text}, {"stage", r.stage}, {"errors", r.errors}, {"sizes", std::move(sizes)}};
}

core::Result<CandidateRecord> recordFromJson(const nlohmann::json& j) {
  CandidateRecord r;
  std::string e;
  if (!j.is_object()) return core::Diagnostic{"", 0, 0, "expected a JSON object (one candidate)"};
  if (!field(j, "id", "", r.id, e) || !field(j, "round", "", r.round, e) || !field(j, "origin", "", r.origin, e) ||
      !field(j, "name", "", r.name, e) || !field(j, "text", "", r.text, e) || !field(j, "stage", "", r.stage, e) ||
      !field(j, "errors", "", r.errors, e)) {
    return core::Diagnostic{"", 0, 0, e};
  }
  auto sizes = j.find("sizes");
  if (sizes == j.end() || !sizes->is_array()) return core::Diagnostic{"", 0, 0, "sizes: expected an array"};
  for (std::size_t i = 0; i < sizes->size(); ++i) {
    const nlohmann::json& s = (*sizes)[i];
    const std::string path = fmt::format("sizes[{}].", i);
    if (!s.is_object()) return core::Diagnostic{"", 0, 0, path.substr(0, path.size() - 1) + ": expected an object"};
    SizeResult sr;
    if (!field(s, "size_bytes", path, sr.sizeBytes, e) || !field(s, "ok", path, sr.ok, e) ||
        !field(s, "error", path, sr.error, e) || !field(s, "time_us", path, sr.timeUs, e) ||
        !field(s, "bound_us", path, sr.boundUs, e) || !field(s, "nccl_us", path, sr.ncclUs, e) ||
        !field(s, "config", path, sr.config, e) || !field(s, "bottleneck", path, sr.bottleneck, e)) {
      return core::Diagnostic{"", 0, 0, e};
    }
    r.sizes.push_back(std::move(sr));
  }
  return r;
}

nlohmann::json planToJson(const core::Topology& topology, const SynthConfig& config, const SynthResult& result,
                          const RunInfo& info) {
  nlohmann::json entries = nlohmann::json::array();
  const std::size_t n = result.sizes.size();
  for (std::size_t s = 0; s < n; ++s) {
    const SizeBest& sb = result.sizes[s];
    // Entry s serves [its size, the next size): the tuner looks a call up by its size.
    const std::uint64_t minBytes = s == 0 ? 0 : sb.sizeBytes;
    const std::uint64_t maxBytes =
        s + 1 < n ? result.sizes[s + 1].sizeBytes - 1 : std::numeric_limits<std::uint64_t>::max();
    nlohmann::json best = nullptr;
    if (sb.best >= 0 && static_cast<std::size_t>(sb.best) < result.history.size()) {
      const CandidateRecord& r = result.history[static_cast<std::size_t>(sb.best)];
      const std::string stem = scheduleStem(config.collective, sb.sizeBytes);
      const SizeResult* sr = s < r.sizes.size() ? &r.sizes[s] : nullptr;
      best = {{"candidate", r.id},
              {"program", r.name},
              {"origin", r.origin},
              {"config", sb.config},
              {"protocol", sb.schedule ? std::string(core::toString(sb.schedule->protocol)) : std::string()},
              {"channels", sb.schedule ? sb.schedule->nChannels : 0},
              {"time_us", sb.bestUs},
              {"bottleneck", sr ? sr->bottleneck : std::string()},
              {"program_file", fmt::format("programs/{}.ofl", r.id)},
              {"schedule_json", fmt::format("schedules/{}.json", stem)},
              {"schedule_xml", fmt::format("schedules/{}.xml", stem)}};
    }
    entries.push_back({{"size_bytes", sb.sizeBytes},
                       {"min_bytes", minBytes},
                       {"max_bytes", maxBytes},
                       {"bound_us", sb.boundUs},
                       {"effective_bound_us", sb.effectiveBoundUs},
                       {"nccl", nativeToJson(sb.nccl)},
                       {"native", nativeToJson(sb.bestNative)},
                       {"best", std::move(best)}});
  }
  int candidates = 0;
  for (const CandidateRecord& r : result.history) candidates += r.stage == "ok" ? 1 : 0;
  nlohmann::json coll = {{"collective", collectiveName(config.collective)},
                         {"ranks", topology.nRanks()},
                         {"nodes", topology.nodes},
                         {"entries", std::move(entries)}};
  return {{"format", "optiflow-plan"},
          {"version", kPlanVersion},
          {"optiflow_version", OPTIFLOW_VERSION},
          {"topology", topology.name},
          {"ranks", topology.nRanks()},
          {"nodes", topology.nodes},
          {"gpus_per_node", topology.gpusPerNode},
          {"proposer", info.proposer},
          {"evaluator", info.evaluator},
          {"seed", info.seed},
          {"rounds", result.roundsRun},
          {"candidates", static_cast<int>(result.history.size())},
          {"evaluated", candidates},
          {"elapsed_s", result.elapsedS},
          {"stop_reason", result.stopReason},
          {"collectives", nlohmann::json::array({std::move(coll)})}};
}

core::Result<bool> writeRunDirectory(const fs::path& dir, const core::Topology& topology, const SynthConfig& config,
                                     const SynthResult& result, const RunInfo& info) {
  std::error_code ec;
  fs::create_directories(dir / "programs", ec);
  if (!ec) fs::create_directories(dir / "schedules", ec);
  if (ec) return core::Diagnostic{dir.string(), 0, 0, "cannot create the directory: " + ec.message()};
  for (const SizeBest& sb : result.sizes) {
    if (sb.best < 0 || !sb.schedule) continue;
    const CandidateRecord& r = result.history.at(static_cast<std::size_t>(sb.best));
    auto w = writeText(dir / "programs" / (r.id + ".ofl"), r.text);
    if (!w) return w;
    const std::string stem = scheduleStem(config.collective, sb.sizeBytes);
    w = writeText(dir / "schedules" / (stem + ".json"),
                  compiler::formatSchedule(*sb.schedule, compiler::ScheduleFormat::Json));
    if (!w) return w;
    w = writeText(dir / "schedules" / (stem + ".xml"),
                  compiler::formatSchedule(*sb.schedule, compiler::ScheduleFormat::MscclXml));
    if (!w) return w;
  }
  // The plan last, through a rename: a reader (the daemon, a report) never sees a half-written plan.
  const fs::path tmp = dir / "plan.json.tmp";
  auto w = writeText(tmp, planToJson(topology, config, result, info).dump(2) + "\n");
  if (!w) return w;
  fs::rename(tmp, dir / "plan.json", ec);
  if (ec) return core::Diagnostic{(dir / "plan.json").string(), 0, 0, "cannot write the file: " + ec.message()};
  return true;
}

core::Result<std::vector<CandidateRecord>> readHistory(const fs::path& file) {
  std::vector<CandidateRecord> out;
  std::error_code ec;
  if (!fs::exists(file, ec)) return out;
  std::ifstream in(file, std::ios::binary);
  if (!in) return core::Diagnostic{file.string(), 0, 0, "cannot read the file"};
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      return core::Diagnostic{file.string(), lineNo, 0, "expected one JSON object per line (a candidate record)"};
    }
    auto r = recordFromJson(j);
    if (!r) return core::Diagnostic{file.string(), lineNo, 0, r.error().message};
    out.push_back(std::move(r).value());
  }
  return out;
}

HistoryWriter::HistoryWriter(fs::path file) : file_(std::move(file)) {}

core::Result<HistoryWriter> HistoryWriter::open(const fs::path& file) {
  std::error_code ec;
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  std::ofstream probe(file, std::ios::binary | std::ios::app);
  if (!probe) return core::Diagnostic{file.string(), 0, 0, "cannot open the file for appending"};
  return HistoryWriter(file);
}

bool HistoryWriter::append(const CandidateRecord& record) {
  std::ofstream out(file_, std::ios::binary | std::ios::app);
  out << recordToJson(record).dump() << '\n';
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace optiflow::synth
