// libFuzzer target: the schedule cache reader over a garbage or hostile segment. Once per process a Writer creates
// the namespace "fuzz-<pid>" and publishes a small valid plan; every input then patches bytes of that segment (the
// header, the first pins, and the current slot's header, entries and strings) and runs what the plugins and
// `optiflow cache show|verify` run: Reader::attach, current, plans, check, loadComm, loadPlan, pins, activity and
// CommPlan::find. None of them may crash or read out of bounds (ASan/UBSan), a refusal must say why, and what the
// reader hands out must keep its promises (CommPlan sorted and disjoint, find inside the range it returns).
//
// Input: byte 0 holds flags, then records of 5 bytes (u32 little-endian offset, u8 value), each setting one byte of
// the patch region (offset modulo its size: header, pins[0..8), slot header, used entries, used strings).
//   bit 0: afterwards recompute the slot checksum and the header checksum, so inputs get past the CRCs to the
//          content and bounds checks behind them
//   bit 1: keep an odd sequence counter (otherwise its low bit is cleared: an odd slot only makes the reader back
//          off for ~13 ms per read, which would slow the whole run down)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/vocabulary.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"
#include "segment.h"  // schedcache/src: detail::slotChecksum, detail::headerChecksum

namespace {

namespace core = optiflow::core;
namespace sc = optiflow::schedcache;

constexpr std::uint8_t kRecomputeChecksums = 1;
constexpr std::uint8_t kKeepOddSeq = 2;
constexpr std::size_t kPatchedPins = 8;

struct Fixture {
  std::string ns;
  sc::Segment* segment = nullptr;  // our own MAP_SHARED mapping of the segment file
  std::uint32_t slot = sc::kNoSlot;
  std::uint64_t hash = 0;
  std::vector<std::size_t> offsets;     // patch region byte -> offset in the segment
  std::vector<unsigned char> pristine;  // the patch region's bytes as published
  bool verbose = false;
};

Fixture* gFixture = nullptr;

[[noreturn]] void fail(const char* what, const std::string& message) {
  std::fprintf(stderr, "fuzz_segment: %s: %s\n", what, message.c_str());
  std::abort();
}

void removeNamespace() {
  if (gFixture == nullptr) return;
  sc::Error err;
  if (!sc::Writer::remove(gFixture->ns, &err)) std::fprintf(stderr, "fuzz_segment: %s\n", err.message.c_str());
}

sc::PlanItem item(core::Collective coll, std::uint32_t ranks, std::uint32_t nodes, std::uint64_t minBytes,
                  std::uint64_t maxBytes, std::optional<core::Algorithm> algorithm,
                  std::optional<core::Protocol> protocol, std::int32_t channels, std::uint64_t chunk,
                  const char* json = "", const char* xml = "") {
  sc::PlanItem it;
  it.coll = coll;
  it.nRanks = ranks;
  it.nNodes = nodes;
  it.minBytes = minBytes;
  it.maxBytes = maxBytes;
  it.algorithm = algorithm;
  it.protocol = protocol;
  it.nChannels = channels;
  it.chunkBytes = chunk;
  it.nativeUs = 12.5f;
  it.bestUs = *json != '\0' ? 9.25f : 0.0f;
  it.boundUs = 0.5f;
  it.ncclUs = 13.0f;
  it.scheduleId = *json != '\0' ? 0x1234567890abcdefULL : 0;
  it.jsonPath = json;
  it.xmlPath = xml;
  return it;
}

void addRange(Fixture& f, std::size_t offset, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) f.offsets.push_back(offset + i);
}

Fixture& fixture() {
  if (gFixture != nullptr) return *gFixture;
  auto* f = new Fixture;
  f->ns = "fuzz-" + std::to_string(::getpid());
  sc::Error err;
  sc::Writer::remove(f->ns, nullptr);  // a leftover of a crashed run with the same pid
  gFixture = f;
  std::atexit(removeNamespace);
  {
    sc::WriterOptions options;
    options.ns = f->ns;
    options.build = "fuzz";
    auto writer = sc::Writer::open(options, &err);
    if (!writer) fail("Writer::open", err.message);
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    using C = core::Collective;
    using A = core::Algorithm;
    using P = core::Protocol;
    sc::Plan plan;
    plan.source = "/fuzz/run";
    plan.items = {
        item(C::AllReduce, 8, 1, 0, 65535, A::Ring, P::LL, 2, 0, "/fuzz/ar.json", "/fuzz/ar.xml"),
        item(C::AllReduce, 8, 1, 65536, kMax, A::Tree, P::Simple, 8, 131072),
        item(C::AllGather, 8, 1, 0, 4095, std::nullopt, std::nullopt, 0, 0, "/fuzz/ag.json", "/fuzz/ar.xml"),
        item(C::AllGather, 8, 1, 4096, 1ULL << 30, A::Nvls, P::LL128, 16, 0),
        item(C::ReduceScatter, 16, 2, 1, 1023, A::Pat, P::Simple, 1, 0, "/fuzz/rs.json", "/fuzz/rs.xml"),
        item(C::Broadcast, 16, 2, 0, kMax, A::CollNetDirect, P::Simple, 4, 0),
    };
    auto published = writer->publish(plan, &err);
    if (!published) fail("Writer::publish", err.message);
    f->slot = published->slot;
    f->hash = published->hash;
    if (!writer->setRailWeights({{"eth0", 3}, {"eth1", 1}, {"ib0", 0}}, &err)) fail("setRailWeights", err.message);
  }
  const std::string path = sc::segmentPath(f->ns);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("open", path);
  void* addr = ::mmap(nullptr, sizeof(sc::Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) fail("mmap", path);
  f->segment = static_cast<sc::Segment*>(addr);
  if (f->slot >= sc::kPlanSlots) fail("publish", "slot out of range");

  const sc::PlanSlot& slot = f->segment->slots[f->slot];
  addRange(*f, offsetof(sc::Segment, header), sizeof(sc::SegmentHeader));
  addRange(*f, offsetof(sc::Segment, pins), kPatchedPins * sizeof(sc::CommPin));
  const auto slotOffset =
      static_cast<std::size_t>(reinterpret_cast<const char*>(&slot) - reinterpret_cast<const char*>(f->segment));
  addRange(*f, slotOffset, sizeof(sc::PlanSlotHeader));
  addRange(*f, slotOffset + offsetof(sc::PlanSlot, entries), slot.header.entryCount * sizeof(sc::PlanEntry));
  addRange(*f, slotOffset + offsetof(sc::PlanSlot, strings), slot.header.stringBytes);
  // The net region last, whole, so claims made by one input are undone before the next.
  addRange(*f, offsetof(sc::Segment, net), sizeof(sc::NetRegion));
  const auto* bytes = reinterpret_cast<const unsigned char*>(f->segment);
  for (std::size_t off : f->offsets) f->pristine.push_back(bytes[off]);
  f->verbose = std::getenv("OPTIFLOW_FUZZ_SEGMENT_VERBOSE") != nullptr;
  if (f->verbose) {
    // For writing seeds: where the parts of the patch region start (and, per input, what the reader said).
    std::fprintf(stderr,
                 "fuzz_segment: slot %u, patch region %zu bytes: header 0, pins %zu, slot header %zu, entries %zu "
                 "(%u), strings %zu (%u bytes)\n",
                 f->slot, f->offsets.size(), sizeof(sc::SegmentHeader),
                 sizeof(sc::SegmentHeader) + kPatchedPins * sizeof(sc::CommPin),
                 sizeof(sc::SegmentHeader) + kPatchedPins * sizeof(sc::CommPin) + sizeof(sc::PlanSlotHeader),
                 slot.header.entryCount,
                 sizeof(sc::SegmentHeader) + kPatchedPins * sizeof(sc::CommPin) + sizeof(sc::PlanSlotHeader) +
                     slot.header.entryCount * sizeof(sc::PlanEntry),
                 slot.header.stringBytes);
  }
  return *f;
}

void restore(Fixture& f) {
  auto* bytes = reinterpret_cast<unsigned char*>(f.segment);
  for (std::size_t i = 0; i < f.offsets.size(); ++i) bytes[f.offsets[i]] = f.pristine[i];
}

void checkCommPlan(const sc::CommPlan& plan) {
  std::vector<std::uint64_t> sizes = {0,     1,     4095,       4096,
                                      65535, 65536, 1ULL << 30, std::numeric_limits<std::uint64_t>::max()};
  for (const auto& decisions : plan.byCollective) {
    for (std::size_t i = 0; i < decisions.size(); ++i) {
      const sc::Decision& d = decisions[i];
      if (d.minBytes > d.maxBytes) __builtin_trap();
      if (i > 0 && d.minBytes <= decisions[i - 1].maxBytes) __builtin_trap();  // sorted and disjoint
      for (std::uint64_t n : {d.minBytes - 1, d.minBytes, d.maxBytes, d.maxBytes + 1}) sizes.push_back(n);
    }
  }
  for (std::uint32_t coll = 0; coll <= sc::kNumCollectives; ++coll) {
    for (std::uint64_t n : sizes) {
      const sc::Decision* d = plan.find(coll, n);
      if (d == nullptr) continue;
      if (coll >= sc::kNumCollectives || n < d->minBytes || n > d->maxBytes) __builtin_trap();
      const auto& v = plan.byCollective[coll];
      if (d < v.data() || d >= v.data() + v.size()) __builtin_trap();
    }
  }
  if (plan.entryCount() > sc::kMaxEntries) __builtin_trap();
  (void)plan.memoryBytes();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = fixture();
  restore(f);
  const std::uint8_t flags = size > 0 ? data[0] : 0;
  auto* bytes = reinterpret_cast<unsigned char*>(f.segment);
  for (std::size_t i = 1; i + 5 <= size; i += 5) {
    std::uint32_t offset;
    std::memcpy(&offset, data + i, sizeof(offset));
    bytes[f.offsets[offset % f.offsets.size()]] = data[i + 4];
  }
  sc::PlanSlot& slot = f.segment->slots[f.slot];
  if ((flags & kKeepOddSeq) == 0) slot.header.seq &= ~std::uint64_t{1};
  if ((flags & kRecomputeChecksums) != 0) {
    if (slot.header.entryCount <= sc::kMaxEntries && slot.header.stringBytes <= sc::kStringBytes &&
        slot.header.trialCount <= sc::kMaxTrials) {
      slot.header.checksum =
          optiflow::schedcache::detail::slotChecksum(slot.header, slot.entries, slot.header.entryCount, slot.strings,
                                                     slot.header.stringBytes, slot.trials, slot.header.trialCount);
    }
    f.segment->header.headerChecksum = optiflow::schedcache::detail::headerChecksum(f.segment->header);
  }

  sc::Error err;
  std::unique_ptr<sc::Reader> reader = sc::Reader::attach(f.ns, &err);
  if (!reader) {
    if (f.verbose) std::fprintf(stderr, "attach: %s\n", err.message.c_str());
    if (err.status == sc::Status::kOk || err.message.empty()) __builtin_trap();
    return 0;
  }
  (void)reader->generation();
  (void)reader->createdNs();
  if (reader->build().size() > sc::kBuildBytes) __builtin_trap();

  sc::PlanInfo info;
  if (reader->current(&info) == sc::Status::kOk && info.source.size() > sc::kSourceBytes) __builtin_trap();
  for (const sc::PlanInfo& p : reader->plans()) {
    if (p.slot >= sc::kPlanSlots || p.entryCount > sc::kMaxEntries) __builtin_trap();
  }
  std::vector<std::string> report;
  (void)reader->check(&report);
  if (report.empty()) __builtin_trap();
  if (f.verbose) {
    for (const std::string& line : report) std::fprintf(stderr, "check: %s\n", line.c_str());
  }

  const std::uint64_t slotHash = slot.header.contentHash;
  for (std::uint64_t hash : {std::uint64_t{0}, f.hash, slotHash}) {
    for (auto [ranks, nodes] : {std::pair<std::uint32_t, std::uint32_t>{8, 1}, {16, 2}, {0, 0}}) {
      sc::CommPlan plan;
      std::string detail;
      const sc::Status st = reader->loadComm(hash, ranks, nodes, &plan, &detail);
      if (f.verbose) {
        std::fprintf(stderr, "loadComm(%016llx, %u, %u): %s, %zu decisions %s\n", static_cast<unsigned long long>(hash),
                     ranks, nodes, std::string(sc::toString(st)).c_str(), plan.entryCount(), detail.c_str());
      }
      if (st == sc::Status::kOk) {
        checkCommPlan(plan);
      } else if (detail.empty()) {
        __builtin_trap();
      }
    }
    sc::Plan plan;
    sc::PlanInfo planInfo;
    std::string detail;
    const sc::Status st = reader->loadPlan(hash, &plan, &planInfo, &detail);
    if (f.verbose) {
      std::fprintf(stderr, "loadPlan(%016llx): %s, %zu items %s\n", static_cast<unsigned long long>(hash),
                   std::string(sc::toString(st)).c_str(), plan.items.size(), detail.c_str());
    }
    if (st == sc::Status::kOk) {
      if (plan.items.size() > sc::kMaxEntries || planInfo.entryCount != plan.items.size()) __builtin_trap();
      for (const sc::PlanItem& it : plan.items) {
        if (it.jsonPath.size() >= sc::kStringBytes || it.xmlPath.size() >= sc::kStringBytes) __builtin_trap();
      }
      (void)sc::validatePlan(plan);
      (void)sc::contentHash(plan);
    } else if (detail.empty()) {
      __builtin_trap();
    }
  }
  for (const sc::CommPin& pin : reader->pins()) {
    if (pin.commId == 0) __builtin_trap();
  }
  (void)reader->activity();

  // NetRegion: the plugin's claims and lookups must stay inside the tables and keep names terminated.
  for (const auto& records : {reader->netNics(), reader->netPeers()}) {
    for (const sc::NetStatsRecord& r : records) {
      if (r.key == 0 || ::strnlen(r.name, sc::kNetNameBytes) == sc::kNetNameBytes) __builtin_trap();
    }
  }
  if (reader->railWeights().size() > sc::kNetRails) __builtin_trap();
  for (const char* name : {"eth0", "eth1", "ib0", "lo"}) {
    const int index = reader->railIndex(name);
    if (index >= static_cast<int>(sc::kNetRails)) __builtin_trap();
    (void)reader->railWeight(index);
  }
  // A claimed record is one netNics()/netPeers() then lists under that name's key (the reader maps the segment at its
  // own address, so the pointer itself cannot be compared with this fixture's mapping).
  for (const char* name : {"eth0", "10.0.0.2"}) {
    const auto listed = [&](const std::vector<sc::NetStatsRecord>& records) {
      for (const sc::NetStatsRecord& r : records) {
        if (r.key == sc::netNameKey(name, std::strlen(name))) return true;
      }
      return false;
    };
    if (sc::NetCounters* nic = reader->netNic(name); nic != nullptr) {
      nic->bytesSent += 1;
      if (!listed(reader->netNics())) __builtin_trap();
    }
    if (sc::NetCounters* peer = reader->netPeer(name); peer != nullptr) {
      peer->bytesRecv += 1;
      if (!listed(reader->netPeers())) __builtin_trap();
    }
  }
  return 0;
}
