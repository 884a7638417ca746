#include "loaders/json_file.h"

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "loaders/error.h"

namespace nibble {

namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " tag, which says nothing to a user.
std::string parser_reason(const nlohmann::json::exception& e) {
  const std::string s = e.what();
  const size_t close = s.find("] ");
  return s.rfind('[', 0) == 0 && close != std::string::npos ? s.substr(close + 2) : s;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  // An ifstream opens a folder and then reads nothing: say what it is instead of "unexpected end".
  if (std::filesystem::is_directory(path, ec)) throw Error("cannot read " + path + ": it is a folder");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path + ": " + errno_text(errno));
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not valid JSON: " + parser_reason(e));
  }
}

}  // namespace nibble
