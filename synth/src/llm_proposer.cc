#include "optiflow/synth/llm_proposer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>
#include <utility>

#include "optiflow/core/schedule.h"
#include "optiflow/core/units.h"
#include "optiflow/synth/gallery.h"
#include "optiflow/synth/reply_parser.h"

namespace optiflow::synth {
namespace {

// One entry cannot crowd out the others: longer program texts and error lists are cut.
constexpr std::size_t kMaxShownProgramBytes = 6000;
constexpr std::size_t kMaxShownErrorBytes = 4000;
constexpr std::size_t kMaxListedNames = 64;
constexpr std::size_t kMaxListedNics = 16;
constexpr std::size_t kMaxListedLinks = 32;

std::string joinInts(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += fmt::format("{}{}", s.empty() ? "" : ",", x);
  return s;
}

std::string cut(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) return std::string(text);
  std::size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return fmt::format("{}\n... ({} more bytes cut)", text.substr(0, end), text.size() - end);
}

std::string trimmedBlock(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.remove_suffix(1);
  return std::string(text);
}

// The name in a program's header ("allgather my_ring" -> "my_ring"); empty when the first statement is not one.
std::string headerName(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())) != 0) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    const std::size_t sp = line.find_first_of(" \t");
    if (sp == std::string_view::npos) return {};
    std::string_view rest = line.substr(sp);
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front())) != 0) rest.remove_prefix(1);
    std::size_t n = 0;
    while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) != 0 || rest[n] == '_')) ++n;
    return std::string(rest.substr(0, n));
  }
  return {};
}

// A shown candidate the model is asked to repair: rejected, or compiled but failed at every size.
bool failed(const CandidateRecord& r) {
  if (r.stage == "duplicate") return false;
  if (r.stage != "ok") return true;
  return !r.sizes.empty() && std::none_of(r.sizes.begin(), r.sizes.end(), [](const SizeResult& s) { return s.ok; });
}

const SizeResult* resultAt(const CandidateRecord& r, std::uint64_t size) {
  for (const SizeResult& s : r.sizes) {
    if (s.sizeBytes == size) return &s;
  }
  return nullptr;
}

std::string ratio(double num, double den) { return den > 0 ? fmt::format("{:.2f}x", num / den) : std::string("n/a"); }

std::string describeTime(const SizeResult& s) {
  std::string line =
      fmt::format("{:.1f} us = {} the lower bound ({:.1f} us)", s.timeUs, ratio(s.timeUs, s.boundUs), s.boundUs);
  if (s.ncclUs > 0) {
    line += fmt::format("; NCCL {:.1f} us, so {} NCCL's time", s.ncclUs, ratio(s.timeUs, s.ncclUs));
  } else {
    line += "; NCCL has no schedule here";
  }
  if (!s.config.empty()) line += fmt::format("; config {}", s.config);
  if (!s.bottleneck.empty()) line += fmt::format("; bottleneck {}", s.bottleneck);
  return line;
}

std::string describeRecord(const CandidateRecord& r) {
  const std::string name = r.name.empty() ? std::string("(unnamed)") : r.name;
  if (r.stage == "duplicate") {
    return fmt::format("### {} {} ({}): a duplicate of an earlier program, not evaluated again\n\n", r.id, name,
                       r.origin);
  }
  std::string out;
  if (r.stage != "ok") {
    out += fmt::format("### {} {} ({}): REJECTED at {}\n", r.id, name, r.origin, r.stage);
  } else {
    out += fmt::format("### {} {} ({}): {}\n", r.id, name, r.origin,
                       failed(r) ? "compiled, but FAILED at every size" : "compiled and verified");
  }
  out += fmt::format("```ofl\n{}\n```\n", trimmedBlock(cut(r.text, kMaxShownProgramBytes)));
  if (r.stage != "ok") {
    out += fmt::format("Errors:\n```text\n{}\n```\n", trimmedBlock(cut(r.errors, kMaxShownErrorBytes)));
  }
  for (const SizeResult& s : r.sizes) {
    if (s.ok) {
      out += fmt::format("- {}: {}\n", core::formatSize(s.sizeBytes), describeTime(s));
    } else {
      out += fmt::format("- {}: failed:\n```text\n{}\n```\n", core::formatSize(s.sizeBytes),
                         trimmedBlock(cut(s.error, kMaxShownErrorBytes)));
    }
  }
  return out + "\n";
}

std::string systemMessage(const ProposalContext& context) {
  const std::string_view coll = core::toString(context.collective);
  return fmt::format(
      "You design collective-communication algorithms for GPU clusters by writing programs in the OptiFlow "
      "language. You say where data goes; a deterministic compiler decides when and on which link every byte "
      "moves, a verifier proves the result correct, and a simulator times it on the cluster. You will see the "
      "results of earlier programs and improve on them.\n\n"
      "The language reference follows.\n\n"
      "<language-reference>\n{}\n</language-reference>\n\n"
      "Rules for your reply:\n"
      "- Reply with programs, each in its own fenced block that opens with ```ofl and closes with ```.\n"
      "- One program per block; no other code blocks.\n"
      "- Every program is for {}: its first line is `{} <name>`.\n"
      "- Give every new program a name that differs from the others in your reply and from the names already "
      "used; when you repair a rejected program, keep its name.\n"
      "- Write programs in terms of nodes, gpus, ranks and rails rather than fixed numbers where you can.\n"
      "- Explanations, if any, go outside the blocks and stay short; `#` comments inside a program are fine.\n",
      languageReference(), coll, coll);
}

struct Prompt {
  std::vector<ChatMessage> messages;
  std::vector<const CandidateRecord*> failedShown;
};

Prompt makePrompt(const ProposalContext& context, const LlmProposerOptions& options) {
  const std::vector<CandidateRecord>& history = context.history;
  const std::string_view coll = core::toString(context.collective);
  const int want = std::max(1, context.maxCandidates);

  std::string head = fmt::format("Cluster:\n{}\n", compactTopology(context.topology));
  std::string sizes;
  for (std::uint64_t s : context.sizes) sizes += fmt::format("{}{}", sizes.empty() ? "" : ", ", core::formatSize(s));
  head += fmt::format(
      "Collective: {} over all {} ranks. Message sizes: {} (the whole buffer, as nccl-tests counts it).\n\n", coll,
      context.topology.nRanks(), sizes.empty() ? std::string("(none given)") : sizes);

  // The best per size; names and ratios stay even when the candidates' texts are cut for space.
  std::string best;
  for (std::size_t i = 0; i < context.sizes.size(); ++i) {
    const int idx = i < context.bestPerSize.size() ? context.bestPerSize[i] : -1;
    const SizeResult* r = nullptr;
    if (idx >= 0 && static_cast<std::size_t>(idx) < history.size()) r = resultAt(history[idx], context.sizes[i]);
    if (r == nullptr || !r->ok) {
      best += fmt::format("- {}: no working program yet\n", core::formatSize(context.sizes[i]));
    } else {
      best += fmt::format("- {}: {} ({}): {}\n", core::formatSize(context.sizes[i]), history[idx].name, history[idx].id,
                          describeTime(*r));
    }
  }
  if (!best.empty()) best = "Best so far per size:\n" + best + "\n";

  // Which earlier candidates to show: the best ones, then the latest, shown oldest first.
  const std::size_t limit = static_cast<std::size_t>(std::max(0, options.maxFeedbackCandidates));
  std::set<std::size_t> chosen;
  for (int idx : context.bestPerSize) {
    if (chosen.size() >= limit) break;
    if (idx >= 0 && static_cast<std::size_t>(idx) < history.size()) chosen.insert(static_cast<std::size_t>(idx));
  }
  for (std::size_t i = history.size(); i > 0 && chosen.size() < limit; --i) chosen.insert(i - 1);
  std::vector<std::size_t> shown(chosen.begin(), chosen.end());

  std::set<std::string> usedNames;
  for (const CandidateRecord& r : history) {
    if (!r.name.empty()) usedNames.insert(r.name);
  }
  std::string names;
  std::size_t listed = 0;
  for (const std::string& n : usedNames) {
    if (listed++ == kMaxListedNames) {
      names += ", ...";
      break;
    }
    names += fmt::format("{}{}", names.empty() ? "" : ", ", n);
  }

  const std::string system = systemMessage(context);
  std::vector<std::string> entries;
  for (std::size_t idx : shown) entries.push_back(describeRecord(history[idx]));

  // Drops the oldest shown candidates until the prompt fits.
  const auto assemble = [&](std::size_t firstEntry, std::vector<const CandidateRecord*>& failedShown) {
    std::string user = head + best;
    failedShown.clear();
    if (history.empty()) {
      user += "No programs have been tried yet.\n\n";
    } else {
      user += fmt::format("Earlier candidates ({} of {} shown", shown.size() - firstEntry, history.size());
      if (firstEntry > 0) user += fmt::format("; {} older ones left out to keep this message short", firstEntry);
      user += "):\n\n";
      for (std::size_t e = firstEntry; e < entries.size(); ++e) {
        user += entries[e];
        if (failed(history[shown[e]])) failedShown.push_back(&history[shown[e]]);
      }
      if (!names.empty()) user += fmt::format("Names already used: {}.\n\n", names);
    }
    user += fmt::format(
        "Write up to {} new `{}` programs for this cluster. Aim to beat the best time at one or more sizes and to "
        "come close to the lower bound; try ideas not shown above (other strategies, hierarchies, rail use, "
        "splitting into more parts to pipeline). ",
        want, coll);
    if (!failedShown.empty()) {
      user += fmt::format(
          "{} program(s) above were rejected or failed: include a repaired version of each among your programs "
          "(same name, the errors fixed). ",
          failedShown.size());
    }
    user += "Put each program in its own ```ofl block.\n";
    return user;
  };

  Prompt prompt;
  std::size_t first = 0;
  std::string user = assemble(first, prompt.failedShown);
  while (system.size() + user.size() > options.maxPromptBytes && first < entries.size()) {
    user = assemble(++first, prompt.failedShown);
  }
  if (system.size() + user.size() > options.maxPromptBytes) {
    spdlog::warn("LLM prompt is {} bytes even without feedback, above maxPromptBytes = {}; sending it anyway",
                 system.size() + user.size(), options.maxPromptBytes);
  }
  prompt.messages.push_back({"system", system});
  prompt.messages.push_back({"user", std::move(user)});
  return prompt;
}

}  // namespace

std::string compactTopology(const core::Topology& t) {
  std::string out = fmt::format("{}: {} node{} x {} GPUs{} = {} ranks\n", t.name.empty() ? "cluster" : t.name, t.nodes,
                                t.nodes == 1 ? "" : "s", t.gpusPerNode,
                                t.gpuType.empty() ? "" : fmt::format(" ({})", t.gpuType), t.nRanks());
  switch (t.intra.kind) {
    case core::IntraFabricKind::NvSwitch:
      out += fmt::format("intra-node: NVSwitch, {:g} GB/s per GPU per direction, {:g} us per hop\n",
                         t.intra.gpuBandwidthGBps, t.intra.latencyUs);
      break;
    case core::IntraFabricKind::NvLinkMesh: {
      double lo = 0;
      double hi = 0;
      std::string pairs;
      for (std::size_t i = 0; i < t.intra.links.size(); ++i) {
        const core::NvLinkPair& l = t.intra.links[i];
        lo = i == 0 ? l.bandwidthGBps : std::min(lo, l.bandwidthGBps);
        hi = std::max(hi, l.bandwidthGBps);
        if (i < kMaxListedLinks)
          pairs += fmt::format("{}{}-{}:{:g}", pairs.empty() ? "" : " ", l.a, l.b, l.bandwidthGBps);
      }
      if (t.intra.links.size() > kMaxListedLinks) pairs += " ...";
      out += fmt::format(
          "intra-node: NVLink mesh, {} GPU pairs linked, {:g}-{:g} GB/s per pair per direction, {:g} us; pairs "
          "without a link relay through another GPU; links (a-b:GB/s): {}\n",
          t.intra.links.size(), lo, hi, t.intra.latencyUs, pairs);
      break;
    }
    case core::IntraFabricKind::Pcie: {
      std::string groups;
      for (const core::PcieSwitch& s : t.intra.switches)
        groups += fmt::format("{}{}", groups.empty() ? "" : " | ", joinInts(s.gpus));
      out += fmt::format("intra-node: PCIe, {:g} GB/s per GPU, {:g} us; {} switches (GPUs {})",
                         t.intra.gpuBandwidthGBps, t.intra.latencyUs, t.intra.switches.size(), groups);
      if (t.intra.hostBandwidthGBps > 0) {
        out += fmt::format("; between switches via the CPU at {:g} GB/s, +{:g} us", t.intra.hostBandwidthGBps,
                           t.intra.hostLatencyUs);
      }
      out += "\n";
      break;
    }
  }
  if (!t.nics.empty()) {
    const auto [bwLo, bwHi] = std::minmax_element(
        t.nics.begin(), t.nics.end(), [](const auto& a, const auto& b) { return a.bandwidthGBps < b.bandwidthGBps; });
    const auto [latLo, latHi] = std::minmax_element(
        t.nics.begin(), t.nics.end(), [](const auto& a, const auto& b) { return a.latencyUs < b.latencyUs; });
    const std::string bw = bwLo->bandwidthGBps == bwHi->bandwidthGBps
                               ? fmt::format("{:g} GB/s", bwLo->bandwidthGBps)
                               : fmt::format("{:g}-{:g} GB/s", bwLo->bandwidthGBps, bwHi->bandwidthGBps);
    const std::string lat = latLo->latencyUs == latHi->latencyUs
                                ? fmt::format("{:g} us", latLo->latencyUs)
                                : fmt::format("{:g}-{:g} us", latLo->latencyUs, latHi->latencyUs);
    out += fmt::format("NICs: {} per node (rails = {}), {} per direction and {} each; node egress {:g} GB/s\n",
                       t.nics.size(), t.nics.size(), bw, lat, t.nodeEgressBandwidth());
    bool onePerGpu = static_cast<int>(t.nics.size()) == t.gpusPerNode;
    for (std::size_t i = 0; onePerGpu && i < t.nics.size(); ++i) {
      onePerGpu = t.nics[i].gpus == std::vector<int>{static_cast<int>(i)};
    }
    if (onePerGpu) {
      out += "rails: NIC g serves GPU g, so rail(g) is the GPUs with local index g\n";
    } else {
      std::string map;
      for (std::size_t i = 0; i < t.nics.size() && i < kMaxListedNics; ++i) {
        map += fmt::format("{}NIC {}: GPUs {}", map.empty() ? "" : "; ", i, joinInts(t.nics[i].gpus));
      }
      if (t.nics.size() > kMaxListedNics) map += "; ...";
      out += fmt::format("rails: {}\n", map);
    }
    std::vector<int> noNic;
    for (int g = 0; g < t.gpusPerNode; ++g) {
      if (t.railOf(g) < 0) noNic.push_back(g);
    }
    if (!noNic.empty()) out += fmt::format("GPUs without a NIC of their own: {}\n", joinInts(noNic));
  }
  if (t.inter.kind == core::InterFabricKind::None) {
    out += "inter-node: none (one node)\n";
  } else {
    out += fmt::format("inter-node: {}, oversubscription {:g}:1, {:g} us per switch hop ({})\n",
                       core::toString(t.inter.kind), t.inter.oversubscription, t.inter.switchLatencyUs,
                       t.inter.kind == core::InterFabricKind::RailOptimized
                           ? "1 hop between NICs of one rail, 3 between rails"
                           : "3 hops between nodes");
  }
  return out;
}

std::vector<ChatMessage> buildPrompt(const ProposalContext& context, const LlmProposerOptions& options) {
  return makePrompt(context, options).messages;
}

LlmProposer::LlmProposer(LlmClient client, Proposer& fallback, LlmProposerOptions options)
    : client_(std::move(client)), fallback_(fallback), options_(options) {}

std::vector<Candidate> LlmProposer::propose(const ProposalContext& context) {
  if (context.maxCandidates <= 0) return {};
  const auto useFallback = [&](std::string_view why) {
    spdlog::warn("LLM proposer, round {}: {}; using the {} proposer for this round", context.round + 1, why,
                 fallback_.name());
    std::vector<Candidate> out;
    try {
      out = fallback_.propose(context);
    } catch (const std::exception& e) {
      spdlog::warn("the {} proposer failed: {}", fallback_.name(), e.what());
    } catch (...) {
      spdlog::warn("the {} proposer failed", fallback_.name());
    }
    if (out.size() > static_cast<std::size_t>(context.maxCandidates)) out.resize(context.maxCandidates);
    return out;
  };

  // A model that did not answer for a few rounds is asked again only every few rounds, so an unreachable
  // endpoint does not cost its retries and backoff in every round.
  if (unreachableRounds_ >= options_.silentRoundsBeforeBackoff && options_.reprobeEveryRounds > 0 &&
      ++skippedRounds_ % options_.reprobeEveryRounds != 0) {
    return useFallback(fmt::format("the model did not answer in {} round(s) in a row (asked again every {} rounds)",
                                   unreachableRounds_, options_.reprobeEveryRounds));
  }

  try {
    Prompt prompt = makePrompt(context, options_);
    ChatReply reply = client_.complete(prompt.messages);
    if (!reply.ok) {
      ++unreachableRounds_;
      return useFallback(fmt::format("no reply from the model ({})", reply.error));
    }
    unreachableRounds_ = 0;
    skippedRounds_ = 0;
    std::vector<std::string> programs = extractPrograms(reply.content);
    if (programs.empty()) {
      // One repair request in the same round: the model sees its reply and the rule it missed.
      spdlog::warn("LLM proposer, round {}: no program in the model's reply ({} chars); asking once more",
                   context.round + 1, reply.content.size());
      prompt.messages.push_back({"assistant", reply.content.substr(0, 4096)});
      prompt.messages.push_back(
          {"user", fmt::format("Your reply held no program. Reply with up to {} programs, each in its own fenced "
                               "block that opens with ```ofl and closes with ```, and nothing else.",
                               std::max(1, context.maxCandidates))});
      reply = client_.complete(prompt.messages);
      if (reply.ok) programs = extractPrograms(reply.content);
      if (programs.empty()) {
        return useFallback(reply.ok ? std::string("no program in the model's reply, twice")
                                    : fmt::format("no reply from the model ({})", reply.error));
      }
    }

    std::vector<Candidate> out;
    for (std::string& text : programs) {
      if (out.size() == static_cast<std::size_t>(context.maxCandidates)) break;
      std::string origin = "llm";
      const std::string name = headerName(text);
      for (const CandidateRecord* r : prompt.failedShown) {
        if (!name.empty() && r->name == name) origin = "llm-repair:" + r->id;
      }
      out.push_back({std::move(text), std::move(origin)});
    }
    spdlog::info("LLM proposer, round {}: {} program(s) in the reply, {} proposed", context.round + 1, programs.size(),
                 out.size());
    return out;
  } catch (const std::exception& e) {
    return useFallback(fmt::format("internal error: {}", e.what()));
  } catch (...) {
    return useFallback("internal error");
  }
}

}  // namespace optiflow::synth
