// gemv_decode (src/kernels/cuda/gemv_decode.h): the fused one-token linear of the decode step,
// every mode (bf16 and the 7 quantized ones) and every fused input/output form, against a float64
// reference of the quantized math on inputs prepared on the host by the CPU rules (RMSNorm with a
// float64 sum of squares, quant::quantize_row_ref, f32_to_bf16). Shapes: Llama-like K = 4096, a K
// that is not a multiple of the 128 group (1056: a lane's run of chunks is cut short), and an N
// (20000: 1250 row groups) for which every block loops over several row groups, its sums and
// folds restarting at each. Also rope_append_qkv against head_rms_norm + rope_apply +
// kv_cache_append (bit-exact: the same fp32 operations), and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv_decode.h"
#include "kernels/cuda/lab_timeline.h"
#include "quant_test_util.h"

namespace {
namespace pc = perry::cuda;
using namespace perry::cuda::testing;
using perry::quant::QuantMode;

struct Case {
  int N, K;
};

// A linear's weights on the device as gemv_decode reads them: bf16 bits (BF16) or the quantized
// bytes and their scales.
struct DeviceWeights {
  Dev<uint16_t> wb;
  Dev<int8_t> q;
  Dev<float> sc;
  pc::DecodeWeights w;
  DeviceWeights(QuantMode mode, const std::vector<uint16_t>& bf16, const perry::quant::QuantizedWeight& qw, int N,
                int K, const float* bias)
      : wb(bf16.empty() ? std::vector<uint16_t>(1) : bf16),
        q(mode == QuantMode::BF16 ? std::vector<int8_t>(1) : qw.qweight),
        sc(mode == QuantMode::BF16 ? std::vector<float>(1) : qw.scales) {
    w.mode = mode;
    w.w = mode == QuantMode::BF16 ? static_cast<const void*>(wb.p) : static_cast<const void*>(q.p);
    w.scales = mode == QuantMode::BF16 ? nullptr : sc.p;
    w.bias = bias;
    w.N = N;
    w.K = K;
  }
};

// Random weights of `mode` (bf16 values in [-0.1, 0.1], or make_weight's rows) on the device.
DeviceWeights random_weights(QuantMode mode, int N, int K, std::mt19937& gen, const float* bias) {
  std::vector<uint16_t> wb;
  perry::quant::QuantizedWeight qw;
  if (mode == QuantMode::BF16) {
    wb.resize(size_t(N) * K);
    for (auto& e : wb) e = perry::f32_to_bf16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(gen));
  } else {
    qw = make_weight(mode, N, K, gen);
  }
  return DeviceWeights(mode, wb, qw, N, K, bias);
}

// The linear's input as the CPU computes it: RMSNorm (or the row as it is), then int8 per token
// or bf16. Returned as an Act for the float64 reference.
Act host_input(const std::vector<float>& x, const std::vector<float>& nw, bool norm, float eps) {
  const int K = int(x.size());
  std::vector<float> v(x);
  if (norm) {
    double ss = 0;
    for (float e : x) ss += double(e) * double(e);
    const float inv = float(1.0 / std::sqrt(ss / double(K) + double(eps)));
    for (int k = 0; k < K; ++k) v[size_t(k)] = (x[size_t(k)] * inv) * nw[size_t(k)];
  }
  Act a;
  a.q.resize(size_t(K));
  a.sa = {perry::quant::quantize_row_ref(v.data(), K, a.q.data())};
  a.xb.resize(size_t(K));
  for (int k = 0; k < K; ++k) a.xb[size_t(k)] = perry::f32_to_bf16(v[size_t(k)]);
  return a;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

void run_case(QuantMode mode, Case c, pc::DecodeIn in, pc::DecodeOut out, std::mt19937& gen) {
  const int N = c.N, K = c.K;
  const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " in=" + std::to_string(int(in)) +
                           " out=" + std::to_string(int(out));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(K)), nw(static_cast<size_t>(K)), bias(static_cast<size_t>(N));
  for (auto& e : x) e = nd(gen) * 3.f;
  x[size_t(K / 3)] *= 25.f;  // an outlier channel
  for (auto& e : nw) e = 0.5f + 0.5f * std::fabs(nd(gen));
  for (auto& e : bias) e = nd(gen) * 0.1f;
  const float eps = 1e-5f;
  const Act a = host_input(x, nw, in == pc::DecodeIn::RmsNorm, eps);

  // Weights: a quantized weight, or bf16 (then the reference treats it as one per-channel
  // "group" of scale 1 over bf16 activations).
  perry::quant::QuantizedWeight qw;
  std::vector<uint16_t> wb;
  std::vector<int> wu;
  std::vector<double> ref, mag;
  if (mode == QuantMode::BF16) {
    wb.resize(size_t(N) * K);
    wu.resize(wb.size());
    ref.assign(size_t(N), 0.0);
    mag.assign(size_t(N), 0.0);
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = perry::f32_to_bf16(nd(gen) * 0.05f);
    for (int n = 0; n < N; ++n) {
      for (int k = 0; k < K; ++k) {
        const double t = double(perry::bf16_to_f32(a.xb[size_t(k)])) * double(perry::bf16_to_f32(wb[size_t(n) * K + k]));
        ref[size_t(n)] += t;
        mag[size_t(n)] += std::fabs(t);
      }
      ref[size_t(n)] += bias[size_t(n)];
      mag[size_t(n)] += std::fabs(bias[size_t(n)]);
    }
  } else {
    qw = make_weight(mode, N, K, gen);
    wu = unpack(qw);
    reference(qw, wu, a, 1, bias.data(), ref, mag);
  }

  Dev<float> dx(x), dnw(nw), dbias(bias);
  std::vector<float> y0(static_cast<size_t>(N));
  for (auto& e : y0) e = nd(gen);
  Dev<float> dy(y0);
  const DeviceWeights dw(mode, wb, qw, N, K, dbias.p);
  const pc::DecodeWeights& w = dw.w;
  pc::DecodeLinearArgs args;
  args.x = dx.p;
  args.in = in;
  args.norm_w = dnw.p;
  args.eps = eps;
  args.y = dy.p;
  args.out = out;
  ASSERT_NO_THROW(pc::gemv_decode(w, args, nullptr)) << what;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<float> y = dy.get();

  const double tol = 2e-5;
  if (out == pc::DecodeOut::Store) {
    expect_close(y, ref, mag, what, tol);
  } else if (out == pc::DecodeOut::Accumulate) {
    std::vector<double> r2(ref), m2(mag);
    for (int n = 0; n < N; ++n) r2[size_t(n)] += y0[size_t(n)], m2[size_t(n)] += std::fabs(y0[size_t(n)]);
    expect_close(y, r2, m2, what, tol);
  } else {
    const int half = N / 2;
    std::vector<float> yh(y.begin(), y.begin() + half);
    std::vector<double> r2(static_cast<size_t>(half)), m2(static_cast<size_t>(half));
    for (int j = 0; j < half; ++j) {
      const double g = ref[size_t(j)], u = ref[size_t(j + half)];
      r2[size_t(j)] = silu(g) * u;
      // |d silu/dg| <= 1.1: the error of g and u propagated, plus the fp32 rounding of the result.
      m2[size_t(j)] = std::fabs(silu(g)) * mag[size_t(j + half)] + 1.1 * std::fabs(u) * mag[size_t(j)] +
                      std::fabs(r2[size_t(j)]);
    }
    expect_close(yh, r2, m2, what, tol);
    // Outputs past N/2 are untouched.
    for (int n = half; n < N; ++n) ASSERT_EQ(y[size_t(n)], y0[size_t(n)]) << what << " wrote past N/2 at " << n;
  }
}

// An attribute of the current device (0 where it cannot be read: the checks that use it then fail
// or skip visibly).
int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) return 0;
  return v;
}

// Every quantized mode, then bf16.
std::vector<QuantMode> modes_and_bf16() {
  std::vector<QuantMode> modes(std::begin(kAllModes), std::end(kAllModes));
  modes.push_back(QuantMode::BF16);
  return modes;
}
// The fused forms the decode step uses (input, output).
struct DecodeForm {
  pc::DecodeIn in;
  pc::DecodeOut out;
};
const DecodeForm kDecodeForms[] = {{pc::DecodeIn::RmsNorm, pc::DecodeOut::Store},
                                   {pc::DecodeIn::RmsNorm, pc::DecodeOut::SwiGLU},
                                   {pc::DecodeIn::Plain, pc::DecodeOut::Accumulate}};

// The arguments of one fused form over device rows x, norm weights nw and output y (eps 1e-5).
pc::DecodeLinearArgs form_args(const DecodeForm& f, const float* x, const float* nw, float* y) {
  pc::DecodeLinearArgs a;
  a.x = x;
  a.in = f.in;
  a.norm_w = nw;
  a.eps = 1e-5f;
  a.y = y;
  a.out = f.out;
  return a;
}

TEST(CudaGemvDecode, EveryModeEveryFusedForm) {
  REQUIRE_GPU();
  std::mt19937 gen(20261129);
  // More than 32 row groups (of 32 rows) a warp at one block an SM, plus a partial group: a warp
  // keeps up to 32 finished groups' sums, one a lane, and finishes them together.
  const int many_groups = 34 * 32 * device_attribute(cudaDevAttrMultiProcessorCount) + 6;
  for (QuantMode m : modes_and_bf16())
    for (const DecodeForm& f : kDecodeForms)
      // K = 14336 and 20480: plain int8 inputs held in registers (K <= 16384) and staged in shared
      // memory (K > 16384); K = 32768: the longest row (w8a16: its byte planes and an RMSNorm row's
      // staging, 7·K + K / 16 bytes, all but 1 KiB of a block's 227). K = 8960 (Qwen2.5-1.5B's
      // down_proj): G = 70 at g128, the grouped rings' scale windows start before a row's scales
      // (their lead); K = 1056 with N = 36: the same with one partial step a row (G = 9 at g128,
      // 17 at g64), and with N = 34 (N·G not a multiple of 4) the register loads.
      for (Case c : {Case{96, 4096}, Case{34, 1056}, Case{36, 1056}, Case{6000, 512}, Case{37, 8192},
                     Case{20000, 1056}, Case{36, 8960}, Case{40, 14336}, Case{24, 20480}, Case{10, 32768},
                     Case{many_groups, 256}}) {
        if (f.out == pc::DecodeOut::SwiGLU && c.N % 2 != 0) c.N += 1;  // SwiGLU pairs rows: N even
        run_case(m, c, f.in, f.out, gen);
      }
}

// A weight-only kind's input row for the float64 reference: x rounded to bf16, as the kernel's rule.
Act bf16_act(const std::vector<float>& x) {
  Act a;
  a.xb.resize(x.size());
  for (size_t k = 0; k < x.size(); ++k) a.xb[k] = perry::f32_to_bf16(x[k]);
  return a;
}

// y = x·w of a quantized weight in the plain-input form, accumulated into zeros (Plain + Store is no
// built form), on the device.
std::vector<float> plain_into_zeros(QuantMode mode, const perry::quant::QuantizedWeight& qw, const std::vector<float>& x,
                                    const std::string& what) {
  const int N = int(qw.N), K = int(qw.K);
  Dev<float> dx(x), dy(std::vector<float>(size_t(N), 0.f));
  const DeviceWeights dw(mode, {}, qw, N, K, nullptr);
  pc::DecodeLinearArgs args;
  args.x = dx.p;
  args.in = pc::DecodeIn::Plain;
  args.y = dy.p;
  args.out = pc::DecodeOut::Accumulate;
  EXPECT_NO_THROW(pc::gemv_decode(dw.w, args, nullptr)) << what;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  return dy.get();
}

// w4a16 takes its bf16 input row to the tensor cores as fp16 at a power of two per 128-value run:
// rows far outside fp16's range (values near 2^-60 and 2^60, one outlier 30 times the rest) still
// give the float64 reference of the bf16 rule — without the scaling they would flush to zero or
// overflow to inf — through registers and the staged row (K 20480), with partial chunk windows
// (K 1056). w8a16's input runs (24-bit fixed point at a power of two per 64 values) the same way.
TEST(CudaGemvDecode, WeightOnlyInputAtAnyScale) {
  REQUIRE_GPU();
  std::mt19937 gen(31);
  for (QuantMode mode : {QuantMode::W8A16, QuantMode::W4A16})
    for (int K : {1056, 20480})
      for (int e : {-60, 0, 60}) {
        const int N = 70;
        const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " K=" + std::to_string(K) +
                                 " scale 2^" + std::to_string(e);
        std::vector<float> x = rand_f(size_t(K), gen, -2.f, 2.f);
        x[size_t(K / 5)] *= 30.f;
        for (auto& v : x) v = std::ldexp(v, e);
        const Act a = bf16_act(x);
        const perry::quant::QuantizedWeight qw = make_weight(mode, N, K, gen);
        std::vector<double> ref, mag;
        reference(qw, unpack(qw), a, 1, nullptr, ref, mag);
        expect_close(plain_into_zeros(mode, qw, x, what), ref, mag, what, 2e-5);
      }
}

// w8a16 carries its bf16 input as three byte planes of a 24-bit fixed-point number per 64-value run
// (gemv_decode_w8a16.cuh). Runs whose values span ~60 binades — each led by a value that bf16
// rounds up to the next power of two (65535.99 → 65536: the run's power of two must come from the
// rounded values, or the 24-bit number overflows) — still give the float64 reference of the bf16
// rule (within 2e-5 of Σ|terms|: the grid's rounding, one fp32 ulp of the run's amax a value, is at
// most 64·2^-24 = 3.8e-6 of a run's terms; a 16-bit grid's worst case, 64·2^-16, is 1e-3),
// through registers and the staged row; and one NaN in the row makes every output NaN, as the
// fp32 rule would, not a finite sum (the fixed-point conversion alone would turn NaN into 0).
TEST(CudaGemvDecode, W8A16InputRunsWideRangeAndNaN) {
  REQUIRE_GPU();
  std::mt19937 gen(41);
  for (int K : {1056, 20480}) {
    const int N = 70;
    const std::string what = "w8a16 K=" + std::to_string(K);
    std::vector<float> x = rand_f(size_t(K), gen, -2.f, 2.f);
    for (int k = 0; k < K; ++k) x[size_t(k)] = std::ldexp(x[size_t(k)], -(k % 61));
    for (int k = 0; k < K; k += 64) x[size_t(k)] = k % 128 == 0 ? 65535.99f : -65535.99f;
    const Act a = bf16_act(x);
    ASSERT_EQ(perry::bf16_to_f32(a.xb[0]), 65536.f);
    const perry::quant::QuantizedWeight qw = make_weight(QuantMode::W8A16, N, K, gen);
    std::vector<double> ref, mag;
    reference(qw, unpack(qw), a, 1, nullptr, ref, mag);
    expect_close(plain_into_zeros(QuantMode::W8A16, qw, x, what), ref, mag, what, 2e-5);

    x[size_t(K / 2 + 5)] = std::nanf("");
    const std::vector<float> y = plain_into_zeros(QuantMode::W8A16, qw, x, what + " NaN");
    int finite = 0;
    for (float v : y) finite += !std::isnan(v);
    EXPECT_EQ(finite, 0) << what << ": rows not NaN with a NaN input";
  }
}

// The other side of w8a16's 24-bit grid: values below amax·2^-15 of their run are rounded to its
// grid 2^(E−23) (round half to even), and the kernel gives that sum — the float64 sum of the
// rounded values — to within the fp32 folds' rounding. Each run is led by ±1 (E = 1, grid 2^-22)
// and its other values are ±1.5 grid steps, all signed as row 0's weights so that every rounding
// moves row 0's sum the same way: its rounded sum differs from the bf16 rule's by ~10^-5 of
// Σ|terms| (8·10^-6 for these weights), so a kernel on a finer grid (s22's 32 bits, exact here) or
// a coarser one fails the 10^-6 check.
TEST(CudaGemvDecode, W8A16InputGridRoundsAsDocumented) {
  REQUIRE_GPU();
  const int N = 8;
  std::mt19937 gen(43);
  for (int K : {1056, 20480}) {
    const std::string what = "w8a16 grid K=" + std::to_string(K);
    const perry::quant::QuantizedWeight qw = make_weight(QuantMode::W8A16, N, K, gen);
    const std::vector<int> wu = unpack(qw);
    const double step = std::ldexp(1.0, -22);
    std::vector<float> x(static_cast<size_t>(K));
    std::vector<double> v(static_cast<size_t>(K));  // x on its run's grid
    for (int k = 0; k < K; ++k) {
      const double sign = wu[size_t(k)] < 0 ? -1.0 : 1.0;  // row 0's weight
      x[size_t(k)] = float(sign * (k % 64 == 0 ? 1.0 : 1.5 * step));
      v[size_t(k)] = sign * (k % 64 == 0 ? 1.0 : 2.0 * step);  // rint(±1.5) = ±2
    }
    const Act a = bf16_act(x);
    ASSERT_EQ(perry::bf16_to_f32(a.xb[1]), x[1]);  // the inputs are bf16 values
    std::vector<double> ref, mag;
    reference(qw, wu, a, 1, nullptr, ref, mag);
    const int G = qw.n_groups(), gl = perry::cuda::quant_mode_bits(QuantMode::W8A16).group_size;
    std::vector<double> grid(size_t(N), 0.0);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        grid[size_t(n)] += double(qw.scales[size_t(n) * G + k / gl]) * v[size_t(k)] * wu[size_t(n) * K + k];
    const double moved = std::fabs(grid[0] - ref[0]);
    EXPECT_GT(moved, 3e-6 * mag[0]) << what << ": the data must exercise the grid's rounding";
    const std::vector<float> y = plain_into_zeros(QuantMode::W8A16, qw, x, what);
    for (int n = 0; n < N; ++n)  // the fp32 folds' rounding: ~K / 64 adds of 2^-24 each, well below 10^-6
      EXPECT_LE(std::fabs(double(y[size_t(n)]) - grid[size_t(n)]), 1e-6 * mag[size_t(n)])
          << what << " row " << n << ": gpu " << y[size_t(n)] << " grid " << grid[size_t(n)] << " bf16 rule "
          << ref[size_t(n)];
    EXPECT_LT(std::fabs(double(y[0]) - grid[0]), 0.1 * moved) << what << ": row 0 not on the 24-bit grid's side";
  }
}

// SwiGLU with round_bf16 (the CUDA backend's gate|up rule: bf16 values before SwiGLU) gives
// the bits of the stored gate|up (DecodeOut::Store, the same per-row arithmetic) put through
// swiglu(..., round_to_bf16 = true) — the separate kernels of a prefill or a batch — and differs
// from the unrounded form somewhere (the flag acts).
TEST(CudaGemvDecode, SwigluRoundGateUpMatchesSeparateKernels) {
  REQUIRE_GPU();
  std::mt19937 gen(77);
  for (QuantMode mode : {QuantMode::BF16, QuantMode::W8A8, QuantMode::W4A8_G128, QuantMode::W8A16}) {
    const int N = 2000, K = 4096, I = N / 2;
    Dev<float> dx(rand_f(size_t(K), gen, -2.f, 2.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
    const DeviceWeights dw = random_weights(mode, N, K, gen, nullptr);
    pc::DecodeLinearArgs a;
    a.x = dx.p;
    a.in = pc::DecodeIn::RmsNorm;
    a.norm_w = dnw.p;
    a.eps = 1e-5f;
    const size_t n = static_cast<size_t>(N), half = static_cast<size_t>(I);
    Dev<float> gu(n), fused(n), plain(n), sep(half);
    a.y = gu.p;
    a.out = pc::DecodeOut::Store;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    a.out = pc::DecodeOut::SwiGLU;
    a.y = plain.p;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    a.y = fused.p;
    a.round_bf16 = true;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    pc::swiglu(gu.p, 1, I, pc::ActOut::f32(sep.p), nullptr, true);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> f = fused.get(), pl = plain.get(), sp = sep.get();
    int differ = 0, changed = 0;
    for (int j = 0; j < I; ++j) {
      differ += std::memcmp(&f[size_t(j)], &sp[size_t(j)], 4) != 0;
      changed += f[size_t(j)] != pl[size_t(j)];
    }
    EXPECT_EQ(differ, 0) << perry::quant::quant_mode_name(mode);
    EXPECT_GT(changed, 0) << perry::quant::quant_mode_name(mode) << ": rounding changed nothing";
  }
}

// Accumulate with round_bf16 (the residual-delta rule: o_proj / down_proj outputs rounded to bf16
// before the residual add) gives the bits of the stored output put through residual_add(...,
// round_d = true) — what a prefill or a batch does — and differs from the unrounded add.
TEST(CudaGemvDecode, AccumulateRoundMatchesSeparateKernels) {
  REQUIRE_GPU();
  std::mt19937 gen(78);
  for (QuantMode mode : {QuantMode::BF16, QuantMode::W8A8, QuantMode::W4A8_G128, QuantMode::W8A16}) {
    const int N = 1536, K = 4096;
    const std::vector<float> x0 = rand_f(size_t(N), gen, -3.f, 3.f);
    Dev<float> dx(rand_f(size_t(K), gen, -2.f, 2.f));
    const DeviceWeights dw = random_weights(mode, N, K, gen, nullptr);
    pc::DecodeLinearArgs a;
    a.x = dx.p;
    a.in = pc::DecodeIn::Plain;
    const size_t n = static_cast<size_t>(N);
    // The layer's output alone: Accumulate into zeros (0 + v = v exactly; Plain + Store is not a
    // built combination).
    Dev<float> stored(std::vector<float>(n, 0.0f)), fused(x0), plain(x0), sep(x0);
    a.out = pc::DecodeOut::Accumulate;
    a.y = stored.p;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    a.y = plain.p;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    a.y = fused.p;
    a.round_bf16 = true;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr));
    pc::residual_add(sep.p, stored.p, int64_t(N), nullptr, true);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> f = fused.get(), pl = plain.get(), sp = sep.get();
    int differ = 0, changed = 0;
    for (size_t j = 0; j < n; ++j) {
      differ += std::memcmp(&f[j], &sp[j], 4) != 0;
      changed += f[j] != pl[j];
    }
    EXPECT_EQ(differ, 0) << perry::quant::quant_mode_name(mode);
    EXPECT_GT(changed, 0) << perry::quant::quant_mode_name(mode) << ": rounding changed nothing";
  }
}

// A W8A8 N×K linear (random weights, scales, input) with RMSNorm input, for argument checks.
struct SmallLinear {
  Dev<float> x, y, nw, sc;
  Dev<int8_t> w;
  pc::DecodeWeights dw;
  pc::DecodeLinearArgs a;
  SmallLinear(int N, int K, std::mt19937& g)
      : x(rand_f(size_t(K), g, -1.f, 1.f)), y(size_t(N)), nw(rand_f(size_t(K), g, 0.5f, 1.5f)),
        sc(rand_f(size_t(N), g, 0.01f, 0.02f)), w(rand_i8(size_t(N) * K, g)) {
    dw.mode = QuantMode::W8A8;
    dw.w = w.p;
    dw.scales = sc.p;
    dw.N = N;
    dw.K = K;
    a.x = x.p;
    a.y = y.p;
    a.norm_w = nw.p;
    a.in = pc::DecodeIn::RmsNorm;
  }
};

// The int8 input row a decode linear builds (RMSNorm or the row as it is, then quantize_per_token's
// rule) is the CPU's, value for value: with one-hot weights (row n holds a single 1 at column k_n,
// every scale 1) y[n] is that row's integer q[k_n] times the token scale — one fp32 rounding here
// and on the host. The float64-referenced tests cannot see a single quantization step; this one
// does. Plain inputs at K 4096, 14336 (held in registers) and 20480 (staged in shared memory);
// RMSNorm inputs at 4096 (x and the norm weights in registers) and 12288 (x staged, the norm
// weights read from global memory); int8 and int4
// weights, per channel and grouped (int4: the nibble order and the 8·Σx correction).
TEST(CudaGemvDecode, Int8InputIsTheCpuQuantization) {
  REQUIRE_GPU();
  std::mt19937 gen(20261130);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape {
    pc::DecodeIn in;
    int K;
  };
  const int N = 1024;
  for (QuantMode mode : {QuantMode::W8A8, QuantMode::W4A8, QuantMode::W8A8_G128, QuantMode::W4A8_G128})
    for (Shape sh : {Shape{pc::DecodeIn::Plain, 4096}, Shape{pc::DecodeIn::Plain, 14336},
                     Shape{pc::DecodeIn::Plain, 20480}, Shape{pc::DecodeIn::RmsNorm, 4096},
                     Shape{pc::DecodeIn::RmsNorm, 12288}}) {
      const int K = sh.K;
      const bool norm = sh.in == pc::DecodeIn::RmsNorm;
      const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " K=" + std::to_string(K) +
                               (norm ? " RmsNorm" : " Plain");
      std::vector<float> x(static_cast<size_t>(K)), nw(static_cast<size_t>(K));
      for (auto& e : x) e = nd(gen) * 3.f;
      for (auto& e : nw) e = 0.5f + 0.5f * std::fabs(nd(gen));
      // An outlier channel sets the scale: |x| ≤ ~16 elsewhere (5.3σ at K 20480) and norm weights
      // ≤ ~3, so −100 with norm weight 1 is the row's amax, before and after the RMSNorm.
      x[size_t(K / 3)] = -100.f;
      nw[size_t(K / 3)] = 1.f;
      const float eps = 1e-5f;
      const Act a = host_input(x, nw, norm, eps);

      perry::quant::QuantizedWeight qw;
      qw.mode = mode;
      qw.N = N;
      qw.K = K;
      qw.qweight.assign(size_t(N * qw.row_bytes()), 0);
      qw.scales.assign(size_t(N) * size_t(qw.n_groups()), 1.0f);
      const bool int4 = mode == QuantMode::W4A8 || mode == QuantMode::W4A8_G128;
      std::vector<int> col(static_cast<size_t>(N));
      for (int n = 0; n < N; ++n) {
        const int k = n == 0 ? K / 3 : int((int64_t(n) * 7919) % K);  // row 0: the outlier
        col[size_t(n)] = k;
        if (int4) qw.qweight[size_t(n * qw.row_bytes() + k / 2)] = int8_t(k % 2 ? 0x10 : 0x01);
        else qw.qweight[size_t(int64_t(n) * K + k)] = 1;
      }
      ASSERT_EQ(qw.weight(1, col[1]), 1) << what;

      Dev<float> dx(x), dnw(nw), dy(std::vector<float>(size_t(N), 0.f));
      const DeviceWeights dw(mode, {}, qw, N, K, nullptr);
      pc::DecodeLinearArgs args;
      args.x = dx.p;
      args.in = sh.in;
      args.norm_w = dnw.p;
      args.eps = eps;
      args.y = dy.p;
      args.out = norm ? pc::DecodeOut::Store : pc::DecodeOut::Accumulate;  // (the forms the decode step uses)
      ASSERT_NO_THROW(pc::gemv_decode(dw.w, args, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const std::vector<float> y = dy.get();
      int bad = 0;
      for (int n = 0; n < N; ++n) {
        const float want = float(a.q[size_t(col[size_t(n)])]) * a.sa[0];
        if (y[size_t(n)] != want && ++bad <= 5)
          ADD_FAILURE() << what << ": row " << n << " (k " << col[size_t(n)] << "): " << y[size_t(n)] << " vs "
                        << want << " (q " << int(a.q[size_t(col[size_t(n)])]) << ")";
      }
      EXPECT_EQ(bad, 0) << what;
      EXPECT_EQ(std::fabs(y[0]), 127.f * a.sa[0]) << what << ": the outlier is not ±127";
    }
}

// The lab switch DecodeLinearArgs::lab_input (wrong outputs by design: it measures the input
// prologue's share), Skip or ReadOnly, leaves the input row at zero, so a Store gives the bias
// exactly; Build builds the row again.
TEST(CudaGemvDecode, LabSkipInputLeavesAZeroRow) {
  REQUIRE_GPU();
  std::mt19937 gen(7);
  const int N = 64, K = 256;
  for (QuantMode mode : {QuantMode::BF16, QuantMode::W8A8, QuantMode::W4A8_G128}) {
    const std::vector<float> bias = rand_f(size_t(N), gen, -1.f, 1.f);
    Dev<float> dx(rand_f(size_t(K), gen, -1.f, 1.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f)), dbias(bias);
    Dev<float> dy(std::vector<float>(size_t(N), 0.f));
    const DeviceWeights dw = random_weights(mode, N, K, gen, dbias.p);
    pc::DecodeLinearArgs a;
    a.x = dx.p;
    a.in = pc::DecodeIn::RmsNorm;
    a.norm_w = dnw.p;
    a.eps = 1e-5f;
    a.y = dy.p;
    a.out = pc::DecodeOut::Store;
    const std::string what(perry::quant::quant_mode_name(mode));
    for (pc::DecodeLabInput lab : {pc::DecodeLabInput::Skip, pc::DecodeLabInput::ReadOnly}) {
      a.lab_input = lab;
      ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_EQ(dy.get(), bias) << what << " lab " << int(lab);
    }
    a.lab_input = pc::DecodeLabInput::Build;
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    EXPECT_NE(dy.get(), bias) << what << ": the switch stayed on";
  }
}

// The weights lab switch: Skip runs every step on unread stages (no error, no hang: each stage
// still completes; the outputs are not those of the weights), SkipLoop returns after the prologue
// and writes nothing. Bulk kernels only (sm_90).
TEST(CudaGemvDecode, LabWeightsSwitch) {
  REQUIRE_GPU();
  // Only sm_90 runs the bulk kernels' own code (newer GPUs run the compute_80 PTX: registers).
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) != 9)
    GTEST_SKIP() << "not an sm_90 device: no bulk copies, the switch does nothing";
  std::mt19937 gen(11);
  for (QuantMode mode : {QuantMode::BF16, QuantMode::W8A8, QuantMode::W4A8_G128})
    for (const DecodeForm& f : kDecodeForms) {
      const int N = 2000, K = 4096;
      Dev<float> dx(rand_f(size_t(K), gen, -1.f, 1.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
      const DeviceWeights dw = random_weights(mode, N, K, gen, nullptr);
      const std::vector<float> y0 = rand_f(size_t(N), gen, -1.f, 1.f);
      Dev<float> dy(y0);
      pc::DecodeLinearArgs a = form_args(f, dx.p, dnw.p, dy.p);
      const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " out=" + std::to_string(int(f.out));
      a.lab_weights = pc::DecodeLabWeights::SkipLoop;
      ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_EQ(dy.get(), y0) << what << ": SkipLoop wrote outputs";
      a.lab_weights = pc::DecodeLabWeights::Skip;
      Dev<float> dy_skip(y0);
      a.y = dy_skip.p;
      ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << ": Skip";
      a.lab_weights = pc::DecodeLabWeights::Read;
      Dev<float> dy_read(y0);
      a.y = dy_read.p;
      ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      EXPECT_NE(dy_read.get(), y0) << what << ": nothing written with the weights read";
      // Skip computed on stages that no copy filled: not the product of these weights.
      EXPECT_NE(dy_skip.get(), dy_read.get()) << what << ": Skip read the weights";
    }
}

// The timeline lab (lab_timeline.h) records each block of a launch once, with its marks in order,
// and leaves the outputs alone (the same bits with the log on); the file holds what the device
// wrote. 20000 rows: more row groups than blocks, so every block of the grid runs. (s16 run 4
// passed it with the log read from a kernel argument; the timeline instantiations came after.)
TEST(CudaGemvDecode, LabTimelineRecordsEveryBlockOnce) {
  REQUIRE_GPU();
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) != 9)
    GTEST_SKIP() << "not an sm_90 device: the timeline records the bulk kernels only";
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  ASSERT_GT(sms, 0);
  std::mt19937 gen(7);
  const int N = 20000, K = 4096;
  const DecodeForm f{pc::DecodeIn::RmsNorm, pc::DecodeOut::SwiGLU};
  Dev<float> dx(rand_f(size_t(K), gen, -1.f, 1.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
  const DeviceWeights dw = random_weights(QuantMode::W4A8_G128, N, K, gen, nullptr);
  const std::vector<float> y0 = rand_f(size_t(N), gen, -1.f, 1.f);
  Dev<float> dy_off(y0), dy_on(y0);
  ASSERT_NO_THROW(pc::gemv_decode(dw.w, form_args(f, dx.p, dnw.p, dy_off.p), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::string path = ::testing::TempDir() + "perry-timeline-test.bin";
  size_t written = 0;
  {
    pc::LabTimeline tl(path, 4096);
    ASSERT_NO_THROW(pc::gemv_decode(dw.w, form_args(f, dx.p, dnw.p, dy_on.p), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    written = tl.write();
  }
  EXPECT_EQ(dy_on.get(), dy_off.get()) << "the log changed the outputs";
  // The log is uninstalled with its owner: another launch writes nothing and does not fault.
  ASSERT_NO_THROW(pc::gemv_decode(dw.w, form_args(f, dx.p, dnw.p, dy_on.p), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::FILE* in = std::fopen(path.c_str(), "rb");
  ASSERT_NE(in, nullptr);
  char magic[8];
  uint64_t count = 0, missed = 1;
  ASSERT_EQ(std::fread(magic, 1, 8, in), 8u);
  ASSERT_EQ(std::fread(&count, 8, 1, in), 1u);
  ASSERT_EQ(std::fread(&missed, 8, 1, in), 1u);
  std::vector<pc::TimelineRecord> rows(count);
  ASSERT_EQ(std::fread(rows.data(), sizeof(pc::TimelineRecord), count, in), count);
  std::fclose(in);
  std::remove(path.c_str());
  EXPECT_EQ(std::string(magic, 8), "perrytl1");
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(count, written);
  // SwiGLU: N / 2 outputs in groups of 16 warps; one block an SM at most.
  const int groups = (N / 2 + 15) / 16;
  const size_t grid = size_t(std::min(groups, sms * 4));
  ASSERT_GE(count, size_t(std::min(groups, sms)));
  ASSERT_LE(count, grid);
  std::set<uint32_t> blocks;
  for (const pc::TimelineRecord& r : rows) {
    EXPECT_EQ(r.kernel, uint32_t(pc::TimelineKernel::GemvDecode));
    EXPECT_EQ(r.arg >> 8, uint32_t(K));
    EXPECT_LE(r.c_start, r.c_waited);
    EXPECT_LE(r.c_waited, r.c_input);
    EXPECT_LT(r.c_input, r.c_end);
    EXPECT_LE(r.g_start, r.g_end);
    EXPECT_TRUE(blocks.insert(r.block).second) << "block " << r.block << " recorded twice";
  }
  EXPECT_EQ(*blocks.rbegin(), uint32_t(count - 1)) << "the blocks recorded are not 0 .. grid - 1";
}

// int4 weights against int8 activations at the extremes: the longest row (K = 32768), every
// activation 127 and rows of all 7s, all −8s and the two mixed (low / high nibble) — the nibble
// handling (the high nibbles kept in place as 16·(v + 8), shifted back once) and the 8·Σx
// correction must give the exact dot product (a lane's sums stay below ~2·10^7, the row's
// ~3.3·10^7: no overflow).
TEST(CudaGemvDecode, Int4AtTheIntegerLimitsIsExact) {
  REQUIRE_GPU();
  std::mt19937 gen(32768);
  const int N = 4, K = 32768;
  for (QuantMode mode : {QuantMode::W4A8, QuantMode::W4A8_G128}) {
    perry::quant::QuantizedWeight qw = make_weight(mode, N, K, gen);
    const uint8_t fill[N] = {0x77, 0x88, 0x87, 0x78};  // (high nibble, low nibble) = (7,7) (−8,−8) (−8,7) (7,−8)
    const size_t row_bytes = size_t(K) / 2;
    ASSERT_EQ(qw.qweight.size(), size_t(N) * row_bytes);
    for (int n = 0; n < N; ++n) std::memset(qw.qweight.data() + size_t(n) * row_bytes, fill[n], row_bytes);
    const std::vector<int> wu = unpack(qw);
    ASSERT_EQ(wu[0], 7);
    ASSERT_EQ(wu[size_t(K)], -8);
    const std::vector<float> x(size_t(K), 3.0f), nw(size_t(K), 1.0f);
    const Act a = host_input(x, nw, false, 0.0f);
    ASSERT_EQ(a.q[0], 127);
    std::vector<double> ref, mag;
    reference(qw, wu, a, 1, nullptr, ref, mag);
    const std::string what(perry::quant::quant_mode_name(mode));
    const std::vector<float> y = plain_into_zeros(mode, qw, x, what);
    // Per channel: one fp32 rounding of the exact integer sum, then two fp32 products — a few
    // ulps; g128: 256 groups folded in fp32 (as the random-weight cases). A wrong nibble or
    // correction is off by at least 127 in a sum of ~10^7 (per channel: far beyond 1e-6).
    expect_close(y, ref, mag, what, mode == QuantMode::W4A8 ? 1e-6 : 2e-5);
  }
}

// Bulk-copied weights (a ring of shared-memory stages per warp) and register loads without the
// double buffer give the same bits as the double-buffered register loads: the lanes see the same
// chunks in the same order. Every mode and fused form, blocks that
// loop over several row groups (N = 6000) and rows of many steps (K = 14336: the ring wraps, its
// barriers change phase many times), tail groups (N = 200), and more stages than fit (with
// 16-warp blocks a 4 KiB stage a warp is 64 KiB a block: 4 and 16 run as 2 or 3 stages).
TEST(CudaGemvDecode, BulkCopyIsBitIdentical) {
  REQUIRE_GPU();
  std::mt19937 gen(90);
  for (QuantMode mode : modes_and_bf16())
    for (Case c : {Case{6000, 4096}, Case{200, 14336}, Case{34, 1056}, Case{200, 8960}, Case{36, 1056}})
      for (const DecodeForm& f : kDecodeForms) {
        const int N = c.N, K = c.K;
        Dev<float> dx(rand_f(size_t(K), gen, -2.f, 2.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
        const DeviceWeights dw = random_weights(mode, N, K, gen, nullptr);
        const std::vector<float> y0 = rand_f(size_t(N), gen, -1.f, 1.f);
        std::vector<float> base;
        // (stages, register_pipe): register loads with and without the double buffer, then rings.
        // stages -3: 3 stages with two L2 prefetch ranges for a next kernel (l2_next), which must
        // change nothing. The grouped kinds' rings carry their group scales too (ring_scales): from
        // aligned rows at K 4096 and 14336, and as windows with a lead at K 8960 (G 70 at g128) and
        // K 1056 with N 36 (G 9 / 17: one partial step a row); with N 34 at K 1056 (N·G not a
        // multiple of 4) they stream through registers.
        for (auto [stages, pipe] : {std::pair{0, -1}, {0, 0}, {2, -1}, {3, -1}, {-3, -1}, {4, -1}, {16, -1}}) {
          Dev<float> dy(y0);
          pc::DecodeLinearArgs a = form_args(f, dx.p, dnw.p, dy.p);
          a.bulk_stages = stages == -3 ? 3 : stages;
          a.register_pipe = pipe;
          if (stages == -3) {
            a.l2_next[0] = {dnw.p, size_t(K) * 4};
            a.l2_next[1] = {dw.w.w, size_t(N) * 16};
          }
          const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " N=" + std::to_string(N) +
                                   " K=" + std::to_string(K) + " out=" + std::to_string(int(f.out)) +
                                   " stages=" + std::to_string(stages) +
                                   " pipe=" + std::to_string(pipe);
          ASSERT_NO_THROW(pc::gemv_decode(dw.w, a, nullptr)) << what;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          if (stages == 0 && pipe == -1) {
            base = dy.get();
            EXPECT_NE(base, y0) << what << ": nothing written";
          } else {
            EXPECT_EQ(dy.get(), base) << what;
          }
        }
      }
}

// Which launches take the bulk-copy ring (sm_90): every kind at the shapes of the checkpoints
// perry runs. The grouped kinds whose lanes fold runs copy their scales into the ring as aligned
// windows, so Qwen2.5-1.5B's and 0.5B's down_proj (K 8960, 4864: G 70, 38 at g128) and rows of
// one partial step (K 1056, N 36: G 9 / 17) take it too. Those kinds stream through registers only
// where a window could pass the scales' end (N·G not a multiple of 4: K 1056 with N 34) or the
// scales are not 16-byte aligned; the other kinds take the ring there too. The results are the
// same either way (BulkCopyIsBitIdentical); this test keeps a shape from silently losing the
// ring's speed.
TEST(CudaGemvDecode, GroupedRowsTakeTheRing) {
  REQUIRE_GPU();
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) != 9)
    GTEST_SKIP() << "not an sm_90 device: the bulk kernels stream through registers";
  std::mt19937 gen(25);
  Dev<float> dx(rand_f(32768, gen, -1.f, 1.f)), dnw(rand_f(32768, gen, 0.5f, 1.5f)), dy(rand_f(20000, gen, -1.f, 1.f));
  for (QuantMode mode : modes_and_bf16()) {
    // The kinds whose lanes fold a run of one group a step: grouped, but not w4a16 (a scale a chunk).
    const int group = mode == QuantMode::BF16 ? 0 : pc::quant_mode_bits(mode).group_size;
    const bool runs = group > 0 && mode != QuantMode::W4A16;
    for (const DecodeForm& f : kDecodeForms)
      for (Case c : {Case{96, 4096}, Case{36, 8960}, Case{40, 4864}, Case{36, 1056}, Case{34, 1056}}) {
        const DeviceWeights dw = random_weights(mode, c.N, c.K, gen, nullptr);
        const pc::DecodeLinearArgs a = form_args(f, dx.p, dnw.p, dy.p);
        const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " N=" + std::to_string(c.N) +
                                 " K=" + std::to_string(c.K) + " out=" + std::to_string(int(f.out));
        const long long G = group > 0 ? (c.K + group - 1) / group : 1;
        const bool windows_inside = c.N * G % 4 == 0;
        const int stages = pc::gemv_decode_ring_stages(dw.w, a);
        if (!runs || windows_inside) EXPECT_GE(stages, 2) << what;
        else EXPECT_EQ(stages, 0) << what;
        if (runs) {  // scales that are not 16-byte aligned: no window can be copied
          pc::DecodeWeights shifted = dw.w;
          shifted.scales = dw.sc.p + 1;
          EXPECT_EQ(pc::gemv_decode_ring_stages(shifted, a), 0) << what << " (scales + 1)";
        }
      }
  }
  // The asked depth (bulk_stages) where it fits; 0 asks for register loads.
  const DeviceWeights dw = random_weights(QuantMode::W4A8_G128, 36, 8960, gen, nullptr);
  pc::DecodeLinearArgs a = form_args(kDecodeForms[2], dx.p, dnw.p, dy.p);
  a.bulk_stages = 3;
  EXPECT_EQ(pc::gemv_decode_ring_stages(dw.w, a), 3);
  a.bulk_stages = 0;
  EXPECT_EQ(pc::gemv_decode_ring_stages(dw.w, a), 0);
  a.bulk_stages = 1;  // the same checks as gemv_decode
  EXPECT_THROW(pc::gemv_decode_ring_stages(dw.w, a), perry::Error);
}

TEST(CudaGemvDecode, RejectsWhatItCannotRun) {
  REQUIRE_GPU();
  EXPECT_FALSE(pc::gemv_decode_supports(QuantMode::W8A8, 1000));  // K % 32
  EXPECT_FALSE(pc::gemv_decode_supports(QuantMode::W8A8, 65536));
  EXPECT_FALSE(pc::gemv_decode_supports(QuantMode::F32, 4096));
  EXPECT_TRUE(pc::gemv_decode_supports(QuantMode::W4A8_G128, 4096));
  // Every mode up to K 32768 (w8a16: three byte planes and an RMSNorm row's fp32 staging).
  EXPECT_TRUE(pc::gemv_decode_supports(QuantMode::W8A16, 32768));
  EXPECT_FALSE(pc::gemv_decode_supports(QuantMode::W8A16, 32800));
  EXPECT_TRUE(pc::gemv_decode_supports(QuantMode::W4A16, 32768));
  std::mt19937 gen(5);
  SmallLinear L(64, 64, gen);
  pc::DecodeWeights& dw = L.dw;
  pc::DecodeLinearArgs& a = L.a;
  dw.N = 63;
  a.out = pc::DecodeOut::SwiGLU;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);  // odd N with SwiGLU
  dw.N = 64;
  a.x = nullptr;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.x = L.x.p;
  a.in = pc::DecodeIn::Plain;
  a.out = pc::DecodeOut::Store;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);  // a form that is not built
  a.out = pc::DecodeOut::Accumulate;
  a.bulk_stages = -2;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.bulk_stages = 1;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.bulk_stages = 17;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.bulk_stages = -1;
  a.register_pipe = 2;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.register_pipe = -1;
  a.l2_next[1] = {L.x.p, 24};  // not a multiple of 16 bytes
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.l2_next[1] = {nullptr, 64};
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.l2_next[1] = {reinterpret_cast<const uint8_t*>(L.x.p) + 4, 64};  // misaligned
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
}

// rope_append_qkv == head_rms_norm + rope_apply + kv_cache_append, bit for bit: two decode
// rows of two sequences, and a prefill of two sequences of 5 and 4 tokens (the second crossing
// the end of the RoPE table), GQA 8/2, with and without the q/k norm, positions past the RoPE
// table (NaN q and k), an even and an odd row stride, cache bytes compared whole.
TEST(CudaDecodeRopeAppend, EqualsTheSeparateKernels) {
  REQUIRE_GPU();
  std::mt19937 gen(7);
  const int nh = 8, nkv = 2, hd = 128, cap = 64, max_pos = 48, slots = 3;
  const int Q = nh * hd, KV = nkv * hd;
  std::vector<float> cosv(size_t(max_pos) * hd / 2), sinv(cosv.size());
  for (size_t i = 0; i < cosv.size(); ++i) cosv[i] = std::cos(0.01f * float(i)), sinv[i] = std::sin(0.01f * float(i));
  pc::DeviceRopeTable rope(cosv.data(), sinv.data(), hd, max_pos);
  // pad 1: an odd row stride takes the kernel's one-element-a-lane form.
  for (int pad : {0, 1})
  for (bool prefill : {false, true})
  for (bool qk_norm : {false, true}) {
    const int stride = Q + 2 * KV + pad;
    for (int pos_b : {20, 50}) {  // 50: past the RoPE table (but inside the cache)
      SCOPED_TRACE(std::string(prefill ? "prefill" : "decode") + " pad " + std::to_string(pad));
      const std::vector<pc::AttnSeq> seqs = prefill ? std::vector<pc::AttnSeq>{{0, 5, 3, 2}, {5, 4, pos_b - 3, 0}}
                                                    : std::vector<pc::AttnSeq>{{0, 1, 10, 2}, {1, 1, pos_b, 0}};
      std::vector<int32_t> pos;
      for (const pc::AttnSeq& sq : seqs)
        for (int t = 0; t < sq.n_new; ++t) pos.push_back(sq.pos0 + t);
      const int M = int(pos.size());
      std::vector<float> qkv = rand_f(size_t(M) * stride, gen, -2.f, 2.f);
      std::vector<float> qn = rand_f(size_t(hd), gen, 0.5f, 1.5f), kn = rand_f(size_t(hd), gen, 0.5f, 1.5f);
      const size_t cache_elems = size_t(slots) * nkv * cap * hd;
      std::vector<uint16_t> cache0(cache_elems);
      for (auto& e : cache0) e = uint16_t(gen());
      Dev<pc::AttnSeq> dseq(seqs);
      Dev<int32_t> dpos(pos);
      Dev<float> dqn(qn), dkn(kn);
      // Fused.
      Dev<float> f_qkv(qkv);
      Dev<uint16_t> f_k(cache0), f_v(cache0);
      pc::rope_append_qkv(f_qkv.p, stride, dseq.p, 2, M, nh, nkv, hd, qk_norm ? dqn.p : nullptr,
                          qk_norm ? dkn.p : nullptr, 1e-6f, rope.view(), cap, f_k.p, f_v.p, nullptr);
      // Separate: q, k, v split out of the fused rows first.
      std::vector<float> q(static_cast<size_t>(M) * Q), k(static_cast<size_t>(M) * KV), v(static_cast<size_t>(M) * KV);
      for (int m = 0; m < M; ++m) {
        std::copy_n(&qkv[size_t(m) * stride], Q, &q[size_t(m) * Q]);
        std::copy_n(&qkv[size_t(m) * stride + Q], KV, &k[size_t(m) * KV]);
        std::copy_n(&qkv[size_t(m) * stride + Q + KV], KV, &v[size_t(m) * KV]);
      }
      Dev<float> s_q(q), s_k(k), s_v(v);
      Dev<uint16_t> s_kc(cache0), s_vc(cache0);
      if (qk_norm) {
        pc::head_rms_norm(s_q.p, Q, M, nh, hd, dqn.p, 1e-6f, nullptr);
        pc::head_rms_norm(s_k.p, KV, M, nkv, hd, dkn.p, 1e-6f, nullptr);
      }
      pc::rope_apply(s_q.p, Q, nh, s_k.p, KV, nkv, M, dpos.p, rope.view(), nullptr);
      pc::kv_cache_append(s_k.p, s_v.p, dseq.p, 2, M, nkv, hd, cap, s_kc.p, s_vc.p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> fq = f_qkv.get(), sq = s_q.get();
      for (int m = 0; m < M; ++m)
        for (int i = 0; i < Q; ++i) {
          const float a = fq[size_t(m) * stride + i], b = sq[size_t(m) * Q + i];
          ASSERT_TRUE((std::isnan(a) && std::isnan(b)) || a == b)
              << "q row " << m << " elem " << i << " norm " << qk_norm << ": " << a << " vs " << b;
        }
      EXPECT_EQ(f_k.get(), s_kc.get()) << "k cache, norm " << qk_norm << " pos " << pos_b;
      EXPECT_EQ(f_v.get(), s_vc.get()) << "v cache, norm " << qk_norm << " pos " << pos_b;

      // The bf16 forms (the q|k|v-in-bf16 rule): fp32 rows with round_to_bf16, and bf16 rows (q
      // written back as bf16) give the same caches, and q = f32_to_bf16 of the rounded form's q.
      std::vector<uint16_t> qkv16(qkv.size());
      for (size_t i = 0; i < qkv.size(); ++i) qkv16[i] = perry::f32_to_bf16(qkv[i]);
      Dev<float> r_qkv(qkv);
      Dev<uint16_t> b_qkv(qkv16), r_k(cache0), r_v(cache0), b_k(cache0), b_v(cache0);
      pc::rope_append_qkv(r_qkv.p, stride, dseq.p, 2, M, nh, nkv, hd, qk_norm ? dqn.p : nullptr,
                          qk_norm ? dkn.p : nullptr, 1e-6f, rope.view(), cap, r_k.p, r_v.p, nullptr, true);
      pc::rope_append_qkv(b_qkv.p, stride, dseq.p, 2, M, nh, nkv, hd, qk_norm ? dqn.p : nullptr,
                          qk_norm ? dkn.p : nullptr, 1e-6f, rope.view(), cap, b_k.p, b_v.p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> rq = r_qkv.get();
      const std::vector<uint16_t> bq = b_qkv.get();
      size_t bad_q = 0;
      for (int m = 0; m < M; ++m)
        for (int i = 0; i < Q; ++i) {
          const size_t at = size_t(m) * stride + size_t(i);
          const uint16_t want = perry::f32_to_bf16(rq[at]);
          bad_q += bq[at] != want && !(std::isnan(rq[at]) && (bq[at] & 0x7fff) > 0x7f80);
        }
      EXPECT_EQ(bad_q, 0u) << "bf16 q, norm " << qk_norm << " pos " << pos_b;
      const std::vector<uint16_t> rk = r_k.get();
      EXPECT_EQ(b_k.get(), rk) << "k cache (bf16 form), norm " << qk_norm << " pos " << pos_b;
      EXPECT_EQ(b_v.get(), r_v.get()) << "v cache (bf16 form), norm " << qk_norm << " pos " << pos_b;
      EXPECT_NE(rk, f_k.get()) << "rounding the inputs changed no k";
    }
  }
}

// DecodeOut::RopeKv == Store then rope_append_qkv, bit for bit, for head size hd: q (rotated) in
// y, k (rotated) and v in the cache, for positions inside the RoPE table, past it (NaN q / k) and
// past the cache capacity (nothing stored), in a float, an int8 and two int4 modes, with a q|k|v
// bias.
void check_rope_kv_matches_separate(int hd, int nh, int nkv, std::mt19937& gen) {
  const int K = 512, N = (nh + 2 * nkv) * hd, cap = 64, max_pos = 48, slots = 2;
  std::vector<float> cosv(size_t(max_pos) * hd / 2), sinv(cosv.size());
  for (size_t i = 0; i < cosv.size(); ++i) cosv[i] = std::cos(0.013f * float(i)), sinv[i] = std::sin(0.013f * float(i));
  pc::DeviceRopeTable rope(cosv.data(), sinv.data(), hd, max_pos);
  std::vector<uint16_t> cache0(size_t(slots) * nkv * cap * hd);
  for (auto& e : cache0) e = uint16_t(gen());
  for (QuantMode mode : {QuantMode::BF16, QuantMode::W8A8, QuantMode::W4A8_G128, QuantMode::W4A16}) {
    Dev<float> dx(rand_f(size_t(K), gen, -2.f, 2.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
    Dev<float> dbias(rand_f(size_t(N), gen, -0.5f, 0.5f));
    const DeviceWeights dw = random_weights(mode, N, K, gen, dbias.p);
    const pc::DecodeWeights& w = dw.w;
    for (int pos : {20, 50, 70}) {
      const std::string what = std::string(perry::quant::quant_mode_name(mode)) + " hd " + std::to_string(hd) +
                               " nh " + std::to_string(nh) + " pos " + std::to_string(pos);
      Dev<pc::AttnSeq> dseq(std::vector<pc::AttnSeq>{{0, 1, pos, 1}});
      pc::DecodeLinearArgs a;
      a.x = dx.p;
      a.in = pc::DecodeIn::RmsNorm;
      a.norm_w = dnw.p;
      a.eps = 1e-5f;
      // Separate: Store, then rope_append_qkv on the stored row.
      Dev<float> ys(std::vector<float>(size_t(N), 0.f));
      Dev<uint16_t> ks(cache0), vs(cache0);
      a.y = ys.p;
      a.out = pc::DecodeOut::Store;
      ASSERT_NO_THROW(pc::gemv_decode(w, a, nullptr)) << what;
      pc::rope_append_qkv(ys.p, N, dseq.p, 1, 1, nh, nkv, hd, nullptr, nullptr, 1e-6f, rope.view(), cap, ks.p,
                          vs.p, nullptr);
      // Fused.
      Dev<float> yf(std::vector<float>(size_t(N), 0.f));
      Dev<uint16_t> kf(cache0), vf(cache0);
      a.y = yf.p;
      a.out = pc::DecodeOut::RopeKv;
      a.rope_kv = pc::DecodeRopeKv{dseq.p, rope.view(), nh, nkv, hd, cap, kf.p, vf.p};
      a.bulk_stages = pos == 50 ? 4 : 0;  // the fused form with bulk-copied weights too
      ASSERT_NO_THROW(pc::gemv_decode(w, a, nullptr)) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const std::vector<float> qs = ys.get(), qf = yf.get();
      for (int i = 0; i < nh * hd; ++i)
        ASSERT_TRUE((std::isnan(qs[size_t(i)]) && std::isnan(qf[size_t(i)])) || qs[size_t(i)] == qf[size_t(i)])
            << what << " q " << i << ": " << qs[size_t(i)] << " vs " << qf[size_t(i)];
      EXPECT_EQ(kf.get(), ks.get()) << what;
      EXPECT_EQ(vf.get(), vs.get()) << what;
      if (pos < cap) {
        EXPECT_NE(kf.get(), cache0) << what << ": nothing stored";
      }
    }
  }
}

TEST(CudaGemvDecode, RopeKvEqualsStoreThenRopeAppend) {
  REQUIRE_GPU();
  std::mt19937 gen(31);
  // 80: a head size whose half is not a power of two (the kernel finds a row's head by a
  // multiply-high, exact for any size).
  for (int hd : {128, 80}) check_rope_kv_matches_separate(hd, 8, 2, gen);
  // Llama-3-8B's heads: 192 row groups, more than an H200's 132 blocks, so a warp finishes two
  // groups and the second one's epilogue runs on lane 1 (the deferred epilogue).
  check_rope_kv_matches_separate(128, 32, 8, gen);
  const int nh = 8, nkv = 2, hd = 128, K = 512, N = (nh + 2 * nkv) * hd, cap = 64, max_pos = 48, slots = 2;
  std::vector<float> cosv(size_t(max_pos) * hd / 2, 1.0f), sinv(cosv.size(), 0.0f);
  pc::DeviceRopeTable rope(cosv.data(), sinv.data(), hd, max_pos);
  const std::vector<uint16_t> cache0(size_t(slots) * nkv * cap * hd, 0x3f80);
  // Arguments: N must match the head layout; the cache and the table must be given.
  SmallLinear L(N, K, gen);
  pc::DecodeWeights& dw = L.dw;
  pc::DecodeLinearArgs& a = L.a;
  Dev<pc::AttnSeq> seq(std::vector<pc::AttnSeq>{{0, 1, 3, 0}});
  Dev<uint16_t> kc(cache0), vc(cache0);
  a.out = pc::DecodeOut::RopeKv;
  a.rope_kv = pc::DecodeRopeKv{seq.p, rope.view(), nh, nkv, hd, cap, kc.p, vc.p};
  EXPECT_NO_THROW(pc::gemv_decode(dw, a, nullptr));
  a.rope_kv.nkv = 4;  // N != (nh + 2 nkv) hd
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.rope_kv.nkv = nkv;
  a.rope_kv.k_cache = nullptr;
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  a.rope_kv.k_cache = kc.p;
  a.in = pc::DecodeIn::Plain;  // not built
  EXPECT_THROW(pc::gemv_decode(dw, a, nullptr), perry::Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
