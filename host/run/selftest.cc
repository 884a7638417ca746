// `nibble selftest`: every backend operation of the chosen device on generated data against the
// CPU reference kernels, one line per operation. On a GPU this is what checks the GPU-only adapters
// (CUDA runtime copies, launches, cuBLAS, cuSOLVER) that CI can only compile.
#include <chrono>
#include <cstdio>

#include "host/run/pipeline.h"
#include "host/text.h"
#include "kernels/backend_check.h"

namespace nibble {

namespace {

// The transfer ledger of the checks, one line per operation: what each moved and launched.
void print_ledger(const kernels::TransferLedger& l) {
  std::printf("transfer ledger (all checks):\n  %-30s %6s %12s %12s %7s %9s  %s\n", "operation", "calls", "to device",
              "to host", "allocs", "launches", "where");
  auto line = [](const std::string& name, const kernels::OpTransfers& t) {
    std::printf("  %-30s %6llu %12s %12s %7llu %9llu  %s\n", name.c_str(), (unsigned long long)t.calls,
                human_bytes(t.h2d_bytes).c_str(), human_bytes(t.d2h_bytes).c_str(), (unsigned long long)t.allocations,
                (unsigned long long)t.launches, t.host_fallback ? "host" : "device");
  };
  for (const auto& [name, t] : l.ops) line(name, t);
  line("total", l.total);  // "host" here: at least one operation ran on the host
}

}  // namespace

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
  if (const kernels::TransferLedger* l = backend->transfer_ledger()) print_ledger(*l);
  return failed ? 1 : 0;
}

}  // namespace nibble
