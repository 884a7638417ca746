// The layer engine's operations on a backend (backend_ops.inc, "The layer engine's forward"): what they
// take. Activations are float32 tensors on the backend; an fp16/bf16 graph's values are float32 there
// too, rounded to their type's grid where ONNX Runtime's CPU provider rounds them (forward_round), so one
// kernel serves every type. The host's engine (forward/) defines the arithmetic; the bodies every backend
// shares are kernels/forward_math.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace nibble::kernels {

enum class ForwardBinary : int { kAdd, kSub, kMul, kDiv, kPow };
enum class ForwardUnary : int { kSigmoid, kExp, kSqrt, kReciprocal, kNeg, kTanh, kErf, kRelu, kGeluErf, kGeluTanh };

// forward_norm: y = (a − mean) / sqrt(var + eps) · gamma (+ beta) per row of `width` elements, where
// a = x (+ skip) (+ bias); rms: mean 0 and var the mean square; l2: y = a / ‖a‖₂. The sums are float64 in
// element order.
struct NormArgs {
  Tensor x, skip, bias, gamma, beta;  // skip, bias, beta: empty when absent; bias, gamma, beta: [width]
  int64_t width = 0;
  float eps = 1e-5f;
  bool rms = true;
  bool with_sum = false;  // also return a (the residual sum that ONNX Runtime's Skip* norms output)
  bool l2 = false;        // LpNormalization (p = 2): y = a / ‖a‖₂ (0 where the norm is 0), no gamma
  DType round = DType::kFloat32;  // y and the sum rounded to this type's grid (float32: not rounded)
};

// forward_attention: GroupQueryAttention for a prompt (an empty past): query [B, S, Hq·D], or q, k and v
// packed in it ([B, S, (Hq + 2·Hkv)·D], key and value empty); rotary inside when rot_half > 0 (the cos/sin
// caches [positions, rot_half], position s for token s); causal softmax over each sequence's keys[b] first
// keys, the last `window` of them when window > 0, scores capped by softcap·tanh(x/softcap) when
// softcap > 0. Plain values, so a device body takes the shape by value.
struct AttentionShape {
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0, rot_half = 0, window = -1;
  float scale = 0.0f, softcap = 0.0f;
  bool interleaved = false, packed = false;
  int round = 1;  // DType of the graph's values: rotated q, k, v and the context rounded to its grid
};
struct AttentionArgs {
  Tensor query, key, value, cos, sin;
  std::vector<int64_t> keys;  // per sequence: how many keys its queries see (seqlens_k + 1, at most S)
  AttentionShape g;
};

// Throws std::invalid_argument where a's tensors do not fit its shape.
inline void check_attention(const AttentionArgs& a) {
  const AttentionShape& g = a.g;
  if (g.B <= 0 || g.S <= 0 || g.Hq <= 0 || g.Hkv <= 0 || g.D <= 0 || g.Hq % g.Hkv)
    throw std::invalid_argument("forward_attention: positive B, S, heads and D, kv heads dividing q heads");
  const int64_t width = g.packed ? (g.Hq + 2 * g.Hkv) * g.D : g.Hq * g.D;
  if (a.query.elements() != g.B * g.S * width) throw std::invalid_argument("forward_attention: query's size");
  if (!g.packed && (a.key.elements() != g.B * g.S * g.Hkv * g.D || a.value.elements() != a.key.elements()))
    throw std::invalid_argument("forward_attention: key's or value's size");
  if (g.rot_half > 0 && (a.cos.elements() < g.S * g.rot_half || a.sin.elements() != a.cos.elements()))
    throw std::invalid_argument("forward_attention: the cos/sin caches hold fewer than " + std::to_string(g.S) +
                                " positions");
  if (int64_t(a.keys.size()) != g.B) throw std::invalid_argument("forward_attention: one key count per sequence");
}

// The panels a forward product is cut into (the CPU's threads; a device issues the same calls, so that the
// emulated device's BLAS gives the CPU's bits): rows of C (M / 4 rounded up to 64, within 64 to 512) by
// columns (all of them up to 2048, else 1024), a function of the shape alone. A panel of fewer than 256
// rows loses a tenth of sgemm's rate to packing B again (bench/sgemm_rate.py --panels).
inline int64_t forward_panel_rows(int64_t M) {
  const int64_t quarter = (M + 3) / 4;
  return std::clamp<int64_t>((quarter + 63) / 64 * 64, 64, 512);
}
inline int64_t forward_panel_columns(int64_t N) { return N <= 2048 ? N : 1024; }

// The summation order of ONNX Runtime's CPU products (MLAS's sgemm on x86): each output's K products are
// summed in slices of forward_k_slice elements, each slice a chain of fused multiply-adds in k order that is
// then added to the output's running sum. A product with a weight (a constant B, which ONNX Runtime packs
// when the session loads): slices of 256. A product of two activations: MLAS's stride from the shape (128,
// halved while K is at most half of it where N >= K, doubled while N is at most half of a width that
// starts at 128 and stays above 16). The products here make the same slices (one sgemm call each, the
// running sum as beta = 1): OpenBLAS sums a slice of up to 256 in one chain, which gave ONNX Runtime
// 1.24's bits on every product of the layer shapes measured (docs/numerics.md). Panels over M and N
// change no output's sum.
inline int64_t forward_k_slice(int64_t N, int64_t K, bool weight) {
  if (weight) return 256;
  int64_t width = 128, slice = 128;
  if (N >= K) {
    while (slice / 2 >= K) {
      width *= 2;
      slice /= 2;
    }
  } else {
    while (width > 16 && width / 2 >= N) {
      slice *= 2;
      width /= 2;
    }
  }
  return slice;
}

// forward_binary's broadcast: the output's dims and each operand's element strides in it (0 along a
// broadcast axis), numpy's rule, rank at most kMaxRank; plain arrays, so a device body takes it by value.
struct Broadcast {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  int64_t out[kMaxRank] = {}, stride_a[kMaxRank] = {}, stride_b[kMaxRank] = {};
  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= out[i];
    return n;
  }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(out, out + rank); }
};

// forward_strided: out[i] = x[base + Σ_d idx_d(i) · stride[d]] over an output of dims out[0..rank) (a
// Transpose, a Slice, a Split part: the host's strided copy).
struct Strided {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  int64_t out[kMaxRank] = {}, stride[kMaxRank] = {};
  int64_t base = 0;
  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= out[i];
    return n;
  }
};

inline Broadcast broadcast_of(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  Broadcast r;
  r.rank = int(std::max(a.size(), b.size()));
  if (r.rank > Broadcast::kMaxRank) throw std::invalid_argument("forward_binary: rank above 8");
  int64_t sa = 1, sb = 1;
  for (int i = r.rank - 1; i >= 0; --i) {
    const int ia = i - (r.rank - int(a.size())), ib = i - (r.rank - int(b.size()));
    const int64_t da = ia >= 0 ? a[size_t(ia)] : 1, db = ib >= 0 ? b[size_t(ib)] : 1;
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument("forward_binary: dims " + std::to_string(da) + " and " + std::to_string(db) +
                                  " do not broadcast");
    r.out[i] = da == 1 ? db : da;
    r.stride_a[i] = da == 1 ? 0 : sa;
    r.stride_b[i] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  return r;
}

}  // namespace nibble::kernels
