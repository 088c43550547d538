#include <iostream>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/topology.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/sim/calibration.h"
#include "optiflow/sim/nccl_model.h"
#include "optiflow/sim/nccl_schedules.h"
#include "optiflow/sim/network.h"
#include "optiflow/sim/simulator.h"

namespace optiflow::cli {

namespace {

// What every time-reporting command needs before it starts.
struct Setup {
  core::Topology topology;
  std::vector<std::uint64_t> sizes;
  sim::SimParams params;
  std::optional<calib::Calibration> calibration;
};

std::optional<Setup> prepare(const PerfArgs& a) {
  auto topo = topologyArg(a.topology, a.topologyHints);
  if (!topo) return std::nullopt;
  auto sizes = core::parseSizeList(a.sizes);
  if (!sizes) {
    fmt::print(stderr, "optiflow: --sizes: {}\n", sizes.error().str());
    return std::nullopt;
  }
  auto cal = calibrationArg(a.calibration, *topo);
  if (!cal) return std::nullopt;
  Setup s{std::move(topo).value(), std::move(sizes).value(), {}, std::move(*cal)};
  s.params = simParamsFor(s.calibration, a.launch);
  if (!a.protocol.empty()) s.params.protocol = core::parseProtocol(a.protocol);
  return s;
}

std::optional<core::Collective> collectiveArg(const std::string& name) {
  auto c = core::parseCollective(name);
  if (!c || *c == core::Collective::Custom) {
    fmt::print(stderr,
               "optiflow: unknown collective '{}' (expected allgather, reducescatter, allreduce, broadcast, "
               "reduce or alltoall)\n",
               name);
    return std::nullopt;
  }
  return c;
}

void printJsonRows(const nlohmann::json& header, const nlohmann::json& rows) {
  nlohmann::json j = header;
  j["rows"] = rows;
  std::cout << j.dump(2) << '\n';
}

}  // namespace

int runSimulate(const std::string& scheduleFile, const PerfArgs& a) {
  auto setup = prepare(a);
  if (!setup) return kExitBadInput;
  if (auto planText = mscclppPlanText(scheduleFile)) {
    return runSimulateMscclpp(scheduleFile, *planText, setup->topology, setup->sizes, a.json);
  }
  auto loaded = compiler::loadSchedule(scheduleFile);
  if (!loaded) {
    fmt::print(stderr, "optiflow: {}\n", loaded.error().str());
    return kExitBadInput;
  }
  const core::Schedule& s = *loaded;
  auto net = sim::Network::build(setup->topology);
  if (!net) {
    fmt::print(stderr, "optiflow: {}\n", net.error().str());
    return kExitBadInput;
  }
  if (s.nRanks != net->nRanks()) {
    fmt::print(stderr, "optiflow: {} has {} ranks but topology {} has {} GPUs\n", scheduleFile, s.nRanks,
               setup->topology.name, net->nRanks());
    return kExitBadInput;
  }
  const sim::BoundModel bounds(setup->topology, sim::BoundOptions{.root = s.root});
  nlohmann::json rows = nlohmann::json::array();
  bool belowBound = false;
  if (!a.json) {
    fmt::print("{} ({} on {} ranks) on {}\n", scheduleFile, core::toString(s.collective), s.nRanks,
               setup->topology.name);
    const sim::NodeSymmetry sym = setup->params.foldSymmetricNodes ? sim::nodeSymmetry(s, *net) : sim::NodeSymmetry{};
    if (sym.kind != sim::NodeSymmetry::Kind::None) {
      fmt::print("node-symmetric ({}, period {}): {} of {} nodes simulated, the result is the full simulation's\n",
                 sim::toString(sym.kind), sym.period, sym.period, setup->topology.nodes);
    }
    fmt::print("{:>10} {:>7} {:>12} {:>11} {:>11} {:>12} {:>11}  {}\n", "size", "proto", "time_us", "algbw_GB/s",
               "busbw_GB/s", "bound_us", "bound_busbw", "bottleneck link");
  }
  for (std::uint64_t size : setup->sizes) {
    const sim::SimResult r = sim::simulate(s, *net, size, setup->params);
    if (!r.ok) {
      fmt::print(stderr, "optiflow: simulating {} at {}: {}\n", scheduleFile, core::formatSize(size), r.error);
      return kExitBadInput;
    }
    const sim::Bound b = bounds.bound(s.collective, size);
    // The bound holds for every schedule on these links; a time below it means the simulator is wrong.
    const bool below = r.timeUs < b.timeUs * (1 - 1e-9);
    belowBound = belowBound || below;
    const std::string bottleneck = r.bottleneckLink >= 0 ? net->link(r.bottleneckLink).name : "-";
    if (a.json) {
      nlohmann::json row = sim::simResultToJson(r, *net);
      row["size_bytes"] = size;
      row["time_us"] = r.timeUs;
      row["algbw_gbps"] = r.algbwGBps;
      row["busbw_gbps"] = r.busbwGBps;
      row["bound_us"] = b.timeUs;
      row["bound_busbw_gbps"] = b.busbwGBps;
      row["bound"] = sim::boundToJson(b);
      row["below_bound"] = below;
      rows.push_back(std::move(row));
    } else {
      fmt::print("{:>10} {:>7} {:>12.2f} {:>11.2f} {:>11.2f} {:>12.2f} {:>11.2f}  {}{}\n", core::formatSize(size),
                 core::toString(r.protocol), r.timeUs, r.algbwGBps, r.busbwGBps, b.timeUs, b.busbwGBps, bottleneck,
                 below ? "  BELOW THE BOUND (simulator bug)" : "");
    }
  }
  if (a.json) {
    printJsonRows({{"schedule", scheduleFile},
                   {"name", s.name},
                   {"collective", std::string(core::toString(s.collective))},
                   {"topology", setup->topology.name},
                   {"ranks", s.nRanks},
                   {"launch", a.launch}},
                  rows);
  }
  if (belowBound) {
    fmt::print(stderr, "optiflow: a simulated time is below the lower bound: this is a bug, please report it\n");
    return kExitFailed;
  }
  return kExitOk;
}

int runBound(const PerfArgs& a) {
  auto setup = prepare(a);
  if (!setup) return kExitBadInput;
  auto coll = collectiveArg(a.collective);
  if (!coll) return kExitBadInput;
  const sim::BoundModel bounds(setup->topology);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print("lower bound for {} on {} ({} GPUs){}\n", core::toString(*coll), setup->topology.name,
               setup->topology.nRanks(),
               setup->calibration ? " (a calibration changes no bound: it holds for the raw link bandwidths)" : "");
    fmt::print("{:>10} {:>12} {:>12} {:>12} {:>11} {:>11}  {}\n", "size", "time_us", "latency_us", "bandwidth_us",
               "algbw_GB/s", "busbw_GB/s", "binding constraint");
  }
  for (std::uint64_t size : setup->sizes) {
    const sim::Bound b = bounds.bound(*coll, size);
    if (a.json) {
      nlohmann::json row = sim::boundToJson(b);
      row["size_bytes"] = size;
      row["time_us"] = b.timeUs;
      row["algbw_gbps"] = b.algbwGBps;
      row["busbw_gbps"] = b.busbwGBps;
      rows.push_back(std::move(row));
    } else {
      fmt::print("{:>10} {:>12.2f} {:>12.2f} {:>12.2f} {:>11.2f} {:>11.2f}  {}\n", core::formatSize(size), b.timeUs,
                 b.latencyUs, b.bandwidthUs, b.algbwGBps, b.busbwGBps, b.description);
    }
  }
  if (a.json) {
    printJsonRows({{"collective", std::string(core::toString(*coll))},
                   {"topology", setup->topology.name},
                   {"ranks", setup->topology.nRanks()},
                   {"enumeration", bounds.enumeration()}},
                  rows);
  }
  return kExitOk;
}

int runBaseline(const PerfArgs& a) {
  auto setup = prepare(a);
  if (!setup) return kExitBadInput;
  auto coll = collectiveArg(a.collective);
  if (!coll) return kExitBadInput;
  auto net = sim::Network::build(setup->topology);
  if (!net) {
    fmt::print(stderr, "optiflow: {}\n", net.error().str());
    return kExitBadInput;
  }
  const sim::BoundModel bounds(setup->topology);
  const sim::NcclTuning tuning = sim::ncclTune(setup->topology);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print("NCCL's own model for {} on {} ({} GPUs){}\n", core::toString(*coll), setup->topology.name,
               setup->topology.nRanks(), a.simulateNccl ? ", and NCCL's algorithm timed by the simulator" : "");
    if (setup->calibration) {
      fmt::print("Calibrated by {} (fitted on {}): times include the fitted {} launch; reports believe the {}\n",
                 setup->calibration->file, setup->calibration->fittedOn, a.launch,
                 setup->calibration->believe == "simulator" ? "simulator" : "NCCL model");
    }
    fmt::print("{:>10} {:>9} {:>7} {:>4} {:>11} {:>11} {:>11} {:>11}{}\n", "size", "algorithm", "proto", "ch",
               "time_us", "algbw_GB/s", "busbw_GB/s", "bound_us", a.simulateNccl ? "      sim_us  sim/model" : "");
  }
  for (std::uint64_t size : setup->sizes) {
    sim::NcclPrediction p = sim::ncclPredict(tuning, *coll, size);
    if (!p.ok()) {
      fmt::print(stderr, "optiflow: NCCL model at {}: {}\n", core::formatSize(size), p.error);
      return kExitBadInput;
    }
    if (setup->calibration) {
      // The choice stays NCCL's; its time is the calibrated one (calibration.h).
      const sim::LaunchMode mode = a.launch == "host" ? sim::LaunchMode::Host : sim::LaunchMode::Graph;
      p.timeUs = sim::calibratedNcclTimeUs(p, setup->calibration->ncclModel.params, mode);
      p.algbwGBps = static_cast<double>(size) / (1000.0 * p.timeUs);
      p.busbwGBps = p.algbwGBps * core::busBandwidthFactor(*coll, setup->topology.nRanks());
    }
    const sim::Bound b = bounds.bound(*coll, size);
    std::optional<sim::SimResult> simulated;
    std::string simNote;
    if (a.simulateNccl) {
      auto sched = sim::ncclScheduleFor(setup->topology, *coll, p);
      if (sched) {
        // NCCL's own caps and host overheads, as the calibration uses them (docs/calibration.md).
        sim::SimParams params = sim::ncclSimParams(p, setup->params);
        params.protocol = p.protocol;
        simulated = sim::simulate(*sched, *net, size, params);
        if (!simulated->ok) simNote = simulated->error;
      } else {
        simNote = sched.error().str();
      }
    }
    if (a.json) {
      nlohmann::json row = sim::ncclPredictionToJson(p);
      row["size_bytes"] = size;
      row["algorithm"] = std::string(core::toString(p.algorithm));
      row["protocol"] = std::string(core::toString(p.protocol));
      row["channels"] = p.channels;
      row["time_us"] = p.timeUs;
      row["algbw_gbps"] = p.algbwGBps;
      row["busbw_gbps"] = p.busbwGBps;
      row["bound_us"] = b.timeUs;
      row["bound_busbw_gbps"] = b.busbwGBps;
      if (simulated && simulated->ok) {
        row["simulated"] = {
            {"time_us", simulated->timeUs}, {"algbw_gbps", simulated->algbwGBps}, {"busbw_gbps", simulated->busbwGBps}};
      } else if (a.simulateNccl) {
        row["simulated"] = {{"error", simNote}};
      }
      rows.push_back(std::move(row));
    } else {
      std::string simCols;
      if (a.simulateNccl) {
        simCols = simulated && simulated->ok
                      ? fmt::format(" {:>11.2f} {:>10.2f}", simulated->timeUs, simulated->timeUs / p.timeUs)
                      : fmt::format("  (not simulated: {})", simNote);
      }
      fmt::print("{:>10} {:>9} {:>7} {:>4} {:>11.2f} {:>11.2f} {:>11.2f} {:>11.2f}{}\n", core::formatSize(size),
                 core::toString(p.algorithm), core::toString(p.protocol), p.channels, p.timeUs, p.algbwGBps,
                 p.busbwGBps, b.timeUs, simCols);
    }
  }
  if (a.json) {
    printJsonRows({{"collective", std::string(core::toString(*coll))},
                   {"topology", setup->topology.name},
                   {"ranks", setup->topology.nRanks()},
                   {"tuning", sim::ncclTuningToJson(tuning)}},
                  rows);
  }
  return kExitOk;
}

}  // namespace optiflow::cli
