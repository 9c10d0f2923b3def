// Batched decode and short prompts on sm_90a (H100/H200): gemm_small_m_wgmma, a W*A8 linear for
// M = 1..64 token rows whose only job is to stream the int8 weights at HBM speed
// (src/kernels/cuda/gemm_small_m_sm90.cu; design and measurements in docs/cuda-gemm-w8a8-sm90.md,
// "Forty-first session").
//
// The weights are wgmma's A operand (128 output channels a tile, two m64 halves), the activations
// its B operand (8, 16, 32 or 64 token columns: M rounded up), both brought by TMA into a ring of
// stages of 128 k; one producer warp issues the copies — the weight boxes before waiting for the
// previous kernel of the stream (programmatic dependent launch: the weights depend on nothing it
// writes), the activation boxes after. The grid is one CTA an SM; the (tile, k-stage) iterations
// are divided evenly over the CTAs (stream-K), so every SM streams the same bytes whatever N and K;
// a tile shared by several CTAs is finished by the last to arrive, which adds the others' partial
// sums from the workspace in CTA order (deterministic; exact int32 per channel).
//
//   x int8 [M, K] row-major, sa fp32 [M]; qweight int8 [N, K]; scales fp32 [N, G] (G = 1 per
//   channel, ceil(K / group) for w8a8-g128 / g64); bias fp32 [N] or null.
//   per channel, out F32 / BF16: y[m, n] = float(acc)·(sa[m]·sw[n]) + bias[n] — gemm_w8a8_wgmma's
//     expression on the same exact int32 acc, so its outputs are that kernel's bits;
//   grouped: facc = Σ_g fmaf(float(acc_g), sw[n, g], ·) in group order within each CTA's share,
//     the shares added in CTA order; y = fmaf(facc, sa[m], bias[n]);
//   out = I32 (per channel only): acc itself, y [M, N] (sa, scales and bias not read).
// Requirements (checked, perry::Error): an sm_90 device with the sm_90a code built; mode w8a8,
// w8a8-g128 or w8a8-g64; 1 <= M <= 64; N >= 1; K a positive multiple of 16 (the TMA row stride),
// at most 65536; x, qweight 16-byte aligned; sa / scales / bias 4-byte aligned; y aligned to its
// element. Stream-K needs a workspace of gemm_small_m_wgmma_workspace_bytes(M, N, K) bytes (16-byte
// aligned) and tile_flags (kGemmW8A8TileFlags uint32, zeroed once by the caller; every call leaves
// them zero — the buffer the other sm_90 GEMMs' split-K uses; calls sharing it must not run
// concurrently); without them each CTA takes whole tiles (slower where the tiles are few).
// Launched programmatically dependent on the previous kernel of `stream` (pdl.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "quant/quant.h"

namespace perry::cuda {

bool gemm_small_m_wgmma_supported();                      // an sm_90 device, sm_90a code present
bool gemm_small_m_wgmma_mode(quant::QuantMode mode);      // w8a8, w8a8-g128, w8a8-g64
size_t gemm_small_m_wgmma_workspace_bytes(int M, int N, int K);
void gemm_small_m_wgmma(quant::QuantMode mode, const int8_t* x, const float* sa, const int8_t* qweight,
                        const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                        cudaStream_t stream, void* workspace, size_t workspace_bytes, uint32_t* tile_flags);
// w4a8-g128 with two-level scales and per-channel w4a8 (multipliers of 1), as
// gemm_w4a8_two_level_wgmma takes them (gemm_w4a8_two_level.h: packed int4 [N, K/2], multipliers
// int8 [N, K/128], channel scales fp32 [N]): the packed tile [128 rows × 64 B] by TMA with the
// 64-byte swizzle, the codes q·m built in registers and fed to wgmma as its A operand; y =
// float(acc)·(sa[m]·c[n]) + bias[n], that kernel's bits (I32: acc). K a multiple of 128; the
// other requirements and the workspace as above.
void gemm_small_m_wgmma_two_level(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                                  const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                                  int K, cudaStream_t stream, void* workspace, size_t workspace_bytes,
                                  uint32_t* tile_flags);
constexpr int kGemmSmallMWgmmaMaxM = 64;

}  // namespace perry::cuda
