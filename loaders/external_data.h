// Read-only memory maps of a model's external data files. A weight is a view into a map:
// nothing is copied and nothing is read until a kernel touches the pages. Every location is
// checked to stay inside the model's folder, every offset/length against the file size.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace nibble {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Tells the kernel the pages of [offset, offset + length) are no longer needed, so a streamed
  // model does not stay resident (page-cache pages of a private read-only map are dropped).
  void release(uint64_t offset, uint64_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

class ExternalDataMap {
 public:
  explicit ExternalDataMap(std::string model_dir) : model_dir_(std::move(model_dir)) {}

  // Pointer to `length` bytes at `offset` of `location` (relative to the model folder).
  // `tensor` names the initializer in error messages.
  const uint8_t* view(const std::string& tensor, const std::string& location, uint64_t offset,
                      uint64_t length);
  void release(const std::string& location, uint64_t offset, uint64_t length);
  // Canonical paths of every file mapped so far (the writer refuses to overwrite them).
  std::vector<std::string> mapped_paths() const;
  // Resolves and checks a location without mapping it; returns the canonical path.
  std::string resolve(const std::string& tensor, const std::string& location) const;

 private:
  std::string model_dir_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<MappedFile>> files_;
};

}  // namespace nibble
