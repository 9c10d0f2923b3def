// The sm_90a (H100/H200) version of gemm_quant (gemv_quant.h), which CudaLinear runs past its
// small-M kernels (M > 32) there: the W*A8 GEMM with grouped weight scales and/or int4 weights on TMA + wgmma
// (src/kernels/cuda/gemm_quant_sm90.cu,
// design notes in docs/cuda-gemm-w8a8-sm90.md, section "Grouped and int4 modes").
//
// Same contract as gemm_quant: modes w8a8-g128, w8a8-g64, w4a8, w4a8-g128 (and plain w8a8, which
// gemm_w8a8_wgmma runs faster); x int8 [M, K] row-major with per-token scales sa fp32 [M];
// qweight = the canonical QuantizedWeight::qweight (int8 [N, K], or int4 packed [N, K/2] bytes,
// low nibble = even k, two's complement); scales fp32 [N, G] (G = ceil(K / group_size), 1 per
// channel); bias fp32 [N] or null.
//   out = F32 / BF16: y[m, n] = sa[m]·Σ_g sw[n,g]·float(acc_g) (+ bias[n]), y [M, N];
//   out = I32: the raw per-group int32 partials, y [M, N, G] (index (m·N + n)·G + g), the layout
//     of perry::kernels::q::ref::int_accumulators; sa, scales, bias ignored (may be null).
// No weight repacking: the canonical layout is read as is (int4 is expanded in shared memory).
// Requirements (checked, perry::Error otherwise): an sm_90 device; a W*A8 mode; M, N >= 1;
// 1 <= K <= 65536 with K % 16 == 0 (int8 weights) or K % 32 == 0 (int4); x, qweight 16-byte
// aligned; y aligned to its element; sa / scales (and bias when given) 4-byte aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "quant/quant.h"

namespace perry::cuda {

bool gemm_quant_wgmma_supported();  // true on an sm_90 device
void gemm_quant_wgmma(quant::QuantMode mode, const int8_t* x, const float* sa, const void* qweight,
                      const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                      cudaStream_t stream);

// Split-K where the tiles would leave most SMs idle (small M × N): units of (tile, k-range) write
// one slice each of `workspace` (16-byte aligned), which a second kernel adds in order and
// finishes. Grouped modes: each unit folds its groups (with their scales) into fp32 sums, the
// second kernel applies sa[m] and the bias — the same expression summed in another order (not the
// unsplit bits). Per channel (w4a8, w8a8): exact int32 sums, the second kernel applies sw[n],
// sa[m] and the bias — the unsplit outputs bit for bit. The bytes M rows need (0: no split at
// this shape); with a smaller or null workspace the call runs unsplit (except grouped I32 out,
// whose per-group partials need no workspace and split as planned).
// PERRY_GQ_SPLITK=0 turns split-K off, =N forces N splits.
size_t gemm_quant_wgmma_workspace_bytes(quant::QuantMode mode, int M, int N, int K);
void gemm_quant_wgmma(quant::QuantMode mode, const int8_t* x, const float* sa, const void* qweight,
                      const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                      cudaStream_t stream, float* workspace, size_t workspace_bytes);

}  // namespace perry::cuda
