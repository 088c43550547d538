// Reading and writing schedule files in either format: the native JSON (core/schedule_json.h) or MSCCL XML
// (compiler/msccl_xml.h). The format of an input is told by its content, never by its name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "optiflow/core/error.h"
#include "optiflow/core/schedule.h"

namespace optiflow::compiler {

enum class ScheduleFormat : std::uint8_t { Json, MscclXml };

std::string_view toString(ScheduleFormat f);                            // "json", "msccl-xml"
std::optional<ScheduleFormat> parseScheduleFormat(std::string_view s);  // "json"; "xml", "msccl", "msccl-xml"

// The format of a file name by its extension: ".xml" -> MscclXml, ".json" -> Json, anything else -> nullopt.
std::optional<ScheduleFormat> scheduleFormatFromPath(std::string_view path);

// Tells the format by the first non-whitespace character (after an optional UTF-8 byte order mark): '{' is JSON,
// '<' is MSCCL XML; anything else (or an empty text) is a Diagnostic. fileName only labels diagnostics.
core::Result<core::Schedule> parseSchedule(std::string_view text, std::string_view fileName);

// Reads the file at path and parses it as parseSchedule does; an unreadable file is a Diagnostic naming it.
core::Result<core::Schedule> loadSchedule(const std::string& path);

// The text of s in the given format (JSON: scheduleToJson with the default indent; XML: exportMscclXml in the
// schedule's own dialect).
std::string formatSchedule(const core::Schedule& s, ScheduleFormat format);

// Writes formatSchedule(s, format) to path a piece at a time, format defaulting to the one its extension names (JSON
// otherwise).
// Returns nullopt on success, else a Diagnostic naming the file.
std::optional<core::Diagnostic> saveSchedule(const core::Schedule& s, const std::string& path,
                                             std::optional<ScheduleFormat> format = {});

}  // namespace optiflow::compiler
