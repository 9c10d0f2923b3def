// AVX-512 VNNI kernels of the W8A8 / W4A8 modes: per-token activation quantization and the
// u8×s8 `vpdpbusd` GEMM/GEMV on the packed layout described in qgemm.h.
//
// vpdpbusd multiplies unsigned by signed bytes. int8 weights: the activations enter as u8 = q + 128
// and the 128·Σw excess is removed per (column, group) with the packed correction. int4 weights:
// the stored nibbles w+8 in [1, 15] are the unsigned operand as they are, the activations the
// signed one, and the 8·Σq excess is removed per (row, group) with the activation group sums.
// Either way the int32 sums are exact.
// GCC 12 reports its own _mm512_undefined_*() inside the intrinsics as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q::avx512 {

namespace {

inline float hmax_abs(const float* x, int64_t K) {
  __m512 m = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  if (k < K) {
    __mmask16 mk = __mmask16((1u << (K - k)) - 1);
    m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + k)));
  }
  return _mm512_reduce_max_ps(m);
}

// One row: the exact rule of quant::quantize_row_ref, +128, padded with 128 up to ldq.
float quantize_row(const float* x, int64_t K, uint8_t* q, int64_t ldq) {
  const float amax = hmax_abs(x, K);
  float inv = amax > 0 ? 127.0f / amax : 0.0f;
  float scale = amax / 127.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
  if (inv == 0) {
    std::memset(q, 128, size_t(ldq));
    return scale;
  }
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv));  // RNE
    v = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi), off);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(v));
  }
  if (k < K) {
    __mmask16 mk = __mmask16((1u << (K - k)) - 1);
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + k), vinv));
    v = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi), off);
    _mm_mask_storeu_epi8(q + k, mk, _mm512_cvtepi32_epi8(v));
  }
  if (ldq > K) std::memset(q + K, 128, size_t(ldq - K));
  return scale;
}

// One row for the int4 kernels: the same rule as s8 (padded with 0 up to ldq), plus
// gsum8[g] = 8·Σ q over each group of group_len (a multiple of 16 when G > 1, so no vector
// straddles two groups).
float quantize_row_s8(const float* x, int64_t K, int8_t* q, int64_t ldq, int64_t group_len, int G, int32_t* gsum8) {
  const float amax = hmax_abs(x, K);
  float inv = amax > 0 ? 127.0f / amax : 0.0f;
  float scale = amax / 127.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
  std::memset(q, 0, size_t(ldq));
  std::fill_n(gsum8, G, 0);
  if (inv == 0) return scale;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int g = 0; g < G; ++g) {
    const int64_t k0 = g * group_len, k1 = std::min(K, k0 + group_len);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 16) {
      const __mmask16 mk = __mmask16(k + 16 <= k1 ? 0xFFFF : (1u << (k1 - k)) - 1);
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + k), vinv));  // RNE
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      sum = _mm512_add_epi32(sum, v);
      _mm_mask_storeu_epi8(q + k, mk, _mm512_cvtepi32_epi8(v));
    }
    gsum8[g] = 8 * _mm512_reduce_add_epi32(sum);
  }
  return scale;
}

inline __m512i bcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The first row tile of a panel group would pull its weights from DRAM at the VNNI rate
// (~37 GB/s per core), which the hardware prefetcher cannot sustain: with B larger than the
// L3 share the GEMM ran at half speed (lab: N=4096 vs N=1024). So while one panel group is
// computed, each row tile prefetches a slice of the next group into L2.
inline void prefetch_l2(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T1);
}

// Tile shapes (data, not branches): GEMM uses MR×NV register tiles, GEMV all rows × 1 panel.
constexpr int kGemmMR = 6, kGemmNV = 2;
constexpr int64_t kGemmMC = 120;  // rows per cache block (A block stays in L2)

struct Args {
  const PackedInt* p;
  const uint8_t* a;  // [M][lda]: u8 q+128 (int8 weights) or s8 q (int4 weights)
  const int32_t* act_corr;  // int4 weights: [M][G] 8·Σq per group
  int64_t lda;
  const float* sa;
  float* y;
  const float* bias;
  int32_t* acc;  // test hook output [M][N][G], or null
};

// Register tile: MR rows × NV panels (16 columns each), all of K, group by group.
template <int MR, int NV, bool INT4, bool HOOK>
void tile(const Args& A, int64_t m0, int64_t p0) {
  const PackedInt& P = *A.p;
  const int G = P.G;
  __m512 fa[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) fa[r][v] = _mm512_setzero_ps();
  const uint8_t* arow[MR];
  for (int r = 0; r < MR; ++r) arow[r] = A.a + (m0 + r) * A.lda;
  const uint8_t* bp = P.data.data() + p0 * P.panel_bytes;
  for (int g = 0; g < G; ++g) {
    const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
    __m512i acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
    if constexpr (!INT4) {
      for (int64_t s = s0; s < s1; ++s) {
        __m512i b[NV];
        for (int v = 0; v < NV; ++v) b[v] = _mm512_load_si512(bp + v * P.panel_bytes + s * 64);
        for (int r = 0; r < MR; ++r) {
          const __m512i av = bcast32(arow[r] + 4 * s);
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, b[v]);
        }
      }
    } else {
      // Nibbles stay w+8 (u8, vpdpbusd's first operand); the activations are s8. Small tiles (the
      // GEMV) put the high nibbles in a second accumulator: two dependent vpdpbusd per 64 bytes
      // capped one core at ~22 GB/s, which the VM's high-bandwidth phases reach.
      constexpr bool kTwoChains = MR * NV < 4;
      __m512i acc_hi[MR][NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc_hi[r][v] = _mm512_setzero_si512();
      const __m512i mask = _mm512_set1_epi8(0x0F);
      for (int64_t s = s0; s < s1; s += 2) {
        __m512i b0[NV], b1[NV];
        for (int v = 0; v < NV; ++v) {
          const __m512i raw = _mm512_load_si512(bp + v * P.panel_bytes + (s / 2) * 64);
          b0[v] = _mm512_and_si512(raw, mask);
          b1[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
        }
        for (int r = 0; r < MR; ++r) {
          const __m512i a0 = bcast32(arow[r] + 4 * s), a1 = bcast32(arow[r] + 4 * s + 4);
          for (int v = 0; v < NV; ++v) {
            acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], b0[v], a0);
            if constexpr (kTwoChains) acc_hi[r][v] = _mm512_dpbusd_epi32(acc_hi[r][v], b1[v], a1);
            else acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], b1[v], a1);
          }
        }
      }
      if constexpr (kTwoChains)
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_add_epi32(acc[r][v], acc_hi[r][v]);
    }
    for (int v = 0; v < NV; ++v) {
      const int64_t pg = ((p0 + v) * G + g) * kPanel;
      const __m512 sw = _mm512_load_ps(P.scales.data() + pg);
      for (int r = 0; r < MR; ++r) {
        const __m512i corr = INT4 ? _mm512_set1_epi32(A.act_corr[(m0 + r) * G + g])
                                  : _mm512_load_si512(P.wsum128.data() + pg);
        const __m512i x = _mm512_sub_epi32(acc[r][v], corr);
        if constexpr (HOOK) {
          alignas(64) int32_t tmp[kPanel];
          _mm512_store_si512(tmp, x);
          for (int c = 0; c < kPanel; ++c) {
            const int64_t n = (p0 + v) * kPanel + c;
            if (n < P.N) A.acc[((m0 + r) * P.N + n) * G + g] = tmp[c];
          }
        } else {
          fa[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), sw, fa[r][v]);
        }
      }
    }
  }
  if constexpr (!HOOK) {
    for (int v = 0; v < NV; ++v) {
      const int64_t n0 = (p0 + v) * kPanel;
      const int64_t cols = std::min<int64_t>(kPanel, P.N - n0);
      const __mmask16 mk = __mmask16(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
      const __m512 b = A.bias ? _mm512_maskz_loadu_ps(mk, A.bias + n0) : _mm512_setzero_ps();
      for (int r = 0; r < MR; ++r)
        _mm512_mask_storeu_ps(A.y + (m0 + r) * P.N + n0, mk,
                              _mm512_fmadd_ps(fa[r][v], _mm512_set1_ps(A.sa[m0 + r]), b));
    }
  }
}

using TileFn = void (*)(const Args&, int64_t, int64_t);

template <int NV, bool INT4, bool HOOK, int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&tile<R + 1, NV, INT4, HOOK>...};
}


// GEMV work is split in chunks of ~128 KiB of weights (parallel_for_balanced: each thread streams
// its own range in memory order and helps with the others' tails). In the model the static halves
// left the caller waiting ~3% of a decode step for the other thread.
size_t gemv_chunk(const PackedInt& P) { return size_t(std::max<int64_t>(1, (int64_t(128) << 10) / P.panel_bytes)); }

template <bool INT4, bool HOOK>
void run(const Args& A, int64_t M, Path path) {
  const PackedInt& P = *A.p;
  if (path == Path::Gemv && M <= kGemvMaxRows) {
    // One panel at a time, panels in memory order: each thread reads one sequential stream, which
    // the hardware prefetcher follows at full speed. (Four interleaved panel streams per thread —
    // the GEMM's layout of work — reached only 64% / 50% of the bandwidth bound for int8 / int4;
    // A/B on llama3.2-1b decode, quiet VM: w4a8-g128 48.7 / 53.7 vs 39.1 / 40.6 tok/s, w8a8 26.8 /
    // 26.3 vs 26.3 / 23.3.)
    static constexpr auto t1 = make_tiles<1, INT4, HOOK>(std::make_integer_sequence<int, kGemvMaxRows>{});
    thread_pool().parallel_for_balanced(size_t(P.n_panels), gemv_chunk(P), [&](size_t p0, size_t p1) {
      for (size_t p = p0; p < p1; ++p) t1[size_t(M - 1)](A, 0, int64_t(p));
    });
    return;
  }
  static constexpr auto tn = make_tiles<kGemmNV, INT4, HOOK>(std::make_integer_sequence<int, kGemmMR>{});
  static constexpr auto t1 = make_tiles<1, INT4, HOOK>(std::make_integer_sequence<int, kGemmMR>{});
  const int64_t nblk = (P.n_panels + kGemmNV - 1) / kGemmNV;
  thread_pool().parallel_for(size_t(nblk), 1, [&](size_t b0, size_t b1) {
    // Row blocks of at most kGemmMC rows, balanced (130 rows -> 66 + 64, not 120 + 10).
    const int64_t nmc = (M + kGemmMC - 1) / kGemmMC;
    const int64_t mcs = ((M + nmc - 1) / nmc + kGemmMR - 1) / kGemmMR * kGemmMR;
    for (int64_t mc = 0; mc < M; mc += mcs) {
      const int64_t mc1 = std::min(M, mc + mcs);
      for (size_t b = b0; b < b1; ++b) {
        const int64_t p0 = int64_t(b) * kGemmNV;
        const bool full = p0 + kGemmNV <= P.n_panels;
        const int64_t next = p0 + kGemmNV < P.n_panels ? p0 + kGemmNV : int64_t(b0) * kGemmNV;
        const int64_t next_bytes = std::min<int64_t>(kGemmNV, P.n_panels - next) * P.panel_bytes;
        const int64_t ntiles = (mc1 - mc + kGemmMR - 1) / kGemmMR;
        const int64_t slice = (next_bytes / ntiles + 63) / 64 * 64;
        for (int64_t m = mc; m < mc1; m += kGemmMR) {
          const int64_t off = (m - mc) / kGemmMR * slice;
          if (off < next_bytes)
            prefetch_l2(P.data.data() + next * P.panel_bytes + off, std::min(slice, next_bytes - off));
          const int rows = int(std::min<int64_t>(kGemmMR, mc1 - m));
          if (full) {
            tn[size_t(rows - 1)](A, m, p0);
          } else {
            for (int64_t p = p0; p < P.n_panels; ++p) t1[size_t(rows - 1)](A, m, p);
          }
        }
      }
    }
  });
}

}  // namespace

void quantize_rows_u8(const float* x, int64_t M, int64_t K, uint8_t* q, int64_t ldq, float* scales) {
  auto body = [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m) scales[m] = quantize_row(x + int64_t(m) * K, K, q + int64_t(m) * ldq, ldq);
  };
  if (M * K < (int64_t(1) << 16)) {
    body(0, size_t(M));
  } else {
    thread_pool().parallel_for(size_t(M), 1, body);
  }
}

void quantize_rows_s8(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* scales,
                      int64_t group_len, int G, int32_t* gsum8) {
  PERRY_CHECK((G == 1 || group_len % 16 == 0) && G >= 1 && G * group_len >= K, "quantize_rows_s8: group length {} x {} groups for K={}",
              group_len, G, K);
  auto body = [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m)
      scales[m] = quantize_row_s8(x + int64_t(m) * K, K, q + int64_t(m) * ldq, ldq, group_len, G, gsum8 + int64_t(m) * G);
  };
  if (M * K < (int64_t(1) << 16)) {
    body(0, size_t(M));
  } else {
    thread_pool().parallel_for(size_t(M), 1, body);
  }
}

void quantize_activations(const PackedInt& p, const float* x, int64_t M, const ActBuffers& out) {
  if (p.bits == 4) {
    quantize_rows_s8(x, M, p.K, reinterpret_cast<int8_t*>(out.a), p.lda(), out.sa, p.group_steps * 4, p.G,
                     out.act_corr);
  } else {
    quantize_rows_u8(x, M, p.K, out.a, p.lda(), out.sa);
  }
}

void int_forward(const PackedInt& p, const uint8_t* a, const int32_t* act_corr, int64_t M, const float* sa, float* y,
                 const float* bias, Path path) {
  PERRY_CHECK(p.bits != 4 || act_corr, "int_forward: int4 weights need the activation group sums");
  Args A{&p, a, act_corr, p.lda(), sa, y, bias, nullptr};
  if (p.bits == 4) {
    run<true, false>(A, M, path);
  } else {
    run<false, false>(A, M, path);
  }
}

void int_forward_many(const PackedInt* const* p, int n, const uint8_t* a, const int32_t* act_corr, int64_t M,
                      const float* sa, float* const* y, const float* const* bias, Path path) {
  PERRY_CHECK(n >= 1, "int_forward_many: no layers");
  for (int i = 1; i < n; ++i)
    PERRY_CHECK(p[i]->bits == p[0]->bits && p[i]->G == p[0]->G && p[i]->K == p[0]->K &&
                    p[i]->group_steps == p[0]->group_steps,
                "int_forward_many: layer {} differs from layer 0 in bits/groups/K", i);
  PERRY_CHECK(p[0]->bits != 4 || act_corr, "int_forward_many: int4 weights need the activation group sums");
  if (path != Path::Gemv || M > kGemvMaxRows || n == 1) {
    for (int i = 0; i < n; ++i) int_forward(*p[i], a, act_corr, M, sa, y[i], bias ? bias[i] : nullptr, path);
    return;
  }
  constexpr int kMaxLayers = 4;
  PERRY_CHECK(n <= kMaxLayers, "int_forward_many: at most {} layers", kMaxLayers);
  Args args[kMaxLayers];
  int64_t first[kMaxLayers + 1] = {0};  // panel index where layer i starts in the concatenation
  for (int i = 0; i < n; ++i) {
    args[i] = Args{p[i], a, act_corr, p[i]->lda(), sa, y[i], bias ? bias[i] : nullptr, nullptr};
    first[i + 1] = first[i] + p[i]->n_panels;
  }
  const bool int4 = p[0]->bits == 4;
  static constexpr auto t4 = make_tiles<1, true, false>(std::make_integer_sequence<int, kGemvMaxRows>{});
  static constexpr auto t8 = make_tiles<1, false, false>(std::make_integer_sequence<int, kGemvMaxRows>{});
  const TileFn tile1 = (int4 ? t4 : t8)[size_t(M - 1)];
  // Each thread takes a contiguous range of the concatenated panels: still one sequential stream
  // per layer it touches, in memory order.
  thread_pool().parallel_for_balanced(size_t(first[n]), gemv_chunk(*p[0]), [&](size_t b, size_t e) {
    int i = 0;
    for (size_t q = b; q < e; ++q) {
      while (int64_t(q) >= first[i + 1]) ++i;
      tile1(args[i], 0, int64_t(q) - first[i]);
    }
  });
}

uint64_t stream_read(const uint8_t* p, int64_t bytes) {
  __m512i x0 = _mm512_setzero_si512(), x1 = x0, x2 = x0, x3 = x0;
  int64_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    x0 = _mm512_xor_si512(x0, _mm512_load_si512(p + i));
    x1 = _mm512_xor_si512(x1, _mm512_load_si512(p + i + 64));
    x2 = _mm512_xor_si512(x2, _mm512_load_si512(p + i + 128));
    x3 = _mm512_xor_si512(x3, _mm512_load_si512(p + i + 192));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(x0, x1), _mm512_xor_si512(x2, x3));
  return uint64_t(_mm512_reduce_add_epi64(x));
}

void int_accumulators(const PackedInt& p, const uint8_t* a, const int32_t* act_corr, int64_t M, int32_t* acc,
                      Path path) {
  PERRY_CHECK(p.bits != 4 || act_corr, "int_accumulators: int4 weights need the activation group sums");
  Args A{&p, a, act_corr, p.lda(), nullptr, nullptr, nullptr, acc};
  if (p.bits == 4) {
    run<true, true>(A, M, path);
  } else {
    run<false, true>(A, M, path);
  }
}

}  // namespace perry::kernels::q::avx512
