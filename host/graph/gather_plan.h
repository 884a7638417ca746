// Embedding tables: the constant 2-D data of Gather nodes, quantized when --gather_quantize_axis
// is given (make_plan calls these after it has planned the MatMul/Gemm weights).
#pragma once
#include "host/graph/plan.h"

namespace nibble {

// Adds every Gather whose data is a constant 2-D float initializer to plan.gathers (nodes sharing
// one table grouped), records why any other constant-data Gather is left alone, and works out
// which tables something else still reads as float.
void plan_gathers(const OnnxModel& model, const PlanOptions& options, const Excludes& excludes, Plan& plan);

// Sets tied_to of each planned table whose values a planned MatMul/Gemm weight also holds: the same
// initializer read as [N, K] (Gemm transB), or a [K, N] initializer equal to the table's transpose
// (ORT-GenAI and SmolLM2's exports tie lm_head to the embedding that way). Compares the data.
void find_tied_tables(OnnxModel& model, Plan& plan);

// Without --gather_quantize_axis: one skipped entry per constant-table Gather, saying it stays float.
void note_float_gathers(const OnnxModel& model, Plan& plan);

}  // namespace nibble
