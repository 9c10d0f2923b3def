// sm_90a gemm_weight_only_wgmma (gemm_weight_only_sm90.h): w8a16 / w4a16 prefill as one GEMM
// whose int8 / int4 weight codes become bf16 in registers, wgmma's A operand.
// First GPU run s43 (H100 80GB; docs/perf/cuda/s43-runs.md): the test's float64 and dequantize +
// cuBLAS comparisons pass for int8 and int4 (so the 32-byte swizzle and the bf16 RS wgmma with this
// B layout are as read here); bench-op 14336 x 4096 w8a16 at M 128 / 512 / 2048 0.99 / 0.78 / 0.80x
// cuBLAS bf16 (dequantize + cuBLAS 0.34 / 0.50 / 0.78x).
//
// Why: the weight-only modes ran prefill as dequantize_weight_bf16 (a pass writing a bf16 copy
// of the whole weight, 2 bytes a weight, then read back by cuBLAS) + cublasGemmEx bf16 — 0.3-0.6x
// the time of a plain bf16 layer on an H100. Here the kernel reads the codes (1 or 0.5 byte a
// weight) and builds the same bf16 values in the consumer warps, next to the tensor cores.
//
//   * Operands swapped (as gemm_w4a8_two_level_sm90.cu): the weight tile is wgmma's A operand from
//     registers ("RS"), accumulator rows = output columns n; the activation tile X is B from
//     shared memory (bf16, K-major, 128-byte swizzle: one 128-byte row = 64 k), accumulator
//     columns = tokens m. Tile: 128 weight rows (two consumer warpgroups × m64) × kBN tokens (32 or
//     64 for M <= 64, 128 or 256 above: m64nkBNk16), 64 k a stage.
//   * Producer warp (one thread of warpgroup 0): TMA loads of X [kBN × 128 B] and of the code tile
//     — int8 [128 rows × 64 B] with the 64-byte swizzle, int4 [128 rows × 32 B] with the 32-byte
//     swizzle — into a ring of 5-8 stages. TMA zero-fills rows past M and N.
//   * A fragment (bf16 m64k16, per warp the m16n8k16 A layout, as attention_prefill_sm90.cu's
//     P·V): warp w of the warpgroup holds rows 16w..16w+15; lane l (g = l/4, tq = l%4):
//     a0 = row g, k 2tq, 2tq+1; a1 = row g+8, the same k; a2 / a3 = rows g / g+8, k 2tq+8, 2tq+9
//     (the lower k in the lower half). Per stage a thread converts 4 k16 steps × 4 registers.
//   * Shared-memory reads. int8: per row and k16 step the thread needs bytes 2tq..+1 and
//     8+2tq..+1 of the row's 16-byte chunk: two 32-bit loads (words tq/2 and 2 + tq/2) and one
//     PRMT that keeps the thread's halves. With the 64-byte swizzle (chunk j of row r at
//     j ^ ((r/2)%4)) the 8 rows of a warp's load land in 8 distinct 16-byte units of a 128-byte
//     line: conflict-free (lanes tq, tq^1 share a word). int4: the thread needs byte tq of every
//     word of its 32-byte row (k 8j + 2tq, +1 in word j), so it reads the whole row as two 16-byte
//     loads (the quad's four lanes at one address); with the 32-byte swizzle (chunk c of row r at
//     c ^ ((r/4)%2)) the 8 rows' chunks are 8 distinct units of 128 bytes: conflict-free.
//   * Conversion, exactly dequantize_weight_bf16's bf16_rn(__fmul_rn(float(q), s)):
//     int8: q + 128 as a byte (XOR 0x80) under the exponent of 2^23 (PRMT into 0x4B0000xx) is the
//     float 2^23 + 128 + q exactly; FADD −(2^23 + 128) gives float(q) exactly; FMUL by s rounds once
//     as dequantize does; cvt.rn.bf16x2.f32 packs two (the same rounding as __floats2bfloat162_rn).
//     A weight: 1 PRMT + 1 FADD + 1 FMUL + ½ pack + ¼ gather PRMT + ¼ XOR + ½ LDS = 4.5 issue slots.
//     int4: the thread's 4 bytes of 4 words gathered (3 PRMT), t = (u ^ 0x88888888) masked by
//     0x0F0F0F0F (even k: t = q + 8) and by 0xF0F0F0F0 (odd k: 16(q + 8), no shift); the magic
//     float minus 2^23 + 8 is q, minus 2^23 + 128 is 16q, multiplied by s resp. s/16 — 16q·(s/16)
//     is the real number q·s, so its fp32 rounding is __fmul_rn(float(q), s) whenever s/16 is exact
//     (|s| >= 2^-122: any real scale). A weight: 1 PRMT + 1 FADD + 1 FMUL + ½ pack + 3/8 gather
//     PRMT + ¼ LOP + ⅛ LDS ≈ 4.25 issue slots.
//   * Budget per 64-k stage and CTA (8192 weights, int8): ~36.9k thread instructions = 1152 warp
//     instructions, 288 issue slots on each of the 4 schedulers (int4: 272), against the tensor time of
//     128 × kBN × 64 MACs at 2048 bf16 MACs/clock/SM: 512 clocks (kBN 128), 1024 (kBN 256) —
//     the conversion of stage s+1 (issue slots 56% / 28% of that) runs under stage s's wgmmas.
//   * Pipelining (as gemm_w4a8_two_level): two register sets of A fragments; stage s+1 is
//     converted into one while stage s's wgmmas read the other; wait_group 1 after issuing stage
//     s completes s−1, whose slot is then released and whose set is free. The sets are pinned
//     (fence_frag) past that wait so ptxas keeps them live while the wgmma may read them.
//   * Scales: fp32 [N, G]; a stage of 64 k lies in one group (group_size a power-of-two multiple
//     of 64), index kt >> gshift (gshift 30 per channel); loaded two stages ahead.
//   * Epilogue: y = acc (+ bias[n]) — cuBLAS's alpha·acc + beta·bias with alpha = beta = 1 —
//     stored from registers, guarded at M and N (first version: direct 4-byte / 2-byte stores).
//   * Persistent grid (one CTA an SM), the grouped tile order of sm90::tile_origin.
// No deadlock by construction: per use of a stage, full gets 1 arrive.expect_tx (X + code box
// bytes, zero fill included), empty 8 consumer-warp arrives; producer and consumers walk the same
// (tile, k-stage) sequence.
//
//   * Programmatic dependent launch (pdl.cuh): the producer issues the first stages' code tiles
//     before griddepcontrol.wait (no kernel writes weights), their X tiles after it; the consumers
//     wait before anything reaches x or y. At batched decode (M 4-64, this kernel since s45) the
//     weight stream then starts under the tail of the kernel before, as gemm_small_m_wgmma's does.
//   * Split-K where the tiles leave SMs idle (split_plan below): fp32 slices, splitk_reduce.
//
// Not yet: a TMA-store
// epilogue (gemm_w4a8_two_level's, measured there to matter at large M), tuning of the tile
// choice (kTileOverheadTokens is a guess).
#include "kernels/cuda/gemm_weight_only_sm90.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/mma_sync_common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kWRows = 128;  // weight rows (output columns n) a tile: two consumer warpgroups × 64
constexpr int kBK = 64;      // k a stage: one 128-byte swizzle row of bf16 X
constexpr int kThreads = 384;
[[maybe_unused]] constexpr int kGroupTiles = 8;  // (device code only: unused in the sm_80 pass)

template <int kBits, int kBN>
struct WeightOnlyCfg {
  static constexpr int kTileX = kBN * kBK * 2;                // bf16 activations, 128-byte swizzle
  static constexpr int kRowW = kBits == 8 ? kBK : kBK / 2;    // bytes of codes a weight row and stage
  static constexpr int kTileW = kWRows * kRowW;               // 8 or 4 KiB
  static constexpr int kStageBytes = kTileX + kTileW;
  static constexpr int kFit = (216 * 1024) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;  // 256 tokens: 5 (int8), 6 (int4); 32-128: 8
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + barriers, alignment
  static_assert(kBN == 32 || kBN == 64 || kBN == 128 || kBN == 256, "tile widths: 32, 64, 128 or 256 tokens");
  static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");
  // (every tile a multiple of 1 KiB: the swizzle atoms stay aligned in every slot)
  static_assert(kTileX % 1024 == 0 && kTileW % 1024 == 0, "stage tiles must keep 1 KiB alignment");
};

#ifdef PERRY_WGMMA
using mma_sync::magic_byte;
using mma_sync::pack_bf16x2;

// The accumulator lists of the m64n{32,64,128,256}k16 wrappers (fp32 in f registers: a cast
// through int would read the accumulators outside wgmma and serialize the MMAs).
#define PERRY_WO_F4(b) "+f"(d[b]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3])
#define PERRY_WO_F16(b) PERRY_WO_F4(b), PERRY_WO_F4((b) + 4), PERRY_WO_F4((b) + 8), PERRY_WO_F4((b) + 12)
#define PERRY_WO_F64(b) PERRY_WO_F16(b), PERRY_WO_F16((b) + 16), PERRY_WO_F16((b) + 32), PERRY_WO_F16((b) + 48)
#define PERRY_WO_D16 PERRY_WO_F16(0)
#define PERRY_WO_D32 PERRY_WO_F16(0), PERRY_WO_F16(16)
#define PERRY_WO_D64 PERRY_WO_F64(0)
#define PERRY_WO_D128 PERRY_WO_F64(0), PERRY_WO_F64(64)
#define PERRY_WO_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define PERRY_WO_REGS32 \
  PERRY_WO_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PERRY_WO_REGS64                                                                                      \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PERRY_WO_REGS128                                                                                      \
  PERRY_WO_REGS64 ", "                                                                                       \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                        \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                        \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "            \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// A from registers (the fragment of the file comment), B = X from shared memory, K-major
// (imm-trans-b 0), scale-d from `accumulate`.
#define PERRY_WO_RS_ASM(SHAPE, REGS, OPS, AREGS, DESC, PRED)                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                               \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32.bf16.bf16 {" REGS "}, {" AREGS "}, " \
               DESC ", p, 1, 1, 0;\n}\n"                                                       \
               : OPS                                                                         \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate))

// D[64 x kBN] (+)= A[64 x 16]·B[kBN x 16]ᵀ, bf16 inputs, fp32 accumulators.
template <int kBN>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[kBN / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint64_t db, int accumulate) {
  if constexpr (kBN == 32)
    PERRY_WO_RS_ASM("m64n32k16", PERRY_WO_REGS16, PERRY_WO_D16, "%16, %17, %18, %19", "%20", "%21");
  else if constexpr (kBN == 64)
    PERRY_WO_RS_ASM("m64n64k16", PERRY_WO_REGS32, PERRY_WO_D32, "%32, %33, %34, %35", "%36", "%37");
  else if constexpr (kBN == 128)
    PERRY_WO_RS_ASM("m64n128k16", PERRY_WO_REGS64, PERRY_WO_D64, "%64, %65, %66, %67", "%68", "%69");
  else
    PERRY_WO_RS_ASM("m64n256k16", PERRY_WO_REGS128, PERRY_WO_D128, "%128, %129, %130, %131", "%132", "%133");
}
#undef PERRY_WO_RS_ASM
#undef PERRY_WO_REGS16
#undef PERRY_WO_REGS32
#undef PERRY_WO_REGS64
#undef PERRY_WO_REGS128
#undef PERRY_WO_F64
#undef PERRY_WO_F16
#undef PERRY_WO_F4
#undef PERRY_WO_D16
#undef PERRY_WO_D32
#undef PERRY_WO_D64
#undef PERRY_WO_D128

// Keep registers in program order here (accumulators around wgmma; a fragment set until the
// wgmmas that read it are known complete).
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_frag(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// float(q)·s for the magic float 2^23 + off + q·mul (see the file comment): the FADD is exact,
// the FMUL is the one rounding of dequantize_weight_bf16. (_rn: no contraction into an FFMA.)
__device__ __forceinline__ float scaled(float magic, float off, float s) { return __fmul_rn(__fadd_rn(magic, off), s); }

// int8 stage tile (rows of 64 B, 64-byte swizzle) → this thread's 16 A registers (4 k16 steps).
__device__ __forceinline__ void convert_int8(const uint8_t* tile, int rt, int tq, uint32_t sel, float sa, float sb,
                                             uint32_t (&a)[16]) {
  uint32_t w[2][4][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = rt + 8 * hh;
    const uint8_t* row = tile + r * 64 + 4 * (tq >> 1);
    const int sw = (r >> 1) & 3;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint8_t* chunk = row + ((kk ^ sw) << 4);
      w[hh][kk][0] = *reinterpret_cast<const uint32_t*>(chunk);      // k 16kk + 2tq, +1 (half tq & 1)
      w[hh][kk][1] = *reinterpret_cast<const uint32_t*>(chunk + 8);  // k 16kk + 8 + 2tq, +1
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float s = hh ? sb : sa;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // bytes k 2tq, 2tq+1, 2tq+8, 2tq+9 (of step kk), each as q + 128
      const uint32_t u = __byte_perm(w[hh][kk][0], w[hh][kk][1], sel) ^ 0x80808080u;
      const float f0 = scaled(magic_byte(u, 0), -8388736.0f, s), f1 = scaled(magic_byte(u, 1), -8388736.0f, s);
      const float f2 = scaled(magic_byte(u, 2), -8388736.0f, s), f3 = scaled(magic_byte(u, 3), -8388736.0f, s);
      a[4 * kk + hh] = pack_bf16x2(f0, f1);
      a[4 * kk + 2 + hh] = pack_bf16x2(f2, f3);
    }
  }
}

// int4 stage tile (packed rows of 32 B, 32-byte swizzle) → the same 16 registers. Word j of a row
// holds k 8j..8j+7 (byte b: k 8j + 2b low nibble, 8j + 2b + 1 high); this thread's byte of it is
// tq, and word j = 2kk + h is step kk's k 2tq.. (h = 0) or 2tq + 8.. (h = 1).
__device__ __forceinline__ void convert_int4(const uint8_t* tile, int rt, int tq, uint32_t sel_pair, float sa, float sb,
                                             uint32_t (&a)[16]) {
  uint32_t w[2][8];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = rt + 8 * hh;
    const uint8_t* row = tile + r * 32;
    const int sw = (r >> 2) & 1;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + ((c ^ sw) << 4));
      w[hh][4 * c] = v.x;
      w[hh][4 * c + 1] = v.y;
      w[hh][4 * c + 2] = v.z;
      w[hh][4 * c + 3] = v.w;
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float s = hh ? sb : sa;
    const float s16 = s * 0.0625f;  // (exact: a power of two)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      // byte i of u: byte tq of word 4c + i
      const uint32_t u = __byte_perm(__byte_perm(w[hh][4 * c], w[hh][4 * c + 1], sel_pair),
                                     __byte_perm(w[hh][4 * c + 2], w[hh][4 * c + 3], sel_pair), 0x5410);
      const uint32_t t = u ^ 0x88888888u;                     // each nibble q + 8
      const uint32_t lo = t & 0x0F0F0F0Fu, hi = t & 0xF0F0F0F0u;  // even k: q + 8; odd k: 16(q + 8)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float fe = scaled(magic_byte(lo, i), -8388616.0f, s);    // 2^23 + 8
        const float fo = scaled(magic_byte(hi, i), -8388736.0f, s16);  // 2^23 + 128
        a[4 * (2 * c + (i >> 1)) + 2 * (i & 1) + hh] = pack_bf16x2(fe, fo);
      }
    }
  }
}
#endif  // PERRY_WGMMA

// kOut: 0 bf16, 1 f32. Sc: scales [N, G]; the stage kt's group is kt >> gshift.
template <int kBits, int kBN, int kOut>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_weight_only_kernel(const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmW,
                            const float* __restrict__ Sc, const float* __restrict__ bias, void* __restrict__ Y, int M,
                            int N, int K, int G, int gshift, int splits, int kt_per, float* __restrict__ part) {
#ifdef PERRY_WGMMA
  using C = WeightOnlyCfg<kBits, kBN>;
  constexpr int S = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint8_t* const gbase = smem_raw + (base - raw);  // the same bytes, as a generic pointer
  const uint32_t sX = base;                              // S × [kBN × 128 B], 128-byte swizzle
  const uint32_t sW = sX + S * C::kTileX;                // S × [128 × kRowW B]
  const uint32_t bars = sW + S * C::kTileW;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };

  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tiles_x = (M + kBN - 1) / kBN, tiles_w = (N + kWRows - 1) / kWRows;
  const int num_tiles = tiles_x * tiles_w;
  const int ktiles = K / kBK;
  // Work units: split sp of tile t is unit t·splits + sp, k-stages [sp·kt_per, min(ktiles, +kt_per))
  // (the host makes every split non-empty); splits == 1: units are tiles over all of K.
  const int num_units = num_tiles * splits;

  init_ring_barriers(bars, S, 8);  // (full(s), empty(s) above)
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      prefetch_tensormaps(&tmX, &tmW);
      // This CTA's k-stages in order (q: the stage's place in the ring's sequence); f returns
      // false to stop the walk.
      auto walk = [&](auto&& f) {
        int q = 0;
        for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
          int x0, n0;
          tile_origin<kBN, kGroupTiles>(u / splits, tiles_x, tiles_w, kWRows, x0, n0);
          const int kt0 = (u % splits) * kt_per, kt1 = min(ktiles, kt0 + kt_per);
          for (int kt = kt0; kt < kt1; ++kt, ++q)
            if (!f(q, x0, n0, kt)) return;
        }
      };
      // The first S stages' code tiles before griddepcontrol.wait: no kernel writes weights, so
      // under programmatic launch their fetch overlaps the kernel before (a decode step's).
      walk([&](int q, int, int n0, int kt) {
        if (q >= S) return false;
        mbar_arrive_expect_tx(full(q), C::kTileX + C::kTileW);
        tma_load_2d(sW + q * C::kTileW, &tmW, kt * C::kRowW, n0, full(q));
        return true;
      });
      pdl::wait();
      walk([&](int q, int x0, int n0, int kt) {
        const int s = q % S;
        if (q >= S) {
          mbar_wait(empty(s), ((q / S) & 1) ^ 1);
          mbar_arrive_expect_tx(full(s), C::kTileX + C::kTileW);
          tma_load_2d(sW + s * C::kTileW, &tmW, kt * C::kRowW, n0, full(s));
        }
        tma_load_2d(sX + s * C::kTileX, &tmX, kt * kBK * 2, x0, full(s));
        return true;
      });
    } else {
      pdl::wait();
    }
    pdl::launch_dependents();
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  // (before reading x through the ring or writing y / the split slices)
  pdl::wait();
  pdl::launch_dependents();
  const int cw = wg - 1;
  const int g = lane >> 2, tq = lane & 3;
  const int rt = cw * 64 + warp * 16 + g;  // this thread's tile rows rt, rt + 8
  // int8: the halves of words tq/2 and 2 + tq/2 that hold k 2tq, 2tq+1; int4: byte tq of two words
  const uint32_t sel = kBits == 8 ? ((tq & 1) ? 0x7632u : 0x5410u) : uint32_t(tq | ((4 + tq) << 4));
  float acc[kBN / 2];
  uint32_t fa[16], fb[16];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) fa[i] = fb[i] = 0;
  int s = 0, r = 0;  // the ring slots of the next stage to issue and the next to release
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < num_units; u += gridDim.x) {
    int x0, n0;
    tile_origin<kBN, kGroupTiles>(u / splits, tiles_x, tiles_w, kWRows, x0, n0);
    const int sp = u % splits;
    const int kt0 = sp * kt_per, nk = min(ktiles, kt0 + kt_per) - kt0;  // this unit's k-stages
    const int n_a = n0 + rt, n_b = n_a + 8;  // this thread's output columns
    // Rows past N read row N−1's scales: their codes are TMA's zero fill, and 0·s is 0.
    const float* const srow_a = Sc + size_t(n_a < N ? n_a : N - 1) * G;
    const float* const srow_b = Sc + size_t(n_b < N ? n_b : N - 1) * G;
    auto scales = [&](int kt, float& sa, float& sb) {
      const int gi = (kt < ktiles ? kt : ktiles - 1) >> gshift;
      sa = __ldg(srow_a + gi);
      sb = __ldg(srow_b + gi);
    };
    auto convert = [&](int slot, float sa, float sb, uint32_t (&a)[16]) {
      const uint8_t* tile = gbase + (sW - base) + slot * C::kTileW;
      if constexpr (kBits == 8) convert_int8(tile, rt, tq, sel, sa, sb, a);
      else convert_int4(tile, rt, tq, sel, sa, sb, a);
    };
    auto issue = [&](int slot, uint32_t (&a)[16], bool first) {
      const uint64_t db = make_desc_sw128(sX + slot * C::kTileX);
      fence_acc(acc);
      // The fragment's writes (the conversion) must precede wgmma.fence (PTX): pinned here so the
      // compiler cannot sink them past it (attention_prefill_sm90.cu pins its P the same way).
      fence_frag(a);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)  // +32 B along K (16 bf16) = +2 in the address field
        wgmma_bf16_rs<kBN>(acc, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3], db + 2 * kk,
                           !(first && kk == 0));
      wgmma_commit();
    };
    float sa, sb, na, nb;
    scales(kt0, sa, sb);
    scales(kt0 + 1, na, nb);
    mbar_wait(full(s), phase);
    convert(s, sa, sb, fa);
    // The unit's stage j (k-stage kt0 + j) from set `cur` (converted); after it is issued, stage
    // j − 1 completes (wait_group 1): its slot is released and stage j + 1 is converted into `nxt`,
    // the set that stage used.
    auto step = [&](int j, uint32_t (&cur)[16], uint32_t (&nxt)[16]) {
      issue(s, cur, j == 0);
      wgmma_wait<1>();  // (a tile's first stage: alone in flight, returns at once)
      fence_acc(acc);
      fence_frag(nxt);
      if (j > 0) {
        if (lane == 0) mbar_arrive(empty(r));
        if (++r == S) r = 0;
      }
      if (++s == S) {
        s = 0;
        phase ^= 1;
      }
      if (j + 1 < nk) {
        const float ua = na, ub = nb;
        scales(kt0 + j + 2, na, nb);
        mbar_wait(full(s), phase);
        convert(s, ua, ub, nxt);
      }
    };
    for (int j = 0; j < nk; j += 2) {
      step(j, fa, fb);
      if (j + 1 < nk) step(j + 1, fb, fa);
    }
    float bn[2] = {0.f, 0.f};
    if (bias && splits == 1) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int n = n_a + 8 * hh;
        if (n < N) bn[hh] = __ldg(bias + n);
      }
    }
    wgmma_wait<0>();
    fence_acc(acc);
    fence_frag(fa);
    fence_frag(fb);
    if (lane == 0) mbar_arrive(empty(r));  // the last stage, still held
    if (++r == S) r = 0;

    // Epilogue: acc[4j + 2hh + e] is output column n = n_a + 8hh, token m = x0 + 8j + 2tq + e.
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = x0 + 8 * j + 2 * tq + e;
        if (m >= M) continue;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int n = n_a + 8 * hh;
          if (n >= N) continue;
          const size_t o = size_t(m) * N + n;
          if (splits > 1) {  // the split's fp32 sums; splitk_reduce adds them (and the bias) in order
            part[size_t(sp) * size_t(M) * N + o] = acc[4 * j + 2 * hh + e];
            continue;
          }
          const float v = bias ? acc[4 * j + 2 * hh + e] + bn[hh] : acc[4 * j + 2 * hh + e];
          if constexpr (kOut == 1) static_cast<float*>(Y)[o] = v;
          else static_cast<__nv_bfloat16*>(Y)[o] = __float2bfloat16_rn(v);
        }
      }
  }
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// Split-K's second pass: y = Σ_sp part[sp] in split order (+ bias), so a split call repeats bit
// for bit. part [splits][M][N] fp32.
template <int kOut>
__global__ void splitk_reduce(const float* __restrict__ part, int splits, const float* __restrict__ bias,
                              void* __restrict__ Y, int M, int N) {
  pdl::wait();  // (the slices of the GEMM before it)
  pdl::launch_dependents();
  const size_t total = size_t(M) * N, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float v = part[i];
    for (int sp = 1; sp < splits; ++sp) v += part[size_t(sp) * total + i];
    if (bias) v += __ldg(bias + i % size_t(N));
    if constexpr (kOut == 1) static_cast<float*>(Y)[i] = v;
    else static_cast<__nv_bfloat16*>(Y)[i] = __float2bfloat16_rn(v);
  }
}

// ---------------------------------------------------------------- host side
// Tokens a tile by the time of the waves (the persistent grid runs ceil(tiles / SMs) tiles on the
// busiest SM; a tile costs its tokens plus a fixed share for the per-stage work whatever the
// width: the weight tile's load and conversion). The share is a guess until measured.
// Short inputs (M <= 64: batched decode, a few tokens) take the narrow tiles: a weight tile is
// converted once per 32 / 64 tokens instead of once per 128, and the tensor core's share of a
// stage shrinks with the width (m64n32k16 is a quarter of m64n128k16). PERRY_WEIGHT_ONLY_BN=32|64|
// 128|256 forces one (lab, tests).
constexpr int kTileOverheadTokens = 64;
int tile_tokens(int M, int N) {
  const char* e = std::getenv("PERRY_WEIGHT_ONLY_BN");  // read per call: the tests switch it
  const int forced = e && *e ? std::atoi(e) : 0;
  if (forced == 32 || forced == 64 || forced == 128 || forced == 256) return forced;
  if (M <= 32) return 32;
  if (M <= 64) return 64;
  const long long sms = sm_count(), tiles_w = (N + kWRows - 1) / kWRows;
  auto cost = [&](int bx) { return ((M + bx - 1) / bx * tiles_w + sms - 1) / sms * (bx + kTileOverheadTokens); };
  return cost(128) < cost(256) ? 128 : 256;  // (ties: the wider tile converts each weight tile fewer times)
}

bool group_ok(int group_size) {
  if (group_size == 0) return true;
  if (group_size < kBK || group_size % kBK != 0) return false;
  const int q = group_size / kBK;
  return (q & (q - 1)) == 0;
}
int group_shift(int group_size) {
  if (group_size == 0) return 30;  // kt < 1024: always group 0
  int sh = 0;
  while ((kBK << sh) < group_size) ++sh;
  return sh;
}

// Split-K where the tiles leave SMs idle (a short prompt on a layer of few weight tiles: 4096 ×
// 14336 at 128 tokens is 32 tiles, each streaming K = 14336 while 100 SMs wait; s43 run 1 timed it
// at 128 and 512 tokens alike). Splits: up to SMs / tiles, at most kMaxSplits, at least
// kMinSplitStages k-stages a split; the fp32 slices [splits][M][N] go to the caller's workspace (no
// split when it is too small) and splitk_reduce adds them. PERRY_WEIGHT_ONLY_SPLITK=0 turns it off,
// =n forces n splits wherever K allows (tests, lab); read per call. H100, s44 run 1: 4096 × 14336
// at M 128 47.0 vs 125.5 us unsplit; s45 run 1: 2560 × 10240 at M 128 / 256 29.5 / 44.4 us (dequantize
// + cuBLAS 67.0 / 74.4), where the plan splits.
constexpr int kMaxSplits = 8, kMinSplitStages = 4;
struct SplitPlan {
  int splits = 1, kt_per = 0;
};
SplitPlan split_plan(int M, int N, int K, int bn) {
  const int ktiles = K / kBK;
  SplitPlan p{1, ktiles};
  const char* e = std::getenv("PERRY_WEIGHT_ONLY_SPLITK");
  const int forced = e && *e ? std::atoi(e) : -1;
  if (forced == 0) return p;
  const long long tiles = (long long)((M + bn - 1) / bn) * ((N + kWRows - 1) / kWRows);
  long long want = forced > 0 ? forced : std::min<long long>(kMaxSplits, sm_count() / tiles);
  want = std::min<long long>(want, forced > 0 ? ktiles : ktiles / kMinSplitStages);
  if (want < 2) return p;
  p.kt_per = int((ktiles + want - 1) / want);
  p.splits = (ktiles + p.kt_per - 1) / p.kt_per;  // (every split non-empty)
  if (p.splits < 2) p = SplitPlan{1, ktiles};
  return p;
}
size_t split_bytes(const SplitPlan& p, int M, int N) {
  return p.splits > 1 ? size_t(p.splits) * size_t(M) * size_t(N) * sizeof(float) : 0;
}

template <int kBits, int kBN, int kOut>
void launch(const uint16_t* x, const void* w, const float* sc, const float* bias, void* y, int M, int N, int K, int G,
            int gshift, const SplitPlan& plan, float* part, cudaStream_t stream, const char* name) {
  using C = WeightOnlyCfg<kBits, kBN>;
  auto* kernel = gemm_weight_only_kernel<kBits, kBN, kOut>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [&] {
    attr_err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap tx = make_map(x, M, K * 2, kBK * 2, kBN, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const CUtensorMap tw = kBits == 8 ? make_map(w, N, K, C::kRowW, kWRows, CU_TENSOR_MAP_SWIZZLE_64B, name)
                                    : make_map(w, N, K / 2, C::kRowW, kWRows, CU_TENSOR_MAP_SWIZZLE_32B, name);
  const long long tiles = (long long)((M + kBN - 1) / kBN) * ((N + kWRows - 1) / kWRows);
  const long long units = tiles * plan.splits;
  const int sms = sm_count();
  const unsigned grid = unsigned(units < sms ? units : sms);
  pdl::launch(name, kernel, dim3(grid), dim3(kThreads), C::kSmemBytes, stream, tx, tw, sc, bias, y, M, N, K, G, gshift,
              plan.splits, plan.kt_per, part);
  if (plan.splits > 1) {
    const long long blocks = std::min<long long>((size_t(M) * N + 255) / 256, 8LL * sms);
    pdl::launch("gemm_weight_only_wgmma: splitk_reduce", splitk_reduce<kOut>, dim3(unsigned(blocks)), dim3(256), 0,
                stream, static_cast<const float*>(part), plan.splits, bias, y, M, N);
  }
}

template <int kBits, int kBN>
void launch_out(DType out, const uint16_t* x, const void* w, const float* sc, const float* bias, void* y, int M, int N,
                int K, int G, int gshift, const SplitPlan& p, float* part, cudaStream_t s) {
  if (out == DType::F32)
    return launch<kBits, kBN, 1>(x, w, sc, bias, y, M, N, K, G, gshift, p, part, s,
                                 kBits == 8 ? "gemm_weight_only_wgmma<w8, f32>" : "gemm_weight_only_wgmma<w4, f32>");
  return launch<kBits, kBN, 0>(x, w, sc, bias, y, M, N, K, G, gshift, p, part, s,
                               kBits == 8 ? "gemm_weight_only_wgmma<w8, bf16>" : "gemm_weight_only_wgmma<w4, bf16>");
}

bool shape_ok(int bits, int group_size, int M, int N, int K, DType out) {
  return (bits == 8 || bits == 4) && group_ok(group_size) && M >= 1 && N >= 1 && K >= kBK && K % kBK == 0 &&
         K <= 65536 && (out == DType::F32 || out == DType::BF16);
}

}  // namespace

bool gemm_weight_only_wgmma_supported() {
  if (!sm90::device_is_sm90()) return false;
  static const bool code =
      sm90::sm90_code_present(reinterpret_cast<const void*>(&gemm_weight_only_kernel<8, 256, 1>));
  return code;
}

bool gemm_weight_only_wgmma_accepts(int bits, int group_size, int M, int N, int K, DType out) {
  return shape_ok(bits, group_size, M, N, K, out) && gemm_weight_only_wgmma_supported();
}

size_t gemm_weight_only_wgmma_workspace_bytes(int M, int N, int K) {
  if (M < 1 || N < 1 || K < kBK || K % kBK != 0 || !sm90::device_is_sm90()) return 0;
  return split_bytes(split_plan(M, N, K, tile_tokens(M, N)), M, N);
}

void gemm_weight_only_wgmma(const uint16_t* x, const void* qweight, const float* scales, int bits, int group_size,
                            const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream,
                            float* workspace, size_t workspace_bytes) {
  using quant_args::aligned;
  const std::string where = "gemm_weight_only_wgmma(bits=" + std::to_string(bits) + ", group_size=" +
                            std::to_string(group_size) + ", M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (!gemm_weight_only_wgmma_supported()) throw Error(where + ": needs an sm_90 device (H100/H200)");
  if (bits != 8 && bits != 4) throw Error(where + ": bits must be 8 or 4");
  if (!group_ok(group_size)) throw Error(where + ": group_size must be 0 (per channel) or 64·2^i (64, 128, 256, ...)");
  if (M < 1 || N < 1 || K < kBK || K % kBK != 0 || K > 65536)
    throw Error(where + ": need M, N >= 1 and K a multiple of 64, at most 65536");
  if (out != DType::F32 && out != DType::BF16) throw Error(where + ": output dtype must be F32 or BF16");
  if (!x || !qweight || !scales || !y) throw Error(where + ": null x, qweight, scales or y");
  if (!aligned(x, 16) || !aligned(qweight, 16)) throw Error(where + ": x and qweight must be 16-byte aligned");
  if (!aligned(scales, 4) || (bias && !aligned(bias, 4))) throw Error(where + ": scales or bias misaligned");
  if (!aligned(y, out == DType::BF16 ? 2 : 4)) throw Error(where + ": y misaligned");
  const int G = group_size > 0 ? (K + group_size - 1) / group_size : 1;
  const int gshift = group_shift(group_size);
  const int bn = tile_tokens(M, N);
  SplitPlan p = split_plan(M, N, K, bn);
  if (p.splits > 1 && (!workspace || workspace_bytes < split_bytes(p, M, N) || !aligned(workspace, 4)))
    p = SplitPlan{1, K / kBK};  // (no room for the slices: unsplit, correct and slower)
  auto go = [&](auto bits_c, auto bn_c) {
    launch_out<decltype(bits_c)::value, decltype(bn_c)::value>(out, x, qweight, scales, bias, y, M, N, K, G, gshift, p,
                                                               workspace, stream);
  };
  auto by_width = [&](auto bits_c) {
    switch (bn) {
      case 32: return go(bits_c, std::integral_constant<int, 32>{});
      case 64: return go(bits_c, std::integral_constant<int, 64>{});
      case 128: return go(bits_c, std::integral_constant<int, 128>{});
      default: return go(bits_c, std::integral_constant<int, 256>{});
    }
  };
  if (bits == 8) return by_width(std::integral_constant<int, 8>{});
  return by_width(std::integral_constant<int, 4>{});
}

}  // namespace perry::cuda
