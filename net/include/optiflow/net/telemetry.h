// Where the transports count bytes, messages, busy time and stalls, and where the sender reads rail weights. The
// plugin gives them a CacheTelemetry (records in the node's schedule cache, read by optiflowd); tests and processes
// without a cache get a LocalTelemetry (records in process memory, equal weights). A transport resolves its records
// once per connection; on the data path it only does relaxed atomic adds and loads (the helpers below).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "optiflow/schedcache/layout.h"

namespace optiflow::schedcache {
class Reader;
}

namespace optiflow::net {

using schedcache::NetCounters;

class Telemetry {
 public:
  virtual ~Telemetry() = default;
  // Never null: a record in process memory when the shared table is full or absent.
  virtual NetCounters* nic(std::string_view name) noexcept = 0;
  virtual NetCounters* peer(std::string_view name) noexcept = 0;
  // -1 when interface ifname has no weight record (it then counts as weight 1).
  virtual int railIndex(std::string_view ifname) noexcept = 0;
  virtual std::uint32_t railWeight(int index) noexcept = 0;
};

// Process-memory records; weights (default 1) set through setWeight (index = order of first use, at most
// kNetRails names; later names get -1, i.e. weight 1).
class LocalTelemetry final : public Telemetry {
 public:
  NetCounters* nic(std::string_view name) noexcept override;
  NetCounters* peer(std::string_view name) noexcept override;
  int railIndex(std::string_view ifname) noexcept override;
  std::uint32_t railWeight(int index) noexcept override;
  void setWeight(std::string_view ifname, std::uint32_t weight);
  NetCounters snapshotNic(std::string_view name);
  NetCounters snapshotPeer(std::string_view name);

 private:
  struct Named {
    std::string name;
    NetCounters counters{};
  };
  NetCounters* find(std::deque<Named>* list, std::string_view name);
  struct Rail {
    std::string name;  // written under mutex_ before count_ publishes it
    std::atomic<std::uint32_t> weight{1};
  };
  std::mutex mutex_;
  std::deque<Named> nics_, peers_;  // deque: records never move
  // Fixed array: railWeight (every message) is one atomic load, no lock.
  std::array<Rail, schedcache::kNetRails> rails_;
  std::atomic<int> railCount_{0};
};

// Records in the node's schedule cache (NetRegion of /dev/shm/optiflow-<ns>), falling back to local records when
// the table is full. The Reader must outlive this.
class CacheTelemetry final : public Telemetry {
 public:
  explicit CacheTelemetry(schedcache::Reader* reader) : reader_(reader) {}
  NetCounters* nic(std::string_view name) noexcept override;
  NetCounters* peer(std::string_view name) noexcept override;
  int railIndex(std::string_view ifname) noexcept override;
  std::uint32_t railWeight(int index) noexcept override;

 private:
  schedcache::Reader* reader_;
  LocalTelemetry overflow_;
};

// Data-path helpers: relaxed atomic adds on a record (shared memory or local).
inline void countAdd(std::uint64_t* field, std::uint64_t value) noexcept {
  std::atomic_ref<std::uint64_t>(*field).fetch_add(value, std::memory_order_relaxed);
}
inline void countSent(NetCounters* c, std::uint64_t bytes) noexcept {
  countAdd(&c->bytesSent, bytes);
  countAdd(&c->msgsSent, 1);
  countAdd(&c->sizeLog2[schedcache::sizeBucket(bytes)], 1);
}
inline void countRecv(NetCounters* c, std::uint64_t bytes) noexcept {
  countAdd(&c->bytesRecv, bytes);
  countAdd(&c->msgsRecv, 1);
}
inline NetCounters snapshot(const NetCounters& c) noexcept {
  NetCounters out{};
  const auto* src = reinterpret_cast<const std::uint64_t*>(&c);
  auto* dst = reinterpret_cast<std::uint64_t*>(&out);
  for (std::size_t i = 0; i < sizeof(NetCounters) / 8; ++i) {
    dst[i] = std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(src[i])).load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace optiflow::net
