// perry ppl: perplexity of a text file (exp of the mean next-token NLL) with a progress bar.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "runtime/generator.h"

namespace perry::cli {

namespace {
struct PplArgs {
  ModelArgs m;
  std::string file;
  int64_t ctx = 512, stride = 0, synthetic_tokens = 4096;
};
}  // namespace

Command register_ppl(CLI::App& root) {
  auto* a = new PplArgs();
  CLI::App* app = root.add_subcommand("ppl", "Perplexity of a text: exp(mean NLL) over context windows");
  add_model_flags(app, &a->m);
  app->add_option("-f,--file", a->file, "Text file to score (required unless --synthetic)");
  app->add_option("--ctx", a->ctx, "Window length in tokens (default 512)");
  app->add_option("--stride", a->stride,
                  "Sliding-window stride (default = ctx: non-overlapping windows; smaller strides give every "
                  "scored token more context, HF recipe)");
  app->add_option("--synthetic-tokens", a->synthetic_tokens, "With --synthetic: number of random tokens to score");
  return {app, [a]() -> int {
    const bool synth = !a->m.synthetic.empty();
    if (!synth && a->file.empty()) fail("perry ppl needs -f FILE (the text to score)");
    std::string text = synth ? "" : read_text_file(a->file);
    LoadedModel lm = load_model(a->m, !synth);
    std::vector<int32_t> ids;
    if (synth) {
      ids = random_token_ids(a->synthetic_tokens, lm.model->config().vocab_size, 42);
    } else {
      ids = lm.tokenizer->encode(text, false);
    }
    const int64_t stride = a->stride > 0 ? a->stride : a->ctx;
    ProgressBar bar("scoring");
    auto r = runtime::perplexity(*lm.model, ids, a->ctx, stride, [&](int64_t d, int64_t t) { bar.update(d, t); });
    bar.finish();
    std::printf("perplexity %.4f  (mode %s, ctx %lld, stride %lld, %lld windows, %lld scored of %lld tokens, "
                "mean NLL %.6f, %.1f tok/s)\n",
                r.ppl, std::string(quant::quant_mode_name(lm.model->mode())).c_str(), (long long)a->ctx,
                (long long)stride, (long long)r.windows, (long long)r.scored_tokens, (long long)r.total_tokens,
                r.nll_sum / double(r.scored_tokens), double(r.windows) * double(a->ctx) / r.seconds);
    return 0;
  }};
}

}  // namespace perry::cli
