#include "host/algo/learned_rounding.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>

namespace nibble {
namespace {

std::mutex totals_mutex;
LearnedRoundingTotals totals;

}  // namespace

kernels::LearnedRoundingOptions learned_rounding_options(const QuantizeOptions& o) {
  kernels::LearnedRoundingOptions opt;
  opt.iters = o.learned_iters;
  opt.lr = o.learned_lr;
  opt.percdamp = o.gptq_percdamp;
  return opt;
}

void learn_rounding(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                    const kernels::Tensor& gram, const float* inv_s, const kernels::LearnedRoundingOptions& opt,
                    kernels::QuantResult& q) {
  const auto t0 = std::chrono::steady_clock::now();
  const kernels::LearnedRoundingStats st = backend.learned_rounding(w, spec, gram, inv_s, opt, q);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::debug("learned rounding: objective {:.6g} -> {:.6g} ({} codes moved, {:.2f} s)", st.objective_given,
                st.objective_learned, st.moved, secs);
  const std::lock_guard<std::mutex> lock(totals_mutex);
  totals.objective_gptq += st.objective_given;
  totals.objective_learned += st.objective_learned;
  totals.codes_moved += st.moved;
  totals.weights += 1;
  totals.seconds += secs;
}

LearnedRoundingTotals learned_rounding_totals() {
  const std::lock_guard<std::mutex> lock(totals_mutex);
  return totals;
}

}  // namespace nibble
