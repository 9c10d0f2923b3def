// Error reporting for the CUDA layer: every CUDA failure becomes a perry::Error naming the kernel
// or call. The standalone kernel lab is compiled with plain nvcc on machines that may lack {fmt};
// there a message-compatible perry::Error stands in (the rest of perry needs fmt anyway).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#if __has_include(<fmt/format.h>)
#include "core/error.h"
#else
namespace perry {
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
}  // namespace perry
#endif

namespace perry::cuda {

[[noreturn]] inline void throw_cuda(const std::string& what, cudaError_t e) {
  throw Error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
// Call after a launch: reports launch-configuration errors (and earlier asynchronous ones).
inline void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(std::string("CUDA kernel ") + kernel + " failed to launch", e);
}
inline void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw_cuda(std::string(call), e);
}

}  // namespace perry::cuda

#define PERRY_CUDA_CHECK(call) ::perry::cuda::check_cuda((call), #call)
