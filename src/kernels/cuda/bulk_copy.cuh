// Shared-memory mbarriers and the bulk (non-tensor) asynchronous copy of Hopper (sm_90+): one
// thread starts a copy of a contiguous global range into shared memory and the copy engine signals
// completion on an mbarrier (its transaction count). Used by the sm_90a GEMMs (with the tensor-map
// TMA loads of sm90_gemm_common.cuh) and by gemv_decode's per-warp weight rings, where it keeps
// far more bytes in flight than registers can hold. Device code, compiled for sm_90+ only.
#pragma once
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PERRY_BULK_COPY 1
#endif

namespace perry::cuda::bulk {

#ifdef PERRY_BULK_COPY
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Brings [src, src + bytes) into L2 (16-byte aligned, bytes a multiple of 16): no shared memory,
// nothing to wait for.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// ---- mbarriers (shared::cta) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrive that also raises the phase's expected transaction bytes (the copies' total).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
// waiting on parity 1 (the phase "before" it) returns at once: producers start at parity 1.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// After mbarrier.init (before the threads that use the barriers synchronize): makes the
// initialized barriers visible to the async proxy (the copies' complete_tx) too.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory accesses before later async-proxy ones
// (wgmma operand reads, copy writes) that are synchronized with it.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global src into shared dst;
// completion counts `bytes` on the mbarrier.
__device__ __forceinline__ void copy_global_to_smem(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
#endif  // PERRY_BULK_COPY

}  // namespace perry::cuda::bulk
