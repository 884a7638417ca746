// The AWQ loss in its two forms (kernels/cpu/awq_ref.h): Σ D ⊙ (G D) with the Gram matrix, and
// ‖U D‖² with its Cholesky factor (nibble mode), and the factor itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/backend.h"
#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/dtype.h"
#include "kernels/tree_reduce.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

// G = XᵀX of T random token rows (K channels); channel `zero` is always 0 when >= 0, so G is only
// semi-definite and the factorisation needs its diagonal shift.
std::vector<double> gram(int64_t T, int64_t K, int zero, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) x[size_t(t * K + k)] = k == zero ? 0.0 : d(rng) * (1.0 + double(k % 5));
  std::vector<double> g(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) g[size_t(i * K + j)] += x[size_t(t * K + i)] * x[size_t(t * K + j)];
  return g;
}

}  // namespace

TEST(AwqLoss, CholeskyFactorReproducesTheGram) {
  const int64_t K = 37;
  for (int zero : {-1, 11}) {
    const auto g = gram(200, K, zero, 3);
    const auto u = gram_cholesky_upper(g.data(), K);
    ASSERT_EQ(u.size(), size_t(K * K)) << "zero channel " << zero;
    double gmax = 0;
    for (int64_t k = 0; k < K; ++k) gmax = std::max(gmax, g[size_t(k * K + k)]);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        if (j < i) {
          EXPECT_EQ(u[size_t(i * K + j)], 0.0f) << i << "," << j;
          continue;
        }
        double utu = 0;  // (UᵀU)_ij = Σ_m U_mi U_mj
        for (int64_t m = 0; m <= i; ++m) utu += double(u[size_t(m * K + i)]) * double(u[size_t(m * K + j)]);
        EXPECT_NEAR(utu, g[size_t(i * K + j)], 2e-6 * gmax) << i << "," << j;
      }
  }
  // Nothing to factor: an all-zero Gram matrix gives no factor (the GEMM form is used).
  std::vector<double> z(size_t(K * K), 0.0);
  EXPECT_TRUE(gram_cholesky_upper(z.data(), K).empty());
}

TEST(AwqLoss, TriangularFormEqualsGemmForm) {
  const int64_t K = 300, N = 70, T = 500;  // K not a multiple of the block, N below one column chunk
  for (int zero : {-1, 4}) {
    const auto g = gram(T, K, zero, 5);
    std::vector<float> g32(g.begin(), g.end());
    const auto u = gram_cholesky_upper(g.data(), K);
    ASSERT_FALSE(u.empty());
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.0f, 0.05f);
    std::vector<float> w(static_cast<size_t>(K * N));
    std::vector<float> s(static_cast<size_t>(K));
    for (auto& v : w) v = d(rng);
    for (auto& v : s) v = 0.5f + std::fabs(d(rng)) * 10.0f;
    const WeightMatrix wm{DType::kFloat32, w.data(), K, N, 0};
    const auto w_kn = logical_weight(wm);
    const std::vector<float> ratios = {1.0f, 0.9f, 0.8f};
    for (bool zp : {false, true})
      for (const std::vector<float>* clip : {static_cast<const std::vector<float>*>(nullptr), &ratios}) {
        QuantSpec spec{4, 128, zp};
        const double gemm = awq_loss(wm, w_kn, s.data(), spec, g32.data(), T, clip);
        const double tri = awq_loss(wm, w_kn, s.data(), spec, g32.data(), T, clip, u.data());
        SCOPED_TRACE(std::string(zp ? "zp" : "sym") + (clip ? " clip" : "") + " zero " + std::to_string(zero));
        EXPECT_GT(gemm, 0.0);
        EXPECT_NEAR(tri / gemm, 1.0, 1e-4);
      }
  }
}

// The CPU's column sums (columns side by side, vectorized) in column_dot_ref's order, bit for bit:
// the order the CUDA backend's cooperative kernel follows (kernels/tree_reduce.h).
TEST(AwqLoss, ColumnDotsEqualColumnDotRefBitForBit) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t K : {1, 17, 300})
    for (int64_t width : {1, 70, 300}) {  // 300: past one tile of 256 columns
      const int64_t ld = width + 5;        // a chunk of a wider array
      std::vector<float> a(size_t(K * ld)), b(a.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = nd(rng) * std::exp(2.0f * nd(rng)), b[i] = nd(rng);
      std::vector<double> got(static_cast<size_t>(width));
      column_dots(a.data(), b.data(), K, ld, width, got.data());
      for (int64_t n = 0; n < width; ++n) {
        const double want = column_dot_ref(a.data() + n, b.data() + n, K, ld);
        ASSERT_EQ(std::memcmp(&got[size_t(n)], &want, 8), 0) << "K " << K << " width " << width << " column " << n;
      }
    }
}

// The [K, N] clip form (typed row loops on reused buffers) is loss_weight + loss_residual's arithmetic:
// the same loss, bit for bit, as the weight stored transposed ([N, K], the general path), for each
// dtype and code kind, and a workspace carried from one candidate to the next changes nothing.
TEST(AwqLoss, RowsFormEqualsGeneralPathBitForBit) {
  const int64_t K = 300, N = 290, T = 500;  // K not a multiple of the block, N past one column chunk
  const auto g = gram(T, K, 4, 5);
  std::vector<float> g32(g.begin(), g.end());
  const auto u = gram_cholesky_upper(g.data(), K);
  ASSERT_FALSE(u.empty());
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> wf(static_cast<size_t>(K * N));
  for (auto& v : wf) v = d(rng);
  std::vector<std::vector<float>> scales(3, std::vector<float>(static_cast<size_t>(K)));
  for (auto& s : scales)
    for (auto& v : s) v = 0.5f + std::fabs(d(rng)) * 10.0f;
  const std::vector<float> ratios = {1.0f, 0.9f, 0.8f};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t es = dtype_size(t);
    std::vector<uint8_t> kn(size_t(K * N) * es), nk(kn.size());  // [K, N] and its transpose [N, K]
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        const float v = round_to(t, wf[size_t(k * N + n)]);
        store_float(t, kn.data(), size_t(k * N + n), v);
        store_float(t, nk.data(), size_t(n * K + k), v);
      }
    const WeightMatrix rows{t, kn.data(), K, N, 0}, cols{t, nk.data(), N, K, 1};
    const auto w_kn = logical_weight(rows);
    for (bool zp : {false, true}) {
      const QuantSpec spec{4, 128, zp};
      AwqLossWork work;
      for (const auto& s : scales) {
        const double general = awq_loss(cols, w_kn, s.data(), spec, g32.data(), T, &ratios, u.data());
        const double fresh = awq_loss(rows, w_kn, s.data(), spec, g32.data(), T, &ratios, u.data());
        const double reused = awq_loss(rows, w_kn, s.data(), spec, g32.data(), T, &ratios, u.data(), &work);
        SCOPED_TRACE(std::string(dtype_name(t)) + (zp ? " zp" : " sym"));
        EXPECT_GT(general, 0.0);
        EXPECT_EQ(std::memcmp(&fresh, &general, 8), 0) << fresh << " vs " << general;
        EXPECT_EQ(std::memcmp(&reused, &general, 8), 0) << reused << " vs " << general;
      }
    }
  }
}

// The weight statistic and the float weight on our threads: the reference's bits.
TEST(AwqLoss, WeightMeanFastEqualsReferenceBitForBit) {
  const int64_t K = 300, N = 70;
  std::mt19937 rng(13);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint8_t> kn(size_t(K * N) * dtype_size(t));
    for (size_t i = 0; i < size_t(K * N); ++i) store_float(t, kn.data(), i, round_to(t, d(rng)));
    const WeightMatrix w{t, kn.data(), K, N, 0};
    const auto ref_kn = logical_weight(w), fast_kn = logical_weight_fast(w);
    ASSERT_EQ(std::memcmp(ref_kn.data(), fast_kn.data(), ref_kn.size() * 4), 0) << dtype_name(t);
    for (bool contiguous : {true, false}) {
      const auto want = weight_mean(ref_kn, K, N, 128, contiguous), got = weight_mean_fast(w, 128, contiguous);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << dtype_name(t) << " " << contiguous;
    }
  }
}

// The triangular loss's column chunks: N alone decides them (never the thread count), one call up to
// 1024 columns, above that an even number of chunks of whole 64-column groups that cover N.
TEST(AwqLoss, TriangularChunksDependOnNAlone) {
  EXPECT_EQ(triangular_loss_chunk(70), 70);
  EXPECT_EQ(triangular_loss_chunk(1024), 1024);
  EXPECT_EQ(triangular_loss_chunk(4096), 1024);  // 4 chunks
  EXPECT_EQ(triangular_loss_chunk(11008), 960);  // 12 chunks, the last 448 wide
  for (int64_t N : {1025, 1536, 2049, 4096, 5504, 11008, 14336}) {
    const int64_t c = triangular_loss_chunk(N), chunks = (N + c - 1) / c;
    EXPECT_EQ(c % 64, 0) << N;
    EXPECT_EQ(chunks % 2, 0) << N;
    EXPECT_LE(c, 1024) << N;
  }
}
