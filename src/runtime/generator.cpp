#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace perry::runtime {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length: return "length";
    case FinishReason::Eos: return "stop";
    case FinishReason::StopString: return "stop";
    case FinishReason::ContextFull: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

std::string StopStringFilter::push(const std::string& text, bool* stopped) {
  *stopped = false;
  pending_ += text;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    size_t p = pending_.find(s);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); n > keep; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopStringFilter::flush() { return std::exchange(pending_, std::string()); }

GenerateStats generate(model::Model& model, const tokenizer::Tokenizer& tok, model::KvCache& cache, int64_t slot,
                       const std::vector<int32_t>& prompt, const GenerateOptions& opts, const TextCallback& on_text) {
  PERRY_CHECK(!prompt.empty(), "the prompt is empty (it encodes to no tokens)");
  const int64_t vocab = model.config().vocab_size;
  for (int32_t id : prompt) PERRY_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary (0..{})", id, vocab - 1);
  if (int64_t(prompt.size()) >= cache.capacity())
    fail("the prompt is {} tokens but the context holds {}: shorten it or raise --ctx (the model allows up to {})",
         prompt.size(), cache.capacity(), model.config().max_position_embeddings);
  cache.reset(slot);
  GenerateStats st;
  st.prompt_tokens = int64_t(prompt.size());
  Sampler sampler(opts.sampling);
  std::vector<int32_t> history = prompt;
  std::vector<float> logits;
  tokenizer::StreamDecoder dec(tok, true);
  StopStringFilter stops(opts.stop_strings);

  auto step = [&](const int32_t* tokens, int64_t n) {
    return forward_and_pick(model, {slot, tokens, n, false}, cache, sampler, history, logits);
  };
  const double t0 = now_s();
  int32_t next = 0;
  for (size_t b = 0; b < prompt.size(); b += size_t(opts.prefill_chunk))
    next = step(prompt.data() + b, std::min<int64_t>(opts.prefill_chunk, int64_t(prompt.size() - b)));
  const double t1 = now_s();
  st.ttft_s = st.prefill_s = t1 - t0;

  auto is_eos = [&](int32_t id) { return std::find(opts.eos_ids.begin(), opts.eos_ids.end(), id) != opts.eos_ids.end(); };
  st.finish = FinishReason::Length;
  // One picked token: streamed, and whether to go on (else st.finish says why not).
  auto take = [&](int32_t id) {
    if (is_eos(id)) {
      st.finish = FinishReason::Eos;
      return false;
    }
    st.tokens.push_back(id);
    history.push_back(id);
    ++st.generated_tokens;
    bool stopped = false;
    std::string text = stops.push(dec.push(id), &stopped);
    if (!text.empty() && on_text && !on_text(text)) {
      st.finish = FinishReason::Cancelled;
      return false;
    }
    if (stopped) {
      st.finish = FinishReason::StopString;
      return false;
    }
    if (st.generated_tokens >= opts.max_new_tokens) return false;
    if (cache.length(slot) + 1 > cache.capacity()) {
      st.finish = FinishReason::ContextFull;
      return false;
    }
    return true;
  };
  // Each step feeds one token, so max_new_tokens and the context bound the steps.
  if (opts.max_new_tokens > 0 && take(next))
    decode_steps(model, cache, slot, next,
                 std::min(opts.max_new_tokens - st.generated_tokens, cache.capacity() - cache.length(slot)), sampler,
                 history, logits, take);
  if (st.finish != FinishReason::StopString && st.finish != FinishReason::Cancelled) {
    bool stopped = false;
    std::string tail = stops.push(dec.flush(), &stopped);
    tail += stopped ? "" : stops.flush();
    if (!tail.empty() && on_text) on_text(tail);
  }
  st.decode_s = now_s() - t1;
  return st;
}

int32_t forward_and_pick(model::Model& model, const model::SeqInput& in, model::KvCache& cache, Sampler& sampler,
                         const std::vector<int32_t>& history, std::vector<float>& logits) {
  if (sampler.picks_greedy()) {
    std::vector<int32_t> picked;
    model.forward_greedy({in}, cache, picked);
    return picked[0];
  }
  model.forward({in}, cache, logits);
  return sampler.sample(logits.data(), model.config().vocab_size, history);
}

int64_t decode_steps(model::Model& model, model::KvCache& cache, int64_t slot, int32_t first, int64_t max_steps,
                     Sampler& sampler, const std::vector<int32_t>& history, std::vector<float>& logits,
                     const std::function<bool(int32_t)>& take) {
  if (max_steps <= 0) return 0;
  if (sampler.picks_greedy())
    return model.decode_greedy({{slot, &first, 1, false}}, cache, max_steps,
                               [&](const std::vector<int32_t>& picked) { return take(picked[0]); });
  int64_t n = 0;
  for (int32_t next = first; n < max_steps;) {
    next = forward_and_pick(model, {slot, &next, 1, false}, cache, sampler, history, logits);
    ++n;
    if (!take(next)) break;
  }
  return n;
}

PerplexityResult perplexity(model::Model& model, const std::vector<int32_t>& ids, int64_t ctx, int64_t stride,
                            const std::function<void(int64_t, int64_t)>& progress) {
  PERRY_CHECK(ctx >= 2, "--ctx must be at least 2, got {}", ctx);
  PERRY_CHECK(stride >= 1 && stride <= ctx, "--stride must be in 1..ctx ({}), got {}", ctx, stride);
  const int64_t N = int64_t(ids.size());
  PERRY_CHECK(N >= ctx || (stride < ctx && N >= 2),
              "the text has {} tokens, fewer than one window of --ctx {}: use a longer text or a smaller --ctx", N, ctx);
  // Window list: (begin, end, first scored position inside the window).
  struct Win { int64_t begin, end, first_scored; };
  std::vector<Win> wins;
  if (stride == ctx) {
    for (int64_t i = 0; (i + 1) * ctx <= N; ++i) wins.push_back({i * ctx, (i + 1) * ctx, 1});
  } else {
    int64_t prev_end = 0;
    for (int64_t begin = 0;; begin += stride) {
      const int64_t end = std::min(begin + ctx, N);
      const int64_t trg = end - prev_end;
      wins.push_back({begin, end, std::max<int64_t>(1, (end - begin) - trg)});
      prev_end = end;
      if (end == N) break;
    }
  }
  model::KvCache cache = model.make_cache(ctx, 1);
  PerplexityResult r;
  r.total_tokens = N;
  const int64_t vocab = model.config().vocab_size;
  std::vector<float> logits;
  const double t0 = now_s();
  for (size_t w = 0; w < wins.size(); ++w) {
    const Win& win = wins[w];
    cache.reset(0);
    const int64_t T = win.end - win.begin;
    model.forward({{0, ids.data() + win.begin, T, true}}, cache, logits);
    for (int64_t t = win.first_scored; t < T; ++t) {
      // NLL of ids[begin + t] from the logits at position t - 1, in float64.
      const float* row = logits.data() + (t - 1) * vocab;
      double mx = row[0];
      for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, double(row[i]));
      double sum = 0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - mx);
      r.nll_sum += (mx + std::log(sum)) - double(row[ids[size_t(win.begin + t)]]);
      ++r.scored_tokens;
    }
    ++r.windows;
    if (progress) progress(int64_t(w + 1), int64_t(wins.size()));
  }
  r.seconds = now_s() - t0;
  r.ppl = std::exp(r.nll_sum / double(r.scored_tokens));
  return r;
}

}  // namespace perry::runtime
