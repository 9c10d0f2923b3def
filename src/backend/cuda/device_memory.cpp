#include "backend/cuda/device_memory.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)); }

DevicePool::DevicePool(int device) : device_(device) { require_device(device); }

void* DevicePool::allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free allocation error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("out of GPU memory: {} needs {} but only {} of {} are free (perry holds {}); use a smaller model, "
         "a quantized mode (--quant w8a8 / w4a8-g128), a shorter --ctx or fewer parallel sequences",
         what, mib(bytes), mib(free_b), mib(total_b), mib(in_use_));
  }
  if (e != cudaSuccess) throw_cuda("cudaMalloc(" + mib(bytes) + ") for " + what, e);
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void DevicePool::release(void* p, size_t bytes) {
  cudaFree(p);
  in_use_ -= std::min(in_use_, bytes);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  PERRY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void require_device(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    fail("--device cuda: no usable CUDA driver/GPU ({}: {}); run with --device cpu", cudaGetErrorName(e),
         cudaGetErrorString(e));
  if (n == 0) fail("--device cuda: no CUDA GPU found; run with --device cpu");
  if (device < 0 || device >= n) fail("--device cuda:{}: this machine has {} GPU(s)", device, n);
  cudaDeviceProp p{};
  PERRY_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  if (p.major < 8)
    fail("--device cuda: {} is compute capability {}.{}; perry's CUDA kernels need 8.0 or newer (Ampere, Hopper)",
         p.name, p.major, p.minor);
  PERRY_CUDA_CHECK(cudaSetDevice(device));
}

std::string describe_device(int device) {
  require_device(device);
  cudaDeviceProp p{};
  PERRY_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  size_t free_b = 0, total_b = 0;
  PERRY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB, {:.1f} GiB free, L2 {} MiB), driver CUDA {}.{}, runtime {}.{}",
                     p.name, p.major, p.minor, p.multiProcessorCount, double(total_b) / (1 << 30),
                     double(free_b) / (1 << 30), p.l2CacheSize >> 20, drv / 1000, (drv % 1000) / 10, rt / 1000,
                     (rt % 1000) / 10);
}

}  // namespace perry::cuda
