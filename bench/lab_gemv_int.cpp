// Kernel lab for the W8A8 / W4A8 decode GEMV (M = 1): the library kernel, numbered variants and a
// plain 2-thread read of the same bytes, interleaved call by call with the weights rotated through
// >= 512 MiB so every call streams from DRAM. Each variant's output is checked against the
// library's float result (and the int32 group sums against the scalar reference).
//
//   lib  the library GEMV (src/kernels/cpu/qgemm_avx512.cpp), one panel at a time in memory order
//   v0   int4 as the library had it before v1: u8 activations (q+128), nibbles unpacked to s8
//        (and, shift, "-8"), per-group correction 128·Σw read per column (a third stream)
//   v1   int4 with the operands swapped: weights as u8 nibbles (w+8, as stored: no "-8" per
//        byte), activations as s8; the correction 8·Σq per group comes from the activations,
//        so no per-column correction is read. Now the library kernel.
//   v2   v1 with two accumulator chains (low / high nibble), summed per group
//   v3   int8 lib with two accumulator chains (even / odd steps)
//   v4   dynamic split: chunks of 4 (int8) / 8 (int4) panels (128 KiB at K = 2048) claimed from
//        an atomic counter instead of one contiguous half per thread
//   v5   v4 with chunks of 16 / 32 panels (512 KiB)
//   v6   int4: v2 split by ThreadPool::parallel_for_balanced, 8 panels per claim (the library's
//        scheme since 6331487 + the two chains)
//   v7   v6 with 64 panels per claim
//
// In a high-bandwidth phase of the VM (read 55-64 GB/s, 19:10 UTC) the int4 variants with two
// chains (v2, v6) ran 1-10% above the one-chain ones (v1) in most rows: at ~45 GB/s a single
// chain of two dependent vpdpbusd per 64 bytes becomes the limit, so the library took the two
// chains for its small (GEMV) tiles. Rows move by +-20% between repeats in such phases.
//
// Measured (2 threads, loadavg ~1): int8 lib = read speed (36-37 GB/s); int4 v0 27-34 GB/s,
// v1 34-37 GB/s (= read), v2 = v1 (the vpdpbusd chain is not the limit), v3 = lib.
//
// Usage: lab_gemv_int [--quick]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lab_util.h"
#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"

namespace kq = perry::kernels::q;
namespace pq = perry::quant;
using perry::thread_pool;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

kq::PackedInt clone(const kq::PackedInt& p) {
  kq::PackedInt c;
  c.N = p.N; c.K = p.K; c.bits = p.bits; c.G = p.G; c.steps = p.steps; c.group_steps = p.group_steps;
  c.n_panels = p.n_panels; c.panel_bytes = p.panel_bytes;
  c.data.resize(p.data.size());
  std::memcpy(c.data.data(), p.data.data(), p.data.size());
  c.scales.resize(p.scales.size());
  std::memcpy(c.scales.data(), p.scales.data(), p.scales.size() * 4);
  c.wsum128.resize(p.wsum128.size());
  std::memcpy(c.wsum128.data(), p.wsum128.data(), p.wsum128.size() * 4);
  return c;
}


inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Activations for v1/v2: s8 rows (padded with 0) and 8·Σq per group.
struct ActS8 {
  std::vector<int8_t> q;
  std::vector<int32_t> gsum8;
  float sa = 0;
};
ActS8 quantize_s8(const float* x, const kq::PackedInt& p) {
  ActS8 a;
  a.q.assign(size_t(p.lda()), 0);
  a.sa = pq::quantize_row_ref(x, p.K, a.q.data());
  a.gsum8.assign(size_t(p.G), 0);
  const int64_t gl = p.group_steps * 4;
  for (int64_t k = 0; k < p.K; ++k) a.gsum8[size_t(k / gl)] += 8 * a.q[size_t(k)];
  return a;
}

// Splits the panels over the pool: chunk == 0 statically (one contiguous range per thread, the
// library's split); chunk > 0 dynamically, `chunk` panels at a time claimed from an atomic counter
// (a preempted or late thread leaves its share to the others).
void for_panels(int64_t n_panels, int64_t chunk, const std::function<void(size_t, size_t)>& fn) {
  if (chunk < 0) {  // ThreadPool::parallel_for_balanced with -chunk panels per claim
    thread_pool().parallel_for_balanced(size_t(n_panels), size_t(-chunk), fn);
    return;
  }
  if (chunk == 0) {
    thread_pool().parallel_for(size_t(n_panels), 16, fn);
    return;
  }
  std::atomic<int64_t> next{0};
  thread_pool().run_on_all([&](int, int) {
    for (;;) {
      const int64_t b = next.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n_panels) return;
      fn(size_t(b), size_t(std::min(n_panels, b + chunk)));
    }
  });
}

// v0: activations u8 = q+128, corr[panel][G][16] = 128·Σw per group.
void gemv_int4_v0(const kq::PackedInt& P, const uint8_t* a, const int32_t* corr, float sa, float* y) {
  thread_pool().parallel_for(size_t(P.n_panels), 16, [&](size_t p0, size_t p1) {
    const __m512i mask = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    for (size_t p = p0; p < p1; ++p) {
      const uint8_t* bp = P.data.data() + int64_t(p) * P.panel_bytes;
      __m512 f = _mm512_setzero_ps();
      for (int g = 0; g < P.G; ++g) {
        const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
        __m512i acc = _mm512_setzero_si512();
        for (int64_t s = s0; s < s1; s += 2) {
          const __m512i raw = _mm512_load_si512(bp + (s / 2) * 64);
          const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(raw, mask), eight);
          const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(raw, 4), mask), eight);
          acc = _mm512_dpbusd_epi32(acc, bcast32(a + 4 * s), lo);
          acc = _mm512_dpbusd_epi32(acc, bcast32(a + 4 * s + 4), hi);
        }
        const int64_t pg = (int64_t(p) * P.G + g) * kq::kPanel;
        acc = _mm512_sub_epi32(acc, _mm512_loadu_si512(corr + pg));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_load_ps(P.scales.data() + pg), f);
      }
      const int64_t n0 = int64_t(p) * kq::kPanel, cols = std::min<int64_t>(kq::kPanel, P.N - n0);
      _mm512_mask_storeu_ps(y + n0, __mmask16(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
                            _mm512_mul_ps(f, _mm512_set1_ps(sa)));
    }
  });
}

template <bool TWO_CHAINS>
void gemv_int4_swapped(const kq::PackedInt& P, const ActS8& A, float* y, int64_t chunk = 0) {
  for_panels(P.n_panels, chunk, [&](size_t p0, size_t p1) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (size_t p = p0; p < p1; ++p) {
      const uint8_t* bp = P.data.data() + int64_t(p) * P.panel_bytes;
      __m512 f = _mm512_setzero_ps();
      for (int g = 0; g < P.G; ++g) {
        const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
        __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
        for (int64_t s = s0; s < s1; s += 2) {
          const __m512i raw = _mm512_load_si512(bp + (s / 2) * 64);
          const __m512i lo = _mm512_and_si512(raw, mask);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
          acc0 = _mm512_dpbusd_epi32(acc0, lo, bcast32(A.q.data() + 4 * s));
          if constexpr (TWO_CHAINS) acc1 = _mm512_dpbusd_epi32(acc1, hi, bcast32(A.q.data() + 4 * s + 4));
          else acc0 = _mm512_dpbusd_epi32(acc0, hi, bcast32(A.q.data() + 4 * s + 4));
        }
        const __m512i acc = _mm512_sub_epi32(_mm512_add_epi32(acc0, acc1), _mm512_set1_epi32(A.gsum8[size_t(g)]));
        const __m512 sw = _mm512_load_ps(P.scales.data() + (int64_t(p) * P.G + g) * kq::kPanel);
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sw, f);
      }
      const int64_t n0 = int64_t(p) * kq::kPanel, cols = std::min<int64_t>(kq::kPanel, P.N - n0);
      _mm512_mask_storeu_ps(y + n0, __mmask16(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
                            _mm512_mul_ps(f, _mm512_set1_ps(A.sa)));
    }
  });
}

template <bool TWO_CHAINS>
void gemv_int8(const kq::PackedInt& P, const uint8_t* a, float sa, float* y, int64_t chunk = 0) {
  for_panels(P.n_panels, chunk, [&](size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; ++p) {
      const uint8_t* bp = P.data.data() + int64_t(p) * P.panel_bytes;
      __m512 f = _mm512_setzero_ps();
      for (int g = 0; g < P.G; ++g) {
        const int64_t s0 = g * P.group_steps, s1 = std::min(P.steps, s0 + P.group_steps);
        __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
        int64_t s = s0;
        for (; s + 2 <= s1; s += 2) {
          acc0 = _mm512_dpbusd_epi32(acc0, bcast32(a + 4 * s), _mm512_load_si512(bp + s * 64));
          if constexpr (TWO_CHAINS)
            acc1 = _mm512_dpbusd_epi32(acc1, bcast32(a + 4 * s + 4), _mm512_load_si512(bp + s * 64 + 64));
          else
            acc0 = _mm512_dpbusd_epi32(acc0, bcast32(a + 4 * s + 4), _mm512_load_si512(bp + s * 64 + 64));
        }
        if (s < s1) acc0 = _mm512_dpbusd_epi32(acc0, bcast32(a + 4 * s), _mm512_load_si512(bp + s * 64));
        const int64_t pg = (int64_t(p) * P.G + g) * kq::kPanel;
        const __m512i acc = _mm512_sub_epi32(_mm512_add_epi32(acc0, acc1), _mm512_load_si512(P.wsum128.data() + pg));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_load_ps(P.scales.data() + pg), f);
      }
      const int64_t n0 = int64_t(p) * kq::kPanel, cols = std::min<int64_t>(kq::kPanel, P.N - n0);
      _mm512_mask_storeu_ps(y + n0, __mmask16(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
                            _mm512_mul_ps(f, _mm512_set1_ps(sa)));
    }
  });
}


struct Shape {
  const char* name;
  int64_t N, K;
};

void run_shape(const Shape& s, pq::QuantMode mode, int calls) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> w(size_t(s.N * s.K)), x(size_t(s.K));
  for (auto& v : w) v = d(rng) * 0.02f;
  for (auto& v : x) v = d(rng);
  const pq::QuantizedWeight qw = pq::quantize_weight(w.data(), s.N, s.K, mode);
  const kq::PackedInt p0 = kq::pack_int(qw);
  const size_t bytes = p0.data.size() + p0.scales.size() * 4 + p0.wsum128.size() * 4;
  // v0's per-column correction, laid out like the packed scales (128·Σw per group).
  std::vector<int32_t> corr(p0.scales.size(), 0);
  const int64_t gl = p0.group_steps * 4;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      corr[size_t((n / kq::kPanel * p0.G + k / gl) * kq::kPanel + n % kq::kPanel)] += 128 * qw.weight(n, k);
  const size_t copies = std::max<size_t>(2, (size_t(512) << 20) / bytes + 1);
  std::vector<kq::PackedInt> ps;
  for (size_t c = 0; c < copies; ++c) ps.push_back(clone(p0));
  // A flat buffer of the same total size for the read probe.
  const size_t rbytes = (bytes * copies + 4095) / 4096 * 4096;
  auto* rb = static_cast<uint8_t*>(std::aligned_alloc(size_t(2) << 20, (rbytes + (2 << 20)) / (2 << 20) * (2 << 20)));
  madvise(rb, rbytes, MADV_HUGEPAGE);
  std::memset(rb, 1, rbytes);

  std::vector<uint8_t> au(size_t(p0.lda()));
  float sa = 0;
  kq::avx512::quantize_rows_u8(x.data(), 1, s.K, au.data(), p0.lda(), &sa);
  const ActS8 as8 = quantize_s8(x.data(), p0);
  std::vector<float> y_lib(size_t(s.N)), y(size_t(s.N));
  const int32_t* act_corr = p0.bits == 4 ? as8.gsum8.data() : nullptr;
  const uint8_t* a_lib = p0.bits == 4 ? reinterpret_cast<const uint8_t*>(as8.q.data()) : au.data();
  kq::avx512::int_forward(p0, a_lib, act_corr, 1, &sa, y_lib.data(), nullptr, kq::Path::Gemv);

  struct Variant {
    const char* name;
    std::function<void(const kq::PackedInt&, float*)> fn;
  };
  std::vector<Variant> vs;
  vs.push_back({"lib", [&](const kq::PackedInt& p, float* out) {
                  kq::avx512::int_forward(p, a_lib, act_corr, 1, &sa, out, nullptr, kq::Path::Gemv);
                }});
  if (p0.bits == 4) {
    vs.push_back({"v0", [&](const kq::PackedInt& p, float* out) { gemv_int4_v0(p, au.data(), corr.data(), sa, out); }});
    vs.push_back({"v1", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<false>(p, as8, out); }});
    vs.push_back({"v2", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<true>(p, as8, out); }});
    vs.push_back({"v4", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<false>(p, as8, out, 8); }});
    vs.push_back({"v6", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<true>(p, as8, out, -8); }});
    vs.push_back({"v7", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<true>(p, as8, out, -64); }});
    vs.push_back({"v5", [&](const kq::PackedInt& p, float* out) { gemv_int4_swapped<false>(p, as8, out, 32); }});
  } else {
    vs.push_back({"v3", [&](const kq::PackedInt& p, float* out) { gemv_int8<true>(p, au.data(), sa, out); }});
    vs.push_back({"v4", [&](const kq::PackedInt& p, float* out) { gemv_int8<false>(p, au.data(), sa, out, 4); }});
    vs.push_back({"v5", [&](const kq::PackedInt& p, float* out) { gemv_int8<false>(p, au.data(), sa, out, 16); }});
  }
  for (auto& v : vs) {
    std::fill(y.begin(), y.end(), 0.0f);
    v.fn(p0, y.data());
    const double e = perry::lab::max_rel_diff(y, y_lib);
    if (e > 1e-5) std::printf("  %s: MISMATCH vs lib, max rel %.3g\n", v.name, e);
  }
  std::vector<std::vector<double>> t(vs.size() + 1);
  volatile uint64_t sink = 0;
  for (int i = 0; i < calls + 2; ++i) {
    const size_t c = size_t(i) % copies;
    for (size_t j = 0; j < vs.size(); ++j) {
      const double t0 = now();
      vs[j].fn(ps[(c + j * copies / (vs.size() + 1)) % copies], y.data());
      if (i >= 2) t[j].push_back(now() - t0);
    }
    const size_t off = ((c * bytes) % (rbytes - bytes)) / 4096 * 4096;
    const double t0 = now();
    thread_pool().run_on_all([&](int ti, int nt) {
      const size_t b = bytes / 256 * size_t(ti) / size_t(nt) * 256, e = bytes / 256 * size_t(ti + 1) / size_t(nt) * 256;
      sink = sink + perry::lab::read_range(rb + off, b, e);
    });
    if (i >= 2) t[vs.size()].push_back(now() - t0);
  }
  std::printf("%-22s %-10s %8.1f MB |", s.name, std::string(pq::quant_mode_name(mode)).c_str(), double(bytes) / 1e6);
  for (size_t j = 0; j <= vs.size(); ++j) {
    std::sort(t[j].begin(), t[j].end());
    const double med = t[j][t[j].size() / 2];
    std::printf(" %s %6.1f GB/s |", j < vs.size() ? vs[j].name : "read", double(bytes) / med / 1e9);
  }
  std::printf("\n");
  std::fflush(stdout);
  std::free(rb);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  double la[3] = {0, 0, 0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
    std::fclose(f);
  }
  std::printf("# lab_gemv_int: %d threads, loadavg %.2f %.2f %.2f; medians of interleaved calls\n",
              thread_pool().size(), la[0], la[1], la[2]);
  const Shape shapes[] = {{"gate/up 8192x2048", 8192, 2048}, {"down 2048x8192", 2048, 8192},
                          {"q/o 2048x2048", 2048, 2048}, {"lm_head 128256x2048", 128256, 2048}};
  for (pq::QuantMode m : {pq::QuantMode::W8A8, pq::QuantMode::W4A8_G128}) {
    for (const Shape& s : shapes) {
      if (quick && s.N > 10000) continue;
      run_shape(s, m, quick ? 20 : 60);
    }
  }
  return 0;
}
