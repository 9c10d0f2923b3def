// Shared by the CPU kernel labs (bench/lab_*.cpp): small helpers for checking a variant's output.
#pragma once
#include <algorithm>
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
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


// Streaming read of [b, e) with AVX-512 loads, XOR-folded so nothing is optimised away. The lab is
// built without ISA flags (the machine it documents has AVX-512), hence the target attribute.
__attribute__((target("avx512f"))) inline uint64_t read_range(const uint8_t* p, size_t b, size_t e) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = b; i + 256 <= e; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t v[8];
  _mm512_store_si512(v, a0);
  return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
}

}  // namespace perry::lab
