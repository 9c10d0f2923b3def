#include "io/model_config.h"

#include "core/error.h"
#include "core/mapped_file.h"

namespace perry::io {

using nlohmann::json;

std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Llama: return "LlamaForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
    case Architecture::Qwen3: return "Qwen3ForCausalLM";
  }
  return "?";
}

namespace {

int64_t get_int(const json& j, const char* key, const std::string& origin, std::optional<int64_t> def = {}) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    fail("{}: missing required field \"{}\"", origin, key);
  }
  const json& v = j[key];
  if (!v.is_number_integer()) fail("{}: field \"{}\" must be an integer, got {}", origin, key, v.dump());
  int64_t x = v.get<int64_t>();
  if (x < 0) fail("{}: field \"{}\" must be non-negative, got {}", origin, key, x);
  return x;
}

double get_num(const json& j, const char* key, const std::string& origin, double def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number()) fail("{}: field \"{}\" must be a number, got {}", origin, key, j[key].dump());
  return j[key].get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& origin, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) fail("{}: field \"{}\" must be true or false, got {}", origin, key, j[key].dump());
  return j[key].get<bool>();
}

std::vector<int32_t> get_ids(const json& j, const char* key, const std::string& origin) {
  std::vector<int32_t> ids;
  if (!j.contains(key) || j[key].is_null()) return ids;
  const json& v = j[key];
  if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
  else if (v.is_array()) {
    for (const json& x : v) {
      if (!x.is_number_integer()) fail("{}: \"{}\" must hold integer token ids", origin, key);
      ids.push_back(x.get<int32_t>());
    }
  } else {
    fail("{}: \"{}\" must be a token id or a list of ids", origin, key);
  }
  return ids;
}

RopeScaling parse_rope(const json& r, const std::string& origin) {
  RopeScaling s;
  if (r.is_null()) return s;
  if (!r.is_object()) fail("{}: rope_scaling must be an object or null", origin);
  std::string type;
  if (r.contains("rope_type") && r["rope_type"].is_string()) type = r["rope_type"];
  else if (r.contains("type") && r["type"].is_string()) type = r["type"];
  if (type.empty() || type == "default") return s;
  if (type != "llama3")
    fail("{}: rope scaling type \"{}\" is not supported (supported: default, llama3)", origin, type);
  s.type = RopeType::Llama3;
  s.factor = get_num(r, "factor", origin, 8.0);
  s.low_freq_factor = get_num(r, "low_freq_factor", origin, 1.0);
  s.high_freq_factor = get_num(r, "high_freq_factor", origin, 4.0);
  s.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", origin, 8192);
  if (s.factor <= 0 || s.low_freq_factor <= 0 || s.high_freq_factor <= s.low_freq_factor)
    fail("{}: invalid llama3 rope scaling parameters {}", origin, r.dump());
  return s;
}

}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) fail("{}: config must be a JSON object", origin);
  ModelConfig c;
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0];
  else if (j.contains("model_type") && j["model_type"].is_string()) {
    std::string mt = j["model_type"];
    arch = mt == "llama" ? "LlamaForCausalLM" : mt == "qwen2" ? "Qwen2ForCausalLM"
         : mt == "qwen3" ? "Qwen3ForCausalLM" : mt;
  } else {
    fail("{}: no \"architectures\" or \"model_type\" field", origin);
  }
  c.architecture_name = arch;
  if (arch == "LlamaForCausalLM") c.arch = Architecture::Llama;
  else if (arch == "Qwen2ForCausalLM") c.arch = Architecture::Qwen2;
  else if (arch == "Qwen3ForCausalLM") c.arch = Architecture::Qwen3;
  else
    fail("{}: unsupported architecture \"{}\" (perry supports LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
         origin, arch);

  c.vocab_size = get_int(j, "vocab_size", origin);
  c.hidden_size = get_int(j, "hidden_size", origin);
  c.intermediate_size = get_int(j, "intermediate_size", origin);
  c.num_layers = get_int(j, "num_hidden_layers", origin);
  c.num_heads = get_int(j, "num_attention_heads", origin);
  c.num_kv_heads = get_int(j, "num_key_value_heads", origin, c.num_heads);
  if (c.vocab_size == 0 || c.hidden_size == 0 || c.intermediate_size == 0 || c.num_layers == 0 ||
      c.num_heads == 0 || c.num_kv_heads == 0)
    fail("{}: vocab_size, hidden_size, intermediate_size, num_hidden_layers and head counts must be positive", origin);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", origin, c.num_heads,
         c.num_kv_heads);
  if (c.hidden_size % c.num_heads != 0 && !(j.contains("head_dim") && !j["head_dim"].is_null()))
    fail("{}: hidden_size {} is not divisible by num_attention_heads {} and no head_dim is given", origin,
         c.hidden_size, c.num_heads);
  c.head_dim = get_int(j, "head_dim", origin, c.hidden_size / c.num_heads);
  if (c.head_dim == 0 || c.head_dim % 2 != 0) fail("{}: head_dim must be positive and even, got {}", origin, c.head_dim);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", origin, 2048);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", origin, 1e-6);
  // transformers ≥ 5 writes rope settings into "rope_parameters"; older files use rope_theta +
  // rope_scaling. Accept both.
  const json rp = j.contains("rope_parameters") ? j["rope_parameters"] : json();
  c.rope_theta = get_num(j, "rope_theta", origin, rp.is_object() ? get_num(rp, "rope_theta", origin, 10000.0) : 10000.0);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) c.rope_scaling = parse_rope(j["rope_scaling"], origin);
  else if (rp.is_object()) c.rope_scaling = parse_rope(rp, origin);
  if (c.rope_theta <= 0) fail("{}: rope_theta must be positive", origin);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", origin, false);
  c.attention_bias = c.arch == Architecture::Qwen2 ? true : get_bool(j, "attention_bias", origin, false);
  c.qk_norm = c.arch == Architecture::Qwen3;
  std::string dt;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) dt = j["torch_dtype"];
  else if (j.contains("dtype") && j["dtype"].is_string()) dt = j["dtype"];
  if (dt == "float32") c.torch_dtype = DType::F32;
  else if (dt == "float16") c.torch_dtype = DType::F16;
  else c.torch_dtype = DType::BF16;
  // Features perry does not implement are refused instead of silently computing something else.
  if (j.contains("hidden_act") && j["hidden_act"].is_string() && j["hidden_act"] != "silu")
    fail("{}: hidden_act \"{}\" is not supported (perry implements SwiGLU with silu)", origin,
         j["hidden_act"].get<std::string>());
  if (get_bool(j, "use_sliding_window", origin, false))
    fail("{}: sliding-window attention (use_sliding_window: true) is not supported", origin);
  c.bos_token_ids = get_ids(j, "bos_token_id", origin);
  c.eos_token_ids = get_ids(j, "eos_token_id", origin);
  if (j.contains("quantization_config")) c.quantization_config = j["quantization_config"];
  return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_text_file(path), path); }

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = {std::string(architecture_name(c.arch))};
  j["model_type"] = c.arch == Architecture::Llama ? "llama" : c.arch == Architecture::Qwen2 ? "qwen2" : "qwen3";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == RopeType::Llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["torch_dtype"] = c.torch_dtype == DType::F32 ? "float32" : c.torch_dtype == DType::F16 ? "float16" : "bfloat16";
  if (c.bos_token_ids.size() == 1) j["bos_token_id"] = c.bos_token_ids[0];
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  if (!c.quantization_config.is_null()) j["quantization_config"] = c.quantization_config;
  return j;
}

}  // namespace perry::io
