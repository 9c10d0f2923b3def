// gemm_small_m_wgmma (sm_90a, M = 1..64): per channel its int32 sums exactly the host's and its
// F32 / BF16 outputs gemm_w8a8_wgmma's bits (the same expression on the same sums); the grouped
// modes against the float64 reference of gemv_quant.h's math; the int4 two-level form exactly and
// gemm_w4a8_two_level_wgmma's bits. The shapes cover the stream-K
// shares: tiles split over many CTAs (1000 × 4160: 264 stages on 132 CTAs), shares that end
// whole tiles and start partial ones (20000 × 512), single-stage tiles (K 16), partial 128-k
// stages and groups (K 320, 4160), rows past N, every token-column width (M 1..64).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemm_small_m_sm90.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/quant.h"

#include "cuda/cuda_test_util.h"
#include "cuda/quant_test_util.h"

namespace {
using namespace perry::cuda::testing;  // (pc = perry::cuda, Dev, the quantized weights and references)
using perry::DType;
using perry::quant::QuantizedWeight;
using perry::quant::QuantMode;

// The same F32 and BF16 outputs from two calls (`mine` and the reference kernel's `want`), bit for bit.
void expect_same_bits(int M, int N, const std::string& what, const std::function<void(void*, DType)>& mine,
                      const std::function<void(void*, DType)>& want) {
  for (DType out : {DType::F32, DType::BF16}) {
    const size_t es = out == DType::F32 ? 4 : 2;
    Dev<uint8_t> y(size_t(M) * N * es), w(size_t(M) * N * es);
    ASSERT_EQ(cudaMemset(y.p, 0xFF, y.n), cudaSuccess);
    mine(y.p, out);
    want(w.p, out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    EXPECT_TRUE(y.get() == w.get()) << what << (out == DType::F32 ? " f32" : " bf16") << ": not the reference's bits";
  }
}

#define REQUIRE_SM90()  \
  REQUIRE_GPU();        \
  if (!pc::gemm_small_m_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: gemm_small_m_wgmma skipped"

// One call's device state: inputs, workspace, tile counters (zeroed once, as CudaLinear does).
// Without the workspace the kernel gives each CTA whole tiles; both forms are checked.
struct Case {
  QuantizedWeight w;
  Act a;
  std::vector<float> bias;
  Dev<int8_t> dw, dx;
  Dev<float> ds, dsa, dbias;
  Dev<uint8_t> ws;
  Dev<uint32_t> flags;
  int M, N, K;
  Case(QuantMode mode, int M_, int N_, int K_, std::mt19937& g)
      : w(make_weight(mode, N_, K_, g)),
        a(make_act(M_, K_, g)),
        bias(rand_f(size_t(N_), g, -1.f, 1.f)),
        dw(w.qweight),
        dx(a.q),
        ds(w.scales),
        dsa(a.sa),
        dbias(bias),
        ws(pc::gemm_small_m_wgmma_workspace_bytes(M_, N_, K_)),
        flags(std::vector<uint32_t>(pc::kGemmW8A8TileFlags, 0u)),
        M(M_),
        N(N_),
        K(K_) {}
  void run(void* y, DType out, bool with_bias, cudaStream_t s = nullptr) {
    pc::gemm_small_m_wgmma(w.mode, dx.p, dsa.p, dw.p, ds.p, with_bias ? dbias.p : nullptr, y, out, M, N, K, s, ws.p,
                           ws.n, flags.p);
  }
  bool flags_zero() const {
    for (uint32_t f : flags.get())
      if (f) return false;
    return true;
  }
};

const std::tuple<int, int, std::vector<int>> kShapes[] = {
    {200, 320, {1, 2, 8, 9, 16, 17, 32, 33, 64}},  // 2 tiles × 3 stages (the last half a stage): one stage a CTA
    {130, 16, {3, 16, 64}},                        // K 16: one partial stage a tile, whole tiles
    {1000, 4160, {1, 7, 16, 40}},                  // 8 tiles × 33 stages over 132 CTAs: 2 stages a share
    {20000, 512, {5, 16, 33}},                     // 157 tiles × 4 stages: shares of 4-5, whole and partial tiles
    {4096, 4096, {16}},                            // a Llama-3-8B o_proj at batch 16
};

TEST(CudaGemmSmallMWgmma, PerChannelExactAndGemmW8A8Bits) {
  REQUIRE_SM90();
  std::mt19937 g(61);
  for (const auto& [N, K, Ms] : kShapes)
    for (int M : Ms) {
      const std::string what = "w8a8 M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
      Case c(QuantMode::W8A8, M, N, K, g);
      // I32: the exact sums.
      Dev<int32_t> yi(size_t(M) * N);
      ASSERT_EQ(cudaMemset(yi.p, 0x7F, yi.n * 4), cudaSuccess);
      c.run(yi.p, DType::I32, false);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const auto got = yi.get();
      size_t bad = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          int64_t s = 0;
          for (int k = 0; k < K; ++k)
            s += int64_t(c.a.q[size_t(m) * K + k]) * int64_t(c.w.qweight[size_t(n) * K + k]);
          bad += got[size_t(m) * N + n] != int32_t(s);
        }
      EXPECT_EQ(bad, 0u) << what << ": int32 sums";
      // F32 / BF16 with bias: gemm_w8a8_wgmma's bits (unsplit: exact sums, the same expression).
      expect_same_bits(
          M, N, what + " vs gemm_w8a8_wgmma", [&](void* y, DType out) { c.run(y, out, true); },
          [&](void* y, DType out) {
            pc::gemm_w8a8_wgmma(c.dx.p, c.dsa.p, c.dw.p, c.ds.p, c.dbias.p, y, out, M, N, K, nullptr);
          });
      EXPECT_TRUE(c.flags_zero()) << what << ": tile counters left non-zero";
      // Without a workspace (whole tiles a CTA): the same bits.
      Dev<float> y1(size_t(M) * N), y2(size_t(M) * N);
      c.run(y1.p, DType::F32, true);
      pc::gemm_small_m_wgmma(QuantMode::W8A8, c.dx.p, c.dsa.p, c.dw.p, c.ds.p, c.dbias.p, y2.p, DType::F32, M, N, K,
                             nullptr, nullptr, 0, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_TRUE(y1.get() == y2.get()) << what << ": whole-tile shares differ from stream-K";
    }
}

TEST(CudaGemmSmallMWgmma, GroupedMatchFloat64AndRepeat) {
  REQUIRE_SM90();
  std::mt19937 g(62);
  for (QuantMode mode : {QuantMode::W8A8_G128, QuantMode::W8A8_G64})
    for (const auto& [N, K, Ms] : kShapes)
      for (int M : Ms) {
        const std::string what =
            mode_name(mode) + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
        Case c(mode, M, N, K, g);
        Dev<float> y(size_t(M) * N), y2(size_t(M) * N);
        Dev<uint16_t> yb(size_t(M) * N);
        ASSERT_EQ(cudaMemset(y.p, 0xFF, y.n * 4), cudaSuccess);
        c.run(y.p, DType::F32, true);
        c.run(y2.p, DType::F32, true);
        c.run(yb.p, DType::BF16, true);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        std::vector<double> ref, mag;
        reference(c.w, unpack(c.w), c.a, M, c.bias.data(), ref, mag);
        const auto yf = y.get();
        expect_close(yf, ref, mag, what);
        EXPECT_TRUE(yf == y2.get()) << what << ": two calls differ (the shares are added in CTA order)";
        const auto ybh = yb.get();
        size_t bad = 0;
        for (size_t i = 0; i < yf.size(); ++i) bad += ybh[i] != perry::f32_to_bf16(yf[i]);
        EXPECT_EQ(bad, 0u) << what << ": bf16 output is not the f32 output rounded";
        EXPECT_TRUE(c.flags_zero()) << what << ": tile counters left non-zero";
        Dev<float> y3(size_t(M) * N);
        pc::gemm_small_m_wgmma(mode, c.dx.p, c.dsa.p, c.dw.p, c.ds.p, c.dbias.p, y3.p, DType::F32, M, N, K, nullptr,
                               nullptr, 0, nullptr);  // whole tiles: one CTA folds all of a tile's groups
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        expect_close(y3.get(), ref, mag, what + " (no workspace)");
      }
}

// The int4 form (two-level w4a8-g128 / per-channel w4a8): int32 sums exactly the host's Σ x·q·m,
// F32 / BF16 outputs gemm_w4a8_two_level_wgmma's bits (its unsplit kernel, the same expression).
TEST(CudaGemmSmallMWgmma, TwoLevelInt4ExactAndRegisterKernelBits) {
  REQUIRE_SM90();
  std::mt19937 g(64);
  const std::tuple<int, int, std::vector<int>> shapes[] = {
      {200, 384, {1, 9, 16, 33, 64}}, {1000, 4096, {4, 16, 40}}, {20000, 512, {16}}, {130, 128, {3, 64}}};
  for (const auto& [N, K, Ms] : shapes)
    for (int M : Ms) {
      const std::string what = "two-level M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
      const int G = K / 128;
      std::uniform_int_distribution<int> dq(-7, 7), dm(0, 18);
      std::vector<int8_t> q(size_t(N) * K), mult(size_t(N) * G);
      std::vector<uint8_t> packed(size_t(N) * K / 2);
      for (auto& v : q) v = int8_t(dq(g));
      for (auto& v : mult) v = int8_t(dm(g));
      mult[0] = 18;
      for (size_t i = 0; i < packed.size(); ++i)
        packed[i] = uint8_t((uint8_t(q[2 * i]) & 0xF) | ((uint8_t(q[2 * i + 1]) & 0xF) << 4));
      const auto xq = rand_i8(size_t(M) * K, g);
      const auto sa = rand_f(size_t(M), g, 0.001f, 0.02f), cn = rand_f(size_t(N), g, 0.001f, 0.01f);
      const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
      Dev<uint8_t> dw(packed);
      Dev<int8_t> dm8(mult), dx(xq);
      Dev<float> dsa(sa), dcn(cn), dbias(bias);
      Dev<uint8_t> ws(pc::gemm_small_m_wgmma_workspace_bytes(M, N, K));
      Dev<uint32_t> flags(std::vector<uint32_t>(pc::kGemmW8A8TileFlags, 0u));
      Dev<int32_t> yi(size_t(M) * N);
      pc::gemm_small_m_wgmma_two_level(dx.p, dsa.p, dw.p, dm8.p, dcn.p, nullptr, yi.p, DType::I32, M, N, K, nullptr,
                                       ws.p, ws.n, flags.p);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const auto got = yi.get();
      size_t bad = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          int64_t acc = 0;
          for (int k = 0; k < K; ++k)
            acc += int64_t(xq[size_t(m) * K + k]) * q[size_t(n) * K + k] * mult[size_t(n) * G + k / 128];
          bad += got[size_t(m) * N + n] != int32_t(acc);
        }
      EXPECT_EQ(bad, 0u) << what << ": int32 sums";
      expect_same_bits(
          M, N, what + " vs gemm_w4a8_two_level_wgmma",
          [&](void* y, DType out) {
            pc::gemm_small_m_wgmma_two_level(dx.p, dsa.p, dw.p, dm8.p, dcn.p, dbias.p, y, out, M, N, K, nullptr, ws.p,
                                             ws.n, flags.p);
          },
          [&](void* y, DType out) {
            pc::gemm_w4a8_two_level_wgmma(dx.p, dsa.p, dw.p, dm8.p, dcn.p, dbias.p, y, out, M, N, K, nullptr);
          });
      bool zero = true;
      for (uint32_t f : flags.get()) zero = zero && f == 0;
      EXPECT_TRUE(zero) << what << ": tile counters left non-zero";
    }
}

// On a stream, programmatically after another kernel writing the activations it reads.
TEST(CudaGemmSmallMWgmma, AfterItsProducerOnAStream) {
  REQUIRE_SM90();
  std::mt19937 g(63);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (QuantMode mode : {QuantMode::W8A8, QuantMode::W8A8_G128}) {
    const int M = 16, N = 6144, K = 4096;
    Case c(mode, M, N, K, g);
    // Overwrite x and sa on the stream right before the call (a copy from a second device copy).
    Dev<int8_t> x2(c.a.q);
    Dev<float> sa2(c.a.sa);
    ASSERT_EQ(cudaMemsetAsync(c.dx.p, 0, c.dx.n, s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(c.dsa.p, 0, c.dsa.n * 4, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(c.dx.p, x2.p, c.dx.n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(c.dsa.p, sa2.p, c.dsa.n * 4, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    Dev<float> y(size_t(M) * N);
    c.run(y.p, DType::F32, false, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<double> ref, mag;
    reference(c.w, unpack(c.w), c.a, M, nullptr, ref, mag);
    expect_close(y.get(), ref, mag, mode_name(mode) + " on a stream");
  }
  cudaStreamDestroy(s);
}

TEST(CudaGemmSmallMWgmma, BadArgumentsThrow) {
  REQUIRE_SM90();
  Dev<int8_t> x(64 * 256), w(256 * 256);
  Dev<float> s(256 * 2), sa(64), y(64 * 256);
  Dev<uint8_t> ws(pc::gemm_small_m_wgmma_workspace_bytes(64, 256, 256));
  Dev<uint32_t> flags(std::vector<uint32_t>(pc::kGemmW8A8TileFlags, 0u));
  auto call = [&](QuantMode mode, int M, int N, int K, DType out = DType::F32, void* pws = nullptr,
                  uint32_t* pfl = nullptr, const int8_t* px = nullptr) {
    pc::gemm_small_m_wgmma(mode, px ? px : x.p, sa.p, w.p, s.p, nullptr, y.p, out, M, N, K, nullptr,
                           pws ? pws : ws.p, ws.n, pfl ? pfl : flags.p);
  };
  EXPECT_THROW(call(QuantMode::W8A8, 0, 64, 128), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 65, 64, 128), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 4, 0, 128), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 4, 64, 8), perry::Error);    // K < 16
  EXPECT_THROW(call(QuantMode::W8A8, 4, 64, 136), perry::Error);  // K % 16
  EXPECT_THROW(call(QuantMode::W4A8, 4, 64, 128), perry::Error);  // int4 weights: the two-level entry
  Dev<int8_t> mult(256 * 2);
  EXPECT_THROW(pc::gemm_small_m_wgmma_two_level(x.p, sa.p, w.p, mult.p, s.p, nullptr, y.p, DType::F32, 4, 64, 192,
                                                nullptr, ws.p, ws.n, flags.p),
               perry::Error);  // K % 128
  EXPECT_THROW(pc::gemm_small_m_wgmma_two_level(x.p, sa.p, w.p, nullptr, s.p, nullptr, y.p, DType::F32, 4, 64, 128,
                                                nullptr, ws.p, ws.n, flags.p),
               perry::Error);  // no multipliers
  EXPECT_NO_THROW(pc::gemm_small_m_wgmma_two_level(x.p, sa.p, w.p, mult.p, s.p, nullptr, y.p, DType::F32, 16, 256, 256,
                                                   nullptr, ws.p, ws.n, flags.p));
  EXPECT_THROW(call(QuantMode::W8A16, 4, 64, 128), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G128, 4, 64, 128, DType::I32), perry::Error);  // I32 is per channel
  EXPECT_THROW(call(QuantMode::W8A8, 4, 64, 128, DType::F32, nullptr, nullptr, x.p + 1), perry::Error);  // misaligned
  EXPECT_NO_THROW(call(QuantMode::W8A8, 64, 256, 256));
  EXPECT_NO_THROW(call(QuantMode::W8A8_G64, 1, 1, 16));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
