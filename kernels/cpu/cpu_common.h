// What the CPU backend and the reference backend share: the operations whose reference is already
// the CPU's implementation (scaling, statistics, packing, ModelOpt's clip search), so each of the two
// backends states only what differs.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

// A CPU tensor's host data as float64 (a Gram matrix, a statistic); throws std::invalid_argument naming `op`
// when it has none (another backend's).
const double* host_f64(const Tensor& t, const char* op);
// K of a K x K matrix tensor (throws otherwise).
int64_t square_order(const Tensor& t, const char* op);

class CpuCommon : public Backend {
 public:
  // A CPU tensor is host memory: nothing moves, nothing is held.
  Tensor upload(const Tensor& t) override { return t; }
  std::shared_ptr<Buffer> reserve(const std::vector<uint64_t>&) override { return {}; }
  Tensor upload_into(const Tensor& t, const std::shared_ptr<Buffer>&) override { return t; }
  std::vector<uint8_t> download(const Tensor& t) override;
  void rtn_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) override;
  WeightMatrix scale_weight(const WeightMatrix& w, const float* s) override;
  WeightMatrix scale_weight_f32(const WeightMatrix& w, const float* s) override;
  std::vector<uint8_t> divide_columns(const WeightMatrix& w, const float* d) override;
  std::vector<float> awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) override;
  std::vector<float> awq_weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) override;
  std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean,
                               double alpha) override;
  std::vector<float> mean_of(const std::vector<const std::vector<float>*>& v) override;
  std::vector<float> channel_energy(const Tensor& gram, const float* s) override;
  Tensor unpack_gram(const Tensor& packed, int64_t K) override;
  Tensor gram_to_f32(const Tensor& gram) override;
  bool all_finite(const Tensor& t) override;
  // The layer engine's forward: the references (forward_ref.h) but the product (forward_cpu.cc).
  Tensor forward_widen(const Tensor& t) override;
  Tensor forward_round(const Tensor& x, DType to) override;
  Tensor forward_select_rows(const Tensor& x, const std::vector<int64_t>& counted) override;
  Tensor forward_strided(const Tensor& x, const Strided& g) override;
  Tensor forward_reduce_rows(const Tensor& x, int64_t width, bool mean) override;
  Tensor forward_softmax_rows(const Tensor& x, int64_t width) override;
  Tensor forward_binary(ForwardBinary op, const Tensor& a, const Tensor& b) override;
  Tensor forward_unary(ForwardUnary op, const Tensor& x) override;
  std::vector<Tensor> forward_norm(const NormArgs& a) override;
  std::vector<Tensor> forward_attention(const AttentionArgs& a) override;
  std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x, int64_t T,
                                          const std::vector<double>& ratios, int64_t bsz_col) override;
  std::vector<uint8_t> pack_onnx(const std::vector<uint8_t>& codes, int bits) override;
  std::vector<uint8_t> pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                               const QuantResult& q, int64_t layout_block) override;
  std::vector<float> matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) override;
  std::vector<uint8_t> pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                    const QuantResult& q) override;
  std::vector<uint8_t> dequantize(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                  DType out) override;
};

}  // namespace nibble::kernels
