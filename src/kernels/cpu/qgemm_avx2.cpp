// AVX2 fallback of the W8A8 / W4A8 kernels (machines without AVX-512 VNNI). Same packed layout
// as the AVX-512 kernels, read in 32-byte halves. AVX2 has no u8×s8 dot with 32-bit sums, so it
// uses the sign trick: vpmaddubsw(|w|, sign(a, w)) — both factors within ±127, so the int16 pair
// sums (≤ 2·127·127) never saturate — then vpmaddwd with ones. Activations stay signed, so no
// +128 correction is needed.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q::avx2 {

namespace {

float quantize_row(const float* x, int64_t K, int8_t* q, int64_t ldq) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mv = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) mv = _mm256_max_ps(mv, _mm256_and_ps(_mm256_loadu_ps(x + k), absmask));
  alignas(32) float t[8];
  _mm256_store_ps(t, mv);
  float amax = 0;
  for (float v : t) amax = std::max(amax, v);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  float inv = amax > 0 ? 127.0f / amax : 0.0f;
  float scale = amax / 127.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
  if (inv == 0) {
    std::memset(q, 0, size_t(ldq));
    return scale;
  }
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  auto cvt = [&](const float* p) {
    __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vinv));
    return _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
  };
  for (k = 0; k + 32 <= K; k += 32) {
    const __m256i p01 = _mm256_packs_epi32(cvt(x + k), cvt(x + k + 8));
    const __m256i p23 = _mm256_packs_epi32(cvt(x + k + 16), cvt(x + k + 24));
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), b);
  }
  for (; k < K; ++k) {
    float v = std::nearbyint(x[k] * inv);
    q[k] = int8_t(std::min(std::max(v, -127.0f), 127.0f));
  }
  if (ldq > K) std::memset(q + K, 0, size_t(ldq - K));
  return scale;
}

struct Args {
  const PackedInt* p;
  const int8_t* a;
  int64_t lda;
  const float* sa;
  float* y;
  const float* bias;
  int32_t* acc;
};

inline __m256i dot4(__m256i acc, __m256i a, __m256i w, __m256i aw, __m256i ones) {
  const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, ones));
}
inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// MR rows × one panel (two ymm halves of 8 columns).
template <int MR, bool INT4, bool HOOK>
void tile(const Args& A, int64_t m0, int64_t pn) {
  const PackedInt& P = *A.p;
  const int G = P.G;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 fa[MR][2];
  for (int r = 0; r < MR; ++r) fa[r][0] = fa[r][1] = _mm256_setzero_ps();
  const uint8_t* bp = P.data.data() + pn * P.panel_bytes;
  for (int g = 0; g < G; ++g) {
    const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    if constexpr (!INT4) {
      for (int64_t s = s0; s < s1; ++s) {
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + s * 64));
        const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + s * 64 + 32));
        const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
        for (int r = 0; r < MR; ++r) {
          const __m256i a = bcast32(A.a + (m0 + r) * A.lda + 4 * s);
          acc[r][0] = dot4(acc[r][0], a, w0, aw0, ones);
          acc[r][1] = dot4(acc[r][1], a, w1, aw1, ones);
        }
      }
    } else {
      const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
      for (int64_t s = s0; s < s1; s += 2) {
        for (int h = 0; h < 2; ++h) {
          const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(bp + (s / 2) * 64 + 32 * h));
          const __m256i w0 = _mm256_sub_epi8(_mm256_and_si256(raw, mask), eight);
          const __m256i w1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(raw, 4), mask), eight);
          const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
          for (int r = 0; r < MR; ++r) {
            const int8_t* ar = A.a + (m0 + r) * A.lda + 4 * s;
            acc[r][h] = dot4(acc[r][h], bcast32(ar), w0, aw0, ones);
            acc[r][h] = dot4(acc[r][h], bcast32(ar + 4), w1, aw1, ones);
          }
        }
      }
    }
    const int64_t pg = (pn * G + g) * kPanel;
    for (int h = 0; h < 2; ++h) {
      const __m256 sw = _mm256_load_ps(P.scales.data() + pg + 8 * h);
      for (int r = 0; r < MR; ++r) {
        if constexpr (HOOK) {
          alignas(32) int32_t tmp[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[r][h]);
          for (int c = 0; c < 8; ++c) {
            const int64_t n = pn * kPanel + 8 * h + c;
            if (n < P.N) A.acc[((m0 + r) * P.N + n) * G + g] = tmp[c];
          }
        } else {
          fa[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), sw, fa[r][h]);
        }
      }
    }
  }
  if constexpr (!HOOK) {
    const int64_t n0 = pn * kPanel;
    const int64_t cols = std::min<int64_t>(kPanel, P.N - n0);
    alignas(32) float bias[kPanel] = {}, out[kPanel];
    if (A.bias) std::copy_n(A.bias + n0, cols, bias);
    for (int r = 0; r < MR; ++r) {
      const __m256 s = _mm256_set1_ps(A.sa[m0 + r]);
      _mm256_store_ps(out, _mm256_fmadd_ps(fa[r][0], s, _mm256_load_ps(bias)));
      _mm256_store_ps(out + 8, _mm256_fmadd_ps(fa[r][1], s, _mm256_load_ps(bias + 8)));
      std::copy_n(out, cols, A.y + (m0 + r) * P.N + n0);
    }
  }
}

using TileFn = void (*)(const Args&, int64_t, int64_t);
template <bool INT4, bool HOOK, int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&tile<R + 1, INT4, HOOK>...};
}
constexpr int kMR = 4;

template <bool INT4, bool HOOK>
void run(const Args& A, int64_t M, Path path) {
  const PackedInt& P = *A.p;
  static constexpr auto t = make_tiles<INT4, HOOK>(std::make_integer_sequence<int, kMR>{});
  const size_t grain = path == Path::Gemv ? 8 : 1;
  thread_pool().parallel_for(size_t(P.n_panels), grain, [&](size_t b0, size_t b1) {
    for (size_t pn = b0; pn < b1; ++pn)
      for (int64_t m = 0; m < M; m += kMR) t[size_t(std::min<int64_t>(kMR, M - m) - 1)](A, m, int64_t(pn));
  });
}

}  // namespace

void quantize_rows_s8(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* scales) {
  for (int64_t m = 0; m < M; ++m) scales[m] = quantize_row(x + m * K, K, q + m * ldq, ldq);
}

void int_forward(const PackedInt& p, const int8_t* a, int64_t M, const float* sa, float* y, const float* bias,
                 Path path) {
  Args A{&p, a, p.lda(), sa, y, bias, nullptr};
  if (p.bits == 4) {
    run<true, false>(A, M, path);
  } else {
    run<false, false>(A, M, path);
  }
}

void int_accumulators(const PackedInt& p, const int8_t* a, int64_t M, int32_t* acc, Path path) {
  Args A{&p, a, p.lda(), nullptr, nullptr, nullptr, acc};
  if (p.bits == 4) {
    run<true, true>(A, M, path);
  } else {
    run<false, true>(A, M, path);
  }
}

}  // namespace perry::kernels::q::avx2
