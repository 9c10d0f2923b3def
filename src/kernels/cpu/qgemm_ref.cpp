// Weight packing for the quantized kernels and the scalar reference kernels (the oracles).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/qgemm.h"

namespace perry::kernels::q {

using quant::QuantizedWeight;
using quant::quant_scheme;
using quant::quant_mode_name;
using quant::QuantScheme;

namespace {
// Unpacks row n of the canonical weight to int8 [K]. Every integer reading of the bytes (the
// packers, the reference kernels) comes through here, so this is where fp8 codes are refused.
void unpack_row(const QuantizedWeight& w, int64_t n, int8_t* out) {
  PERRY_CHECK(!quant_scheme(w.mode).fp8, "{}: e4m3 codes are not integers; the integer kernels cannot read them",
              quant_mode_name(w.mode));
  if (quant_scheme(w.mode).weight_bits == 8) {
    std::copy_n(w.qweight.data() + n * w.K, w.K, out);
    return;
  }
  const uint8_t* src = reinterpret_cast<const uint8_t*>(w.qweight.data()) + n * w.row_bytes();
  for (int64_t k = 0; k < w.K; ++k) {
    int nib = (k & 1) ? (src[k / 2] >> 4) : (src[k / 2] & 0xF);
    out[k] = int8_t(nib >= 8 ? nib - 16 : nib);
  }
}
int64_t group_len(const QuantizedWeight& w) {
  int gs = quant_scheme(w.mode).group_size;
  return gs == 0 ? w.K : gs;
}
}  // namespace

PackedInt pack_int(const QuantizedWeight& w) {
  w.validate();
  const QuantScheme sc = quant_scheme(w.mode);
  PERRY_CHECK(sc.int8_activations, "pack_int: mode '{}' is not a W*A8 mode", quant_mode_name(w.mode));
  PackedInt p;
  p.N = w.N;
  p.K = w.K;
  p.bits = sc.weight_bits;
  p.G = w.n_groups();
  const int64_t kround = p.bits == 4 ? 8 : 4;
  p.steps = (w.K + kround - 1) / kround * kround / 4;
  p.group_steps = sc.group_size == 0 ? p.steps : sc.group_size / 4;
  p.n_panels = (w.N + kPanel - 1) / kPanel;
  p.panel_bytes = p.bits == 8 ? p.steps * 64 : p.steps * 32;
  p.data.resize(size_t(p.n_panels * p.panel_bytes));
  p.scales.resize(size_t(p.n_panels * p.G * kPanel));
  if (p.bits == 8) p.wsum128.resize(size_t(p.n_panels * p.G * kPanel));
  std::fill_n(p.data.data(), p.data.size(), uint8_t(p.bits == 8 ? 0 : 0x88));
  std::fill_n(p.scales.data(), p.scales.size(), 0.0f);
  std::fill_n(p.wsum128.data(), p.wsum128.size(), 0);
  const int64_t gl = group_len(w);
  std::vector<int8_t> row(static_cast<size_t>(w.K));
  for (int64_t n = 0; n < w.N; ++n) {
    unpack_row(w, n, row.data());
    const int64_t pn = n / kPanel, c = n % kPanel;
    uint8_t* panel = p.data.data() + pn * p.panel_bytes;
    for (int64_t k = 0; k < w.K; ++k) {
      const int64_t s = k / 4, i = k % 4;
      if (p.bits == 8) {
        panel[s * 64 + c * 4 + i] = uint8_t(row[size_t(k)]);
      } else {
        uint8_t& b = panel[(s / 2) * 64 + c * 4 + i];
        const uint8_t nib = uint8_t(row[size_t(k)] + 8);
        b = (s & 1) ? uint8_t((b & 0x0F) | (nib << 4)) : uint8_t((b & 0xF0) | nib);
      }
    }
    for (int g = 0; g < p.G; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * gl; k < std::min(w.K, (g + 1) * gl); ++k) sum += row[size_t(k)];
      p.scales[size_t((pn * p.G + g) * kPanel + c)] = w.scales[size_t(n * p.G + g)];
      if (p.bits == 8) p.wsum128[size_t((pn * p.G + g) * kPanel + c)] = 128 * sum;
    }
  }
  return p;
}

PackedWo pack_wo(const QuantizedWeight& w) {
  w.validate();
  const QuantScheme sc = quant_scheme(w.mode);
  PERRY_CHECK(!sc.int8_activations && sc.group_size > 0, "pack_wo: mode '{}' is not a weight-only mode",
              quant_mode_name(w.mode));
  PackedWo p;
  p.N = w.N;
  p.K = w.K;
  p.bits = sc.weight_bits;
  p.G = w.n_groups();
  p.steps = (w.K + 1) / 2;
  p.group_steps = sc.group_size / 2;
  p.n_panels = (w.N + kPanel - 1) / kPanel;
  p.step_bytes = p.bits == 8 ? 32 : 16;
  p.panel_bytes = p.steps * p.step_bytes;
  p.data.resize(size_t(p.n_panels * p.panel_bytes));
  p.scales.resize(size_t(p.n_panels * p.G * kPanel));
  std::fill_n(p.data.data(), p.data.size(), uint8_t(p.bits == 8 ? 0 : 0x88));
  std::fill_n(p.scales.data(), p.scales.size(), 0.0f);
  std::vector<int8_t> row(static_cast<size_t>(w.K));
  for (int64_t n = 0; n < w.N; ++n) {
    unpack_row(w, n, row.data());
    const int64_t pn = n / kPanel, c = n % kPanel;
    uint8_t* panel = p.data.data() + pn * p.panel_bytes;
    for (int64_t k = 0; k < w.K; ++k) {
      const int64_t s = k / 2, j = k % 2;
      if (p.bits == 8) {
        panel[s * 32 + c * 2 + j] = uint8_t(row[size_t(k)]);
      } else {
        uint8_t& b = panel[s * 16 + c];
        const uint8_t nib = uint8_t(row[size_t(k)] + 8);
        b = j ? uint8_t((b & 0x0F) | (nib << 4)) : uint8_t((b & 0xF0) | nib);
      }
    }
    for (int g = 0; g < p.G; ++g) p.scales[size_t((pn * p.G + g) * kPanel + c)] = w.scales[size_t(n * p.G + g)];
  }
  return p;
}

namespace {
// Writes value v of (n, k) into the canonical weight (int4: nibble in place).
void put_weight(QuantizedWeight& w, int64_t n, int64_t k, int v) {
  if (quant_scheme(w.mode).weight_bits == 8) {
    w.qweight[size_t(n * w.K + k)] = int8_t(v);
    return;
  }
  uint8_t& b = reinterpret_cast<uint8_t&>(w.qweight[size_t(n * w.row_bytes() + k / 2)]);
  const uint8_t nib = uint8_t(v) & 0xF;
  b = (k & 1) ? uint8_t((b & 0x0F) | (nib << 4)) : uint8_t((b & 0xF0) | nib);
}
QuantizedWeight empty_like(quant::QuantMode mode, int64_t N, int64_t K) {
  QuantizedWeight w;
  w.mode = mode;
  w.N = N;
  w.K = K;
  w.qweight.assign(size_t(N * w.row_bytes()), 0);
  w.scales.assign(size_t(N * w.n_groups()), 0.0f);
  return w;
}
}  // namespace

QuantizedWeight unpack_int(const PackedInt& p, quant::QuantMode mode) {
  QuantizedWeight w = empty_like(mode, p.N, p.K);
  PERRY_CHECK(w.n_groups() == p.G, "unpack_int: mode '{}' does not match the packed groups", quant_mode_name(mode));
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t pn = n / kPanel, c = n % kPanel;
    const uint8_t* panel = p.data.data() + pn * p.panel_bytes;
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t s = k / 4, i = k % 4;
      int v;
      if (p.bits == 8) {
        v = int8_t(panel[s * 64 + c * 4 + i]);
      } else {
        const uint8_t b = panel[(s / 2) * 64 + c * 4 + i];
        v = int((s & 1) ? (b >> 4) : (b & 0xF)) - 8;
      }
      put_weight(w, n, k, v);
    }
    for (int g = 0; g < p.G; ++g) w.scales[size_t(n * p.G + g)] = p.scales[size_t((pn * p.G + g) * kPanel + c)];
  }
  return w;
}

QuantizedWeight unpack_wo(const PackedWo& p, quant::QuantMode mode) {
  QuantizedWeight w = empty_like(mode, p.N, p.K);
  PERRY_CHECK(w.n_groups() == p.G, "unpack_wo: mode '{}' does not match the packed groups", quant_mode_name(mode));
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t pn = n / kPanel, c = n % kPanel;
    const uint8_t* panel = p.data.data() + pn * p.panel_bytes;
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t s = k / 2, j = k % 2;
      int v;
      if (p.bits == 8) {
        v = int8_t(panel[s * 32 + c * 2 + j]);
      } else {
        const uint8_t b = panel[s * 16 + c];
        v = int(j ? (b >> 4) : (b & 0xF)) - 8;
      }
      put_weight(w, n, k, v);
    }
    for (int g = 0; g < p.G; ++g) w.scales[size_t(n * p.G + g)] = p.scales[size_t((pn * p.G + g) * kPanel + c)];
  }
  return w;
}

namespace ref {

void int_accumulators(const QuantizedWeight& w, const int8_t* q, int64_t M, int32_t* acc) {
  const int G = w.n_groups();
  const int64_t gl = group_len(w);
  std::vector<int8_t> row(static_cast<size_t>(w.K));
  for (int64_t n = 0; n < w.N; ++n) {
    unpack_row(w, n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* qm = q + m * w.K;
      for (int g = 0; g < G; ++g) {
        int32_t s = 0;
        for (int64_t k = g * gl; k < std::min(w.K, (g + 1) * gl); ++k) s += int32_t(qm[k]) * row[size_t(k)];
        acc[(m * w.N + n) * G + g] = s;
      }
    }
  }
}

void int_forward(const QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias) {
  const int G = w.n_groups();
  std::vector<int8_t> q(size_t(M * w.K));
  std::vector<float> sa{};
  sa.resize(size_t(M));
  for (int64_t m = 0; m < M; ++m) sa[size_t(m)] = quant::quantize_row_ref(x + m * w.K, w.K, q.data() + m * w.K);
  std::vector<int32_t> acc(size_t(M * w.N * G));
  int_accumulators(w, q.data(), M, acc.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      float fa = 0;
      for (int g = 0; g < G; ++g)
        fa = std::fma(float(acc[size_t((m * w.N + n) * G + g)]), w.scales[size_t(n * G + g)], fa);
      y[m * w.N + n] = std::fma(fa, sa[size_t(m)], bias ? bias[n] : 0.0f);
    }
}

void wo_forward(const QuantizedWeight& w, const float* x, int64_t M, float* y, const float* bias) {
  const int G = w.n_groups();
  const int64_t gl = group_len(w);
  std::vector<float> xb(size_t(M * w.K));
  for (int64_t i = 0; i < M * w.K; ++i) xb[size_t(i)] = bf16_to_f32(f32_to_bf16(x[i]));
  std::vector<int8_t> row(static_cast<size_t>(w.K));
  for (int64_t n = 0; n < w.N; ++n) {
    unpack_row(w, n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = xb.data() + m * w.K;
      float fa = 0;
      for (int g = 0; g < G; ++g) {
        float s = 0;
        for (int64_t k = g * gl; k < std::min(w.K, (g + 1) * gl); ++k) s += xm[k] * float(row[size_t(k)]);
        fa = std::fma(s, w.scales[size_t(n * G + g)], fa);
      }
      y[m * w.N + n] = fa + (bias ? bias[n] : 0.0f);
    }
  }
}

}  // namespace ref
}  // namespace perry::kernels::q
