#include "optiflow/synth/pipeline.h"

#include <new>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "optiflow/dsl/parser.h"

namespace optiflow::synth {

std::string_view toString(Stage s) {
  switch (s) {
    case Stage::Parse:
      return "parse";
    case Stage::Expand:
      return "expand";
    case Stage::Compile:
      return "compile";
  }
  return "?";
}

Frontend parseAndExpand(std::string_view text, std::string_view fileName, const core::Topology& topology,
                        const dsl::ExpandOptions& options) {
  Frontend f;
  auto formatAll = [&](const std::vector<core::Diagnostic>& errors) {
    std::string m;
    for (const auto& d : errors) {
      if (!m.empty()) m += '\n';
      m += dsl::formatDiagnostic(d, text);
    }
    return m;
  };
  dsl::ParseResult parsed = dsl::parseProgram(text, fileName);
  if (!parsed.ok()) {
    f.failedAt = Stage::Parse;
    f.errors = std::move(parsed.errors);
    f.message = formatAll(f.errors);
    return f;
  }
  f.program = std::move(parsed.program);
  dsl::ExpandResult expanded = dsl::expand(*f.program, topology, fileName, options);
  if (!expanded.ok()) {
    f.failedAt = Stage::Expand;
    f.errors = std::move(expanded.errors);
    f.message = formatAll(f.errors);
    return f;
  }
  f.intent = std::move(expanded.intent);
  return f;
}

namespace {

// Whether some rank sends on a chunk it received (a relay, a ring, a tree): only then can the slices of a chunk
// that arrive first be forwarded while the rest is on the way.
bool forwards(const core::IntentProgram& intent) {
  std::unordered_set<std::uint64_t> received;
  auto key = [](int chunk, int rank) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(chunk)) << 32) | static_cast<std::uint32_t>(rank);
  };
  for (const core::Transfer& t : intent.transfers) {
    if (t.via >= 0 || received.count(key(t.chunk, t.src)) > 0) return true;
    received.insert(key(t.chunk, t.dst));
  }
  return false;
}

}  // namespace

std::vector<compiler::CompileOptions> candidateOptions(const core::IntentProgram& intent, std::uint64_t sizeBytes) {
  int bufferChunks = intent.nChunks();
  if (intent.collective == core::Collective::AllToAll) bufferChunks /= std::max(intent.nRanks, 1);
  const double chunk = static_cast<double>(sizeBytes) / std::max(bufferChunks, 1);
  std::vector<core::Protocol> protocols;
  // LL only pays off while a chunk is small, Simple only once it is not (docs/compiler.md).
  if (chunk <= 256.0 * 1024) protocols.push_back(core::Protocol::LL);
  protocols.push_back(core::Protocol::LL128);
  if (chunk >= 64.0 * 1024) protocols.push_back(core::Protocol::Simple);
  std::vector<compiler::CompileOptions> out;
  for (core::Protocol p : protocols) {
    for (int ch : {1, 2, 4}) {
      if (ch == 4 && (p != core::Protocol::Simple || chunk < 4.0 * 1048576)) continue;
      // Below 2 KiB a chunk's wire time is under a hop's latency: a second channel only doubles the steps (the
      // compiler still adds channels when a block would have too many).
      if (ch == 2 && p == core::Protocol::LL && chunk < 2048) continue;
      compiler::CompileOptions o;
      o.sizeBytes = sizeBytes;
      o.protocol = p;
      o.channels = ch;
      o.slices = ch;
      o.verify = false;
      out.push_back(o);
    }
  }
  // Simple on large chunks also with more slices than channels: a chunk's slices then ride one channel one after
  // another and the chunks are spread over the channels, so relays forward the first slices while the rest is on
  // the way (with one slice per channel every slice of a chunk arrives at the end at once; docs/compiler.md).
  if (chunk >= 8.0 * 1048576 && forwards(intent)) {
    for (auto [ch, sl] : {std::pair{4, 16}, std::pair{4, 32}}) {
      if (intent.transfers.size() * sl > 32768) continue;  // keeps the search fast: at most 32 Ki hops
      compiler::CompileOptions o;
      o.sizeBytes = sizeBytes;
      o.protocol = core::Protocol::Simple;
      o.channels = ch;
      o.slices = sl;
      o.verify = false;
      out.push_back(o);
    }
  }
  return out;
}

void prove(Evaluation& e, std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (!e.ok || e.proven || !e.compiled) return;
  try {
    compiler::VerifyOptions options;
    options.deadline = deadline;
    e.compiled->report = compiler::verify(e.compiled->schedule, options);
  } catch (const std::bad_alloc&) {
    e.ok = false;
    e.error = "out of memory while verifying";
    return;
  }
  if (e.compiled->report.timedOut) {
    e.ok = false;
    e.outOfTime = true;
    e.error = "not evaluated: the time budget ran out (while proving)";
    return;
  }
  if (!e.compiled->report.proven) {
    e.ok = false;
    e.error = "internal error: the best schedule is not proven: " +
              (e.compiled->report.errors.empty() ? std::string("?") : e.compiled->report.errors[0].str());
    return;
  }
  e.proven = true;
}

}  // namespace optiflow::synth
