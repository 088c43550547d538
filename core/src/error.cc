#include "optiflow/core/error.h"

#include <fmt/format.h>

namespace optiflow::core {

std::string Diagnostic::str() const {
  std::string where = file;
  if (line > 0) where += fmt::format(":{}", line);
  if (line > 0 && column > 0) where += fmt::format(":{}", column);
  if (where.empty()) return message;
  return fmt::format("{}: {}", where, message);
}

}  // namespace optiflow::core
