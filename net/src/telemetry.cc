#include "optiflow/net/telemetry.h"

#include <algorithm>
#include <utility>

#include "optiflow/schedcache/reader.h"

namespace optiflow::net {
namespace {

// Where counts go when even a process-memory record cannot be allocated: the callers need a non-null record, and
// shared garbage counts are better than a crash in a training process.
NetCounters* sinkRecord() noexcept {
  static NetCounters sink{};
  return &sink;
}

}  // namespace

NetCounters* LocalTelemetry::find(std::deque<Named>* list, std::string_view name) {
  const auto it = std::find_if(list->begin(), list->end(), [&](const Named& n) { return n.name == name; });
  if (it != list->end()) return &it->counters;
  list->push_back(Named{std::string(name), NetCounters{}});
  return &list->back().counters;
}

NetCounters* LocalTelemetry::nic(std::string_view name) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    return find(&nics_, name);
  } catch (...) {
    return sinkRecord();
  }
}

NetCounters* LocalTelemetry::peer(std::string_view name) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    return find(&peers_, name);
  } catch (...) {
    return sinkRecord();
  }
}

int LocalTelemetry::railIndex(std::string_view ifname) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    const int count = railCount_.load(std::memory_order_relaxed);
    for (int i = 0; i < count; ++i) {
      if (rails_[static_cast<std::size_t>(i)].name == ifname) return i;
    }
    if (count == static_cast<int>(rails_.size())) return -1;
    rails_[static_cast<std::size_t>(count)].name = std::string(ifname);
    railCount_.store(count + 1, std::memory_order_release);
    return count;
  } catch (...) {
    return -1;
  }
}

std::uint32_t LocalTelemetry::railWeight(int index) noexcept {
  if (index < 0 || index >= railCount_.load(std::memory_order_acquire)) return 1;
  return rails_[static_cast<std::size_t>(index)].weight.load(std::memory_order_relaxed);
}

void LocalTelemetry::setWeight(std::string_view ifname, std::uint32_t weight) {
  const int index = railIndex(ifname);
  if (index >= 0) rails_[static_cast<std::size_t>(index)].weight.store(weight, std::memory_order_relaxed);
}

NetCounters LocalTelemetry::snapshotNic(std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot(*find(&nics_, name));
}

NetCounters LocalTelemetry::snapshotPeer(std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot(*find(&peers_, name));
}

NetCounters* CacheTelemetry::nic(std::string_view name) noexcept {
  NetCounters* shared = reader_ != nullptr ? reader_->netNic(name) : nullptr;
  return shared != nullptr ? shared : overflow_.nic(name);
}

NetCounters* CacheTelemetry::peer(std::string_view name) noexcept {
  NetCounters* shared = reader_ != nullptr ? reader_->netPeer(name) : nullptr;
  return shared != nullptr ? shared : overflow_.peer(name);
}

int CacheTelemetry::railIndex(std::string_view ifname) noexcept {
  return reader_ != nullptr ? reader_->railIndex(ifname) : -1;
}

std::uint32_t CacheTelemetry::railWeight(int index) noexcept {
  return reader_ != nullptr ? reader_->railWeight(index) : 1u;
}

}  // namespace optiflow::net
