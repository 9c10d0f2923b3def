// Per-token int8 quantization of activations: one block per row, warp-shuffle absmax, then the
// same rounding as the CPU rule (quantize_row_ref): q = clamp(rint(x * (127/amax))), half-even.
// The rule itself lives in quant_rule.cuh, shared with the fused kernels of elementwise.cu.
// The division and the multiply are plain IEEE fp32 operations (nvcc's default -prec-div=true,
// no fast-math), so the bits match the CPU exactly.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/quant_rule.cuh"

namespace perry::cuda {
namespace {

constexpr int kQuantThreads = 256;

__device__ __forceinline__ float load_elem(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_elem(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// 8 consecutive elements (16 bytes of bf16 or 32 bytes of fp32); caller guarantees alignment.
__device__ __forceinline__ void load8(const float* p, float v[8]) {
  float4 a = reinterpret_cast<const float4*>(p)[0];
  float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float v[8]) {
  uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// The e4m3 form of the rule (quantize_per_token_fp8): scale = amax/448, inv = 448/amax (0 when
// amax is 0 or not finite, or 448/amax overflows), q = cvt.rn.satfinite.e4m3(x·inv) — the host
// codec f32_to_e4m3 of core/dtype.h on the same fp32 product.
__device__ __forceinline__ void per_token_params_fp8(float amax, float& scale, float& inv) {
  inv = amax > 0.0f ? 448.0f / amax : 0.0f;
  scale = amax / 448.0f;
  if (!isfinite(inv) || !isfinite(amax)) inv = scale = 0.0f;
}
__device__ __forceinline__ uint8_t quant_one_fp8(float x, float inv) {
  return uint8_t(__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3));
}

// Q: int8_t (the int8 rule) or uint8_t (e4m3 bytes, the fp8 rule).
template <typename T, typename Q8>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_per_token_kernel(const T* __restrict__ X, int K, bool vec8, Q8* __restrict__ Q,
                              float* __restrict__ scales) {
  constexpr bool kFp8 = std::is_same_v<Q8, uint8_t>;
  auto quant = [](float v, float inv) -> uint8_t {
    if constexpr (kFp8) return quant_one_fp8(v, inv);
    else return uint8_t(quant_one(v, inv));
  };
  const int64_t row = blockIdx.x;
  const T* x = X + row * K;
  Q8* q = Q + row * K;
  float amax = 0.0f;
  // fmaxf ignores a NaN operand, like std::max(amax, NaN) in the CPU rule.
  if (vec8) {
    for (int k = threadIdx.x * 8; k < K; k += kQuantThreads * 8) {
      float v[8];
      load8(x + k, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    }
  } else {
    for (int k = threadIdx.x; k < K; k += kQuantThreads) amax = fmaxf(amax, fabsf(load_elem(x, k)));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  __shared__ float warp_max[kQuantThreads / 32];
  __shared__ float row_inv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    float scale, inv;
    if constexpr (kFp8) per_token_params_fp8(m, scale, inv);
    else per_token_params(m, scale, inv);
    row_inv = inv;
    scales[row] = scale;
  }
  __syncthreads();
  const float inv = row_inv;
  if (vec8) {
    for (int k = threadIdx.x * 8; k < K; k += kQuantThreads * 8) {
      float v[8];
      load8(x + k, v);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) lo |= uint32_t(quant(v[i], inv)) << (8 * i);
#pragma unroll
      for (int i = 0; i < 4; ++i) hi |= uint32_t(quant(v[4 + i], inv)) << (8 * i);
      *reinterpret_cast<uint2*>(q + k) = make_uint2(lo, hi);
    }
  } else {
    for (int k = threadIdx.x; k < K; k += kQuantThreads) q[k] = Q8(quant(load_elem(x, k), inv));
  }
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

template <typename Q8>
void launch_quantize(const char* fn, const void* dX, DType in, int M, int K, Q8* dQ, float* dScale,
                     cudaStream_t stream) {
  if (M <= 0 || K <= 0)
    throw Error(std::string(fn) + ": M and K must be positive (M=" + std::to_string(M) + ", K=" + std::to_string(K) +
                ")");
  if (!dX || !dQ || !dScale) throw Error(std::string(fn) + ": null device pointer");
  if (in != DType::F32 && in != DType::BF16) throw Error(std::string(fn) + ": input dtype must be F32 or BF16");
  const size_t esize = in == DType::F32 ? 4 : 2;
  // Vector path: 8 elements per step, every row start aligned (K % 8 == 0 keeps row starts aligned).
  const bool vec8 = K % 8 == 0 && aligned(dX, 8 * esize) && aligned(dQ, 8);
  if (in == DType::F32)
    quantize_per_token_kernel<float, Q8><<<M, kQuantThreads, 0, stream>>>(static_cast<const float*>(dX), K, vec8, dQ,
                                                                           dScale);
  else
    quantize_per_token_kernel<__nv_bfloat16, Q8><<<M, kQuantThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(dX), K, vec8, dQ, dScale);
  check_launch(fn);
}

}  // namespace

void quantize_per_token(const void* dX, DType in, int M, int K, int8_t* dQ, float* dScale,
                        cudaStream_t stream) {
  launch_quantize(in == DType::BF16 ? "quantize_per_token<bf16>" : "quantize_per_token<f32>", dX, in, M, K, dQ,
                  dScale, stream);
}

void quantize_per_token_fp8(const void* dX, DType in, int M, int K, uint8_t* dQ, float* dScale,
                            cudaStream_t stream) {
  launch_quantize(in == DType::BF16 ? "quantize_per_token_fp8<bf16>" : "quantize_per_token_fp8<f32>", dX, in, M, K,
                  dQ, dScale, stream);
}

}  // namespace perry::cuda
