// AVX-512 attention inner loop: a GQA group's heads (up to 4 at a time, so K and V tiles are read
// once per 4 heads) against a tile of 64 keys: scores by FMA + horizontal sum, one vectorised exp
// per tile (online softmax), then P·V with the accumulators held in registers per 16-float slice.
#include "kernels/cpu/simd_avx512.h"  // first: its pragma must precede <immintrin.h>
#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"

namespace perry::kernels::avx512 {
namespace {

constexpr int kTile = 64;

template <int GN>
void attend_group(const float* qg, int hd, const float* k, const float* v, int64_t j0, int64_t j1, float scale,
                  float* m, float* l, float* acc) {
  alignas(64) float s[GN][kTile];
  const int full = hd / 16 * 16;
  const __mmask16 tail = tail_mask(hd - full);
  for (int64_t jt = j0; jt < j1; jt += kTile) {
    const int n = int(std::min<int64_t>(kTile, j1 - jt));
    // Scores.
    for (int j = 0; j < n; ++j) {
      const float* kj = k + (jt + j) * hd;
      __m512 a[GN];
      for (int g = 0; g < GN; ++g) a[g] = _mm512_setzero_ps();
      int c = 0;
      for (; c < full; c += 16) {
        __m512 kv = _mm512_loadu_ps(kj + c);
        for (int g = 0; g < GN; ++g) a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qg + g * hd + c), kv, a[g]);
      }
      if (c < hd) {
        __m512 kv = _mm512_maskz_loadu_ps(tail, kj + c);
        for (int g = 0; g < GN; ++g) a[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, qg + g * hd + c), kv, a[g]);
      }
      for (int g = 0; g < GN; ++g) s[g][j] = hsum(a[g]) * scale;
    }
    // Online softmax update per head; s becomes p.
    float corr[GN];
    for (int g = 0; g < GN; ++g) {
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int j = 0; j < n; j += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tail_mask(n - j), &s[g][j]));
      float m_new = std::max(m[g], hmax(mx));
      corr[g] = std::exp(m[g] - m_new);  // exp(-inf) = 0 on the first tile
      m[g] = m_new;
      __m512 mv = _mm512_set1_ps(m_new), sum = _mm512_setzero_ps();
      for (int j = 0; j < n; j += 16) {
        __mmask16 km = tail_mask(n - j);
        __m512 p = _mm512_maskz_mov_ps(km, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(&s[g][j]), mv)));
        sum = _mm512_add_ps(sum, p);
        _mm512_store_ps(&s[g][j], p);
      }
      l[g] = l[g] * corr[g] + hsum(sum);
    }
    // acc = acc * corr + P · V, one 16-float slice of the head dim at a time.
    for (int c = 0; c < hd; c += 16) {
      const __mmask16 cm = tail_mask(hd - c);
      __m512 a[GN];
      for (int g = 0; g < GN; ++g)
        a[g] = _mm512_mul_ps(_mm512_maskz_loadu_ps(cm, acc + g * hd + c), _mm512_set1_ps(corr[g]));
      const float* vp = v + jt * hd + c;
      for (int j = 0; j < n; ++j, vp += hd) {
        __m512 vv = _mm512_maskz_loadu_ps(cm, vp);
        for (int g = 0; g < GN; ++g) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(s[g][j]), vv, a[g]);
      }
      for (int g = 0; g < GN; ++g) _mm512_mask_storeu_ps(acc + g * hd + c, cm, a[g]);
    }
  }
}

}  // namespace

void attend_chunk(const float* qg, int G, int hd, const float* k, const float* v, int64_t j0, int64_t j1,
                  float scale, float* m, float* l, float* acc) {
  for (int g0 = 0; g0 < G; g0 += 4) {
    const float* q = qg + int64_t(g0) * hd;
    float* a = acc + int64_t(g0) * hd;
    switch (std::min(4, G - g0)) {
      case 4: attend_group<4>(q, hd, k, v, j0, j1, scale, m + g0, l + g0, a); break;
      case 3: attend_group<3>(q, hd, k, v, j0, j1, scale, m + g0, l + g0, a); break;
      case 2: attend_group<2>(q, hd, k, v, j0, j1, scale, m + g0, l + g0, a); break;
      default: attend_group<1>(q, hd, k, v, j0, j1, scale, m + g0, l + g0, a); break;
    }
  }
}

}  // namespace perry::kernels::avx512
