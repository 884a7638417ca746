#include "kernels/cpu/learned_rounding_cpu.h"

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

// Rows in chunks of a fixed size (kernels/parallel.h: the same chunks whatever the thread count); the
// statistics summed in row order.
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
  constexpr int64_t kRowsPerChunk = 8;
  auto chunk = [&](int64_t c) {
    RowArrays a(K);
    const learned::Row row = a.row(K);
    for (int64_t n = c * kRowsPerChunk; n < N && n < (c + 1) * kRowsPerChunk; ++n)
      stats[size_t(n)] = learned::learn_row(p, n, q.codes.data(), given.data(), row);
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
