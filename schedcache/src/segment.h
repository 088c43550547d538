// Internals shared by the reader and the writer: opening and checking a segment, checksums, and reading a plan slot
// under its sequence counter. Nothing here throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/layout.h"

namespace optiflow::schedcache::detail {

// An open, mapped segment; unmaps and closes on destruction.
class MappedSegment {
 public:
  MappedSegment() = default;
  ~MappedSegment();
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  // Takes fd (also on failure) and maps sizeof(Segment) bytes of it read-write.
  Error map(int fd, const std::string& path);
  Segment* segment() const { return segment_; }

 private:
  int fd_ = -1;
  Segment* segment_ = nullptr;
};

Error makeError(Status status, std::string message);
std::string errnoText(int err);
using schedcache::realtimeNs;

// Takes fd: fstat checks (owner, permissions, size), maps it, then the header checks, in Reader::attach's order.
Error checkAndMap(int fd, const std::string& path, MappedSegment* out);
// Opens segmentPath(ns) (O_NOFOLLOW) and runs checkAndMap; ENOENT is kAbsent.
Error openSegment(std::string_view ns, MappedSegment* out);

std::uint32_t headerChecksum(const SegmentHeader& header);
std::uint32_t slotChecksum(const PlanSlotHeader& header, const PlanEntry* entries, std::size_t entryCount,
                           const char* strings, std::size_t stringBytes, const TrialEntry* trials,
                           std::size_t trialCount);

// The used part of one slot, copied out of the segment.
struct SlotCopy {
  PlanSlotHeader header{};
  std::vector<PlanEntry> entries;
  std::vector<char> strings;
  std::vector<TrialEntry> trials;
};

enum class SlotState {
  kComplete,  // read under a stable even sequence
  kEmpty,     // never written
  kOdd,       // being written or abandoned (still odd after every attempt)
  kChanging,  // even each time but changed while read, every attempt
  kCorrupt,   // stable, but counts out of range, checksum mismatch or invalid content (*detail says which)
};

// Header only (no checksum check): for finding a slot by hash and choosing one to write.
SlotState peekSlot(const PlanSlot& slot, PlanSlotHeader* header, int attempts);
// Header, entries and strings, checksum and content checked.
SlotState readSlot(const PlanSlot& slot, SlotCopy* out, std::string* detail, int attempts);

inline constexpr int kReadAttempts = 8;

// Items of a slot are checked before use: a garbage slot must never index out of range.
std::string checkSlotContent(const SlotCopy& copy);

std::string sourceText(const PlanSlotHeader& header);
std::string slotHashText(const PlanSlotHeader& header);

}  // namespace optiflow::schedcache::detail
