// libFuzzer target: synth::loadPlanForCache (what `optiflow cache publish` and optiflowd read) over a fuzzed
// plan.json. The input is written to DIR/plan.json in a per-process temporary directory and loaded without
// verification; when that accepts it, it is loaded again with verification. Neither may crash, an error must say
// what is wrong, and an accepted plan must pass schedcache::validatePlan, name DIR as its source, carry a schedule id
// exactly when it names schedule files (by absolute paths), and be the same plan with
// and without verification.
//
// DIR/schedules/ holds ring schedules for 8 ranks under the names `optiflow synthesize --topo dgx-a100 --coll
// allgather --sizes 1KiB:1MiB:4` gives them (allgather-1KiB.json ...) and ring-{allreduce,reducescatter}-8.{json,xml},
// so the seeds in corpus/cache_plan/ also get through verification.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "optiflow/compiler/schedule_io.h"
#include "optiflow/core/fixtures.h"
#include "optiflow/schedcache/plan.h"
#include "optiflow/synth/cache_plan.h"

namespace {

namespace fs = std::filesystem;
namespace sc = optiflow::schedcache;
using optiflow::compiler::ScheduleFormat;

fs::path* gDir = nullptr;

void removeDir() {
  if (gDir == nullptr) return;
  std::error_code ec;
  fs::remove_all(*gDir, ec);
}

void writeFile(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz_cache_plan: cannot write %s\n", file.c_str());
    std::abort();
  }
}

const fs::path& workDir() {
  if (gDir != nullptr) return *gDir;
  gDir = new fs::path(fs::temp_directory_path() / ("optiflow-fuzz-cache-plan-" + std::to_string(::getpid())));
  std::error_code ec;
  fs::remove_all(*gDir, ec);
  fs::create_directories(*gDir / "schedules");
  std::atexit(removeDir);
  namespace fx = optiflow::core::fixtures;
  const fx::RingOptions ring{.nRanks = 8};
  const optiflow::core::Schedule ag = fx::ringAllGather(ring);
  const fs::path schedules = *gDir / "schedules";
  for (const ScheduleFormat format : {ScheduleFormat::Json, ScheduleFormat::MscclXml}) {
    const char* ext = format == ScheduleFormat::Json ? ".json" : ".xml";
    const std::string agText = optiflow::compiler::formatSchedule(ag, format);
    for (const char* size : {"1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB"}) {
      writeFile(schedules / (std::string("allgather-") + size + ext), agText);
    }
    writeFile(schedules / (std::string("ring-allreduce-8") + ext),
              optiflow::compiler::formatSchedule(fx::ringAllReduce(ring), format));
    writeFile(schedules / (std::string("ring-reducescatter-8") + ext),
              optiflow::compiler::formatSchedule(fx::ringReduceScatter(ring), format));
  }
  return *gDir;
}

void checkAccepted(const sc::Plan& plan, const fs::path& dir) {
  if (!sc::validatePlan(plan).empty()) __builtin_trap();
  if (plan.source != optiflow::synth::planFileFor(dir).parent_path().string()) __builtin_trap();
  for (const sc::PlanItem& it : plan.items) {
    // bestSchedule sets both paths (never empty names) and schedules() the id of the JSON file, or fails.
    if (it.jsonPath.empty() != it.xmlPath.empty()) __builtin_trap();
    if (it.jsonPath.empty() != (it.scheduleId == 0)) __builtin_trap();
    if (!it.jsonPath.empty() && (!fs::path(it.jsonPath).is_absolute() || !fs::path(it.xmlPath).is_absolute())) {
      __builtin_trap();
    }
    // No native decision means no protocol, channels or chunk size either.
    if (!it.algorithm && (it.protocol || it.nChannels != 0 || it.chunkBytes != 0)) {
      __builtin_trap();
    }
  }
}

bool sameItem(const sc::PlanItem& a, const sc::PlanItem& b) {
  return a.coll == b.coll && a.nRanks == b.nRanks && a.nNodes == b.nNodes && a.minBytes == b.minBytes &&
         a.maxBytes == b.maxBytes && a.algorithm == b.algorithm && a.protocol == b.protocol &&
         a.nChannels == b.nChannels && a.chunkBytes == b.chunkBytes && a.scheduleId == b.scheduleId &&
         a.jsonPath == b.jsonPath && a.xmlPath == b.xmlPath;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& dir = workDir();
  writeFile(dir / "plan.json", std::string(reinterpret_cast<const char*>(data), size));

  static const bool verbose = std::getenv("OPTIFLOW_FUZZ_CACHE_PLAN_VERBOSE") != nullptr;
  auto plain = optiflow::synth::loadPlanForCache(dir, false);
  if (verbose) std::fprintf(stderr, "verify=false: %s\n", plain.ok() ? "ok" : plain.error().str().c_str());
  if (!plain.ok()) {
    if (plain.error().message.empty()) __builtin_trap();
    return 0;
  }
  checkAccepted(*plain, dir);

  auto verified = optiflow::synth::loadPlanForCache(dir, true);
  if (verbose) std::fprintf(stderr, "verify=true: %s\n", verified.ok() ? "ok" : verified.error().str().c_str());
  if (!verified.ok()) {
    if (verified.error().message.empty()) __builtin_trap();
    return 0;
  }
  checkAccepted(*verified, dir);
  if (verified->items.size() != plain->items.size() || verified->source != plain->source) __builtin_trap();
  for (std::size_t i = 0; i < plain->items.size(); ++i) {
    if (!sameItem(verified->items[i], plain->items[i])) __builtin_trap();
  }
  if (sc::contentHash(*verified) != sc::contentHash(*plain)) __builtin_trap();
  return 0;
}
