// The linear layer of a one-token decode step with its neighbouring elementwise work fused in, so
// that a decoder layer is 6 kernels (7 with q/k norm) instead of 12 (docs/cuda.md, "decode step"):
//
//   input:  RmsNorm  the token's fp32 residual row x [K] normalized with norm_w (RMSNorm, eps),
//           Plain    x [K] as it is (the attention output, the SwiGLU output);
//           either way converted in the kernel to the layer's input format — int8 with one
//           per-token scale (the exact rule of quantize_per_token) or bf16 (bf16 weights and the
//           weight-only kinds: w4a16's bf16 values carried exactly as fp16 at a power of two per
//           128-value run for the tensor cores, w8a16's as 24-bit fixed point per 64-value run in
//           three byte planes for dp4a) — into shared memory;
//   output: Store       y[n] = x·w[n] (+ bias[n])                              y fp32 [N]
//           Accumulate  y[n] += x·w[n] (+ bias[n])  (the residual add)          y fp32 [N]
//           SwiGLU      rows [0, N/2) are the gate, [N/2, N) the up projection:
//                       y[j] = silu(gate_j)·up_j                                y fp32 [N/2]
//           RopeKv      the q|k|v projection of a model without q/k norm (DecodeRopeKv): q
//                       RoPE'd into y [nh·hd], k RoPE'd and v stored as bf16 into the cache at
//                       the token's position — rope_append_qkv's work, same bits; the k and
//                       v rows of y are not written
//
// The results are those of the separate kernels: rms_norm / swiglu / quantize_per_token, then
// gemv_quant (W*A8 modes, same math and scale placement) or a bf16 GEMV with fp32 accumulation
// (bf16), then residual_add — up to the summation order inside a dot product and the RMSNorm sum
// of squares (accumulated in float64 here as there). w4a16's products run on the tensor cores
// (mma.sync m16n8k16, fp16 in, fp32 accumulation): the int4 values and the input's bf16 values are
// exact in fp16, so the products are gemv_quant's. w8a16's run on dp4a over the input's byte planes:
// each 64-value run's sum is exact in int32, its values below 2^-15 of the run's largest rounded to
// the run's 24-bit grid (one fp32 ulp of that largest value at most; gemv_decode_w8a16.cuh).
//
// Weights (canonical layouts, gemv_quant.h): BF16 bf16 [N, K]; int8 [N, K]; int4 packed
// [N, K/2]; scales fp32 [N, G]. Every weight byte is streamed once (16-byte loads, L1 bypassed
// except the grouped kinds' runs, whose 32-byte sectors two instructions read; or bulk copies into
// shared memory: DecodeLinearArgs::bulk_stages); each block loads its first
// weights before it waits for the previous kernel (programmatic dependent launch, pdl.cuh), so
// the weight fetch overlaps the kernel before it and the block's own input prologue.
// int4 weights with int8 activations: the activations are stored in shared memory permuted to the
// nibble order and the nibbles used as unsigned (v + 8) in dp4a — the high nibbles in place, as
// 16·(v + 8), summed apart and shifted back once — with the 8·Σx correction: four integer
// instructions per 8 weights instead of a sign-extending unpack. Grouped modes fold a lane's
// partial sum of a step (integer for W*A8) into fp32 once: the lane's chunks of a step lie in one
// group.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "quant/quant.h"

namespace perry::cuda {

struct DecodeWeights {
  quant::QuantMode mode = quant::QuantMode::BF16;  // BF16, or a quantized mode
  const void* w = nullptr;
  const float* scales = nullptr;  // quantized modes: fp32 [N, G]
  const float* bias = nullptr;    // fp32 [N] or null
  int N = 0, K = 0;
};

enum class DecodeIn : uint8_t { RmsNorm, Plain };
enum class DecodeLabInput : uint8_t { Build, Skip, ReadOnly };  // DecodeLinearArgs::lab_input
enum class DecodeLabWeights : uint8_t { Read, Skip, SkipLoop };  // DecodeLinearArgs::lab_weights
enum class DecodeOut : uint8_t { Store, Accumulate, SwiGLU, RopeKv };

// What DecodeOut::RopeKv needs besides y: the one sequence (device; seq[0] is the token's row:
// pos0 = its position, slot = its cache slot, nothing stored for a negative slot), the RoPE
// table, the head layout and this layer's bf16 caches [n_slots][nkv][capacity][hd]
// (attention.h). A position past the table gives NaN q / k (as rope_append_qkv); one past the
// capacity is not stored.
struct DecodeRopeKv {
  const AttnSeq* seq = nullptr;
  RopeTableView rope;
  int nh = 0, nkv = 0, hd = 0, capacity = 0;
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
};

struct DecodeLinearArgs {
  const float* x = nullptr;       // fp32 [K], must not alias y
  DecodeIn in = DecodeIn::Plain;
  const float* norm_w = nullptr;  // fp32 [K] (RmsNorm)
  float eps = 0.0f;
  float* y = nullptr;
  DecodeOut out = DecodeOut::Store;
  // How the weights are streamed: 0 = 16-byte loads into registers (a step or two in flight per
  // warp, the rest prefetched into L2); n >= 2 = bulk copies (cp.async.bulk, sm_90+) into a ring
  // of n 4 KiB shared-memory stages per warp — n steps in flight, fewer stages where shared
  // memory is short, registers below sm_90; -1 = the kernel's choice: bulk copies with 3 stages
  // for plain inputs (o, down) and 2 for RMSNorm inputs (q|k|v, gate|up, lm_head). History (H200
  // A/B runs): with blocks of 8 warps, 2 stages won for bf16, w8a16 and the grouped kinds and
  // lost for the per-channel ones (decode-run8/9, s12-run3); with one 16-warp block an SM
  // (fourteenth session), 3 stages for o and down won for every kind measured (s14-run3:
  // w4a8-g128 +4.3%, w8a8-g128 +3%, per-channel w8a8 +5.5% over its register loads), but 3 for
  // the RMSNorm-input linears too lost 6% (s14-run5: 424.7 / 429.0 vs 455.3 / 453.6 tok/s), and
  // each of q|k|v and gate|up loses alone (s15-run1: −3.9%, −2.4%). Not because the next
  // kernel's blocks lack room: giving them room to start early lost too (s15-run3). Same
  // arithmetic either way, so the same bits.
  // PERRY_GEMV_DECODE_STAGES=n (all linears) and PERRY_GEMV_DECODE_NORM_STAGES=n (RMSNorm-input
  // linears) force it in the CUDA backend for A/B runs.
  int bulk_stages = -1;
  // Per-channel w8a8 with register loads double-buffers them (step s + 1 loaded before step s is
  // reduced; bf16 with register loads does too, and keeps it — this switch is w8a8's only):
  // -1 / 1 = yes (the kernel's choice), 0 = no — one step in registers, the next
  // prefetched into L2 as the other kinds do: 63–78 registers a thread instead of 86–116, so 3–4
  // blocks of 8 warps fit an SM instead of 2 (blocks had 8 warps until the thirteenth session; now
  // 16). Measured on the H200 (eleventh session, run 5): decode b=1
  // 301 vs 320 tok/s — the warps' second step in flight counts for more than the extra warps
  // (gate|up 39.8 vs 35.4 µs, down 27.9 vs 25.5; o and q|k|v unchanged). Kept for A/B runs:
  // PERRY_GEMV_DECODE_PIPE=0 sets it in the CUDA backend. Same bits either way (tested).
  int register_pipe = -1;
  // Up to two byte ranges of the NEXT kernel's weights that this one's blocks bring into L2 before
  // their wait, split evenly over the blocks (16-byte aligned, multiples of 16 bytes; empty = none).
  // For a linear whose own weights all fit the rings its blocks fill before the wait and that runs
  // where HBM is otherwise idle — o_proj, whose blocks start during attention: the CUDA backend
  // hands it the first rows of gate|up's gate and up halves when PERRY_DECODE_L2_NEXT_MB=n is set.
  // Off by default: measured a loss on the H200 (s20-run1, 24 MB: w8a8 −0.5%, w4a8-g128 −1.1%);
  // kept as a lab switch. Changes no result.
  struct L2Range {
    const void* p = nullptr;
    size_t bytes = 0;
  };
  L2Range l2_next[2] = {};
  DecodeRopeKv rope_kv;  // DecodeOut::RopeKv only
  // Round the layer's outputs to bf16 (RNE) before the epilogue uses them — the CUDA backend's
  // bf16-intermediate rule, the same bits as the separate kernels' rounding forms:
  //   SwiGLU: gate and up (swiglu(..., round_to_bf16 = true) on the stored gate|up);
  //   Accumulate: the output before the add (add_rms_norm / residual_add with round_delta);
  //   RopeKv: q, k, v before RoPE (rope_append_qkv / split_qkv with round_to_bf16);
  //   Store: the stored values.
  bool round_bf16 = false;
  // Lab only, the outputs are wrong unless Build: what building the input row in every block costs.
  // Skip leaves the row at zero (no read of x, no RMSNorm, no quantization); ReadOnly reads x as
  // the prologue does (every load in flight, waited for) and then leaves the row at zero — the
  // difference between the two is the read's round trip, between ReadOnly and Build the arithmetic
  // and its barriers. The CUDA backend sets it from PERRY_LAB_DECODE_INPUT=skip|read.
  DecodeLabInput lab_input = DecodeLabInput::Build;
  // Lab only, wrong outputs unless Read: what the step costs besides its weight traffic. Skip:
  // the bulk-copy ring's stages complete without their copies (the loop computes on whatever the
  // stages hold), so every kernel, prologue, loop iteration, barrier and epilogue runs but no
  // weight row is read — the step's floor without weight traffic (per-channel row scales are
  // still loaded; the grouped kinds' group scales travel in the ring since s24, so they are not
  // read either, and their folds use stale stage bytes). SkipLoop: no copies and no loop
  // either (each block returns after building its input row): what the prologues, the kernel
  // boundaries and the other kernels cost. Bulk kernels only (the default on sm_90). The CUDA
  // backend sets it from PERRY_LAB_DECODE_WEIGHTS=skip|noloop.
  DecodeLabWeights lab_weights = DecodeLabWeights::Read;
};

// Whether gemv_decode takes this layer: K % 32 == 0, K <= 32768 (the input row lives in shared
// memory), a BF16 or quantized mode whose group size (if any) is a power of two and a multiple of
// 128 (int4) or 64 (int8). Other layers keep the separate kernels.
bool gemv_decode_supports(quant::QuantMode mode, int K);

// Launches the fused linear on `stream` (programmatic dependent launch where available).
// Throws perry::Error on unsupported shapes, null or misaligned pointers (w, x, norm_w 16-byte
// aligned), an odd N with SwiGLU, or a launch failure.
void gemv_decode(const DecodeWeights& w, const DecodeLinearArgs& a, cudaStream_t stream);

// The bulk-copy ring stages gemv_decode(w, a) launches with (0: register loads), after the same
// checks (and the same errors), without launching: so that tests can tell which shapes take the
// ring — the grouped kinds whose lanes fold runs need 16-byte aligned scales and N·G a multiple of
// 4 (their scale windows, gemv_decode.cu). On a GPU that runs the compute_80 PTX rather than the
// sm_90a code, a bulk kernel streams through registers whatever this says.
int gemv_decode_ring_stages(const DecodeWeights& w, const DecodeLinearArgs& a);

}  // namespace perry::cuda
