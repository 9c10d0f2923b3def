// Pieces every perry subcommand shares: the model options, loading with a progress bar,
// the default embedded model, and the resource summary printed after a run.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace perry::cli {

struct ModelArgs {
  std::string dir;          // -m
  std::string synthetic;    // --synthetic PRESET
  std::string quant;        // --quant MODE
  bool float_lm_head = false;
  int threads = 0;
  std::string device = "cpu";
  double smooth = -1;       // --smooth ALPHA (SmoothQuant), < 0 = off
  std::string calib;        // --calib FILE
  int64_t calib_tokens = 32768;
  bool reference_kernels = false;  // --reference-kernels
  bool no_cuda_graphs = false;     // --no-cuda-graphs
};

void add_model_flags(CLI::App* app, ModelArgs* a, bool allow_synthetic = true);

// The embedded default model: $PERRY_MODEL, else models/perry-qwen3-20m next to the executable's
// share dir or in the source tree perry was built from.
std::string default_model_dir();

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null for synthetic models
  std::string source;
  double load_seconds = 0;
};

// SmoothQuant calibration: runs the float model over the text and computes the factors.
model::SmoothingPlan calibrate_smoothing(const std::string& dir, const std::string& calib_file, int64_t max_tokens,
                                         double alpha);

// "cpu" → -1, "cuda" → 0, "cuda:N" → N; nullopt when malformed.
std::optional<int> parse_device(const std::string& d);
// One line about GPU `device` for perry info: its name and memory, or why it cannot be used.
std::string cuda_report(int device);

// The arguments' own errors (device string, a CUDA device that cannot be used, --quant, -m with
// --synthetic, --threads, --reference-kernels with a GPU, --smooth's needs, a tokenizer asked of a
// synthetic model) as perry::Error, before anything is loaded; returns the device index (-1 =
// cpu). load_model calls it first; commands that load several models check them all first.
int check_model_args(const ModelArgs& a, bool need_tokenizer = false);
// Applies --threads/--device, resolves the directory, loads with a progress bar on stderr.
LoadedModel load_model(const ModelArgs& a, bool need_tokenizer);

class ProgressBar {
 public:
  // Draws only once the work has taken longer than `delay_s`, so fast loads stay quiet.
  explicit ProgressBar(std::string label, double delay_s = 0.3);
  void update(int64_t done, int64_t total, const std::string& what = "");
  void finish();

 private:
  std::string label_;
  double start_, delay_;
  bool drawn_ = false;
};

// Deterministic pseudo-random token ids in [0, vocab) (prompts for --synthetic models and benchmarks).
std::vector<int32_t> random_token_ids(int64_t n, int64_t vocab, uint64_t seed);

double peak_rss_mib();
std::string human_bytes(double b);

// Each subcommand registers its flags on the root app and returns the code to run once parsed.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
Command register_run(CLI::App& root);
Command register_ppl(CLI::App& root);
Command register_info(CLI::App& root);
Command register_tokenize(CLI::App& root);
Command register_quantize(CLI::App& root);
Command register_export(CLI::App& root);
Command register_bench(CLI::App& root);
Command register_bench_op(CLI::App& root);
Command register_serve(CLI::App& root);

}  // namespace perry::cli
