// emit and copy the rest (host/run/stages.h): each planned weight streams from the memory map
// through the backend to the writer, one at a time.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <optional>

#include "host/formats.h"
#include "host/graph/awq_place.h"
#include "host/methods.h"
#include "host/run/progress.h"
#include "host/run/stages.h"
#include "kernels/parallel.h"
#include "loaders/error.h"
#include "loaders/weight_stream.h"

namespace nibble {
namespace {

// A kernel producing NaN/Inf scales means the weight itself holds NaN/Inf: say where. (A result a device
// kept for the packings has no host scales; a non-finite scale makes its error sum non-finite too.)
void validate_result(const PlannedWeight& pw, const kernels::QuantResult& q) {
  if (!std::isfinite(q.sq_error))
    throw Error("weight '" + pw.weight + "' holds NaN or Inf values: it cannot be quantized");
  for (size_t i = 0; i < q.scales.size(); ++i)
    if (!std::isfinite(q.scales[i]))
      throw Error("weight '" + pw.weight + "': block " + std::to_string(i) +
                  " has a non-finite scale (the weight holds NaN or Inf values)");
}

// What the backend quantizes: W, or for AWQ W ⊙ s (after dividing the columns by a consumer's 1/s
// folded into this weight, which `buffer` holds): W ⊙ s is where the backend left it (w.buffer; a device
// backend keeps it, and w.data is then null).
struct Prepared {
  kernels::WeightMatrix w;
  kernels::QuantSpec spec;
  std::vector<uint8_t> buffer;
  bool keep_result = false;  // the result may stay on the backend (QuantResult::keep)
  bool pack_codes = false;   // only the codes' ONNX INT4 bytes are read (QuantResult::pack)
};

// `w` may carry the backend's kept copy of the weight (KeptWeights): then nothing uploads it again.
Prepared prepare(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                 const std::vector<float>* s, const std::vector<float>* divisor, bool zero_point,
                 kernels::Backend& backend) {
  Prepared p;
  p.w = w;
  p.spec.bits = pw.bits;
  p.spec.block = pw.resolved_block();
  p.spec.zero_point = zero_point;
  p.spec.rtn_arithmetic = rtn_arithmetic(o, zero_point);
  if (!s) return p;
  if (divisor) {
    p.buffer = backend.divide_columns(p.w, divisor->data());
    p.w.data = p.buffer.data();
    p.w.buffer.reset();  // the kept copy is W, not W with divided columns
  }
  p.w = scale_by_awq(o, pw, p.w, s->data(), backend, &p.spec);
  return p;
}

// A result of the right sizes and no meaning: what a replayed weight hands the rewriter, whose writer
// takes the bytes from the stopped run (ModelWriter::begin_replay).
kernels::QuantResult placeholder(const PlannedWeight& pw, const kernels::QuantSpec& spec, bool float_zero_point) {
  kernels::QuantResult q;
  q.groups = (pw.K() + spec.block - 1) / spec.block;
  q.codes.assign(size_t(pw.rows * pw.cols), 0);
  q.scales.assign(size_t(q.groups * pw.N()), 1.0f);
  if (float_zero_point) q.float_zero_points.assign(q.scales.size(), 0.0f);  // beside the integer ones, as hqq's result
  if (spec.zero_point || float_zero_point) q.zero_points.assign(q.scales.size(), 0);
  return q;
}

// What rtn_lsq searches: errors weighted by rms(block) + |w| (llama.cpp's choice for its
// k-quants), which measured the best perplexity of the three weightings on SmolLM2-135M
// (bench/log/2026-11-24.md "Default RTN and HQQ").
kernels::RtnSearchOptions rtn_lsq_options() {
  kernels::RtnSearchOptions r;
  r.weight = kernels::FitWeight::kMagnitude;
  return r;
}

// A method with fractional zero points (hqq) keeps them where the weight's format carries them at its bits
// (MatMulNBits' T1 zero points at 4 bits: ONNX Runtime's CPU MatMulNBits computes float zero points at 4 bits
// only, "Only 4b quantization is supported for unpacked compute"); ONNX DequantizeLinear (dq, qdq, a Gemm's
// dq fallback) takes integer ones only.
bool writes_float_zero_point(const QuantizeOptions& o, const PlannedWeight& pw, const GraphRewriter& rewriter) {
  const Format f = rewriter.format_for(pw);
  return zero_points_of(o, f) == ZeroPoints::kFloat && pw.bits == format_record(f).float_zero_point_bits;
}

// The method's own rounding (its record's quantizer) of a weight no calibrated search quantizes; false: plain
// RTN, after AWQ's scale where the weight has one.
bool round_own(const QuantizeOptions& o, const PlannedWeight& pw, const Prepared& p, bool float_zero_point,
               kernels::Backend& backend, kernels::QuantResult& q) {
  switch (method(o.algo).rounding.quantizer) {
    case Quantizer::kRtnSearch: {
      // No calibration: each block picks, among clip ratios of both signs (the block's extreme on the
      // otherwise unused code -2^(b-1) included), the scale with the smallest weight error.
      const std::vector<float> unit(static_cast<size_t>(pw.K()), 1.0f);
      backend.rtn_weighted(p.w, p.spec, unit.data(), block_clip_ratios(), q);
      return true;
    }
    case Quantizer::kHqq: {
      kernels::HqqOptions h;
      h.float_zero_point = float_zero_point;
      backend.hqq(p.w, p.spec, h, q);
      return true;
    }
    case Quantizer::kRtnLsq:
      if (!rtn_searches_scale(o)) return false;
      backend.rtn_lsq(p.w, p.spec, rtn_lsq_options(), q);
      return true;
    case Quantizer::kRtn: break;
  }
  return false;
}

// `codes`: a previous weight's code (or packed code) vector, whose pages the quantizer writes again instead of faulting in
// fresh ones (a 7B model's codes are 6.7 GB: the kernel zeroing new pages cost more CPU time than packing).
kernels::QuantResult quantize(const QuantizeOptions& o, const PlannedWeight& pw, const Prepared& p,
                              const std::vector<float>* s, Searched& searched, bool float_zero_point,
                              kernels::Backend& backend, std::vector<uint8_t> codes = {}) {
  kernels::QuantResult q;
  q.codes = std::move(codes);  // Backend::rtn takes its pages for `packed` where it packs
  q.keep = p.keep_result;
  q.pack = p.pack_codes;
  if (searched.replay) return placeholder(pw, p.spec, float_zero_point);
  if (searched.quantizer) {
    searched.quantizer->quantize(pw, p.w, p.spec, s, q);
  } else if (!round_own(o, pw, p, float_zero_point, backend, q)) {
    if (s) quantize_awq_scaled(o, pw, p.w, p.spec, *s, *searched.calib, backend, q);
    else backend.rtn(p.w, p.spec, q);
  }
  validate_result(pw, q);
  return q;
}

nlohmann::json weight_entry(const PlannedWeight& pw, const kernels::QuantSpec& spec, const kernels::QuantResult& q,
                            Format used, uint64_t bytes, double secs) {
  const int64_t n = pw.rows * pw.cols;
  return {{"name", pw.weight},       {"node", pw.node_name},
          {"nodes", pw.nodes.size()}, {"op_type", pw.op_type},
          {"shape", {pw.rows, pw.cols}}, {"k_axis", pw.k_axis},
          {"dtype", dtype_name(pw.dtype)}, {"layer", pw.layer},
          {"role", pw.role},           {"bits", pw.bits},
          {"block_size", pw.block},    {"zero_point", spec.zero_point},
          {"zero_point_type", !q.float_zero_points.empty() ? dtype_name(pw.dtype) : spec.zero_point ? "code" : "none"},
          {"format", name_of(used)},   {"mse", q.sq_error / double(n)},
          {"bytes_in", uint64_t(n) * dtype_size(pw.dtype)}, {"bytes_out", bytes},
          {"seconds", secs}};
}

// An embedding table: no activations reach it, so no AWQ, clip search or GPTQ (quantize_gather).
void emit_gather(const QuantizeOptions& o, OnnxModel& model, const PlannedWeight& pw, GraphRewriter& rewriter,
                 kernels::Backend& backend, Emitted& e) {
  const auto tw = std::chrono::steady_clock::now();
  TensorView v = model.view(*model.initializer(pw.weight));
  const Prepared p = prepare(o, pw, kernels::WeightMatrix{pw.dtype, v.data, pw.rows, pw.cols, pw.k_axis, {}}, nullptr,
                             nullptr, gather_zero_point(o), backend);
  kernels::QuantResult q;
  quantize_gather(o, pw, p.w, p.spec, backend, q);
  validate_result(pw, q);
  uint64_t bytes = 0;
  const Format used = rewriter.emit(pw, p.spec, q, &bytes);
  if (!pw.keep_float) model.release(v);
  e.bytes_out += bytes;
  e.sq_error += q.sq_error;
  e.elements += pw.rows * pw.cols;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count();
  e.weights.push_back(weight_entry(pw, p.spec, q, used, bytes, secs));
  e.weights.back()["gather_quantize_axis"] = pw.k_axis;
  const char* op = format_record(used).gather_operator;
  e.weights.back()["op_format"] = op ? op : name_of(used);
}

// A table tied to a weight quantized without an AWQ scale shares that weight's MatMulNBits
// tensors; true when it did (its report entry points at the weight it shares).
bool emit_shared(const PlannedWeight& pw, const std::map<std::string, std::vector<float>>& awq_scales,
                 const std::map<std::string, std::vector<float>>& column_divisors, GraphRewriter& rewriter,
                 Emitted& e) {
  if (pw.tied_to.empty()) return false;
  std::string why;
  uint64_t bytes = 0;
  if (awq_scales.count(pw.tied_to) || column_divisors.count(pw.tied_to))
    why = "'" + pw.tied_to + "' carries an AWQ scale the lookup must not see";
  else if (rewriter.emit_shared_table(pw, &bytes, &why)) {
    nlohmann::json entry;
    for (const auto& w : e.weights)
      if (w["name"] == pw.tied_to) entry = w;
    entry.update({{"name", pw.weight}, {"node", pw.node_name}, {"nodes", pw.nodes.size()}, {"op_type", "Gather"},
                  {"shape", {pw.rows, pw.cols}}, {"k_axis", 1}, {"layer", -1}, {"role", "embedding"},
                  {"gather_quantize_axis", 1}, {"shared_with", pw.tied_to}, {"op_format", "GatherBlockQuantized"},
                  {"bytes_in", uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype)}, {"bytes_out", bytes},
                  {"seconds", 0.0}});
    const int64_t n = pw.rows * pw.cols;
    e.bytes_out += bytes;
    e.elements += n;
    e.sq_error += entry["mse"].get<double>() * double(n);
    e.weights.push_back(entry);
    spdlog::info("{}: tied to {}: GatherBlockQuantized reads its MatMulNBits data (one quantized copy: its "
                 "bits, blocks, scales{}; --gather_block_size does not apply)", pw.weight, pw.tied_to,
                 entry["zero_point"].get<bool>() ? ", zero points" : "");
    return true;
  }
  spdlog::info("{}: tied to {} but quantized on its own ({})", pw.weight, pw.tied_to, why);
  return false;
}

// Whether the quantizer reads this weight on the backend as it is stored (no AWQ scale, no divided
// columns, a method whose record lets it read ahead): then it is worth putting on the backend ahead of time.
bool read_as_stored(const QuantizeOptions& o, const PlannedWeight& pw, const Searched& searched,
                    const std::map<std::string, std::vector<float>>& scales,
                    const std::map<std::string, std::vector<float>>& column_divisors) {
  return !searched.replay && !searched.quantizer && method(o.algo).rounding.reads_ahead &&
         !scales.count(pw.weight) && !column_divisors.count(pw.weight);
}

// The next weight, put on the backend before the current one is quantized (Backend::upload enqueues its
// upload and returns at once): on a device its upload runs while the current weight computes and comes
// back. The CPU keeps nothing; a device that cannot hold two weights beside the work returns it as it was.
struct Ahead {
  std::optional<TensorView> view;
  kernels::WeightMatrix kept;
};

// What emit_stage reads for every weight.
struct EmitContext {
  const QuantizeOptions& o;
  OnnxModel& model;
  const Planned& planned;
  Searched& searched;
  GraphRewriter& rewriter;
  kernels::Backend& backend;
  WeightStream& stream;  // the weights' bytes, read one ahead
  std::map<std::string, std::vector<float>> scales, column_divisors;
  bool zero_point = false;
};

// One weight taken from the memory map and made ready for its quantizer, then its result.
struct Job {
  std::chrono::steady_clock::time_point started;
  TensorView view;
  kernels::WeightMatrix kept;  // the copy a device kept ahead, released after the write
  Prepared p;
  const std::vector<float>* scale = nullptr;    // AWQ's
  const std::vector<float>* divisor = nullptr;  // a consumer's 1/s folded into its columns
  bool float_zero_point = false;
  kernels::QuantResult q;
};

// Weight i's job, on the calling thread (the map, the kept copies and the rewriter are read here): from
// `ahead` where that holds it. With keep_next, weight i + 1 goes on the backend first, where it is read as
// stored.
Job take(EmitContext& c, size_t i, Ahead& ahead, bool keep_next) {
  const std::vector<PlannedWeight>& weights = c.planned.plan.weights;
  const PlannedWeight& pw = weights[i];
  Job j{std::chrono::steady_clock::now(), {}, {}, {}, nullptr, nullptr, false, {}};
  j.view = ahead.view ? std::move(*ahead.view) : c.stream.take(i);
  j.kept = std::move(ahead.kept);
  ahead = Ahead{};
  if (keep_next && i + 1 < weights.size() && !c.searched.kept.holds(weights[i + 1].weight) &&
      read_as_stored(c.o, weights[i + 1], c.searched, c.scales, c.column_divisors)) {
    const PlannedWeight& nw = weights[i + 1];
    ahead.view = c.stream.take(i + 1);
    ahead.kept = c.backend.upload_weight(kernels::WeightMatrix{nw.dtype, ahead.view->data, nw.rows, nw.cols, nw.k_axis, {}});
  }
  const auto s = c.scales.find(pw.weight);
  j.scale = s == c.scales.end() ? nullptr : &s->second;
  const auto cd = c.column_divisors.find(pw.weight);
  j.divisor = cd == c.column_divisors.end() ? nullptr : &cd->second;
  // The copy an earlier stage left on the device (taken: freed once this weight is quantized).
  j.p = prepare(c.o, pw, c.searched.kept.take(pw, j.view.data), j.scale, j.divisor, c.zero_point, c.backend);
  if (j.kept.buffer) j.p.w = j.kept;  // kept ahead (read_as_stored): the backend reads its own copy
  // MatMulNBits: a device keeps the codes for the packing, which reads them there (only its output comes
  // back); not when the host needs them (the quantized layers fed forward, a replay's placeholder).
  j.p.keep_result =
      !c.searched.on_quantized && !c.searched.replay && c.rewriter.packs_on_backend(pw, j.p.spec);
  j.p.pack_codes = !c.searched.on_quantized && !c.searched.replay && c.rewriter.reads_packed_codes(pw, j.p.spec);
  j.float_zero_point = writes_float_zero_point(c.o, pw, c.rewriter);
  return j;
}

// Every weight of the plan prepared as take() prepares it, handed to a quantizer that quantizes them together
// (CalibratedQuantizer::wants_group) before the first is asked for.
void hand_group(EmitContext& c) {
  const std::vector<PlannedWeight>& weights = c.planned.plan.weights;
  std::vector<TensorView> views;
  std::vector<Prepared> prepared;
  views.reserve(weights.size());
  prepared.reserve(weights.size());
  std::vector<GroupWeight> group;
  for (const auto& pw : weights) {
    const onnx::TensorProto* t = c.model.initializer(pw.weight);
    if (!t) throw Error("weight '" + pw.weight + "' is not an initializer");
    views.push_back(c.model.view(*t));
    const auto s = c.scales.find(pw.weight);
    const auto d = c.column_divisors.find(pw.weight);
    GroupWeight g{&pw, {}, {}, s == c.scales.end() ? nullptr : &s->second,
                  d == c.column_divisors.end() ? nullptr : &d->second};
    prepared.push_back(prepare(c.o, pw, kernels::WeightMatrix{pw.dtype, views.back().data, pw.rows, pw.cols, pw.k_axis, {}},
                               g.awq_scale, g.divisor, c.zero_point, c.backend));
    g.w = prepared.back().w;
    g.spec = prepared.back().spec;
    group.push_back(g);
  }
  c.searched.quantizer->begin_group(group);
}

// Whether weight i may be quantized on a second thread while the one before it is written: the backend
// takes calls from two threads, and its quantizer reads nothing the write changes (no search state, no
// AWQ scale, nothing fed forward).
bool quantizes_beside_write(const EmitContext& c, size_t i) {
  return c.backend.takes_concurrent_calls() && !c.searched.on_quantized &&
         read_as_stored(c.o, c.planned.plan.weights[i], c.searched, c.scales, c.column_divisors);
}

// The plan's weights in the order emit_stage takes them, each read ahead into a buffer unless nothing
// reads its bytes: a replayed layer's (the writer copies the stopped run's) or a copy the device kept.
// Readers: the run's threads, at most 8 (more do not read a page cache faster). The CPU's kernels read
// the memory map itself, its pages mapped ahead: a copy would cost them more than it saves (the 7B-shaped
// plain RTN: 6.0-7.2 s against 8.3-9.2 s on 2 cores); a device's staging copies each weight anyway.
WeightStream weight_stream(OnnxModel& model, const Plan& plan, const Searched& searched, bool on_device) {
  std::vector<std::string> names;
  std::vector<bool> read;
  for (const auto& pw : plan.weights) {
    names.push_back(pw.weight);
    read.push_back(!searched.replay && !searched.kept.holds(pw.weight));
  }
  return WeightStream(model, std::move(names), std::move(read), std::min(kernels::num_threads(), 8),
                      on_device ? WeightStream::Reading::kCopy : WeightStream::Reading::kMapAhead);
}

// The run's one line before the weights: what is quantized, to what.
void log_plan(const QuantizeOptions& o, const Planned& planned, uint64_t bytes_in) {
  const Plan& plan = planned.plan;
  int64_t n_int8 = 0;
  for (const auto& pw : plan.weights) n_int8 += pw.bits == 8;
  spdlog::info("quantizing {} weights ({}) of {}: {} INT4 block {}{}{} -> {}", plan.weights.size(),
               human_bytes(bytes_in), o.onnx_path, name_of(o.algo), o.block_size,
               n_int8 ? " + " + std::to_string(n_int8) + " INT8 per channel" : std::string(),
               plan.gathers.empty() ? std::string()
                                    : " + " + std::to_string(plan.gathers.size()) + " embedding(s) INT4 block " +
                                          std::to_string(o.gather_block_size),
               name_of(planned.format));
  const int float_bits = format_record(planned.format).float_zero_point_bits;
  if (zero_points_of(o, planned.format) == ZeroPoints::kFloat && n_int8 && float_bits != 8)
    spdlog::info("--algo {}: the {} INT8 layers keep integer zero points (--format {} takes float zero points at {} "
                 "bits only)", name_of(o.algo), n_int8, name_of(planned.format), float_bits);
}

// One embedding table: shared with a tied weight's codes, or quantized on its own.
void emit_table(const QuantizeOptions& o, OnnxModel& model, const PlannedWeight& pw,
                const std::map<std::string, std::vector<float>>& scales,
                const std::map<std::string, std::vector<float>>& column_divisors, GraphRewriter& rewriter,
                kernels::Backend& backend, Emitted& e, Progress& progress) {
  const uint64_t in = uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
  if (!emit_shared(pw, scales, column_divisors, rewriter, e)) emit_gather(o, model, pw, rewriter, backend, e);
  const nlohmann::json& done = e.weights.back();
  progress.step(pw.weight + " [" + std::to_string(pw.rows) + ", " + std::to_string(pw.cols) + "] " +
                    dtype_name(pw.dtype) + " embedding -> int" + done["bits"].dump() + " " + human_bytes(in) +
                    " -> " + human_bytes(done["bytes_out"].get<uint64_t>()),
                in);
}


// Weight j's write: its tensors through the rewriter, its pages released, its report entry.
void write(EmitContext& c, const PlannedWeight& pw, Job& j, Emitted& e, Progress& progress) {
  if (c.searched.on_quantized && !c.searched.replay) c.searched.on_quantized(pw, j.p.spec, j.q, j.scale, j.divisor);
  uint64_t bytes = 0;
  // qdq: QuantizeLinear rounds the stored float weight again. That gives back the codes only from the
  // weight they were computed from, by the same arithmetic: for GPTQ's codes, those of W ⊙ s (AWQ) or
  // of W with divided columns, and the clip search's (an fp16 block's quotient is rounded to fp16, ONNX
  // Runtime's is not), the stored weight is s·(q − z) itself (exact: see kernels/cpu/dequant_ref.h).
  const bool transformed = c.searched.quantizer || j.scale || j.divisor;
  std::vector<uint8_t> qdq_float;
  if (transformed && format_record(c.planned.format).keeps_float_weight) qdq_float = c.backend.dequantize(j.p.w, j.p.spec, j.q, pw.dtype);
  const Format used = c.rewriter.emit(pw, j.p.spec, j.q, &bytes, qdq_float.empty() ? nullptr : &qdq_float);
  if (used != c.planned.format)
    spdlog::warn("{}: {} cannot be expressed as MatMulNBits (transA, alpha/beta or bias shape); wrote dq instead",
                 pw.weight, pw.node_name);
  j.kept = {};  // the backend's copy goes before the pages it was read from
  j.p.w.buffer.reset();
  if (!pw.keep_float) c.model.release(j.view);
  const int64_t n = pw.rows * pw.cols;
  e.bytes_out += bytes;
  e.sq_error += j.q.sq_error;
  e.elements += n;
  e.weights.push_back(weight_entry(pw, j.p.spec, j.q, used, bytes,
                                   std::chrono::duration<double>(std::chrono::steady_clock::now() - j.started).count()));
  if (c.planned.mixed.per_weight.count(pw.weight)) e.weights.back()["mixed"] = c.planned.mixed.per_weight.at(pw.weight);
  if (j.scale) {
    e.weights.back()["awq_alpha"] = c.searched.choices.at(pw.weight).alpha;
    e.weights.back()["awq_losses"] = c.searched.choices.at(pw.weight).losses;
  }
  progress.step(pw.weight + " [" + std::to_string(pw.rows) + ", " + std::to_string(pw.cols) + "] " +
                    dtype_name(pw.dtype) + " -> int" + std::to_string(pw.bits) + " " +
                    human_bytes(uint64_t(n) * dtype_size(pw.dtype)) + " -> " + human_bytes(bytes),
                uint64_t(n) * dtype_size(pw.dtype));
}

}  // namespace

Emitted emit_stage(const QuantizeOptions& o, OnnxModel& model, const Planned& planned, Searched& searched,
                   GraphRewriter& rewriter, kernels::Backend& backend) {
  const Plan& plan = planned.plan;
  Emitted e;
  for (const auto* list : {&plan.weights, &plan.gathers})
    for (const auto& pw : *list) e.bytes_in += uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
  log_plan(o, planned, e.bytes_in);
  e.zero_point = writes_zero_point(o);
  WeightStream stream = weight_stream(model, plan, searched, backend.transfer_ledger() != nullptr);
  EmitContext c{o, model, planned, searched, rewriter, backend, stream, {}, {}, e.zero_point};
  for (const auto& [name, choice] : searched.choices) c.scales[name] = choice.scale;
  if (o.searches_scales())
    c.column_divisors = place_awq_scales(model, plan, c.scales, rewriter, backend, !o.awqlite_disable_fuse_nodes);
  for (const auto& t : plan.gathers)
    if (!t.tied_to.empty()) rewriter.keep_zero_points_of(t.tied_to);
  if (searched.quantizer && searched.quantizer->wants_group() && !searched.replay) hand_group(c);
  Progress progress(int64_t(plan.weights.size() + plan.gathers.size()), e.bytes_in, !o.quiet);
  Ahead ahead;
  // The next weight's job and its result, computed on a second thread while this one is written (the
  // write, one thread packing and writing, would leave the other cores idle). Declared in this order so
  // that the result is awaited before the job's pages go.
  std::optional<Job> next;
  std::future<kernels::QuantResult> next_q;
  std::vector<std::vector<uint8_t>> spare_codes;  // written weights' code vectors, at most two
  // Each as large as the largest weight's codes: a vector grown past its capacity would move to fresh pages
  // (zeroed by the kernel) and copy what it held.
  int64_t most_codes = 0;
  for (const auto& pw : plan.weights) most_codes = std::max(most_codes, pw.rows * pw.cols);
  const auto spare = [&spare_codes, most_codes] {
    std::vector<uint8_t> v;
    if (!spare_codes.empty()) {
      v = std::move(spare_codes.back());
      spare_codes.pop_back();
    }
    v.reserve(size_t(most_codes));
    return v;
  };
  for (size_t i = 0; i < plan.weights.size(); ++i) {
    const PlannedWeight& pw = plan.weights[i];
    const bool beside = i + 1 < plan.weights.size() && quantizes_beside_write(c, i + 1);
    Job j;
    if (next) {
      j = std::move(*next);
      next.reset();
      j.q = next_q.get();
    } else {
      j = take(c, i, ahead, !beside);
      j.q = quantize(o, pw, j.p, j.scale, searched, j.float_zero_point, backend, spare());
    }
    if (beside) {
      next = take(c, i + 1, ahead, false);
      next_q = std::async(std::launch::async, [&o, &searched, &backend, &nw = plan.weights[i + 1], &n = *next,
                                               codes = spare()]() mutable {
        return quantize(o, nw, n.p, n.scale, searched, n.float_zero_point, backend, std::move(codes));
      });
    }
    write(c, pw, j, e, progress);
    spare_codes.push_back(std::move(j.q.packed.empty() ? j.q.codes : j.q.packed));
  }
  for (const auto& pw : plan.gathers)
    emit_table(o, model, pw, c.scales, c.column_divisors, rewriter, backend, e, progress);
  progress.finish();
  e.read = stream.stats();
  return e;
}

uint64_t copy_rest_stage(OnnxModel& model, const GraphRewriter& rewriter, ModelWriter& writer) {
  uint64_t copied = 0;
  for (auto& t : *model.proto().mutable_graph()->mutable_initializer()) {
    if (rewriter.removed_initializers().count(t.name()) || rewriter.written_initializers().count(t.name())) continue;
    const bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
    if (!external && t.raw_data().size() < ModelWriter::kInlineThreshold) continue;
    TensorView v = model.view(t);  // checks the range
    if (external) writer.put_from_file(t, model.external_path(v), v.ref.offset, v.nbytes);
    else writer.put(t, v.data, v.nbytes);
    copied += v.nbytes;
  }
  return copied;
}

}  // namespace nibble
