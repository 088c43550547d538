// The plan store: runs/ and plans/ under the state directory (run records, restore after a restart, gc, the merged
// plan directory) and the share directory a leader writes and its followers read.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "fs_util.h"
#include "optiflow/daemon/measured.h"
#include "optiflow/daemon/ranking.h"
#include "optiflow/synth/cache_plan.h"
#include "optiflow/synth/run_dir.h"
#include "work_impl.h"

namespace optiflow::daemon {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kKeepRunsPerCollective = 3;
constexpr int kKeepPlans = 4;  // as many as the segment has slots: every plan it holds keeps its files
constexpr const char* kDaemonFile = "daemon.json";
constexpr const char* kShareCurrent = "current";

using detail::collName;
using detail::diag;
using detail::writeFileAtomic;

std::optional<json> readJson(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string utcStamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}Z", buf, ms);
}

// Directories named by a plan hash (16 hex digits), newest first, beyond `keep` are removed, except `protect`.
void gcHashDirs(const fs::path& dir, int keep, std::uint64_t protect) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || !schedcache::parseHash(name)) continue;
    dirs.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = static_cast<std::size_t>(keep); i < dirs.size(); ++i) {
    if (schedcache::parseHash(dirs[i].second.filename().string()) == protect) continue;
    fs::remove_all(dirs[i].second, ec);
  }
}

// Copies a directory tree to `to` (which must not exist) under a temporary name, then renames it into place. When
// `to` appears meanwhile (another node's daemon or an earlier pass wrote the same plan), that one is kept.
bool copyDirAtomic(const fs::path& from, const fs::path& to, std::string* error) {
  std::error_code ec;
  if (fs::exists(to / "plan.json", ec)) return true;
  const fs::path tmp = to.parent_path() / fmt::format(".tmp-{}-{}", to.filename().string(), getpid());
  fs::remove_all(tmp, ec);
  fs::copy(from, tmp, fs::copy_options::recursive, ec);
  if (ec) {
    *error = fmt::format("cannot copy {} to {}: {}", from.string(), tmp.string(), ec.message());
    fs::remove_all(tmp, ec);
    return false;
  }
  fs::remove_all(to, ec);  // a partial directory without plan.json (a crash between copy and rename never leaves one)
  fs::rename(tmp, to, ec);
  if (ec) {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    if (fs::exists(to / "plan.json", ignore)) return true;
    *error = fmt::format("cannot rename {} to {}: {}", tmp.string(), to.string(), ec.message());
    return false;
  }
  return true;
}
}  // namespace

// After a restart, the newest complete run per collective made under the same fingerprint counts as done (and
// as the base of the next interval's run): a restart does not redo hours of synthesis.
void WorkLoop::Impl::restore(const std::string& fp) {
  restored = true;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(plansDir(), ec)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path(), ec);  // a crash's leftovers
  }
  for (const fs::directory_entry& e : fs::directory_iterator(runsDir(), ec)) {
    const std::optional<json> meta = readJson(e.path() / kDaemonFile);
    if (!meta || !fs::exists(e.path() / "plan.json", ec)) continue;
    try {
      const std::optional<std::uint32_t> coll = detail::collIndex(meta->at("collective").get<std::string>());
      if (!coll || meta->at("fingerprint").get<std::string>() != fp) continue;
      CollState st;
      st.runDir = e.path();
      st.sizes = meta->at("sizes").get<std::vector<std::uint64_t>>();
      st.fingerprint = fp;
      st.finishedNs = meta->at("finished_ns").get<std::int64_t>();
      st.historyRecords = meta->value("history_records", std::size_t{0});
      const std::uint32_t c = *coll;
      auto it = colls.find(c);
      if (it == colls.end() || it->second.finishedNs < st.finishedNs) colls[c] = std::move(st);
    } catch (const json::exception&) {
      continue;  // not a run this daemon wrote
    }
  }
  for (const auto& [c, st] : colls) {
    spdlog::info("work: restored the {} run {} ({} sizes)", collName(c), st.runDir.string(), st.sizes.size());
  }
}

fs::path WorkLoop::Impl::newRunDir(std::uint32_t c) {
  fs::path dir = runsDir() / fmt::format("{}-{}", collName(c), utcStamp());
  std::error_code ec;
  for (int n = 1; fs::exists(dir, ec); ++n) dir = runsDir() / fmt::format("{}-{}-{}", collName(c), utcStamp(), n);
  return dir;
}

// The run's daemon record (daemon.json): what restore() reads back after a restart.
core::Result<bool> WorkLoop::Impl::writeRunRecord(const std::string& name, const CollState& st,
                                                  const std::string& stopReason) {
  const json meta = {{"collective", name},
                     {"sizes", st.sizes},
                     {"fingerprint", st.fingerprint},
                     {"finished_ns", st.finishedNs},
                     {"history_records", st.historyRecords},
                     {"stop_reason", stopReason}};
  if (!writeFileAtomic(st.runDir / kDaemonFile, meta.dump(2) + "\n")) {
    return diag(st.runDir / kDaemonFile, "cannot write the run's daemon record");
  }
  return true;
}

void WorkLoop::Impl::gcRuns(std::uint32_t c) {
  const std::string prefix = collName(c) + "-";
  std::vector<fs::path> runs;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(runsDir(), ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && n.size() > prefix.size() && n[prefix.size()] >= '0' && n[prefix.size()] <= '9') {
      runs.push_back(e.path());
    }
  }
  std::sort(runs.begin(), runs.end(), std::greater<>());  // names are UTC stamps: newest first
  for (std::size_t i = kKeepRunsPerCollective; i < runs.size(); ++i) {
    if (runs[i] != colls[c].runDir) fs::remove_all(runs[i], ec);
  }
}

// The newest plan directories (as many as the segment has slots) stay, and `protect` (the current plan) always.
void WorkLoop::Impl::gcPlans(std::uint64_t protect) { gcHashDirs(plansDir(), kKeepPlans, protect); }

// The latest run of every collective, merged into one plan directory named by its content hash:
// plans/<hash>/plan.json with the runs' "collectives" concatenated, and their schedules and winning programs.
namespace {

// What a ranked plan decides (the decisions, whether their times are measured, the trials) and which runs it comes
// from: equal signatures publish the same plan.
std::string decisionSignature(const synth::PlanFile& plan) {
  std::string s;
  for (const std::string& run : plan.runs) s += run + "\n";
  for (const synth::PlanCollective& c : plan.collectives) {
    for (const synth::PlanEntry& e : c.entries) {
      s += fmt::format("{} {} {} {}:", core::toString(c.collective), c.ranks, c.nodes, e.minBytes);
      if (e.native) {
        s += fmt::format("{}/{}/{}/{}/{}", e.native->algorithm, e.native->protocol, e.native->channels,
                         e.native->chunkBytes, e.native->measured);
      }
      s += fmt::format(" nccl {} trials {}:", e.nccl && e.nccl->measured, e.trialCalls);
      for (const synth::PlanTrial& t : e.trials) s += fmt::format("{}/{}/{} ", t.algorithm, t.protocol, t.channels);
      s += "\n";
    }
  }
  return s;
}

}  // namespace

core::Result<fs::path> WorkLoop::Impl::mergeRuns(const RankOptions& rank, bool onlyIfChanged) {
  std::vector<synth::PlanFile> plans;
  std::vector<std::string> runs;
  std::vector<fs::path> collRunDir;  // the run directory of each collective of the merged plan, in order
  for (const auto& [c, st] : colls) {
    auto plan = synth::readPlan(st.runDir / "plan.json");
    if (!plan) return plan.error();
    collRunDir.insert(collRunDir.end(), plan->collectives.size(), st.runDir);
    plans.push_back(std::move(plan).value());
    runs.push_back(st.runDir.string());
  }
  synth::PlanFile merged = synth::mergePlans(plans, runs);

  // What the node's jobs measured ranks the decisions (ranking.h); without a segment, the predictions stand.
  schedcache::Error attachError;
  if (std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(ns, &attachError)) {
    const std::vector<RankedEntry> ranked =
        rankByMeasurements(merged, joinMeasurements(*reader), reader->ncclChoices(), rank);
    int measured = 0;
    for (const RankedEntry& r : ranked) measured += r.afterUs ? 1 : 0;
    if (metrics != nullptr) {
      metrics->set("optiflowd_plan_entries", static_cast<double>(measured), promLabels({{"time_source", "measured"}}));
      metrics->set("optiflowd_plan_entries", static_cast<double>(ranked.size() - measured),
                   promLabels({{"time_source", "predicted"}}));
    }
    const std::string signature = decisionSignature(merged);
    if (onlyIfChanged && signature == lastMergeSignature) return fs::path();
    lastMergeSignature = signature;
    if (const std::string table = formatRanking(ranked); !table.empty()) {
      spdlog::info("work: plan ranked by measured times ({} of {} entries measured):\n{}", measured, ranked.size(),
                   table);
    }
  } else {
    const std::string signature = decisionSignature(merged);
    if (onlyIfChanged && signature == lastMergeSignature) return fs::path();
    lastMergeSignature = signature;
  }

  const fs::path tmp = plansDir() / fmt::format(".tmp-{}-{}", getpid(), tmpCounter++);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp / "schedules", ec);
  fs::create_directories(tmp / "programs", ec);
  if (ec) return diag(tmp, fmt::format("cannot create the plan directory: {}", ec.message()));
  // The files each best names move into the merged directory; candidate ids repeat across runs, so the collective's
  // name keeps the programs apart.
  for (std::size_t k = 0; k < merged.collectives.size(); ++k) {
    synth::PlanCollective& coll = merged.collectives[k];
    const fs::path& runDir = collRunDir[k];
    for (synth::PlanEntry& entry : coll.entries) {
      if (!entry.best) continue;
      for (std::string* rel : {&entry.best->scheduleJson, &entry.best->scheduleXml}) {
        const fs::path from = runDir / *rel;
        const fs::path to = fs::path("schedules") / fs::path(*rel).filename();
        fs::copy_file(from, tmp / to, fs::copy_options::overwrite_existing, ec);
        if (ec) {
          const std::string msg = ec.message();
          fs::remove_all(tmp, ec);
          lastMergeSignature.clear();
          return diag(from, fmt::format("cannot copy into the merged plan: {}", msg));
        }
        *rel = to.string();
      }
      if (!entry.best->programFile.empty()) {
        const fs::path rel = entry.best->programFile;
        const fs::path renamed =
            fs::path("programs") / fmt::format("{}-{}", core::toString(coll.collective), rel.filename().string());
        std::error_code pec;  // a program is shown, not served: a missing one does not stop the merge
        fs::copy_file(runDir / rel, tmp / renamed, fs::copy_options::overwrite_existing, pec);
        entry.best->programFile = renamed.string();
      }
    }
  }
  auto wrote = synth::writePlan(tmp / "plan.json", merged);
  if (!wrote) {
    fs::remove_all(tmp, ec);
    lastMergeSignature.clear();
    return wrote.error();
  }
  auto dir = finalizePlanDir(tmp);
  if (!dir) lastMergeSignature.clear();
  return dir;
}

// Moves a complete plan directory to plans/<hash> (or drops it when that plan is already there).
core::Result<fs::path> WorkLoop::Impl::finalizePlanDir(const fs::path& tmp, std::uint64_t expected) {
  std::error_code ec;
  auto plan = synth::loadPlanForCache(tmp, /*verify=*/false);
  if (!plan) {
    fs::remove_all(tmp, ec);
    return plan.error();
  }
  const std::uint64_t hash = schedcache::contentHash(*plan);
  if (expected != 0 && hash != expected) {
    fs::remove_all(tmp, ec);
    return diag(
        tmp, fmt::format("holds plan {}, expected {}", schedcache::formatHash(hash), schedcache::formatHash(expected)));
  }
  const fs::path dest = plansDir() / schedcache::formatHash(hash);
  if (fs::exists(dest / "plan.json", ec)) {
    // The same decisions (and so the same schedule files): the new plan.json only says more (which times are
    // measured now, which runs). The programs it names move in first, then it replaces the old one in one rename.
    for (const fs::directory_entry& f : fs::directory_iterator(tmp / "programs", ec)) {
      std::error_code pec;
      if (!fs::exists(dest / "programs" / f.path().filename(), pec)) {
        fs::create_directories(dest / "programs", pec);
        fs::rename(f.path(), dest / "programs" / f.path().filename(), pec);
      }
    }
    std::error_code rec;
    fs::rename(tmp / "plan.json", dest / "plan.json", rec);
    fs::remove_all(tmp, ec);
    if (rec) return diag(dest / "plan.json", fmt::format("cannot replace the plan file: {}", rec.message()));
    return dest;
  }
  fs::remove_all(dest, ec);
  fs::rename(tmp, dest, ec);
  if (ec) {
    const std::string msg = ec.message();
    fs::remove_all(tmp, ec);
    return diag(dest, fmt::format("cannot move the plan directory into place: {}", msg));
  }
  return dest;
}

// Leader: the plan goes to <share>/<hash>/, then <share>/current names it (replaced by a rename, so followers
// read the old name or the new one, and the directory it names is complete before it is named).
core::Result<bool> WorkLoop::Impl::share(const fs::path& shareDir, const fs::path& planDir, std::uint64_t hash) {
  std::error_code ec;
  fs::create_directories(shareDir, ec);
  if (ec) return diag(shareDir, fmt::format("cannot create the share directory: {}", ec.message()));
  const std::string name = schedcache::formatHash(hash);
  std::string error;
  if (!copyDirAtomic(planDir, shareDir / name, &error)) return diag(shareDir, error);
  if (!writeFileAtomic(shareDir / kShareCurrent, fmt::format("{} {}\n", name, name))) {
    return diag(shareDir / kShareCurrent, "cannot write");
  }
  lastShared = hash;
  gcHashDirs(shareDir, kKeepPlans, hash);
  spdlog::info("work: shared plan {} in {}", name, shareDir.string());
  return true;
}

// Follower: publishes the plan <share>/current names, once, after checking it is what the name says.
core::Result<PassResult> WorkLoop::Impl::follow(const Config& cfg) {
  PassResult out;
  out.planHash = lastFollowed;
  if (cfg.shareDir.empty()) {
    error("share");
    return diag(cfg.file, "[share] role = \"follower\" needs share_dir");
  }
  const fs::path currentFile = cfg.shareDir / kShareCurrent;
  std::ifstream in(currentFile);
  if (!in) {
    spdlog::debug("work: {} does not exist yet: the leader has not shared a plan", currentFile.string());
    out.planHash = currentHash();
    return out;
  }
  std::string hashText;
  std::string dirName;
  in >> hashText >> dirName;
  const std::optional<std::uint64_t> hash = schedcache::parseHash(hashText);
  // Only a plain directory name: the file must not send the daemon elsewhere on the filesystem.
  if (!hash || dirName.empty() || dirName.find('/') != std::string::npos || dirName.front() == '.') {
    error("share");
    return diag(currentFile, fmt::format("expected \"<plan hash: 16 hex digits> <directory name>\", got \"{} {}\"",
                                         hashText, dirName));
  }
  if (*hash == lastFollowed) return out;
  const fs::path tmp = plansDir() / fmt::format(".tmp-{}-{}", getpid(), tmpCounter++);
  std::error_code ec;
  fs::create_directories(plansDir(), ec);
  fs::remove_all(tmp, ec);
  fs::copy(cfg.shareDir / dirName, tmp, fs::copy_options::recursive, ec);
  if (ec) {
    error("share");
    const std::string msg = ec.message();
    fs::remove_all(tmp, ec);
    return diag(cfg.shareDir / dirName, fmt::format("cannot copy the shared plan: {}", msg));
  }
  auto dir = finalizePlanDir(tmp, *hash);
  if (!dir) {
    error("share");
    return diag(cfg.shareDir / dirName, fmt::format("named by {}: {}", currentFile.string(), dir.error().str()));
  }
  auto published = publish(*dir, out);
  if (!published) {
    error("publish");
    return published.error();
  }
  lastFollowed = *hash;
  return out;
}

}  // namespace optiflow::daemon
