// A local OpenAI-compatible endpoint (cpp-httplib on 127.0.0.1) and a log capture, shared by the LLM tests. The
// client under test is the real one: requests go over a real socket to this server.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "ports.h"

namespace optiflow::synth::llmtest {

using testsupport::unusedPort;

// What the server saw of one request.
struct SeenRequest {
  std::string target;  // path (and query) as received
  std::string body;
  std::string authorization;  // the Authorization header, empty when absent
  std::string apiKey;         // the api-key header, empty when absent
  std::string contentType;
  std::string host;
};

class FakeLlmServer {
 public:
  // `call` counts requests from 1.
  using Handler = std::function<void(const httplib::Request&, httplib::Response&, int call)>;

  FakeLlmServer() {
    server_.Post(R"(.*)", [this](const httplib::Request& req, httplib::Response& res) {
      Handler handler;
      int call = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        seen_.push_back({req.target, req.body, req.get_header_value("Authorization"), req.get_header_value("api-key"),
                         req.get_header_value("Content-Type"), req.get_header_value("Host")});
        call = static_cast<int>(seen_.size());
        handler = handler_;
      }
      if (handler) {
        handler(req, res, call);
      } else {
        res.status = 500;
      }
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until the accept loop runs, so a test that makes no request would hang in teardown.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~FakeLlmServer() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  FakeLlmServer(const FakeLlmServer&) = delete;
  FakeLlmServer& operator=(const FakeLlmServer&) = delete;

  void onPost(Handler handler) {
    std::lock_guard<std::mutex> lock(mutex_);
    handler_ = std::move(handler);
  }
  int port() const { return port_; }
  std::string baseUrl() const { return fmt::format("http://127.0.0.1:{}/v1", port_); }
  std::vector<SeenRequest> seen() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }
  int calls() const { return static_cast<int>(seen().size()); }
  // A handler that must outwait a client sleeps in steps, so the server can stop without waiting for it.
  void sleepFor(double seconds) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!stopping_ && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
  mutable std::mutex mutex_;
  Handler handler_;
  std::vector<SeenRequest> seen_;
  std::atomic<bool> stopping_{false};
};

// A Chat Completions reply whose first choice says `content`.
inline std::string completionJson(const std::string& content) {
  const nlohmann::json reply = {
      {"id", "chatcmpl-test"},
      {"object", "chat.completion"},
      {"model", "test-model"},
      {"choices",
       nlohmann::json::array(
           {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}, {"finish_reason", "stop"}}})}};
  return reply.dump();
}

// Routes spdlog's default logger into a string for the test's lifetime.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
    logger->set_level(spdlog::level::trace);
    logger->set_pattern("%l %v");
    spdlog::set_default_logger(std::move(logger));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() const {
    spdlog::default_logger()->flush();
    return out_.str();
  }
  int countLines(const std::string& needle) const {
    std::istringstream in(text());
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace optiflow::synth::llmtest
