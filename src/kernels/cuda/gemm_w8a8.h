// CUDA W8A8 kernels: per-token activation quantization and the int8 tensor-core GEMM with the
// dequantizing epilogue fused (y = acc·sa[m]·sw[n] (+bias[n])).
//
// Layouts follow the canonical CPU format (src/quant/quant.h): X int8 [M,K] row-major, W int8
// [N,K] row-major (one output channel per row), sa fp32 [M], sw fp32 [N], y [M,N] row-major.
// All pointers are device pointers; calls are asynchronous on `stream`. Errors (bad arguments,
// launch failures) are thrown as perry::Error naming the kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace perry::cuda {

// Per-token quantization, the exact rule of perry::quant::quantize_row_ref:
//   amax = max|x|, scale = amax/127, inv = 127/amax, q = clamp(rint_half_even(x*inv), -127, 127);
//   scale = inv = 0 when amax == 0 or not finite / 127/amax overflows; NaN elements give q = 0.
// dX: [M,K] fp32 (in = DType::F32) or bf16 (DType::BF16); dQ int8 [M,K]; dScale fp32 [M].
void quantize_per_token(const void* dX, DType in, int M, int K, int8_t* dQ, float* dScale,
                        cudaStream_t stream);
// The e4m3 form for gemm_fp8_wgmma: scale = amax/448, inv = 448/amax (0 as above), q = the e4m3
// byte of x·inv rounded to nearest even and saturated to ±448 (perry::f32_to_e4m3 on the host).
void quantize_per_token_fp8(const void* dX, DType in, int M, int K, uint8_t* dQ, float* dScale,
                            cudaStream_t stream);

// Y[M,N] = X[M,K] · W[N,K]ᵀ on int8 tensor cores (mma.sync m16n8k32, int32 accumulation), then
//   out = BF16 or F32: y = float(acc)·dSa[m]·dSw[n] (+ dBias[n] when dBias != nullptr);
//   out = I32: the raw accumulators (dSa, dSw, dBias ignored, may be null) — the exactness check.
// Requirements (checked, perry::Error otherwise): M, N, K > 0; K % 16 == 0 (pad X and W with
// zero columns on the host otherwise: zeros add nothing to the dot products); dX and dW 16-byte
// aligned (cudaMalloc gives 256); dY aligned to its element size. M and N are arbitrary
// (tiles are predicated and zero-filled).
void gemm_w8a8(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
               const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream);

// True when the current device can run gemm_w8a8 (int8 mma.sync + cp.async: sm_80 or newer).
bool gemm_w8a8_supported();
// Which kernel gemm_w8a8 runs, for logs and `perry info`.
const char* gemm_w8a8_kernel_name();

}  // namespace perry::cuda

namespace perry::cuda {
// src/kernels/cuda/gemm_w8a8_sm90.cu, docs/cuda-gemm-w8a8-sm90.md: the same contract as
// gemm_w8a8, on sm_90a (CudaLinear's w8a8 kernel there past gemm_small_m): TMA loads into a
// 128-byte-swizzled mbarrier ring, a producer warpgroup and 2 consumer warpgroups issuing wgmma
// m64n256k32 (or n128, or n160 where 160-column tiles give the busiest SM fewer columns),
// cooperative or ping-pong schedule (64-row tiles, or 128-row tiles whose two halves one
// warpgroup issues), persistent grid, fused epilogue.
// Throws perry::Error on other devices. Environment (read per call, for the lab and the tests):
// PERRY_WGMMA_BN=128|256|160 forces the column tile width (160: int8, cooperative, unless
// PERRY_WGMMA_PINGPONG=1|2 forces a ping-pong), PERRY_WGMMA_PINGPONG=0|1|2 the schedule
// (cooperative / ping-pong / ping-pong on 128-row tiles, which a forced width or
// PERRY_WGMMA_PING128=0 rules out unless PERRY_WGMMA_PINGPONG=2 asks for it),
// PERRY_WGMMA_COOP160=0 the default's 160-column tiles off,
// PERRY_WGMMA_SPLITK=0|N split-K off / N splits (at most one CTA a unit),
// PERRY_WGMMA_SPLITK_FIXUP=0 the split-K sums added by a second kernel even with tile flags.
bool gemm_w8a8_wgmma_supported();
// With a workspace of at least gemm_w8a8_wgmma_workspace_bytes(M, N, K) bytes (16-byte aligned),
// shapes whose tiles would leave most SMs idle (small M and N) run split over K into
// gemm_w8a8_wgmma_splits(M, N, K) k-ranges — the same outputs bit for bit (int32 partial sums add
// exactly):
//   * with tile_flags (kGemmW8A8TileFlags uint32, zeroed by the caller once; every call leaves
//     them zero), unless PERRY_WGMMA_SPLITK_FIXUP=0: each tile's split 0 adds the other splits'
//     sums inside the kernel and stores the tile;
//   * otherwise: every split stores its int32 sums into the workspace, then a second kernel adds
//     them and applies the epilogue.
// Without a workspace (or when it returns 0) the kernel runs unsplit. Calls that share tile_flags
// must not run concurrently (one stream).
constexpr int kGemmW8A8TileFlags = 2048;
size_t gemm_w8a8_wgmma_workspace_bytes(int M, int N, int K);
int gemm_w8a8_wgmma_splits(int M, int N, int K);  // 1: unsplit
void gemm_w8a8_wgmma(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
                     const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream,
                     int32_t* workspace, size_t workspace_bytes, uint32_t* tile_flags = nullptr);
void gemm_w8a8_wgmma(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
                     const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream);

// PREPARED, NOT YET RUN ON A GPU — the kernel side of the comparison mode w8a8-fp8 (issue 6): the
// same kernel with e4m3 operands (wgmma m64nNk32 f32.e4m3.e4m3, fp32 accumulators):
// y[m, n] = (Σ_k x[m,k]·w[n,k])·sa[m]·sw[n] (+bias[n]), x and w e4m3 bytes ([M,K], [N,K], K-major,
// the codec of core/dtype.h: f32_to_e4m3 / quantize_per_token_fp8), out BF16 or F32. Same
// shape and alignment rules as gemm_w8a8_wgmma (runs where gemm_w8a8_wgmma_supported()).
void gemm_fp8_wgmma(const uint8_t* dX, const float* dSa, const uint8_t* dW, const float* dSw, const float* dBias,
                    void* dY, DType out, int M, int N, int K, cudaStream_t stream);
}  // namespace perry::cuda
