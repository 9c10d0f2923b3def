// perry export: writes a synthetic preset as a Hugging Face checkpoint directory (config.json,
// generation_config.json, bf16 safetensors under the HF names), so peers — transformers, llama.cpp's
// converters — can run on exactly the weights `perry bench --synthetic` measures. Streams one tensor
// at a time (src/model/hf_export.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/hf_export.h"
#include "model/tensor_names.h"
#include "model/weight_source.h"

namespace perry::cli {

namespace fs = std::filesystem;

namespace {
struct ExportArgs {
  std::string synthetic, out;
  double shard_gb = 5.0;
  int threads = 0;
  bool force = false;
};

std::string preset_list() {
  std::string s;
  for (const auto& n : model::synthetic_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

Command register_export(CLI::App& root) {
  auto* a = new ExportArgs();
  CLI::App* app = root.add_subcommand(
      "export", "Write a synthetic preset as a Hugging Face checkpoint (--synthetic PRESET -o DIR), e.g. for "
                "transformers to run on the same weights");
  app->add_option("--synthetic", a->synthetic, "Preset whose random weights to write: " + preset_list())->required();
  app->add_option("-o,--out", a->out, "Output directory (config.json, generation_config.json, *.safetensors)")
      ->required();
  app->add_option("--shard-size", a->shard_gb,
                  "Largest safetensors file in GB (1e9 bytes); bigger models are sharded with "
                  "model.safetensors.index.json, as transformers does. 0 = one file (default 5)");
  app->add_option("-t,--threads", a->threads, "Threads generating the weights (default: all cores)");
  app->add_flag("--force", a->force, "Write into an existing non-empty directory (replaces its weights and config)");
  return {app, [a]() -> int {
    if (a->shard_gb < 0) fail("--shard-size must be >= 0");
    if (a->threads < 0) fail("--threads must be positive");
    auto cfg = model::synthetic_preset(a->synthetic);
    if (!cfg) fail("unknown synthetic preset \"{}\" (available: {})", a->synthetic, preset_list());
    if (fs::exists(a->out) && !fs::is_directory(a->out)) fail("{} exists and is not a directory", a->out);
    if (fs::exists(a->out) && !fs::is_empty(a->out) && !a->force)
      fail("output directory {} exists and is not empty (use --force to overwrite)", a->out);
    if (a->threads > 0) set_num_threads(a->threads);
    model::SyntheticWeights src(*cfg, a->synthetic);

    uint64_t total = 0;
    for (const auto& n : model::expected_tensors(*cfg)) {
      uint64_t e = 1;
      for (int64_t d : n.shape) e *= uint64_t(d);
      total += e * 2;
    }
    std::fprintf(stderr, "exporting synthetic %s (%s) to %s: %s of bf16 weights\n", a->synthetic.c_str(),
                 cfg->architecture_name.c_str(), a->out.c_str(), human_bytes(double(total)).c_str());
    if (fs::exists(a->out) || fs::create_directories(a->out)) {
      const auto sp = fs::space(a->out);
      if (sp.available < total + (64ull << 20))
        fail("{}: only {} free, the export needs {}", a->out, human_bytes(double(sp.available)),
             human_bytes(double(total)));
    }
    const auto t0 = std::chrono::steady_clock::now();
    ProgressBar bar("exporting");
    model::HfExportOptions o;
    o.max_shard_bytes = uint64_t(a->shard_gb * 1e9);
    o.progress = [&](int64_t d, int64_t t, const std::string& w) { bar.update(d, t, w); };
    o.file_done = [&](const std::string& path, uint64_t bytes) {
      bar.finish();
      std::fprintf(stderr, "  wrote %s (%s)\n", path.c_str(), human_bytes(double(bytes)).c_str());
    };
    const model::HfExportResult r = model::export_hf_checkpoint(src, a->out, o);
    bar.finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "exported synthetic %s → %s: %lld tensors, %s in %zu file%s, %.1f s (%.2f GB/s)\n",
                 a->synthetic.c_str(), a->out.c_str(), (long long)r.tensors, human_bytes(double(r.total_bytes)).c_str(),
                 r.files.size(), r.files.size() == 1 ? "" : "s", s, double(r.total_bytes) / 1e9 / std::max(s, 1e-9));
    return 0;
  }};
}

}  // namespace perry::cli
