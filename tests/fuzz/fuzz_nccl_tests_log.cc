// libFuzzer target: parseNcclTestsLog (what `optiflow calibrate` reads: nccl-tests text logs in every generation and
// -J JSON) must never crash or throw on any bytes, and what it returns must keep the header's promises: an error names
// the file and says something; an accepted log has a row, text rows stand at increasing lines inside the input (JSON
// rows at line 0), times are finite and positive, #wrong is -1 or more, every left-out row has a note, and a collective
// is set exactly when its source is.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "optiflow/calib/nccl_tests_log.h"

namespace {

bool goodTime(const std::optional<double>& t) { return !t || (std::isfinite(*t) && *t > 0); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace optiflow::calib;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto r = parseNcclTestsLog(text, "<fuzz>");
  if (!r.ok()) {
    if (r.error().file != "<fuzz>" || r.error().message.empty() || r.error().line < 0) __builtin_trap();
    (void)r.error().str();
    return 0;
  }
  const NcclTestsLog& log = *r;
  if (log.file != "<fuzz>" || log.runs.empty()) __builtin_trap();
  if (log.json && log.runs.size() != 1) __builtin_trap();
  // Lines are 1-based and end at a '\n' or the end of the input.
  long lines = 1;
  for (char c : text) lines += c == '\n';
  std::size_t rows = 0;
  int lastLine = 0;
  for (const LogRun& run : log.runs) {
    if (run.incompleteRows < 0 || run.notes.size() < static_cast<std::size_t>(run.incompleteRows)) __builtin_trap();
    if (run.rows.empty() && run.incompleteRows == 0) __builtin_trap();
    if (run.collective.has_value() == run.collectiveFrom.empty()) __builtin_trap();
    if (run.ranks < 0 || run.nodes != static_cast<int>(run.hosts.size()) || run.ncclVersion < 0) __builtin_trap();
    if (!log.json && (run.line < 1 || run.line < lastLine || run.line > lines)) __builtin_trap();
    lastLine = run.line;
    for (const LogRow& row : run.rows) {
      if (log.json) {
        if (row.line != 0) __builtin_trap();
      } else {
        // Rows of a run come after its start, in file order, and have a type nccl-tests prints.
        if (row.line < run.line || row.line < lastLine || row.line > lines) __builtin_trap();
        if (typeBytes(row.type) == 0) __builtin_trap();
        lastLine = row.line;
      }
      if (!row.outOfPlaceUs && !row.inPlaceUs) __builtin_trap();
      if (!goodTime(row.outOfPlaceUs) || !goodTime(row.inPlaceUs)) __builtin_trap();
      if (!std::isfinite(row.timeUs()) || !(row.timeUs() > 0)) __builtin_trap();
      if (row.outOfPlaceWrong < -1 || row.inPlaceWrong < -1 || row.root < -1) __builtin_trap();
      if (row.wrong() != (row.outOfPlaceWrong > 0 || row.inPlaceWrong > 0)) __builtin_trap();
    }
    rows += run.rows.size();
  }
  if (rows == 0) __builtin_trap();
  return 0;
}
