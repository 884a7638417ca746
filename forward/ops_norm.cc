// The normalisations of decoder layers: RMS norm (SimplifiedLayerNormalization) and LayerNormalization,
// and ONNX Runtime's fused forms that add a residual first (Skip*). Each row in float32 with ONNX Runtime's
// CPU arithmetic (kernels/forward_math.h's norm_row, docs/numerics.md): its sums in element order, the
// deviation's square root, each element divided by it, then scaled; the residual sum that a Skip* operator
// also returns is rounded to the value's type, the normalisation reads it unrounded.
#include <cmath>

#include "forward/op_table.h"
#include "kernels/parallel.h"

namespace nibble::forward {

namespace {

struct NormParts {
  const Value* x = nullptr;
  const Value* skip = nullptr;
  const Value* bias = nullptr;
  const Value* gamma = nullptr;
  const Value* beta = nullptr;
};

// Normalises the rows of x (+ skip + bias) over their last `width` elements. outputs: y, and the sum
// when `with_sum`.
std::vector<Value> normalize(const OpCall& c, const NormParts& p, int64_t width, bool rms, bool with_sum) {
  const Value& x = *p.x;
  const DType t = x.dtype;
  const int64_t rows = width ? x.numel() / width : 0;
  Floats kg, kb, kx, ks, kbias;
  const float* g = float32_view(p.gamma, kg);
  if (p.gamma->numel() != width)
    c.fail("scale has " + std::to_string(p.gamma->numel()) + " values for rows of " + std::to_string(width));
  const float* b = float32_view(p.beta, kb);
  const float* xs = float32_view(&x, kx);
  const float* ss = float32_view(p.skip, ks);
  const float* bias = float32_view(p.bias, kbias);
  if (p.skip && p.skip->numel() != x.numel()) c.fail("skip of " + shape_text(p.skip->shape) + " for input " + shape_text(x.shape));
  // The results in the inputs' own bytes where they may be overwritten (float32 results only): y in x's (a
  // row is copied before its results are written), the sum in skip's (each element read, then written).
  float* y_in_x = c.reusable_floats(0, x.shape, t);
  float* sum_in_skip = with_sum && p.skip ? c.reusable_floats(1, x.shape, t) : nullptr;
  Floats y_fresh(y_in_x ? 0 : size_t(x.numel())), sum_fresh(with_sum && !sum_in_skip ? size_t(x.numel()) : 0);
  float* y = y_in_x ? y_in_x : y_fresh.data();
  float* sum = sum_in_skip ? sum_in_skip : sum_fresh.data();
  const float eps = c.float_attr("epsilon", 1e-5f);
  kernels::parallel_for((rows + 63) / 64, [&](int64_t chunk) {
    Floats v(static_cast<size_t>(width));
    for (int64_t r = chunk * 64; r < std::min(rows, chunk * 64 + 64); ++r) {
      const int64_t o = r * width;
      float s1 = 0.0f, s2 = 0.0f;  // in element order, in float: ONNX Runtime's sums
      for (int64_t j = 0; j < width; ++j) {
        float a = xs[o + j];
        if (ss) a += ss[o + j];
        if (bias) a += bias[j];
        v[size_t(j)] = a;
        if (with_sum) sum[o + j] = a;
        if (!rms) s1 += a;
        s2 += a * a;
      }
      const float n = float(width), mean = rms ? 0.0f : s1 / n;
      const float dev = std::sqrt(rms ? s2 / n + eps : s2 / n - mean * mean + eps);
      for (int64_t j = 0; j < width; ++j) {
        float r2 = (rms ? v[size_t(j)] : v[size_t(j)] - mean) / dev * g[j];
        if (b) r2 += b[j];
        y[o + j] = r2;
      }
    }
  });
  std::vector<Value> out{y_in_x ? c.result_in(0, t, x.shape) : from_floats(t, x.shape, std::move(y_fresh))};
  if (with_sum) {
    out.resize(4);
    out[3] = sum_in_skip ? c.result_in(1, t, x.shape) : from_floats(t, x.shape, std::move(sum_fresh));
  }
  return out;
}

std::vector<Value> simplified(const OpCall& c) {
  NormParts p;
  p.x = &c.need(0);
  p.gamma = &c.need(1);
  return normalize(c, p, trailing_width(c, *p.x), true, false);
}

std::vector<Value> layer_norm(const OpCall& c) {
  NormParts p;
  p.x = &c.need(0);
  p.gamma = &c.need(1);
  p.beta = c.input(2);
  return normalize(c, p, trailing_width(c, *p.x), false, false);
}

// SkipSimplifiedLayerNormalization(input, skip, gamma, bias) and
// SkipLayerNormalization(input, skip, gamma, beta, bias): outputs y, mean, inv_std_var, input + skip + bias.
std::vector<Value> skip_norm(const OpCall& c, bool rms) {
  NormParts p;
  p.x = &c.need(0);
  p.skip = &c.need(1);
  p.gamma = &c.need(2);
  p.beta = rms ? nullptr : c.input(3);
  p.bias = c.input(rms ? 3 : 4);
  const bool with_sum = c.node.output_size() > 3 && !c.node.output(3).empty();
  return normalize(c, p, p.x->shape.empty() ? 1 : p.x->shape.back(), rms, with_sum);
}

// LpNormalization(p = 2): each row over `axis` divided by its Euclidean norm (the e2e Llama models' RMS norm
// with sqrt(H) folded into the gamma).
std::vector<Value> lp_norm(const OpCall& c) {
  const Value& x = c.need(0);
  if (c.int_attr("p", 2) != 2) c.fail("only p = 2 is supported");
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", -1), x.shape.size()));
  if (axis + 1 != x.shape.size()) c.fail("only the last axis is supported");
  Floats v = to_floats(x);
  const int64_t w = x.shape.back();
  for (size_t r = 0; w && r < v.size() / size_t(w); ++r) {
    float* row = v.data() + r * size_t(w);
    double s = 0.0;
    for (int64_t j = 0; j < w; ++j) s += double(row[j]) * row[j];
    const float norm = float(std::sqrt(s));
    for (int64_t j = 0; j < w; ++j) row[j] = norm > 0.0f ? row[j] / norm : 0.0f;
  }
  return {c.result(x.dtype, x.shape, std::move(v))};
}

}  // namespace

void add_norm_ops(OpTable& t) {
  t[":SimplifiedLayerNormalization"] = {simplified, false};  // ONNX Runtime registers it in the standard domain
  t["com.microsoft:SimplifiedLayerNormalization"] = {simplified, false};
  t[":LayerNormalization"] = {layer_norm, false};
  t[":LpNormalization"] = {lp_norm, true};
  t["com.microsoft:SkipSimplifiedLayerNormalization"] = {[](const OpCall& c) { return skip_norm(c, true); }, false};
  t["com.microsoft:SkipLayerNormalization"] = {[](const OpCall& c) { return skip_norm(c, false); }, false};
}

}  // namespace nibble::forward
