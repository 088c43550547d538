#pragma once

// The plugin libraries are built with hidden visibility and a version script (plugin/exports.map); only the NCCL
// plugin tables carry this.
#define OPTIFLOW_EXPORT __attribute__((visibility("default")))
