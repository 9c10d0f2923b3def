// w8a8-fp8 (e4m3 weights and per-token e4m3 activations, fp32 accumulation) on the CPU: the
// quantization rule against an independent float64 rounding to the e4m3 grid, the canonical
// format checks, and the emulated forward against a float64 oracle on the decoded codes.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/qgemm.h"
#include "quant/quant.h"
#include "kernels_quant/isa_cases.h"

namespace pq = perry::quant;
using perry::IsaLevel;

namespace {

// The value of positive e4m3 code c (0..126), from the format's definition (1 sign, 4 exponent
// bits with bias 7, 3 mantissa bits; exponent 0 is subnormal), not from the library's decoder.
double e4m3_grid(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
}

// Round-to-nearest-even onto the e4m3 grid, saturating to ±448, by searching the grid in float64:
// ties go to the even code (its mantissa's last bit is the code's last bit). NaN → 0x7F.
uint8_t e4m3_nearest(double v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(v);
  int best = 0;
  for (int c = 1; c <= 126; ++c) {
    const double d = std::fabs(e4m3_grid(c) - a), db = std::fabs(e4m3_grid(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return uint8_t(sign | best);
}

// The rule of quant.h on one row, the fp32 arithmetic spelled out in float64: amax/448 and
// 448/amax are correctly rounded fp32 divisions (computing them in double and rounding once is
// exact for division), x·inv is one fp32 rounding of the exact double product.
float fp8_rule(const float* x, int64_t K, uint8_t* q) {
  double amax = 0;
  for (int64_t k = 0; k < K; ++k)
    if (!std::isnan(x[k])) amax = std::max(amax, std::fabs(double(x[k])));
  float scale = float(amax / 448.0), inv = amax > 0 ? float(448.0 / amax) : 0.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) scale = inv = 0.0f;
  for (int64_t k = 0; k < K; ++k) q[k] = e4m3_nearest(double(float(double(x[k]) * double(inv))));
  return scale;
}

bool is_nan_code(uint8_t c) { return (c & 0x7F) == 0x7F; }

// Rows that exercise the rule: Gaussian rows of different magnitudes with an outlier, exact
// ties (amax 448 makes inv 1), a zero row, a denormal row (448/amax overflows), huge values,
// negative zeros and values in the subnormal e4m3 range.
std::vector<float> test_rows(int64_t K, int rows, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(rows) * K);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + r * K;
    switch (r % 6) {
      case 0:
      case 1:
        for (int64_t k = 0; k < K; ++k) row[k] = nd(rng) * std::pow(10.0f, float(r % 5) - 2.0f);
        row[(r * 13) % K] *= 60.0f;
        break;
      case 2: {  // ties: midpoints of the grid in normal and subnormal range, both signs
        const float ties[] = {1.0625f, 1.1875f, 17.0f, 19.0f, 0x1p-10f, 0x3p-10f, 0x5p-10f, 232.0f, 432.0f, -1.0625f, -0x3p-10f, -0.0f};
        for (int64_t k = 0; k < K; ++k) row[k] = ties[k % 12];
        row[0] = 448.0f;
        break;
      }
      case 3:
        for (int64_t k = 0; k < K; ++k) row[k] = k % 2 ? 0.0f : -0.0f;
        break;
      case 4:
        for (int64_t k = 0; k < K; ++k) row[k] = 1e-41f * float(k % 3 - 1);
        break;
      case 5:
        for (int64_t k = 0; k < K; ++k) row[k] = (k % 2 ? -1.0f : 1.0f) * FLT_MAX / float(k + 2);
        break;
    }
  }
  return x;
}

using perry::testing::IsaGuard;

}  // namespace

TEST(QuantModeFp8, NameAndScheme) {
  ASSERT_EQ(pq::parse_quant_mode("w8a8-fp8"), pq::QuantMode::W8A8_FP8);
  EXPECT_EQ(pq::parse_quant_mode("W8A8-FP8"), pq::QuantMode::W8A8_FP8);
  EXPECT_EQ(pq::quant_mode_name(pq::QuantMode::W8A8_FP8), "w8a8-fp8");
  EXPECT_NE(pq::quant_mode_names().find("w8a8-fp8"), std::string::npos);
  const auto s = pq::quant_scheme(pq::QuantMode::W8A8_FP8);
  EXPECT_TRUE(s.fp8);
  EXPECT_FALSE(s.int8_activations);  // no integer path may take it
  EXPECT_EQ(s.weight_bits, 8);
  EXPECT_EQ(s.group_size, 0);
  EXPECT_TRUE(pq::is_quantized(pq::QuantMode::W8A8_FP8));
  EXPECT_FALSE(pq::quant_scheme(pq::QuantMode::W8A8).fp8);
}

// quantize_weight: per output channel, bit for bit the float64 rounding of the rule.
TEST(QuantizeWeightFp8, MatchesFloat64RoundingOfTheRule) {
  std::mt19937 rng(17);
  for (int64_t K : {int64_t(1), int64_t(12), int64_t(301)}) {
    const int rows = 12;
    const auto w = test_rows(K, rows, rng);
    const auto q = pq::quantize_weight(w.data(), rows, K, pq::QuantMode::W8A8_FP8);
    ASSERT_EQ(q.qweight.size(), size_t(rows * K));
    ASSERT_EQ(q.scales.size(), size_t(rows));
    std::vector<uint8_t> want(static_cast<size_t>(K));
    size_t nonzero = 0;
    for (int r = 0; r < rows; ++r) {
      const float s = fp8_rule(w.data() + r * K, K, want.data());
      EXPECT_EQ(std::memcmp(&q.scales[size_t(r)], &s, 4), 0) << "K=" << K << " row " << r << ": " << q.scales[size_t(r)] << " vs " << s;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t got = uint8_t(q.qweight[size_t(r * K + k)]);
        ASSERT_EQ(got, want[size_t(k)]) << "K=" << K << " row " << r << " k=" << k << " w=" << w[size_t(r * K + k)];
        nonzero += (got & 0x7F) != 0;
        // Dequantized, each weight is within half an e4m3 step of itself (3 mantissa bits:
        // 2^-4 relative; the subnormal step 2^-9 in code units), plus the fp32 rounding of w·inv.
        if (s > 0) {
          const double wv = w[size_t(r * K + k)], back = double(q.weight_value(r, k)) * s;
          EXPECT_LE(std::fabs(back - wv), std::max(0x1p-4 * std::fabs(wv), 0x1p-10 * s) * (1 + 1e-6) + 1e-300)
              << "row " << r << " k=" << k;
        }
      }
    }
    EXPECT_GT(nonzero, size_t(K)) << "the test data must not quantize to zeros";
  }
  // The tie row (r % 6 == 2, amax 448 → scale 1, inv 1) spelled out: nearest even codes.
  const float ties[] = {448.0f, 1.0625f, 1.1875f, 17.0f, 19.0f, 0x1p-10f, 0x3p-10f, 0x5p-10f, 232.0f, 432.0f};
  const uint8_t codes[] = {0x7E, 0x38, 0x3A, 0x58, 0x5A, 0x00, 0x02, 0x02, 0x76, 0x7E};
  const auto q = pq::quantize_weight(ties, 1, 10, pq::QuantMode::W8A8_FP8);
  EXPECT_EQ(q.scales[0], 1.0f);
  for (int k = 0; k < 10; ++k) EXPECT_EQ(uint8_t(q.qweight[size_t(k)]), codes[k]) << "w=" << ties[k];
}

// The activation rule (the same function): NaN stays NaN and ±inf makes the row's scale 0, as the
// GPU's quantize_per_token_fp8 (cvt.rn.satfinite) does — unlike the int8 rule, which stores 0.
TEST(QuantizeActivationsFp8, MatchesFloat64RoundingIncludingNanAndInf) {
  std::mt19937 rng(3);
  const int64_t K = 77;
  auto x = test_rows(K, 12, rng);
  x[size_t(1 * K + 5)] = NAN;
  x[size_t(7 * K + 9)] = -INFINITY;
  std::vector<uint8_t> got(static_cast<size_t>(K)), want(static_cast<size_t>(K));
  for (int r = 0; r < 12; ++r) {
    const float s = pq::quantize_row_fp8_ref(x.data() + r * K, K, got.data());
    const float sr = fp8_rule(x.data() + r * K, K, want.data());
    EXPECT_EQ(std::memcmp(&s, &sr, 4), 0) << "row " << r;
    for (int64_t k = 0; k < K; ++k) {
      if (is_nan_code(want[size_t(k)])) EXPECT_TRUE(is_nan_code(got[size_t(k)])) << r << "," << k;
      else ASSERT_EQ(got[size_t(k)], want[size_t(k)]) << r << "," << k << " x=" << x[size_t(r * K + k)];
    }
  }
  float s = pq::quantize_row_fp8_ref(x.data() + 1 * K, K, got.data());
  EXPECT_GT(s, 0.0f);
  EXPECT_TRUE(is_nan_code(got[5]));
  s = pq::quantize_row_fp8_ref(x.data() + 7 * K, K, got.data());
  EXPECT_EQ(s, 0.0f);
  EXPECT_TRUE(is_nan_code(got[9]));
  EXPECT_EQ(got[0] & 0x7F, 0);
}

// The encoding by the format's definition through libm (frexp / ldexp / nearbyint: an
// implementation independent of the bit-level one in core/dtype.cpp, and fast enough for a
// dense sweep, unlike the grid search above).
namespace {
uint8_t e4m3_by_frexp(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return uint8_t(sign | 0x7f);
  const float a = std::fabs(f);
  if (a >= 448.0f) return uint8_t(sign | 0x7e);
  if (a < std::ldexp(1.0f, -6)) return uint8_t(sign | uint8_t(std::nearbyint(std::ldexp(a, 9))));
  int e2 = 0;
  std::frexp(a, &e2);  // a = f·2^e2, f in [0.5, 1): the unbiased exponent is e2 - 1
  int e = e2 - 1;
  int man = int(std::nearbyint(std::ldexp(a, 3 - e))) - 8;  // 3 fraction bits, nearest-even
  if (man == 8) man = 0, ++e;
  return uint8_t(sign | uint8_t((e + 7) << 3) | uint8_t(man));
}
}  // namespace

// quantize_row_fp8_ref's bytes (core/dtype.h's bit-level f32_to_e4m3) equal the libm encoding for
// every float. With amax = 448 the row's inv is exactly 1, so x·inv = x: every 61st fp32 bit
// pattern in [-448, 448] (18.7 M values), and each midpoint between neighbouring codes with its
// two fp32 neighbours.
TEST(QuantizeActivationsFp8, EncoderEqualsTheCodecOnADenseSweep) {
  const int64_t K = 4096;
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint8_t> q(static_cast<size_t>(K));
  size_t checked = 0, bad = 0;
  auto check_row = [&](int64_t n) {
    ASSERT_EQ(pq::quantize_row_fp8_ref(row.data(), n, q.data()), 1.0f);
    for (int64_t k = 0; k < n; ++k, ++checked)
      if (q[size_t(k)] != e4m3_by_frexp(row[size_t(k)]) && bad++ < 5)
        ADD_FAILURE() << "x=" << row[size_t(k)] << " got " << int(q[size_t(k)]) << " want " << int(e4m3_by_frexp(row[size_t(k)]));
  };
  int64_t n = 1;
  row[0] = 448.0f;
  for (uint32_t bits = 0; bits <= 0x43E00000u; bits += 61) {
    float v;
    std::memcpy(&v, &bits, 4);
    row[size_t(n++)] = (bits & 64) ? -v : v;
    if (n == K) {
      check_row(n);
      n = 1;
    }
  }
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = float((e4m3_grid(c) + e4m3_grid(c + 1)) / 2);
    for (float v : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1000.0f)}) {
      row[size_t(n++)] = v;
      row[size_t(n++)] = -v;
    }
  }
  check_row(n);
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(checked, size_t(18000000));
}

TEST(QuantizedWeightFp8, NanCodesAndBadInputAreClearErrors) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(8 * 16);
  for (auto& v : w) v = nd(rng);
  const auto q = pq::quantize_weight(w.data(), 8, 16, pq::QuantMode::W8A8_FP8);
  EXPECT_NO_THROW(q.validate());
  for (uint8_t nan : {uint8_t(0x7F), uint8_t(0xFF)}) {
    auto bad = q;
    bad.qweight[size_t(3 * 16 + 4)] = int8_t(nan);
    try {
      pq::QuantizedLinear l(bad);
      FAIL() << "expected an error for code " << int(nan);
    } catch (const perry::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("NaN"), std::string::npos) << m;
      EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
    }
  }
  // 0x80 (-0) and 0xFE (-448) are ordinary codes, not the int8 rule's forbidden -128.
  auto edge = q;
  edge.qweight[0] = int8_t(0x80);
  edge.qweight[1] = int8_t(0xFE);
  EXPECT_NO_THROW(pq::QuantizedLinear{edge});
  auto short_q = q;
  short_q.qweight.pop_back();
  EXPECT_THROW(pq::QuantizedLinear{short_q}, perry::Error);
  auto neg = q;
  neg.scales[2] = -1.0f;
  EXPECT_THROW(pq::QuantizedLinear{neg}, perry::Error);
  // The bytes are codes, not integers: weight() refuses, weight_value() decodes.
  EXPECT_THROW(q.weight(0, 0), perry::Error);
  EXPECT_EQ(q.weight_value(0, 1), perry::e4m3_to_f32(uint8_t(q.qweight[1])));
  const auto deq = pq::dequantize_weight(q);
  for (int64_t n = 0; n < 8; ++n)
    for (int64_t k = 0; k < 16; ++k)
      EXPECT_EQ(deq[size_t(n * 16 + k)], perry::e4m3_to_f32(uint8_t(q.qweight[size_t(n * 16 + k)])) * q.scales[size_t(n)]);
  w[17] = INFINITY;
  EXPECT_THROW(pq::quantize_weight(w.data(), 8, 16, pq::QuantMode::W8A8_FP8), perry::Error);
}

// The emulated forward (every float GEMM the ISA levels pick, and the scalar reference) against
// float64 on the decoded codes: y = Σ_k e4m3(x)·e4m3(w) · sa·sw + bias. The products are exact in
// fp32, so the only error is fp32 summation: (K + 4)·2^-24·Σ|terms| bounds any summation order
// (K - 1 additions, the scale product, the scaling and the bias).
TEST(QuantizedLinearFp8, ForwardMatchesFloat64OracleOnDecodedCodes) {
  IsaGuard guard;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto isas = perry::testing::quant_isa_cases();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 301}, {70, 390}}) {
    std::vector<float> wf(size_t(N * K));
    for (int64_t i = 0; i < N * K; ++i) wf[size_t(i)] = nd(rng) * ((i / K) % 3 == 0 ? 100.0f : 0.01f);
    const auto qw = pq::quantize_weight(wf.data(), N, K, pq::QuantMode::W8A8_FP8);
    for (bool pack_for_cpu : {true, false}) {
      pq::QuantizedLinear lin(qw, pack_for_cpu);
      std::vector<float> bias(static_cast<size_t>(N));
      for (auto& b : bias) b = nd(rng);
      for (int64_t M : {1, 2, 3, 7, 17, 64, 130}) {
        std::vector<float> x(size_t(M * K));
        for (auto& v : x) v = nd(rng) * 4.0f;
        x[size_t((M / 2) * K + 7)] = 300.0f;  // an outlier token
        // The oracle's activations: this file's own rounding of the rule.
        std::vector<uint8_t> xq(size_t(M * K));
        std::vector<double> sa(static_cast<size_t>(M));
        for (int64_t m = 0; m < M; ++m) sa[size_t(m)] = fp8_rule(x.data() + m * K, K, xq.data() + m * K);
        for (int use_bias = 0; use_bias < 2; ++use_bias) {
          const float* bp = use_bias ? bias.data() : nullptr;
          std::vector<double> want(size_t(M * N)), mag(size_t(M * N));
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              const double s = sa[size_t(m)] * double(qw.scales[size_t(n)]);
              double acc = 0, a = 0;
              for (int64_t k = 0; k < K; ++k) {
                const uint8_t xc = xq[size_t(m * K + k)], wc = uint8_t(qw.qweight[size_t(n * K + k)]);
                const double t = (xc & 0x80 ? -1 : 1) * e4m3_grid(xc & 0x7F) * (wc & 0x80 ? -1 : 1) * e4m3_grid(wc & 0x7F);
                acc += t;
                a += std::fabs(t);
              }
              const double b = bp ? bp[n] : 0.0;
              want[size_t(m * N + n)] = acc * s + b;
              mag[size_t(m * N + n)] = a * s + std::fabs(b);
            }
          for (const auto& isa : isas) {
            if (!perry::testing::select_isa(isa)) continue;
            std::vector<float> y(size_t(M * N), NAN);
            lin.forward(x.data(), M, y.data(), bp);
            const std::string tag = std::string(isa.name) + " " + lin.kernel_name(M) + " M=" + std::to_string(M) +
                                    " N=" + std::to_string(N) + (pack_for_cpu ? "" : " (packed lazily)");
            size_t bad = 0, exact_zero = 0;
            for (size_t i = 0; i < y.size(); ++i) {
              const double tol = double(K + 4) * 0x1p-24 * mag[i] + 1e-30;
              exact_zero += y[i] == 0.0f;
              if (!(std::fabs(double(y[i]) - want[i]) <= tol) && bad++ < 3)
                ADD_FAILURE() << tag << " i=" << i << " got " << y[i] << " want " << want[i] << " tol " << tol;
            }
            EXPECT_EQ(bad, 0u) << tag;
            EXPECT_LT(exact_zero, y.size() / 4) << tag << ": mostly zeros, the test proves nothing";
          }
        }
      }
      pq::set_quant_force_reference(false);
      perry::set_max_isa(guard.saved);
      EXPECT_EQ(lin.canonical().qweight, qw.qweight) << "canonical() after forward, pack_for_cpu=" << pack_for_cpu;
      EXPECT_EQ(lin.canonical().scales, qw.scales);
    }
  }
}

// The decoded bf16 copy must give back the canonical bytes exactly (QuantizedLinear keeps only
// that copy), including -0, subnormal codes and ±448.
TEST(QuantizedLinearFp8, CanonicalRoundTripsThroughTheDecodedCopy) {
  pq::QuantizedWeight w;
  w.mode = pq::QuantMode::W8A8_FP8;
  w.N = 2;
  w.K = 254;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) w.qweight.push_back(int8_t(uint8_t(c)));  // every finite code once
  ASSERT_EQ(w.qweight.size(), 254u);
  for (int c = 0; c < 254; ++c) w.qweight.push_back(w.qweight[size_t(253 - c)]);
  w.scales = {0.5f, 3.0f};
  pq::QuantizedLinear lin(w);
  EXPECT_EQ(lin.canonical().qweight, w.qweight);
  EXPECT_EQ(lin.canonical().scales, w.scales);
  EXPECT_EQ(lin.mode(), pq::QuantMode::W8A8_FP8);
}

TEST(QuantizedLinearFp8, KernelNamesAndForwardManyFallback) {
  IsaGuard guard;
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t K = 96;
  std::vector<float> w(64 * K), x(3 * K);
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  pq::QuantizedLinear a(pq::quantize_weight(w.data(), 64, K, pq::QuantMode::W8A8_FP8));
  pq::QuantizedLinear b(pq::quantize_weight(w.data() + 16 * K, 48, K, pq::QuantMode::W8A8_FP8));
  EXPECT_EQ(a.kernel_name(1).rfind("w8a8-fp8:float_emulation/", 0), 0u) << a.kernel_name(1);
  EXPECT_EQ(a.kernel_name(512).rfind("w8a8-fp8:float_emulation/", 0), 0u) << a.kernel_name(512);
  pq::set_quant_force_reference(true);
  EXPECT_EQ(a.kernel_name(512), "w8a8-fp8:reference");
  pq::set_quant_force_reference(false);
  // forward_many (q|k|v style) has no shared fp8 path: it must give each layer's own forward().
  for (int64_t M : {1, 3}) {
    std::vector<float> ya(size_t(M * 64)), yb(size_t(M * 48)), ga(ya.size(), -1), gb(yb.size(), -1);
    a.forward(x.data(), M, ya.data());
    b.forward(x.data(), M, yb.data());
    const pq::QuantizedLinear* layers[2] = {&a, &b};
    float* ys[2] = {ga.data(), gb.data()};
    pq::QuantizedLinear::forward_many(layers, 2, x.data(), M, ys, nullptr);
    EXPECT_EQ(ga, ya) << "M=" << M;
    EXPECT_EQ(gb, yb) << "M=" << M;
  }
}
