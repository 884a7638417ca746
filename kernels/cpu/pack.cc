#include "kernels/cpu/pack.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/parallel.h"

namespace nibble::kernels {

namespace {
// out[j] = the codes in[2j] (low nibble) and in[2j + 1] (high nibble).
void pack_pairs(const uint8_t* __restrict in, uint8_t* __restrict out, size_t pairs) {
  for (size_t j = 0; j < pairs; ++j) out[j] = uint8_t((in[2 * j] & 0x0f) | (in[2 * j + 1] << 4));
}
}  // namespace

std::vector<uint8_t> pack_onnx(const std::vector<uint8_t>& codes, int bits) {
  if (bits == 8) return codes;
  if (bits != 4) throw std::invalid_argument("pack_onnx: bits must be 4 or 8");
  const size_t n = codes.size(), pairs = n / 2;
  std::vector<uint8_t> out((n + 1) / 2, 0);
  // In slices of 1 MiB of output over the threads: a 7B model's codes are 6.5 GB, packed while the next
  // weight is quantized.
  constexpr size_t kSlice = size_t(1) << 20;
  const uint8_t* in = codes.data();
  uint8_t* dst = out.data();
  parallel_for(int64_t((pairs + kSlice - 1) / kSlice), [&](int64_t s) {
    const size_t begin = size_t(s) * kSlice;
    pack_pairs(in + 2 * begin, dst + begin, std::min(pairs, begin + kSlice) - begin);
  });
  if (n & 1) out[n / 2] = codes[n - 1] & 0x0f;
  return out;
}

std::vector<uint8_t> unpack_onnx(const std::vector<uint8_t>& packed, size_t n, int bits) {
  if (bits == 8) return std::vector<uint8_t>(packed.begin(), packed.begin() + long(n));
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 0x0f);
  return out;
}

namespace {
// Unsigned MatMulNBits code of a stored code byte.
inline uint8_t unsigned_code(uint8_t code, int bits, bool zero_point) {
  if (zero_point) return code;
  return bits == 4 ? uint8_t((code ^ 0x08) & 0x0f) : uint8_t(code ^ 0x80);
}
}  // namespace

std::vector<uint8_t> pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                             const QuantResult& q, int64_t layout_block) {
  const int64_t K = shape.K(), N = shape.N(), G = q.groups;
  if (layout_block != spec.block && G != 1)
    throw std::invalid_argument("pack_matmulnbits_weight: padded layout needs a single block");
  const int bits = spec.bits;
  const int64_t blob = layout_block * bits / 8;
  std::vector<uint8_t> out(size_t(N * G * blob), 0);
  parallel_for(N, [&](int64_t n) {
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t zero_code =
          spec.zero_point ? q.zero_points[shape.param_index(G, g, n)]
                          : uint8_t(1 << (bits - 1));
      uint8_t* dst = &out[size_t((n * G + g) * blob)];
      for (int64_t j = 0; j < layout_block; ++j) {
        const int64_t k = g * spec.block + j;
        uint8_t u = zero_code;
        if (k < K && j < spec.block) {
          const size_t i = shape.index(k, n);
          u = unsigned_code(q.codes[i], bits, spec.zero_point);
        }
        if (bits == 8) {
          dst[j] = u;
        } else {
          dst[j / 2] |= (j & 1) ? uint8_t(u << 4) : u;
        }
      }
    }
  });
  return out;
}

std::vector<float> matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) {
  const int64_t N = shape.N(), G = q.groups;
  if (shape.k_axis == 1) return q.scales;  // already [N, G]
  std::vector<float> out(size_t(N * G));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) out[size_t(n * G + g)] = q.scales[size_t(g * N + n)];
  return out;
}

std::vector<uint8_t> pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                  const QuantResult& q) {
  const int64_t N = shape.N(), G = q.groups;
  const int bits = spec.bits;
  const int64_t row = bits == 8 ? G : (G + 1) / 2;
  std::vector<uint8_t> out(size_t(N * row), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t z = q.zero_points[shape.param_index(G, g, n)];
      uint8_t& dst = out[size_t(n * row + (bits == 8 ? g : g / 2))];
      if (bits == 8) dst = z;
      else dst |= (g & 1) ? uint8_t(z << 4) : z;
    }
  return out;
}

}  // namespace nibble::kernels
