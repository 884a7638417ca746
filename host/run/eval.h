// `nibble eval`: perplexity of a model and its KL divergence from a float reference, measured by
// tools/eval_model.py in the project's Python (ONNX Runtime), window by window.
#pragma once
#include <cstdint>
#include <string>

namespace nibble {

struct EvalOptions {
  std::string model;      // the model to measure (quantized, usually)
  std::string reference;  // optional: the float model, for KL(P_ref || P_model) and its own ppl
  std::string text;       // .txt or .jsonl ("text" per line); empty: the corpus eval split (tools/corpus.py)
  std::string tokenizer;  // tokenizer.json or its folder; empty: beside the model
  std::string json;       // write the measurements here as JSON
  int64_t windows = 32;   // windows of seq_len tokens, each one forward pass from an empty KV cache
  int64_t seq_len = 256;
  std::string accuracy_level = "1";  // ORT session.qdq_matmulnbits_accuracy_level ('' = ORT's default)
  int threads = 0;                   // ORT intra-op threads (0: ORT's choice)
  bool quiet = false;                // no progress lines
};

// Runs the evaluation; the summary goes to stdout. Throws Error with the script's one-line message.
int run_eval(const EvalOptions& options);

// $NIBBLE_EVAL_SCRIPT, else tools/eval_model.py next to the build or in the source tree.
std::string eval_script();

}  // namespace nibble
