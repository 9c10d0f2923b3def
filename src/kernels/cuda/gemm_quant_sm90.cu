// EXPERIMENTAL sm_90a gemm_quant (gemm_quant_sm90.h): grouped-scale and int4 W*A8 GEMM on TMA +
// wgmma, built from the pieces of gemm_w8a8_sm90.cu (sm90_gemm_common.cuh). Design notes:
// docs/cuda-gemm-w8a8-sm90.md, "Grouped and int4 modes".
//
// Y[M,N] = sa[m]·Σ_g sw[n,g]·(X[M,K]·W[N,K]ᵀ restricted to the k of group g) (+bias[n]).
//   * Block tile 128×128, 128 k (bytes of X) per stage = one g128 group = two g64 groups.
//     384 threads: warpgroup 0 = producer, warpgroups 1, 2 = consumers (64 rows × 128 columns
//     each: 64 int32 accumulators + 64 fp32 accumulators per thread; a 256-wide tile would need
//     256 accumulator registers, more than a thread has).
//   * Producer warp 0 (one thread): TMA loads of the X tile (128-byte swizzle) and of the weight
//     tile: int8 → straight into the 128-byte-swizzled B tile, int4 → the packed [128 rows × 64 B]
//     tile into a staging buffer.
//   * Producer warps 1-3 ("helpers", 96 threads): per stage, the group scales of the tile's 128
//     columns into shared memory (prefetched one stage ahead into registers, so their L2 latency
//     is off the critical path), permuted so that each consumer thread reads its 32 columns with 8
//     16-byte loads; for int4 they also expand the packed tile into the swizzled int8 B tile:
//     nibble v → byte 16·v (a mask, a shift, two byte permutes per 8 weights: no sign-extension
//     arithmetic), so the MMA accumulates 16·acc; the 1/16 is folded into the scales in shared
//     memory (exact: a power of two) and the I32 output shifts it back out (exact). The expanded
//     tile is written through the generic proxy, so the helpers issue fence.proxy.async before
//     arriving on the stage's "full" barrier, which the consumers' wgmma reads wait on.
//   * Consumers: per stage (per 64-k half for g64) 4 (2) wgmma m64n128k32 s32.s8.s8, the first of
//     a group with scale-d = 0 (clears the int32 accumulators), commit, wait 0, release the stage,
//     then fold: facc += float(acc)·sw[n, g]. float(acc) is exact and cheap as
//     __int_as_float(acc + 0x4B400000) - 12582912 (|acc| < 2^22 for one group of at most 128
//     int8·int8 products, 16·int4·int8 too): an integer add and a float add instead of I2F, which
//     runs at a quarter of the FP32 rate. While one consumer warpgroup folds, the other's wgmmas
//     keep the tensor cores busy (the two drift into alternation by themselves).
//     Per channel (w4a8, w8a8): one int32 accumulation over all of K, folded once with I2F.
//   * Epilogue from the fp32 accumulators: y = facc·sa[m] + bias[n] (bf16: 16-byte stores after a
//     quad transpose), or, for out = I32, the int32 partials are stored at each fold instead.
//   * Persistent grid, grouped tile order, TMA zero fill at the M / N / K edges: as gemm_w8a8_sm90.
// No deadlock by construction: per use of a stage, full gets 1 arrive.expect_tx (TMA thread) +
// 96 helper arrives, empty 8 consumer-warp arrives, packed (int4) 1 arrive.expect_tx; all roles
// walk the same (tile, k-stage) sequence.
#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace sm90;

constexpr int kBM = 128, kBN = 128, kBK = 128;  // tile rows, columns, k bytes of X per stage
constexpr int kThreads = 384;
constexpr int kConsumerWarps = 8;
constexpr int kHelpers = 96;  // producer warps 1-3
constexpr int kGroupTiles = 8;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 56·128 + 224·256 = 64,512 <= 65,536

template <int kBits>
struct QCfg {
  static constexpr int kStages = kBits == 8 ? 6 : 5;
  static constexpr int kTileA = kBM * kBK;                   // 16 KiB
  static constexpr int kTileB = kBN * kBK;                   // 16 KiB (int8, swizzled)
  static constexpr int kTileP = kBits == 4 ? kBN * kBK / 2 : 0;  // 8 KiB packed int4 staging
  static constexpr int kScaleFloats = 2 * kBN;               // up to two groups per stage
  static constexpr int kStageBytes = kTileA + kTileB + kTileP + 4 * kScaleFloats;
  static constexpr int kBarrierBytes = 3 * kStages * 8;
  static constexpr int kSmemBytes = kStages * kStageBytes + kBarrierBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");
};

// 4 packed int4 bytes (byte i: k 2i low nibble, 2i+1 high) → 8 int8 = 16·value in k order.
__device__ __forceinline__ void expand_int4x16(uint32_t w, uint32_t& o0, uint32_t& o1) {
  const uint32_t lo = (w << 4) & 0xF0F0F0F0u, hi = w & 0xF0F0F0F0u;
  o0 = __byte_perm(lo, hi, 0x5140);
  o1 = __byte_perm(lo, hi, 0x7362);
}

template <int kBits, int kGS, int kOut>  // kGS: 0 (per channel), 64, 128; kOut: 0 bf16, 1 f32, 2 i32
__global__ void __launch_bounds__(kThreads, 1)
    gemm_quant_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                            const float* __restrict__ Sa, const float* __restrict__ Sw,
                            const float* __restrict__ bias, void* __restrict__ Y, int M, int N, int K, int G,
                            int vec_ok) {
#ifdef PERRY_WGMMA
  using C = QCfg<kBits>;
  constexpr int S = C::kStages;
  constexpr int kSub = kGS == 64 ? 2 : 1;  // groups per stage
  constexpr int kKK = 4 / kSub;            // k32 wgmmas per group (per stage when per channel)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem_raw + (base - raw);  // the same bytes, as a generic pointer
  const uint32_t sA = base;                        // S × [128 × 128 B], swizzled
  const uint32_t sB = sA + S * C::kTileA;          // S × [128 × 128 B], swizzled int8
  const uint32_t sP = sB + S * C::kTileB;          // S × [128 × 64 B] packed int4 (kBits == 4)
  const uint32_t sS = sP + S * C::kTileP;          // S × [2 × 128] fp32 scales, permuted
  const uint32_t bars = sS + S * 4 * C::kScaleFloats;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  auto packed = [&](int s) { return bars + 8u * (2 * S + s); };
  auto gen = [&](uint32_t a) { return gbase + (a - base); };

  const int wg = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int num_tiles = tiles_m * tiles_n;
  const int ktiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1 + kHelpers);
      mbar_init(empty(s), kConsumerWarps);
      mbar_init(packed(s), 1);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    if (warp == 0) {
      // ---------------- TMA issuer ----------------
      if (lane == 0) {
        prefetch_tensormaps(&tmA, &tmB);
        int s = 0;
        uint32_t phase = 0;
        for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
          int m0, n0;
          tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kBN, m0, n0);
          for (int kt = 0; kt < ktiles; ++kt) {
            mbar_wait(empty(s), phase ^ 1);
            if constexpr (kBits == 8) {
              mbar_arrive_expect_tx(full(s), C::kTileA + C::kTileB);
              tma_load_2d(sA + s * C::kTileA, &tmA, kt * kBK, m0, full(s));
              tma_load_2d(sB + s * C::kTileB, &tmB, kt * kBK, n0, full(s));
            } else {
              mbar_arrive_expect_tx(full(s), C::kTileA);
              tma_load_2d(sA + s * C::kTileA, &tmA, kt * kBK, m0, full(s));
              mbar_arrive_expect_tx(packed(s), C::kTileP);
              tma_load_2d(sP + s * C::kTileP, &tmB, kt * (kBK / 2), n0, packed(s));
            }
            if (++s == S) { s = 0; phase ^= 1; }
          }
        }
      }
    } else {
      // ---------------- helpers: scales (+ int4 expansion) ----------------
      const int h = threadIdx.x - 32;  // 0..95
      // Scale slot i (< kSub·128): group sub = i / 128 of the stage, column c = i % 128, stored at
      // sub·128 + p(c), p(c) = 32·((c/2) % 4) + 2·(c/8) + c % 2: consumer thread tq of a quad
      // holds columns 8j + 2tq + e (j < 16, e < 2) and reads them as 32 consecutive floats.
      constexpr int kSlots = (kSub * kBN + kHelpers - 1) / kHelpers;
      constexpr float kWMul = kBits == 4 ? 0.0625f : 1.0f;  // the int4 bytes hold 16·w
      auto load_scales = [&](int t, int kt, float (&v)[kSlots]) {
        int m0, n0;
        tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kBN, m0, n0);
#pragma unroll
        for (int q = 0; q < kSlots; ++q) {
          const int i = h + q * kHelpers, sub = i / kBN, c = i % kBN;
          const int k0 = kt * kBK + sub * 64, n = n0 + c;
          const int g = kGS ? k0 / kGS : 0;
          v[q] = 0.f;
          if constexpr (kOut != 2)
            if (i < kSub * kBN && n < N && k0 < K) v[q] = __ldg(Sw + size_t(n) * G + g) * kWMul;
        }
      };
      int s = 0;
      uint32_t phase = 0;
      int t = blockIdx.x, kt = 0;
      float cur[kSlots];
      if (t < num_tiles) load_scales(t, 0, cur);
      while (t < num_tiles) {
        int t2 = t, kt2 = kt + 1;
        if (kt2 == ktiles) { kt2 = 0; t2 += gridDim.x; }
        float nxt[kSlots];
        if (t2 < num_tiles) load_scales(t2, kt2, nxt);  // in flight while this stage is handled
        mbar_wait(empty(s), phase ^ 1);
        float* ss = reinterpret_cast<float*>(gen(sS + s * 4 * C::kScaleFloats));
#pragma unroll
        for (int q = 0; q < kSlots; ++q) {
          const int i = h + q * kHelpers, c = i % kBN;
          if (i < kSub * kBN) ss[(i / kBN) * kBN + 32 * ((c >> 1) & 3) + 2 * (c >> 3) + (c & 1)] = cur[q];
        }
        if constexpr (kBits == 4) {
          mbar_wait(packed(s), phase);
          const uint8_t* src = gen(sP + s * C::kTileP);
          uint8_t* dst = gen(sB + s * C::kTileB);
#pragma unroll 2
          for (int i = h; i < kBN * 4; i += kHelpers) {  // 16-byte packed chunk i: row i/4, k 32·(i%4)..+31
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
        t = t2;
        kt = kt2;
#pragma unroll
        for (int q = 0; q < kSlots; ++q) cur[q] = nxt[q];
      }
    }
  } else {
    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    const int cw = wg - 1;
    const int g = lane >> 2, tq = lane & 3;
    int acc[64];
    float facc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0;
    int s = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
      int m0, n0;
      tile_origin<kBM, kGroupTiles>(t, tiles_m, tiles_n, kBN, m0, n0);
      // m64n128 accumulator layout: warp w owns rows 16w..16w+15; acc[4j + 2hh + e] is row
      // gq + 8hh, column 8j + 2tq + e (gq = lane/4).
      const int r0 = m0 + cw * 64 + warp * 16 + g;
#pragma unroll
      for (int i = 0; i < 64; ++i) facc[i] = 0.f;
      for (int kt = 0; kt < ktiles; ++kt) {
        mbar_wait(full(s), phase);
        const uint64_t da = make_desc_sw128(sA + s * C::kTileA + cw * 64 * kBK);
        const uint64_t db = make_desc_sw128(sB + s * C::kTileB);
        const float* ss = reinterpret_cast<const float*>(gen(sS + s * 4 * C::kScaleFloats));
#pragma unroll
        for (int sub = 0; sub < kSub; ++sub) {
          fence_operands(acc);
          wgmma_fence();
#pragma unroll
          for (int kk = sub * kKK; kk < (sub + 1) * kKK; ++kk)  // +32 B along K = +2 in the address field
            wgmma_n128(acc, da + 2 * kk, db + 2 * kk, kGS ? kk != sub * kKK : (kt | kk) != 0);
          wgmma_commit();
          const bool fold = kGS ? true : kt == ktiles - 1;
          const int grp = kGS ? (kt * kBK + sub * 64) / kGS : 0;
          float4 sw4[8];  // this thread's 32 column scales (read while the wgmmas run)
          if constexpr (kOut != 2) {
            if (fold) {
#pragma unroll
              for (int q = 0; q < 8; ++q) sw4[q] = reinterpret_cast<const float4*>(ss + sub * kBN + 32 * tq)[q];
            }
          }
          wgmma_wait<0>();
          fence_operands(acc);
          if (sub == kSub - 1 && lane == 0) mbar_arrive(empty(s));
          if (!fold || grp >= G) continue;  // (g64: the second half of a last stage past K)
          if constexpr (kOut == 2) {
            // y[(r·N + c)·G + grp]: per row a base pointer, per column the offset (c - c0)·G.
            const int c0 = n0 + 2 * tq;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              if (r0 + 8 * hh >= M) continue;
              int* yr = static_cast<int*>(Y) + (size_t(r0 + 8 * hh) * N + c0) * G + grp;
#pragma unroll
              for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                  if (c0 + 8 * j + e < N) yr[(8 * j + e) * G] = acc[4 * j + 2 * hh + e] >> (kBits == 4 ? 4 : 0);
            }
          } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float* w = reinterpret_cast<const float*>(&sw4[j / 2]) + 2 * (j % 2);
#pragma unroll
              for (int i2 = 0; i2 < 4; ++i2) {
                const int i = 4 * j + i2;
                const float a = kGS ? __int_as_float(acc[i] + 0x4B400000) - 12582912.0f : float(acc[i]);
                facc[i] = fmaf(a, w[i2 & 1], facc[i]);
              }
            }
          }
        }
        if (++s == S) { s = 0; phase ^= 1; }
      }
      if constexpr (kOut == 2) continue;  // the partials went out at the folds

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
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// ---------------------------------------------------------------- host side
template <int kBits, int kGS, int kOut>
void launch(const int8_t* x, const float* sa, const void* w, const float* sw, const float* bias, void* y, int M,
            int N, int K, int G, int vec_ok, cudaStream_t stream, const char* name) {
  using C = QCfg<kBits>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_quant_wgmma_kernel<kBits, kGS, kOut>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const CUtensorMap ta = make_map(x, M, K, kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B, name);
  const CUtensorMap tb = kBits == 8 ? make_map(w, N, K, kBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B, name)
                                    : make_map(w, N, K / 2, kBK / 2, kBN, CU_TENSOR_MAP_SWIZZLE_NONE, name);
  const long long tiles = (long long)((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  const int sms = sm_count();
  const unsigned grid = unsigned(tiles < sms ? tiles : sms);
  gemm_quant_wgmma_kernel<kBits, kGS, kOut><<<grid, kThreads, C::kSmemBytes, stream>>>(ta, tb, sa, sw, bias, y, M, N,
                                                                                      K, G, vec_ok);
  check_launch(name);
}

template <int kBits, int kGS>
void launch_out(DType out, const int8_t* x, const float* sa, const void* w, const float* sw, const float* bias,
                void* y, int M, int N, int K, int G, int vec_ok, cudaStream_t s) {
  switch (out) {
    case DType::I32: return launch<kBits, kGS, 2>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<i32>");
    case DType::F32: return launch<kBits, kGS, 1>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<f32>");
    default: return launch<kBits, kGS, 0>(x, sa, w, sw, bias, y, M, N, K, G, vec_ok, s, "gemm_quant_wgmma<bf16>");
  }
}

using quant_args::aligned;

}  // namespace

bool gemm_quant_wgmma_supported() { return sm90::device_is_sm90(); }

void gemm_quant_wgmma(QuantMode mode, const int8_t* x, const float* sa, const void* qweight, const float* scales,
                      const float* bias, void* y, DType out, int M, int N, int K, cudaStream_t stream) {
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
  // Bit 0: pair stores (N even, y 2-element aligned); bit 1: 16-byte bf16 stores (N % 8 == 0).
  int vec_ok = (N % 2 == 0 && aligned(y, 2 * es)) ? 1 : 0;
  if (out == DType::BF16 && N % 8 == 0 && aligned(y, 16)) vec_ok |= 2;
  if (mb.bits == 8) {
    if (gs == 128) launch_out<8, 128>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream);
    else if (gs == 64) launch_out<8, 64>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream);
    else launch_out<8, 0>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream);
  } else {
    if (gs == 128) launch_out<4, 128>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream);
    else launch_out<4, 0>(out, x, sa, qweight, scales, bias, y, M, N, K, G, vec_ok, stream);
  }
}

}  // namespace perry::cuda
