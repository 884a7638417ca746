#include "kernels/dtype.h"


namespace nibble {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kUInt8: case DType::kInt8: case DType::kBool: return 1;
    case DType::kInt64: case DType::kFloat64: return 8;
    default: return 0;
  }
}

bool is_quantizable_float(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

std::string dtype_name(DType t) { return dtype_name(static_cast<int>(t)); }

std::string dtype_name(int t) {
  switch (t) {
    case 1: return "fp32";
    case 2: return "uint8";
    case 3: return "int8";
    case 4: return "uint16";
    case 5: return "int16";
    case 6: return "int32";
    case 7: return "int64";
    case 8: return "string";
    case 9: return "bool";
    case 10: return "fp16";
    case 11: return "fp64";
    case 16: return "bf16";
    case 21: return "uint4";
    case 22: return "int4";
    default: return "dtype#" + std::to_string(t);
  }
}

}  // namespace nibble
