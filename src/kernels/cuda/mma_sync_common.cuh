// Private to the mma.sync kernels (gemm_w8a8.cu, gemm_quant_groups.cu, gemm_small_m.cu, gemv_decode.cu,
// gemv_quant.cu, attention.cu / attention_decode.cu via attention_device.cuh): the PTX wrappers
// and bit tricks they share — cp.async, ldmatrix, mma.sync m16n8k32 s8, streaming 16-byte loads,
// int4 → int8 unpacking. Everything is __forceinline__: including it changes no generated code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perry::cuda::mma_sync {

// Two fp32 → packed bf16x2 (round to nearest even); `lo` lands in the low half (the lower address).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async global → shared copy; src_bytes = 0 writes 16 zero bytes (and reads nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// C += A·B, m16n8k32, s8 inputs, s32 accumulators.
__device__ __forceinline__ void mma_s8(int c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes from global memory, read-only, not allocated in L1 (weights streamed once).
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// (a ^ x) & m as one LOP3. Written in C, ptxas gives two instructions — a LOP3 takes one
// constant as an immediate, so the XOR and the AND with two constants split — while here the
// constants sit in registers (hoisted out of the loops that call it). The int4 decode GEMV's core
// and the register-A int4 conversion run it once a nibble half.
__device__ __forceinline__ uint32_t xor_and(uint32_t a, uint32_t x, uint32_t m) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x28;" : "=r"(d) : "r"(a), "r"(x), "r"(m));  // 0x28 = (0xF0 ^ 0xCC) & 0xAA
  return d;
}
// The two-level int4 conversion of the register-A wgmma kernels (gemm_w4a8_two_level_sm90.cu,
// gemm_small_m_sm90.cu; the trick is explained in the first). Two 32-bit words of a packed row
// chunk (wa: packed bytes 0-3 or 4-7 of the k32 step's 16; wb: bytes 8-11 or 12-15) → this
// thread's 8 int8 codes q·m: lo = k 4tq..4tq+3, hi = k 16+4tq..+3.
// sel picks the thread's two bytes of each word (tq even: bytes 0, 1; odd: 2, 3); cb =
// (128 − 8m)·0x01010101 mod 2^32, the row's group constant.
__device__ __forceinline__ void int4_times_m(uint32_t wa, uint32_t wb, uint32_t sel, uint32_t m, uint32_t cb,
                                             uint32_t& lo, uint32_t& hi) {
  // u = [wa.b, wa.b', wb.b, wb.b']: nibbles k0 k1 | k2 k3 | k16 k17 | k18 k19 (low nibble first).
  const uint32_t u = __byte_perm(wa, wb, sel);
  const uint32_t te = xor_and(u, 0x08080808u, 0x0F0F0F0Fu);       // t of k0 k2 k16 k18, a byte each
  const uint32_t to = xor_and(u >> 4, 0x08080808u, 0x0F0F0F0Fu);  // t of k1 k3 k17 k19
  // Byte i of t·m + cb is t_i·m − 8m + 128 = q_i·m + 128 in [0, 255]: the sum of the bytes'
  // values times 256^i is the integer the IMAD computes, with no carry into a neighbour.
  const uint32_t pe = te * m + cb, po = to * m + cb;
  lo = __byte_perm(pe, po, 0x5140) ^ 0x80808080u;  // k0 k1 k2 k3
  hi = __byte_perm(pe, po, 0x7362) ^ 0x80808080u;  // k16 k17 k18 k19
}

// (a & m) ^ x as one LOP3, for the same reason (w4a16 decode: a nibble under an fp16 exponent).
__device__ __forceinline__ uint32_t and_xor(uint32_t a, uint32_t m, uint32_t x) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(m), "r"(x));  // 0x6A = (0xF0 & 0xCC) ^ 0xAA
  return d;
}

// 8 packed int4 (k order: byte j = k 2j low nibble, 2j+1 high) → two words of 4 int8 in k order.
// Bytewise sign extension of a nibble n (byte value 0..15): ((n ^ 0x88) - 0x08) ^ 0x80 — the
// XOR sets bit 7 so the subtraction never borrows from the neighbouring byte.
__device__ __forceinline__ void int4_to_int8x8(uint32_t w, uint32_t& lo_word, uint32_t& hi_word) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // k 0,2,4,6 / k 1,3,5,7
  const uint32_t slo = ((lo ^ 0x88888888u) - 0x08080808u) ^ 0x80808080u;
  const uint32_t shi = ((hi ^ 0x88888888u) - 0x08080808u) ^ 0x80808080u;
  lo_word = __byte_perm(slo, shi, 0x5140);  // k0 k1 k2 k3
  hi_word = __byte_perm(slo, shi, 0x7362);  // k4 k5 k6 k7
}

// Weights as exact floats for the bf16-activation (weight-only) paths: a byte becomes the float
// 2^23 + byte through the exponent bits (one PRMT + one FADD per value instead of an I2F).
// Byte i of u (an unsigned value 0..255) as the float 8388608 + u (exact).
__device__ __forceinline__ float magic_byte(uint32_t u, int i) {
  return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 | i));
}
// 4 int8 of w (k order) → floats.
__device__ __forceinline__ void int8x4_to_f32(uint32_t w, float* f) {
  const uint32_t u = w ^ 0x80808080u;  // b + 128
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = magic_byte(u, i) - 8388736.0f;
}
// 8 int4 of w (k order) → floats.
__device__ __forceinline__ void int4x8_to_f32(uint32_t w, float* f) {
  const uint32_t t = w ^ 0x88888888u;  // each nibble v + 8
  const uint32_t lo = t & 0x0F0F0F0Fu, hi = (t >> 4) & 0x0F0F0F0Fu;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = magic_byte(lo, i) - 8388616.0f;
    f[2 * i + 1] = magic_byte(hi, i) - 8388616.0f;
  }
}

}  // namespace perry::cuda::mma_sync
