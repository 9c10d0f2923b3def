// Mode names, the canonical weight format and the quantizers (weights offline, activations online).
#include "quant/quant.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/two_level_scales.h"

namespace perry::quant {

namespace {
struct ModeInfo {
  QuantMode mode;
  std::string_view name;
  QuantScheme scheme;
};
constexpr ModeInfo kModes[] = {
    {QuantMode::F32, "f32", {32, 0, false, false}},
    {QuantMode::BF16, "bf16", {16, 0, false, false}},
    {QuantMode::F16, "f16", {16, 0, false, false}},
    {QuantMode::W8A16, "w8a16", {8, 128, false, false}},
    {QuantMode::W4A16, "w4a16", {4, 128, false, false}},
    {QuantMode::W8A8, "w8a8", {8, 0, true, false}},
    {QuantMode::W8A8_G128, "w8a8-g128", {8, 128, true, false}},
    {QuantMode::W8A8_G64, "w8a8-g64", {8, 64, true, false}},
    {QuantMode::W4A8, "w4a8", {4, 0, true, false}},
    {QuantMode::W4A8_G128, "w4a8-g128", {4, 128, true, false}},
    {QuantMode::W8A8_FP8, "w8a8-fp8", {8, 0, false, true}},
};

// Lowers `first` to index i unless a lower one is there (-1: none yet): the lowest index any
// thread of a parallel scan found wins, so the error names the first bad element.
void note_first(std::atomic<int64_t>& first, int64_t i) {
  int64_t cur = first.load();
  while ((cur < 0 || i < cur) && !first.compare_exchange_weak(cur, i)) {
  }
}

// scale and inv of one row of the e4m3 rule (quantize_row_fp8_ref), from its amax.
void fp8_row_params(float amax, float& scale, float& inv) {
  inv = amax > 0 ? 448.0f / amax : 0.0f;
  scale = amax / 448.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
}
// One row by the absmax rule: per group (or the whole row) scale = amax/qmax, q = round half even
// of w/scale clamped to ±qmax; an all-zero (or denormal-tiny) group gets scale 0 and q = 0.
// not_finite(k) is called for each non-finite weight.
template <typename OnBad>
void quantize_row_absmax(const float* wr, int64_t K, int64_t gs, float qmax, int8_t* row, float* scales,
                         OnBad&& not_finite) {
  for (int64_t g = 0, k0 = 0; k0 < K; ++g, k0 += gs) {
    const int64_t k1 = std::min(K, k0 + gs);
    float amax = 0;
    for (int64_t k = k0; k < k1; ++k) {
      if (!std::isfinite(wr[k])) not_finite(k);
      amax = std::max(amax, std::fabs(wr[k]));
    }
    float scale = amax / qmax;
    if (!(scale > 0) || !std::isfinite(scale)) scale = 0;
    scales[g] = scale;
    for (int64_t k = k0; k < k1; ++k) {
      const float v = scale > 0 ? std::nearbyint(wr[k] / scale) : 0.0f;
      row[k] = int8_t(std::clamp(v, -qmax, qmax));
    }
  }
}
const ModeInfo& info(QuantMode m) {
  for (const auto& i : kModes)
    if (i.mode == m) return i;
  fail("unknown QuantMode value {}", int(m));
}
}  // namespace

std::optional<QuantMode> parse_quant_mode(std::string_view name) {
  std::string lower(name);
  for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "w8a8-g0") lower = "w8a8";
  for (const auto& i : kModes)
    if (i.name == lower) return i.mode;
  return std::nullopt;
}

std::string_view quant_mode_name(QuantMode mode) { return info(mode).name; }
QuantScheme quant_scheme(QuantMode mode) { return info(mode).scheme; }
bool is_quantized(QuantMode mode) { return info(mode).scheme.weight_bits <= 8; }

std::string quant_mode_names() {
  std::string s;
  for (const auto& i : kModes) {
    if (!s.empty()) s += ", ";
    s += i.name;
  }
  return s;
}

int QuantizedWeight::n_groups() const {
  int gs = quant_scheme(mode).group_size;
  if (gs == 0) return 1;
  return int(std::max<int64_t>(1, (K + gs - 1) / gs));
}

int64_t QuantizedWeight::row_bytes() const {
  return quant_scheme(mode).weight_bits == 4 ? (K + 1) / 2 : K;
}

int QuantizedWeight::weight(int64_t n, int64_t k) const {
  PERRY_CHECK(!quant_scheme(mode).fp8, "QuantizedWeight::weight: {} stores e4m3 codes, not integers (use weight_value)",
              quant_mode_name(mode));
  if (quant_scheme(mode).weight_bits == 8) return qweight[size_t(n * K + k)];
  uint8_t b = uint8_t(qweight[size_t(n * row_bytes() + k / 2)]);
  int nib = (k & 1) ? (b >> 4) : (b & 0xF);
  return nib >= 8 ? nib - 16 : nib;
}

float QuantizedWeight::weight_value(int64_t n, int64_t k) const {
  if (quant_scheme(mode).fp8) return e4m3_to_f32(uint8_t(qweight[size_t(n * K + k)]));
  return float(weight(n, k));
}

void QuantizedWeight::validate() const {
  PERRY_CHECK(is_quantized(mode), "QuantizedWeight: mode '{}' is a float mode, not a quantized one",
              quant_mode_name(mode));
  PERRY_CHECK(N > 0 && K > 0, "QuantizedWeight: shape [{}, {}] must be positive", N, K);
  // 255·127·K must fit the int32 accumulators of the u8×s8 kernels.
  PERRY_CHECK(K <= 65536, "QuantizedWeight: K = {} is larger than the supported 65536", K);
  PERRY_CHECK(int64_t(qweight.size()) == N * row_bytes(),
              "QuantizedWeight ({}, [{}, {}]): qweight has {} bytes, expected {}", quant_mode_name(mode), N,
              K, qweight.size(), N * row_bytes());
  PERRY_CHECK(int64_t(scales.size()) == N * n_groups(),
              "QuantizedWeight ({}, [{}, {}]): scales has {} values, expected {} ({} per row)",
              quant_mode_name(mode), N, K, scales.size(), N * n_groups(), n_groups());
  for (float s : scales)
    PERRY_CHECK(std::isfinite(s) && s >= 0, "QuantizedWeight ({}): scale {} is not finite and >= 0",
                quant_mode_name(mode), s);
  // (Scanned in parallel: an 8B model has ~7e9 weight bytes.)
  if (quant_scheme(mode).fp8) {
    // e4m3 has no infinities; S.1111.111 (0x7F, 0xFF) is NaN, which the quantizer never writes
    // for a finite weight: such a byte means a corrupt or foreign file.
    std::atomic<int64_t> first_nan{-1};
    thread_pool().parallel_for(qweight.size(), 1 << 20, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i)
        if ((uint8_t(qweight[i]) & 0x7F) == 0x7F) return note_first(first_nan, int64_t(i));
    });
    if (const int64_t i = first_nan.load(); i >= 0)
      fail("QuantizedWeight ({}): weight [{}, {}] is the e4m3 NaN code 0x{:02X} (fp8 weights must be finite)",
           quant_mode_name(mode), i / K, i % K, uint8_t(qweight[size_t(i)]));
    return;
  }
  // The kernels rely on |q| <= 127 (int8) / 7 (int4): -128 or -8 would overflow their sums.
  const bool int8 = quant_scheme(mode).weight_bits == 8;
  std::atomic<bool> bad{false};
  thread_pool().parallel_for(qweight.size(), 1 << 20, [&](size_t b, size_t e) {
    bool found = false;
    for (size_t i = b; i < e; ++i) {
      const uint8_t q = uint8_t(qweight[i]);
      found |= int8 ? q == 0x80 : ((q & 0xF) == 8 || (q >> 4) == 8);
    }
    if (found) bad = true;
  });
  if (bad) {
    if (int8) fail("QuantizedWeight ({}): weight value -128 is outside [-127, 127]", quant_mode_name(mode));
    fail("QuantizedWeight ({}): int4 weight value -8 is outside [-7, 7]", quant_mode_name(mode));
  }
}

QuantizedWeight quantize_weight(const float* w, int64_t N, int64_t K, QuantMode mode) {
  PERRY_CHECK(is_quantized(mode), "quantize_weight: '{}' is a float mode; nothing to quantize",
              quant_mode_name(mode));
  PERRY_CHECK(N > 0 && K > 0, "quantize_weight: shape [{}, {}] must be positive", N, K);
  QuantizedWeight q;
  q.mode = mode;
  q.N = N;
  q.K = K;
  const QuantScheme sc = quant_scheme(mode);
  const int G = q.n_groups();
  const int64_t gs = sc.group_size == 0 ? K : sc.group_size;
  const float qmax = sc.weight_bits == 8 ? 127.0f : 7.0f;
  q.qweight.assign(size_t(N * q.row_bytes()), 0);
  q.scales.assign(size_t(N * G), 0.0f);
  // Rows are independent: quantized in parallel (an 8B model has ~7e9 weights). A non-finite
  // weight is recorded (lowest index wins) and reported after the parallel region.
  std::atomic<int64_t> bad{-1};
  thread_pool().parallel_for(size_t(N), 16, [&](size_t n_begin, size_t n_end) {
    std::vector<int8_t> row(static_cast<size_t>(K));
    for (int64_t n = int64_t(n_begin); n < int64_t(n_end); ++n) {
      const float* wr = w + n * K;
      if (sc.fp8) {
        // Per output channel, by the activations' own rule (one function for both, which the
        // GPU's quantize_per_token_fp8 matches bit for bit).
        for (int64_t k = 0; k < K; ++k)
          if (!std::isfinite(wr[k])) note_first(bad, n * K + k);
        q.scales[size_t(n)] = quantize_row_fp8_ref(wr, K, reinterpret_cast<uint8_t*>(q.qweight.data() + n * K));
        continue;
      }
      if (mode == QuantMode::W4A8_G128) {  // two-level group scales (two_level_scales.h)
        bool finite = true;
        for (int64_t k = 0; k < K; ++k)
          if (!std::isfinite(wr[k])) note_first(bad, n * K + k), finite = false;
        if (finite) detail::quantize_row_two_level(wr, K, gs, row.data(), q.scales.data() + n * G);
      } else {
        quantize_row_absmax(wr, K, gs, qmax, row.data(), q.scales.data() + n * G, [&](int64_t k) { note_first(bad, n * K + k); });
      }
      if (sc.weight_bits == 8) {
        std::copy(row.begin(), row.end(), q.qweight.begin() + n * K);
      } else {
        int8_t* dst = q.qweight.data() + n * q.row_bytes();
        for (int64_t k = 0; k < K; k += 2) {
          uint8_t lo = uint8_t(row[size_t(k)]) & 0xF;
          uint8_t hi = k + 1 < K ? uint8_t(row[size_t(k + 1)]) & 0xF : 0;
          dst[k / 2] = int8_t(lo | (hi << 4));
        }
      }
    }
  });
  if (bad.load() >= 0) {
    const int64_t i = bad.load();
    fail("quantize_weight: weight [{}, {}] is not finite ({})", i / K, i % K, w[i]);
  }
  return q;
}

std::vector<float> dequantize_weight(const QuantizedWeight& w) {
  std::vector<float> out(size_t(w.N * w.K));
  const int G = w.n_groups();
  const int gs = quant_scheme(w.mode).group_size;
  for (int64_t n = 0; n < w.N; ++n)
    for (int64_t k = 0; k < w.K; ++k) {
      int g = gs == 0 ? 0 : int(k / gs);
      out[size_t(n * w.K + k)] = w.weight_value(n, k) * w.scales[size_t(n * G + g)];
    }
  return out;
}

float quantize_row_ref(const float* x, int64_t K, int8_t* q) {
  float amax = 0;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  float inv = amax > 0 ? 127.0f / amax : 0.0f;
  float scale = amax / 127.0f;
  if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0;
  for (int64_t k = 0; k < K; ++k) {
    float v = std::nearbyint(x[k] * inv);
    v = std::min(std::max(v, -127.0f), 127.0f);
    q[k] = v == v ? int8_t(v) : int8_t(0);
  }
  return scale;
}

float quantize_row_fp8_ref(const float* x, int64_t K, uint8_t* q) {
  float amax = 0;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));  // a NaN element is skipped
  float scale, inv;
  fp8_row_params(amax, scale, inv);
  for (int64_t k = 0; k < K; ++k) q[k] = f32_to_e4m3(x[k] * inv);
  return scale;
}

}  // namespace perry::quant
