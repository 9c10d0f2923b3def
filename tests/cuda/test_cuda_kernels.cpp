// CUDA W8A8 kernels against the CPU oracles: quantize_per_token byte- and bit-exact against
// perry::quant::quantize_row_ref (the rule every backend follows), gemm_w8a8 int32 output exact
// against an int64 dot product, fused bf16/fp32 epilogues against float64, unaligned M/N/K.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemm_w8a8.h"
#include "quant/quant.h"
#include "cuda_test_util.h"

namespace pc = perry::cuda;
using perry::DType;

namespace {
using namespace perry::cuda::testing;

std::vector<float> activations(int M, int K, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(g);
  for (int m = 0; m < M; ++m) x[size_t(m) * K + (m * 13) % K] *= 50.f;  // outliers
  if (M > 1) std::fill(x.begin() + K, x.begin() + 2 * K, 0.f);          // scale 0 row
  if (M > 2) x[size_t(2) * K] = NAN;
  if (M > 3) x[size_t(3) * K + K - 1] = -INFINITY;
  if (M > 4)
    for (int k = 0; k < K; ++k) x[size_t(4) * K + k] = 1e-41f * float(k % 3 - 1);  // denormals
  if (M > 5) {  // ties: amax 127 → x*inv == x, so .5 values must round half to even
    for (int k = 0; k < K; ++k) x[size_t(5) * K + k] = float(k % 9 - 4) + 0.5f;
    x[size_t(5) * K] = -127.f;
  }
  return x;
}

void expect_quantize_matches_cpu(const std::vector<float>& x, int M, int K, DType in) {
  std::vector<int8_t> q_ref(x.size());
  std::vector<float> s_ref(M);
  for (int m = 0; m < M; ++m)
    s_ref[m] = perry::quant::quantize_row_ref(&x[size_t(m) * K], K, &q_ref[size_t(m) * K]);
  Dev<int8_t> dq(x.size());
  Dev<float> ds(M);
  if (in == DType::F32) {
    Dev<float> dx(x);
    pc::quantize_per_token(dx.p, in, M, K, dq.p, ds.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = perry::f32_to_bf16(x[i]);
    Dev<uint16_t> dx(xb);
    pc::quantize_per_token(dx.p, in, M, K, dq.p, ds.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  auto q = dq.get();
  auto s = ds.get();
  size_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) bad += q[i] != q_ref[i];
  EXPECT_EQ(bad, 0u) << "M=" << M << " K=" << K;
  for (int m = 0; m < M; ++m)
    EXPECT_EQ(std::memcmp(&s[m], &s_ref[m], 4), 0) << "row " << m << ": gpu " << s[m] << " cpu " << s_ref[m];
}

TEST(CudaQuantize, F32MatchesCpuRuleExactly) {
  REQUIRE_GPU();
  std::mt19937 g(1);
  for (auto [M, K] : {std::pair{1, 16}, {7, 100}, {8, 4096}, {33, 2560}, {3, 4100}}) {
    auto x = activations(M, K, g);
    expect_quantize_matches_cpu(x, M, K, DType::F32);
  }
}

TEST(CudaQuantize, Bf16MatchesCpuRuleExactly) {
  REQUIRE_GPU();
  std::mt19937 g(2);
  for (auto [M, K] : {std::pair{1, 16}, {7, 100}, {8, 4096}, {33, 2560}, {3, 4100}}) {
    auto x = activations(M, K, g);
    for (auto& v : x) v = perry::bf16_to_f32(perry::f32_to_bf16(v));  // what the kernel sees
    expect_quantize_matches_cpu(x, M, K, DType::BF16);
  }
}

using GemmFn = void (*)(const int8_t*, const float*, const int8_t*, const float*, const float*, void*, DType,
                       int, int, int, cudaStream_t);

void check_gemm(int M, int N, int K, std::mt19937& g, GemmFn gemm = pc::gemm_w8a8) {
  SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
  auto sa = rand_f(M, g, 1e-3f, 2e-2f), sw = rand_f(N, g, 1e-3f, 2e-2f), bias = rand_f(N, g, -2.f, 2.f);
  Dev<int8_t> dX(X), dW(W);
  Dev<float> dsa(sa), dsw(sw), db(bias);
  Dev<int32_t> y32(size_t(M) * N);
  Dev<uint16_t> yb(size_t(M) * N);
  Dev<float> yf(size_t(M) * N);
  gemm(dX.p, nullptr, dW.p, nullptr, nullptr, y32.p, DType::I32, M, N, K, nullptr);
  gemm(dX.p, dsa.p, dW.p, dsw.p, db.p, yb.p, DType::BF16, M, N, K, nullptr);
  gemm(dX.p, dsa.p, dW.p, dsw.p, nullptr, yf.p, DType::F32, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto Y32 = y32.get();
  auto Yb = yb.get();
  auto Yf = yf.get();
  std::vector<double> rb(size_t(M) * N), rf(size_t(M) * N);
  size_t bad = 0, nonzero = 0;
  double ssb = 0, ssf = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += int64_t(X[size_t(m) * K + k]) * W[size_t(n) * K + k];
      const size_t o = size_t(m) * N + n;
      bad += int64_t(Y32[o]) != acc;
      nonzero += acc != 0;
      rf[o] = double(acc) * sa[m] * sw[n];
      rb[o] = rf[o] + bias[n];
      ssb += rb[o] * rb[o];
      ssf += rf[o] * rf[o];
    }
  EXPECT_EQ(bad, 0u) << "int32 accumulators differ from the int64 reference";
  EXPECT_GT(nonzero, size_t(M) * N / 2);  // the data is not degenerate
  const double flb = 1e-3 * std::sqrt(ssb / rb.size()), flf = 1e-3 * std::sqrt(ssf / rf.size());
  double eb = 0, ef = 0;
  for (size_t o = 0; o < rb.size(); ++o) {
    eb = std::max(eb, std::fabs(perry::bf16_to_f32(Yb[o]) - rb[o]) / std::max(std::fabs(rb[o]), flb));
    ef = std::max(ef, std::fabs(Yf[o] - rf[o]) / std::max(std::fabs(rf[o]), flf));
  }
  EXPECT_LT(eb, 1e-2) << "bf16 + bias epilogue";
  EXPECT_LT(ef, 1e-4) << "fp32 epilogue";
}

TEST(CudaGemmW8A8, ExactInt32AndFusedEpilogueUnalignedShapes) {
  REQUIRE_GPU();
  std::mt19937 g(3);
  // M, N not multiples of the 128 tile; K = 16 (a single partial k-tile), K % 64 != 0, odd N.
  const int shapes[][3] = {{1, 8, 16}, {3, 5, 16},    {7, 130, 48},   {130, 7, 80},   {129, 131, 272},
                           {1, 1000, 256}, {200, 1, 32}, {257, 384, 1024}, {64, 2560, 2560}};
  for (auto& s : shapes) check_gemm(s[0], s[1], s[2], g);
}

// The experimental sm_90a wgmma kernel (TMA + wgmma, not dispatched to yet) under the same checks:
// int32 vs int64 exactly, epilogues vs float64, with M, N off its 128 × (128|160|256) tiles, K a
// multiple of 16 but not of its 128-byte k-tile (TMA zero-fills the rest), and a shape with more
// tiles than SMs (persistent CTAs loop over tiles: stage/phase bookkeeping across tiles). Run
// under each column-tile width (PERRY_WGMMA_BN, read per call).
TEST(CudaGemmW8A8, WgmmaExperimentalExactOnSm90) {
  REQUIRE_GPU();
  if (!pc::gemm_w8a8_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: wgmma kernel not tested";
  std::mt19937 g(6);
  const int shapes[][3] = {{1, 8, 16},     {3, 5, 16},       {7, 130, 48},   {130, 7, 80},
                           {129, 131, 272}, {257, 384, 1024}, {300, 513, 1040}, {200, 1, 32},
                           {1400, 3400, 144}};
  // Both schedules (cooperative, ping-pong on 64-row tiles, "2": on 128-row tiles), each tile width
  // (160: cooperative only; 3400 = 21 × 160 + 40 puts an edge tile beside the 16-byte stores).
  for (const char* ping : {"0", "1", "2"})
    for (const char* bn : {(const char*)nullptr, "128", "256", "160"}) {
      if (ping[0] == '2' && !(bn && bn[0] == '1' && bn[1] == '2')) continue;  // (the 128-row ping-pong is 128 columns wide)
      if (ping[0] != '0' && bn && bn[1] == '6') continue;  // (160 columns: the cooperative schedule)
      SCOPED_TRACE(std::string("PERRY_WGMMA_PINGPONG=") + ping + " PERRY_WGMMA_BN=" + (bn ? bn : "(auto)"));
      setenv("PERRY_WGMMA_PINGPONG", ping, 1);
      if (bn) setenv("PERRY_WGMMA_BN", bn, 1);
      else unsetenv("PERRY_WGMMA_BN");
      for (auto& s : shapes) check_gemm(s[0], s[1], s[2], g, pc::gemm_w8a8_wgmma);
    }
  unsetenv("PERRY_WGMMA_BN");
  unsetenv("PERRY_WGMMA_PINGPONG");
  // Output one element past an allocation: element stores, the same values.
  const int M = 5, N = 6, K = 32;
  auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
  auto sa = rand_f(M, g, 0.01f, 0.02f), sw = rand_f(N, g, 0.01f, 0.02f);
  Dev<int8_t> dX(X), dW(W);
  Dev<float> dsa(sa), dsw(sw);
  for (DType out : {DType::BF16, DType::F32, DType::I32}) {
    const size_t es = out == DType::BF16 ? 2 : 4;
    Dev<int32_t> a(size_t(M) * N + 1), b(size_t(M) * N + 1);
    pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, nullptr, a.p, out, M, N, K, nullptr);
    pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, nullptr, reinterpret_cast<char*>(b.p) + es, out, M, N, K, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto ha = a.get(), hb = b.get();
    EXPECT_EQ(std::memcmp(ha.data(), reinterpret_cast<const char*>(hb.data()) + es, size_t(M) * N * es), 0);
  }
}

// The bf16 epilogue's bits against the host's evaluation of its expression on the kernel's own
// exact int32 sums: y = bf16_rn(fma(float(acc), sa[m]·sw[n], bias[n])). Shapes where CTAs take
// several tiles (1400 × 3400: 154 tiles of 128 × 256), a K of 2 k-tiles (144), rows past M (1400,
// 77), a tile at the N edge (3400 = 13 × 256 + 72: the element path beside the 16-byte one), under
// both schedules and each tile width (no workspace: unsplit; WgmmaSplitKMatchesUnsplitBitForBit
// holds the split outputs to these bits). A misplaced, stale or missing store is an O(1) error
// here; the float64 test above allows 1e-2. (Written for the thirty-fifth session's deferred
// epilogue stores, measured 2–3% slower and reverted; the test stays: it pins the epilogue's bits.)
// Returns {outputs equal to that expression, outputs more than one bf16 ulp from it}.
std::pair<size_t, size_t> compare_bf16_epilogue(const std::vector<int32_t>& acc, const std::vector<uint16_t>& got,
                                                const std::vector<float>& sa, const std::vector<float>& sw,
                                                const std::vector<float>& bias, int N) {
  std::pair<size_t, size_t> r{0, 0};
  for (size_t o = 0; o < acc.size(); ++o) {
    const size_t m = o / size_t(N), n = o % size_t(N);
    const uint16_t want = perry::f32_to_bf16(std::fma(float(acc[o]), sa[m] * sw[n], bias[n]));
    if (got[o] == want) ++r.first;
    else if (std::abs(int(got[o]) - int(want)) > 1) ++r.second;  // more than one bf16 ulp: a wrong value
  }
  return r;
}

TEST(CudaGemmW8A8, WgmmaBf16EpilogueBitsMatchHostExpression) {
  REQUIRE_GPU();
  if (!pc::gemm_w8a8_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: wgmma kernel not tested";
  std::mt19937 g(17);
  // ({4096, 4096, 128}: one k-step a tile, ~8 tiles a CTA — the operand copies' shortest lead.)
  const int shapes[][3] = {{1400, 3400, 144}, {2048, 4096, 1024}, {1024, 6144, 512}, {77, 1024, 4096}, {4096, 4096, 128}};
  for (auto& sh : shapes) {
    const int M = sh[0], N = sh[1], K = sh[2];
    const auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
    const auto sa = rand_f(M, g, 1e-3f, 2e-2f), sw = rand_f(N, g, 1e-3f, 2e-2f), bias = rand_f(N, g, -2.f, 2.f);
    Dev<int8_t> dX(X), dW(W);
    Dev<float> dsa(sa), dsw(sw), db(bias);
    for (const char* ping : {"0", "1", "2"})
      for (const char* bn : {"128", "256", "160"}) {
        if (ping[0] == '2' && bn[1] != '2') continue;  // (the 128-row ping-pong is 128 columns wide)
        if (ping[0] != '0' && bn[1] == '6') continue;  // (160 columns: the cooperative schedule)
        SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << " PERRY_WGMMA_PINGPONG=" << ping
                                          << " PERRY_WGMMA_BN=" << bn);
        setenv("PERRY_WGMMA_PINGPONG", ping, 1);
        setenv("PERRY_WGMMA_BN", bn, 1);
        Dev<int32_t> y32(size_t(M) * N);
        Dev<uint16_t> yb(std::vector<uint16_t>(size_t(M) * N, 0x7fc1));  // a NaN where nothing is stored
        pc::gemm_w8a8_wgmma(dX.p, nullptr, dW.p, nullptr, nullptr, y32.p, DType::I32, M, N, K, nullptr);
        pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, db.p, yb.p, DType::BF16, M, N, K, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto [exact, off] = compare_bf16_epilogue(y32.get(), yb.get(), sa, sw, bias, N);
        EXPECT_EQ(off, 0u) << "bf16 outputs not the epilogue expression of the int32 sums";
        EXPECT_GE(double(exact), 0.999 * double(size_t(M) * N)) << "bf16 outputs not bit-exact";
      }
  }
  unsetenv("PERRY_WGMMA_PINGPONG");
  unsetenv("PERRY_WGMMA_BN");
}

// The default schedule choice (no switch set) against the cooperative kernel's bits: the same
// int32 sums and the same epilogue expression, whichever kernel the rule picks. On a 132-SM
// H100 / H200 the first two shapes take the 128-row ping-pong by both of ping128_schedule's
// branches (1024 × 6144: where the cooperative 128-column kernel would run; 2048 × 4096, K 512:
// instead of 256-column tiles), the last two the 160-column tiles by both of coop160_schedule's
// branches (1024 × 2560: 128 tiles in one wave; 4096 × 2560, K 8192: the busiest SM's columns tie
// the ping-pong's over a long K); PERRY_WGMMA_PING128=0 and PERRY_WGMMA_COOP160=0 give the rules'
// previous choices, the same bits again.
TEST(CudaGemmW8A8, WgmmaDefaultScheduleMatchesCooperativeBits) {
  REQUIRE_GPU();
  if (!pc::gemm_w8a8_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: wgmma kernel not tested";
  std::mt19937 g(23);
  const int shapes[][3] = {{1024, 6144, 256}, {2048, 4096, 512}, {1024, 2560, 384}, {4096, 2560, 8192}};
  unsetenv("PERRY_WGMMA_BN");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  // (The rules count tiles per SM: with another SM count these shapes may take other branches —
  // still compared bit for bit, but the rules' kernels may not be the ones that ran.)
  if (sms != 132) std::printf("[note] %d SMs, not 132: the shapes may not reach each rule's branch\n", sms);
  for (auto& sh : shapes) {
    const int M = sh[0], N = sh[1], K = sh[2];
    SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    const auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
    const auto sa = rand_f(M, g, 1e-3f, 2e-2f), sw = rand_f(N, g, 1e-3f, 2e-2f), bias = rand_f(N, g, -2.f, 2.f);
    Dev<int8_t> dX(X), dW(W);
    Dev<float> dsa(sa), dsw(sw), db(bias);
    std::vector<std::vector<uint16_t>> bf;
    std::vector<std::vector<int32_t>> i32;
    // default, cooperative 128 / 256 forced, each rule off
    const std::pair<const char*, const char*> kRuns[] = {
        {nullptr, nullptr}, {"PERRY_WGMMA_PINGPONG", "0"}, {"PERRY_WGMMA_PING128", "0"}, {"PERRY_WGMMA_COOP160", "0"}};
    for (const auto& [var, val] : kRuns) {
      unsetenv("PERRY_WGMMA_PINGPONG");
      unsetenv("PERRY_WGMMA_PING128");
      unsetenv("PERRY_WGMMA_COOP160");
      if (var) setenv(var, val, 1);
      Dev<uint16_t> yb(std::vector<uint16_t>(size_t(M) * N, 0x7fc1));  // a NaN where nothing is stored
      Dev<int32_t> y32(size_t(M) * N);
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, db.p, yb.p, DType::BF16, M, N, K, nullptr);
      pc::gemm_w8a8_wgmma(dX.p, nullptr, dW.p, nullptr, nullptr, y32.p, DType::I32, M, N, K, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      bf.push_back(yb.get());
      i32.push_back(y32.get());
    }
    unsetenv("PERRY_WGMMA_PINGPONG");
    unsetenv("PERRY_WGMMA_PING128");
    unsetenv("PERRY_WGMMA_COOP160");
    EXPECT_TRUE(i32[0] == i32[1]) << "default schedule's int32 sums differ from the cooperative kernel's";
    EXPECT_TRUE(i32[2] == i32[1]) << "PERRY_WGMMA_PING128=0's int32 sums differ from the cooperative kernel's";
    EXPECT_TRUE(i32[3] == i32[1]) << "PERRY_WGMMA_COOP160=0's int32 sums differ from the cooperative kernel's";
    EXPECT_TRUE(bf[0] == bf[1]) << "default schedule's bf16 outputs differ from the cooperative kernel's";
    EXPECT_TRUE(bf[2] == bf[1]) << "PERRY_WGMMA_PING128=0's bf16 outputs differ from the cooperative kernel's";
    EXPECT_TRUE(bf[3] == bf[1]) << "PERRY_WGMMA_COOP160=0's bf16 outputs differ from the cooperative kernel's";
    // (and the sums are the product: a row checked against int64 on the host)
    for (int n = 0; n < N; n += 97) {
      int64_t want = 0;
      for (int k = 0; k < K; ++k) want += int64_t(X[size_t(M - 1) * K + k]) * W[size_t(n) * K + k];
      ASSERT_EQ(int64_t(i32[0][size_t(M - 1) * N + n]), want) << "n=" << n;
    }
  }
}

// Split-K (small M and N: too few tiles for the SMs): the int32 partial sums per k-range give the
// int64 reference exactly, and the bf16 / f32 outputs are the unsplit kernel's bit for bit (the
// same epilogue expression) — added by the second kernel (no tile flags, or
// PERRY_WGMMA_SPLITK_FIXUP=0), and inside the GEMM by each tile's split 0 (tile flags given: the
// default), twice on the same flags (they must come back to zero, or the second call's counts
// would be wrong); at M 5 / 7 / 33 / 64 warps of the tile have no rows (they skip the fixup).
// Shapes that split by themselves (Llama-3-8B's down_proj and issue 6's 2560 × 10240 at M 128
// among them), and forced split counts with K off the 128-byte k-tile, a count that would leave a
// split empty (16 k-tiles in 5 splits: 4 of 4) and one past the SMs (capped to one CTA a unit).
TEST(CudaGemmW8A8, WgmmaSplitKMatchesUnsplitBitForBit) {
  REQUIRE_GPU();
  if (!pc::gemm_w8a8_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device: wgmma kernel not tested";
  std::mt19937 g(11);
  const int shapes[][4] = {{64, 256, 4096, 0},    {128, 1000, 4096, 0},  {5, 130, 8192, 0},   {33, 2560, 10240, 0},
                           {128, 4096, 14336, 0}, {128, 2560, 10240, 0}, {129, 131, 1040, 3}, {7, 40, 2048, 5},
                           {200, 1000, 4096, 40}};
  Dev<uint32_t> flags(std::vector<uint32_t>(pc::kGemmW8A8TileFlags, 0u));
  for (auto& sh : shapes) {
    const int M = sh[0], N = sh[1], K = sh[2];
    SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << " forced splits " << sh[3]);
    if (sh[3]) setenv("PERRY_WGMMA_SPLITK", std::to_string(sh[3]).c_str(), 1);
    else unsetenv("PERRY_WGMMA_SPLITK");
    const int splits = pc::gemm_w8a8_wgmma_splits(M, N, K);
    EXPECT_GT(splits, 1) << "expected a split-K shape";
    if (sh[3] == 40) {
      EXPECT_LE(2 * 8 * splits, 132) << "2 × 8 tiles: one CTA a unit";
    }
    const size_t ws = pc::gemm_w8a8_wgmma_workspace_bytes(M, N, K);
    EXPECT_GT(ws, 0u) << "expected a split-K shape";
    const auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
    const auto sa = rand_f(M, g, 1e-3f, 2e-2f), sw = rand_f(N, g, 1e-3f, 2e-2f), bias = rand_f(N, g, -2.f, 2.f);
    Dev<int8_t> dX(X), dW(W);
    Dev<float> dsa(sa), dsw(sw), db(bias);
    Dev<int32_t> dws(ws / 4 + 4);
    for (DType out : {DType::I32, DType::F32, DType::BF16}) {
      const size_t bytes = size_t(M) * N * (out == DType::BF16 ? 2 : 4);
      Dev<int32_t> split(size_t(M) * N), s2(size_t(M) * N), whole(size_t(M) * N), f1(size_t(M) * N),
          f2(size_t(M) * N);
      const float* b = out == DType::F32 ? nullptr : db.p;  // with and without a bias
      // The second kernel: no tile flags, and with them where the fixup is switched off.
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, b, split.p, out, M, N, K, nullptr, dws.p, ws);
      setenv("PERRY_WGMMA_SPLITK_FIXUP", "0", 1);
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, b, s2.p, out, M, N, K, nullptr, dws.p, ws, flags.p);
      unsetenv("PERRY_WGMMA_SPLITK_FIXUP");
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, b, whole.p, out, M, N, K, nullptr);  // no workspace: unsplit
      // The fixup inside the kernel (the default with tile flags), twice: the flags return to zero.
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, b, f1.p, out, M, N, K, nullptr, dws.p, ws, flags.p);
      pc::gemm_w8a8_wgmma(dX.p, dsa.p, dW.p, dsw.p, b, f2.p, out, M, N, K, nullptr, dws.p, ws, flags.p);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto hs = split.get(), hs2 = s2.get(), hw = whole.get(), h1 = f1.get(), h2 = f2.get();
      EXPECT_EQ(std::memcmp(hs.data(), hw.data(), bytes), 0) << "split-K output differs, out dtype " << int(out);
      EXPECT_EQ(std::memcmp(hs2.data(), hw.data(), bytes), 0) << "split-K (fixup off) differs, out dtype " << int(out);
      EXPECT_EQ(std::memcmp(h1.data(), hw.data(), bytes), 0) << "in-GEMM fixup output differs, out dtype " << int(out);
      EXPECT_EQ(std::memcmp(h2.data(), hw.data(), bytes), 0) << "second fixup call differs, out dtype " << int(out);
      if (out == DType::I32) {
        size_t bad = 0;
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            int64_t acc = 0;
            for (int k = 0; k < K; ++k) acc += int64_t(X[size_t(m) * K + k]) * W[size_t(n) * K + k];
            bad += int64_t(hs[size_t(m) * N + n]) != acc;
          }
        EXPECT_EQ(bad, 0u) << "split-K int32 sums differ from the int64 reference";
      }
    }
  }
  unsetenv("PERRY_WGMMA_SPLITK");
  const auto hf = flags.get();
  EXPECT_EQ(std::count(hf.begin(), hf.end(), 0u), ptrdiff_t(hf.size())) << "tile flags left non-zero";
  EXPECT_EQ(pc::gemm_w8a8_wgmma_splits(4096, 14336, 4096), 1) << "enough tiles for the SMs: unsplit";
  // The same call with too small a workspace runs unsplit (and still right).
  const int M = 64, N = 256, K = 4096;
  ASSERT_GT(pc::gemm_w8a8_wgmma_workspace_bytes(M, N, K), 16u);
  Dev<int8_t> dX(rand_i8(size_t(M) * K, g)), dW(rand_i8(size_t(N) * K, g));
  Dev<int32_t> a(size_t(M) * N), b(size_t(M) * N), small(4);
  pc::gemm_w8a8_wgmma(dX.p, nullptr, dW.p, nullptr, nullptr, a.p, DType::I32, M, N, K, nullptr, small.p, 16);
  pc::gemm_w8a8_wgmma(dX.p, nullptr, dW.p, nullptr, nullptr, b.p, DType::I32, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto ha = a.get(), hb = b.get();
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), size_t(M) * N * 4), 0);
}

// PREPARED, NOT YET RUN ON A GPU: the e4m3 comparison path (issue 6's w8a8-fp8).
// quantize_per_token_fp8 against the host rule on the same rows (scale amax/448 and the codec
// f32_to_e4m3 of x·(448/amax), bit for bit), including the scale-0, NaN, -inf, denormal rows.
TEST(CudaFp8, QuantizePerTokenMatchesHostRuleExactly) {
  REQUIRE_GPU();
  std::mt19937 g(8);
  for (auto [M, K] : {std::pair{6, 64}, std::pair{9, 1000}, std::pair{3, 4096}}) {
    const auto x = activations(M, K, g);
    std::vector<uint8_t> q_ref(x.size());
    std::vector<float> s_ref(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      float amax = 0.f;
      for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[size_t(m) * K + k]));  // NaN ignored
      float inv = amax > 0.f ? 448.f / amax : 0.f, scale = amax / 448.f;
      if (!std::isfinite(inv) || !std::isfinite(amax)) inv = scale = 0.f;
      s_ref[size_t(m)] = scale;
      for (int k = 0; k < K; ++k) q_ref[size_t(m) * K + k] = perry::f32_to_e4m3(x[size_t(m) * K + k] * inv);
    }
    Dev<float> dx(x);
    Dev<uint8_t> dq(x.size());
    Dev<float> ds(static_cast<size_t>(M));
    pc::quantize_per_token_fp8(dx.p, DType::F32, M, K, dq.p, ds.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto q = dq.get();
    const auto sc = ds.get();
    size_t bad = 0;
    for (size_t i = 0; i < q.size(); ++i)  // NaN codes: any NaN is a NaN
      bad += q[i] != q_ref[i] && !((q[i] & 0x7f) == 0x7f && (q_ref[i] & 0x7f) == 0x7f);
    EXPECT_EQ(bad, 0u) << "M=" << M << " K=" << K;
    for (int m = 0; m < M; ++m) EXPECT_EQ(std::memcmp(&sc[size_t(m)], &s_ref[size_t(m)], 4), 0) << "row " << m;
  }
}

// gemm_fp8_wgmma against float64 on the decoded e4m3 values: y = Σ x·w ·sa·sw (+bias). The
// products are exact in fp32; the tensor core's accumulation of them is not IEEE, so the bound is
// relative to Σ|x·w|. Measured on the H200 (eighth session, run 1): up to 1.6e-3, worst at K =
// 144 — Hopper's fp8 MMA aligns a k-step's products to the largest exponent and keeps ~13 bits
// (DeepSeek-V3's report finds the same ~14-bit accumulation on H800), and random e4m3 codes span
// 2^-9..448, so small products lose their low bits. 4e-3 keeps a margin; a fragment-layout or
// scale bug gives errors of order 1.
// Unaligned shapes, both tile widths, bf16 and f32 out; then its time next to the int8 kernel's.
TEST(CudaFp8, WgmmaGemmMatchesFloat64) {
  REQUIRE_GPU();
  if (!pc::gemm_w8a8_wgmma_supported()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(9);
  auto codes = [&](size_t n) {  // random finite e4m3 codes (no NaN), both signs
    std::vector<uint8_t> v(n);
    std::uniform_int_distribution<int> d(0, 255);
    for (auto& c : v) do c = uint8_t(d(g)); while ((c & 0x7f) == 0x7f);
    return v;
  };
  const int shapes[][3] = {{1, 8, 16}, {7, 130, 48}, {129, 131, 272}, {300, 513, 1040}, {1400, 3400, 144}};
  // 256p: the ping-pong schedule; 128q: ping-pong on 128-row tiles
  for (const char* bn : {"128", "256", "256p", "128q"}) {
    setenv("PERRY_WGMMA_BN", std::string(bn).substr(0, 3).c_str(), 1);
    setenv("PERRY_WGMMA_PINGPONG", bn[3] == 'p' ? "1" : bn[3] == 'q' ? "2" : "0", 1);
    for (auto& sh : shapes) {
      const int M = sh[0], N = sh[1], K = sh[2];
      SCOPED_TRACE(::testing::Message() << "BN=" << bn << " M=" << M << " N=" << N << " K=" << K);
      const auto X = codes(size_t(M) * K), W = codes(size_t(N) * K);
      const auto sa = rand_f(M, g, 0.01f, 0.02f), sw = rand_f(N, g, 0.01f, 0.02f), bias = rand_f(N, g, -1.f, 1.f);
      Dev<uint8_t> dX(X), dW(W);
      Dev<float> dsa(sa), dsw(sw), db(bias), yf(size_t(M) * N);
      Dev<uint16_t> yb(size_t(M) * N);
      pc::gemm_fp8_wgmma(dX.p, dsa.p, dW.p, dsw.p, db.p, yf.p, DType::F32, M, N, K, nullptr);
      pc::gemm_fp8_wgmma(dX.p, dsa.p, dW.p, dsw.p, db.p, yb.p, DType::BF16, M, N, K, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto f = yf.get();
      const auto b = yb.get();
      double worst = 0, worst_b = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double acc = 0, mag = 0;
          for (int k = 0; k < K; ++k) {
            const double p = double(perry::e4m3_to_f32(X[size_t(m) * K + k])) * perry::e4m3_to_f32(W[size_t(n) * K + k]);
            acc += p;
            mag += std::fabs(p);
          }
          const double s = double(sa[size_t(m)]) * sw[size_t(n)];
          const double ref = acc * s + bias[size_t(n)], den = mag * s + std::fabs(bias[size_t(n)]) + 1e-30;
          worst = std::max(worst, std::fabs(f[size_t(m) * N + n] - ref) / den);
          worst_b = std::max(worst_b, std::fabs(perry::bf16_to_f32(b[size_t(m) * N + n]) - ref) / den);
        }
      EXPECT_LT(worst, 4e-3);
      EXPECT_LT(worst_b, 1e-2);  // + the bf16 rounding of the output
    }
  }
  unsetenv("PERRY_WGMMA_BN");
  unsetenv("PERRY_WGMMA_PINGPONG");
  EXPECT_THROW(pc::gemm_fp8_wgmma(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, DType::I32, 1, 1, 16, nullptr),
               perry::Error);

  // Time at M 4096, N 14336, K 4096 (bf16 out), next to the int8 kernel on the same shape.
  const int M = 4096, N = 14336, K = 4096;
  Dev<uint8_t> X8(codes(size_t(M) * K)), W8(codes(size_t(N) * K));
  Dev<float> sa(rand_f(M, g, 0.01f, 0.02f)), sw(rand_f(N, g, 0.01f, 0.02f));
  Dev<uint16_t> y(size_t(M) * N);
  auto time_ms = [&](auto&& run) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    run();
    std::vector<float> ms;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(e0);
      run();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    return ms[2];
  };
  const double fp8 = time_ms([&] { pc::gemm_fp8_wgmma(X8.p, sa.p, W8.p, sw.p, nullptr, y.p, DType::BF16, M, N, K, nullptr); });
  const double i8 = time_ms([&] {
    pc::gemm_w8a8_wgmma(reinterpret_cast<const int8_t*>(X8.p), sa.p, reinterpret_cast<const int8_t*>(W8.p), sw.p,
                        nullptr, y.p, DType::BF16, M, N, K, nullptr);
  });
  const double ops = 2.0 * M * N * K;
  std::printf("  gemm M=%d N=%d K=%d bf16 out: fp8 wgmma %.3f ms %.0f TFLOP/s, int8 wgmma %.3f ms %.0f TOPS\n", M, N,
              K, fp8, ops / fp8 / 1e9, i8, ops / i8 / 1e9);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaGemmW8A8, OddOffsetOutputUsesElementStores) {
  // Y one element past an allocation: paired stores would be misaligned, so the kernel must
  // store element by element and still produce the same values.
  REQUIRE_GPU();
  std::mt19937 g(5);
  const int M = 5, N = 6, K = 32;
  auto X = rand_i8(size_t(M) * K, g), W = rand_i8(size_t(N) * K, g);
  Dev<int8_t> dX(X), dW(W);
  Dev<float> dsa(rand_f(M, g, 0.01f, 0.02f)), dsw(rand_f(N, g, 0.01f, 0.02f));
  for (DType out : {DType::BF16, DType::F32, DType::I32}) {
    Dev<int32_t> a(size_t(M) * N + 1), b(size_t(M) * N + 1);  // 4-byte slots fit every dtype
    const size_t es = out == DType::BF16 ? 2 : 4;
    pc::gemm_w8a8(dX.p, dsa.p, dW.p, dsw.p, nullptr, a.p, out, M, N, K, nullptr);
    pc::gemm_w8a8(dX.p, dsa.p, dW.p, dsw.p, nullptr, reinterpret_cast<char*>(b.p) + es, out, M, N, K, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto ha = a.get(), hb = b.get();
    EXPECT_EQ(std::memcmp(ha.data(), reinterpret_cast<const char*>(hb.data()) + es, size_t(M) * N * es), 0)
        << "dtype " << perry::dtype_name(out);
  }
}

TEST(CudaGemmW8A8, QuantizeThenGemmMatchesCpuPipeline) {
  REQUIRE_GPU();
  std::mt19937 g(4);
  const int M = 37, N = 300, K = 512;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(g);
  auto W = rand_i8(size_t(N) * K, g);
  Dev<float> dx(x);
  Dev<int8_t> dq(x.size()), dW(W);
  Dev<float> dsa(M), dsw(rand_f(N, g, 1e-3f, 1e-2f));
  Dev<int32_t> y(size_t(M) * N);
  pc::quantize_per_token(dx.p, DType::F32, M, K, dq.p, dsa.p, nullptr);
  pc::gemm_w8a8(dq.p, dsa.p, dW.p, nullptr, nullptr, y.p, DType::I32, M, N, K, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto Y = y.get();
  std::vector<int8_t> q(K);
  size_t bad = 0;
  for (int m = 0; m < M; ++m) {
    perry::quant::quantize_row_ref(&x[size_t(m) * K], K, q.data());
    for (int n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += int64_t(q[k]) * W[size_t(n) * K + k];
      bad += acc != Y[size_t(m) * N + n];
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(CudaGemmW8A8, BadArgumentsThrowNamedErrors) {
  REQUIRE_GPU();
  Dev<int8_t> d(4096);
  Dev<int32_t> y(4096);
  Dev<float> s(64);
  EXPECT_THROW(pc::gemm_w8a8(d.p, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 4, 4, 40, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_w8a8(d.p + 1, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 4, 4, 16, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_w8a8(d.p, nullptr, d.p, nullptr, nullptr, y.p, DType::BF16, 4, 4, 16, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_w8a8(d.p, s.p, d.p, s.p, nullptr, y.p, DType::I8, 4, 4, 16, nullptr), perry::Error);
  EXPECT_THROW(pc::gemm_w8a8(d.p, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 0, 4, 16, nullptr), perry::Error);
  EXPECT_THROW(pc::quantize_per_token(d.p, DType::I8, 4, 16, d.p, s.p, nullptr), perry::Error);
  try {
    pc::gemm_w8a8(d.p, nullptr, d.p, nullptr, nullptr, y.p, DType::I32, 4, 4, 40, nullptr);
  } catch (const perry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
