#include "loaders/external_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever (the
  // fstat below then refuses it); it changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + path + ": " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("cannot stat " + path + ": " + errno_text(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + " is not a regular file");
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot map " + path + ": " + errno_text(e));
    }
    ::madvise(p, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(uint64_t offset, uint64_t length) const {
  if (!data_ || length == 0) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (offset + page - 1) / page * page;  // only whole pages of this range
  const uint64_t end = (offset + length) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

std::string ExternalDataMap::resolve(const std::string& tensor, const std::string& location) const {
  if (location.empty()) throw Error("tensor '" + tensor + "': external data has no location");
  if (location.find('\0') != std::string::npos)
    throw Error("tensor '" + tensor + "': external data location '" + location + "' contains a NUL byte");
  const fs::path loc(location);
  if (loc.is_absolute())
    throw Error("tensor '" + tensor + "': external data location '" + location +
                "' is an absolute path (it must be relative to the model folder)");
  for (const auto& part : loc)
    if (part == "..")
      throw Error("tensor '" + tensor + "': external data location '" + location +
                  "' escapes the model folder");
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::path(model_dir_), ec);
  const fs::path full = fs::weakly_canonical(dir / loc, ec);
  if (ec) throw Error("tensor '" + tensor + "': cannot resolve external data '" + location + "'");
  // A symlink inside the folder may still point outside it.
  const auto rel = full.lexically_relative(dir);
  if (rel.empty() || *rel.begin() == "..")
    throw Error("tensor '" + tensor + "': external data location '" + location +
                "' resolves outside the model folder");
  if (!fs::exists(full))
    throw Error("tensor '" + tensor + "': external data file " + full.string() + " is missing");
  return full.string();
}

const uint8_t* ExternalDataMap::view(const std::string& tensor, const std::string& location,
                                     uint64_t offset, uint64_t length) {
  const std::string path = resolve(tensor, location);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(path);
  if (it == files_.end()) {
    std::unique_ptr<MappedFile> f;
    try {
      f = std::make_unique<MappedFile>(path);
    } catch (const Error& e) {
      throw Error("tensor '" + tensor + "': external data: " + e.what());
    }
    it = files_.emplace(path, std::move(f)).first;
  }
  const MappedFile& f = *it->second;
  if (offset > f.size() || length > f.size() - offset)
    throw Error("tensor '" + tensor + "': external data at offset " + std::to_string(offset) + ", length " +
                std::to_string(length) + " is outside " + path + " (" + std::to_string(f.size()) + " bytes)");
  return f.data() + offset;
}

void ExternalDataMap::release(const std::string& location, uint64_t offset, uint64_t length) {
  std::error_code ec;
  const std::string path = fs::weakly_canonical(fs::path(model_dir_) / location, ec).string();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(path);
  if (it != files_.end()) it->second->release(offset, length);
}

std::vector<std::string> ExternalDataMap::mapped_paths() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : files_) out.push_back(kv.first);
  return out;
}

}  // namespace nibble
