// The lowering (schedule -> per-rank levels of grouped sends and receives, copies and reductions) proven by the CPU
// backend with real bytes: fixtures, every gallery program on topologies of 2 to 64 ranks, pipelined and
// multi-channel compilations, the public MSCCL files when present; and broken schedules, which must come back as
// a lowering error, wrong bytes or a hang caught by the deadline, never as a pass.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/compiler/scheduler.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/core/topology.h"
#include "optiflow/exec/cpu_backend.h"
#include "optiflow/exec/levels.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/pipeline.h"

namespace optiflow::exec {
namespace {

using core::BufferKind;
using core::BufferMode;
using core::Collective;
using core::Schedule;
using core::StepOp;
using core::ThreadBlock;
namespace fx = core::fixtures;
namespace fs = std::filesystem;

constexpr BufferKind I = BufferKind::Input;
constexpr BufferKind O = BufferKind::Output;

std::string describe(const sim::CheckReport& r) {
  std::string out = fmt::format("passed={} mismatches={}", r.passed, r.mismatchCount);
  for (const auto& e : r.errors) out += "\n  " + e;
  for (const auto& m : r.mismatches) {
    out += fmt::format("\n  rank {} output chunk {}: expected {} got {}", m.rank, m.outputIndex, m.expected, m.actual);
  }
  return out;
}

core::Topology topologyOf(const std::string& name) {
  if (name == "two") {
    auto t = core::parseTopologyToml(R"(name = "two"
nodes = 1
gpus_per_node = 2
[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 300.0
latency_us = 0.7
)",
                                     "two.toml");
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().str());
    return t.value();
  }
  auto t = core::presetTopology(name);
  EXPECT_TRUE(t.ok()) << name;
  return t.value();
}

// ---------------------------------------------------------------------------------------------------------------
// Structure of the levels.

TEST(Lowering, RingAllGatherTakesOneGroupPerHop) {
  for (int n : {2, 3, 8}) {
    const Schedule s = fx::ringAllGather({.nRanks = n, .channels = 1});
    auto l = lower(s, BufferMode::OutOfPlace);
    ASSERT_TRUE(l.ok()) << l.error().str();
    // n-1 hops around the ring, each hop one group on every rank; the own-chunk copy runs before the first.
    EXPECT_EQ(l->stats.groups, n - 1) << summary(*l);
    EXPECT_EQ(l->stats.sends, static_cast<std::size_t>(n * (n - 1)));
    for (const RankLevels& rl : l->ranks) {
      ASSERT_EQ(rl.levels.size(), l->ranks[0].levels.size());
      for (const Level& lv : rl.levels) {
        // A send never reads what the same group receives.
        for (const Op& a : lv.group) {
          for (const Op& b : lv.group) {
            if (a.kind == OpKind::Send && b.kind == OpKind::Recv) {
              EXPECT_FALSE(a.src == b.dst);
            }
          }
        }
      }
    }
  }
}

TEST(Lowering, BothEndsOfEveryPairPostInTheSameOrder) {
  const Schedule s = fx::ringAllReduce({.nRanks = 6, .channels = 2});
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_TRUE(l.ok()) << l.error().str();
  for (std::size_t lv = 0; lv < l->ranks[0].levels.size(); ++lv) {
    for (const RankLevels& a : l->ranks) {
      for (const RankLevels& b : l->ranks) {
        std::vector<std::pair<int, int>> sent;
        std::vector<std::pair<int, int>> received;
        for (const Op& op : a.levels[lv].group) {
          if (op.kind == OpKind::Send && op.peer == b.rank) sent.emplace_back(op.channel, op.seq);
        }
        for (const Op& op : b.levels[lv].group) {
          if (op.kind == OpKind::Recv && op.peer == a.rank) received.emplace_back(op.channel, op.seq);
        }
        EXPECT_EQ(sent, received) << "level " << lv << " rank " << a.rank << " -> " << b.rank;
      }
    }
  }
}

TEST(Lowering, ChunkSizeFollowsNcclTestsSizes) {
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->chunkUnits, 4);                    // the All-Gather output: 4 chunks
  EXPECT_EQ(chunkElements(*l, 1 << 20), 65536u);  // 1 MiB / 4 chunks / 4 bytes
  EXPECT_EQ(chunkElements(*l, 3), 1u);            // never below one element
  EXPECT_EQ(effectiveBytes(*l, 1000), 992u);      // rounded down as nccl-tests rounds
}

// ---------------------------------------------------------------------------------------------------------------
// Known-good schedules pass on the CPU backend.

TEST(CpuBackend, RingFixturesPassAtTwoToSixtyFourRanks) {
  for (int n : {2, 3, 5, 8, 16, 64}) {
    for (int ch : {1, 2}) {
      for (bool inPlace : {false, true}) {
        const fx::RingOptions o{.nRanks = n, .channels = ch, .inPlace = inPlace};
        for (const Schedule& s : {fx::ringAllGather(o), fx::ringReduceScatter(o), fx::ringAllReduce(o)}) {
          const sim::CheckReport r = checkOnCpu(s, {.elementsPerChunk = 4});
          EXPECT_TRUE(r.passed) << core::toString(s.collective) << " n=" << n << " ch=" << ch << " inPlace=" << inPlace
                                << "\n"
                                << describe(r);
        }
      }
    }
  }
}

Schedule directAllToAll(int n, int k, bool inPlace) {
  Schedule s = fx::emptySchedule(Collective::AllToAll, n, n * k, inPlace);
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    ThreadBlock self = fx::makeBlock(0, -1, -1);
    self.steps.push_back(fx::makeStep(StepOp::Copy, I, r * k, O, r * k, k));
    rp.threadBlocks.push_back(self);
    int id = 1;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      ThreadBlock tb = fx::makeBlock(id++, p, p);
      tb.steps.push_back(fx::makeStep(StepOp::Send, I, p * k, O, r * k, k));
      tb.steps.push_back(fx::makeStep(StepOp::Recv, I, r * k, O, p * k, k));
      rp.threadBlocks.push_back(tb);
    }
  }
  return s;
}

TEST(CpuBackend, InPlaceExchangeSendsFromSnapshots) {
  // In place, every rank sends chunk p to rank p and receives rank p's data into that same chunk: one group cannot
  // both read and overwrite it, so the sends read snapshots.
  for (int n : {2, 4}) {
    const Schedule s = directAllToAll(n, 2, true);
    ASSERT_TRUE(sim::runReference(s).passed);
    auto l = lower(s, BufferMode::InPlace);
    ASSERT_TRUE(l.ok()) << l.error().str();
    EXPECT_GT(l->stats.snapshots, 0u) << summary(*l);
    const sim::CheckReport r = checkLowered(s, *l);
    EXPECT_TRUE(r.passed) << describe(r);
    // Out of place nothing is overwritten: no snapshot, one group.
    const Schedule oop = directAllToAll(n, 2, false);
    auto lo = lower(oop, BufferMode::OutOfPlace);
    ASSERT_TRUE(lo.ok());
    EXPECT_EQ(lo->stats.snapshots, 0u);
    EXPECT_EQ(lo->stats.groups, 1);
    EXPECT_TRUE(checkLowered(oop, *lo).passed);
  }
}

compiler::CompileOptions at(std::uint64_t size, int channels = 0, int slices = 0) {
  compiler::CompileOptions o;
  o.sizeBytes = size;
  o.channels = channels;
  o.slices = slices;
  return o;
}

// Compiles `text` for `topo` at a size with the options given; empty when the program does not apply there.
std::optional<Schedule> compiled(const std::string& file, std::string_view text, const core::Topology& topo,
                                 const compiler::CompileOptions& options, std::string& why) {
  const synth::Frontend f = synth::parseAndExpand(text, file, topo);
  if (!f.ok()) {
    why = f.message;
    return std::nullopt;
  }
  auto c = compiler::compile(*f.intent, topo, options);
  if (!c.ok()) {
    why = c.error().str();
    return std::nullopt;
  }
  EXPECT_TRUE(c->report.proven) << file;
  return c->schedule;
}

// Every program of the gallery (or those in `only`) at every option set; at least `minPassed` schedules must run.
void checkGallery(const std::string& topoName, const std::vector<std::string>& only,
                  const std::vector<compiler::CompileOptions>& optionSets, int minPassed) {
  const core::Topology topo = topologyOf(topoName);
  int passed = 0;
  for (const synth::EmbeddedProgram& p : synth::galleryPrograms()) {
    const std::string stem(p.file.substr(0, p.file.size() - 4));
    if (!only.empty() && std::find(only.begin(), only.end(), stem) == only.end()) continue;
    for (const compiler::CompileOptions& o : optionSets) {
      std::string why;
      const auto s = compiled(std::string(p.file), p.text, topo, o, why);
      if (!s) {
        // Only a group size the algorithm cannot take may keep a program off a topology.
        EXPECT_NE(why.find("power-of-two"), std::string::npos) << p.file << " on " << topoName << ": " << why;
        continue;
      }
      const sim::CheckReport r = checkOnCpu(*s, {.elementsPerChunk = 2});
      EXPECT_TRUE(r.passed) << p.file << " on " << topoName << " (" << o.channels << " channels, " << o.slices
                            << " slices)\n"
                            << describe(r);
      passed += r.passed ? 1 : 0;
    }
  }
  EXPECT_GE(passed, minPassed) << topoName;
}

TEST(CpuBackend, GalleryOnTwoRanks) { checkGallery("two", {}, {at(1 << 20)}, 20); }

TEST(CpuBackend, GalleryOnOneNode) { checkGallery("dgx-a100", {}, {at(64 << 10), at(256 << 20)}, 60); }

TEST(CpuBackend, GalleryOnTwoNodes) { checkGallery("dgx-a100x2", {}, {at(1 << 20)}, 30); }

TEST(CpuBackend, PipelinedAndMultiChannelCompilations) {
  // What the synthesizer's winners look like: several channels, chunks cut into slices that pipeline along a path.
  checkGallery("dgx-a100x2",
               {"allgather_ring", "allgather_hier_rail", "reducescatter_ring", "allreduce_ring", "allreduce_hier",
                "broadcast_chain", "reduce_chain", "alltoall_hier_pxn"},
               {at(256 << 20, 2, 4), at(16 << 20, 4)}, 16);
}

TEST(CpuBackend, GallerySubsetOnSixtyFourRanks) {
  checkGallery("dgx-a100x8",
               {"allgather_ring", "allgather_hier_rail", "reducescatter_hier_node_rail", "allreduce_hier",
                "broadcast_tree", "allgather_recursive_doubling"},
               {at(1 << 20)}, 6);
}

TEST(CpuBackend, PublicMscclFilesPass) {
  const fs::path dir(OPTIFLOW_SAMPLES_DIR);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) GTEST_SKIP() << "no sample files at " << dir;
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".xml") continue;
    auto s = compiler::loadSchedule(entry.path().string());
    if (!s.ok()) continue;                        // the importer's own tests cover files it refuses
    if (!sim::runReference(*s).passed) continue;  // only what the reference executor accepts is a known-good input
    const sim::CheckReport r = checkOnCpu(*s, {.elementsPerChunk = 2});
    EXPECT_TRUE(r.passed) << entry.path() << "\n" << describe(r);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no sample file the reference executor accepts in " << dir;
}

TEST(CpuBackend, TimingRunsEveryIteration) {
  const Schedule s = fx::ringAllReduce({.nRanks = 4, .channels = 1});
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_TRUE(l.ok());
  const CpuTiming t = timeLowered(*l, 256, 1, 3, std::chrono::seconds(30));
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_GT(t.avgUs, 0);
  EXPECT_FALSE(timeLowered(*l, 256, 0, 0, std::chrono::seconds(30)).ok);
}

// ---------------------------------------------------------------------------------------------------------------
// Broken schedules never pass.

TEST(BrokenSchedules, DroppedSendIsRefusedWithTheReceiveNamed) {
  Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  auto& steps = s.ranks[1].threadBlocks[0].steps;
  const auto it = std::find_if(steps.begin(), steps.end(), [](const core::Step& st) { return st.op == StepOp::Send; });
  ASSERT_NE(it, steps.end());
  steps.erase(it);
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("never sends"), std::string::npos) << l.error().str();
  const sim::CheckReport r = checkOnCpu(s);
  EXPECT_FALSE(r.passed);
  EXPECT_TRUE(r.hasError(sim::ErrorKind::Reference)) << describe(r);
}

TEST(BrokenSchedules, MissingReceiveIsRefusedWithTheSendNamed) {
  Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  auto& steps = s.ranks[2].threadBlocks[0].steps;
  ASSERT_EQ(steps.back().op, StepOp::Recv);
  steps.pop_back();
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("never receives"), std::string::npos) << l.error().str();
}

TEST(BrokenSchedules, WrongChunkIsWrongBytes) {
  Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  auto& last = s.ranks[2].threadBlocks[0].steps.back();
  ASSERT_EQ(last.op, StepOp::Recv);
  last.dstOff = (last.dstOff + 1) % 4;
  const sim::CheckReport r = checkOnCpu(s);
  EXPECT_FALSE(r.passed);
  EXPECT_GT(r.mismatchCount, 0u) << describe(r);
}

TEST(BrokenSchedules, WrongSourceChunkInAReductionIsWrongBytes) {
  Schedule s = fx::ringAllReduce({.nRanks = 4, .channels = 1});
  for (auto& st : s.ranks[1].threadBlocks[0].steps) {
    if (st.op == StepOp::RecvReduceSend) {
      st.srcOff = (st.srcOff + 1) % 4;
      break;
    }
  }
  const sim::CheckReport r = checkOnCpu(s);
  EXPECT_FALSE(r.passed);
  EXPECT_GT(r.mismatchCount, 0u) << describe(r);
}

TEST(BrokenSchedules, CountMismatchIsRefused) {
  Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  for (auto& st : s.ranks[0].threadBlocks[0].steps) {
    if (st.op == StepOp::Send) {
      st.count = 2;
      st.srcOff = 0;
      break;
    }
  }
  EXPECT_FALSE(lower(s, BufferMode::OutOfPlace).ok());
  EXPECT_FALSE(checkOnCpu(s).passed);
}

TEST(BrokenSchedules, ExchangeThatNeedsItsOwnResultIsRefused) {
  // Rank 0 forwards what it receives from rank 1 back to rank 1, and rank 1 does the same: each transfer needs the
  // other's data first. No sequence of groups runs it (nor does any engine).
  Schedule s = fx::emptySchedule(Collective::AllGather, 2, 2, false);
  for (int r = 0; r < 2; ++r) {
    ThreadBlock tb = fx::makeBlock(0, 1 - r, 1 - r);
    tb.steps.push_back(fx::makeStep(StepOp::RecvCopySend, I, 0, O, 1 - r));
    s.ranks[r].threadBlocks.push_back(tb);
  }
  auto l = lower(s, BufferMode::OutOfPlace);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("on itself"), std::string::npos) << l.error().str();
}

TEST(BrokenSchedules, BadReferencesAreDiagnosticsNotCrashes) {
  Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  s.ranks[1].threadBlocks[0].steps[1].srcOff = 1000;
  EXPECT_FALSE(lower(s, BufferMode::OutOfPlace).ok());
  Schedule p = fx::ringAllGather({.nRanks = 4, .channels = 1});
  p.ranks[1].threadBlocks[0].sendPeer = 9;
  EXPECT_FALSE(lower(p, BufferMode::OutOfPlace).ok());
  Schedule d = fx::ringAllGather({.nRanks = 4, .channels = 1});
  d.ranks[1].threadBlocks[0].steps[1].deps.push_back({7, 0});
  EXPECT_FALSE(lower(d, BufferMode::OutOfPlace).ok());
  Schedule m = fx::ringAllGather({.nRanks = 4, .channels = 1, .inPlace = true});
  EXPECT_FALSE(lower(m, BufferMode::OutOfPlace).ok());  // the schedule claims in-place only
}

// The CPU backend also catches a lowering gone wrong: the levels themselves are tampered with here.
Lowered ringLevels() {
  auto l = lower(fx::ringAllGather({.nRanks = 4, .channels = 1}), BufferMode::OutOfPlace);
  EXPECT_TRUE(l.ok());
  return l.value();
}

// Erases the last op of `kind` of `rank` (in its last level that has one).
bool eraseLast(Lowered& l, int rank, OpKind kind) {
  for (auto lv = l.ranks[rank].levels.rbegin(); lv != l.ranks[rank].levels.rend(); ++lv) {
    for (auto it = lv->group.begin(); it != lv->group.end(); ++it) {
      if (it->kind == kind) {
        lv->group.erase(it);
        return true;
      }
    }
  }
  return false;
}

TEST(BrokenLevels, DroppedSendIsAHangCaughtByTheDeadline) {
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  Lowered l = ringLevels();
  ASSERT_TRUE(eraseLast(l, 1, OpKind::Send));  // rank 2's last receive waits for it forever
  const auto start = std::chrono::steady_clock::now();
  const sim::CheckReport r = checkLowered(s, l, {.timeout = std::chrono::milliseconds(500)});
  EXPECT_FALSE(r.passed);
  EXPECT_TRUE(r.hasError(sim::ErrorKind::Hang)) << describe(r);
  EXPECT_NE(describe(r).find("waits for message"), std::string::npos) << describe(r);
  // Only a hang bound: the deadline fired, so at least its time passed.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST(BrokenLevels, DroppedReceiveLeavesAMessage) {
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  Lowered l = ringLevels();
  // The last receive of rank 2: nothing waits on it, so the run ends with its message queued.
  ASSERT_TRUE(eraseLast(l, 2, OpKind::Recv));
  const sim::CheckReport r = checkLowered(s, l);
  EXPECT_FALSE(r.passed);
  EXPECT_TRUE(r.hasError(sim::ErrorKind::Leftover)) << describe(r);
  EXPECT_GT(r.mismatchCount, 0u) << describe(r);  // and its output chunk is still poison
}

TEST(BrokenLevels, ReceiveIntoTheWrongChunkIsWrongBytes) {
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  Lowered l = ringLevels();
  bool changed = false;
  for (Level& lv : l.ranks[3].levels) {
    for (Op& op : lv.group) {
      if (op.kind == OpKind::Recv && !changed) {
        op.dst.offset = (op.dst.offset + 1) % 4;
        changed = true;
      }
    }
  }
  ASSERT_TRUE(changed);
  const sim::CheckReport r = checkLowered(s, l);
  EXPECT_FALSE(r.passed);
  EXPECT_GT(r.mismatchCount, 0u) << describe(r);
}

TEST(BrokenLevels, DroppedFirstSendShiftsTheMessagesAndIsCaught) {
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  Lowered l = ringLevels();
  for (Level& lv : l.ranks[1].levels) {
    const auto it =
        std::find_if(lv.group.begin(), lv.group.end(), [](const Op& op) { return op.kind == OpKind::Send; });
    if (it != lv.group.end()) {
      lv.group.erase(it);
      break;
    }
  }
  const sim::CheckReport r = checkLowered(s, l, {.timeout = std::chrono::milliseconds(2000)});
  EXPECT_FALSE(r.passed);
  EXPECT_TRUE(r.hasError(sim::ErrorKind::CountMismatch) || r.hasError(sim::ErrorKind::Hang)) << describe(r);
}

TEST(BrokenLevels, ReceiveInTheWrongLevelOrderIsCaught) {
  // Rank 1 posts a receive for message 1 where message 0 comes first: reported, not silently mixed up.
  const Schedule s = fx::ringAllGather({.nRanks = 4, .channels = 1});
  Lowered l = ringLevels();
  std::vector<Op*> recvs;
  for (Level& lv : l.ranks[1].levels) {
    for (Op& op : lv.group) {
      if (op.kind == OpKind::Recv) recvs.push_back(&op);
    }
  }
  ASSERT_GE(recvs.size(), 2u);
  std::swap(recvs[0]->seq, recvs[1]->seq);
  const sim::CheckReport r = checkLowered(s, l, {.timeout = std::chrono::milliseconds(2000)});
  EXPECT_FALSE(r.passed) << describe(r);
}

}  // namespace
}  // namespace optiflow::exec
