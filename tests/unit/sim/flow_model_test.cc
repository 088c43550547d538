// The flow model against max-min fairness computed from scratch. The model recomputes only the flows a change can
// reach, and groups the flows of one path and maximum rate into bundles; neither may change a rate.
#include "flow_model.h"  // sim/src: detail::FlowModel

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/core/topology.h"
#include "optiflow/sim/network.h"

namespace optiflow::sim::detail {
namespace {

struct Conn {
  int pathStart;
  int pathLen;
  double maxRate;
};

struct Active {
  int flow;
  int conn;
};

// Progressive filling over every active flow and every link: the textbook definition, no components, no bundles.
std::vector<double> maxMinRates(const std::vector<Active>& active, const std::vector<Conn>& conns,
                                const std::vector<int>& paths, const std::vector<double>& cap) {
  const std::size_t n = active.size();
  std::vector<double> rate(n, 0);
  std::vector<char> frozen(n, 0);
  std::vector<double> rem = cap;
  std::size_t left = n;
  while (left > 0) {
    std::vector<int> cnt(cap.size(), 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (frozen[i]) continue;
      const Conn& c = conns[static_cast<std::size_t>(active[i].conn)];
      for (int k = 0; k < c.pathLen; ++k)
        ++cnt[static_cast<std::size_t>(paths[static_cast<std::size_t>(c.pathStart + k)])];
    }
    double level = std::numeric_limits<double>::infinity();
    for (std::size_t l = 0; l < cap.size(); ++l) {
      if (cnt[l] > 0) level = std::min(level, std::max(0.0, rem[l]) / cnt[l]);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!frozen[i]) level = std::min(level, conns[static_cast<std::size_t>(active[i].conn)].maxRate);
    }
    // Freeze every flow held at the level: by its own maximum or by a link that the level fills.
    std::vector<char> full(cap.size(), 0);
    for (std::size_t l = 0; l < cap.size(); ++l) {
      full[l] = cnt[l] > 0 && std::max(0.0, rem[l]) / cnt[l] <= level * (1 + 1e-12);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (frozen[i]) continue;
      const Conn& c = conns[static_cast<std::size_t>(active[i].conn)];
      bool hold = c.maxRate <= level * (1 + 1e-12);
      for (int k = 0; k < c.pathLen; ++k)
        hold = hold || full[static_cast<std::size_t>(paths[static_cast<std::size_t>(c.pathStart + k)])];
      if (!hold) continue;
      frozen[i] = 1;
      rate[i] = level;
      --left;
      for (int k = 0; k < c.pathLen; ++k)
        rem[static_cast<std::size_t>(paths[static_cast<std::size_t>(c.pathStart + k)])] -= level;
    }
  }
  return rate;
}

// Random starts and finishes, several flows at a time, on a rail-optimized cluster (NVSwitch, NICs, rail uplinks).
// Connections repeat their pair's path (as channels do), and some pairs carry a protocol cap below the links, so
// that one path holds flows of two maximum rates. After every instant every active flow's rate is the max-min one.
std::size_t runScenario(const char* preset, unsigned seed, int instants, int nPairs, int maxStarts) {
  auto topo = core::presetTopology(preset);
  if (!topo.ok()) {
    ADD_FAILURE() << preset;
    return 0;
  }
  auto built = Network::build(*topo);
  if (!built.ok()) {
    ADD_FAILURE() << preset;
    return 0;
  }
  const Network& net = *built;
  SimParams params;
  std::vector<int> paths;
  std::vector<Conn> conns;
  std::mt19937 rng(seed);
  const int ranks = net.nRanks();
  std::uniform_int_distribution<int> anyRank(0, ranks - 1);
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < nPairs; ++i) {
    const int a = anyRank(rng);
    int b = anyRank(rng);
    if (b == a) b = (a + 1) % ranks;
    pairs.push_back({a, b});
  }
  FlowModel probe;
  probe.init(net, params, paths);  // only for the capacities
  const std::vector<double> full = probe.fullCapacity();
  for (auto [a, b] : pairs) {
    const Path p = net.path(a, b);
    double mx = std::numeric_limits<double>::infinity();
    for (int l : p) mx = std::min(mx, full[static_cast<std::size_t>(l)]);
    for (int ch = 0; ch < 3; ++ch) {
      Conn c{static_cast<int>(paths.size()), static_cast<int>(p.size()), ch == 2 ? mx * 0.3 : mx};
      for (int l : p) paths.push_back(l);
      conns.push_back(c);
    }
  }
  FlowModel fm;
  fm.init(net, params, paths);
  std::vector<Active> active;
  std::uniform_int_distribution<int> anyConn(0, static_cast<int>(conns.size()) - 1);
  double now = 0;
  int inst = 0;
  int checked = 0;
  std::size_t largest = 0;
  for (int t = 0; t < instants; ++t) {
    now += 1.0 + static_cast<double>(rng() % 100) * 0.01;
    const int finishes =
        active.empty() ? 0 : static_cast<int>(rng() % std::min<std::size_t>(active.size(), maxStarts * 3 / 4));
    for (int k = 0; k < finishes; ++k) {
      const std::size_t i = rng() % active.size();
      fm.finish(active[i].flow, now);
      active[i] = active.back();
      active.pop_back();
    }
    const int starts = static_cast<int>(rng() % static_cast<unsigned>(maxStarts));
    for (int k = 0; k < starts; ++k) {
      const int c = anyConn(rng);
      const Conn& cn = conns[static_cast<std::size_t>(c)];
      const int f =
          fm.start(inst++, cn.pathStart, cn.pathLen, 1e6 + static_cast<double>(rng() % 1000) * 1e3, cn.maxRate, now);
      active.push_back({f, c});
    }
    if (fm.dirty()) {
      fm.flush(now);
      largest = std::max(largest, fm.componentLinks());
    }
    const std::vector<double> want = maxMinRates(active, conns, paths, fm.capacity());
    for (std::size_t i = 0; i < active.size(); ++i) {
      if (std::abs(fm.rate(active[i].flow) - want[i]) > want[i] * 1e-9) {
        ADD_FAILURE() << preset << " seed " << seed << " instant " << t << " flow " << active[i].flow << " of "
                      << active.size() << ": rate " << fm.rate(active[i].flow) << ", max-min " << want[i];
        return largest;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, instants);  // flows were active most of the time
  return largest;
}

TEST(FlowModel, RatesAreMaxMinFairAfterEveryInstant) {
  for (unsigned seed = 1; seed <= 6; ++seed) runScenario("dgx-h100x4", seed, 300, 24, 8);
  for (unsigned seed = 1; seed <= 3; ++seed) runScenario("dgx-a100x2", seed, 300, 24, 8);
}

TEST(FlowModel, LargeComponentsAreMaxMinFairToo) {
  // Enough flows at once that components span more links than the scan handles (the lazy heap then picks them).
  std::size_t largest = 0;
  for (unsigned seed = 1; seed <= 3; ++seed)
    largest = std::max(largest, runScenario("dgx-h100x16", seed, 120, 400, 40));
  EXPECT_GT(largest, 64u);
}

}  // namespace
}  // namespace optiflow::sim::detail
