// libFuzzer target: what the hardware evaluator reads back from a launcher (optiflow-bench's JSON results, which a
// broken or hostile launcher may replace with anything) and optiflow-bench's --rendezvous text must never crash or
// throw. An error names the file; accepted results keep the reader's promises (positive finite times for every mode
// that ran, wrong counts of -1 or more) and survive a write and a second read unchanged.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "optiflow/exec/bench.h"
#include "optiflow/exec/rendezvous.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace optiflow::exec;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto hp = parseHostPort(text); hp.ok()) {
    if (hp->host.empty() || hp->port == 0) __builtin_trap();
  } else if (hp.error().message.empty()) {
    __builtin_trap();
  }
  const auto r = parseResultsJson(text, "<fuzz>");
  if (!r.ok()) {
    if (r.error().file != "<fuzz>" || r.error().message.empty()) __builtin_trap();
    return 0;
  }
  for (const ItemResult& item : *r) {
    for (const SizeRow& row : item.rows) {
      for (const ModeResult* m : {&row.outOfPlace, &row.inPlace}) {
        if (m->ran && !(std::isfinite(m->timeUs) && m->timeUs > 0)) __builtin_trap();
        if (m->wrong < -1) __builtin_trap();
      }
    }
  }
  BenchOptions o;
  const auto again = parseResultsJson(resultsJson(o, *r, "fuzz"), "<again>");
  if (!again.ok() || again->size() != r->size()) __builtin_trap();
  for (std::size_t i = 0; i < r->size(); ++i) {
    if ((*again)[i].id != (*r)[i].id || (*again)[i].rows.size() != (*r)[i].rows.size()) __builtin_trap();
  }
  return 0;
}
