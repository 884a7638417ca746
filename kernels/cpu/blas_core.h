// Which OpenBLAS kernel set runs (for the log). Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not
// know recent CPUs (Sapphire Rapids, Zen 4) and falls back to its SSE3 "Prescott" kernels; the CLI
// fixes that at start-up (cli/blas_startup.h).
#pragma once
#include <string>

namespace nibble::kernels {

// What OpenBLAS runs with, e.g. "SkylakeX".
std::string blas_core_name();

}  // namespace nibble::kernels
