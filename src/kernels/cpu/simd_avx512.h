// Small AVX-512 helpers shared by the *_avx512.cpp kernels (include only from those files).
#pragma once
// GCC 12 at -O3 reports false (maybe-)uninitialized warnings for the `__Y = __Y` undefined-vector
// idiom inside its AVX-512 intrinsics; include this header first so the pragma precedes <immintrin.h>.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

namespace perry::kernels::avx512 {

// exp(x) for float lanes, ~1 ulp on [-87, 88]: 2^n * p(r) with r = x - n ln2 (Cody-Waite split),
// p a degree-6 minimax-like Taylor polynomial; scalef applies 2^n and handles underflow to 0.
inline __m512 exp_ps(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Horizontal sum / max. Not _mm512_reduce_*: GCC 12 warns about the undefined-vector idiom inside
// them; the zero-masked extracts below compile to the same shuffles without the noise.
inline float hsum(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_maskz_extractf32x4_ps(0xf, a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
inline float hmax(__m512 v) {
  __m256 a = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_maskz_extractf32x4_ps(0xf, a, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// 16 bf16 -> 16 f32 (exact: bf16 is the top half of an f32).
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline __m512 maskz_load_bf16(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m512 load_f16(const uint16_t* p) { return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256((const __m256i*)p)); }
inline __m512 maskz_load_f16(__mmask16 m, const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_maskz_loadu_epi16(m, p));
}

}  // namespace perry::kernels::avx512
