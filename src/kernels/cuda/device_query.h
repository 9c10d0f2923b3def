// Host-side queries of the current CUDA device that several kernels' launch code needs.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

// Streaming multiprocessors of the current device (for grid sizing). Throws perry::Error when
// the device cannot be queried.
inline int sm_count() {
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  return n;
}

}  // namespace perry::cuda
