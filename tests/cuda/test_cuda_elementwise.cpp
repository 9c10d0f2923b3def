// CUDA elementwise / normalization kernels (src/kernels/cuda/elementwise.h) against the CPU
// kernels (kernels::ref::*, embedding_lookup, quant::quantize_row_ref) on fresh random data,
// unaligned widths and offset (misaligned) pointers for the scalar paths. Outputs are poisoned
// first (NaN, bf16 NaN, int8 -128 which the quantization rule never produces) so an element the
// kernel forgot to write cannot pass.
//
// Tolerances: the GPU RMSNorm sums in double and computes inv exactly like ref::rms_norm, so its
// fp32 output is expected bit-identical to the reference (>= 99% of elements required, the rest
// within 1e-5 relative: a flipped rounding of inv moves y by ~1 ulp). SwiGLU uses CUDA expf
// (<= 2 ulp) against glibc's: a few ulp, checked at 1e-5 relative. bf16 outputs must be exactly
// the host RNE of the GPU's own fp32 result, and within 1 bf16 ulp of the CPU. int8 outputs must
// be byte-exact against quantize_per_token / quantize_row_ref of the GPU's own fp32 result;
// against the CPU pipeline only rare +-1 (<= 0.1%) are allowed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "quant/quant.h"
namespace pc = perry::cuda;  // before cuda_test_util.h, which names it
#include "cuda/cuda_test_util.h"

namespace kc = perry::kernels;
using perry::DType;
using pc::ActOut;

namespace {
using namespace perry::cuda::testing;

const std::vector<int> kWidths = {96, 1000, 4096};
const std::vector<int> kRows = {1, 3, 37};

void device_sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

std::vector<float> normal(size_t n, std::mt19937& g, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A device buffer poisoned with `poison`, optionally offset by one element so the kernels must
// take their scalar (unaligned) path.
template <typename T>
struct Out {
  Dev<T> d;
  size_t off;
  Out(size_t n, T poison, bool misalign) : d(std::vector<T>(n + 1, poison)), off(misalign ? 1 : 0) {}
  T* p() { return d.p + off; }
  std::vector<T> get() const {
    auto h = d.get();
    return std::vector<T>(h.begin() + off, h.begin() + off + (h.size() - 1));
  }
};
template <typename T>
Dev<T> upload(const std::vector<T>& h, bool misalign) {
  std::vector<T> v(h.size() + 1);
  std::copy(h.begin(), h.end(), v.begin() + (misalign ? 1 : 0));
  return Dev<T>(v);
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

// fp32 GPU vs reference: every element written, <= 1e-5 relative, and `min_exact` of them
// bit-identical.
void expect_f32_close(const std::vector<float>& got, const std::vector<float>& ref, double min_exact,
                      const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  size_t exact = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_float(got[i], ref[i])) {
      ++exact;
      continue;
    }
    if (!(std::fabs(double(got[i]) - ref[i]) <= 1e-5 * std::fabs(double(ref[i])))) {
      if (bad++ < 5) ADD_FAILURE() << what << " [" << i << "]: gpu " << got[i] << " ref " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GE(double(exact), min_exact * double(got.size())) << what << ": " << exact << "/" << got.size()
                                                          << " bit-exact";
}

// bf16 GPU output: exactly the host RNE of the GPU's own fp32 values, within 1 bf16 ulp of ref.
void expect_bf16(const std::vector<uint16_t>& got, const std::vector<float>& gpu_f32, const std::vector<float>& ref,
                 const char* what) {
  ASSERT_EQ(got.size(), gpu_f32.size());
  size_t bad_round = 0, bad_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint16_t want = perry::f32_to_bf16(gpu_f32[i]);
    bad_round += got[i] != want && !(std::isnan(gpu_f32[i]) && std::isnan(perry::bf16_to_f32(got[i])));
    const double r = ref[i], g = perry::bf16_to_f32(got[i]);
    if (std::isnan(r)) {
      bad_ref += !std::isnan(g);
    } else if (r != 0.0) {
      bad_ref += !(std::fabs(g - r) <= std::ldexp(1.0, std::ilogb(r) - 7));
    } else {
      bad_ref += g != 0.0;
    }
  }
  EXPECT_EQ(bad_round, 0u) << what << ": bf16 bits differ from host RNE of the GPU fp32 output";
  EXPECT_EQ(bad_ref, 0u) << what << ": bf16 more than 1 ulp from the CPU reference";
}

// int8 GPU output [M, K] + scales: byte/bit-exact vs quantize_row_ref(gpu fp32) and vs
// quantize_per_token(gpu fp32) on the device; vs quantize_row_ref(cpu ref) only rare +-1.
void expect_i8(const std::vector<int8_t>& q, const std::vector<float>& s, const std::vector<float>& gpu_f32,
               const std::vector<float>& ref, int M, int K, const char* what) {
  std::vector<int8_t> qg(q.size()), qc(q.size());
  std::vector<float> sg(M), sc(M);
  for (int m = 0; m < M; ++m) {
    sg[m] = perry::quant::quantize_row_ref(&gpu_f32[size_t(m) * K], K, &qg[size_t(m) * K]);
    sc[m] = perry::quant::quantize_row_ref(&ref[size_t(m) * K], K, &qc[size_t(m) * K]);
  }
  // The unfused GPU pipeline: quantize_per_token of the same fp32 values.
  Dev<float> dx(gpu_f32);
  Dev<int8_t> dq(std::vector<int8_t>(q.size(), int8_t(-128)));
  Dev<float> ds(std::vector<float>(M, NAN));
  pc::quantize_per_token(dx.p, DType::F32, M, K, dq.p, ds.p, nullptr);
  device_sync();
  const auto qu = dq.get();
  const auto su = ds.get();
  size_t bad_g = 0, bad_u = 0, off1 = 0, off_big = 0, poison = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    poison += q[i] == -128;
    bad_g += q[i] != qg[i];
    bad_u += q[i] != qu[i];
    const int d = std::abs(int(q[i]) - int(qc[i]));
    off1 += d == 1;
    off_big += d > 1;
  }
  EXPECT_EQ(poison, 0u) << what << ": unwritten int8 elements";
  EXPECT_EQ(bad_g, 0u) << what << ": fused int8 != quantize_row_ref of the GPU fp32 row";
  EXPECT_EQ(bad_u, 0u) << what << ": fused int8 != quantize_per_token of the GPU fp32 row";
  EXPECT_EQ(off_big, 0u) << what << ": int8 off by more than 1 from the CPU pipeline";
  EXPECT_LE(double(off1), 1e-3 * double(q.size()) + 2.0) << what << ": " << off1 << " elements off by 1";
  for (int m = 0; m < M; ++m) {
    EXPECT_TRUE(std::memcmp(&s[m], &sg[m], 4) == 0) << what << " row " << m << ": scale " << s[m] << " vs " << sg[m];
    EXPECT_TRUE(std::memcmp(&s[m], &su[m], 4) == 0) << what << " row " << m << ": scale " << s[m] << " vs " << su[m];
    EXPECT_NEAR(s[m], sc[m], 1e-5 * std::fabs(sc[m])) << what << " row " << m;
  }
}

// Rows for the norm tests: random with outliers, row 1 all zero, row 2 with a NaN (the whole
// normalized row is NaN then; the int8 rule maps it to scale 0, q 0 on both sides).
std::vector<float> norm_input(int M, int H, std::mt19937& g) {
  auto x = normal(size_t(M) * H, g, 2.f);
  for (int m = 0; m < M; ++m) x[size_t(m) * H + (m * 7) % H] *= 30.f;
  if (M > 1) std::fill(x.begin() + H, x.begin() + 2 * H, 0.f);
  if (M > 2) x[size_t(2) * H + 5] = NAN;
  return x;
}

// How add_rms_norm gets its delta: fp32, fp32 with round_delta, or bf16 bits (a residual linear
// that wrote bf16). The last two must give the same bits: the CPU side rounds delta to bf16 first.
enum class DeltaForm { F32, F32Rounded, Bf16 };

// Runs (add_)rms_norm in all three formats and checks each against the CPU reference.
void check_norm(int M, int H, bool fused_add, bool misalign, std::mt19937& g, DeltaForm form = DeltaForm::F32) {
  SCOPED_TRACE(::testing::Message() << "M=" << M << " H=" << H << " add=" << fused_add << " misalign=" << misalign
                                    << " delta form " << int(form));
  const float eps = 1e-6f;
  auto x = norm_input(M, H, g);
  auto delta = normal(x.size(), g, 0.5f);
  auto w = normal(H, g, 0.3f);
  for (auto& v : w) v += 1.f;
  // CPU: x (+ delta) then ref::rms_norm (double sums, like the GPU).
  std::vector<float> xs = x;
  std::vector<uint16_t> delta_bf16(delta.size());
  for (size_t i = 0; i < delta.size(); ++i) delta_bf16[i] = perry::f32_to_bf16(delta[i]);
  std::vector<float> delta_used = delta;
  if (form != DeltaForm::F32)
    for (size_t i = 0; i < delta.size(); ++i) delta_used[i] = perry::bf16_to_f32(delta_bf16[i]);
  if (fused_add) kc::ref::add_inplace(xs.data(), delta_used.data(), int64_t(xs.size()));
  std::vector<float> ref(x.size());
  kc::ref::rms_norm(xs.data(), w.data(), eps, M, H, ref.data());

  auto dw = upload(w, misalign);
  auto dd = upload(delta, misalign);
  auto ddb = upload(delta_bf16, misalign);
  const size_t o = misalign ? 1 : 0;
  auto run = [&](ActOut out) {
    auto dx = upload(x, misalign);
    if (fused_add && form == DeltaForm::Bf16)
      pc::add_rms_norm(dx.p + o, ddb.p + o, dw.p + o, eps, M, H, out, nullptr);
    else if (fused_add)
      pc::add_rms_norm(dx.p + o, dd.p + o, dw.p + o, eps, M, H, out, nullptr, form == DeltaForm::F32Rounded);
    else
      pc::rms_norm(dx.p + o, dw.p + o, eps, M, H, out, nullptr);
    device_sync();
    auto hx = dx.get();
    std::vector<float> xout(hx.begin() + o, hx.begin() + o + x.size());
    size_t bad = 0;  // the residual stream: exactly x + delta (or untouched)
    for (size_t i = 0; i < x.size(); ++i) bad += !same_float(xout[i], xs[i]);
    EXPECT_EQ(bad, 0u) << "residual x after the call";
  };
  Out<float> yf(x.size(), NAN, misalign);
  run(ActOut::f32(yf.p()));
  const auto y = yf.get();
  expect_f32_close(y, ref, 0.99, "rms_norm f32");

  Out<uint16_t> yb(x.size(), 0xffff, misalign);
  run(ActOut::bf16(yb.p()));
  expect_bf16(yb.get(), y, ref, "rms_norm bf16");

  Out<int8_t> yq(x.size(), int8_t(-128), misalign);
  Out<float> ys(M, NAN, false);
  run(ActOut::i8(yq.p(), ys.p()));
  expect_i8(yq.get(), ys.get(), y, ref, M, H, "rms_norm i8");
}

TEST(CudaElementwise, RmsNormAllFormatsMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 g(11);
  for (int H : kWidths)
    for (int M : kRows) check_norm(M, H, false, false, g);
  check_norm(5, 8192, false, false, g);
  check_norm(3, 4096, false, true, g);  // misaligned pointers: scalar path
  check_norm(3, 1001, false, true, g);
  // Rows wider than 4 vectors a thread (1024 threads): the multi-pass kernels, not the
  // register-cached ones — vector and scalar.
  check_norm(2, 20000, false, false, g);
  check_norm(2, 5001, false, true, g);
}

TEST(CudaElementwise, AddRmsNormAllFormatsMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 g(12);
  for (int H : kWidths)
    for (int M : kRows) check_norm(M, H, true, false, g);
  check_norm(2, 8192, true, false, g);
  check_norm(3, 4096, true, true, g);
  check_norm(2, 20000, true, false, g);  // multi-pass (see above)
  check_norm(2, 5001, true, true, g);
  // The bf16-delta forms (residual deltas rounded to bf16): vector, scalar and multi-pass paths.
  for (DeltaForm f : {DeltaForm::F32Rounded, DeltaForm::Bf16}) {
    for (int M : kRows) check_norm(M, 4096, true, false, g, f);
    check_norm(3, 4096, true, true, g, f);
    check_norm(2, 20000, true, false, g, f);
    check_norm(2, 5001, true, true, g, f);
  }
}

TEST(CudaElementwise, HeadRmsNormInPlaceWithStride) {
  REQUIRE_GPU();
  std::mt19937 g(13);
  for (int hd : {16, 64, 80, 128, 256})
    for (int M : kRows)
      for (int nh : {1, 8}) {
        SCOPED_TRACE(::testing::Message() << "hd=" << hd << " M=" << M << " nh=" << nh);
        const int64_t stride = int64_t(nh) * hd + 3 * hd + 1;  // q inside a wider (QKV) row
        auto x = normal(size_t(M) * stride, g, 1.5f);
        auto w = rand_f(hd, g, 0.5f, 1.5f);
        std::vector<float> ref = x;
        for (int m = 0; m < M; ++m)
          kc::ref::rms_norm(&x[size_t(m) * stride], w.data(), 1e-6f, nh, hd, &ref[size_t(m) * stride]);
        Dev<float> dx(x), dw(w);
        pc::head_rms_norm(dx.p, stride, M, nh, hd, dw.p, 1e-6f, nullptr);
        device_sync();
        // ref holds x outside the heads: the columns past nh*hd must be untouched.
        expect_f32_close(dx.get(), ref, 0.99, "head_rms_norm");
      }
}

// RoPE on q and k (each inside a wider row) against ref::rope_apply with the same table.
void check_rope(const kc::RopeTable& table, int M, int nq, int nk, std::mt19937& g) {
  const int hd = table.head_dim();
  SCOPED_TRACE(::testing::Message() << "hd=" << hd << " M=" << M << " nq=" << nq << " nk=" << nk);
  pc::DeviceRopeTable dt(table.cos(0), table.sin(0), hd, table.max_positions());
  const int64_t qs = int64_t(nq) * hd + 2 * hd + 4, ks = int64_t(nk) * hd + 4;
  auto q = normal(size_t(M) * qs, g), k = normal(size_t(M) * ks, g);
  std::vector<int32_t> pos(M);
  std::uniform_int_distribution<int32_t> pd(0, int32_t(table.max_positions() - 1));
  for (auto& p : pos) p = pd(g);
  pos[0] = int32_t(table.max_positions() - 1);
  if (M > 1) pos[1] = 0;
  std::vector<float> qr = q, kr = k;
  kc::ref::rope_apply(qr.data(), M, nq, qs, 0, table, pos.data());
  kc::ref::rope_apply(kr.data(), M, nk, ks, 0, table, pos.data());
  Dev<float> dq(q), dk(k);
  Dev<int32_t> dp(pos);
  pc::rope_apply(dq.p, qs, nq, dk.p, ks, nk, M, dp.p, dt.view(), nullptr);
  device_sync();
  // a*c - b*s cancels: relative error per element is meaningless, so bound the error by the pair's
  // magnitude (~8 ulp of |a|+|b|). The scalar reference does the same separately rounded
  // operations, so the results should be bit-identical; the count is printed, not required (a CPU
  // build that contracts into FMA would differ by an ulp and still be right).
  auto cmp = [&](const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& in,
                 int64_t stride, int nh, const char* what) {
    size_t exact = 0, bad = 0;
    for (int m = 0; m < M; ++m)
      for (int64_t c = 0; c < stride; ++c) {
        const size_t i = size_t(m) * stride + c;
        if (same_float(got[i], ref[i])) {
          ++exact;
          continue;
        }
        double tol = 0.0;  // columns past the heads must be untouched
        if (c < int64_t(nh) * hd) {
          const size_t a = size_t(m) * stride + (c / hd) * hd + (c % hd) % (hd / 2), b = a + hd / 2;
          tol = 5e-7 * (std::fabs(in[a]) + std::fabs(in[b]));
        }
        if (!(std::fabs(double(got[i]) - ref[i]) <= tol) && bad++ < 5)
          ADD_FAILURE() << what << " m=" << m << " col " << c << ": gpu " << got[i] << " ref " << ref[i];
      }
    EXPECT_EQ(bad, 0u) << what;
    std::printf("%s: %zu/%zu bit-identical to ref::rope_apply\n", what, exact, got.size());
  };
  cmp(dq.get(), qr, q, qs, nq, "rope q");
  cmp(dk.get(), kr, k, ks, nk, "rope k");
}

TEST(CudaElementwise, RopeMatchesCpuPlainAndLlama3) {
  REQUIRE_GPU();
  std::mt19937 g(14);
  kc::RopeTable llama3(128, 500000.0, 8192, kc::Llama3RopeScaling{});
  kc::RopeTable qwen(128, 1000000.0, 4096);
  kc::RopeTable small(64, 10000.0, 512);
  for (int M : kRows) {
    check_rope(llama3, M, 32, 8, g);
    check_rope(qwen, M, 16, 2, g);
    check_rope(small, M, 3, 1, g);
  }
}

TEST(CudaElementwise, RopeQOnlyAndBadPositionGivesNaNRow) {
  REQUIRE_GPU();
  std::mt19937 g(15);
  kc::RopeTable table(64, 10000.0, 100);
  pc::DeviceRopeTable dt(table.cos(0), table.sin(0), 64, 100);
  pc::DeviceRopeTable moved = std::move(dt);  // ownership moves, the table stays valid
  const int M = 3, nq = 2, hd = 64;
  auto q = normal(size_t(M) * nq * hd, g);
  std::vector<int32_t> pos = {7, 100, -1};  // rows 1 and 2 are out of range
  std::vector<float> qr = q;
  kc::ref::rope_apply(qr.data(), 1, nq, nq * hd, 0, table, pos.data());
  Dev<float> dq(q);
  Dev<int32_t> dp(pos);
  pc::rope_apply(dq.p, nq * hd, nq, nullptr, 0, 0, M, dp.p, moved.view(), nullptr);
  device_sync();
  auto got = dq.get();
  for (int c = 0; c < nq * hd; ++c) EXPECT_TRUE(same_float(got[c], qr[c])) << c;
  for (size_t i = size_t(nq) * hd; i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << i;
}

// SwiGLU over gu [M, 2I]: CPU = ref::silu_mul(gate row, up row). bf16_in: gu given to the GPU
// as bf16 bits (a gate|up linear with bf16 output), the CPU reference on the same rounded values.
void check_swiglu(int M, int I, bool misalign, std::mt19937& g, bool bf16_in = false) {
  SCOPED_TRACE(::testing::Message() << "M=" << M << " I=" << I << " misalign=" << misalign << " bf16 in=" << bf16_in);
  auto gu = normal(size_t(M) * 2 * I, g, 3.f);
  gu[0] = -100.f;  // exp(100) overflows to inf: silu -> -0
  gu[1] = 100.f;
  gu[2] = 0.f;
  if (M > 1) std::fill(gu.begin() + 2 * I + I, gu.begin() + 4 * I, 0.f);  // row 1: up = 0 -> scale 0
  std::vector<uint16_t> gu16(gu.size());
  const std::vector<float> gu_f32 = gu;  // before rounding (the round_to_bf16 form's input)
  if (bf16_in)
    for (size_t i = 0; i < gu.size(); ++i) {
      gu16[i] = perry::f32_to_bf16(gu[i]);
      gu[i] = perry::bf16_to_f32(gu16[i]);  // the values the GPU sees
    }
  std::vector<float> ref(size_t(M) * I);
  for (int m = 0; m < M; ++m)
    kc::ref::silu_mul(&gu[size_t(m) * 2 * I], &gu[size_t(m) * 2 * I + I], I, &ref[size_t(m) * I]);
  auto dgu = upload(gu, misalign);
  auto dgu16 = upload(gu16, misalign);
  const float* in = dgu.p + (misalign ? 1 : 0);
  const uint16_t* in16 = dgu16.p + (misalign ? 1 : 0);
  auto run = [&](ActOut out) {
    if (bf16_in) pc::swiglu(in16, M, I, out, nullptr);
    else pc::swiglu(in, M, I, out, nullptr);
  };
  Out<float> yf(ref.size(), NAN, misalign);
  run(ActOut::f32(yf.p()));
  Out<uint16_t> yb(ref.size(), 0xffff, misalign);
  run(ActOut::bf16(yb.p()));
  Out<int8_t> yq(ref.size(), int8_t(-128), misalign);
  Out<float> ys(M, NAN, false);
  run(ActOut::i8(yq.p(), ys.p()));
  device_sync();
  const auto y = yf.get();
  expect_f32_close(y, ref, 0.0, "swiglu f32");  // expf vs glibc: not bit-exact by design
  expect_bf16(yb.get(), y, ref, "swiglu bf16");
  expect_i8(yq.get(), ys.get(), y, ref, M, I, "swiglu i8");
  if (bf16_in) {  // fp32 gate|up with round_to_bf16: the same bits as from the bf16 gate|up
    auto d32 = upload(gu_f32, misalign);
    const float* in32 = d32.p + (misalign ? 1 : 0);
    Out<float> rf(ref.size(), NAN, misalign);
    pc::swiglu(in32, M, I, ActOut::f32(rf.p()), nullptr, true);
    Out<int8_t> rq(ref.size(), int8_t(-128), misalign);
    Out<float> rs(M, NAN, false);
    pc::swiglu(in32, M, I, ActOut::i8(rq.p(), rs.p()), nullptr, true);
    device_sync();
    const std::vector<float> a = rf.get(), as = rs.get(), bs = ys.get();
    const std::vector<int8_t> aq = rq.get(), bq = yq.get();
    size_t diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += !same_float(a[i], y[i]) || aq[i] != bq[i];
    for (int m = 0; m < M; ++m) diff += !same_float(as[m], bs[m]);
    EXPECT_EQ(diff, 0u) << "round_to_bf16 vs bf16 input";
  }
}

TEST(CudaElementwise, SwigluAllFormatsMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 g(16);
  for (int I : kWidths)
    for (int M : kRows) check_swiglu(M, I, false, g);
  check_swiglu(3, 14336, false, g);
  check_swiglu(2, 28672, false, g);
  check_swiglu(3, 4096, true, g);
  check_swiglu(3, 1001, true, g);
  check_swiglu(2, 5001, true, g);  // scalar, more than 4 elements a thread: multi-pass
  // bf16 gate|up: the vector path (8-byte loads), a misaligned start (the scalar path), the
  // Llama-3-8B width, multi-pass.
  for (int I : kWidths) check_swiglu(3, I, false, g, true);
  check_swiglu(3, 14336, false, g, true);
  check_swiglu(3, 4096, true, g, true);
  check_swiglu(2, 5001, true, g, true);
}

TEST(CudaElementwise, EmbeddingLookupExactAllDtypes) {
  REQUIRE_GPU();
  std::mt19937 g(17);
  const int64_t vocab = 300;
  for (int H : kWidths)
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << "H=" << H << " dtype=" << perry::dtype_name(dt));
      auto t = normal(size_t(vocab) * H, g);
      std::vector<uint16_t> t16(t.size());
      for (size_t i = 0; i < t.size(); ++i) t16[i] = dt == DType::F16 ? perry::f32_to_f16(t[i]) : perry::f32_to_bf16(t[i]);
      const void* host = dt == DType::F32 ? static_cast<const void*>(t.data()) : t16.data();
      Dev<float> d32(dt == DType::F32 ? t : std::vector<float>{});
      Dev<uint16_t> d16(dt == DType::F32 ? std::vector<uint16_t>{} : t16);
      const void* dev = dt == DType::F32 ? static_cast<const void*>(d32.p) : d16.p;
      for (int M : kRows) {
        std::vector<int32_t> tok(M);
        std::uniform_int_distribution<int32_t> td(0, int32_t(vocab - 1));
        for (auto& v : tok) v = td(g);
        tok[0] = int32_t(vocab - 1);
        std::vector<float> ref(size_t(M) * H);
        kc::embedding_lookup(host, dt, H, tok.data(), M, ref.data(), vocab);
        Dev<int32_t> dtok(tok);
        Dev<float> out(std::vector<float>(ref.size(), NAN));
        pc::embedding_lookup(dev, dt, H, dtok.p, M, out.p, nullptr, vocab);
        device_sync();
        auto got = out.get();
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &ref[i], 4) != 0;
        EXPECT_EQ(bad, 0u) << "M=" << M;
      }
      // Out-of-range ids give NaN rows, the valid row in between is still exact.
      std::vector<int32_t> tok = {-1, 5, int32_t(vocab)};
      Dev<int32_t> dtok(tok);
      Dev<float> out(std::vector<float>(size_t(3) * H, 0.f));
      pc::embedding_lookup(dev, dt, H, dtok.p, 3, out.p, nullptr, vocab);
      device_sync();
      auto got = out.get();
      std::vector<float> ref(H);
      kc::embedding_lookup(host, dt, H, &tok[1], 1, ref.data(), vocab);
      for (int j = 0; j < H; ++j) {
        EXPECT_TRUE(std::isnan(got[j]) && std::isnan(got[size_t(2) * H + j])) << j;
        EXPECT_TRUE(same_float(got[size_t(H) + j], ref[j])) << j;
      }
    }
}

TEST(CudaElementwise, ResidualAddAndBf16ConversionExact) {
  REQUIRE_GPU();
  std::mt19937 g(18);
  for (int64_t n : {int64_t(1), int64_t(1001), int64_t(3) << 20}) {
    auto x = normal(size_t(n), g), d = normal(size_t(n), g);
    x[0] = n > 1 ? NAN : x[0];
    if (n > 8) {
      x[1] = INFINITY, x[2] = -INFINITY, x[3] = 1.00390625f;  // exact bf16 tie -> even (1.0)
      x[4] = 1.01171875f, x[5] = 3.4e38f, x[6] = 1e-40f, x[7] = -0.f;  // tie -> up; near max; denormal
    }
    Dev<float> dx(x), dd(d);
    Dev<uint16_t> db(std::vector<uint16_t>(size_t(n), 0xffff));
    pc::f32_to_bf16(dx.p, db.p, n, nullptr);
    pc::residual_add(dx.p, dd.p, n, nullptr);
    // The bf16-delta forms: fp32 delta rounded by the add, and bf16 bits; both x + bf16(d).
    std::vector<uint16_t> d16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) d16[size_t(i)] = perry::f32_to_bf16(d[size_t(i)]);
    Dev<float> dx_r(x), dx_b(x);
    Dev<uint16_t> dd16(d16);
    pc::residual_add(dx_r.p, dd.p, n, nullptr, true);
    pc::residual_add(dx_b.p, dd16.p, n, nullptr);
    device_sync();
    auto b = db.get();
    auto s = dx.get();
    auto sr = dx_r.get(), sb = dx_b.get();
    size_t bad_b = 0, bad_s = 0, bad_r = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad_b += b[i] != perry::f32_to_bf16(x[i]);
      bad_s += !same_float(s[i], x[i] + d[i]);
      const float want = x[i] + perry::bf16_to_f32(d16[size_t(i)]);
      bad_r += !same_float(sr[i], want) + !same_float(sb[i], want);
    }
    EXPECT_EQ(bad_b, 0u) << "n=" << n;
    EXPECT_EQ(bad_s, 0u) << "n=" << n;
    EXPECT_EQ(bad_r, 0u) << "n=" << n << " (bf16 delta forms)";
  }
}

TEST(CudaElementwise, ArgmaxRowsExact) {
  REQUIRE_GPU();
  std::mt19937 g(19);
  for (int64_t vocab : {int64_t(1), int64_t(1000), int64_t(151936)}) {
    const int rows = 7;
    auto l = normal(size_t(rows) * vocab, g, 4.f);
    std::vector<int32_t> want(rows);
    if (vocab > 100) {
      float* r1 = &l[size_t(vocab)];  // ties: the lowest index wins
      r1[70] = r1[40] = r1[vocab - 1] = 100.f;
      float* r2 = &l[size_t(2) * vocab];  // a NaN first is never picked
      r2[0] = NAN;
      r2[vocab - 2] = 50.f;
      std::fill(l.begin() + 3 * vocab, l.begin() + 4 * vocab, -INFINITY);  // all -inf -> 0
      float* r4 = &l[size_t(4) * vocab];
      r4[vocab - 1] = 1e30f;
    }
    if (vocab > 5000) {  // a tie across blocks (2048 logits each): the lower index, in block 1
      float* r5 = &l[size_t(5) * vocab];
      r5[4100] = r5[2100] = r5[vocab - 3] = 77.f;
    }
    for (int r = 0; r < rows; ++r) {
      const float* row = &l[size_t(r) * vocab];
      int best = -1;
      for (int64_t i = 0; i < vocab; ++i)
        if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = int(i);
      want[r] = best < 0 ? 0 : best;
      if (r != 2 || vocab <= 100) {  // std::max_element agrees wherever no NaN is involved
        EXPECT_EQ(want[r], int(std::max_element(row, row + vocab) - row));
      }
    }
    if (vocab > 5000) {
      EXPECT_EQ(want[5], 2100);
    }
    Dev<float> dl(l);
    Dev<int32_t> out(std::vector<int32_t>(rows, -7));
    // The scratch zeroed once; each call leaves it zeroed for the next (three calls below).
    Dev<uint8_t> scratch(std::vector<uint8_t>(pc::argmax_scratch_bytes(rows, vocab), 0));
    pc::argmax_rows(dl.p, rows, vocab, out.p, scratch.p, nullptr);
    device_sync();
    EXPECT_EQ(out.get(), want) << "vocab=" << vocab;
    // Fewer rows on the same scratch: rows 2.. of the next calls still count from zero.
    Dev<int32_t> out1(std::vector<int32_t>(2, -7));
    pc::argmax_rows(dl.p, 2, vocab, out1.p, scratch.p, nullptr);
    device_sync();
    EXPECT_EQ(out1.get(), std::vector<int32_t>(want.begin(), want.begin() + 2)) << "vocab=" << vocab;
    // With a feed: the same tokens, also written as the next step's input — row r's token, its
    // position and its sequence's pos0 one further; the other fields untouched.
    std::vector<int32_t> tok(rows, -1), pos(rows);
    std::vector<pc::AttnSeq> seq(rows);
    for (int r = 0; r < rows; ++r) pos[r] = 10 * r + 3, seq[r] = pc::AttnSeq{r, 1, 10 * r + 3, 6 - r};
    // The embedding rows too: a bf16 table [vocab, 24] of distinct values, each fed row of x the
    // picked token's row widened exactly (what embedding_lookup writes).
    const int hidden = 24;
    std::vector<uint16_t> table(size_t(vocab) * hidden);
    for (size_t i = 0; i < table.size(); ++i) table[i] = perry::f32_to_bf16(float(int(i % 4093) - 2046) / 64.f);
    Dev<uint16_t> dtable(table);
    Dev<float> dx(std::vector<float>(size_t(rows) * hidden, -3.f));
    Dev<int32_t> dtok(tok), dpos(pos), out2(std::vector<int32_t>(rows, -7));
    Dev<pc::AttnSeq> dseq(seq);
    pc::GreedyFeed feed{dtok.p, dpos.p, dseq.p};
    feed.x = dx.p, feed.table = dtable.p, feed.table_dtype = DType::BF16, feed.hidden = hidden;
    pc::argmax_rows(dl.p, rows, vocab, out2.p, scratch.p, nullptr, feed);
    device_sync();
    EXPECT_EQ(out2.get(), want);
    EXPECT_EQ(dtok.get(), want);
    const std::vector<float> x_after = dx.get();
    size_t bad_x = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < hidden; ++c)
        bad_x += !same_float(x_after[size_t(r) * hidden + c],
                             perry::bf16_to_f32(table[size_t(want[size_t(r)]) * hidden + c]));
    EXPECT_EQ(bad_x, 0u) << "vocab=" << vocab;
    const std::vector<int32_t> pos_after = dpos.get();
    const std::vector<pc::AttnSeq> seq_after = dseq.get();
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(pos_after[size_t(r)], 10 * r + 4);
      EXPECT_EQ(seq_after[size_t(r)].pos0, 10 * r + 4);
      EXPECT_EQ(seq_after[size_t(r)].q_row, r);
      EXPECT_EQ(seq_after[size_t(r)].n_new, 1);
      EXPECT_EQ(seq_after[size_t(r)].slot, 6 - r);
    }
  }
}

TEST(CudaElementwise, BadArgumentsThrow) {
  REQUIRE_GPU();
  Dev<float> a(64), b(64), s(4);
  Dev<int8_t> q(64);
  Dev<int32_t> t(4);
  const float* w = b.p;
  EXPECT_THROW(pc::rms_norm(nullptr, w, 1e-6f, 1, 16, ActOut::f32(a.p), nullptr), perry::Error);
  EXPECT_THROW(pc::rms_norm(a.p, w, 1e-6f, 1, 0, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::rms_norm(a.p, w, 1e-6f, -1, 16, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::rms_norm(a.p, w, 1e-6f, 1, 16, ActOut::i8(q.p, nullptr), nullptr), perry::Error);
  EXPECT_THROW(pc::rms_norm(a.p, w, 1e-6f, 1, 16, ActOut{}, nullptr), perry::Error);
  EXPECT_THROW(pc::rms_norm(a.p, w, -1.f, 1, 16, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::add_rms_norm(a.p, static_cast<const float*>(nullptr), w, 1e-6f, 1, 16, ActOut::f32(b.p), nullptr),
               perry::Error);
  EXPECT_THROW(pc::add_rms_norm(a.p, static_cast<const uint16_t*>(nullptr), w, 1e-6f, 1, 16, ActOut::f32(b.p),
                                nullptr),
               perry::Error);
  EXPECT_THROW(pc::swiglu(a.p, 1, 0, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::swiglu(static_cast<const float*>(nullptr), 1, 8, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::swiglu(static_cast<const uint16_t*>(nullptr), 1, 8, ActOut::f32(b.p), nullptr), perry::Error);
  EXPECT_THROW(pc::head_rms_norm(a.p, 8, 1, 1, 16, w, 1e-6f, nullptr), perry::Error);     // stride < hd
  EXPECT_THROW(pc::head_rms_norm(a.p, 2048, 1, 1, 2048, w, 1e-6f, nullptr), perry::Error);  // hd > 1024
  EXPECT_THROW(pc::embedding_lookup(a.p, DType::I8, 16, t.p, 1, b.p, nullptr), perry::Error);
  EXPECT_THROW(pc::embedding_lookup(a.p, DType::F32, 0, t.p, 1, b.p, nullptr), perry::Error);
  EXPECT_THROW(pc::DeviceRopeTable(a.p, b.p, 7, 4), perry::Error);  // odd head_dim
  pc::RopeTableView v{a.p, b.p, 8, 4};
  EXPECT_THROW(pc::rope_apply(a.p, 4, 1, nullptr, 0, 0, 1, t.p, v, nullptr), perry::Error);  // stride < hd
  EXPECT_THROW(pc::rope_apply(a.p, 8, 1, nullptr, 8, 1, 1, t.p, v, nullptr), perry::Error);  // k null
  EXPECT_THROW(pc::residual_add(a.p, b.p, -1, nullptr), perry::Error);
  EXPECT_THROW(pc::f32_to_bf16(a.p, nullptr, 4, nullptr), perry::Error);
  EXPECT_THROW(pc::argmax_rows(a.p, 1, 0, t.p, b.p, nullptr), perry::Error);
  EXPECT_THROW(pc::argmax_rows(a.p, 1, 64, t.p, nullptr, nullptr), perry::Error);  // no scratch
  EXPECT_THROW(pc::argmax_rows(a.p, 1, 64, t.p, b.p, nullptr, pc::GreedyFeed{t.p, nullptr, nullptr}), perry::Error);
  pc::GreedyFeed no_table{t.p, t.p, reinterpret_cast<pc::AttnSeq*>(b.p)};
  no_table.x = a.p, no_table.hidden = 16;  // embedding rows fed without a table
  EXPECT_THROW(pc::argmax_rows(a.p, 1, 64, t.p, b.p, nullptr, no_table), perry::Error);
  // Empty batches are no-ops, not errors.
  EXPECT_NO_THROW(pc::rms_norm(a.p, w, 1e-6f, 0, 16, ActOut::f32(b.p), nullptr));
  EXPECT_NO_THROW(pc::swiglu(a.p, 0, 8, ActOut::i8(q.p, s.p), nullptr));
  device_sync();
}

}  // namespace
