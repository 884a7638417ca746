// The files of `nibble forward`: feeds read from a folder (index.json naming raw little-endian arrays) and
// captured values written to one, so a test or a user can hold the layer engine's activations beside
// ONNX Runtime's.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "forward/value.h"

namespace nibble::forward {

// DIR/index.json: [{"name": ..., "dtype": "int64"|"int32"|"float32"|"float16", "shape": [...],
// "file": "relative.bin"}, ...]. Throws Error naming the file or entry that is wrong.
std::map<std::string, Value> read_feeds(const std::string& dir);

// Writes each value as DIR/v<i>.bin (floats as float32, integers as int64) and DIR/index.json in the same
// layout as read_feeds, plus "extra" (timings) at the top level.
void write_values(const std::string& dir, const std::map<std::string, Value>& values, const nlohmann::json& extra);

}  // namespace nibble::forward
