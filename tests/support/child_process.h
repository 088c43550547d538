// Child processes for the multi-process tests: one rank or one daemon per process, its output in files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace optiflow::testsupport {

// What ChildProcess::wait returns for a child that outlived its deadline (and was SIGKILLed).
inline constexpr int kTimedOut = 1000;

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One child process (fork + execvp) with stdout/stderr in files; SIGKILLed and reaped on destruction if still running.
// The child's environment is the test's without any OPTIFLOW_* variable, plus `env`: only what the test sets reaches
// the plugin.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
               const std::string& outPrefix)
      : out_(outPrefix + ".out"), err_(outPrefix + ".err") {
    pid_ = fork();
    if (pid_ == 0) {
      const int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (o < 0 || e < 0) _exit(127);
      dup2(o, 1);
      dup2(e, 2);
      for (char** p = environ; *p != nullptr;) {  // only the variables the test sets reach the plugin
        const std::string entry(*p);
        if (entry.rfind("OPTIFLOW_", 0) == 0) {
          ::unsetenv(entry.substr(0, entry.find('=')).c_str());
          p = environ;
          continue;
        }
        ++p;
      }
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ~ChildProcess() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool running() const { return pid_ > 0 && !reaped_; }
  pid_t pid() const { return pid_; }
  void kill(int sig) { ::kill(pid_, sig); }

  // Exit code; 128+signal when killed by a signal; kTimedOut (after SIGKILL) when it outlived the deadline.
  int wait(std::chrono::milliseconds limit) {
    if (reaped_) return code_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        reaped_ = true;
        code_ = kTimedOut;
        return code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  bool waitForOutput(const std::string& needle, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (slurp(out_).find(needle) != std::string::npos) return true;
      int status = 0;
      if (!reaped_ && waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (reaped_) return slurp(out_).find(needle) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }
  std::string dump() const { return "--- stdout\n" + out() + "--- stderr\n" + err(); }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int code_ = -1;
  std::string out_, err_;
};

}  // namespace optiflow::testsupport
