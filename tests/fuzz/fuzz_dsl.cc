// libFuzzer target: parseProgram must never crash or throw on any bytes, every diagnostic must point into the
// text and format, and whatever it accepts must survive printProgram + parse unchanged (up to source locations),
// with the canonical text a fixed point of the printer. Accepted programs are then expanded on a two-node cluster
// (small limits, so a runaway loop is refused quickly): the expander must never crash, and what it produces must
// be a well-formed intent program.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "optiflow/core/intent.h"
#include "optiflow/core/topology.h"
#include "optiflow/dsl/ast.h"
#include "optiflow/dsl/expand.h"
#include "optiflow/dsl/parser.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace optiflow::dsl;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseResult r = parseProgram(text, "<fuzz>");
  if (r.ok() != r.errors.empty() || r.errors.size() > kMaxErrors + 1) __builtin_trap();
  for (const optiflow::core::Diagnostic& d : r.errors) {
    if (d.line < 1 || d.column < 1 || d.message.empty()) __builtin_trap();
    (void)formatDiagnostic(d, text);
  }
  if (!r.ok()) return 0;
  const std::string printed = printProgram(*r.program);
  ParseResult back = parseProgram(printed, "<fuzz-roundtrip>");
  if (!back.ok()) __builtin_trap();
  if (printProgram(*back.program) != printed) __builtin_trap();
  clearSourceLocs(*r.program);
  clearSourceLocs(*back.program);
  if (!(*back.program == *r.program)) __builtin_trap();

  static const optiflow::core::Topology topo = optiflow::core::presetTopology("dgx-a100x2").value();
  ExpandOptions eo;
  eo.maxTransfers = 1 << 16;
  eo.maxIterations = 1 << 16;
  eo.root = 3;
  const ExpandResult x = expand(*r.program, topo, "<fuzz>", eo);
  if (x.ok() != x.errors.empty()) __builtin_trap();
  for (const optiflow::core::Diagnostic& d : x.errors) {
    if (d.message.empty()) __builtin_trap();
  }
  if (x.ok() && !optiflow::core::validateIntent(*x.intent).empty()) __builtin_trap();
  return 0;
}
