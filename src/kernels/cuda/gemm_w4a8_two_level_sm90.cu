// sm_90a gemm_w4a8_two_level_wgmma (gemm_w4a8_two_level.h): w4a8-g128 with two-level group scales
// as one per-channel int8 GEMM, the int4 → int8 conversion in registers (wgmma with A from
// registers). Design notes and measurements: docs/cuda-gemm-w8a8-sm90.md, "Thirtieth session".
//
// Why: with scales c[n]·m[n,g] the codes q4·m are int8 codes of the channel scale (|q4·m| <= 126),
// so the grouped layer needs no per-group fold. The twenty-ninth session ran that as
// expand_int4_weight_two_level (a pass over the whole weight: 0.5 B read, 1 B written per weight)
// followed by gemm_w8a8_wgmma — the pass was 5-30% of the layer. Here the kernel reads the packed
// weight (0.5 B per weight from L2/HBM) and converts in the consumer warps, so the pass is gone and
// the weight tile's shared-memory reads by wgmma too (A is in registers).
//
//   * Swapped operands (as gemm_quant_sm90's grouped modes): the weight tile is wgmma's A operand
//     (accumulator rows = output columns n), the activation tile its B operand (accumulator
//     columns = tokens m). Tile: 128 weight rows (two consumer warpgroups of 64) × kBX tokens (128,
//     160, 192, 224 or 256: m64nBXk32, the width that fills the SMs' waves best: tile_tokens),
//     128 k a stage = one group.
//   * Producer warp 0 (one thread): TMA loads of the X tile [kBX × 128 B] (128-byte swizzle, the
//     wgmma B layout) and of the packed weight tile [128 rows × 64 B] with the 64-byte swizzle,
//     which makes the consumers' 32-bit reads conflict-free (16-byte chunk j of row r lands at
//     chunk j ^ ((r / 2) % 4); the 8 rows a warp reads per load then hit 8 different chunks of the
//     two 64-byte row parities: 16 banks, each read by two lanes at one address).
//   * Consumers: per k32 step a thread's A fragment is rows r, r+8 × k 4tq..+3 and 16+4tq..+3
//     (tq = lane % 4), i.e. packed bytes 2tq, 2tq+1 and 8+2tq, 9+2tq of the row's 16-byte chunk:
//     two 32-bit loads a row and one byte permute select them. The nibbles become q·m bytes four
//     at a time: t = nibble ^ 8 (so q = t − 8) in each byte, then one 32-bit IMAD
//     t·m + (128 − 8m)·0x01010101 whose every byte is q·m + 128 — in [0, 255] whenever
//     q·m >= −128 (a model's codes are −7..7, QuantizedWeight::validate, and m <= 18: |q·m| <= 126),
//     so the packed sum is exactly those bytes whatever carries its partial terms make — and an
//     XOR of 0x80 a byte gives the two's-complement code. Two IMADs, two permutes back into k
//     order and two XORs give 8 codes of a row: 10 integer instructions a row and k32 step (the
//     thirtieth session's 16-bit lanes took 17; s32-1/3 measured the two in one binary).
//   * Pipelining: two register sets of A fragments (a stage's 4 k32 steps × 4 registers each);
//     stage s+1 is converted into one while stage s's wgmmas (reading the other) run; the
//     wait_group 1 after issuing stage s completes stage s−1, whose set and shared-memory slot
//     are then free. The fragments are pinned (fence_frag) past that wait, so ptxas keeps them
//     live while the asynchronous wgmma may still read them.
//   * Epilogue: y[m, n] = float(acc)·(sa[m]·c[n]) + bias[n], the expression of gemm_w8a8_wgmma
//     (the expanded path's bits), written to shared memory in 32-token chunks and sent by TMA
//     stores from a 32 KiB ring a warpgroup, so the tile's outputs drain under the next tile's
//     MMAs (direct stores from registers remain for rows that are not 16-byte multiples).
//   * Persistent grid, grouped tile order, TMA zero fill at the M / N edges (a zero nibble byte
//     becomes q = 0 whatever m is, so rows past N may read any row's multipliers).
//   * Split-K (short prompts, thirty-ninth session; make_plan): units of (tile, k-range); the
//     tile's last unit to finish adds the others' int32 sums from the workspace and stores the tile
//     (splitk_last_adds), so the outputs are the unsplit kernel's bits. Where the tiles fill whole
//     waves and a partial one (fortieth session), only the partial wave's tiles are split: the
//     first `whole` units are whole tiles, and each SM ends with at most one split unit.
// No deadlock by construction: per use of a stage, full gets 1 arrive.expect_tx (X + packed
// weight bytes), empty 8 consumer-warp arrives; producer and consumers walk the same
// (unit, k-stage) sequence; split-K's last unit waits only for units that have finished their MMAs.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_w4a8_two_level.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/mma_sync_common.cuh"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kWRows = 128;  // weight rows (output columns n) a tile: two consumer warpgroups × 64
constexpr int kBK = 128;     // k a stage: one g128 group (one multiplier a row)
constexpr int kGroupTiles = 8;

constexpr int kOutTokens = 32;  // tokens an output chunk (the TMA store epilogue)
constexpr int kOutRing = 32 * 1024;  // a consumer warpgroup's ring of output chunks: 4 fp32 or 8 bf16

template <int kBX>
struct TwoLevelCfg {
  static constexpr int kThreads = 384;
  static constexpr int kTileX = kBX * kBK;         // int8 activations, 128-byte swizzle
  static constexpr int kTileP = kWRows * kBK / 2;  // packed int4 weights, 64-byte swizzle (8 KiB)
  static constexpr int kStageBytes = kTileX + kTileP;
  static constexpr int kOutBytes = 2 * kOutRing;  // the two consumer warpgroups' output rings
  static constexpr int kFit = (224 * 1024 - kOutBytes) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;  // 256 tokens: 4 × 40 KiB; 224: 4; 192, 160: 5; 128: 6
  static_assert(kBX % 32 == 0 && kBX >= 128 && kBX <= 256, "tile widths: 128-256 tokens in output chunks of 32");
  // + barriers, split-K's role words (two a consumer warpgroup), alignment
  static constexpr int kSmemBytes = kStages * kStageBytes + kOutBytes + 2 * kStages * 8 + 16 + 1024;
  static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");
};

#ifdef PERRY_WGMMA
using mma_sync::pack_bf16x2;
using mma_sync::int4_times_m;  // (mma_sync_common.cuh: shared with gemm_small_m_wgmma)

// Four 8 × 8 b16 blocks from their mma fragments (register i: block i), each stored transposed:
// lane 8i + k gives the shared address of block i's stored row k (16 bytes).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Keeps a register set in program order here (see the file comment: live until its wgmmas are
// known complete).
template <int R>
__device__ __forceinline__ void fence_frag(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// The k32 step kk of a stage: its four A-fragment registers of `a`.
template <int kBX>
__device__ __forceinline__ void wgmma_step(int (&d)[kBX / 2], const uint32_t (&a)[16], int kk, uint64_t db,
                                           int accumulate) {
  sm90::wgmma_rs<kBX>(d, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3], db, accumulate);
}

// Split-K's fixup, per consumer warpgroup cw of split tile t (numbered from the first split tile),
// with acc its int32 sums over its split's k-stages. The warpgroups of a tile's splits arrive in some order (flags[4t + 2cw], an atomic
// add by the warpgroup's first thread, shared through a role word): every one but the last writes
// its sums to the workspace slot of its arrival order and counts its 4 warps on flags[4t + 2cw + 1]
// (release); the last waits for those 4·(splits − 1) counts (acquire), resets both counters (the
// caller zeroes them once; every call leaves them zero), adds the slots into acc (int32: exact in
// any order, so the unsplit kernel's bits) and returns true: it stores the tile. No deadlock
// whatever the residency: a warpgroup waits only for warpgroups that have already arrived, i.e.
// finished their MMAs, and they owe nothing but their stores. The role is per warpgroup, not per
// warp, because the TMA-store epilogue synchronizes the warpgroup's four warps. A slot is [8 warps]
// [kBX/2 registers][32 lanes] int32 (each register's stores are 128 contiguous bytes), one tile of
// int32; a tile has splits − 1 slots.
template <int kBX>
__device__ __forceinline__ bool splitk_last_adds(int (&acc)[kBX / 2], int t, int splits, int cw, int warp, int lane,
                                                 int* __restrict__ part, unsigned* __restrict__ flags,
                                                 volatile unsigned* role_words, uint32_t nu) {
  constexpr int kVals = kBX / 2;
  unsigned* const arrived = flags + 4 * size_t(t) + 2 * cw;
  unsigned* const written = arrived + 1;
  const bool leader = (threadIdx.x & 127) == 0;
  // (two words by unit parity: a warp still reading unit nu's word cannot see unit nu + 1's, which
  // its leader writes only after this warp has passed the next unit's barrier)
  volatile unsigned* const word = role_words + 2 * cw + (nu & 1);
  if (leader) *word = atomicAdd(arrived, 1u);
  sm90::named_barrier(1 + cw, 128);
  const unsigned order = *word;
  const int wpos = cw * 4 + warp;
  auto slot = [&](unsigned i) {
    return part + ((size_t(t) * size_t(splits - 1) + i) * 8 + size_t(wpos)) * size_t(kVals * 32) + lane;
  };
  if (order + 1 < unsigned(splits)) {
    int* const mine = slot(order);
#pragma unroll
    for (int i = 0; i < kVals; ++i) __stcg(mine + 32 * i, acc[i]);
    __syncwarp();  // (orders the lanes' stores before lane 0's release)
    if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(written) : "memory");
    return false;
  }
  if (leader) {
    const unsigned want = 4u * unsigned(splits - 1);
    unsigned n = 0;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(n) : "l"(written) : "memory");
      if (n >= want) break;
      __nanosleep(64);
    }
    *arrived = 0u;
    *written = 0u;
  }
  sm90::named_barrier(1 + cw, 128);  // (orders the warpgroup's loads after the leader's acquire)
  for (int v = 0; v + 1 < splits; ++v) {
    const int* const p = slot(unsigned(v));
#pragma unroll
    for (int i = 0; i < kVals; ++i) acc[i] += __ldcg(p + 32 * i);
  }
  return true;
}
#endif  // PERRY_WGMMA

// kOut: 0 bf16, 1 f32, 2 i32.
template <int kBX, int kOut>
__global__ void __launch_bounds__(384, 1)
    gemm_w4a8_two_level_kernel(const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmW,
                               const __grid_constant__ CUtensorMap tmY, int tma_out,
                               const float* __restrict__ Sa, const int8_t* __restrict__ Mult,
                               const float* __restrict__ Cn, const float* __restrict__ bias, void* __restrict__ Y,
                               int M, int N, int K, int lab, int whole, int splits, int kt_per,
                               int* __restrict__ part, unsigned* __restrict__ flags) {
#ifdef PERRY_WGMMA
  using C = TwoLevelCfg<kBX>;
  constexpr int S = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint8_t* const gbase = smem_raw + (base - raw);  // the same bytes, as a generic pointer
  const uint32_t sX = base;                              // S × [kBX × 128 B], 128-byte swizzle
  const uint32_t sP = sX + S * C::kTileX;                // S × [128 × 64 B], 64-byte swizzle
  const uint32_t sO = sP + S * C::kTileP;                // 2 warpgroups × 2 output chunks, 128-byte swizzle
  const uint32_t bars = sO + C::kOutBytes;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  // split-K: each consumer warpgroup's arrival order on its tile, two words by unit parity
  volatile unsigned* const role_words = reinterpret_cast<volatile unsigned*>(smem_raw + (bars + 16u * S - raw));

  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tiles_x = (M + kBX - 1) / kBX, tiles_w = (N + kWRows - 1) / kWRows;
  const int num_tiles = tiles_x * tiles_w;
  // units: the first `whole` tiles over all of K, then each later tile's `splits` k-ranges (unit_range)
  const int num_units = whole + (num_tiles - whole) * splits;
  const int ktiles = K / kBK, G = ktiles;

  init_ring_barriers(bars, S, 8);  // (full(s), empty(s) above)
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      prefetch_tensormaps(&tmX, &tmW);
      int s = 0;
      uint32_t phase = 0;
      for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
        int t, kt0, kt1, x0, n0;
        unit_range(u, whole, splits, kt_per, ktiles, t, kt0, kt1);
        tile_origin<kBX, kGroupTiles>(t, tiles_x, tiles_w, kWRows, x0, n0);
        for (int kt = kt0; kt < kt1; ++kt) {
          mbar_wait(empty(s), phase ^ 1);
          mbar_arrive_expect_tx(full(s), C::kTileX + C::kTileP);
          tma_load_2d(sX + s * C::kTileX, &tmX, kt * kBK, x0, full(s));
          tma_load_2d(sP + s * C::kTileP, &tmW, kt * (kBK / 2), n0, full(s));
          if (++s == S) { s = 0; phase ^= 1; }
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = wg - 1;
  const int g = lane >> 2, tq = lane & 3;
  const int rt = cw * 64 + warp * 16 + g;  // this thread's tile rows rt, rt + 8
  const uint32_t sel = (tq & 1) ? 0x7632u : 0x5410u;
  // Byte offsets in a packed row of this thread's two words, before the chunk swizzle.
  const int wofs = 4 * (tq >> 1);
  int acc[kBX / 2];
  // Two register sets of A fragments (a third, one more stage in flight, measured 1-3% slower: s30-2).
  uint32_t fa[16], fb[16];
#pragma unroll
  for (int i = 0; i < kBX / 2; ++i) acc[i] = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) fa[i] = fb[i] = 0;
  int s = 0, r = 0;  // the ring slots of the next stage to issue and the next to release
  uint32_t oc = 0;    // fp32 output chunks this warpgroup has stored (its ring position)
  uint32_t phase = 0;
  uint32_t nu = 0;    // split units this CTA has finished (the parity of its role word)
  for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
    int t, kt0, kt1, x0, n0;
    unit_range(u, whole, splits, kt_per, ktiles, t, kt0, kt1);
    tile_origin<kBX, kGroupTiles>(t, tiles_x, tiles_w, kWRows, x0, n0);
    const int n_a = n0 + rt, n_b = n_a + 8;  // this thread's output columns
    // Rows past N read row 0's multipliers: their packed bytes are TMA's zero fill, code 0, and
    // 0 · m is 0 whatever m is.
    const uint8_t* const mrow_a = reinterpret_cast<const uint8_t*>(Mult) + size_t(n_a < N ? n_a : 0) * G;
    const uint8_t* const mrow_b = reinterpret_cast<const uint8_t*>(Mult) + size_t(n_b < N ? n_b : 0) * G;
    // The multipliers of group kt for rows a, b: plain zero-extending loads, no condition on the
    // value (a select on it made ptxas wait for the load where it was issued, a stage early).
    auto mult = [&](int kt, uint32_t& ma, uint32_t& mb) {
      const int g = kt < G ? kt : G - 1;
      ma = __ldg(mrow_a + g);
      mb = __ldg(mrow_b + g);
    };
    // Stage slot `slot` (group kt, multipliers ma, mb) → the A fragments of its 4 k32 steps. The
    // 16 shared-memory words are loaded first and the lab switch is tested once a stage: with it
    // inside the loop (a branch a word) each word's conversion waited for its own loads, in
    // series (s32-2: Nsight Compute's stall samples).
    auto convert = [&](int slot, uint32_t ma, uint32_t mb, uint32_t (&a)[16]) {
      const uint8_t* tile = gbase + (sP - base) + slot * C::kTileP;
      uint32_t w[2][4][2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = rt + 8 * hh;
        const uint8_t* row = tile + r * 64 + wofs;
        const int sw = (r >> 1) & 3;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint8_t* chunk = row + ((kk ^ sw) << 4);
          w[hh][kk][0] = *reinterpret_cast<const uint32_t*>(chunk);
          w[hh][kk][1] = *reinterpret_cast<const uint32_t*>(chunk + 8);
        }
      }
      if (__builtin_expect(lab & 1, 0)) {  // lab: the packed words as the codes (wrong outputs; the conversion's cost)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            a[4 * kk + hh] = w[hh][kk][0];
            a[4 * kk + 2 + hh] = w[hh][kk][1];
          }
        return;
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t m = hh ? mb : ma;
        const uint32_t cb = 0x80808080u - m * 0x08080808u;  // (128 − 8m) a byte, as one integer
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          int4_times_m(w[hh][kk][0], w[hh][kk][1], sel, m, cb, a[4 * kk + hh], a[4 * kk + 2 + hh]);
      }
    };
    auto issue = [&](int slot, const uint32_t (&a)[16], bool first) {
      const uint64_t db = make_desc_sw128(sX + slot * C::kTileX);
      fence_operands(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)  // +32 B along K = +2 in the address field
        wgmma_step<kBX>(acc, a, kk, db + 2 * kk, !(first && kk == 0));
      wgmma_commit();
    };
    uint32_t ma, mb, na, nb;
    mult(kt0, ma, mb);
    mult(kt0 + 1, na, nb);
    mbar_wait(full(s), phase);
    convert(s, ma, mb, fa);
    // Stage kt from set `cur` (converted); after it is issued, stage kt − 1 completes
    // (wait_group 1): its slot is released and stage kt+1 is converted into `nxt`, the set
    // that stage used.
    auto step = [&](int kt, uint32_t (&cur)[16], uint32_t (&nxt)[16]) {
      issue(s, cur, kt == kt0);
      wgmma_wait<1>();  // (a unit's first stage: alone in flight, returns at once)
      fence_operands(acc);
      fence_frag(nxt);  // that stage's fragments stayed live until its wgmmas completed
      if (kt > kt0) {
        if (lane == 0) mbar_arrive(empty(r));
        if (++r == S) r = 0;
      }
      if (++s == S) { s = 0; phase ^= 1; }
      if (kt + 1 < kt1) {
        const uint32_t ua = na, ub = nb;
        mult(kt + 2, na, nb);
        mbar_wait(full(s), phase);
        convert(s, ua, ub, nxt);
      }
    };
    for (int kt = kt0; kt < kt1; kt += 2) {
      step(kt, fa, fb);
      if (kt + 1 < kt1) step(kt + 1, fb, fa);
    }
    // The epilogue's scales and chunk 0's token scales, loaded while the last MMAs run (their
    // latency, once per chunk, was most of what the TMA-store epilogue still cost).
    // Token scales: a ring of kSaAhead chunks in flight (s40: one chunk ahead left each chunk
    // waiting on its L2 loads; the fragment registers are free once the MMAs are done).
    constexpr int kSaAhead = kBX >= 256 ? 3 : 4;  // (4 at 256 tokens spilled)
    float cn[2] = {0.f, 0.f}, bn[2] = {0.f, 0.f}, sa_ring[kSaAhead][8];
    auto load_sa = [&](int c, float (&v)[8]) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // i = 2jj + e: token row 8jj + 2tq + e of chunk c
        const int m = x0 + kOutTokens * c + 8 * (i >> 1) + 2 * tq + (i & 1);
        v[i] = kOut != 2 && m < M ? __ldg(Sa + m) : 0.f;
      }
    };
    if constexpr (kOut != 2) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int n = n_a + 8 * hh;
        if (n < N) {
          cn[hh] = __ldg(Cn + n);
          bn[hh] = bias ? __ldg(bias + n) : 0.f;
        }
      }
      if (tma_out) load_sa(0, sa_ring[0]);
    }
    wgmma_wait<0>();
    fence_operands(acc);
    fence_frag(fa);
    fence_frag(fb);
    if (lane == 0) mbar_arrive(empty(r));  // the last stage, still held
    if (++r == S) r = 0;
    if constexpr (kOut != 2) {
      if (tma_out) {
#pragma unroll
        for (int c = 1; c < kSaAhead; ++c) load_sa(c, sa_ring[c]);
      }
    }
    // Split-K: the tile's last unit to finish (per consumer warpgroup) adds the others' int32 sums
    // and stores the tile; the others leave their sums in the workspace.
    // (slots and counters are numbered from the first split tile)
    if (splits > 1 && t >= whole &&
        !splitk_last_adds<kBX>(acc, t - whole, splits, cw, warp, lane, part, flags, role_words, nu++))
      continue;

    if (lab & 2) {  // lab: no stores (wrong outputs; the epilogue's cost) — one, unless the sums are 0
      int x = 0;
#pragma unroll
      for (int i = 0; i < kBX / 2; ++i) x |= acc[i];
      if (x == 0 && n_a < N && x0 < M) static_cast<char*>(Y)[0] = 0;
      continue;
    }
    // Epilogue: acc[4j + 2hh + e] is output column n = n_a + 8hh, token m = x0 + 8j + 2tq + e.
    auto value = [&](int j, int e, int hh, float sam) {
      return float(acc[4 * j + 2 * hh + e]) * (sam * cn[hh]) + bn[hh];
    };
    if (kOut != 2 && tma_out) {
      // Through shared memory and TMA stores, so that the tile's outputs (128 KiB fp32 at 256
      // tokens) go to memory while the next tile's MMAs run: with direct stores every SM wrote its
      // tile at once and waited (measured: 30% of the layer at M 4096, N 14336, K 4096). Chunks of
      // 32 tokens × this warpgroup's 64 columns (8 KiB fp32, 4 KiB bf16) in 32 KiB a warpgroup:
      // half a tile in fp32, a whole tile in bf16 (two chunk buffers a warpgroup waited for 3/4 of
      // the tile's bytes to drain: 15% of the layer, s30-3). The buffers use the 128-byte swizzle (16-byte
      // unit u of row r at u ^ (r % 8)): a warp's 32 writes then fall in distinct banks (fp32), and
      // each 8 × 8 block's 8 rows of 16 bytes in distinct units (bf16, stmatrix). Rows past M and
      // columns past N are clipped by the TMA unit.
      constexpr int kChunkBytes = kOut == 1 ? 8192 : 4096, kNB = kOutRing / kChunkBytes;
      constexpr int kChunks = kBX / kOutTokens;
      // bf16: the whole tile fits the ring, so its chunks go as one group — one wait, one proxy
      // fence, two barriers and one commit a tile (the model's 4096-token linears 49.6 → 48.7 ms,
      // s30-8). fp32: chunk by chunk around the ring (a chunk waits for the store kNB chunks back);
      // as halves of a tile the fp32 rows were 4-5% slower (s30-8), since the second half waited
      // for the whole first half to drain.
      constexpr int kGroup = kOut == 1 ? 1 : kChunks;
      static_assert(kGroup <= kNB, "a group of chunks must fit the output ring");
      const bool leader = (threadIdx.x & 127) == 0;
      auto chunk_buf = [&](int c, int c0) {
        return sO + cw * kOutRing + (kOut == 1 ? (oc & (kNB - 1)) : uint32_t(c - c0)) * kChunkBytes;
      };
#pragma unroll
      for (int c0 = 0; c0 < kChunks; c0 += kGroup) {
        // fp32: the store kNB chunks back (this buffer) has read it; bf16: every earlier store has.
        if (leader) bulk_wait_read<kOut == 1 ? kNB - 1 : 0>();
        named_barrier(1 + cw, 128);
#pragma unroll
        for (int c = c0; c < c0 + kGroup; ++c) {
          const uint32_t buf = chunk_buf(c, c0);
          const float(&sa_cur)[8] = sa_ring[c % kSaAhead];
          if constexpr (kOut == 1) {  // two boxes of [32 rows × 32 fp32]
#pragma unroll
            for (int jj = 0; jj < kOutTokens / 8; ++jj)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int r = 8 * jj + 2 * tq + e;  // the chunk's token row
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                  const float v = value(kOutTokens / 8 * c + jj, e, hh, sa_cur[2 * jj + e]);
                  const int col = warp * 16 + 8 * hh + g;  // 0..63
                  const uint32_t unit = ((col & 31) >> 2) ^ (r & 7);
                  const uint32_t a = buf + (col >> 5) * 4096 + r * 128 + unit * 16 + (col & 3) * 4;
                  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
                }
              }
          } else {
            // One box of [32 rows × 64 bf16]. The accumulators are the transpose of the output
            // (rows = columns n, columns = tokens): per 8 × 8 block (token block jj, column half
            // hh) a thread holds row g's tokens 2tq, 2tq+1 — stmatrix's fragment — so they go as
            // one bf16 pair and stmatrix .trans writes the block transposed, four blocks an
            // instruction (s40: a thread's 16 two-byte stores a chunk became two stmatrix).
            uint32_t pk[kOutTokens / 8][2];
#pragma unroll
            for (int jj = 0; jj < kOutTokens / 8; ++jj)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh)
                pk[jj][hh] = pack_bf16x2(value(kOutTokens / 8 * c + jj, 0, hh, sa_cur[2 * jj]),
                                         value(kOutTokens / 8 * c + jj, 1, hh, sa_cur[2 * jj + 1]));
            // Lanes 8q..8q+7 address the 8 stored rows (tokens 8jj + k) of block q = (jj, hh):
            // 16 bytes of columns 8(2·warp + hh) .. +7, the 128-byte swizzle's unit u ^ k.
            const int q = lane >> 3, k = lane & 7;
#pragma unroll
            for (int half = 0; half < kOutTokens / 16; ++half) {
              const int jj = 2 * half + (q >> 1), hh = q & 1;
              const uint32_t a = buf + (8 * jj + k) * 128 + (uint32_t((2 * warp + hh) ^ k) << 4);
              stmatrix_x4_trans(a, pk[2 * half][0], pk[2 * half][1], pk[2 * half + 1][0], pk[2 * half + 1][1]);
            }
          }
          // (this chunk's token scales are used: the ring slot takes chunk c + kSaAhead's)
          if (c + kSaAhead < kChunks) load_sa(c + kSaAhead, sa_ring[c % kSaAhead]);
        }
        fence_proxy_async_smem();  // the generic writes above, before the TMA unit reads them
        named_barrier(1 + cw, 128);
        if (leader) {
#pragma unroll
          for (int c = c0; c < c0 + kGroup; ++c) {
            const uint32_t buf = chunk_buf(c, c0);
            const int col0 = n0 + cw * 64, row0 = x0 + kOutTokens * c;
            if constexpr (kOut == 1) {
              tma_store_2d(&tmY, buf, col0 * 4, row0);
              tma_store_2d(&tmY, buf + 4096, (col0 + 32) * 4, row0);
            } else {
              tma_store_2d(&tmY, buf, col0 * 2, row0);
            }
          }
          bulk_commit();
        }
        if constexpr (kOut == 1) ++oc;  // (fp32 groups are one chunk)
      }
      continue;
    }
#pragma unroll
    for (int j = 0; j < kBX / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = x0 + 8 * j + 2 * tq + e;
        if (m >= M) continue;
        const float sam = kOut != 2 ? __ldg(Sa + m) : 0.f;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int n = n_a + 8 * hh;
          if (n >= N) continue;
          const size_t o = size_t(m) * N + n;
          if constexpr (kOut == 2) {
            static_cast<int*>(Y)[o] = acc[4 * j + 2 * hh + e];
          } else {
            const float f = value(j, e, hh, sam);
            if constexpr (kOut == 1) static_cast<float*>(Y)[o] = f;
            else static_cast<__nv_bfloat16*>(Y)[o] = __float2bfloat16_rn(f);
          }
        }
      }
  }
  if ((threadIdx.x & 127) == 0) bulk_wait_all<0>();  // the stores out of shared memory, before exit
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// ---------------------------------------------------------------- host side
// Tokens a tile, 128..256 in steps of 32 (m64n128k32 .. m64n256k32), by the time of the waves: the
// persistent grid runs ceil(tiles / SMs) tiles on the busiest SM, and a tile costs its tokens plus
// a fixed share, kTileOverheadTokens, which is large: per k-stage the weight tile's TMA load and
// int4 conversion cost the same whatever the width, and they, not the MMAs, set a stage's time
// (s31-2, H100, 256-token tiles against the chosen ones, the same wave counts: 2560 × 10240 at
// M 512, 1024, 2048 took 0.83, 0.91, 0.85 of the time with 128, 192, 160 tokens — a fixed share
// of 400-500 tokens; 6144 × 4096 at M 3072 lost 5% with 192 for 6 waves of 5.1 against 5 of
// 256, which a share of 110 had chosen). So a narrower tile pays where it saves a wave or a
// partial one (M 2048 on N 2560: 160 tiles of 256 tokens, two waves the second 21% full; 260 of
// 160, two full ones), seldom otherwise.
// PERRY_TWO_LEVEL_BX=128|160|192|224|256 forces one (lab, tests).
constexpr int kTileWidths[] = {128, 160, 192, 224, 256};
constexpr int kTileOverheadTokens = 400;
long long tile_count(int M, int N, int bx) {
  return (long long)((M + bx - 1) / bx) * ((N + kWRows - 1) / kWRows);
}
int tile_tokens(int M, int N) {
  const int forced = split_env("PERRY_TWO_LEVEL_BX");
  for (int bx : kTileWidths)
    if (forced == bx) return bx;
  const long long sms = sm_count();
  int best = 256;
  long long best_cost = -1;
  for (int bx : kTileWidths) {  // (ties go to the wider tile: fewer tiles, less conversion work)
    const long long cost = (tile_count(M, N, bx) + sms - 1) / sms * (bx + kTileOverheadTokens);
    if (best_cost < 0 || cost <= best_cost) {
      best = bx;
      best_cost = cost;
    }
  }
  return best;
}

// The launch: tile width, split-K count and k-stages a split, and the tiles run whole before the
// split ones (0: every tile split, or none).
struct Plan {
  int bx = 256, splits = 1, kt_per = 1, whole = 0;
};

// Split-K (thirty-ninth session): where the tiles leave SMs idle — a short prompt (M 128 on
// N 4096: 32 tiles of 128 tokens for 132 SMs; M 512 on N 2560: 40 tiles of 256) — units of
// (tile, k-range) fill them, and the tile's last unit adds the others' int32 sums
// (splitk_last_adds; exact, so the unsplit kernel's bits). The estimate, in the time of a
// 256-token k-stage: ceil(units / SMs) × (the unit's stages × the width's share, (tokens + 400) /
// 656, as tile_tokens) + the fixup, kFixupStages a 256-token slot for each split. Only where every
// unit runs at once (units <= SMs): with more, each round of units paid its fixup with all SMs
// moving slots through the L2 together, and the splits lost — H100, s39 run 1 (bench-op `gemm`,
// split by a 1.5-stage fixup estimate vs unsplit): 6144 × 4096 at M 1024 (2 splits, 3 rounds)
// 58.6 vs 51.6 µs, 2560 × 10240 at M 1024 / 2048 (3 splits, 2 / 4 rounds) 60.4 / 117.7 vs 56.8 /
// 100.6 — a fixup of 3–4 stages a 256-token slot and split, which kFixupStages now takes. In one
// round they won: 4096 × 14336 at M 128 / 256 / 512 38.7 / 60.9 / 66.4 → 29.2 / 39.8 / 53.1 µs,
// 2560 × 10240 at M 256 / 512 37.6 / 49.1 → 29.8 / 34.0 (unsplit = the grouped kernels there).
// A split must save 5% of the unsplit estimate; at least 4 stages a unit; the tile counters of
// kGemmW8A8TileFlags (4 a split tile) and the caller's workspace bound it.
// The tail split (fortieth session): where the tiles fill w whole waves and a partial one (M 1024:
// 192 tiles of 256 tokens on N 6144, 448 on N 14336; 132 SMs), the first w · SMs tiles run whole
// and only the last wave's tiles are split, each SM ending with at most one split unit — one
// round of fixups, the case that won in s39, instead of the rounds that lost. Estimated as w waves
// of whole tiles plus one round of split units with their fixup.
// PERRY_TWO_LEVEL_SPLITK=0 turns splitting off, =N forces N splits of every tile (tests, lab; any
// number of rounds), with PERRY_TWO_LEVEL_WHOLE_TILES=n of all but the first n;
// PERRY_TWO_LEVEL_SPLIT_TAIL=0 leaves the default plan only the short prompts' splits (A/B).
constexpr double kFixupStages = 3.5;
constexpr int kMinStagesPerSplit = 4, kMaxSplits = 16;
size_t slot_bytes(int bx) { return size_t(kWRows) * size_t(bx) * 4; }
bool plannable(int M, int N, int K) { return M >= 1 && N >= 1 && K >= kBK && K % kBK == 0; }
// (unsplit plans have whole = 0: units = tiles, no slots)
long long plan_units(int M, int N, const Plan& p) { return p.whole + (tile_count(M, N, p.bx) - p.whole) * p.splits; }
size_t plan_workspace_bytes(int M, int N, const Plan& p) {
  return size_t(tile_count(M, N, p.bx) - p.whole) * size_t(p.splits - 1) * slot_bytes(p.bx);
}
Plan make_plan(int M, int N, int K) {
  Plan p;
  p.bx = tile_tokens(M, N);
  const int ktiles = K / kBK;
  p.kt_per = ktiles;
  const int forced = split_env("PERRY_TWO_LEVEL_SPLITK");
  if (forced == 0 || forced == 1 || ktiles < 2) return p;
  const long long sms = sm_count();
  // the tile counters (4 a split tile) of kGemmW8A8TileFlags
  auto flags_fit = [&](long long split_tiles) { return split_tiles * 4 <= kGemmW8A8TileFlags; };
  if (forced > 1) {  // (PERRY_TWO_LEVEL_WHOLE_TILES=n: the first n tiles whole, as a tail split; tests)
    const long long tiles = tile_count(M, N, p.bx);
    const long long whole = std::max(0, split_env("PERRY_TWO_LEVEL_WHOLE_TILES"));
    if (whole >= tiles || !flags_fit(tiles - whole)) return p;
    p.splits = finish_splits(std::min(forced, kMaxSplits), ktiles, p.kt_per);
    p.whole = p.splits > 1 ? int(whole) : 0;
    return p;
  }
  // In 256-token k-stages: `whole` tiles in whole waves, then the split units (at most one round).
  auto cost = [&](int bx, long long whole, long long split_units, int splits, int kt_per) {
    const double share = double(bx + kTileOverheadTokens) / double(256 + kTileOverheadTokens);
    const double fix = splits > 1 ? kFixupStages * double(bx) / 256.0 * splits : 0.0;
    return double((whole + sms - 1) / sms) * ktiles * share +
           double((split_units + sms - 1) / sms) * (kt_per * share + fix);
  };
  const double unsplit = cost(p.bx, tile_count(M, N, p.bx), 0, 1, ktiles);
  double best = 0.95 * unsplit;
  const bool forced_bx = split_env("PERRY_TWO_LEVEL_BX") > 0;
  const bool tail = split_env("PERRY_TWO_LEVEL_SPLIT_TAIL") != 0;
  for (int bx : kTileWidths) {
    if (forced_bx && bx != p.bx) continue;
    const long long tiles = tile_count(M, N, bx);
    // every tile split (a short prompt), or the whole waves kept and the last, partial one split
    long long wholes[2] = {0, 0};
    int candidates = 1;
    if (tail && tiles > sms) wholes[candidates++] = tiles / sms * sms;
    for (int i = 0; i < candidates; ++i) {
      const long long whole = wholes[i], rest = tiles - whole;
      if (rest <= 0 || !flags_fit(rest)) continue;
      for (int want = 2; want <= kMaxSplits && want * kMinStagesPerSplit <= ktiles; ++want) {
        int kt_per = ktiles;
        const int splits = finish_splits(want, ktiles, kt_per);
        if (splits < 2 || rest * splits > sms) continue;
        const double c = cost(bx, whole, rest * splits, splits, kt_per);
        if (c < best) {
          best = c;
          p = Plan{bx, splits, kt_per, int(whole)};
        }
      }
    }
  }
  return p;
}

template <int kBX, int kOut>
void launch(const int8_t* x, const float* sa, const void* w, const int8_t* mult, const float* cn, const float* bias,
            void* y, int M, int N, int K, const Plan& plan, int32_t* part, uint32_t* flags, cudaStream_t stream,
            const char* name) {
  using C = TwoLevelCfg<kBX>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_w4a8_two_level_kernel<kBX, kOut>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap tx = make_map(x, M, K, kBK, kBX, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const CUtensorMap tw = make_map(w, N, K / 2, kBK / 2, kWRows, CU_TENSOR_MAP_SWIZZLE_64B, name);
  // The TMA store epilogue needs y 16-byte aligned and 16-byte rows (N % 4 fp32, N % 8 bf16);
  // otherwise (and for the I32 test output, or PERRY_TWO_LEVEL_DIRECT_STORE=1 in A/B runs) each
  // thread stores its values.
  const int es = kOut == 0 ? 2 : 4;
  const bool tma_out = kOut != 2 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && (size_t(N) * es) % 16 == 0 &&
                       split_env("PERRY_TWO_LEVEL_DIRECT_STORE") != 1;
  const CUtensorMap ty = tma_out ? make_map(y, M, N * es, 128, kOutTokens, CU_TENSOR_MAP_SWIZZLE_128B, name) : tx;
  const long long units = plan_units(M, N, plan);
  const int sms = sm_count();
  const unsigned grid = unsigned(units < sms ? units : sms);
  // PERRY_LAB_TL_FLAGS (lab only, the outputs are wrong): 1 = no int4 conversion (the packed words
  // go to wgmma as they are), 2 = no epilogue stores — what each costs.
  const int lab = std::max(0, split_env("PERRY_LAB_TL_FLAGS")) & 3;
  gemm_w4a8_two_level_kernel<kBX, kOut><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      tx, tw, ty, tma_out ? 1 : 0, sa, mult, cn, bias, y, M, N, K, lab, plan.whole, plan.splits, plan.kt_per, part,
      flags);
  check_launch(name);
}

template <int kBX>
void launch_out(DType out, const int8_t* x, const float* sa, const void* w, const int8_t* mult, const float* cn,
                const float* bias, void* y, int M, int N, int K, const Plan& p, int32_t* part, uint32_t* flags,
                cudaStream_t s) {
  switch (out) {
    case DType::I32:
      return launch<kBX, 2>(x, sa, w, mult, cn, bias, y, M, N, K, p, part, flags, s, "gemm_w4a8_two_level_wgmma<i32>");
    case DType::F32:
      return launch<kBX, 1>(x, sa, w, mult, cn, bias, y, M, N, K, p, part, flags, s, "gemm_w4a8_two_level_wgmma<f32>");
    default:
      return launch<kBX, 0>(x, sa, w, mult, cn, bias, y, M, N, K, p, part, flags, s, "gemm_w4a8_two_level_wgmma<bf16>");
  }
}

}  // namespace

bool gemm_w4a8_two_level_wgmma_supported() {
  if (!sm90::device_is_sm90()) return false;
  static const bool code =
      sm90::sm90_code_present(reinterpret_cast<const void*>(&gemm_w4a8_two_level_kernel<256, 0>));
  return code;
}

bool gemm_w4a8_two_level_wgmma_fills(int M, int N, int K) {
  if (!plannable(M, N, K)) return false;
  const Plan p = make_plan(M, N, K);
  return plan_units(M, N, p) * 2 >= sm_count();
}

int gemm_w4a8_two_level_wgmma_tile_tokens(int M, int N) { return M < 1 || N < 1 ? 256 : tile_tokens(M, N); }

int gemm_w4a8_two_level_wgmma_splits(int M, int N, int K) {
  return plannable(M, N, K) ? make_plan(M, N, K).splits : 1;
}

int gemm_w4a8_two_level_wgmma_whole_tiles(int M, int N, int K) {
  if (!plannable(M, N, K)) return 0;
  const Plan p = make_plan(M, N, K);
  return p.splits > 1 ? p.whole : int(tile_count(M, N, p.bx));
}

size_t gemm_w4a8_two_level_wgmma_workspace_bytes(int M, int N, int K) {
  return plannable(M, N, K) ? plan_workspace_bytes(M, N, make_plan(M, N, K)) : 0;
}

void gemm_w4a8_two_level_wgmma(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                               const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                               int K, cudaStream_t stream, int32_t* workspace, size_t workspace_bytes,
                               uint32_t* tile_flags) {
  using quant_args::aligned;
  const std::string where = "gemm_w4a8_two_level_wgmma(M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (!gemm_w4a8_two_level_wgmma_supported()) throw Error(where + ": needs an sm_90 device (H100/H200)");
  if (M < 1 || N < 1 || K < kBK || K % kBK != 0 || K > 65536)
    throw Error(where + ": need M, N >= 1 and K a multiple of 128, at most 65536");
  if (!multipliers) throw Error(where + ": null multipliers");
  if (out != DType::I32 && !channel_scales) throw Error(where + ": null channel scales");
  if (channel_scales && !aligned(channel_scales, 4)) throw Error(where + ": channel scales misaligned");
  // (the scales argument of the shared check: the channel scales, read only for F32 / BF16 out)
  quant_args::check_gemm_pointers(where, x, sa, qweight, channel_scales, bias, y, out);
  Plan p = make_plan(M, N, K);
  if (p.splits > 1 && (!workspace || !tile_flags || !aligned(workspace, 16) ||
                       workspace_bytes < plan_workspace_bytes(M, N, p))) {
    p = Plan{tile_tokens(M, N), 1, K / kBK};  // no room for the split: the unsplit kernel
  }
  // (unsplit, the kernel never reads the workspace or the tile counters)
  const auto* w = qweight;
  const auto* m = multipliers;
  const auto* c = channel_scales;
  int32_t* const ws = workspace;
  uint32_t* const fl = tile_flags;
  switch (p.bx) {
    case 128: return launch_out<128>(out, x, sa, w, m, c, bias, y, M, N, K, p, ws, fl, stream);
    case 160: return launch_out<160>(out, x, sa, w, m, c, bias, y, M, N, K, p, ws, fl, stream);
    case 192: return launch_out<192>(out, x, sa, w, m, c, bias, y, M, N, K, p, ws, fl, stream);
    case 224: return launch_out<224>(out, x, sa, w, m, c, bias, y, M, N, K, p, ws, fl, stream);
    default: return launch_out<256>(out, x, sa, w, m, c, bias, y, M, N, K, p, ws, fl, stream);
  }
}

}  // namespace perry::cuda
