// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace perry::runtime {

struct SamplingParams {
  double temperature = 0.0;          // 0 = greedy (argmax)
  int64_t top_k = 0;                 // 0 = off
  double top_p = 1.0;                // 1 = off
  double min_p = 0.0;                // 0 = off
  double repetition_penalty = 1.0;   // 1 = off (HF semantics: divide positive logits, multiply negative)
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks the next token from logits (vocab wide). `history` = prompt + generated ids, for the
  // repetition penalty. The logits buffer is modified.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  const SamplingParams& params() const { return p_; }
  // Whether sample() is the greedy pick of the raw logits (temperature 0, no repetition penalty),
  // which Model::forward_greedy can then make on the device instead.
  bool picks_greedy() const { return p_.temperature <= 0.0 && p_.repetition_penalty == 1.0; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// Validates ranges and throws perry::Error with the flag name on bad values.
void validate_sampling(const SamplingParams& p);

}  // namespace perry::runtime
