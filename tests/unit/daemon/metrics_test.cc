// Metrics in the Prometheus text format 0.0.4 (parsed back line by line), and the /healthz + /metrics server.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../../daemon/src/http_server.h"
#include "optiflow/daemon/metrics.h"

namespace optiflow::daemon {
namespace {

struct Parsed {
  std::vector<std::string> order;                 // family names in the order of their TYPE lines
  std::map<std::string, std::string> type, help;  // by family
  std::map<std::string, std::string> samples;     // "name{labels}" -> value text
  std::string error;
};

// A strict reader of the text format: HELP, then TYPE, then the family's samples; label values quoted and escaped.
Parsed parse(const std::string& text) {
  static const std::regex kHelp(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$)");
  static const std::regex kType(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|untyped)$)");
  // name{label="value",...} value; a value is any character but ", \ and newline, or one of the escapes \\ \" \n.
  static const std::string kLabel = R"([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")";
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{()" + kLabel + "(," + kLabel + R"()*)\})? (\S+)$)");
  Parsed p;
  if (!text.empty() && text.back() != '\n') p.error = "no final newline";
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, kHelp)) {
      p.help[m[1]] = m[2];
    } else if (std::regex_match(line, m, kType)) {
      if (p.type.count(m[1])) p.error = "TYPE twice: " + line;
      current = m[1];
      p.type[current] = m[2];
      p.order.push_back(current);
    } else if (std::regex_match(line, m, kSample)) {
      if (m[1] != current) p.error = "sample outside its family: " + line;
      p.samples[std::string(m[1]) + std::string(m[2])] = m[7];
    } else {
      p.error = "bad line: " + line;
    }
  }
  return p;
}

TEST(MetricsTest, RendersTheTextFormatInADeterministicOrder) {
  Metrics m;
  m.describe("optiflowd_up", "gauge", "1 while optiflowd runs");
  m.describe("optiflowd_errors_total", "counter", "Errors by kind");
  m.set("optiflowd_up", 1);
  m.add("optiflowd_errors_total", 1, promLabels({{"kind", "publish"}}));
  m.add("optiflowd_errors_total", 2, promLabels({{"kind", "config"}}));
  m.add("optiflowd_errors_total", 1, promLabels({{"kind", "publish"}}));
  m.set("optiflowd_best_speedup", 1.25, promLabels({{"collective", "allgather"}, {"size", "1048576"}}));
  const std::string text = m.renderPrometheus();
  const Parsed p = parse(text);
  ASSERT_TRUE(p.error.empty()) << p.error << "\n" << text;
  EXPECT_EQ(p.order, (std::vector<std::string>{"optiflowd_best_speedup", "optiflowd_errors_total", "optiflowd_up"}));
  EXPECT_EQ(p.type.at("optiflowd_up"), "gauge");
  EXPECT_EQ(p.type.at("optiflowd_errors_total"), "counter");
  EXPECT_EQ(p.type.at("optiflowd_best_speedup"), "untyped");  // never described
  EXPECT_EQ(p.help.at("optiflowd_errors_total"), "Errors by kind");
  EXPECT_EQ(p.samples.at("optiflowd_up"), "1");
  EXPECT_EQ(p.samples.at("optiflowd_errors_total{kind=\"publish\"}"), "2");
  EXPECT_EQ(p.samples.at("optiflowd_errors_total{kind=\"config\"}"), "2");
  EXPECT_EQ(p.samples.at("optiflowd_best_speedup{collective=\"allgather\",size=\"1048576\"}"), "1.25");
  // Labels sort within a family, so two renders of the same values are identical.
  EXPECT_LT(text.find("kind=\"config\""), text.find("kind=\"publish\""));
  EXPECT_EQ(text, m.renderPrometheus());
  EXPECT_DOUBLE_EQ(m.get("optiflowd_errors_total", "kind=\"publish\""), 2);
  EXPECT_DOUBLE_EQ(m.get("optiflowd_errors_total", "kind=\"none\""), 0);
  EXPECT_DOUBLE_EQ(m.get("nothing"), 0);
}

TEST(MetricsTest, EscapesLabelValuesAndHelpText) {
  Metrics m;
  m.describe("optiflowd_probe_latency_us", "gauge", "one\\two\nthree");
  const std::string peer = "we\"ird\\peer\nname";
  m.set("optiflowd_probe_latency_us", 3.5, promLabels({{"peer", peer}}));
  const std::string text = m.renderPrometheus();
  const Parsed p = parse(text);
  ASSERT_TRUE(p.error.empty()) << p.error << "\n" << text;
  EXPECT_EQ(p.help.at("optiflowd_probe_latency_us"), "one\\\\two\\nthree");
  EXPECT_EQ(p.samples.at("optiflowd_probe_latency_us{peer=\"we\\\"ird\\\\peer\\nname\"}"), "3.5");
  EXPECT_EQ(promLabels({{"a", "1"}, {"b", ""}}), "a=\"1\",b=\"\"");
}

TEST(MetricsTest, SpecialValuesAndBadNames) {
  Metrics m;
  m.set("g_inf", std::numeric_limits<double>::infinity());
  m.set("g_ninf", -std::numeric_limits<double>::infinity());
  m.set("g_nan", std::numeric_limits<double>::quiet_NaN());
  m.set("g_big", 1e20);
  m.set("9bad-name", 2);
  m.describe("g_weird_type", "histogram-ish", "x");
  const std::string text = m.renderPrometheus();
  const Parsed p = parse(text);
  ASSERT_TRUE(p.error.empty()) << p.error << "\n" << text;
  EXPECT_EQ(p.samples.at("g_inf"), "+Inf");
  EXPECT_EQ(p.samples.at("g_ninf"), "-Inf");
  EXPECT_EQ(p.samples.at("g_nan"), "NaN");
  EXPECT_DOUBLE_EQ(std::stod(p.samples.at("g_big")), 1e20);
  EXPECT_EQ(p.samples.at("_bad_name"), "2");  // repaired, not dropped
  EXPECT_EQ(p.type.at("g_weird_type"), "untyped");
  EXPECT_DOUBLE_EQ(m.get("9bad-name"), 2);
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m] {
      for (int i = 0; i < 10000; ++i) {
        m.add("optiflowd_synthesis_candidates_total", 1);
        if (i % 100 == 0) (void)m.renderPrometheus();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_DOUBLE_EQ(m.get("optiflowd_synthesis_candidates_total"), 40000);
}

// ---- HTTP ----

struct Reply {
  int status = 0;
  std::string headers, body;
};

Reply get(int port, const std::string& path) {
  Reply r;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return r;
  }
  std::string all;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) all.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto split = all.find("\r\n\r\n");
  if (split == std::string::npos || all.rfind("HTTP/1.1 ", 0) != 0) return r;
  r.status = std::stoi(all.substr(9, 3));
  r.headers = all.substr(0, split);
  r.body = all.substr(split + 4);
  return r;
}

TEST(HttpServerTest, ServesHealthAndMetricsAndStopsQuickly) {
  Metrics m;
  m.describe("optiflowd_up", "gauge", "up");
  m.set("optiflowd_up", 1);
  std::string problem;
  std::mutex mu;
  HttpServer::Handlers h;
  h.unhealthy = [&] {
    std::lock_guard lock(mu);
    return problem;
  };
  h.metrics = [&] { return m.renderPrometheus(); };
  auto server = HttpServer::start("127.0.0.1", 0, h);
  ASSERT_TRUE(server.ok()) << server.error().str();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  Reply health = get(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  {
    std::lock_guard lock(mu);
    problem = "the schedule cache /dev/shm/optiflow-x cannot be written";
  }
  health = get(port, "/healthz");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, "the schedule cache /dev/shm/optiflow-x cannot be written\n");

  const Reply metrics = get(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("text/plain; version=0.0.4"), std::string::npos) << metrics.headers;
  EXPECT_EQ(metrics.body, m.renderPrometheus());
  EXPECT_EQ(get(port, "/nothing").status, 404);

  // A second server on the same port is refused with a message naming it.
  auto clash = HttpServer::start("127.0.0.1", port, h);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().str().find("127.0.0.1:" + std::to_string(port)), std::string::npos);

  // An idle keep-alive client must not hold stop() up.
  const int idle = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const auto t0 = std::chrono::steady_clock::now();
  (*server)->stop();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.5);
  ::close(idle);
  EXPECT_EQ(get(port, "/healthz").status, 0);  // nobody listens any more
}

TEST(HttpServerTest, StopRightAfterStartDoesNotHang) {
  for (int i = 0; i < 5; ++i) {
    auto server = HttpServer::start("127.0.0.1", 0, {});
    ASSERT_TRUE(server.ok()) << server.error().str();
    const auto t0 = std::chrono::steady_clock::now();
    server->reset();  // the destructor stops
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
  }
}

}  // namespace
}  // namespace optiflow::daemon
