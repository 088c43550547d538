// `optiflow cache publish|show|verify|clear|rails|measurements`: the node's schedule cache
// (/dev/shm/optiflow-<namespace>), which

#include "optiflow/core/text_file.h"
// the NCCL tuner plugin reads when a communicator is created (and where the net plugin finds rail weights and counts
// its traffic). Publishing proves every schedule a plan references first, so nothing unproven reaches a training job.
#include <fcntl.h>
#include <grp.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/core/env.h"
#include "optiflow/core/units.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "optiflow/synth/cache_plan.h"

namespace optiflow::cli {

namespace {

namespace fs = std::filesystem;
namespace sc = optiflow::schedcache;
using nlohmann::json;

// --namespace, else $OPTIFLOW_NAMESPACE (what the plugins read; core/env.h), else "default"; nullopt (reported) when
// invalid.
std::optional<std::string> resolveNamespace(const CacheArgs& args) {
  if (args.ns.empty()) {
    const core::env::Value env =
        core::env::read(core::env::find(core::env::kDaemonParams, "OPTIFLOW_NAMESPACE"), core::env::processEnv);
    if (!env.error.empty()) {
      fmt::print(stderr, "optiflow: {}\n", env.error);
      return std::nullopt;
    }
    return env.text ? std::string(*env.text) : std::string("default");
  }
  if (!sc::validNamespace(args.ns)) {
    fmt::print(stderr,
               "optiflow: invalid namespace \"{}\" (from --namespace): expected 1 to 64 characters of A-Z a-z 0-9 _ . "
               "-\n",
               args.ns);
    return std::nullopt;
  }
  return args.ns;
}

std::string absentMessage(const std::string& ns) {
  return fmt::format("no schedule cache for namespace {} ({}): publish a plan with `optiflow cache publish PLAN_DIR`",
                     ns, sc::segmentPath(ns));
}

// The library's message, with the way out for a segment that is ours but unusable.
std::string errorText(const sc::Error& e, const std::string& ns) {
  std::string text = e.message.empty() ? std::string(sc::toString(e.status)) : e.message;
  switch (e.status) {
    case sc::Status::kBadPermissions:
    case sc::Status::kBadMagic:
    case sc::Status::kBadVersion:
    case sc::Status::kBadSize:
    case sc::Status::kBadHeader:
      text += fmt::format(" (`optiflow cache clear --remove --namespace {}` deletes it)", ns);
      break;
    default:
      break;
  }
  return text;
}

// nullptr (reported on stderr) when the segment is absent or fails Reader::attach's checks.
std::unique_ptr<sc::Reader> attachOrReport(const std::string& ns) {
  sc::Error error;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(ns, &error);
  if (!reader) {
    fmt::print(stderr, "optiflow: {}\n",
               error.status == sc::Status::kAbsent ? absentMessage(ns) : errorText(error, ns));
  }
  return reader;
}

// The optiflow version that created the segment. Reader has no accessor for it; the header is immutable after
// creation and Reader::attach has just checked it, so reading it from the file is safe.
std::string segmentBuild(const std::string& ns) {
  const int fd = ::open(sc::segmentPath(ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  sc::SegmentHeader header{};
  const ssize_t n = ::pread(fd, &header, sizeof header, 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof header)) return {};
  return std::string(header.writerBuild, ::strnlen(header.writerBuild, sizeof header.writerBuild));
}

std::string formatTime(std::int64_t ns) {
  const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  if (::localtime_r(&t, &tm) == nullptr) return "?";
  char buf[32];
  return std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) > 0 ? std::string(buf) : std::string("?");
}

// [min, max] inclusive, shown as the half-open range people read: "[4KiB, 1MiB)", "[1MiB, inf)".
std::string sizeRange(std::uint64_t minBytes, std::uint64_t maxBytes) {
  const std::string end =
      maxBytes == std::numeric_limits<std::uint64_t>::max() ? std::string("inf") : core::formatSize(maxBytes + 1);
  return fmt::format("[{}, {})", core::formatSize(minBytes), end);
}

std::string decisionText(const sc::PlanItem& item) {
  if (!item.algorithm) return "NCCL decides";
  return fmt::format("{}/{}/{}", core::toString(*item.algorithm),
                     item.protocol ? std::string(core::toString(*item.protocol)) : std::string("any"),
                     item.nChannels == 0 ? std::string("auto") : fmt::format("{}ch", item.nChannels));
}

// The segment keeps kSourceBytes - 1 bytes of the source; a source of that length was most likely cut.
std::string sourceText(const std::string& source) {
  return source.size() >= sc::kSourceBytes - 1 ? source + "..." : source;
}

std::string usText(float us) { return us > 0 ? fmt::format("{:.2f}", us) : std::string("-"); }

std::string pinPlanText(std::uint64_t hash) {
  if (hash == sc::kPinPending) return "pending";
  if (hash == sc::kPinNoPlan) return "none";
  return sc::formatHash(hash);
}

// The float as printed (9.207467), not its double expansion (9.207467079162598).
double shortest(float v) { return std::stod(fmt::format("{}", v)); }

json planInfoJson(const sc::PlanInfo& p) {
  return {{"slot", p.slot},
          {"hash", sc::formatHash(p.contentHash)},
          {"generation", p.generation},
          {"published_ns", p.publishedNs},
          {"published", formatTime(p.publishedNs)},
          {"entries", p.entryCount},
          {"source", p.source},
          {"current", p.current}};
}

json trialsJson(const sc::PlanItem& it) {
  json list = json::array();
  for (const sc::TrialCandidate& t : it.trials) {
    list.push_back({{"algorithm", t.algorithm ? json(std::string(core::toString(*t.algorithm))) : json(nullptr)},
                    {"protocol", t.protocol ? json(std::string(core::toString(*t.protocol))) : json(nullptr)},
                    {"channels", t.nChannels},
                    {"chunk_bytes", t.chunkBytes}});
  }
  return list;
}

json itemJson(const sc::PlanItem& it) {
  return {{"collective", std::string(core::toString(it.coll))},
          {"ranks", it.nRanks},
          {"nodes", it.nNodes},
          {"min_bytes", it.minBytes},
          {"max_bytes", it.maxBytes},
          {"algorithm", it.algorithm ? json(std::string(core::toString(*it.algorithm))) : json(nullptr)},
          {"protocol", it.algorithm && it.protocol ? json(std::string(core::toString(*it.protocol))) : json(nullptr)},
          {"channels", it.nChannels},
          {"chunk_bytes", it.chunkBytes},
          {"native_us", shortest(it.nativeUs)},
          // Which time applies (native_us, or nccl_us where there is no decision): measured in running jobs or
          // predicted by the simulator.
          {"time_source", it.measured ? "measured" : "predicted"},
          {"trials", trialsJson(it)},
          {"trial_calls", it.trials.empty() ? 0u : it.trialCalls},
          {"nccl_us", shortest(it.ncclUs)},
          {"best_us", shortest(it.bestUs)},
          {"bound_us", shortest(it.boundUs)},
          {"schedule_id", it.scheduleId != 0 ? json(sc::formatHash(it.scheduleId)) : json(nullptr)},
          {"schedule_json", it.jsonPath.empty() ? json(nullptr) : json(it.jsonPath)},
          {"schedule_xml", it.xmlPath.empty() ? json(nullptr) : json(it.xmlPath)}};
}

// In the segment's order: by NCCL's ncclFunc_t index (broadcast first), not by the vocabulary's enumerators.
void sortItems(std::vector<sc::PlanItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const sc::PlanItem& a, const sc::PlanItem& b) {
    return std::tuple(core::ncclFuncIndex(a.coll), a.nRanks, a.nNodes, a.minBytes) <
           std::tuple(core::ncclFuncIndex(b.coll), b.nRanks, b.nNodes, b.minBytes);
  });
}

// An Activity row: counted by ncclFunc_t index.
std::string_view activityName(std::uint32_t c) {
  return core::toString(core::collectiveFromNcclFunc(static_cast<int>(c)).value_or(core::Collective::Custom));
}

// --group: false (reported) for a group this host does not know.
bool resolveGroup(const CacheArgs& args, sc::WriterOptions* options) {
  if (args.group.empty()) return true;
  const group* g = ::getgrnam(args.group.c_str());
  if (g == nullptr) {
    fmt::print(stderr, "optiflow: unknown group \"{}\" (--group): expected a group of this host (getent group)\n",
               args.group);
    return false;
  }
  options->group = g->gr_gid;
  return true;
}

// ---- Net plugin: rail weights and telemetry (NetRegion) ----

constexpr std::uint32_t kMaxRailWeight = 1'000'000;  // the Writer refuses more (striping arithmetic)

std::string railName(const sc::NetRailWeight& rail) { return std::string(rail.name, ::strnlen(rail.name, 16)); }

// The share of a striped message each rail gets, as the plugin computes it: weight / sum, equal when all are 0.
std::string railShare(const std::vector<sc::NetRailWeight>& rails, std::uint32_t weight) {
  std::uint64_t sum = 0;
  for (const sc::NetRailWeight& r : rails) sum += r.weight;
  if (sum == 0) return fmt::format("{:.1f}%", 100.0 / static_cast<double>(rails.size()));
  return fmt::format("{:.1f}%", 100.0 * weight / static_cast<double>(sum));
}

void printRails(const std::vector<sc::NetRailWeight>& rails, const char* indent) {
  if (rails.empty()) {
    fmt::print("{}none set: the net plugin gives every rail of a connection an equal share\n", indent);
    return;
  }
  fmt::print("{}{:<15}  {:>8}  {:>6}\n", indent, "interface", "weight", "share");
  for (const sc::NetRailWeight& r : rails) {
    fmt::print("{}{:<15}  {:>8}  {:>6}{}\n", indent, railName(r), r.weight, railShare(rails, r.weight),
               r.weight == 0 ? "  (unused while another rail has a weight)" : "");
  }
  fmt::print("{}(shares among all rails listed; a connection over fewer rails divides among its own)\n", indent);
}

// Bytes per busy nanosecond is GB/s (1 GB = 1e9 bytes, as nccl-tests uses).
std::optional<double> achievedGbps(std::uint64_t bytes, std::uint64_t busyNs) {
  if (busyNs == 0) return std::nullopt;
  return static_cast<double>(bytes) / static_cast<double>(busyNs);
}

std::string gbpsText(std::uint64_t bytes, std::uint64_t busyNs) {
  const std::optional<double> v = achievedGbps(bytes, busyNs);
  return v ? fmt::format("{:.2f}", *v) : std::string("-");
}

std::string recordName(const sc::NetStatsRecord& r) {
  const std::size_t n = ::strnlen(r.name, sc::kNetNameBytes);
  return n == 0 ? std::string("(being claimed)") : std::string(r.name, n);
}

json netRecordJson(const sc::NetStatsRecord& r) {
  const sc::NetCounters& c = r.counters;
  auto rate = [](std::uint64_t bytes, std::uint64_t busyNs) {
    const std::optional<double> v = achievedGbps(bytes, busyNs);
    return v ? json(*v) : json(nullptr);
  };
  json bySize = json::array();
  for (std::uint32_t b = 0; b < sc::kSizeBuckets; ++b) {
    if (c.sizeLog2[b] != 0)
      bySize.push_back({{"bucket", b}, {"size", fmt::format("2^{}", b)}, {"messages", c.sizeLog2[b]}});
  }
  return {{"name", std::string(r.name, ::strnlen(r.name, sc::kNetNameBytes))},
          {"last_ns", r.lastNs},
          {"bytes_sent", c.bytesSent},
          {"bytes_recv", c.bytesRecv},
          {"msgs_sent", c.msgsSent},
          {"msgs_recv", c.msgsRecv},
          {"send_busy_ns", c.sendBusyNs},
          {"recv_busy_ns", c.recvBusyNs},
          {"stalls", c.stalls},
          {"errors", c.errors},
          {"sent_by_size", bySize},
          {"send_gbps", rate(c.bytesSent, c.sendBusyNs)},
          {"recv_gbps", rate(c.bytesRecv, c.recvBusyNs)}};
}

void printNetRecords(const char* title, const std::vector<sc::NetStatsRecord>& records, std::int64_t now) {
  fmt::print("  {}:{}\n", title, records.empty() ? " none" : "");
  if (records.empty()) return;
  fmt::print("    {:<24}  {:>10}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}  {:>7}  {:>6}  {:>8}\n", "name", "sent", "recv",
             "msgs sent", "msgs recv", "send GB/s", "recv GB/s", "stalls", "errors", "last");
  for (const sc::NetStatsRecord& r : records) {
    const sc::NetCounters& c = r.counters;
    const std::string age =
        r.lastNs > 0 ? fmt::format("{:.0f}s ago", static_cast<double>(now - r.lastNs) / 1e9) : std::string("-");
    fmt::print("    {:<24}  {:>10}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}  {:>7}  {:>6}  {:>8}\n", recordName(r),
               core::formatSize(c.bytesSent), core::formatSize(c.bytesRecv), c.msgsSent, c.msgsRecv,
               gbpsText(c.bytesSent, c.sendBusyNs), gbpsText(c.bytesRecv, c.recvBusyNs), c.stalls, c.errors, age);
  }
}

bool validRailName(std::string_view name) {
  if (name.empty() || name.size() > 15) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == ':' || c == '-';
  });
}

// "eth0=3": nullopt (reported, naming the argument and what was expected) when malformed.
std::optional<std::pair<std::string, std::uint32_t>> parseRailWeight(const std::string& arg, std::size_t position) {
  auto fail = [&](const std::string& why) {
    fmt::print(stderr, "optiflow: rail weight \"{}\" (argument {}): {}\n", arg, position, why);
    return std::nullopt;
  };
  const std::size_t eq = arg.find('=');
  if (eq == std::string::npos) return fail("expected NAME=WEIGHT, e.g. eth0=3");
  const std::string name = arg.substr(0, eq);
  const std::string value = arg.substr(eq + 1);
  if (!validRailName(name)) {
    return fail(fmt::format("interface name \"{}\": expected 1 to 15 characters of A-Z a-z 0-9 _ . : -", name));
  }
  std::uint64_t weight = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), weight);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || weight > kMaxRailWeight) {
    return fail(fmt::format("weight \"{}\": expected an integer from 0 to {}", value, kMaxRailWeight));
  }
  return std::pair<std::string, std::uint32_t>(name, static_cast<std::uint32_t>(weight));
}

}  // namespace

int runCachePublish(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  sc::WriterOptions options;
  options.ns = *ns;
  options.build = OPTIFLOW_VERSION;
  if (!resolveGroup(args, &options)) return kExitBadInput;
  const std::string segment = sc::segmentPath(*ns);

  // Everything is loaded and proven before the segment is touched: a refused plan publishes nothing.
  core::Result<sc::Plan> plan = synth::loadPlanForCache(args.planDir, !args.noVerify);
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    fmt::print(stderr, "optiflow: nothing was published into {}\n", segment);
    // A bad plan.json is bad input; a referenced schedule that is missing or not proven is a wrong schedule.
    return plan.error().file == synth::planFileFor(args.planDir).string() ? kExitBadInput : kExitFailed;
  }

  sc::Error error;
  std::unique_ptr<sc::Writer> writer = sc::Writer::open(options, &error);
  if (!writer) {
    fmt::print(stderr, "optiflow: {}\n", errorText(error, *ns));
    return error.status == sc::Status::kBadNamespace ? kExitBadInput : kExitFailed;
  }
  const std::optional<sc::PublishResult> published = writer->publish(*plan, &error);
  if (!published) {
    fmt::print(stderr, "optiflow: {}\n", errorText(error, *ns));
    fmt::print(stderr, "optiflow: nothing was published into {}\n", segment);
    return kExitFailed;
  }
  if (published->unchanged) {
    fmt::print("plan {} is already current in {} (generation {})\n", sc::formatHash(published->hash), segment,
               published->generation);
  } else {
    fmt::print("published plan {} ({} entries, slot {}, generation {}) from {} into {}\n",
               sc::formatHash(published->hash), plan->items.size(), published->slot, published->generation,
               plan->source, segment);
  }
  return kExitOk;
}

// `show --json` prints one object:
//   namespace, segment (path), build (optiflow version that created the segment), generation,
//   current: null | {slot, hash, generation, published_ns, published (local time), entries, source, current},
//   plans: [same as current, one per valid slot],
//   pins: [{comm_id (16 hex digits), plan (hash, "pending" or "none"), ranks, nodes, age_s}],
//   activity: [{collective, bucket (k: sizes in [2^k, 2^(k+1))), size ("2^k"), calls}], non-zero counters only,
//   entries: [{collective, ranks, nodes, min_bytes, max_bytes (inclusive), algorithm, protocol (null: NCCL
//              decides), channels, chunk_bytes (0: NCCL decides), native_us, nccl_us, best_us, bound_us,
//              schedule_id, schedule_json, schedule_xml (null: no synthesized schedule)}] of the current plan,
//   rails: [{name, weight}] (the net plugin's rail weights, `cache rails set`),
//   net: {nics: [...], peers: [...]}, each {name, last_ns, bytes_sent, bytes_recv, msgs_sent, msgs_recv,
//        send_busy_ns, recv_busy_ns, stalls, errors, sent_by_size: [{bucket, size, messages}] (non-zero only),
//        send_gbps, recv_gbps (bytes / busy ns; null before any busy time)}: counters since the segment was created,
//   problems: [what could not be read].
int runCacheShow(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  const std::unique_ptr<sc::Reader> reader = attachOrReport(*ns);
  if (!reader) return kExitFailed;

  const std::string segment = sc::segmentPath(*ns);
  const std::string build = segmentBuild(*ns);
  const std::uint64_t generation = reader->generation();
  std::vector<std::string> problems;
  sc::PlanInfo current;
  const sc::Status currentStatus = reader->current(&current);
  if (currentStatus != sc::Status::kOk && currentStatus != sc::Status::kNoPlan) {
    problems.push_back(fmt::format("the current plan cannot be read: {}", sc::toString(currentStatus)));
  }
  const std::vector<sc::PlanInfo> plans = reader->plans();
  std::vector<sc::CommPin> pins;
  for (const sc::CommPin& p : reader->pins()) {
    if (p.commId != 0) pins.push_back(p);
  }
  const sc::Activity activity = reader->activity();
  sc::Plan plan;
  if (currentStatus == sc::Status::kOk) {
    sc::PlanInfo info;
    std::string detail;
    const sc::Status s = reader->loadPlan(current.contentHash, &plan, &info, &detail);
    if (s != sc::Status::kOk) {
      problems.push_back(fmt::format("plan {} cannot be read: {}{}{}", sc::formatHash(current.contentHash),
                                     sc::toString(s), detail.empty() ? "" : ": ", detail));
      plan.items.clear();
    }
  }
  sortItems(plan.items);
  const std::int64_t now = sc::realtimeNs();
  const std::vector<sc::NetRailWeight> rails = reader->railWeights();
  std::vector<sc::NetStatsRecord> nics = reader->netNics();
  std::vector<sc::NetStatsRecord> peers = reader->netPeers();
  // Records sit in hash order in the segment; people look names up.
  for (auto* records : {&nics, &peers}) {
    std::sort(records->begin(), records->end(), [](const sc::NetStatsRecord& a, const sc::NetStatsRecord& b) {
      return ::strncmp(a.name, b.name, sc::kNetNameBytes) < 0;
    });
  }

  if (args.json) {
    json j;
    j["namespace"] = *ns;
    j["segment"] = segment;
    j["build"] = build;
    j["generation"] = generation;
    j["current"] = currentStatus == sc::Status::kOk ? planInfoJson(current) : json(nullptr);
    j["plans"] = json::array();
    for (const sc::PlanInfo& p : plans) j["plans"].push_back(planInfoJson(p));
    j["pins"] = json::array();
    for (const sc::CommPin& p : pins) {
      j["pins"].push_back({{"comm_id", fmt::format("{:016x}", p.commId)},
                           {"plan", pinPlanText(p.planHash)},
                           {"ranks", p.nRanks},
                           {"nodes", p.nNodes},
                           {"age_s", static_cast<double>(now - p.stampNs) / 1e9}});
    }
    j["activity"] = json::array();
    for (std::uint32_t c = 0; c < sc::kNumCollectives; ++c) {
      for (std::uint32_t b = 0; b < sc::kSizeBuckets; ++b) {
        if (activity.calls[c][b] == 0) continue;
        j["activity"].push_back({{"collective", std::string(activityName(c))},
                                 {"bucket", b},
                                 {"size", fmt::format("2^{}", b)},
                                 {"calls", activity.calls[c][b]}});
      }
    }
    j["entries"] = json::array();
    for (const sc::PlanItem& it : plan.items) j["entries"].push_back(itemJson(it));
    j["rails"] = json::array();
    for (const sc::NetRailWeight& r : rails) j["rails"].push_back({{"name", railName(r)}, {"weight", r.weight}});
    j["net"] = {{"nics", json::array()}, {"peers", json::array()}};
    for (const sc::NetStatsRecord& r : nics) j["net"]["nics"].push_back(netRecordJson(r));
    for (const sc::NetStatsRecord& r : peers) j["net"]["peers"].push_back(netRecordJson(r));
    j["problems"] = problems;
    std::cout << j.dump(2) << '\n';
  } else {
    fmt::print("schedule cache {} (namespace {}, created by optiflow {}), generation {}\n", segment, *ns,
               build.empty() ? "?" : build, generation);
    if (currentStatus == sc::Status::kOk) {
      fmt::print("current plan {}: generation {}, published {}, {} entries, from {}\n",
                 sc::formatHash(current.contentHash), current.generation, formatTime(current.publishedNs),
                 current.entryCount, sourceText(current.source));
    } else if (currentStatus == sc::Status::kNoPlan) {
      fmt::print("no plan is current (cleared, or nothing published): NCCL makes its own choices\n");
    }
    fmt::print("\nplans:{}\n", plans.empty() ? " none" : "");
    if (!plans.empty()) {
      fmt::print("  {:<4}  {:<16}  {:>10}  {:<19}  {:>7}  {}\n", "slot", "hash", "generation", "published", "entries",
                 "source");
    }
    for (const sc::PlanInfo& p : plans) {
      fmt::print("  {:<4}  {:<16}  {:>10}  {:<19}  {:>7}  {}{}\n", p.slot, sc::formatHash(p.contentHash), p.generation,
                 formatTime(p.publishedNs), p.entryCount, sourceText(p.source), p.current ? "  (current)" : "");
    }
    fmt::print("\npins:{}\n", pins.empty() ? " none" : "");
    if (!pins.empty()) {
      fmt::print("  {:<16}  {:<16}  {:>6}  {:>5}  {:>8}\n", "communicator", "plan", "ranks", "nodes", "age");
    }
    for (const sc::CommPin& p : pins) {
      fmt::print("  {:016x}  {:<16}  {:>6}  {:>5}  {:>7.0f}s\n", p.commId, pinPlanText(p.planHash), p.nRanks, p.nNodes,
                 static_cast<double>(now - p.stampNs) / 1e9);
    }
    bool anyCalls = false;
    for (std::uint32_t c = 0; c < sc::kNumCollectives; ++c) {
      for (std::uint32_t b = 0; b < sc::kSizeBuckets; ++b) {
        if (activity.calls[c][b] == 0) continue;
        if (!anyCalls) fmt::print("\nactivity:\n  {:<14}  {:>5}  {:>12}\n", "collective", "size", "calls");
        anyCalls = true;
        fmt::print("  {:<14}  {:>5}  {:>12}\n", activityName(c), fmt::format("2^{}", b), activity.calls[c][b]);
      }
    }
    if (!anyCalls) fmt::print("\nactivity: none recorded\n");
    fmt::print(
        "\nnetwork (net plugin, since the cache was created; GB/s = bytes / time with a transfer in "
        "flight):\n  rail weights:\n");
    printRails(rails, "    ");
    printNetRecords("NICs", nics, now);
    printNetRecords("peers", peers, now);
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
      const sc::PlanItem& it = plan.items[i];
      if (i == 0 || it.coll != plan.items[i - 1].coll || it.nRanks != plan.items[i - 1].nRanks ||
          it.nNodes != plan.items[i - 1].nNodes) {
        fmt::print("\n{} on {} ranks, {} node{}:\n", core::toString(it.coll), it.nRanks, it.nNodes,
                   it.nNodes == 1 ? "" : "s");
        fmt::print("  {:<20}  {:<22}  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:<9}\n", "sizes", "native decision",
                   "chunk", "native_us", "nccl_us", "best_us", "bound_us", "time");
      }
      fmt::print("  {:<20}  {:<22}  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:<9}\n",
                 sizeRange(it.minBytes, it.maxBytes), decisionText(it),
                 it.chunkBytes == 0 ? std::string("-") : core::formatSize(it.chunkBytes), usText(it.nativeUs),
                 usText(it.ncclUs), usText(it.bestUs), usText(it.boundUs), it.measured ? "measured" : "predicted");
    }
  }
  for (const std::string& p : problems) fmt::print(stderr, "optiflow: {}\n", p);
  return problems.empty() ? kExitOk : kExitFailed;
}

int runCacheVerify(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  const std::string segment = sc::segmentPath(*ns);
  sc::Error error;
  const std::unique_ptr<sc::Reader> reader = sc::Reader::attach(*ns, &error);
  if (!reader) {
    fmt::print("problem: {}\n", error.status == sc::Status::kAbsent ? absentMessage(*ns) : errorText(error, *ns));
    fmt::print("{}: 1 problem\n", segment);
    return kExitFailed;
  }
  int problems = 0;
  fmt::print("{}: header, owner, permissions and layout OK, generation {}\n", segment, reader->generation());

  std::vector<std::string> report;
  const bool slotsOk = reader->check(&report);
  for (const std::string& line : report) fmt::print("  {}\n", line);
  if (!slotsOk) {
    ++problems;
    fmt::print("problem: a plan slot of {} is damaged (see above)\n", segment);
  }

  sc::PlanInfo current;
  const sc::Status currentStatus = reader->current(&current);
  std::size_t files = 0;
  if (currentStatus == sc::Status::kNoPlan) {
    fmt::print("no plan is current: no schedule files to check\n");
  } else if (currentStatus != sc::Status::kOk) {
    ++problems;
    fmt::print("problem: the current plan cannot be read: {}\n", sc::toString(currentStatus));
  } else {
    sc::Plan plan;
    sc::PlanInfo info;
    std::string detail;
    const sc::Status s = reader->loadPlan(current.contentHash, &plan, &info, &detail);
    if (s != sc::Status::kOk) {
      ++problems;
      fmt::print("problem: plan {} (slot {}) cannot be read: {}{}{}\n", sc::formatHash(current.contentHash),
                 current.slot, sc::toString(s), detail.empty() ? "" : ": ", detail);
    }
    const std::string hash = sc::formatHash(current.contentHash);
    std::set<std::string> seen;
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
      const sc::PlanItem& it = plan.items[i];
      const std::string ref = fmt::format("entry {} ({} on {} ranks, {}) of plan {}", i, core::toString(it.coll),
                                          it.nRanks, sizeRange(it.minBytes, it.maxBytes), hash);
      for (const std::string* path : {&it.jsonPath, &it.xmlPath}) {
        if (path->empty() || !seen.insert(*path).second) continue;
        ++files;
        if (std::optional<core::Diagnostic> d = synth::checkScheduleFile(*path, ref, it)) {
          ++problems;
          fmt::print("problem: {}\n", d->str());
          continue;
        }
        // The cache names a schedule by its content: a file edited after publishing is not the proven one.
        if (path == &it.jsonPath && it.scheduleId != 0) {
          const std::optional<std::string> bytes = core::readWholeFile(*path);
          const std::uint64_t id = bytes ? synth::scheduleFileId(*bytes) : 0;
          if (id != it.scheduleId) {
            ++problems;
            fmt::print(
                "problem: {}: {} names this schedule file with id {}, the file now has id {} (changed "
                "since the plan was published)\n",
                *path, ref, sc::formatHash(it.scheduleId), sc::formatHash(id));
          }
        }
      }
    }
    if (s == sc::Status::kOk) {
      fmt::print("plan {} (slot {}, {} entries, from {}): {} schedule files checked\n", hash, current.slot,
                 plan.items.size(), sourceText(current.source), files);
    }
  }
  if (problems == 0) {
    fmt::print("{}: OK\n", segment);
    return kExitOk;
  }
  fmt::print("{}: {} problem{}\n", segment, problems, problems == 1 ? "" : "s");
  return kExitFailed;
}

int runCacheClear(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  const std::string segment = sc::segmentPath(*ns);
  std::error_code ec;
  const bool exists = fs::exists(segment, ec);
  sc::Error error;
  if (args.remove) {
    if (!exists && !fs::exists(sc::lockPath(*ns), ec)) {
      fmt::print("no schedule cache for namespace {} ({}): nothing to remove\n", *ns, segment);
      return kExitOk;
    }
    if (!args.force) {
      // Ranks of a communicator that is initialising right now would split: the first ones use a plan, the rest
      // find no cache. Pins younger than the adopt window say such communicators may exist.
      if (std::unique_ptr<sc::Reader> reader = sc::Reader::attach(*ns, &error)) {
        const std::int64_t now = sc::realtimeNs();
        int young = 0;
        for (const sc::CommPin& pin : reader->pins()) young += pin.commId != 0 && sc::pinIsYoung(pin.stampNs, now);
        if (young > 0) {
          fmt::print(stderr,
                     "optiflow: {} communicator{} initialised with {} in the last {} s; removing it now could give "
                     "their remaining ranks a different choice (docs/consistency.md). Use `cache clear` (new "
                     "communicators get NCCL's choices), or --force\n",
                     young, young == 1 ? "" : "s", segment, sc::kPinAdoptWindowS);
          return kExitFailed;
        }
      }
      error = {};
    }
    if (!sc::Writer::remove(*ns, &error)) {
      fmt::print(stderr, "optiflow: {}\n", errorText(error, *ns));
      return kExitFailed;
    }
    fmt::print("removed {} (processes that attached keep their mapping until they exit)\n", segment);
    return kExitOk;
  }
  // Writer::open would create a segment; clearing one that does not exist has nothing to do.
  if (!exists) {
    fmt::print("no schedule cache for namespace {} ({}): nothing to clear\n", *ns, segment);
    return kExitOk;
  }
  sc::WriterOptions options;
  options.ns = *ns;
  options.build = OPTIFLOW_VERSION;
  std::unique_ptr<sc::Writer> writer = sc::Writer::open(options, &error);
  if (!writer || !writer->clear(&error)) {
    fmt::print(stderr, "optiflow: {}\n", errorText(error, *ns));
    return kExitFailed;
  }
  fmt::print("cleared {}: no plan is current; new communicators get NCCL's own choices\n", segment);
  return kExitOk;
}

int runCacheRails(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  std::error_code ec;
  if (!fs::exists(sc::segmentPath(*ns), ec)) {
    // What the plugin does without a cache is a fine answer, not an error.
    fmt::print(
        "no schedule cache for namespace {} ({}): no rail weights, the net plugin gives every rail of a "
        "connection an equal share (`optiflow cache rails set NAME=WEIGHT ...` creates it)\n",
        *ns, sc::segmentPath(*ns));
    return kExitOk;
  }
  const std::unique_ptr<sc::Reader> reader = attachOrReport(*ns);
  if (!reader) return kExitFailed;
  fmt::print("rail weights in {}:\n", sc::segmentPath(*ns));
  printRails(reader->railWeights(), "  ");
  return kExitOk;
}

int runCacheRailsSet(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  std::vector<std::pair<std::string, std::uint32_t>> weights;
  bool bad = false;
  for (std::size_t i = 0; i < args.railWeights.size(); ++i) {
    auto w = parseRailWeight(args.railWeights[i], i + 1);
    if (!w) {
      bad = true;
      continue;
    }
    for (const auto& earlier : weights) {
      if (earlier.first == w->first) {
        fmt::print(stderr, "optiflow: rail weight \"{}\" (argument {}): interface {} is given twice\n",
                   args.railWeights[i], i + 1, w->first);
        bad = true;
      }
    }
    weights.push_back(std::move(*w));
  }
  if (bad || weights.empty()) {
    if (weights.empty() && !bad) fmt::print(stderr, "optiflow: cache rails set: expected NAME=WEIGHT arguments\n");
    fmt::print(stderr, "optiflow: no rail weight was changed\n");
    return kExitBadInput;
  }
  sc::WriterOptions options;
  options.ns = *ns;
  options.build = OPTIFLOW_VERSION;
  if (!resolveGroup(args, &options)) return kExitBadInput;
  sc::Error error;
  std::unique_ptr<sc::Writer> writer = sc::Writer::open(options, &error);
  if (!writer || !writer->setRailWeights(weights, &error)) {
    fmt::print(stderr, "optiflow: {}\n", errorText(error, *ns));
    fmt::print(stderr, "optiflow: no rail weight was changed\n");
    return error.status == sc::Status::kBadNamespace || error.status == sc::Status::kInvalidPlan ? kExitBadInput
                                                                                                 : kExitFailed;
  }
  fmt::print("set rail weights in {} (senders use them from their next message):\n", sc::segmentPath(*ns));
  if (const std::unique_ptr<sc::Reader> reader = attachOrReport(*ns)) printRails(reader->railWeights(), "  ");
  return kExitOk;
}

// `measurements --json` prints one object:
//   {namespace, segment, counters: {untimed, pool_full, table_full, foreign, choice_full},
//    rows: [{communicator (16 hex digits), collective, size_bytes, algorithm, protocol (NCCL's names; null when NCCL
//            named one this build does not know), channels, calls, min_us, mean_us, median_us, p90_us,
//            last_seen_ns (GPU globaltimer of the last call's stop), nccl_choice (the row's configuration is NCCL's
//            own choice for that communicator, collective and size, as the tuner last read it from NCCL's cost
//            table; channels aside: the cost table does not choose them)}]}
// Rows are sorted by communicator, collective, size, then configuration.
int runCacheMeasurements(const CacheArgs& args) {
  const std::optional<std::string> ns = resolveNamespace(args);
  if (!ns) return kExitBadInput;
  std::error_code ec;
  if (!fs::exists(sc::segmentPath(*ns), ec)) {
    fmt::print(stderr, "optiflow: {}\n", absentMessage(*ns));
    return kExitFailed;
  }
  const std::unique_ptr<sc::Reader> reader = attachOrReport(*ns);
  if (!reader) return kExitFailed;
  std::vector<sc::Measurement> rows = reader->measurements();
  const sc::MeasureCounters counters = reader->measureCounters();
  // NCCL's own (algorithm, protocol) per (communicator, collective, size): at most one record each.
  std::map<std::tuple<std::uint64_t, int, std::uint64_t>, sc::NcclChoice> choices;
  for (const sc::NcclChoice& c : reader->ncclChoices()) {
    choices[std::make_tuple(c.commId, static_cast<int>(c.coll), c.sizeBytes)] = c;
  }
  auto isNcclChoice = [&](const sc::Measurement& m) {
    const auto it = choices.find(std::make_tuple(m.commId, static_cast<int>(m.coll), m.sizeBytes));
    return it != choices.end() && m.algorithm && m.protocol && it->second.algorithm == m.algorithm &&
           it->second.protocol == m.protocol;
  };
  auto order = [](const sc::Measurement& m) {
    return std::make_tuple(m.commId, static_cast<int>(m.coll), m.sizeBytes,
                           m.algorithm ? static_cast<int>(*m.algorithm) : -1,
                           m.protocol ? static_cast<int>(*m.protocol) : -1, m.channels);
  };
  std::sort(rows.begin(), rows.end(),
            [&](const sc::Measurement& a, const sc::Measurement& b) { return order(a) < order(b); });
  auto algoText = [](const sc::Measurement& m) {
    return m.algorithm ? std::string(core::toString(*m.algorithm)) : std::string("?");
  };
  auto protoText = [](const sc::Measurement& m) {
    return m.protocol ? std::string(core::toString(*m.protocol)) : std::string("?");
  };
  auto rounded = [](double us) { return std::round(us * 1000.0) / 1000.0; };
  if (args.json) {
    json j;
    j["namespace"] = *ns;
    j["segment"] = sc::segmentPath(*ns);
    j["counters"] = {{"untimed", counters.untimed},
                     {"pool_full", counters.poolFull},
                     {"table_full", counters.tableFull},
                     {"foreign", counters.foreign},
                     {"choice_full", counters.choiceFull}};
    j["rows"] = json::array();
    for (const sc::Measurement& m : rows) {
      j["rows"].push_back({{"communicator", sc::formatHash(m.commId)},
                           {"collective", std::string(core::toString(m.coll))},
                           {"size_bytes", m.sizeBytes},
                           {"algorithm", m.algorithm ? json(algoText(m)) : json(nullptr)},
                           {"protocol", m.protocol ? json(protoText(m)) : json(nullptr)},
                           {"channels", m.channels},
                           {"calls", m.calls},
                           {"min_us", rounded(m.minUs)},
                           {"mean_us", rounded(m.meanUs)},
                           {"median_us", rounded(m.medianUs)},
                           {"p90_us", rounded(m.p90Us)},
                           {"last_seen_ns", m.lastNs},
                           {"nccl_choice", isNcclChoice(m)}});
    }
    fmt::print("{}\n", j.dump(2));
    return kExitOk;
  }
  fmt::print("measurements in {} ({} rows; GPU time per call, from the profiler plugin):\n", sc::segmentPath(*ns),
             rows.size());
  if (rows.empty()) {
    fmt::print("  none yet: run a job with NCCL_PROFILER_PLUGIN=optiflow (docs/profiler.md)\n");
  } else {
    fmt::print("  {:<16}  {:<13}  {:>10}  {:<13}  {:<6}  {:>3}  {:>8}  {:>10}  {:>10}  {:>10}  {}\n", "communicator",
               "collective", "size", "algorithm", "proto", "ch", "calls", "min_us", "median_us", "p90_us", "nccl");
    for (const sc::Measurement& m : rows) {
      fmt::print("  {:<16}  {:<13}  {:>10}  {:<13}  {:<6}  {:>3}  {:>8}  {:>10.2f}  {:>10.2f}  {:>10.2f}{}\n",
                 sc::formatHash(m.commId), core::toString(m.coll), core::formatSize(m.sizeBytes), algoText(m),
                 protoText(m), m.channels, m.calls, m.minUs, m.medianUs, m.p90Us, isNcclChoice(m) ? "  *" : "");
    }
    fmt::print("  nccl *: NCCL's own choice of algorithm and protocol for that size, as the tuner plugin read it\n");
  }
  if (counters.choiceFull != 0) {
    fmt::print("  NCCL's own choice not recorded for {} tuner calls: the table of choices was full\n",
               counters.choiceFull);
  }
  if (counters.untimed + counters.poolFull + counters.tableFull + counters.foreign != 0) {
    fmt::print(
        "  not recorded: {} collectives without GPU stamps, {} events over a full pool, {} with the table full, "
        "{} foreign events\n",
        counters.untimed, counters.poolFull, counters.tableFull, counters.foreign);
  }
  return kExitOk;
}

}  // namespace optiflow::cli
