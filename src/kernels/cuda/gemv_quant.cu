// Quantized matrix-vector kernels for M = 1..8 rows (decode, small batches), every mode, and the
// weight-only dequantization to bf16.
//
// The weight matrix is the only large operand (x is M·K bytes, hot in L1), so the kernel is built
// to keep as many weight bytes in flight as possible: each warp owns R rows (R grows with M so
// that each x load is reused by more rows), each lane streams 16-byte chunks of those rows
// (L1::no_allocate: weights are read once and must not evict x), U chunks per row per iteration
// with R·U = 4, i.e. 64 bytes per lane issued before any arithmetic. Lane l takes chunks
// l, l+32, ... so a warp reads 512 contiguous bytes per row per step (fully coalesced).
// A 16-byte chunk holds 16 (int8) or 32 (int4) k values; group sizes are multiples of 32, so a
// chunk never straddles a group: one scale per chunk, folded once per chunk.
// Integer x (W*A8): dp4a on int8 words; int4 nibbles are sign-extended bytewise in registers and
// permuted into k order. bf16 x (W*A16): weights become floats exactly via the 2^23 magic
// (bits 0x4B0000uu = 8388608 + uu), one PRMT + one FADD per value instead of an I2F.
// Partial sums are reduced across the warp once per row at the end.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/mma_sync_common.cuh"

namespace perry::cuda {

QuantModeBits quant_mode_bits(QuantMode mode) {
  switch (mode) {
    case QuantMode::W8A8: return {8, 0, true, "w8a8"};
    case QuantMode::W8A8_G128: return {8, 128, true, "w8a8-g128"};
    case QuantMode::W8A8_G64: return {8, 64, true, "w8a8-g64"};
    case QuantMode::W4A8: return {4, 0, true, "w4a8"};
    case QuantMode::W4A8_G128: return {4, 128, true, "w4a8-g128"};
    case QuantMode::W8A16: return {8, 128, false, "w8a16"};
    case QuantMode::W4A16: return {4, 128, false, "w4a16"};
    default: throw Error("perry::cuda: quantized linear called with a float mode (not quantized)");
  }
}

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// Rows per warp and chunks per row per iteration for M activation rows (R·U = 4 chunks in flight
// per lane). More rows per warp at larger M: x traffic from L1 per weight byte is M·(1 or 2)/R.
// bf16 x: R = 2 throughout — the x conversion is then shared by two rows even at M = 1 (int4
// with bf16 x is ALU-bound near HBM speed), and R = 4 at M > 4 needed ~250 registers.
template <int M, bool kA16>
struct Cfg {
  static constexpr int R = kA16 ? 2 : (M <= 2 ? 1 : (M <= 4 ? 2 : 4));
  static constexpr int U = 4 / R;
};

using mma_sync::int4_to_int8x8;
using mma_sync::ld_stream16;
using mma_sync::int4x8_to_f32;
using mma_sync::int8x4_to_f32;
using mma_sync::word;

// 16 bytes p[off, off+16) of a buffer of len bytes, zero past len. The vector path is taken when
// the caller vouched (vec) that every in-bounds chunk start is 16-byte aligned and len % 16 == 0.
template <bool kStream>
__device__ __forceinline__ uint4 load16(const uint8_t* __restrict__ p, long long off,
                                        long long len, bool vec) {
  if (vec && off + 16 <= len) {
    if constexpr (kStream) return ld_stream16(p + off);
    else return __ldg(reinterpret_cast<const uint4*>(p + off));
  }
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (off + i < len) w[i / 4] |= uint32_t(__ldg(p + off + i)) << (8 * (i % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}


template <int kBits, bool kA16, bool kGrouped, int M>
__global__ void __launch_bounds__(kThreads)
    gemv_quant_kernel(const uint8_t* __restrict__ x, const float* __restrict__ sa,
                      const uint8_t* __restrict__ w, const float* __restrict__ sw,
                      const float* __restrict__ bias, float* __restrict__ y, int N, int K, int G,
                      int gs, bool vec) {
  constexpr int R = Cfg<M, kA16>::R, U = Cfg<M, kA16>::U;
  constexpr int kPerChunk = kBits == 8 ? 16 : 32;  // k values in one 16-byte weight chunk
  constexpr bool kIntAcc = !kA16 && !kGrouped;     // per-channel W*A8: exact int32 row sums
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kWarps + threadIdx.x / 32) * R;
  if (n0 >= N) return;  // whole warp: no shuffles are left for it
  const long long row_bytes = kBits == 8 ? (long long)K : (K + 1) / 2;
  const long long x_row = kA16 ? 2LL * K : (long long)K;
  const int nchunks = int((row_bytes + 15) / 16);

  // Rows past N read row N-1 (valid memory) and are never stored.
  const uint8_t* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = w + (long long)min(n0 + r, N - 1) * row_bytes;

  float facc[M][R];
  int iacc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      facc[m][r] = 0.0f;
      iacc[m][r] = 0;
    }

  for (int base = 0; base < nchunks; base += 32 * U) {
    uint4 wc[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int c = base + u * 32 + lane;
        wc[u][r] = c < nchunks ? load16<true>(wrow[r], 16LL * c, row_bytes, vec)
                               : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + u * 32 + lane;
      if (c >= nchunks) break;
      const int k0 = c * kPerChunk;
      float s[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        s[r] = kGrouped ? __ldg(sw + (long long)min(n0 + r, N - 1) * G + k0 / gs) : 0.0f;

      if constexpr (!kA16) {
        // Weight words in k order: 4 per chunk (int8) or 8 (int4 unpacked).
        constexpr int kWords = kPerChunk / 4;
        uint32_t ww[R][kWords];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (kBits == 8) {
#pragma unroll
            for (int i = 0; i < 4; ++i) ww[r][i] = word(wc[u][r], i);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) int4_to_int8x8(word(wc[u][r], i), ww[r][2 * i], ww[r][2 * i + 1]);
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          uint32_t xw[kWords];
#pragma unroll
          for (int h = 0; h < kWords / 4; ++h) {
            const uint4 xv = load16<false>(x + m * x_row, k0 + 16LL * h, x_row, vec);
#pragma unroll
            for (int i = 0; i < 4; ++i) xw[4 * h + i] = word(xv, i);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            int p = 0;
#pragma unroll
            for (int i = 0; i < kWords; ++i) p = __dp4a(int(ww[r][i]), int(xw[i]), p);
            if constexpr (kGrouped) facc[m][r] = fmaf(float(p), s[r], facc[m][r]);
            else iacc[m][r] += p;
          }
        }
      } else {
        // bf16 x: sub-chunks of 8 k (one 16-byte load of x per row m).
        float p[M][R];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < R; ++r) p[m][r] = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerChunk / 8; ++j) {
          float wf[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if constexpr (kBits == 8) {
              int8x4_to_f32(word(wc[u][r], 2 * j), wf[r]);
              int8x4_to_f32(word(wc[u][r], 2 * j + 1), wf[r] + 4);
            } else {
              int4x8_to_f32(word(wc[u][r], j), wf[r]);
            }
          }
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const uint4 xv = load16<false>(x + m * x_row, 2LL * k0 + 16 * j, x_row, vec);
            float xf[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const uint32_t b = word(xv, i);
              xf[2 * i] = __uint_as_float(b << 16);
              xf[2 * i + 1] = __uint_as_float(b & 0xFFFF0000u);
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int e = 0; e < 8; ++e) p[m][r] = fmaf(xf[e], wf[r][e], p[m][r]);
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < R; ++r) facc[m][r] = fmaf(p[m][r], s[r], facc[m][r]);
      }
    }
  }

  // Warp reduction (xor butterfly: every lane ends with the sums), then one lane per output.
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = n0 + r;
      if constexpr (kIntAcc) {
        int v = iacc[m][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == m * R + r && n < N) {
          const float fa = float(v) * __ldg(sw + n);
          y[(long long)m * N + n] = fmaf(fa, __ldg(sa + m), bias ? __ldg(bias + n) : 0.0f);
        }
      } else {
        float v = facc[m][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == m * R + r && n < N) {
          const float b = bias ? __ldg(bias + n) : 0.0f;
          y[(long long)m * N + n] = kA16 ? v + b : fmaf(v, __ldg(sa + m), b);
        }
      }
    }
}

struct GemvArgs {
  const uint8_t* x;
  const float* sa;
  const uint8_t* w;
  const float* sw;
  const float* bias;
  float* y;
  int N, K, G, gs;
  bool vec;
  cudaStream_t stream;
  const char* name;
};

template <int kBits, bool kA16, bool kGrouped, int M>
void launch_gemv(const GemvArgs& a) {
  constexpr int rows_per_block = kWarps * Cfg<M, kA16>::R;
  const unsigned blocks = unsigned((a.N + rows_per_block - 1) / rows_per_block);
  gemv_quant_kernel<kBits, kA16, kGrouped, M><<<blocks, kThreads, 0, a.stream>>>(
      a.x, a.sa, a.w, a.sw, a.bias, a.y, a.N, a.K, a.G, a.gs, a.vec);
  check_launch(a.name);
}

template <int kBits, bool kA16, bool kGrouped>
void dispatch_m(int M, const GemvArgs& a) {
  switch (M) {
    case 1: return launch_gemv<kBits, kA16, kGrouped, 1>(a);
    case 2: return launch_gemv<kBits, kA16, kGrouped, 2>(a);
    case 3: return launch_gemv<kBits, kA16, kGrouped, 3>(a);
    case 4: return launch_gemv<kBits, kA16, kGrouped, 4>(a);
    case 5: return launch_gemv<kBits, kA16, kGrouped, 5>(a);
    case 6: return launch_gemv<kBits, kA16, kGrouped, 6>(a);
    case 7: return launch_gemv<kBits, kA16, kGrouped, 7>(a);
    case 8: return launch_gemv<kBits, kA16, kGrouped, 8>(a);
    default: throw Error(std::string(a.name) + ": M out of range");
  }
}

using quant_args::aligned;

__global__ void dequant_bf16_kernel(const uint8_t* __restrict__ q, const float* __restrict__ sc,
                                    int bits, int gs, int G, int K, uint16_t* __restrict__ out) {
  // One block per row: no 64-bit division per element, coalesced 2-byte stores.
  const int n = blockIdx.x;
  const long long row_bytes = bits == 8 ? (long long)K : (K + 1) / 2;
  const uint8_t* qr = q + n * row_bytes;
  const float* sr = sc + (long long)n * G;
  uint16_t* o = out + (long long)n * K;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    int v;
    if (bits == 8) {
      v = int(int8_t(__ldg(qr + k)));
    } else {
      const uint8_t b = __ldg(qr + k / 2);
      const int nib = (k & 1) ? (b >> 4) : (b & 0xF);
      v = nib >= 8 ? nib - 16 : nib;
    }
    const float s = __ldg(sr + (gs > 0 ? k / gs : 0));
    o[k] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(float(v), s)));
  }
}

// The fast form (weight-only prefill dequantizes every call, so this pass is on the layer's
// critical path): one 16-byte load of codes a thread — 16 int8 or 32 int4 weights — and 16-byte
// stores of their bf16 values, grid-stride over the whole matrix. The scalar kernel above moved a
// byte and stored two a thread and reached ~1 TB/s (bench-op, H100, s41: 173 us of the 221 us
// w8a16 layer at 14336 x 4096, M 128). Same arithmetic, bit for bit: bf16_rn(float(q) * s).
// Needs K % 32 == 0, a group size that is 0 or a multiple of 32 (a chunk never straddles a
// group) and 16-byte aligned codes and output.
template <int kBits>
__global__ void dequant_bf16_vec_kernel(const uint4* __restrict__ q, const float* __restrict__ sc, int gs, int G,
                                        int K, long long chunks, uint4* __restrict__ out) {
  constexpr int kPer = kBits == 8 ? 16 : 32;  // weights a 16-byte chunk of codes
  const int chunks_per_row = K / kPer;
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < chunks;
       c += (long long)gridDim.x * blockDim.x) {
    const long long n = c / chunks_per_row;
    const int k0 = int(c - n * chunks_per_row) * kPer;
    const float s = __ldg(sc + n * G + (gs > 0 ? k0 / gs : 0));
    const uint4 w = __ldg(q + c);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    uint32_t o[kPer / 2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kBits == 8) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int lo = int(int8_t(words[i] >> (16 * j))), hi = int(int8_t(words[i] >> (16 * j + 8)));
          o[2 * i + j] = mma_sync::pack_bf16x2(__fmul_rn(float(lo), s), __fmul_rn(float(hi), s));
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // byte j: low nibble = the even k, high nibble the odd one
          const int b = int(words[i] >> (8 * j)) & 0xFF;
          const int lo = ((b & 0xF) ^ 8) - 8, hi = ((b >> 4) ^ 8) - 8;
          o[4 * i + j] = mma_sync::pack_bf16x2(__fmul_rn(float(lo), s), __fmul_rn(float(hi), s));
        }
      }
    }
    uint4* dst = out + c * (kPer / 8);
#pragma unroll
    for (int v = 0; v < kPer / 8; ++v) dst[v] = make_uint4(o[4 * v], o[4 * v + 1], o[4 * v + 2], o[4 * v + 3]);
  }
}

}  // namespace

void gemv_quant(QuantMode mode, const void* x, const float* sa, const void* qweight,
                const float* scales, const float* bias, float* y, int M, int N, int K,
                cudaStream_t stream) {
  const QuantModeBits mb = quant_mode_bits(mode);
  const std::string where = std::string("gemv_quant(") + mb.name + ", M=" + std::to_string(M) +
                            ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (M < 1 || M > kGemvQuantMaxM) throw Error(where + ": M must be in 1..8 (use gemm_quant)");
  quant_args::check_linear(where, mb, x, sa, qweight, scales, bias, y, N, K);
  const long long row_bytes = mb.bits == 8 ? (long long)K : (K + 1) / 2;
  const long long x_row = mb.a8 ? (long long)K : 2LL * K;
  GemvArgs a;
  a.x = static_cast<const uint8_t*>(x);
  a.sa = sa;
  a.w = static_cast<const uint8_t*>(qweight);
  a.sw = scales;
  a.bias = bias;
  a.y = y;
  a.N = N;
  a.K = K;
  a.gs = mb.group_size;
  a.G = mb.group_size > 0 ? (K + mb.group_size - 1) / mb.group_size : 1;
  a.vec = aligned(x, 16) && aligned(qweight, 16) && row_bytes % 16 == 0 && x_row % 16 == 0;
  a.stream = stream;
  // Static names for check_launch (it keeps the pointer only for the message).
  switch (mode) {
    case QuantMode::W8A8: a.name = "gemv_quant<w8a8>"; return dispatch_m<8, false, false>(M, a);
    case QuantMode::W8A8_G128: a.name = "gemv_quant<w8a8-g128>"; return dispatch_m<8, false, true>(M, a);
    case QuantMode::W8A8_G64: a.name = "gemv_quant<w8a8-g64>"; return dispatch_m<8, false, true>(M, a);
    case QuantMode::W4A8: a.name = "gemv_quant<w4a8>"; return dispatch_m<4, false, false>(M, a);
    case QuantMode::W4A8_G128: a.name = "gemv_quant<w4a8-g128>"; return dispatch_m<4, false, true>(M, a);
    case QuantMode::W8A16: a.name = "gemv_quant<w8a16>"; return dispatch_m<8, true, true>(M, a);
    case QuantMode::W4A16: a.name = "gemv_quant<w4a16>"; return dispatch_m<4, true, true>(M, a);
    default: throw Error(where + ": not a quantized mode");
  }
}

// expand_int4_weight (declared in gemv_quant.h) is in expand_int4.cu, beside its two-level form.

void dequantize_weight_bf16(const void* qweight, const float* scales, int bits, int group_size,
                            int N, int K, uint16_t* out_bf16, cudaStream_t stream) {
  const std::string where = "dequantize_weight_bf16(bits=" + std::to_string(bits) + ", group_size=" +
                            std::to_string(group_size) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (bits != 8 && bits != 4) throw Error(where + ": bits must be 8 or 4");
  if (group_size < 0) throw Error(where + ": group_size must be 0 (per channel) or positive");
  if (N < 1 || K < 1 || K > 65536) throw Error(where + ": need N >= 1 and 1 <= K <= 65536");
  if (!qweight || !scales || !out_bf16) throw Error(where + ": null pointer");
  if (!aligned(scales, 4) || !aligned(out_bf16, 2)) throw Error(where + ": misaligned pointer");
  const int G = group_size > 0 ? (K + group_size - 1) / group_size : 1;
  if (K % 32 == 0 && group_size % 32 == 0 && aligned(qweight, 16) && aligned(out_bf16, 16)) {
    const long long chunks = (long long)N * (K / (bits == 8 ? 16 : 32));
    const int threads = 256;
    static const long long max_blocks = 8LL * sm_count();  // (2048 threads an SM; the rest loop)
    const long long blocks = std::min<long long>((chunks + threads - 1) / threads, max_blocks);
    if (bits == 8)
      dequant_bf16_vec_kernel<8><<<unsigned(blocks), threads, 0, stream>>>(
          static_cast<const uint4*>(qweight), scales, group_size, G, K, chunks, static_cast<uint4*>(static_cast<void*>(out_bf16)));
    else
      dequant_bf16_vec_kernel<4><<<unsigned(blocks), threads, 0, stream>>>(
          static_cast<const uint4*>(qweight), scales, group_size, G, K, chunks, static_cast<uint4*>(static_cast<void*>(out_bf16)));
    check_launch("dequantize_weight_bf16 (16-byte chunks)");
    return;
  }
  const int threads = K >= 1024 ? 256 : 128;
  dequant_bf16_kernel<<<unsigned(N), threads, 0, stream>>>(
      static_cast<const uint8_t*>(qweight), scales, bits, group_size, G, K, out_bf16);
  check_launch("dequantize_weight_bf16");
}

}  // namespace perry::cuda
