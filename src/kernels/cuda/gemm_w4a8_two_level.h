// w4a8-g128 with two-level group scales (quant/two_level_scales.h) at prefill sizes on sm_90a
// (H100/H200), without expanding the weight: gemm_w4a8_two_level_wgmma reads the packed int4
// weight and its multipliers, builds the int8 codes q4·m of the channel scale in registers and
// feeds them to wgmma as its A operand (src/kernels/cuda/gemm_w4a8_two_level_sm90.cu; design and
// measurements in docs/cuda-gemm-w8a8-sm90.md, "Thirtieth session").
//
//   x int8 [M, K] row-major, sa fp32 [M] (per-token scales);
//   qweight: the canonical packed int4 [N, K/2] (low nibble = even k, two's complement, values in
//     [-7, 7] as QuantizedWeight::validate keeps them; the conversion is exact for any q·m >= −128);
//     multipliers int8 [N, K/128] in [0, 18]; channel_scales fp32 [N]; bias fp32 [N] or null;
//   out = F32 / BF16: y[m, n] = float(acc)·(sa[m]·c[n]) + bias[n] with acc = Σ_k x[m,k]·q4[n,k]·m[n,k/128]
//     (exact int32) — the expression of gemm_w8a8_wgmma on the expanded weight, so the outputs
//     are that path's bits;
//   out = I32: acc itself, y [M, N] (sa, channel scales and bias are not read).
// Requirements (checked, perry::Error): an sm_90 device; M, N >= 1; K a positive multiple of 128,
// at most 65536; x, qweight 16-byte aligned; y aligned to its element; sa / channel scales / bias
// 4-byte aligned. Asynchronous on `stream`.
// Split-K: with a workspace of at least gemm_w4a8_two_level_wgmma_workspace_bytes(M, N, K) bytes
// (16-byte aligned) and tile_flags (kGemmW8A8TileFlags uint32 of gemm_w8a8.h, zeroed by the caller
// once; every call leaves them zero — the buffer gemm_w8a8_wgmma's split-K uses), shapes whose
// tiles leave SMs idle (all of them, or the last partial wave's) run split over K into
// gemm_w4a8_two_level_wgmma_splits(M, N, K) k-ranges;
// the tile's last split adds the others' int32 sums inside the kernel, so the outputs are the
// unsplit kernel's bit for bit. Without them the kernel runs unsplit. Calls that share tile_flags
// must not run concurrently (one stream). PERRY_TWO_LEVEL_SPLITK=0|N: off / N splits (read per call);
// PERRY_TWO_LEVEL_SPLIT_TAIL=0: no tail split.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace perry::cuda {

bool gemm_w4a8_two_level_wgmma_supported();  // true on an sm_90 device with the sm_90a code built
// Whether M × N × K gives the kernel work units (tiles × splits, as planned with a workspace) for
// at least half the SMs (below that, short prompts run faster on the grouped kernels).
bool gemm_w4a8_two_level_wgmma_fills(int M, int N, int K);
// The tokens of the kernel's tiles at M × N (128, 160, 192, 224 or 256: the width whose waves
// take the least time on this device's SMs; PERRY_TWO_LEVEL_BX forces one).
int gemm_w4a8_two_level_wgmma_tile_tokens(int M, int N);
int gemm_w4a8_two_level_wgmma_splits(int M, int N, int K);  // 1: unsplit
// The tiles run whole, over all of K, before the split ones (all of them where unsplit; 0 where
// every tile is split): a tail split keeps the whole waves of tiles and splits the last wave's.
int gemm_w4a8_two_level_wgmma_whole_tiles(int M, int N, int K);
size_t gemm_w4a8_two_level_wgmma_workspace_bytes(int M, int N, int K);  // 0: unsplit
void gemm_w4a8_two_level_wgmma(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                               const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                               int K, cudaStream_t stream, int32_t* workspace = nullptr, size_t workspace_bytes = 0,
                               uint32_t* tile_flags = nullptr);

}  // namespace perry::cuda
