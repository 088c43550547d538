// A command line run as a user's shell runs it, for the end-to-end tests: the exit code, everything it printed on
// stdout and stderr (caught in files of the test's directory), and how long it took.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace optiflow::testsupport {

struct CommandResult {
  int rc = -1;  // the exit code; -1 when the command did not exit (killed by a signal)
  std::string out;
  std::string err;
  double seconds = 0;
  std::string all() const { return out + err; }
};

// The whole file; empty when it cannot be read.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `command` through /bin/sh, its stdout and stderr redirected to DIR/stdout.txt and DIR/stderr.txt (overwritten).
inline CommandResult runCommand(const std::string& command, const std::filesystem::path& dir) {
  const std::filesystem::path out = dir / "stdout.txt";
  const std::filesystem::path err = dir / "stderr.txt";
  const std::string cmd = command + " >" + out.string() + " 2>" + err.string();
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace optiflow::testsupport
