// perry quantize: writes a quantized checkpoint directory that loads without re-quantizing.
//
// Format (documented in docs/quantization.md): for each quantized linear `X`, tensors
// `X.qweight` (I8 [N,K], or U8 [N,ceil(K/2)] packed int4, low nibble = even k) and `X.scales`
// (F32 [N, groups]); `X.bias` stays float. Everything else (embeddings, norms, float linears) is
// copied unchanged. config.json gets quantization_config = {quant_method: "perry",
// format_version: 1, mode, lm_head_quantized, modules: {name: mode}} (per-module modes allow mixed
// precision). Tokenizer and generation files are copied.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/common.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/tensor_names.h"

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
    if (!model.config().quantization_config.is_null()) fail("{} is already quantized", in);
    auto ckpt = io::Checkpoint::open(in);
    fs::create_directories(a->out);

    io::SafetensorsWriter w;
    nlohmann::json modules = nlohmann::json::object();
    std::set<std::string> written;
    // Quantized linears.
    std::vector<std::vector<uint8_t>> keep;  // not needed: canonical() buffers live in the model
    for (const auto& [name, lin] : model.named_linears()) {
      if (const auto* q = lin->quantized()) {
        const auto& c = q->canonical();
        const auto s = quant::quant_scheme(c.mode);
        const int64_t groups = int64_t(c.scales.size()) / c.N;
        if (s.weight_bits == 8) w.add(name + ".qweight", DType::I8, {c.N, c.K}, c.qweight.data(), c.qweight.size());
        else w.add(name + ".qweight", DType::U8, {c.N, (c.K + 1) / 2}, c.qweight.data(), c.qweight.size());
        w.add(name + ".scales", DType::F32, {c.N, groups}, c.scales.data(), c.scales.size() * 4);
        modules[name] = std::string(quant::quant_mode_name(c.mode));
        written.insert(name + ".weight");
      }
    }
    // SmoothQuant changed the norm weights: write them from the model, in F32 (rounding the
    // divided weights to bf16 would undo part of the smoothing's exactness).
    std::vector<const std::vector<float>*> norm_keep;
    if (model.smoothed()) {
      for (const auto& [name, t] : ckpt.tensors())
        if (name.find("layernorm.weight") != std::string::npos) {
          const auto& v = model.norm_weight(name);
          w.add(name, DType::F32, t.shape, v.data(), v.size() * 4);
          written.insert(name);
        }
    }
    // Everything else, unchanged from the source checkpoint (embeddings, norms, biases, float linears).
    for (const auto& [name, t] : ckpt.tensors())
      if (!written.count(name)) w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    w.set_metadata("format", "pt");
    w.set_metadata("perry_quant_mode", std::string(quant::quant_mode_name(model.mode())));
    std::fprintf(stderr, "writing %s/model.safetensors\n", a->out.c_str());
    w.write(a->out + "/model.safetensors");

    nlohmann::json cfg = nlohmann::json::parse(read_text_file(in + "/config.json"));
    cfg["quantization_config"] = {{"quant_method", "perry"},
                                  {"format_version", 1},
                                  {"mode", std::string(quant::quant_mode_name(model.mode()))},
                                  {"lm_head_quantized", !a->m.float_lm_head},
                                  {"modules", modules}};
    if (model.smoothed())
      cfg["quantization_config"]["smoothquant"] = {{"alpha", a->m.smooth}, {"calibration_tokens", a->m.calib_tokens}};
    std::ofstream(a->out + "/config.json") << cfg.dump(2) << "\n";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                          "special_tokens_map.json"})
      if (fs::exists(in + "/" + f)) fs::copy_file(in + "/" + f, a->out + "/" + f, fs::copy_options::overwrite_existing);
    std::fprintf(stderr, "quantized %s → %s (%s, %zu linears)\n", in.c_str(), a->out.c_str(),
                 std::string(quant::quant_mode_name(model.mode())).c_str(), modules.size());
    return 0;
  }};
}

}  // namespace perry::cli
