// The quantized GEMM/GEMV kernels: int32 accumulators of every path against an int64 oracle,
// layer outputs of every ISA against a float64 oracle of the quantized math, and kernel selection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"
#include "kernels_quant/isa_cases.h"

namespace pq = perry::quant;
namespace kq = perry::kernels::q;
using perry::IsaLevel;

namespace {

const int64_t kMs[] = {1, 2, 3, 7, 17, 64, 130};
const pq::QuantMode kIntModes[] = {pq::QuantMode::W8A8, pq::QuantMode::W8A8_G128, pq::QuantMode::W8A8_G64,
                                   pq::QuantMode::W4A8, pq::QuantMode::W4A8_G128};
const pq::QuantMode kWoModes[] = {pq::QuantMode::W8A16, pq::QuantMode::W4A16};

bool have_avx512_vnni() {
  const auto& f = perry::cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni;
}
bool have_avx512_bf16() { return have_avx512_vnni() && perry::cpu_features().avx512_bf16; }
bool have_avx2() { return perry::cpu_features().avx2 && perry::cpu_features().fma; }

using perry::testing::IsaGuard;

// Decodes the canonical bytes independently of the library (the oracle's own unpacker).
int canon_weight(const pq::QuantizedWeight& w, int64_t n, int64_t k) {
  if (pq::quant_scheme(w.mode).weight_bits == 8) return w.qweight[size_t(n * w.K + k)];
  const uint8_t b = uint8_t(w.qweight[size_t(n * ((w.K + 1) / 2) + k / 2)]);
  const int v = (k % 2 == 0) ? (b & 0xF) : (b >> 4);
  return v >= 8 ? v - 16 : v;
}
int64_t group_of(const pq::QuantizedWeight& w, int64_t k) {
  const int gs = pq::quant_scheme(w.mode).group_size;
  return gs == 0 ? 0 : k / gs;
}

pq::QuantizedWeight random_weight(pq::QuantMode mode, int64_t N, int64_t K, std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::vector<float> w(size_t(N * K));
  for (auto& v : w) v = ud(rng);
  // Make some rows span very different magnitudes so per-group scales matter.
  for (int64_t k = 0; k < K; ++k) w[size_t(k)] *= (k < K / 2) ? 100.0f : 0.01f;
  return pq::quantize_weight(w.data(), N, K, mode);
}

std::vector<int64_t> oracle_acc(const pq::QuantizedWeight& w, const std::vector<int8_t>& q, int64_t M) {
  const int G = w.n_groups();
  std::vector<int64_t> acc(size_t(M * w.N * G), 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n)
      for (int64_t k = 0; k < w.K; ++k)
        acc[size_t((m * w.N + n) * G + group_of(w, k))] += int64_t(q[size_t(m * w.K + k)]) * canon_weight(w, n, k);
  return acc;
}

void expect_acc_equal(const std::vector<int64_t>& want, const std::vector<int32_t>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != int64_t(got[i]) && bad++ < 5) ADD_FAILURE() << what << " index " << i << ": " << got[i] << " != " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

// Runs every integer path on q (s8 [M][K]) and compares with the int64 oracle.
void check_all_int_paths(const pq::QuantizedWeight& w, const std::vector<int8_t>& q, int64_t M, const std::string& tag) {
  const auto want = oracle_acc(w, q, M);
  const int G = w.n_groups();
  std::vector<int32_t> got(size_t(M * w.N * G), 0x5a5a5a5a);
  kq::ref::int_accumulators(w, q.data(), M, got.data());
  expect_acc_equal(want, got, tag + " reference");
  const kq::PackedInt p = kq::pack_int(w);
  const int64_t lda = p.lda();
  std::vector<kq::Path> paths = {kq::Path::Gemm};
  if (M <= kq::kGemvMaxRows) paths.push_back(kq::Path::Gemv);
  if (have_avx512_vnni()) {
    // The kernels' activation layout, built here from q (not by the library's quantizer): int8
    // weights take u8 q+128 padded with 128; int4 weights take s8 q padded with 0 plus 8·Σq per group.
    const bool int4 = p.bits == 4;
    std::vector<uint8_t> a(size_t(M * lda), int4 ? 0 : 128);
    std::vector<int32_t> corr(size_t(M * G), 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < w.K; ++k) {
        const int v = q[size_t(m * w.K + k)];
        a[size_t(m * lda + k)] = int4 ? uint8_t(int8_t(v)) : uint8_t(v + 128);
        corr[size_t(m * G + group_of(w, k))] += 8 * v;
      }
    for (auto path : paths) {
      std::fill(got.begin(), got.end(), 0x5a5a5a5a);
      kq::avx512::int_accumulators(p, a.data(), int4 ? corr.data() : nullptr, M, got.data(), path);
      expect_acc_equal(want, got, tag + (path == kq::Path::Gemv ? " avx512 gemv" : " avx512 gemm"));
    }
  }
  if (have_avx2()) {
    std::vector<int8_t> a(size_t(M * lda), 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < w.K; ++k) a[size_t(m * lda + k)] = q[size_t(m * w.K + k)];
    for (auto path : paths) {
      std::fill(got.begin(), got.end(), 0x5a5a5a5a);
      kq::avx2::int_accumulators(p, a.data(), M, got.data(), path);
      expect_acc_equal(want, got, tag + (path == kq::Path::Gemv ? " avx2 gemv" : " avx2 gemm"));
    }
  }
}

}  // namespace

TEST(QGemmExact, IntAccumulatorsEveryPathUnalignedShapes) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> qd(-127, 127);
  const std::pair<int64_t, int64_t> shapes[] = {{37, 301}, {50, 200}, {5, 9}, {33, 1}};
  for (auto mode : kIntModes)
    for (auto [N, K] : shapes) {
      const auto w = random_weight(mode, N, K, rng);
      for (int64_t M : kMs) {
        std::vector<int8_t> q(size_t(M * K));
        for (auto& v : q) v = int8_t(qd(rng));
        check_all_int_paths(w, q, M, std::string(pq::quant_mode_name(mode)) + " M=" + std::to_string(M) +
                                         " N=" + std::to_string(N) + " K=" + std::to_string(K));
      }
    }
}

TEST(QGemmExact, ExtremeValuesDoNotOverflow) {
  // Every activation ±127 and every weight at its extreme over a long K: the largest sums.
  const int64_t N = 20, K = 14336 + 3;
  for (auto mode : {pq::QuantMode::W8A8, pq::QuantMode::W4A8_G128}) {
    std::vector<float> wf(size_t(N * K));
    for (int64_t i = 0; i < N * K; ++i) wf[size_t(i)] = (i / K) % 2 ? -1.0f : 1.0f;
    const auto w = pq::quantize_weight(wf.data(), N, K, mode);
    for (int64_t M : {int64_t(1), int64_t(7)}) {
      std::vector<int8_t> q(size_t(M * K));
      for (int64_t i = 0; i < M * K; ++i) q[size_t(i)] = (i / K) % 3 == 1 ? -127 : 127;
      check_all_int_paths(w, q, M, std::string("extreme ") + std::string(pq::quant_mode_name(mode)));
    }
  }
}

namespace {

// float64 oracle of the quantized math; `tol` receives a per-output error bound.
void oracle_forward(const pq::QuantizedWeight& w, const std::vector<float>& x, int64_t M, const float* bias,
                    std::vector<double>& y, std::vector<double>& mag) {
  const auto sc = pq::quant_scheme(w.mode);
  const int G = w.n_groups();
  y.assign(size_t(M * w.N), 0.0);
  mag.assign(size_t(M * w.N), 0.0);
  std::vector<double> xa(static_cast<size_t>(w.K));
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.data() + m * w.K;
    double sa = 1.0;
    if (sc.int8_activations) {  // the spec: amax/127 per row, q = rne(x·(127/amax)) clamped
      float amax = 0;
      for (int64_t k = 0; k < w.K; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float inv = 127.0f / amax;
      sa = double(amax / 127.0f);
      for (int64_t k = 0; k < w.K; ++k) xa[size_t(k)] = std::clamp(std::nearbyint(xr[k] * inv), -127.0f, 127.0f);
    } else {
      for (int64_t k = 0; k < w.K; ++k) xa[size_t(k)] = perry::bf16_to_f32(perry::f32_to_bf16(xr[k]));
    }
    for (int64_t n = 0; n < w.N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < w.K; ++k) {
        const double t = xa[size_t(k)] * canon_weight(w, n, k) * double(w.scales[size_t(n * G + group_of(w, k))]) * sa;
        s += t;
        a += std::fabs(t);
      }
      const double b = bias ? bias[n] : 0.0;
      y[size_t(m * w.N + n)] = s + b;
      mag[size_t(m * w.N + n)] = a + std::fabs(b);
    }
  }
}

}  // namespace

TEST(QuantizedLinear, EveryModeEveryIsaMatchesFloat64Oracle) {
  IsaGuard guard;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto isas = perry::testing::quant_isa_cases();
  std::vector<pq::QuantMode> modes(std::begin(kIntModes), std::end(kIntModes));
  modes.insert(modes.end(), std::begin(kWoModes), std::end(kWoModes));
  const std::pair<int64_t, int64_t> shapes[] = {{37, 301}, {70, 390}};
  for (auto mode : modes)
    for (auto [N, K] : shapes) {
      const auto qw = random_weight(mode, N, K, rng);
      pq::QuantizedLinear lin(qw);
      std::vector<float> bias(static_cast<size_t>(N));
      for (auto& b : bias) b = nd(rng);
      for (int64_t M : kMs) {
        std::vector<float> x(size_t(M * K));
        for (auto& v : x) v = nd(rng) * 4.0f;
        for (int use_bias = 0; use_bias < 2; ++use_bias) {
          const float* bp = use_bias ? bias.data() : nullptr;
          std::vector<double> want, mag;
          oracle_forward(qw, x, M, bp, want, mag);
          const double rel = pq::quant_scheme(mode).int8_activations ? 2e-6 : 3e-5;
          std::vector<float> first;
          for (const auto& isa : isas) {
            if (!perry::testing::select_isa(isa)) continue;
            std::vector<float> y(size_t(M * N), NAN);
            lin.forward(x.data(), M, y.data(), bp);
            const std::string tag = std::string(pq::quant_mode_name(mode)) + " " + isa.name + " " +
                                    lin.kernel_name(M) + " M=" + std::to_string(M) + " N=" + std::to_string(N);
            size_t bad = 0;
            for (size_t i = 0; i < y.size(); ++i) {
              const double tol = rel * mag[i] + 1e-30;
              if (!(std::fabs(double(y[i]) - want[i]) <= tol) && bad++ < 3)
                ADD_FAILURE() << tag << " i=" << i << " got " << y[i] << " want " << want[i] << " tol " << tol;
            }
            EXPECT_EQ(bad, 0u) << tag;
            // The integer modes do the same float operations in the same order on every ISA.
            if (pq::quant_scheme(mode).int8_activations) {
              if (first.empty()) {
                first = y;
              } else {
                EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float))) << tag << " not bitwise";
              }
            }
          }
        }
      }
    }
}

// The GEMV kernels for 2..4 rows (used when gemv_max_m allows) give the GEMM's bits.
TEST(QuantizedLinear, GemvAndGemmPathsAgreeBitwise) {
  if (!have_avx512_bf16()) GTEST_SKIP() << "no AVX-512 VNNI/BF16";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto mode : {pq::QuantMode::W8A8_G64, pq::QuantMode::W4A8, pq::QuantMode::W8A16, pq::QuantMode::W4A16}) {
    const int64_t N = 83, K = 333;
    const auto qw = random_weight(mode, N, K, rng);
    for (int64_t M = 1; M <= kq::kGemvMaxRows; ++M) {
      std::vector<float> x(size_t(M * K)), bias(static_cast<size_t>(N));
      for (auto& v : x) v = nd(rng);
      for (auto& v : bias) v = nd(rng);
      std::vector<float> y1(size_t(M * N)), y2(size_t(M * N));
      if (pq::quant_scheme(mode).int8_activations) {
        const auto p = kq::pack_int(qw);
        std::vector<uint8_t> a(size_t(M * p.lda()));
        std::vector<float> sa(static_cast<size_t>(M));
        std::vector<int32_t> corr(size_t(M * p.G));
        kq::avx512::quantize_activations(p, x.data(), M, {a.data(), sa.data(), corr.data()});
        kq::avx512::int_forward(p, a.data(), corr.data(), M, sa.data(), y1.data(), bias.data(), kq::Path::Gemv);
        kq::avx512::int_forward(p, a.data(), corr.data(), M, sa.data(), y2.data(), bias.data(), kq::Path::Gemm);
      } else {
        const auto p = kq::pack_wo(qw);
        std::vector<uint16_t> xb(size_t(M * p.ldx()));
        kq::avx512::to_bf16_rows(x.data(), M, K, xb.data(), p.ldx());
        kq::avx512::wo_forward(p, xb.data(), M, y1.data(), bias.data(), kq::Path::Gemv);
        kq::avx512::wo_forward(p, xb.data(), M, y2.data(), bias.data(), kq::Path::Gemm);
      }
      EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)))
          << pq::quant_mode_name(mode) << " M=" << M;
    }
  }
}

// forward_many (q|k|v, gate|up in one call: one activation quantization, one parallel region for
// the decode GEMV) gives every layer the bits of its own forward(), which the float64 oracle test
// above covers. Layers of several panel counts (partial panels included), with and without bias,
// every M of both paths; a layer of another mode in the set takes the one-by-one fallback.
TEST(QuantizedLinear, ForwardManyMatchesForwardBitwise) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t K = 333;
  for (auto mode : kIntModes) {
    std::vector<pq::QuantizedLinear> ls;
    for (int64_t N : {83, 16, 5}) ls.emplace_back(random_weight(mode, N, K, rng));
    const pq::QuantMode other = mode == pq::QuantMode::W8A8 ? pq::QuantMode::W4A8_G128 : pq::QuantMode::W8A8;
    ls.emplace_back(random_weight(other, 40, K, rng));
    for (int64_t M : {int64_t(1), int64_t(2), int64_t(4), int64_t(7)}) {
      std::vector<float> x(size_t(M * K));
      for (auto& v : x) v = nd(rng);
      for (int n : {3, 4}) {  // 3: same mode (shared path); 4: plus the other mode (fallback)
        std::vector<std::vector<float>> want(static_cast<size_t>(n)), got(static_cast<size_t>(n)), bias(static_cast<size_t>(n));
        const pq::QuantizedLinear* layers[4];
        float* ys[4];
        const float* bs[4];
        for (int i = 0; i < n; ++i) {
          const auto& l = ls[size_t(i)];
          bias[size_t(i)].resize(size_t(l.rows()));
          for (auto& v : bias[size_t(i)]) v = nd(rng);
          want[size_t(i)].assign(size_t(M * l.rows()), 0.0f);
          got[size_t(i)].assign(size_t(M * l.rows()), -1.0f);
          layers[i] = &l;
          ys[i] = got[size_t(i)].data();
          bs[i] = i == 1 ? nullptr : bias[size_t(i)].data();
          l.forward(x.data(), M, want[size_t(i)].data(), bs[i]);
        }
        pq::QuantizedLinear::forward_many(layers, n, x.data(), M, ys, bs);
        for (int i = 0; i < n; ++i)
          EXPECT_EQ(0, std::memcmp(want[size_t(i)].data(), got[size_t(i)].data(), want[size_t(i)].size() * 4))
              << pq::quant_mode_name(mode) << " M=" << M << " n=" << n << " layer " << i;
      }
    }
  }
}

TEST(QuantizedLinear, ForwardManyRejectsBadCounts) {
  std::vector<float> w(32 * 64, 0.5f), x(64, 1.0f), y(32);
  pq::QuantizedLinear l(pq::quantize_weight(w.data(), 32, 64, pq::QuantMode::W8A8));
  const pq::QuantizedLinear* layers[5] = {&l, &l, &l, &l, &l};
  float* ys[5] = {y.data(), y.data(), y.data(), y.data(), y.data()};
  EXPECT_THROW(pq::QuantizedLinear::forward_many(layers, 5, x.data(), 1, ys, nullptr), perry::Error);
  EXPECT_THROW(pq::QuantizedLinear::forward_many(layers, 0, x.data(), 1, ys, nullptr), perry::Error);
}

TEST(QuantizedLinear, KernelSelection) {
  IsaGuard guard;
  std::vector<float> w(64 * 128, 0.25f);
  w[3] = -1.0f;
  pq::QuantizedLinear l8(pq::quantize_weight(w.data(), 64, 128, pq::QuantMode::W8A8));
  pq::QuantizedLinear l4(pq::quantize_weight(w.data(), 64, 128, pq::QuantMode::W4A8_G128));
  pq::QuantizedLinear lwo(pq::quantize_weight(w.data(), 64, 128, pq::QuantMode::W4A16));
  if (have_avx512_bf16()) {  // this machine (Zen 4)
    EXPECT_EQ(l8.kernel_name(1), "w8a8:gemv_avx512_vnni");
    EXPECT_EQ(l8.kernel_name(512), "w8a8:gemm_avx512_vnni");
    EXPECT_EQ(l4.kernel_name(1), "w4a8-g128:gemv_avx512_vnni");
    EXPECT_EQ(l4.kernel_name(512), "w4a8-g128:gemm_avx512_vnni");
    EXPECT_EQ(lwo.kernel_name(1), "w4a16:gemv_avx512_bf16");
    EXPECT_EQ(lwo.kernel_name(512), "w4a16:gemm_avx512_bf16");
  }
  if (have_avx2()) {
    perry::set_max_isa(IsaLevel::Avx2);
    EXPECT_EQ(l8.kernel_name(512), "w8a8:gemm_avx2");
    EXPECT_EQ(lwo.kernel_name(512), "w4a16:gemm_avx2");
  }
  perry::set_max_isa(IsaLevel::Scalar);
  EXPECT_EQ(l8.kernel_name(1), "w8a8:reference");
  EXPECT_EQ(lwo.kernel_name(1), "w4a16:reference");
  perry::set_max_isa(guard.saved);
  pq::set_quant_force_reference(true);
  EXPECT_EQ(l4.kernel_name(512), "w4a8-g128:reference");
}

// QuantizedLinear keeps only the packed copy; canonical() must rebuild the input exactly.
TEST(QuantizedLinear, CanonicalRoundTripsThroughThePackedCopy) {
  std::mt19937 rng(21);
  std::vector<pq::QuantMode> modes(std::begin(kIntModes), std::end(kIntModes));
  modes.insert(modes.end(), std::begin(kWoModes), std::end(kWoModes));
  for (auto mode : modes)
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 301}, {16, 8}, {3, 1}}) {
      const auto w = random_weight(mode, N, K, rng);
      pq::QuantizedLinear lin(w);
      const auto& c = lin.canonical();
      EXPECT_EQ(c.mode, w.mode);
      EXPECT_EQ(c.N, N);
      EXPECT_EQ(c.K, K);
      EXPECT_EQ(c.qweight, w.qweight) << pq::quant_mode_name(mode) << " K=" << K;
      EXPECT_EQ(c.scales, w.scales) << pq::quant_mode_name(mode) << " K=" << K;
      EXPECT_EQ(lin.rows(), N);
      EXPECT_EQ(lin.cols(), K);
    }
}
