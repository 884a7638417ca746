// `nibble selftest`: every backend operation of the chosen device on generated data against the
// CPU reference kernels, one line per operation. On a GPU this is what checks the GPU-only adapters
// (CUDA runtime copies, launches, cuBLAS, cuSOLVER) that CI can only compile.
#include <chrono>
#include <cstdio>

#include "host/run/pipeline.h"
#include "host/text.h"
#include "kernels/backend_check.h"

namespace nibble {

int run_selftest(kernels::Device device, uint64_t device_memory) {
  std::string why;
  auto backend = kernels::make_backend(kernels::BackendOptions{device, device_memory}, &why);
  std::printf("selftest: %s\n%s\n", why.c_str(), backend->describe().c_str());
  const auto t0 = std::chrono::steady_clock::now();
  int failed = 0;
  const auto checks = kernels::check_backend_ops(*backend);
  for (const kernels::OpCheck& c : checks) {
    if (c.passed()) {
      std::printf("PASS  %-30s %d cases\n", c.op.c_str(), c.cases);
    } else {
      ++failed;
      std::printf("FAIL  %-30s %s\n", c.op.c_str(), c.error.c_str());
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const kernels::DeviceMemoryUse m = backend->device_memory();
  std::printf("%s: %zu operations, %d failed, %.1f s", backend->name().c_str(), checks.size(), failed, secs);
  if (m.budget) std::printf(", peak device memory %s", human_bytes(m.peak).c_str());
  std::printf("\n");
  return failed ? 1 : 0;
}

}  // namespace nibble
