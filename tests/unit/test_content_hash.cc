// The data file's name is the XXH64 of its content: the reference values (python xxhash 3.x), whatever
// the pieces the bytes come in.
#include <gtest/gtest.h>

#include <string>

#include "loaders/content_hash.h"
#include "loaders/output_files.h"

using namespace nibble;

namespace {
std::string xxh64_hex(const std::string& s, size_t piece) {
  ContentHash h;
  for (size_t i = 0; i < s.size(); i += piece) h.update(s.data() + i, std::min(piece, s.size() - i));
  return h.hex();
}
}  // namespace

TEST(ContentHash, MatchesXxh64InAnyPieces) {
  std::string block;
  for (int i = 0; i < 256; ++i) block += char(i);
  std::string nibble;
  for (int i = 0; i < 11; ++i) nibble += "nibble";
  const std::pair<std::string, std::string> cases[] = {
      {"", "ef46db3751d8e999"},
      {"abc", "44bc2cf5ad770999"},
      {block + block + block + "xyz", "e921a1b45bd779f8"},
      {nibble, "563e6b89e5bb50e0"}};
  for (const auto& [in, want] : cases)
    for (size_t piece : {size_t(1), size_t(7), size_t(32), size_t(33), size_t(1000)})
      EXPECT_EQ(xxh64_hex(in, piece), want) << in.size() << " bytes in pieces of " << piece;
}

TEST(ContentHash, DataFileNames) {
  EXPECT_EQ(data_file_name("model.onnx", "0123456789abcdef"), "model.onnx.0123456789abcdef.data");
  EXPECT_TRUE(is_hashed_data_file("model.onnx", "model.onnx.0123456789abcdef.data"));
  EXPECT_FALSE(is_hashed_data_file("model.onnx", "model.onnx.data"));
  EXPECT_FALSE(is_hashed_data_file("model.onnx", "model.onnx.0123456789ABCDEF.data"));
  EXPECT_FALSE(is_hashed_data_file("model.onnx", "other.onnx.0123456789abcdef.data"));
  EXPECT_FALSE(is_hashed_data_file("model.onnx", "model.onnx.0123456789abcdef.data.part"));
  EXPECT_FALSE(is_hashed_data_file("m.onnx", "model.onnx.0123456789abcdef.data"));
}
