// Private to the quantized linear kernels (gemv_quant.cu, gemm_small_m.cu, gemm_quant_groups.cu,
// gemm_quant_sm90.cu): the host-side argument checks they share. `where` names the call in the
// perry::Error message ("gemv_quant(w8a8, M=.., N=.., K=..)").
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemv_quant.h"

namespace perry::cuda::quant_args {

inline bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// gemv_quant / gemm_small_m (fp32 y, any K): everything but the M range.
inline void check_linear(const std::string& where, const QuantModeBits& mb, const void* x, const float* sa,
                         const void* qweight, const float* scales, const float* bias, const float* y, int N,
                         int K) {
  if (N < 1 || K < 1 || K > 65536) throw Error(where + ": need N >= 1 and 1 <= K <= 65536");
  if (!x || !qweight || !scales || !y) throw Error(where + ": null x, qweight, scales or y");
  if (mb.a8 && !sa) throw Error(where + ": W*A8 mode needs the activation scales sa");
  if (!aligned(scales, 4) || !aligned(y, 4) || (bias && !aligned(bias, 4)) ||
      (sa && !aligned(sa, 4)) || (!mb.a8 && !aligned(x, 2)))
    throw Error(where + ": pointer not aligned to its element size");
}

// gemm_quant / gemm_quant_wgmma (int8 x, tensor-core tiles): pointers, their alignment and the
// output dtype (I32 = the raw int32 partials: sa and scales are not read).
inline void check_gemm_pointers(const std::string& where, const int8_t* x, const float* sa, const void* qweight,
                                const float* scales, const float* bias, const void* y, DType out) {
  if (!x || !qweight || !y) throw Error(where + ": null x, qweight or y");
  if (!aligned(x, 16) || !aligned(qweight, 16)) throw Error(where + ": x and qweight must be 16-byte aligned");
  if (out != DType::I32 && out != DType::F32 && out != DType::BF16)
    throw Error(where + ": output dtype must be F32, BF16 or I32");
  if (out != DType::I32) {
    if (!sa || !scales) throw Error(where + ": null sa or scales");
    if (!aligned(sa, 4) || !aligned(scales, 4) || (bias && !aligned(bias, 4)))
      throw Error(where + ": sa, scales or bias misaligned");
  }
  if (!aligned(y, out == DType::BF16 ? 2 : 4)) throw Error(where + ": y misaligned");
}

}  // namespace perry::cuda::quant_args
