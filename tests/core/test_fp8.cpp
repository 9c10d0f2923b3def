// The FP8 E4M3 codec (core/dtype.h) against the format's definition, computed independently in
// double: every one of the 256 codes decodes to its value; every finite code survives a round
// trip; every midpoint between neighbouring codes rounds to the even one; saturation and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"

namespace {

// The value of code b from the format's fields, in double (the oracle).
double e4m3_value(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}
bool is_nan_code(int b) { return (b & 0x7f) == 0x7f; }

TEST(Fp8E4M3, DecodesEveryCode) {
  for (int b = 0; b < 256; ++b) {
    const float v = perry::e4m3_to_f32(uint8_t(b));
    if (is_nan_code(b)) {
      EXPECT_TRUE(std::isnan(v)) << b;
    } else {
      EXPECT_EQ(double(v), e4m3_value(b)) << b;
      EXPECT_EQ(std::signbit(v), b >= 128) << b;  // -0 is 0x80
    }
  }
  EXPECT_EQ(perry::e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(perry::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, RoundTripsEveryFiniteCode) {
  for (int b = 0; b < 256; ++b) {
    if (is_nan_code(b)) continue;
    EXPECT_EQ(perry::f32_to_e4m3(perry::e4m3_to_f32(uint8_t(b))), b) << b;
  }
}

TEST(Fp8E4M3, RoundsToNearestEvenAndSaturates) {
  // Neighbouring positive finite codes c, c+1: just below the midpoint → c, just above → c+1,
  // exactly at it → the even code (the one whose mantissa bit 0 is clear).
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1), mid = (lo + hi) / 2;
    const float below = std::nextafter(float(mid), -1.0f), above = std::nextafter(float(mid), 1000.0f);
    ASSERT_EQ(double(float(mid)), mid) << c;  // midpoints are exact in fp32
    EXPECT_EQ(perry::f32_to_e4m3(below), c) << c;
    EXPECT_EQ(perry::f32_to_e4m3(above), c + 1) << c;
    EXPECT_EQ(perry::f32_to_e4m3(float(mid)), (c & 1) ? c + 1 : c) << c;
    EXPECT_EQ(perry::f32_to_e4m3(-below), 0x80 | c) << c;
  }
  for (float big : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(perry::f32_to_e4m3(big), 0x7e) << big;
    EXPECT_EQ(perry::f32_to_e4m3(-big), 0xfe) << big;
  }
  EXPECT_EQ(perry::f32_to_e4m3(std::ldexp(1.0f, -11)), 0x00);   // a quarter of the smallest: 0
  EXPECT_EQ(perry::f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half of it: the tie goes to 0
  EXPECT_EQ(perry::f32_to_e4m3(std::ldexp(3.0f, -11)), 0x01);   // three quarters: 1
  EXPECT_EQ(perry::f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(perry::f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

}  // namespace
