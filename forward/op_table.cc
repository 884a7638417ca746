#include "forward/op_table.h"

namespace nibble::forward {

namespace {
const OpTable& table() {
  static const OpTable t = [] {
    OpTable m;
    add_elementwise_ops(m);
    add_shape_ops(m);
    add_reduce_ops(m);
    add_norm_ops(m);
    add_matmul_ops(m);
    add_attention_ops(m);
    add_logic_ops(m);
    add_mha_ops(m);
    return m;
  }();
  return t;
}
}  // namespace

const OpEntry* find_op(const std::string& domain, const std::string& op_type) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  auto it = table().find(d + ":" + op_type);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> known_ops() {
  std::vector<std::string> names;
  for (const auto& kv : table()) names.push_back(kv.first);
  return names;
}

}  // namespace nibble::forward
