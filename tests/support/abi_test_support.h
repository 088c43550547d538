// Shared pieces of the ABI tests: NCCL's side of the tuner ABI, written the way NCCL 2.21-2.30 does it
// (shared/reference/nccl-plugin-abi.md sections 1, 2 and 6), plus plan publishing, environment and namespace
// hygiene. Header-only; everything here runs in the test process (or a forked child), never inside the plugin.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/plugin/abi/nccl_common.h"
#include "optiflow/plugin/abi/nccl_tuner.h"
#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/writer.h"

namespace optiflow::abitest {

// ---------------------------------------------------------------------------------------------------------------
// Opening a plugin library the way NCCL 2.28 does (src/plugin/plugin_open.cc).

inline constexpr int kNcclDlopenFlags = RTLD_NOW | RTLD_LOCAL;

struct OpenResult {
  void* handle = nullptr;
  bool disabled = false;           // the value was "none" (any case)
  std::vector<std::string> tried;  // the names passed to dlopen, in order
};

// envValue is what NCCL_<KIND>_PLUGIN holds (nullptr: unset); kind is "tuner" or "net". The STATIC_PLUGIN quirk
// (dlopen(NULL)) is not modelled: nothing of ours relies on it.
inline OpenResult ncclStyleOpen(const char* envValue, std::string_view kind = "tuner") {
  OpenResult r;
  const std::string prefix = "libnccl-" + std::string(kind);
  if (envValue == nullptr || *envValue == '\0') {
    r.tried.push_back(prefix + ".so");
    r.handle = dlopen(r.tried.back().c_str(), kNcclDlopenFlags);
    return r;
  }
  if (strcasecmp(envValue, "none") == 0) {
    r.disabled = true;
    return r;
  }
  const std::string value(envValue);
  r.tried.push_back(value);
  r.handle = dlopen(value.c_str(), kNcclDlopenFlags);
  if (r.handle != nullptr) return r;
  const bool hasSlash = value.find('/') != std::string::npos;
  const bool isLibSo = value.size() >= 6 && value.rfind("lib", 0) == 0 && value.ends_with(".so");
  if (!hasSlash && !isLibSo) {
    r.tried.push_back(prefix + "-" + value + ".so");
    r.handle = dlopen(r.tried.back().c_str(), kNcclDlopenFlags);
  }
  return r;
}

// The file a handle was loaded from (dlinfo's link map), made canonical; "" when unknown.
inline std::string loadedPath(void* handle) {
  struct link_map* map = nullptr;
  if (handle == nullptr || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) {
    return "";
  }
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::canonical(map->l_name, ec);
  return ec ? std::string(map->l_name) : p.string();
}

inline std::string canonicalPath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::canonical(path, ec);
  return ec ? path : p.string();
}

// A dlopen'ed library, closed on destruction.
class Library {
 public:
  Library() = default;
  explicit Library(void* handle) : handle_(handle) {}
  static Library open(const std::string& path) { return Library(dlopen(path.c_str(), kNcclDlopenFlags)); }
  Library(Library&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Library& operator=(Library&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() { reset(); }

  void reset() {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = nullptr;
  }
  void* get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

  // NCCL dlsym's a data object and casts it to the table type.
  template <typename T>
  const T* table(const char* symbol) const {
    return handle_ == nullptr ? nullptr : static_cast<const T*>(dlsym(handle_, symbol));
  }

 private:
  void* handle_ = nullptr;
};

inline std::string dlerrorText() {
  const char* e = dlerror();
  return e == nullptr ? "(no dlerror)" : e;
}

// A private copy of a library under a fresh name: dlopen gives it its own statics, whatever the process loaded
// before (used where the plugin logs something once per process).
class LibraryCopy {
 public:
  explicit LibraryCopy(const std::string& source) {
    char dirTemplate[] = "/tmp/optiflow-abi-XXXXXX";
    if (mkdtemp(dirTemplate) == nullptr) return;
    dir_ = dirTemplate;
    path_ = dir_ + "/" + std::filesystem::path(source).filename().string();
    std::error_code ec;
    std::filesystem::copy_file(source, path_, ec);
    if (ec) path_.clear();
  }
  ~LibraryCopy() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  LibraryCopy(const LibraryCopy&) = delete;
  LibraryCopy& operator=(const LibraryCopy&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

// ---------------------------------------------------------------------------------------------------------------
// NCCL's logger: printf-style, variadic. The capture keeps every formatted line.

struct LogLine {
  ncclDebugLogLevel level;
  unsigned long flags;
  std::string text;
};

inline std::vector<LogLine>& capturedLog() {
  static std::vector<LogLine> lines;
  return lines;
}

__attribute__((format(printf, 5, 6))) inline void captureLogger(ncclDebugLogLevel level, unsigned long flags,
                                                                const char* /*file*/, int /*line*/, const char* fmt,
                                                                ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string text(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(text.data(), text.size() + 1, fmt, args);
  va_end(args);
  capturedLog().push_back({level, flags, std::move(text)});
}

inline constexpr std::string_view kTunerLogPrefix = "OptiFlow/Tuner:";

// The captured lines of the tuner (those starting with "OptiFlow/Tuner:") at `level`, or at any level.
inline std::vector<std::string> tunerLines(std::optional<ncclDebugLogLevel> level = std::nullopt) {
  std::vector<std::string> out;
  for (const LogLine& l : capturedLog()) {
    if (l.text.rfind(kTunerLogPrefix, 0) != 0) continue;
    if (level && l.level != *level) continue;
    out.push_back(l.text);
  }
  return out;
}

inline std::string joinLines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "  " + l + "\n";
  return s.empty() ? "  (no lines)\n" : s;
}

// Every captured line (for failure messages).
inline std::string logDump() {
  std::string s;
  for (const LogLine& l : capturedLog()) s += "  [" + std::to_string(l.level) + "] " + l.text + "\n";
  return s.empty() ? "  (nothing logged)\n" : s;
}

// ---------------------------------------------------------------------------------------------------------------
// NCCL's cost table: a contiguous float[numAlgo][NCCL_NUM_PROTOCOLS] passed as (float**)table.

template <int NumAlgo>
struct CostTable {
  float v[NumAlgo][NCCL_NUM_PROTOCOLS];

  float** nccl() { return (float**)v; }  // exactly NCCL's cast; NOLINT
  bool operator==(const CostTable& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};

// A plausible table: distinct positive costs, CollNet unavailable (-1) as on a node without SHARP. The cheapest entry
// is RING/SIMPLE, so "untouched" and "applied" are told apart by the argmin.
template <int NumAlgo>
CostTable<NumAlgo> ncclLikeTable() {
  CostTable<NumAlgo> t{};
  for (int a = 0; a < NumAlgo; ++a) {
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p)
      t.v[a][p] = 50.0f + 10.0f * static_cast<float>(a) + 3.0f * static_cast<float>(p);
  }
  for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
    t.v[NCCL_ALGO_COLLNET_DIRECT][p] = NCCL_ALGO_PROTO_IGNORE;
    t.v[NCCL_ALGO_COLLNET_CHAIN][p] = NCCL_ALGO_PROTO_IGNORE;
  }
  t.v[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 20.0f;
  return t;
}

template <int NumAlgo>
CostTable<NumAlgo> allIgnoredTable() {
  CostTable<NumAlgo> t{};
  for (auto& row : t.v) {
    for (float& x : row) x = NCCL_ALGO_PROTO_IGNORE;
  }
  return t;
}

// nRanks == 1: NCCL sets every entry to -1 except RING/SIMPLE, which is 0.0.
template <int NumAlgo>
CostTable<NumAlgo> singleRankTable() {
  CostTable<NumAlgo> t = allIgnoredTable<NumAlgo>();
  t.v[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 0.0f;
  return t;
}

struct Choice {
  int algo = NCCL_ALGO_UNDEF;
  int proto = NCCL_PROTO_UNDEF;
  bool operator==(const Choice&) const = default;
};

// What NCCL picks after the tuner returns: the smallest value >= 0, the first in algo-major order on a tie.
template <int NumAlgo>
Choice ncclPick(const CostTable<NumAlgo>& t) {
  Choice c;
  float best = 0.0f;
  for (int a = 0; a < NumAlgo; ++a) {
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
      const float x = t.v[a][p];
      if (!(x >= 0.0f)) continue;
      if (c.algo == NCCL_ALGO_UNDEF || x < best) {
        c = {a, p};
        best = x;
      }
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// NCCL's init arguments for v5/v6.

inline ncclTunerConstants_v5_t sentinelConstants() {
  ncclTunerConstants_v5_t c;
  auto* d = reinterpret_cast<double*>(&c);
  for (std::size_t i = 0; i < sizeof(c) / sizeof(double); ++i) d[i] = 1000.0 + 0.25 * static_cast<double>(i);
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// Plans, namespaces, environment.

inline schedcache::PlanItem planItem(core::Collective coll, std::uint32_t nRanks, std::uint32_t nNodes,
                                     std::uint64_t minBytes, std::uint64_t maxBytes, core::Algorithm algo,
                                     core::Protocol proto, std::int32_t nChannels = 0, std::uint64_t chunkBytes = 0) {
  schedcache::PlanItem it;
  it.coll = coll;
  it.nRanks = nRanks;
  it.nNodes = nNodes;
  it.minBytes = minBytes;
  it.maxBytes = maxBytes;
  it.algorithm = algo;
  it.protocol = proto;
  it.nChannels = nChannels;
  it.chunkBytes = chunkBytes;
  it.nativeUs = 10.0f;
  it.bestUs = 9.0f;
  it.boundUs = 8.0f;
  it.ncclUs = 11.0f;
  return it;
}

// "abi-<pid>-<n>": unique per process and call, so concurrent test processes never share a segment.
inline std::string uniqueNamespace() {
  static int counter = 0;
  return "abi-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

// Publishes through a fresh Writer (what `optiflow cache publish` does). The hash, or nullopt with *error.
inline std::optional<std::uint64_t> publishPlan(const std::string& ns, const schedcache::Plan& plan,
                                                std::string* error) {
  schedcache::WriterOptions options;
  options.ns = ns;
  options.build = "abi-test";
  schedcache::Error e;
  std::unique_ptr<schedcache::Writer> writer = schedcache::Writer::open(options, &e);
  if (!writer) {
    *error = "Writer::open(" + ns + "): " + e.message;
    return std::nullopt;
  }
  std::optional<schedcache::PublishResult> r = writer->publish(plan, &e);
  if (!r) {
    *error = "publish into " + ns + ": " + e.message;
    return std::nullopt;
  }
  return r->hash;
}

// Removes a namespace's segment and lock file, whatever state they are in (also garbage written by a test).
inline void removeNamespace(const std::string& ns) {
  schedcache::Error e;
  schedcache::Writer::remove(ns, &e);
  ::unlink(schedcache::segmentPath(ns).c_str());
  ::unlink(schedcache::lockPath(ns).c_str());
}

// Saves the variables the tuner reads (every OPTIFLOW_*, NCCL_ALGO, NCCL_PROTO), clears them (and sets
// OPTIFLOW_SETTLE_S=0), and restores them on destruction, so each test starts from a clean environment whatever the
// caller exported.
class CleanEnvironment {
 public:
  CleanEnvironment() {
    std::vector<std::string> names = {"NCCL_ALGO", "NCCL_PROTO"};
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      if (entry.rfind("OPTIFLOW_", 0) == 0) names.emplace_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& n : names) {
      const char* v = std::getenv(n.c_str());
      saved_[n] = v == nullptr ? std::nullopt : std::optional<std::string>(v);
      ::unsetenv(n.c_str());
    }
    // Tests publish and initialise within milliseconds of creating a segment; the settle rule (OPTIFLOW_SETTLE_S,
    // docs/consistency.md) has its own test, which unsets this.
    ::setenv("OPTIFLOW_SETTLE_S", "0", 1);
  }
  ~CleanEnvironment() {
    for (char** e = environ; e != nullptr && *e != nullptr;) {  // drop what the test added
      const std::string_view entry(*e);
      if (entry.rfind("OPTIFLOW_", 0) == 0 && !saved_.contains(std::string(entry.substr(0, entry.find('='))))) {
        ::unsetenv(std::string(entry.substr(0, entry.find('='))).c_str());
        e = environ;  // unsetenv reshuffles environ
        continue;
      }
      ++e;
    }
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  CleanEnvironment(const CleanEnvironment&) = delete;
  CleanEnvironment& operator=(const CleanEnvironment&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

inline std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace optiflow::abitest
