// w4a16's tensor-core pieces of gemv_decode (gemv_decode.cu only): its input row as fp16 at a
// power of two per 128-value run, and the products of one chunk on mma.sync m16n8k16 f16 with fp32
// accumulation (w4a16_chunk says how a GEMV uses the tensor cores without reordering weights).
// Included inside gemv_decode.cu's anonymous namespace, after its helpers (word, bf16_round, kFull).
#pragma once

// C += A·B, m16n8k16, f16 inputs, f32 accumulators (w4a16_chunk; not
// volatile: no side effects, so the compiler may interleave independent chains).
__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Packed f16x2 arithmetic on raw words: a − b and a·b + c, round to nearest.
__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// w4a16's input row: the bf16 values of the mode's rule (docs/quantization.md: y = Σ_g s[n,g]·
// Σ_k bf16(x)·q), carried in fp16 at a power of two per run (the 128 k values one lane quad
// multiplies, w4a16_chunk) so that the tensor cores take them (mma.sync f16, fp32
// accumulation). The run's amax = m·2^E (m in [0.5, 1)), mul = 2^(15 − E) puts its largest |value|
// in [2^14, 2^15]; a bf16 value (8 significant bits) times a power of two is exact in fp16 from
// 2^-17 up, so every value above amax·2^-32 arrives exactly — the products are those of the bf16
// path (the CPU's), only their summation order differs. scale = 1 / mul is folded with the group
// scale. amax 0 or not finite: mul = scale = 1. The exponent stays within ±100, so both are
// normal floats. Per run, not per token: the run's amax is four shuffles, where a row amax is a
// block reduction and its barrier in every prologue (the two measured alike, s21 runs 1–2).
__device__ __forceinline__ void fp16_pow2_params(float amax, float& scale, float& mul) {
  int e = 0;
  if (amax > 0.0f && isfinite(amax)) e = min(max(15 - (int((__float_as_uint(amax) >> 23) & 0xFF) - 126), -100), 100);
  mul = __int_as_float((127 + e) << 23);
  scale = __int_as_float((127 - e) << 23);
}
// Octet o of w4a16's input (bf16(v)·mul as fp16, exact) into xs, in the order the tensor-core loop
// reads it: each half2 holds the two k values that one A-fragment register pairs, (k0, k4) (k1, k5)
// (k2, k6) (k3, k7) per 8 — the nibbles a 0x000F000F mask takes from a weight word —, and the four
// 16-byte octets of a lane's chunk swizzled (slot j ^ f(chunk)) so that the 8 lanes of a 128-byte
// phase read 8 different bank quads (lane l reads chunk 32i + l: 64 bytes a lane).
__device__ __forceinline__ void store_fp16_octet(int o, const float (&v)[8], float mul, uint8_t* xs) {
  float t[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) t[j] = bf16_round(v[j]) * mul;
  auto pack = [](float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  };
  const int c = o >> 2;
  reinterpret_cast<uint4*>(xs)[4 * c + ((o & 3) ^ ((c >> 1) & 3))] =
      make_uint4(pack(t[0], t[4]), pack(t[1], t[5]), pack(t[2], t[6]), pack(t[3], t[7]));
}

// Octet o (v) of w4a16's input into xs as fp16 at its run's power of two, the run's scale into
// xscale[o / 16]. Called by every lane of a warp with o = o0 + lane (o0 warp-uniform, a multiple
// of 32; in_range = o < octets): a run's 16 octets sit in 16 neighbouring lanes, so its amax is 4
// shuffles.
__device__ __forceinline__ void fp16_octet_in_run(int o, bool in_range, const float (&v)[8], uint8_t* xs, float* xscale) {
  float amax = 0.0f;
  if (in_range)
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
  for (int m = 1; m < 16; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, m));
  float scale, mul;
  fp16_pow2_params(amax, scale, mul);
  if (in_range) {
    store_fp16_octet(o, v, mul, xs);
    if ((o & 15) == 0) xscale[o / 16] = scale;
  }
}

// w4a16's products for one 16-byte chunk (32 int4) of each of a warp's two rows (w[0], w[1]: lane
// l's chunk c of the step), on the tensor cores: the nibbles become exact fp16 integers in two
// instructions a pair (a LOP3 puts a nibble under the exponent of 1024 — 0x64XX is 1024 + XX —
// and one f16x2 subtract, or an fma for a high nibble 16 times too high, removes the offset),
// and an m16n8k16 mma multiplies them by the fp16 input with fp32 accumulation. A is the weights
// (A row g = row 0's, row g + 8 = row 1's, of the quad g = lane / 4), B the input (column g = the
// quad's x). Each lane (g, t) holds A[g][s] and B[s][g] for the same four k slots s, so any
// assignment of a lane's own four k values to its slots is a valid dot product: D[g][g] = the
// quad's four lanes' products of row 0, D[g + 8][g] of row 1 — 16 of the mma's 128 outputs are
// used, ~1/8 of its work, while the conversion costs ~1.1 instructions a weight and a row instead
// of the fp32 path's ~3.4 (unpack, PRMT, FADD, FFMA). The quad's 4 chunks are one 128-k run,
// inside one group. Returns (D[g][g], D[g + 8][g]), meaningful in lane 4g + g / 2 (c0 / c1, c2 /
// c3 by g's parity); the others hold other outputs. kPartial: a chunk window that ends past the
// row (live = this lane's chunk is in it; the others multiply zeros, at chunk c clamped into the
// row). The same scheme for int8 weights (w8a16: bytes by LOP3 + f16x2 subtract, 4 mma a chunk)
// was measured slower than its fp32 path on the H200 — decode 310 vs 347 tok/s in two runs
// (s21 runs 1–2, with a per-token and a per-run scale alike) — and was removed: w8a16 takes dp4a
// over its input's byte planes instead (gemv_decode_w8a16.cuh).
template <bool kPartial>
__device__ __forceinline__ float2 w4a16_chunk(const uint4 (&w)[2], const uint8_t* xs, int c, bool live) {
  const int lane = threadIdx.x & 31;
  const uint4* xq = reinterpret_cast<const uint4*>(xs);
  uint4 w0 = w[0], w1 = w[1];
  if (kPartial && !live) w0 = w1 = make_uint4(0, 0, 0, 0);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int sw = (lane >> 1) & 3;  // store_fp16_octet's swizzle
  uint4 xo[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) xo[j] = xq[4 * c + (j ^ sw)];
  if (kPartial && !live)
#pragma unroll
    for (int j = 0; j < 4; ++j) xo[j] = make_uint4(0, 0, 0, 0);
  // Nibble n = v + 8 (n ^ 8 of the stored two's complement): low nibble 1024 + n − 1032; the
  // high nibble of a byte, 16·n under the exponent: (1024 + 16n) / 16 − 72.
  constexpr uint32_t kLo = 0x64086408u, kHi = 0x64806480u, kSixteenth = 0x2C002C00u, kMinus72 = 0xD480D480u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i: k 8i .. 8i + 7 (nibble j = k j) → (k0, k4) (k1, k5), (k2, k6) (k3, k7)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t wa = word(w0, i) >> (8 * h), wb = word(w1, i) >> (8 * h);
      // and_xor: the mask and the exponent in one LOP3 (in C, ptxas splits the two constants).
      const uint32_t a[4] = {hsub2_bits(and_xor(wa, 0x000F000Fu, kLo), kLo), hsub2_bits(and_xor(wb, 0x000F000Fu, kLo), kLo),
                             hfma2_bits(and_xor(wa, 0x00F000F0u, kHi), kSixteenth, kMinus72),
                             hfma2_bits(and_xor(wb, 0x00F000F0u, kHi), kSixteenth, kMinus72)};
      const uint32_t b[2] = {h == 0 ? xo[i].x : xo[i].z, h == 0 ? xo[i].y : xo[i].w};
      mma_f16(d, a, b);
    }
  }
  const bool odd = (lane >> 2) & 1;
  return make_float2(odd ? d[1] : d[0], odd ? d[3] : d[2]);
}
