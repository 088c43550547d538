#include "optiflow/synth/llm_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <utility>

#include "optiflow/core/env.h"

namespace optiflow::synth {
namespace {

constexpr std::string_view kCompletionsPath = "/chat/completions";
constexpr std::size_t kBodyHeadChars = 200;

void initCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string_view trimView(std::string_view s) {
  const auto isSpace = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isSpace(s.back())) s.remove_suffix(1);
  return s;
}

void replaceAll(std::string& s, std::string_view what, std::string_view with) {
  if (what.empty()) return;
  for (std::size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + with.size())) {
    s.replace(pos, what.size(), with);
  }
}

// The host part of a URL, lower case, without user info and port.
std::string hostOf(std::string_view url) {
  std::size_t start = url.find("://");
  start = start == std::string_view::npos ? 0 : start + 3;
  std::string_view rest = url.substr(start);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (std::size_t at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
  if (!rest.empty() && rest.front() == '[') {
    rest = rest.substr(0, rest.find(']') + 1);
  } else {
    rest = rest.substr(0, rest.find(':'));
  }
  std::string host(rest);
  std::transform(host.begin(), host.end(), host.begin(), [](unsigned char c) { return std::tolower(c); });
  return host;
}

// User info ("user:password@") never reaches a log line.
std::string withoutUserInfo(std::string_view url) {
  std::size_t start = url.find("://");
  start = start == std::string_view::npos ? 0 : start + 3;
  const std::size_t authorityEnd = std::min(url.find_first_of("/?#", start), url.size());
  const std::size_t at = url.substr(0, authorityEnd).rfind('@');
  if (at == std::string_view::npos || at < start) return std::string(url);
  return std::string(url.substr(0, start)) + std::string(url.substr(at + 1));
}

// The head of a server's body fit for one log line: control characters flattened, cut on a UTF-8 boundary.
std::string bodyHead(std::string_view body) {
  std::string head(trimView(body).substr(0, std::min(trimView(body).size(), kBodyHeadChars + 1)));
  const bool cut = head.size() > kBodyHeadChars;
  if (cut) {
    std::size_t end = kBodyHeadChars;
    while (end > 0 && (static_cast<unsigned char>(head[end]) & 0xC0) == 0x80) --end;
    head.resize(end);
  }
  for (char& c : head) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) c = ' ';
  }
  if (head.empty()) return "(empty body)";
  return cut ? head + "..." : head;
}

long toMillis(double seconds) { return std::max(1L, std::lround(seconds * 1000.0)); }

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

struct Sink {
  std::string body;
  std::size_t maxBytes = 0;
  bool overflow = false;
};

extern "C" std::size_t writeToSink(char* data, std::size_t size, std::size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t n = size * count;
  if (sink->body.size() + n > sink->maxBytes) {
    sink->overflow = true;
    return 0;  // curl fails the transfer with CURLE_WRITE_ERROR
  }
  sink->body.append(data, n);
  return n;
}

// One attempt's outcome.
struct Attempt {
  bool ok = false;
  bool retry = false;
  int httpStatus = 0;
  double retryAfterS = 0;  // the server's Retry-After, 0 when none
  std::string content;
  std::string error;
};

bool retriableCurlError(CURLcode code) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// The first choice's message content out of a 2xx body.
Attempt parseCompletion(const std::string& body, const std::string& where) {
  Attempt a;
  const nlohmann::json doc = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    a.error = fmt::format("malformed JSON from {}: {}", where, bodyHead(body));
    return a;
  }
  const nlohmann::json* content = nullptr;
  if (doc.is_object()) {
    const auto choices = doc.find("choices");
    if (choices != doc.end() && choices->is_array() && !choices->empty() && choices->front().is_object()) {
      const auto& first = choices->front();
      const auto message = first.find("message");
      if (message != first.end() && message->is_object()) {
        const auto c = message->find("content");
        if (c != message->end()) content = &*c;
      }
    }
  }
  if (content == nullptr || !content->is_string()) {
    a.error = fmt::format("reply from {} has no choices[0].message.content string: {}", where, bodyHead(body));
    return a;
  }
  a.content = content->get<std::string>();
  if (trimView(a.content).empty()) {
    a.error = fmt::format("empty content in the reply from {}", where);
    a.content.clear();
    return a;
  }
  a.ok = true;
  return a;
}

}  // namespace

LlmClient::LlmClient(LlmConfig config) : config_(std::move(config)) {}

std::string LlmClient::endpoint() const {
  std::string base(trimView(config_.baseUrl));
  std::string query;
  if (std::size_t q = base.find('?'); q != std::string::npos) {
    query = base.substr(q);
    base.resize(q);
  }
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (!std::string_view(base).ends_with(kCompletionsPath)) base += kCompletionsPath;
  return base + query;
}

ChatReply LlmClient::complete(const std::vector<ChatMessage>& messages) {
  ChatReply reply;
  // Everything that reaches a log line or the reply passes through here: the key must never appear.
  const auto redact = [this](std::string s) {
    replaceAll(s, config_.apiKey, "<redacted>");
    return s;
  };
  std::string where;
  try {
    initCurlOnce();
    const std::string url = endpoint();
    where = redact(withoutUserInfo(url));

    nlohmann::json request = {
        {"model", config_.model}, {"temperature", config_.temperature}, {"max_tokens", config_.maxTokens}};
    nlohmann::json& list = request["messages"] = nlohmann::json::array();
    for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    // Replace rather than throw on invalid UTF-8 in a prompt (it may quote a model's earlier output).
    const std::string body = request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

    const bool keyIsClean = std::none_of(config_.apiKey.begin(), config_.apiKey.end(),
                                         [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
    if (!keyIsClean) {
      // A line break in a header value would let the key's file inject headers.
      reply.error = fmt::format("the API key contains control characters; no request sent to {}", where);
      spdlog::warn("{}", reply.error);
      return reply;
    }

    std::unique_ptr<curl_slist, SlistDeleter> headers;
    const auto addHeader = [&headers](const std::string& h) {
      curl_slist* next = curl_slist_append(headers.get(), h.c_str());
      if (next != nullptr) {
        (void)headers.release();
        headers.reset(next);
      }
    };
    addHeader("Content-Type: application/json");
    addHeader("Accept: application/json");
    addHeader("Expect:");  // no 100-continue round trip for large prompts
    if (!config_.apiKey.empty()) {
      addHeader("Authorization: Bearer " + config_.apiKey);
      if (hostOf(url).ends_with(".openai.azure.com")) addHeader("api-key: " + config_.apiKey);
    }

    const int maxAttempts = std::max(1, config_.maxAttempts);
    double backoff = std::max(0.0, config_.backoffS);
    for (int attempt = 1; attempt <= maxAttempts; ++attempt) {
      reply.attempts = attempt;
      Attempt a;
      Sink sink;
      sink.maxBytes = config_.maxReplyBytes;
      std::unique_ptr<CURL, CurlDeleter> handle(curl_easy_init());
      if (!handle) {
        a.error = "cannot create a curl handle";
      } else {
        CURL* h = handle.get();
        curl_easy_setopt(h, CURLOPT_URL, url.c_str());
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
        curl_easy_setopt(h, CURLOPT_USERAGENT, "optiflow");
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, toMillis(config_.timeoutS));
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, toMillis(config_.connectTimeoutS));
        curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever curl can decode
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &writeToSink);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
        const CURLcode code = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        a.httpStatus = static_cast<int>(status);
        if (sink.overflow) {
          a.error = fmt::format("reply from {} is larger than {} bytes (maxReplyBytes)", where, config_.maxReplyBytes);
        } else if (code != CURLE_OK) {
          a.retry = retriableCurlError(code);
          a.error = code == CURLE_OPERATION_TIMEDOUT
                        ? fmt::format("timed out after {}s waiting for {}", config_.timeoutS, where)
                        : fmt::format("request to {} failed: {}", where, curl_easy_strerror(code));
        } else if (status < 200 || status > 299) {
          a.retry = status == 429 || status == 408 || status >= 500;
          curl_off_t retryAfter = 0;
          if (status == 429 && curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &retryAfter) == CURLE_OK && retryAfter > 0) {
            a.retryAfterS = static_cast<double>(retryAfter);
          }
          a.error = fmt::format("HTTP {} from {}: {}", status, where, bodyHead(sink.body));
        } else {
          Attempt parsed = parseCompletion(sink.body, where);
          parsed.httpStatus = a.httpStatus;
          a = std::move(parsed);
        }
      }
      reply.httpStatus = a.httpStatus;
      if (a.ok) {
        reply.ok = true;
        reply.content = std::move(a.content);
        reply.error.clear();
        spdlog::debug("LLM reply from {} on attempt {}: {} chars", where, attempt, reply.content.size());
        return reply;
      }
      reply.error = redact(std::move(a.error));
      if (!a.retry || attempt == maxAttempts) {
        spdlog::warn("LLM request to {} failed (attempt {}/{}): {}; {}", where, attempt, maxAttempts, reply.error,
                     a.retry ? "giving up" : "not retried");
        return reply;
      }
      const double wait = std::min(a.retryAfterS > 0 ? a.retryAfterS : backoff, std::max(0.0, config_.maxBackoffS));
      spdlog::warn("LLM request to {} failed (attempt {}/{}): {}; retrying in {:.2f}s", where, attempt, maxAttempts,
                   reply.error, wait);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      backoff *= 2;
    }
  } catch (const std::exception& e) {
    reply.ok = false;
    reply.content.clear();
    reply.error = redact(fmt::format("LLM request to {} failed: {}", where, e.what()));
    spdlog::warn("{}", reply.error);
  } catch (...) {
    reply.ok = false;
    reply.content.clear();
    reply.error = redact(fmt::format("LLM request to {} failed: unknown exception", where));
    spdlog::warn("{}", reply.error);
  }
  return reply;
}

core::Result<std::string> resolveApiKey(const std::optional<std::string>& keyFile) {
  if (keyFile) {
    std::ifstream in(*keyFile);
    std::string line;
    if (!in) return core::Diagnostic{*keyFile, 0, 0, "cannot open the API key file"};
    if (!std::getline(in, line) && !in.eof()) {
      return core::Diagnostic{*keyFile, 0, 0, "cannot read the API key file"};
    }
    const std::string_view key = trimView(line);
    if (key.empty()) return core::Diagnostic{*keyFile, 1, 0, "the API key file's first line is empty"};
    return std::string(key);
  }
  const core::env::Value env =
      core::env::read(core::env::find(core::env::kDaemonParams, "OPTIFLOW_LLM_API_KEY"), core::env::processEnv);
  return env.text ? std::string(trimView(*env.text)) : std::string();
}

}  // namespace optiflow::synth
