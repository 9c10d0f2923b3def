// w8a16's pieces of gemv_decode (gemv_decode.cu only): the bf16 input row as three byte planes of
// a 24-bit fixed-point number per 64-value run, and the products of one weight chunk by dp4a.
// Included inside gemv_decode.cu's anonymous namespace, after its helpers (word, bf16_round, kFull,
// dp4a_us, kLimbPlanes).
//
// Why: the mode's rule is y = Σ_g s[n,g]·Σ_k bf16(x)·q (docs/quantization.md), and the fp32 path
// spent ~3.7 instructions a weight and a row on it (PRMT + FADD to make the weight a float, an
// FFMA, the bf16 → fp32 of x), ~790 a 4 KiB step — 2.3× w8a8-g128's dp4a loop on the same bytes,
// issue slots 62% busy (ncu, s22 run 1). A bf16 value times a power of two is an integer with at
// most 8 significant bits, so within a run whose largest |value| is below 2^E, v = bf16(x)·2^(23−E)
// is an exact signed 24-bit integer for every x of at least amax·2^-15, and Σ v·q is exact in
// three int32 sums over its bytes: v = b2·2^16 + b1·2^8 + b0 (b2 signed, the others unsigned) —
// three dp4a a weight word instead of ~15 fp32 instructions. The products are the bf16 rule's; the
// run's sum is exact where the fp32 path rounds every add. A value below amax·2^-15 of its run is
// rounded to the run's grid 2^(E−23): an error of at most 2^(E−24), one fp32 ulp of the run's amax —
// the size of the rounding that the fp32 path's add of the run's largest product makes itself
// (fp32 keeps 24 significant bits, and so does this grid under the run's largest value).
// s22 kept 32 bits in four planes (exact down to amax·2^-23); the fourth dp4a a word and plane
// bought precision below the fp32 summation's, at a quarter of the loop's dot products.

#pragma once

// The run's power of two: amax = m·2^E (m in [0.5, 1)), mul = 2^(23 − E) puts every |bf16 value| of
// the run below 2^23 (amax is taken over the rounded values), scale = 2^(E − 23) = 1 / mul. E is
// kept at −103 or more so that both are normal floats (a run whose values are all below 2^-104
// keeps fewer bits: such a run adds nothing visible to a row). amax 0: mul = scale = 1 (the run is
// 0); amax not finite: scale NaN, so that the row is NaN, as the fp32 rule's would be.
__device__ __forceinline__ void limb_pow2_params(float amax, float& scale, float& mul) {
  if (!(amax <= 3.4028235e38f)) {  // inf or NaN
    scale = __int_as_float(0x7fc00000), mul = 0.0f;
    return;
  }
  if (!(amax > 0.0f)) {
    scale = mul = 1.0f;
    return;
  }
  const int e = max(int((__float_as_uint(amax) >> 23) & 0xFF) - 126, -103);
  mul = __int_as_float((127 + 23 - e) << 23);
  scale = __int_as_float((127 - 23 + e) << 23);
}

// Octet o (v) of w8a16's input into the byte planes (plane j of k at xs + j·K + k, j < 3) at its run's
// power of two, the run's scale into xscale[o / 8]. Called by every lane of a warp with o = o0 +
// lane (o0 warp-uniform, a multiple of 32; in_range = o < octets): a run's 8 octets sit in 8
// neighbouring lanes, so its amax is 3 shuffles.
__device__ __forceinline__ void limb_octet_in_run(int o, bool in_range, const float (&v)[8], uint8_t* xs, int K,
                                                  float* xscale) {
  // The amax as the bits of |t|: unsigned order is |value| order, with NaN above inf, so a NaN
  // anywhere in the run wins (fmaxf would drop it).
  float t[8];
  uint32_t abits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    t[j] = bf16_round(v[j]);
    if (in_range) abits = max(abits, __float_as_uint(t[j]) & 0x7fffffffu);
  }
#pragma unroll
  for (int m = 1; m < 8; m <<= 1) abits = max(abits, __shfl_xor_sync(kFull, abits, m));
  float scale, mul;
  limb_pow2_params(__uint_as_float(abits), scale, mul);
  if (!in_range) return;
  uint32_t q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) q[j] = uint32_t(__float2int_rn(t[j] * mul));  // exact from amax·2^-15
  // Byte j < 3 of the 8 words into plane j (the two words of 4 values each: bytes of q0..q3,
  // q4..q7); byte 3 is byte 2's sign, |v| < 2^23.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a = q[4 * h], b = q[4 * h + 1], c = q[4 * h + 2], d = q[4 * h + 3];
    const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1 | a2 b2 a3 b3
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    q[4 * h] = __byte_perm(ab_lo, cd_lo, 0x5410);      // a0 b0 c0 d0
    q[4 * h + 1] = __byte_perm(ab_lo, cd_lo, 0x7632);  // a1 b1 c1 d1
    q[4 * h + 2] = __byte_perm(ab_hi, cd_hi, 0x5410);  // a2 b2 c2 d2
  }
#pragma unroll
  for (int j = 0; j < kLimbPlanes; ++j) *reinterpret_cast<uint2*>(xs + j * K + 8 * o) = make_uint2(q[j], q[4 + j]);
  if ((o & 7) == 0) xscale[o / 8] = scale;
}

// The 16 int8 weights of chunk c (k 16c .. 16c + 15) of each of kR rows times the input's byte
// planes, into the rows' three limb sums: L[j][r] += Σ b_j(k)·q(k) (plane 2 signed, 0–1 unsigned).
// Exact: a lane folds its sums once a step (one 64-value run, limb_value), |L| <= 255·127·64.
template <int kR>
__device__ __forceinline__ void limbs_chunk(const uint4 (&w)[kR], const uint8_t* xs, int K, int c,
                                            int (&L)[kLimbPlanes][kR]) {
  uint4 pl[kLimbPlanes];
#pragma unroll
  for (int j = 0; j < kLimbPlanes; ++j) pl[j] = *reinterpret_cast<const uint4*>(xs + j * K + 16 * c);
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t ww = word(w[r], i);
      L[0][r] = dp4a_us(word(pl[0], i), ww, L[0][r]);
      L[1][r] = dp4a_us(word(pl[1], i), ww, L[1][r]);
      L[2][r] = __dp4a(int(word(pl[2], i)), int(ww), L[2][r]);
    }
}

// A run's Σ v·q from its three limb sums, in fp32: the low pair combined exactly in int32
// (|L1·2^8 + L0| < 2^30 for one 64-value run), the high limb exact as a float (|L2| < 2^21), then
// the low pair's rounding and the fma's — v's scale 2^-23·2^E is the caller's.
__device__ __forceinline__ float limb_value(int l0, int l1, int l2) {
  return fmaf(float(l2), 65536.0f, float(l0 + (l1 << 8)));
}
