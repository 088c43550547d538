#include "optiflow/synth/cache_plan.h"

#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/crc.hpp>
#include <nlohmann/json.hpp>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/schedule.h"

namespace optiflow::synth {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPlanFormat = "optiflow-plan";
constexpr int kPlanVersion = 1;

// The JSON walk reports "path: what was expected"; loadPlan adds the file.
struct Walk {
  std::string error;

  bool fail(const std::string& path, const std::string& what) {
    error = fmt::format("{}: {}", path, what);
    return false;
  }

  static std::string got(const json& j) {
    // A container is named, not printed: it may be the whole (large) plan.
    if (j.is_object()) return "got an object";
    if (j.is_array()) return "got an array";
    std::string text = j.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return fmt::format("got {}", text);
  }

  // "collectives[0]" + "ranks"; top-level fields are named alone ("format").
  static std::string join(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }

  const json* member(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  // Integers must be written as integers: get<>() would truncate 4096.5 and wrap -1 to 2^64-1.
  bool unsignedField(const json& obj, const std::string& path, const char* key, std::uint64_t max, std::uint64_t& out) {
    const std::string p = join(path, key);
    const json* v = member(obj, key);
    if (v == nullptr) return fail(p, "missing (expected a non-negative integer)");
    if (!v->is_number_unsigned() || v->get<std::uint64_t>() > max) {
      return fail(p, fmt::format("expected an integer in [0, {}], {}", max, got(*v)));
    }
    out = v->get<std::uint64_t>();
    return true;
  }

  bool timeField(const json& obj, const std::string& path, const char* key, double& out) {
    const std::string p = join(path, key);
    const json* v = member(obj, key);
    if (v == nullptr) return fail(p, "missing (expected a time in microseconds)");
    // The cache holds floats: a larger time would not convert.
    if (!v->is_number() || !(v->get<double>() >= 0) || v->get<double>() > std::numeric_limits<float>::max()) {
      return fail(p, fmt::format("expected a non-negative number (microseconds) below 3.4e38, {}", got(*v)));
    }
    out = v->get<double>();
    return true;
  }

  bool stringField(const json& obj, const std::string& path, const char* key, std::string& out) {
    const std::string p = join(path, key);
    const json* v = member(obj, key);
    if (v == nullptr) return fail(p, "missing (expected a string)");
    if (!v->is_string()) return fail(p, fmt::format("expected a string, {}", got(*v)));
    out = v->get<std::string>();
    return true;
  }

  // An object member that may be absent or null (nullptr then); anything else but an object is an error.
  bool optionalObject(const json& obj, const std::string& path, const char* key, const json*& out) {
    out = member(obj, key);
    if (out != nullptr && out->is_null()) out = nullptr;
    if (out != nullptr && !out->is_object()) {
      return fail(join(path, key), fmt::format("expected an object or null, {}", got(*out)));
    }
    return true;
  }
};

core::Collective toCore(schedcache::Collective c) {
  switch (c) {
    case schedcache::Collective::kBroadcast:
      return core::Collective::Broadcast;
    case schedcache::Collective::kReduce:
      return core::Collective::Reduce;
    case schedcache::Collective::kAllGather:
      return core::Collective::AllGather;
    case schedcache::Collective::kReduceScatter:
      return core::Collective::ReduceScatter;
    case schedcache::Collective::kAllReduce:
      return core::Collective::AllReduce;
  }
  return core::Collective::Custom;
}

std::optional<std::string> readBytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(ss).str();
}

// 1-based line and column of a byte offset, for JSON syntax errors.
std::pair<int, int> lineColumn(const std::string& text, std::size_t offset) {
  int line = 1;
  int column = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

class PlanLoader {
 public:
  PlanLoader(fs::path file, bool verify) : dir_(file.parent_path()), file_(std::move(file)), verify_(verify) {}

  core::Result<schedcache::Plan> load() {
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) {
      return planError(
          fmt::format("no such file: {} is not a directory (expected the run directory of `optiflow "
                      "synthesize`)",
                      dir_.string()));
    }
    if (!fs::is_regular_file(file_, ec)) {
      return core::Diagnostic{file_.string(), 0, 0,
                              "no such file (expected the plan of a run directory of `optiflow synthesize`)"};
    }
    const std::optional<std::string> text = readBytes(file_);
    if (!text) return core::Diagnostic{file_.string(), 0, 0, "cannot read the file"};
    json root;
    try {
      root = json::parse(*text);
    } catch (const json::parse_error& e) {
      const auto [line, column] = lineColumn(*text, e.byte > 0 ? e.byte - 1 : 0);
      // nlohmann's text repeats the position ("[json.exception.parse_error.101] parse error at line 3, column
      // 18: syntax error ..."): keep what follows it.
      std::string what = e.what();
      const std::size_t at = what.find("column");
      const std::size_t colon = at == std::string::npos ? std::string::npos : what.find(": ", at);
      if (colon != std::string::npos) what = what.substr(colon + 2);
      return core::Diagnostic{file_.string(), line, column, fmt::format("expected JSON (an optiflow plan): {}", what)};
    }
    if (!root.is_object()) {
      return planError(fmt::format("expected a JSON object (an optiflow plan), {}", Walk::got(root)));
    }
    std::string format;
    if (!walk_.stringField(root, "", "format", format)) return planError();
    if (format != kPlanFormat) {
      return planError(fmt::format("format: expected \"{}\", got \"{}\"", kPlanFormat, format));
    }
    const json* version = walk_.member(root, "version");
    if (version == nullptr || !version->is_number_integer() || version->get<std::int64_t>() != kPlanVersion) {
      return planError(fmt::format("version: expected {} (the {} version this build reads), {}", kPlanVersion,
                                   kPlanFormat, version == nullptr ? "missing" : Walk::got(*version)));
    }
    const json* colls = walk_.member(root, "collectives");
    if (colls == nullptr || !colls->is_array()) {
      return planError(
          fmt::format("collectives: expected an array, {}", colls == nullptr ? "missing" : Walk::got(*colls)));
    }
    plan_.source = dir_.string();
    for (std::size_t c = 0; c < colls->size(); ++c) {
      if (!collective((*colls)[c], fmt::format("collectives[{}]", c))) return planError();
    }
    const std::string invalid = schedcache::validatePlan(plan_);
    if (!invalid.empty()) return planError("cannot be cached: " + invalid);
    if (std::optional<core::Diagnostic> bad = schedules()) return *std::move(bad);
    return std::move(plan_);
  }

 private:
  core::Diagnostic planError(std::string message = {}) const {
    return core::Diagnostic{file_.string(), 0, 0, message.empty() ? walk_.error : std::move(message)};
  }

  bool collective(const json& c, const std::string& path) {
    if (!c.is_object()) return walk_.fail(path, fmt::format("expected an object, {}", Walk::got(c)));
    std::string name;
    if (!walk_.stringField(c, path, "collective", name)) return false;
    const std::optional<schedcache::Collective> coll = schedcache::parseCollective(name);
    if (!coll) {
      return walk_.fail(path + ".collective",
                        fmt::format("expected broadcast, reduce, allgather, reducescatter or allreduce (the "
                                    "collectives NCCL's tuner decides), got \"{}\"",
                                    name));
    }
    constexpr std::uint64_t kMaxU32 = std::numeric_limits<std::uint32_t>::max();
    std::uint64_t ranks = 0;
    std::uint64_t nodes = 0;
    if (!walk_.unsignedField(c, path, "ranks", kMaxU32, ranks)) return false;
    if (!walk_.unsignedField(c, path, "nodes", kMaxU32, nodes)) return false;
    if (ranks == 0) return walk_.fail(path + ".ranks", "expected at least 1, got 0");
    if (nodes == 0 || nodes > ranks) {
      return walk_.fail(path + ".nodes", fmt::format("expected 1 to {} (ranks), got {}", ranks, nodes));
    }
    const json* entries = walk_.member(c, "entries");
    if (entries == nullptr || !entries->is_array()) {
      return walk_.fail(path + ".entries",
                        fmt::format("expected an array, {}", entries == nullptr ? "missing" : Walk::got(*entries)));
    }
    for (std::size_t e = 0; e < entries->size(); ++e) {
      schedcache::PlanItem item;
      item.coll = *coll;
      item.nRanks = static_cast<std::uint32_t>(ranks);
      item.nNodes = static_cast<std::uint32_t>(nodes);
      if (!entry((*entries)[e], fmt::format("{}.entries[{}]", path, e), item)) return false;
      plan_.items.push_back(std::move(item));
    }
    return true;
  }

  bool entry(const json& e, const std::string& path, schedcache::PlanItem& item) {
    if (!e.is_object()) return walk_.fail(path, fmt::format("expected an object, {}", Walk::got(e)));
    constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();
    if (!walk_.unsignedField(e, path, "min_bytes", kMaxU64, item.minBytes)) return false;
    if (!walk_.unsignedField(e, path, "max_bytes", kMaxU64, item.maxBytes)) return false;
    if (item.minBytes > item.maxBytes) {
      return walk_.fail(path + ".max_bytes",
                        fmt::format("expected at least min_bytes ({}), got {}", item.minBytes, item.maxBytes));
    }
    double bound = 0;
    if (!walk_.timeField(e, path, "bound_us", bound)) return false;
    item.boundUs = static_cast<float>(bound);

    // NCCL's own choice is only shown; a plan without it still has decisions.
    const json* nccl = nullptr;
    if (!walk_.optionalObject(e, path, "nccl", nccl)) return false;
    if (nccl != nullptr) {
      double t = 0;
      if (!walk_.timeField(*nccl, path + ".nccl", "time_us", t)) return false;
      item.ncclUs = static_cast<float>(t);
    }
    const json* native = nullptr;
    if (!walk_.optionalObject(e, path, "native", native)) return false;
    if (native != nullptr && !nativeDecision(*native, path + ".native", item)) return false;

    const json* best = nullptr;
    if (!walk_.optionalObject(e, path, "best", best)) return false;
    if (best != nullptr && !bestSchedule(*best, path + ".best", item)) return false;
    return true;
  }

  bool nativeDecision(const json& n, const std::string& path, schedcache::PlanItem& item) {
    double t = 0;
    std::string algorithm;
    std::string protocol;
    std::uint64_t channels = 0;
    std::uint64_t chunk = 0;
    if (!walk_.timeField(n, path, "time_us", t) || !walk_.stringField(n, path, "algorithm", algorithm) ||
        !walk_.stringField(n, path, "protocol", protocol) ||
        !walk_.unsignedField(n, path, "channels", std::numeric_limits<std::int32_t>::max(), channels)) {
      return false;
    }
    if (walk_.member(n, "chunk_bytes") != nullptr &&
        !walk_.unsignedField(n, path, "chunk_bytes", std::numeric_limits<std::uint64_t>::max(), chunk)) {
      return false;
    }
    item.nativeUs = static_cast<float>(t);
    // No configuration was timed ("n/a", time 0), or one the cache cannot express: no decision, NCCL chooses.
    const auto alg = schedcache::parseAlgorithm(algorithm);
    const auto proto = schedcache::parseProtocol(protocol);
    if (t <= 0 || !alg || *alg == schedcache::Algorithm::kNone || !proto) return true;
    item.algorithm = *alg;
    item.protocol = *proto;
    item.nChannels = static_cast<std::int32_t>(channels);
    item.chunkBytes = chunk;
    return true;
  }

  bool bestSchedule(const json& b, const std::string& path, schedcache::PlanItem& item) {
    double t = 0;
    std::string jsonRel;
    std::string xmlRel;
    if (!walk_.timeField(b, path, "time_us", t) || !walk_.stringField(b, path, "schedule_json", jsonRel) ||
        !walk_.stringField(b, path, "schedule_xml", xmlRel)) {
      return false;
    }
    if (jsonRel.empty()) return walk_.fail(path + ".schedule_json", "expected a file name, got \"\"");
    if (xmlRel.empty()) return walk_.fail(path + ".schedule_xml", "expected a file name, got \"\"");
    item.bestUs = static_cast<float>(t);
    item.jsonPath = (dir_ / jsonRel).lexically_normal().string();
    item.xmlPath = (dir_ / xmlRel).lexically_normal().string();
    pending_.push_back({plan_.items.size(), path});
    return true;
  }

  // The schedule files, once plan.json is known to be well-formed: a bad plan.json is reported as such even when a
  // schedule it names is bad too. The schedule id is the JSON file's content, so that file is read even without
  // verification.
  std::optional<core::Diagnostic> schedules() {
    std::map<std::string, std::optional<core::Diagnostic>> checked;  // each file is verified once
    for (const Pending& p : pending_) {
      schedcache::PlanItem& item = plan_.items[p.item];
      std::error_code ec;
      const std::optional<std::string> bytes =
          fs::is_regular_file(item.jsonPath, ec) ? readBytes(item.jsonPath) : std::optional<std::string>();
      if (!bytes) {
        return core::Diagnostic{
            item.jsonPath, 0, 0,
            fmt::format("{}.schedule_json (in {}) names this schedule file: no such file", p.path, file_.string())};
      }
      item.scheduleId = scheduleFileId(*bytes);
      if (!verify_) continue;
      for (const auto& [file, key] :
           {std::pair{item.jsonPath, "schedule_json"}, std::pair{item.xmlPath, "schedule_xml"}}) {
        auto [it, fresh] = checked.try_emplace(file);
        if (fresh) {
          it->second = checkScheduleFile(file, fmt::format("{}.{} (in {})", p.path, key, file_.string()), item);
        }
        if (it->second) return it->second;
      }
    }
    return std::nullopt;
  }

  struct Pending {
    std::size_t item;  // index into plan_.items
    std::string path;  // "collectives[0].entries[3].best"
  };

  fs::path dir_;
  fs::path file_;
  bool verify_;
  Walk walk_;
  schedcache::Plan plan_;
  std::vector<Pending> pending_;  // entries with a synthesized schedule
};

}  // namespace

fs::path planFileFor(const fs::path& planDir) {
  std::error_code ec;
  fs::path dir = fs::absolute(planDir, ec);
  if (ec) dir = planDir;
  dir = dir.lexically_normal();
  // "/runs/a/" normalises to "/runs/a/"; the plan's source should read "/runs/a".
  if (!dir.has_filename() && dir != dir.root_path()) dir = dir.parent_path();
  return dir / "plan.json";
}

std::optional<core::Diagnostic> checkScheduleFile(const fs::path& file, const std::string& ref,
                                                  const schedcache::PlanItem& item) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    return core::Diagnostic{file.string(), 0, 0, fmt::format("{} names this schedule file: no such file", ref)};
  }
  auto loaded = compiler::loadSchedule(file.string());
  if (!loaded) {
    const core::Diagnostic& d = loaded.error();
    return core::Diagnostic{file.string(), d.line, d.column,
                            fmt::format("{} names this schedule file: expected a schedule (native JSON or MSCCL "
                                        "XML): {}",
                                        ref, d.message)};
  }
  const core::Schedule& s = *loaded;
  const core::Collective want = toCore(item.coll);
  if (s.collective != want || s.nRanks < 0 || static_cast<std::uint64_t>(s.nRanks) != item.nRanks) {
    return core::Diagnostic{
        file.string(), 0, 0,
        fmt::format("{} names this schedule file: expected {} on {} ranks, the file holds {} "
                    "on {} ranks",
                    ref, core::toString(want), item.nRanks, core::toString(s.collective), s.nRanks)};
  }
  const compiler::VerifyReport report = compiler::verify(s);
  if (!report.proven) {
    const std::string first = report.errors.empty() ? std::string("no proof") : report.errors.front().str();
    const std::size_t errors = report.errors.size() + report.suppressedErrors;
    return core::Diagnostic{file.string(), 0, 0,
                            fmt::format("{} names this schedule file: the verifier does not prove it ({} error{}); "
                                        "first: {}",
                                        ref, errors, errors == 1 ? "" : "s", first)};
  }
  return std::nullopt;
}

std::uint64_t scheduleFileId(std::string_view bytes) {
  boost::crc_optimal<64, 0x42F0E1EBA9EA3693ULL, ~0ULL, ~0ULL, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  const std::uint64_t id = crc.checksum();
  return id == 0 ? 1 : id;
}

core::Result<schedcache::Plan> loadPlanForCache(const fs::path& planDir, bool verify) {
  try {
    return PlanLoader(planFileFor(planDir), verify).load();
  } catch (const std::exception& e) {
    // Allocation failure or a library bug: still an error naming the plan, never a crash of the daemon.
    return core::Diagnostic{planFileFor(planDir).string(), 0, 0, fmt::format("cannot load: {}", e.what())};
  }
}

}  // namespace optiflow::synth
