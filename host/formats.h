// The format registry: one record per output format (--format), so that what a format is called, what the
// graph needs for it and how many bytes a weight takes in it are answered in one table (formats.cc), read by
// the option parser, --help, the rewriter, mixed precision's size estimate and `nibble methods`. How each
// format's nodes and tensors are written stays per format in host/graph/rewrite.cc (its emit_* functions).
#pragma once
#include <string>
#include <vector>

#include "host/options.h"

namespace nibble {

// How a weight's tensors are laid out in the file, for mixed precision's size estimate
// (weight_output_bytes in host/algo/mixed_precision.h).
enum class ByteModel {
  kDequantizeLinear,  // codes (or the float weight) [K, N], scales and zero points per block of K
  kMatMulNBits,       // ONNX Runtime's layout: codes [N, G, block/8·bits] padded to whole blocks, [N, G] scales
};

struct FormatRecord {
  const char* name;  // the --format name
  Format format;
  // The output needs opset 21 (DequantizeLinear with block_size), checked before any work (stages.cc
  // check_opset). A format that does not may still fall back to dq for a Gemm it cannot express
  // (GraphRewriter::format_for); the rewriter raises the opset then (GraphRewriter::finish).
  bool needs_opset21;
  // The float weight stays in the model and QuantizeLinear rounds it at load (qdq); the codes are not stored.
  bool keeps_float_weight;
  // The bit width at which it carries fractional zero points (hqq's) in the model's float type; 0: integer
  // zero points only (ONNX's DequantizeLinear). ONNX Runtime's CPU MatMulNBits computes float zero points at 4
  // bits only ("Only 4b quantization is supported for unpacked compute").
  int float_zero_point_bits;
  ByteModel bytes;
  // The operator an embedding table becomes (--gather_quantize_axis), as the report names it; null: the
  // format's DequantizeLinear ahead of the Gather.
  const char* gather_operator;
  const char* summary;  // a few words for --help and `nibble methods`
};

// Every format, in the order --help lists them.
const std::vector<FormatRecord>& formats();
const FormatRecord& format_record(Format f);
const FormatRecord* find_format(const std::string& name);  // null: no such format
const char* name_of(ByteModel b);  // for `nibble methods --json`
// The --format help: every format with its summary, and which methods default to which.
std::string formats_help();

}  // namespace nibble
