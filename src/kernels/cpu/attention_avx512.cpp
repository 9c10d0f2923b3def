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
constexpr int kAccRegs = 16;  // P·V accumulators held in registers (of 32 zmm)

// [Σ a0, Σ a1, Σ a2, Σ a3]: pairwise unpack/shuffle adds within 128-bit lanes, then the lanes.
inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

template <int GN>
void attend_group(const float* qg, int hd, const float* k, const float* v, int64_t j0, int64_t j1, float scale,
                  float* m, float* l, float* acc) {
  alignas(64) float s[GN][kTile];
  const int full = hd / 16 * 16;
  const __mmask16 tail = tail_mask(hd - full);
  for (int64_t jt = j0; jt < j1; jt += kTile) {
    const int n = int(std::min<int64_t>(kTile, j1 - jt));
    // Scores, four keys at a time (one q load serves four keys, one transposing reduction
    // replaces four horizontal sums), then the remaining keys one by one.
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      const float* kj = k + (jt + j) * hd;
      __m512 a[GN][4];
      for (int g = 0; g < GN; ++g)
        for (int r = 0; r < 4; ++r) a[g][r] = _mm512_setzero_ps();
      for (int c = 0; c < hd; c += 16) {
        const __mmask16 cm = c < full ? __mmask16(0xffff) : tail;
        __m512 qv[GN];
        for (int g = 0; g < GN; ++g) qv[g] = _mm512_maskz_loadu_ps(cm, qg + g * hd + c);
        for (int r = 0; r < 4; ++r) {
          const __m512 kv = _mm512_maskz_loadu_ps(cm, kj + r * hd + c);
          for (int g = 0; g < GN; ++g) a[g][r] = _mm512_fmadd_ps(qv[g], kv, a[g][r]);
        }
      }
      for (int g = 0; g < GN; ++g)
        _mm_storeu_ps(&s[g][j], _mm_mul_ps(hsum4(a[g][0], a[g][1], a[g][2], a[g][3]), _mm_set1_ps(scale)));
    }
    for (; j < n; ++j) {
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
    // acc = acc * corr + P · V in blocks of SB 16-float slices of the head dim: GN·SB accumulators
    // stay in registers across the tile's keys, so each key costs GN broadcasts and SB loads of V
    // for GN·SB FMAs (one slice at a time paid a broadcast per FMA).
    constexpr int SB = kAccRegs / GN;
    for (int c0 = 0; c0 < hd; c0 += 16 * SB) {
      __mmask16 cm[SB];
      for (int b = 0; b < SB; ++b) cm[b] = c0 + 16 * b < hd ? tail_mask(hd - c0 - 16 * b) : __mmask16(0);
      __m512 a[GN][SB];
      for (int g = 0; g < GN; ++g) {
        const __m512 cg = _mm512_set1_ps(corr[g]);
        for (int b = 0; b < SB; ++b) a[g][b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(cm[b], acc + g * hd + c0 + 16 * b), cg);
      }
      const float* vp = v + jt * hd + c0;
      for (int j = 0; j < n; ++j, vp += hd) {
        __m512 pj[GN];
        for (int g = 0; g < GN; ++g) pj[g] = _mm512_set1_ps(s[g][j]);
        for (int b = 0; b < SB; ++b) {
          if (cm[b] == 0) continue;  // past the head dim (SB is sized for the widest block)
          const __m512 vv = _mm512_maskz_loadu_ps(cm[b], vp + 16 * b);
          for (int g = 0; g < GN; ++g) a[g][b] = _mm512_fmadd_ps(pj[g], vv, a[g][b]);
        }
      }
      for (int g = 0; g < GN; ++g)
        for (int b = 0; b < SB; ++b) _mm512_mask_storeu_ps(acc + g * hd + c0 + 16 * b, cm[b], a[g][b]);
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
