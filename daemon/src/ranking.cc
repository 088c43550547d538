#include "optiflow/daemon/ranking.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "optiflow/core/units.h"

namespace optiflow::daemon {
namespace {

// An NCCL-native configuration as the profiler reports it.
struct Config {
  core::Algorithm algorithm = core::Algorithm::Ring;
  core::Protocol protocol = core::Protocol::Simple;
  std::uint32_t channels = 0;
  auto operator<=>(const Config&) const = default;
};

// Calls-weighted mean of the medians of the rows of one configuration (communicators, processes).
struct Timed {
  double weightedUs = 0;
  double calls = 0;
  void add(const schedcache::Measurement& m) {
    weightedUs += m.medianUs * static_cast<double>(m.calls);
    calls += static_cast<double>(m.calls);
  }
  double us() const { return calls > 0 ? weightedUs / calls : 0; }
};

std::string configText(core::Algorithm a, core::Protocol p, std::uint32_t channels) {
  std::string s = fmt::format("{}/{}", core::toString(a), core::toString(p));
  if (channels > 0) s += fmt::format("/{}ch", channels);
  return s;
}
std::string configText(const Config& c) { return configText(c.algorithm, c.protocol, c.channels); }

// The synthesized decision of an entry, as the cache would apply it (cache_plan.cc: a time of 0 or a name the cache
// does not know is no decision).
struct Decision {
  core::Algorithm algorithm;
  core::Protocol protocol;
  std::uint32_t channels;  // 0: NCCL decides
};
std::optional<Decision> decisionOf(const synth::PlanEntry& e) {
  if (!e.native || e.native->timeUs <= 0) return std::nullopt;
  const auto a = core::parseAlgorithm(e.native->algorithm);
  const auto p = core::parseProtocol(e.native->protocol);
  if (!a || !p) return std::nullopt;
  return Decision{*a, *p, static_cast<std::uint32_t>(std::max(0, e.native->channels))};
}

synth::PlanTrial trialOf(const synth::NativeChoice& n) {
  synth::PlanTrial t;
  t.algorithm = n.algorithm;
  t.protocol = n.protocol;
  t.channels = n.channels;
  t.chunkBytes = n.chunkBytes;
  return t;
}

// Distance of a measured size from the entry's, in octaves.
double octaves(std::uint64_t a, std::uint64_t b) {
  return std::abs(std::log2(static_cast<double>(std::max<std::uint64_t>(a, 1))) -
                  std::log2(static_cast<double>(std::max<std::uint64_t>(b, 1))));
}

class EntryRanker {
 public:
  EntryRanker(const synth::PlanCollective& c, synth::PlanEntry& e, const RankOptions& o) : coll_(c), e_(e), opt_(o) {}

  RankedEntry rank(const std::vector<const MeasuredRow*>& inRange, const std::vector<schedcache::NcclChoice>& choices) {
    RankedEntry r;
    r.coll = coll_.collective;
    r.ranks = coll_.ranks;
    r.nodes = coll_.nodes;
    r.sizeBytes = e_.sizeBytes;
    const std::optional<Decision> decision = decisionOf(e_);
    r.before = decision ? configText(decision->algorithm, decision->protocol, decision->channels) : "NCCL's own";
    r.predictedUs = decision ? e_.native->timeUs : (e_.nccl ? e_.nccl->timeUs : 0);
    r.after = r.before;
    if (inRange.empty()) {
      addTrials(r, decision);
      return r;
    }
    r.measuredBytes = measuredSize(inRange);

    // NCCL's own choice per communicator at this size, as its tuner recorded it from NCCL's cost table.
    std::map<std::uint64_t, std::pair<core::Algorithm, core::Protocol>> ownOf;
    for (const schedcache::NcclChoice& c : choices) {
      if (c.coll == coll_.collective && c.sizeBytes == r.measuredBytes && c.algorithm && c.protocol) {
        ownOf[c.commId] = {*c.algorithm, *c.protocol};
      }
    }
    std::vector<const MeasuredRow*> atSize;
    for (const MeasuredRow* row : inRange) {
      if (row->m.sizeBytes == r.measuredBytes) atSize.push_back(row);
    }
    auto ownConfig = [&](const MeasuredRow& row) {
      const auto it = ownOf.find(row.m.commId);
      return it != ownOf.end() && it->second == std::pair(*row.m.algorithm, *row.m.protocol);
    };
    // A row of NCCL's own (algorithm, protocol) at a channel count the communicator's plan set is that plan's choice,
    // unless NCCL's own never showed at another count: then NCCL's count is the one the plan set, the same
    // configuration.
    const bool ownUnforced = std::any_of(atSize.begin(), atSize.end(),
                                         [&](const MeasuredRow* row) { return ownConfig(*row) && !row->forced; });
    auto isOwn = [&](const MeasuredRow& row) { return ownConfig(row) && (!row.forced || !ownUnforced); };
    auto isDecision = [&](const MeasuredRow& row) {
      if (!decision || *row.m.algorithm != decision->algorithm || *row.m.protocol != decision->protocol) return false;
      return decision->channels == 0 ? !row.forced : row.m.channels == decision->channels;
    };

    Timed ownTimed;
    Timed decisionTimed;
    std::map<std::uint32_t, double> ownChannelCalls;
    std::map<std::pair<core::Algorithm, core::Protocol>, double> ownVotes;
    std::map<Config, Timed> others;  // every other measured configuration
    for (const MeasuredRow* row : atSize) {
      const schedcache::Measurement& m = row->m;
      if (isOwn(*row)) {
        ownTimed.add(m);
        ownChannelCalls[m.channels] += static_cast<double>(m.calls);
        ownVotes[{*m.algorithm, *m.protocol}] += static_cast<double>(m.calls);
      } else if (isDecision(*row)) {
        decisionTimed.add(m);
      } else {
        others[Config{*m.algorithm, *m.protocol, m.channels}].add(m);
      }
    }
    const auto measured = [&](const Timed& t) { return t.calls >= static_cast<double>(opt_.minCalls); };
    if (measured(decisionTimed)) r.beforeUs = decisionTimed.us();

    if (!measured(ownTimed)) {
      // Nothing to compare with yet: the decision stands, measured where it is, and the trials go on.
      if (decision && r.beforeUs) {
        e_.native->simulatedUs = e_.native->timeUs;
        e_.native->timeUs = *r.beforeUs;
        e_.native->measured = true;
        r.afterUs = r.beforeUs;
      }
      addTrials(r, decision);
      return r;
    }

    auto mostCalls = [](const auto& a, const auto& b) { return a.second < b.second; };
    const std::uint32_t ownChannels =
        std::max_element(ownChannelCalls.begin(), ownChannelCalls.end(), mostCalls)->first;
    const std::pair<core::Algorithm, core::Protocol> ownPair =
        std::max_element(ownVotes.begin(), ownVotes.end(), mostCalls)->first;
    const auto* own = &ownPair;
    if (decision && !measured(decisionTimed) && decision->algorithm == own->first &&
        decision->protocol == own->second && (decision->channels == 0 || decision->channels == ownChannels)) {
      decisionTimed = ownTimed;  // the decision is NCCL's own configuration: its rows were counted as NCCL's
      r.beforeUs = ownTimed.us();
    }
    const double ownUs = ownTimed.us();
    r.ncclConfig = configText(own->first, own->second, ownChannels);
    r.ncclUs = ownUs;
    synth::NativeChoice ncclChoice;
    ncclChoice.algorithm = std::string(core::toString(own->first));
    ncclChoice.protocol = std::string(core::toString(own->second));
    ncclChoice.channels = static_cast<int>(ownChannels);
    ncclChoice.timeUs = ownUs;
    ncclChoice.measured = true;
    ncclChoice.simulatedUs = e_.nccl ? e_.nccl->timeUs : 0;

    // The fastest measured configuration faster than NCCL's own (a tie keeps NCCL's own; the sketch's medians are
    // bucket midpoints, so a tie is a difference under about 6 %). The decision counts as one configuration, all
    // its rows together.
    std::optional<Config> winner;
    double winnerUs = ownUs;
    bool winnerIsDecision = false;
    auto consider = [&](const Config& cfg, const Timed& t, bool isDecisionConfig) {
      if (!measured(t)) return;
      if (t.us() > ownUs) {
        r.refused.push_back(fmt::format("{} {:.1f} us", configText(cfg), t.us()));
      } else if (t.us() < winnerUs) {
        winner = cfg;
        winnerUs = t.us();
        winnerIsDecision = isDecisionConfig;
      }
    };
    if (decision) consider(Config{decision->algorithm, decision->protocol, decision->channels}, decisionTimed, true);
    for (const auto& [cfg, t] : others) consider(cfg, t, false);
    e_.nccl = ncclChoice;
    if (!winner && decision && !r.beforeUs) {
      // Predicted better, never measured, and nothing measured beats NCCL's own: it gets its trials.
      addTrials(r, decision);
      return r;
    }
    e_.trials.clear();
    e_.trialCalls = 0;
    if (!winner) {
      e_.native.reset();  // NCCL decides: nothing measured beats its own choice
      r.after = "NCCL's own";
      r.afterUs = ownUs;
      return r;
    }
    synth::NativeChoice chosen;
    chosen.algorithm = std::string(core::toString(winner->algorithm));
    chosen.protocol = std::string(core::toString(winner->protocol));
    chosen.channels = static_cast<int>(winner->channels);
    chosen.timeUs = winnerUs;
    chosen.measured = true;
    if (winnerIsDecision) {  // the decision as it was: channels 0 still lets NCCL decide
      chosen.chunkBytes = e_.native->chunkBytes;
      chosen.simulatedUs = e_.native->timeUs;
    }
    e_.native = chosen;
    r.after = configText(winner->algorithm, winner->protocol, static_cast<std::uint32_t>(chosen.channels));
    r.afterUs = winnerUs;
    return r;
  }

 private:
  // The measured size in range closest to the entry's (in octaves); on a tie the one with more calls.
  std::uint64_t measuredSize(const std::vector<const MeasuredRow*>& inRange) const {
    std::map<std::uint64_t, std::uint64_t> calls;
    for (const MeasuredRow* row : inRange) calls[row->m.sizeBytes] += row->m.calls;
    std::uint64_t best = 0;
    for (const auto& [size, n] : calls) {
      if (best == 0 || octaves(size, e_.sizeBytes) < octaves(best, e_.sizeBytes) ||
          (octaves(size, e_.sizeBytes) == octaves(best, e_.sizeBytes) && n > calls[best])) {
        best = size;
      }
    }
    return best;
  }

  // NCCL's own choice and the decision take turns until both are measured.
  void addTrials(RankedEntry& r, const std::optional<Decision>& decision) {
    e_.trials.clear();
    e_.trialCalls = 0;
    if (!decision || opt_.trialCalls <= 0) return;
    e_.trials = {synth::PlanTrial{}, trialOf(*e_.native)};
    e_.trialCalls = opt_.trialCalls;
    r.trials = true;
  }

  const synth::PlanCollective& coll_;
  synth::PlanEntry& e_;
  const RankOptions& opt_;
};

std::string usText(const std::optional<double>& us) { return us ? fmt::format("{:.1f}", *us) : std::string("-"); }

}  // namespace

std::vector<RankedEntry> rankByMeasurements(synth::PlanFile& plan, const std::vector<MeasuredRow>& rows,
                                            const std::vector<schedcache::NcclChoice>& choices,
                                            const RankOptions& options) {
  std::vector<RankedEntry> out;
  for (synth::PlanCollective& c : plan.collectives) {
    for (synth::PlanEntry& e : c.entries) {
      std::vector<const MeasuredRow*> inRange;
      for (const MeasuredRow& row : rows) {
        const schedcache::Measurement& m = row.m;
        if (m.coll != c.collective || row.nRanks != static_cast<std::uint32_t>(c.ranks) ||
            row.nNodes != static_cast<std::uint32_t>(c.nodes) || !m.algorithm || !m.protocol || m.calls == 0 ||
            m.sizeBytes < e.minBytes || m.sizeBytes > e.maxBytes) {
          continue;
        }
        inRange.push_back(&row);
      }
      out.push_back(EntryRanker(c, e, options).rank(inRange, choices));
    }
  }
  return out;
}

std::string formatRanking(const std::vector<RankedEntry>& entries) {
  std::string out;
  for (const RankedEntry& r : entries) {
    if (r.measuredBytes == 0) continue;
    if (out.empty()) {
      out = fmt::format("{:<14} {:>5} {:>6} {:>9}  {:<16} {:>9} {:>9}  {:<18} {:>9}  {:<16} {:>9} {:<9}  {}\n",
                        "collective", "ranks", "size", "measured", "synthesized", "pred_us", "meas_us", "nccl_own",
                        "meas_us", "published", "time_us", "source", "refused (slower than NCCL's own)");
    }
    std::string refused;
    for (const std::string& s : r.refused) refused += (refused.empty() ? "" : ", ") + s;
    out +=
        fmt::format("{:<14} {:>5} {:>6} {:>9}  {:<16} {:>9.1f} {:>9}  {:<18} {:>9}  {:<16} {:>9.1f} {:<9}  {}\n",
                    core::toString(r.coll), r.ranks, core::formatSize(r.sizeBytes), core::formatSize(r.measuredBytes),
                    r.before, r.predictedUs, usText(r.beforeUs), r.ncclConfig.empty() ? std::string("-") : r.ncclConfig,
                    usText(r.ncclUs), r.after, r.afterUs.value_or(r.predictedUs), r.afterUs ? "measured" : "predicted",
                    refused.empty() ? std::string("-") : refused);
  }
  return out;
}

}  // namespace optiflow::daemon
