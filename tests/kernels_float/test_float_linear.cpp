// FloatLinear vs a float64 oracle: every path (reference, AVX2 and AVX-512 GEMV, library GEMM),
// f32/f16/bf16 weights, unaligned M/N/K, bias; plus which kernel is selected on this machine.
#include <cmath>
#include <string>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/float_linear.h"
#include "kernels_float/test_util.h"

namespace perry::kernels {
namespace {

using test::available_isas;
using test::isa_name;
using test::IsaScope;
using test::random_floats;

struct Weights {
  std::vector<float> f32;      // the exact values the kernel sees
  std::vector<uint16_t> half;  // storage for F16 / BF16
  const void* ptr(DType t) const { return t == DType::F32 ? (const void*)f32.data() : (const void*)half.data(); }
};

Weights make_weights(DType t, int64_t N, int64_t K, uint32_t seed) {
  Weights w;
  w.f32 = random_floats(size_t(N * K), seed);
  if (t != DType::F32) {
    w.half.resize(w.f32.size());
    for (size_t i = 0; i < w.f32.size(); ++i) {
      w.half[i] = t == DType::BF16 ? f32_to_bf16(w.f32[i]) : f32_to_f16(w.f32[i]);
      w.f32[i] = t == DType::BF16 ? bf16_to_f32(w.half[i]) : f16_to_f32(w.half[i]);
    }
  }
  return w;
}

struct ForceRef {
  ForceRef() { set_float_linear_force_reference(true); }
  ~ForceRef() { set_float_linear_force_reference(false); }
};

// Checks y against sum_k xq[m,k] * w[n,k] (+ bias) in float64, where xq is x as the kernel uses it
// (rounded to bf16 on the oneDNN bf16 path, exact otherwise). The remaining error is fp32
// accumulation: blocked sums of K products with 16-lane partial sums stay below ~(K/16 + 10) ulp of
// sum |x w|; 2e-5 * sum|x w| bounds that for K <= 1000 with margin, and still catches a single
// dropped or doubled term (which is ~1/K of sum |x w| >= 1e-3).
void check(const std::vector<float>& y, const std::vector<float>& x, const Weights& w, const float* bias,
           int64_t M, int64_t N, int64_t K, bool x_bf16, const std::string& what) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? bias[n] : 0.0, mag = bias ? std::abs(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double xv = x_bf16 ? bf16_to_f32(f32_to_bf16(x[m * K + k])) : x[m * K + k];
        s += xv * w.f32[n * K + k];
        mag += std::abs(xv * w.f32[n * K + k]);
      }
      ASSERT_NEAR(y[m * N + n], s, 2e-5 * mag + 1e-30) << what << " m=" << m << " n=" << n;
    }
  }
}

struct Shape {
  int64_t M, N, K;
};
// {1, 21, 4500}: M = 1 with K above the row-sequential limit (8-row tiles + 5 leftover rows).
const Shape kShapes[] = {{1, 1, 1}, {1, 21, 4500}, {1, 3, 17},   {1, 130, 63},  {3, 17, 130},  {4, 63, 1000},
                         {5, 130, 17}, {17, 63, 130}, {63, 17, 3}, {130, 130, 1000}, {2, 300, 64}};

TEST(FloatLinear, MatchesFloat64EveryPathAndDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (IsaLevel isa : available_isas()) {
      IsaScope scope(isa);
      for (bool force_ref : {false, true}) {
        if (force_ref && isa != available_isas().back()) continue;  // the flag overrides any ISA
        std::unique_ptr<ForceRef> fr = force_ref ? std::make_unique<ForceRef>() : nullptr;
        for (const auto& s : kShapes) {
          auto w = make_weights(dt, s.N, s.K, uint32_t(s.N * 31 + s.K));
          auto x = random_floats(size_t(s.M * s.K), uint32_t(s.M * 7 + s.K), -2, 2);
          auto bias = random_floats(size_t(s.N), 99);
          FloatLinear lin(w.ptr(dt), dt, s.N, s.K);
          const std::string name = lin.kernel_name(s.M);
          const bool x_bf16 = name.find("onednn") != std::string::npos;
          const std::string what = std::string(dtype_name(dt)) + " " + isa_name(isa) + " " + name + " M=" +
                                   std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
          std::vector<float> y(size_t(s.M * s.N), -7.0f);
          lin.forward(x.data(), s.M, y.data());
          check(y, x, w, nullptr, s.M, s.N, s.K, x_bf16, what);
          lin.forward(x.data(), s.M, y.data(), bias.data());
          check(y, x, w, bias.data(), s.M, s.N, s.K, x_bf16, what + " +bias");
          if (force_ref || isa == IsaLevel::Scalar) {
            ASSERT_EQ(name.rfind("reference", 0), 0u) << name;
          }
        }
      }
    }
  }
}

TEST(FloatLinear, EveryPrefillBackend) {
  // Each library path on its own (the table picks one per dtype; the others must stay correct).
  for (FloatGemm g : {FloatGemm::OpenBlas, FloatGemm::OneDnn}) {
    set_float_linear_gemm(g);
    set_float_linear_gemv_max_m(0);  // every M > 0 goes to the library
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      for (const auto& s : kShapes) {
        auto w = make_weights(dt, s.N, s.K, uint32_t(s.N + 3 * s.K));
        auto x = random_floats(size_t(s.M * s.K), uint32_t(s.M + s.K), -2, 2);
        auto bias = random_floats(size_t(s.N), 17);
        FloatLinear lin(w.ptr(dt), dt, s.N, s.K);
        const std::string name = lin.kernel_name(s.M);
        EXPECT_EQ(name.find("gemv"), std::string::npos) << name;
        std::vector<float> y(size_t(s.M * s.N));
        lin.forward(x.data(), s.M, y.data(), bias.data());
        check(y, x, w, bias.data(), s.M, s.N, s.K, name.find("onednn") != std::string::npos,
              name + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
      }
    }
  }
  set_float_linear_gemm(FloatGemm::Auto);
  set_float_linear_gemv_max_m(-1);
}

TEST(FloatLinear, GemvForLargerM) {
  // The GEMV handles any M (x rows in groups of 4 per weight pass): check M = 5..9 against float64.
  set_float_linear_gemv_max_m(1 << 20);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (IsaLevel isa : available_isas()) {
      IsaScope scope(isa);
      for (int64_t M : {5, 6, 7, 9}) {
        const int64_t N = 23, K = 77;
        auto w = make_weights(dt, N, K, uint32_t(M));
        auto x = random_floats(size_t(M * K), uint32_t(M + 1), -2, 2);
        FloatLinear lin(w.ptr(dt), dt, N, K);
        std::vector<float> y(size_t(M * N));
        lin.forward(x.data(), M, y.data());
        check(y, x, w, nullptr, M, N, K, false, lin.kernel_name(M));
      }
    }
  }
  set_float_linear_gemv_max_m(-1);
}

TEST(FloatLinear, LlamaShapesSpotCheck) {
  // A real layer width (K = 2048) through the prefill GEMM and the decode GEMV, spot-checked rows.
  const int64_t N = 96, K = 2048;
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    auto w = make_weights(dt, N, K, 5);
    FloatLinear lin(w.ptr(dt), dt, N, K);
    for (int64_t M : {1, 65}) {
      auto x = random_floats(size_t(M * K), uint32_t(M), -2, 2);
      std::vector<float> y(size_t(M * N));
      lin.forward(x.data(), M, y.data());
      const bool x_bf16 = lin.kernel_name(M).find("onednn") != std::string::npos;
      // K = 2048: the accumulation bound grows to ~(2048/16+10) ulp = 8e-6 relative, under 2e-5.
      check(y, x, w, nullptr, M, N, K, x_bf16, lin.kernel_name(M));
    }
  }
}

TEST(FloatLinear, OwnedCopyGivesSameResult) {
  const int64_t N = 37, K = 129, M = 2;
  auto w = make_weights(DType::BF16, N, K, 3);
  auto x = random_floats(size_t(M * K), 4);
  FloatLinear a(w.ptr(DType::BF16), DType::BF16, N, K), b(w.ptr(DType::BF16), DType::BF16, N, K);
  b.copy_weights_to_owned_memory();
  EXPECT_NE(b.weights(), w.ptr(DType::BF16));
  std::vector<float> ya(size_t(M * N)), yb(ya.size());
  a.forward(x.data(), M, ya.data());
  b.forward(x.data(), M, yb.data());
  EXPECT_EQ(ya, yb);
}

TEST(FloatLinear, SelectsExpectedKernelsOnThisMachine) {
  // The winners measured by bench/lab_float_linear on the Zen 4 dev/CI machine (docs/perf/cpu-float-linear.md).
  if (!supports_avx512_bf16()) GTEST_SKIP() << "not the AVX512_BF16 machine the selection was measured on";
  std::vector<uint16_t> wb(64 * 64, 0x3f80);
  std::vector<float> wf(64 * 64, 1.0f);
  FloatLinear bf(wb.data(), DType::BF16, 64, 64), f32(wf.data(), DType::F32, 64, 64),
      f16(wb.data(), DType::F16, 64, 64);
  EXPECT_EQ(bf.kernel_name(1), "gemv-avx512-bf16");
  EXPECT_EQ(f32.kernel_name(1), "gemv-avx512-f32");
  EXPECT_EQ(f16.kernel_name(1), "gemv-avx512-f16");
  EXPECT_EQ(bf.kernel_name(512), "onednn-matmul-bf16");
  EXPECT_EQ(f32.kernel_name(512), "openblas-sgemm-f32");
  EXPECT_EQ(f16.kernel_name(512), "openblas-sgemm-widened-f16");
  {
    IsaScope s(IsaLevel::Avx2);
    EXPECT_EQ(bf.kernel_name(1), "gemv-avx2-bf16");
  }
  {
    ForceRef fr;
    EXPECT_EQ(bf.kernel_name(512), "reference-bf16");
  }
}

TEST(FloatLinear, RejectsBadInput) {
  std::vector<float> w(16, 1.0f);
  EXPECT_THROW(FloatLinear(nullptr, DType::F32, 4, 4), Error);
  EXPECT_THROW(FloatLinear(w.data(), DType::I8, 4, 4), Error);
  EXPECT_THROW(FloatLinear(w.data(), DType::F32, 0, 4), Error);
  FloatLinear lin(w.data(), DType::F32, 4, 4);
  float x[4] = {1, 2, 3, 4}, y[4];
  EXPECT_THROW(lin.forward(x, -1, y), Error);
}

}  // namespace
}  // namespace perry::kernels
