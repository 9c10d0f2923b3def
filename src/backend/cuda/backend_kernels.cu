#include "backend/cuda/backend_kernels.h"

#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

namespace {
__global__ void broadcast_rows_kernel(const float* __restrict__ bias, long long total, int N, float* __restrict__ y) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
    y[i] = bias[i % N];
}
}  // namespace

void broadcast_rows(const float* bias, int M, int N, float* y, cudaStream_t stream) {
  const long long total = (long long)M * N;
  const int threads = 256;
  const int blocks = int(std::min<long long>((total + threads - 1) / threads, 4096));
  broadcast_rows_kernel<<<blocks, threads, 0, stream>>>(bias, total, N, y);
  check_launch("broadcast_rows");
}

}  // namespace perry::cuda
