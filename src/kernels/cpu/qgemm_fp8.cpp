// w8a8-fp8 on the CPU (see PackedFp8 in qgemm.h): decode once, fake-quantize the activations per
// token, run the float GEMM, scale after the dot product. Speed is not the point of this path —
// it is the CPU side of the GPU's fp8 comparison mode — but it reuses the float modes' GEMM so
// perplexity runs on the embedded model take seconds, not hours.
#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q {

using quant::QuantizedWeight;

namespace {
// The 256 e4m3 values (NaN codes decode to NaN), built once from the codec of core/dtype.h.
const float* e4m3_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) t[size_t(b)] = e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return table.data();
}
}  // namespace

PackedFp8 pack_fp8(const QuantizedWeight& w) {
  w.validate();
  PERRY_CHECK(quant::quant_scheme(w.mode).fp8, "pack_fp8: mode '{}' is not an fp8 mode", quant::quant_mode_name(w.mode));
  PackedFp8 p;
  p.N = w.N;
  p.K = w.K;
  p.w.resize(size_t(w.N * w.K));
  p.scales.resize(size_t(w.N));
  const float* dec = e4m3_table();
  uint16_t* dst = p.w.data();
  thread_pool().parallel_for(size_t(w.N * w.K), 1 << 16, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) dst[i] = f32_to_bf16(dec[uint8_t(w.qweight[i])]);  // exact
  });
  for (int64_t n = 0; n < w.N; ++n) p.scales[size_t(n)] = w.scales[size_t(n)];
  p.gemm = std::make_unique<kernels::FloatLinear>(p.w.data(), DType::BF16, w.N, w.K);
  return p;
}

QuantizedWeight unpack_fp8(const PackedFp8& p) {
  QuantizedWeight w;
  w.mode = quant::QuantMode::W8A8_FP8;
  w.N = p.N;
  w.K = p.K;
  w.qweight.resize(size_t(p.N * p.K));
  const uint16_t* src = p.w.data();
  thread_pool().parallel_for(w.qweight.size(), 1 << 16, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) w.qweight[i] = int8_t(f32_to_e4m3(bf16_to_f32(src[i])));
  });
  w.scales.assign(p.scales.data(), p.scales.data() + p.N);
  return w;
}

void quantize_rows_fp8(const float* x, int64_t M, int64_t K, float* xq, float* sa) {
  const float* dec = e4m3_table();
  thread_pool().parallel_for(size_t(M), 1, [&](size_t m0, size_t m1) {
    std::vector<uint8_t> codes(static_cast<size_t>(K));
    for (size_t m = m0; m < m1; ++m) {
      sa[m] = quant::quantize_row_fp8_ref(x + m * K, K, codes.data());
      float* row = xq + m * K;
      for (int64_t k = 0; k < K; ++k) row[k] = dec[codes[size_t(k)]];
    }
  });
}

void fp8_forward(const PackedFp8& p, const float* xq, const float* sa, int64_t M, float* y, const float* bias) {
  p.gemm->forward(xq, M, y, nullptr);  // the exact products' fp32 sums, unscaled
  const int64_t N = p.N;
  const float* sw = p.scales.data();
  thread_pool().parallel_for(size_t(M), std::max<size_t>(1, size_t(16384 / N)), [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m) {
      float* ym = y + m * N;
      for (int64_t n = 0; n < N; ++n) ym[n] = std::fma(ym[n], sa[m] * sw[n], bias ? bias[n] : 0.0f);
    }
  });
}

std::string fp8_kernel_name(int64_t N, int64_t K, int64_t M) {
  // FloatLinear's choice depends on the dtype, the shape and M only, so a layer that has not
  // been decoded yet (one bound for a GPU) can name it without decoding: the probe's weight
  // pointer is never read.
  static const uint16_t unread = 0;
  const kernels::FloatLinear probe(&unread, DType::BF16, N, K);
  return fmt::format("{}:float_emulation/{}", quant::quant_mode_name(quant::QuantMode::W8A8_FP8),
                     probe.kernel_name(M));
}

namespace ref {
void fp8_forward(const QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias) {
  const float* dec = e4m3_table();
  std::vector<uint8_t> codes(static_cast<size_t>(w.K));
  std::vector<float> xq(static_cast<size_t>(w.K));
  for (int64_t m = 0; m < M; ++m) {
    const float sa = quant::quantize_row_fp8_ref(x + m * w.K, w.K, codes.data());
    for (int64_t k = 0; k < w.K; ++k) xq[size_t(k)] = dec[codes[size_t(k)]];
    for (int64_t n = 0; n < w.N; ++n) {
      const int8_t* wr = w.qweight.data() + n * w.K;
      float s = 0;
      for (int64_t k = 0; k < w.K; ++k) s += xq[size_t(k)] * dec[uint8_t(wr[k])];
      y[m * w.N + n] = std::fma(s, sa * w.scales[size_t(n)], bias ? bias[n] : 0.0f);
    }
  }
}
}  // namespace ref

}  // namespace perry::kernels::q
