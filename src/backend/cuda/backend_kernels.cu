#include "backend/cuda/backend_kernels.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/pdl.cuh"

namespace perry::cuda {

namespace {
// The order is the point (lab_boundary): its dependents may launch (and issue their weight
// copies) while this grid still waits, as they would after a real kernel's early trigger.
__global__ void lab_boundary_kernel() {
  pdl::launch_dependents();
  pdl::wait();
}

__global__ void broadcast_rows_kernel(const float* __restrict__ bias, long long total, int N, float* __restrict__ y) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
    y[i] = bias[i % N];
}
// T: float, or uint16_t (bf16 bits, widened exactly); round (float only): each value rounded to
// bf16 first — the values a bf16-output projection would have given.
template <typename T>
__global__ void split_qkv_kernel(const T* __restrict__ qkv, long long total, int Q, int KV, bool round,
                                 float* __restrict__ q, float* __restrict__ k, float* __restrict__ v) {
  const int W = Q + 2 * KV;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const long long m = i / W;
    const int c = int(i - m * W);
    float x;
    if constexpr (std::is_same_v<T, float>) {
      x = qkv[i];
      if (round) x = elementwise_detail::bf16_round(x);
    } else {
      x = __uint_as_float(uint32_t(qkv[i]) << 16);
    }
    if (c < Q) q[m * Q + c] = x;
    else if (c < Q + KV) k[m * KV + (c - Q)] = x;
    else v[m * KV + (c - Q - KV)] = x;
  }
}

template <typename T>
void launch_split_qkv(const T* qkv, int M, int Q, int KV, bool round, float* q, float* k, float* v,
                      cudaStream_t stream) {
  const long long total = (long long)M * (Q + 2 * KV);
  if (total == 0) return;
  const int threads = 256;
  const int blocks = int(std::min<long long>((total + threads - 1) / threads, 8192));
  split_qkv_kernel<<<blocks, threads, 0, stream>>>(qkv, total, Q, KV, round, q, k, v);
  check_launch("split_qkv");
}
}  // namespace

void split_qkv(const float* qkv, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream,
               bool round_to_bf16) {
  launch_split_qkv(qkv, M, Q, KV, round_to_bf16, q, k, v, stream);
}
void split_qkv(const uint16_t* qkv_bf16, int M, int Q, int KV, float* q, float* k, float* v, cudaStream_t stream) {
  launch_split_qkv(qkv_bf16, M, Q, KV, false, q, k, v, stream);
}

void broadcast_rows(const float* bias, int M, int N, float* y, cudaStream_t stream) {
  const long long total = (long long)M * N;
  const int threads = 256;
  const int blocks = int(std::min<long long>((total + threads - 1) / threads, 4096));
  broadcast_rows_kernel<<<blocks, threads, 0, stream>>>(bias, total, N, y);
  check_launch("broadcast_rows");
}

void lab_boundary(int blocks, cudaStream_t stream) {
  pdl::launch("lab_boundary", lab_boundary_kernel, dim3(unsigned(std::max(blocks, 1))), dim3(32), 0, stream);
}

}  // namespace perry::cuda
