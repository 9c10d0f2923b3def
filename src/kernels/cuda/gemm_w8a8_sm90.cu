// EXPERIMENTAL sm_90a variant of gemm_w8a8 using wgmma (warpgroup MMA), not yet dispatched to:
// written without access to a GPU, it is exercised only by the kernel lab (`--wgmma`), checked
// exactly against the int64 reference there, and becomes the default only after it passes and
// measures faster than the mma.sync kernel.
//
// Same block tile as the mma.sync kernel (128×128×64, 4-stage cp.async ring, zero-filled edges)
// so the two differ only in the MMA: 2 warpgroups, each wgmma.m64n128k32.s32.s8.s8 on its 64
// rows, A and B read straight from shared memory through matrix descriptors. Shared tiles use
// the no-swizzle K-major canonical layout: 8-row × 16-byte core matrices stored contiguously
// (128 B), core (row-group g, k-chunk c) at (g·4 + c)·128, so the descriptor's leading byte
// offset (next core matrix along K) is 128 and its stride byte offset (next 8 rows) is 512.
// cp.async writes go through the generic proxy and wgmma reads through the async proxy, hence
// fence.proxy.async before the barrier that publishes a stage.
#include <cuda_bf16.h>

#include <mutex>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_w8a8.h"

namespace perry::cuda {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kStages = 4;
constexpr int kTileA = kBM * kBK, kTileB = kBN * kBK;
constexpr int kStageBytes = kTileA + kTileB;
constexpr int kSmemBytes = kStages * kStageBytes;  // 64 KiB

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PERRY_WGMMA 1
#endif

#ifdef PERRY_WGMMA
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Core-matrix (no swizzle, K-major) offset of the 16-byte chunk (row r, k-chunk c) of a 64-byte
// deep tile.
__device__ __forceinline__ int core_offset(int r, int c) { return ((r >> 3) * 4 + c) * 128 + (r & 7) * 16; }

__device__ __forceinline__ void load_tile(uint32_t s, const int8_t* __restrict__ g, int rows, int K,
                                          int row0, int k0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c >> 2, chunk = c & 3;
    const int gr = row0 + r, gk = k0 + chunk * 16;
    const bool ok = gr < rows && gk < K;
    const int8_t* src = ok ? g + (size_t)gr * K + gk : g;
    cp_async16(s + core_offset(r, chunk), src, ok ? 16 : 0);
  }
}

__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= uint64_t((addr >> 4) & 0x3fff);
  d |= uint64_t((lbo >> 4) & 0x3fff) << 16;
  d |= uint64_t((sbo >> 4) & 0x3fff) << 32;
  // base offset 0, swizzle mode 0 (none)
  return d;
}

__device__ __forceinline__ void wgmma_m64n128k32(int (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"  // scale-d = true: accumulate into d
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p;\n"
      "}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(da), "l"(db), "r"(1));
}
#endif

template <int kOut>  // 0 = bf16, 1 = f32, 2 = i32
__global__ void __launch_bounds__(kThreads)
    gemm_w8a8_wgmma_kernel(const int8_t* __restrict__ X, const float* __restrict__ Sa,
                           const int8_t* __restrict__ W, const float* __restrict__ Sw,
                           const float* __restrict__ bias, void* __restrict__ Y, int M, int N, int K) {
#ifdef PERRY_WGMMA
  extern __shared__ __align__(1024) int8_t smem[];
  const uint32_t sbase = smem_addr(smem);
  constexpr int kGroupM = 8;  // grouped rasterization, as in the mma.sync kernel
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int pid = blockIdx.x;
  const int per_group = kGroupM * tiles_n;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = pid % per_group;
  const int m0 = (first_m + in_group % group_m) * kBM, n0 = (in_group / group_m) * kBN;
  const int wg = threadIdx.x / 128;

  int acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0;

  const int ktiles = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) {
      load_tile(sbase + s * kStageBytes, X, M, K, m0, s * kBK);
      load_tile(sbase + s * kStageBytes + kTileA, W, N, K, n0, s * kBK);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes → async proxy
    __syncthreads();
    {
      const int nk = kt + kStages - 1;
      if (nk < ktiles) {
        const uint32_t st = sbase + (nk % kStages) * kStageBytes;
        load_tile(st, X, M, K, m0, nk * kBK);
        load_tile(st + kTileA, W, N, K, n0, nk * kBK);
      }
      asm volatile("cp.async.commit_group;\n" ::);
    }
    const uint32_t a_base = sbase + (kt % kStages) * kStageBytes + wg * (64 / 8) * 512;
    const uint32_t b_base = sbase + (kt % kStages) * kStageBytes + kTileA;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      // k32 = two 16-byte chunks: advance two core matrices along K.
      const uint64_t da = make_desc(a_base + ks * 2 * 128, 128, 512);
      const uint64_t db = make_desc(b_base + ks * 2 * 128, 128, 512);
      wgmma_m64n128k32(acc, da, db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    // Wait before the stage can be refilled (next iteration's barrier orders the refill after this).
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Accumulator layout of m64nN: warp w of the warpgroup owns rows 16w..16w+15; d[4j+e]:
  // row g (+8 for e >= 2), column 8j + 2t + (e & 1).
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int c = n0 + j * 8 + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wg * 64 + warp * 16 + g + 8 * h;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int cc = c + e;
        if (r >= M || cc >= N) continue;
        const int a = acc[4 * j + 2 * h + e];
        const size_t o = (size_t)r * N + cc;
        if constexpr (kOut == 2) {
          static_cast<int*>(Y)[o] = a;
        } else {
          const float v = float(a) * Sa[r] * Sw[cc] + (bias ? bias[cc] : 0.0f);
          if constexpr (kOut == 1)
            static_cast<float*>(Y)[o] = v;
          else
            static_cast<__nv_bfloat16*>(Y)[o] = __float2bfloat16_rn(v);
        }
      }
    }
  }
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

template <int kOut>
void launch(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw, const float* dBias,
            void* dY, int M, int N, int K, cudaStream_t stream, const char* name) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(gemm_w8a8_wgmma_kernel<kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSmemBytes);
  });
  if (attr_err != cudaSuccess) throw_cuda(std::string("cudaFuncSetAttribute(") + name + ")", attr_err);
  const long long tiles = (long long)((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  gemm_w8a8_wgmma_kernel<kOut><<<(unsigned)tiles, kThreads, kSmemBytes, stream>>>(dX, dSa, dW, dSw, dBias, dY,
                                                                                   M, N, K);
  check_launch(name);
}

}  // namespace

bool gemm_w8a8_wgmma_supported() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;  // sm_90a code runs on sm_90 only
}

void gemm_w8a8_wgmma(const int8_t* dX, const float* dSa, const int8_t* dW, const float* dSw,
                     const float* dBias, void* dY, DType out, int M, int N, int K, cudaStream_t stream) {
  const std::string dims =
      " (M=" + std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (!gemm_w8a8_wgmma_supported()) throw Error("gemm_w8a8_wgmma: needs an sm_90 device (H100/H200)");
  if (M <= 0 || N <= 0 || K <= 0) throw Error("gemm_w8a8_wgmma: M, N and K must be positive" + dims);
  if (K % 16 != 0) throw Error("gemm_w8a8_wgmma: K must be a multiple of 16; pad with zero columns" + dims);
  if (!dX || !dW || !dY) throw Error("gemm_w8a8_wgmma: null X, W or Y pointer" + dims);
  if ((reinterpret_cast<uintptr_t>(dX) | reinterpret_cast<uintptr_t>(dW)) % 16 != 0)
    throw Error("gemm_w8a8_wgmma: X and W must be 16-byte aligned" + dims);
  if (out != DType::I32 && (!dSa || !dSw)) throw Error("gemm_w8a8_wgmma: null scale pointer" + dims);
  switch (out) {
    case DType::BF16: launch<0>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_wgmma<bf16>"); return;
    case DType::F32: launch<1>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_wgmma<f32>"); return;
    case DType::I32: launch<2>(dX, dSa, dW, dSw, dBias, dY, M, N, K, stream, "gemm_w8a8_wgmma<i32>"); return;
    default: throw Error("gemm_w8a8_wgmma: output dtype must be BF16, F32 or I32");
  }
}

}  // namespace perry::cuda
