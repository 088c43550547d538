#include "http_server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

namespace optiflow::daemon {

namespace {
// Two workers are enough for a scraper and a health check; the default pool would start a thread per core.
constexpr std::size_t kWorkers = 2;
constexpr auto kStopWait = std::chrono::milliseconds(1000);
}  // namespace

struct HttpServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> done{false};
  int port = 0;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const { return impl_->port; }

core::Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& address, int port, Handlers handlers) {
  auto impl = std::make_unique<Impl>();
  httplib::Server& s = impl->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second daemon share the port silently.
  s.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Short timeouts bound how long stop() waits for an idle keep-alive connection or a slow client.
  s.set_keep_alive_timeout(1);
  s.set_keep_alive_max_count(10);
  s.set_read_timeout(1, 0);
  s.set_write_timeout(1, 0);
  s.Get("/healthz", [h = handlers.unhealthy](const httplib::Request&, httplib::Response& res) {
    const std::string why = h ? h() : std::string();
    if (why.empty()) {
      res.status = 200;
      res.set_content("ok\n", "text/plain; charset=utf-8");
    } else {
      res.status = 503;
      res.set_content(why + "\n", "text/plain; charset=utf-8");
    }
  });
  s.Get("/metrics", [m = handlers.metrics](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(m ? m() : std::string(), "text/plain; version=0.0.4; charset=utf-8");
  });

  const std::string host = address.size() > 2 && address.front() == '[' && address.back() == ']'
                               ? address.substr(1, address.size() - 2)
                               : address;
  int bound = port;
  if (port == 0) {
    bound = s.bind_to_any_port(host);
  } else if (!s.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return core::Diagnostic{"", 0, 0,
                            fmt::format("[metrics] cannot listen on {}:{}: {} (address in use, or not an address of "
                                        "this machine)",
                                        address, port, std::strerror(errno))};
  }
  impl->port = bound;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    raw->server.listen_after_bind();
    raw->done = true;
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  // stop() only acts once the listen loop runs, so repeat it until the thread has left the loop.
  const auto deadline = std::chrono::steady_clock::now() + kStopWait;
  while (!impl_->done && std::chrono::steady_clock::now() < deadline) {
    impl_->server.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace optiflow::daemon
