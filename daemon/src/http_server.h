// optiflowd's local HTTP endpoints (cpp-httplib on its own thread): GET /healthz and GET /metrics.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "optiflow/core/error.h"

namespace optiflow::daemon {

class HttpServer {
 public:
  struct Handlers {
    std::function<std::string()> unhealthy;  // "" while healthy, else why (served as 503 with that text)
    std::function<std::string()> metrics;    // Prometheus text format 0.0.4
  };

  // Binds address:port (port 0: a free port, see port()) and serves until stop() or destruction.
  static core::Result<std::unique_ptr<HttpServer>> start(const std::string& address, int port, Handlers handlers);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Stops listening and joins the server thread; bounded by about a second (keep-alive and read timeouts).
  void stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace optiflow::daemon
