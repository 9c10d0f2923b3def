// Weight-only linears on sm_90a (H100/H200): gemm_weight_only_wgmma, the w8a16 / w4a16 linear at
// M >= 4 token rows (batched decode and prefill) as one kernel — the int8 / int4 codes are turned into their bf16 values inside
// the GEMM, in registers, and fed to wgmma as its A operand (src/kernels/cuda/
// gemm_weight_only_sm90.cu). It replaces dequantize_weight_bf16 + a cuBLAS bf16 GEMM, whose pass
// over the whole weight made the weight-only modes 0.3-0.6x plain bf16 cuBLAS.
//
// Compiled for sm_90a only. First GPU run s43 (H100): test_cuda_weight_only_wgmma 4/4; CudaLinear's
// choice (linear_path, LinearPath::WeightOnlyWgmma) takes it for layers with N >= 4096 and for the
// narrower ones at the M where its split-K plan splits (s45).
//
//   y[m, n] = Σ_k x[m, k]·wdq[n, k] (+ bias[n]), fp32 accumulation, out F32 or BF16 (rn);
//   wdq[n, k] = bf16_rn(float(q[n, k])·scales[n, g(k)]) — dequantize_weight_bf16's values bit for
//   bit, so the outputs are dequantize + cuBLAS's up to the order of the fp32 sums.
//   x bf16 [M, K] (raw uint16 bits, row-major); qweight int8 [N, K] or packed int4 [N, K/2] (low
//   nibble = even k, two's complement); scales fp32 [N, G], G = 1 (group_size 0, per channel) or
//   ceil(K / group_size); bias fp32 [N] or null (either output); y [M, N] row-major.
// Requirements (checked, perry::Error): an sm_90 device with the sm_90a code built; bits 8 or 4;
// M, N >= 1; K a positive multiple of 64 (one 64-k stage), at most 65536; group_size 0 or 64·2^i
// (64, 128, 256, ...: a stage never straddles a group); x and qweight 16-byte aligned; scales and
// bias 4-byte aligned; y aligned to its element; out F32 or BF16.
// gemm_weight_only_wgmma_accepts(...) says whether a call with those values would be taken
// (everything but the pointers), for callers that fall back to the two-step path otherwise.
// Launched with programmatic dependent launch (pdl.cuh): the first code tiles are fetched before
// the kernel waits for the one before it.
// Environment (read per call; lab and tests): PERRY_WEIGHT_ONLY_BN=32|64|128|256 forces the tile
// width (by default 32 up to 32 rows, 64 up to 64, then 128 or 256 by the waves).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace perry::cuda {

bool gemm_weight_only_wgmma_supported();  // an sm_90 device, sm_90a code present
bool gemm_weight_only_wgmma_accepts(int bits, int group_size, int M, int N, int K, DType out);
// Split-K (short prompts on layers of few 128-row weight tiles): the fp32 slices go to `workspace`
// when it holds gemm_weight_only_wgmma_workspace_bytes(M, N, K) (0: no split at this shape); with
// less (or none) the call runs unsplit. PERRY_WEIGHT_ONLY_SPLITK=0 / =n: off / n splits (lab, tests).
size_t gemm_weight_only_wgmma_workspace_bytes(int M, int N, int K);
void gemm_weight_only_wgmma(const uint16_t* x, const void* qweight, const float* scales, int bits, int group_size,
                            const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream,
                            float* workspace = nullptr, size_t workspace_bytes = 0);

}  // namespace perry::cuda
