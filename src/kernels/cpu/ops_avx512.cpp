// AVX-512 row kernels (see ops.h). Tails use masked loads/stores, so any n works.
#include "kernels/cpu/simd_avx512.h"  // first: its pragma must precede <immintrin.h>
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace perry::kernels::avx512 {

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // Four accumulators: the sum of squares is a dependency chain otherwise (4-cycle FMA latency).
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m512 v0 = _mm512_loadu_ps(xr + i), v1 = _mm512_loadu_ps(xr + i + 16);
      __m512 v2 = _mm512_loadu_ps(xr + i + 32), v3 = _mm512_loadu_ps(xr + i + 48);
      a0 = _mm512_fmadd_ps(v0, v0, a0);
      a1 = _mm512_fmadd_ps(v1, v1, a1);
      a2 = _mm512_fmadd_ps(v2, v2, a2);
      a3 = _mm512_fmadd_ps(v3, v3, a3);
    }
    for (; i < n; i += 16) {
      __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), xr + i);
      a0 = _mm512_fmadd_ps(v, v, a0);
    }
    float ss = hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(ss / float(n) + eps));
    for (i = 0; i < n; i += 16) {
      __mmask16 m = tail_mask(n - i);
      __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(_mm512_mul_ps(v, inv), _mm512_maskz_loadu_ps(m, w + i)));
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, u));
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void softmax_inplace(float* x, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tail_mask(n - i), x + i));
  __m512 m = _mm512_set1_ps(hmax(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    _mm512_mask_storeu_ps(x + i, k, e);
  }
  __m512 inv = _mm512_set1_ps(1.0f / hsum(sum));
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, const int32_t* positions, int64_t pos0,
                const RopeTable& rope) {
  const int hd = rope.head_dim(), half = hd / 2;
  for (int64_t t = 0; t < T; ++t) {
    int64_t pos = positions ? positions[t] : pos0 + t;
    const float* c = rope.cos(pos);
    const float* s = rope.sin(pos);
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + int64_t(h) * hd;
      for (int i = 0; i < half; i += 16) {
        __mmask16 m = tail_mask(half - i);
        __m512 a = _mm512_maskz_loadu_ps(m, v + i), b = _mm512_maskz_loadu_ps(m, v + half + i);
        __m512 cv = _mm512_maskz_loadu_ps(m, c + i), sv = _mm512_maskz_loadu_ps(m, s + i);
        _mm512_mask_storeu_ps(v + i, m, _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv)));
        _mm512_mask_storeu_ps(v + half + i, m, _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv)));
      }
    }
  }
}

void convert_row_to_f32(const void* src, DType dtype, int64_t n, float* out) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512 v;
    if (dtype == DType::F32)
      v = _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i);
    else if (dtype == DType::F16)
      v = maskz_load_f16(m, h + i);
    else
      v = maskz_load_bf16(m, h + i);
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

}  // namespace perry::kernels::avx512
