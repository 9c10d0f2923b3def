// Shared by the CUDA kernel tests: device detection (tests skip honestly without a GPU), a tiny
// RAII device buffer, and fresh random data (never zeros).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/cuda/gemm_w8a8.h"

namespace perry::cuda::testing {
namespace pc = perry::cuda;

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && pc::gemm_w8a8_supported();
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device with sm_80+: CUDA kernel tests skipped"

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

inline std::vector<int8_t> rand_i8(size_t n, std::mt19937& g) {
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = int8_t(d(g));
  return v;
}
inline std::vector<float> rand_f(size_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace perry::cuda::testing

using perry::cuda::testing::Dev;
