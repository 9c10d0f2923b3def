// Flash-decoding for batched decode over the bf16 KV cache (contract in attention.h): a partial
// kernel per (KV chunk, kv head, sequence) and a combine kernel. See attention.cu for the shared
// conventions (log2-domain softmax, never reading past a sequence's context).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/lab_timeline.cuh"
#include "kernels/cuda/pdl.cuh"

namespace perry::cuda {
namespace {
using namespace attn_detail;
using elementwise_detail::norm_one;
using elementwise_detail::rope_rotate;

// ---------------------------------------------------------------- decode (flash-decoding)
// Partial kernel: block (chunk c, kv head, sequence), 128 threads, the G = nh/nkv q heads of the
// group. The chunk is walked in tiles of 64 keys: K/V tile → shared (cp.async 16-byte copies when
// hd % 8 == 0, else element loads), scores S[G][64] (one thread per (g, key), full-length dot
// against K in shared memory: no shuffles), per-head online softmax (one warp per head), then
// O[G][hd] += P·V (one thread per (g, dim pair)). O lives in shared memory because G is only
// known at run time. The block writes its unnormalised (m, l, O) to the workspace; the combine
// kernel merges the chunks. Several blocks per SM overlap one block's loads with another's math.
// At a decode step's few hundred positions there are only nkv × 2-3 blocks, one tile each, so
// the partial kernel is a latency chain, not a throughput one: 256 threads (one (g, key) score
// and one (g, dim pair) of P·V each at G = 4, hd = 128) and short dependency chains — four
// accumulators a score dot, two a P·V sum over a whole tile — rather than 128 threads walking
// 128- and 64-long FMA chains twice each.
constexpr int kDecThreads = 128, kPartThreads = 256, kDecTile = 64;
// Chunks of 64 keys (one tile) at short contexts: a one-token step at a few hundred positions
// then has nkv × (ctx / 64) blocks rather than nkv × 1-2, each a short dependency chain.
constexpr int kDecMinChunk = 64, kDecTargetParts = 1024;
// PERRY_DECODE_ATTN_MIN_CHUNK=n (16..kDecMinChunk, a multiple of 16): shorter chunks for A/B runs
// — a chunk of n keys is a partial tile, so a block's chain shortens with it (the s16 timeline:
// the partial kernel's work is ~6 µs of a layer's critical path at ~150 positions). Chunks are
// multiples of n. (Not yet measured: s16 run 4's "attnchunk32" rows ran before chunks were
// rounded to n instead of 64, i.e. with the default — they measure the A/B noise instead.)
int dec_min_chunk() {
  static const int c = [] {
    const int v = env_int("PERRY_DECODE_ATTN_MIN_CHUNK", kDecMinChunk, 16, kDecMinChunk);
    if (v % 16 != 0) throw Error("PERRY_DECODE_ATTN_MIN_CHUNK must be a multiple of 16, got " + std::to_string(v));
    return v;
  }();
  return c;
}

int dec_stride(int hd) { return (hd + 7) / 8 * 8 + 8; }  // bf16 elements per shared K/V row
size_t dec_smem_bytes(int G, int hd) {
  return size_t(2) * kDecTile * dec_stride(hd) * 2 +
         (size_t(2) * G * hd + size_t(G) * kDecTile + size_t(3) * G) * sizeof(float);
}

__device__ float block_reduce(float v, bool is_max, float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.f);
    x = is_max ? warp_max(x) : warp_sum(x);
    if (lane == 0) red[32] = x;
  }
  __syncthreads();
  const float r = red[32];
  __syncthreads();  // red is reused by the next call
  return r;
}

// Combine kernel: block (q head, sequence). out = Σ_c acc_c·2^(m_c − M) / Σ_c l_c·2^(m_c − M)
// over the chunks the partial kernel wrote (blocks past a sequence's context exit at once).
template <bool kTimeline>  // kTimeline: the lab's instantiation (lab_timeline.h)
__global__ void __launch_bounds__(kDecThreads)
    decode_combine_kernel(const AttnSeq* __restrict__ seqs, int nh, int hd, int capacity, int chunk,
                          int nchunks, const float* __restrict__ ws_acc,
                          const float* __restrict__ ws_ml, float* __restrict__ out, TimelineLog* timeline) {
  extern __shared__ float w[];  // [nchunks] chunk weights
  __shared__ float red[33];
  lab_timeline::BlockMarks<kTimeline> marks{timeline};  // lab only (lab_timeline.h)
  marks.start();
  // The trigger comes before the wait here, unlike every other decode kernel (pdl.cuh): the next
  // kernel is the o projection, whose blocks then become resident while the partial kernel still
  // runs and stream o's weights into their rings during attention, when HBM is otherwise idle (a
  // decode step's attention reads a few KB of cache per head). Safe: o's own wait still waits for
  // this grid to complete, and every block of this grid and of the partial kernel is resident
  // before o's first block is scheduled.
  pdl::launch_dependents();
  pdl::wait();
  marks.waited();
  const AttnSeq sq = seqs[blockIdx.y];
  const int h = blockIdx.x;
  const int kv_len = min(sq.pos0 + 1, capacity);
  const int nc = min((kv_len + chunk - 1) / chunk, nchunks);
  const size_t part0 = ((size_t)blockIdx.y * nh + h) * nchunks;
  const float* ml = ws_ml + part0 * 2;
  const float* acc = ws_acc + part0 * hd;
  float* dst = out + (size_t)sq.q_row * nh * hd + (size_t)h * hd;
  if (nc <= 32) {
    // The first kPre chunks' values of this thread's first dim, loaded now: they then arrive with
    // (m, l) in one L2 round trip instead of one trip a chunk (the FMA chain below waits for each
    // load in turn).
    constexpr int kPre = 4;
    float pre[kPre];
#pragma unroll
    for (int c = 0; c < kPre; ++c) pre[c] = c < nc && int(threadIdx.x) < hd ? acc[(size_t)c * hd + threadIdx.x] : 0.f;
    // Up to 32 chunks (a decode step's few hundred positions: 2-8): every warp merges them
    // itself, lane c holding chunk c's (m, l) and weight — shuffles, no block barriers.
    const int lane = threadIdx.x & 31;
    const float mc = lane < nc ? ml[2 * lane] : -INFINITY;
    const float lc = lane < nc ? ml[2 * lane + 1] : 0.f;
    const float mx = warp_max(mc);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float wc = lane < nc ? exp2f(mc - base) : 0.f;
    const float inv = 1.f / warp_sum(lc * wc);
    // Warp-uniform rounds (the shuffles need every lane): lane d0 + lane's dim where it is < hd.
    const int first = int(threadIdx.x) - lane;
    for (int d0 = first; d0 < hd; d0 += blockDim.x) {
      const int d = d0 + lane;
      const bool live = d < hd;
      float a = 0.f;
      int c = 0;
      if (d0 == first) {  // (pre holds dim threadIdx.x: this round's)
#pragma unroll
        for (; c < kPre; ++c) {
          const float wt = __shfl_sync(0xffffffffu, wc, c);
          if (c < nc) a = fmaf(wt, pre[c], a);
        }
        c = min(nc, kPre);
      }
      for (; c < nc; ++c) {
        const float wt = __shfl_sync(0xffffffffu, wc, c);
        if (live) a = fmaf(wt, acc[(size_t)c * hd + d], a);
      }
      if (live) dst[d] = a * inv;
    }
    marks.input();
    return marks.finish(TimelineKernel::AttentionCombine, 0);
  }
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < nc; c += blockDim.x) mx = fmaxf(mx, ml[2 * c]);
  mx = block_reduce(mx, true, red);
  const float base = mx == -INFINITY ? 0.f : mx;
  float lsum = 0.f;
  for (int c = threadIdx.x; c < nc; c += blockDim.x) {
    const float wc = exp2f(ml[2 * c] - base);
    w[c] = wc;
    lsum = fmaf(ml[2 * c + 1], wc, lsum);  // explicit fma: the rounding does not depend on contraction
  }
  lsum = block_reduce(lsum, false, red);  // its barriers also publish w[]
  const float inv = 1.f / lsum;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.f;
    for (int c = 0; c < nc; ++c) a = fmaf(w[c], acc[(size_t)c * hd + d], a);
    dst[d] = a * inv;
  }
  marks.input();
  marks.finish(TimelineKernel::AttentionCombine, 0);
}

// kVec: hd % 8 == 0 (16-byte rows: cp.async and 8-wide shared loads); kTimeline: the lab's
// instantiation (lab_timeline.h).
template <bool kVec, bool kTimeline>
__global__ void __launch_bounds__(kPartThreads)
    decode_partial_kernel(const float* __restrict__ q, const AttnSeq* __restrict__ seqs,
                          const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh,
                          int nkv, int hd, int capacity, int chunk, int nchunks, float scale_log2,
                          float* __restrict__ ws_acc, float* __restrict__ ws_ml, TimelineLog* timeline) {
  extern __shared__ __align__(16) unsigned char dsm[];
  lab_timeline::BlockMarks<kTimeline> marks{timeline};  // lab only (lab_timeline.h)
  marks.start();
  // Before the PDL wait: the sequence and (kVec) the copies of the chunk's first K/V tile, except
  // the row at pos0 — the kernel just before this one (q|k|v's epilogue, rope_append_qkv or
  // kv_cache_append) appends that row and q; every older row was written by kernels that had
  // completed before it passed its own wait (pdl.cuh), and the sequences come from the host. The
  // tile's fetch then overlaps the previous kernel instead of heading this block's chain (~6 µs
  // of work after the wait at ~150 positions: s16 timeline).
  const int G = nh / nkv, hdp = (hd + 7) / 8 * 8 + 8;
  const AttnSeq sq = seqs[blockIdx.z];
  const int kvh = blockIdx.y, c = blockIdx.x;
  const int kv_len = min(sq.pos0 + 1, capacity);
  const int j_begin = c * chunk;
  if (j_begin >= kv_len) {  // uniform for the block (the wait first: pdl.cuh's rule for early returns)
    pdl::wait();
    marks.waited();
    return marks.finish(TimelineKernel::AttentionPartial, 0);
  }
  const int j_end = min(j_begin + chunk, kv_len);

  uint16_t* ks = reinterpret_cast<uint16_t*>(dsm);
  uint16_t* vs = ks + kDecTile * hdp;
  float* qs = reinterpret_cast<float*>(vs + kDecTile * hdp);  // [G][hd], 16-byte aligned
  float* os = qs + G * hd;                                    // [G][hd]
  float* ps = os + G * hd;                                    // [G][64]
  float* ms = ps + G * kDecTile;                              // [G] running max
  float* ls = ms + G;                                         // [G] running sum
  float* as = ls + G;                                         // [G] this tile's rescale factor

  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * hd;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;
  const float* qg = q + (size_t)sq.q_row * nh * hd + (size_t)kvh * G * hd;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // kVec: the copies of tile k0's rows (zero-filled past its nk keys) — those other than the newest
  // row (at pos0), that row alone, or all of them.
  enum class Rows { Old, Newest, All };
  auto copy_tile = [&](int k0, int nk, Rows which) {
    const int cpr = hd / 8;
    for (int e = tid; e < kDecTile * cpr; e += kPartThreads) {
      const int r = e / cpr, col = (e - r * cpr) * 8;
      if (which != Rows::All && (k0 + r == sq.pos0) != (which == Rows::Newest)) continue;
      const bool ok = r < nk;
      const size_t off = ok ? (size_t)(k0 + r) * hd + col : 0;
      cp_async16(ks + r * hdp + col, kg + off, ok ? 16 : 0);
      cp_async16(vs + r * hdp + col, vg + off, ok ? 16 : 0);
    }
  };
  if constexpr (kVec) copy_tile(j_begin, min(kDecTile, j_end - j_begin), Rows::Old);
  pdl::wait();
  pdl::launch_dependents();
  marks.waited();
  if constexpr (kVec) copy_tile(j_begin, min(kDecTile, j_end - j_begin), Rows::Newest);
  for (int e = tid; e < G * hd; e += kPartThreads) {
    qs[e] = qg[e];
    os[e] = 0.f;
  }
  for (int g = tid; g < G; g += kPartThreads) {
    ms[g] = -INFINITY;
    ls[g] = 0.f;
  }

  for (int k0 = j_begin; k0 < j_end; k0 += kDecTile) {
    const int nk = min(kDecTile, j_end - k0);  // >= 1
    if constexpr (kVec) {
      if (k0 != j_begin) copy_tile(k0, nk, Rows::All);  // (the first tile's copies were issued above)
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      for (int e = tid; e < kDecTile * hd; e += kPartThreads) {
        const int r = e / hd, d = e - r * hd;
        const bool ok = r < nk;
        ks[r * hdp + d] = ok ? kg[(size_t)(k0 + r) * hd + d] : uint16_t(0);
        vs[r * hdp + d] = ok ? vg[(size_t)(k0 + r) * hd + d] : uint16_t(0);
      }
    }
    __syncthreads();  // K/V tile (and, first time, qs/os/ms/ls) visible

    for (int idx = tid; idx < G * kDecTile; idx += kPartThreads) {
      const int g = idx / kDecTile, j = idx - g * kDecTile;
      float sc = -INFINITY;
      if (j < nk) {
        const float* qv = qs + g * hd;
        const uint16_t* kr = ks + j * hdp;
        float dot = 0.f;
        if constexpr (kVec) {
          // Row stride hdp·2 bytes ≡ 16 (mod 128): 8 lanes' 16-byte loads hit distinct banks.
          // Four partial sums (dims ≡ 0..3 mod 4): a chain of hd / 4 FMAs instead of hd.
          float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
#pragma unroll 4
          for (int d = 0; d < hd; d += 8) {
            const uint4 kk = *reinterpret_cast<const uint4*>(kr + d);
            const float4 q0 = *reinterpret_cast<const float4*>(qv + d);
            const float4 q1 = *reinterpret_cast<const float4*>(qv + d + 4);
            d0 = fmaf(q0.x, bf16_lo(kk.x), d0);
            d1 = fmaf(q0.y, bf16_hi(kk.x), d1);
            d2 = fmaf(q0.z, bf16_lo(kk.y), d2);
            d3 = fmaf(q0.w, bf16_hi(kk.y), d3);
            d0 = fmaf(q1.x, bf16_lo(kk.z), d0);
            d1 = fmaf(q1.y, bf16_hi(kk.z), d1);
            d2 = fmaf(q1.z, bf16_lo(kk.w), d2);
            d3 = fmaf(q1.w, bf16_hi(kk.w), d3);
          }
          dot = (d0 + d1) + (d2 + d3);
        } else {
          for (int d = 0; d < hd; ++d) dot = fmaf(qv[d], bf16_to_float(kr[d]), dot);
        }
        sc = dot * scale_log2;
      }
      ps[idx] = sc;
    }
    __syncthreads();

    for (int g = warp; g < G; g += kPartThreads / 32) {
      float* pr = ps + g * kDecTile;
      const float s0 = pr[lane], s1 = pr[lane + 32];
      const float m_old = ms[g];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));  // finite: key k0 is valid
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float p0 = exp2f(s0 - base), p1 = exp2f(s1 - base);
      pr[lane] = p0;
      pr[lane + 32] = p1;
      const float sum = warp_sum(p0 + p1);
      if (lane == 0) {
        const float alpha = exp2f(m_old - base);
        as[g] = alpha;
        ls[g] = ls[g] * alpha + sum;
        ms[g] = m_new;
      }
    }
    __syncthreads();

    if constexpr (kVec) {  // dim pairs: one bf16x2 load of V per two FMAs
      // The whole tile, a constant trip count: past nk the weights are 0 (scores −inf) and the V
      // rows zero-filled by copy_tile, so those terms add exact zeros. Even and odd keys in two
      // sums: chains of 32 FMAs.
      const int hp = hd / 2;
      for (int idx = tid; idx < G * hp; idx += kPartThreads) {
        const int g = idx / hp, d = (idx - g * hp) * 2;
        const float* pr = ps + g * kDecTile;
        const float alpha = as[g];
        float a0 = os[g * hd + d] * alpha, a1 = os[g * hd + d + 1] * alpha, b0 = 0.f, b1 = 0.f;
#pragma unroll 8
        for (int j = 0; j < kDecTile; j += 2) {
          const float2 p = *reinterpret_cast<const float2*>(pr + j);
          const uint32_t va = *reinterpret_cast<const uint32_t*>(vs + j * hdp + d);
          const uint32_t vb = *reinterpret_cast<const uint32_t*>(vs + (j + 1) * hdp + d);
          a0 = fmaf(p.x, bf16_lo(va), a0);
          a1 = fmaf(p.x, bf16_hi(va), a1);
          b0 = fmaf(p.y, bf16_lo(vb), b0);
          b1 = fmaf(p.y, bf16_hi(vb), b1);
        }
        os[g * hd + d] = a0 + b0;
        os[g * hd + d + 1] = a1 + b1;
      }
    } else {
      for (int idx = tid; idx < G * hd; idx += kPartThreads) {
        const int g = idx / hd, d = idx - g * hd;
        const float* pr = ps + g * kDecTile;
        float a = os[idx] * as[g];
        for (int j = 0; j < nk; ++j) a = fmaf(pr[j], bf16_to_float(vs[j * hdp + d]), a);
        os[idx] = a;
      }
    }
    __syncthreads();  // before the next tile overwrites ks / vs / ps
  }

  // Workspace: acc [n_seqs][nh][nchunks][hd], ml [n_seqs][nh][nchunks][2].
  const size_t part0 = ((size_t)blockIdx.z * nh + (size_t)kvh * G) * nchunks + c;  // head g = 0
  for (int idx = tid; idx < G * hd; idx += kPartThreads) {
    const int g = idx / hd, d = idx - g * hd;
    ws_acc[(part0 + (size_t)g * nchunks) * hd + d] = os[idx];
  }
  for (int g = tid; g < G; g += kPartThreads) {
    ws_ml[(part0 + (size_t)g * nchunks) * 2 + 0] = ms[g];
    ws_ml[(part0 + (size_t)g * nchunks) * 2 + 1] = ls[g];
  }
  marks.input();
  marks.finish(TimelineKernel::AttentionPartial, 0);
}

// ---------------------------------------------------------------- q/k/v preparation (prefill, decode)
// Block (head group, row): 8 warps, one head each — q heads [0, nh), then k heads [nh, nh+nkv)
// (whose warp also copies the v head of the same index). Per head: the optional RMSNorm (sum of
// squares in double over the warp, like head_rms_norm), RoPE on the pairs (i, i + hd/2) each lane
// owns (like rope_apply: separate roundings), then q back in place / k, v into the cache as bf16.
constexpr int kPrepWarps = 8;
namespace ew = elementwise_detail;  // load / store_f32 / store_bf16 of V consecutive values

// Element i of a q|k|v row as a float: fp32 (rounded to bf16 first when `round`: the values of a
// projection that wrote bf16) or bf16 bits, widened exactly.
template <typename T>
__device__ __forceinline__ float qkv_value(const T* x, int i, bool round) {
  if constexpr (std::is_same_v<T, float>) return round ? ew::bf16_round(x[i]) : x[i];
  else return __uint_as_float(uint32_t(x[i]) << 16);
}

// One rotation pair (i, i + half) of head x: normalized (nw) and rotated; NaN where the position
// is outside the RoPE table.
template <typename T>
__device__ __forceinline__ void rope_one(const T* x, bool round, int i, int half, const float* nw, float inv,
                                         bool rope_ok, const RopeTableView& rope, int pos, float& ra, float& rb) {
  float a = qkv_value(x, i, round), b = qkv_value(x, i + half, round);
  if (nw) a = norm_one(a, inv, nw[i]), b = norm_one(b, inv, nw[i + half]);
  if (rope_ok) {
    rope_rotate(a, b, rope.cos[(long long)pos * half + i], rope.sin[(long long)pos * half + i], ra, rb);
  } else {
    ra = rb = __int_as_float(0x7fc00000);
  }
}

// kPairs = 2: each lane handles two adjacent pairs with paired loads and stores (hd % 4 == 0 and
// an even row stride; the launch checks); the same arithmetic per element as kPairs = 1.
// T: float (q written back as fp32; round: inputs rounded to bf16 first) or uint16_t (bf16 q|k|v,
// q written back as bf16 — the bits attention's own fp32 → bf16 conversion of q would give).
template <int kPairs, typename T>
__global__ void __launch_bounds__(kPrepWarps * 32)
    rope_append_qkv_kernel(T* qkv, long long row_stride, bool round, const AttnSeq* __restrict__ seqs, int n_seqs,
                           int nh, int nkv, int hd, const float* __restrict__ q_norm,
                           const float* __restrict__ k_norm, float eps, RopeTableView rope, int capacity,
                           uint16_t* __restrict__ kc, uint16_t* __restrict__ vc) {
  pdl::wait();
  pdl::launch_dependents();
  const int row = blockIdx.y, lane = threadIdx.x & 31;
  const int h = blockIdx.x * kPrepWarps + (threadIdx.x >> 5);
  if (h >= nh + nkv) return;  // whole warp; no block barriers below
  int pos = -1, slot = -1;
  for (int i = 0; i < n_seqs; ++i) {
    const AttnSeq s = seqs[i];
    if (row >= s.q_row && row < s.q_row + s.n_new) pos = s.pos0 + (row - s.q_row), slot = s.slot;
  }
  if (slot < 0) return;  // a row of no sequence
  const bool is_q = h < nh;
  T* x = qkv + row * row_stride + (long long)h * hd;  // k heads follow the q heads
  const float* nw = is_q ? q_norm : k_norm;
  float inv = 1.0f;
  if (nw) {
    double ss = 0.0;
    for (int i = lane; i < hd; i += 32) {
      const double xi = qkv_value(x, i, round);
      ss += xi * xi;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    inv = float(1.0 / sqrt(ss / double(hd) + double(eps)));
  }
  const int half = hd / 2;
  const bool rope_ok = pos >= 0 && pos < rope.max_pos;
  const bool store = !is_q && pos >= 0 && pos < capacity;
  const size_t cache_off = (((size_t)slot * nkv + (h - nh)) * capacity + (size_t)max(pos, 0)) * hd;
  for (int i = lane * kPairs; i < half; i += 32 * kPairs) {
    float ra[kPairs], rb[kPairs];
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
      rope_one(x, round, i + p, half, nw, inv, rope_ok, rope, pos, ra[p], rb[p]);
    if (is_q) {
      if constexpr (std::is_same_v<T, float>) {
        ew::store_f32<kPairs>(x + i, ra);
        ew::store_f32<kPairs>(x + i + half, rb);
      } else {
        ew::store_bf16<kPairs>(x + i, ra);
        ew::store_bf16<kPairs>(x + i + half, rb);
      }
    } else if (store) {
      ew::store_bf16<kPairs>(kc + cache_off + i, ra);
      ew::store_bf16<kPairs>(kc + cache_off + i + half, rb);
    }
  }
  if (store) {
    const T* v = x + (long long)nkv * hd;  // v head h - nh
    for (int d = lane * kPairs; d < hd; d += 32 * kPairs) {
      float t[kPairs];
      ew::load<kPairs>(v + d, t);  // (fp32 → bf16 once at the store: the rounded value either way)
      ew::store_bf16<kPairs>(vc + cache_off + d, t);
    }
  }
}

// One instantiation's launch, with its own shared-memory opt-in state.
template <bool kVec, bool kTimeline, typename... Args>
void launch_partial(dim3 grid, size_t smem, cudaStream_t stream, Args... args) {
  static int current = 0;
  static std::mutex mu;
  ensure_smem(reinterpret_cast<const void*>(decode_partial_kernel<kVec, kTimeline>), smem, &current, &mu,
              "attention_decode_partial");
  pdl::launch("attention_decode_partial", decode_partial_kernel<kVec, kTimeline>, grid, dim3(kPartThreads), smem, stream,
              args...);
}

}  // namespace

void attention_decode_set_lab_timeline(TimelineLog* log) { lab_timeline::install_timeline(log); }

int attention_decode_chunk(int n_seqs, int max_ctx) {
  // Aim at ~kDecTargetParts (sequence, chunk) pairs per kv head: enough blocks to fill an H200
  // even for one sequence, few enough that the combine pass and workspace stay small.
  const long long want = ((long long)std::max(n_seqs, 1) * std::max(max_ctx, 1) +
                          kDecTargetParts - 1) / kDecTargetParts;
  const long long m = dec_min_chunk();
  const long long c = std::max<long long>(m, (want + m - 1) / m * m);
  return int(std::min<long long>(c, 1 << 30));
}

size_t attention_decode_workspace_bytes(int n_seqs, int nh, int hd, int max_ctx) {
  if (n_seqs <= 0 || nh <= 0 || hd <= 0 || max_ctx <= 0) return 0;
  // Bound on n_seqs·nchunks that is monotone in n_seqs and max_ctx (so one allocation for the
  // largest batch serves every smaller call): chunk >= m = dec_min_chunk() gives nchunks <= ceil(ctx/m), and
  // chunk >= n·ctx/1024 gives nchunks < 1024/n + 1.
  const size_t n = size_t(n_seqs);
  const size_t parts = std::min(n * ((size_t(max_ctx) + dec_min_chunk() - 1) / dec_min_chunk()),
                                size_t(kDecTargetParts) + n);
  return parts * size_t(nh) * (size_t(hd) + 2) * sizeof(float);
}

void attention_decode(const float* q, const AttnSeq* d_seqs, int n_seqs, int max_ctx,
                      const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd,
                      int capacity, float scale, float* out, float* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "attention_decode";
  check_heads(fn, nh, nkv, hd, capacity);
  check_batch(fn, d_seqs, n_seqs);
  check_cache(fn, k_cache, v_cache);
  PERRY_CHECK(max_ctx >= 0, "{}: max_ctx {} must be non-negative", fn, max_ctx);
  PERRY_CHECK(nh <= 65535, "{}: n_heads {} exceeds the grid limit 65535", fn, nh);
  if (n_seqs == 0 || max_ctx == 0) return;
  PERRY_CHECK(q && out && workspace, "{}: null q, out or workspace pointer", fn);
  const int ctx = std::min(max_ctx, capacity);  // no sequence reads past the capacity
  const int chunk = attention_decode_chunk(n_seqs, ctx);
  const int nchunks = (ctx + chunk - 1) / chunk;
  const size_t parts = size_t(n_seqs) * nh * nchunks;
  const size_t need = parts * (size_t(hd) + 2) * sizeof(float);
  PERRY_CHECK(workspace_bytes >= need,
              "{}: workspace of {} bytes is too small, need {} "
              "(attention_decode_workspace_bytes)", fn, workspace_bytes, need);
  PERRY_CHECK(aligned(workspace, 4), "{}: workspace must be 4-byte aligned", fn);
  float* ws_acc = workspace;
  float* ws_ml = workspace + parts * hd;
  const float scale_log2 = scale * kLog2e;
  const int G = nh / nkv;
  const size_t smem = dec_smem_bytes(G, hd);
  const dim3 grid(nchunks, nkv, n_seqs);
  TimelineLog* const tl = lab_timeline::installed_log();
  // One of the four instantiations (kVec: hd % 8 == 0; kTimeline: a log installed).
  auto partial = [&](auto vec, auto timed) {
    launch_partial<decltype(vec)::value, decltype(timed)::value>(grid, smem, stream, q, d_seqs, k_cache, v_cache, nh,
                                                                 nkv, hd, capacity, chunk, nchunks, scale_log2, ws_acc,
                                                                 ws_ml, tl);
  };
  using std::false_type, std::true_type;
  if (hd % 8 == 0) tl ? partial(true_type{}, true_type{}) : partial(true_type{}, false_type{});
  else tl ? partial(false_type{}, true_type{}) : partial(false_type{}, false_type{});
  pdl::launch("attention_decode_combine", tl ? decode_combine_kernel<true> : decode_combine_kernel<false>,
              dim3(nh, n_seqs), dim3(kDecThreads), nchunks * sizeof(float), stream, d_seqs, nh, hd, capacity, chunk,
              nchunks, ws_acc, ws_ml, out, tl);
}

namespace {
template <typename T>
void launch_rope_append_qkv(T* qkv, int64_t row_stride, bool round, const AttnSeq* d_seqs, int n_seqs, int M, int nh,
                            int nkv, int hd, const float* q_norm, const float* k_norm, float eps, RopeTableView rope,
                            int capacity, uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  const char* fn = std::is_same_v<T, float> ? "rope_append_qkv" : "rope_append_qkv(bf16 q|k|v)";
  check_heads(fn, nh, nkv, hd, capacity);
  check_batch(fn, d_seqs, n_seqs);
  check_cache(fn, k_cache, v_cache);
  PERRY_CHECK(M >= 0 && M <= 65535, "{}: M {} must be in [0, 65535]", fn, M);
  PERRY_CHECK(hd % 2 == 0 && rope.head_dim == hd, "{}: RoPE table head_dim {} does not match head_dim {}", fn,
              rope.head_dim, hd);
  PERRY_CHECK(row_stride >= int64_t(nh + 2 * nkv) * hd, "{}: row stride {} is narrower than q|k|v", fn, row_stride);
  PERRY_CHECK((q_norm == nullptr) == (k_norm == nullptr), "{}: give both q and k norm weights or neither", fn);
  if (M == 0 || n_seqs == 0) return;
  PERRY_CHECK(qkv && rope.cos && rope.sin, "{}: null qkv or RoPE table", fn);
  const dim3 grid((nh + nkv + kPrepWarps - 1) / kPrepWarps, M);
  // Pairs of elements a lane: paired accesses need hd % 4 == 0 (half even), an even row stride
  // and qkv aligned to two elements (the caches are 16-byte aligned, positions a multiple of hd).
  const bool pairs = hd % 4 == 0 && row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(qkv) % (2 * sizeof(T)) == 0;
  if (pairs)
    pdl::launch(fn, rope_append_qkv_kernel<2, T>, grid, dim3(kPrepWarps * 32), 0, stream, qkv, (long long)row_stride,
                round, d_seqs, n_seqs, nh, nkv, hd, q_norm, k_norm, eps, rope, capacity, k_cache, v_cache);
  else
    pdl::launch(fn, rope_append_qkv_kernel<1, T>, grid, dim3(kPrepWarps * 32), 0, stream, qkv, (long long)row_stride,
                round, d_seqs, n_seqs, nh, nkv, hd, q_norm, k_norm, eps, rope, capacity, k_cache, v_cache);
}
}  // namespace

void rope_append_qkv(float* qkv, int64_t row_stride, const AttnSeq* d_seqs, int n_seqs, int M, int nh, int nkv,
                     int hd, const float* q_norm, const float* k_norm, float eps, RopeTableView rope, int capacity,
                     uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream, bool round_to_bf16) {
  launch_rope_append_qkv(qkv, row_stride, round_to_bf16, d_seqs, n_seqs, M, nh, nkv, hd, q_norm, k_norm, eps, rope,
                         capacity, k_cache, v_cache, stream);
}
void rope_append_qkv(uint16_t* qkv_bf16, int64_t row_stride, const AttnSeq* d_seqs, int n_seqs, int M, int nh,
                     int nkv, int hd, const float* q_norm, const float* k_norm, float eps, RopeTableView rope,
                     int capacity, uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  launch_rope_append_qkv(qkv_bf16, row_stride, false, d_seqs, n_seqs, M, nh, nkv, hd, q_norm, k_norm, eps, rope,
                         capacity, k_cache, v_cache, stream);
}

}  // namespace perry::cuda
