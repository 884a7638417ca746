#include "host/options.h"

#include <utility>

#include "host/formats.h"
#include "host/methods.h"
#include "host/registry.h"
#include "loaders/error.h"

namespace nibble {
namespace {

// "a, b or c"
std::string choice_list(const std::vector<const char*>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

[[noreturn]] void unknown(const char* flag, const std::string& s, const std::vector<const char*>& names) {
  throw Error(std::string(flag) + " " + s + " is unknown (choose " + choice_list(names) + ")");
}

template <typename E, size_t N>
E parse_name(const std::string& s, const char* flag, const std::pair<const char*, E> (&table)[N]) {
  std::vector<const char*> names;
  for (const auto& [name, v] : table) {
    if (s == name) return v;
    names.push_back(name);
  }
  unknown(flag, s, names);
}

template <typename E, size_t N>
const char* name_in(E e, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [name, v] : table)
    if (v == e) return name;
  return "";
}

constexpr std::pair<const char*, Arithmetic> kModes[] = {{"nibble", Arithmetic::kNibble},
                                                         {"modelopt", Arithmetic::kModelOpt}};
constexpr std::pair<const char*, kernels::Device> kDevices[] = {
    {"auto", kernels::Device::kAuto},
    {"cuda", kernels::Device::kCuda},
    {"cpu", kernels::Device::kCpu},
    {"cuda_emulated", kernels::Device::kCudaEmulated}};
constexpr std::pair<const char*, MixedStrategy> kStrategies[] = {
    {"modelopt", MixedStrategy::kModelopt}, {"sensitivity", MixedStrategy::kSensitivity}};
constexpr std::pair<const char*, MixedStrategy> kStrategyNames[] = {
    {"", MixedStrategy::kNone},
    {"modelopt", MixedStrategy::kModelopt},
    {"layers_8bit", MixedStrategy::kLayers8bit},
    {"sensitivity", MixedStrategy::kSensitivity}};
constexpr std::pair<const char*, CalibrationEngine> kCalibrationEngines[] = {
    {"auto", CalibrationEngine::kAuto}, {"ort", CalibrationEngine::kOrt}, {"native", CalibrationEngine::kNative}};
constexpr std::pair<const char*, LayerMode> kLayerModes[] = {
    {"auto", LayerMode::kAuto}, {"on", LayerMode::kOn}, {"off", LayerMode::kOff}};

}  // namespace

// The algorithms' names are the method registry's.
Algo parse_algo(const std::string& s) {
  if (const Method* m = find_method(s)) return m->algo;
  unknown("--algo", s, names_of(methods()));
}
Arithmetic parse_awq_mode(const std::string& s) { return parse_name(s, "--awq_mode", kModes); }
// The formats' names are the format registry's.
Format parse_format(const std::string& s) {
  if (const FormatRecord* f = find_format(s)) return f->format;
  unknown("--format", s, names_of(formats()));
}

int parse_gather_axis(const std::string& s) {
  for (const auto& [text, axis] : {std::pair{"0", 0}, {"1", 1}, {"-2", 0}, {"-1", 1}})
    if (s == text) return axis;
  throw Error("--gather_quantize_axis " + s + " is not an axis of a 2-D embedding table (choose 0 or 1)");
}
kernels::Device parse_device(const std::string& s) { return parse_name(s, "--device", kDevices); }
MixedStrategy parse_mixed_strategy(const std::string& s) { return parse_name(s, "--mixed_strategy", kStrategies); }
const char* name_of(Algo a) { return method(a).name; }
const char* name_of(Arithmetic a) { return name_in(a, kModes); }
const char* name_of(Format f) { return format_record(f).name; }
const char* name_of(kernels::Device d) { return name_in(d, kDevices); }
const char* name_of(MixedStrategy m) { return name_in(m, kStrategyNames); }
const char* name_of(LayerMode m) { return name_in(m, kLayerModes); }
const char* name_of(CalibrationEngine e) { return name_in(e, kCalibrationEngines); }
CalibrationEngine parse_calibration_engine(const std::string& s) {
  return parse_name(s, "--calibration_engine", kCalibrationEngines);
}

LayerMode parse_layer_mode(const std::string& s) {
  if (s.empty() || s == "true" || s == "1") return LayerMode::kOn;
  if (s == "false" || s == "0") return LayerMode::kOff;
  return parse_name(s, "--layer_by_layer", kLayerModes);
}

Format QuantizeOptions::resolved_format() const { return format ? *format : method(algo).default_format; }
bool QuantizeOptions::searches_scales() const { return method(algo).measures.scale_search; }
bool QuantizeOptions::searches_clip() const { return method(algo).measures.clip_search; }
bool QuantizeOptions::uses_gptq() const { return method(algo).measures.gptq; }
bool QuantizeOptions::learns_layers_from_gptq() const {
  return method(algo).learns_layers && (learned_layer_from_gptq || learned_layer_sweeps);
}
bool QuantizeOptions::zero_point() const { return method(algo).zero_point(zero_point_flag); }

MixedStrategy QuantizeOptions::mixed_strategy() const {
  if (!layers_8bit.empty()) return MixedStrategy::kLayers8bit;
  if (mixed_strategy_flag != MixedStrategy::kNone) return mixed_strategy_flag;
  return enable_mixed_quant ? MixedStrategy::kModelopt : MixedStrategy::kNone;
}

}  // namespace nibble
