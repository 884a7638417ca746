// Streams a quantized model to disk: tensors are appended to one external data file as they
// are produced, the graph is written last. Everything goes to hidden temporary names in the
// output folder and is renamed into place by commit(); a writer destroyed without commit()
// (any error, any exception) removes what it wrote, so a failed run leaves no half model.
// The data file is named after its content (output_files.h), so an overwrite has one commit point,
// the graph's rename: a run killed at any moment leaves the old graph and data or the new ones.
// The data file is written with O_DIRECT through an aligned staging buffer where the file system
// allows it: a buffered write costs a page-cache copy of every byte, seconds of CPU per GB taken
// from the quantization. Where O_DIRECT is refused (at open, or EINVAL at a write) it is written
// buffered, the same bytes. A full staging buffer is written on a thread of its own while the next one
// fills (one write in flight): the disk's time (~0.5 s per GB here) then overlaps the packing and hashing.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "loaders/content_hash.h"
#include "loaders/output_files.h"

namespace nibble {

class ModelWriter {
 public:
  struct Options {
    bool force = false;                         // overwrite an existing output
    std::vector<std::string> protected_paths;   // input files that must never be written
    // Resumable runs: the data file is this path (kept when the writer is destroyed without commit,
    // renamed into place by commit), opened at `resume_bytes` (0: a fresh file).
    std::string resumable_data;
    uint64_t resume_bytes = 0;
  };

  // Checks the output path (refuses an existing output without force, or any input file),
  // creates a missing output folder and opens the temporary data file. Throws Error.
  ModelWriter(const std::string& out_path, const Options& options);
  ~ModelWriter();
  ModelWriter(const ModelWriter&) = delete;
  ModelWriter& operator=(const ModelWriter&) = delete;

  // Stores `n` bytes as the data of tensor `t`: inline raw_data below the size threshold,
  // otherwise appended to the external data file (t gets location/offset/length).
  void put(onnx::TensorProto& t, const void* data, uint64_t n);

  // As put(), with the bytes read from [offset, offset + n) of the file `src_path` through a small
  // buffer (no pages of the source mapped into this process; every byte goes through the content hash).
  void put_from_file(onnx::TensorProto& t, const std::string& src_path, uint64_t offset, uint64_t n);

  // Names the data file, writes the graph (its tensors' locations set to that name), renames both into
  // place, the graph last, and removes the data files of the output it replaced.
  void commit(const onnx::ModelProto& model);

  // Replay (resuming a run): until end_replay(), put() writes nothing and only lays tensors out as the
  // stopped run did, inline ones taking their bytes from `inline_log` (what inline_log() recorded).
  void begin_replay(std::vector<std::string> inline_log);
  void end_replay();  // throws Error unless the replay reached the resumed size with the whole log used
  // Every inline tensor's bytes so far, in order (what a resumed run replays).
  const std::vector<std::string>& inline_log() const { return inline_log_; }

  const std::string& out_path() const { return out_path_; }
  // The data file: its temporary until commit(), then its final name ("" if no tensor went there).
  const std::string& data_path() const { return data_path_; }
  uint64_t data_bytes() const { return data_size_; }
  // Whether the data file is written with O_DIRECT (else buffered).
  bool direct() const { return direct_fd_ >= 0; }
  // Puts every byte appended so far into the file (staged ones are written, the last partial block
  // padded with zeros: the file may run past data_bytes() until commit). Called before a checkpoint
  // records data_bytes() as what a resumed run finds in the file. Throws Error.
  void flush();

  // Tensors smaller than this stay inline in the graph (as onnx.save's size_threshold).
  static constexpr uint64_t kInlineThreshold = 1024;
  // Alignment of a tensor of n bytes in the data file (the padding before it is < this).
  static constexpr uint64_t alignment(uint64_t n) { return n >= 4096 ? 4096 : 64; }

 private:
  void check_output(const Options& options);
  void create_folder();
  void open_data(const Options& options);
  void write_all(int fd, const void* data, uint64_t n, const std::string& what);
  // The O_DIRECT path: the staging buffer, its writes and the fall back to buffered writes.
  void open_direct();
  void preload_partial_block();
  void stage(const uint8_t* p, uint64_t n);
  void submit_stage();
  void wait_in_flight();
  bool write_staged(size_t bytes);
  void fall_back_to_buffered();
  // Appends to the data file, hashing what goes in.
  void append(const void* data, uint64_t n);
  // Pads the data file for a tensor of n bytes; returns its offset.
  uint64_t align_for(uint64_t n);
  void set_external(onnx::TensorProto& t, uint64_t offset, uint64_t n);
  void cleanup() noexcept;
  // commit()'s steps (model_commit.cc).
  void finish_data();
  void write_graph(const onnx::ModelProto& model);
  void rename_into_place();
  void remove_old_data() noexcept;

  std::string out_path_, out_dir_, out_name_, data_path_, data_location_;
  std::string tmp_graph_, tmp_data_;
  std::vector<std::string> created_dirs_, protected_;
  ContentHash hash_;
  std::vector<uint8_t> copy_buffer_;
  int data_fd_ = -1;
  // O_DIRECT: a second descriptor of the data file; stage_[0] lies at file offset stage_offset_ (a
  // multiple of kBlock) and its first staged_ bytes are the data from there on (after a flush(), the
  // partial block at its front is in the file too, padded, and is written again when completed).
  static constexpr size_t kBlock = 4096, kStageBytes = size_t(8) << 20;
  int direct_fd_ = -1;
  std::unique_ptr<uint8_t, void (*)(void*)> stage_{nullptr, std::free};  // aligned_alloc'ed
  size_t staged_ = 0;
  uint64_t stage_offset_ = 0;
  // The write in flight: in_flight_bytes_ of spare_ going to in_flight_offset_ (stage_offset_ is past
  // them); its result is the errno of the pwrite that failed, 0 when all went in.
  std::unique_ptr<uint8_t, void (*)(void*)> spare_{nullptr, std::free};
  std::future<int> in_flight_;
  uint64_t in_flight_offset_ = 0;
  size_t in_flight_bytes_ = 0;
  uint64_t data_size_ = 0;
  bool committed_ = false;
  bool resumable_ = false, replaying_ = false;
  uint64_t resume_bytes_ = 0;
  std::vector<std::string> inline_log_, replay_log_;
  size_t replay_next_ = 0;
};

}  // namespace nibble
