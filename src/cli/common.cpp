#include "cli/common.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/cpu_features.h"
#include "core/mapped_file.h"
#include "kernels/cpu/float_linear.h"
#include "core/thread_pool.h"
#include "quant/quant.h"
#ifdef PERRY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace perry::cli {

namespace fs = std::filesystem;

void add_model_flags(CLI::App* app, ModelArgs* a, bool allow_synthetic) {
  app->add_option("-m,--model", a->dir,
                  "Hugging Face checkpoint directory (config.json + safetensors + tokenizer.json). "
                  "Default: the embedded model perry-qwen3-20m");
  if (allow_synthetic)
    app->add_option("--synthetic", a->synthetic,
                    "Random weights at the real shapes of a preset instead of -m (speed measurements): "
                    "llama3.2-1b, llama3-8b, qwen3-0.6b, qwen3-1.7b, qwen3-8b, qwen2.5-1.5b");
  app->add_option("-q,--quant", a->quant,
                  "Quantize at load: " + quant::quant_mode_names() + " (default: the checkpoint's own dtype)");
  app->add_flag("--float-lm-head,!--quant-lm-head", a->float_lm_head,
                "--float-lm-head keeps lm_head in bf16 when quantizing; --quant-lm-head (the default) "
                "quantizes it with the same mode as the other linears");
  app->add_option("--smooth", a->smooth,
                  "SmoothQuant: migrate activation outliers into the weights with strength ALPHA in [0,1] "
                  "(typically 0.5) before quantizing; needs --calib")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--calib", a->calib, "Calibration text for --smooth (activation statistics are collected on it)");
  app->add_option("--calib-tokens", a->calib_tokens, "Tokens of --calib text to run (default 32768)");
  app->add_flag("--reference-kernels", a->reference_kernels,
                "Run the scalar reference kernels instead of the AVX-512/AVX2 ones (slow; for checking results)");
  app->add_flag("--no-cuda-graphs", a->no_cuda_graphs,
                "With --device cuda: launch every kernel of a decode step instead of replaying the step as a "
                "recorded CUDA graph (to measure the launch overhead the graph removes)");
  app->add_option("-t,--threads", a->threads, "CPU threads (default: all cores, or $PERRY_THREADS)");
  app->add_option("--device", a->device,
                  "Where the model runs: cpu (default), cuda (GPU 0) or cuda:N. The model is loaded (and "
                  "quantized) on the host, then uploaded once; the KV cache lives on the GPU")
      ->check([](const std::string& d) -> std::string {
        return parse_device(d) ? "" : "expected cpu, cuda or cuda:N, got \"" + d + "\"";
      });
}

std::string default_model_dir() {
  if (const char* e = std::getenv("PERRY_MODEL")) return e;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const char* name = "perry-qwen3-20m";
  if (!ec) {
    for (fs::path p : {exe.parent_path() / "../share/perry/models" / name, exe.parent_path() / "models" / name,
                       exe.parent_path() / "../models" / name})
      if (fs::exists(p / "config.json")) return p.lexically_normal().string();
  }
  return std::string(PERRY_SOURCE_DIR) + "/models/" + name;
}

namespace {
double mono_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

ProgressBar::ProgressBar(std::string label, double delay_s) : label_(std::move(label)), start_(mono_s()), delay_(delay_s) {}

void ProgressBar::update(int64_t done, int64_t total, const std::string& what) {
  if (!drawn_ && mono_s() - start_ < delay_) return;
  // Not a terminal (logs, CI): a line per quarter instead of redrawing.
  if (!isatty(STDERR_FILENO) && done != total && done % std::max<int64_t>(1, total / 4) != 0) return;
  const int width = 30;
  int fill = total > 0 ? int(double(done) / double(total) * width) : width;
  std::string bar(size_t(fill), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "%s%s [%s] %lld/%lld %-24s%s", isatty(STDERR_FILENO) ? "\r" : "", label_.c_str(), bar.c_str(),
               (long long)done, (long long)total, what.c_str(), isatty(STDERR_FILENO) ? "" : "\n");
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_ && isatty(STDERR_FILENO)) std::fprintf(stderr, "\n");
  drawn_ = false;
}

model::SmoothingPlan calibrate_smoothing(const std::string& dir, const std::string& calib_file, int64_t max_tokens,
                                         double alpha) {
  model::LoadOptions fo;
  fo.dir = dir;
  auto fm = model::Model::load(fo);
  auto tok = tokenizer::Tokenizer::from_file(dir + "/tokenizer.json");
  auto ids = tok.encode(read_text_file(calib_file), false);
  PERRY_CHECK(ids.size() >= 2, "--calib {}: the text is too short", calib_file);
  if (int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  const int64_t ctx = std::min<int64_t>(512, fm->config().max_position_embeddings);
  model::CalibrationStats stats;
  fm->set_calibration(&stats);
  auto cache = fm->make_cache(ctx, 1);
  std::vector<float> logits;
  ProgressBar bar("calibrating");
  for (size_t b = 0; b < ids.size(); b += size_t(ctx)) {
    const int64_t n = std::min<int64_t>(ctx, int64_t(ids.size() - b));
    cache.reset(0);
    fm->forward({{0, ids.data() + b, n, false}}, cache, logits);
    bar.update(int64_t(b) + n, int64_t(ids.size()), "tokens");
  }
  bar.finish();
  fm->set_calibration(nullptr);
  return model::compute_smoothing_plan(fm->weights(), stats, alpha);
}

std::optional<int> parse_device(const std::string& d) {
  if (d == "cpu") return -1;
  if (d == "cuda") return 0;
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() < 8 &&
      std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::stoi(d.substr(5));
  return std::nullopt;
}

std::string cuda_report(int device) {
#ifdef PERRY_HAVE_CUDA
  try {
    return cuda::cuda_device_report(device);
  } catch (const Error& e) {
    return std::string("unavailable: ") + e.what();
  }
#else
  (void)device;
  return "not built into this binary (configure with nvcc on the PATH and -DPERRY_CUDA=ON)";
#endif
}

int check_model_args(const ModelArgs& a, bool need_tokenizer) {
  const std::optional<int> device = parse_device(a.device);
  if (!device) fail("--device {}: expected cpu, cuda or cuda:N", a.device);
#ifndef PERRY_HAVE_CUDA
  if (*device >= 0)
    fail("--device {}: this perry binary was built without the CUDA backend (nvcc was not found at configure time); "
         "use --device cpu or rebuild with the CUDA toolkit",
         a.device);
#else
  if (*device >= 0) cuda::require_cuda_device(*device);
#endif
  if (a.threads < 0) fail("--threads must be positive");
  if (!a.synthetic.empty() && !a.dir.empty()) fail("give either -m DIR or --synthetic PRESET, not both");
  std::optional<quant::QuantMode> mode;
  if (!a.quant.empty() && !(mode = quant::parse_quant_mode(a.quant)))
    fail("unknown --quant mode \"{}\" (choose one of: {})", a.quant, quant::quant_mode_names());
  if (*device >= 0 && a.reference_kernels)
    fail("--reference-kernels applies to the CPU kernels; it cannot be combined with --device cuda");
  if (a.smooth >= 0) {
    if (a.calib.empty()) fail("--smooth needs --calib FILE (text to collect activation statistics on)");
    if (!a.synthetic.empty()) fail("--smooth works on checkpoints with a tokenizer, not --synthetic");
    if (!mode || !quant::is_quantized(*mode)) fail("--smooth only makes sense with a quantized --quant mode");
  }
  if (need_tokenizer && !a.synthetic.empty())
    fail("--synthetic models have no tokenizer: give token counts instead of text");
  return *device;
}

LoadedModel load_model(const ModelArgs& a, bool need_tokenizer) {
  const int device = check_model_args(a, need_tokenizer);  // before minutes of loading, not after
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.reference_kernels) {
    quant::set_quant_force_reference(true);
    kernels::set_float_linear_force_reference(true);
    set_max_isa(IsaLevel::Scalar);
  }
  model::LoadOptions o;
  o.synthetic = a.synthetic;
  o.dir = a.synthetic.empty() ? (a.dir.empty() ? default_model_dir() : a.dir) : "";
  if (!a.quant.empty()) o.quant = *quant::parse_quant_mode(a.quant);  // (checked above)
  o.quant_lm_head = !a.float_lm_head;
  o.pack_for_cpu = device < 0;
  std::string label = o.quant && quant::is_quantized(*o.quant) ? "quantizing" : "loading";
  ProgressBar bar(label);
  o.progress = [&](int64_t d, int64_t t, const std::string& w) { bar.update(d, t, w); };
  LoadedModel lm;
  auto t0 = std::chrono::steady_clock::now();
  model::SmoothingPlan plan;
  if (a.smooth >= 0) {  // (its arguments checked above)
    plan = calibrate_smoothing(o.dir, a.calib, a.calib_tokens, a.smooth);
    o.smoothing = &plan;
  }
  lm.model = model::Model::load(o);
  bar.finish();
#ifdef PERRY_HAVE_CUDA
  if (device >= 0) {
    ProgressBar up("uploading to " + a.device);
    cuda::CudaBackendOptions co;
    co.device = device;
    co.cuda_graphs = !a.no_cuda_graphs;
    lm.model->set_backend(cuda::make_cuda_backend(
        *lm.model, co, [&](int64_t d, int64_t t, const std::string& w) { up.update(d, t, w); }));
    up.finish();
  }
#endif
  lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lm.source = o.synthetic.empty() ? o.dir : "synthetic " + o.synthetic;
  if (need_tokenizer) {
    lm.tokenizer = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_file(o.dir + "/tokenizer.json"));
  }
  return lm;
}

std::vector<int32_t> random_token_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;  // 64-bit LCG (Knuth's MMIX)
    x = int32_t((seed >> 33) % uint64_t(vocab));
  }
  return t;
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; ++i; }
  return fmt::format("{:.1f} {}", b, u[i]);
}

}  // namespace perry::cli
