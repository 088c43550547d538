#include "optiflow/schedcache/error.h"

#include <string>
#include <string_view>

namespace optiflow::schedcache {

std::string_view toString(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kBadNamespace:
      return "bad namespace";
    case Status::kAbsent:
      return "absent";
    case Status::kNotOwner:
      return "not owner";
    case Status::kBadPermissions:
      return "bad permissions";
    case Status::kBadMagic:
      return "bad magic";
    case Status::kBadVersion:
      return "bad version";
    case Status::kBadSize:
      return "bad size";
    case Status::kBadHeader:
      return "bad header";
    case Status::kNoPlan:
      return "no plan";
    case Status::kNotFound:
      return "not found";
    case Status::kTorn:
      return "torn";
    case Status::kBadChecksum:
      return "bad checksum";
    case Status::kBusy:
      return "busy";
    case Status::kInvalidPlan:
      return "invalid plan";
    case Status::kPinTableFull:
      return "pin table full";
    case Status::kSystem:
      return "system error";
  }
  return "unknown";
}

bool validNamespace(std::string_view ns) {
  if (ns.empty() || ns.size() > 64) return false;
  for (char c : ns) {
    const bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string segmentName(std::string_view ns) { return "optiflow-" + std::string(ns); }

std::string segmentPath(std::string_view ns) { return "/dev/shm/" + segmentName(ns); }

std::string lockPath(std::string_view ns) { return segmentPath(ns) + ".lock"; }

}  // namespace optiflow::schedcache
