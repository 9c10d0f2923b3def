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
#include "core/env.h"
#include "core/error.h"
#include "core/op_profile.h"
#include "core/thread_pool.h"
#ifdef PERRY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace perry::cli {

namespace {
struct BenchArgs {
  ModelArgs m;
  std::vector<std::string> modes = {"bf16", "w8a8"};
  std::vector<int64_t> prompts = {128, 512, 1024};
  int64_t decode = 32, repeats = 3, decode_context = 128;
  std::vector<int64_t> batches = {1};
  std::string out;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

// Peak device memory of the model's backend (0 on the CPU).
size_t device_peak_bytes(const model::Model& m) {
#ifdef PERRY_HAVE_CUDA
  return cuda::cuda_peak_memory(m.backend());
#else
  (void)m;
  return 0;
#endif
}

Command register_bench(CLI::App& root) {
  auto* a = new BenchArgs();
  CLI::App* app = root.add_subcommand("bench", "End-to-end prefill/decode speed per quantization mode");
  add_model_flags(app, &a->m);
  app->add_option("--modes", a->modes, "Modes to compare, e.g. --modes bf16 w8a8 w4a8-g128 (default bf16 w8a8; any of " +
                                           quant::quant_mode_names() + ")");
  app->add_option("-p,--prompt-lengths", a->prompts, "Prompt lengths for prefill (default 128 512 1024)");
  app->add_option("-n,--decode-tokens", a->decode, "Tokens to decode per measurement (default 32)");
  app->add_option("-r,--repeats", a->repeats, "Repetitions per measurement; the median is reported (default 3)");
  app->add_option("-b,--batch", a->batches,
                  "Decode batch sizes: sequences decoded together, e.g. -b 1 16 (default 1)");
  app->add_option("--decode-context", a->decode_context,
                  "Tokens already in each sequence's cache when decoding starts (default 128)");
  app->add_option("-o,--out", a->out, "Write results to OUT.md and OUT.json");
  return {app, [a]() -> int {
    PERRY_CHECK(a->repeats >= 1 && a->decode >= 2 && a->decode_context >= 1,
                "bench: repeats >= 1, decode tokens >= 2, decode context >= 1");
    for (int64_t b : a->batches) PERRY_CHECK(b >= 1, "bench: batch sizes must be >= 1");
    for (const std::string& mode : a->modes) {  // every mode and the device, before the first is measured
      ModelArgs margs = a->m;
      margs.quant = mode;
      check_model_args(margs);
    }
    nlohmann::json results = nlohmann::json::array();
    std::ostringstream md;
    md << "| mode | what | tokens | tok/s | ms | peak RSS MiB | peak GPU MiB |\n|---|---|---:|---:|---:|---:|---:|\n";
    std::printf("%-10s %-14s %7s %12s %10s %9s %9s\n", "mode", "what", "tokens", "tok/s", "ms", "RSS MiB", "GPU MiB");
    std::string device;
    // Written after every mode, so a run cut short (a time limit on the GPU machine) keeps what it measured.
    auto write_out = [&](bool final) {
      if (a->out.empty()) return;
      nlohmann::json doc = {{"model", a->m.synthetic.empty() ? a->m.dir : "synthetic " + a->m.synthetic},
                            {"cpu", cpu_features().brand}, {"threads", thread_pool().size()}, {"device", device},
                            {"results", results}};
      std::ofstream(a->out + ".json") << doc.dump(2) << "\n";
      std::ofstream(a->out + ".md") << "# perry bench — " << doc["model"].get<std::string>() << "\n\nCPU: "
                                    << cpu_features().brand << ", " << thread_pool().size() << " threads; runs on "
                                    << device << "\n\n" << md.str();
      if (final) std::fprintf(stderr, "wrote %s.md and %s.json\n", a->out.c_str(), a->out.c_str());
    };
    for (const std::string& mode : a->modes) {
      ModelArgs margs = a->m;
      margs.quant = mode;
      LoadedModel lm = load_model(margs, false);
      model::Model& model = *lm.model;
      std::fprintf(stderr, "[bench] %s: loaded in %.1f s (%s)\n", mode.c_str(), lm.load_seconds,
                   model.device_name().c_str());
      device = model.device_name();
      const int64_t vocab = model.config().vocab_size, maxpos = model.config().max_position_embeddings;
      const int64_t maxp = *std::max_element(a->prompts.begin(), a->prompts.end());
      const int64_t maxb = *std::max_element(a->batches.begin(), a->batches.end());
      PERRY_CHECK(maxp <= maxpos && a->decode_context + a->decode <= maxpos,
                  "prompt {} or decode context {} + {} exceeds the model context {}", maxp, a->decode_context, a->decode,
                  maxpos);
      const int64_t ctx = std::max(maxp, a->decode_context + a->decode);
      model::KvCache cache = model.make_cache(ctx, maxb);
      std::vector<float> logits;
      const int64_t chunk = model.preferred_prefill_chunk();
      auto report = [&](const std::string& what, int64_t tokens, double tps, double ms) {
        const double gpu = double(device_peak_bytes(model)) / (1 << 20);
        std::printf("%-10s %-14s %7lld %12.1f %10.2f %9.0f %9.0f\n", mode.c_str(), what.c_str(), (long long)tokens, tps,
                    ms, peak_rss_mib(), gpu);
        std::fflush(stdout);
        md << "| " << mode << " | " << what << " | " << tokens << " | " << fmt::format("{:.1f}", tps) << " | "
           << fmt::format("{:.2f}", ms) << " | " << fmt::format("{:.0f}", peak_rss_mib()) << " | "
           << fmt::format("{:.0f}", gpu) << " |\n";
        results.push_back({{"mode", mode}, {"what", what}, {"tokens", tokens}, {"tok_s", tps}, {"ms", ms},
                           {"peak_rss_mib", peak_rss_mib()}, {"peak_gpu_mib", gpu},
                           {"weight_bytes", model.weight_bytes()}, {"device", device}});
      };
      // Warm-up: one short prefill and a decode step (page-in, allocations, kernel selection).
      {
        auto t = random_token_ids(16, vocab, 7);
        model.forward({{0, t.data(), 16, false}}, cache, logits);
        model.forward({{0, t.data(), 1, false}}, cache, logits);
        std::vector<int32_t> picked;
        for (int i = 0; i < 2; ++i) model.forward_greedy({{0, t.data() + i, 1, false}}, cache, picked);
        cache.reset(0);
      }
      prof::reset();
      for (int64_t P : a->prompts) {
        std::vector<double> pre;
        auto toks = random_token_ids(P, vocab, uint64_t(100 + P));
        for (int64_t r = 0; r < a->repeats + 1; ++r) {  // the first repetition warms this length up
          cache.reset(0);
          double t0 = now_s();
          for (int64_t off = 0; off < P; off += chunk)
            model.forward({{0, toks.data() + off, std::min<int64_t>(chunk, P - off), false}}, cache, logits);
          if (r > 0) pre.push_back(now_s() - t0);
        }
        // TTFT = the prompt's forward passes up to the first token's logits on the host.
        report("prefill", P, double(P) / median(pre), median(pre) * 1e3);
#ifdef PERRY_HAVE_CUDA
        if (model.backend() && P <= chunk) {
          const double lin = cuda::cuda_linears_ms(model.backend(), int(P));
          std::printf("%-10s %-14s %7lld %12s %10.2f   (linears alone; %.1f%% of the prefill is outside them)\n",
                      mode.c_str(), "  linears", (long long)P, "", lin, 100.0 * (1.0 - lin / (median(pre) * 1e3)));
          md << "| " << mode << " | linears alone | " << P << " | | " << fmt::format("{:.2f}", lin) << " | | |\n";
          results.push_back({{"mode", mode}, {"what", "linears"}, {"tokens", P}, {"ms", lin}});
        }
#endif
      }
      for (int64_t B : a->batches) {
        std::vector<double> dec;
        for (int64_t r = 0; r < a->repeats; ++r) {
          auto toks = random_token_ids(a->decode_context, vocab, uint64_t(500 + r));
          for (int64_t b = 0; b < B; ++b) {
            cache.reset(b);
            model.forward({{b, toks.data(), a->decode_context, false}}, cache, logits);
          }
          // Greedy decoding as perry run does it: Model::decode_greedy, the tokens picked where the
          // logits are and fed to the next step there (on the GPU the steps run back to back).
          // A/B runs: PERRY_BENCH_HOST_PICK=1 = forward() and the pick on the host, step by step;
          // PERRY_BENCH_STEPWISE=1 = forward_greedy step by step (the host between steps).
          static const bool host_pick = env_flag("PERRY_BENCH_HOST_PICK"), stepwise = env_flag("PERRY_BENCH_STEPWISE");
          std::vector<int32_t> next(size_t(B), 1), picked;
          std::vector<model::SeqInput> batch;
          for (int64_t b = 0; b < B; ++b) batch.push_back({b, &next[size_t(b)], 1, false});
          double t1 = now_s();
          if (host_pick || stepwise) {
            for (int64_t i = 0; i < a->decode; ++i) {
              if (host_pick) {
                model.forward(batch, cache, logits);
                model::greedy_tokens(logits, size_t(B), picked);
              } else {
                model.forward_greedy(batch, cache, picked);
              }
              std::copy(picked.begin(), picked.end(), next.begin());
            }
          } else {
            model.decode_greedy(batch, cache, a->decode, [](const std::vector<int32_t>&) { return true; });
          }
          dec.push_back((now_s() - t1) / double(a->decode));
        }
        // tok/s counts every sequence's token; ms is the time of one decode step.
        report("decode b=" + std::to_string(B), a->decode, double(B) / median(dec), median(dec) * 1e3);
      }
      if (prof::enabled()) {
        prof::report(stdout, mode.c_str());
        prof::reset();
      }
      write_out(false);
    }
    write_out(true);
    return 0;
  }};
}

}  // namespace perry::cli
