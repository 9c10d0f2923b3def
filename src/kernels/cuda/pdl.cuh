// Programmatic dependent launch (Hopper, sm_90+): a kernel launched with pdl::launch may start
// while the previous kernel on the stream is still running; it must call pdl::wait() before it
// reads anything the previous kernels wrote or writes anything they may still read. Work that
// depends on neither — prefetching weights into L2 — goes before the wait, so a decode step's
// small kernels overlap their launch and their weight fetch with the kernel before them.
//
// Rules every kernel launched with pdl::launch follows:
//   * pdl::wait() in every thread before any dependent global read or any global write, and
//     before any early return (so the grid cannot complete before its predecessor has: the
//     ordering stays transitive along the stream);
//   * pdl::launch_dependents() after the wait (the next kernel may then be scheduled; placing it
//     after the wait keeps at most two grids of a chain resident at once). Triggering early in
//     the decode GEMVs was measured and lost (s15-run3: the next kernel's weight copies compete
//     with the running one's on HBM). Two deliberate exceptions trigger first, so three grids
//     may be resident: attention_decode's combine kernel (its successor, the o projection,
//     streams its weights during attention, when HBM is idle: w8a8 decode +4.6%, s19-run1), and,
//     lab only, lab_boundary (backend_kernels.h).
// On older GPUs, with PERRY_NO_PDL=1 in the environment, or in device code for sm < 90, launches
// are ordinary stream-ordered launches and wait / launch_dependents compile to nothing.
// CUDA graph capture keeps the programmatic edges (CUDA >= 12.3).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "core/env.h"
#include "kernels/cuda/cuda_error.h"

namespace perry::cuda::pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device use the programmatic-serialization attribute.
inline bool enabled() {
  static const bool on = [] {
    if (env_flag("PERRY_NO_PDL")) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), programmatically dependent on the previous
// kernel of the stream when enabled(). Throws perry::Error naming `name` on a launch failure.
template <typename... KArgs, typename... Args>
void launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) throw_cuda(std::string("CUDA kernel ") + name + " failed to launch", e);
}

}  // namespace perry::cuda::pdl
