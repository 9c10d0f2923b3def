// Private to attention.cu / attention_decode.cu: device helpers (cp.async, ldmatrix, mma, bf16
// bit conversions, warp reductions) and the host-side argument checks both files share.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/mma_sync_common.cuh"

namespace perry::cuda::attn_detail {

inline constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- small device helpers
using mma_sync::cp_async16;
using mma_sync::cp_async_commit;
using mma_sync::cp_async_wait;
using mma_sync::ldmatrix_x4;
using mma_sync::smem_addr;
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// D += A·B, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c0 += A·B0, c1 += A·B1: one ldmatrix.x4 of B (r) feeds two m16n8k16 MMAs (adjacent n-tiles).
__device__ __forceinline__ void mma_bf16_pair(float c0[4], float c1[4], const uint32_t a[4], const uint32_t r[4]) {
  mma_bf16(c0, a, r[0], r[1]);
  mma_bf16(c1, a, r[2], r[3]);
}
// 2^x on the MUFU alone: ex2.approx.ftz (results below 2^-126 flush to 0). exp2f compiles to the
// same MUFU.EX2 wrapped in a denormal fix-up (~3 more instructions), which matters in the
// prefill kernels' softmax (64 exponentials per thread per key tile); their weights are rounded
// to bf16 anyway, and one below 2^-126 of the row maximum is lost to the bf16 sum either way.
// The prefill kernels' grid: x = head, y = query tile (heaviest first), z = sequence. The block
// scheduler hands out blocks in launch order (x fastest), so this order starts every head's
// tile with the most keys before any lighter one — longest-first list scheduling. With y fastest
// in reverse (the order until the eighth session) each head ran heavy-to-light in turn, and the
// last head's heavy tiles started near the end: a 2048-token prompt (16 tiles × 32 heads on 264
// slots) then ran ~1.5× its balanced time in a simulation of the scheduler.
inline dim3 prefill_grid(int max_new, int rows, int nh, int n_seqs) {
  PERRY_CHECK((max_new + rows - 1) / rows <= 65535, "attention_prefill: {} new rows exceed the grid limit of "
              "65535 tiles of {}", max_new, rows);
  return dim3(unsigned(nh), unsigned((max_new + rows - 1) / rows), unsigned(n_seqs));
}
__device__ __forceinline__ int prefill_tile_row0(int rows) { return int(gridDim.y - 1 - blockIdx.y) * rows; }

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Two floats → packed bf16x2 (RNE); `lo` lands in the low half = the lower column / key.
using mma_sync::pack_bf16x2;

// Query values for the bf16 tensor-core fragments, from fp32 q (rounded here, RNE) or from bf16
// q16 (rope_append_qkv's bf16 form wrote exactly those bits): 2 values at element offset off
// (4-byte aligned in q16 / 8 in q), or 4 (8 / 16). One of q / q16 is null.
__device__ __forceinline__ uint32_t q_pair_bf16(const float* q, const uint16_t* q16, size_t off) {
  if (q16) return *reinterpret_cast<const uint32_t*>(q16 + off);
  const float2 x = *reinterpret_cast<const float2*>(q + off);
  return pack_bf16x2(x.x, x.y);
}
__device__ __forceinline__ uint2 q_quad_bf16(const float* q, const uint16_t* q16, size_t off) {
  if (q16) return *reinterpret_cast<const uint2*>(q16 + off);
  const float4 x = *reinterpret_cast<const float4*>(q + off);
  return make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
}
using elementwise_detail::bf16_hi;
using elementwise_detail::bf16_lo;
__device__ __forceinline__ float bf16_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
// Bit-identical to perry::f32_to_bf16 (core/dtype.h): RNE, NaN → quiet NaN with the sign kept.
using elementwise_detail::bf16_bits;
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One query row's output for dims 8i + 2t, +1 (i < HD/8) from the C fragments c[i][e0], c[i][e0+1],
// times inv: fp32 pairs, or bf16 pairs with the bits of perry::f32_to_bf16 of those floats.
template <int HD, bool kBf16Out>
__device__ __forceinline__ void store_row(void* out, size_t off, const float (*c)[4], int e0, float inv) {
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) {
    const float x = c[i][e0] * inv, y = c[i][e0 + 1] * inv;
    if constexpr (kBf16Out)
      *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + off + i * 8) =
          uint32_t(bf16_bits(x)) | uint32_t(bf16_bits(y)) << 16;
    else
      *reinterpret_cast<float2*>(static_cast<float*>(out) + off + i * 8) = make_float2(x, y);
  }
}

// ---------------------------------------------------------------- online softmax of one m16 tile
// For the 128-row and the wgmma prefill kernels. s[nt][e]: raw scores of rows g (e < 2) and g + 8
// (e >= 2), keys k0 + 8nt + 2t + (e & 1). m: the rows' running maxima (scaled, log2 domain), l:
// this thread's partial sums. Masks keys past each row's limit (need_mask), takes the quad's row
// maxima of the raw scores (scale > 0), updates m and rescales l; gives each row's exp2 base and
// the factor for its accumulators (exactly 1 where the maximum did not grow). Returns whether a
// row's maximum grew.
template <int kNT>
__device__ __forceinline__ bool softmax_rescale(float (&s)[kNT][4], int k0, int t, bool need_mask, const int (&lim)[2],
                                                float scale_log2, float (&m)[2], float (&l)[2], float (&base)[2],
                                                float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (need_mask) {
        const int key = k0 + nt * 8 + 2 * t + (e & 1);
        if (key > lim[e >> 1]) s[nt][e] = -INFINITY;
      }
      mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    }
  }
  bool grew = false;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    // The 4 threads of a quad hold the same row: reduce over the quad.
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
    const float mn = fmaxf(m[hf], mx[hf] * scale_log2);
    const float b = mn == -INFINITY ? 0.f : mn;
    alpha[hf] = exp2f(m[hf] - b);  // exactly 1 when the max did not grow
    grew |= mn > m[hf];
    m[hf] = mn;
    base[hf] = b;
    l[hf] *= alpha[hf];
  }
  return grew;
}

// Accumulator rows g (c[i][0..1]) and g + 8 (c[i][2..3]) times their rescale factors.
template <int N>
__device__ __forceinline__ void rescale_rows(float (&c)[N][4], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c[i][0] *= alpha[0];
    c[i][1] *= alpha[0];
    c[i][2] *= alpha[1];
    c[i][3] *= alpha[1];
  }
}

// The weights P = exp2(s·scale·log2e − base) of keys 16kk .. 16kk + 15, rounded to bf16 and packed
// as the m16n8k16 A fragment (a0 / a2: row g, a1 / a3: row g + 8); the row sums use the rounded
// values, so numerator and denominator weight each key identically.
template <int kNT>
__device__ __forceinline__ void softmax_weights(const float (&s)[kNT][4], int kk, float scale_log2,
                                                const float (&base)[2], float (&l)[2], uint32_t (&pf)[4]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float* sv = s[2 * kk + hf];
    const uint32_t pa = pack_bf16x2(exp2_ftz(fmaf(sv[0], scale_log2, -base[0])), exp2_ftz(fmaf(sv[1], scale_log2, -base[0])));
    const uint32_t pb = pack_bf16x2(exp2_ftz(fmaf(sv[2], scale_log2, -base[1])), exp2_ftz(fmaf(sv[3], scale_log2, -base[1])));
    l[0] += bf16_lo(pa) + bf16_hi(pa);
    l[1] += bf16_lo(pb) + bf16_hi(pb);
    pf[hf * 2 + 0] = pa;
    pf[hf * 2 + 1] = pb;
  }
}

// ---------------------------------------------------------------- host side
inline bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

inline void check_heads(const char* fn, int nh, int nkv, int hd, int capacity) {
  PERRY_CHECK(nh > 0 && nkv > 0 && nh % nkv == 0,
              "{}: n_heads {} must be a positive multiple of n_kv_heads {}", fn, nh, nkv);
  PERRY_CHECK(hd > 0 && hd <= kAttnMaxHeadDim, "{}: head_dim {} must be in [1, {}]", fn, hd,
              kAttnMaxHeadDim);
  PERRY_CHECK(capacity > 0, "{}: KV cache capacity {} must be positive", fn, capacity);
}
inline void check_cache(const char* fn, const void* kc, const void* vc) {
  PERRY_CHECK(kc && vc, "{}: null KV cache pointer", fn);
  PERRY_CHECK(aligned(kc, 16) && aligned(vc, 16),
              "{}: KV cache pointers must be 16-byte aligned (cp.async copies)", fn);
}
inline void check_batch(const char* fn, const void* seqs, int n_seqs) {
  PERRY_CHECK(n_seqs >= 0 && n_seqs <= 65535, "{}: n_seqs {} must be in [0, 65535]", fn, n_seqs);
  PERRY_CHECK(seqs || n_seqs == 0, "{}: null sequence descriptors", fn);
}

// Raises a kernel's dynamic shared memory limit when `bytes` exceeds the 48 KiB default.
inline void ensure_smem(const void* kernel, size_t bytes, int* current, std::mutex* mu, const char* name) {
  if (bytes <= 48 * 1024) return;
  std::lock_guard<std::mutex> lock(*mu);
  if ((size_t)*current >= bytes) return;
  int dev = 0, optin = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  if (bytes > (size_t)optin)
    fail("{}: needs {} bytes of shared memory, the device allows {} (too many q heads per kv "
         "head for this head_dim)", name, bytes, optin);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             name);
  *current = int(bytes);
}

}  // namespace perry::cuda::attn_detail

namespace perry::cuda {
// The experimental wgmma prefill kernel (attention_prefill_sm90.cu): io.q_stride set, exactly one output; arguments checked by attention_prefill.
void attention_prefill_wgmma(const PrefillIo& io, const AttnSeq* seqs, int n_seqs, int max_new, const uint16_t* kc,
                             const uint16_t* vc, int nh, int nkv, int capacity, float scale_log2, cudaStream_t stream);
}  // namespace perry::cuda
