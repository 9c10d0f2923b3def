// Causal prefill attention on Hopper warpgroup MMAs, hd 128: what PrefillKernel::Auto runs on an
// sm_90 device for grids of at least two 128-row blocks per SM (PERRY_PREFILL_ATTN=wgmma forces
// it). Why: the mma.sync kernels are latency-bound at 8 warps an SM
// (docs/perf/cuda/prefill-run1-7-summary.md); wgmma reads both operands of Q·Kᵀ and P·V's V from
// shared memory asynchronously, with half the registers a row. First GPU run (H200, T = 8192,
// Llama-3-8B heads): 378 TFLOP/s against 290 for the 128-row mma.sync kernel; every prefill case
// of test_cuda_attention within the float64 bounds on the first try.
//
// Block = 2 warpgroups = 128 query rows of one (sequence, q head), 64 rows a warpgroup; keys in
// tiles of 64, K and V double-buffered by cp.async. Shared memory holds every tile in the 128-byte
// swizzled layout wgmma reads (rows of 128 B = 64 bf16, 16-byte chunk c of row r stored at chunk
// c ^ (r & 7), regions 1024-aligned), hd 128 split into two 64-wide regions ("atom columns"):
//   Q   [2 atom columns][128 rows][128 B]   32 KiB (written once, fp32 → bf16)
//   K,V [2 stages][2 atom columns][64 keys][128 B]  2 × 2 × 16 KiB
// Per key tile and warpgroup: S[64×64] = Q·Kᵀ by 8 wgmma m64n64k16 (A and B K-major from shared
// memory), the online softmax in registers (the same rules as the mma.sync kernels: raw-score
// maximum, one FFMA + ex2.approx.ftz, bf16 weights, sums of the rounded weights, rescale only when
// a maximum grew), then O[64×128] += P·V by 4 wgmma m64n128k16 with P from registers (the S
// accumulator layout is the A-fragment layout after packing pairs to bf16) and V from shared memory
// as an MN-major operand (imm-trans-b = 1). MN-major 128-byte-swizzle descriptor: leading byte
// offset = the distance between the two 64-dim atom columns (8 KiB), stride byte offset = between
// 8-key groups (1 KiB).
#include <cuda_runtime.h>

#include <mutex>
#include <type_traits>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/sm90_gemm_common.cuh"

namespace perry::cuda {
namespace {
using namespace attn_detail;

constexpr int kWgHd = 128, kWgRows = 128, kWgKeys = 64, kWgThreads = 256;
constexpr int kQBytes = 2 * kWgRows * 128, kKvTileBytes = 2 * kWgKeys * 128;  // 32 KiB, 16 KiB
constexpr int kWgSmem = kQBytes + 2 /*stages*/ * 2 /*K, V*/ * kKvTileBytes + 1024 /*alignment*/;

#ifdef PERRY_WGMMA
using sm90::make_desc_sw128;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_wait;

// Byte offset of 16-byte chunk c (0..7) of row r inside a 1024-aligned 128-byte-swizzled region.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4); }

// MN-major, 128-byte swizzle: LBO = 8 KiB (next 64 dims), SBO = 1 KiB (next 8 keys).
__device__ __forceinline__ uint64_t make_desc_mn_sw128(uint32_t addr) {
  return uint64_t((addr >> 4) & 0x3fff) | (uint64_t(8192 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Pin registers in program order around the asynchronous wgmma (the compiler may not move their
// reads or writes across a fence / wait it does not know about).
// (fp32 accumulators in f registers, packed bf16 pairs in r registers: a cast between the two
// would read the accumulators outside wgmma and make ptxas serialize the MMAs.)
template <typename T, int R, int C>
__device__ __forceinline__ void pin_regs(T (&d)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if constexpr (std::is_same_v<T, float>) asm volatile("" : "+f"(d[i][j])::"memory");
      else asm volatile("" : "+r"(d[i][j])::"memory");
    }
}

// S[64x64] (+)= A[64x16]·B[64x16]ᵀ, bf16 from shared memory (K-major descriptors), fp32 accumulators:
// d[j][e] = row 16·warp + g (+8 for e >= 2), column 8j + 2t + (e & 1).
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
}

// O[64x128] += P[64x16]·V[16x128], P bf16 in registers (the m16n8k16 A layout per warp), V from
// shared memory MN-major (imm-trans-b = 1), fp32 accumulators laid out as in wgmma_m64n64k16_ss.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// K and V rows [k0, k0 + 64) of one kv head into a stage, swizzled; rows past kv_len zero-filled.
__device__ __forceinline__ void load_kv_tile(uint8_t* ks, uint8_t* vs, const uint16_t* kg, const uint16_t* vg,
                                             int k0, int kv_len) {
  for (int c = threadIdx.x; c < kWgKeys * 16; c += kWgThreads) {
    const int r = c >> 4, ch = c & 15, atom = ch >> 3;
    const bool ok = k0 + r < kv_len;
    const size_t off = ok ? (size_t)(k0 + r) * kWgHd + ch * 8 : 0;
    const uint32_t dst = atom * (kWgKeys * 128) + swz(r, ch & 7);
    cp_async16(ks + dst, kg + off, ok ? 16 : 0);
    cp_async16(vs + dst, vg + off, ok ? 16 : 0);
  }
}
#endif

template <bool kBf16Out>
__global__ void __launch_bounds__(kWgThreads, 2)
    prefill_wgmma_kernel(const float* __restrict__ q, const uint16_t* __restrict__ q16, long long q_stride,
                         const AttnSeq* __restrict__ seqs,
                         const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int nh, int nkv,
                         int capacity, float scale_log2, void* __restrict__ out) {
#ifdef PERRY_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem;
  uint8_t* kvs = smem + kQBytes;  // stage s: K at kvs + s·2·kKvTileBytes, V after it

  const AttnSeq sq = seqs[blockIdx.z];
  const int i0 = prefill_tile_row0(kWgRows);
  if (sq.n_new <= 0 || i0 >= sq.n_new) return;
  const int h = blockIdx.x, kvh = h / (nh / nkv);
  const int kv_len = min(sq.pos0 + sq.n_new, capacity);
  const int n_keys = min(sq.pos0 + min(i0 + kWgRows, sq.n_new), kv_len);
  const int n_tiles = (n_keys + kWgKeys - 1) / kWgKeys;
  const size_t head_off = ((size_t)sq.slot * nkv + kvh) * (size_t)capacity * kWgHd;
  const uint16_t* kg = kc + head_off;
  const uint16_t* vg = vc + head_off;

  load_kv_tile(kvs, kvs + kKvTileBytes, kg, vg, 0, kv_len);
  cp_async_commit();
  // Q rows → bf16, swizzled (rows past n_new: zeros, never stored).
  for (int c = threadIdx.x; c < kWgRows * 16; c += kWgThreads) {
    const int r = c >> 4, ch = c & 15;
    uint2 a = make_uint2(0u, 0u), b = a;
    if (i0 + r < sq.n_new) {
      const size_t off = (size_t)(sq.q_row + i0 + r) * q_stride + (size_t)h * kWgHd + ch * 8;
      a = q_quad_bf16(q, q16, off);
      b = q_quad_bf16(q, q16, off + 4);
    }
    *reinterpret_cast<uint4*>(qs + (ch >> 3) * (kWgRows * 128) + swz(r, ch & 7)) = make_uint4(a.x, a.y, b.x, b.y);
  }

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
            t = lane & 3;
  const int w0 = i0 + wg * 64 + warp * 16;  // this warp's first row; the thread's rows w0 + g, w0 + g + 8
  const int lim[2] = {min(sq.pos0 + w0 + g, kv_len - 1), min(sq.pos0 + w0 + g + 8, kv_len - 1)};
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint32_t q_base = smem_addr(qs) + wg * (64 * 128);

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      uint8_t* st = kvs + ((kt + 1) & 1) * 2 * kKvTileBytes;
      load_kv_tile(st, st + kKvTileBytes, kg, vg, (kt + 1) * kWgKeys, kv_len);
    }
    cp_async_commit();
    cp_async_wait<1>();
    // cp.async and st.shared write through the generic proxy; wgmma reads through the async one.
    sm90::fence_proxy_async_smem();
    __syncthreads();
    const uint32_t k_base = smem_addr(kvs) + (kt & 1) * 2 * kKvTileBytes, v_base = k_base + kKvTileBytes;

    float s[8][4];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgHd / 16; ++ks) {
      const uint32_t col = (ks & 3) * 32u;  // the k16 step inside a 128-byte row
      wgmma_m64n64k16_ss(s, make_desc_sw128(q_base + (ks >> 2) * (kWgRows * 128) + col),
                         make_desc_sw128(k_base + (ks >> 2) * (kWgKeys * 128) + col), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin_regs(s);

    const int k0 = kt * kWgKeys;
    const bool need_mask = k0 + kWgKeys - 1 > sq.pos0 + w0;
    float base[2], alpha[2];
    const bool grew = softmax_rescale(s, k0, t, need_mask, lim, scale_log2, m, l, base, alpha);
    if (__any_sync(0xffffffffu, grew)) rescale_rows(o, alpha);
    uint32_t pf[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) softmax_weights(s, kk, scale_log2, base, l, pf[kk]);
    // The rescaled accumulators and the packed weights must be written before the fence (PTX):
    // pin them so the compiler cannot sink those writes past it.
    pin_regs(o);
    pin_regs(pf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_rs(o, pf[kk], make_desc_mn_sw128(v_base + kk * 16 * 128));
    wgmma_commit();
    wgmma_wait<0>();
    pin_regs(o);
    __syncthreads();  // both warpgroups are done with this stage before iteration kt+1 refills it
  }
  cp_async_wait<0>();

  const size_t ld = (size_t)nh * kWgHd;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = w0 + g + 8 * hf;
    if (row < sq.n_new)
      store_row<kWgHd, kBf16Out>(out, (size_t)(sq.q_row + row) * ld + (size_t)h * kWgHd + 2 * t, o, 2 * hf, 1.f / sum);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a code: fail loudly rather than leave `out` unwritten
#endif
}

}  // namespace

bool attention_prefill_wgmma_supported(int hd) {
  if (hd != kWgHd || !sm90::device_is_sm90()) return false;
  static const bool code = sm90::sm90_code_present(reinterpret_cast<const void*>(&prefill_wgmma_kernel<true>));
  return code;
}

void attention_prefill_wgmma(const PrefillIo& io, const AttnSeq* seqs, int n_seqs, int max_new, const uint16_t* kc,
                             const uint16_t* vc, int nh, int nkv, int capacity, float scale_log2, cudaStream_t stream) {
  static std::mutex mu;
  static int current_f32 = 0, current_bf16 = 0;
  // Two ~97 KiB blocks an SM need the largest shared-memory carveout: ask for it once per kernel.
  static std::once_flag carveout;
  std::call_once(carveout, [] {
    for (const void* k : {reinterpret_cast<const void*>(prefill_wgmma_kernel<true>),
                          reinterpret_cast<const void*>(prefill_wgmma_kernel<false>)})
      check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      int(cudaSharedmemCarveoutMaxShared)),
                 "cudaFuncSetAttribute(attention_prefill_wgmma carveout)");
  });
  const dim3 grid = prefill_grid(max_new, kWgRows, nh, n_seqs);
  if (io.out_bf16) {
    ensure_smem(reinterpret_cast<const void*>(prefill_wgmma_kernel<true>), kWgSmem, &current_bf16, &mu,
                "attention_prefill_wgmma");
    prefill_wgmma_kernel<true><<<grid, kWgThreads, kWgSmem, stream>>>(io.q, io.q_bf16, (long long)io.q_stride, seqs, kc, vc, nh,
                                                                     nkv, capacity, scale_log2, io.out_bf16);
  } else {
    ensure_smem(reinterpret_cast<const void*>(prefill_wgmma_kernel<false>), kWgSmem, &current_f32, &mu,
                "attention_prefill_wgmma");
    prefill_wgmma_kernel<false><<<grid, kWgThreads, kWgSmem, stream>>>(io.q, io.q_bf16, (long long)io.q_stride, seqs, kc, vc,
                                                                      nh, nkv, capacity, scale_log2, io.out);
  }
  check_launch("attention_prefill_wgmma");
}

}  // namespace perry::cuda
