// The CUDA backend's layer_round_weight and layer_round_step: one thread per block column (g, n), running
// kernels/layer_rounding.h's weight_block and step_block, the reference's own bodies, so the bits are the
// CPU's. Neighbouring threads take neighbouring columns (n fastest): a [K, N] weight's reads coalesce.
// The problem's arrays are read where they are (uploaded once per layer); host ones go up for the call.
// Where the arrays do not fit the budget, the host backend does it.
#include <stdexcept>
#include <vector>

#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"
#include "kernels/layer_round_problem.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

namespace lr = layer_round;

struct WeightBlockBody {
  lr::Weight p;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const { lr::weight_block(p, i / p.N(), i % p.N(), out); }
};

struct StepBlockBody {
  lr::Weight p;
  const float* grad;
  float size;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const { lr::step_block_weight(p, i / p.N(), i % p.N(), grad, size, out); }
};

struct CopyBody {
  const float* in;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const { out[i] = in[i]; }
};

}  // namespace

// The problem's arrays on the device (host ones uploaded into `tmp`), as the element math's view.
struct CudaBackend::LayerRoundArrays {
  DeviceBuffer<float> w, scale0, s, divisor;
  DeviceBuffer<uint8_t> zp;
};

namespace {

uint64_t layer_round_bytes(const LayerRoundProblem& p) {
  return uint64_t(p.rows * p.cols) * 12 + uint64_t(p.G() * p.N()) * 9 + uint64_t(p.K() + p.N()) * 4;
}

// A host copy of a tensor this backend holds (any element type), else t itself.
Tensor host_copy(CudaBackend& b, const Tensor& t, const DeviceArray* mine) {
  if (!mine) return t;
  std::vector<uint8_t> raw = b.download(t);
  const std::vector<int64_t> shape = t.shape;
  return host_tensor(t.dtype, shape, std::move(raw));
}

}  // namespace

lr::Weight CudaBackend::layer_round_view(const LayerRoundProblem& p, LayerRoundArrays& a, float* v, float* f) {
  const uint8_t* zp = nullptr;
  if (p.zero_point) {
    if (const uint8_t* d = kept(p.zero_points.buffer)) {
      zp = d + mine(p.zero_points.buffer)->offset;
    } else {
      a.zp = upload(static_cast<const uint8_t*>(p.zero_points.data), size_t(p.zero_points.elements()));
      zp = a.zp.get();
    }
  }
  const float* s = p.s.empty() ? nullptr : forward_input(p.s, a.s);
  const float* d = p.divisor.empty() ? nullptr : forward_input(p.divisor, a.divisor);
  return lr::view(p, forward_input(p.w, a.w), forward_input(p.scale0, a.scale0), zp, s, d, v, f);
}

LayerRoundProblem CudaBackend::layer_round_on_host(const LayerRoundProblem& p, LayerRoundParams& x) {
  LayerRoundProblem h = p;
  for (Tensor* t : {&h.w, &h.scale0, &h.zero_points, &h.s, &h.divisor, &x.v, &x.f}) *t = host_copy(*this, *t, mine(t->buffer));
  return h;
}

Tensor CudaBackend::layer_round_weight(const LayerRoundProblem& p, const LayerRoundParams& x) {
  lr::check(p, x, nullptr, "layer_round_weight");
  if (!forward_fits(layer_round_bytes(p))) {
    LayerRoundParams hx = x;
    const LayerRoundProblem hp = layer_round_on_host(p, hx);
    return on_host("layer_round_weight", [&](Backend& h) { return h.layer_round_weight(hp, hx); });
  }
  const OpScope op(*dev_, "layer_round_weight");
  dev_->count_flops(6.0 * double(p.rows * p.cols));
  LayerRoundArrays a;
  DeviceBuffer<float> v_tmp, f_tmp;
  const float* v = forward_input(x.v, v_tmp);
  const float* f = forward_input(x.f, f_tmp);
  const lr::Weight w = layer_round_view(p, a, const_cast<float*>(v), const_cast<float*>(f));
  DeviceBuffer<float> out(*dev_, size_t(p.rows * p.cols));
  launch(*dev_, p.G() * p.N(), WeightBlockBody{w, out.get()});
  return forward_result(std::move(out), {p.rows, p.cols});
}

LayerRoundParams CudaBackend::layer_round_step(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                               float size) {
  lr::check(p, x, &g, "layer_round_step");
  if (!forward_fits(layer_round_bytes(p) + uint64_t(p.rows * p.cols) * 8)) {
    LayerRoundParams hx = x;
    const LayerRoundProblem hp = layer_round_on_host(p, hx);
    Tensor hg = host_copy(*this, g, mine(g.buffer));
    return on_host("layer_round_step", [&](Backend& h) { return h.layer_round_step(hp, hx, hg, size); });
  }
  const OpScope op(*dev_, "layer_round_step");
  dev_->count_flops(10.0 * double(p.rows * p.cols));
  LayerRoundArrays a;
  DeviceBuffer<float> v_in_tmp, f_in_tmp, g_tmp;
  const float* v_in = forward_input(x.v, v_in_tmp);
  const float* f_in = forward_input(x.f, f_in_tmp);
  const float* grad = forward_input(g, g_tmp);
  DeviceBuffer<float> v(*dev_, size_t(x.v.elements())), f(*dev_, size_t(x.f.elements()));
  launch(*dev_, x.v.elements(), CopyBody{v_in, v.get()});
  launch(*dev_, x.f.elements(), CopyBody{f_in, f.get()});
  DeviceBuffer<float> out(*dev_, size_t(p.rows * p.cols));
  const lr::Weight w = layer_round_view(p, a, v.get(), f.get());
  launch(*dev_, p.G() * p.N(), StepBlockBody{w, grad, size, out.get()});
  const std::vector<int64_t> vs = x.v.shape, fs = x.f.shape;
  return LayerRoundParams{forward_result(std::move(v), vs), forward_result(std::move(f), fs),
                          forward_result(std::move(out), {p.rows, p.cols})};
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS
