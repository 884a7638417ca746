#include "kernels/backend_check.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "kernels/backend_check_data.h"
#include "kernels/cpu/cpu_backend.h"

namespace nibble::kernels {
namespace {

using check::Case;

// Bitwise equality of two arrays (floats compared as bits: -0 and NaN payloads count).
using check::same;

std::string close(double want, double got, double rel, const std::string& what) {
  if (std::fabs(got - want) <= rel * std::fabs(want) || (want == 0 && got == 0)) return {};
  return what + ": " + std::to_string(got) + ", reference " + std::to_string(want) + " (bound: relative " +
         std::to_string(rel) + ")";
}

// Plain RTN sums an fp16 weight's block errors in float: a device's [N, K] layout adds its lanes' partial
// sums, another order, each within (block - 1) float roundings of the exact sum (backend_check.h).
constexpr double kPlainRtnErrorBound = 2e-4;

std::string same_quant(const QuantResult& want, const QuantResult& got, double error_bound = 1e-12) {
  if (want.groups != got.groups) return "groups differ";
  for (const std::string& e : {same(want.codes, got.codes, "codes"), same(want.scales, got.scales, "scales"),
                               same(want.zero_points, got.zero_points, "zero points"),
                               same(want.float_zero_points, got.float_zero_points, "float zero points"),
                               close(want.sq_error, got.sq_error, error_bound, "sq_error")})
    if (!e.empty()) return e;
  return {};
}

// One check: runs `body` per case, stopping at the first difference (labelled with the case).
using check::Body;

OpCheck run(const std::string& op, Backend& ref, Backend& b, const std::vector<Case>& cs, const Body& body) {
  return check::run_cases(op, ref, b, cs, body, 1);
}

std::vector<Case> symmetric_only(const std::vector<Case>& cs) {
  std::vector<Case> out;
  for (const Case& c : cs)
    if (!c.zero_point) out.push_back(c);
  return out;
}

std::vector<Case> zero_point_only(const std::vector<Case>& cs) {
  std::vector<Case> out;
  for (const Case& c : cs)
    if (c.zero_point) out.push_back(c);
  return out;
}

}  // namespace

const std::vector<std::string>& backend_op_names() {
  static const std::vector<std::string> names = {
#define NIBBLE_BACKEND_OP(name, result, params) #name,
#include "kernels/backend_ops.inc"
#undef NIBBLE_BACKEND_OP
  };
  return names;
}

std::vector<OpCheck> check_backend_tensors(Backend& ref, Backend& b, const std::vector<Case>& cs);
std::vector<OpCheck> check_backend_statistics(Backend& ref, Backend& b, const std::vector<Case>& cs);
std::vector<OpCheck> check_backend_forward(Backend& ref, Backend& b, const std::vector<Case>& cs);
std::vector<OpCheck> check_backend_ops_part1(Backend& ref, Backend& b, const std::vector<Case>& cs);
std::vector<OpCheck> check_backend_ops_part2(Backend& ref, Backend& b, const std::vector<Case>& cs);
std::vector<OpCheck> check_backend_layer_round(Backend& ref, Backend& b, const std::vector<Case>& cs);

std::vector<OpCheck> check_backend_ops(Backend& b) {
  auto ref = make_reference_backend();
  const std::vector<Case> cs = check::cases();
  std::vector<OpCheck> out = check_backend_tensors(*ref, b, cs);
  for (auto* part : {&check_backend_statistics, &check_backend_forward, &check_backend_ops_part1, &check_backend_ops_part2,
                     &check_backend_layer_round})
    for (OpCheck& c : part(*ref, b, cs)) out.push_back(std::move(c));
  return out;
}

// ---- quantization and scaling
std::vector<OpCheck> check_backend_ops_part1(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  std::vector<OpCheck> out;
  out.push_back(run("rtn", ref, b, cs, [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
    for (RtnArithmetic how : {RtnArithmetic::kModelOpt, RtnArithmetic::kOnnxRuntime}) {
      QuantSpec spec = c.spec();
      spec.rtn_arithmetic = how;
      QuantResult a, x;
      r.rtn(w.m, spec, a);
      g.rtn(w.m, spec, x);
      if (auto e = same_quant(a, x, kPlainRtnErrorBound); !e.empty()) return e;
      // QuantResult::pack: at 4 bits the same codes in ONNX INT4 bytes alone, else as unasked.
      QuantResult ap, xp;
      ap.pack = xp.pack = true;
      r.rtn(w.m, spec, ap);
      g.rtn(w.m, spec, xp);
      if (auto e = same_quant(ap, xp, kPlainRtnErrorBound); !e.empty()) return "pack: " + e;
      if (c.bits == 4) {
        if (!ap.codes.empty() || !xp.codes.empty()) return std::string("pack: codes not left empty");
        if (auto e = same(r.pack_onnx(a.codes, 4), ap.packed, "reference's packed"); !e.empty()) return "pack: " + e;
        if (auto e = same(ap.packed, xp.packed, "packed"); !e.empty()) return "pack: " + e;
      } else if (auto e = same(a.codes, xp.codes, "codes"); !e.empty()) {
        return "pack at 8 bits: " + e;
      }
    }
    return std::string();
  }));
  out.push_back(run("rtn_weighted", ref, b, cs, [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
    const auto cw = check::positive(c.K, 0.1f, 4.0f, 7);
    const std::vector<float> ratios{1.0f, 0.95f, 0.9f, 0.8f, 0.7f};
    for (DType st : {DType::kUndefined, DType::kFloat16}) {  // scales in the data's type, or rounded to fp16
      QuantSpec spec = c.spec();
      spec.scale_dtype = st;
      QuantResult a, x;
      r.rtn_weighted(w.m, spec, cw.data(), ratios, a);
      g.rtn_weighted(w.m, spec, cw.data(), ratios, x);
      if (auto e = same_quant(a, x); !e.empty()) return e;
    }
    return std::string();
  }));
  out.push_back(run("rtn_ratios", ref, b, symmetric_only(cs),
                    [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
                      const int64_t G = num_blocks(c.K, c.block);
                      std::vector<float> ratio(size_t(c.N * G));
                      for (size_t i = 0; i < ratio.size(); ++i) ratio[i] = 1.0f - 0.05f * float(i % 7);
                      QuantResult a, x;
                      r.rtn_ratios(w.m, c.spec(), ratio.data(), a);
                      g.rtn_ratios(w.m, c.spec(), ratio.data(), x);
                      return same_quant(a, x);
                    }));
  out.push_back(run("rtn_lsq", ref, b, cs, [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
    for (FitWeight how : {FitWeight::kUniform, FitWeight::kSquare, FitWeight::kMagnitude})
      for (DType st : {DType::kUndefined, DType::kFloat16}) {
        QuantSpec spec = c.spec();
        spec.scale_dtype = st;
        RtnSearchOptions opt;
        opt.weight = how;
        QuantResult a, x;
        r.rtn_lsq(w.m, spec, opt, a);
        g.rtn_lsq(w.m, spec, opt, x);
        if (auto e = same_quant(a, x); !e.empty()) return e;
      }
    return std::string();
  }));
  out.push_back(run("hqq", ref, b, zero_point_only(cs), [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
    for (bool float_zero_point : {false, true})
      for (bool refit : {false, true}) {
        HqqOptions opt;
        opt.refit_scale = refit;
        opt.float_zero_point = float_zero_point;
        QuantResult a, x;
        r.hqq(w.m, c.spec(), opt, a);
        g.hqq(w.m, c.spec(), opt, x);
        if (auto e = same_quant(a, x); !e.empty()) return e;
      }
    return std::string();
  }));
  // The scaled weight as each backend left it, brought back; and the device's copy read by its own RTN.
  using Scale = WeightMatrix (Backend::*)(const WeightMatrix&, const float*);
  const std::pair<const char*, Scale> scalings[] = {{"scale_weight", &Backend::scale_weight},
                                                    {"scale_weight_f32", &Backend::scale_weight_f32}};
  for (const auto& [name, fn] : scalings)
    out.push_back(run(name, ref, b, symmetric_only(cs), [&](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
      const auto s = check::positive(c.K, 0.3f, 3.0f, 11);
      const WeightMatrix a = (r.*fn)(w.m, s.data()), x = (g.*fn)(w.m, s.data());
      if (auto e = same(r.download(a.tensor()), g.download(x.tensor()), name); !e.empty()) return e;
      QuantResult qa, qx;
      r.rtn(a, c.spec(), qa);
      g.rtn(x, c.spec(), qx);
      return same_quant(qa, qx, kPlainRtnErrorBound);
    }));
  out.push_back(run("divide_columns", ref, b, symmetric_only(cs),
                    [&](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
                      const auto d = check::positive(c.N, 0.3f, 3.0f, 11);
                      return same(r.divide_columns(w.m, d.data()), g.divide_columns(w.m, d.data()), "divided");
                    }));
  out.push_back(run("awq_weight_mean", ref, b, symmetric_only(cs),
                    [](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
                      for (bool contiguous : {false, true})
                        if (auto e = same(r.awq_weight_mean(w.m, c.block, contiguous),
                                          g.awq_weight_mean(w.m, c.block, contiguous), "mean");
                            !e.empty())
                          return e;
                      return std::string();
                    }));
  // Two siblings side by side; block 8 divides K * sum N for every case (K is a multiple of 8).
  out.push_back(run("awq_weight_mean_joint", ref, b, symmetric_only(cs),
                    [](Backend& r, Backend& g, const Case&, const check::Weight& w) {
                      const std::vector<WeightMatrix> sib = {w.m, w.m};
                      return same(r.awq_weight_mean_joint(sib, 8), g.awq_weight_mean_joint(sib, 8), "mean");
                    }));
  return out;
}

}  // namespace nibble::kernels
