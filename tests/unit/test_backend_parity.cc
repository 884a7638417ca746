// Backend selection, and every backend against the reference kernels on the same inputs.
// (The CUDA backend's kernels land with issue 6; this file is where their parity tests go.)
#include <gtest/gtest.h>

#include <random>

#include "kernels/backend.h"
#include "kernels/cpu/rtn_ref.h"

using namespace nibble;
using namespace nibble::kernels;

TEST(Backend, CpuIsChosenWhenAsked) {
  std::string why;
  auto b = make_backend(Device::kCpu, &why);
  EXPECT_EQ(b->name(), "cpu");
  EXPECT_NE(why.find("cpu"), std::string::npos);
}

TEST(Backend, AutoFallsBackToCpuWithAReason) {
  std::string why;
  auto b = make_backend(Device::kAuto, &why);
  EXPECT_EQ(b->name(), "cpu");  // no CUDA kernels yet, on any machine
  EXPECT_NE(why.find("using CPU"), std::string::npos);
  EXPECT_THROW(make_backend(Device::kCuda, nullptr), std::runtime_error);
}

TEST(Backend, CpuBackendEqualsReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const int64_t K = 200, N = 37;
    std::vector<uint16_t> h(size_t(K * N));
    std::vector<float> f(size_t(K * N));
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = d(rng);
      h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
    }
    WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), K, N, 0};
    for (bool zp : {false, true}) {
      QuantSpec spec{4, 64, zp};
      QuantResult ref, got;
      rtn_quantize_ref(w, spec, ref);
      make_cpu_backend()->rtn(w, spec, got);
      EXPECT_EQ(ref.codes, got.codes);
      EXPECT_EQ(ref.scales, got.scales);
      // Scales are representable in the weight dtype.
      for (float s : got.scales) ASSERT_EQ(round_to(t, s), s);
    }
  }
}
