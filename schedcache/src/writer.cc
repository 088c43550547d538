#include "optiflow/schedcache/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/interprocess/sync/file_lock.hpp>

#include "entry.h"
#include "segment.h"

namespace optiflow::schedcache {
namespace {

using detail::makeError;

template <typename T>
std::atomic_ref<T> ref(T& v) {
  return std::atomic_ref<T>(v);
}

// fcntl locks belong to the process, and closing any descriptor of the lock file drops them: writers of one process
// serialise on this mutex around every lock-file operation as well.
// A plain mutex taken by polling try_lock (acquire below): std::timed_mutex::try_lock_for waits in
// pthread_mutex_clocklock, which ThreadSanitizer does not intercept, so every later unlock looked like an unlock of
// an unlocked mutex. The writer's lock file is polled the same way.
std::mutex& processMutex() {
  static std::mutex m;
  return m;
}

mode_t segmentMode(const WriterOptions& options) { return options.group ? 0660 : 0600; }

// Sets the mode explicitly (umask would narrow the one given to open) and the group.
Error setOwnership(int fd, const std::string& path, const WriterOptions& options) {
  if (options.group && ::fchown(fd, static_cast<uid_t>(-1), *options.group) != 0) {
    return makeError(Status::kSystem,
                     path + ": fchown to group " + std::to_string(*options.group) + ": " + detail::errnoText(errno));
  }
  if (::fchmod(fd, segmentMode(options)) != 0) {
    return makeError(Status::kSystem, path + ": fchmod: " + detail::errnoText(errno));
  }
  return {};
}

Error openLockFile(const WriterOptions& options) {
  const std::string path = lockPath(options.ns);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, segmentMode(options));
  if (fd >= 0) {
    Error e = setOwnership(fd, path, options);
    ::close(fd);
    return e;
  }
  if (errno != EEXIST) return makeError(Status::kSystem, path + ": create: " + detail::errnoText(errno));
  return {};
}

void initHeader(SegmentHeader& h, const std::string& build) {
  std::memset(&h, 0, sizeof(h));
  h.magic = kMagic;
  h.layoutVersion = kLayoutVersion;
  h.headerBytes = sizeof(SegmentHeader);
  h.segmentBytes = sizeof(Segment);
  h.slotCount = kPlanSlots;
  h.entryCapacity = kMaxEntries;
  h.stringCapacity = kStringBytes;
  h.pinCapacity = kCommPins;
  std::memcpy(h.writerBuild, build.data(), std::min(build.size(), kBuildBytes - 1));
  h.headerChecksum = detail::headerChecksum(h);
  h.currentSlot = kNoSlot;
  h.generation = 0;
  h.createdNs = detail::realtimeNs();
}

enum class CreateResult { kCreated, kExists, kFailed };

// Builds the segment under a private name and links it into place, so nobody sees it half-initialised; link (unlike
// rename) fails when another process created the segment first.
CreateResult createSegment(const WriterOptions& options, detail::MappedSegment* out, Error* error) {
  const std::string path = segmentPath(options.ns);
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // left by an earlier process with our pid that died here
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, segmentMode(options));
  if (fd < 0) {
    *error = makeError(Status::kSystem, tmp + ": create: " + detail::errnoText(errno));
    return CreateResult::kFailed;
  }
  auto fail = [&](Error e) {
    ::unlink(tmp.c_str());
    *error = std::move(e);
    return CreateResult::kFailed;
  };
  if (Error e = setOwnership(fd, tmp, options); e.status != Status::kOk) {
    ::close(fd);
    return fail(std::move(e));
  }
  // Reserve the pages now: a full /dev/shm must fail here, not with SIGBUS in a reader touching a pin.
  if (const int rc = ::posix_fallocate(fd, 0, sizeof(Segment)); rc != 0) {
    ::close(fd);
    return fail(makeError(
        Status::kSystem, tmp + ": allocating " + std::to_string(sizeof(Segment)) + " bytes: " + detail::errnoText(rc)));
  }
  detail::MappedSegment mapped;
  if (Error e = mapped.map(fd, tmp); e.status != Status::kOk) return fail(std::move(e));
  initHeader(mapped.segment()->header, options.build);
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) return CreateResult::kExists;
    *error = makeError(Status::kSystem, path + ": link: " + detail::errnoText(err));
    return CreateResult::kFailed;
  }
  ::unlink(tmp.c_str());
  // The checks a reader makes, on what we just created.
  const int fd2 = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd2 < 0) {
    *error = makeError(Status::kSystem, path + ": open: " + detail::errnoText(errno));
    return CreateResult::kFailed;
  }
  *error = detail::checkAndMap(fd2, path, out);
  return error->status == Status::kOk ? CreateResult::kCreated : CreateResult::kFailed;
}

struct SlotImage {
  PlanSlotHeader header{};
  std::vector<PlanEntry> entries;
  std::vector<char> strings;
  std::vector<TrialEntry> trials;
};

void buildImage(const Plan& plan, std::uint64_t hash, std::uint64_t generation, SlotImage* image) {
  const auto& items = plan.items;
  std::vector<PlanEntry> entries(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) entries[i] = detail::toEntry(items[i]);
  // Sorted by NCCL's indices, as stored: the reader's order (and checkSlotContent's), not the vocabulary's.
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const PlanEntry& x = entries[a];
    const PlanEntry& y = entries[b];
    return std::tie(x.coll, x.nRanks, x.nNodes, x.minBytes) < std::tie(y.coll, y.nRanks, y.nNodes, y.minBytes);
  });
  std::unordered_map<std::string, std::uint32_t> offsets;
  auto intern = [&](const std::string& s) -> std::uint32_t {
    if (s.empty()) return kNoString;
    auto [it, inserted] = offsets.emplace(s, static_cast<std::uint32_t>(image->strings.size()));
    if (inserted) image->strings.insert(image->strings.end(), s.c_str(), s.c_str() + s.size() + 1);
    return it->second;
  };
  image->entries.assign(items.size(), PlanEntry{});
  for (std::size_t i = 0; i < order.size(); ++i) {
    const PlanItem& it = items[order[i]];
    PlanEntry& e = image->entries[i];
    e = entries[order[i]];
    e.jsonPath = intern(it.jsonPath);
    e.xmlPath = intern(it.xmlPath);
    if (!it.trials.empty()) {
      e.trialFirst = static_cast<std::uint32_t>(image->trials.size());
      e.trialCount = static_cast<std::uint8_t>(it.trials.size());
      e.trialCalls = static_cast<std::uint16_t>(it.trialCalls);
      for (const TrialCandidate& c : it.trials) image->trials.push_back(detail::toTrialEntry(c));
    }
  }
  PlanSlotHeader& h = image->header;
  h.contentHash = hash;
  h.generation = generation;
  h.publishedNs = detail::realtimeNs();
  h.entryCount = static_cast<std::uint32_t>(image->entries.size());
  h.stringBytes = static_cast<std::uint32_t>(image->strings.size());
  h.trialCount = static_cast<std::uint32_t>(image->trials.size());
  std::memcpy(h.source, plan.source.data(), std::min(plan.source.size(), kSourceBytes - 1));
  h.checksum = detail::slotChecksum(h, image->entries.data(), image->entries.size(), image->strings.data(),
                                    image->strings.size(), image->trials.data(), image->trials.size());
}

// Seqlock write: odd while anything changes, the checksum last, even again at the end. A writer that dies in
// between leaves the slot odd, which readers never use. entries == nullptr rewrites the header only.
void writeSlot(PlanSlot& slot, const PlanSlotHeader& header, const PlanEntry* entries, const char* strings,
               const TrialEntry* trials, void (*hook)()) {
  auto seq = ref(slot.header.seq);
  const std::uint64_t s = seq.load(std::memory_order_relaxed);
  const std::uint64_t odd = s % 2 == 0 ? s + 1 : s + 2;  // odd already: its writer died
  seq.store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);

  constexpr std::size_t kSeqBytes = sizeof(PlanSlotHeader::seq);
  PlanSlotHeader h = header;
  h.checksum = 0;
  std::memcpy(reinterpret_cast<char*>(&slot.header) + kSeqBytes, reinterpret_cast<const char*>(&h) + kSeqBytes,
              sizeof(PlanSlotHeader) - kSeqBytes);
  if (entries != nullptr) {
    const std::size_t n = header.entryCount;
    const std::size_t half = n / 2;
    if (half > 0) std::memcpy(slot.entries, entries, half * sizeof(PlanEntry));
    if (hook != nullptr) hook();
    if (n > half) std::memcpy(slot.entries + half, entries + half, (n - half) * sizeof(PlanEntry));
    if (header.stringBytes > 0) std::memcpy(slot.strings, strings, header.stringBytes);
    if (header.trialCount > 0) std::memcpy(slot.trials, trials, header.trialCount * sizeof(TrialEntry));
  }
  slot.header.checksum = header.checksum;
  seq.store(odd + 1, std::memory_order_release);
}

std::string describeHashes(const std::vector<std::uint64_t>& hashes) {
  std::string out;
  for (std::uint64_t h : hashes) out += (out.empty() ? "" : ", ") + formatHash(h);
  return out;
}

}  // namespace

struct Writer::Impl {
  WriterOptions options;
  detail::MappedSegment segment;
  std::unique_ptr<boost::interprocess::file_lock> lock;

  Segment& seg() { return *segment.segment(); }

  // Both the process mutex and the lock file; false with *error filled after lockTimeoutMs.
  class Guard {
   public:
    explicit Guard(Impl& impl) : impl_(impl) {}
    ~Guard() {
      if (fileLocked_) {
        try {
          impl_.lock->unlock();
        } catch (...) {
          // The lock goes with the descriptor at the latest when the writer is destroyed.
        }
      }
      if (mutexLocked_) processMutex().unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

    bool acquire(Error* error) {
      const auto timeout = std::chrono::milliseconds(std::max(0, impl_.options.lockTimeoutMs));
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      const std::string path = lockPath(impl_.options.ns);
      while (!processMutex().try_lock()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          *error = makeError(Status::kBusy, path + ": another writer of this process held it for " +
                                                std::to_string(timeout.count()) + " ms");
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      mutexLocked_ = true;
      for (;;) {
        if (impl_.lock->try_lock()) {
          fileLocked_ = true;
          return true;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      *error = makeError(Status::kBusy, path + ": another writer held it for " + std::to_string(timeout.count()) +
                                            " ms (optiflowd or `optiflow cache publish`)");
      return false;
    }

   private:
    Impl& impl_;
    bool mutexLocked_ = false;
    bool fileLocked_ = false;
  };
};

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Writer::~Writer() {
  // Closing the lock file's descriptor would drop a lock another writer of this process holds.
  std::lock_guard<std::mutex> guard(processMutex());
  impl_.reset();
}

std::unique_ptr<Writer> Writer::open(const WriterOptions& options, Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  err = {};
  try {
    if (!validNamespace(options.ns)) {
      err = makeError(Status::kBadNamespace, "namespace '" + options.ns + "' is not 1-64 characters of [A-Za-z0-9_.-]");
      return nullptr;
    }
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    {
      std::lock_guard<std::mutex> guard(processMutex());
      if (err = openLockFile(options); err.status != Status::kOk) return nullptr;
      impl->lock = std::make_unique<boost::interprocess::file_lock>(lockPath(options.ns).c_str());
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
      err = detail::openSegment(options.ns, &impl->segment);
      if (err.status == Status::kOk) return std::unique_ptr<Writer>(new Writer(std::move(impl)));
      if (err.status != Status::kAbsent) return nullptr;  // refused, never overwritten
      err = {};
      switch (createSegment(options, &impl->segment, &err)) {
        case CreateResult::kCreated:
          return std::unique_ptr<Writer>(new Writer(std::move(impl)));
        case CreateResult::kExists:
          continue;  // another process created it first: attach to theirs
        case CreateResult::kFailed:
          return nullptr;
      }
    }
    err = makeError(Status::kSystem, segmentPath(options.ns) + ": created and removed repeatedly by others");
  } catch (const std::exception& e) {
    err = makeError(Status::kSystem, segmentPath(options.ns) + ": " + e.what());
  } catch (...) {
    err = makeError(Status::kSystem, segmentPath(options.ns) + ": unknown exception");
  }
  return nullptr;
}

std::optional<PublishResult> Writer::publish(const Plan& plan, Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  err = {};
  const std::string path = segmentPath(impl_->options.ns);
  try {
    if (std::string why = validatePlan(plan); !why.empty()) {
      err = makeError(Status::kInvalidPlan, why);
      return std::nullopt;
    }
    Impl::Guard guard(*impl_);
    if (!guard.acquire(&err)) return std::nullopt;
    Segment& seg = impl_->seg();
    const std::uint64_t hash = contentHash(plan);
    const std::uint32_t cur = ref(seg.header.currentSlot).load(std::memory_order_acquire);
    const std::uint64_t generation = ref(seg.header.generation).load(std::memory_order_acquire);

    detail::SlotCopy copy;
    std::string why;
    if (cur < kPlanSlots && detail::readSlot(seg.slots[cur], &copy, &why, 1) == detail::SlotState::kComplete &&
        copy.header.contentHash == hash) {
      return PublishResult{hash, cur, generation, true};
    }

    // Plans that communicators initialising now have pinned must stay where they are.
    const std::int64_t now = detail::realtimeNs();
    std::unordered_set<std::uint64_t> pinned;
    for (CommPin& pin : seg.pins) {
      if (ref(pin.commId).load(std::memory_order_acquire) == 0) continue;
      const std::uint64_t h = ref(pin.planHash).load(std::memory_order_acquire);
      const std::int64_t stamp = ref(pin.stampNs).load(std::memory_order_acquire);
      if (h != kPinPending && h != kPinNoPlan && pinIsYoung(stamp, now)) pinned.insert(h);
    }

    std::uint32_t reuse = kNoSlot;
    std::uint32_t target = kNoSlot;
    std::uint64_t targetAge = 0;
    std::vector<std::uint64_t> pinnedHere;
    for (std::uint32_t s = 0; s < kPlanSlots && reuse == kNoSlot; ++s) {
      if (s == cur) continue;
      PlanSlotHeader h{};
      const detail::SlotState state = detail::peekSlot(seg.slots[s], &h, 1);
      std::uint64_t age = 0;  // free and abandoned slots first, then the oldest generation
      if (state == detail::SlotState::kComplete) {
        if (h.contentHash == hash && detail::readSlot(seg.slots[s], &copy, &why, 1) == detail::SlotState::kComplete) {
          reuse = s;
          break;
        }
        if (pinned.count(h.contentHash) != 0) {
          pinnedHere.push_back(h.contentHash);
          continue;
        }
        age = h.generation + 1;
      }
      if (target == kNoSlot || age < targetAge) {
        target = s;
        targetAge = age;
      }
    }

    const std::uint64_t newGeneration = generation + 1;
    std::uint32_t slot;
    if (reuse != kNoSlot) {
      // Same decisions already in a slot: refresh its header (generation, time, source) and make it current.
      PlanSlotHeader h = copy.header;
      h.generation = newGeneration;
      h.publishedNs = now;
      std::memset(h.source, 0, sizeof(h.source));
      std::memcpy(h.source, plan.source.data(), std::min(plan.source.size(), kSourceBytes - 1));
      h.checksum = detail::slotChecksum(h, copy.entries.data(), copy.entries.size(), copy.strings.data(),
                                        copy.strings.size(), copy.trials.data(), copy.trials.size());
      writeSlot(seg.slots[reuse], h, nullptr, nullptr, nullptr, nullptr);
      slot = reuse;
    } else if (target != kNoSlot) {
      SlotImage image;
      buildImage(plan, hash, newGeneration, &image);
      writeSlot(seg.slots[target], image.header, image.entries.data(), image.strings.data(), image.trials.data(),
                midWriteHook_);
      slot = target;
    } else {
      err = makeError(Status::kBusy, path +
                                         ": every slot but the current one holds a plan that a communicator pinned "
                                         "less than " +
                                         std::to_string(kPinAdoptWindowS) + " s ago (" + describeHashes(pinnedHere) +
                                         "); publish again later");
      return std::nullopt;
    }
    ref(seg.header.currentSlot).store(slot, std::memory_order_release);
    ref(seg.header.generation).store(newGeneration, std::memory_order_release);
    return PublishResult{hash, slot, newGeneration, false};
  } catch (const std::exception& e) {
    err = makeError(Status::kSystem, path + ": publish: " + e.what());
  } catch (...) {
    err = makeError(Status::kSystem, path + ": publish: unknown exception");
  }
  return std::nullopt;
}

bool Writer::clear(Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  err = {};
  try {
    Impl::Guard guard(*impl_);
    if (!guard.acquire(&err)) return false;
    Segment& seg = impl_->seg();
    ref(seg.header.currentSlot).store(kNoSlot, std::memory_order_release);
    const std::uint64_t g = ref(seg.header.generation).load(std::memory_order_acquire);
    ref(seg.header.generation).store(g + 1, std::memory_order_release);
    return true;
  } catch (const std::exception& e) {
    err = makeError(Status::kSystem, segmentPath(impl_->options.ns) + ": clear: " + e.what());
  } catch (...) {
    err = makeError(Status::kSystem, segmentPath(impl_->options.ns) + ": clear: unknown exception");
  }
  return false;
}

namespace {

// Striping multiplies message sizes by weights: this bound keeps that far from overflow and is already a
// 10^6:1 ratio between rails.
constexpr std::uint32_t kMaxRailWeight = 1'000'000;
constexpr std::size_t kRailNameBytes = sizeof(NetRailWeight::name);

bool validRailName(const std::string& name) {
  if (name.empty() || name.size() >= kRailNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == ':' || c == '-';
  });
}

std::string railNameOf(const NetRailWeight& rail) {
  char name[kRailNameBytes];
  for (std::size_t i = 0; i < kRailNameBytes; ++i) {
    name[i] = std::atomic_ref<char>(const_cast<char&>(rail.name[i])).load(std::memory_order_relaxed);
  }
  name[kRailNameBytes - 1] = '\0';
  return name;
}

}  // namespace

bool Writer::setRailWeights(const std::vector<std::pair<std::string, std::uint32_t>>& weights, Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  err = {};
  const std::string path = segmentPath(impl_->options.ns);
  try {
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const auto& [name, weight] = weights[i];
      if (!validRailName(name)) {
        err = makeError(Status::kInvalidPlan, "rail weight " + std::to_string(i + 1) + ": interface name '" + name +
                                                  "': expected 1 to " + std::to_string(kRailNameBytes - 1) +
                                                  " characters of A-Z a-z 0-9 _ . : -");
        return false;
      }
      if (weight > kMaxRailWeight) {
        err = makeError(Status::kInvalidPlan, "rail weight " + std::to_string(i + 1) + " (" + name + "): weight " +
                                                  std::to_string(weight) + ": expected 0 to " +
                                                  std::to_string(kMaxRailWeight));
        return false;
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (weights[j].first == name) {
          err = makeError(Status::kInvalidPlan, "rail weight " + std::to_string(i + 1) + ": interface '" + name +
                                                    "' is given twice (also as rail weight " + std::to_string(j + 1) +
                                                    ")");
          return false;
        }
      }
    }
    Impl::Guard guard(*impl_);
    if (!guard.acquire(&err)) return false;
    NetRegion& net = impl_->seg().net;
    // Under the writer lock nobody else changes the names: plain reads of our own earlier writes are enough.
    const std::uint32_t count = std::min(ref(net.railCount).load(std::memory_order_relaxed), kNetRails);
    std::vector<std::string> existing;
    for (std::uint32_t i = 0; i < count; ++i) existing.push_back(railNameOf(net.rails[i]));
    std::vector<std::pair<std::uint32_t, std::uint32_t>> updates;  // record index, weight
    std::vector<std::string> added;
    for (const auto& [name, weight] : weights) {
      const auto it = std::find(existing.begin(), existing.end(), name);
      if (it != existing.end()) {
        updates.emplace_back(static_cast<std::uint32_t>(it - existing.begin()), weight);
        continue;
      }
      if (count + added.size() >= kNetRails) {
        std::string names;
        for (const std::string& e : existing) names += (names.empty() ? "" : ", ") + e;
        err = makeError(Status::kBusy, path + ": no free rail record for '" + name + "': all " +
                                           std::to_string(kNetRails) + " hold interfaces (" + names +
                                           "); records are never reused while plugins may hold their index "
                                           "(`optiflow cache clear --remove` starts a new segment)");
        return false;
      }
      updates.emplace_back(static_cast<std::uint32_t>(count + added.size()), weight);
      added.push_back(name);
    }

    // Seqlock over the names (readers resolve an interface to its record under it). Weights are single atomic
    // stores that readers load relaxed on every message; they change inside the same window.
    auto seq = ref(net.railSeq);
    const std::uint64_t s = seq.load(std::memory_order_relaxed);
    const std::uint64_t odd = s % 2 == 0 ? s + 1 : s + 2;  // odd already: its writer died
    seq.store(odd, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t a = 0; a < added.size(); ++a) {
      NetRailWeight& rail = net.rails[count + a];
      ref(rail.weight).store(0, std::memory_order_relaxed);
      for (std::size_t i = 0; i < kRailNameBytes; ++i) {
        ref(rail.name[i]).store(i < added[a].size() ? added[a][i] : '\0', std::memory_order_relaxed);
      }
    }
    const std::uint32_t newCount = count + static_cast<std::uint32_t>(added.size());
    ref(net.railCount).store(newCount, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < newCount; ++i) {
      std::uint32_t weight = 0;  // not listed: unused
      for (const auto& [index, w] : updates) {
        if (index == i) weight = w;
      }
      ref(net.rails[i].weight).store(weight, std::memory_order_relaxed);
    }
    seq.store(odd + 1, std::memory_order_release);
    return true;
  } catch (const std::exception& e) {
    err = makeError(Status::kSystem, path + ": setting rail weights: " + e.what());
  } catch (...) {
    err = makeError(Status::kSystem, path + ": setting rail weights: unknown exception");
  }
  return false;
}

bool Writer::remove(std::string_view ns, Error* error) noexcept {
  Error local;
  Error& err = error != nullptr ? *error : local;
  err = {};
  try {
    if (!validNamespace(ns)) {
      err = makeError(Status::kBadNamespace,
                      "namespace '" + std::string(ns) + "' is not 1-64 characters of [A-Za-z0-9_.-]");
      return false;
    }
    for (const std::string& path : {segmentPath(ns), lockPath(ns)}) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        err = makeError(Status::kSystem, path + ": unlink: " + detail::errnoText(errno));
        return false;
      }
    }
    return true;
  } catch (...) {
    err = makeError(Status::kSystem, segmentPath(ns) + ": remove: unexpected exception");
  }
  return false;
}

}  // namespace optiflow::schedcache
