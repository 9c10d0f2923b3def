// Kernel lab for the CUDA W8A8 GEMM (llm.c dev/cuda style): CPU references, exactness checks,
// then a timing sweep against cuBLAS bf16 and cuBLASLt int8 at Llama-3-8B-like shapes.
//
//   lab_cuda_gemm_w8a8 OUT_DIR [--quick] [--check-only] [--time-only] [--wgmma]
//
// --wgmma runs only the EXPERIMENTAL sm_90a kernels: gemm_w8a8_sm90.cu (exactness checks and a
// timing comparison with the mma.sync kernel, cuBLAS bf16 and cuBLASLt int8), then the grouped /
// int4 gemm_quant_sm90.cu (w8a8-g128, w4a8-g128: whole outputs vs the mma.sync gemm_quant, timing
// vs cuBLAS bf16), into OUT_DIR/lab_cuda_gemm_w8a8_wgmma.md.
//
// Correctness (exit code 1 on any failure, timing still runs so the numbers come back):
//   quantize_per_token (fp32 and bf16 input) vs the CPU rule, bytes and scale bits exactly;
//   gemm_w8a8 int32 output vs an int64 CPU dot product exactly (all entries for small shapes, a
//   random sample of 4096 + the corners for big ones); bf16 / fp32 fused-epilogue output vs a
//   float64 reference (per-element relative error, floor at 1e-3·rms); at every timed shape the
//   timed outputs (perry bf16, cuBLASLt int32, cuBLAS bf16) are checked on a 64×64 sample.
// Timing: CUDA events around each run, 256 MiB L2 flush (memset) before every run (H200 L2 is
// 60 MB), 3 warm-ups, median of 20 (5 with --quick). Writes OUT_DIR/lab_cuda_gemm_w8a8.{json,md}.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/bench_peers.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm_quant_sm90.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "kernels/cuda/gemv_quant.h"

using perry::DType;
namespace pc = perry::cuda;

#define CK(call) PERRY_CUDA_CHECK(call)
#define CB(call) pc::check_cublas_status((call), #call)

namespace {

int g_failures = 0;
std::vector<std::string> g_check_lines;

void report(bool ok, const std::string& what) {
  if (!ok) ++g_failures;
  std::string line = std::string(ok ? "PASS " : "FAIL ") + what;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  g_check_lines.push_back(line);
}

// ---------------------------------------------------------------- CPU references
// The per-token rule of perry::quant::quantize_row_ref (src/quant/quant.cpp), restated here so
// the lab is one self-contained program.
float quantize_row_cpu(const float* x, int K, int8_t* q) {
  float amax = 0;
  for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  float inv = amax > 0 ? 127.0f / amax : 0.0f;
  float scale = amax / 127.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
  for (int k = 0; k < K; ++k) {
    float v = std::nearbyint(x[k] * inv);
    v = std::min(std::max(v, -127.0f), 127.0f);
    q[k] = v == v ? int8_t(v) : int8_t(0);
  }
  return scale;
}

int64_t dot_i8(const int8_t* a, const int8_t* b, int K) {
  int64_t s = 0;
  for (int k = 0; k < K; ++k) s += int64_t(a[k]) * int64_t(b[k]);
  return s;
}

float bf16_bits_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { CK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) { CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<int8_t> random_i8(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = int8_t(d(rng));
  return v;
}
std::vector<float> random_f32(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---------------------------------------------------------------- correctness: quantize
void check_quantize(int M, int K, DType in, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(rng);
  // Outliers, an all-zero row, a NaN, an infinity, a denormal row, exact .5 ties.
  for (int m = 0; m < M; ++m) x[size_t(m) * K + (m * 37) % K] *= 40.0f;
  if (M > 1) std::fill(x.begin() + K, x.begin() + 2 * K, 0.0f);
  if (M > 2) x[size_t(2) * K + K / 2] = NAN;
  if (M > 3) x[size_t(3) * K + 1] = INFINITY;
  if (M > 4) for (int k = 0; k < K; ++k) x[size_t(4) * K + k] = 1e-40f * float((k % 5) - 2);
  if (M > 5) {  // amax 127 → inv 1 → x*inv = x exactly: ties at ±0.5, ±1.5, ±2.5 round to even
    for (int k = 0; k < K; ++k) x[size_t(5) * K + k] = float((k % 11) - 5) + 0.5f;
    x[size_t(5) * K] = 127.0f;
  }
  if (in == DType::BF16)  // the kernel sees bf16 values: the reference must see the same ones
    for (auto& v : x) v = bf16_bits_to_f32(f32_to_bf16_bits(v));

  std::vector<int8_t> q_ref(x.size());
  std::vector<float> s_ref(M);
  for (int m = 0; m < M; ++m) s_ref[m] = quantize_row_cpu(&x[size_t(m) * K], K, &q_ref[size_t(m) * K]);

  DevBuf<int8_t> dq(x.size());
  DevBuf<float> ds(M);
  if (in == DType::F32) {
    DevBuf<float> dx(x.size());
    dx.upload(x);
    pc::quantize_per_token(dx.p, in, M, K, dq.p, ds.p, nullptr);
  } else {
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16_bits(x[i]);
    DevBuf<uint16_t> dx(x.size());
    dx.upload(xb);
    pc::quantize_per_token(dx.p, in, M, K, dq.p, ds.p, nullptr);
  }
  CK(cudaDeviceSynchronize());
  auto q = dq.download();
  auto s = ds.download();
  size_t bad_q = 0, first = 0;
  for (size_t i = 0; i < q.size(); ++i)
    if (q[i] != q_ref[i] && bad_q++ == 0) first = i;
  int bad_s = 0;
  for (int m = 0; m < M; ++m) bad_s += std::memcmp(&s[m], &s_ref[m], 4) != 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "quantize_per_token %s M=%d K=%d: %zu/%zu bytes differ, %d/%d scales differ%s",
                in == DType::F32 ? "f32" : "bf16", M, K, bad_q, q.size(), bad_s, M,
                bad_q ? (" (first at row " + std::to_string(first / K) + " col " + std::to_string(first % K) +
                         ": gpu " + std::to_string(q[first]) + " cpu " + std::to_string(q_ref[first]) + ")").c_str()
                      : "");
  report(bad_q == 0 && bad_s == 0, buf);
}

// ---------------------------------------------------------------- correctness: gemm
using GemmFn = void (*)(const int8_t*, const float*, const int8_t*, const float*, const float*, void*, DType,
                       int, int, int, cudaStream_t);

void check_gemm(int M, int N, int K, std::mt19937_64& rng, GemmFn gemm = pc::gemm_w8a8,
                const char* name = "gemm_w8a8") {
  auto X = random_i8(size_t(M) * K, rng);
  auto W = random_i8(size_t(N) * K, rng);
  auto sa = random_f32(M, rng, 1e-3f, 2e-2f);
  auto sw = random_f32(N, rng, 1e-3f, 2e-2f);
  auto bias = random_f32(N, rng, -2.0f, 2.0f);
  DevBuf<int8_t> dX(X.size()), dW(W.size());
  DevBuf<float> dsa(M), dsw(N), db(N);
  dX.upload(X); dW.upload(W); dsa.upload(sa); dsw.upload(sw); db.upload(bias);
  DevBuf<int32_t> dY32(size_t(M) * N);
  DevBuf<uint16_t> dYb(size_t(M) * N);
  DevBuf<float> dYf(size_t(M) * N);
  gemm(dX.p, nullptr, dW.p, nullptr, nullptr, dY32.p, DType::I32, M, N, K, nullptr);
  gemm(dX.p, dsa.p, dW.p, dsw.p, db.p, dYb.p, DType::BF16, M, N, K, nullptr);
  gemm(dX.p, dsa.p, dW.p, dsw.p, nullptr, dYf.p, DType::F32, M, N, K, nullptr);
  CK(cudaDeviceSynchronize());
  auto Y32 = dY32.download();
  auto Yb = dYb.download();
  auto Yf = dYf.download();

  // Entries to check: all of them when small, else 4096 random + the four corners + last row/col.
  std::vector<std::pair<int, int>> idx;
  const bool all = int64_t(M) * N <= (1 << 20);
  if (all) {
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) idx.push_back({m, n});
  } else {
    std::uniform_int_distribution<int> dm(0, M - 1), dn(0, N - 1);
    for (int i = 0; i < 4096; ++i) idx.push_back({dm(rng), dn(rng)});
    for (int n = 0; n < N; n += std::max(1, N / 64)) idx.push_back({M - 1, n});
    for (int m = 0; m < M; m += std::max(1, M / 64)) idx.push_back({m, N - 1});
    idx.push_back({0, 0}); idx.push_back({0, N - 1}); idx.push_back({M - 1, 0}); idx.push_back({M - 1, N - 1});
  }
  // float64 references and the error floor (1e-3 × rms of the reference).
  std::vector<int64_t> acc(idx.size());
  double ss_b = 0, ss_f = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    auto [m, n] = idx[i];
    acc[i] = dot_i8(&X[size_t(m) * K], &W[size_t(n) * K], K);
    double rb = double(acc[i]) * sa[m] * sw[n] + bias[n], rf = double(acc[i]) * sa[m] * sw[n];
    ss_b += rb * rb; ss_f += rf * rf;
  }
  const double floor_b = 1e-3 * std::sqrt(ss_b / idx.size()) + 1e-30;
  const double floor_f = 1e-3 * std::sqrt(ss_f / idx.size()) + 1e-30;
  size_t bad32 = 0;
  double err_b = 0, err_f = 0;
  std::string first_bad;
  for (size_t i = 0; i < idx.size(); ++i) {
    auto [m, n] = idx[i];
    const size_t o = size_t(m) * N + n;
    if (int64_t(Y32[o]) != acc[i] && bad32++ == 0)
      first_bad = " first at (" + std::to_string(m) + "," + std::to_string(n) + "): gpu " +
                  std::to_string(Y32[o]) + " cpu " + std::to_string(acc[i]);
    double rb = double(acc[i]) * sa[m] * sw[n] + bias[n], rf = double(acc[i]) * sa[m] * sw[n];
    err_b = std::max(err_b, std::fabs(double(bf16_bits_to_f32(Yb[o])) - rb) / std::max(std::fabs(rb), floor_b));
    err_f = std::max(err_f, std::fabs(double(Yf[o]) - rf) / std::max(std::fabs(rf), floor_f));
  }
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s i32 M=%d N=%d K=%d: %zu/%zu %s entries differ from the int64 reference%s",
                name, M, N, K, bad32, idx.size(), all ? "(all)" : "(sampled)", first_bad.c_str());
  report(bad32 == 0, buf);
  std::snprintf(buf, sizeof buf, "%s bf16+bias M=%d N=%d K=%d: max rel err %.3g (limit 1e-2)", name, M, N, K, err_b);
  report(err_b < 1e-2, buf);
  std::snprintf(buf, sizeof buf, "%s f32 M=%d N=%d K=%d: max rel err %.3g (limit 1e-4)", name, M, N, K, err_f);
  report(err_f < 1e-4, buf);
}

// Y one element past an allocation (M=5, N=6, K=32): element stores, the same values as at an
// aligned Y, for every output dtype. `what` is the report line, the dtype name is appended.
void check_odd_y_offset(GemmFn gemm, const char* what, std::mt19937_64& rng) {
  const int M = 5, N = 6, K = 32;
  DevBuf<int8_t> X(size_t(M) * K), W(size_t(N) * K);
  X.upload(random_i8(X.n, rng));
  W.upload(random_i8(W.n, rng));
  DevBuf<float> sa(M), sw(N);
  sa.upload(random_f32(M, rng, 0.01f, 0.02f));
  sw.upload(random_f32(N, rng, 0.01f, 0.02f));
  for (DType out : {DType::BF16, DType::F32, DType::I32}) {
    const size_t es = out == DType::BF16 ? 2 : 4;
    DevBuf<int32_t> a(size_t(M) * N + 1), b(size_t(M) * N + 1);
    gemm(X.p, sa.p, W.p, sw.p, nullptr, a.p, out, M, N, K, nullptr);
    gemm(X.p, sa.p, W.p, sw.p, nullptr, reinterpret_cast<char*>(b.p) + es, out, M, N, K, nullptr);
    CK(cudaDeviceSynchronize());
    auto ha = a.download(), hb = b.download();
    const bool same = std::memcmp(ha.data(), reinterpret_cast<const char*>(hb.data()) + es, size_t(M) * N * es) == 0;
    report(same, std::string(what) + (out == DType::BF16 ? "bf16" : out == DType::F32 ? "f32" : "i32"));
  }
}

void check_errors() {
  // Bad arguments must be a perry::Error naming the problem, never a launch.
  DevBuf<int8_t> d(64 * 64);
  DevBuf<int32_t> y(64 * 64);
  bool threw = false;
  try {
    pc::gemm_w8a8(d.p, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 4, 4, 40, nullptr);
  } catch (const perry::Error& e) {
    threw = std::string(e.what()).find("multiple of 16") != std::string::npos;
  }
  report(threw, "gemm_w8a8 rejects K % 16 != 0 with a perry::Error");
  threw = false;
  try {
    pc::gemm_w8a8(d.p + 1, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 4, 4, 16, nullptr);
  } catch (const perry::Error& e) {
    threw = std::string(e.what()).find("aligned") != std::string::npos;
  }
  report(threw, "gemm_w8a8 rejects a misaligned X with a perry::Error");

  // Y one element past an allocation: the kernel must fall back to element stores, same values.
  std::mt19937_64 rng(7);
  check_odd_y_offset(pc::gemm_w8a8, "gemm_w8a8 output at an odd element offset (element stores) matches, out=", rng);
}

// Device fills, cuBLAS bf16 and cuBLASLt int8: the shared peers of kernels/cuda/bench_peers.h.

// ---------------------------------------------------------------- timing
struct Timer {
  cudaStream_t stream;
  void* flush = nullptr;
  size_t flush_bytes = size_t(256) << 20;
  int reps = 20, warmup = 3;
  explicit Timer(cudaStream_t s) : stream(s) { CK(cudaMalloc(&flush, flush_bytes)); }
  ~Timer() { cudaFree(flush); }
  // Median milliseconds of op(), each run timed alone after an L2 flush.
  double median_ms(const std::function<void()>& op) {
    for (int i = 0; i < warmup; ++i) op();
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int r = 0; r < reps; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
      CK(cudaEventRecord(ev[2 * r], stream));
      op();
      CK(cudaEventRecord(ev[2 * r + 1], stream));
    }
    CK(cudaStreamSynchronize(stream));
    std::vector<double> t(reps);
    for (int r = 0; r < reps; ++r) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]));
      t[r] = ms;
    }
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(t.begin(), t.end());
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  }
};

struct Row {
  int M, N, K;
  double ms_qgemm, ms_gemm, ms_bf16, ms_lt;  // < 0: not available
  std::string lt_note;
};

std::vector<Row> g_rows;  // appended as the sweep goes, so an error midway still leaves results

// A baseline that fails at some shape (e.g. cuBLASLt NOT_SUPPORTED) gives -1 and a note, not an abort.
double safe_ms(Timer& timer, const std::function<void()>& op, std::string& note, const char* what) {
  try {
    return timer.median_ms(op);
  } catch (const std::exception& e) {
    note += std::string(what) + ": " + e.what() + "; ";
    std::printf("WARN %s failed: %s\n", what, e.what());
    return -1;
  }
}

double tops(const Row& r, double ms) { return ms > 0 ? 2.0 * r.M * double(r.N) * r.K / (ms * 1e-3) / 1e12 : -1; }

// Checks the timed outputs at 64 sampled rows × 64 sampled columns.
void check_timed(int M, int N, int K, const int8_t* dXq, const float* dsa, const int8_t* dW,
                 const float* dsw, const float* dbias, const uint16_t* dY, const int32_t* dY32,
                 const uint16_t* dXb, const uint16_t* dWb, const uint16_t* dYbf, bool have_lt,
                 bool have_bf16, std::mt19937_64& rng) {
  std::vector<int8_t> W(size_t(N) * K);
  CK(cudaMemcpy(W.data(), dW, W.size(), cudaMemcpyDeviceToHost));
  std::vector<float> sw(N), bias(N), sa(M);
  CK(cudaMemcpy(sw.data(), dsw, 4 * N, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(bias.data(), dbias, 4 * N, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sa.data(), dsa, 4 * M, cudaMemcpyDeviceToHost));
  std::uniform_int_distribution<int> dm(0, M - 1), dn(0, N - 1);
  std::vector<int> rows, cols;
  for (int i = 0; i < 64; ++i) { rows.push_back(dm(rng)); cols.push_back(dn(rng)); }
  rows[0] = M - 1; cols[0] = N - 1;
  std::vector<int8_t> xr(K);
  std::vector<uint16_t> yr(N), xbr(K), ybfr(N), wbr(K);
  std::vector<int32_t> y32r(N);
  double err = 0, err_bf = 0, ss = 0, ss_bf = 0;
  size_t bad_lt = 0;
  std::vector<double> ref(64 * 64), ref_bf(64 * 64), got(64 * 64), got_bf(64 * 64);
  for (int i = 0; i < 64; ++i) {
    const int m = rows[i];
    CK(cudaMemcpy(xr.data(), dXq + size_t(m) * K, K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(yr.data(), dY + size_t(m) * N, 2 * N, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xbr.data(), dXb + size_t(m) * K, 2 * K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ybfr.data(), dYbf + size_t(m) * N, 2 * N, cudaMemcpyDeviceToHost));
    if (have_lt) CK(cudaMemcpy(y32r.data(), dY32 + size_t(m) * N, 4 * N, cudaMemcpyDeviceToHost));
    for (int j = 0; j < 64; ++j) {
      const int n = cols[j];
      int64_t a = dot_i8(xr.data(), &W[size_t(n) * K], K);
      if (have_lt && int64_t(y32r[n]) != a) ++bad_lt;
      ref[i * 64 + j] = double(a) * sa[m] * sw[n] + bias[n];
      got[i * 64 + j] = bf16_bits_to_f32(yr[n]);
      CK(cudaMemcpy(wbr.data(), dWb + size_t(n) * K, 2 * K, cudaMemcpyDeviceToHost));
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(bf16_bits_to_f32(xbr[k])) * bf16_bits_to_f32(wbr[k]);
      ref_bf[i * 64 + j] = s;
      got_bf[i * 64 + j] = bf16_bits_to_f32(ybfr[n]);
      ss += ref[i * 64 + j] * ref[i * 64 + j];
      ss_bf += s * s;
    }
  }
  const double fl = 1e-3 * std::sqrt(ss / 4096) + 1e-30, fl_bf = 1e-3 * std::sqrt(ss_bf / 4096) + 1e-30;
  for (int i = 0; i < 4096; ++i) {
    err = std::max(err, std::fabs(got[i] - ref[i]) / std::max(std::fabs(ref[i]), fl));
    err_bf = std::max(err_bf, std::fabs(got_bf[i] - ref_bf[i]) / std::max(std::fabs(ref_bf[i]), fl_bf));
  }
  char buf[320];
  std::snprintf(buf, sizeof buf, "timed M=%d N=%d K=%d: perry bf16 max rel err %.3g (limit 1e-2)", M, N, K, err);
  report(err < 1e-2, buf);
  if (have_bf16) {
    std::snprintf(buf, sizeof buf, "timed M=%d N=%d K=%d: cuBLAS bf16 max rel err %.3g (limit 2e-2)", M, N, K, err_bf);
    report(err_bf < 2e-2, buf);
  }
  if (have_lt) {
    std::snprintf(buf, sizeof buf, "timed M=%d N=%d K=%d: cuBLASLt int8 %zu/4096 sampled entries differ from int64 ref", M, N, K, bad_lt);
    report(bad_lt == 0, buf);
  }
}

std::vector<Row> run_timing(bool quick, std::mt19937_64& rng) {
  struct NK { int N, K; };
  std::vector<NK> shapes = {{10240, 2560}, {2560, 10240}, {14336, 4096}, {4096, 14336}, {6144, 4096}};
  std::vector<int> Ms = {16, 128, 512, 1024, 2048, 4096, 8192};
  std::vector<std::pair<NK, std::vector<int>>> plan;
  if (quick) {
    plan = {{{10240, 2560}, {2048}}, {{4096, 14336}, {4096}}, {{6144, 4096}, {16}}};
  } else {
    for (auto s : shapes) plan.push_back({s, Ms});
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  CB(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  size_t ws_bytes = size_t(64) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  Timer timer(stream);
  if (quick) timer.reps = 5;
  std::vector<Row> rows;
  for (auto& [nk, mlist] : plan) {
    const int N = nk.N, K = nk.K;
    const int Mmax = *std::max_element(mlist.begin(), mlist.end());
    DevBuf<int8_t> W(size_t(N) * K), Xq(size_t(Mmax) * K);
    DevBuf<uint16_t> Xb(size_t(Mmax) * K), Wb(size_t(N) * K), Y(size_t(Mmax) * N), Ybf(size_t(Mmax) * N);
    DevBuf<int32_t> Y32(size_t(Mmax) * N);
    DevBuf<float> sa(Mmax), sw(N), bias(N);
    pc::fill_random_i8(W.p, W.n, rng(), stream);
    pc::fill_random_bf16(Xb.p, Xb.n, rng(), 1.0f, stream);
    pc::fill_random_bf16(Wb.p, Wb.n, rng(), 0.05f, stream);
    pc::fill_random_f32(sw.p, N, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(bias.p, N, rng(), -1.0f, 1.0f, stream);
    pc::check_launch("fill");
    CK(cudaStreamSynchronize(stream));
    for (int M : mlist) {
      Row r{M, N, K, -1, -1, -1, -1, ""};
      auto qgemm = [&] {
        pc::quantize_per_token(Xb.p, DType::BF16, M, K, Xq.p, sa.p, stream);
        pc::gemm_w8a8(Xq.p, sa.p, W.p, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream);
      };
      auto gemm = [&] { pc::gemm_w8a8(Xq.p, sa.p, W.p, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream); };
      auto bf16 = [&] { pc::cublas_gemm_bf16(blas, Wb.p, Xb.p, Ybf.p, DType::BF16, M, N, K); };
      r.ms_qgemm = timer.median_ms(qgemm);
      r.ms_gemm = timer.median_ms(gemm);
      r.ms_bf16 = safe_ms(timer, bf16, r.lt_note, "cuBLAS bf16");
      // cuBLASLt int8 (int32 compute and output), its best heuristic.
      bool have_lt = false;
      const pc::LtGemm lt_i8(lt, pc::LtGemmKind::I8_I32, M, N, K, ws_bytes);
      if (lt_i8.available()) {
        r.ms_lt = safe_ms(timer, [&] { lt_i8.run(W.p, Xq.p, Y32.p, ws, stream); }, r.lt_note, "cuBLASLt int8");
        have_lt = r.ms_lt > 0;
      } else {
        r.lt_note = lt_i8.note();
      }
      CK(cudaStreamSynchronize(stream));
      // The outputs of the last timed runs (qgemm then gemm wrote Y from the same Xq) are checked.
      check_timed(M, N, K, Xq.p, sa.p, W.p, sw.p, bias.p, Y.p, Y32.p, Xb.p, Wb.p, Ybf.p, have_lt, r.ms_bf16 > 0, rng);
      std::printf("M=%5d N=%5d K=%5d | perry q+gemm %8.3f ms %7.1f TOPS | perry gemm %8.3f ms %7.1f TOPS | "
                  "cuBLAS bf16 %8.3f ms %7.1f TFLOPS | cuBLASLt i8 %8.3f ms %7.1f TOPS | gemm/bf16 %.2fx\n",
                  M, N, K, r.ms_qgemm, tops(r, r.ms_qgemm), r.ms_gemm, tops(r, r.ms_gemm), r.ms_bf16,
                  tops(r, r.ms_bf16), r.ms_lt, tops(r, r.ms_lt), r.ms_bf16 / r.ms_gemm);
      std::fflush(stdout);
      rows.push_back(r);
      g_rows.push_back(r);
    }
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return rows;
}

__global__ void count_mismatch(const int32_t* a, const int32_t* b, size_t n, unsigned long long* out) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(out, local);
}

// --wgmma: the experimental sm_90a kernel (TMA + wgmma, gemm_w8a8_sm90.cu). Exactness against
// the int64 reference on edge shapes under each column-tile width (PERRY_WGMMA_BN = auto, 128,
// 256, 160), element stores at an odd output offset, then at each timing shape its whole int32
// output compared on the device with the mma.sync kernel's, and timings (L2 flushed, median) of
// mma.sync, wgmma (auto / BN=128 / 256 / 160; bf16 out with sa·sw·bias fused; and int32 out),
// cuBLAS bf16 and cuBLASLt int8→int32.
void set_wgmma_bn(const char* v) {
  if (v) setenv("PERRY_WGMMA_BN", v, 1);
  else unsetenv("PERRY_WGMMA_BN");
}

// --wgmma, second part: the grouped / int4 modes on gemm_quant_wgmma (gemm_quant_sm90.cu). At each
// timing shape its whole output is compared on the device with the mma.sync gemm_quant's (itself
// checked against int64 / float64 references by tests/cuda/test_cuda_quant_linear.cpp): the int32
// per-group partials [M, N, G] exactly (M <= 4096), and the f32 output bit for bit (both fold
// fmaf(float(acc_g), sw[n,g], facc) in group order, then fmaf(facc, sa, bias)). Then timings (L2
// flushed, median) of gemm_quant (mma.sync) and gemm_quant_wgmma with bf16 out (scales + bias
// fused), cuBLAS bf16 and the per-channel gemm_w8a8_wgmma for reference. Returns markdown rows.
std::string run_wgmma_quant(bool quick, std::mt19937_64& rng, Timer& timer, cublasHandle_t blas, cudaStream_t stream,
                            DevBuf<unsigned long long>& cnt) {
  struct NK { int N, K; };
  std::vector<std::pair<NK, std::vector<int>>> plan;
  if (quick)
    plan = {{{14336, 4096}, {4096}}};
  else
    plan = {{{14336, 4096}, {1024, 4096, 8192}}, {{4096, 14336}, {1024, 4096, 8192}}};
  const pc::QuantMode modes[] = {pc::QuantMode::W8A8_G128, pc::QuantMode::W4A8_G128};
  std::string md =
      "| mode | M | N | K | mma.sync TOPS | wgmma ms | wgmma TOPS | per-channel wgmma TOPS | cuBLAS bf16 TFLOPS | "
      "wgmma/bf16 | wgmma/mma.sync | i32 mismatches | f32 mismatches |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto mismatches = [&](const void* a, const void* b, size_t n) {
    CK(cudaMemsetAsync(cnt.p, 0, 8, stream));
    count_mismatch<<<1024, 256, 0, stream>>>(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), n, cnt.p);
    pc::check_launch("count_mismatch");
    CK(cudaStreamSynchronize(stream));
    return cnt.download()[0];
  };
  for (auto& [nk, mlist] : plan) {
    const int N = nk.N, K = nk.K, Mmax = *std::max_element(mlist.begin(), mlist.end());
    const int G = (K + 127) / 128;
    DevBuf<int8_t> W8(size_t(N) * K), X(size_t(Mmax) * K);
    DevBuf<uint8_t> W4(size_t(N) * K / 2);
    DevBuf<float> sa(Mmax), sw(size_t(N) * G), sw1(N), bias(N), Yf(size_t(Mmax) * N), Yf2(size_t(Mmax) * N);
    DevBuf<uint16_t> Y(size_t(Mmax) * N), Xb(size_t(Mmax) * K), Wb(size_t(N) * K);
    const size_t n32 = size_t(std::min(Mmax, 4096)) * N * G;
    DevBuf<int32_t> A(n32), B(n32);
    pc::fill_random_i8(W8.p, W8.n, rng(), stream);
    pc::fill_random_int4(W4.p, W4.n, rng(), stream);
    pc::fill_random_i8(X.p, X.n, rng(), stream);
    pc::fill_random_bf16(Xb.p, Xb.n, rng(), 1.0f, stream);
    pc::fill_random_bf16(Wb.p, Wb.n, rng(), 0.05f, stream);
    pc::fill_random_f32(sa.p, Mmax, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(sw.p, sw.n, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(sw1.p, N, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(bias.p, N, rng(), -1.0f, 1.0f, stream);
    pc::check_launch("fill");
    for (pc::QuantMode mode : modes) {
      const char* mname = pc::quant_mode_bits(mode).name;
      const void* W = pc::quant_mode_bits(mode).bits == 4 ? static_cast<const void*>(W4.p) : W8.p;
      for (int M : mlist) {
        const double ops = 2.0 * M * double(N) * K;
        unsigned long long bad32 = 0, badf = 0;
        char buf[256];
        if (size_t(M) * N * G <= n32) {
          pc::gemm_quant(mode, X.p, nullptr, W, nullptr, nullptr, A.p, DType::I32, M, N, K, stream);
          CK(cudaMemsetAsync(B.p, 0x55, size_t(M) * N * G * 4, stream));
          pc::gemm_quant_wgmma(mode, X.p, nullptr, W, nullptr, nullptr, B.p, DType::I32, M, N, K, stream);
          bad32 = mismatches(A.p, B.p, size_t(M) * N * G);
          std::snprintf(buf, sizeof buf, "gemm_quant_wgmma %s i32 M=%d N=%d K=%d: %llu/%zu group partials differ from gemm_quant (mma.sync)",
                        mname, M, N, K, bad32, size_t(M) * N * G);
          report(bad32 == 0, buf);
        }
        pc::gemm_quant(mode, X.p, sa.p, W, sw.p, bias.p, Yf.p, DType::F32, M, N, K, stream);
        CK(cudaMemsetAsync(Yf2.p, 0x55, size_t(M) * N * 4, stream));
        pc::gemm_quant_wgmma(mode, X.p, sa.p, W, sw.p, bias.p, Yf2.p, DType::F32, M, N, K, stream);
        badf = mismatches(Yf.p, Yf2.p, size_t(M) * N);
        std::snprintf(buf, sizeof buf, "gemm_quant_wgmma %s f32 M=%d N=%d K=%d: %llu/%zu outputs differ bitwise from gemm_quant (mma.sync)",
                      mname, M, N, K, badf, size_t(M) * N);
        report(badf == 0, buf);
        const double t_mma = timer.median_ms([&] { pc::gemm_quant(mode, X.p, sa.p, W, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream); });
        const double t_wg = timer.median_ms([&] { pc::gemm_quant_wgmma(mode, X.p, sa.p, W, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream); });
        const double t_pc = timer.median_ms([&] { pc::gemm_w8a8_wgmma(X.p, sa.p, W8.p, sw1.p, bias.p, Y.p, DType::BF16, M, N, K, stream); });
        std::string note;
        const double t_bf16 = safe_ms(timer, [&] { pc::cublas_gemm_bf16(blas, Wb.p, Xb.p, Y.p, DType::BF16, M, N, K); },
                                      note, "cuBLAS bf16");
        auto T = [&](double ms) { return ms > 0 ? ops / ms / 1e9 : -1.0; };
        std::printf("%-10s M=%5d N=%5d K=%5d | mma.sync %7.1f | wgmma %8.3f ms %7.1f TOPS | per-channel wgmma %7.1f | "
                    "cuBLAS bf16 %7.1f | wgmma/bf16 %.2fx wgmma/mma.sync %.2fx %s\n",
                    mname, M, N, K, T(t_mma), t_wg, T(t_wg), T(t_pc), T(t_bf16), t_bf16 > 0 ? t_bf16 / t_wg : -1.0,
                    t_mma / t_wg, note.c_str());
        std::fflush(stdout);
        char row[512];
        std::snprintf(row, sizeof row, "| %s | %d | %d | %d | %.0f | %.3f | %.0f | %.0f | %.0f | %.2f | %.2f | %llu | %llu |\n",
                      mname, M, N, K, T(t_mma), t_wg, T(t_wg), T(t_pc), T(t_bf16), t_bf16 > 0 ? t_bf16 / t_wg : -1.0,
                      t_mma / t_wg, bad32, badf);
        md += row;
      }
    }
  }
  return md;
}

void run_wgmma(const std::string& dir, bool quick, std::mt19937_64& rng, const std::string& device) {
  if (!pc::gemm_w8a8_wgmma_supported()) {
    report(false, "gemm_w8a8_wgmma: device is not sm_90, nothing to test");
    return;
  }
  std::printf("== wgmma correctness\n");
  // M, N off the 128/256 tiles; K = 16 (one box, 112 zero-filled bytes), K % 128 != 0.
  const int shapes[][3] = {{1, 2560, 2560}, {7, 1000, 2560}, {130, 2560, 2560}, {1000, 1000, 2560}, {3, 5, 16},
                           {129, 131, 80},  {257, 7, 48},    {129, 300, 272},  {300, 513, 1040},  {200, 1, 32},
                           {1, 8, 16},      {1400, 3400, 144}, {1400, 3400, 16}};  // > 132 tiles: CTAs loop
  for (const char* bn : {(const char*)nullptr, "128", "256", "160"}) {
    set_wgmma_bn(bn);
    const std::string name = std::string("gemm_w8a8_wgmma[BN=") + (bn ? bn : "auto") + "]";
    for (auto& sh : shapes) check_gemm(sh[0], sh[1], sh[2], rng, pc::gemm_w8a8_wgmma, name.c_str());
  }
  set_wgmma_bn(nullptr);
  // Y one element past an allocation: element stores, the same values.
  check_odd_y_offset(pc::gemm_w8a8_wgmma, "gemm_w8a8_wgmma output at an odd element offset matches, out=", rng);
  const int failures_before_timing = g_failures;
  std::printf("== wgmma timing\n");
  struct NK { int N, K; };
  std::vector<std::pair<NK, std::vector<int>>> plan;
  if (quick)
    plan = {{{14336, 4096}, {4096}}};
  else
    plan = {{{14336, 4096}, {128, 1024, 4096, 8192}}, {{4096, 14336}, {128, 1024, 4096, 8192}},
            {{2560, 10240}, {1024, 2048, 4096}}};  // (N 2560: where 160-column tiles save a wave)
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  CB(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  Timer timer(stream);
  if (quick) timer.reps = 5;
  std::string md =
      "| M | N | K | mma.sync TOPS | wgmma ms | wgmma TOPS | BN=128 TOPS | BN=256 TOPS | BN=160 TOPS | wgmma i32-out TOPS | "
      "cuBLAS bf16 TFLOPS | cuBLASLt i8 TOPS | wgmma/bf16 | wgmma/Lt-i8 | int32 mismatches |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  DevBuf<unsigned long long> cnt(1);
  for (auto& [nk, mlist] : plan) {
    const int N = nk.N, K = nk.K, Mmax = *std::max_element(mlist.begin(), mlist.end());
    DevBuf<int8_t> W(size_t(N) * K), X(size_t(Mmax) * K);
    DevBuf<float> sa(Mmax), sw(N), bias(N);
    DevBuf<uint16_t> Y(size_t(Mmax) * N), Xb(size_t(Mmax) * K), Wb(size_t(N) * K);
    DevBuf<int32_t> A(size_t(Mmax) * N), B(size_t(Mmax) * N);
    pc::fill_random_i8(W.p, W.n, rng(), stream);
    pc::fill_random_i8(X.p, X.n, rng(), stream);
    pc::fill_random_bf16(Xb.p, Xb.n, rng(), 1.0f, stream);
    pc::fill_random_bf16(Wb.p, Wb.n, rng(), 0.05f, stream);
    pc::fill_random_f32(sa.p, Mmax, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(sw.p, N, rng(), 1e-3f, 2e-2f, stream);
    pc::fill_random_f32(bias.p, N, rng(), -1.0f, 1.0f, stream);
    pc::check_launch("fill");
    for (int M : mlist) {
      const double ops = 2.0 * M * double(N) * K;
      unsigned long long bad = 0;
      for (const char* bn : {(const char*)nullptr, "128", "256", "160"}) {
        set_wgmma_bn(bn);
        pc::gemm_w8a8(X.p, nullptr, W.p, nullptr, nullptr, A.p, DType::I32, M, N, K, stream);
        CK(cudaMemsetAsync(B.p, 0x55, size_t(M) * N * 4, stream));
        pc::gemm_w8a8_wgmma(X.p, nullptr, W.p, nullptr, nullptr, B.p, DType::I32, M, N, K, stream);
        CK(cudaMemsetAsync(cnt.p, 0, 8, stream));
        count_mismatch<<<1024, 256, 0, stream>>>(A.p, B.p, size_t(M) * N, cnt.p);
        pc::check_launch("count_mismatch");
        CK(cudaStreamSynchronize(stream));
        const unsigned long long b1 = cnt.download()[0];
        bad += b1;
        char buf[256];
        std::snprintf(buf, sizeof buf, "gemm_w8a8_wgmma[BN=%s] i32 M=%d N=%d K=%d: %llu/%zu entries differ from gemm_w8a8 (mma.sync)",
                      bn ? bn : "auto", M, N, K, b1, size_t(M) * N);
        report(b1 == 0, buf);
      }
      auto wg_bf16 = [&] { pc::gemm_w8a8_wgmma(X.p, sa.p, W.p, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream); };
      set_wgmma_bn(nullptr);
      const double t_mma = timer.median_ms([&] { pc::gemm_w8a8(X.p, sa.p, W.p, sw.p, bias.p, Y.p, DType::BF16, M, N, K, stream); });
      const double t_wg = timer.median_ms(wg_bf16);
      const double t_i32 = timer.median_ms([&] { pc::gemm_w8a8_wgmma(X.p, nullptr, W.p, nullptr, nullptr, B.p, DType::I32, M, N, K, stream); });
      set_wgmma_bn("128");
      const double t_128 = timer.median_ms(wg_bf16);
      set_wgmma_bn("256");
      const double t_256 = timer.median_ms(wg_bf16);
      set_wgmma_bn("160");
      const double t_160 = timer.median_ms(wg_bf16);
      set_wgmma_bn(nullptr);
      std::string note;
      const double t_bf16 = safe_ms(timer, [&] { pc::cublas_gemm_bf16(blas, Wb.p, Xb.p, Y.p, DType::BF16, M, N, K); },
                                    note, "cuBLAS bf16");
      double t_lt = -1;
      const pc::LtGemm lt_i8(lt, pc::LtGemmKind::I8_I32, M, N, K, ws_bytes);  // int8 → int32, best heuristic
      if (lt_i8.available())
        t_lt = safe_ms(timer, [&] { lt_i8.run(W.p, X.p, A.p, ws, stream); }, note, "cuBLASLt int8");
      else
        note += lt_i8.note();
      CK(cudaStreamSynchronize(stream));
      auto T = [&](double ms) { return ms > 0 ? ops / ms / 1e9 : -1.0; };
      std::printf("M=%5d N=%5d K=%5d | mma.sync %7.1f | wgmma %8.3f ms %7.1f TOPS (BN128 %7.1f, BN256 %7.1f, BN160 %7.1f, i32 %7.1f) | "
                  "cuBLAS bf16 %7.1f | Lt i8 %7.1f | wgmma/bf16 %.2fx wgmma/Lt %.2fx %s\n",
                  M, N, K, T(t_mma), t_wg, T(t_wg), T(t_128), T(t_256), T(t_160), T(t_i32), T(t_bf16), T(t_lt),
                  t_bf16 > 0 ? t_bf16 / t_wg : -1.0, t_lt > 0 ? t_lt / t_wg : -1.0, note.c_str());
      std::fflush(stdout);
      char row[640];
      std::snprintf(row, sizeof row, "| %d | %d | %d | %.0f | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %llu |\n",
                    M, N, K, T(t_mma), t_wg, T(t_wg), T(t_128), T(t_256), T(t_160), T(t_i32), T(t_bf16), T(t_lt),
                    t_bf16 > 0 ? t_bf16 / t_wg : -1.0, t_lt > 0 ? t_lt / t_wg : -1.0, bad);
      md += row;
    }
  }
  std::printf("== wgmma grouped / int4 (gemm_quant_wgmma)\n");
  std::string md_quant;
  try {
    md_quant = run_wgmma_quant(quick, rng, timer, blas, stream, cnt);
  } catch (const std::exception& e) {  // keep the per-channel results when this part fails
    report(false, std::string("gemm_quant_wgmma part aborted: ") + e.what());
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  md += "\n## Grouped and int4 modes: gemm_quant_wgmma (bf16 out, group scales, sa and bias fused)\n\n"
        "TOPS = 2MNK/t. mma.sync = gemm_quant; per-channel wgmma = gemm_w8a8_wgmma at the same shape (the "
        "ceiling without group folding). Mismatches: vs gemm_quant, whole outputs (i32 partials for M <= 4096).\n\n" +
        md_quant;
  FILE* f = std::fopen((dir + "/lab_cuda_gemm_w8a8_wgmma.md").c_str(), "w");
  if (!f) throw perry::Error("cannot write wgmma results into " + dir);
  std::fprintf(f, "# EXPERIMENTAL wgmma (TMA, warp-specialized) kernel on %s\n\nCUDA events, L2 flushed before each run, "
               "median; TOPS = 2MNK/t. wgmma columns: bf16 out with sa·sw·bias fused (auto BN, then forced 128 / 256), "
               "and int32 out. Ratios: other time / wgmma time (>1 = wgmma faster). Check failures: %d (correctness "
               "shapes: %d)\n\n%s\n## Checks\n\n```\n", device.c_str(), g_failures, failures_before_timing, md.c_str());
  for (auto& l : g_check_lines) std::fprintf(f, "%s\n", l.c_str());
  std::fprintf(f, "```\n");
  std::fclose(f);
}

void write_results(const std::string& dir, const std::vector<Row>& rows, const std::string& device, bool quick) {
  std::string jpath = dir + "/lab_cuda_gemm_w8a8.json", mpath = dir + "/lab_cuda_gemm_w8a8.md";
  FILE* j = std::fopen(jpath.c_str(), "w");
  FILE* md = std::fopen(mpath.c_str(), "w");
  if (!j || !md) throw perry::Error("cannot write results into " + dir);
  std::fprintf(j, "{\n  \"device\": \"%s\",\n  \"kernel\": \"%s\",\n  \"quick\": %s,\n  \"check_failures\": %d,\n",
               device.c_str(), pc::gemm_w8a8_kernel_name(), quick ? "true" : "false", g_failures);
  std::fprintf(j, "  \"timing\": \"CUDA events, 256 MiB L2 flush before each run, median\",\n  \"rows\": [\n");
  std::fprintf(md, "# lab_cuda_gemm_w8a8 on %s\n\nkernel `%s`; CUDA events, L2 flushed before every run, "
               "median; TOPS = 2MNK/t. Ratios are cuBLAS bf16 time / other time (>1 = faster than bf16).\n\n"
               "correctness checks failed: %d\n\n",
               device.c_str(), pc::gemm_w8a8_kernel_name(), g_failures);
  std::fprintf(md, "| M | N | K | perry q+gemm ms | TOPS | perry gemm ms | TOPS | cuBLAS bf16 ms | TFLOPS | cuBLASLt i8 ms | TOPS | q+gemm/bf16 | gemm/bf16 | gemm/Lt-i8 |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(j, "    {\"M\": %d, \"N\": %d, \"K\": %d, \"perry_quant_gemm_ms\": %.5f, \"perry_gemm_ms\": %.5f, "
                 "\"cublas_bf16_ms\": %.5f, \"cublaslt_i8_ms\": %.5f, \"perry_quant_gemm_tops\": %.2f, "
                 "\"perry_gemm_tops\": %.2f, \"cublas_bf16_tflops\": %.2f, \"cublaslt_i8_tops\": %.2f, "
                 "\"note\": \"%s\"}%s\n",
                 r.M, r.N, r.K, r.ms_qgemm, r.ms_gemm, r.ms_bf16, r.ms_lt, tops(r, r.ms_qgemm), tops(r, r.ms_gemm),
                 tops(r, r.ms_bf16), tops(r, r.ms_lt), r.lt_note.c_str(), i + 1 < rows.size() ? "," : "");
    std::fprintf(md, "| %d | %d | %d | %.3f | %.0f | %.3f | %.0f | %.3f | %.0f | %.3f | %.0f | %.2f | %.2f | %.2f |\n",
                 r.M, r.N, r.K, r.ms_qgemm, tops(r, r.ms_qgemm), r.ms_gemm, tops(r, r.ms_gemm), r.ms_bf16,
                 tops(r, r.ms_bf16), r.ms_lt, tops(r, r.ms_lt), r.ms_bf16 / r.ms_qgemm, r.ms_bf16 / r.ms_gemm,
                 r.ms_lt > 0 ? r.ms_lt / r.ms_gemm : -1.0);
  }
  std::fprintf(j, "  ],\n  \"checks\": [\n");
  for (size_t i = 0; i < g_check_lines.size(); ++i)
    std::fprintf(j, "    \"%s\"%s\n", g_check_lines[i].c_str(), i + 1 < g_check_lines.size() ? "," : "");
  std::fprintf(j, "  ]\n}\n");
  std::fprintf(md, "\n## Checks\n\n```\n");
  for (auto& l : g_check_lines) std::fprintf(md, "%s\n", l.c_str());
  std::fprintf(md, "```\n");
  std::fclose(j);
  std::fclose(md);
  std::printf("wrote %s and %s\n", jpath.c_str(), mpath.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  bool quick = false, check_only = false, time_only = false, wgmma = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--check-only") check_only = true;
    else if (a == "--time-only") time_only = true;
    else if (a == "--wgmma") wgmma = true;
    else if (!a.empty() && a[0] != '-' && out_dir.empty()) out_dir = a;
    else {
      std::fprintf(stderr, "usage: %s OUT_DIR [--quick] [--check-only] [--time-only] [--wgmma]\n", argv[0]);
      return 2;
    }
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "usage: %s OUT_DIR [--quick] [--check-only] [--time-only] [--wgmma]\n", argv[0]);
    return 2;
  }
  try {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      std::fprintf(stderr, "no CUDA device: this lab needs a GPU (sm_80 or newer)\n");
      return 3;
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    const std::string device = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                               std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
    std::printf("device: %s\nkernel: %s\n", device.c_str(), pc::gemm_w8a8_kernel_name());
    if (!pc::gemm_w8a8_supported()) {
      std::fprintf(stderr, "gemm_w8a8 needs sm_80 or newer\n");
      return 3;
    }
    std::mt19937_64 rng(20261129);
    if (wgmma) {  // the experimental kernel, in its own process (a fault cannot spoil the main run)
      run_wgmma(out_dir, quick, rng, device);
      std::printf("== wgmma %s: %d check failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
      return g_failures ? 1 : 0;
    }
    if (!time_only) {
      std::printf("== correctness\n");
      check_errors();
      for (DType in : {DType::F32, DType::BF16})
        for (auto [M, K] : std::vector<std::pair<int, int>>{{1, 16}, {7, 100}, {9, 4096}, {130, 2560}, {64, 14336}, {3, 4100}})
          check_quantize(M, K, in, rng);
      for (int M : {1, 7, 130, 1000})
        for (int N : {2560, 1000})
          for (int K : {2560, 4096}) check_gemm(M, N, K, rng);
      // Edge shapes: K = 16 (one partial k-tile), K not a multiple of the 64 k-tile, odd N.
      check_gemm(3, 5, 16, rng);
      check_gemm(129, 131, 80, rng);
      check_gemm(257, 7, 48, rng);
      check_gemm(200, 1, 32, rng);
      std::printf("== correctness: %d failure(s)\n", g_failures);
    }
    std::vector<Row> rows;
    if (!check_only) {
      std::printf("== timing%s\n", quick ? " (quick)" : "");
      rows = run_timing(quick, rng);
    }
    write_results(out_dir, rows, device, quick);
    std::printf("== %s: %d check failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    report(false, std::string("lab aborted: ") + e.what());
    try {
      write_results(out_dir, g_rows, "(aborted run)", quick);
    } catch (...) {
    }
    return 1;
  }
}
