// The per-token int8 rule of perry::quant::quantize_row_ref as device helpers, shared by
// quantize_per_token.cu and the fused norm/SwiGLU kernels in elementwise.cu, so every producer of
// int8 activations gives the same bytes and scales for the same fp32 row.
//   amax = max|x| (NaN elements ignored, like std::max(amax, NaN)), scale = amax/127,
//   inv = 127/amax, q = clamp(rint_half_even(x*inv), -127, 127), NaN -> 0;
//   scale = inv = 0 when amax == 0, amax is not finite, or 127/amax overflows.
// Plain IEEE fp32 division and multiply (nvcc default -prec-div=true, no fast-math), so the bits
// match the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace perry::cuda {

// Row parameters from the row's amax (the max of fabsf over the row, folded with fmaxf from 0).
__device__ __forceinline__ void per_token_params(float amax, float& scale, float& inv) {
  inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  scale = amax / 127.0f;
  if (!isfinite(inv) || !isfinite(amax)) inv = scale = 0.0f;
}

__device__ __forceinline__ int8_t quant_one(float x, float inv) {
  float v = x * inv;
  if (!(v == v)) return 0;    // NaN input: the CPU rule stores 0
  int q = __float2int_rn(v);  // round half to even, like std::nearbyint in the default mode
  q = q < -127 ? -127 : (q > 127 ? 127 : q);
  return int8_t(q);
}

}  // namespace perry::cuda
