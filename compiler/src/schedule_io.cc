#include "optiflow/compiler/schedule_io.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "optiflow/compiler/msccl_xml.h"
#include "optiflow/core/schedule_json.h"

namespace optiflow::compiler {

std::string_view toString(ScheduleFormat f) {
  switch (f) {
    case ScheduleFormat::Json:
      return "json";
    case ScheduleFormat::MscclXml:
      return "msccl-xml";
  }
  return "?";
}

std::optional<ScheduleFormat> parseScheduleFormat(std::string_view s) {
  if (s == "json") return ScheduleFormat::Json;
  if (s == "xml" || s == "msccl" || s == "msccl-xml") return ScheduleFormat::MscclXml;
  return std::nullopt;
}

std::optional<ScheduleFormat> scheduleFormatFromPath(std::string_view path) {
  auto endsWith = [&](std::string_view suffix) {
    if (path.size() < suffix.size()) return false;
    for (std::size_t i = 0; i < suffix.size(); ++i) {
      const char c = path[path.size() - suffix.size() + i];
      if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != suffix[i]) return false;
    }
    return true;
  };
  if (endsWith(".xml")) return ScheduleFormat::MscclXml;
  if (endsWith(".json")) return ScheduleFormat::Json;
  return std::nullopt;
}

core::Result<core::Schedule> parseSchedule(std::string_view text, std::string_view fileName) {
  std::size_t pos = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") pos = 3;
  int line = 1;
  int column = 1;
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) {
    if (text[pos] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    ++pos;
  }
  if (pos >= text.size()) {
    return core::Diagnostic{std::string(fileName), 0, 0,
                            "empty schedule file: expected a JSON schedule ('{') or an MSCCL XML algorithm ('<')"};
  }
  if (text[pos] == '{') return core::parseScheduleJson(text, fileName);
  if (text[pos] == '<') return importMscclXml(text, fileName);
  const auto c = static_cast<unsigned char>(text[pos]);
  const std::string found = c >= 0x20 && c < 0x7f ? fmt::format("'{}'", text[pos]) : fmt::format("byte 0x{:02x}", c);
  return core::Diagnostic{std::string(fileName), line, column,
                          fmt::format("cannot tell the schedule format: expected '{{' (OptiFlow JSON) or '<' (MSCCL "
                                      "XML) as the first character, found {}",
                                      found)};
}

core::Result<core::Schedule> loadSchedule(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return core::Diagnostic{path, 0, 0, fmt::format("cannot open schedule file: {}", std::strerror(errno))};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return core::Diagnostic{path, 0, 0, "cannot read schedule file"};
  const std::string text = ss.str();
  return parseSchedule(text, path);
}

std::string formatSchedule(const core::Schedule& s, ScheduleFormat format) {
  switch (format) {
    case ScheduleFormat::Json:
      return core::scheduleToJson(s);
    case ScheduleFormat::MscclXml:
      return exportMscclXml(s);
  }
  return core::scheduleToJson(s);
}

std::optional<core::Diagnostic> saveSchedule(const core::Schedule& s, const std::string& path,
                                             std::optional<ScheduleFormat> format) {
  const ScheduleFormat f = format.value_or(scheduleFormatFromPath(path).value_or(ScheduleFormat::Json));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return core::Diagnostic{path, 0, 0, fmt::format("cannot create file: {}", std::strerror(errno))};
  // Written a piece at a time: on 1024 ranks the text is hundreds of MB.
  if (f == ScheduleFormat::MscclXml) {
    writeMscclXml(s, out);
  } else {
    core::writeScheduleJson(s, out);
  }
  out.close();
  if (!out) return core::Diagnostic{path, 0, 0, fmt::format("cannot write file: {}", std::strerror(errno))};
  return std::nullopt;
}

}  // namespace optiflow::compiler
