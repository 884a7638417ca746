// `nibble methods`: the method and format registries (host/methods.h, host/formats.h) as a table for people
// or JSON for programs.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "host/formats.h"
#include "host/methods.h"
#include "host/run/pipeline.h"

namespace nibble {
namespace {

// The searches whose statistics a method measures, by name ("scale_search", "clip_search", "gptq").
std::vector<std::string> measure_names(const Measures& m) {
  std::vector<std::string> out;
  if (m.scale_search) out.push_back("scale_search");
  if (m.clip_search) out.push_back("clip_search");
  if (m.gptq) out.push_back("gptq");
  return out;
}

nlohmann::json to_json(const Method& m) {
  nlohmann::json j;
  j["name"] = m.name;
  j["calibrates"] = m.calibrates();
  j["measures"] = measure_names(m.measures);
  j["modelopt"] = m.modelopt_refusal == nullptr;
  j["modelopt_refusal"] = m.modelopt_refusal ? nlohmann::json(m.modelopt_refusal) : nlohmann::json();
  j["default_format"] = name_of(m.default_format);
  j["summary"] = m.summary;
  j["quantizer"] = name_of(m.rounding.quantizer);
  j["zero_point"] = name_of(m.rounding.zero_point);
  j["zero_point_why"] = m.rounding.zero_point_why ? nlohmann::json(m.rounding.zero_point_why) : nlohmann::json();
  j["fractional_zero_points"] = m.rounding.fractional_zero_points;
  j["learned_rounding"] = m.learned_rounding;
  j["learns_layers"] = m.learns_layers;
  return j;
}

nlohmann::json to_json(const FormatRecord& f) {
  return {{"name", f.name},
          {"needs_opset21", f.needs_opset21},
          {"keeps_float_weight", f.keeps_float_weight},
          {"float_zero_point_bits", f.float_zero_point_bits},
          {"byte_model", name_of(f.bytes)},
          {"gather_operator", f.gather_operator ? nlohmann::json(f.gather_operator) : nlohmann::json()},
          {"summary", f.summary}};
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : "+") + x;
  return s.empty() ? "no" : s;
}

}  // namespace

int run_methods(bool json) {
  if (json) {
    nlohmann::json all = nlohmann::json::array();
    for (const Method& m : methods()) all.push_back(to_json(m));
    nlohmann::json fs = nlohmann::json::array();
    for (const FormatRecord& f : formats()) fs.push_back(to_json(f));
    std::printf("%s\n", nlohmann::json{{"methods", all}, {"formats", fs}}.dump(1).c_str());
    return 0;
  }
  std::printf("%-11s %-25s %-9s %-6s %s\n", "method", "calibrates", "modelopt", "format", "summary");
  for (const Method& m : methods())
    std::printf("%-11s %-25s %-9s %-6s %s\n", m.name, joined(measure_names(m.measures)).c_str(),
                m.modelopt_refusal ? "no" : "yes", name_of(m.default_format), m.summary);
  std::printf("\n--awq_mode modelopt refuses:\n");
  for (const Method& m : methods())
    if (m.modelopt_refusal) std::printf("  %-11s %s\n", m.name, m.modelopt_refusal);
  std::printf("\n--format:\n");
  for (const FormatRecord& f : formats()) std::printf("  %-11s %s\n", f.name, f.summary);
  return 0;
}

}  // namespace nibble
