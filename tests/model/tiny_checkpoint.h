// Writes a small random-init checkpoint directory (HF layout) for model tests that need files:
// loader validation, quantized round trips, batching invariants.
#pragma once
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/dtype.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/tensor_names.h"

namespace perry::test_util {

inline io::ModelConfig tiny_config(io::Architecture arch) {
  io::ModelConfig c;
  c.arch = arch;
  c.architecture_name = std::string(io::architecture_name(arch));
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = arch == io::Architecture::Qwen3 ? 16 : 12;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.attention_bias = arch == io::Architecture::Qwen2;
  c.qk_norm = arch == io::Architecture::Qwen3;
  c.tie_word_embeddings = arch != io::Architecture::Llama;
  if (arch == io::Architecture::Llama) c.rope_scaling = {io::RopeType::Llama3, 8.0, 1.0, 4.0, 64};
  return c;
}

// Returns the directory. `mutate(name, shape)` may alter the shapes written (for error tests).
template <typename Mutate>
std::string write_tiny_checkpoint(const std::string& name, const io::ModelConfig& c, uint32_t seed, Mutate mutate,
                                  DType dtype = DType::BF16) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "perry_test_models" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << io::model_config_to_json(c).dump(2);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<uint16_t>> keep;
  io::SafetensorsWriter w;
  for (auto spec : model::expected_tensors(c)) {
    if (!mutate(spec)) continue;
    int64_t n = 1;
    for (auto d : spec.shape) n *= d;
    keep.emplace_back(static_cast<size_t>(n));
    const float sd = spec.kind == model::TensorKind::Norm ? 0.1f : spec.kind == model::TensorKind::Bias ? 0.1f : 0.3f;
    const float mean = spec.kind == model::TensorKind::Norm ? 1.0f : 0.0f;
    for (auto& x : keep.back()) {
      float v = mean + sd * nd(rng);
      x = dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
    }
    if (dtype == DType::F32) {
      std::vector<uint16_t> f32(size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        float v = bf16_to_f32(keep.back()[size_t(i)]);
        std::memcpy(f32.data() + 2 * i, &v, 4);
      }
      keep.back() = std::move(f32);
    }
    w.add(spec.name, dtype, spec.shape, keep.back().data(), keep.back().size() * 2);
  }
  w.write((dir / "model.safetensors").string());
  return dir.string();
}

inline std::string write_tiny_checkpoint(const std::string& name, const io::ModelConfig& c, uint32_t seed = 1,
                                         DType dtype = DType::BF16) {
  return write_tiny_checkpoint(name, c, seed, [](model::TensorSpec&) { return true; }, dtype);
}

}  // namespace perry::test_util
