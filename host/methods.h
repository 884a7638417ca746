// The method registry: one record per quantization algorithm (--algo), so that what a method is called,
// what it measures on calibration data, whether --awq_mode modelopt can run it and which output it writes
// by default are answered in one table (methods.cc), read by the CLI, the stages, `nibble methods` and,
// through `nibble methods --json`, the Python API.
#pragma once
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

struct Method {
  const char* name;  // the --algo name
  Algo algo;
  Measures measures;
  // Why --awq_mode modelopt refuses it (one line, after "--algo NAME --awq_mode modelopt: "); null when
  // ModelOpt's arithmetic for it is reproduced.
  const char* modelopt_refusal;
  Format default_format;  // without --format
  const char* summary;    // one sentence for --help and `nibble methods`
  bool calibrates() const { return measures.any(); }
};

// Every method, in the order --help lists them.
const std::vector<Method>& methods();
const Method& method(Algo a);
const Method* find_method(const std::string& name);  // null: no such method
// "name: summary" for every method, one paragraph (the --algo help).
std::string methods_help();

}  // namespace nibble
