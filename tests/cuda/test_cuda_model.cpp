// The whole model on the GPU (label cuda: runs on the GPU machine, skips without a device).
//   * transformers goldens (tests/golden) through the CUDA backend: prompt logits and greedy
//     continuations, as tests/model/test_golden.cpp does for the CPU;
//   * every quantization mode on the embedded model against the CPU running the same mode:
//     logits, greedy tokens, and perplexity within 0.5%;
//   * batched forward (sequences of different lengths, decode of several slots) equal to
//     one-sequence-at-a-time on the GPU;
//   * errors: a context overflow and a KV cache larger than the GPU give perry::Error, not a crash.
//
// Tolerance. The GPU computes every linear with bf16 (or int8) inputs and keeps a bf16 KV cache;
// the CPU golden path rounds linear inputs to bf16 too but keeps fp32 K/V. Logits are compared as
// max|Δ| <= 2% of max|logit| (the CPU golden bound); greedy tokens must match except after a
// step whose oracle top-1/top-2 margin is below 0.05 (a near-tie that can flip under rounding).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "kernels/cuda/attention.h"
#include "cuda/cuda_test_util.h"
#include "golden_util.h"
#include "model/model.h"
#include "quant/quant.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

using namespace perry;
using namespace perry::golden_test;
namespace fs = std::filesystem;

namespace {

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_DEVICE() \
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device: GPU model tests skipped"

// dir: a model directory, or "synthetic:PRESET" (random weights of a preset's shape).
std::unique_ptr<model::Model> load(const std::string& dir, std::optional<quant::QuantMode> mode, bool cuda) {
  model::LoadOptions o;
  if (dir.rfind("synthetic:", 0) == 0) o.synthetic = dir.substr(10);
  else o.dir = dir;
  o.quant = mode;
  o.pack_for_cpu = !cuda;
  auto m = model::Model::load(o);
  if (cuda) m->set_backend(cuda::make_cuda_backend(*m, {}));
  return m;
}

constexpr double kNearTie = 0.05;

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

// Top-1 minus top-2 of a logits row (how safely the greedy choice is determined).
double margin(const float* x, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > a) { b = a; a = x[i]; }
    else if (x[i] > b) b = x[i];
  }
  return double(a) - double(b);
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CudaGolden, LogitsAndGreedyMatchTransformers) {
  REQUIRE_DEVICE();
  const auto g = load_golden(GetParam());
  const std::string dir = source_dir() + "/" + g["model_dir"].get<std::string>();
  // The GPU machine gets a subset of models/ (the device tool's transfer limit): say so, honestly.
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << dir << " is not on this machine";
  auto m = load(dir, std::nullopt, true);
  const int64_t V = m->config().vocab_size;
  for (const auto& p : g["prompts"]) {
    SCOPED_TRACE(p["name"].get<std::string>());
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    auto cache = m->make_cache(int64_t(ids.size()) + 40, 1);
    std::vector<float> logits;
    m->forward({{0, ids.data(), int64_t(ids.size()), false}}, cache, logits);
    const auto& ref = p["last_logits"];
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double r = ref[size_t(i)].get<double>();
      ASSERT_TRUE(std::isfinite(logits[size_t(i)])) << "logit " << i;
      max_ref = std::max(max_ref, std::abs(r));
      max_diff = std::max(max_diff, std::abs(double(logits[size_t(i)]) - r));
    }
    EXPECT_LE(max_diff, 0.02 * max_ref) << "max |Δlogit| " << max_diff << " vs max |logit| " << max_ref;
    const auto greedy = p["greedy_ids"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    int32_t next = int32_t(argmax(logits.data(), V));
    for (size_t s = 0; s < greedy.size(); ++s) {
      if (margins[s] < kNearTie) break;
      ASSERT_EQ(next, greedy[s]) << "greedy step " << s << " (oracle margin " << margins[s] << ")";
      m->forward({{0, &next, 1, false}}, cache, logits);
      next = int32_t(argmax(logits.data(), V));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaGolden, ::testing::ValuesIn(golden_files()), param_name);

// Every mode on the GPU against the same mode on the CPU: the embedded model's held-out text.
class CudaModeVsCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModeVsCpu, PerplexityLogitsAndGreedyMatchCpu) {
  REQUIRE_DEVICE();
  const auto mode = quant::parse_quant_mode(GetParam());
  ASSERT_TRUE(mode);
  const std::string dir = source_dir() + "/models/perry-qwen3-20m";
  auto cpu = load(dir, mode, false);
  auto gpu = load(dir, mode, true);
  auto tok = tokenizer::Tokenizer::from_file(dir + "/tokenizer.json");
  auto ids = tok.encode(read_text_file(source_dir() + "/tests/data/heldout.txt"), false);
  ids.resize(std::min<size_t>(ids.size(), 8192));
  const auto pc = runtime::perplexity(*cpu, ids, 512, 512);
  const auto pg = runtime::perplexity(*gpu, ids, 512, 512);
  std::printf("[cuda-vs-cpu] %s: ppl cpu %.4f gpu %.4f (%+.3f%%) over %lld tokens\n", GetParam().c_str(), pc.ppl,
              pg.ppl, 100.0 * (pg.ppl / pc.ppl - 1.0), (long long)pc.scored_tokens);
  EXPECT_EQ(pg.scored_tokens, pc.scored_tokens);
  EXPECT_NEAR(pg.ppl, pc.ppl, 0.005 * pc.ppl);

  // A prompt's logits and a 24-token greedy continuation.
  const int64_t V = cpu->config().vocab_size;
  std::vector<int32_t> prompt(ids.begin() + 100, ids.begin() + 160);
  auto cc = cpu->make_cache(128, 1), gc = gpu->make_cache(128, 1);
  std::vector<float> lc, lg;
  cpu->forward({{0, prompt.data(), int64_t(prompt.size()), false}}, cc, lc);
  gpu->forward({{0, prompt.data(), int64_t(prompt.size()), false}}, gc, lg);
  for (int step = 0; step < 24; ++step) {
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_ref = std::max(max_ref, double(std::abs(lc[size_t(i)])));
      max_diff = std::max(max_diff, double(std::abs(lc[size_t(i)] - lg[size_t(i)])));
    }
    ASSERT_LE(max_diff, 0.03 * max_ref) << "step " << step << ": max |Δlogit| " << max_diff;
    const int32_t nc = int32_t(argmax(lc.data(), V)), ng = int32_t(argmax(lg.data(), V));
    if (margin(lc.data(), V) < kNearTie * max_ref) break;
    ASSERT_EQ(ng, nc) << "greedy step " << step;
    cpu->forward({{0, &nc, 1, false}}, cc, lc);
    gpu->forward({{0, &ng, 1, false}}, gc, lg);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaModeVsCpu,
                         ::testing::Values("bf16", "w8a16", "w4a16", "w8a8", "w8a8-g128", "w8a8-g64", "w4a8",
                                           "w4a8-g128", "w8a8-fp8"),
                         param_name);

// Several sequences of different lengths in one forward equal each sequence alone (prefill),
// then one batched decode step over all slots equals single-slot decode steps.
TEST(CudaBatch, BatchedEqualsSingleSequence) {
  REQUIRE_DEVICE();
  // (w8a8-g128: its 4-sequence decode step runs gemm_small_m_wgmma on sm_90, the LM head included;
  // w8a8: its wide layers gemm_w8a8_wgmma with split-K.)
  for (const char* mode : {"bf16", "w8a8", "w4a8-g128", "w8a8-g128"}) {
    SCOPED_TRACE(mode);
    auto m = load(source_dir() + "/models/perry-qwen3-20m", quant::parse_quant_mode(mode), true);
    const int64_t V = m->config().vocab_size;
    std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5, 6, 7}, {100}, {}, {}};
    seqs[2].resize(77);
    seqs[3].resize(130);
    for (size_t i = 0; i < seqs[2].size(); ++i) seqs[2][i] = int32_t((i * 37 + 11) % V);
    for (size_t i = 0; i < seqs[3].size(); ++i) seqs[3][i] = int32_t((i * 101 + 5) % V);
    const int64_t n = int64_t(seqs.size());
    auto batched = m->make_cache(256, n), single = m->make_cache(256, n);
    std::vector<model::SeqInput> in;
    for (int64_t s = 0; s < n; ++s) in.push_back({s, seqs[size_t(s)].data(), int64_t(seqs[size_t(s)].size()), false});
    std::vector<float> lb, ls;
    m->forward(in, batched, lb);
    ASSERT_EQ(lb.size(), size_t(n * V));
    std::vector<int32_t> next_tok(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) {
      m->forward({in[size_t(s)]}, single, ls);
      // Same tokens, same kernels; only the row blocking of the GEMMs differs (M changes): a few
      // ulp of bf16/int8 rounding, not a different model.
      double max_ref = 0, max_diff = 0;
      for (int64_t i = 0; i < V; ++i) {
        max_ref = std::max(max_ref, double(std::abs(ls[size_t(i)])));
        max_diff = std::max(max_diff, double(std::abs(ls[size_t(i)] - lb[size_t(s * V + i)])));
      }
      EXPECT_LE(max_diff, 0.01 * max_ref) << "sequence " << s;
      next_tok[size_t(s)] = int32_t(argmax(ls.data(), V));
    }
    std::vector<model::SeqInput> dec;
    for (int64_t s = 0; s < n; ++s) dec.push_back({s, &next_tok[size_t(s)], 1, false});
    m->forward(dec, batched, lb);
    for (int64_t s = 0; s < n; ++s) {
      m->forward({dec[size_t(s)]}, single, ls);
      double max_ref = 0, max_diff = 0;
      for (int64_t i = 0; i < V; ++i) {
        max_ref = std::max(max_ref, double(std::abs(ls[size_t(i)])));
        max_diff = std::max(max_diff, double(std::abs(ls[size_t(i)] - lb[size_t(s * V + i)])));
      }
      EXPECT_LE(max_diff, 0.01 * max_ref) << "decode, sequence " << s;
    }
  }
}

// A greedy token `got` from the GPU against greedy_token of the logits row fed the same context:
// equal, or a near tie (top-2 within 1e-5 of the row's scale: two runs' split-K sums may round apart).
static void expect_greedy_pick(const float* row, int64_t V, int32_t got, const std::string& where) {
  ASSERT_TRUE(got >= 0 && got < V) << where;
  const int32_t want = model::greedy_token(row, V);
  if (got == want) return;
  double scale = 0;
  for (int64_t i = 0; i < V; ++i) scale = std::max(scale, double(std::abs(row[i])));
  EXPECT_LE(double(row[want]) - double(row[got]), 1e-5 * scale) << where;
}

// The cases of the greedy tests: bf16 and w4a8-g128 (the embedded model), one sequence and two.
static void for_greedy_cases(const std::function<void(model::Model&, int)>& body) {
  for (const char* mode : {"bf16", "w4a8-g128"})
    for (int n : {1, 2}) {
      SCOPED_TRACE(std::string(mode) + " sequences=" + std::to_string(n));
      auto m = load(source_dir() + "/models/perry-qwen3-20m", quant::parse_quant_mode(mode), true);
      body(*m, n);
    }
}

// forward_greedy on the GPU (argmax_rows in the step, its own decode graph) picks
// model::greedy_token of the logits forward() returns for the same step: one sequence (the fused
// decode path) and two (the batched path), prefill then 8 decode steps with graphs recorded for
// both outputs. Two caches fed the same tokens; a near tie (top-2 within 1e-5 of the scale: two
// runs' split-K sums may round apart) may pick either of the tied tokens.
TEST(CudaBatch, ForwardGreedyMatchesTheLogits) {
  REQUIRE_DEVICE();
  for_greedy_cases([](model::Model& m, int n) {
    const int64_t V = m.config().vocab_size;
    auto ca = m.make_cache(128, n), cb = m.make_cache(128, n);
    std::vector<std::vector<int32_t>> prompts = {{3, 14, 15, 92, 65}, {27, 18}};
    std::vector<model::SeqInput> in;
    for (int s = 0; s < n; ++s) in.push_back({s, prompts[size_t(s)].data(), int64_t(prompts[size_t(s)].size()), false});
    std::vector<float> logits;
    std::vector<int32_t> picked, feed(static_cast<size_t>(n));
    m.forward(in, ca, logits);
    m.forward_greedy(in, cb, picked);
    for (int step = 0; step <= 8; ++step) {
      ASSERT_EQ(picked.size(), size_t(n));
      for (int s = 0; s < n; ++s) {
        expect_greedy_pick(logits.data() + s * V, V, picked[size_t(s)],
                           "step " + std::to_string(step) + " sequence " + std::to_string(s));
        feed[size_t(s)] = picked[size_t(s)];
      }
      if (step == 8) break;
      std::vector<model::SeqInput> dec;
      for (int s = 0; s < n; ++s) dec.push_back({s, &feed[size_t(s)], 1, false});
      m.forward(dec, ca, logits);
      m.forward_greedy(dec, cb, picked);
    }
  });
}

// decode_greedy on the GPU (each step's argmax feeds the next step on the device, the next step
// enqueued before the host has this one's tokens): every token it returns is the greedy pick of
// forward()'s logits for the same context, fed step by step to a second cache (a near tie, top-2
// within 1e-5 of the scale, may pick either). One sequence (the fused decode path) and two of
// different lengths (the batched path); the longer crosses the 256-position graph bucket mid-run;
// the run is stopped after 5 steps (the steps enqueued ahead are dropped) and resumed. With the
// default 4 steps a launch (each step's argmax writing the next one's token and embedding row),
// one a launch (PERRY_DECODE_GRAPH_STEPS=1) and 3 (launches of 3 + 3 + 1 steps, and a stop inside
// the second launch).
TEST(CudaBatch, DecodeGreedyFeedsTheStepsOnTheDevice) {
  REQUIRE_DEVICE();
  for (const char* steps : {"", "1", "3"}) {
    SCOPED_TRACE(std::string("PERRY_DECODE_GRAPH_STEPS=") + steps);
    if (*steps) setenv("PERRY_DECODE_GRAPH_STEPS", steps, 1);
    else unsetenv("PERRY_DECODE_GRAPH_STEPS");
    for_greedy_cases([](model::Model& m, int n) {
      const int64_t V = m.config().vocab_size;
      auto ca = m.make_cache(512, n), cb = m.make_cache(512, n);
      std::vector<std::vector<int32_t>> prompts(2);
      for (int i = 0; i < 250; ++i) prompts[0].push_back(int32_t((i * 7919 + 13) % V));
      prompts[1] = {27, 18, 5};
      std::vector<model::SeqInput> in;
      for (int s = 0; s < n; ++s) in.push_back({s, prompts[size_t(s)].data(), int64_t(prompts[size_t(s)].size()), false});
      std::vector<int32_t> first;
      m.forward_greedy(in, cb, first);
      std::vector<std::vector<int32_t>> got;
      auto run = [&](const std::vector<int32_t>& from, int64_t steps, size_t stop_at) {
        std::vector<int32_t> t = from;
        std::vector<model::SeqInput> dec;
        for (int s = 0; s < n; ++s) dec.push_back({s, &t[size_t(s)], 1, false});
        return m.decode_greedy(dec, cb, steps, [&](const std::vector<int32_t>& tok) {
          got.push_back(tok);
          EXPECT_EQ(cb.length(0), int64_t(prompts[0].size() + got.size()));
          return got.size() < stop_at;
        });
      };
      EXPECT_EQ(run(first, 12, 5), 5);
      EXPECT_EQ(run(got.back(), 7, 99), 7);
      ASSERT_EQ(got.size(), size_t(12));
      // The oracle: forward() fed the same tokens, step by step.
      std::vector<float> logits;
      m.forward(in, ca, logits);
      std::vector<int32_t> fed = first;
      for (size_t step = 0; step < got.size(); ++step) {
        std::vector<model::SeqInput> dec;
        for (int s = 0; s < n; ++s) dec.push_back({s, &fed[size_t(s)], 1, false});
        m.forward(dec, ca, logits);
        for (int s = 0; s < n; ++s)
          expect_greedy_pick(logits.data() + s * V, V, got[step][size_t(s)],
                             "step " + std::to_string(step) + " sequence " + std::to_string(s));
        fed = got[step];
      }
    });
  }
  unsetenv("PERRY_DECODE_GRAPH_STEPS");
}

TEST(CudaErrors, ContextOverflowAndOutOfMemoryAreErrors) {
  REQUIRE_DEVICE();
  auto m = load(source_dir() + "/models/perry-qwen3-20m", std::nullopt, true);
  std::vector<int32_t> t(40, 5);
  auto small = m->make_cache(16, 1);
  std::vector<float> logits;
  EXPECT_THROW(m->forward({{0, t.data(), 40, false}}, small, logits), Error);
  // A KV cache far beyond the GPU's memory: a clear error naming what was asked.
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  const auto& c = m->config();
  const double per_slot = double(c.num_layers * c.kv_dim() * 2 * 2) * double(c.max_position_embeddings);
  const int64_t slots = int64_t(double(total_b) * 2 / per_slot) + 1;
  auto huge = m->make_cache(c.max_position_embeddings, slots);
  try {
    m->forward({{0, t.data(), 4, false}}, huge, logits);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory"), std::string::npos) << e.what();
  }
  // The backend is still usable afterwards.
  auto ok = m->make_cache(64, 1);
  m->forward({{0, t.data(), 8, false}}, ok, logits);
  EXPECT_TRUE(std::isfinite(logits[0]));
}

// Sets (value) or removes (nullptr) an environment variable for its lifetime, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A prompt and 8 greedy one-token steps on the GPU: every step's logits, concatenated.
std::vector<float> decode_logits(const std::string& dir, const char* mode) {
  auto m = load(dir, quant::parse_quant_mode(mode), true);
  auto cache = m->make_cache(64, 1);
  std::vector<int32_t> prompt = {1, 17, 42, 99, 7, 30, 12, 5};
  std::vector<float> logits, all;
  m->forward({{0, prompt.data(), int64_t(prompt.size()), false}}, cache, logits);
  for (int step = 0; step < 8; ++step) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    m->forward({{0, &next, 1, false}}, cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// The toggle tests' models that are present (the GPU transfer may leave some behind): the
// embedded perry-qwen3-20m (hd 64, q/k norm), tiny-random-llama and tiny-random-qwen2 (hd 16,
// q|k|v bias).
std::vector<std::string> toggle_models(const char* tag) {
  std::vector<std::string> dirs;
  for (const char* name : {"perry-qwen3-20m", "tiny-random-llama", "tiny-random-qwen2"}) {
    const std::string dir = source_dir() + "/models/" + name;
    if (std::filesystem::exists(dir + "/config.json")) dirs.push_back(dir);
    else std::printf("[%s] %s not present (the GPU transfer may leave it behind): skipped\n", tag, name);
  }
  return dirs;
}

// Logits of every row of a 300-token prompt (several 64- and 128-row attention tiles, a
// partial last tile), then of one 20-token chunk on top of it (pos0 > 0).
std::vector<float> prefill_logits(const std::string& dir, const char* mode) {
  auto m = load(dir, quant::parse_quant_mode(mode), true);
  auto cache = m->make_cache(512, 1);
  std::mt19937 gen(3);
  std::vector<int32_t> prompt(320);
  for (auto& t : prompt) t = int32_t(gen() % uint32_t(m->config().vocab_size));
  std::vector<float> logits, all;
  m->forward({{0, prompt.data(), 300, true}}, cache, logits);
  all = logits;
  m->forward({{0, prompt.data() + 300, 20, true}}, cache, logits);
  all.insert(all.end(), logits.begin(), logits.end());
  return all;
}

// ‖got − ref‖ / ‖ref‖ over two logit vectors of the same length (and ‖ref‖ > 0).
double logits_rel_l2(const std::vector<float>& ref, const std::vector<float>& got) {
  EXPECT_EQ(ref.size(), got.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  EXPECT_GT(den, 0.0);
  return std::sqrt(num / den);
}

// The prefill path's toggles: PERRY_PREFILL_SEPARATE=1 (split_qkv, rope_apply, kv_cache_append,
// an fp32 attention output and a conversion pass) gives the same logits bit for bit as the fused
// path (rope_append_qkv, attention reading q in place and writing the bf16 / fp32 linear input)
// with each attention kernel; the 64- and 128-row kernels (PERRY_PREFILL_ATTN) agree to the
// rounding of their exponentials (relative L2 < 1e-2: a flipped int8 rounding of an activation
// moves w8a8 logits more than bf16 ones; a masking or row error moves them by O(1)).
// perry-qwen3-20m has hd 64 (tensor cores, q/k norm); the tiny models hd 16 (the fp32 kernel).
TEST(CudaPrefillToggles, GiveTheSameLogits) {
  REQUIRE_DEVICE();
  const std::vector<std::string> dirs = toggle_models("prefill-toggles");
  for (const std::string& dir : dirs) {
    const std::string name = std::filesystem::path(dir).filename().string();
    for (const char* mode : {"bf16", "w8a8", "w4a8-g128"}) {
      std::vector<float> by_kernel[2];
      for (int k = 0; k < 2; ++k) {
        const ScopedEnv attn("PERRY_PREFILL_ATTN", k == 0 ? "64" : "128");
        std::vector<float> fused, separate;
        {
          const ScopedEnv sep("PERRY_PREFILL_SEPARATE", nullptr);
          fused = prefill_logits(dir, mode);
        }
        {
          const ScopedEnv sep("PERRY_PREFILL_SEPARATE", "1");
          separate = prefill_logits(dir, mode);
        }
        EXPECT_EQ(fused, separate) << name << " " << mode << " rows " << (k == 0 ? 64 : 128);
        by_kernel[k] = fused;
      }
      const double rel = logits_rel_l2(by_kernel[0], by_kernel[1]);
      std::printf("[prefill-toggles] %s %s: 64- vs 128-row attention, logits rel L2 %.3g\n", name.c_str(), mode, rel);
      EXPECT_LT(rel, 1e-2) << name << " " << mode;
    }
  }
  EXPECT_GE(dirs.size(), 1u);
}

// Prefill's bf16 intermediates (the defaults: bf16 output where the kernel has one — cuBLAS, the
// tensor-core GEMMs — else rounded by the consumer) against their fp32 switches, one at a time:
// gate|up (PERRY_GATE_UP_F32=1), the residual deltas of o_proj / down_proj (PERRY_DELTA_F32=1)
// and q|k|v (PERRY_QKV_F32=1).
// Logits move by about a bf16 rounding of those values — rel L2 < 5e-3 in bf16; < 2e-2 in the
// W*A8 modes, whose per-token int8 rounding of the next input turns some of those roundings into
// whole int8 steps on these tiny models (gate|up, first GPU run: 0.012 on tiny-random-llama,
// 0.0077 on the embedded model) — while a wrong layout or a missed row would move them by O(1).
// The 300-token prompt takes the bf16 outputs, the 20-token chunk the fp32 small-M kernels
// (W*A8): both here.
TEST(CudaPrefillToggles, Bf16IntermediatesMatchF32) {
  REQUIRE_DEVICE();
  const std::vector<std::string> dirs = toggle_models("bf16-intermediates");
  for (const char* sw : {"PERRY_GATE_UP_F32", "PERRY_DELTA_F32", "PERRY_QKV_F32"})
    for (const std::string& dir : dirs) {
      const std::string name = std::filesystem::path(dir).filename().string();
      for (const char* mode : {"bf16", "w8a8", "w4a8-g128"}) {
        std::vector<float> b16, f32;
        {
          const ScopedEnv f(sw, nullptr);
          b16 = prefill_logits(dir, mode);
        }
        {
          const ScopedEnv f(sw, "1");
          f32 = prefill_logits(dir, mode);
        }
        const double rel = logits_rel_l2(f32, b16);
        std::printf("[bf16-intermediates] %s %s %s: bf16 vs fp32, logits rel L2 %.3g\n", sw, name.c_str(), mode, rel);
        EXPECT_GT(rel, 0.0) << sw << " " << name << " " << mode << ": the switch changed nothing";
        EXPECT_LT(rel, std::string(mode) == "bf16" ? 5e-3 : 2e-2) << sw << " " << name << " " << mode;
      }
    }
  EXPECT_GE(dirs.size(), 1u);
}

// The wgmma prefill attention (hd 128 on sm_90, the default there for long prompts) inside the
// model: synthetic qwen3-0.6b (hd 128, q/k norm, GQA 16/8). Its logits agree with the 128-row
// mma.sync kernel's to the rounding of the exponentials (first GPU run: bf16 bit for bit), and
// in bf16 the separate q|k|v path gives the same bits as the fused one with it too. (w8a8 is not
// bitwise repeatable here: the 20-token chunk's linears take gemm_small_m, whose split-K adds
// partials with atomicAdd at this width — so only the tolerance there.)
TEST(CudaPrefillToggles, WgmmaAttentionHd128) {
  REQUIRE_DEVICE();
  if (!cuda::attention_prefill_wgmma_supported(128)) GTEST_SKIP() << "not an sm_90 device: the wgmma attention is not used";
  for (const char* mode : {"bf16", "w8a8"}) {
    std::vector<float> rows128, wg, wg_separate;
    {
      const ScopedEnv attn("PERRY_PREFILL_ATTN", "128");
      rows128 = prefill_logits("synthetic:qwen3-0.6b", mode);
    }
    {
      const ScopedEnv attn("PERRY_PREFILL_ATTN", "wgmma");
      wg = prefill_logits("synthetic:qwen3-0.6b", mode);
      const ScopedEnv sep("PERRY_PREFILL_SEPARATE", "1");
      wg_separate = prefill_logits("synthetic:qwen3-0.6b", mode);
    }
    if (std::string(mode) == "bf16") {
      EXPECT_EQ(wg, wg_separate) << mode;
    }
    const double rel = logits_rel_l2(rows128, wg), rel_sep = logits_rel_l2(wg, wg_separate);
    std::printf("[prefill-toggles] synthetic qwen3-0.6b %s: 128-row vs wgmma attention, logits rel L2 %.3g "
                "(wgmma fused vs separate %.3g)\n", mode, rel, rel_sep);
    EXPECT_LT(rel, 1e-2) << mode;
    EXPECT_LT(rel_sep, 1e-2) << mode;
  }
}

// The one-token decode path's A/B toggles give the same logits bit for bit as its plainest form
// (register weight loads, RoPE in its own kernel): RoPE + KV append in the q|k|v epilogue (the
// default; PERRY_DECODE_ROPE_IN_QKV=0 turns it off: the same operations on the same values) and
// PERRY_GEMV_DECODE_STAGES (weights by bulk copy; unset = the kernel's choice, bulk for bf16 and
// the grouped kinds; each lane reads the same chunks in the same order either way). The embedded
// model has q/k norm (RoPE stays separate there); tiny-random-llama and tiny-random-qwen2 (q|k|v
// bias) take the fused RoPE.
TEST(CudaDecodeToggles, GiveTheSameLogits) {
  REQUIRE_DEVICE();
  const ScopedEnv keep_fused("PERRY_NO_FUSED_DECODE", nullptr);
  const std::vector<std::string> dirs = toggle_models("decode-toggles");
  for (const std::string& dir : dirs) {
    const std::string name = std::filesystem::path(dir).filename().string();
    for (const char* mode : {"bf16", "w8a8", "w4a8-g128"}) {
      std::vector<float> base;
      {
        const ScopedEnv rope("PERRY_DECODE_ROPE_IN_QKV", "0"), stages("PERRY_GEMV_DECODE_STAGES", "0");
        base = decode_logits(dir, mode);
      }
      const struct {
        const char *rope, *stages;
      } toggles[] = {{nullptr, "0"}, {"0", nullptr}, {"0", "2"}, {nullptr, "4"}, {nullptr, nullptr}};
      for (const auto& t : toggles) {
        const ScopedEnv rope("PERRY_DECODE_ROPE_IN_QKV", t.rope), stages("PERRY_GEMV_DECODE_STAGES", t.stages);
        EXPECT_EQ(decode_logits(dir, mode), base) << name << " " << mode << " rope=" << (t.rope ? t.rope : "-")
                                                  << " stages=" << (t.stages ? t.stages : "-");
      }
    }
  }
  EXPECT_GE(dirs.size(), 1u);
}
