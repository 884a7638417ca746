#include "loaders/model_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

std::string canonical_or_same(const std::string& p) {
  std::error_code ec;
  auto c = fs::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

// pwrite of all n bytes at `offset`: 0, or the errno of the write that failed (EIO for a write of nothing).
int pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t offset) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, off_t(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    done += size_t(w);
  }
  return 0;
}

}  // namespace

ModelWriter::ModelWriter(const std::string& out_path, const Options& options) {
  if (out_path.empty()) throw Error("--output_path is empty");
  fs::path out = fs::absolute(out_path);
  if (out.filename().empty()) throw Error("--output_path " + out_path + " names a folder, not a file");
  out_path_ = out.string();
  out_dir_ = out.parent_path().string();
  out_name_ = out.filename().string();
  // The tensors point at this name until commit() knows the content's hash; as long as the real name,
  // so the graph's size does not change when it is set.
  data_location_ = data_file_name(out_name_, std::string(16, '?'));
  protected_ = options.protected_paths;
  check_output(options);
  create_folder();
  tmp_graph_ = (fs::path(out_dir_) / temporary_name(out_name_)).string();
  tmp_data_ = (fs::path(out_dir_) / temporary_name(out_name_ + ".data")).string();
  open_data(options);
}

void ModelWriter::check_output(const Options& options) {
  if (std::find(protected_.begin(), protected_.end(), canonical_or_same(out_path_)) != protected_.end())
    throw Error("output " + out_path_ + " is the input model itself: refusing to overwrite it");
  std::error_code ec;
  if (fs::is_directory(out_path_, ec)) throw Error("--output_path " + out_path_ + " is a folder");
  // First what killed runs left, which may include a data file no graph references.
  if (fs::is_directory(out_dir_, ec)) {
    remove_stale_temporaries(out_dir_);
    remove_stray_data_files(out_dir_, out_name_, protected_);
  }
  if (options.force) return;
  if (fs::exists(out_path_, ec)) throw Error("output " + out_path_ + " exists (use --force to overwrite)");
  // The data file name of older versions: an overwrite removes it, so it is an output file too.
  const fs::path legacy = fs::path(out_dir_) / (out_name_ + ".data");
  if (fs::exists(legacy, ec))
    throw Error("output data file " + legacy.string() + " exists (use --force to overwrite)");
}

// Creates the missing part of the output folder, remembering it so a failure removes it again.
void ModelWriter::create_folder() {
  std::error_code ec;
  std::vector<fs::path> missing;
  for (fs::path p = out_dir_; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (!fs::create_directory(*it, ec) && ec) {
      cleanup();
      throw Error("cannot create output folder " + it->string() + ": " + ec.message());
    }
    created_dirs_.push_back(it->string());
  }
  if (!fs::is_directory(out_dir_, ec)) {
    cleanup();
    throw Error("output folder " + out_dir_ + " is not a folder");
  }
}

void ModelWriter::open_data(const Options& options) {
  resumable_ = !options.resumable_data.empty();
  if (resumable_) {
    tmp_data_ = options.resumable_data;
    resume_bytes_ = options.resume_bytes;
  }
  data_path_ = tmp_data_;
  data_fd_ = ::open(tmp_data_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (resume_bytes_ ? 0 : O_TRUNC), 0644);
  if (data_fd_ < 0) {
    const int e = errno;
    cleanup();
    throw Error("cannot write in output folder " + out_dir_ + ": " + errno_text(e));
  }
  open_direct();
  if (!resume_bytes_) return;
  // What the stopped run wrote after its last finished layer is dropped; the rest is hashed again, as
  // the name of the data file is the hash of all of it.
  struct stat st {};
  bool ok = ::fstat(data_fd_, &st) == 0 && uint64_t(st.st_size) >= resume_bytes_ &&
            ::ftruncate(data_fd_, off_t(resume_bytes_)) == 0;
  std::vector<uint8_t> buf(size_t(4) << 20);
  for (uint64_t at = 0; ok && at < resume_bytes_;) {
    const ssize_t r = ::pread(data_fd_, buf.data(), size_t(std::min<uint64_t>(buf.size(), resume_bytes_ - at)), off_t(at));
    if (r < 0 && errno == EINTR) continue;
    ok = r > 0;
    if (ok) hash_.update(buf.data(), size_t(r));
    at += ok ? uint64_t(r) : 0;
  }
  if (!ok || ::lseek(data_fd_, 0, SEEK_END) < 0) {
    cleanup();
    throw Error("cannot resume: " + options.resumable_data + " is shorter than its checkpoint says");
  }
  preload_partial_block();
}

// A second descriptor for the writes, data_fd_ kept for the rest (resume, truncate, fsync). A file
// system without O_DIRECT (EINVAL) or no memory for the buffer: buffered writes, as before.
void ModelWriter::open_direct() {
  direct_fd_ = ::open(tmp_data_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (direct_fd_ < 0) return;
  stage_.reset(static_cast<uint8_t*>(std::aligned_alloc(kBlock, kStageBytes)));
  if (!stage_) {
    ::close(direct_fd_);
    direct_fd_ = -1;
  }
  staged_ = 0;
  stage_offset_ = 0;
}

// Resuming with O_DIRECT: the writes start at a block boundary, so the partial block the file ends
// with is read into the buffer and written again with what follows it.
void ModelWriter::preload_partial_block() {
  if (!direct()) return;
  stage_offset_ = resume_bytes_ / kBlock * kBlock;
  staged_ = size_t(resume_bytes_ - stage_offset_);
  for (size_t at = 0; at < staged_;) {
    const ssize_t r = ::pread(data_fd_, stage_.get() + at, staged_ - at, off_t(stage_offset_ + at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = r < 0 ? errno : EIO;
      cleanup();
      throw Error("cannot resume: reading " + tmp_data_ + ": " + errno_text(e));
    }
    at += size_t(r);
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
  if (in_flight_.valid()) in_flight_.wait();  // its descriptor and buffer are about to go
  if (data_fd_ >= 0) ::close(data_fd_);
  data_fd_ = -1;
  if (direct_fd_ >= 0) ::close(direct_fd_);
  direct_fd_ = -1;
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

void ModelWriter::append(const void* data, uint64_t n) {
  if (direct()) stage(static_cast<const uint8_t*>(data), n);
  else write_all(data_fd_, data, n, "the data file of " + out_path_);
  hash_.update(data, size_t(n));
  data_size_ += n;
}

// Copies into the staging buffer, writing it out each time it fills; what is left after a fall back
// to buffered writes goes the buffered way.
void ModelWriter::stage(const uint8_t* p, uint64_t n) {
  while (n > 0 && direct()) {
    const size_t take = size_t(std::min<uint64_t>(n, kStageBytes - staged_));
    std::memcpy(stage_.get() + staged_, p, take);
    staged_ += take;
    p += take;
    n -= take;
    if (staged_ == kStageBytes) submit_stage();
  }
  if (n > 0) write_all(data_fd_, p, n, "the data file of " + out_path_);
}

// The full staging buffer (whole blocks) goes to the file on a thread of its own, once the write before it
// is done; the other buffer takes the next bytes. Without memory for a second buffer: written here.
void ModelWriter::submit_stage() {
  wait_in_flight();
  if (!direct()) return;  // the write in flight fell back to buffered writes, and wrote the stage too
  if (!spare_) spare_.reset(static_cast<uint8_t*>(std::aligned_alloc(kBlock, kStageBytes)));
  if (!spare_) return flush();
  std::swap(stage_, spare_);
  in_flight_offset_ = stage_offset_;
  in_flight_bytes_ = staged_;
  in_flight_ = std::async(std::launch::async, pwrite_all, direct_fd_, spare_.get(), staged_, stage_offset_);
  stage_offset_ += staged_;
  staged_ = 0;
}

// Waits for the write in flight. Where the file system refused O_DIRECT for it (EINVAL), what came before it
// is in the file: it and the staged bytes after it are written buffered from there on.
void ModelWriter::wait_in_flight() {
  if (!in_flight_.valid()) return;
  const int e = in_flight_.get();
  if (e == 0) return;
  const std::string what = "the data file of " + out_path_;
  if (e != EINVAL) throw Error("writing " + what + ": " + errno_text(e));
  ::close(direct_fd_);
  direct_fd_ = -1;
  if (::ftruncate(data_fd_, off_t(in_flight_offset_)) != 0 || ::lseek(data_fd_, off_t(in_flight_offset_), SEEK_SET) < 0)
    throw Error("writing " + what + ": " + errno_text(errno));
  write_all(data_fd_, spare_.get(), in_flight_bytes_, what);
  const size_t n = staged_;
  staged_ = 0;
  write_all(data_fd_, stage_.get(), n, what);
}

void ModelWriter::flush() {
  wait_in_flight();
  if (!direct() || staged_ == 0) return;
  const size_t full = staged_ / kBlock * kBlock;
  const size_t padded = (staged_ + kBlock - 1) / kBlock * kBlock;
  std::memset(stage_.get() + staged_, 0, padded - staged_);
  if (!write_staged(padded)) return;  // fell back: the staged bytes went the buffered way
  // The partial block is written again, completed, by the next write.
  std::memmove(stage_.get(), stage_.get() + full, staged_ - full);
  stage_offset_ += full;
  staged_ -= full;
}

// Writes stage_[0, bytes) at stage_offset_; false if the file system refused O_DIRECT there and the
// writer fell back to buffered writes.
bool ModelWriter::write_staged(size_t bytes) {
  const int e = pwrite_all(direct_fd_, stage_.get(), bytes, stage_offset_);
  if (e == EINVAL) {
    fall_back_to_buffered();
    return false;
  }
  if (e != 0) throw Error("writing the data file of " + out_path_ + ": " + errno_text(e));
  return true;
}

// Everything before stage_offset_ is in the file; the zero padding of an earlier flush past it is cut
// and the staged bytes are written buffered, data_fd_ left at the end for write_all.
void ModelWriter::fall_back_to_buffered() {
  const std::string what = "the data file of " + out_path_;
  ::close(direct_fd_);
  direct_fd_ = -1;
  if (::ftruncate(data_fd_, off_t(stage_offset_)) != 0 || ::lseek(data_fd_, off_t(stage_offset_), SEEK_SET) < 0)
    throw Error("writing " + what + ": " + errno_text(errno));
  const size_t n = staged_;
  staged_ = 0;
  write_all(data_fd_, stage_.get(), n, what);
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
  static const uint8_t zeros[4096] = {};
  if (pad) append(zeros, pad);
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
  append(data, n);
  set_external(t, offset, n);
}

void ModelWriter::put_from_file(onnx::TensorProto& t, const std::string& src_path, uint64_t offset, uint64_t n) {
  // Read through a small buffer (no pages of the source mapped into this process) rather than copied in
  // the kernel: every byte of the data file goes through the content hash.
  const int src = ::open(src_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src < 0) throw Error("cannot open " + src_path + ": " + errno_text(errno));
  const uint64_t dst_offset = align_for(n);
  copy_buffer_.resize(size_t(4) << 20);
  try {
    for (uint64_t done = 0; done < n;) {
      const ssize_t r = ::pread(src, copy_buffer_.data(), size_t(std::min<uint64_t>(n - done, copy_buffer_.size())),
                                off_t(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error("copying tensor '" + t.name() + "' from " + src_path + ": " + errno_text(r < 0 ? errno : EIO));
      append(copy_buffer_.data(), uint64_t(r));
      done += uint64_t(r);
    }
  } catch (...) {
    ::close(src);
    throw;
  }
  ::close(src);
  set_external(t, dst_offset, n);
}

}  // namespace nibble
