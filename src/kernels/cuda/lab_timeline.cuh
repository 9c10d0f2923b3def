// Device side of the decode timeline lab (lab_timeline.h). Each kernel file that includes this
// keeps its own installed log (its *_set_lab_timeline calls install_timeline below) and passes it
// to its kernels as an argument.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/lab_timeline.h"

namespace perry::cuda::lab_timeline {
namespace {

// The log installed for this file's kernels (host side; launches pass it as a kernel argument:
// a parameter costs no memory load after the PDL wait, where a __device__ variable's reload,
// forced by the wait's memory clobber, cost 2.7% of a w4a8-g128 token — s16 run 3).
inline TimelineLog*& installed_log() {
  static TimelineLog* log = nullptr;
  return log;
}
inline void install_timeline(TimelineLog* log) { installed_log() = log; }

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// One block's marks, on the log given to the kernel (nullptr: off): start() at the kernel's entry
// takes the block's record (thread 0; its address waits in shared memory, so that nothing stays
// in registers through the kernel's loops), waited() after pdl::wait, input() once the block's
// input is built, finish() at every exit — a barrier first, so that the end is the block's, not
// thread 0's (lab only: with the log off it is skipped, and every caller reaches it
// block-uniformly).
__device__ __forceinline__ TimelineRecord*& block_record() {
  __shared__ TimelineRecord* rec;
  return rec;
}
struct BlockMarks {
  TimelineLog* const log;
  __device__ __forceinline__ void start() const {
    if (!log || threadIdx.x != 0) return;
    const unsigned long long slot = atomicAdd(&log->count, 1ULL);
    TimelineRecord* r = slot < log->capacity ? reinterpret_cast<TimelineRecord*>(log + 1) + slot : nullptr;
    block_record() = r;
    if (!r) return;
    r->smid = smid();
    r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r->g_start = global_ns();
    r->c_start = clock64();
  }
  __device__ __forceinline__ void waited() const {
    if (log && threadIdx.x == 0 && block_record()) block_record()->c_waited = clock64();
  }
  __device__ __forceinline__ void input() const {
    if (log && threadIdx.x == 0 && block_record()) block_record()->c_input = clock64();
  }
  __device__ __forceinline__ void finish(TimelineKernel kernel, unsigned arg) const {
    if (!log) return;
    __syncthreads();
    TimelineRecord* r = block_record();
    if (threadIdx.x != 0 || !r) return;
    r->c_end = clock64();
    r->g_end = global_ns();
    r->kernel = uint32_t(kernel);
    r->arg = arg;
  }
};

}  // namespace
}  // namespace perry::cuda::lab_timeline
