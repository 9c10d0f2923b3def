// Causal GQA attention vs a float64 oracle: prefill, decode with key-range splitting, odd head dims.
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels_float/test_util.h"

namespace perry::kernels {
namespace {

using test::available_isas;
using test::isa_name;
using test::IsaScope;
using test::random_floats;

std::vector<double> attention_f64(const std::vector<float>& q, int64_t T, int64_t pos0, int nh, int nkv, int hd,
                                  const std::vector<float>& k, const std::vector<float>& v, int64_t cap) {
  std::vector<double> out(size_t(T * nh * hd), 0.0);
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / (nh / nkv);
      const int64_t L = pos0 + t + 1;
      std::vector<double> s(static_cast<size_t>(L));
      double mx = -1e300;
      for (int64_t j = 0; j < L; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += double(q[(t * nh + h) * hd + i]) * k[(kvh * cap + j) * hd + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < L; ++j)
        for (int i = 0; i < hd; ++i) out[(t * nh + h) * hd + i] += s[j] / sum * v[(kvh * cap + j) * hd + i];
    }
  }
  return out;
}

struct Case {
  int64_t T, pos0;
  int nh, nkv, hd;
};

TEST(Attention, MatchesFloat64AllPaths) {
  const Case cases[] = {
      {1, 0, 4, 1, 64},      // first decode step: one key
      {1, 700, 8, 2, 64},    // decode, few kv heads: key range split across threads
      {1, 3000, 32, 8, 64},  // Llama-3.2-1B decode shape
      {17, 0, 4, 2, 64},     // prefill from empty cache
      {33, 5, 6, 2, 40},     // head_dim not a multiple of 16 (masked tails), G = 3
      {63, 130, 14, 2, 16},  // G = 7 (Qwen2.5-0.5B style: 4 + 3 head sub-groups)
      {3, 1, 5, 5, 130},     // G = 1 (plain MHA), head_dim 130
      {130, 0, 2, 1, 128},   // several 64-key tiles per query
      {9, 70, 8, 2, 128},    // G = 4, head_dim 128 (Llama-3-8B): P·V in two register blocks
      {21, 3, 6, 2, 100},    // G = 3: register blocks of 5 slices, the second one partial
  };
  for (IsaLevel isa : available_isas()) {
    IsaScope scope(isa);
    for (const auto& c : cases) {
      const int64_t cap = c.pos0 + c.T + 3;  // capacity larger than used: the stride must be honoured
      // Keys scaled so scores spread over several units (softmax far from uniform).
      auto q = random_floats(size_t(c.T * c.nh * c.hd), 1 + uint32_t(c.T), -2, 2);
      auto k = random_floats(size_t(c.nkv * cap * c.hd), 2 + uint32_t(c.pos0), -2, 2);
      auto v = random_floats(size_t(c.nkv * cap * c.hd), 3 + uint32_t(c.hd));
      const float scale = 1.0f / std::sqrt(float(c.hd));
      auto want = attention_f64(q, c.T, c.pos0, c.nh, c.nkv, c.hd, k, v, cap);
      std::vector<float> got(want.size()), got_ref(want.size());
      attention_f32(q.data(), c.T, c.pos0, c.nh, c.nkv, c.hd, k.data(), v.data(), cap, scale, got.data());
      ref::attention_f32(q.data(), c.T, c.pos0, c.nh, c.nkv, c.hd, k.data(), v.data(), cap, scale,
                         got_ref.data());
      // Outputs are convex combinations of V rows (|v| <= 1). Errors: fp32 dot products of hd terms
      // give score errors ~ hd * 6e-8 * |q||k| ~ 1e-5 absolute on scores of size ~10; through the
      // softmax that is ~1e-5 relative on the weights, so 5e-5 absolute on the outputs.
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 5e-5) << isa_name(isa) << " T=" << c.T << " pos0=" << c.pos0 << " i=" << i;
        ASSERT_NEAR(got_ref[i], want[i], 5e-5) << "ref T=" << c.T << " i=" << i;
      }
    }
  }
}

TEST(Attention, SingleThreadPoolSameResult) {
  // Splitting keys across threads must not change the result beyond rounding.
  const int64_t T = 1, pos0 = 2000, cap = 2001;
  const int nh = 4, nkv = 1, hd = 64;
  auto q = random_floats(size_t(T * nh * hd), 5), k = random_floats(size_t(nkv * cap * hd), 6),
       v = random_floats(size_t(nkv * cap * hd), 7);
  std::vector<float> a(size_t(nh * hd)), b(a.size());
  attention_f32(q.data(), T, pos0, nh, nkv, hd, k.data(), v.data(), cap, 0.125f, a.data());
  set_num_threads(1);
  attention_f32(q.data(), T, pos0, nh, nkv, hd, k.data(), v.data(), cap, 0.125f, b.data());
  set_num_threads(0);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5);
}

TEST(Attention, RejectsBadShapes) {
  std::vector<float> buf(4096, 0.5f), out(4096);
  EXPECT_THROW(attention_f32(buf.data(), 2, 9, 4, 3, 16, buf.data(), buf.data(), 10, 0.25f, out.data()), Error);
  EXPECT_THROW(attention_f32(buf.data(), 2, 9, 4, 2, 16, buf.data(), buf.data(), 10, 0.25f, out.data()), Error);
  EXPECT_THROW(attention_f32(buf.data(), 1, 0, 4, 2, 0, buf.data(), buf.data(), 10, 0.25f, out.data()), Error);
}

}  // namespace
}  // namespace perry::kernels
