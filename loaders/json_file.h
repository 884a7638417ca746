// Reading a JSON file, with one error policy for every reader (the state of a stopped run, the
// calibration index and cache, a GenAI configuration): the caller gets the value or one line that names
// the file and what is wrong with it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace nibble {

// The JSON value in `path`. Throws Error naming `path` when it cannot be read (the system's reason) or
// is not JSON (the parser's reason, with the line and column).
nlohmann::json read_json_file(const std::string& path);

}  // namespace nibble
