#include "flow_model.h"

#include <algorithm>
#include <functional>
#include <span>

namespace optiflow::sim::detail {

namespace {

// Components with at most this many binding links pick the next link to freeze by a scan (a round costs one pass
// over a few dense arrays), larger ones with a lazy heap (a round costs the links that changed).
constexpr std::size_t kScanLinks = 64;

}  // namespace

void FlowModel::init(const Network& net, const SimParams& p, const std::vector<int>& paths,
                     const std::vector<double>* share) {
  paths_ = &paths;
  const auto& links = net.links();
  const std::size_t nl = links.size();
  cap_.resize(nl);
  fullCap_.resize(nl);
  for (std::size_t l = 0; l < nl; ++l) {
    fullCap_[l] = links[l].bandwidthGBps * 1e3 * p.linkEfficiency[static_cast<int>(hopClassOf(links[l].kind))];
    cap_[l] = share ? fullCap_[l] * (*share)[l] : fullCap_[l];
  }
  sumMax_.assign(nl, 0);
  linkCount_.assign(nl, 0);
  linkBundles_.assign(nl, {});
  bundles_.clear();
  freeBundles_.clear();
  pathCanon_.assign(paths.size(), -1);
  canonOf_.clear();
  canonBundles_.clear();
  busySince_.assign(nl, 0);
  busyUs_.assign(nl, 0);
  linkBytes_.assign(nl, 0);
  linkStamp_.assign(nl, 0);
  linkLocal_.assign(nl, 0);
}

void FlowModel::linkAdd(int l, int flow, double now) {
  if (linkCount_[l]++ == 0) busySince_[l] = now;
  sumMax_[l] += flows_[flow].maxRate;
}

void FlowModel::linkRemove(int l, int flow, double now) {
  if (--linkCount_[l] == 0) {
    busyUs_[l] += now - busySince_[l];
    sumMax_[l] = 0;  // no drift
  } else {
    sumMax_[l] -= flows_[flow].maxRate;
  }
}

int FlowModel::canonPath(int pathStart, int pathLen) {
  int& c = pathCanon_[static_cast<std::size_t>(pathStart)];
  if (c < 0) {
    const auto links = std::span<const int>(*paths_).subspan(pathStart, pathLen);
    auto [it, added] =
        canonOf_.try_emplace(std::vector<int>(links.begin(), links.end()), static_cast<int>(canonBundles_.size()));
    if (added) canonBundles_.emplace_back();
    c = it->second;
  }
  return c;
}

// Puts flow f (path and maxRate set) into the bundle of its path and maximum rate, a new one if none is live.
int FlowModel::joinBundle(int f) {
  Flow& fl = flows_[f];
  const int canon = canonPath(fl.pathStart, fl.pathLen);
  int b = -1;
  for (int c : canonBundles_[static_cast<std::size_t>(canon)]) {
    if (bundles_[c].maxRate == fl.maxRate) b = c;
  }
  if (b < 0) {
    if (!freeBundles_.empty()) {
      b = freeBundles_.back();
      freeBundles_.pop_back();
    } else {
      b = static_cast<int>(bundles_.size());
      bundles_.emplace_back();
    }
    Bundle& nb = bundles_[b];
    nb.pathStart = fl.pathStart;
    nb.pathLen = fl.pathLen;
    nb.maxRate = fl.maxRate;
    nb.canon = canon;
    canonBundles_[static_cast<std::size_t>(canon)].push_back(b);
    for (int l : bundlePath(b)) linkBundles_[l].push_back(b);
  }
  fl.bundle = b;
  fl.slot = static_cast<int>(bundles_[b].members.size());
  bundles_[b].members.push_back(f);
  return b;
}

void FlowModel::leaveBundle(int f) {
  Flow& fl = flows_[f];
  Bundle& b = bundles_[fl.bundle];
  const int last = b.members.back();
  b.members[fl.slot] = last;
  flows_[last].slot = fl.slot;
  b.members.pop_back();
  if (b.members.empty()) {
    auto drop = [&](std::vector<int>& v) {
      auto it = std::find(v.begin(), v.end(), fl.bundle);
      *it = v.back();
      v.pop_back();
    };
    drop(canonBundles_[static_cast<std::size_t>(b.canon)]);
    for (int l : bundlePath(fl.bundle)) drop(linkBundles_[l]);
    freeBundles_.push_back(fl.bundle);
  }
  fl.bundle = -1;
}

bool FlowModel::bundleBinds(int b) const {
  for (int l : bundlePath(b)) {
    if (binding(l)) return true;
  }
  return false;
}

// Every member of bundle b joins the component (and b the bundles to search from).
void FlowModel::addBundle(int b) {
  bundleStamp_[b] = stamp_;
  compBundles_.push_back(b);
  for (int f : bundles_[b].members) {
    if (flowStamp_[f] != stamp_) {
      flowStamp_[f] = stamp_;
      compFlows_.push_back(f);
    }
  }
}

// Max-min fair rates for the flows connected to `seeds` through binding links (progressive filling). Links that cannot
// saturate even if every flow on them ran at its own maximum never constrain anything and are skipped, which keeps
// components small on fat fabrics.
void FlowModel::recompute(double now) {
  ++stamp_;
  if (flowStamp_.size() < flows_.size()) flowStamp_.resize(flows_.size(), 0);
  if (bundleStamp_.size() < bundles_.size()) bundleStamp_.resize(bundles_.size(), 0);
  compFlows_.clear();
  compLinks_.clear();
  compBundles_.clear();
  looseMax_ = kInf;
  looseMaxHi_ = 0;
  // The component a search by flow finds: the seeds, then every flow on a binding link of a flow in it. A flow on
  // a binding link brings its whole bundle (they share the link); a seed on no binding link comes alone, as the
  // flows of a bundle on a link a flow left (they were on that link, which could bind then).
  for (int f : seeds_) {
    // A seed may have finished since (its id free, or reused by a flow started later in the instant: then it is a
    // seed in its own right).
    if (flowStamp_[f] == stamp_ || flows_[f].inst < 0 || flows_[f].wire <= 0) continue;
    const int b = flows_[f].bundle;
    if (bundleStamp_[b] != stamp_ && bundleBinds(b)) {
      addBundle(b);
    } else if (bundleStamp_[b] != stamp_) {
      flowStamp_[f] = stamp_;
      compFlows_.push_back(f);
      looseMax_ = std::min(looseMax_, flows_[f].maxRate);
      looseMaxHi_ = std::max(looseMaxHi_, flows_[f].maxRate);
    }
  }
  for (int b : seedBundles_) {
    // A bundle id may have been freed since, or reused by flows started in the instant (seeds themselves).
    if (bundleStamp_[b] != stamp_ && !bundles_[b].members.empty()) addBundle(b);
  }
  for (std::size_t i = 0; i < compBundles_.size(); ++i) {
    for (int l : bundlePath(compBundles_[i])) {
      if (linkStamp_[l] == stamp_ || !binding(l)) continue;
      linkStamp_[l] = stamp_;
      compLinks_.push_back(l);
      for (int b : linkBundles_[l]) {
        if (bundleStamp_[b] != stamp_) addBundle(b);
      }
    }
  }
  if (frozen_.size() < flows_.size()) {
    frozen_.resize(flows_.size(), 0);
    newRate_.resize(flows_.size(), 0);
  }
  if (compFlows_.empty()) return;
  if (compFlows_.size() == 1) {
    // Alone: its own bottleneck, or a link whose capacity the share scaled below it.
    const int f = compFlows_[0];
    double r = flows_[f].maxRate;
    for (int l : flowPath(f)) r = std::min(r, cap_[l]);
    newRate_[f] = r;
    applyRates(now);
    return;
  }
  // Progressive filling. Flows in (maxRate, id) order: the cap freezes take them in that order, and applyRates
  // schedules their drain events in it. Usually every flow of a component has the same maxRate (same link
  // capacities), and then the order is the ids': a large component is then listed from the stamps directly.
  // (A bundle's members share its maxRate; the flows that came alone are summed up by their least and greatest.)
  const double firstMax = flows_[compFlows_[0]].maxRate;
  bool uniform = looseMax_ == kInf || (looseMax_ == firstMax && looseMaxHi_ == firstMax);
  for (int b : compBundles_) uniform = uniform && bundles_[b].maxRate == firstMax;
  if (uniform && compFlows_.size() * 32 >= flows_.size()) {
    const std::size_t n = compFlows_.size();
    compFlows_.clear();
    for (std::size_t f = 0; f < flows_.size() && compFlows_.size() < n; ++f) {
      if (flowStamp_[f] == stamp_) compFlows_.push_back(static_cast<int>(f));
    }
  } else if (uniform) {
    std::sort(compFlows_.begin(), compFlows_.end());
  } else {
    sortBuf_.clear();
    for (int f : compFlows_) sortBuf_.emplace_back(flows_[f].maxRate, f);
    std::sort(sortBuf_.begin(), sortBuf_.end());
    for (std::size_t i = 0; i < sortBuf_.size(); ++i) compFlows_[i] = sortBuf_[i].second;
  }
  // The next link to freeze is the least (share, link id) among links with unfrozen flows. Components usually
  // have a few links (one node's NVSwitch ports): a scan of dense per-component arrays in link id order is cheaper
  // than a heap there (a link without unfrozen flows has share +inf, which never wins over a flow's finite cap).
  const std::size_t nLinks = compLinks_.size();
  const bool scan = nLinks <= kScanLinks;
  if (nLinks * 16 >= linkStamp_.size()) {
    compLinks_.clear();
    for (std::size_t l = 0; l < linkStamp_.size() && compLinks_.size() < nLinks; ++l) {
      if (linkStamp_[l] == stamp_) compLinks_.push_back(static_cast<int>(l));
    }
  } else {
    std::sort(compLinks_.begin(), compLinks_.end());
  }
  remL_.resize(nLinks);
  cntL_.resize(nLinks);
  shareL_.resize(nLinks);
  for (std::size_t j = 0; j < nLinks; ++j) {
    const int l = compLinks_[j];
    linkLocal_[l] = static_cast<int>(j);
    remL_[j] = cap_[l];
    cntL_[j] = linkCount_[l];
    shareL_[j] = remL_[j] / cntL_[j];
  }
  if (!scan) {
    heap_.resize(nLinks);
    heapPos_.resize(nLinks);
    for (std::size_t j = 0; j < nLinks; ++j) heap_[j] = static_cast<int>(j);
    std::make_heap(heap_.begin(), heap_.end(), [&](int a, int b) { return linkBefore(b, a); });
    for (std::size_t i = 0; i < nLinks; ++i) heapPos_[heap_[i]] = static_cast<int>(i);
  }
  for (int f : compFlows_) frozen_[f] = 0;
  for (int b : compBundles_) bundles_[b].unfrozen = static_cast<int>(bundles_[b].members.size());
  std::size_t capIdx = 0;
  std::size_t left = compFlows_.size();
  while (left > 0) {
    while (capIdx < compFlows_.size() && frozen_[compFlows_[capIdx]]) ++capIdx;
    double linkShare = kInf;
    int link = -1;  // local index
    if (scan) {
      // The least share, then its first (lowest id) link; shares are never -0 or NaN, so == finds it.
      for (std::size_t j = 0; j < nLinks; ++j) linkShare = shareL_[j] < linkShare ? shareL_[j] : linkShare;
      if (linkShare < kInf) {
        link = 0;
        while (shareL_[link] != linkShare) ++link;
      }
    } else {
      // Indexed heap of the component's links by (share, link), each link moved to its place as its share changes
      // (a link without unfrozen flows sinks at +inf): the least is on top.
      if (shareL_[heap_[0]] < kInf) {
        link = heap_[0];
        linkShare = shareL_[link];
      }
    }
    const double capShare = capIdx < compFlows_.size() ? flows_[compFlows_[capIdx]].maxRate : kInf;
    if (capShare <= linkShare) {
      freeze(compFlows_[capIdx], capShare, scan);
      --left;
    } else if (link >= 0) {
      for (int b : linkBundles_[compLinks_[link]]) {
        left -= static_cast<std::size_t>(bundles_[b].unfrozen);
        freezeBundle(b, linkShare, scan);
      }
    } else {
      break;  // cannot happen: every flow has a finite maxRate
    }
  }
  applyRates(now);
}

void FlowModel::heapFix(int j) {
  auto place = [&](std::size_t i, int v) {
    heap_[i] = v;
    heapPos_[v] = static_cast<int>(i);
  };
  std::size_t i = static_cast<std::size_t>(heapPos_[j]);
  while (i > 0 && linkBefore(j, heap_[(i - 1) / 2])) {
    place(i, heap_[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  for (;;) {
    std::size_t c = 2 * i + 1;
    if (c >= heap_.size()) break;
    if (c + 1 < heap_.size() && linkBefore(heap_[c + 1], heap_[c])) ++c;
    if (!linkBefore(heap_[c], j)) break;
    place(i, heap_[c]);
    i = c;
  }
  place(i, j);
}

void FlowModel::linkUpdated(int j, bool scan) {
  shareL_[j] = cntL_[j] > 0 ? std::max(0.0, remL_[j]) / cntL_[j] : kInf;
  if (!scan) heapFix(j);
}

// One flow frozen at `rate` (its own maximum).
void FlowModel::freeze(int f, double rate, bool scan) {
  frozen_[f] = 1;
  newRate_[f] = rate;
  const int b = flows_[f].bundle;
  if (bundleStamp_[b] != stamp_) return;  // alone on links that cannot bind
  --bundles_[b].unfrozen;
  for (int l : flowPath(f)) {
    if (linkStamp_[l] != stamp_) continue;
    const int j = linkLocal_[l];
    remL_[j] -= rate;
    --cntL_[j];
    linkUpdated(j, scan);
  }
}

// Every unfrozen member of bundle b frozen at `rate` (a link's share). Each link gets the subtraction once per
// member, as a freeze per flow does, so the links' remainders are those bits.
void FlowModel::freezeBundle(int b, double rate, bool scan) {
  Bundle& bd = bundles_[b];
  const int n = bd.unfrozen;
  if (n == 0) return;
  for (int f : bd.members) {
    if (frozen_[f]) continue;
    frozen_[f] = 1;
    newRate_[f] = rate;
  }
  bd.unfrozen = 0;
  for (int l : bundlePath(b)) {
    if (linkStamp_[l] != stamp_) continue;
    const int j = linkLocal_[l];
    for (int k = 0; k < n; ++k) remL_[j] -= rate;
    cntL_[j] -= n;
    linkUpdated(j, scan);
  }
}

void FlowModel::applyRates(double now) {
  for (int f : compFlows_) {
    Flow& fl = flows_[f];
    const double r = newRate_[f];
    if (!fl.fresh && r == fl.rate) continue;
    settle(fl, now);
    fl.rate = r;
    fl.fresh = false;
    fl.version = (fl.version + 1) & kVersionMask;
    const double dt = fl.remaining <= fl.wire * 1e-12 ? 0.0 : fl.remaining / r;
    drains_.push_back({now + dt, f, fl.version});
  }
}

int FlowModel::start(int inst, int pathStart, int pathLen, double wire, double maxRate, double now) {
  int f;
  if (!freeFlows_.empty()) {
    f = freeFlows_.back();
    freeFlows_.pop_back();
  } else {
    f = static_cast<int>(flows_.size());
    flows_.emplace_back();
  }
  Flow& fl = flows_[f];
  fl.inst = inst;
  fl.pathStart = pathStart;
  fl.pathLen = pathLen;
  fl.wire = wire;
  fl.remaining = fl.wire;
  fl.rate = 0;
  fl.last = now;
  fl.fresh = true;
  fl.maxRate = maxRate;
  if (fl.wire <= 0) {
    // Nothing to move: it drains at once and never occupies a link.
    fl.version = (fl.version + 1) & kVersionMask;
    fl.fresh = false;
    return f;
  }
  for (int l : flowPath(f)) linkAdd(l, f, now);
  joinBundle(f);
  seeds_.push_back(f);
  return f;
}

void FlowModel::flush(double now) {
  drains_.clear();
  recompute(now);
  seeds_.clear();
  seedBundles_.clear();
}

void FlowModel::finish(int f, double now) {
  Flow& fl = flows_[f];
  settle(fl, now);
  if (fl.wire > 0) {
    for (int l : flowPath(f)) {
      linkBytes_[l] += fl.wire;
      // Only a link that could bind (with f still on it) can pass f's freed share to others.
      if (!binding(l)) continue;
      for (int b : linkBundles_[l]) seedBundles_.push_back(b);
    }
    for (int l : flowPath(f)) linkRemove(l, f, now);
    leaveBundle(f);
    fl.version = (fl.version + 1) & kVersionMask;  // keeps reuse of the id safe
    fl.inst = -1;
    freeFlows_.push_back(f);
  } else {
    fl.inst = -1;
    freeFlows_.push_back(f);
  }
}

}  // namespace optiflow::sim::detail
