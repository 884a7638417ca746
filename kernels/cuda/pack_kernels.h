// Kernel bodies of the packings (pack.h): one thread per output byte (or scale), bit for bit the
// CPU's layouts: low nibble first.
#pragma once
#include "kernels/cuda/hd_float.h"

namespace nibble::kernels::gpu {

struct PackOnnxBody {
  const uint8_t* codes;
  int64_t n;
  uint8_t* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const uint8_t lo = codes[2 * i] & 0x0f;
    out[i] = 2 * i + 1 < n ? uint8_t(lo | (codes[2 * i + 1] << 4)) : lo;
  }
};

// Where codes and per-block parameters of (k, n) live, for a weight of either layout.
struct ParamLayout {
  int64_t K, N, G;
  int k_axis;
  NIBBLE_HD int64_t code(int64_t k, int64_t n) const { return k_axis == 0 ? k * N + n : n * K + k; }
  NIBBLE_HD int64_t param(int64_t g, int64_t n) const { return k_axis == 0 ? g * N + n : n * G + g; }
};

// MatMulNBits B: [N, G, blob] bytes, unsigned codes packed along K inside each block.
struct PackNBitsBody {
  ParamLayout l;
  const uint8_t* codes;
  const uint8_t* zero_points;  // null: symmetric
  // 4 bits: the codes as QuantResult::packed holds them (two a byte, low nibble first, in `codes`' order)
  // instead of one a byte: half the bytes go up. The low nibble is all unsigned_code reads of a code.
  bool codes_packed;
  int bits;
  int64_t block, layout_block, blob;
  uint8_t* out;
  NIBBLE_HD uint8_t unsigned_code(int64_t g, int64_t n, int64_t j) const {
    const int64_t k = g * block + j;
    if (k >= l.K || j >= block) return zero_points ? zero_points[l.param(g, n)] : uint8_t(1 << (bits - 1));
    const int64_t ci = l.code(k, n);
    const uint8_t c = codes_packed ? uint8_t((codes[ci / 2] >> (4 * (ci & 1))) & 0x0f) : codes[ci];
    if (zero_points) return c;
    return bits == 4 ? uint8_t((c ^ 0x08) & 0x0f) : uint8_t(c ^ 0x80);
  }
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t b = i % blob, g = (i / blob) % l.G, n = i / (blob * l.G);
    if (bits == 8) {
      out[i] = unsigned_code(g, n, b);
    } else {
      const uint8_t hi = 2 * b + 1 < layout_block ? uint8_t(unsigned_code(g, n, 2 * b + 1) << 4) : uint8_t(0);
      out[i] = uint8_t(unsigned_code(g, n, 2 * b) | hi);
    }
  }
};

// Scales [N, G] from the stored layout.
struct NBitsScalesBody {
  ParamLayout l;
  const float* scales;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const { out[i] = scales[l.param(i % l.G, i / l.G)]; }
};

// Zero points [N, row]: 8 bits one a byte, 4 bits two a byte.
struct NBitsZeroPointsBody {
  ParamLayout l;
  const uint8_t* zero_points;
  int bits;
  int64_t row;
  uint8_t* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t b = i % row, n = i / row;
    if (bits == 8) {
      out[i] = zero_points[l.param(b, n)];
    } else {
      const uint8_t lo = zero_points[l.param(2 * b, n)];
      out[i] = 2 * b + 1 < l.G ? uint8_t(lo | (zero_points[l.param(2 * b + 1, n)] << 4)) : lo;
    }
  }
};

// The float weight s·(q − z) in the stored layout, rounded to the output type (dequantize_ref), one
// thread per element, elements in stored order (coalesced).
struct DequantizeBody {
  ParamLayout l;
  int64_t block;
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zero_points;  // null: symmetric (signed codes)
  int out_dtype;
  void* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t k = l.k_axis == 0 ? i / l.N : i % l.K, n = l.k_axis == 0 ? i % l.N : i / l.K;
    const int64_t pi = l.param(k / block, n);
    const int code = zero_points ? int(codes[i]) - int(zero_points[pi]) : int(int8_t(codes[i]));
    hd::store(out_dtype, out, i, hd::round_to(out_dtype, scales[pi] * float(code)));
  }
};

}  // namespace nibble::kernels::gpu
