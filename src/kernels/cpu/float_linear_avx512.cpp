// AVX-512 GEMV for FloatLinear (decode and small M). Memory-bound: each weight byte is read once
// per call. bf16/f16 weights are widened to f32 in registers (bf16: zero-extend + shift; f16:
// vcvtph2ps) and multiplied in f32 with FMA — exact products of the stored weights and the fp32
// activations; at decode the ALUs have ~4x headroom over memory, so vdpbf16ps (which would round x
// to bf16) buys nothing here. M = 1: see row_m1 below. M > 1: 4 weight rows x up to 4 rows of x =
// 16 accumulators; for M > 4 the 4-row weight tile (<= 4*K*4 bytes) is re-used from L1/L2 for each
// group of 4 x rows.
#include "kernels/cpu/simd_avx512.h"  // first: its pragma must precede <immintrin.h>
#include <algorithm>

#include "kernels/cpu/float_linear.h"

namespace perry::kernels::avx512 {
namespace {

template <DType WT>
inline __m512 load_w(const void* w, int64_t i) {
  if constexpr (WT == DType::F32) return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  else if constexpr (WT == DType::BF16) return load_bf16(static_cast<const uint16_t*>(w) + i);
  else return load_f16(static_cast<const uint16_t*>(w) + i);
}
template <DType WT>
inline __m512 maskz_load_w(__mmask16 m, const void* w, int64_t i) {
  if constexpr (WT == DType::F32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
  else if constexpr (WT == DType::BF16) return maskz_load_bf16(m, static_cast<const uint16_t*>(w) + i);
  else return maskz_load_f16(m, static_cast<const uint16_t*>(w) + i);
}

// y[m, r] (row stride ldy) = sum_k x[m, k] * w[r, k] for m < MB, r < NR; w rows at w + r*K.
template <DType WT, int MB, int NR>
inline void tile(const void* w, int64_t row0, int64_t K, const float* x, float* y, int64_t ldy,
                 const float* bias) {
  __m512 acc[MB][NR];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w<WT>(w, (row0 + r) * K + k);
    for (int m = 0; m < MB; ++m) {
      __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  if (k < K) {
    const __mmask16 t = tail_mask(K - k);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = maskz_load_w<WT>(t, w, (row0 + r) * K + k);
    for (int m = 0; m < MB; ++m) {
      __m512 xv = _mm512_maskz_loadu_ps(t, x + m * K + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NR; ++r)
      y[m * ldy + r] = hsum(acc[m][r]) + (bias ? bias[r] : 0.0f);
}

// M = 1 schedule, measured (bench/lab_float_linear, docs/perf/cpu-float-linear.md): one row at a
// time reaches ~90-100% of the read probe while x (K floats) stays in L1 next to the weight stream;
// at larger K x spills to L2, its reloads compete with the weight misses (down-proj K = 8192: 13 vs
// 26 GB/s on one core) and 8-row tiles (x loaded once per 8 rows) win. 2- and 4-row tiles and
// software prefetch (512 B / 1 KiB ahead) were slower in every case.
constexpr int64_t kRowSequentialMaxK = 4096;

// One weight row at a time, 4 independent accumulators along K: the thread's whole weight range is
// then a single sequential stream (row n+1 follows row n in memory), the easiest pattern for the
// hardware prefetcher at M = 1.
template <DType WT>
inline void row_m1(const void* w, int64_t row, int64_t K, const float* x, float* y, const float* bias) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t base = row * K;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a0 = _mm512_fmadd_ps(load_w<WT>(w, base + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(load_w<WT>(w, base + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(load_w<WT>(w, base + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(load_w<WT>(w, base + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k < K; k += 16) {
    const __mmask16 t = tail_mask(K - k);
    a0 = _mm512_fmadd_ps(maskz_load_w<WT>(t, w, base + k), _mm512_maskz_loadu_ps(t, x + k), a0);
  }
  y[row] = hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + (bias ? bias[row] : 0.0f);
}

template <DType WT, int NR>
inline void rows_all_m(const void* w, int64_t row0, int64_t N, int64_t K, const float* x, int64_t M, float* y,
                       const float* bias) {
  const float* b = bias ? bias + row0 : nullptr;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<WT, 4, NR>(w, row0, K, x + m * K, y + m * N + row0, N, b);
  switch (M - m) {
    case 3: tile<WT, 3, NR>(w, row0, K, x + m * K, y + m * N + row0, N, b); break;
    case 2: tile<WT, 2, NR>(w, row0, K, x + m * K, y + m * N + row0, N, b); break;
    case 1: tile<WT, 1, NR>(w, row0, K, x + m * K, y + m * N + row0, N, b); break;
    default: break;
  }
}

template <DType WT>
void gemv_t(const void* w, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
            int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (M == 1) {
    if (K <= kRowSequentialMaxK) {
      for (; n < n1; ++n) row_m1<WT>(w, n, K, x, y, bias);
    } else {
      for (; n + 8 <= n1; n += 8) rows_all_m<WT, 8>(w, n, N, K, x, M, y, bias);
      for (; n < n1; ++n) row_m1<WT>(w, n, K, x, y, bias);
    }
    return;
  }
  for (; n + 4 <= n1; n += 4) rows_all_m<WT, 4>(w, n, N, K, x, M, y, bias);
  for (; n < n1; ++n) rows_all_m<WT, 1>(w, n, N, K, x, M, y, bias);
}

}  // namespace

void f32_to_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(out + i, m, reinterpret_cast<__m256i&>(b));
  }
}

void gemv(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
          int64_t n0, int64_t n1) {
  switch (wt) {
    case DType::F32: gemv_t<DType::F32>(w, N, K, x, M, y, bias, n0, n1); break;
    case DType::BF16: gemv_t<DType::BF16>(w, N, K, x, M, y, bias, n0, n1); break;
    default: gemv_t<DType::F16>(w, N, K, x, M, y, bias, n0, n1); break;
  }
}

}  // namespace perry::kernels::avx512
