// Small glue kernels the model backend needs between the library kernels (src/kernels/cuda).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace perry::cuda {

// y[m, :] = bias for every row m < M (cuBLAS then accumulates the product on top with beta = 1).
void broadcast_rows(const float* bias, int M, int N, float* y, cudaStream_t stream);

// The fused q|k|v projection's rows [M, Q + 2·KV] split into contiguous q [M, Q], k [M, KV],
// v [M, KV] (what RoPE, the KV append and attention read). One launch. round_to_bf16: each value
// rounded to bf16 (RNE) on the way — the same floats as the bf16 form below on a projection that
// wrote bf16.
void split_qkv(const float* qkv, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream,
               bool round_to_bf16 = false);
void split_qkv(const uint16_t* qkv_bf16, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream);

// Lab only (PERRY_LAB_DECODE_BOUNDARIES): an empty kernel of `blocks` blocks launched with
// programmatic dependent launch — it lets its dependents launch at once, then waits for the kernel
// before it — so that the decode step gains one kernel boundary (one grid completion the next
// kernel waits for) and nothing else. The step's time with and without such kernels after each
// of a layer's five steps measures what a boundary costs (the question a persistent decode kernel
// answers).
void lab_boundary(int blocks, cudaStream_t stream);

}  // namespace perry::cuda
