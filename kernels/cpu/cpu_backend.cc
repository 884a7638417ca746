// The CPU backend (fast kernels) and the reference backend (scalar `*_ref` kernels): they differ in
// RTN, the weighted clip search, the per-block searches (rtn_lsq, hqq), the AWQ loss, the Cholesky factor, the
// Gram clip search, GPTQ, learned rounding and the activation statistics' products (threads, OpenBLAS).
#include "kernels/cpu/cpu_backend.h"

#include <stdexcept>

#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/clip_fast.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/forward_ref.h"
#include "kernels/cpu/gptq_fast.h"
#include "kernels/cpu/gptq_ref.h"
#include "kernels/cpu/layer_rounding_cpu.h"
#include "kernels/cpu/learned_rounding_cpu.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_lsq_fast.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/cpu/search_fast.h"
#include "kernels/cpu/search_ref.h"
#include "kernels/cpu/statistics_fast.h"
#include "kernels/cpu/statistics_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

// A factor computed on the host (empty: not factorisable).
GramFactor factor_of(std::vector<float>&& u, int64_t K) {
  GramFactor f;
  if (!u.empty()) f.upper = host_tensor(DType::kFloat32, {K, K}, std::move(u));
  return f;
}

// The rows accumulate_statistics reads: x as float32 [n, K] host memory.
const float* activation_rows(const Tensor& x, const ActivationSums& s) {
  if (x.dtype != DType::kFloat32 || x.shape.size() != 2 || x.shape[1] != s.K || (!x.data && x.shape[0] > 0))
    throw std::invalid_argument("accumulate_statistics: x must be float32 [n, K] host memory");
  return x.f32();
}

class CpuBackend final : public CpuCommon {
 public:
  std::string name() const override { return "cpu"; }
  bool takes_concurrent_calls() const override { return true; }
  std::string describe() const override {
    return "cpu: " + std::to_string(num_threads()) + " threads, RTN kernels " + rtn_isa_name(rtn_fast_isa()) +
           ", OpenBLAS " + blas_core_name();
  }
  void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) override {
    rtn_quantize_fast(w, spec, out);
  }
  void rtn_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* cw, const std::vector<float>& ratios,
                    QuantResult& out) override {
    rtn_quantize_weighted_fast(w, spec, cw, ratios, out);
  }
  void rtn_lsq(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) override {
    rtn_lsq_simd(w, spec, opt, out);
  }
  void hqq(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) override {
    hqq_fast(w, spec, opt, out);
  }
  GramFactor gram_cholesky_upper(const Tensor& gram) override {
    const int64_t K = square_order(gram, "gram_cholesky_upper");
    return factor_of(kernels::gram_cholesky_upper(host_f64(gram, "gram_cholesky_upper"), K), K);
  }
  void accumulate_statistics(const Tensor& x, ActivationSums& s) override {
    accumulate_statistics_fast(activation_rows(x, s), x.shape[0], s);
  }
  std::vector<float> awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) override {
    return weight_mean_fast(w, block, contiguous);
  }
  std::vector<double> awq_losses(const WeightMatrix& w, const std::vector<const float*>& scales,
                                 const QuantSpec& spec, const GramForm& g,
                                 const std::vector<float>* clip_ratios) override {
    const std::vector<float> w_kn = logical_weight_fast(w);
    std::vector<double> out;
    AwqLossWork work;  // one weight's buffers, reused by each candidate
    for (const float* s : scales)
      out.push_back(awq_loss(w, w_kn, s, spec, g.gram.f32(), g.rows, clip_ratios, g.upper.f32(), &work));
    return out;
  }
  void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram, int64_t gram_block,
                          const float* inv_s, const GramClipOptions& opt, QuantResult& out) override {
    kernels::clip_quantize_gram(w, spec, gram.f64(), gram_block, inv_s, opt, out);
  }
  GptqFactor gptq_factor(const Tensor& gram, const float* inv_s, double percdamp, bool act_order) override {
    return gptq_factor_fast(host_f64(gram, "gptq_factor"), square_order(gram, "gptq_factor"), inv_s, percdamp,
                            act_order);
  }
  void gptq_quantize(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                     QuantResult& out) override {
    gptq_quantize_fast(w, spec, f, opt, out);
  }
  LearnedRoundingStats learned_rounding(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram,
                                        const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q) override {
    return learned_rounding_fast(w, spec, host_f64(gram, "learned_rounding"), inv_s, opt, q);
  }
  Tensor layer_round_weight(const LayerRoundProblem& p, const LayerRoundParams& x) override {
    return layer_round_weight_fast(p, x);
  }
  LayerRoundParams layer_round_step(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                    float size) override {
    return layer_round_step_fast(p, x, g, size);
  }
  Tensor forward_matmul(const Tensor& x, const Tensor& w, bool w_transposed) override {
    return forward_matmul_with(x, w, w_transposed, forward_matmul_sgemm);
  }
  Tensor forward_matmul_batched(const Tensor& a, const Tensor& b) override {
    return forward_matmul_batched_ref(a, b, /*blas=*/true);
  }
};

class ReferenceBackend final : public CpuCommon {
 public:
  std::string name() const override { return "reference"; }
  std::string describe() const override { return "reference: plain scalar kernels"; }
  void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) override { rtn_quantize_ref(w, spec, out); }
  void rtn_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* cw, const std::vector<float>& ratios,
                    QuantResult& out) override {
    rtn_quantize_weighted(w, spec, cw, ratios, out);
  }
  void rtn_lsq(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) override {
    rtn_lsq_ref(w, spec, opt, out);
  }
  void hqq(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) override {
    hqq_ref(w, spec, opt, out);
  }
  GramFactor gram_cholesky_upper(const Tensor& gram) override {
    const int64_t K = square_order(gram, "gram_cholesky_upper");
    return factor_of(gram_cholesky_upper_ref(host_f64(gram, "gram_cholesky_upper"), K), K);
  }
  void accumulate_statistics(const Tensor& x, ActivationSums& s) override {
    accumulate_statistics_ref(activation_rows(x, s), x.shape[0], s);
  }
  std::vector<double> awq_losses(const WeightMatrix& w, const std::vector<const float*>& scales,
                                 const QuantSpec& spec, const GramForm& g,
                                 const std::vector<float>* clip_ratios) override {
    std::vector<double> out;
    for (const float* s : scales) out.push_back(awq_loss_ref(w, s, spec, g.gram.f32(), g.rows, clip_ratios));
    return out;
  }
  void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram, int64_t gram_block,
                          const float* inv_s, const GramClipOptions& opt, QuantResult& out) override {
    clip_quantize_gram_ref(w, spec, gram.f64(), gram_block, inv_s, opt, out);
  }
  GptqFactor gptq_factor(const Tensor& gram, const float* inv_s, double percdamp, bool act_order) override {
    return gptq_factor_ref(host_f64(gram, "gptq_factor"), square_order(gram, "gptq_factor"), inv_s, percdamp,
                           act_order);
  }
  void gptq_quantize(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                     QuantResult& out) override {
    gptq_quantize_ref(w, spec, f, opt, out);
  }
  LearnedRoundingStats learned_rounding(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram,
                                        const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q) override {
    return learned_rounding_ref(w, spec, host_f64(gram, "learned_rounding"), inv_s, opt, q);
  }
  Tensor layer_round_weight(const LayerRoundProblem& p, const LayerRoundParams& x) override {
    return layer_round_weight_ref(p, x);
  }
  LayerRoundParams layer_round_step(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                    float size) override {
    return layer_round_step_ref(p, x, g, size);
  }
  Tensor forward_matmul(const Tensor& x, const Tensor& w, bool w_transposed) override {
    return forward_matmul_with(x, w, w_transposed, forward_matmul_ref);
  }
  Tensor forward_matmul_batched(const Tensor& a, const Tensor& b) override {
    return forward_matmul_batched_ref(a, b, /*blas=*/false);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }
std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace nibble::kernels
