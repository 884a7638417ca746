#include "host/run/eval.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "calib/calibration.h"
#include "loaders/error.h"

namespace nibble {

std::string eval_script() { return project_script("NIBBLE_EVAL_SCRIPT", "tools/eval_model.py"); }

int run_eval(const EvalOptions& o) {
  if (o.model.empty()) throw Error("--model is required");
  if (o.windows < 1) throw Error("--windows must be at least 1");
  if (o.seq_len < 2) throw Error("--seq_len must be at least 2 (the first token of a window is not predicted)");
  if (o.threads < 0) throw Error("--threads must be >= 0");
  std::vector<std::string> argv = {python_executable(), eval_script(), o.model,
                                   "--windows", std::to_string(o.windows),
                                   "--seq_len", std::to_string(o.seq_len),
                                   "--accuracy_level", o.accuracy_level,
                                   "--threads", std::to_string(o.threads)};
  for (const auto& [flag, v] : {std::pair{"--reference", &o.reference}, {"--text", &o.text},
                                {"--tokenizer", &o.tokenizer}, {"--json", &o.json}})
    if (!v->empty()) {
      argv.push_back(flag);
      argv.push_back(*v);
    }
  if (o.quiet) argv.push_back("--quiet");
  run_child(argv, "eval: ", o.quiet);
  return 0;
}

}  // namespace nibble
