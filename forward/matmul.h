// C[M, N] = A[M, K] · op(B) in float32, row-major, B [K, N] (or [N, K] when b_transposed): the one dense
// product of the engine. matmul_ref is the definition (each output a float32 sum in k order);
// matmul_blas is OpenBLAS's sgemm on the calling thread, the same products summed in its own order
// (tests/unit/test_forward.cc bounds the difference); matmul_parallel is matmul_blas over fixed panels on
// the worker threads.
//
// Why nibble's threads and not OpenBLAS's: OpenBLAS's idle workers spin between products while nibble's
// threads run the element-wise operators (a quarter of a pass's samples, measured), and the CPU backend's
// search makes OpenBLAS single-threaded anyway (its bits must not depend on the thread count), which left
// every product after the first search on one core. The engine therefore keeps OpenBLAS on one thread too
// and cuts each product itself.
#pragma once
#include <cstdint>

#include "forward/buffer_pool.h"
#include "kernels/dtype.h"

namespace nibble::forward {

//
// k_slice: K summed in slices of that many products, each slice's sum added to the slices' before it
// (kernels::forward_k_slice: ONNX Runtime's order); 0: K in one slice.
void matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);
void matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed,
                 int64_t k_slice);

// The panels of matmul_parallel: rows of C (M / 4 rounded up to 64, within 64 to 512) by columns (all of
// them up to 2048, else 1024), a function of the shape alone, so the panels, and with them every output's
// bits, never depend on --threads.
int64_t panel_rows(int64_t M);
int64_t panel_columns(int64_t N);
void matmul_parallel(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed,
                     int64_t k_slice);

// OpenBLAS on one thread (the caller's), for the whole process; idempotent.
void use_single_threaded_blas();

// The products a run computes, for the report's arithmetic rate: FLOPs (2·M·K·N each) and wall seconds.
struct ProductMeter {
  double flop = 0.0, seconds = 0.0;
};
// C[M, N] = A · B for B [K, N] of fp16/bf16 (b_type): each group of matmul_parallel's column panels is
// widened into `scratch` just before its products, so the panels, their sgemm calls and every output's
// bits are matmul_parallel's on B widened whole (a weight's K slices), without B's float32 copy (a 7B MLP weight: 180 MB
// written and read back per product, and its pages faulted in). `meter` counts the widening with the products, as
// a float32 weight's product counts reading its 4-byte values: on 7B-layer shapes the whole of this call took
// 0.77-1.02x the time of matmul_parallel on B already widened (bench/kernel_widening.cc).
void matmul_widening(ProductMeter* meter, const float* A, DType b_type, const uint16_t* B, float* C, int64_t M,
                     int64_t K, int64_t N, Floats& scratch);

// matmul_parallel, counted in `meter` where it is non-null.
void matmul_counted(ProductMeter* meter, const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N,
                    bool b_transposed, int64_t k_slice);

}  // namespace nibble::forward
