// Device side of the decode timeline lab (lab_timeline.h). Each kernel file that includes this
// keeps its own installed log (its *_set_lab_timeline calls install_timeline below) and passes it
// to its kernels as an argument.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/lab_timeline.h"

namespace perry::cuda::lab_timeline {
namespace {

// The log installed for this file's kernels (host side; a launch passes it as a kernel argument
// to the kernel's timeline instantiation, BlockMarks<true>).
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

// One block's marks on the log given to the kernel: start() at the kernel's entry takes the
// block's record (thread 0), waited() after pdl::wait, input() once the block's input is built,
// finish() at every exit — a barrier first, so that the end is the block's, not thread 0's (every
// caller reaches it block-uniformly). kOn = false is what the real kernels instantiate: every mark
// is empty and the kernel's code is what it was without the lab (the first version, a runtime
// check of the log, measured 2.7% / 5% slower for w4a8-g128 / w8a8 decode — s16 run 3); the
// launch picks the kOn = true instantiation only while a log is installed.
template <bool kOn>
struct BlockMarks {
  TimelineLog* const log;
  TimelineRecord* rec = nullptr;  // thread 0's record, or nullptr
  __device__ __forceinline__ void start() {
    if constexpr (kOn) {
      if (threadIdx.x != 0) return;
      const unsigned long long slot = atomicAdd(&log->count, 1ULL);
      if (slot >= log->capacity) return;
      rec = reinterpret_cast<TimelineRecord*>(log + 1) + slot;
      rec->smid = smid();
      rec->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
      rec->g_start = global_ns();
      rec->c_start = clock64();
    }
  }
  __device__ __forceinline__ void waited() {
    if constexpr (kOn)
      if (rec) rec->c_waited = clock64();
  }
  __device__ __forceinline__ void input() {
    if constexpr (kOn)
      if (rec) rec->c_input = clock64();
  }
  __device__ __forceinline__ void finish(TimelineKernel kernel, unsigned arg) {
    if constexpr (kOn) {
      __syncthreads();
      if (!rec) return;
      rec->c_end = clock64();
      rec->g_end = global_ns();
      rec->kernel = uint32_t(kernel);
      rec->arg = arg;
    }
  }
};

}  // namespace
}  // namespace perry::cuda::lab_timeline
