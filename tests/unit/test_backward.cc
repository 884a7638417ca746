// The layer engine's reverse pass (forward/backward.h) against central finite differences of the
// engine's own forward operators: each vector-Jacobian product on small random inputs, and a taped
// segment of a small decoder-like graph differentiated down to its weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "forward/backward.h"
#include "forward/graph_run.h"
#include "forward/op_call.h"
#include "loaders/onnx_model.h"
#include "scratch_dir.h"

namespace nibble::forward {
namespace {

Floats random_floats(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  Floats v(n);
  for (float& x : v) x = d(rng);
  return v;
}

Value floats(std::vector<int64_t> shape, uint32_t seed, float sd = 1.0f) {
  return from_floats(DType::kFloat32, shape, random_floats(size_t(numel_of(shape)), seed, sd));
}

onnx::NodeProto node(const std::string& type, const std::string& domain, int inputs, int outputs) {
  onnx::NodeProto n;
  n.set_op_type(type);
  n.set_domain(domain);
  n.set_name("n");
  for (int i = 0; i < inputs; ++i) n.add_input("i" + std::to_string(i));
  for (int i = 0; i < outputs; ++i) n.add_output("o" + std::to_string(i));
  return n;
}

void int_attr(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void float_attr(onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

// L = Σ_o Σ r_o ⊙ y_o over the float outputs `used`, in double.
double objective(const onnx::NodeProto& n, const std::vector<Value>& in, const std::vector<size_t>& used,
                 const std::vector<Floats>& r) {
  std::vector<const Value*> ptrs;
  for (const Value& v : in) ptrs.push_back(v.present() ? &v : nullptr);
  const std::vector<Value> out = find_op(n.domain(), n.op_type())->fn(OpCall{n, ptrs});
  double l = 0.0;
  for (size_t k = 0; k < used.size(); ++k) {
    const Floats y = to_floats(out[used[k]]);
    for (size_t i = 0; i < y.size(); ++i) l += double(r[k][i]) * y[i];
  }
  return l;
}

// Every float input's gradient from the product against central differences at up to 24 elements each.
void check_vjp(const onnx::NodeProto& n, std::vector<Value> in, const std::vector<size_t>& used,
               const std::vector<size_t>& inputs, double h = 1e-2, double tol = 2e-2) {
  std::vector<const Value*> ptrs;
  for (const Value& v : in) ptrs.push_back(v.present() ? &v : nullptr);
  const std::vector<Value> out = find_op(n.domain(), n.op_type())->fn(OpCall{n, ptrs});
  std::vector<Floats> r;
  VjpCall c{OpCall{n, ptrs}, {}, {}, {}};
  for (const Value& o : out) c.out.push_back(o.present() ? &o : nullptr);
  c.d_out.assign(out.size(), nullptr);
  r.reserve(used.size());
  for (size_t k = 0; k < used.size(); ++k) {
    r.push_back(random_floats(size_t(out[used[k]].numel()), uint32_t(100 + k)));
    c.d_out[used[k]] = &r.back();
  }
  for (size_t k = 0; k < in.size(); ++k) c.wanted.push_back(std::count(inputs.begin(), inputs.end(), k) > 0);
  const VjpFn* f = find_vjp(n.domain(), n.op_type());
  ASSERT_NE(f, nullptr) << n.op_type();
  const std::vector<Floats> g = (*f)(c);
  int checked = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (!c.wanted[k]) continue;
    ASSERT_EQ(g[k].size(), size_t(in[k].numel())) << n.op_type() << " input " << k;
    const int64_t count = in[k].numel(), step = std::max<int64_t>(1, count / 24);
    for (int64_t i = 0; i < count; i += step) {
      Floats x = to_floats(in[k]);
      const float x0 = x[size_t(i)];
      x[size_t(i)] = x0 + float(h);
      in[k] = from_floats(DType::kFloat32, in[k].shape, x);
      const double up = objective(n, in, used, r);
      x[size_t(i)] = x0 - float(h);
      in[k] = from_floats(DType::kFloat32, in[k].shape, x);
      const double down = objective(n, in, used, r);
      x[size_t(i)] = x0;
      in[k] = from_floats(DType::kFloat32, in[k].shape, x);
      const double fd = (up - down) / (2.0 * h), an = g[k][size_t(i)];
      EXPECT_NEAR(an, fd, tol * std::max(1.0, std::fabs(fd))) << n.op_type() << " input " << k << " element " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Backward, MatMulOfAWeightAndOfBatchedOperands) {
  check_vjp(node("MatMul", "", 2, 1), {floats({2, 3, 5}, 1), floats({5, 4}, 2)}, {0}, {0, 1});
  check_vjp(node("MatMul", "", 2, 1), {floats({2, 3, 5}, 3), floats({2, 5, 4}, 4)}, {0}, {0, 1});
}

TEST(Backward, ElementwiseWithBroadcasting) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    Value b = floats({4}, 6);
    if (std::string(op) == "Div") {  // away from zero
      Floats v = to_floats(b);
      for (float& x : v) x = 1.5f + std::fabs(x);
      b = from_floats(DType::kFloat32, {4}, v);
    }
    check_vjp(node(op, "", 2, 1), {floats({3, 2, 4}, 5), b}, {0}, {0, 1});
    if (std::string(op) != "Div") check_vjp(node(op, "", 2, 1), {floats({3, 1, 4}, 7), floats({2, 1}, 8)}, {0}, {0, 1});
  }
  check_vjp(node("Sigmoid", "", 1, 1), {floats({5, 7}, 9, 2.0f)}, {0}, {0});
  onnx::NodeProto sp = node("Split", "", 2, 3);
  int_attr(sp, "axis", -1);
  check_vjp(sp, {floats({2, 3, 9}, 15), from_ints(DType::kInt64, {3}, {4, 2, 3})}, {0, 2}, {0});
}

TEST(Backward, ShapesReductionsAndSoftmax) {
  onnx::NodeProto t = node("Transpose", "", 1, 1);
  auto* perm = t.add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  for (int64_t p : {1, 2, 0}) perm->add_ints(p);
  check_vjp(t, {floats({2, 3, 4}, 40)}, {0}, {0});
  check_vjp(node("Reshape", "", 2, 1), {floats({2, 6}, 41), from_ints(DType::kInt64, {2}, {3, 4})}, {0}, {0});
  for (const char* op : {"ReduceMean", "ReduceSum"})
    check_vjp(node(op, "", 2, 1), {floats({2, 3, 4}, 42), from_ints(DType::kInt64, {1}, {-1})}, {0}, {0});
  Floats pos = random_floats(12, 43);
  for (float& x : pos) x = 0.5f + std::fabs(x);
  check_vjp(node("Sqrt", "", 1, 1), {from_floats(DType::kFloat32, {3, 4}, pos)}, {0}, {0}, 1e-3);
  check_vjp(node("Neg", "", 1, 1), {floats({7}, 44)}, {0}, {0});
  check_vjp(node("Tanh", "", 1, 1), {floats({7}, 45)}, {0}, {0});
  check_vjp(node("Softmax", "", 1, 1), {floats({3, 5}, 46)}, {0}, {0});
  onnx::NodeProto cat = node("Concat", "", 2, 1);
  int_attr(cat, "axis", 1);
  check_vjp(cat, {floats({2, 3, 2}, 47), floats({2, 1, 2}, 48)}, {0}, {0, 1});
}

TEST(Backward, RmsNormsAndTheirSkipSum) {
  onnx::NodeProto n = node("SimplifiedLayerNormalization", "", 2, 1);
  float_attr(n, "epsilon", 1e-5f);
  check_vjp(n, {floats({3, 16}, 10), floats({16}, 11)}, {0}, {0});
  onnx::NodeProto s = node("SkipSimplifiedLayerNormalization", "com.microsoft", 3, 4);
  s.set_output(1, "");
  s.set_output(2, "");
  check_vjp(s, {floats({2, 3, 16}, 12), floats({2, 3, 16}, 13), floats({16}, 14)}, {0, 3}, {0, 1});
}

// A prompt's attention: packed q/k/v, rotary halves or interleaved pairs, a padded sequence, softcap and a
// local window.
TEST(Backward, GroupQueryAttentionOnAPrompt) {
  const int64_t B = 2, S = 6, Hq = 4, Hkv = 2, D = 8;
  struct Case {
    bool interleaved;
    float softcap;
    int64_t window;
  };
  for (const Case& k : {Case{false, 0.0f, -1}, Case{true, 0.0f, -1}, Case{false, 5.0f, 3}}) {
    onnx::NodeProto n = node("GroupQueryAttention", "com.microsoft", 9, 3);
    for (int i : {1, 2, 3, 4}) n.set_input(i, "");
    int_attr(n, "num_heads", Hq);
    int_attr(n, "kv_num_heads", Hkv);
    int_attr(n, "do_rotary", 1);
    int_attr(n, "rotary_interleaved", k.interleaved);
    int_attr(n, "local_window_size", k.window);
    if (k.softcap > 0) float_attr(n, "softcap", k.softcap);
    Floats cos(size_t(16 * D / 2)), sin(cos.size());
    for (int64_t p = 0; p < 16; ++p)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = double(p) / std::pow(100.0, double(2 * i) / D);
        cos[size_t(p * D / 2 + i)] = float(std::cos(a));
        sin[size_t(p * D / 2 + i)] = float(std::sin(a));
      }
    std::vector<Value> in(9);
    in[0] = floats({B, S, (Hq + 2 * Hkv) * D}, 20, 0.7f);
    in[5] = from_ints(DType::kInt32, {B}, {S - 1, S - 3});  // the second sequence padded by two
    in[6] = from_ints(DType::kInt32, {1}, {S});
    in[7] = from_floats(DType::kFloat32, {16, D / 2}, cos);
    in[8] = from_floats(DType::kFloat32, {16, D / 2}, sin);
    check_vjp(n, in, {0}, {0}, 1e-2, 3e-2);
  }
}

// A graph input x → SimplifiedLayerNormalization → MatMul(w1) → Sigmoid → Mul(·, MatMul(w2)) → MatMul(w3) → Add
// x, run taped through GraphRun and differentiated down to w1, w2, w3; each against finite differences of the
// whole graph's objective with the weight substituted.
TEST(Backward, ATapedSegmentDownToItsWeights) {
  test::ScratchDir dir("nibble_backward");
  std::filesystem::create_directories(dir.root());
  const int64_t T = 5, H = 8, F = 12;
  onnx::ModelProto m;
  m.set_ir_version(10);
  auto* op = m.add_opset_import();
  op->set_version(21);
  auto* ms = m.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("g");
  auto io = [](onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  io(g->add_input(), "x", {T, H});
  io(g->add_output(), "y", {T, H});
  std::map<std::string, Floats> w = {{"gamma", random_floats(size_t(H), 30)},
                                     {"w1", random_floats(size_t(H * F), 31, 0.4f)},
                                     {"w2", random_floats(size_t(H * F), 32, 0.4f)},
                                     {"w3", random_floats(size_t(F * H), 33, 0.4f)}};
  std::map<std::string, std::vector<int64_t>> dims = {{"gamma", {H}}, {"w1", {H, F}}, {"w2", {H, F}}, {"w3", {F, H}}};
  for (const auto& [name, v] : w) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims[name]) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  }
  auto add = [&](const std::string& type, std::vector<std::string> in, std::string out) {
    auto* n = g->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  add("SimplifiedLayerNormalization", {"x", "gamma"}, "h");
  add("MatMul", {"h", "w1"}, "a");
  add("Sigmoid", {"a"}, "sa");
  add("MatMul", {"h", "w2"}, "b");
  add("Mul", {"sa", "b"}, "m");
  add("MatMul", {"m", "w3"}, "d");
  add("Add", {"d", "x"}, "y");
  const std::string path = (dir.root() / "m.onnx").string();
  {
    std::ofstream f(path, std::ios::binary);
    m.SerializeToOstream(&f);
  }
  auto model = OnnxModel::load(path);
  GraphRun run(*model);
  const Value x = floats({T, H}, 34);
  const Floats r = random_floats(size_t(T * H), 35);
  auto objective_with = [&](const std::string& name, const Floats& v) {
    run.substitute(name, from_floats(DType::kFloat32, dims[name], v));
    GraphRun::State s = run.start({{"x", x}});
    const Tape t = run_taped(run, s, run.nodes());
    const Floats y = to_floats(t.values.at("y"));
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += double(r[i]) * y[i];
    return l;
  };
  EXPECT_EQ(segment_without_vjp(run, 0, run.nodes(), {"w1", "w2", "w3"}), "");
  EXPECT_EQ(nodes_depending_on(run, 0, run.nodes(), {"w3"}), (std::set<size_t>{5, 6}));
  GraphRun::State s = run.start({{"x", x}});
  const Tape t = run_taped(run, s, run.nodes());
  const auto grads = backward(run, t, {{"y", r}}, {"w1", "w2", "w3"});
  ASSERT_EQ(grads.size(), 3u);
  for (const std::string name : {"w1", "w2", "w3"}) {
    const Floats& gw = grads.at(name);
    ASSERT_EQ(gw.size(), w[name].size());
    for (size_t i = 0; i < gw.size(); i += 7) {
      Floats v = w[name];
      v[i] += 1e-2f;
      const double up = objective_with(name, v);
      v[i] -= 2e-2f;
      const double down = objective_with(name, v);
      run.substitute(name, from_floats(DType::kFloat32, dims[name], w[name]));
      EXPECT_NEAR(gw[i], (up - down) / 2e-2, 2e-2 * std::max(1.0, std::fabs(double(gw[i])))) << name << " " << i;
    }
  }
}

}  // namespace
}  // namespace nibble::forward
