// Two-level group scales for int4 weights (quant.h): the quantizer's rule for one row, and the
// factoring of a weight's scales that the CUDA backend's prefill path runs on.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "quant/two_level_scales.h"

namespace perry::quant {

namespace {
// x (positive, normal) rounded to `bits` significant bits, to nearest.
float round_significand(float x, int bits) {
  int e = 0;
  const float m = std::frexp(x, &e);  // x = m · 2^e, m in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

// An int4 code: round half even of x clamped to [-7, 7], the value std::nearbyint gives in the
// default rounding mode, without its library call (it is not inlined for the baseline x86-64
// target, and the quantizer runs it up to four times per weight at load): x is clamped to ±8
// first, then 1.5·2^23 added and taken away rounds it to an integer, ties to even.
float int4_code(float x) {
  constexpr float kRound = 12582912.0f;
  const float r = (std::clamp(x, -8.0f, 8.0f) + kRound) - kRound;
  return std::clamp(r, -7.0f, 7.0f);
}

// Squared error of quantizing w[0, n) with step `step` to [-7, 7] (round half even). For the
// choice of a multiplier only: w·(1/step) instead of the rule's w/step (a tie may round the other
// way; the codes written follow the rule).
double int4_error(const float* w, int64_t n, float step) {
  const float inv = 1.0f / step;
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float q = int4_code(w[k] * inv);
    const double d = double(w[k]) - double(q) * double(step);
    e += d * d;
  }
  return e;
}

// The integer multiplier t <= 18 of `s` over c (s == c·t exactly), or -1.
int multiplier_of(float s, float c) {
  const float t = std::nearbyint(s / c);
  if (!(t >= 0 && t <= float(kTwoLevelMaxMultiplier))) return -1;
  return c * t == s ? int(t) : -1;
}
}  // namespace

float two_level_channel_scale(float amax) {
  const float c = amax / float(7 * kTwoLevelMaxMultiplier);
  return c >= FLT_MIN ? round_significand(c, 19) : 0.0f;  // 19 bits: c·m (m <= 18, five bits) fits fp32's 24
}

void detail::quantize_row_two_level(const float* w, int64_t K, int64_t gs, int8_t* q, float* scales) {
  const int G = int((K + gs - 1) / gs);
  float amax = 0;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[k]));
  const float c = two_level_channel_scale(amax);
  for (int g = 0; g < G; ++g) {
    const int64_t k0 = g * gs, n = std::min(K, k0 + gs) - k0;
    const float* wg = w + k0;
    float gmax = 0;
    for (int64_t k = 0; k < n; ++k) gmax = std::max(gmax, std::fabs(wg[k]));
    int m = 0;
    if (c > 0 && gmax > 0) {
      // absmax would take the step gmax/7 = k·c; of the integers around k the one with the least
      // error (the one below may clip the group's largest values and still round the rest better).
      const float kf = gmax / (7.0f * c);
      const int hi = std::clamp(int(std::ceil(kf)), 1, kTwoLevelMaxMultiplier);
      const int lo = std::clamp(int(std::floor(kf)) - 1, 1, hi);
      double best = 0;
      for (int t = hi; t >= lo; --t) {
        const double e = int4_error(wg, n, c * float(t));
        if (t == hi || e < best) best = e, m = t;
      }
    }
    const float scale = c * float(m);
    scales[g] = scale;
    for (int64_t k = 0; k < n; ++k)
      q[k0 + k] = scale > 0 ? int8_t(int4_code(wg[k] / scale)) : int8_t(0);
  }
}

std::optional<TwoLevelScales> two_level_scales(const QuantizedWeight& w) {
  const QuantScheme sc = quant_scheme(w.mode);
  if (sc.fp8 || !sc.int8_activations || sc.weight_bits != 4 || sc.group_size == 0) return std::nullopt;
  const int G = w.n_groups();
  if (int64_t(w.scales.size()) != w.N * G) return std::nullopt;
  TwoLevelScales f;
  f.channel.assign(size_t(w.N), 0.0f);
  f.multiplier.assign(size_t(w.N) * size_t(G), 0);
  for (int64_t n = 0; n < w.N; ++n) {
    const float* s = w.scales.data() + n * G;
    int8_t* m = f.multiplier.data() + n * G;
    const float smax = *std::max_element(s, s + G);
    if (!(smax > 0)) continue;  // a zero row: c = 0, m = 0 (its products are 0 either way)
    // The largest scale is c·t for the top multiplier t: 18 from the quantizer, 16-17 where the
    // error search took a smaller one; any t that factors every scale exactly will do.
    bool found = false;
    for (int t = kTwoLevelMaxMultiplier; t >= 1 && !found; --t) {
      const float c = smax / float(t);
      if (!(c >= FLT_MIN)) break;
      found = true;
      for (int g = 0; g < G && found; ++g) {
        const int mg = multiplier_of(s[g], c);
        found = mg >= 0;
        m[g] = int8_t(mg);
      }
      if (found) f.channel[size_t(n)] = c;
    }
    if (!found) return std::nullopt;
  }
  return f;
}

std::optional<TwoLevelScales> int4_two_level_factors(const QuantizedWeight& w) {
  const QuantScheme sc = quant_scheme(w.mode);
  if (sc.group_size != 0) return two_level_scales(w);
  if (sc.fp8 || !sc.int8_activations || sc.weight_bits != 4 || w.K % 128 != 0) return std::nullopt;
  if (int64_t(w.scales.size()) != w.N) return std::nullopt;
  TwoLevelScales f;
  f.channel = w.scales;
  f.multiplier.assign(size_t(w.N) * size_t(w.K / 128), int8_t(1));
  return f;
}

}  // namespace perry::quant
