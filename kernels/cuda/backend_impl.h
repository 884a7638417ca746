// The CUDA backend's class, compiled twice from the same source: by nvcc for a GPU (namespace
// gpu::real) and by the host compiler for the emulated device (gpu::emulated); NIBBLE_GPU_NS says
// which. Everything below the Backend interface goes through DeviceLayer (memory, copies) and
// LinAlg (BLAS), both chosen at construction.
//
// On the host, through `host_` (the threaded CPU backend), each entered in the transfer ledger as a
// host fallback: awq_scale (K values; a GPU's powf is not libm's, and the codes depend on these bits);
// and gptq_factor / gptq_quantize only when the budget cannot hold their K x K arrays (backend_gptq.cu).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/linalg.h"
#include "kernels/cuda/rtn_kernels.h"

#ifndef NIBBLE_GPU_NS
#error "NIBBLE_GPU_NS must name the build of the CUDA backend (real or emulated)"
#endif

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {

// A column panel [n0, n0 + width) of a host weight, on the device.
struct Panel {
  int64_t n0 = 0, width = 0;
  DeviceBuffer<uint8_t> data;
  WeightView view{};
};

// An array the backend keeps on the device for the host (Backend::keep, the *_kept operations): a
// whole weight in its stored layout, or a K x K factor.
// A piece of a room (Backend::reserve_kept), given back to it when this goes.
struct RoomPiece {
  std::shared_ptr<DeviceArena> room;
  uint8_t* p = nullptr;
  size_t bytes = 0;
  RoomPiece(std::shared_ptr<DeviceArena> r, uint8_t* q, size_t n) : room(std::move(r)), p(q), bytes(n) {}
  ~RoomPiece() { room->give(p, bytes); }
  RoomPiece(const RoomPiece&) = delete;
  RoomPiece& operator=(const RoomPiece&) = delete;
};

// A room itself, as the host holds it.
struct DeviceRoom final : Resident {
  const void* owner = nullptr;
  std::shared_ptr<DeviceArena> arena;
};

struct DeviceArray final : Resident {
  const void* owner = nullptr;  // the backend that made it: another backend's handle is not read
  DeviceBuffer<uint8_t> data;
  std::unique_ptr<RoomPiece> piece;  // instead of `data`: a piece of a room
  // Its upload when keep() enqueued one (declared after `data`: awaited before the memory is released).
  mutable Prefetch upload;
  uint8_t* ptr() const { return piece ? piece->p : data.get(); }
};

// A quantization result kept on the device for the MatMulNBits packings (QuantSpec::keep_on_backend):
// the whole weight's codes (one a byte), float32 scales and integer zero points, laid out as QuantResult's.
struct DeviceResult final : Resident {
  const void* owner = nullptr;
  DeviceBuffer<uint8_t> codes, zero_points;
  DeviceBuffer<float> scales;
  int scale_dtype = 0;  // the type the scales are rounded to: 16-bit ones come back in it
};

// A quantization result of one panel on the device.
struct DeviceQuant {
  DeviceBuffer<uint8_t> codes, zero_points;
  DeviceBuffer<uint8_t> packed;  // the codes in ONNX 4-bit packing, when they come back packed
  DeviceBuffer<float> scales;
  DeviceBuffer<uint16_t> scales16;  // the scales in their 16-bit type, when they come back so
  DeviceBuffer<double> error;      // per block [G, width]
  QuantOut out() const { return QuantOut{codes.get(), scales.get(), zero_points.get(), error.get()}; }
};

class CudaBackend final : public Backend {
  // An operation that runs on the host backend: entered in the ledger as a host fallback. (Defined
  // before the members that use it: its return type is deduced.)
  template <class F>
  auto on_host(const char* op, const F& f) {
    const OpScope scope(*dev_, op);
    dev_->count_host_fallback();
    return f(*host_);
  }
  // w with host data for an operation on the host: a weight only the device holds comes back into `buf`.
  WeightMatrix host_weight(const WeightMatrix& w, std::vector<uint8_t>& buf);

 public:
  CudaBackend(std::unique_ptr<DeviceLayer> dev, std::unique_ptr<LinAlg> la, std::unique_ptr<Backend> host)
      : dev_(std::move(dev)), la_(std::move(la)), host_(std::move(host)) {}
  std::string name() const override { return dev_->name(); }
  std::string describe() const override;
  DeviceMemoryUse device_memory() const override { return {dev_->budget(), dev_->peak()}; }
  const TransferLedger* transfer_ledger() const override { return &dev_->ledger(); }

  WeightMatrix keep(const WeightMatrix& w) override;
  std::shared_ptr<Resident> reserve_kept(const std::vector<uint64_t>& bytes) override;
  WeightMatrix keep_in(const WeightMatrix& w, const std::shared_ptr<Resident>& room) override;
  WeightMatrix scale_weight_f32_kept(const WeightMatrix& w, const float* s, std::vector<uint8_t>& host) override;
  WeightMatrix scale_weight_kept(const WeightMatrix& w, const float* s, std::vector<uint8_t>& host) override;
  GramFactor gram_cholesky_kept(const double* gram, int64_t K) override;
  GramForm keep_gram(const GramForm& g) override;
  std::shared_ptr<const Resident> keep_gram_blocks(const double* blocks, int64_t K, int64_t B) override;

  void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) override;
  void rtn_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* channel_weight,
                    const std::vector<float>& ratios, QuantResult& out) override;
  void rtn_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) override;
  void rtn_lsq(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) override;
  void hqq(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) override;
  std::vector<uint8_t> scale_weight(const WeightMatrix& w, const float* s) override;
  std::vector<uint8_t> scale_weight_f32(const WeightMatrix& w, const float* s) override;
  std::vector<uint8_t> divide_columns(const WeightMatrix& w, const float* d) override;
  std::vector<float> awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) override;
  GptqFactor gptq_factor(const double* gram, int64_t K, const float* inv_s, double percdamp, bool act_order) override;
  void gptq_quantize(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                     QuantResult& out) override;
  std::vector<float> awq_weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) override;
  std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean,
                               double alpha) override {
    return on_host("awq_scale", [&](Backend& h) { return h.awq_scale(x_mean, w_mean, alpha); });
  }
  std::vector<float> mean_of(const std::vector<const std::vector<float>*>& v) override;
  std::vector<float> gram_cholesky_upper(const double* gram, int64_t K) override;
  std::vector<float> channel_energy(const double* gram, int64_t K, const float* s) override;
  std::vector<double> awq_losses(const WeightMatrix& w, const std::vector<const float*>& scales,
                                 const QuantSpec& spec, const GramForm& gram,
                                 const std::vector<float>* clip_ratios) override;
  std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x, int64_t T,
                                          const std::vector<double>& ratios, int64_t bsz_col) override;
  void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                          const float* inv_s, const GramClipOptions& opt, QuantResult& out) override;
  std::vector<uint8_t> pack_onnx(const std::vector<uint8_t>& codes, int bits) override;
  std::vector<uint8_t> dequantize(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                  DType out) override;
  std::vector<uint8_t> pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                               const QuantResult& q, int64_t layout_block) override;
  std::vector<float> matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) override;
  std::vector<uint8_t> pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                    const QuantResult& q) override;

 private:
  // The linear-algebra layer; every call is one launch (a cuBLAS/cuSOLVER kernel sequence) in the ledger.
  LinAlg& la() {
    dev_->count_launch();
    return *la_;
  }
  // The device copy of an array this backend kept (null: none, or another backend's); the compute stream
  // waits for its upload when one is still in flight.
  const uint8_t* kept(const std::shared_ptr<const Resident>& r) const;
  const DeviceArray* mine(const std::shared_ptr<const Resident>& r) const;
  // A weight's bytes on the device: its kept copy, or uploaded into `tmp`.
  const uint8_t* weight_on_device(const WeightMatrix& w, DeviceBuffer<uint8_t>& tmp);
  // n float64 values from the host to `dst` on the device. A chunk whose every value float32 holds
  // exactly goes up as float32 (half the bytes) and is widened there, so the device holds the very same
  // doubles: the calibration's Gram matrices are accumulated in float32 and written as float64.
  void upload_f64(double* dst, const double* src, size_t n);
  // n float64 values that float32 holds exactly, into `dst` as float32 (false, nothing copied: one does not).
  bool upload_narrowed(float* dst, const double* src, size_t n);
  // U of a Gram matrix on the device (empty when not factorisable or beyond the budget).
  // When it fails after uploading G as float32 (exact), `gram_left` (if given) receives that copy.
  DeviceBuffer<float> cholesky_on_device(const double* gram, int64_t K, DeviceBuffer<float>* gram_left = nullptr);
  // Columns of a panel that fit beside `fixed` bytes when each column needs `per_column` bytes.
  int64_t panel_width(uint64_t fixed, uint64_t per_column, int64_t N, const char* what) const;
  Panel upload_panel(const WeightMatrix& w, int64_t n0, int64_t width);
  DeviceQuant quant_buffers(const WeightView& v, const QuantSpec& spec);
  // What comes back of a quantized weight, laid out for the whole weight: codes (or their packed form),
  // scales (or their 16-bit form when the scale type is 16 bits wide), zero points, per-column errors.
  struct HostQuant {
    QuantResult& out;
    std::vector<uint16_t> scales16;
    DeviceBuffer<double> err_n;  // per column [N], on the device: only their sum comes back
    DeviceResult* kept = nullptr;  // the result stays on the device (QuantSpec::keep_on_backend)
  };
  // The whole result's arrays on the device when the spec asks to keep it and they fit (else null), and
  // their bytes (0 where result_buffers would give null).
  std::shared_ptr<DeviceResult> result_buffers(const WeightMatrix& w, const QuantSpec& spec);
  uint64_t result_bytes(const WeightMatrix& w, const QuantSpec& spec) const;
  // A panel's codes, scales and zero points into the kept result's arrays (on the device, not in the ledger).
  void store_quant(const WeightMatrix& w, const Panel& p, const QuantSpec& spec, const DeviceQuant& q,
                   DeviceResult& r);
  // The result this backend kept, or null.
  const DeviceResult* kept_result(const QuantResult& q) const;
  // Copies a panel's codes (packed: into out.packed, else into out.codes), scales and zero points, and
  // its per-column errors, into `h`.
  void download_quant(const WeightMatrix& w, const Panel& p, const QuantSpec& spec, DeviceQuant& q, bool packed,
                      HostQuant& h);
  // The RTN family: per column panel, `run(panel, panel buffers)` launches its bodies; the panel is
  // as wide as fits beside `fixed` bytes with `scratch_per_column` more bytes for each column.
  template <class Run>
  void quantize_panels(const WeightMatrix& w, const QuantSpec& spec, uint64_t fixed, QuantResult& out,
                       const Run& run, uint64_t scratch_per_column = 0, int64_t column_quantum = 2);
  // The Gram clip search's E_g = G_g·D_g of one panel `wd` columns wide, in the CPU backend's tiles.
  void gram_clip_products(int64_t wd, int64_t K, int64_t B, const float* gb, const float* d, float* e);
  template <class T>
  DeviceBuffer<T> upload(const T* p, size_t n);
  template <class T>
  std::vector<T> download(const DeviceBuffer<T>& b);
  std::vector<uint8_t> elementwise(const WeightMatrix& w, const float* v, size_t v_len, int mode);
  // W ⊙ s as `out_t` into device memory that the returned matrix holds (data null); null resident when it
  // does not fit beside what is held.
  WeightMatrix scale_on_device(const WeightMatrix& w, const float* s, DType out_t, const char* op_name);
  // AWQ loss pieces (backend_awq.cu): D = W - Ŵ/s of one panel for one scale vector (on the device), and the
  // per-column sums of D ⊙ (G D) or (U D)² over Gram row panels of `gram_rows` rows, the products in
  // column tiles `tile` wide where the Gram matrix or factor is whole (the CPU backend's products).
  DeviceBuffer<float> awq_diff(const Panel& p, const QuantSpec& spec, const float* s, const float* diag,
                               const std::vector<float>* clip);
  void gram_columns(const GramForm& g, const float* resident, int64_t gram_rows, const DeviceBuffer<float>& d,
                    int64_t width, int64_t tile, double* acc);

  // GPTQ (backend_gptq.cu): a factor's arrays on the device, H of one dampening from the host's Gram
  // matrix, the sweep of a weight in column panels, and a device factor brought back for the host.
  struct GptqArrays;
  struct GptqSweep;
  GptqArrays gptq_arrays(const GptqFactor& f);
  void gptq_hessian(const double* gram, int64_t K, const GptqArrays& arr, const float* inv_s, double damp, double* h);
  void upper_in_place(double* a, int64_t K);
  int64_t gptq_width(const WeightMatrix& w, const QuantSpec& spec, const GptqSweep& sw, uint64_t fixed) const;
  // The sweep's column panels; their results go into `kept_result` where it is given (it becomes out.resident).
  void gptq_panels(const WeightMatrix& w, const QuantSpec& spec, const GptqSweep& sw, int64_t width,
                   std::shared_ptr<DeviceResult> kept_result, QuantResult& out);
  void gptq_panel(const GptqSweep& sw, const WeightMatrix& w, const Panel& pnl, DeviceQuant& q, double* chunk_error);
  GptqFactor gptq_host_factor(const GptqFactor& f);

  std::unique_ptr<DeviceLayer> dev_;
  std::unique_ptr<LinAlg> la_;
  std::unique_ptr<Backend> host_;
};

template <class T>
inline DeviceBuffer<T> CudaBackend::upload(const T* p, size_t n) {
  DeviceBuffer<T> b(*dev_, n);
  dev_->to_device(b.get(), p, n * sizeof(T));
  return b;
}

template <class T>
inline std::vector<T> CudaBackend::download(const DeviceBuffer<T>& b) {
  std::vector<T> v(b.size());
  dev_->synchronize();
  dev_->to_host(v.data(), b.get(), b.bytes());
  return v;
}

// The host's copy of 4-bit codes from their packed form (backend_quant.cu).
void unpack_codes(const std::vector<uint8_t>& packed, bool zero_point, std::vector<uint8_t>& codes);

std::unique_ptr<Backend> make(std::unique_ptr<DeviceLayer> dev, std::unique_ptr<LinAlg> la,
                              std::unique_ptr<Backend> host);

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS
