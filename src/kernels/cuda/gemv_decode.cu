// Fused one-token linear layer (contract in gemv_decode.h).
//
// Block = 16 warps. The block builds the token's input row in shared memory once (prologue), then
// loops over groups of rows (a grid of about as many blocks as fit on the GPU at once — one an SM
// in practice — so the prologue is paid once an SM, not once per 32 rows). Each warp owns kR = 2
// rows of a group (SwiGLU: the gate row j and the up row j + N/2) and streams them in 16-byte chunks,
// kU = 4 chunks per row in flight per lane (128 bytes for the two rows): lane l takes chunks l,
// l + 32, ... so each load instruction of a warp reads 512 contiguous bytes of a row, 2 KiB a row
// per step (grouped quantized kinds: lane l takes the run 4l .. 4l + 3 instead, see chunk_of).
// (One row a warp with 8 chunks a lane, twice the warps for o_proj / down_proj, was measured on
// the H200 twice without a gain — decode-run8-summary.md, s11 run 4 — and removed: it kept the
// grouped kinds from folding once per step.) The chunks come either straight from global memory
// into registers or, bulk kernels, from the warp's ring of shared-memory stages that lane 0
// refills with cp.async.bulk (one stage = one step).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/gemv_decode.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/lab_timeline.cuh"
#include "kernels/cuda/mma_sync_common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/quant_rule.cuh"

namespace perry::cuda {
namespace {

using namespace elementwise_detail;
using mma_sync::cp_async16;
using mma_sync::cp_async_commit;
using mma_sync::cp_async_wait;
using mma_sync::ld_stream16;
using mma_sync::word;
using mma_sync::and_xor;
using mma_sync::xor_and;

// 16 warps a block, one block an SM where shared memory or registers allow no more: every block
// builds the whole input row (RMSNorm, quantization — 2–4.5 µs of a kernel, docs/cuda.md), so
// fewer, larger blocks do that work fewer times an SM for the same warps.
constexpr int kWarps = 16, kThreads = 32 * kWarps;
constexpr int kMaxK = 32768;
// w8a16's input row: byte planes of a 24-bit fixed-point number a k (gemv_decode_w8a16.cuh) —
// kLimbPlanes·K bytes of shared memory, kLimbPlanes dp4a a weight word.
constexpr int kLimbPlanes = 3;

enum WKind : int { kWBf16 = 0, kWI8 = 1, kWI4 = 2 };
enum InKind : int { kInNorm = 0, kInPlain = 1 };
enum OutKind : int { kOutStore = 0, kOutAcc = 1, kOutSwiglu = 2, kOutRopeKv = 3 };

struct Params {
  const uint8_t* w;
  const float* sw;
  const float* bias;
  int N, K, G, gs_shift;  // N: weight rows; G groups of 2^gs_shift k values a row (grouped modes)
  const float* x;
  const float* norm_w;
  float eps;
  float* y;
  DecodeRopeKv rk;  // kOutRopeKv only
  unsigned long long rk_half_magic;  // ceil(2^32 / (rk.hd / 2)): j / (hd / 2) = j · magic >> 32
  int stages;       // bulk-copy kernels: ring stages per warp
  DecodeLabWeights lab_weights;  // DecodeLinearArgs::lab_weights (lab only, wrong outputs unless Read)
  bool no_pipe;     // register loads without the double buffer (DecodeLinearArgs::register_pipe = 0)
  bool round_bf16;  // the layer's outputs rounded to bf16 first (SwiGLU: gate and up; Acc: before the add)
  const uint8_t* l2_p[2];  // DecodeLinearArgs::l2_next (bulk kernels)
  unsigned long long l2_bytes[2];
  DecodeLabInput lab_input;  // DecodeLinearArgs::lab_input (lab only, wrong outputs unless Build)
  TimelineLog* timeline;     // lab only: the installed decode timeline (lab_timeline.h), or nullptr (bulk kernels)
};

template <int kW>
__host__ __device__ constexpr int per_chunk() {  // k values in one 16-byte weight chunk
  return kW == kWBf16 ? 8 : (kW == kWI8 ? 16 : 32);
}

// d = c + Σ a.u8[i] · b.s8[i]
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// 8 packed bf16 (k order) as floats.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&f)[8]) {
  f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
  f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
}

// Shared memory of a block (bytes from the start): xs — the linear's input, int8 [K], bf16 / fp16
// [K] or (w8a16) three byte planes [3][K]; xsum — int4 with int8 input: int [K / 32], the weight-only
// kinds' run scales; xf — fp32 [K] staging of the input row, only where the row is too long to stay
// in registers (!x_in_registers: RMSNorm inputs with K > 8192, plain scaled inputs with K > 16384).
// At most 6·K bytes (fp16 RMSNorm inputs past K 8192: xs 2·K + xf 4·K) — 192 KiB at K = kMaxK —
// or, w8a16, 7·K + K / 16 (226 KiB at kMaxK), inside the 227 KiB a Hopper block may opt into. The
// bulk-copy ring takes up to the rest (its depth was worth 3–5% of a token at stages 2 → 3 for the
// plain-input linears, fourteenth session).
//
// Inputs held in registers between their passes (kRegOctets octets a thread, all loads in flight
// at once), so that no fp32 staging row takes the ring's shared memory: plain int8 inputs with
// K <= kMaxRegK (amax, then quantized) and RMSNorm inputs with K <= kMaxRegNormK (sum of
// squares, normalized with the norm weights — loaded into registers before the PDL wait —,
// amax, quantized or stored as bf16).
constexpr int kRegOctets = 4, kMaxRegK = kRegOctets * 8 * kThreads;
constexpr int kNormRegOctets = 2, kMaxRegNormK = kNormRegOctets * 8 * kThreads;
// Whether the input row is scaled (an amax taken first): int8 activations (per token), and the
// weight-only kinds' rows (a power of two per run: w4a16's fp16, fp16_pow2_params; w8a16's byte
// planes, limb_pow2_params). Only bf16 takes x as bf16.
__host__ __device__ constexpr bool x_scaled(int w_kind, bool xi8) { return xi8 || w_kind != kWBf16; }
__host__ __device__ inline bool x_in_registers(int K, int w_kind, bool xi8, int in_kind) {
  return in_kind == kInNorm ? K <= kMaxRegNormK : x_scaled(w_kind, xi8) && K <= kMaxRegK;
}
struct SmemLayout {
  int xsum, xf, total;
};
__host__ __device__ inline SmemLayout smem_layout(int K, int w_kind, bool xi8, int in_kind) {
  SmemLayout l;
  // xs: int8 [K], bf16 or fp16 [K], or (w8a16) three byte planes [3][K].
  l.xsum = xi8 ? K : (w_kind == kWI8 ? kLimbPlanes * K : 2 * K);
  // xsum: int4 with int8 x, Σ of each 32-value chunk (int [K / 32]); w4a16: each 128-value run's
  // fp16 scale there (float [K / 128], fp16_octet_in_run); w8a16: each 64-value run's scale (float
  // [ceil(K / 64)], limb_octet_in_run).
  l.xf = l.xsum + (w_kind == kWI4 ? K / 32 * 4 : (!xi8 && w_kind == kWI8 ? (K + 63) / 64 * 4 : 0));
  l.xf = (l.xf + 15) / 16 * 16;
  const bool stage = (x_scaled(w_kind, xi8) || in_kind == kInNorm) && !x_in_registers(K, w_kind, xi8, in_kind);
  l.total = l.xf + (stage ? 4 * K : 0);
  return l;
}

// Bulk-copy kernels: after the prologue's bytes, each warp's ring of `stages` stages of one step
// (kR rows × kU·512 bytes), then (kinds with runs, ring_scales) each stage's group scales, kR rows
// of kRingScaleRowBytes, then the warps' `stages` mbarriers.
constexpr int kStageBytes = 4096;  // kR·kU·512 (2 rows, 4 chunks a lane)
// A step's group scales of one row: 32·kU·per_chunk k values in groups of at least 64 (int8) or
// 128 (int4) values (gemv_decode_supports) — at most 32 floats. Bulk copies move whole, aligned
// 16-byte pieces, so a row's scales are copied as the aligned window around them: up to 3 floats
// before them (their `lead`, where G is not a multiple of 4 — say Qwen2.5-1.5B's down_proj, G 70
// at g128) and the rest of the last piece after them — at most 35 floats, 144 bytes.
constexpr int kRingScaleRowBytes = 144;
// Whether a kind's lanes fold a run of one group a step (the kernel's kRun: grouped, not w4a16,
// whose lanes take a scale per chunk). Ring scales: the bulk kernels of these kinds copy each
// step's group scales into its ring stage beside its weights and read them from shared memory, so
// they arrive p.stages steps ahead. With the scale loaded one step ahead into a register instead,
// the register copy waited for that load (L2 latency under full HBM load) in 34% of gate|up's warp
// samples (s23 run 1). Measured in the decode step (s24): +2.2–3.4%, where a run-time choice
// between the two ways gained nothing — so the bulk kernels have this one way only.
__host__ __device__ constexpr bool folds_runs(int w_kind, bool xi8, bool grouped) {
  return grouped && !(w_kind == kWI4 && !xi8);
}
struct RingLayout {
  int ring, scales, bars, total;
};
__host__ __device__ inline RingLayout ring_layout(int prologue_bytes, int stages, bool ring_scales) {
  RingLayout r;
  r.ring = (prologue_bytes + 127) / 128 * 128;
  r.scales = r.ring + kWarps * stages * kStageBytes;
  r.bars = r.scales + (ring_scales ? kWarps * stages * 2 * kRingScaleRowBytes : 0);
  r.total = r.bars + kWarps * stages * 8;
  return r;
}

#include "kernels/cuda/gemv_decode_input.cuh"  // (the prologue: build_input and its helpers)

// Physical weight row r (0..kR-1) of the warp's slot in group g; -1 when past the end.
// SwiGLU: slot j holds gate row j and up row j + N/2. RopeKv: slots [0, (nh + nkv)·hd/2) hold the
// RoPE pairs (i, i + hd/2) of the q and k heads, the rest two consecutive v rows each.
template <int kOut, int kR>
__device__ __forceinline__ int row_of(int g, int warp, int r, const Params& p) {
  const int N = p.N;
  if constexpr (kOut == kOutSwiglu) {
    const int half = N / 2, j = g * kWarps + warp;
    return j < half ? j + r * half : -1;
  } else if constexpr (kOut == kOutRopeKv) {
    const int hd = p.rk.hd, half = hd / 2, j = g * kWarps + warp, qk_pairs = (p.rk.nh + p.rk.nkv) * half;
    if (j < qk_pairs) {
      // j / half by a multiply-high (the row of every load and step; an integer division is ~20
      // instructions): exact for j·half < 2^32 with the magic ceil(2^32 / half).
      const int head = int((unsigned long long)j * p.rk_half_magic >> 32);
      return head * hd + (j - head * half) + r * half;
    }
    const int n = qk_pairs * 2 + 2 * (j - qk_pairs) + r;
    return n < N ? n : -1;
  } else {
    const int n = (g * kWarps + warp) * kR + r;
    return n < N ? n : -1;
  }
}
template <int kOut, int kR>
__host__ __device__ __forceinline__ int n_groups(int N) {
  return kOut == kOutSwiglu || kOut == kOutRopeKv ? (N / 2 + kWarps - 1) / kWarps
                                                   : (N + kWarps * kR - 1) / (kWarps * kR);
}

// The RopeKv epilogue of warp slot j (one lane, in finish_kept): the q pair rotated into y, the k
// pair rotated and the v pair stored into the layer's cache at the token's position — rope_append_qkv's
// operations on the same fp32 values, so the same bits.
__device__ void rope_kv_store(const Params& p, int j, const int (&rows)[2], const float (&val)[2]) {
  const DecodeRopeKv& rk = p.rk;
  const AttnSeq sq = rk.seq[0];
  const int pos = sq.pos0, hd = rk.hd, half = hd / 2, qk_pairs = (rk.nh + rk.nkv) * half;
  const bool store = sq.slot >= 0 && pos >= 0 && pos < rk.capacity;
  if (j < qk_pairs) {
    const int head = j / half, i = j - head * half;
    float ra, rb;
    if (pos >= 0 && pos < rk.rope.max_pos) {
      rope_rotate(val[0], val[1], rk.rope.cos[(long long)pos * half + i], rk.rope.sin[(long long)pos * half + i], ra,
                  rb);
    } else {
      ra = rb = __int_as_float(0x7fc00000);
    }
    if (head < rk.nh) {
      p.y[rows[0]] = ra, p.y[rows[1]] = rb;
    } else if (store) {
      const size_t off = (((size_t)sq.slot * rk.nkv + (head - rk.nh)) * rk.capacity + (size_t)pos) * hd;
      rk.k_cache[off + i] = bf16_bits(ra);
      rk.k_cache[off + i + half] = bf16_bits(rb);
    }
  } else if (store) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rows[r] < 0) continue;
      const int dv = rows[r] - 2 * qk_pairs, vh = dv / hd;
      rk.v_cache[(((size_t)sq.slot * rk.nkv + vh) * rk.capacity + (size_t)pos) * hd + (dv - vh * hd)] =
          bf16_bits(val[r]);
    }
  }
}

// kR rows per warp, kU 16-byte chunks per row per lane in flight (module comment). SwiGLU needs
// kR = 2 (the gate and the up row of one output). kBulk: the weights arrive by bulk copies into
// the warp's ring of p.stages shared-memory stages (lane 0 keeps the ring full, the warp reads a
// stage into registers and hands it back), so a warp has p.stages steps in flight instead of one
// or two — sm_90+ code only: where the driver runs code built for an older target (say the
// compute_80 PTX on a GPU newer than sm_90a's), a bulk kernel streams through registers instead
// (same results; its larger shared-memory request is merely unused).
#ifdef PERRY_BULK_COPY
constexpr bool kHaveBulkCopy = true;
#else
constexpr bool kHaveBulkCopy = false;
#endif
// kTimeline: the lab's instantiation (lab_timeline.h), launched only while a log is installed.
template <int kW, bool kXI8, bool kGrouped, int kIn, int kOut, int kR, int kU, bool kBulkAsked, bool kNoPipe = false,
          bool kTimeline = false>
__global__ void __launch_bounds__(kThreads, 1) gemv_decode_kernel(Params p) {
  static_assert((kOut != kOutSwiglu && kOut != kOutRopeKv) || kR == 2, "SwiGLU / RopeKv pair two rows in one warp");
  static_assert(kR * kU * 512 == kStageBytes, "one step is one ring stage");
  constexpr bool kBulk = kBulkAsked && kHaveBulkCopy;
  // 128-byte aligned: the dynamic block starts after the static reduction scratch, and the ring's
  // stages (ring_layout: 128-byte offsets from here) must land on whole 128-byte lines for the
  // bulk copies — with 16 the base followed the static size, and kernels whose scratch was 320 or
  // 448 bytes decoded up to 10% slower (s18 runs 1–3).
  extern __shared__ __align__(128) uint8_t xs[];
  constexpr int kPer = per_chunk<kW>();
  constexpr bool kIntAcc = kXI8 && !kGrouped;
  lab_timeline::BlockMarks<kTimeline> marks{p.timeline};  // lab only (lab_timeline.h)
  marks.start();
  const unsigned timeline_arg = unsigned(p.K) << 8 | unsigned(kIn) << 4 | unsigned(kOut);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row_bytes = kW == kWBf16 ? 2LL * p.K : (kW == kWI8 ? (long long)p.K : p.K / 2);
  const int nchunks = int(row_bytes / 16);
  const int groups = n_groups<kOut, kR>(p.N);

  // The block's work is a flat sequence of steps (group g, chunk window it) of kU·kR 16-byte
  // loads per lane. kPipe (bf16, per-channel int8: measured faster so on the H200) double-buffers
  // them in registers — step s + 1 is loaded before step s is computed and reduced; the others
  // (int4, grouped, weight-only: the extra registers cost more occupancy than they bought)
  // prefetch step s + 1 into L2 instead.
  constexpr bool kPipe = !kBulk && !kNoPipe && (kW == kWBf16 || (kW == kWI8 && kXI8 && !kGrouped));
  const int iters = (nchunks + 32 * kU - 1) / (32 * kU);
  constexpr long long kWin = 32LL * kU * 16;  // bytes of one row in one step
  // Which chunk of step ii slot u holds. Grouped quantized kinds (kRun): lane l takes the kU
  // consecutive chunks l·kU .. l·kU + kU − 1 of the step — a run of kU·kPer k values (128 for
  // int4, 64 for int8) that lies inside one group (gemv_decode_supports: the group size is a
  // multiple), so the group scale is loaded and folded once per step and row instead of once per
  // chunk (the fold was ~15% of the grouped kinds' instructions). The run is visited in a
  // lane-rotated order so that the bulk kernels' reads of the ring stay conflict-free (the 8 lanes
  // of a 128-byte phase read 8 different 16-byte columns). Other kinds: lane l takes chunks l,
  // l + 32, ...
  // w4a16 (kXF16, below) takes chunks like the per-channel kinds: a lane quad's 4 chunks are its run.
  constexpr bool kXF16 = !kXI8 && kW == kWI4;
  constexpr bool kRun = folds_runs(kW, kXI8, kGrouped);
  static_assert(!kRun || (kW != kWBf16 && kU == 4), "runs: quantized weights, 4 chunks a lane");
  // k values of one row in one step; a grouped step starts on a group boundary (groups are powers
  // of two no longer than a lane's run, gemv_decode_supports).
  constexpr int kStepK = 32 * kU * per_chunk<kW>();
  // Runs of a bulk kernel: the step's group scales arrive in its ring stage with its weights,
  // p.stages steps ahead, and are read from shared memory (folds_runs).
  constexpr bool kRingScales = kRun && kBulk;
  static_assert(!kRun || kRingScaleRowBytes >= 4 * (3 + kStepK / (kW == kWI4 ? 128 : 64)),
                "a step's scales and their lead fit their slot");
  static_assert(kRingScaleRowBytes % 16 == 0, "every slot starts on a 16-byte boundary");
  // w4a16: the products on the tensor cores (w4a16_chunk), the group scales folded once per chunk
  // — a chunk's 4-lane quad covers 128 k values, inside one group (gemv_decode_supports) — so each
  // lane loads a scale per chunk and row.
  auto chunk_of = [&](int ii, int u) {
    if constexpr (kRun) return ii * 32 * kU + lane * kU + ((u + lane * kU / 8) & (kU - 1));
    else return ii * 32 * kU + u * 32 + lane;
  };
  auto load_step = [&](int gg, int ii, uint4 (&wc)[kU][kR]) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int n = row_of<kOut, kR>(gg, warp, r, p);
      const uint8_t* wr = p.w + (long long)(n >= 0 ? n : 0) * row_bytes;  // row 0: valid memory, never stored
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = chunk_of(ii, u);
        // A run's loads use half of each 32-byte sector per instruction; the L1 keeps the sector
        // for the instruction that reads its other half (the streaming load would fetch it twice).
        wc[u][r] = c >= nchunks ? make_uint4(0, 0, 0, 0)
                   : kRun       ? __ldg(reinterpret_cast<const uint4*>(wr + 16LL * c))
                                : ld_stream16(wr + 16LL * c);
      }
    }
  };
  // kXF16: the group scale of row n for the lane's chunk u of step ii (clamped, like run_scale).
  auto chunk_scale = [&](int n, int ii, int u) {
    const int grp = min((chunk_of(ii, u) * kPer) >> p.gs_shift, p.G - 1);
    return __ldg(p.sw + (long long)max(n, 0) * p.G + grp);
  };
  // A run's group scale of row n (clamped: a lane past the row's end folds a zero sum).
  auto run_scale = [&](int n, int ii) {
    const int grp = min(((ii * 32 * kU + lane * kU) * kPer) >> p.gs_shift, p.G - 1);
    return __ldg(p.sw + (long long)max(n, 0) * p.G + grp);
  };
  auto prefetch_step = [&](int gg, int ii) {
    for (int off = lane * 128; off < kR * kWin; off += 32 * 128) {
      const int r = int(off / kWin);
      const long long o = ii * kWin + off % kWin;
      const int n = row_of<kOut, kR>(gg, warp, r, p);
      if (n >= 0 && o < row_bytes) prefetch_l2(p.w + n * row_bytes + o);
    }
  };
  // Grouped kinds: a row group's scales into L2 ahead of their first use — past the lines its first
  // step's run_scale loads anyway (the first (32·kU·kPer) >> gs_shift scales of a row: at K 4096
  // the whole row, where this prefetch was ~65 instructions of a ~600-instruction step for
  // nothing, s15 census). One trip a lane for every supported shape (G·4 <= 2048 bytes).
  auto prefetch_scales = [&](int gg) {
    if constexpr (kGrouped) {
      const int covered = (4 * ((32 * kU * kPer) >> p.gs_shift)) & ~127;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int n = row_of<kOut, kR>(gg, warp, r, p);
        if (n >= 0)
#pragma unroll 1
          for (int off = covered + lane * 128; off < p.G * 4; off += 32 * 128)
            prefetch_l2(reinterpret_cast<const uint8_t*>(p.sw + (long long)n * p.G) + off);
      }
    }
  };

  // Before the wait (weights do not depend on earlier kernels): the first step into registers,
  // the rest of the block's first rows into L2 — their fetch overlaps the previous kernel's tail
  // and this block's input prologue. Bulk: the first p.stages steps into the ring instead.
  const bool active = blockIdx.x < groups;
  int g = blockIdx.x, it = 0;
  uint4 cur[kU][kR];
#ifdef PERRY_BULK_COPY
  // Bulk-copy ring: step s (the flat (group, chunk window) sequence) goes to stage s % stages.
  const int nsteps = active ? ((groups - 1 - int(blockIdx.x)) / int(gridDim.x) + 1) * iters : 0;
  const RingLayout rl = ring_layout(smem_layout(p.K, kW, kXI8, kIn).total, p.stages, kRingScales);
  const uint32_t ring0 = bulk::smem_addr(xs + rl.ring) + uint32_t(warp * p.stages * kStageBytes);
  const uint32_t scales0 = bulk::smem_addr(xs + rl.scales) + uint32_t(warp * p.stages * kR * kRingScaleRowBytes);
  const uint32_t bar0 = bulk::smem_addr(xs + rl.bars) + uint32_t(warp * p.stages * 8);
  // Lane 0 only: step (group gg, chunk window ii) into stage st. The loop below tracks gg, ii and
  // st by increments — integer divisions by the runtime iters and stages were ~5 a step.
  auto issue_step_at = [&](int gg, int ii, int st) {
    const long long off = ii * kWin;
    const uint32_t bytes = uint32_t(min((long long)kWin, row_bytes - off));
    // kRingScales: the step's group scales of each row, groups [g0, min(G, g0 + (kStepK >> gs_shift))),
    // as the aligned window from their lead (kRingScaleRowBytes) to the next 16-byte boundary
    // (launch() checks that no window passes the end of the [N, G] array).
    const int g0 = (ii * kStepK) >> p.gs_shift;
    const int scount = kRingScales ? min(kStepK >> p.gs_shift, p.G - g0) : 0;
    int n[kR];
    long long s0[kR];  // the window's first float: the scales' own, rounded down to a multiple of 4
    uint32_t sbytes[kR], total = 0;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      n[r] = row_of<kOut, kR>(gg, warp, r, p);
      const long long e = (long long)max(n[r], 0) * p.G + g0;
      s0[r] = e & ~3LL;
      sbytes[r] = kRingScales ? (4u * uint32_t(e - s0[r] + scount) + 15u) & ~15u : 0u;
      total += n[r] >= 0 ? bytes + sbytes[r] : 0;
    }
    const uint32_t bar = bar0 + 8u * uint32_t(st);
    if (p.lab_weights != DecodeLabWeights::Read) return bulk::mbar_arrive_expect_tx(bar, 0);  // "arrives" empty
    bulk::mbar_arrive_expect_tx(bar, total);
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (n[r] >= 0) {
        bulk::copy_global_to_smem(ring0 + uint32_t(st * kStageBytes + r * kWin), p.w + n[r] * row_bytes + off, bytes,
                                  bar);
        if (kRingScales)
          bulk::copy_global_to_smem(scales0 + uint32_t((st * kR + r) * kRingScaleRowBytes), p.sw + s0[r], sbytes[r],
                                    bar);
      }
  };
  // The next step to issue: its group and chunk window (every lane keeps them; lane 0 issues).
  int iss_g = int(blockIdx.x), iss_ii = 0;
  auto next_issue = [&] {
    if (++iss_ii == iters) iss_ii = 0, iss_g += int(gridDim.x);
  };
  int st = 0;        // step % p.stages
  uint32_t ph = 0;   // (step / p.stages) & 1: the stage's mbarrier phase
  if constexpr (kBulk) {
    if (lane == 0) {
      for (int i = 0; i < p.stages; ++i) bulk::mbar_init(bar0 + 8u * uint32_t(i), 1);
      bulk::mbar_init_fence();
    }
    // The first p.stages steps into stages 0.. (after them the issue point is step p.stages).
    for (int s = 0; s < p.stages; ++s) {
      if (lane == 0 && s < nsteps) issue_step_at(iss_g, iss_ii, s);
      next_issue();
    }
    // Then this block's share of the next kernel's L2 ranges, one piece a warp (after the block's
    // own copies, which its loop needs first).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const unsigned long long total = p.l2_bytes[r];
      if (total == 0 || lane != 0) continue;
      const unsigned long long n = gridDim.x * kWarps, piece = ((total + n - 1) / n + 15) & ~15ULL;
      const unsigned long long off = (unsigned long long)(blockIdx.x * kWarps + warp) * piece;
      if (off < total) bulk::prefetch_l2(p.l2_p[r] + off, uint32_t(min(piece, total - off)));
    }
    __syncwarp();
  }
#endif
  if (!kBulk && active) {
    load_step(g, 0, cur);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int n = row_of<kOut, kR>(g, warp, r, p);
      if (n >= 0)
        for (long long off = kWin + 128LL * lane; off < row_bytes; off += 32 * 128) prefetch_l2(p.w + n * row_bytes + off);
    }
  }
  if (active && !kRingScales) prefetch_scales(g);
  // kRun with register loads: the group scales of a step are loaded one step ahead (their load was
  // the loop's top long-scoreboard stall at K 4096, where every step starts a new row) — the first
  // step's before the wait (scales are never written by the decode step's kernels). Bulk kernels
  // read them from the step's ring stage instead (kRingScales).
  float s_cur[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r)
    s_cur[r] = kRun && active && !kRingScales ? run_scale(row_of<kOut, kR>(g, warp, r, p), 0) : 0.0f;
  float cs_cur[kXF16 ? kU : 1][kR];  // kXF16: the chunks' scales, likewise a step ahead
#pragma unroll
  for (int u = 0; u < (kXF16 ? kU : 1); ++u)
#pragma unroll
    for (int r = 0; r < kR; ++r)
      cs_cur[u][r] = kXF16 && active ? chunk_scale(row_of<kOut, kR>(g, warp, r, p), 0, u) : 0.0f;
  // The RMSNorm weights (never written by the decode step's kernels) into registers before the
  // wait, so the prologue after it reads global memory once, for x.
  float nw_regs[kNormRegOctets][8];
  if (kIn == kInNorm && x_in_registers(p.K, kW, kXI8, kIn)) load_octets(p.norm_w, int(threadIdx.x), p.K / 8, nw_regs);
  pdl::wait();
  pdl::launch_dependents();
  marks.waited();

  const int* xsum = reinterpret_cast<const int*>(xs + smem_layout(p.K, kW, kXI8, kIn).xsum);
  const float* xscale = reinterpret_cast<const float*>(xsum);  // weight-only kinds: the input's run scales
  const float sa = build_input<kW, kXI8, kIn>(p, xs, nw_regs);
  marks.input();
  // (SkipLoop issued no copies, so no bulk copy is in flight into this block's shared memory.)
  if (!active || (kBulk && p.lab_weights == DecodeLabWeights::SkipLoop))
    return marks.finish(TimelineKernel::GemvDecode, timeline_arg);

  // Accumulators. facc: fp32 sums (bf16, grouped, weight-only). ia / ib: integer sums since the
  // last fold (int8 x: ia = Σ w·x; int4 x int8: ia over the low nibbles, ib over the high nibbles
  // kept in place, i.e. 16·(v + 8) — one LOP3 a word instead of a shift and a LOP3 — and two
  // independent dp4a chains), csum: Σ x over the same int4 chunks for the 8·Σx correction.
  // limb: w8a16's three byte-plane sums of the step's run (limbs_chunk). Per-channel int8 x folds
  // once, at the row's end; w4a16 folds each chunk's tensor-core sums straight into facc.
  float facc[kR];
  int ia[kR], ib[kR], csum = 0;
  int limb[kLimbPlanes][kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    facc[r] = 0.0f, ia[r] = 0, ib[r] = 0;
#pragma unroll
    for (int j = 0; j < kLimbPlanes; ++j) limb[j][r] = 0;
  }
  // The exact integer dot product since the last fold (ib is a multiple of 16: exact shift).
  auto int_sum = [&](int r) { return kW == kWI4 ? ia[r] + (ib[r] >> 4) - 8 * csum : ia[r]; };
  // Folds the sums since the last fold with scale s[r] (w8a16: times the run's input scale xsc)
  // into facc and restarts them (kRun).
  auto fold = [&](const float (&s)[kR], float xsc) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if constexpr (kXI8) {
        facc[r] = fmaf(float(int_sum(r)), s[r], facc[r]);
      } else {
        facc[r] = fmaf(limb_value(limb[0][r], limb[1][r], limb[2][r]), s[r] * xsc, facc[r]);
#pragma unroll
        for (int j = 0; j < kLimbPlanes; ++j) limb[j][r] = 0;
      }
      ia[r] = 0, ib[r] = 0;
    }
    csum = 0;
  };
  // A finished row group's reduced sums (int bits for kIntAcc) wait in registers — the warp's j-th
  // group in lane j % 32 — and up to 32 groups are finished at once, one a lane: after the xor
  // butterfly every lane holds the same bits (each level adds the same two values, in either
  // order), so this is lane 0's old per-step epilogue (bias and scale loads, bf16 rounding, SwiGLU
  // or RoPE, stores: ~50 of a gate|up step's ~600 instructions, s15 census) done in parallel on the
  // same values.
  int kept_g = 0, nkept = 0;
  float kept[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) kept[r] = 0.0f;
  auto finish_kept = [&] {
    int rows[kR];
    float val[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      rows[r] = row_of<kOut, kR>(kept_g, warp, r, p);
      const int n = max(rows[r], 0);
      const float b = p.bias ? __ldg(p.bias + n) : 0.0f;
      if constexpr (kIntAcc) val[r] = fmaf(float(__float_as_int(kept[r])) * __ldg(p.sw + n), sa, b);
      else val[r] = kXI8 ? fmaf(kept[r], sa, b) : kept[r] + b;
    }
    if constexpr (kOut == kOutSwiglu) {
      p.y[rows[0]] = p.round_bf16 ? swiglu_one(bf16_round(val[0]), bf16_round(val[1])) : swiglu_one(val[0], val[1]);
    } else if constexpr (kOut == kOutRopeKv) {
      const float rv[2] = {p.round_bf16 ? bf16_round(val[0]) : val[0], p.round_bf16 ? bf16_round(val[1]) : val[1]};
      rope_kv_store(p, kept_g * kWarps + warp, rows, rv);
    } else {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (rows[r] < 0) continue;
        const float v = p.round_bf16 ? bf16_round(val[r]) : val[r];
        if constexpr (kOut == kOutAcc) p.y[rows[r]] = __fadd_rn(p.y[rows[r]], v);
        else p.y[rows[r]] = v;
      }
    }
  };
  for (int step = 0;; ++step) {
    int ng = g, nit = it + 1;
    if (nit == iters) nit = 0, ng = g + gridDim.x;
    const bool has_next = ng < groups;
    if (has_next && nit == 0 && !kRingScales) prefetch_scales(ng);  // one step ahead of the next row group
    float s_nxt[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r)
      s_nxt[r] = kRun && has_next && !kRingScales ? run_scale(row_of<kOut, kR>(ng, warp, r, p), nit) : 0.0f;
    float cs_nxt[kXF16 ? kU : 1][kR];
#pragma unroll
    for (int u = 0; u < (kXF16 ? kU : 1); ++u)
#pragma unroll
      for (int r = 0; r < kR; ++r)
        cs_nxt[u][r] = kXF16 && has_next ? chunk_scale(row_of<kOut, kR>(ng, warp, r, p), nit, u) : 0.0f;
    uint4 nxt[kU][kR];
    if constexpr (kBulk) {
#ifdef PERRY_BULK_COPY
      // This step's stage into registers, then the stage goes back to lane 0 for step + stages.
      bulk::mbar_wait(bar0 + 8u * uint32_t(st), ph);
      // Unguarded: a chunk past the row's end reads stale (in-bounds) stage bytes that the loop
      // below skips, and a chunk's place in its stage, chunk_of(0, u), is the same every step —
      // the guards and zero fills were ~40 instructions a step (s15 census).
      const uint8_t* stage = xs + rl.ring + (warp * p.stages + st) * kStageBytes;
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int r = 0; r < kR; ++r)
          cur[u][r] = *reinterpret_cast<const uint4*>(stage + r * kWin + chunk_of(0, u) * 16);
      if (kRingScales) {
        // The lane's run's group within the step (clamped like run_scale: a lane past the row's
        // end folds zero sums with the row's last scale, which its stage holds), past the row's
        // lead in its window (issue_step_at; 0 wherever G is a multiple of 4).
        constexpr int kRowFloats = kRingScaleRowBytes / 4;
        const int g0 = (it * kStepK) >> p.gs_shift;
        const int lg = min(((it * 32 + lane) * kU * kPer) >> p.gs_shift, p.G - 1) - g0;
        const float* ss = reinterpret_cast<const float*>(xs + rl.scales) + (warp * p.stages + st) * kR * kRowFloats;
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const int lead = int(((long long)max(row_of<kOut, kR>(g, warp, r, p), 0) * p.G + g0) & 3);
          s_cur[r] = ss[r * kRowFloats + lead + lg];
        }
      }
      __syncwarp();
      if (lane == 0 && step + p.stages < nsteps) {
        bulk::fence_proxy_async_smem();  // the warp's reads of the stage before the copy that overwrites it
        issue_step_at(iss_g, iss_ii, st);
      }
      next_issue();
      if (++st == p.stages) st = 0, ph ^= 1u;
#endif
    } else if constexpr (kPipe) {
      if (has_next) load_step(ng, nit, nxt);
    } else {
      if (has_next) prefetch_step(ng, nit);
    }
    int rows[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) rows[r] = row_of<kOut, kR>(g, warp, r, p);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = chunk_of(it, u);
      if constexpr (kXF16) {
        static_assert(kR == 2, "the tensor-core chunk takes two rows");
        // mma.sync is warp-wide: a chunk is skipped only when the whole warp is past the row's
        // end; in a window that ends inside the warp, the lanes past it multiply zeros.
        const int c0 = it * 32 * kU + u * 32;
        if (c0 >= nchunks) continue;
        const float2 d = c0 + 32 <= nchunks ? w4a16_chunk<false>(cur[u], xs, c, true)
                                            : w4a16_chunk<true>(cur[u], xs, min(c, nchunks - 1), c < nchunks);
        // The quad's run scale (fp16_octet_in_run) with the group scale; a lane past the row's end
        // reads its clamped chunk's (the same run where its quad is partly live; D is 0 otherwise).
        const float xsc = xscale[min(c, nchunks - 1) >> 2];
        facc[0] = fmaf(d.x, cs_cur[u][0] * xsc, facc[0]);
        facc[1] = fmaf(d.y, cs_cur[u][1] * xsc, facc[1]);
        continue;
      }
      if (c >= nchunks) continue;
      uint4 wc[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) wc[r] = cur[u][r];
      const int k0 = c * kPer;
      if constexpr (kW == kWBf16) {
        float xf[8];
        bf16x8_to_f32(*reinterpret_cast<const uint4*>(xs + 2 * k0), xf);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          float a = facc[r];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t ww = word(wc[r], i);
            a = fmaf(xf[2 * i], bf16_lo(ww), a);
            a = fmaf(xf[2 * i + 1], bf16_hi(ww), a);
          }
          facc[r] = a;
        }
      } else if constexpr (kXI8 && kW == kWI8) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + k0);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          int pr = 0;  // a short chain per chunk; the chunks' chains are independent
#pragma unroll
          for (int i = 0; i < 4; ++i) pr = __dp4a(int(word(wc[r], i)), int(word(xv, i)), pr);
          ia[r] += pr;
        }
      } else if constexpr (kXI8 && kW == kWI4) {
        const uint4 x0 = *reinterpret_cast<const uint4*>(xs + k0);
        const uint4 x1 = *reinterpret_cast<const uint4*>(xs + k0 + 16);
        const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        csum += xsum[c];  // Σ (n ^ 8)·x = Σ (v + 8)·x: 8·Σx comes off in int_sum
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          int plo = 0, phi = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t ww = word(wc[r], i);
            // One LOP3 each (xor_and; in C the AND and the XOR were two: 6 instructions a word
            // instead of 4, s33 profile).
            const uint32_t lo = xor_and(ww, 0x08080808u, 0x0F0F0F0Fu);  // v + 8 of k 8i + 0, 2, 4, 6
            const uint32_t hi = xor_and(ww, 0x80808080u, 0xF0F0F0F0u);  // 16·(v + 8) of k 8i + 1, 3, 5, 7
            plo = dp4a_us(lo, xw[2 * i], plo);
            phi = dp4a_us(hi, xw[2 * i + 1], phi);
          }
          ia[r] += plo, ib[r] += phi;
        }
      } else if constexpr (kW == kWI8) {  // w8a16: the input's byte planes by dp4a (w4a16 went above)
        limbs_chunk<kR>(wc, xs, p.K, c, limb);
      }
    }
    if constexpr (kRun) {
      // w8a16: the lane's run of this step is input run 32·it + lane (kU chunks of 16 k values);
      // a lane past the row's end folds zero sums with the last run's scale.
      fold(s_cur, kXI8 ? 1.0f : xscale[min(it * 32 + lane, (p.K - 1) / 64)]);
    }
    if (it == iters - 1 && rows[0] >= 0) {
      // Warp reduction; the sums wait in lane nkept for finish_kept.
      float raw[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if constexpr (kIntAcc) {
          int v = int_sum(r);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
          raw[r] = __int_as_float(v);
        } else {
          // (kXF16: only the lanes 4g + g / 2 hold their quad's sums, w4a16_chunk.)
          float v = !kXF16 || (lane & 3) == (lane >> 3) ? facc[r] : 0.0f;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
          raw[r] = v;
        }
      }
      if (lane == nkept) {
        kept_g = g;
#pragma unroll
        for (int r = 0; r < kR; ++r) kept[r] = raw[r];
      }
      if (++nkept == 32) finish_kept(), nkept = 0;
    }
    if (it == iters - 1) {
#pragma unroll
      for (int r = 0; r < kR; ++r) facc[r] = 0.0f, ia[r] = 0, ib[r] = 0;
      csum = 0;
    }
    if (!has_next) break;
    g = ng, it = nit;
#pragma unroll
    for (int r = 0; r < kR; ++r) s_cur[r] = s_nxt[r];
#pragma unroll
    for (int u = 0; u < (kXF16 ? kU : 1); ++u)
#pragma unroll
      for (int r = 0; r < kR; ++r) cs_cur[u][r] = cs_nxt[u][r];
    if constexpr (kPipe) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int r = 0; r < kR; ++r) cur[u][r] = nxt[u][r];
    } else if constexpr (!kBulk) {
      load_step(g, it, cur);
    }
  }
  if (lane < nkept) finish_kept();
  marks.finish(TimelineKernel::GemvDecode, timeline_arg);
}

template <int kW, bool kXI8, bool kGrouped, int kIn, int kOut, int kR, int kU, bool kBulk, bool kNoPipe = false,
          bool kTimeline = false>
void launch_kernel(const Params& p, size_t smem, const char* name, cudaStream_t stream) {
  auto* kernel = gemv_decode_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, kBulk, kNoPipe, kTimeline>;
  // Shared memory above the 48 KiB default needs an opt-in (once per kernel, raised as needed;
  // under a lock so that two host threads cannot leave it at the smaller of two requests).
  static std::mutex mu;
  static int opted = 48 * 1024;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (int(smem) > opted) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                 "cudaFuncSetAttribute (gemv_decode shared memory)");
      opted = int(smem);
    }
  }
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor (gemv_decode)");
  const int groups = n_groups<kOut, kR>(p.N);
  const int grid = std::max(1, std::min(groups, std::max(per_sm, 1) * sm_count()));
  pdl::launch(name, kernel, dim3(unsigned(grid)), dim3(kThreads), smem, stream, p);
}

// p.stages on entry: the bulk-copy stages asked for (0 = registers). Bulk copies on sm_90+ with as
// many of them as fit in shared memory (at least 2); registers otherwise. Returns the stages taken
// (0: registers); `dry` decides without launching (gemv_decode_ring_stages).
template <int kW, bool kXI8, bool kGrouped, int kIn, int kOut, int kR = 2, int kU = 4>
int launch(Params p, const char* name, cudaStream_t stream, bool dry) {
  const int prologue = smem_layout(p.K, kW, kXI8, kIn).total;
  static const bool has_bulk_copy = compute_capability_major() >= 9;
  // Kinds with runs copy their group scales into the ring (folds_runs) as aligned 16-byte windows
  // (issue_step_at): from a 16-byte aligned array whose N·G floats are a whole number of pieces,
  // so that no window reads past its end — every shape of the checkpoints perry runs, G odd or
  // even (Qwen2.5-1.5B's down_proj: N 1536, G 70). Other shapes stream through registers.
  constexpr bool kRuns = folds_runs(kW, kXI8, kGrouped);
  const bool scale_windows_inside = (long long)p.N * p.G % 4 == 0 && quant_args::aligned(p.sw, 16);
  if (p.stages > 0 && has_bulk_copy && (!kRuns || scale_windows_inside)) {
    // The opt-in limit covers dynamic + static shared memory (the block reductions' scratch).
    static const int limit = [] {
      cudaFuncAttributes fa{};
      check_cuda(cudaFuncGetAttributes(&fa, gemv_decode_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, true>),
                 "cudaFuncGetAttributes (gemv_decode)");
      return max_smem_per_block_optin() - int(fa.sharedSizeBytes);
    }();
    int st = p.stages;
    while (st > 2 && ring_layout(prologue, st, kRuns).total > limit) --st;
    if (st >= 2 && ring_layout(prologue, st, kRuns).total <= limit) {
      p.stages = st;
      if (dry) return st;
      const size_t smem = size_t(ring_layout(prologue, st, kRuns).total);
      // (The timeline lab records the bulk kernels only: the sm_90 decode path.)
      if (p.timeline) launch_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, true, false, true>(p, smem, name, stream);
      else launch_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, true>(p, smem, name, stream);
      return st;
    }
  }
  p.stages = 0;
  if (dry) return 0;
  if constexpr (kW == kWI8 && kXI8 && !kGrouped) {  // (the only kind that double-buffers registers)
    if (p.no_pipe) {
      launch_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, false, true>(p, size_t(prologue), name, stream);
      return 0;
    }
  }
  launch_kernel<kW, kXI8, kGrouped, kIn, kOut, kR, kU, false>(p, size_t(prologue), name, stream);
  return 0;
}

template <int kW, bool kXI8, bool kGrouped>
int dispatch_io(const Params& p, DecodeIn in, DecodeOut out, const char* name, cudaStream_t s, bool dry) {
  if (in == DecodeIn::RmsNorm && out == DecodeOut::Store)
    return launch<kW, kXI8, kGrouped, kInNorm, kOutStore>(p, name, s, dry);
  if (in == DecodeIn::RmsNorm && out == DecodeOut::SwiGLU)
    return launch<kW, kXI8, kGrouped, kInNorm, kOutSwiglu>(p, name, s, dry);
  if (in == DecodeIn::RmsNorm && out == DecodeOut::RopeKv)
    return launch<kW, kXI8, kGrouped, kInNorm, kOutRopeKv>(p, name, s, dry);
  if (in == DecodeIn::Plain && out == DecodeOut::Accumulate)
    return launch<kW, kXI8, kGrouped, kInPlain, kOutAcc>(p, name, s, dry);
  throw Error(std::string(name) +
              ": input/output combination not built (RmsNorm+Store, RmsNorm+SwiGLU, RmsNorm+RopeKv, Plain+Accumulate)");
}

}  // namespace

void gemv_decode_set_lab_timeline(TimelineLog* log) { lab_timeline::install_timeline(log); }

bool gemv_decode_supports(QuantMode mode, int K) {
  if (K < 32 || K > kMaxK || K % 32 != 0) return false;
  if (mode == QuantMode::BF16) return true;
  if (!quant::is_quantized(mode)) return false;
  const QuantModeBits mb = quant_mode_bits(mode);
  // Grouped: a lane's run of 4 chunks (128 int4 / 64 int8 values) must sit inside one group,
  // and groups are a power of two long (a shift finds a run's group).
  const int gs = mb.group_size;
  return gs == 0 || (gs % (mb.bits == 4 ? 128 : 64) == 0 && (gs & (gs - 1)) == 0);
}

namespace {
// gemv_decode's checks and dispatch; `dry` returns the launch's ring stages without launching.
int run_gemv_decode(const DecodeWeights& w, const DecodeLinearArgs& a, cudaStream_t stream, bool dry) {
  const std::string where = "gemv_decode(N=" + std::to_string(w.N) + ", K=" + std::to_string(w.K) + ")";
  if (!gemv_decode_supports(w.mode, w.K)) throw Error(where + ": unsupported mode or K (need K % 32 == 0, K <= 32768)");
  if (w.N < 1 || (a.out == DecodeOut::SwiGLU && w.N % 2 != 0)) throw Error(where + ": bad N (SwiGLU needs an even N)");
  if (!w.w || !a.x || !a.y || (a.in == DecodeIn::RmsNorm && !a.norm_w)) throw Error(where + ": null pointer");
  if (a.out == DecodeOut::RopeKv) {
    const DecodeRopeKv& rk = a.rope_kv;
    if (!rk.seq || !rk.rope.cos || !rk.rope.sin || !rk.k_cache || !rk.v_cache)
      throw Error(where + ": RopeKv needs the sequence, the RoPE table and the layer's k / v cache");
    if (rk.nh < 1 || rk.nkv < 1 || rk.hd < 2 || rk.hd % 2 != 0 || rk.capacity < 1 || rk.rope.head_dim != rk.hd ||
        int64_t(w.N) != int64_t(rk.nh + 2 * rk.nkv) * rk.hd)
      throw Error(where + ": RopeKv needs N = (nh + 2·nkv)·hd, an even hd equal to the RoPE table's, capacity >= 1");
    // The kernel finds a q/k row's head by a multiply-high, exact while (nh + nkv)·(hd/2)^2 < 2^32.
    if (int64_t(rk.nh + rk.nkv) * (rk.hd / 2) * (rk.hd / 2) >= (int64_t(1) << 32))
      throw Error(where + ": RopeKv: too many heads of this size for one q|k|v row");
  }
  if (a.register_pipe < -1 || a.register_pipe > 1)
    throw Error(where + ": register_pipe must be -1, 0 or 1, got " + std::to_string(a.register_pipe));
  if (a.bulk_stages < -1 || a.bulk_stages == 1 || a.bulk_stages > 16)
    throw Error(where + ": bulk_stages must be -1 (the kernel's choice), 0 (registers) or 2..16, got " +
                std::to_string(a.bulk_stages));
  if (!quant_args::aligned(w.w, 16) || !quant_args::aligned(a.x, 16) || (a.norm_w && !quant_args::aligned(a.norm_w, 16)))
    throw Error(where + ": weights, x and norm weights must be 16-byte aligned");
  Params p{};
  p.w = static_cast<const uint8_t*>(w.w);
  p.sw = w.scales;
  p.bias = w.bias;
  p.N = w.N;
  p.K = w.K;
  p.x = a.x;
  p.norm_w = a.norm_w;
  p.eps = a.eps;
  p.y = a.y;
  p.rk = a.rope_kv;
  if (a.out == DecodeOut::RopeKv) {
    const unsigned long long half = unsigned(a.rope_kv.hd / 2);
    p.rk_half_magic = ((1ULL << 32) + half - 1) / half;
  }
  p.round_bf16 = a.round_bf16;
  p.lab_input = a.lab_input;
  // The kernel's choice (gemv_decode.h): bulk copies, 3 stages for plain inputs and 2 for
  // RMSNorm inputs (launch() takes fewer where shared memory is short) — measured faster so.
  p.stages = a.bulk_stages >= 0 ? a.bulk_stages : (a.in == DecodeIn::RmsNorm ? 2 : 3);
  p.no_pipe = a.register_pipe == 0;
  for (int r = 0; r < 2; ++r) {
    const DecodeLinearArgs::L2Range& l2 = a.l2_next[r];
    if (l2.bytes > 0 && (!l2.p || !quant_args::aligned(l2.p, 16) || l2.bytes % 16 != 0 || l2.bytes >= (1ULL << 40)))
      throw Error(where + ": an l2_next range must be non-null, 16-byte aligned and a multiple of 16 bytes");
    p.l2_p[r] = static_cast<const uint8_t*>(l2.p);
    p.l2_bytes[r] = l2.bytes;
  }
  p.lab_weights = a.lab_weights;
  p.timeline = lab_timeline::installed_log();
  if (w.mode == QuantMode::BF16) return dispatch_io<kWBf16, false, false>(p, a.in, a.out, "gemv_decode<bf16>", stream, dry);
  const QuantModeBits mb = quant_mode_bits(w.mode);
  if (!w.scales) throw Error(where + ": null scales");
  p.gs_shift = mb.group_size > 0 ? __builtin_ctz(unsigned(mb.group_size)) : 0;
  p.G = mb.group_size > 0 ? (w.K + mb.group_size - 1) / mb.group_size : 1;
  switch (w.mode) {
    case QuantMode::W8A8: return dispatch_io<kWI8, true, false>(p, a.in, a.out, "gemv_decode<w8a8>", stream, dry);
    case QuantMode::W8A8_G128:
    case QuantMode::W8A8_G64: return dispatch_io<kWI8, true, true>(p, a.in, a.out, "gemv_decode<w8a8-g>", stream, dry);
    case QuantMode::W4A8: return dispatch_io<kWI4, true, false>(p, a.in, a.out, "gemv_decode<w4a8>", stream, dry);
    case QuantMode::W4A8_G128: return dispatch_io<kWI4, true, true>(p, a.in, a.out, "gemv_decode<w4a8-g128>", stream, dry);
    case QuantMode::W8A16: return dispatch_io<kWI8, false, true>(p, a.in, a.out, "gemv_decode<w8a16>", stream, dry);
    case QuantMode::W4A16: return dispatch_io<kWI4, false, true>(p, a.in, a.out, "gemv_decode<w4a16>", stream, dry);
    default: throw Error(where + ": not a quantized or bf16 mode");
  }
}
}  // namespace

void gemv_decode(const DecodeWeights& w, const DecodeLinearArgs& a, cudaStream_t stream) {
  run_gemv_decode(w, a, stream, false);
}

int gemv_decode_ring_stages(const DecodeWeights& w, const DecodeLinearArgs& a) {
  return run_gemv_decode(w, a, nullptr, true);
}

}  // namespace perry::cuda
