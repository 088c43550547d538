#include "optiflow/calib/fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "optiflow/core/parallel.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::calib {

namespace {

sim::NcclModelOptions modelOptions(int ncclVersion) {
  sim::NcclModelOptions o;
  if (ncclVersion > 0) o.ncclVersion = ncclVersion;
  return o;
}

std::string choiceOf(const sim::NcclPrediction& p) {
  return fmt::format("{}/{}/{}", core::toString(p.algorithm), core::toString(p.protocol), p.channels);
}

// NCCL's choice for every observation with its schedule, and both models' times of it under a calibration.
class Predictor {
 public:
  explicit Predictor(const Observations& obs) : obs_(obs) {
    for (const core::Topology& t : obs.topologies) {
      auto net = sim::Network::build(t);
      nets_.push_back(net ? std::optional<sim::Network>(std::move(*net)) : std::nullopt);
    }
    std::map<std::pair<int, int>, sim::NcclTuning> tunings;  // (topology, NCCL version)
    for (const Observation& o : obs.rows) {
      Item item;
      if (o.topology < 0 || o.topology >= static_cast<int>(obs.topologies.size())) {
        items_.push_back(std::move(item));  // no prediction (ok() is false): the row is left out
        continue;
      }
      const core::Topology& topo = obs.topologies[static_cast<std::size_t>(o.topology)];
      auto t = tunings.find({o.topology, o.ncclVersion});
      if (t == tunings.end()) {
        t = tunings.emplace(std::pair{o.topology, o.ncclVersion}, sim::ncclTune(topo, modelOptions(o.ncclVersion)))
                .first;
      }
      item.prediction = sim::ncclPredict(t->second, o.collective, o.sizeBytes, modelOptions(o.ncclVersion));
      if (item.prediction.ok() && nets_[static_cast<std::size_t>(o.topology)]) {
        auto s = sim::ncclScheduleFor(topo, o.collective, item.prediction);
        if (s) item.schedule.emplace(std::move(*s));
      }
      items_.push_back(std::move(item));
    }
  }

  std::size_t size() const { return items_.size(); }
  const sim::NcclPrediction& prediction(std::size_t i) const { return items_[i].prediction; }
  bool simulatable(std::size_t i) const { return items_[i].schedule.has_value(); }

  // Both exclude the launch overhead, which is additive in both models (rest + launchUs(c, mode)).
  double modelRest(std::size_t i, sim::ModelCalibration c) const {
    c.launchGraphUs = 0;
    c.launchHostUs = 0;
    return sim::calibratedNcclTimeUs(items_[i].prediction, c, obs_.rows[i].launch);
  }
  double simulatorRest(std::size_t i, const sim::ModelCalibration& c) const {
    if (!items_[i].schedule) return -1;
    const Observation& o = obs_.rows[i];
    sim::SimParams params = sim::ncclSimParams(items_[i].prediction, sim::calibratedSimParams(c, o.launch));
    params.launchUs = 0;
    params.protocol = items_[i].prediction.protocol;
    const sim::SimResult r =
        sim::simulate(*items_[i].schedule, *nets_[static_cast<std::size_t>(o.topology)], o.sizeBytes, params);
    return r.ok ? r.timeUs : -1;
  }

 private:
  struct Item {
    sim::NcclPrediction prediction;
    std::optional<core::Schedule> schedule;
  };
  const Observations& obs_;
  std::vector<std::optional<sim::Network>> nets_;  // per topology
  std::vector<Item> items_;
};

// ---- Levenberg-Marquardt on ln(predicted / measured) ----

enum Param : std::size_t {
  kLaunchGraph,
  kLaunchHost,
  kLatSimple,
  kLatLL,
  kLatLL128,
  kBwSimple,
  kBwLL,
  kBwLL128,
  kNetHop,
  kNvLinkBw,
  kNetBw,
  kNumParams
};

constexpr std::array<std::string_view, kNumParams> kParamKeys = {
    "launch_graph_us",       "launch_host_us",         "latency_scale.Simple", "latency_scale.LL",
    "latency_scale.LL128",   "bandwidth_scale.Simple", "bandwidth_scale.LL",   "bandwidth_scale.LL128",
    "net_hop_latency_scale", "nvlink_bandwidth_scale", "net_bandwidth_scale"};

bool isLaunch(std::size_t k) { return k == kLaunchGraph || k == kLaunchHost; }

// The prior's width: a factor of e^10 on a scale, 1 ms on a launch. So wide that rows always outweigh it; it only
// keeps the normal equations regular along directions no row tells apart (launch against base latency, which small
// sizes see only as their sum), where the step then stays small.
constexpr double kPriorLnSigma = 10.0;
constexpr double kPriorLaunchSigmaUs = 1000.0;

using Vector = std::array<double, kNumParams>;

Vector defaults() {
  Vector x{};
  x[kLaunchGraph] = sim::kLaunchUsCudaGraph;
  x[kLaunchHost] = sim::kLaunchUsHost;
  return x;  // the scales are ln 1 = 0
}

Vector lowerLimits() {
  Vector lo;
  lo.fill(std::log(sim::kMinCalibrationScale));
  lo[kLaunchGraph] = lo[kLaunchHost] = 0;
  return lo;
}

// A bandwidth factor may not take a link past its raw bandwidth (the simulator's efficiency 0.8 of NVLink, 0.96 of
// a NIC): then the lower bound stays a bound for both models.
Vector upperLimits() {
  Vector hi;
  hi.fill(std::log(sim::kMaxCalibrationScale));
  hi[kLaunchGraph] = hi[kLaunchHost] = sim::kMaxCalibrationLaunchUs;
  const sim::SimParams d;
  hi[kNvLinkBw] = std::log(1.0 / d.linkEfficiency[0]);
  hi[kNetBw] = std::log(1.0 / d.linkEfficiency[2]);
  for (std::size_t p = 0; p < 3; ++p) hi[kBwSimple + p] = std::log(sim::maxProtocolBandwidthScale(static_cast<int>(p)));
  return hi;
}

sim::ModelCalibration toCalibration(const Vector& x, const std::array<bool, kNumParams>& active) {
  sim::ModelCalibration c;
  if (active[kLaunchGraph]) c.launchGraphUs = x[kLaunchGraph];
  if (active[kLaunchHost]) c.launchHostUs = x[kLaunchHost];
  for (std::size_t p = 0; p < 3; ++p) c.latencyScale[p] = std::exp(x[kLatSimple + p]);
  for (std::size_t p = 0; p < 3; ++p) {
    // exp(ln(limit)) may round past the limit, which the file reader would refuse.
    c.bandwidthScale[p] = std::min(std::exp(x[kBwSimple + p]), sim::maxProtocolBandwidthScale(static_cast<int>(p)));
  }
  c.netHopLatencyScale = std::exp(x[kNetHop]);
  c.nvlinkBandwidthScale = std::exp(x[kNvLinkBw]);
  c.netBandwidthScale = std::exp(x[kNetBw]);
  return c;
}

// Solves a x = b for a small symmetric positive (semi)definite a by Gaussian elimination with partial pivoting;
// false when singular.
template <std::size_t N>
bool solve(std::array<std::array<double, N>, N> a, std::array<double, N> b, std::size_t n, std::array<double, N>& x) {
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) < 1e-300) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (std::size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (std::size_t c = n; c-- > 0;) {
    double s = b[c];
    for (std::size_t k = c + 1; k < n; ++k) s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
  }
  return true;
}

// Fits one model: `rest(i, c)` is its time of observation i without the launch (-1: no prediction, row left out).
template <typename Rest>
ModelFit fitModel(const Observations& obs, Rest rest, int maxIterations, int threads) {
  const std::size_t n = obs.rows.size();
  std::vector<bool> used(n, false);
  std::array<bool, kNumParams> active{};
  Vector x = defaults();
  const Vector x0 = x;
  const Vector lo = lowerLimits();
  const Vector hi = upperLimits();

  std::vector<double> restAt(n, -1.0);
  auto evaluate = [&](const Vector& v, std::vector<double>& out) {
    const sim::ModelCalibration c = toCalibration(v, {});
    core::parallelFor(n, threads, [&](std::size_t i) { out[i] = rest(i, c); });
  };
  auto launchOf = [&](const Vector& v, std::size_t i) {
    return obs.rows[i].launch == sim::LaunchMode::Graph ? v[kLaunchGraph] : v[kLaunchHost];
  };
  evaluate(x, restAt);
  for (std::size_t i = 0; i < n; ++i) {
    used[i] = restAt[i] >= 0 && obs.rows[i].measuredUs > 0;
    if (!used[i]) continue;
    active[obs.rows[i].launch == sim::LaunchMode::Graph ? kLaunchGraph : kLaunchHost] = true;
  }
  // The bandwidth-bound rows (from kBandwidthBoundBytes) weigh as much together as the latency-bound ones: a log
  // has many more small sizes, and a fit to them alone may bend a bandwidth factor to mend latency (seen on p4de).
  std::vector<double> weight(n, 1.0);
  {
    std::size_t large = 0;
    std::size_t small = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (used[i]) ++(obs.rows[i].sizeBytes >= kBandwidthBoundBytes ? large : small);
    }
    if (large > 0 && small > large) {
      const double w = std::sqrt(static_cast<double>(small) / static_cast<double>(large));
      for (std::size_t i = 0; i < n; ++i) {
        if (obs.rows[i].sizeBytes >= kBandwidthBoundBytes) weight[i] = w;
      }
    }
  }
  auto residuals = [&](const Vector& v, const std::vector<double>& r, std::vector<double>& out) {
    out.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (used[i]) {
        out.push_back(weight[i] * std::log(std::max(1e-9, launchOf(v, i) + r[i]) / obs.rows[i].measuredUs));
      }
    }
    for (std::size_t k = 0; k < kNumParams; ++k) {
      if (active[k]) out.push_back((v[k] - x0[k]) / (isLaunch(k) ? kPriorLaunchSigmaUs : kPriorLnSigma));
    }
  };
  auto cost = [](const std::vector<double>& r) {
    double s = 0;
    for (double e : r) s += e * e;
    return s;
  };

  // Stop when a step gains less than this share of the cost: far below what
  // any report prints.
  constexpr double kMinGain = 1e-6;
  // A scale no row depends on (a protocol NCCL never chose, the network on one node) is not fitted.
  constexpr double kStep = 0.01;
  std::vector<double> probe(n);
  std::array<std::vector<double>, kNumParams> column;  // d rest / d x_k per row
  auto jacobian = [&](const Vector& v) {
    for (std::size_t k = 0; k < kNumParams; ++k) {
      if (isLaunch(k)) continue;
      if (!active[k] && !column[k].empty()) continue;
      Vector w = v;
      const double h = v[k] + kStep <= hi[k] ? kStep : -kStep;
      w[k] += h;
      evaluate(w, probe);
      column[k].assign(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        if (used[i] && probe[i] >= 0) column[k][i] = (probe[i] - restAt[i]) / h;
      }
    }
  };
  jacobian(x);
  for (std::size_t k = 0; k < kNumParams; ++k) {
    if (isLaunch(k)) continue;
    for (std::size_t i = 0; i < n; ++i) {
      if (used[i] && std::abs(column[k][i]) > 1e-9 * std::max(1.0, restAt[i])) active[k] = true;
    }
  }
  std::vector<std::size_t> index;  // active parameter k at position j
  for (std::size_t k = 0; k < kNumParams; ++k) {
    if (active[k]) index.push_back(k);
  }

  std::vector<double> r;
  residuals(x, restAt, r);
  double c = cost(r);
  double lambda = 1e-2;
  std::vector<double> trialRest(n);
  std::vector<double> trialR;
  for (int it = 0; it < maxIterations && !index.empty(); ++it) {
    if (it > 0) jacobian(x);
    // Normal equations over the rows used, then the priors.
    const std::size_t m = index.size();
    std::array<std::array<double, kNumParams>, kNumParams> a{};
    std::array<double, kNumParams> g{};
    std::size_t row = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!used[i]) continue;
      const double pred = launchOf(x, i) + restAt[i];
      std::array<double, kNumParams> jr{};
      for (std::size_t j = 0; j < m; ++j) {
        const std::size_t k = index[j];
        double d = 0;
        if (isLaunch(k)) {
          d = (k == kLaunchGraph) == (obs.rows[i].launch == sim::LaunchMode::Graph) ? 1.0 : 0.0;
        } else {
          d = column[k][i];
        }
        jr[j] = weight[i] * d / std::max(1e-9, pred);  // d ln(pred), weighted as its residual
      }
      for (std::size_t p = 0; p < m; ++p) {
        g[p] += jr[p] * r[row];
        for (std::size_t q = 0; q < m; ++q) a[p][q] += jr[p] * jr[q];
      }
      ++row;
    }
    for (std::size_t j = 0; j < m; ++j) {
      const std::size_t k = index[j];
      const double w = 1.0 / (isLaunch(k) ? kPriorLaunchSigmaUs : kPriorLnSigma);
      a[j][j] += w * w;
      g[j] += w * r[row++];
    }
    bool improved = false;
    while (lambda < 1e10) {
      auto damped = a;
      for (std::size_t j = 0; j < m; ++j) damped[j][j] += lambda * a[j][j] + 1e-12;
      std::array<double, kNumParams> rhs{};
      for (std::size_t j = 0; j < m; ++j) rhs[j] = -g[j];
      std::array<double, kNumParams> step{};
      if (!solve(damped, rhs, m, step)) break;
      Vector trial = x;
      for (std::size_t j = 0; j < m; ++j) {
        const std::size_t k = index[j];
        trial[k] = std::clamp(x[k] + step[j], lo[k], hi[k]);
      }
      evaluate(trial, trialRest);
      bool valid = true;
      for (std::size_t i = 0; i < n; ++i) valid = valid && (!used[i] || trialRest[i] >= 0);
      if (valid) {
        residuals(trial, trialRest, trialR);
        const double tc = cost(trialR);
        if (tc < c) {
          const double gain = (c - tc) / std::max(c, 1e-300);
          x = trial;
          restAt = trialRest;
          r = trialR;
          c = tc;
          lambda = std::max(1e-7, lambda / 3);
          improved = gain > kMinGain;
          break;
        }
      }
      lambda *= 4;
    }
    if (!improved) break;
  }

  ModelFit fit;
  fit.params = toCalibration(x, active);
  for (std::size_t k : index) fit.fitted.emplace_back(kParamKeys[k]);
  return fit;
}

double errorPct(double predicted, double measured) { return 100.0 * std::abs(predicted - measured) / measured; }

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Empty when `b` is the same kind of node and fabric as `a` (what a calibration is per), else why not.
std::string sameKind(const core::Topology& a, const core::Topology& b) {
  Calibration c;
  c.gpu = a.gpuType;
  c.gpusPerNode = a.gpusPerNode;
  c.nicsPerNode = static_cast<int>(a.nics.size());
  c.nicGBps = a.nics.empty() ? 0.0 : a.nics.front().bandwidthGBps;
  c.file = a.name;
  const std::string why = appliesTo(c, b);
  return why.empty() ? why : "the topologies are not one kind of node: " + why;
}

}  // namespace

core::Result<Observations> observationsFrom(const std::vector<NcclTestsLog>& logs, const core::Topology& topo,
                                            const FitOptions& options) {
  return observationsFrom(logs, std::vector<core::Topology>{topo}, options);
}

core::Result<Observations> observationsFrom(const std::vector<NcclTestsLog>& logs,
                                            const std::vector<core::Topology>& topos, const FitOptions& options) {
  Observations out;
  if (topos.empty()) return core::Diagnostic{"", 0, 0, "no topology to match the logs against"};
  for (const core::Topology& t : topos) {
    if (std::string why = sameKind(topos.front(), t); !why.empty()) return core::Diagnostic{"", 0, 0, why};
  }
  out.topologies = topos;
  auto counts = [&] {
    std::string s;
    for (const auto& t : topos)
      s += fmt::format("{}{} has {} ranks on {} node(s)", s.empty() ? "" : "; ", t.name, t.nRanks(), t.nodes);
    return s;
  };
  for (const NcclTestsLog& log : logs) {
    for (const LogRun& run : log.runs) {
      const std::string where = fmt::format("{}:{}", log.file, run.line);
      if (!run.collective) {
        out.notes.push_back(fmt::format("{}: {}: no collective OptiFlow models; run left out", where,
                                        run.program.empty() ? "the run" : run.program));
        continue;
      }
      if (options.collective && *options.collective != *run.collective) {
        out.notes.push_back(fmt::format("{}: a {} run; --coll {} leaves it out", where, core::toString(*run.collective),
                                        core::toString(*options.collective)));
        continue;
      }
      if (run.ranks == 0) {
        return core::Diagnostic{log.file, run.line, 0,
                                fmt::format("the run lists no \"#  Rank\" lines, so its rank count is unknown; "
                                            "expected one of: {}",
                                            counts())};
      }
      int topology = -1;
      for (std::size_t k = 0; k < topos.size() && topology < 0; ++k) {
        if (run.ranks == topos[k].nRanks() && run.nodes == topos[k].nodes) topology = static_cast<int>(k);
      }
      if (topology < 0) {
        return core::Diagnostic{log.file, run.line, 0,
                                fmt::format("the log ran on {} ranks on {} node(s); topology {}: give --topo the "
                                            "cluster the log was measured on",
                                            run.ranks, run.nodes, counts())};
      }
      CalibrationSource src;
      src.file = log.file;
      src.collective = std::string(core::toString(*run.collective));
      src.ranks = run.ranks;
      src.nodes = run.nodes;
      src.incompleteRows = run.incompleteRows;
      src.launch = run.graph > 0 ? "graph" : "host";
      src.ncclVersion = run.ncclVersion;
      for (const auto& n : run.notes) out.notes.push_back(n);
      for (const LogRow& row : run.rows) {
        if (row.wrong()) {
          out.notes.push_back(fmt::format("{}:{}: {} wrong elements: row left out", log.file, row.line,
                                          std::max(row.outOfPlaceWrong, row.inPlaceWrong)));
          continue;
        }
        if (row.sizeBytes == 0 || !(row.timeUs() > 0)) continue;  // nccl-tests prints size 0 rows; nothing to time
        Observation o;
        o.file = log.file;
        o.line = row.line;
        o.collective = *run.collective;
        o.sizeBytes = row.sizeBytes;
        o.measuredUs = row.timeUs();
        o.launch = run.graph > 0 ? sim::LaunchMode::Graph : sim::LaunchMode::Host;
        o.ncclVersion = run.ncclVersion;
        o.topology = topology;
        out.rows.push_back(std::move(o));
        ++src.rows;
      }
      out.sources.push_back(std::move(src));
    }
  }
  if (out.rows.empty()) {
    return core::Diagnostic{logs.empty() ? std::string() : logs.front().file, 0, 0,
                            "no row to calibrate on: expected at least one measured size of a collective"};
  }
  return out;
}

std::vector<Residual> predict(const Observations& obs, const sim::ModelCalibration& simCal,
                              const sim::ModelCalibration& modelCal) {
  const Predictor p(obs);
  const sim::ModelCalibration identity;
  std::vector<Residual> out(obs.rows.size());
  core::parallelFor(obs.rows.size(), 0, [&](std::size_t i) {
    const Observation& o = obs.rows[i];
    Residual& r = out[i];
    r.file = o.file;
    r.line = o.line;
    r.collective = std::string(core::toString(o.collective));
    r.sizeBytes = o.sizeBytes;
    r.measuredUs = o.measuredUs;
    const sim::NcclPrediction& pred = p.prediction(i);
    r.choice = pred.ok() ? choiceOf(pred) : "n/a";
    auto total = [&](double rest, const sim::ModelCalibration& c) {
      return rest < 0 ? -1.0 : rest + sim::launchUs(c, o.launch);
    };
    r.ncclModelBeforeUs = total(p.modelRest(i, identity), identity);
    r.ncclModelUs = total(p.modelRest(i, modelCal), modelCal);
    r.simulatorBeforeUs = total(p.simulatorRest(i, identity), identity);
    r.simulatorUs = total(p.simulatorRest(i, simCal), simCal);
  });
  return out;
}

ErrorSummary summarize(const std::vector<Residual>& rows, Model which, std::uint64_t minSize) {
  std::vector<double> errors;
  for (const Residual& r : rows) {
    if (r.sizeBytes < minSize || r.measuredUs <= 0) continue;
    double v = -1;
    switch (which) {
      case Model::SimulatorBefore:
        v = r.simulatorBeforeUs;
        break;
      case Model::Simulator:
        v = r.simulatorUs;
        break;
      case Model::NcclModelBefore:
        v = r.ncclModelBeforeUs;
        break;
      case Model::NcclModel:
        v = r.ncclModelUs;
        break;
    }
    if (v >= 0) errors.push_back(errorPct(v, r.measuredUs));
  }
  ErrorSummary s;
  s.rows = static_cast<int>(errors.size());
  if (!errors.empty()) {
    s.medianPct = median(errors);
    s.maxPct = *std::max_element(errors.begin(), errors.end());
  }
  return s;
}

Calibration fitCalibration(const Observations& obs, const FitOptions& options) {
  const Predictor p(obs);
  static const core::Topology kNone;
  const core::Topology& topo = obs.topologies.empty() ? kNone : obs.topologies.front();
  Calibration cal;
  cal.gpu = topo.gpuType;
  cal.gpusPerNode = topo.gpusPerNode;
  cal.nicsPerNode = static_cast<int>(topo.nics.size());
  cal.nicGBps = topo.nics.empty() ? 0.0 : topo.nics.front().bandwidthGBps;
  for (const auto& t : obs.topologies) cal.fittedOn += (cal.fittedOn.empty() ? "" : ", ") + t.name;
  cal.sources = obs.sources;
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  cal.simulator = fitModel(
      obs, [&](std::size_t i, const sim::ModelCalibration& c) { return p.simulatorRest(i, c); }, options.maxIterations,
      threads);
  cal.ncclModel = fitModel(
      obs, [&](std::size_t i, const sim::ModelCalibration& c) { return p.modelRest(i, c); }, options.maxIterations, 1);
  cal.residuals = predict(obs, cal.simulator.params, cal.ncclModel.params);
  auto fill = [&](ModelFit& f, Model before, Model after) {
    const ErrorSummary b = summarize(cal.residuals, before);
    const ErrorSummary a = summarize(cal.residuals, after);
    f.medianErrorPctBefore = std::max(0.0, b.medianPct);
    f.medianErrorPct = std::max(0.0, a.medianPct);
    f.maxErrorPct = std::max(0.0, a.maxPct);
    return a;
  };
  const ErrorSummary s = fill(cal.simulator, Model::SimulatorBefore, Model::Simulator);
  const ErrorSummary m = fill(cal.ncclModel, Model::NcclModelBefore, Model::NcclModel);
  // The simulator only where it timed every row the model did; else the model, which has them all. Between the two,
  // the one whose worse median (over all rows, or over the bandwidth-bound rows) is smaller: a model can fit the
  // many latency-bound rows of a log and miss every large size, and large sizes are where schedules differ most.
  auto worse = [&](const ErrorSummary& all, Model after) {
    const ErrorSummary large = summarize(cal.residuals, after, kBandwidthBoundBytes);
    return std::max(all.medianPct, large.rows > 0 ? large.medianPct : 0.0);
  };
  const bool simulatorTimesAll = s.rows == m.rows && s.medianPct >= 0;
  cal.believe =
      simulatorTimesAll && worse(s, Model::Simulator) <= worse(m, Model::NcclModel) ? "simulator" : "nccl-model";
  return cal;
}

}  // namespace optiflow::calib
