// Storage element types and the float16/bfloat16 <-> float conversions every layer shares.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace perry {

// F8_E4M3: one fp8 e4m3fn byte per element (safetensors' "F8_E4M3"; the codec is below).
enum class DType : uint8_t { F32, F16, BF16, I8, U8, I32, I64, I4x2 /* two int4 per byte */, F8_E4M3 };

size_t dtype_bits(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("F32", "BF16", ...); returns false if unknown.
bool parse_safetensors_dtype(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even, NaN preserved (same as PyTorch's conversion).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// FP8 E4M3 (the OCP "e4m3fn" format of Hopper's fp8 tensor cores): 1 sign, 4 exponent (bias 7),
// 3 mantissa bits; no infinities; S.1111.111 is NaN; largest finite ±448, smallest ±2^-9.
float e4m3_to_f32(uint8_t b);
// Round-to-nearest-even with saturation to ±448 (±inf too), NaN → 0x7F with the sign: the rule
// of the GPU's cvt.rn.satfinite.e4m3x2.f32, so host-quantized weights and device-quantized
// activations follow one rule.
uint8_t f32_to_e4m3(float f);

}  // namespace perry
