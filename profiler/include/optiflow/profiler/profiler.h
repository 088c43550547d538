// The profiler's timing of collectives, in plain C++ (no NCCL types): the plugin layer (plugin/src/profiler_*.cc)
// turns NCCL's profiler events into these calls.
//
// NCCL's order of events for one collective (docs/profiler.md): on the enqueuing thread, startEvent(Coll) and, once
// the kernel is *enqueued* (not run), stopEvent(Coll); later, on the proxy thread, per channel, startEvent(KernelCh)
// with the collective's handle as parent and the GPU start stamp, recordEventState(KernelChStop) with the stop stamp,
// stopEvent. Several collectives are in flight at once. So a collective's record outlives its stopEvent until every
// channel it announced has reported; whichever of the two threads releases the last hold records the collective.
//
// Everything lives in fixed pools sized when the Recorder is created; an event costs a few atomic operations on the
// pools and, when a collective completes, a few relaxed atomic adds in the shared segment: no allocation, no lock,
// no system call. A full pool, an event naming a handle the Recorder never gave out, or a collective whose channels
// did not all report GPU stamps is counted, never fatal.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"

namespace optiflow::profiler {

// What NCCL's collective event says, in our words.
struct CollEvent {
  core::Collective coll = core::Collective::AllReduce;
  std::uint64_t sizeBytes = 0;  // nccl-tests size: the whole buffer
  std::int8_t algorithm = -1;   // NCCL_ALGO_* index, -1 when NCCL named one we do not know
  std::int8_t protocol = -1;    // NCCL_PROTO_* index
  std::uint32_t channels = 0;   // kernel-channel events NCCL will report for it
};

// One communicator's view: where its measurements go. Without a segment (reader null) it records nothing.
class Comm {
 public:
  Comm(std::uint64_t commId, std::unique_ptr<schedcache::Reader> reader) noexcept;
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  std::uint64_t commId() const noexcept { return commId_; }
  bool recording() const noexcept { return reader_ != nullptr; }
  schedcache::Reader* reader() const noexcept { return reader_.get(); }
  // The segment record for a configuration; a small direct-mapped cache in front of the segment's table, safe from
  // any thread (entries are atomic pointers whose record keys never change once claimed). nullptr: table full.
  schedcache::MeasureRecord* record(const CollEvent& e) noexcept;

 private:
  static constexpr std::size_t kCacheEntries = 64;
  std::uint64_t commId_;
  std::unique_ptr<schedcache::Reader> reader_;
  std::atomic<schedcache::MeasureRecord*> cache_[kCacheEntries] = {};
};

enum class HandleKind { kNone, kColl, kKernelCh, kForeign };

class Recorder {
 public:
  static constexpr std::size_t kDefaultCollRecords = 4096;      // collectives in flight in one process
  static constexpr std::size_t kDefaultChannelRecords = 16384;  // kernel-channel events in flight in one process

  Recorder(std::size_t collRecords = kDefaultCollRecords, std::size_t channelRecords = kDefaultChannelRecords);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // startEvent(Coll): a handle for the collective, nullptr when it cannot be timed (no segment, no channels, the
  // pool is full: counted).
  void* startColl(Comm* comm, const CollEvent& event) noexcept;
  // startEvent(KernelCh) with its parent (the collective's handle) and the GPU start stamp (ns); nullptr when the
  // parent is not a collective in flight (counted as foreign) or the channel pool is full.
  void* startKernelCh(void* parent, std::uint64_t startNs) noexcept;
  // recordEventState(KernelChStop): the GPU stop stamp (ns).
  void kernelChStop(void* handle, std::uint64_t stopNs) noexcept;
  // stopEvent of any handle this Recorder gave out; null is ignored, anything else counted as foreign.
  void stopEvent(void* handle) noexcept;
  HandleKind kindOf(const void* handle) const noexcept;

  // At a communicator's finalize (NCCL sends no more events for it): records of `comm` still waiting for channels
  // are released as untimed. Then adds the process's counters since the last call into `comm`'s segment.
  void finalizeComm(Comm* comm) noexcept;

  struct Counters {
    std::uint64_t timed = 0;
    std::uint64_t untimed = 0;
    std::uint64_t poolFull = 0;
    std::uint64_t tableFull = 0;
    std::uint64_t foreign = 0;
  };
  Counters counters() const noexcept;  // since creation (finalizeComm does not reset them)
  std::size_t collRecordsInUse() const noexcept;

 private:
  struct CollRecord;
  struct ChannelRecord;
  void collDone(CollRecord& r, std::uint64_t expected) noexcept;
  bool release(CollRecord& r, std::uint64_t clearBits, bool channelDone) noexcept;
  void complete(CollRecord& r) noexcept;
  CollRecord* collOf(const void* handle) const noexcept;
  ChannelRecord* channelOf(const void* handle) const noexcept;

  std::size_t collCount_;
  std::size_t channelCount_;
  std::unique_ptr<CollRecord[]> colls_;
  std::unique_ptr<ChannelRecord[]> channels_;
  std::atomic<std::uint64_t> collCursor_{0};
  std::atomic<std::uint64_t> channelCursor_{0};
  std::atomic<std::uint64_t> timed_{0};
  std::atomic<std::uint64_t> untimed_{0};
  std::atomic<std::uint64_t> poolFull_{0};
  std::atomic<std::uint64_t> tableFull_{0};
  std::atomic<std::uint64_t> foreign_{0};
  // What finalizeComm already added into a segment.
  std::atomic<std::uint64_t> flushedUntimed_{0};
  std::atomic<std::uint64_t> flushedPoolFull_{0};
  std::atomic<std::uint64_t> flushedTableFull_{0};
  std::atomic<std::uint64_t> flushedForeign_{0};
};

// NCCL's strings in the collective event, without allocating: the function ("AllReduce", ...), the algorithm
// ("Ring", "NVLS", ...: the NCCL index, -1 when unknown), the protocol, and the element size of a datatype
// ("ncclFloat32" -> 4; 0 when unknown).
bool collectiveFromNcclName(const char* func, core::Collective* out) noexcept;
std::int8_t algorithmFromNcclName(const char* algo) noexcept;
std::int8_t protocolFromNcclName(const char* proto) noexcept;
std::uint32_t datatypeBytes(const char* datatype) noexcept;
// The nccl-tests size (the whole buffer) from NCCL's count argument: per rank for AllGather, ReduceScatter and
// AlltoAll (count x type size x ranks), the whole buffer for the others.
std::uint64_t ncclTestsBytes(core::Collective coll, std::uint64_t count, std::uint32_t typeBytes,
                             std::uint32_t nRanks) noexcept;

}  // namespace optiflow::profiler
