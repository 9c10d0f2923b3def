// gemm_small_m / gemm_small_m_bf16 (declared in gemv_quant.h): weight-streaming linear layers for
// M = 1..64 activation rows (batched decode, short prompts) on tensor cores.
//
// Swapped operands: the WEIGHTS are the mma A operand (16 output channels × k) and the
// activations the B operand (k × 8 tokens), so M is padded to a multiple of 8 (not 16 or 128)
// and the weights go from global memory straight into A fragments, with no shared memory:
//   * int8 x (W*A8):   mma.sync m16n8k32 s8·s8 → s32 (int4 weights unpacked to int8 in registers);
//   * bf16 x (W*A16, bf16 weights): mma.sync m16n8k16 bf16·bf16 → f32 (int8/int4 weights become
//     bf16 exactly: |q| <= 127 has at most 8 significant bits).
// Each warp owns 16 output channels (rows g and g+8 of the fragment, g = lane / 4) and walks k in
// "k-blocks": lane t = lane % 4 of each row-quad loads the 16-byte chunk t of the block (64
// contiguous bytes per row per block). A dot product does not care in which order k is summed,
// only that A and B agree: lane (g, t) uses its 16 weight bytes as the fragment words of logical
// k {4t..4t+3, 16+4t..16+4t+3} (s8; {2t, 2t+1, 8+2t, 8+2t+1} for bf16) of consecutive mma steps,
// and loads the activations of the same actual k values (contiguous, 16-byte loads, L1-cached:
// all warps of the SM read the same x) for its B column g. Every mma step therefore covers
// actual k values that only depend on (t, step): A rows and B columns agree.
// Weights are read with ld.global.nc.L1::no_allocate, two k-blocks per iteration, double-buffered
// in registers (the next iteration's loads are issued before this iteration's mma).
// Group scales: a k-block never straddles a group (64 or 128 k per block, groups of 64 / 128), so
// the int32 (or fp32 for bf16 x) accumulators are folded with sw[n, g] after the last block of
// each group (per channel: once, at the end), exactly the math of gemv_quant.h.
// Split-K: when N/16 warps would not fill the GPU, blockIdx.y splits the k-blocks; y is zeroed
// first and every split adds its scaled partial with atomicAdd (split 0 adds the bias).
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemv_quant.h"
#include "kernels/cuda/quant_args.h"
#include "kernels/cuda/mma_sync_common.cuh"

namespace perry::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kU = 2;  // k-blocks per iteration (×2 rows ×2 buffers = 8 16-byte loads per lane)

// Weight/activation kinds: W8I/W4I int8 x per channel, *G grouped; W8H/W4H bf16 x (grouped);
// BF bf16 weights with bf16 x.
enum Kind { kW8I = 0, kW8IG, kW4I, kW4IG, kW8H, kW4H, kBF };

template <int kKind>
struct KT {
  static constexpr bool a16 = kKind >= kW8H;  // bf16 activations, bf16 mma
  static constexpr bool bits4 = kKind == kW4I || kKind == kW4IG || kKind == kW4H;
  static constexpr bool bf16w = kKind == kBF;
  static constexpr bool grouped = kKind == kW8IG || kKind == kW4IG || kKind == kW8H || kKind == kW4H;
  static constexpr bool int_pc = kKind == kW8I || kKind == kW4I;  // exact int32 over all K
  static constexpr int C = bf16w ? 8 : (bits4 ? 32 : 16);       // k per 16-byte weight chunk
  static constexpr int KB = 4 * C;                               // k per k-block
  static constexpr int XB = a16 ? 2 : 1;                         // bytes per x element
  static constexpr int XV = C * XB / 16;                         // 16-byte x loads per chunk
  static constexpr int WORDS = 4 * XV;                           // fragment words per chunk
  static constexpr int STEPS = WORDS / 2;                        // mma steps per chunk
};

using mma_sync::int4_to_int8x8;
using mma_sync::ld_stream16;
using mma_sync::pack_bf16x2;
using mma_sync::word;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 16-byte weight chunk (C consecutive k) → the fragment words of those k in k order:
// int8 (4 words of 4 int8), int4 → int8 (8 words), int8 → bf16 (8 words of 2), int4 → bf16 (16),
// bf16 (4 words of 2, as loaded).
template <int kKind>
__device__ __forceinline__ void weight_words(const uint4& c, uint32_t (&w)[KT<kKind>::WORDS]) {
  if constexpr (kKind == kW8I || kKind == kW8IG || kKind == kBF) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = word(c, i);
  } else if constexpr (kKind == kW4I || kKind == kW4IG) {
#pragma unroll
    for (int i = 0; i < 4; ++i) int4_to_int8x8(word(c, i), w[2 * i], w[2 * i + 1]);
  } else if constexpr (kKind == kW8H) {
    // Byte b + 128 as the float 2^23 + (b + 128) (exact), minus 2^23 + 128 → float(b) exactly.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t u = word(c, i) ^ 0x80808080u;
      float f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) f[j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 | j)) - 8388736.0f;
      w[2 * i] = pack_bf16x2(f[0], f[1]);
      w[2 * i + 1] = pack_bf16x2(f[2], f[3]);
    }
  } else {  // kW4H
    // Nibble n (two's complement) → n ^ 8 = v + 8 in 0..15; bf16 0x4300 | (v + 8) = 128 + v + 8
    // exactly (7 mantissa bits); subtracting 136 in bf16x2 leaves v exactly.
    const __nv_bfloat162 off = __floats2bfloat162_rn(136.0f, 136.0f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t tw = word(c, i) ^ 0x88888888u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t s = tw >> (8 * j);  // byte j: k 2j (low nibble), 2j+1 (high nibble)
        uint32_t v = (s & 0x0000000Fu) | ((s << 12) & 0x000F0000u) | 0x43004300u;
        __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&v);
        h = __hsub2(h, off);
        w[4 * i + j] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
  }
}

template <int kKind, int NT>
__global__ void __launch_bounds__(kThreads)
    gemm_small_m_kernel(const uint8_t* __restrict__ x, const float* __restrict__ sa,
                        const uint8_t* __restrict__ w, const float* __restrict__ sw,
                        const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K,
                        int G, int gs, int kb_per_split, bool atomic) {
  using T = KT<kKind>;
  using Acc = std::conditional_t<T::a16, float, int>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = (blockIdx.x * kWarps + threadIdx.x / 32) * 16;
  if (n0 >= N) return;  // whole warp
  const int nkb = (K + T::KB - 1) / T::KB;
  const int kb_begin = blockIdx.y * kb_per_split;
  const int kb_end = min(nkb, kb_begin + kb_per_split);
  if (kb_begin >= kb_end) return;
  const long long row_bytes = T::bits4 ? (long long)K / 2 : (long long)K * (T::bf16w ? 2 : 1);
  // Rows past N read row N-1 (valid memory) and are never stored.
  const int r0 = min(n0 + g, N - 1), r1 = min(n0 + g + 8, N - 1);
  const uint8_t* w0 = w + r0 * row_bytes + 16 * t;
  const uint8_t* w1 = w + r1 * row_bytes + 16 * t;

  Acc acc[NT][4];
  float facc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[i][e] = Acc(0);
      facc[i][e] = 0.0f;
    }

  // k-block b, lane t: bytes [64 b + 16 t, +16) of the row = k [(4b + t)·C, +C); K % C == 0, so
  // a chunk is entirely inside or outside the row.
  auto load = [&](uint4 (&buf)[kU][2], int kb) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int b = kb + u;
      const bool ok = b < kb_end && (4 * b + t) * T::C < K;
      buf[u][0] = ok ? ld_stream16(w0 + 64LL * b) : make_uint4(0, 0, 0, 0);
      buf[u][1] = ok ? ld_stream16(w1 + 64LL * b) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 cur[kU][2], nxt[kU][2];
  load(cur, kb_begin);
#pragma unroll
  for (int u = 0; u < kU; ++u) nxt[u][0] = nxt[u][1] = make_uint4(0, 0, 0, 0);

  for (int kb = kb_begin; kb < kb_end; kb += kU) {
    if (kb + kU < kb_end) load(nxt, kb + kU);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int b = kb + u;
      if (b >= kb_end) break;  // warp-uniform
      const int k0 = (4 * b + t) * T::C;
      const bool kok = k0 < K;
      float s0 = 0.0f, s1 = 0.0f;
      const bool fold = T::grouped && (((b + 1) * T::KB) % gs == 0 || b == kb_end - 1);
      if constexpr (T::grouped) {
        if (fold) {
          const int grp = b * T::KB / gs;
          s0 = __ldg(sw + (long long)r0 * G + grp);
          s1 = __ldg(sw + (long long)r1 * G + grp);
        }
      }
      uint32_t a0[T::WORDS], a1[T::WORDS];
      weight_words<kKind>(cur[u][0], a0);
      weight_words<kKind>(cur[u][1], a1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int m = nt * 8 + g;
        uint32_t xb[T::WORDS];
        if (kok && m < M) {
          const uint4* xp = reinterpret_cast<const uint4*>(x + ((long long)m * K + k0) * T::XB);
#pragma unroll
          for (int v = 0; v < T::XV; ++v) {
            const uint4 q = __ldg(xp + v);
            xb[4 * v] = q.x;
            xb[4 * v + 1] = q.y;
            xb[4 * v + 2] = q.z;
            xb[4 * v + 3] = q.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < T::WORDS; ++i) xb[i] = 0;
        }
#pragma unroll
        for (int s = 0; s < T::STEPS; ++s) {
          if constexpr (T::a16)
            mma_bf16(acc[nt], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
          else
            mma_s8(acc[nt], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
        }
      }
      if constexpr (T::grouped) {
        if (fold) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              facc[nt][e] = fmaf(float(acc[nt][e]), e < 2 ? s0 : s1, facc[nt][e]);
              acc[nt][e] = Acc(0);
            }
        }
      }
    }
    if constexpr (T::bf16w) {
      // Tensor-core fp32 accumulation truncates; moving the partial sum into a CUDA-core fp32
      // accumulator every few mma steps keeps the error at ~K/16 roundings of small partials.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          facc[nt][e] += float(acc[nt][e]);
          acc[nt][e] = Acc(0);
        }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      cur[u][0] = nxt[u][0];
      cur[u][1] = nxt[u][1];
    }
  }

  // Epilogue. Accumulator layout of m16n8: e = 0,1 at (row g, cols 2t, 2t+1), e = 2,3 at row
  // g+8; rows are output channels, columns tokens.
  const bool add_bias = bias != nullptr && blockIdx.y == 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int n = n0 + g + 8 * (e >> 1);
    if (n >= N) continue;
    const float bn = add_bias ? __ldg(bias + n) : 0.0f;
    float swn = 0.0f;
    if constexpr (T::int_pc) swn = __ldg(sw + n);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int m = nt * 8 + 2 * t + (e & 1);
      if (m >= M) continue;
      float v;
      if constexpr (T::int_pc) v = fmaf(float(acc[nt][e]) * swn, __ldg(sa + m), bn);
      else if constexpr (T::bf16w) v = facc[nt][e] + bn;
      else if constexpr (T::a16) v = facc[nt][e] + bn;
      else v = fmaf(facc[nt][e], __ldg(sa + m), bn);
      float* dst = y + (long long)m * N + n;
      if (atomic) atomicAdd(dst, v);
      else *dst = v;
    }
  }
}

// Simple bf16 fallback (any K, any alignment): one warp per output channel.
__global__ void __launch_bounds__(kThreads)
    gemm_small_m_bf16_fallback(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  if (n >= N) return;
  const uint16_t* wr = w + (long long)n * K;
  for (int m = 0; m < M; ++m) {
    const uint16_t* xr = x + (long long)m * K;
    float s = 0.0f;
    for (int k = lane; k < K; k += 32)
      s = fmaf(__uint_as_float(uint32_t(__ldg(xr + k)) << 16), __uint_as_float(uint32_t(__ldg(wr + k)) << 16), s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0) y[(long long)m * N + n] = s + (bias ? __ldg(bias + n) : 0.0f);
  }
}

using quant_args::aligned;

struct Args {
  const uint8_t* x;
  const float* sa;
  const uint8_t* w;
  const float* sw;
  const float* bias;
  float* y;
  int M, N, K, G, gs;
  cudaStream_t stream;
  const char* name;
};

template <int kKind, int NT>
void launch(const Args& a) {
  using T = KT<kKind>;
  const int tiles = (a.N + 15) / 16;
  const int blocks_n = (tiles + kWarps - 1) / kWarps;
  const int nkb = (a.K + T::KB - 1) / T::KB;
  // Split K until ~16 warps per SM stream weights, keeping >= 4 iterations per split and the
  // atomic traffic (splits · M · N · 4 bytes) under half the weight bytes.
  const long long weight_bytes = (long long)a.N * a.K * (T::bf16w ? 2 : 1) / (T::bits4 ? 2 : 1);
  const int target_warps = 16 * sm_count();
  int splits = tiles >= target_warps ? 1 : (target_warps + tiles - 1) / tiles;
  splits = std::min(splits, std::max(1, nkb / (4 * kU)));
  splits = (int)std::min<long long>(splits, std::max(1LL, weight_bytes / (8LL * a.M * a.N)));
  splits = std::max(1, std::min(splits, 65535));
  const int kb_per_split = (nkb + splits - 1) / splits;
  splits = (nkb + kb_per_split - 1) / kb_per_split;
  const bool atomic = splits > 1;
  if (atomic) check_cuda(cudaMemsetAsync(a.y, 0, sizeof(float) * a.M * a.N, a.stream), a.name);
  const dim3 grid{unsigned(blocks_n), unsigned(splits), 1u};
  gemm_small_m_kernel<kKind, NT><<<grid, kThreads, 0, a.stream>>>(
      a.x, a.sa, a.w, a.sw, a.bias, a.y, a.M, a.N, a.K, a.G, a.gs, kb_per_split, atomic);
  check_launch(a.name);
}

template <int kKind>
void dispatch_nt(const Args& a) {
  switch ((a.M + 7) / 8) {
    case 1: return launch<kKind, 1>(a);
    case 2: return launch<kKind, 2>(a);
    case 3: return launch<kKind, 3>(a);
    case 4: return launch<kKind, 4>(a);
    case 5:
    case 6: return launch<kKind, 6>(a);
    case 7:
    case 8: return launch<kKind, 8>(a);
    default: throw Error(std::string(a.name) + ": M out of range");
  }
}

}  // namespace

int gemm_small_m_k_multiple(QuantMode mode) { return quant_mode_bits(mode).bits == 4 ? 32 : 16; }

void gemm_small_m(QuantMode mode, const void* x, const float* sa, const void* qweight,
                  const float* scales, const float* bias, float* y, int M, int N, int K,
                  cudaStream_t stream) {
  const QuantModeBits mb = quant_mode_bits(mode);
  const std::string where = std::string("gemm_small_m(") + mb.name + ", M=" + std::to_string(M) +
                            ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")";
  if (M < 1 || M > kGemmSmallMMaxM) throw Error(where + ": M must be in 1..64");
  quant_args::check_linear(where, mb, x, sa, qweight, scales, bias, y, N, K);
  const bool fast = K % gemm_small_m_k_multiple(mode) == 0 && aligned(x, 16) && aligned(qweight, 16);
  if (!fast) {
    // The byte-wise-capable small-M kernel, 8 rows at a time.
    const size_t x_row = size_t(K) * (mb.a8 ? 1 : 2);
    for (int m0 = 0; m0 < M; m0 += kGemvQuantMaxM) {
      const int rows = std::min(kGemvQuantMaxM, M - m0);
      gemv_quant(mode, static_cast<const uint8_t*>(x) + m0 * x_row, sa ? sa + m0 : nullptr, qweight,
                 scales, bias, y + size_t(m0) * N, rows, N, K, stream);
    }
    return;
  }
  Args a;
  a.x = static_cast<const uint8_t*>(x);
  a.sa = sa;
  a.w = static_cast<const uint8_t*>(qweight);
  a.sw = scales;
  a.bias = bias;
  a.y = y;
  a.M = M;
  a.N = N;
  a.K = K;
  a.gs = mb.group_size;
  a.G = mb.group_size > 0 ? (K + mb.group_size - 1) / mb.group_size : 1;
  a.stream = stream;
  switch (mode) {
    case QuantMode::W8A8: a.name = "gemm_small_m<w8a8>"; return dispatch_nt<kW8I>(a);
    case QuantMode::W8A8_G128: a.name = "gemm_small_m<w8a8-g128>"; return dispatch_nt<kW8IG>(a);
    case QuantMode::W8A8_G64: a.name = "gemm_small_m<w8a8-g64>"; return dispatch_nt<kW8IG>(a);
    case QuantMode::W4A8: a.name = "gemm_small_m<w4a8>"; return dispatch_nt<kW4I>(a);
    case QuantMode::W4A8_G128: a.name = "gemm_small_m<w4a8-g128>"; return dispatch_nt<kW4IG>(a);
    case QuantMode::W8A16: a.name = "gemm_small_m<w8a16>"; return dispatch_nt<kW8H>(a);
    case QuantMode::W4A16: a.name = "gemm_small_m<w4a16>"; return dispatch_nt<kW4H>(a);
    default: throw Error(where + ": not a quantized mode");
  }
}

void gemm_small_m_bf16(const uint16_t* x, const uint16_t* w, const float* bias, float* y, int M,
                       int N, int K, cudaStream_t stream) {
  const std::string where = "gemm_small_m_bf16(M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                            ", K=" + std::to_string(K) + ")";
  if (M < 1 || M > kGemmSmallMMaxM) throw Error(where + ": M must be in 1..64");
  if (N < 1 || K < 1 || K > 65536) throw Error(where + ": need N >= 1 and 1 <= K <= 65536");
  if (!x || !w || !y) throw Error(where + ": null x, w or y");
  if (!aligned(x, 2) || !aligned(w, 2) || !aligned(y, 4) || (bias && !aligned(bias, 4)))
    throw Error(where + ": pointer not aligned to its element size");
  if (K % 8 != 0 || !aligned(x, 16) || !aligned(w, 16)) {
    gemm_small_m_bf16_fallback<<<unsigned((N + kWarps - 1) / kWarps), kThreads, 0, stream>>>(x, w, bias, y, M, N, K);
    check_launch("gemm_small_m_bf16_fallback");
    return;
  }
  Args a;
  a.x = reinterpret_cast<const uint8_t*>(x);
  a.sa = nullptr;
  a.w = reinterpret_cast<const uint8_t*>(w);
  a.sw = nullptr;
  a.bias = bias;
  a.y = y;
  a.M = M;
  a.N = N;
  a.K = K;
  a.G = 1;
  a.gs = 0;
  a.stream = stream;
  a.name = "gemm_small_m_bf16";
  dispatch_nt<kBF>(a);
}

}  // namespace perry::cuda
