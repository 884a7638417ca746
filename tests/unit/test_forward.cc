// The layer engine's operators (forward/) on small arrays against their definitions: the sgemm product
// against the plain reference within float32 summation error, broadcasting, the rounding policy of fp16
// values (wide results of float32 operators, rounded where an fp16 operator reads them).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <map>
#include <random>

#include "forward/broadcast.h"
#include "forward/buffer_pool.h"
#include "forward/half_rows.h"
#include "forward/logistic_rows.h"
#include "forward/softmax_rows.h"
#include "forward/matmul.h"
#include "kernels/parallel.h"
#include "forward/fast_exp.h"
#include "forward/op_call.h"
#include "forward/value.h"
#include "kernels/forward_math.h"
#include "kernels/forward_types.h"

namespace {
nibble::forward::Floats random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  nibble::forward::Floats v(n);
  for (float& x : v) x = d(rng);
  return v;
}
}  // namespace

namespace nibble::forward {
namespace {

TEST(ForwardMatmul, BlasEqualsTheReferenceWithinSummationError) {
  const int64_t M = 37, K = 91, N = 53;
  const auto A = random_floats(size_t(M * K), 1);
  for (bool bt : {false, true}) {
    const auto B = random_floats(size_t(K * N), 2);
    std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
    matmul_ref(A.data(), B.data(), ref.data(), M, K, N, bt);
    matmul_blas(A.data(), B.data(), fast.data(), M, K, N, bt, 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double mag = 0.0;  // Σ|a·b|: the scale of float32 summation error in any order
        for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[size_t(m * K + k)] * (bt ? B[size_t(n * K + k)] : B[size_t(k * N + n)]));
        const size_t i = size_t(m * N + n);
        EXPECT_LE(std::fabs(double(ref[i]) - fast[i]), double(K) * 6e-8 * mag) << m << "," << n << " transposed " << bt;
      }
  }
}

TEST(ForwardMatmul, ParallelPanelsAreFixedByTheShapeAndFollowTheReference) {
  EXPECT_EQ(panel_rows(40), 64);
  EXPECT_EQ(panel_rows(1024), 256);  // four panels of a joined batch run
  EXPECT_EQ(panel_rows(100000), 512);
  EXPECT_EQ(panel_columns(1536), 1536);
  EXPECT_EQ(panel_columns(11008), 1024);
  struct Case {
    int64_t M, K, N;
    bool bt;
  };
  // four row panels of 192 rows, the last one short; then three column panels of 1024, B transposed
  for (const Case& t : {Case{700, 91, 53, false}, Case{70, 8, 2100, true}, Case{300, 600, 70, false}}) {
    const auto A = random_floats(size_t(t.M * t.K), 4), B = random_floats(size_t(t.K * t.N), 5);
    std::vector<float> ref(size_t(t.M * t.N)), one(ref.size()), three(ref.size());
    matmul_ref(A.data(), B.data(), ref.data(), t.M, t.K, t.N, t.bt);
    kernels::set_num_threads(1);
    matmul_parallel(A.data(), B.data(), one.data(), t.M, t.K, t.N, t.bt, kernels::forward_k_slice(t.N, t.K, true));
    kernels::set_num_threads(3);
    matmul_parallel(A.data(), B.data(), three.data(), t.M, t.K, t.N, t.bt, kernels::forward_k_slice(t.N, t.K, true));
    kernels::set_num_threads(0);
    EXPECT_EQ(one, three);  // the same panels whatever the thread count
    for (int64_t m = 0; m < t.M; ++m)
      for (int64_t n = 0; n < t.N; ++n) {
        double mag = 0.0;
        for (int64_t k = 0; k < t.K; ++k)
          mag += std::fabs(A[size_t(m * t.K + k)] * (t.bt ? B[size_t(n * t.K + k)] : B[size_t(k * t.N + n)]));
        const size_t i = size_t(m * t.N + n);
        EXPECT_LE(std::fabs(double(ref[i]) - one[i]), double(t.K) * 6e-8 * mag) << m << "," << n;
      }
  }
}

// K in slices: each slice's sgemm added to the running sum gives what summing the slices one by one does
// (the slices of 600 at 256: 256, 256, 88), and the slices are ONNX Runtime's: 256 for a weight, MLAS's
// stride from the shape for two activations.
TEST(ForwardMatmul, KSlicesAddUpSliceBySlice) {
  const int64_t M = 70, K = 600, N = 90;
  const auto A = random_floats(size_t(M * K), 11), B = random_floats(size_t(K * N), 12);
  std::vector<float> sliced(size_t(M * N)), by_hand(sliced.size(), 0.0f), part(sliced.size());
  matmul_blas(A.data(), B.data(), sliced.data(), M, K, N, false, 256);
  for (int64_t k0 = 0; k0 < K; k0 += 256) {
    const int64_t kk = std::min<int64_t>(256, K - k0);
    std::vector<float> a(size_t(M * kk));
    for (int64_t m = 0; m < M; ++m) std::copy_n(A.data() + m * K + k0, kk, a.data() + m * kk);
    matmul_blas(a.data(), B.data() + k0 * N, part.data(), M, kk, N, false, 0);
    for (size_t i = 0; i < part.size(); ++i) by_hand[i] = k0 ? by_hand[i] + part[i] : part[i];
  }
  EXPECT_EQ(sliced, by_hand);
  EXPECT_EQ(kernels::forward_k_slice(4096, 11008, true), 256);
  EXPECT_EQ(kernels::forward_k_slice(256, 64, false), 64);    // scores: K = head size
  EXPECT_EQ(kernels::forward_k_slice(64, 256, false), 256);   // context: N = head size
  EXPECT_EQ(kernels::forward_k_slice(128, 256, false), 128);
  EXPECT_EQ(kernels::forward_k_slice(576, 1536, false), 128);
}

// A 16-bit weight widened panel group by panel group gives matmul_parallel's bits on the weight widened
// whole, at 1 and 3 threads: one row panel (panels grouped), several, and column panels of 1024.
TEST(ForwardMatmul, WideningPanelByPanelEqualsWideningTheWholeWeight) {
  struct Case {
    int64_t M, K, N;
  };
  for (const Case& t : {Case{5, 37, 3000}, Case{700, 91, 2100}, Case{300, 600, 1000}})
    for (DType type : {DType::kFloat16, DType::kBFloat16}) {
      const auto A = random_floats(size_t(t.M * t.K), 6), Bf = random_floats(size_t(t.K * t.N), 7);
      std::vector<uint16_t> B(Bf.size());
      std::vector<float> wide(Bf.size());
      for (size_t i = 0; i < B.size(); ++i) {
        B[i] = type == DType::kFloat16 ? float_to_half(Bf[i]) : float_to_bf16(Bf[i]);
        wide[i] = type == DType::kFloat16 ? half_to_float(B[i]) : bf16_to_float(B[i]);
      }
      std::vector<float> whole(size_t(t.M * t.N)), one(whole.size()), three(whole.size());
      matmul_parallel(A.data(), wide.data(), whole.data(), t.M, t.K, t.N, false, kernels::forward_k_slice(t.N, t.K, true));
      Floats scratch;
      ProductMeter meter;
      kernels::set_num_threads(1);
      matmul_widening(&meter, A.data(), type, B.data(), one.data(), t.M, t.K, t.N, scratch);
      kernels::set_num_threads(3);
      matmul_widening(nullptr, A.data(), type, B.data(), three.data(), t.M, t.K, t.N, scratch);
      kernels::set_num_threads(0);
      EXPECT_EQ(one, whole) << t.M << "x" << t.K << "x" << t.N;
      EXPECT_EQ(three, whole) << t.M << "x" << t.K << "x" << t.N;
      EXPECT_EQ(meter.flop, 2.0 * double(t.M) * double(t.K) * double(t.N));
      EXPECT_LE(scratch.size(), size_t(t.K) * size_t(std::min<int64_t>(t.N, 3 * 1024)));
    }
}

// One node with one integer attribute.
std::vector<Value> call_with(const std::string& domain, const std::string& op, const std::vector<const Value*>& in,
                             const std::string& attr, int64_t value) {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name("n");
  node.add_output("y");
  auto* a = node.add_attribute();
  a->set_name(attr);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
  const OpEntry* e = find_op(domain, op);
  EXPECT_NE(e, nullptr) << op;
  return e->fn(OpCall{node, in, e->float32_on_cpu});
}

std::vector<Value> call(const std::string& domain, const std::string& op, const std::vector<const Value*>& in) {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name("n");
  node.add_output("y");
  const OpEntry* e = find_op(domain, op);
  EXPECT_NE(e, nullptr) << op;
  return e->fn(OpCall{node, in, e->float32_on_cpu});
}

TEST(ForwardOps, AddBroadcastsLikeNumpy) {
  const Value a = from_floats(DType::kFloat32, {2, 3, 4}, random_floats(24, 3));
  const Value b = from_floats(DType::kFloat32, {3, 1}, {10.0f, 20.0f, 30.0f});
  const auto out = call("", "Add", {&a, &b});
  ASSERT_EQ(out.at(0).shape, (std::vector<int64_t>{2, 3, 4}));
  const auto x = to_floats(a), y = to_floats(out[0]);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(y[i], x[i] + 10.0f * float((i / 4) % 3 + 1)) << i;
}

// ReduceMean over trailing axes (rows summed in float64 over the worker threads) and over a middle axis
// (the general walk), fp32 and fp16 storage, against float64 sums in element order; Softmax's rows over
// the threads against the row-by-row definition, at 1 and 3 threads.
TEST(ForwardOps, ReduceMeanAndSoftmaxRowsFollowTheirDefinitions) {
  const std::vector<int64_t> shape{3, 700, 67};  // 2100 rows of 67: several thread chunks
  const int64_t rows = 3 * 700, cols = 67;
  for (DType t : {DType::kFloat32, DType::kFloat16}) {
    const Value x = from_floats(t, shape, random_floats(size_t(rows * cols), 9));
    const auto xf = to_floats(x);
    const Value last = from_ints(DType::kInt64, {1}, {-1}), middle = from_ints(DType::kInt64, {1}, {1});
    const auto by_row = call("", "ReduceMean", {&x, &last}).at(0);
    ASSERT_EQ(by_row.shape, (std::vector<int64_t>{3, 700, 1}));
    const auto r = to_floats(by_row);
    for (int64_t i = 0; i < rows; ++i) {
      double a = 0.0;
      for (int64_t j = 0; j < cols; ++j) a += xf[size_t(i * cols + j)];
      EXPECT_EQ(r[size_t(i)], float(a / double(cols))) << i;  // fp16: wide, as ORT keeps it
    }
    const auto m = to_floats(call("", "ReduceMean", {&x, &middle}).at(0));
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t j = 0; j < cols; ++j) {
        double a = 0.0;
        for (int64_t k = 0; k < 700; ++k) a += xf[size_t((b * 700 + k) * cols + j)];
        EXPECT_EQ(m[size_t(b * cols + j)], float(a / 700.0)) << b << "," << j;
      }
  }
  const Value x = from_floats(DType::kFloat32, shape, random_floats(size_t(rows * cols), 10));
  kernels::set_num_threads(1);
  const auto one = to_floats(call("", "Softmax", {&x}).at(0));
  kernels::set_num_threads(3);
  const auto three = to_floats(call("", "Softmax", {&x}).at(0));
  kernels::set_num_threads(0);
  EXPECT_EQ(one, three);
  const auto xf = to_floats(x);
  for (int64_t i = 0; i < rows; ++i) {  // the scalar definition (kernels/forward_math.h), bit for bit
    std::vector<float> row(xf.begin() + i * cols, xf.begin() + (i + 1) * cols);
    kernels::fw::softmax_mlas(row.data(), cols);
    for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(one[size_t(i * cols + j)], row[size_t(j)]) << i << "," << j;
  }
}

// MLAS's softmax pieces written out: exp within 2 ulp of exp over the range a softmax sees, the subnormal
// results rounded once, the sum's sixteen lanes in their fold order, and the vector rows (any length: 16
// at a time, then a tail) equal to the scalar definition.
TEST(ForwardOps, MlasSoftmaxPiecesFollowTheirDefinitions) {
  double worst = 0.0;
  for (int i = 0; i <= 870000; ++i) {
    const float x = -float(i) * 1e-4f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(kernels::fw::softmax_exp(x)) - want) / want);
  }
  EXPECT_LE(worst, 2.0 * 5.96e-8) << worst;
  EXPECT_EQ(kernels::fw::softmax_exp(0.0f), 1.0f);
  EXPECT_NEAR(kernels::fw::softmax_exp(-100.0f), std::exp(-100.0), 1.5e-45);  // subnormal: within its spacing
  EXPECT_GT(kernels::fw::softmax_exp(-100.0f), 0.0f);
  EXPECT_EQ(kernels::fw::softmax_exp(-1000.0f), kernels::fw::softmax_exp(-103.9720840454f));
  EXPECT_TRUE(std::isnan(kernels::fw::softmax_exp(NAN)));
  EXPECT_EQ(kernels::fw::scale_pow2(1.5f, -149.0f), std::ldexp(1.5f, -149));  // one rounding, to 2^-148
  const Floats e = random_floats(37, 12);
  float lane[16] = {};
  for (size_t j = 0; j < 37; ++j) lane[j % 16] += e[j];
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = lane[i + 8] + lane[i];
  EXPECT_EQ(kernels::fw::softmax_sum(e.data(), 37), ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
  for (int64_t n : {1, 7, 16, 17, 48, 100, 257}) {
    Floats row = random_floats(size_t(n), 13);
    for (float& v : row) v *= 30.0f;  // a spread wide enough for subnormal numerators
    Floats want = row;
    kernels::fw::softmax_mlas(want.data(), n);
    softmax_row_mlas(row.data(), n);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(std::memcmp(&row[size_t(j)], &want[size_t(j)], 4), 0) << n << "," << j;
  }
}

// Operands of fp16 and float32 storage in either order (a norm's fp16 output times its float32 weight, a
// broadcast row): each output the float32 operation on the two elements, widened exactly.
TEST(ForwardOps, MixedStorageOperandsBroadcastLikeNumpy) {
  const Value h = from_floats(DType::kFloat16, {3, 5, 7}, random_floats(105, 21));
  const Value w = from_floats(DType::kFloat32, {7}, random_floats(7, 22));
  const Value hw = from_floats(DType::kFloat16, {7}, random_floats(7, 23));
  const auto x = to_floats(h), y = to_floats(w), z = to_floats(hw);
  const auto hf = to_floats(call("", "Mul", {&h, &w}).at(0)), fh = to_floats(call("", "Div", {&w, &h}).at(0));
  const auto hh = to_floats(call("", "Sub", {&h, &hw}).at(0));
  for (size_t i = 0; i < 105; ++i) {
    EXPECT_EQ(hf[i], x[i] * y[i % 7]) << i;
    EXPECT_EQ(fh[i], y[i % 7] / x[i]) << i;
    EXPECT_EQ(hh[i], x[i] - z[i % 7]) << i;
  }
}

TEST(ForwardOps, Fp16ResultsOfFloat32OperatorsStayWideUntilRounded) {
  // 1 + 2^-12 is not an fp16 value: Mul keeps it (ONNX Runtime's CPU provider runs Mul in float32), a
  // reader with an fp16 kernel sees it rounded to 1.
  const float x = 1.0f + std::ldexp(1.0f, -12);
  const Value a = from_floats(DType::kFloat16, {1}, {1.0f});
  const Value bw = from_floats(DType::kFloat16, {1}, {x}, /*wide=*/true);
  const auto out = call("", "Mul", {&a, &bw});
  ASSERT_TRUE(out.at(0).wide);
  EXPECT_EQ(to_floats(out[0])[0], x);
  EXPECT_EQ(to_floats(narrow(out[0]))[0], 1.0f);
  EXPECT_FALSE(find_op("com.microsoft", "SkipSimplifiedLayerNormalization")->float32_on_cpu);
}

// exp_fast against libm's exp in double: within 2 ulp of float over the range it covers, the edges clamped,
// NaN kept; Sigmoid and a same-shape Mul through the operators give the element-wise definitions.
// The threaded conversions (to_floats, rounded_value, narrow) against the scalar definitions, on every fp16
// and bf16 bit pattern (two ranges of the worker threads each) and on floats around each rounding edge.
TEST(ForwardValues, ThreadedConversionsEqualTheScalarOnesOnEveryPattern) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const Floats f = to_floats(view_value(t, {256, 256}, all.data()));
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = t == DType::kFloat16 ? half_to_float(all[i]) : bf16_to_float(all[i]);
      ASSERT_EQ(0, std::memcmp(&want, &f[i], 4)) << dtype_name(t) << " pattern " << i;
    }
  }
  Floats x = random_floats(70000, 9);
  const float edges[] = {0.0f, -0.0f, 65504.0f, 65520.0f, -65520.0f, 6.1e-5f, 5.9604645e-08f, 2.98e-08f,
                         1e-30f, INFINITY, -INFINITY, NAN, 1.00048828125f, 3.4e38f};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; ++i) x[i] = edges[i];
  for (size_t i = 20; i < 2000; ++i) x[i] = std::ldexp(x[i], int(i % 60) - 30);  // every exponent range
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const Value r = rounded_value(t, {int64_t(x.size())}, x.data());
    const Value wide = from_floats(t, {int64_t(x.size())}, Floats(x.begin(), x.end()), /*wide=*/true);
    const Value n = narrow(wide);
    ASSERT_FALSE(n.wide);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = t == DType::kFloat16 ? float_to_half(round_to(t, x[i])) : float_to_bf16(round_to(t, x[i]));
      ASSERT_EQ(want, r.as<uint16_t>()[i]) << dtype_name(t) << " " << x[i];
      ASSERT_EQ(want, n.as<uint16_t>()[i]) << dtype_name(t) << " " << x[i];
    }
    // one pass, the bits of the two: the statistics' rows and a wide value's Cast to float32
    Floats once;
    rounded_floats_into(wide, once);
    const Floats twice = to_floats(n);
    ASSERT_EQ(0, std::memcmp(once.data(), twice.data(), 4 * twice.size())) << dtype_name(t);
    const auto cast = call_with("", "Cast", {&wide}, "to", int64_t(onnx::TensorProto::FLOAT)).at(0);
    ASSERT_EQ(cast.dtype, DType::kFloat32);
    ASSERT_EQ(0, std::memcmp(cast.data, twice.data(), 4 * twice.size())) << dtype_name(t);
  }
}

// The eight-at-a-time conversions and their tails against the scalar ones, NaNs (signalling, quiet, with
// payloads) among them, at every length from 0 to 40.
TEST(ForwardValues, HalfRowsEqualTheScalarConversions) {
  std::vector<uint16_t> h = {0x7c01, 0xfc01, 0x7e00, 0x7fff, 0x7c00, 0xfc00, 0x0001, 0x8001, 0x3c00, 0x03ff, 0x0400};
  for (uint16_t i = 0; h.size() < 40; ++i) h.push_back(uint16_t(i * 2654435761u >> 16));
  std::vector<float> x;
  for (uint16_t v : h) x.push_back(half_to_float(v) * 1.0009765625f);
  x[3] = std::nanf("0x1234");
  x[4] = -std::nanf("");
  x[5] = 65520.0f;
  x[6] = 2.98023224e-08f;
  for (size_t n = 0; n <= h.size(); ++n) {
    std::vector<float> f(n);
    std::vector<uint16_t> r(n);
    halves_to_floats(h.data(), f.data(), int64_t(n));
    floats_to_halves(x.data(), r.data(), int64_t(n));
    for (size_t i = 0; i < n; ++i) {
      const float want = half_to_float(h[i]);
      ASSERT_EQ(0, std::memcmp(&want, &f[i], 4)) << n << " " << i;
      ASSERT_EQ(float_to_half(x[i]), r[i]) << n << " " << i;
    }
  }
}

TEST(ForwardOps, FastExpIsWithinTwoUlpAndSigmoidFollowsIt) {
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 200000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(exp_fast(x)) - want) / want);
  }
  EXPECT_LE(worst, 2.0 * 5.96e-8) << worst;  // 2 ulp: 2 · 2^-24
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(exp_fast(NAN)));
  EXPECT_LE(exp_fast(-INFINITY), 1.25e-38f);
  EXPECT_GE(exp_fast(INFINITY), 2.1e38f);
  EXPECT_TRUE(std::isfinite(exp_fast(INFINITY)));
  const Value a = from_floats(DType::kFloat32, {3, 7}, random_floats(21, 9));  // 21: a tail of one
  const auto sig = to_floats(call("", "Sigmoid", {&a}).at(0));
  const auto prod = to_floats(call("", "Mul", {&a, &a}).at(0));
  const auto x = to_floats(a);
  for (size_t i = 0; i < 21; ++i) {
    EXPECT_EQ(sig[i], kernels::fw::sigmoid(x[i])) << i;
    EXPECT_NEAR(sig[i], 1.0 / (1.0 + std::exp(-double(x[i]))), 2e-7) << i;
    EXPECT_EQ(prod[i], x[i] * x[i]) << i;
  }
}

// ONNX Runtime's logistic (MLAS's rational form) within 2e-7 of the logistic function over [-40, 40] (not
// monotone there: near -18 it wobbles by 3e-8), its clamps' values beyond.
TEST(ForwardOps, LogisticIsWithin2e7OfTheFunction) {
  double worst = 0.0;
  for (int i = -400000; i <= 400000; ++i) {
    const float x = float(i) * 1e-4f;
    const float s = kernels::fw::sigmoid(x);
    worst = std::max(worst, std::fabs(double(s) - 1.0 / (1.0 + std::exp(-double(x)))));
  }
  EXPECT_LE(worst, 2e-7) << worst;
  EXPECT_GT(worst, 0.0);  // an approximation, not libm's value
  EXPECT_EQ(kernels::fw::sigmoid(0.0f), 0.5f);
  EXPECT_LE(kernels::fw::sigmoid(-1e30f), 2e-8f);
  EXPECT_EQ(kernels::fw::sigmoid(1e30f), 1.0f);
}

// The device bodies' scalar exp and sigmoid (kernels/forward_math.h) are the host's lanes, bit for bit: the
// emulated device then gives the CPU engine's activations, and a GPU too (no fused multiply-add there but
// the ones written as fmaf, which a GPU computes exactly).
TEST(ForwardOps, ScalarDeviceArithmeticEqualsTheHostsLanes) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 4 ? std::array<float, 4>{0.0f, -0.0f, 88.5f, -90.0f}[size_t(i)] : d(rng);
    const float lanes = exp_fast(x), scalar = kernels::fw::exp_fast(x);
    ASSERT_EQ(std::memcmp(&lanes, &scalar, 4), 0) << x;
  }
  // The logistic function eight lanes at a time (fused multiply-adds) against the scalar form, a tail too.
  std::vector<float> xs(200003), sig(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = i < 4 ? std::array<float, 4>{0.0f, -0.0f, 18.5f, -40.0f}[i] : d(rng);
  logistic_rows(xs.data(), sig.data(), int64_t(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = kernels::fw::sigmoid(xs[i]);
    ASSERT_EQ(std::memcmp(&sig[i], &want, 4), 0) << xs[i];
  }
  const float nan = NAN;
  float out = 0.0f;
  logistic_rows(&nan, &out, 1);
  EXPECT_TRUE(std::isnan(out));
  EXPECT_TRUE(std::isnan(kernels::fw::sigmoid(NAN)));
  EXPECT_TRUE(std::isnan(kernels::fw::exp_fast(NAN)));
}

TEST(ForwardOps, UnknownOperatorIsNotFound) {
  EXPECT_EQ(find_op("", "Celu"), nullptr);
  EXPECT_NE(find_op("ai.onnx", "MatMul"), nullptr);
  EXPECT_NE(find_op("com.microsoft", "GroupQueryAttention"), nullptr);
}

}  // namespace
}  // namespace nibble::forward

namespace nibble::forward {
namespace {

// Large buffers come back by size, and no more than kIdleBytes wait for reuse.
TEST(ForwardBufferPool, ReusesFreedBuffersBySizeWithinItsCap) {
  const size_t big = kPooledBytes * 3;
  void* a = pool_alloc(big);
  static_cast<char*>(a)[big - 1] = 1;
  pool_free(a, big);
  const size_t idle = pool_idle_bytes();
  EXPECT_GE(idle, big);
  void* b = pool_alloc(big);
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool_idle_bytes(), idle - (big + 4095) / 4096 * 4096);
  std::vector<void*> many;
  for (size_t i = 0; i < kIdleBytes / big + 3; ++i) many.push_back(pool_alloc(big));
  for (void* p : many) pool_free(p, big);
  EXPECT_LE(pool_idle_bytes(), kIdleBytes);
  pool_free(b, big);
  pool_release_idle();
  EXPECT_EQ(pool_idle_bytes(), 0u);
}

// Row ranges over the worker threads visit what the sequential walk visits, with the same offsets.
TEST(ForwardBroadcast, ParallelRowRangesMatchTheSequentialWalk) {
  const std::vector<int64_t> out = {3, 70, 5, 257};
  const std::vector<int64_t> strides[2] = {broadcast_strides({70, 1, 257}, out), broadcast_strides({3, 1, 5, 1}, out)};
  const int64_t n = numel_of(out);
  std::vector<int64_t> seq(size_t(n * 2), -1), par(size_t(n * 2), -1);
  for_each_broadcast(out, strides, [&](int64_t i, int64_t a, int64_t b) { seq[size_t(2 * i)] = a, seq[size_t(2 * i + 1)] = b; });
  parallel_broadcast(out, strides, [&](int64_t i, int64_t a, int64_t b) { par[size_t(2 * i)] = a, par[size_t(2 * i + 1)] = b; });
  EXPECT_EQ(seq, par);
  EXPECT_EQ(seq[size_t(2 * (n - 1))], 70 * 257 - 1);
  EXPECT_EQ(seq[size_t(2 * (n - 1) + 1)], 3 * 5 - 1);
}

}  // namespace
}  // namespace nibble::forward
