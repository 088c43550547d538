#include "optiflow/plugin/params.h"

#include <cstdint>
#include <string_view>
#include <utility>

#include "optiflow/schedcache/plan.h"

namespace optiflow::plugin {

bool readParams(GetEnv getEnv, Params* out, std::string* error) {
  Params p;
  for (const ParamSpec& spec : kParams) {
    const core::env::Value value = core::env::read(spec, getEnv);
    if (!value.error.empty()) {
      *error = value.error;
      return false;
    }
    if (!value.text) continue;
    const std::string_view v = *value.text;
    const std::string_view name(spec.name);
    if (name == "OPTIFLOW_TUNER") {
      p.tunerEnabled = v == "on";
    } else if (name == "OPTIFLOW_PROFILER") {
      p.profilerEnabled = v == "on";
    } else if (name == "OPTIFLOW_NAMESPACE") {
      p.ns = std::string(v);
    } else if (name == "OPTIFLOW_PLAN") {
      p.plan = schedcache::parseHash(v);
    } else if (name == "OPTIFLOW_PLAN_MISSING") {
      p.planMissingDefaults = v == "defaults";
    } else if (name == "OPTIFLOW_SETTLE_S") {
      p.settleS = static_cast<int>(core::env::asInteger(v));
    } else if (name == "OPTIFLOW_ABORT_ON_ERROR") {
      p.abortOnError = v == "1";
    } else if (name == "OPTIFLOW_NET_TRANSPORT") {
      p.netTransport = std::string(v);
    } else if (name == "OPTIFLOW_NET_IFNAMES") {
      p.netIfnames = core::env::asIfnames(v);
    } else if (name == "OPTIFLOW_NET_STREAMS") {
      p.netStreams = static_cast<int>(core::env::asInteger(v));
    } else if (name == "OPTIFLOW_NET_STRIPE") {
      p.netStripe = v == "1";
    } else if (name == "OPTIFLOW_NET_MIN_STRIPE_BYTES") {
      p.netMinStripeBytes = core::env::asBytes(v);
    }
  }
  *out = std::move(p);
  return true;
}

std::vector<std::string> unknownParams(char** envp) {
  return core::env::unknownNames(envp, {kParams, core::env::kDaemonParams});
}

std::string describeParams() { return core::env::describe(kParams); }

}  // namespace optiflow::plugin
