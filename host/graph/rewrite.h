// Turns planned weights into their quantized graph form, in one of three formats:
//   dq           w_i4 (INT4/UINT4 [stored shape]) + w_scale (+ w_zp) -> DequantizeLinear -> MatMul
//                (ModelOpt's rtn_dq/AWQ output, names included; ORT fuses it to MatMulNBits)
//   qdq          float w -> QuantizeLinear -> DequantizeLinear -> MatMul, with the axis and
//                block_size attributes ModelOpt's `rtn` forgets, so ONNX Runtime loads it
//   matmulnbits  com.microsoft.MatMulNBits with B [N, G, bs/2], scales [N, G] (+ zero points)
// An embedding table (op_type "Gather" in the plan) takes the same dq / qdq form ahead of its
// Gather, or in matmulnbits com.microsoft.GatherBlockQuantized.
// Tensor data goes straight to the writer; node edits are collected and spliced in by finish().
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "host/options.h"
#include "host/graph/plan.h"
#include "kernels/backend.h"
#include "kernels/quant_types.h"
#include "loaders/model_writer.h"

namespace nibble {

class GraphRewriter {
 public:
  // Packing runs on `backend` (the graph side knows no bit layout).
  GraphRewriter(onnx::ModelProto& model, Format format, ModelWriter& writer, kernels::Backend& backend);

  // Emits the quantized form of one weight; returns the format used (a Gemm that MatMulNBits
  // cannot express falls back to dq) and the bytes written for it. qdq_float (qdq only; may be null):
  // the float weight QuantizeLinear reads instead of the original (GPTQ's s·(q − z), whose codes no
  // rounding of the original weight gives), stored as a new initializer of pw's dtype and shape.
  Format emit(const PlannedWeight& pw, const kernels::QuantSpec& spec, const kernels::QuantResult& q,
              uint64_t* bytes_out, const std::vector<uint8_t>* qdq_float = nullptr);
  // The format emit will use for pw (before quantizing it: float zero points need MatMulNBits).
  Format format_for(const PlannedWeight& pw) const;
  // Whether emit reads pw's result only through the backend's MatMulNBits packings (no host copy of its
  // codes, scales or integer zero points): then a device may keep them (QuantResult::keep).
  bool packs_on_backend(const PlannedWeight& pw, const kernels::QuantSpec& spec) const;
  // Whether emit reads pw's codes only as ONNX INT4 bytes (DequantizeLinear of stored 4-bit codes): then its
  // quantizer may write them packed (QuantResult::pack).
  bool reads_packed_codes(const PlannedWeight& pw, const kernels::QuantSpec& spec) const;

  // An embedding table tied to a weight already emitted as MatMulNBits: its Gathers become
  // GatherBlockQuantized reading that weight's B (through a Reshape to [V, H * bits / 8]), scales
  // and zero points, so one quantized copy serves both. Returns false with *why when the layouts
  // differ (the caller then quantizes the table on its own).
  bool emit_shared_table(const PlannedWeight& table, uint64_t* bytes_out, std::string* why);
  // Weights some table is tied to: emit keeps their zero points, which a table sharing the codes
  // may need packed its own way.
  void keep_zero_points_of(const std::string& weight) { keep_zero_points_.insert(weight); }

  // Replaces the data of an existing initializer (an AWQ scale folded into a norm's gamma, ...).
  void set_initializer_data(const std::string& name, const std::vector<uint8_t>& bytes,
                            const std::vector<int64_t>* new_dims = nullptr);
  // Inserts Mul(activation, constant [1, K]) before the first of `consumers` and makes those
  // consumers read its output (an AWQ input scale 1/s that could not be folded).
  void insert_scale_mul(const std::string& activation, const std::vector<int>& consumers, DType dtype,
                        const std::vector<float>& values, const std::string& node_name,
                        const std::string& init_name, const std::string& output_name);
  // Initializers whose data this rewriter already wrote (the pipeline must not copy them again).
  const std::set<std::string>& written_initializers() const { return written_; }

  // Float initializers the quantized graph no longer reads.
  const std::set<std::string>& removed_initializers() const { return removed_; }

  // Splices new nodes in before their first consumer, replaces converted nodes, removes the
  // dropped float initializers, and sets opset imports and the IR version.
  void finish();

 private:
  std::string unique_name(const std::string& base);
  onnx::TensorProto* add_initializer(const std::string& name, int dtype, const std::vector<int64_t>& dims,
                                     const std::vector<uint8_t>& bytes);
  // pw's codes [rows, cols] as ONNX INT4/INT8: q.packed where the backend packed them, else packed here.
  void add_codes(const std::string& name, const PlannedWeight& pw, const kernels::QuantSpec& spec,
                 const kernels::QuantResult& q);
  bool gemm_fits_matmulnbits(const onnx::NodeProto& n, int64_t N) const;
  // quantize_input: the float initializer QuantizeLinear reads (qdq); empty: the codes are stored (dq).
  void emit_dq(const PlannedWeight& pw, const kernels::QuantSpec& spec, const kernels::QuantResult& q,
               const std::string& quantize_input);
  // MatMulNBits' zero points of q (packed codes, or floats of pw's type); its name, empty when none.
  std::string add_matmulnbits_zero_points(const PlannedWeight& pw, const kernels::WeightMatrix& shape,
                                          const kernels::QuantSpec& spec, const kernels::QuantResult& q);
  void emit_matmulnbits(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                        const kernels::QuantResult& q);
  void emit_gather_block_quantized(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                                   const kernels::QuantResult& q);
  void replace_gathers(const PlannedWeight& pw, const std::string& data, const std::string& scales,
                       const std::string& zps, int64_t block, int bits);

  onnx::ModelProto& model_;
  Format format_;
  ModelWriter& writer_;
  kernels::Backend& backend_;
  std::set<std::string> names_;
  std::unordered_map<std::string, const onnx::TensorProto*> initializers_;
  std::map<int, std::vector<onnx::NodeProto>> insert_before_;
  std::map<int, onnx::NodeProto> replace_;
  std::set<std::string> removed_;
  std::set<std::string> written_;
  std::vector<onnx::TensorProto> new_initializers_;
  struct NBitsTensors {  // what emit_matmulnbits wrote for a weight
    std::string b, scales, zero_points;
    int64_t block = 0, groups = 0;
    int bits = 4;
    std::vector<uint8_t> zero_points_vg;  // [N, G] codes, kept for keep_zero_points_of weights
    bool float_zero_point = false;
  };
  std::set<std::string> keep_zero_points_;
  std::map<std::string, NBitsTensors> nbits_;
  uint64_t bytes_ = 0;
  bool used_dq_ = false, used_contrib_ = false;
};

// MatMulNBits block of a weight: its block; per channel, 4 bits: the power of two >= max(16, K)
// (one padded block); 8 bits: the power-of-two block >= 16 with the fewest bytes, the channel's
// scale repeated in each block (K = 576 takes 9 blocks of 64 instead of one of 1024).
int64_t matmulnbits_layout_block(const PlannedWeight& pw, const kernels::QuantSpec& spec);

// Bytes of a float vector in dtype t (values must be representable in t).
std::vector<uint8_t> encode_floats(DType t, const std::vector<float>& v);

}  // namespace nibble
