// gemm_small_m (every quantized mode) and gemm_small_m_bf16 (bf16 weights), M = 1..64, against
// float64 references of the documented math (gemv_quant.h): per element within 1e-5 of the sum of
// |terms| and relative L2 < 1e-5. Unaligned N and K, partial last groups and k-blocks, split-K
// (atomic) and single-split shapes, the gemv_quant / simple fallbacks (K not a multiple of the
// chunk, misaligned pointers), outputs poisoned with NaN. A timing test prints GB/s of weights
// against a 1 GB device-to-device copy (no assertion).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/quant.h"

namespace pc = perry::cuda;
#include "cuda/cuda_test_util.h"
#include "cuda/quant_test_util.h"

using perry::DType;
using perry::quant::QuantizedWeight;
using perry::quant::QuantMode;

namespace {
using namespace perry::cuda::testing;

// offset: elements by which x and qweight are shifted from their 256-byte aligned allocation.
void run_case(QuantMode mode, int M, int N, int K, bool with_bias, std::mt19937& g, int offset = 0,
              cudaStream_t stream = nullptr) {
  const auto mb = pc::quant_mode_bits(mode);
  const QuantizedWeight w = make_weight(mode, N, K, g);
  const Act a = make_act(M, K, g);
  const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
  std::vector<int8_t> qw(w.qweight.size() + offset), xq(a.q.size() + offset);
  std::vector<uint16_t> xb(a.xb.size() + offset);
  std::copy(w.qweight.begin(), w.qweight.end(), qw.begin() + offset);
  std::copy(a.q.begin(), a.q.end(), xq.begin() + offset);
  std::copy(a.xb.begin(), a.xb.end(), xb.begin() + offset);
  Dev<int8_t> dw(qw), dq(xq);
  Dev<uint16_t> dxb(xb);
  Dev<float> ds(w.scales), dsa(a.sa), dbias(bias), dy(size_t(M) * N);
  ASSERT_EQ(cudaMemset(dy.p, 0xFF, dy.n * sizeof(float)), cudaSuccess);  // NaN poison
  const void* x = mb.a8 ? static_cast<const void*>(dq.p + offset) : static_cast<const void*>(dxb.p + offset);
  pc::gemm_small_m(mode, x, mb.a8 ? dsa.p : nullptr, dw.p + offset, ds.p, with_bias ? dbias.p : nullptr, dy.p, M,
                   N, K, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> ref, mag;
  reference(w, unpack(w), a, M, with_bias ? bias.data() : nullptr, ref, mag);
  expect_close(dy.get(), ref, mag,
               "small_m " + mode_name(mode) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                   " K=" + std::to_string(K) + (with_bias ? " bias" : "") +
                   (offset ? " offset " + std::to_string(offset) : ""));
}

TEST(CudaGemmSmallM, AllModesMatchFloat64) {
  REQUIRE_GPU();
  std::mt19937 g(21);
  // (200, 320): one split, partial k-block; (37, 192): g128 1.5 groups; (3, 128): N < 16;
  // (130, 2048) and (1000, 4160): split-K with atomics, K = 4160 a partial g128 group and a
  // partial k-block; (40, 96): int4 partial k-block.
  const std::pair<int, int> shapes[] = {{200, 320}, {37, 192}, {3, 128}, {130, 2048}, {40, 96}};
  for (QuantMode mode : kAllModes) {
    for (auto [N, K] : shapes)
      for (int M : {1, 2, 9, 16, 17, 33, 64})
        for (bool bias : {false, true}) run_case(mode, M, N, K, bias, g);
    for (int M : {2, 17, 64}) run_case(mode, M, 1000, 4160, M != 17, g);
  }
}

TEST(CudaGemmSmallM, EveryRowCount) {
  REQUIRE_GPU();
  std::mt19937 g(22);
  for (QuantMode mode : kAllModes)
    for (int M = 1; M <= 64; ++M) run_case(mode, M, 48, 512, M % 2 == 0, g);
}

// K not a multiple of the fast path's chunk (gemv_quant fallback in blocks of 8 rows) and
// misaligned x / qweight (also the fallback).
TEST(CudaGemmSmallM, FallbackShapesAndMisalignedPointers) {
  REQUIRE_GPU();
  std::mt19937 g(23);
  for (QuantMode mode : kAllModes) {
    for (int M : {3, 16, 33}) {
      run_case(mode, M, 50, 200, true, g);  // 200 % 16 != 0 (int8), % 32 != 0 (int4)
      run_case(mode, M, 17, 129, false, g);
    }
    run_case(mode, 20, 40, 256, true, g, /*offset=*/1);
  }
}

TEST(CudaGemmSmallM, OnAStream) {
  REQUIRE_GPU();
  std::mt19937 g(24);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (QuantMode mode : kAllModes) run_case(mode, 16, 512, 4096, true, g, 0, s);
  cudaStreamDestroy(s);
}

TEST(CudaGemmSmallM, BadArgumentsThrow) {
  REQUIRE_GPU();
  Dev<int8_t> x(64 * 128 * 2), w(64 * 128);  // x large enough for bf16 [64, 128]
  Dev<float> s(64 * 2), sa(64), y(64 * 64);
  auto call = [&](QuantMode mode, int M, int N, int K, const float* psa, const void* pw) {
    pc::gemm_small_m(mode, x.p, psa, pw, s.p, nullptr, y.p, M, N, K, nullptr);
  };
  EXPECT_THROW(call(QuantMode::W8A8, 0, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 65, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 0, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 0, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 128, nullptr, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 128, sa.p, nullptr), perry::Error);
  EXPECT_THROW(call(QuantMode::BF16, 1, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_NO_THROW(call(QuantMode::W4A16, 64, 64, 128, nullptr, w.p));
  Dev<uint16_t> xb(64 * 128), wb(64 * 128);
  EXPECT_THROW(pc::gemm_small_m_bf16(xb.p, wb.p, nullptr, y.p, 65, 64, 128, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_small_m_bf16(xb.p, nullptr, nullptr, y.p, 1, 64, 128, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_small_m_bf16(xb.p, wb.p, nullptr, y.p, 1, 64, 0, nullptr), perry::Error);
  EXPECT_NO_THROW(pc::gemm_small_m_bf16(xb.p, wb.p, nullptr, y.p, 64, 64, 128, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

void run_bf16_case(int M, int N, int K, bool with_bias, std::mt19937& g, int offset = 0) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(M) * K + offset), w(size_t(N) * K + offset);
  for (auto& v : x) v = perry::f32_to_bf16(nd(g));
  for (auto& v : w) v = perry::f32_to_bf16(0.05f * nd(g));
  const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
  std::vector<double> ref(size_t(M) * N), mag(ref.size());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0, sabs = 0;
      for (int k = 0; k < K; ++k) {
        const double t = double(perry::bf16_to_f32(x[offset + size_t(m) * K + k])) *
                         double(perry::bf16_to_f32(w[offset + size_t(n) * K + k]));
        s += t;
        sabs += std::fabs(t);
      }
      const double b = with_bias ? bias[size_t(n)] : 0.0;
      ref[size_t(m) * N + n] = s + b;
      mag[size_t(m) * N + n] = sabs + std::fabs(b);
    }
  Dev<uint16_t> dx(x), dw(w);
  Dev<float> dbias(bias), dy(size_t(M) * N);
  ASSERT_EQ(cudaMemset(dy.p, 0xFF, dy.n * sizeof(float)), cudaSuccess);
  pc::gemm_small_m_bf16(dx.p + offset, dw.p + offset, with_bias ? dbias.p : nullptr, dy.p, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(dy.get(), ref, mag,
               "small_m bf16 M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                   (with_bias ? " bias" : "") + (offset ? " offset" : ""));
}

TEST(CudaGemmSmallMBf16, MatchesFloat64) {
  REQUIRE_GPU();
  std::mt19937 g(25);
  const std::pair<int, int> shapes[] = {{200, 320}, {3, 8}, {37, 200}, {130, 2048}, {1000, 4160}};
  for (auto [N, K] : shapes)
    for (int M : {1, 2, 8, 9, 16, 17, 33, 64})
      for (bool bias : {false, true}) run_bf16_case(M, N, K, bias, g);
  for (int M = 1; M <= 64; ++M) run_bf16_case(M, 24, 64, M % 3 == 0, g);
  run_bf16_case(5, 40, 66, true, g);   // K % 8 != 0: fallback kernel
  run_bf16_case(17, 40, 129, false, g);
  run_bf16_case(16, 40, 256, true, g, /*offset=*/1);  // misaligned: fallback kernel
}

// ---- timing (prints, no assertion) ----

float time_ms(const std::function<void()>& f, int reps = 20) {
  f();
  cudaDeviceSynchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

TEST(CudaGemmSmallM, TimingPrint) {
  REQUIRE_GPU();
  const size_t copy_bytes = size_t(1) << 30;
  double copy_gbs = 0;
  {
    Dev<uint8_t> s(copy_bytes), d(copy_bytes);
    cudaMemset(s.p, 1, copy_bytes);
    const float ms = time_ms([&] { cudaMemcpyAsync(d.p, s.p, copy_bytes, cudaMemcpyDeviceToDevice); }, 5);
    copy_gbs = 2.0 * copy_bytes / (ms * 1e6);  // read + write
  }
  std::printf("[timing] 1 GB device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
  std::mt19937 g(26);
  const int shapes[2][2] = {{14336, 4096}, {4096, 14336}};
  const int Ms[] = {1, 2, 4, 8, 16, 32, 64};
  cublasHandle_t cublas;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  for (auto& sh : shapes) {
    const int N = sh[0], K = sh[1];
    std::vector<uint8_t> hw(size_t(N) * K * 2);
    for (size_t i = 0; i < hw.size(); i += 4) {
      const uint32_t r = g();
      std::memcpy(&hw[i], &r, 4);
    }
    for (size_t i = 1; i < hw.size(); i += 2) hw[i] &= 0x3F;  // bf16 view: finite, small
    Dev<uint8_t> dw(hw);
    Dev<float> ds(size_t(N) * (K / 64)), dsa(64), dy(size_t(64) * N);
    {
      std::vector<float> s(size_t(N) * (K / 64), 1e-3f), sa(64, 1e-2f);
      cudaMemcpy(ds.p, s.data(), s.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(dsa.p, sa.data(), sa.size() * 4, cudaMemcpyHostToDevice);
    }
    Dev<uint8_t> dx(size_t(64) * K * 2);
    cudaMemset(dx.p, 0x11, dx.n);
    Dev<uint16_t> deq(size_t(N) * K);
    for (int mi = -1; mi < 7; ++mi) {
      const bool bf = mi < 0;
      const QuantMode mode = bf ? QuantMode::BF16 : kAllModes[mi];
      const auto mb = bf ? pc::QuantModeBits{16, 0, false, "bf16"} : pc::quant_mode_bits(mode);
      const double wbytes = double(N) * K * mb.bits / 8;
      for (int M : Ms) {
        float t_small, t_other = -1;
        const char* other = "";
        if (bf) {
          t_small = time_ms([&] {
            pc::gemm_small_m_bf16(reinterpret_cast<uint16_t*>(dx.p), reinterpret_cast<uint16_t*>(dw.p), nullptr,
                                  dy.p, M, N, K, nullptr);
          });
          const float one = 1, zero = 0;
          t_other = time_ms([&] {
            cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, dw.p, CUDA_R_16BF, K, dx.p, CUDA_R_16BF, K,
                         &zero, dy.p, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          });
          other = "cublas";
        } else {
          t_small = time_ms([&] {
            pc::gemm_small_m(mode, dx.p, dsa.p, dw.p, ds.p, nullptr, dy.p, M, N, K, nullptr);
          });
          if (M <= pc::kGemvQuantMaxM) {
            t_other = time_ms([&] { pc::gemv_quant(mode, dx.p, dsa.p, dw.p, ds.p, nullptr, dy.p, M, N, K, nullptr); });
            other = "gemv_quant";
          } else if (mb.a8 && mode == QuantMode::W8A8) {
            t_other = time_ms([&] {
              pc::gemm_w8a8(reinterpret_cast<int8_t*>(dx.p), dsa.p, reinterpret_cast<int8_t*>(dw.p), ds.p, nullptr,
                            dy.p, DType::F32, M, N, K, nullptr);
            });
            other = "gemm_w8a8";
          } else if (mb.a8) {
            t_other = time_ms([&] {
              pc::gemm_quant(mode, reinterpret_cast<int8_t*>(dx.p), dsa.p, dw.p, ds.p, nullptr, dy.p, DType::F32, M,
                             N, K, nullptr);
            });
            other = "gemm_quant";
          } else {
            const float one = 1, zero = 0;
            t_other = time_ms([&] {
              pc::dequantize_weight_bf16(dw.p, ds.p, mb.bits, mb.group_size, N, K, deq.p, nullptr);
              cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, deq.p, CUDA_R_16BF, K, dx.p, CUDA_R_16BF,
                           K, &zero, dy.p, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            other = "dequant+cublas";
          }
        }
        std::printf("[timing] %-10s N=%5d K=%5d M=%2d  small_m %8.1f us %6.0f GB/s (%3.0f%% of copy)  |  %-14s %8.1f us %6.0f GB/s\n",
                    mb.name, N, K, M, t_small * 1e3, wbytes / (t_small * 1e6), 100.0 * wbytes / (t_small * 1e6) / copy_gbs,
                    other, t_other * 1e3, wbytes / (t_other * 1e6));
      }
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  cublasDestroy(cublas);
}

}  // namespace
