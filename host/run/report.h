// The machine-readable account of a run (--report FILE.json): every flag, every weight with its
// shape, precision, block, format and measured quantization error, what was skipped and why,
// and the totals.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "host/options.h"

namespace nibble {

nlohmann::json options_to_json(const QuantizeOptions& o);

// Writes `report` to `path` through a temporary name (no half-written report). Throws Error.
void write_json_file(const std::string& path, const nlohmann::json& report);

}  // namespace nibble
