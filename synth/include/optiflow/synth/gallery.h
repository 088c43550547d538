// Text compiled into the library at build time: the gallery programs (examples/programs/*.ofl) the built-in
// proposer starts from, and the language reference (docs/language.md) the language-model proposer sends.
#pragma once

#include <span>
#include <string_view>

namespace optiflow::synth {

struct EmbeddedProgram {
  std::string_view file;  // e.g. "allgather_ring.ofl"
  std::string_view text;
};

std::span<const EmbeddedProgram> galleryPrograms();  // sorted by file name
std::string_view languageReference();

}  // namespace optiflow::synth
