// Pieces of the optiflowd end-to-end tests: a child process with its output in a file, deadlines, an HTTP GET, a
// strict Prometheus text-format parser and namespace hygiene. Everything runs in the test process.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::daemontest {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

inline double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Polls `done` every `stepMs` until it holds or `timeoutS` passed; true when it held.
inline bool waitFor(const std::function<bool()>& done, double timeoutS, int stepMs = 50) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeoutS);
  while (true) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(stepMs));
  }
}

using EnvList = std::vector<std::pair<std::string, std::string>>;

// A child process (posix_spawn) whose stdout and stderr go to one file. Its environment is this process's without
// any OPTIFLOW_* variable (whatever the runner exported), plus `env`. Killed (SIGKILL) and reaped on destruction.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  bool start(const std::vector<std::string>& argv, const EnvList& env, const fs::path& logPath, std::string* error) {
    logPath_ = logPath;
    std::vector<std::string> envStrings;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (std::string_view(*e).rfind("OPTIFLOW_", 0) != 0) envStrings.emplace_back(*e);
    }
    for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& s : envStrings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = argv;
    std::vector<char*> argp;
    for (std::string& s : args) argp.push_back(s.data());
    argp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    sigset_t all;
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    const int rc = ::posix_spawn(&pid_, argp[0], &actions, &attr, argp.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      *error = "posix_spawn " + args[0] + ": " + std::strerror(rc);
      pid_ = -1;
      return false;
    }
    exited_ = false;
    return true;
  }

  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(logPath_); }

  // The exit code (a signal N reads as -N), or nullopt while it still runs.
  std::optional<int> poll() {
    if (pid_ <= 0) return std::nullopt;
    if (exited_) return exitCode_;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_) return std::nullopt;
    exited_ = true;
    exitCode_ = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1000;
    return exitCode_;
  }
  bool running() { return pid_ > 0 && !poll().has_value(); }
  std::optional<int> waitExit(double timeoutS, int stepMs = 5) {
    std::optional<int> code;
    waitFor([&] { return (code = poll()).has_value(); }, timeoutS, stepMs);
    return code;
  }
  void signal(int sig) {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = true;
  int exitCode_ = -1;
  fs::path logPath_;
};

struct RunResult {
  int rc = -1000;  // -1000: did not finish in time (killed)
  std::string output;
  double seconds = 0;
};

// Runs a program to completion (at most timeoutS), output captured.
inline RunResult runProgram(const std::vector<std::string>& argv, const EnvList& env, const fs::path& logPath,
                            double timeoutS) {
  RunResult r;
  std::error_code ec;
  fs::remove(logPath, ec);
  Child child;
  std::string error;
  const auto t0 = Clock::now();
  if (!child.start(argv, env, logPath, &error)) {
    r.output = error;
    return r;
  }
  const std::optional<int> code = child.waitExit(timeoutS);
  r.seconds = secondsSince(t0);
  if (code) r.rc = *code;
  r.output = child.log();
  return r;
}

struct HttpReply {
  int status = 0;  // 0: no reply (connection refused, timeout)
  std::string body;
  std::string contentType;
  std::string error;
};

inline HttpReply httpGet(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  HttpReply r;
  httplib::Result res = client.Get(path);
  if (!res) {
    r.error = httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  r.contentType = res->get_header_value("Content-Type");
  return r;
}

// A scrape parsed strictly as the Prometheus text format 0.0.4: every line a `# HELP name text`, a `# TYPE name
// counter|gauge|histogram|summary|untyped` before the family's first sample (at most once), another comment, or
// `name{label="value",...} value [timestamp]`; the text ends with a newline.
struct Scrape {
  std::map<std::string, double> samples;  // "name" or "name{labels}" exactly as written
  std::map<std::string, std::string> types;
  std::string error;  // empty when the whole text parsed

  std::optional<double> value(const std::string& key) const {
    const auto it = samples.find(key);
    if (it == samples.end()) return std::nullopt;
    return it->second;
  }
  // Every sample of family `name` (with or without labels).
  std::vector<std::pair<std::string, double>> family(const std::string& name) const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [k, v] : samples) {
      if (k == name || k.rfind(name + "{", 0) == 0) out.emplace_back(k, v);
    }
    return out;
  }
};

inline std::optional<double> parseSampleValue(const std::string& s) {
  if (s == "+Inf" || s == "Inf") return HUGE_VAL;
  if (s == "-Inf") return -HUGE_VAL;
  if (s == "NaN") return std::nan("");
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

inline Scrape parsePrometheus(const std::string& text) {
  Scrape s;
  if (text.empty() || text.back() != '\n') {
    s.error = "the text does not end with a newline";
    return s;
  }
  static const std::regex kHelp(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*)( .*)?$)");
  static const std::regex kType(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)( -?[0-9]+)?$)");
  static const std::regex kLabels(
      R"(^([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")*,?$)");
  std::set<std::string> sampled;  // families with a sample already
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + " '" + line + "': ";
    std::smatch m;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# TYPE", 0) == 0) {
        if (!std::regex_match(line, m, kType)) {
          s.error = where + "malformed TYPE line";
          return s;
        }
        if (s.types.contains(m[1]) || sampled.contains(m[1])) {
          s.error = where + "TYPE repeated or after the family's samples";
          return s;
        }
        s.types[m[1]] = m[2];
      } else if (line.rfind("# HELP", 0) == 0 && !std::regex_match(line, m, kHelp)) {
        s.error = where + "malformed HELP line";
        return s;
      }
      continue;
    }
    if (!std::regex_match(line, m, kSample)) {
      s.error = where + "not `name{labels} value`";
      return s;
    }
    const std::string labels = m[3];
    if (m[2].matched && !labels.empty() && !std::regex_match(labels, kLabels)) {
      s.error = where + "malformed labels";
      return s;
    }
    const std::optional<double> v = parseSampleValue(m[4]);
    if (!v) {
      s.error = where + "value is not a number";
      return s;
    }
    const std::string key =
        m[2].matched && !labels.empty() ? std::string(m[1]) + "{" + labels + "}" : std::string(m[1]);
    if (s.samples.contains(key)) {
      s.error = where + "duplicate sample";
      return s;
    }
    s.samples[key] = *v;
    sampled.insert(m[1]);
  }
  return s;
}

inline std::string daemonLockPath(const std::string& ns) { return "/dev/shm/optiflow-" + ns + ".daemon.lock"; }

// Removes a namespace's segment, its writer lock and the daemon's lock, whatever state they are in.
inline void removeNamespace(const std::string& ns) {
  schedcache::Error e;
  schedcache::Writer::remove(ns, &e);
  ::unlink(schedcache::segmentPath(ns).c_str());
  ::unlink(schedcache::lockPath(ns).c_str());
  ::unlink(daemonLockPath(ns).c_str());
}

// VmRSS / VmHWM of a process in KiB (from /proc/PID/status), 0 when absent.
inline long procStatusKiB(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

}  // namespace optiflow::daemontest
