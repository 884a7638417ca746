// A small inline TensorProto (a Constant node's value, ConstantOfShape's fill) as a value of its own.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include "forward/value.h"

namespace nibble::forward {

// raw_data or the typed fields (float_data, int32_data, int64_data); external data is refused (Error).
Value constant_value(const onnx::TensorProto& t);

}  // namespace nibble::forward
