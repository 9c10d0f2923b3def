#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace perry {

size_t dtype_bits(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 32;
    case DType::F16: case DType::BF16: return 16;
    case DType::I8: case DType::U8: case DType::F8_E4M3: return 8;
    case DType::I64: return 64;
    case DType::I4x2: return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::I4x2: return "I4x2";
    case DType::F8_E4M3: return "F8_E4M3";
  }
  return "?";
}

bool parse_safetensors_dtype(std::string_view s, DType* out) {
  struct { std::string_view n; DType t; } table[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"I8", DType::I8},
      {"U8", DType::U8},   {"I32", DType::I32}, {"I64", DType::I64}, {"F8_E4M3", DType::F8_E4M3}};
  for (auto& e : table)
    if (e.n == s) { *out = e.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) { u = sign; }
    else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rest > half || (rest == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = uint32_t(exp) << 10 | man >> 13, rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) ++r;
  return uint16_t(sign | r);
}

float e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xf, man = b & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(float(man), -9);  // subnormal: man/8 · 2^-6
  return sign * std::ldexp(float(8 + man), exp - 10);      // (1 + man/8) · 2^(exp-7)
}

// By integer operations on the fp32 bits (libm's frexp / ldexp made the per-token quantization
// of w8a8-fp8 cost more than the GEMM after it).
uint8_t f32_to_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | 0x7F);  // NaN
  if (a >= 0x43E00000u) return uint8_t(sign | 0x7E);  // >= 448 (and inf): satfinite
  if (a < 0x3C800000u) {
    // Below 2^-6, the smallest normal: e4m3 subnormals are multiples of 2^-9, and v·2^9 < 8 is
    // exact; nearbyint rounds half to even (8 is the smallest normal's code, 0x08).
    float v;
    std::memcpy(&v, &a, 4);
    return uint8_t(sign | uint8_t(std::nearbyint(v * 512.0f)));
  }
  // Normal: keep 3 of the 23 mantissa bits, the 20 dropped ones rounded half to even (a carry
  // moves into the exponent by itself). Below 448 the result is at most 448, so the e4m3 code
  // is the rounded bits' exponent and 3 mantissa bits re-biased: (r >> 20) - ((127 - 7) << 3).
  const uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) & ~0xFFFFFu;
  return uint8_t(sign | uint8_t((r >> 20) - (120u << 3)));
}

}  // namespace perry
