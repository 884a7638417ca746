#include "kernels/cpu/blas_core.h"

#include <cblas.h>

namespace nibble::kernels {

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? n : "unknown";
}

}  // namespace nibble::kernels
