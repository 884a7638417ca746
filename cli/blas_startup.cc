#include "cli/blas_startup.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

extern "C" char* openblas_get_corename(void);  // OpenBLAS, linked through the kernels

namespace nibble {
namespace {

// 2: AVX-512 sgemm kernels; 1: AVX2/FMA; 0: older.
int rank_of(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const char* c : {"skylakex", "cooperlake", "sapphirerapids"})
    if (core == c) return 2;
  for (const char* c : {"haswell", "zen", "skylake"})
    if (core == c) return 1;
  return 0;
}

const char* best_core() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

void reexec_for_better_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or already re-executed
  const char* best = best_core();
  const char* current = openblas_get_corename();
  if (best == nullptr || rank_of(best) <= rank_of(current ? current : "")) return;
  if (setenv("OPENBLAS_CORETYPE", best, 1) != 0) return;
  execv("/proc/self/exe", argv);
  // No /proc or exec refused: carry on with OpenBLAS's own choice (slower, same results).
}

}  // namespace nibble
