// CUDA quantized linear layers on the canonical weight format of src/quant/quant.h (device copies
// byte-identical to QuantizedWeight::qweight / ::scales):
//   qweight int8 [N, K] row-major, or int4 packed [N, ceil(K/2)] (low nibble = even k);
//   scales  fp32 [N, G], G = 1 (per channel) or ceil(K / group_size).
// The mode (perry::quant::QuantMode) fixes bits, group size and activation type; only the enum is
// used here (no link dependency on the quant library).
// All pointers are device pointers, all calls asynchronous on `stream`; bad arguments and launch
// failures throw perry::Error naming the kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "quant/quant.h"

namespace perry::cuda {

using quant::QuantMode;

// What a quantized mode means for the kernels; throws perry::Error for the float modes.
struct QuantModeBits {
  int bits;          // 8 or 4
  int group_size;    // 0 = one scale per output channel, else 128 or 64
  bool a8;           // int8 per-token activations (W*A8); false: bf16 activations (W*A16)
  const char* name;  // "w8a8-g128", ...
};
QuantModeBits quant_mode_bits(QuantMode mode);

// Small-M linear (batched decode): y[m, n] = Σ_k x[m, k]·w[n, k] in the mode's math, M = 1..8.
// Every weight byte is read once for all M rows (16-byte streaming loads).
//   W*A8 modes (w8a8, w8a8-g128, w8a8-g64, w4a8, w4a8-g128): x int8 [M, K], sa fp32 [M] (the
//     per-token scales of quantize_per_token);
//       per channel: y = float(Σ_k x·w)·sw[n]·sa[m] (+ bias[n]), the int32 sum exact;
//       grouped:     y = sa[m]·Σ_g sw[n,g]·float(Σ_{k∈g} x·w) (+ bias[n]).
//   w8a16, w4a16: x bf16 [M, K] (raw uint16 bits), sa ignored (may be null);
//       y = Σ_g sw[n,g]·Σ_{k∈g} float(x)·float(w) (+ bias[n]), fp32 math.
// y fp32 [M, N] row-major; bias fp32 [N] or null.
// Requirements (checked): 1 <= M <= 8, N >= 1, 1 <= K <= 65536 (any K, odd included), quantized
// mode, non-null x / qweight / scales / y (and sa for W*A8).
// Speed: the 16-byte vector path needs x, qweight 16-byte aligned (cudaMalloc gives 256) and the
// row strides multiples of 16 bytes: K % 16 == 0 (int8 weights with int8 x), K % 32 == 0 (int4),
// K % 8 == 0 (bf16 x). Other shapes run a byte-wise path: correct, several times slower.
void gemv_quant(QuantMode mode, const void* x, const float* sa, const void* qweight,
                const float* scales, const float* bias, float* y, int M, int N, int K,
                cudaStream_t stream);
constexpr int kGemvQuantMaxM = 8;

// Weight-streaming small-M linear on tensor cores (src/kernels/cuda/gemm_small_m.cu), M = 1..64
// (batched decode, short prompts): every quantized mode, the same arguments, math and output as
// gemv_quant above (y fp32 [M, N]; per channel W*A8: y = float(Σ x·w)·sw[n]·sa[m] (+bias[n]);
// grouped: y = sa[m]·Σ_g sw[n,g]·float(Σ_{k∈g} x·w) (+bias); w8a16 / w4a16:
// y = Σ_g sw[n,g]·Σ_{k∈g} float(x)·float(w) (+bias), fp32 accumulation in the tensor cores).
// Weights are the mma A operand (16 channels per warp), activations the B operand (8 tokens per
// n8 tile: M is padded to 8, not 128), weights loaded straight from global memory into
// fragments; split-K over blockIdx.y with fp32 atomicAdd into y when N is too small to fill the
// GPU (then y is zeroed first on `stream` and the summation order varies run to run).
// Requirements (checked): 1 <= M <= 64, N >= 1, 1 <= K <= 65536, quantized mode, non-null x /
// qweight / scales / y (and sa for W*A8), scales / sa / bias / y 4-byte aligned.
// Fast path: K % gemm_small_m_k_multiple(mode) == 0 (16 for int8 weights, 32 for int4) and x,
// qweight 16-byte aligned; otherwise it runs gemv_quant in blocks of 8 rows (correct, slower).
// y must not alias x, qweight, scales or bias.
void gemm_small_m(QuantMode mode, const void* x, const float* sa, const void* qweight,
                  const float* scales, const float* bias, float* y, int M, int N, int K,
                  cudaStream_t stream);
int gemm_small_m_k_multiple(QuantMode mode);
constexpr int kGemmSmallMMaxM = 64;

// bf16 weights for the float modes: y[m, n] = Σ_k float(x[m, k])·float(w[n, k]) (+ bias[n]), x bf16
// [M, K], w bf16 [N, K] (raw uint16 bits, row-major), y fp32 [M, N], M = 1..64; bf16 mma.sync
// m16n8k16 with fp32 accumulation, the same streaming scheme as gemm_small_m.
// Requirements (checked): 1 <= M <= 64, N >= 1, 1 <= K <= 65536, non-null x / w / y, x and w
// 2-byte, y and bias 4-byte aligned. Fast path: K % 8 == 0 and x, w 16-byte aligned; otherwise
// a simple one-warp-per-channel kernel (correct, slow).
void gemm_small_m_bf16(const uint16_t* x, const uint16_t* w, const float* bias, float* y, int M,
                       int N, int K, cudaStream_t stream);

// M > 1 W*A8 linear on int8 tensor cores (mma.sync m16n8k32) for the grouped and int4 modes
// (w8a8-g128, w8a8-g64, w4a8, w4a8-g128; plain w8a8 is accepted too and runs the same kernel,
// though gemm_w8a8 is the tuned one for it). int32 accumulators per group, folded into fp32 with
// sw[n, g] at each group boundary; int4 is unpacked to int8 in shared memory.
//   out = F32 / BF16: y[m, n] = sa[m]·Σ_g sw[n,g]·float(acc_g) (+ bias[n]), y [M, N];
//   out = I32: the raw per-group int32 partials, y [M, N, G] (index (m·N + n)·G + g; G = 1 per
//     channel), the layout of perry::kernels::q::ref::int_accumulators; sa, scales, bias ignored.
// Requirements (checked): M, N >= 1; K % 16 == 0 for int8 weights, K % 32 == 0 for int4 (the
// 16-byte cp.async rows); K <= 65536; x, qweight 16-byte aligned; y aligned to its element.
// Other K: run gemv_quant over blocks of 8 rows.
void gemm_quant(QuantMode mode, const int8_t* x, const float* sa, const void* qweight,
                const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                cudaStream_t stream);

// Weight-only modes at larger M: out[n, k] = bf16_rne(float(q[n, k])·scales[n, g(k)]) (bit-exact
// with perry::f32_to_bf16(q·scale) on the host), for a cuBLAS bf16 GEMM. bits 8 or 4 (canonical
// packing), group_size 0 (per channel) or >= 1 (G = ceil(K / group_size)). out bf16 [N, K].
void dequantize_weight_bf16(const void* qweight, const float* scales, int bits, int group_size,
                            int N, int K, uint16_t* out_bf16, cudaStream_t stream);

// W4A8 at prefill sizes: the canonical packed int4 weight [N, K/2] (low nibble = even k, two's
// complement) as int8 [N, K], sign-extended, so the int8 wgmma GEMMs run it with the mode's own
// scales (the same integer products: bit for bit what the int4 GEMM computes). K % 32 == 0;
// qweight and out 16-byte aligned.
void expand_int4_weight(const void* qweight, int N, int K, int8_t* out, cudaStream_t stream);

}  // namespace perry::cuda
