// CUDA attention kernels (src/kernels/cuda/attention.h) against a float64 CPU reference computed
// from exactly the bf16 values the cache holds:
//  * kv_cache_append: the WHOLE cache compared bit-exactly with the host model (perry::f32_to_bf16
//    at the new positions, everything else untouched), including NaN / Inf / ties / denormals;
//  * attention_prefill: batches of sequences with different pos0 / n_new (tile-aligned and not),
//    slot != index, capacity > used, a gap row that belongs to no sequence (must stay NaN),
//    GQA ratios 1, 2, 4, 8, hd 16 / 20 / 32 / 256 (fp32 kernel) and 64 / 128 (tensor cores);
//  * attention_decode: contexts 1, 7, 1000, 5000 in one batch, and 64 sequences (chunk > 128);
//  * bad arguments throw perry::Error (runs without a GPU: validation precedes any CUDA call);
//  * Perf*: timings at llama3-8b shapes, printed (checked only for finiteness).
// Unused cache positions (other slots, positions >= pos0 + n_new) hold bf16 NaN: a kernel that
// reads past a sequence's context turns its output into NaN and fails the test.
//
// Tolerances (relative L2 error ‖out − ref‖ / ‖ref‖): fp32 paths 1e-4 (fp32 accumulation of
// hd-long dot products and ~5000-term softmax sums: ~1e-6 expected). Tensor-core path 1e-2: the
// reference uses the same bf16-rounded q (as the kernel does), but the kernel also rounds the
// softmax weights P to bf16 before P·V (relative error ≤ 2^-9 ≈ 2e-3 per weight, random in sign,
// so the output error is ~1e-3 relative); the observed error should be a few 1e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv_decode.h"

namespace pc = perry::cuda;
#include "cuda/cuda_test_util.h"

namespace {
using namespace perry::cuda::testing;
using pc::AttnSeq;

constexpr uint16_t kBf16NaN = 0x7fc0;  // poison of unused cache positions

struct Spec {
  int pos0, n_new;
};

struct Problem {
  int nh = 0, nkv = 0, hd = 0, capacity = 0, n_slots = 0, M = 0;
  std::vector<AttnSeq> seqs;
  std::vector<bool> row_used;       // [M]: false for gap rows
  std::vector<float> q, k, v;       // [M, nh*hd], [M, nkv*hd], [M, nkv*hd]
  std::vector<uint16_t> kc0, vc0;   // cache before the append (history + NaN)
  std::vector<uint16_t> kc, vc;     // expected cache after the append
  float scale = 0;
  int max_new = 0, max_ctx = 0;
};

size_t cache_index(const Problem& p, int slot, int kvh, int pos, int d) {
  return ((size_t(slot) * p.nkv + kvh) * p.capacity + pos) * p.hd + d;
}

// Sequences get rows in order with one gap row after the first sequence, and slots in reverse
// order (slot != index); everything random is fresh per problem.
Problem make_problem(const std::vector<Spec>& specs, int nh, int nkv, int hd, int capacity,
                     std::mt19937& gen) {
  Problem p;
  p.nh = nh, p.nkv = nkv, p.hd = hd, p.capacity = capacity;
  p.n_slots = int(specs.size()) + 2;
  p.scale = 1.0f / std::sqrt(float(hd));
  int row = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    AttnSeq s{row, specs[i].n_new, specs[i].pos0, p.n_slots - 1 - int(i)};
    p.seqs.push_back(s);
    row += s.n_new;
    for (int t = 0; t < s.n_new; ++t) p.row_used.push_back(true);
    if (i == 0) {
      p.row_used.push_back(false);  // gap row: nobody's token
      ++row;
    }
    p.max_new = std::max(p.max_new, s.n_new);
    p.max_ctx = std::max(p.max_ctx, s.pos0 + s.n_new);
  }
  p.M = row;
  p.q = rand_f(size_t(p.M) * nh * hd, gen, -2.f, 2.f);
  p.k = rand_f(size_t(p.M) * nkv * hd, gen, -2.f, 2.f);
  p.v = rand_f(size_t(p.M) * nkv * hd, gen, -2.f, 2.f);
  const size_t n_cache = size_t(p.n_slots) * nkv * capacity * hd;
  p.kc0.assign(n_cache, kBf16NaN);
  p.vc0.assign(n_cache, kBf16NaN);
  std::uniform_real_distribution<float> ud(-2.f, 2.f);
  for (const AttnSeq& s : p.seqs)
    for (int h = 0; h < nkv; ++h)
      for (int pos = 0; pos < s.pos0; ++pos)
        for (int d = 0; d < hd; ++d) {
          p.kc0[cache_index(p, s.slot, h, pos, d)] = perry::f32_to_bf16(ud(gen));
          p.vc0[cache_index(p, s.slot, h, pos, d)] = perry::f32_to_bf16(ud(gen));
        }
  p.kc = p.kc0;
  p.vc = p.vc0;
  for (const AttnSeq& s : p.seqs)
    for (int t = 0; t < s.n_new; ++t)
      for (int h = 0; h < nkv; ++h)
        for (int d = 0; d < hd; ++d) {
          const size_t src = size_t(s.q_row + t) * nkv * hd + size_t(h) * hd + d;
          p.kc[cache_index(p, s.slot, h, s.pos0 + t, d)] = perry::f32_to_bf16(p.k[src]);
          p.vc[cache_index(p, s.slot, h, s.pos0 + t, d)] = perry::f32_to_bf16(p.v[src]);
        }
  return p;
}

// Device copies of a problem; the cache is filled by kv_cache_append (checked bit-exactly).
struct DevProblem {
  Dev<float> q, k, v, out;
  Dev<AttnSeq> seqs;
  Dev<uint16_t> kc, vc;
  explicit DevProblem(const Problem& p)
      : q(p.q), k(p.k), v(p.v), out(size_t(p.M) * p.nh * p.hd), seqs(p.seqs), kc(p.kc0),
        vc(p.vc0) {}
};

void append_and_check(const Problem& p, DevProblem& d) {
  pc::kv_cache_append(d.k.p, d.v.p, d.seqs.p, int(p.seqs.size()), p.M, p.nkv, p.hd, p.capacity,
                      d.kc.p, d.vc.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> kc = d.kc.get(), vc = d.vc.get();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < kc.size(); ++i)
    if (kc[i] != p.kc[i] || vc[i] != p.vc[i]) {
      if (bad++ == 0) first = i;
    }
  EXPECT_EQ(bad, 0u) << "cache differs from the host model at " << bad << " elements, first at "
                     << first;
}

void poison(const Problem& p, Dev<float>& out) {
  std::vector<float> nan(size_t(p.M) * p.nh * p.hd, std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(cudaMemcpy(out.p, nan.data(), nan.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
}

// float64 reference of every used row; q rounded to bf16 first when round_q (tensor-core path).
std::vector<double> reference(const Problem& p, bool round_q) {
  const int G = p.nh / p.nkv, hd = p.hd;
  std::vector<double> ref(size_t(p.M) * p.nh * hd, 0.0), s, o(hd);
  for (const AttnSeq& sq : p.seqs)
    for (int t = 0; t < sq.n_new; ++t) {
      const int L = sq.pos0 + t + 1;
      s.resize(L);
      for (int h = 0; h < p.nh; ++h) {
        const float* qv = p.q.data() + size_t(sq.q_row + t) * p.nh * hd + size_t(h) * hd;
        std::vector<double> qd(hd);
        for (int d = 0; d < hd; ++d)
          qd[d] = round_q ? perry::bf16_to_f32(perry::f32_to_bf16(qv[d])) : qv[d];
        const uint16_t* K = p.kc.data() + cache_index(p, sq.slot, h / G, 0, 0);
        const uint16_t* V = p.vc.data() + cache_index(p, sq.slot, h / G, 0, 0);
        double mx = -INFINITY;
        for (int j = 0; j < L; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += qd[d] * perry::bf16_to_f32(K[size_t(j) * hd + d]);
          s[j] = dot * p.scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int j = 0; j < L; ++j) {
          const double e = std::exp(s[j] - mx);
          sum += e;
          for (int d = 0; d < hd; ++d) o[d] += e * perry::bf16_to_f32(V[size_t(j) * hd + d]);
        }
        double* r = ref.data() + size_t(sq.q_row + t) * p.nh * hd + size_t(h) * hd;
        for (int d = 0; d < hd; ++d) r[d] = o[d] / sum;
      }
    }
  return ref;
}

// Every used row written and finite, every gap row untouched (NaN); returns the relative L2 error.
double check_out(const Problem& p, const std::vector<float>& out, const std::vector<double>& ref) {
  const size_t W = size_t(p.nh) * p.hd;
  double num = 0, den = 0;
  size_t non_finite = 0, overwritten = 0;
  for (int r = 0; r < p.M; ++r)
    for (size_t c = 0; c < W; ++c) {
      const float x = out[size_t(r) * W + c];
      if (!p.row_used[r]) {
        overwritten += !std::isnan(x);
        continue;
      }
      if (!std::isfinite(x)) {
        ++non_finite;
        continue;
      }
      const double e = x - ref[size_t(r) * W + c];
      num += e * e;
      den += ref[size_t(r) * W + c] * ref[size_t(r) * W + c];
    }
  EXPECT_EQ(non_finite, 0u) << "outputs not written or not finite";
  EXPECT_EQ(overwritten, 0u) << "a row of no sequence was written";
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

// The largest relative L2 error of one used row: a fault confined to a few rows (one warp's
// masking, one block's edge) that the whole-output error would dilute.
double max_row_error(const Problem& p, const std::vector<float>& out, const std::vector<double>& ref) {
  const size_t W = size_t(p.nh) * p.hd;
  double worst = 0;
  for (int r = 0; r < p.M; ++r) {
    if (!p.row_used[r]) continue;
    double num = 0, den = 0;
    for (size_t c = 0; c < W; ++c) {
      const double e = out[size_t(r) * W + c] - ref[size_t(r) * W + c];
      num += e * e;
      den += ref[size_t(r) * W + c] * ref[size_t(r) * W + c];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0));
  }
  return worst;
}

struct Heads {
  int nh, nkv;
};

const char* kernel_label(pc::PrefillKernel k) {
  switch (k) {
    case pc::PrefillKernel::Rows64: return "rows64";
    case pc::PrefillKernel::Rows128: return "rows128";
    case pc::PrefillKernel::Wgmma: return "wgmma";
    default: return "fp32";
  }
}

const std::vector<pc::PrefillKernel> kTcKernels = {pc::PrefillKernel::Rows64, pc::PrefillKernel::Rows128};

// Every kernel the head dimension has: fp32 out against the float64 reference; then q read in
// place from a q|k|v-shaped buffer (row stride (nh + 2·nkv)·hd, the k / v columns NaN: a kernel
// reading past q's heads fails) with bf16 out, which must be exactly f32_to_bf16 of the fp32
// result, gap rows untouched.
void run_prefill_case(const std::vector<Spec>& specs, Heads hc, int hd, int capacity, std::mt19937& gen,
                      const std::vector<pc::PrefillKernel>& tc_kernels = kTcKernels) {
  SCOPED_TRACE("prefill nh=" + std::to_string(hc.nh) + " nkv=" + std::to_string(hc.nkv) +
               " hd=" + std::to_string(hd) + " kernel=" + pc::attention_prefill_kernel_name(hd));
  const Problem p = make_problem(specs, hc.nh, hc.nkv, hd, capacity, gen);
  DevProblem d(p);
  append_and_check(p, d);
  const bool tc = hd == 64 || hd == 128;
  const std::vector<double> ref = reference(p, tc);
  const size_t W = size_t(p.nh) * hd, stride = size_t(p.nh + 2 * p.nkv) * hd;
  std::vector<float> wide(size_t(p.M) * stride, std::numeric_limits<float>::quiet_NaN());
  for (int r = 0; r < p.M; ++r) std::copy_n(p.q.data() + r * W, W, wide.data() + r * stride);
  Dev<float> dwide(wide);
  constexpr uint16_t kUntouched = 0xFFFF;  // a NaN no conversion produces
  const std::vector<pc::PrefillKernel> kernels =
      tc ? tc_kernels : std::vector<pc::PrefillKernel>{pc::PrefillKernel::Auto};
  for (pc::PrefillKernel kern : kernels) {
    SCOPED_TRACE(kernel_label(kern));
    poison(p, d.out);
    pc::attention_prefill(d.q.p, d.seqs.p, int(p.seqs.size()), p.max_new, p.max_ctx, d.kc.p, d.vc.p,
                          p.nh, p.nkv, p.hd, p.capacity, p.scale, d.out.p, nullptr, kern);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> out = d.out.get();
    const double err = check_out(p, out, ref);
    EXPECT_LT(err, tc ? 1e-2 : 1e-4);
    std::printf("  prefill nh=%d nkv=%d hd=%d %s: rel L2 error %.3g\n", hc.nh, hc.nkv, hd, kernel_label(kern), err);
    if (kern == pc::PrefillKernel::Wgmma) {  // the wgmma kernel: every row on its own too
      const double row_err = max_row_error(p, out, ref);
      EXPECT_LT(row_err, 3e-2) << "worst row";
      std::printf("    worst row: rel L2 error %.3g\n", row_err);
    }

    // q read in place from rows of the q|k|v width (the fused projection's output).
    auto run_strided = [&](pc::PrefillIo io) {
      io.q_stride = int64_t(stride);
      pc::attention_prefill(io, d.seqs.p, int(p.seqs.size()), p.max_new, p.max_ctx, d.kc.p, d.vc.p, p.nh, p.nkv,
                            p.hd, p.capacity, p.scale, nullptr, kern);
      return cudaDeviceSynchronize();
    };
    Dev<uint16_t> ob(std::vector<uint16_t>(size_t(p.M) * W, kUntouched));
    pc::PrefillIo io;
    io.q = dwide.p;
    io.out_bf16 = ob.p;
    ASSERT_EQ(run_strided(io), cudaSuccess);
    const std::vector<uint16_t> bits = ob.get();
    size_t bad = 0;
    for (int r = 0; r < p.M; ++r)
      for (size_t c = 0; c < W; ++c) {
        const size_t i = size_t(r) * W + c;
        bad += bits[i] != (p.row_used[r] ? perry::f32_to_bf16(out[i]) : kUntouched);
      }
    EXPECT_EQ(bad, 0u) << "bf16 output (q read with stride " << stride << ") is not f32_to_bf16 of the fp32 output";

    // q given as bf16 (rope_append_qkv's bf16 form writes it so): the tensor-core kernels round an
    // fp32 q to bf16 on load, so the same bits out; the fp32 kernel computes with the bf16 values.
    std::vector<uint16_t> wide16(wide.size());
    for (size_t i = 0; i < wide.size(); ++i) wide16[i] = perry::f32_to_bf16(wide[i]);
    Dev<uint16_t> dwide16(wide16);
    Dev<float> o16(std::vector<float>(size_t(p.M) * W, std::numeric_limits<float>::quiet_NaN()));
    pc::PrefillIo io16;
    io16.q_bf16 = dwide16.p;
    io16.out = o16.p;
    ASSERT_EQ(run_strided(io16), cudaSuccess);
    const std::vector<float> out16 = o16.get();
    if (tc) {
      size_t differ = 0;
      for (int r = 0; r < p.M; ++r)
        if (p.row_used[r])
          for (size_t c = 0; c < W; ++c) differ += std::memcmp(&out16[size_t(r) * W + c], &out[size_t(r) * W + c], 4) != 0;
      EXPECT_EQ(differ, 0u) << "bf16 q gives other bits than fp32 q";
    } else {
      EXPECT_LT(check_out(p, out16, ref), 1e-2) << "bf16 q";
    }
  }
}

void run_decode_case(const std::vector<int>& ctxs, Heads hc, int hd, int capacity,
                     std::mt19937& gen) {
  SCOPED_TRACE("decode nh=" + std::to_string(hc.nh) + " nkv=" + std::to_string(hc.nkv) +
               " hd=" + std::to_string(hd));
  std::vector<Spec> specs;
  for (int c : ctxs) specs.push_back({c - 1, 1});
  const Problem p = make_problem(specs, hc.nh, hc.nkv, hd, capacity, gen);
  DevProblem d(p);
  append_and_check(p, d);
  const int n = int(p.seqs.size());
  const size_t ws_bytes = pc::attention_decode_workspace_bytes(n, p.nh, p.hd, p.max_ctx);
  Dev<float> ws((ws_bytes + 3) / 4);
  // Twice: the second call reuses a dirty workspace (it must not depend on its contents).
  for (int rep = 0; rep < 2; ++rep) {
    poison(p, d.out);
    pc::attention_decode(d.q.p, d.seqs.p, n, p.max_ctx, d.kc.p, d.vc.p, p.nh, p.nkv, p.hd,
                         p.capacity, p.scale, d.out.p, ws.p, ws_bytes, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double err = check_out(p, d.out.get(), reference(p, false));
    EXPECT_LT(err, 1e-4);
    if (rep == 0)
      std::printf("  decode n=%d nh=%d nkv=%d hd=%d chunk=%d: rel L2 error %.3g\n", n, hc.nh,
                  hc.nkv, hd, pc::attention_decode_chunk(n, p.max_ctx), err);
  }
}

// One 8192-token prompt at Llama-3-8B heads (32 q, 8 kv, hd 128): each kernel's time (after one
// warm-up, mean of 5) and TFLOP/s printed; `out` keeps the last kernel's output.
void time_prefill_8192(const std::vector<pc::PrefillKernel>& kernels, std::mt19937& gen, Dev<float>& out) {
  const int nh = 32, nkv = 8, hd = 128, T = 8192, cap = 8192;
  const float scale = 1.0f / std::sqrt(float(hd));
  Dev<float> q(rand_f(size_t(T) * nh * hd, gen, -2.f, 2.f));
  Dev<float> kv(rand_f(size_t(T) * nkv * hd, gen, -2.f, 2.f));
  Dev<uint16_t> kc(size_t(nkv) * cap * hd), vc(size_t(nkv) * cap * hd);
  Dev<AttnSeq> seqs(std::vector<AttnSeq>{{0, T, 0, 0}});
  pc::kv_cache_append(kv.p, kv.p, seqs.p, 1, T, nkv, hd, cap, kc.p, vc.p, nullptr);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  for (pc::PrefillKernel kern : kernels) {
    pc::attention_prefill(q.p, seqs.p, 1, T, T, kc.p, vc.p, nh, nkv, hd, cap, scale, out.p, nullptr, kern);
    const int reps = 5;
    cudaEventRecord(e0);
    for (int r = 0; r < reps; ++r)
      pc::attention_prefill(q.p, seqs.p, 1, T, T, kc.p, vc.p, nh, nkv, hd, cap, scale, out.p, nullptr, kern);
    cudaEventRecord(e1);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= reps;
    const double flops = 4.0 * hd * nh * (double(T) * (T + 1) / 2);  // QKᵀ + PV, causal
    std::printf("  prefill T=%d nh=%d nkv=%d hd=%d %s: %.3f ms, %.1f TFLOP/s\n", T, nh, nkv, hd, kernel_label(kern), ms,
                flops / (ms * 1e-3) / 1e12);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

TEST(CudaAttention, AppendRoundsLikeHostBitExact) {
  REQUIRE_GPU();
  std::mt19937 gen(11);
  Problem p = make_problem({{3, 5}, {0, 2}, {7, 9}}, 4, 2, 24, 20, gen);
  // Special values at known places of the new rows; recompute the expected cache afterwards.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            std::numeric_limits<float>::max(),
                            1.00390625f /* tie: rounds down to even 1.0 */,
                            1.01171875f /* tie: rounds up to even */,
                            -1.00390625f};
  uint32_t snan_bits = 0x7f800001u;  // signalling NaN with a low payload: must stay a NaN
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  size_t i = 0;
  for (float x : specials) {
    p.k[i * 7] = x;
    p.v[i * 5 + 1] = x;
    ++i;
  }
  p.k[1] = snan;
  p.v[2] = snan;
  p.kc = p.kc0;
  p.vc = p.vc0;
  for (const AttnSeq& s : p.seqs)
    for (int t = 0; t < s.n_new; ++t)
      for (int h = 0; h < p.nkv; ++h)
        for (int d = 0; d < p.hd; ++d) {
          const size_t src = size_t(s.q_row + t) * p.nkv * p.hd + size_t(h) * p.hd + d;
          p.kc[cache_index(p, s.slot, h, s.pos0 + t, d)] = perry::f32_to_bf16(p.k[src]);
          p.vc[cache_index(p, s.slot, h, s.pos0 + t, d)] = perry::f32_to_bf16(p.v[src]);
        }
  DevProblem d(p);
  append_and_check(p, d);
}

TEST(CudaAttention, PrefillBatchedMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 gen(1234);
  // Unaligned and tile-aligned n_new / pos0, a single token, a long history with few new tokens.
  const std::vector<Spec> specs = {{0, 37}, {100, 1}, {5, 130}, {1000, 3}, {64, 64}, {0, 1}};
  for (int hd : {16, 20, 32, 64, 128, 256})
    for (Heads hc : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}})
      run_prefill_case(specs, hc, hd, 1100, gen);
}

TEST(CudaAttention, PrefillLongTensorCore) {
  REQUIRE_GPU();
  std::mt19937 gen(99);
  // Many 64×64 tiles per block: exercises the cp.async double buffer and masking far from key 0.
  for (int hd : {64, 128}) run_prefill_case({{0, 700}, {300, 333}}, Heads{8, 2}, hd, 1100, gen);
}

TEST(CudaAttention, DecodeMixedContexts) {
  REQUIRE_GPU();
  std::mt19937 gen(4321);
  for (int hd : {16, 20, 32, 64, 128, 256})
    for (Heads hc : {Heads{4, 4}, Heads{8, 2}, Heads{32, 1}})
      run_decode_case({1, 7, 1000, 5000}, hc, hd, 5003, gen);
}

// Short contexts, the decode step's case: a few 64-key chunks — including one chunk and chunks
// wholly past a short sequence's context (max_ctx is the batch's longest) — in every head layout.
TEST(CudaAttention, DecodeShortContexts) {
  REQUIRE_GPU();
  std::mt19937 gen(2468);
  ASSERT_EQ(pc::attention_decode_chunk(6, 512), 64);  // 8 chunks of 64 at 512 keys
  for (int hd : {20, 64, 128})
    for (Heads hc : {Heads{4, 4}, Heads{8, 2}, Heads{32, 8}, Heads{32, 1}}) {
      run_decode_case({1, 7, 64, 65, 300, 512}, hc, hd, 600, gen);
      run_decode_case({5}, hc, hd, 600, gen);      // one chunk
      run_decode_case({1, 190}, hc, hd, 600, gen);  // 3 chunks, 2 empty for the first sequence
    }
}

// attention_decode's contract with the kernel before it (programmatic dependent launch): that
// kernel may append the newest row while the partial kernel already copies the older ones. The
// newest row starts as NaN (the problem's poison), so a copy of it taken too early shows. Two
// producers, each followed by attention_decode with no sync between, for one sequence (the decode
// step's case) with the newest row alone, inside, first and last in its chunk's first tile, and
// in a later chunk:
//   - rope_append_qkv (identity RoPE — cos 1, sin 0 — so q and k are the problem's own);
//   - the decode step's own producer, gemv_decode's RopeKv form (bf16 weights, K 4096): it lets
//     attention launch right after its wait and appends the row only in its epilogue, microseconds
//     later, while attention's blocks (which fit beside a GEMV block) are already copying. Its q and
//     row are read back afterwards and the reference computed from them.
TEST(CudaAttention, DecodeRightAfterTheAppend) {
  REQUIRE_GPU();
  std::mt19937 gen(1202);
  const Heads hc{32, 8};
  const int cap = 1024, K = 4096;
  Dev<float> dx(rand_f(size_t(K), gen, -1.f, 1.f)), dnw(rand_f(size_t(K), gen, 0.5f, 1.5f));
  for (int hd : {64, 128}) {
    std::vector<float> cosv(size_t(cap) * hd / 2, 1.0f), sinv(cosv.size(), 0.0f);
    const pc::DeviceRopeTable rope(cosv.data(), sinv.data(), hd, cap);
    const int Q = hc.nh * hd, KV = hc.nkv * hd, stride = Q + 2 * KV;
    std::vector<uint16_t> wb(size_t(stride) * K);
    for (auto& e : wb) e = perry::f32_to_bf16(std::uniform_real_distribution<float>(-0.02f, 0.02f)(gen));
    Dev<uint16_t> dw(wb);
    for (bool gemv : {false, true})
      for (int ctx : {1, 5, 64, 65, 150, 1000}) {
        SCOPED_TRACE(std::string(gemv ? "gemv_decode" : "rope_append_qkv") + " hd " + std::to_string(hd) + " ctx " +
                     std::to_string(ctx));
        Problem p = make_problem({{ctx - 1, 1}}, hc.nh, hc.nkv, hd, cap, gen);
        DevProblem d(p);  // the cache without the new row (NaN there)
        std::vector<float> qkv(static_cast<size_t>(stride));  // row 0, the sequence's token
        std::copy(p.q.begin(), p.q.begin() + Q, qkv.begin());
        std::copy(p.k.begin(), p.k.begin() + KV, qkv.begin() + Q);
        std::copy(p.v.begin(), p.v.begin() + KV, qkv.begin() + Q + KV);
        Dev<float> dqkv(qkv);
        const size_t ws_bytes = pc::attention_decode_workspace_bytes(1, p.nh, hd, p.max_ctx);
        Dev<float> ws((ws_bytes + 3) / 4);
        poison(p, d.out);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (gemv) {
          const pc::DecodeLinearArgs a{
              .x = dx.p, .in = pc::DecodeIn::RmsNorm, .norm_w = dnw.p, .eps = 1e-5f, .y = dqkv.p,
              .out = pc::DecodeOut::RopeKv,
              .rope_kv = pc::DecodeRopeKv{d.seqs.p, rope.view(), p.nh, p.nkv, hd, cap, d.kc.p, d.vc.p}};
          ASSERT_NO_THROW(pc::gemv_decode(pc::DecodeWeights{perry::quant::QuantMode::BF16, dw.p, nullptr, nullptr,
                                                            stride, K},
                                          a, nullptr));
        } else {
          pc::rope_append_qkv(dqkv.p, stride, d.seqs.p, 1, 1, p.nh, p.nkv, hd, nullptr, nullptr, 1e-6f, rope.view(),
                              cap, d.kc.p, d.vc.p, nullptr);
        }
        pc::attention_decode(dqkv.p, d.seqs.p, 1, p.max_ctx, d.kc.p, d.vc.p, p.nh, p.nkv, hd, cap, p.scale, d.out.p,
                             ws.p, ws_bytes, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<uint16_t> kc = d.kc.get(), vc = d.vc.get();
        if (gemv) {  // the reference from what the GEMV wrote: its q and the row it appended
          const std::vector<float> y = dqkv.get();
          std::copy(y.begin(), y.begin() + Q, p.q.begin());
          p.kc = kc;
          p.vc = vc;
        }
        size_t bad = 0, appended = 0;
        for (int h = 0; h < p.nkv; ++h)
          for (int pos = 0; pos < cap; ++pos)
            for (int e = 0; e < hd; ++e) {
              const size_t i = cache_index(p, p.seqs[0].slot, h, pos, e);
              // Old rows untouched, and the new row written (not the NaN poison) — also in the
              // GEMV case, where p.kc / p.vc are the read-back.
              bad += pos != ctx - 1 ? (kc[i] != p.kc0[i]) + (vc[i] != p.vc0[i])
                                    : (kc[i] == kBf16NaN) + (vc[i] == kBf16NaN) + (kc[i] != p.kc[i]) + (vc[i] != p.vc[i]);
              appended += pos == ctx - 1;
            }
        EXPECT_EQ(bad, 0u) << "cache bytes not as expected";
        EXPECT_EQ(appended, size_t(p.nkv) * hd);
        if (!gemv) {
          EXPECT_EQ(kc == p.kc, true) << "the appended k row is not the problem's";
          EXPECT_EQ(vc == p.vc, true) << "the appended v row is not the problem's";
        }
        EXPECT_LT(check_out(p, d.out.get(), reference(p, false)), 1e-4);
      }
  }
}

TEST(CudaAttention, DecodeManySequences) {
  REQUIRE_GPU();
  std::mt19937 gen(77);
  std::uniform_int_distribution<int> ctx(1, 4000);
  std::vector<int> ctxs(64);
  for (int& c : ctxs) c = ctx(gen);
  ctxs[10] = 4000;
  ctxs[20] = 1;
  ASSERT_GT(pc::attention_decode_chunk(64, 4000), 128);  // multi-tile chunks
  run_decode_case(ctxs, Heads{8, 2}, 64, 4001, gen);
  run_decode_case(ctxs, Heads{32, 8}, 128, 4001, gen);
}

TEST(CudaAttention, DecodeWorkspaceBoundIsMonotone) {
  // The caller allocates once for the largest batch: every smaller call must fit.
  for (int n : {1, 2, 7, 64, 300})
    for (int ctx : {1, 100, 128, 129, 5000, 100000}) {
      const int chunk = pc::attention_decode_chunk(n, ctx);
      const size_t need = size_t(n) * 32 * ((ctx + chunk - 1) / chunk) * (128 + 2) * 4;
      EXPECT_GE(pc::attention_decode_workspace_bytes(n, 32, 128, ctx), need) << n << " " << ctx;
      EXPECT_GE(pc::attention_decode_workspace_bytes(n + 1, 32, 128, ctx),
                pc::attention_decode_workspace_bytes(n, 32, 128, ctx));
      EXPECT_GE(pc::attention_decode_workspace_bytes(n, 32, 128, ctx + 1),
                pc::attention_decode_workspace_bytes(n, 32, 128, ctx));
    }
}

TEST(CudaAttention, BadArgumentsThrow) {
  // Fake (never dereferenced) device pointers: argument checks run before anything touches CUDA.
  auto* f = reinterpret_cast<float*>(uintptr_t(1) << 20);
  auto* c = reinterpret_cast<uint16_t*>(uintptr_t(1) << 21);
  auto* s = reinterpret_cast<AttnSeq*>(uintptr_t(1) << 22);
  EXPECT_THROW(pc::attention_prefill(f, s, 1, 4, 4, c, c, 8, 8, 300, 16, 0.1f, f, nullptr),
               perry::Error);  // hd > 256
  EXPECT_THROW(pc::attention_prefill(f, s, 1, 4, 4, c, c, 6, 4, 64, 16, 0.1f, f, nullptr),
               perry::Error);  // nkv does not divide nh
  EXPECT_THROW(pc::attention_prefill(f, s, 1, 4, 4, c + 1, c, 8, 8, 64, 16, 0.1f, f, nullptr),
               perry::Error);  // misaligned cache
  EXPECT_THROW(pc::attention_prefill(f, s, 1, 4, 4, c, c, 8, 8, 64, 16, 0.f, f, nullptr),
               perry::Error);  // scale must be positive
  EXPECT_THROW(pc::attention_prefill(f + 1, s, 1, 4, 4, c, c, 8, 8, 64, 16, 0.1f, f, nullptr,
                                     pc::PrefillKernel::Rows128),
               perry::Error);  // q not 16-byte aligned for the tensor-core kernels
  {
    pc::PrefillIo io;
    io.q = f;
    io.out = f;
    io.out_bf16 = c;
    EXPECT_THROW(pc::attention_prefill(io, s, 1, 4, 4, c, c, 8, 8, 64, 16, 0.1f, nullptr), perry::Error);  // two outs
    io.out_bf16 = nullptr;
    io.q_stride = 8 * 64 - 1;
    EXPECT_THROW(pc::attention_prefill(io, s, 1, 4, 4, c, c, 8, 8, 64, 16, 0.1f, nullptr), perry::Error);  // stride
  }
  EXPECT_THROW(pc::attention_decode(f, s, 1, 4, c, c, 8, 8, 300, 16, 0.1f, f, f, 1 << 20, nullptr),
               perry::Error);  // hd > 256
  EXPECT_THROW(pc::attention_decode(f, s, 1, 4, c, c, 6, 4, 64, 16, 0.1f, f, f, 1 << 20, nullptr),
               perry::Error);  // nkv does not divide nh
  EXPECT_THROW(pc::attention_decode(f, s, 1, 4, c, c, 8, 8, 64, 16, 0.1f, f, f, 16, nullptr),
               perry::Error);  // workspace too small
  EXPECT_THROW(pc::kv_cache_append(f, f, s, 1, 4, 8, 0, 16, c, c, nullptr), perry::Error);  // hd 0
  EXPECT_THROW(pc::kv_cache_append(f, f, s, 1, 4, 8, 257, 16, c, c, nullptr), perry::Error);
}

// Timings at llama3-8b shapes (nh 32, nkv 8, hd 128). Printed for the record; only finiteness is
// checked here (correctness is covered above).
TEST(CudaAttention, PerfLlama8bShapes) {
  REQUIRE_GPU();
  const int nh = 32, nkv = 8, hd = 128;
  const float scale = 1.0f / std::sqrt(float(hd));
  std::mt19937 gen(5);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  {  // prefill: one 8192-token prompt
    Dev<float> out(size_t(8192) * nh * hd);
    time_prefill_8192(kTcKernels, gen, out);
    const std::vector<float> o = out.get();
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); }));
  }
  {  // decode: 32 sequences × 8192 context
    const int n = 32, ctx = 8192, cap = 8192;
    Dev<float> q(rand_f(size_t(n) * nh * hd, gen, -2.f, 2.f)), out(size_t(n) * nh * hd);
    std::vector<uint16_t> hc(size_t(n) * nkv * cap * hd);
    for (size_t i = 0; i < hc.size(); ++i) hc[i] = perry::f32_to_bf16(float(int(i % 61) - 30) / 16);
    Dev<uint16_t> kc(hc), vc(hc);
    std::vector<AttnSeq> hs;
    for (int i = 0; i < n; ++i) hs.push_back({i, 1, ctx - 1, i});
    Dev<AttnSeq> seqs(hs);
    const size_t wsb = pc::attention_decode_workspace_bytes(n, nh, hd, ctx);
    Dev<float> ws(wsb / 4 + 1);
    pc::attention_decode(q.p, seqs.p, n, ctx, kc.p, vc.p, nh, nkv, hd, cap, scale, out.p, ws.p,
                         wsb, nullptr);
    const int reps = 10;
    cudaEventRecord(e0);
    for (int r = 0; r < reps; ++r)
      pc::attention_decode(q.p, seqs.p, n, ctx, kc.p, vc.p, nh, nkv, hd, cap, scale, out.p, ws.p,
                           wsb, nullptr);
    cudaEventRecord(e1);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= reps;
    const double bytes = 2.0 * n * nkv * double(ctx) * hd * 2;
    std::printf("  decode n=%d ctx=%d nh=%d nkv=%d hd=%d: %.3f ms, %.0f GB/s of KV cache\n", n, ctx,
                nh, nkv, hd, ms, bytes / (ms * 1e-3) / 1e9);
    const std::vector<float> o = out.get();
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); }));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// The wgmma prefill kernel (hd 128, sm_90; Auto's choice there for long prompts), last in this
// program so that a fault in it cannot take the other tests down: every hd-128 prefill case above
// against float64 (fp32 out; strided q + bf16 out bit-equal to f32_to_bf16 of it), then its time
// at the Llama-3-8B shape next to the 128-row mma.sync kernel's.
TEST(CudaAttention, PrefillWgmma) {
  REQUIRE_GPU();
  if (!pc::attention_prefill_wgmma_supported(128)) GTEST_SKIP() << "the wgmma kernel needs an sm_90 device";
  const std::vector<pc::PrefillKernel> wg = {pc::PrefillKernel::Wgmma};
  std::mt19937 gen(4321);
  const std::vector<Spec> specs = {{0, 37}, {100, 1}, {5, 130}, {1000, 3}, {64, 64}, {0, 1}};
  for (Heads hc : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}}) run_prefill_case(specs, hc, 128, 1100, gen, wg);
  run_prefill_case({{0, 700}, {300, 333}}, Heads{8, 2}, 128, 1100, gen, wg);
  ASSERT_FALSE(::testing::Test::HasFailure()) << "not timing a kernel that fails its checks";

  Dev<float> out(size_t(8192) * 32 * 128);
  time_prefill_8192({pc::PrefillKernel::Rows128, pc::PrefillKernel::Wgmma}, gen, out);
}
