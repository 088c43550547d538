// Programs out of a language model's reply: fenced code blocks (``` with or without a language tag), several per
// reply, or a bare program with prose around it. Never throws.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace optiflow::synth {

// Each program found, in order, trimmed, deduplicated; empty when none.
std::vector<std::string> extractPrograms(std::string_view reply);

}  // namespace optiflow::synth
