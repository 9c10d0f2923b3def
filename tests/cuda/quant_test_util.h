// Shared by the CUDA quantized-linear tests (test_cuda_quant_linear.cpp, test_cuda_small_m.cpp):
// quantized weights and activations from perry::quant, the float64 reference of the quantized
// math (gemv_quant.h) with its error scale, and the tolerance check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/gemv_quant.h"
#include "quant/quant.h"

namespace perry::cuda::testing {

using perry::quant::QuantizedWeight;
using perry::quant::QuantMode;

inline const QuantMode kAllModes[] = {QuantMode::W8A8,      QuantMode::W8A8_G128, QuantMode::W8A8_G64,
                                      QuantMode::W4A8,      QuantMode::W4A8_G128, QuantMode::W8A16,
                                      QuantMode::W4A16};

inline std::string mode_name(QuantMode m) { return perry::cuda::quant_mode_bits(m).name; }

// Rows of different magnitude so the scales differ per row and per group.
inline QuantizedWeight make_weight(QuantMode mode, int N, int K, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(N) * K);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) w[size_t(n) * K + k] = nd(g) * (0.02f + 0.01f * float(n % 7)) * (1.f + float(k / 64 % 3));
  return perry::quant::quantize_weight(w.data(), N, K, mode);
}

inline std::vector<int> unpack(const QuantizedWeight& w) {
  std::vector<int> u(size_t(w.N * w.K));
  for (int64_t n = 0; n < w.N; ++n)
    for (int64_t k = 0; k < w.K; ++k) u[size_t(n * w.K + k)] = w.weight(n, k);
  return u;
}

struct Act {
  std::vector<int8_t> q;     // W*A8: int8 [M, K]
  std::vector<float> sa;     // [M]
  std::vector<uint16_t> xb;  // W*A16: bf16 [M, K]
};

inline Act make_act(int M, int K, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(g);
  for (int m = 0; m < M; ++m) x[size_t(m) * K + (m * 13) % K] *= 20.f;  // outliers
  Act a;
  a.q.resize(x.size());
  a.sa.resize(size_t(M));
  for (int m = 0; m < M; ++m)
    a.sa[size_t(m)] = perry::quant::quantize_row_ref(&x[size_t(m) * K], K, &a.q[size_t(m) * K]);
  a.xb.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) a.xb[i] = perry::f32_to_bf16(x[i]);
  return a;
}

// float64 reference of the quantized math; mag = the same sum over |terms| (error scale).
inline void reference(const QuantizedWeight& w, const std::vector<int>& wu, const Act& a, int M,
               const float* bias, std::vector<double>& ref, std::vector<double>& mag) {
  const auto mb = perry::cuda::quant_mode_bits(w.mode);
  const int N = int(w.N), K = int(w.K), G = w.n_groups();
  const int gl = mb.group_size > 0 ? mb.group_size : K;
  ref.assign(size_t(M) * N, 0.0);
  mag.assign(size_t(M) * N, 0.0);
  std::vector<double> xd(size_t(M) * K);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = mb.a8 ? double(a.q[i]) : double(perry::bf16_to_f32(a.xb[i]));
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0, am = 0;
      for (int gi = 0; gi < G; ++gi) {
        double s = 0, sabs = 0;
        for (int k = gi * gl; k < std::min(K, (gi + 1) * gl); ++k) {
          const double t = xd[size_t(m) * K + k] * wu[size_t(n) * K + k];
          s += t;
          sabs += std::fabs(t);
        }
        acc += double(w.scales[size_t(n) * G + gi]) * s;
        am += double(w.scales[size_t(n) * G + gi]) * sabs;
      }
      if (mb.a8) {
        acc *= a.sa[size_t(m)];
        am *= a.sa[size_t(m)];
      }
      const double b = bias ? bias[n] : 0.0;
      ref[size_t(m) * N + n] = acc + b;
      mag[size_t(m) * N + n] = am + std::fabs(b);
    }
}

inline void expect_close(const std::vector<float>& y, const std::vector<double>& ref,
                  const std::vector<double>& mag, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(y.size(), ref.size());
  double num = 0, den = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = double(y[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (!std::isfinite(y[i]) || std::fabs(d) > tol * mag[i] + 1e-30) {
      if (bad++ == 0) first_bad = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " bad; first bad element " << first_bad << " gpu " << y[first_bad]
                     << " ref " << ref[first_bad] << " (|terms| " << mag[first_bad] << ")";
  if (den > 0) {
    EXPECT_LT(std::sqrt(num / den), tol) << what << ": relative L2";
  }
}

}  // namespace perry::cuda::testing
