// Host-side queries of the current CUDA device that several kernels' launch code needs.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

// An attribute of the current device. Throws perry::Error when the device cannot be queried.
inline int device_attribute(cudaDeviceAttr attr, const char* what) {
  int dev = 0, v = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&v, attr, dev), what);
  return v;
}
// The opt-in limit of shared memory per block (dynamic + static).
inline int max_smem_per_block_optin() {
  return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(shared memory per block)");
}
inline int compute_capability_major() {
  return device_attribute(cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(compute capability)");
}

// Streaming multiprocessors (for grid sizing).
inline int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(SM count)"); }

}  // namespace perry::cuda
