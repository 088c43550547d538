#include "tuner_api.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "log.h"
#include "optiflow/core/vocabulary.h"
#include "optiflow/plugin/params.h"
#include "optiflow/schedcache/layout.h"
#include "optiflow/tuner/tuner.h"

extern char** environ;

namespace optiflow::plugin {

namespace {

// The schedule cache stores the vocabulary's NCCL indices and the tuner hands them to NCCL untranslated.
using core::Algorithm;
using core::Collective;
using core::ncclFuncIndex;
using core::ncclIndex;
using core::Protocol;
static_assert(NCCL_ALGO_TREE == ncclIndex(Algorithm::Tree) && NCCL_ALGO_RING == ncclIndex(Algorithm::Ring) &&
              NCCL_ALGO_COLLNET_DIRECT == ncclIndex(Algorithm::CollNetDirect) &&
              NCCL_ALGO_COLLNET_CHAIN == ncclIndex(Algorithm::CollNetChain) &&
              NCCL_ALGO_NVLS == ncclIndex(Algorithm::Nvls) && NCCL_ALGO_NVLS_TREE == ncclIndex(Algorithm::NvlsTree) &&
              NCCL_ALGO_PAT == ncclIndex(Algorithm::Pat) && NCCL_NUM_ALGORITHMS == core::kNumAlgorithms);
static_assert(NCCL_PROTO_LL == ncclIndex(Protocol::LL) && NCCL_PROTO_LL128 == ncclIndex(Protocol::LL128) &&
              NCCL_PROTO_SIMPLE == ncclIndex(Protocol::Simple) && NCCL_NUM_PROTOCOLS == core::kNumProtocols);
static_assert(ncclFuncAllGather == ncclFuncIndex(Collective::AllGather) &&
              ncclFuncReduceScatter == ncclFuncIndex(Collective::ReduceScatter) &&
              ncclFuncAllReduce == ncclFuncIndex(Collective::AllReduce) &&
              ncclFuncBroadcast == ncclFuncIndex(Collective::Broadcast) &&
              ncclFuncReduce == ncclFuncIndex(Collective::Reduce));

struct Context {
  tuner::CommTuner tuner;
  ncclDebugLogger_t log = nullptr;
};

class NcclLog final : public tuner::Log {
 public:
  explicit NcclLog(ncclDebugLogger_t log) : log_(log) {}
  void write(tuner::LogLevel level, const std::string& message) override {
    if (level == tuner::LogLevel::kWarn) {
      OPTIFLOW_TUNER_WARN(log_, "%s", message.c_str());
    } else {
      OPTIFLOW_TUNER_INFO(log_, "%s", message.c_str());
    }
  }

 private:
  ncclDebugLogger_t log_;
};

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "(unknown host)";
  return buf;
}

std::string ncclOverride() {
  std::string s;
  for (const char* var : {"NCCL_ALGO", "NCCL_PROTO"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    if (!s.empty()) s += " and ";
    s += std::string(var) + "=" + v;
  }
  return s;
}

ncclResult_t failed(ncclDebugLogger_t log, bool abortOnError, ncclResult_t result, const std::string& message) {
  OPTIFLOW_TUNER_WARN(log, "%s", message.c_str());
  if (abortOnError) std::abort();
  return result;
}

}  // namespace

ncclResult_t tunerInit(void** context, std::optional<std::uint64_t> commId, std::size_t nRanks, std::size_t nNodes,
                       ncclDebugLogger_t logFunction) noexcept {
  if (context == nullptr) return ncclInvalidArgument;
  *context = nullptr;
  bool abortOnError = false;
  try {
    Params params;
    std::string error;
    if (!readParams([](const char* name) -> const char* { return std::getenv(name); }, &params, &error)) {
      return failed(logFunction, false, ncclInvalidUsage, "tuner init: " + error);
    }
    abortOnError = params.abortOnError;
    static std::atomic<bool> unknownReported{false};  // once per process, not once per communicator
    if (!unknownReported.exchange(true)) {
      for (const std::string& name : unknownParams(environ)) {
        OPTIFLOW_TUNER_WARN(logFunction, "unknown variable %s ignored (see docs/schedcache.md for the list)",
                            name.c_str());
      }
    }
    if (nRanks == 0 || nNodes == 0 || nRanks > 0xffffffffu || nNodes > nRanks) {
      return failed(logFunction, abortOnError, ncclInvalidArgument,
                    "tuner init: " + std::to_string(nRanks) + " ranks on " + std::to_string(nNodes) +
                        " nodes is not a communicator");
    }
    tuner::Settings settings;
    settings.enabled = params.tunerEnabled;
    settings.ns = params.ns;
    settings.pinned = params.plan;
    settings.missingUsesDefaults = params.planMissingDefaults;
    settings.ncclOverride = ncclOverride();
    settings.host = hostName();
    settings.settleS = params.settleS;
    tuner::CommShape shape;
    shape.commId = commId;
    shape.nRanks = static_cast<std::uint32_t>(nRanks);
    shape.nNodes = static_cast<std::uint32_t>(nNodes);
    NcclLog log(logFunction);
    tuner::InitResult r = tuner::initComm(settings, shape, log);
    if (!r.ok) return failed(logFunction, abortOnError, ncclInvalidUsage, "tuner init: " + r.message);
    auto ctx = std::make_unique<Context>();
    ctx->tuner = std::move(*r.tuner);
    ctx->log = logFunction;
    *context = ctx.release();
    return ncclSuccess;
  } catch (const std::exception& e) {
    return failed(logFunction, abortOnError, ncclInternalError, std::string("tuner init: ") + e.what());
  } catch (...) {
    return failed(logFunction, abortOnError, ncclInternalError, "tuner init: unknown exception");
  }
}

ncclResult_t tunerGetCollInfo(void* context, ncclFunc_t collType, std::size_t nBytes, float** collCostTable,
                              int numAlgo, int numProto, int* nChannels) noexcept {
  // "No opinion" is success with the table untouched; an error here would fail the user's collective.
  if (context == nullptr || collCostTable == nullptr) return ncclSuccess;
  if (numAlgo <= 0 || numAlgo > NCCL_NUM_ALGORITHMS || numProto <= 0 || numProto > NCCL_NUM_PROTOCOLS) {
    return ncclSuccess;
  }
  const auto* ctx = static_cast<const Context*>(context);
  // NCCL passes its float[numAlgo][numProto] cast to float**: one contiguous block, not row pointers.
  auto* table = reinterpret_cast<float*>(collCostTable);
  ctx->tuner.applyCostTable(static_cast<std::uint32_t>(collType), nBytes, table, numAlgo, numProto, nChannels);
  return ncclSuccess;
}

ncclResult_t tunerGetCollInfoV2(void* context, ncclFunc_t collType, std::size_t nBytes, int collNetSupport,
                                int nvlsSupport, int* algorithm, int* protocol, int* nChannels) noexcept {
  if (context == nullptr) return ncclSuccess;
  const auto* ctx = static_cast<const Context*>(context);
  ctx->tuner.applyDirect(static_cast<std::uint32_t>(collType), nBytes, collNetSupport != 0, nvlsSupport != 0, algorithm,
                         protocol, nChannels);
  return ncclSuccess;
}

ncclResult_t tunerGetChunkSize(void* context, ncclFunc_t collType, std::size_t nBytes, int algorithm, int protocol,
                               std::size_t* chunkSize) noexcept {
  if (context == nullptr) return ncclSuccess;
  const auto* ctx = static_cast<const Context*>(context);
  ctx->tuner.chunkSize(static_cast<std::uint32_t>(collType), nBytes, algorithm, protocol, chunkSize);
  return ncclSuccess;
}

ncclResult_t tunerFinalize(void* context) noexcept {
  delete static_cast<Context*>(context);
  return ncclSuccess;
}

}  // namespace optiflow::plugin
