// One round of the hardware evaluator: the round's schedules written as an optiflow-bench batch, the user's launcher
// command run on it (through /bin/sh, in its own process group, killed at the timeout), and optiflow-bench's JSON
// results read back. Everything that can go wrong comes back as the round's error or an item's error, never as an
// exception or a hang.
//
//   workDir/round-N/batch/batch.json, item-K.json   what {batch} names
//   workDir/round-N/results.json                     what {out} names
//   workDir/round-N/launcher.log                     the command's standard output and error
#pragma once

#include <string>
#include <vector>

#include "optiflow/synth/evaluator.h"

namespace optiflow::synth {

RoundMeasurement measureWithLauncher(const LauncherConfig& launcher, int round, const std::vector<MeasureItem>& items);

// `text` quoted for /bin/sh (single quotes).
std::string shellQuote(const std::string& text);

}  // namespace optiflow::synth
