// CUDA attention over the bf16 KV cache: append and prefill (tensor cores / fp32 fallback); decode
// is in attention_decode.cu, shared helpers in attention_device.cuh.
// Contracts in attention.h. Design notes (all three files):
//  * Softmax runs in the log2 domain: scores are multiplied by scale·log2(e) and exponentiated
//    with exp2 (one FMUL instead of the ex2 + scaling inside expf); the tensor-core kernels use
//    the bare MUFU (exp2_ftz) for the weights P, exp2f for the rescale factors.
//  * Every kernel visits key 0 of a row first, so the running max of a valid row is finite after
//    the first tile and exp2(-inf - m) = 0 handles masked keys; a guard still maps an all-masked
//    max to 0 so a caller error can never produce (-inf) - (-inf) = NaN.
//  * Cache positions >= pos0 + n_new are never read (shared tiles are zero-filled there), so stale
//    or garbage (even NaN) cache contents past the context cannot leak in through 0·NaN.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/device_query.h"

namespace perry::cuda {
namespace {
using namespace attn_detail;

// ---------------------------------------------------------------- kv_cache_append
// One block per row of k / v. The block finds its sequence by a parallel scan of the descriptors
// (n_seqs is a batch size: tens to hundreds, cheaper than a host-built row map and one launch).
__global__ void kv_append_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                 const AttnSeq* __restrict__ seqs, int n_seqs, int nkv, int hd,
                                 int capacity, uint16_t* __restrict__ kc, uint16_t* __restrict__ vc) {
  __shared__ int s_pos, s_slot;
  const int row = blockIdx.x;
  if (threadIdx.x == 0) s_pos = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < n_seqs; i += blockDim.x) {
    const AttnSeq s = seqs[i];
    if (row >= s.q_row && row < s.q_row + s.n_new) {
      s_pos = s.pos0 + (row - s.q_row);
      s_slot = s.slot;
    }
  }
  __syncthreads();
  const int pos = s_pos, slot = s_slot;
  if (pos < 0 || pos >= capacity || slot < 0) return;  // no sequence, or a caller error
  const int width = nkv * hd;
  const float* kr = k + (size_t)row * width;
  const float* vr = v + (size_t)row * width;
  const size_t base = (size_t)slot * nkv * capacity * hd + (size_t)pos * hd;
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    const int h = e / hd, d = e - h * hd;
    const size_t dst = base + (size_t)h * capacity * hd + d;
    kc[dst] = bf16_bits(kr[e]);
    vc[dst] = bf16_bits(vr[e]);
  }
}

// ---------------------------------------------------------------- prefill, tensor cores
// Block = 4 warps = 64 query rows (16 per warp, one m16 tile) of one (sequence, q head).
// Keys in tiles of 64; K and V tiles bf16 in shared memory, two stages (tile kt+1 is copied by
// cp.async while tile kt is computed). Rows are padded by 8 bf16 (16 bytes) so that the 8 row
// addresses of an ldmatrix (row stride 144 / 272 bytes ≡ 16 mod 128) hit 8 distinct 16-byte bank
// groups. Per key tile and warp: S = Q·Kᵀ (16×64, fp32 in registers), online softmax, then the
// S accumulators are repacked as bf16 A fragments (the m16n8 C layout of two adjacent n-tiles is
// exactly the m16n8k16 A layout) and O += P·V with V fragments from ldmatrix.trans.
constexpr int kBM = 64, kBN = 64, kTcThreads = 128;

template <int HD>
constexpr int tc_smem_bytes() {
  return 2 /*stages*/ * 2 /*K,V*/ * kBN * (HD + 8) * 2;
}

template <int HD, int BN = kBN>
__device__ __forceinline__ void tc_load_tile(uint16_t* ks, uint16_t* vs, const uint16_t* kg,
                                             const uint16_t* vg, int k0, int kv_len) {
  constexpr int kStride = HD + 8, kChunksRow = HD / 8;  // 16-byte chunks per cache row
#pragma unroll
  for (int c = threadIdx.x; c < BN * kChunksRow; c += kTcThreads) {
    const int r = c / kChunksRow, col = (c % kChunksRow) * 8;
    const bool ok = k0 + r < kv_len;
    const size_t off = ok ? (size_t)(k0 + r) * HD + col : 0;
    cp_async16(ks + r * kStride + col, kg + off, ok ? 16 : 0);
    cp_async16(vs + r * kStride + col, vg + off, ok ? 16 : 0);
  }
}

template <int HD, bool kBf16Out>
__global__ void __launch_bounds__(kTcThreads)
    prefill_tc_kernel(const float* __restrict__ q, const uint16_t* __restrict__ q16, long long q_stride,
                      const AttnSeq* __restrict__ seqs,
                      const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                      int nkv, int capacity, float scale_log2, void* __restrict__ out) {
  constexpr int kStride = HD + 8, kTile = kBN * kStride, kKS = HD / 16, kDT = HD / 8;
  extern __shared__ __align__(16) uint16_t smem[];  // [stage][K | V][kBN][kStride]

  const AttnSeq sq = seqs[blockIdx.z];
  const int i0 = prefill_tile_row0(kBM);
  if (sq.n_new <= 0 || i0 >= sq.n_new) return;
  const int h = blockIdx.x, kvh = h / (nh / nkv);
  const int kv_len = min(sq.pos0 + sq.n_new, capacity);
  const int i_end = min(i0 + kBM, sq.n_new);
  const int n_keys = min(sq.pos0 + i_end, kv_len);  // keys 0..n_keys-1 matter to this tile
  const int n_tiles = (n_keys + kBN - 1) / kBN;
  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * HD;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ra = i0 + warp * 16 + g, rb = ra + 8;  // this thread's two query rows (seq-relative)
  const size_t ld = (size_t)nh * HD;  // output row stride

  // Start the first K/V copy, then build the Q fragments from global fp32 while it flies.
  tc_load_tile<HD>(smem, smem + kTile, kg, vg, 0, kv_len);
  cp_async_commit();

  // A fragment of m16n8k16 for dims [16ks, 16ks+16): a0 (row g, 2t..2t+1), a1 (row g+8, 2t..),
  // a2 (row g, 8+2t..), a3 (row g+8, 8+2t..). Rows past n_new are zeros (never stored).
  uint32_t qf[kKS][4];
  {
    const size_t oa = (size_t)(sq.q_row + (ra < sq.n_new ? ra : 0)) * q_stride + (size_t)h * HD;
    const size_t ob = (size_t)(sq.q_row + (rb < sq.n_new ? rb : 0)) * q_stride + (size_t)h * HD;
    const bool va = ra < sq.n_new, vb = rb < sq.n_new;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = ks * 16 + half * 8 + 2 * t;
        qf[ks][half * 2 + 0] = va ? q_pair_bf16(q, q16, oa + col) : 0u;
        qf[ks][half * 2 + 1] = vb ? q_pair_bf16(q, q16, ob + col) : 0u;
      }
    }
  }
  // Last key each row may see; rows past n_new get a harmless clamp (key 0 is always allowed).
  const int lim_a = min(sq.pos0 + ra, kv_len - 1), lim_b = min(sq.pos0 + rb, kv_len - 1);

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // l: this thread's partial sums

  // ldmatrix lane → row/column offsets. K (non-trans; B of S=Q·Kᵀ, n = key, k = dim): matrices
  // (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15)
  // → {b0,b1} of key n-tile 2j, then of 2j+1. V (trans; B of O=P·V, k = key, n = dim): matrices
  // (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15)
  // → {b0,b1} of dim n-tile 2j, then of 2j+1.
  const int kb_row = (lane & 7) + (lane >> 4) * 8, kb_col = ((lane >> 3) & 1) * 8;
  const int vb_row = (lane & 7) + ((lane >> 3) & 1) * 8, vb_col = (lane >> 4) * 8;

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      uint16_t* st = smem + ((kt + 1) & 1) * 2 * kTile;
      tc_load_tile<HD>(st, st + kTile, kg, vg, (kt + 1) * kBN, kv_len);
    }
    cp_async_commit();  // possibly empty: keeps "tile kt = all groups but the newest" exact
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* ks_ = smem + (kt & 1) * 2 * kTile;
    const uint16_t* vs_ = ks_ + kTile;

    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t r[4];
        ldmatrix_x4(r, ks_ + (j * 16 + kb_row) * kStride + ks * 16 + kb_col);
        mma_bf16_pair(s[2 * j], s[2 * j + 1], qf[ks], r);
      }
    }

    // Scale; mask keys past each row's limit. A tile needs masking only if its last key is past
    // the smallest limit of the block (pos0 + i0); earlier tiles are fully visible.
    const int k0 = kt * kBN;
    const bool need_mask = k0 + kBN - 1 > sq.pos0 + i0;
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * scale_log2;
        if (need_mask) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1);
          if (key > (e < 2 ? lim_a : lim_b)) x = -INFINITY;
        }
        s[nt][e] = x;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
    // The 4 threads of a quad hold the same two rows: reduce the max over the quad.
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    const float base_a = mx_a == -INFINITY ? 0.f : mx_a;
    const float base_b = mx_b == -INFINITY ? 0.f : mx_b;
    const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
    m_a = mx_a;
    m_b = mx_b;
    l_a *= alpha_a;
    l_b *= alpha_b;
#pragma unroll
    for (int i = 0; i < kDT; ++i) {
      o[i][0] *= alpha_a;
      o[i][1] *= alpha_a;
      o[i][2] *= alpha_b;
      o[i][3] *= alpha_b;
    }
    // P = exp2(s - m), rounded to bf16 for the tensor cores; the row sums use the ROUNDED values
    // so that numerator and denominator weight each key identically.
    uint32_t pf[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float* sv = s[2 * kk + hf];
        const uint32_t pa = pack_bf16x2(exp2_ftz(sv[0] - base_a), exp2_ftz(sv[1] - base_a));
        const uint32_t pb = pack_bf16x2(exp2_ftz(sv[2] - base_b), exp2_ftz(sv[3] - base_b));
        l_a += bf16_lo(pa) + bf16_hi(pa);
        l_b += bf16_lo(pb) + bf16_hi(pb);
        pf[kk][hf * 2 + 0] = pa;  // a0 / a2: row g, keys 16kk + 8hf + 2t..
        pf[kk][hf * 2 + 1] = pb;  // a1 / a3: row g+8
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int jd = 0; jd < HD / 16; ++jd) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, vs_ + (kk * 16 + vb_row) * kStride + jd * 16 + vb_col);
        mma_bf16_pair(o[2 * jd], o[2 * jd + 1], pf[kk], r);
      }
    }
    __syncthreads();  // everyone is done with this stage before iteration kt+1 refills it
  }
  cp_async_wait<0>();

  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  // C layout: c0,c1 at (row g, dims 8i + 2t, +1), c2,c3 at row g+8.
  if (ra < sq.n_new)
    store_row<HD, kBf16Out>(out, (size_t)(sq.q_row + ra) * ld + (size_t)h * HD + 2 * t, o, 0, 1.f / l_a);
  if (rb < sq.n_new)
    store_row<HD, kBf16Out>(out, (size_t)(sq.q_row + rb) * ld + (size_t)h * HD + 2 * t, o, 2, 1.f / l_b);
}

// ---------------------------------------------------------------- prefill, tensor cores, 128 rows
// Block = 4 warps = 128 query rows; each warp owns 32 rows as two m16 tiles, so every K / V
// fragment read from shared memory feeds two MMAs. (The 64-row kernel above reads one 512-byte
// ldmatrix.x4 per two m16n8k16 MMAs: as many shared-memory cycles as tensor cycles, which was its
// limit.) Q is staged once in shared memory as bf16 and read by ldmatrix per k-step: two tiles'
// Q fragments (64 registers) would not fit next to 128 fp32 accumulators and the scores.
// Softmax: the maximum is taken over the raw scores (scale > 0) and exp2(s·scale·log2e − m) is one
// FFMA + EX2; the rescale of the accumulators is skipped when no row of the tile's warp got a
// new maximum (warp-uniform branch: most tiles after the first few).
constexpr int kBM2 = 128;

// B fragments of n-tiles n, n+1 (one ldmatrix.x4 at p; transposed for V) into both m-tiles'
// accumulators: c[mt][n], c[mt][n+1] += a[mt]·B.
template <bool kTrans, int N>
__device__ __forceinline__ void mma_two_mtiles(float (&c)[2][N][4], int n, const uint32_t (&a)[2][4],
                                               const uint16_t* p) {
  uint32_t r[4];
  if constexpr (kTrans) ldmatrix_x4_trans(r, p);
  else ldmatrix_x4(r, p);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) mma_bf16_pair(c[mt][n], c[mt][n + 1], a[mt], r);
}

template <int HD, int BN>
constexpr int tc2_smem_bytes() {
  return (kBM2 + 2 /*stages*/ * 2 /*K,V*/ * BN) * (HD + 8) * 2;
}

template <int HD, int BN, bool kBf16Out>
__global__ void __launch_bounds__(kTcThreads)
    prefill_tc2_kernel(const float* __restrict__ q, const uint16_t* __restrict__ q16, long long q_stride,
                       const AttnSeq* __restrict__ seqs,
                       const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                       int nkv, int capacity, float scale_log2, void* __restrict__ out) {
  constexpr int kStride = HD + 8, kTile = BN * kStride, kKS = HD / 16, kDT = HD / 8, kNT = BN / 8;
  extern __shared__ __align__(16) uint16_t smem[];  // Q [kBM2][kStride] | [stage][K | V][BN][kStride]
  uint16_t* qs = smem;
  uint16_t* kvs = smem + kBM2 * kStride;

  const AttnSeq sq = seqs[blockIdx.z];
  const int i0 = prefill_tile_row0(kBM2);
  if (sq.n_new <= 0 || i0 >= sq.n_new) return;
  const int h = blockIdx.x, kvh = h / (nh / nkv);
  const int kv_len = min(sq.pos0 + sq.n_new, capacity);
  const int i_end = min(i0 + kBM2, sq.n_new);
  const int n_keys = min(sq.pos0 + i_end, kv_len);
  const int n_tiles = (n_keys + BN - 1) / BN;
  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * HD;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;

  tc_load_tile<HD, BN>(kvs, kvs + kTile, kg, vg, 0, kv_len);
  cp_async_commit();
  // Q rows → bf16 in shared memory (rows past n_new: zeros, never stored). Visible to every warp
  // after the first barrier of the key loop.
  for (int c = threadIdx.x; c < kBM2 * (HD / 4); c += kTcThreads) {
    const int r = c / (HD / 4), col = (c % (HD / 4)) * 4;
    uint2 x = make_uint2(0u, 0u);
    if (i0 + r < sq.n_new) x = q_quad_bf16(q, q16, (size_t)(sq.q_row + i0 + r) * q_stride + (size_t)h * HD + col);
    *reinterpret_cast<uint2*>(qs + r * kStride + col) = x;
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int w0 = i0 + warp * 32;  // this warp's first row; its rows: w0 + 16mt + g (+8)
  int lim[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) lim[mt][hf] = min(sq.pos0 + w0 + 16 * mt + 8 * hf + g, kv_len - 1);

  float o[2][kDT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < kDT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m[2][2], l[2][2];  // running max (scaled, log2 domain) and this thread's partial sums
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  // ldmatrix lane offsets: Q (A of m16k16: matrices rows 0-7 / 8-15 × dims 0-7 / 8-15), K and V
  // as in the 64-row kernel.
  const int qa_row = lane & 15, qa_col = (lane >> 4) * 8;
  const int kb_row = (lane & 7) + (lane >> 4) * 8, kb_col = ((lane >> 3) & 1) * 8;
  const int vb_row = (lane & 7) + ((lane >> 3) & 1) * 8, vb_col = (lane >> 4) * 8;
  const uint16_t* qw = qs + (warp * 32 + qa_row) * kStride + qa_col;

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      uint16_t* st = kvs + ((kt + 1) & 1) * 2 * kTile;
      tc_load_tile<HD, BN>(st, st + kTile, kg, vg, (kt + 1) * BN, kv_len);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* ks_ = kvs + (kt & 1) * 2 * kTile;
    const uint16_t* vs_ = ks_ + kTile;

    float s[2][kNT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < kNT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      uint32_t qa[2][4];
      ldmatrix_x4(qa[0], qw + ks * 16);
      ldmatrix_x4(qa[1], qw + 16 * kStride + ks * 16);
#pragma unroll
      for (int j = 0; j < kNT / 2; ++j)
        mma_two_mtiles<false>(s, 2 * j, qa, ks_ + (j * 16 + kb_row) * kStride + ks * 16 + kb_col);
    }

    const int k0 = kt * BN;
    const bool need_mask = k0 + BN - 1 > sq.pos0 + w0;  // the warp's smallest limit
    float base[2][2], alpha[2][2];
    bool grew = false;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      grew |= softmax_rescale(s[mt], k0, t, need_mask, lim[mt], scale_log2, m[mt], l[mt], base[mt], alpha[mt]);
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) rescale_rows(o[mt], alpha[mt]);
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pf[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) softmax_weights(s[mt], kk, scale_log2, base[mt], l[mt], pf[mt]);
#pragma unroll
      for (int jd = 0; jd < HD / 16; ++jd)
        mma_two_mtiles<true>(o, 2 * jd, pf, vs_ + (kk * 16 + vb_row) * kStride + jd * 16 + vb_col);
    }
    __syncthreads();  // everyone is done with this stage before iteration kt+1 refills it
  }
  cp_async_wait<0>();

  const size_t ld = (size_t)nh * HD;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = w0 + 16 * mt + 8 * hf + g;
      if (row < sq.n_new)
        store_row<HD, kBf16Out>(out, (size_t)(sq.q_row + row) * ld + (size_t)h * HD + 2 * t, o[mt], 2 * hf,
                                1.f / sum);
    }
}

// ---------------------------------------------------------------- prefill, fp32 fallback
// Any hd <= 256 (tiny test models): one warp per (query row, q head), lane owns dims lane + 32u,
// one key at a time (dot product by warp shuffle, online softmax in fp32). Correct and simple,
// not fast: real models (hd 64 / 128) take the tensor-core kernel.
constexpr int kFbWarps = 4;

template <bool kBf16Out>
__global__ void __launch_bounds__(kFbWarps * 32)
    prefill_f32_kernel(const float* __restrict__ q, const uint16_t* __restrict__ q16, long long q_stride,
                       const AttnSeq* __restrict__ seqs,
                       const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                       int nkv, int hd, int capacity, float scale_log2, void* __restrict__ out) {
  const AttnSeq sq = seqs[blockIdx.z];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kFbWarps + warp;
  if (i >= sq.n_new) return;  // whole warp leaves; no block-level barriers below
  const int h = blockIdx.y, kvh = h / (nh / nkv);
  const int kv_len = min(sq.pos0 + sq.n_new, capacity);
  const int lim = min(sq.pos0 + i, kv_len - 1);
  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * hd;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;
  const size_t row_off = (size_t)(sq.q_row + i) * nh * hd + (size_t)h * hd;  // of out
  const size_t qrow = (size_t)(sq.q_row + i) * q_stride + (size_t)h * hd;

  float qr[8], acc[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int d = lane + 32 * u;
    qr[u] = d < hd ? (q16 ? bf16_to_float(q16[qrow + d]) : q[qrow + d]) : 0.f;
    acc[u] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= lim; ++j) {
    float part = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int d = lane + 32 * u;
      if (d < hd) part = fmaf(qr[u], bf16_to_float(kg[(size_t)j * hd + d]), part);
    }
    const float sj = warp_sum(part) * scale_log2;
    const float m_new = fmaxf(m, sj);
    const float c = exp2f(m - m_new), p = exp2f(sj - m_new);
    l = l * c + p;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int d = lane + 32 * u;
      if (d < hd) acc[u] = fmaf(p, bf16_to_float(vg[(size_t)j * hd + d]), acc[u] * c);
    }
    m = m_new;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int d = lane + 32 * u;
    if (d >= hd) continue;
    if constexpr (kBf16Out)
      static_cast<uint16_t*>(out)[row_off + d] = bf16_bits(acc[u] * inv);
    else
      static_cast<float*>(out)[row_off + d] = acc[u] * inv;
  }
}

// One launcher for the tensor-core kernels: the kernel's shared-memory opt-in (`current`: one per
// kernel — the kernels share a function type, so the caller keeps it), the grid of
// prefill_grid, the launch check.
template <typename Kernel>
void launch_prefill(Kernel kernel, int* current, int smem, int rows, const char* name, const PrefillIo& io,
                    const AttnSeq* seqs, int n_seqs, int max_new, const uint16_t* kc, const uint16_t* vc, int nh,
                    int nkv, int capacity, float scale_log2, cudaStream_t stream) {
  static std::mutex mu;
  ensure_smem(reinterpret_cast<const void*>(kernel), smem, current, &mu, name);
  const dim3 grid = prefill_grid(max_new, rows, nh, n_seqs);
  void* out = io.out_bf16 ? static_cast<void*>(io.out_bf16) : static_cast<void*>(io.out);
  kernel<<<grid, kTcThreads, smem, stream>>>(io.q, io.q_bf16, (long long)io.q_stride, seqs, kc, vc, nh, nkv,
                                              capacity, scale_log2, out);
  check_launch(name);
}

template <int HD, bool kBf16Out>
void launch_prefill_tc(PrefillKernel which, const PrefillIo& io, const AttnSeq* seqs, int n_seqs, int max_new,
                       const uint16_t* kc, const uint16_t* vc, int nh, int nkv, int capacity, float scale_log2,
                       cudaStream_t stream) {
  static int current_rows128 = 0, current_rows64 = 0;  // per instantiation = per kernel
  if (which == PrefillKernel::Rows128)
    launch_prefill(prefill_tc2_kernel<HD, kBN, kBf16Out>, &current_rows128, tc2_smem_bytes<HD, kBN>(), kBM2,
                   HD == 64 ? "attention_prefill_tc128<64>" : "attention_prefill_tc128<128>", io, seqs, n_seqs,
                   max_new, kc, vc, nh, nkv, capacity, scale_log2, stream);
  else
    launch_prefill(prefill_tc_kernel<HD, kBf16Out>, &current_rows64, tc_smem_bytes<HD>(), kBM,
                   HD == 64 ? "attention_prefill_tc<64>" : "attention_prefill_tc<128>", io, seqs, n_seqs, max_new,
                   kc, vc, nh, nkv, capacity, scale_log2, stream);
}

template <int HD>
void dispatch_prefill_tc(PrefillKernel which, const PrefillIo& io, const AttnSeq* seqs, int n_seqs, int max_new,
                         const uint16_t* kc, const uint16_t* vc, int nh, int nkv, int capacity, float scale_log2,
                         cudaStream_t stream) {
  if (io.out_bf16)
    launch_prefill_tc<HD, true>(which, io, seqs, n_seqs, max_new, kc, vc, nh, nkv, capacity, scale_log2, stream);
  else
    launch_prefill_tc<HD, false>(which, io, seqs, n_seqs, max_new, kc, vc, nh, nkv, capacity, scale_log2, stream);
}

}  // namespace

void kv_cache_append(const float* k, const float* v, const AttnSeq* d_seqs, int n_seqs, int M,
                     int nkv, int hd, int capacity, uint16_t* k_cache, uint16_t* v_cache,
                     cudaStream_t stream) {
  const char* fn = "kv_cache_append";
  check_heads(fn, nkv, nkv, hd, capacity);
  check_batch(fn, d_seqs, n_seqs);
  check_cache(fn, k_cache, v_cache);
  PERRY_CHECK(M >= 0, "{}: M {} must be non-negative", fn, M);
  if (M == 0 || n_seqs == 0) return;
  PERRY_CHECK(k && v, "{}: null k or v pointer", fn);
  kv_append_kernel<<<M, 128, 0, stream>>>(k, v, d_seqs, n_seqs, nkv, hd, capacity, k_cache,
                                          v_cache);
  check_launch(fn);
}

PrefillKernel attention_prefill_choice(PrefillKernel want, int hd, int n_seqs, int max_new, int nh) {
  if (hd != 64 && hd != 128) return PrefillKernel::Auto;  // the fp32 kernel
  if (want == PrefillKernel::Wgmma && hd != 128) return PrefillKernel::Rows128;  // wgmma: hd 128 only
  if (want != PrefillKernel::Auto) return want;
  // 128-row blocks halve the shared-memory reads per MMA but halve the block count too: below
  // about two blocks per SM (e.g. a 512-token prompt of 32 heads) the 64-row kernel fills more.
  const long long blocks = (long long)((max_new + kBM2 - 1) / kBM2) * nh * n_seqs;
  if (blocks < 2LL * sm_count()) return PrefillKernel::Rows64;
  // The same 128-row blocks on Hopper's warpgroup MMAs: 378 vs 290 TFLOP/s at T = 8192 (H200).
  return hd == 128 && attention_prefill_wgmma_supported(128) ? PrefillKernel::Wgmma : PrefillKernel::Rows128;
}

void attention_prefill(const PrefillIo& io, const AttnSeq* d_seqs, int n_seqs, int max_new, int max_ctx,
                       const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd, int capacity,
                       float scale, cudaStream_t stream, PrefillKernel kernel) {
  const char* fn = "attention_prefill";
  check_heads(fn, nh, nkv, hd, capacity);
  check_batch(fn, d_seqs, n_seqs);
  check_cache(fn, k_cache, v_cache);
  PERRY_CHECK(max_new >= 0 && max_ctx >= max_new, "{}: need 0 <= max_new ({}) <= max_ctx ({})", fn,
              max_new, max_ctx);
  PERRY_CHECK(nh <= 65535, "{}: n_heads {} exceeds the grid limit 65535", fn, nh);
  PERRY_CHECK(std::isfinite(scale) && scale > 0, "{}: scale {} must be positive and finite", fn, scale);
  if (n_seqs == 0 || max_new == 0) return;
  PERRY_CHECK((io.q != nullptr) != (io.q_bf16 != nullptr) && (io.out != nullptr) != (io.out_bf16 != nullptr),
              "{}: need exactly one of q (fp32) / q_bf16 and exactly one of out (fp32) / out_bf16", fn);
  PrefillIo x = io;
  if (x.q_stride == 0) x.q_stride = int64_t(nh) * hd;
  PERRY_CHECK(x.q_stride >= int64_t(nh) * hd, "{}: q row stride {} is shorter than a row of {} heads × {}", fn,
              x.q_stride, nh, hd);
  const float scale_log2 = scale * kLog2e;
  const PrefillKernel which = attention_prefill_choice(kernel, hd, n_seqs, max_new, nh);
  if (which == PrefillKernel::Wgmma) {
    PERRY_CHECK(attention_prefill_wgmma_supported(hd), "{}: the wgmma kernel needs hd 128 on an sm_90 device", fn);
    PERRY_CHECK(aligned(x.q, 16) && aligned(x.q_bf16, 8) && x.q_stride % 4 == 0 && aligned(x.out, 8) &&
                    aligned(x.out_bf16, 4),
                "{}: q must be 16-byte aligned (q_bf16 8-byte) with a row stride that is a multiple of 4 elements, "
                "out 8-byte aligned (out_bf16 4-byte)", fn);
    attention_prefill_wgmma(x, d_seqs, n_seqs, max_new, k_cache, v_cache, nh, nkv, capacity, scale_log2, stream);
    return;
  }
  if (which != PrefillKernel::Auto) {
    // float4 reads of q rows (the 128-row kernel), float2 / 4-byte stores of out.
    PERRY_CHECK(aligned(x.q, 16) && aligned(x.q_bf16, 8) && x.q_stride % 4 == 0 && aligned(x.out, 8) &&
                    aligned(x.out_bf16, 4),
                "{}: q must be 16-byte aligned (q_bf16 8-byte) with a row stride that is a multiple of 4 elements, "
                "out 8-byte aligned (out_bf16 4-byte)", fn);
    if (hd == 64)
      dispatch_prefill_tc<64>(which, x, d_seqs, n_seqs, max_new, k_cache, v_cache, nh, nkv, capacity, scale_log2,
                              stream);
    else
      dispatch_prefill_tc<128>(which, x, d_seqs, n_seqs, max_new, k_cache, v_cache, nh, nkv, capacity, scale_log2,
                               stream);
    return;
  }
  const dim3 grid((max_new + kFbWarps - 1) / kFbWarps, nh, n_seqs);
  if (x.out_bf16)
    prefill_f32_kernel<true><<<grid, kFbWarps * 32, 0, stream>>>(x.q, x.q_bf16, (long long)x.q_stride, d_seqs, k_cache,
                                                                 v_cache, nh, nkv, hd, capacity, scale_log2,
                                                                 x.out_bf16);
  else
    prefill_f32_kernel<false><<<grid, kFbWarps * 32, 0, stream>>>(x.q, x.q_bf16, (long long)x.q_stride, d_seqs, k_cache,
                                                                  v_cache, nh, nkv, hd, capacity, scale_log2,
                                                                  x.out);
  check_launch("attention_prefill_f32");
}

const char* attention_prefill_kernel_name(int hd) {
  if (hd == 64) return "prefill_tc<64> / tc128<64> (mma.sync m16n8k16 bf16; 64- or 128-row blocks)";
  if (hd == 128)
    return attention_prefill_wgmma_supported(128)
               ? "prefill_tc<128> (mma.sync m16n8k16 bf16, 64-row blocks) / prefill_wgmma (wgmma, 128-row blocks)"
               : "prefill_tc<128> / tc128<128> (mma.sync m16n8k16 bf16; 64- or 128-row blocks)";
  return "prefill_f32 (CUDA cores)";
}


}  // namespace perry::cuda
