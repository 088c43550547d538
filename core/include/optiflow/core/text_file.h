// What every reader of an input file shares: the whole file as text, and where a byte offset of it stands.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace optiflow::core {

// The file's bytes; nullopt when it cannot be opened or read to its end.
std::optional<std::string> readWholeFile(const std::filesystem::path& file);

// 1-based line and column of `offset` in `text` (an offset past the end is the end).
std::pair<int, int> lineColumn(std::string_view text, std::size_t offset);

}  // namespace optiflow::core
