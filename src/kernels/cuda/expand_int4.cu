// The int4 → int8 weight expansions of the W4A8 prefill paths: expand_int4_weight (gemv_quant.h)
// and expand_int4_weight_two_level (expand_int4.h). One thread per 16 packed bytes (32 k values,
// low nibble first): per byte lane, nibble t → ((t ^ 8) − 8) (SIMD over the word's four bytes),
// the low / high values interleaved by byte permutes into k order; the two-level form then takes
// each byte times the group's multiplier. A byte-wise product needs no byte multiply: in 16-bit
// lanes (even bytes, odd bytes) the unsigned byte times m (<= 255·18 < 2^16) carries nothing into
// the next lane, and its low byte is the two's complement of v·m because |v·m| <= 126 (arithmetic
// mod 256).
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/expand_int4.h"
#include "kernels/cuda/gemv_quant.h"

namespace perry::cuda {

namespace {
__device__ __forceinline__ uint32_t times_bytes(uint32_t w, uint32_t m) {
  const uint32_t even = ((w & 0x00FF00FFu) * m) & 0x00FF00FFu;
  const uint32_t odd = (((w >> 8) & 0x00FF00FFu) * m) & 0x00FF00FFu;
  return even | (odd << 8);
}

// kTwoLevel: mult int8 [N, G] (G groups of group_chunks 16-byte chunks a row); otherwise unused.
template <bool kTwoLevel>
__global__ void expand_int4_kernel(const uint4* __restrict__ packed, const int8_t* __restrict__ mult,
                                   uint4* __restrict__ out, size_t chunks, int row_chunks, int group_chunks, int G) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < chunks; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t m = 1;
    if constexpr (kTwoLevel) {
      const size_t n = i / size_t(row_chunks);
      const int c = int(i - n * size_t(row_chunks));
      m = uint32_t(uint8_t(__ldg(mult + n * size_t(G) + c / group_chunks)));
    }
    const uint4 p = __ldg(packed + i);
    const uint32_t w[4] = {p.x, p.y, p.z, p.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = __vsub4((w[j] & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u);
      const uint32_t hi = __vsub4(((w[j] >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u);
      o[2 * j] = __byte_perm(lo, hi, 0x5140);
      o[2 * j + 1] = __byte_perm(lo, hi, 0x7362);
      if constexpr (kTwoLevel) {
        o[2 * j] = times_bytes(o[2 * j], m);
        o[2 * j + 1] = times_bytes(o[2 * j + 1], m);
      }
    }
    out[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
    out[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

void check_expand_args(const std::string& where, const void* qweight, const void* out) {
  if (!qweight || !out) throw Error(where + ": null pointer");
  if (reinterpret_cast<uintptr_t>(qweight) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw Error(where + ": qweight and out must be 16-byte aligned");
}

unsigned expand_blocks(size_t chunks) { return unsigned(std::min<size_t>((chunks + 255) / 256, 132 * 16)); }
}  // namespace

void expand_int4_weight(const void* qweight, int N, int K, int8_t* out, cudaStream_t stream) {
  const std::string where = "expand_int4_weight(N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (N < 1 || K < 1 || K % 32 != 0) throw Error(where + ": need N >= 1 and K a positive multiple of 32");
  check_expand_args(where, qweight, out);
  const size_t chunks = size_t(N) * size_t(K) / 32;
  expand_int4_kernel<false><<<expand_blocks(chunks), 256, 0, stream>>>(
      static_cast<const uint4*>(qweight), nullptr, reinterpret_cast<uint4*>(out), chunks, 1, 1, 1);
  check_launch("expand_int4_weight");
}

void expand_int4_weight_two_level(const void* qweight, const int8_t* multipliers, int group_size, int N, int K,
                                  int8_t* out, cudaStream_t stream) {
  const std::string where = "expand_int4_weight_two_level(N=" + std::to_string(N) + ", K=" + std::to_string(K) +
                            ", group " + std::to_string(group_size) + ")";
  if (N < 1 || group_size < 32 || group_size % 32 != 0 || K < group_size || K % group_size != 0)
    throw Error(where + ": need N >= 1, a group size that is a multiple of 32 and K a multiple of it");
  if (!multipliers) throw Error(where + ": null multipliers");
  check_expand_args(where, qweight, out);
  const size_t chunks = size_t(N) * size_t(K) / 32;
  expand_int4_kernel<true><<<expand_blocks(chunks), 256, 0, stream>>>(
      static_cast<const uint4*>(qweight), multipliers, reinterpret_cast<uint4*>(out), chunks, K / 32, group_size / 32,
      K / group_size);
  check_launch("expand_int4_weight_two_level");
}

}  // namespace perry::cuda
