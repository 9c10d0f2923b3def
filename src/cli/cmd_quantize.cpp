// perry quantize: writes a quantized checkpoint directory that loads without re-quantizing
// (format: src/model/quantized_checkpoint.h).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/common.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/quantized_checkpoint.h"

namespace perry::cli {

namespace fs = std::filesystem;

namespace {
struct QuantizeArgs {
  ModelArgs m;
  std::string out;
  bool force = false;
};
}  // namespace

Command register_quantize(CLI::App& root) {
  auto* a = new QuantizeArgs();
  CLI::App* app = root.add_subcommand("quantize", "Write a quantized checkpoint (-m IN -o OUT --quant MODE)");
  add_model_flags(app, &a->m, false);
  app->add_option("-o,--out", a->out, "Output directory")->required();
  app->add_flag("--force", a->force, "Overwrite files in an existing output directory");
  return {app, [a]() -> int {
    if (a->m.quant.empty()) fail("perry quantize needs --quant MODE (one of {})", quant::quant_mode_names());
    const std::string in = a->m.dir.empty() ? default_model_dir() : a->m.dir;
    if (fs::exists(a->out) && !fs::is_empty(a->out) && !a->force)
      fail("output directory {} exists and is not empty (use --force to overwrite)", a->out);
    if (fs::weakly_canonical(in) == fs::weakly_canonical(a->out)) fail("output directory must differ from the input");
    ModelArgs margs = a->m;
    margs.dir = in;
    LoadedModel lm = load_model(margs, false);
    const model::Model& model = *lm.model;
    nlohmann::json extra = nlohmann::json::object();
    if (model.smoothed()) extra["smoothquant"] = {{"alpha", a->m.smooth}, {"calibration_tokens", a->m.calib_tokens}};
    std::fprintf(stderr, "writing %s\n", a->out.c_str());
    model::save_quantized_checkpoint(model, in, a->out, extra);
    size_t n_quantized = 0;
    for (const auto& [name, lin] : model.named_linears()) n_quantized += lin->quantized() != nullptr;
    std::fprintf(stderr, "quantized %s → %s (%s, %zu linears)\n", in.c_str(), a->out.c_str(),
                 std::string(quant::quant_mode_name(model.mode())).c_str(), n_quantized);
    return 0;
  }};
}

}  // namespace perry::cli
