// Causal grouped-query attention over a float KV cache (prefill and decode, one sequence).
#pragma once
#include <cstdint>

namespace perry::kernels {

// One sequence. q: [T, n_heads, hd] fp32 contiguous, the T queries are at positions pos0..pos0+T-1.
// k_cache, v_cache: [n_kv_heads, capacity, hd] fp32, holding positions 0..pos0+T-1 already.
// out: [T, n_heads, hd]. scale = 1/sqrt(hd). Heads h use kv head h / (n_heads / n_kv_heads).
// Query t attends to keys 0..pos0+t. Multi-threaded over (query, kv head, key chunk) items with an
// online (flash-style) softmax over key tiles, so nothing T x T is materialised; when there are
// few items (decode), the key range is split across threads and the partial softmax states merged.
// Throws perry::Error on inconsistent shapes (n_heads % n_kv_heads != 0, pos0 + T > capacity, ...).
void attention_f32(const float* q, int64_t T, int64_t pos0, int n_heads, int n_kv_heads, int hd,
                   const float* k_cache, const float* v_cache, int64_t capacity, float scale, float* out);

namespace ref {
// The oracle: one query row at a time, full score row, two-pass softmax; single-threaded.
void attention_f32(const float* q, int64_t T, int64_t pos0, int n_heads, int n_kv_heads, int hd,
                   const float* k_cache, const float* v_cache, int64_t capacity, float scale, float* out);
}  // namespace ref

// Kernel-internal building block, one per ISA: attends the G query vectors qg [G, hd] (the heads of
// one GQA group) to keys [j0, j1) of one kv head (k, v point at that head's [capacity, hd] block),
// updating the online-softmax state: running max m[G], running sum l[G], unnormalised acc[G, hd].
// Start from m = -inf, l = 0, acc = 0; the output is acc / l.
using AttendChunkFn = void (*)(const float* qg, int G, int hd, const float* k, const float* v, int64_t j0,
                               int64_t j1, float scale, float* m, float* l, float* acc);
namespace ref {
void attend_chunk(const float* qg, int G, int hd, const float* k, const float* v, int64_t j0, int64_t j1,
                  float scale, float* m, float* l, float* acc);
}
namespace avx512 {
void attend_chunk(const float* qg, int G, int hd, const float* k, const float* v, int64_t j0, int64_t j1,
                  float scale, float* m, float* l, float* acc);
}

}  // namespace perry::kernels
