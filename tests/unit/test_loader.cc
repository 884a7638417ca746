// The loader refuses every malformed model with a clear Error, and the writer leaves nothing
// behind unless it commits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "loaders/error.h"
#include "loaders/model_writer.h"
#include "loaders/onnx_model.h"
#include "loaders/owner.h"

namespace fs = std::filesystem;
using namespace nibble;

namespace {

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nibble_loader_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A one-MatMul model whose weight [4, 2] fp32 lives in `location` at `offset`.
  onnx::ModelProto model(const std::string& location, uint64_t offset, uint64_t length) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto* g = m.mutable_graph();
    g->add_input()->set_name("x");  // every node input must be defined (the loader checks)
    auto* n = g->add_node();
    n->set_op_type("MatMul");
    n->set_name("/model/layers.0/mlp/up_proj/MatMul");
    n->add_input("x");
    n->add_input("w");
    n->add_output("y");
    auto* t = g->add_initializer();
    t->set_name("w");
    t->set_data_type(1);
    t->add_dims(4);
    t->add_dims(2);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", location);
    add("offset", std::to_string(offset));
    add("length", std::to_string(length));
    return m;
  }

  std::string save(const onnx::ModelProto& m, const std::string& name = "m.onnx") {
    const std::string p = (dir_ / name).string();
    std::ofstream f(p, std::ios::binary);
    m.SerializeToOstream(&f);
    return p;
  }

  void write_data(const std::string& name, size_t n) {
    std::ofstream f(dir_ / name, std::ios::binary);
    std::vector<float> v(n / 4);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(n));
  }

  // Loads and views the weight; returns the Error text ("" when fine).
  std::string load_error(const std::string& path) {
    try {
      auto m = OnnxModel::load(path);
      m->view(*m->initializer("w"));
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(LoaderTest, ExternalWeightIsAViewIntoTheMap) {
  write_data("w.bin", 64);
  auto m = OnnxModel::load(save(model("w.bin", 16, 32)));
  TensorView v = m->view(*m->initializer("w"));
  ASSERT_TRUE(v.external);
  EXPECT_EQ(v.nbytes, 32u);
  EXPECT_EQ(v.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(reinterpret_cast<const float*>(v.data)[0], 4.0f);  // offset 16 = element 4
  EXPECT_EQ(v.owned, nullptr);
  EXPECT_EQ(m->input_files().size(), 2u);
}

TEST_F(LoaderTest, RejectsBadExternalData) {
  write_data("w.bin", 64);
  EXPECT_NE(load_error(save(model("w.bin", 48, 32))).find("outside"), std::string::npos);
  EXPECT_NE(load_error(save(model("w.bin", 0, 30))).find("does not match"), std::string::npos);
  EXPECT_NE(load_error(save(model("missing.bin", 0, 32))).find("missing"), std::string::npos);
  EXPECT_NE(load_error(save(model("../w.bin", 0, 32))).find("escapes the model folder"), std::string::npos);
  EXPECT_NE(load_error(save(model("/etc/passwd", 0, 32))).find("absolute"), std::string::npos);
  fs::create_symlink("/etc/hostname", dir_ / "link.bin");
  EXPECT_NE(load_error(save(model("link.bin", 0, 32))).find("outside the model folder"), std::string::npos);
  auto m = model("w.bin", 0, 32);
  m.mutable_graph()->mutable_initializer(0)->mutable_external_data(1)->set_value("-5");
  EXPECT_NE(load_error(save(m)).find("not a non-negative integer"), std::string::npos);
}

TEST_F(LoaderTest, RejectsBadShapesAndInlineData) {
  write_data("w.bin", 64);
  auto m = model("w.bin", 0, 32);
  m.mutable_graph()->mutable_initializer(0)->set_dims(0, -4);
  EXPECT_NE(load_error(save(m)).find("negative"), std::string::npos);
  m.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t(1) << 62);
  m.mutable_graph()->mutable_initializer(0)->set_dims(1, 16);
  EXPECT_NE(load_error(save(m)).find("overflows"), std::string::npos);

  auto inl = model("w.bin", 0, 32);
  auto* t = inl.mutable_graph()->mutable_initializer(0);
  t->clear_external_data();
  t->clear_data_location();
  t->set_raw_data(std::string(12, '\0'));
  EXPECT_NE(load_error(save(inl)).find("raw_data holds 12 bytes"), std::string::npos);
  t->clear_raw_data();
  for (int i = 0; i < 8; ++i) t->add_float_data(float(i));
  EXPECT_EQ(load_error(save(inl)), "");
  t->set_data_type(10);  // fp16 in int32_data
  t->clear_float_data();
  for (int i = 0; i < 8; ++i) t->add_int32_data(0x3c00);
  auto mm = OnnxModel::load(save(inl));
  TensorView v = mm->view(*mm->initializer("w"));
  EXPECT_EQ(reinterpret_cast<const uint16_t*>(v.data)[7], 0x3c00);
  ASSERT_NE(v.owned, nullptr);
}

TEST_F(LoaderTest, RejectsNonModels) {
  const std::string junk = (dir_ / "junk.onnx").string();
  std::ofstream(junk) << "this is not a protobuf at all \x01\x02\xff";
  EXPECT_NE(load_error(junk).find("not a valid ONNX model"), std::string::npos);
  write_data("w.bin", 64);
  std::string bytes;
  model("w.bin", 0, 32).SerializeToString(&bytes);
  const std::string cut = (dir_ / "cut.onnx").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(load_error(cut), "");
  std::ofstream(dir_ / "empty.onnx");
  EXPECT_NE(load_error((dir_ / "empty.onnx").string()).find("empty"), std::string::npos);
  EXPECT_NE(load_error((dir_ / "nope.onnx").string()).find("does not exist"), std::string::npos);
}

TEST_F(LoaderTest, WriterLeavesNothingWithoutCommit) {
  const std::string out = (dir_ / "sub" / "deeper" / "out.onnx").string();
  {
    ModelWriter w(out, {});
    onnx::TensorProto t;
    std::vector<uint8_t> big(5000, 7);
    w.put(t, big.data(), big.size());
    EXPECT_EQ(t.data_location(), onnx::TensorProto::EXTERNAL);
  }  // destroyed without commit: as if an error was thrown
  EXPECT_FALSE(fs::exists(dir_ / "sub"));  // the folders it created are gone too
}

TEST_F(LoaderTest, WriterCommitsAndRefusesToOverwrite) {
  const std::string out = (dir_ / "out.onnx").string();
  // Writes a model whose one external tensor holds `fill`; returns the data file's path.
  auto write = [&](const ModelWriter::Options& o, uint8_t fill) {
    onnx::ModelProto m = model("out.onnx.data", 0, 32);
    ModelWriter w(out, o);
    onnx::TensorProto small, big;
    std::vector<uint8_t> a(10, 1), b(5000, fill);
    w.put(small, a.data(), a.size());
    w.put(big, b.data(), b.size());
    EXPECT_EQ(small.raw_data().size(), 10u);  // below the inline threshold
    EXPECT_EQ(big.external_data(1).value(), "0");
    *m.mutable_graph()->mutable_initializer(0) = big;
    m.mutable_graph()->mutable_initializer(0)->set_name("w");
    w.commit(m);
    return w.data_path();
  };
  const std::string first = write({}, 2);
  EXPECT_TRUE(fs::exists(out));
  EXPECT_EQ(fs::path(first).parent_path(), dir_);
  EXPECT_TRUE(is_hashed_data_file("out.onnx", fs::path(first).filename().string())) << first;
  EXPECT_EQ(fs::file_size(first), 5000u);
  std::set<std::string> locations;
  ASSERT_TRUE(external_locations(out, &locations));
  EXPECT_EQ(locations, std::set<std::string>{fs::path(first).filename().string()});  // the name, set at commit
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".nibble-tmp-"), std::string::npos);
  EXPECT_THROW(ModelWriter(out, {}), Error);
  ModelWriter::Options force;
  force.force = true;
  EXPECT_EQ(write(force, 2), first);  // the same content: the same name
  const std::string second = write(force, 3);
  EXPECT_NE(second, first);
  EXPECT_FALSE(fs::exists(first));  // the old output's data goes with it
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
  ModelWriter::Options prot;
  prot.force = true;
  prot.protected_paths = {fs::weakly_canonical(out).string()};
  EXPECT_THROW(ModelWriter(out, prot), Error);
}

// A resumable writer keeps its data file when stopped; a second one reopens it at the checkpoint, lays
// the finished tensors out again without writing them (inline ones from the log) and appends the rest.
TEST_F(LoaderTest, WriterResumesAndReplaysTheSameLayout) {
  const std::string data = (dir_ / "state.data").string();
  std::vector<uint8_t> a(10, 1), b(5000, 2), c(3000, 3), junk(2000, 9);
  std::vector<std::string> log;
  uint64_t checkpoint = 0;
  std::string offsets_first;
  {
    ModelWriter::Options o;
    o.resumable_data = data;
    ModelWriter w((dir_ / "out.onnx").string(), o);
    onnx::TensorProto t1, t2, t3;
    w.put(t1, a.data(), a.size());
    w.put(t2, b.data(), b.size());
    w.flush();  // as a checkpoint does
    checkpoint = w.data_bytes();
    log = w.inline_log();
    offsets_first = t2.external_data(1).value();
    w.put(t3, junk.data(), junk.size());  // written after the checkpoint: dropped on resume
  }  // killed: no commit
  ASSERT_TRUE(fs::exists(data));
  EXPECT_GT(fs::file_size(data), checkpoint);
  ModelWriter::Options o;
  o.resumable_data = data;
  o.resume_bytes = checkpoint;
  ModelWriter w((dir_ / "out.onnx").string(), o);
  w.begin_replay(log);
  onnx::TensorProto t1, t2, t3;
  std::vector<uint8_t> zeros_a(10, 0), zeros_b(5000, 0);
  w.put(t1, zeros_a.data(), zeros_a.size());
  w.put(t2, zeros_b.data(), zeros_b.size());
  w.end_replay();
  EXPECT_EQ(t1.raw_data(), std::string(10, '\x01'));  // from the log, not the placeholder
  EXPECT_EQ(t2.external_data(1).value(), offsets_first);
  w.put(t3, c.data(), c.size());
  w.commit(model("out.onnx.data", 0, 32));
  std::ifstream f(w.data_path(), std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(f)), {});
  ASSERT_EQ(got.size(), std::stoull(t3.external_data(1).value()) + c.size());
  EXPECT_EQ(got[std::stoull(offsets_first)], 2);       // the first run's bytes kept
  EXPECT_EQ(got[std::stoull(t3.external_data(1).value())], 3);
  EXPECT_FALSE(fs::exists(data));  // moved into place
  // Named after all its bytes, those of the stopped run included: as one uninterrupted writer names them.
  ModelWriter::Options force;
  force.force = true;
  ModelWriter once((dir_ / "once.onnx").string(), force);
  onnx::TensorProto u1, u2, u3;
  once.put(u1, a.data(), a.size());
  once.put(u2, b.data(), b.size());
  once.put(u3, c.data(), c.size());
  once.commit(model("once.onnx.data", 0, 32));
  EXPECT_EQ(fs::path(once.data_path()).filename().string().substr(4), fs::path(w.data_path()).filename().string().substr(3));
}

TEST_F(LoaderTest, WriterReplayNoticesAnotherLayout) {
  const std::string data = (dir_ / "state.data").string();
  std::vector<uint8_t> b(5000, 2);
  uint64_t checkpoint = 0;
  {
    ModelWriter::Options o;
    o.resumable_data = data;
    ModelWriter w((dir_ / "out.onnx").string(), o);
    onnx::TensorProto t;
    w.put(t, b.data(), b.size());
    w.flush();
    checkpoint = w.data_bytes();
  }
  ModelWriter::Options o;
  o.resumable_data = data;
  o.resume_bytes = checkpoint;
  ModelWriter w((dir_ / "out.onnx").string(), o);
  w.begin_replay({});
  onnx::TensorProto t;
  std::vector<uint8_t> other(6000, 0);
  w.put(t, other.data(), other.size());
  EXPECT_THROW(w.end_replay(), Error);
}

TEST_F(LoaderTest, StaleTemporariesOfDeadRunsAreRemoved) {
  Owner dead = current_owner();
  dead.start_time += 1;  // this pid, but another process: one that was killed
  const std::string stale = ".out.onnx.nibble-tmp-" + owner_tag(dead);
  const std::string legacy = ".out.onnx.nibble-tmp-999999999";  // no owner to check: left alone
  const std::string mine = temporary_name("out.onnx");
  for (const auto& n : {stale, legacy, mine}) std::ofstream(dir_ / n) << "x";
  remove_stale_temporaries(dir_.string());
  EXPECT_FALSE(fs::exists(dir_ / stale));
  EXPECT_TRUE(fs::exists(dir_ / legacy));
  EXPECT_TRUE(fs::exists(dir_ / mine));  // a live run's files stay
}

// A data file no graph references is removed, unless a live run writes that output (its data goes into
// place before its graph); other outputs' files and OUT.data are not judged.
TEST_F(LoaderTest, StrayDataFilesGoOnlyWhenNoLiveRunWritesTheOutput) {
  const std::string stray = "out.onnx.0123456789abcdef.data";
  const std::string live_tmp = temporary_name("out.onnx");
  for (const auto& n : {stray, std::string("out.onnx.data"), std::string("other.onnx.0123456789abcdef.data"), live_tmp})
    std::ofstream(dir_ / n) << "x";
  remove_stray_data_files(dir_.string(), "out.onnx", {});
  EXPECT_TRUE(fs::exists(dir_ / stray));
  fs::remove(dir_ / live_tmp);
  remove_stray_data_files(dir_.string(), "out.onnx", {fs::weakly_canonical(dir_ / stray).string()});
  EXPECT_TRUE(fs::exists(dir_ / stray));  // kept: an input file
  remove_stray_data_files(dir_.string(), "out.onnx", {});
  EXPECT_FALSE(fs::exists(dir_ / stray));
  EXPECT_TRUE(fs::exists(dir_ / "out.onnx.data"));
  EXPECT_TRUE(fs::exists(dir_ / "other.onnx.0123456789abcdef.data"));
}
