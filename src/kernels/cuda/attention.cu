// CUDA attention over the bf16 KV cache: append and prefill (tensor cores / fp32 fallback); decode
// is in attention_decode.cu, shared helpers in attention_device.cuh.
// Contracts in attention.h. Design notes (all three files):
//  * Softmax runs in the log2 domain: scores are multiplied by scale·log2(e) and exponentiated
//    with exp2f (one FMUL instead of the ex2 + scaling inside expf).
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

template <int HD>
__device__ __forceinline__ void tc_load_tile(uint16_t* ks, uint16_t* vs, const uint16_t* kg,
                                             const uint16_t* vg, int k0, int kv_len) {
  constexpr int kStride = HD + 8, kChunksRow = HD / 8;  // 16-byte chunks per cache row
#pragma unroll
  for (int c = threadIdx.x; c < kBN * kChunksRow; c += kTcThreads) {
    const int r = c / kChunksRow, col = (c % kChunksRow) * 8;
    const bool ok = k0 + r < kv_len;
    const size_t off = ok ? (size_t)(k0 + r) * HD + col : 0;
    cp_async16(ks + r * kStride + col, kg + off, ok ? 16 : 0);
    cp_async16(vs + r * kStride + col, vg + off, ok ? 16 : 0);
  }
}

template <int HD>
__global__ void __launch_bounds__(kTcThreads)
    prefill_tc_kernel(const float* __restrict__ q, const AttnSeq* __restrict__ seqs,
                      const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                      int nkv, int capacity, float scale_log2, float* __restrict__ out) {
  constexpr int kStride = HD + 8, kTile = kBN * kStride, kKS = HD / 16, kDT = HD / 8;
  extern __shared__ __align__(16) uint16_t smem[];  // [stage][K | V][kBN][kStride]

  const AttnSeq sq = seqs[blockIdx.z];
  // Highest query tiles (most keys) first: they are the long poles of the causal triangle.
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBM;
  if (sq.n_new <= 0 || i0 >= sq.n_new) return;
  const int h = blockIdx.y, kvh = h / (nh / nkv);
  const int kv_len = min(sq.pos0 + sq.n_new, capacity);
  const int i_end = min(i0 + kBM, sq.n_new);
  const int n_keys = min(sq.pos0 + i_end, kv_len);  // keys 0..n_keys-1 matter to this tile
  const int n_tiles = (n_keys + kBN - 1) / kBN;
  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * HD;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ra = i0 + warp * 16 + g, rb = ra + 8;  // this thread's two query rows (seq-relative)
  const size_t ld = (size_t)nh * HD;

  // Start the first K/V copy, then build the Q fragments from global fp32 while it flies.
  tc_load_tile<HD>(smem, smem + kTile, kg, vg, 0, kv_len);
  cp_async_commit();

  // A fragment of m16n8k16 for dims [16ks, 16ks+16): a0 (row g, 2t..2t+1), a1 (row g+8, 2t..),
  // a2 (row g, 8+2t..), a3 (row g+8, 8+2t..). Rows past n_new are zeros (never stored).
  uint32_t qf[kKS][4];
  {
    const float* qa = q + (size_t)(sq.q_row + (ra < sq.n_new ? ra : 0)) * ld + (size_t)h * HD;
    const float* qb = q + (size_t)(sq.q_row + (rb < sq.n_new ? rb : 0)) * ld + (size_t)h * HD;
    const bool va = ra < sq.n_new, vb = rb < sq.n_new;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = ks * 16 + half * 8 + 2 * t;
        const float2 xa = va ? *reinterpret_cast<const float2*>(qa + col) : make_float2(0.f, 0.f);
        const float2 xb = vb ? *reinterpret_cast<const float2*>(qb + col) : make_float2(0.f, 0.f);
        qf[ks][half * 2 + 0] = pack_bf16(xa.x, xa.y);
        qf[ks][half * 2 + 1] = pack_bf16(xb.x, xb.y);
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
        mma_bf16(s[2 * j], qf[ks], r[0], r[1]);
        mma_bf16(s[2 * j + 1], qf[ks], r[2], r[3]);
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
        const uint32_t pa = pack_bf16(exp2f(sv[0] - base_a), exp2f(sv[1] - base_a));
        const uint32_t pb = pack_bf16(exp2f(sv[2] - base_b), exp2f(sv[3] - base_b));
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
        mma_bf16(o[2 * jd], pf[kk], r[0], r[1]);
        mma_bf16(o[2 * jd + 1], pf[kk], r[2], r[3]);
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
  if (ra < sq.n_new) {
    const float inv = 1.f / l_a;
    float* dst = out + (size_t)(sq.q_row + ra) * ld + (size_t)h * HD + 2 * t;
#pragma unroll
    for (int i = 0; i < kDT; ++i)
      *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[i][0] * inv, o[i][1] * inv);
  }
  if (rb < sq.n_new) {
    const float inv = 1.f / l_b;
    float* dst = out + (size_t)(sq.q_row + rb) * ld + (size_t)h * HD + 2 * t;
#pragma unroll
    for (int i = 0; i < kDT; ++i)
      *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[i][2] * inv, o[i][3] * inv);
  }
}

// ---------------------------------------------------------------- prefill, fp32 fallback
// Any hd <= 256 (tiny test models): one warp per (query row, q head), lane owns dims lane + 32u,
// one key at a time (dot product by warp shuffle, online softmax in fp32). Correct and simple,
// not fast: real models (hd 64 / 128) take the tensor-core kernel.
constexpr int kFbWarps = 4;

__global__ void __launch_bounds__(kFbWarps * 32)
    prefill_f32_kernel(const float* __restrict__ q, const AttnSeq* __restrict__ seqs,
                       const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                       int nkv, int hd, int capacity, float scale_log2, float* __restrict__ out) {
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
  const size_t row_off = (size_t)(sq.q_row + i) * nh * hd + (size_t)h * hd;

  float qr[8], acc[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int d = lane + 32 * u;
    qr[u] = d < hd ? q[row_off + d] : 0.f;
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
    if (d < hd) out[row_off + d] = acc[u] * inv;
  }
}

template <int HD>
void launch_prefill_tc(const float* q, const AttnSeq* seqs, int n_seqs, int max_new,
                       const uint16_t* kc, const uint16_t* vc, int nh, int nkv, int capacity,
                       float scale_log2, float* out, cudaStream_t stream) {
  static int current = 0;
  static std::mutex mu;
  const char* name = HD == 64 ? "attention_prefill_tc<64>" : "attention_prefill_tc<128>";
  ensure_smem(reinterpret_cast<const void*>(prefill_tc_kernel<HD>), tc_smem_bytes<HD>(), &current,
              &mu, name);
  const dim3 grid((max_new + kBM - 1) / kBM, nh, n_seqs);
  prefill_tc_kernel<HD><<<grid, kTcThreads, tc_smem_bytes<HD>(), stream>>>(
      q, seqs, kc, vc, nh, nkv, capacity, scale_log2, out);
  check_launch(name);
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

void attention_prefill(const float* q, const AttnSeq* d_seqs, int n_seqs, int max_new, int max_ctx,
                       const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd,
                       int capacity, float scale, float* out, cudaStream_t stream) {
  const char* fn = "attention_prefill";
  check_heads(fn, nh, nkv, hd, capacity);
  check_batch(fn, d_seqs, n_seqs);
  check_cache(fn, k_cache, v_cache);
  PERRY_CHECK(max_new >= 0 && max_ctx >= max_new, "{}: need 0 <= max_new ({}) <= max_ctx ({})", fn,
              max_new, max_ctx);
  PERRY_CHECK(nh <= 65535, "{}: n_heads {} exceeds the grid limit 65535", fn, nh);
  if (n_seqs == 0 || max_new == 0) return;
  PERRY_CHECK(q && out, "{}: null q or out pointer", fn);
  const float scale_log2 = scale * kLog2e;
  if (hd == 64 || hd == 128) {
    PERRY_CHECK(aligned(q, 8) && aligned(out, 8), "{}: q and out must be 8-byte aligned", fn);
    if (hd == 64)
      launch_prefill_tc<64>(q, d_seqs, n_seqs, max_new, k_cache, v_cache, nh, nkv, capacity,
                            scale_log2, out, stream);
    else
      launch_prefill_tc<128>(q, d_seqs, n_seqs, max_new, k_cache, v_cache, nh, nkv, capacity,
                             scale_log2, out, stream);
    return;
  }
  const dim3 grid((max_new + kFbWarps - 1) / kFbWarps, nh, n_seqs);
  prefill_f32_kernel<<<grid, kFbWarps * 32, 0, stream>>>(q, d_seqs, k_cache, v_cache, nh, nkv, hd,
                                                         capacity, scale_log2, out);
  check_launch("attention_prefill_f32");
}

const char* attention_prefill_kernel_name(int hd) {
  if (hd == 64) return "prefill_tc<64> (mma.sync m16n8k16 bf16)";
  if (hd == 128) return "prefill_tc<128> (mma.sync m16n8k16 bf16)";
  return "prefill_f32 (CUDA cores)";
}


}  // namespace perry::cuda
