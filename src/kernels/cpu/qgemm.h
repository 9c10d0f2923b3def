// Internal interface of the quantized linear kernels (used by quant::QuantizedLinear, the tests
// and the kernel lab; model code goes through QuantizedLinear).
//
// Packed integer layout (W8A8 / W4A8, shared by the AVX-512 and AVX2 kernels):
//   columns in panels of 16; per panel, K in "steps" of 4 consecutive k. Step s of panel p is 64
//   bytes: lane c (output column 16p+c) holds w[n][4s..4s+3] — one 32-bit lane of `vpdpbusd`.
//   int4: two steps share one 64-byte block: low nibble = step 2t, high nibble = step 2t+1, each
//   stored as w+8 in [1, 15] so unpacking is and/shift/sub-8 (no sign extension).
//   Padding (k >= K, n >= N) is 0. Per (panel, group) 16 scales; int8 only: 16 int32 corrections
//   128·Σw (the int8 kernels feed the activations to vpdpbusd as u8 = q+128; the int4 ones feed
//   the stored nibbles w+8 as the unsigned operand and correct with 8·Σq from the activations).
// Packed weight-only layout (W8A16 / W4A16, `vdpbf16ps`):
//   panels of 16 columns; steps of 2 consecutive k; step s of panel p is 32 bytes int8 with
//   byte 2c+j = w[16p+c][2s+j] (int4: 16 bytes, byte c = (w[.][2s]+8) | (w[.][2s+1]+8) << 4).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/aligned_buffer.h"
#include "kernels/cpu/float_linear.h"
#include "quant/quant.h"

namespace perry::kernels::q {

constexpr int kPanel = 16;  // output columns per panel (one zmm of int32/fp32)

struct PackedInt {
  int64_t N = 0, K = 0;
  int bits = 8;
  int G = 1;                 // groups along K (1 = per channel)
  int64_t steps = 0;         // 4-k steps (K rounded up to 4, or 8 for int4)
  int64_t group_steps = 0;   // steps per group
  int64_t n_panels = 0;
  int64_t panel_bytes = 0;   // steps*64 (int8) or steps*32 (int4)
  AlignedBuffer<uint8_t> data;       // [panel][panel_bytes]
  AlignedBuffer<float> scales;       // [panel][G][16]
  AlignedBuffer<int32_t> wsum128;    // [panel][G][16], int8 weights only (empty for int4)
  int64_t lda() const { return steps * 4; }  // row stride of the quantized activations
};
PackedInt pack_int(const quant::QuantizedWeight& w);

struct PackedWo {
  int64_t N = 0, K = 0;
  int bits = 8;
  int G = 1;
  int64_t steps = 0;        // 2-k steps
  int64_t group_steps = 0;  // steps per group (64 for groups of 128)
  int64_t n_panels = 0;
  int64_t step_bytes = 0;   // 32 (int8) or 16 (int4)
  int64_t panel_bytes = 0;
  AlignedBuffer<uint8_t> data;
  AlignedBuffer<float> scales;  // [panel][G][16]
  int64_t ldx() const { return steps * 2; }  // row stride (bf16 elements) of the activations
};
PackedWo pack_wo(const quant::QuantizedWeight& w);
// Exact inverses of the packers (QuantizedLinear keeps only the packed copy and rebuilds the
// canonical form on demand, so a layer costs its weight bytes once, not twice).
quant::QuantizedWeight unpack_int(const PackedInt& p, quant::QuantMode mode);
quant::QuantizedWeight unpack_wo(const PackedWo& p, quant::QuantMode mode);

// w8a8-fp8 on the CPU: the comparison path of the GPU's fp8 tensor cores, emulated (no CPU here
// multiplies fp8). The e4m3 weight codes are decoded once to bf16 — exact, every e4m3 value is
// a bf16 value — and left unscaled; the activations are quantized per token by
// quant::quantize_row_fp8_ref and decoded to their unscaled values too. The float GEMM of the
// float modes (FloatLinear: oneDNN / OpenBLAS / our GEMV) then multiplies exactly (two 4-bit
// significands) and accumulates in fp32, and the scales come after the dot product as on the
// GPU: y = fma(Σ_k xq·wq, sa[m]·sw[n], bias). Only the fp32 summation order differs.
struct PackedFp8 {
  int64_t N = 0, K = 0;
  AlignedBuffer<uint16_t> w;                   // [N, K] bf16: the decoded e4m3 codes
  AlignedBuffer<float> scales;                 // [N]
  std::unique_ptr<kernels::FloatLinear> gemm;  // reads w (a heap buffer: moving keeps it valid)
};
PackedFp8 pack_fp8(const quant::QuantizedWeight& w);
quant::QuantizedWeight unpack_fp8(const PackedFp8& p);  // exact inverse (finite codes only)
// xq [M, K] = the e4m3 values of each row quantized by quantize_row_fp8_ref, sa [M] its scales.
void quantize_rows_fp8(const float* x, int64_t M, int64_t K, float* xq, float* sa);
void fp8_forward(const PackedFp8& p, const float* xq, const float* sa, int64_t M, float* y, const float* bias);
// e.g. "w8a8-fp8:float_emulation/onednn-matmul-bf16" (the float GEMM that runs M rows).
std::string fp8_kernel_name(int64_t N, int64_t K, int64_t M);

// Which loop structure: the matrix-vector kernel (all rows at once, weights streamed once,
// threads split N) or the cache-blocked GEMM (register tiles of several rows).
enum class Path { Gemv, Gemm };
constexpr int64_t kGemvMaxRows = 4;  // the GEMV kernel handles at most this many rows per call

// ---- scalar references (operate on the canonical weight; they are the oracles) ----
namespace ref {
// y = fma(Σ_g fma(acc_g, sw[n,g]), sa[m], bias) with acc_g the exact int32 group sums.
void int_forward(const quant::QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias);
// acc[m][n][g] = Σ_{k in group g} q[m][k]·w[n][k] (int32).
void int_accumulators(const quant::QuantizedWeight& w, const int8_t* q, int64_t M, int32_t* acc);
// y = Σ_g fma(Σ_k bf16(x[m][k])·w[n][k], s[n,g]) + bias (float accumulation, k in order).
void wo_forward(const quant::QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias);
// w8a8-fp8: y = fma(Σ_k e4m3(x)[m][k]·e4m3(w)[n][k], sa[m]·sw[n], bias) (fp32 sum, k in order).
void fp8_forward(const quant::QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias);
}  // namespace ref

// ---- AVX-512 (F/BW/VL/DQ + VNNI; BF16 for the weight-only kernels) ----
namespace avx512 {
// q[m][k] = quantized x + 128 (u8), rows padded with 128 up to ldq; scales[m] = amax/127.
void quantize_rows_u8(const float* x, int64_t M, int64_t K, uint8_t* q, int64_t ldq, float* scales);
// q[m][k] = quantized x (s8), rows padded with 0 up to ldq; scales[m] = amax/127; and
// gsum8[m][g] = 8·Σ_{k in group g} q[m][k] for groups of `group_len` (a multiple of 16) along K.
void quantize_rows_s8(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* scales,
                      int64_t group_len, int G, int32_t* gsum8);

// The activations of M rows as the kernels for p read them:
//   int8 weights: a[m] = q+128 (u8, quantize_rows_u8), act_corr unused (may be null);
//   int4 weights: a[m] = q as s8 bytes (quantize_rows_s8), act_corr[m][G] = 8·Σq per group.
// The int4 kernels multiply the stored nibbles (w+8, unsigned) by the signed activations: no
// per-byte "-8" and no per-column correction to read, so the GEMV streams only weights + scales.
struct ActBuffers {
  uint8_t* a;         // [M][p.lda()]
  float* sa;          // [M]
  int32_t* act_corr;  // [M][p.G] (int4 weights)
};
void quantize_activations(const PackedInt& p, const float* x, int64_t M, const ActBuffers& out);
void int_forward(const PackedInt& p, const uint8_t* a, const int32_t* act_corr, int64_t M, const float* sa,
                 float* y, const float* bias, Path path);
// Test hook: the same loops with an epilogue that stores the int32 group sums [M][N][G].
void int_accumulators(const PackedInt& p, const uint8_t* a, const int32_t* act_corr, int64_t M, int32_t* acc,
                      Path path);
// Several layers on the same activations (q|k|v, gate|up: same bits, G, K — checked): y[i] =
// x·W_iᵀ (+ bias[i], may be null). With Path::Gemv all their panels are split across the threads
// in one parallel region (one wake-up and one join instead of one per layer); Gemm runs each.
void int_forward_many(const PackedInt* const* p, int n, const uint8_t* a, const int32_t* act_corr, int64_t M,
                      const float* sa, float* const* y, const float* const* bias, Path path);
void to_bf16_rows(const float* x, int64_t M, int64_t K, uint16_t* xb, int64_t ldx);
void wo_forward(const PackedWo& p, const uint16_t* xb, int64_t M, float* y, const float* bias, Path path);
// Reads [p, p+bytes) once with 64-byte loads on the calling thread (memory-bandwidth probe for
// bench-op's "% of memory bound"); returns a checksum so the loads are not optimized away.
uint64_t stream_read(const uint8_t* p, int64_t bytes);
}  // namespace avx512

// ---- AVX2 fallback (sign trick with vpmaddubsw, activations as s8; weight-only in fp32 FMA) ----
namespace avx2 {
void quantize_rows_s8(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* scales);
void int_forward(const PackedInt& p, const int8_t* a, int64_t M, const float* sa, float* y,
                 const float* bias, Path path);
void int_accumulators(const PackedInt& p, const int8_t* a, int64_t M, int32_t* acc, Path path);
// Weight-only: xbf = the activations rounded to bf16, stored as fp32 [M][ldx] (zero-padded).
void wo_forward(const PackedWo& p, const float* xbf, int64_t M, float* y, const float* bias);
}  // namespace avx2

}  // namespace perry::kernels::q
