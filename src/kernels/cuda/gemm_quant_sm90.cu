// sm_90a gemm_quant (gemm_quant_sm90.h): grouped-scale and int4 W*A8 GEMM on TMA + wgmma, built
// from the pieces of gemm_w8a8_sm90.cu (sm90_gemm_common.cuh). Design notes and the measured
// steps: docs/cuda-gemm-w8a8-sm90.md, "Grouped and int4 modes".
//
// Y[M,N] = sa[m]·Σ_g sw[n,g]·(X[M,K]·W[N,K]ᵀ restricted to the k of group g) (+bias[n]).
//   * Block tile 128×128, 128 k (bytes of X) per stage = one g128 group = two g64 groups.
//     384 threads: warpgroup 0 = producer, warpgroups 1, 2 = consumers (64 rows × 128 columns
//     of the accumulator each). Grouped int4: 512 threads, three consumer warpgroups, 192
//     weight rows a tile (kCons = 3: one accumulator set in 152 registers instead of two in 224).
//   * Producer warp 0 (one thread): TMA loads of the X tile (128-byte swizzle) and of the weight
//     tile: int8 → straight into its 128-byte-swizzled tile, int4 → the packed [128 rows × 64 B]
//     tile into a staging buffer.
//   * Producer warps 1-3 ("helpers", 96 threads): for int4, expand the packed tile into the
//     swizzled int8 tile: nibble v → byte 16·v (a mask, a shift, two byte permutes per 8 weights:
//     no sign-extension arithmetic), so the MMA accumulates 16·acc; the 1/16 is folded into the
//     scales (exact: a power of two) and the I32 output shifts it back out (exact). The expanded
//     tile is written through the generic proxy, so the helpers issue fence.proxy.async before
//     arriving on the stage's "full" barrier, which the consumers' wgmma reads wait on. Per
//     channel they also stage the tile's 128 column scales in shared memory.
//   * Grouped modes (g128, g64; consume_grouped) swap the operands: the weight tile is wgmma's A
//     operand (accumulator rows = output columns n) and the X tile its B operand (accumulator
//     columns = tokens m). The fold's scale sw[n, g] then varies along a thread's two rows, not
//     its 32 columns: two L1-cached loads per thread and group (one group ahead) instead of 8
//     shared-memory 16-byte loads that eight lanes repeat — that crossbar traffic (~32 KiB a
//     stage) kept the unswapped kernel shared-memory bound (Nsight: L1/shared 90%, tensor 28%).
//     Per group 4 (g64: 2) wgmma m64n128k32 s32.s8.s8 into one of two int32 accumulator sets
//     (the first with scale-d = 0), then the previous group is waited for (wait_group 1), its
//     stage released and its accumulators folded: facc += float(acc)·sw[n, g] (I2FP + FFMA; the
//     int32 partial never spans two groups: exact, and gemm_quant's fold order, so the fp32
//     results are bitwise equal). The epilogue stores y[m, n] = facc·sa[m] + bias[n] transposed.
//   * Per channel (w4a8, w8a8): the unswapped layout, one int32 accumulation over the unit's
//     k-range (all of K unless split), folded once; bf16 out leaves by 16-byte stores after a
//     quad transpose. I32 out: the int32 sums (acc >> 4 for int4). Grouped I32 out: the per-group
//     int32 partials, stored at each fold.
//   * Persistent grid, grouped tile order, TMA zero fill at the M / N / K edges: as gemm_w8a8_sm90.
//   * Split-K (grouped_splits, small M × N): units of (tile, k-range of whole stages). Grouped:
//     each folds its groups into fp32 and stores facc to its workspace slice;
//     grouped_splitk_reduce_kernel adds the slices in order and applies sa and the bias. Per
//     channel: each stores its int32 sums; int32_splitk_reduce_kernel adds them (exact) and
//     applies the unsplit epilogue's expression.
// No deadlock by construction: per use of a stage, full gets 1 arrive.expect_tx (TMA thread) +
// 96 helper arrives (0 for grouped int8), empty 4·kCons consumer-warp arrives (8 or 12), packed
// (int4) 1 arrive.expect_tx; all roles walk the same (tile, k-stage) sequence.
#include <cuda_bf16.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kBM = 128, kBN = 128, kBK = 128;  // X rows (tokens), weight rows, k bytes of X per stage
constexpr int kHelpers = 96;  // producer warps 1-3
constexpr int kGroupTiles = 8;

// Split-K (grouped and per-channel layouts): work units of (tile, k-range) (unit_range,
// sm90_gemm_common.cuh); producer, helpers and consumers walk the same units. A stage holds whole
// groups (128 k = one g128 or two g64 groups), so a grouped unit folds whole groups.

// kSwap (the grouped modes): the weight tile is the wgmma A operand and the activations B, so the
// accumulator's rows are output columns n and a thread's group scales are two values (its two
// rows) rather than 32 (see the file comment).
// kCons consumer warpgroups (grouped modes: 2 or 3, per channel: 2) of 64 accumulator rows each;
// the weight tile has kWRows = 64·kCons rows when swapped (128 otherwise).
template <int kBits, bool kSwap, int kCons = 2>
struct QCfg {
  static constexpr int kThreads = 128 * (1 + kCons);
  static constexpr int kConsumerWarps = 4 * kCons;
  // setmaxnreg: 56·128 + 224·256 = 64,512 (two consumer warpgroups); 40·128 + 152·384 = 63,488.
  static constexpr int kProducerRegs = kCons == 3 ? 40 : 56, kConsumerRegs = kCons == 3 ? 152 : 224;
  static constexpr int kWRows = kSwap ? 64 * kCons : kBN;   // weight rows a tile (output columns)
  static constexpr int kTileX = kBM * kBK;                   // 16 KiB of X
  static constexpr int kTileW = kWRows * kBK;                // 16 / 24 KiB of int8 weights (swizzled)
  static constexpr int kTileA = kSwap ? kTileW : kTileX;     // the wgmma A / B operand tiles
  static constexpr int kTileB = kSwap ? kTileX : kTileW;
  static constexpr int kTileP = kBits == 4 ? kWRows * kBK / 2 : 0;  // packed int4 staging
  static constexpr int kScaleFloats = kSwap ? 0 : kBN;       // per channel: the tile's column scales
  // Helper threads arrive on "full": they write scales (not kSwap) or expand int4.
  static constexpr int kHelperArrivals = kSwap && kBits == 8 ? 0 : kHelpers;
  static constexpr int kStageBytes = kTileA + kTileB + kTileP + 4 * kScaleFloats;
  static constexpr int kStages = (225 * 1024) / kStageBytes < 6 ? (225 * 1024) / kStageBytes : 6;
  static constexpr int kBarrierBytes = 3 * kStages * 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + kBarrierBytes + 1024;  // + alignment slack
  static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");
};

// 4 packed int4 bytes (byte i: k 2i low nibble, 2i+1 high) → 8 int8 = 16·value in k order.
__device__ __forceinline__ void expand_int4x16(uint32_t w, uint32_t& o0, uint32_t& o1) {
  const uint32_t lo = (w << 4) & 0xF0F0F0F0u, hi = w & 0xF0F0F0F0u;
  o0 = __byte_perm(lo, hi, 0x5140);
  o1 = __byte_perm(lo, hi, 0x7362);
}

#ifdef PERRY_WGMMA
// The consumer warpgroups of the grouped modes (kSwap: accumulator rows = output columns n,
// columns = tokens m). kCons = 2: two int32 accumulator sets — group gi's wgmmas are issued into
// one before group gi-1's are waited for (wait_group 1) and folded from the other, so each
// warpgroup keeps the tensor core fed through its own fold. kCons = 3: one set (the registers of
// two do not fit three warpgroups); the other two warpgroups' wgmmas cover a fold. Folds stay in
// group order: the fp32 results are bitwise those of gemm_quant.
template <int kBits, int kGS, int kOut, int S, int kCons>
__device__ __forceinline__ void consume_grouped(uint32_t sA, uint32_t sB, uint32_t bars, int cw, int warp, int lane,
                                                const float* __restrict__ Sa, const float* __restrict__ Sw,
                                                const float* __restrict__ bias, void* __restrict__ Y, int M, int N,
                                                int K, int G, int splits, int kt_per, float* __restrict__ part,
                                                int flags) {
  constexpr int kSub = kBK / kGS;   // groups per stage (1 or 2)
  constexpr int kKK = 4 / kSub;     // k32 wgmmas per group
  constexpr float kWMul = kBits == 4 ? 0.0625f : 1.0f;  // the int4 bytes hold 16·w: fold sw/16 (exact)
  using C = QCfg<kBits, true, kCons>;
  constexpr int kNStep = C::kWRows;  // output columns a tile
  // Two consumer warpgroups: two accumulator sets each (224 registers); three: one set (152).
  constexpr bool kTwoSets = kCons == 2;
  const int g = lane >> 2, tq = lane & 3;
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kNStep - 1) / kNStep;
  const int num_units = tiles_m * tiles_n * splits;
  const int ktiles = (K + kBK - 1) / kBK;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  int acc0[64], acc1[kTwoSets ? 64 : 1];
  float facc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = 0;
#pragma unroll
  for (int i = 0; i < (kTwoSets ? 64 : 1); ++i) acc1[i] = 0;
  int s = 0;  // the stage slot of the group being issued
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
    int t, kt0, kt1, m0, n0;
    unit_range(u, splits, kt_per, ktiles, t, kt0, kt1);
    tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kNStep, m0, n0);
    // This unit's groups [g_first, g_end) (g64: the second group of a stage past K is skipped in
    // finish); gi below is the group's index in all of K (its scales, its I32 output slot).
    const int g_first = kt0 * kSub, g_end = kt1 * kSub;
    const int r0 = n0 + cw * 64 + warp * 16 + g;  // this thread's output columns r0, r0 + 8
#pragma unroll
    for (int i = 0; i < 64; ++i) facc[i] = 0.f;
    int ps = 0;  // the stage slot of the previous group
    // The scales of this thread's two output columns for group gi, loaded one group ahead (an L1
    // miss on them stalled the fold: Nsight, 31% of the warps' stall cycles on L1TEX).
    auto load_scales = [&](int gi, float (&v)[2]) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        v[hh] = kOut != 2 && r0 + 8 * hh < N && gi < G ? __ldg(Sw + size_t(r0 + 8 * hh) * G + gi) * kWMul : 0.f;
    };
    float sw_cur[2], sw_next[2];
    load_scales(g_first, sw_cur);
    // Issue group gi (stage gi / kSub, k32 steps of its sub-range) into cur.
    auto issue = [&](int (&cur)[64], int gi) {
      const int sub = kSub == 1 ? 0 : gi % kSub;
      if (sub == 0) mbar_wait(full(s), phase);
      const uint64_t da = make_desc_sw128(sA + s * C::kTileA + cw * 64 * kBK);
      const uint64_t db = make_desc_sw128(sB + s * C::kTileB);
      fence_operands(cur);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKK; ++kk)  // +32 B along K = +2 in the address field
        wgmma_n128(cur, da + 2 * (sub * kKK + kk), db + 2 * (sub * kKK + kk), kk != 0);
      wgmma_commit();
    };
    // Wait for group gi (the older pending group unless `last`), release its stage when it was the
    // stage's last group, fold it.
    // `last` (std::true_type / false_type) is a compile-time argument: every wgmma wait is a
    // constant count on a straight-line path (a runtime choice between wait 0 and wait 1 gives
    // ptxas merging paths with different numbers of groups in flight).
    auto finish = [&](int (&done)[64], int gi, int slot, auto last) {
      load_scales(gi + 1, sw_next);  // (0 past the last group)
      if constexpr (decltype(last)::value) wgmma_wait<0>();
      else wgmma_wait<1>();
      fence_operands(done);
      if ((kSub == 1 || gi % kSub == kSub - 1) && lane == 0) mbar_arrive(empty(slot));
      const float swr[2] = {sw_cur[0], sw_cur[1]};
      sw_cur[0] = sw_next[0];
      sw_cur[1] = sw_next[1];
      if (gi >= G) return;  // (g64: the second half of a last stage past K)
      if constexpr (kOut == 2) {
        (void)swr;
        // y[(m·N + n)·G + gi], n = r0 + 8hh, m = m0 + 8j + 2tq + e.
        const size_t row = size_t(N) * G;  // one token m further
        int* ym = static_cast<int*>(Y) + size_t(m0 + 2 * tq) * row + size_t(r0) * G + gi;
#pragma unroll
        for (int j = 0; j < 16; ++j, ym += 8 * row)
#pragma unroll
          for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              if (m0 + 8 * j + 2 * tq + e < M && r0 + 8 * hh < N)
                ym[e * row + 8 * hh * G] = done[4 * j + 2 * hh + e] >> (kBits == 4 ? 4 : 0);
      } else {
        if (flags & 8) return;  // the lab's ceiling measurement: no fold (wrong outputs)
        // float(acc) is exact (|acc| < 2^24) and compiles to I2FP.F32.S32, one instruction: on
        // the H200 it beat the integer-add trick (IADD + FADD) 817 vs 695 TOPS.
#pragma unroll
        for (int i = 0; i < 64; ++i) facc[i] = fmaf(float(done[i]), swr[(i >> 1) & 1], facc[i]);
      }
    };
    auto advance = [&](int gi) {  // group gi issued: its slot becomes the previous group's
      ps = s;
      if (kSub == 1 || gi % kSub == kSub - 1) {
        if (++s == S) { s = 0; phase ^= 1; }
      }
    };
    const std::false_type more;
    const std::true_type last;
    if constexpr (kTwoSets) {
      // The unit's even-numbered groups in acc0, odd in acc1; group gi is issued before group
      // gi-1 is folded.
      issue(acc0, g_first);
      advance(g_first);
      int gi = g_first + 1;
      for (; gi + 1 < g_end; gi += 2) {
        issue(acc1, gi);
        finish(acc0, gi - 1, ps, more);
        advance(gi);
        issue(acc0, gi + 1);
        finish(acc1, gi, ps, more);
        advance(gi + 1);
      }
      if (gi < g_end) {
        issue(acc1, gi);
        finish(acc0, gi - 1, ps, more);
        advance(gi);
        finish(acc1, gi, ps, last);
      } else {
        finish(acc0, gi - 1, ps, last);
      }
    } else {
      // One set: each group waited for and folded before the next is issued; the other two
      // warpgroups' wgmmas keep the tensor core busy meanwhile.
      for (int gi = g_first; gi < g_end; ++gi) {
        issue(acc0, gi);
        advance(gi);
        finish(acc0, gi, ps, last);
      }
    }
    if constexpr (kOut != 2) {  // (I32: the partials went out at the folds)
      // y[m, n] = facc·sa[m] + bias[n] for n = r0 + 8hh, m = m0 + 8j + 2tq + e; split-K: facc alone
      // to slice u % splits of the workspace (grouped_splitk_reduce_kernel adds the slices in order
      // and applies sa[m] and the bias). Eight lanes (gq) store eight consecutive n of one row m:
      // one 32-byte sector (f32) or half of one that the same thread's hh = 1 store completes
      // (bf16); ~64 stores per thread against K/32 wgmmas, so no shared-memory transpose.
      const bool split = splits > 1;
      float* const slice = split ? part + size_t(u % splits) * size_t(M) * N : nullptr;
      float bn[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) bn[hh] = !split && bias && r0 + 8 * hh < N ? __ldg(bias + r0 + 8 * hh) : 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * j + 2 * tq + e;
          if (m >= M) continue;
          const float sam = split ? 1.f : __ldg(Sa + m);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            if (r0 + 8 * hh >= N) continue;
            const size_t o = size_t(m) * N + r0 + 8 * hh;
            if (split) {
              slice[o] = facc[4 * j + 2 * hh + e];
              continue;
            }
            const float v = fmaf(facc[4 * j + 2 * hh + e], sam, bn[hh]);
            if constexpr (kOut == 1) static_cast<float*>(Y)[o] = v;
            else static_cast<__nv_bfloat16*>(Y)[o] = __float2bfloat16_rn(v);
          }
        }
    }
  }
}
#endif  // PERRY_WGMMA

// kGS: 0 (per channel), 64, 128; kOut: 0 bf16, 1 f32, 2 i32; kCons: consumer warpgroups
template <int kBits, int kGS, int kOut, int kCons = 2>
__global__ void __launch_bounds__(128 * (1 + kCons), 1)
    gemm_quant_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                            const float* __restrict__ Sa, const float* __restrict__ Sw,
                            const float* __restrict__ bias, void* __restrict__ Y, int M, int N, int K, int G,
                            int vec_ok, int splits, int kt_per, float* __restrict__ part) {
#ifdef PERRY_WGMMA
  constexpr bool kSwap = kGS != 0;
  static_assert(kCons == 2 || (kSwap && kCons == 3), "three consumer warpgroups: grouped modes only");
  using C = QCfg<kBits, kSwap, kCons>;
  constexpr int kNStep = C::kWRows;  // output columns a tile
  constexpr int S = C::kStages;
  constexpr float kWMul = kBits == 4 ? 0.0625f : 1.0f;  // the int4 bytes hold 16·w: fold sw/16 (exact)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem_raw + (base - raw);  // the same bytes, as a generic pointer
  const uint32_t sA = base;                        // S × [128 × 128 B], swizzled (kSwap: weights)
  const uint32_t sB = sA + S * C::kTileA;          // S × [128 × 128 B], swizzled int8 (kSwap: X)
  const uint32_t sP = sB + S * C::kTileB;          // S × [128 × 64 B] packed int4 (kBits == 4)
  const uint32_t sS = sP + S * C::kTileP;          // S × [2 × 128] fp32 scales, permuted
  const uint32_t bars = sS + S * 4 * C::kScaleFloats;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  auto packed = [&](int s) { return bars + 8u * (2 * S + s); };
  auto gen = [&](uint32_t a) { return gbase + (a - base); };

  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kNStep - 1) / kNStep;
  const int num_tiles = tiles_m * tiles_n;
  const int num_units = num_tiles * splits;
  const int ktiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1 + C::kHelperArrivals);
      mbar_init(empty(s), C::kConsumerWarps);
      mbar_init(packed(s), 1);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs) : "memory");
    if (warp == 0) {
      // ---------------- TMA issuer ----------------
      if (lane == 0) {
        prefetch_tensormaps(&tmA, &tmB);
        int s = 0;
        uint32_t phase = 0;
        for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
          int t, kt0, kt1, m0, n0;
          unit_range(u, splits, kt_per, ktiles, t, kt0, kt1);
          tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kNStep, m0, n0);
          for (int kt = kt0; kt < kt1; ++kt) {
            mbar_wait(empty(s), phase ^ 1);
            // kSwap: X goes to the B operand tile, the (int8) weights to A.
            const uint32_t xdst = kSwap ? sB + s * C::kTileB : sA + s * C::kTileA;
            if constexpr (kBits == 8) {
              const uint32_t wdst = kSwap ? sA + s * C::kTileA : sB + s * C::kTileB;
              mbar_arrive_expect_tx(full(s), C::kTileA + C::kTileB);
              tma_load_2d(xdst, &tmA, kt * kBK, m0, full(s));
              tma_load_2d(wdst, &tmB, kt * kBK, n0, full(s));
            } else {
              mbar_arrive_expect_tx(full(s), C::kTileX);
              tma_load_2d(xdst, &tmA, kt * kBK, m0, full(s));
              mbar_arrive_expect_tx(packed(s), C::kTileP);
              tma_load_2d(sP + s * C::kTileP, &tmB, kt * (kBK / 2), n0, packed(s));
            }
            if (++s == S) { s = 0; phase ^= 1; }
          }
        }
      }
    } else if (C::kHelperArrivals > 0) {
      // ---------------- helpers: scales (not kSwap) and int4 expansion ----------------
      const int h = threadIdx.x - 32;  // 0..95
      // Per channel (not kSwap): scale slot i < 128 = column c, stored at p(c) = 32·((c/2) % 4) +
      // 2·(c/8) + c % 2: consumer thread tq of a quad holds columns 8j + 2tq + e (j < 16, e < 2)
      // and reads them as 32 consecutive floats.
      constexpr int kSlots = (kBN + kHelpers - 1) / kHelpers;
      auto load_scales = [&](int t, float (&v)[kSlots]) {  // the tile's scales (the same every stage)
        int m0, n0;
        tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kBN, m0, n0);
#pragma unroll
        for (int q = 0; q < kSlots; ++q) {
          const int i = h + q * kHelpers, n = n0 + i;
          v[q] = 0.f;
          if constexpr (kOut != 2 && !kSwap)
            if (i < kBN && n < N) v[q] = __ldg(Sw + n) * kWMul;
        }
      };
      int s = 0;
      uint32_t phase = 0;
      // (unit u, its k-stage kt); t = the unit's tile, kt_end its last k-stage + 1.
      int u = blockIdx.x, t = 0, kt = 0, kt_end = 0;
      if (u < num_units) unit_range(u, splits, kt_per, ktiles, t, kt, kt_end);
      float cur[kSlots];
      if (u < num_units) load_scales(t, cur);
      while (u < num_units) {
        int u2 = u, t2 = t, kt2 = kt + 1, kt2_end = kt_end;
        if (kt2 == kt_end) {
          u2 += gridDim.x;
          if (u2 < num_units) unit_range(u2, splits, kt_per, ktiles, t2, kt2, kt2_end);
        }
        float nxt[kSlots];
        if (u2 < num_units) load_scales(t2, nxt);  // in flight while this stage is handled
        mbar_wait(empty(s), phase ^ 1);
        if constexpr (!kSwap) {
          float* ss = reinterpret_cast<float*>(gen(sS + s * 4 * C::kScaleFloats));
#pragma unroll
          for (int q = 0; q < kSlots; ++q) {
            const int c = h + q * kHelpers;
            if (c < kBN) ss[32 * ((c >> 1) & 3) + 2 * (c >> 3) + (c & 1)] = cur[q];
          }
        }
        if constexpr (kBits == 4) {
          mbar_wait(packed(s), phase);
          const uint8_t* src = gen(sP + s * C::kTileP);
          uint8_t* dst = gen(kSwap ? sA + s * C::kTileA : sB + s * C::kTileB);
#pragma unroll 2
          for (int i = h; i < C::kWRows * 4; i += kHelpers) {  // 16-byte packed chunk i: row i/4, k 32·(i%4)..+31
            const int r = i >> 2, c = i & 3;
            const uint4 p = *reinterpret_cast<const uint4*>(src + r * 64 + c * 16);
            uint4 a, b;
            expand_int4x16(p.x, a.x, a.y);
            expand_int4x16(p.y, a.z, a.w);
            expand_int4x16(p.z, b.x, b.y);
            expand_int4x16(p.w, b.z, b.w);
            // 128-byte swizzle: 16-byte chunk j of row r at chunk j ^ (r % 8).
            *reinterpret_cast<uint4*>(dst + r * 128 + (((2 * c) ^ (r & 7)) << 4)) = a;
            *reinterpret_cast<uint4*>(dst + r * 128 + (((2 * c + 1) ^ (r & 7)) << 4)) = b;
          }
          fence_proxy_async_smem();  // the generic writes above, before the consumers' wgmma reads
        }
        mbar_arrive(full(s));
        if (++s == S) { s = 0; phase ^= 1; }
        u = u2;
        t = t2;
        kt = kt2;
        kt_end = kt2_end;
#pragma unroll
        for (int q = 0; q < kSlots; ++q) cur[q] = nxt[q];
      }
    }
  } else {
    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs) : "memory");
    const int cw = wg - 1;
    const int g = lane >> 2, tq = lane & 3;
    if constexpr (kSwap) {
      consume_grouped<kBits, kGS, kOut, S, kCons>(sA, sB, bars, cw, warp, lane, Sa, Sw, bias, Y, M, N, K, G, splits,
                                                  kt_per, part, vec_ok);
    } else {
      int* const ipart = reinterpret_cast<int*>(part);  // split-K: int32 slices [splits][M][N]
      int acc[64];
      float facc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0;
      int s = 0;
      uint32_t phase = 0;
      for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
        int t, kt0, kt1, m0, n0;
        unit_range(u, splits, kt_per, ktiles, t, kt0, kt1);
        tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kBN, m0, n0);
        // m64n128 accumulator layout: warp w owns rows 16w..16w+15; acc[4j + 2hh + e] is row
        // gq + 8hh, column 8j + 2tq + e (gq = lane/4).
        const int r0 = m0 + cw * 64 + warp * 16 + g;
        // Per channel: one int32 accumulation over the unit's k-range (all of K unless split),
        // folded once (I2F) at its last stage.
        for (int kt = kt0; kt < kt1; ++kt) {
          mbar_wait(full(s), phase);
          const uint64_t da = make_desc_sw128(sA + s * C::kTileA + cw * 64 * kBK);
          const uint64_t db = make_desc_sw128(sB + s * C::kTileB);
          fence_operands(acc);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)  // +32 B along K = +2 in the address field
            wgmma_n128(acc, da + 2 * kk, db + 2 * kk, kt != kt0 || kk != 0);
          wgmma_commit();
          const bool last = kt == kt1 - 1;
          float4 sw4[8];  // this thread's 32 column scales (read while the wgmmas run)
          if constexpr (kOut != 2) {
            if (last) {
              const float* ss = reinterpret_cast<const float*>(gen(sS + s * 4 * C::kScaleFloats));
#pragma unroll
              for (int q = 0; q < 8; ++q) sw4[q] = reinterpret_cast<const float4*>(ss + 32 * tq)[q];
            }
          }
          wgmma_wait<0>();
          fence_operands(acc);
          if (lane == 0) mbar_arrive(empty(s));
          if (++s == S) { s = 0; phase ^= 1; }
          if (!last) continue;
          if (ipart) {
            // Split-K: the unit's exact int32 sums (acc / 16 for int4) to its workspace slice;
            // int32_splitk_reduce_kernel adds them and applies this epilogue's expression.
            int* slice = ipart + size_t(u % splits) * size_t(M) * N;
            const int c0 = n0 + 2 * tq;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              if (r0 + 8 * hh >= M) continue;
              int* yr = slice + size_t(r0 + 8 * hh) * N + c0;
#pragma unroll
              for (int j = 0; j < 16; ++j) {
                const int v0 = acc[4 * j + 2 * hh] >> (kBits == 4 ? 4 : 0);
                const int v1 = acc[4 * j + 2 * hh + 1] >> (kBits == 4 ? 4 : 0);
                if (c0 + 8 * j + 1 < N && (vec_ok & 4)) *reinterpret_cast<int2*>(yr + 8 * j) = make_int2(v0, v1);
                else if (c0 + 8 * j < N) {
                  yr[8 * j] = v0;
                  if (c0 + 8 * j + 1 < N) yr[8 * j + 1] = v1;
                }
              }
            }
          } else if constexpr (kOut == 2) {
            // y[r·N + c] (G = 1): per row a base pointer.
            const int c0 = n0 + 2 * tq;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              if (r0 + 8 * hh >= M) continue;
              int* yr = static_cast<int*>(Y) + size_t(r0 + 8 * hh) * N + c0;
#pragma unroll
              for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                  if (c0 + 8 * j + e < N) yr[8 * j + e] = acc[4 * j + 2 * hh + e] >> (kBits == 4 ? 4 : 0);
            }
          } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float* w = reinterpret_cast<const float*>(&sw4[j / 2]) + 2 * (j % 2);
#pragma unroll
              for (int i2 = 0; i2 < 4; ++i2) facc[4 * j + i2] = fmaf(float(acc[4 * j + i2]), w[i2 & 1], 0.f);
            }
          }
        }
        if (kOut == 2 || ipart) continue;  // the raw accumulators went out at the last stage

        // Epilogue: y = facc·sa[r] + bias[c].
        float sa[2];
        sa[0] = __ldg(Sa + min(r0, M - 1));
        sa[1] = __ldg(Sa + min(r0 + 8, M - 1));
        if constexpr (kOut == 0) {
          if ((vec_ok & 2) && n0 + kBN <= N) {  // full-width tile, N % 8 == 0, Y 16-byte aligned
#pragma unroll
            for (int q = 0; q < kBN / 32; ++q) {
              float bb[4][2];
#pragma unroll
              for (int jj = 0; jj < 4; ++jj) {
                const int c = n0 + 32 * q + 8 * jj + 2 * tq;
                bb[jj][0] = bias ? __ldg(bias + c) : 0.f;
                bb[jj][1] = bias ? __ldg(bias + c + 1) : 0.f;
              }
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                uint32_t pk[4];
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                  const int i = 4 * (4 * q + jj) + 2 * hh;
                  const __nv_bfloat162 v2 =
                      __floats2bfloat162_rn(fmaf(facc[i], sa[hh], bb[jj][0]), fmaf(facc[i + 1], sa[hh], bb[jj][1]));
                  pk[jj] = *reinterpret_cast<const uint32_t*>(&v2);
                }
                uint32_t got[4];
                quad_exchange(pk, tq, got);
                const int r = r0 + 8 * hh;
                if (r < M)
                  *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(Y) + size_t(r) * N + n0 + 32 * q + 8 * tq) =
                      quad_gather(got, tq);
              }
            }
            continue;
          }
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int c = n0 + 8 * j + 2 * tq;
          if (c >= N) continue;
          const bool two = c + 1 < N;
          const float b0 = bias ? __ldg(bias + c) : 0.f, b1 = bias && two ? __ldg(bias + c + 1) : 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = r0 + 8 * hh;
            if (r >= M) continue;
            const float v0 = fmaf(facc[4 * j + 2 * hh], sa[hh], b0), v1 = fmaf(facc[4 * j + 2 * hh + 1], sa[hh], b1);
            const size_t o = size_t(r) * N + c;
            if constexpr (kOut == 1) {
              float* y = static_cast<float*>(Y) + o;
              if (two && (vec_ok & 1)) *reinterpret_cast<float2*>(y) = make_float2(v0, v1);
              else { y[0] = v0; if (two) y[1] = v1; }
            } else {
              __nv_bfloat16* y = static_cast<__nv_bfloat16*>(Y) + o;
              if (two && (vec_ok & 1)) *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
              else { y[0] = __float2bfloat16_rn(v0); if (two) y[1] = __float2bfloat16_rn(v1); }
            }
          }
        }
      }
    }
  }
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// ---------------------------------------------------------------- host side
// Split-K where the tiles would leave most SMs idle (M <= 128-ish with N = 4096: 32 tiles of 128
// weight rows, 22 of 192, for 132 SMs): units of (tile, k-range), as gemm_w8a8_wgmma's split-K;
// grouped units fold their whole groups into fp32, per-channel ones keep int32. Returns the splits (1: none)
// and sets kt_per, the k-stages a split. PERRY_GQ_SPLITK=0 turns it off, =N forces N (tests, lab).
int grouped_splits(int M, int N, int K, int wrows, int& kt_per) {
  const int ktiles = (K + kBK - 1) / kBK;
  kt_per = ktiles;
  const int forced = split_env("PERRY_GQ_SPLITK");
  if (forced == 0 || forced == 1) return 1;
  const long long tiles = (long long)((M + kBM - 1) / kBM) * ((N + wrows - 1) / wrows);
  return finish_splits(forced > 1 ? forced : fill_splits(tiles, ktiles, sm_count()), ktiles, kt_per);
}

// y[m, n] = fmaf(Σ_s part[s][m][n], sa[m], bias[n]): the unsplit epilogue's expression on the
// slices' sum (added in split order; fp32, so not the unsplit kernel's bits: its fold is one
// running sum over all groups).
template <int kOut>
__global__ void grouped_splitk_reduce_kernel(const float* __restrict__ part, int splits, int M, int N,
                                             const float* __restrict__ Sa, const float* __restrict__ bias,
                                             void* __restrict__ Y) {
  const size_t total = size_t(M) * N;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int sp = 0; sp < splits; ++sp) acc += __ldcg(part + size_t(sp) * total + i);
    const int m = int(i / size_t(N)), n = int(i - size_t(m) * N);
    const float v = fmaf(acc, __ldg(Sa + m), bias ? __ldg(bias + n) : 0.f);
    if constexpr (kOut == 1) static_cast<float*>(Y)[i] = v;
    else static_cast<__nv_bfloat16*>(Y)[i] = __float2bfloat16_rn(v);
  }
}

template <int kBits, int kGS, int kOut, int kCons = 2>
void launch(const int8_t* x, const float* sa, const void* w, const float* sw, const float* bias, void* y, int M,
            int N, int K, int G, int vec_ok, cudaStream_t stream, const char* name, float* ws, size_t ws_bytes) {
  using C = QCfg<kBits, kGS != 0, kCons>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_quant_wgmma_kernel<kBits, kGS, kOut, kCons>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap ta = make_map(x, M, K, kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const CUtensorMap tb = kBits == 8 ? make_map(w, N, K, kBK, C::kWRows, CU_TENSOR_MAP_SWIZZLE_128B, name)
                                    : make_map(w, N, K / 2, kBK / 2, C::kWRows, CU_TENSOR_MAP_SWIZZLE_NONE, name);
  int kt_per = (K + kBK - 1) / kBK, splits = 1;
  {
    int kp = 0;
    const int sp = grouped_splits(M, N, K, C::kWRows, kp);
    const bool room = ws && ws_bytes >= size_t(sp) * size_t(M) * size_t(N) * 4;
    // Grouped I32 (the exactness tests) stores each group's partials directly: no workspace.
    if (sp > 1 && (room || (kGS != 0 && kOut == 2))) {
      splits = sp;
      kt_per = kp;
    }
  }
  const long long units = (long long)((M + kBM - 1) / kBM) * ((N + C::kWRows - 1) / C::kWRows) * splits;
  const int sms = sm_count();
  const unsigned grid = unsigned(units < sms ? units : sms);
  float* part = splits > 1 && (kGS == 0 || kOut != 2) ? ws : nullptr;
  if (part && kGS == 0 && N % 2 == 0) vec_ok |= 4;  // int2 stores into the int32 slices
  // PERRY_LAB_GQ_SKIP_FOLD=1 (lab only, the outputs are wrong): the grouped kernels without their
  // per-group fold, to measure what the rest of the pipeline reaches.
  if (kGS != 0 && split_env("PERRY_LAB_GQ_SKIP_FOLD") == 1) vec_ok |= 8;
  gemm_quant_wgmma_kernel<kBits, kGS, kOut, kCons><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      ta, tb, sa, sw, bias, part ? static_cast<void*>(nullptr) : y, M, N, K, G, vec_ok, splits, kt_per, part);
  check_launch(name);
  if (part) {
    if constexpr (kGS == 0) {
      int32_splitk_reduce<kOut, true>(reinterpret_cast<const int*>(part), splits, M, N, sa, sw, bias, y, stream);
    } else if constexpr (kOut != 2) {
      grouped_splitk_reduce_kernel<kOut><<<reduce_blocks(M, N), 256, 0, stream>>>(part, splits, M, N, sa, bias, y);
      check_launch("grouped_splitk_reduce_kernel");
    }
  }
}

// Consumer warpgroups of the grouped modes: two (128 weight rows a tile, two accumulator sets) or
// three (192 rows, one set). Per tile row, three are a little faster for int4 and a little slower
// for int8 (H200 lab, M 4096 N 14336 K 4096: w4a8-g128 598 vs 562 TOPS, w8a8-g128 780 vs 787;
// small-M bench-op, eleventh session: int8 with three ~10% slower a row). But below a few waves the
// tile count decides: at M 256, N 14336 two give 224 tiles (2 waves of 128 rows) and three 150
// (2 waves of 192 rows); at M 512, N 6144 two give 192 tiles (2 waves) and three 128 (1 wave).
// So the estimate below — waves × rows × k-stages a unit × the row cost, plus the split-K
// reduction where the plan splits — picks the count per shape. Eleventh session, run 2 (bench-op,
// M 64–1024, five shapes, both modes, both counts forced; GEMM times): the estimate picks the
// faster count in 70 of 80 cases, the other 10 within 0.4–3%; its picks are up to 1.32× faster
// than the fixed count. PERRY_GEMM_QUANT_WG=2|3 forces one for A/B runs.
int grouped_warpgroups(int bits, int M, int N, int K) {
  const int forced = split_env("PERRY_GEMM_QUANT_WG");  // (read per call: the tests switch it)
  if (forced == 2 || forced == 3) return forced;
  const int sms = sm_count(), ktiles = (K + kBK - 1) / kBK;
  auto estimate_us = [&](int cons) {
    constexpr double kStageUs = 0.7;  // one 128 × 128 × 128-k tile stage on one SM (bench-op, M 512)
    const int wrows = 64 * cons;
    int kt_per = ktiles;
    const int splits = grouped_splits(M, N, K, wrows, kt_per);
    const long long units = (long long)((M + kBM - 1) / kBM) * ((N + wrows - 1) / wrows) * splits;
    const double row_cost = cons == 2 ? 1.0 : bits == 4 ? 0.94 : 1.1;
    double us = double((units + sms - 1) / sms) * (wrows / 128.0) * kt_per * kStageUs * row_cost;
    // The split's second kernel: a launch, and the fp32 slices written and read back (mostly L2).
    if (splits > 1) us += 2.0 + double(splits) * M * N * 8 / 8e6;
    return us;
  };
  return estimate_us(3) < estimate_us(2) ? 3 : 2;
}

template <int kBits, int kGS>
void launch_out(DType out, const int8_t* x, const float* sa, const void* w, const float* sw, const float* bias,
                void* y, int M, int N, int K, int G, int vec_ok, cudaStream_t s, float* ws, size_t wb) {
  if constexpr (kGS != 0) {
    if (grouped_warpgroups(kBits, M, N, K) == 3) {
      switch (out) {
        case DType::I32: return launch<kBits, kGS, 2, 3>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma3<i32>", ws, wb);
        case DType::F32: return launch<kBits, kGS, 1, 3>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma3<f32>", ws, wb);
        default: return launch<kBits, kGS, 0, 3>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma3<bf16>", ws, wb);
      }
    }
  }
  switch (out) {
    case DType::I32: return launch<kBits, kGS, 2>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<i32>", ws, wb);
    case DType::F32: return launch<kBits, kGS, 1>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<f32>", ws, wb);
    default: return launch<kBits, kGS, 0>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<bf16>", ws, wb);
  }
}

using quant_args::aligned;

}  // namespace

bool gemm_quant_wgmma_supported() {
  if (!sm90::device_is_sm90()) return false;
  static const bool code = sm90::sm90_code_present(reinterpret_cast<const void*>(&gemm_quant_wgmma_kernel<8, 128, 0>));
  return code;
}

size_t gemm_quant_wgmma_workspace_bytes(QuantMode mode, int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0 || !gemm_quant_wgmma_supported()) return 0;
  const QuantModeBits mb = quant_mode_bits(mode);
  if (!mb.a8) return 0;
  int kt_per = 0;
  const int wrows = mb.group_size == 0 ? kBN : 64 * grouped_warpgroups(mb.bits, M, N, K);
  const int splits = grouped_splits(M, N, K, wrows, kt_per);
  return splits > 1 ? size_t(splits) * size_t(M) * size_t(N) * 4 : 0;
}

void gemm_quant_wgmma(QuantMode mode, const int8_t* x, const float* sa, const void* qweight, const float* scales,
                      const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
  gemm_quant_wgmma(mode, x, sa, qweight, scales, bias, y, out, M, N, K, stream, nullptr, 0);
}

void gemm_quant_wgmma(QuantMode mode, const int8_t* x, const float* sa, const void* qweight, const float* scales,
                      const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream,
                      float* workspace, size_t workspace_bytes) {
  const QuantModeBits mb = quant_mode_bits(mode);
  const std::string where = std::string("gemm_quant_wgmma(") + mb.name + ", M=" + std::to_string(M) +
                            ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (!mb.a8) throw Error(where + ": weight-only mode: use dequantize_weight_bf16 + a bf16 GEMM");
  if (!gemm_quant_wgmma_supported()) throw Error(where + ": needs an sm_90 device (H100/H200)");
  if (M < 1 || N < 1 || K < 1 || K > 65536) throw Error(where + ": need M, N >= 1, 1 <= K <= 65536");
  const int kalign = mb.bits == 8 ? 16 : 32;
  if (K % kalign != 0) throw Error(where + ": K must be a multiple of " + std::to_string(kalign));
  quant_args::check_gemm_pointers(where, x, sa, qweight, scales, bias, y, out);
  const size_t es = out == DType::BF16 ? 2 : 4;
  const int gs = mb.group_size;
  if (gs != 0 && gs != 64 && gs != 128) throw Error(where + ": group size must be 64 or 128");
  if (mb.bits == 4 && gs == 64) throw Error(where + ": int4 with 64-wide groups is not a perry mode");
  const int G = gs > 0 ? (K + gs - 1) / gs : 1;
  // Bit 0: pair stores (N even, y 2-element aligned); bit 1: 16-byte bf16 stores (N % 8 == 0);
  // launch adds bit 2 (int2 stores into per-channel split slices) and bit 3 (the lab's no-fold run).
  int vec_ok = (N % 2 == 0 && aligned(y, 2 * es)) ? 1 : 0;
  if (out == DType::BF16 && N % 8 == 0 && aligned(y, 16)) vec_ok |= 2;
  if (workspace && !aligned(workspace, 16)) throw Error(where + ": the split-K workspace must be 16-byte aligned");
  float* ws = workspace;
  const size_t wb = workspace_bytes;
  if (mb.bits == 8) {
    if (gs == 128) launch_out<8, 128>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream, ws, wb);
    else if (gs == 64) launch_out<8, 64>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream, ws, wb);
    else launch_out<8, 0>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream, ws, wb);
  } else {
    if (gs == 128) launch_out<4, 128>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream, ws, wb);
    else launch_out<4, 0>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream, ws, wb);
  }
}

}  // namespace perry::cuda
