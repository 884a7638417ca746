#include "host/eval.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "host/calibration.h"
#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

fs::path exe_dir() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : p.parent_path();
}

}  // namespace

std::string eval_script() {
  if (const char* p = std::getenv("NIBBLE_EVAL_SCRIPT"); p && *p) return p;
  for (const fs::path& root : {exe_dir().parent_path(), fs::path(NIBBLE_SOURCE_DIR)}) {
    const fs::path s = root / "tools" / "eval_model.py";
    if (fs::exists(s)) return s.string();
  }
  throw Error("cannot find tools/eval_model.py (set NIBBLE_EVAL_SCRIPT)");
}

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
