// AWQ clip search on the CPU: per block, the clip ratio r of the symmetric scale
// r * amax / qmax that minimises the block's output error.
//
//   modelopt  ModelOpt 0.47's _clip_search, float32 arithmetic in numpy's order: on a token sample
//             X [T, K] (64..127 rows), per-block partial products P[n, t, g] = Σ_i x[t, gB+i] w[gB+i, n]
//             (numpy's pairwise sum over the block), loss = mean_t (P_ref - P_r)², first strictly
//             smaller loss in ascending r wins (1.0 when none is smaller);
//   gram      nibble: the loss of block b of column n is d_bᵀ G_bb d_b with d_b = w_b - ŵ_b(r) and G_bb
//             the block's diagonal sub-matrix of G = XᵀX over every calibration token (optionally
//             scaled by 1/(s_i s_j) when W ⊙ s is quantized and X ⊘ s meets it); one sgemm per
//             candidate and block row, only the searched block re-quantized.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/quant_types.h"

namespace nibble::kernels {

// ModelOpt's _clip_search of weight `w` (stored layout, values in w.dtype) on the token rows `x`
// ([T, K] float32, row-major). Returns the chosen ratio of every block, [N * G] (index n * G + g),
// as the float ModelOpt's best_alpha array holds (the ratio rounded to w.dtype). bsz_col: ModelOpt's
// column chunk (--awqclip_bsz_col), which decides numpy's summation order for a chunk of one column.
std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x, int64_t T,
                                        const std::vector<double>& ratios, int64_t bsz_col = 1024);

// Symmetric RTN with a clip ratio per block (ratio_ng [N * G], index n * G + g): ModelOpt's
// quant_tensor(W, block, alpha = best_alpha): s = max((amax * r) / qmax, 1e-5) in w.dtype.
void rtn_quantize_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out);

// nibble's clip search, the reference: every block picks, among `opt.ratios` (x2 with both signs;
// zero-point mode scales the block's [min, max]), the candidate with the smallest d_bᵀ G_bb d_b,
// G = gram (float64, row-major) scaled by inv_s[i] * inv_s[j] when inv_s is given and then rounded to
// float32, the sum in float64. A candidate replaces the best only when strictly smaller. Codes,
// scales and zero points as rtn_quantize_ref lays them out; scales rounded to scale_type(spec,
// w.dtype). chosen (optional): the ratio picked per block, [N * G], negative when the scale was
// negated. gram_block = 0: gram is the whole K x K matrix; = spec.block: only its block-diagonal,
// [G, B, B] (block g at gram + g * B * B, the last block zero-padded), as calibration keeps it.
void clip_quantize_gram_ref(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                            const float* inv_s, const GramClipOptions& opt, QuantResult& out,
                            std::vector<float>* chosen = nullptr);

}  // namespace nibble::kernels
