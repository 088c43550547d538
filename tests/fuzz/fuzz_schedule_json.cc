// libFuzzer target: the native schedule JSON parser must never crash, and whatever it accepts must survive
// scheduleToJson -> parseScheduleJson unchanged (compact and indented output alike).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "optiflow/core/schedule_json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = optiflow::core::parseScheduleJson(text, "<fuzz>");
  if (!parsed.ok()) {
    if (parsed.error().message.empty()) __builtin_trap();
    return 0;
  }
  for (int indent : {1, -1}) {
    auto again = optiflow::core::parseScheduleJson(optiflow::core::scheduleToJson(*parsed, indent), "<fuzz-again>");
    if (!again.ok() || !(*again == *parsed)) __builtin_trap();
  }
  return 0;
}
