// The simulator's flow model (docs/simulator.md, "Bandwidth sharing"): every sending step is a flow over its
// connection's links, and concurrent flows share each link max-min fairly (progressive filling). The model keeps the
// flows, which flows are on which link, the links' effective capacities and the bytes and busy time they saw; it
// recomputes rates only for the flows connected through links that can bind. It knows nothing of steps or events:
// the event loop (simulator.cc) starts and ends flows during one instant, then calls flush() once before time moves
// on, and schedules the drain events listed in drains() in that order (the order is part of the bit-for-bit
// determinism). Rates are computed once per instant, not once per flow start or end: the flows of one step on every
// rank start at the same instant, and which of them started first must not matter (each gets the share it has
// once all have started).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::sim::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
// Flow versions travel in 29 bits of an event; they wrap harmlessly.
inline constexpr std::uint32_t kVersionMask = 0x1fffffffu;

struct Flow {
  int inst = -1;         // the step instance it moves data for; -1 while the id is free
  double wire = 0;       // total wire bytes
  double remaining = 0;  // wire bytes left at `last`
  double rate = 0;       // wire bytes per us
  double last = 0;
  double maxRate = kInf;  // min(cap, every link's effective capacity)
  int pathStart = 0;      // its connection's path in the paths given to init (copied: the hot loops read it often)
  int pathLen = 0;
  int bundle = -1;  // its bundle (FlowModel::Bundle), and its index among the bundle's members
  int slot = 0;
  std::uint32_t version = 0;  // 29 bits travel in events; wraps harmlessly
  bool fresh = false;         // started, no drain event scheduled yet
};

// The active flows on one path (by its links, whatever the connection) with one maximum rate. Max-min fairness gives
// them one rate, so the search for a component and the freezes by a link go by bundle: on a cluster where every rank
// sends to one peer over several channels at once, a bundle holds one flow per channel, and the work per rate
// change shrinks by that factor. The rates are those of a search by flow, bit for bit (FlowModel::recompute).
struct Bundle {
  int pathStart = 0;
  int pathLen = 0;
  double maxRate = 0;
  int canon = -1;            // its path's id (FlowModel::canonPath)
  std::vector<int> members;  // flow ids, in no order; empty while the id is free
  int unfrozen = 0;          // scratch for recompute: members not yet frozen
};

// A flow whose drain time is (re)set: the event loop schedules a drain event for it at `time`.
struct Drain {
  double time;
  int flow;
  std::uint32_t version;
};

class FlowModel {
 public:
  // Link capacities (raw bandwidth x SimParams::linkEfficiency of its class, in bytes per us). `paths` holds the
  // link ids of every connection's path; flows refer into it, so it must outlive the model and not change.
  // `share`, when given, scales each link's capacity for the sharing (a folded simulation: a link all nodes share
  // carries every node's copy of a flow, docs/simulator.md "Symmetric schedules"); fullCapacity() is unscaled.
  void init(const Network& net, const SimParams& p, const std::vector<int>& paths,
            const std::vector<double>* share = nullptr);

  // A new flow for step instance `inst` over paths[pathStart, pathStart + pathLen) with `wire` bytes, at most
  // `maxRate` bytes per us, at time `now`; returns its id. Its rate is set by the next flush(); a flow with no
  // wire bytes never occupies a link and drains at once (drainsNow(f): the event loop schedules it at `now`).
  int start(int inst, int pathStart, int pathLen, double wire, double maxRate, double now);
  bool drainsNow(int f) const { return flows_[f].wire <= 0; }
  std::uint32_t version(int f) const { return flows_[f].version; }
  // Flow `f` has drained at `now`: it leaves its links, which pass its share on at the next flush(); the id
  // becomes free.
  void finish(int f, double now);
  // Whether starts or finishes since the last flush() may have changed rates.
  bool dirty() const { return !seeds_.empty() || !seedBundles_.empty(); }
  // New rates for every flow the instant's starts and finishes can affect; drains() then holds the drain events to
  // schedule, and rate() the new rates.
  void flush(double now);

  // Whether a drain event of version `version` still speaks for flow `f` (it is active and its rate unchanged).
  bool current(int f, std::uint32_t version) const { return flows_[f].inst >= 0 && flows_[f].version == version; }
  int instOf(int f) const { return flows_[f].inst; }
  double rate(int f) const { return flows_[f].rate; }
  const std::vector<Drain>& drains() const { return drains_; }
  // The binding links the last flush() searched (tests: that large components were exercised).
  std::size_t componentLinks() const { return compLinks_.size(); }

  // Per link (Network link id): effective capacity (bytes per us), wire bytes of drained flows, time with >= 1 flow.
  const std::vector<double>& capacity() const { return cap_; }
  const std::vector<double>& fullCapacity() const { return fullCap_; }
  const std::vector<double>& linkBytes() const { return linkBytes_; }
  const std::vector<double>& busyUs() const { return busyUs_; }

 private:
  std::span<const int> flowPath(int f) const {
    return std::span<const int>(*paths_).subspan(flows_[f].pathStart, flows_[f].pathLen);
  }
  std::span<const int> bundlePath(int b) const {
    return std::span<const int>(*paths_).subspan(bundles_[b].pathStart, bundles_[b].pathLen);
  }
  int canonPath(int pathStart, int pathLen);
  int joinBundle(int f);
  void leaveBundle(int f);
  bool bundleBinds(int b) const;
  void addBundle(int b);
  void freezeBundle(int b, double rate, bool scan);
  void linkUpdated(int j, bool scan);
  void settle(Flow& f, double now) {
    f.remaining -= f.rate * (now - f.last);
    f.last = now;
  }
  bool binding(int l) const { return sumMax_[l] > cap_[l] * (1 + 1e-9); }
  void recompute(double now);
  void freeze(int f, double rate, bool scan);
  void applyRates(double now);
  void linkAdd(int l, int flow, double now);
  void linkRemove(int l, int flow, double now);

  const std::vector<int>* paths_ = nullptr;
  std::vector<Flow> flows_;
  std::vector<int> freeFlows_;
  std::vector<Drain> drains_;    // the drain events the last start/finish asks for, in the order to push them
  std::vector<double> cap_;      // effective wire bytes per us, scaled by the share
  std::vector<double> fullCap_;  // effective wire bytes per us
  std::vector<double> sumMax_;
  std::vector<int> linkCount_;                 // flows on each link
  std::vector<std::vector<int>> linkBundles_;  // bundles on each link, in no order
  std::vector<Bundle> bundles_;
  std::vector<int> freeBundles_;
  // Paths by their links: pathCanon_ per path start (-1 until first seen), canonOf_ from the links to the id, and
  // per id the live bundles on it (one per maximum rate, almost always one).
  std::vector<int> pathCanon_;
  std::map<std::vector<int>, int> canonOf_;
  std::vector<std::vector<int>> canonBundles_;
  std::vector<double> busySince_, busyUs_, linkBytes_;
  // scratch for recompute
  std::vector<std::uint32_t> flowStamp_, linkStamp_;
  std::uint32_t stamp_ = 0;
  std::vector<int> compFlows_, compLinks_;
  std::vector<int> seeds_;        // flows the instant started (ids may be stale)
  std::vector<int> seedBundles_;  // bundles on a binding link a flow left (ids may be stale)
  std::vector<std::uint32_t> bundleStamp_;
  std::vector<int> compBundles_;
  double looseMax_ = 0, looseMaxHi_ = 0;  // least and greatest maxRate of the flows that joined alone
  std::vector<char> frozen_;
  std::vector<double> newRate_;
  std::vector<int> linkLocal_;  // per link: its index in compLinks_ (valid while linkStamp_ == stamp_)
  // Per component link (index in compLinks_): capacity left, unfrozen flows, share (max(0, rem) / cnt, +inf when
  // no flow is left).
  std::vector<double> remL_, shareL_;
  std::vector<int> cntL_;
  std::vector<std::pair<double, int>> sortBuf_;
  // Min-heap of the component links by (share, link) for large components, and each link's place in it.
  bool linkBefore(int a, int b) const { return shareL_[a] < shareL_[b] || (shareL_[a] == shareL_[b] && a < b); }
  void heapFix(int j);
  std::vector<int> heap_, heapPos_;
};

}  // namespace optiflow::sim::detail
