// The CUDA backend's class, compiled twice from the same source: by nvcc for a GPU (namespace
// gpu::real) and by the host compiler for the emulated device (gpu::emulated); NIBBLE_GPU_NS says
// which. Everything below the Backend interface goes through DeviceLayer (memory, copies) and
// LinAlg (BLAS), both chosen at construction.
//
// On the host, through `host_` (the threaded CPU backend), each entered in the transfer ledger as a
// host fallback: awq_scale (K values; a GPU's powf is not libm's, and the codes depend on these bits);
// and gptq_factor / gptq_quantize only when the budget cannot hold their K x K arrays (backend_gptq.cu); the
// activation statistics (and unpack_gram, gram_to_f32) likewise where the budget cannot hold them
// (backend_statistics.cu).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/linalg.h"
#include "kernels/cuda/rtn_kernels.h"
#include "kernels/layer_rounding.h"

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

// A piece of a room (Backend::reserve), given back to it when this goes.
struct RoomPiece {
  std::shared_ptr<DeviceArena> room;
  uint8_t* p = nullptr;
  size_t bytes = 0;
  RoomPiece(std::shared_ptr<DeviceArena> r, uint8_t* q, size_t n) : room(std::move(r)), p(q), bytes(n) {}
  ~RoomPiece() { room->give(p, bytes); }
  RoomPiece(const RoomPiece&) = delete;
  RoomPiece& operator=(const RoomPiece&) = delete;
};

// A room itself, as the host holds it (a tensor's Buffer).
struct DeviceRoom final : Buffer {
  const void* owner = nullptr;
  std::shared_ptr<DeviceArena> arena;
};

// A tensor's device buffer (Backend::upload, an operation's result left on the device): a whole weight in
// its stored layout, a K x K factor, a Gram matrix or its blocks.
struct DeviceArray final : Buffer {
  const void* owner = nullptr;  // the backend that made it: another backend's handle is not read
  DeviceBuffer<uint8_t> data;
  std::unique_ptr<RoomPiece> piece;  // instead of `data`: a piece of a room
  size_t offset = 0;  // where the tensor's bytes start (a GPTQ factor's U among its vectors)
  // Its upload when upload() enqueued one (declared after `data`: awaited before the memory is released).
  mutable Prefetch upload;
  uint8_t* ptr() const { return piece ? piece->p : data.get(); }
};

// A quantization result kept on the device for the MatMulNBits packings (QuantResult::keep):
// the whole weight's codes (one a byte), float32 scales and integer zero points, laid out as QuantResult's.
struct DeviceResult final : Buffer {
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

  // Every operation of the table (backend_ops.inc); awq_scale runs on the host (see above).
#define NIBBLE_BACKEND_OP(name, result, params) result name params override;
#include "kernels/backend_ops.inc"
#undef NIBBLE_BACKEND_OP

 private:
  // The linear-algebra layer; every call is one launch (a cuBLAS/cuSOLVER kernel sequence) in the ledger.
  LinAlg& la() {
    dev_->count_launch();
    return *la_;
  }
  // The layer engine's forward (backend_forward.cu): t's values as float32 on the device (this backend's
  // float32 in place; anything else widened, and host bytes uploaded, into `tmp`); a result left on the
  // device; whether `bytes` more fit the budget; t with host data (this backend's downloaded).
  const float* forward_input(const Tensor& t, DeviceBuffer<float>& tmp);
  Tensor forward_result(DeviceBuffer<float>&& b, std::vector<int64_t> shape);
  bool forward_fits(uint64_t bytes) const;
  Tensor forward_host_copy(const Tensor& t);
  // Learned rounding on a whole layer (backend_layer_rounding.cu): the problem's arrays as the element math
  // reads them on the device (host ones uploaded into `a`); the problem and x with host data, for the host.
  struct LayerRoundArrays;
  layer_round::Weight layer_round_view(const LayerRoundProblem& p, LayerRoundArrays& a, float* v, float* f);
  LayerRoundProblem layer_round_on_host(const LayerRoundProblem& p, LayerRoundParams& x);
  // A float32 [rows, cols] result left on the device as a tensor.
  Tensor device_tensor(DeviceBuffer<float>&& b, int64_t rows, int64_t cols);
  // The device copy of an array this backend kept (null: none, or another backend's); the compute stream
  // waits for its upload when one is still in flight.
  const uint8_t* kept(const std::shared_ptr<const Buffer>& r) const;
  const DeviceArray* mine(const std::shared_ptr<const Buffer>& r) const;
  // A weight's bytes on the device: its kept copy, or uploaded into `tmp`.
  const uint8_t* weight_on_device(const WeightMatrix& w, DeviceBuffer<uint8_t>& tmp);
  // n float64 values from the host to `dst` on the device. A chunk whose every value float32 holds
  // exactly goes up as float32 (half the bytes) and is widened there, so the device holds the very same
  // doubles: the calibration's Gram matrices are accumulated in float32 and written as float64.
  void upload_f64(double* dst, const double* src, size_t n);
  // n float64 values that float32 holds exactly, into `dst` as float32 (false, nothing copied: one does not).
  bool upload_narrowed(float* dst, const double* src, size_t n);
  // U of a Gram matrix on the device (empty when not factorisable or beyond the budget): `gram` host memory,
  // or this backend's (`on_device`: read in place, nothing crosses the bus but its diagonal). When it fails
  // after uploading G as float32 (exact), `gram_left` (if given) receives that copy.
  DeviceBuffer<float> cholesky_on_device(const double* gram, int64_t K, bool on_device,
                                         DeviceBuffer<float>* gram_left = nullptr);
  // Activation statistics (backend_statistics.cu): s's tensors zeroed on the device when they fit (false:
  // they stay empty, for the host), and one product of m rows folded into the float64 sums (`g`: scratch
  // for a panel's float32 product).
  bool make_device_statistics(ActivationSums& s, int64_t rows);
  void statistics_product(const float* X, int64_t m, int64_t K, int64_t B, double* gram, float* g);
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
    DeviceResult* kept = nullptr;  // the result stays on the device (QuantResult::keep)
  };
  // The whole result's arrays on the device when the spec asks to keep it and they fit (else null), and
  // their bytes (0 where result_buffers would give null).
  std::shared_ptr<DeviceResult> result_buffers(const WeightMatrix& w, const QuantSpec& spec, bool keep);
  uint64_t result_bytes(const WeightMatrix& w, const QuantSpec& spec, bool keep) const;
  // A kept result as QuantResult::kept holds it (the codes' tensor, its buffer the whole result).
  Tensor kept_tensor(const WeightMatrix& w, std::shared_ptr<DeviceResult> r) const;
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
  // as wide as fits beside `fixed` bytes with `scratch_per_column` more bytes for each column. With
  // `pack_only` (rtn's QuantResult::pack) 4-bit codes come back in out.packed alone.
  template <class Run>
  void quantize_panels(const WeightMatrix& w, const QuantSpec& spec, uint64_t fixed, QuantResult& out,
                       const Run& run, uint64_t scratch_per_column = 0, int64_t column_quantum = 2,
                       bool pack_only = false);
  // The Gram clip search's E_g = G_g·D_g of one panel `wd` columns wide, in the CPU backend's tiles.
  void gram_clip_products(int64_t wd, int64_t K, int64_t B, const float* gb, const float* d, float* e);
  template <class T>
  DeviceBuffer<T> upload(const T* p, size_t n);
  template <class T>
  std::vector<T> download(const DeviceBuffer<T>& b);
  std::vector<uint8_t> elementwise(const WeightMatrix& w, const float* v, size_t v_len, int mode);
  // W ⊙ s as `out_t` into device memory that the returned matrix holds (data null); no buffer when it does
  // not fit beside what is held.
  WeightMatrix scale_on_device(const WeightMatrix& w, const float* s, DType out_t, const char* op_name);
  // AWQ loss pieces (backend_awq.cu): D = W - Ŵ/s of one panel for one scale vector (on the device), and the
  // per-column sums of D ⊙ (G D) or (U D)² over Gram row panels of `gram_rows` rows, the products in
  // column tiles `tile` wide where the Gram matrix or factor is whole (the CPU backend's products).
  DeviceBuffer<float> awq_diff(const Panel& p, const QuantSpec& spec, const float* s, const float* diag,
                               const std::vector<float>* clip);
  void gram_columns(const GramForm& g, const float* on_device, int64_t gram_rows, const DeviceBuffer<float>& d,
                    int64_t width, int64_t tile, double* acc);

  // GPTQ (backend_gptq.cu): a factor's arrays on the device, H of one dampening from the host's Gram
  // matrix, the sweep of a weight in column panels, and a device factor brought back for the host.
  struct GptqArrays;
  struct GptqSweep;
  GptqArrays gptq_arrays(const GptqFactor& f);
  // H in sweep order from the Gram matrix: host rows through a staging panel, or `on_device` (this backend's,
  // read in place).
  void gptq_hessian(const double* gram, int64_t K, bool on_device, const GptqArrays& arr, const float* inv_s,
                    double damp, double* h);
  void upper_in_place(double* a, int64_t K);
  int64_t gptq_width(const WeightMatrix& w, const QuantSpec& spec, const GptqSweep& sw, uint64_t fixed) const;
  // The sweep's column panels; their results go into `kept_result` where it is given (it becomes out.kept).
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
