// A weight as the kernels see it: dtype, shape and a pointer into the memory map (or into the
// protobuf for inline tensors). Only typed fields that need a conversion (fp16/bf16 stored in
// int32_data) own a buffer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace onnx {
class TensorProto;
}

namespace nibble {

struct ExternalRef {
  std::string location;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct TensorView {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  int64_t numel = 0;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  bool external = false;
  ExternalRef ref;                                // when external
  std::shared_ptr<std::vector<uint8_t>> owned;    // when converted from a typed field
};

// Element count of a tensor's dims, checked: negative dims and overflow throw Error.
int64_t checked_numel(const onnx::TensorProto& t);
// Bytes the tensor's elements take (4-bit types packed two per byte), 0 if the dtype has no
// fixed size (strings). Throws Error on overflow.
uint64_t expected_nbytes(const onnx::TensorProto& t);
// The external_data entries of a tensor, parsed and checked (offset/length are integers).
ExternalRef parse_external_ref(const onnx::TensorProto& t);

}  // namespace nibble
