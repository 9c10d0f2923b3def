#include "model/tensor_names.h"

namespace perry::model {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

// Llama, Qwen2 and Qwen3 share one decoder block; they differ only in data carried by the config:
// Qwen2 has biases on q/k/v (attention_bias), Qwen3 has per-head RMSNorm on q and k (qk_norm) and
// an explicit head_dim. So the family is expressed here as which tensors exist, not as code paths.
std::vector<TensorSpec> expected_tensors(const io::ModelConfig& c) {
  std::vector<TensorSpec> t;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, TensorKind::Embedding});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    t.push_back({p + "input_layernorm.weight", {H}, TensorKind::Norm});
    t.push_back({p + "self_attn.q_proj.weight", {Q, H}, TensorKind::Linear});
    t.push_back({p + "self_attn.k_proj.weight", {KV, H}, TensorKind::Linear});
    t.push_back({p + "self_attn.v_proj.weight", {KV, H}, TensorKind::Linear});
    t.push_back({p + "self_attn.o_proj.weight", {H, Q}, TensorKind::Linear});
    if (c.attention_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {Q}, TensorKind::Bias});
      t.push_back({p + "self_attn.k_proj.bias", {KV}, TensorKind::Bias});
      t.push_back({p + "self_attn.v_proj.bias", {KV}, TensorKind::Bias});
      // Llama with attention_bias=true also biases o_proj; Qwen2 does not.
      if (c.arch == io::Architecture::Llama) t.push_back({p + "self_attn.o_proj.bias", {H}, TensorKind::Bias});
    }
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, TensorKind::Norm});
      t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, TensorKind::Norm});
    }
    t.push_back({p + "post_attention_layernorm.weight", {H}, TensorKind::Norm});
    t.push_back({p + "mlp.gate_proj.weight", {I, H}, TensorKind::Linear});
    t.push_back({p + "mlp.up_proj.weight", {I, H}, TensorKind::Linear});
    t.push_back({p + "mlp.down_proj.weight", {H, I}, TensorKind::Linear});
  }
  t.push_back({"model.norm.weight", {H}, TensorKind::Norm});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, H}, TensorKind::Linear});
  return t;
}

}  // namespace perry::model
