// `perry bench-op --device cuda` (src/backend/cuda/bench_op_cuda*.cpp) and the library peers
// (src/kernels/cuda/bench_peers.h): the host references the benchmark checks every timed output
// against, the cuBLASLt peers against exact integer / float64 results, and one tiny end-to-end
// run whose every row must pass its check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "backend/cuda/bench_op_cuda.h"
#include "backend/cuda/bench_op_cuda_ops.h"
#include "cuda/cuda_test_util.h"
#include "kernels/cuda/bench_peers.h"
#include "quant/quant.h"

namespace {

using namespace perry::cuda::benchop;
namespace pq = perry::quant;
namespace pc = perry::cuda;
using perry::cuda::testing::have_gpu;

// reference() reads the canonical format the way perry's CPU quantizer writes it.
TEST(CudaBenchOp, ReferenceMatchesCpuQuantizer) {
  const int N = 16, K = 512;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> w(size_t(N) * K), x(K);
  for (auto& v : w) v = 0.02f * nd(rng);
  for (auto& v : x) v = perry::bf16_to_f32(perry::f32_to_bf16(nd(rng)));
  std::vector<int8_t> xq(K);
  const float sa = pq::quantize_row_ref(x.data(), K, xq.data());
  for (Op op : {Op::W8A16, Op::W4A16, Op::W8A8, Op::W8A8G128, Op::W8A8G64, Op::W4A8, Op::W4A8G128}) {
    const pq::QuantizedWeight qw = pq::quantize_weight(w.data(), N, K, op_info(op).mode);
    ASSERT_EQ(scale_group(op) == 0 ? 1 : K / scale_group(op), qw.n_groups()) << op_info(op).name;
    const std::vector<float> deq = pq::dequantize_weight(qw);
    for (int n = 0; n < N; ++n) {
      const HostRow r{reinterpret_cast<const uint8_t*>(qw.qweight.data()) + n * qw.row_bytes(),
                      qw.scales.data() + n * qw.n_groups()};
      const HostAct a{x.data(), xq.data(), sa, nullptr};
      double want = 0;
      for (int k = 0; k < K; ++k)
        want += double(deq[size_t(n) * K + k]) * (reads_int8_activations(op) ? xq[k] * double(sa) : double(x[k]));
      EXPECT_NEAR(reference(op, r, a, K, 1.0f), want, 1e-5 * (std::fabs(want) + 1e-2)) << op_info(op).name << " n=" << n;
    }
  }
}

TEST(CudaBenchOp, E4M3Decode) {
  EXPECT_EQ(e4m3_to_double(0x38), 1.0);
  EXPECT_EQ(e4m3_to_double(0xb8), -1.0);
  EXPECT_EQ(e4m3_to_double(0x7e), 448.0);
  EXPECT_EQ(e4m3_to_double(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3_to_double(0x08), std::ldexp(1.0, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_double(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_double(0xff)));
}

TEST(CudaBenchOp, Judge) {
  EXPECT_TRUE(judge(Op::W8A8, {1, 2, 3}, {1, 2, 3.05}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {1, 2, 3}, {1, 2, 3.5}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {1, NAN}, {1, 2}).ok);
  EXPECT_FALSE(judge(Op::W8A8, {0, 0}, {0, 0}).ok);  // an all-zero reference proves nothing
  EXPECT_TRUE(judge(Op::LtI8I8, {1, 2, 3}, {1, 2, 4}).ok);
  EXPECT_FALSE(judge(Op::LtI8I32, {1, 2, 3}, {1, 2, 4}).ok);
}

// The cuBLASLt peers against exact results at a small, odd-M shape.
TEST(CudaBenchOp, LtPeers) {
  REQUIRE_GPU();
  const int M = 5, N = 64, K = 128;
  std::mt19937 rng(3);
  const auto w = perry::cuda::testing::rand_i8(size_t(N) * K, rng), x = perry::cuda::testing::rand_i8(size_t(M) * K, rng);
  Dev<int8_t> dw(w), dx(x);
  Dev<int32_t> y(size_t(M) * N);
  Dev<uint8_t> ws(32 << 20);
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f / 4096;
  for (auto kind : {pc::LtGemmKind::I8_I32, pc::LtGemmKind::I8_I8}) {
    pc::LtGemm g(lt, kind, M, N, K, ws.n, alpha);
    ASSERT_TRUE(g.available()) << g.note();
    g.run(dw.p, dx.p, y.p, ws.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = y.get();
    const auto* y8 = reinterpret_cast<const int8_t*>(out.data());
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int k = 0; k < K; ++k) acc += int64_t(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
        if (kind == pc::LtGemmKind::I8_I32) {
          ASSERT_EQ(out[size_t(m) * N + n], acc) << "m=" << m << " n=" << n;
        } else {
          const double want = std::clamp(std::nearbyint(alpha * double(acc)), -128.0, 127.0);
          ASSERT_NEAR(y8[size_t(m) * N + n], want, 1.0) << "m=" << m << " n=" << n;
        }
      }
  }
  cublasLtDestroy(lt);
}

// A tiny end-to-end run: every row (every perry mode, the peers, the quantization) passes its
// output check and gets a time, and the files are written.
TEST(CudaBenchOp, TinyRunPasses) {
  REQUIRE_GPU();
  pc::CudaBenchOpOptions o;
  o.common.shapes = {{256, 512}};
  o.common.ms = {1, 16};
  o.common.repeats = 2;
  o.common.out_prefix = ::testing::TempDir() + "perry_bench_op_cuda_test";
  ASSERT_EQ(pc::run_bench_op_cuda(o), 0);
  std::ifstream f(o.common.out_prefix + ".json");
  ASSERT_TRUE(f.good());
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["failures"], 0);
  EXPECT_GT(j["copy_bandwidth_gbs"].get<double>(), 100.0);
  int rows = 0;
  for (const auto& r : j["results"]) {
    ++rows;
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    if (r["kind"] != "peer") {
      EXPECT_GT(r["ms"].get<double>(), 0.0) << r.dump();
    }
  }
  EXPECT_GE(rows, 2 * 12);  // quantize + 8 perry modes + >= 3 peers, at both M
  std::remove((o.common.out_prefix + ".json").c_str());
  std::remove((o.common.out_prefix + ".md").c_str());
}

}  // namespace
