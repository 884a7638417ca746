// Opset bookkeeping for the output graph. Blocked INT4 DequantizeLinear needs opset 21; raising
// a model's opset import is only safe if no op it uses changed meaning on the way, so that is
// checked against a table of breaking schema changes instead of hoped for.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <cstdint>
#include <string>

namespace nibble {

// Raises the default-domain opset import to `target` (no-op if already there). Throws Error
// naming the first op whose definition changed between the model's opset and `target`.
void raise_default_opset(onnx::ModelProto& model, int64_t target);

// Adds `domain` at `version` to the opset imports if it is missing.
void ensure_domain(onnx::ModelProto& model, const std::string& domain, int64_t version);

}  // namespace nibble
