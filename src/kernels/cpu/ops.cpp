// Scalar references of the row kernels and the dispatch to the AVX-512 versions.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace perry::kernels {
namespace {

// Below this many elements a kernel runs on the calling thread: waking the pool costs more
// (~2-5 us) than streaming 64 KiB.
constexpr int64_t kParallelElems = 1 << 16;

bool use_avx512() { return supports_avx512(); }

// Splits rows across the pool when the work is large enough to pay for the wake-up.
template <typename F>
void for_rows(int64_t rows, int64_t row_elems, F&& fn) {
  if (rows <= 1 || rows * row_elems < kParallelElems) {
    fn(int64_t(0), rows);
    return;
  }
  thread_pool().parallel_for(size_t(rows), 1, [&](size_t b, size_t e) { fn(int64_t(b), int64_t(e)); });
}

// Flat elementwise split, chunk boundaries on 64-element multiples so vectors stay aligned-ish.
template <typename F>
void for_elems(int64_t n, F&& fn) {
  if (n < kParallelElems) {
    fn(int64_t(0), n);
    return;
  }
  int64_t blocks = (n + 63) / 64;
  thread_pool().parallel_for(size_t(blocks), 256, [&](size_t b, size_t e) {
    fn(int64_t(b) * 64, std::min<int64_t>(n, int64_t(e) * 64));
  });
}

}  // namespace

namespace ref {

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax_inplace(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, int64_t pos0, const RopeTable& rope,
                const int32_t* positions) {
  const int hd = rope.head_dim(), half = hd / 2;
  for (int64_t t = 0; t < T; ++t) {
    int64_t pos = positions ? positions[t] : pos0 + t;
    PERRY_CHECK(pos >= 0 && pos < rope.max_positions(), "rope_apply: position {} outside the table [0, {})",
                pos, rope.max_positions());
    const float* c = rope.cos(pos);
    const float* s = rope.sin(pos);
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + int64_t(h) * hd;
      for (int i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace ref

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y) {
  PERRY_CHECK(rows >= 0 && n > 0, "rms_norm: bad shape rows={} n={}", rows, n);
  for_rows(rows, n, [&](int64_t r0, int64_t r1) {
    if (use_avx512())
      avx512::rms_norm(x + r0 * n, w, eps, r1 - r0, n, y + r0 * n);
    else
      ref::rms_norm(x + r0 * n, w, eps, r1 - r0, n, y + r0 * n);
  });
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for_elems(n, [&](int64_t b, int64_t e) {
    if (use_avx512())
      avx512::silu_mul(gate + b, up + b, e - b, out + b);
    else
      ref::silu_mul(gate + b, up + b, e - b, out + b);
  });
}

void add_inplace(float* y, const float* x, int64_t n) {
  for_elems(n, [&](int64_t b, int64_t e) {
    if (use_avx512())
      avx512::add_inplace(y + b, x + b, e - b);
    else
      ref::add_inplace(y + b, x + b, e - b);
  });
}

void softmax_inplace(float* x, int64_t n) {
  PERRY_CHECK(n >= 1, "softmax_inplace: empty row");
  if (use_avx512())
    avx512::softmax_inplace(x, n);
  else
    ref::softmax_inplace(x, n);
}

void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, int64_t pos0, const RopeTable& rope,
                const int32_t* positions) {
  PERRY_CHECK(T >= 0 && n_heads > 0 && row_stride >= int64_t(n_heads) * rope.head_dim(),
              "rope_apply: bad shape T={} heads={} row_stride={} head_dim={}", T, n_heads, row_stride,
              rope.head_dim());
  for (int64_t t = 0; t < T; ++t) {
    int64_t pos = positions ? positions[t] : pos0 + t;
    PERRY_CHECK(pos >= 0 && pos < rope.max_positions(),
                "rope_apply: position {} outside the rope table [0, {}) (raise max positions)", pos,
                rope.max_positions());
  }
  for_rows(T, int64_t(n_heads) * rope.head_dim(), [&](int64_t t0, int64_t t1) {
    float* xs = x + t0 * row_stride;
    const int32_t* ps = positions ? positions + t0 : nullptr;
    if (use_avx512())
      avx512::rope_apply(xs, t1 - t0, n_heads, row_stride, ps, pos0 + t0, rope);
    else
      ref::rope_apply(xs, t1 - t0, n_heads, row_stride, pos0 + t0, rope, ps);
  });
}

RopeTable::RopeTable(int head_dim, double rope_theta, int64_t max_positions, std::optional<Llama3RopeScaling> sc)
    : head_dim_(head_dim), max_positions_(max_positions) {
  PERRY_CHECK(head_dim > 0 && head_dim % 2 == 0, "RopeTable: head_dim {} must be even and positive", head_dim);
  PERRY_CHECK(rope_theta > 0, "RopeTable: rope_theta {} must be positive", rope_theta);
  PERRY_CHECK(max_positions > 0, "RopeTable: max_positions {} must be positive", max_positions);
  const int half = head_dim / 2;
  inv_freq_.resize(half);
  // transformers: inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32 ops.
  for (int i = 0; i < half; ++i) {
    float expo = float(2 * i) / float(head_dim);
    float p = float(std::pow(double(float(rope_theta)), double(expo)));
    inv_freq_[i] = 1.0f / p;
  }
  if (sc) {
    PERRY_CHECK(sc->factor > 0 && sc->high_freq_factor != sc->low_freq_factor && sc->low_freq_factor > 0 &&
                    sc->original_max_position_embeddings > 0,
                "RopeTable: bad llama3 rope_scaling (factor {}, low_freq_factor {}, high_freq_factor {}, "
                "original_max_position_embeddings {})",
                sc->factor, sc->low_freq_factor, sc->high_freq_factor, sc->original_max_position_embeddings);
    // _compute_llama3_parameters, elementwise on float32 tensors with python-float scalars.
    const float factor = float(sc->factor), lff = float(sc->low_freq_factor), hff = float(sc->high_freq_factor);
    const float old_ctx = float(sc->original_max_position_embeddings);
    const double low_freq_wavelen = sc->original_max_position_embeddings / sc->low_freq_factor;
    const double high_freq_wavelen = sc->original_max_position_embeddings / sc->high_freq_factor;
    for (int i = 0; i < half; ++i) {
      float f = inv_freq_[i];
      // torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar, in float32.
      float wavelen = (1.0f / f) * float(2.0 * M_PI);
      float llama = wavelen > low_freq_wavelen ? f / factor : f;
      float smooth = ((1.0f / wavelen) * old_ctx - lff) / (hff - lff);
      float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
      bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      inv_freq_[i] = medium ? smoothed : llama;
    }
  }
  cos_.resize(size_t(max_positions) * half);
  sin_.resize(size_t(max_positions) * half);
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      float angle = float(p) * inv_freq_[i];
      cos_[size_t(p) * half + i] = float(std::cos(double(angle)));
      sin_[size_t(p) * half + i] = float(std::sin(double(angle)));
    }
  }
}

void embedding_lookup(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out,
                      int64_t vocab) {
  PERRY_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
              "embedding_lookup: table dtype {} not supported (F32, F16, BF16)", dtype_name(dtype));
  PERRY_CHECK(dim > 0 && n >= 0, "embedding_lookup: bad shape dim={} n={}", dim, n);
  const size_t esize = dtype_bits(dtype) / 8;
  for (int64_t i = 0; i < n; ++i) {
    PERRY_CHECK(ids[i] >= 0 && (vocab < 0 || ids[i] < vocab), "embedding_lookup: token id {} outside [0, {})",
                ids[i], vocab);
    const void* row = static_cast<const uint8_t*>(table) + size_t(ids[i]) * size_t(dim) * esize;
    float* o = out + i * dim;
    if (use_avx512()) {
      avx512::convert_row_to_f32(row, dtype, dim, o);
      continue;
    }
    switch (dtype) {
      case DType::F32:
        std::copy_n(static_cast<const float*>(row), dim, o);
        break;
      case DType::F16:
        for (int64_t j = 0; j < dim; ++j) o[j] = f16_to_f32(static_cast<const uint16_t*>(row)[j]);
        break;
      default:
        for (int64_t j = 0; j < dim; ++j) o[j] = bf16_to_f32(static_cast<const uint16_t*>(row)[j]);
        break;
    }
  }
}

}  // namespace perry::kernels
