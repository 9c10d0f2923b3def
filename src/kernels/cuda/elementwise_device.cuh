// Device helpers shared by the elementwise kernels (elementwise.cu) and the kernels that fuse
// that elementwise work into a linear layer (gemv_decode.cu): the bf16 rounding, the block-wide
// reductions and the fp32 expressions of RMSNorm and SwiGLU, so a fused kernel produces the same
// bits as the separate kernels for the same inputs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace perry::cuda::elementwise_detail {

constexpr unsigned kFull = 0xffffffffu;

// Same bits as perry::f32_to_bf16 (host): RNE, NaN kept quiet with its upper payload.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// V consecutive values at p: V = 4 as one 16-byte access, V = 2 as one 8-byte access (the caller
// guarantees the alignment), otherwise element by element. store_bf16 writes the bits of bf16_bits.
template <int V>
__device__ __forceinline__ void load(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (V == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = p[j];
  }
}
template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = v[j];
  }
}
template <int V>
__device__ __forceinline__ void store_bf16(uint16_t* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    const uint32_t lo = uint32_t(bf16_bits(v[0])) | (uint32_t(bf16_bits(v[1])) << 16);
    const uint32_t hi = uint32_t(bf16_bits(v[2])) | (uint32_t(bf16_bits(v[3])) << 16);
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  } else if constexpr (V == 2) {
    *reinterpret_cast<uint32_t*>(p) = uint32_t(bf16_bits(v[0])) | (uint32_t(bf16_bits(v[1])) << 16);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = bf16_bits(v[j]);
  }
}

// bf16 halves of a packed pair (low half = the lower index) as exact floats.
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// V consecutive bf16 values at p as floats (exact): V = 4 as one 8-byte access, V = 2 as one
// 4-byte access (alignment as for the fp32 load), otherwise element by element.
template <int V>
__device__ __forceinline__ void load(const uint16_t* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const uint2 a = *reinterpret_cast<const uint2*>(p);
    v[0] = bf16_lo(a.x), v[1] = bf16_hi(a.x), v[2] = bf16_lo(a.y), v[3] = bf16_hi(a.y);
  } else if constexpr (V == 2) {
    const uint32_t a = *reinterpret_cast<const uint32_t*>(p);
    v[0] = bf16_lo(a), v[1] = bf16_hi(a);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = __uint_as_float(uint32_t(p[j]) << 16);
  }
}

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {
  // fmaxf ignores a NaN operand, like std::max(amax, NaN) in the CPU rule.
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The xor butterfly: every lane gets the same value (each level combines the same two values,
// a + b == b + a, in either order).
template <typename T, typename Op>
__device__ __forceinline__ T warp_all_reduce(T v, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// Every thread gets the same result: warp_all_reduce, then all threads fold the per-warp
// partials in the same order, so the result is also deterministic run to run. blockDim.x must be
// a multiple of 32. The leading barrier lets a kernel call it twice (the partials buffer is reused).
template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op) {
  __shared__ T part[32];
  v = warp_all_reduce(v, op);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) r = op(r, part[w]);
  return r;
}

// block_all_reduce for a block of exactly kNumWarps warps, with the caller's own partials buffer
// `part` (kNumWarps values in shared memory that no other reduction of the kernel uses): one
// barrier instead of two, and the partials read by unrolled loads that are all in flight at once
// (the loop over a run-time warp count waited one shared-memory round trip per warp). Every thread
// folds them in warp order, so the result is the same in every thread and run to run.
template <int kNumWarps, typename T, typename Op>
__device__ __forceinline__ T block_all_reduce_once(T v, Op op, T* part) {
  v = warp_all_reduce(v, op);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T w[kNumWarps];
#pragma unroll
  for (int i = 0; i < kNumWarps; ++i) w[i] = part[i];
  T r = w[0];
#pragma unroll
  for (int i = 1; i < kNumWarps; ++i) r = op(r, w[i]);
  return r;
}

// The normalized value, written as two rounded fp32 multiplies like the CPU ((x * inv) * w);
// __fmul_rn keeps the compiler from reassociating.
__device__ __forceinline__ float norm_one(float x, float inv, float w) { return __fmul_rn(__fmul_rn(x, inv), w); }

// f rounded to bf16 (the bits of bf16_bits), as a float.
__device__ __forceinline__ float bf16_round(float f) { return __uint_as_float(uint32_t(bf16_bits(f)) << 16); }

// silu(g) * u = g / (1 + exp(-g)) * u, in the CPU's order. expf is within 2 ulp (CUDA math
// guide), glibc's within 1: the product differs from the CPU by a few ulp at most.
__device__ __forceinline__ float swiglu_one(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// RoPE of the pair (a, b) = (x[i], x[i + hd/2]) with cos c and sin s (HF rotate_half), in
// separate roundings, no FMA: the same operations as the scalar CPU reference.
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float& ra, float& rb) {
  ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

}  // namespace perry::cuda::elementwise_detail
