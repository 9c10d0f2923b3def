// gemm_quant (declared in gemv_quant.h): the W*A8 GEMM for M > 8 with per-group weight scales
// and/or int4 weights, on int8 tensor cores (mma.sync m16n8k32 s8·s8 → s32).
//
// Same tiling as gemm_w8a8.cu (block 128×128×64, 8 warps as 2 (M) × 4 (N), warp tile 64×32,
// cp.async ring, 80-byte padded shared rows so the ldmatrix row addresses hit distinct bank
// groups). What differs:
//  * group scales: the group sizes (64, 128) are multiples of the 64-wide k tile, so after the
//    last tile of each group the int32 accumulators are folded into fp32 accumulators with
//    sw[n, g] and cleared. Per channel (w4a8) folds once, after the last tile. The int32 partials
//    never span two groups, which is also what the I32 output mode writes out for exact checks.
//  * int4: the packed tile (128 rows × 32 bytes per k tile) is copied with cp.async, then unpacked
//    shared → shared into a padded int8 tile (one 16-byte chunk → 32 int8 per thread) that the
//    unchanged int8 fragment code reads. One extra barrier per k tile; the weight traffic from
//    global memory stays at half a byte per weight.
#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/mma_sync_common.cuh"

namespace perry::cuda {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 3;
constexpr int kRowBytes = kBK + 16;  // padded int8 shared row
constexpr int kTileA = kBM * kRowBytes;
constexpr int kTileB8 = kBN * kRowBytes;
constexpr int kTileB4 = kBN * (kBK / 2);  // packed, unpadded (read once per thread, linearly)
constexpr int kGroupM = 8;

template <int kBits>
__host__ __device__ constexpr int stage_bytes() { return kTileA + (kBits == 8 ? kTileB8 : kTileB4); }
template <int kBits>
__host__ __device__ constexpr int smem_bytes() { return kStages * stage_bytes<kBits>() + (kBits == 4 ? kTileB8 : 0); }

enum class Out { BF16, F32, I32 };

using mma_sync::cp_async16;
using mma_sync::cp_async_commit;
using mma_sync::cp_async_wait;
using mma_sync::int4_to_int8x8;
using mma_sync::ldmatrix_x4;
using mma_sync::mma_s8;

// k tile at k0 of rows [row0, row0+128) of an int8 [rows, K] matrix → padded shared tile.
// K % 16 == 0, so a 16-byte chunk is entirely inside or outside the matrix (src-size 0 = zeros).
__device__ __forceinline__ void load_tile8(int8_t* s, const int8_t* __restrict__ g, int rows,
                                           int K, int row0, int k0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c >> 2, chunk = c & 3;
    const int gr = row0 + r, gk = k0 + chunk * 16;
    const bool ok = gr < rows && gk < K;
    const int8_t* src = ok ? g + (size_t)gr * K + gk : g;
    cp_async16(s + r * kRowBytes + chunk * 16, src, ok ? 16 : 0);
  }
}

// Packed int4 k tile: 128 rows × 32 bytes (64 k), one 16-byte chunk per thread. K % 32 == 0.
__device__ __forceinline__ void load_tile4(int8_t* s, const uint8_t* __restrict__ g, int rows,
                                           int K, int row0, int k0) {
  const int r = threadIdx.x >> 1, chunk = threadIdx.x & 1;
  const int gr = row0 + r, gk = k0 + chunk * 32;
  const bool ok = gr < rows && gk < K;
  const uint8_t* src = ok ? g + (size_t)gr * (K / 2) + gk / 2 : g;
  cp_async16(s + r * (kBK / 2) + chunk * 16, src, ok ? 16 : 0);
}

// Packed tile → padded int8 tile (same rows; chunk c of row r holds k 32c..32c+31).
__device__ __forceinline__ void unpack_tile4(int8_t* dst, const int8_t* src) {
  const int r = threadIdx.x >> 1, chunk = threadIdx.x & 1;
  const uint4 p = *reinterpret_cast<const uint4*>(src + r * (kBK / 2) + chunk * 16);
  uint4 o0, o1;
  int4_to_int8x8(p.x, o0.x, o0.y);
  int4_to_int8x8(p.y, o0.z, o0.w);
  int4_to_int8x8(p.z, o1.x, o1.y);
  int4_to_int8x8(p.w, o1.z, o1.w);
  uint4* d = reinterpret_cast<uint4*>(dst + r * kRowBytes + chunk * 32);
  d[0] = o0;
  d[1] = o1;
}

template <int kBits, Out kOut>
__global__ void __launch_bounds__(kThreads)
    gemm_quant_kernel(const int8_t* __restrict__ X, const float* __restrict__ Sa,
                      const int8_t* __restrict__ W, const float* __restrict__ Sw,
                      const float* __restrict__ bias, void* __restrict__ Y, int M, int N, int K,
                      int G, int gs) {
  extern __shared__ __align__(128) int8_t smem[];
  constexpr int kStage = stage_bytes<kBits>();

  // Grouped rasterization: consecutive blocks share W tiles in L2.
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int pid = blockIdx.x;
  const int per_group = kGroupM * tiles_n;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = pid % per_group;
  const int m0 = (first_m + in_group % group_m) * kBM;
  const int n0 = (in_group / group_m) * kBN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / 4, warp_n = warp % 4;
  const int g = lane >> 2, t = lane & 3;

  int acc[4][4][4];
  float facc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] = 0;
        facc[i][j][e] = 0.0f;
      }

  auto load_stage = [&](int stage, int kt) {
    int8_t* st = smem + stage * kStage;
    load_tile8(st, X, M, K, m0, kt * kBK);
    if constexpr (kBits == 8) load_tile8(st + kTileA, W, N, K, n0, kt * kBK);
    else load_tile4(st + kTileA, reinterpret_cast<const uint8_t*>(W), N, K, n0, kt * kBK);
  };

  const int ktiles = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();  // always commit so the group count stays exact
  }

  // ldmatrix lane offsets (see gemm_w8a8.cu for the m16n8k32 fragment mapping).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_col = (lane >> 4) * 16;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int b_col = ((lane >> 3) & 1) * 16;
  int8_t* Bu = smem + kStages * kStage;  // unpacked int4 tile (kBits == 4 only)

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt visible to all; the stage (kt-1)%S and Bu are free again
    {
      const int nk = kt + kStages - 1;
      if (nk < ktiles) load_stage(nk % kStages, nk);
      cp_async_commit();
    }
    const int8_t* As = smem + (kt % kStages) * kStage;
    const int8_t* Bs = As + kTileA;
    if constexpr (kBits == 4) {
      unpack_tile4(Bu, Bs);
      __syncthreads();
      Bs = Bu;
    }
    // Last tile of a group (or of the row): fold after the mma. Scales are fetched first so
    // their latency hides behind the tensor-core work.
    const bool fold = kt == ktiles - 1 || (gs > 0 && ((kt + 1) * kBK) % gs == 0);
    const int grp = gs > 0 ? kt * kBK / gs : 0;
    float sw[4][2] = {};
    if constexpr (kOut != Out::I32) {
      if (fold) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = n0 + warp_n * 32 + ni * 8 + 2 * t + h;
            sw[ni][h] = c < N ? __ldg(Sw + (size_t)c * G + grp) : 0.0f;
          }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        ldmatrix_x4(a[mi], As + (warp_m * 64 + mi * 16 + a_row) * kRowBytes + ks * 32 + a_col);
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, Bs + (warp_n * 32 + nj * 16 + b_row) * kRowBytes + ks * 32 + b_col);
        b[2 * nj][0] = r[0];
        b[2 * nj][1] = r[1];
        b[2 * nj + 1][0] = r[2];
        b[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_s8(acc[mi][ni], a[mi], b[ni]);
    }
    if (fold) {
      // Accumulator layout of m16n8: e = 0,1 at (row g, cols 2t, 2t+1); e = 2,3 at row g+8.
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (kOut == Out::I32) {
              const int r = m0 + warp_m * 64 + mi * 16 + g + (e >> 1) * 8;
              const int c = n0 + warp_n * 32 + ni * 8 + 2 * t + (e & 1);
              if (r < M && c < N) static_cast<int*>(Y)[((size_t)r * N + c) * G + grp] = acc[mi][ni][e];
            } else {
              facc[mi][ni][e] = fmaf(float(acc[mi][ni][e]), sw[ni][e & 1], facc[mi][ni][e]);
            }
            acc[mi][ni][e] = 0;
          }
    }
  }
  cp_async_wait<0>();
  if constexpr (kOut != Out::I32) {
    // Epilogue: y = facc·sa[r] (+ bias[c]).
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + warp_m * 64 + mi * 16 + g + (e >> 1) * 8;
        if (r >= M) continue;
        const float sa = __ldg(Sa + r);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int c = n0 + warp_n * 32 + ni * 8 + 2 * t + (e & 1);
          if (c >= N) continue;
          const float v = fmaf(facc[mi][ni][e], sa, bias ? __ldg(bias + c) : 0.0f);
          if constexpr (kOut == Out::F32) static_cast<float*>(Y)[(size_t)r * N + c] = v;
          else static_cast<__nv_bfloat16*>(Y)[(size_t)r * N + c] = __float2bfloat16_rn(v);
        }
      }
  }
}


template <int kBits, Out kOut>
void launch(const int8_t* x, const float* sa, const int8_t* w, const float* sw, const float* bias,
            void* y, int M, int N, int K, int G, int gs, cudaStream_t stream, const char* name) {
  // Dynamic shared memory above the 48 KiB default: opt in once per instantiation.
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_quant_kernel<kBits, kOut>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kBits>());
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const long long tiles = (long long)((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  if (tiles > 0x7fffffffLL) throw Error(std::string(name) + ": too many tiles");
  gemm_quant_kernel<kBits, kOut><<<(unsigned)tiles, kThreads, smem_bytes<kBits>(), stream>>>(
      x, sa, w, sw, bias, y, M, N, K, G, gs);
  check_launch(name);
}

template <int kBits>
void launch_out(DType out, const int8_t* x, const float* sa, const int8_t* w, const float* sw,
                const float* bias, void* y, int M, int N, int K, int G, int gs, cudaStream_t s) {
  const bool i4 = kBits == 4;
  switch (out) {
    case DType::I32:
      return launch<kBits, Out::I32>(x, sa, w, sw, bias, y, M, N, K, G, gs, s,
                                     i4 ? "gemm_quant<int4,i32>" : "gemm_quant<int8,i32>");
    case DType::F32:
      return launch<kBits, Out::F32>(x, sa, w, sw, bias, y, M, N, K, G, gs, s,
                                     i4 ? "gemm_quant<int4,f32>" : "gemm_quant<int8,f32>");
    default:
      return launch<kBits, Out::BF16>(x, sa, w, sw, bias, y, M, N, K, G, gs, s,
                                      i4 ? "gemm_quant<int4,bf16>" : "gemm_quant<int8,bf16>");
  }
}

}  // namespace

void gemm_quant(QuantMode mode, const int8_t* x, const float* sa, const void* qweight,
                const float* scales, const float* bias, void* y, DType out, int M, int N, int K,
                cudaStream_t stream) {
  const QuantModeBits mb = quant_mode_bits(mode);
  const std::string where = std::string("gemm_quant(") + mb.name + ", M=" + std::to_string(M) +
                            ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (!mb.a8) throw Error(where + ": weight-only mode: use dequantize_weight_bf16 + a bf16 GEMM");
  if (M < 1 || N < 1 || K < 1 || K > 65536) throw Error(where + ": need M, N >= 1, 1 <= K <= 65536");
  const int kalign = mb.bits == 8 ? 16 : 32;
  if (K % kalign != 0)
    throw Error(where + ": K must be a multiple of " + std::to_string(kalign) +
                " (16-byte weight rows); use gemv_quant over blocks of 8 rows");
  quant_args::check_gemm_pointers(where, x, sa, qweight, scales, bias, y, out);
  const int gs = mb.group_size;
  const int G = gs > 0 ? (K + gs - 1) / gs : 1;
  const int8_t* w = static_cast<const int8_t*>(qweight);
  if (mb.bits == 8) launch_out<8>(out, x, sa, w, scales, bias, y, M, N, K, G, gs, stream);
  else launch_out<4>(out, x, sa, w, scales, bias, y, M, N, K, G, gs, stream);
}

}  // namespace perry::cuda
