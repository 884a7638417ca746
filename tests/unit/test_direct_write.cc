// The data file written with O_DIRECT through the staging buffer holds exactly the bytes the buffered
// writer wrote: every tensor at the offset its external_data records, zeros between, nothing after,
// through flushes in the middle and a resume at an offset inside a block.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loaders/model_writer.h"

namespace fs = std::filesystem;
using namespace nibble;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;

class DirectWriteTest : public ::testing::Test {
 protected:
  // Under the build folder: a disk, where /tmp may be a tmpfs.
  void SetUp() override {
    dir_ = fs::path(NIBBLE_TEST_SCRATCH) / ("nibble_direct_" + std::to_string(::getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Whether this folder's file system opens files with O_DIRECT: then the writer must use it.
  bool accepts_direct() const {
    const std::string p = (dir_ / "probe").string();
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
    ::unlink(p.c_str());
    return fd >= 0;
  }

  fs::path dir_;
};

// n bytes that differ from tensor to tensor and along each one, so a byte at a wrong offset shows.
std::vector<uint8_t> pattern(uint64_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = uint8_t(x >> 24);
  }
  return v;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

uint64_t offset_of(const onnx::TensorProto& t) { return std::stoull(t.external_data(1).value()); }

// The file the tensors describe: each one's bytes at its offset, zeros elsewhere.
std::vector<uint8_t> layout(uint64_t size, const std::vector<onnx::TensorProto>& ts,
                            const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<uint8_t> file(size, 0);
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].data_location() == onnx::TensorProto::EXTERNAL)
      std::copy(bytes[i].begin(), bytes[i].end(), file.begin() + ptrdiff_t(offset_of(ts[i])));
  return file;
}

onnx::ModelProto empty_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  return m;
}

TEST_F(DirectWriteTest, AwkwardSizesLandAtTheirOffsets) {
  const std::vector<uint64_t> sizes = {5000, 3, 9 * kMiB + 17, 4096, kMiB - 1};
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < sizes.size(); ++i) bytes.push_back(pattern(sizes[i], uint32_t(i)));
  ModelWriter w((dir_ / "out.onnx").string(), {});
  EXPECT_EQ(w.direct(), accepts_direct());
  std::vector<onnx::TensorProto> ts(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) w.put(ts[i], bytes[i].data(), bytes[i].size());
  EXPECT_EQ(w.direct(), accepts_direct());  // no fall back to buffered writes on the way
  EXPECT_EQ(ts[1].raw_data().size(), 3u);
  EXPECT_EQ(offset_of(ts[0]), 0u);
  EXPECT_EQ(offset_of(ts[2]), 8192u);
  EXPECT_EQ(offset_of(ts[3]), 9449472u);
  EXPECT_EQ(offset_of(ts[4]), 9453568u);
  EXPECT_EQ(w.data_bytes(), 10502143u);
  w.commit(empty_model());
  const std::vector<uint8_t> got = read_all(w.data_path());
  ASSERT_EQ(got.size(), 10502143u);  // the last block's padding cut
  EXPECT_TRUE(got == layout(w.data_bytes(), ts, bytes));
}

TEST_F(DirectWriteTest, FlushPutsEveryByteInTheFileAndAppendsGoOn) {
  const std::vector<uint64_t> sizes = {5000, 3000, 9 * kMiB + 17};
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < sizes.size(); ++i) bytes.push_back(pattern(sizes[i], uint32_t(10 + i)));
  ModelWriter w((dir_ / "out.onnx").string(), {});
  EXPECT_EQ(w.direct(), accepts_direct());
  std::vector<onnx::TensorProto> ts(sizes.size());
  w.put(ts[0], bytes[0].data(), bytes[0].size());
  w.flush();
  std::vector<uint8_t> got = read_all(w.data_path());
  ASSERT_EQ(got.size(), w.direct() ? 8192u : 5000u);  // direct: whole blocks, zero padded
  EXPECT_TRUE(std::equal(bytes[0].begin(), bytes[0].end(), got.begin()));
  EXPECT_TRUE(std::all_of(got.begin() + 5000, got.end(), [](uint8_t b) { return b == 0; }));
  w.put(ts[1], bytes[1].data(), bytes[1].size());
  EXPECT_EQ(offset_of(ts[1]), 5056u);
  w.flush();
  w.flush();  // twice: the same bytes
  got = read_all(w.data_path());
  ASSERT_GE(got.size(), 8056u);
  const std::vector<uint8_t> two = layout(8056, {ts[0], ts[1]}, {bytes[0], bytes[1]});
  EXPECT_TRUE(std::equal(two.begin(), two.end(), got.begin()));
  w.put(ts[2], bytes[2].data(), bytes[2].size());
  EXPECT_EQ(w.direct(), accepts_direct());
  w.commit(empty_model());
  got = read_all(w.data_path());
  ASSERT_EQ(got.size(), 8192u + 9 * kMiB + 17);
  EXPECT_TRUE(got == layout(w.data_bytes(), ts, bytes));
}

// A stopped run flushed at its checkpoint (9440248 bytes: 3064 into a block) and wrote more; the
// resumed one reads the partial block back and goes on from the checkpoint, as one run would have.
TEST_F(DirectWriteTest, ResumeInsideABlockContinuesTheFile) {
  const std::string data = (dir_ / "state.data").string();
  const std::vector<uint64_t> sizes = {9 * kMiB + 17, 3000, kMiB - 1};
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < sizes.size(); ++i) bytes.push_back(pattern(sizes[i], uint32_t(20 + i)));
  uint64_t checkpoint = 0;
  {
    ModelWriter::Options o;
    o.resumable_data = data;
    ModelWriter w((dir_ / "out.onnx").string(), o);
    onnx::TensorProto t0, t1, junk;
    w.put(t0, bytes[0].data(), bytes[0].size());
    w.put(t1, bytes[1].data(), bytes[1].size());
    w.flush();
    checkpoint = w.data_bytes();
    const std::vector<uint8_t> after = pattern(6000, 99);
    w.put(junk, after.data(), after.size());  // past the checkpoint: dropped on resume
    w.flush();
  }  // stopped: no commit
  ASSERT_EQ(checkpoint, 9440248u);
  ASSERT_GT(fs::file_size(data), checkpoint);
  ModelWriter::Options o;
  o.resumable_data = data;
  o.resume_bytes = checkpoint;
  ModelWriter w((dir_ / "out.onnx").string(), o);
  EXPECT_EQ(w.direct(), accepts_direct());
  std::vector<onnx::TensorProto> ts(sizes.size());
  w.begin_replay({});
  for (size_t i = 0; i < 2; ++i) w.put(ts[i], bytes[i].data(), bytes[i].size());  // laid out, not written
  w.end_replay();
  w.put(ts[2], bytes[2].data(), bytes[2].size());
  EXPECT_EQ(offset_of(ts[2]), 9441280u);
  EXPECT_EQ(w.direct(), accepts_direct());
  w.commit(empty_model());
  const std::vector<uint8_t> got = read_all(w.data_path());
  ASSERT_EQ(got.size(), 9441280u + kMiB - 1);
  EXPECT_TRUE(got == layout(w.data_bytes(), ts, bytes));
  // Named after all of its bytes, as an uninterrupted writer names them.
  ModelWriter::Options force;
  force.force = true;
  ModelWriter once((dir_ / "once.onnx").string(), force);
  std::vector<onnx::TensorProto> us(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) once.put(us[i], bytes[i].data(), bytes[i].size());
  once.commit(empty_model());
  EXPECT_EQ(fs::path(once.data_path()).filename().string().substr(4),
            fs::path(w.data_path()).filename().string().substr(3));
}

}  // namespace
