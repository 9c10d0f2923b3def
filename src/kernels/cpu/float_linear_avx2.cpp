// AVX2 + FMA + F16C GEMV for FloatLinear on machines without AVX-512 (same scheme as the AVX-512
// file, 8 floats per vector: 4 weight rows x up to 4 x rows = 16 accumulators).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/float_linear.h"

namespace perry::kernels::avx2 {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType WT>
inline __m256 load_w(const void* w, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (WT == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline float w_scalar(const void* w, DType wt, int64_t i) {
  if (wt == DType::F32) return static_cast<const float*>(w)[i];
  uint16_t h = static_cast<const uint16_t*>(w)[i];
  return wt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

template <DType WT, int MB, int NR>
inline void tile(const void* w, int64_t row0, int64_t K, const float* x, float* y, int64_t ldy, const float* bias) {
  __m256 acc[MB][NR];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w<WT>(w, (row0 + r) * K + k);
    for (int m = 0; m < MB; ++m) {
      __m256 xv = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    for (int r = 0; r < NR; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t kk = k; kk < K; ++kk) s += w_scalar(w, WT, (row0 + r) * K + kk) * x[m * K + kk];
      y[m * ldy + r] = s + (bias ? bias[r] : 0.0f);
    }
  }
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
  for (; n + 4 <= n1; n += 4) rows_all_m<WT, 4>(w, n, N, K, x, M, y, bias);
  for (; n < n1; ++n) rows_all_m<WT, 1>(w, n, N, K, x, M, y, bias);
}

}  // namespace

void gemv(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
          int64_t n0, int64_t n1) {
  switch (wt) {
    case DType::F32: gemv_t<DType::F32>(w, N, K, x, M, y, bias, n0, n1); break;
    case DType::BF16: gemv_t<DType::BF16>(w, N, K, x, M, y, bias, n0, n1); break;
    default: gemv_t<DType::F16>(w, N, K, x, M, y, bias, n0, n1); break;
  }
}

}  // namespace perry::kernels::avx2
