// libFuzzer target: the MSCCL XML importer must never crash, and whatever it accepts must survive
// exportMscclXml -> importMscclXml unchanged; the JSON form and the limit check must cope with it too.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "optiflow/compiler/msccl_xml.h"
#include "optiflow/core/schedule_json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto imported = optiflow::compiler::importMscclXml(text, "<fuzz>");
  if (!imported.ok()) {
    if (imported.error().message.empty()) __builtin_trap();
    return 0;
  }
  auto again = optiflow::compiler::importMscclXml(optiflow::compiler::exportMscclXml(*imported), "<fuzz-again>");
  if (!again.ok() || !(*again == *imported)) __builtin_trap();
  (void)optiflow::compiler::checkMscclLimits(*imported);
  (void)optiflow::core::scheduleToJson(*imported);
  return 0;
}
