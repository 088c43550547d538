// Publishing into a namespace's segment (the CLI's `cache publish|clear` and optiflowd). One writer at a time per
// namespace, serialised by an fcntl lock on /dev/shm/optiflow-<ns>.lock that the kernel drops when a writer dies.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optiflow/schedcache/error.h"
#include "optiflow/schedcache/plan.h"

namespace optiflow::schedcache {

struct WriterOptions {
  std::string ns = "default";
  std::optional<gid_t> group;  // segment mode 0660 with this group; otherwise 0600
  std::string build;           // recorded in the header of a segment this writer creates
  int lockTimeoutMs = 5000;    // how long publish/clear wait for another writer
};

struct PublishResult {
  std::uint64_t hash = 0;
  std::uint32_t slot = kNoSlot;
  std::uint64_t generation = 0;
  bool unchanged = false;  // the plan was already current: nothing written
};

class Writer {
 public:
  // Creates the segment (exclusively, with the mode above, sized and initialised before it is visible under its
  // name) or attaches to an existing one after the same checks as Reader::attach. A segment that fails them is
  // refused, never overwritten: `optiflow cache clear --remove` deletes it.
  static std::unique_ptr<Writer> open(const WriterOptions& options, Error* error) noexcept;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Validates the plan, writes it into a slot that is neither current nor named by a pin younger than
  // kPinAdoptWindowS (oldest first), then makes it current. Publishing the current plan again is a no-op.
  std::optional<PublishResult> publish(const Plan& plan, Error* error) noexcept;
  // No plan is current afterwards (new communicators get NCCL's defaults); slots keep their content.
  bool clear(Error* error) noexcept;
  // Deletes the segment and its lock file (communicators that attached keep their mapping). Does not look at pins:
  // callers that serve running jobs check Reader::pins() first (the remaining ranks of a communicator that is
  // initialising would find no cache while its first ranks use a plan; `optiflow cache clear --remove` refuses).
  static bool remove(std::string_view ns, Error* error) noexcept;

  // Replaces the rail weights (interface name -> weight) under the writer lock. Names already present keep their
  // record (a plugin that resolved the index keeps reading the right weight); new names take free records; names not
  // listed get weight 0 and keep their record. kInvalidPlan-style refusal (status kBusy for a full table,
  // kInvalidPlan for a bad name: empty, longer than 15 bytes, or not [A-Za-z0-9_.:-]) with a message naming it.
  bool setRailWeights(const std::vector<std::pair<std::string, std::uint32_t>>& weights, Error* error) noexcept;

  // For tests of torn and interrupted writes: calls hook() after the slot is marked odd and half its entries are
  // written, before the checksum and before it becomes current.
  void setMidWriteHookForTest(void (*hook)()) noexcept { midWriteHook_ = hook; }

 private:
  struct Impl;
  explicit Writer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  void (*midWriteHook_)() = nullptr;
};

}  // namespace optiflow::schedcache
