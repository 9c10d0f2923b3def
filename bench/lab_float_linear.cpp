// Kernel lab for FloatLinear (docs/perf/cpu-float-linear.md records a run):
//   1. memory read-bandwidth probe: 2 threads, 2 MiB-aligned buffers with THP vs 4 KiB pages vs a
//      page-cache mmap of a file;
//   2. decode GEMV (M = 1): perry's kernel on THP copies vs the page-cache mmap, GB/s vs the probe,
//      weights rotated through > L3 so each call streams from DRAM as in a real decode step;
//   3. prefill GEMM (M = 512) on Llama-3.2-1B shapes: oneDNN bf16 (perry-split / OpenMP-threaded /
//      blocked weights), OpenBLAS sgemm (perry-split / OpenBLAS-threaded, bf16 widened), oneDNN f32;
//   4. small-M crossover GEMV vs library; 5. thread interference (library threads spinning after a
//      GEMM while perry's GEMV runs).
// Usage: lab_float_linear [--quick] [--only bw|gemv|gemm|smallm|spin] [--file DIR]
#include <cblas.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lab_util.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/float_linear.h"

using namespace perry;
using namespace perry::kernels;

namespace {

std::string loadavg() {  // other engineers share the 2 cores: record the background load with the numbers
  char buf[128] = {};
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  return buf;
}

// THP actually granted to this process (AnonHugePages), to confirm the madvise worked.
long anon_huge_kb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds per run after `warm` warm-ups: median and best of `reps`. On the shared 2-core VM a
// preempted pool thread turns a 50 us call into a 4 ms scheduler tick, so both are reported: best =
// what the kernel does with both cores, median = what a run sees under the current background load.
struct Times {
  double med, best;
};
Times time_runs(const std::function<void()>& fn, int reps, int warm = 2) {
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = now();
    fn();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[0]};
}
double median_time(const std::function<void()>& fn, int reps, int warm = 2) { return time_runs(fn, reps, warm).med; }

struct Buf {  // 2 MiB-aligned anonymous memory, THP on or off
  uint8_t* p = nullptr;
  size_t n = 0;
  Buf(size_t bytes, bool huge) : n(bytes) {
    size_t a = size_t(2) << 20, r = (bytes + a - 1) / a * a;
    p = static_cast<uint8_t*>(std::aligned_alloc(a, r));
    madvise(p, r, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::mt19937 rng(1);
    for (size_t i = 0; i < bytes; i += 2) {  // random bf16-ish payload, small magnitudes
      uint16_t v = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f + 1e-3f);
      std::memcpy(p + i, &v, std::min<size_t>(2, bytes - i));
    }
  }
  ~Buf() { std::free(p); }
};


// Two-thread streaming read.
double read_gbs(const uint8_t* p, size_t bytes, int reps) {
  volatile uint64_t sink = 0;
  double t = median_time([&] {
    thread_pool().run_on_all([&](int ti, int nt) {
      size_t b = bytes / 64 * size_t(ti) / size_t(nt) * 64, e = bytes / 64 * size_t(ti + 1) / size_t(nt) * 64;
      sink = sink + perry::lab::read_range(p, b, e);
    });
  }, reps);
  return double(bytes) / t / 1e9;
}

struct MappedWeights {  // a file in the page cache, mmapped read-only like a checkpoint
  uint8_t* p = nullptr;
  size_t n = 0;
  MappedWeights(const std::string& path, const uint8_t* src, size_t bytes) : n(bytes) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { std::perror(path.c_str()); std::exit(1); }
    for (size_t off = 0; off < bytes;) {
      ssize_t w = ::write(fd, src + off, std::min<size_t>(bytes - off, 1 << 26));
      if (w <= 0) { std::perror("write"); std::exit(1); }
      off += size_t(w);
    }
    p = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0));
    ::close(fd);
    ::unlink(path.c_str());
    madvise(p, bytes, MADV_HUGEPAGE);  // what MappedFile does; file-backed THP rarely applies
    madvise(p, bytes, MADV_WILLNEED);
    volatile uint8_t s = 0;
    for (size_t i = 0; i < bytes; i += 4096) s = s + p[i];  // fault in
  }
  ~MappedWeights() { munmap(p, n); }
};

void omp_threads(int n) {
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (fn) fn(n);
}

struct Shape {
  const char* name;
  int64_t N, K;
};
const Shape kShapes[] = {{"qo 2048x2048", 2048, 2048}, {"kv 512x2048", 512, 2048}, {"gate/up 8192x2048", 8192, 2048},
                         {"down 2048x8192", 2048, 8192}, {"lm_head 128256x2048", 128256, 2048}};

std::vector<float> rand_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}


// ---- 3. direct library variants (not through FloatLinear) ----
struct DnnlDirect {  // one oneDNN matmul on the whole problem, OpenMP-threaded; optionally blocked weights
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  DnnlDirect(int64_t M, int64_t N, int64_t K, dnnl::memory::data_type dt, void* w, void* x, float* y, bool blocked) {
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc sd({M, K}, dt, tag::ab), wd_plain({K, N}, dt, tag::ba), dd({M, N}, dnnl::memory::data_type::f32, tag::ab);
    dnnl::memory::desc wd = blocked ? dnnl::memory::desc({K, N}, dt, tag::any) : wd_plain;
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(sd, wd, dd), eng);
    prim = dnnl::matmul(pd);
    src = dnnl::memory(sd, eng, x);
    dst = dnnl::memory(dd, eng, y);
    dnnl::memory user(wd_plain, eng, w);
    if (blocked && pd.weights_desc() != wd_plain) {
      wei = dnnl::memory(pd.weights_desc(), eng);
      dnnl::stream s(eng);
      dnnl::reorder(user, wei).execute(s, user, wei);
      s.wait();
    } else {
      wei = user;
    }
  }
  void run() {
    dnnl::stream s(eng);
    prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    s.wait();
  }
};

void section_bw(bool quick) {
  std::printf("\n## 1. read bandwidth probe (2 threads, median of 9, 1 GiB buffer)\n");
  const size_t bytes = size_t(quick ? 256 : 1024) << 20;
  {
    Buf b(bytes, true);
    std::printf("anonymous, THP (madvise HUGEPAGE, 2 MiB aligned): %6.1f GB/s  (AnonHugePages %ld MiB)\n",
                read_gbs(b.p, bytes, 9), anon_huge_kb() / 1024);
  }
  {
    Buf b(bytes, false);
    std::printf("anonymous, 4 KiB pages (NOHUGEPAGE)             : %6.1f GB/s\n", read_gbs(b.p, bytes, 9));
  }
  {
    Buf b(bytes, true);
    MappedWeights m("/tmp/perry_lab_bw.bin", b.p, bytes);
    std::printf("file mmap (page cache, MAP_SHARED)              : %6.1f GB/s\n", read_gbs(m.p, bytes, 9));
  }
}

// GEMV and a plain read of the same weight bytes, interleaved call by call (same copies, same
// threads, same background load), so the ratio is meaningful on a noisy shared VM. Reported: median
// and best (min time) of each; the best is the machine's capability, the median what a run sees.
void section_gemv(bool quick) {
  std::printf("\n## 2. decode GEMV, M = 1, vs a 2-thread read of the same bytes (interleaved; weights rotated\n"
              "##    through >= 512 MiB so every call streams from DRAM)\n");
  std::printf("%-22s %-5s %-9s %9s %9s %9s %9s %7s %7s\n", "shape", "dtype", "memory", "gemv us", "GB/s med",
              "GB/s best", "read best", "med %", "best %");
  for (DType dt : {DType::BF16, DType::F32}) {
    const size_t es = dt == DType::F32 ? 4 : 2;
    for (const auto& s : kShapes) {
      if (quick && s.N > 10000) continue;
      const size_t bytes = size_t(s.N * s.K) * es;
      const size_t copies = std::max<size_t>(2, (size_t(512) << 20) / bytes + 1);
      Buf b(bytes * copies, true);
      auto x = rand_x(s.K, 1);
      std::vector<float> y(static_cast<size_t>(s.N));
      for (int mem = 0; mem < 2; ++mem) {
        std::unique_ptr<MappedWeights> mw;
        const uint8_t* base = b.p;
        if (mem == 1) {
          mw = std::make_unique<MappedWeights>("/tmp/perry_lab_gemv.bin", b.p, bytes * copies);
          base = mw->p;
        }
        std::vector<FloatLinear> layers;
        for (size_t c = 0; c < copies; ++c) layers.emplace_back(base + c * bytes, dt, s.N, s.K);
        const int calls = int(std::max<size_t>(40, 2 * copies));
        std::vector<double> tg, tr;
        volatile uint64_t sink = 0;
        for (int i = 0; i < calls + 4; ++i) {
          const size_t c = size_t(i) % copies, c2 = (size_t(i) + copies / 2) % copies;
          double t0 = now();
          layers[c].forward(x.data(), 1, y.data());
          double t1 = now();
          thread_pool().run_on_all([&](int ti, int nt) {
            size_t lo = bytes / 64 * size_t(ti) / size_t(nt) * 64, hi = bytes / 64 * size_t(ti + 1) / size_t(nt) * 64;
            sink = sink + perry::lab::read_range(base + c2 * bytes, lo, hi);
          });
          double t2 = now();
          if (i >= 4) {
            tg.push_back(t1 - t0);
            tr.push_back(t2 - t1);
          }
        }
        std::sort(tg.begin(), tg.end());
        std::sort(tr.begin(), tr.end());
        const double gmed = double(bytes) / tg[tg.size() / 2] / 1e9, gbest = double(bytes) / tg[0] / 1e9;
        const double rmed = double(bytes) / tr[tr.size() / 2] / 1e9, rbest = double(bytes) / tr[0] / 1e9;
        std::printf("%-22s %-5s %-9s %9.1f %9.1f %9.1f %9.1f %6.0f%% %6.0f%%\n", s.name,
                    std::string(dtype_name(dt)).c_str(), mem ? "file-mmap" : "THP", tg[tg.size() / 2] * 1e6, gmed,
                    gbest, rbest, 100 * gmed / rmed, 100 * gbest / rbest);
        std::fflush(stdout);
      }
    }
  }
}

// Kernel speed without DRAM: one L2/L3-resident layer called repeatedly (upper bound of the GEMV's
// compute side; must be well above the DRAM numbers or the kernel, not memory, is the limit).
void section_hot() {
  std::printf("\n## 2b. GEMV on cache-resident weights (512x1024 and 1024x2048), best of 200 calls\n");
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t N : {512, 1024}) {
      const int64_t K = N * 2;
      const size_t bytes = size_t(N * K) * (dt == DType::F32 ? 4 : 2);
      Buf b(bytes, true);
      auto x = rand_x(K, 1);
      std::vector<float> y(static_cast<size_t>(N));
      FloatLinear lin(b.p, dt, N, K);
      std::vector<double> t;
      for (int i = 0; i < 210; ++i) {
        double t0 = now();
        lin.forward(x.data(), 1, y.data());
        if (i >= 10) t.push_back(now() - t0);
      }
      std::sort(t.begin(), t.end());
      std::printf("%-5s %5lldx%-5lld %7.2f MiB  best %7.1f GB/s  median %7.1f GB/s\n",
                  std::string(dtype_name(dt)).c_str(), (long long)N, (long long)K, double(bytes) / (1 << 20),
                  double(bytes) / t[0] / 1e9, double(bytes) / t[t.size() / 2] / 1e9);
    }
  }
}

void section_gemm(bool quick) {
  const int64_t M = 512;
  std::printf("\n## 3. prefill GEMM, M = %lld (median of 5 after 2 warm-ups; GFLOP/s = 2MNK/t)\n", (long long)M);
  std::printf("%-22s %-48s %8s %9s %9s %10s\n", "shape", "variant", "ms med", "GF/s med", "GF/s best",
              "max rel diff");
  for (const auto& s : kShapes) {
    if (quick && s.N > 10000) continue;
    const int reps = s.N > 10000 ? 3 : 5;
    const double flop = 2.0 * double(M) * double(s.N) * double(s.K);
    Buf wb(size_t(s.N * s.K) * 2, true);
    auto* w16 = reinterpret_cast<uint16_t*>(wb.p);
    auto x = rand_x(M * s.K, 2);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    std::vector<float> y(static_cast<size_t>(M * s.N)), yref(y.size());
    auto report = [&](const char* v, Times t) {
      std::printf("%-22s %-48s %8.2f %9.1f %9.1f %10.2e\n", s.name, v, t.med * 1e3, flop / t.med / 1e9,
                  flop / t.best / 1e9, perry::lab::max_rel_diff(y, yref));
      std::fflush(stdout);
    };
    // bf16 weights
    FloatLinear lin(w16, DType::BF16, s.N, s.K);
    set_float_linear_gemm(FloatGemm::OneDnn);
    lin.forward(x.data(), M, yref.data());
    report("bf16 A: FloatLinear oneDNN, perry-split", time_runs([&] { lin.forward(x.data(), M, y.data()); }, reps));
    set_float_linear_gemm(FloatGemm::OpenBlas);
    report("bf16 B: FloatLinear OpenBLAS sgemm (widened)", time_runs([&] { lin.forward(x.data(), M, y.data()); }, reps));
    set_float_linear_gemm(FloatGemm::Auto);
    omp_threads(2);
    {
      DnnlDirect d(M, s.N, s.K, dnnl::memory::data_type::bf16, w16, xb.data(), y.data(), false);
      report("bf16 C: oneDNN direct, OpenMP 2 thr (+x cvt)", time_runs([&] {
               for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
               d.run();
             }, reps));
    }
    {
      DnnlDirect d(M, s.N, s.K, dnnl::memory::data_type::bf16, w16, xb.data(), y.data(), true);
      report("bf16 D: oneDNN blocked weights, OpenMP 2 thr", time_runs([&] { d.run(); }, reps));
    }
    omp_threads(1);
    if (quick && s.N > 4096) continue;
    // f32 weights (the bf16 values widened, so results compare against the same reference)
    std::vector<float> wf(static_cast<size_t>(s.N * s.K));
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(w16[i]);
    FloatLinear lf(wf.data(), DType::F32, s.N, s.K);
    lf.forward(x.data(), M, yref.data());
    report("f32  E: FloatLinear OpenBLAS sgemm, perry-split", time_runs([&] { lf.forward(x.data(), M, y.data()); }, reps));
    openblas_set_num_threads(2);
    report("f32  F: OpenBLAS sgemm, OpenBLAS 2 threads", time_runs([&] {
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, s.N, s.K, 1.0f, x.data(), s.K, wf.data(), s.K,
                         0.0f, y.data(), s.N);
           }, reps));
    openblas_set_num_threads(1);
    omp_threads(2);
    {
      DnnlDirect d(M, s.N, s.K, dnnl::memory::data_type::f32, wf.data(), x.data(), y.data(), false);
      report("f32  G: oneDNN f32 direct, OpenMP 2 thr", time_runs([&] { d.run(); }, reps));
    }
    omp_threads(1);
  }
}

void section_smallm() {
  std::printf("\n## 4. small M: GEMV vs library (bf16 and f32, us per call, weights in THP memory)\n");
  std::printf("%-22s %-5s %4s %12s %12s %12s %12s\n", "shape", "dtype", "M", "gemv us med", "lib us med",
              "gemv us best", "lib us best");
  for (DType dt : {DType::BF16, DType::F32}) {
    for (const auto& s : {kShapes[0], kShapes[2]}) {
      const size_t es = dt == DType::F32 ? 4 : 2;
      const size_t bytes = size_t(s.N * s.K) * es, copies = (size_t(256) << 20) / bytes + 1;
      Buf b(bytes * copies, true);
      std::vector<FloatLinear> layers;
      for (size_t c = 0; c < copies; ++c) layers.emplace_back(b.p + c * bytes, dt, s.N, s.K);
      for (int64_t M : {1, 2, 3, 4, 6, 8, 12, 16, 32, 64}) {
        auto x = rand_x(M * s.K, 3);
        std::vector<float> y(static_cast<size_t>(M * s.N));
        size_t i = 0;
        auto run = [&] { layers[i++ % copies].forward(x.data(), M, y.data()); };
        set_float_linear_gemv_max_m(1 << 20);
        Times tg = time_runs(run, 31, 3);
        set_float_linear_gemv_max_m(0);
        Times tl = time_runs(run, 31, 3);
        set_float_linear_gemv_max_m(-1);
        std::printf("%-22s %-5s %4lld %12.1f %12.1f %12.1f %12.1f\n", s.name, std::string(dtype_name(dt)).c_str(),
                    (long long)M, tg.med * 1e6, tl.med * 1e6, tg.best * 1e6, tl.best * 1e6);
      }
    }
  }
}

void section_spin() {
  std::printf("\n## 5. interference: prefill GEMM (M=64) then 16 decode GEMVs, per-GEMV us (median)\n");
  const int64_t N = 2048, K = 2048, M = 64;
  Buf b(size_t(N * K) * 2 * 64, true);
  std::vector<FloatLinear> layers;
  for (int c = 0; c < 64; ++c) layers.emplace_back(b.p + size_t(c) * N * K * 2, DType::BF16, N, K);
  auto x = rand_x(M * K, 4);
  std::vector<uint16_t> xb(x.size());
  std::vector<float> y(static_cast<size_t>(M * N));
  DnnlDirect d(M, N, K, dnnl::memory::data_type::bf16, b.p, xb.data(), y.data(), false);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<double> ts;
    for (int rep = 0; rep < 30; ++rep) {
      if (variant == 0) layers[0].forward(x.data(), M, y.data());  // perry-split oneDNN (1 OMP thread each)
      if (variant == 1) { omp_threads(2); d.run(); omp_threads(1); }  // OpenMP team of 2, then it spins
      if (variant == 2) {
        openblas_set_num_threads(2);
        std::vector<float> wf(size_t(N * K), 0.5f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, wf.data(), K, 0.0f, y.data(), N);
        openblas_set_num_threads(1);
      }
      double t0 = now();
      for (int i = 0; i < 16; ++i) layers[1 + (rep * 16 + i) % 63].forward(x.data(), 1, y.data());
      ts.push_back((now() - t0) / 16);
    }
    std::sort(ts.begin(), ts.end());
    const char* names[] = {"after perry-split oneDNN GEMM", "after OpenMP-threaded oneDNN GEMM",
                           "after OpenBLAS-threaded sgemm"};
    std::printf("%-40s %8.1f us/GEMV\n", names[variant], ts[ts.size() / 2] * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else { std::fprintf(stderr, "usage: %s [--quick] [--only bw|gemv|gemm|smallm|spin]\n", argv[0]); return 2; }
  }
  const auto& f = cpu_features();
  std::printf("# lab_float_linear: %s, %d threads, avx512_bf16=%d, loadavg at start: %s", f.brand.c_str(),
              thread_pool().size(), int(supports_avx512_bf16()), loadavg().c_str());
  openblas_set_num_threads(1);
  omp_threads(1);
  if (only.empty() || only == "bw") section_bw(quick);
  if (only.empty() || only == "gemv") section_gemv(quick);
  if (only.empty() || only == "hot") section_hot();
  if (only.empty() || only == "gemm") section_gemm(quick);
  if (only.empty() || only == "smallm") section_smallm();
  if (only.empty() || only == "spin") section_spin();
  std::printf("\n# loadavg at end: %s", loadavg().c_str());
  return 0;
}
