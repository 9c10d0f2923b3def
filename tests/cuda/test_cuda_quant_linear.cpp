// CUDA quantized linear kernels (gemv_quant, gemm_quant, dequantize_weight_bf16) on real
// canonical weights from perry::quant::quantize_weight, against float64 references of the
// quantized math (the meaning of src/kernels/cpu/qgemm_ref.cpp): relative L2 < 1e-5 and every
// element within 1e-5 of the sum of |terms|; int32 group partials exact; dequantization
// bit-exact. Unaligned N and K, partial last groups, odd K, outputs poisoned with NaN first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/expand_int4.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/quant.h"
#include "quant/two_level_scales.h"

namespace pc = perry::cuda;
#include "cuda/cuda_test_util.h"
#include "cuda/quant_test_util.h"

using perry::DType;
using perry::quant::QuantizedWeight;
using perry::quant::QuantMode;

namespace {
using namespace perry::cuda::testing;

// Sets (value) or removes (nullptr) an environment variable for its lifetime, so a failed
// assertion that returns early does not leave a forced plan set for the tests after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { set(value); }
  ~ScopedEnv() { unsetenv(name_); }
  void set(const char* value) {
    if (value) setenv(name_, value, 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
};

const QuantMode kA8Modes[] = {QuantMode::W8A8, QuantMode::W8A8_G128, QuantMode::W8A8_G64,
                              QuantMode::W4A8, QuantMode::W4A8_G128};


struct DevWeight {
  Dev<int8_t> q;
  Dev<float> s;
  explicit DevWeight(const QuantizedWeight& w) : q(w.qweight), s(w.scales) {}
};

void run_gemv_case(QuantMode mode, int M, int N, int K, bool with_bias, std::mt19937& g,
                   cudaStream_t stream = nullptr) {
  const auto mb = pc::quant_mode_bits(mode);
  const QuantizedWeight w = make_weight(mode, N, K, g);
  const auto wu = unpack(w);
  const Act a = make_act(M, K, g);
  const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
  DevWeight dw(w);
  Dev<int8_t> dq(a.q);
  Dev<uint16_t> dxb(a.xb);
  Dev<float> dsa(a.sa), dbias(bias);
  Dev<float> dy(size_t(M) * N);
  ASSERT_EQ(cudaMemset(dy.p, 0xFF, dy.n * sizeof(float)), cudaSuccess);  // NaN poison
  const void* x = mb.a8 ? static_cast<const void*>(dq.p) : static_cast<const void*>(dxb.p);
  pc::gemv_quant(mode, x, mb.a8 ? dsa.p : nullptr, dw.q.p, dw.s.p, with_bias ? dbias.p : nullptr, dy.p,
                 M, N, K, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> ref, mag;
  reference(w, wu, a, M, with_bias ? bias.data() : nullptr, ref, mag);
  expect_close(dy.get(), ref, mag,
               "gemv " + mode_name(mode) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                   " K=" + std::to_string(K) + (with_bias ? " bias" : ""));
}

TEST(CudaGemvQuant, AllModesMatchFloat64) {
  REQUIRE_GPU();
  std::mt19937 g(7);
  // K = 4160: 32.5 groups of 128 (partial last group), 16-byte rows; K = 192 with g128: one
  // full group and one half; K = 200 / 66 / 129: the byte-wise (non-vector) path, odd K.
  const std::pair<int, int> shapes[] = {{200, 320}, {1000, 4160}, {3, 128}, {37, 192},
                                        {50, 200},  {64, 66},     {17, 129}};
  for (QuantMode mode : kAllModes)
    for (auto [N, K] : shapes)
      for (int M : {1, 2, 3, 5, 8})
        for (bool bias : {false, true}) run_gemv_case(mode, M, N, K, bias, g);
}

TEST(CudaGemvQuant, EveryRowCountInstantiation) {
  REQUIRE_GPU();
  std::mt19937 g(8);
  for (QuantMode mode : kAllModes)
    for (int M = 1; M <= 8; ++M) run_gemv_case(mode, M, 77, 256, M % 2 == 0, g);
}

TEST(CudaGemvQuant, LargeShapeOnAStream) {
  REQUIRE_GPU();
  std::mt19937 g(9);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (QuantMode mode : kAllModes) run_gemv_case(mode, mode == QuantMode::W4A16 ? 4 : 1, 2048, 4096, true, g, s);
  cudaStreamDestroy(s);
}

// Unaligned base pointers (offset by 1 element) must take the byte-wise path and stay right.
TEST(CudaGemvQuant, MisalignedPointers) {
  REQUIRE_GPU();
  std::mt19937 g(10);
  const int M = 3, N = 40, K = 256;
  for (QuantMode mode : kAllModes) {
    const auto mb = pc::quant_mode_bits(mode);
    const QuantizedWeight w = make_weight(mode, N, K, g);
    const auto wu = unpack(w);
    const Act a = make_act(M, K, g);
    std::vector<int8_t> q1(w.qweight.size() + 1), x1(a.q.size() + 1);
    std::copy(w.qweight.begin(), w.qweight.end(), q1.begin() + 1);
    std::copy(a.q.begin(), a.q.end(), x1.begin() + 1);
    std::vector<uint16_t> xb1(a.xb.size() + 1);
    std::copy(a.xb.begin(), a.xb.end(), xb1.begin() + 1);
    Dev<int8_t> dq(q1), dx(x1);
    Dev<uint16_t> dxb(xb1);
    Dev<float> ds(w.scales), dsa(a.sa), dy(size_t(M) * N);
    ASSERT_EQ(cudaMemset(dy.p, 0xFF, dy.n * sizeof(float)), cudaSuccess);
    const void* x = mb.a8 ? static_cast<const void*>(dx.p + 1) : static_cast<const void*>(dxb.p + 1);
    pc::gemv_quant(mode, x, dsa.p, dq.p + 1, ds.p, nullptr, dy.p, M, N, K, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> ref, mag;
    reference(w, wu, a, M, nullptr, ref, mag);
    expect_close(dy.get(), ref, mag, "misaligned gemv " + mode_name(mode));
  }
}

TEST(CudaGemvQuant, BadArgumentsThrow) {
  REQUIRE_GPU();
  Dev<int8_t> x(8 * 128), w(64 * 128);
  Dev<float> s(64 * 2), sa(8), y(8 * 64);
  auto call = [&](QuantMode mode, int M, int N, int K, const float* psa, const void* pw) {
    pc::gemv_quant(mode, x.p, psa, pw, s.p, nullptr, y.p, M, N, K, nullptr);
  };
  EXPECT_THROW(call(QuantMode::W8A8, 0, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 9, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 0, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 0, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 128, nullptr, w.p), perry::Error);  // a8 needs sa
  EXPECT_THROW(call(QuantMode::W8A8, 1, 64, 128, sa.p, nullptr), perry::Error);
  EXPECT_THROW(call(QuantMode::F32, 1, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_THROW(call(QuantMode::BF16, 1, 64, 128, sa.p, w.p), perry::Error);
  EXPECT_NO_THROW(call(QuantMode::W8A16, 1, 64, 128, nullptr, w.p));  // a16: sa unused
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Exact int64 per-group partials P[m, n, g] = Σ_{k∈g} x·w and A = Σ |x·w| (error scale).
void group_partials(const QuantizedWeight& w, const std::vector<int>& wu, const std::vector<int8_t>& q,
                    int M, std::vector<int64_t>& P, std::vector<int64_t>& A) {
  const int N = int(w.N), K = int(w.K), G = w.n_groups();
  const int gs = pc::quant_mode_bits(w.mode).group_size;
  const int gl = gs > 0 ? gs : K;
  P.assign(size_t(M) * N * G, 0);
  A.assign(P.size(), 0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const int8_t* x = &q[size_t(m) * K];
      const int* wr = &wu[size_t(n) * K];
      for (int gi = 0; gi < G; ++gi) {
        int64_t s = 0, a = 0;
        for (int k = gi * gl; k < std::min(K, (gi + 1) * gl); ++k) {
          const int t = int(x[k]) * wr[k];
          s += t;
          a += t < 0 ? -t : t;
        }
        P[(size_t(m) * N + n) * G + gi] = s;
        A[(size_t(m) * N + n) * G + gi] = a;
      }
    }
}

using GemmQuantFn = void (*)(QuantMode, const int8_t*, const float*, const void*, const float*, const float*,
                             void*, DType, int, int, int, cudaStream_t);

void run_gemm_case(QuantMode mode, int M, int N, int K, bool with_bias, DType out, std::mt19937& g,
                   GemmQuantFn gemm = pc::gemm_quant, const char* name = "gemm ") {
  const std::string what = name + mode_name(mode) + " M=" + std::to_string(M) + " N=" +
                           std::to_string(N) + " K=" + std::to_string(K) + (with_bias ? " bias" : "") +
                           (out == DType::I32 ? " i32" : out == DType::F32 ? " f32" : " bf16");
  const QuantizedWeight w = make_weight(mode, N, K, g);
  const auto wu = unpack(w);
  const Act a = make_act(M, K, g);
  const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
  const int G = w.n_groups();
  std::vector<int64_t> P, A;
  group_partials(w, wu, a.q, M, P, A);
  DevWeight dw(w);
  Dev<int8_t> dq(a.q);
  Dev<float> dsa(a.sa), dbias(bias);
  const size_t ny = size_t(M) * N * (out == DType::I32 ? G : 1);
  const size_t esize = out == DType::BF16 ? 2 : 4;
  Dev<uint8_t> dy(ny * esize);
  ASSERT_EQ(cudaMemset(dy.p, 0xFF, ny * esize), cudaSuccess);  // NaN (float) / -1 (int) poison
  gemm(mode, dq.p, dsa.p, dw.q.p, dw.s.p, with_bias ? dbias.p : nullptr, dy.p, out, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = dy.get();
  if (out == DType::I32) {
    std::vector<int32_t> got(ny);
    std::memcpy(got.data(), raw.data(), ny * 4);
    size_t bad = 0;
    for (size_t i = 0; i < ny; ++i) bad += int64_t(got[i]) != P[i];
    EXPECT_EQ(bad, 0u) << what;
    return;
  }
  std::vector<double> ref(size_t(M) * N), mag(ref.size());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0, am = 0;
      for (int gi = 0; gi < G; ++gi) {
        const size_t i = (size_t(m) * N + n) * G + gi;
        acc += double(w.scales[size_t(n) * G + gi]) * double(P[i]);
        am += double(w.scales[size_t(n) * G + gi]) * double(A[i]);
      }
      const double b = with_bias ? bias[size_t(n)] : 0.0;
      ref[size_t(m) * N + n] = acc * a.sa[size_t(m)] + b;
      mag[size_t(m) * N + n] = am * a.sa[size_t(m)] + std::fabs(b);
    }
  std::vector<float> y(ref.size());
  if (out == DType::F32) {
    std::memcpy(y.data(), raw.data(), y.size() * 4);
    expect_close(y, ref, mag, what);
  } else {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      const double v = perry::bf16_to_f32(h);
      // bf16 rounding: half an ulp = 2^-9 relative, plus the fp32 accumulation error.
      if (!std::isfinite(v) || std::fabs(v - ref[i]) > std::ldexp(std::fabs(ref[i]), -8) + 1e-5 * mag[i])
        if (bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": first bad " << first << " ref " << ref[first];
  }
}

// Two GEMMs of one w4a8-g128 (or `mode`) layer (the quantizer's weights, a bias) bit for bit, F32 or
// BF16 out.
void expect_same_bits(GemmQuantFn a, GemmQuantFn b, int M, int N, int K, DType out, std::mt19937& g,
                      const std::string& what, QuantMode mode = QuantMode::W4A8_G128) {
  const QuantizedWeight w = make_weight(mode, N, K, g);
  const Act act = make_act(M, K, g);
  const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
  DevWeight dw(w);
  Dev<int8_t> dq(act.q);
  Dev<float> dsa(act.sa), db(bias);
  const size_t bytes = size_t(M) * N * (out == DType::BF16 ? 2 : 4);
  Dev<uint8_t> ya(bytes), yb(bytes);
  a(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, ya.p, out, M, N, K, nullptr);
  b(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, yb.p, out, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto ha = ya.get(), hb = yb.get();
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), bytes), 0) << what << ", out " << int(out);
}

TEST(CudaGemmQuant, GroupedAndInt4MatchFloat64) {
  REQUIRE_GPU();
  std::mt19937 g(12);
  // K = 4160 (65 k tiles, partial last g128 group), 192 (g128: 1.5 groups), 96 (partial k tile).
  const std::pair<int, int> shapes[] = {{200, 320}, {3, 128}, {37, 192}, {130, 96}};
  for (QuantMode mode : kA8Modes) {
    for (auto [N, K] : shapes)
      for (int M : {9, 64, 200})
        for (bool bias : {false, true}) run_gemm_case(mode, M, N, K, bias, DType::F32, g);
    for (int M : {9, 64, 200}) run_gemm_case(mode, M, 1000, 4160, M != 64, DType::F32, g);
    run_gemm_case(mode, 77, 200, 320, true, DType::BF16, g);
    run_gemm_case(mode, 300, 520, 1024, false, DType::BF16, g);  // several M and N tiles
  }
}

TEST(CudaGemmQuant, Int32GroupPartialsExact) {
  REQUIRE_GPU();
  std::mt19937 g(13);
  for (QuantMode mode : kA8Modes)
    for (auto [M, N, K] : {std::tuple{9, 200, 320}, {200, 37, 192}, {64, 1000, 4160}, {130, 130, 96}})
      run_gemm_case(mode, M, N, K, false, DType::I32, g);
}

TEST(CudaGemmQuant, BadArgumentsThrow) {
  REQUIRE_GPU();
  Dev<int8_t> x(16 * 256), w(64 * 256);
  Dev<float> s(64 * 4), sa(16), y(16 * 64);
  auto call = [&](QuantMode mode, int M, int N, int K, DType out, const float* psa) {
    pc::gemm_quant(mode, x.p, psa, w.p, s.p, nullptr, y.p, out, M, N, K, nullptr);
  };
  EXPECT_THROW(call(QuantMode::W8A8_G128, 0, 64, 128, DType::F32, sa.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G128, 16, 64, 200, DType::F32, sa.p), perry::Error);  // K % 16
  EXPECT_THROW(call(QuantMode::W4A8, 16, 64, 48, DType::F32, sa.p), perry::Error);        // K % 32
  EXPECT_THROW(call(QuantMode::W8A16, 16, 64, 128, DType::F32, sa.p), perry::Error);      // weight-only
  EXPECT_THROW(call(QuantMode::F32, 16, 64, 128, DType::F32, sa.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G64, 16, 64, 128, DType::F32, nullptr), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G64, 16, 64, 128, DType::I8, sa.p), perry::Error);
  EXPECT_THROW(pc::gemm_quant(QuantMode::W4A8, x.p + 1, sa.p, w.p, s.p, nullptr, y.p, DType::F32, 16, 64, 128,
                              nullptr),
               perry::Error);  // misaligned x
  EXPECT_NO_THROW(call(QuantMode::W4A8_G128, 16, 64, 256, DType::I32, nullptr));  // I32: no scales needed
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// gemm_quant_wgmma (sm_90a TMA + wgmma, gemm_quant_sm90.cu): the same contract and checks as
// gemm_quant. K = 96 / 160 / 4160: a partial last 128-k stage (and partial last g128 group, g64
// groups split across stages); 1400 × 2200: 198 tiles, more than the SMs, so CTAs loop.
#define REQUIRE_SM90()                                                                 \
  REQUIRE_GPU();                                                                       \
  if (!pc::gemm_quant_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: gemm_quant_wgmma skipped"

TEST(CudaGemmQuantWgmma, Int32GroupPartialsExact) {
  REQUIRE_SM90();
  std::mt19937 g(21);
  const GemmQuantFn wg = pc::gemm_quant_wgmma;  // (the overload without a workspace)
  for (QuantMode mode : kA8Modes)
    for (auto [M, N, K] : {std::tuple{9, 200, 320}, {200, 37, 192}, {64, 1000, 4160}, {130, 130, 96},
                           {129, 131, 160}, {1, 8, 32}, {1400, 2200, 96}, {300, 520, 1024}})
      run_gemm_case(mode, M, N, K, false, DType::I32, g, wg, "gemm_quant_wgmma ");
}

TEST(CudaGemmQuantWgmma, GroupedAndInt4MatchFloat64) {
  REQUIRE_SM90();
  std::mt19937 g(22);
  const GemmQuantFn wg = pc::gemm_quant_wgmma;  // (the overload without a workspace)
  const char* nm = "gemm_quant_wgmma ";
  const std::pair<int, int> shapes[] = {{200, 320}, {3, 128}, {37, 192}, {130, 96}, {131, 160}};
  for (QuantMode mode : kA8Modes) {
    for (auto [N, K] : shapes)
      for (int M : {9, 64, 200})
        for (bool bias : {false, true}) run_gemm_case(mode, M, N, K, bias, DType::F32, g, wg, nm);
    for (int M : {9, 200}) run_gemm_case(mode, M, 1000, 4160, M != 64, DType::F32, g, wg, nm);
    run_gemm_case(mode, 77, 200, 320, true, DType::BF16, g, wg, nm);
    run_gemm_case(mode, 300, 520, 1024, false, DType::BF16, g, wg, nm);  // 16-byte stores + edge tile
    run_gemm_case(mode, 300, 520, 1024, true, DType::BF16, g, wg, nm);
    run_gemm_case(mode, 1400, 2200, 96, true, DType::F32, g, wg, nm);   // CTAs loop over tiles
    run_gemm_case(mode, 130, 257, 4160, true, DType::BF16, g, wg, nm);  // odd N: element stores
  }
}

// gemm_quant_wgmma with the split-K workspace CudaLinear gives it (grouped modes at small M × N):
// every split folds whole groups into fp32, a second kernel adds the slices and applies sa and
// the bias. Same float64 checks (fp32 summation order differs from the unsplit fold, within the
// bounds); I32 partials exact. Shapes that split by themselves and forced counts with K off the
// 128-byte stage (K = 1056: a last g64 group past K), a count that divides K unevenly.
void gemm_quant_wgmma_split(QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                            const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  const size_t ws = pc::gemm_quant_wgmma_workspace_bytes(mode, M, N, K);
  EXPECT_GT(ws, 0u) << "expected a split-K shape: M=" << M << " N=" << N << " K=" << K;
  Dev<float> dws(ws / 4 + 4);
  pc::gemm_quant_wgmma(mode, x, sa, w, s, bias, y, out, M, N, K, stream, dws.p, ws);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaGemmQuantWgmma, SplitKMatchesFloat64) {
  REQUIRE_SM90();
  std::mt19937 g(23);
  const char* nm = "gemm_quant_wgmma split-K ";
  ScopedEnv splits("PERRY_GQ_SPLITK", nullptr), wg("PERRY_GEMM_QUANT_WG", nullptr);
  // The grouped modes with the count the estimate picks (two at these shapes) and with three
  // forced (192-row tiles: the count it picks for some small-M shapes, e.g. w4a8-g128 at M 64,
  // N 4096, K 14336).
  for (const char* wgs : {static_cast<const char*>(nullptr), "3"}) {
    wg.set(wgs);
    for (QuantMode mode : {QuantMode::W8A8_G128, QuantMode::W8A8_G64, QuantMode::W4A8_G128, QuantMode::W4A8,
                           QuantMode::W8A8}) {
      const bool grouped = pc::quant_mode_bits(mode).group_size != 0;
      if (wgs && !grouped) continue;  // (per channel has one layout)
      splits.set(nullptr);
      for (DType out : {DType::F32, DType::BF16, DType::I32}) {
        run_gemm_case(mode, 64, 1000, 4160, out != DType::F32, out, g, gemm_quant_wgmma_split, nm);
        run_gemm_case(mode, 100, 520, 2048, true, out, g, gemm_quant_wgmma_split, nm);
        run_gemm_case(mode, 200, 1000, 4160, true, out, g, gemm_quant_wgmma_split, nm);  // two tile rows
      }
      splits.set("3");
      for (DType out : {DType::F32, DType::BF16, DType::I32})
        run_gemm_case(mode, 9, 200, 1056, true, out, g, gemm_quant_wgmma_split, nm);
      splits.set("5");
      for (DType out : {DType::F32, DType::I32})
        run_gemm_case(mode, 77, 130, 4160, false, out, g, gemm_quant_wgmma_split, nm);
    }
  }
}

// The grouped kernels with two consumer warpgroups (128-row tiles) and with three (192): each
// output's groups are folded in the same order, so unsplit the outputs are equal bit for bit —
// whichever count grouped_warpgroups' estimate picks for a shape, and both against float64.
TEST(CudaGemmQuantWgmma, TwoAndThreeWarpgroupsAgree) {
  REQUIRE_SM90();
  std::mt19937 g(26);
  ScopedEnv splits("PERRY_GQ_SPLITK", "0"), wg("PERRY_GEMM_QUANT_WG", nullptr);
  for (QuantMode mode : {QuantMode::W8A8_G128, QuantMode::W8A8_G64, QuantMode::W4A8_G128}) {
    for (auto [M, N, K] : {std::tuple{300, 520, 1024}, {77, 397, 4160}}) {
      const QuantizedWeight w = make_weight(mode, N, K, g);
      const Act a = make_act(M, K, g);
      const auto bias = rand_f(size_t(N), g, -1.f, 1.f);
      DevWeight dw(w);
      Dev<int8_t> dq(a.q);
      Dev<float> dsa(a.sa), db(bias);
      for (DType out : {DType::F32, DType::BF16}) {
        const size_t bytes = size_t(M) * N * (out == DType::BF16 ? 2 : 4);
        Dev<uint8_t> y2(bytes), y3(bytes);
        wg.set("2");
        pc::gemm_quant_wgmma(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, y2.p, out, M, N, K, nullptr);
        wg.set("3");
        pc::gemm_quant_wgmma(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, y3.p, out, M, N, K, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto h2 = y2.get(), h3 = y3.get();
        EXPECT_EQ(std::memcmp(h2.data(), h3.data(), bytes), 0)
            << perry::quant::quant_mode_name(mode) << " M=" << M << " N=" << N << " K=" << K << " out " << int(out)
            << ": two and three consumer warpgroups differ";
      }
      for (const char* count : {"2", "3"}) {
        wg.set(count);
        run_gemm_case(mode, M, N, K, true, DType::F32, g, pc::gemm_quant_wgmma, "gemm_quant_wgmma (forced wg) ");
      }
    }
  }
}

// Per channel (w4a8, and w8a8 through this API) the split partials are int32 sums: the split
// outputs are the unsplit kernel's bit for bit, f32, bf16 and I32 — with the splits the default
// plan picks and with forced counts (uneven k-ranges, K off the 128-byte stage, odd N).
TEST(CudaGemmQuantWgmma, PerChannelSplitKIsBitExact) {
  REQUIRE_SM90();
  std::mt19937 g(25);
  ScopedEnv splits("PERRY_GQ_SPLITK", nullptr);
  struct Shape { int M, N, K; const char* forced; };
  for (QuantMode mode : {QuantMode::W4A8, QuantMode::W8A8}) {
    for (const Shape sh : {Shape{128, 1024, 4096, nullptr}, Shape{64, 520, 2048, nullptr},
                           Shape{200, 1000, 4160, nullptr}, Shape{9, 201, 1056, "3"}, Shape{77, 130, 4160, "5"}}) {
      const QuantizedWeight w = make_weight(mode, sh.N, sh.K, g);
      const Act a = make_act(sh.M, sh.K, g);
      const auto bias = rand_f(size_t(sh.N), g, -1.f, 1.f);
      DevWeight dw(w);
      Dev<int8_t> dq(a.q);
      Dev<float> dsa(a.sa), db(bias);
      for (DType out : {DType::F32, DType::BF16, DType::I32}) {
        const size_t bytes = size_t(sh.M) * sh.N * (out == DType::BF16 ? 2 : 4);
        Dev<uint8_t> y1(bytes), ys(bytes);
        splits.set("0");
        pc::gemm_quant_wgmma(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, y1.p, out, sh.M, sh.N, sh.K, nullptr);
        splits.set(sh.forced);
        const size_t ws = pc::gemm_quant_wgmma_workspace_bytes(mode, sh.M, sh.N, sh.K);
        ASSERT_GT(ws, 0u) << "expected a split-K shape: M=" << sh.M << " N=" << sh.N << " K=" << sh.K;
        Dev<int> dws(ws / 4);
        ASSERT_EQ(cudaMemset(dws.p, 0xA5, ws), cudaSuccess);  // a sentinel the slices must overwrite
        pc::gemm_quant_wgmma(mode, dq.p, dsa.p, dw.q.p, dw.s.p, db.p, ys.p, out, sh.M, sh.N, sh.K, nullptr,
                             reinterpret_cast<float*>(dws.p), ws);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto slices = dws.get();
        size_t untouched = 0;
        for (int v : slices) untouched += v == int(0xA5A5A5A5u);
        EXPECT_LT(untouched, slices.size() / 100 + 1) << "the call did not split (its slices were not written)";
        const auto h1 = y1.get(), hs = ys.get();
        EXPECT_EQ(std::memcmp(h1.data(), hs.data(), bytes), 0)
            << perry::quant::quant_mode_name(mode) << " M=" << sh.M << " N=" << sh.N << " K=" << sh.K << " out " << int(out)
            << ": split-K differs from the unsplit kernel";
      }
    }
  }
}

// The W4A8 prefill path (LinearPath::ExpandWgmma): expand_int4_weight gives the host's int4
// values exactly (every nibble 0..15 in both halves of a byte), and the int8 wgmma GEMMs on the
// expansion, with the int4 mode's scales, give the float64 results — for w4a8-g128 the int4
// kernel's outputs bit for bit (the same integer group sums, the same fold order: sw·acc vs
// (sw/16)·(16·acc), both exact).
void expanded_int4_gemm(QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                        const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  Dev<int8_t> w8(size_t(N) * K);
  pc::expand_int4_weight(w, N, K, w8.p, stream);
  if (mode == QuantMode::W4A8) pc::gemm_w8a8_wgmma(x, sa, w8.p, s, bias, y, out, M, N, K, stream);
  else pc::gemm_quant_wgmma(QuantMode::W8A8_G128, x, sa, w8.p, s, bias, y, out, M, N, K, stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaGemmQuantWgmma, ExpandedInt4MatchesFloat64AndInt4Kernel) {
  REQUIRE_SM90();
  std::mt19937 g(24);
  {  // the expansion alone, exact: perry's quantizer's weights (values -7..7) against unpack, and
     // raw random bytes (every nibble, -8 included) against the packing rule
    const int N = 37, K = 4160;
    const QuantizedWeight w = make_weight(QuantMode::W4A8_G128, N, K, g);
    const auto wu = unpack(w);
    DevWeight dw(w);
    Dev<int8_t> w8(size_t(N) * K);
    pc::expand_int4_weight(dw.q.p, N, K, w8.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = w8.get();
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += int(got[i]) != wu[i];
    EXPECT_EQ(bad, 0u) << "expanded int4 differs from the quantizer's values";
    std::vector<uint8_t> raw(size_t(N) * K / 2);
    for (auto& b : raw) b = uint8_t(g());
    Dev<uint8_t> draw(raw);
    pc::expand_int4_weight(draw.p, N, K, w8.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got2 = w8.get();
    bad = 0;
    int lo = 0, hi = 0;
    for (size_t i = 0; i < got2.size(); ++i) {
      const int nib = i % 2 ? raw[i / 2] >> 4 : raw[i / 2] & 15;  // low nibble = even k
      bad += int(got2[i]) != ((nib ^ 8) - 8);
      lo = std::min(lo, int(got2[i]));
      hi = std::max(hi, int(got2[i]));
    }
    EXPECT_EQ(bad, 0u) << "expanded raw int4 bytes differ from the two's complement nibbles";
    EXPECT_EQ(lo, -8);
    EXPECT_EQ(hi, 7);
  }
  const char* nm = "expand_int4 + int8 wgmma ";
  for (QuantMode mode : {QuantMode::W4A8, QuantMode::W4A8_G128}) {
    for (DType out : {DType::F32, DType::BF16, DType::I32}) {
      run_gemm_case(mode, 300, 520, 1024, out != DType::F32, out, g, expanded_int4_gemm, nm);
      run_gemm_case(mode, 130, 257, 4160, true, out, g, expanded_int4_gemm, nm);  // odd N, partial group
    }
  }
  // Bit for bit against the int4 kernel (w4a8-g128, f32 and bf16 out, with a bias).
  const GemmQuantFn int4_kernel = pc::gemm_quant_wgmma;  // (the overload without a workspace)
  for (DType out : {DType::F32, DType::BF16})
    expect_same_bits(int4_kernel, expanded_int4_gemm, 300, 520, 1024, out, g, "expanded vs int4 kernel");
}

// The two-level prefill path of w4a8-g128 (LinearPath::ExpandTwoLevelWgmma): the quantizer's scales
// factor into channel scales and multipliers (quant/two_level_scales.h),
// expand_int4_weight_two_level gives q4·m exactly, and gemm_w8a8_wgmma on the expansion with the
// channel scales gives the float64 result of the grouped math (the same integer products, summed
// over K before one scale instead of per group: close, not bit for bit).
// The device scales s [N, K/128] factored as CudaLinear::upload factors a checkpoint's.
void factor_device_scales(QuantMode mode, const float* s, int N, int K, perry::quant::TwoLevelScales& f) {
  QuantizedWeight hw;
  hw.mode = mode;
  hw.N = N;
  hw.K = K;
  hw.scales.resize(size_t(N) * size_t(mode == QuantMode::W4A8 ? 1 : K / 128));  // (w4a8: per channel)
  ASSERT_EQ(cudaMemcpy(hw.scales.data(), s, hw.scales.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  const auto got = perry::quant::int4_two_level_factors(hw);
  ASSERT_TRUE(got.has_value()) << "the quantizer's " << mode_name(mode) << " scales do not factor";
  f = *got;
}

void two_level_gemm(QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                    const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  perry::quant::TwoLevelScales f;
  ASSERT_NO_FATAL_FAILURE(factor_device_scales(mode, s, N, K, f));
  Dev<float> ch(f.channel);
  Dev<int8_t> mul(f.multiplier), w8(size_t(N) * K);
  pc::expand_int4_weight_two_level(w, mul.p, 128, N, K, w8.p, stream);
  pc::gemm_w8a8_wgmma(x, sa, w8.p, ch.p, bias, y, out, M, N, K, stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaGemmQuantWgmma, TwoLevelExpandedMatchesFloat64) {
  REQUIRE_SM90();
  std::mt19937 g(31);
  {  // the expansion alone, exact: the quantizer's weights and factors, then random nibbles -7..7
     // with random multipliers 0..18 (products up to ±126 in both halves of every byte)
    const int N = 37, K = 4096, G = K / 128;
    const QuantizedWeight w = make_weight(QuantMode::W4A8_G128, N, K, g);
    const auto f = perry::quant::two_level_scales(w);
    ASSERT_TRUE(f.has_value());
    const auto wu = unpack(w);
    DevWeight dw(w);
    Dev<int8_t> mul(f->multiplier), w8(size_t(N) * K);
    ASSERT_NO_THROW(pc::expand_int4_weight_two_level(dw.q.p, mul.p, 128, N, K, w8.p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = w8.get();
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += int(got[i]) != wu[i] * f->multiplier[i / K * G + i % K / 128];
    EXPECT_EQ(bad, 0u) << "the expansion differs from q4 times the multiplier";
    std::vector<uint8_t> raw(size_t(N) * K / 2);
    std::vector<int8_t> rm(size_t(N) * G);
    std::uniform_int_distribution<int> dn(-7, 7), dm(0, 18);
    for (auto& b : raw) b = uint8_t((dn(g) & 15) | ((dn(g) & 15) << 4));
    for (auto& m : rm) m = int8_t(dm(g));
    rm[0] = 18;
    Dev<uint8_t> draw(raw);
    Dev<int8_t> drm(rm);
    pc::expand_int4_weight_two_level(draw.p, drm.p, 128, N, K, w8.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got = w8.get();
    bad = 0;
    int lo = 0, hi = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int nib = i % 2 ? raw[i / 2] >> 4 : raw[i / 2] & 15;  // low nibble = even k
      const int want = ((nib ^ 8) - 8) * rm[i / K * G + i % K / 128];
      bad += int(got[i]) != want;
      lo = std::min(lo, int(got[i]));
      hi = std::max(hi, int(got[i]));
    }
    EXPECT_EQ(bad, 0u) << "the expansion of raw nibbles differs from nibble times multiplier";
    EXPECT_EQ(lo, -126);
    EXPECT_EQ(hi, 126);
    EXPECT_THROW(pc::expand_int4_weight_two_level(draw.p, drm.p, 128, N, K + 32, w8.p, nullptr), perry::Error);
    EXPECT_THROW(pc::expand_int4_weight_two_level(draw.p, drm.p, 48, N, K, w8.p, nullptr), perry::Error);
    EXPECT_THROW(pc::expand_int4_weight_two_level(draw.p, nullptr, 128, N, K, w8.p, nullptr), perry::Error);
  }
  const char* nm = "expand_int4_two_level + gemm_w8a8_wgmma ";
  for (DType out : {DType::F32, DType::BF16}) {
    run_gemm_case(QuantMode::W4A8_G128, 300, 520, 1024, out == DType::BF16, out, g, two_level_gemm, nm);
    run_gemm_case(QuantMode::W4A8_G128, 257, 131, 4096, true, out, g, two_level_gemm, nm);  // odd N
    run_gemm_case(QuantMode::W4A8_G128, 300, 256, 14336, false, out, g, two_level_gemm, nm);  // down_proj's K
  }
}

// The register-A kernel of the same layer (LinearPath::TwoLevelWgmma, gemm_w4a8_two_level.h): no
// expansion pass, the codes q4·m built in registers as wgmma's A operand. `split`: with its split-K
// workspace and tile counters (kGemmW8A8TileFlags, zeroed once for the whole test program: every
// call must leave them zero, which each call checks); otherwise none, so it runs unsplit.
uint32_t* split_tile_flags() {
  static Dev<uint32_t>* flags = [] {
    auto* f = new Dev<uint32_t>(size_t(pc::kGemmW8A8TileFlags));
    EXPECT_EQ(cudaMemset(f->p, 0, f->n * 4), cudaSuccess);
    return f;
  }();
  return flags->p;
}
void two_level_rs_call(bool split, QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                       const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  perry::quant::TwoLevelScales f;
  ASSERT_NO_FATAL_FAILURE(factor_device_scales(mode, s, N, K, f));
  Dev<float> ch(f.channel);
  Dev<int8_t> mul(f.multiplier);
  const size_t ws = split ? pc::gemm_w4a8_two_level_wgmma_workspace_bytes(M, N, K) : 0;
  Dev<int32_t> part(ws / 4 + 4);
  ASSERT_EQ(cudaMemset(part.p, 0x5A, part.n * 4), cudaSuccess);  // (not zeros: a slot never written shows)
  pc::gemm_w4a8_two_level_wgmma(x, sa, w, mul.p, ch.p, bias, y, out, M, N, K, stream, split ? part.p : nullptr, ws,
                                split ? split_tile_flags() : nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (!split) return;
  std::vector<uint32_t> fl(size_t(pc::kGemmW8A8TileFlags));
  ASSERT_EQ(cudaMemcpy(fl.data(), split_tile_flags(), fl.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::count(fl.begin(), fl.end(), 0u), ptrdiff_t(fl.size())) << "the split-K tile counters were left non-zero";
}
void two_level_rs_gemm(QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                       const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  two_level_rs_call(false, mode, x, sa, w, s, bias, y, out, M, N, K, stream);
}
void two_level_rs_split_gemm(QuantMode mode, const int8_t* x, const float* sa, const void* w, const float* s,
                             const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  two_level_rs_call(true, mode, x, sa, w, s, bias, y, out, M, N, K, stream);
}

// Checked three ways, each tile width (128 and 256 tokens, forced; the output through TMA stores
// where rows are 16-byte multiples, else direct stores; both): the int32 sums exactly against
// the host's Σ x·q4·m on raw nibbles −8..7 and multipliers 0..18 (every product the conversion
// is exact for: −8 only under multipliers <= 16, q·m >= −128); F32 / BF16 against the float64
// grouped math; and bit for bit against the expansion pass + gemm_w8a8_wgmma, whose epilogue
// expression the kernel shares.
TEST(CudaGemmQuantWgmma, TwoLevelRegisterAMatchesExactAndExpanded) {
  REQUIRE_SM90();
  std::mt19937 g(47);
  ScopedEnv bx("PERRY_TWO_LEVEL_BX", nullptr);
  // (M, N, K): edges in M and N (partial tiles, rows past N), one group, many groups.
  auto exact_i32 = [&](const std::string& what) {
    for (auto [M, N, K] : {std::tuple{300, 200, 1024}, std::tuple{77, 131, 128}, std::tuple{300, 384, 2048}}) {
      const int G = K / 128;
      std::vector<uint8_t> raw(size_t(N) * K / 2);
      std::vector<int8_t> mult(size_t(N) * G), xq(size_t(M) * K);
      std::uniform_int_distribution<int> dn(-8, 7), dm(0, 18), dx(-127, 127);
      for (auto& m : mult) m = int8_t(dm(g));
      mult[0] = 18;
      mult[mult.size() - 1] = 18;
      mult[1 % mult.size()] = 16;
      // Codes −8..7 where q·m fits int8 (multipliers <= 16), −7..7 under 17 and 18: every
      // product the conversion is exact for (QuantizedWeight::validate keeps a model's codes in
      // −7..7; −8 here covers the conversion's full range, q·m >= −128).
      auto code = [&](int n, int k) {
        int q = dn(g);
        while (q == -8 && mult[size_t(n) * G + k / 128] > 16) q = dn(g);
        return q & 15;
      };
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; k += 2) raw[(size_t(n) * K + k) / 2] = uint8_t(code(n, k) | (code(n, k + 1) << 4));
      for (auto& v : xq) v = int8_t(dx(g));
      std::vector<int64_t> want(size_t(M) * N, 0);
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          const int nib = k % 2 ? raw[(size_t(n) * K + k) / 2] >> 4 : raw[(size_t(n) * K + k) / 2] & 15;
          const int64_t q = int64_t((nib ^ 8) - 8) * mult[size_t(n) * G + k / 128];
          for (int m = 0; m < M; ++m) want[size_t(m) * N + n] += q * xq[size_t(m) * K + k];
        }
      Dev<uint8_t> dw(raw);
      Dev<int8_t> dmul(mult), dx8(xq);
      Dev<int32_t> y(size_t(M) * N);
      ASSERT_EQ(cudaMemset(y.p, 0xFF, y.n * 4), cudaSuccess);
      ASSERT_NO_THROW(pc::gemm_w4a8_two_level_wgmma(dx8.p, nullptr, dw.p, dmul.p, nullptr, nullptr, y.p, DType::I32, M,
                                                    N, K, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = y.get();
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += int64_t(got[i]) != want[i];
      EXPECT_EQ(bad, 0u) << "int32 sums, " << what << ", M=" << M << " N=" << N << " K=" << K;
    }
  };
  for (const char* width : {"128", "160", "192", "224", "256"}) {
    bx.set(width);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(300, 520), std::atoi(width)) << "PERRY_TWO_LEVEL_BX";
    exact_i32(std::string("tile width ") + width);
    const std::string nm = std::string("gemm_w4a8_two_level_wgmma (") + width + " tokens) ";
    for (DType out : {DType::F32, DType::BF16}) {
      run_gemm_case(QuantMode::W4A8_G128, 300, 520, 1024, true, out, g, two_level_rs_gemm, nm.c_str());
      run_gemm_case(QuantMode::W4A8_G128, 257, 131, 4096, out == DType::BF16, out, g, two_level_rs_gemm, nm.c_str());
      if (std::string(width) == "256") {  // (down_proj's K once: its float64 reference is the slow part)
        run_gemm_case(QuantMode::W4A8_G128, 300, 256, 14336, false, out, g, two_level_rs_gemm, nm.c_str());
        run_gemm_case(QuantMode::W4A8_G128, 20, 264, 512, true, out, g, two_level_rs_gemm, nm.c_str());  // M < a chunk
      }
      {  // the direct-store epilogue on a shape the TMA store takes (the A/B switch)
        ScopedEnv direct("PERRY_TWO_LEVEL_DIRECT_STORE", "1");
        run_gemm_case(QuantMode::W4A8_G128, 300, 520, 1024, true, out, g, two_level_rs_gemm, nm.c_str());
      }
    }
    // Bit for bit against the expansion path (f32 and bf16 out, with a bias).
    for (DType out : {DType::F32, DType::BF16})
      expect_same_bits(two_level_rs_gemm, two_level_gemm, 600, 392, 2048, out, g, nm + "vs the expansion path");
  }
  // The default width: the waves' time on 132 SMs (H100 / H200 SXM). 256 where the waves come out
  // nearly full anyway; narrower where it saves a wave: N 2560 at M 2048 (160 tiles of 256 tokens:
  // two waves, the second 21% full; 260 of 160: two full ones), M 1024 (80 → 120 tiles: one wave
  // at 192), and a 200-token prompt (one 224-token tile row, not two of 128).
  bx.set(nullptr);
  if (pc::sm_count() == 132) {
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(4096, 14336), 256);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(2048, 4096), 256);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(2048, 2560), 160);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(1024, 2560), 192);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(200, 14336), 224);
  }
  // Bad arguments: K not a multiple of 128, null multipliers / channel scales (F32), misaligned x.
  Dev<int8_t> x(64 * 256), w(64 * 128), m(64 * 2);
  Dev<float> c(64), sa(64), y(64 * 64);
  auto call = [&](const int8_t* px, const int8_t* pm, const float* pc_, int K) {
    pc::gemm_w4a8_two_level_wgmma(px, sa.p, w.p, pm, pc_, nullptr, y.p, DType::F32, 64, 64, K, nullptr);
  };
  EXPECT_THROW(call(x.p, m.p, c.p, 192), perry::Error);
  EXPECT_THROW(call(x.p, m.p, c.p, 0), perry::Error);
  EXPECT_THROW(call(x.p, nullptr, c.p, 256), perry::Error);
  EXPECT_THROW(call(x.p, m.p, nullptr, 256), perry::Error);
  EXPECT_THROW(call(x.p + 1, m.p, c.p, 256), perry::Error);
  EXPECT_NO_THROW(call(x.p, m.p, c.p, 256));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Split-K of the register-A kernel: the tile's last split adds the others' int32 sums, so every
// output — the int32 sums, F32, BF16 with a bias — equals the unsplit kernel's bit for bit (whose
// sums are exact against the host in TwoLevelRegisterAMatchesExactAndExpanded). Forced counts
// (even and uneven k-ranges, one stage a split, both ends of the tile widths, M and N edges) and
// the default plan where it splits on 132 SMs; the counters are shared by every call.
TEST(CudaGemmQuantWgmma, TwoLevelSplitKIsBitExact) {
  REQUIRE_SM90();
  std::mt19937 g(53);
  ScopedEnv sk("PERRY_TWO_LEVEL_SPLITK", nullptr), bx("PERRY_TWO_LEVEL_BX", nullptr);
  for (const char* width : {"128", "256"}) {
    bx.set(width);
    for (const char* splits : {"2", "3", "7"}) {
      sk.set(splits);
      const std::string nm = std::string("split-K ") + splits + ", " + width + " tokens";
      EXPECT_GT(pc::gemm_w4a8_two_level_wgmma_splits(300, 384, 2048), 1) << nm;
      for (DType out : {DType::I32, DType::F32, DType::BF16})
        expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 300, 384, 2048, out, g, nm);
      expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 77, 131, 1152, DType::BF16, g, nm + " (edges)");
    }
    sk.set("16");  // K 1152 = 9 stages: 9 splits of one stage
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(300, 384, 1152), 9);
    expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 300, 384, 1152, DType::I32, g, "one stage a split");
    run_gemm_case(QuantMode::W4A8_G128, 300, 384, 1152, true, DType::F32, g, two_level_rs_split_gemm,
                  "gemm_w4a8_two_level_wgmma, 9 k-splits ");
  }
  bx.set(nullptr);
  sk.set(nullptr);
  // The default plan: a short prompt on N 4096 × K 14336 (32 tiles of 128 tokens) splits; a long
  // one on N 14336 does not; PERRY_TWO_LEVEL_SPLITK=0 turns it off.
  if (pc::sm_count() == 132) {
    EXPECT_GT(pc::gemm_w4a8_two_level_wgmma_splits(128, 4096, 14336), 1);
    EXPECT_GT(pc::gemm_w4a8_two_level_wgmma_workspace_bytes(128, 4096, 14336), 0u);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(4096, 14336, 4096), 1);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_workspace_bytes(4096, 14336, 4096), 0u);
    for (DType out : {DType::I32, DType::BF16})
      expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 128, 4096, 14336, out, g, "default plan");
  }
  sk.set("0");
  EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(128, 4096, 14336), 1);
}

// The tail split (fortieth session): whole tiles first, then split ones — the last partial wave's
// tiles by default, any number forced (PERRY_TWO_LEVEL_WHOLE_TILES with PERRY_TWO_LEVEL_SPLITK). The
// split tiles number their workspace slots and counters from the first of them; a CTA runs whole
// tiles and then split units. Bit for bit the unsplit kernel's, counters left zero.
TEST(CudaGemmQuantWgmma, TwoLevelTailSplitIsBitExact) {
  REQUIRE_SM90();
  std::mt19937 g(61);
  ScopedEnv sk("PERRY_TWO_LEVEL_SPLITK", "3"), whole("PERRY_TWO_LEVEL_WHOLE_TILES", "5"),
      tail("PERRY_TWO_LEVEL_SPLIT_TAIL", nullptr), bx("PERRY_TWO_LEVEL_BX", "128");
  // 9 tiles of 128 tokens: 5 whole, 4 split in 3 (K 2048's 16 stages as 6 + 6 + 4)
  EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(300, 384, 2048), 3);
  EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_whole_tiles(300, 384, 2048), 5);
  for (DType out : {DType::I32, DType::F32, DType::BF16})
    expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 300, 384, 2048, out, g, "5 whole tiles, 4 split in 3");
  run_gemm_case(QuantMode::W4A8_G128, 300, 384, 2048, true, DType::F32, g, two_level_rs_split_gemm,
                "gemm_w4a8_two_level_wgmma, tail split ");
  // More units than SMs: CTAs run whole tiles, then several split units each (192 tiles of 128
  // tokens on N 1536, M 2048: 100 whole, 92 × 3 split units).
  whole.set("100");
  EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_whole_tiles(2048, 1536, 1024), 100);
  expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 2048, 1536, 1024, DType::I32, g, "100 whole, 92 split");
  sk.set(nullptr);
  whole.set(nullptr);
  bx.set(nullptr);
  // The default plan on 132 SMs: N 6144 × K 4096 at M 1024 is 192 tiles of 256 tokens — one whole
  // wave and 60 tiles split in two; PERRY_TWO_LEVEL_SPLIT_TAIL=0 leaves it unsplit.
  if (pc::sm_count() == 132) {
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(1024, 6144, 4096), 2);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_whole_tiles(1024, 6144, 4096), 132);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_tile_tokens(1024, 6144), 224);  // (the unsplit width)
    for (DType out : {DType::I32, DType::BF16})
      expect_same_bits(two_level_rs_split_gemm, two_level_rs_gemm, 1024, 6144, 4096, out, g, "default tail split");
    tail.set("0");
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_splits(1024, 6144, 4096), 1);
    EXPECT_EQ(pc::gemm_w4a8_two_level_wgmma_whole_tiles(1024, 6144, 4096), 240);
  }
}

// Per-channel w4a8 on the two-level kernels (int4_two_level_factors: its scales as the channel
// scales, multipliers of 1), as CudaLinear runs it since the thirty-ninth session: against the
// float64 per-channel math, and bit for bit against the expansion pass + gemm_w8a8_wgmma (the
// int8 codes q·1 are the plain expansion's), unsplit and split.
TEST(CudaGemmQuantWgmma, TwoLevelKernelsRunPerChannelW4A8) {
  REQUIRE_SM90();
  std::mt19937 g(59);
  ScopedEnv sk("PERRY_TWO_LEVEL_SPLITK", nullptr);
  const std::string nm = "w4a8 on the two-level kernels ";
  for (DType out : {DType::F32, DType::BF16}) {
    run_gemm_case(QuantMode::W4A8, 300, 520, 1024, true, out, g, two_level_rs_gemm, (nm + "(register) ").c_str());
    run_gemm_case(QuantMode::W4A8, 257, 131, 2048, false, out, g, two_level_gemm, (nm + "(expansion) ").c_str());
    expect_same_bits(two_level_rs_gemm, two_level_gemm, 300, 392, 2048, out, g, nm + "register vs expansion",
                     QuantMode::W4A8);
  }
  sk.set("3");
  run_gemm_case(QuantMode::W4A8, 200, 256, 4096, true, DType::F32, g, two_level_rs_split_gemm, (nm + "3 k-splits ").c_str());
  expect_same_bits(two_level_rs_split_gemm, two_level_gemm, 200, 256, 4096, DType::BF16, g, nm + "split vs expansion",
                   QuantMode::W4A8);
}

TEST(CudaGemmQuantWgmma, BadArgumentsThrow) {
  REQUIRE_SM90();
  Dev<int8_t> x(16 * 256), w(64 * 256);
  Dev<float> s(64 * 4), sa(16), y(16 * 64 * 2);  // I32 out: [M, N, G = 2]
  auto call = [&](QuantMode mode, int M, int N, int K, DType out, const float* psa) {
    pc::gemm_quant_wgmma(mode, x.p, psa, w.p, s.p, nullptr, y.p, out, M, N, K, nullptr);
  };
  EXPECT_THROW(call(QuantMode::W8A8_G128, 0, 64, 128, DType::F32, sa.p), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G128, 16, 64, 200, DType::F32, sa.p), perry::Error);  // K % 16
  EXPECT_THROW(call(QuantMode::W4A8_G128, 16, 64, 48, DType::F32, sa.p), perry::Error);   // K % 32
  EXPECT_THROW(call(QuantMode::W4A16, 16, 64, 128, DType::F32, sa.p), perry::Error);      // weight-only
  EXPECT_THROW(call(QuantMode::W8A8_G64, 16, 64, 128, DType::F32, nullptr), perry::Error);
  EXPECT_THROW(call(QuantMode::W8A8_G64, 16, 64, 128, DType::I8, sa.p), perry::Error);
  EXPECT_THROW(pc::gemm_quant_wgmma(QuantMode::W4A8, x.p + 1, sa.p, w.p, s.p, nullptr, y.p, DType::F32, 16, 64,
                                    128, nullptr),
               perry::Error);  // misaligned x
  EXPECT_NO_THROW(call(QuantMode::W4A8_G128, 16, 64, 256, DType::I32, nullptr));  // I32: no scales needed
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaDequantBf16, BitExactAgainstHost) {
  REQUIRE_GPU();
  std::mt19937 g(11);
  // K % 32 == 0 takes the 16-byte-chunk kernel (2048 x 4096: more chunks than its grid, so threads
  // loop), K 129 and 1 the scalar one.
  const std::pair<int, int> shapes[] = {{200, 320}, {37, 192}, {17, 129}, {3, 1}, {300, 4160}, {2048, 4096}};
  for (QuantMode mode : kAllModes)
    for (auto [N, K] : shapes) {
      const auto mb = pc::quant_mode_bits(mode);
      const QuantizedWeight w = make_weight(mode, N, K, g);
      const int G = w.n_groups();
      std::vector<uint16_t> want(size_t(N) * K);
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          const float sc = w.scales[size_t(n) * G + (mb.group_size ? k / mb.group_size : 0)];
          want[size_t(n) * K + k] = perry::f32_to_bf16(float(w.weight(n, k)) * sc);
        }
      DevWeight dw(w);
      Dev<uint16_t> out(want.size());
      ASSERT_EQ(cudaMemset(out.p, 0xFF, out.n * 2), cudaSuccess);
      pc::dequantize_weight_bf16(dw.q.p, dw.s.p, mb.bits, mb.group_size, N, K, out.p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = out.get();
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
      EXPECT_EQ(bad, 0u) << mode_name(mode) << " N=" << N << " K=" << K;
    }
  Dev<int8_t> q(16);
  Dev<float> s(4);
  Dev<uint16_t> o(16);
  EXPECT_THROW(pc::dequantize_weight_bf16(q.p, s.p, 2, 128, 1, 16, o.p, nullptr), perry::Error);
  EXPECT_THROW(pc::dequantize_weight_bf16(q.p, s.p, 8, -1, 1, 16, o.p, nullptr), perry::Error);
  EXPECT_THROW(pc::dequantize_weight_bf16(q.p, s.p, 8, 128, 0, 16, o.p, nullptr), perry::Error);
  EXPECT_THROW(pc::dequantize_weight_bf16(nullptr, s.p, 8, 128, 1, 16, o.p, nullptr), perry::Error);
}

}  // namespace
