// w4a16's tensor-core products for gemv_decode (gemv_decode.cu only): one chunk of int4 weights
// times the input row's three byte planes (limb_octet_in_run<16, true>, gemv_decode_w8a16.cuh) on
// mma.sync m16n8k32 int8 with int32 accumulation. Included inside gemv_decode.cu's anonymous
// namespace, after its helpers (word, kFull) and the w8a16 pieces (limb_value).
//
// Why (s34): the earlier form converted each nibble to fp16 (a LOP3 and an f16x2 subtract or fma
// a pair of weights and a row) for an m16n8k16 f16 mma: ~1.1 instructions a weight and a row, and
// its decode step without any weight traffic took 1.87 ms against w4a8-g128's 1.26 ms (s34 run 1,
// H100) — the loop, not the bytes. Here a weight word (8 nibbles) becomes two int8 words of 16·q
// in three integer instructions and feeds three mma (one per input plane) shared by two rows:
// ~0.5 instructions a weight and a row. The input is w8a16's: the bf16 values at a power of two
// per run as 24-bit integers, exact from amax·2^-15 of the run, rounded to the run's grid below
// (one fp32 ulp of its amax: the fp32 rule's own rounding size, gemv_decode_w8a16.cuh); the
// run is 128 values here, a lane quad's chunk.
#pragma once

// C += A·B, m16n8k32, s8 A (weights), u8 or s8 B (an input plane), s32 accumulators. Not volatile:
// no side effects, so the compiler may interleave the three planes' chains.
template <bool kSignedB>
__device__ __forceinline__ void mma_s8_plane(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kSignedB)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// w4a16's products for one 16-byte chunk (32 int4) of each of a warp's two rows (w[0], w[1]: lane
// l's chunk c of the step). A is the weights (A row g = row 0's, row g + 8 = row 1's, of the quad
// g = lane / 4), B an input plane (column g = the quad's x). Each lane (g, t) holds A[g][s] and
// B[s][g] for the same k slots s (a0 / a1 with b0, a2 / a3 with b1), so any assignment of a lane's
// own k values to its slots is a valid dot product: D[g][g] = the quad's four lanes' products of
// row 0, D[g + 8][g] of row 1 — 16 of the mma's 128 outputs are used, while the conversion is
// paid once for the three planes. Word i of a chunk holds k 8i .. 8i + 7 as nibbles (two's
// complement q, low nibble first): `(w << 4) & 0xF0F0F0F0` is 16·q of k 8i + 0, 2, 4, 6 and `w &
// 0xF0F0F0F0` 16·q of k 8i + 1, 3, 5, 7, each an int8 — the plane bytes of octet 4c + i are
// stored in that order. The quad's 4 chunks are one 128-k run, inside one group, so the three
// int32 sums (|16·q| <= 128, exact) combine into the run's Σ v·16·q by limb_value. Returns (row 0,
// row 1) of that, meaningful in lane 4g + g / 2 (c0 / c1, c2 / c3 by g's parity); the others hold
// other outputs. The caller folds the run's input scale, the group scale and 1/16. kPartial: a
// chunk window that ends past the row (live = this lane's chunk is in it; the others multiply
// zero weights, at chunk c clamped into the row).
template <bool kPartial>
__device__ __forceinline__ float2 w4a16_chunk(const uint4 (&w)[2], const uint8_t* xs, int K, int c, bool live) {
  const int lane = threadIdx.x & 31;
  uint4 w0 = w[0], w1 = w[1];
  if (kPartial && !live) w0 = w1 = make_uint4(0, 0, 0, 0);
  uint32_t a[4][4];  // word i: row 0 low, row 1 low, row 0 high, row 1 high
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u0 = word(w0, i), u1 = word(w1, i);
    a[i][0] = (u0 << 4) & 0xF0F0F0F0u, a[i][1] = (u1 << 4) & 0xF0F0F0F0u;
    a[i][2] = u0 & 0xF0F0F0F0u, a[i][3] = u1 & 0xF0F0F0F0u;
  }
  const int sw = (c >> 2) & 1;  // limb_octet_in_run's half swap
  int d[kLimbPlanes][4];
#pragma unroll
  for (int j = 0; j < kLimbPlanes; ++j) {
    const uint8_t* pj = xs + j * K + 32 * c;
    const uint4 h0 = *reinterpret_cast<const uint4*>(pj + 16 * sw);        // octets 4c, 4c + 1
    const uint4 h1 = *reinterpret_cast<const uint4*>(pj + 16 * (sw ^ 1));  // octets 4c + 2, 4c + 3
#pragma unroll
    for (int e = 0; e < 4; ++e) d[j][e] = 0;
    if (j == kLimbPlanes - 1) {  // the top plane carries the sign
      mma_s8_plane<true>(d[j], a[0], h0.x, h0.y), mma_s8_plane<true>(d[j], a[1], h0.z, h0.w);
      mma_s8_plane<true>(d[j], a[2], h1.x, h1.y), mma_s8_plane<true>(d[j], a[3], h1.z, h1.w);
    } else {
      mma_s8_plane<false>(d[j], a[0], h0.x, h0.y), mma_s8_plane<false>(d[j], a[1], h0.z, h0.w);
      mma_s8_plane<false>(d[j], a[2], h1.x, h1.y), mma_s8_plane<false>(d[j], a[3], h1.z, h1.w);
    }
  }
  const bool odd = (lane >> 2) & 1;
  static_assert(kLimbPlanes == 3, "limb_value takes three planes");
  return make_float2(limb_value(odd ? d[0][1] : d[0][0], odd ? d[1][1] : d[1][0], odd ? d[2][1] : d[2][0]),
                     limb_value(odd ? d[0][3] : d[0][2], odd ? d[1][3] : d[1][2], odd ? d[2][3] : d[2][2]));
}
