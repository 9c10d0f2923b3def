// Kernel lab for the W8A8 GEMM (llm.c dev/ style): the scalar reference, numbered variants, a
// correctness check of each against the reference int32 accumulators, and a timing sweep, so the
// record of what each step bought stays runnable. The winner lives in src/kernels/cpu/qgemm_avx512.cpp.
//
//   v0  scalar reference (int32 loops on the canonical [N,K] weight)
//   v1  AVX-512 VNNI dot per (m, n) on the row-major weight, horizontal sum per output
//   v2  packed VNNI layout (16 columns × 4 k per zmm), 1 row × 1 panel register tile
//   v3  library kernel (6 rows × 2 panels tile, MC blocking), 1 thread
//   v4  library kernel, all threads
//   v5  v4 + the online activation quantization (what QuantizedLinear::forward costs)
//
// Usage: lab_gemm_w8a8 [M N K] [repeats]   (default 128 4096 4096, 5)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"

namespace kq = perry::kernels::q;
namespace pq = perry::quant;

// Best of `reps`. With LAB_CPU_TIME set, single-thread variants are timed in thread CPU time,
// which excludes the time other processes held the core (the shared dev VM is often overloaded).
static bool g_cpu_time = std::getenv("LAB_CPU_TIME") != nullptr;
static double now(bool cpu) {
  timespec ts;
  clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
static double best_of(int reps, const std::function<void()>& f, bool single_thread = true) {
  f();
  const bool cpu = g_cpu_time && single_thread;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now(cpu);
    f();
    best = std::min(best, now(cpu) - t0);
  }
  return best;
}

// v1: row-major weights, one dot product per output.
static void v1_naive(const pq::QuantizedWeight& w, const uint8_t* a, int64_t lda, const int32_t* wsum128, int64_t M,
                     int32_t* out) {
  const int64_t K = w.K;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      const int8_t* wr = w.qweight.data() + n * K;
      __m512i acc = _mm512_setzero_si512();
      int64_t k = 0;
      for (; k + 64 <= K; k += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(a + m * lda + k), _mm512_loadu_si512(wr + k));
      int32_t s = _mm512_reduce_add_epi32(acc);
      for (; k < K; ++k) s += int32_t(a[m * lda + k]) * wr[k];
      out[m * w.N + n] = s - wsum128[n];
    }
}

// v2: packed layout, 1×1 tile (every broadcast feeds one dpbusd).
static void v2_packed_1x1(const kq::PackedInt& p, const uint8_t* a, int64_t M, int32_t* out) {
  for (int64_t pn = 0; pn < p.n_panels; ++pn)
    for (int64_t m = 0; m < M; ++m) {
      __m512i acc = _mm512_setzero_si512();
      const uint8_t* bp = p.data.data() + pn * p.panel_bytes;
      for (int64_t s = 0; s < p.steps; ++s) {
        int32_t av;
        std::memcpy(&av, a + m * p.lda() + 4 * s, 4);
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(av), _mm512_load_si512(bp + s * 64));
      }
      acc = _mm512_sub_epi32(acc, _mm512_load_si512(p.wsum128.data() + pn * 16));
      alignas(64) int32_t t[16];
      _mm512_store_si512(t, acc);
      for (int c = 0; c < 16 && pn * 16 + c < p.N; ++c) out[m * p.N + pn * 16 + c] = t[c];
    }
}

int main(int argc, char** argv) {
  int64_t M = argc > 3 ? std::atoll(argv[1]) : 128, N = argc > 3 ? std::atoll(argv[2]) : 4096,
          K = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(size_t(N * K)), x(size_t(M * K));
  for (auto& v : wf) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const auto w = pq::quantize_weight(wf.data(), N, K, pq::QuantMode::W8A8);
  const auto p = kq::pack_int(w);
  const int64_t lda = p.lda();
  std::vector<uint8_t> a(size_t(M * lda));
  std::vector<float> sa(static_cast<size_t>(M));
  kq::avx512::quantize_rows_u8(x.data(), M, K, a.data(), lda, sa.data());
  std::vector<int8_t> q(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) q[size_t(m * K + k)] = int8_t(int(a[size_t(m * lda + k)]) - 128);
  std::vector<int32_t> wsum(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) wsum[size_t(n)] = p.wsum128[size_t(n / 16 * 16 + n % 16)];

  std::vector<int32_t> want(size_t(M * N)), got(size_t(M * N));
  const double ops = 2.0 * M * N * K;
  const bool small = ops < 2e10;
  auto report = [&](const char* name, double t, bool checked, bool ok) {
    std::printf("%-44s %9.3f ms %8.1f GOP/s  %s\n", name, t * 1e3, ops / t * 1e-9,
                checked ? (ok ? "exact" : "MISMATCH") : "");
  };
  std::printf("lab_gemm_w8a8 M=%ld N=%ld K=%ld threads=%d\n", long(M), long(N), long(K), perry::thread_pool().size());
  const bool lib_only = std::getenv("LAB_LIB_ONLY") != nullptr;  // skip v0-v2 (tuning runs)
  double t0 = best_of(small && !lib_only ? 1 : 0, [&] { kq::ref::int_accumulators(w, q.data(), M, want.data()); });
  if (!lib_only) report("v0 scalar reference", t0, false, true);
  if (!lib_only) {
  double t1 = best_of(reps, [&] { v1_naive(w, a.data(), lda, wsum.data(), M, got.data()); });
  report("v1 vnni dot per output (row-major W)", t1, true, got == want);
  double t2 = best_of(reps, [&] { v2_packed_1x1(p, a.data(), M, got.data()); });
  report("v2 packed VNNI layout, 1x1 tile", t2, true, got == want);
  }
  const int threads = perry::thread_pool().size();
  perry::set_num_threads(1);
  std::vector<float> y(size_t(M * N));
  kq::avx512::int_accumulators(p, a.data(), nullptr, M, got.data(), kq::Path::Gemm);
  const bool lib_ok = got == want;
  double t3 = best_of(reps, [&] { kq::avx512::int_forward(p, a.data(), nullptr, M, sa.data(), y.data(), nullptr, kq::Path::Gemm); });
  report("v3 library 6x2 tile + MC blocking, 1 thread", t3, true, lib_ok);
  perry::set_num_threads(threads);
  double t4 = best_of(reps, [&] { kq::avx512::int_forward(p, a.data(), nullptr, M, sa.data(), y.data(), nullptr, kq::Path::Gemm); }, false);
  report("v4 library kernel, all threads", t4, true, lib_ok);
  pq::QuantizedLinear lin(w);
  double t5 = best_of(reps, [&] { lin.forward(x.data(), M, y.data()); }, false);
  report("v5 QuantizedLinear::forward (quantize + GEMM)", t5, false, true);

  // GEMV-vs-GEMM threshold: both paths for small M on this weight, cold caches (weights evicted
  // from L3 before every run), all threads, best of reps. Also GB/s of weight bytes.
  std::vector<uint8_t> flush(size_t(96) << 20, 1);
  uint64_t sink = 0;
  for (int64_t m = 1; m <= std::min<int64_t>(M, kq::kGemvMaxRows); ++m) {
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < reps + 1; ++r)
      for (int path = 0; path < 2; ++path) {
        sink += kq::avx512::stream_read(flush.data(), int64_t(flush.size()));
        const double t0 = now(false);
        kq::avx512::int_forward(p, a.data(), nullptr, m, sa.data(), y.data(), nullptr, path ? kq::Path::Gemm : kq::Path::Gemv);
        if (r > 0) best[path] = std::min(best[path], now(false) - t0);
      }
    std::printf("M=%ld  gemv %8.3f ms (%5.1f GB/s)   gemm %8.3f ms (%5.1f GB/s)\n", long(m), best[0] * 1e3,
                double(N * K) / best[0] * 1e-9, best[1] * 1e3, double(N * K) / best[1] * 1e-9);
  }
  return sink == 1 ? 1 : 0;
}
