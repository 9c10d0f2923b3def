// The ops of `perry bench-op --device cuda` and their host references (see bench_op_cuda_ops.h).
#include "backend/cuda/bench_op_cuda_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "core/error.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemm_small_m_sm90.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemm_weight_only_sm90.h"
#include "kernels/cuda/gemv_decode.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/two_level_scales.h"

namespace perry::cuda::benchop {

namespace pq = perry::quant;
using pq::QuantMode;

namespace {

constexpr OpInfo kOps[] = {
    {Op::Quantize, "quantize", Kind::Quantize, WFmt::None, QuantMode::W8A8},
    {Op::QuantizeFp8, "quantize-fp8", Kind::Quantize, WFmt::None, QuantMode::W8A8_FP8},
    {Op::Bf16, "bf16", Kind::Perry, WFmt::BF16, QuantMode::BF16},
    {Op::W8A16, "w8a16", Kind::Perry, WFmt::I8, QuantMode::W8A16},
    {Op::W4A16, "w4a16", Kind::Perry, WFmt::I4, QuantMode::W4A16},
    {Op::W8A8, "w8a8", Kind::Perry, WFmt::I8, QuantMode::W8A8},
    {Op::W8A8Mma, "w8a8-mma", Kind::Perry, WFmt::I8, QuantMode::W8A8},
    {Op::W8A8G128, "w8a8-g128", Kind::Perry, WFmt::I8, QuantMode::W8A8_G128},
    {Op::W8A8G64, "w8a8-g64", Kind::Perry, WFmt::I8, QuantMode::W8A8_G64},
    {Op::W4A8, "w4a8", Kind::Perry, WFmt::I4, QuantMode::W4A8},
    {Op::W4A8G128, "w4a8-g128", Kind::Perry, WFmt::I4, QuantMode::W4A8_G128},
    {Op::W8A8Fp8, "w8a8-fp8", Kind::Perry, WFmt::E4M3, QuantMode::W8A8_FP8},
    {Op::CublasBf16, "cublas-bf16", Kind::Peer, WFmt::BF16, QuantMode::BF16},
    {Op::LtI8I32, "cublaslt-i8-i32", Kind::Peer, WFmt::I8, QuantMode::BF16},
    {Op::LtI8I8, "cublaslt-i8-i8", Kind::Peer, WFmt::I8, QuantMode::BF16},
    {Op::LtE4M3, "cublaslt-e4m3-bf16", Kind::Peer, WFmt::E4M3, QuantMode::BF16},
};

const LtGemm& lt_of(Op op, const OpContext& c) {
  const LtGemm* g = op == Op::LtI8I32 ? c.lt_i8_i32 : op == Op::LtI8I8 ? c.lt_i8_i8 : c.lt_e4m3;
  PERRY_CHECK(g != nullptr, "bench-op: no cuBLASLt matmul prepared for {}", op_info(op).name);
  return *g;
}

int weight_q(WFmt fmt, const uint8_t* row, int k) {
  if (fmt == WFmt::I4) {
    const uint8_t b = row[k / 2];
    return (k & 1) ? int(int8_t(b)) >> 4 : int(int8_t(uint8_t(b << 4))) >> 4;
  }
  return int8_t(row[k]);
}

}  // namespace

const OpInfo& op_info(Op op) {
  for (const OpInfo& i : kOps)
    if (i.op == op) return i;
  fail("bench-op: unknown op {}", int(op));
}

Op perry_op(QuantMode mode) {
  for (const OpInfo& i : kOps)
    if (i.kind == Kind::Perry && i.mode == mode && i.op != Op::W8A8Mma) return i.op;
  fail("bench-op: no CUDA op for mode {}", pq::quant_mode_name(mode));
}

bool has_weight_scales(Op op) { return op_info(op).kind == Kind::Perry && op != Op::Bf16; }

bool reads_int8_activations(Op op) {
  if (op == Op::LtI8I32 || op == Op::LtI8I8 || op == Op::Quantize) return true;
  return has_weight_scales(op) && pq::quant_scheme(op_info(op).mode).int8_activations;
}

bool quantizes_activations(Op op) {
  if (!has_weight_scales(op)) return false;
  const pq::QuantScheme sc = pq::quant_scheme(op_info(op).mode);
  return sc.int8_activations || sc.fp8;
}

Op quantize_op(Op op) {
  PERRY_CHECK(quantizes_activations(op), "bench-op: {} quantizes no activations", op_info(op).name);
  return pq::quant_scheme(op_info(op).mode).fp8 ? Op::QuantizeFp8 : Op::Quantize;
}

int scale_group(Op op) { return has_weight_scales(op) ? pq::quant_scheme(op_info(op).mode).group_size : 0; }

DType output_dtype(Op op) {
  switch (op) {
    case Op::Quantize: return DType::I8;
    case Op::QuantizeFp8: return DType::F8_E4M3;
    case Op::CublasBf16:
    case Op::LtE4M3: return DType::BF16;
    case Op::LtI8I32: return DType::I32;
    case Op::LtI8I8: return DType::I8;
    default: return DType::F32;
  }
}

namespace {
// What a perry layer on `path` writes when the run asks for float_out: gemm_small_m and gemv_quant
// write fp32 only.
DType path_output(LinearPath path, DType float_out) {
  return path == LinearPath::SmallM || path == LinearPath::Gemv ? DType::F32 : float_out;
}
}  // namespace

DType output_dtype(Op op, int M, int K, int N, DType float_out) {
  if (op_info(op).kind != Kind::Perry || decode_kernel_row(op, M, K)) return output_dtype(op);
  return path_output(op_path(op, M, K, N), float_out);
}

size_t weight_row_bytes(WFmt fmt, int K) {
  switch (fmt) {
    case WFmt::BF16: return size_t(K) * 2;
    case WFmt::I4: return (size_t(K) + 1) / 2;
    case WFmt::None: return 0;
    default: return size_t(K);
  }
}

void sync_or_hang(cudaStream_t stream, double seconds, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) throw_cuda("bench-op: " + what, e);
    if (std::chrono::steady_clock::now() > deadline)
      throw HangError(fmt::format("bench-op: {} did not finish within {:.0f} s (a hung kernel?)", what, seconds));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

LinearPath op_path(Op op, int M, int K, int N) {
  PERRY_CHECK(op_info(op).kind == Kind::Perry, "bench-op: {} is not a perry linear", op_info(op).name);
  // (the int4 W*A8 ops have two-level factors: w4a8-g128's, w4a8's unit multipliers)
  const bool two_level = op == Op::W4A8G128 || op == Op::W4A8;
  return op == Op::W8A8Mma ? LinearPath::MmaSync : linear_path(op_info(op).mode, M, K, two_level, N);
}

bool decode_kernel_row(Op op, int M, int K) {
  if (M != 1 || op_info(op).kind != Kind::Perry || op == Op::W8A8Mma) return false;
  const QuantMode mode = op_info(op).mode;
  return !pq::quant_scheme(mode).fp8 && gemv_decode_supports(mode, K);  // CudaLinear::decode_fusable
}

bool has_row(Op op, int M, int K) {
  return op != Op::W8A8Mma || linear_path(QuantMode::W8A8, M, K) == LinearPath::Wgmma;
}

void run_op(Op op, const OpArgs& a, bool quantize, const OpContext& c) {
  const int M = a.M, N = a.N, K = a.K;
  switch (op) {
    case Op::Quantize: quantize_per_token(a.x, DType::BF16, M, K, a.xq, a.sa, c.stream); return;
    case Op::QuantizeFp8: quantize_per_token_fp8(a.x, DType::BF16, M, K, a.xf8, a.sf8, c.stream); return;
    case Op::CublasBf16:
      cublas_gemm_bf16(c.blas, static_cast<const uint16_t*>(a.w), a.x, a.y, DType::BF16, M, N, K);
      return;
    case Op::LtI8I32:
    case Op::LtI8I8: lt_of(op, c).run(a.w, a.xq, a.y, c.lt_workspace, c.stream); return;
    case Op::LtE4M3: lt_of(op, c).run(a.w, a.x8, a.y, c.lt_workspace, c.stream); return;
    default: break;
  }
  // perry's linear: the kernels of CudaLinear::run for op_path (the layer's own choice,
  // linear_path), with the same arguments (no bias, fp32 output). The W*A8 layers read int8 rows
  // that the norm / SwiGLU kernel before them quantized: here quantize_per_token stands in for
  // that step (skipped when quantize = false); w8a8-fp8 quantizes its bf16 input itself.
  const QuantMode mode = op_info(op).mode;
  if (decode_kernel_row(op, M, K)) {
    // One token: the decode step's kernel (gemv_decode) from the fp32 row, its int8 quantization
    // (or bf16 conversion) inside the kernel — o_proj's and down_proj's form in a decode step:
    // plain input, the product added to y (the residual add; the checks start from y = 0).
    PERRY_CHECK(a.x32 != nullptr, "bench-op: {} at M = 1 needs the fp32 input row", op_info(op).name);
    DecodeLinearArgs d;
    d.x = a.x32;
    d.in = DecodeIn::Plain;
    d.y = static_cast<float*>(a.y);
    d.out = DecodeOut::Accumulate;
    gemv_decode(DecodeWeights{mode, a.w, a.scales, nullptr, N, K}, d, c.stream);
    return;
  }
  const pq::QuantScheme sc = pq::quant_scheme(mode);
  const bool a8 = sc.int8_activations;
  const LinearPath path = op_path(op, M, K, N);
  const DType out = path_output(path, c.float_out);
  if (quantize && a8) quantize_per_token(a.x, DType::BF16, M, K, a.xq, a.sa, c.stream);
  if (quantize && sc.fp8) quantize_per_token_fp8(a.x, DType::BF16, M, K, a.xf8, a.sf8, c.stream);
  const void* x = a8 ? static_cast<const void*>(a.xq) : static_cast<const void*>(a.x);
  const float* sa = a8 ? a.sa : nullptr;
  void* y = a.y;
  switch (path) {
    case LinearPath::CublasBf16:
      cublas_gemm_bf16(c.blas, static_cast<const uint16_t*>(a.w), a.x, y, out, M, N, K);
      return;
    case LinearPath::SmallM:  // (fp32 out only)
      gemm_small_m(mode, x, sa, a.w, a.scales, nullptr, static_cast<float*>(y), M, N, K, c.stream);
      return;
    case LinearPath::Gemv:
      for (int m0 = 0; m0 < M; m0 += CudaLinear::kGemvMaxM) {  // blocks of at most 8 rows
        const int mb = std::min(CudaLinear::kGemvMaxM, M - m0);
        const void* xp = a8 ? static_cast<const void*>(a.xq + size_t(m0) * K)
                            : static_cast<const void*>(a.x + size_t(m0) * K);
        gemv_quant(mode, xp, a8 ? sa + m0 : nullptr, a.w, a.scales, nullptr, static_cast<float*>(y) + size_t(m0) * N,
                   mb, N, K, c.stream);  // (fp32 out only)
      }
      return;
    case LinearPath::WeightOnlyWgmma:
      gemm_weight_only_wgmma(a.x, a.w, a.scales, sc.weight_bits, sc.group_size, nullptr, y, out, M, N, K, c.stream,
                             reinterpret_cast<float*>(c.splitk), c.splitk_bytes);
      return;
    case LinearPath::DequantCublas:
      PERRY_CHECK(c.dequant_scratch != nullptr, "bench-op: {} needs the dequantization scratch", op_info(op).name);
      dequantize_weight_bf16(a.w, a.scales, sc.weight_bits, sc.group_size, N, K, c.dequant_scratch, c.stream);
      cublas_gemm_bf16(c.blas, c.dequant_scratch, a.x, y, out, M, N, K);
      return;
    case LinearPath::Wgmma:
      gemm_w8a8_wgmma(a.xq, a.sa, static_cast<const int8_t*>(a.w), a.scales, nullptr, y, out, M, N, K, c.stream,
                      c.splitk, c.splitk_bytes, c.splitk_flags);
      return;
    case LinearPath::MmaSync:
      gemm_w8a8(a.xq, a.sa, static_cast<const int8_t*>(a.w), a.scales, nullptr, y, out, M, N, K, c.stream);
      return;
    case LinearPath::GemmQuant:
      gemm_quant(mode, a.xq, a.sa, a.w, a.scales, nullptr, y, out, M, N, K, c.stream);
      return;
    case LinearPath::WgmmaQuant:
      gemm_quant_wgmma(mode, a.xq, a.sa, a.w, a.scales, nullptr, y, out, M, N, K, c.stream,
                       reinterpret_cast<float*>(c.splitk), c.splitk_bytes);
      return;
    case LinearPath::ExpandWgmma:
      PERRY_CHECK(c.dequant_scratch != nullptr, "bench-op: {} needs the expansion scratch", op_info(op).name);
      run_expanded_int4(mode, a.xq, a.sa, a.w, a.scales, nullptr, y, out, M, N, K,
                        reinterpret_cast<int8_t*>(c.dequant_scratch), c.splitk, c.splitk_bytes, c.splitk_flags,
                        c.stream);
      return;
    case LinearPath::ExpandTwoLevelWgmma:
      PERRY_CHECK(c.dequant_scratch != nullptr && a.multipliers && a.channel_scales,
                  "bench-op: {} needs the expansion scratch and the two-level scale factors", op_info(op).name);
      run_expanded_int4_two_level(a.xq, a.sa, a.w, a.multipliers, a.channel_scales, nullptr, y, out, M, N, K,
                                  reinterpret_cast<int8_t*>(c.dequant_scratch), c.splitk, c.splitk_bytes,
                                  c.splitk_flags, c.stream);
      return;
    case LinearPath::TwoLevelWgmma:
      PERRY_CHECK(a.multipliers && a.channel_scales, "bench-op: {} needs the two-level scale factors", op_info(op).name);
      gemm_w4a8_two_level_wgmma(a.xq, a.sa, a.w, a.multipliers, a.channel_scales, nullptr, y, out, M, N, K,
                                c.stream, c.splitk, c.splitk_bytes, c.splitk_flags);
      return;
    case LinearPath::SmallMWgmma:
      if (sc.weight_bits == 4) {
        PERRY_CHECK(a.multipliers && a.channel_scales, "bench-op: {} needs the two-level scale factors",
                    op_info(op).name);
        gemm_small_m_wgmma_two_level(a.xq, a.sa, a.w, a.multipliers, a.channel_scales, nullptr, y, out, M, N, K,
                                     c.stream, c.splitk, c.splitk_bytes, c.splitk_flags);
      } else {
        gemm_small_m_wgmma(mode, a.xq, a.sa, static_cast<const int8_t*>(a.w), a.scales, nullptr, y, out, M, N, K,
                           c.stream, c.splitk, c.splitk_bytes, c.splitk_flags);
      }
      return;
    case LinearPath::Fp8Wgmma:
      gemm_fp8_wgmma(a.xf8, a.sf8, static_cast<const uint8_t*>(a.w), a.scales, nullptr, y, out, M, N, K,
                     c.stream);
      return;
  }
}

std::string kernel_name(Op op, int M, int K, const OpContext& c, int N) {
  switch (op) {
    case Op::Quantize: return "quantize_per_token (bf16 in)";
    case Op::QuantizeFp8: return "quantize_per_token_fp8 (bf16 in)";
    case Op::CublasBf16: return "cublasGemmEx bf16->bf16";
    case Op::LtI8I32:
    case Op::LtI8I8:
    case Op::LtE4M3: return lt_of(op, c).note();
    default: break;
  }
  // The layer's kernels as CudaLinear::kernel_name prints them (w8a8-fp8's name includes its
  // quantization), after the int8 quantization the bench adds for the W*A8 modes.
  const QuantMode mode = op_info(op).mode;
  if (decode_kernel_row(op, M, K))
    return pq::quant_scheme(mode).int8_activations ? "gemv_decode (fp32 row quantized in the kernel)"
                                                    : "gemv_decode (fp32 row)";
  const LinearPath path = op_path(op, M, K, N);
  std::string name = linear_path_name(mode, path);
  if (path == LinearPath::TwoLevelWgmma && N > 0) {  // (its split-K, where the workspace holds it)
    const int splits = gemm_w4a8_two_level_wgmma_splits(M, N, K);
    if (splits > 1 && c.splitk && c.splitk_flags && c.splitk_bytes >= gemm_w4a8_two_level_wgmma_workspace_bytes(M, N, K)) {
      const int whole = gemm_w4a8_two_level_wgmma_whole_tiles(M, N, K);
      name += whole > 0 ? fmt::format(" ({} k-splits after {} whole tiles)", splits, whole)
                        : fmt::format(" ({} k-splits)", splits);
    }
  }
  if (path == LinearPath::WeightOnlyWgmma && N > 0) {  // (likewise: it splits only with room for the slices)
    const size_t wb = gemm_weight_only_wgmma_workspace_bytes(M, N, K);
    if (wb > 0 && c.splitk && c.splitk_bytes >= wb) name += " (split-K)";
  }
  return pq::quant_scheme(mode).int8_activations ? "quantize_per_token + " + name : name;
}

double e4m3_to_double(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}

double reference(Op op, const HostRow& w, const HostAct& x, int K, float lt_alpha) {
  const WFmt fmt = op_info(op).fmt;
  double s = 0;
  if (fmt == WFmt::BF16) {
    const auto* wb = reinterpret_cast<const uint16_t*>(w.w);
    for (int k = 0; k < K; ++k) s += double(x.x[k]) * double(bf16_to_f32(wb[k]));
    return s;
  }
  if (op == Op::W8A8Fp8) {  // x's own e4m3 codes (not the peer's x8), one scale per row and channel
    for (int k = 0; k < K; ++k) s += e4m3_to_double(x.xf8[k]) * e4m3_to_double(w.w[k]);
    return s * double(x.sf8) * double(w.scales[0]);
  }
  if (fmt == WFmt::E4M3) {
    for (int k = 0; k < K; ++k) s += e4m3_to_double(x.x8[k]) * e4m3_to_double(w.w[k]);
    return s;
  }
  if (op == Op::LtI8I32 || op == Op::LtI8I8) {
    int64_t acc = 0;
    for (int k = 0; k < K; ++k) acc += int64_t(x.xq[k]) * weight_q(fmt, w.w, k);
    if (op == Op::LtI8I32) return double(acc);
    return std::clamp(std::nearbyint(double(lt_alpha) * double(acc)), -128.0, 127.0);
  }
  // perry's quantized modes: Σ_g scale[g] · Σ_{k in g} x·q (int64 for int8 activations, × sa).
  const int gs = scale_group(op) > 0 ? scale_group(op) : K;
  const bool a8 = reads_int8_activations(op);
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += gs) {
    const int k1 = std::min(K, k0 + gs);
    double part = 0;
    if (a8) {
      int64_t acc = 0;
      for (int k = k0; k < k1; ++k) acc += int64_t(x.xq[k]) * weight_q(fmt, w.w, k);
      part = double(acc);
    } else {
      for (int k = k0; k < k1; ++k) part += double(x.x[k]) * weight_q(fmt, w.w, k);
    }
    s += double(w.scales[g]) * part;
  }
  return a8 ? s * double(x.sa) : s;
}

double output_value(DType out, const void* row, int n) {
  switch (out) {
    case DType::F32: return static_cast<const float*>(row)[n];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(row)[n]);
    case DType::I32: return static_cast<const int32_t*>(row)[n];
    case DType::I8: return static_cast<const int8_t*>(row)[n];
    default: fail("bench-op: unexpected output dtype");
  }
}

Verdict judge(Op op, const std::vector<double>& got, const std::vector<double>& ref) {
  Verdict v;
  double ss = 0, maxdiff = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    ss += ref[i] * ref[i];
    const double d = std::fabs(got[i] - ref[i]);
    if (!std::isfinite(got[i]) || !std::isfinite(d)) finite = false;
    else maxdiff = std::max(maxdiff, d);
  }
  const double rms = std::sqrt(ss / double(std::max<size_t>(1, ref.size())));
  v.err = !finite ? std::numeric_limits<double>::infinity() : rms > 0 ? maxdiff / rms : maxdiff;
  const DType out = output_dtype(op);
  if (out == DType::I32 || out == DType::I8) {
    const double tol = out == DType::I32 ? 0.0 : 1.0;
    v.ok = finite && maxdiff <= tol;
    v.what = fmt::format("max |diff| {} (allowed {})", maxdiff, tol);
  } else {
    v.ok = finite && v.err <= kErrLimit;
    v.what = fmt::format("max err {:.2g} of rms (limit {:.0e})", v.err, kErrLimit);
  }
  if (rms == 0 && out != DType::I32 && out != DType::I8) {  // an all-zero reference proves nothing
    v.ok = false;
    v.what += ", reference is all zeros";
  }
  if (!v.ok) v.what = "FAIL: " + v.what;
  return v;
}

std::vector<StartupCheck> startup_checks(const std::vector<Op>& ops, DevicePool& pool, cudaStream_t stream,
                                         cublasHandle_t blas) {
  constexpr int N = kStartupCheckN, K = 1024;
  const int Mmax = *std::max_element(std::begin(kStartupCheckMs), std::end(kStartupCheckMs));
  // Every op at N = 384, and the weight-only ops once more at kStartupCheckWeightOnlyN outputs,
  // where linear_path gives them the fused GEMM (split) at one M and dequantize + cuBLAS at the
  // other (at 384 the fused GEMM splits every M past gemv_quant's rows).
  struct Case {
    Op op;
    int n;
    std::vector<int> Ms;
  };
  std::vector<Case> cases;
  for (Op op : ops)
    if (op_info(op).kind == Kind::Perry)
      cases.push_back({op, N, std::vector<int>(std::begin(kStartupCheckMs), std::end(kStartupCheckMs))});
  const auto weight_only = [](Op op) { return op == Op::W8A16 || op == Op::W4A16; };
  for (Op op : ops)
    if (weight_only(op))
      cases.push_back({op, kStartupCheckWeightOnlyN,
                       std::vector<int>(std::begin(kStartupCheckWeightOnlyMs), std::end(kStartupCheckWeightOnlyMs))});
  const bool wide = std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.n != kStartupCheckN; });
  const int Nmax = wide ? std::max(N, kStartupCheckWeightOnlyN) : N;
  constexpr int Mwo = *std::max_element(std::begin(kStartupCheckWeightOnlyMs), std::end(kStartupCheckWeightOnlyMs));
  static_assert(Mwo <= 300, "the weight-only case's rows are among the Mmax rows of x");

  std::mt19937 rng(20260512);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(size_t(N) * K), x(size_t(Mmax) * K);
  for (auto& v : w) v = 0.02f * nd(rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = perry::f32_to_bf16(nd(rng));
    x[i] = bf16_to_f32(xb[i]);  // what every kernel sees
  }
  // The weight-only case's further rows, drawn after x so the N = 384 case keeps its numbers.
  w.resize(size_t(Nmax) * K);
  for (size_t i = size_t(N) * K; i < w.size(); ++i) w[i] = 0.02f * nd(rng);
  // Per-token quantization of the bf16 rows on the host (the rules quantize_per_token and
  // quantize_per_token_fp8 follow).
  std::vector<int8_t> xq(x.size());
  std::vector<uint8_t> xf8(x.size());
  std::vector<float> sa(Mmax), sf8(Mmax);
  for (int m = 0; m < Mmax; ++m) {
    sa[m] = pq::quantize_row_ref(&x[size_t(m) * K], K, &xq[size_t(m) * K]);
    sf8[m] = pq::quantize_row_fp8_ref(&x[size_t(m) * K], K, &xf8[size_t(m) * K]);
  }
  // The unquantized float product of the first `rows` rows at n outputs, the same for every op;
  // row m does not depend on M, so each reference is computed once for the most rows a case checks
  // and each M compares its first M.
  auto float_product = [&](int rows, int n_out) {
    std::vector<double> r(size_t(rows) * n_out);
    for (int m = 0; m < rows; ++m)
      for (int n = 0; n < n_out; ++n) {
        double sf = 0;
        for (int k = 0; k < K; ++k) sf += double(w[size_t(n) * K + k]) * double(x[size_t(m) * K + k]);
        r[size_t(m) * n_out + n] = sf;
      }
    return r;
  };
  const std::vector<double> ref_float_n = float_product(Mmax, N);
  const std::vector<double> ref_float_wide = wide ? float_product(Mwo, kStartupCheckWeightOnlyN) : std::vector<double>();

  DeviceBuffer dx(pool, xb.size() * 2, "bench-op check x"), dxq(pool, xq.size(), "bench-op check xq"),
      dsa(pool, size_t(Mmax) * 4, "bench-op check sa"), dxf8(pool, xf8.size(), "bench-op check xf8"),
      dsf8(pool, size_t(Mmax) * 4, "bench-op check sf8"), dy(pool, size_t(Mmax) * Nmax * 4, "bench-op check y"),
      dw(pool, size_t(Nmax) * K * 2, "bench-op check weights"),
      ds(pool, size_t(Nmax) * K / 16 * 4, "bench-op check scales"),
      scratch(pool, size_t(Nmax) * K * 2, "bench-op check scratch"),
      dch(pool, size_t(Nmax) * 4, "bench-op check channel scales"),
      dmul(pool, size_t(Nmax) * K / 32, "bench-op check multipliers");
  copy_to_device(dx.get(), xb.data(), xb.size() * 2);
  DeviceBuffer dx32(pool, size_t(K) * 4, "bench-op check x (fp32 row)");  // the decode kernel's row 0
  copy_to_device(dx32.get(), x.data(), size_t(K) * 4);
  OpContext ctx;
  ctx.stream = stream;
  ctx.blas = blas;
  ctx.dequant_scratch = scratch.get<uint16_t>();
  // The weight-only ops as CudaLinear runs them: with the fused GEMM's split-K workspace where its
  // plan splits (the other ops run unsplit, as before).
  size_t wo_ws = 0;
  for (const Case& cs : cases)
    if (weight_only(cs.op))
      for (int M : cs.Ms)
        wo_ws = std::max(wo_ws, linear_splitk_bytes(op_info(cs.op).mode, op_path(cs.op, M, K, cs.n), M, cs.n, K));
  DeviceBuffer dws(pool, std::max<size_t>(wo_ws, 16), "bench-op check split-K workspace");
  OpContext wo_ctx = ctx;
  wo_ctx.splitk = dws.get<int32_t>();
  wo_ctx.splitk_bytes = wo_ws;

  std::vector<StartupCheck> out;
  for (const Case& cs : cases) {
    const Op op = cs.op;
    const int N = cs.n;  // shadows the common 384 for this case
    const int Mcase = *std::max_element(cs.Ms.begin(), cs.Ms.end());
    const std::vector<double>& ref_float = N == kStartupCheckN ? ref_float_n : ref_float_wide;
    const OpContext& cctx = weight_only(op) ? wo_ctx : ctx;
    // The weights as perry's CPU quantizer writes them, and what they stand for (q·scale).
    std::vector<float> deq;
    pq::QuantizedWeight qw;
    if (op == Op::Bf16) {
      std::vector<uint16_t> wb(size_t(N) * K);
      deq.resize(wb.size());
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = perry::f32_to_bf16(w[i]);
        deq[i] = bf16_to_f32(wb[i]);
      }
      copy_to_device(dw.get(), wb.data(), wb.size() * 2);
    } else {
      qw = pq::quantize_weight(w.data(), N, K, op_info(op).mode);
      PERRY_CHECK(qw.scales.size() * 4 <= ds.bytes(), "bench-op check: scales larger than expected");
      copy_to_device(dw.get(), qw.qweight.data(), qw.qweight.size());
      copy_to_device(ds.get(), qw.scales.data(), qw.scales.size() * 4);
      deq = pq::dequantize_weight(qw);
      if ((op == Op::W4A8G128 || op == Op::W4A8) && K % 128 == 0) {  // the factors, as CudaLinear::upload takes them
        const auto f = pq::int4_two_level_factors(qw);
        PERRY_CHECK(f.has_value(), "bench-op check: the {} quantizer wrote scales that do not factor", op_info(op).name);
        copy_to_device(dch.get(), f->channel.data(), f->channel.size() * 4);
        copy_to_device(dmul.get(), f->multiplier.data(), f->multiplier.size());
      }
    }
    const bool a8 = reads_int8_activations(op), fp8 = op == Op::W8A8Fp8;
    std::vector<double> ref(size_t(Mcase) * N);
    for (int m = 0; m < Mcase; ++m)
      for (int n = 0; n < N; ++n) {
        double s = 0;
        if (fp8) {
          // From the codes, not from deq: dequantize_weight rounds e4m3·scale to float.
          const auto* wq = reinterpret_cast<const uint8_t*>(qw.qweight.data()) + size_t(n) * K;
          const uint8_t* fr = &xf8[size_t(m) * K];
          for (int k = 0; k < K; ++k) s += e4m3_to_double(fr[k]) * e4m3_to_double(wq[k]);
          s *= double(sf8[m]) * double(qw.scales[size_t(n)]);
        } else {
          const float* xr = &x[size_t(m) * K];
          const int8_t* qr = &xq[size_t(m) * K];
          const float* dr = &deq[size_t(n) * K];
          for (int k = 0; k < K; ++k) s += double(dr[k]) * (a8 ? double(qr[k]) : double(xr[k]));
          if (a8) s *= sa[m];
        }
        ref[size_t(m) * N + n] = s;
      }
    for (int M : cs.Ms) {
      if (!has_row(op, M, K)) continue;
      StartupCheck c;
      c.op = op_info(op).name;
      c.M = M;
      c.N = N;
      c.kernel = kernel_name(op, M, K, cctx, N);
      try {
        OpArgs a;
        a.w = dw.get();
        a.scales = ds.get<float>();
        a.channel_scales = dch.get<float>();
        a.multipliers = dmul.get<int8_t>();
        a.x = dx.get<uint16_t>();
        a.x32 = dx32.get<float>();
        a.xq = dxq.get<int8_t>();
        a.sa = dsa.get<float>();
        a.xf8 = dxf8.get<uint8_t>();
        a.sf8 = dsf8.get<float>();
        a.y = dy.get();
        a.M = M;
        a.N = N;
        a.K = K;
        // NaN: unwritten outputs fail (the decode kernel adds to y: 0 there, and it must write every row)
        PERRY_CUDA_CHECK(cudaMemsetAsync(dy.get(), decode_kernel_row(op, M, K) ? 0 : 0xff, dy.bytes(), stream));
        run_op(op, a, true, cctx);
        sync_or_hang(stream, 20, fmt::format("the startup check of {} (M={}, {})", c.op, M, c.kernel));
        std::vector<float> y(size_t(M) * N);
        PERRY_CUDA_CHECK(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost));
        const std::vector<double> got(y.begin(), y.end());
        const auto rows = std::ptrdiff_t(y.size());
        c.verdict = judge(op, got, std::vector<double>(ref.begin(), ref.begin() + rows));
        c.err_float = judge(op, got, std::vector<double>(ref_float.begin(), ref_float.begin() + rows)).err;
        if (fp8) {
          // The reference used the host's codes: the device's must be the same bytes (the
          // output tolerance alone would hide a quantizer off by one code here and there).
          std::vector<uint8_t> dq(size_t(M) * K);
          std::vector<float> ds8(static_cast<size_t>(M));
          PERRY_CUDA_CHECK(cudaMemcpy(dq.data(), dxf8.get(), size_t(M) * K, cudaMemcpyDeviceToHost));
          PERRY_CUDA_CHECK(cudaMemcpy(ds8.data(), dsf8.get(), size_t(M) * 4, cudaMemcpyDeviceToHost));
          size_t bad = 0;
          for (size_t i = 0; i < size_t(M) * K; ++i) bad += dq[i] != xf8[i];
          for (int m = 0; m < M; ++m) bad += std::memcmp(&ds8[size_t(m)], &sf8[size_t(m)], 4) != 0;
          if (bad) {
            c.verdict.ok = false;
            c.verdict.what = fmt::format("FAIL: {} e4m3 activation bytes/scales differ from quantize_row_fp8_ref; {}",
                                         bad, c.verdict.what);
          }
        }
      } catch (const HangError&) {
        throw;
      } catch (const Error& e) {
        c.verdict.ok = false;
        c.verdict.err = std::numeric_limits<double>::infinity();
        c.verdict.what = std::string("FAIL: ") + e.what();
        // A fault leaves the CUDA context unusable: nothing after it could be trusted.
        const cudaError_t sticky = cudaDeviceSynchronize();
        if (sticky != cudaSuccess)
          fail("bench-op: the CUDA context is broken after checking {} (M={}): {}; rerun without it (--modes, "
               "--no-wgmma)",
               c.op, M, cudaGetErrorString(sticky));
        cudaGetLastError();
      }
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace perry::cuda::benchop
