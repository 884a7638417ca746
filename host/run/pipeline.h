// `nibble quantize` from options to a written model: load, plan, quantize each weight through
// the backend as it streams from the memory map, rewrite the graph, write, report.
#pragma once
#include "host/options.h"

namespace nibble {

// Checks option values and combinations (throws Error with the flag's name).
void validate_options(const QuantizeOptions& options);

// Runs the whole job; throws Error on bad input. Returns the process exit code.
int run_quantize(const QuantizeOptions& options);

// `nibble inspect`: prints what would be quantized, with sizes (embedding tables too when
// gather_axis is given). Returns the exit code.
int run_inspect(const std::string& model_path, const std::vector<std::string>& nodes_to_exclude,
                int64_t block_size, std::optional<int> gather_axis = std::nullopt, int64_t gather_block = 32);

// `nibble selftest`: every backend operation on `device` against the CPU reference, one PASS/FAIL
// line each; returns 1 when any fails.
int run_selftest(kernels::Device device, uint64_t device_memory);

// `nibble methods`: the method registry, a table or (json) one JSON object on stdout. Returns the exit code.
int run_methods(bool json);

// `nibble forward`: the layer engine runs the whole graph of `onnx_path` on the feeds in the folder
// `feeds` (forward/forward_files.h) and writes the named values to `out`. Returns the exit code.
struct ForwardArgs {
  std::string onnx_path, feeds, out;
  std::vector<std::string> values;
  kernels::Device device = kernels::Device::kCpu;  // a device backend runs the engine's float operators
};
int run_forward(const ForwardArgs& args);

}  // namespace nibble
