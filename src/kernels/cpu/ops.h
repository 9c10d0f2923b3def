// Elementwise and per-row float kernels used between the linear layers: RMSNorm, SwiGLU,
// residual add, softmax, rotary embeddings, embedding lookup. All activations are fp32.
// Each has a scalar reference (ops.cpp) and an AVX-512 version (ops_avx512.cpp) chosen per call
// from supports_avx512() (so PERRY_FORCE_ISA / set_max_isa switch paths at run time).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"

namespace perry::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]   (HF LlamaRMSNorm / Qwen2RMSNorm / Qwen3
// q_norm, k_norm with rows = tokens*heads, n = head_dim). y may alias x.
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// y[i] += x[i]  (residual connections).
void add_inplace(float* y, const float* x, int64_t n);

// x = softmax(x), max-subtracted; n >= 1.
void softmax_inplace(float* x, int64_t n);

// Llama-3 "rope_type": "llama3" scaling (transformers' _compute_llama3_parameters).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// cos/sin of position * inv_freq for positions [0, max_positions), head_dim/2 frequencies.
// inv_freq and the angles are computed in float32 exactly as transformers does (inv_freq =
// 1 / theta^(2i/d) in float32, angle = float(pos) * inv_freq rounded to float32), so our logits
// match the HF golden files at long positions too; cos/sin of that float angle are then exact.
// Memory: 2 * max_positions * head_dim/2 floats (32k positions x 64 = 8 MiB for head_dim 128).
class RopeTable {
 public:
  RopeTable(int head_dim, double rope_theta, int64_t max_positions,
            std::optional<Llama3RopeScaling> scaling = std::nullopt);
  int head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  const float* cos(int64_t pos) const { return cos_.data() + pos * (head_dim_ / 2); }
  const float* sin(int64_t pos) const { return sin_.data() + pos * (head_dim_ / 2); }

 private:
  int head_dim_;
  int64_t max_positions_;
  std::vector<float> inv_freq_, cos_, sin_;
};

// Rotates x in place, HF half-rotation style: for each head, pairs (i, i + hd/2), i < hd/2:
//   x'[i] = x[i] cos - x[i+hd/2] sin,   x'[i+hd/2] = x[i+hd/2] cos + x[i] sin.
// x: T tokens, token t starts at x + t * row_stride and holds n_heads heads of rope.head_dim()
// floats each, contiguous. Token t is at position pos0 + t (or positions[t] when given).
// Throws perry::Error if a position is outside the table.
void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, int64_t pos0, const RopeTable& rope,
                const int32_t* positions = nullptr);

// out[i, :] = float(table[ids[i], :]), table [vocab, dim] of dtype F32, F16 or BF16.
// vocab >= 0 enables the range check of ids (clear error instead of an out-of-bounds read);
// negative ids are always rejected.
void embedding_lookup(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out,
                      int64_t vocab = -1);

// The scalar references, always available (tests compare the dispatched path against them).
namespace ref {
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void add_inplace(float* y, const float* x, int64_t n);
void softmax_inplace(float* x, int64_t n);
void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, int64_t pos0, const RopeTable& rope,
                const int32_t* positions = nullptr);
}  // namespace ref

// AVX-512 versions (ops_avx512.cpp); call only when supports_avx512().
namespace avx512 {
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void add_inplace(float* y, const float* x, int64_t n);
void softmax_inplace(float* x, int64_t n);
void rope_apply(float* x, int64_t T, int n_heads, int64_t row_stride, const int32_t* positions, int64_t pos0,
                const RopeTable& rope);
void convert_row_to_f32(const void* src, DType dtype, int64_t n, float* out);
}  // namespace avx512

}  // namespace perry::kernels
