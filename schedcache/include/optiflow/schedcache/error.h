#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace optiflow::schedcache {

enum class Status {
  kOk,
  kBadNamespace,    // not [A-Za-z0-9_.-]{1,64}
  kAbsent,          // no segment for the namespace
  kNotOwner,        // the segment belongs to another user
  kBadPermissions,  // world-writable (or otherwise not what we create)
  kBadMagic,        // not an OptiFlow segment (garbage)
  kBadVersion,      // another layout version
  kBadSize,         // size or capacities differ from this build's layout
  kBadHeader,       // header checksum mismatch
  kNoPlan,          // nothing published (or cleared)
  kNotFound,        // no slot holds the requested plan hash
  kTorn,            // the slot kept changing while read (a writer reused it)
  kBadChecksum,     // a slot's content does not match its checksum
  kBusy,            // the writer lock is held by another process, or every slot is in use
  kInvalidPlan,     // validatePlan refused it
  kPinTableFull,
  kSystem,  // an OS call failed (message has errno text)
};

std::string_view toString(Status s);

struct Error {
  Status status = Status::kOk;
  std::string message;  // says what was found and what was expected, names the segment
};

// "optiflow-<ns>" (a name under /dev/shm); false when ns is not [A-Za-z0-9_.-]{1,64}.
bool validNamespace(std::string_view ns);
// CLOCK_REALTIME in ns: the clock of every time stored in the segment (pins, publishes, creation).
std::int64_t realtimeNs() noexcept;
std::string segmentName(std::string_view ns);
std::string segmentPath(std::string_view ns);  // /dev/shm/optiflow-<ns>
std::string lockPath(std::string_view ns);     // /dev/shm/optiflow-<ns>.lock

}  // namespace optiflow::schedcache
