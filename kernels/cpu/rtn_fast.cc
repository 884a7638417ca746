#include "kernels/cpu/rtn_fast.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

constexpr int64_t kColsPerTile = 256;  // axis-0 tile: one block-row x this many columns
constexpr int64_t kRowsPerTile = 16;   // axis-1 tile: this many output channels

// Round half to even without a libm call: adding 1.5 * 2^23 leaves no fraction bits, so the
// FPU's default rounding does the work. Exact for |x| < 2^22; larger floats are integers already.
inline float rint_fast(float x) {
  return std::fabs(x) < 4194304.0f ? (x + 12582912.0f) - 12582912.0f : x;
}

// Clamp that sends NaN to lo (a NaN weight is reported by the caller through the error sum).
inline float clamp_nan_lo(float x, float lo, float hi) {
  x = x > lo ? x : lo;
  return x < hi ? x : hi;
}

const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = half_to_float(uint16_t(h));
    return t;
  }();
  return table.data();
}

template <DType T>
struct Elem {
  using Storage = uint16_t;
  static float load(const Storage* p, int64_t i, const float* table) {
    if constexpr (T == DType::kFloat16) return table[p[i]];
    else return bf16_to_float(p[i]);
  }
};
template <>
struct Elem<DType::kFloat32> {
  using Storage = float;
  static float load(const float* p, int64_t i, const float*) { return p[i]; }
};

template <DType T>
inline float quotient(float w, float s) {
  const float q = w / s;
  if constexpr (T == DType::kFloat16) return round_to(T, q);
  else return q;
}

template <DType T>
inline float dequant_in_dtype(float q, float s) {
  if constexpr (T == DType::kFloat32) return q * s;
  else return round_to(T, q * s);
}

struct Range {
  float lo, hi;  // code range
};

inline Range code_range(int bits, bool zp) {
  if (zp) return {0.0f, float((1 << bits) - 1)};
  return {-float(1 << (bits - 1)), float((1 << (bits - 1)) - 1)};
}

// Quantizes one element; returns the code byte and adds its squared error to `err`.
template <DType T, bool ZP>
inline uint8_t quantize_one(float v, float s, float z, Range r, double& err) {
  float q = rint_fast(quotient<T>(v, s));
  if constexpr (ZP) q += z;
  q = clamp_nan_lo(q, r.lo, r.hi);
  const double e = double(v) - double(dequant_in_dtype<T>(ZP ? q - z : q, s));
  err += e * e;
  return ZP ? uint8_t(q) : uint8_t(int8_t(q));
}

template <DType T, bool ZP>
void run_axis0(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  using S = typename Elem<T>::Storage;
  const S* data = static_cast<const S*>(w.data);
  const float* table = T == DType::kFloat16 ? half_table() : nullptr;
  const int64_t K = w.rows, N = w.cols, bs = spec.block, G = out.groups;
  const int64_t col_tiles = num_blocks(N, kColsPerTile);
  const Range range = code_range(spec.bits, ZP);
  std::vector<double> tile_error(size_t(G * col_tiles), 0.0);

  parallel_for(G * col_tiles, [&](int64_t t) {
    const int64_t g = t / col_tiles, c0 = (t % col_tiles) * kColsPerTile;
    const int64_t width = std::min(N, c0 + kColsPerTile) - c0;
    const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
    const bool partial = (k1 - k0) < bs;
    float a[kColsPerTile], b[kColsPerTile], s[kColsPerTile], z[kColsPerTile];
    // Pass 1: block statistics, one contiguous row at a time.
    for (int64_t c = 0; c < width; ++c) {
      a[c] = ZP ? (partial ? 0.0f : INFINITY) : 0.0f;  // min (zp) or amax
      b[c] = partial ? 0.0f : -INFINITY;                // max (zp)
    }
    for (int64_t k = k0; k < k1; ++k) {
      const S* row = data + k * N + c0;
      for (int64_t c = 0; c < width; ++c) {
        const float v = Elem<T>::load(row, c, table);
        if constexpr (ZP) {
          a[c] = std::min(a[c], v);
          b[c] = std::max(b[c], v);
        } else {
          a[c] = std::max(a[c], std::fabs(v));
        }
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      const BlockParams p = ZP ? block_params_zero_point(a[c], b[c], spec.bits, T)
                               : block_params_symmetric(a[c], spec.bits, T);
      s[c] = p.scale;
      z[c] = float(p.zero_point);
      out.scales[size_t(g * N + c0 + c)] = p.scale;
      if (ZP) out.zero_points[size_t(g * N + c0 + c)] = p.zero_point;
    }
    // Pass 2: codes and error. Codes go through a float row first: a store through uint8_t*
    // may alias anything and would keep the compiler from vectorizing; one error accumulator
    // per column keeps the sum order fixed without a serial dependency.
    double col_err[kColsPerTile] = {};
    float qrow[kColsPerTile];
    for (int64_t k = k0; k < k1; ++k) {
      const S* __restrict row = data + k * N + c0;
      for (int64_t c = 0; c < width; ++c) {
        const float v = Elem<T>::load(row, c, table);
        // Clamping to one step outside the code range first changes no result and keeps
        // |q| small, so the magic-number rint needs no branch.
        float q = clamp_nan_lo(quotient<T>(v, s[c]), range.lo - 1 - (ZP ? z[c] : 0), range.hi + 1);
        q = (q + 12582912.0f) - 12582912.0f;
        if constexpr (ZP) q += z[c];
        q = clamp_nan_lo(q, range.lo, range.hi);
        qrow[c] = q;
        const double e = double(v) - double(dequant_in_dtype<T>(ZP ? q - z[c] : q, s[c]));
        col_err[c] += e * e;
      }
      uint8_t* __restrict codes = out.codes.data() + k * N + c0;
      for (int64_t c = 0; c < width; ++c)
        codes[c] = ZP ? uint8_t(int32_t(qrow[c])) : uint8_t(int8_t(int32_t(qrow[c])));
    }
    double err = 0;
    for (int64_t c = 0; c < width; ++c) err += col_err[c];
    tile_error[size_t(t)] = err;
  });
  out.sq_error = 0;
  for (double e : tile_error) out.sq_error += e;
}

template <DType T, bool ZP>
void run_axis1(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  using S = typename Elem<T>::Storage;
  const S* data = static_cast<const S*>(w.data);
  const float* table = T == DType::kFloat16 ? half_table() : nullptr;
  const int64_t N = w.rows, K = w.cols, bs = spec.block, G = out.groups;
  const Range range = code_range(spec.bits, ZP);
  const int64_t tiles = num_blocks(N, kRowsPerTile);
  std::vector<double> tile_error(size_t(tiles), 0.0);
  parallel_for(tiles, [&](int64_t t) {
    double err = 0;
    const int64_t n1 = std::min(N, (t + 1) * kRowsPerTile);
    for (int64_t n = t * kRowsPerTile; n < n1; ++n)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
        const bool partial = (k1 - k0) < bs;
        const S* row = data + n * K;
        float a = ZP ? (partial ? 0.0f : INFINITY) : 0.0f, b = partial ? 0.0f : -INFINITY;
        for (int64_t k = k0; k < k1; ++k) {
          const float v = Elem<T>::load(row, k, table);
          if constexpr (ZP) {
            a = std::min(a, v);
            b = std::max(b, v);
          } else {
            a = std::max(a, std::fabs(v));
          }
        }
        const BlockParams p =
            ZP ? block_params_zero_point(a, b, spec.bits, T) : block_params_symmetric(a, spec.bits, T);
        out.scales[size_t(n * G + g)] = p.scale;
        if (ZP) out.zero_points[size_t(n * G + g)] = p.zero_point;
        uint8_t* codes = out.codes.data() + n * K;
        for (int64_t k = k0; k < k1; ++k)
          codes[k] = quantize_one<T, ZP>(Elem<T>::load(row, k, table), p.scale, float(p.zero_point), range, err);
      }
    tile_error[size_t(t)] = err;
  });
  out.sq_error = 0;
  for (double e : tile_error) out.sq_error += e;
}

template <DType T>
void dispatch(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  if (w.k_axis == 0) {
    spec.zero_point ? run_axis0<T, true>(w, spec, out) : run_axis0<T, false>(w, spec, out);
  } else {
    spec.zero_point ? run_axis1<T, true>(w, spec, out) : run_axis1<T, false>(w, spec, out);
  }
}

// One block-row tile of the weighted clip search; candidates in rtn_quantize_weighted's order
// (ratio, then the same ratios with the scale negated), first strict minimum wins.
template <DType T, bool ZP>
void weighted_axis0(const WeightMatrix& w, const QuantSpec& spec, const float* weight, const std::vector<float>& ratios,
                    QuantResult& out) {
  using S = typename Elem<T>::Storage;
  const S* data = static_cast<const S*>(w.data);
  const float* table = T == DType::kFloat16 ? half_table() : nullptr;
  const int64_t K = w.rows, N = w.cols, bs = spec.block, G = out.groups;
  const int64_t col_tiles = num_blocks(N, kColsPerTile);
  const Range range = code_range(spec.bits, ZP);
  const size_t n_cand = ratios.size() * (ZP ? 1 : 2);
  const DType st = scale_type(spec, T);
  std::vector<double> tile_error(size_t(G * col_tiles), 0.0);
  parallel_for(G * col_tiles, [&](int64_t t) {
    const int64_t g = t / col_tiles, c0 = (t % col_tiles) * kColsPerTile;
    const int64_t width = std::min(N, c0 + kColsPerTile) - c0;
    const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
    const bool partial = (k1 - k0) < bs;
    float amax[kColsPerTile], mn[kColsPerTile], mx[kColsPerTile];
    for (int64_t c = 0; c < width; ++c) {
      amax[c] = 0.0f;
      mn[c] = partial ? 0.0f : INFINITY;
      mx[c] = partial ? 0.0f : -INFINITY;
    }
    for (int64_t k = k0; k < k1; ++k) {
      const S* row = data + k * N + c0;
      for (int64_t c = 0; c < width; ++c) {
        const float v = Elem<T>::load(row, c, table);
        amax[c] = std::max(amax[c], std::fabs(v));
        mn[c] = std::min(mn[c], v);
        mx[c] = std::max(mx[c], v);
      }
    }
    float best_s[kColsPerTile], best_z[kColsPerTile], s[kColsPerTile], z[kColsPerTile];
    double best_err[kColsPerTile], err[kColsPerTile];
    for (int64_t c = 0; c < width; ++c) best_err[c] = INFINITY;
    for (size_t ci = 0; ci < n_cand; ++ci) {
      const float r = ratios[ci % ratios.size()];
      for (int64_t c = 0; c < width; ++c) {
        const BlockParams p = ZP ? block_params_zero_point(r * mn[c], r * mx[c], spec.bits, st)
                                 : block_params_symmetric(r * amax[c], spec.bits, st);
        s[c] = ci >= ratios.size() ? -p.scale : p.scale;
        z[c] = float(p.zero_point);
        err[c] = 0.0;
      }
      for (int64_t k = k0; k < k1; ++k) {
        const S* __restrict row = data + k * N + c0;
        const double wk = weight[k];
        for (int64_t c = 0; c < width; ++c) {
          const float v = Elem<T>::load(row, c, table);
          // clamp one step outside the range first: no branch in the rint (see run_axis0)
          float q = clamp_nan_lo(quotient<T>(v, s[c]), range.lo - 1 - (ZP ? z[c] : 0), range.hi + 1);
          q = (q + 12582912.0f) - 12582912.0f;
          if constexpr (ZP) q += z[c];
          q = clamp_nan_lo(q, range.lo, range.hi);
          const float d = v - dequant_in_dtype<T>(ZP ? q - z[c] : q, s[c]);
          err[c] += wk * double(d) * double(d);
        }
      }
      for (int64_t c = 0; c < width; ++c)
        if (err[c] < best_err[c]) {
          best_err[c] = err[c];
          best_s[c] = s[c];
          best_z[c] = z[c];
        }
    }
    double total = 0;
    for (int64_t c = 0; c < width; ++c) {
      out.scales[size_t(g * N + c0 + c)] = best_s[c];
      if (ZP) out.zero_points[size_t(g * N + c0 + c)] = uint8_t(best_z[c]);
    }
    double col_err[kColsPerTile] = {};
    for (int64_t k = k0; k < k1; ++k) {
      const S* row = data + k * N + c0;
      uint8_t* codes = out.codes.data() + k * N + c0;
      for (int64_t c = 0; c < width; ++c)
        codes[c] = quantize_one<T, ZP>(Elem<T>::load(row, c, table), best_s[c], best_z[c], range, col_err[c]);
    }
    for (int64_t c = 0; c < width; ++c) total += col_err[c];
    tile_error[size_t(t)] = total;
  });
  out.sq_error = 0;
  for (double e : tile_error) out.sq_error += e;
}

}  // namespace

void rtn_quantize_weighted_fast(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                                const std::vector<float>& ratios, QuantResult& out) {
  if (w.k_axis != 0) {
    rtn_quantize_weighted(w, spec, weight, ratios, out);  // [N, K] layouts: the reference
    return;
  }
  out.groups = num_blocks(w.K(), spec.block);
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(out.groups * w.N()), 0.0f);
  out.zero_points.assign(spec.zero_point ? out.scales.size() : 0, 0);
  auto run = [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    spec.zero_point ? weighted_axis0<T, true>(w, spec, weight, ratios, out)
                    : weighted_axis0<T, false>(w, spec, weight, ratios, out);
  };
  switch (w.dtype) {
    case DType::kFloat32: run(std::integral_constant<DType, DType::kFloat32>{}); break;
    case DType::kFloat16: run(std::integral_constant<DType, DType::kFloat16>{}); break;
    case DType::kBFloat16: run(std::integral_constant<DType, DType::kBFloat16>{}); break;
    default: throw std::invalid_argument("rtn: weight dtype must be fp32, fp16 or bf16");
  }
}

void rtn_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
  out.groups = num_blocks(w.K(), spec.block);
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(out.groups * w.N()), 0.0f);
  out.zero_points.assign(spec.zero_point ? out.scales.size() : 0, 0);
  switch (w.dtype) {
    case DType::kFloat32: dispatch<DType::kFloat32>(w, spec, out); break;
    case DType::kFloat16: dispatch<DType::kFloat16>(w, spec, out); break;
    case DType::kBFloat16: dispatch<DType::kBFloat16>(w, spec, out); break;
    default: throw std::invalid_argument("rtn: weight dtype must be fp32, fp16 or bf16");
  }
}

}  // namespace nibble::kernels
