// `perry bench-op --device cuda` (src/backend/cuda/bench_op_cuda*.cpp) and the library peers
// (src/kernels/cuda/bench_peers.h): the host references the benchmark checks every timed output
// against, the cuBLASLt peers against exact integer / float64 results, and one tiny end-to-end
// run whose every row must pass its check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "backend/cuda/bench_op_cuda.h"
#include "backend/cuda/bench_op_cuda_ops.h"
#include "cuda/cuda_test_util.h"
#include "core/dtype.h"
#include "kernels/cuda/bench_peers.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemm_small_m_sm90.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemm_weight_only_sm90.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/quant.h"

namespace {

using namespace perry::cuda::benchop;
namespace pq = perry::quant;
namespace pc = perry::cuda;
using perry::cuda::testing::have_gpu;

// reference() reads the canonical format the way perry's CPU quantizer writes it.
TEST(CudaBenchOp, ReferenceMatchesCpuQuantizer) {
  const int N = 16, K = 512;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> w(size_t(N) * K), x(K);
  for (auto& v : w) v = 0.02f * nd(rng);
  for (auto& v : x) v = perry::bf16_to_f32(perry::f32_to_bf16(nd(rng)));
  std::vector<int8_t> xq(K);
  const float sa = pq::quantize_row_ref(x.data(), K, xq.data());
  for (Op op : {Op::W8A16, Op::W4A16, Op::W8A8, Op::W8A8G128, Op::W8A8G64, Op::W4A8, Op::W4A8G128}) {
    const pq::QuantizedWeight qw = pq::quantize_weight(w.data(), N, K, op_info(op).mode);
    ASSERT_EQ(scale_group(op) == 0 ? 1 : K / scale_group(op), qw.n_groups()) << op_info(op).name;
    const std::vector<float> deq = pq::dequantize_weight(qw);
    for (int n = 0; n < N; ++n) {
      const HostRow r{reinterpret_cast<const uint8_t*>(qw.qweight.data()) + n * qw.row_bytes(),
                      qw.scales.data() + n * qw.n_groups()};
      const HostAct a{x.data(), xq.data(), sa, nullptr};
      double want = 0;
      for (int k = 0; k < K; ++k)
        want += double(deq[size_t(n) * K + k]) * (reads_int8_activations(op) ? xq[k] * double(sa) : double(x[k]));
      EXPECT_NEAR(reference(op, r, a, K, 1.0f), want, 1e-5 * (std::fabs(want) + 1e-2)) << op_info(op).name << " n=" << n;
    }
  }
}

// w8a8-fp8's row in the op table: e4m3 weights with one fp32 scale per channel, its own e4m3
// activation quantization (skipped by the GEMM-alone timing, timed alone as quantize-fp8), and
// never mistaken for an int8-activation mode (its scheme has int8_activations false).
TEST(CudaBenchOp, Fp8OpTable) {
  const OpInfo& i = op_info(Op::W8A8Fp8);
  EXPECT_STREQ(i.name, "w8a8-fp8");
  EXPECT_EQ(i.kind, Kind::Perry);
  EXPECT_EQ(i.fmt, WFmt::E4M3);
  EXPECT_EQ(i.mode, pq::QuantMode::W8A8_FP8);
  EXPECT_EQ(perry_op(pq::QuantMode::W8A8_FP8), Op::W8A8Fp8);
  EXPECT_EQ(perry_op(*pq::parse_quant_mode("w8a8-fp8")), Op::W8A8Fp8);
  EXPECT_TRUE(has_weight_scales(Op::W8A8Fp8));
  EXPECT_EQ(scale_group(Op::W8A8Fp8), 0);
  EXPECT_FALSE(reads_int8_activations(Op::W8A8Fp8));
  EXPECT_TRUE(quantizes_activations(Op::W8A8Fp8));
  EXPECT_EQ(quantize_op(Op::W8A8Fp8), Op::QuantizeFp8);
  EXPECT_EQ(output_dtype(Op::W8A8Fp8), perry::DType::F32);
  EXPECT_EQ(weight_row_bytes(WFmt::E4M3, 1000), 1000u);  // 1 byte a weight (+ N scales)
  EXPECT_EQ(op_info(Op::QuantizeFp8).kind, Kind::Quantize);
  // The others keep their roles.
  for (Op op : {Op::W8A8, Op::W8A8Mma, Op::W8A8G128, Op::W8A8G64, Op::W4A8, Op::W4A8G128}) {
    EXPECT_TRUE(quantizes_activations(op)) << op_info(op).name;
    EXPECT_EQ(quantize_op(op), Op::Quantize) << op_info(op).name;
  }
  for (Op op : {Op::Bf16, Op::W8A16, Op::W4A16, Op::CublasBf16, Op::LtI8I32, Op::LtE4M3, Op::Quantize})
    EXPECT_FALSE(quantizes_activations(op)) << op_info(op).name;
  EXPECT_FALSE(has_weight_scales(Op::LtE4M3));
}

// reference() of w8a8-fp8 against a sum computed independently of the code under test: the
// activation codes from core/dtype.h's f32_to_e4m3 (not quant.cpp's bit-level encoder), the values
// from e4m3_to_f32 and QuantizedWeight::weight_value (not the bench's e4m3_to_double), and
// quantize_weight's own per-channel scales. It must read the row's own codes (xf8 / sf8), not
// the fp8 peer's x8, which the benchmark fills with unrelated bytes.
TEST(CudaBenchOp, Fp8ReferenceMatchesIndependentSum) {
  const int N = 12, K = 640;
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> w(size_t(N) * K);
  for (auto& v : w) v = 0.02f * nd(rng);
  w[5] = 0.5f;  // an outlier sets row 0's scale: its other weights get small codes
  w[K + 7] = 0.0f;
  const pq::QuantizedWeight qw = pq::quantize_weight(w.data(), N, K, pq::QuantMode::W8A8_FP8);
  ASSERT_EQ(qw.n_groups(), 1);
  ASSERT_EQ(qw.row_bytes(), K);
  for (int row = 0; row < 3; ++row) {
    std::vector<float> x(K);
    for (auto& v : x) v = perry::bf16_to_f32(perry::f32_to_bf16(nd(rng) * (row == 2 ? 1e-3f : 1.0f)));
    if (row == 1) x[3] = 40.0f;  // most codes far below 448
    // The host rule, as the benchmark calls it.
    std::vector<uint8_t> xf8(K);
    const float sf8 = pq::quantize_row_fp8_ref(x.data(), K, xf8.data());
    // The same, independently: amax/448 and the codec of x·(448/amax).
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float inv = 448.0f / amax;
    EXPECT_EQ(sf8, amax / 448.0f) << "row " << row;
    for (int k = 0; k < K; ++k) ASSERT_EQ(xf8[size_t(k)], perry::f32_to_e4m3(x[size_t(k)] * inv)) << "row " << row << " k=" << k;
    std::vector<uint8_t> peer(K, 0x38);  // the peer's bytes (all 1.0): must not be read
    const HostAct a{x.data(), nullptr, 0, peer.data(), xf8.data(), sf8};
    for (int n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(perry::e4m3_to_f32(xf8[size_t(k)])) * double(qw.weight_value(n, k));
        acc += p;
        mag += std::fabs(p);
      }
      const double s = double(sf8) * double(qw.scales[size_t(n)]);
      const HostRow r{reinterpret_cast<const uint8_t*>(qw.qweight.data()) + size_t(n) * K, &qw.scales[size_t(n)]};
      // e4m3 products are exact in float64; only the order of additions may differ.
      EXPECT_NEAR(reference(Op::W8A8Fp8, r, a, K, 1.0f), acc * s, 1e-12 * mag * s) << "row " << row << " n=" << n;
      // And close to the unquantized product (e4m3 keeps 3 mantissa bits: a loose bound).
      double exact = 0, exact_mag = 0;
      for (int k = 0; k < K; ++k) {
        exact += double(x[size_t(k)]) * w[size_t(n) * K + k];
        exact_mag += std::fabs(double(x[size_t(k)]) * w[size_t(n) * K + k]);
      }
      EXPECT_NEAR(acc * s, exact, 0.1 * exact_mag) << "row " << row << " n=" << n;
    }
  }
}

// The path choice bench-op and CudaLinear share (linear_path) at small M (the sm_90 kernels
// where the device has them), and the bench's perry ops following it.
// Whether environment variable `name` is set to `v` (the A/B switches the path tests follow).
bool env_is(const char* name, const char* v) {
  const char* e = std::getenv(name);
  return e && std::string(e) == v;
}

TEST(CudaBenchOp, LinearPathChoice) {
  using pc::LinearPath;
  using QM = pq::QuantMode;
  for (int M : {1, 16, 100, 4096}) {
    EXPECT_EQ(pc::linear_path(QM::BF16, M, 4096), LinearPath::CublasBf16) << M;
    EXPECT_EQ(pc::linear_path(QM::W8A8_FP8, M, 4096), LinearPath::Fp8Wgmma) << M;
    EXPECT_EQ(pc::linear_path(QM::W8A8, M, 1000), LinearPath::Gemv) << M;  // K not a multiple of 16
    EXPECT_EQ(pc::linear_path(QM::W4A8, M, 48), LinearPath::Gemv) << M;    // int4: K % 32
  }
  // Past gemv_quant's rows: the grouped int8 modes take gemm_small_m_wgmma on sm_90 (to
  // kSmallMWgmmaMaxM), per-channel w8a8, int4 weights and other GPUs gemm_small_m.
  static_assert(pc::CudaLinear::kSmallMWgmmaMaxM == pc::CudaLinear::kSmallMA8MaxM, "the loop below");
  const bool small_wgmma = pc::linear_path(QM::W8A8_G128, 16, 4096) == LinearPath::SmallMWgmma;
  EXPECT_EQ(small_wgmma, pc::gemm_small_m_wgmma_supported());
  for (QM mode : {QM::W8A8, QM::W8A8_G128, QM::W8A8_G64, QM::W4A8, QM::W4A8_G128}) {
    const bool int8_w = mode == QM::W8A8_G128 || mode == QM::W8A8_G64;
    for (int M = 1; M <= pc::CudaLinear::kGemvOnlyMaxM; ++M) EXPECT_EQ(pc::linear_path(mode, M, 4096), LinearPath::Gemv);
    for (int M = pc::CudaLinear::kGemvOnlyMaxM + 1; M <= pc::CudaLinear::kSmallMA8MaxM; ++M)
      EXPECT_EQ(pc::linear_path(mode, M, 4096), small_wgmma && int8_w ? LinearPath::SmallMWgmma : LinearPath::SmallM)
          << M;
  }
  // Per-channel w8a8 on sm_90: wide layers (N >= K) on the prefill GEMM from gemv_quant's rows,
  // deep ones (N < K) on gemm_small_m.
  const bool w8a8_wgmma = pc::linear_path(QM::W8A8, 4096, 4096) == LinearPath::Wgmma;
  for (int M = pc::CudaLinear::kGemvOnlyMaxM + 1; M <= pc::CudaLinear::kSmallMA8MaxM; ++M) {
    EXPECT_EQ(pc::linear_path(QM::W8A8, M, 4096, false, 14336), w8a8_wgmma ? LinearPath::Wgmma : LinearPath::SmallM)
        << M;
    EXPECT_EQ(pc::linear_path(QM::W8A8, M, 4096, false, 4096), w8a8_wgmma ? LinearPath::Wgmma : LinearPath::SmallM)
        << M;
    EXPECT_EQ(pc::linear_path(QM::W8A8, M, 14336, false, 4096), LinearPath::SmallM) << M;
  }
  EXPECT_EQ(pc::linear_path(QM::W8A8, pc::CudaLinear::kGemvOnlyMaxM, 4096, false, 14336), LinearPath::Gemv);
  // Weight-only on sm_90: the fused GEMM past gemv_quant's rows on layers with N >=
  // kWeightOnlyWgmmaMinN, and on narrower ones at the M where its split-K plan splits (s45 run 1:
  // faster than dequantize + cuBLAS there, slower unsplit); gemm_small_m (M <= 64) and dequantize +
  // cuBLAS elsewhere and where N is not known. PERRY_WEIGHT_ONLY_WGMMA=0 / =1 (the A/B switch) turn
  // the rule off / onto every accepted shape, PERRY_WEIGHT_ONLY_SMALL_M=0 keeps gemm_small_m at M <= 64.
  const bool wo_off = env_is("PERRY_WEIGHT_ONLY_WGMMA", "0"), wo_all = env_is("PERRY_WEIGHT_ONLY_WGMMA", "1");
  const bool small_off = env_is("PERRY_WEIGHT_ONLY_SMALL_M", "0");
  const bool can_fuse = w8a8_wgmma && pc::gemm_weight_only_wgmma_supported() && !wo_off;
  const int small_max = perry::cuda::kGemmSmallMMaxM;
  // The path for M rows of an N × K layer when the rule says `fused` (N not known: never fused, the
  // kernel's shape check needs it).
  // (w4a16 keeps gemm_small_m to kWeightOnlyInt4SmallMMaxM rows)
  const auto expect = [&](QM mode, int M, bool fused, bool n_known = true) {
    const bool f = can_fuse && n_known && (fused || wo_all);
    if (M <= pc::CudaLinear::kGemvOnlyMaxM) return LinearPath::Gemv;
    const bool int4_small = mode == QM::W4A16 && M <= pc::CudaLinear::kWeightOnlyInt4SmallMMaxM;
    if (M <= small_max) return f && !small_off && !int4_small ? LinearPath::WeightOnlyWgmma : LinearPath::SmallM;
    return f ? LinearPath::WeightOnlyWgmma : LinearPath::DequantCublas;
  };
  const auto splits = [](int M, int N, int K) { return pc::gemm_weight_only_wgmma_workspace_bytes(M, N, K) > 0; };
  for (QM mode : {QM::W8A16, QM::W4A16}) {
    for (int M : {1, 3, 4, 8, 9, 16, small_max, small_max + 1, 128, 4096}) {
      EXPECT_EQ(pc::linear_path(mode, M, 4096), expect(mode, M, false, false)) << M;
      EXPECT_EQ(pc::linear_path(mode, M, 4096, false, 14336), expect(mode, M, true)) << M;
      EXPECT_EQ(pc::linear_path(mode, M, 14336, false, pc::kWeightOnlyWgmmaMinN), expect(mode, M, true)) << M;
      EXPECT_EQ(pc::linear_path(mode, M, 10240, false, 2560), expect(mode, M, splits(M, 2560, 10240))) << M;
    }
    EXPECT_EQ(pc::linear_path(mode, 8, 40), LinearPath::Gemv);           // odd K: the GEMV up to 8 rows,
    EXPECT_EQ(pc::linear_path(mode, 9, 40), LinearPath::DequantCublas);  // then dequantize + cuBLAS
    EXPECT_EQ(pc::linear_path(mode, 128, 4000, false, 14336), LinearPath::DequantCublas);  // K % 64 != 0
  }
  if (pc::gemm_weight_only_wgmma_supported()) {
    // (the narrow layer splits at the short prompt, not at the long one, on any sm_90 part)
    EXPECT_TRUE(splits(128, 2560, 10240));
    EXPECT_FALSE(splits(4096, 2560, 10240));
  }
  // int4 W*A8 on sm_90: the int4 GEMM below kExpandInt4MinM (w4a8-g128: kExpandInt4G128MinM)
  // rows, the int8 one on the expanded weight from there (without wgmma: gemm_quant throughout).
  const bool wg = pc::linear_path(QM::W8A8_G128, 1000, 4096) == LinearPath::WgmmaQuant;
  for (QM mode : {QM::W4A8, QM::W4A8_G128}) {
    const int m0 = mode == QM::W4A8 ? pc::CudaLinear::kExpandInt4MinM : pc::CudaLinear::kExpandInt4G128MinM;
    EXPECT_EQ(pc::linear_path(mode, m0 - 1, 4096), wg ? LinearPath::WgmmaQuant : LinearPath::GemmQuant);
    EXPECT_EQ(pc::linear_path(mode, m0, 4096), wg ? LinearPath::ExpandWgmma : LinearPath::GemmQuant);
  }
  // w4a8-g128 with two-level scales: the per-channel int8 GEMM on the expansion from
  // kExpandTwoLevelMinM (K a multiple of 128: whole groups), the int4 GEMM below.
  const int t0 = pc::CudaLinear::kExpandTwoLevelMinM;
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, t0 - 1, 4096, true), wg ? LinearPath::WgmmaQuant : LinearPath::GemmQuant);
  // (the register-A kernel where it runs, else the expansion pass + the per-channel GEMM)
  const LinearPath tl =
      pc::gemm_w4a8_two_level_wgmma_supported() ? LinearPath::TwoLevelWgmma : LinearPath::ExpandTwoLevelWgmma;
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, t0, 4096, true), wg ? tl : LinearPath::GemmQuant);
  // ... the register kernel up to kTwoLevelExpandMinM, the expansion pass from there.
  const int t1 = pc::CudaLinear::kTwoLevelExpandMinM;
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, t1 - 1, 4096, true), wg ? tl : LinearPath::GemmQuant);
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, t1, 4096, true),
            wg ? LinearPath::ExpandTwoLevelWgmma : LinearPath::GemmQuant);
  // Below it the register-A kernel where its work units fill half the SMs (N given): wide layers
  // by their tiles, narrow ones over a long K by its split-K; the grouped kernels (split-K) where
  // they would not — N 4096 × K 14336 at M 128 with the kernel's split-K off.
  if (wg && tl == LinearPath::TwoLevelWgmma) {
    EXPECT_TRUE(pc::gemm_w4a8_two_level_wgmma_fills(128, 14336, 4096));
    EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 128, 4096, true, 14336), LinearPath::TwoLevelWgmma);
    if (pc::sm_count() == 132) {
      EXPECT_TRUE(pc::gemm_w4a8_two_level_wgmma_fills(128, 4096, 14336));
      EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 128, 14336, true, 4096), LinearPath::TwoLevelWgmma);
    }
    setenv("PERRY_TWO_LEVEL_SPLITK", "0", 1);
    EXPECT_FALSE(pc::gemm_w4a8_two_level_wgmma_fills(128, 4096, 14336));
    EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 128, 14336, true, 4096), LinearPath::WgmmaQuant);
    unsetenv("PERRY_TWO_LEVEL_SPLITK");
    EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 128, 4096, false, 14336), LinearPath::WgmmaQuant);  // not two-level
    EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 16, 4096, true, 14336), LinearPath::SmallM);
  }
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 4096, 4160, true), wg ? LinearPath::ExpandWgmma : LinearPath::GemmQuant);
  // Per-channel w4a8 with its unit multipliers (int4_two_level_factors) takes the two-level paths
  // too: the register kernel up to kTwoLevelExpandMinM, the expansion + per-channel GEMM from there;
  // without them (K off the 128 grid, or no factors) the expansion pass as before.
  EXPECT_EQ(pc::linear_path(QM::W4A8, 4096, 4096, true), wg ? tl : LinearPath::GemmQuant);
  EXPECT_EQ(pc::linear_path(QM::W4A8, t1, 4096, true), wg ? LinearPath::ExpandTwoLevelWgmma : LinearPath::GemmQuant);
  EXPECT_EQ(pc::linear_path(QM::W4A8, 4096, 4096, false), wg ? LinearPath::ExpandWgmma : LinearPath::GemmQuant);
  EXPECT_EQ(pc::linear_path(QM::W4A8, 4096, 4160, true), wg ? LinearPath::ExpandWgmma : LinearPath::GemmQuant);
  EXPECT_EQ(pc::linear_path_name(QM::W4A8, LinearPath::TwoLevelWgmma), "w4a8:gemm_w4a8_two_level_wgmma_tma");
  EXPECT_EQ(pc::linear_path(QM::W4A8_G128, 8, 4096, true), LinearPath::SmallM);
  EXPECT_EQ(pc::linear_path_name(QM::W4A8_G128, LinearPath::ExpandTwoLevelWgmma),
            "w4a8-g128:expand_int4_two_level+gemm_w8a8_wgmma_tma");
  EXPECT_EQ(pc::linear_path_name(QM::W4A8_G128, LinearPath::TwoLevelWgmma), "w4a8-g128:gemm_w4a8_two_level_wgmma_tma");
  EXPECT_EQ(op_path(Op::W4A8G128, 4096, 4096), pc::linear_path(QM::W4A8_G128, 4096, 4096, true));
  EXPECT_EQ(pc::linear_path_name(QM::W4A8_G128, LinearPath::ExpandWgmma), "w4a8-g128:expand_int4+gemm_quant_wgmma_tma");
  EXPECT_EQ(pc::linear_path_name(QM::W4A8, LinearPath::ExpandWgmma), "w4a8:expand_int4+gemm_w8a8_wgmma_tma");
  // The bench's ops: the layer's choice, its name as CudaLinear::kernel_name prints it.
  const OpContext ctx;
  EXPECT_EQ(op_path(Op::W8A8, 16, 4096), LinearPath::SmallM);
  EXPECT_EQ(op_path(Op::W8A16, 100, 4096), LinearPath::DequantCublas);
  EXPECT_EQ(op_path(Op::Bf16, 1, 4096), LinearPath::CublasBf16);
  EXPECT_EQ(op_path(Op::W8A8Mma, 1, 4096), LinearPath::MmaSync);  // the comparison row: always mma.sync
  // One row: the decode step's kernel (gemv_decode) for every mode it fuses — not w8a8-fp8, not
  // cuBLAS's row, not a K it cannot take —; two rows: the layer's GEMV.
  EXPECT_EQ(kernel_name(Op::W8A8, 1, 4096, ctx), "gemv_decode (fp32 row quantized in the kernel)");
  EXPECT_EQ(kernel_name(Op::Bf16, 1, 4096, ctx), "gemv_decode (fp32 row)");
  EXPECT_EQ(kernel_name(Op::W8A8, 2, 4096, ctx), "quantize_per_token + w8a8:gemv_quant");
  for (Op op : {Op::Bf16, Op::W8A16, Op::W4A16, Op::W8A8, Op::W8A8G128, Op::W8A8G64, Op::W4A8, Op::W4A8G128}) {
    EXPECT_TRUE(decode_kernel_row(op, 1, 4096)) << op_info(op).name;
    EXPECT_FALSE(decode_kernel_row(op, 2, 4096)) << op_info(op).name;
    EXPECT_FALSE(decode_kernel_row(op, 1, 1000)) << op_info(op).name;  // K % 32 != 0
  }
  for (Op op : {Op::W8A8Fp8, Op::W8A8Mma, Op::CublasBf16, Op::LtI8I32, Op::Quantize})
    EXPECT_FALSE(decode_kernel_row(op, 1, 4096)) << op_info(op).name;
  EXPECT_EQ(kernel_name(Op::W4A8G128, 16, 4096, ctx), "quantize_per_token + w4a8-g128:gemm_small_m");
  EXPECT_EQ(kernel_name(Op::W4A16, 100, 4096, ctx), "w4a16:dequantize_bf16+cublas_gemm");
  EXPECT_EQ(kernel_name(Op::Bf16, 100, 4096, ctx), "bf16:cublas_gemm");
  EXPECT_EQ(kernel_name(Op::W8A8Fp8, 1, 4096, ctx), "w8a8-fp8:quantize_per_token_fp8+gemm_fp8_wgmma_tma");
  // w8a8-mma has rows only where w8a8 takes wgmma: never at small M; every other op always.
  for (int M : {1, 16, 32}) {
    EXPECT_FALSE(has_row(Op::W8A8Mma, M, 4096)) << M;
    for (Op op : {Op::Bf16, Op::W8A8, Op::W8A16, Op::W4A8, Op::W8A8Fp8, Op::CublasBf16, Op::Quantize})
      EXPECT_TRUE(has_row(op, M, 4096)) << op_info(op).name << " M=" << M;
  }
  EXPECT_EQ(perry_op(QM::W8A8), Op::W8A8);
  EXPECT_STREQ(op_info(Op::W8A8Mma).name, "w8a8-mma");
}

// The startup check's row counts reach every path at its K = 1024: the tensor-core GEMM past the
// small-M kernels is the one M = 1000 takes (gemm_quant_wgmma on sm_90, else gemm_quant).
TEST(CudaBenchOp, StartupCheckCoversPaths) {
  using pc::LinearPath;
  std::set<LinearPath> a8, w16;
  for (int M : kStartupCheckMs) {
    if (M <= 128) a8.insert(pc::linear_path(pq::QuantMode::W8A8_G128, M, 1024));
    w16.insert(pc::linear_path(pq::QuantMode::W4A16, M, 1024, false, kStartupCheckN));  // (as op_path asks)
  }
  for (int M : kStartupCheckWeightOnlyMs)
    w16.insert(pc::linear_path(pq::QuantMode::W4A16, M, 1024, false, kStartupCheckWeightOnlyN));
  const LinearPath gemm = pc::linear_path(pq::QuantMode::W8A8_G128, 1000, 1024);
  EXPECT_TRUE(gemm == LinearPath::GemmQuant || gemm == LinearPath::WgmmaQuant);
  const LinearPath small = pc::gemm_small_m_wgmma_supported() ? LinearPath::SmallMWgmma : LinearPath::SmallM;
  EXPECT_EQ(a8, (std::set<LinearPath>{LinearPath::Gemv, small, gemm}));
  EXPECT_GT(*std::max_element(std::begin(kStartupCheckMs), std::end(kStartupCheckMs)), 128);
  // The weight-only ops reach every path they take in a model: gemv_quant; the fused GEMM where it
  // runs (sm_90, not turned off by PERRY_WEIGHT_ONLY_WGMMA=0), at N 384 from 4 rows (it splits
  // there; w4a16 from 9) and at N 3072 on 200 rows; gemm_small_m at M <= 64 where the fused GEMM
  // does not take them (w4a16 at 5 rows, PERRY_WEIGHT_ONLY_SMALL_M=0, no sm_90); dequantize + cuBLAS
  // on the 300 rows of N 3072 (unsplit), unless PERRY_WEIGHT_ONLY_WGMMA=1 puts every shape on the
  // fused GEMM.
  const bool fused_on = gemm == LinearPath::WgmmaQuant && pc::gemm_weight_only_wgmma_supported() &&
                        !env_is("PERRY_WEIGHT_ONLY_WGMMA", "0");
  std::set<LinearPath> want{LinearPath::Gemv, LinearPath::SmallM};
  if (fused_on) want.insert(LinearPath::WeightOnlyWgmma);
  if (!(fused_on && env_is("PERRY_WEIGHT_ONLY_WGMMA", "1"))) want.insert(LinearPath::DequantCublas);
  EXPECT_EQ(w16, want);
  EXPECT_LT(kStartupCheckWeightOnlyN, pc::kWeightOnlyWgmmaMinN);  // (the narrow-layer rule is what it checks)
  // ... and, where the wgmma GEMMs run, the int4 prefill paths past their crossover (w4a8-g128 with
  // the quantizer's two-level scales, as bench-op's weights have them).
  if (gemm == LinearPath::WgmmaQuant) {
    std::set<LinearPath> int4;
    for (int M : kStartupCheckMs) int4.insert(pc::linear_path(pq::QuantMode::W4A8_G128, M, 1024, true));
    EXPECT_TRUE(int4.count(LinearPath::TwoLevelWgmma) || int4.count(LinearPath::ExpandTwoLevelWgmma));
  }
}

TEST(CudaBenchOp, E4M3Decode) {
  EXPECT_EQ(e4m3_to_double(0x38), 1.0);
  EXPECT_EQ(e4m3_to_double(0xb8), -1.0);
  EXPECT_EQ(e4m3_to_double(0x7e), 448.0);
  EXPECT_EQ(e4m3_to_double(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3_to_double(0x08), std::ldexp(1.0, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_double(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_double(0xff)));
}

TEST(CudaBenchOp, Judge) {
  EXPECT_TRUE(judge(Op::W8A8, {1, 2, 3}, {1, 2, 3.05}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {1, 2, 3}, {1, 2, 3.5}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {1, NAN}, {1, 2}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {0, 0}, {0, 0}).ok);  // an all-zero reference proves nothing
  EXPECT_TRUE(judge(Op::LtI8I8, {1, 2, 3}, {1, 2, 4}).ok);
  EXPECT_FALSE(judge(Op::LtI8I32, {1, 2, 3}, {1, 2, 4}).ok);
  // w8a8-fp8 is a float output: the relative limit, not exactness.
  EXPECT_TRUE(judge(Op::W8A8Fp8, {1, 2, 3.02}, {1, 2, 3}).ok);
  EXPECT_FALSE(judge(Op::W8A8Fp8, {1, 2, 3.2}, {1, 2, 3}).ok);
}

// The cuBLASLt peers against exact results at a small, odd-M shape.
TEST(CudaBenchOp, LtPeers) {
  REQUIRE_GPU();
  const int M = 5, N = 64, K = 128;
  std::mt19937 rng(3);
  const auto w = perry::cuda::testing::rand_i8(size_t(N) * K, rng), x = perry::cuda::testing::rand_i8(size_t(M) * K, rng);
  Dev<int8_t> dw(w), dx(x);
  Dev<int32_t> y(size_t(M) * N);
  Dev<uint8_t> ws(32 << 20);
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f / 4096;
  for (auto kind : {pc::LtGemmKind::I8_I32, pc::LtGemmKind::I8_I8}) {
    pc::LtGemm g(lt, kind, M, N, K, ws.n, alpha);
    ASSERT_TRUE(g.available()) << g.note();
    g.run(dw.p, dx.p, y.p, ws.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = y.get();
    const auto* y8 = reinterpret_cast<const int8_t*>(out.data());
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int k = 0; k < K; ++k) acc += int64_t(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
        if (kind == pc::LtGemmKind::I8_I32) {
          ASSERT_EQ(out[size_t(m) * N + n], acc) << "m=" << m << " n=" << n;
        } else {
          const double want = std::clamp(std::nearbyint(alpha * double(acc)), -128.0, 127.0);
          ASSERT_NEAR(y8[size_t(m) * N + n], want, 1.0) << "m=" << m << " n=" << n;
        }
      }
  }
  cublasLtDestroy(lt);
}

// What each row writes: the peers their own dtype; perry's layers the run's choice (bf16 by
// default, as the model's linears and the cuBLAS bf16 baseline), except the kernels that write
// fp32 only — the decode step's (M = 1: it adds to y), gemm_small_m and gemv_quant.
TEST(CudaBenchOp, OutputDtypeFollowsTheLayer) {
  REQUIRE_GPU();
  using perry::DType;
  EXPECT_EQ(pc::CudaBenchOpOptions{}.float_out, DType::BF16);
  EXPECT_EQ(output_dtype(Op::CublasBf16, 4096, 4096, 4096, DType::F32), DType::BF16);
  EXPECT_EQ(output_dtype(Op::LtI8I32, 4096, 4096, 4096, DType::BF16), DType::I32);
  for (Op op : {Op::Bf16, Op::W8A8, Op::W8A8G128, Op::W4A8G128, Op::W8A16}) {
    EXPECT_EQ(output_dtype(op, 4096, 4096, 4096, DType::BF16), DType::BF16) << op_info(op).name;
    EXPECT_EQ(output_dtype(op, 4096, 4096, 4096, DType::F32), DType::F32) << op_info(op).name;
    EXPECT_EQ(output_dtype(op, 1, 4096, 4096, DType::BF16), DType::F32) << op_info(op).name << " at M = 1";
    const pc::LinearPath p = op_path(op, 16, 4096, 4096);
    const bool fp32_only = p == pc::LinearPath::SmallM || p == pc::LinearPath::Gemv;
    EXPECT_EQ(output_dtype(op, 16, 4096, 4096, DType::BF16), fp32_only ? DType::F32 : DType::BF16)
        << op_info(op).name << " at M = 16";
  }
}

// A tiny end-to-end run (perry's layers writing bf16, the default): every row (every perry mode,
// the peers, the quantizations) passes its output check and gets a time, and the files are
// written. On sm_90 that includes w8a8-fp8 and quantize-fp8 (default modes), and their startup
// checks. M = 1, 16 and 200 take the GEMV, the
// small-M kernel and the large-M GEMMs (sm_90: wgmma, plus the w8a8-mma comparison row), and each
// perry row names the kernels CudaLinear would run.
TEST(CudaBenchOp, TinyRunPasses) {
  REQUIRE_GPU();
  const int K = 512;
  pc::CudaBenchOpOptions o;
  o.common.shapes = {{256, K}};
  o.common.ms = {1, 16, 200};
  o.common.repeats = 2;
  o.common.out_prefix = ::testing::TempDir() + "perry_bench_op_cuda_test";
  ASSERT_EQ(pc::run_bench_op_cuda(o), 0);
  std::ifstream f(o.common.out_prefix + ".json");
  ASSERT_TRUE(f.good());
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["failures"], 0);
  EXPECT_GT(j["copy_bandwidth_gbs"].get<double>(), 100.0);
  const bool wgmma = pc::linear_path(pq::QuantMode::W8A8, 200, K) == pc::LinearPath::Wgmma;
  int rows = 0, fp8_rows = 0, fp8_startup = 0, mma_rows = 0, mma_startup = 0, chained = 0, wide_startup = 0,
      small_chained = 0;
  for (const auto& c : j["startup_checks"]) {
    fp8_startup += c["variant"] == "w8a8-fp8";
    mma_startup += c["variant"] == "w8a8-mma";
    EXPECT_TRUE(c["ok"].get<bool>()) << c.dump();
    if (c["N"] == kStartupCheckWeightOnlyN) {  // the weight-only ops' second case
      ++wide_startup;
      const std::string v = c["variant"], kernel = c["kernel"];
      EXPECT_TRUE(v == "w8a16" || v == "w4a16") << c.dump();
      // each row on the kernels linear_path picks there (split-K named where the fused GEMM splits)
      const int M = c["M"];
      const auto mode = v == "w8a16" ? pq::QuantMode::W8A16 : pq::QuantMode::W4A16;
      const auto path = pc::linear_path(mode, M, 1024, false, kStartupCheckWeightOnlyN);
      EXPECT_EQ(kernel.rfind(pc::linear_path_name(mode, path), 0), 0u) << c.dump();
      EXPECT_EQ(kernel.find("(split-K)") != std::string::npos,
                pc::linear_splitk_bytes(mode, path, M, kStartupCheckWeightOnlyN, 1024) > 0)
          << c.dump();
    } else {
      EXPECT_EQ(c["N"], kStartupCheckN) << c.dump();
    }
  }
  // Both weight-only modes at each of the second case's rows.
  EXPECT_EQ(wide_startup, 2 * int(std::size(kStartupCheckWeightOnlyMs)));
  const OpContext ctx;
  for (const auto& r : j["results"]) {
    ++rows;
    fp8_rows += r["variant"] == "w8a8-fp8" || r["variant"] == "quantize-fp8";
    mma_rows += r["variant"] == "w8a8-mma";
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    if (r["kind"] != "peer") {
      EXPECT_GT(r["ms"].get<double>(), 0.0) << r.dump();
    }
    // Back to back: at M = 1 the decode kernel's rows and cuBLAS bf16, at M = 16 (batched decode)
    // every perry row and cuBLAS bf16, with a time and a ratio; no other row.
    const bool decode_row = r["M"] == 1 && r["kernel"].get<std::string>().rfind("gemv_decode", 0) == 0;
    const bool small_row = r["M"] == 16 && r["kind"] == "perry";
    if (decode_row || small_row || (r["M"] <= 64 && r["variant"] == "cublas-bf16")) {
      ++chained;
      small_chained += small_row;
      EXPECT_GT(r["chain_ms"].get<double>(), 0.0) << r.dump();
      EXPECT_GT(r["chain_vs_cublas_bf16"].get<double>(), 0.0) << r.dump();
    } else {
      EXPECT_LT(r["chain_ms"].get<double>(), 0.0) << r.dump();
    }
    if (r["kind"] == "perry") {  // the kernels of linear_path (w8a8-mma: gemm_w8a8), as CudaLinear names them
      const std::string v = r["variant"];
      const auto q = pq::parse_quant_mode(v);
      const Op op = v == "w8a8-mma" ? Op::W8A8Mma : v == "bf16" ? Op::Bf16 : perry_op(*q);
      // (at the row's N, which the paths depend on; a prefix: the bench's own context names the
      // two-level kernel's split, this empty one does not)
      EXPECT_EQ(r["kernel"].get<std::string>().rfind(kernel_name(op, r["M"].get<int>(), K, ctx, r["N"].get<int>()), 0),
                0u)
          << r.dump();
      if (wgmma && v == "w8a8" && r["M"] == 200) {  // the model's large-M kernel on sm_90, not mma.sync
        EXPECT_NE(r["kernel"].get<std::string>().find("gemm_w8a8_wgmma"), std::string::npos) << r.dump();
      }
    }
  }
  EXPECT_GE(rows, 3 * 12);  // quantize + 8 perry modes + >= 3 peers, at every M
  // M = 1: bf16, w8a16, w4a16, the five int8 modes on the decode kernel, cuBLAS bf16; M = 16: the
  // eight perry modes (w8a8-fp8 where it runs), cuBLAS bf16.
  EXPECT_GE(chained, 8 + 1 + 8 + 1);
  EXPECT_GE(small_chained, 8);
  const auto n_ms = int(std::size(kStartupCheckMs));
  if (pc::gemm_w8a8_wgmma_supported()) {
    EXPECT_EQ(fp8_rows, 3 * 2);
    EXPECT_EQ(fp8_startup, n_ms);
  } else {
    EXPECT_EQ(fp8_rows, 0);
  }
  // w8a8-mma: only where w8a8 runs wgmma — M = 200 here, and the startup check's M past
  // gemm_small_m (K = 1024).
  int mma_startup_expected = 0;
  for (int m : kStartupCheckMs) mma_startup_expected += pc::linear_path(pq::QuantMode::W8A8, m, 1024) == pc::LinearPath::Wgmma;
  EXPECT_EQ(mma_rows, wgmma ? 1 : 0);
  EXPECT_EQ(mma_startup, mma_startup_expected);
  if (wgmma) {
    EXPECT_GE(mma_startup, 1);
  }
  std::remove((o.common.out_prefix + ".json").c_str());
  std::remove((o.common.out_prefix + ".md").c_str());
}

}  // namespace
