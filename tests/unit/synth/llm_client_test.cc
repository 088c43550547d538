// The real libcurl client against a local OpenAI-compatible server: the request it sends, and each way a reply can
// fail (retried or not), with the key kept out of every log line and error.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llm_test_support.h"
#include "optiflow/synth/llm_client.h"

namespace optiflow::synth {
namespace {

using llmtest::completionJson;
using llmtest::FakeLlmServer;
using llmtest::LogCapture;

constexpr const char* kKey = "sk-test-5ecret-0123456789";

LlmConfig fastConfig(const std::string& baseUrl) {
  LlmConfig c;
  c.baseUrl = baseUrl;
  c.model = "test-model";
  c.apiKey = kKey;
  c.timeoutS = 30;  // only a hung test waits this long: the replies here come at once, or the test sets its own
  c.connectTimeoutS = 10;
  c.maxAttempts = 3;
  c.backoffS = 0.01;
  c.maxBackoffS = 0.05;
  c.temperature = 0.25;
  c.maxTokens = 321;
  return c;
}

const std::vector<ChatMessage> kMessages = {{"system", "You write programs."}, {"user", "Write a ring, \"please\"."}};

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(LlmClient, SendsAnOpenAiRequestAndReturnsTheContent) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(completionJson("```ofl\nallgather r\n  allgather all by ring\n```"), "application/json");
  });
  LogCapture logs;
  LlmClient client(fastConfig(server.baseUrl()));
  const ChatReply reply = client.complete(kMessages);

  ASSERT_TRUE(reply.ok) << reply.error;
  EXPECT_EQ(reply.content, "```ofl\nallgather r\n  allgather all by ring\n```");
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_EQ(reply.httpStatus, 200);
  EXPECT_TRUE(reply.error.empty());

  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].target, "/v1/chat/completions");
  EXPECT_EQ(seen[0].authorization, std::string("Bearer ") + kKey);
  EXPECT_TRUE(seen[0].apiKey.empty()) << "api-key is for Azure hosts only";
  EXPECT_NE(seen[0].contentType.find("application/json"), std::string::npos);
  const nlohmann::json body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body.at("model"), "test-model");
  EXPECT_DOUBLE_EQ(body.at("temperature").get<double>(), 0.25);
  EXPECT_EQ(body.at("max_tokens"), 321);
  ASSERT_EQ(body.at("messages").size(), 2u);
  EXPECT_EQ(body["messages"][0].at("role"), "system");
  EXPECT_EQ(body["messages"][0].at("content"), "You write programs.");
  EXPECT_EQ(body["messages"][1].at("role"), "user");
  EXPECT_EQ(body["messages"][1].at("content"), "Write a ring, \"please\".");
  EXPECT_EQ(logs.text().find(kKey), std::string::npos);
}

TEST(LlmClient, SendsNoAuthorizationWithoutAKey) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(completionJson("hello"), "application/json");
  });
  LlmConfig config = fastConfig(server.baseUrl());
  config.apiKey.clear();
  const ChatReply reply = LlmClient(config).complete(kMessages);
  ASSERT_TRUE(reply.ok) << reply.error;
  ASSERT_EQ(server.calls(), 1);
  EXPECT_TRUE(server.seen()[0].authorization.empty());
}

TEST(LlmClient, KeyNeverReachesLogsOrErrorsEvenWhenTheServerEchoesIt) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request& req, httplib::Response& res, int) {
    res.status = 503;
    res.set_content("overloaded; you sent " + req.get_header_value("Authorization"), "text/plain");
  });
  LogCapture logs;
  LlmClient client(fastConfig(server.baseUrl()));
  const ChatReply reply = client.complete(kMessages);
  ASSERT_FALSE(reply.ok);
  EXPECT_EQ(reply.error.find(kKey), std::string::npos) << reply.error;
  EXPECT_NE(reply.error.find("<redacted>"), std::string::npos) << reply.error;
  const std::string text = logs.text();
  EXPECT_EQ(text.find(kKey), std::string::npos) << text;
  EXPECT_EQ(logs.countLines("overloaded; you sent Bearer <redacted>"), 3) << text;
}

TEST(LlmClient, RetriesA429HonouringRetryAfterCappedByMaxBackoff) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int call) {
    if (call == 1) {
      res.status = 429;
      res.set_header("Retry-After", "60");
      res.set_content(R"({"error":{"message":"rate limited"}})", "application/json");
      return;
    }
    res.set_content(completionJson("second time lucky"), "application/json");
  });
  LogCapture logs;
  LlmConfig config = fastConfig(server.baseUrl());
  // Retry-After says 60 s: the wait must be the 0.3 s cap, not the 0.01 s backoff and not the minute. The upper
  // limit is far from both (a slow machine adds to the 0.3 s, never 20 s).
  config.maxBackoffS = 0.3;
  const auto start = std::chrono::steady_clock::now();
  const ChatReply reply = LlmClient(config).complete(kMessages);
  const double elapsed = secondsSince(start);
  ASSERT_TRUE(reply.ok) << reply.error;
  EXPECT_EQ(reply.content, "second time lucky");
  EXPECT_EQ(reply.attempts, 2);
  EXPECT_EQ(server.calls(), 2);
  EXPECT_GE(elapsed, 0.28);
  EXPECT_LT(elapsed, 20.0);
  EXPECT_EQ(logs.countLines("HTTP 429"), 1) << logs.text();
  EXPECT_NE(logs.text().find("rate limited"), std::string::npos);
}

TEST(LlmClient, RetriesA5xxThenSucceeds) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int call) {
    if (call == 1) {
      res.status = 502;
      res.set_content("bad gateway", "text/plain");
      return;
    }
    res.set_content(completionJson("ok now"), "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  ASSERT_TRUE(reply.ok) << reply.error;
  EXPECT_EQ(reply.content, "ok now");
  EXPECT_EQ(reply.attempts, 2);
  EXPECT_EQ(reply.httpStatus, 200);
}

TEST(LlmClient, GivesUpAfterMaxAttemptsOfA5xx) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.status = 503;
    res.set_content("{\"error\": \"model is\nloading\"}", "application/json");
  });
  LogCapture logs;
  LlmConfig config = fastConfig(server.baseUrl());
  config.maxAttempts = 4;
  const ChatReply reply = LlmClient(config).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 4);
  EXPECT_EQ(server.calls(), 4);
  EXPECT_EQ(reply.httpStatus, 503);
  EXPECT_NE(reply.error.find("HTTP 503"), std::string::npos) << reply.error;
  EXPECT_NE(reply.error.find(server.baseUrl()), std::string::npos);
  EXPECT_NE(reply.error.find("model is loading"), std::string::npos) << "newlines flattened: " << reply.error;
  EXPECT_TRUE(reply.content.empty());
  // One line per failed attempt, each naming the endpoint and the attempt.
  EXPECT_EQ(logs.countLines("HTTP 503"), 4) << logs.text();
  EXPECT_EQ(logs.countLines("(attempt 4/4)"), 1) << logs.text();
  EXPECT_EQ(logs.countLines(server.baseUrl() + "/chat/completions"), 4) << logs.text();
}

TEST(LlmClient, DoesNotRetryA400) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.status = 400;
    res.set_content(R"({"error":{"message":"unknown model 'test-model'"}})", "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_EQ(server.calls(), 1);
  EXPECT_EQ(reply.httpStatus, 400);
  EXPECT_NE(reply.error.find("HTTP 400"), std::string::npos) << reply.error;
  EXPECT_NE(reply.error.find("unknown model"), std::string::npos) << reply.error;
}

TEST(LlmClient, DoesNotRetryMalformedJson) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content("{\"choices\": [ {\"message\": ", "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_EQ(server.calls(), 1);
  EXPECT_EQ(reply.httpStatus, 200);
  EXPECT_NE(reply.error.find("malformed JSON"), std::string::npos) << reply.error;
}

TEST(LlmClient, DoesNotRetryJsonWithoutChoices) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(R"({"object":"chat.completion","choices":[]})", "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_NE(reply.error.find("choices[0].message.content"), std::string::npos) << reply.error;
}

TEST(LlmClient, RejectsANonStringContent) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(R"({"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[]}}]})",
                    "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_NE(reply.error.find("choices[0].message.content"), std::string::npos) << reply.error;
}

TEST(LlmClient, DoesNotRetryEmptyContent) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(completionJson("  \n "), "application/json");
  });
  const ChatReply reply = LlmClient(fastConfig(server.baseUrl())).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_EQ(server.calls(), 1);
  EXPECT_TRUE(reply.content.empty());
  EXPECT_NE(reply.error.find("empty content"), std::string::npos) << reply.error;
}

TEST(LlmClient, RefusesAReplyLargerThanMaxReplyBytes) {
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(completionJson(std::string(64 << 10, 'x')), "application/json");
  });
  LlmConfig config = fastConfig(server.baseUrl());
  config.maxReplyBytes = 4096;
  const ChatReply reply = LlmClient(config).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1);
  EXPECT_EQ(server.calls(), 1);
  EXPECT_TRUE(reply.content.empty());
  EXPECT_NE(reply.error.find("larger than 4096 bytes"), std::string::npos) << reply.error;
}

TEST(LlmClient, AcceptsAReplyJustUnderMaxReplyBytes) {
  FakeLlmServer server;
  const std::string body = completionJson(std::string(3000, 'y'));
  server.onPost(
      [&body](const httplib::Request&, httplib::Response& res, int) { res.set_content(body, "application/json"); });
  LlmConfig config = fastConfig(server.baseUrl());
  config.maxReplyBytes = body.size();
  const ChatReply reply = LlmClient(config).complete(kMessages);
  ASSERT_TRUE(reply.ok) << reply.error;
  EXPECT_EQ(reply.content, std::string(3000, 'y'));
}

TEST(LlmClient, TimesOutEachAttemptAndRetries) {
  FakeLlmServer server;
  // The server answers after a minute (or when the test ends); each attempt must give up after its 0.3 s. The upper
  // limit is far from both: a slow machine adds to the 2 x 0.3 s, never 20 s.
  server.onPost([&server](const httplib::Request&, httplib::Response& res, int) {
    server.sleepFor(60.0);
    res.set_content(completionJson("too late"), "application/json");
  });
  LogCapture logs;
  LlmConfig config = fastConfig(server.baseUrl());
  config.timeoutS = 0.3;
  config.maxAttempts = 2;
  const auto start = std::chrono::steady_clock::now();
  const ChatReply reply = LlmClient(config).complete(kMessages);
  const double elapsed = secondsSince(start);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 2);
  EXPECT_EQ(reply.httpStatus, 0);
  EXPECT_NE(reply.error.find("timed out"), std::string::npos) << reply.error;
  EXPECT_GE(elapsed, 0.55);
  EXPECT_LT(elapsed, 20.0);
  EXPECT_EQ(logs.countLines("timed out"), 2) << logs.text();
}

TEST(LlmClient, RetriesARefusedConnection) {
  const int port = llmtest::unusedPort();
  ASSERT_GT(port, 0);
  LogCapture logs;
  LlmConfig config = fastConfig(fmt::format("http://127.0.0.1:{}/v1", port));
  const ChatReply reply = LlmClient(config).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 3);
  EXPECT_EQ(reply.httpStatus, 0);
  EXPECT_NE(reply.error.find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << reply.error;
  EXPECT_EQ(logs.countLines("failed (attempt"), 3) << logs.text();
  EXPECT_EQ(logs.countLines("giving up"), 1) << logs.text();
}

TEST(LlmClient, SendsApiKeyHeaderToAzureHosts) {
  // The Azure host cannot resolve here, so the request goes through the test server as an HTTP proxy.
  FakeLlmServer server;
  server.onPost([](const httplib::Request&, httplib::Response& res, int) {
    res.set_content(completionJson("from azure"), "application/json");
  });
  const std::string proxy = fmt::format("http://127.0.0.1:{}", server.port());
  const char* oldProxy = std::getenv("http_proxy");
  const std::string saved = oldProxy != nullptr ? oldProxy : "";
  ::setenv("http_proxy", proxy.c_str(), 1);
  ::unsetenv("no_proxy");
  ::unsetenv("NO_PROXY");
  LlmConfig config =
      fastConfig("http://myres.openai.azure.com/openai/deployments/gpt/chat/completions?api-version=2024-06-01");
  const ChatReply reply = LlmClient(config).complete(kMessages);
  if (oldProxy != nullptr) {
    ::setenv("http_proxy", saved.c_str(), 1);
  } else {
    ::unsetenv("http_proxy");
  }
  ASSERT_TRUE(reply.ok) << reply.error;
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].apiKey, kKey);
  EXPECT_EQ(seen[0].authorization, std::string("Bearer ") + kKey);
  EXPECT_NE(seen[0].target.find("/openai/deployments/gpt/chat/completions?api-version=2024-06-01"), std::string::npos)
      << seen[0].target;
}

TEST(LlmClient, EndpointAppendsChatCompletionsOnce) {
  const auto endpointOf = [](const std::string& base) {
    LlmConfig c;
    c.baseUrl = base;
    return LlmClient(c).endpoint();
  };
  EXPECT_EQ(endpointOf("http://localhost:8000/v1"), "http://localhost:8000/v1/chat/completions");
  EXPECT_EQ(endpointOf("http://localhost:8000/v1/"), "http://localhost:8000/v1/chat/completions");
  EXPECT_EQ(endpointOf("https://api.openai.com/v1/chat/completions"), "https://api.openai.com/v1/chat/completions");
  EXPECT_EQ(endpointOf("https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=1"),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=1");
  EXPECT_EQ(endpointOf("https://x.openai.azure.com/openai/deployments/d?api-version=1"),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=1");
}

TEST(LlmClient, NeverThrowsOnAnUnusableUrl) {
  LogCapture logs;
  LlmConfig config;
  config.baseUrl = "notaprotocol://nowhere";
  config.maxAttempts = 3;
  config.backoffS = 0.01;
  const ChatReply reply = LlmClient(config).complete(kMessages);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.attempts, 1) << "an unsupported protocol is not retried";
  EXPECT_FALSE(reply.error.empty());
}

class ApiKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("OPTIFLOW_LLM_API_KEY"); v != nullptr) saved_ = v;
    ::unsetenv("OPTIFLOW_LLM_API_KEY");
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("optiflow-llm-key-{}-{}", ::getpid(), ::testing::UnitTest::GetInstance()->random_seed());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (saved_) {
      ::setenv("OPTIFLOW_LLM_API_KEY", saved_->c_str(), 1);
    } else {
      ::unsetenv("OPTIFLOW_LLM_API_KEY");
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::optional<std::string> saved_;
  std::filesystem::path dir_;
};

TEST_F(ApiKeyTest, FileFirstLineWins) {
  ::setenv("OPTIFLOW_LLM_API_KEY", "from-env", 1);
  const auto key = resolveApiKey(write("key", "  sk-file\r\nsecond line\n"));
  ASSERT_TRUE(key.ok()) << key.error().str();
  EXPECT_EQ(*key, "sk-file");
}

TEST_F(ApiKeyTest, UnreadableFileIsAnErrorNamingIt) {
  const std::string missing = (dir_ / "no-such-key").string();
  const auto key = resolveApiKey(missing);
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.error().str().find(missing), std::string::npos) << key.error().str();
  const auto dirKey = resolveApiKey(dir_.string());
  ASSERT_FALSE(dirKey.ok());
  EXPECT_NE(dirKey.error().str().find(dir_.string()), std::string::npos) << dirKey.error().str();
}

TEST_F(ApiKeyTest, EmptyFileIsAnError) {
  const std::string path = write("empty", "\n");
  const auto key = resolveApiKey(path);
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.error().str().find(path), std::string::npos);
}

TEST_F(ApiKeyTest, EnvironmentThenEmpty) {
  auto none = resolveApiKey(std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  ::setenv("OPTIFLOW_LLM_API_KEY", "sk-env\n", 1);
  auto env = resolveApiKey(std::nullopt);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(*env, "sk-env");
}

}  // namespace
}  // namespace optiflow::synth
