// Shared by the CPU kernel labs (bench/lab_*.cpp): small helpers for checking a variant's output.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace perry::lab {

// max |a - b| / max |b|: the error of a variant relative to the reference's largest value.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::abs(a[i] - b[i])));
    den = std::max(den, double(std::abs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace perry::lab
