// Sampling, stop strings and perplexity windowing.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#include "tiny_checkpoint.h"

using namespace perry;
using namespace perry::runtime;

TEST(Sampler, GreedyIsFirstArgmax) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
  Sampler s({});
  EXPECT_EQ(s.sample(l.data(), 5, {}), 1);
}

// The greedy rule (model::greedy_token), against a plain scan written here: the first index of
// the largest non-NaN value; a row of only NaN picks 0. NaN anywhere, first included, is skipped
// (the old Sampler loop returned 0 whenever logits[0] was NaN).
TEST(Sampler, GreedyTokenRule) {
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<std::pair<std::vector<float>, int32_t>> cases = {
      {{0.1f, 2.0f, -1.0f, 2.0f, 0.5f}, 1},  // tie: the first
      {{nan, 1.0f, 3.0f, nan, 3.0f}, 2},      // NaN first is not picked
      {{nan, nan, nan}, 0},                   // only NaN
      {{-inf, -inf, -inf}, 0},                // all -inf: the first
      {{-inf, -5.0f, inf, inf}, 2},           // +inf wins, first of two
      {{-1e30f}, 0},
  };
  for (const auto& [row, want] : cases) {
    EXPECT_EQ(model::greedy_token(row.data(), int64_t(row.size())), want);
    auto l = row;
    EXPECT_EQ(Sampler({}).sample(l.data(), int64_t(l.size()), {}), want);  // the Sampler's greedy is the rule
  }
  SamplingParams sp;
  EXPECT_TRUE(Sampler(sp).picks_greedy());
  sp.repetition_penalty = 1.1;  // penalized logits: the pick needs the host
  EXPECT_FALSE(Sampler(sp).picks_greedy());
  sp.repetition_penalty = 1.0;
  sp.temperature = 0.7;
  EXPECT_FALSE(Sampler(sp).picks_greedy());
}

// The tiny Llama checkpoint written under `name`, loaded.
static std::unique_ptr<model::Model> load_tiny_llama(const std::string& name) {
  model::LoadOptions o;
  o.dir = test_util::write_tiny_checkpoint(name, test_util::tiny_config(io::Architecture::Llama));
  return model::Model::load(o);
}

// Model::forward_greedy == forward() + greedy_token of each sequence's row, for a batch of two
// sequences over several steps (prefill, then decode), and it rejects all_logits rows.
TEST(Sampler, ForwardGreedyPicksFromTheLogits) {
  auto m = load_tiny_llama("greedy");
  const auto& cfg = m->config();
  auto ca = m->make_cache(64, 2), cb = m->make_cache(64, 2);
  std::vector<int32_t> p0 = {5, 9, 2, 7}, p1 = {11, 3};
  std::vector<int32_t> next, want(2);
  std::vector<float> logits;
  m->forward_greedy({{0, p0.data(), 4, false}, {1, p1.data(), 2, false}}, ca, next);
  m->forward({{0, p0.data(), 4, false}, {1, p1.data(), 2, false}}, cb, logits);
  for (int step = 0; step < 6; ++step) {
    const int64_t V = cfg.vocab_size;
    for (int i = 0; i < 2; ++i) want[size_t(i)] = model::greedy_token(logits.data() + i * V, V);
    ASSERT_EQ(next, want) << "step " << step;
    std::vector<int32_t> t = next;
    m->forward_greedy({{0, &t[0], 1, false}, {1, &t[1], 1, false}}, ca, next);
    m->forward({{0, &t[0], 1, false}, {1, &t[1], 1, false}}, cb, logits);
  }
  EXPECT_THROW(m->forward_greedy({{0, p0.data(), 2, true}}, ca, next), Error);
}

// Model::decode_greedy == forward_greedy step by step (each step fed the tokens the step before
// picked), for two sequences of different lengths; on_step sees the cache holding exactly the
// steps so far; a stop ends the run there; bad runs are errors.
TEST(Sampler, DecodeGreedyFeedsEachStepThePicks) {
  auto m = load_tiny_llama("decode-greedy");
  auto ca = m->make_cache(64, 2), cb = m->make_cache(64, 2);
  std::vector<int32_t> p0 = {5, 9, 2, 7}, p1 = {11, 3}, first;
  m->forward_greedy({{0, p0.data(), 4, false}, {1, p1.data(), 2, false}}, ca, first);
  m->forward_greedy({{0, p0.data(), 4, false}, {1, p1.data(), 2, false}}, cb, first);
  // Step by step on ca.
  std::vector<std::vector<int32_t>> want;
  std::vector<int32_t> t = first, next;
  for (int step = 0; step < 7; ++step) {
    m->forward_greedy({{0, &t[0], 1, false}, {1, &t[1], 1, false}}, ca, next);
    want.push_back(next);
    t = next;
  }
  // decode_greedy on cb: stopped after 3 steps, then resumed from the last pick for 4 more.
  std::vector<std::vector<int32_t>> got;
  auto record = [&](int64_t stop_after) {
    return [&got, &cb, stop_after, n0 = got.size()](const std::vector<int32_t>& tok) {
      got.push_back(tok);
      const int64_t steps = int64_t(got.size() - n0);
      EXPECT_EQ(cb.length(0), 4 + int64_t(got.size()));  // the cache holds exactly the steps so far
      EXPECT_EQ(cb.length(1), 2 + int64_t(got.size()));
      return steps < stop_after;
    };
  };
  t = first;
  EXPECT_EQ(m->decode_greedy({{0, &t[0], 1, false}, {1, &t[1], 1, false}}, cb, 50, record(3)), 3);
  t = got.back();
  EXPECT_EQ(m->decode_greedy({{0, &t[0], 1, false}, {1, &t[1], 1, false}}, cb, 4, record(99)), 4);
  EXPECT_EQ(got, want);
  EXPECT_EQ(cb.length(0), 4 + 7);
  // Bad runs: more steps than the context holds, two tokens a sequence, a negative count.
  auto go_on = [](const std::vector<int32_t>&) { return true; };
  EXPECT_THROW(m->decode_greedy({{0, &t[0], 1, false}}, cb, 64, go_on), Error);
  EXPECT_THROW(m->decode_greedy({{0, p0.data(), 2, false}}, cb, 2, go_on), Error);
  EXPECT_THROW(m->decode_greedy({{0, &t[0], 1, false}}, cb, -1, go_on), Error);
  EXPECT_EQ(cb.length(0), 4 + 7);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  // Temperature 1, no truncation: empirical frequencies over 200k draws match softmax within
  // 5 standard errors (deterministic: fixed seed).
  const std::vector<float> base = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  std::vector<double> p(base.size());
  double z = 0;
  for (size_t i = 0; i < base.size(); ++i) z += p[i] = std::exp(double(base[i]));
  for (auto& x : p) x /= z;
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.seed = 77;
  Sampler s(sp);
  std::vector<int> count(base.size());
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    auto l = base;
    ++count[size_t(s.sample(l.data(), int64_t(l.size()), {}))];
  }
  for (size_t i = 0; i < base.size(); ++i) {
    const double se = std::sqrt(p[i] * (1 - p[i]) / n);
    EXPECT_NEAR(double(count[i]) / n, p[i], 5 * se) << "token " << i;
  }
}

TEST(Sampler, TruncationsAndPenalty) {
  const std::vector<float> base = {3.0f, 2.9f, 1.0f, 0.0f, -5.0f};
  auto draws = [&](SamplingParams sp, std::vector<int32_t> hist = {}) {
    Sampler s(sp);
    std::map<int, int> c;
    for (int i = 0; i < 3000; ++i) {
      auto l = base;
      ++c[s.sample(l.data(), 5, hist)];
    }
    return c;
  };
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 2;
  auto c = draws(sp);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_TRUE(c.count(0) && c.count(1));
  sp = {};
  sp.temperature = 1.0;
  sp.top_p = 0.5;  // p0 ≈ 0.47 < 0.5, so the set is {0, 1}
  c = draws(sp);
  EXPECT_EQ(c.size(), 2u);
  sp = {};
  sp.temperature = 1.0;
  sp.min_p = 0.5;  // keeps tokens with p >= 0.5 p_max: 0 and 1 only
  c = draws(sp);
  EXPECT_EQ(c.size(), 2u);
  // Repetition penalty (HF semantics): a huge penalty on 0 and 1 makes token 2 the greedy pick.
  sp = {};
  sp.repetition_penalty = 10.0;
  Sampler g(sp);
  auto l = base;
  EXPECT_EQ(g.sample(l.data(), 5, {0, 1, 0}), 2);
  // Same seed, same stream.
  sp = {};
  sp.temperature = 0.8;
  sp.seed = 5;
  Sampler a(sp), b(sp);
  for (int i = 0; i < 50; ++i) {
    auto la = base, lb = base;
    EXPECT_EQ(a.sample(la.data(), 5, {}), b.sample(lb.data(), 5, {}));
  }
  sp.top_p = 0.0;
  EXPECT_THROW(Sampler{sp}, Error);
}

TEST(StopStrings, NeverStreamsAStopString) {
  StopStringFilter f({"</s>", "STOP"});
  bool stopped = false;
  std::string out;
  out += f.push("hello <", &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(out, "hello ");
  out += f.push("/", &stopped);
  out += f.push("x> wor", &stopped);
  EXPECT_FALSE(stopped);
  out += f.push("ld ST", &stopped);
  EXPECT_EQ(out, "hello </x> world ");
  out += f.push("OP and more", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hello </x> world ");
}

TEST(Perplexity, WindowingAndValueMatchDirectComputation) {
  auto cfg = test_util::tiny_config(io::Architecture::Qwen3);
  model::LoadOptions o;
  o.dir = test_util::write_tiny_checkpoint("ppl", cfg);
  auto m = model::Model::load(o);
  std::vector<int32_t> ids(70);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 31 + 7) % uint64_t(cfg.vocab_size));
  // Non-overlapping, ctx 32: windows [0,32), [32,64); the trailing 6 tokens are dropped.
  auto r = perplexity(*m, ids, 32, 32);
  EXPECT_EQ(r.windows, 2);
  EXPECT_EQ(r.scored_tokens, 62);
  // Direct: full logits of each window, NLL in float64.
  double nll = 0;
  for (int w = 0; w < 2; ++w) {
    auto cache = m->make_cache(32, 1);
    std::vector<float> logits;
    m->forward({{0, ids.data() + 32 * w, 32, true}}, cache, logits);
    for (int t = 1; t < 32; ++t) {
      const float* row = logits.data() + (t - 1) * cfg.vocab_size;
      double mx = -1e30, s = 0;
      for (int64_t i = 0; i < cfg.vocab_size; ++i) mx = std::max(mx, double(row[i]));
      for (int64_t i = 0; i < cfg.vocab_size; ++i) s += std::exp(double(row[i]) - mx);
      nll += mx + std::log(s) - row[ids[size_t(32 * w + t)]];
    }
  }
  EXPECT_NEAR(r.nll_sum, nll, 1e-6 * std::abs(nll));
  EXPECT_NEAR(r.ppl, std::exp(nll / 62), 1e-9 * r.ppl);
  // Strided (ctx 32, stride 16) scores every token after the first exactly once.
  auto s = perplexity(*m, ids, 32, 16);
  EXPECT_EQ(s.scored_tokens, 69);
  EXPECT_EQ(s.windows, 4);  // ends 32, 48, 64, 70
  EXPECT_THROW(perplexity(*m, std::vector<int32_t>(10, 1), 32, 32), Error);
}
