// W8A8 GEMM on int8 tensor cores (sm_80+: mma.sync.m16n8k32.s8.s8.s32), fused dequant epilogue.
//
// Block tile 128×128×64, 256 threads = 8 warps arranged 2 (M) × 4 (N), each warp 64×32 =
// 4 m16 × 4 n8 mma tiles (64 int32 accumulators per thread). Global → shared by cp.async (16-byte
// chunks, zero-filled outside M/N/K: src-size 0), kStages-deep ring. Shared rows are padded from
// 64 to 80 bytes so the 8 row addresses of each ldmatrix fall in 8 distinct 16-byte bank groups
// (80·r mod 128 = 0,80,32,112,64,16,96,48): conflict-free without an XOR swizzle.
// Fragments are loaded with ldmatrix.x4 (int8 data viewed as b16 8×8 matrices: each thread gets
// the 4 bytes the m16n8k32 layout wants, see the comments at the loads).
// Blocks are rasterized in groups of 8 M-tiles so that concurrently running blocks share W tiles
// in L2.
#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/mma_sync_common.cuh"

namespace perry::cuda {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kRowBytes = kBK + 16;  // padded shared row (see header comment)
constexpr int kTileA = kBM * kRowBytes;
constexpr int kTileB = kBN * kRowBytes;
constexpr int kStageBytes = kTileA + kTileB;
constexpr int kSmemBytes = kStages * kStageBytes;  // 80 KiB: needs the opt-in attribute
constexpr int kGroupM = 8;

enum class Out { BF16, F32, I32 };

using mma_sync::cp_async16;
using mma_sync::cp_async_commit;
using mma_sync::cp_async_wait;
using mma_sync::ldmatrix_x4;
using mma_sync::mma_s8;

// Copies the k-tile starting at k0 of rows [row0, row0+128) of a [rows, K] int8 matrix into a
// shared tile (128 rows × 64 bytes, padded rows). 512 chunks of 16 bytes, 2 per thread.
__device__ __forceinline__ void load_tile(int8_t* s, const int8_t* __restrict__ g, int rows,
                                          int K, int row0, int k0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c >> 2, chunk = c & 3;
    const int gr = row0 + r, gk = k0 + chunk * 16;
    const bool ok = gr < rows && gk < K;  // K % 16 == 0: a chunk is all in or all out
    const int8_t* src = ok ? g + (size_t)gr * K + gk : g;
    cp_async16(s + r * kRowBytes + chunk * 16, src, ok ? 16 : 0);
  }
}

template <Out kOut>
__device__ __forceinline__ void store_pair(void* Y, int N, int r, int c, bool pair_ok, int a0,
                                           int a1, float sa, float sw0, float sw1, float b0,
                                           float b1) {
  const size_t idx = (size_t)r * N + c;
  if constexpr (kOut == Out::I32) {
    int* y = static_cast<int*>(Y) + idx;
    if (pair_ok) {
      *reinterpret_cast<int2*>(y) = make_int2(a0, a1);
    } else {
      y[0] = a0;
      if (c + 1 < N) y[1] = a1;
    }
  } else {
    const float v0 = float(a0) * sa * sw0 + b0;
    const float v1 = float(a1) * sa * sw1 + b1;
    if constexpr (kOut == Out::F32) {
      float* y = static_cast<float*>(Y) + idx;
      if (pair_ok) {
        *reinterpret_cast<float2*>(y) = make_float2(v0, v1);
      } else {
        y[0] = v0;
        if (c + 1 < N) y[1] = v1;
      }
    } else {
      __nv_bfloat16* y = static_cast<__nv_bfloat16*>(Y) + idx;
      if (pair_ok) {
        *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
      } else {
        y[0] = __float2bfloat16_rn(v0);
        if (c + 1 < N) y[1] = __float2bfloat16_rn(v1);
      }
    }
  }
}

template <Out kOut>
__global__ void __launch_bounds__(kThreads)
    gemm_w8a8_mma_kernel(const int8_t* __restrict__ X, const float* __restrict__ Sa,
                         const int8_t* __restrict__ W, const float* __restrict__ Sw,
                         const float* __restrict__ bias, void* __restrict__ Y, int M, int N,
                         int K, bool pair_stores) {
  extern __shared__ __align__(128) int8_t smem[];

  // Grouped rasterization: pid → (tile_m, tile_n), walking kGroupM M-tiles per N column.
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int pid = blockIdx.x;
  const int per_group = kGroupM * tiles_n;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = pid % per_group;
  const int tile_m = first_m + in_group % group_m;
  const int tile_n = in_group / group_m;
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / 4, warp_n = warp % 4;  // 2 × 4 warps, each 64 × 32

  int acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

  const int ktiles = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) {
      int8_t* st = smem + s * kStageBytes;
      load_tile(st, X, M, K, m0, s * kBK);
      load_tile(st + kTileA, W, N, K, n0, s * kBK);
    }
    cp_async_commit();  // always commit (possibly empty) so the group count stays exact
  }

  // ldmatrix row/column offsets of this lane (constant over the loop).
  // A (16×32 bytes per m16 tile) as four 8×16-byte matrices: m0 rows 0-7 k 0-15, m1 rows 8-15
  // k 0-15, m2 rows 0-7 k 16-31, m3 rows 8-15 k 16-31 → registers a0..a3 of m16n8k32
  // (a0: row g, k 4t..4t+3; a1: row g+8; a2: row g, k 16+4t; a3: row g+8, k 16+4t).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_col = (lane >> 4) * 16;
  // B (W rows = n, 32 bytes of k) for two n8 tiles: m0 n 0-7 k 0-15, m1 n 0-7 k 16-31,
  // m2 n 8-15 k 0-15, m3 n 8-15 k 16-31 → {b0,b1} of n-tile 2j and of n-tile 2j+1.
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int b_col = ((lane >> 3) & 1) * 16;

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies)...
    __syncthreads();               // ...and everyone's; also: stage (kt-1)%S is free again
    {
      const int nk = kt + kStages - 1;
      if (nk < ktiles) {
        int8_t* st = smem + (nk % kStages) * kStageBytes;
        load_tile(st, X, M, K, m0, nk * kBK);
        load_tile(st + kTileA, W, N, K, n0, nk * kBK);
      }
      cp_async_commit();
    }
    const int8_t* As = smem + (kt % kStages) * kStageBytes;
    const int8_t* Bs = As + kTileA;
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
  }
  cp_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty anyway)

  // Epilogue. Accumulator layout of m16n8: c0,c1 at (row g, cols 2t, 2t+1), c2,c3 at row g+8.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    const int c = n0 + warp_n * 32 + ni * 8 + 2 * t;
    if (c >= N) continue;
    float sw0 = 0, sw1 = 0, b0 = 0, b1 = 0;
    if constexpr (kOut != Out::I32) {
      sw0 = Sw[c];
      sw1 = c + 1 < N ? Sw[c + 1] : 0.0f;
      if (bias) {
        b0 = bias[c];
        b1 = c + 1 < N ? bias[c + 1] : 0.0f;
      }
    }
    const bool pair_ok = pair_stores && c + 1 < N;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + warp_m * 64 + mi * 16 + g + h * 8;
        if (r >= M) continue;
        const float sa = kOut == Out::I32 ? 0.0f : Sa[r];
        store_pair<kOut>(Y, N, r, c, pair_ok, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], sa, sw0,
                         sw1, b0, b1);
      }
    }
  }
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

template <Out kOut>
void launch(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
            const float* dBias, void* dY, int M, int N, int K, cudaStream_t stream,
            const char* name) {
  // The 80 KiB of dynamic shared memory is above the 48 KiB default: opt in once per process
  // (per instantiation; perry uses one device per process).
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_w8a8_mma_kernel<kOut>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  });
  if (attr_err != cudaSuccess)
    throw_cuda(std::string("cudaFuncSetAttribute(") + name + ", 80 KiB shared memory)", attr_err);
  const long long tiles = (long long)((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  if (tiles > 0x7fffffffLL) throw Error(std::string(name) + ": too many tiles");
  // Paired (2-element) stores need every (row, even column) address 2-element aligned: N even
  // and Y itself aligned to two elements; otherwise the epilogue stores element by element.
  const size_t esize = kOut == Out::BF16 ? 2 : 4;
  const bool pair_stores = N % 2 == 0 && aligned(dY, 2 * esize);
  gemm_w8a8_mma_kernel<kOut><<<(unsigned)tiles, kThreads, kSmemBytes, stream>>>(
      dX, dSa, dW, dSw, dBias, dY, M, N, K, pair_stores);
  check_launch(name);
}

}  // namespace

void gemm_w8a8(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
               const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream) {
  const std::string dims =
      " (M=" + std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (M <= 0 || N <= 0 || K <= 0) throw Error("gemm_w8a8: M, N and K must be positive" + dims);
  if (K % 16 != 0)
    throw Error("gemm_w8a8: K must be a multiple of 16; pad X and W with zero columns" + dims);
  if (!dX || !dW || !dY) throw Error("gemm_w8a8: null X, W or Y pointer" + dims);
  if (!aligned(dX, 16) || !aligned(dW, 16))
    throw Error("gemm_w8a8: X and W must be 16-byte aligned (cp.async 16-byte copies)" + dims);
  switch (out) {
    case DType::I32:
      if (!aligned(dY, 4)) throw Error("gemm_w8a8: int32 output must be 4-byte aligned");
      launch<Out::I32>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_mma<i32>");
      return;
    case DType::F32:
    case DType::BF16: {
      if (!dSa || !dSw) throw Error("gemm_w8a8: null scale pointer (sa or sw)" + dims);
      const bool f32 = out == DType::F32;
      if (!aligned(dY, f32 ? 4 : 2))
        throw Error("gemm_w8a8: output pointer not aligned to its element size");
      if (f32)
        launch<Out::F32>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_mma<f32>");
      else
        launch<Out::BF16>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_mma<bf16>");
      return;
    }
    default:
      throw Error("gemm_w8a8: output dtype must be BF16, F32 or I32");
  }
}

bool gemm_w8a8_supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 8;
}

const char* gemm_w8a8_kernel_name() { return "w8a8:mma_sync_m16n8k32_128x128x64_s4"; }

}  // namespace perry::cuda
