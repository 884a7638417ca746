#include "host/graph/rewrite.h"

#include <cstring>

#include "host/formats.h"
#include "host/graph/opset.h"
#include "loaders/error.h"

namespace nibble {

std::vector<uint8_t> encode_floats(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_float(t, out.data(), i, v[i]);
  return out;
}

int64_t matmulnbits_layout_block(const PlannedWeight& pw, const kernels::QuantSpec& spec) {
  if (pw.block >= 0) return spec.block;
  const int64_t K = pw.K();
  int64_t pow2 = 16;
  while (pow2 < K) pow2 *= 2;
  if (spec.bits != 8) return pow2;
  const int64_t dsz = int64_t(dtype_size(pw.dtype));
  int64_t best = pow2, best_cost = -1;
  for (int64_t b = pow2; b >= 16; b /= 2) {  // ties go to the larger block
    const int64_t G = (K + b - 1) / b, cost = G * b + G * dsz * (spec.zero_point ? 2 : 1);
    if (best_cost < 0 || cost < best_cost) {
      best = b;
      best_cost = cost;
    }
  }
  return best;
}

namespace {

void set_int_attr(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

float float_attr(const onnx::NodeProto& n, const std::string& name, float dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.f();
  return dflt;
}


int code_type(const kernels::QuantSpec& spec) {
  if (spec.bits == 4) return int(spec.zero_point ? DType::kUInt4 : DType::kInt4);
  return int(spec.zero_point ? DType::kUInt8 : DType::kInt8);
}

}  // namespace

GraphRewriter::GraphRewriter(onnx::ModelProto& model, Format format, ModelWriter& writer, kernels::Backend& backend)
    : model_(model), format_(format), writer_(writer), backend_(backend) {
  const auto& g = model_.graph();
  for (const auto& t : g.initializer()) {
    names_.insert(t.name());
    initializers_[t.name()] = &t;
  }
  for (const auto& i : g.input()) names_.insert(i.name());
  for (const auto& o : g.output()) names_.insert(o.name());
  for (const auto& n : g.node()) {
    names_.insert(n.name());
    for (const auto& o : n.output()) names_.insert(o);
  }
}

std::string GraphRewriter::unique_name(const std::string& base) {
  std::string name = base;
  for (int i = 1; names_.count(name); ++i) name = base + "_" + std::to_string(i);
  names_.insert(name);
  return name;
}

onnx::TensorProto* GraphRewriter::add_initializer(const std::string& name, int dtype,
                                                  const std::vector<int64_t>& dims,
                                                  const std::vector<uint8_t>& bytes) {
  new_initializers_.emplace_back();
  onnx::TensorProto& t = new_initializers_.back();
  t.set_name(name);
  t.set_data_type(dtype);
  for (int64_t d : dims) t.add_dims(d);
  writer_.put(t, bytes.data(), bytes.size());
  bytes_ += bytes.size();
  return &t;
}

bool GraphRewriter::gemm_fits_matmulnbits(const onnx::NodeProto& n, int64_t N) const {
  if (n.op_type() != "Gemm") return true;
  if (int_attr(n, "transA", 0) != 0 || float_attr(n, "alpha", 1.0f) != 1.0f) return false;
  if (n.input_size() < 3 || n.input(2).empty()) return true;
  if (float_attr(n, "beta", 1.0f) != 1.0f) return false;
  auto it = initializers_.find(n.input(2));  // the bias must be a constant [N]
  return it != initializers_.end() && it->second->dims_size() == 1 && it->second->dims(0) == N;
}

Format GraphRewriter::format_for(const PlannedWeight& pw) const {
  if (format_ == Format::kMatMulNBits && pw.op_type != "Gather")
    for (int i : pw.nodes)
      if (!gemm_fits_matmulnbits(model_.graph().node(i), pw.N())) return Format::kDq;
  return format_;
}

bool GraphRewriter::packs_on_backend(const PlannedWeight& pw, const kernels::QuantSpec& spec) const {
  // Not: a Gather's table, a weight whose zero points a tied table reads, a per-channel scale repeated
  // over the layout's blocks (emit_matmulnbits's host copies).
  return format_for(pw) == Format::kMatMulNBits && pw.op_type != "Gather" && !keep_zero_points_.count(pw.weight) &&
         !(pw.block < 0 && matmulnbits_layout_block(pw, spec) < pw.K());
}

bool GraphRewriter::reads_packed_codes(const PlannedWeight& pw, const kernels::QuantSpec& spec) const {
  const Format f = format_for(pw);
  return spec.bits == 4 && f != Format::kMatMulNBits && !format_record(f).keeps_float_weight && pw.op_type != "Gather";
}

void GraphRewriter::add_codes(const std::string& name, const PlannedWeight& pw, const kernels::QuantSpec& spec,
                              const kernels::QuantResult& q) {
  // The backend's packed bytes as they are (a copy of a 7B weight's would cost as much as the write).
  if (spec.bits == 4 && !q.packed.empty()) add_initializer(name, code_type(spec), {pw.rows, pw.cols}, q.packed);
  else add_initializer(name, code_type(spec), {pw.rows, pw.cols}, backend_.pack_onnx_codes(q, spec.bits));
}

Format GraphRewriter::emit(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                           const kernels::QuantResult& q, uint64_t* bytes_out,
                           const std::vector<uint8_t>* qdq_float) {
  const uint64_t before = bytes_;
  const Format used = format_for(pw);
  const FormatRecord& f = format_record(used);
  if (!f.float_zero_point_bits && !q.float_zero_points.empty())
    throw Error("internal: '" + pw.weight + "' has float zero points, which --format " + f.name + " does not carry");
  std::string quantize_input;
  if (f.keeps_float_weight && qdq_float) {
    quantize_input = unique_name(pw.weight + "_dequantized");
    add_initializer(quantize_input, int(pw.dtype), {pw.rows, pw.cols}, *qdq_float);
  } else if (f.keeps_float_weight) {
    quantize_input = pw.weight;
  }
  // How each format's nodes and tensors are written is its own code (its emit_* function).
  if (used == Format::kMatMulNBits && pw.op_type == "Gather") emit_gather_block_quantized(pw, spec, q);
  else if (used == Format::kMatMulNBits) emit_matmulnbits(pw, spec, q);
  else emit_dq(pw, spec, q, quantize_input);
  if (!pw.keep_float && quantize_input != pw.weight) removed_.insert(pw.weight);
  if (bytes_out) *bytes_out = bytes_ - before;
  return used;
}

void GraphRewriter::emit_dq(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                            const kernels::QuantResult& q, const std::string& quantize_input) {
  const bool with_quantize_node = !quantize_input.empty();
  used_dq_ = true;
  const bool per_channel = pw.block < 0;
  const int64_t G = q.groups, N = pw.N();
  std::vector<int64_t> scale_dims;
  if (per_channel) scale_dims = {N};
  else if (pw.k_axis == 0) scale_dims = {G, N};
  else scale_dims = {N, G};
  const int64_t axis = per_channel ? 1 - pw.k_axis : pw.k_axis;

  const std::string scale = unique_name(pw.weight + "_scale");
  add_initializer(scale, int(pw.dtype), scale_dims, encode_floats(pw.dtype, q.scales));
  std::string zp;
  if (spec.zero_point || with_quantize_node) {
    zp = unique_name(pw.weight + "_zp");
    std::vector<uint8_t> zeros(q.scales.size(), 0);
    add_initializer(zp, code_type(spec), scale_dims,
                    backend_.pack_onnx(spec.zero_point ? q.zero_points : zeros, spec.bits));
  }
  auto attrs = [&](onnx::NodeProto& n) {
    set_int_attr(n, "axis", axis);
    if (!per_channel) set_int_attr(n, "block_size", spec.block);
  };

  std::vector<onnx::NodeProto>& inserted = insert_before_[pw.nodes.front()];
  std::string codes;
  if (with_quantize_node) {
    onnx::NodeProto qn;
    qn.set_name(unique_name(pw.weight + "_QuantizeLinear"));
    qn.set_op_type("QuantizeLinear");
    qn.add_input(quantize_input);
    qn.add_input(scale);
    qn.add_input(zp);
    codes = unique_name(pw.weight + "_QuantizeLinear_Output");
    qn.add_output(codes);
    attrs(qn);
    inserted.push_back(std::move(qn));
  } else {
    codes = unique_name(pw.weight + "_i4");
    add_codes(codes, pw, spec, q);
  }
  onnx::NodeProto dq;
  dq.set_name(unique_name(pw.weight + "_DequantizeLinear"));
  dq.set_op_type("DequantizeLinear");
  dq.add_input(codes);
  dq.add_input(scale);
  if (!zp.empty()) dq.add_input(zp);
  const std::string out = unique_name(pw.weight + "_DequantizeLinear_Output");
  dq.add_output(out);
  attrs(dq);
  inserted.push_back(std::move(dq));
  for (int i : pw.nodes) {  // input 1 of a MatMul/Gemm, input 0 of a Gather
    onnx::NodeProto* n = model_.mutable_graph()->mutable_node(i);
    for (int j = 0; j < n->input_size(); ++j)
      if (n->input(j) == pw.weight) n->set_input(j, out);
  }
}

// The table stays in DequantizeLinear's layout (INT4/UINT4 [V, H], scales and zero points [V, G]
// for axis 1, [G, H] for axis 0), which GatherBlockQuantized reads as is.
void GraphRewriter::emit_gather_block_quantized(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                                                const kernels::QuantResult& q) {
  used_contrib_ = true;
  const int64_t G = q.groups;
  const std::vector<int64_t> scale_dims = pw.k_axis == 0 ? std::vector<int64_t>{G, pw.cols}
                                                         : std::vector<int64_t>{pw.rows, G};
  const std::string data = unique_name(pw.weight + "_Q" + std::to_string(spec.bits));
  add_codes(data, pw, spec, q);
  const std::string scales = unique_name(pw.weight + "_scales");
  add_initializer(scales, int(pw.dtype), scale_dims, encode_floats(pw.dtype, q.scales));
  std::string zps;
  if (spec.zero_point) {
    zps = unique_name(pw.weight + "_zero_points");
    add_initializer(zps, code_type(spec), scale_dims, backend_.pack_onnx(q.zero_points, spec.bits));
  }
  replace_gathers(pw, data, scales, zps, spec.block, spec.bits);
}

void GraphRewriter::replace_gathers(const PlannedWeight& pw, const std::string& data, const std::string& scales,
                                    const std::string& zps, int64_t block, int bits) {
  for (int i : pw.nodes) {
    const onnx::NodeProto& old = model_.graph().node(i);
    onnx::NodeProto n;
    std::string name = old.name();
    const std::string suffix = "/Gather";  // named as ORT-GenAI names its own
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      name += "BlockQuantized";
    else
      name += "_Q" + std::to_string(bits);
    n.set_name(unique_name(name));
    n.set_op_type("GatherBlockQuantized");
    n.set_domain("com.microsoft");
    n.add_input(data);
    n.add_input(old.input(1));
    n.add_input(scales);
    if (!zps.empty()) n.add_input(zps);
    n.add_output(old.output(0));
    set_int_attr(n, "gather_axis", 0);
    set_int_attr(n, "quantize_axis", pw.k_axis);
    set_int_attr(n, "block_size", block);
    set_int_attr(n, "bits", bits);
    replace_[i] = std::move(n);
  }
}

// MatMulNBits' B [N, G, block * bits / 8] is, row for row, GatherBlockQuantized's uint8 data
// [V, H * bits / 8] when no block is padded (H a multiple of the block); its scales [N, G] are the
// table's [V, G]; its zero points [N, ceil(G / 2)] (4 bits, each row padded to a byte) are the
// table's only when G is even, since GatherBlockQuantized packs them without row padding (for odd
// G the table gets its own packing of them, V * G / 2 bytes). Absent zero points mean 2^(bits - 1)
// in both ops.
bool GraphRewriter::emit_shared_table(const PlannedWeight& table, uint64_t* bytes_out, std::string* why) {
  const auto it = nbits_.find(table.tied_to);
  if (it == nbits_.end()) {
    *why = "'" + table.tied_to + "' was not written as MatMulNBits";
    return false;
  }
  const NBitsTensors& t = it->second;
  if (table.k_axis != 1) *why = "the table is quantized along axis 0, MatMulNBits along H";
  else if (table.cols % t.block != 0)
    *why = "H = " + std::to_string(table.cols) + " is not a multiple of the block " + std::to_string(t.block);
  if (why->empty() && t.float_zero_point)
    *why = "its zero points are floats (hqq), GatherBlockQuantized takes integer ones";
  const bool own_zp = !t.zero_points.empty() && t.bits == 4 && t.groups % 2 != 0;
  if (why->empty() && own_zp && t.zero_points_vg.empty()) *why = "internal: its zero points were not kept";
  if (!why->empty()) return false;
  const uint64_t before = bytes_;
  std::string zps = t.zero_points;
  if (own_zp) {  // flat nibbles of [V, G], element 2i in the low nibble of byte i
    std::vector<uint8_t> packed(size_t(table.rows * ((t.groups + 1) / 2)), 0);  // the tail stays 0
    for (size_t i = 0; i < t.zero_points_vg.size(); ++i) packed[i / 2] |= uint8_t(t.zero_points_vg[i] << (4 * (i % 2)));
    zps = unique_name(table.weight + "_shared_zero_points");
    add_initializer(zps, int(DType::kUInt8), {table.rows, (t.groups + 1) / 2}, packed);
  }
  const std::vector<int64_t> shape{table.rows, table.cols * t.bits / 8};
  std::vector<uint8_t> shape_bytes(sizeof(int64_t) * 2);
  std::memcpy(shape_bytes.data(), shape.data(), shape_bytes.size());
  const std::string shape_name = unique_name(table.weight + "_shared_shape");
  add_initializer(shape_name, onnx::TensorProto::INT64, {2}, shape_bytes);
  onnx::NodeProto reshape;
  reshape.set_name(unique_name(table.weight + "_shared_Reshape"));
  reshape.set_op_type("Reshape");
  reshape.add_input(t.b);
  reshape.add_input(shape_name);
  const std::string data = unique_name(table.weight + "_shared_Q" + std::to_string(t.bits));
  reshape.add_output(data);
  insert_before_[table.nodes.front()].push_back(std::move(reshape));
  replace_gathers(table, data, t.scales, zps, t.block, t.bits);
  if (!table.keep_float) removed_.insert(table.weight);
  if (bytes_out) *bytes_out = bytes_ - before;
  return true;
}

std::string GraphRewriter::add_matmulnbits_zero_points(const PlannedWeight& pw, const kernels::WeightMatrix& shape,
                                                       const kernels::QuantSpec& spec, const kernels::QuantResult& q) {
  if (!spec.zero_point) return {};
  const int64_t N = pw.N(), G = q.groups;
  const std::string zps = unique_name(pw.weight + "_zero_points");
  if (!q.float_zero_points.empty()) {  // T1 zero points [N, G], the scales' type: (q - z) * s with a fractional z
    std::vector<float> z(size_t(N * G));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) z[size_t(n * G + g)] = q.float_zero_points[shape.param_index(G, g, n)];
    add_initializer(zps, int(pw.dtype), {N, G}, encode_floats(pw.dtype, z));
  } else {
    const int64_t row = spec.bits == 8 ? G : (G + 1) / 2;
    add_initializer(zps, int(DType::kUInt8), {N, row}, backend_.pack_matmulnbits_zero_points(shape, spec, q));
  }
  return zps;
}

void GraphRewriter::emit_matmulnbits(const PlannedWeight& pw, const kernels::QuantSpec& spec,
                                     const kernels::QuantResult& q) {
  used_contrib_ = true;
  kernels::WeightMatrix shape;
  shape.rows = pw.rows;
  shape.cols = pw.cols;
  shape.k_axis = pw.k_axis;
  shape.dtype = pw.dtype;
  const int64_t K = pw.K(), N = pw.N();
  // MatMulNBits wants a power-of-two block >= 16 (see matmulnbits_layout_block).
  int64_t layout_block = matmulnbits_layout_block(pw, spec);
  const kernels::QuantResult* qp = &q;
  kernels::QuantSpec lspec = spec;
  kernels::QuantResult rep;
  if (pw.block < 0 && layout_block < K) {  // per channel in several blocks: repeat its scale
    const int64_t Gl = kernels::num_blocks(K, layout_block);
    rep.codes = q.codes;
    rep.groups = Gl;
    rep.scales.resize(size_t(Gl * N));
    rep.zero_points.resize(q.zero_points.empty() ? 0 : size_t(Gl * N));
    rep.float_zero_points.resize(q.float_zero_points.empty() ? 0 : size_t(Gl * N));
    for (int64_t g = 0; g < Gl; ++g)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = shape.param_index(Gl, g, n);
        rep.scales[i] = q.scales[size_t(n)];
        if (!rep.zero_points.empty()) rep.zero_points[i] = q.zero_points[size_t(n)];
        if (!rep.float_zero_points.empty()) rep.float_zero_points[i] = q.float_zero_points[size_t(n)];
      }
    lspec.block = layout_block;
    qp = &rep;
  }
  const int64_t G = qp->groups;
  const std::string b = unique_name(pw.weight + "_Q4");
  add_initializer(b, int(DType::kUInt8), {N, G, layout_block * spec.bits / 8},
                  backend_.pack_matmulnbits_weight(shape, lspec, *qp, layout_block));
  const std::string scales = unique_name(pw.weight + "_scales");
  add_initializer(scales, int(pw.dtype), {N, G}, encode_floats(pw.dtype, backend_.matmulnbits_scales(shape, *qp)));
  const std::string zps = add_matmulnbits_zero_points(pw, shape, lspec, *qp);
  const bool float_zero_point = !qp->float_zero_points.empty();
  nbits_[pw.weight] = {b, scales, zps, layout_block, G, spec.bits, {}, float_zero_point};
  if (spec.zero_point && !float_zero_point && keep_zero_points_.count(pw.weight)) {
    std::vector<uint8_t>& z = nbits_[pw.weight].zero_points_vg;
    z.resize(size_t(N * G));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) z[size_t(n * G + g)] = qp->zero_points[shape.param_index(G, g, n)];
  }
  for (int i : pw.nodes) {
    const onnx::NodeProto& old = model_.graph().node(i);
    onnx::NodeProto n;
    std::string name = old.name();
    const std::string suffix = "/MatMul";  // ORT-GenAI's own int4 models name them .../MatMulNBits
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      name = name.substr(0, name.size() - 6) + "MatMulNBits";
    else
      name += "_Q4";
    n.set_name(unique_name(name));
    n.set_op_type("MatMulNBits");
    n.set_domain("com.microsoft");
    n.add_input(old.input(0));
    n.add_input(b);
    n.add_input(scales);
    const bool bias = old.op_type() == "Gemm" && old.input_size() >= 3 && !old.input(2).empty();
    if (!zps.empty() || bias) n.add_input(zps);
    if (bias) {
      n.add_input("");          // g_idx
      n.add_input(old.input(2));  // bias
    }
    n.add_output(old.output(0));
    set_int_attr(n, "K", K);
    set_int_attr(n, "N", N);
    set_int_attr(n, "bits", spec.bits);
    set_int_attr(n, "block_size", layout_block);
    replace_[i] = std::move(n);
  }
}

void GraphRewriter::set_initializer_data(const std::string& name, const std::vector<uint8_t>& bytes,
                                         const std::vector<int64_t>* new_dims) {
  auto it = initializers_.find(name);
  if (it == initializers_.end()) throw Error("internal: no initializer '" + name + "' to rewrite");
  auto* t = const_cast<onnx::TensorProto*>(it->second);
  if (new_dims) {
    t->clear_dims();
    for (int64_t d : *new_dims) t->add_dims(d);
  }
  writer_.put(*t, bytes.data(), bytes.size());
  written_.insert(name);
}

void GraphRewriter::insert_scale_mul(const std::string& activation, const std::vector<int>& consumers, DType dtype,
                                     const std::vector<float>& values, const std::string& node_name,
                                     const std::string& init_name, const std::string& output_name) {
  const std::string init = unique_name(init_name);
  add_initializer(init, int(dtype), {1, int64_t(values.size())}, encode_floats(dtype, values));
  onnx::NodeProto mul;
  mul.set_name(unique_name(node_name));
  mul.set_op_type("Mul");
  mul.add_input(activation);
  mul.add_input(init);
  const std::string out = unique_name(output_name);
  mul.add_output(out);
  int first = consumers.front();
  for (int i : consumers) first = std::min(first, i);
  insert_before_[first].push_back(std::move(mul));
  for (int i : consumers) {
    auto* n = model_.mutable_graph()->mutable_node(i);
    for (int j = 0; j < n->input_size(); ++j)
      if (n->input(j) == activation) n->set_input(j, out);
  }
}

void GraphRewriter::finish() {
  onnx::GraphProto* g = model_.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < g->node_size(); ++i) {
    auto ins = insert_before_.find(i);
    if (ins != insert_before_.end())
      for (auto& n : ins->second) *nodes.Add() = std::move(n);
    auto rep = replace_.find(i);
    *nodes.Add() = rep != replace_.end() ? std::move(rep->second) : std::move(*g->mutable_node(i));
  }
  g->mutable_node()->Swap(&nodes);

  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  for (auto& t : *g->mutable_initializer())
    if (!removed_.count(t.name())) *inits.Add() = std::move(t);
  for (auto& t : new_initializers_) *inits.Add() = std::move(t);
  new_initializers_.clear();
  g->mutable_initializer()->Swap(&inits);
  initializers_.clear();

  // IR < 4 models list initializers among the graph inputs too.
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> inputs;
  for (auto& i : *g->mutable_input())
    if (!removed_.count(i.name())) *inputs.Add() = std::move(i);
  g->mutable_input()->Swap(&inputs);

  if (used_dq_) raise_default_opset(model_, 21);
  if (used_contrib_) ensure_domain(model_, "com.microsoft", 1);
  if (model_.ir_version() < 10) model_.set_ir_version(10);  // INT4/UINT4 need IR 10
}

}  // namespace nibble
