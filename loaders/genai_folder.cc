#include "loaders/genai_folder.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "loaders/durable.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

const std::set<std::string> kCompanions = {
    "genai_config.json",   "tokenizer.json",       "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",   "vocab.json",           "merges.txt",            "tokenizer.model",
    "config.json",         "generation_config.json", "chat_template.jinja", "sentencepiece.bpe.model"};

}  // namespace

std::vector<std::string> genai_companion_files(const std::string& model_path) {
  const fs::path dir = fs::path(model_path).parent_path();
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::exists(dir / "genai_config.json", ec)) return out;  // not a GenAI folder
  for (const auto& name : kCompanions)
    if (fs::is_regular_file(dir / name, ec)) out.push_back(name);
  return out;
}

std::vector<std::string> copy_genai_companions(const std::string& in_model, const std::string& out_model,
                                               bool force) {
  std::error_code ec;
  const fs::path in_dir = fs::weakly_canonical(fs::path(in_model).parent_path(), ec);
  const fs::path out_dir = fs::weakly_canonical(fs::absolute(out_model).parent_path(), ec);
  if (in_dir == out_dir) return {};
  const std::string in_name = fs::path(in_model).filename().string();
  const std::string out_name = fs::path(out_model).filename().string();
  std::vector<std::string> copied;
  for (const auto& name : genai_companion_files(in_model)) {
    const fs::path src = in_dir / name, dst = out_dir / name;
    if (fs::exists(dst, ec) && !force)
      throw Error("output folder already has " + dst.string() + " (use --force to overwrite)");
    if (name == "genai_config.json") {
      nlohmann::json cfg = read_json_file(src.string());
      auto* dec = cfg.contains("model") && cfg["model"].contains("decoder") ? &cfg["model"]["decoder"] : nullptr;
      if (dec && dec->contains("filename") && (*dec)["filename"] == in_name) (*dec)["filename"] = out_name;
      write_file_durably(dst.string(), cfg.dump(4) + "\n");
    } else {
      // Copied under a temporary name too: a killed run leaves the old companion or the new one.
      write_durably(dst.string(), [&](const std::string& tmp) {
        fs::copy_file(src, tmp, fs::copy_options::overwrite_existing);
      });
    }
    copied.push_back(name);  // each survives a power cut as the model does
  }
  return copied;
}

}  // namespace nibble
