// Elementwise / normalization kernels (contracts in elementwise.h).
//
// Layout choices: the row kernels (RMSNorm, SwiGLU) run one block per row with a block-wide
// reduction, 4-wide vector loads when the width is a multiple of 4 and every pointer is aligned
// (scalar path otherwise, same arithmetic per element). A row is read again for the second pass
// (and a third for the int8 variants) instead of being cached in shared memory: a row is at most
// ~112 KiB (I = 28672 fp32) and sits in L1/L2 between the passes, and this keeps the kernels free
// of width limits and dynamic shared memory opt-ins. Recomputing y in each pass is exact: the same
// fp32 operations on the same inputs give the same bits, so the int8 amax and the quantized values
// come from identical fp32 values.
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/elementwise_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant_rule.cuh"

namespace perry::cuda {
namespace {

using namespace elementwise_detail;

// ---------------------------------------------------------------- device helpers

// Writes V consecutive outputs at element index idx in the format of `o`; inv is the row's
// int8 multiplier (used by I8 only). The vector stores need 16/8/4-byte alignment, checked on
// the host before V = 4 is chosen.
template <int V>
__device__ __forceinline__ void store_out(const ActOut& o, int64_t idx, const float (&v)[V], float inv) {
  if (o.fmt == ActFormat::F32) {
    store_f32<V>(static_cast<float*>(o.data) + idx, v);
  } else if (o.fmt == ActFormat::BF16) {
    store_bf16<V>(static_cast<uint16_t*>(o.data) + idx, v);
  } else {
    int8_t* p = static_cast<int8_t*>(o.data) + idx;
    if constexpr (V == 4) {
      uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w |= uint32_t(uint8_t(quant_one(v[j], inv))) << (8 * j);
      *reinterpret_cast<uint32_t*>(p) = w;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) p[j] = quant_one(v[j], inv);
    }
  }
}



// ---------------------------------------------------------------- kernels

// The row's per-token int8 scale from each thread's partial absmax (a block-wide reduction):
// stored by thread 0, the reciprocal returned to every thread for quant_one.
__device__ __forceinline__ float row_scale(float amax, const ActOut& out, int64_t row) {
  amax = block_all_reduce(amax, MaxOp{});
  float scale, qinv;
  per_token_params(amax, scale, qinv);
  if (threadIdx.x == 0) out.scale[row] = scale;
  return qinv;
}

// The output pass of a row whose values a thread holds in registers (vectors i0 + it·step < n):
// the int8 scale from their absmax where the output is int8, then the stores.
template <int V, int kCache>
__device__ __forceinline__ void store_cached_row(const ActOut& out, int64_t row, int n, int i0, int step,
                                                 const float (&y)[kCache][V]) {
  float qinv = 0.0f;
  if (out.fmt == ActFormat::I8) {
    float amax = 0.0f;
#pragma unroll
    for (int it = 0; it < kCache; ++it)
      if (i0 + it * step < n) {
#pragma unroll
        for (int j = 0; j < V; ++j) amax = fmaxf(amax, fabsf(y[it][j]));
      }
    qinv = row_scale(amax, out, row);
  }
#pragma unroll
  for (int it = 0; it < kCache; ++it)
    if (i0 + it * step < n) store_out<V>(out, row * n + i0 + it * step, y[it], qinv);
}

// The same for rows too wide to hold: value(i, y) recomputes vector i (from L1 / L2) for the
// absmax pass and again for the stores.
template <int V, typename Value>
__device__ __forceinline__ void store_row_multipass(const ActOut& out, int64_t row, int n, int i0, int step,
                                                    Value value) {
  float qinv = 0.0f;
  if (out.fmt == ActFormat::I8) {
    float amax = 0.0f;
    for (int i = i0; i < n; i += step) {
      float y[V];
      value(i, y);
#pragma unroll
      for (int j = 0; j < V; ++j) amax = fmaxf(amax, fabsf(y[j]));
    }
    qinv = row_scale(amax, out, row);
  }
  for (int i = i0; i < n; i += step) {
    float y[V];
    value(i, y);
    store_out<V>(out, row * n + i, y, qinv);
  }
}

// One block per row. delta != nullptr: x += delta first (written back), then normalize.
// x is not __restrict__/const: in the fused form it is written in pass 1 and read in pass 2 by
// the same thread at the same addresses (program order makes that coherent).
// kCache > 0: a thread covers at most kCache vectors of the row (the launch checks), so it keeps
// them in registers from pass 1 (and the normalized values from the int8 absmax pass): the row
// is read from memory once. The arithmetic and its order are those of the multi-pass form.
// TD: the delta's type — float, or uint16_t (bf16 bits: a residual linear that wrote bf16);
// round_delta (float only): round each delta to bf16 first, the values a bf16 output would give.
template <int V, int kCache, typename TD>
__global__ void rms_norm_kernel(float* x, const TD* __restrict__ delta, const float* __restrict__ w,
                                float eps, int H, ActOut out, bool round_delta) {
  const int64_t row = blockIdx.x;
  float* xr = x + row * H;
  const int step = int(blockDim.x) * V;
  const int i0 = int(threadIdx.x) * V;
  double ss = 0.0;  // x*x is exact in double; only the summation order differs from the CPU
  auto pass1 = [&](int i, float (&v)[V]) {
    load<V>(xr + i, v);
    if (delta) {
      float d[V];
      load<V>(delta + row * H + i, d);
      if constexpr (std::is_same_v<TD, float>) {
        if (round_delta) {
#pragma unroll
          for (int j = 0; j < V; ++j) d[j] = bf16_round(d[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = __fadd_rn(v[j], d[j]);
      store_f32<V>(xr + i, v);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += double(v[j]) * double(v[j]);
  };
  if constexpr (kCache > 0) {
    float c[kCache][V];
#pragma unroll
    for (int it = 0; it < kCache; ++it)
      if (i0 + it * step < H) pass1(i0 + it * step, c[it]);
    ss = block_all_reduce(ss, SumOp{});
    const float inv = float(1.0 / sqrt(ss / double(H) + double(eps)));
#pragma unroll
    for (int it = 0; it < kCache; ++it) {
      const int i = i0 + it * step;
      if (i >= H) continue;
      float wv[V];
      load<V>(w + i, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) c[it][j] = norm_one(c[it][j], inv, wv[j]);
    }
    store_cached_row<V, kCache>(out, row, H, i0, step, c);
  } else {
    for (int i = i0; i < H; i += step) {
      float v[V];
      pass1(i, v);
    }
    ss = block_all_reduce(ss, SumOp{});
    // Exactly the CPU reference's expression: double mean + eps, IEEE sqrt and division.
    const float inv = float(1.0 / sqrt(ss / double(H) + double(eps)));
    store_row_multipass<V>(out, row, H, i0, step, [&](int i, float (&y)[V]) {
      float v[V], wv[V];
      load<V>(xr + i, v);
      load<V>(w + i, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = norm_one(v[j], inv, wv[j]);
    });
  }
}

// One block per row of gu [M, 2I]; output [M, I]. kCache > 0: a thread covers at most kCache
// vectors, kept in registers between the absmax and the write pass (int8 output: one read of gu).
// Launch bounds (1024, 2): at most 32 registers, so two blocks of up to 1024 threads share an SM
// (at 38 registers and 896 threads one block did, idle through its absmax barrier).
// T: float, or uint16_t (bf16 bits: a gate|up linear that wrote bf16). round_bf16 (float only):
// round each input to bf16 first — the values a bf16-output gate|up would have given.
template <int V, int kCache, typename T>
__global__ void __launch_bounds__(1024, 2)
    swiglu_kernel(const T* __restrict__ gu, int I, ActOut out, bool round_bf16) {
  const int64_t row = blockIdx.x;
  const T* g = gu + row * 2 * int64_t(I);
  const T* u = g + I;
  const int step = int(blockDim.x) * V;
  const int i0 = int(threadIdx.x) * V;
  auto value = [&](int i, float (&y)[V]) {
    float gv[V], uv[V];
    load<V>(g + i, gv);
    load<V>(u + i, uv);
    if constexpr (std::is_same_v<T, float>) {
      if (round_bf16) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          gv[j] = bf16_round(gv[j]);
          uv[j] = bf16_round(uv[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = swiglu_one(gv[j], uv[j]);
  };
  if constexpr (kCache > 0) {
    float y[kCache][V];
#pragma unroll
    for (int it = 0; it < kCache; ++it)
      if (i0 + it * step < I) value(i0 + it * step, y[it]);
    store_cached_row<V, kCache>(out, row, I, i0, step, y);
  } else {
    store_row_multipass<V>(out, row, I, i0, step, value);
  }
}

// One warp per (token, head) row of hd floats, kHeadRowsPerBlock rows per block. In place is
// safe: each lane reads its elements for the sum before it writes them.
constexpr int kHeadRowsPerBlock = 8;
__global__ void head_rms_norm_kernel(float* x, int64_t row_stride, int64_t rows, int n_heads, int hd,
                                     const float* __restrict__ w, float eps) {
  const int64_t r = int64_t(blockIdx.x) * kHeadRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps exit together: no block-level barrier in this kernel
  const int lane = threadIdx.x & 31;
  float* v = x + (r / n_heads) * row_stride + (r % n_heads) * int64_t(hd);
  double ss = 0.0;
  for (int i = lane; i < hd; i += 32) ss += double(v[i]) * double(v[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(kFull, ss, off);
  const float inv = float(1.0 / sqrt(ss / double(hd) + double(eps)));
  for (int i = lane; i < hd; i += 32) v[i] = norm_one(v[i], inv, w[i]);
}

// One block per token; thread t handles pairs (head, i) for q then k heads.
__global__ void rope_kernel(float* q, int64_t q_stride, int nq, float* k, int64_t k_stride, int nk,
                            const int32_t* __restrict__ pos, RopeTableView t) {
  const int64_t m = blockIdx.x;
  const int half = t.head_dim / 2;
  const int32_t p = pos[m];
  const bool ok = p >= 0 && p < t.max_pos;
  const float* cs = t.cos + (ok ? int64_t(p) * half : 0);
  const float* sn = t.sin + (ok ? int64_t(p) * half : 0);
  const int total = (nq + nk) * half;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int h = idx / half, i = idx - h * half;
    float* v = h < nq ? q + m * q_stride + int64_t(h) * t.head_dim : k + m * k_stride + int64_t(h - nq) * t.head_dim;
    if (!ok) {
      v[i] = v[i + half] = __int_as_float(0x7fc00000);
      continue;
    }
    rope_rotate(v[i], v[i + half], cs[i], sn[i], v[i], v[i + half]);
  }
}

// Row `id` of the table into o[0, hidden), threads of the block striding; an id outside
// [0, vocab) (vocab < 0: unchecked) gives a row of NaN. DT: 0 = F32, 1 = F16, 2 = BF16 (exact
// widening conversions, like the CPU).
template <int DT>
__device__ __forceinline__ void embed_row(const void* __restrict__ table, int64_t hidden, int32_t id, int64_t vocab,
                                          float* __restrict__ o) {
  if (id < 0 || (vocab >= 0 && id >= vocab)) {
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = __int_as_float(0x7fc00000);
    return;
  }
  const int64_t base = int64_t(id) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    if constexpr (DT == 0) {
      o[j] = static_cast<const float*>(table)[base + j];
    } else if constexpr (DT == 1) {
      o[j] = __half2float(__ushort_as_half(static_cast<const unsigned short*>(table)[base + j]));
    } else {
      o[j] = __uint_as_float(uint32_t(static_cast<const uint16_t*>(table)[base + j]) << 16);
    }
  }
}

template <int DT>
__global__ void embedding_kernel(const void* __restrict__ table, int64_t hidden, const int32_t* __restrict__ tok,
                                 int64_t vocab, float* __restrict__ out) {
  embed_row<DT>(table, hidden, tok[blockIdx.x], vocab, out + int64_t(blockIdx.x) * hidden);
}

template <typename TD>
__global__ void residual_add_kernel(float* __restrict__ x, const TD* __restrict__ d, int64_t n, bool round_d) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v[1];
    load<1>(d + i, v);
    if (std::is_same_v<TD, float> && round_d) v[0] = bf16_round(v[0]);
    x[i] = __fadd_rn(x[i], v[0]);
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = bf16_bits(x[i]);
}

// (v, i) beats (bv, bi) when larger, or equal with a lower index. NaN never beats anything
// (all comparisons false) and the start (-inf, INT_MAX) loses to any non-NaN value. A strict
// total order on the pairs a block can hold, so the best of a set does not depend on the order
// it is reduced in.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The block's best pair, returned to every thread.
__device__ __forceinline__ void block_best(float& bv, int& bi) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, off);
    const int oi = __shfl_xor_sync(kFull, bi, off);
    if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  __syncthreads();  // (a second call in one kernel reuses sv / si)
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
  __syncthreads();
  for (int w = 0; w < int(blockDim.x >> 5); ++w)
    if (beats(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
}

// One block a slice of kArgmaxSlice logits of a row (grid: slices × rows). 8 independent loads a
// thread: the row was just written by lm_head and sits in L2; a 128k vocabulary is 63 blocks,
// where one block used to read all 0.5 MB alone (~one SM's L2 bandwidth, ~8 µs a token).
constexpr int kArgmaxThreads = 256, kArgmaxPerThread = 8, kArgmaxSlice = kArgmaxThreads * kArgmaxPerThread;

int argmax_slices(int64_t vocab) { return int((vocab + kArgmaxSlice - 1) / kArgmaxSlice); }

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ out, int2* __restrict__ scratch,
                  GreedyFeed feed) {
  pdl::wait();
  pdl::launch_dependents();
  const int row = blockIdx.y, nb = gridDim.x;
  // The row's scratch: its arrival count, then one candidate a block (a layout that depends on
  // the vocabulary only, so calls of fewer rows never move a count).
  unsigned* count = reinterpret_cast<unsigned*>(scratch + int64_t(row) * (nb + 1));
  int2* cand = scratch + int64_t(row) * (nb + 1) + 1;
  const float* r = logits + int64_t(row) * vocab;
  const int first = blockIdx.x * kArgmaxSlice + threadIdx.x;
  float v[kArgmaxPerThread];
#pragma unroll
  for (int u = 0; u < kArgmaxPerThread; ++u) {
    const int i = first + u * kArgmaxThreads;
    v[u] = i < vocab ? r[i] : -INFINITY;
  }
  float bv = -INFINITY;
  int bi = INT_MAX;
#pragma unroll
  for (int u = 0; u < kArgmaxPerThread; ++u) {
    const int i = first + u * kArgmaxThreads;
    if (i < vocab && beats(v[u], i, bv, bi)) bv = v[u], bi = i;
  }
  block_best(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    cand[blockIdx.x] = make_int2(__float_as_int(bv), bi);
    __threadfence();  // the candidate is visible before the count says so
    last = atomicAdd(count, 1u) == unsigned(nb - 1);
  }
  __syncthreads();
  if (!last) return;
  // The row's last block: every other block's candidate is in L2 (read past L1 with __ldcg).
  __threadfence();
  bv = -INFINITY, bi = INT_MAX;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    const int2 c = __ldcg(&cand[b]);
    if (beats(__int_as_float(c.x), c.y, bv, bi)) bv = __int_as_float(c.x), bi = c.y;
  }
  block_best(bv, bi);
  const int32_t best = bi == INT_MAX ? 0 : bi;
  if (threadIdx.x == 0) {
    *count = 0;  // for the next call (which waits for this grid before it counts)
    out[row] = best;
    if (feed.tok) {  // the next decode step's input: this token, one position further
      feed.tok[row] = best;
      feed.pos[row] += 1;
      feed.seq[row].pos0 += 1;
    }
  }
  if (feed.tok && feed.x) {
    float* xr = feed.x + int64_t(row) * feed.hidden;
    switch (feed.table_dtype) {
      case DType::F32: embed_row<0>(feed.table, feed.hidden, best, -1, xr); break;
      case DType::F16: embed_row<1>(feed.table, feed.hidden, best, -1, xr); break;
      default: embed_row<2>(feed.table, feed.hidden, best, -1, xr); break;
    }
  }
}

// ---------------------------------------------------------------- host side

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

[[noreturn]] void bad(const char* fn, const std::string& why) { throw Error(std::string(fn) + ": " + why); }

// Threads for a row of `units` vector steps: about 4 steps per thread, whole warps, 32..1024.
// (H = 4096 fp32 -> 256 threads, H = 8192 -> 512, I = 28672 -> 1024 with 7 steps each.)
int row_threads(int units) {
  int t = ((units + 3) / 4 + 31) / 32 * 32;
  return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

// Rows of up to kRowCache vectors a thread (row_threads gives ~4 unless it hits 1024 threads:
// hidden sizes up to 16384 floats, intermediate sizes up to 16384 with V = 4) keep their values
// in registers between passes (rms_norm_kernel, swiglu_kernel).
constexpr int kRowCache = 4;
bool cacheable(int units, int threads) { return (units + threads - 1) / threads <= kRowCache; }

// Validates `out` and reports whether its pointer allows the 4-wide stores.
bool check_out(const char* fn, const ActOut& out) {
  if (!out.data) bad(fn, "null output pointer");
  switch (out.fmt) {
    case ActFormat::F32: return aligned(out.data, 16);
    case ActFormat::BF16: return aligned(out.data, 8);
    case ActFormat::I8:
      if (!out.scale) bad(fn, "ActFormat::I8 needs a scale pointer");
      return aligned(out.data, 4);
  }
  bad(fn, "unknown ActFormat");
}

void check_rows(const char* fn, int M, int W) {
  if (M < 0 || W <= 0) bad(fn, "bad shape M=" + std::to_string(M) + " width=" + std::to_string(W));
}

template <typename TD>
void launch_rms(const char* fn, float* x, const TD* delta, const float* w, float eps, int M, int H, ActOut out,
                cudaStream_t stream, bool round_delta = false) {
  check_rows(fn, M, H);
  if (!x || !w) bad(fn, "null device pointer");
  if (!(eps >= 0.0f)) bad(fn, "eps must be >= 0");
  const bool out_vec = check_out(fn, out);
  if (M == 0) return;
  const bool vec =
      H % 4 == 0 && out_vec && aligned(x, 16) && aligned(w, 16) && (!delta || aligned(delta, 4 * sizeof(TD)));
  if (vec) {
    const int t = row_threads(H / 4);
    if (cacheable(H / 4, t)) rms_norm_kernel<4, kRowCache><<<M, t, 0, stream>>>(x, delta, w, eps, H, out, round_delta);
    else rms_norm_kernel<4, 0><<<M, t, 0, stream>>>(x, delta, w, eps, H, out, round_delta);
  } else {
      const int t = row_threads(H);
      if (cacheable(H, t)) rms_norm_kernel<1, kRowCache><<<M, t, 0, stream>>>(x, delta, w, eps, H, out, round_delta);
      else rms_norm_kernel<1, 0><<<M, t, 0, stream>>>(x, delta, w, eps, H, out, round_delta);
    }
    check_launch(fn);
  }

  }  // namespace

  void embedding_lookup(const void* table, DType dt, int64_t hidden, const int32_t* d_tokens, int M, float* out,
                        cudaStream_t stream, int64_t vocab) {
    const char* fn = "embedding_lookup";
    if (!table || !d_tokens || !out) bad(fn, "null device pointer");
    if (hidden <= 0 || M < 0) bad(fn, "bad shape hidden=" + std::to_string(hidden) + " M=" + std::to_string(M));
    if (M == 0) return;
    const int threads = hidden >= 1024 ? 256 : 128;
    switch (dt) {
      case DType::F32: embedding_kernel<0><<<M, threads, 0, stream>>>(table, hidden, d_tokens, vocab, out); break;
      case DType::F16: embedding_kernel<1><<<M, threads, 0, stream>>>(table, hidden, d_tokens, vocab, out); break;
      case DType::BF16: embedding_kernel<2><<<M, threads, 0, stream>>>(table, hidden, d_tokens, vocab, out); break;
      default: bad(fn, std::string("table dtype ") + std::string(dtype_name(dt)) + " not supported (F32, F16, BF16)");
    }
    check_launch(fn);
  }

  void rms_norm(const float* x, const float* w, float eps, int M, int H, ActOut out, cudaStream_t stream) {
    // The kernel only writes x when delta is given.
    launch_rms("rms_norm", const_cast<float*>(x), static_cast<const float*>(nullptr), w, eps, M, H, out, stream);
  }

  void add_rms_norm(float* x, const float* delta, const float* w, float eps, int M, int H, ActOut out,
                    cudaStream_t stream, bool round_delta) {
    if (!delta) bad("add_rms_norm", "null device pointer");
    launch_rms("add_rms_norm", x, delta, w, eps, M, H, out, stream, round_delta);
  }
  void add_rms_norm(float* x, const uint16_t* delta_bf16, const float* w, float eps, int M, int H, ActOut out,
                    cudaStream_t stream) {
    if (!delta_bf16) bad("add_rms_norm(bf16 delta)", "null device pointer");
    launch_rms("add_rms_norm(bf16 delta)", x, delta_bf16, w, eps, M, H, out, stream);
  }

  void head_rms_norm(float* x, int64_t row_stride, int M, int n_heads, int hd, const float* w, float eps,
                     cudaStream_t stream) {
    const char* fn = "head_rms_norm";
    if (!x || !w) bad(fn, "null device pointer");
    if (M < 0 || n_heads <= 0 || hd <= 0 || hd > 1024 || row_stride < int64_t(n_heads) * hd)
      bad(fn, "bad shape M=" + std::to_string(M) + " n_heads=" + std::to_string(n_heads) + " hd=" +
                  std::to_string(hd) + " row_stride=" + std::to_string(row_stride));
    if (!(eps >= 0.0f)) bad(fn, "eps must be >= 0");
    const int64_t rows = int64_t(M) * n_heads;
    if (rows == 0) return;
    const int64_t blocks = (rows + kHeadRowsPerBlock - 1) / kHeadRowsPerBlock;
    if (blocks > INT_MAX) bad(fn, "too many rows");
    head_rms_norm_kernel<<<unsigned(blocks), kHeadRowsPerBlock * 32, 0, stream>>>(x, row_stride, rows, n_heads, hd, w,
                                                                                  eps);
    check_launch(fn);
  }

  DeviceRopeTable::DeviceRopeTable(const float* host_cos, const float* host_sin, int head_dim, int64_t max_pos)
      : head_dim_(head_dim), max_pos_(max_pos) {
    if (!host_cos || !host_sin) bad("DeviceRopeTable", "null host pointer");
    if (head_dim <= 0 || head_dim % 2 != 0 || max_pos <= 0)
      bad("DeviceRopeTable", "bad shape head_dim=" + std::to_string(head_dim) + " max_pos=" + std::to_string(max_pos));
    const size_t bytes = size_t(max_pos) * size_t(head_dim / 2) * sizeof(float);
    try {
      check_cuda(cudaMalloc(&cos_, bytes), "DeviceRopeTable: cudaMalloc");
      check_cuda(cudaMalloc(&sin_, bytes), "DeviceRopeTable: cudaMalloc");
      check_cuda(cudaMemcpy(cos_, host_cos, bytes, cudaMemcpyHostToDevice), "DeviceRopeTable: cudaMemcpy");
      check_cuda(cudaMemcpy(sin_, host_sin, bytes, cudaMemcpyHostToDevice), "DeviceRopeTable: cudaMemcpy");
    } catch (...) {
      cudaFree(cos_);  // cudaFree(nullptr) is a no-op
      cudaFree(sin_);
      throw;
  }
}

DeviceRopeTable::~DeviceRopeTable() {
  cudaFree(cos_);
  cudaFree(sin_);
}

DeviceRopeTable::DeviceRopeTable(DeviceRopeTable&& o) noexcept
    : cos_(std::exchange(o.cos_, nullptr)), sin_(std::exchange(o.sin_, nullptr)),
      head_dim_(o.head_dim_), max_pos_(o.max_pos_) {}

DeviceRopeTable& DeviceRopeTable::operator=(DeviceRopeTable&& o) noexcept {
  if (this != &o) {
    cudaFree(cos_);
    cudaFree(sin_);
    cos_ = std::exchange(o.cos_, nullptr);
    sin_ = std::exchange(o.sin_, nullptr);
    head_dim_ = o.head_dim_;
    max_pos_ = o.max_pos_;
  }
  return *this;
}

void rope_apply(float* q, int64_t q_stride, int n_q_heads, float* k, int64_t k_stride, int n_kv_heads, int M,
                const int32_t* d_pos, RopeTableView table, cudaStream_t stream) {
  const char* fn = "rope_apply";
  const int hd = table.head_dim;
  if (!table.cos || !table.sin || hd <= 0 || hd % 2 != 0 || table.max_pos <= 0) bad(fn, "bad rope table");
  if (!q || !d_pos || (n_kv_heads > 0 && !k)) bad(fn, "null device pointer");
  if (M < 0 || n_q_heads <= 0 || n_kv_heads < 0 || q_stride < int64_t(n_q_heads) * hd ||
      (n_kv_heads > 0 && k_stride < int64_t(n_kv_heads) * hd))
    bad(fn, "bad shape M=" + std::to_string(M) + " heads=" + std::to_string(n_q_heads) + "/" +
                std::to_string(n_kv_heads) + " head_dim=" + std::to_string(hd));
  if (int64_t(n_q_heads + n_kv_heads) * (hd / 2) > INT_MAX) bad(fn, "too many heads");
  if (M == 0) return;
  const int pairs = (n_q_heads + n_kv_heads) * (hd / 2);
  const int threads = pairs >= 1024 ? 512 : (pairs + 31) / 32 * 32;
  rope_kernel<<<M, threads, 0, stream>>>(q, q_stride, n_q_heads, k, k_stride, n_kv_heads, d_pos, table);
  check_launch(fn);
}

namespace {
template <typename T>
void launch_swiglu(const T* gu, int M, int I, ActOut out, cudaStream_t stream, bool round_bf16) {
  const char* fn = std::is_same_v<T, float> ? "swiglu" : "swiglu(bf16 gate|up)";
  check_rows(fn, M, I);
  if (!gu) bad(fn, "null device pointer");
  const bool out_vec = check_out(fn, out);
  if (M == 0) return;
  if (I % 4 == 0 && out_vec && aligned(gu, 4 * sizeof(T))) {
    const int t = row_threads(I / 4);
    if (cacheable(I / 4, t)) swiglu_kernel<4, kRowCache><<<M, t, 0, stream>>>(gu, I, out, round_bf16);
    else swiglu_kernel<4, 0><<<M, t, 0, stream>>>(gu, I, out, round_bf16);
  } else {
    const int t = row_threads(I);
    if (cacheable(I, t)) swiglu_kernel<1, kRowCache><<<M, t, 0, stream>>>(gu, I, out, round_bf16);
    else swiglu_kernel<1, 0><<<M, t, 0, stream>>>(gu, I, out, round_bf16);
  }
  check_launch(fn);
}
}  // namespace

void swiglu(const float* gu, int M, int I, ActOut out, cudaStream_t stream, bool round_to_bf16) {
  launch_swiglu(gu, M, I, out, stream, round_to_bf16);
}
void swiglu(const uint16_t* gu_bf16, int M, int I, ActOut out, cudaStream_t stream) {
  launch_swiglu(gu_bf16, M, I, out, stream, false);
}

namespace {
// Grid for the flat grid-stride kernels: enough blocks to fill an H200 several times over.
unsigned flat_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return unsigned(b < 8192 ? b : 8192);
}
}  // namespace

namespace {
template <typename TD>
void launch_residual_add(float* x, const TD* d, int64_t n, cudaStream_t stream, bool round_d) {
  if (n < 0) bad("residual_add", "negative size");
  if (n == 0) return;
  if (!x || !d) bad("residual_add", "null device pointer");
  residual_add_kernel<<<flat_blocks(n), 256, 0, stream>>>(x, d, n, round_d);
  check_launch("residual_add");
}
}  // namespace

void residual_add(float* x, const float* d, int64_t n, cudaStream_t stream, bool round_d) {
  launch_residual_add(x, d, n, stream, round_d);
}
void residual_add(float* x, const uint16_t* d_bf16, int64_t n, cudaStream_t stream) {
  launch_residual_add(x, d_bf16, n, stream, false);
}

void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n < 0) bad("f32_to_bf16", "negative size");
  if (n == 0) return;
  if (!x || !y) bad("f32_to_bf16", "null device pointer");
  f32_to_bf16_kernel<<<flat_blocks(n), 256, 0, stream>>>(x, y, n);
  check_launch("f32_to_bf16");
}

size_t argmax_scratch_bytes(int rows, int64_t vocab) {
  if (rows <= 0 || vocab <= 0 || vocab > INT_MAX) return 0;
  return size_t(rows) * size_t(argmax_slices(vocab) + 1) * sizeof(int2);
}

void argmax_rows(const float* logits, int rows, int64_t vocab, int32_t* out, void* scratch, cudaStream_t stream,
                 const GreedyFeed& feed) {
  const char* fn = "argmax_rows";
  if (!logits || !out || !scratch) bad(fn, "null device pointer");
  if (feed.tok && (!feed.pos || !feed.seq)) bad(fn, "a feed needs its positions and sequence records");
  if (feed.x && (!feed.tok || !feed.table || feed.hidden <= 0))
    bad(fn, "a feed of the embedding rows needs the tokens, the table and its width");
  if (feed.x && feed.table_dtype != DType::F32 && feed.table_dtype != DType::F16 && feed.table_dtype != DType::BF16)
    bad(fn, std::string("table dtype ") + std::string(dtype_name(feed.table_dtype)) + " not supported (F32, F16, BF16)");
  if (rows < 0 || rows > 65535 || vocab <= 0 || vocab > INT_MAX)
    bad(fn, "bad shape rows=" + std::to_string(rows) + " vocab=" + std::to_string(vocab));
  if (!aligned(scratch, 8)) bad(fn, "scratch must be 8-byte aligned");
  if (rows == 0) return;
  pdl::launch(fn, argmax_kernel, dim3(unsigned(argmax_slices(vocab)), unsigned(rows)), dim3(kArgmaxThreads), 0,
              stream, logits, int(vocab), out, static_cast<int2*>(scratch), feed);
}

}  // namespace perry::cuda
