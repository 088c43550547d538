// optiflowd as a library (STYLE.md item 8): daemon/src/main.cc only calls daemonMain. The Daemon owns the namespace
// lock (a second daemon on the same namespace is refused), the cache writer, the /healthz and /metrics server, the
// probe responder and the work thread; signals reach it through requestStop / requestReload.
#pragma once

#include <memory>

#include "optiflow/core/error.h"
#include "optiflow/daemon/config.h"
#include "optiflow/daemon/metrics.h"

namespace optiflow::daemon {

class Daemon {
 public:
  // Takes the namespace lock, opens the cache, loads the topology, starts /healthz + /metrics and the probe
  // responder; run() starts the work. On failure *exitCode (when given) says which of daemonMain's codes applies:
  // 3 another daemon holds the namespace, 2 the config names something that does not exist, 1 anything else.
  static core::Result<std::unique_ptr<Daemon>> create(Config config, GetEnv getEnv, int* exitCode = nullptr);
  virtual ~Daemon() = default;
  // Runs until requestStop; returns the process exit code. Stops within 2 s of the request.
  virtual int run() = 0;
  virtual void requestStop() = 0;    // thread-safe
  virtual void requestReload() = 0;  // thread-safe: re-reads config.file; a bad file keeps the old config (logged)
  virtual Metrics& metrics() = 0;
  virtual int metricsPort() const = 0;
};

// `optiflowd --config FILE [--check-config] [--version]`: parses arguments, sets up logging, blocks SIGTERM/SIGINT/
// SIGHUP and handles them on a signal thread, runs the daemon. Exit codes: 0 clean stop, 1 runtime failure, 2 bad
// arguments or config, 3 another daemon holds the namespace.
int daemonMain(int argc, char** argv);

}  // namespace optiflow::daemon
