// The prologue of gemv_decode (gemv_decode.cu only): the token's linear input row built in shared
// memory — RMSNorm or the row as it is, then int8 per token (quantize_octet), bf16, or a weight-only
// kind's runs (gemv_decode_w4a16.cuh, gemv_decode_w8a16.cuh) — from registers or the fp32 staging.
// Included inside gemv_decode.cu's anonymous namespace, after Params, the kinds and smem_layout.
#pragma once

__device__ __forceinline__ void load_octet(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store_octet(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// Octets o0 + b·kThreads (b < kB, those below `octets`) of x into v, every load issued before any
// value is used: x was just written by the previous kernel, so each round trip is an L2 latency
// on the block's critical path.
template <int kB>
__device__ __forceinline__ void load_octets(const float* x, int o0, int octets, float (&v)[kB][8]) {
#pragma unroll
  for (int b = 0; b < kB; ++b)
    if (o0 + b * kThreads < octets) load_octet(x + 8 * (o0 + b * kThreads), v[b]);
}

// 8 floats as 8 packed bf16 (round to nearest even), one 16-byte store.
__device__ __forceinline__ void store_bf16_octet(uint8_t* p, const float (&v)[8]) {
  uint4 out;
  out.x = uint32_t(bf16_bits(v[0])) | uint32_t(bf16_bits(v[1])) << 16;
  out.y = uint32_t(bf16_bits(v[2])) | uint32_t(bf16_bits(v[3])) << 16;
  out.z = uint32_t(bf16_bits(v[4])) | uint32_t(bf16_bits(v[5])) << 16;
  out.w = uint32_t(bf16_bits(v[6])) | uint32_t(bf16_bits(v[7])) << 16;
  *reinterpret_cast<uint4*>(p) = out;
}

// quant_one(x, qinv) by float arithmetic only, as the low byte of the returned word (F2I, which
// quant_one rounds with, issues at a quarter of the FP32 rate, and a block quantizes its whole input
// row): clamping v to ±127 before rounding equals clamping after (the bounds are integers), and
// adding 1.5·2^23 rounds |v| <= 127 to an integer — to nearest, ties to even like __float2int_rn,
// since 1.5·2^23 is even — whose two's complement low byte is the sum's low mantissa byte.
__device__ __forceinline__ uint32_t quant_byte(float x, float qinv) {
  float v = __fmul_rn(x, qinv);
  v = v == v ? fminf(fmaxf(v, -127.0f), 127.0f) : 0.0f;  // NaN: 0, as quant_one
  return __float_as_uint(__fadd_rn(v, 12582912.0f));
}
// The low bytes of a, b, c, d as one word (a's in byte 0).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Quantizes octet o of the input (v) with qinv into xs — for int4 weights permuted per 8 values to
// the nibble order (k0 k2 k4 k6 | k1 k3 k5 k7) — and, for int4, xsum[o / 4] = Σ of the 32 values
// of its chunk. Called by every lane of a warp with o = o0 + lane (o0 warp-uniform; in_range = o <
// octets): the 4 octets of a chunk sit in 4 neighbouring lanes, so xsum is two shuffles
// (octets % 4 == 0: the 4 lanes of a chunk are all in range or all out).
template <int kW>
__device__ __forceinline__ void quantize_octet(int o, bool in_range, const float (&v)[8], float qinv, uint8_t* xs,
                                               int* xsum) {
  int s8 = 0;
  if (in_range) {
    uint32_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = quant_byte(v[j], qinv);
    const uint2 out = kW == kWI4
                          ? make_uint2(pack_low_bytes(q[0], q[2], q[4], q[6]), pack_low_bytes(q[1], q[3], q[5], q[7]))
                          : make_uint2(pack_low_bytes(q[0], q[1], q[2], q[3]), pack_low_bytes(q[4], q[5], q[6], q[7]));
    *reinterpret_cast<uint2*>(xs + 8 * o) = out;
    s8 = __dp4a(int(out.x), int(0x01010101u), __dp4a(int(out.y), int(0x01010101u), 0));
  }
  if constexpr (kW == kWI4) {
    s8 += __shfl_xor_sync(kFull, s8, 1);
    s8 += __shfl_xor_sync(kFull, s8, 2);
    if (in_range && (threadIdx.x & 3) == 0) xsum[o / 4] = s8;
  }
}

#include "kernels/cuda/gemv_decode_w4a16.cuh"  // (w4a16: fp16 input runs, w4a16_chunk)
#include "kernels/cuda/gemv_decode_w8a16.cuh"  // (w8a16: byte-plane input runs, limbs_chunk)

// Octet o of a weight-only kind's input into its runs (fp16_octet_in_run, limb_octet_in_run; the
// run scales into xscale). Every lane of a warp calls it, o = o0 + lane (o0 warp-uniform).
template <int kW>
__device__ __forceinline__ void weight_only_octet(int o, bool in_range, const float (&v)[8], uint8_t* xs, int K,
                                                  float* xscale) {
  if constexpr (kW == kWI4) fp16_octet_in_run(o, in_range, v, xs, xscale);
  else limb_octet_in_run(o, in_range, v, xs, K, xscale);
}

// Inputs held in registers (x_in_registers): thread t holds octets t + b·kThreads, so a warp's
// lanes hold consecutive octets as quantize_octet needs. The row's amax (of the values as they
// are now in v), then quantized into xs (int8) — returns the per-token scale —, or (weight-only
// kinds) each run scaled into it (no row amax; returns 1).
template <int kW, bool kXI8, int kB>
__device__ float quantize_registers(int octets, const float (&v)[kB][8], uint8_t* xs, int* xsum) {
  if constexpr (!kXI8) {
    const int o0 = threadIdx.x & ~31;
#pragma unroll
    for (int b = 0; b < kB; ++b)
      if (o0 + b * kThreads < octets) {  // warp-uniform: the run's shuffles
        const int o = threadIdx.x + b * kThreads;
        weight_only_octet<kW>(o, o < octets, v[b], xs, 8 * octets, reinterpret_cast<float*>(xsum));
      }
    __syncthreads();
    return 1.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int b = 0; b < kB; ++b)
    if (threadIdx.x + b * kThreads < octets)
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[b][j]));
  __shared__ float amax_part[kWarps];
  amax = block_all_reduce_once<kWarps>(amax, MaxOp{}, amax_part);
  float scale, qinv;
  per_token_params(amax, scale, qinv);
  const int o0 = threadIdx.x & ~31;
#pragma unroll
  for (int b = 0; b < kB; ++b)
    if (o0 + b * kThreads < octets) {  // warp-uniform: quantize_octet shuffles
      const int o = threadIdx.x + b * kThreads;
      quantize_octet<kW>(o, o < octets, v[b], qinv, xs, xsum);
    }
  __syncthreads();
  return scale;
}

// The RMSNorm input with K <= kMaxRegNormK: x into registers, the float64 sum of squares over
// each thread's octets in the staged path's order (so the same inv), normalized with the norm
// weights nw (registers, loaded before the wait), then quantized (or stored as bf16).
template <int kW, bool kXI8>
__device__ float normalize_from_registers(const Params& p, const float (&nw)[kNormRegOctets][8], uint8_t* xs,
                                          int* xsum) {
  const int octets = p.K / 8;
  float v[kNormRegOctets][8];
  load_octets(p.x, int(threadIdx.x), octets, v);
  double ss = 0.0;  // x*x exact in double, as rms_norm
#pragma unroll
  for (int b = 0; b < kNormRegOctets; ++b)
    if (threadIdx.x + b * kThreads < octets)
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += double(v[b][j]) * double(v[b][j]);
  __shared__ double ss_part[kWarps];  // (quantize_registers reduces into its own buffer next)
  ss = block_all_reduce_once<kWarps>(ss, SumOp{}, ss_part);
  const float inv = float(1.0 / sqrt(ss / double(p.K) + double(p.eps)));
#pragma unroll
  for (int b = 0; b < kNormRegOctets; ++b)
#pragma unroll
    for (int j = 0; j < 8; ++j) v[b][j] = norm_one(v[b][j], inv, nw[b][j]);
  if constexpr (x_scaled(kW, kXI8)) {
    return quantize_registers<kW, kXI8>(octets, v, xs, xsum);
  } else {
#pragma unroll
    for (int b = 0; b < kNormRegOctets; ++b)
      if (threadIdx.x + b * kThreads < octets) store_bf16_octet(xs + 16 * (threadIdx.x + b * kThreads), v[b]);
    __syncthreads();
    return 0.0f;
  }
}

// Prologue: the token's linear input into shared memory, reading x from global memory once (into
// registers — x_in_registers: RMSNorm inputs up to kMaxRegNormK, plain int8 up to kMaxRegK — or,
// for longer rows, one pass into the fp32 staging, then passes over shared memory; each wait on a
// block reduction is one barrier). int8 activations: xs int8 [K]
// (for int4 weights permuted per 8 values to (k0 k2 k4 k6 | k1 k3 k5 k7), the nibble order of a
// weight word) and, for int4, xsum[c] = Σ of
// the 32 int8 values of chunk c; bf16: xs uint16 [K]; the weight-only kinds: their runs
// (weight_only_octet). The values are those of the separate
// kernels up to the order of the float64 sum of squares (which decides inv's fp32 value only when
// the sum lands on a rounding boundary): the same fp32 normalization, amax and rounding. Returns the per-token activation scale (int8) — the same
// value in every thread.
template <int kW, bool kXI8, int kIn>
__device__ float build_input(const Params& p, uint8_t* smem, const float (&nw_regs)[kNormRegOctets][8]) {
  const int K = p.K, octets = K / 8;
  const SmemLayout lay = smem_layout(K, kW, kXI8, kIn);
  uint8_t* xs = smem;
  if (p.lab_input != DecodeLabInput::Build) {  // lab: the kernel without building its input (x = 0)
    float sink = 0.0f;
    if (p.lab_input == DecodeLabInput::ReadOnly) {  // ... but with x read, every load in flight at once
      for (int o0 = threadIdx.x; o0 < octets; o0 += kRegOctets * kThreads) {
        float v[kRegOctets][8];
        load_octets(p.x, o0, octets, v);
        // Only the first value of each octet is used, so the compiler narrows each octet's loads to
        // one 4-byte load — still one 32-byte sector, one round trip. (Using all 8 would raise the
        // registers of every kernel: this branch is compiled into the real ones.)
#pragma unroll
        for (int b = 0; b < kRegOctets; ++b)
          if (o0 + b * kThreads < octets) sink += v[b][0];
      }
    }
    for (int o = threadIdx.x; o < lay.xf / 16; o += kThreads) reinterpret_cast<uint4*>(xs)[o] = make_uint4(0, 0, 0, 0);
    if (sink == -1234.5f) xs[0] = 1;  // a use of the loaded values, so that the block waits for them
    __syncthreads();
    return 1.0f;
  }
  int* xsum = reinterpret_cast<int*>(smem + lay.xsum);
  float* xf = reinterpret_cast<float*>(smem + lay.xf);
  const float* nw = p.norm_w;  // (staged path: K > kMaxRegNormK, read from global memory)
  constexpr bool kScaled = x_scaled(kW, kXI8);
  if constexpr (!kScaled && kIn == kInPlain) {  // bf16 of x as it is: one pass, no staging
    // kBatch octets a thread in flight at once (a plain loop waited a round trip for each).
    constexpr int kBatch = 4;
    for (int o0 = threadIdx.x; o0 < octets; o0 += kBatch * kThreads) {
      float v[kBatch][8];
      load_octets(p.x, o0, octets, v);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (o0 + b * kThreads < octets) store_bf16_octet(xs + 16 * (o0 + b * kThreads), v[b]);
    }
    __syncthreads();
    return 0.0f;
  } else {
    if (x_in_registers(K, kW, kXI8, kIn)) {
      if constexpr (kIn == kInNorm) return normalize_from_registers<kW, kXI8>(p, nw_regs, xs, xsum);
      float v[kRegOctets][8];
      load_octets(p.x, int(threadIdx.x), octets, v);
      return quantize_registers<kW, kXI8>(octets, v, xs, xsum);
    }
    // Pass 1 (global → staging by async copies, all of a thread's in flight at once: x was just
    // written by the previous kernel, so each round trip is an L2 latency on the block's critical
    // path — a load-and-store loop waited for one per octet), then, each thread over the octets it
    // copied: the sum of squares (RmsNorm) or amax (plain int8 input).
    for (int o = threadIdx.x; o < octets; o += kThreads) {
      cp_async16(xf + 8 * o, p.x + 8 * o, 16);
      cp_async16(xf + 8 * o + 4, p.x + 8 * o + 4, 16);
    }
    cp_async_commit();
    cp_async_wait<0>();  // this thread's copies have landed
    double ss = 0.0;  // x*x exact in double, as rms_norm
    float amax = 0.0f;
    for (int o = threadIdx.x; o < octets; o += kThreads) {
      float v[8];
      load_octet(xf + 8 * o, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if constexpr (kIn == kInNorm) ss += double(v[j]) * double(v[j]);
        else amax = fmaxf(amax, fabsf(v[j]));
      }
    }
    float inv = 1.0f;
    if constexpr (kIn == kInNorm) {
      __shared__ double ss_part[kWarps];
      ss = block_all_reduce_once<kWarps>(ss, SumOp{}, ss_part);
      inv = float(1.0 / sqrt(ss / double(K) + double(p.eps)));
      // Pass 2 (staging): normalized — straight to bf16, or in place with its amax for int8.
      for (int o = threadIdx.x; o < octets; o += kThreads) {
        float v[8], w[8];
        load_octet(xf + 8 * o, v);
        load_octet(nw + 8 * o, w);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[j] = norm_one(v[j], inv, w[j]);
          if constexpr (kScaled) amax = fmaxf(amax, fabsf(v[j]));
        }
        if constexpr (kScaled) store_octet(xf + 8 * o, v);  // each thread reads back only its own octets below
        else store_bf16_octet(xs + 16 * o, v);
      }
    }
    if constexpr (!kScaled) {
      __syncthreads();
      return 0.0f;
    } else {
      float scale = 1.0f, qinv = 0.0f;
      if constexpr (kXI8) {
        __shared__ float amax_part[kWarps];
        amax = block_all_reduce_once<kWarps>(amax, MaxOp{}, amax_part);
        per_token_params(amax, scale, qinv);
      }
      // Pass 3 (staging → xs): quantize (or scale each run to fp16), a warp's lanes over
      // consecutive octets.
      for (int o0 = threadIdx.x & ~31; o0 < octets; o0 += kThreads) {
        const int o = o0 + (threadIdx.x & 31);
        float v[8] = {};
        if (o < octets) load_octet(xf + 8 * o, v);
        if constexpr (kXI8) quantize_octet<kW>(o, o < octets, v, qinv, xs, xsum);
        else weight_only_octet<kW>(o, o < octets, v, xs, K, reinterpret_cast<float*>(xsum));
      }
      __syncthreads();
      return scale;
    }
  }
}
