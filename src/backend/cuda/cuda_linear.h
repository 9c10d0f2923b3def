// A linear layer on the GPU in any perry mode, uploaded from the CPU model's Linear(s).
//   bf16 (and f32/f16 checkpoints, computed in bf16): cuBLAS GEMM, bf16 in, fp32 out — the honest
//     baseline;
//   w8a8 / w8a8-g128 / w8a8-g64 / w4a8 / w4a8-g128: int8 activations (per token) × int8/int4
//     weights on int8 tensor cores, scales in the epilogue; M <= kGemvMaxM: the small-M kernel
//     that streams the weights once;
//   w8a16 / w4a16: bf16 activations; small M: the dequantizing GEMV; larger M: dequantize the
//     weight to bf16 in a scratch buffer, then cuBLAS (prefill is compute-bound, the extra pass
//     over N·K bytes is small next to the GEMM);
//   w8a8-fp8 (the comparison mode): bf16 activations quantized per token to e4m3 by the layer
//     itself (quantize_per_token_fp8, a pass the int8 modes fuse into the norm / SwiGLU), then the
//     e4m3 wgmma GEMM at every M (sm_90 only).
// Weights keep the canonical layout of quant::QuantizedWeight (src/quant/quant.h), so a quantized
// checkpoint, the CPU and the GPU all hold the same bytes. Several CPU linears with the same K and
// mode (gate|up) can be uploaded as one, rows concatenated, to run as one GEMM.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv_decode.h"
#include "model/linear.h"
#include "quant/quant.h"

namespace perry::cuda {

// What a layer's input must be: bf16 rows (ActFormat::BF16), or int8 rows with one fp32 scale per
// row (ActFormat::I8) — the formats the norm / SwiGLU kernels write (elementwise.h).
ActFormat input_format(quant::QuantMode mode);

struct LinearInput {
  const uint16_t* bf16 = nullptr;  // [M, K] when BF16
  const int8_t* i8 = nullptr;      // [M, K] when I8
  const float* scale = nullptr;    // [M] when I8
};

// Which kernels a linear layer runs for M rows (CudaLinear::run has one case per value).
// ExpandWgmma: int4 W*A8 at prefill sizes — the packed weight expanded to int8 in the dequant
// scratch, then the int8 wgmma GEMM of the same scales (run_expanded_int4).
// ExpandTwoLevelWgmma: w4a8-g128 whose group scales are two-level (quant/two_level_scales.h), or
// per-channel w4a8 (multipliers of 1: int4_two_level_factors), at prefill sizes — the int4 weight
// expanded with its multipliers, then the per-channel int8 wgmma GEMM of the channel scales
// (run_expanded_int4_two_level): no per-group fold.
// TwoLevelWgmma: the same layer without the expansion pass — gemm_w4a8_two_level_wgmma converts the
// packed int4 weight with its multipliers in registers, as wgmma's A operand (where the kernel runs,
// below CudaLinear::kTwoLevelExpandMinM rows; PERRY_INT4_TWO_LEVEL_EXPAND=1 keeps
// ExpandTwoLevelWgmma at every M for A/B runs).
enum class LinearPath {
  CublasBf16, SmallM, Gemv, DequantCublas, Wgmma, MmaSync, GemmQuant, WgmmaQuant, ExpandWgmma, ExpandTwoLevelWgmma,
  TwoLevelWgmma, Fp8Wgmma, SmallMWgmma, WeightOnlyWgmma
};
// The choice for a layer of `mode` with K inputs at M rows: the one place it is made, so that
// CudaLinear runs and `perry bench-op --device cuda` times the same kernels. two_level: the
// layer's int4 group scales factor into channel scales and multipliers (two_level_scales). The
// wgmma paths depend on the device (sm_90) and PERRY_NO_WGMMA, the two-level one also on
// PERRY_NO_INT4_TWO_LEVEL (A/B runs: the grouped kernels instead), PERRY_INT4_TWO_LEVEL_EXPAND (the
// expansion pass instead of the register conversion) and PERRY_INT4_TWO_LEVEL_MIN_M (lab: the
// crossover), all read once, at the first call that asks.
// N (the layer's outputs; 0: not known) lets short prompts take the two-level kernel where its
// tiles fill the GPU (gemm_w4a8_two_level_wgmma_fills).
LinearPath linear_path(quant::QuantMode mode, int M, int K, bool two_level = false, int N = 0);
// Weight-only (w8a16 / w4a16 past gemv_quant's rows): LinearPath::WeightOnlyWgmma, one fused GEMM
// (gemm_weight_only_sm90.h) on layers with N >= kWeightOnlyWgmmaMinN outputs or where its split-K
// plan splits the layer (gemm_weight_only_wgmma_workspace_bytes > 0), else gemm_small_m up to
// kGemmSmallMMaxM rows and LinearPath::DequantCublas (dequantize_weight_bf16 + cuBLAS) above.
// PERRY_WEIGHT_ONLY_WGMMA=0 keeps every layer off the fused GEMM (A/B runs), =1 puts every shape the
// kernel accepts on it (lab); PERRY_WEIGHT_ONLY_SMALL_M=0 keeps gemm_small_m at the small M.
constexpr int kWeightOnlyWgmmaMinN = 4096;
// The kernels of a path as logs and bench-op print them ("w8a8:gemm_w8a8_wgmma_tma").
std::string linear_path_name(quant::QuantMode mode, LinearPath path);
// Bytes of the split-K workspace (LinearContext::splitk) that `path` uses for an M × N × K layer of
// `mode` (0: none at this M). Shared by CudaLinear::splitk_bytes and bench-op's sizing.
size_t linear_splitk_bytes(quant::QuantMode mode, LinearPath path, int M, int N, int K);
// LinearPath::ExpandWgmma for a w4a8 / w4a8-g128 layer: expand_int4_weight into `scratch` (N·K
// bytes, 16-byte aligned), then gemm_w8a8_wgmma (w4a8) or gemm_quant_wgmma as w8a8-g128
// (w4a8-g128) with the layer's scales and the split-K workspace when it is large enough
// (expanded_int4_splitk_bytes). Shared by CudaLinear and bench-op so both run the same thing.
void run_expanded_int4(quant::QuantMode mode, const int8_t* x, const float* sa, const void* qweight,
                       const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                       int8_t* scratch, void* splitk, size_t splitk_bytes, uint32_t* tile_flags,
                       cudaStream_t stream);
size_t expanded_int4_splitk_bytes(quant::QuantMode mode, int M, int N, int K);
// LinearPath::ExpandTwoLevelWgmma: expand_int4_weight_two_level (multipliers int8 [N, K/128]) into
// `scratch`, then gemm_w8a8_wgmma with the channel scales (fp32 [N]) and its split-K workspace
// (gemm_w8a8_wgmma_workspace_bytes) when it is large enough. Shared by CudaLinear and bench-op.
void run_expanded_int4_two_level(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                                 const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                                 int K, int8_t* scratch, int32_t* splitk, size_t splitk_bytes, uint32_t* tile_flags,
                                 cudaStream_t stream);

// Per-stream state shared by all linears: cuBLAS handle, scratch for dequantized weights.
struct LinearContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DevicePool* pool = nullptr;
  DeviceBuffer dequant_scratch;  // bf16 [N, K] of the largest weight-only linear used at M > kGemvMaxM
  DeviceBuffer cublas_workspace;
  DeviceBuffer fp8_act, fp8_scale;  // w8a8-fp8: e4m3 [M, K] and fp32 [M] of the layer's input
  // sm_90: the split-K partial sums of gemm_w8a8_wgmma (int32) and gemm_quant_wgmma (grouped W*A8:
  // fp32; per-channel w4a8: int32) at small M (splitk_bytes); sized by the backend before a step,
  // never here (a decode step may be under graph capture). Smaller than a linear needs: that
  // linear runs unsplit (slower; the int32 splits the same outputs, the grouped modes theirs up
  // to fp32 summation order).
  DeviceBuffer splitk;
  // gemm_w8a8_wgmma's split-K tile counters (kGemmW8A8TileFlags uint32): zeroed once when the
  // backend allocates them, left zero by every call.
  DeviceBuffer splitk_flags;
};

class CudaLinear {
 public:
  static constexpr int kGemvMaxM = 8;      // = kGemvQuantMaxM of gemv_quant.h (rows per gemv_quant call)
  static constexpr int kGemvOnlyMaxM = 3;  // gemv_quant up to here, then gemm_small_m
  static constexpr int kSmallMA8MaxM = 32;  // W*A8: gemm_small_m up to here, then the GEMMs
  static constexpr int kSmallMWgmmaMaxM = 32;  // w8a8-g128 / g64 on sm_90: gemm_small_m_wgmma up to here
  // w4a16 on sm_90: gemm_small_m up to here (3-15% faster than the fused GEMM's 32-token tiles at
  // 4-8 rows on four of five shapes, s45 run 2), then gemm_weight_only_wgmma.
  static constexpr int kWeightOnlyInt4SmallMMaxM = 8;
  // W4A8 modes on sm_90 from these M: the int4 weight expanded to int8 once a call, then the int8
  // GEMM (LinearPath::ExpandWgmma); below them the int4 GEMM (expanding in shared memory) is
  // faster. Per channel the int8 kernel is gemm_w8a8_wgmma (2-3x the int4 kernel's speed), so it
  // pays early; w4a8-g128 runs gemm_quant_wgmma, which at M 512 with N 6144 / 10240 has worse
  // wave quantization than the int4 kernel's 192-row tiles (tenth session, run 5).
  static constexpr int kExpandInt4MinM = 257, kExpandInt4G128MinM = 1024;
  // w4a8-g128 with two-level scales from this M: the per-channel int8 GEMM of the channel scales —
  // gemm_w4a8_two_level_wgmma (the int4 codes converted in registers) below kTwoLevelExpandMinM,
  // the expansion pass + gemm_w8a8_wgmma from there. Measured in the model (H100, thirtieth
  // session, Llama-3-8B, bf16 outputs, runs s30-5/8): the register kernel's linears take 7.9 vs
  // 10.6 ms at 512 tokens, 24.5 vs 25.2 at 2048, 48.7 vs 45.3 at 4096 — its epilogue is not
  // overlapped with MMA, which long prompts feel most, while gemm_w8a8_wgmma's bf16 epilogue is
  // cheap. At 3072 tokens (thirty-first session, run s31-1) the prefill took 51.3 ms on the
  // register kernel and 50.7 on the expansion. The thirty-second session made the register
  // kernel's conversion 5-15% faster (s32-3/4): the prefill then took 48.8 vs 50.0 ms at 3072 tokens
  // and 66.6 vs 67.2 at 4096 on it, and bench-op's layers at M 8192 were still 5-7% faster on the
  // expansion, so the switch moved to 6144.
  static constexpr int kExpandTwoLevelMinM = 257, kTwoLevelExpandMinM = 6144;

  // Uploads `parts` (same mode and K) as one layer whose rows are the parts' rows in order. A
  // w4a8-g128 layer whose every part's scales factor (two_level_scales) also uploads the factors.
  static CudaLinear upload(DevicePool& pool, const std::vector<const model::Linear*>& parts, const std::string& name);

  // y[M, N] fp32 = x · Wᵀ (+ bias). x in input_format(mode()).
  void forward(const LinearInput& x, int M, float* y, LinearContext& ctx) const;
  // The same rounded to bf16 (raw bits), where bf16_output(M): the GEMM epilogue writes half the
  // bytes (the gate|up output of a prefill, read once more by SwiGLU, is the largest activation).
  void forward_bf16(const LinearInput& x, int M, uint16_t* y, LinearContext& ctx) const;
  // Whether forward_bf16 can run M rows: the tensor-core GEMMs and cuBLAS without a bias (the
  // small-M kernels and the GEMV write fp32 only).
  bool bf16_output(int M) const;

  // The layer as the fused one-token kernel (gemv_decode.h) sees it, and whether it can take it.
  DecodeWeights decode_weights() const;
  bool decode_fusable() const;

  quant::QuantMode mode() const { return mode_; }
  // Whether the layer has two-level int4 scale factors on the GPU (w4a8-g128's, or per-channel
  // w4a8's unit multipliers: int4_two_level_factors).
  bool two_level() const { return multipliers_.get() != nullptr; }
  ActFormat input_format() const { return cuda::input_format(mode_); }
  int rows() const { return n_; }
  int cols() const { return k_; }
  size_t weight_bytes() const { return weight_bytes_; }
  std::string kernel_name(int M) const;
  // Bytes of the bf16 scratch a weight-only layer needs above the small-M range (0 otherwise):
  // the backend allocates it once, so no allocation happens inside a recorded CUDA graph.
  // W4A8 modes: the int8 expansion of the weight (LinearPath::ExpandWgmma), N·K bytes.
  size_t dequant_scratch_bytes() const {
    if (!quant::is_quantized(mode_) || fp8()) return 0;
    // Weight-only: none when the fused kernel takes the layer's longest prefill (N >= 4096: it takes
    // every M), e.g. ~1 GB less on Llama-3-8B, whose lm_head's bf16 copy was the largest. Narrower
    // layers take it only at the M where it splits; at 2^20 rows nothing splits.
    if (input_format() == ActFormat::BF16)
      return linear_path(mode_, 1 << 20, k_, false, n_) == LinearPath::WeightOnlyWgmma ? 0 : size_t(n_) * size_t(k_) * 2;
    // int4: the expansion (LinearPath::ExpandWgmma / ExpandTwoLevelWgmma), unless the two-level
    // register kernel takes every M an expansion would (it needs no scratch).
    if (bits_ == 4 && two_level() &&
        linear_path(mode_, kExpandInt4G128MinM, k_, true, n_) == LinearPath::TwoLevelWgmma &&
        linear_path(mode_, 1 << 20, k_, true, n_) == LinearPath::TwoLevelWgmma)
      return 0;
    return bits_ == 4 ? size_t(n_) * size_t(k_) : 0;
  }
  // w8a8-fp8: bytes of the e4m3 copy of M input rows (the backend allocates LinearContext::fp8_act
  // with its other scratch, outside any graph capture; fp8_scale takes 4 bytes a row).
  size_t fp8_act_bytes(int M) const { return fp8() ? size_t(M) * size_t(k_) : 0; }
  // Bytes of LinearContext::splitk that M rows use (0: no split-K at this M).
  size_t splitk_bytes(int M) const;

 private:
  using Path = LinearPath;
  Path path(int M) const { return linear_path(mode_, M, k_, two_level(), n_); }
  void run(const LinearInput& x, int M, void* y, DType out, LinearContext& ctx) const;
  bool a8() const { return input_format() == ActFormat::I8; }
  bool fp8() const { return quant::quant_scheme(mode_).fp8; }
  quant::QuantMode mode_ = quant::QuantMode::BF16;
  int n_ = 0, k_ = 0, group_size_ = 0, bits_ = 16;
  size_t weight_bytes_ = 0;
  DeviceBuffer weight_;  // bf16 [N,K] | int8 [N,K] | packed int4 [N, ceil(K/2)]
  DeviceBuffer scales_;  // fp32 [N, n_groups]
  DeviceBuffer channel_scales_, multipliers_;  // two-level int4 scales: fp32 [N], int8 [N, n_groups] (or empty)
  DeviceBuffer bias_;    // fp32 [N] or empty
  std::string name_;
};

// cuBLAS errors as perry::Error naming the call.
void check_cublas(cublasStatus_t s, const char* what);

}  // namespace perry::cuda
