// optiflow's MSCCL++ commands: verify and check of execution plans, convert --to mscclpp, export mscclpp.
#include <fmt/format.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"
#include "optiflow/core/collective.h"
#include "optiflow/core/text_file.h"

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

}  // namespace optiflow::cli
