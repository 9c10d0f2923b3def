#include "backend/cuda/backend_kernels.h"

#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

namespace {
__global__ void broadcast_rows_kernel(const float* __restrict__ bias, long long total, int N, float* __restrict__ y) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
    y[i] = bias[i % N];
}
__global__ void split_qkv_kernel(const float* __restrict__ qkv, long long total, int Q, int KV, float* __restrict__ q,
                                 float* __restrict__ k, float* __restrict__ v) {
  const int W = Q + 2 * KV;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const long long m = i / W;
    const int c = int(i - m * W);
    const float x = qkv[i];
    if (c < Q) q[m * Q + c] = x;
    else if (c < Q + KV) k[m * KV + (c - Q)] = x;
    else v[m * KV + (c - Q - KV)] = x;
  }
}
}  // namespace

void split_qkv(const float* qkv, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream) {
  const long long total = (long long)M * (Q + 2 * KV);
  const int threads = 256;
  const int blocks = int(std::min<long long>((total + threads - 1) / threads, 8192));
  split_qkv_kernel<<<blocks, threads, 0, stream>>>(qkv, total, Q, KV, q, k, v);
  check_launch("split_qkv");
}

void broadcast_rows(const float* bias, int M, int N, float* y, cudaStream_t stream) {
  const long long total = (long long)M * N;
  const int threads = 256;
  const int blocks = int(std::min<long long>((total + threads - 1) / threads, 4096));
  broadcast_rows_kernel<<<blocks, threads, 0, stream>>>(bias, total, N, y);
  check_launch("broadcast_rows");
}

}  // namespace perry::cuda
