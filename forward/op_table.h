// The registry the operator files fill (op_table.cc calls each add_*_ops once): key "domain:type".
#pragma once
#include <map>
#include <string>

#include "forward/op_call.h"

namespace nibble::forward {

using OpTable = std::map<std::string, OpEntry>;

void add_elementwise_ops(OpTable& t);  // ops_elementwise.cc
void add_shape_ops(OpTable& t);        // ops_shape.cc
void add_reduce_ops(OpTable& t);       // ops_reduce.cc: reductions, Softmax
void add_norm_ops(OpTable& t);         // ops_norm.cc
void add_matmul_ops(OpTable& t);       // ops_matmul.cc
void add_attention_ops(OpTable& t);    // ops_attention.cc
void add_logic_ops(OpTable& t);        // ops_logic.cc: Where and the comparisons
void add_mha_ops(OpTable& t);          // ops_mha.cc: MultiHeadAttention

}  // namespace nibble::forward
