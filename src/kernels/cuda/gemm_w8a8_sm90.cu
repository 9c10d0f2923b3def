// The sm_90a W8A8 GEMM on wgmma + TMA: CudaLinear's w8a8 kernel on an H100/H200 past
// gemm_small_m (M > 32), and the kernel of w8a8-fp8 (e4m3 operands). Tested exact by
// CudaGemmW8A8.WgmmaExperimentalExactOnSm90 / WgmmaSplitKMatchesUnsplitBitForBit, timed by
// `perry bench-op --device cuda` and `lab_cuda_gemm_w8a8 --wgmma`. Design notes and the measured
// steps: docs/cuda-gemm-w8a8-sm90.md. The sm_90a building blocks it shares with gemm_quant_sm90.cu
// (mbarriers, TMA, wgmma wrappers, tile order, tensor maps) live in sm90_gemm_common.cuh.
// Split-K (splitk_splits below) for small M × N: (tile, k-range) units, exact int32 partials,
// added by the split-0 unit inside the kernel (splitk_fixup, with tile flags from the caller) or
// by a second kernel (int32_splitk_reduce, without).
//
// Y[M,N] = X[M,K]·W[N,K]ᵀ, both operands K-major int8 (the only layout int8 wgmma takes).
//   * Block tile 128×BN×128 (BN = 256, or 128 when 256-wide tiles would leave SMs idle, or 160
//     where that gives the busiest SM fewer columns: coop160_schedule), a ring
//     of kStages shared-memory stages, each holding the A tile [128 rows × 128 B] and the B tile
//     [BN rows × 128 B] in the TMA 128-byte-swizzle layout (row r at r·128, its 16-byte chunk c
//     stored at chunk c ^ (r & 7); every tile base 1024-byte aligned so the pattern is the same
//     for TMA, which swizzles on address bits, and wgmma).
//   * 3 warpgroups (384 threads). Warpgroup 0 is the producer: one thread issues the TMA loads
//     (cp.async.bulk.tensor.2d, completing on the stage's "full" mbarrier with expect_tx) after
//     waiting on the stage's "empty" mbarrier; it gives registers away (setmaxnreg.dec 40).
//     Warpgroups 1 and 2 are consumers (setmaxnreg.inc 232): each owns 64 rows of the tile and
//     issues wgmma.mma_async m64nBNk32 s32.s8.s8, 4 per stage (K = 128 B), keeping one
//     commit-group in flight (wait_group 1) and releasing the previous stage to the producer
//     (one arrive per consumer warp: empty count 8) once its wgmmas have completed.
//     That is the cooperative schedule; the ping-pong ones (Cfg, ping128_schedule) give each
//     consumer warpgroup whole tiles in turn — of 64 rows, or of 128 rows whose two halves it
//     issues itself — so one warpgroup's epilogue runs while the other's wgmmas keep the tensor
//     cores busy (an empty count of 4: the warps of the warpgroup that read the stage).
//   * Persistent: grid = min(#SMs, #tiles); both roles walk the same tile sequence
//     blockIdx.x, +gridDim.x, ... in a grouped order (8 row-tiles per group, columns inside a
//     group) so the CTAs running at one time share A and B tiles in L2.
//   * The epilogue is fused: straight from the accumulator registers, y = acc·sa[m]·sw[n]
//     (+bias[n]) → bf16 / f32, or the raw int32 (exactness tests); rows ≥ M and columns ≥ N are
//     predicated off, TMA zero-fills loads past M, N and K (so K % 128 != 0 is exact).
//   * Only the async proxy (TMA writes, wgmma reads) touches the operand tiles, so no
//     fence.proxy.async is needed in the main loop; mbarrier phases order reuse.
// No deadlock by construction: every full barrier receives exactly one arrive.expect_tx of the
// whole stage's bytes (TMA counts out-of-bounds, zero-filled bytes too), every empty barrier
// exactly one arrive per consumer warp that reads the stage (8 cooperative, 4 ping-pong) per use,
// and producer and consumers iterate identical (tile, k) sequences.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kBM = 128;         // rows of X per tile (2 consumer warpgroups × 64)
constexpr int kBK = 128;         // K bytes per stage = the 128-byte swizzle span
constexpr int kThreads = 384;    // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kGroupM = 8;       // grouped tile order: 8 row-tiles per group

// kPing: the ping-pong schedule (chosen by dispatch() below): each consumer
// warpgroup owns whole tiles of 64 rows, taken in turns, so one warpgroup's epilogue runs while
// the other's wgmmas keep the tensor cores busy. Nsight Compute on the cooperative schedule
// (both warpgroups on one 128-row tile, eighth session): tensor pipe 72% busy, L2 49%, DRAM 29%
// — the tensor cores wait through every tile's epilogue, not for memory.
// kPing128 (with kPing, BN 128): ping-pong on 128-row tiles — each warpgroup issues both 64-row
// halves of its tile (two accumulator sets), so the tile and its traffic are the cooperative
// kernel's while a warpgroup's epilogue runs under the other's main loop (64-row ping-pong tiles
// read each weight tile twice as often, s36: its main loop alone was 21% slower at M 1024).
template <int BN, bool kPing = false, bool kPing128 = false>
struct Cfg {
  static_assert(!kPing128 || (kPing && BN == 128), "128-row ping-pong: BN 128, 64 + 64 accumulators a thread");
  static_assert(BN != 160 || !kPing, "160-column tiles: cooperative schedule only");
  static constexpr int kRows = kPing && !kPing128 ? 64 : kBM;  // rows of X per tile (and per stage)
  static constexpr int kStages = kPing && !kPing128 ? (BN == 256 ? 5 : 8) : (BN == 256 ? 4 : 6);
  static constexpr int kTileA = kRows * kBK;        // 16 KiB (8 on 64-row ping-pong tiles)
  static constexpr int kTileB = BN * kBK;           // 32, 20 or 16 KiB (a multiple of 1 KiB: swizzle-aligned)
  static constexpr int kStageBytes = kTileA + kTileB;
  static constexpr int kGroupRows = kRows == 64 ? 2 * kGroupM : kGroupM;  // row-tiles per L2 group: 1024 rows
  static constexpr int kEmptyArrivals = kPing ? 4 : kConsumerWarps;  // the warps that read a stage
  static constexpr int kBarrierBytes = 2 * kStages * 8 + 16;  // full[S], empty[S], turn[2]
  // The epilogue's operands of a consumer warpgroup's tile, copied in while its main loop runs:
  // sa of its rows (64; 128 for kPing128), then sw and bias of the tile's BN columns (floats).
  static constexpr int kEpiRows = kPing128 ? 128 : 64;
  static constexpr int kEpiFloats = kEpiRows + 2 * BN;
  static constexpr int kEpiBytes = 2 * kEpiFloats * 4;
  // + 1024: the dynamic shared window is only 16-byte aligned by contract; the kernel rounds up.
  static constexpr int kSmemBytes = kStages * kStageBytes + kBarrierBytes + kEpiBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");
};


// An accumulator register's value: the int32 of an s8 wgmma, or the fp32 bits of an e4m3 one.
template <bool kFp8>
__device__ __forceinline__ float acc_value(int a) {
  if constexpr (kFp8) return __int_as_float(a);
  else return float(a);
}

// Split-K's fixup inside the kernel (kFixup), by each consumer warp for its 16 rows of tile t
// (wpos: the warp's place, 0..7, in the 128-row tile; acc: its int32 sums over its split's
// k-tiles). Units v0..v1 = (t, split 0 .. splits − 1), one a CTA, all resident at once (grid =
// units <= SMs). Units v0+1..v1 write their sums to slot v and count themselves on flags[8t +
// wpos] with a release add — no wait. Unit v0, the owner, waits for the v1 − v0 counts (acquire
// loads; the splits take the same time, so the wait is short), adds the slots into acc (int32:
// exact in any order, the unsplit kernel's bits), resets the flag (so flags the caller zeroed once
// stay zero between calls) and returns true: store the tile. The others return false. The wait
// cannot deadlock: every unit has its own CTA and none waits on the owners. A slot is [8 warps]
// [BN/2 registers][32 lanes] int32: each register's stores are 128 contiguous bytes. What it
// replaces — a second kernel reading every split's whole partial sums — cost its launch and a
// pass over splits·M·N int32 after this kernel's tail.
// live = false: the warp's 16 rows are all past M (M = 64 fills half a tile): no unit stores or
// waits for them (the flag stays 0), and the owner's epilogue skips the rows — measured at M 64,
// N 2560, K 10240, those dead slots made the fixup 10% slower than the second kernel (s31-1).
template <int BN>
__device__ __forceinline__ bool splitk_fixup(int (&acc)[BN / 2], int v0, int v1, int t, int wpos, int lane, bool live,
                                             int* __restrict__ part, unsigned* __restrict__ flags) {
  if (v1 == v0) return true;
  if (!live) return int(blockIdx.x) == v0;
  constexpr int kVals = BN / 2;
  auto slot = [&](int v) { return part + (size_t(v) * 8 + size_t(wpos)) * size_t(kVals * 32) + lane; };
  unsigned* f = flags + 8 * size_t(t) + size_t(wpos);
  if (int(blockIdx.x) != v0) {
    int* mine = slot(int(blockIdx.x));
#pragma unroll
    for (int i = 0; i < kVals; ++i) __stcg(mine + 32 * i, acc[i]);
    __syncwarp();  // (orders the lanes' stores before lane 0's release)
    if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(f) : "memory");
    return false;
  }
  if (lane == 0) {
    unsigned n = 0;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(n) : "l"(f) : "memory");
      if (n >= unsigned(v1 - v0)) break;
      __nanosleep(64);
    }
    *f = 0u;
  }
  __syncwarp();  // (orders the other lanes' loads after lane 0's acquire)
  // Each slot is one L2 round trip of kVals loads a lane, in series: ~0.9 µs a split at M 128
  // (s35 run 2), which is why splitk_splits keeps the count low.
  for (int v = v0 + 1; v <= v1; ++v) {
    const int* p = slot(v);
#pragma unroll
    for (int i = 0; i < kVals; ++i) acc[i] += __ldcg(p + 32 * i);
  }
  return true;
}

// kOut: 0 = bf16, 1 = f32, 2 = i32 (int8 only); kFp8: e4m3 operands, fp32 accumulators; kPing:
// the ping-pong schedule (Cfg); kFixup: split-K (splits > 1) with its fixup inside the kernel
// (splitk_fixup; cooperative, int8 only, one unit a CTA): part and flags are its partial-sum slots
// and tile counters, unused otherwise.
template <int kOut, int BN, bool kFp8 = false, bool kPing = false, bool kFixup = false, bool kPing128 = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w8a8_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                           const float* __restrict__ Sa, const float* __restrict__ Sw,
                           const float* __restrict__ bias, void* __restrict__ Y, int M, int N, int K, int vec_ok,
                           int splits, int kt_per, int* __restrict__ part, unsigned* __restrict__ flags) {
#ifdef PERRY_WGMMA
  static_assert(!(kFp8 && kOut == 2), "e4m3 accumulates in fp32: no int32 output");
  static_assert(!kFixup || (!kFp8 && !kPing), "split-K fixup: int8 sums (exact in any order), cooperative schedule");
  using C = Cfg<BN, kPing, kPing128>;
  constexpr int S = C::kStages, kRows = C::kRows, kEpiRows = C::kEpiRows;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base;                          // S × [kRows × 128 B]
  const uint32_t sB = base + S * C::kTileA;          // S × [BN × 128 B]
  const uint32_t bars = sB + S * C::kTileB;          // full[S], empty[S], turn[2]
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  // Ping-pong: turn[w] completes a phase each time the other consumer warpgroup has issued a
  // whole tile's wgmmas (one arrive per warp) — warpgroup w's next tile may start then.
  auto turn = [&](int w) { return bars + 8u * (2 * S + w); };
  const uint32_t sEpi = bars + C::kBarrierBytes;     // 2 × kEpiFloats (one set a consumer warpgroup)

  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tiles_m = (M + kRows - 1) / kRows, tiles_n = (N + BN - 1) / BN;
  const int ktiles = (K + kBK - 1) / kBK;
  // Split-K (splits > 1, cooperative schedule, I32 partials only): work unit u is k-tiles
  // [split·kt_per, +kt_per) of tile u / splits, its int32 sums stored at Y + split·M·N.
  const int num_units = tiles_m * tiles_n * splits;
  // Piece of work i of this CTA: its tile t, k-tiles [kt0, kt1) and output slice (split-K: the
  // split's int32 partials). False past the CTA's last.
  // (kFixup: the split's sums go to the owner, which stores the tile in slice 0.)
  auto work = [&](int i, int& t, int& kt0, int& kt1, int& slice) -> bool {
    const int u = blockIdx.x + i * gridDim.x;
    if (u >= num_units) return false;
    t = u / splits;
    kt0 = (u % splits) * kt_per;
    kt1 = min(ktiles, kt0 + kt_per);
    slice = kFixup ? 0 : u % splits;
    return true;
  };

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1);                     // the producer's arrive.expect_tx (+ the TMA bytes)
      mbar_init(empty(s), C::kEmptyArrivals);  // one arrive per consumer warp that reads the stage
    }
    mbar_init(turn(0), 4);
    mbar_init(turn(1), 4);
    // Make the initialized barriers visible to the async proxy (TMA complete_tx) too.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup: one thread issues all TMA loads ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmA)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmB)) : "memory");
      int s = 0;
      uint32_t phase = 0;
      int t, kt0, kt1, slice;
      for (int i = 0; work(i, t, kt0, kt1, slice); ++i) {
        int m0, n0;
        tile_origin<kRows, C::kGroupRows>(t, tiles_m, tiles_n, BN, m0, n0);
        for (int kt = kt0; kt < kt1; ++kt) {
          mbar_wait(empty(s), phase ^ 1);  // consumers have released this stage's last use
          mbar_arrive_expect_tx(full(s), C::kStageBytes);
          tma_load_2d(sA + s * C::kTileA, &tmA, kt * kBK, m0, full(s));
          tma_load_2d(sB + s * C::kTileB, &tmB, kt * kBK, n0, full(s));
          if (++s == S) { s = 0; phase ^= 1; }
        }
      }
    }
  } else {
    // ---------------- consumer warpgroups: wgmma + fused epilogue ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1;  // cooperative: which 64-row half of the tile; ping-pong: whose turn
    int acc[BN / 2], acc_hi[BN / 2];  // (acc_hi: kPing128's second 64 rows; unused otherwise)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = acc_hi[i] = 0;
    int s = 0;
    uint32_t phase = 0;
    // Cooperative: both warpgroups take every tile of this CTA (blockIdx.x, +gridDim.x, ...).
    // Ping-pong: warpgroup cw takes the CTA's tiles i = cw, cw + 2, ... — the producer still loads
    // them all in order into one ring, so tile i's stages sit at ring positions i·ktiles + kt.
    for (int i = kPing ? cw : 0;; i += kPing ? 2 : 1) {
      int t, kt0, kt1, slice;
      if (!work(i, t, kt0, kt1, slice)) break;
      int m0, n0;
      tile_origin<kRows, C::kGroupRows>(t, tiles_m, tiles_n, BN, m0, n0);
      // The epilogue's sa, sw and bias for this tile, copied into this warpgroup's set now, so
      // that the epilogue reads shared memory instead of waiting on L2 round trips after the last
      // wgmma (the tensor cores idle through them in the cooperative schedule). The barrier: every
      // thread of the warpgroup has read the previous tile's set (and its copies, if that tile's
      // epilogue was skipped by split-K, have landed). Indices are clamped as the loads were.
      const uint32_t epi = sEpi + cw * (C::kEpiFloats * 4);
      if constexpr (kOut != 2) {
        cp_async_wait_all_groups();
        named_barrier(1 + cw, 128);
        const int rbase = m0 + (kPing ? 0 : cw * 64), nf = bias ? C::kEpiFloats : kEpiRows + BN;
        for (int f = threadIdx.x % 128; f < nf; f += 128) {
          const float* src = f < kEpiRows ? Sa + min(rbase + f, M - 1)
                                          : (f < kEpiRows + BN ? Sw + min(n0 + f - kEpiRows, N - 1)
                                                               : bias + min(n0 + f - kEpiRows - BN, N - 1));
          cp_async4(epi + 4u * f, src);
        }
        cp_async_commit_group();
      }
      if constexpr (kPing) {
        // Wait for the other warpgroup to have issued tile i − 1: only then are this tile's
        // stages at most one ring lap ahead of every full barrier (parity waits need that).
        if (i > 0) mbar_wait(turn(cw), uint32_t((i - 1) / 2) & 1u);
        const long long pos = (long long)i * ktiles;
        s = int(pos % S);
        phase = uint32_t(pos / S) & 1u;
      }
      int prev = -1, prev2 = -1;
      for (int kt = kt0; kt < kt1; ++kt) {
        mbar_wait(full(s), phase);
        const uint64_t da = make_desc_sw128(sA + s * C::kTileA + (kPing ? 0 : cw * 64 * kBK));
        const uint64_t db = make_desc_sw128(sB + s * C::kTileB);
        // (kPing128: the tile's rows 64..127, 64 rows × 128 B further: whole 1 KiB swizzle atoms)
        const uint64_t da_hi = make_desc_sw128(sA + s * C::kTileA + 64 * kBK);
        fence_operands(acc);
        if constexpr (kPing128) fence_operands(acc_hi);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {  // +32 B along K = +2 in the address field
          wgmma_tile<BN, kFp8>(acc, da + 2 * kk, db + 2 * kk, kt != kt0 || kk != 0);
          if constexpr (kPing128) wgmma_tile<BN, kFp8>(acc_hi, da_hi + 2 * kk, db + 2 * kk, kt != kt0 || kk != 0);
        }
        wgmma_commit();
        if constexpr (kPing) {
          // One warpgroup alone feeds the tensor cores: keep two stages' wgmmas in flight, hand
          // back the stage before them.
          wgmma_wait<2>();
          fence_operands(acc);
          if constexpr (kPing128) fence_operands(acc_hi);
          if (prev2 >= 0 && lane == 0) mbar_arrive(empty(prev2));
          prev2 = prev;
        } else {
          wgmma_wait<1>();  // the previous stage's wgmmas are done: hand that stage back
          fence_operands(acc);
          if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        }
        prev = s;
        if (++s == S) { s = 0; phase ^= 1; }
      }
      if constexpr (kPing) {
        if (lane == 0) mbar_arrive(turn(1 - cw));  // every wgmma of this tile is issued: the other's turn
      }
      wgmma_wait<0>();
      fence_operands(acc);
      if constexpr (kPing128) fence_operands(acc_hi);
      if (lane == 0) {
        if (prev2 >= 0) mbar_arrive(empty(prev2));  // (ping-pong only; in ring order)
        mbar_arrive(empty(prev));  // ktiles >= 1, so prev is a stage
      }
      if constexpr (kFixup) {
        const bool live = m0 + cw * 64 + warp * 16 < M;
        if (!splitk_fixup<BN>(acc, t * splits, t * splits + splits - 1, t, cw * 4 + warp, lane, live, part, flags)) {
          cp_async_wait_all_groups();  // (its operand copies land before the CTA may exit)
          continue;  // the tile's owner adds these sums and stores it
        }
      }

      // Epilogue. m64nBN accumulator layout: warp w of the warpgroup owns rows 16w..16w+15;
      // acc[4j + 2h + e] is row g + 8h, column 8j + 2t + e (g = lane/4, t = lane%4).
      // (ep: this warpgroup's copied operands — sa at [0, kEpiRows), sw at kEpiRows + column, bias
      // at kEpiRows + BN + column)
      const float* ep = reinterpret_cast<const float*>(smem_raw + (epi - smem_addr(smem_raw)));
      if constexpr (kOut != 2) {
        cp_async_wait_all_groups();
        named_barrier(1 + cw, 128);  // every thread's copies are visible
      }
      // The epilogue of the 64 rows at hh·64 of this warpgroup's share of the tile, from acc.
      auto epilogue_rows = [&](const int (&acc)[BN / 2], int hh) {
        const int g = lane >> 2, tq = lane & 3;
        const int r0 = m0 + (kPing ? 0 : cw * 64) + hh * 64 + warp * 16 + g;
        float sa[2] = {0.f, 0.f};
        if constexpr (kOut != 2) {
          sa[0] = ep[hh * 64 + warp * 16 + g];
          sa[1] = ep[hh * 64 + warp * 16 + g + 8];
        }
        if constexpr (kOut == 0) {
          // bf16 fast path (the tile's columns all < N, N % 8 == 0, Y 16-byte aligned): a 4×4
          // transpose of packed bf16 pairs inside each quad (3 shuffles) so that each thread
          // stores 8 consecutive outputs (16 B) instead of 4 scattered 4-byte pairs.
          if ((vec_ok & 2) && n0 + BN <= N) {
#pragma unroll
            for (int q = 0; q < BN / 32; ++q) {
              float sw0[4], sw1[4], b0[4], b1[4];
#pragma unroll
              for (int jj = 0; jj < 4; ++jj) {
                const int c = 32 * q + 8 * jj + 2 * tq;  // (the tile's column)
                const float2 w2 = *reinterpret_cast<const float2*>(ep + kEpiRows + c);
                const float2 b2 =
                    bias ? *reinterpret_cast<const float2*>(ep + kEpiRows + BN + c) : make_float2(0.f, 0.f);
                sw0[jj] = w2.x;
                sw1[jj] = w2.y;
                b0[jj] = b2.x;
                b1[jj] = b2.y;
              }
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                uint32_t pk[4];
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                  const int j = 4 * q + jj;
                  const float v0 = acc_value<kFp8>(acc[4 * j + 2 * h]) * (sa[h] * sw0[jj]) + b0[jj];
                  const float v1 = acc_value<kFp8>(acc[4 * j + 2 * h + 1]) * (sa[h] * sw1[jj]) + b1[jj];
                  const __nv_bfloat162 b2 = __floats2bfloat162_rn(v0, v1);
                  pk[jj] = *reinterpret_cast<const uint32_t*>(&b2);
                }
                uint32_t got[4];
                quad_exchange(pk, tq, got);
                const int r = r0 + 8 * h;
                if (r < M) {
                  const uint4 v = quad_gather(got, tq);
                  *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(Y) + size_t(r) * N + n0 + 32 * q + 8 * tq) = v;
                }
              }
            }
            return;
          }
        }
        // Column scales and bias from the copied set in chunks of kJC column groups (its entries
        // past N hold column N − 1's: clamped, as the loads were).
        constexpr int kJC = (BN / 8) % 8 == 0 ? 8 : 4;  // (160 columns: 20 groups)
#pragma unroll
        for (int j0 = 0; j0 < BN / 8; j0 += kJC) {
          float sw0[kJC], sw1[kJC], b0[kJC], b1[kJC];
#pragma unroll
          for (int jj = 0; jj < kJC; ++jj) {
            sw0[jj] = sw1[jj] = b0[jj] = b1[jj] = 0.f;
            if constexpr (kOut != 2) {
              const int c = 8 * (j0 + jj) + 2 * tq;  // (the tile's column)
              sw0[jj] = ep[kEpiRows + c];
              sw1[jj] = ep[kEpiRows + c + 1];
              if (bias) {
                b0[jj] = ep[kEpiRows + BN + c];
                b1[jj] = ep[kEpiRows + BN + c + 1];
              }
            }
          }
#pragma unroll
          for (int jj = 0; jj < kJC; ++jj) {
            const int j = j0 + jj;
            const int c = n0 + 8 * j + 2 * tq;
            if (c >= N) continue;
            const bool pair = c + 1 < N;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = r0 + 8 * h;
              if (r >= M) continue;
              const int a0 = acc[4 * j + 2 * h], a1 = acc[4 * j + 2 * h + 1];
              const size_t o = size_t(r) * N + c;
              if constexpr (kOut == 2) {
                int* y = static_cast<int*>(Y) + size_t(slice) * size_t(M) * N + o;
                if (pair && vec_ok) {
                  *reinterpret_cast<int2*>(y) = make_int2(a0, a1);
                } else {
                  y[0] = a0;
                  if (pair) y[1] = a1;
                }
              } else {
                const float v0 = acc_value<kFp8>(a0) * (sa[h] * sw0[jj]) + b0[jj];
                const float v1 = acc_value<kFp8>(a1) * (sa[h] * sw1[jj]) + b1[jj];
                if constexpr (kOut == 1) {
                  float* y = static_cast<float*>(Y) + o;
                  if (pair && vec_ok) {
                    *reinterpret_cast<float2*>(y) = make_float2(v0, v1);
                  } else {
                    y[0] = v0;
                    if (pair) y[1] = v1;
                  }
                } else {
                  __nv_bfloat16* y = static_cast<__nv_bfloat16*>(Y) + o;
                  if (pair && vec_ok) {
                    *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
                  } else {
                    y[0] = __float2bfloat16_rn(v0);
                    if (pair) y[1] = __float2bfloat16_rn(v1);
                  }
                }
              }
            }
          }
        }
      };
      epilogue_rows(acc, 0);
      if constexpr (kPing128) epilogue_rows(acc_hi, 1);
    }
  }
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// ---------------------------------------------------------------- host side

// kFixup: split-K with the fixup in the kernel (part and flags: its slots and counters).
template <int kOut, int BN, bool kFp8, bool kPing, bool kFixup = false, bool kPing128 = false>
void launch(const void* dX, const float* dSa, const void* dW, const float* dSw, const float* dBias, void* dY,
            int M, int N, int K, int vec_ok, int sms, cudaStream_t stream, const char* name, int splits = 1,
            int kt_per = 0, int* part = nullptr, unsigned* flags = nullptr) {
  using C = Cfg<BN, kPing, kPing128>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_w8a8_wgmma_kernel<kOut, BN, kFp8, kPing, kFixup, kPing128>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap ta = make_map(dX, M, K, kBK, C::kRows, CU_TENSOR_MAP_SWIZZLE_128B, "gemm_w8a8_wgmma"),
                    tb = make_map(dW, N, K, kBK, BN, CU_TENSOR_MAP_SWIZZLE_128B, "gemm_w8a8_wgmma");
  const long long units = (long long)((M + C::kRows - 1) / C::kRows) * ((N + BN - 1) / BN) * splits;
  const unsigned grid = unsigned(units < sms ? units : sms);
  if (kt_per <= 0) kt_per = (K + kBK - 1) / kBK;
  gemm_w8a8_wgmma_kernel<kOut, BN, kFp8, kPing, kFixup, kPing128><<<grid, kThreads, C::kSmemBytes, stream>>>(
      ta, tb, dSa, dSw, dBias, dY, M, N, K, vec_ok, splits, kt_per, part, flags);
  check_launch(name);
}

// Tiles of kBM rows × bn columns over an M × N output, and how many of them the busiest of sms
// SMs runs in series (the persistent grid deals them out in turn).
long long tile_count(int M, int N, int bn) { return (long long)((M + kBM - 1) / kBM) * ((N + bn - 1) / bn); }
long long waves(long long tiles, int sms) { return (tiles + sms - 1) / sms; }

// Column tile width: 256 unless that leaves clearly more of the last wave idle than 128 does.
// PERRY_WGMMA_BN=128|256 forces one (kernel-lab experiments and tests). 160-column tiles are
// coop160_schedule's choice, on the busiest SM's columns rather than the last wave's fill (both
// 128 and 256 fill their waves "well" at N 2560, M 1024, where 160 is 1.4× faster); 192 / 224
// measured no faster (s31-2).
int pick_bn(int M, int N, int sms) {
  const char* e = std::getenv("PERRY_WGMMA_BN");  // read per call: the lab and tests switch it
  const int forced = e ? std::atoi(e) : 0;
  if (forced == 128 || forced == 256) return forced;
  auto eff = [&](int bn) {
    const long long t = tile_count(M, N, bn);
    return double(t) / double(waves(t, sms) * sms);
  };
  return eff(128) > 1.1 * eff(256) ? 128 : 256;
}

// Split-K of the int8 GEMM where its tiles would leave most SMs idle (small M with small N: at
// M = 128, N = 4096 there are 32 tiles for 132 SMs, and each streams the weights at one SM's
// rate): units of (tile, k-range) fill the GPU, each writes its int32 sums to its own slice of a
// workspace, and int32_splitk_reduce_kernel adds the slices (exactly: integers) and applies the same
// epilogue expression as the GEMM, so the outputs are the unsplit kernel's bit for bit.
// Returns the number of splits (1: none); kt_per = k-tiles per split. PERRY_WGMMA_SPLITK=0 turns
// it off, =N forces N splits (tests, lab).
int splitk_splits(int M, int N, int K, int sms, int& kt_per) {
  const int ktiles = (K + kBK - 1) / kBK;
  kt_per = ktiles;
  const int forced = split_env("PERRY_WGMMA_SPLITK");
  if (forced == 0 || forced == 1) return 1;
  const int bn = pick_bn(M, N, sms);
  const long long tiles = tile_count(M, N, bn);
  int splits = forced;
  if (forced < 0) {
    splits = fill_splits(tiles, ktiles, sms);
    // Not more units than about half the SMs: past that the weight stream was no faster, while
    // every split adds a partial that the tile's owner reads in series (splitk_fixup). H100, s35
    // run 2 (bench-op `gemm ms`, M 128, the counts forced): N 2560 × K 10240 (20 tiles) 2 / 3 /
    // 4 / 5 / 6 splits 24.5 / 22.5 / 22.5 / 23.2 / 24.3 µs (6 was the fill, 3 is this rule's);
    // N 4096 × K 14336 (32 tiles) 2 / 3 / 4: 33.9 / 34.7 / 35.4 (4 was the fill, 2 this rule's).
    // At least 2 where the fill splits at all. (Not measured: 40 tiles, N 2560 at M 129–256,
    // where this takes 2 splits for the fill's 3.)
    if (splits > 2) splits = int(std::clamp<long long>((sms / 2 + tiles / 2) / tiles, 2, splits));
    // The epilogue pass costs a few microseconds: two splits pay only over a long K. H200, ninth
    // session, run 8 (bench-op, split vs unsplit): N 6144, K 4096 (2 splits of 16 k-tiles) lost
    // 7–10% at M 64 and 128; N 4096, K 14336 at M 256 (2 of 56) gained 15%; 4–6 splits gained
    // 30–58% at N 4096 / 2560.
    if (splits == 2 && (ktiles + 1) / 2 < 32) return 1;
  }
  splits = finish_splits(splits, ktiles, kt_per);
  // The in-kernel fixup needs one resident CTA a unit (and 8 flags a tile): a forced count past
  // that runs as many splits as fit.
  while (splits > 1 && (tiles * splits > sms || tiles * 8 > kGemmW8A8TileFlags)) splits = finish_splits(splits - 1, ktiles, kt_per);
  return splits;
}

// Split-K's fixup inside the kernel (splitk_fixup) wherever the caller gives tile flags (the
// model and bench-op do); PERRY_WGMMA_SPLITK_FIXUP=0 (read per call) takes the second kernel
// instead. Written in the twenty-eighth session, first GPU-run in the thirty-first (s31-1, H100,
// bench-op `gemm ms`, the same binary): N 4096 × K 14336 at M 128 / 256 36.9 → 34.7 / 41.6 →
// 35.2 µs, N 2560 × K 10240 at M 256 26.5 → 22.8; the unsplit shapes unchanged; at M 64 on
// N 2560 it lost 10% (20.5 → 22.6) until the warps of rows past M skipped their slots.
bool fixup_enabled() { return split_env("PERRY_WGMMA_SPLITK_FIXUP") != 0; }
// The split-K workspace: a slot of 128 × BN int32 a unit — the fixup's slots, and (whole tiles
// cover M × N) at least the second kernel's splits·M·N slices.
size_t split_workspace_bytes(int M, int N, int splits, bool wide) {
  const int bn = wide ? 256 : 128;
  const size_t units = size_t(tile_count(M, N, bn)) * size_t(splits);
  return units * size_t(kBM) * size_t(bn) * 4;
}

// The ping-pong schedule (Cfg) where it measured faster on the H200 (bench-op):
//   * K <= 8192 with M >= 2048 (eighth session, s8-run7-pingpong-*.md: N 14336 / 6144, K 4096
//     +4–7%, the epilogue is a large share of 32 k-steps); not at K = 14336 (−5–9%: 112 k-steps
//     hide little, and 64-row tiles read B twice as often) nor at M = 1024 (−4–6%);
//   * M <= 128 where its 64-row tiles still give every CTA at most one tile, or M <= 64 (tenth
//     session, run 3, unsplit shapes): a 128-row tile at M <= 64 is half empty rows the tensor
//     cores still multiply, and at M = 128 two 64-row tiles spread the weights over twice the
//     SMs. N 6144 K 4096 M 64 / 128: 0.0147 / 0.0148 vs 0.0178 / 0.0181 ms; N 10240 K 2560 M 64
//     0.0139 vs 0.0169; N 14336 K 4096 M 64 0.0227 vs 0.0268. Where the tiles would double up
//     (N 10240 M 128: 160 of them) it lost 9%. (Split-K shapes keep the cooperative schedule.)
// PERRY_WGMMA_PINGPONG=1 / 0 forces it (read per call: the tests run both schedules).
bool pingpong_schedule(int M, int N, int K, int sms, bool wide) {
  const char* pp = std::getenv("PERRY_WGMMA_PINGPONG");
  if (pp && *pp) return pp[0] == '1';  // (=2: the 128-row ping-pong, ping128_schedule)
  if (wide && K <= 8192 && M >= 2048) return true;
  const int bn = wide ? 256 : 128;
  return M <= 64 || (M <= 128 && (long long)((M + 63) / 64) * ((N + bn - 1) / bn) <= sms);
}

// The ping-pong schedule on 128-row tiles (Cfg's kPing128) where it measured faster (s37 run 2,
// H100, bench-op `gemm`, the same binary with the choice forced):
//   * where the cooperative 128-column kernel ran, from M 1024: 14336 × 4096 M 1024 87.0 → 83.2 µs
//     (1.73 → 1.81× cuBLAS bf16), 10240 × 2560 46.8 → 43.7, 6144 × 4096 41.2 → 40.0, 2560 × 10240
//     M 4096 164.2 → 159.0; nowhere slower;
//   * instead of the 256-column tiles (cooperative or 64-row ping-pong) at M >= 2048 with K <= 8192:
//     6144 × 4096 M 2048 / 4096 76.8 → 73.1 / 144.2 → 140.6, 10240 × 2560 82.4 → 79.0 / 153.3 →
//     149.0, 2560 × 10240 M 4096 164.2 → 155.1; not at K = 14336 (4096 × 14336 M 2048 145.9 →
//     172.5: over a long K the 256-column wgmma's operand reuse wins) nor at M 1024 there
//     (2560 × 10240 55.6 → 58.6: 160 tiles of 128 columns make two waves where 80 of 256 make one),
//     nor at K = 10240 (s38 run 1: 2560 × 10240 M 8192 301.3 / 304.9 vs 270.3 µs cooperative).
// Only with at least two tiles a CTA on average (all the measured cases had 2.4–6.8): a CTA with
// one tile has no other warpgroup's main loop to hide its epilogue under, and one warpgroup then
// runs the whole tile's epilogue where the cooperative kernel splits it over two.
// int8 only by default: e4m3 (w8a8-fp8, a comparison mode) shares the kernel and is exact with it
// (CudaFp8's "128q"), but its speed with it was not measured.
// PERRY_WGMMA_PINGPONG=2 forces it (any unsplit call), =0 / =1 rule it out (the tests' other
// kernels); PERRY_WGMMA_PING128=0 or a forced PERRY_WGMMA_BN (the lab's width comparisons) rule it
// out too (read per call).
bool ping128_schedule(int M, int N, int K, int sms, bool ping, bool wide, bool fp8) {
  const char* pp = std::getenv("PERRY_WGMMA_PINGPONG");
  if (pp && *pp) return pp[0] == '2';
  const char* bn = std::getenv("PERRY_WGMMA_BN");
  if (fp8 || (bn && *bn) || split_env("PERRY_WGMMA_PING128") == 0) return false;
  if (M < 1024 || tile_count(M, N, 128) < 2LL * sms) return false;
  return (!ping && !wide) || (wide && K <= 8192 && M >= 2048);
}

// Cooperative tiles of 160 columns where they cut the busiest SM's work: each SM runs
// ceil(tiles / SMs) tiles in series, so a width's cost is about that count times the width. N 2560
// at M 1024: 80 tiles of 256 or 160 of 128 give the busiest SM 256 columns, 128 tiles of 160 give
// it 160 in one wave. Measured (s38 runs 1–4, H100, bench-op `gemm`, the width forced against the
// rest of the rule in the same binary):
//   * busiest SM's columns ≥ 15% fewer: 2560 × 10240 M 1024 55.7 → 39.3 µs (1.32 → 1.86× cuBLAS
//     bf16), M 2048 89.9 → 71.6 (1.51 → 1.90×); 1536 × 8960 M 1536 / 3072 49.2 → 34.6 / 76.7 →
//     64.3; 2560 × 2560 M 1024 / 2048 21.2 → 15.9 / 28.6 → 26.2; 5120 × 2560 M 1024 28.6 → 26.5;
//   * as few or fewer than the 128-row ping-pong's and fewer than 256's, over K >= 8192 (where the
//     wider tile's operand reuse counts more than the ping-pong's hidden epilogue) and without
//     more padded columns than 128-column tiles: 2560 × 10240 M 4096 / 6144 149–151 → 139 /
//     211–213 → 208.5 (1.75 → 1.88×), 2560 × 9728 M 4096 / 6144 141.3 → 133.4 / 203.3 → 199.4;
//     not 1536 × 8960 M 6144 (126.6 → 134.2: its last 160-column tile is 96 wide) nor a tie with
//     256's (2560 × 10240 M 8192: 270.3 → 284.7);
//   * slower wherever the busiest SM gets more columns (14336 × 4096 M 2048 161.0 → 169.1, 1536 ×
//     8960 M 4096 80.0 → 100.1, 2048 × 8192 M 4096 97.1 → 116.7) and on a tie over a short K
//     (10240 × 2560 M 1024 43.0 → 46.7).
// (s31 had measured 160 no faster, 41.1 vs 41.6 µs, in the one run whose N 2560 rows were 26%
// faster than every run since.) From M 1024, where it was measured.
// PERRY_WGMMA_COOP160=0 rules it out; PERRY_WGMMA_BN=160 forces it for every unsplit int8 call
// (read per call: the tests and the lab switch them). int8 only (dispatch asks only then: there is
// no e4m3 m64n160 wrapper, e4m3 keeps 128 / 256).
bool coop160_schedule(int M, int N, int K, int sms) {
  const char* pp = std::getenv("PERRY_WGMMA_PINGPONG");
  const bool forced_ping = pp && *pp && pp[0] != '0';  // (a forced ping-pong wins, as for 128 / 256)
  const char* bn = std::getenv("PERRY_WGMMA_BN");
  if (bn && *bn) return std::atoi(bn) == 160 && !forced_ping;
  if ((pp && *pp) || split_env("PERRY_WGMMA_COOP160") == 0) return false;  // (a forced schedule: its kernel)
  if (M < 1024) return false;
  auto busiest = [&](int w) { return waves(tile_count(M, N, w), sms) * w; };  // its columns
  const long long b160 = busiest(160), b128 = busiest(128), b256 = busiest(256);
  if (double(b160) <= 0.85 * double(std::min(b128, b256))) return true;
  const bool no_more_padding = (N + 159) / 160 * 160 <= (N + 127) / 128 * 128;
  return K >= 8192 && b160 <= b128 && b160 < b256 && no_more_padding;
}

template <int kOut, bool kFp8 = false>
void dispatch(const void* dX, const float* dSa, const void* dW, const float* dSw, const float* dBias, void* dY,
              int M, int N, int K, int vec_ok, cudaStream_t stream, const char* name, int32_t* workspace = nullptr,
              size_t workspace_bytes = 0, uint32_t* tile_flags = nullptr) {
  const int sms = sm_count();
  const bool wide = pick_bn(M, N, sms) == 256;
  if constexpr (!kFp8) {  // (e4m3 accumulates in fp32: its partial sums would not add exactly)
    int kt_per = 0;
    const int splits = splitk_splits(M, N, K, sms, kt_per);
    if (splits > 1 && tile_flags && fixup_enabled() && workspace && workspace_bytes >= split_workspace_bytes(M, N, splits, wide)) {
      if (wide) launch<kOut, 256, false, false, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name, splits, kt_per, workspace, tile_flags);
      else launch<kOut, 128, false, false, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name, splits, kt_per, workspace, tile_flags);
      return;
    }
    const size_t need = size_t(splits) * size_t(M) * N * 4;
    if (splits > 1 && workspace && workspace_bytes >= need) {
      const int vec_part = N % 2 == 0 ? 1 : 0;  // pair stores into the slices (256-byte aligned workspace)
      if (wide) launch<2, 256, false, false>(dX, dSa, dW, dSw, nullptr, workspace, M, N, K, vec_part, sms, stream, name, splits, kt_per);
      else launch<2, 128, false, false>(dX, dSa, dW, dSw, nullptr, workspace, M, N, K, vec_part, sms, stream, name, splits, kt_per);
      int32_splitk_reduce<kOut, false>(workspace, splits, M, N, dSa, dSw, dBias, dY, stream);
      return;
    }
  }
  if constexpr (!kFp8) {
    if (coop160_schedule(M, N, K, sms)) {
      launch<kOut, 160, false, false>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
      return;
    }
  }
  const bool ping = pingpong_schedule(M, N, K, sms, wide);
  if (ping128_schedule(M, N, K, sms, ping, wide, kFp8)) {
    launch<kOut, 128, kFp8, true, false, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
    return;
  }
  if (ping && wide) launch<kOut, 256, kFp8, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
  else if (ping) launch<kOut, 128, kFp8, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
  else if (wide) launch<kOut, 256, kFp8, false>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
  else launch<kOut, 128, kFp8, false>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, sms, stream, name);
}

// The argument checks gemm_w8a8_wgmma and gemm_fp8_wgmma share; returns vec_ok (bit 0: pair
// stores, N even and Y aligned to 2 elements; bit 1: 16-byte stores of 8 bf16, N % 8 == 0).
int check_args(const char* fn, const void* dX, const float* dSa, const void* dW, const float* dSw, const void* dY,
               DType out, int M, int N, int K) {
  const std::string where = std::string(fn) + " (M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (!gemm_w8a8_wgmma_supported()) throw Error(where + ": needs an sm_90 device (H100/H200)");
  if (M <= 0 || N <= 0 || K <= 0) throw Error(where + ": M, N and K must be positive");
  if (K % 16 != 0) throw Error(where + ": K must be a multiple of 16; pad with zero columns");
  if (!dX || !dW || !dY) throw Error(where + ": null X, W or Y pointer");
  if ((reinterpret_cast<uintptr_t>(dX) | reinterpret_cast<uintptr_t>(dW)) % 16 != 0)
    throw Error(where + ": X and W must be 16-byte aligned");
  if (out != DType::I32 && (!dSa || !dSw)) throw Error(where + ": null scale pointer");
  const size_t es = out == DType::BF16 ? 2 : 4;
  if (reinterpret_cast<uintptr_t>(dY) % es != 0) throw Error(where + ": Y not aligned to its element size");
  int vec_ok = (N % 2 == 0 && reinterpret_cast<uintptr_t>(dY) % (2 * es) == 0) ? 1 : 0;
  if (out == DType::BF16 && N % 8 == 0 && reinterpret_cast<uintptr_t>(dY) % 16 == 0) vec_ok |= 2;
  return vec_ok;
}

}  // namespace

bool gemm_w8a8_wgmma_supported() {  // sm_90a code runs on sm_90 only
  if (!device_is_sm90()) return false;
  static const bool code = sm90_code_present(reinterpret_cast<const void*>(&gemm_w8a8_wgmma_kernel<0, 128>));
  return code;
}

size_t gemm_w8a8_wgmma_workspace_bytes(int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0 || !gemm_w8a8_wgmma_supported()) return 0;
  const int sms = sm_count();
  int kt_per = 0;
  const int splits = splitk_splits(M, N, K, sms, kt_per);
  return splits > 1 ? split_workspace_bytes(M, N, splits, pick_bn(M, N, sms) == 256) : 0;
}

int gemm_w8a8_wgmma_splits(int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0 || !gemm_w8a8_wgmma_supported()) return 1;
  int kt_per = 0;
  return splitk_splits(M, N, K, sm_count(), kt_per);
}

void gemm_w8a8_wgmma(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw, const float* dBias,
                     void* dY, DType out, int M, int N, int K, cudaStream_t stream, int32_t* workspace,
                     size_t workspace_bytes, uint32_t* tile_flags) {
  const int vec_ok = check_args("gemm_w8a8_wgmma", dX, dSa, dW, dSw, dY, out, M, N, K);
  if (workspace && reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    throw Error("gemm_w8a8_wgmma: the split-K workspace must be 16-byte aligned");
  if (tile_flags && reinterpret_cast<uintptr_t>(tile_flags) % 4 != 0)
    throw Error("gemm_w8a8_wgmma: the tile flags must be 4-byte aligned");
  switch (out) {
    case DType::BF16:
      dispatch<0>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, stream, "gemm_w8a8_wgmma<bf16>", workspace,
                  workspace_bytes, tile_flags);
      return;
    case DType::F32:
      dispatch<1>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, stream, "gemm_w8a8_wgmma<f32>", workspace,
                  workspace_bytes, tile_flags);
      return;
    case DType::I32:
      dispatch<2>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, stream, "gemm_w8a8_wgmma<i32>", workspace,
                  workspace_bytes, tile_flags);
      return;
    default: throw Error("gemm_w8a8_wgmma: output dtype must be BF16, F32 or I32");
  }
}

void gemm_w8a8_wgmma(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
                     const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream) {
  gemm_w8a8_wgmma(dX, dSa, dW, dSw, dBias, dY, out, M, N, K, stream, nullptr, 0);
}

void gemm_fp8_wgmma(const uint8_t* dX, const float* dSa, const uint8_t* dW, const float* dSw, const float* dBias,
                    void* dY, DType out, int M, int N, int K, cudaStream_t stream) {
  if (out != DType::BF16 && out != DType::F32) throw Error("gemm_fp8_wgmma: output dtype must be BF16 or F32");
  const int vec_ok = check_args("gemm_fp8_wgmma", dX, dSa, dW, dSw, dY, out, M, N, K);
  if (out == DType::BF16) dispatch<0, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, stream, "gemm_fp8_wgmma<bf16>");
  else dispatch<1, true>(dX, dSa, dW, dSw, dBias, dY, M, N, K, vec_ok, stream, "gemm_fp8_wgmma<f32>");
}

}  // namespace perry::cuda
