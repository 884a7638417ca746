// Reading weights ahead (loaders/weight_stream, loaders/parallel_read): the bytes a stream hands out are
// the memory map's, byte for byte, whatever the threads, the pieces or the alignment of the offsets; a
// file that shrank under the reader gives one error line naming the tensor and the file.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>

#include "loaders/error.h"
#include "loaders/onnx_model.h"
#include "loaders/parallel_read.h"
#include "loaders/weight_stream.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace nibble;

namespace {

const test::ScratchDir& scratch() {
  static const test::ScratchDir d("nibble_weight_stream");
  return d;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path p = scratch().root() / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A model of MatMuls by fp16 initializers [rows, 64] named w0, w1, ... in one data file `w.data`, at the
// given offsets (not even a multiple of 2 for some: ONNX does not require it).
std::string model_with(const fs::path& dir, const std::vector<uint64_t>& offsets, const std::vector<int64_t>& rows) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->add_input()->set_name("x");
  for (size_t i = 0; i < offsets.size(); ++i) {
    auto* n = g->add_node();  // the loader wants a graph of nodes
    n->set_op_type("MatMul");
    n->add_input("x");
    n->add_input("w" + std::to_string(i));
    n->add_output("y" + std::to_string(i));
    auto* t = g->add_initializer();
    t->set_name("w" + std::to_string(i));
    t->set_data_type(10);
    t->add_dims(rows[i]);
    t->add_dims(64);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [k, v] : {std::pair<std::string, std::string>{"location", "w.data"},
                               {"offset", std::to_string(offsets[i])},
                               {"length", std::to_string(rows[i] * 64 * 2)}}) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
  }
  const std::string p = (dir / "m.onnx").string();
  std::ofstream f(p, std::ios::binary);
  m.SerializeToOstream(&f);
  return p;
}

}  // namespace

// Ranges that start and end inside a piece, on piece boundaries, span one piece or many: the bytes of
// the file, with 1 to 5 threads and 4 KiB pieces.
TEST(ParallelRead, ReadsEveryRangeAsTheFileHoldsIt) {
  const fs::path dir = fresh_dir("ranges");
  const std::vector<uint8_t> file = random_bytes(100000, 1);
  write_file(dir / "f", file);
  const int fd = ::open((dir / "f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct Range {
    uint64_t offset, length;
  };
  for (const Range r : {Range{0, 1}, Range{0, 4096}, Range{1, 4095}, Range{4095, 2}, Range{4096, 8192},
                        Range{17, 99983}, Range{0, 100000}, Range{50000, 0}}) {
    for (int threads : {1, 2, 5}) {
      std::vector<uint8_t> got(r.length + 1, 0xa5);
      parallel_pread(fd, r.offset, r.length, got.data(), threads, "t", "f", 4096);
      ASSERT_EQ(0, std::memcmp(got.data(), file.data() + r.offset, r.length)) << r.offset << "+" << r.length;
      EXPECT_EQ(got[r.length], 0xa5) << "wrote past the range";
    }
  }
  try {
    std::vector<uint8_t> got(5000);
    parallel_pread(fd, 96000, 5000, got.data(), 2, "model.w", "/m/w.data", 4096);
    ADD_FAILURE() << "a range past the end was read";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor 'model.w': /m/w.data ends before offset 100000 (the file was truncated while "
                           "nibble read it)");
  }
  ::close(fd);
}

// Every weight taken in order, each checked to hold the file's bytes at an aligned address.
static std::vector<TensorView> take_all(WeightStream& s, const std::vector<uint8_t>& data,
                                        const std::vector<uint64_t>& offsets, const std::vector<int64_t>& rows) {
  std::vector<TensorView> views;
  for (size_t i = 0; i < rows.size(); ++i) {
    views.push_back(s.take(i));
    const TensorView& v = views.back();
    EXPECT_EQ(v.nbytes, uint64_t(rows[i] * 128)) << i;
    EXPECT_EQ(0, std::memcmp(v.data, data.data() + offsets[i], std::min<uint64_t>(v.nbytes, rows[i] * 128))) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 2, 0u) << i;
  }
  return views;
}

// Takes the weights in `order` until one fails: its one-line error, or "" when none does (a read ahead may
// finish before the file shrinks: a second pass reads again).
static std::string first_error_taking(WeightStream& s, std::initializer_list<size_t> order) {
  for (size_t i : order) {
    try {
      s.take(i);
    } catch (const Error& e) {
      return e.what();
    }
  }
  return "";
}

static std::string truncated_message(const fs::path& file, uint64_t size) {
  return "tensor 'w1': " + fs::canonical(file).string() + " ends before offset " + std::to_string(size) +
         " (the file was truncated while nibble read it)";
}

// Three weights, one at an offset that is not a multiple of its element size, taken in order: each
// view holds the map's bytes in an aligned buffer, the next one read ahead; the stats count each
// weight once. A weight not to be read is the map's view itself.
TEST(WeightStream, HandsOutTheMapsBytesReadAhead) {
  const fs::path dir = fresh_dir("ahead");
  const std::vector<int64_t> rows = {100, 3, 257};
  const std::vector<uint64_t> offsets = {0, 12801, 13185};  // 100*64*2 = 12800; the second is misaligned
  const std::vector<uint8_t> data = random_bytes(13185 + 257 * 64 * 2, 2);
  write_file(dir / "w.data", data);
  auto model = OnnxModel::load(model_with(dir, offsets, rows));
  WeightStream s(*model, {"w0", "w1", "w2"}, {true, true, false}, 2);
  const std::vector<TensorView> views = take_all(s, data, offsets, rows);
  for (size_t i = 0; i < 3; ++i) {
    const TensorView& v = views[i];
    EXPECT_EQ(v.buffer != nullptr, i < 2) << i;
  }
  const ReadStats st = s.stats();
  EXPECT_EQ(st.bytes, uint64_t((100 + 3) * 128));
  EXPECT_EQ(st.tensors, 2u);
  EXPECT_EQ(st.threads, 2);
  // Out of order (a second pass over the same names): read at once, the same bytes.
  const TensorView again = s.take(0);
  EXPECT_EQ(0, std::memcmp(again.data, data.data(), again.nbytes));
}

// The data file shrinks after the model was checked: the weight being read ahead fails when it is
// taken, with the tensor and the file named; the weight before it was already read whole.
TEST(WeightStream, AFileTruncatedWhileReadingIsOneErrorLine) {
  const fs::path dir = fresh_dir("truncated");
  const std::vector<uint8_t> data = random_bytes(2 * 64 * 128, 3);
  write_file(dir / "w.data", data);
  auto model = OnnxModel::load(model_with(dir, {0, 64 * 128}, {64, 64}));
  WeightStream s(*model, {"w0", "w1"}, {true, true}, 2);
  const TensorView v0 = s.take(0);  // starts reading w1
  EXPECT_EQ(0, std::memcmp(v0.data, data.data(), v0.nbytes));
  ::truncate((dir / "w.data").c_str(), 64 * 128 + 100);
  EXPECT_EQ(first_error_taking(s, {1, 0, 1}), truncated_message(dir / "w.data", 64 * 128 + 100));
}

// The CPU's reading: each view is the memory map's own (no buffer), its pages mapped ahead; a misaligned
// offset's view is the aligned copy the model made; the stats count the weights whose pages were mapped.
TEST(WeightStream, MapAheadHandsOutTheMapsOwnBytes) {
  const fs::path dir = fresh_dir("map_ahead");
  const std::vector<int64_t> rows = {100, 3, 257};
  const std::vector<uint64_t> offsets = {0, 12801, 13186};  // the second misaligned
  const std::vector<uint8_t> data = random_bytes(13186 + 257 * 64 * 2, 4);
  write_file(dir / "w.data", data);
  auto model = OnnxModel::load(model_with(dir, offsets, rows));
  WeightStream s(*model, {"w0", "w1", "w2"}, {true, true, true}, 2, WeightStream::Reading::kMapAhead);
  const std::vector<TensorView> views = take_all(s, data, offsets, rows);
  for (size_t i = 0; i < 3; ++i) {
    const TensorView& v = views[i];
    EXPECT_EQ(v.buffer, nullptr) << i;
    EXPECT_EQ(v.aligned_copy != nullptr, i == 1) << i;
  }
  const ReadStats st = s.stats();
  EXPECT_EQ(st.bytes, uint64_t((100 + 257) * 128));
  EXPECT_EQ(st.tensors, 2u);
  EXPECT_EQ(st.threads, 1);
}

// A file that shrank before its pages were mapped ahead: one error line, as when reading it.
TEST(WeightStream, MapAheadOfATruncatedFileIsOneErrorLine) {
  const fs::path dir = fresh_dir("map_truncated");
  const std::vector<uint8_t> data = random_bytes(2 * 64 * 128 + 8192, 5);
  write_file(dir / "w.data", data);
  auto model = OnnxModel::load(model_with(dir, {0, 64 * 128 + 8192}, {64, 64}));
  WeightStream s(*model, {"w0", "w1"}, {true, true}, 1, WeightStream::Reading::kMapAhead);
  const TensorView v0 = s.take(0);
  EXPECT_EQ(0, std::memcmp(v0.data, data.data(), v0.nbytes));
  ::truncate((dir / "w.data").c_str(), 64 * 128 + 100);
  EXPECT_EQ(first_error_taking(s, {1, 0, 1}), truncated_message(dir / "w.data", 64 * 128 + 100));
}
