// AVX2 fallback of the weight-only kernels (w8a16, w4a16) for CPUs without AVX-512 BF16: the
// packed weight-only layout dequantized in registers to fp32, FMA against the bf16-rounded
// activations, one fp32 partial per group of 128 scaled in the epilogue (same math as the
// AVX-512 kernel, fp32 products instead of vdpbf16ps pairs).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q::avx2 {

namespace {

// One step (2 k) of 8 columns starting at column c0 -> w[k0] and w[k1] as fp32.
template <bool INT4>
inline void deq(const uint8_t* step, int c0, __m256& w0, __m256& w1) {
  if constexpr (!INT4) {
    // bytes 2c, 2c+1 -> one int32 lane holding (w[k0] | w[k1] << 16) as int16s.
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 2 * c0)));
    w0 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16));
    w1 = _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 16));
  } else {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(step + c0)));
    const __m256i eight = _mm256_set1_epi32(8);
    w0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xF)), eight));
    w1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight));
  }
}

struct WArgs {
  const PackedWo* p;
  const float* x;  // [M][ldx] bf16-rounded activations as fp32, zero-padded
  int64_t ldx;
  float* y;
  const float* bias;
};

template <int MR, bool INT4>
void tile(const WArgs& A, int64_t m0, int64_t pn) {
  const PackedWo& P = *A.p;
  __m256 fa[MR][2];
  for (int r = 0; r < MR; ++r) fa[r][0] = fa[r][1] = _mm256_setzero_ps();
  const uint8_t* bp = P.data.data() + pn * P.panel_bytes;
  for (int g = 0; g < P.G; ++g) {
    const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
    __m256 acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t s = s0; s < s1; ++s) {
      __m256 w0[2], w1[2];
      deq<INT4>(bp + s * P.step_bytes, 0, w0[0], w1[0]);
      deq<INT4>(bp + s * P.step_bytes, 8, w0[1], w1[1]);
      for (int r = 0; r < MR; ++r) {
        const float* xr = A.x + (m0 + r) * A.ldx + 2 * s;
        const __m256 x0 = _mm256_broadcast_ss(xr), x1 = _mm256_broadcast_ss(xr + 1);
        for (int h = 0; h < 2; ++h) acc[r][h] = _mm256_fmadd_ps(x1, w1[h], _mm256_fmadd_ps(x0, w0[h], acc[r][h]));
      }
    }
    const float* sc = P.scales.data() + (pn * P.G + g) * kPanel;
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_load_ps(sc + 8 * h);
      for (int r = 0; r < MR; ++r) fa[r][h] = _mm256_fmadd_ps(acc[r][h], s, fa[r][h]);
    }
  }
  const int64_t n0 = pn * kPanel;
  const int64_t cols = std::min<int64_t>(kPanel, P.N - n0);
  alignas(32) float bias[kPanel] = {}, out[kPanel];
  if (A.bias) std::copy_n(A.bias + n0, cols, bias);
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(out, _mm256_add_ps(fa[r][0], _mm256_load_ps(bias)));
    _mm256_store_ps(out + 8, _mm256_add_ps(fa[r][1], _mm256_load_ps(bias + 8)));
    std::copy_n(out, cols, A.y + (m0 + r) * P.N + n0);
  }
}

using TileFn = void (*)(const WArgs&, int64_t, int64_t);
template <bool INT4, int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&tile<R + 1, INT4>...};
}
constexpr int kMR = 4;

template <bool INT4>
void run(const WArgs& A, int64_t M) {
  static constexpr auto t = make_tiles<INT4>(std::make_integer_sequence<int, kMR>{});
  thread_pool().parallel_for(size_t(A.p->n_panels), 4, [&](size_t b0, size_t b1) {
    for (size_t pn = b0; pn < b1; ++pn)
      for (int64_t m = 0; m < M; m += kMR) t[size_t(std::min<int64_t>(kMR, M - m) - 1)](A, m, int64_t(pn));
  });
}

}  // namespace

void wo_forward(const PackedWo& p, const float* xbf, int64_t M, float* y, const float* bias) {
  WArgs A{&p, xbf, p.ldx(), y, bias};
  if (p.bits == 4) {
    run<true>(A, M);
  } else {
    run<false>(A, M);
  }
}

}  // namespace perry::kernels::q::avx2
