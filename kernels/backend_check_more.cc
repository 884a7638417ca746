// The backend checks of the AWQ statistics and loss, the clip searches and the packings.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"

namespace nibble::kernels {
namespace {

using check::Case;
using check::Body;

using check::same;

OpCheck run(const std::string& op, Backend& ref, Backend& b, const std::vector<Case>& cs, const Body& body) {
  return check::run_cases(op, ref, b, cs, body, 100);
}

std::vector<Case> select(const std::vector<Case>& cs, const std::function<bool(const Case&)>& keep) {
  std::vector<Case> out;
  for (const Case& c : cs)
    if (keep(c)) out.push_back(c);
  return out;
}

std::vector<float> to_float(const std::vector<double>& g) { return std::vector<float>(g.begin(), g.end()); }

Tensor gram_view(const std::vector<double>& g, int64_t K) { return host_view(DType::kFloat64, {K, K}, g.data()); }

// The loss checks: the Gram form and the factor form, plain and with clip ratios, two scale vectors.
std::string check_losses(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const auto gram = check::gram(300, c.K, 21);
  const auto g32 = to_float(gram);
  const Tensor g32t = host_view(DType::kFloat32, {c.K, c.K}, g32.data());
  // U from the reference (host memory, which a device uploads), and U as the backend itself left it.
  const GramFactor ur = r.gram_cholesky_upper(gram_view(gram, c.K)), ug = g.gram_cholesky_upper(gram_view(gram, c.K));
  const auto s1 = check::positive(c.K, 0.5f, 2.0f, 5), s2 = check::positive(c.K, 0.8f, 1.25f, 6);
  const std::vector<float> ratios{1.0f, 0.9f, 0.8f};
  for (int form_kind : {0, 1, 2})
    for (bool clip : {false, true}) {
      const GramForm want_form{c.K, 300, g32t, form_kind ? ur.upper : Tensor{}};
      const GramForm got_form{c.K, 300, g32t, form_kind == 1 ? ur.upper : form_kind == 2 ? ug.upper : Tensor{}};
      const auto want = r.awq_losses(w.m, {s1.data(), s2.data()}, c.spec(), want_form, clip ? &ratios : nullptr);
      const auto got = g.awq_losses(w.m, {s1.data(), s2.data()}, c.spec(), got_form, clip ? &ratios : nullptr);
      for (size_t i = 0; i < want.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 2e-4 * std::fabs(want[i])))
          return std::string(form_kind == 0 ? "Gram form" : form_kind == 1 ? "host factor" : "own factor") +
                 (clip ? " with clip ratios" : "") + ": loss " + std::to_string(got[i]) + ", reference " +
                 std::to_string(want[i]) + " (bound: relative 2e-4)";
    }
  return {};
}

std::string check_clip_gram(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const int64_t K = c.K, B = c.block, G = num_blocks(K, B);
  const auto gram = check::gram(300, K, 31);
  std::vector<double> blocks(size_t(G * B * B), 0.0);  // the block-diagonal, zero-padded
  for (int64_t gi = 0; gi < G; ++gi)
    for (int64_t i = 0; i < B && gi * B + i < K; ++i)
      for (int64_t j = 0; j < B && gi * B + j < K; ++j)
        blocks[size_t((gi * B + i) * B + j)] = gram[size_t((gi * B + i) * K + gi * B + j)];
  const auto inv_s = check::positive(K, 0.5f, 2.0f, 8);
  for (int64_t gb : {int64_t(0), B})
    for (bool scaled : {false, true})
      for (int both_up = 0; both_up < 3; ++both_up) {  // both signs or not; both, G on the backend (read there)
        const GramClipOptions opt{{1.0f, 0.9f, 0.8f, 0.7f}, both_up > 0};
        const Tensor gm = gb ? host_view(DType::kFloat64, {G, B, B}, blocks.data())
                             : host_view(DType::kFloat64, {K, K}, gram.data());
        QuantResult a, x;
        r.clip_quantize_gram(w.m, c.spec(), gm, gb, scaled ? inv_s.data() : nullptr, opt, a);
        g.clip_quantize_gram(w.m, c.spec(), both_up == 2 ? g.upload(gm) : gm, gb, scaled ? inv_s.data() : nullptr, opt,
                             x);
        for (const std::string& e : {same(a.codes, x.codes, "codes"), same(a.scales, x.scales, "scales"),
                                     same(a.zero_points, x.zero_points, "zero points")})
          if (!e.empty()) return e;
      }
  return {};
}

// Column chunks of many columns (the float chain), of one (pairwise sums: bsz_col 1, or N - 1 whose
// last chunk is one column), and of fewer columns than N; a token count that divides nothing.
std::string check_clip_modelopt(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const std::vector<double> ratios{1.0, 0.95, 0.9, 0.85, 0.8};
  for (const auto& [T, bsz] : {std::pair<int64_t, int64_t>{64, 1024}, {64, 1}, {61, c.N - 1}, {61, 16}}) {
    auto x = check::positive(T * c.K, -1.0f, 1.0f, 9);
    if (auto e = same(r.clip_search_modelopt(w.m, c.spec(), x.data(), T, ratios, bsz),
                      g.clip_search_modelopt(w.m, c.spec(), x.data(), T, ratios, bsz), "ratios");
        !e.empty())
      return e + " (T " + std::to_string(T) + ", bsz_col " + std::to_string(bsz) + ")";
  }
  return {};
}

std::string check_packs(Backend& r, Backend& g, const Case& c, const check::Weight& w, const std::string& op) {
  QuantResult q;
  r.rtn(w.m, c.spec(), q);
  if (op == "pack_onnx") {
    std::vector<uint8_t> odd(q.codes.begin(), q.codes.end() - 1);
    if (auto e = same(r.pack_onnx(odd, c.bits), g.pack_onnx(odd, c.bits), "odd count"); !e.empty()) return e;
    return same(r.pack_onnx(q.codes, c.bits), g.pack_onnx(q.codes, c.bits), "packed");
  }
  if (op == "dequantize")
    return same(r.dequantize(w.m, c.spec(), q, w.m.dtype), g.dequantize(w.m, c.spec(), q, w.m.dtype), "dequantized");
  if (op == "matmulnbits_scales") return same(r.matmulnbits_scales(w.m, q), g.matmulnbits_scales(w.m, q), "scales");
  if (op == "pack_matmulnbits_zero_points")
    return same(r.pack_matmulnbits_zero_points(w.m, c.spec(), q), g.pack_matmulnbits_zero_points(w.m, c.spec(), q),
                "zero points");
  std::vector<int64_t> layouts{c.block};
  if (q.groups == 1) layouts.push_back(128);  // a single block padded to a power of two
  // The codes also as a device quantizer brings 4-bit ones back: packed beside `codes` (read instead).
  QuantResult qp = q;
  if (c.bits == 4) qp.packed = r.pack_onnx(q.codes, 4);
  for (int64_t lb : layouts)
    for (const QuantResult* in : {&q, &qp})
      if (auto e = same(r.pack_matmulnbits_weight(w.m, c.spec(), q, lb), g.pack_matmulnbits_weight(w.m, c.spec(), *in, lb),
                        std::string("B with layout block ") + std::to_string(lb) + (in->packed.empty() ? "" : ", packed codes"));
          !e.empty())
        return e;
  return {};
}

// GPTQ on both backends from their own factors, and on the backend from the reference's factor (a host
// factor that a device uploads): the same sweep order and dampening; float32 against float64 arithmetic
// may flip a rounding tie, so at most 1 code in 500 may differ and the error within 1%.
std::string check_gptq(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const auto gram = check::gram(300, c.K, 41);
  const auto inv_s = check::positive(c.K, 0.5f, 2.0f, 43);
  GptqOptions opt;
  opt.ratios = {1.0f, 0.9f, 0.8f};
  for (bool act_order : {false, true}) {
    const GptqFactor fr = r.gptq_factor(gram_view(gram, c.K), act_order ? inv_s.data() : nullptr, 0.01, act_order);
    const GptqFactor fg = g.gptq_factor(gram_view(gram, c.K), act_order ? inv_s.data() : nullptr, 0.01, act_order);
    // G already on the backend (the layer engine's statistics) is read in place.
    const GptqFactor fu =
        g.gptq_factor(g.upload(gram_view(gram, c.K)), act_order ? inv_s.data() : nullptr, 0.01, act_order);
    if (fr.perm != fg.perm || fu.perm != fg.perm) return "sweep order differs";
    if (fr.damp != fg.damp || fr.dead != fg.dead || fu.damp != fg.damp) return "dampening or dead channels differ";
    QuantResult a;
    r.gptq_quantize(w.m, c.spec(), fr, opt, a);
    for (const GptqFactor* f : {&fg, &fr, &fu}) {
      QuantResult x;
      g.gptq_quantize(w.m, c.spec(), *f, opt, x);
      const std::string whose = f == &fg ? "own factor: " : f == &fr ? "reference's factor: " : "uploaded G's factor: ";
      size_t differ = 0;
      for (size_t i = 0; i < a.codes.size(); ++i) differ += a.codes[i] != x.codes[i];
      if (differ > a.codes.size() / 500) return whose + std::to_string(differ) + " codes differ (bound 1 in 500)";
      if (std::fabs(x.sq_error - a.sq_error) > 0.01 * a.sq_error) return whose + "sq_error beyond 1%";
    }
  }
  return {};
}

// Learned rounding from the reference's GPTQ codes, on each backend: the same codes, error and objectives
// bit for bit (rows are computed by the same function everywhere), and never a higher objective.
std::string check_learned(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const auto gram = check::gram(300, c.K, 47);
  const auto inv_s = check::positive(c.K, 0.5f, 2.0f, 49);
  GptqOptions gopt;
  gopt.ratios = {1.0f, 0.9f};
  LearnedRoundingOptions opt;
  opt.iters = 24;
  opt.lr = 0.04;
  for (const float* s : {static_cast<const float*>(nullptr), inv_s.data()}) {
    QuantResult given;
    r.gptq_quantize(w.m, c.spec(), r.gptq_factor(gram_view(gram, c.K), s, 0.01, false), gopt, given);
    QuantResult a = given, x = given;
    const Tensor gt = gram_view(gram, c.K);  // the backend reads its own copy, as the layer engine leaves it
    const LearnedRoundingStats sa = r.learned_rounding(w.m, c.spec(), gt, s, opt, a);
    const LearnedRoundingStats sx = g.learned_rounding(w.m, c.spec(), g.upload(gt), s, opt, x);
    if (auto e = same(a.codes, x.codes, "codes"); !e.empty()) return e;
    if (a.sq_error != x.sq_error) return "sq_error differs";
    if (sa.objective_given != sx.objective_given || sa.objective_learned != sx.objective_learned || sa.moved != sx.moved)
      return "objectives or moves differ";
    if (!(sa.objective_learned <= sa.objective_given)) return "the learned codes have a higher objective";
    if (a.scales != given.scales || a.zero_points != given.zero_points) return "scales or zero points changed";
  }
  return {};
}

}  // namespace

std::vector<OpCheck> check_backend_ops_part2(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  std::vector<OpCheck> out;
  const std::vector<Case> one{cs.front()};
  out.push_back(run("awq_scale", ref, b, one, [](Backend& r, Backend& g, const Case& c, const check::Weight&) {
    const auto xm = check::positive(c.K, 0.01f, 3.0f, 1), wm = check::positive(c.K, 0.05f, 1.0f, 2);
    for (double alpha : {0.0, 0.25, 0.5, 0.7, 1.0})
      if (auto e = same(r.awq_scale(xm, wm, alpha), g.awq_scale(xm, wm, alpha), "s"); !e.empty()) return e;
    return std::string();
  }));
  out.push_back(run("mean_of", ref, b, one, [](Backend& r, Backend& g, const Case& c, const check::Weight&) {
    std::vector<std::vector<float>> v;
    for (uint32_t j = 0; j < 11; ++j) v.push_back(check::positive(c.K, 0.0f, 2.0f, 40 + j));
    for (size_t m : {size_t(1), size_t(3), size_t(11)}) {
      std::vector<const std::vector<float>*> p;
      for (size_t j = 0; j < m; ++j) p.push_back(&v[j]);
      if (auto e = same(r.mean_of(p), g.mean_of(p), "mean"); !e.empty()) return e;
    }
    return std::string();
  }));
  out.push_back(run("gram_cholesky_upper", ref, b, one, [](Backend&, Backend& g, const Case& c, const check::Weight&) {
    const int64_t K = c.K;
    const auto gram = check::gram(300, K, 3);
    const GramFactor f = g.gram_cholesky_upper(gram_view(gram, K));
    if (!f.ok() || f.upper.elements() != K * K) return std::string("no factor");
    const std::vector<uint8_t> bytes = g.download(f.upper);
    // G already on the backend (the layer engine's statistics) is read in place: the same factor.
    const GramFactor fr = g.gram_cholesky_upper(g.upload(gram_view(gram, K)));
    if (!fr.ok() || g.download(fr.upper) != bytes) return std::string("the factor of the uploaded G differs");
    std::vector<float> u(size_t(K * K));
    std::memcpy(u.data(), bytes.data(), u.size() * 4);
    double gmax = 0;
    for (int64_t k = 0; k < K; ++k) gmax = std::max(gmax, gram[size_t(k * K + k)]);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double utu = 0;
        for (int64_t m = 0; m <= std::min(i, j); ++m) utu += double(u[size_t(m * K + i)]) * double(u[size_t(m * K + j)]);
        if ((j < i && u[size_t(i * K + j)] != 0.0f) || std::fabs(utu - gram[size_t(i * K + j)]) > 2e-6 * gmax)
          return "UᵀU differs from G at " + std::to_string(i) + "," + std::to_string(j) + " (bound 2e-6 of max G_kk)";
      }
    std::vector<double> zero(size_t(K * K), 0.0);
    return g.gram_cholesky_upper(gram_view(zero, K)).ok() ? std::string("factor of a zero matrix") : std::string();
  }));
  out.push_back(run("channel_energy", ref, b, one, [](Backend& r, Backend& g, const Case& c, const check::Weight&) {
    const auto gram = check::gram(50, c.K, 4);
    const auto s = check::positive(c.K, 0.5f, 2.0f, 3);
    const Tensor up = g.upload(gram_view(gram, c.K));  // read where it is, as the host's
    for (const float* sp : {static_cast<const float*>(nullptr), s.data()}) {
      const auto want = r.channel_energy(gram_view(gram, c.K), sp);
      if (auto e = same(want, g.channel_energy(gram_view(gram, c.K), sp), "energy"); !e.empty()) return e;
      if (auto e = same(want, g.channel_energy(up, sp), "energy of the uploaded G"); !e.empty()) return e;
    }
    return std::string();
  }));
  out.push_back(run("awq_losses", ref, b, select(cs, [](const Case& c) { return c.K == 200; }), check_losses));
  out.push_back(run("clip_search_modelopt", ref, b,
                    select(cs, [](const Case& c) { return !c.zero_point && c.bits == 4; }), check_clip_modelopt));
  out.push_back(run("clip_quantize_gram", ref, b, cs, check_clip_gram));
  // One check covers both GPTQ operations (a factor is only observable through its sweep).
  const auto gptq_cases = select(cs, [](const Case& c) { return c.K == 200 && c.bits == 4; });
  OpCheck gptq = run("gptq_factor", ref, b, gptq_cases, check_gptq);
  out.push_back(gptq);
  gptq.op = "gptq_quantize";
  out.push_back(std::move(gptq));
  out.push_back(run("learned_rounding", ref, b, gptq_cases, check_learned));
  for (const char* op :
       {"pack_onnx", "pack_matmulnbits_weight", "matmulnbits_scales", "pack_matmulnbits_zero_points", "dequantize"}) {
    const std::string name = op;
    const auto keep =
        name == "pack_matmulnbits_zero_points" ? select(cs, [](const Case& c) { return c.zero_point; }) : cs;
    out.push_back(run(name, ref, b, keep, [name](Backend& r, Backend& g, const Case& c, const check::Weight& w) {
      return check_packs(r, g, c, w, name);
    }));
  }
  return out;
}

}  // namespace nibble::kernels
