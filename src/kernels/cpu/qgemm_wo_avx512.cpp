// AVX-512 BF16 kernels of the weight-only modes (w8a16, w4a16): weights dequantized to bf16 in
// registers (int8 values are exact in bf16), `vdpbf16ps` with bf16 activations, one fp32 partial
// per group of 128 scaled in the epilogue. The GEMV and the GEMM run the same arithmetic in the
// same order, so their outputs are bitwise equal.
// GCC 12 reports its own _mm512_undefined_*() inside the intrinsics as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q::avx512 {

namespace {

// 16 columns × 2 k of int8 (byte 2c+j) -> 32 bf16 in the same order (vdpbf16ps pairs).
inline __m512i deq_pairs(__m128i lo, __m128i hi) {
  const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
  const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
  return (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
}
template <bool INT4>
inline __m512i deq_step(const uint8_t* p) {
  if constexpr (!INT4) {
    return deq_pairs(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return deq_pairs(_mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight),
                     _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight));
  }
}

struct WArgs {
  const PackedWo* p;
  const uint16_t* xb;  // [M][ldx] bf16
  int64_t ldx;
  float* y;
  const float* bias;
};

inline __m512bh bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return (__m512bh)_mm512_set1_epi32(v);
}

inline void store_out(const WArgs& A, int64_t row, int64_t n0, __m512 v) {
  const int64_t cols = std::min<int64_t>(kPanel, A.p->N - n0);
  const __mmask16 mk = __mmask16(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const __m512 b = A.bias ? _mm512_maskz_loadu_ps(mk, A.bias + n0) : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(A.y + row * A.p->N + n0, mk, _mm512_add_ps(v, b));
}

// GEMV: MR rows × NV panels, weights dequantized in registers straight from the packed stream.
template <int MR, int NV, bool INT4>
void tile_direct(const WArgs& A, int64_t m0, int64_t p0) {
  const PackedWo& P = *A.p;
  __m512 fa[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) fa[r][v] = _mm512_setzero_ps();
  const uint8_t* bp = P.data.data() + p0 * P.panel_bytes;
  for (int g = 0; g < P.G; ++g) {
    const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t s = s0; s < s1; ++s) {
      __m512i w[NV];
      for (int v = 0; v < NV; ++v) w[v] = deq_step<INT4>(bp + v * P.panel_bytes + s * P.step_bytes);
      for (int r = 0; r < MR; ++r) {
        const __m512bh a = bcast_pair(A.xb + (m0 + r) * A.ldx + 2 * s);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, (__m512bh)w[v]);
      }
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 sc = _mm512_load_ps(P.scales.data() + ((p0 + v) * P.G + g) * kPanel);
      for (int r = 0; r < MR; ++r) fa[r][v] = _mm512_fmadd_ps(acc[r][v], sc, fa[r][v]);
    }
  }
  for (int v = 0; v < NV; ++v)
    for (int r = 0; r < MR; ++r) store_out(A, m0 + r, (p0 + v) * kPanel, fa[r][v]);
}

// GEMM inner tile: MR rows × NV panels over one group whose weights were dequantized into wb
// ([NV][steps][32] bf16); c ([rows][NV*16] fp32) accumulates the scaled group partials.
template <int MR, int NV>
void tile_buf(const WArgs& A, int64_t m0, int64_t s0, int64_t ns, const uint16_t* wb, int64_t wb_panel,
              const float* sc, float* c, int64_t ldc) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    __m512bh w[NV];
    for (int v = 0; v < NV; ++v) w[v] = (__m512bh)_mm512_load_si512(wb + v * wb_panel + s * 32);
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = bcast_pair(A.xb + (m0 + r) * A.ldx + 2 * (s0 + s));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, w[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kPanel;
      _mm512_store_ps(cp, _mm512_fmadd_ps(acc[r][v], _mm512_load_ps(sc + v * kPanel), _mm512_load_ps(cp)));
    }
}

using DirectFn = void (*)(const WArgs&, int64_t, int64_t);
using BufFn = void (*)(const WArgs&, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const float*, float*,
                       int64_t);
template <int NV, bool INT4, int... R>
constexpr auto make_direct(std::integer_sequence<int, R...>) {
  return std::array<DirectFn, sizeof...(R)>{&tile_direct<R + 1, NV, INT4>...};
}
template <int NV, int... R>
constexpr auto make_buf(std::integer_sequence<int, R...>) {
  return std::array<BufFn, sizeof...(R)>{&tile_buf<R + 1, NV>...};
}

constexpr int kWoMR = 6, kWoNV = 2, kWoGemvNV = 4;
constexpr int64_t kWoMC = 120;

template <bool INT4>
void run(const WArgs& A, int64_t M, Path path) {
  const PackedWo& P = *A.p;
  if (path == Path::Gemv && M <= kGemvMaxRows) {
    static constexpr auto t4 = make_direct<kWoGemvNV, INT4>(std::make_integer_sequence<int, kGemvMaxRows>{});
    static constexpr auto t1 = make_direct<1, INT4>(std::make_integer_sequence<int, kGemvMaxRows>{});
    const int64_t nblk = (P.n_panels + kWoGemvNV - 1) / kWoGemvNV;
    thread_pool().parallel_for(size_t(nblk), 4, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const int64_t p0 = int64_t(b) * kWoGemvNV;
        if (p0 + kWoGemvNV <= P.n_panels) {
          t4[size_t(M - 1)](A, 0, p0);
        } else {
          for (int64_t p = p0; p < P.n_panels; ++p) t1[size_t(M - 1)](A, 0, p);
        }
      }
    });
    return;
  }
  static constexpr auto tn = make_buf<kWoNV>(std::make_integer_sequence<int, kWoMR>{});
  static constexpr auto t1 = make_buf<1>(std::make_integer_sequence<int, kWoMR>{});
  const int64_t nblk = (P.n_panels + kWoNV - 1) / kWoNV;
  thread_pool().parallel_for(size_t(nblk), 1, [&](size_t b0, size_t b1) {
    const int64_t wb_panel = P.group_steps * 32;
    AlignedBuffer<uint16_t> wb(size_t(kWoNV * wb_panel));
    AlignedBuffer<float> c(size_t(kWoMC * kWoNV * kPanel));
    AlignedBuffer<float> sc(size_t(kWoNV * kPanel));
    constexpr int64_t ldc = kWoNV * kPanel;
    for (int64_t mc = 0; mc < M; mc += kWoMC) {
      const int64_t mc1 = std::min(M, mc + kWoMC);
      for (size_t b = b0; b < b1; ++b) {
        const int64_t p0 = int64_t(b) * kWoNV;
        const int nv = int(std::min<int64_t>(kWoNV, P.n_panels - p0));
        std::fill_n(c.data(), c.size(), 0.0f);
        for (int g = 0; g < P.G; ++g) {
          const int64_t s0 = g * P.group_steps, ns = std::min(P.steps, s0 + P.group_steps) - s0;
          for (int v = 0; v < nv; ++v) {
            const uint8_t* src = P.data.data() + (p0 + v) * P.panel_bytes + s0 * P.step_bytes;
            for (int64_t s = 0; s < ns; ++s)
              _mm512_store_si512(wb.data() + v * wb_panel + s * 32, deq_step<INT4>(src + s * P.step_bytes));
            std::copy_n(P.scales.data() + ((p0 + v) * P.G + g) * kPanel, kPanel, sc.data() + v * kPanel);
          }
          for (int64_t m = mc; m < mc1; m += kWoMR) {
            const int rows = int(std::min<int64_t>(kWoMR, mc1 - m));
            float* cm = c.data() + (m - mc) * ldc;
            if (nv == kWoNV) {
              tn[size_t(rows - 1)](A, m, s0, ns, wb.data(), wb_panel, sc.data(), cm, ldc);
            } else {
              t1[size_t(rows - 1)](A, m, s0, ns, wb.data(), wb_panel, sc.data(), cm, ldc);
            }
          }
        }
        for (int64_t m = mc; m < mc1; ++m)
          for (int v = 0; v < nv; ++v)
            store_out(A, m, (p0 + v) * kPanel, _mm512_load_ps(c.data() + (m - mc) * ldc + v * kPanel));
      }
    }
  });
}

}  // namespace

void to_bf16_rows(const float* x, int64_t M, int64_t K, uint16_t* xb, int64_t ldx) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    uint16_t* dst = xb + m * ldx;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xr + k)));
    if (k < K) {
      const __mmask16 mk = __mmask16((1u << (K - k)) - 1);
      _mm256_mask_storeu_epi16(dst + k, mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, xr + k)));
    }
    for (k = K; k < ldx; ++k) dst[k] = 0;
  }
}

void wo_forward(const PackedWo& p, const uint16_t* xb, int64_t M, float* y, const float* bias, Path path) {
  WArgs A{&p, xb, p.ldx(), y, bias};
  if (p.bits == 4) {
    run<true>(A, M, path);
  } else {
    run<false>(A, M, path);
  }
}

}  // namespace perry::kernels::q::avx512
