#include "model/quantized_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace perry::model {

namespace fs = std::filesystem;

void save_quantized_checkpoint(const Model& model, const std::string& in, const std::string& out,
                               const nlohmann::json& extra_qc) {
  PERRY_CHECK(model.config().quantization_config.is_null(), "{} is already quantized", in);
  auto ckpt = io::Checkpoint::open(in);
  fs::create_directories(out);

  io::SafetensorsWriter w;
  nlohmann::json modules = nlohmann::json::object();
  std::set<std::string> written;
  // Quantized linears.
  for (const auto& [name, lin] : model.named_linears()) {
    if (const auto* q = lin->quantized()) {
      const auto& c = q->canonical();
      const auto s = quant::quant_scheme(c.mode);
      const int64_t groups = int64_t(c.scales.size()) / c.N;
      if (s.fp8) w.add(name + ".qweight", DType::F8_E4M3, {c.N, c.K}, c.qweight.data(), c.qweight.size());
      else if (s.weight_bits == 8) w.add(name + ".qweight", DType::I8, {c.N, c.K}, c.qweight.data(), c.qweight.size());
      else w.add(name + ".qweight", DType::U8, {c.N, (c.K + 1) / 2}, c.qweight.data(), c.qweight.size());
      w.add(name + ".scales", DType::F32, {c.N, groups}, c.scales.data(), c.scales.size() * 4);
      modules[name] = std::string(quant::quant_mode_name(c.mode));
      written.insert(name + ".weight");
    }
  }
  // SmoothQuant changed the norm weights: write them from the model, in F32 (rounding the
  // divided weights to bf16 would undo part of the smoothing's exactness).
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
  w.write(out + "/model.safetensors");

  nlohmann::json cfg = nlohmann::json::parse(read_text_file(in + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "perry"},
                                {"format_version", 1},
                                {"mode", std::string(quant::quant_mode_name(model.mode()))},
                                {"lm_head_quantized", model.lm_head().quantized() != nullptr},
                                {"modules", modules}};
  for (auto it = extra_qc.begin(); it != extra_qc.end(); ++it) cfg["quantization_config"][it.key()] = it.value();
  std::ofstream(out + "/config.json") << cfg.dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                        "special_tokens_map.json"})
    if (fs::exists(in + "/" + f)) fs::copy_file(in + "/" + f, out + "/" + f, fs::copy_options::overwrite_existing);
}

}  // namespace perry::model
