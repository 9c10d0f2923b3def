// FloatLinear: reference, dispatch, and the library GEMM used for prefill.
//
// Choice of kernel per M (measured by bench/lab_float_linear, numbers in docs/perf/cpu-float-linear.md):
//   M <= kPlan[dtype].gemv_max_m : our GEMV (weights streamed once, up to 4 x rows per weight pass)
//   otherwise                    : kPlan[dtype].gemm (a library GEMM on the checkpoint layout)
// Threading: one runtime only. Each perry pool thread calls the library single-threaded on its own
// slice of N (OpenBLAS set to 1 thread, oneDNN's OpenMP team limited to 1 per calling thread), so
// no OpenBLAS/OpenMP worker ever spins on a core that perry's next kernel needs.
#include "kernels/cpu/float_linear.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace perry::kernels {

enum class GemmBackend { Reference, OpenBlas, OneDnn };

struct GemmPlan {
  int64_t gemv_max_m;  // largest M that still uses our GEMV
  GemmBackend gemm;    // library for larger M
};

// Per weight dtype [F32, F16, BF16] — data, not branches (see the lab for the measurements).
// F16 has no native library GEMM here (OpenBLAS 0.3.21 has no hgemm, oneDNN 2.6 CPU no f16), so its
// rows are widened to f32 in cache-sized chunks and fed to sgemm (exact, and the widening is O(N*K)
// against O(M*N*K) of GEMM work). Debian's OpenBLAS 0.3.21 declares cblas_sbgemm in cblas.h but is
// built without BUILD_BFLOAT16 (the symbol is absent), so bf16 with OpenBLAS goes the same way.
std::atomic<int> g_gemm_override{0};
std::atomic<int64_t> g_gemv_max_m_override{-1};

GemmPlan table_plan(DType t) {
  switch (t) {
    // gemv_max_m = 16: best-of-31 times in the lab's small-M sweep have the GEMV ahead of oneDNN bf16
    // (qo M=16: 0.73 vs 1.34 ms) and OpenBLAS f32 up to M = 16, even at M = 32, library ahead at 64.
    case DType::F32: return {16, GemmBackend::OpenBlas};
    case DType::F16: return {16, GemmBackend::OpenBlas};
    default: return {16, GemmBackend::OneDnn};
  }
}

GemmPlan plan_for(DType t) {
  GemmPlan p = table_plan(t);
  if (int64_t m = g_gemv_max_m_override.load(); m >= 0) p.gemv_max_m = m;
  switch (FloatGemm(g_gemm_override.load())) {
    case FloatGemm::OpenBlas: p.gemm = GemmBackend::OpenBlas; break;
    case FloatGemm::OneDnn: p.gemm = t == DType::BF16 ? GemmBackend::OneDnn : p.gemm; break;
    default: break;
  }
  // oneDNN 2.6 has no bf16 matmul below AVX-512 (an AVX2-only CPU: the primitive cannot be
  // created); bf16 then goes the way of f16, widened to f32 for OpenBLAS's sgemm.
  if (p.gemm == GemmBackend::OneDnn && !supports_onednn_bf16_matmul()) p.gemm = GemmBackend::OpenBlas;
  return p;
}

void set_float_linear_gemm(FloatGemm g) { g_gemm_override = int(g); }
void set_float_linear_gemv_max_m(int64_t m) { g_gemv_max_m_override = m; }

namespace {

std::atomic<bool> g_force_reference{false};

// Rows of N handled per GEMV work item, and the N-slice granularity for library calls.
constexpr int64_t kGemvGrain = 16;
constexpr int64_t kGemmSliceAlign = 64;
constexpr int64_t kWidenChunkRows = 256;  // 256 x K f32 rows = 2 MiB at K = 2048: stays in L2/L3

// x -> bf16, round to nearest even (what oneDNN's bf16 path expects as input).
void to_bf16(const float* x, int64_t n, uint16_t* out) {
  if (supports_avx512_bf16()) return avx512::f32_to_bf16(x, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

// f16 / bf16 -> f32, exact.
void widen(const uint16_t* w, DType t, int64_t n, float* out) {
  if (supports_avx512()) return avx512::convert_row_to_f32(w, t, n, out);
  if (t == DType::BF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(w[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(w[i]);
}

float w_at(const void* w, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(w)[i];
  uint16_t h = static_cast<const uint16_t*>(w)[i];
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

size_t elem_size(DType t) { return t == DType::F32 ? 4 : 2; }

void limit_openmp_to_one_thread() {
  // libgomp comes in with libdnnl; looked up at run time so we don't link it ourselves.
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  thread_local bool done = false;
  if (fn && !done) {
    fn(1);
    done = true;
  }
}

void init_openblas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Splits [0, N) into one contiguous slice per pool thread (aligned to kGemmSliceAlign).
template <typename F>
void for_n_slices(int64_t N, F&& fn) {
  ThreadPool& pool = thread_pool();
  const int64_t blocks = (N + kGemmSliceAlign - 1) / kGemmSliceAlign;
  const int nt = int(std::min<int64_t>(pool.size(), blocks));
  if (nt <= 1) {
    fn(int64_t(0), N);
    return;
  }
  pool.run_on_all([&](int t, int) {
    if (t >= nt) return;
    int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    int64_t n0 = b0 * kGemmSliceAlign, n1 = std::min(N, b1 * kGemmSliceAlign);
    if (n0 < n1) fn(n0, n1);
  });
}

}  // namespace

bool supports_onednn_bf16_matmul() {
  // Probed once by creating the smallest primitive of the kind forward() uses (the library knows
  // what its JIT supports on this CPU; a CPUID rule here would go stale with oneDNN versions).
  static const bool ok = [] {
    try {
      using dt = dnnl::memory::data_type;
      dnnl::memory::desc src({16, 16}, dt::bf16, dnnl::memory::dims{16, 1});
      dnnl::memory::desc wei({16, 16}, dt::bf16, dnnl::memory::dims{1, 16});
      dnnl::memory::desc dst({16, 16}, dt::f32, dnnl::memory::dims{16, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

void set_float_linear_force_reference(bool on) { g_force_reference = on; }

namespace ref {
void linear(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
            int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w_at(w, wt, n * K + k);
      y[m * N + n] = s + (bias ? bias[n] : 0.0f);
    }
  }
}
}  // namespace ref

// oneDNN matmul primitives, one per (M, N slice, bias) — creating one JITs code (~0.1-1 ms), so
// they are cached for the life of the layer; prefill sees few distinct M values.
struct FloatLinearGemm {
  struct Key {
    int64_t m, n0, n1;
    bool bias;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc src, wei, dst, bia;
  };
  std::mutex mu;
  std::map<Key, Entry> prims;

  Entry get(int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1, bool bias) {
    std::lock_guard<std::mutex> lk(mu);
    Key key{M, n0, n1, bias};
    auto it = prims.find(key);
    if (it != prims.end()) return it->second;
    using dt = dnnl::memory::data_type;
    const int64_t ns = n1 - n0;
    dnnl::memory::desc src({M, K}, dt::bf16, dnnl::memory::dims{K, 1});
    dnnl::memory::desc wei({K, ns}, dt::bf16, dnnl::memory::dims{1, K});  // [N, K] row-major = K x N "ba"
    dnnl::memory::desc dst({M, ns}, dt::f32, dnnl::memory::dims{N, 1});
    dnnl::memory::desc bia({1, ns}, dt::f32, dnnl::memory::dims{ns, 1});
    auto pd = bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bia, dst), dnnl_engine())
                   : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), dnnl_engine());
    Entry e{dnnl::matmul(pd), src, wei, dst, bia};
    prims.emplace(key, e);
    return e;
  }
};

FloatLinear::FloatLinear(const void* w, DType wtype, int64_t N, int64_t K)
    : w_(w), wtype_(wtype), N_(N), K_(K), gemm_(std::make_unique<FloatLinearGemm>()) {
  PERRY_CHECK(w != nullptr, "FloatLinear: null weight pointer");
  PERRY_CHECK(wtype == DType::F32 || wtype == DType::F16 || wtype == DType::BF16,
              "FloatLinear: weight dtype {} not supported (F32, F16, BF16)", dtype_name(wtype));
  PERRY_CHECK(N > 0 && K > 0, "FloatLinear: bad shape N={} K={}", N, K);
  PERRY_CHECK(N <= INT32_MAX && K <= INT32_MAX, "FloatLinear: shape N={} K={} too large for BLAS", N, K);
}

FloatLinear::~FloatLinear() = default;
FloatLinear::FloatLinear(FloatLinear&&) noexcept = default;
FloatLinear& FloatLinear::operator=(FloatLinear&&) noexcept = default;

void FloatLinear::copy_weights_to_owned_memory() {
  if (owned_) return;
  size_t bytes = size_t(N_) * size_t(K_) * elem_size(wtype_);
  const size_t align = size_t(2) << 20;
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) fail("FloatLinear: out of memory copying {} MiB of weights", bytes >> 20);
  ::madvise(p, rounded, MADV_HUGEPAGE);
  thread_pool().parallel_for(bytes, size_t(1) << 20, [&](size_t b, size_t e) {
    std::memcpy(static_cast<uint8_t*>(p) + b, static_cast<const uint8_t*>(w_) + b, e - b);
  });
  owned_ = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(p), &std::free);
  w_ = p;
}

std::string FloatLinear::kernel_name(int64_t M) const {
  const std::string dt(dtype_name(wtype_));
  std::string lower;
  for (char c : dt) lower += char(std::tolower(c));
  if (g_force_reference || max_isa() == IsaLevel::Scalar) return "reference-" + lower;
  const GemmPlan plan = plan_for(wtype_);
  if (M <= plan.gemv_max_m) {
    if (supports_avx512()) return "gemv-avx512-" + lower;
    if (supports_avx2()) return "gemv-avx2-" + lower;
    return "reference-" + lower;
  }
  switch (plan.gemm) {
    case GemmBackend::OneDnn: return "onednn-matmul-" + lower;
    case GemmBackend::OpenBlas:
      return wtype_ == DType::F32 ? "openblas-sgemm-f32" : "openblas-sgemm-widened-" + lower;
    default: return "reference-" + lower;
  }
}

void FloatLinear::forward(const float* x, int64_t M, float* y, const float* bias) const {
  PERRY_CHECK(M >= 0, "FloatLinear::forward: negative M {}", M);
  if (M == 0) return;
  const int64_t N = N_, K = K_;
  const void* w = w_;
  const DType wt = wtype_;
  const GemmPlan plan = plan_for(wt);
  const bool ref_path = g_force_reference || max_isa() == IsaLevel::Scalar;

  if (ref_path || M <= plan.gemv_max_m) {
    auto fn = ref_path ? &ref::linear : supports_avx512() ? &avx512::gemv : supports_avx2() ? &avx2::gemv
                                                                                           : &ref::linear;
    // Small layers: don't wake the pool for less than ~64 KiB of weights.
    const size_t grain = std::max<size_t>(kGemvGrain, size_t((64 << 10) / (K * elem_size(wt)) + 1));
    thread_pool().parallel_for(size_t((N + 3) / 4), (grain + 3) / 4, [&](size_t b, size_t e) {
      fn(w, wt, N, K, x, M, y, bias, int64_t(b) * 4, std::min<int64_t>(N, int64_t(e) * 4));
    });
    return;
  }

  if (plan.gemm == GemmBackend::OneDnn && wt == DType::BF16) {
    // x -> bf16 (round to nearest even) is part of the cost, done in parallel.
    thread_local AlignedBuffer<uint16_t> xb;
    if (xb.size() < size_t(M * K)) xb.resize(size_t(M * K));
    uint16_t* xbp = xb.data();
    thread_pool().parallel_for(size_t(M * K), 1 << 14, [&](size_t b, size_t e) {
      to_bf16(x + b, int64_t(e - b), xbp + b);
    });
    for_n_slices(N, [&](int64_t n0, int64_t n1) {
      limit_openmp_to_one_thread();
      FloatLinearGemm::Entry e = gemm_->get(M, N, K, n0, n1, bias != nullptr);
      dnnl::stream s(dnnl_engine());
      dnnl::memory src(e.src, dnnl_engine(), xbp);
      dnnl::memory wei(e.wei, dnnl_engine(), const_cast<uint16_t*>(static_cast<const uint16_t*>(w) + n0 * K));
      dnnl::memory dst(e.dst, dnnl_engine(), y + n0);
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
      if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bia, dnnl_engine(), const_cast<float*>(bias + n0)));
      e.prim.execute(s, args);
      s.wait();
    });
    return;
  }

  init_openblas_once();
  for_n_slices(N, [&](int64_t n0, int64_t n1) {
    if (bias)
      for (int64_t m = 0; m < M; ++m) std::copy(bias + n0, bias + n1, y + m * N + n0);
    const float beta = bias ? 1.0f : 0.0f;
    if (wt == DType::F32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(n1 - n0), blasint(K), 1.0f, x,
                  blasint(K), static_cast<const float*>(w) + n0 * K, blasint(K), beta, y + n0, blasint(N));
      return;
    }
    thread_local std::vector<float> wf;
    wf.resize(size_t(kWidenChunkRows * K));
    const uint16_t* wh = static_cast<const uint16_t*>(w);
    for (int64_t c0 = n0; c0 < n1; c0 += kWidenChunkRows) {
      const int64_t c1 = std::min(n1, c0 + kWidenChunkRows);
      widen(wh + c0 * K, wt, (c1 - c0) * K, wf.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(c1 - c0), blasint(K), 1.0f, x,
                  blasint(K), wf.data(), blasint(K), beta, y + c0, blasint(N));
    }
  });
}

}  // namespace perry::kernels
