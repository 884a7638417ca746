// ModelWriter::commit: the order of the renames is what makes an overwrite atomic.
//
//   1. the data file gets its name, the hash of its content, and is fsynced; the graph, referencing
//      that name, is written to its temporary and fsynced
//   2. the data file is renamed into place: a new name beside the old output, which stays whole
//   3. the graph is renamed over the old one: the commit point
//   4. the data files of the old output are removed
//
// Killed before 3, the folder holds the old graph with its own data (and a stray new data file,
// removed by the next run once no live run writes this output); killed after, the new pair.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <filesystem>

#include "loaders/durable.h"
#include "loaders/error.h"
#include "loaders/kill_point.h"
#include "loaders/model_writer.h"

namespace fs = std::filesystem;

namespace nibble {

void ModelWriter::commit(const onnx::ModelProto& model) {
  finish_data();
  write_graph(model);
  rename_into_place();
  committed_ = true;
  kill_point("graph_renamed");
  sync_folder(out_dir_);
  kill_point("old_data_removal");
  remove_old_data();
  kill_point("old_data_removed");
  sync_folder(out_dir_);
}

void ModelWriter::finish_data() {
  const std::string what = "the data file of " + out_path_;
  flush();
  if (direct()) {  // the last block was written whole: cut its padding
    const int closed = ::close(direct_fd_);
    direct_fd_ = -1;
    if (closed != 0 || ::ftruncate(data_fd_, off_t(data_size_)) != 0)
      throw Error("writing " + what + ": " + errno_text(errno));
  }
  sync_file(data_fd_, what);
  const int rc = ::close(data_fd_);
  data_fd_ = -1;
  if (rc != 0) throw Error("writing " + what + ": " + errno_text(errno));
  if (data_size_ == 0) {  // every tensor inline: no data file
    if (!resumable_) ::unlink(tmp_data_.c_str());
    data_location_.clear();
    return;
  }
  data_location_ = data_file_name(out_name_, hash_.hex());
  data_path_ = (fs::path(out_dir_) / data_location_).string();
  std::error_code ec;
  const std::string c = fs::weakly_canonical(data_path_, ec).string();
  if (std::find(protected_.begin(), protected_.end(), c) != protected_.end())
    throw Error("output data file " + data_path_ + " is an input data file: refusing to overwrite it");
}

void ModelWriter::write_graph(const onnx::ModelProto& model) {
  onnx::ModelProto final_model = model;
  const std::string placeholder = data_file_name(out_name_, std::string(16, '?'));
  for_each_tensor(*final_model.mutable_graph(), [&](onnx::TensorProto& t) {
    for (auto& e : *t.mutable_external_data())
      if (e.key() == "location" && e.value() == placeholder) e.set_value(data_location_);
  });
  const size_t size = final_model.ByteSizeLong();
  if (size > size_t(INT_MAX))
    throw Error("the output graph would be " + std::to_string(size >> 20) + " MiB, over protobuf's 2 GiB limit");
  std::string bytes;
  if (!final_model.SerializeToString(&bytes)) throw Error("cannot serialize the output graph");
  const int fd = ::open(tmp_graph_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp_graph_ + ": " + errno_text(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), out_path_);
    sync_file(fd, out_path_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error("writing " + out_path_ + ": " + errno_text(errno));
}

void ModelWriter::rename_into_place() {
  std::error_code ec;
  // Content-named: a data file already there under this name holds these very bytes (the old output
  // was the same), so it stays if the graph cannot be put in place.
  const bool had_data = !data_location_.empty() && fs::exists(data_path_, ec);
  kill_point("data_complete");
  if (!data_location_.empty()) {
    // Durable before the graph that references it is.
    rename_durably(tmp_data_, data_path_);
    kill_point("data_renamed");
  }
  try {
    rename_over(tmp_graph_, out_path_);
  } catch (...) {
    if (!data_location_.empty() && !had_data) ::unlink(data_path_.c_str());
    throw;
  }
}

// The old output's data files: OUT.<hash>.data names the new graph does not reference, and OUT.data
// of older versions (there only with --force: the writer refuses it otherwise). Input files stay.
void ModelWriter::remove_old_data() noexcept {
  try {
    const fs::path legacy = fs::path(out_dir_) / (out_name_ + ".data");
    std::error_code ec;
    const std::string c = fs::weakly_canonical(legacy, ec).string();
    if (std::find(protected_.begin(), protected_.end(), c) == protected_.end()) fs::remove(legacy, ec);
    std::vector<std::string> keep = protected_;
    if (!data_location_.empty()) keep.push_back(fs::weakly_canonical(data_path_, ec).string());
    remove_stray_data_files(out_dir_, out_name_, keep);
  } catch (...) {
    // Whatever is left is unreferenced: the next run into this folder removes it.
  }
}

}  // namespace nibble
