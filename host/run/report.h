// The machine-readable account of a run (--report FILE.json): every flag, every weight with its
// shape, precision, block, format and measured quantization error, what was skipped and why,
// and the totals.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "host/options.h"
#include "kernels/backend.h"

namespace nibble {

nlohmann::json options_to_json(const QuantizeOptions& o);

// A device backend's transfer ledger as the report's `summary.device`: {h2d_bytes, d2h_bytes,
// allocations, launches, host_fallback, on_host: [NAME...], ops: {NAME: {calls, h2d_bytes, d2h_bytes,
// allocations, launches, host_fallback}}}.
nlohmann::json ledger_to_json(const kernels::TransferLedger& l);

// Writes `report` to `path` through a temporary name (no half-written report). Throws Error.
void write_json_file(const std::string& path, const nlohmann::json& report);

}  // namespace nibble
