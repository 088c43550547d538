#include "optiflow/synth/cache_plan.h"

#include "optiflow/core/text_file.h"

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

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/verifier.h"
#include "optiflow/core/schedule.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::synth {

namespace {

namespace fs = std::filesystem;

// plan.json as run_dir.h reads it, converted into the cache's items: what the cache cannot hold is an error naming
// the field; a name of an algorithm or protocol the cache does not know is no decision (NCCL chooses).
class PlanLoader {
 public:
  PlanLoader(fs::path file, bool verify) : dir_(file.parent_path()), file_(std::move(file)), verify_(verify) {}

  core::Result<schedcache::Plan> load() {
    auto read = readPlan(file_);
    if (!read) return read.error();
    plan_.source = dir_.string();
    for (std::size_t c = 0; c < read->collectives.size(); ++c) {
      if (auto err = collective(read->collectives[c], fmt::format("collectives[{}]", c))) return *err;
    }
    const std::string invalid = schedcache::validatePlan(plan_);
    if (!invalid.empty()) return planError("cannot be cached: " + invalid);
    if (auto err = schedules()) return *err;
    return std::move(plan_);
  }

 private:
  core::Diagnostic planError(std::string message) const { return core::Diagnostic{file_.string(), 0, 0, message}; }

  std::optional<core::Diagnostic> collective(const PlanCollective& c, const std::string& path) {
    if (!core::ncclFuncIndex(c.collective)) {
      return planError(
          fmt::format("{}.collective: expected broadcast, reduce, allgather, reducescatter or allreduce "
                      "(the collectives NCCL's tuner decides), got \"{}\"",
                      path, core::toString(c.collective)));
    }
    for (std::size_t e = 0; e < c.entries.size(); ++e) {
      const PlanEntry& entry = c.entries[e];
      schedcache::PlanItem item;
      item.coll = c.collective;
      item.nRanks = static_cast<std::uint32_t>(c.ranks);
      item.nNodes = static_cast<std::uint32_t>(c.nodes);
      item.minBytes = entry.minBytes;
      item.maxBytes = entry.maxBytes;
      item.boundUs = static_cast<float>(entry.boundUs);
      // NCCL's own choice is only shown; a plan without it still has decisions.
      if (entry.nccl) item.ncclUs = static_cast<float>(entry.nccl->timeUs);
      if (entry.native) nativeDecision(*entry.native, item);
      // The time that applies is the decision's, or NCCL's own where there is none.
      item.measured = item.algorithm ? entry.native->measured : (entry.nccl && entry.nccl->measured);
      for (std::size_t t = 0; t < entry.trials.size(); ++t) {
        std::string why;
        const std::optional<schedcache::TrialCandidate> candidate = trialCandidate(entry.trials[t], &why);
        if (!candidate) return planError(fmt::format("{}.entries[{}].trials.candidates[{}]: {}", path, e, t, why));
        item.trials.push_back(*candidate);
      }
      if (!item.trials.empty()) item.trialCalls = static_cast<std::uint32_t>(entry.trialCalls);
      if (entry.best) {
        const PlanBest& b = *entry.best;
        item.bestUs = static_cast<float>(b.timeUs);
        item.jsonPath = (dir_ / b.scheduleJson).lexically_normal().string();
        item.xmlPath = (dir_ / b.scheduleXml).lexically_normal().string();
        pending_.push_back({plan_.items.size(), fmt::format("{}.entries[{}].best", path, e)});
      }
      plan_.items.push_back(std::move(item));
    }
    return std::nullopt;
  }

  // A trial's names as the cache holds them; nullopt with *why saying what was expected.
  static std::optional<schedcache::TrialCandidate> trialCandidate(const PlanTrial& t, std::string* why) {
    schedcache::TrialCandidate c;
    c.nChannels = t.channels;
    c.chunkBytes = t.chunkBytes;
    if (t.algorithm.empty()) return c;
    c.algorithm = core::parseAlgorithm(t.algorithm);
    if (!c.algorithm) {
      *why = fmt::format("expected an NCCL algorithm name or null, got \"{}\"", t.algorithm);
      return std::nullopt;
    }
    if (t.protocol.empty()) return c;
    c.protocol = core::parseProtocol(t.protocol);
    if (!c.protocol) {
      *why = fmt::format("expected LL, LL128 or Simple, got \"{}\"", t.protocol);
      return std::nullopt;
    }
    return c;
  }

  static void nativeDecision(const NativeChoice& n, schedcache::PlanItem& item) {
    item.nativeUs = static_cast<float>(n.timeUs);
    // No configuration was timed ("n/a", time 0), or one the cache cannot express: no decision, NCCL chooses.
    const std::optional<core::Algorithm> alg = core::parseAlgorithm(n.algorithm);
    const std::optional<core::Protocol> proto = core::parseProtocol(n.protocol);
    if (n.timeUs <= 0 || !alg || !proto) return;
    item.algorithm = alg;
    item.protocol = proto;
    item.nChannels = n.channels;
    item.chunkBytes = n.chunkBytes;
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
          fs::is_regular_file(item.jsonPath, ec) ? core::readWholeFile(item.jsonPath) : std::optional<std::string>();
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
  const core::Collective want = item.coll;
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
