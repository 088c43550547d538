#include "optiflow/synth/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "optiflow/core/schedule_json.h"
#include "optiflow/exec/bench.h"

namespace optiflow::synth {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string replaceAll(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size()) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

// The last lines of the launcher's log, for the error message.
std::string tail(const fs::path& log, std::size_t maxLines = 3) {
  std::ifstream in(log, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    lines.push_back(line.size() > 300 ? line.substr(0, 300) + "..." : line);
    if (lines.size() > maxLines) lines.erase(lines.begin());
  }
  std::string out;
  for (const std::string& l : lines) out += (out.empty() ? "" : " | ") + l;
  return out;
}

struct Outcome {
  bool started = false;
  bool timedOut = false;
  int status = -1;  // exit status, or 128 + signal
  std::string error;
};

// Runs `command` with /bin/sh in a new process group, output to `log`; kills the group at the deadline.
Outcome runCommand(const std::string& command, const fs::path& log, double timeoutS) {
  Outcome out;
  const std::string logPath = log.string();
  const pid_t pid = ::fork();
  if (pid < 0) {
    out.error = fmt::format("fork: {}", std::strerror(errno));
    return out;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with the child's own call
  out.started = true;
  const auto end = Clock::now() + std::chrono::duration<double>(timeoutS);
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      out.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      return out;
    }
    if (r < 0 && errno != EINTR) {
      out.error = fmt::format("waitpid: {}", std::strerror(errno));
      return out;
    }
    if (Clock::now() >= end) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      out.timedOut = true;
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string shellQuote(const std::string& text) { return fmt::format("'{}'", replaceAll(text, "'", "'\\''")); }

RoundMeasurement measureWithLauncher(const LauncherConfig& launcher, int round, const std::vector<MeasureItem>& items) {
  RoundMeasurement m;
  if (std::string bad = checkLauncherCommand(launcher.command); !bad.empty()) {
    m.error = bad;
    return m;
  }
  const fs::path dir = launcher.workDir / fmt::format("round-{}", round);
  const fs::path batch = dir / "batch";
  const fs::path results = dir / "results.json";
  const fs::path log = dir / "launcher.log";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(batch, ec);
  if (ec) {
    m.error = fmt::format("cannot create {}: {}", batch.string(), ec.message());
    return m;
  }
  std::vector<exec::BenchItem> manifest;
  std::vector<std::string> files;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string file = fmt::format("item-{}.json", i);
    std::ofstream(batch / file, std::ios::binary | std::ios::trunc) << core::scheduleToJson(items[i].schedule);
    manifest.push_back({items[i].id, file, {}, {items[i].sizeBytes}});
    files.push_back(file);
  }
  std::ofstream(batch / std::string(exec::kBatchManifest), std::ios::binary | std::ios::trunc)
      << exec::batchManifestJson(manifest, files);
  const std::string command = replaceAll(replaceAll(launcher.command, "{batch}", shellQuote(batch.string())), "{out}",
                                         shellQuote(results.string()));
  const Outcome run = runCommand(command, log, launcher.timeoutS);
  if (!run.error.empty()) {
    m.error = fmt::format("the launcher could not be started: {}", run.error);
    return m;
  }
  if (run.timedOut) {
    m.error = fmt::format("the launcher did not finish within {} s and was killed (its output: {})", launcher.timeoutS,
                          log.string());
    return m;
  }
  std::ifstream in(results, std::ios::binary);
  if (!in) {
    const std::string last = tail(log);
    m.error = fmt::format("the launcher exited with status {} and wrote no results to {}{}", run.status,
                          results.string(), last.empty() ? "" : fmt::format(" (its output ends: {})", last));
    return m;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto parsed = exec::parseResultsJson(ss.str(), results.string());
  if (!parsed) {
    m.error = fmt::format("the launcher (status {}) left unreadable results: {}", run.status, parsed.error().str());
    return m;
  }
  std::map<std::string, const exec::ItemResult*> byId;
  for (const exec::ItemResult& r : *parsed) {
    if (!r.nccl) byId.emplace(r.id, &r);
  }
  m.timeUs.resize(items.size());
  m.itemErrors.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto it = byId.find(items[i].id);
    if (it == byId.end()) {
      m.itemErrors[i] = fmt::format("the results ({}) have no entry for {}", results.string(), items[i].id);
      continue;
    }
    const exec::ItemResult& r = *it->second;
    if (!r.ok) {
      m.itemErrors[i] = fmt::format("optiflow-bench: {}", r.error);
      continue;
    }
    if (r.rows.empty()) {
      m.itemErrors[i] = "optiflow-bench gave no time";
      continue;
    }
    const exec::SizeRow& row = r.rows.front();
    const exec::ModeResult& mode = row.outOfPlace.ran ? row.outOfPlace : row.inPlace;
    if (!mode.ran) {
      m.itemErrors[i] = "optiflow-bench ran no buffer mode";
    } else if (mode.wrong > 0) {
      m.itemErrors[i] =
          fmt::format("wrong bytes on hardware ({} chunk(s) differ from the collective's definition)", mode.wrong);
    } else {
      m.timeUs[i] = mode.timeUs;
    }
  }
  return m;
}

}  // namespace optiflow::synth
