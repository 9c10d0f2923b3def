// Private to the sm_90a (Hopper) GEMMs gemm_w8a8_sm90.cu and gemm_quant_sm90.cu: the device
// building blocks they share (mbarriers, TMA loads, wgmma descriptors and instructions, the
// grouped persistent tile order, the bf16 quad-transpose store) and the host-side tensor-map
// setup. Design notes: docs/cuda-gemm-w8a8-sm90.md. Everything is inline: the header is included
// by several translation units.
#pragma once
#include <cuda_bf16.h>
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from cudaGetDriverEntryPoint
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"

// PERRY_WGMMA: defined while compiling device code for sm_90a (the only target with wgmma).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#ifndef PERRY_WGMMA
#define PERRY_WGMMA 1
#endif
#endif
// Plain sm_90 code (no "a") would run on an H100/H200 with every wgmma kernel compiled to a trap,
// and nothing at run time can tell it from sm_90a: refuse to build it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "perry's Hopper kernels need the sm_90a target: set PERRY_CUDA_ARCHITECTURES to 90a (not 90)"
#endif

namespace perry::cuda::sm90 {

#ifdef PERRY_WGMMA
// The mbarrier helpers live in bulk_copy.cuh (shared with gemv_decode's bulk weight copies).
using bulk::fence_proxy_async_smem;
using bulk::mbar_arrive;
using bulk::mbar_arrive_expect_tx;
using bulk::mbar_init;
using bulk::mbar_init_fence;
using bulk::mbar_wait;
using bulk::smem_addr;

// The block's first thread sets up a ring of `stages` slots: `full` barriers at bars + 8s (one
// arrival: the producer's expect_tx), `empty` ones at bars + 8(stages + s) (empty_arrivals: one a
// consumer warp), and fences them for the async proxy. The caller syncs the block after.
__device__ __forceinline__ void init_ring_barriers(uint32_t bars, int stages, unsigned empty_arrivals) {
  if (threadIdx.x != 0) return;
#pragma unroll 1
  for (int s = 0; s < stages; ++s) {
    mbar_init(bars + 8u * s, 1);
    mbar_init(bars + 8u * (stages + s), empty_arrivals);
  }
  mbar_init_fence();
}

__device__ __forceinline__ void prefetch_tensormaps(const CUtensorMap* a, const CUtensorMap* b) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(a)) : "memory");
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(b)) : "memory");
}

// ---- TMA: a 2-D box [rows, 128 B] at (k0, row0) into shared memory, completing on `bar` ----
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(bar)
      : "memory");
}

// ---- TMA stores (shared → global, bulk groups) ----
// A 2-D box from shared memory to (k0 = the inner coordinate, row0), tracked by this thread's bulk
// groups: commit after the copies, then wait_read<N> before overwriting their shared memory (at
// most N groups still reading it) and wait_all<0> before the block exits.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int k0, int row0) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(k0), "r"(row0), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// One 4-byte global → shared copy on the LDGSTS path (cp.async: no register holds the value, so the
// thread goes on at once); its completion is this thread's cp.async groups: commit, then wait.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all_groups() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Barrier `id` (1..15; 0 is __syncthreads') over `threads` threads (whole warps).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ----
// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format" for wgmma):
//   bits  0-13 start address >> 4;  16-29 leading byte offset >> 4 (unused for K-major swizzled
//   layouts whose K extent per instruction (32 B) lies inside one 128-B swizzle row; set to 1);
//   32-45 stride byte offset >> 4 = 1024 B (from one 8-row group to the next: 8 rows × 128 B);
//   49-51 base offset = 0 (tile bases are 1024-aligned); 62-63 swizzle mode, 1 = 128-byte.
// The k32 step inside a 128-B row is +32 B on the start address (+2 in the encoded field): the
// hardware applies the XOR swizzle to the final address bits, exactly as TMA did when writing.
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t addr) {
  return uint64_t((addr >> 4) & 0x3fff) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the accumulator registers in program order around the asynchronous wgmma (keeps the
// compiler from moving reads/writes of them across the fence / wait).
template <int R>
__device__ __forceinline__ void fence_operands(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The accumulator operand lists of the m64nNk32 wgmma wrappers below (N/2 registers a thread).
#define PERRY_WGMMA_REGS64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// 16 more accumulators at a time: the m64n160 / n192 / n224 / n256 lists (gemm_w4a8_two_level's
// tile widths). The operand names must be literals; the operands themselves are expressions.
#define PERRY_WGMMA_R64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define PERRY_WGMMA_R80 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define PERRY_WGMMA_R96 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define PERRY_WGMMA_R112 \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define PERRY_WGMMA_REGS80 PERRY_WGMMA_REGS64 ", " PERRY_WGMMA_R64
#define PERRY_WGMMA_REGS96 PERRY_WGMMA_REGS80 ", " PERRY_WGMMA_R80
#define PERRY_WGMMA_REGS112 PERRY_WGMMA_REGS96 ", " PERRY_WGMMA_R96
#define PERRY_WGMMA_REGS128 PERRY_WGMMA_REGS112 ", " PERRY_WGMMA_R112
// d[b] .. d[b + 15] as read-write register operands.
#define PERRY_WGMMA_D4(b) "+r"(d[b]), "+r"(d[(b) + 1]), "+r"(d[(b) + 2]), "+r"(d[(b) + 3])
#define PERRY_WGMMA_D16(b) PERRY_WGMMA_D4(b), PERRY_WGMMA_D4((b) + 4), PERRY_WGMMA_D4((b) + 8), PERRY_WGMMA_D4((b) + 12)
#define PERRY_WGMMA_D64 PERRY_WGMMA_D16(0), PERRY_WGMMA_D16(16), PERRY_WGMMA_D16(32), PERRY_WGMMA_D16(48)
#define PERRY_WGMMA_D80 PERRY_WGMMA_D64, PERRY_WGMMA_D16(64)
#define PERRY_WGMMA_D96 PERRY_WGMMA_D80, PERRY_WGMMA_D16(80)
#define PERRY_WGMMA_D112 PERRY_WGMMA_D96, PERRY_WGMMA_D16(96)
#define PERRY_WGMMA_D128 PERRY_WGMMA_D112, PERRY_WGMMA_D16(112)

// One wgmma.mma_async with the scale-d predicate from `accumulate` (PRED: its operand number).
#define PERRY_WGMMA_ASM(SHAPE_TYPES, REGS, OPS, PRED, DESCS, TAIL)                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                        \
               "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" REGS "}, " DESCS ", p" TAIL ";\n}\n" \
               : OPS                                                                                   \
               : "l"(da), "l"(db), "r"(accumulate))

// D[64x128] (+)= A[64x32]·B[128x32]ᵀ from shared memory (descriptors): int8 inputs and s32
// accumulators, or (kFp8) e4m3 inputs and f32 accumulators held as their bits in the same int
// registers (PTX .b32 registers serve .f32 operands; read them with __int_as_float).
template <bool kFp8 = false>
__device__ __forceinline__ void wgmma_n128(int (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (kFp8)
    PERRY_WGMMA_ASM("m64n128k32.f32.e4m3.e4m3", PERRY_WGMMA_REGS64, PERRY_WGMMA_D64, "%66", "%64, %65", ", 1, 1");
  else
    PERRY_WGMMA_ASM("m64n128k32.s32.s8.s8", PERRY_WGMMA_REGS64, PERRY_WGMMA_D64, "%66", "%64, %65", "");
}

// D[64x256] (+)= A[64x32]·B[256x32]ᵀ, as wgmma_n128.
template <bool kFp8 = false>
__device__ __forceinline__ void wgmma_n256(int (&d)[128], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (kFp8)
    PERRY_WGMMA_ASM("m64n256k32.f32.e4m3.e4m3", PERRY_WGMMA_REGS128, PERRY_WGMMA_D128, "%130", "%128, %129", ", 1, 1");
  else
    PERRY_WGMMA_ASM("m64n256k32.s32.s8.s8", PERRY_WGMMA_REGS128, PERRY_WGMMA_D128, "%130", "%128, %129", "");
}

// D[64x160] (+)= A[64x32]·B[160x32]ᵀ, int8 only: gemm_w8a8_wgmma's cooperative tiles of 160
// columns, where 128 tiles of them fill one wave that 256-column tiles fill to 61% (N 2560 at
// M 1024: 80 tiles on 132 SMs).
__device__ __forceinline__ void wgmma_n160(int (&d)[80], uint64_t da, uint64_t db, int accumulate) {
  PERRY_WGMMA_ASM("m64n160k32.s32.s8.s8", PERRY_WGMMA_REGS80, PERRY_WGMMA_D80, "%82", "%80, %81", "");
}

// A from registers (wgmma "RS"): a0..a3 are this thread's A fragment of the 64 × 32 int8 tile —
// warp w of the warpgroup holds rows 16w..16w+15; lane l: a0 = row 16w + l/4, k 4(l%4)..+3; a1 =
// row +8, the same k; a2 / a3 = rows as a0 / a1, k 16 + 4(l%4)..+3 (the lower k in the lower
// byte). B from shared memory (descriptor), s32 accumulators. ptxas keeps a0..a3 live until the
// wgmma completes only while the caller does (fence the registers after the wait).
#define PERRY_WGMMA_RS_ASM(SHAPE_TYPES, REGS, OPS, AREGS, DESC, PRED)                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                       \
               "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" REGS "}, {" AREGS "}, " DESC ", p;\n}\n" \
               : OPS                                                                                 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate))
// D[64xN] (+)= A·B[Nx32]ᵀ, N = 128, 160, 192, 224 or 256 (gemm_w4a8_two_level's tile widths).
template <int N>
__device__ __forceinline__ void wgmma_rs(int (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint64_t db, int accumulate) {
  static_assert(N == 128 || N == 160 || N == 192 || N == 224 || N == 256, "wgmma_rs: N = 128..256 in steps of 32");
  if constexpr (N == 128)
    PERRY_WGMMA_RS_ASM("m64n128k32.s32.s8.s8", PERRY_WGMMA_REGS64, PERRY_WGMMA_D64, "%64, %65, %66, %67", "%68", "%69");
  else if constexpr (N == 160)
    PERRY_WGMMA_RS_ASM("m64n160k32.s32.s8.s8", PERRY_WGMMA_REGS80, PERRY_WGMMA_D80, "%80, %81, %82, %83", "%84", "%85");
  else if constexpr (N == 192)
    PERRY_WGMMA_RS_ASM("m64n192k32.s32.s8.s8", PERRY_WGMMA_REGS96, PERRY_WGMMA_D96, "%96, %97, %98, %99", "%100",
                       "%101");
  else if constexpr (N == 224)
    PERRY_WGMMA_RS_ASM("m64n224k32.s32.s8.s8", PERRY_WGMMA_REGS112, PERRY_WGMMA_D112, "%112, %113, %114, %115",
                       "%116", "%117");
  else
    PERRY_WGMMA_RS_ASM("m64n256k32.s32.s8.s8", PERRY_WGMMA_REGS128, PERRY_WGMMA_D128, "%128, %129, %130, %131",
                       "%132", "%133");
}
#undef PERRY_WGMMA_RS_ASM
#undef PERRY_WGMMA_ASM
#undef PERRY_WGMMA_REGS64
#undef PERRY_WGMMA_REGS80
#undef PERRY_WGMMA_REGS96
#undef PERRY_WGMMA_REGS112
#undef PERRY_WGMMA_REGS128
#undef PERRY_WGMMA_D64
#undef PERRY_WGMMA_D80
#undef PERRY_WGMMA_D96
#undef PERRY_WGMMA_D112
#undef PERRY_WGMMA_D128
#undef PERRY_WGMMA_R64
#undef PERRY_WGMMA_R80
#undef PERRY_WGMMA_R96
#undef PERRY_WGMMA_R112
#undef PERRY_WGMMA_D4
#undef PERRY_WGMMA_D16

template <int BN, bool kFp8 = false>
__device__ __forceinline__ void wgmma_tile(int (&d)[BN / 2], uint64_t da, uint64_t db, int accumulate) {
  static_assert(BN == 128 || BN == 256 || (BN == 160 && !kFp8), "wgmma_tile: 128 or 256 columns, or 160 for int8");
  if constexpr (BN == 256)
    wgmma_n256<kFp8>(d, da, db, accumulate);
  else if constexpr (BN == 160)
    wgmma_n160(d, da, db, accumulate);
  else
    wgmma_n128<kFp8>(d, da, db, accumulate);
}
#endif  // PERRY_WGMMA

// Tile t of the grouped order → (first row, first column): kGroupM row-tiles of kBM rows per
// group, columns (bn wide) within a group, so the CTAs running at one time share A and B in L2.
template <int kBM, int kGroupM>
__device__ __forceinline__ void tile_origin(int t, int tiles_m, int tiles_n, int bn, int& m0, int& n0) {
  const int per_group = kGroupM * tiles_n;
  const int first_m = (t / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = t % per_group;
  m0 = (first_m + in_group % group_m) * kBM;
  n0 = (in_group / group_m) * bn;
}

// Split-K's work units of the persistent kernels (gemm_quant_wgmma, gemm_w4a8_two_level_wgmma): unit
// u is tile u / splits over k-stages [kt0, kt1) = [sp·kt_per, +kt_per) of its split sp = u % splits
// (splits = 1: the tile, all of K). A tile's splits are neighbouring units, so neighbouring CTAs run
// them at about the same time; every role of a kernel walks the same units.
__device__ __forceinline__ void unit_range(int u, int splits, int kt_per, int ktiles, int& t, int& kt0, int& kt1) {
  t = u / splits;
  kt0 = (u % splits) * kt_per;
  kt1 = min(ktiles, kt0 + kt_per);
}
// With a data-parallel head (gemm_w4a8_two_level_wgmma's tail split): units u < whole are tiles u
// over all of K; the tiles after them are split, unit whole + i being unit i of those tiles.
__device__ __forceinline__ void unit_range(int u, int whole, int splits, int kt_per, int ktiles, int& t, int& kt0,
                                           int& kt1) {
  if (u < whole) {
    t = u;
    kt0 = 0;
    kt1 = ktiles;
    return;
  }
  unit_range(u - whole, splits, kt_per, ktiles, t, kt0, kt1);
  t += whole;
}

// bf16 epilogue store helpers for the wgmma accumulator layout (quad thread tq holds, for one
// row, the column pairs 8jj + 2tq, +1 of four 8-column blocks jj = 0..3, packed as bf16x2 in
// pk[jj]): a 4×4 transpose inside the quad. quad_exchange (3 shuffles; all 32 lanes must call it)
// fills got[k] = the pair of quad thread tq^k in column block tq (its position tq^k);
// quad_gather(got, tq) then is the 8 consecutive outputs of columns 8tq..8tq+7 (one 16-byte store).
__device__ __forceinline__ uint32_t sel4(const uint32_t (&v)[4], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
}
__device__ __forceinline__ void quad_exchange(const uint32_t (&pk)[4], int tq, uint32_t (&got)[4]) {
  got[0] = sel4(pk, tq);
#pragma unroll
  for (int k = 1; k < 4; ++k) got[k] = __shfl_xor_sync(0xffffffffu, sel4(pk, tq ^ k), k);
}
__device__ __forceinline__ uint4 quad_gather(const uint32_t (&got)[4], int tq) {
  return make_uint4(sel4(got, tq), sel4(got, tq ^ 1), sel4(got, tq ^ 2), sel4(got, tq ^ 3));
}

// ---------------------------------------------------------------- host side
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver through the runtime (no -lcuda link). `who` names the
// kernel in the error.
inline EncodeTiledFn encode_tiled(const char* who) {
  static std::once_flag once;
  static EncodeTiledFn fn = nullptr;
  static std::string err;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
      err = std::string("cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): ") + cudaGetErrorName(e) +
            " (query result " + std::to_string(int(q)) + ")";
    else
      fn = reinterpret_cast<EncodeTiledFn>(p);
  });
  if (!fn) throw Error(std::string(who) + ": " + err);
  return fn;
}

// A 2-D byte tensor [rows, row_bytes] (row stride row_bytes, a multiple of 16) read in boxes of
// [box_rows, box_bytes] (box_bytes <= 128 with the 128-byte swizzle), out-of-bounds elements
// zero-filled.
inline CUtensorMap make_map(const void* p, int rows, int row_bytes, int box_bytes, int box_rows,
                            CUtensorMapSwizzle swizzle, const char* who) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};  // bytes, for dims 1..: must be a multiple of 16
  const cuuint32_t box[2] = {cuuint32_t(box_bytes), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode_tiled(who)(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(p), dims, strides, box,
                                       estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string(who) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ", rows=" +
                std::to_string(rows) + ", row bytes=" + std::to_string(row_bytes) + ")");
  return m;
}

// Whether kernel `fn` runs sm_90 code on this device: a build without a 90a target (e.g.
// PERRY_CUDA_ARCHITECTURES=80) JIT-compiles compute_80 PTX there, whose wgmma kernels only trap.
// (cudaFuncGetAttributes launches nothing, so this is safe during stream capture.)
inline bool sm90_code_present(const void* fn) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, fn) != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device: not an error for the next launch to report
    return false;
  }
  return a.ptxVersion >= 90;
}

// True on an sm_90 device (sm_90a code runs there only).
inline bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

// Split-K plans of the sm_90 GEMMs (host side). split_env: the count an environment variable
// forces (-1: none set; 0 or 1: no split). fill_splits: the default — fill the SMs, at least 8
// k-tiles a unit, only where fewer than half the SMs have a tile. finish_splits: cap `want` at
// the k-tiles, set kt_per (k-tiles a split) and return the count with no empty split (1: none).
inline int split_env(const char* name) {
  const char* e = std::getenv(name);  // read per call: the tests switch it
  return e && *e ? std::atoi(e) : -1;
}
inline int fill_splits(long long tiles, int ktiles, int sms) {
  if (tiles * 2 > sms) return 1;
  return int(std::min<long long>(sms / tiles, ktiles / 8));
}
inline int finish_splits(int want, int ktiles, int& kt_per) {
  kt_per = ktiles;
  const int splits = std::min(want, ktiles);
  if (splits < 2) return 1;
  kt_per = (ktiles + splits - 1) / splits;
  return (ktiles + kt_per - 1) / kt_per;
}

// Grid of the split-K reduction kernels (256 threads a block, grid-stride): enough blocks to cover
// M·N once, at most 8 an SM.
inline unsigned reduce_blocks(int M, int N) {
  const size_t total = size_t(M) * N;
  return unsigned(std::min<size_t>((total + 255) / 256, size_t(sm_count()) * 8));
}

// Split-K of the int32 GEMMs: the exact int32 sum of the slices part[s][m][n] finished with the
// unsplit kernel's own epilogue expression, so the split outputs are its bits. kWeightScaleFirst:
// fmaf(float(acc)·sw[n], sa[m], bias[n]) — gemm_quant_wgmma per channel (float(16·acc)·(sw/16) is
// float(acc)·sw exactly); otherwise float(acc)·(sa[m]·sw[n]) + bias[n] — gemm_w8a8_wgmma. I32 out:
// the sum.
template <int kOut, bool kWeightScaleFirst>
__global__ void int32_splitk_reduce_kernel(const int* __restrict__ part, int splits, int M, int N,
                                           const float* __restrict__ Sa, const float* __restrict__ Sw,
                                           const float* __restrict__ bias, void* __restrict__ Y) {
  const size_t total = size_t(M) * N;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    int acc = 0;
    for (int sp = 0; sp < splits; ++sp) acc += __ldcg(part + size_t(sp) * total + i);
    if constexpr (kOut == 2) {
      static_cast<int*>(Y)[i] = acc;
    } else {
      const int m = int(i / size_t(N)), n = int(i - size_t(m) * N);
      const float b = bias ? __ldg(bias + n) : 0.f;
      float v;
      if constexpr (kWeightScaleFirst) v = fmaf(__fmul_rn(float(acc), __ldg(Sw + n)), __ldg(Sa + m), b);
      else v = float(acc) * (__ldg(Sa + m) * __ldg(Sw + n)) + b;
      if constexpr (kOut == 1) static_cast<float*>(Y)[i] = v;
      else static_cast<__nv_bfloat16*>(Y)[i] = __float2bfloat16_rn(v);
    }
  }
}
template <int kOut, bool kWeightScaleFirst>
inline void int32_splitk_reduce(const int* part, int splits, int M, int N, const float* sa, const float* sw,
                                const float* bias, void* y, cudaStream_t stream) {
  int32_splitk_reduce_kernel<kOut, kWeightScaleFirst><<<reduce_blocks(M, N), 256, 0, stream>>>(part, splits, M, N, sa,
                                                                                              sw, bias, y);
  check_launch("int32_splitk_reduce_kernel");
}

}  // namespace perry::cuda::sm90
