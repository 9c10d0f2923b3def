// Shared helpers for the float kernel tests: random data (never zeros) and ISA path switching.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"

namespace perry::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = d(rng);
    while (x == 0.0f);
  }
  return v;
}

// The ISA levels this machine can run, for "every path" loops.
inline std::vector<IsaLevel> available_isas() {
  std::vector<IsaLevel> v{IsaLevel::Scalar};
  const auto& f = cpu_features();
  if (f.avx2 && f.fma && f.f16c) v.push_back(IsaLevel::Avx2);
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) v.push_back(IsaLevel::Avx512);
  return v;
}

inline const char* isa_name(IsaLevel l) {
  return l == IsaLevel::Scalar ? "scalar" : l == IsaLevel::Avx2 ? "avx2" : "avx512";
}

// Restores the ISA cap when a test scope ends (a failing assertion must not leak a cap).
struct IsaScope {
  IsaLevel saved = max_isa();
  explicit IsaScope(IsaLevel l) { set_max_isa(l); }
  ~IsaScope() { set_max_isa(saved); }
};

}  // namespace perry::test
