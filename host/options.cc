#include "host/options.h"

#include <utility>

#include "loaders/error.h"

namespace nibble {
namespace {

template <typename E, size_t N>
E parse_name(const std::string& s, const char* flag, const std::pair<const char*, E> (&table)[N]) {
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (s == table[i].first) return table[i].second;
    choices += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + table[i].first;
  }
  throw Error(std::string(flag) + " " + s + " is unknown (choose " + choices + ")");
}

template <typename E, size_t N>
const char* name_in(E e, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [name, v] : table)
    if (v == e) return name;
  return "";
}

constexpr std::pair<const char*, Algo> kAlgos[] = {
    {"awq_lite", Algo::kAwqLite}, {"awq_clip", Algo::kAwqClip}, {"awq_full", Algo::kAwqFull},
    {"rtn", Algo::kRtn},          {"rtn_dq", Algo::kRtnDq},     {"gptq", Algo::kGptq},
    {"awq_gptq", Algo::kAwqGptq}, {"rtn_search", Algo::kRtnSearch},
    {"rtn_lsq", Algo::kRtnLsq},   {"hqq", Algo::kHqq}};
constexpr std::pair<const char*, Arithmetic> kModes[] = {{"nibble", Arithmetic::kNibble},
                                                         {"modelopt", Arithmetic::kModelOpt}};
constexpr std::pair<const char*, Format> kFormats[] = {
    {"dq", Format::kDq}, {"qdq", Format::kQdq}, {"matmulnbits", Format::kMatMulNBits}};
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
constexpr std::pair<const char*, LayerMode> kLayerModes[] = {
    {"auto", LayerMode::kAuto}, {"on", LayerMode::kOn}, {"off", LayerMode::kOff}};

}  // namespace

Algo parse_algo(const std::string& s) { return parse_name(s, "--algo", kAlgos); }
Arithmetic parse_awq_mode(const std::string& s) { return parse_name(s, "--awq_mode", kModes); }
Format parse_format(const std::string& s) { return parse_name(s, "--format", kFormats); }

int parse_gather_axis(const std::string& s) {
  for (const auto& [text, axis] : {std::pair{"0", 0}, {"1", 1}, {"-2", 0}, {"-1", 1}})
    if (s == text) return axis;
  throw Error("--gather_quantize_axis " + s + " is not an axis of a 2-D embedding table (choose 0 or 1)");
}
kernels::Device parse_device(const std::string& s) { return parse_name(s, "--device", kDevices); }
MixedStrategy parse_mixed_strategy(const std::string& s) { return parse_name(s, "--mixed_strategy", kStrategies); }
const char* name_of(Algo a) { return name_in(a, kAlgos); }
const char* name_of(Arithmetic a) { return name_in(a, kModes); }
const char* name_of(Format f) { return name_in(f, kFormats); }
const char* name_of(kernels::Device d) { return name_in(d, kDevices); }
const char* name_of(MixedStrategy m) { return name_in(m, kStrategyNames); }
const char* name_of(LayerMode m) { return name_in(m, kLayerModes); }

LayerMode parse_layer_mode(const std::string& s) {
  if (s.empty() || s == "true" || s == "1") return LayerMode::kOn;
  if (s == "false" || s == "0") return LayerMode::kOff;
  return parse_name(s, "--layer_by_layer", kLayerModes);
}

Format QuantizeOptions::resolved_format() const {
  if (format) return *format;
  return algo == Algo::kRtn ? Format::kQdq : Format::kDq;
}

MixedStrategy QuantizeOptions::mixed_strategy() const {
  if (!layers_8bit.empty()) return MixedStrategy::kLayers8bit;
  if (mixed_strategy_flag != MixedStrategy::kNone) return mixed_strategy_flag;
  return enable_mixed_quant ? MixedStrategy::kModelopt : MixedStrategy::kNone;
}

}  // namespace nibble
