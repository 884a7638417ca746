// The layer engine's operators on a device backend (GraphRun::use_backend): the float operators of the
// decoder layers (MatMul against a 2-D weight, the norms, GroupQueryAttention, the element-wise arithmetic
// and activations) as the backend's forward_* operations, so that a layer's activations stay on the device
// from its input to its output. Every other operator runs on the host (GraphRun downloads what it reads:
// the transfer ledger shows it). The arithmetic is the host operators' (kernels/forward_math.h).
#pragma once
#include <string>
#include <vector>

#include "forward/op_call.h"
#include "kernels/backend.h"
#include "kernels/forward_types.h"

namespace nibble::forward {

// Runs the node of `c` on `backend` where its float inputs are device values (GraphRun puts them there)
// and its integer inputs host values: true, its outputs in `out`. False, nothing done: this form of the
// operator has no device version (a batched MatMul, a Gemm, FastGelu with a bias).
using DeviceOpFn = bool (*)(const OpCall& c, kernels::Backend& backend, std::vector<Value>& out);

// The device form of (domain, type), or null when the operator runs on the host only.
DeviceOpFn find_device_op(const std::string& domain, const std::string& op_type);

// GroupQueryAttention's shape from its node and inputs (ops_attention.cc); keys: per sequence, how many
// keys its queries see.
kernels::AttentionShape gqa_shape(const OpCall& c, std::vector<int64_t>& keys);

}  // namespace nibble::forward
