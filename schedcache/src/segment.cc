#include "segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include <boost/crc.hpp>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::schedcache {

std::int64_t realtimeNs() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace optiflow::schedcache

namespace optiflow::schedcache::detail {
namespace {

std::uint64_t loadSeq(const PlanSlot& slot, std::memory_order order) {
  // The segment is mapped read-write, the const only says this reader does not write the slot.
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(slot.header.seq)).load(order);
}

// Everything of the slot header after seq.
void copyHeader(const PlanSlot& slot, PlanSlotHeader* out) {
  constexpr std::size_t kSeqBytes = sizeof(PlanSlotHeader::seq);
  std::memcpy(reinterpret_cast<char*>(out) + kSeqBytes, reinterpret_cast<const char*>(&slot.header) + kSeqBytes,
              sizeof(PlanSlotHeader) - kSeqBytes);
}

void backoff(int attempt) { std::this_thread::sleep_for(std::chrono::microseconds(50) * (1 << attempt)); }

std::string u64(std::uint64_t v) { return std::to_string(v); }

}  // namespace

MappedSegment::~MappedSegment() {
  if (segment_ != nullptr) ::munmap(segment_, sizeof(Segment));
  if (fd_ >= 0) ::close(fd_);
}

Error MappedSegment::map(int fd, const std::string& path) {
  fd_ = fd;
  void* addr = ::mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) return makeError(Status::kSystem, path + ": mmap: " + errnoText(errno));
  segment_ = static_cast<Segment*>(addr);
  return {};
}

Error makeError(Status status, std::string message) { return Error{status, std::move(message)}; }

std::string errnoText(int err) {
  char buf[128];
  // GNU strerror_r returns the message, which may not be buf.
  const char* text = ::strerror_r(err, buf, sizeof(buf));
  return std::string(text) + " (errno " + std::to_string(err) + ")";
}

std::uint32_t headerChecksum(const SegmentHeader& header) {
  boost::crc_32_type crc;
  crc.process_bytes(&header, offsetof(SegmentHeader, headerChecksum));
  return crc.checksum();
}

std::uint32_t slotChecksum(const PlanSlotHeader& header, const PlanEntry* entries, std::size_t entryCount,
                           const char* strings, std::size_t stringBytes, const TrialEntry* trials,
                           std::size_t trialCount) {
  boost::crc_32_type crc;
  const auto* h = reinterpret_cast<const char*>(&header);
  crc.process_bytes(h + offsetof(PlanSlotHeader, contentHash),
                    offsetof(PlanSlotHeader, checksum) - offsetof(PlanSlotHeader, contentHash));
  crc.process_bytes(&header.trialCount, sizeof(header.trialCount));
  crc.process_bytes(header.source, sizeof(header.source));
  if (entryCount > 0) crc.process_bytes(entries, entryCount * sizeof(PlanEntry));
  if (stringBytes > 0) crc.process_bytes(strings, stringBytes);
  if (trialCount > 0) crc.process_bytes(trials, trialCount * sizeof(TrialEntry));
  return crc.checksum();
}

// A segment created with a group (`cache publish --group`, mode 0660) is shared with that group's members: they
// trust each other by the operator's choice. Any other user's segment is refused.
bool groupShared(const struct stat& st) {
  if ((st.st_mode & 0060) != 0060) return false;
  if (st.st_gid == ::getegid()) return true;
  gid_t groups[256];
  const int n = ::getgroups(256, groups);
  for (int i = 0; i < n; ++i) {
    if (groups[i] == st.st_gid) return true;
  }
  return false;
}

Error checkAndMap(int fd, const std::string& path, MappedSegment* out) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return makeError(Status::kSystem, path + ": fstat: " + errnoText(err));
  }
  const uid_t euid = ::geteuid();
  if (st.st_uid != euid && !groupShared(st)) {
    ::close(fd);
    return makeError(Status::kNotOwner, path + " belongs to uid " + std::to_string(st.st_uid) +
                                            ", this process runs as uid " + std::to_string(euid));
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & S_IWOTH) != 0) {
    ::close(fd);
    char mode[16];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return makeError(Status::kBadPermissions, path + " has mode " + mode +
                                                  (S_ISREG(st.st_mode) ? " (world-writable)" : " and is not a file") +
                                                  "; OptiFlow creates it 0600 or 0660");
  }
  if (static_cast<std::uint64_t>(st.st_size) != sizeof(Segment)) {
    ::close(fd);
    return makeError(Status::kBadSize, path + " is " + std::to_string(st.st_size) + " bytes, expected " +
                                           u64(sizeof(Segment)) + " (layout version " + std::to_string(kLayoutVersion) +
                                           ")");
  }
  if (Error e = out->map(fd, path); e.status != Status::kOk) return e;
  SegmentHeader h;
  std::memcpy(&h, &out->segment()->header, sizeof(h));
  if (h.magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(h.magic));
    return makeError(Status::kBadMagic, path + " is not an OptiFlow schedule cache (magic " + buf + ")");
  }
  if (h.layoutVersion != kLayoutVersion) {
    return makeError(Status::kBadVersion, path + " has layout version " + std::to_string(h.layoutVersion) +
                                              ", this build expects " + std::to_string(kLayoutVersion));
  }
  if (h.headerBytes != sizeof(SegmentHeader) || h.segmentBytes != sizeof(Segment) || h.slotCount != kPlanSlots ||
      h.entryCapacity != kMaxEntries || h.stringCapacity != kStringBytes || h.pinCapacity != kCommPins) {
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  " has header %u bytes, segment %llu bytes, %u slots of %u entries and %u string bytes, %u pins; "
                  "expected %zu, %zu, %u, %u, %u, %u",
                  h.headerBytes, static_cast<unsigned long long>(h.segmentBytes), h.slotCount, h.entryCapacity,
                  h.stringCapacity, h.pinCapacity, sizeof(SegmentHeader), sizeof(Segment), kPlanSlots, kMaxEntries,
                  kStringBytes, kCommPins);
    return makeError(Status::kBadSize, path + buf);
  }
  const std::uint32_t sum = headerChecksum(h);
  if (sum != h.headerChecksum) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ": header checksum %08x, computed %08x", h.headerChecksum, sum);
    return makeError(Status::kBadHeader, path + buf);
  }
  return {};
}

Error openSegment(std::string_view ns, MappedSegment* out) {
  if (!validNamespace(ns)) {
    return makeError(Status::kBadNamespace,
                     "namespace '" + std::string(ns) + "' is not 1-64 characters of [A-Za-z0-9_.-]");
  }
  const std::string path = segmentPath(ns);
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      return makeError(Status::kAbsent,
                       path + " does not exist (nothing published in namespace '" + std::string(ns) + "')");
    struct stat st {};
    // A segment of another user is normally unreadable to us: say so rather than "permission denied".
    if (err == EACCES && ::lstat(path.c_str(), &st) == 0 && st.st_uid != ::geteuid()) {
      return makeError(Status::kNotOwner, path + " belongs to uid " + std::to_string(st.st_uid) +
                                              ", this process runs as uid " + std::to_string(::geteuid()));
    }
    if (err == ELOOP) return makeError(Status::kBadPermissions, path + " is a symbolic link");
    return makeError(Status::kSystem, path + ": open: " + errnoText(err));
  }
  return checkAndMap(fd, path, out);
}

SlotState peekSlot(const PlanSlot& slot, PlanSlotHeader* header, int attempts) {
  bool sawEven = false;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const std::uint64_t s1 = loadSeq(slot, std::memory_order_acquire);
    if (s1 % 2 == 1) {
      backoff(attempt);
      continue;
    }
    if (s1 == 0) return SlotState::kEmpty;
    sawEven = true;
    copyHeader(slot, header);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (loadSeq(slot, std::memory_order_relaxed) == s1) {
      header->seq = s1;
      return SlotState::kComplete;
    }
    backoff(attempt);
  }
  return sawEven ? SlotState::kChanging : SlotState::kOdd;
}

SlotState readSlot(const PlanSlot& slot, SlotCopy* out, std::string* detail, int attempts) {
  bool sawEven = false;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const std::uint64_t s1 = loadSeq(slot, std::memory_order_acquire);
    if (s1 % 2 == 1) {
      backoff(attempt);
      continue;
    }
    if (s1 == 0) return SlotState::kEmpty;
    sawEven = true;
    copyHeader(slot, &out->header);
    const std::uint32_t count = out->header.entryCount;
    const std::uint32_t bytes = out->header.stringBytes;
    const std::uint32_t trials = out->header.trialCount;
    // Counts are checked before they size a copy; only a stable sequence makes them an error.
    const bool inRange = count <= kMaxEntries && bytes <= kStringBytes && trials <= kMaxTrials;
    if (inRange) {
      out->entries.resize(count);
      out->strings.resize(bytes);
      out->trials.resize(trials);
      if (count > 0) std::memcpy(out->entries.data(), slot.entries, count * sizeof(PlanEntry));
      if (bytes > 0) std::memcpy(out->strings.data(), slot.strings, bytes);
      if (trials > 0) std::memcpy(out->trials.data(), slot.trials, trials * sizeof(TrialEntry));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (loadSeq(slot, std::memory_order_relaxed) != s1) {
      backoff(attempt);
      continue;
    }
    out->header.seq = s1;
    if (!inRange) {
      *detail = std::to_string(count) + " entries, " + std::to_string(bytes) + " string bytes and " +
                std::to_string(trials) + " trial candidates exceed the slot's capacity";
      return SlotState::kCorrupt;
    }
    const std::uint32_t sum = slotChecksum(out->header, out->entries.data(), out->entries.size(), out->strings.data(),
                                           out->strings.size(), out->trials.data(), out->trials.size());
    if (sum != out->header.checksum) {
      char buf[80];
      std::snprintf(buf, sizeof(buf), "checksum %08x, computed %08x", out->header.checksum, sum);
      *detail = buf;
      return SlotState::kCorrupt;
    }
    *detail = checkSlotContent(*out);
    return detail->empty() ? SlotState::kComplete : SlotState::kCorrupt;
  }
  return sawEven ? SlotState::kChanging : SlotState::kOdd;
}

std::string checkSlotContent(const SlotCopy& copy) {
  const auto& strings = copy.strings;
  auto badString = [&](std::uint32_t offset) {
    if (offset == kNoString) return false;
    if (offset >= strings.size()) return true;
    return std::memchr(strings.data() + offset, '\0', strings.size() - offset) == nullptr;
  };
  for (std::size_t i = 0; i < copy.entries.size(); ++i) {
    const PlanEntry& e = copy.entries[i];
    std::string what;
    if (e.coll >= kNumCollectives) {
      what = "collective " + std::to_string(e.coll) + " out of range";
    } else if (e.algorithm < -1 || e.algorithm >= core::kNumAlgorithms) {
      what = "algorithm " + std::to_string(e.algorithm) + " out of range";
    } else if (e.protocol < -1 || e.protocol >= core::kNumProtocols) {
      what = "protocol " + std::to_string(e.protocol) + " out of range";
    } else if (e.algorithm < 0 && (e.protocol >= 0 || e.nChannels != 0 || e.chunkBytes != 0)) {
      what = "a protocol, channel count or chunk size without an algorithm";
    } else if (e.nChannels < 0) {
      what = "negative channel count";
    } else if (e.minBytes > e.maxBytes || e.nRanks == 0 || e.nNodes == 0) {
      what = "empty size range or shape";
    } else if (e.trialCount > kMaxTrialsPerEntry || e.trialCalls > kMaxTrialCalls ||
               (e.trialCount > 0 && e.trialCalls == 0) ||
               std::uint64_t{e.trialFirst} + e.trialCount > copy.trials.size()) {
      what = "trial candidates out of range (" + std::to_string(e.trialFirst) + " + " + std::to_string(e.trialCount) +
             " of " + std::to_string(copy.trials.size()) + ", " + std::to_string(e.trialCalls) + " calls each)";
    } else if (badString(e.jsonPath) || badString(e.xmlPath)) {
      what = "path offset out of range or not NUL-terminated (" + std::to_string(e.jsonPath) + ", " +
             std::to_string(e.xmlPath) + " of " + std::to_string(strings.size()) + " bytes)";
    } else if (i > 0) {
      const PlanEntry& p = copy.entries[i - 1];
      const auto key = std::tie(e.coll, e.nRanks, e.nNodes);
      const auto prevKey = std::tie(p.coll, p.nRanks, p.nNodes);
      if (key < prevKey || (key == prevKey && e.minBytes <= p.maxBytes)) what = "out of order or overlapping";
    }
    if (!what.empty()) return "entry " + std::to_string(i) + ": " + what;
  }
  for (std::size_t i = 0; i < copy.trials.size(); ++i) {
    const TrialEntry& t = copy.trials[i];
    if (t.algorithm < -1 || t.algorithm >= core::kNumAlgorithms || t.protocol < -1 ||
        t.protocol >= core::kNumProtocols || t.nChannels < 0 || (t.algorithm < 0 && t.protocol >= 0)) {
      return "trial candidate " + std::to_string(i) + ": out of range";
    }
  }
  return {};
}

std::string sourceText(const PlanSlotHeader& header) {
  return std::string(header.source, ::strnlen(header.source, sizeof(header.source)));
}

std::string slotHashText(const PlanSlotHeader& header) { return formatHash(header.contentHash); }

}  // namespace optiflow::schedcache::detail
