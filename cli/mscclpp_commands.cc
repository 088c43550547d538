// optiflow's MSCCL++ commands: verify and check of execution plans, convert --to mscclpp, export mscclpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/compiler/mscclpp_export.h"
#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/text_file.h"
#include "optiflow/core/units.h"
#include "optiflow/sim/bounds.h"
#include "optiflow/synth/run_dir.h"

namespace optiflow::cli {

namespace mpp = compiler::mscclpp;

namespace {

nlohmann::json findingJson(const compiler::Finding& f) {
  return {{"severity", f.severity == compiler::Severity::Error ? "error" : "warning"},
          {"property", std::string(compiler::toString(f.property))},
          {"mode", std::string(core::toString(f.mode))},
          {"rank", f.rank},
          {"tb", f.tb},
          {"op", f.step},
          {"message", f.message}};
}

}  // namespace

std::optional<std::string> mscclppPlanText(const std::string& path) {
  auto text = core::readWholeFile(path);
  if (!text || !mpp::looksLikeMscclppPlan(*text)) return std::nullopt;
  return text;
}

int runVerifyMscclpp(const std::string& path, const std::string& text, bool json) {
  auto plan = mpp::parseMscclppPlan(text, path);
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    return kExitBadInput;
  }
  const auto report = mpp::verifyPlan(*plan);
  const auto ranks = plan->gpus.size();
  if (json) {
    nlohmann::json j;
    j["file"] = path;
    j["format"] = "mscclpp";
    j["name"] = plan->name;
    j["collective"] = std::string(core::toString(plan->collective));
    j["ranks"] = ranks;
    j["proven"] = report.proven;
    j["operations"] = report.steps;
    j["signal_waits"] = report.transfers;
    j["modes"] = nlohmann::json::array();
    for (auto m : report.modesChecked) j["modes"].push_back(std::string(core::toString(m)));
    j["errors"] = nlohmann::json::array();
    for (const auto& f : report.errors) j["errors"].push_back(findingJson(f));
    j["warnings"] = nlohmann::json::array();
    for (const auto& f : report.warnings) j["warnings"].push_back(findingJson(f));
    std::cout << j.dump(2) << '\n';
  } else {
    for (const auto& f : report.errors) fmt::print("error: {}\n", f.str());
    for (const auto& f : report.warnings) fmt::print("warning: {}\n", f.str());
    fmt::print("{}: MSCCL++ plan {} ({} {}, {} ranks, {}), {} operations, {} signal/wait pairs: {}\n", path, plan->name,
               core::toString(plan->collective), plan->inPlace ? "in-place" : "out-of-place", ranks,
               plan->protocol == core::Protocol::LL ? "LL" : "Simple", report.steps, report.transfers,
               report.proven ? "PROVEN" : fmt::format("NOT PROVEN ({} errors)", report.errors.size()));
  }
  return report.proven ? kExitOk : kExitFailed;
}

int runCheckMscclpp(const std::string& path, const std::string& text, bool json, int elements, std::uint64_t seed) {
  auto plan = mpp::parseMscclppPlan(text, path);
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    return kExitBadInput;
  }
  mpp::PlanRunOptions opts;
  opts.elementsPerChunk = std::min(elements, 1 << 12);
  opts.seed = seed;
  const auto run = mpp::runPlan(*plan, opts);
  if (json) {
    nlohmann::json j;
    j["file"] = path;
    j["format"] = "mscclpp";
    j["passed"] = run.passed;
    j["orders"] = run.ordersRun;
    j["mismatch_count"] = run.mismatches;
    j["errors"] = run.errors;
    j["mismatches"] = run.firstMismatches;
    std::cout << j.dump(2) << '\n';
  } else {
    for (const auto& e : run.errors) fmt::print("error: {}\n", e);
    for (const auto& m : run.firstMismatches) fmt::print("mismatch: {}\n", m);
    fmt::print("{}: ran MSCCL++ plan {} on {} ranks with real 32-bit data in {} completion orders: {}\n", path,
               plan->name, plan->gpus.size(), run.ordersRun,
               run.passed
                   ? "PASSED"
                   : fmt::format("FAILED ({} errors, {} mismatched chunk slices)", run.errors.size(), run.mismatches));
  }
  return run.passed ? kExitOk : kExitFailed;
}

namespace {

std::optional<core::BufferMode> modeArg(const std::string& mode) {
  if (mode.empty()) return std::nullopt;
  return mode == "in-place" || mode == "inplace" ? core::BufferMode::InPlace : core::BufferMode::OutOfPlace;
}

bool writeFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    fmt::print(stderr, "optiflow: cannot write {}\n", path.string());
    return false;
  }
  return true;
}

}  // namespace

int runConvertToMscclpp(const std::string& path, int ranksPerNode, const std::string& mode, const std::string& out) {
  if (mscclppPlanText(path)) {
    fmt::print(stderr, "optiflow: {} is already an MSCCL++ plan\n", path);
    return kExitBadInput;
  }
  auto s = compiler::loadSchedule(path);
  if (!s) {
    fmt::print(stderr, "optiflow: {}\n", s.error().str());
    return kExitBadInput;
  }
  mpp::ExportOptions o;
  o.ranksPerNode = ranksPerNode;
  o.mode = modeArg(mode);
  auto plan = mpp::exportPlan(*s, o);
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    return kExitBadInput;
  }
  for (const auto& note : plan->notes) fmt::print(stderr, "optiflow: note: {}\n", note);
  const std::string text = mpp::writeMscclppPlan(plan->plan);
  if (out.empty() || out == "-") {
    std::cout << text;
    return kExitOk;
  }
  return writeFile(out, text) ? kExitOk : kExitBadInput;
}

int runExportMscclpp(const std::string& runDir, const std::string& outDir) {
  namespace fs = std::filesystem;
  auto plan = synth::readPlan(fs::path(runDir) / "plan.json");
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    return kExitBadInput;
  }
  std::error_code ec;
  fs::create_directories(outDir, ec);
  if (ec) {
    fmt::print(stderr, "optiflow: cannot create {}: {}\n", outDir, ec.message());
    return kExitBadInput;
  }
  auto topoLoaded = core::loadTopology(plan->topology);
  std::optional<core::Topology> topo;
  if (topoLoaded) topo = std::move(topoLoaded).value();
  const int perNode = plan->gpusPerNode > 0 ? plan->gpusPerNode : (plan->nodes > 0 ? plan->ranks / plan->nodes : 0);
  nlohmann::ordered_json manifest;
  manifest["format"] = "optiflow-mscclpp-plans";
  manifest["version"] = 1;
  manifest["mscclpp_version"] = std::string(mpp::kPinnedVersion);
  manifest["topology"] = plan->topology;
  manifest["world_size"] = plan->ranks;
  manifest["ranks_per_node"] = perNode;
  manifest["plans"] = nlohmann::ordered_json::array();
  manifest["skipped"] = nlohmann::ordered_json::array();
  int written = 0;
  for (const auto& coll : plan->collectives) {
    // One plan per (collective, buffer mode, size range); the ranges of one collective and mode must not overlap,
    // or the executor's unordered map picks one at random.
    std::map<bool, std::vector<std::pair<std::uint64_t, std::uint64_t>>> ranges;
    for (const auto& e : coll.entries) {
      if (!e.best || e.best->scheduleJson.empty()) continue;
      const fs::path file = fs::path(runDir) / e.best->scheduleJson;
      auto s = compiler::loadSchedule(file.string());
      const std::string stem = fs::path(e.best->scheduleJson).stem().string();
      if (!s) {
        manifest["skipped"].push_back({{"schedule", e.best->scheduleJson}, {"reason", s.error().str()}});
        continue;
      }
      for (auto mode : core::supportedModes(*s)) {
        mpp::ExportOptions o;
        o.ranksPerNode = perNode;
        o.mode = mode;
        o.minMessageSize = e.minBytes;
        o.maxMessageSize = e.maxBytes;
        const bool inPlace = mode == core::BufferMode::InPlace;
        o.name = fmt::format("optiflow-{}-{}", stem, inPlace ? "inplace" : "outofplace");
        auto exported = mpp::exportPlan(*s, o);
        if (!exported) {
          manifest["skipped"].push_back(
              {{"schedule", e.best->scheduleJson}, {"in_place", inPlace}, {"reason", exported.error().message}});
          fmt::print(stderr, "optiflow: skipped {} ({}): {}\n", e.best->scheduleJson, core::toString(mode),
                     exported.error().message);
          continue;
        }
        auto& rs = ranges[inPlace];
        for (const auto& [lo, hi] : rs) {
          if (e.minBytes <= hi && lo <= e.maxBytes) {
            fmt::print(stderr, "optiflow: {}: size range [{}, {}] overlaps [{}, {}] of another plan\n",
                       e.best->scheduleJson, e.minBytes, e.maxBytes, lo, hi);
            return kExitBadInput;
          }
        }
        rs.emplace_back(e.minBytes, e.maxBytes);
        const std::string name = o.name + ".json";
        // Honest times: the MSCCL-style schedule's predicted time (what synthesis ranked) and the plan's own.
        std::optional<double> planUs;
        if (topo) {
          const auto t = mpp::timePlan(exported->plan, *topo, e.sizeBytes);
          if (t.ok) planUs = t.timeUs;
        }
        if (planUs && std::abs(*planUs - e.best->timeUs) > 0.1 * e.best->timeUs) {
          fmt::print("{} ({}): predicted {:.2f} us as an MSCCL-style schedule, {:.2f} us as this MSCCL++ plan\n",
                     e.best->scheduleJson, inPlace ? "in-place" : "out-of-place", e.best->timeUs, *planUs);
        }
        if (!writeFile(fs::path(outDir) / name, mpp::writeMscclppPlan(exported->plan))) return kExitBadInput;
        manifest["plans"].push_back({{"file", name},
                                     {"name", exported->plan.name},
                                     {"collective", std::string(core::toString(coll.collective))},
                                     {"world_size", s->nRanks},
                                     {"ranks_per_node", perNode},
                                     {"in_place", inPlace},
                                     {"min_message_size", e.minBytes},
                                     {"max_message_size", e.maxBytes},
                                     {"protocol", exported->plan.protocol == core::Protocol::LL ? "LL" : "Simple"},
                                     {"reduce_op", coll.collective == core::Collective::AllGather ? "none" : "sum"},
                                     {"schedule", e.best->scheduleJson},
                                     {"predicted_us", e.best->timeUs},
                                     {"plan_predicted_us", planUs ? nlohmann::json(*planUs) : nlohmann::json()}});
        ++written;
      }
    }
  }
  if (!writeFile(fs::path(outDir) / "manifest.json", manifest.dump(2) + "\n")) return kExitBadInput;
  fmt::print("{}: {} MSCCL++ plans (each proven), manifest.json; {} skipped\n", outDir, written,
             manifest["skipped"].size());
  return written > 0 ? kExitOk : kExitFailed;
}

int runSimulateMscclpp(const std::string& path, const std::string& text, const core::Topology& topology,
                       const std::vector<std::uint64_t>& sizes, bool json) {
  auto plan = mpp::parseMscclppPlan(text, path);
  if (!plan) {
    fmt::print(stderr, "optiflow: {}\n", plan.error().str());
    return kExitBadInput;
  }
  const sim::BoundModel bounds(topology);
  nlohmann::json rows = nlohmann::json::array();
  bool below = false;
  if (!json) {
    fmt::print("{} (MSCCL++ plan {}, {} on {} ranks) on {}\n", path, plan->name, core::toString(plan->collective),
               plan->gpus.size(), topology.name);
    fmt::print("{:>10} {:>12} {:>12} {:>12} {:>12}\n", "size", "time_us", "path_us", "bandwidth_us", "bound_us");
  }
  for (std::uint64_t size : sizes) {
    const auto t = mpp::timePlan(*plan, topology, size);
    if (!t.ok) {
      fmt::print(stderr, "optiflow: {}: {}\n", path, t.error);
      return kExitBadInput;
    }
    const sim::Bound b = bounds.bound(plan->collective, size);
    const bool under = t.timeUs < b.timeUs * (1 - 1e-9);
    below = below || under;
    if (json) {
      rows.push_back({{"size_bytes", size},
                      {"time_us", t.timeUs},
                      {"path_us", t.pathUs},
                      {"bandwidth_us", t.bandwidthUs},
                      {"bound_us", b.timeUs},
                      {"below_bound", under}});
    } else {
      fmt::print("{:>10} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f}{}\n", core::formatSize(size), t.timeUs, t.pathUs,
                 t.bandwidthUs, b.timeUs, under ? "  BELOW THE BOUND (model bug)" : "");
    }
  }
  if (json) {
    nlohmann::json j;
    j["plan"] = path;
    j["name"] = plan->name;
    j["format"] = "mscclpp";
    j["topology"] = topology.name;
    j["rows"] = rows;
    std::cout << j.dump(2) << '\n';
  }
  if (below) {
    fmt::print(stderr, "optiflow: a predicted time is below the lower bound: this is a bug, please report it\n");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace optiflow::cli
