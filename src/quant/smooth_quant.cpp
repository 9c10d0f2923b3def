#include "quant/smooth_quant.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace perry::quant {

void ChannelAbsMax::observe(const float* x, int64_t rows, int64_t n) {
  if (max_abs.empty()) max_abs.assign(size_t(n), 0.0f);
  PERRY_CHECK(int64_t(max_abs.size()) == n, "calibration: channel count changed ({} vs {})", max_abs.size(), n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) max_abs[size_t(j)] = std::max(max_abs[size_t(j)], std::abs(x[r * n + j]));
}

std::vector<float> smoothing_factors(const std::vector<float>& act, const std::vector<float>& wmax, double alpha) {
  PERRY_CHECK(act.size() == wmax.size(), "smoothing: {} activation channels vs {} weight columns", act.size(), wmax.size());
  PERRY_CHECK(alpha >= 0 && alpha <= 1, "--smooth alpha must be in [0, 1], got {}", alpha);
  std::vector<float> s(act.size(), 1.0f);
  for (size_t j = 0; j < act.size(); ++j) {
    if (act[j] <= 0 || wmax[j] <= 0) continue;
    const double v = std::pow(double(act[j]), alpha) / std::pow(double(wmax[j]), 1.0 - alpha);
    s[j] = float(std::clamp(v, 1e-5, 1e5));
  }
  return s;
}

void fold_column_absmax(const float* w, int64_t N, int64_t K, std::vector<float>& acc) {
  if (acc.empty()) acc.assign(size_t(K), 0.0f);
  PERRY_CHECK(int64_t(acc.size()) == K, "smoothing: column count mismatch");
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < K; ++j) acc[size_t(j)] = std::max(acc[size_t(j)], std::abs(w[i * K + j]));
}

}  // namespace perry::quant
