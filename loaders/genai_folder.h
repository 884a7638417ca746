// ONNX Runtime GenAI model folders: a model.onnx beside genai_config.json and tokenizer files.
// Quantizing one into another folder gives a folder GenAI runs as it is.
#pragma once
#include <string>
#include <vector>

namespace nibble {

// The GenAI/tokenizer files beside `model_path` that belong in the output folder.
std::vector<std::string> genai_companion_files(const std::string& model_path);

// Copies the companion files of `in_model` next to `out_model` (when the folders differ),
// pointing genai_config.json's decoder filename at the output model's name. Returns the names
// copied. Existing files are replaced only with `force`. Throws Error.
std::vector<std::string> copy_genai_companions(const std::string& in_model, const std::string& out_model,
                                               bool force);

}  // namespace nibble
