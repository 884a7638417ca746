#include "loaders/weight_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "loaders/error.h"

namespace nibble {

// Buffers handed out for one weight each and taken back when its view goes: a pass allocates as many as
// are in flight at once (the weight being read, the one being quantized, the one being written), each
// grown to the largest weight it held, and no page of them is faulted in twice.
struct WeightStream::Pool {
  struct Block {
    uint8_t* p;
    size_t bytes;
  };
  std::mutex mutex;
  std::vector<Block> free;

  ~Pool() {
    for (const Block& b : free) std::free(b.p);
  }

  static std::shared_ptr<const uint8_t> get(const std::shared_ptr<Pool>& pool, size_t want) {
    Block b{nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(pool->mutex);
      // The largest free block: one too small for this weight is replaced by one that is not.
      auto best = pool->free.end();
      for (auto it = pool->free.begin(); it != pool->free.end(); ++it)
        if (best == pool->free.end() || it->bytes > best->bytes) best = it;
      if (best != pool->free.end()) {
        b = *best;
        pool->free.erase(best);
      }
    }
    if (b.bytes < want) {
      std::free(b.p);
      b = allocate(want);
    }
    return std::shared_ptr<const uint8_t>(b.p, [pool, b](const uint8_t*) {
      std::lock_guard<std::mutex> lock(pool->mutex);
      pool->free.push_back(b);
    });
  }

 private:
  static Block allocate(size_t want) {
    constexpr size_t kAlign = size_t(2) << 20;  // a huge page, where the kernel gives them
    const size_t bytes = std::max<size_t>((want + kAlign - 1) / kAlign * kAlign, kAlign);
    void* p = std::aligned_alloc(kAlign, bytes);
    if (!p) throw Error("cannot allocate a read buffer of " + std::to_string(bytes) + " bytes");
    ::madvise(p, bytes, MADV_HUGEPAGE);  // fewer faults and TLB misses on first use; a hint only
    return Block{static_cast<uint8_t*>(p), bytes};
  }
};

struct WeightStream::File {
  std::string path;
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

WeightStream::WeightStream(OnnxModel& model, std::vector<std::string> names, std::vector<bool> read, int threads,
                           Reading how)
    : model_(model), names_(std::move(names)), read_(std::move(read)), threads_(std::max(threads, 1)), how_(how),
      pool_(std::make_shared<Pool>()) {
  read_.resize(names_.size(), false);
  stats_.threads = how == Reading::kCopy ? threads_ : 1;
  stats_.mapped = how == Reading::kMapAhead;
}

WeightStream::~WeightStream() {
  if (ahead_.valid()) ahead_.wait();
}

// The file a view's bytes are in, opened once.
int WeightStream::file_of(const TensorView& v, const std::string& path) {
  for (const auto& f : files_)
    if (f->path == path) return f->fd;
  files_.push_back(std::make_unique<File>());
  File& file = *files_.back();
  file.path = path;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // as the map's open: no FIFO waits
  if (file.fd < 0) throw Error("tensor '" + v.name + "': cannot open " + path + ": " + errno_text(errno));
  return file.fd;
}

void WeightStream::count(const TensorView& v, double seconds) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.bytes += v.nbytes;
  stats_.tensors += 1;
  stats_.seconds += seconds;
}

// Weight i's view, checked on the calling thread (the graph is read from one thread only), and the read of
// its bytes (or the mapping of its pages) on a thread of its own.
void WeightStream::start(size_t i) {
  ahead_index_ = i;
  TensorView v = model_.view(*model_.initializer(names_[i]));
  const bool copied = v.aligned_copy != nullptr;  // a misaligned offset: the view is already a copy
  if (!read_[i] || !v.external || v.nbytes == 0 || (copied && how_ == Reading::kMapAhead)) {
    std::promise<TensorView> done;
    done.set_value(std::move(v));
    ahead_ = done.get_future();
    return;
  }
  const std::string path = model_.external_path(v);
  const int fd = file_of(v, path);
  ahead_ = how_ == Reading::kCopy ? copy_ahead(std::move(v), fd, path) : map_ahead(std::move(v), fd, path);
}

std::future<TensorView> WeightStream::copy_ahead(TensorView v, int fd, const std::string& path) {
  std::shared_ptr<const uint8_t> buffer = Pool::get(pool_, size_t(v.nbytes));
  return std::async(std::launch::async, [this, v = std::move(v), buffer, fd, path]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_pread(fd, v.ref.offset, v.nbytes, const_cast<uint8_t*>(buffer.get()), threads_, v.name, path);
    count(v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    v.data = buffer.get();
    v.aligned_copy.reset();  // the buffer is aligned: a misaligned offset's copy is not needed
    v.buffer = std::move(buffer);
    return std::move(v);
  });
}

// The view's whole pages mapped ahead. MADV_POPULATE_READ fails with EFAULT where a read would raise
// SIGBUS (the file shrank after the model was checked): one error line instead. Without it (EINVAL: an
// older kernel) the stream copies from then on.
std::future<TensorView> WeightStream::map_ahead(TensorView v, int fd, const std::string& path) {
  return std::async(std::launch::async, [this, v = std::move(v), fd, path]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = reinterpret_cast<uintptr_t>(v.data) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(v.data) + v.nbytes + page - 1) / page * page;
    constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14), which older headers lack
    if (::madvise(reinterpret_cast<void*>(b), e - b, kPopulateRead) != 0) {
      const int err = errno;
      if (err == EFAULT) {
        struct stat st {};
        ::fstat(fd, &st);
        throw Error("tensor '" + v.name + "': " + path + " ends before offset " + std::to_string(st.st_size) +
                    " (the file was truncated while nibble read it)");
      }
      how_ = Reading::kCopy;  // the next weights are copied; this one's pages fault in as it is read
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.mapped = false, stats_.threads = threads_;
    }
    count(v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return std::move(v);
  });
}

TensorView WeightStream::take(size_t i) {
  if (!ahead_.valid() || ahead_index_ != i) {
    if (ahead_.valid()) ahead_.wait();  // out of order: the read in flight is dropped, its buffer returned
    ahead_ = {};
    start(i);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::future<TensorView> f = std::move(ahead_);
  TensorView v = f.get();  // rethrows a failed read
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (i + 1 < names_.size()) start(i + 1);
  return v;
}

ReadStats WeightStream::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

}  // namespace nibble
