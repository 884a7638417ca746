#include "host/formats.h"

#include <map>

#include "host/methods.h"
#include "host/registry.h"

namespace nibble {

const char* name_of(ByteModel b) {
  switch (b) {
    case ByteModel::kDequantizeLinear: return "dequantize_linear";
    case ByteModel::kMatMulNBits: return "matmulnbits";
  }
  return "";
}

// The order is --help's.
const std::vector<FormatRecord>& formats() {
  static const std::vector<FormatRecord> all = {
      {"dq", Format::kDq, true, false, 0, ByteModel::kDequantizeLinear, nullptr, "INT4 + DequantizeLinear"},
      {"qdq", Format::kQdq, true, true, 0, ByteModel::kDequantizeLinear, nullptr,
       "QuantizeLinear->DequantizeLinear on the float weight"},
      {"matmulnbits", Format::kMatMulNBits, false, false, 4, ByteModel::kMatMulNBits, "GatherBlockQuantized",
       "com.microsoft.MatMulNBits"},
  };
  return all;
}

const FormatRecord& format_record(Format f) { return record_of(formats(), &FormatRecord::format, f, "format"); }
const FormatRecord* find_format(const std::string& name) { return find_named(formats(), name); }

// "Output form ...: dq (…), qdq (…), matmulnbits (…); default: qdq for rtn, dq for the others" — the
// default named for the methods whose record differs from the most common one.
std::string formats_help() {
  std::string s = "Output form of quantized weights:";
  for (const FormatRecord& r : formats())
    s += std::string(&r == &formats().front() ? " " : ", ") + r.name + " (" + r.summary + ")";
  std::map<Format, int> count;
  for (const Method& m : methods()) ++count[m.default_format];
  Format common = methods().front().default_format;
  for (const auto& [f, n] : count)
    if (n > count[common]) common = f;
  s += "; default: the method's (";
  for (const Method& m : methods())
    if (m.default_format != common) s += std::string(format_record(m.default_format).name) + " for " + m.name + ", ";
  return s + format_record(common).name + " for the others)";
}

}  // namespace nibble
