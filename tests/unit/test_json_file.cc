// read_json_file: the value, or one line naming the file and what is wrong with it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loaders/error.h"
#include "loaders/json_file.h"
#include "scratch_dir.h"

using namespace nibble;
namespace fs = std::filesystem;

namespace {

const test::ScratchDir kScratch("nibble_json");

fs::path scratch(const std::string& name) {
  fs::create_directories(kScratch.root());
  return kScratch.root() / name;
}

fs::path with_text(const std::string& name, const std::string& text) {
  const fs::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// The message of the Error that reading `p` throws; "" when it throws none.
std::string error_of(const fs::path& p) {
  try {
    read_json_file(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JsonFile, ReadsTheValue) {
  const auto j = read_json_file(with_text("ok.json", R"({"a": [1, 2.5], "b": "x"})").string());
  EXPECT_EQ(j.at("a").at(0).get<int>(), 1);
  EXPECT_EQ(j.at("a").at(1).get<double>(), 2.5);
  EXPECT_EQ(j.at("b").get<std::string>(), "x");
}

TEST(JsonFile, MissingFileNamesItAndTheReason) {
  const fs::path p = scratch("absent.json");
  EXPECT_EQ(error_of(p), "cannot read " + p.string() + ": No such file or directory");
}

TEST(JsonFile, FolderIsSaid) {
  const fs::path p = scratch("a_folder");
  fs::create_directories(p);
  EXPECT_EQ(error_of(p), "cannot read " + p.string() + ": it is a folder");
}

TEST(JsonFile, BadJsonNamesTheFileAndWhereOnOneLine) {
  const fs::path p = with_text("bad.json", "{\"a\": 1,\n \"b\": }\n");
  const std::string m = error_of(p);
  EXPECT_EQ(m.rfind(p.string() + " is not valid JSON: parse error at line 2, column 7", 0), 0u) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
}

TEST(JsonFile, EmptyFileIsNotJson) {
  const fs::path p = with_text("empty.json", "");
  EXPECT_NE(error_of(p).find(p.string() + " is not valid JSON: "), std::string::npos);
}
