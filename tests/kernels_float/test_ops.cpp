// Row kernels vs float64 references, every ISA path, unaligned sizes.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels_float/test_util.h"

namespace perry::kernels {
namespace {

using test::available_isas;
using test::isa_name;
using test::IsaScope;
using test::random_floats;

const int64_t kSizes[] = {1, 3, 17, 63, 130, 2048, 70001};

TEST(Ops, RmsNormMatchesFloat64) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 3, 17, 63, 130, 2048}) {
      const int64_t rows = 5;
      auto x = random_floats(size_t(rows * n), 1 + n, -3, 3);
      auto w = random_floats(size_t(n), 2 + n, 0.5f, 1.5f);
      std::vector<float> y(x.size());
      const float eps = 1e-5f;
      rms_norm(x.data(), w.data(), eps, rows, n, y.data());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
        double inv = 1.0 / std::sqrt(ss / n + eps);
        for (int64_t i = 0; i < n; ++i) {
          double want = x[r * n + i] * inv * w[i];
          // fp32 sum of squares over n <= 2048 terms (several partial sums) and 3 roundings after:
          // relative error well under 1e-5.
          ASSERT_NEAR(y[r * n + i], want, 1e-5 * std::abs(want) + 1e-7) << isa_name(isa) << " n=" << n;
        }
      }
      // In place (y aliases x) gives the same result.
      std::vector<float> x2 = x;
      rms_norm(x2.data(), w.data(), eps, rows, n, x2.data());
      ASSERT_EQ(x2, y) << isa_name(isa);
    }
  }
}

TEST(Ops, SiluMulMatchesFloat64) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : kSizes) {
      auto g = random_floats(size_t(n), 3 + n, -12, 12);
      auto u = random_floats(size_t(n), 4 + n, -2, 2);
      std::vector<float> out(static_cast<size_t>(n));
      silu_mul(g.data(), u.data(), n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        double gd = g[i], want = gd / (1 + std::exp(-gd)) * u[i];
        // exp within ~2 ulp, then a divide and a multiply: < 1e-6 relative; 4e-6 leaves margin.
        ASSERT_NEAR(out[i], want, 4e-6 * std::abs(want) + 1e-30) << isa_name(isa) << " i=" << i;
      }
      std::vector<float> alias = g;
      silu_mul(alias.data(), u.data(), n, alias.data());
      ASSERT_EQ(alias, out);
    }
  }
}

TEST(Ops, AddInplaceExact) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : kSizes) {
      auto y = random_floats(size_t(n), 5 + n), x = random_floats(size_t(n), 6 + n);
      auto want = y;
      for (int64_t i = 0; i < n; ++i) want[i] = y[i] + x[i];  // one rounding: must be bit-exact
      add_inplace(y.data(), x.data(), n);
      ASSERT_EQ(y, want) << isa_name(isa);
    }
  }
}

TEST(Ops, SoftmaxMatchesFloat64) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : kSizes) {
      auto x = random_floats(size_t(n), 7 + n, -20, 20);
      double mx = *std::max_element(x.begin(), x.end()), s = 0;
      for (float v : x) s += std::exp(v - mx);
      auto y = x;
      softmax_inplace(y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        double want = std::exp(x[i] - mx) / s;
        // exp ~2 ulp, fp32 sum of n terms (16 lanes): relative error ~ n/16 * 6e-8 worst case.
        ASSERT_NEAR(y[i], want, (2e-6 + 1e-7 * double(n) / 16) * want + 1e-38) << isa_name(isa) << " n=" << n;
      }
    }
  }
}

// transformers' _compute_default_rope_parameters + _compute_llama3_parameters, re-derived in float64.
std::vector<double> llama3_inv_freq_f64(int hd, double theta, const Llama3RopeScaling* sc) {
  std::vector<double> f(hd / 2);
  for (int i = 0; i < hd / 2; ++i) f[i] = 1.0 / std::pow(theta, double(2 * i) / hd);
  if (!sc) return f;
  const double low_wl = sc->original_max_position_embeddings / sc->low_freq_factor;
  const double high_wl = sc->original_max_position_embeddings / sc->high_freq_factor;
  for (auto& x : f) {
    double wl = 2 * M_PI / x;
    if (wl < high_wl) continue;                       // high frequency: unchanged
    if (wl > low_wl) { x /= sc->factor; continue; }   // low frequency: divided by factor
    double smooth = (sc->original_max_position_embeddings / wl - sc->low_freq_factor) /
                    (sc->high_freq_factor - sc->low_freq_factor);
    x = (1 - smooth) * x / sc->factor + smooth * x;   // medium: interpolated
  }
  return f;
}

TEST(Ops, RopeTableLlama3ScalingMatchesFormula) {
  // Llama-3.2-1B's rope (theta 500000, factor 32, 1/4, 8192) and Llama-3.1-8B's (factor 8).
  for (double factor : {32.0, 8.0}) {
    for (int hd : {64, 128}) {
      Llama3RopeScaling sc{factor, 1.0, 4.0, 8192.0};
      RopeTable rope(hd, 500000.0, 20000, sc);
      auto want = llama3_inv_freq_f64(hd, 500000.0, &sc);
      int low = 0, medium = 0, high = 0;
      for (int i = 0; i < hd / 2; ++i) {
        // float32 evaluation of the same formula: a handful of roundings, < 1e-6 relative.
        ASSERT_NEAR(rope.inv_freq()[i], want[i], 2e-6 * want[i]) << "i=" << i << " hd=" << hd;
      }
      // All three regimes must be exercised, or this test could not catch a wrong branch.
      auto base = llama3_inv_freq_f64(hd, 500000.0, nullptr);
      for (int i = 0; i < hd / 2; ++i) {
        double wl = 2 * M_PI / base[i];
        if (wl < 8192.0 / 4) ++high; else if (wl > 8192.0) ++low; else ++medium;
      }
      EXPECT_GT(low, 0);
      EXPECT_GT(medium, 0);
      EXPECT_GT(high, 0);
      for (int64_t pos : {0, 1, 7, 1000, 19999}) {
        for (int i = 0; i < hd / 2; ++i) {
          double a = double(pos) * want[i];
          // Angle rounded to fp32 as transformers does: |error| <= pos*f*(2^-24 + 2e-6) radians.
          double tol = 3e-6 * a + 1e-7;
          ASSERT_NEAR(rope.cos(pos)[i], std::cos(a), tol) << pos << " " << i;
          ASSERT_NEAR(rope.sin(pos)[i], std::sin(a), tol) << pos << " " << i;
        }
      }
    }
  }
  // Without scaling: plain 1/theta^(2i/d).
  RopeTable plain(128, 1e6, 4);
  auto want = llama3_inv_freq_f64(128, 1e6, nullptr);
  for (int i = 0; i < 64; ++i) ASSERT_NEAR(plain.inv_freq()[i], want[i], 2e-6 * want[i]);
  EXPECT_THROW(RopeTable(63, 1e4, 4), Error);
}

TEST(Ops, RopeApplyMatchesFloat64) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (int hd : {8, 40, 64, 128}) {
      RopeTable rope(hd, 10000.0, 600);
      const int64_t T = 17;
      const int heads = 3;
      const int64_t stride = heads * hd + 5;  // padded rows: the stride must be honoured
      auto x = random_floats(size_t(T * stride), 9 + hd);
      auto y = x;
      const int64_t pos0 = 513;
      rope_apply(y.data(), T, heads, stride, pos0, rope);
      const int half = hd / 2;
      for (int64_t t = 0; t < T; ++t) {
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < half; ++i) {
            double f = 1.0 / std::pow(10000.0, double(2 * i) / hd), ang = double(pos0 + t) * f;
            double a = x[t * stride + h * hd + i], b = x[t * stride + h * hd + i + half];
            double w0 = a * std::cos(ang) - b * std::sin(ang), w1 = b * std::cos(ang) + a * std::sin(ang);
            // Angle in fp32 (see RopeTable): error ~ ang * 2^-23; values |a|,|b| <= 1.
            double tol = 3e-7 * ang + 1e-6;
            ASSERT_NEAR(y[t * stride + h * hd + i], w0, tol) << isa_name(isa);
            ASSERT_NEAR(y[t * stride + h * hd + i + half], w1, tol) << isa_name(isa);
          }
        }
        for (int64_t p = heads * hd; p < stride; ++p) ASSERT_EQ(y[t * stride + p], x[t * stride + p]);
      }
      // Explicit positions give the same as pos0 + t.
      std::vector<int32_t> pos(T);
      for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(pos0 + t);
      auto z = x;
      rope_apply(z.data(), T, heads, stride, 0, rope, pos.data());
      ASSERT_EQ(z, y);
      EXPECT_THROW(rope_apply(z.data(), T, heads, stride, 590, rope), Error);  // 590+16 >= 600
    }
  }
}

TEST(Ops, EmbeddingLookupAllDtypes) {
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    const int64_t vocab = 50, dim = 37;
    auto tf = random_floats(size_t(vocab * dim), 11);
    std::vector<uint16_t> tb(tf.size()), th(tf.size());
    for (size_t i = 0; i < tf.size(); ++i) {
      tb[i] = f32_to_bf16(tf[i]);
      th[i] = f32_to_f16(tf[i]);
    }
    std::vector<int32_t> ids{3, 49, 0, 3, 17};
    std::vector<float> out(ids.size() * dim);
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      const void* table = dt == DType::F32 ? (const void*)tf.data() : dt == DType::F16 ? (const void*)th.data()
                                                                                      : (const void*)tb.data();
      embedding_lookup(table, dt, dim, ids.data(), int64_t(ids.size()), out.data(), vocab);
      for (size_t r = 0; r < ids.size(); ++r) {
        for (int64_t j = 0; j < dim; ++j) {
          size_t k = size_t(ids[r]) * dim + j;
          float want = dt == DType::F32 ? tf[k] : dt == DType::F16 ? f16_to_f32(th[k]) : bf16_to_f32(tb[k]);
          ASSERT_EQ(out[r * dim + j], want) << isa_name(isa);  // conversions are exact
        }
      }
    }
    int32_t bad = 50;
    EXPECT_THROW(embedding_lookup(tf.data(), DType::F32, dim, &bad, 1, out.data(), vocab), Error);
    bad = -1;
    EXPECT_THROW(embedding_lookup(tf.data(), DType::F32, dim, &bad, 1, out.data()), Error);
    EXPECT_THROW(embedding_lookup(tf.data(), DType::I8, dim, ids.data(), 1, out.data()), Error);
  }
}

}  // namespace
}  // namespace perry::kernels
