// sm_90a gemm_small_m_wgmma (gemm_small_m_sm90.h): W*A8 linears of 1..64 token rows (batched
// decode, short prompts) as a weight stream. Design notes and measurements:
// docs/cuda-gemm-w8a8-sm90.md, "Forty-first session".
//
// Why: at M <= 32 perry ran gemm_small_m (mma.sync, weights loaded into registers, 16 bytes a lane
// and two k-blocks in flight): it read the weights at 57% of the copy bandwidth at M 16 and 40% at
// M 32 (H100, s41 run 1: w8a8 N 14336 × K 4096 34.5 / 44.5 us), while the same weights stream at
// 77% through cuBLASLt's int8 kernel and a decode step at batch 16 spends ~90% of its time in
// these layers. What limits such a layer is bytes in flight an SM, not arithmetic: 16 tokens ×
// 128 channels × 128 k is 64 tensor-core clocks against ~1300 clocks of HBM time for its 16 KiB.
//
//   * Swapped operands: the weight tile [128 rows × 128 k] is A (two m64 halves), the activation
//     tile [kMT tokens × 128 k] is B: wgmma.m64n{8,16,32,64}k32.s32.s8.s8 from shared memory, both
//     K-major with the 128-byte swizzle TMA writes. M is padded to kMT by TMA's zero fill.
//   * One producer warp (one thread issues TMA) and one consumer warpgroup; a ring of ~96 KiB (4-5
//     stages, 64-80 KiB of weights in flight an SM), which leaves room for the next kernel's CTA on
//     the SM. A ~200 KiB ring measured slower (s41 run 5), and the int4 form, half the bytes a
//     stage, took as long as the int8 one: the kernel is bound by a cost per stage, not by bytes in
//     flight (~1.2 us a stage at N 14336 × K 4096, M 16). s42 (docs/perf/cuda/s42-runs-small-m.md):
//     Nsight shows the consumer waiting on its `full` barrier with DRAM at 62% of peak; neither
//     independent accumulator chains nor refilling several stages of the same rows at once helped.
//     gemm_w8a8_wgmma's ping-pong tiles stream the wide shapes faster at M 4-32 (per-channel w8a8
//     takes it there); two streams an SM are the open experiment (branch next/small-m-2cta).
//   * Programmatic dependent launch: the producer issues the first stages' weight boxes before
//     griddepcontrol.wait (no kernel writes weights), the activation boxes after it; the
//     consumers wait before reading sa or touching y, the workspace and the counters.
//   * Stream-K: one CTA an SM, iterations i = tile · ks + k-stage divided evenly ([b·T/G,
//     (b+1)·T/G)), so every SM streams the same bytes whatever N and K are (a tile-by-tile split
//     leaves SMs idle: N 4096 has 32 tiles of 128 rows). A CTA's share spans at most a partial
//     tile, whole tiles, and a partial tile: whole tiles are stored at once; a partial one writes
//     its sums (int32 per channel, fp32 grouped) into the CTA's workspace slot (0: its first tile,
//     1: its last), and the tile's last CTA to finish (a counter per tile, reset by that CTA) adds
//     all slots in CTA order and stores the tile — deterministic, and per channel exact.
//   * Grouped (w8a8-g128 / g64): each group's wgmmas restart the int32 sum (scale-d 0) and are
//     folded after a wait: facc = fmaf(float(acc), sw[n, g], facc) — 4 or 8 accumulators a thread
//     a group at kMT 16, nothing next to the stream.
//   * Each stage waits for its wgmmas (wait_group 0) before releasing the slot: the tensor core
//     has ~20x more time than it needs; the ring, not MMA overlap, keeps HBM busy.
// No deadlock by construction: per use of a slot, full gets 1 arrive.expect_tx (W + X box bytes),
// empty 4 consumer-warp arrives; producer and consumers walk the same iterations; a tile's last CTA
// waits for nothing (the others have stored before counting).
#include "kernels/cuda/gemm_small_m_sm90.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/mma_sync_common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kRows = 128;    // weight rows (output channels) a tile: two m64 halves
constexpr int kStageK = 128;  // k a stage: one 128-byte TMA box row
constexpr int kThreads = 160;  // consumer warpgroup (warps 0-3) + producer warp 4

// A stage: the activation tile (kX bytes, 128-byte swizzle) then the weight tile (kW: int8 rows
// of 128 B with the 128-byte swizzle, or packed int4 rows of 64 B with the 64-byte swizzle).
template <int kMT, bool kW4 = false>
struct SmallCfg {
  static constexpr int kW = kRows * kStageK / (kW4 ? 2 : 1);  // 16 or 8 KiB
  static constexpr int kX = kMT * kStageK;                     // 1-8 KiB: multiples of the 1 KiB swizzle atom
  static constexpr int kStage = kW + kX;
  static constexpr int kMaxStages = (200 * 1024) / kStage;  // 8-11
  // + alignment, barriers, a word
  static constexpr int smem_bytes(int stages) { return stages * kStage + 1024 + 16 * stages + 16; }
};

// The ring's stages: ~96 KiB (PERRY_SMALL_M_RING_KB, read per call, for A/B runs: 36..200). H100,
// s41: the 96 KiB ring (run 3) was faster than ~200 KiB (run 5) at every shape and M measured —
// the stream is not short of bytes in flight (see the file comment).
template <int kMT, bool kW4>
int ring_stages() {
  using C = SmallCfg<kMT, kW4>;
  const char* e = std::getenv("PERRY_SMALL_M_RING_KB");
  const int kb = e && *e ? std::max(36, std::min(200, std::atoi(e))) : 96;
  return std::max(2, std::min(C::kMaxStages, kb * 1024 / C::kStage));
}

// The token-column count of the tiles for M rows.
int tile_tokens(int M) { return M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : 64; }

#ifdef PERRY_WGMMA
// D[64 x kMT] (+)= A[64 x 32]·B[kMT x 32]ᵀ, int8 from shared memory (descriptors), s32 accumulators.
template <int kMT>
__device__ __forceinline__ void wgmma_small(int (&d)[kMT / 2], uint64_t da, uint64_t db, int accumulate) {
#define PERRY_SMALL_WGMMA(SHAPE, REGS, PRED, DESCS, ...)                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                          \
               "wgmma.mma_async.sync.aligned." SHAPE ".s32.s8.s8 {" REGS "}, " DESCS ", p;\n}\n" \
               : __VA_ARGS__                                                                            \
               : "l"(da), "l"(db), "r"(accumulate))
#define PERRY_R4(b) "+r"(d[b]), "+r"(d[(b) + 1]), "+r"(d[(b) + 2]), "+r"(d[(b) + 3])
  if constexpr (kMT == 8) {
    PERRY_SMALL_WGMMA("m64n8k32", "%0, %1, %2, %3", "%6", "%4, %5", PERRY_R4(0));
  } else if constexpr (kMT == 16) {
    PERRY_SMALL_WGMMA("m64n16k32", "%0, %1, %2, %3, %4, %5, %6, %7", "%10", "%8, %9", PERRY_R4(0), PERRY_R4(4));
  } else if constexpr (kMT == 32) {
    PERRY_SMALL_WGMMA("m64n32k32", "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15", "%18",
                      "%16, %17", PERRY_R4(0), PERRY_R4(4), PERRY_R4(8), PERRY_R4(12));
  } else {
    static_assert(kMT == 64, "wgmma_small: 8, 16, 32 or 64 token columns");
    PERRY_SMALL_WGMMA("m64n64k32",
                      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                      "%34", "%32, %33", PERRY_R4(0), PERRY_R4(4), PERRY_R4(8), PERRY_R4(12), PERRY_R4(16),
                      PERRY_R4(20), PERRY_R4(24), PERRY_R4(28));
  }
#undef PERRY_R4
#undef PERRY_SMALL_WGMMA
}

// The same with A from registers (wgmma "RS", the fragment layout of sm90::wgmma_rs): the int4
// form's converted codes.
template <int kMT>
__device__ __forceinline__ void wgmma_small_rs(int (&d)[kMT / 2], const uint32_t* a, uint64_t db, int accumulate) {
  const uint32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
#define PERRY_SMALL_WGMMA_RS(SHAPE, REGS, AREGS, PRED, DESC, ...)                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                                \
               "wgmma.mma_async.sync.aligned." SHAPE ".s32.s8.s8 {" REGS "}, {" AREGS "}, " DESC ", p;\n}\n" \
               : __VA_ARGS__                                                                                  \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate))
#define PERRY_R4(b) "+r"(d[b]), "+r"(d[(b) + 1]), "+r"(d[(b) + 2]), "+r"(d[(b) + 3])
  if constexpr (kMT == 8) {
    PERRY_SMALL_WGMMA_RS("m64n8k32", "%0, %1, %2, %3", "%4, %5, %6, %7", "%9", "%8", PERRY_R4(0));
  } else if constexpr (kMT == 16) {
    PERRY_SMALL_WGMMA_RS("m64n16k32", "%0, %1, %2, %3, %4, %5, %6, %7", "%8, %9, %10, %11", "%13", "%12", PERRY_R4(0),
                         PERRY_R4(4));
  } else if constexpr (kMT == 32) {
    PERRY_SMALL_WGMMA_RS("m64n32k32", "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
                         "%16, %17, %18, %19", "%21", "%20", PERRY_R4(0), PERRY_R4(4), PERRY_R4(8), PERRY_R4(12));
  } else {
    static_assert(kMT == 64, "wgmma_small_rs: 8, 16, 32 or 64 token columns");
    PERRY_SMALL_WGMMA_RS("m64n64k32",
                         "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                         "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                         "%32, %33, %34, %35", "%37", "%36", PERRY_R4(0), PERRY_R4(4), PERRY_R4(8), PERRY_R4(12),
                         PERRY_R4(16), PERRY_R4(20), PERRY_R4(24), PERRY_R4(28));
  }
#undef PERRY_R4
#undef PERRY_SMALL_WGMMA_RS
}

template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
#endif  // PERRY_WGMMA

// CTA b's share of the iterations: quanta [b·Q/G, (b+1)·Q/G) of `quantum` iterations each (Q =
// total / quantum: quantum 1 is stream-K, quantum = ks whole tiles, the form without a workspace).
__device__ __forceinline__ long long share_start(int b, long long total, int quantum, int grid) {
  return (long long)b * (total / quantum) / grid * quantum;
}
// The CTA whose share holds iteration i.
__device__ __forceinline__ int owner_of(long long i, long long total, int quantum, int grid) {
  return int(((i / quantum + 1) * grid - 1) / (total / quantum));
}

// kGS: 0 per channel, 64 / 128 the group size. kOut: 0 bf16, 1 f32, 2 i32 (per channel only).
// kW4: packed int4 weights with two-level multipliers (Mult [N, K/128]; Sw the channel scales),
// converted to int8 codes q·m in registers (mma_sync::int4_times_m) — one int32 sum over K.
template <int kMT, int kGS, int kOut, bool kW4 = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_small_m_wgmma_kernel(const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmW,
                              const float* __restrict__ Sa, const float* __restrict__ Sw,
                              const int8_t* __restrict__ Mult, const float* __restrict__ bias,
                              void* __restrict__ Y, int M, int N, int K, int ks,
                              long long total, int quantum, int S, uint32_t* __restrict__ ws,
                              unsigned* __restrict__ flags) {
#ifdef PERRY_WGMMA
  using C = SmallCfg<kMT, kW4>;
  static_assert(!kW4 || kGS == 0, "the int4 form is per channel (two-level multipliers in the codes)");
  constexpr int R = kMT / 2;  // accumulators a thread and m64 half
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + S * C::kStage;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  volatile int* const word = reinterpret_cast<volatile int*>(smem_raw + (bars + 16u * S - raw));
  const int grid = gridDim.x, b = blockIdx.x;
  const long long i0 = share_start(b, total, quantum, grid), i1 = share_start(b + 1, total, quantum, grid);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 4);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == 4) {  // ---------------- producer ----------------
    if (lane == 0) {
      prefetch_tensormaps(&tmX, &tmW);
      const int pre = int(i1 - i0 < S ? i1 - i0 : S);
      // The first stages' weights before the wait: they depend on no kernel before this one.
      for (int q = 0; q < pre; ++q) {
        const long long i = i0 + q;
        const int t = int(i / ks), kk = int(i - (long long)t * ks);
        mbar_arrive_expect_tx(full(q), C::kStage);
        tma_load_2d(base + q * C::kStage + C::kX, &tmW, kk * (C::kW / kRows), t * kRows, full(q));
      }
      pdl::wait();
      for (int q = 0; q < pre; ++q) {
        const long long i = i0 + q;
        const int kk = int(i % ks);
        tma_load_2d(base + q * C::kStage, &tmX, kk * kStageK, 0, full(q));
      }
      int q = pre;
      for (long long i = i0 + pre; i < i1; ++i, ++q) {
        const int s = q % S;
        mbar_wait(empty(s), ((q / S) & 1) ^ 1);
        const int t = int(i / ks), kk = int(i - (long long)t * ks);
        mbar_arrive_expect_tx(full(s), C::kStage);
        tma_load_2d(base + s * C::kStage + C::kX, &tmW, kk * (C::kW / kRows), t * kRows, full(s));
        tma_load_2d(base + s * C::kStage, &tmX, kk * kStageK, 0, full(s));
      }
    } else {
      pdl::wait();
    }
    pdl::launch_dependents();
    return;
  }

  // ---------------- consumers (one warpgroup) ----------------
  pdl::wait();
  pdl::launch_dependents();
  const int r0 = warp * 16 + (lane >> 2), tq = lane & 3;  // rows r0, r0 + 8 of each m64 half
  const int Gs = kGS > 0 ? (K + kGS - 1) / kGS : 1;
  const int first_tile = int(i0 / ks);
  int acc[2][R];
  float facc[2][R];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[h][i] = 0, facc[h][i] = 0.f;

  // Output (m, n) of accumulator i of half h: n = n0 + 64h + r0 + 8·((i >> 1) & 1), m = 8·(i / 4)
  // + 2·tq + (i & 1) — the wgmma D layout (rows = weight rows, columns = tokens).
  auto store_tile = [&](int n0, auto&& value_i32, auto&& value_f32) {
    float sa[R / 2];
#pragma unroll
    for (int j = 0; j < R / 2; ++j) {
      const int m = 8 * (j / 2) + 2 * tq + (j & 1);
      sa[j] = kOut != 2 && m < M ? __ldg(Sa + m) : 0.f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int n = n0 + 64 * h + r0 + 8 * hh;
        if (n >= N) continue;
        const float sw = kOut != 2 && kGS == 0 ? __ldg(Sw + n) : 0.f;
        const float bn = kOut != 2 && bias ? __ldg(bias + n) : 0.f;
        (void)sw, (void)bn;  // (unread for I32 out)
#pragma unroll
        for (int j = 0; j < R / 2; ++j) {
          const int i = 4 * (j / 2) + 2 * hh + (j & 1);
          const int m = 8 * (j / 2) + 2 * tq + (j & 1);
          if (m >= M) continue;
          const size_t o = size_t(m) * N + n;
          if constexpr (kOut == 2) {
            static_cast<int*>(Y)[o] = value_i32(h, i);
          } else {
            float v;
            if constexpr (kGS == 0) v = float(value_i32(h, i)) * (sa[j] * sw) + bn;
            else v = fmaf(value_f32(h, i), sa[j], bn);
            if constexpr (kOut == 1) static_cast<float*>(Y)[o] = v;
            else static_cast<__nv_bfloat16*>(Y)[o] = __float2bfloat16_rn(v);
          }
        }
      }
  };

  int q = 0;  // iterations this CTA has consumed (the ring position)
  for (long long i = i0; i < i1;) {
    const int t = int(i / ks), kk0 = int(i - (long long)t * ks);
    const int kk1 = int(kk0 + (i1 - i) < ks ? kk0 + (i1 - i) : ks);
    const int n0 = t * kRows;
    for (int kk = kk0; kk < kk1; ++kk, ++q) {
      const int s = q % S;
      const uint32_t xS = base + s * C::kStage, wS = xS + C::kX;
      if constexpr (kW4) {
        // This stage's multipliers (group kk) for the thread's four rows, before the wait; rows
        // past N: their codes are TMA's zero fill, 0·m = 0.
        uint32_t mr[2][2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int n = n0 + 64 * h + r0 + 8 * hh;
            mr[h][hh] = n < N ? uint32_t(__ldg(reinterpret_cast<const uint8_t*>(Mult) + size_t(n) * ks + kk)) : 0u;
          }
        mbar_wait(full(s), (q / S) & 1);
        // The packed tile [128 rows × 64 B], 64-byte swizzle: 16-byte chunk j of row r at chunk
        // j ^ ((r / 2) % 4); this thread's bytes of each chunk at 4·(tq / 2) and + 8
        // (gemm_w4a8_two_level_sm90.cu explains the layout and the conversion).
        const uint8_t* const tile = smem_raw + (wS - raw);
        const uint32_t sel = (tq & 1) ? 0x7632u : 0x5410u;
        uint32_t a[2][16];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = 64 * h + r0 + 8 * hh;
            const uint8_t* const row = tile + r * 64 + 4 * (tq >> 1);
            const int swz = (r >> 1) & 3;
            const uint32_t m = mr[h][hh], cb = 0x80808080u - m * 0x08080808u;
            uint32_t w[4][2];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint8_t* const chunk = row + ((j ^ swz) << 4);
              w[j][0] = *reinterpret_cast<const uint32_t*>(chunk);
              w[j][1] = *reinterpret_cast<const uint32_t*>(chunk + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
              mma_sync::int4_times_m(w[j][0], w[j][1], sel, m, cb, a[h][4 * j + hh], a[h][4 * j + 2 + hh]);
          }
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int accumulate = kk > kk0 || j > 0;
          wgmma_small_rs<kMT>(acc[0], &a[0][4 * j], make_desc_sw128(xS + 32 * j), accumulate);
          wgmma_small_rs<kMT>(acc[1], &a[1][4 * j], make_desc_sw128(xS + 32 * j), accumulate);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(acc[0]);
        fence_operands(acc[1]);
        fence_regs(a[0]);
        fence_regs(a[1]);
      } else if constexpr (kGS == 0) {
        mbar_wait(full(s), (q / S) & 1);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int accumulate = kk > kk0 || j > 0;
          wgmma_small<kMT>(acc[0], make_desc_sw128(wS + 32 * j), make_desc_sw128(xS + 32 * j), accumulate);
          wgmma_small<kMT>(acc[1], make_desc_sw128(wS + 64 * kStageK + 32 * j), make_desc_sw128(xS + 32 * j),
                           accumulate);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(acc[0]);
        fence_operands(acc[1]);
      } else {
        constexpr int kSteps = kGS / 32, kGroups = kStageK / kGS;  // k32 steps a group, groups a stage
        // This stage's group scales for the thread's four rows, loaded before the wait (their
        // latency under it); rows past N and groups past K (zero-filled codes) fold with 0.
        float sw[kGroups][2][2];
#pragma unroll
        for (int gi = 0; gi < kGroups; ++gi) {
          const int g = (kk * kStageK) / kGS + gi;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int n = n0 + 64 * h + r0 + 8 * hh;
              sw[gi][h][hh] = n < N && g < Gs ? __ldg(Sw + size_t(n) * Gs + g) : 0.f;
            }
        }
        mbar_wait(full(s), (q / S) & 1);
#pragma unroll
        for (int gi = 0; gi < kGroups; ++gi) {
          wgmma_fence();
#pragma unroll
          for (int j = 0; j < kSteps; ++j) {
            const int jj = gi * kSteps + j;
            wgmma_small<kMT>(acc[0], make_desc_sw128(wS + 32 * jj), make_desc_sw128(xS + 32 * jj), j > 0);
            wgmma_small<kMT>(acc[1], make_desc_sw128(wS + 64 * kStageK + 32 * jj), make_desc_sw128(xS + 32 * jj),
                             j > 0);
          }
          wgmma_commit();
          wgmma_wait<0>();
          fence_operands(acc[0]);
          fence_operands(acc[1]);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < R; ++k) facc[h][k] = fmaf(float(acc[h][k]), sw[gi][h][(k >> 1) & 1], facc[h][k]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(s));
    }

    const auto mine_i32 = [&](int h, int k) { return acc[h][k]; };
    const auto mine_f32 = [&](int h, int k) { return facc[h][k]; };
    if (kk0 == 0 && kk1 == ks) {
      store_tile(n0, mine_i32, mine_f32);
    } else {
      // A partial tile: this CTA's sums into its slot, then the tile's counter.
      constexpr int kSlot = 2 * R * 128;  // words a slot: 128 threads × 2 halves × R
      const int which = t == first_tile ? 0 : 1;
      uint32_t* const slot = ws + (size_t(b) * 2 + which) * kSlot;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < R; ++k)
          slot[(h * R + k) * 128 + threadIdx.x] = kGS == 0 ? uint32_t(acc[h][k]) : __float_as_uint(facc[h][k]);
      __threadfence();
      named_barrier(1, 128);
      if (threadIdx.x == 0) *word = int(atomicAdd(flags + t, 1u));
      named_barrier(1, 128);
      const long long t_first = (long long)t * ks, t_last = t_first + ks - 1;
      const int c0 = owner_of(t_first, total, quantum, grid), c1 = owner_of(t_last, total, quantum, grid);
      if (*word == c1 - c0) {  // the last to arrive: every share of the tile is in its slot
        __threadfence();
        int sum_i[2][R];
        float sum_f[2][R];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int k = 0; k < R; ++k) sum_i[h][k] = 0, sum_f[h][k] = 0.f;
        for (int c = c0; c <= c1; ++c) {  // CTA order: the same sum whichever arrives last
          const long long c_start = share_start(c, total, quantum, grid);
          const int cw = t == int(c_start / ks) ? 0 : 1;
          const uint32_t* const cs = ws + (size_t(c) * 2 + cw) * kSlot;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < R; ++k) {
              const uint32_t v = __ldcg(cs + (h * R + k) * 128 + threadIdx.x);
              if constexpr (kGS == 0) sum_i[h][k] += int(v);
              else sum_f[h][k] += __uint_as_float(v);
            }
        }
        store_tile(
            n0, [&](int h, int k) { return sum_i[h][k]; }, [&](int h, int k) { return sum_f[h][k]; });
        if (threadIdx.x == 0) flags[t] = 0u;  // for the next call (kernel boundaries order it)
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < R; ++k) facc[h][k] = 0.f;
    i += kk1 - kk0;
  }
#endif  // PERRY_WGMMA
}

template <int kMT, int kGS, int kOut, bool kW4>
void launch(const int8_t* x, const float* sa, const void* w, const float* sw, const int8_t* mult, const float* bias,
            void* y, int M, int N, int K, uint32_t* ws, uint32_t* flags, cudaStream_t stream, const char* name) {
  using C = SmallCfg<kMT, kW4>;
  auto* kernel = gemm_small_m_wgmma_kernel<kMT, kGS, kOut, kW4>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [&] {
    attr_err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::smem_bytes(C::kMaxStages));
  });
  const int stages = ring_stages<kMT, kW4>();
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap tx = make_map(x, M, K, kStageK, kMT, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const CUtensorMap tw = kW4 ? make_map(w, N, K / 2, kStageK / 2, kRows, CU_TENSOR_MAP_SWIZZLE_64B, name)
                             : make_map(w, N, K, kStageK, kRows, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const int ks = (K + kStageK - 1) / kStageK;
  const long long tiles = (N + kRows - 1) / kRows, total = tiles * ks;
  // Without a workspace the shares are whole tiles (no partial sums to add).
  const int quantum = ws && flags ? 1 : ks;
  const int grid = int(std::min<long long>(sm_count(), total / quantum));
  pdl::launch(name, kernel, dim3(grid), dim3(kThreads), C::smem_bytes(stages), stream, tx, tw, sa, sw, mult, bias, y,
              M, N, K, ks, total, quantum, stages, ws, flags);
}

// The launch arguments past the template choice.
struct Args {
  const int8_t* x;
  const float* sa;
  const void* w;
  const float* sw;  // scales [N, G], or the channel scales (int4)
  const int8_t* mult;
  const float* bias;
  void* y;
  int M, N, K;
  uint32_t* ws;
  uint32_t* flags;
  cudaStream_t stream;
};

template <int kMT, int kGS, bool kW4>
void launch_out(DType out, const Args& a) {
  auto go = [&](auto kind, const char* name) {
    launch<kMT, kGS, decltype(kind)::value, kW4>(a.x, a.sa, a.w, a.sw, a.mult, a.bias, a.y, a.M, a.N, a.K, a.ws,
                                                 a.flags, a.stream, name);
  };
  if constexpr (kGS == 0) {
    if (out == DType::I32)
      return go(std::integral_constant<int, 2>{}, kW4 ? "gemm_small_m_wgmma<w4, i32>" : "gemm_small_m_wgmma<i32>");
  }
  if (out == DType::F32)
    return go(std::integral_constant<int, 1>{}, kW4 ? "gemm_small_m_wgmma<w4, f32>" : "gemm_small_m_wgmma<f32>");
  return go(std::integral_constant<int, 0>{}, kW4 ? "gemm_small_m_wgmma<w4, bf16>" : "gemm_small_m_wgmma<bf16>");
}

template <int kGS, bool kW4>
void launch_mt(DType out, const Args& a) {
  switch (tile_tokens(a.M)) {
    case 8: return launch_out<8, kGS, kW4>(out, a);
    case 16: return launch_out<16, kGS, kW4>(out, a);
    case 32: return launch_out<32, kGS, kW4>(out, a);
    default: return launch_out<64, kGS, kW4>(out, a);
  }
}

// The checks both entry points share; returns the workspace to use (null: whole tiles).
uint32_t* check_common(const std::string& where, const int8_t* x, const float* sa, const void* qweight,
                       const float* scales, const float* bias, const void* y, DType out, int M, int N, int K,
                       void* workspace, size_t workspace_bytes, uint32_t*& tile_flags) {
  using quant_args::aligned;
  if (!gemm_small_m_wgmma_supported()) throw Error(where + ": needs an sm_90 device (H100/H200)");
  if (M < 1 || M > kGemmSmallMWgmmaMaxM || N < 1 || K < 16 || K % 16 != 0 || K > 65536)
    throw Error(where + ": need 1 <= M <= 64, N >= 1 and K a multiple of 16, at most 65536");
  if (out != DType::I32 && !scales) throw Error(where + ": null scales");
  quant_args::check_gemm_pointers(where, x, sa, qweight, scales, bias, y, out);
  const long long tiles = (N + kRows - 1) / kRows;
  if (tiles > kGemmW8A8TileFlags)
    throw Error(where + ": more than " + std::to_string(kGemmW8A8TileFlags) + " tiles of 128 rows");
  // Stream-K needs the workspace and the counters; without them (or too small) whole tiles.
  const bool stream_k = workspace && tile_flags && aligned(workspace, 16) &&
                        workspace_bytes >= gemm_small_m_wgmma_workspace_bytes(M, N, K);
  if (!stream_k) tile_flags = nullptr;
  return stream_k ? static_cast<uint32_t*>(workspace) : nullptr;
}

}  // namespace

bool gemm_small_m_wgmma_supported() {
  if (!sm90::device_is_sm90()) return false;
  static const bool code =
      sm90::sm90_code_present(reinterpret_cast<const void*>(&gemm_small_m_wgmma_kernel<16, 0, 1>));
  return code;
}

bool gemm_small_m_wgmma_mode(quant::QuantMode mode) {
  return mode == QuantMode::W8A8 || mode == QuantMode::W8A8_G128 || mode == QuantMode::W8A8_G64;
}

size_t gemm_small_m_wgmma_workspace_bytes(int M, int N, int K) {
  if (M < 1 || M > kGemmSmallMWgmmaMaxM || N < 1 || K < 1) return 0;
  return size_t(sm_count()) * 2 * kRows * size_t(tile_tokens(M)) * 4;
}

void gemm_small_m_wgmma(quant::QuantMode mode, const int8_t* x, const float* sa, const int8_t* qweight,
                        const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                        cudaStream_t stream, void* workspace, size_t workspace_bytes, uint32_t* tile_flags) {
  const std::string where = "gemm_small_m_wgmma(" + std::string(quant_mode_bits(mode).name) + ", M=" +
                            std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (!gemm_small_m_wgmma_mode(mode)) throw Error(where + ": int8 weights with int8 activations only");
  const int group = quant_mode_bits(mode).group_size;
  if (out == DType::I32 && group != 0) throw Error(where + ": I32 output is per channel only");
  uint32_t* const ws =
      check_common(where, x, sa, qweight, scales, bias, y, out, M, N, K, workspace, workspace_bytes, tile_flags);
  const Args a{x, sa, qweight, scales, nullptr, bias, y, M, N, K, ws, tile_flags, stream};
  switch (group) {
    case 0: return launch_mt<0, false>(out, a);
    case 64: return launch_mt<64, false>(out, a);
    default: return launch_mt<128, false>(out, a);
  }
}

void gemm_small_m_wgmma_two_level(const int8_t* x, const float* sa, const void* qweight, const int8_t* multipliers,
                                  const float* channel_scales, const float* bias, void* y, DType out, int M, int N,
                                  int K, cudaStream_t stream, void* workspace, size_t workspace_bytes,
                                  uint32_t* tile_flags) {
  const std::string where = "gemm_small_m_wgmma_two_level(M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (K % kStageK != 0) throw Error(where + ": K must be a multiple of 128 (one multiplier a row and 128 k)");
  if (!multipliers) throw Error(where + ": null multipliers");
  uint32_t* const ws = check_common(where, x, sa, qweight, channel_scales, bias, y, out, M, N, K, workspace,
                                    workspace_bytes, tile_flags);
  const Args a{x, sa, qweight, channel_scales, multipliers, bias, y, M, N, K, ws, tile_flags, stream};
  launch_mt<0, true>(out, a);
}

}  // namespace perry::cuda
