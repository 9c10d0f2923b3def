// CUDA elementwise / normalization kernels between the linear layers of the decoder: embedding
// lookup, RMSNorm (plain, fused residual add, per head), RoPE, SwiGLU, residual add, fp32->bf16,
// greedy argmax. They follow the CPU semantics of src/kernels/cpu/ops.h.
//
// Conventions: all pointers are device pointers, activations are fp32 row-major, calls are
// asynchronous on `stream`. Bad arguments (null pointers, non-positive sizes, unknown formats)
// throw perry::Error before anything is launched; launch failures throw perry::Error naming the
// kernel. Errors that only the device can see (a token id or a position out of range) cannot
// throw: the affected output row is filled with NaN instead of reading out of bounds, so the
// mistake shows up in the logits rather than as silent garbage or a fault.
//
// Numerics: the RMSNorm sums of squares are accumulated in float64 (x*x is exact in double, so
// only the summation order differs from the CPU reference kernels::ref::rms_norm, which also sums
// in double); 1/sqrt(mean + eps) is computed in double and rounded to float exactly like the CPU
// reference, then y = (x * inv) * w in fp32. So the outputs are bit-identical to ref::rms_norm
// except when the reordered double sum flips the float rounding of inv (~1 row in 2^28). The
// AVX-512 CPU path sums in fp32 and differs from both by a few ulp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace perry::cuda {

// Output format of a kernel that produces the input of the next linear layer, so that the norm
// or SwiGLU writes it in one pass:
//   F32:  data = float    [M, width]
//   BF16: data = uint16_t [M, width], round-to-nearest-even bits (NaN kept as a quiet NaN, the
//         same bits as perry::f32_to_bf16 on the host)
//   I8:   data = int8_t   [M, width] and scale = float [M]: per-token quantization of the fp32
//         row (the exact rule of quantize_per_token / quant::quantize_row_ref), i.e. the bytes
//         and scales are those of quantize_per_token applied to the F32 output of the same call.
enum class ActFormat : uint8_t { F32, BF16, I8 };

struct ActOut {
  ActFormat fmt = ActFormat::F32;
  void* data = nullptr;
  float* scale = nullptr;  // I8 only (ignored otherwise)

  static ActOut f32(float* y) { return {ActFormat::F32, y, nullptr}; }
  static ActOut bf16(uint16_t* y) { return {ActFormat::BF16, y, nullptr}; }
  static ActOut i8(int8_t* q, float* scale) { return {ActFormat::I8, q, scale}; }
};

// out[m, :] = float(table[tokens[m], :]); table [vocab, hidden] of DType F32, F16 or BF16.
// vocab >= 0 enables the upper range check; a token id < 0 (or >= vocab) gives a NaN row.
void embedding_lookup(const void* table, DType dt, int64_t hidden, const int32_t* d_tokens, int M, float* out,
                      cudaStream_t stream, int64_t vocab = -1);

// y[m, :] = x[m, :] * (1/sqrt(mean(x[m, :]^2) + eps)) * w[:], x [M, H], w [H], written as `out`.
// One block per row. out.data must not alias x unless out is F32 (then in place is fine).
void rms_norm(const float* x, const float* w, float eps, int M, int H, ActOut out, cudaStream_t stream);

// Fused residual + norm: x[m, :] += delta[m, :] (fp32, written back: x is the residual stream),
// then out = rms_norm(x) as above. delta may be the output of the previous linear; it must not
// alias x. out.data must not alias x or delta. round_delta: each delta is first rounded to bf16
// (RNE) — the same bits as the bf16-delta form below on a delta that was written as bf16.
void add_rms_norm(float* x, const float* delta, const float* w, float eps, int M, int H, ActOut out,
                  cudaStream_t stream, bool round_delta = false);
// The same with a bf16 delta ([M, H] bf16 bits, widened exactly): a residual linear (o_proj,
// down_proj) that wrote bf16 — half the bytes written and read between the two.
void add_rms_norm(float* x, const uint16_t* delta_bf16, const float* w, float eps, int M, int H, ActOut out,
                  cudaStream_t stream);

// Per-head RMSNorm in place (Qwen3 q_norm / k_norm): for token m and head h, the hd floats at
// x + m * row_stride + h * hd are normalized with weight w [hd]. row_stride >= n_heads * hd (in
// floats) lets it work on q/k inside a fused QKV output. 1 <= hd <= 1024 (one warp per head).
void head_rms_norm(float* x, int64_t row_stride, int M, int n_heads, int hd, const float* w, float eps,
                   cudaStream_t stream);

// The rotary cos/sin table on the device, the layout of kernels::RopeTable: cos and sin are each
// [max_pos, head_dim/2] float, row p = the angles p * inv_freq[i]. Upload once with
//   DeviceRopeTable t(rope.cos(0), rope.sin(0), rope.head_dim(), rope.max_positions());
// (RopeTable stores each table contiguously, so cos(0) is the start of the whole array).
struct RopeTableView {
  const float* cos = nullptr;  // device [max_pos, head_dim/2]
  const float* sin = nullptr;  // device [max_pos, head_dim/2]
  int head_dim = 0;
  int64_t max_pos = 0;
};

class DeviceRopeTable {
 public:
  // Synchronous copy of the host arrays (each max_pos * head_dim/2 floats). Throws perry::Error.
  DeviceRopeTable(const float* host_cos, const float* host_sin, int head_dim, int64_t max_pos);
  ~DeviceRopeTable();
  DeviceRopeTable(const DeviceRopeTable&) = delete;
  DeviceRopeTable& operator=(const DeviceRopeTable&) = delete;
  DeviceRopeTable(DeviceRopeTable&& o) noexcept;
  DeviceRopeTable& operator=(DeviceRopeTable&& o) noexcept;
  RopeTableView view() const { return {cos_, sin_, head_dim_, max_pos_}; }

 private:
  float* cos_ = nullptr;
  float* sin_ = nullptr;
  int head_dim_ = 0;
  int64_t max_pos_ = 0;
};

// RoPE in place on q and k in one launch, HF "rotate_half" layout exactly like
// kernels::rope_apply: per head, pairs (i, i + hd/2), i < hd/2:
//   x'[i] = x[i] c - x[i+hd/2] s,   x'[i+hd/2] = x[i+hd/2] c + x[i] s   (c, s at d_pos[m]).
// q: token m's n_q_heads heads at q + m * q_stride; k likewise (k may be null with
// n_kv_heads == 0). d_pos [M] int32. A position outside [0, max_pos) turns that token's q and k
// heads into NaN. Strides in floats, >= heads * head_dim.
void rope_apply(float* q, int64_t q_stride, int n_q_heads, float* k, int64_t k_stride, int n_kv_heads, int M,
                const int32_t* d_pos, RopeTableView table, cudaStream_t stream);

// SwiGLU of the fused gate/up projection: gu [M, 2I] with gate in columns [0, I) and up in
// [I, 2I); out[m, i] = silu(gate) * up, silu(g) = g / (1 + exp(-g)), written as `out` [M, I].
// out.data must not alias gu. round_to_bf16: each gate / up value is first rounded to bf16 (RNE)
// — the same bits as the bf16-input form below on a gate|up that was written as bf16.
void swiglu(const float* gu, int M, int I, ActOut out, cudaStream_t stream, bool round_to_bf16 = false);
// The same from a bf16 gate|up ([M, 2I] bf16 bits: a linear layer that wrote bf16 halves the
// bytes written and read between the two); each input is widened to fp32 exactly.
void swiglu(const uint16_t* gu_bf16, int M, int I, ActOut out, cudaStream_t stream);

// x[i] += d[i], n elements (may be 0); round_d: d[i] rounded to bf16 first (as add_rms_norm).
void residual_add(float* x, const float* d, int64_t n, cudaStream_t stream, bool round_d = false);
void residual_add(float* x, const uint16_t* d_bf16, int64_t n, cudaStream_t stream);

// y[i] = bf16 bits of x[i] (round-to-nearest-even, same bits as perry::f32_to_bf16), n >= 0.
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// Where a greedy decode step leaves its tokens as the next step's input (the step's own batch
// description, device): row r's token into tok[r], and pos[r] and seq[r].pos0 one further — rows
// are sequences, one token each. Null tok = no feed. With x too, row r of x ([rows, hidden] fp32)
// becomes the token's embedding row (table [vocab, hidden], F32, F16 or BF16 — what
// embedding_lookup would write), so the next step needs no embedding kernel.
struct AttnSeq;  // attention.h
struct GreedyFeed {
  int32_t* tok = nullptr;
  int32_t* pos = nullptr;
  AttnSeq* seq = nullptr;
  float* x = nullptr;
  const void* table = nullptr;
  DType table_dtype = DType::BF16;
  int64_t hidden = 0;
};

// Device scratch of argmax_rows for up to `rows` rows of `vocab` logits: a row's arrival count and
// its blocks' candidates. Zero it once when it is allocated; every call leaves it zeroed again.
// One scratch serves one vocabulary size (its layout follows it).
size_t argmax_scratch_bytes(int rows, int64_t vocab);

// out[r] = index of the max of logits[r, :] ([rows, vocab], 1 <= vocab < 2^31), ties -> the
// lowest index (like std::max_element). NaNs are never selected; a row of only NaN gives 0.
// With a feed, the token also becomes the next step's input (GreedyFeed), so that a run of greedy
// decode steps can be enqueued without the host in between.
// Many blocks a row, each one slice of 2048 logits; the last block of a row to finish (an
// arrival count in `scratch`, argmax_scratch_bytes) reduces the slices' candidates and writes the
// token. The order of arrival does not matter: (value, index) pairs are totally ordered. Launched
// with programmatic dependent launch (pdl.cuh), so the blocks are resident before lm_head ends.
void argmax_rows(const float* logits, int rows, int64_t vocab, int32_t* out, void* scratch, cudaStream_t stream,
                 const GreedyFeed& feed = {});

}  // namespace perry::cuda
