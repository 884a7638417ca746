#include "kernels/cpu/learned_rounding_cpu.h"

#include <algorithm>
#include <vector>

#include "kernels/learned_rounding.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

// One row's arrays (learned::Row), reused row after row.
struct RowArrays {
  std::vector<double> d;
  std::vector<uint8_t> best;
  explicit RowArrays(int64_t K) : d(size_t(5 * K)), best(size_t(K)) {}
  learned::Row row(int64_t K) {
    double* b = d.data();
    return learned::Row{b, b + K, b + 2 * K, b + 3 * K, b + 4 * K, best.data()};
  }
};

// r[k0, k1) += a_j·G_jk for four consecutive j, each r_k adding the four products in j order: the bits of
// residual_row's one-j-at-a-time sums, with r loaded and stored once per four rows of G.
void add_four_rows_of_g(double* __restrict r, const double* a, const double* __restrict g, int64_t K, int64_t k0,
                        int64_t k1) {
  const double a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  const double *__restrict g0 = g, *__restrict g1 = g + K, *__restrict g2 = g + 2 * K, *__restrict g3 = g + 3 * K;
  for (int64_t k = k0; k < k1; ++k) {
    double x = r[k];
    x += a0 * g0[k];
    x += a1 * g1[k];
    x += a2 * g2[k];
    x += a3 * g3[k];
    r[k] = x;
  }
}

// learned::residual_row for several rows at once: G is read once per tile of channels for all of them
// instead of once per row (K² doubles: on a wide weight, 642 MB per row, it ruled the time). Each r_k still
// sums (e_j·s_j)·G_jk in j order, then s_k·r_k + damp·e_k: residual_row's bits.
void residual_rows(const learned::Problem& p, const std::vector<learned::Row>& rows) {
  const int64_t K = p.K();
  constexpr int64_t kTile = 512;  // channels of r per pass: the rows' tiles stay in the L1 cache
  std::vector<double> a(size_t(rows.size() * K));  // e_j·s_j of each row
  for (size_t t = 0; t < rows.size(); ++t) {
    std::fill(rows[t].r, rows[t].r + K, 0.0);
    for (int64_t j = 0; j < K; ++j) a[t * size_t(K) + size_t(j)] = rows[t].e[j] * p.s[j];
  }
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t k1 = std::min(K, k0 + kTile);
    int64_t j = 0;
    for (; j + 4 <= K; j += 4)
      for (size_t t = 0; t < rows.size(); ++t)
        add_four_rows_of_g(rows[t].r, a.data() + t * size_t(K) + j, p.gram + j * K, K, k0, k1);
    for (; j < K; ++j) {
      const double* g = p.gram + j * K;
      for (size_t t = 0; t < rows.size(); ++t) {
        const double aj = a[t * size_t(K) + size_t(j)];
        double* r = rows[t].r;
        for (int64_t k = k0; k < k1; ++k) r[k] += aj * g[k];
      }
    }
  }
  for (const learned::Row& row : rows)
    for (int64_t k = 0; k < K; ++k) row.r[k] = p.s[k] * row.r[k] + p.damp * row.e[k];
}

// learned::learn_row on rows [n0, n1) phase by phase, as the CUDA backend's launches take them: each row's
// arithmetic is learn_row's, only the residuals share their passes over G.
void learn_tile(const learned::Problem& p, int64_t n0, int64_t n1, uint8_t* codes, const uint8_t* given,
                learned::RowStats* stats) {
  const int64_t K = p.K(), count = n1 - n0;
  std::vector<RowArrays> arrays;
  std::vector<learned::Row> rows, redo;
  arrays.reserve(size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    arrays.emplace_back(K);
    rows.push_back(arrays.back().row(K));
    learned::row_start(p, n0 + i, codes, rows.back());
  }
  residual_rows(p, rows);
  for (int64_t i = 0; i < count; ++i) {
    stats[i].start = learned::objective(p, rows[size_t(i)]);
    learned::row_descend(p, n0 + i, codes, rows[size_t(i)]);
    if (learned::row_restore(p, n0 + i, codes, rows[size_t(i)])) redo.push_back(rows[size_t(i)]);
  }
  if (!redo.empty()) residual_rows(p, redo);
  for (int64_t i = 0; i < count; ++i) learned::row_polish(p, n0 + i, codes, rows[size_t(i)], given, stats[i]);
}

// Rows in chunks of a fixed size (kernels/parallel.h: the same chunks whatever the thread count); the
// statistics summed in row order. The reference runs learn_row row after row, the fast path learn_tile.
LearnedRoundingStats learn_rows(const WeightMatrix& w, const QuantSpec& spec, const double* gram, const float* inv_s,
                                const LearnedRoundingOptions& opt, QuantResult& q, bool threaded) {
  learned::Problem p = learned::problem_of(w, spec, opt, q);
  if (!w.data) throw std::invalid_argument("learned_rounding: a weight with no host data");
  const int64_t K = p.K(), N = p.N();
  std::vector<double> s(size_t(K), 1.0);
  if (inv_s)
    for (int64_t k = 0; k < K; ++k) s[size_t(k)] = double(inv_s[k]);
  p.w = w.data, p.gram = gram, p.s = s.data();
  p.damp = learned::damp_of(gram, s.data(), K, opt.percdamp);
  p.scales = q.scales.data();
  p.zero_points = q.zero_points.empty() ? nullptr : q.zero_points.data();
  const std::vector<uint8_t> given = q.codes;
  std::vector<learned::RowStats> stats(static_cast<size_t>(N));
  constexpr int64_t kRowsPerChunk = 16;
  auto chunk = [&](int64_t c) {
    const int64_t n0 = c * kRowsPerChunk, n1 = std::min(N, n0 + kRowsPerChunk);
    if (threaded) return learn_tile(p, n0, n1, q.codes.data(), given.data(), stats.data() + n0);
    RowArrays a(K);
    const learned::Row row = a.row(K);
    for (int64_t n = n0; n < n1; ++n) stats[size_t(n)] = learned::learn_row(p, n, q.codes.data(), given.data(), row);
  };
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  if (threaded)
    parallel_for(chunks, chunk);
  else
    for (int64_t c = 0; c < chunks; ++c) chunk(c);
  LearnedRoundingStats out;
  q.sq_error = 0;
  for (const learned::RowStats& r : stats) {
    out.objective_given += r.start;
    out.objective_learned += r.end;
    out.moved += r.moved;
    q.sq_error += r.sq_error;
  }
  q.packed.clear();  // the codes changed
  return out;
}

}  // namespace

LearnedRoundingStats learned_rounding_ref(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                          const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q) {
  return learn_rows(w, spec, gram, inv_s, opt, q, false);
}

LearnedRoundingStats learned_rounding_fast(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                           const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q) {
  return learn_rows(w, spec, gram, inv_s, opt, q, true);
}

}  // namespace nibble::kernels
