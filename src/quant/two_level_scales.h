// Two-level group scales for int4 weights (QServe's "progressive" group quantization), what
// quant::quantize_weight writes for w4a8-g128:
//   scale[n, g] = channel[n] · m[n, g], m a small integer in [0, 18], the product exact in fp32
//   (channel[n] keeps 19 significant bits).
// The int4 codes times m are then int8 codes (|q·m| <= 7·18 = 126) of the one per-channel scale,
// so an int8 GEMM with a per-channel epilogue computes the grouped product with no per-group fold
// in its inner loop (the CUDA backend's prefill path; docs/quantization.md). The stored format is
// unchanged: every other kernel reads the scales as the plain group scales they still are.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "quant/quant.h"

namespace perry::quant {

constexpr int kTwoLevelMaxMultiplier = 18;

struct TwoLevelScales {
  std::vector<float> channel;      // [N]
  std::vector<int8_t> multiplier;  // [N, G], 0..kTwoLevelMaxMultiplier
};

// The factors of an int4 W*A8 grouped weight's scales when every row has them: per row a scale c
// (the row's largest scale over an integer t <= 18) such that every scale is c·m exactly, m an
// integer in [0, 18]. nullopt for other modes and for scales that do not factor (checkpoints
// quantized before two-level scales, or elsewhere): those run the grouped kernels. Any factoring
// computes the same products, so a checkpoint whose scales happen to factor qualifies too.
std::optional<TwoLevelScales> two_level_scales(const QuantizedWeight& w);

// The factors the two-level kernels take for an int4 W*A8 weight of either kind: w4a8-g128's by
// two_level_scales; per-channel w4a8's as channel = its scales and a multiplier of 1 for every
// 128-k block (multiplier [N, K/128]: q·1 = q, already int8 codes of the channel scale), so the
// per-channel layer runs the same register-converting GEMM and expansion pass. nullopt for other
// modes, scales that do not factor, and per-channel K not a multiple of 128.
std::optional<TwoLevelScales> int4_two_level_factors(const QuantizedWeight& w);

// The channel scale of a row whose largest |w| is amax: amax/126 rounded to 19 significant bits
// (so c·m is exact in fp32 for every m <= 18); 0 when amax/126 is below FLT_MIN.
float two_level_channel_scale(float amax);

namespace detail {
// One row by the two-level rule: channel = amax(row)/126 rounded to 19 significant bits; per
// group the multiplier among floor(k)−1 .. ceil(k) (within 1..18), k = amax(group)/(7·channel),
// with the least squared error (ties: the larger), then q = round half even of w/scale clamped to
// ±7. An all-zero group gets m = 0; a row of zeros, or one whose amax/126 is below FLT_MIN, is 0.
// q int8 [K] (unpacked values), scales [ceil(K / group_size)]. Finite weights (the caller checks).
void quantize_row_two_level(const float* w, int64_t K, int64_t group_size, int8_t* q, float* scales);
}  // namespace detail

}  // namespace perry::quant
