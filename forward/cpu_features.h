// What the CPU can run, asked once: the host's vector versions of the engine's element-wise kernels
// (forward/half_rows.cc, logistic_rows.cc, softmax_rows.cc) run where these say yes, their scalar
// definitions elsewhere.
#pragma once

namespace nibble::forward {

inline bool cpu_has_avx2_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return yes;
}

inline bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace nibble::forward
