// The CPU implementations of the kernels interface. Only the backend selector (kernels/backend.cc)
// and the tests name them.
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace nibble::kernels {

// The fast CPU kernels (SIMD, threads, OpenBLAS), each tested against its reference.
std::unique_ptr<Backend> make_cpu_backend();

// The plain scalar references (`*_ref`), the definition every backend is compared with: slow, for
// tests and `nibble selftest`.
std::unique_ptr<Backend> make_reference_backend();

}  // namespace nibble::kernels
