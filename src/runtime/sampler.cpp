#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/model.h"

namespace perry::runtime {

void validate_sampling(const SamplingParams& p) {
  PERRY_CHECK(p.temperature >= 0 && std::isfinite(p.temperature), "--temp must be >= 0, got {}", p.temperature);
  PERRY_CHECK(p.top_k >= 0, "--top-k must be >= 0, got {}", p.top_k);
  PERRY_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got {}", p.top_p);
  PERRY_CHECK(p.min_p >= 0 && p.min_p < 1, "--min-p must be in [0, 1), got {}", p.min_p);
  PERRY_CHECK(p.repetition_penalty > 0 && std::isfinite(p.repetition_penalty),
              "--repeat-penalty must be > 0, got {}", p.repetition_penalty);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate_sampling(p); }

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (p_.repetition_penalty != 1.0) {
    // Each distinct previous token is penalised once (as transformers does).
    std::vector<int32_t> seen(history);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float rp = float(p_.repetition_penalty);
    for (int32_t id : seen)
      if (id >= 0 && id < vocab) logits[id] = logits[id] > 0 ? logits[id] / rp : logits[id] * rp;
  }
  if (p_.temperature <= 0.0) return model::greedy_token(logits, vocab);  // first maximum, as torch.argmax
  // The HF order of warpers: temperature → top-k → top-p → min-p.
  const float inv_t = float(1.0 / p_.temperature);
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i] * inv_t, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the survivors.
  const float mx = cand_[0].first;
  std::vector<double> prob(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(cand_[i].first - mx));
  for (double& x : prob) x /= sum;
  if (p_.top_p < 1.0) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += prob[keep++];
      if (cum >= p_.top_p) break;
    }
    n = std::max<size_t>(1, keep);
  }
  if (p_.min_p > 0.0) {
    const double thresh = p_.min_p * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= thresh) ++keep;
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  std::uniform_real_distribution<double> U(0.0, total);
  double r = U(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace perry::runtime
