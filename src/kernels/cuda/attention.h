// CUDA attention over a bf16 KV cache: cache append, batched causal prefill (flash-attention on
// bf16 tensor cores for hd 64/128, fp32 CUDA cores otherwise) and batched decode (flash-decoding:
// split over the KV length, then a combine kernel).
//
// Layouts (fixed; the CUDA model backend depends on them):
//   q        fp32 [M, nh*hd] row-major, the M new tokens of all sequences stacked;
//   k, v     fp32 [M, nkv*hd] (already RoPE'd); out fp32 [M, nh*hd];
//   k_cache, v_cache  bf16 (stored as uint16_t) [n_slots][nkv][capacity][hd] for ONE layer;
//   GQA: q head h reads kv head h / (nh / nkv).
// Sequences are described by an AttnSeq array in DEVICE memory (see below). All functions are
// asynchronous on `stream`; bad arguments and launch failures throw perry::Error naming the
// kernel. Semantics match kernels/cpu/attention.h: query t of a sequence (position pos0 + t)
// attends to cache positions [0, pos0 + t], softmax(scale · q·k) · v.
//
// Caller obligations the kernels cannot check (the descriptors live on the device):
//   * 0 <= pos0, n_new >= 1 (n_new == 0 sequences are skipped), pos0 + n_new <= capacity
//     (kernels clamp reads/writes to capacity so a violation gives wrong numbers, never a stray
//     write outside the slot), the sequences' row ranges [q_row, q_row + n_new) disjoint and
//     inside [0, M), slots distinct within one call and < the number of allocated slots;
//   * max_new >= every n_new and max_ctx >= every pos0 + n_new (blocks are launched for these
//     maxima only; they are upper bounds, not exact values);
//   * pointers from cudaMalloc (the cache pointers must be 16-byte aligned: cp.async copies).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elementwise.h"

namespace perry::cuda {

struct AttnSeq {
  int32_t q_row;  // first row of this sequence in q / k / v / out
  int32_t n_new;  // new tokens this step (rows q_row .. q_row + n_new - 1)
  int32_t pos0;   // tokens already in the slot before this step; new token t has position pos0 + t
  int32_t slot;   // cache slot
};

// Largest head dimension any kernel here accepts.
constexpr int kAttnMaxHeadDim = 256;

// Writes row r's k / v (for every kv head) into the sequence's slot at position pos0 + (r - q_row),
// converted to bf16 with round-to-nearest-even (NaN kept as a quiet NaN: bit-identical to
// perry::f32_to_bf16). One launch, one block per row; each block finds its sequence by scanning
// d_seqs (no host-side row map needed). Rows that belong to no sequence are left alone.
void kv_cache_append(const float* k, const float* v, const AttnSeq* d_seqs, int n_seqs, int M,
                     int nkv, int hd, int capacity, uint16_t* k_cache, uint16_t* v_cache,
                     cudaStream_t stream);

// Where attention_prefill reads q and writes its result.
struct PrefillIo {
  const float* q = nullptr;      // fp32; row r, head h at q + r·q_stride + h·hd — or (one of the two):
  const uint16_t* q_bf16 = nullptr;  // bf16, same layout (the kernels compute with bf16 q either way:
                                     // fp32 q is rounded on load, RNE — the same bits)
  int64_t q_stride = 0;          // elements from one row of q to the next; 0: nh·hd (a q-only buffer;
                                 // the fused q|k|v projection output has (nh + 2·nkv)·hd)
  float* out = nullptr;          // fp32 [M, nh·hd] — or (exactly one of the two):
  uint16_t* out_bf16 = nullptr;  // bf16 [M, nh·hd], each the bits perry::f32_to_bf16 gives the fp32
                                 // result (the input of a bf16 linear, without a conversion pass)
};
// The tensor-core kernel for hd 64 / 128: blocks of 64 query rows (16 per warp) or 128 rows (32
// per warp: each K / V fragment read from shared memory feeds two MMAs). Auto takes 128-row
// blocks when there are at least two of them per SM — on an sm_90 device with hd 128 as Wgmma:
// Hopper warpgroup MMAs in the same 128-row blocks (attention_prefill_sm90.cu; Rows128 for hd 64).
enum class PrefillKernel { Auto, Rows64, Rows128, Wgmma };

// Causal attention of every new token of every sequence against its slot's cache positions
// [0, pos0 + t] (the new tokens must already be in the cache: call kv_cache_append or
// rope_append_qkv first).
// hd 64 / 128: tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate; q and P rounded to bf16),
// 64- or 128-query × 64-key tiles, K/V double-buffered in shared memory with cp.async, online
// softmax. Other hd (<= 256): fp32 CUDA-core kernel (exact fp32 math on the bf16 cache values).
// scale must be positive. Grid: (ceil(max_new / tile), nh, n_seqs); blocks past a sequence's
// n_new exit at once. For hd 64 / 128, q must be 16-byte aligned with q_stride % 4 == 0.
void attention_prefill(const PrefillIo& io, const AttnSeq* d_seqs, int n_seqs, int max_new, int max_ctx,
                       const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd, int capacity,
                       float scale, cudaStream_t stream, PrefillKernel kernel = PrefillKernel::Auto);
// q [M, nh·hd] → out fp32 [M, nh·hd].
inline void attention_prefill(const float* q, const AttnSeq* d_seqs, int n_seqs, int max_new, int max_ctx,
                              const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd,
                              int capacity, float scale, float* out, cudaStream_t stream,
                              PrefillKernel kernel = PrefillKernel::Auto) {
  PrefillIo io;
  io.q = q;
  io.out = out;
  attention_prefill(io, d_seqs, n_seqs, max_new, max_ctx, k_cache, v_cache, nh, nkv, hd, capacity, scale, stream,
                    kernel);
}
// Whether PrefillKernel::Wgmma can run: hd 128 on an sm_90 device (H100 / H200).
bool attention_prefill_wgmma_supported(int hd);
// The kernel a call would run (Auto for the fp32 kernel); for logs and tests.
PrefillKernel attention_prefill_choice(PrefillKernel want, int hd, int n_seqs, int max_new, int nh);

// Batched decode: every sequence has exactly one new token (n_new is ignored and taken as 1; the
// context is pos0 + 1 and must already include the new token). Flash-decoding: the context is
// split into chunks (size chosen from n_seqs and max_ctx, see attention_decode_chunk); one block
// per (chunk, kv head, sequence) handles all nh/nkv q heads of the GQA group, so each cache byte
// is read once; a second kernel merges the partial (max, sum, acc) states into out. fp32 math.
// workspace: device memory of at least attention_decode_workspace_bytes(n_seqs, nh, hd, max_ctx)
// bytes (allocate once for the largest batch / context; any call with smaller values fits).
// Launched with programmatic dependent launch: the kernel just before it on the stream may write q
// and each sequence's row at pos0 (the append of the new token), but no older cache row — those
// are copied before the wait, while that kernel still runs.
void attention_decode(const float* q, const AttnSeq* d_seqs, int n_seqs, int max_ctx,
                      const uint16_t* k_cache, const uint16_t* v_cache, int nh, int nkv, int hd,
                      int capacity, float scale, float* out, float* workspace,
                      size_t workspace_bytes, cudaStream_t stream);
size_t attention_decode_workspace_bytes(int n_seqs, int nh, int hd, int max_ctx);
// Keys per decode chunk for this batch (a multiple of 64); exposed for tests and logs.
int attention_decode_chunk(int n_seqs, int max_ctx);

// A step's q/k/v preparation in one kernel (prefill and decode; it fuses what split_qkv +
// head_rms_norm + rope_apply + kv_cache_append do separately, with the same results): for each
// row of qkv fp32 [M, row_stride] (the fused projection output: nh q heads, nkv k heads, nkv v
// heads, hd floats each), the optional per-head RMSNorm of q and k (q_norm / k_norm [hd], both or
// neither), RoPE at the row's position (pos0 + row - q_row of its sequence; HF rotate_half, table
// as rope_apply), q written back in place, k and v appended to the sequence's cache slot as bf16.
// A position outside the RoPE table gives NaN q / k; a position past the capacity is not stored.
// Launched with programmatic dependent launch where available (pdl.cuh).
// M <= 65535 (one grid row per token). attention_prefill then reads q in place (PrefillIo::q_stride =
// row_stride).
// round_to_bf16: every q|k|v value rounded to bf16 (RNE) before the norm and RoPE — the same
// results as the bf16 form below on a projection that wrote bf16 (whose q goes back as bf16:
// the bits attention's fp32 → bf16 conversion of the fp32 form's q gives; PrefillIo::q_bf16).
void rope_append_qkv(float* qkv, int64_t row_stride, const AttnSeq* d_seqs, int n_seqs, int M, int nh, int nkv,
                     int hd, const float* q_norm, const float* k_norm, float eps, RopeTableView rope, int capacity,
                     uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream, bool round_to_bf16 = false);
void rope_append_qkv(uint16_t* qkv_bf16, int64_t row_stride, const AttnSeq* d_seqs, int n_seqs, int M, int nh,
                     int nkv, int hd, const float* q_norm, const float* k_norm, float eps, RopeTableView rope,
                     int capacity, uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream);

// Whether the prefill kernels for head dimension hd compute with bf16 q (the tensor-core kernels:
// hd 64 and 128). Only then does a bf16 q (PrefillIo::q_bf16) give the same bits as the fp32 q it
// was rounded from; the fp32 kernel of other head sizes computes with q as given.
inline bool attention_prefill_rounds_q(int hd) { return hd == 64 || hd == 128; }

// Which prefill kernel a head dimension gets, for logs and `perry info`.
const char* attention_prefill_kernel_name(int hd);

}  // namespace perry::cuda
