// A weight as the kernels see it: dtype, shape and a pointer into the memory map (or into the
// protobuf for inline tensors), always aligned to its element size. Only typed fields that need a
// conversion (fp16/bf16 stored in int32_data) and external tensors at an offset that is not a
// multiple of their element size own a buffer.
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
  std::shared_ptr<std::vector<uint64_t>> aligned_copy;  // external data at a misaligned offset
  std::shared_ptr<const uint8_t> buffer;  // external data read ahead into a reused buffer (WeightStream)
};

// Element count of a tensor's dims, checked: negative dims and overflow throw Error.
int64_t checked_numel(const onnx::TensorProto& t);
// Bits per element of an ONNX TensorProto.data_type: 0 for strings, -1 for UNDEFINED and numbers
// no ONNX version defines (up to INT2 = 26).
int onnx_element_bits(int data_type);
// Bytes the tensor's elements take (sub-byte types packed), 0 if the dtype has no fixed size
// (strings). Throws Error on overflow and for an UNDEFINED or unknown data_type.
uint64_t expected_nbytes(const onnx::TensorProto& t);
// The external_data entries of a tensor, parsed and checked (offset/length are integers).
ExternalRef parse_external_ref(const onnx::TensorProto& t);

}  // namespace nibble
