// gemm_weight_only_wgmma (sm_90a, w8a16 / w4a16 prefill): its
// operands are dequantize_weight_bf16's bf16 values bit for bit, so its outputs must match
//   (a) the float64 sums over the host-rounded bf16 weights, within the error of an fp32
//       accumulation of K terms (plus the bf16 output's rounding), and
//   (b) dequantize_weight_bf16 + a cuBLAS bf16 GEMM (the call CudaLinear's DequantCublas path
//       makes) within twice that bound;
// with and without bias, fp32 and bf16 outputs, every tile width (PERRY_WEIGHT_ONLY_BN 32, 64, 128,
// 256, and the automatic choice), per channel and grouped scales, M and N off the tiles (M 1-64 for
// the short-input tiles, 65, 257, 300; N 131, 200, 384) and K from one stage (64) to 4096.
// Every code value occurs (int8 −128..127, every nibble), scales differ by row and group.
// (d) K off the 64-k stage and unsupported group sizes throw perry::Error.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemm_weight_only_sm90.h"
#include "kernels/cuda/gemv_quant.h"

#include "cuda/cuda_test_util.h"

namespace {
using namespace perry::cuda::testing;  // (pc = perry::cuda, Dev, rand_f)
using perry::DType;

#define REQUIRE_SM90()  \
  REQUIRE_GPU();        \
  if (!pc::gemm_weight_only_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: gemm_weight_only_wgmma skipped"

// Sets an environment variable for a scope (the tile width the kernel reads per call).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

// One weight-only layer: codes (int8 [N, K] or packed int4 [N, K/2], low nibble = even k), scales
// [N, G], bf16 x [M, K], bias [N]; the host's bf16 weights bf16_rn(float(q)·s) and their float64
// reference sums (ref) with the sums of |terms| (mag, the error scale).
struct Layer {
  int bits, gs, M, N, K, G;
  std::vector<uint8_t> q;
  std::vector<float> scales, bias;
  std::vector<uint16_t> x, wdq;
  Dev<uint8_t> dq;
  Dev<float> ds, dbias;
  Dev<uint16_t> dx;
  Layer(int bits_, int gs_, int M_, int N_, int K_, std::mt19937& g)
      : bits(bits_), gs(gs_), M(M_), N(N_), K(K_), G(gs_ > 0 ? (K_ + gs_ - 1) / gs_ : 1),
        q(make_codes(bits_, N_, K_, g)), scales(make_scales(N_, G, g)), bias(rand_f(size_t(N_), g, -1.f, 1.f)),
        x(make_x(M_, K_, g)), wdq(host_dequant()), dq(q), ds(scales), dbias(bias), dx(x) {}

  static std::vector<uint8_t> make_codes(int bits, int N, int K, std::mt19937& g) {
    std::uniform_int_distribution<int> d(0, 255);
    std::vector<uint8_t> v(size_t(N) * (bits == 8 ? K : K / 2));
    for (auto& b : v) b = uint8_t(d(g));  // int8: −128..127; int4: every nibble −8..7
    return v;
  }
  static std::vector<float> make_scales(int N, int G, std::mt19937& g) {
    std::uniform_real_distribution<float> d(0.5f, 2.f);
    std::vector<float> s(size_t(N) * G);
    for (int n = 0; n < N; ++n)
      for (int gi = 0; gi < G; ++gi) s[size_t(n) * G + gi] = d(g) * (0.002f + 0.001f * float(n % 7 + gi % 3));
    return s;
  }
  static std::vector<uint16_t> make_x(int M, int K, std::mt19937& g) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> v(size_t(M) * K);
    for (auto& h : v) h = perry::f32_to_bf16(nd(g));
    return v;
  }
  int code(int n, int k) const {
    if (bits == 8) return int(int8_t(q[size_t(n) * K + k]));
    const int b = q[size_t(n) * (K / 2) + k / 2];
    const int nib = (k & 1) ? b >> 4 : b & 0xF;
    return nib >= 8 ? nib - 16 : nib;
  }
  // dequantize_weight_bf16's documented values: perry::f32_to_bf16(float(q)·s), fp32 product.
  std::vector<uint16_t> host_dequant() const {
    std::vector<uint16_t> w(size_t(N) * K);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const float s = scales[size_t(n) * G + (gs > 0 ? k / gs : 0)];
        w[size_t(n) * K + k] = perry::f32_to_bf16(float(code(n, k)) * s);
      }
    return w;
  }
  void reference(std::vector<double>& ref, std::vector<double>& mag) const {
    std::vector<double> xd(x.size()), wd(wdq.size());
    for (size_t i = 0; i < x.size(); ++i) xd[i] = perry::bf16_to_f32(x[i]);
    for (size_t i = 0; i < wdq.size(); ++i) wd[i] = perry::bf16_to_f32(wdq[i]);
    ref.assign(size_t(M) * N, 0.0);
    mag.assign(size_t(M) * N, 0.0);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = 0, a = 0;
        const double* xr = &xd[size_t(m) * K];
        const double* wr = &wd[size_t(n) * K];
        for (int k = 0; k < K; ++k) {
          s += xr[k] * wr[k];
          a += std::fabs(xr[k] * wr[k]);
        }
        ref[size_t(m) * N + n] = s;
        mag[size_t(m) * N + n] = a;
      }
  }
  // ws: split-K's workspace (none: the call runs unsplit).
  void run(void* y, DType out, bool with_bias, float* ws = nullptr, size_t ws_bytes = 0) const {
    pc::gemm_weight_only_wgmma(dx.p, dq.p, ds.p, bits, gs, with_bias ? dbias.p : nullptr, y, out, M, N, K, nullptr, ws,
                               ws_bytes);
  }
};

// The bound of an fp32 sum of K products (each exact in fp32: bf16 × bf16) against the exact sum:
// K·2^-24 of the sum of |terms| (the usual γ_K), doubled for the tensor core's accumulation order
// and its internal alignment of the addends.
double fp32_sum_bound(int K, double mag) { return 2.0 * double(K + 1) * std::ldexp(1.0, -24) * mag + 1e-30; }

// The outputs of one call as floats (bf16 widened).
std::vector<float> read_out(const Dev<uint8_t>& y, DType out, size_t count) {
  const auto raw = y.get();
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    if (out == DType::F32) {
      float f;
      std::memcpy(&f, &raw[4 * i], 4);
      v[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      v[i] = perry::bf16_to_f32(h);
    }
  }
  return v;
}

// dequantize_weight_bf16 into w16, then cuBLAS as CudaLinear's gemm_bf16_cublas calls it (y = bias
// and beta = 1 for a bias, fp32 output only).
void dequant_cublas(const Layer& L, Dev<uint16_t>& w16, void* y, DType out, bool with_bias) {
  pc::dequantize_weight_bf16(L.dq.p, L.ds.p, L.bits, L.gs, L.N, L.K, w16.p, nullptr);
  static cublasHandle_t h = [] {
    cublasHandle_t c = nullptr;
    EXPECT_EQ(cublasCreate(&c), CUBLAS_STATUS_SUCCESS);
    return c;
  }();
  float alpha = 1.f, beta = 0.f;
  if (with_bias) {
    std::vector<float> yb(size_t(L.M) * L.N);
    for (int m = 0; m < L.M; ++m)
      for (int n = 0; n < L.N; ++n) yb[size_t(m) * L.N + n] = L.bias[size_t(n)];
    ASSERT_EQ(cudaMemcpy(y, yb.data(), yb.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    beta = 1.f;
  }
  const cudaDataType_t yt = out == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, L.N, L.M, L.K, &alpha, w16.p, CUDA_R_16BF, L.K, L.dx.p,
                         CUDA_R_16BF, L.K, &beta, y, yt, L.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
}

struct Shape {
  int M, N, K;
};
// (M, N, K): M and N off the 128 / 256 tiles, one stage (K 64) to 64 stages; the last two are
// checked against the device path only (their float64 reference would take minutes). {65, 131,
// 192}: an odd N (a last weight tile of 3 rows), an odd stage count above one (the two fragment
// sets end on the first) and, at group 128, a last group of one stage (G = ceil(K / 128) = 2).
// The short inputs (M 1-64, batched decode: the 32 / 64-token tiles) likewise off their tiles.
const Shape kShapes[] = {{65, 128, 64},    {65, 200, 128},   {65, 131, 192},  {128, 128, 4096},  {300, 200, 128},
                         {257, 384, 256},  {300, 200, 4096}, {300, 4096, 128}, {1, 200, 128},    {5, 131, 192},
                         {16, 384, 1024},  {33, 128, 64},    {48, 4096, 1024}, {64, 200, 4096},
                         {128, 4096, 4096}, {1024, 4096, 4096}};
constexpr double kHostRefMaxMacs = 3e8;
// (bits, group size): the modes' g128, per channel, and other accepted groups (64, 256).
const std::pair<int, int> kFormats[] = {{8, 128}, {4, 128}, {8, 0}, {4, 0}, {8, 64}, {4, 256}};

TEST(CudaGemmWeightOnlyWgmma, DequantValuesAreTheHostRounding) {
  REQUIRE_SM90();
  std::mt19937 g(71);
  for (const auto& [bits, gs] : kFormats) {
    const Layer L(bits, gs, 1, 200, 256, g);
    Dev<uint16_t> w16(size_t(L.N) * L.K);
    pc::dequantize_weight_bf16(L.dq.p, L.ds.p, bits, gs, L.N, L.K, w16.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(w16.get() == L.wdq) << "bits " << bits << " group " << gs
                                    << ": the host reference's weights are not dequantize_weight_bf16's";
  }
}

TEST(CudaGemmWeightOnlyWgmma, MatchesFloat64AndDequantCublas) {
  REQUIRE_SM90();
  std::mt19937 g(72);
  for (const auto& [bits, gs] : kFormats)
    for (const Shape& sh : kShapes) {
      // (the large shapes once per bit width: the g128 modes)
      if (double(sh.M) * sh.N * sh.K > 1e9 && gs != 128) continue;
      const Layer L(bits, gs, sh.M, sh.N, sh.K, g);
      const std::string what = "w" + std::to_string(bits) + "a16 group " + std::to_string(gs) + " M=" +
                               std::to_string(sh.M) + " N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K);
      ASSERT_TRUE(pc::gemm_weight_only_wgmma_accepts(bits, gs, sh.M, sh.N, sh.K, DType::F32)) << what;
      const size_t count = size_t(sh.M) * sh.N;
      const bool host = double(sh.M) * sh.N * sh.K <= kHostRefMaxMacs;
      std::vector<double> ref, mag;
      if (host) L.reference(ref, mag);
      Dev<uint16_t> w16(size_t(sh.N) * sh.K);
      // Every tile width; split-K: none, the automatic plan (splits where the tiles leave SMs idle),
      // and 3 forced (every shape with K >= 128: units of one stage at K 192, a short last split at
      // K 4096); and both chosen as a call without the variables would.
      for (const auto& [bn, split] :
           {std::pair<const char*, const char*>{"128", "0"}, {"256", "0"}, {"128", ""}, {"256", ""}, {"128", "3"},
            {"32", "0"}, {"64", ""}, {"32", "3"}, {"", ""}}) {
        ScopedEnv env("PERRY_WEIGHT_ONLY_BN", bn), env_split("PERRY_WEIGHT_ONLY_SPLITK", split);
        const size_t wb = pc::gemm_weight_only_wgmma_workspace_bytes(sh.M, sh.N, sh.K);
        Dev<float> ws(std::max<size_t>(wb / 4, 1));
        for (DType out : {DType::F32, DType::BF16})
          for (bool with_bias : {false, true}) {
            const std::string w2 = what + " BN " + (*bn ? bn : "auto") + " split " + (*split ? split : "auto") + " (" +
                                   std::to_string(wb) + " B)" + (out == DType::F32 ? " f32" : " bf16") +
                                   (with_bias ? " +bias" : "");
            const size_t es = out == DType::F32 ? 4 : 2;
            Dev<uint8_t> y(count * es), yc(count * es);
            ASSERT_EQ(cudaMemset(y.p, 0xFF, y.n), cudaSuccess);  // (NaN: every output must be written)
            L.run(y.p, out, with_bias, ws.p, wb);
            const bool cublas = out == DType::F32 || !with_bias;  // (cuBLAS adds a bias into fp32 only)
            if (cublas) dequant_cublas(L, w16, yc.p, out, with_bias);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << w2;
            const auto got = read_out(y, out, count);
            const auto want = cublas ? read_out(yc, out, count) : std::vector<float>();
            size_t bad_ref = 0, bad_cublas = 0, first_ref = 0, first_cublas = 0;
            // Which n % 32 and m % 32 the bad outputs have (bit i: some bad output there): a code tile
            // read with the wrong swizzle shows as a pattern in n (int8: (n / 2) % 4 != 0; int4:
            // n % 8 >= 4), a fragment or X descriptor error as one in m or in both.
            uint32_t bad_n = 0, bad_m = 0;
            auto mark = [&](size_t i) {
              bad_n |= 1u << ((i % size_t(sh.N)) % 32);
              bad_m |= 1u << ((i / size_t(sh.N)) % 32);
            };
            double worst = 0;  // the largest error against the float64 sum, in units of the bound
            // Without the float64 sums (the large shapes) the scale of Σ|terms| is estimated from
            // the outputs: about sqrt(K) times their RMS for random signs (×4 for slack).
            double rms = 0;
            if (cublas && !host) {
              for (float v : want) rms += double(v) * double(v);
              rms = std::sqrt(rms / double(count));
            }
            // A layout or conversion error moves outputs by their own size: the relative L2 errors
            // (against the float64 sums, and against cuBLAS) must stay at the fp32 rounding level.
            double d_ref = 0, n_ref = 0, d_cub = 0, n_cub = 0;
            for (size_t i = 0; i < count; ++i) {
              const double b = with_bias ? double(L.bias[i % size_t(sh.N)]) : 0.0;
              const double m = host ? mag[i] + std::fabs(b) : 0.0;
              if (!std::isfinite(got[i])) {
                if (bad_ref++ == 0) first_ref = i;
                mark(i);
                continue;
              }
              if (host) {
                const double r = ref[i] + b;
                const double lim =
                    fp32_sum_bound(sh.K, m) + (out == DType::BF16 ? std::ldexp(std::fabs(r), -8) : 0.0);
                const double e = std::fabs(double(got[i]) - r);
                d_ref += e * e;
                n_ref += r * r;
                worst = std::max(worst, e / lim);
                if (e > lim) {
                  if (bad_ref++ == 0) first_ref = i;
                  mark(i);
                }
              }
              if (cublas) {
                const double scale = host ? m : 4.0 * std::sqrt(double(sh.K)) * rms;
                const double dc = double(got[i]) - double(want[i]);
                d_cub += dc * dc;
                n_cub += double(want[i]) * double(want[i]);
                const double lim = 2.0 * fp32_sum_bound(sh.K, scale) +
                                   (out == DType::BF16 ? std::ldexp(std::fabs(double(want[i])), -7) : 0.0);
                if (!(std::fabs(double(got[i]) - double(want[i])) <= lim)) {
                  if (bad_cublas++ == 0) first_cublas = i;
                  mark(i);
                }
              }
            }
            const auto at = [&](size_t i) {
              return " (m " + std::to_string(i / size_t(sh.N)) + ", n " + std::to_string(i % size_t(sh.N)) + ")";
            };
            const auto masks = [&] {
              char b[64];
              std::snprintf(b, sizeof b, "; bad n %% 32 mask 0x%08x, m %% 32 mask 0x%08x", bad_n, bad_m);
              return std::string(b);
            };
            EXPECT_EQ(bad_ref, 0u) << w2 << ": vs float64, first bad " << first_ref << at(first_ref) << " gpu "
                                   << got[first_ref]
                                   << (host ? " ref " + std::to_string(ref[first_ref]) : std::string()) << masks();
            if (cublas) {  // (braces: gtest's macros end in an if / else)
              EXPECT_EQ(bad_cublas, 0u) << w2 << ": vs dequantize + cuBLAS, first bad " << first_cublas
                                        << at(first_cublas) << " gpu " << got[first_cublas] << " cuBLAS "
                                        << want[first_cublas] << masks();
            }
            const double l2_tol = out == DType::F32 ? 1e-4 : 1e-2;  // (bf16: its own rounding, 2^-9)
            if (host) {
              EXPECT_LT(std::sqrt(d_ref / n_ref), l2_tol)
                  << w2 << ": relative L2 vs float64 (worst element at " << worst << " of its bound)";
            }
            if (cublas) {
              EXPECT_LT(std::sqrt(d_cub / n_cub), l2_tol) << w2 << ": relative L2 vs dequantize + cuBLAS";
            }
          }
      }
    }
}

TEST(CudaGemmWeightOnlyWgmma, RepeatsBitForBit) {
  REQUIRE_SM90();
  std::mt19937 g(73);
  const Layer L(4, 128, 300, 4096, 1024, g);
  Dev<float> y1(size_t(L.M) * L.N), y2(size_t(L.M) * L.N);
  L.run(y1.p, DType::F32, true);
  L.run(y2.p, DType::F32, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(y1.get() == y2.get()) << "two runs differ: the kernel's sums are in a fixed order";
  // Split-K adds its slices in split order: repeatable too. With a workspace one float short the
  // call runs unsplit: the unsplit call's bits.
  ScopedEnv env("PERRY_WEIGHT_ONLY_SPLITK", "4");
  const size_t wb = pc::gemm_weight_only_wgmma_workspace_bytes(L.M, L.N, L.K);
  ASSERT_EQ(wb, size_t(4) * L.M * L.N * 4);
  Dev<float> ws(wb / 4), y3(size_t(L.M) * L.N), y4(size_t(L.M) * L.N), y5(size_t(L.M) * L.N);
  L.run(y3.p, DType::F32, true, ws.p, wb);
  L.run(y4.p, DType::F32, true, ws.p, wb);
  L.run(y5.p, DType::F32, true, ws.p, wb - 4);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(y3.get() == y4.get()) << "two split-K runs differ";
  EXPECT_TRUE(y5.get() == y1.get()) << "a workspace too small must run the unsplit kernel";
  EXPECT_FALSE(y3.get() == y1.get()) << "4 splits gave the unsplit bits: did the split run?";
}

TEST(CudaGemmWeightOnlyWgmma, RejectsBadShapes) {
  REQUIRE_SM90();
  std::mt19937 g(74);
  const Layer L(8, 128, 128, 128, 128, g);
  Dev<float> y(size_t(128) * 128);
  // K off the 64-k stage (the buffers are large enough for every call below)
  for (int K : {32, 96, 130})
    EXPECT_THROW(pc::gemm_weight_only_wgmma(L.dx.p, L.dq.p, L.ds.p, 8, 0, nullptr, y.p, DType::F32, 64, 128, K,
                                            nullptr),
                 perry::Error)
        << "K=" << K;
  EXPECT_FALSE(pc::gemm_weight_only_wgmma_accepts(8, 128, 128, 128, 96, DType::F32));
  // group sizes a stage would straddle, or that are not 64·2^i
  for (int gs : {32, 96, 192})
    EXPECT_THROW(pc::gemm_weight_only_wgmma(L.dx.p, L.dq.p, L.ds.p, 8, gs, nullptr, y.p, DType::F32, 128, 128, 128,
                                            nullptr),
                 perry::Error)
        << "group " << gs;
  EXPECT_FALSE(pc::gemm_weight_only_wgmma_accepts(4, 96, 128, 128, 128, DType::F32));
  EXPECT_THROW(pc::gemm_weight_only_wgmma(L.dx.p, L.dq.p, L.ds.p, 2, 128, nullptr, y.p, DType::F32, 128, 128, 128,
                                          nullptr),
               perry::Error);
  EXPECT_THROW(pc::gemm_weight_only_wgmma(L.dx.p, L.dq.p, L.ds.p, 8, 128, nullptr, y.p, DType::I32, 128, 128, 128,
                                          nullptr),
               perry::Error);
  EXPECT_THROW(pc::gemm_weight_only_wgmma(L.dx.p, L.dq.p, L.ds.p, 8, 128, nullptr, y.p, DType::F32, 0, 128, 128,
                                          nullptr),
               perry::Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (nothing was launched)
}

}  // namespace
