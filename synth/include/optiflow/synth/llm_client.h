// An OpenAI-compatible Chat Completions client over libcurl (vLLM, Ollama, llama.cpp server, OpenAI, Azure
// OpenAI). It never throws and never crashes on a bad reply: every failure comes back as a ChatReply with ok = false
// and an error naming what went wrong. The API key is sent as a Bearer token and never logged or written out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optiflow/core/error.h"

namespace optiflow::synth {

struct LlmConfig {
  // ".../v1" gets "/chat/completions" appended; a URL that already ends in "/chat/completions" (possibly with a
  // query, as Azure's "?api-version=...") is used as is.
  std::string baseUrl;
  std::string model;
  std::string apiKey;     // empty: no Authorization header (local servers)
  double timeoutS = 120;  // per attempt, whole request
  double connectTimeoutS = 10;
  int maxAttempts = 4;                   // attempts per completion, the first included
  double backoffS = 1.0;                 // wait before the second attempt; doubles each time, capped by maxBackoffS
  double maxBackoffS = 30.0;             // also caps a server's Retry-After
  std::size_t maxReplyBytes = 8u << 20;  // a larger HTTP body is refused (not retried)
  double temperature = 0.7;
  int maxTokens = 4096;
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

struct ChatReply {
  bool ok = false;
  std::string content;  // the first choice's message content, when ok
  std::string error;    // when !ok: the last attempt's failure, e.g. "HTTP 503 from http://host/v1/...: <body head>"
  int httpStatus = 0;   // of the last attempt; 0 when no HTTP reply came
  int attempts = 0;
};

class LlmClient {
 public:
  explicit LlmClient(LlmConfig config);
  // Retries timeouts, connection errors, 429 (honouring Retry-After) and 5xx with backoff; does not retry other
  // 4xx, malformed JSON, an empty or oversize reply. Each failure is logged (spdlog) on one line.
  ChatReply complete(const std::vector<ChatMessage>& messages);
  const LlmConfig& config() const { return config_; }
  std::string endpoint() const;  // the URL requests go to

 private:
  LlmConfig config_;
};

// The API key: the file's first line when keyFile is set (an unreadable file is an error naming it), else the
// OPTIFLOW_LLM_API_KEY environment variable (core::env::kDaemonParams), else empty.
core::Result<std::string> resolveApiKey(const std::optional<std::string>& keyFile);

}  // namespace optiflow::synth
