#include "kernels/cpu/cpu_common.h"

#include <stdexcept>

#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/dequant_ref.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/statistics_ref.h"

namespace nibble::kernels {

void CpuCommon::rtn_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) {
  rtn_quantize_ratios(w, spec, ratio_ng, out);
}
std::vector<uint8_t> CpuCommon::download(const Tensor& t) {
  if (!t.data) throw std::invalid_argument("download: a tensor with no host bytes on the CPU backend");
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + t.bytes());
}
WeightMatrix CpuCommon::scale_weight(const WeightMatrix& w, const float* s) {
  return WeightMatrix::of(host_tensor(w.dtype, {w.rows, w.cols}, kernels::scale_weight(w, s)), w.k_axis);
}
WeightMatrix CpuCommon::scale_weight_f32(const WeightMatrix& w, const float* s) {
  return WeightMatrix::of(host_tensor(DType::kFloat32, {w.rows, w.cols}, kernels::scale_weight_f32(w, s)), w.k_axis);
}
std::vector<uint8_t> CpuCommon::divide_columns(const WeightMatrix& w, const float* d) {
  return kernels::divide_columns(w, d);
}
std::vector<float> CpuCommon::awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) {
  return weight_mean(logical_weight(w), w.K(), w.N(), block, contiguous);
}
std::vector<float> CpuCommon::awq_weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) {
  return weight_mean_joint(siblings, block);
}
std::vector<float> CpuCommon::awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean,
                                        double alpha) {
  return kernels::awq_scale(x_mean, w_mean, alpha);
}
std::vector<float> CpuCommon::mean_of(const std::vector<const std::vector<float>*>& v) {
  // numpy's mean over axis 1 of [K, m]: a float32 sum in numpy's order, divided by m.
  if (v.empty()) return {};
  const size_t K = v[0]->size();
  std::vector<float> mean(K), col(v.size());
  for (size_t k = 0; k < K; ++k) {
    for (size_t j = 0; j < v.size(); ++j) col[j] = (*v[j])[k];
    mean[k] = numpy_sum_f32(col.data(), int64_t(col.size())) / float(col.size());
  }
  return mean;
}
const double* host_f64(const Tensor& t, const char* op) {
  if (t.dtype != DType::kFloat64 || !t.data) throw std::invalid_argument(std::string(op) + ": a float64 host tensor");
  return t.f64();
}
int64_t square_order(const Tensor& t, const char* op) {
  if (t.shape.size() != 2 || t.shape[0] != t.shape[1])
    throw std::invalid_argument(std::string(op) + ": a K x K matrix");
  return t.shape[0];
}
std::vector<float> CpuCommon::channel_energy(const Tensor& gram, const float* s) {
  return kernels::channel_energy(host_f64(gram, "channel_energy"), square_order(gram, "channel_energy"), s);
}
Tensor CpuCommon::unpack_gram(const Tensor& packed, int64_t K) {
  if (packed.elements() != packed_row(K, K))
    throw std::invalid_argument("unpack_gram: not a packed triangle of order K");
  return host_tensor(DType::kFloat64, {K, K}, unpack_gram_ref(host_f64(packed, "unpack_gram"), K));
}
Tensor CpuCommon::gram_to_f32(const Tensor& gram) {
  return host_tensor(DType::kFloat32, gram.shape, to_f32_ref(host_f64(gram, "gram_to_f32"), gram.elements()));
}
bool CpuCommon::all_finite(const Tensor& t) { return all_finite_ref(host_f64(t, "all_finite"), t.elements()); }
std::vector<float> CpuCommon::clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x,
                                                   int64_t T, const std::vector<double>& ratios, int64_t bsz_col) {
  return kernels::clip_search_modelopt(w, spec, x, T, ratios, bsz_col);
}
std::vector<uint8_t> CpuCommon::dequantize(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                           DType out) {
  return dequantize_ref(shape, spec, q, out);
}
std::vector<uint8_t> CpuCommon::pack_onnx(const std::vector<uint8_t>& codes, int bits) {
  return kernels::pack_onnx(codes, bits);
}
std::vector<uint8_t> CpuCommon::pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                                        const QuantResult& q, int64_t layout_block) {
  return kernels::pack_matmulnbits_weight(shape, spec, q, layout_block);
}
std::vector<float> CpuCommon::matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) {
  return kernels::matmulnbits_scales(shape, q);
}
std::vector<uint8_t> CpuCommon::pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                             const QuantResult& q) {
  return kernels::pack_matmulnbits_zero_points(shape, spec, q);
}

}  // namespace nibble::kernels
