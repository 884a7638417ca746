// Process start-up for OpenBLAS's kernel choice. Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not
// know recent CPUs (Sapphire Rapids, Zen 4) and falls back to its SSE3 "Prescott" kernels: measured on
// this project's 2-core VM, single-threaded sgemm 1536x1536x576 runs at 31 GFLOP/s as Prescott, 78 as
// Haswell and 146 as SkylakeX, and the AWQ loss is mostly sgemm. OpenBLAS reads OPENBLAS_CORETYPE
// only in its library constructor, before main() (and before an executable's .preinit_array: tried),
// so the only fix from inside the program is to set it and re-execute.
#pragma once

namespace nibble {

// When the user has not set OPENBLAS_CORETYPE and OpenBLAS picked a weaker kernel set than the CPU
// supports, sets it and re-executes /proc/self/exe with the same argv (same PID). Returns only when
// no re-exec was needed or possible.
void reexec_for_better_blas(char** argv);

}  // namespace nibble
