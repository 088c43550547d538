#include "optiflow/tuner/tuner.h"

#include <array>
#include <atomic>
#include <string>
#include <utility>

#include "optiflow/core/vocabulary.h"

namespace optiflow::tuner {

namespace {

using schedcache::Status;

// A broken or absent segment would otherwise be reported by every communicator of a job: once per process and
// reason is enough to be seen and not enough to flood NCCL's log.
bool firstTime(Status s) {
  static std::array<std::atomic<bool>, 32> seen{};
  const auto i = static_cast<std::size_t>(s) % seen.size();
  return !seen[i].exchange(true, std::memory_order_relaxed);
}

std::string planName(std::uint64_t hash) { return schedcache::formatHash(hash); }

// Without a plan the reader still counts calls and, given the communicator id, records NCCL's own choices.
InitResult noPlan(Log& log, LogLevel level, const std::string& message,
                  std::unique_ptr<schedcache::Reader> reader = nullptr, std::uint64_t commId = 0) {
  if (!message.empty()) log.write(level, message);
  InitResult r;
  r.tuner = std::make_unique<CommTuner>(schedcache::CommPlan{}, std::move(reader), commId);
  return r;
}

InitResult fail(const std::string& message) {
  InitResult r;
  r.ok = false;
  r.message = message;
  return r;
}

std::string shapeText(const CommShape& shape) {
  std::string s = std::to_string(shape.nRanks) + " ranks, " + std::to_string(shape.nNodes) + " node" +
                  (shape.nNodes == 1 ? "" : "s");
  if (shape.commId) s += ", communicator " + planName(*shape.commId);
  return s;
}

InitResult loaded(Log& log, const schedcache::CommPlan& plan, std::unique_ptr<schedcache::Reader> reader,
                  const CommShape& shape, const char* how) {
  log.write(
      LogLevel::kInfo,
      "using plan " + planName(plan.planHash) + " (" + how + ") for " + shapeText(shape) + ": " +
          std::to_string(plan.entryCount()) + " decisions" +
          (plan.entryCount() == 0 ? " (none for this shape: NCCL decides)" : "") +
          (plan.trialDecisions == 0 ? std::string() : ", " + std::to_string(plan.trialDecisions) + " with trials"));
  InitResult r;
  r.tuner = std::make_unique<CommTuner>(plan, std::move(reader), shape.commId.value_or(0));
  return r;
}

}  // namespace

InitResult initComm(const Settings& settings, const CommShape& shape, Log& log) {
  if (!settings.enabled) return noPlan(log, LogLevel::kInfo, "OPTIFLOW_TUNER=off: NCCL decides");
  if (!settings.ncclOverride.empty()) {
    return noPlan(log, LogLevel::kInfo, settings.ncclOverride + " is set: OptiFlow steps aside, NCCL decides");
  }

  schedcache::Error attachError;
  std::unique_ptr<schedcache::Reader> reader = schedcache::Reader::attach(settings.ns, &attachError);

  if (settings.pinned) {
    // A pinned plan is the job's promise that every node uses it: a node without it must not quietly use NCCL's
    // defaults while the others use the plan.
    const std::string name = planName(*settings.pinned);
    std::string why;
    schedcache::CommPlan plan;
    if (!reader) {
      why = attachError.message;
    } else {
      std::string detail;
      const Status s = reader->loadComm(*settings.pinned, shape.nRanks, shape.nNodes, &plan, &detail);
      if (s == Status::kOk) {
        if (shape.commId) {
          Status pinStatus = Status::kOk;
          reader->pinComm(*shape.commId, plan.planHash, shape.nRanks, shape.nNodes, &pinStatus);
        }
        return loaded(log, plan, std::move(reader), shape, "pinned by OPTIFLOW_PLAN");
      }
      why = std::string(schedcache::toString(s)) + (detail.empty() ? "" : ": " + detail);
    }
    const std::string message = "OPTIFLOW_PLAN=" + name + " is not usable on node " + settings.host + " (namespace " +
                                settings.ns + "): " + why;
    if (settings.missingUsesDefaults) {
      return noPlan(log, LogLevel::kWarn, message + "; OPTIFLOW_PLAN_MISSING=defaults: NCCL decides on this node");
    }
    return fail(message +
                ". Publish the plan on this node (optiflow cache publish) or set "
                "OPTIFLOW_PLAN_MISSING=defaults to run with NCCL's defaults");
  }

  if (!reader) {
    if (attachError.status == Status::kAbsent) {
      if (firstTime(attachError.status)) log.write(LogLevel::kInfo, attachError.message + ": NCCL decides");
    } else if (firstTime(attachError.status)) {
      log.write(LogLevel::kWarn, "schedule cache unusable, NCCL decides: " + attachError.message);
    }
    return noPlan(log, LogLevel::kInfo, "");
  }
  if (shape.nNodes > 1) {
    return noPlan(log, LogLevel::kInfo,
                  "communicator spans " + std::to_string(shape.nNodes) +
                      " nodes and no plan is pinned (OPTIFLOW_PLAN): NCCL decides (docs/consistency.md)",
                  std::move(reader), shape.commId.value_or(0));
  }
  if (!shape.commId) {
    return noPlan(log, LogLevel::kInfo,
                  "this NCCL's tuner API gives no communicator id, so ranks cannot agree on a plan through the cache "
                  "and no plan is pinned (OPTIFLOW_PLAN): NCCL decides",
                  std::move(reader));
  }

  // One node, unpinned: the communicator's pin in the segment decides, so every rank on the node uses one plan
  // even when a publish lands between their inits.
  schedcache::CommPlan current;
  std::string detail;
  Status cs = Status::kNoPlan;
  const std::int64_t ageNs = schedcache::realtimeNs() - reader->createdNs();
  if (ageNs < static_cast<std::int64_t>(settings.settleS) * 1000000000LL) {
    // A peer that initialised before the segment existed used no plan and recorded nothing; within the settle time
    // this rank may be its peer, so it records "no plan" too.
    log.write(LogLevel::kInfo, "schedule cache " + settings.ns + " was created " +
                                   std::to_string(ageNs / 1000000000LL) + " s ago (< OPTIFLOW_SETTLE_S=" +
                                   std::to_string(settings.settleS) + "): this communicator records no plan");
  } else {
    cs = reader->loadComm(0, shape.nRanks, shape.nNodes, &current, &detail);
    if (cs != Status::kOk && cs != Status::kNoPlan && firstTime(cs)) {
      log.write(LogLevel::kWarn, "current plan unreadable (" + std::string(schedcache::toString(cs)) + ": " + detail +
                                     "); this communicator records no plan");
    }
  }
  const std::uint64_t proposed = cs == Status::kOk ? current.planHash : schedcache::kPinNoPlan;
  Status pinStatus = Status::kOk;
  const std::uint64_t adopted = reader->pinComm(*shape.commId, proposed, shape.nRanks, shape.nNodes, &pinStatus);
  if (adopted == schedcache::kPinPending) {
    // Without a pin this rank cannot know what the others chose; guessing could hang the job.
    return fail("cannot record or read the plan of communicator " + planName(*shape.commId) + " in namespace " +
                settings.ns + " on node " + settings.host + ": " + std::string(schedcache::toString(pinStatus)));
  }
  if (adopted == schedcache::kPinNoPlan) {
    return noPlan(log, LogLevel::kInfo, "no plan for " + shapeText(shape) + ": NCCL decides", std::move(reader),
                  *shape.commId);
  }
  if (adopted == proposed) return loaded(log, current, std::move(reader), shape, "current plan, recorded");
  schedcache::CommPlan plan;
  const Status as = reader->loadComm(adopted, shape.nRanks, shape.nNodes, &plan, &detail);
  if (as != Status::kOk) {
    return fail("the other ranks of communicator " + planName(*shape.commId) + " on node " + settings.host +
                " use plan " + planName(adopted) + ", which this rank cannot load: " +
                std::string(schedcache::toString(as)) + (detail.empty() ? "" : ": " + detail));
  }
  return loaded(log, plan, std::move(reader), shape, "adopted from the first rank");
}

std::optional<std::uint32_t> trialCandidate(std::uint64_t planHash, std::uint64_t commId, std::uint32_t coll,
                                            std::uint64_t minBytes, std::uint64_t call, std::uint32_t candidates,
                                            std::uint32_t callsEach) noexcept {
  if (candidates == 0 || callsEach == 0 || call >= std::uint64_t{candidates} * callsEach) return std::nullopt;
  // A mix of the shared inputs only: the same rotation on every rank.
  using schedcache::mix64;
  const std::uint64_t rotation =
      mix64(planHash ^ mix64(commId ^ mix64((std::uint64_t{coll} << 56) ^ minBytes))) % candidates;
  return static_cast<std::uint32_t>((call / callsEach + rotation) % candidates);
}

CommTuner::CommTuner(schedcache::CommPlan plan, std::unique_ptr<schedcache::Reader> reader, std::uint64_t commId)
    : plan_(std::move(plan)), reader_(std::move(reader)), commId_(commId) {
  if (plan_.trialDecisions > 0) {
    trialCalls_ = std::make_unique<std::atomic<std::uint64_t>[]>(plan_.trialDecisions);
    for (std::uint16_t i = 0; i < plan_.trialDecisions; ++i) trialCalls_[i].store(0, std::memory_order_relaxed);
  }
}

CommTuner::Applied CommTuner::applied(std::uint32_t coll, const schedcache::Decision& d,
                                      std::uint64_t call) const noexcept {
  Applied a{d.algorithm, d.protocol, d.nChannels, d.chunkBytes};
  if (d.trialCount == 0) return a;
  const std::optional<std::uint32_t> c =
      trialCandidate(plan_.planHash, commId_, coll, d.minBytes, call, d.trialCount, d.trialCalls);
  if (!c) return a;
  const schedcache::TrialEntry& t = plan_.trials[d.trialFirst + *c];
  return {t.algorithm, t.protocol, t.nChannels, t.chunkBytes};
}

int ncclArgmin(const float* table, int numAlgo, int numProto) noexcept {
  int best = -1;
  for (int i = 0; i < numAlgo * numProto; ++i) {
    // `>= 0` is false for NaN as for -1: neither can run.
    if (table[i] >= 0.0f && (best < 0 || table[i] < table[best])) best = i;
  }
  return best;
}

void CommTuner::recordNcclChoice(std::uint32_t coll, std::uint64_t nBytes, const float* table, int numAlgo,
                                 int numProto) const noexcept {
  // The profiler keys its records by core::Collective, NCCL's tuner speaks ncclFunc_t: one encoding in the segment.
  static constexpr std::array<std::uint8_t, schedcache::kNumCollectives> kCollOf = [] {
    std::array<std::uint8_t, schedcache::kNumCollectives> out{};
    for (std::uint32_t f = 0; f < schedcache::kNumCollectives; ++f) {
      out[f] = static_cast<std::uint8_t>(*core::collectiveFromNcclFunc(static_cast<int>(f)));
    }
    return out;
  }();
  // Only what a tuner decides, and indices that fit the record's int8 fields.
  if (coll >= schedcache::kNumCollectives || numAlgo > 127 || numProto > 127) return;
  const int best = ncclArgmin(table, numAlgo, numProto);
  if (best < 0) return;
  reader_->recordChoice(commId_, kCollOf[coll], nBytes, static_cast<std::int8_t>(best / numProto),
                        static_cast<std::int8_t>(best % numProto));
}

bool CommTuner::applyCostTable(std::uint32_t coll, std::uint64_t nBytes, float* table, int numAlgo, int numProto,
                               int* nChannels) const noexcept {
  if (reader_) reader_->recordCall(coll, nBytes);
  if (table == nullptr || numAlgo <= 0 || numProto <= 0) return false;
  // Before anything below changes the table: its argmin is what NCCL would run without us.
  if (reader_ && commId_ != 0) recordNcclChoice(coll, nBytes, table, numAlgo, numProto);
  if (!hasPlan()) return false;
  const schedcache::Decision* decision = plan_.find(coll, nBytes);
  if (decision == nullptr) return false;
  // Every call of the decision counts, whatever the table says: the table is the same on every rank, and so is
  // the count.
  const std::uint64_t call =
      decision->trialCount == 0 ? 0 : trialCalls_[decision->trialIndex].fetch_add(1, std::memory_order_relaxed);
  const Applied a = applied(coll, *decision, call);
  const Applied* d = &a;
  if (d->algorithm < 0 || d->protocol < 0 || d->algorithm >= numAlgo || d->protocol >= numProto) {
    return false;
  }
  float& chosen = table[d->algorithm * numProto + d->protocol];
  if (!(chosen >= 0.0f)) return false;  // -1 (or NaN): NCCL cannot run it here; never enable it
  // NCCL takes the smallest non-negative cost and, on a tie, the first in [algo][proto] order: an earlier 0.0
  // would win over ours, so other zeros become the smallest positive cost.
  for (int i = 0; i < numAlgo * numProto; ++i) {
    if (table[i] == 0.0f) table[i] = 1e-6f;
  }
  chosen = 0.0f;
  if (d->nChannels > 0 && nChannels != nullptr) *nChannels = d->nChannels;
  return true;
}

bool CommTuner::applyDirect(std::uint32_t coll, std::uint64_t nBytes, bool collNetSupport, bool nvlsSupport,
                            int* algorithm, int* protocol, int* nChannels) const noexcept {
  if (reader_) reader_->recordCall(coll, nBytes);
  if (!hasPlan() || algorithm == nullptr || protocol == nullptr) return false;
  const schedcache::Decision* d = plan_.find(coll, nBytes);
  if (d == nullptr || d->algorithm < 0 || d->protocol < 0 || d->protocol >= core::kNumProtocols) return false;
  // What NCCL 2.21 (no cost table, six algorithms) can run: Tree only for AllReduce, CollNet and NVLS only where
  // supported, no PAT. The decision holds NCCL's indices, which are the vocabulary's enumerators (ncclIndex is a
  // cast): nothing is converted on this path.
  using A = core::Algorithm;
  constexpr std::uint32_t kAllReduce = *core::ncclFuncIndex(core::Collective::AllReduce);
  const auto algo = static_cast<A>(d->algorithm);
  const bool allReduce = coll == kAllReduce;
  bool ok = false;
  switch (algo) {
    case A::Ring:
      ok = true;
      break;
    case A::Tree:
      ok = allReduce;
      break;
    case A::CollNetDirect:
    case A::CollNetChain:
      ok = collNetSupport && allReduce;
      break;
    case A::Nvls:
    case A::NvlsTree:
      ok = nvlsSupport && allReduce;
      break;
    default:
      ok = false;
  }
  if (!ok) return false;
  *algorithm = d->algorithm;
  *protocol = d->protocol;
  if (d->nChannels > 0 && nChannels != nullptr) *nChannels = d->nChannels;
  return true;
}

bool CommTuner::chunkSize(std::uint32_t coll, std::uint64_t nBytes, int algorithm, int protocol,
                          std::size_t* chunkBytes) const noexcept {
  if (!hasPlan() || chunkBytes == nullptr) return false;
  const schedcache::Decision* decision = plan_.find(coll, nBytes);
  if (decision == nullptr) return false;
  // NCCL asks for the chunk size after getCollInfo of the same call: the candidate of the last counted call.
  std::uint64_t call = 0;
  if (decision->trialCount != 0) {
    const std::uint64_t calls = trialCalls_[decision->trialIndex].load(std::memory_order_relaxed);
    if (calls == 0) return false;
    call = calls - 1;
  }
  const Applied d = applied(coll, *decision, call);
  if (d.chunkBytes == 0 || d.algorithm != algorithm || d.protocol != protocol) return false;
  *chunkBytes = static_cast<std::size_t>(d.chunkBytes);
  return true;
}

std::size_t CommTuner::memoryBytes() const noexcept {
  return sizeof(*this) + plan_.memoryBytes() + plan_.trialDecisions * sizeof(std::atomic<std::uint64_t>);
}

}  // namespace optiflow::tuner
