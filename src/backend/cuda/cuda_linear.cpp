#include "backend/cuda/cuda_linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/backend_kernels.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/expand_int4.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemm_small_m_sm90.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_weight_only_sm90.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/two_level_scales.h"

namespace perry::cuda {

namespace pq = perry::quant;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS {} failed: {} ({})", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

ActFormat input_format(pq::QuantMode mode) {
  return pq::quant_scheme(mode).int8_activations ? ActFormat::I8 : ActFormat::BF16;
}

CudaLinear CudaLinear::upload(DevicePool& pool, const std::vector<const model::Linear*>& parts, const std::string& name) {
  PERRY_CHECK(!parts.empty(), "CudaLinear::upload: no parts for {}", name);
  CudaLinear l;
  l.name_ = name;
  l.mode_ = parts[0]->mode();
  l.k_ = int(parts[0]->cols());
  int64_t N = 0;
  bool any_bias = false;
  for (const model::Linear* p : parts) {
    PERRY_CHECK(p->mode() == l.mode_ && p->cols() == l.k_, "{}: fused parts differ in mode or input width", name);
    N += p->rows();
    any_bias |= !p->bias().empty();
  }
  PERRY_CHECK(N < (int64_t(1) << 31) && l.k_ > 0, "{}: shape [{}, {}] too large for the CUDA kernels", name, N, l.k_);
  l.n_ = int(N);
  const int64_t K = l.k_;
  if (!pq::is_quantized(l.mode_)) {
    // Float layers compute in bf16 on the GPU whatever the checkpoint stores (f32/f16 are rounded
    // once here): cuBLAS bf16 is the fast path the quantized modes are measured against.
    std::vector<uint16_t> w(size_t(N * K));
    int64_t row = 0;
    for (const model::Linear* p : parts) {
      const kernels::FloatLinear* f = p->float_linear();
      PERRY_CHECK(f != nullptr, "{}: float layer without weights", name);
      const int64_t n = p->rows();
      const size_t cnt = size_t(n * K);
      uint16_t* dst = w.data() + row * K;
      switch (f->weight_dtype()) {
        case DType::BF16: std::memcpy(dst, f->weights(), cnt * 2); break;
        case DType::F16: {
          const auto* s = static_cast<const uint16_t*>(f->weights());
          for (size_t i = 0; i < cnt; ++i) dst[i] = perry::f32_to_bf16(f16_to_f32(s[i]));
          break;
        }
        case DType::F32: {
          const auto* s = static_cast<const float*>(f->weights());
          for (size_t i = 0; i < cnt; ++i) dst[i] = perry::f32_to_bf16(s[i]);
          break;
        }
        default: fail("{}: unsupported float weight dtype {}", name, dtype_name(f->weight_dtype()));
      }
      row += n;
    }
    l.weight_ = DeviceBuffer(pool, w.size() * 2, "weights of " + name);
    copy_to_device(l.weight_.get(), w.data(), w.size() * 2);
    l.weight_bytes_ = w.size() * 2;
  } else {
    const pq::QuantScheme sc = pq::quant_scheme(l.mode_);
    if (sc.fp8) {
      PERRY_CHECK(gemm_w8a8_wgmma_supported(), "{}: w8a8-fp8 runs on Hopper's fp8 tensor cores (wgmma, sm_90) only; "
                  "this GPU has none — use w8a8 or bf16", name);
      PERRY_CHECK(l.k_ % 16 == 0, "{}: w8a8-fp8 needs an input width that is a multiple of 16 (this layer has {})",
                  name, l.k_);
    }
    l.bits_ = sc.weight_bits;
    l.group_size_ = sc.group_size;
    std::vector<int8_t> q;
    std::vector<float> s;
    for (const model::Linear* p : parts) {
      const pq::QuantizedLinear* ql = p->quantized();
      PERRY_CHECK(ql != nullptr, "{}: quantized layer without weights", name);
      const pq::QuantizedWeight& c = ql->canonical();
      q.insert(q.end(), c.qweight.begin(), c.qweight.end());
      s.insert(s.end(), c.scales.begin(), c.scales.end());
    }
    l.weight_ = DeviceBuffer(pool, q.size(), "weights of " + name);
    copy_to_device(l.weight_.get(), q.data(), q.size());
    l.scales_ = DeviceBuffer(pool, s.size() * 4, "weight scales of " + name);
    copy_to_device(l.scales_.get(), s.data(), s.size() * 4);
    l.weight_bytes_ = q.size() + s.size() * 4;
    // Two-level int4 scales: the factors of every part, for the prefill paths that run the layer
    // as a per-channel int8 GEMM (TwoLevelWgmma, ExpandTwoLevelWgmma) — w4a8-g128's factored
    // scales, per-channel w4a8's own scales with multipliers of 1. A part whose scales do not
    // factor (an older checkpoint) leaves the whole layer on the grouped kernels.
    if (l.mode_ == pq::QuantMode::W4A8_G128 || l.mode_ == pq::QuantMode::W4A8) {
      pq::TwoLevelScales f;
      bool all = true;
      for (const model::Linear* p : parts) {
        const auto part = pq::int4_two_level_factors(p->quantized()->canonical());
        if (!(all = part.has_value())) break;
        f.channel.insert(f.channel.end(), part->channel.begin(), part->channel.end());
        f.multiplier.insert(f.multiplier.end(), part->multiplier.begin(), part->multiplier.end());
      }
      if (all) {
        l.channel_scales_ = DeviceBuffer(pool, f.channel.size() * 4, "channel scales of " + name);
        copy_to_device(l.channel_scales_.get(), f.channel.data(), f.channel.size() * 4);
        l.multipliers_ = DeviceBuffer(pool, f.multiplier.size(), "group scale multipliers of " + name);
        copy_to_device(l.multipliers_.get(), f.multiplier.data(), f.multiplier.size());
        l.weight_bytes_ += f.channel.size() * 4 + f.multiplier.size();
      }
    }
  }
  if (any_bias) {
    std::vector<float> b;
    for (const model::Linear* p : parts) {
      if (p->bias().empty()) b.insert(b.end(), size_t(p->rows()), 0.0f);
      else b.insert(b.end(), p->bias().begin(), p->bias().end());
    }
    l.bias_ = DeviceBuffer(pool, b.size() * 4, "bias of " + name);
    copy_to_device(l.bias_.get(), b.data(), b.size() * 4);
  }
  return l;
}

namespace {

// y[M,N] (row-major, fp32 or bf16) = x[M,K] (bf16) · w[N,K]ᵀ (bf16): column-major cuBLAS sees
// yᵀ = w · xᵀ. A bias is added through beta = 1 on an fp32 y only (bf16_output() excludes it).
void gemm_bf16_cublas(const uint16_t* x, const uint16_t* w, void* y, DType out, int M, int N, int K,
                      const float* bias, LinearContext& ctx) {
  float alpha = 1.0f, beta = 0.0f;
  if (bias) {
    PERRY_CHECK(out == DType::F32, "gemm_bf16_cublas: a bias needs the fp32 output");
    broadcast_rows(bias, M, N, static_cast<float*>(y), ctx.stream);  // y = bias, then y += x·wᵀ
    beta = 1.0f;
  }
  const cudaDataType_t yt = out == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  check_cublas(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF,
                            K, &beta, y, yt, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16 linear)");
}

// Hopper: the TMA + wgmma kernels (docs/cuda-gemm-w8a8-sm90.md). W8A8 takes gemm_w8a8_wgmma at
// every M past gemm_small_m: with cold weights (bench-op, weights rotated past the L2) its
// mostly empty 128-row tiles still stream the weights faster than mma.sync — at M = 128, 0.025
// vs 0.050 ms (N 14336, K 4096) and 0.032 vs 0.109 (N 2560, K 10240); a 64-token Llama-3-8B
// prefill 4.75 vs 10.31 ms (ninth session, runs 6-7; the lab's warm-L2 timing had put them
// level). The grouped / int4 modes take gemm_quant_wgmma from the same M (tenth session: their
// mma.sync gemm_quant was 0.13-0.48x cuBLAS bf16 at M = 128; measured in docs/perf/cuda/README.md).
bool wgmma_enabled() {
  static const bool ok = gemm_w8a8_wgmma_supported() && !env_flag("PERRY_NO_WGMMA");
  return ok;
}

}  // namespace

void CudaLinear::forward(const LinearInput& x, int M, float* y, LinearContext& ctx) const {
  run(x, M, y, DType::F32, ctx);
}

void CudaLinear::forward_bf16(const LinearInput& x, int M, uint16_t* y, LinearContext& ctx) const {
  PERRY_CHECK(bf16_output(M), "{}: no bf16-output kernel for M = {} ({})", name_, M, kernel_name(M));
  run(x, M, y, DType::BF16, ctx);
}

bool CudaLinear::bf16_output(int M) const {
  switch (path(M)) {
    case Path::SmallM:
    case Path::Gemv: return false;
    case Path::CublasBf16:
    case Path::DequantCublas: return bias_.get<float>() == nullptr;
    default: return true;
  }
}

size_t linear_splitk_bytes(pq::QuantMode mode, LinearPath path, int M, int N, int K) {
  switch (path) {
    case LinearPath::Wgmma: return gemm_w8a8_wgmma_workspace_bytes(M, N, K);
    case LinearPath::WgmmaQuant: return gemm_quant_wgmma_workspace_bytes(mode, M, N, K);
    case LinearPath::ExpandWgmma: return expanded_int4_splitk_bytes(mode, M, N, K);
    case LinearPath::ExpandTwoLevelWgmma: return gemm_w8a8_wgmma_workspace_bytes(M, N, K);
    case LinearPath::TwoLevelWgmma: return gemm_w4a8_two_level_wgmma_workspace_bytes(M, N, K);
    case LinearPath::SmallMWgmma: return gemm_small_m_wgmma_workspace_bytes(M, N, K);
    case LinearPath::WeightOnlyWgmma: return gemm_weight_only_wgmma_workspace_bytes(M, N, K);
    default: return 0;
  }
}

size_t CudaLinear::splitk_bytes(int M) const { return linear_splitk_bytes(mode_, path(M), M, n_, k_); }

void CudaLinear::run(const LinearInput& x, int M, void* y, DType out, LinearContext& ctx) const {
  PERRY_CHECK(M > 0, "{}: no rows", name_);
  const float* bias = bias_.get<float>();
  float* yf = static_cast<float*>(y);  // the fp32-only paths (forward_bf16 never reaches them)
  switch (path(M)) {
    case Path::CublasBf16:
      gemm_bf16_cublas(x.bf16, weight_.get<uint16_t>(), y, out, M, n_, k_, bias, ctx);
      return;
    case Path::SmallM:
      gemm_small_m(mode_, a8() ? static_cast<const void*>(x.i8) : static_cast<const void*>(x.bf16),
                   a8() ? x.scale : nullptr, weight_.get(), scales_.get<float>(), bias, yf, M, n_, k_, ctx.stream);
      return;
    case Path::Gemv:
      // Blocks of at most 8 rows (also the fallback for K the tensor-core kernels cannot tile).
      for (int m0 = 0; m0 < M; m0 += kGemvMaxM) {
        const int mb = std::min(kGemvMaxM, M - m0);
        const void* xp = a8() ? static_cast<const void*>(x.i8 + size_t(m0) * k_)
                              : static_cast<const void*>(x.bf16 + size_t(m0) * k_);
        gemv_quant(mode_, xp, a8() ? x.scale + m0 : nullptr, weight_.get(), scales_.get<float>(), bias,
                   yf + size_t(m0) * n_, mb, n_, k_, ctx.stream);
      }
      return;
    case Path::WeightOnlyWgmma:
      gemm_weight_only_wgmma(x.bf16, weight_.get(), scales_.get<float>(), bits_, group_size_, bias, y, out, M, n_, k_,
                             ctx.stream, ctx.splitk.get<float>(), ctx.splitk.bytes());
      return;
    case Path::DequantCublas:
      // Weight-only prefill: one pass to rebuild the bf16 weight, then the library GEMM.
      ctx.dequant_scratch.ensure(*ctx.pool, size_t(n_) * size_t(k_) * 2, "dequantized weight scratch");
      dequantize_weight_bf16(weight_.get(), scales_.get<float>(), bits_, group_size_, n_, k_,
                             ctx.dequant_scratch.get<uint16_t>(), ctx.stream);
      gemm_bf16_cublas(x.bf16, ctx.dequant_scratch.get<uint16_t>(), y, out, M, n_, k_, bias, ctx);
      return;
    case Path::SmallMWgmma:
      if (bits_ == 4)  // (two-level scales: linear_path takes int4 here only with them)
        gemm_small_m_wgmma_two_level(x.i8, x.scale, weight_.get(), multipliers_.get<int8_t>(),
                                     channel_scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream,
                                     ctx.splitk.get(), ctx.splitk.bytes(), ctx.splitk_flags.get<uint32_t>());
      else
        gemm_small_m_wgmma(mode_, x.i8, x.scale, weight_.get<int8_t>(), scales_.get<float>(), bias, y, out, M, n_, k_,
                           ctx.stream, ctx.splitk.get(), ctx.splitk.bytes(), ctx.splitk_flags.get<uint32_t>());
      return;
    case Path::Wgmma:  // (the GEMMs split only when the workspace is large enough; else they run unsplit)
      gemm_w8a8_wgmma(x.i8, x.scale, weight_.get<int8_t>(), scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream,
                      ctx.splitk.get<int32_t>(), ctx.splitk.bytes(), ctx.splitk_flags.get<uint32_t>());
      return;
    case Path::MmaSync:
      gemm_w8a8(x.i8, x.scale, weight_.get<int8_t>(), scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream);
      return;
    case Path::GemmQuant:
      gemm_quant(mode_, x.i8, x.scale, weight_.get(), scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream);
      return;
    case Path::WgmmaQuant:
      gemm_quant_wgmma(mode_, x.i8, x.scale, weight_.get(), scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream,
                       ctx.splitk.get<float>(), ctx.splitk.bytes());
      return;
    case Path::ExpandWgmma:
      PERRY_CHECK(ctx.dequant_scratch.bytes() >= size_t(n_) * size_t(k_), "{}: the int4 expansion scratch is missing",
                  name_);
      run_expanded_int4(mode_, x.i8, x.scale, weight_.get(), scales_.get<float>(), bias, y, out, M, n_, k_,
                        ctx.dequant_scratch.get<int8_t>(), ctx.splitk.get(), ctx.splitk.bytes(),
                        ctx.splitk_flags.get<uint32_t>(), ctx.stream);
      return;
    case Path::ExpandTwoLevelWgmma:
      PERRY_CHECK(ctx.dequant_scratch.bytes() >= size_t(n_) * size_t(k_), "{}: the int4 expansion scratch is missing",
                  name_);
      run_expanded_int4_two_level(x.i8, x.scale, weight_.get(), multipliers_.get<int8_t>(),
                                  channel_scales_.get<float>(), bias, y, out, M, n_, k_,
                                  ctx.dequant_scratch.get<int8_t>(), ctx.splitk.get<int32_t>(), ctx.splitk.bytes(),
                                  ctx.splitk_flags.get<uint32_t>(), ctx.stream);
      return;
    case Path::TwoLevelWgmma:
      gemm_w4a8_two_level_wgmma(x.i8, x.scale, weight_.get(), multipliers_.get<int8_t>(), channel_scales_.get<float>(),
                                bias, y, out, M, n_, k_, ctx.stream, ctx.splitk.get<int32_t>(), ctx.splitk.bytes(),
                                ctx.splitk_flags.get<uint32_t>());
      return;
    case Path::Fp8Wgmma:
      PERRY_CHECK(ctx.fp8_act.bytes() >= fp8_act_bytes(M) && ctx.fp8_scale.bytes() >= size_t(M) * 4,
                  "{}: the e4m3 activation scratch holds fewer than {} rows", name_, M);
      quantize_per_token_fp8(x.bf16, DType::BF16, M, k_, ctx.fp8_act.get<uint8_t>(), ctx.fp8_scale.get<float>(),
                             ctx.stream);
      gemm_fp8_wgmma(ctx.fp8_act.get<uint8_t>(), ctx.fp8_scale.get<float>(), weight_.get<uint8_t>(),
                     scales_.get<float>(), bias, y, out, M, n_, k_, ctx.stream);
      return;
  }
}

DecodeWeights CudaLinear::decode_weights() const {
  DecodeWeights w;
  w.mode = pq::is_quantized(mode_) ? mode_ : pq::QuantMode::BF16;  // float layers live in bf16 here
  w.w = weight_.get();
  w.scales = scales_.get<float>();
  w.bias = bias_.get<float>();
  w.N = n_;
  w.K = k_;
  return w;
}

bool CudaLinear::decode_fusable() const {
  return !fp8() && gemv_decode_supports(decode_weights().mode, k_);
}

// Which kernel runs M rows. Crossovers from the H200 measurements in docs/perf/cuda/ (kernel
// timing prints of test_cuda_small_m and perry bench-op --device cuda).
LinearPath linear_path(pq::QuantMode mode, int M, int K, bool two_level, int N) {
  using Path = LinearPath;
  constexpr int kGemvMaxM = CudaLinear::kGemvMaxM, kGemvOnlyMaxM = CudaLinear::kGemvOnlyMaxM,
                kSmallMA8MaxM = CudaLinear::kSmallMA8MaxM;
  // bf16: cuBLAS reads the weights at 82-88% of the copy bandwidth at every M up to 64 on the
  // H200 (gemm_small_m_bf16: 46-65%), so the library is the bf16 path (and the honest baseline).
  if (!pq::is_quantized(mode)) return Path::CublasBf16;
  // The comparison mode has one kernel (upload checked the GPU and K): its decode rows run in
  // 128-row tiles, mostly empty — fp8 is compared on prefill, where it is compute-bound.
  if (pq::quant_scheme(mode).fp8) return Path::Fp8Wgmma;
  const bool a8 = input_format(mode) == ActFormat::I8;
  // The tensor-core kernels copy 16-byte rows: K % 16 (int8 weights) or K % 32 (int4). Other K
  // (tiny test models) take the GEMV in blocks of 8 rows — correct, just slower.
  const bool k_ok = K % gemm_small_m_k_multiple(mode) == 0;
  if (!k_ok) return a8 || M <= kGemvMaxM ? Path::Gemv : Path::DequantCublas;
  // H200, N=14336/K=4096 and 4096/14336 (test_cuda_small_m timing, docs/perf/cuda): gemv_quant
  // wins at M <= 2-3 (w8a8 M=2: 19.9 vs 25.7 us), gemm_small_m from 4 (26.1 vs 27.0); for the W*A8
  // modes the tensor-core GEMMs win again above 32 rows (w8a8 M=64: 43 vs 65 us), for the
  // weight-only modes gemm_small_m beats dequantize + cuBLAS up to 64 rows (98 vs 206 us).
  // Lab knobs for the crossovers below (bench-op A/B runs): PERRY_GEMV_ONLY_MAX_M,
  // PERRY_SMALL_M_A8_MAX_M (W*A8: gemm_small_m to here, then the wgmma GEMMs) and
  // PERRY_SMALL_M_A16_MAX_M (weight-only: the small-M range to here — the fused GEMM's narrow
  // tiles, or gemm_small_m where it does not run — then the fused GEMM or dequantize + cuBLAS).
  static const int gemv_only_max = env_int("PERRY_GEMV_ONLY_MAX_M", kGemvOnlyMaxM, 0, kGemvMaxM);
  static const int small_a8_max = env_int("PERRY_SMALL_M_A8_MAX_M", kSmallMA8MaxM, 0, kGemmSmallMMaxM);
  static const int small_a16_max = env_int("PERRY_SMALL_M_A16_MAX_M", kGemmSmallMMaxM, 0, kGemmSmallMMaxM);
  if (M <= gemv_only_max) return Path::Gemv;
  // The grouped int8 modes (w8a8-g128 / g64) past gemv_quant's rows and up to 32: the weight stream
  // of gemm_small_m_wgmma (gemm_small_m_sm90.h). H100, s41 runs 3 / 5 (bench-op, docs/perf/cuda/
  // s41-runs-small-m.md): w8a8-g128 at M 16 1.04-1.17x faster than gemm_small_m on all five shapes
  // (M 4-8: 2-7% faster, 2560 x 10240 4-5% slower), Llama-3-8B decode at 16 sequences +8.6%; at M 64
  // slower than gemm_quant_wgmma. Per-channel w8a8 and the int4 form lost to gemm_small_m /
  // gemm_w8a8_wgmma there and are taken only with PERRY_SMALL_M_WGMMA_ALL=1 (lab);
  // PERRY_SMALL_M_WGMMA_MAX_M: the last M (0: never).
  static const int small_wgmma_max =
      env_int("PERRY_SMALL_M_WGMMA_MAX_M", CudaLinear::kSmallMWgmmaMaxM, 0, kGemmSmallMWgmmaMaxM);
  static const bool small_wgmma_all = env_flag("PERRY_SMALL_M_WGMMA_ALL");
  const bool grouped8 = mode == pq::QuantMode::W8A8_G128 || mode == pq::QuantMode::W8A8_G64;
  const bool small_w4 = small_wgmma_all && two_level && K % 128 == 0 && !env_flag("PERRY_NO_INT4_TWO_LEVEL") &&
                        (mode == pq::QuantMode::W4A8_G128 || mode == pq::QuantMode::W4A8);
  if (M <= small_wgmma_max && (grouped8 || (small_wgmma_all && mode == pq::QuantMode::W8A8) || small_w4) &&
      K % 16 == 0 && wgmma_enabled() && gemm_small_m_wgmma_supported())
    return Path::SmallMWgmma;
  // Per-channel w8a8 on sm_90, layers at least as wide as deep (N >= K: q|k|v, o, gate|up): the
  // prefill GEMM (gemm_w8a8_wgmma, split-K at these M) from gemv_quant's rows. H100, s41 run 5
  // (bench-op): 14336 x 4096 at M 4-16 26.3-26.5 vs gemm_small_m 31.4-33.7 us, 6144 x 4096 16.2-17.3
  // vs 19.6; on the deep layers it is even (4096 x 14336) or behind (2560 x 10240: 23 vs 19 us), so
  // they stay. s42 run 1: Llama-3-8B decode at 16 sequences with every w8a8 layer on it 3296.5 ->
  // 3451.5 tok/s. PERRY_W8A8_WIDE_SMALL_M=1 keeps the wide layers on gemm_small_m (lab).
  static const bool w8a8_wide_small = env_flag("PERRY_W8A8_WIDE_SMALL_M");
  if (mode == pq::QuantMode::W8A8 && N >= K && M <= small_a8_max && !w8a8_wide_small && wgmma_enabled())
    return Path::Wgmma;
  // Weight-only past gemv_quant's rows: the fused GEMM (codes -> bf16 in registers, no bf16 copy
  // of the weight) on layers with N >= kWeightOnlyWgmmaMinN, and on narrower ones where its split-K
  // plan splits (few weight tiles for the SMs). H100, s43 run 1 (bench-op, vs dequantize + cuBLAS,
  // docs/perf/cuda/s43-runs.md): 14336 x 4096 at M 128 / 512 / 2048 45.9 / 114.8 / 375.0 vs 132.7 /
  // 176.0 / 384.1 us (w8a16; w4a16 alike), 6144 x 4096 and 10240 x 2560 faster or level. s45 run 1
  // (docs/perf/cuda/s45-runs.md): 2560 x 10240 at M 128 / 256 (split 6 / 3) 29.5 / 44.4 vs 67.0 /
  // 74.4 us, at M 512 / 1024 (unsplit) 96.1 / 131.5 vs 91.2 / 109.7; 2560 x 4096 alike.
  // Up to kGemmSmallMMaxM rows (batched decode) with the 32 / 64-token tiles, where it replaces
  // gemm_small_m (int4: from kWeightOnlyInt4SmallMMaxM + 1 rows). s45 run 2 (H100, bench-op, 8
  // calls back to back as a decode step runs them): 14336 x 4096 w8a16 at M 16 / 32 / 64 32.8 /
  // 33.1 / 35.2 vs 38.3 / 56.7 / 99.5 us, w4a16 30.7 / 30.9 / 33.4 vs 40.8 / 60.9 / 112.8, every
  // shape alike; at M 4-8 within -9..+5% (w8a16), w4a16 3-15% slower on four of five shapes.
  // Llama-3-8B decode at 16 sequences: w8a16 2824 vs 2653 tok/s, w4a16 3009 vs 2921.
  // PERRY_WEIGHT_ONLY_SMALL_M=0 keeps gemm_small_m at every M <= 64 (A/B runs).
  static const int weight_only_wgmma = env_int("PERRY_WEIGHT_ONLY_WGMMA", -1, 0, 1);
  static const int weight_only_small = env_int("PERRY_WEIGHT_ONLY_SMALL_M", 1, 0, 1);
  if (!a8) {
    const pq::QuantScheme sc = pq::quant_scheme(mode);
    // (the split plan asked last: only for the narrow layers the rule leaves open)
    const bool fused = wgmma_enabled() &&
                       gemm_weight_only_wgmma_accepts(sc.weight_bits, sc.group_size, M, N, K, DType::BF16) &&
                       (weight_only_wgmma == 1 ||
                        (weight_only_wgmma == -1 &&
                         (N >= kWeightOnlyWgmmaMinN || gemm_weight_only_wgmma_workspace_bytes(M, N, K) > 0)));
    if (M <= small_a16_max) {
      const bool int4_small = sc.weight_bits == 4 && M <= CudaLinear::kWeightOnlyInt4SmallMMaxM;
      return fused && weight_only_small == 1 && !int4_small ? Path::WeightOnlyWgmma : Path::SmallM;
    }
    return fused ? Path::WeightOnlyWgmma : Path::DequantCublas;
  }
  if (M <= small_a8_max) return Path::SmallM;
  if (mode == pq::QuantMode::W8A8) return wgmma_enabled() ? Path::Wgmma : Path::MmaSync;
  if (!wgmma_enabled() || !gemm_quant_wgmma_supported()) return Path::GemmQuant;
  // int4 at prefill sizes: expanding the weight to int8 once (~10-30 us for 10-58 M weights)
  // costs less than the int4 kernel's in-shared-memory expansion (helper warps, one accumulator
  // set). Bench-op, H200, tenth session run 5, M 4096: w4a8 0.70-0.73x cuBLAS bf16 → 1.57-1.77x,
  // w4a8-g128 0.66-0.75x → 0.86-1.10x. PERRY_NO_INT4_EXPAND=1 keeps the int4 kernel (A/B runs).
  static const bool expand = !env_flag("PERRY_NO_INT4_EXPAND");
  // Two-level w4a8-g128 (quant/two_level_scales.h): the expanded weight is a per-channel int8 one,
  // so it takes gemm_w8a8_wgmma (1.6-1.9x cuBLAS bf16 at M >= 1024, where the grouped kernel's
  // fold holds it to 0.9-1.1x) from the per-channel w4a8 crossover. Per-channel w4a8 (thirty-ninth
  // session) takes the same paths with multipliers of 1: the register kernel instead of the
  // expansion pass below kTwoLevelExpandMinM, and the same expansion + GEMM from there.
  static const bool use_two_level = !env_flag("PERRY_NO_INT4_TWO_LEVEL");
  static const int two_level_from = env_int("PERRY_INT4_TWO_LEVEL_MIN_M", CudaLinear::kExpandTwoLevelMinM, 1, 1 << 30);
  // The register-A kernel needs no expansion pass (gemm_w4a8_two_level.h); PERRY_INT4_TWO_LEVEL_EXPAND=1
  // keeps the pass + gemm_w8a8_wgmma for A/B runs.
  static const bool two_level_expand = env_flag("PERRY_INT4_TWO_LEVEL_EXPAND");
  const bool int4_a8 = mode == pq::QuantMode::W4A8_G128 || mode == pq::QuantMode::W4A8;
  if (expand && two_level && use_two_level && int4_a8 && K % 128 == 0) {
    const bool rs = !two_level_expand && gemm_w4a8_two_level_wgmma_supported();
    // PERRY_INT4_TWO_LEVEL_RS_MAX_M: where long prompts switch to the expansion pass (lab).
    static const int two_level_expand_from =
        env_int("PERRY_INT4_TWO_LEVEL_RS_MAX_M", CudaLinear::kTwoLevelExpandMinM, 1, 1 << 30);
    if (M >= two_level_from)
      return rs && M < two_level_expand_from ? Path::TwoLevelWgmma : Path::ExpandTwoLevelWgmma;
    // Below the crossover the register-A kernel (no expansion pass to pay) still beats the grouped
    // kernels where its tiles fill at least half the SMs — wide layers (H100, thirtieth session,
    // bench-op: M 128 at N 14336 1.68x cuBLAS bf16 vs 1.21x, N 10240 1.23x vs 0.89x); with few
    // tiles and no split the grouped kernels' split-K won (N 4096 at K 14336: 0.70x vs 1.42x), so
    // the kernel's own split-K (thirty-ninth session) counts: units, not tiles.
    static const bool from_forced = std::getenv("PERRY_INT4_TWO_LEVEL_MIN_M") != nullptr;  // (lab: the pure crossover)
    if (rs && N > 0 && !from_forced && gemm_w4a8_two_level_wgmma_fills(M, N, K))
      return Path::TwoLevelWgmma;
  }
  const int expand_from =
      mode == pq::QuantMode::W4A8_G128 ? CudaLinear::kExpandInt4G128MinM : CudaLinear::kExpandInt4MinM;
  if (expand && quant_mode_bits(mode).bits == 4 && M >= expand_from) return Path::ExpandWgmma;
  return Path::WgmmaQuant;
}

namespace {
// The int8 mode that runs an expanded int4 weight with the same scales.
pq::QuantMode expanded_mode(pq::QuantMode mode) {
  PERRY_CHECK(mode == pq::QuantMode::W4A8 || mode == pq::QuantMode::W4A8_G128, "int4 expansion: {} is not a W4A8 mode",
              pq::quant_mode_name(mode));
  return mode == pq::QuantMode::W4A8 ? pq::QuantMode::W8A8 : pq::QuantMode::W8A8_G128;
}
}  // namespace

size_t expanded_int4_splitk_bytes(pq::QuantMode mode, int M, int N, int K) {
  const pq::QuantMode m8 = expanded_mode(mode);
  return m8 == pq::QuantMode::W8A8 ? gemm_w8a8_wgmma_workspace_bytes(M, N, K)
                                   : gemm_quant_wgmma_workspace_bytes(m8, M, N, K);
}

void run_expanded_int4_two_level(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                                 const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                                 int K, int8_t* scratch, int32_t* splitk, size_t splitk_bytes, uint32_t* tile_flags,
                                 cudaStream_t stream) {
  expand_int4_weight_two_level(qweight, multipliers, 128, N, K, scratch, stream);
  gemm_w8a8_wgmma(x, sa, scratch, channel_scales, bias, y, out, M, N, K, stream, splitk, splitk_bytes, tile_flags);
}

void run_expanded_int4(pq::QuantMode mode, const int8_t* x, const float* sa, const void* qweight, const float* scales,
                       const float* bias, void* y, DType out, int M, int N, int K, int8_t* scratch, void* splitk,
                       size_t splitk_bytes, uint32_t* tile_flags, cudaStream_t stream) {
  const pq::QuantMode m8 = expanded_mode(mode);
  expand_int4_weight(qweight, N, K, scratch, stream);
  if (m8 == pq::QuantMode::W8A8)
    gemm_w8a8_wgmma(x, sa, scratch, scales, bias, y, out, M, N, K, stream, static_cast<int32_t*>(splitk), splitk_bytes,
                    tile_flags);
  else
    gemm_quant_wgmma(m8, x, sa, scratch, scales, bias, y, out, M, N, K, stream, static_cast<float*>(splitk), splitk_bytes);
}

std::string CudaLinear::kernel_name(int M) const { return linear_path_name(mode_, path(M)); }

std::string linear_path_name(pq::QuantMode qmode, LinearPath path) {
  using Path = LinearPath;
  const std::string mode(pq::quant_mode_name(qmode));
  switch (path) {
    case Path::CublasBf16: return "bf16:cublas_gemm";
    case Path::SmallM: return mode + ":gemm_small_m";
    case Path::SmallMWgmma: return mode + ":gemm_small_m_wgmma";
    case Path::Gemv: return mode + ":gemv_quant";
    case Path::DequantCublas: return mode + ":dequantize_bf16+cublas_gemm";
    case Path::WeightOnlyWgmma: return mode + ":gemm_weight_only_wgmma";
    case Path::Wgmma: return mode + ":gemm_w8a8_wgmma_tma";
    case Path::MmaSync: return mode + ":" + gemm_w8a8_kernel_name();
    case Path::GemmQuant: return mode + ":gemm_quant_mma";
    case Path::WgmmaQuant: return mode + ":gemm_quant_wgmma_tma";
    case Path::ExpandWgmma:
      return mode + (qmode == pq::QuantMode::W4A8 ? ":expand_int4+gemm_w8a8_wgmma_tma" : ":expand_int4+gemm_quant_wgmma_tma");
    case Path::ExpandTwoLevelWgmma: return mode + ":expand_int4_two_level+gemm_w8a8_wgmma_tma";
    case Path::TwoLevelWgmma: return mode + ":gemm_w4a8_two_level_wgmma_tma";
    case Path::Fp8Wgmma: return mode + ":quantize_per_token_fp8+gemm_fp8_wgmma_tma";
  }
  return mode;
}

}  // namespace perry::cuda
