// The generation loop: chunked prefill of the prompt, then one decode step per token, streaming
// complete UTF-8 text, stopping on eos ids, stop strings or the token limit.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace perry::runtime {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  std::vector<std::string> stop_strings;
  int64_t prefill_chunk = 512;  // bounds activation memory for long prompts
};

enum class FinishReason { Length, Eos, StopString, ContextFull, Cancelled };
std::string_view finish_reason_name(FinishReason r);  // OpenAI names: "length", "stop", ...

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double ttft_s = 0, prefill_s = 0, decode_s = 0;
  FinishReason finish = FinishReason::Length;
  std::vector<int32_t> tokens;  // generated ids (without the stop token)
  double prefill_tok_s() const { return prefill_s > 0 ? double(prompt_tokens) / prefill_s : 0; }
  // Decode rate over the tokens after the first (the first comes out of prefill).
  double decode_tok_s() const { return decode_s > 0 && generated_tokens > 1 ? double(generated_tokens - 1) / decode_s : 0; }
};

// Streams text: on_text(piece) is called with complete UTF-8; return false to cancel.
using TextCallback = std::function<bool(const std::string&)>;

// One forward pass of `in` and the pick of its next token: greedy picks (Sampler::picks_greedy) go
// through Model::forward_greedy, so a device backend picks where the logits are and returns a token
// id; other samplers take the logits row to the host (`logits` is scratch). `history` feeds the
// repetition penalty.
int32_t forward_and_pick(model::Model& model, const model::SeqInput& in, model::KvCache& cache, Sampler& sampler,
                         const std::vector<int32_t>& history, std::vector<float>& logits);

// The decode steps after `first` (a token already taken) of the sequence in `slot`: up to
// max_steps steps, each one's token handed to take(), which returns false to stop. Greedy samplers
// run them as one Model::decode_greedy run (on a GPU the steps go back to back, the host not
// between them); others step by step through forward_and_pick. Returns the steps taken.
int64_t decode_steps(model::Model& model, model::KvCache& cache, int64_t slot, int32_t first, int64_t max_steps,
                     Sampler& sampler, const std::vector<int32_t>& history, std::vector<float>& logits,
                     const std::function<bool(int32_t)>& take);

// Runs one sequence in `slot` of `cache` (reset first). Throws perry::Error if the prompt does not
// fit the context.
GenerateStats generate(model::Model& model, const tokenizer::Tokenizer& tok, model::KvCache& cache, int64_t slot,
                       const std::vector<int32_t>& prompt, const GenerateOptions& opts, const TextCallback& on_text);

// Holds back text that might be the start of a stop string, so a stop string is never streamed.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what can be emitted now. Sets *stopped when a stop string completed (the
  // returned text then ends right before it).
  std::string push(const std::string& text, bool* stopped);
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

struct PerplexityResult {
  double ppl = 0, nll_sum = 0;
  int64_t scored_tokens = 0, windows = 0, total_tokens = 0;
  double seconds = 0;
};

// perplexity = exp(mean NLL). stride == ctx: non-overlapping windows [i·ctx, (i+1)·ctx), the
// trailing partial window dropped, positions 1..ctx-1 of each window scored. stride < ctx: the
// Hugging Face sliding-window recipe (each token scored once, with up to ctx-1 tokens of context).
// Exactly the windowing of tools/gpu (the transformers goldens).
PerplexityResult perplexity(model::Model& model, const std::vector<int32_t>& ids, int64_t ctx, int64_t stride,
                            const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace perry::runtime
