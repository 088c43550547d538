// Every OPTIFLOW_* variable the plugins read, in the typed registry form of optiflow/core/env.h: name, type, default
// and documentation together (docs/schedcache.md shows describeParams(); a test checks the two agree). Values are
// read once, at tuner, profiler and net plugin init, and parsed strictly: a value that does not parse is an error
// naming the variable, the value and what was expected, never a silent default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/env.h"

namespace optiflow::plugin {

using core::env::ParamSpec;
using core::env::ParamType;

inline constexpr ParamSpec kParams[] = {
    {"OPTIFLOW_TUNER", ParamType::kEnum, "on", "on|off",
     "on: the tuner applies published plans; off: it never does (NCCL decides), without uninstalling anything."},
    {"OPTIFLOW_PROFILER", ParamType::kEnum, "on", "on|off",
     "on: the profiler plugin times collectives on the GPU into the schedule cache; off: it subscribes to no event."},
    {"OPTIFLOW_NAMESPACE", ParamType::kNamespace, "default", "",
     "Which schedule cache to read: /dev/shm/optiflow-<namespace>; [A-Za-z0-9_.-], at most 64 characters."},
    {"OPTIFLOW_PLAN", ParamType::kPlanHash, "", "",
     "Pins the plan with this content hash (16 hex digits, `optiflow cache show`) for every communicator of the "
     "job, on every node. A node that lacks it fails tuner init (see OPTIFLOW_PLAN_MISSING)."},
    {"OPTIFLOW_PLAN_MISSING", ParamType::kEnum, "fail", "fail|defaults",
     "What a node without the pinned plan does: fail (tuner init fails, naming the plan and the node, so the job "
     "stops at start-up) or defaults (NCCL decides on that node; only safe if every node lacks it)."},
    {"OPTIFLOW_SETTLE_S", ParamType::kSeconds, "60", "",
     "Seconds a newly created schedule cache must exist before communicators use its plans: longer than the ranks "
     "of one communicator take to initialise, so a rank that started before the cache existed and its peers agree "
     "(docs/consistency.md). 0-86400."},
    {"OPTIFLOW_ABORT_ON_ERROR", ParamType::kBool, "0", "",
     "Debugging: abort() on the first plugin error instead of returning it to NCCL."},
    {"OPTIFLOW_NET_TRANSPORT", ParamType::kEnum, "auto", "auto|tcp|ib",
     "Net plugin transport: auto (RDMA verbs when a device with an active port exists, else TCP), tcp, or ib "
     "(net init fails without a verbs device)."},
    {"OPTIFLOW_NET_IFNAMES", ParamType::kIfnameList, "", "",
     "Comma list of the interfaces the TCP transport uses as devices (e.g. `eth0,eth1`); unset: every up "
     "interface with an address except lo, else lo."},
    {"OPTIFLOW_NET_STREAMS", ParamType::kIntRange, "1", "1-16", "TCP sockets per rail of each connection, 1-16."},
    {"OPTIFLOW_NET_STRIPE", ParamType::kBool, "0", "",
     "1: every TCP connection uses every device as a rail and splits large messages over them by rail weight."},
    {"OPTIFLOW_NET_MIN_STRIPE_BYTES", ParamType::kBytes, "262144", "",
     "Messages smaller than this travel on one stream only; bytes, or with a K/M/G suffix; at most 1G."},
};

struct Params {
  bool tunerEnabled = true;
  bool profilerEnabled = true;
  std::string ns = "default";
  std::optional<std::uint64_t> plan;
  bool planMissingDefaults = false;
  bool abortOnError = false;
  int settleS = 60;
  // Net plugin.
  std::string netTransport = "auto";
  std::vector<std::string> netIfnames;  // empty: the transport's default
  int netStreams = 1;
  bool netStripe = false;
  std::uint64_t netMinStripeBytes = 262144;
};

using core::env::GetEnv;

// Reads every variable of kParams through getEnv (std::getenv in the plugin; a fake in tests). false with *error
// ("OPTIFLOW_PLAN='xyz': expected 16 hex digits ...") on the first value that does not parse.
bool readParams(GetEnv getEnv, Params* out, std::string* error);

// OPTIFLOW_* names in envp that neither kParams nor core::env::kDaemonParams knows (likely typos), for a warning at
// init; a job environment that also serves optiflowd or the CLI is not warned about their variables.
std::vector<std::string> unknownParams(char** envp);

// A Markdown table of kParams (name, default, meaning).
std::string describeParams();

}  // namespace optiflow::plugin
