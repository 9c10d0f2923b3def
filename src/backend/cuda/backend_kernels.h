// Small glue kernels the model backend needs between the library kernels (src/kernels/cuda).
#pragma once
#include <cuda_runtime.h>

namespace perry::cuda {

// y[m, :] = bias for every row m < M (cuBLAS then accumulates the product on top with beta = 1).
void broadcast_rows(const float* bias, int M, int N, float* y, cudaStream_t stream);

// The fused q|k|v projection's rows [M, Q + 2·KV] split into contiguous q [M, Q], k [M, KV],
// v [M, KV] (what RoPE, the KV append and attention read). One launch.
void split_qkv(const float* qkv, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream);

}  // namespace perry::cuda
