// A scratch folder of this test process under the system's temporary folder, removed with the object
// (a static one: when the tests end), so runs leave nothing behind.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace nibble::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : root_(std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()))) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

}  // namespace nibble::test
