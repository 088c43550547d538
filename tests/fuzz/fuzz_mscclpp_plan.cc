// libFuzzer target: the MSCCL++ execution-plan reader must never crash; whatever it accepts must survive
// writeMscclppPlan -> parseMscclppPlan unchanged, and the proof and the real-bytes run must finish on it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "optiflow/compiler/mscclpp_plan.h"
#include "optiflow/compiler/mscclpp_verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace mpp = optiflow::compiler::mscclpp;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)mpp::looksLikeMscclppPlan(text);
  auto parsed = mpp::parseMscclppPlan(text, "<fuzz>");
  if (!parsed.ok()) {
    if (parsed.error().message.empty()) __builtin_trap();
    return 0;
  }
  auto again = mpp::parseMscclppPlan(mpp::writeMscclppPlan(*parsed), "<fuzz-again>");
  if (!again.ok()) __builtin_trap();
  mpp::Plan expected = *parsed;
  expected.schemaNotes.clear();
  for (auto& g : expected.gpus)
    for (auto& c : g.channels) c.legacyBuffKey = false;
  if (!(*again == expected)) __builtin_trap();
  const auto report = mpp::verifyPlan(*parsed);
  if (report.proven && !report.errors.empty()) __builtin_trap();
  mpp::PlanRunOptions run;
  run.orders = 1;
  run.elementsPerChunk = 1;
  (void)mpp::runPlan(*parsed, run);
  return 0;
}
