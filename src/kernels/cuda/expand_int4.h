// w4a8-g128 at prefill sizes with two-level group scales (quant/two_level_scales.h): the packed
// int4 weight expanded to int8 codes of one per-channel scale, q8[n, k] = q4[n, k] · m[n, k / gs],
// so that gemm_w8a8_wgmma runs the grouped layer as a per-channel one (its scale = the channel
// scale). The products are exact integers (|q8| <= 126), so the GEMM's int32 sums are exactly the
// grouped kernels' per-group sums times their multipliers, added. (expand_int4.cu also defines
// gemv_quant.h's plain expand_int4_weight: one kernel for both.)
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace perry::cuda {

// qweight: the canonical packed int4 [N, K/2] (low nibble = even k, two's complement, values in
// [-7, 7]); multipliers int8 [N, G], G = K / group_size, values in [0, 18]; out int8 [N, K].
// Requirements (checked, perry::Error): N >= 1, K a positive multiple of group_size, group_size a
// positive multiple of 32; qweight and out 16-byte aligned. Asynchronous on `stream`.
void expand_int4_weight_two_level(const void* qweight, const int8_t* multipliers, int group_size, int N, int K,
                                  int8_t* out, cudaStream_t stream);

}  // namespace perry::cuda
