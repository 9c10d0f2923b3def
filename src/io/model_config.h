// Hugging Face config.json → ModelConfig. Strings (architecture, rope type, dtype) are parsed
// into enums here, once; nothing downstream compares strings.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace perry::io {

enum class Architecture { Llama, Qwen2, Qwen3 };
enum class RopeType { Default, Llama3 };

struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::Llama;
  std::string architecture_name;  // as written in the file, for messages
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v projections (always true for Qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3)
  DType torch_dtype = DType::BF16;
  std::vector<int32_t> bos_token_ids, eos_token_ids;
  nlohmann::json quantization_config;  // null unless the checkpoint is quantized by perry

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

std::string_view architecture_name(Architecture a);
// Parses config.json text; `origin` names the file in errors. Throws perry::Error.
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin);
ModelConfig load_model_config(const std::string& path);
nlohmann::json model_config_to_json(const ModelConfig& c);  // an HF-compatible config.json

}  // namespace perry::io
