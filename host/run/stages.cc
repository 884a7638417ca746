// load, plan and search (host/run/stages.h).
#include "host/run/stages.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "calib/engine_calibration.h"
#include "host/formats.h"
#include "host/graph/gather_plan.h"
#include "host/graph/opset.h"
#include "host/methods.h"
#include "loaders/error.h"
#include "loaders/genai_folder.h"

namespace nibble {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Opset problems must surface before any work: matmulnbits may fall back to dq for a Gemm.
void check_opset(const OnnxModel& model, Format format) {
  if (!format_record(format).needs_opset21) return;
  onnx::ModelProto probe;
  probe.mutable_opset_import()->CopyFrom(model.proto().opset_import());
  *probe.mutable_graph()->mutable_node() = model.proto().graph().node();
  raise_default_opset(probe, 21);
}

void check_genai_output(const QuantizeOptions& o, const OnnxModel& model) {
  if (genai_companion_files(o.onnx_path).empty() || o.force) return;
  namespace fs = std::filesystem;
  const auto out_dir = fs::absolute(o.output_path).parent_path();
  std::error_code ec;
  if (fs::weakly_canonical(out_dir, ec) != fs::path(model.dir()) && fs::exists(out_dir / "genai_config.json", ec))
    throw Error("output folder " + out_dir.string() + " already has genai_config.json (use --force to overwrite)");
}

}  // namespace

LoadedModel load_stage(const QuantizeOptions& o) {
  LoadedModel l;
  l.model = OnnxModel::load(o.onnx_path);
  l.input_files = l.model->input_files();  // checks every location
  // Check every external range now, before anything is written (views are only maps).
  for (const auto& t : l.model->proto().graph().initializer())
    if (t.data_location() == onnx::TensorProto::EXTERNAL) l.model->view(t);
  return l;
}

Planned plan_stage(const QuantizeOptions& o, OnnxModel& model) {
  Planned p;
  PlanOptions popt;
  popt.nodes_to_exclude = o.nodes_to_exclude;
  popt.block_size = o.block_size;
  popt.gather_axis = o.gather_quantize_axis;
  popt.gather_block = o.gather_block_size;
  p.plan = make_plan(model, popt);
  find_tied_tables(model, p.plan);
  if (o.gather_quantize_axis && p.plan.gathers.empty())
    spdlog::warn("--gather_quantize_axis {}: no effect: no Gather reads a constant 2-D float table in {}",
                 *o.gather_quantize_axis, o.onnx_path);
  if (p.plan.weights.empty() && p.plan.gathers.empty())
    throw Error("nothing to quantize in " + o.onnx_path + ": no MatMul/Gemm with a constant 2-D float weight (" +
                std::to_string(p.plan.skipped.size()) + " skipped; see `nibble inspect`)");
  for (const auto& s : p.plan.skipped) spdlog::debug("skip {} ({}): {}", s.node, s.op_type, s.reason);
  if (mixed_enabled(o) && !mixed_needs_calibration(o)) apply_static_mixed(model, p.plan, o, &p.mixed);
  p.format = o.resolved_format();
  check_opset(model, p.format);
  check_genai_output(o, model);
  return p;
}

void search_scales(const QuantizeOptions& o, OnnxModel& model, const Plan& plan, kernels::Backend& backend,
                   Searched& s) {
  s.choices = search_awq_scales(model, plan, *s.calib, o, backend, &s.per_node, &s.kept);
}

bool needs_calibration(const QuantizeOptions& o) { return method(o.algo).calibrates() || mixed_needs_calibration(o); }

Searched search_stage(const QuantizeOptions& o, OnnxModel& model, Planned& planned, kernels::Backend& backend) {
  Searched s;
  if (!needs_calibration(o)) return s;
  if (!o.force) {  // fail before minutes of calibration, not after
    std::error_code ec;
    if (std::filesystem::exists(o.output_path, ec)) throw Error("output " + o.output_path + " exists (use --force to overwrite)");
  }
  Plan& plan = planned.plan;
  std::vector<Calibration::Request> acts;
  for (const auto& [act, idx] : plan.siblings) acts.push_back({act, plan.weights[idx[0]].K()});
  const auto tc = std::chrono::steady_clock::now();
  Calibration::Extras extras = search_calibration(o, plan);
  if (o.uses_gptq()) extras.budget_mb = kGptqCalibrationBudgetMb;
  s.calib = Calibration::run(o.calib, model.path(), acts, /*mask_padding=*/masks_padding(o), extras);
  s.calibrate_seconds = seconds_since(tc);
  spdlog::info("calibration: {} tokens, {} activations, {:.1f} s", s.calib->tokens(), acts.size(), s.calibrate_seconds);
  search_calibrated(o, model, planned, backend, s);
  return s;
}

void search_calibrated(const QuantizeOptions& o, OnnxModel& model, Planned& planned, kernels::Backend& backend,
                       Searched& s) {
  Plan& plan = planned.plan;
  const auto ts = std::chrono::steady_clock::now();
  const bool awq = o.searches_scales(), clip = o.searches_clip();
  // INT8 set already chosen (layer by layer): the 4-bit search runs on the plan as it was before the
  // pick, then the INT8 weights' inputs are searched again, as the whole-model pass does after its pick.
  const bool picked = mixed_needs_calibration(o) && planned.mixed.picked;
  // The weights the searches keep on a device for the quantizer share one room there.
  if (awq || mixed_needs_calibration(o)) s.kept.reserve(backend, plan);
  // What the layer engine's forward uploaded: the searches and the quantizer read those copies.
  const std::map<std::string, kernels::Tensor> uploaded = s.calib->take_device_weights();
  for (const auto& pw : plan.weights)
    if (auto it = uploaded.find(pw.weight); it != uploaded.end()) s.kept.adopt(pw, it->second);
  if (awq) search_scales(o, model, picked ? at_four_bits(plan, o.block_size) : plan, backend, s);
  if (awq) spdlog::info("awq-lite search ({} mode): {:.1f} s", name_of(o.arithmetic), seconds_since(ts));
  if (picked && awq) research_int8(model, plan, *s.calib, o, backend, int8_activations(plan), &s.choices, &s.kept);
  if (mixed_needs_calibration(o) && !picked)
    apply_sensitivity_mixed(model, plan, *s.calib, o, planned.format, backend, awq ? &s.choices : nullptr,
                            &planned.mixed, &s.kept);
  if (clip) {
    const auto tk = std::chrono::steady_clock::now();
    s.quantizer = make_clip_search(o, *s.calib, backend, model, plan, awq ? &s.per_node : nullptr);
    spdlog::info("clip search ({} mode): {:.1f} s", name_of(o.arithmetic), seconds_since(tk));
  }
  if (o.uses_gptq()) s.quantizer = std::make_unique<GptqQuantizer>(o, *s.calib, backend, method(o.algo).learned_rounding);
  // The next group's forward reads some of these weights (a layer's last product runs with the next
  // layer): it takes the copies the searches left on the device.
  if (o.calib.layer_engine)
    for (const auto& pw : plan.weights)
      if (kernels::Tensor t = s.kept.held_tensor(pw); !t.empty()) o.calib.layer_engine->lend_device_weight(pw.weight, t);
  s.search_seconds = seconds_since(ts);
}

}  // namespace nibble
