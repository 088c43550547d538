#include "flow_model.h"

#include <algorithm>
#include <functional>

namespace optiflow::sim::detail {

namespace {

// Components with at most this many binding links pick the next link to freeze by a scan (a round costs one pass
// over a few dense arrays), larger ones with a lazy heap (a round costs the links that changed).
constexpr std::size_t kScanLinks = 512;

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
  linkFlows_.assign(nl, {});
  busySince_.assign(nl, 0);
  busyUs_.assign(nl, 0);
  linkBytes_.assign(nl, 0);
  linkStamp_.assign(nl, 0);
  linkLocal_.assign(nl, 0);
}

void FlowModel::linkAdd(int l, int flow, double now) {
  if (linkFlows_[l].empty()) busySince_[l] = now;
  linkFlows_[l].push_back(flow);
  sumMax_[l] += flows_[flow].maxRate;
}

void FlowModel::linkRemove(int l, int flow, double now) {
  auto& v = linkFlows_[l];
  auto it = std::find(v.begin(), v.end(), flow);
  if (it != v.end()) {
    *it = v.back();
    v.pop_back();
  }
  if (v.empty()) {
    busyUs_[l] += now - busySince_[l];
    sumMax_[l] = 0;  // no drift
  } else {
    sumMax_[l] -= flows_[flow].maxRate;
  }
}

// Max-min fair rates for the flows connected to `seeds` through binding links (progressive filling). Links that cannot
// saturate even if every flow on them ran at its own maximum never constrain anything and are skipped, which keeps
// components small on fat fabrics.
void FlowModel::recompute(double now) {
  ++stamp_;
  if (flowStamp_.size() < flows_.size()) flowStamp_.resize(flows_.size(), 0);
  compFlows_.clear();
  compLinks_.clear();
  for (int f : seeds_) {
    // A seed may have finished since (its id free, or reused by a flow started later in the instant: then it is a
    // seed in its own right).
    if (flowStamp_[f] == stamp_ || flows_[f].inst < 0 || flows_[f].wire <= 0) continue;
    flowStamp_[f] = stamp_;
    compFlows_.push_back(f);
  }
  for (std::size_t i = 0; i < compFlows_.size(); ++i) {
    for (int l : flowPath(compFlows_[i])) {
      if (linkStamp_[l] == stamp_ || !binding(l)) continue;
      linkStamp_[l] = stamp_;
      compLinks_.push_back(l);
      for (int g : linkFlows_[l]) {
        if (flowStamp_[g] != stamp_) {
          flowStamp_[g] = stamp_;
          compFlows_.push_back(g);
        }
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
  const double firstMax = flows_[compFlows_[0]].maxRate;
  bool uniform = true;
  for (int f : compFlows_) uniform = uniform && flows_[f].maxRate == firstMax;
  if (uniform && compFlows_.size() * 8 >= flows_.size()) {
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
  std::sort(compLinks_.begin(), compLinks_.end());
  remL_.resize(nLinks);
  cntL_.resize(nLinks);
  shareL_.resize(nLinks);
  for (std::size_t j = 0; j < nLinks; ++j) {
    const int l = compLinks_[j];
    linkLocal_[l] = static_cast<int>(j);
    remL_[j] = cap_[l];
    cntL_[j] = static_cast<int>(linkFlows_[l].size());
    shareL_[j] = remL_[j] / cntL_[j];
  }
  if (!scan) {
    heap_.clear();
    for (std::size_t j = 0; j < nLinks; ++j) heap_.emplace_back(shareL_[j], static_cast<int>(j));
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
    isDirty_.assign(nLinks, 0);
    dirty_.clear();
  }
  for (int f : compFlows_) frozen_[f] = 0;
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
      // Lazy heap: every link whose share changed in the last round gets one entry with its new share; entries
      // that no longer match their link's share are stale. The least valid entry is the least (share, link).
      for (int j : dirty_) {
        isDirty_[j] = 0;
        if (cntL_[j] > 0) {
          heap_.emplace_back(shareL_[j], j);
          std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
        }
      }
      dirty_.clear();
      while (!heap_.empty()) {
        const auto [sh, j] = heap_.front();
        if (cntL_[j] > 0 && sh == shareL_[j]) {
          linkShare = sh;
          link = j;
          break;
        }
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
        heap_.pop_back();
      }
    }
    const double capShare = capIdx < compFlows_.size() ? flows_[compFlows_[capIdx]].maxRate : kInf;
    if (capShare <= linkShare) {
      freeze(compFlows_[capIdx], capShare, scan);
      --left;
    } else if (link >= 0) {
      for (int f : linkFlows_[compLinks_[link]]) {
        if (frozen_[f]) continue;
        freeze(f, linkShare, scan);
        --left;
      }
    } else {
      break;  // cannot happen: every flow has a finite maxRate
    }
  }
  applyRates(now);
}

void FlowModel::freeze(int f, double rate, bool scan) {
  frozen_[f] = 1;
  newRate_[f] = rate;
  for (int l : flowPath(f)) {
    if (linkStamp_[l] != stamp_) continue;
    const int j = linkLocal_[l];
    remL_[j] -= rate;
    shareL_[j] = --cntL_[j] > 0 ? std::max(0.0, remL_[j]) / cntL_[j] : kInf;
    if (!scan && !isDirty_[j]) {  // one heap entry per changed link and round
      isDirty_[j] = 1;
      dirty_.push_back(j);
    }
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
  seeds_.push_back(f);
  return f;
}

void FlowModel::flush(double now) {
  drains_.clear();
  recompute(now);
  seeds_.clear();
}

void FlowModel::finish(int f, double now) {
  Flow& fl = flows_[f];
  settle(fl, now);
  if (fl.wire > 0) {
    for (int l : flowPath(f)) {
      linkBytes_[l] += fl.wire;
      // Only a link that could bind (with f still on it) can pass f's freed share to others.
      if (!binding(l)) continue;
      for (int g : linkFlows_[l]) {
        if (g != f) seeds_.push_back(g);
      }
    }
    for (int l : flowPath(f)) linkRemove(l, f, now);
    fl.version = (fl.version + 1) & kVersionMask;  // keeps reuse of the id safe
    fl.inst = -1;
    freeFlows_.push_back(f);
  } else {
    fl.inst = -1;
    freeFlows_.push_back(f);
  }
}

}  // namespace optiflow::sim::detail
