// write_durably: the whole new file under its name or the old one; a failure leaves no temporary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loaders/durable.h"
#include "loaders/error.h"
#include "scratch_dir.h"

using namespace nibble;
namespace fs = std::filesystem;

namespace {

const test::ScratchDir kScratch("nibble_durable");

fs::path fresh_folder(const std::string& name) {
  const fs::path d = kScratch.root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string text_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t entries(const fs::path& d) { return size_t(std::distance(fs::directory_iterator(d), {})); }

}  // namespace

TEST(Durable, WritesTheBytesAndLeavesNoTemporary) {
  const fs::path d = fresh_folder("write");
  const std::string bytes("a\0b\nc", 5);
  write_file_durably((d / "f.bin").string(), bytes);
  EXPECT_EQ(text_of(d / "f.bin"), bytes);
  EXPECT_EQ(entries(d), 1u);
}

TEST(Durable, ReplacesAnOldFileWhole) {
  const fs::path d = fresh_folder("replace");
  write_file_durably((d / "f.json").string(), std::string("old, and longer than the new one"));
  write_file_durably((d / "f.json").string(), std::string("new"));
  EXPECT_EQ(text_of(d / "f.json"), "new");
  EXPECT_EQ(entries(d), 1u);
}

TEST(Durable, FailedFillLeavesTheOldFileAndNoHalfFile) {
  const fs::path d = fresh_folder("fill_fails");
  write_file_durably((d / "f").string(), std::string("old"));
  try {
    write_durably((d / "f").string(), [](const std::string& tmp) {
      std::ofstream(tmp) << "half of it";
      throw Error("disk full");
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot write " + (d / "f").string() + ": disk full");
  }
  EXPECT_EQ(text_of(d / "f"), "old");
  EXPECT_EQ(entries(d), 1u);
}

TEST(Durable, FailedRenameLeavesNoTemporary) {
  const fs::path d = fresh_folder("rename_fails");
  fs::create_directories(d / "taken" / "inside");  // a non-empty folder cannot be renamed over
  EXPECT_THROW(write_file_durably((d / "taken").string(), std::string("x")), Error);
  EXPECT_TRUE(fs::is_directory(d / "taken" / "inside"));
  EXPECT_EQ(entries(d), 1u);
}

TEST(Durable, MissingFolderIsOneError) {
  const fs::path d = fresh_folder("no_folder");
  const std::string p = (d / "absent" / "f").string();
  try {
    write_file_durably(p, std::string("x"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot write " + p + ": No such file or directory");
  }
  EXPECT_EQ(entries(d), 0u);
}
