// One rank of a net plugin test, as NCCL's proxy would drive the plugin: dlopen the .so by path (RTLD_NOW|RTLD_LOCAL),
// take the ncclNetPlugin_v<abi> table, init, then listen (write the handle, hex, to a file or stdout) and/or connect
// (read a peer's handle, hex, from a file or stdin), polling connect/accept without blocking, then a scripted
// send/recv pattern with every byte checked. Used by net_multiproc_test and net_netns_test.
//
// net_peer --plugin PATH [--abi 9|10|11|12] [--dev N] [--rank R] [--recv-from P]
//          [--listen-out FILE|-] [--connect-in FILE|-] [--sizes 0,1,4097,1M,...] [--repeat N] [--inflight N]
//          [--group N] [--stream] [--stall] [--expect-error] [--deadline-s S]
//
// Message k (k = 0, 1, ...) has size sizes[k % len] and bytes pattern(sender rank, k, offset). With --group G the
// receiver posts grouped receives of G buffers tagged 1..G, and the sender sends each group's messages in reverse
// tag order (tags route them). --stream repeats forever (for kill tests); --stall stops after the connections are
// up (prints STALLED) and sleeps until killed.
// Prints READY once connected and DONE at the end. Exit: 0 ok (with --expect-error: a call failed as expected),
// 1 data mismatch, 2 a plugin call failed, 3 usage, 4 --expect-error but nothing failed, 124 deadline passed.
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nccl_net_host.h"
#include "optiflow/plugin/abi/nccl_net.h"

namespace {

using Clock = std::chrono::steady_clock;

enum Exit { kOk = 0, kMismatch = 1, kCallFailed = 2, kUsage = 3, kNoError = 4, kDeadline = 124 };

void logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char* /*file*/, int /*line*/, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
void logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char* /*file*/, int /*line*/, const char* fmt,
            ...) {
  va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "[plugin %s] ", level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE");
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
  va_end(args);
}

using optiflow::testsupport::NcclNetHost;

struct Args {
  std::string plugin;
  int abi = 12;
  int dev = 0;
  int rank = 0;
  int recvFrom = -1;  // default: the rank before (ring of 2: the other)
  std::string listenOut, connectIn;
  std::vector<std::size_t> sizes = {4096};
  int repeat = 1;
  int inflight = 1;
  int group = 1;
  bool stream = false;
  bool stall = false;
  bool expectError = false;
  double deadlineS = 60;
};

bool parseSize(const std::string& s, std::size_t* out) {
  if (s.empty()) return false;
  std::size_t unit = 1;
  std::string digits = s;
  const char last = s.back();
  if (last == 'K' || last == 'M' || last == 'G') {
    unit = last == 'K' ? 1024 : last == 'M' ? 1024 * 1024 : std::size_t{1} << 30;
    digits.pop_back();
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoull(digits) * unit;
  return true;
}

bool parseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    if (k == "--plugin") {
      a->plugin = value();
    } else if (k == "--abi") {
      a->abi = std::atoi(value().c_str());
    } else if (k == "--dev") {
      a->dev = std::atoi(value().c_str());
    } else if (k == "--rank") {
      a->rank = std::atoi(value().c_str());
    } else if (k == "--recv-from") {
      a->recvFrom = std::atoi(value().c_str());
    } else if (k == "--listen-out") {
      a->listenOut = value();
    } else if (k == "--connect-in") {
      a->connectIn = value();
    } else if (k == "--sizes") {
      a->sizes.clear();
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ',')) {
        std::size_t n = 0;
        if (!parseSize(item, &n)) return false;
        a->sizes.push_back(n);
      }
    } else if (k == "--repeat") {
      a->repeat = std::atoi(value().c_str());
    } else if (k == "--inflight") {
      a->inflight = std::atoi(value().c_str());
    } else if (k == "--group") {
      a->group = std::atoi(value().c_str());
    } else if (k == "--stream") {
      a->stream = true;
    } else if (k == "--stall") {
      a->stall = true;
    } else if (k == "--expect-error") {
      a->expectError = true;
    } else if (k == "--deadline-s") {
      a->deadlineS = std::atof(value().c_str());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return false;
    }
  }
  return !a->plugin.empty() && a->abi >= 9 && a->abi <= 12 && !a->sizes.empty() && a->repeat >= 1 && a->inflight >= 1 &&
         a->inflight <= 32 && a->group >= 1 && a->group <= 8 && (!a->listenOut.empty() || !a->connectIn.empty());
}

// 8 bytes of the pattern per word: a mix of (sender, message, word index).
inline std::uint64_t patternWord(int sender, std::uint64_t msg, std::uint64_t word) {
  std::uint64_t x = word + (msg << 36) + (static_cast<std::uint64_t>(sender) << 58) + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill(std::uint8_t* p, std::size_t n, int sender, std::uint64_t msg) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = patternWord(sender, msg, i / 8);
    std::memcpy(p + i, &w, 8);
  }
  if (i < n) {
    const std::uint64_t w = patternWord(sender, msg, i / 8);
    std::memcpy(p + i, &w, n - i);
  }
}

// -1 when p holds the pattern, else the first wrong offset.
long long firstMismatch(const std::uint8_t* p, std::size_t n, int sender, std::uint64_t msg) {
  std::size_t i = 0;
  for (; i < n; i += 8) {
    const std::uint64_t w = patternWord(sender, msg, i / 8);
    const std::size_t len = n - i < 8 ? n - i : 8;
    if (std::memcmp(p + i, &w, len) != 0) {
      for (std::size_t j = 0; j < len; ++j) {
        if (p[i + j] != reinterpret_cast<const std::uint8_t*>(&w)[j]) return static_cast<long long>(i + j);
      }
    }
  }
  return -1;
}

std::string toHex(const std::uint8_t* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

bool fromHex(const std::string& s, std::uint8_t* out, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

struct Peer {
  Args a;
  NcclNetHost net{logger, 0x1234};
  Clock::time_point deadline;
  bool failed = false;  // a plugin call returned an error

  bool expired() const { return Clock::now() > deadline; }

  // A failed call: the expected outcome with --expect-error, else exit 2.
  int callFailed(const char* what, ncclResult_t r) {
    std::fprintf(stderr, "net_peer rank %d: %s returned %d\n", a.rank, what, static_cast<int>(r));
    failed = true;
    if (a.expectError) {
      std::printf("EXPECTED-ERROR %s %d\n", what, static_cast<int>(r));
      std::fflush(stdout);
      return kOk;
    }
    return kCallFailed;
  }
};

struct Slot {
  std::vector<std::uint8_t> buf;
  void* mh = nullptr;
};

int run(Peer& p) {
  Args& a = p.a;
  void* lib = dlopen(a.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", a.plugin.c_str(), dlerror());
    return kUsage;
  }
  if (!p.net.load(lib, a.abi)) {
    std::fprintf(stderr, "no ncclNetPlugin_v%d in %s\n", a.abi, a.plugin.c_str());
    return kUsage;
  }
  if (ncclResult_t r = p.net.init(); r != ncclSuccess) return p.callFailed("init", r);

  void* lc = nullptr;
  void* sc = nullptr;
  void* rc = nullptr;
  std::uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  if (!a.listenOut.empty()) {
    if (ncclResult_t r = p.net.listen(a.dev, handle, &lc); r != ncclSuccess) return p.callFailed("listen", r);
    const std::string hex = toHex(handle, sizeof(handle));
    if (a.listenOut == "-") {
      std::printf("HANDLE %s\n", hex.c_str());
      std::fflush(stdout);
    } else {
      const std::string tmp = a.listenOut + ".tmp";
      std::ofstream(tmp) << hex << "\n";
      std::rename(tmp.c_str(), a.listenOut.c_str());
    }
  }
  std::uint8_t peerHandle[NCCL_NET_HANDLE_MAXSIZE] = {};
  bool haveHandle = a.connectIn.empty();
  while (!haveHandle) {
    std::string line;
    if (a.connectIn == "-") {
      if (!std::getline(std::cin, line)) return kUsage;
    } else {
      std::ifstream in(a.connectIn);
      if (!std::getline(in, line)) {
        if (p.expired()) return kDeadline;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
    }
    if (!fromHex(line, peerHandle, sizeof(peerHandle))) {
      std::fprintf(stderr, "bad handle hex: %s\n", line.c_str());
      return kUsage;
    }
    haveHandle = true;
  }
  // NCCL's pattern: call connect and accept again until the comm appears, never blocking in either.
  while ((!a.connectIn.empty() && sc == nullptr) || (lc != nullptr && rc == nullptr)) {
    if (!a.connectIn.empty() && sc == nullptr) {
      if (ncclResult_t r = p.net.connect(a.dev, peerHandle, &sc); r != ncclSuccess) return p.callFailed("connect", r);
    }
    if (lc != nullptr && rc == nullptr) {
      if (ncclResult_t r = p.net.accept(lc, &rc); r != ncclSuccess) return p.callFailed("accept", r);
    }
    if (p.expired()) return kDeadline;
    sched_yield();
  }
  std::printf("READY\n");
  std::fflush(stdout);
  if (a.stall) {
    std::printf("STALLED\n");
    std::fflush(stdout);
    while (!p.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return kDeadline;
  }

  std::size_t maxSize = 1;
  for (std::size_t s : a.sizes) maxSize = s > maxSize ? s : maxSize;
  const int g = a.group;
  const std::uint64_t total = a.stream ? UINT64_MAX : static_cast<std::uint64_t>(a.sizes.size()) * a.repeat * g;
  const int recvFrom = a.recvFrom >= 0 ? a.recvFrom : (a.rank == 0 ? 1 : a.rank - 1);
  auto sizeOf = [&](std::uint64_t k) { return a.sizes[k % a.sizes.size()]; };

  // Send side: inflight*g buffers; message order within a group is reversed (tags do the routing).
  std::vector<Slot> sendSlots(sc != nullptr ? static_cast<std::size_t>(a.inflight * g) : 0);
  std::vector<Slot> recvSlots(rc != nullptr ? static_cast<std::size_t>(a.inflight * g) : 0);
  for (Slot& s : sendSlots) {
    s.buf.resize(maxSize);
    if (ncclResult_t r = p.net.regMr(sc, s.buf.data(), s.buf.size(), &s.mh); r != ncclSuccess) {
      return p.callFailed("regMr(send)", r);
    }
  }
  for (Slot& s : recvSlots) {
    s.buf.resize(maxSize);
    if (ncclResult_t r = p.net.regMr(rc, s.buf.data(), s.buf.size(), &s.mh); r != ncclSuccess) {
      return p.callFailed("regMr(recv)", r);
    }
  }
  struct SendOp {
    void* req = nullptr;
    std::uint64_t k = 0;
    std::size_t slot = 0;
  };
  struct RecvOp {
    void* req = nullptr;
    std::uint64_t group = 0;
    std::size_t slot = 0;  // first of g
  };
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  std::vector<std::size_t> freeSend, freeRecv;
  for (std::size_t i = 0; i < sendSlots.size(); ++i) freeSend.push_back(i);
  for (std::size_t i = 0; i < recvSlots.size(); i += static_cast<std::size_t>(g)) freeRecv.push_back(i);
  std::uint64_t nextSend = 0, nextGroup = 0, sendsDone = 0, msgsRecvd = 0, bytes = 0;
  const bool sending = sc != nullptr, receiving = rc != nullptr;

  while ((sending && sendsDone < total) || (receiving && msgsRecvd < total)) {
    if (p.expired()) {
      std::fprintf(stderr, "net_peer rank %d: deadline with %llu/%llu sent, %llu/%llu received\n", a.rank,
                   static_cast<unsigned long long>(sendsDone), static_cast<unsigned long long>(total),
                   static_cast<unsigned long long>(msgsRecvd), static_cast<unsigned long long>(total));
      return kDeadline;
    }
    // Post sends: k in group order g*G + (G-1-j).
    while (sending && nextSend < total && !freeSend.empty()) {
      const std::uint64_t group = nextSend / g, j = nextSend % g;
      const std::uint64_t k = group * g + (g - 1 - j);
      const std::size_t slot = freeSend.back();
      Slot& s = sendSlots[slot];
      const std::size_t size = sizeOf(k);
      fill(s.buf.data(), size, a.rank, k);
      void* req = nullptr;
      const int tag = static_cast<int>(k % g) + 1;
      if (ncclResult_t r = p.net.isend(sc, s.buf.data(), size, tag, s.mh, &req); r != ncclSuccess) {
        return p.callFailed("isend", r);
      }
      if (req == nullptr) break;  // plugin busy: retry later
      freeSend.pop_back();
      sends.push_back({req, k, slot});
      ++nextSend;
    }
    // Post grouped receives.
    while (receiving && nextGroup * g < total && !freeRecv.empty()) {
      const std::size_t first = freeRecv.back();
      void* data[8];
      size_t sizes[8];
      int tags[8];
      void* mhs[8];
      for (int j = 0; j < g; ++j) {
        Slot& s = recvSlots[first + static_cast<std::size_t>(j)];
        data[j] = s.buf.data();
        sizes[j] = s.buf.size();
        tags[j] = j + 1;
        mhs[j] = s.mh;
      }
      void* req = nullptr;
      if (ncclResult_t r = p.net.irecv(rc, g, data, sizes, tags, mhs, &req); r != ncclSuccess) {
        return p.callFailed("irecv", r);
      }
      if (req == nullptr) break;
      freeRecv.pop_back();
      recvs.push_back({req, nextGroup, first});
      ++nextGroup;
    }
    // Test everything in flight.
    for (std::size_t i = 0; i < sends.size();) {
      int done = 0, size = -1;
      if (ncclResult_t r = p.net.test(sends[i].req, &done, &size); r != ncclSuccess)
        return p.callFailed("test(send)", r);
      if (!done) {
        ++i;
        continue;
      }
      if (size >= 0 && static_cast<std::size_t>(size) != sizeOf(sends[i].k)) {
        std::fprintf(stderr, "rank %d: send %llu reports %d bytes, sent %zu\n", a.rank,
                     static_cast<unsigned long long>(sends[i].k), size, sizeOf(sends[i].k));
        return kMismatch;
      }
      freeSend.push_back(sends[i].slot);
      sends.erase(sends.begin() + static_cast<long>(i));
      ++sendsDone;
    }
    for (std::size_t i = 0; i < recvs.size();) {
      int done = 0;
      int sizes[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
      if (ncclResult_t r = p.net.test(recvs[i].req, &done, sizes); r != ncclSuccess)
        return p.callFailed("test(recv)", r);
      if (!done) {
        ++i;
        continue;
      }
      for (int j = 0; j < g; ++j) {
        const std::uint64_t k = recvs[i].group * g + static_cast<std::uint64_t>(j);
        const Slot& s = recvSlots[recvs[i].slot + static_cast<std::size_t>(j)];
        if (sizes[j] < 0 || static_cast<std::size_t>(sizes[j]) != sizeOf(k)) {
          std::fprintf(stderr, "rank %d: message %llu (tag %d) from rank %d: %d bytes received, %zu expected\n", a.rank,
                       static_cast<unsigned long long>(k), j + 1, recvFrom, sizes[j], sizeOf(k));
          return kMismatch;
        }
        const long long bad = firstMismatch(s.buf.data(), sizeOf(k), recvFrom, k);
        if (bad >= 0) {
          std::fprintf(stderr, "rank %d: message %llu (tag %d, %zu bytes) from rank %d: byte %lld wrong\n", a.rank,
                       static_cast<unsigned long long>(k), j + 1, sizeOf(k), recvFrom, bad);
          return kMismatch;
        }
        bytes += sizeOf(k);
        ++msgsRecvd;
      }
      if (msgsRecvd == static_cast<std::uint64_t>(g)) {
        std::printf("FIRST-RECEIVED\n");
        std::fflush(stdout);
      }
      freeRecv.push_back(recvs[i].slot);
      recvs.erase(recvs.begin() + static_cast<long>(i));
    }
    if (sends.empty() && recvs.empty()) sched_yield();
  }
  for (Slot& s : sendSlots) p.net.deregMr(sc, s.mh);
  for (Slot& s : recvSlots) p.net.deregMr(rc, s.mh);
  if (sc != nullptr && p.net.closeSend(sc) != ncclSuccess) return kCallFailed;
  if (rc != nullptr && p.net.closeRecv(rc) != ncclSuccess) return kCallFailed;
  if (lc != nullptr && p.net.closeListen(lc) != ncclSuccess) return kCallFailed;
  if (p.net.finalize() != ncclSuccess) return kCallFailed;
  std::printf("DONE sent=%llu received=%llu bytes=%llu\n", static_cast<unsigned long long>(sendsDone),
              static_cast<unsigned long long>(msgsRecvd), static_cast<unsigned long long>(bytes));
  std::fflush(stdout);
  return a.expectError ? kNoError : kOk;
}

}  // namespace

int main(int argc, char** argv) {
  Peer p;
  if (!parseArgs(argc, argv, &p.a)) {
    std::fprintf(stderr, "usage: see the comment at the top of tests/multiproc/net_peer.cc\n");
    return kUsage;
  }
  p.deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(p.a.deadlineS * 1000));
  const int rc = run(p);
  // _exit: a peer that failed must not run the plugin's static destructors under live proxy state.
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
