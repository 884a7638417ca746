// The method registry: one record per quantization algorithm (--algo), so that what a method is called,
// what it measures on calibration data, whether --awq_mode modelopt can run it, which output it writes by
// default, how it rounds a weight and what it does with zero points are answered in one table (methods.cc),
// read by the CLI, the stages, `nibble methods` and, through `nibble methods --json`, the Python API.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host/options.h"

namespace nibble {

// What a method measures on calibration data, by the search that reads it. None: it needs no calibration.
struct Measures {
  bool scale_search = false;  // AWQ's input-scale search: mean |x| per input channel and XᵀX
  bool clip_search = false;   // the clip-ratio search: XᵀX (nibble mode) or token samples (modelopt mode)
  bool gptq = false;          // GPTQ's Hessian XᵀX
  bool any() const { return scale_search || clip_search || gptq; }
};

// How a method rounds a weight that no calibrated search quantizes (GPTQ and the clip search quantize with
// their own code; an AWQ scale is applied before this rounding): emit.cc's quantize() calls its backend
// operation.
enum class Quantizer {
  kRtn,        // round to nearest (Backend::rtn, on the grid of Rounding::symmetric_rtn without zero point)
  kRtnLsq,     // each block's scale by least squares on 16 levels (Backend::rtn_lsq)
  kRtnSearch,  // each block's clip ratio and scale sign by the smallest weight error (Backend::rtn_weighted)
  kHqq,        // each block's zero point by HQQ's proximal iterations (Backend::hqq)
};

// What a method does with zero points: what --use_zero_point says, always (it fits them itself, whatever the
// flag says), or never (the flag is refused).
enum class ZeroPointPolicy { kOptional, kAlways, kRefused };

struct Rounding {
  Quantizer quantizer;
  ZeroPointPolicy zero_point;
  // kAlways: why it writes them (the run's note, "(...)"); kRefused: why it refuses --use_zero_point (the error,
  // after "--algo NAME --use_zero_point: "); null otherwise.
  const char* zero_point_why;
  // Its zero points are fractional: kept where the format carries them (FormatRecord::float_zero_point_bits),
  // rounded to integers elsewhere (the run says so).
  bool fractional_zero_points;
  // Whose RTN grid its plain RTN follows in nibble mode without zero point (with one, ONNX Runtime's always;
  // in modelopt mode, ModelOpt's): ONNX Runtime's for the RTN methods, so that the default never loses to the
  // quantizer users compare it with; amax / (2^(b-1) - 1) for the calibrated methods' symmetric fallback.
  kernels::RtnArithmetic symmetric_rtn;
  // Emit may put the next weight on the backend before this one is quantized and quantize it beside the
  // previous write (emit.cc read_as_stored). Off for hqq only, as since the look-ahead came in; whether hqq
  // gains from it has not been measured.
  bool reads_ahead;
};

struct Method {
  const char* name;  // the --algo name
  Algo algo;
  Measures measures;
  // Why --awq_mode modelopt refuses it (one line, after "--algo NAME --awq_mode modelopt: "); null when
  // ModelOpt's arithmetic for it is reproduced.
  const char* modelopt_refusal;
  Format default_format;  // without --format
  const char* summary;    // one sentence for --help and `nibble methods`
  Rounding rounding;
  // GPTQ's codes refined by learned rounding (host/algo/learned_rounding.h): the --learned_* flags and the
  // report's summary.learned_rounding are its.
  bool learned_rounding = false;
  // Rounding and block scales learned on each whole decoder layer's output (calib/layer_learning.h): layer
  // by layer on the layer engine; the --learned_layer_* flags and the report's summary.layer_learning are its.
  bool learns_layers = false;
  bool calibrates() const { return measures.any(); }
  // Whether it writes zero points, given --use_zero_point (which validate_options refuses for kRefused).
  bool zero_point(bool flag) const { return flag || rounding.zero_point == ZeroPointPolicy::kAlways; }
};

// A flag some methods read and the others ignore (GPTQ's, learned rounding's): declared once in methods.cc,
// from which come its command-line option, its range check, the note that it has no effect under another
// --algo, and its line in the report's settings. One of the three member pointers says where it lives.
struct MethodFlag {
  const char* name;  // without the dashes
  const char* help;
  int QuantizeOptions::*int_value;
  double QuantizeOptions::*double_value;
  bool QuantizeOptions::*switch_value;  // a flag without a value
  double min, max;                      // the accepted range of a value
  bool (*read_by)(const Method&);       // the methods that read it
  const char* others_lack;              // what the other methods lack: "runs no GPTQ"
  bool read_by_gptq_start = false;      // GPTQ's: read too by a learning method started from GPTQ's codes
  bool read_by_sweeps_start = false;    // awq_learned's: read too by one started from its sweeps' codes
};
const std::vector<MethodFlag>& method_flags();
// Its value in o, as JSON (the report), and whether o changed it from the default.
nlohmann::json flag_value(const MethodFlag& f, const QuantizeOptions& o);
bool flag_given(const MethodFlag& f, const QuantizeOptions& o);

// Every method, in the order --help lists them.
const std::vector<Method>& methods();
const Method& method(Algo a);
const Method* find_method(const std::string& name);  // null: no such method
// "name: summary" for every method, one paragraph (the --algo help).
std::string methods_help();
// Names for `nibble methods --json`.
const char* name_of(Quantizer q);
const char* name_of(ZeroPointPolicy z);
// "a, b and c": the names of the methods for which `has` holds (the "(gptq and awq_gptq do)" of a note).
std::string method_names(bool (*has)(const Method&));

}  // namespace nibble
