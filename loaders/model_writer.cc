#include "loaders/model_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <filesystem>

#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

const char kTmpTag[] = ".nibble-tmp-";

std::string canonical_or_same(const std::string& p) {
  std::error_code ec;
  auto c = fs::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

}  // namespace

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto pos = name.rfind(kTmpTag);
    if (name.empty() || name[0] != '.' || pos == std::string::npos) continue;
    const std::string pid_str = name.substr(pos + sizeof(kTmpTag) - 1);
    char* end = nullptr;
    const long pid = std::strtol(pid_str.c_str(), &end, 10);
    if (end == pid_str.c_str() || *end != '\0' || pid <= 0) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno == EPERM) continue;  // that run is still alive
    // A run killed between its two renames (data into place, then the graph) left its graph
    // temporary, no data temporary, and its data file under the final name with no graph beside it:
    // that data file is the dead run's own, and goes with it.
    const std::string final_name = name.substr(1, pos - 1);
    const fs::path d = fs::path(dir);
    if (!fs::exists(d / ("." + final_name + ".data" + kTmpTag + pid_str), ec) &&
        !fs::exists(d / final_name, ec) && fs::exists(d / (final_name + ".data"), ec))
      fs::remove(d / (final_name + ".data"), ec);
    fs::remove(e.path(), ec);
  }
}

ModelWriter::ModelWriter(const std::string& out_path, const Options& options) {
  if (out_path.empty()) throw Error("--output_path is empty");
  fs::path out = fs::absolute(out_path);
  if (out.filename().empty()) throw Error("--output_path " + out_path + " names a folder, not a file");
  out_path_ = out.string();
  data_location_ = out.filename().string() + ".data";
  data_path_ = (out.parent_path() / data_location_).string();

  const std::string out_c = canonical_or_same(out_path_), data_c = canonical_or_same(data_path_);
  for (const auto& p : options.protected_paths) {
    if (p == out_c) throw Error("output " + out_path_ + " is the input model itself: refusing to overwrite it");
    if (p == data_c)
      throw Error("output data file " + data_path_ + " is an input data file: refusing to overwrite it");
  }
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw Error("--output_path " + out_path_ + " is a folder");
  // First what killed runs left, which may include a data file under the final name (see above).
  if (fs::is_directory(out.parent_path(), ec)) remove_stale_temporaries(out.parent_path().string());
  if (!options.force) {
    if (fs::exists(out, ec)) throw Error("output " + out_path_ + " exists (use --force to overwrite)");
    if (fs::exists(data_path_, ec))
      throw Error("output data file " + data_path_ + " exists (use --force to overwrite)");
  }

  // Create the missing part of the output folder, remembering it so a failure removes it again.
  fs::path dir = out.parent_path();
  std::vector<fs::path> missing;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (!fs::create_directory(*it, ec) && ec)
      throw Error("cannot create output folder " + it->string() + ": " + ec.message());
    created_dirs_.push_back(it->string());
  }
  if (!fs::is_directory(dir, ec)) {
    cleanup();
    throw Error("output folder " + dir.string() + " is not a folder");
  }
  remove_stale_temporaries(dir.string());

  const std::string tag = kTmpTag + std::to_string(::getpid());
  tmp_graph_ = (dir / ("." + out.filename().string() + tag)).string();
  tmp_data_ = (dir / ("." + data_location_ + tag)).string();
  resumable_ = !options.resumable_data.empty();
  if (resumable_) {
    tmp_data_ = options.resumable_data;
    resume_bytes_ = options.resume_bytes;
  }
  data_fd_ = ::open(tmp_data_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (resume_bytes_ ? 0 : O_TRUNC), 0644);
  if (data_fd_ < 0) {
    const int e = errno;
    cleanup();
    throw Error("cannot write in output folder " + dir.string() + ": " + errno_text(e));
  }
  if (resume_bytes_) {  // what the stopped run wrote after its last finished layer is dropped
    struct stat st {};
    if (::fstat(data_fd_, &st) != 0 || uint64_t(st.st_size) < resume_bytes_ || ::ftruncate(data_fd_, off_t(resume_bytes_)) != 0 ||
        ::lseek(data_fd_, 0, SEEK_END) < 0) {
      cleanup();
      throw Error("cannot resume: " + options.resumable_data + " is shorter than its checkpoint says");
    }
  }
}

void ModelWriter::begin_replay(std::vector<std::string> inline_log) {
  replaying_ = true;
  replay_log_ = std::move(inline_log);
  replay_next_ = 0;
}

void ModelWriter::end_replay() {
  replaying_ = false;
  if (data_size_ != resume_bytes_ || replay_next_ != replay_log_.size())
    throw Error("cannot resume: the finished layers lay out differently than in the stopped run (other flags?)");
  replay_log_.clear();
}

ModelWriter::~ModelWriter() {
  if (!committed_) cleanup();
}

void ModelWriter::cleanup() noexcept {
  if (data_fd_ >= 0) ::close(data_fd_);
  data_fd_ = -1;
  if (!tmp_data_.empty() && !resumable_) ::unlink(tmp_data_.c_str());
  if (!tmp_graph_.empty()) ::unlink(tmp_graph_.c_str());
  std::error_code ec;
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) fs::remove(*it, ec);
  created_dirs_.clear();
}

void ModelWriter::write_all(int fd, const void* data, uint64_t n, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, size_t(std::min<uint64_t>(n, 1u << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("writing " + what + ": " + errno_text(errno));
    }
    p += w;
    n -= uint64_t(w);
  }
}

namespace {
void clear_data(onnx::TensorProto& t) {
  t.clear_raw_data();
  t.clear_external_data();
  t.clear_float_data();
  t.clear_int32_data();
  t.clear_int64_data();
  t.clear_double_data();
  t.clear_uint64_data();
  t.clear_data_location();
}
}  // namespace

uint64_t ModelWriter::align_for(uint64_t n) {
  // Large tensors start on a page boundary so ONNX Runtime can map them.
  const uint64_t align = alignment(n);
  const uint64_t pad = (align - data_size_ % align) % align;
  if (pad) {
    static const uint8_t zeros[4096] = {};
    write_all(data_fd_, zeros, pad, data_path_);
    data_size_ += pad;
  }
  return data_size_;
}

void ModelWriter::set_external(onnx::TensorProto& t, uint64_t offset, uint64_t n) {
  clear_data(t);
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* e = t.add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", data_location_);
  add("offset", std::to_string(offset));
  add("length", std::to_string(n));
  data_size_ = offset + n;
}

void ModelWriter::put(onnx::TensorProto& t, const void* data, uint64_t n) {
  // `data` may point into t itself (raw_data, float_data): use it before clearing any field.
  if (n < kInlineThreshold) {
    std::string bytes(static_cast<const char*>(data), size_t(n));
    if (replaying_) {
      if (replay_next_ >= replay_log_.size() || replay_log_[replay_next_].size() != n)
        throw Error("cannot resume: the finished layers lay out differently than in the stopped run (other flags?)");
      bytes = replay_log_[replay_next_++];
    }
    clear_data(t);
    inline_log_.push_back(bytes);
    t.set_raw_data(std::move(bytes));
    return;
  }
  if (replaying_) {  // the bytes are already in the file: lay the tensor out as the stopped run did
    const uint64_t align = alignment(n);
    set_external(t, data_size_ + (align - data_size_ % align) % align, n);
    return;
  }
  const uint64_t offset = align_for(n);
  write_all(data_fd_, data, n, data_path_);
  set_external(t, offset, n);
}

void ModelWriter::put_from_file(onnx::TensorProto& t, const std::string& src_path, uint64_t offset, uint64_t n) {
  const int src = ::open(src_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src < 0) throw Error("cannot open " + src_path + ": " + errno_text(errno));
  const uint64_t dst_offset = align_for(n);
  loff_t in = loff_t(offset), out = loff_t(dst_offset);
  uint64_t left = n;
  std::vector<uint8_t> buffer;
  while (left > 0) {
    ssize_t c = ::copy_file_range(src, &in, data_fd_, &out, size_t(std::min<uint64_t>(left, 1u << 30)), 0);
    if (c < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
      // Filesystems without in-kernel copy: plain reads and writes.
      buffer.resize(1 << 22);
      c = ::pread(src, buffer.data(), size_t(std::min<uint64_t>(left, buffer.size())), in);
      if (c > 0) {
        if (::lseek(data_fd_, out, SEEK_SET) < 0) c = -1;
        else write_all(data_fd_, buffer.data(), uint64_t(c), data_path_);
        in += c;
        out += c;
      }
    }
    if (c < 0 && errno == EINTR) continue;
    if (c <= 0) {
      const int e = c < 0 ? errno : EIO;
      ::close(src);
      throw Error("copying tensor '" + t.name() + "' to " + data_path_ + ": " + errno_text(e));
    }
    left -= uint64_t(c);
  }
  ::close(src);
  if (::lseek(data_fd_, out, SEEK_SET) < 0) throw Error("seeking in " + data_path_ + ": " + errno_text(errno));
  set_external(t, dst_offset, n);
}

void ModelWriter::commit(const onnx::ModelProto& model) {
  const size_t size = model.ByteSizeLong();
  if (size > size_t(INT_MAX))
    throw Error("the output graph would be " + std::to_string(size >> 20) +
                " MiB, over protobuf's 2 GiB limit");
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw Error("cannot serialize the output graph");
  const int fd = ::open(tmp_graph_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp_graph_ + ": " + errno_text(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), out_path_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error("writing " + out_path_ + ": " + errno_text(errno));
  if (::close(data_fd_) != 0) {
    data_fd_ = -1;
    throw Error("writing " + data_path_ + ": " + errno_text(errno));
  }
  data_fd_ = -1;
  // Data first: a graph in place always has its data beside it.
  if (::rename(tmp_data_.c_str(), data_path_.c_str()) != 0)
    throw Error("cannot rename into " + data_path_ + ": " + errno_text(errno));
  if (::rename(tmp_graph_.c_str(), out_path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(data_path_.c_str());
    throw Error("cannot rename into " + out_path_ + ": " + errno_text(e));
  }
  committed_ = true;
}

}  // namespace nibble
