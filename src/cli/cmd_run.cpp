// perry run: generate text from a prompt, streaming tokens, then report TTFT and tokens/s.
#include <chrono>
#include <cstdio>
#include <unistd.h>

#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "runtime/generator.h"
#include "tokenizer/chat_template.h"

namespace perry::cli {

namespace {
struct RunArgs {
  ModelArgs m;
  std::string prompt, file, system;
  int64_t n = 128, ctx = 0;
  bool chat = false, no_stats = false, raw = false;
  runtime::SamplingParams s;
  std::vector<std::string> stops;
  bool seed_given = false;
  int64_t prompt_tokens = 128;
};

// --synthetic: random weights have no tokenizer, so the prompt is random token ids and the
// output is reported as ids; what matters is the timing line.
int run_synthetic(RunArgs& a) {
  // Text the synthetic model could not read is an error, not silently replaced by random ids.
  if (!a.prompt.empty() || !a.file.empty() || a.chat || !a.system.empty())
    fail("--synthetic models have no tokenizer: --prompt, --file, --chat and --system need a checkpoint (-m DIR); "
         "give --prompt-tokens N for a random prompt of N tokens");
  PERRY_CHECK(a.prompt_tokens >= 1, "--prompt-tokens must be >= 1");
  LoadedModel lm = load_model(a.m, false);
  const auto& cfg = lm.model->config();
  std::vector<int32_t> prompt = random_token_ids(a.prompt_tokens, cfg.vocab_size, 12345);
  const int64_t ctx = a.ctx > 0 ? a.ctx : std::min<int64_t>(cfg.max_position_embeddings, a.prompt_tokens + a.n + 1);
  model::KvCache cache = lm.model->make_cache(ctx, 1);
  runtime::SamplingParams sp = a.s;
  runtime::Sampler sampler(sp);
  std::vector<float> logits;
  std::vector<int32_t> history = prompt;
  auto step = [&](const int32_t* tokens, int64_t n) {
    return runtime::forward_and_pick(*lm.model, {0, tokens, n, false}, cache, sampler, history, logits);
  };
  auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = lm.model->preferred_prefill_chunk();
  int32_t next = 0;
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk))
    next = step(prompt.data() + b, std::min<int64_t>(chunk, int64_t(prompt.size() - b)));
  auto t1 = std::chrono::steady_clock::now();
  std::printf("generated ids:");
  auto take = [&](int32_t id) {
    std::printf(" %d", id);
    std::fflush(stdout);
    history.push_back(id);
  };
  if (a.n > 0) {
    take(next);
    runtime::decode_steps(*lm.model, cache, 0, next, a.n - 1, sampler, history, logits, [&](int32_t id) {
      take(id);
      return true;
    });
  }
  auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count(), dec = std::chrono::duration<double>(t2 - t1).count();
  std::printf("\n");
  std::fprintf(stderr,
               "\n[perry] model %s (%s, %s)\n[perry] prompt %lld tokens | TTFT %.1f ms | prefill %.1f tok/s | "
               "generated %lld tokens | decode %.2f tok/s | peak RSS %.0f MiB\n",
               lm.source.c_str(), cfg.architecture_name.c_str(), std::string(quant::quant_mode_name(lm.model->mode())).c_str(),
               (long long)a.prompt_tokens, pre * 1e3, double(a.prompt_tokens) / pre, (long long)a.n,
               a.n > 1 ? double(a.n - 1) / dec : 0.0, peak_rss_mib());
  return 0;
}
}  // namespace

Command register_run(CLI::App& root) {
  auto* a = new RunArgs();
  CLI::App* app = root.add_subcommand("run", "Generate text from a prompt (streams tokens, then prints TTFT and tokens/s)");
  add_model_flags(app, &a->m);
  app->add_option("--prompt-tokens", a->prompt_tokens,
                  "With --synthetic: length of the random prompt in tokens (default 128)");
  app->add_option("-p,--prompt", a->prompt, "Prompt text (default: a short built-in prompt)");
  app->add_option("-f,--file", a->file, "Read the prompt from a file");
  app->add_option("-n,--max-tokens", a->n, "Maximum number of new tokens (default 128)");
  app->add_option("-c,--ctx", a->ctx, "Context length in tokens (default: min(4096, model maximum))");
  app->add_flag("--chat", a->chat, "Format the prompt as a user turn with the model's chat template");
  app->add_option("--system", a->system, "System prompt (with --chat)");
  app->add_option("--temp", a->s.temperature, "Sampling temperature; 0 = greedy (default 0)");
  app->add_option("--top-k", a->s.top_k, "Keep only the k most likely tokens (0 = off)");
  app->add_option("--top-p", a->s.top_p, "Nucleus sampling: smallest set with cumulative probability >= p (1 = off)");
  app->add_option("--min-p", a->s.min_p, "Drop tokens less likely than min-p times the most likely one (0 = off)");
  app->add_option("--repeat-penalty", a->s.repetition_penalty, "Repetition penalty (1 = off; HF semantics)");
  app->add_option("--seed", a->s.seed, "Random seed for sampling (default 0)");
  app->add_option("--stop", a->stops, "Stop when this string is generated (repeatable)");
  app->add_flag("--raw", a->raw, "Do not add the tokenizer's special tokens (e.g. BOS) to the prompt");
  app->add_flag("--no-stats", a->no_stats, "Do not print the timing summary");
  return {app, [a]() -> int {
    if (!a->prompt.empty() && !a->file.empty()) fail("give either -p TEXT or -f FILE, not both");
    std::string text = !a->file.empty() ? read_text_file(a->file)
                       : !a->prompt.empty() ? a->prompt
                                            : std::string("The ship sailed out of the harbor");
    runtime::validate_sampling(a->s);
    PERRY_CHECK(a->n >= 0, "-n must be >= 0");
    if (!a->m.synthetic.empty()) return run_synthetic(*a);
    LoadedModel lm = load_model(a->m, true);
    const auto& cfg = lm.model->config();
    std::vector<int32_t> prompt;
    // The checkpoint the model was loaded from (not opened a second time).
    const auto* src = dynamic_cast<const model::CheckpointWeights*>(&lm.model->weights());
    PERRY_CHECK(src != nullptr, "perry run needs a checkpoint directory");
    const io::Checkpoint& ckpt = src->checkpoint();
    tokenizer::ChatTemplateConfig chat_cfg;
    if (a->chat) {
      chat_cfg = tokenizer::load_chat_template_config(lm.source);
      if (chat_cfg.source.empty())
        fail("{} has no chat template (tokenizer_config.json chat_template); run without --chat", lm.source);
      tokenizer::ChatTemplate tmpl(chat_cfg.source);
      std::vector<tokenizer::ChatMessage> msgs;
      if (!a->system.empty()) msgs.push_back({"system", a->system});
      msgs.push_back({"user", text});
      const nlohmann::json extra = {{"bos_token", chat_cfg.bos_token}, {"eos_token", chat_cfg.eos_token}};
      std::string rendered = tmpl.render(msgs, true, extra);
      prompt = lm.tokenizer->encode(rendered, false);  // the template already has the special tokens
    } else {
      prompt = lm.tokenizer->encode(text, !a->raw);
    }
    int64_t ctx = a->ctx > 0 ? a->ctx : std::min<int64_t>(4096, cfg.max_position_embeddings);
    PERRY_CHECK(ctx <= cfg.max_position_embeddings, "--ctx {} exceeds the model's maximum context {}", ctx,
                cfg.max_position_embeddings);
    model::KvCache cache = lm.model->make_cache(ctx, 1);
    runtime::GenerateOptions go;
    go.max_new_tokens = a->n;
    go.prefill_chunk = lm.model->preferred_prefill_chunk();
    go.sampling = a->s;
    go.stop_strings = a->stops;
    go.eos_ids = ckpt.generation_defaults().eos_token_ids;
    for (int32_t e : cfg.eos_token_ids) go.eos_ids.push_back(e);
    if (a->chat)  // the template's end-of-turn token ends the answer
      for (const std::string& t : {chat_cfg.eos_token, std::string("<|im_end|>")})
        if (auto id = t.empty() ? std::nullopt : lm.tokenizer->token_id(t)) go.eos_ids.push_back(*id);
    if (!a->chat && isatty(STDOUT_FILENO)) std::printf("%s", text.c_str());
    std::fflush(stdout);
    auto st = runtime::generate(*lm.model, *lm.tokenizer, cache, 0, prompt, go, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    if (!a->no_stats) {
      std::fprintf(stderr,
                   "\n[perry] model %s (%s, %s)\n"
                   "[perry] prompt %lld tokens | TTFT %.1f ms | prefill %.1f tok/s | generated %lld tokens | "
                   "decode %.2f tok/s | finish: %s | load %.2f s | peak RSS %.0f MiB\n",
                   lm.source.c_str(), cfg.architecture_name.c_str(),
                   std::string(quant::quant_mode_name(lm.model->mode())).c_str(), (long long)st.prompt_tokens,
                   st.ttft_s * 1e3, st.prefill_tok_s(), (long long)st.generated_tokens, st.decode_tok_s(),
                   std::string(runtime::finish_reason_name(st.finish)).c_str(), lm.load_seconds, peak_rss_mib());
    }
    return 0;
  }};
}

}  // namespace perry::cli
