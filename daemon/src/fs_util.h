// Small file helpers shared by the daemon's lifecycle and its work loop.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace optiflow::daemon::detail {

// Written to a temporary name beside `file` and renamed, so a reader (or a crash) sees the old file or the new one,
// never half of it. false (and no temporary left behind) when writing or renaming fails.
inline bool writeFileAtomic(const std::filesystem::path& file, const std::string& text) {
  const std::filesystem::path tmp =
      file.parent_path() / (std::string(".") += file.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (!ec) return true;
  std::error_code ignored;
  std::filesystem::remove(tmp, ignored);
  return false;
}

}  // namespace optiflow::daemon::detail
