// perry bench: end-to-end speed per mode — prefill tok/s at several prompt lengths, TTFT, decode
// tok/s, peak RSS — on a model dir or a --synthetic preset. Medians after a warm-up; modes are
// measured in the same run so the ratios against bf16 are meaningful on a noisy machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace perry::cli {

namespace {
struct BenchArgs {
  ModelArgs m;
  std::vector<std::string> modes = {"bf16", "w8a8"};
  std::vector<int64_t> prompts = {128, 512, 1024};
  int64_t decode = 32, repeats = 3, batch = 1;
  std::string out;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

Command register_bench(CLI::App& root) {
  auto* a = new BenchArgs();
  CLI::App* app = root.add_subcommand("bench", "End-to-end prefill/decode speed per quantization mode");
  add_model_flags(app, &a->m);
  app->add_option("--modes", a->modes, "Modes to compare, e.g. --modes bf16 w8a8 w4a8-g128 (default bf16 w8a8)");
  app->add_option("-p,--prompt-lengths", a->prompts, "Prompt lengths for prefill (default 128 512 1024)");
  app->add_option("-n,--decode-tokens", a->decode, "Tokens to decode per measurement (default 32)");
  app->add_option("-r,--repeats", a->repeats, "Repetitions per measurement; the median is reported (default 3)");
  app->add_option("-b,--batch", a->batch, "Decode batch: sequences decoded together (default 1)");
  app->add_option("-o,--out", a->out, "Write results to OUT.md and OUT.json");
  return {app, [a]() -> int {
    PERRY_CHECK(a->repeats >= 1 && a->decode >= 2 && a->batch >= 1, "bench: repeats >= 1, decode tokens >= 2, batch >= 1");
    nlohmann::json results = nlohmann::json::array();
    std::ostringstream md;
    md << "| mode | prompt | prefill tok/s | TTFT ms | decode tok/s (batch " << a->batch << ") | peak RSS MiB |\n"
       << "|---|---:|---:|---:|---:|---:|\n";
    std::printf("%-10s %7s %14s %10s %14s %10s\n", "mode", "prompt", "prefill tok/s", "TTFT ms", "decode tok/s", "RSS MiB");
    for (const std::string& mode : a->modes) {
      ModelArgs margs = a->m;
      margs.quant = mode;
      LoadedModel lm = load_model(margs, false);
      model::Model& model = *lm.model;
      const int64_t vocab = model.config().vocab_size;
      const int64_t maxp = *std::max_element(a->prompts.begin(), a->prompts.end());
      const int64_t ctx = std::min<int64_t>(model.config().max_position_embeddings, maxp + a->decode + 8);
      model::KvCache cache = model.make_cache(ctx, a->batch);
      std::vector<float> logits;
      // Warm-up: one short prefill and a few decode steps (page-in, thread wake-up, allocations).
      {
        auto t = random_token_ids(16, vocab, 7);
        model.forward({{0, t.data(), 16, false}}, cache, logits);
        cache.reset(0);
      }
      for (int64_t P : a->prompts) {
        PERRY_CHECK(P + a->decode <= ctx, "prompt {} + decode {} exceeds the model context {}", P, a->decode, ctx);
        std::vector<double> pre, dec;
        for (int64_t r = 0; r < a->repeats; ++r) {
          auto toks = random_token_ids(P, vocab, uint64_t(100 + r));
          for (int64_t b = 0; b < a->batch; ++b) cache.reset(b);
          double t0 = now_s();
          for (int64_t off = 0; off < P; off += 1024)
            model.forward({{0, toks.data() + off, std::min<int64_t>(1024, P - off), false}}, cache, logits);
          pre.push_back(now_s() - t0);
          // Other sequences of the decode batch get the same prompt state cheaply: copy is not
          // needed for speed measurement, they decode from a 1-token prompt.
          for (int64_t b = 1; b < a->batch; ++b) model.forward({{b, toks.data(), 1, false}}, cache, logits);
          std::vector<int32_t> next(size_t(a->batch), 1);
          double t1 = now_s();
          for (int64_t i = 0; i < a->decode; ++i) {
            std::vector<model::SeqInput> batch;
            for (int64_t b = 0; b < a->batch; ++b) batch.push_back({b, &next[size_t(b)], 1, false});
            model.forward(batch, cache, logits);
            for (int64_t b = 0; b < a->batch; ++b)
              next[size_t(b)] = int32_t(std::max_element(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab) -
                                        (logits.begin() + b * vocab));
          }
          dec.push_back((now_s() - t1) / double(a->decode));
        }
        const double pre_s = median(pre), dec_s = median(dec);
        const double pre_tps = double(P) / pre_s, dec_tps = double(a->batch) / dec_s;
        std::printf("%-10s %7lld %14.1f %10.1f %14.2f %10.0f\n", mode.c_str(), (long long)P, pre_tps, pre_s * 1e3, dec_tps,
                    peak_rss_mib());
        std::fflush(stdout);
        md << "| " << mode << " | " << P << " | " << fmt::format("{:.1f}", pre_tps) << " | "
           << fmt::format("{:.1f}", pre_s * 1e3) << " | " << fmt::format("{:.2f}", dec_tps) << " | "
           << fmt::format("{:.0f}", peak_rss_mib()) << " |\n";
        results.push_back({{"mode", mode}, {"prompt", P}, {"prefill_tok_s", pre_tps}, {"ttft_ms", pre_s * 1e3},
                           {"decode_tok_s", dec_tps}, {"decode_batch", a->batch}, {"peak_rss_mib", peak_rss_mib()},
                           {"weight_bytes", model.weight_bytes()}});
      }
    }
    if (!a->out.empty()) {
      nlohmann::json doc = {{"model", a->m.synthetic.empty() ? a->m.dir : "synthetic " + a->m.synthetic},
                            {"cpu", cpu_features().brand}, {"threads", thread_pool().size()}, {"results", results}};
      std::ofstream(a->out + ".json") << doc.dump(2) << "\n";
      std::ofstream(a->out + ".md") << "# perry bench — " << doc["model"].get<std::string>() << "\n\nCPU: "
                                    << cpu_features().brand << ", " << thread_pool().size() << " threads\n\n"
                                    << md.str();
      std::fprintf(stderr, "wrote %s.md and %s.json\n", a->out.c_str(), a->out.c_str());
    }
    return 0;
  }};
}

}  // namespace perry::cli
