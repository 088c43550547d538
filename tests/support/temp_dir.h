// One temporary directory per test: a fresh directory under $TMPDIR (mkdtemp, so parallel ctest jobs and repeated
// runs never share one), named after the test for a person reading /tmp, removed with everything in it at the end.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace optiflow::testsupport {

class TempDir {
 public:
  explicit TempDir(std::string_view tag = "test") {
    const char* info = ::testing::UnitTest::GetInstance()->current_test_info() != nullptr
                           ? ::testing::UnitTest::GetInstance()->current_test_info()->name()
                           : "x";
    std::string name(info);
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterised tests: "Suite/Case.Name/0"
    }
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("optiflow-" + std::string(tag) + "-" + name + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // PATH/name as a string, for APIs and command lines that take one.
  std::string file(std::string_view name) const { return (path_ / name).string(); }
  // Writes `text` to PATH/name (binary, truncated) and returns the file's path.
  std::filesystem::path write(std::string_view name, std::string_view text) const {
    const std::filesystem::path p = path_ / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace optiflow::testsupport
